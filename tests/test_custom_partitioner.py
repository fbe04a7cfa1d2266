"""jaxlib's custom-call registration hooks: ``register_custom_call_handler`` (every target
registered for a platform, before and after the handler) and ``register_custom_call_partitioner``
/ ``register_custom_call_as_batch_partitionable`` through the PJRT custom partitioner extension.

XLA's CPU builds lack the extension (UnsupportedFeatureError); the fault plugin grows one that
records what it is given, and the tests then call the registered callbacks through the C table,
as a plugin's SPMD partitioner would."""
from __future__ import annotations

import ctypes
import itertools
import os
import shutil

import numpy as np
import pytest

import pjrt
from pjrt import ffi as pjrt_ffi
from pjrt import xla_client
from pjrt._capi import custom_partitioner
from pjrt._pjrt_cffi import ffi, lib
from pjrt.errors import UnsupportedFeatureError, XlaRuntimeError
from pjrt.hlo_sharding import HloSharding
from pjrt.shapes import Shape

_unique = itertools.count()


@pytest.fixture(autouse=True)
def own_partitioner_registry(monkeypatch):
    """Registrations made without c_api are for every plugin loaded later: each test starts
    and ends with none, so that no test's plugin meets another test's."""
    monkeypatch.setattr(pjrt_ffi, "_partitioners", {})
    monkeypatch.setattr(pjrt_ffi, "_batch_partitionable", [])


def _platform() -> str:
    """A platform no plugin serves, new for each test: its registrations stay pending."""
    return f"handlertest{os.getpid()}x{next(_unique)}"


# -- register_custom_call_handler -------------------------------------------------------------

def test_a_handler_gets_the_targets_registered_before_and_after():
    platform = _platform()
    seen = []
    xla_client.register_custom_call_target("first", 0x1000, platform=platform)
    xla_client.register_custom_call_target("second", 0x2000, platform=platform,
                                           traits=xla_client.CustomCallTargetTraits
                                           .COMMAND_BUFFER_COMPATIBLE)
    xla_client.register_custom_call_handler(platform, lambda *args: seen.append(args))
    assert seen == [("first", 0x1000, platform, 1, xla_client.CustomCallTargetTraits.DEFAULT),
                    ("second", 0x2000, platform, 1,
                     xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)]
    xla_client.register_custom_call_target("third", 0x3000, platform=platform)
    assert seen[-1] == ("third", 0x3000, platform, 1,
                        xla_client.CustomCallTargetTraits.DEFAULT)
    # As in jaxlib, a second handler for the platform is ignored.
    other = []
    xla_client.register_custom_call_handler(platform, lambda *args: other.append(args))
    xla_client.register_custom_call_target("fourth", 0x4000, platform=platform)
    assert other == [] and seen[-1][0] == "fourth" and len(seen) == 4
    # The same registration again is no registration: the handler is not called twice.
    xla_client.register_custom_call_target("fourth", 0x4000, platform=platform)
    assert len(seen) == 4


def test_a_handler_sees_cpu_targets_that_still_reach_the_plugin(client, monkeypatch):
    monkeypatch.setattr(pjrt_ffi, "_handlers", {})
    seen = []
    xla_client.register_custom_call_handler("host", lambda *args: seen.append(args[:3]))
    name = f"handler_seen_{client.plugin.name}"

    def add_one(operands, results, attributes):
        results[0][...] = operands[0] + 1

    xla_client.register_custom_call_target(name, add_one, platform="cpu")
    assert seen[-1] == (name, add_one, "cpu")
    program = f"""
    func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
      %y = stablehlo.custom_call @{name}(%x) {{api_version = 4 : i32}}
          : (tensor<4xf32>) -> tensor<4xf32>
      return %y : tensor<4xf32>
    }}"""
    executable = client.compile_and_load(program, client.devices()[:1])
    x = client.buffer_from_pyval(np.arange(4, dtype=np.float32), client.devices()[0])
    np.testing.assert_array_equal(np.asarray(executable.execute([x])[0]), [1, 2, 3, 4])


def test_a_handler_must_be_callable():
    with pytest.raises(TypeError, match="must be callable"):
        xla_client.register_custom_call_handler(_platform(), "not a handler")


# -- the partitioner on XLA's CPU builds ------------------------------------------------------

def _never(*args):
    raise AssertionError("not called")


def test_cpu_builds_have_no_partitioner_extension(cpu_plugin):
    with pytest.raises(UnsupportedFeatureError) as info:
        xla_client.register_custom_call_partitioner("cpu_part", _never, _never, _never,
                                                    c_api=cpu_plugin)
    message = str(info.value)
    assert cpu_plugin.name in message and "Custom_Partitioner" in message
    assert "does not offer the PJRT custom partitioner extension" in message
    with pytest.raises(UnsupportedFeatureError, match="Custom_Partitioner"):
        xla_client.register_custom_call_as_batch_partitionable("cpu_batch", c_api=cpu_plugin)
    # Without c_api, plugins lacking the extension are passed over.
    xla_client.register_custom_call_partitioner("cpu_part", _never, _never, _never)


def test_partitioner_arguments_are_checked(cpu_plugin):
    with pytest.raises(TypeError, match="partition must be callable"):
        xla_client.register_custom_call_partitioner("x", _never, None, _never, c_api=cpu_plugin)
    with pytest.raises(TypeError, match="non-empty string"):
        xla_client.register_custom_call_partitioner("", _never, _never, _never)


# -- the protocol, through the fault plugin's extension -------------------------------------------

@pytest.fixture
def partitioner_plugin(built, tmp_path, monkeypatch):
    """``make(mode)``: a fresh copy of the fault plugin with a custom partitioner extension
    (``record`` or ``refuse``), loaded under a name of its own: ``(plugin, ctypes library)``."""
    made = []

    def make(mode: str = "record"):
        copy = tmp_path / f"libfault_partitioner_{mode}_{len(made)}.so"
        shutil.copyfile(built.fault_plugin, copy)
        monkeypatch.setenv("PJRT_FAULT_PARTITIONER", mode)  # read when the plugin loads
        name = f"fault_partitioner_{mode}_{os.getpid()}_{len(made)}_{tmp_path.name[-12:]}"
        library = ctypes.CDLL(str(copy))
        library.fault_partitioner_name.restype = ctypes.c_char_p
        library.fault_partitioner_callbacks.restype = ctypes.c_void_p
        library.fault_batch_partitionable_name.restype = ctypes.c_char_p
        plugin = pjrt.load_pjrt_plugin_dynamically(name, copy)
        made.append(plugin)
        return plugin, library

    return make


def registered(library) -> dict:
    """name -> the JAX_CustomCallPartitioner_Callbacks* the plugin holds."""
    return {library.fault_partitioner_name(i).decode():
            ffi.cast("JAX_CustomCallPartitioner_Callbacks *",
                     library.fault_partitioner_callbacks(i))
            for i in range(library.fault_partitioner_count())
            if library.fault_partitioner_callbacks(i)}


F32_8x4 = Shape.array_shape(np.dtype("float32"), (8, 4))
F32_8 = Shape.array_shape(np.dtype("float32"), (8,))
ROWS = HloSharding.iota_tile((2, 1))
SPLIT = HloSharding.iota_tile((2,))


def _string(value: bytes, keep: list):
    buffer = ffi.new("char[]", value or b"\0")
    keep.append(buffer)
    return {"data": buffer, "size": len(value)}


def _avals(entries, keep):
    avals = ffi.new("JAX_CustomCallPartitioner_aval[]", len(entries))
    for i, (shape, sharding) in enumerate(entries):
        avals[i].shape = _string(shape.to_proto(), keep)
        avals[i].has_sharding = sharding is not None
        if sharding is not None:
            avals[i].sharding = _string(sharding.to_proto(), keep)
    keep.append(avals)
    return avals


def _read(string) -> bytes:
    return ffi.unpack(string.data, string.size)


def _release(header) -> None:
    """What a plugin does when it is done with a callback's results."""
    key = int(ffi.cast("uintptr_t", header.data))
    assert key in custom_partitioner._results
    header.cleanup_fn(header.data)
    assert key not in custom_partitioner._results


class Recorder:
    """Callbacks that record their arguments and answer as a row-split partitioner."""

    def __init__(self):
        self.calls = []

    def prop_user_sharding(self, user_sharding, shape, backend_config):
        self.calls.append(("prop", user_sharding, shape, backend_config))
        return user_sharding

    def infer(self, arg_shapes, arg_shardings, result_shape, backend_config):
        self.calls.append(("infer", arg_shapes, arg_shardings, result_shape, backend_config))
        return None if arg_shardings[0] is None else SPLIT

    def partition(self, arg_shapes, arg_shardings, result_shape, result_sharding,
                  backend_config):
        self.calls.append(("partition", arg_shapes, arg_shardings, result_shape,
                           result_sharding, backend_config))
        return "module @per_device {}", [ROWS], SPLIT


def test_registrations_reach_the_plugin_before_and_after_it_loads(partitioner_plugin):
    early = Recorder()
    xla_client.register_custom_call_partitioner(
        "early_target", early.prop_user_sharding, early.partition, early.infer,
        can_side_effecting_have_replicated_sharding=True)
    xla_client.register_custom_call_as_batch_partitionable("early_batch")
    plugin, library = partitioner_plugin("record")
    late = Recorder()
    xla_client.register_custom_call_partitioner("late_target", late.prop_user_sharding,
                                                late.partition, late.infer, c_api=plugin)
    table_address = int(ffi.cast("uintptr_t", plugin.api.table))
    xla_client.register_custom_call_as_batch_partitionable("late_batch", c_api=table_address)
    tables = registered(library)
    assert sorted(tables) == ["early_target", "late_target"]
    assert tables["early_target"].can_side_effecting_have_replicated_sharding
    assert not tables["late_target"].can_side_effecting_have_replicated_sharding
    assert tables["early_target"].version == custom_partitioner.CALLBACKS_VERSION
    assert [library.fault_batch_partitionable_name(i).decode()
            for i in range(library.fault_batch_partitionable_count())] == [
        "early_batch", "late_batch"]


def test_the_callbacks_answer_through_the_c_table(partitioner_plugin):
    plugin, library = partitioner_plugin("record")
    recorder = Recorder()
    xla_client.register_custom_call_partitioner("rows", recorder.prop_user_sharding,
                                                recorder.partition, recorder.infer,
                                                c_api=plugin)
    callbacks = registered(library)["rows"]
    keep: list = []

    infer = ffi.new("JAX_CustomCallPartitioner_InferShardingFromOperands_Args *")
    infer.num_args = 2
    infer.op_args = _avals([(F32_8x4, ROWS), (F32_8, None)], keep)
    infer.result_shape = _string(F32_8.to_proto(), keep)
    infer.backend_config = _string(b"config-bytes", keep)
    callbacks.infer_sharding(callbacks, infer)
    assert not infer.header.has_error and infer.has_result_sharding
    assert HloSharding.from_proto(_read(infer.result_sharding)) == SPLIT
    assert recorder.calls[-1] == ("infer", [F32_8x4, F32_8], [ROWS, None], F32_8,
                                  b"config-bytes")
    _release(infer.header)

    infer.op_args = _avals([(F32_8x4, None), (F32_8, None)], keep)
    callbacks.infer_sharding(callbacks, infer)
    assert not infer.header.has_error and not infer.has_result_sharding
    _release(infer.header)

    propagate = ffi.new("JAX_CustomCallPartitioner_PropagateUserSharding_Args *")
    propagate.backend_config = _string(b"", keep)
    propagate.result_shape = _string(F32_8.to_proto(), keep)
    propagate.result_sharding = _string(SPLIT.to_proto(), keep)
    callbacks.propagate_user_sharding(callbacks, propagate)
    assert not propagate.header.has_error
    assert HloSharding.from_proto(_read(propagate.result_sharding)) == SPLIT
    assert recorder.calls[-1] == ("prop", SPLIT, F32_8, b"")
    _release(propagate.header)

    partition = ffi.new("JAX_CustomCallPartitioner_Partition_Args *")
    partition.num_args = 1
    partition.op_args = _avals([(F32_8x4, ROWS)], keep)
    partition.op_result.shape = _string(F32_8.to_proto(), keep)
    partition.op_result.has_sharding = True
    partition.op_result.sharding = _string(SPLIT.to_proto(), keep)
    partition.backend_config = _string(b"cfg", keep)
    callbacks.partition(callbacks, partition)
    assert not partition.header.has_error
    assert _read(partition.mlir_module) == b"module @per_device {}"
    assert HloSharding.from_proto(_read(partition.args_sharding[0])) == ROWS
    assert HloSharding.from_proto(_read(partition.result_sharding)) == SPLIT
    assert recorder.calls[-1] == ("partition", [F32_8x4], [ROWS], F32_8, SPLIT, b"cfg")
    _release(partition.header)


def test_a_callbacks_exception_becomes_the_plugins_error(partitioner_plugin):
    plugin, library = partitioner_plugin("record")

    def partition(*args):
        raise ValueError("this call cannot be split")

    def wrong_count(*args):
        return "module {}", [ROWS, ROWS], SPLIT

    xla_client.register_custom_call_partitioner("fails", _never, partition, _never,
                                                c_api=plugin)
    xla_client.register_custom_call_partitioner("miscounts", _never, wrong_count, _never,
                                                c_api=plugin)
    keep: list = []
    for name, expected in (("fails", "ValueError: this call cannot be split"),
                           ("miscounts", "partition returned 2 operand shardings for 1")):
        callbacks = registered(library)[name]
        args = ffi.new("JAX_CustomCallPartitioner_Partition_Args *")
        args.num_args = 1
        args.op_args = _avals([(F32_8x4, None)], keep)
        args.op_result.shape = _string(F32_8.to_proto(), keep)
        callbacks.partition(callbacks, args)
        assert args.header.has_error
        assert args.header.code == lib.PJRT_Error_Code_INVALID_ARGUMENT
        message = _read(args.header.error_msg).decode()
        assert f"custom partitioner {name!r}, partition" in message and expected in message
        _release(args.header)


def _plugin_calls(library):
    """The fault plugin's own C calls of the registered callbacks (fault_plugin.c)."""
    out = ctypes.create_string_buffer(256)
    sizes = [ctypes.c_char_p, ctypes.c_size_t]
    library.fault_partitioner_infer.argtypes = [ctypes.c_int, *sizes, *sizes, *sizes,
                                                ctypes.c_char_p, ctypes.c_size_t]
    library.fault_partitioner_infer.restype = ctypes.c_long
    library.fault_partitioner_propagate.argtypes = [ctypes.c_int, *sizes, *sizes,
                                                    ctypes.c_char_p, ctypes.c_size_t]
    library.fault_partitioner_propagate.restype = ctypes.c_long
    library.fault_partitioner_error.restype = ctypes.c_char_p

    def infer(i, shape, sharding, config):
        encoded = b"" if sharding is None else sharding.to_proto()
        size = library.fault_partitioner_infer(i, shape.to_proto(), len(shape.to_proto()),
                                               encoded, len(encoded), config, len(config),
                                               out, len(out))
        return size if size <= 0 else HloSharding.from_proto(out.raw[:size])

    def propagate(i, shape, sharding):
        size = library.fault_partitioner_propagate(i, shape.to_proto(), len(shape.to_proto()),
                                                   sharding.to_proto(),
                                                   len(sharding.to_proto()), out, len(out))
        return size if size < 0 else HloSharding.from_proto(out.raw[:size])

    return infer, propagate


def test_the_plugin_calls_the_callbacks_from_c(partitioner_plugin):
    """The plugin's C code, compiled apart from pjrt against the same header, calls the
    callbacks and releases their answers as a compiler does."""
    plugin, library = partitioner_plugin("record")
    recorder = Recorder()

    def refuse(user_sharding, shape, config):
        raise NotImplementedError("no propagation for this call")

    xla_client.register_custom_call_partitioner("from_c", recorder.prop_user_sharding,
                                                recorder.partition, recorder.infer,
                                                c_api=plugin)
    xla_client.register_custom_call_partitioner("refuses", refuse, _never, _never, c_api=plugin)
    infer, propagate = _plugin_calls(library)
    assert infer(0, F32_8x4, ROWS, b"cfg") == SPLIT
    assert recorder.calls[-1] == ("infer", [F32_8x4], [ROWS], F32_8x4, b"cfg")
    assert infer(0, F32_8x4, None, b"") == 0  # no sharding inferred
    assert propagate(0, F32_8, SPLIT) == SPLIT
    assert recorder.calls[-1] == ("prop", SPLIT, F32_8, b"")
    assert propagate(1, F32_8, SPLIT) == -2 - lib.PJRT_Error_Code_UNIMPLEMENTED
    assert library.fault_partitioner_error().decode() == (
        "custom partitioner 'refuses', prop_user_sharding: NotImplementedError: no "
        "propagation for this call")
    assert not custom_partitioner._results  # every answer released by the plugin


def test_the_plugins_dtor_lets_the_callbacks_go(partitioner_plugin):
    plugin, library = partitioner_plugin("record")
    xla_client.register_custom_call_partitioner("dropped", _never, _never, _never, c_api=plugin)
    assert "dropped" in custom_partitioner.live_partitioners()
    assert library.fault_partitioner_destroy(0) == 0
    assert "dropped" not in custom_partitioner.live_partitioners()


def test_a_plugin_refusal_is_raised(partitioner_plugin):
    plugin, _ = partitioner_plugin("refuse")
    with pytest.raises(XlaRuntimeError, match="custom partitioners are refused"):
        xla_client.register_custom_call_partitioner("refused", _never, _never, _never,
                                                    c_api=plugin)
    assert "refused" not in custom_partitioner.live_partitioners()  # not kept for nothing
    with pytest.raises(XlaRuntimeError, match="batch partitionable targets are refused"):
        xla_client.register_custom_call_as_batch_partitionable("refused", c_api=plugin)


def test_the_extensions_layout_is_openxlas():
    """Offsets of OpenXLA's declarations (version 1) on LP64, as the plugin's compiler lays
    them out: our header must place every field where the plugins read it."""
    expected = {
        "PJRT_Custom_Partitioner_Extension": (
            40, {"type": 8, "next": 16, "register_custom_partitioner": 24,
                 "register_batch_partitionable": 32}),
        "PJRT_Register_Custom_Partitioner_Args": (
            32, {"name": 8, "name_size": 16, "callbacks": 24}),
        "PJRT_Register_Batch_Partitionable_Args": (24, {"name": 8, "name_size": 16}),
        "JAX_CustomCallPartitioner_Callbacks": (
            56, {"private_data": 8, "dtor": 16, "partition": 24, "infer_sharding": 32,
                 "propagate_user_sharding": 40,
                 "can_side_effecting_have_replicated_sharding": 48}),
        "JAX_CustomCallPartitioner_version_and_error": (
            48, {"data": 8, "cleanup_fn": 16, "has_error": 24, "code": 28, "error_msg": 32}),
        "JAX_CustomCallPartitioner_aval": (40, {"has_sharding": 16, "sharding": 24}),
        "JAX_CustomCallPartitioner_Partition_Args": (
            160, {"num_args": 48, "op_args": 56, "op_result": 64, "backend_config": 104,
                  "mlir_module": 120, "args_sharding": 136, "result_sharding": 144}),
        "JAX_CustomCallPartitioner_InferShardingFromOperands_Args": (
            120, {"num_args": 48, "op_args": 56, "result_shape": 64, "backend_config": 80,
                  "has_result_sharding": 96, "result_sharding": 104}),
        "JAX_CustomCallPartitioner_PropagateUserSharding_Args": (
            96, {"backend_config": 48, "result_shape": 64, "result_sharding": 80}),
    }
    for struct, (size, fields) in expected.items():
        assert ffi.sizeof(struct) == size, struct
        assert {f: ffi.offsetof(struct, f) for f in fields} == fields, struct


def test_shardings_from_jaxlib_are_taken(partitioner_plugin):
    """jax's callbacks answer with jaxlib's HloSharding (whose to_proto() is an OpSharding
    message): the plugin gets the same bytes as from pjrt's."""
    xla_client_of_jaxlib = pytest.importorskip("jaxlib.xla_client")
    plugin, library = partitioner_plugin("record")
    theirs = xla_client_of_jaxlib.HloSharding.iota_tile((2,))
    xla_client.register_custom_call_partitioner(
        "jaxlib_sharding", lambda sharding, shape, config: theirs, _never, _never, c_api=plugin)
    _, propagate = _plugin_calls(library)
    assert propagate(0, F32_8, ROWS) == SPLIT


def test_a_callback_answering_something_else_is_told_so(partitioner_plugin):
    plugin, library = partitioner_plugin("record")
    xla_client.register_custom_call_partitioner(
        "wrong_answer", lambda sharding, shape, config: "{replicated}", _never, _never,
        c_api=plugin)
    _, propagate = _plugin_calls(library)
    assert propagate(0, F32_8, ROWS) == -2 - lib.PJRT_Error_Code_INVALID_ARGUMENT
    assert library.fault_partitioner_error().decode() == (
        "custom partitioner 'wrong_answer', prop_user_sharding: TypeError: the sharding "
        "prop_user_sharding returned must be an HloSharding (or a serialised OpSharding), "
        "not str")
