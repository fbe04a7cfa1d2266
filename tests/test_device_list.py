"""DeviceList (device_list.py): an ordered, hashable list of devices, on the real CPU plugins."""
from __future__ import annotations

import pytest

import pjrt


def test_device_list(client):
    devices = client.devices()
    device_list = pjrt.DeviceList(devices[:4])
    assert len(device_list) == 4 and list(device_list) == devices[:4]
    assert device_list[1] is devices[1] and device_list[1:3] == pjrt.DeviceList(devices[1:3])
    assert device_list == pjrt.DeviceList(devices[:4]) and hash(device_list) == hash(pjrt.DeviceList(devices[:4]))
    assert device_list != pjrt.DeviceList(devices[3::-1])
    assert device_list.is_fully_addressable
    assert device_list.addressable_device_list == device_list
    assert device_list.process_indices == {0}
    assert device_list.default_memory_kind == "device"
    assert device_list.memory_kinds[0] == "device" and "pinned_host" in device_list.memory_kinds
    assert device_list.device_kind == devices[0].device_kind


def test_device_list_rejects_bad_input(client):
    devices = client.devices()
    with pytest.raises(ValueError, match="twice"):
        pjrt.DeviceList([devices[0], devices[0]])
    with pytest.raises(ValueError, match="at least one"):
        pjrt.DeviceList([])
    with pytest.raises(TypeError, match="not int"):
        pjrt.DeviceList([0, 1])
