#!/bin/bash
# Real-stack test harness: boots a small qemu VM running Debian's kernel
# (hci_vhci), btvirt virtual controllers and the stock bluetoothd, runs the
# given scenario scripts inside it and brings the results back.
#
#   scripts/bluez-vm/run.sh [options] [SCENARIO...]
#
# See README.md next to this file for options, exit codes and layout.

set -euo pipefail

readonly EXIT_OK=0 EXIT_SCENARIO_FAILED=1 EXIT_USAGE=2 EXIT_HARNESS=3 EXIT_INTERRUPTED=130

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
PROJECT_DIR=$(cd "$HERE/../.." && pwd -P)
WORK=$HERE/work
INIT_SCRIPT=$HERE/guest/init
STAGE2=$HERE/guest/stage2.sh
T_START=$EPOCHREALTIME

# ---------------------------------------------------------------- options
ACCEL=tcg
SCENARIO_TIMEOUT=300
BOOT_TIMEOUT=180
STEP_TIMEOUT=30
RESULTS=$WORK/results
KEEP=0
VERBOSE=0
BTD_DEBUG=0
GATT_CHANNELS=
KERNEL_META=linux-image-amd64
BTMON=0
MEMORY=1024
CPUS=2
LOCK_TIMEOUT=900
CONTROLLERS=2
SCENARIO_ENV=()
SCENARIOS=()

usage() {
	cat <<'EOF'
Usage: scripts/bluez-vm/run.sh [options] [SCENARIO...]

Boots a VM with the real Linux Bluetooth stack (hci_vhci + btvirt +
bluetoothd) and runs each SCENARIO (an executable on the host file system)
inside it. Without SCENARIO, runs scenarios/smoke.sh.

Options:
  --accel tcg|kvm        qemu accelerator (default tcg; kvm needs working VT-x/AMD-V)
  --timeout SECONDS      per-scenario timeout (default 300)
  --boot-timeout SECONDS time allowed from qemu start to a ready bluetoothd (default 180)
  --results DIR          results folder (default scripts/bluez-vm/work/results)
  --bluetoothd-debug     run bluetoothd with -d (debug log in DIR/logs/bluetoothd.log)
  --gatt-channels N      bluetoothd's [GATT] Channels (1-5; default: BlueZ's, EATT on): 1 is
                         one ATT bearer per link, as an nRF5 SDK device has
  --btmon                record HCI traffic to DIR/logs/btmon.snoop (read with btmon -r)
  --kernel PACKAGE       the Debian kernel meta package to boot (default linux-image-amd64,
                         Debian 12's 6.1; linux-image-6.12-amd64 is 6.12 from bookworm-security)
  --keep                 keep the per-run folder (guest config) under work/
  --verbose              stream the guest console (and scenario output) to stdout
  --memory MIB           guest memory (default 1024)
  --cpus N               guest vCPUs (default 2)
  --controllers N        usable virtual controllers wanted (default 2, at least 2);
                         btvirt creates one spare beyond them
  --env NAME=VALUE       pass this variable to every scenario (repeatable)
  -h, --help             this help

Exit codes: 0 all scenarios passed; 1 a scenario failed or timed out;
2 usage error; 3 the harness itself could not run; 130 interrupted.
EOF
}

die_usage() {
	echo "run.sh: $*" >&2
	echo "Try 'run.sh --help'." >&2
	exit "$EXIT_USAGE"
}

need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die_usage "option $1 needs a value"; }
need_env() {
	[[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die_usage "--env needs NAME=VALUE, got '$1'"
	case ${1%%=*} in
	OTAFLASH_VM | PROJECT_DIR | RESULTS_DIR | HOME | PATH | BLUEZ_ADAPTERS | ADAPTER_COUNT | CONTROLLERS_WANTED | \
		CENTRAL_* | PERIPHERAL_* | THIRD_* | ADAPTER[0-9]*_*) die_usage "--env cannot set ${1%%=*}: the harness sets it" ;;
	esac
}
need_int() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || die_usage "option $1 needs a positive integer, got '$2'"; }

while [ $# -gt 0 ]; do
	case $1 in
	--accel) need_arg "$@"; ACCEL=$2; shift 2 ;;
	--accel=*) ACCEL=${1#*=}; shift ;;
	--timeout) need_arg "$@"; need_int "$1" "$2"; SCENARIO_TIMEOUT=$2; shift 2 ;;
	--timeout=*) need_int --timeout "${1#*=}"; SCENARIO_TIMEOUT=${1#*=}; shift ;;
	--boot-timeout) need_arg "$@"; need_int "$1" "$2"; BOOT_TIMEOUT=$2; shift 2 ;;
	--boot-timeout=*) need_int --boot-timeout "${1#*=}"; BOOT_TIMEOUT=${1#*=}; shift ;;
	--results) need_arg "$@"; RESULTS=$2; shift 2 ;;
	--results=*) RESULTS=${1#*=}; shift ;;
	--memory) need_arg "$@"; need_int "$1" "$2"; MEMORY=$2; shift 2 ;;
	--cpus) need_arg "$@"; need_int "$1" "$2"; CPUS=$2; shift 2 ;;
	--controllers) need_arg "$@"; need_int "$1" "$2"; CONTROLLERS=$2; shift 2 ;;
	--controllers=*) need_int --controllers "${1#*=}"; CONTROLLERS=${1#*=}; shift ;;
	--env) need_arg "$@"; need_env "$2"; SCENARIO_ENV+=("$2"); shift 2 ;;
	--env=*) need_env "${1#*=}"; SCENARIO_ENV+=("${1#*=}"); shift ;;
	--bluetoothd-debug) BTD_DEBUG=1; shift ;;
	--gatt-channels) need_arg "$@"; need_int "$1" "$2"; [ "$2" -le 5 ] || die_usage "option $1 takes 1-5, got '$2'"; GATT_CHANNELS=$2; shift 2 ;;
	--btmon) BTMON=1; shift ;;
	--kernel) need_arg "$@"; [[ $2 =~ ^linux-image-[a-z0-9.+-]+$ ]] || die_usage "option $1 takes a linux-image-* package, got '$2'"; KERNEL_META=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--verbose | -v) VERBOSE=1; shift ;;
	-h | --help) usage; exit "$EXIT_OK" ;;
	--) shift; SCENARIOS+=("$@"); break ;;
	-*) die_usage "unknown option $1" ;;
	*) SCENARIOS+=("$1"); shift ;;
	esac
done
case $ACCEL in tcg | kvm) ;; *) die_usage "--accel must be tcg or kvm, got '$ACCEL'" ;; esac
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=("$HERE/scenarios/smoke.sh")
[ "$CONTROLLERS" -ge 2 ] || die_usage "--controllers must be at least 2, got $CONTROLLERS"

# Paths are handed to the guest on the kernel command line and in a shell
# config; they are seen there at the same absolute path (9p root).
SCEN_PATHS=()
SCEN_NAMES=()
declare -A SEEN_NAMES=()
for s in "${SCENARIOS[@]}"; do
	[ -f "$s" ] || die_usage "scenario not found: $s"
	[ -x "$s" ] || die_usage "scenario is not executable: $s (chmod +x it)"
	p=$(realpath -- "$s")
	case $p in
	/tmp/* | /run/* | /var/tmp/* | /var/cache/* | /var/lib/bluetooth/*)
		die_usage "scenario $p is under a folder the guest covers with tmpfs (/tmp /run /var/tmp /var/cache /var/lib/bluetooth); put it elsewhere" ;;
	esac
	n=$(basename -- "$p")
	n=${n%.*}
	n=${n//[^A-Za-z0-9._-]/_}
	[ -n "$n" ] || n=scenario
	base=$n
	k=2
	while [ -n "${SEEN_NAMES[$n]:-}" ]; do n=$base-$k; k=$((k + 1)); done
	SEEN_NAMES[$n]=1
	SCEN_PATHS+=("$p")
	SCEN_NAMES+=("$n")
done
for p in "$PROJECT_DIR" "$HERE"; do
	[[ $p != *[[:space:]]* ]] || die_usage "the project path must not contain whitespace: $p"
done

# ---------------------------------------------------------------- helpers
log() { echo "[bluez-vm] $*"; }
vlog() { [ "$VERBOSE" = 0 ] || log "$@"; }
elapsed() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'; }

json_str() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\n'/\\n}
	s=${s//$'\t'/\\t}
	s=${s//$'\r'/}
	s=$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')
	printf '"%s"' "$s"
}

HARNESS_ERROR=
QEMU_PID=
TAIL_PID=
RUN_DIR=
CONSOLE=
BOOT_S=null
PREP_S=null
READY_UPTIME=null
READY_ADAPTERS=
KVER=
KPKG=

cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
		kill -TERM "$QEMU_PID" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$QEMU_PID" 2>/dev/null || true
		wait "$QEMU_PID" 2>/dev/null || true
	fi
	if [ -n "$TAIL_PID" ]; then
		kill "$TAIL_PID" 2>/dev/null || true
		wait "$TAIL_PID" 2>/dev/null || true
	fi
	if [ -n "$RUN_DIR" ] && [ -d "$RUN_DIR" ]; then
		if [ "$KEEP" = 1 ]; then
			log "kept run folder: $RUN_DIR"
		else
			rm -rf -- "$RUN_DIR"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo; log "interrupted"; exit "$EXIT_INTERRUPTED"' INT TERM

console_tail() {
	[ -n "$CONSOLE" ] && [ -f "$CONSOLE" ] || return 0
	echo "----- last 40 lines of the guest console ($CONSOLE) -----" >&2
	tail -n 40 "$CONSOLE" | tr -d '\r' >&2
	echo "-----" >&2
}

# harness_fail REASON [show-console]: one clear line, results.json, exit 3.
harness_fail() {
	HARNESS_ERROR=$1
	echo "HARNESS ERROR: $1" >&2
	[ "${2:-}" != show-console ] || console_tail
	write_json "$EXIT_HARNESS" || true
	exit "$EXIT_HARNESS"
}

# ---------------------------------------------------------------- host setup
# One run at a time: runs share the kernel/initramfs cache and, by default,
# the results folder, and two TCG guests on a small machine only slow each
# other down. Time spent waiting is reported separately.
mkdir -p "$WORK"
LOCK_WAIT_S=0.0
exec 9>"$WORK/.lock"
if ! flock -n 9; then
	log "another run.sh is using $WORK (lock $WORK/.lock); waiting up to ${LOCK_TIMEOUT}s"
	t_lock=$EPOCHREALTIME
	flock -w "$LOCK_TIMEOUT" 9 || harness_fail "another run.sh held $WORK/.lock for more than ${LOCK_TIMEOUT}s"
	LOCK_WAIT_S=$(elapsed "$t_lock")
	log "got the lock after ${LOCK_WAIT_S}s"
fi

APT_UPDATED=0
APT_LOG=$WORK/apt.log
apt_update_once() {
	[ "$APT_UPDATED" = 0 ] || return 0
	log "apt-get update"
	if ! apt-get update >>"$APT_LOG" 2>&1; then
		tail -n 15 "$APT_LOG" >&2
		return 1
	fi
	APT_UPDATED=1
}

pkg_installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }

install_packages() {
	local pkgs=(qemu-system-x86 bluez bluez-test-tools busybox-static dbus kmod cpio gzip coreutils util-linux)
	local missing=() p
	for p in "${pkgs[@]}"; do pkg_installed "$p" || missing+=("$p"); done
	[ ${#missing[@]} -gt 0 ] || return 0
	[ "$(id -u)" = 0 ] || harness_fail "missing packages (${missing[*]}) and not root, cannot install them"
	command -v apt-get >/dev/null || harness_fail "missing packages (${missing[*]}) and apt-get is not available"
	log "installing: ${missing[*]}"
	apt_update_once || harness_fail "apt-get update failed (see $APT_LOG)"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >>"$APT_LOG" 2>&1; then
		tail -n 15 "$APT_LOG" >&2
		harness_fail "apt-get install ${missing[*]} failed (see $APT_LOG)"
	fi
}

check_tools() {
	local t
	for t in qemu-system-x86_64 btvirt btmgmt bluetoothctl dbus-daemon dbus-send modprobe depmod cpio gzip dpkg-deb timeout flock; do
		command -v "$t" >/dev/null || harness_fail "required tool '$t' is missing after installation"
	done
	[ -x /bin/busybox ] || harness_fail "/bin/busybox (busybox-static) is missing"
	if ldd /bin/busybox >/dev/null 2>&1; then
		harness_fail "/bin/busybox is dynamically linked; the initramfs needs busybox-static"
	fi
	[ -x /usr/libexec/bluetooth/bluetoothd ] || [ -x /usr/lib/bluetooth/bluetoothd ] ||
		harness_fail "bluetoothd is missing (package bluez)"
}

# Resolves the kernel meta package (--kernel, linux-image-amd64) to the real image package, downloads and unpacks
# it into work/kernel/<package>_<version>/root (cached), runs depmod there.
prepare_kernel() {
	local dep ver dir tmp deb
	resolve() {
		dep=$(apt-cache depends "$KERNEL_META" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1)
		[ -n "$dep" ] && ver=$(apt-cache show --no-all-versions "$dep" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
		[ -n "$dep" ] && [ -n "$ver" ]
	}
	if ! resolve; then
		apt_update_once || harness_fail "kernel: apt-get update failed (see $APT_LOG)"
		resolve || harness_fail "kernel: cannot resolve $KERNEL_META to an image package with apt-cache"
	fi
	KPKG=${dep}_$ver
	dir=$WORK/kernel/$KPKG
	if [ ! -f "$dir/.ready" ]; then
		log "kernel: downloading $dep ($ver)"
		rm -rf -- "$dir"
		mkdir -p "$WORK/kernel/download"
		tmp=$(mktemp -d "$WORK/kernel/download/XXXXXX")
		if ! (cd "$tmp" && apt-get download "$dep=$ver" >>"$APT_LOG" 2>&1); then
			apt_update_once || true
			(cd "$tmp" && apt-get download "$dep" >>"$APT_LOG" 2>&1) || {
				tail -n 10 "$APT_LOG" >&2
				rm -rf -- "$tmp"
				harness_fail "kernel download failed: apt-get download $dep (see $APT_LOG)"
			}
		fi
		deb=$(find "$tmp" -maxdepth 1 -name '*.deb' | head -n 1)
		[ -n "$deb" ] || harness_fail "kernel download failed: no .deb from apt-get download $dep"
		log "kernel: unpacking $(basename "$deb")"
		mkdir -p "$tmp/root"
		dpkg-deb -x "$deb" "$tmp/root" || harness_fail "kernel: dpkg-deb -x $deb failed"
		rm -f -- "$deb"
		KVER=$(ls "$tmp/root/lib/modules" | head -n 1)
		[ -n "$KVER" ] && [ -f "$tmp/root/boot/vmlinuz-$KVER" ] || harness_fail "kernel: $dep has no vmlinuz/modules"
		depmod -b "$tmp/root" "$KVER" || harness_fail "kernel: depmod -b failed"
		echo "$KVER" >"$tmp/root/.kver"
		mv "$tmp/root" "$dir"
		rm -rf -- "$tmp"
		echo "$KERNEL_META" >"$dir/.meta"
		touch "$dir/.ready"
		# Older kernels of the same meta package are no longer needed.
		for old in "$WORK"/kernel/*/.meta; do
			[ -f "$old" ] && [ "$(cat "$old")" = "$KERNEL_META" ] && [ "$(dirname "$old")" != "$dir" ] && rm -rf -- "$(dirname "$old")"
		done
	fi
	KDIR=$dir
	KVER=$(cat "$dir/.kver")
	VMLINUZ=$dir/boot/vmlinuz-$KVER
}

# Builds the initramfs (static busybox + the virtio/9p modules in load
# order). Cached under a name derived from all of its inputs.
prepare_initramfs() {
	local mods=() m line key tmp out
	for m in virtio_pci 9pnet_virtio 9p; do
		while read -r line; do
			case $line in
			insmod\ *) line=${line#insmod }; line=${line%% *}
				[[ " ${mods[*]} " == *" $line "* ]] || mods+=("$line") ;;
			builtin\ *) ;;
			*) [ -z "$line" ] || harness_fail "initramfs: unexpected modprobe output: $line" ;;
			esac
		done < <(modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" 2>&1)
	done
	[ ${#mods[@]} -gt 0 ] || harness_fail "initramfs: no virtio/9p modules found in $KDIR"
	key=$( {
		echo "format 1 $KPKG"
		sha256sum /bin/busybox "$INIT_SCRIPT" "${mods[@]}"
	} | sha256sum | cut -c1-16)
	INITRAMFS=$WORK/initramfs-$key.cpio.gz
	[ -f "$INITRAMFS" ] && return 0
	log "initramfs: building ($(printf '%s ' "${mods[@]##*/}"))"
	tmp=$(mktemp -d "$WORK/initramfs-build.XXXXXX")
	mkdir -p "$tmp"/{bin,dev,proc,sys,newroot,modules}
	cp /bin/busybox "$tmp/bin/busybox"
	cp "$INIT_SCRIPT" "$tmp/init"
	chmod 0755 "$tmp/init"
	for m in "${mods[@]}"; do
		case $m in
		*.ko) cp "$m" "$tmp/modules/" ;;
		*.ko.xz) xz -dc "$m" >"$tmp/modules/$(basename "${m%.xz}")" ;;
		*.ko.zst) zstd -qdc "$m" >"$tmp/modules/$(basename "${m%.zst}")" ;;
		*.ko.gz) gzip -dc "$m" >"$tmp/modules/$(basename "${m%.gz}")" ;;
		*) harness_fail "initramfs: unknown module format $m" ;;
		esac
		m=$(basename "$m")
		echo "${m%.ko*}.ko" >>"$tmp/modules/order"
	done
	out=$INITRAMFS.tmp
	(cd "$tmp" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0 | gzip -6 >"$out") ||
		harness_fail "initramfs: cpio failed"
	rm -rf -- "$tmp"
	rm -f -- "$WORK"/initramfs-*.cpio.gz
	mv "$out" "$INITRAMFS"
}

# ---------------------------------------------------------------- results
RES_SUMMARY=
write_json() {
	local rc=$1 out=$RESULTS/results.json first=1 i name res code dur line
	[ -d "$RESULTS" ] || return 0
	declare -A r_res=() r_code=() r_dur=()
	if [ -n "$RES_SUMMARY" ] && [ -f "$RES_SUMMARY" ]; then
		while IFS=$'\t' read -r name res code dur; do
			[ -n "$name" ] || continue
			r_res[$name]=$res r_code[$name]=$code r_dur[$name]=$dur
		done <"$RES_SUMMARY"
	fi
	{
		echo "{"
		echo "  \"exit_code\": $rc,"
		printf '  "harness_error": %s,\n' "$([ -n "$HARNESS_ERROR" ] && json_str "$HARNESS_ERROR" || echo null)"
		printf '  "accel": %s,\n' "$(json_str "$ACCEL")"
		printf '  "kernel": %s,\n' "$(json_str "${KVER:-}")"
		printf '  "kernel_package": %s,\n' "$(json_str "${KPKG:-}")"
		printf '  "prepare_seconds": %s,\n' "$PREP_S"
		printf '  "boot_to_ready_seconds": %s,\n' "$BOOT_S"
		printf '  "guest_uptime_at_ready_seconds": %s,\n' "$READY_UPTIME"
		printf '  "total_seconds": %s,\n' "$(elapsed "$T_START")"
		printf '  "lock_wait_seconds": %s,\n' "${LOCK_WAIT_S:-0.0}"
		printf '  "scenario_timeout_seconds": %s,\n' "$SCENARIO_TIMEOUT"
		printf '  "controllers_wanted": %s,\n' "$CONTROLLERS"
		printf '  "adapters": %s,\n' "$(json_str "${READY_ADAPTERS:-}")"
		echo '  "scenarios": ['
		for i in "${!SCEN_NAMES[@]}"; do
			name=${SCEN_NAMES[$i]}
			[ "$first" = 1 ] || echo ","
			first=0
			printf '    {"name": %s, "path": %s, "result": %s, "exit_code": %s, "duration_seconds": %s, "log": %s}' \
				"$(json_str "$name")" "$(json_str "${SCEN_PATHS[$i]}")" \
				"$(json_str "${r_res[$name]:-not-run}")" "${r_code[$name]:-null}" "${r_dur[$name]:-null}" \
				"$(json_str "scenarios/$name/output.log")"
		done
		[ "$first" = 1 ] || echo
		echo "  ]"
		echo "}"
	} >"$out.tmp" && mv "$out.tmp" "$out"
}

# ---------------------------------------------------------------- run
T_PREP=$EPOCHREALTIME
install_packages
check_tools
if [ "$ACCEL" = kvm ]; then
	[ -r /dev/kvm ] && [ -w /dev/kvm ] || harness_fail "--accel kvm: /dev/kvm is not usable"
fi
prepare_kernel
prepare_initramfs
PREP_S=$(elapsed "$T_PREP")
vlog "prepared in ${PREP_S}s: kernel $KVER, $(basename "$INITRAMFS")"

mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd -P)
[[ $RESULTS != *[[:space:]]* ]] || die_usage "the results path must not contain whitespace: $RESULTS"
rm -rf -- "$RESULTS/scenarios" "$RESULTS/logs" "$RESULTS/results.json"
mkdir -p "$RESULTS/logs"
RES_SUMMARY=$RESULTS/logs/summary.tsv
CONSOLE=$RESULTS/logs/console.log
: >"$CONSOLE"

RUN_DIR=$(mktemp -d "$WORK/run.XXXXXX")
{
	printf 'KDIR=%q\n' "$KDIR"
	printf 'PROJECT_DIR=%q\n' "$PROJECT_DIR"
	printf 'SCENARIO_TIMEOUT=%q\n' "$SCENARIO_TIMEOUT"
	printf 'STEP_TIMEOUT=%q\n' "$STEP_TIMEOUT"
	printf 'BTD_DEBUG=%q\nBTMON=%q\nVERBOSE=%q\n' "$BTD_DEBUG" "$BTMON" "$VERBOSE"
	printf 'GATT_CHANNELS=%q\n' "$GATT_CHANNELS"
	printf 'CONTROLLERS_WANTED=%q\n' "$CONTROLLERS"
	printf 'SCENARIO_ENV=('; [ ${#SCENARIO_ENV[@]} -eq 0 ] || printf ' %q' "${SCENARIO_ENV[@]}"; printf ' )\n'
	printf 'SCENARIOS=('; printf ' %q' "${SCEN_PATHS[@]}"; printf ' )\n'
	printf 'NAMES=('; printf ' %q' "${SCEN_NAMES[@]}"; printf ' )\n'
} >"$RUN_DIR/guest.env"

if [ "$ACCEL" = kvm ]; then
	accel_args=(-accel kvm -cpu host)
else
	# shellcheck disable=SC2054 # commas are qemu's own option syntax
	accel_args=(-accel tcg,thread=multi,tb-size=256 -cpu max)
fi
append="console=ttyS0,115200 rdinit=/init panic=-1 loglevel=4 mitigations=off cryptomgr.notests=1"
append+=" otaflash_stage2=$STAGE2 otaflash_cfg=$RUN_DIR/guest.env"

# shellcheck disable=SC2054
qemu_args=(
	-nodefaults -no-user-config -display none -monitor none -no-reboot
	-machine q35 "${accel_args[@]}" -smp "$CPUS" -m "$MEMORY"
	-kernel "$VMLINUZ" -initrd "$INITRAMFS" -append "$append"
	-chardev "file,id=con,path=$CONSOLE" -serial chardev:con
	-fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
	-fsdev "local,id=results,path=$RESULTS,security_model=none,multidevs=remap"
	-device virtio-9p-pci,fsdev=results,mount_tag=results
)

ctl_note=
[ "$CONTROLLERS" = 2 ] || ctl_note=", $CONTROLLERS controllers wanted"
log "booting VM ($ACCEL, $CPUS vCPU, ${MEMORY} MiB, kernel $KVER$ctl_note), ${#SCEN_NAMES[@]} scenario(s)"
T_BOOT=$EPOCHREALTIME
qemu-system-x86_64 "${qemu_args[@]}" >"$RESULTS/logs/qemu.log" 2>&1 &
QEMU_PID=$!
if [ "$VERBOSE" = 1 ]; then
	tail -n +1 -f --pid="$QEMU_PID" "$CONSOLE" &
	TAIL_PID=$!
fi

console_has() { grep -q -a -- "$1" "$CONSOLE" 2>/dev/null; }
fatal_line() { grep -a -m1 'OTAFLASH-VM: FATAL' "$CONSOLE" | tr -d '\r' | sed 's/^.*OTAFLASH-VM: FATAL //'; }

# Phase 1: wait until bluetoothd is ready.
boot_deadline=$((SECONDS + BOOT_TIMEOUT))
while :; do
	if console_has 'OTAFLASH-VM: READY'; then break; fi
	if console_has 'OTAFLASH-VM: FATAL'; then
		wait "$QEMU_PID" 2>/dev/null || true
		QEMU_PID=
		harness_fail "VM setup failed: $(fatal_line)" show-console
	fi
	if ! kill -0 "$QEMU_PID" 2>/dev/null; then
		qrc=0
		wait "$QEMU_PID" || qrc=$?
		QEMU_PID=
		[ ! -s "$RESULTS/logs/qemu.log" ] || { echo "----- qemu stderr -----" >&2; tail -n 20 "$RESULTS/logs/qemu.log" >&2; }
		harness_fail "qemu exited (status $qrc) before bluetoothd was ready" show-console
	fi
	if ((SECONDS >= boot_deadline)); then
		harness_fail "VM did not reach a ready bluetoothd within ${BOOT_TIMEOUT}s (--boot-timeout)" show-console
	fi
	sleep 0.2
done
BOOT_S=$(elapsed "$T_BOOT")
ready_line=$(grep -a -m1 'OTAFLASH-VM: READY' "$CONSOLE" | tr -d '\r')
READY_UPTIME=$(sed -n 's/.*uptime=\([0-9.]*\).*/\1/p' <<<"$ready_line")
[ -n "$READY_UPTIME" ] || READY_UPTIME=null
READY_ADAPTERS=$(sed -n 's/.* adapters=\(.*\) central=.*/\1/p' <<<"$ready_line")
log "VM ready (bluetoothd up, adapters powered) after ${BOOT_S}s: ${ready_line#*READY uptime=* }"

# Phase 2: scenarios. Print each result as soon as the guest records it.
printed=0
report_new() {
	local name res code dur n=0 log_file
	[ -f "$RES_SUMMARY" ] || return 0
	while IFS=$'\t' read -r name res code dur; do
		n=$((n + 1))
		((n > printed)) || continue
		printed=$n
		case $res in
		pass) echo "PASS $name ${dur}s" ;;
		timeout) echo "FAIL $name ${dur}s (timeout after ${SCENARIO_TIMEOUT}s)" ;;
		*) echo "FAIL $name ${dur}s (exit $code)" ;;
		esac
		log_file=$RESULTS/scenarios/$name/output.log
		if [ "$res" != pass ] && [ "$VERBOSE" = 0 ] && [ -f "$log_file" ]; then
			echo "----- last 30 lines of $log_file -----"
			tail -n 30 "$log_file"
			echo "-----"
		fi
	done <"$RES_SUMMARY"
}

run_deadline=$((SECONDS + ${#SCEN_NAMES[@]} * (SCENARIO_TIMEOUT + 15) + 60))
while kill -0 "$QEMU_PID" 2>/dev/null; do
	report_new
	if ((SECONDS >= run_deadline)); then
		harness_fail "VM still running ${#SCEN_NAMES[@]}×(timeout+15)+60 s after it was ready; killed it" show-console
	fi
	sleep 0.2
done
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=
report_new

if [ "$printed" -lt "${#SCEN_NAMES[@]}" ]; then
	if console_has 'OTAFLASH-VM: FATAL'; then
		harness_fail "VM failed during the scenarios: $(fatal_line)" show-console
	fi
	harness_fail "VM stopped after $printed of ${#SCEN_NAMES[@]} scenario(s)" show-console
fi

rc=$EXIT_OK
failed=0
while IFS=$'\t' read -r _ res _ _; do
	[ "$res" = pass ] || failed=$((failed + 1))
done <"$RES_SUMMARY"
[ "$failed" = 0 ] || rc=$EXIT_SCENARIO_FAILED
write_json "$rc"

echo "VM boot to ready bluetoothd: ${BOOT_S}s (guest uptime ${READY_UPTIME}s); host preparation: ${PREP_S}s"
lock_note=
[ "$LOCK_WAIT_S" = 0.0 ] || lock_note=" (including ${LOCK_WAIT_S}s waiting for another run)"
echo "Total wall time: $(elapsed "$T_START")s$lock_note; $((${#SCEN_NAMES[@]} - failed))/${#SCEN_NAMES[@]} passed; results: $RESULTS/results.json"
exit "$rc"
