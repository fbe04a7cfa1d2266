"""XLA FFI structs pjrt fills in while a custom call runs: per-call-site state, stage frames,
user types.

A plugin's PJRT FFI extension registers a single handler per target, the one XLA calls at
its EXECUTE stage. The other stages of a handler bundle (see ``pjrt.ffi``) are run by pjrt
from inside that call, with what XLA gives every handler:

* the **instance state**: XLA keeps one state slot per call site of an executable (the
  ``ExecutionState`` of its custom-call thunk), reached from any stage through the call
  frame's execution context with ``XLA_FFI_State_Get``/``XLA_FFI_State_Set`` for the
  INSTANTIATE stage, and freed with the executable through the deleter of the state's type;
* **stage frames**: a copy of the EXECUTE frame with another ``stage``, for running a C
  handler of another stage;
* **user types**, registered through the extension (``PJRT_FFI_TypeID_Register_Args``).

The state arguments changed layout between FFI runtimes: 0.2 has no ``stage`` field
(``XLA_FFI_State_Args_V02``) and reads ``type_id`` where 0.3 has ``stage``, so the layout is
picked from the runtime's version in the frame. Only the INSTANTIATE stage's state is ever
asked for: XLA's CPU runtime keeps no state for the other stages, and asking for one crashes
the plugin.
"""
from __future__ import annotations

from .._pjrt_cffi import ffi, lib
from ..errors import check

_NULL = ffi.NULL
INSTANTIATE = lib.XLA_FFI_ExecutionStage_INSTANTIATE

#: What ``XLA_FFI_State_Get`` says of a call site whose state slot is empty (XLA's
#: ``ExecutionState::Get``; the error has no code a 0.2 or 0.3 runtime would hand out).
_NOT_SET = "state is not set"


def error_text(api, error) -> str:
    """The message of the ``XLA_FFI_Error*`` a call of the FFI table ``api`` returned; the
    error is freed."""
    message = ffi.new("XLA_FFI_Error_GetMessage_Args *")
    message.struct_size = ffi.sizeof("XLA_FFI_Error_GetMessage_Args")
    message.error = error
    try:
        api.XLA_FFI_Error_GetMessage(message)
        return ("" if message.message == _NULL
                else ffi.string(message.message).decode("utf-8", "replace"))
    finally:
        destroy = ffi.new("XLA_FFI_Error_Destroy_Args *")
        destroy.struct_size = ffi.sizeof("XLA_FFI_Error_Destroy_Args")
        destroy.error = error
        api.XLA_FFI_Error_Destroy(destroy)


def new_type_id(value: int = 0):
    """An ``XLA_FFI_TypeId*`` holding ``value``; the caller keeps it alive while it is used."""
    type_id = ffi.new("XLA_FFI_TypeId *")
    type_id.type_id = value
    return type_id


def _has_stage_field(api) -> bool:
    version = api.api_version
    return version.major_version > 0 or version.minor_version >= 3


def _state_args(frame, kind: str, type_id, state=_NULL):
    """The args of ``XLA_FFI_State_<kind>`` for the INSTANTIATE stage of ``frame``'s call
    site, in the layout of the frame's runtime: (the pointer to pass, the memory behind it,
    a function reading its ``state`` back)."""
    if _has_stage_field(frame.api):
        args = ffi.new(f"XLA_FFI_State_{kind}_Args *")
        args.struct_size = ffi.sizeof(f"XLA_FFI_State_{kind}_Args")
        args.stage = INSTANTIATE
    else:  # a 0.2 runtime: the same struct without ``stage``
        args = ffi.new("XLA_FFI_State_Args_V02 *")
        args.struct_size = ffi.sizeof("XLA_FFI_State_Args_V02")
    args.ctx = frame.ctx
    args.type_id = type_id
    args.state = state
    return (ffi.cast(f"XLA_FFI_State_{kind}_Args *", args), args,
            lambda: int(ffi.cast("uintptr_t", args.state)))


def instance_state(frame, type_id) -> tuple[int | None, str | None]:
    """The state of the call site ``frame`` runs for, if it holds one of type ``type_id``.

    Returns ``(address, None)`` when it does, ``(None, None)`` when the call site has no
    state yet, and ``(None, message)`` when it holds a state of another type (the runtime's
    message names both types).
    """
    args, _memory, read = _state_args(frame, "Get", type_id)
    error = frame.api.XLA_FFI_State_Get(args)
    if error == _NULL:
        return read(), None
    message = error_text(frame.api, error)
    return None, (None if _NOT_SET in message.lower() else message)


def set_instance_state(frame, type_id, address: int) -> str | None:
    """Give the call site ``frame`` runs for the state ``address`` of type ``type_id``; the
    runtime's message when it refuses (a state is already set, the type has no deleter)."""
    args, _memory, _ = _state_args(frame, "Set", type_id, ffi.cast("void *", address))
    error = frame.api.XLA_FFI_State_Set(args)
    return None if error == _NULL else error_text(frame.api, error)


def stage_frame(frame, stage: int, with_buffers: bool):
    """A copy of the EXECUTE call frame ``frame`` for running a handler of ``stage``: the same
    runtime, execution context and attributes, and the operands and results only when
    ``with_buffers`` (XLA hands its instantiate handlers none). Valid while ``frame`` is."""
    copy = ffi.new("XLA_FFI_CallFrame *")
    copy.struct_size = frame.struct_size
    copy.extension_start = _NULL
    copy.api = frame.api
    copy.ctx = frame.ctx
    copy.stage = stage
    if with_buffers:
        copy.args = frame.args
        copy.rets = frame.rets
    else:
        copy.args.struct_size = frame.args.struct_size
        copy.rets.struct_size = frame.rets.struct_size
    copy.attrs = frame.attrs
    return copy


def register_type(api, extension, name: str, type_id: int, deleter) -> int:
    """Register the user type ``name`` with a plugin's FFI extension (a
    ``PJRT_FFI_Extension*`` of the plugin whose `Api` is ``api``) and return its id.

    ``type_id`` 0 has the plugin assign one; any other is the id the type must have there.
    ``deleter`` (a ``void (*)(void*)`` or NULL) is how the plugin frees a state of the type.

    Raises:
      XlaRuntimeError: the plugin refused (the name is registered with another id, ...).
    """
    encoded = name.encode("utf-8")
    text = ffi.new("char[]", encoded)
    info = ffi.new("PJRT_FFI_Type_Info *")
    info.deleter = deleter
    args = ffi.new("PJRT_FFI_TypeID_Register_Args *")
    args.struct_size = ffi.sizeof("PJRT_FFI_TypeID_Register_Args")
    args.type_name = text
    args.type_name_size = len(encoded)
    args.type_id = type_id
    args.type_info = info
    check(api, extension.type_id_register(args))
    return int(args.type_id)
