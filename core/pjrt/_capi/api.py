"""Access to a plugin's PJRT C API table: the only module that knows how calls are made.

cffi's ``ffi`` and ``lib`` come from the compiled ``pjrt._pjrt_cffi`` extension (see
``_build_cffi.py``). `Api` wraps one plugin's ``PJRT_Api*`` and decides, once, what the
plugin can do:

* PJRT grows by appending. A plugin built against an older header has a shorter function
  table; `Api.has` reads ``PJRT_Api.struct_size`` before touching an entry, and
  `Api.require` turns a missing entry into [`UnsupportedFeatureError`][pjrt.errors.UnsupportedFeatureError].
* Every args struct is made by `Api.new_args`: zero-filled, with ``struct_size`` set to
  what this side knows. A plugin that knows less reads only its prefix of the struct; one that
  knows more sees our size and leaves the newer fields alone.
"""
from __future__ import annotations

import functools

from .._pjrt_cffi import ffi, lib
from ..errors import UnsupportedFeatureError, check

#: The PJRT C API version of our header.
HEADER_VERSION: tuple[int, int] = (lib.PJRT_API_MAJOR, lib.PJRT_API_MINOR)

#: The oldest minor version whose struct layouts are a prefix of ours. Before 0.57 the
#: function table was rearranged, so older plugins cannot be driven through this header.
MIN_SUPPORTED_MINOR = 57


@functools.lru_cache(maxsize=None)
def struct_size(struct_name: str) -> int:
    """Bytes up to the end of the last field of ``struct_name``, as PJRT defines struct sizes."""
    fields = ffi.typeof(struct_name).fields
    _, last = fields[-1]
    return last.offset + ffi.sizeof(last.type)


@functools.lru_cache(maxsize=None)
def _table_offset(function: str) -> int:
    return ffi.offsetof("PJRT_Api", function)


def to_str(pointer, size: int) -> str:
    """Decode a (pointer, size) string the plugin returned; NULL reads as ''."""
    if pointer == ffi.NULL or size == 0:
        return ""
    return ffi.unpack(pointer, size).decode("utf-8", errors="replace")


#: Longest extension chain we walk; a longer one is taken to be a cycle in a broken plugin.
_MAX_EXTENSIONS = 256


def find_extension(api: "Api", extension_type: int):
    """The first extension of ``extension_type`` (a ``PJRT_Extension_Type``) in the plugin's
    ``extension_start`` chain, as a ``PJRT_Extension_Base*``; None when the plugin has none.

    Callers cast the result to the extension's own struct after checking its ``struct_size``.
    """
    for extension in extensions(api):
        if extension.type == extension_type:
            return extension
    return None


def extensions(api: "Api") -> list:
    """Every ``PJRT_Extension_Base*`` in the plugin's chain, in order (for lookups and messages)."""
    found = []
    extension = api.table.extension_start
    while extension != ffi.NULL and len(found) < _MAX_EXTENSIONS:
        found.append(extension)
        extension = extension.next
    return found


class Api:
    """One plugin's PJRT function table and the version it reports.

    Attributes:
      table: the ``const PJRT_Api*`` cdata.
      plugin_name: the name the plugin was registered under (for messages).
      version: ``(major, minor)`` as the plugin reports it.
    """

    __slots__ = ("table", "plugin_name", "version", "_present", "__weakref__")

    def __init__(self, table, plugin_name: str):
        self.table = table
        self.plugin_name = plugin_name
        reported = table.pjrt_api_version
        self.version = (int(reported.major_version), int(reported.minor_version))
        self._present: dict[str, bool] = {}

    def has(self, function: str) -> bool:
        """Whether the plugin's table has ``function`` (e.g. ``"PJRT_Client_Load"``) set."""
        present = self._present.get(function)
        if present is None:
            present = bool(lib.pjrt_shim_has_entry(self.table, _table_offset(function)))
            self._present[function] = present
        return present

    def require(self, function: str, why: str = ""):
        """The cdata function pointer for ``function``; raises if the plugin lacks it."""
        if not self.has(function):
            raise UnsupportedFeatureError(function, self.plugin_name, self.version,
                                          HEADER_VERSION, why=why)
        return getattr(self.table, function)

    @staticmethod
    def new_args(struct_name: str):
        """A zero-filled ``struct_name*`` with ``struct_size`` set to what this side knows."""
        args = ffi.new(struct_name + " *")
        args.struct_size = struct_size(struct_name)
        return args

    def call(self, function: str, args) -> None:
        """Call ``function`` with ``args``; a returned error is raised (and freed)."""
        check(self, self.require(function)(args))

    def call_new(self, function: str, **fields):
        """Build ``<function>_Args`` from ``fields``, call ``function``, return the args."""
        args = self.new_args(function + "_Args")
        for name, value in fields.items():
            setattr(args, name, value)
        self.call(function, args)
        return args
