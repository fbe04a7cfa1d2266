"""Topology descriptions on XLA's CPU plugin builds: a client's topology
(``get_topology_for_devices``), its compile-only devices, and the client-less
``make_c_api_device_topology``, which the CPU builds refuse."""
from __future__ import annotations

import importlib.util

import pytest

import pjrt
from pjrt import xla_client
from pjrt.errors import ClosedClientError, XlaRuntimeError
from pjrt.plugin import plugin_from_c_api
from pjrt.topology import CompileOnlyDevice, DeviceTopology
from conftest import TINY


def test_get_topology_for_devices_describes_the_clients_devices(make_client):
    client = make_client(devices=4)
    topology = xla_client.get_topology_for_devices(client.devices())
    assert isinstance(topology, DeviceTopology)
    assert (topology.platform, topology.platform_version) == (client.platform,
                                                             client.platform_version)
    descriptions = topology.device_descriptions()
    assert [(d.id, d.process_index, d.device_kind) for d in descriptions] == [
        (d.id, d.process_index, d.device_kind) for d in client.devices()]
    serialized = topology.serialize()
    assert isinstance(serialized, bytes) and serialized
    assert topology.serialize() == serialized
    # A part of the devices names the same client, so the same topology.
    assert len(xla_client.get_topology_for_devices(client.devices()[1:2])
               .device_descriptions()) == 4


def test_a_clients_topology_lives_with_the_client(make_client):
    client = make_client(devices=2)
    topology = xla_client.get_topology_for_devices(client.devices())
    topology.close()  # the client's description is not freed by closing this object
    with pytest.raises(ClosedClientError, match="topology description has been closed"):
        topology.device_descriptions()
    again = xla_client.get_topology_for_devices(client.devices())
    assert len(again.device_descriptions()) == 2
    client.close()
    with pytest.raises(ClosedClientError):
        again.device_descriptions()


def test_get_topology_for_devices_refuses_no_devices_and_mixed_clients(make_client):
    first, second = make_client(devices=1), make_client(devices=1)
    with pytest.raises(ValueError, match="at least one device"):
        xla_client.get_topology_for_devices([])
    with pytest.raises(ValueError, match="more than one client"):
        xla_client.get_topology_for_devices([first.devices()[0], second.devices()[0]])


def test_compile_only_devices(make_client):
    client = make_client(devices=4)
    topology = xla_client.get_topology_for_devices(client.devices())
    devices = topology._make_compile_only_devices()
    assert [(d.id, d.process_index, d.platform, d.device_kind) for d in devices] == [
        (d.id, d.process_index, client.platform, d.device_kind) for d in client.devices()]
    assert all(isinstance(d, CompileOnlyDevice) and d.client is None and d.topology is topology
               for d in devices)
    assert str(devices[2]) == "CPU_2(compile-only)"


def test_compile_only_devices_are_checked_before_compiling(make_client):
    client = make_client(devices=2)
    topology = xla_client.get_topology_for_devices(client.devices())
    other = xla_client.get_topology_for_devices(make_client(devices=2).devices())
    with pytest.raises(ValueError, match="not a compile-only device of this topology"):
        topology.compile_to_bytes(TINY.read_text(),
                                  devices=other._make_compile_only_devices())
    with pytest.raises(ValueError, match="not a compile-only device"):
        topology.compile_to_bytes(TINY.read_text(), devices=client.devices())
    with pytest.raises(ValueError, match="devices is empty"):
        topology.compile_to_bytes(TINY.read_text(), devices=[])


def test_cpu_builds_cannot_compile_for_a_topology(make_client):
    # XLA's CPU plugins register no topology compiler: the plugin's own refusal arrives,
    # after the devices became the device assignment.
    client = make_client(devices=2)
    topology = xla_client.get_topology_for_devices(client.devices())
    with pytest.raises(XlaRuntimeError) as info:
        topology.compile_to_bytes(TINY.read_text(),
                                  devices=topology._make_compile_only_devices()[:1])
    assert info.value.code_name == "NOT_FOUND" and "cpu" in str(info.value)


def test_make_c_api_device_topology_on_a_cpu_build(cpu_plugin):
    # The CPU builds have PJRT_TopologyDescription_Create and answer it UNIMPLEMENTED: a
    # topology without a client is not theirs to describe.
    with pytest.raises(XlaRuntimeError) as info:
        xla_client.make_c_api_device_topology(cpu_plugin, "")
    assert info.value.code_name == "UNIMPLEMENTED"
    assert "Topology not supported for CPU compilation" in str(info.value)
    # The table itself (what jaxlib passes) reaches the same plugin.
    address = int(pjrt._pjrt_cffi.ffi.cast("uintptr_t", cpu_plugin.api.table))
    with pytest.raises(XlaRuntimeError, match="Topology not supported"):
        xla_client.make_c_api_device_topology(address, "", some_option=1)
    with pytest.raises(TypeError, match="must be a PyCapsule"):
        xla_client.make_c_api_device_topology("cpu")


def test_plugin_of_c_api_finds_the_loaded_plugin(cpu_plugin):
    from pjrt.plugin import default_plugins, plugin_of_c_api

    address = int(pjrt._pjrt_cffi.ffi.cast("uintptr_t", cpu_plugin.api.table))
    found = plugin_of_c_api(address)
    # A library loaded under two names (another test may load this one as "cpu") has one
    # table: either name is the plugin.
    assert found.api.table == cpu_plugin.api.table and found.name in default_plugins.names()
    assert plugin_of_c_api(cpu_plugin) is cpu_plugin
    assert plugin_from_c_api("x", address).api.table == cpu_plugin.api.table


@pytest.mark.skipif(importlib.util.find_spec("pjrt_tpu") is not None,
                    reason="pjrt-tpu is installed: the vendor environment tests the TPU topology")
def test_tfrt_tpu_topology_needs_pjrt_tpu():
    with pytest.raises(RuntimeError, match="tpu"):
        xla_client.make_tfrt_tpu_c_api_device_topology("v5e:2x2")
