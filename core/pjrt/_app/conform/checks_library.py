"""Checks of the library and its function table: before any client exists."""
from __future__ import annotations

from ..._capi import api as _c
from ..._loading import elf as _elf
from ..._pjrt_cffi import ffi, lib
from ...plugin import LOAD_REQUIRED_FUNCTIONS
from ._registry import LOADED, CheckFailed, Skip, check

#: Entries without which a host cannot drive a plugin at all: what pjrt requires at load
#: (errors, a client, its devices, buffers and events), and initialising the plugin, putting
#: values on it, compiling and running.
CORE_FUNCTIONS = LOAD_REQUIRED_FUNCTIONS + (
    "PJRT_Plugin_Initialize", "PJRT_Client_BufferFromHostBuffer", "PJRT_Client_Compile",
    "PJRT_LoadedExecutable_Execute", "PJRT_LoadedExecutable_Destroy",
)

_EXTENSION_NAMES = {getattr(lib, name): name[len("PJRT_Extension_Type_"):]
                    for name in dir(lib) if name.startswith("PJRT_Extension_Type_")}


def table_functions() -> list[str]:
    """Every function entry of our header's PJRT_Api, in table order."""
    return [name for name, field in ffi.typeof("PJRT_Api").fields
            if field.type.kind == "function"]


@check("library.elf", needs=())
def elf(ctx):
    """The file is an ELF shared library for this machine that defines GetPjrtApi as code."""
    _elf.check_plugin_library(ctx.library, ctx.name)
    return "a shared library for this machine exporting GetPjrtApi as a function"


@check(LOADED, needs=("library.elf",))
def get_pjrt_api(ctx):
    """dlopen succeeds and GetPjrtApi returns a readable PJRT_Api table."""
    plugin = ctx.plugin
    major, minor = plugin.api_version
    ctx.info["api_version"] = f"{major}.{minor}"
    ctx.info["host_api_version"] = "%d.%d" % _c.HEADER_VERSION
    return f"PJRT_Api of {int(plugin.api.table.struct_size)} bytes, API {major}.{minor}"


@check("api.version", needs=(LOADED,))
def version(ctx):
    """The API version the plugin reports is one this host can speak."""
    major, minor = ctx.plugin.api_version
    host_major, host_minor = _c.HEADER_VERSION
    if major != host_major:
        raise CheckFailed(f"plugin speaks PJRT API {major}.{minor}; this host speaks major "
                          f"version {host_major} only")
    if minor < _c.MIN_SUPPORTED_MINOR:
        raise CheckFailed(f"plugin speaks PJRT API {major}.{minor}, older than "
                          f"{host_major}.{_c.MIN_SUPPORTED_MINOR}, whose table layout differs")
    relation = ("the same as the host's" if minor == host_minor else
                f"older than the host's {host_major}.{host_minor} (the host reads only the "
                f"plugin's prefix of each struct)" if minor < host_minor else
                f"newer than the host's {host_major}.{host_minor} (the plugin sees the host's "
                f"smaller struct sizes)")
    return f"{major}.{minor}, {relation}"


@check("api.struct_size", needs=(LOADED,))
def struct_sizes(ctx):
    """PJRT_Api and PJRT_Api_Version carry struct sizes consistent with the reported version."""
    table = ctx.api.table
    size = int(table.struct_size)
    version_size = int(table.pjrt_api_version.struct_size)
    ours = _c.struct_size("PJRT_Api")
    problems = []
    if version_size != _c.struct_size("PJRT_Api_Version"):
        problems.append(f"PJRT_Api_Version.struct_size is {version_size}, PJRT defines "
                        f"{_c.struct_size('PJRT_Api_Version')}")
    if size % ffi.sizeof("void *"):
        problems.append(f"PJRT_Api.struct_size {size} is not a whole number of entries")
    first = ffi.offsetof("PJRT_Api", "PJRT_Error_Destroy")
    if size <= first:
        problems.append(f"PJRT_Api.struct_size {size} leaves no room for any function")
    minor = ctx.plugin.api_version[1]
    host_minor = _c.HEADER_VERSION[1]
    if minor == host_minor and size != ours:
        problems.append(f"PJRT_Api.struct_size is {size} at the host's own version "
                        f"0.{minor}, where the table is {ours} bytes")
    if minor < host_minor and size > ours:
        problems.append(f"PJRT_Api.struct_size {size} is larger than the newer header's {ours}")
    if minor > host_minor and size < ours:
        problems.append(f"PJRT_Api.struct_size {size} is smaller than the older header's {ours}")
    if problems:
        raise CheckFailed("; ".join(problems))
    entries = (size - first) // ffi.sizeof("void *")
    return f"PJRT_Api {size} bytes ({entries} entries), PJRT_Api_Version {version_size} bytes"


@check("api.function_table", needs=(LOADED,))
def function_table(ctx):
    """Every function a host needs is set, and lists which of the rest are."""
    api = ctx.api
    size = int(api.table.struct_size)
    within = [name for name in table_functions()
              if ffi.offsetof("PJRT_Api", name) + ffi.sizeof("void *") <= size]
    present = [name for name in within if api.has(name)]
    absent = [name for name in within if name not in present]
    ctx.info["functions"] = f"{len(present)} of {len(within)} entries in the table are set"
    missing = [name for name in CORE_FUNCTIONS if name not in present]
    if missing:
        raise CheckFailed(f"missing entries a host needs: {', '.join(missing)}")
    short = ", ".join(name.removeprefix("PJRT_") for name in absent[:12])
    more = f" and {len(absent) - 12} more" if len(absent) > 12 else ""
    return (f"{len(present)} of {len(within)} entries set" +
            (f"; not set: {short}{more}" if absent else ""))


@check("plugin.initialize", needs=(LOADED,))
def initialize(ctx):
    """PJRT_Plugin_Initialize succeeds."""
    if not ctx.api.has("PJRT_Plugin_Initialize"):
        raise Skip("the plugin has no PJRT_Plugin_Initialize")
    ctx.plugin.initialize()
    return "initialized"


@check("plugin.attributes", needs=(LOADED,))
def attributes(ctx):
    """PJRT_Plugin_Attributes returns well-formed named values."""
    if not ctx.api.has("PJRT_Plugin_Attributes"):
        raise Skip("the plugin has no PJRT_Plugin_Attributes (added in API 0.40)")
    found = ctx.plugin.attributes()
    if not isinstance(found, dict):
        raise CheckFailed(f"attributes read as {type(found).__name__}")
    shown = ", ".join(f"{key}={value}" for key, value in sorted(found.items())[:6])
    return f"{len(found)} attributes" + (f": {shown}" if shown else "")


@check("extensions.list", needs=(LOADED,))
def extension_chain(ctx):
    """The extension chain ends, and each extension has a known type and a struct size."""
    chain = _c.extensions(ctx.api)
    if len(chain) >= 256:
        raise CheckFailed("the extension chain does not end within 256 links (a cycle?)")
    names, problems = [], []
    base = _c.struct_size("PJRT_Extension_Base")
    for extension in chain:
        kind = int(extension.type)
        name = _EXTENSION_NAMES.get(kind, f"type {kind}")
        names.append(name)
        if int(extension.struct_size) < base:
            problems.append(f"{name} has struct_size {int(extension.struct_size)}, less than "
                            f"the {base} bytes of its header")
    ctx.info["extensions"] = ", ".join(names) or "none"
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(names)}: {', '.join(names)}" if names else "the plugin offers no extensions"
