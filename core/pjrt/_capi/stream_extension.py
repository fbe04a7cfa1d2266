"""The PJRT stream extension (``PJRT_Extension_Type_Stream``; our header
``pjrt_c_api/pjrt_c_api_stream_extension.h``): a GPU plugin's device stream for work that
arrives from outside (DLPack), and making a foreign stream wait for a buffer, without the host
waiting. NVIDIA's and AMD's plugins have it; XLA's CPU builds do not.

The extension's structs are not in pjrt's compiled declarations; their layout (version 0,
unchanged since the extension appeared) is written out here: the extension is its base
(``struct_size``, ``type``, ``next``) and two function pointers, ``get_stream`` then
``wait_stream``; each call's arguments are three pointer-sized words, ``struct_size`` first.
"""
from __future__ import annotations

from .._pjrt_cffi import ffi, lib
from ..errors import UnsupportedFeatureError, check
from . import api as _c

#: The extension's size: its base, then the two functions.
_EXTENSION_SIZE = ffi.sizeof("PJRT_Extension_Base") + 2 * ffi.sizeof("void *")
#: Where its functions sit, in pointers from the start.
_GET_STREAM = ffi.sizeof("PJRT_Extension_Base") // ffi.sizeof("void *")
_WAIT_STREAM = _GET_STREAM + 1
#: Both argument structs: struct_size and two pointer-sized fields.
_ARGS_WORDS = 3
_ARGS_SIZE = _ARGS_WORDS * ffi.sizeof("intptr_t")
_FUNCTION = "PJRT_Error *(*)(intptr_t *)"


def has_stream_extension(api: _c.Api) -> bool:
    """Whether the plugin offers the stream extension."""
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_Stream)
    return extension is not None and extension.struct_size >= _EXTENSION_SIZE


def _function(api: _c.Api, index: int, function: str, what: str):
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_Stream)
    if extension is None or extension.struct_size < _EXTENSION_SIZE:
        names = {value: name.replace("PJRT_Extension_Type_", "")
                 for name, value in ffi.typeof("PJRT_Extension_Type").relements.items()}
        offered = ", ".join(names.get(int(e.type), f"unknown type {int(e.type)}")
                            for e in _c.extensions(api)) or "none"
        raise UnsupportedFeatureError(
            f"{function} (PJRT_Extension_Type_Stream)", api.plugin_name, api.version,
            _c.HEADER_VERSION,
            why=f"it does not offer the PJRT stream extension, so it cannot {what} "
                f"(extensions it offers: {offered}); GPU plugins have it")
    return ffi.cast(_FUNCTION, ffi.cast("void **", extension)[index])


def stream_for_external_ready_events(api: _c.Api, device_pointer) -> int:
    """The device's stream handle (a ``cudaStream_t`` / ``hipStream_t`` as an int) that
    external producers should make ready the data they hand to the plugin.

    Raises:
      UnsupportedFeatureError: the plugin has no stream extension (the message names it).
      XlaRuntimeError: the plugin refused.
    """
    get_stream = _function(api, _GET_STREAM, "PJRT_Get_Stream_For_External_Ready_Events",
                           "give a device's stream for external ready events")
    args = ffi.new("intptr_t[]", _ARGS_WORDS)
    args[0] = _ARGS_SIZE
    args[1] = int(ffi.cast("intptr_t", device_pointer))
    check(api, get_stream(args))
    return int(args[2])


def wait_until_ready_on_stream(api: _c.Api, buffer_pointer, stream: int) -> None:
    """Make ``stream`` (a foreign stream handle on the buffer's device) wait until the
    buffer's value is computed, without the host waiting.

    Raises:
      UnsupportedFeatureError: the plugin has no stream extension (the message names it).
      XlaRuntimeError: the plugin refused (e.g. a stream of another device).
    """
    wait_stream = _function(api, _WAIT_STREAM, "PJRT_Wait_Until_Buffer_Ready_On_Stream",
                            "make a consumer's stream wait for a buffer")
    args = ffi.new("intptr_t[]", _ARGS_WORDS)
    args[0] = _ARGS_SIZE
    args[1] = int(stream)
    args[2] = int(ffi.cast("intptr_t", buffer_pointer))
    check(api, wait_stream(args))
