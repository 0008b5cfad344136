#!/bin/bash
# Pairing through the real stack, Just Works, against `otaflash simulate --security encrypt`
# (its characteristics carry BlueZ's encrypt-read/encrypt-write flags; it runs its own agent):
#   1. --pair --unpair-after pairs (Just Works), flashes blinky-cortex-m4.bin (byte-identical)
#      and leaves no bond (`bluetoothctl devices Bonded` on the central is empty);
#   2. --pair with a forced disconnect mid-transfer (`btmgmt disconnect` at ~60000 bytes of seeded-256k.bin):
#      the supervisor reconnects, the link is encrypted again with the bond (the writes that
#      follow need it) and the transfer resumes to done/ok; then `otaflash unpair` removes the bond.
#   0. (native, and each of nordic-dfu and smp at the end) a flash without --pair exits 12 within
#      10 s, one line naming --pair, nothing activated, no bond left: bluetoothd on the central
#      answers the device's refusal of the CCCD write (ATT insufficient encryption) by pairing
#      Just Works on its own (src/shared/att.c raises the security level); otaflash sees Paired
#      turn true, ends the run and removes that bond; nordic-dfu and smp then flash with
#      --pair --unpair-after and leave no bond.
# Leaves no bonds behind on either side.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

# A debug binary on a loaded host takes longer than 30 s to come up under TCG.
SIM_START_TIMEOUT=${SIM_START_TIMEOUT:-120}
# A small image where only pairing is measured; replies get time on a slow, encrypting VM (a
# reply timeout there means a reconnect, and tearing the link down mid-stream has oopsed the
# guest kernel: scripts/bluez-vm/README.md, "Two links on one central controller").
SMALL=$PROJECT_DIR/firmware-samples/blinky-cortex-m4.bin
SLOW=(--reply-timeout 30)

DISCONNECT_AT=${PAIR_DISCONNECT_AT:-60000}
: "${CENTRAL_INDEX:?}" "${CENTRAL_ADDR:?}"
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR" "$PERIPHERAL_HCI $CENTRAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI $CENTRAL_ADDR, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

start_sim sim "$PERIPHERAL_HCI" "$RESULTS_DIR/store" --verbose --security encrypt
SIM=$SIM_PID
central_without_agent
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
no_bond "before"

# ------------------------------------------------------------------ 0. without --pair
unpaired_refusal native "$SMALL"
NATIVE_UNPAIRED=$UNPAIRED_SECS

# ------------------------------------------------------------------ 1. --pair --unpair-after
f=$RESULTS_DIR/flash-pair.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$SMALL" --json --restart "${SLOW[@]}" \
	--pair --unpair-after || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
[ "$rc" -eq 0 ] || fail "--pair --unpair-after exited $rc: $(tail -n 3 "$f.stderr") ${done_line}"
grep -q 'paired (Just Works)' "$f" "$f.stderr" || fail "no 'paired (Just Works)' note: $(grep note "$f" | tail -n 5)"
grep -q 'bond removed' "$f" "$f.stderr" || fail "no 'bond removed' note"
step "paired: $done_line"
check_stored "$SIM_OUT" "$SMALL"
no_bond "after --unpair-after"
links_down "$SIM_OUT" "removing the device anyway"
remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"

# ------------------------------------------------------------------ 2. forced disconnect, resume encrypted
before=$(grep -c '"event":"activated"' "$SIM_OUT" || true)
f=$RESULTS_DIR/flash-resume.stamped
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json --restart \
	--write-path write-value --reconnect-window 60 "${SLOW[@]}" --pair &
flash_pid=$!
BG+=("$flash_pid")
disconnect_at "$f" "$DISCONNECT_AT" "$flash_pid" 150
rc=0
wait "$flash_pid" || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
[ "$rc" -eq 0 ] || fail "the paired flash with a forced disconnect exited $rc: $(tail -n 3 "$f.stderr") $done_line"
reconnects=$(grep -c '"event":"reconnect"' "$f" || true)
((reconnects >= 1)) || fail "no reconnect event: the link loss was not recovered by a reconnect"
wait_for_line "$SIM_OUT" '"event":"activated"' 15 || true
[ "$(grep -c '"event":"activated"' "$SIM_OUT")" -gt "$before" ] || fail "no new activation after the resumed transfer"
check_stored "$SIM_OUT" "$IMAGE"
paired=$(timeout 10 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$CENTRAL_HCI/dev_${PERIPHERAL_ADDR//:/_}" \
	org.freedesktop.DBus.Properties.Get string:org.bluez.Device1 string:Paired 2>/dev/null | grep -o 'boolean [a-z]*' || true)
step "resumed over the re-encrypted link: $reconnects reconnect(s), Paired: ${paired:-?}; $done_line"
step "FIGURES resume: bytes_sent $(jfield "$done_line" bytes_sent) for $IMAGE_SIZE, reconnects $reconnects, $(jfield "$done_line" seconds) s"

rc=0
out=$(timeout 60 "$OTAFLASH" unpair --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" 2>&1) || rc=$?
step "otaflash unpair: exit $rc: $out"
[ "$rc" -eq 0 ] || fail "otaflash unpair exited $rc"
no_bond "after otaflash unpair"

stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"

# ------------------------------------------------------------------ 0. again, for nordic-dfu and smp
other_protocols encrypt 'paired (Just Works)'
step "FIGURES unpaired (encrypt): native $NATIVE_UNPAIRED s; nordic-dfu and smp above"
step "PASS"
