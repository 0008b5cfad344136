#!/bin/bash
# Resume after a forced disconnect, through the real stack:
#   `otaflash simulate --sim-disconnect-at 100000` drops the link itself when
#   offset 100000 arrives; the central's supervisor reconnects and resumes.
#   The flash must end done/ok with at least one reconnect event, the stored
#   image byte-identical, and bytes_sent < 1.5 x the image size.
# Prints the bytes sent and the number of reconnects.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

DISCONNECT_AT=${RESUME_DISCONNECT_AT:-100000}
WRITE_PATH=${RESUME_WRITE_PATH:-acquire-write}
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; the peripheral drops the link at offset $DISCONNECT_AT; --write-path $WRITE_PATH"

start_sim sim "$PERIPHERAL_HCI" "$RESULTS_DIR/store" --verbose --sim-disconnect-at "$DISCONNECT_AT"
SIM=$SIM_PID SIMOUT=$SIM_OUT
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"

f=$RESULTS_DIR/flash.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
	--write-path "$WRITE_PATH" --restart --reconnect-window 60 || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
reconnects=$(grep -c '"event":"reconnect"' "$f" || true)
grep '"event":"reconnect"' "$f" | cut -f2- | while IFS= read -r l; do step "reconnect: $l"; done
step "peripheral: $(grep -o '"event":"\(connected\|disconnected\|begin\)"[^}]*' "$SIMOUT" | tr '\n' ' ')"
step "peripheral order: $(sim_order_report "$RESULTS_DIR/sim.stderr")"
[ "$rc" -eq 0 ] || { tail -n 3 "$f.stderr" || true; fail "flash exited with $rc: ${done_line:-no done event}"; }
grep -q '"result":"ok"' <<<"$done_line" || fail "flash did not end done/ok: $done_line"
step "done: $done_line"
grep -q '"event":"disconnected"' "$SIMOUT" || fail "the peripheral never dropped the link (no disconnected event)"
((reconnects >= 1)) || fail "no reconnect event: the link loss at $DISCONNECT_AT was not recovered by a reconnect"
check_stored "$SIMOUT" "$IMAGE"

bytes_sent=$(jfield "$done_line" bytes_sent)
bytes_resent=$(jfield "$done_line" bytes_resent)
limit=$((IMAGE_SIZE * 3 / 2))
step "FIGURES resume: bytes_sent $bytes_sent (bytes_resent $bytes_resent) for a $IMAGE_SIZE-byte image ($(awk -v a="$bytes_sent" -v b="$IMAGE_SIZE" 'BEGIN { printf "%.3f", a / b }') x), reconnects $reconnects, $(jfield "$done_line" seconds) s"
jq -n --argjson sent "$bytes_sent" --argjson resent "${bytes_resent:-null}" --argjson size "$IMAGE_SIZE" \
	--argjson reconnects "$reconnects" --argjson seconds "$(jfield "$done_line" seconds)" --arg path "$WRITE_PATH" \
	'{write_path: $path, image_size: $size, bytes_sent: $sent, bytes_resent: $resent, reconnects: $reconnects, seconds: $seconds}' \
	>"$RESULTS_DIR/figures.json"
((bytes_sent < limit)) || fail "bytes_sent $bytes_sent is not below 1.5 x the image size ($limit)"
stop_sim "$SIM" || fail "otaflash simulate exited with $? after SIGINT"
step "PASS"
