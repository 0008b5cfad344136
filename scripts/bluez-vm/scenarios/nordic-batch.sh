#!/bin/bash
# A batch of Secure DFU bootloaders through the real stack: two `otaflash simulate --protocol
# nordic-dfu` on two peripheral controllers, flashed with blinky-app.zip in one
# `otaflash --device A --device B --report` run through one central adapter (one at a time: two
# links on one btvirt central crash the guest kernel, see ota-batch.sh).
# The batch must end with a summary of 2 ok, a report row per device, and both stored images
# byte-identical to the package's application. Run it with run.sh --controllers 3 or more and
# --gatt-channels 1 (one ATT bearer, as an nRF5 SDK bootloader has).
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

NORDIC=$PROJECT_DIR/firmware-samples/nordic
ZIP=$NORDIC/blinky-app.zip
n=${ADAPTER_COUNT:-0}
((n >= 3)) || fail "needs 3 usable controllers (one central, two bootloaders), this VM has $n: ${BLUEZ_ADAPTERS:-?}"
C1=$ADAPTER0_HCI P1=$ADAPTER1_HCI P2=$ADAPTER2_HCI
A1=$ADAPTER1_ADDR A2=$ADAPTER2_ADDR
CLEANUP_DEVICES+=("$C1 $A1" "$C1 $A2")
step "otaflash: $OTAFLASH; central $C1; bootloaders $P1 $A1, $P2 $A2"

for s in A B; do
	p=$P1
	[ "$s" = A ] || p=$P2
	start_sim "boot$s" "$p" "$RESULTS_DIR/store$s" --protocol nordic-dfu --public-key "$NORDIC/test-key-public.pem"
	eval "SIM$s=\$SIM_PID OUT$s=\$SIM_OUT"
done

# Both bootloaders listed by one `scan --ota-only` first, as ota-batch.sh does.
for attempt in 1 2 3; do
	out=$(timeout 60 "$OTAFLASH" scan --adapter "$C1" --ota-only --json --timeout 6 2>>"$RESULTS_DIR/scan.stderr") ||
		fail "otaflash scan on $C1 failed: $(tail -n 1 "$RESULTS_DIR/scan.stderr")"
	missing=
	for a in "$A1" "$A2"; do grep -qi "\"address\":\"$a\".*\"protocol\":\"nordic-dfu\"" <<<"$out" || missing+=" $a"; done
	[ -n "$missing" ] || break
	step "scan attempt $attempt did not list$missing as nordic-dfu"
	[ "$attempt" -lt 3 ] || fail "otaflash scan --ota-only did not list$missing as nordic-dfu in 3 scans"
done
step "scan lists both bootloaders as nordic-dfu"

f=$RESULTS_DIR/batch.stamped
report=$RESULTS_DIR/report.csv
rc=0
stamped "$f" 300 "$OTAFLASH" --adapter "$C1" --device "$A1" --device "$A2" --parallel 1 --report "$report" --json "$ZIP" || rc=$?
summary=$(grep '"event":"summary"' "$f" | tail -n 1 | cut -f2-)
grep '"event":"done"' "$f" | cut -f2- | while IFS= read -r l; do step "batch: $l"; done
step "batch: ${summary:-no summary line} (exit $rc)"
[ "$rc" -eq 0 ] || { tail -n 3 "$f.stderr" || true; fail "the batch exited with $rc"; }
[ "$(jfield "$summary" devices)" = 2 ] && [ "$(jfield "$summary" ok)" = 2 ] || fail "the summary is not 2 of 2 ok: $summary"
grep -q '"protocol":"nordic-dfu"' <(grep -m1 '"event":"start"' "$f") || fail "the start event does not say nordic-dfu"
for a in "$A1" "$A2"; do
	# docs/EVENTS.md, "The report": device is the 4th column, result the 8th.
	awk -F, -v a="$a" 'NR > 1 && toupper($4) == toupper(a) && $8 == "ok" { found = 1 } END { exit !found }' "$report" \
		|| fail "the report has no ok row for $a: $(cat "$report")"
done
step "report: $(tr '\n' '|' <"$report")"

bin=$RESULTS_DIR/blinky-cortex-m4.bin
python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("blinky-cortex-m4.bin"))' "$ZIP" "$bin"
crc=$(python3 -c 'import sys, zlib; print("%08x" % zlib.crc32(open(sys.argv[1], "rb").read()))' "$bin")
for s in A B; do
	store=$RESULTS_DIR/store$s
	local_deadline=$((SECONDS + 15))
	until [ -f "$store/$crc.bin" ]; do
		((SECONDS < local_deadline)) || fail "bootloader $s stored no $crc.bin (store: $(ls "$store" | tr '\n' ' '))"
		sleep 0.2
	done
	cmp "$store/$crc.bin" "$bin" || fail "bootloader $s stored an image that differs from the package's"
	step "bootloader $s: stored $crc.bin is byte-identical to the package's application"
done
stop_sim "$SIMA" "$OUTA" || fail "otaflash simulate A exited with $? after SIGINT"
stop_sim "$SIMB" "$OUTB" || fail "otaflash simulate B exited with $? after SIGINT"
step "FIGURES nordic batch: 2 ok in $(jfield "$summary" seconds) s"
step "PASS"
