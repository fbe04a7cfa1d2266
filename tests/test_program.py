"""``pjrt.compile`` and :class:`~pjrt.program.CompiledProgram` (program.py): compiling for one
device, a device list, a Mesh or replicated devices, and calling the result with numpy arrays
and Arrays, on the real CPU plugins."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pjrt
from conftest import SLOW_SUM
from fixtures import programs

TINY = programs.get("tiny_tanh")

REPLICATED_PROGRAM = """
func.func public @main(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {
  %0 = stablehlo.multiply %x, %x : tensor<3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %0, %s : tensor<3xf32>, tensor<f32>
}"""


def test_pjrt_compile_callable_with_numpy_and_arrays(client):
    device = client.local_devices()[2]
    program = pjrt.compile(TINY.read_text(), device)
    a, b = TINY.inputs()
    result = program(a, client.buffer_from_pyval(b, device))
    assert isinstance(result, pjrt.Array)
    assert result.device is device
    programs.check_outputs(TINY, [np.asarray(result)])


def test_pjrt_compile_refuses_an_array_on_another_device(client):
    program = pjrt.compile(TINY.read_text(), client.local_devices()[2])
    a, b = TINY.inputs()
    with pytest.raises(pjrt.DeviceAssignmentMismatchError, match=r"argument 1 is on CpuDevice\(id=0\)"):
        program(a, client.buffer_from_pyval(b, client.local_devices()[0]))


def test_pjrt_compile_several_outputs_returns_tuple(client):
    program = programs.get("multi_output")
    compiled = pjrt.compile(program.read_text(), client.local_devices()[0])
    result = compiled(*program.inputs())
    assert isinstance(result, tuple) and len(result) == 3
    programs.check_outputs(program, [np.asarray(r) for r in result])



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


def test_an_array_placed_with_an_equal_named_sharding_is_taken_as_it_is(client, mesh):
    """The program reports its input sharding as a GSPMDSharding; an Array placed with the
    NamedSharding a user builds for the same layout is passed to it without a copy, by
    ``pjrt.compile``'s call and by ``execute_global`` alike, call after call."""
    program = programs.get("spmd_elementwise_2d")
    compiled = pjrt.compile(program.read_text("shardy"), mesh)
    (host,) = program.inputs()
    expected = program.expected()[0]
    x = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    wanted = compiled.input_shardings[0]
    assert x.sharding is not wanted and x.sharding != wanted
    assert pjrt.transfers.is_placed_as(x, wanted)
    for _ in range(3):
        assert pjrt.device_put(x, wanted) is x
        np.testing.assert_allclose(np.asarray(compiled(x)), expected, rtol=program.rtol,
                                   atol=program.atol)
        (out,) = compiled.executable.execute_global([x])
        np.testing.assert_allclose(np.asarray(out), expected, rtol=program.rtol,
                                   atol=program.atol)
    x.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        compiled(x)
    with pytest.raises(pjrt.DeletedArrayError):
        compiled.executable.execute_global([x])


def test_arrays_laid_out_otherwise_are_resharded_by_the_call_and_refused_by_execute_global(
        client, mesh):
    """Layouts that only look alike are not taken for the program's: another spec, another
    device order, another mesh shape, another memory kind. ``pjrt.compile``'s call reshards
    them (the result is right); ``execute_global`` refuses them."""
    program = programs.get("spmd_elementwise_2d")
    compiled = pjrt.compile(program.read_text("shardy"), mesh)
    (host,) = program.inputs()
    expected = program.expected()[0]
    devices = client.devices()
    order = [devices[i] for i in (1, 0, 2, 3, 4, 5, 6, 7)]
    others = {
        "another spec": pjrt.NamedSharding(mesh, pjrt.P("y", "x")),
        "another device order": pjrt.NamedSharding(
            pjrt.Mesh(np.array(order).reshape(2, 4), ("x", "y")), pjrt.P("x", "y")),
        "another mesh shape": pjrt.NamedSharding(
            pjrt.Mesh(np.array(devices).reshape(4, 2), ("x", "y")), pjrt.P("x", "y")),
        "another memory kind": pjrt.NamedSharding(mesh, pjrt.P("x", "y"),
                                                  memory_kind="pinned_host"),
    }
    wanted = compiled.input_shardings[0]
    for why, sharding in others.items():
        x = pjrt.device_put(host, sharding)
        for _ in range(2):  # the second time from the cached verdicts
            assert not pjrt.transfers.is_placed_as(x, wanted), why
            moved = pjrt.device_put(x, wanted)
            assert moved is not x and moved.sharding is wanted, why
            np.testing.assert_allclose(np.asarray(compiled(x)), expected, rtol=program.rtol,
                                       atol=program.atol, err_msg=why)
            with pytest.raises(ValueError, match="laid out as"):
                compiled.executable.execute_global([x])


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


def test_an_unevenly_sharded_output_is_refused_before_running(client):
    text = """func.func public @main(%x: tensor<6xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<6xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
      %0 = stablehlo.add %x, %x : tensor<6xf32>
      return %0 : tensor<6xf32>
    }"""
    compiled = pjrt.compile(text, client.devices()[:4])
    with pytest.raises(ValueError, match="splits unevenly"):
        compiled(np.ones(6, np.float32))


def test_compiled_program_with_a_large_host_argument(client):
    program = pjrt.compile(SLOW_SUM, client.local_devices()[0])
    y = program(np.ones(1 << 20, np.float32))  # the placed argument is dropped at once
    gc.collect()
    np.testing.assert_array_equal(np.asarray(y), np.full(1 << 20, 40, np.float32))


def test_one_device_program_properties(client):
    device = client.devices()[5]
    compiled = pjrt.compile(TINY.read_text(), device)
    assert compiled.devices == [device]
    assert len(compiled.input_shardings) == 2 and len(compiled.output_shardings) == 1
    assert repr(compiled).startswith("CompiledProgram(")
    result = compiled(*TINY.inputs())
    assert result.device is device
    programs.check_outputs(TINY, [np.asarray(result)])


def test_compile_with_a_client_and_no_devices_uses_its_first_device(client):
    compiled = pjrt.compile(TINY.read_text(), client=client)
    assert compiled.devices == [client.local_devices()[0]]
    programs.check_outputs(TINY, [np.asarray(compiled(*TINY.inputs()))])


def test_compile_bytecode_for_a_device(client):
    with open(programs.FIXTURES_DIR + "/" + programs.BYTECODE_FILE, "rb") as f:
        compiled = pjrt.compile(f.read(), client.devices()[1])
    programs.check_outputs(TINY, [np.asarray(compiled(*TINY.inputs()))])


def test_a_device_list_and_a_mesh_of_the_same_devices_compile_alike(client, mesh):
    program = programs.get("spmd_elementwise_2d")
    text = program.read_text("shardy")
    over_mesh = pjrt.compile(text, mesh)
    over_list = pjrt.compile(text, list(mesh.devices.flat))
    assert over_mesh.devices == over_list.devices == list(mesh.devices.flat)
    (x,) = program.inputs()
    for compiled in (over_mesh, over_list):
        np.testing.assert_allclose(np.asarray(compiled(x)), program.expected()[0],
                                   rtol=program.rtol, atol=program.atol)
    assert [s.to_hlo_sharding(2) for s in over_mesh.input_shardings] == \
        [s.to_hlo_sharding(2) for s in over_list.input_shardings]


def test_compile_with_given_options(client):
    options = pjrt.CompileOptions()
    compiled = pjrt.compile(TINY.read_text(), [client.devices()[3]], options)
    assert compiled.devices == [client.devices()[3]]
    programs.check_outputs(TINY, [np.asarray(compiled(*TINY.inputs()))])


def test_one_device_program_refuses_wrong_dtypes_and_deleted_arrays(client):
    compiled = pjrt.compile(TINY.read_text(), client.devices()[0])
    a, b = TINY.inputs()
    # A Python list becomes float64, which the program does not take: said, not converted.
    with pytest.raises(TypeError, match="argument 0 has shape \\(8,\\) and dtype float64, but "
                                        "the program expects shape \\(8,\\) and dtype float32"):
        compiled(a.tolist(), b)
    gone = client.buffer_from_pyval(b, client.devices()[4])
    gone.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        compiled(a, gone)

