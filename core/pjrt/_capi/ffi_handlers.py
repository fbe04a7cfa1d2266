"""Custom-call handlers written in Python, as XLA's FFI runs them: the trampoline a plugin
calls at each execution (`python_handler`), which reads the call frame's buffers and attributes
into numpy and Python values, runs the handler (and the stages of a bundle before it), and
turns what it raised into the FFI error the plugin reports; and the state each call site of a
bundle with ``instantiate`` keeps (`c_bundle_handler` for C bundles). `pjrt.ffi` registers them.
"""
from __future__ import annotations

import contextvars
import itertools
import logging
import threading
import traceback
from typing import Any, Callable

import numpy as np

from .. import dtypes
from .._pjrt_cffi import ffi, lib
from ..errors import ErrorCode, XlaRuntimeError, carry_across_plugin
from . import ffi_state as _state
from .native_runtime import programs_may_call_python
from .handler_devices import handler_finished, handler_running_on_device

logger = logging.getLogger("pjrt.ffi")

#: The XLA FFI version our handlers report when a plugin asks (the "metadata query" every
#: handler answers at registration). A plugin accepts a range of versions and silently drops
#: a handler outside it. 0.1 is the oldest both tested plugins accept (XLA FFI 0.2 and 0.3
#: runtimes); our handlers only use the call-frame layout and XLA_FFI_Error_Create, which have
#: not changed since 0.1, so answering 0.1 is also the truthful answer.
HANDLER_FFI_VERSION: tuple[int, int] = (0, 1)

_EXECUTE = lib.XLA_FFI_ExecutionStage_EXECUTE
_INSTANTIATE = lib.XLA_FFI_ExecutionStage_INSTANTIATE
_NULL = ffi.NULL
_TRAITS_END = ffi.offsetof("XLA_FFI_Metadata", "traits") + ffi.sizeof("XLA_FFI_Handler_Traits")


def _metadata_of_query(frame):
    """The ``XLA_FFI_Metadata*`` to fill in when ``frame`` is XLA's metadata query, else None."""
    extension = frame.extension_start
    while extension != _NULL:
        if extension.type == lib.XLA_FFI_Extension_Metadata:
            return ffi.cast("XLA_FFI_Metadata_Extension *", extension).metadata
        extension = extension.next
    return None


def _answer_metadata_query(frame) -> bool:
    """If ``frame`` is XLA's metadata query, fill in our version and traits; True if it was."""
    metadata = _metadata_of_query(frame)
    if metadata is None:
        return False
    metadata.api_version.major_version = HANDLER_FFI_VERSION[0]
    metadata.api_version.minor_version = HANDLER_FFI_VERSION[1]
    if metadata.struct_size >= _TRAITS_END:
        metadata.traits = 0
    return True


def _buffer_array(pointer, writable: bool) -> np.ndarray:
    """A numpy view of an ``XLA_FFI_Buffer*``, valid for the duration of the call."""
    buffer = ffi.cast("XLA_FFI_Buffer *", pointer)
    dtype = dtypes.from_xla_type(int(buffer.dtype))
    if dtype is None or dtype.itemsize == 0 or int(buffer.dtype) in _SUB_BYTE_TYPES:
        raise TypeError(f"a Python FFI handler cannot take buffers of XLA element type "
                        f"{int(buffer.dtype)}")
    shape = tuple(int(buffer.dims[i]) for i in range(buffer.rank))
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0 or buffer.data == _NULL:
        array = np.empty(shape, dtype)
    else:
        array = np.frombuffer(ffi.buffer(buffer.data, count * dtype.itemsize), dtype).reshape(shape)
    if not writable:
        array.flags.writeable = False
    return array


# XLA stores these packed, several to a byte; a numpy view of one element per byte would lie.
_SUB_BYTE_TYPES = frozenset({lib.XLA_FFI_DataType_S1, lib.XLA_FFI_DataType_S2,
                             lib.XLA_FFI_DataType_S4, lib.XLA_FFI_DataType_U1,
                             lib.XLA_FFI_DataType_U2, lib.XLA_FFI_DataType_U4,
                             lib.XLA_FFI_DataType_F4E2M1FN})


def _scalar_value(dtype_number: int, pointer):
    dtype = dtypes.from_xla_type(dtype_number)
    if dtype is None:
        raise TypeError(f"FFI attribute of unsupported element type {dtype_number}")
    value = np.frombuffer(ffi.buffer(pointer, dtype.itemsize), dtype)[0]
    return value.item() if dtype.kind in "biufc" else value


def _attribute_value(kind: int, pointer):
    if kind == lib.XLA_FFI_AttrType_SCALAR:
        scalar = ffi.cast("XLA_FFI_Scalar *", pointer)
        return _scalar_value(int(scalar.dtype), scalar.value)
    if kind == lib.XLA_FFI_AttrType_STRING:
        span = ffi.cast("XLA_FFI_ByteSpan *", pointer)
        return ffi.unpack(span.ptr, span.len).decode("utf-8") if span.len else ""
    if kind == lib.XLA_FFI_AttrType_ARRAY:
        array = ffi.cast("XLA_FFI_Array *", pointer)
        dtype = dtypes.from_xla_type(int(array.dtype))
        if dtype is None:
            raise TypeError(f"FFI array attribute of unsupported element type {int(array.dtype)}")
        if array.size == 0:
            return np.empty(0, dtype)
        # Copied: the attribute's memory belongs to the executable, not to the handler.
        return np.frombuffer(ffi.buffer(array.data, array.size * dtype.itemsize), dtype).copy()
    if kind == lib.XLA_FFI_AttrType_DICTIONARY:
        return _attributes(ffi.cast("XLA_FFI_Attrs *", pointer)[0])
    raise TypeError(f"FFI attribute of unknown kind {kind}")


def _attributes(attrs) -> dict[str, Any]:
    decoded = {}
    for i in range(attrs.size):
        name = attrs.names[i]
        key = ffi.unpack(name.ptr, name.len).decode("utf-8")
        decoded[key] = _attribute_value(int(attrs.types[i]), attrs.attrs[i])
    return decoded


def _error(frame, code: int, message: str):
    args = ffi.new("XLA_FFI_Error_Create_Args *")
    args.struct_size = ffi.sizeof("XLA_FFI_Error_Create_Args")
    text = ffi.new("char[]", message.encode("utf-8", "replace"))
    args.message = text
    args.errc = code
    return frame.api.XLA_FFI_Error_Create(args)


def _handler_failed(frame, name: str, exc: BaseException, stage: str = "execute"):
    """The XLA error returned for an exception raised by the Python handler ``name`` (by its
    ``stage`` handler, for a bundle's other stages)."""
    try:
        code = int(exc.code) if isinstance(exc, XlaRuntimeError) else int(ErrorCode.INTERNAL)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        handler = (f"Python FFI handler {name!r}" if stage == "execute"
                   else f"the {stage} stage of Python FFI handler {name!r}")
        message = f"{handler} raised {detail}"
        # KeyboardInterrupt, SystemExit and the nesting limit reach the caller as themselves.
        if not isinstance(exc, Exception) or isinstance(exc, RecursionError):
            message += " " + carry_across_plugin(exc)
        logger.debug("%s", message, exc_info=exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not turn into success
        code, message = int(ErrorCode.INTERNAL), f"Python FFI handler {name!r} failed ({stage})"
    if frame.api == _NULL:
        # Only the metadata query comes without an API table, and it cannot fail here.
        return _NULL
    return _error(frame, code, message)


def _store_results(name: str, returned, results: list[np.ndarray]) -> None:
    """Copy what a handler returned into its result buffers (one array, or one per result)."""
    values = [returned] if len(results) == 1 and not isinstance(returned, (tuple, list)) \
        else list(returned)
    if len(values) != len(results):
        raise ValueError(f"FFI handler {name!r} returned {len(values)} values for "
                         f"{len(results)} results")
    for index, (value, out) in enumerate(zip(values, results)):
        value = np.asarray(value)
        if value.shape != out.shape:
            raise ValueError(f"FFI handler {name!r}: result {index} has shape {out.shape}, "
                             f"the handler returned shape {value.shape}")
        np.copyto(out, value, casting="same_kind")


#: How many Python handlers deep the running code is: a handler may run another program whose
#: handler runs another... (the count follows the calls onto pjrt's worker threads).
_handler_depth: contextvars.ContextVar[int] = contextvars.ContextVar("pjrt_ffi_handler_depth",
                                                                    default=0)

#: The deepest nesting of Python handlers allowed. XLA's CPU plugin hangs when programs nest
#: through their handlers about 33 deep; a limit well below raises instead.
MAX_HANDLER_DEPTH = 16


def _enter_handler(name: str):
    depth = _handler_depth.get()
    if depth >= MAX_HANDLER_DEPTH:
        raise RecursionError(
            f"custom-call handler {name!r} would run nested {depth + 1} deep (a handler runs a "
            f"program whose handler runs a program...); pjrt stops at {MAX_HANDLER_DEPTH} "
            f"(pjrt.ffi.MAX_HANDLER_DEPTH), since the plugin hangs on deep nesting: end the "
            f"recursion in the handler sooner")
    return _handler_depth.set(depth + 1)


def _device_running_asynchronously(frame) -> int | None:
    """The id of the device whose program called the handler of ``frame``, when that program
    runs asynchronously, on the plugin's own threads (the handler then runs on a thread Python
    did not start); None when it runs inline, on the thread that launched it, or when the
    plugin cannot say (an FFI API older than ``XLA_FFI_DeviceOrdinal_Get``)."""
    # A thread Python did not start is seen as a _DummyThread (threading has no public name
    # for that): the program runs on the plugin's threads, not inline on its launcher's.
    if not isinstance(threading.current_thread(), threading._DummyThread):
        return None
    ordinal = ffi.new("int32_t *")
    if not lib.pjrt_shim_ffi_device_ordinal(frame, ordinal):
        return None
    return int(ordinal[0])


def python_handler(name: str, fn: Callable, stages: dict[str, Callable] | None = None):
    """A C ``XLA_FFI_Handler`` that calls ``fn(operands, results, attributes)``, or, for a
    bundle (``stages``: its other stages by name), runs the bundle's stages (see the module
    docstring) and ``fn(operands, results, attributes, state)`` when it has ``instantiate``."""
    programs_may_call_python()  # launches let the GIL go from now on (CallPlan)
    stages = stages or {}
    instantiate = stages.get("instantiate")
    prepare = stages.get("prepare")
    initialize = stages.get("initialize")

    def trampoline(frame):
        # Nothing may escape: XLA calls this from its own threads, and an exception cffi
        # swallowed would read as success.
        stage = "execute"
        try:
            if _answer_metadata_query(frame):
                return _NULL
            if frame.stage != _EXECUTE:
                return _NULL  # only the execute stage carries data
            operands = [_buffer_array(frame.args.args[i], writable=False)
                        for i in range(frame.args.size)]
            results = [_buffer_array(frame.rets.rets[i], writable=True)
                       for i in range(frame.rets.size)]
            attributes = _attributes(frame.attrs)
            depth = _enter_handler(name)
            device = handler_running_on_device(_device_running_asynchronously(frame))
            try:
                state = None
                if instantiate is not None:
                    stage = "instantiate"
                    state = _python_instance_state(frame, name, instantiate, attributes)
                if prepare is not None:
                    stage = "prepare"
                    prepare(attributes, state)
                if initialize is not None:
                    stage = "initialize"
                    initialize(attributes, state)
                stage = "execute"
                returned = (fn(operands, results, attributes) if instantiate is None
                            else fn(operands, results, attributes, state))
            finally:
                handler_finished(device)
                _handler_depth.reset(depth)
            if returned is not None:
                _store_results(name, returned, results)
            return _NULL
        except BaseException as exc:  # noqa: BLE001 - becomes the program's error
            return _handler_failed(frame, name, exc, stage)

    return ffi.callback("XLA_FFI_Handler *", trampoline)


# -- the state of each call site ---------------------------------------------------------------

#: The type of the states pjrt keeps in call sites' execution states, registered with each
#: plugin running a bundle with ``instantiate``. Its id is chosen here, not assigned by the
#: plugin, so that one trampoline serves every plugin: far above the ids plugins assign
#: (counting from 1), and the same in each (the bytes of "pjrt.py").
INSTANCE_STATE_TYPE_NAME = "pjrt.ffi.instance_state"
INSTANCE_STATE_TYPE_ID = int.from_bytes(b"pjrt.py", "big")
_instance_state_type = _state.new_type_id(INSTANCE_STATE_TYPE_ID)

#: token -> what a Python bundle's ``instantiate`` returned for one call site. XLA keeps the
#: token as the call site's state and calls `_forget_instance_state` with it when the
#: executable dies.
_instance_states: dict[int, Any] = {}
_tokens = itertools.count(1)
#: The state pjrt gives a call site whose C ``instantiate`` kept none of its own, so that it
#: is not instantiated again; never a key of `_instance_states`.
_INSTANTIATED = next(_tokens)


def _forget_instance_state(address) -> None:
    try:
        _instance_states.pop(int(ffi.cast("uintptr_t", address)), None)
    except BaseException:  # noqa: BLE001 - a state's __del__ runs here; the plugin called us
        logger.debug("dropping a custom call's state failed", exc_info=True)


instance_state_deleter = ffi.callback("void(void *)", _forget_instance_state)
#: The deleter of user types (`register_custom_type_id` without one): XLA's plugins refuse
#: to hold a state whose type has no deleter, and the objects a C handler keeps are its own.
keep_object = ffi.callback("void(void *)", lambda address: None)


def _python_instance_state(frame, name: str, instantiate: Callable, attributes: dict):
    """The state of the call site ``frame`` runs for, made by ``instantiate(attributes)`` the
    first time."""
    address, other = _state.instance_state(frame, _instance_state_type)
    if address is not None:
        return _instance_states[address]
    if other is not None:
        raise RuntimeError(f"the call site of {name!r} holds a state pjrt did not make: {other}")
    state = instantiate(attributes)
    token = next(_tokens)
    _instance_states[token] = state
    refused = _state.set_instance_state(frame, _instance_state_type, token)
    if refused is None:
        return state
    del _instance_states[token]
    # Two first executions of one call site at once: the state of the one that set it first
    # is the call site's.
    address, other = _state.instance_state(frame, _instance_state_type)
    if address is not None:
        return _instance_states[address]
    raise RuntimeError(f"the plugin did not keep the state of {name!r}: {refused}")


def c_bundle_handler(name: str, instantiate_address: int, execute_address: int):
    """A C ``XLA_FFI_Handler`` that runs the C ``instantiate`` handler once per call site
    (before its first execution) and the C ``execute`` handler at every execution."""
    programs_may_call_python()  # the trampoline is Python: launches let the GIL go
    instantiate = ffi.cast("XLA_FFI_Handler *", instantiate_address)
    execute = ffi.cast("XLA_FFI_Handler *", execute_address)

    def trampoline(frame):
        try:
            # The metadata query goes to the execute handler, which says what it needs.
            if _metadata_of_query(frame) is None and frame.stage == _EXECUTE:
                error = _instantiate_c(frame, instantiate)
                if error != _NULL:
                    return error
            return execute(frame)
        except BaseException as exc:  # noqa: BLE001 - becomes the program's error
            if frame.api == _NULL:
                return _NULL  # the metadata query, which cannot fail here
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return _error(frame, int(ErrorCode.INTERNAL),
                          f"custom call {name!r}: running its C handlers failed: {detail}")

    return ffi.callback("XLA_FFI_Handler *", trampoline)


def _instantiate_c(frame, instantiate):
    """Run the C ``instantiate`` for the call site of ``frame`` unless it ran; its error."""
    address, other = _state.instance_state(frame, _instance_state_type)
    if address is not None or other is not None:
        return _NULL  # instantiated: it kept a state of its own, or pjrt marked the call site
    instantiate_frame = _state.stage_frame(frame, _INSTANTIATE, with_buffers=False)
    error = instantiate(instantiate_frame)
    if instantiate_frame.future != _NULL:
        raise RuntimeError("its instantiate handler returned a future: XLA runs instantiate "
                           "handlers synchronously, and so does pjrt")
    address, other = _state.instance_state(frame, _instance_state_type)
    if error != _NULL:
        if address is None and other is None:
            return error  # the program's error
        # Two first executions of one call site at once: the other one instantiated it.
        _state.error_text(frame.api, error)
        return _NULL
    if address is None and other is None:
        refused = _state.set_instance_state(frame, _instance_state_type, _INSTANTIATED)
        if refused is not None and _state.instance_state(frame, _instance_state_type) == (
                None, None):
            raise RuntimeError(f"the plugin did not mark its call site instantiated: {refused}")
    return _NULL
