#!/bin/bash
# Nordic buttonless DFU entry through the real stack on both sides (needs run.sh --controllers 4):
#   1. The central sees the two peripheral controllers at S and S+1: they advertise resolvable
#      private addresses, and the central resolves them with IRKs loaded for identities S and S+1
#      (see below why not static addresses). A BlueZ adapter cannot change its address, so the
#      application answers on one controller, its bootloader on the other; simulate --address
#      says S.
#   2. `otaflash simulate --protocol nordic-dfu --buttonless --bootloader-adapter` serves the
#      application with the buttonless service (8EC90003) at S; `otaflash scan` lists it as nordic-dfu.
#   3. `otaflash --device S blinky-app.zip`: Enter Bootloader, the bootloader at S+1 takes the
#      package: done/ok naming the bootloader S+1, the stored image byte-identical to the package's
#      .bin, and the device back in its application at S (simulate's moved events, a scan).
#   4. The same package again through S: only an application answers Enter Bootloader, so this
#      shows the device really came back (and its bootloader advertises at S+1 a second time).
# With LOSE_FINAL_ANSWER=1 (run.sh --env LOSE_FINAL_ANSWER=1) simulate loses the last EXECUTE's
# answer (--sim-lose-final-answer): the bootloader activates and resets, and each flash must end
# done/ok all the same, confirmed by the application at S (a notice says so), not by a reconnect
# to S+1.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

[ -n "${THIRD_HCI:-}" ] || fail "needs three usable controllers (run.sh --controllers 4): got ${BLUEZ_ADAPTERS:-none}"
NORDIC=$PROJECT_DIR/firmware-samples/nordic
PACKAGE=$NORDIC/blinky-app.zip
STORE=$RESULTS_DIR/store
APP_ADDR=${BUTTONLESS_ADDR:-C0:11:22:33:44:10}
last=$((16#${APP_ADDR##*:} + 1))
((last <= 255)) || fail "BUTTONLESS_ADDR $APP_ADDR: its last octet + 1 overflows"
BL_ADDR=$(printf '%s:%02X' "${APP_ADDR%:*}" "$last")
APP_HCI=$PERIPHERAL_HCI BL_HCI=$THIRD_HCI
CLEANUP_DEVICES+=("$CENTRAL_HCI $APP_ADDR" "$CENTRAL_HCI $BL_ADDR")
step "otaflash: $OTAFLASH; central $CENTRAL_HCI, application $APP_HCI at $APP_ADDR, bootloader $BL_HCI at $BL_ADDR"

# ------------------------------------------------------------------ 1. addresses S and S+1
# A random static address set with btmgmt static-addr (BR/EDR off) is advertised, but bluetoothd
# 5.66 binds its ATT server to the controller's public address: the central's ATT requests went
# unanswered. So each peripheral keeps its public identity (what bluetoothd serves GATT on) and
# advertises resolvable private addresses made with its own IRK (btmgmt privacy on IRK), and the
# central is given those IRKs with identity addresses S and S+1 (mgmt Load IRKs): its kernel
# resolves the advertiser to S or S+1, so bluetoothd and otaflash on the central see the device at
# S, and its bootloader at S+1.
IRK_APP=${IRK_APP:-0f1e2d3c4b5a69788796a5b4c3d2e1f0}
IRK_BL=${IRK_BL:-f0e1d2c3b4a5968778695a4b3c2d1e0f}
# privacy INDEX IRK: the controller advertises RPAs made with IRK (set while powered off).
privacy() {
	local index=$1 irk=$2 out
	timeout 10 btmgmt --index "$index" power off >/dev/null 2>&1 || fail "btmgmt --index $index power off failed"
	out=$(timeout 10 btmgmt --index "$index" privacy on "$irk" 2>&1) || fail "btmgmt --index $index privacy on failed: $out"
	timeout 10 btmgmt --index "$index" power on >/dev/null 2>&1 || fail "btmgmt --index $index power on failed"
	out=$(timeout 10 btmgmt --index "$index" info 2>&1 || true)
	step "hci$index: privacy on; btmgmt info: $(grep -E -i 'current settings' <<<"$out" | tr -s ' \t\n' ' ')"
}
privacy "${APP_HCI#hci}" "$IRK_APP"
privacy "${BL_HCI#hci}" "$IRK_BL"
# load_irks INDEX ADDR IRK [ADDR IRK...]: mgmt Load IRKs (0x0030) on the controller, identities LE
# random (btmgmt irks takes one key, and each load replaces the list).
load_irks() {
	timeout 10 python3 - "$@" <<'PY'
import ctypes, os, socket, struct, sys
index, pairs = int(sys.argv[1]), sys.argv[2:]
keys = b""
for addr, irk in zip(pairs[::2], pairs[1::2]):
    keys += bytes.fromhex(addr.replace(":", ""))[::-1] + b"\x02" + bytes.fromhex(irk)
params = struct.pack("<H", len(pairs) // 2) + keys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(31, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 1)  # AF_BLUETOOTH, BTPROTO_HCI
if fd < 0:
    sys.exit("socket: " + os.strerror(ctypes.get_errno()))
address = struct.pack("<HHH", 31, 0xFFFF, 3)  # sockaddr_hci: HCI_DEV_NONE, HCI_CHANNEL_CONTROL
if libc.bind(fd, address, len(address)) < 0:
    sys.exit("bind: " + os.strerror(ctypes.get_errno()))
os.write(fd, struct.pack("<HHH", 0x0030, index, len(params)) + params)
while True:
    event, idx, length = struct.unpack("<HHH", (reply := os.read(fd, 512))[:6])
    if event in (1, 2) and struct.unpack("<H", reply[6:8])[0] == 0x0030:
        status = reply[8]
        print("Load IRKs: status 0x%02x" % status)
        sys.exit(0 if status == 0 else 1)
PY
}
out=$(load_irks "${CENTRAL_HCI#hci}" "$APP_ADDR" "$IRK_APP" "$BL_ADDR" "$IRK_BL" 2>&1) ||
	fail "loading the IRKs into $CENTRAL_HCI failed: $out"
step "$CENTRAL_HCI: $(tr -s ' \t\n' ' ' <<<"$out")(identities $APP_ADDR, $BL_ADDR)"

# ------------------------------------------------------------------ 2. serve, scan
LOSE=()
[ "${LOSE_FINAL_ANSWER:-0}" = 1 ] && LOSE=(--sim-lose-final-answer)
start_sim buttonless "$APP_HCI" "$STORE" --verbose --protocol nordic-dfu --buttonless --bootloader-adapter "$BL_HCI" \
	--address "$APP_ADDR" --public-key "$NORDIC/test-key-public.pem" "${LOSE[@]}"
SIMOUT=$SIM_OUT
serving=$(grep -m1 '"event":"serving"' "$SIMOUT")
[ "$(jfield "$serving" bootloader_adapter)" = "$BL_HCI" ] || fail "the serving line does not name $BL_HCI as the bootloader's adapter: $serving"
scan_for "$CENTRAL_HCI" "$APP_ADDR" || fail "otaflash scan --ota-only did not list the application at $APP_ADDR in 3 scans"
grep -q '"protocol":"nordic-dfu"' <<<"$SCAN_LINE" || fail "listed without protocol nordic-dfu: $SCAN_LINE"
step "scan: $SCAN_LINE"

# ------------------------------------------------------------------ 3./4. flash through buttonless entry
BIN=$RESULTS_DIR/app.bin
python3 - "$PACKAGE" "$BIN" <<'PY'
import json, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
m = json.loads(z.read("manifest.json"))["manifest"]
open(sys.argv[2], "wb").write(z.read(m["application"]["bin_file"]))
PY
CRC=$(python3 -c 'import sys, zlib; print("%08x" % zlib.crc32(open(sys.argv[1], "rb").read()))' "$BIN")
count() { grep -c "$1" "$SIMOUT" || true; }

flash_buttonless() {
	local n=$1 f=$RESULTS_DIR/flash-$1.stamped rc=0 done_line before moves
	before=$(count '"event":"activated"')
	moves=$(count '"event":"moved"')
	stamped "$f" 240 "$OTAFLASH" --adapter "$CENTRAL_HCI" --device "$APP_ADDR" "$PACKAGE" --json || rc=$?
	done_line=$(grep '"event":"done"' "$f" | tail -n 1 | cut -f2-)
	if [ "$rc" -ne 0 ]; then
		tail -n 3 "$f.stderr" "$RESULTS_DIR/buttonless.stderr" || true
		fail "flash $n exited with $rc: ${done_line:-no done event}"
	fi
	grep -q '"result":"ok"' <<<"$done_line" || fail "flash $n did not end done/ok: $done_line"
	[ "$(jfield "$done_line" bootloader)" = "$BL_ADDR" ] || fail "flash $n: the done line does not name the bootloader $BL_ADDR: $done_line"
	if [ "${LOSE_FINAL_ANSWER:-0}" = 1 ]; then
		grep -q 'the device runs its application again: the image was activated' "$f" ||
			fail "flash $n: the last EXECUTE's answer was to be lost, and no notice says the application confirmed the activation"
		step "flash $n: $(grep -m1 'the image was activated' "$f" | cut -f2-)"
	fi
	wait_for_line "$SIMOUT" '"event":"activated"' 15 && [ "$(count '"event":"activated"')" -gt "$before" ] ||
		fail "flash $n: simulate reported no new activation"
	[ -f "$STORE/$CRC.bin" ] || fail "no stored image $CRC.bin (store: $(ls "$STORE" | tr '\n' ' '))"
	cmp "$STORE/$CRC.bin" "$BIN" || fail "the stored image $CRC.bin differs from the package's $(basename "$BIN")"
	step "flash $n: stored $CRC.bin is byte-identical to the package's application ($(stat -c %s "$BIN") bytes)"
	# Into the bootloader on BL_HCI, and back into the application on APP_HCI.
	local deadline=$((SECONDS + 15))
	until [ "$(count '"event":"moved"')" -ge $((moves + 2)) ]; do
		((SECONDS < deadline)) || fail "flash $n: simulate reported $(($(count '"event":"moved"') - moves)) moved event(s), want 2: $(grep '"event":"moved"' "$SIMOUT" | tr '\n' ' ')"
		sleep 0.2
	done
	local moved
	moved=$(grep '"event":"moved"' "$SIMOUT" | tail -n 2)
	grep -q "\"address\":\"$BL_ADDR\",\"adapter\":\"$BL_HCI\",\"mode\":\"bootloader\"" <<<"$moved" || fail "flash $n: no move to the bootloader at $BL_ADDR on $BL_HCI: $moved"
	grep -q "\"address\":\"$APP_ADDR\",\"adapter\":\"$APP_HCI\",\"mode\":\"application\"" <<<"$moved" || fail "flash $n: no move back to $APP_ADDR on $APP_HCI: $moved"
	step "flash $n: $(jfield "$done_line" seconds) s: $done_line"
	step "flash $n: simulate: $(tr '\n' ' ' <<<"$moved")"
}

flash_buttonless 1
scan_for "$CENTRAL_HCI" "$APP_ADDR" || fail "after the update, otaflash scan did not list the application at $APP_ADDR"
step "after the update, scan: $SCAN_LINE"
flash_buttonless 2

stop_sim "$SIM_PID" "$SIMOUT" || fail "otaflash simulate exited with $? after SIGINT"
done_sim=$(grep '"event":"done"' "$SIMOUT" | tail -n 1)
[ "$(jfield "$done_sim" activations)" = 2 ] || fail "simulate's done line does not count 2 activations: $done_sim"
step "simulate: $done_sim"
step "PASS: buttonless entry: application at $APP_ADDR on $APP_HCI, bootloader at $BL_ADDR on $BL_HCI, package flashed twice"
