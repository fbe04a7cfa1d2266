"""Global arrays, device_put with shardings, and SPMD / replicated execution on 8 CPU devices."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from fixtures import programs

REPLICATED_PROGRAM = """
func.func public @main(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {
  %0 = stablehlo.multiply %x, %x : tensor<3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %0, %s : tensor<3xf32>, tensor<f32>
}"""


@pytest.fixture
def mesh(client):
    return pjrt.Mesh(np.array(client.devices()).reshape(2, 4), ("x", "y"))


def test_device_put_cuts_a_host_array_into_shards(mesh):
    host = np.arange(32.0).reshape(8, 4)
    sharding = pjrt.NamedSharding(mesh, pjrt.P("x", "y"))
    array = pjrt.device_put(host, sharding)
    assert array.shape == (8, 4) and array.sharding == sharding
    assert len(array.addressable_shards) == 8
    for shard in array.addressable_shards:
        assert shard.data.shape == (4, 1) and shard.data.device is shard.device
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])
    np.testing.assert_array_equal(np.asarray(array), host)


def test_replicated_and_uneven_placements(mesh):
    host = np.arange(6.0)
    replicated = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P()))
    assert replicated.is_fully_replicated
    assert all(s.data.shape == (6,) for s in replicated.addressable_shards)
    np.testing.assert_array_equal(np.asarray(replicated), host)
    with pytest.raises(pjrt.IndivisibleError):
        pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("y")))  # 6 over 4


def test_resharding_keeps_values(mesh):
    host = np.arange(64, dtype=np.int32).reshape(8, 8)
    rows = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x")))
    columns = pjrt.device_put(rows, pjrt.NamedSharding(mesh, pjrt.P(None, ("x", "y"))))
    assert columns.addressable_shards[0].data.shape == (8, 1)
    np.testing.assert_array_equal(np.asarray(columns), host)
    assert pjrt.device_put(rows, rows.sharding) is rows


def test_deleting_a_global_array_invalidates_its_shards(mesh):
    array = pjrt.device_put(np.ones((8, 8)), pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    shard = array.addressable_shards[3].data
    array.delete()
    assert shard.is_deleted()
    with pytest.raises(pjrt.DeletedArrayError):
        np.asarray(shard)


@pytest.mark.parametrize("order", [list(range(8)), [3, 1, 7, 5, 0, 2, 6, 4]])
@pytest.mark.parametrize("variant", ["shardy", "gspmd"])
def test_spmd_call_with_host_and_global_arrays(client, variant, order):
    devices = [client.lookup_device(i) for i in order]
    mesh = pjrt.Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    program = programs.get("spmd_mlp")
    compiled = pjrt.compile(program.read_text(variant), mesh)
    assert compiled.devices == devices
    x, w = program.inputs()
    # x arrives placed with a different layout: it is resharded to the one the program expects.
    x_rows = pjrt.device_put(x, pjrt.NamedSharding(mesh, pjrt.P("x")))
    result = compiled(x_rows, w)
    np.testing.assert_allclose(np.asarray(result), program.expected()[0],
                               rtol=program.rtol, atol=program.atol)
    manifest = programs.load_manifest()["programs"]["spmd_mlp"]["spmd"]["variants"][variant]
    assert [str(s.to_hlo_sharding(2)) for s in compiled.output_shardings] == \
        manifest["jax_output_hlo_shardings"]
    expected_indices = pjrt.GSPMDSharding(devices, compiled.output_shardings[0].to_hlo_sharding(2)) \
        .devices_indices_map((8, 8))
    assert {s.device: s.index for s in result.addressable_shards} == expected_indices


def test_arguments_on_other_devices_are_refused(client):
    mesh = pjrt.Mesh(np.array(client.devices()[:4]), ("x",))
    compiled = pjrt.compile(programs.get("spmd_elementwise_2d").read_text("gspmd"),
                            pjrt.Mesh(np.array(client.devices()).reshape(2, 4), ("x", "y")))
    elsewhere = pjrt.device_put(np.ones((8, 8), np.float32), pjrt.NamedSharding(mesh, pjrt.P("x")))
    with pytest.raises(pjrt.DeviceAssignmentMismatchError, match=r"argument 0 is on cpu devices \[0, 1, 2, 3\]"):
        compiled(elsewhere)


def test_wrong_global_shape_is_refused(client, mesh):
    compiled = pjrt.compile(programs.get("spmd_elementwise_2d").read_text("shardy"), mesh)
    with pytest.raises((TypeError, ValueError)):
        compiled(np.ones((16, 8), np.float32))
    with pytest.raises(TypeError, match="takes 1 arguments"):
        compiled(np.ones((8, 8), np.float32), np.ones(3))


def test_replicated_execution_stacks_outputs(client):
    devices = client.devices()[:4]
    compiled = pjrt.compile(REPLICATED_PROGRAM, devices, replicated=True)
    assert compiled.executable.num_replicas() == 4
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    squares, sums = compiled(x)
    assert squares.shape == (4, 3) and sums.shape == (4,)
    assert isinstance(squares.sharding, pjrt.PmapSharding)
    np.testing.assert_array_equal(np.asarray(squares), x * x)
    np.testing.assert_array_equal(np.asarray(sums), x.sum(axis=1))
    assert [s.device for s in squares.addressable_shards] == devices


def test_replicate_and_shard_along_axis_helpers(client):
    devices = client.devices()[:3]
    everywhere = pjrt.replicate(np.arange(5), devices)
    assert everywhere.is_fully_replicated and len(everywhere.addressable_shards) == 3
    stacked = pjrt.shard_along_axis(np.arange(6).reshape(3, 2), devices)
    assert [np.asarray(s.data).tolist() for s in stacked.addressable_shards] == [[0, 1], [2, 3], [4, 5]]
    assert pjrt.batched_block_until_ready([everywhere, stacked]) == [everywhere, stacked]


def test_a_shard_of_a_deleted_array_cannot_be_executed(client):
    mesh = pjrt.Mesh(np.array(client.devices()[:2]), ("a",))
    array = pjrt.device_put(np.ones((2, 4), np.float32), pjrt.NamedSharding(mesh, pjrt.P("a")))
    shard = array.addressable_shards[0].data
    text = """func.func public @main(%x: tensor<1x4xf32>) -> tensor<1x4xf32> {
      %0 = stablehlo.add %x, %x : tensor<1x4xf32>
      return %0 : tensor<1x4xf32>
    }"""
    executable = client.compile_and_load(text, [shard.device])
    np.testing.assert_array_equal(np.asarray(executable.execute([shard])[0]), np.full((1, 4), 2.0))
    array.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        executable.execute([shard])


def test_a_view_of_a_shard_outlives_its_global_array_and_client(cpu_plugin):
    own = pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2})
    mesh = pjrt.Mesh(np.array(own.devices()), ("a",))
    array = pjrt.device_put(np.arange(2 * 65536, dtype=np.float32).reshape(2, 65536),
                            pjrt.NamedSharding(mesh, pjrt.P("a")))
    view = np.asarray(array.addressable_shards[1].data)  # 256 KiB: a view of the buffer
    array.delete()
    own.close()
    np.testing.assert_array_equal(view[0, :3], [65536, 65537, 65538])


def test_an_unevenly_sharded_output_is_refused_before_running(client):
    text = """func.func public @main(%x: tensor<6xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<6xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
      %0 = stablehlo.add %x, %x : tensor<6xf32>
      return %0 : tensor<6xf32>
    }"""
    compiled = pjrt.compile(text, client.devices()[:4])
    with pytest.raises(ValueError, match="splits unevenly"):
        compiled(np.ones(6, np.float32))
