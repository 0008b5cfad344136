#!/usr/bin/env python3
"""Generate, describe and check the firmware sample set.

Subcommands (all paths are explicit so the build script can target a temp dir):

  seeded OUTDIR            write the seeded pseudo-random images
  manifest OUTDIR          write OUTDIR/manifest.json for every sample present
  check-blinky BIN HEX     check the blinky vector table and that BIN == decoded HEX
  decode-hex HEX           print base address, size and CRC32 of a decoded HEX

Only the standard library is used. Python >= 3.9 is required for
random.Random.randbytes, whose output for a given integer seed is stable.
"""

import json
import os
import random
import struct
import sys
import zlib

# Seeded images: (file name, size in bytes, seed). The seed is the size itself,
# so each image is reproducible from its name alone.
SEEDED = [
    ("seeded-4k.bin", 4 * 1024, 4 * 1024),
    ("seeded-256k.bin", 256 * 1024, 256 * 1024),
    ("seeded-1m.bin", 1024 * 1024, 1024 * 1024),
]

# Intel HEX copy of one seeded image, to exercise a HEX loader on a file that
# spans several 64 KiB segments: (hex file, source bin, base address, record length).
SEEDED_HEX = [("seeded-256k.hex", "seeded-256k.bin", 0x00000000, 32)]

BLINKY_FLASH_BASE = 0x08000000
BLINKY_RAM = (0x20000000, 0x20000000 + 128 * 1024)

# Manifest order and descriptions. Files missing from OUTDIR are an error.
DESCRIPTIONS = [
    ("blinky-cortex-m4.bin",
     "Cortex-M4 blinky (STM32F407-style, toggles PD12), version 1.0.0; "
     "raw image for flash at 0x08000000"),
    ("blinky-cortex-m4.hex",
     "Same blinky as Intel HEX (objcopy, 16-byte records, CRLF, type-04 and type-05 records)"),
    ("seeded-4k.bin", "4 KiB pseudo-random image, random.Random(4096).randbytes(4096)"),
    ("seeded-256k.bin", "256 KiB pseudo-random image, random.Random(262144).randbytes(262144)"),
    ("seeded-1m.bin", "1 MiB pseudo-random image, random.Random(1048576).randbytes(1048576)"),
    ("seeded-256k.hex",
     "seeded-256k.bin as Intel HEX at 0x00000000, 32-byte records, LF, type-04 record every 64 KiB"),
]


def fail(msg):
    sys.stderr.write("samples.py: error: %s\n" % msg)
    sys.exit(1)


def write_bytes(path, data):
    # Write via a temp name so a failed run never leaves a half-written sample.
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def ihex_record(rtype, addr16, payload):
    body = bytes([len(payload), (addr16 >> 8) & 0xFF, addr16 & 0xFF, rtype]) + payload
    checksum = (-sum(body)) & 0xFF
    return ":" + body.hex().upper() + "%02X" % checksum


def encode_ihex(data, base, record_len):
    """Intel HEX text for `data` at `base`: data records never cross a 64 KiB
    boundary, and a type-04 record is emitted whenever the upper 16 address
    bits change (not at the start when they are zero). Ends with type 01."""
    lines = []
    upper = 0
    offset = 0
    while offset < len(data):
        addr = base + offset
        if (addr >> 16) != upper:
            upper = addr >> 16
            lines.append(ihex_record(0x04, 0, struct.pack(">H", upper)))
        # Do not let one record run past the end of the current 64 KiB segment.
        room = 0x10000 - (addr & 0xFFFF)
        n = min(record_len, len(data) - offset, room)
        lines.append(ihex_record(0x00, addr & 0xFFFF, data[offset:offset + n]))
        offset += n
    lines.append(ihex_record(0x01, 0, b""))
    return "\n".join(lines) + "\n"


def decode_ihex(text):
    """Decode Intel HEX into (lowest address, image bytes). The image runs from
    the lowest to the highest written address; gaps read as 0xFF, as erased
    flash would. Checksums, record lengths and overlaps are checked."""
    chunks = {}
    upper = 0      # from type 04 (extended linear address)
    segment = 0    # from type 02 (extended segment address)
    saw_eof = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if saw_eof:
            fail("line %d: data after end-of-file record" % lineno)
        if not line.startswith(":"):
            fail("line %d: record does not start with ':'" % lineno)
        try:
            rec = bytes.fromhex(line[1:])
        except ValueError:
            fail("line %d: not hexadecimal" % lineno)
        if len(rec) < 5 or len(rec) != rec[0] + 5:
            fail("line %d: bad record length" % lineno)
        if sum(rec) & 0xFF:
            fail("line %d: bad checksum" % lineno)
        count, addr16, rtype = rec[0], (rec[1] << 8) | rec[2], rec[3]
        payload = rec[4:4 + count]
        if rtype == 0x00:
            start = (upper << 16) + (segment << 4) + addr16
            for i, b in enumerate(payload):
                a = start + i
                if a in chunks:
                    fail("line %d: address 0x%08X written twice" % (lineno, a))
                chunks[a] = b
        elif rtype == 0x01:
            saw_eof = True
        elif rtype == 0x02:
            segment, upper = struct.unpack(">H", payload)[0], 0
        elif rtype == 0x04:
            upper, segment = struct.unpack(">H", payload)[0], 0
        elif rtype in (0x03, 0x05):
            pass  # start address records: not part of the image
        else:
            fail("line %d: unknown record type %02X" % (lineno, rtype))
    if not saw_eof:
        fail("missing end-of-file record")
    if not chunks:
        fail("no data records")
    lo, hi = min(chunks), max(chunks)
    image = bytearray(b"\xff" * (hi - lo + 1))
    for a, b in chunks.items():
        image[a - lo] = b
    return lo, bytes(image)


def crc32_hex(data):
    return "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)


def cmd_seeded(outdir):
    for name, size, seed in SEEDED:
        data = random.Random(seed).randbytes(size)
        write_bytes(os.path.join(outdir, name), data)
    for hex_name, bin_name, base, record_len in SEEDED_HEX:
        with open(os.path.join(outdir, bin_name), "rb") as f:
            data = f.read()
        text = encode_ihex(data, base, record_len)
        write_bytes(os.path.join(outdir, hex_name), text.encode("ascii"))
        # Round-trip check: the HEX must decode back to exactly the same bytes.
        lo, image = decode_ihex(text)
        if lo != base or image != data:
            fail("%s does not decode back to %s" % (hex_name, bin_name))


def cmd_manifest(outdir):
    entries = []
    for name, description in DESCRIPTIONS:
        path = os.path.join(outdir, name)
        if not os.path.isfile(path):
            fail("missing sample %s" % path)
        entry = {"file": name}
        if name.endswith(".hex"):
            with open(path, "r", encoding="ascii") as f:
                base, image = decode_ihex(f.read())
            entry["format"] = "hex"
        elif name.endswith(".bin"):
            with open(path, "rb") as f:
                image = f.read()
            base = None
            entry["format"] = "bin"
        else:
            fail("unknown format for %s" % name)
        entry["size"] = len(image)
        entry["crc32"] = crc32_hex(image)
        if base is not None:
            entry["base_address"] = "0x%08x" % base
        entry["description"] = description
        entries.append(entry)
    manifest = {"version": 1, "files": entries}
    text = json.dumps(manifest, indent=2) + "\n"
    write_bytes(os.path.join(outdir, "manifest.json"), text.encode("utf-8"))


def cmd_check_blinky(bin_path, hex_path):
    with open(bin_path, "rb") as f:
        binary = f.read()
    with open(hex_path, "r", encoding="ascii") as f:
        base, image = decode_ihex(f.read())
    if base != BLINKY_FLASH_BASE:
        fail("HEX base is 0x%08X, expected 0x%08X" % (base, BLINKY_FLASH_BASE))
    if image != binary:
        fail("%s differs from decoded %s" % (bin_path, hex_path))
    if len(binary) < 8:
        fail("image too short for a vector table")
    sp, reset = struct.unpack_from("<II", binary, 0)
    # Initial SP: inside RAM (top of RAM allowed) and 8-byte aligned per AAPCS.
    if not (BLINKY_RAM[0] < sp <= BLINKY_RAM[1]) or sp % 8:
        fail("initial SP 0x%08X is not a sane RAM address" % sp)
    # Reset vector: Thumb bit set and pointing inside the image.
    if not reset & 1:
        fail("reset vector 0x%08X lacks the Thumb bit" % reset)
    if not (base <= (reset & ~1) < base + len(binary)):
        fail("reset vector 0x%08X is outside the image" % reset)
    version = binary[0x40:binary.index(b"\0", 0x40)].decode("ascii")
    print("blinky: %d bytes at 0x%08X, crc32 %s, bin == decoded hex" %
          (len(binary), base, crc32_hex(binary)))
    print("blinky: initial SP 0x%08X (RAM top), reset vector 0x%08X (Thumb), version %r at +0x40" %
          (sp, reset, version))


def cmd_decode_hex(hex_path):
    with open(hex_path, "r", encoding="ascii") as f:
        base, image = decode_ihex(f.read())
    print("%s: base 0x%08X, %d bytes, crc32 %s" % (hex_path, base, len(image), crc32_hex(image)))


def main(argv):
    if sys.version_info < (3, 9):
        fail("Python 3.9 or newer is required (random.Random.randbytes)")
    commands = {
        "seeded": (cmd_seeded, 1),
        "manifest": (cmd_manifest, 1),
        "check-blinky": (cmd_check_blinky, 2),
        "decode-hex": (cmd_decode_hex, 1),
    }
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        fail("usage: samples.py {seeded OUTDIR | manifest OUTDIR | "
             "check-blinky BIN HEX | decode-hex HEX}")
    func, _ = commands[argv[1]]
    func(*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
