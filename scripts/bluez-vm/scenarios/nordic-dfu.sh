#!/bin/bash
# Nordic Secure DFU through the real stack on both sides:
#   1. `otaflash simulate --protocol nordic-dfu` serves a Secure DFU bootloader on the peripheral
#      controller, checking signatures with firmware-samples/nordic's test key.
#   2. `otaflash scan --ota-only` on the central controller lists it as nordic-dfu.
#   3. blinky-app.zip (made by nrfutil) is flashed, the protocol picked from the package: done/ok,
#      and the stored image is byte-identical to the package's .bin.
#   4. blinky-sd-bl-app.zip: SoftDevice+bootloader, then the application, the bootloader resetting
#      in between and otaflash reconnecting; both stored images byte-identical to the package's.
# Prints per package: images, seconds, kB/s. Run it with run.sh --gatt-channels 1 (one ATT bearer,
# as an nRF5 SDK bootloader has): each package is then sent once, nothing twice.
# With LOSE_FINAL_ANSWER=1 (run.sh --env LOSE_FINAL_ANSWER=1) simulate loses the last EXECUTE's
# answer (--sim-lose-final-answer) and blinky-app.zip alone is flashed: the bootloader activates the
# image and resets; given at the bootloader's address, nothing can confirm it, so the run must end
# with not_confirmed (exit 21) within a minute, the image activated once.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

NORDIC=$PROJECT_DIR/firmware-samples/nordic
STORE=$RESULTS_DIR/store
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR"

# ------------------------------------------------------------------ 1. serve
LOSE=()
[ "${LOSE_FINAL_ANSWER:-0}" = 1 ] && LOSE=(--sim-lose-final-answer)
start_sim nordic "$PERIPHERAL_HCI" "$STORE" --verbose --protocol nordic-dfu \
	--public-key "$NORDIC/test-key-public.pem" --sd-after-update 0xB6 "${LOSE[@]}"
SIMOUT=$SIM_OUT
grep -q '"protocol":"nordic-dfu"' "$SIMOUT" || fail "simulate did not report serving nordic-dfu: $(head -n 1 "$SIMOUT")"

# ------------------------------------------------------------------ 2. scan
scan_for "$CENTRAL_HCI" "$PERIPHERAL_ADDR" || fail "otaflash scan --ota-only did not list $PERIPHERAL_ADDR in 3 scans"
grep -q '"protocol":"nordic-dfu"' <<<"$SCAN_LINE" || fail "listed without protocol nordic-dfu: $SCAN_LINE"
step "scan: $SCAN_LINE"

# ------------------------------------------------------------------ 3./4. flash the packages
# package_bins ZIP DIR: extracts the package's firmware files (in the manifest's order) into DIR
# and prints their paths.
package_bins() {
	python3 - "$1" "$2" <<'PY'
import json, os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
manifest = json.loads(z.read("manifest.json"))["manifest"]
order = ["softdevice_bootloader", "softdevice", "bootloader", "application"]
for key in sorted(manifest, key=order.index):
    name = manifest[key]["bin_file"]
    path = os.path.join(sys.argv[2], name)
    with open(path, "wb") as f:
        f.write(z.read(name))
    print(path)
PY
}

activations() { grep -c '"event":"activated"' "$SIMOUT" || true; }

flash_package() {
	local zip=$1 f=$RESULTS_DIR/flash-$(basename "$1" .zip).stamped rc=0 done_line start_line bins before want bin crc
	mkdir -p "$RESULTS_DIR/bins"
	mapfile -t bins < <(package_bins "$zip" "$RESULTS_DIR/bins")
	before=$(activations)
	stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$zip" --json || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
	if [ "$rc" -ne 0 ]; then
		tail -n 3 "$f.stderr" || true
		fail "flashing $(basename "$zip") exited with $rc: ${done_line:-no done event}"
	fi
	grep -q '"result":"ok"' <<<"$done_line" || fail "flashing $(basename "$zip") did not end done/ok: $done_line"
	start_line=$(grep -m1 '"event":"start"' "$f" | cut -f2-)
	grep -q '"protocol":"nordic-dfu"' <<<"$start_line" || fail "the start event does not say nordic-dfu: $start_line"
	# No link was lost: nothing may have been sent twice (with several ATT bearers, packets
	# arriving out of order spoil objects that are then sent again; run.sh --gatt-channels 1).
	[ "$(jfield "$done_line" bytes_resent)" = 0 ] || fail "$(basename "$zip"): $(jfield "$done_line" bytes_resent) bytes sent twice without a lost link: $done_line"
	want=$((before + ${#bins[@]}))
	local deadline=$((SECONDS + 15))
	until [ "$(activations)" -ge "$want" ]; do
		((SECONDS < deadline)) || fail "simulate reported $(activations) activations, want $want after $(basename "$zip")"
		sleep 0.2
	done
	for bin in "${bins[@]}"; do
		crc=$(python3 -c 'import sys, zlib; print("%08x" % zlib.crc32(open(sys.argv[1], "rb").read()))' "$bin")
		[ -f "$STORE/$crc.bin" ] || fail "no stored image $crc.bin for $(basename "$bin") (store: $(ls "$STORE" | tr '\n' ' '))"
		cmp "$STORE/$crc.bin" "$bin" || fail "the stored image $crc.bin differs from $(basename "$bin")"
		step "stored $crc.bin is byte-identical to $(basename "$bin") ($(stat -c %s "$bin") bytes)"
	done
	step "$(basename "$zip"): ${#bins[@]} image(s), $(jfield "$done_line" seconds) s, $(jfield "$done_line" bytes) B: $done_line"
}

if [ "${LOSE_FINAL_ANSWER:-0}" = 1 ]; then
	f=$RESULTS_DIR/flash-lost-answer.stamped rc=0
	stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$NORDIC/blinky-app.zip" --json || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
	[ "$rc" = 21 ] || { tail -n 3 "$f.stderr" || true; fail "the lost last answer ended with exit $rc, want 21 (not_confirmed): ${done_line:-no done event}"; }
	grep -q '"error":"not_confirmed"' <<<"$done_line" || fail "the done line does not say not_confirmed: $done_line"
	wait_for_line "$SIMOUT" '"event":"activated"' 15 || fail "simulate reported no activation"
	[ "$(activations)" = 1 ] || fail "simulate reported $(activations) activations, want 1"
	step "lost last answer: exit $rc after $(jfield "$done_line" seconds) s, activated once: $done_line"
	step "lost last answer: $(tail -n 1 "$f.stderr")"
else
	flash_package "$NORDIC/blinky-app.zip"
	flash_package "$NORDIC/blinky-sd-bl-app.zip"
fi

stop_sim "$SIM_PID" "$SIMOUT" || fail "otaflash simulate exited with $? after SIGINT"
grep -q '"event":"done"' "$SIMOUT" || fail "otaflash simulate printed no done event"
step "PASS: Secure DFU packages flashed through bluetoothd into a simulated bootloader"
