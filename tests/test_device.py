"""Devices and memories of a client (device.py) on the real CPU plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from conftest import TEST_DEVICE_COUNT


def test_devices(client):
    devices = client.devices()
    assert sorted(d.id for d in devices) == list(range(TEST_DEVICE_COUNT))
    for device in devices:
        assert device.platform == "cpu"
        assert device.process_index == 0 and device.host_id == 0
        assert device.client is client
        assert isinstance(device.device_kind, str) and device.device_kind
        assert repr(device) == f"CpuDevice(id={device.id})"
    # One Python object per device: usable as dict keys.
    assert client.devices()[0] is devices[0]
    assert len({d: i for i, d in enumerate(devices)}) == TEST_DEVICE_COUNT
    assert client.lookup_device(3) is devices[[d.id for d in devices].index(3)]


def test_memories(client):
    device = client.local_devices()[0]
    default = device.default_memory()
    assert default.kind == "device"
    assert default in device.addressable_memories()
    assert device.memory("device") is default
    assert device in default.addressable_by_devices()
    assert default.platform == "cpu" and default.process_index == 0
    with pytest.raises(ValueError, match="no memory of kind 'hbm'"):
        device.memory("hbm")
    assert set(client.addressable_memories()) >= set(device.addressable_memories())


def test_memory_stats_is_dict_or_none(client):
    stats = client.local_devices()[0].memory_stats()
    assert stats is None or isinstance(stats["bytes_in_use"], int)


def test_devices_and_memories_of_a_closed_client_raise(make_client):
    own = make_client(2)
    device = own.devices()[0]
    memory = device.default_memory()
    own.close()
    for use in (device.addressable_memories, device.memory_stats, device.attributes,
                device.to_string, memory.addressable_by_devices, memory.to_string):
        with pytest.raises(pjrt.ClosedClientError):
            use()


def test_device_descriptions(client):
    for device in client.devices():
        assert device.is_addressable and device.local_hardware_id == device.id
        assert isinstance(device.attributes(), dict)
        assert device.to_string() == repr(device) == str(device)
        debug = device.debug_string()
        assert isinstance(debug, str) and debug.endswith(str(device.id))


def test_every_memory_kind_holds_a_buffer(client):
    """Each addressable memory of a device takes a buffer of this value and gives it back."""
    device = client.devices()[2]
    kinds = [m.kind for m in device.addressable_memories()]
    assert kinds[0] == "device" and len(set(kinds)) == len(kinds)
    for memory in device.addressable_memories():
        assert device.memory(memory.kind) is memory
        assert memory.addressable_by_devices() == [device]
        assert isinstance(memory.to_string(), str) and memory.to_string()
        assert repr(memory) == f"Memory(id={memory.id}, kind={memory.kind!r})"
        assert str(memory) == memory.kind
        array = client.buffer_from_pyval(np.arange(5.0), device, memory=memory)
        assert array.memory_kind == memory.kind and array.device is device
        np.testing.assert_array_equal(np.asarray(array), np.arange(5.0))


def test_memory_of_another_device_is_refused(client):
    first, third = client.devices()[0], client.devices()[2]
    with pytest.raises(ValueError, match=r"is not a memory of CpuDevice\(id=0\).*addressable_memories"):
        client.buffer_from_pyval(np.ones(2), first, memory=third.default_memory())


def test_devices_and_memories_are_one_object_per_handle(client, make_client):
    """The same PJRT device is the same Python object, so it works as a dict key; another
    client's device with the same id is another device."""
    other = make_client(TEST_DEVICE_COUNT)
    ours = client.devices()[1]
    theirs = other.devices()[1]
    assert ours.id == theirs.id and ours != theirs
    assert len({ours: 1, theirs: 2}) == 2
    assert ours.default_memory() is client.devices()[1].default_memory()
    assert ours.default_memory() != theirs.default_memory()

