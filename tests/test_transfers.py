"""Placing values on devices (transfers.py): ``device_put`` to a device or a sharding, resharding
an Array, the batched transfers and the replicate / shard helpers, on 8 CPU devices of the real
plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt


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


def test_replicate_and_shard_along_axis_helpers(client):
    devices = client.devices()[:3]
    everywhere = pjrt.replicate(np.arange(5), devices)
    assert everywhere.is_fully_replicated and len(everywhere.addressable_shards) == 3
    stacked = pjrt.shard_along_axis(np.arange(6).reshape(3, 2), devices)
    assert [np.asarray(s.data).tolist() for s in stacked.addressable_shards] == [[0, 1], [2, 3], [4, 5]]
    assert pjrt.xla_client.batched_block_until_ready([everywhere, stacked]) == [everywhere, stacked]


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


def test_device_put_helper(client):
    device = client.devices()[2]
    array = pjrt.device_put(np.arange(3.0), device)
    assert array.device is device
    assert pjrt.device_put(array, device) is array
    moved = pjrt.device_put(array, client.devices()[4])
    assert moved.device is client.devices()[4]


def test_device_put_refuses_a_target_that_is_not_a_device_or_sharding(client):
    with pytest.raises(TypeError, match="on a Device or a Sharding, not str"):
        pjrt.device_put(np.ones(3), "cpu:0")


def test_batched_device_put_builds_a_global_array_from_shards(mesh):
    sharding = pjrt.NamedSharding(mesh, pjrt.P("x"))
    devices = list(sharding.addressable_devices_indices_map((4, 3)))
    host = np.arange(12, dtype=np.int32).reshape(4, 3)
    indices = sharding.addressable_devices_indices_map(host.shape)
    array = pjrt.xla_client.batched_device_put(host.shape, sharding, [host[indices[d]] for d in devices],
                                    devices)
    assert array.shape == (4, 3) and array.sharding == sharding
    np.testing.assert_array_equal(np.asarray(array), host)
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])


def test_batched_device_put_refuses_shards_that_do_not_fit(mesh):
    sharding = pjrt.NamedSharding(mesh, pjrt.P("x"))
    devices = list(sharding.addressable_devices_indices_map((4, 3)))
    shards = [np.zeros((2, 3), np.float32) for _ in devices]
    with pytest.raises(ValueError, match=r"has shape \(3, 3\); the sharding gives shards of "
                                         r"shape \(2, 3\) for an array of \(4, 3\)"):
        pjrt.xla_client.batched_device_put((4, 3), sharding, [np.zeros((3, 3), np.float32)] * 8, devices)
    with pytest.raises(ValueError, match="in the sharding's device order"):
        pjrt.xla_client.batched_device_put((4, 3), sharding, shards, devices[::-1])
    mixed = shards[:-1] + [np.zeros((2, 3), np.float64)]
    with pytest.raises(ValueError, match="shards disagree on dtype"):
        pjrt.xla_client.batched_device_put((4, 3), sharding, mixed, devices)
    assert pjrt.xla_client.batched_device_put((4, 3), sharding, shards, devices).shape == (4, 3)


def test_a_large_placement_is_copied_in_parallel_and_exact(mesh):
    """Past 8 MiB in all, the shards are placed by several threads; every byte arrives."""
    host = np.random.default_rng(3).standard_normal((1024, 2048)).astype(np.float32)  # 8 MiB
    array = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    np.testing.assert_array_equal(np.asarray(array), host)
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])


def test_resharding_to_another_device_order_moves_shards(client):
    devices = client.devices()
    forward = pjrt.Mesh(np.array(devices), ("a",))
    backward = pjrt.Mesh(np.array(devices[::-1]), ("a",))
    host = np.arange(16.0).reshape(8, 2)
    array = pjrt.device_put(host, pjrt.NamedSharding(forward, pjrt.P("a")))
    moved = pjrt.xla_client.reorder_shards(array, pjrt.NamedSharding(backward, pjrt.P("a")))
    np.testing.assert_array_equal(np.asarray(moved), host)
    assert {s.device.id: s.index for s in moved.addressable_shards}[7] == (slice(0, 1), slice(None))
    np.testing.assert_array_equal(np.asarray(moved.addressable_shards[0].data), host[:1])
    assert not array.is_deleted()


def test_resharding_to_another_client_goes_through_the_host(client, make_client):
    other = make_client(4)
    host = np.arange(32, dtype=np.int64).reshape(4, 8)
    ours = pjrt.device_put(host, pjrt.NamedSharding(pjrt.Mesh(np.array(client.devices()[:4]),
                                                              ("a",)), pjrt.P("a")))
    target = pjrt.NamedSharding(pjrt.Mesh(np.array(other.devices()), ("b",)), pjrt.P(None, "b"))
    theirs = pjrt.device_put(ours, target)
    assert theirs.sharding == target
    assert {s.device.client for s in theirs.addressable_shards} == {other}
    np.testing.assert_array_equal(np.asarray(theirs), host)
    for shard in theirs.addressable_shards:
        assert shard.data.shape == (4, 2)
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])


def test_shard_along_another_axis(client):
    devices = client.devices()[:4]
    host = np.arange(12).reshape(3, 4)
    stacked = pjrt.shard_along_axis(host, devices, axis=1)
    assert isinstance(stacked.sharding, pjrt.PmapSharding)
    assert [np.asarray(s.data).tolist() for s in stacked.addressable_shards] == \
        [host[:, i].tolist() for i in range(4)]
    np.testing.assert_array_equal(np.asarray(stacked), host)

