"""The PJRT profiler extension: a plugin's own profiler, which records its device activity.

A plugin that has one lists a ``PJRT_Profiler_Extension`` in its extension chain
(``PJRT_Extension_Type_Profiler``), pointing at a table of its own
(``PLUGIN_Profiler_Api``; ``pjrt_c_api/pjrt_c_api_profiler_extension.h``). One profiler's
life is create (from serialised ``tensorflow.ProfileOptions``), start, stop, collect (a
serialised ``tensorflow.profiler.XSpace``) and destroy. The table's calls return errors of its
own type, which become `XlaRuntimeError` here, with the plugin's code and words, and are freed.

NVIDIA's and Google's plugins have the extension; XLA's CPU plugin builds need not, and
`find` answers None for them.
"""
from __future__ import annotations

from .._pjrt_cffi import ffi, lib
from ..errors import ErrorCode, XlaRuntimeError
from .api import Api, find_extension, struct_size

_NULL = ffi.NULL


class ProfilerTable:
    """A plugin's ``PLUGIN_Profiler_Api``, found and checked by `find`."""

    __slots__ = ("plugin_name", "table")

    def __init__(self, plugin_name: str, table):
        self.plugin_name = plugin_name
        self.table = table

    def error(self, error, doing: str) -> XlaRuntimeError:
        """The exception for a ``PLUGIN_Profiler_Error*`` the table returned; the error is
        freed."""
        table = self.table
        try:
            message = Api.new_args("PLUGIN_Profiler_Error_Message_Args")
            message.error = error
            table.error_message(message)
            text = (ffi.unpack(message.message, message.message_size).decode("utf-8", "replace")
                    if message.message != _NULL else "")
            code = Api.new_args("PLUGIN_Profiler_Error_GetCode_Args")
            code.error = error
            failed = table.error_get_code(code)
            number = int(code.code) if failed == _NULL else int(ErrorCode.UNKNOWN)
            if failed != _NULL:
                self._destroy_error(failed)
        finally:
            self._destroy_error(error)
        return XlaRuntimeError(number, f"the profiler of plugin {self.plugin_name!r} failed to "
                                       f"{doing}: {text or 'no message'}")

    def _destroy_error(self, error) -> None:
        destroy = Api.new_args("PLUGIN_Profiler_Error_Destroy_Args")
        destroy.error = error
        self.table.error_destroy(destroy)

    def check(self, error, doing: str) -> None:
        if error != _NULL:
            raise self.error(error, doing)

    def create(self, options: bytes) -> "PluginProfiler":
        """A new profiler of the plugin, configured by serialised ProfileOptions."""
        buffer = ffi.new("char[]", options)
        args = Api.new_args("PLUGIN_Profiler_Create_Args")
        args.options = buffer
        args.options_size = len(options)
        self.check(self.table.create(args), "create a profiler")
        if args.profiler == _NULL:
            raise XlaRuntimeError(ErrorCode.INTERNAL, f"the profiler of plugin "
                                                      f"{self.plugin_name!r} made no profiler")
        return PluginProfiler(self, args.profiler)


class PluginProfiler:
    """One profiler a plugin made; `destroy` frees it (once)."""

    __slots__ = ("owner", "pointer")

    def __init__(self, owner: ProfilerTable, pointer):
        self.owner = owner
        self.pointer = pointer

    def _call(self, entry: str, field: str, doing: str):
        args = Api.new_args(f"PLUGIN_Profiler_{entry}_Args")
        args.profiler = self.pointer
        self.owner.check(getattr(self.owner.table, field)(args), doing)
        return args

    def start(self) -> None:
        self._call("Start", "start", "start")

    def stop(self) -> None:
        self._call("Stop", "stop", "stop")

    def collect(self) -> bytes:
        """What the profiler recorded: serialised XSpace bytes (call after `stop`)."""
        args = self._call("CollectData", "collect_data", "hand over what it recorded")
        size = int(args.buffer_size_in_bytes)
        if args.buffer != _NULL:  # the plugin's own bytes, valid until destroy
            return bytes(ffi.buffer(args.buffer, size)) if size else b""
        if not size:
            return b""
        buffer = ffi.new("uint8_t[]", size)
        args.buffer = buffer
        self.owner.check(self.owner.table.collect_data(args), "hand over what it recorded")
        return bytes(ffi.buffer(buffer, min(size, int(args.buffer_size_in_bytes))))

    def destroy(self) -> None:
        pointer, self.pointer = self.pointer, _NULL
        if pointer != _NULL:
            args = Api.new_args("PLUGIN_Profiler_Destroy_Args")
            args.profiler = pointer
            self.owner.check(self.owner.table.destroy(args), "free a profiler")


def find(api: Api) -> ProfilerTable | str | None:
    """The plugin's profiler table; None when it has no profiler extension, or a sentence
    saying why the one it has cannot be used (a table older or smaller than the header's)."""
    extension = find_extension(api, lib.PJRT_Extension_Type_Profiler)
    if extension is None:
        return None
    needed = ffi.offsetof("PJRT_Profiler_Extension", "profiler_api") + ffi.sizeof("void*")
    if extension.struct_size < needed:
        return (f"its profiler extension is {extension.struct_size} bytes, older than the "
                f"version pjrt reads ({needed} bytes or more)")
    table = ffi.cast("PJRT_Profiler_Extension *", extension).profiler_api
    if table == _NULL:
        return "its profiler extension has no profiler table"
    if table.struct_size < struct_size("PLUGIN_Profiler_Api"):
        return (f"its profiler table is {table.struct_size} bytes, smaller than the "
                f"{struct_size('PLUGIN_Profiler_Api')} bytes that reach collect_data")
    if _NULL in (table.error_destroy, table.error_message, table.error_get_code, table.create,
                 table.destroy, table.start, table.stop, table.collect_data):
        return "its profiler table leaves entries empty"
    return ProfilerTable(api.plugin_name, table)
