"""Checks that compile StableHLO and run it on one device, results checked against numpy."""
from __future__ import annotations

import os

import numpy as np

from ... import ffi as pjrt_ffi
from ...errors import XlaRuntimeError
from ...program import compile as compile_program
from . import programs
from ._context import refused
from ._registry import CheckFailed, Skip, check

COMPILED = "compile.elementwise"


def can_compile(ctx) -> None:
    """Skip when the plugin cannot compile (api.function_table reports that once)."""
    for function in ("PJRT_Client_Compile", "PJRT_LoadedExecutable_Execute"):
        if not ctx.api.has(function):
            raise Skip(f"the plugin has no {function}")


def _run(ctx, text: str, *arguments):
    can_compile(ctx)
    compiled = compile_program(text, ctx.client.local_devices()[0], client=ctx.client)
    outputs = compiled(*arguments)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return compiled, [np.asarray(output) for output in outputs]


def expect(name: str, got: np.ndarray, expected: np.ndarray, exact: bool = False) -> None:
    """Raise CheckFailed unless ``got`` has the dtype and shape of ``expected`` and its values
    (exactly, or to float32 rounding)."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise CheckFailed(f"{name}: got {got.dtype}{list(got.shape)}, expected "
                          f"{expected.dtype}{list(expected.shape)}")
    ok = np.array_equal(got, expected) if exact else np.allclose(got, expected, rtol=1e-5,
                                                                  atol=1e-6)
    if not ok:
        raise CheckFailed(f"{name}: got {np.array2string(got.ravel()[:6])}..., expected "
                          f"{np.array2string(expected.ravel()[:6])}...")


@check(COMPILED)
def elementwise(ctx):
    """tanh(a*b) + 1 - b compiles, runs and matches numpy."""
    a = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    b = np.linspace(0.5, 3, 6, dtype=np.float32).reshape(2, 3)
    _, (out,) = _run(ctx, programs.ELEMENTWISE, a, b)
    expect("result", out, (np.tanh(a * b) + 1 - b).astype(np.float32))
    return "2x3 float32 matches numpy"


@check("compile.reduce")
def reduce(ctx):
    """Sum and max reductions over either axis match numpy."""
    x = np.arange(20, dtype=np.float32).reshape(4, 5) * np.float32(0.25) - 2
    _, (total, high) = _run(ctx, programs.REDUCE, x)
    expect("sum over axis 1", total, x.sum(axis=1))
    expect("max over axis 0", high, x.max(axis=0), exact=True)
    return "sum over axis 1, max over axis 0"


@check("compile.while_loop")
def while_loop(ctx):
    """A ten-step while loop carrying a counter and a vector matches numpy."""
    x = np.array([1, -2, 3.5, 8], np.float32)
    _, (out,) = _run(ctx, programs.WHILE_LOOP, x)
    expected = x.copy()
    for i in range(10):
        expected = expected * np.float32(0.5) + np.float32(i)
    expect("result", out, expected)
    return "10 iterations"


@check("compile.sort")
def sort(ctx):
    """A stable sort with an index payload matches numpy's sort and argsort."""
    x = np.array([5, -1, 3, 3, 0.5, -7, 2, 9, 1, 1, -2, 4, 8, 6, -3, 0], np.float32)
    _, (values, order) = _run(ctx, programs.SORT, x)
    expect("values", values, np.sort(x), exact=True)
    expect("indices", order, np.argsort(x, kind="stable").astype(np.int32), exact=True)
    return "16 float32 with ties, stable"


@check("compile.multi_output")
def multi_output(ctx):
    """A program with four outputs of three dtypes (one 0-d) returns each correctly."""
    x = np.array([1.5, -2, 4], np.float32)
    y = np.array([3, -1, 2], np.int32)
    _, outs = _run(ctx, programs.MULTI_OUTPUT, x, y)
    if len(outs) != 4:
        raise CheckFailed(f"{len(outs)} outputs, the program has 4")
    expect("x+x", outs[0], x + x, exact=True)
    expect("y*y", outs[1], y * y, exact=True)
    expect("x>y", outs[2], x > y.astype(np.float32), exact=True)
    expect("sum(x)", outs[3], np.array(x.sum(), np.float32))
    return "float32, int32, pred and a 0-d float32"


@check("execute.donation", needs=(COMPILED,))
def donation(ctx):
    """A donated argument is consumed by the run and the result is right."""
    can_compile(ctx)
    client = ctx.client
    compiled = compile_program(programs.DONATION, client.local_devices()[0], client=client)
    host = np.arange(8, dtype=np.float32)
    argument = client.buffer_from_pyval(host)
    out = compiled.executable.execute([argument])[0]
    expect("result", np.asarray(out), host + 1, exact=True)
    if not argument.is_deleted():
        raise CheckFailed("the donated argument is still alive after the run")
    return "the argument was consumed; the result is right"


@check("executable.metadata", needs=(COMPILED,))
def metadata(ctx):
    """A compiled executable reports its name, outputs and their types and shapes."""
    text = programs.renamed(programs.MULTI_OUTPUT, "conform_executable_metadata")
    compiled, _ = _run(ctx, text, np.zeros(3, np.float32),
                       np.zeros(3, np.int32))
    executable = compiled.executable
    if executable.num_outputs != 4:
        raise CheckFailed(f"PJRT_Executable_NumOutputs says {executable.num_outputs}, not 4")
    name = executable.name()
    shapes = executable.output_shapes
    if shapes is not None and [tuple(s) for s in shapes] != [(3,), (3,), (3,), ()]:
        raise CheckFailed(f"output shapes {shapes}, expected [(3,), (3,), (3,), ()]")
    types = executable.output_dtypes
    if types is not None and [np.dtype(t).name for t in types] != ["float32", "int32", "bool",
                                                                  "float32"]:
        raise CheckFailed(f"output types {types}")
    return f"name {name!r}, 4 outputs" + (", shapes and types right" if shapes else "")


@check("executable.serialize_roundtrip", needs=(COMPILED,))
def serialize_roundtrip(ctx):
    """An executable serialized and loaded again gives the same results."""
    if not ctx.api.has("PJRT_Executable_Serialize"):
        raise Skip("the plugin has no PJRT_Executable_Serialize")
    if not ctx.api.has("PJRT_Executable_DeserializeAndLoad"):
        raise Skip("the plugin has no PJRT_Executable_DeserializeAndLoad")
    x = np.array([5, -1, 3, 0.5], np.float32)
    text = programs.renamed(programs.WHILE_LOOP, "conform_serialize_roundtrip")
    compiled, (first,) = _run(ctx, text, x)
    blob = compiled.executable.serialize()
    loaded = ctx.client.deserialize_executable(blob)
    again = np.asarray(loaded.execute([ctx.client.buffer_from_pyval(x)])[0])
    expect("result after the round trip", again, first, exact=True)
    return f"{len(blob)} bytes; same result"


@check("errors.bad_program")
def bad_program(ctx):
    """Programs that do not parse or do not verify are refused with an error, not a crash."""
    can_compile(ctx)
    seen = []
    for what, text in (("unparsable text", programs.NOT_A_PROGRAM),
                       ("an ill-typed module", programs.ILL_TYPED)):
        try:
            compile_program(text, ctx.client.local_devices()[0], client=ctx.client)
        except XlaRuntimeError as error:
            if not error.plugin_message.strip():
                raise CheckFailed(f"{what} was refused with {error.code_name} and no message")
            seen.append(f"{what}: {error.code_name}")
            continue
        except ValueError as error:  # pjrt's own reading of the program refused it first
            seen.append(f"{what}: refused by the host ({error})")
            continue
        raise CheckFailed(f"{what} compiled without an error")
    return "; ".join(seen)


@check("ffi.custom_call", needs=(COMPILED,))
def custom_call(ctx):
    """A custom call to an XLA FFI handler registered through the FFI extension runs."""
    if not pjrt_ffi.has_ffi_extension(ctx.plugin):
        raise Skip("the plugin offers no FFI extension")
    target = f"pjrt_conform_affine_{os.getpid()}"
    calls = []

    def affine(operands, results, attributes):
        calls.append(attributes)
        results[0][...] = operands[0] * attributes["scale"] + attributes["offset"]

    platform = ctx.client.platform
    if platform.lower() not in ("cpu", "host"):
        raise Skip(f"the check's handler is Python, which reads host memory; {platform!r} "
                   f"passes device memory to handlers (a C handler would be needed)")
    try:
        pjrt_ffi.register_custom_call_target(target, affine, platform=platform)
    except XlaRuntimeError as error:
        raise CheckFailed(f"registering an FFI handler failed: {refused(error)}") from None
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _, (out,) = _run(ctx, programs.custom_call(target), x)
    if not calls:
        raise CheckFailed("the handler was never called")
    expect("result", out, x * 2 + 1, exact=True)
    return f"handler registered for {platform!r}, called with its attributes"
