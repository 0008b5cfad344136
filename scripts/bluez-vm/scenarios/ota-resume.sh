#!/bin/bash
# Resume after a forced disconnect mid-transfer, through the real stack. Two
# ways of losing the link, each on its own flash of seeded-256k.bin:
#   1. from outside: `btmgmt disconnect` on the central's controller once the
#      central reports 100000 bytes sent (the link drops under the central);
#   2. by the peripheral: `otaflash simulate --sim-disconnect-at 100000` drops
#      the link itself when that offset arrives.
# Each flash must end done/ok with at least one reconnect event, the stored
# image byte-identical, and bytes_sent < 1.5 x the image size.
# Prints the bytes sent and the number of reconnects of each.
#
# Data go through --write-path write-value by default ($RESUME_WRITE_PATH to
# change): with acquire-write, CHECKPOINT requests overtake data still unread
# in the write socket on this VM and the resulting rewinds would swamp the
# resume cost this scenario measures; ota-flash.sh and ota-bench.sh cover
# acquire-write.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

DISCONNECT_AT=${RESUME_DISCONNECT_AT:-100000}
WRITE_PATH=${RESUME_WRITE_PATH:-write-value}
: "${CENTRAL_INDEX:?}"
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; link loss at ~$DISCONNECT_AT bytes; --write-path $WRITE_PATH"

FIGS=()
LIMIT=$((IMAGE_SIZE * 3 / 2))
ERRORS=()

# check_flash LABEL STAMPED RC SIM_OUT: done/ok, >= 1 reconnect, stored image, bytes_sent bound.
check_flash() {
	local label=$1 f=$2 rc=$3 simout=$4 done_line reconnects sent resent secs
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2- || true)
	reconnects=$(grep -c '"event":"reconnect"' "$f" || true)
	grep '"event":"reconnect"' "$f" | cut -f2- | while IFS= read -r l; do step "$label reconnect: $l"; done || true
	step "$label peripheral: $(grep -o '"event":"\(connected\|disconnected\|begin\|note\)"[^}]*' "$simout" | tr '\n' ' ' || true)"
	[ "$rc" -eq 0 ] || { tail -n 3 "$f.stderr" || true; ERRORS+=("$label: flash exited with $rc: ${done_line:-no done event}"); return 0; }
	grep -q '"result":"ok"' <<<"$done_line" || { ERRORS+=("$label: flash did not end done/ok: $done_line"); return 0; }
	step "$label done: $done_line"
	sent=$(jfield "$done_line" bytes_sent)
	resent=$(jfield "$done_line" bytes_resent)
	secs=$(jfield "$done_line" seconds)
	step "FIGURES $label: bytes_sent $sent (bytes_resent $resent) for a $IMAGE_SIZE-byte image ($(awk -v a="$sent" -v b="$IMAGE_SIZE" 'BEGIN { printf "%.3f", a / b }') x), reconnects $reconnects, $secs s"
	FIGS+=("$(jq -nc --arg l "$label" --argjson sent "$sent" --argjson resent "${resent:-null}" --argjson r "$reconnects" \
		--argjson s "$secs" '{($l): {bytes_sent: $sent, bytes_resent: $resent, reconnects: $r, seconds: $s}}')")
	check_stored "$simout" "$IMAGE"
	((reconnects >= 1)) || ERRORS+=("$label: no reconnect event: the link loss was not recovered by a reconnect (did the link drop at all?)")
	((sent < LIMIT)) || ERRORS+=("$label: bytes_sent $sent is not below 1.5 x the image size ($LIMIT)")
}

# ------------------------------------------------------------------ 1. outside
start_sim sim1 "$PERIPHERAL_HCI" "$RESULTS_DIR/store1" --verbose
SIM=$SIM_PID
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
f=$RESULTS_DIR/flash-outside.stamped
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
	--write-path "$WRITE_PATH" --restart --reconnect-window 60 &
flash_pid=$!
BG+=("$flash_pid")
# The central's progress events carry "bytes" (sent so far).
disconnect_at "$f" "$DISCONNECT_AT" "$flash_pid"
rc=0
wait "$flash_pid" || rc=$?
check_flash outside "$f" "$rc" "$SIM_OUT"
stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"

# ------------------------------------------------------------------ 2. peripheral
start_sim sim2 "$PERIPHERAL_HCI" "$RESULTS_DIR/store2" --verbose --sim-disconnect-at "$DISCONNECT_AT"
SIM=$SIM_PID
f=$RESULTS_DIR/flash-peripheral.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
	--write-path "$WRITE_PATH" --restart --reconnect-window 60 || rc=$?
check_flash peripheral "$f" "$rc" "$SIM_OUT"
if grep -q 'injected fault: disconnect' "$SIM_OUT" && ! grep -q '"event":"reconnect"' "$f"; then
	step "NOTE: the peripheral's disconnect fault fired but the central never lost the link; bluetoothd: $(grep -i 'failed to disconnect' "$OTAFLASH_VM_LOGS/bluetoothd.log" | tail -n 1 || echo '-')"
	step "NOTE: simulate: $(grep -m1 'disconnect(reason' "$RESULTS_DIR/sim2.stderr" | cut -c1-200 || true) ... then $(grep '"event":"\(activated\|disconnected\)"' "$SIM_OUT" | tr '\n' ' ')"
fi
stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"

printf '%s\n' "${FIGS[@]}" | jq -s --argjson size "$IMAGE_SIZE" --arg wp "$WRITE_PATH" 'add + {image_size: $size, write_path: $wp}' >"$RESULTS_DIR/figures.json"
if [ ${#ERRORS[@]} -gt 0 ]; then
	for e in "${ERRORS[@]}"; do step "ERROR $e"; done
	fail "${#ERRORS[@]} check(s) failed"
fi
step "PASS"
