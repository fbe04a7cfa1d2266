"""The PJRT custom partitioner extension (``PJRT_Extension_Type_Custom_Partitioner``, declared in
``pjrt_c_api_custom_partitioner_extension.h``): Python callbacks behind the C table a plugin's
SPMD partitioner calls for a custom call.

This module speaks bytes only (shapes as serialised ``xla.ShapeProto``, shardings as serialised
``xla.OpSharding``); `pjrt.ffi.register_custom_call_partitioner` turns them into `Shape` and
`HloSharding` for the user's functions. A callback's results stay alive until the plugin calls
the header's ``cleanup_fn``; an exception becomes the header's error (its type and message).
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, NamedTuple, Optional, Sequence

from .._pjrt_cffi import ffi, lib
from ..errors import UnsupportedFeatureError, check
from . import api as _c

#: The extension's struct up to ``register_batch_partitionable`` (its first version).
_EXTENSION_END = ffi.sizeof("PJRT_Custom_Partitioner_Extension")
#: The version of the callback table pjrt fills in.
CALLBACKS_VERSION = 1


class Partitioner(NamedTuple):
    """The byte-level callbacks of one target.

    partition(arg_shapes, arg_shardings, result_shape, result_sharding, backend_config)
        -> (mlir_module, arg_shardings, result_sharding)
    infer_sharding(arg_shapes, arg_shardings, result_shape, backend_config) -> sharding or None
    propagate_user_sharding(user_sharding, result_shape, backend_config) -> sharding

    A sharding that an operand lacks is None.
    """

    name: str
    partition: Callable
    infer_sharding: Callable
    propagate_user_sharding: Callable


_lock = threading.Lock()
_keys = itertools.count(1)
#: private_data key -> (Partitioner, the callbacks struct); dropped when the plugin calls dtor.
_partitioners: dict[int, tuple] = {}
#: header.data key -> what a callback's results point into, until cleanup_fn.
_results: dict[int, list] = {}


def find_extension(api: _c.Api, plugin_name: str):
    """The plugin's ``PJRT_Custom_Partitioner_Extension*``.

    Raises:
      UnsupportedFeatureError: the plugin does not offer the extension (the message names the
        plugin and the extensions it does offer).
    """
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_Custom_Partitioner)
    if extension is not None and extension.struct_size >= _EXTENSION_END:
        return ffi.cast("PJRT_Custom_Partitioner_Extension *", extension)
    names = {value: name.replace("PJRT_Extension_Type_", "")
             for name, value in ffi.typeof("PJRT_Extension_Type").relements.items()}
    offered = ", ".join(names.get(int(e.type), f"unknown type {int(e.type)}")
                        for e in _c.extensions(api)) or "none"
    why = ("its custom partitioner extension is older than its first version"
           if extension is not None else
           f"plugin {plugin_name!r} does not offer the PJRT custom partitioner extension")
    raise UnsupportedFeatureError(
        "PJRT_Register_Custom_Partitioner (PJRT_Extension_Type_Custom_Partitioner)",
        api.plugin_name, api.version, _c.HEADER_VERSION,
        why=f"{why}, so custom-call partitioners cannot be registered with it (extensions it "
            f"offers: {offered})")


def has_extension(api: _c.Api) -> bool:
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_Custom_Partitioner)
    return extension is not None and extension.struct_size >= _EXTENSION_END


# -- reading and writing the callbacks' arguments ------------------------------------------------

def _bytes(string) -> bytes:
    return ffi.unpack(string.data, string.size) if string.size else b""


def _avals(count: int, avals) -> tuple[list[bytes], list[Optional[bytes]]]:
    shapes, shardings = [], []
    for i in range(count):
        shapes.append(_bytes(avals[i].shape))
        shardings.append(_bytes(avals[i].sharding) if avals[i].has_sharding else None)
    return shapes, shardings


def _set(string, value: bytes, keep: list) -> None:
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    buffer = ffi.new("char[]", bytes(value) or b"\0")
    keep.append(buffer)
    string.data = buffer
    string.size = len(value)


def _finish(header, keep: list) -> None:
    key = next(_keys)
    _results[key] = keep
    header.data = ffi.cast("void *", key)
    header.cleanup_fn = _cleanup
    header.has_error = False


def _fail(header, error: BaseException, partitioner_name: str, stage: str) -> None:
    code = (lib.PJRT_Error_Code_INVALID_ARGUMENT if isinstance(error, (TypeError, ValueError))
            else lib.PJRT_Error_Code_UNIMPLEMENTED if isinstance(error, NotImplementedError)
            else lib.PJRT_Error_Code_INTERNAL)
    message = (f"custom partitioner {partitioner_name!r}, {stage}: "
               f"{type(error).__name__}: {error}").encode("utf-8", "replace")
    keep: list = []
    _set(header.error_msg, message, keep)
    _finish(header, keep)
    header.has_error = True
    header.code = code


@ffi.callback("void(void *)")
def _cleanup(data) -> None:
    _results.pop(int(ffi.cast("uintptr_t", data)), None)


def _partitioner_of(callbacks) -> Partitioner:
    return _partitioners[int(ffi.cast("uintptr_t", callbacks.private_data))][0]


@ffi.callback("void(JAX_CustomCallPartitioner_Callbacks *, "
              "JAX_CustomCallPartitioner_Partition_Args *)")
def _partition(callbacks, args) -> None:
    name = "?"
    try:
        partitioner = _partitioner_of(callbacks)
        name = partitioner.name
        shapes, shardings = _avals(args.num_args, args.op_args)
        result = args.op_result
        module, arg_shardings, result_sharding = partitioner.partition(
            shapes, shardings, _bytes(result.shape),
            _bytes(result.sharding) if result.has_sharding else None,
            _bytes(args.backend_config))
        arg_shardings = list(arg_shardings)
        if len(arg_shardings) != args.num_args:
            raise ValueError(f"partition returned {len(arg_shardings)} operand shardings for "
                             f"{args.num_args} operands")
        keep: list = []
        _set(args.mlir_module, module.encode() if isinstance(module, str) else module, keep)
        array = ffi.new("JAX_CustomCallPartitioner_string[]", max(len(arg_shardings), 1))
        keep.append(array)
        for i, sharding in enumerate(arg_shardings):
            _set(array[i], sharding, keep)
        args.args_sharding = array
        _set(args.result_sharding, result_sharding, keep)
        _finish(args.header, keep)
    except BaseException as error:  # noqa: BLE001 - it must reach the plugin, not unwind C
        _fail(args.header, error, name, "partition")


@ffi.callback("void(JAX_CustomCallPartitioner_Callbacks *, "
              "JAX_CustomCallPartitioner_InferShardingFromOperands_Args *)")
def _infer_sharding(callbacks, args) -> None:
    name = "?"
    try:
        partitioner = _partitioner_of(callbacks)
        name = partitioner.name
        shapes, shardings = _avals(args.num_args, args.op_args)
        sharding = partitioner.infer_sharding(shapes, shardings, _bytes(args.result_shape),
                                              _bytes(args.backend_config))
        keep: list = []
        args.has_result_sharding = sharding is not None
        if sharding is not None:
            _set(args.result_sharding, sharding, keep)
        _finish(args.header, keep)
    except BaseException as error:  # noqa: BLE001
        _fail(args.header, error, name, "infer_sharding_from_operands")


@ffi.callback("void(JAX_CustomCallPartitioner_Callbacks *, "
              "JAX_CustomCallPartitioner_PropagateUserSharding_Args *)")
def _propagate_user_sharding(callbacks, args) -> None:
    name = "?"
    try:
        partitioner = _partitioner_of(callbacks)
        name = partitioner.name
        sharding = partitioner.propagate_user_sharding(
            _bytes(args.result_sharding), _bytes(args.result_shape), _bytes(args.backend_config))
        keep: list = []
        _set(args.result_sharding, sharding, keep)
        _finish(args.header, keep)
    except BaseException as error:  # noqa: BLE001
        _fail(args.header, error, name, "prop_user_sharding")


@ffi.callback("void(JAX_CustomCallPartitioner_Callbacks *)")
def _dtor(callbacks) -> None:
    with _lock:
        _partitioners.pop(int(ffi.cast("uintptr_t", callbacks.private_data)), None)


def make_callbacks(partitioner: Partitioner, can_side_effecting_have_replicated_sharding: bool):
    """A ``JAX_CustomCallPartitioner_Callbacks*`` for ``partitioner``, alive until the plugin
    calls its ``dtor``."""
    callbacks = ffi.new("JAX_CustomCallPartitioner_Callbacks *")
    with _lock:
        key = next(_keys)
        _partitioners[key] = (partitioner, callbacks)
    callbacks.version = CALLBACKS_VERSION
    callbacks.private_data = ffi.cast("void *", key)
    callbacks.dtor = _dtor
    callbacks.partition = _partition
    callbacks.infer_sharding = _infer_sharding
    callbacks.propagate_user_sharding = _propagate_user_sharding
    callbacks.can_side_effecting_have_replicated_sharding = bool(
        can_side_effecting_have_replicated_sharding)
    return callbacks


def register(api: _c.Api, extension, name: str, callbacks) -> None:
    """``register_custom_partitioner(name, callbacks)``; the plugin's error is raised, and the
    callbacks it refused are dropped."""
    encoded = name.encode("utf-8")
    text = ffi.new("char[]", encoded)
    args = ffi.new("PJRT_Register_Custom_Partitioner_Args *")
    args.struct_size = ffi.sizeof("PJRT_Register_Custom_Partitioner_Args")
    args.name = text
    args.name_size = len(encoded)
    args.callbacks = callbacks
    try:
        check(api, extension.register_custom_partitioner(args))
    except BaseException:
        with _lock:
            _partitioners.pop(int(ffi.cast("uintptr_t", callbacks.private_data)), None)
        raise


def register_batch_partitionable(api: _c.Api, extension, name: str) -> None:
    """``register_batch_partitionable(name)``; the plugin's error is raised."""
    encoded = name.encode("utf-8")
    text = ffi.new("char[]", encoded)
    args = ffi.new("PJRT_Register_Batch_Partitionable_Args *")
    args.struct_size = ffi.sizeof("PJRT_Register_Batch_Partitionable_Args")
    args.name = text
    args.name_size = len(encoded)
    check(api, extension.register_batch_partitionable(args))


def live_partitioners() -> Sequence[str]:
    """The names of the partitioners whose callbacks a plugin still holds."""
    with _lock:
        return [entry[0].name for entry in _partitioners.values()]
