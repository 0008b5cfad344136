#!/usr/bin/env python3
"""Flash an image over the otaflash OTA protocol (docs/PROTOCOL.md) with bleak.

The baseline of the VM benchmark (scripts/bluez-vm/scenarios/ota-bench.sh): what
a Linux user would script with bleak. It reads the info characteristic, sends
BEGIN (restart), streams data packets with write-without-response (one awaited
WriteValue each, bleak's only way), writes a CHECKPOINT with response every
--checkpoint-interval bytes and waits for its reply, then VERIFY and ACTIVATE,
checking every answer, so the device really stores a verified image.

Connecting: bleak's connect() waits for ServicesResolved and gives up as soon as
its cached Device1.Connected is false. On bluetoothd 5.66 under the VM,
PropertiesChanged(Connected=true) is not always emitted after Connect, so the
cache can stay false while the link is up and bleak raises "failed to discover
services, device disconnected". --connect auto (the default) tries plain bleak
first; on that failure it connects through Device1.Connect itself, waits until
Properties.Get reports Connected and ServicesResolved, and hands bleak the
connected device in a fresh event loop (bleak keeps one BlueZ manager per loop,
whose GetManagedObjects then sees the true state, so connect() skips Connect).
The JSON result says which way was used.

Prints one JSON object on stdout (and --json-out FILE): seconds, transfer
seconds (BEGIN reply to VERIFY sent), packets, writes/s, kB/s, MTU, chunk.
"""

import argparse
import asyncio
import json
import struct
import sys
import time
import zlib

from bleak import BleakClient, BleakScanner
from bleak.backends.device import BLEDevice
from bleak.exc import BleakError
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

SERVICE = "b0e60001-2f6e-4b2a-9c1f-6f7461666c61"
CONTROL = "b0e60002-2f6e-4b2a-9c1f-6f7461666c61"
DATA = "b0e60003-2f6e-4b2a-9c1f-6f7461666c61"
INFO = "b0e60004-2f6e-4b2a-9c1f-6f7461666c61"

OP_BEGIN, OP_CHECKPOINT, OP_STATUS, OP_VERIFY, OP_ACTIVATE = 1, 2, 3, 4, 5
ST_SUCCESS, ST_GAP, ST_CRC_MISMATCH = 0, 5, 6
MAX_WRITE_VALUE = 510  # BlueZ 5.66 drops longer write commands (PROTOCOL.md)


class Failure(Exception):
    pass


def log(msg):
    print(f"[bleak_flash {time.monotonic() - T0:7.2f}s] {msg}", file=sys.stderr, flush=True)


T0 = time.monotonic()


def pack_version(text):
    major, minor, patch = (int(x) for x in text.split("."))
    return major << 24 | minor << 16 | patch


def dev_path(adapter, address):
    return f"/org/bluez/{adapter}/dev_{address.upper().replace(':', '_')}"


async def find_device(args):
    """Scans until the device shows up; restarts the scan (btvirt's reports can be lost at scan start)."""
    deadline = time.monotonic() + args.scan_timeout
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        device = await BleakScanner.find_device_by_address(
            args.address, timeout=min(4.0, max(0.5, deadline - time.monotonic())), bluez={"adapter": args.adapter}
        )
        if device is not None:
            log(f"found {device.address} ({device.name}) on scan attempt {attempt}")
            return device
        log(f"scan attempt {attempt}: not seen yet")
    raise Failure(f"{args.address} not found within {args.scan_timeout} s")


async def device_props(bus, path):
    reply = await bus.call(Message(destination="org.bluez", path=path, interface="org.freedesktop.DBus.Properties",
                                   member="GetAll", signature="s", body=["org.bluez.Device1"]))
    if reply.message_type == MessageType.ERROR:
        raise Failure(f"Properties.GetAll on {path}: {reply.error_name} {reply.body}")
    return {k: v.value for k, v in reply.body[0].items()}


async def dbus_connect(args):
    """Device1.Connect, then waits (polling Properties) for Connected and ServicesResolved."""
    path = dev_path(args.adapter, args.address)
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    try:
        props = await device_props(bus, path)
        if not props.get("Connected"):
            reply = await asyncio.wait_for(bus.call(Message(destination="org.bluez", path=path,
                                                            interface="org.bluez.Device1", member="Connect")), 30)
            if reply.message_type == MessageType.ERROR:
                raise Failure(f"Device1.Connect: {reply.error_name} {reply.body}")
        deadline = time.monotonic() + 20
        while True:
            props = await device_props(bus, path)
            if props.get("Connected") and props.get("ServicesResolved"):
                break
            if time.monotonic() > deadline:
                raise Failure(f"not connected with services resolved 20 s after Connect: {props}")
            await asyncio.sleep(0.1)
        return BLEDevice(args.address, props.get("Name"), {"path": path, "props": props})
    finally:
        bus.disconnect()


async def connect_plain(args, result):
    device = await find_device(args)
    client = BleakClient(device, timeout=20)
    t = time.monotonic()
    await client.connect()
    result["connect"] = "bleak"
    result["connect_seconds"] = round(time.monotonic() - t, 3)
    return client


async def connect_preconnected(args, result):
    t = time.monotonic()
    device = await dbus_connect(args)
    client = BleakClient(device, timeout=20)
    await client.connect()
    result["connect"] = "dbus-preconnect"
    result["connect_seconds"] = round(time.monotonic() - t, 3)
    return client


class Control:
    """The control point: one command in flight, its reply from the notification queue."""

    def __init__(self, client, char):
        self.client, self.char = client, char
        self.queue = asyncio.Queue()
        self.gap_events = 0

    def on_notify(self, _sender, data):
        self.queue.put_nowait(bytes(data))

    async def command(self, payload, timeout=10.0):
        while not self.queue.empty():
            self.queue.get_nowait()
        await self.client.write_gatt_char(self.char, payload, response=True)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"no reply to opcode {payload[0]} within {timeout} s")
            msg = await asyncio.wait_for(self.queue.get(), left)
            if len(msg) >= 3 and msg[0] == 0x80 and msg[1] == payload[0]:
                return msg[2], msg[3:]
            if len(msg) >= 2 and msg[0] == 0x81:
                self.gap_events += 1
            # anything else is stale or an event: keep waiting for our reply


async def flash(client, args, result):
    image = open(args.image, "rb").read()
    size, crc = len(image), zlib.crc32(image)
    services = sorted(s.uuid for s in client.services)
    result["services"] = services
    log(f"services: {services}")
    ota = client.services.get_service(SERVICE)
    if ota is None:
        raise Failure(f"no OTA service {SERVICE}")
    cp, data, info_c = (ota.get_characteristic(u) for u in (CONTROL, DATA, INFO))
    if cp is None or data is None or info_c is None:
        raise Failure("the OTA service lacks a characteristic")

    info = bytes(await client.read_gatt_char(info_c))
    if len(info) < 20 or info[0] != 1:
        raise Failure(f"info value {info.hex()}: protocol version is not 1")
    slot = struct.unpack_from("<I", info, 4)[0]
    if size > slot:
        raise Failure(f"image of {size} B exceeds the slot ({slot} B)")

    mtu = data.max_write_without_response_size + 3
    chunk = min(mtu - 3, MAX_WRITE_VALUE) - 4
    if args.chunk:
        chunk = min(chunk, args.chunk)
    result.update(mtu=mtu, chunk=chunk, image_size=size, crc32=f"{crc:08x}")
    log(f"MTU {mtu}, chunk {chunk} B, image {size} B CRC32 {crc:08x}, slot {slot} B")

    ctl = Control(client, cp)
    await client.start_notify(cp, ctl.on_notify)

    status, body = await ctl.command(struct.pack("<BBIIIB", OP_BEGIN, 1, size, crc, pack_version(args.image_version), 1))
    if status != ST_SUCCESS or len(body) < 8:
        raise Failure(f"BEGIN answered status {status}")
    offset, dev_crc = struct.unpack_from("<II", body)
    if offset and dev_crc != zlib.crc32(image[:offset]):
        offset = 0
    t_transfer = time.monotonic()

    packets = checkpoints = recoveries = 0
    bytes_sent = 0
    last_cp = offset
    while True:
        if offset < size:
            end = min(offset + chunk, size)
            await client.write_gatt_char(data, struct.pack("<I", offset) + image[offset:end], response=False)
            packets += 1
            bytes_sent += end - offset
            offset = end
            if offset - last_cp < args.checkpoint_interval and offset < size:
                continue
        checkpoints += 1
        status, body = await ctl.command(struct.pack("<BII", OP_CHECKPOINT, offset, zlib.crc32(image[:offset])))
        if status == ST_SUCCESS:
            last_cp = offset
            if offset >= size:
                break
            continue
        if status in (ST_GAP, ST_CRC_MISMATCH) and len(body) >= 8:
            # The device holds less (a lost packet) or different data: continue from its position.
            dev_off, dev_crc = struct.unpack_from("<II", body)
            recoveries += 1
            if recoveries > 64:
                raise Failure("more than 64 recoveries")
            offset = dev_off if dev_crc == zlib.crc32(image[:dev_off]) else 0
            last_cp = offset
            log(f"CHECKPOINT answered status {status}: resending from {offset}")
            continue
        raise Failure(f"CHECKPOINT({offset}) answered status {status}")

    t_verify = time.monotonic()
    status, body = await ctl.command(bytes([OP_VERIFY]), timeout=30)
    if status != ST_SUCCESS or len(body) < 4 or struct.unpack_from("<I", body)[0] != crc:
        raise Failure(f"VERIFY answered status {status} {body.hex()}")
    status, _ = await ctl.command(bytes([OP_ACTIVATE]), timeout=10)
    if status != ST_SUCCESS:
        raise Failure(f"ACTIVATE answered status {status}")
    transfer = t_verify - t_transfer
    result.update(
        result="ok", packets=packets, bytes_sent=bytes_sent, checkpoints=checkpoints, recoveries=recoveries,
        gap_events=ctl.gap_events, transfer_seconds=round(transfer, 3),
        writes_per_s=round(packets / transfer, 1), kB_per_s=round(size / transfer / 1000, 1),
    )
    try:
        await client.stop_notify(cp)
    except Exception:
        pass  # the device reboots into the new image after ACTIVATE


async def run(args, result, mode):
    t = time.monotonic()
    client = await (connect_plain(args, result) if mode == "bleak" else connect_preconnected(args, result))
    try:
        await flash(client, args, result)
    finally:
        try:
            await asyncio.wait_for(client.disconnect(), 10)
        except Exception as e:
            log(f"disconnect: {e!r}")
    result["seconds"] = round(time.monotonic() - t, 3)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--image-version", default="1.0.0")
    p.add_argument("--checkpoint-interval", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=0, help="at most this many payload bytes per packet")
    p.add_argument("--scan-timeout", type=float, default=30)
    p.add_argument("--connect", choices=["auto", "bleak", "dbus"], default="auto")
    p.add_argument("--json-out")
    args = p.parse_args()

    import bleak

    result = {"tool": "bleak", "bleak_version": getattr(bleak, "__version__", None) or _bleak_version(),
              "address": args.address, "adapter": args.adapter, "result": "error"}
    try:
        if args.connect in ("auto", "bleak"):
            try:
                asyncio.run(run(args, result, "bleak"))
            except BleakError as e:
                if args.connect == "bleak" or "failed to discover services" not in str(e):
                    raise
                result["bleak_connect_error"] = str(e)
                log(f"plain bleak connect failed ({e}); connecting through Device1.Connect and retrying")
                asyncio.run(run(args, result, "dbus"))
        else:
            asyncio.run(run(args, result, "dbus"))
    except (Failure, BleakError, asyncio.TimeoutError, OSError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    text = json.dumps(result)
    print(text, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return 0 if result["result"] == "ok" else 1


def _bleak_version():
    try:
        from importlib.metadata import version
        return version("bleak")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
