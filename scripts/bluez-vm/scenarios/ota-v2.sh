#!/bin/bash
# A protocol version 2 device through the real stack, with the C device library
# held in lockstep beside the Swift model (docs/PROTOCOL.md, docs/PORTING.md):
#   1. `otaflash simulate --device-version 2` serves a version 2 device on NOR
#      flash (4 KiB erase units, 85 ms per erase, 40 us per word) on the
#      peripheral controller; `otaflash scan --ota-only` lists it.
#   2. seeded-256k.bin is flashed with --write-path acquire-write: done/ok, the
#      device reported protocol 2, the stored image byte-identical to the file.
#   3. a second device, which drops the link itself at 100000 bytes
#      (--sim-disconnect-at), is flashed with --write-path write-value --restart:
#      done/ok after at least one reconnect, the stored image byte-identical.
# No wait may time out (the flash's output names none; the first flash needs no
# reconnect). After each, `otaflash simulate` stops on SIGINT with exit 0 and its output
# says the C library answered every write as the Swift model did (a difference
# would be a note and exit 1).
# Prints per flash: seconds, bytes sent, reconnects.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

DISCONNECT_AT=${V2_DISCONNECT_AT:-100000}
AGREED='the C device library answered every write as the Swift model did'
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

# flash_v2 LABEL PATH: flashes $IMAGE, checks done/ok, protocol 2 and the stored image.
flash_v2() {
	local label=$1 path=$2 f rc=0 done_line info reconnects
	shift 2
	f=$RESULTS_DIR/flash-$label.stamped
	stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
		--write-path "$path" "$@" || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2- || true)
	if [ "$rc" -ne 0 ]; then
		tail -n 3 "$f.stderr" || true
		fail "$label: flash exited with $rc: ${done_line:-no done event}"
	fi
	grep -q '"result":"ok"' <<<"$done_line" || fail "$label: flash did not end done/ok: $done_line"
	info=$(grep '"event":"device_info"' "$f" | head -n 1 | cut -f2- || true)
	[ "$(jfield "$info" protocol)" = 2 ] || fail "$label: the device did not report protocol version 2: ${info:-no device_info event}"
	reconnects=$(grep -c '"event":"reconnect"' "$f" || true)
	# Realistic flash timing (an 85 ms erase per 4 KiB unit) must fit every reply's timeout.
	if grep -qi 'timed out\|timeout' "$f" "$f.stderr"; then
		fail "$label: a wait timed out: $(grep -hi -m1 'timed out\|timeout' "$f" "$f.stderr")"
	fi
	step "$label done: $done_line"
	step "FIGURES $label: $(jfield "$done_line" seconds) s, bytes_sent $(jfield "$done_line" bytes_sent) for $IMAGE_SIZE bytes, reconnects $reconnects"
	F_RECONNECTS=$reconnects
	check_stored "$SIM_OUT" "$IMAGE"
}

# stop_v2 LABEL: stops simulate; it must exit 0 having said the C library agreed.
stop_v2() {
	local label=$1 rc=0
	stop_sim "$SIM_PID" "$SIM_OUT" || rc=$?
	if grep -q 'answered differently' "$SIM_OUT" "$RESULTS_DIR/$label.stderr"; then
		fail "$label: the C device library and the Swift model differed: $(grep -h -m1 'answered differently' "$SIM_OUT" "$RESULTS_DIR/$label.stderr")"
	fi
	[ "$rc" -eq 0 ] || fail "$label: otaflash simulate exited with $rc after SIGINT: $(tail -n 2 "$RESULTS_DIR/$label.stderr" | tr '\n' ' ')"
	grep -q "\"event\":\"note\".*$AGREED" "$SIM_OUT" || fail "$label: otaflash simulate did not say the C library agreed ($SIM_OUT)"
	step "$label: $AGREED"
}

# ------------------------------------------------------------------ 1. serve, scan
start_sim v2 "$PERIPHERAL_HCI" "$RESULTS_DIR/store-v2" --verbose --device-version 2
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
step "scan: $SCAN_LINE"

# ------------------------------------------------------------------ 2. flash
flash_v2 v2 acquire-write --image-version 1.1.0
((F_RECONNECTS == 0)) || fail "v2: $F_RECONNECTS reconnect(s) without a fault injected"
stop_v2 v2

# ------------------------------------------------------------------ 3. a link loss mid-transfer
start_sim v2-drop "$PERIPHERAL_HCI" "$RESULTS_DIR/store-v2-drop" --verbose --device-version 2 --sim-disconnect-at "$DISCONNECT_AT"
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
flash_v2 v2-drop write-value --restart --reconnect-window 60
((F_RECONNECTS >= 1)) || fail "v2-drop: no reconnect event: the link loss at $DISCONNECT_AT was not recovered by a reconnect"
stop_v2 v2-drop
step "PASS"
