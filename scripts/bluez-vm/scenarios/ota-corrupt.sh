#!/bin/bash
# A corrupted image is rejected at verify and never activated, through the real stack:
#   `otaflash simulate --sim-flash-bitflip-at 5000` rots one flash byte after it
#   was written (the checkpoints' CRCs, computed as data arrives, still match);
#   VERIFY reads the flash back, the CRC differs, and the flash must exit 8
#   with a verify_failed done line; the peripheral activates and stores nothing.
# Data go through --write-path write-value by default ($CORRUPT_WRITE_PATH to change): with
# acquire-write, CHECKPOINT requests overtake data still unread in the write
# socket on this VM and the resulting rewinds would swamp the verify rejection this
# scenario measures; ota-flash.sh and ota-bench.sh cover acquire-write.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

FLIP_AT=${CORRUPT_FLIP_AT:-5000}
WRITE_PATH=${CORRUPT_WRITE_PATH:-write-value}
STORE=$RESULTS_DIR/store
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; the peripheral's flash rots byte $FLIP_AT; --write-path $WRITE_PATH"

start_sim sim "$PERIPHERAL_HCI" "$STORE" --verbose --sim-flash-bitflip-at "$FLIP_AT"
SIM=$SIM_PID SIMOUT=$SIM_OUT
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"

f=$RESULTS_DIR/flash.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
	--write-path "$WRITE_PATH" --restart || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
step "flash exited with $rc: $done_line"
step "stderr: $(tail -n 1 "$f.stderr")"
step "peripheral order: $(sim_order_report "$RESULTS_DIR/sim.stderr")"
[ "$rc" -eq 8 ] || fail "expected exit 8 (verify_failed), got $rc"
[ "$(jfield "$done_line" result)" = error ] && [ "$(jfield "$done_line" error)" = verify_failed ] ||
	fail "the done line is not result=error error=verify_failed: $done_line"
grep -q '"event":"activate"' "${f%.stamped}.jsonl" && fail "the central sent ACTIVATE for a corrupted image"
stop_sim "$SIM" "$SIMOUT" || fail "otaflash simulate exited with $? after SIGINT"
grep -q '"event":"activated"' "$SIMOUT" && fail "the peripheral activated an image: $(grep '"event":"activated"' "$SIMOUT")"
grep -q '"event":"verified"' "$SIMOUT" && fail "the peripheral reported a verified image: $(grep '"event":"verified"' "$SIMOUT")"
stored=$(find "$STORE" -type f | wc -l)
((stored == 0)) || fail "the store holds $stored file(s): $(ls "$STORE")"
sim_done=$(grep '"event":"done"' "$SIMOUT" | tail -n 1)
[ "$(jfield "$sim_done" activations)" = 0 ] || fail "otaflash simulate counted activations: $sim_done"
step "nothing verified, activated or stored; simulate: $sim_done"
step "PASS"
