"""Numpy arguments passed straight to a compiled program (pjrt._runtime.numpy_arguments):
copied to the devices in one native call for that call only, on the real CPU plugins."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import pjrt
from pjrt._capi import staging

#: 64 Ki float32 (256 KiB): above the staging threshold, so copied through staging memory.
N = 1 << 16

AFFINE = f"""
func.func public @main(%x: tensor<{N}xf32>, %y: tensor<{N}xf32>, %s: tensor<4xi32>)
    -> (tensor<{N}xf32>, tensor<4xi32>) {{
  %two = stablehlo.constant dense<2.0> : tensor<{N}xf32>
  %0 = stablehlo.multiply %x, %two : tensor<{N}xf32>
  %1 = stablehlo.add %0, %y : tensor<{N}xf32>
  %2 = stablehlo.add %s, %s : tensor<4xi32>
  return %1, %2 : tensor<{N}xf32>, tensor<4xi32>
}}"""

DONATING = f"""
func.func public @main(%x: tensor<{N}xf32> {{tf.aliasing_output = 0 : i32}},
                       %y: tensor<8xf32> {{tf.aliasing_output = 1 : i32}})
    -> (tensor<{N}xf32>, tensor<8xf32>) {{
  %one = stablehlo.constant dense<1.0> : tensor<{N}xf32>
  %small = stablehlo.constant dense<1.0> : tensor<8xf32>
  %0 = stablehlo.add %x, %one : tensor<{N}xf32>
  %1 = stablehlo.add %y, %small : tensor<8xf32>
  return %0, %1 : tensor<{N}xf32>, tensor<8xf32>
}}"""

#: A replicated 64x1024 float32 (256 KiB) times one split over 8 devices along its columns,
#: so that each device's shard is a strided piece of the host array.
SPMD = """
module @host_values attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=8]>
  func.func public @main(
      %r: tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>},
      %c: tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>})
      -> (tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}) {
    %0 = stablehlo.multiply %r, %c : tensor<64x1024xf32>
    return %0 : tensor<64x1024xf32>
  }
}"""


@pytest.fixture
def empty_pool(client):
    # Earlier tests' staging blocks come back to the pool when their arrays are collected (some
    # sit in reference cycles) and once the plugin has read them: let that happen now, not in
    # the middle of a test that counts the pool's blocks.
    gc.collect()
    deadline = time.monotonic() + 10
    while client._handle.pending_holds and time.monotonic() < deadline:
        client._handle.recycle_host_memory()
        time.sleep(0.005)
    staging.release_staging_memory()
    yield staging.staging_pool
    staging.release_staging_memory()


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32),
            np.arange(4, dtype=np.int32))


def test_numpy_arguments_give_what_device_arrays_give(client, device):
    compiled = pjrt.compile(AFFINE, device)
    x, y, s = _inputs()
    from_host = compiled(x, y, s)
    placed = compiled(*(pjrt.device_put(v, device) for v in (x, y, s)))
    for a, b in zip(from_host, placed):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(from_host[0]), x * 2 + y, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(from_host[1]), s + s)


def test_arguments_in_any_host_form(client, device):
    compiled = pjrt.compile(AFFINE, device)
    x, y, s = _inputs()
    strided = np.stack([x, y], axis=1)[:, 0]  # not contiguous
    swapped = y.astype(">f4")  # not in the machine's byte order
    out, doubled = compiled(strided, swapped, s[::-1][::-1])
    np.testing.assert_allclose(np.asarray(out), x * 2 + y, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(doubled), s + s)


def test_the_callers_arrays_are_copied_not_aliased(client, device):
    compiled = pjrt.compile(AFFINE, device)
    x, y, s = _inputs()
    expected = x * 2 + y
    out, _ = compiled(x, y, s)
    x[:] = 1e9  # changed after the call returned, perhaps while the program still runs
    y[:] = 1e9
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


def _sum_program(elements: int) -> str:
    return f"""
func.func public @main(%x: tensor<{elements}xf32>) -> tensor<f32> {{
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0]
      : (tensor<{elements}xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}}"""


def _resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_staged_copy_is_freed_after_the_call(client, device, empty_pool):
    """A value from 8 MiB is staged: its block comes back to the pool only once the plugin
    has let go of it, which it does when the copy's buffer is freed."""
    elements = staging.CALL_STAGING_THRESHOLD_BYTES // 4
    compiled = pjrt.compile(_sum_program(elements), device)
    x = np.ones(elements, np.float32)
    assert float(np.asarray(compiled(x))) == elements
    gc.collect()
    client._handle.recycle_host_memory()
    assert empty_pool.available(staging.staging_size(x.nbytes)) == 1


def test_copies_made_by_the_plugin_are_freed_after_the_call(client, device):
    """200 calls with a 4 MiB argument the plugin copies itself: were the copies kept, the
    process would grow by 800 MiB."""
    elements = 1 << 20
    compiled = pjrt.compile(_sum_program(elements), device)
    x = np.ones(elements, np.float32)
    for _ in range(20):  # the plugin's allocator and pjrt's caches settle
        compiled(x).block_until_ready()
    before = _resident_bytes()
    for _ in range(200):
        assert float(np.asarray(compiled(x))) == elements
    assert _resident_bytes() - before < 200 << 20


def test_a_donated_parameter_takes_a_host_value(client, device):
    compiled = pjrt.compile(DONATING, device)
    x = np.arange(N, dtype=np.float32)
    y = np.arange(8, dtype=np.float32)
    for _ in range(3):  # the donated copies are the call's own: the caller's arrays stay
        big, small = compiled(x, y)
        np.testing.assert_array_equal(np.asarray(big), x + 1)
        np.testing.assert_array_equal(np.asarray(small), y + 1)
    np.testing.assert_array_equal(x, np.arange(N, dtype=np.float32))


def test_a_wrong_host_value_names_the_argument(client, device):
    compiled = pjrt.compile(AFFINE, device)
    x, y, s = _inputs()
    with pytest.raises(TypeError, match=r"argument 1 has shape \(3,\)"):
        compiled(x, y[:3], s)
    with pytest.raises(TypeError, match=r"argument 2 .* dtype float64"):
        compiled(x, y, s.astype(np.float64))
    gc.collect()
    out, _ = compiled(x, y, s)  # nothing was left half-made
    np.testing.assert_allclose(np.asarray(out), x * 2 + y, rtol=1e-6)


def test_replicated_and_strided_shards_over_8_devices(client, empty_pool):
    mesh = pjrt.Mesh(np.array(client.devices()[:8]), ("x",))
    compiled = pjrt.compile(SPMD, mesh)
    rng = np.random.default_rng(1)
    r = rng.standard_normal((64, 1024)).astype(np.float32)
    c = rng.standard_normal((64, 1024)).astype(np.float32)
    out = compiled(r, c)
    np.testing.assert_allclose(np.asarray(out), r * c, rtol=1e-6)
    placed = compiled(pjrt.device_put(r, compiled.input_shardings[0]),
                      pjrt.device_put(c, compiled.input_shardings[1]))
    np.testing.assert_array_equal(np.asarray(placed), np.asarray(out))


def test_a_replicated_value_is_copied_from_the_host_once(client, empty_pool):
    """The eight devices adopt one staging block: once the program is done with it, one
    block (not eight) goes back to the pool."""
    mesh = pjrt.Mesh(np.array(client.devices()[:8]), ("x",))
    compiled = pjrt.compile(SPMD, mesh)
    r = np.full((64, 1024), 3.0, np.float32)
    c = np.ones((64, 1024), np.float32)
    out = compiled(r, c)
    np.testing.assert_array_equal(np.asarray(out), r)
    del out
    gc.collect()
    client._handle.recycle_host_memory()
    assert empty_pool.available(staging.staging_size(r.nbytes)) == 1
    again = compiled(r * 2, c)  # and the block is used again, whole
    np.testing.assert_array_equal(np.asarray(again), r * 2)


#: x + 1 on a replicated 64x1024 float32, donating x.
SPMD_DONATING = """
module @donating attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=8]>
  func.func public @main(
      %r: tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>,
                               tf.aliasing_output = 0 : i32})
      -> (tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    %one = stablehlo.constant dense<1.0> : tensor<64x1024xf32>
    %0 = stablehlo.add %r, %one : tensor<64x1024xf32>
    return %0 : tensor<64x1024xf32>
  }
}"""


def test_device_put_of_a_replicated_value_copies_it_once(client, empty_pool):
    mesh = pjrt.Mesh(np.array(client.devices()[:8]), ("x",))
    sharding = pjrt.NamedSharding(mesh, pjrt.P())
    host = np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)
    array = pjrt.device_put(host, sharding)
    host[:] = -1  # a copy, not the caller's memory
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data),
                                      np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024))
    del array, shard
    gc.collect()
    client._handle.recycle_host_memory()
    assert empty_pool.available(staging.staging_size(host.nbytes)) == 1


def test_a_donated_replicated_value_is_not_written_in_place(client, empty_pool):
    """The devices share one adopted block; the plugins treat adopted memory as immutable,
    so a donating program copies it: each device adds 1 once."""
    mesh = pjrt.Mesh(np.array(client.devices()[:8]), ("x",))
    compiled = pjrt.compile(SPMD_DONATING, mesh)
    host = np.full((64, 1024), 5.0, np.float32)
    for placed in (pjrt.device_put(host, compiled.input_shardings[0]), host):
        out = compiled(placed)
        for shard in out.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), host + 1)


def _on_boundary(values: np.ndarray, past: int) -> np.ndarray:
    """A copy of ``values`` whose data starts ``past`` bytes after a 64-byte boundary (on one,
    a CPU plugin could read the caller's memory in place instead of copying it)."""
    raw = np.empty(values.nbytes + 128, np.uint8)
    offset = (past - raw.ctypes.data) % 64
    placed = raw[offset:offset + values.nbytes].view(values.dtype).reshape(values.shape)
    placed[...] = values
    return placed


def _tripled(elements: int) -> str:
    return f"""
func.func public @main(%x: tensor<{elements}xf32>, %y: tensor<{elements}xf32>)
    -> tensor<{elements}xf32> {{
  %three = stablehlo.constant dense<3.0> : tensor<{elements}xf32>
  %0 = stablehlo.multiply %x, %three : tensor<{elements}xf32>
  %1 = stablehlo.add %0, %y : tensor<{elements}xf32>
  return %1 : tensor<{elements}xf32>
}}"""


#: 4 KiB (copied by the plugin while the call waits), 256 KiB (above XLA's CPU plugin's own
#: 100 KiB cut for copying on its threads) and 8 MiB (through staging memory).
PROMISE_SIZES = [1 << 10, 1 << 16, staging.CALL_STAGING_THRESHOLD_BYTES // 4]


@pytest.mark.parametrize("past", [0, 16], ids=["on-a-64-byte-boundary", "16-bytes-past"])
@pytest.mark.parametrize("elements", PROMISE_SIZES, ids=["4KiB", "256KiB", "8MiB"])
def test_a_numpy_argument_changed_as_the_call_returns_leaves_its_result(client, device,
                                                                        elements, past):
    """The guide's promise: the caller may change its numpy arguments as soon as the call
    returns, even while the program still runs; the result is that of the values passed."""
    compiled = pjrt.compile(_tripled(elements), device)
    rng = np.random.default_rng(elements)
    original = rng.standard_normal(elements).astype(np.float32)
    for _ in range(3):
        x, y = _on_boundary(original, past), _on_boundary(original[::-1].copy(), past)
        out = compiled(x, y)
        x[:] = 1e9
        y[:] = -1e9
        np.testing.assert_allclose(np.asarray(out), original * 3 + original[::-1], rtol=1e-6,
                                   atol=1e-6)


def _spmd_product(rows: int, columns: int) -> str:
    """A replicated ``rows x columns`` float32 times one split over 8 devices by columns."""
    shape = f"tensor<{rows}x{columns}xf32>"
    return f"""
module @product attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["x"=8]>
  func.func public @main(
      %r: {shape} {{sdy.sharding = #sdy.sharding<@mesh, [{{}}, {{}}]>}},
      %c: {shape} {{sdy.sharding = #sdy.sharding<@mesh, [{{}}, {{"x"}}]>}})
      -> ({shape} {{sdy.sharding = #sdy.sharding<@mesh, [{{}}, {{"x"}}]>}}) {{
    %0 = stablehlo.multiply %r, %c : {shape}
    return %0 : {shape}
  }}
}}"""


@pytest.mark.parametrize("past", [0, 16], ids=["on-a-64-byte-boundary", "16-bytes-past"])
@pytest.mark.parametrize("rows", [4, 64, 2048], ids=["8KiB", "256KiB", "8MiB"])
def test_numpy_arguments_over_8_devices_changed_as_the_call_returns(client, rows, past):
    """The same promise on 8 devices: a replicated value (staged once from 100 KiB) and one
    split into 8 shards, both changed as soon as the call returns."""
    mesh = pjrt.Mesh(np.array(client.devices()[:8]), ("x",))
    compiled = pjrt.compile(_spmd_product(rows, 1024), mesh)
    rng = np.random.default_rng(rows)
    r0 = rng.standard_normal((rows, 1024)).astype(np.float32)
    c0 = rng.standard_normal((rows, 1024)).astype(np.float32)
    for _ in range(3):
        r, c = _on_boundary(r0, past), _on_boundary(c0, past)
        out = compiled(r, c)
        r[:] = 1e9
        c[:] = -1e9
        np.testing.assert_allclose(np.asarray(out), r0 * c0, rtol=1e-6)


def _two_dots(rows: int, width: int) -> str:
    """relu(x @ w) @ w: XLA's CPU plugins run both products with XNNPACK, which packs ``w``."""
    x, w = f"tensor<{rows}x{width}xf32>", f"tensor<{width}x{width}xf32>"
    return f"""
func.func public @main(%x: {x}, %w: {w}) -> {x} {{
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : ({x}, {w}) -> {x}
  %zero = stablehlo.constant dense<0.0> : {x}
  %1 = stablehlo.maximum %0, %zero : {x}
  %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : ({x}, {w}) -> {x}
  return %2 : {x}
}}"""


@pytest.mark.parametrize("form", ["numpy", "placed"])
def test_new_weights_at_a_reused_address_give_the_new_product(cpu_plugin, client, device,
                                                               form):
    """Ten calls, each with new weights: as a numpy argument (its copy is freed after the
    call, so the next copy may land at the same address) or placed with device_put and
    deleted after the call (staging memory comes back at the same address).

    xla-cpu-pjrt (PJRT 0.81) keeps XNNPACK's packed weights by the buffer's address, so on it
    these calls gave earlier weights' products until pjrt compiled without XNNPACK there
    (pjrt._compile.pipeline.XNNPACK_RIGHT_FROM_MINOR); fastatomstruct (0.106) is right with it."""
    compiled = pjrt.compile(_two_dots(128, 512), device)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((128, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 512)) / 23).astype(np.float32)
    placed_x = pjrt.device_put(x, device)
    stale = []
    for i in range(1, 11):
        weights = w * i
        if form == "numpy":
            got = np.asarray(compiled(x, weights))
        else:
            placed = pjrt.device_put(weights, device)
            got = np.asarray(compiled(placed_x, placed))
            placed.delete()
        expected = np.maximum(x @ weights, 0) @ weights
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-3 * i * i):
            stale.append(i)
    assert not stale, f"calls {stale} of 10 gave the product of earlier weights"


@pytest.mark.parametrize("minor, off", [(81, True), (105, True), (106, False), (115, False)])
def test_cpu_plugins_before_right_xnnpack_compile_without_it(minor, off):
    """The options pjrt sends XLA's CPU plugin: XNNPACK off on builds older than the first
    whose packed weights are right, and only where the caller left the choice open."""
    from pjrt._compile.pipeline import XNNPACK_OFF, serialize_with_jax_defaults

    options = pjrt.CompileOptions()
    sent = pjrt.CompileOptions.from_serialized(
        serialize_with_jax_defaults("cpu", options, minor))
    assert (XNNPACK_OFF in sent.env_option_overrides) is off
    assert options.env_option_overrides == []  # the caller's options are left as they were
    assert XNNPACK_OFF not in pjrt.CompileOptions.from_serialized(
        serialize_with_jax_defaults("cuda", options, minor)).env_option_overrides
    chosen = pjrt.CompileOptions(env_option_overrides={"xla_cpu_use_xnnpack": True})
    sent = pjrt.CompileOptions.from_serialized(
        serialize_with_jax_defaults("cpu", chosen, minor))
    assert sent.env_option_overrides == [("xla_cpu_use_xnnpack", True)]
