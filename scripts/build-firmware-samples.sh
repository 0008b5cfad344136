#!/usr/bin/env bash
# Rebuild the firmware sample set in firmware-samples/ from the sources in
# firmware-samples/src/, deterministically, and rewrite its manifest.json.
#
#   scripts/build-firmware-samples.sh           rebuild and overwrite the samples
#   scripts/build-firmware-samples.sh --check   rebuild into a temp dir and fail
#                                               if any committed sample differs
#
# Needs arm-none-eabi-gcc/binutils and python3 >= 3.9; installs the Debian
# packages itself (as root) when they are missing.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SAMPLES_DIR="$REPO_ROOT/firmware-samples"
SRC_DIR="$SAMPLES_DIR/src"
TOOL="$SRC_DIR/tools/samples.py"

# Same locale and permissions on every run, so nothing varies with the caller.
export LC_ALL=C
umask 022

die() {
    echo "build-firmware-samples: error: $*" >&2
    exit 1
}

log() {
    echo "build-firmware-samples: $*"
}

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

MODE=build
case "${1:-}" in
    "") ;;
    --check) MODE=check ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
esac
[ $# -le 1 ] || die "too many arguments"

# Install the cross toolchain and Python when any tool is missing.
ensure_tools() {
    local missing=()
    local t
    for t in arm-none-eabi-gcc arm-none-eabi-objcopy arm-none-eabi-readelf python3; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "missing: ${missing[*]}; installing Debian packages"
        [ "$(id -u)" -eq 0 ] || die "need root to install gcc-arm-none-eabi binutils-arm-none-eabi python3 (missing: ${missing[*]})"
        command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install an arm-none-eabi toolchain and python3 by hand"
        apt-get update || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            gcc-arm-none-eabi binutils-arm-none-eabi python3 \
            || die "apt-get install failed"
        for t in "${missing[@]}"; do
            command -v "$t" >/dev/null 2>&1 || die "$t still missing after install"
        done
    fi
    python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
        || die "python3 >= 3.9 is required (found $(python3 --version 2>&1))"
}

# Compile and link the blinky ELF into $1, then extract .bin and .hex into $2.
build_blinky() {
    local elf_dir="$1" out_dir="$2"
    local elf="$elf_dir/blinky-cortex-m4.elf"
    mkdir -p "$elf_dir"
    # Build from inside the source dir with relative paths, and map the
    # absolute path away, so no checkout location ends up in the ELF.
    (
        cd "$SRC_DIR/blinky"
        arm-none-eabi-gcc \
            -mcpu=cortex-m4 -mthumb -mfloat-abi=soft \
            -std=c11 -Os -g -Wall -Wextra -Werror \
            -ffreestanding -nostdlib \
            -fno-tree-loop-distribute-patterns \
            -ffunction-sections -fdata-sections \
            -ffile-prefix-map="$PWD"=. \
            -T link.ld -Wl,--gc-sections -Wl,--build-id=none \
            -o "$elf" blinky.c
    ) || die "compiling the blinky sample failed"
    arm-none-eabi-objcopy -O binary --gap-fill 0xff "$elf" "$out_dir/blinky-cortex-m4.bin" \
        || die "objcopy -O binary failed"
    arm-none-eabi-objcopy -O ihex "$elf" "$out_dir/blinky-cortex-m4.hex" \
        || die "objcopy -O ihex failed"
    # objcopy copies the ELF's executable bit; samples are plain data files.
    chmod 0644 "$out_dir/blinky-cortex-m4.bin" "$out_dir/blinky-cortex-m4.hex"
    verify_elf "$elf"
    python3 "$TOOL" check-blinky "$out_dir/blinky-cortex-m4.bin" "$out_dir/blinky-cortex-m4.hex"
}

# The ELF must be a 32-bit little-endian ARM EABI5 soft-float image for an
# ARMv7E-M microcontroller profile core (Cortex-M4).
verify_elf() {
    local elf="$1" hdr attrs
    hdr="$(arm-none-eabi-readelf -h "$elf")"
    attrs="$(arm-none-eabi-readelf -A "$elf")"
    grep -Eq 'Class:[[:space:]]+ELF32' <<<"$hdr" || die "$elf is not ELF32"
    grep -Eq 'Machine:[[:space:]]+ARM$' <<<"$hdr" || die "$elf is not an ARM ELF"
    grep -q 'Version5 EABI' <<<"$hdr" || die "$elf is not EABI version 5"
    grep -q 'Tag_CPU_arch: v7E-M' <<<"$attrs" || die "$elf is not built for ARMv7E-M"
    grep -q 'Tag_CPU_arch_profile: Microcontroller' <<<"$attrs" || die "$elf is not M-profile"
    log "ELF check: ELF32 ARM EABI5, v7E-M, Microcontroller profile"
}

# Build every sample and the manifest into $2 (ELF kept in $1).
build_all() {
    local elf_dir="$1" out_dir="$2"
    mkdir -p "$out_dir"
    build_blinky "$elf_dir" "$out_dir"
    python3 "$TOOL" seeded "$out_dir" || die "generating seeded images failed"
    python3 "$TOOL" manifest "$out_dir" || die "writing manifest.json failed"
}

# Files the build produces, as listed in the freshly written manifest.
produced_files() {
    python3 -c 'import json,sys; [print(e["file"]) for e in json.load(open(sys.argv[1]))["files"]]' \
        "$1/manifest.json"
    echo manifest.json
}

ensure_tools

if [ "$MODE" = build ]; then
    # The ELF is a build by-product kept for inspection (ignored by git).
    build_all "$SAMPLES_DIR/build" "$SAMPLES_DIR"
    log "wrote:"
    (cd "$SAMPLES_DIR" && produced_files . | xargs sha256sum)
else
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    build_all "$TMP/elf" "$TMP/out"
    status=0
    while IFS= read -r f; do
        if [ ! -f "$SAMPLES_DIR/$f" ]; then
            echo "build-firmware-samples: MISSING $f (not committed)" >&2
            status=1
        elif ! cmp -s "$TMP/out/$f" "$SAMPLES_DIR/$f"; then
            echo "build-firmware-samples: DIFFERS $f" >&2
            status=1
        fi
    done < <(produced_files "$TMP/out")
    [ "$status" -eq 0 ] || die "committed samples are out of date; run scripts/build-firmware-samples.sh"
    log "check passed: committed samples match a fresh build"
fi
