#!/bin/bash
# Silicon Labs' Bluetooth OTA through the real stack: otaflash as the central against
# `otaflash simulate --protocol silabs-ota` on the peripheral controller, a GBL file picked by
# its content (auto):
#   1. application OTA DFU (--sim-silabs-kind app): done/ok; the GBL went into the storage slot,
#      was checked once otaflash closed the link, and the peripheral stored the image it booted
#      (--store), byte-identical with the GBL; otaflash confirmed it by the application version the
#      device reads back after its reboot;
#   2. the AppLoader (--sim-silabs-kind apploader; a served device keeps one GATT table, so it is
#      served from its AppLoader on, as after the in-place application rebooted into it; the
#      entry itself runs in the simulator's tests): done/ok, 0x03 answered after the AppLoader's
#      check, stored byte-identical;
#   3. application OTA DFU, the link dropped from outside (`btmgmt disconnect` on the central's
#      controller) once the peripheral holds 4 KiB: neither device can resume, so otaflash
#      reconnects, waits for the device to erase its slot again, and sends the whole GBL again:
#      done/ok, two 0x00 (begin events) at the peripheral, one boot, stored byte-identical, and
#      otaflash's notice that the whole GBL goes again;
#   4. the same drop with --reconnect-window 0: exit 6, the line that says to run the same command
#      again (the whole GBL goes again), and nothing booted.
# OTA Data goes as write requests, each answered (otaflash's default, Silicon Labs' host example's
# sequence). $SILABS_GBL: the GBL, default firmware-samples/silabs/blinky-efr32-v2.gbl;
# $SILABS_STEPS: the steps to run, default "app apploader drop drop-end"; $SILABS_SERVE_WAIT:
# seconds to wait for the peripheral to serve, default 90.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

IMAGE=${SILABS_GBL:-$PROJECT_DIR/firmware-samples/silabs/blinky-efr32-v2.gbl}
[ -f "$IMAGE" ] || fail "no GBL at $IMAGE (set SILABS_GBL)"
IMAGE_SIZE=$(stat -c %s "$IMAGE")
STEPS=" ${SILABS_STEPS:-app apploader drop drop-end} "
: "${CENTRAL_INDEX:?}"
CLEANUP_DEVICES+=("$CENTRAL_HCI $PERIPHERAL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI, peripheral $PERIPHERAL_HCI $PERIPHERAL_ADDR; GBL $(basename "$IMAGE") ($IMAGE_SIZE B)"

FIGS=()
figure() { FIGS+=("$1"); }

# start_silabs TAG KIND [ARGS...]: a fresh `simulate --protocol silabs-ota --sim-silabs-kind KIND
# ARGS` on the peripheral, stamped into $RESULTS_DIR/TAG.stamped; SIM_PID, SIM_STAMPED, SIM_STORE.
start_silabs() {
	local tag=$1 kind=$2
	shift 2
	SIM_STAMPED=$RESULTS_DIR/$tag.stamped
	SIM_STORE=$RESULTS_DIR/store-$tag
	: >"$SIM_STAMPED"
	"$OTAFLASH" simulate --adapter "$PERIPHERAL_HCI" --protocol silabs-ota --sim-silabs-kind "$kind" --store "$SIM_STORE" --json --verbose "$@" \
		> >(while IFS= read -r line; do printf '%s\t%s\n' "$EPOCHREALTIME" "$line"; done >"$SIM_STAMPED") \
		2>"$RESULTS_DIR/$tag.stderr" &
	SIM_PID=$!
	BG+=("$SIM_PID")
	wait_for_line "$SIM_STAMPED" '"event":"serving"' "${SILABS_SERVE_WAIT:-90}" || fail "otaflash simulate --protocol silabs-ota did not report serving within ${SILABS_SERVE_WAIT:-90} s"
	step "$tag: $(grep -m1 '"event":"serving"' "$SIM_STAMPED" | cut -f2-)"
}
stop_silabs() {
	stop_sim "$SIM_PID" "$SIM_STAMPED" || fail "otaflash simulate exited with $? after SIGINT"
	cut -f2- "$SIM_STAMPED" >"${SIM_STAMPED%.stamped}.jsonl"
}

# flash TAG [ARGS...]: otaflash on the GBL (auto), stamped into TAG.stamped; F_RC, F_DONE, F_WALL.
flash() {
	local tag=$1 f=$RESULTS_DIR/$1.stamped t0=$EPOCHREALTIME
	shift
	F_RC=0
	stamped "$f" 300 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$PERIPHERAL_ADDR" "$@" "$IMAGE" --json || F_RC=$?
	F_WALL=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	F_DONE=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2- || true)
}

# ok_flash TAG: the last flash ended done/ok over silabs-ota, and the peripheral booted and stored
# the GBL byte-identical.
ok_flash() {
	if [ "$F_RC" -ne 0 ] || ! grep -q '"result":"ok"' <<<"$F_DONE"; then
		tail -n 3 "$RESULTS_DIR/$1.stamped.stderr" || true
		fail "$1: otaflash exited with $F_RC: ${F_DONE:-no done event}"
	fi
	grep -q '"protocol":"silabs-ota"' "$RESULTS_DIR/$1.stamped" || fail "$1: otaflash did not pick silabs-ota from the GBL"
	wait_for_line "$SIM_STAMPED" '"event":"activated"' 10 || fail "$1: the peripheral booted nothing"
	stored=$(ls "$SIM_STORE"/*.bin 2>/dev/null | head -n 1)
	[ -n "$stored" ] && cmp -s "$stored" "$IMAGE" || fail "$1: the stored image ${stored:-(none)} differs from $(basename "$IMAGE")"
}

# ------------------------------------------------------------------ 1, 2. both kinds
for kind in app apploader; do
	[[ $STEPS == *" $kind "* ]] || continue
	start_silabs "sim-$kind" "$kind"
	flash "$kind"
	ok_flash "$kind"
	want=$([ "$kind" = app ] && echo "application OTA DFU" || echo "AppLoader")
	grep -q "\"state_text\":\"$want" "$RESULTS_DIR/$kind.stamped" ||
		fail "$kind: otaflash did not take the device for the $want: $(grep -m1 '"event":"device_info"' "$RESULTS_DIR/$kind.stamped" | cut -f2-)"
	step "FIGURES $kind: done/ok in $F_WALL s wall, stored byte-identical"
	figure "$(jq -nc --arg k "$kind" --argjson w "$F_WALL" '{flash: {($k): {wall_seconds: $w}}}')"
	stop_silabs
done

# ------------------------------------------------------------------ 3, 4. link dropped mid-transfer
# The sample GBL (312 B) goes in a few writes, before any drop could land: these steps send a GBL of
# 256 KiB of seeded bytes, written here tag by tag as btl_gbl_format.h lays them out (header,
# application, prog at 0x08006000, end with the CRC-32 of every byte before its value).
if [[ $STEPS == *" drop"* ]]; then
	IMAGE=$RESULTS_DIR/seeded-256k.gbl
	python3 - "$IMAGE" <<'PY'
import random, struct, sys, zlib
body = bytes(random.Random(48).getrandbits(8) for _ in range(256 * 1024))
le = lambda *v: struct.pack("<%dI" % len(v), *v)
out = bytes.fromhex("eb17a603") + le(8, 0x03000000, 0)
out += bytes.fromhex("f40a0af4") + le(28, 0x20, 0x02000000, 0) + bytes(range(16))
out += bytes.fromhex("fe0101fe") + le(4 + len(body), 0x08006000) + body
out += bytes.fromhex("fc0404fc") + le(4)
open(sys.argv[1], "wb").write(out + le(zlib.crc32(out)))
PY
	IMAGE_SIZE=$(stat -c %s "$IMAGE")
fi
for step_name in drop drop-end; do
	[[ $STEPS == *" $step_name "* ]] || continue
	# Its flash writes take 300 ms per KiB more, so the transfer lasts long enough for the drop
	# to land in it under TCG (the guest's polling and btmgmt lag 2-3 s behind).
	start_silabs "sim-$step_name" app --sim-slow-flash-ms 300
	window=$([ "$step_name" = drop ] && echo 60 || echo 0)
	flash "$step_name" --reconnect-window "$window" &
	flash_pid=$!
	BG+=("$flash_pid")
	disconnect_at "$SIM_STAMPED" 4096 "$flash_pid"
	got=$DISCONNECT_GOT
	wait "$flash_pid" || true
	f=$RESULTS_DIR/$step_name.stamped
	F_DONE=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2- || true)
	F_RC=$(jfield "$F_DONE" exit_code)
	begins=$(grep -c '"event":"begin"' "$SIM_STAMPED" || true)
	if [ "$step_name" = drop ]; then
		ok_flash drop
		[ "$begins" -ge 2 ] || fail "drop: the peripheral saw $begins 0x00, want 2 (the GBL again from its first byte)"
		grep -q 'whole GBL goes again' "$f" "$f.stderr" || fail "drop: otaflash did not say the whole GBL goes again"
		step "FIGURES drop: link dropped at ${got:-?} B of $IMAGE_SIZE, the whole GBL again, done/ok, $begins begins, stored byte-identical"
		figure "$(jq -nc --argjson at "${got:-null}" --argjson b "$begins" '{drop: {dropped_at: $at, begins: $b, result: "ok"}}')"
	else
		last=$(tail -n 1 "$f.stderr" 2>/dev/null || true)
		[ "$F_RC" = 6 ] || fail "drop-end: the dropped flash ended with exit code ${F_RC:-?}, want 6: $last"
		grep -q 'run the same command again' "$f" "$f.stderr" || fail "drop-end: the dropped flash did not say to run the same command again"
		! grep -q '"event":"activated"' "$SIM_STAMPED" || fail "drop-end: the peripheral booted an image after the link was lost"
		step "FIGURES drop-end: link dropped at ${got:-?} B of $IMAGE_SIZE, exit 6, nothing booted"
		figure "$(jq -nc --argjson at "${got:-null}" '{drop_end: {dropped_at: $at, exit_code: 6, booted: false}}')"
	fi
	stop_silabs
done

printf '%s\n' "${FIGS[@]}" | jq -s --argjson size "$IMAGE_SIZE" --arg img "$(basename "$IMAGE")" \
	'reduce .[] as $x ({}; . * $x) + {image: $img, image_size: $size}' >"$RESULTS_DIR/figures.json"
step "figures.json: $(jq -c . "$RESULTS_DIR/figures.json")"
step "PASS"
