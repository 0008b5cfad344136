#!/bin/bash
# Passkey pairing through the real stack, against `otaflash simulate --security authenticate
# --passkey 123456` (encrypt-authenticated-* flags; its agent enters that passkey):
#   0. (native, and each of nordic-dfu and smp at the end) a flash without --pair exits 12 within
#      10 s with one line naming --pair and --passkey, nothing activated, no bond left: bluetoothd
#      answers the refused CCCD write by pairing on its own, Just Works first (a bond otaflash
#      removes), then for an authenticated key it asks the default agent, otaflash's, for a
#      passkey, which it refuses and reports; nordic-dfu and smp then flash with --pair
#      --passkey 123456 --unpair-after and leave no bond;
#   1. --pair --passkey 111111 (wrong): exit 13 (pairing_failed), one line naming the passkey;
#      no bond left;
#   2. --pair --passkey 123456 --unpair-after: pairs (passkey entry), flashes blinky-cortex-m4.bin (the stored
#      image is byte-identical) and leaves no bond (`bluetoothctl devices Bonded` on the central is empty).
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

PASSKEY=123456
: "${CENTRAL_INDEX:?}" "${CENTRAL_ADDR:?}"
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR" "$PERIPHERAL_HCI $CENTRAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI $CENTRAL_ADDR, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

# refused LABEL EXPECTED-PATTERN ARGS...: the flash must exit 13 with one error line matching the pattern.
refused() {
	local label=$1 pattern=$2 f=$RESULTS_DIR/flash-$1.stamped rc=0 line
	shift 2
	stamped "$f" 180 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$SMALL" --json --restart "${SLOW[@]}" "$@" || rc=$?
	line=$(grep 'otaflash: error' "$f.stderr" | tail -n 1 || true)
	step "$label: exit $rc: $line"
	[ "$rc" -eq 13 ] || fail "$label: exited $rc, expected 13 (pairing_failed): $(tail -n 3 "$f.stderr")"
	[ "$(grep -c 'otaflash: error' "$f.stderr")" -eq 1 ] || fail "$label: not one error line: $(cat "$f.stderr")"
	grep -Eq -- "$pattern" <<<"$line" || fail "$label: the line does not say '$pattern': $line"
	grep -q '"exit_code":13' "$f" || fail "$label: the done event does not carry exit code 13"
	! grep -q '"event":"activated"' "$SIM_OUT" || fail "$label: the device activated an image"
	links_down "$SIM_OUT" "removing the device anyway"
	remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"
	remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"
	no_bond "after $label"
}

start_sim sim "$PERIPHERAL_HCI" "$RESULTS_DIR/store" --verbose --security authenticate --passkey "$PASSKEY"
SIM=$SIM_PID
central_without_agent
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
no_bond "before"

# ------------------------------------------------------------------ 0. without --pair
WANT_PASSKEY=1 unpaired_refusal native "$SMALL"
NATIVE_UNPAIRED=$UNPAIRED_SECS
step "unpaired: the peripheral's agent was asked: $(grep -o 'request=[a-z ]*' "$RESULTS_DIR/sim.stderr" | tr '\n' ' ')"
links_down "$SIM_OUT" "removing the device anyway"
remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"

refused wrong-passkey 'passkey 111111 was not accepted' --pair --passkey 111111

f=$RESULTS_DIR/flash-passkey.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$SMALL" --json --restart "${SLOW[@]}" \
	--pair --passkey "$PASSKEY" --unpair-after || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
[ "$rc" -eq 0 ] || fail "--pair --passkey $PASSKEY exited $rc: $(tail -n 3 "$f.stderr") $done_line"
grep -q 'paired (passkey entry)' "$f" "$f.stderr" || fail "no 'paired (passkey entry)' note"
step "right passkey: $done_line"
check_stored "$SIM_OUT" "$SMALL"
no_bond "after --unpair-after"

stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"

# ------------------------------------------------------------------ 0. again, for nordic-dfu and smp
SIM_PASSKEY=$PASSKEY WANT_PASSKEY=1 other_protocols authenticate 'paired (passkey entry)' --passkey "$PASSKEY"
step "FIGURES unpaired (authenticate): native $NATIVE_UNPAIRED s; nordic-dfu and smp above"
step "PASS"
