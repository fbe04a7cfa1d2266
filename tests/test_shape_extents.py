"""Shapes whose extents XLA cannot multiply out are refused before a plugin sees them.

XLA makes every shape it is given by multiplying the element's byte width by the extents, in
order, and refuses the shape when a product overflows int64, even when a later extent is 0
(``(2**62, 2**62, 0)``, or ``(3, 2**61, 0)`` of float32). Inside a plugin's C API call that
refusal ends the process (both CPU plugins abort). pjrt checks the same rule on each path
that passes a shape on: streamed transfers, compiles (every static tensor type of a text
program; compile options' argument layouts, as `pjrt.shapes.Shape`), default layouts and
DLPack imports. A shape XLA accepts still goes through each path, zero-size ones with huge
extents included. jaxlib's ``Shape.array_shape`` (which applies XLA's rule) is the oracle of
the rule itself.
"""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from pjrt.shapes import Shape
from pjrt._wire.shape_extents import check_extents, extents_overflow

from conftest import cpu_plugin_path, run_python

#: (dims, dtype): zero-size shapes whose running product overflows, and their near misses.
SHAPES = [
    ((2**62, 2**62, 0), np.float32),
    ((3, 2**61, 0), np.float32),      # 4 * 3 * 2**61 > 2**63 - 1
    ((3, 2**61, 0), np.uint8),        # 1 * 3 * 2**61 fits
    ((0, 2**62, 2**62), np.float32),  # 0 first: the product stays 0
    ((2**62, 0, 2**62), np.int8),     # 2**62 fits, then 0
    ((2**62, 2, 0), np.int8),         # 2**63 does not
    ((2**61 - 1, 4), np.float32),
    ((2**61, 4), np.float32),
    ((2**63 - 1,), np.bool_),
    ((2**63 - 1,), ml_dtypes.int4),   # a byte each, as XLA counts it
    ((2**59, 0), np.complex128),
    ((2**60, 0), np.complex128),
    ((), np.float64),
]


def test_the_rule_is_xlas():
    """Refused exactly where jaxlib's Shape.array_shape (XLA's own rule) refuses."""
    from jax._src.lib import xla_client

    for dims, dtype in SHAPES:
        try:
            xla_client.Shape.array_shape(np.dtype(dtype), dims)
            xla_refuses = False
        except Exception as error:  # noqa: BLE001 - jaxlib's XlaRuntimeError
            assert "overflow in static extent product" in str(error), error
            xla_refuses = True
        ours = extents_overflow(dims, np.dtype(dtype).itemsize) is not None
        assert ours == xla_refuses, (dims, dtype)
        if xla_refuses:
            with pytest.raises(ValueError, match=r"the shape .* cannot be given to a plugin: its "
                                                 r"extents overflow int64 at dimension \d"):
                Shape.array_shape(np.dtype(dtype), dims)
        else:
            assert Shape.array_shape(np.dtype(dtype), dims).dimensions() == dims


def test_the_error_names_the_shape_the_extent_and_the_rule():
    with pytest.raises(ValueError) as info:
        check_extents((3, 2**61, 0), 4, "shapes[0] ((3, 2305843009213693952, 0), float32)")
    said = str(info.value)
    assert said.startswith("shapes[0] ((3, 2305843009213693952, 0), float32) cannot be given")
    assert "at dimension 1 (4 * 3 * 2305843009213693952 bytes > 2**63 - 1)" in said
    assert "multiplied in order, to fit in int64 (2**63 - 1) at every step, even when a later " \
           "extent is 0" in said
    with pytest.raises(ValueError, match="the shape f32"):
        Shape("f32[3,2305843009213693952,0]")  # XLA's spelling is checked too


def test_a_numpy_array_always_keeps_the_rule():
    """numpy refuses an array whose byte width times its non-zero extents overflows, which
    keeps every running product in range: host values need no check."""
    for dims, dtype in SHAPES:
        if 0 not in dims:
            continue  # (numpy would try to allocate them)
        try:
            host = np.empty(dims, dtype)
        except ValueError:
            continue
        assert extents_overflow(host.shape, host.dtype.itemsize) is None, dims


#: Run in a child process: on a path pjrt did not guard, the plugin ends the process.
_EVERY_PATH = """
    import json, sys
    import numpy as np, pjrt, torch
    from pjrt import dlpack
    from pjrt.compile_options import CompileOptions
    from pjrt.shapes import Shape

    pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
    client = pjrt.make_c_api_client("cpu")
    device = client.local_devices()[0]
    memory = device.default_memory()
    dims, dtype, type_name = eval(sys.argv[2]), np.dtype(sys.argv[3]), sys.argv[4]
    tensor = "tensor<" + "x".join(map(str, dims)) + "x" + type_name + ">"
    identity = ("func.func public @main(%x: " + tensor + ") -> " + tensor
                + " { return %x : " + tensor + " }")
    scalar = "tensor<" + type_name + ">"
    called = chr(10).join([  # the type only in a function main calls
        "module @m {",
        "func.func private @g(%y: " + tensor + ") -> tensor<f32> {",
        "  %c = stablehlo.constant dense<1.0> : tensor<f32>",
        "  return %c : tensor<f32>",
        "}",
        "func.func public @main(%x: " + scalar + ") -> tensor<f32> {",
        "  %0 = stablehlo.broadcast_in_dim %x, dims = [] : (" + scalar + ") -> " + tensor,
        "  %1 = func.call @g(%0) : (" + tensor + ") -> tensor<f32>",
        "  return %1 : tensor<f32>",
        "}",
        "}"])

    def argument_layouts():
        options = CompileOptions()
        options.argument_layouts = [Shape.array_shape(dtype, dims)]
        return client.compile_and_load(identity, [device], options)

    paths = {
        "stream (dims, dtype)": lambda: client.create_buffers_for_async_host_to_device(
            [(dims, dtype)], memory).retrieve_buffer(0),
        "stream Shape": lambda: client.create_buffers_for_async_host_to_device(
            [Shape.array_shape(dtype, dims)], memory).retrieve_buffer(0),
        "compile: main's signature": lambda: client.compile_and_load(identity, [device]),
        "compile: a called function": lambda: client.compile_and_load(called, [device]),
        "compile options: argument_layouts": argument_layouts,
        "default layout": lambda: client.get_default_layout(dtype, dims),
        "DLPack (PyTorch)": lambda: dlpack.from_dlpack(
            torch.empty(dims, dtype=getattr(torch, dtype.name)), device),
        "DLPack copy (PyTorch)": lambda: dlpack.from_dlpack(
            torch.empty(dims, dtype=getattr(torch, dtype.name)), device, copy=True),
    }
    said = {}
    for name, path in paths.items():
        if name.startswith("DLPack"):
            try:
                torch.empty(dims, dtype=getattr(torch, dtype.name))
            except RuntimeError:  # PyTorch refuses some such shapes itself
                said[name] = "the producer cannot make it"
                continue
        try:
            result = path()
            said[name] = "ok"
            if name.startswith("stream") or name.startswith("DLPack"):
                said[name] = "ok " + str(np.asarray(result).shape)
        except ValueError as error:
            said[name] = "ValueError " + str(error)
    print(json.dumps(said))
"""


@pytest.mark.slow
@pytest.mark.parametrize("dims, dtype, type_name, refused", [
    ((2**62, 2**62, 0), "float32", "f32", True),
    ((3, 2**61, 0), "float32", "f32", True),
    ((3, 2**61, 0), "uint8", "ui8", False),   # XLA's rule holds: every path takes it
])
def test_every_path_refuses_before_the_plugin(cpu_plugin, dims, dtype, type_name, refused):
    result = run_python(_EVERY_PATH, cpu_plugin_path(cpu_plugin.name), repr(dims), dtype,
                        type_name, timeout=300)
    said = json.loads(result.stdout.splitlines()[-1])
    assert len(said) == 8
    assert said["DLPack (PyTorch)"] != "the producer cannot make it" or dims[0] == 2**62
    for path, outcome in said.items():
        if outcome == "the producer cannot make it":
            continue
        if refused:
            assert outcome.startswith("ValueError "), (path, outcome)
            assert "cannot be given to a plugin: its extents overflow int64 at dimension" \
                   in outcome, (path, outcome)
            assert str(dims[1]) in outcome, (path, outcome)
        else:
            assert outcome.startswith("ok"), (path, outcome)
            if outcome != "ok":
                assert outcome == f"ok {dims}", (path, outcome)
