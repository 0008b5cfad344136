#!/bin/bash
# Smoke scenario: proves the virtual air works, with stock BlueZ tools only.
#   1. org.bluez lists the central and the peripheral adapter on D-Bus.
#   2. The peripheral controller advertises (btmgmt add-adv, with a name).
#   3. A scan by bluetoothd on the central controller (bluetoothctl) finds the
#      peripheral's address, and org.bluez exports it as a Device1 carrying
#      the advertised name.
# Runs inside the VM started by scripts/bluez-vm/run.sh.

set -euo pipefail

: "${OTAFLASH_VM:?run this through scripts/bluez-vm/run.sh}"
: "${CENTRAL_HCI:?}" "${CENTRAL_ADDR:?}" "${PERIPHERAL_HCI:?}" "${PERIPHERAL_ADDR:?}" "${PERIPHERAL_INDEX:?}" "${RESULTS_DIR:?}"

ADV_NAME=otaflash-smoke
ADV_INSTANCE=1
SCAN_TIMEOUT=${SMOKE_SCAN_TIMEOUT:-30}

T0=$EPOCHREALTIME
step() { awk -v a="$T0" -v b="$EPOCHREALTIME" -v m="$*" 'BEGIN { printf "[%6.2fs] %s\n", b - a, m }'; }
fail() { step "FAIL: $*"; exit 1; }

managed_objects() {
	timeout 10 dbus-send --system --print-reply --dest=org.bluez / \
		org.freedesktop.DBus.ObjectManager.GetManagedObjects
}

# ------------------------------------------------------------------ 1. adapters
step "central $CENTRAL_HCI $CENTRAL_ADDR, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"
objects=$(managed_objects) || fail "GetManagedObjects on org.bluez failed"
printf '%s\n' "$objects" >"$RESULTS_DIR/objects-before.txt"
for hci in "$CENTRAL_HCI" "$PERIPHERAL_HCI"; do
	# The adapter's object path must carry the org.bluez.Adapter1 interface.
	awk -v p="object path \"/org/bluez/$hci\"" '
		index($0, p) { inside = 1; next }
		/object path "/ { inside = 0 }
		inside && /string "org.bluez.Adapter1"/ { found = 1 }
		END { exit !found }' <<<"$objects" || fail "org.bluez does not list /org/bluez/$hci as an Adapter1"
	step "org.bluez lists adapter /org/bluez/$hci"
done

# ------------------------------------------------------------------ 2. advertise
# btmgmt needs a stdin it can poll; run.sh provides an idle pipe. The advertising
# data is one AD structure: Complete Local Name (type 0x09).
name_hex=$(printf '%s' "$ADV_NAME" | od -An -tx1 | tr -d ' \n')
adv_data=$(printf '%02x09%s' $((${#ADV_NAME} + 1)) "$name_hex")
cleanup() {
	timeout 10 btmgmt --index "$PERIPHERAL_INDEX" rm-adv "$ADV_INSTANCE" >/dev/null 2>&1 || true
}
trap cleanup EXIT
out=$(timeout 10 btmgmt --index "$PERIPHERAL_INDEX" add-adv -c -g -d "$adv_data" "$ADV_INSTANCE" 2>&1) ||
	fail "btmgmt add-adv failed: $out"
grep -q "Instance added: $ADV_INSTANCE" <<<"$out" || fail "btmgmt add-adv did not confirm: $out"
step "peripheral advertises instance $ADV_INSTANCE, connectable, general discoverable, name $ADV_NAME"

# ------------------------------------------------------------------ 3. scan
# bluetoothctl is driven through a FIFO so it can be told to stop as soon as
# the peripheral shows up; discovery through bluetoothd lasts only while its
# D-Bus client is connected.
ctl=$(mktemp -u /tmp/smoke-ctl.XXXXXX)
mkfifo "$ctl"
scan_log=$RESULTS_DIR/bluetoothctl-scan.log
bluetoothctl <"$ctl" >"$scan_log" 2>&1 &
btctl_pid=$!
exec {ctl_fd}>"$ctl"
rm -f "$ctl"
stop_bluetoothctl() {
	{ echo "scan off"; echo "quit"; } 1>&"$ctl_fd" 2>/dev/null || true
	exec {ctl_fd}>&-
	local i
	for ((i = 0; i < 50; i++)); do kill -0 "$btctl_pid" 2>/dev/null || break; sleep 0.1; done
	kill "$btctl_pid" 2>/dev/null || true
	wait "$btctl_pid" 2>/dev/null || true
}
trap 'stop_bluetoothctl; cleanup' EXIT
{ echo "select $CENTRAL_ADDR"; echo "menu scan"; echo "transport le"; echo "back"; echo "scan on"; } 1>&"$ctl_fd"
step "LE discovery started on $CENTRAL_HCI through bluetoothd (bluetoothctl scan on)"

# btvirt's controllers appear to emit an advertiser's reports only when scanning
# gets enabled, and the kernel drops reports that arrive before it marks the
# discovery active (seen in btmon: report 1 ms before "Discovering"). So if
# nothing shows up within RESTART_AFTER seconds, discovery is restarted.
RESTART_AFTER=${SMOKE_SCAN_RESTART:-3}
dev_path=/org/bluez/$CENTRAL_HCI/dev_${PERIPHERAL_ADDR//:/_}
deadline=$((SECONDS + SCAN_TIMEOUT))
restart_at=$((SECONDS + RESTART_AFTER))
found=0
while ((SECONDS < deadline)); do
	if managed_objects 2>/dev/null | grep -q "object path \"$dev_path\""; then
		found=1
		break
	fi
	if ((SECONDS >= restart_at)); then
		step "not seen yet, restarting discovery"
		{ echo "scan off"; sleep 0.5; echo "scan on"; } 1>&"$ctl_fd"
		restart_at=$((SECONDS + RESTART_AFTER))
	fi
	sleep 0.2
done
((found)) || fail "no $dev_path on D-Bus within ${SCAN_TIMEOUT}s (see bluetoothctl-scan.log)"
step "central found the peripheral: $dev_path"

device_prop() {
	timeout 10 dbus-send --system --print-reply --dest=org.bluez "$dev_path" \
		org.freedesktop.DBus.Properties.Get string:org.bluez.Device1 "string:$1" 2>/dev/null |
		sed -n 's/.*variant *[a-z0-9]* *//p' | tr -d '"'
}
addr=$(device_prop Address)
[ "$addr" = "$PERIPHERAL_ADDR" ] || fail "Device1.Address is '$addr', expected $PERIPHERAL_ADDR"
name=
for ((i = 0; i < 25; i++)); do
	name=$(device_prop Name || true)
	[ -z "$name" ] || break
	sleep 0.2
done
[ "$name" = "$ADV_NAME" ] || fail "Device1.Name is '$name', expected the advertised '$ADV_NAME'"
rssi=$(device_prop RSSI || true)
step "Device1 Address=$addr Name=$name RSSI=${rssi:-?}"

stop_bluetoothctl
trap cleanup EXIT
grep -q "$PERIPHERAL_ADDR" "$scan_log" || fail "bluetoothctl's output does not mention $PERIPHERAL_ADDR"
step "bluetoothctl reported the device too"

# Leave a clean adapter for the next scenario.
timeout 10 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$CENTRAL_HCI" \
	org.bluez.Adapter1.RemoveDevice "objpath:$dev_path" >/dev/null || step "note: RemoveDevice failed"
step "PASS"
