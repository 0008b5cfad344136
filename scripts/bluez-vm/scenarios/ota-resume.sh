#!/bin/bash
# Resume after a forced disconnect mid-transfer, through the real stack. Two
# ways of losing the link, each on its own flash of seeded-256k.bin:
#   1. from outside: `btmgmt disconnect` on the central's controller once the
#      central reports 100000 bytes sent (the link drops under the central);
#   2. by the peripheral: `otaflash simulate --sim-disconnect-at 100000` drops
#      the link itself when that offset arrives.
# Each flash must end done/ok with at least one reconnect event, the stored
# image byte-identical, and bytes_sent < 1.5 x the image size.
#   3. the central killed: SIGKILL to otaflash once it reports 100000 bytes
#      sent, then the same command again at once (no --restart): it must resume
#      (bytes_sent of the second run below the image size) and end done/ok with
#      the stored image byte-identical.
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

# ------------------------------------------------------------------ 3. kill -9
start_sim sim3 "$PERIPHERAL_HCI" "$RESULTS_DIR/store3" --verbose
SIM=$SIM_PID
# A state folder of its own: the resume point is this run's journal, not an earlier one's. On the
# guest's own disk: the results folder is the host's over 9p, where SQLite's WAL (the ledger) fails.
XDG_STATE_HOME=$(mktemp -d /tmp/otaflash-state3-XXXXXX)
export XDG_STATE_HOME
killed=( "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json --write-path "$WRITE_PATH" --reconnect-window 60 )
f=$RESULTS_DIR/flash-killed.stamped
stamped "$f" 240 "${killed[@]}" &
flash_pid=$!
BG+=("$flash_pid")
reported() { grep '"event":"progress"' "$f" 2>/dev/null | tail -n 1 | sed -n 's/.*"bytes":\([0-9]*\).*/\1/p'; }
deadline=$((SECONDS + 120))
until [ "$(reported)" -ge "$DISCONNECT_AT" ] 2>/dev/null; do
	((SECONDS < deadline)) || fail "flash-killed reported no progress to $DISCONNECT_AT bytes within 120 s"
	sleep 0.05
done
# The otaflash process itself (the stamped pipeline's timeout runs it as a child).
victim=$(pgrep -n -f -- "--device $PERIPHERAL_ADDR $IMAGE --json --write-path $WRITE_PATH --reconnect-window 60" | grep -v "^$flash_pid\$" | tail -n 1 || true)
[ -n "$victim" ] || fail "flash-killed: no otaflash process to kill"
kill -9 "$victim"
wait "$flash_pid" || true
step "kill -9 at $(reported) bytes (pid $victim): the same command again at once"
f=$RESULTS_DIR/flash-after-kill.stamped
rc=0
stamped "$f" 240 "${killed[@]}" || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2- || true)
if [ "$rc" -ne 0 ] || ! grep -q '"result":"ok"' <<<"$done_line"; then
	tail -n 3 "$f.stderr" || true
	ERRORS+=("after kill -9: the same command exited with $rc: ${done_line:-no done event}")
else
	sent=$(jfield "$done_line" bytes_sent)
	step "FIGURES after-kill: bytes_sent $sent for a $IMAGE_SIZE-byte image ($(awk -v a="$sent" -v b="$IMAGE_SIZE" 'BEGIN { printf "%.3f", a / b }') x), $(jfield "$done_line" seconds) s"
	FIGS+=("$(jq -nc --argjson sent "$sent" --argjson s "$(jfield "$done_line" seconds)" '{"after-kill": {bytes_sent: $sent, seconds: $s}}')")
	((sent < IMAGE_SIZE)) || ERRORS+=("after kill -9: bytes_sent $sent is not below the image size: it did not resume")
	check_stored "$SIM_OUT" "$IMAGE"
fi
unset XDG_STATE_HOME
stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"

printf '%s\n' "${FIGS[@]}" | jq -s --argjson size "$IMAGE_SIZE" --arg wp "$WRITE_PATH" 'add + {image_size: $size, write_path: $wp}' >"$RESULTS_DIR/figures.json"
if [ ${#ERRORS[@]} -gt 0 ]; then
	for e in "${ERRORS[@]}"; do step "ERROR $e"; done
	fail "${#ERRORS[@]} check(s) failed"
fi
step "PASS"
