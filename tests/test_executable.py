"""LoadedExecutable behaviour: donation, metadata, serialisation, errors, threads, lifetimes."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import pjrt
from fixtures import programs

TINY = programs.get("tiny_tanh")


def _put(client, values, device=None):
    return [client.buffer_from_pyval(v, device) for v in values]


def test_execute_returns_arrays_on_the_device(client, tiny):
    outputs = tiny.execute(_put(client, TINY.inputs()))
    assert len(outputs) == 1 and isinstance(outputs[0], pjrt.Array)
    assert outputs[0].device is client.local_devices()[0]
    programs.check_outputs(TINY, [np.asarray(outputs[0])])


def test_donated_argument_is_consumed(client):
    program = programs.get("donation")
    executable = client.compile_and_load(program.read_text())
    assert executable.donated_parameters == frozenset({0})
    (x,) = _put(client, program.inputs())
    (y,) = executable.execute([x])
    programs.check_outputs(program, [np.asarray(y)])
    assert x.is_deleted()
    with pytest.raises(pjrt.DeletedArrayError, match="donated"):
        np.asarray(x)
    with pytest.raises(pjrt.DeletedArrayError):
        executable.execute([x])


def test_donating_the_same_array_twice_is_refused(client):
    text = """
    func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.add %a, %b : tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    executable = client.compile_and_load(text)
    (x,) = _put(client, [np.ones(4, np.float32)])
    with pytest.raises(ValueError, match="donated"):
        executable.execute([x, x])
    assert not x.is_deleted()


def test_program_without_donation_keeps_inputs(client, tiny):
    inputs = _put(client, TINY.inputs())
    tiny.execute(inputs)
    assert not any(a.is_deleted() for a in inputs)
    np.testing.assert_array_equal(np.asarray(inputs[0]), TINY.inputs()[0])


def test_compiled_memory_stats_and_cost_analysis(client, tiny):
    stats = tiny.get_compiled_memory_stats()
    # Two float32[8] arguments and one float32[8] output.
    assert stats.argument_size_in_bytes == 64
    assert stats.output_size_in_bytes == 32
    cost = tiny.cost_analysis()
    assert isinstance(cost, dict)
    if cost:  # plugins that report costs count the program's flops
        assert cost["flops"] > 0


def test_names_counts_and_fingerprint(tiny):
    assert tiny.name() == "jit_tiny_tanh"
    assert tiny.num_replicas() == 1 and tiny.num_partitions() == 1
    fingerprint = tiny.fingerprint  # a property, as in jaxlib
    assert fingerprint is None or (isinstance(fingerprint, bytes) and fingerprint)


def test_optimized_module_names_the_parameters(tiny):
    module = tiny.optimized_module_proto()
    assert isinstance(module, bytes) and b"jit_tiny_tanh" in module


def test_optimized_program_text(tiny):
    text = tiny.hlo_text()
    assert text.startswith("HloModule jit_tiny_tanh")
    assert "ENTRY %" in text and "ROOT %" in text
    assert "tanh(" in text and "f32[8]{0} parameter(0)" in text


def test_hlo_modules_hold_the_optimized_module(tiny):
    (module,) = tiny.hlo_modules()
    assert isinstance(module, pjrt.executable.HloModule)
    assert module.name == "jit_tiny_tanh"
    assert module.as_serialized_hlo_module_proto() == tiny.optimized_module_proto()
    assert module.to_string() == tiny.hlo_text() == str(module)
    assert repr(module).startswith("HloModule(name='jit_tiny_tanh', ")


def test_hlo_module_from_its_serialized_proto(tiny):
    (module,) = tiny.hlo_modules()
    again = pjrt.executable.HloModule.from_serialized_hlo_module_proto(
        module.as_serialized_hlo_module_proto())
    assert again == module and hash(again) == hash(module)
    assert again.name == module.name and again.to_string() == module.to_string()


@pytest.mark.parametrize("data, why", [
    (b"", "no computations"),
    (b"\x0a\x03abc", "no computations"),  # a name and nothing else
    (b"\xff\xff\xff", "not a serialised HloModuleProto"),  # not protobuf at all
    (b"\x08\x05\x1a\x00", "name \\(field 1\\) is not a string"),  # name as a number
])
def test_hlo_module_refuses_what_is_not_a_module(data, why):
    with pytest.raises(ValueError, match=why):
        pjrt.executable.HloModule.from_serialized_hlo_module_proto(data)


SCALAR_TIMES_VECTOR = """
func.func public @main(%arg0: tensor<i32>, %arg1: tensor<4xi32>) -> tensor<4xi32> {
  %0 = stablehlo.broadcast_in_dim %arg0, dims = [] : (tensor<i32>) -> tensor<4xi32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<4xi32>
  return %1 : tensor<4xi32>
}
"""


def _portable(client, text=SCALAR_TIMES_VECTOR):
    options = pjrt.CompileOptions()
    options.compile_portable_executable = True
    return client.compile_and_load(text, compile_options=options)


def test_portable_executable_runs_on_the_device_chosen_at_each_call(client):
    executable = _portable(client)
    assert executable.local_devices() == []
    api = client.handle.api
    for device in client.local_devices()[:3]:
        arguments = _put(client, [np.int32(3), np.array([10, 15, -2, 7], np.int32)], device)
        (out,) = executable.execute(arguments, device=device)
        assert out.device is device
        # The plugin put the output there, not only the Array's record of it.
        placed = api.call_new("PJRT_Buffer_Device", buffer=out.live_buffers()[0]).device
        assert client.device_from_pointer(placed) is device
        np.testing.assert_array_equal(np.asarray(out), [30, 45, -6, 21])


def test_portable_executable_needs_a_device_and_arguments_on_it(client):
    executable = _portable(client)
    first, second = client.local_devices()[:2]
    arguments = _put(client, [np.int32(3), np.array([10, 15, -2, 7], np.int32)], first)
    with pytest.raises(ValueError, match="portable .* pass execute\\(arguments, device=...\\)"):
        executable.execute(arguments)
    with pytest.raises(ValueError, match="argument 0 is on .* runs it on"):
        executable.execute(arguments, device=second)
    with pytest.raises(ValueError, match="device= must be a device of this executable's client"):
        executable.execute(arguments, device="cpu:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes 2 arguments, 1 were given"):
        executable.execute(arguments[:1], device=first)
    with pytest.raises(ValueError, match="portable .* no shardings"):
        executable.input_shardings  # noqa: B018


NO_PARAMETERS = """
func.func public @main() -> tensor<4xi32> {
  %0 = stablehlo.constant dense<[1, 2, 3, 4]> : tensor<4xi32>
  return %0 : tensor<4xi32>
}
"""

ONE_PARAMETER = """
func.func public @main(%arg0: tensor<4xi32>) -> tensor<4xi32> {
  return %arg0 : tensor<4xi32>
}
"""


def test_portable_executable_launched_on_no_device_is_refused(client):
    """A portable executable has no devices of its own, so execute_sharded (which runs on an
    executable's own devices) and execute_with_token (on its one device) would reach the
    plugin's Execute with no device at all: XLA's CPU plugin crashes there on ``[[]]`` (jaxlib
    says INVALID_ARGUMENT: Execute expects a non-null device_assignment). Each is refused first,
    naming how to run it; execute(arguments, device=...) still runs it."""
    executable = _portable(client)
    arguments = _put(client, [np.int32(3), np.array([10, 15, -2, 7], np.int32)])
    refused = "portable .* no devices of its own.* execute\\(arguments, device=...\\)"
    with pytest.raises(ValueError, match=refused):
        _portable(client, ONE_PARAMETER).execute_sharded([[]])
    with pytest.raises(ValueError, match=refused):
        executable.execute_sharded([[], []])
    with pytest.raises(ValueError, match=refused):
        executable.execute_sharded([[], []], with_tokens=True)
    with pytest.raises(ValueError, match=refused):
        executable.execute_with_token(arguments)
    constant = _portable(client, NO_PARAMETERS)
    for launch in (lambda: constant.execute_sharded([]),
                   lambda: constant.execute_sharded([], with_tokens=True),
                   lambda: constant.execute_with_token([])):
        with pytest.raises(ValueError, match=refused):
            launch()
    device = client.local_devices()[1]
    (out,) = constant.execute([], device=device)
    assert out.device is device
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3, 4])
    (out,) = executable.execute(arguments, device=client.local_devices()[0])
    np.testing.assert_array_equal(np.asarray(out), [30, 45, -6, 21])


def test_the_launch_struct_is_never_made_for_no_device(client):
    """The one call struct every launch fills refuses to be made with neither a device list
    nor a device, whichever path would launch it (the plugin crashes on such a launch)."""
    from pjrt._pjrt_cffi import ffi
    from pjrt._runtime.launches import Call

    with pytest.raises(ValueError, match="a launch needs a device"):
        Call(client.handle, ffi.NULL, ffi.NULL, 1, 0, (ffi.NULL,) * 3, 0)


def test_a_program_without_parameters_runs_on_its_devices(client):
    """A program without parameters (no argument to carry a device) runs on its own devices
    through every launch: execute([]), execute_with_token([]), execute_sharded([])."""
    one = client.compile_and_load(NO_PARAMETERS)
    (out,) = one.execute([])
    assert out.device is client.local_devices()[0]
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3, 4])
    (out,), token = one.execute_with_token([])
    token.block_until_ready()
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3, 4])
    devices = client.local_devices()[:2]
    two = client.compile_and_load(NO_PARAMETERS, devices)
    results = two.execute_sharded([], with_tokens=True)
    results.consume_token().block_until_ready()
    (outputs,) = results.disassemble_into_single_device_arrays()
    assert [array.device for array in outputs] == devices
    for array in outputs:
        np.testing.assert_array_equal(np.asarray(array), [1, 2, 3, 4])


def test_device_of_a_fixed_executable_must_be_its_own(client):
    executable = client.compile_and_load(SCALAR_TIMES_VECTOR)
    own, other = client.local_devices()[:2]
    arguments = _put(client, [np.int32(3), np.array([10, 15, -2, 7], np.int32)], own)
    (out,) = executable.execute(arguments, device=own)  # its own device: a plain call
    np.testing.assert_array_equal(np.asarray(out), [30, 45, -6, 21])
    with pytest.raises(ValueError, match="compiled for .* call execute without device="):
        executable.execute(arguments, device=other)


def test_portable_executable_of_another_client_refuses_its_devices(client, make_client):
    other = make_client()
    executable = _portable(client)
    device = other.local_devices()[0]
    arguments = _put(other, [np.int32(3), np.array([10, 15, -2, 7], np.int32)], device)
    with pytest.raises(ValueError, match="device= must be a device of this executable's client"):
        executable.execute(arguments, device=device)


def test_serialize_and_deserialize_round_trip(client, tiny):
    blob = tiny.serialize()
    assert isinstance(blob, bytes) and len(blob) > 0
    loaded = client.deserialize_executable(blob)
    outputs = loaded.execute(_put(client, TINY.inputs()))
    programs.check_outputs(TINY, [np.asarray(outputs[0])])


def test_wrong_argument_count(client, tiny):
    with pytest.raises(TypeError, match="takes 2 arguments, 1 were given"):
        tiny.execute(_put(client, TINY.inputs()[:1]))


def test_wrong_argument_shape(client, tiny):
    a, b = TINY.inputs()
    with pytest.raises(TypeError, match=r"argument 1 has shape \(4,\)"):
        tiny.execute(_put(client, [a, b[:4]]))


def test_wrong_argument_dtype(client, tiny):
    a, b = TINY.inputs()
    with pytest.raises(TypeError, match="dtype float64"):
        tiny.execute(_put(client, [a, b.astype(np.float64)]))


def test_argument_on_another_device(client, tiny):
    a, b = TINY.inputs()
    other = client.local_devices()[1]
    with pytest.raises(ValueError, match="argument 1 is on"):
        tiny.execute([client.buffer_from_pyval(a), client.buffer_from_pyval(b, other)])


def test_host_array_passed_to_execute(client, tiny):
    with pytest.raises(TypeError, match="pjrt Arrays"):
        tiny.execute(TINY.inputs())


def test_deleted_argument(client, tiny):
    inputs = _put(client, TINY.inputs())
    inputs[0].delete()
    with pytest.raises(pjrt.DeletedArrayError):
        tiny.execute(inputs)


def test_deleted_executable(client):
    executable = client.compile_and_load(TINY.read_text())
    executable.delete()
    executable.delete()  # idempotent
    assert executable.is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        executable.execute(_put(client, TINY.inputs()))


def test_execute_sharded_rejects_wrong_shard_count(client):
    program = programs.get("spmd_elementwise_2d")
    executable = client.compile_and_load(program.read_text("gspmd"), client.local_devices())
    shard = client.buffer_from_pyval(np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="has 1 shards"):
        executable.execute_sharded([[shard]])


def test_threads_execute_concurrently(client, tiny):
    rng = np.random.default_rng(1)
    errors = []

    def work(seed):
        try:
            local = np.random.default_rng(seed)
            for _ in range(50):
                a = local.standard_normal(8).astype(np.float32)
                b = local.standard_normal(8).astype(np.float32)
                (out,) = tiny.execute(_put(client, [a, b]))
                np.testing.assert_allclose(np.asarray(out), np.tanh(a * b + 1), rtol=1e-5, atol=1e-6)
        except Exception as error:  # noqa: BLE001 - collected and re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(int(rng.integers(1 << 30)),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_live_executables_tracks_lifetimes(client):
    executable = client.compile_and_load(TINY.read_text())
    assert executable in client.live_executables()
    executable.delete()
    assert executable not in client.live_executables()


def test_repeated_execution_does_not_leak_buffers(client, tiny):
    gc.collect()
    before = len(client.live_arrays())
    inputs = _put(client, TINY.inputs())
    for _ in range(2000):
        (out,) = tiny.execute(inputs)
    np.asarray(out)
    del out
    gc.collect()
    assert len(client.live_arrays()) == before + 2


# -- outputs whose size each call decides -------------------------------------------------------

_DYNAMIC_OUTPUTS = """
func.func public @main(%x: tensor<2x3xf32>, %n: tensor<i32>)
    -> (tensor<2x?xf32, #stablehlo.bounds<?, 3>>, tensor<2xf32>) {
  %0 = stablehlo.set_dimension_size %x, %n, dim = 1
      : (tensor<2x3xf32>, tensor<i32>) -> tensor<2x?xf32, #stablehlo.bounds<?, 3>>
  %1 = stablehlo.constant dense<[7.0, 8.0]> : tensor<2xf32>
  return %0, %1 : tensor<2x?xf32, #stablehlo.bounds<?, 3>>, tensor<2xf32>
}"""


@pytest.mark.parametrize("size", [3, 2, 1, 0])
def test_an_output_of_dynamic_size_has_the_size_its_call_gave(client, size):
    """The plugin lays such an output out at its bound, the value dense at its start: the
    Array has the call's size and its value, never the padding."""
    executable = client.compile_and_load(_DYNAMIC_OUTPUTS)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first, second = executable.execute(_put(client, [x, np.int32(size)]))
    assert first.shape == (2, size)
    np.testing.assert_array_equal(np.asarray(first), x[:, :size])
    np.testing.assert_array_equal(np.asarray(second), [7, 8])  # the static one, untouched
    assert "f32[2,<=3]" in executable.hlo_modules()[0].to_string()


def test_outputs_of_dynamic_size_on_several_devices(make_client):
    client = make_client(2)
    executable = client.compile_and_load(_DYNAMIC_OUTPUTS, client.devices())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arguments = [[client.buffer_from_pyval(x, d) for d in client.devices()],
                 [client.buffer_from_pyval(np.int32(n), d)
                  for n, d in zip((1, 3), client.devices())]]
    firsts, _ = executable.execute_sharded(arguments).disassemble_into_single_device_arrays()
    assert [a.shape for a in firsts] == [(2, 1), (2, 3)]
    np.testing.assert_array_equal(np.asarray(firsts[0]), x[:, :1])
    with pytest.raises(pjrt.UnsupportedFeatureError, match="decides"):
        executable.execute_global([pjrt.device_put(x, pjrt.NamedSharding(
            pjrt.Mesh(np.array(client.devices()), ("x",)), pjrt.PartitionSpec())),
            pjrt.device_put(np.int32(1), pjrt.NamedSharding(
                pjrt.Mesh(np.array(client.devices()), ("x",)), pjrt.PartitionSpec()))])
