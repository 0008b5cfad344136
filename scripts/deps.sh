#!/usr/bin/env bash
# Installs the system packages otaflash builds and tests against, when any is missing.
# Sourced by scripts/demo and scripts/test; safe to run on its own.
set -euo pipefail

# python3-dbus-fast runs the fake bluetoothd of the BlueZ tests (Tests/BlueZTests/fake_bluez);
# python3-venv is for scripts/bench's bleak; postgresql for the PostgreSQL ledger's tests (scripts/pg-server);
# prometheus for promtool, which checks `station --metrics` (Tests/CLITests/MetricsTests.swift).
otaflash_packages=(libdbus-1-dev dbus-daemon zlib1g-dev libsqlite3-dev sqlite3 pkg-config python3 python3-dbus-fast python3-venv postgresql prometheus)

otaflash_install_deps() {
    local missing=()
    for p in "${otaflash_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then otaflash_install_deps; fi
