"""Placement honours memory kinds, as jax does on the same CPU plugins' memories."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from pjrt.mesh import Mesh
from pjrt.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
from pjrt.transfers import ArrayCopySemantics, batched_copy_array_to_devices_with_sharding

jax = pytest.importorskip("jax")


def test_cpu_plugins_offer_the_memory_kinds_jax_sees(client):
    ours = [m.kind for m in client.local_devices()[0].addressable_memories()]
    theirs = [m.kind for m in jax.devices("cpu")[0].addressable_memories()]
    assert ours == theirs == ["device", "pinned_host", "unpinned_host"]
    assert client.local_devices()[0].default_memory().kind == "device"


@pytest.mark.parametrize("kind", ["device", "pinned_host", "unpinned_host"])
def test_device_put_single_device(client, kind):
    device = client.local_devices()[2]
    host = np.arange(10.0)
    array = pjrt.device_put(host, SingleDeviceSharding(device, memory_kind=kind))
    oracle = jax.device_put(host, jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0],
                                                                    memory_kind=kind))
    assert array.memory_kind == array.sharding.memory_kind == kind
    assert oracle.sharding.memory_kind == kind
    assert np.array_equal(np.asarray(array), host)


def test_named_sharding_places_every_shard_in_its_memory(client):
    mesh = Mesh(np.array(client.local_devices()[:4]).reshape(2, 2), ("x", "y"))
    host = np.arange(16.0).reshape(4, 4)
    pinned = pjrt.device_put(host, NamedSharding(mesh, P("x"), memory_kind="pinned_host"))
    assert {s.data.memory_kind for s in pinned.addressable_shards} == {"pinned_host"}
    assert np.array_equal(np.asarray(pinned), host)
    # Resharding moves memory too: back to device memory (same layout) ...
    back = pjrt.device_put(pinned, NamedSharding(mesh, P("x")))
    assert back is not pinned
    assert {s.data.memory_kind for s in back.addressable_shards} == {"device"}
    # ... to another host memory with another layout ...
    other = pjrt.device_put(back, NamedSharding(mesh, P("y"), memory_kind="unpinned_host"))
    assert {s.data.memory_kind for s in other.addressable_shards} == {"unpinned_host"}
    assert np.array_equal(np.asarray(other), host)
    # ... and an array already where it is asked to be is returned as is.
    assert pjrt.device_put(other, other.sharding) is other


def test_buffer_from_pyval_memory(client):
    device = client.local_devices()[1]
    array = client.buffer_from_pyval(np.ones(3), device, memory=device.memory("pinned_host"))
    assert array.memory_kind == "pinned_host"


def test_unknown_memory_kind_is_refused(client):
    with pytest.raises(ValueError, match="memory kinds"):
        SingleDeviceSharding(client.local_devices()[0], memory_kind="hbm")


def test_array_copy_semantics(client):
    devices = client.local_devices()[:2]
    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    source = pjrt.device_put(np.arange(4.0), sharding)
    reused, copied = batched_copy_array_to_devices_with_sharding(
        [source, source], [sharding, sharding],
        [ArrayCopySemantics.REUSE_INPUT, ArrayCopySemantics.ALWAYS_COPY])
    assert reused is source and copied is not source
    assert np.array_equal(np.asarray(copied), np.arange(4.0))
    moved = batched_copy_array_to_devices_with_sharding(
        [source], [NamedSharding(mesh, P())], [ArrayCopySemantics.DONATE_INPUT])[0]
    assert source.is_deleted() and np.array_equal(np.asarray(moved), np.arange(4.0))
    with pytest.raises(ValueError, match="one of each"):
        batched_copy_array_to_devices_with_sharding([moved], [sharding], [])


def test_masked_arrays_are_refused_as_jax_does(client):
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    with pytest.raises(Exception) as oracle:
        jax.device_put(masked)  # the oracle refuses them, with this exception type
    refused = type(oracle.value)
    assert refused is ValueError
    device = client.local_devices()[0]
    for put in (lambda: client.buffer_from_pyval(masked),
                lambda: pjrt.device_put(masked, device),
                lambda: pjrt.device_put(masked, SingleDeviceSharding(device))):
        with pytest.raises(refused, match="masked arrays cannot be placed") as info:
            put()
        assert "filled" in str(info.value)  # and says what to pass instead


def test_a_masked_argument_to_a_program_is_refused_as_jax_does(client):
    from conftest import TINY

    compiled = pjrt.compile(TINY.read_text(), client.local_devices()[0])
    a, b = TINY.inputs()
    masked = np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
    with pytest.raises(ValueError, match="masked arrays cannot be placed"):
        compiled(masked, b)
