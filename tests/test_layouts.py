"""Layouts, Shapes and PrimitiveType, checked against jaxlib (the oracle) and the real plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from pjrt._capi import api as _c
from pjrt._pjrt_cffi import lib
from pjrt.compile_options import CompileOptions
from pjrt.errors import UnsupportedFeatureError
from pjrt.layouts import Format, Layout, PjRtLayout, has_layouts_extension
from pjrt.shapes import PrimitiveType, Shape

jax = pytest.importorskip("jax")
jnp = jax.numpy
import jax.extend  # noqa: E402  (the backend's get_default_layout is the oracle)
from jax._src.lib import xla_client as xc  # noqa: E402


# -- Layout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [((1, 0),), ((0, 1),), ((),), ((2, 0, 1),),
                                  ((0,), ((1024,),), 4), ((1, 0), ((8, 128),), 0)])
def test_layout_spelling_matches_jaxlib(args):
    ours = Layout(*args)
    theirs = xc.Layout(*args) if len(args) != 2 else None
    if theirs is not None:
        assert ours.to_string() == theirs.to_string()
        assert ours.minor_to_major() == tuple(theirs.minor_to_major())
        assert [tuple(t) for t in ours.tiling()] == [tuple(t) for t in theirs.tiling()]
        assert ours.element_size_in_bits() == theirs.element_size_in_bits()
    assert Layout.from_string(ours.to_string()) == ours
    assert Layout.from_proto(ours.to_proto()) == ours
    assert hash(Layout.from_proto(ours.to_proto())) == hash(ours)


def test_layout_validation():
    with pytest.raises(ValueError, match="permutation"):
        Layout((0, 0))
    with pytest.raises(ValueError, match="below 1"):
        Layout((0,), ((0,),))
    with pytest.raises(ValueError, match="layout"):
        Layout.from_string("1,0")
    assert Layout((1, 0)).is_row_major() and not Layout((0, 1)).is_row_major()


# -- client and array layouts ----------------------------------------------------------------

def test_both_cpu_plugins_have_the_layouts_extension(cpu_plugin):
    assert _c.find_extension(cpu_plugin.api, lib.PJRT_Extension_Type_Layouts) is not None
    assert has_layouts_extension(cpu_plugin.api)
    # 0.81's extension predates executable parameter layouts; 0.106's has them.
    assert has_layouts_extension(cpu_plugin.api,
                                 "PJRT_Layouts_PJRT_Executable_GetParameterLayouts") == (
        cpu_plugin.api.version >= (0, 106))


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.complex128])
def test_default_layout_matches_jax(client, shape, dtype):
    backend = jax.extend.backend.get_backend("cpu")
    theirs = backend.get_default_layout(np.dtype(dtype), shape, jax.devices("cpu")[0])
    ours = client.get_default_layout(dtype, shape, client.local_devices()[0])
    assert isinstance(ours, PjRtLayout)
    assert str(ours) == str(theirs)
    assert ours._xla_layout().to_string() == theirs._xla_layout().to_string()
    assert PjRtLayout.deserialize(ours.serialize()) == ours


def test_array_format_and_layout(client):
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    array = client.buffer_from_pyval(host)
    oracle = jnp.asarray(host)
    assert str(array.layout) == str(oracle.format.layout.major_to_minor and "{1,0}")
    assert array.layout.layout.minor_to_major() == tuple(
        reversed(oracle.format.layout.major_to_minor))
    assert isinstance(array.format, Format)
    assert array.format.layout == array.layout
    assert array.format.sharding == array.sharding


def _program(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_executable_layouts_match_jax(client):
    x = jnp.ones((2, 3), jnp.float32)
    fn = lambda a, b: (a.T, a + b, jnp.sum(a))  # noqa: E731
    compiled = jax.jit(fn).lower(x, x).compile()
    executable = client.compile_and_load(_program(fn, x, x), client.local_devices()[:1])
    runtime = compiled.runtime_executable()
    assert [str(layout) for layout in executable.get_parameter_layouts()] == [
        str(layout) for layout in runtime.get_parameter_layouts()]
    assert [str(layout) for layout in executable.get_output_layouts()] == [
        str(layout) for layout in runtime.get_output_layouts()]
    assert executable.input_layouts == executable.get_parameter_layouts()
    assert executable.output_layouts == executable.get_output_layouts()
    assert executable.get_output_memory_kinds() == runtime.get_output_memory_kinds()


def test_argument_layouts_compile_and_are_enforced(client):
    x = jnp.ones((2, 3), jnp.float32)
    text = _program(lambda a: a * 2, x)
    options = CompileOptions()
    options.argument_layouts = [Shape.array_shape(np.float32, (2, 3), (0, 1))]
    round_trip = CompileOptions.from_serialized(options.SerializeAsString())
    assert round_trip.argument_layouts == options.argument_layouts
    executable = client.compile_and_load(text, client.local_devices()[:1], options)
    assert [str(layout) for layout in executable.get_parameter_layouts()] == ["{0,1}"]
    row_major = client.buffer_from_pyval(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match=r"laid out as \{1,0\}.*\{0,1\}"):
        executable.execute([row_major])
    with pytest.raises(TypeError, match="Shape"):
        options.argument_layouts = [(0, 1)]


def test_an_entry_the_plugin_lacks_is_a_clear_error(cpu_plugin):
    # 0.81's layouts extension ends before the executable parameter layouts entry: asking
    # for it names what is missing; 0.106's has it.
    from pjrt.layouts import layouts_extension

    entry = "PJRT_Layouts_PJRT_Executable_GetParameterLayouts"
    if cpu_plugin.api.version < (0, 106):
        with pytest.raises(UnsupportedFeatureError, match="older version without this entry"):
            layouts_extension(cpu_plugin.api, entry)
    else:
        assert layouts_extension(cpu_plugin.api, entry) is not None


# -- Shape and PrimitiveType -----------------------------------------------------------------

def test_primitive_type_matches_jaxlib():
    theirs = {name: int(value) for name, value in xc.PrimitiveType.__members__.items()}
    for name, number in theirs.items():
        assert int(PrimitiveType[name]) == number, name


def test_primitive_type_declaration_for_the_type_checker_matches_the_table():
    # shapes.py spells the members out under TYPE_CHECKING; the runtime enum is built from
    # pjrt.dtypes' table. The two must name the same members with the same numbers.
    import ast
    import inspect

    from pjrt import shapes
    tree = ast.parse(inspect.getsource(shapes))
    declared = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "PrimitiveType":
            for item in node.body:
                if isinstance(item, ast.Assign):
                    declared[item.targets[0].id] = item.value.value
    assert declared == {m.name: int(m) for m in PrimitiveType}


@pytest.mark.parametrize("text", ["f32[2,3]", "f32[2,3]{0,1}", "s32[]", "pred[7]",
                                  "(f32[2], s32[])", "bf16[4,1]{1,0}"])
def test_shape_text_matches_jaxlib(text):
    ours, theirs = Shape(text), xc.Shape(text)
    assert str(ours) == str(theirs)
    assert ours.is_tuple() == theirs.is_tuple() and ours.is_array() == theirs.is_array()
    if ours.is_array():
        assert ours.dimensions() == tuple(theirs.dimensions())
        assert ours.rank() == theirs.rank()
        assert ours.numpy_dtype() == theirs.numpy_dtype()
    assert Shape.from_proto(ours.to_proto()) == ours


def test_shape_constructors_match_jaxlib():
    ours = Shape.array_shape(np.float32, (2, 3), (0, 1))
    theirs = xc.Shape.array_shape(np.dtype(np.float32), (2, 3), (0, 1))
    assert str(ours) == str(theirs)
    pair = Shape.tuple_shape([ours, Shape.array_shape(PrimitiveType.S32, ())])
    assert str(pair) == str(xc.Shape.tuple_shape(
        [theirs, xc.Shape.array_shape(xc.PrimitiveType.S32, ())]))
    assert pair.leaf_count() == 2 and pair.tuple_shapes()[0] == ours
    with pytest.raises(ValueError, match="shape"):
        Shape("f32(2)")
    with pytest.raises(ValueError, match="element type"):
        Shape("q9[2]")


def test_format_and_pjrt_names_exist():
    assert pjrt.layouts.Format(None).sharding is None


# -- outputs a program lays out other than row-major ------------------------------------------

def _column_major_program(shape: tuple, layout: str) -> str:
    dims = "x".join(map(str, shape))
    return f"""
func.func public @main(%a: tensor<{dims}xf32>) -> (tensor<{dims}xf32> {{mhlo.layout_mode = "{layout}"}}) {{
  %0 = stablehlo.add %a, %a : tensor<{dims}xf32>
  return %0 : tensor<{dims}xf32>
}}"""


# Small (copied on read) and large (a view of the buffer on CPU plugins); 2-d and 3-d.
@pytest.mark.parametrize("shape, layout", [((2, 3), "{0,1}"), ((300, 500), "{0,1}"),
                                           ((2, 3, 4), "{0,2,1}"), ((4, 5, 6), "{1,0,2}")])
def test_an_output_laid_out_otherwise_reads_its_logical_value(client, shape, layout):
    device = client.local_devices()[0]
    executable = client.compile_and_load(_column_major_program(shape, "{" + layout[1:-1] + "}"),
                                         [device])
    assert str(executable.get_output_layouts()[0]) == layout
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    (y,) = executable.execute([client.buffer_from_pyval(x, device)])
    assert str(y.layout) == layout and y.stored_order is not None
    np.testing.assert_array_equal(np.asarray(y), 2 * x)
    np.testing.assert_array_equal(np.asarray(y), 2 * x)  # the cached read too
    np.testing.assert_array_equal(y.tolist(), (2 * x).tolist())
    # copies, on this device and another, and DLPack's view, agree
    import copy
    np.testing.assert_array_equal(np.asarray(copy.copy(y)), 2 * x)
    np.testing.assert_array_equal(np.asarray(y.copy_to_device(client.local_devices()[1])), 2 * x)
    np.testing.assert_array_equal(np.from_dlpack(y), 2 * x)
    with pytest.raises(ValueError):
        np.asarray(y)[(0,) * len(shape)] = 1  # still read-only


def test_an_output_laid_out_otherwise_is_refused_by_a_program_taking_row_major(client):
    device = client.local_devices()[0]
    column = client.compile_and_load(_column_major_program((2, 3), "{0,1}"), [device])
    row = client.compile_and_load(_column_major_program((2, 3), "default"), [device])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = column.execute([client.buffer_from_pyval(x, device)])
    for _ in range(3):  # the first call and the per-call path after it
        with pytest.raises(ValueError, match=r"laid out as \{0,1\}.*row-major"):
            row.execute([y])
    (z,) = row.execute([client.buffer_from_pyval(np.asarray(y), device)])
    np.testing.assert_array_equal(np.asarray(z), 4 * x)
    # a row-major output of the same program family still takes the per-call path's values
    (w,) = row.execute([z])
    np.testing.assert_array_equal(np.asarray(w), 8 * x)


def test_a_row_major_output_stores_row_major(client):
    device = client.local_devices()[0]
    row = client.compile_and_load(_column_major_program((2, 3), "default"), [device])
    (y,) = row.execute([client.buffer_from_pyval(np.ones((2, 3), np.float32), device)])
    assert y.stored_order is None and str(y.layout) == "{1,0}"
