"""Custom calls through pjrt.ffi: handlers written in Python and in C, on both CPU plugins.

A hand-written StableHLO program calls ``stablehlo.custom_call @target(...)`` with
``api_version = 4`` (typed XLA FFI) and a dictionary ``backend_config``; the plugin looks the
target up among the handlers registered through its PJRT FFI extension. Python handlers get
numpy views of the buffers and decoded attributes; an exception in one becomes an
XlaRuntimeError of the program. Registration works before and after a client exists, and a
plugin without the FFI extension is refused with a message naming the extensions it has.
"""
from __future__ import annotations

import ctypes
import itertools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import pjrt
from pjrt import ffi as pjrt_ffi
from pjrt._capi import api as _c
from pjrt._pjrt_cffi import ffi, lib
from conftest import run_python

HERE = Path(__file__).resolve().parent

_names = itertools.count()


def _unique(prefix: str) -> str:
    """A target name no other test used: XLA keeps a handler for the life of the process."""
    return f"{prefix}_{next(_names)}"


def _program(target: str, operands: list[str], results: list[str], attributes: str = "",
             has_side_effect: bool = False) -> str:
    params = ", ".join(f"%arg{i}: tensor<{t}>" for i, t in enumerate(operands))
    args = ", ".join(f"%arg{i}" for i in range(len(operands)))
    result_types = ", ".join(f"tensor<{t}>" for t in results)
    operand_types = ", ".join(f"tensor<{t}>" for t in operands)
    count = len(results)
    value = "%0" if count == 1 else ", ".join(f"%0#{i}" for i in range(count))
    binding = "%0" if count == 1 else f"%0:{count}"
    side = "has_side_effect = true, " if has_side_effect else ""
    return f"""
module @custom_call_test {{
  func.func public @main({params}) -> ({result_types}) {{
    {binding} = stablehlo.custom_call @{target}({args}) {{{side}api_version = 4 : i32,
        backend_config = {{{attributes}}}}} : ({operand_types}) -> ({result_types})
    return {value} : {result_types}
  }}
}}
"""


def _outputs(result):
    return [np.asarray(x) for x in (result if isinstance(result, tuple) else (result,))]


# -- Python handlers ---------------------------------------------------------------------------

def test_python_handler_round_trip(client):
    target = _unique("py_affine")
    seen = []

    def affine(operands, results, attributes):
        seen.append((operands[0].copy(), operands[0].flags.writeable,
                     results[0].flags.writeable, attributes))
        x, = operands
        results[0][...] = x * attributes["scale"] + attributes["offset"]

    pjrt.register_custom_call_target(target, affine, platform="cpu")
    attributes = ('scale = 2.5 : f32, offset = 1 : i64, label = "hello", flag = true, '
                  'ints = array<i64: 1, 2, 3>, floats = array<f64: 0.5, 1.5>, '
                  'nested = {depth = 2 : i32, name = "inner"}, small = -3 : i8, '
                  'unsigned = 200 : ui8, precise = 0.125 : f64')
    program = _program(target, ["2x3xf32"], ["2x3xf32"], attributes)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, = _outputs(pjrt.compile(program, client=client)(x))
    np.testing.assert_array_equal(out, x * 2.5 + 1)
    operand, operand_writable, result_writable, attrs = seen[-1]
    np.testing.assert_array_equal(operand, x)
    assert not operand_writable and result_writable
    assert attrs["scale"] == 2.5 and isinstance(attrs["scale"], float)
    assert attrs["offset"] == 1 and isinstance(attrs["offset"], int)
    assert attrs["label"] == "hello"
    assert attrs["flag"] is True
    np.testing.assert_array_equal(attrs["ints"], [1, 2, 3])
    assert attrs["ints"].dtype == np.int64
    np.testing.assert_array_equal(attrs["floats"], [0.5, 1.5])
    assert attrs["nested"] == {"depth": 2, "name": "inner"}
    assert attrs["small"] == -3 and attrs["unsigned"] == 200 and attrs["precise"] == 0.125
    assert pjrt.custom_call_targets("cpu")[target] is affine


def test_python_handler_may_return_results(client):
    """Several operands and results of several dtypes; the handler returns the values."""
    target = _unique("py_multi")

    def split(operands, results, attributes):
        a, b, flags = operands
        return a + b.real.astype(np.float64), (a * 2).astype(np.int32), ~flags

    pjrt.register_custom_call_target(target, split)
    program = _program(target, ["4xf64", "4xcomplex<f32>", "4xi1"], ["4xf64", "4xi32", "4xi1"])
    a = np.array([1.5, -2.0, 3.0, 0.0])
    b = np.array([1 + 1j, 2, 3, 4], dtype=np.complex64)
    flags = np.array([True, False, True, False])
    total, doubled, negated = _outputs(pjrt.compile(program, client=client)(a, b, flags))
    np.testing.assert_array_equal(total, a + b.real)
    np.testing.assert_array_equal(doubled, (a * 2).astype(np.int32))
    np.testing.assert_array_equal(negated, ~flags)


def test_python_handler_with_bfloat16_and_empty_buffers(client):
    target = _unique("py_bf16")

    def copy(operands, results, attributes):
        results[0][...] = operands[0] * 2
        assert results[1].shape == (0, 3)

    pjrt.register_custom_call_target(target, copy)
    program = _program(target, ["3xbf16", "0x3xf32"], ["3xbf16", "0x3xf32"])
    x = np.array([1, 2, 3], dtype=ml_dtypes.bfloat16)
    doubled, empty = _outputs(pjrt.compile(program, client=client)(
        x, np.zeros((0, 3), np.float32)))
    np.testing.assert_array_equal(doubled.astype(np.float32), [2, 4, 6])
    assert empty.shape == (0, 3)


def test_exception_in_handler_becomes_xla_runtime_error(client):
    target = _unique("py_failing")
    calls = []

    def sometimes_fails(operands, results, attributes):
        calls.append(1)
        if operands[0][0] < 0:
            raise ValueError("negative input is not allowed")
        results[0][...] = operands[0]

    pjrt.register_custom_call_target(target, sometimes_fails)
    executable = pjrt.compile(_program(target, ["2xf32"], ["2xf32"]), client=client)
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        np.asarray(executable(np.array([-1.0, 2.0], np.float32)))
    message = str(excinfo.value)
    assert target in message and "ValueError" in message and "negative input" in message
    # The process, the client and the same executable keep working.
    np.testing.assert_array_equal(np.asarray(executable(np.array([1.0, 2.0], np.float32))),
                                  [1.0, 2.0])
    assert len(calls) == 2


def test_wrong_return_value_is_reported(client):
    target = _unique("py_bad_return")
    pjrt.register_custom_call_target(target, lambda o, r, a: np.zeros(5))
    executable = pjrt.compile(_program(target, ["2xf32"], ["2xf32"]), client=client)
    with pytest.raises(pjrt.XlaRuntimeError, match="shape"):
        np.asarray(executable(np.ones(2, np.float32)))


def test_xla_runtime_error_keeps_its_code(client):
    target = _unique("py_coded")

    def refuse(operands, results, attributes):
        raise pjrt.XlaRuntimeError(pjrt.ErrorCode.INVALID_ARGUMENT, "bad operand")

    pjrt.register_custom_call_target(target, refuse)
    executable = pjrt.compile(_program(target, ["2xf32"], ["2xf32"]), client=client)
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        np.asarray(executable(np.ones(2, np.float32)))
    assert excinfo.value.code == pjrt.ErrorCode.INVALID_ARGUMENT


def test_handler_without_attributes_and_side_effect(client):
    target = _unique("py_counter")
    counter = []

    def count(operands, results, attributes):
        assert attributes == {}
        counter.append(int(operands[0]))
        results[0][...] = len(counter)

    pjrt.register_custom_call_target(target, count)
    executable = pjrt.compile(_program(target, ["i32"], ["i32"], has_side_effect=True),
                              client=client)
    assert int(np.asarray(executable(np.int32(5)))) == 1
    assert int(np.asarray(executable(np.int32(6)))) == 2
    assert counter == [5, 6]


# -- C handlers ------------------------------------------------------------------------------

_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def _c_negate_handler():
    """A C-callable XLA_FFI_Handler (a ctypes trampoline) that negates an f32 buffer and
    answers the metadata query itself, as a handler written in C would."""

    def negate(frame_address):
        frame = ffi.cast("XLA_FFI_CallFrame *", frame_address)
        extension = frame.extension_start
        if extension != ffi.NULL:
            metadata = ffi.cast("XLA_FFI_Metadata_Extension *", extension).metadata
            metadata.api_version.major_version = 0
            metadata.api_version.minor_version = 1
            return None
        source = ffi.cast("XLA_FFI_Buffer *", frame.args.args[0])
        target = ffi.cast("XLA_FFI_Buffer *", frame.rets.rets[0])
        count = int(np.prod([source.dims[i] for i in range(source.rank)]))
        x = np.frombuffer(ffi.buffer(source.data, 4 * count), np.float32)
        np.frombuffer(ffi.buffer(target.data, 4 * count), np.float32)[...] = -x
        return None

    return _HANDLER(negate)


_keep = []


@pytest.mark.parametrize("form", ["ctypes", "int", "cffi", "capsule", "bundle"])
def test_c_function_pointer_forms(client, form):
    handler = _c_negate_handler()
    _keep.append(handler)
    address = ctypes.cast(handler, ctypes.c_void_p).value
    if form == "ctypes":
        fn = handler
    elif form == "int":
        fn = address
    elif form == "cffi":
        fn = ffi.cast("XLA_FFI_Handler *", address)
    elif form == "capsule":
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        fn = new_capsule(address, b"xla._CUSTOM_CALL_TARGET", None)
    else:
        fn = {"execute": address, "prepare": None}
    target = _unique(f"c_negate_{form}")
    pjrt.register_custom_call_target(target, fn, platform="cpu")
    out = np.asarray(pjrt.compile(_program(target, ["3xf32"], ["3xf32"]), client=client)(
        np.array([1, -2, 3], np.float32)))
    np.testing.assert_array_equal(out, [-1, 2, -3])


def test_a_capsule_handler_is_read_without_touching_ctypes_pythonapi(client):
    """A handler given as a PyCapsule is read through pjrt's own view of CPython's capsule
    functions: ctypes.pythonapi's shared PyCapsule_GetName and PyCapsule_GetPointer keep the
    types another user set."""
    handler = _c_negate_handler()
    _keep.append(handler)
    address = ctypes.cast(handler, ctypes.c_void_p).value
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    fn = new_capsule(address, b"xla._CUSTOM_CALL_TARGET", None)
    shared = (ctypes.pythonapi.PyCapsule_GetName, ctypes.pythonapi.PyCapsule_GetPointer)
    before = [(f.argtypes, f.restype) for f in shared]
    for f in shared:
        f.argtypes, f.restype = None, ctypes.c_int  # what some other user set
    try:
        target = _unique("c_negate_capsule_untouched")
        pjrt.register_custom_call_target(target, fn, platform="cpu")
        out = np.asarray(pjrt.compile(_program(target, ["3xf32"], ["3xf32"]), client=client)(
            np.array([1, -2, 3], np.float32)))
        np.testing.assert_array_equal(out, [-1, 2, -3])
        assert [(f.argtypes, f.restype) for f in shared] == [(None, ctypes.c_int)] * 2
    finally:
        for f, (argtypes, restype) in zip(shared, before):
            f.argtypes, f.restype = argtypes, restype


# -- handler bundles: XLA's stages and each call site's state -------------------------------

def _two_call_sites(target: str, first: int = 7, second: int = 5) -> str:
    """A program calling ``target`` at two call sites, each with its own ``k`` attribute,
    returning both results."""
    return f"""
func.func public @main() -> (tensor<i32>, tensor<i32>) {{
  %0 = stablehlo.custom_call @{target}() {{api_version = 4 : i32, backend_config = {{k = {first} : i32}}}} : () -> tensor<i32>
  %1 = stablehlo.custom_call @{target}() {{api_version = 4 : i32, backend_config = {{k = {second} : i32}}}} : () -> tensor<i32>
  return %0, %1 : tensor<i32>, tensor<i32>
}}
"""


def _run(executable):
    return [int(np.asarray(x)) for x in executable.execute([])]


class _State:
    """A call site's state; its ``k`` counts the executions of that call site."""

    def __init__(self, k):
        self.k = k
        self.calls = 0


def test_instantiate_runs_once_per_call_site_of_each_executable(client, device):
    target = _unique("py_stateful")
    made = []

    def instantiate(attributes):
        made.append(attributes["k"])
        return _State(attributes["k"])

    def execute(operands, results, attributes, state):
        state.calls += 1
        results[0][...] = 1000 * state.k + state.calls

    pjrt.register_custom_call_target(target, {"instantiate": instantiate, "execute": execute})
    program = _two_call_sites(target)
    first = client.compile_and_load(program, [device])
    assert made == []  # before the first execution
    assert _run(first) == [7001, 5001]
    assert _run(first) == [7002, 5002]
    assert _run(first) == [7003, 5003]
    assert sorted(made) == [5, 7]  # once per call site, not per call
    # Another executable of the same program has call sites of its own.
    second = client.compile_and_load(program, [device])
    assert _run(second) == [7001, 5001]
    assert _run(first) == [7004, 5004]
    assert sorted(made) == [5, 5, 7, 7]


def test_a_call_sites_state_dies_with_its_executable(client, device):
    import gc
    import weakref

    target = _unique("py_state_lifetime")
    states = []

    def instantiate(attributes):
        state = _State(attributes["k"])
        states.append(weakref.ref(state))
        return state

    def execute(operands, results, attributes, state):
        results[0][...] = state.k

    pjrt.register_custom_call_target(target, {"instantiate": instantiate, "execute": execute})
    executable = client.compile_and_load(_two_call_sites(target), [device])
    assert _run(executable) == [7, 5]
    assert len(states) == 2 and all(ref() is not None for ref in states)
    executable.delete()
    gc.collect()
    assert [ref() for ref in states] == [None, None]


def test_prepare_and_initialize_run_before_each_execution(client, device):
    target = _unique("py_stages")
    log = []

    bundle = {
        "instantiate": lambda attributes: log.append(("instantiate", attributes["k"])) or
        _State(attributes["k"]),
        "prepare": lambda attributes, state: log.append(("prepare", state.k)),
        "initialize": lambda attributes, state: log.append(("initialize", state.k)),
        "execute": lambda operands, results, attributes, state: log.append(
            ("execute", state.k)) or results[0].fill(state.k),
    }
    pjrt.register_custom_call_target(target, bundle)
    executable = client.compile_and_load(_two_call_sites(target, 3, 3), [device])
    assert _run(executable) == [3, 3]
    assert log == [("instantiate", 3), ("prepare", 3), ("initialize", 3), ("execute", 3)] * 2
    log.clear()
    assert _run(executable) == [3, 3]
    assert log == [("prepare", 3), ("initialize", 3), ("execute", 3)] * 2


def test_a_bundle_without_instantiate_has_no_state(client, device):
    target = _unique("py_no_instantiate")
    seen = []

    def prepare(attributes, state):
        seen.append(state)

    def execute(operands, results, attributes):  # no state argument without instantiate
        results[0][...] = attributes["k"]

    pjrt.register_custom_call_target(target, {"prepare": prepare, "execute": execute,
                                              "initialize": None})
    executable = client.compile_and_load(_two_call_sites(target), [device])
    assert _run(executable) == [7, 5]
    assert seen == [None, None]


@pytest.mark.parametrize("failing", ["instantiate", "prepare", "initialize", "execute"])
def test_an_exception_in_each_stage_is_the_programs_error(client, device, failing):
    target = _unique(f"py_fails_in_{failing}")
    calls = {stage: 0 for stage in ("instantiate", "prepare", "initialize", "execute")}
    fail = [True]

    def stage(name, value=None):
        def run(*args):
            calls[name] += 1
            if name == failing and fail[0]:
                raise ValueError(f"{name} went wrong")
            if name == "execute":
                args[1][0][...] = args[3].k
            return value
        return run

    bundle = {"instantiate": stage("instantiate", _State(9)), "prepare": stage("prepare"),
              "initialize": stage("initialize"), "execute": stage("execute")}
    pjrt.register_custom_call_target(target, bundle)
    executable = client.compile_and_load(
        _program(target, [], ["i32"], "k = 9 : i32"), [device])  # compiles: nothing runs yet
    assert sum(calls.values()) == 0
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        executable.execute([])
    message = str(excinfo.value)
    assert target in message and f"ValueError: {failing} went wrong" in message
    if failing != "execute":
        assert f"the {failing} stage of Python FFI handler" in message
    stages = ["instantiate", "prepare", "initialize", "execute"]
    assert [calls[s] for s in stages] == [int(i <= stages.index(failing)) for i in range(4)]
    # The executable and the call site go on: a failed instantiate left no state, so the
    # next execution instantiates again; a later stage's failure keeps the state made.
    fail[0] = False
    assert _run(executable) == [9]
    assert calls["instantiate"] == (2 if failing == "instantiate" else 1)


@pytest.mark.parametrize("bundle, error, words", [
    ({"execute": lambda o, r, a: None, "finalize": lambda a, s: None}, ValueError,
     "not 'finalize'"),
    ({"instantiate": lambda a: None}, ValueError, "needs an 'execute' handler"),
    ({"execute": None}, ValueError, "needs an 'execute' handler"),
    ({}, ValueError, "needs an 'execute' handler"),
    ({"execute": lambda o, r, a: None, "prepare": "not a function"}, TypeError,
     "the 'prepare' handler of the bundle must be"),
    ({"execute": lambda o, r, a: None, "instantiate": 12345}, TypeError,
     r"all C handlers or all Python callables; stages \['instantiate'\] are C"),
    ({"execute": 0}, ValueError, "execute handler pointer is NULL"),
    ({"execute": 12345, "instantiate": 0}, ValueError, "instantiate handler pointer is NULL"),
])
def test_bad_bundles_are_refused_when_registered(bundle, error, words):
    target = _unique("bad_bundle")
    with pytest.raises(error, match=words):
        pjrt.register_custom_call_target(target, bundle)
    assert target not in pjrt.custom_call_targets("cpu")


def test_a_python_bundle_is_refused_off_the_cpu_platform():
    with pytest.raises(ValueError, match="only the 'cpu' platform passes"):
        pjrt.register_custom_call_target(
            _unique("py_bundle_gpu"), {"instantiate": lambda a: 1,
                                       "execute": lambda o, r, a, s: None}, platform="cuda")


def test_the_same_bundle_written_again_is_the_same_registration():
    target = _unique("py_bundle_twice")

    def instantiate(attributes):
        return 1

    def execute(operands, results, attributes, state):
        pass

    pjrt.register_custom_call_target(target, {"instantiate": instantiate, "execute": execute})
    pjrt.register_custom_call_target(target, {"execute": execute, "instantiate": instantiate})
    with pytest.raises(ValueError, match="already registered"):
        pjrt.register_custom_call_target(target, {"execute": execute})


# -- C handler bundles and custom types ---------------------------------------------------------

_testlib: list = []


@pytest.fixture
def testlib(tmp_path_factory):
    """tests/ffi/custom_calls_testlib.c, compiled and loaded once per process: its handlers
    and types stay registered, so the library must stay the same one."""
    if not _testlib:
        import importlib.util

        spec = importlib.util.spec_from_file_location("custom_calls_testlib_build",
                                                      HERE / "ffi" / "build.py")
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        _testlib.append(build.load(tmp_path_factory.mktemp("custom_calls_testlib")))
    return _testlib[0]


_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [ctypes.c_void_p]
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_counted_deleted: list[int] = []


@_DELETER
def _delete_counted_state(address):
    _counted_deleted.append(address)
    _libc_free(address)


def _c_counted(testlib):
    """The counting C bundle, registered once (with its type and a deleter that records)."""
    library = testlib.library
    pjrt_ffi.register_custom_type_id(
        "pjrt_test_counted_state", ctypes.addressof(ctypes.c_int64.in_dll(library,
                                                                          "counted_state_id")),
        deleter=_delete_counted_state)
    pjrt.register_custom_call_target("pjrt_test_counted", {"instantiate": library.counted_instantiate,
                                                           "execute": library.counted_execute})
    return ctypes.c_int64.in_dll(library, "counted_instantiations")


def test_a_c_bundle_instantiates_once_per_call_site_and_frees_its_state(client, device,
                                                                        testlib):
    import gc

    instantiations = _c_counted(testlib)
    assert ctypes.c_int64.in_dll(testlib.library, "counted_state_id").value != 0
    before, deleted_before = instantiations.value, len(_counted_deleted)
    program = _two_call_sites("pjrt_test_counted")
    executable = client.compile_and_load(program, [device])
    assert instantiations.value == before  # compiling instantiates nothing yet
    first = _run(executable)
    assert sorted(first) == [100 + before, 101 + before]
    assert _run(executable) == first and _run(executable) == first
    assert instantiations.value == before + 2
    executable.delete()
    gc.collect()
    # The plugin freed both call sites' states with the type's deleter.
    assert len(_counted_deleted) == deleted_before + 2


def test_a_c_execute_handler_without_its_instantiate_finds_no_state(client, device, testlib):
    """The stateful handler's execute stage alone: the state it reads is made by instantiate,
    which is what makes the ported testStatefulCustomCall pass."""
    _c_counted(testlib)
    target = _unique("c_execute_only")
    pjrt.register_custom_call_target(target, {"execute": testlib.library.counted_execute})
    executable = client.compile_and_load(_program(target, [], ["i32"]), [device])
    with pytest.raises(pjrt.XlaRuntimeError, match="State is not set"):
        executable.execute([])


def test_a_c_instantiate_keeping_no_state_runs_once(client, device, testlib):
    calls = ctypes.c_int64.in_dll(testlib.library, "stateless_instantiations")
    target = _unique("c_stateless_instantiate")
    pjrt.register_custom_call_target(target, {"instantiate": testlib.library.stateless_instantiate,
                                              "execute": testlib.library.always_succeed})
    before = calls.value
    executable = client.compile_and_load(_program(target, [], ["f32"]), [device])
    executable.execute([])
    executable.execute([])
    assert calls.value == before + 1


def test_a_c_instantiates_error_is_the_programs_error(client, device, testlib):
    """always_fail as an instantiate handler: it refuses the INSTANTIATE stage (it checks the
    stage of the frame pjrt hands it, as XLA's C++ binding does)."""
    target = _unique("c_failing_instantiate")
    pjrt.register_custom_call_target(target, {"instantiate": testlib.library.always_fail,
                                              "execute": testlib.library.always_succeed})
    executable = client.compile_and_load(_program(target, [], ["f32"]), [device])
    with pytest.raises(pjrt.XlaRuntimeError, match="Wrong execution stage"):
        executable.execute([])


def test_a_c_bundles_prepare_and_initialize_do_not_run(client, device, testlib):
    """As in XLA's CPU runtime: always_fail as prepare and initialize would fail the call."""
    target = _unique("c_prepare_initialize")
    library = testlib.library
    pjrt.register_custom_call_target(target, {"prepare": library.always_fail,
                                              "initialize": library.always_fail,
                                              "execute": library.always_succeed})
    executable = client.compile_and_load(_program(target, [], ["f32"]), [device])
    executable.execute([])


def test_register_custom_type_id_gives_every_plugin_the_same_id(client, cpu_plugin):
    """The first plugin serving the platform assigns the id into the caller's XLA_FFI_TypeId;
    every plugin serving it holds the name with that id."""
    from pjrt._capi import ffi_state

    type_id = ctypes.c_int64(0)
    _keep.append(type_id)
    name = _unique("pjrt_test_type")
    pjrt_ffi.register_custom_type_id(name, ctypes.addressof(type_id), platform="cpu")
    assigned = type_id.value
    assert assigned != 0
    pjrt_ffi.register_custom_type_id(name, ctypes.addressof(type_id), platform="Host")  # no-op
    with pytest.raises(ValueError, match="already registered"):
        pjrt_ffi.register_custom_type_id(name, ctypes.addressof(ctypes.c_int64(0)))
    # Ask the plugin itself: the name is taken with that id, and no other.
    extension = pjrt_ffi.ffi_extension(cpu_plugin)
    assert ffi_state.register_type(cpu_plugin.api, extension, name, assigned, ffi.NULL) == assigned
    with pytest.raises(pjrt.XlaRuntimeError, match=f"already registered with type id {assigned}"):
        ffi_state.register_type(cpu_plugin.api, extension, name, assigned + 1, ffi.NULL)
    assert pjrt_ffi.register_custom_type_id is pjrt.xla_client.register_custom_type_id


def test_register_custom_type_id_bad_arguments():
    with pytest.raises(TypeError, match="non-empty string"):
        pjrt_ffi.register_custom_type_id("", 1234)
    with pytest.raises(TypeError, match="address of an XLA_FFI_TypeId"):
        pjrt_ffi.register_custom_type_id(_unique("t"), "not an address")
    with pytest.raises(ValueError, match="type_id pointer is NULL"):
        pjrt_ffi.register_custom_type_id(_unique("t"), 0)
    with pytest.raises(TypeError, match="deleter must be a C function pointer"):
        pjrt_ffi.register_custom_type_id(_unique("t"), 1234, deleter=lambda p: None)
    with pytest.raises(ValueError, match="deleter pointer is NULL"):
        pjrt_ffi.register_custom_type_id(_unique("t"), 1234, deleter=0)


def test_a_type_for_a_plugin_without_the_ffi_extension_is_a_clear_error():
    plugin = _fake_plugin("fake_no_ffi_types", _extension(lib.PJRT_Extension_Type_Layouts))
    type_id = ctypes.c_int64(0)
    _keep.append(type_id)
    pjrt_ffi.register_custom_type_id(_unique("t"), ctypes.addressof(type_id),
                                     platform="fake_types_platform")
    with pytest.raises(pjrt.UnsupportedFeatureError, match="extensions it offers: Layouts"):
        pjrt_ffi.bind_plugin_platform(plugin, "fake_types_platform")
    assert type_id.value == 0


# -- registration rules --------------------------------------------------------------------------

def test_same_name_other_handler_is_refused_same_handler_is_fine():
    target = _unique("py_twice")

    def first(o, r, a):
        r[0][...] = 1

    pjrt.register_custom_call_target(target, first)
    pjrt.register_custom_call_target(target, first)
    with pytest.raises(ValueError, match="already registered"):
        pjrt.register_custom_call_target(target, lambda o, r, a: None)
    # The same name on another platform is another registration (a C handler: Python
    # handlers are for the CPU platform only).
    handler = _c_negate_handler()
    _keep.append(handler)
    pjrt.register_custom_call_target(target, handler, platform="fake_platform")
    assert target in pjrt.custom_call_targets("fake_platform")


@pytest.mark.parametrize("platform", ["cuda", "ROCM", "tpu", "some_accelerator"])
def test_python_handlers_are_refused_off_the_cpu_platform(platform):
    """A Python handler reads its buffers as host memory; an accelerator's plugin passes
    device memory, whose first read would kill the process. Refused when registered."""
    target = _unique("py_off_cpu")
    with pytest.raises(ValueError, match="only the 'cpu' platform passes") as excinfo:
        pjrt.register_custom_call_target(target, lambda o, r, a: None, platform=platform)
    assert "C handler" in str(excinfo.value)
    assert target not in pjrt.custom_call_targets(platform)


def test_host_and_cpu_are_one_platform():
    target = _unique("py_host")
    handler = lambda o, r, a: None  # noqa: E731
    pjrt.register_custom_call_target(target, handler, platform="Host")
    assert pjrt.custom_call_targets("cpu")[target] is handler


def test_bad_arguments():
    with pytest.raises(NotImplementedError, match="api_version"):
        pjrt.register_custom_call_target(_unique("legacy"), lambda o, r, a: None, api_version=0)
    with pytest.raises(TypeError, match="Python callable"):
        pjrt.register_custom_call_target(_unique("not_callable"), "not a function")
    with pytest.raises(ValueError, match="NULL"):
        pjrt.register_custom_call_target(_unique("null"), 0)


def test_real_plugins_have_the_ffi_extension(cpu_plugin):
    assert pjrt_ffi.has_ffi_extension(cpu_plugin)
    extension = pjrt_ffi.ffi_extension(cpu_plugin)
    assert extension.base.type == lib.PJRT_Extension_Type_FFI
    assert _c.find_extension(cpu_plugin.api, lib.PJRT_Extension_Type_FFI) is not None


def _fake_plugin(name: str, *extensions):
    """A Plugin over an in-memory PJRT_Api table whose extension chain holds ``extensions``
    (cdata of extension structs, linked in order). Nothing in it can be called."""
    table = ffi.new("PJRT_Api *")
    table.struct_size = ffi.sizeof("PJRT_Api")
    table.pjrt_api_version.major_version = pjrt.PJRT_C_API_VERSION[0]
    table.pjrt_api_version.minor_version = pjrt.PJRT_C_API_VERSION[1]
    previous = ffi.NULL
    for extension in reversed(extensions):
        base = ffi.cast("PJRT_Extension_Base *", extension)
        base.next = previous
        previous = base
    table.extension_start = previous
    _keep.extend([table, *extensions])
    return pjrt.plugin.plugin_from_c_api(name, table)


def _extension(kind, struct="PJRT_Extension_Base", size=None):
    extension = ffi.new(struct + " *")
    base = ffi.cast("PJRT_Extension_Base *", extension)
    base.struct_size = ffi.sizeof(struct) if size is None else size
    base.type = kind
    return extension


def test_plugin_without_ffi_extension_gives_a_clear_error():
    plugin = _fake_plugin("fake_no_ffi", _extension(lib.PJRT_Extension_Type_Layouts),
                          _extension(lib.PJRT_Extension_Type_MemoryDescriptions))
    assert not pjrt_ffi.has_ffi_extension(plugin)
    with pytest.raises(pjrt.UnsupportedFeatureError) as excinfo:
        pjrt_ffi.ffi_extension(plugin)
    message = str(excinfo.value)
    assert "fake_no_ffi" in message and "FFI extension" in message
    assert "Layouts, MemoryDescriptions" in message
    # Binding it to a platform with handlers registered fails the same way...
    handler = _c_negate_handler()
    _keep.append(handler)
    pjrt.register_custom_call_target(_unique("c_for_fake"), handler,
                                     platform="fake_no_ffi_platform")
    with pytest.raises(pjrt.UnsupportedFeatureError, match="Layouts"):
        pjrt_ffi.bind_plugin_platform(plugin, "fake_no_ffi_platform")
    # ...and leaves no trace: later registrations for that platform do not try the plugin.
    pjrt.register_custom_call_target(_unique("c_for_fake"), handler,
                                     platform="fake_no_ffi_platform")


def test_plugin_with_no_extensions_at_all():
    plugin = _fake_plugin("fake_bare")
    with pytest.raises(pjrt.UnsupportedFeatureError, match="extensions it offers: none"):
        pjrt_ffi.ffi_extension(plugin)


def test_ffi_extension_too_old_to_register_handlers():
    old = _extension(lib.PJRT_Extension_Type_FFI, "PJRT_FFI_Extension",
                     size=ffi.offsetof("PJRT_FFI_Extension", "register_handler"))
    plugin = _fake_plugin("fake_old_ffi", old)
    assert not pjrt_ffi.has_ffi_extension(plugin)
    with pytest.raises(pjrt.UnsupportedFeatureError, match="predates handler registration"):
        pjrt_ffi.ffi_extension(plugin)


# -- before and after the backend comes up, in fresh processes -------------------------------

_ORDER_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
import pjrt
from conftest import cpu_plugin_path

def triple(operands, results, attributes):
    results[0][...] = operands[0] * 3

program = '''{program}'''
order = {order!r}
if order == "before_load":
    pjrt.register_custom_call_target("triple", triple)
plugin = pjrt.load_pjrt_plugin_dynamically({load_name!r}, cpu_plugin_path({plugin!r}))
if order == "after_load":
    pjrt.register_custom_call_target("triple", triple)
if {load_name!r} == "cpu":
    # A plugin loaded under the platform's name is bound before any client exists.
    from pjrt import ffi
    assert "cpu" in ffi._plugin_platforms[plugin], ffi._plugin_platforms
client = pjrt.make_c_api_client({load_name!r})
if order == "after_client":
    pjrt.register_custom_call_target("triple", triple)
out = pjrt.compile(program, client=client)(np.arange(3, dtype=np.float32))
print("RESULT", np.asarray(out).tolist())
"""


@pytest.mark.slow  # a fresh interpreter for each order
@pytest.mark.parametrize("plugin", ["xla_cpu_0_81", "xla_cpu_0_106"])
@pytest.mark.parametrize("order,load_name", [("before_load", "test_plugin"),
                                             ("after_load", "test_plugin"),
                                             ("after_client", "test_plugin"),
                                             ("before_load", "cpu")])
def test_register_before_or_after_the_backend_comes_up(plugin, order, load_name):
    script = _ORDER_SCRIPT.format(tests=str(HERE), program=_program("triple", ["3xf32"],
                                                                     ["3xf32"]),
                                  order=order, plugin=plugin, load_name=load_name)
    result = run_python(script, timeout=300)
    assert "RESULT [0.0, 3.0, 6.0]" in result.stdout


def test_handler_answers_the_version_query_with_a_supported_version():
    assert pjrt_ffi.HANDLER_FFI_VERSION == (0, 1)
    assert (lib.XLA_FFI_API_MAJOR, lib.XLA_FFI_API_MINOR) >= pjrt_ffi.HANDLER_FFI_VERSION


def test_headers_match_the_plugins_layout():
    """The layout pjrt registers with (checked against both plugins' machine code): no
    api_version field, traits at offset 48, struct size 52."""
    assert ffi.offsetof("PJRT_FFI_Register_Handler_Args", "handler") == 24
    assert ffi.offsetof("PJRT_FFI_Register_Handler_Args", "traits") == 48
    assert _c.struct_size("PJRT_FFI_Register_Handler_Args") == 52
    assert ffi.sizeof("PJRT_FFI_Extension") == 48
    assert ffi.offsetof("XLA_FFI_CallFrame", "attrs") + ffi.sizeof("XLA_FFI_Attrs") == 168
    assert ffi.offsetof("XLA_FFI_Api", "XLA_FFI_Handler_Register") == 0x48


def test_a_target_preparation_runs_once_before_the_first_program_naming_it():
    from pjrt import ffi

    calls = []

    def prepare():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("not yet")

    ffi.register_target_preparation(["prep_target_a", "prep_target_b"], prepare,
                                    platform="prep_platform")
    ffi.prepare_targets("prep_platform", b"stablehlo.custom_call @other_target")
    assert calls == []  # a program that does not call the targets prepares nothing
    with pytest.raises(RuntimeError, match=r"prep_target_b on prep_platform could not be set "
                                           r"up: OSError: not yet"):
        ffi.prepare_targets("prep_platform", b"stablehlo.custom_call @prep_target_b(%x)")
    ffi.prepare_targets("prep_platform", b"stablehlo.custom_call @prep_target_a(%x)")
    assert calls == [1, 1]  # tried again after the failure, and done
    ffi.prepare_targets("prep_platform", b"@prep_target_a @prep_target_b")
    ffi.prepare_targets("prep_platform", None)
    assert calls == [1, 1]


def test_registering_a_preparation_again_keeps_one():
    """A plugin package registers its preparation for each client it makes: the targets of
    one ``prepare`` are one preparation, run once for any of them."""
    from pjrt._compile import target_preparation

    calls = []

    def prepare():
        calls.append(1)

    for targets in (["same_a"], ["same_b"], ["same_a", "same_c"]):
        target_preparation.register_target_preparation(targets, prepare,
                                                       platform="same_platform")
    target_preparation.prepare_targets("same_platform", b"custom_call @same_b(%x)")
    target_preparation.prepare_targets("same_platform", b"custom_call @same_a(%x)")
    target_preparation.prepare_targets("same_platform", b"custom_call @same_c(%x)")
    assert calls == [1]


_HANDLER_RUNS_A_PROGRAM = """
import sys
import numpy as np
import pjrt
from conftest import cpu_plugin_path

name, where = sys.argv[1], sys.argv[2]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {"cpu_device_count": 2})
first, second = client.devices()
if where == "same":
    second = first
DOT = '''func.func public @main(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %y : tensor<64x64xf32>
}'''
# A product first: the plugin runs this program asynchronously, on its own threads.
OUTER = '''func.func public @main(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %d = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %y = stablehlo.custom_call @square_again(%d) {api_version = 4 : i32} : (tensor<64x64xf32>) -> tensor<64x64xf32>
  return %y : tensor<64x64xf32>
}'''
inner = client.compile_and_load(DOT, [second])


def square_again(operands, results, attributes):
    (y,) = inner.execute([client.buffer_from_pyval(np.asarray(operands[0]), second)])
    results[0][...] = np.asarray(y)


pjrt.register_custom_call_target("square_again", square_again, platform="cpu")
outer = client.compile_and_load(OUTER, [first])
x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
d = x @ x
try:
    got = np.asarray(outer.execute([client.buffer_from_pyval(x, first)])[0])
    print("CLOSE", bool(np.allclose(got, d @ d, rtol=1e-4)))
except pjrt.XlaRuntimeError as error:
    print("RAISED", str(error).replace("\\n", " "))
# The client goes on: the inner program the plugin had queued runs once the outer one ended.
again = np.asarray(inner.execute([client.buffer_from_pyval(x, second)])[0])
print("AFTER", bool(np.allclose(again, d, rtol=1e-4)))
"""


def test_a_handler_runs_a_program_on_another_device_inside_an_asynchronous_program(cpu_plugin):
    """The way docs/threads-and-processes.md gives for a handler that runs programs: on
    another device than its own program's (on the same one, XLA's CPU plugin queues the inner
    launch behind the outer one, which waits for the handler)."""
    done = run_python(_HANDLER_RUNS_A_PROGRAM, cpu_plugin.name, "other", timeout=60)
    assert done.stdout.strip().splitlines() == ["CLOSE True", "AFTER True"], done.stdout


def test_a_handler_runs_a_program_on_its_own_programs_device_and_reads_it(cpu_plugin):
    """The issue's case: on the device whose asynchronous program runs the handler, the plugin
    would queue the inner launch behind the outer one, which waits for the handler; pjrt runs
    it on a stand-in client, and the handler reads the right values (it hung, then raised)."""
    done = run_python(_HANDLER_RUNS_A_PROGRAM, cpu_plugin.name, "same", timeout=60)
    assert done.stdout.strip().splitlines() == ["CLOSE True", "AFTER True"], done.stdout


#: A child whose handlers launch programs on the device of the program running them: a
#: product first makes each program asynchronous (see _HANDLER_RUNS_A_PROGRAM). It prints one
#: line per case.
_OWN_DEVICE_CASES = """
import sys, time
import numpy as np
import pjrt
from conftest import cpu_plugin_path

name = sys.argv[1]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {"cpu_device_count": 2})
first, second = client.devices()
TYPE = "tensor<64x64xf32>"
PRODUCT = ("stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : "
           "(TYPE, TYPE) -> TYPE").replace("TYPE", TYPE)
DOT = ("func.func public @main(%x: TYPE) -> TYPE {\\n  %y = PRODUCT\\n  return %y : TYPE\\n}"
       ).replace("PRODUCT", PRODUCT).replace("TYPE", TYPE)


def calling(target):
    return ("func.func public @main(%x: TYPE) -> TYPE {\\n  %d = PRODUCT\\n"
            "  %y = stablehlo.custom_call @TARGET(%d) {api_version = 4 : i32} : (TYPE) -> TYPE\\n"
            "  return %y : TYPE\\n}").replace("PRODUCT", PRODUCT).replace(
                "TARGET", target).replace("TYPE", TYPE)


x = np.random.default_rng(0).random((64, 64), dtype=np.float32) / 8
square = lambda a: (a.astype(np.float64) @ a).astype(np.float32)
dot = client.compile_and_load(DOT, [first])
sharded_dot = client.compile_and_load(DOT, [first, second], replicated=True)
donating = client.compile_and_load(
    DOT.replace("(%x: " + TYPE + ")", "(%x: " + TYPE + " {jax.buffer_donor = true})"), [first])
seen = {}


# Two levels, all on the first device: the outer handler runs a program whose own handler
# runs the product (the middle program runs on a stand-in, the product on a second one).
def level_two(operands, results, attributes):
    (y,), token = dot.execute_with_token([np.asarray(operands[0])], copy_host_values=True)
    token.block_until_ready()
    results[0][...] = np.asarray(y)


def level_one(operands, results, attributes):
    (y,) = middle.execute([client.buffer_from_pyval(np.asarray(operands[0]), first)])
    results[0][...] = np.asarray(y)


# A handler that runs a program on both devices, one of them its own.
def both_devices(operands, results, attributes):
    value = np.asarray(operands[0])
    shards = [[client.buffer_from_pyval(value, first), client.buffer_from_pyval(value, second)]]
    ran = sharded_dot.execute_sharded(shards, with_tokens=True)
    ran.consume_token().block_until_ready()
    on_first, on_second = ran.disassemble_into_single_device_arrays()[0]
    seen["placed"] = (on_first.devices(), on_second.devices()) == ({first}, {second})
    seen["same"] = bool(np.array_equal(np.asarray(on_first), np.asarray(on_second)))
    results[0][...] = np.asarray(on_first)


# A donated argument is consumed, as by a launch on the device itself.
def donate(operands, results, attributes):
    argument = client.buffer_from_pyval(np.asarray(operands[0]), first)
    (y,) = donating.execute([argument])
    seen["deleted"] = argument.is_deleted()
    results[0][...] = np.asarray(y)


# A handler that runs its own program: recursion without end.
def recurse(operands, results, attributes):
    (y,) = itself.execute([client.buffer_from_pyval(np.asarray(operands[0]), first)])
    results[0][...] = np.asarray(y)


for target in ("level_two", "level_one", "both_devices", "donate", "recurse"):
    pjrt.register_custom_call_target(target, globals()[target], platform="cpu")
middle = client.compile_and_load(calling("level_two"), [first])
outer = client.compile_and_load(calling("level_one"), [first])
beside = client.compile_and_load(calling("both_devices"), [first])
donor = client.compile_and_load(calling("donate"), [first])
itself = client.compile_and_load(calling("recurse"), [first])


def run(executable):
    return np.asarray(executable.execute([client.buffer_from_pyval(x, first)])[0])


for attempt in range(2):  # the second time, the stand-ins have the executables loaded
    got = run(outer)
    print("NESTED", attempt, bool(np.allclose(got, square(square(square(x))), rtol=1e-3)))
    got = run(beside)
    print("SHARDED", attempt, bool(np.allclose(got, square(square(x)), rtol=1e-3)),
          seen["placed"], seen["same"])
got = run(donor)
print("DONATED", bool(np.allclose(got, square(square(x)), rtol=1e-3)), seen["deleted"])
start = time.monotonic()
try:
    run(itself)
    print("RECURSION none")
except RecursionError as error:
    print("RECURSION", "MAX_STAND_INS" in str(error), time.monotonic() - start < 60)
print("AFTER", bool(np.allclose(run(beside), square(square(x)), rtol=1e-3)))
from pjrt._runtime.handler_launches import stand_in_of
stand_ins = [stand_in_of(client, index) for index in range(2)]
print("STAND-INS", all(s in pjrt.client.live_clients() and s.plugin is client.plugin
                       for s in stand_ins), len(set(map(id, stand_ins))))
client.close()
print("CLOSED", [s.is_closed for s in stand_ins])
"""


def test_handlers_on_their_own_programs_device_nest_shard_donate_and_stop(cpu_plugin):
    """Launches from handlers on the device of the program running them: nested two levels
    (with a token), sharded over that device and another (with tokens), with a donated
    argument, and recursing without end, which stops at a RecursionError; the client goes on
    afterwards, and its stand-ins close with it."""
    done = run_python(_OWN_DEVICE_CASES, cpu_plugin.name, timeout=240)
    assert done.stdout.strip().splitlines() == [
        "NESTED 0 True", "SHARDED 0 True True True", "NESTED 1 True",
        "SHARDED 1 True True True", "DONATED True True", "RECURSION True True",
        "AFTER True", "STAND-INS True 2", "CLOSED [True, True]"], (
            done.stdout + done.stderr[-3000:])


def test_a_clients_stand_ins_are_made_once_and_bounded(cpu_plugin):
    """Stand-ins are internal (the client's public face has none): made on first use, once,
    up to MAX_STAND_INS, and closed with their client."""
    from pjrt._runtime.handler_launches import MAX_STAND_INS, stand_in_of

    client = pjrt.make_c_api_client(cpu_plugin.name)
    assert not hasattr(client, "stand_in")
    try:
        stand_in = stand_in_of(client, 0)
        assert stand_in_of(client, 0) is stand_in and stand_in is not client
        assert [d.id for d in stand_in.devices()] == [d.id for d in client.devices()]
        for index, error in ((MAX_STAND_INS, ValueError), (-1, ValueError),
                             (2 ** 31, ValueError), (True, TypeError), (None, TypeError)):
            with pytest.raises(error, match="stand"):
                stand_in_of(client, index)
    finally:
        client.close()
    assert stand_in.is_closed
    with pytest.raises(pjrt.errors.ClosedClientError):
        stand_in_of(client, 1)


_QUEUED_BEHIND = """
import sys, threading
import numpy as np
import pjrt
from conftest import cpu_plugin_path

name = sys.argv[1]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {"cpu_device_count": 2})
first = client.devices()[0]
TYPE = "tensor<64x64xf32>"
PRODUCT = ("stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : "
           "(TYPE, TYPE) -> TYPE").replace("TYPE", TYPE)
DOT = ("func.func public @main(%x: TYPE) -> TYPE {\\n  %y = PRODUCT\\n  return %y : TYPE\\n}"
       ).replace("PRODUCT", PRODUCT).replace("TYPE", TYPE)
OUTER = ("func.func public @main(%x: TYPE) -> TYPE {\\n  %d = PRODUCT\\n"
         "  %y = stablehlo.custom_call @wait_on_queued(%d) {api_version = 4 : i32} : "
         "(TYPE) -> TYPE\\n  return %y : TYPE\\n}").replace("PRODUCT", PRODUCT).replace(
             "TYPE", TYPE)
inner = client.compile_and_load(DOT, [first])
queued, launched = [], threading.Event()


def wait_on_queued(operands, results, attributes):
    if not launched.wait(30):
        raise TimeoutError("the main thread did not launch")
    results[0][...] = np.asarray(queued[0])


pjrt.register_custom_call_target("wait_on_queued", wait_on_queued, platform="cpu")
outer = client.compile_and_load(OUTER, [first])
x = np.ones((64, 64), np.float32)
(y,) = outer.execute([client.buffer_from_pyval(x, first)])
# Launched by this thread after the outer program, so queued behind it on the same device.
queued.append(inner.execute([client.buffer_from_pyval(x, first)])[0])
launched.set()
try:
    np.asarray(y)
    print("WAITED")
except pjrt.XlaRuntimeError as error:
    print("RAISED", str(error).replace("\\n", " "))
print("AFTER", bool(np.allclose(np.asarray(queued[0]), x @ x)))
"""


def test_a_handler_waiting_on_a_program_queued_behind_its_own_is_an_error_not_a_hang(cpu_plugin):
    """A program another thread launched on the handler's device after the program running
    the handler is queued behind it: the handler's wait on it is refused (the RuntimeError
    becomes the program's error), where it would wait forever; the queued program runs once
    the outer one ends."""
    done = run_python(_QUEUED_BEHIND, cpu_plugin.name, timeout=60)
    raised, after = done.stdout.strip().splitlines()
    assert raised.startswith("RAISED") and "RuntimeError" in raised, done.stdout
    assert "the device whose program is running the handler" in raised, raised
    assert "(pjrt runs those elsewhere)" in raised, raised
    assert after == "AFTER True", done.stdout
