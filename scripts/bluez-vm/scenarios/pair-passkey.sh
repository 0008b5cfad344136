#!/bin/bash
# Passkey pairing through the real stack, against `otaflash simulate --security authenticate
# --passkey 123456` (encrypt-authenticated-* flags; its agent enters that passkey):
#   0. a flash without --pair is refused: exit 12 (permission), one line that names --pair;
#   1. --pair --passkey 111111 (wrong): exit 13 (pairing_failed), one line naming the passkey;
#      no bond left;
#   2. --pair without a passkey: Just Works gives an unauthenticated key the device does not
#      take: exit 13 with one line that says to pass --passkey; no image activated;
#   3. --pair --passkey 123456 --unpair-after: pairs (passkey entry), flashes (the stored image is
#      byte-identical) and leaves no bond (`bluetoothctl devices Bonded` on the central is empty).
# Leaves no bonds behind on either side.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

PASSKEY=123456
: "${CENTRAL_ADDR:?}"
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR" "$PERIPHERAL_HCI $CENTRAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI $CENTRAL_ADDR, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

bonded_on() {
	printf 'select %s\ndevices Bonded\nquit\n' "$1" | timeout 10 bluetoothctl 2>/dev/null |
		sed 's/\x1b\[[0-9;]*[a-zA-Z]//g' | grep -o '^Device [0-9A-F:]\{17\}' | cut -d' ' -f2 || true
}
no_bond() {
	local left
	left=$(bonded_on "$CENTRAL_ADDR")
	[ -z "$left" ] || fail "$1: the central still has bonds: $left"
	step "$1: bluetoothctl devices Bonded on the central: (none)"
}
# refused LABEL EXPECTED-PATTERN ARGS...: the flash must exit 13 with one error line matching the pattern.
refused() {
	local label=$1 pattern=$2 f=$RESULTS_DIR/flash-$1.stamped rc=0 line
	shift 2
	stamped "$f" 180 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json --restart "$@" || rc=$?
	line=$(grep 'otaflash: error' "$f.stderr" | tail -n 1 || true)
	step "$label: exit $rc: $line"
	[ "$rc" -eq 13 ] || fail "$label: exited $rc, expected 13 (pairing_failed): $(tail -n 3 "$f.stderr")"
	[ "$(grep -c 'otaflash: error' "$f.stderr")" -eq 1 ] || fail "$label: not one error line: $(cat "$f.stderr")"
	grep -Eq -- "$pattern" <<<"$line" || fail "$label: the line does not say '$pattern': $line"
	grep -q '"exit_code":13' "$f" || fail "$label: the done event does not carry exit code 13"
	! grep -q '"event":"activated"' "$SIM_OUT" || fail "$label: the device activated an image"
	remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"
	remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"
	no_bond "after $label"
}

start_sim sim "$PERIPHERAL_HCI" "$RESULTS_DIR/store" --verbose --security authenticate --passkey "$PASSKEY"
SIM=$SIM_PID
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
no_bond "before"

# Without --pair: refused, one line that names --pair (exit 12, permission).
f=$RESULTS_DIR/flash-unpaired.stamped
rc=0
stamped "$f" 180 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json --restart --reconnect-window 0 || rc=$?
line=$(grep 'otaflash: error' "$f.stderr" | tail -n 1 || true)
step "unpaired: exit $rc: $line"
[ "$rc" -eq 12 ] || fail "a flash without --pair exited $rc, expected 12 (permission): $(tail -n 3 "$f.stderr")"
grep -q -- '--pair' <<<"$line" || fail "the refusal does not name --pair: $line"
! grep -q '"event":"activated"' "$SIM_OUT" || fail "the device activated an image written over an unauthenticated link"
remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"
remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"
no_bond "after the refusal"

refused wrong-passkey 'passkey 111111 was not accepted' --pair --passkey 111111
refused no-passkey '--passkey' --pair

f=$RESULTS_DIR/flash-passkey.stamped
rc=0
stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json --restart \
	--pair --passkey "$PASSKEY" --unpair-after || rc=$?
done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
[ "$rc" -eq 0 ] || fail "--pair --passkey $PASSKEY exited $rc: $(tail -n 3 "$f.stderr") $done_line"
grep -q 'paired (passkey entry)' "$f" "$f.stderr" || fail "no 'paired (passkey entry)' note"
step "right passkey: $done_line"
check_stored "$SIM_OUT" "$IMAGE"
no_bond "after --unpair-after"
flash_figures "$f" "pair+flash (passkey entry)"

stop_sim "$SIM" "$SIM_OUT" || fail "otaflash simulate exited with $? after SIGINT"
step "PASS"
