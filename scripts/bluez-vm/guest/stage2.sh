#!/bin/bash
# Stage 2 of the test VM: runs as PID 1 on the host's root file system
# (mounted read-only over 9p by stage 1). Brings up the real Bluetooth stack
# (hci_vhci + btvirt controllers, dbus-daemon, bluetoothd), runs the
# scenarios named in the run configuration and powers the VM off.
#
# Everything written goes to tmpfs or to the writable 9p share "results".
# Lines starting with "OTAFLASH-VM:" on the console are read by run.sh.

set -Eeuo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LANG=C.UTF-8 LC_ALL=C.UTF-8

MARK="OTAFLASH-VM:"
RES=/run/otaflash/results
LOGS=$RES/logs
BG_PIDS=()

say() { echo "$MARK $*"; }

uptime_s() { cut -d' ' -f1 /proc/uptime; }

power_off() {
	sync || true
	busybox poweroff -f || true
	echo o >/proc/sysrq-trigger || true
	sleep 10
}

fatal() {
	trap - ERR EXIT
	set +e
	say "FATAL $*"
	if [ -d "$LOGS" ]; then
		dmesg >"$LOGS/dmesg.log" 2>&1
		echo "$*" >"$LOGS/fatal.txt"
	fi
	stop_background
	power_off
}

trap 'fatal "stage 2 command failed (line $LINENO): $BASH_COMMAND"' ERR
trap 'fatal "stage 2 exited unexpectedly"' EXIT

stop_background() {
	local pid i
	for pid in "${BG_PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${BG_PIDS[@]}"; do
		for ((i = 0; i < 30; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	done
	BG_PIDS=()
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.1 s.
wait_for() {
	local secs=$1 what=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@"; do
		if ((SECONDS >= deadline)); then
			fatal "timed out after ${secs}s waiting for $what"
		fi
		sleep 0.1
	done
}

# ---------------------------------------------------------------- config
: "${otaflash_cfg:?otaflash_cfg= missing from the kernel command line}"
# shellcheck source=/dev/null
. "$otaflash_cfg"
: "${KDIR:?}" "${PROJECT_DIR:?}" "${SCENARIO_TIMEOUT:?}" "${STEP_TIMEOUT:?}"
[ -n "${SCENARIO_ENV+set}" ] || SCENARIO_ENV=()

say "stage 2 up after $(uptime_s)s"

# ---------------------------------------------------------------- mounts
for d in /run /tmp /var/tmp /var/cache /var/lib/bluetooth; do
	if [ -d "$d" ]; then
		mount -t tmpfs -o mode=0755 tmpfs "$d"
	else
		say "note: $d does not exist on the host, not mounting tmpfs over it"
	fi
done
chmod 1777 /tmp /var/tmp
chmod 0700 /var/lib/bluetooth 2>/dev/null || true
mkdir -p /dev/pts /dev/shm
# devtmpfs has no /dev/fd; bash process substitution needs it.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
[ -e /dev/stdin ] || ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || ln -s /proc/self/fd/2 /dev/stderr
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p "$RES" /run/dbus /run/otaflash/home
mount -t 9p -o "trans=virtio,version=9p2000.L,msize=${otaflash_msize:-262144}" results "$RES"
mkdir -p "$LOGS" "$RES/scenarios"
: >"$LOGS/summary.tsv"
hostname otaflash-vm 2>/dev/null || true

# ---------------------------------------------------------------- modules
# The kernel's own module requests (e.g. crypto algorithms, bt protocols)
# must find the unpacked, not installed, module tree.
cat >/run/otaflash/modprobe <<EOW
#!/bin/sh
exec $(command -v modprobe) -d '$KDIR' "\$@"
EOW
chmod 0755 /run/otaflash/modprobe
echo /run/otaflash/modprobe >/proc/sys/kernel/modprobe
/run/otaflash/modprobe -a bluetooth hci_vhci ecdh_generic ecc cmac ecb crypto_user
say "bluetooth modules loaded (t=$(uptime_s)s)"

# ---------------------------------------------------------------- D-Bus
dbus-daemon --system --nofork --nopidfile --nosyslog >"$LOGS/dbus.log" 2>&1 &
BG_PIDS+=($!)
wait_for "$STEP_TIMEOUT" "the D-Bus system bus socket" test -S /run/dbus/system_bus_socket
say "dbus-daemon up (t=$(uptime_s)s)"

if [ "${BTMON:-0}" = 1 ]; then
	btmon -w "$LOGS/btmon.snoop" >"$LOGS/btmon.log" 2>&1 &
	BG_PIDS+=($!)
fi

# ---------------------------------------------------------------- btvirt
# Sometimes hci_vhci consumes a controller's first HCI_Reset as the reply to
# its create request; that controller then never finishes its setup (kernel:
# "Opcode 0x0c03 failed: -110"). So one spare controller is created beyond the
# WANTED usable ones (run.sh --controllers, default 2), and btvirt is
# restarted if fewer than WANTED finish their setup. After the last attempt
# two usable controllers are enough to go on; scenarios that need more check
# ADAPTER_COUNT and say why they cannot run.
# debugfs hciN/hci_version only appears once a controller's setup succeeded.
usable_count() { local n=0 f; for f in /sys/kernel/debug/bluetooth/hci*/hci_version; do [ -e "$f" ] && n=$((n + 1)); done; echo "$n"; }
created_count() { local n=0 f; for f in /sys/class/bluetooth/hci*; do [ -e "$f" ] && n=$((n + 1)); done; echo "$n"; }
no_controllers() { [ "$(created_count)" -eq 0 ]; }

BTVIRT_PID=
start_btvirt() {
	btvirt -l"$CONTROLLERS" >>"$LOGS/btvirt.log" 2>&1 &
	BTVIRT_PID=$!
}
stop_btvirt() {
	kill -TERM "$BTVIRT_PID" 2>/dev/null || true
	local i
	for ((i = 0; i < 50; i++)); do kill -0 "$BTVIRT_PID" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$BTVIRT_PID" 2>/dev/null || true
	wait "$BTVIRT_PID" 2>/dev/null || true
	wait_for "$STEP_TIMEOUT" "btvirt's controllers to go away" no_controllers
}

WANTED=${CONTROLLERS_WANTED:-2}
((WANTED >= 2)) || WANTED=2
CONTROLLERS=$((WANTED + 1))
MAX_ATTEMPTS=4
attempt=0
while :; do
	attempt=$((attempt + 1))
	start_btvirt
	deadline=$((SECONDS + STEP_TIMEOUT))
	wanted_since=
	last_u=-1
	changed_at=$SECONDS
	while ((SECONDS < deadline)); do
		u=$(usable_count)
		((u >= CONTROLLERS)) && break
		if ((u != last_u)); then
			last_u=$u
			changed_at=$SECONDS
		fi
		if ((u >= WANTED)); then
			# Enough; give the spare a short grace period.
			[ -n "$wanted_since" ] || wanted_since=$SECONDS
			((SECONDS - wanted_since >= 2)) && break
		elif ((u >= 2 && SECONDS - changed_at >= 6)); then
			# A controller that has not finished its setup 6 s after the last
			# one did has met the hci_vhci race (its HCI_Reset times out after 2 s).
			break
		fi
		sleep 0.1
	done
	u=$(usable_count)
	if ((u >= WANTED)); then
		say "btvirt: $u of $(created_count) controllers usable (attempt $attempt, t=$(uptime_s)s)"
		break
	fi
	if ((attempt >= MAX_ATTEMPTS)); then
		((u >= 2)) || fatal "btvirt: fewer than two usable controllers after $attempt attempts"
		say "btvirt: only $u of $(created_count) controllers usable after $attempt attempts ($WANTED wanted); going on with $u (t=$(uptime_s)s)"
		break
	fi
	say "btvirt: only $u of $(created_count) controllers usable (attempt $attempt, $WANTED wanted), restarting btvirt"
	stop_btvirt
done
BG_PIDS+=("$BTVIRT_PID")

# ---------------------------------------------------------------- bluetoothd
BTD=/usr/libexec/bluetooth/bluetoothd
[ -x "$BTD" ] || BTD=/usr/lib/bluetooth/bluetoothd
btd_args=(-n -E)
[ "${BTD_DEBUG:-0}" = 1 ] && btd_args+=(-d)
if [ -n "${GATT_CHANNELS:-}" ]; then
	# run.sh --gatt-channels: ATT bearers per link (1 turns EATT off; write commands then keep
	# their order, as with a peer that has one bearer).
	printf '[GATT]\nChannels = %s\n' "$GATT_CHANNELS" >/run/otaflash/main.conf
	btd_args+=(-f /run/otaflash/main.conf)
fi
"$BTD" "${btd_args[@]}" >"$LOGS/bluetoothd.log" 2>&1 &
BTD_PID=$!
BG_PIDS+=("$BTD_PID")

bluez_adapters() {
	dbus-send --system --print-reply --dest=org.bluez / \
		org.freedesktop.DBus.ObjectManager.GetManagedObjects 2>/dev/null |
		grep -o 'object path "/org/bluez/hci[0-9]*"' | grep -o 'hci[0-9]*' | sort -u -V || true
}
adapter_count() { bluez_adapters | wc -l; }
enough_adapters() {
	kill -0 "$BTD_PID" 2>/dev/null || fatal "bluetoothd exited (see logs/bluetoothd.log)"
	local n
	n=$(adapter_count)
	((n >= USABLE)) && return 0
	if ((n >= MIN_OK)); then
		[ -n "$two_since" ] || two_since=$SECONDS
		((SECONDS - two_since >= 2)) && return 0
	fi
	return 1
}
USABLE=$(usable_count)
MIN_OK=$((USABLE < WANTED ? USABLE : WANTED))
((MIN_OK >= 2)) || MIN_OK=2
two_since=
wait_for "$STEP_TIMEOUT" "bluetoothd to list two adapters on D-Bus" enough_adapters
mapfile -t ADAPTERS < <(bluez_adapters)
say "bluetoothd lists ${ADAPTERS[*]} (t=$(uptime_s)s)"

adapter_prop() {
	dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" \
		org.freedesktop.DBus.Properties.Get string:org.bluez.Adapter1 "string:$2" 2>/dev/null |
		sed -n 's/.*variant *[a-z0-9]* *//p' | tr -d '"' || true
}
# Powers on every adapter not yet on. bluetoothd may be powering one itself (AutoEnable) and
# answers org.bluez.Error.Busy meanwhile: that one is asked again on the next round.
power_on_all() {
	local a on=0
	for a in "${ADAPTERS[@]}"; do
		if [ "$(adapter_prop "$a" Powered)" = true ]; then
			on=$((on + 1))
		else
			dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$a" \
				org.freedesktop.DBus.Properties.Set string:org.bluez.Adapter1 string:Powered variant:boolean:true \
				>/dev/null 2>&1 || true
		fi
	done
	((on == ${#ADAPTERS[@]}))
}
wait_for "$STEP_TIMEOUT" "the adapters to power on" power_on_all

# ---------------------------------------------------------------- scenario env
export OTAFLASH_VM=1 PROJECT_DIR
export OTAFLASH_VM_LOGS=$LOGS
export HOME=/run/otaflash/home
export BLUEZ_ADAPTERS="${ADAPTERS[*]}"
# The first three usable adapters by role; every usable adapter also by number
# (ADAPTER0 is the central, ADAPTER1 the peripheral, ADAPTER2 the third, ...).
export ADAPTER_COUNT=${#ADAPTERS[@]} CONTROLLERS_WANTED=$WANTED
roles=(CENTRAL PERIPHERAL THIRD)
for i in "${!ADAPTERS[@]}"; do
	a=${ADAPTERS[$i]}
	addr=$(adapter_prop "$a" Address)
	export "ADAPTER${i}_HCI=$a" "ADAPTER${i}_INDEX=${a#hci}" "ADAPTER${i}_ADDR=$addr"
	if ((i < 3)); then
		r=${roles[$i]}
		export "${r}_HCI=$a" "${r}_INDEX=${a#hci}" "${r}_ADDR=$addr"
	fi
done
# Variables given with run.sh --env NAME=VALUE.
for kv in "${SCENARIO_ENV[@]}"; do
	export "${kv?}"
done
{
	echo "kernel=$(uname -r)"
	echo "bluetoothd=$("$BTD" --version 2>/dev/null || echo unknown)"
	env | grep -E '^(OTAFLASH_VM|PROJECT_DIR|BLUEZ_ADAPTERS|ADAPTER_COUNT|CONTROLLERS_WANTED|(CENTRAL|PERIPHERAL|THIRD|ADAPTER[0-9]+)_(HCI|INDEX|ADDR))=' | sort -V
	for kv in "${SCENARIO_ENV[@]}"; do echo "$kv"; done
} >"$LOGS/env.txt"

say "READY uptime=$(uptime_s) adapters=${ADAPTERS[*]} central=$CENTRAL_HCI/$CENTRAL_ADDR peripheral=$PERIPHERAL_HCI/$PERIPHERAL_ADDR"

# ---------------------------------------------------------------- scenarios
now() { echo "$EPOCHREALTIME"; }
# Scenarios get an idle pipe on stdin (never data, never EOF) instead of
# /dev/null: BlueZ's command-line tools (btmgmt, bluetoothctl) quit at once,
# silently and with status 0, when stdin is /dev/null.
mkfifo /run/otaflash/stdin
exec {IDLE_STDIN}<>/run/otaflash/stdin
for i in "${!SCENARIOS[@]}"; do
	path=${SCENARIOS[$i]}
	name=${NAMES[$i]}
	dir=$RES/scenarios/$name
	mkdir -p "$dir"
	say "RUN $name"
	t0=$(now)
	rc=0
	# timeout(1) makes itself a process group leader: its pid is the group
	# of everything the scenario started, killed afterwards so no stray
	# process (a forgotten bluetoothctl, a GATT server) leaks into the next.
	RESULTS_DIR=$dir timeout -k 5 "$SCENARIO_TIMEOUT" "$path" <&"$IDLE_STDIN" >"$dir/output.log" 2>&1 &
	spid=$!
	tpid=
	if [ "${VERBOSE:-0}" = 1 ]; then
		tail -s 0.2 -n +1 -f --pid="$spid" "$dir/output.log" &
		tpid=$!
	fi
	wait "$spid" || rc=$?
	[ -z "$tpid" ] || wait "$tpid" || true
	kill -KILL -- "-$spid" 2>/dev/null || true
	t1=$(now)
	dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
	if [ "$rc" -eq 0 ]; then
		result=pass
	elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		result=timeout
	else
		result=fail
	fi
	printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$rc" "$dur" >>"$LOGS/summary.tsv"
	say "END $name $result rc=$rc ${dur}s"
	if ! kill -0 "$BTD_PID" 2>/dev/null; then
		say "bluetoothd is gone after scenario $name"
	fi
done

# ---------------------------------------------------------------- shutdown
trap - ERR EXIT
set +e
dmesg >"$LOGS/dmesg.log" 2>&1
stop_background
say "DONE uptime=$(uptime_s)"
power_off
