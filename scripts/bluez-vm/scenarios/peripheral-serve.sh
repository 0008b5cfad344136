#!/bin/bash
# Peripheral mode on the real stack:
#   1. `otaflash simulate` serves the OTA target on the peripheral controller
#      (GattManager1.RegisterApplication + LEAdvertisingManager1) and reports
#      "serving".
#   2. `otaflash scan --ota-only` on the central controller lists it with ota=true.
#   3. `otaflash --device <peripheral>` flashes firmware-samples/seeded-256k.bin
#      through bluetoothd on both sides and ends done/ok; the image the
#      peripheral stored is byte-identical to the file.
#   4. SIGINT stops `otaflash simulate`: it unregisters and exits 0.
# Runs inside the VM started by scripts/bluez-vm/run.sh. The binary is
# $PROJECT_DIR/.build/debug/otaflash (or $OTAFLASH_BIN): build it on the host first.

set -euo pipefail

: "${OTAFLASH_VM:?run this through scripts/bluez-vm/run.sh}"
: "${CENTRAL_HCI:?}" "${PERIPHERAL_HCI:?}" "${PERIPHERAL_ADDR:?}" "${RESULTS_DIR:?}" "${PROJECT_DIR:?}"

OTAFLASH=${OTAFLASH_BIN:-$PROJECT_DIR/.build/debug/otaflash}
IMAGE=$PROJECT_DIR/firmware-samples/seeded-256k.bin
STORE=$RESULTS_DIR/store
SIM_OUT=$RESULTS_DIR/simulate.jsonl
SIM_ERR=$RESULTS_DIR/simulate.stderr
NAME=otaflash-vm

T0=$EPOCHREALTIME
step() { awk -v a="$T0" -v b="$EPOCHREALTIME" -v m="$*" 'BEGIN { printf "[%6.2fs] %s\n", b - a, m }'; }
fail() {
	step "FAIL: $*"
	exit 1
}

[ -x "$OTAFLASH" ] || fail "$OTAFLASH is missing: run 'swift build' on the host first"
[ -f "$IMAGE" ] || fail "$IMAGE is missing"
rm -rf "$STORE"
mkdir -p "$STORE"

# Waits until FILE has a line matching PATTERN, at most SECONDS.
wait_for_line() {
	local file=$1 pattern=$2 deadline=$((SECONDS + $3))
	until grep -q -- "$pattern" "$file" 2>/dev/null; do
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
}

sim_pid=
dev_path=/org/bluez/$CENTRAL_HCI/dev_${PERIPHERAL_ADDR//:/_}
cleanup() {
	if [ -n "$sim_pid" ] && kill -0 "$sim_pid" 2>/dev/null; then
		kill -KILL "$sim_pid" 2>/dev/null || true
	fi
	timeout 10 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$CENTRAL_HCI" \
		org.bluez.Adapter1.RemoveDevice "objpath:$dev_path" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ------------------------------------------------------------------ 1. serve
: >"$SIM_OUT"
"$OTAFLASH" simulate --adapter "$PERIPHERAL_HCI" --name "$NAME" --store "$STORE" --json --verbose >"$SIM_OUT" 2>"$SIM_ERR" &
sim_pid=$!
if ! wait_for_line "$SIM_OUT" '"event":"serving"' 30; then
	kill -0 "$sim_pid" 2>/dev/null || { wait "$sim_pid" || step "otaflash simulate exited with $?"; }
	tail -n 5 "$SIM_ERR" "$SIM_OUT" || true
	fail "otaflash simulate did not report serving within 30 s"
fi
step "serving: $(grep -m1 '"event":"serving"' "$SIM_OUT")"

# ------------------------------------------------------------------ 2. scan
# Two attempts: the first scan right after registration has been seen to miss the
# advertisement once.
line=
for attempt in 1 2; do
	scan=$(timeout 60 "$OTAFLASH" scan --adapter "$CENTRAL_HCI" --ota-only --json --timeout 8 2>"$RESULTS_DIR/scan.stderr") ||
		fail "otaflash scan failed ($?): $(tail -n 1 "$RESULTS_DIR/scan.stderr")"
	printf '%s\n' "$scan" >>"$RESULTS_DIR/scan.jsonl"
	line=$(grep '"event":"device"' <<<"$scan" | grep -i "\"address\":\"$PERIPHERAL_ADDR\"" || true)
	[ -z "$line" ] || break
	step "scan attempt $attempt did not list $PERIPHERAL_ADDR"
done
if [ -z "$line" ]; then
	# What was on the air, for the log.
	timeout 30 "$OTAFLASH" scan --adapter "$CENTRAL_HCI" --json --timeout 5 >"$RESULTS_DIR/scan-all.jsonl" 2>&1 || true
	step "a scan without --ota-only saw: $(tr '\n' ' ' <"$RESULTS_DIR/scan-all.jsonl")"
	timeout 10 btmgmt --index "${PERIPHERAL_INDEX:-1}" advinfo 2>&1 | head -n 20 || true
	fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR: $scan"
fi
grep -q '"ota":true' <<<"$line" || fail "the peripheral is listed without ota=true: $line"
step "scan lists it: $line"

# ------------------------------------------------------------------ 3. flash
set +e
timeout 200 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
	>"$RESULTS_DIR/flash.jsonl" 2>"$RESULTS_DIR/flash.stderr"
rc=$?
set -e
done_line=$(grep '"event":"done"' "$RESULTS_DIR/flash.jsonl" | tail -n 1 || true)
if [ "$rc" -ne 0 ]; then
	if grep -q "not available in this build" "$RESULTS_DIR/flash.stderr"; then
		step "SKIP flash: this otaflash has no BlueZ central yet ($(tail -n 1 "$RESULTS_DIR/flash.stderr"))"
		FLASHED=0
	else
		tail -n 5 "$RESULTS_DIR/flash.stderr" || true
		chunk=$(sed -n 's/.*"event":"connected".*"chunk":\([0-9]*\).*/\1/p' "$RESULTS_DIR/flash.jsonl" | head -n 1)
		if ! grep -q "data write" "$SIM_ERR" && [ -n "$chunk" ] && [ $((chunk + 4)) -gt 508 ]; then
			# bluetoothd 5.66 drops a Write Command whose PDU (2-byte handle + value) exceeds
			# 512 bytes without telling anyone (src/shared/gatt-server.c, write_cb/check_length).
			step "no data write reached the GATT application: ${chunk}-byte chunks make $((chunk + 4))-byte values, above what bluetoothd accepts (510 + handle <= 512)"
		fi
		fail "flashing exited with $rc: ${done_line:-no done event}"
	fi
else
	grep -q '"result":"ok"' <<<"$done_line" || fail "flashing did not end done/ok: $done_line"
	step "flash: $done_line"
	FLASHED=1
fi

if [ "$FLASHED" = 1 ]; then
	wait_for_line "$SIM_OUT" '"event":"activated"' 15 || fail "otaflash simulate reported no activation"
	activated=$(grep -m1 '"event":"activated"' "$SIM_OUT")
	step "peripheral: $activated"
	stored=$(sed -n 's/.*"stored":"\([^"]*\)".*/\1/p' <<<"$activated")
	[ -n "$stored" ] && [ -f "$stored" ] || fail "no stored image ($activated)"
	cmp "$stored" "$IMAGE" || fail "the stored image differs from $IMAGE"
	step "stored image $(basename "$stored") is byte-identical to $(basename "$IMAGE") ($(stat -c %s "$stored") bytes)"
	for event in connected begin progress verified; do
		grep -q "\"event\":\"$event\"" "$SIM_OUT" || fail "otaflash simulate printed no $event event"
	done
	wait_for_line "$SIM_OUT" '"event":"disconnected"' 15 || fail "otaflash simulate printed no disconnected event"
	step "peripheral events: $(grep -o '"event":"[a-z_]*"' "$SIM_OUT" | sort | uniq -c | tr -s ' \n' ' ')"
fi

# ------------------------------------------------------------------ 4. stop
kill -INT "$sim_pid"
set +e
timeout 15 tail --pid="$sim_pid" -f /dev/null || { step "still running 15 s after SIGINT; killing it"; kill -KILL "$sim_pid"; }
wait "$sim_pid"
sim_rc=$?
set -e
sim_pid=
[ "$sim_rc" -eq 0 ] || fail "otaflash simulate exited with $sim_rc after SIGINT: $(tail -n 2 "$SIM_ERR")"
grep -q '"event":"done","result":"ok"' "$SIM_OUT" || fail "otaflash simulate did not end with done/ok"
step "SIGINT: otaflash simulate unregistered and exited 0"
step "PASS"
