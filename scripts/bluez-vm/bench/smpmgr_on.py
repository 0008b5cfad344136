"""Runs smpmgr with bleak's default adapter pinned to one adapter.

smpmgr has no adapter option: bleak scans on, and connects from, "the first powered adapter"
(BlueZManager.get_default_adapter), taken from a set, so with several adapters in one VM it may
pick the peripheral's own. This sets it to $SMPMGR_ADAPTER (e.g. hci0), then runs smpmgr's own
command line unchanged:

    SMPMGR_ADAPTER=hci0 $VENV/bin/python smpmgr_on.py --ble <address> image state-read
"""
import os
import sys

from bleak.backends.bluezdbus.manager import BlueZManager

adapter = os.environ.get("SMPMGR_ADAPTER")
if not adapter:
    sys.exit("smpmgr_on.py: set SMPMGR_ADAPTER to the adapter smpmgr must use, e.g. hci0")
path = "/org/bluez/" + adapter


def pinned_adapter(self: BlueZManager) -> str:
    if path not in self._adapters:
        raise RuntimeError(f"smpmgr_on.py: {path} is not an adapter bluetoothd knows ({sorted(self._adapters)})")
    return path


BlueZManager.get_default_adapter = pinned_adapter

from smpmgr.main import app  # noqa: E402  (after the patch, as smpmgr's own script does)

sys.argv[0] = "smpmgr"
sys.exit(app())
