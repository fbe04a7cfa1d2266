"""Devices and memories of a client (device.py) on the real CPU plugins."""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pjrt
from conftest import TEST_DEVICE_COUNT, child_env


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


def test_the_cpu_plugins_keep_no_memory_stats_to_report_or_clear(client):
    """XLA's CPU plugins answer PJRT_Device_MemoryStats with UNIMPLEMENTED (None here, as
    jaxlib's memory_stats), and cannot clear them: the 0.81 build has no
    PJRT_Device_ClearMemoryStats (PJRT API 0.106), the 0.106 build answers UNIMPLEMENTED."""
    device = client.local_devices()[0]
    assert device.memory_stats() is None
    api = client.plugin.api
    with pytest.raises(pjrt.UnsupportedFeatureError) as caught:
        device.clear_memory_stats()
    error = caught.value
    assert error.function == "PJRT_Device_ClearMemoryStats"
    assert error.plugin_version == api.version and error.code == pjrt.ErrorCode.UNIMPLEMENTED
    if api.version >= (0, 106):
        assert api.has("PJRT_Device_ClearMemoryStats")
        assert "its table has the entry, but it answers UNIMPLEMENTED" in str(error)
    else:
        assert not api.has("PJRT_Device_ClearMemoryStats")
        assert "the call came with PJRT API 0.106" in str(error)
    # The client goes on.
    np.testing.assert_array_equal(np.asarray(client.buffer_from_pyval(np.arange(3))),
                                  np.arange(3))


def _fault_client(built, tmp_path, minor: int) -> pjrt.Client:
    """A client of a copy of the fault plugin reporting PJRT API 0.``minor`` (its table as our
    header's), which keeps memory statistics per device (tests/fault_plugin)."""
    name = f"fault_stats_{minor}_{next(_fault_copies)}"
    path = tmp_path / f"lib{name}.so"
    shutil.copyfile(built.fault_plugin, path)
    library = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    library.fault_configure(0, minor, ctypes.c_size_t(0), 1)
    pjrt.load_pjrt_plugin_dynamically(name, str(path))
    return pjrt.make_c_api_client(name)


_fault_copies = itertools.count()


def test_memory_stats_and_their_clear_where_the_plugin_keeps_them(built, tmp_path):
    """Every field the plugin sets, peak_allocated_bytes included (PJRT API 0.113 on), follows
    the buffers made and freed; clear_memory_stats brings the peaks down to what is in use;
    the other device's statistics are its own."""
    own = _fault_client(built, tmp_path, 114)
    first, second = own.devices()
    assert first.memory_stats() == {"bytes_in_use": 0, "peak_bytes_in_use": 0,
                                    "bytes_limit": 1 << 30, "peak_allocated_bytes": 0}
    a = own.buffer_from_pyval(np.zeros(1000, np.float32), first)
    b = own.buffer_from_pyval(np.zeros(500, np.float64), first)
    own.buffer_from_pyval(np.zeros(10, np.int8), second).block_until_ready()
    stats = first.memory_stats()
    assert (stats["bytes_in_use"], stats["peak_bytes_in_use"], stats["peak_allocated_bytes"]) == (
        8000, 8000, 8000)
    b.delete()
    stats = first.memory_stats()
    assert (stats["bytes_in_use"], stats["peak_bytes_in_use"], stats["peak_allocated_bytes"]) == (
        4000, 8000, 8000)
    first.clear_memory_stats()
    stats = first.memory_stats()
    assert (stats["bytes_in_use"], stats["peak_bytes_in_use"], stats["peak_allocated_bytes"]) == (
        4000, 4000, 4000)
    assert second.memory_stats()["peak_bytes_in_use"] == 10
    a.delete()
    assert first.memory_stats()["bytes_in_use"] == 0
    own.close()
    with pytest.raises(pjrt.ClosedClientError):
        first.clear_memory_stats()


@pytest.mark.parametrize("minor", [106, 112, 113])
def test_peak_allocated_bytes_is_read_only_from_plugins_whose_api_has_it(built, tmp_path, minor):
    """The fault plugin writes peak_allocated_bytes whatever API it reports (our struct has
    room for it): it is read only from a plugin of PJRT API 0.113 or later, whose struct has
    the field; an older plugin's struct ends before it, and what lies there is not its."""
    own = _fault_client(built, tmp_path, minor)
    device = own.devices()[0]
    own.buffer_from_pyval(np.zeros(4, np.float32), device).block_until_ready()
    stats = device.memory_stats()
    assert stats["peak_bytes_in_use"] == 16
    assert ("peak_allocated_bytes" in stats) == (minor >= 113), stats
    own.close()


@pytest.mark.parametrize("build, why", [
    ("xla-cpu-pjrt", r"PJRT API 0\.81 has no PJRT_Device_ClearMemoryStats"),
    ("fastatomstruct-xla-cpu", r"the plugin answers UNIMPLEMENTED"),
])
def test_pjrt_info_shows_peaks_and_whether_stats_clear(built, tmp_path, build, why):
    """`pjrt info` lists each device's statistics, the peak allocation among them, and says
    per backend whether they can be cleared: the fault plugin can, XLA's CPU plugin cannot
    (the 0.81 build lacks the function, the 0.106 build answers UNIMPLEMENTED)."""
    path = tmp_path / "libfault_info.so"
    shutil.copyfile(built.fault_plugin, path)
    env = child_env(drop=("PJRT_", "JAX_"), JAX_PLATFORMS="cpu", PJRT_PLATFORMS="",
                    PJRT_CPU_DEVICE_COUNT="1", PJRT_NAMES_AND_LIBRARY_PATHS=f"faultinfo:{path}",
                    PJRT_CPU_BUILD=build)
    text = subprocess.run([sys.executable, "-m", "pjrt", "info"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^    0 +fault device +device\* +bytes_in_use=0, peak_bytes_in_use=0, "
                     r"bytes_limit=1073741824, peak_allocated_bytes=0$", text.stdout,
                     re.MULTILINE), text.stdout
    assert re.search(r"^  faultinfo\n(    .*\n)+    clearing memory stats: supported$",
                     text.stdout, re.MULTILINE), text.stdout
    assert re.search(rf"^  cpu\n(    .*\n)+    clearing memory stats: not supported \({why}\)$",
                     text.stdout, re.MULTILINE), text.stdout
    as_json = subprocess.run([sys.executable, "-m", "pjrt", "info", "--json"], env=env,
                             capture_output=True, text=True, timeout=120)
    backends = {b["name"]: b for b in json.loads(as_json.stdout)["backends"]}
    assert backends["faultinfo"]["memory_stats_clear"] == "supported"
    assert backends["faultinfo"]["devices"][1]["memory_stats"]["peak_allocated_bytes"] == 0
    assert backends["cpu"]["memory_stats_clear"].startswith("not supported")


def test_devices_and_memories_of_a_closed_client_raise(make_client):
    own = make_client(2)
    device = own.devices()[0]
    memory = device.default_memory()
    own.close()
    for use in (device.addressable_memories, device.memory_stats, device.clear_memory_stats,
                device.attributes, device.to_string, memory.addressable_by_devices,
                memory.to_string):
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

