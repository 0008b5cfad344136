#!/bin/bash
# Benchmark on the real stack: the same 256 KiB image, the same peripheral, the
# same MTU, pushed (a) by otaflash --write-path write-value, (b) by otaflash
# --write-path acquire-write, (c) by a plain bleak script
# (scripts/bluez-vm/bench/bleak_flash.py: write-without-response data packets,
# a CHECKPOINT with response every 16 KiB, VERIFY, ACTIVATE). Each run must
# store an image byte-identical to the file.
# Prints seconds, kB/s (goodput: image bytes over the transfer) and writes/s
# (resends included) for each, and the ratios otaflash(acquire-write)/bleak and
# otaflash(write-value)/bleak, on goodput and on writes/s;
# writes everything to $RESULTS_DIR/bench.json.
#
# bleak runs from a venv made from /usr/bin/python3 on the host
# ($BLEAK_VENV, default scripts/bluez-vm/work/bleak-venv; scripts/bench makes it).
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

VENV=${BLEAK_VENV:-$PROJECT_DIR/scripts/bluez-vm/work/bleak-venv}
BLEAK_SCRIPT=$PROJECT_DIR/scripts/bluez-vm/bench/bleak_flash.py
FLASH_TIMEOUT=${BENCH_FLASH_TIMEOUT:-240}
STORE=$RESULTS_DIR/store
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

[ -x "$VENV/bin/python" ] || fail "no bleak venv at $VENV: run scripts/bench (or: /usr/bin/python3 -m venv $VENV && $VENV/bin/pip install bleak) on the host first"
bleak_version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("bleak"))' 2>&1) ||
	fail "the venv's python cannot import bleak in the guest: $bleak_version"
step "bleak $bleak_version from $VENV"

start_sim sim "$PERIPHERAL_HCI" "$STORE"
SIM=$SIM_PID SIMOUT=$SIM_OUT
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"

RESULTS=()
# record LABEL JSON: one entry of bench.json.
record() { RESULTS+=("$(jq -c --arg l "$1" '. + {label: $l}' <<<"$2")"); }

activations() { grep -c '"event":"activated"' "$SIMOUT" || true; }

otaflash_run() {
	local path=$1 version=$2 f=$RESULTS_DIR/otaflash-$1.stamped rc=0 done_line before
	before=$(activations)
	stamped "$f" "$FLASH_TIMEOUT" "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$IMAGE" --json \
		--write-path "$path" --restart --image-version "$version" || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
	if [ "$rc" -ne 0 ] || ! grep -q '"result":"ok"' <<<"$done_line"; then
		tail -n 3 "$f.stderr" || true
		fail "otaflash --write-path $path exited with $rc: ${done_line:-no done event}"
	fi
	wait_for_line "$SIMOUT" "\"event\":\"activated\".*\"firmware_version\":\"$version\"" 15 || fail "no activation of $version"
	[ "$(activations)" -gt "$before" ] || fail "no new activation"
	check_stored "$SIMOUT" "$IMAGE"
	flash_figures "$f" "otaflash $path"
	record "otaflash-$path" "$(jq -nc --arg p "$path" --argjson mtu "$F_MTU" --argjson chunk "$F_CHUNK" \
		--argjson s "$F_SECONDS" --argjson t "$F_TRANSFER" --argjson pk "$F_PACKETS" --argjson w "$F_WPS" \
		--argjson k "$F_KBPS" --argjson sent "$F_BYTES_SENT" \
		'{tool: "otaflash", write_path: $p, mtu: $mtu, chunk: $chunk, seconds: $s, transfer_seconds: $t,
		  packets: $pk, bytes_sent: $sent, writes_per_s: $w, kB_per_s: $k}')"
}

v=1
for path in ${BENCH_PATHS:-write-value acquire-write}; do
	otaflash_run "$path" "2.0.$v"
	v=$((v + 1))
done

# (c) bleak: a fresh device object, as a script run on its own would find it.
remove_device "$CENTRAL_HCI" "$PERIPHERAL_ADDR"
before=$(activations)
rc=0
timeout -k 5 "$FLASH_TIMEOUT" "$VENV/bin/python" "$BLEAK_SCRIPT" --adapter "$CENTRAL_HCI" --address "$PERIPHERAL_ADDR" \
	--image "$IMAGE" --image-version 2.0.9 --json-out "$RESULTS_DIR/bleak.json" \
	>"$RESULTS_DIR/bleak.stdout" 2>"$RESULTS_DIR/bleak.stderr" || rc=$?
bleak_json=$(tail -n 1 "$RESULTS_DIR/bleak.stdout" || true)
step "bleak: $bleak_json"
if [ "$rc" -ne 0 ]; then
	tail -n 15 "$RESULTS_DIR/bleak.stderr" || true
	fail "bleak_flash.py exited with $rc"
fi
wait_for_line "$SIMOUT" '"event":"activated".*"firmware_version":"2.0.9"' 15 || fail "bleak's image (2.0.9) was not activated"
check_stored "$SIMOUT" "$IMAGE"
record bleak "$(jq -c '{tool, bleak_version, connect, bleak_connect_error, mtu, chunk, seconds, transfer_seconds,
	packets, bytes_sent, writes_per_s, kB_per_s, checkpoints, recoveries, services}' <<<"$bleak_json")"

stop_sim "$SIM" "$SIMOUT" || fail "otaflash simulate exited with $? after SIGINT"

printf '%s\n' "${RESULTS[@]}" | jq -s '
	(map({key: .label, value: .}) | from_entries) as $r
	| {image_bytes: '"$IMAGE_SIZE"', results: $r,
	   same_mtu: ([$r[] | .mtu] | unique | length == 1),
	   ratio_acquire_write_vs_bleak: (if $r["otaflash-acquire-write"] then ($r["otaflash-acquire-write"].kB_per_s / $r.bleak.kB_per_s * 1000 | round / 1000) else null end),
	   ratio_write_value_vs_bleak: (if $r["otaflash-write-value"] then ($r["otaflash-write-value"].kB_per_s / $r.bleak.kB_per_s * 1000 | round / 1000) else null end),
	   ratio_basis: "goodput: image bytes over the transfer (BEGIN reply to VERIFY), same image, same MTU, same peripheral",
	   writes_ratio_acquire_write_vs_bleak: (if $r["otaflash-acquire-write"] then ($r["otaflash-acquire-write"].writes_per_s / $r.bleak.writes_per_s * 1000 | round / 1000) else null end),
	   writes_ratio_write_value_vs_bleak: (if $r["otaflash-write-value"] then ($r["otaflash-write-value"].writes_per_s / $r.bleak.writes_per_s * 1000 | round / 1000) else null end),
	   writes_basis: "data writes per second over the transfer, resends included (otaflash: bytes_sent / chunk)"}' \
	>"$RESULTS_DIR/bench.json"
step "bench.json: $(jq -c 'del(.results[].services)' "$RESULTS_DIR/bench.json")"
jq -r '.results[] | "FIGURES \(.label): MTU \(.mtu), \(.seconds) s in all, transfer \(.transfer_seconds) s, \(.kB_per_s) kB/s, \(.writes_per_s) writes/s, \(.bytes_sent) bytes sent"' "$RESULTS_DIR/bench.json" |
	while IFS= read -r l; do step "$l"; done
step "FIGURES ratios (goodput, kB/s): acquire-write/bleak $(jq .ratio_acquire_write_vs_bleak "$RESULTS_DIR/bench.json"), write-value/bleak $(jq .ratio_write_value_vs_bleak "$RESULTS_DIR/bench.json")"
step "FIGURES ratios (writes/s, resends included): acquire-write/bleak $(jq .writes_ratio_acquire_write_vs_bleak "$RESULTS_DIR/bench.json"), write-value/bleak $(jq .writes_ratio_write_value_vs_bleak "$RESULTS_DIR/bench.json")"
[ "$(jq .same_mtu "$RESULTS_DIR/bench.json")" = true ] || fail "the three runs did not use the same MTU"
step "PASS"
