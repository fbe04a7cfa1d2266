"""Topology descriptions on XLA's CPU plugin builds: a client's topology
(``get_topology_for_devices``), its compile-only devices and their client, which compiles
programs to inspect and serialise that a live client loads and runs, and the client-less
``make_c_api_device_topology``, which the CPU builds refuse."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import pjrt
from pjrt import xla_client
from pjrt.errors import ClosedClientError, XlaRuntimeError
from pjrt.plugin import plugin_from_c_api
from pjrt.hlo_sharding import HloSharding
from pjrt.topology import CompileOnlyClient, CompileOnlyDevice, DeviceTopology, Executable
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
    assert all(isinstance(d, CompileOnlyDevice) and d.topology is topology for d in devices)
    assert str(devices[2]) == "CPU_2(compile-only)"
    # One compile-only client per topology, as in jaxlib: it runs nothing, so none of its
    # devices is addressable.
    compile_only = devices[0].client
    assert isinstance(compile_only, CompileOnlyClient)
    assert all(d.client is compile_only for d in devices + topology._make_compile_only_devices())
    assert (compile_only.platform, compile_only.platform_version) == (
        client.platform, client.platform_version)
    assert compile_only.runtime_type == "compile_only_runtime"
    assert compile_only.device_count() == 4 and [d.id for d in compile_only.devices()] == [
        0, 1, 2, 3]
    assert compile_only.local_devices() == [] and compile_only.local_device_count() == 0
    assert compile_only.process_index() == client.process_index() == 0


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


#: x[8, 4] split by rows over two devices, times a replicated w[4, 3], plus 1: the product
#: keeps the rows' split.
SPMD_PRODUCT = """
module @jit_product attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<8x4xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"},
                         %w: tensor<4x3xf32> {mhlo.sharding = "{replicated}"})
      -> (tensor<8x3xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"}) {
    %p = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<8x4xf32>, tensor<4x3xf32>) -> tensor<8x3xf32>
    %one = stablehlo.constant dense<1.0> : tensor<8x3xf32>
    %r = stablehlo.add %p, %one : tensor<8x3xf32>
    return %r : tensor<8x3xf32>
  }
}
"""


def test_compile_for_compile_only_devices_inspect_serialize_and_run(make_client):
    client = make_client(devices=4)
    topology = xla_client.get_topology_for_devices(client.devices())
    devices = topology._make_compile_only_devices()
    executable = devices[0].client.compile(TINY.read_text(), devices[2:3])
    assert isinstance(executable, Executable)
    # What jaxlib's unloaded executable answers.
    (module,) = executable.hlo_modules()
    assert "tanh" in module.to_string() and "ENTRY" in executable.hlo_text()
    stats = executable.get_compiled_memory_stats()
    assert (stats.argument_size_in_bytes, stats.output_size_in_bytes) == (64, 32)
    assert isinstance(executable.cost_analysis(), dict)
    # A program of one device is not partitioned: no shardings (None, as in jaxlib).
    assert executable.get_parameter_shardings() is None
    assert executable.get_output_shardings() is None
    assert len(executable.get_parameter_layouts()) == 2
    assert len(executable.get_output_layouts()) == 1
    assert executable.get_output_memory_kinds() == [["device"]]
    # The bytes load on the live client, on the device compiled for, and run.
    loaded = client.deserialize_executable(executable.serialize())
    assert [d.id for d in loaded.local_devices()] == [2]
    a = np.linspace(-2, 2, 8, dtype=np.float32)
    b = np.arange(8, dtype=np.float32) / 4
    device = client.devices()[2]
    (out,) = loaded.execute([client.buffer_from_pyval(a, device),
                             client.buffer_from_pyval(b, device)])
    np.testing.assert_allclose(np.asarray(out), np.tanh(a * b + 1), rtol=1e-6, atol=1e-6)
    # compile_to_bytes is the same compile, serialised.
    again = client.deserialize_executable(topology.compile_to_bytes(TINY.read_text(),
                                                                    devices=devices[2:3]))
    (out,) = again.execute([client.buffer_from_pyval(a, device),
                            client.buffer_from_pyval(b, device)])
    np.testing.assert_allclose(np.asarray(out), np.tanh(a * b + 1), rtol=1e-6, atol=1e-6)


def test_an_spmd_program_for_compile_only_devices(make_client):
    client = make_client(devices=4)
    topology = xla_client.get_topology_for_devices(client.devices())
    devices = topology._make_compile_only_devices()
    # As jax's ahead-of-time path passes them: a DeviceList of compile-only devices.
    chosen = xla_client.DeviceList((devices[3], devices[1]))
    assert not chosen.is_fully_addressable and chosen.device_kind == "cpu"
    assert chosen.process_indices == {0} and chosen.default_memory_kind is None
    executable = devices[0].client.compile(SPMD_PRODUCT, executable_devices=chosen)
    split, replicated = HloSharding.from_string("{devices=[2,1]<=[2]}"), HloSharding.replicate()
    assert executable.get_parameter_shardings() == [split, replicated]
    assert executable.get_output_shardings() == [split]
    # Each device holds half of x (4 x 4 floats) and all of w (4 x 3), and half the result.
    stats = executable.get_compiled_memory_stats()
    assert (stats.argument_size_in_bytes, stats.output_size_in_bytes) == (64 + 48, 48)
    loaded = client.deserialize_executable(executable.serialize())
    assert [d.id for d in loaded.local_devices()] == [3, 1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    placed = [pjrt.device_put(value, sharding)
              for value, sharding in zip((x, w), loaded.input_shardings)]
    (out,) = loaded.execute_global(placed)
    np.testing.assert_allclose(np.asarray(out), x @ w + 1, rtol=1e-5, atol=1e-5)
    # The shards are where the compile-only devices said: rows 0-3 on device 3.
    shards = {shard.device.id: np.asarray(shard.data) for shard in out.addressable_shards}
    np.testing.assert_allclose(shards[3], (x @ w + 1)[:4], rtol=1e-5, atol=1e-5)


def test_a_compile_only_executable_cannot_run(make_client):
    client = make_client(devices=2)
    topology = xla_client.get_topology_for_devices(client.devices())
    devices = topology._make_compile_only_devices()
    compile_only = devices[0].client
    executable = compile_only.compile(TINY.read_text(), devices[:1])
    for run in (executable.execute, executable.execute_sharded, executable.execute_with_token,
                executable):
        with pytest.raises(RuntimeError, match="compile-only devices.*Client.deserialize_"
                                               "executable"):
            run([])
    with pytest.raises(RuntimeError, match="compile_and_load on a compile-only client"):
        compile_only.compile_and_load(TINY.read_text(), devices[:1])
    with pytest.raises(RuntimeError, match="deserialize_executable on a compile-only client"):
        compile_only.deserialize_executable(executable.serialize(), devices[:1])
    with pytest.raises(ValueError, match="cannot carry host callbacks"):
        compile_only.compile(TINY.read_text(), devices[:1], host_callbacks=[object()])
    with pytest.raises(ValueError, match="not a compile-only device"):
        compile_only.compile(TINY.read_text(), client.devices()[:1])


def test_a_compile_only_executable_lives_with_the_topologys_client(make_client):
    client = make_client(devices=2)
    topology = xla_client.get_topology_for_devices(client.devices())
    devices = topology._make_compile_only_devices()
    deleted = devices[0].client.compile(TINY.read_text(), devices[:1])
    deleted.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        deleted.serialize()
    executable = devices[0].client.compile(TINY.read_text(), devices[1:])
    assert executable.get_compiled_memory_stats().output_size_in_bytes == 32
    client.close()
    with pytest.raises(ClosedClientError):
        executable.serialize()
    with pytest.raises(ClosedClientError):
        devices[0].client.compile(TINY.read_text(), devices[:1])


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
