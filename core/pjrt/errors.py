"""Exceptions raised by pjrt, and the one place a ``PJRT_Error*`` becomes one.

Every C API call that can fail returns a ``PJRT_Error*``. [`check`][pjrt.errors.check] is the only code that
reads such an error: it takes its code and message, frees it (always, even if reading fails),
and raises [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError]. Nothing else in the package touches ``PJRT_Error``.
"""
from __future__ import annotations

import enum
import itertools
import threading

from ._pjrt_cffi import ffi


class ErrorCode(enum.IntEnum):
    """The status codes a PJRT plugin reports (``PJRT_Error_Code``; absl's status codes)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class XlaRuntimeError(RuntimeError):
    """An error reported by a PJRT plugin.

    ``str(e)`` reads ``"CODE: message"`` as jaxlib's errors do. ``e.code`` is the
    [`ErrorCode`][pjrt.errors.ErrorCode], ``e.code_name`` its name (e.g. ``"INVALID_ARGUMENT"``), and
    ``e.plugin_message`` the plugin's own text.
    """

    def __init__(self, code: ErrorCode | int, message: str):
        try:
            code = ErrorCode(code)
        except ValueError:
            code = ErrorCode.UNKNOWN
        self.code = code
        self.code_name = code.name
        self.plugin_message = message
        super().__init__(f"{code.name}: {message}")


class PluginLoadError(RuntimeError):
    """A PJRT plugin library could not be loaded; the message says why and what to do.

    Attributes:
      path: the library's path, where there is one.
      missing_library: the name of the first library to install when the loader could not
        find a dependency (a driver's library when one is missing), else None.
      missing_libraries: every dependency the loader cannot find, drivers first, each with
        ``name``, ``needed_by``, ``provider`` (the pip package or system component, in
        words, or None), ``pip_package`` and ``is_driver``; empty when none is missing.
    """

    def __init__(self, message: str, *, path: str | None = None, missing_library: str | None = None,
                 missing_libraries: tuple = ()):
        self.path = path
        self.missing_libraries = tuple(missing_libraries)
        if missing_library is None and self.missing_libraries:
            missing_library = self.missing_libraries[0].name
        self.missing_library = missing_library
        super().__init__(message)


class UnsupportedFeatureError(XlaRuntimeError):
    """The plugin's PJRT API table does not have a function this call needs.

    Raised before anything is called, so the process keeps working. ``function`` is the PJRT
    function's name; ``plugin_version`` and ``header_version`` the two API versions.
    """

    def __init__(self, function: str, plugin_name: str, plugin_version: tuple[int, int],
                 header_version: tuple[int, int], *, why: str = ""):
        self.function = function
        self.plugin_version = plugin_version
        self.header_version = header_version
        message = (
            f"plugin {plugin_name!r} (PJRT API {plugin_version[0]}.{plugin_version[1]}) does not "
            f"provide {function}, which this pjrt (built against PJRT API "
            f"{header_version[0]}.{header_version[1]}) needs for this call"
        )
        if why:
            message += f"; {why}"
        super().__init__(ErrorCode.UNIMPLEMENTED, message)


class DeletedArrayError(XlaRuntimeError):
    """An operation used an Array after ``delete()`` or after it was donated to a program.

    An [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError] (``INVALID_ARGUMENT``), as jaxlib
    raises for a deleted or donated buffer, so that jaxlib's ``except`` clauses catch it.
    """

    def __init__(self, message: str):
        super().__init__(ErrorCode.INVALID_ARGUMENT, message)


class ArgumentMismatchError(TypeError, XlaRuntimeError):
    """A program was called with an argument whose shape or dtype is not its parameter's.

    Both a ``TypeError`` and an [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError]
    (``INVALID_ARGUMENT``, with jaxlib's words "Argument does not match"), so that code
    written for either catches it.
    """

    def __init__(self, index: int, shape: tuple, dtype, expected_shape: tuple, expected_dtype):
        self.index = index
        XlaRuntimeError.__init__(
            self, ErrorCode.INVALID_ARGUMENT,
            f"Invalid argument: Argument does not match parameter {index} of the program: want "
            f"{_shape_text(expected_shape, expected_dtype)}, got {_shape_text(shape, dtype)} "
            f"(argument {index} has shape {tuple(shape)} and dtype {dtype}, but the program "
            f"expects shape {tuple(expected_shape)} and dtype {expected_dtype})")


class ConsumedCapsuleError(BufferError, RuntimeError):
    """A DLPack capsule was handed to a consumer a second time.

    A ``BufferError``, as the DLPack protocol's errors are, and a ``RuntimeError`` ("a DLPack
    tensor may be consumed at most once"), as jaxlib raises.
    """


def _shape_text(shape: tuple, dtype) -> str:
    """XLA's spelling of an array shape without its layout: ``f32[2,3]``."""
    from . import dtypes

    try:
        name = dtypes.xla_type_name(dtypes.to_xla_type(dtype))
    except (TypeError, ValueError, KeyError):
        name = str(dtype)
    return f"{name}[{','.join(str(d) for d in shape)}]"


class ClosedClientError(RuntimeError):
    """An operation used a Client (or one of its objects) after ``client.close()``."""


def check(api, error) -> None:
    """Raise [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError] if ``error`` (a ``PJRT_Error*``) is set; free it.

    ``api`` is the `pjrt._capi.api.Api` of the plugin that returned the error. The error is
    destroyed in every case, exactly once.
    """
    if error == ffi.NULL:
        return
    raise consume(api, error)


def consume(api, error) -> XlaRuntimeError:
    """Turn a non-NULL ``PJRT_Error*`` into an exception object and free the error."""
    table = api.table
    try:
        message_args = api.new_args("PJRT_Error_Message_Args")
        message_args.error = error
        table.PJRT_Error_Message(message_args)
        message = ffi.unpack(message_args.message, message_args.message_size).decode(
            "utf-8", errors="replace") if message_args.message != ffi.NULL else ""
        code_args = api.new_args("PJRT_Error_GetCode_Args")
        code_args.error = error
        code_error = table.PJRT_Error_GetCode(code_args)
        code = ErrorCode.UNKNOWN if code_error != ffi.NULL else code_args.code
        if code_error != ffi.NULL:
            _destroy(api, code_error)
    finally:
        _destroy(api, error)
    if _CARRIED_TAG in message:
        carried = _claim_carried(message)
        if carried is not None:
            return carried  # pyright: ignore[reportReturnType]
    return XlaRuntimeError(code, message)


# -- exceptions that keep their type across the plugin ---------------------------------------

#: A KeyboardInterrupt or SystemExit raised in a Python callback the plugin called (a custom
#: call's handler) must reach the caller as itself, not as the plugin's INTERNAL error. The
#: callback returns an error whose message carries a tag; [`consume`][pjrt.errors.consume] hands back the
#: exception the tag names. Unclaimed ones (an error nobody read) are dropped oldest first.
_CARRIED_TAG = "[pjrt carries "
_CARRIED_LIMIT = 64
_carried: dict[int, BaseException] = {}
_carried_numbers = itertools.count(1)
_carried_lock = threading.Lock()


def carry_across_plugin(exception: BaseException) -> str:
    """A tag to put in the message of the plugin error that stands for ``exception``; the
    error boundary ([`consume`][pjrt.errors.consume]) then raises ``exception`` itself."""
    number = next(_carried_numbers)
    with _carried_lock:
        _carried[number] = exception
        while len(_carried) > _CARRIED_LIMIT:
            _carried.pop(next(iter(_carried)))
    return f"{_CARRIED_TAG}{number}]"


def _claim_carried(message: str) -> BaseException | None:
    start = message.rfind(_CARRIED_TAG) + len(_CARRIED_TAG)
    end = message.find("]", start)
    try:
        number = int(message[start:end])
    except ValueError:
        return None
    with _carried_lock:
        return _carried.pop(number, None)


def _destroy(api, error) -> None:
    args = api.new_args("PJRT_Error_Destroy_Args")
    args.error = error
    api.table.PJRT_Error_Destroy(args)


class DeviceAssignmentMismatchError(ValueError):
    """Arguments committed to devices other than those a program runs on.

    The message lists each mismatched argument with the devices it sits on and the devices the
    program expects; copy the argument with ``pjrt.device_put(x, sharding)`` first.
    """


class IncompatibleExecutableError(ValueError):
    """A serialized executable was refused because the plugin loading it is not the build
    that made it, or that build cannot be verified.

    ``made_by`` and ``loading_with`` are the two ``pjrt.compilation_cache.PluginIdentity``
    values (``made_by`` is None for bytes that do not say who made them). The message names
    both and says what to do: recompile with this plugin, or load with the one that made it.
    """

    def __init__(self, message: str, *, made_by=None, loading_with=None):
        self.made_by = made_by
        self.loading_with = loading_with
        super().__init__(message)
