#!/usr/bin/env python3
"""A fake bluetoothd for otaflash's BlueZ tests.

It owns ``org.bluez`` on the bus given with ``--bus`` and answers the parts of BlueZ's D-Bus API
that a GATT central uses (doc/org.bluez.Adapter.rst, doc/org.bluez.Device.rst,
doc/org.bluez.GattService.rst, doc/org.bluez.GattCharacteristic.rst): an ObjectManager at ``/``,
``Adapter1`` objects, a ``Device1`` whose GATT objects are exported after ``Connect`` and removed
on disconnect, ``AcquireWrite`` (a SOCK_SEQPACKET socketpair) and ``WriteValue``.

Behind the OTA service it runs the device side of docs/PROTOCOL.md, written from the spec and
independent of otaflash's Swift code, so a bug on either side shows up as a failed transfer.

It prints ``READY`` on stdout once it owns the name. Failure modes are command-line flags (see
``--help``). Method calls are logged one per line to ``--log`` for the tests to inspect.
"""

import argparse
import asyncio
import os
import socket
import struct
import sys
import zlib

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

OTA_SERVICE = "b0e60001-2f6e-4b2a-9c1f-6f7461666c61"
OTA_CONTROL = "b0e60002-2f6e-4b2a-9c1f-6f7461666c61"
OTA_DATA = "b0e60003-2f6e-4b2a-9c1f-6f7461666c61"
OTA_INFO = "b0e60004-2f6e-4b2a-9c1f-6f7461666c61"


def sig(short):
    return "0000%s-0000-1000-8000-00805f9b34fb" % short


DIS_SERVICE = sig("180a")
DIS_MANUFACTURER = sig("2a29")
DIS_MODEL = sig("2a24")
DIS_FIRMWARE = sig("2a26")

ADAPTER = "org.bluez.Adapter1"
DEVICE = "org.bluez.Device1"
SERVICE = "org.bluez.GattService1"
CHARACTERISTIC = "org.bluez.GattCharacteristic1"
PROPS = "org.freedesktop.DBus.Properties"
AGENT_MANAGER = "org.bluez.AgentManager1"
OM = "org.freedesktop.DBus.ObjectManager"


def bluez_error(name, text):
    return DBusError("org.bluez.Error." + name, text)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def crc(data):
    return zlib.crc32(bytes(data)) & 0xFFFFFFFF


class OTADevice:
    """The device side of the otaflash OTA protocol (docs/PROTOCOL.md)."""

    IDLE, RECEIVING, VERIFIED = 0, 1, 2

    def __init__(self, slot_size, version, image_out):
        self.slot_size = slot_size
        self.version = version
        self.image_out = image_out
        self.pending = None  # (size, crc, version)
        self.flash = bytearray()
        self.received = 0
        self.committed = 0
        self.state = self.IDLE
        self.gap_reported_at = None
        self.activated = 0

    def prefix_crc(self, n):
        return crc(self.flash[:n])

    def info(self):
        received = self.received if self.pending else 0
        size = self.pending[0] if self.pending else 0
        return bytes([1, self.state, 0, 0]) + u32(self.slot_size) + u32(self.version) + u32(received) + u32(size)

    def data(self, packet):
        """One data packet; returns a GAP event to notify, or None."""
        if self.state != self.RECEIVING or len(packet) < 5:
            return None
        offset = struct.unpack_from("<I", packet, 0)[0]
        payload = packet[4:]
        size = self.pending[0]
        if offset + len(payload) > size:
            return None
        if offset > self.received:
            if self.gap_reported_at != self.received:
                self.gap_reported_at = self.received
                return bytes([0x81, 0x01]) + u32(self.received) + u32(self.prefix_crc(self.received))
            return None
        end = offset + len(payload)
        if end > self.received:
            skip = self.received - offset
            self.flash[self.received:end] = payload[skip:]
            self.received = end
            self.gap_reported_at = None
        return None

    def command(self, value):
        """One control point write; returns the reply notification."""
        if not value:
            return bytes([0x80, 0x00, 0x02])
        op = value[0]
        lengths = {1: 15, 2: 9, 3: 1, 4: 1, 5: 1, 6: 1}
        if op not in lengths:
            return bytes([0x80, op, 0x01])
        if len(value) != lengths[op]:
            return bytes([0x80, op, 0x02])

        def reply(status, payload=b""):
            return bytes([0x80, op, status]) + payload

        if op == 1:  # BEGIN
            version, size, image_crc, fw, flags = struct.unpack_from("<BIIIB", value, 1)
            if version != 1:
                return reply(0x0B)
            if size == 0:
                return reply(0x0C)
            if size > self.slot_size:
                return reply(0x04)
            self.gap_reported_at = None
            if self.pending == (size, image_crc, fw) and not (flags & 1):
                self.state = self.RECEIVING
                return reply(0x00, u32(self.received) + u32(self.prefix_crc(self.received)))
            self.pending = (size, image_crc, fw)
            self.flash = bytearray(size)
            self.received = 0
            self.committed = 0
            self.state = self.RECEIVING
            return reply(0x00, u32(0) + u32(0))
        if op == 2:  # CHECKPOINT
            offset, expected = struct.unpack_from("<II", value, 1)
            if self.state != self.RECEIVING:
                return reply(0x03)
            self.gap_reported_at = None
            if offset > self.received:
                return reply(0x05, u32(self.received) + u32(self.prefix_crc(self.received)))
            if self.prefix_crc(offset) == expected:
                self.received = offset
                self.committed = offset
                return reply(0x00, u32(offset) + u32(expected))
            self.received = self.committed
            return reply(0x06, u32(self.committed) + u32(self.prefix_crc(self.committed)))
        if op == 3:  # STATUS
            size, image_crc = (self.pending[0], self.pending[1]) if self.pending else (0, 0)
            received = self.received if self.pending else 0
            return reply(0x00, bytes([self.state]) + u32(received) + u32(self.prefix_crc(received))
                         + u32(size) + u32(image_crc))
        if op == 4:  # VERIFY
            if not self.pending:
                return reply(0x03)
            size, image_crc, _ = self.pending
            if self.received < size:
                return reply(0x0A, u32(self.prefix_crc(self.received)))
            computed = crc(self.flash[:size])
            if computed == image_crc:
                self.state = self.VERIFIED
                return reply(0x00, u32(computed))
            self.discard()
            return reply(0x06, u32(computed))
        if op == 5:  # ACTIVATE
            if self.state != self.VERIFIED:
                return reply(0x07)
            size, image_crc, fw = self.pending
            if crc(self.flash[:size]) != image_crc:
                self.discard()
                return reply(0x06)
            if self.image_out:
                with open(self.image_out, "wb") as f:
                    f.write(bytes(self.flash[:size]))
            if fw:
                self.version = fw
            self.activated += 1
            self.discard()
            return reply(0x00)
        # ABORT
        self.discard()
        return reply(0x00)

    def discard(self):
        self.pending = None
        self.flash = bytearray()
        self.received = 0
        self.committed = 0
        self.state = self.IDLE
        self.gap_reported_at = None


class FakeBlueZ:
    def __init__(self, bus, args):
        self.bus = bus
        self.args = args
        self.log_file = open(args.log, "a") if args.log else None
        self.objects = {}  # path -> {interface: {property: Variant}}
        self.ota = OTADevice(args.slot_size, args.firmware_version, args.image_out)
        self.firmware_revision = args.firmware_revision
        # The clients (bus names) whose discovery is on, as bluetoothd keeps them: the adapter
        # discovers while any is; one joining or leaving restarts the scan.
        self.discovery_clients = set()
        self.data_bytes = 0
        self.disconnect_done = False
        self.socket_packets = 0
        self.writevalue_packets = 0
        self.acquired = None  # (our end, client end)
        self.adapter = "/org/bluez/hci0"
        self.device = "%s/dev_%s" % (self.adapter, args.address.replace(":", "_"))
        self.other = "%s/dev_%s" % (self.adapter, "11_22_33_44_55_66")
        self.gatt_paths = []
        self.chars = {}  # path -> uuid
        self.agents = []  # (bus name, path), the default first
        self.remove_failures = 0
        self.build()

    # ---- object tree ----

    def log(self, line):
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def build(self):
        a = self.args
        self.objects["/org/bluez"] = {AGENT_MANAGER: {}}
        if not a.no_adapter:
            self.objects[self.adapter] = {ADAPTER: {
                "Address": Variant("s", "00:AA:01:00:00:01"), "Name": Variant("s", "fake-hci0"),
                "Alias": Variant("s", "fake-hci0"), "Powered": Variant("b", not a.adapter_off),
                "Discovering": Variant("b", False), "UUIDs": Variant("as", []),
            }}
            self.objects["/org/bluez/hci1"] = {ADAPTER: {
                "Address": Variant("s", "00:AA:01:00:00:02"), "Name": Variant("s", "fake-hci1"),
                "Alias": Variant("s", "fake-hci1"), "Powered": Variant("b", False),
                "Discovering": Variant("b", False), "UUIDs": Variant("as", []),
            }}
            if not a.no_device and not a.device_hidden_until_scan:
                self.objects[self.device] = {DEVICE: self.device_properties()}
            self.objects[self.other] = {DEVICE: {
                "Address": Variant("s", "11:22:33:44:55:66"), "AddressType": Variant("s", "random"),
                "Name": Variant("s", "Other thing"), "Alias": Variant("s", "Other thing"),
                "RSSI": Variant("n", -80), "UUIDs": Variant("as", [sig("180f")]),
                "Connected": Variant("b", False), "ServicesResolved": Variant("b", False),
                "Paired": Variant("b", False), "Adapter": Variant("o", self.adapter),
            }}

    def device_properties(self):
        uuids = [OTA_SERVICE, DIS_SERVICE] if not self.args.no_ota_service else [DIS_SERVICE]
        return {
            "Address": Variant("s", self.args.address), "AddressType": Variant("s", "random"),
            "Name": Variant("s", self.args.name), "Alias": Variant("s", self.args.name),
            "RSSI": Variant("n", -50), "UUIDs": Variant("as", uuids),
            "Connected": Variant("b", False), "ServicesResolved": Variant("b", False),
            "Paired": Variant("b", False), "Adapter": Variant("o", self.adapter),
        }

    def gatt_objects(self):
        mtu = self.args.mtu
        objs = []

        def service(handle, uuid):
            path = "%s/service%04x" % (self.device, handle)
            objs.append((path, {SERVICE: {
                "UUID": Variant("s", uuid), "Primary": Variant("b", True), "Device": Variant("o", self.device),
            }}))
            return path

        def char(service_path, handle, uuid, flags, value=b""):
            path = "%s/char%04x" % (service_path, handle)
            props = {
                "UUID": Variant("s", uuid), "Service": Variant("o", service_path), "Value": Variant("ay", bytes(value)),
                "Flags": Variant("as", flags), "MTU": Variant("q", mtu),
            }
            if "notify" in flags:
                props["Notifying"] = Variant("b", False)
            if "write-without-response" in flags:
                props["WriteAcquired"] = Variant("b", False)
            objs.append((path, {CHARACTERISTIC: props}))
            self.chars[path] = uuid
            return path

        dis = service(0x000A, DIS_SERVICE)
        char(dis, 0x000B, DIS_MANUFACTURER, ["read"])
        char(dis, 0x000D, DIS_MODEL, ["read"])
        char(dis, 0x000F, DIS_FIRMWARE, ["read"])
        if not self.args.no_ota_service:
            ota = service(0x0010, OTA_SERVICE)
            self.cp = char(ota, 0x0011, OTA_CONTROL, ["write", "notify"])
            self.data_path = char(ota, 0x0014, OTA_DATA, ["write-without-response"])
            self.info_path = char(ota, 0x0016, OTA_INFO, ["read"])
        return objs

    def export(self, path, interfaces):
        self.objects[path] = interfaces
        self.signal("/", OM, "InterfacesAdded", "oa{sa{sv}}", [path, interfaces])

    def unexport(self, path):
        interfaces = self.objects.pop(path, None)
        if interfaces is not None:
            self.signal("/", OM, "InterfacesRemoved", "oas", [path, list(interfaces)])

    def signal(self, path, interface, member, signature, body):
        self.bus.send(Message.new_signal(path, interface, member, signature, body))

    def set_props(self, path, interface, changes, emit=True):
        props = self.objects[path][interface]
        for name, value in changes.items():
            props[name] = value
        if emit:
            self.signal(path, PROPS, "PropertiesChanged", "sa{sv}as", [interface, changes, []])

    # ---- dispatch ----

    def handle(self, msg):
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        path, interface, member = msg.path, msg.interface, msg.member
        if interface == "org.freedesktop.DBus.Introspectable":
            return Message.new_method_return(msg, "s", ["<node/>"])
        if interface == OM and member == "GetManagedObjects":
            if path != "/":
                raise DBusError("org.freedesktop.DBus.Error.UnknownMethod", "no object manager at " + path)
            return Message.new_method_return(msg, "a{oa{sa{sv}}}", [self.objects])
        if path not in self.objects:
            raise DBusError("org.freedesktop.DBus.Error.UnknownObject", "no object at " + path)
        if interface == PROPS:
            return self.properties(msg)
        if interface not in self.objects[path]:
            raise DBusError("org.freedesktop.DBus.Error.UnknownMethod", "%s.%s not at %s" % (interface, member, path))
        if not (member == "WriteValue" and self.chars.get(path) == OTA_DATA):
            self.log("%s %s" % (member, path))
        handler = {
            (ADAPTER, "SetDiscoveryFilter"): self.set_discovery_filter,
            (ADAPTER, "StartDiscovery"): self.start_discovery,
            (ADAPTER, "StopDiscovery"): self.stop_discovery,
            (ADAPTER, "RemoveDevice"): self.remove_device,
            (AGENT_MANAGER, "RegisterAgent"): self.register_agent,
            (AGENT_MANAGER, "RequestDefaultAgent"): self.request_default_agent,
            (AGENT_MANAGER, "UnregisterAgent"): self.unregister_agent,
            (DEVICE, "Connect"): self.connect,
            (DEVICE, "Disconnect"): self.disconnect_call,
            (CHARACTERISTIC, "ReadValue"): self.read_value,
            (CHARACTERISTIC, "WriteValue"): self.write_value,
            (CHARACTERISTIC, "StartNotify"): self.start_notify,
            (CHARACTERISTIC, "StopNotify"): self.stop_notify,
            (CHARACTERISTIC, "AcquireWrite"): self.acquire_write,
        }.get((interface, member))
        if handler is None:
            raise DBusError("org.freedesktop.DBus.Error.UnknownMethod", "%s.%s is not implemented by the fake" % (interface, member))
        return handler(msg)

    def properties(self, msg):
        if msg.member == "Get":
            interface, name = msg.body
            props = self.objects[msg.path].get(interface)
            if props is None or name not in props:
                raise DBusError("org.freedesktop.DBus.Error.InvalidArgs", "No such property '%s'" % name)
            return Message.new_method_return(msg, "v", [props[name]])
        if msg.member == "GetAll":
            props = self.objects[msg.path].get(msg.body[0], {})
            return Message.new_method_return(msg, "a{sv}", [props])
        raise DBusError("org.freedesktop.DBus.Error.PropertyReadOnly", "read-only in the fake")

    # ---- AgentManager1 (doc/org.bluez.AgentManager.rst) ----

    def register_agent(self, msg):
        self.log("RegisterAgent %s %s" % (msg.body[0], msg.body[1]))
        self.agents.append((msg.sender, msg.body[0]))
        return Message.new_method_return(msg)

    def request_default_agent(self, msg):
        agent = (msg.sender, msg.body[0])
        if agent in self.agents:
            self.agents.remove(agent)
        self.agents.insert(0, agent)
        return Message.new_method_return(msg)

    def unregister_agent(self, msg):
        self.agents = [a for a in self.agents if a != (msg.sender, msg.body[0])]
        return Message.new_method_return(msg)

    # ---- Adapter1 ----

    def remove_device(self, msg):
        if self.remove_failures < self.args.remove_device_fails:
            self.remove_failures += 1
            self.log("RemoveDevice failed (%d)" % self.remove_failures)
            if self.args.restart_on_remove_failure:
                # bluetoothd dies during the call, and comes back a moment later.
                asyncio.get_running_loop().create_task(self.restart(msg))
                return True
            raise bluez_error("Failed", "fake RemoveDevice failure")
        path = msg.body[0]
        self.log("RemoveDevice done")
        if path in self.objects and DEVICE in self.objects[path]:
            self.drop_link("removed")
            self.set_props(path, DEVICE, {"Paired": Variant("b", False), "Bonded": Variant("b", False)})
        return Message.new_method_return(msg)

    async def restart(self, msg):
        await self.bus.release_name("org.bluez")
        self.log("bluetoothd gone")
        self.bus.send(Message.new_error(msg, "org.freedesktop.DBus.Error.NoReply",
                                        "Message recipient disconnected from message bus without replying"))
        await asyncio.sleep(0.5)
        await self.bus.request_name("org.bluez")
        self.log("bluetoothd back")

    def set_discovery_filter(self, msg):
        options = msg.body[0]
        transport = options.get("Transport")
        if transport is not None and transport.value not in ("le", "bredr", "auto"):
            raise bluez_error("InvalidArguments", "Invalid arguments in method call")
        uuids = options.get("UUIDs")
        self.log("filter transport=%s uuids=%s" % (transport.value if transport else None,
                                                   ",".join(uuids.value) if uuids else ""))
        return Message.new_method_return(msg)

    @property
    def discovering(self):
        return bool(self.discovery_clients)

    def start_discovery(self, msg):
        props = self.objects[msg.path][ADAPTER]
        if not props["Powered"].value:
            raise bluez_error("NotReady", "Resource Not Ready")
        if msg.path == self.adapter:
            if msg.sender in self.discovery_clients:
                raise bluez_error("InProgress", "Operation already in progress")
            self.discovery_clients.add(msg.sender)
            self.set_props(msg.path, ADAPTER, {"Discovering": Variant("b", True)})
            # The scan (re)starts: a controller that filters duplicates reports again.
            asyncio.get_running_loop().call_later(0.1, self.advertise)
        return Message.new_method_return(msg)

    def advertise(self):
        if not self.discovering or self.args.no_device:
            return
        if self.device not in self.objects:
            self.export(self.device, {DEVICE: self.device_properties()})
        else:
            self.set_props(self.device, DEVICE, {"RSSI": Variant("n", -42)})

    def stop_discovery(self, msg):
        if msg.path != self.adapter or msg.sender not in self.discovery_clients:
            raise bluez_error("Failed", "No discovery started")
        self.discovery_clients.discard(msg.sender)
        if self.discovering:
            asyncio.get_running_loop().call_later(0.1, self.advertise)
        else:
            self.set_props(msg.path, ADAPTER, {"Discovering": Variant("b", False)})
        return Message.new_method_return(msg)

    # ---- Device1 ----

    def connect(self, msg):
        if msg.path != self.device:
            raise bluez_error("Failed", "le-connection-abort-by-local")
        if self.args.connect_error:
            name, _, text = self.args.connect_error.partition(":")
            raise bluez_error(name, text or "le-connection-abort-by-local")
        props = self.objects[self.device][DEVICE]
        if props["Connected"].value:
            raise bluez_error("AlreadyConnected", "Already Connected")
        # Like bluetoothd 5.66 seen under a virtual controller: Connected becomes true without a
        # PropertiesChanged (unless --emit-connected).
        self.set_props(self.device, DEVICE, {"Connected": Variant("b", True)}, emit=self.args.emit_connected)
        loop = asyncio.get_running_loop()
        if self.args.resolve_before_export:
            loop.call_later(0.02, self.services_resolved)
            loop.call_later(0.3, self.export_gatt)
        else:
            loop.call_later(0.02, self.export_gatt)
            loop.call_later(0.05, self.services_resolved)
        return Message.new_method_return(msg)

    def export_gatt(self):
        if not self.objects.get(self.device, {}).get(DEVICE, {}).get("Connected", Variant("b", False)).value:
            return
        for path, interfaces in self.gatt_objects():
            self.export(path, interfaces)
            self.gatt_paths.append(path)

    def services_resolved(self):
        if self.objects.get(self.device, {}).get(DEVICE, {}).get("Connected", Variant("b", False)).value:
            if not self.args.never_resolve:
                self.set_props(self.device, DEVICE, {"ServicesResolved": Variant("b", True)})

    def disconnect_call(self, msg):
        self.drop_link("local")
        return Message.new_method_return(msg)

    def drop_link(self, why):
        if self.device not in self.objects:
            return
        props = self.objects[self.device][DEVICE]
        if not props["Connected"].value:
            return
        self.log("link down " + why)
        self.release_socket()
        self.set_props(self.device, DEVICE, {"ServicesResolved": Variant("b", False)})
        for path in reversed(self.gatt_paths):
            self.unexport(path)
        self.gatt_paths = []
        self.set_props(self.device, DEVICE, {"Connected": Variant("b", False)})

    # ---- GattCharacteristic1 ----

    def check_link(self, path):
        if path not in self.objects:
            raise DBusError("org.freedesktop.DBus.Error.UnknownObject", "no object at " + path)

    def gatt_error(self, msg, op):
        if self.args.gatt_error and self.chars.get(msg.path) in (OTA_CONTROL, OTA_DATA, OTA_INFO) \
                and op in self.args.gatt_error_ops.split(","):
            texts = {"NotPermitted": "Not paired", "NotAuthorized": "Operation Not Authorized",
                     "InProgress": "In Progress"}
            raise bluez_error(self.args.gatt_error, texts.get(self.args.gatt_error, "failed"))

    def read_value(self, msg):
        self.gatt_error(msg, "read")
        uuid = self.chars.get(msg.path)
        values = {
            DIS_MANUFACTURER: b"otaflash fake devices", DIS_MODEL: b"FakeOTA-1",
            DIS_FIRMWARE: self.firmware_revision.encode(),
        }
        if uuid == OTA_INFO:
            value = self.ota.info()
        elif uuid in values:
            value = values[uuid]
        else:
            raise bluez_error("NotPermitted", "Read not permitted")
        return Message.new_method_return(msg, "ay", [value])

    def write_value(self, msg):
        value, options = msg.body
        kind = options["type"].value if "type" in options else "request"
        flags = self.objects[msg.path][CHARACTERISTIC]["Flags"].value
        needed = "write-without-response" if kind == "command" else "write"
        if needed not in flags:
            raise bluez_error("NotSupported", "Operation is not supported (no %s)" % needed)
        uuid = self.chars.get(msg.path)
        if uuid == OTA_DATA:
            if self.acquired is not None:
                raise bluez_error("NotPermitted", "Write acquired")
            self.gatt_error(msg, "write")
            self.writevalue_packets += 1
            reply = Message.new_method_return(msg)
            self.bus.send(reply)
            self.data_packet(bytes(value))
            return True
        if uuid == OTA_CONTROL:
            self.gatt_error(msg, "write")
            if kind != "request":
                raise bluez_error("NotSupported", "control point writes need a response")
            if self.args.busy_with_another_central and value and value[0] != 3:
                # Another central owns the transfer: the device fails the write with ATT
                # application error 0x89 (docs/PROTOCOL.md, "One transfer at a time"), which
                # bluetoothd reports as src/gatt-client.c create_gatt_dbus_error does.
                self.log("command %02x -> ATT error 0x89" % value[0])
                raise bluez_error("Failed", "Operation failed with ATT error: 0x89")
            # Everything written on the socket before this request is handled first
            # (BlueZ sends queued write commands before a request: src/shared/att.c).
            self.drain_socket()
            if self.device not in self.objects or not self.objects[self.device][DEVICE]["Connected"].value:
                raise bluez_error("NotConnected", "Not Connected")
            notification = self.ota.command(bytes(value))
            self.log("command %02x -> %s" % (value[0] if value else 0, notification.hex()))
            if value and value[0] == 5 and notification[2] == 0:
                self.log("ACTIVATED socket_packets=%d writevalue_packets=%d" % (self.socket_packets, self.writevalue_packets))
                self.firmware_revision = "%d.%d.%d" % (self.ota.version >> 24, (self.ota.version >> 16) & 0xFF,
                                                       self.ota.version & 0xFFFF)
            self.bus.send(Message.new_method_return(msg))
            self.notify(self.cp, notification)
            return True
        raise bluez_error("NotPermitted", "Write not permitted")

    def notify(self, path, value):
        props = self.objects.get(path, {}).get(CHARACTERISTIC)
        if props is None or not props.get("Notifying", Variant("b", False)).value:
            return
        self.set_props(path, CHARACTERISTIC, {"Value": Variant("ay", bytes(value))})

    def start_notify(self, msg):
        self.gatt_error(msg, "notify")
        props = self.objects[msg.path][CHARACTERISTIC]
        device = self.objects[self.device][DEVICE]
        if self.args.stack_pairs and self.chars.get(msg.path) == OTA_CONTROL and not device["Paired"].value:
            # The device refuses the CCCD write for want of security; bluetoothd raises the
            # link's security level and its stack pairs Just Works by itself (Paired turns true).
            self.log("stack pairs by itself")
            self.set_props(self.device, DEVICE, {"Paired": Variant("b", True), "Bonded": Variant("b", True)})
            if self.args.stack_pairs == "passkey":
                # ... and, the device wanting an authenticated key, asks the default agent for a passkey.
                asyncio.get_running_loop().create_task(self.ask_passkey(msg))
                return True
        if "Notifying" not in props:
            raise bluez_error("NotSupported", "Operation is not supported")
        self.set_props(msg.path, CHARACTERISTIC, {"Notifying": Variant("b", True)})
        return Message.new_method_return(msg)

    async def ask_passkey(self, msg):
        answered = False
        if self.agents:
            owner, path = self.agents[0]
            reply = await self.bus.call(Message(destination=owner, path=path, interface="org.bluez.Agent1",
                                                member="RequestPasskey", signature="o", body=[self.device]))
            self.log("agent RequestPasskey -> %s" % (reply.error_name or "answered"))
            answered = reply.message_type == MessageType.METHOD_RETURN
        if not answered:
            # The held CCCD write fails when the pairing does (much later on a real stack).
            await asyncio.sleep(self.args.stack_pairing_fails_after)
            self.bus.send(Message.new_error(msg, "org.bluez.Error.Failed", "Operation failed with ATT error: 0x05"))
            return
        self.set_props(msg.path, CHARACTERISTIC, {"Notifying": Variant("b", True)})
        self.bus.send(Message.new_method_return(msg))

    def stop_notify(self, msg):
        props = self.objects[msg.path][CHARACTERISTIC]
        if "Notifying" in props:
            self.set_props(msg.path, CHARACTERISTIC, {"Notifying": Variant("b", False)})
        return Message.new_method_return(msg)

    def acquire_write(self, msg):
        flags = self.objects[msg.path][CHARACTERISTIC]["Flags"].value
        if self.args.no_acquire_write:
            name, _, text = self.args.no_acquire_write.partition(":")
            raise bluez_error(name, text or "Operation is not supported")
        if "write-without-response" not in flags:
            raise bluez_error("NotSupported", "Operation is not supported")
        if self.acquired is not None:
            raise bluez_error("NotPermitted", "Write acquired")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        # A small receive queue makes the central meet EAGAIN and wait for POLLOUT.
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        self.acquired = (ours, theirs)
        asyncio.get_running_loop().add_reader(ours.fileno(), self.drain_socket)
        self.set_props(msg.path, CHARACTERISTIC, {"WriteAcquired": Variant("b", True)})
        return Message.new_method_return(msg, "hq", [0, self.args.mtu], [theirs.fileno()])

    def drain_socket(self):
        if self.acquired is None:
            return
        ours = self.acquired[0]
        while self.acquired is not None:
            try:
                packet = ours.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                self.release_socket()
                return
            if not packet:
                self.log("write socket closed by the central")
                self.release_socket()
                return
            self.socket_packets += 1
            self.data_packet(packet)

    def release_socket(self):
        if self.acquired is None:
            return
        ours, theirs = self.acquired
        self.acquired = None
        try:
            asyncio.get_running_loop().remove_reader(ours.fileno())
        except Exception:
            pass
        ours.close()
        theirs.close()
        if hasattr(self, "data_path") and self.data_path in self.objects:
            self.set_props(self.data_path, CHARACTERISTIC, {"WriteAcquired": Variant("b", False)})

    def data_packet(self, packet):
        event = self.ota.data(packet)
        if event is not None:
            self.notify(self.cp, event)
        self.data_bytes += max(0, len(packet) - 4)
        if self.args.disconnect_after and not self.disconnect_done and self.data_bytes >= self.args.disconnect_after:
            self.disconnect_done = True
            asyncio.get_running_loop().call_soon(self.drop_link, "after %d bytes" % self.data_bytes)


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bus", required=True, help="D-Bus address of the (private) bus")
    p.add_argument("--address", default="C0:FF:EE:00:00:01")
    p.add_argument("--name", default="OTA-Fake")
    p.add_argument("--mtu", type=int, default=247)
    p.add_argument("--slot-size", type=int, default=2 * 1024 * 1024)
    p.add_argument("--firmware-version", type=lambda s: int(s, 0), default=0x01000000)
    p.add_argument("--firmware-revision", default="1.0.0")
    p.add_argument("--image-out", help="write the activated image here")
    p.add_argument("--log", help="append one line per method call here")
    p.add_argument("--no-adapter", action="store_true", help="export no Adapter1 at all")
    p.add_argument("--adapter-off", action="store_true", help="hci0 is powered off (hci1 always is)")
    p.add_argument("--no-device", action="store_true", help="the device never shows up")
    p.add_argument("--device-hidden-until-scan", action="store_true", help="the device appears only after StartDiscovery")
    p.add_argument("--connect-error", help="Connect fails with org.bluez.Error.NAME[:text]")
    p.add_argument("--emit-connected", action="store_true", help="emit PropertiesChanged(Connected=true) on Connect")
    p.add_argument("--resolve-before-export", action="store_true", help="ServicesResolved=true before the GATT objects exist")
    p.add_argument("--never-resolve", action="store_true", help="ServicesResolved never becomes true")
    p.add_argument("--no-ota-service", action="store_true")
    p.add_argument("--gatt-error", choices=["NotPermitted", "NotAuthorized", "InProgress"],
                   help="OTA characteristic operations fail with org.bluez.Error.NAME")
    p.add_argument("--gatt-error-ops", default="notify,read,write", help="which operations --gatt-error hits")
    p.add_argument("--busy-with-another-central", action="store_true",
                   help="control point writes other than STATUS fail with ATT error 0x89 (busy)")
    p.add_argument("--no-acquire-write", nargs="?", const="NotSupported",
                   help="AcquireWrite fails with org.bluez.Error.NAME[:text] (default NotSupported)")
    p.add_argument("--stack-pairs", choices=["justworks", "passkey"],
                   help="enabling notifications on the control point while unpaired: the stack pairs Just Works "
                        "by itself (Paired turns true); with passkey it then asks the default agent for a passkey")
    p.add_argument("--stack-pairing-fails-after", type=float, default=20.0,
                   help="seconds until a refused stack pairing fails the held StartNotify")
    p.add_argument("--remove-device-fails", type=int, default=0, help="the first N RemoveDevice calls fail")
    p.add_argument("--restart-on-remove-failure", action="store_true",
                   help="a failing RemoveDevice goes unanswered: the fake releases org.bluez and takes it again 0.5 s later")
    p.add_argument("--disconnect-after", type=int, default=0, help="drop the link once after N data bytes")
    args = p.parse_args()

    bus = await MessageBus(bus_address=args.bus, negotiate_unix_fd=True).connect()
    fake = FakeBlueZ(bus, args)
    bus.add_message_handler(fake.handle)
    await bus.request_name("org.bluez")
    print("READY", flush=True)
    await bus.wait_for_disconnect()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
