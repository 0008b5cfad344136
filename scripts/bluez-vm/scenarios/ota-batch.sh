#!/bin/bash
# Batch flashing on the real stack: two OTA targets (`otaflash simulate` on two
# peripheral controllers), flashed in one `otaflash --device A --device B` run
#   1. through one central adapter, then
#   2. across two central adapters (--adapter hciX,hciY).
# Each batch must end with a summary of 2 ok and both stored images
# byte-identical to the file.
#
# Needs four usable controllers: run.sh --controllers 4 (ADAPTER0 and ADAPTER3
# are the centrals, ADAPTER1 and ADAPTER2 the peripherals). With three, batch 1
# runs and the scenario then fails saying why batch 2 could not; with two it
# fails at once.
# Data go through --write-path write-value by default ($BATCH_WRITE_PATH to
# change); see ota-resume.sh for why.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

WRITE_PATH=${BATCH_WRITE_PATH:-write-value}
# One central adapter flashes the two targets one after the other: two
# simultaneous links on one btvirt central made the guest kernel (Debian
# 6.1.0-56) oops in hci_chan_del ("list_del corruption", from bluetoothd's
# l2cap_sock_release) as soon as one of them dropped, taking bluetoothd down.
# Across two central adapters the batch runs both at once.
PARALLEL_ONE=${BATCH1_PARALLEL:-1}
PARALLEL_TWO=${BATCH2_PARALLEL:-2}
n=${ADAPTER_COUNT:-0}
need_msg() {
	if [ "${CONTROLLERS_WANTED:-2}" -lt "$1" ]; then
		echo "needs $1 usable controllers ($2), but this VM has $n: ${BLUEZ_ADAPTERS:-?}; the harness was asked for ${CONTROLLERS_WANTED:-2} (run it with --controllers 4)"
	else
		echo "needs $1 usable controllers ($2), but only $n of the ${CONTROLLERS_WANTED} asked for came up: ${BLUEZ_ADAPTERS:-?} (the hci_vhci race ate the others; see the btvirt lines in logs/console.log)"
	fi
}
((n >= 3)) || fail "batch 1 $(need_msg 3 "one central, two peripherals")"

C1=$ADAPTER0_HCI P1=$ADAPTER1_HCI P2=$ADAPTER2_HCI
A1=$ADAPTER1_ADDR A2=$ADAPTER2_ADDR
C2=
((n < 4)) || C2=$ADAPTER3_HCI
CLEANUP_DEVICES+=("$C1 $A1" "$C1 $A2")
[ -z "$C2" ] || CLEANUP_DEVICES+=("$C2 $A1" "$C2 $A2")
step "otaflash: $OTAFLASH; centrals $C1 ${C2:-(no second)}; peripherals $P1 $A1, $P2 $A2; --write-path $WRITE_PATH"

start_sim simA "$P1" "$RESULTS_DIR/storeA"
SIMA=$SIM_PID OUTA=$SIM_OUT
start_sim simB "$P2" "$RESULTS_DIR/storeB"
SIMB=$SIM_PID OUTB=$SIM_OUT

# scan_both CENTRAL: one `otaflash scan --ota-only` must list both targets (3 attempts).
scan_both() {
	local c=$1 attempt out missing a
	for attempt in 1 2 3; do
		out=$(timeout 60 "$OTAFLASH" scan --adapter "$c" --ota-only --json --timeout 6 2>>"$RESULTS_DIR/scan.stderr") ||
			fail "otaflash scan on $c failed: $(tail -n 1 "$RESULTS_DIR/scan.stderr")"
		printf '%s\n' "$out" >>"$RESULTS_DIR/scan-$c.jsonl"
		missing=
		for a in "$A1" "$A2"; do grep -qi "\"address\":\"$a\"" <<<"$out" || missing+=" $a"; done
		if [ -z "$missing" ]; then
			step "scan on $c lists both targets"
			return 0
		fi
		step "scan attempt $attempt on $c did not list$missing"
	done
	fail "otaflash scan --ota-only on $c did not list$missing in 3 scans"
}

# batch LABEL VERSION ADAPTERS PARALLEL: one batch run over both targets; 2 ok, both stored images identical.
declare -A BATCH_SECS
batch() {
	local label=$1 version=$2 adapters=$3 parallel=$4 f=$RESULTS_DIR/$1.stamped rc=0 summary
	stamped "$f" 300 "$OTAFLASH" --adapter "$adapters" --device "$A1" --device "$A2" "$IMAGE" --json \
		--write-path "$WRITE_PATH" --restart --image-version "$version" --parallel "$parallel" || rc=$?
	summary=$(grep '"event":"summary"' "$f" | tail -n 1 | cut -f2-)
	grep '"event":"done"' "$f" | cut -f2- | while IFS= read -r l; do step "$label: $l"; done
	step "$label: ${summary:-no summary line} (exit $rc)"
	[ "$rc" -eq 0 ] || { tail -n 3 "$f.stderr" || true; fail "$label exited with $rc"; }
	[ "$(jfield "$summary" devices)" = 2 ] && [ "$(jfield "$summary" ok)" = 2 ] || fail "$label: the summary is not 2 of 2 ok: $summary"
	local out
	for out in "$OUTA" "$OUTB"; do
		wait_for_line "$out" "\"event\":\"activated\".*\"firmware_version\":\"$version\"" 15 ||
			fail "$label: $(basename "$out" .jsonl) did not activate $version"
		check_stored "$out" "$IMAGE"
	done
	BATCH_SECS[$label]=$(jfield "$summary" seconds)
	local used
	used=$(grep '"event":"done"' "$f" | cut -f2- | jq -r '.adapter // "?"' | sort | tr '\n' ' ')
	step "FIGURES $label: 2 ok in ${BATCH_SECS[$label]} s (--parallel $parallel), adapters used: $used"
}

if [ "${BATCH_SKIP_ONE:-0}" != 1 ]; then
	scan_both "$C1"
	batch batch-one-central 1.1.0 "$C1" "$PARALLEL_ONE"
fi

if [ -z "$C2" ]; then
	fail "batch 2 (two central adapters) $(need_msg 4 "two centrals, two peripherals")"
fi
scan_both "$C1"
scan_both "$C2"
batch batch-two-centrals 1.2.0 "$C1,$C2" "$PARALLEL_TWO"
f2=$RESULTS_DIR/batch-two-centrals.jsonl
adapters_used=$(grep '"event":"done"' "$f2" | jq -r '.adapter // empty' | sort -u | wc -l)
((adapters_used == 2)) || step "NOTE: both devices went through one adapter in batch 2 ($(grep '"event":"done"' "$f2" | jq -rc '[.device, .adapter]' | tr '\n' ' '))"

stop_sim "$SIMA" "$OUTA" || fail "otaflash simulate A exited with $? after SIGINT"
stop_sim "$SIMB" "$OUTB" || fail "otaflash simulate B exited with $? after SIGINT"
jq -n --argjson a "${BATCH_SECS[batch-one-central]:-null}" --argjson b "${BATCH_SECS[batch-two-centrals]}" --argjson used "$adapters_used" \
	--arg wp "$WRITE_PATH" '{write_path: $wp, one_central: (if $a == null then null else {ok: 2, seconds: $a} end), two_centrals: {ok: 2, seconds: $b, adapters_used: $used}}' \
	>"$RESULTS_DIR/figures.json"
step "PASS"
