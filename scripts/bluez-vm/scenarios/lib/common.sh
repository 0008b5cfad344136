# Shared helpers of the ota-*.sh scenarios (sourced, not run). They run inside
# the VM started by scripts/bluez-vm/run.sh.
#
# The binary: $OTAFLASH_BIN when set (run.sh --env OTAFLASH_BIN=...), else the
# newer of $PROJECT_DIR/.build/release/otaflash and .build/debug/otaflash.
# Build it on the host before the run; the guest cannot build.

: "${OTAFLASH_VM:?run this through scripts/bluez-vm/run.sh}"
: "${CENTRAL_HCI:?}" "${PERIPHERAL_HCI:?}" "${PERIPHERAL_ADDR:?}" "${RESULTS_DIR:?}" "${PROJECT_DIR:?}"

T0=$EPOCHREALTIME
step() { awk -v a="$T0" -v b="$EPOCHREALTIME" -v m="$*" 'BEGIN { printf "[%6.2fs] %s\n", b - a, m }'; }
# On failure, say whether the stack itself broke: a kernel oops in the
# Bluetooth code, or bluetoothd gone.
stack_health() {
	local oops
	oops=$(dmesg 2>/dev/null | grep -E -m1 -A1 'kernel BUG|list_del corruption|general protection|BUG: ' || true)
	if [ -n "$oops" ]; then
		step "STACK: kernel oops: $(tr '\n' ' ' <<<"$oops")"
		step "STACK: call trace: $(dmesg | sed -n '/Call Trace:/,/<\/TASK>/p' | grep -E -o '[a-z_0-9]+\+0x[0-9a-f]+/0x[0-9a-f]+ \[bluetooth\]' | head -n 4 | tr '\n' ' ')"
	fi
	pidof bluetoothd >/dev/null 2>&1 || step "STACK: bluetoothd is not running any more"
}
fail() {
	step "FAIL: $*"
	stack_health
	exit 1
}

pick_otaflash() {
	if [ -n "${OTAFLASH_BIN:-}" ]; then
		OTAFLASH=$OTAFLASH_BIN
	else
		local r=$PROJECT_DIR/.build/release/otaflash d=$PROJECT_DIR/.build/debug/otaflash
		if [ -x "$r" ] && { [ ! -x "$d" ] || [ "$r" -nt "$d" ]; }; then OTAFLASH=$r; else OTAFLASH=$d; fi
	fi
	[ -x "$OTAFLASH" ] || fail "$OTAFLASH is missing: run 'swift build' on the host first"
}
pick_otaflash

IMAGE=$PROJECT_DIR/firmware-samples/seeded-256k.bin
IMAGE_SIZE=$(stat -c %s "$IMAGE")

# Every background process a scenario starts is recorded here and killed on exit;
# every device object it made bluetoothd create is removed again.
BG=()
CLEANUP_DEVICES=()
common_cleanup() {
	local pid pair
	for pid in "${BG[@]}"; do
		kill -0 "$pid" 2>/dev/null || continue
		kill -INT "$pid" 2>/dev/null || true
	done
	for pid in "${BG[@]}"; do
		timeout 5 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
	done
	for pair in "${CLEANUP_DEVICES[@]}"; do
		remove_device "${pair%% *}" "${pair#* }"
	done
}
trap common_cleanup EXIT

# remove_device HCI ADDR: forget a device on the adapter (also disconnects it).
remove_device() {
	timeout 10 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" \
		org.bluez.Adapter1.RemoveDevice "objpath:/org/bluez/$1/dev_${2//:/_}" >/dev/null 2>&1 || true
}

# wait_for_line FILE PATTERN SECONDS: until FILE has a line matching PATTERN (grep -E).
wait_for_line() {
	local file=$1 pattern=$2 deadline=$((SECONDS + $3))
	until grep -Eq -- "$pattern" "$file" 2>/dev/null; do
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
}

# json_get FILE-or-LINE FIELD: a field of one JSON object (jq).
jfield() { jq -r --arg k "$2" '.[$k] // empty' <<<"$1"; }

# Runs a command with every stdout line prefixed by the host's time (seconds,
# tab) into FILE; returns the command's status. stderr goes to FILE.stderr.
#   stamped FILE TIMEOUT COMMAND...
stamped() {
	local out=$1 secs=$2
	shift 2
	local rc
	set +e
	timeout -k 5 "$secs" "$@" 2>"$out.stderr" |
		while IFS= read -r line; do printf '%s\t%s\n' "$EPOCHREALTIME" "$line"; done >"$out"
	rc=${PIPESTATUS[0]}
	set -e
	cut -f2- "$out" >"${out%.stamped}.jsonl"
	return "$rc"
}

# start_sim TAG ADAPTER STORE [extra args...]: serves the OTA target on ADAPTER
# (extra args: --verbose, fault options);
# sets SIM_PID and SIM_OUT (TAG.jsonl); fails unless it reports serving in
# $SIM_START_TIMEOUT seconds (30 by default).
start_sim() {
	local tag=$1 adapter=$2 store=$3
	shift 3
	rm -rf "$store"
	mkdir -p "$store"
	SIM_OUT=$RESULTS_DIR/$tag.jsonl
	: >"$SIM_OUT"
	"$OTAFLASH" simulate --adapter "$adapter" --name "otaflash-$tag" --store "$store" --json "$@" \
		>"$SIM_OUT" 2>"$RESULTS_DIR/$tag.stderr" &
	SIM_PID=$!
	BG+=("$SIM_PID")
	if ! wait_for_line "$SIM_OUT" '"event":"serving"' "${SIM_START_TIMEOUT:-30}"; then
		kill -0 "$SIM_PID" 2>/dev/null || { wait "$SIM_PID" || step "otaflash simulate exited with $?"; }
		tail -n 5 "$RESULTS_DIR/$tag.stderr" "$SIM_OUT" || true
		fail "otaflash simulate on $adapter did not report serving within ${SIM_START_TIMEOUT:-30} s"
	fi
	step "$tag on $adapter: $(grep -m1 '"event":"serving"' "$SIM_OUT")"
}

# links_down OUT WHAT: waits up to 10 s until the simulate writing OUT has reported as many
# disconnections as connections; after that, a note ending in WHAT. Removing a device object
# while its link is still going down has crashed bluetoothd 5.66 in the guest (segfault in
# libglib; bluez/bluez#1781 reports the same after a session ends).
links_down() {
	local out=$1 what=$2 deadline=$((SECONDS + 10)) c d
	while :; do
		c=$(grep -c '"event":"connected"' "$out" || true)
		d=$(grep -c '"event":"disconnected"' "$out" || true)
		((d >= c)) && return 0
		((SECONDS < deadline)) || { step "note: $((c - d)) link(s) still up 10 s after the flash; $what"; return 0; }
		sleep 0.2
	done
}

# disconnect_at OUT BYTES PID [SECONDS]: once the last progress event in OUT (the peripheral's:
# bytes received; or the flash's own output: bytes sent) reports BYTES (SECONDS at most, 120 by
# default, or until PID, the flash, ends), drops the link from the central's controller
# (`btmgmt disconnect`) and says so. Sets DISCONNECT_GOT (the bytes reported then).
disconnect_at() {
	local out=$1 at=$2 pid=$3 secs=${4:-120} deadline reply
	deadline=$((SECONDS + secs))
	reported() { grep '"event":"progress"' "$out" 2>/dev/null | tail -n 1 | sed -n 's/.*"bytes":\([0-9]*\).*/\1/p'; }
	until [ "$(reported)" -ge "$at" ] 2>/dev/null; do
		kill -0 "$pid" 2>/dev/null || break
		((SECONDS < deadline)) || fail "$(basename "$out") reported no progress to $at bytes within $secs s"
		sleep 0.05
	done
	DISCONNECT_GOT=$(reported)
	reply=$(timeout 10 btmgmt --index "$CENTRAL_INDEX" disconnect -t 1 "$PERIPHERAL_ADDR" 2>&1) || true
	step "outside disconnect at ${DISCONNECT_GOT:-?} bytes ($(basename "$out")): btmgmt --index $CENTRAL_INDEX disconnect -t 1 $PERIPHERAL_ADDR: $(tr '\n' ' ' <<<"$reply")"
}

# stop_sim PID [SIM_OUT]: SIGINT, then waits (15 s) for it to unregister and exit;
# its status. With SIM_OUT, first waits (10 s) until every link it reported
# connected is reported disconnected: unregistering while bluetoothd is still
# tearing a link down is where bluetoothd 5.66 was seen to segfault here.
stop_sim() {
	local pid=$1 out=${2:-} rc=0
	[ -z "$out" ] || links_down "$out" "stopping simulate anyway"
	kill -INT "$pid" 2>/dev/null || return 0
	timeout 15 tail --pid="$pid" -f /dev/null || { step "otaflash simulate still running 15 s after SIGINT; killing it"; kill -KILL "$pid"; }
	wait "$pid" || rc=$?
	return "$rc"
}

# scan_for ADAPTER ADDR: `otaflash scan --ota-only` must list ADDR; two attempts
# (btvirt's advertising reports can be lost when a scan starts). Sets SCAN_LINE.
scan_for() {
	local adapter=$1 addr=$2 attempt out
	SCAN_LINE=
	for attempt in 1 2 3; do
		out=$(timeout 60 "$OTAFLASH" scan --adapter "$adapter" --ota-only --json --timeout 6 2>>"$RESULTS_DIR/scan.stderr") ||
			fail "otaflash scan on $adapter failed ($?): $(tail -n 1 "$RESULTS_DIR/scan.stderr")"
		printf '%s\n' "$out" >>"$RESULTS_DIR/scan.jsonl"
		SCAN_LINE=$(grep '"event":"device"' <<<"$out" | grep -i "\"address\":\"$addr\"" || true)
		[ -z "$SCAN_LINE" ] || return 0
		step "scan attempt $attempt on $adapter did not list $addr"
	done
	return 1
}

# The figures of one flash run, from its stamped JSON Lines file:
# MTU, chunk, seconds, bytes_sent, packets, transfer seconds (transfer event ->
# verify event, host clock), writes/s, kB/s. Sets F_* and prints one line.
flash_figures() {
	local stamped=$1 label=$2
	local connected done_line t_transfer t_verify
	connected=$(grep -m1 '"event":"connected"' "$stamped" | cut -f2-)
	done_line=$(grep '"event":"done"' "$stamped" | tail -n 1 | cut -f2-)
	t_transfer=$(grep -m1 '"event":"transfer"' "$stamped" | cut -f1)
	t_verify=$(grep '"event":"verify"' "$stamped" | tail -n 1 | cut -f1)
	F_MTU=$(jfield "$connected" mtu)
	F_CHUNK=$(jfield "$connected" chunk)
	F_SECONDS=$(jfield "$done_line" seconds)
	F_BYTES_SENT=$(jfield "$done_line" bytes_sent)
	F_PACKETS=$(((F_BYTES_SENT + F_CHUNK - 1) / F_CHUNK))
	F_TRANSFER=$(awk -v a="$t_transfer" -v b="$t_verify" 'BEGIN { printf "%.3f", b - a }')
	F_WPS=$(awk -v p="$F_PACKETS" -v t="$F_TRANSFER" 'BEGIN { printf "%.1f", (t > 0 ? p / t : 0) }')
	F_KBPS=$(awk -v b="$IMAGE_SIZE" -v t="$F_TRANSFER" 'BEGIN { printf "%.1f", (t > 0 ? b / t / 1000 : 0) }')
	step "$label: MTU $F_MTU, chunk $F_CHUNK B, ${F_SECONDS} s in all, transfer ${F_TRANSFER} s, bytes_sent $F_BYTES_SENT (~$F_PACKETS packets), $F_WPS writes/s, $F_KBPS kB/s"
}

# The stored image (simulate's activated event) must equal FILE.
check_stored() {
	local sim_out=$1 file=$2 activated stored
	wait_for_line "$sim_out" '"event":"activated"' 15 || fail "otaflash simulate reported no activation ($sim_out)"
	activated=$(grep '"event":"activated"' "$sim_out" | tail -n 1)
	stored=$(jfield "$activated" stored)
	[ -n "$stored" ] && [ -f "$stored" ] || fail "no stored image ($activated)"
	cmp "$stored" "$file" || fail "the stored image $stored differs from $file"
	step "stored $(basename "$stored") is byte-identical to $(basename "$file") ($(stat -c %s "$stored") bytes)"
}

# What `otaflash simulate --verbose` logged about arrival order (its stderr):
# data writes, those that arrived ahead of a hole, duplicates, and the replies
# to CHECKPOINT by status (0 success, 5 gap, 6 CRC mismatch).
sim_order_report() {
	awk '
		/data write offset/ {
			for (i = 1; i <= NF; i++) {
				if ($i == "offset") { o = $(i + 1) + 0; n = substr($(i + 2), 2) + 0 }
				if ($i == "received") r = $(i + 1) + 0
			}
			writes++
			if (o > prev) ahead++
			else if (o + n <= prev) dup++
			prev = r
		}
		/control point write 9 B/ && /response: \[128, 2,/ {
			s = $0; sub(/.*response: \[128, 2, /, "", s); sub(/,.*/, "", s)
			cp[s]++; cps++
		}
		END {
			printf "data writes %d, arrived ahead of a hole %d, duplicates %d; CHECKPOINT replies %d:", writes, ahead, dup, cps
			for (k in cp) printf " status %s x%d", k, cp[k]
			printf "\n"
		}' "$1"
}

# no_bond LABEL: `bluetoothctl devices Bonded` on the central ($CENTRAL_ADDR, bluetoothctl's
# default controller) lists nothing. bluetoothctl lists nothing either when bluetoothd does not
# answer: that is a failure, not "no bond".
no_bond() {
	local out rc=0 left
	out=$(timeout 10 bluetoothctl list 2>&1) || rc=$?
	[ "$rc" -eq 0 ] || fail "$1: bluetoothctl did not answer within 10 s (exit $rc; bluetoothd hung?)"
	grep -q "$CENTRAL_ADDR.*\[default\]" <<<"$out" || fail "$1: the central $CENTRAL_ADDR is not bluetoothctl's default controller: $out"
	out=$(timeout 10 bluetoothctl devices Bonded 2>&1) || rc=$?
	[ "$rc" -eq 0 ] || fail "$1: bluetoothctl devices Bonded did not answer within 10 s (exit $rc)"
	left=$(sed 's/\x1b\[[0-9;]*[a-zA-Z]//g' <<<"$out" | grep -o '^Device [0-9A-F:]\{17\}' | cut -d' ' -f2 || true)
	[ -z "$left" ] || fail "$1: the central still has bonds: $left"
	step "$1: bluetoothctl devices Bonded on the central: (none)"
}

# central_without_agent: the central's controller announces no input and no output, as
# bluetoothd without an agent of its own makes it (a factory central). One bluetoothd serves both
# sides here, and it sets every adapter's IO capability from its default agent, simulate's
# (src/agent.c, set_io_cap): the central's stack would then pair with passkey entry and ask that
# one agent for both sides at once, which it answers one at a time. Call it after start_sim.
central_without_agent() {
	local out
	out=$(timeout 10 btmgmt --index "${CENTRAL_INDEX:?}" io-cap 3 2>&1) || fail "btmgmt io-cap 3 on the central failed: $out"
}

# restart_for IMAGE: --restart for a protocol that takes it; a Secure DFU package's bootloader says
# itself where a transfer resumes, and otaflash refuses the option there.
restart_for() {
	case "$1" in *.zip) ;; *) echo --restart ;; esac
}

# unpaired_refusal LABEL IMAGE [ARGS...]: a flash of IMAGE without --pair against the
# simulate serving now (with --security) must end with exit 12 within 10 s, one error line
# naming --pair (and --passkey with $WANT_PASSKEY set), nothing activated and no bond left on
# the central: whatever bluetoothd's stack did by itself, otaflash undoes. Sets UNPAIRED_SECS.
unpaired_refusal() {
	local label=$1 image=$2 f=$RESULTS_DIR/flash-unpaired-$1.stamped rc=0 t0=$EPOCHREALTIME line wall
	shift 2
	stamped "$f" 60 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$image" --json $(restart_for "$image") "$@" || rc=$?
	wall=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	# otaflash's own count (the done event's seconds): the process's start under TCG is not the device's doing.
	UNPAIRED_SECS=$(jfield "$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)" seconds)
	line=$(grep 'otaflash: error' "$f.stderr" | tail -n 1 || true)
	step "$label without --pair: exit $rc in $UNPAIRED_SECS s ($wall s wall, process start included): $line"
	grep -h 'note' "$f" | cut -f2- | while IFS= read -r l; do step "  $l"; done
	[ "$rc" -eq 12 ] || fail "$label without --pair exited $rc, expected 12 (permission): $(tail -n 3 "$f.stderr")"
	awk -v s="${UNPAIRED_SECS:-99}" 'BEGIN { exit !(s < 10) }' || fail "$label without --pair took ${UNPAIRED_SECS:-?} s, expected < 10 s"
	[ "$(grep -c 'otaflash: error' "$f.stderr")" -eq 1 ] || fail "$label: not one error line: $(cat "$f.stderr")"
	grep -q -- '--pair' <<<"$line" || fail "$label: the line does not name --pair: $line"
	[ -z "${WANT_PASSKEY:-}" ] || grep -q -- '--passkey' <<<"$line" || fail "$label: the line does not name --passkey: $line"
	grep -q '"exit_code":12' "$f" || fail "$label: the done event does not carry exit code 12"
	! grep -q '"event":"activated"' "$SIM_OUT" || fail "$label: the device activated an image written over an unpaired link"
	no_bond "after $label without --pair"
	links_down "$SIM_OUT" "removing the device anyway"
	remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"
	step "FIGURES unpaired $label: exit 12 in $UNPAIRED_SECS s ($wall s wall)"
}

# paired_flash LABEL IMAGE NOTE [ARGS...]: --pair --unpair-after ARGS flashes IMAGE (done/ok, a
# note matching NOTE, the image stored identical) and leaves no bond.
paired_flash() {
	local label=$1 image=$2 note=$3 f=$RESULTS_DIR/flash-paired-$1.stamped rc=0 done_line
	shift 3
	stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$image" --json $(restart_for "$image") \
		--reply-timeout 30 --pair --unpair-after "$@" || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
	[ "$rc" -eq 0 ] || fail "$label --pair --unpair-after exited $rc: $(tail -n 3 "$f.stderr") $done_line"
	grep -q -- "$note" "$f" "$f.stderr" || fail "$label: no '$note' note: $(grep note "$f" | tail -n 5)"
	grep -q 'bond removed' "$f" "$f.stderr" || fail "$label: no 'bond removed' note"
	step "$label paired: $done_line"
	no_bond "after $label --unpair-after"
	links_down "$SIM_OUT" "removing the device anyway"
	remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"
}

# other_protocols SECURITY NOTE [PAIR-ARGS...]: for nordic-dfu and smp in turn, a fresh simulate
# --security SECURITY: unpaired_refusal, then paired_flash with PAIR-ARGS (its note matching NOTE).
other_protocols() {
	local security=$1 note=$2 p image sim
	shift 2
	local nordic=$PROJECT_DIR/firmware-samples/nordic
	for p in nordic-dfu smp; do
		remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"  # BlueZ caches the last table at this address
		remove_device "$PERIPHERAL_HCI" "$CENTRAL_ADDR"  # a key the peripheral kept would have it ask for encryption
		if [ "$p" = nordic-dfu ]; then
			image=$nordic/blinky-app.zip
			start_sim "sim-$p" "$PERIPHERAL_HCI" "$RESULTS_DIR/store-$p" --protocol nordic-dfu \
				--public-key "$nordic/test-key-public.pem" --security "$security" ${SIM_PASSKEY:+--passkey "$SIM_PASSKEY"}
		else
			image=$PROJECT_DIR/firmware-samples/mcuboot/blinky-ec256-v1.2.3+4.bin
			start_sim "sim-$p" "$PERIPHERAL_HCI" "$RESULTS_DIR/store-$p" --protocol smp \
				--security "$security" ${SIM_PASSKEY:+--passkey "$SIM_PASSKEY"}
		fi
		sim=$SIM_PID
		central_without_agent
		unpaired_refusal "$p" "$image"
		paired_flash "$p" "$image" "$note" "$@"
		wait_for_line "$SIM_OUT" '"event":"activated"' 15 || fail "$p: no activation after the paired flash"
		stop_sim "$sim" "$SIM_OUT" || fail "otaflash simulate --protocol $p exited with $? after SIGINT"
	done
}
