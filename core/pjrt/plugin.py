"""Loading PJRT plugin libraries and initialising them.

A plugin is a shared library exporting ``GetPjrtApi()``. Loading it gives a [`Plugin`][pjrt.plugin.Plugin]
(its function table and version); initialising it calls ``PJRT_Plugin_Initialize`` once.
Both steps are recorded in a [`PluginTable`][pjrt.plugin.PluginTable] so that a plugin is loaded and initialised
at most once per process, whoever asks. The module-level functions use one default table and
keep jaxlib's names.

How much plugins may print while they are loaded and their clients made is set by
``PJRT_LOG_LEVEL`` or [`set_log_level`][pjrt.plugin.set_log_level]; what they printed meanwhile
and was kept back is [`plugin_logs`][pjrt.plugin.plugin_logs] (see the operators' guide,
"Logging").
"""
from __future__ import annotations

import logging
import os
import re
import threading

from ._loading import plugin_logging
# How loud plugins are: the public names of ``_loading.plugin_logging``, re-exported here.
from ._loading.plugin_logging import (LOG_LEVEL_ENV as LOG_LEVEL_ENV, LOG_LEVELS as LOG_LEVELS,
                                      plugin_logs as plugin_logs, set_log_level as set_log_level)
from ._capi import api as _c
from ._capi.python_api import capsule_pointer
from ._loading import elf as _elf
from ._loading import library_search as _library_search
from ._loading import vendor_quirks
from ._pjrt_cffi import ffi, lib
from .errors import PluginLoadError
from ._capi.options import named_values_to_dict

logger = logging.getLogger(__name__)

_MISSING_DEPENDENCY = re.compile(r"^(?P<lib>[^:\s]+): cannot open shared object file")
_UNDEFINED_SYMBOL = re.compile(r"undefined symbol: (?P<symbol>\S+)")

#: What the error boundary (pjrt.errors.consume) calls on every returned PJRT_Error: without
#: these the first error cannot even be reported.
ERROR_FUNCTIONS = ("PJRT_Error_Destroy", "PJRT_Error_Message", "PJRT_Error_GetCode")
#: What every client calls, whatever it is used for: creating and destroying it, and the
#: queries its constructor makes.
CLIENT_FUNCTIONS = (
    "PJRT_Client_Create", "PJRT_Client_Destroy", "PJRT_Client_PlatformName",
    "PJRT_Client_PlatformVersion", "PJRT_Client_ProcessIndex", "PJRT_Client_Devices",
    "PJRT_Client_AddressableDevices",
)
#: The buffer and event functions the C helpers call without looking them up
#: (`make_c_api_client` checks them again, as `pjrt.client.REQUIRED_FUNCTIONS`).
HELPER_FUNCTIONS = (
    "PJRT_Buffer_Destroy", "PJRT_Buffer_ToHostBuffer", "PJRT_Buffer_ReadyEvent",
    "PJRT_Event_Await", "PJRT_Event_Destroy", "PJRT_Event_IsReady",
)
#: Entries a plugin must have at load: the one list of what pjrt requires (the client and
#: ``pjrt conform`` take theirs from here). Finding them missing at load names them all at
#: once, instead of one at a time, later, or never (a NULL entry called is a crash).
LOAD_REQUIRED_FUNCTIONS = ERROR_FUNCTIONS + CLIENT_FUNCTIONS + HELPER_FUNCTIONS

#: Minor versions grow by one per change to the C API (0.117 in 2026); a value this large,
#: or a negative one, means the table is not a PJRT_Api at all.
_MAX_SANE_MINOR = 100_000


class Plugin:
    """A loaded PJRT plugin.

    Attributes:
      name: the name it was loaded under (e.g. ``"cpu"``).
      library_path: where it was loaded from, or None for a table handed over in memory.
      api: its `pjrt._capi.api.Api`.
      option_types: create options the plugin declares, with the value type each takes;
        ``make_c_api_client`` checks them before calling the plugin.
    """

    def __init__(self, name: str, api: _c.Api, library_path: str | None):
        self.name = name
        self.api = api
        self.library_path = library_path
        self._initialized = False
        self._init_lock = threading.Lock()
        self._attributes: dict | None = None
        self.option_types: dict[str, type] = {}

    @property
    def api_version(self) -> tuple[int, int]:
        """``(major, minor)`` PJRT C API version the plugin reports."""
        return self.api.version

    @property
    def initialized(self) -> bool:
        return self._initialized

    def initialize(self) -> None:
        """Call the plugin's ``PJRT_Plugin_Initialize`` (once; later calls do nothing)."""
        with self._init_lock:
            if self._initialized:
                return
            vendor_quirks.prepare(self)  # the library's own switches, before it starts
            if self.api.has("PJRT_Plugin_Initialize"):
                self.api.call("PJRT_Plugin_Initialize", self.api.new_args("PJRT_Plugin_Initialize_Args"))
            self._initialized = True

    def attributes(self) -> dict:
        """The plugin's attributes (``PJRT_Plugin_Attributes``), e.g. StableHLO versions.

        Values are str, int, float, bool or a list of ints. Empty when the plugin has none.
        """
        if self._attributes is None:
            if not self.api.has("PJRT_Plugin_Attributes"):
                self._attributes = {}
            else:
                args = self.api.call_new("PJRT_Plugin_Attributes")
                self._attributes = named_values_to_dict(args.attributes, args.num_attributes)
        return dict(self._attributes)

    def __repr__(self) -> str:
        major, minor = self.api_version
        where = self.library_path or "in-memory table"
        return f"Plugin(name={self.name!r}, api_version={major}.{minor}, path={where!r})"


def _load_error(name: str, path: str, status: int, reason: str) -> PluginLoadError:
    """A message for a failed load that says what is wrong and what to do."""
    if status == lib.PJRT_SHIM_LOAD_NO_SYMBOL:
        return PluginLoadError(
            f"{path} is a shared library but does not export GetPjrtApi, so it is not a PJRT "
            f"plugin; check the path given for plugin {name!r}", path=path)
    if status == lib.PJRT_SHIM_LOAD_NULL_API:
        return PluginLoadError(
            f"GetPjrtApi() in {path} returned NULL: plugin {name!r} refused to start", path=path)
    undefined = _UNDEFINED_SYMBOL.search(reason)
    if undefined:
        symbol = undefined.group("symbol")
        return PluginLoadError(
            f"plugin {name!r} at {path} needs the symbol {symbol}, which neither it nor the "
            f"libraries it depends on define, so it cannot run: it was built against other "
            f"versions of its libraries. Reinstall the plugin, or install the library version "
            f"it was built for. The loader said: {reason}", path=path)
    missing = _MISSING_DEPENDENCY.match(reason)
    if missing and os.path.basename(missing.group("lib")) != os.path.basename(path):
        return _missing_dependencies_error(name, path, missing.group("lib"), reason)
    return PluginLoadError(
        f"{path} could not be loaded as a shared library for plugin {name!r}: {reason}", path=path)


def _missing_dependencies_error(name: str, path: str, dependency: str,
                                reason: str) -> PluginLoadError:
    """The loader stops at the first library it misses; name every one it would miss, with
    what provides each, so that one round of installing fixes them all."""
    every = _library_search.missing_libraries(path)
    if not any(library.name == dependency for library in every):
        # The walk disagrees with the loader (the file changed, or a search rule not
        # modelled): the loader's own answer is the one to trust.
        every.insert(0, _library_search.MissingLibrary(dependency, path))
    count = f"{len(every)} libraries" if len(every) > 1 else "a library"
    return PluginLoadError(
        f"plugin {name!r} at {path} cannot be loaded: it needs {count} that the dynamic "
        f"loader cannot find (searched its RPATH/RUNPATH, LD_LIBRARY_PATH, the loader's cache "
        f"and the standard directories):\n{_library_search.format_missing(every)}\n"
        f"To fix it, install what provides them, or add the directories that hold them to "
        f"LD_LIBRARY_PATH, and try again (libraries these need in turn are checked once they "
        f"are found). The loader said: {reason}",
        path=path, missing_libraries=tuple(every))


def load_library(name: str, library_path: str | os.PathLike) -> Plugin:
    """Open a plugin library and read its API table, without recording it anywhere.

    The file is checked before it is opened (see `pjrt._loading.elf`), it is opened with every
    symbol bound at once, and the table ``GetPjrtApi`` returns is checked before it is used
    (see `_checked_plugin`): a broken plugin is an exception, not a crashed process.

    Raises:
      PluginLoadError: the file is missing, not a shared library for this machine, truncated,
        lacks ``GetPjrtApi`` (or has it as data), needs a library or a symbol that is not
        installed, returns a table that is not mapped or lacks required functions, or
        reports a PJRT API version this pjrt cannot drive.
    """
    path = os.fspath(library_path)
    if not path.strip():
        raise PluginLoadError(f"plugin {name!r}: the library path is empty; give the path of "
                              f"the plugin's shared library (its .so file)", path=path)
    if not os.path.exists(path):
        raise PluginLoadError(f"plugin {name!r}: no file at {path}", path=path)
    if os.path.isdir(path):
        raise PluginLoadError(f"plugin {name!r}: {path} is a directory, not a shared library",
                              path=path)
    _elf.check_plugin_library(path, name)
    api_out = ffi.new("const PJRT_Api **")
    message = ffi.new("char[]", 4096)
    status = lib.pjrt_shim_load(os.fsencode(path), api_out, message, len(message))
    if status != lib.PJRT_SHIM_LOAD_OK:
        raise _load_error(name, path, status, ffi.string(message).decode("utf-8", "replace"))
    return _require_load_functions(_checked_plugin(name, api_out[0], path))


def plugin_from_c_api(name: str, c_api) -> Plugin:
    """Wrap a ``PJRT_Api*`` handed over in memory (a PyCapsule, an int address, or cdata).

    The table is checked as [`load_library`][pjrt.plugin.load_library] checks a library's (readable memory behind
    its struct_size, a version pjrt drives), except for LOAD_REQUIRED_FUNCTIONS, which
    registering it ([`load_pjrt_plugin_with_c_api`][pjrt.plugin.load_pjrt_plugin_with_c_api]) checks: a bare table is enough
    for reading its extensions.

    Raises:
      TypeError: ``c_api`` is of another type.
      PluginLoadError: the pointer is NULL, or the table fails a check.
    """
    if isinstance(c_api, int):
        table = lib.pjrt_shim_api_from_address(c_api)
    elif isinstance(c_api, ffi.CData):
        table = ffi.cast("const PJRT_Api *", c_api)
    elif type(c_api).__name__ == "PyCapsule":
        # Through pjrt._capi.python_api's own view of PyCapsule_GetPointer: the function
        # objects of ctypes.pythonapi are shared with the whole process.
        table = lib.pjrt_shim_api_from_address(capsule_pointer(c_api, None))
    else:
        raise TypeError(f"c_api for plugin {name!r} must be a PyCapsule, an int address or a "
                        f"cffi pointer, not {type(c_api).__name__}")
    if table == ffi.NULL:
        raise PluginLoadError(f"c_api for plugin {name!r} is a NULL pointer")
    return _checked_plugin(name, table, None)


def _readable_end(address: int) -> int | None:
    """The end of the readable memory that ``address`` lies in, merging adjacent readable
    mappings (a table may straddle a library's read-only and writable data); 0 when
    ``address`` is not readable; None where ``/proc/self/maps`` cannot tell."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            text = maps.read()
    except OSError:
        return None
    run_start = run_end = None
    for line in text.splitlines():  # in address order
        span, _, rest = line.partition(b" ")
        low, _, high = span.partition(b"-")
        start, end = int(low, 16), int(high, 16)
        readable = rest[:1] == b"r"
        if readable and run_end == start:
            run_end = end
            continue
        # (run_start and run_end are set together)
        if run_start is not None and run_start <= address < run_end:  # pyright: ignore
            return run_end
        if start > address:
            return 0
        run_start, run_end = (start, end) if readable else (None, None)
    if run_start is not None and run_start <= address < run_end:  # pyright: ignore
        return run_end
    return 0


def _check_table_memory(name: str, table, where: str, path: str | None) -> None:
    """Check that the ``PJRT_Api`` at ``table`` lies in readable memory, all ``struct_size``
    bytes of it, and is at least as long as the fields always read.

    pjrt reads any entry the table's struct_size claims; a struct_size larger than the memory
    behind it sends those reads into unmapped memory (a crash), so it is checked once here.
    """
    address = int(ffi.cast("uintptr_t", table))
    header = ffi.sizeof("size_t")
    end = _readable_end(address)
    if end is not None and end < address + header:
        raise PluginLoadError(
            f"plugin {name!r} ({where}): its PJRT_Api table at {address:#x} is not in readable "
            f"memory, so it is not a PJRT_Api; {_remedy(path)}", path=path)
    size = int(table.struct_size)
    minimum = _c.struct_size("PJRT_Api_Version") + ffi.offsetof("PJRT_Api", "pjrt_api_version")
    if size < minimum:
        raise PluginLoadError(
            f"plugin {name!r} ({where}): its PJRT_Api table claims a struct_size of {size} "
            f"bytes, too short to hold even the API version ({minimum} bytes); "
            f"{_remedy(path)}", path=path)
    if end is not None and address + size > end:
        raise PluginLoadError(
            f"plugin {name!r} ({where}): its PJRT_Api table claims a struct_size of {size} "
            f"bytes, but only {end - address} bytes from its start at {address:#x} are mapped "
            f"readable memory, so the table is corrupt; {_remedy(path)}", path=path)


def _remedy(path: str | None) -> str:
    """What to do about a corrupt table: from a library file, or handed over in memory."""
    if path is None:
        return "check that the pointer handed over is the one GetPjrtApi() returned"
    return "the plugin library is broken: reinstall it or use another build"


def _checked_plugin(name: str, table, path: str | None) -> Plugin:
    """Wrap ``table`` as a [`Plugin`][pjrt.plugin.Plugin] once it has readable memory behind its struct_size
    and reports a version this pjrt drives."""
    where = path or "the given table"
    _check_table_memory(name, table, where, path)
    api = _c.Api(table, name)
    major, minor = api.version
    header_major, header_minor = _c.HEADER_VERSION
    if major < 0 or not 0 <= minor < _MAX_SANE_MINOR:
        raise PluginLoadError(
            f"plugin {name!r} ({where}) reports PJRT API version {major}.{minor}, which no "
            f"plugin has: its table is corrupt; {_remedy(path)}", path=path)
    if major != header_major:
        raise PluginLoadError(
            f"plugin {name!r} ({where}) reports PJRT API {major}.{minor}; this pjrt speaks major "
            f"version {header_major} (header {header_major}.{header_minor}). Install a plugin "
            f"built for PJRT API {header_major}.x.", path=path)
    if minor < _c.MIN_SUPPORTED_MINOR:
        raise PluginLoadError(
            f"plugin {name!r} ({where}) reports PJRT API {major}.{minor}, older than "
            f"{header_major}.{_c.MIN_SUPPORTED_MINOR}, the oldest this pjrt can drive; install a "
            f"newer build of the plugin.", path=path)
    if minor > header_minor:
        logger.debug("plugin %r reports PJRT API %d.%d, newer than our header %d.%d; "
                     "functions added since are not used", name, major, minor, header_major,
                     header_minor)
    return Plugin(name, api, path)


def _require_load_functions(plugin: Plugin) -> Plugin:
    """``plugin`` if it has every entry of LOAD_REQUIRED_FUNCTIONS; else a PluginLoadError
    naming each missing one."""
    api = plugin.api
    missing = [function for function in LOAD_REQUIRED_FUNCTIONS if not api.has(function)]
    if missing:
        major, minor = api.version
        where = plugin.library_path or "the given table"
        raise PluginLoadError(
            f"plugin {plugin.name!r} ({where}, PJRT API {major}.{minor}) does not provide "
            f"{', '.join(missing)}, which pjrt needs to report its errors and to run any "
            f"client; the plugin is incomplete: use a complete build of it",
            path=plugin.library_path)
    return plugin


#: Callables run with each [`Plugin`][pjrt.plugin.Plugin] just loaded into a [`PluginTable`][pjrt.plugin.PluginTable] (and with
#: each new [`Client`][pjrt.client.Client], through ``client_created_hooks``). Other modules add
#: themselves here instead of being imported by this one: pjrt.ffi uses them to hand pending
#: custom-call registrations to plugins as they appear. A failing hook is logged, never raised,
#: so that an optional feature cannot stop a plugin from loading.
plugin_load_hooks: list = []
client_created_hooks: list = []


def _run_hooks(hooks: list, subject) -> None:
    for hook in list(hooks):
        try:
            hook(subject)
        except Exception:  # noqa: BLE001 - see plugin_load_hooks
            logger.warning("hook %r failed for %r", hook, subject, exc_info=True)


def notify_client_created(client) -> None:
    """Run ``client_created_hooks`` for a client ``make_c_api_client`` just made."""
    _run_hooks(client_created_hooks, client)


class PluginTable:
    """The plugins loaded in this process, by name, each loaded at most once."""

    def __init__(self):
        self._lock = threading.RLock()
        self._plugins: dict[str, Plugin] = {}

    def load(self, name: str, library_path: str | os.PathLike) -> Plugin:
        """Load ``library_path`` as plugin ``name``; loading the same name again returns it.

        Raises:
          ValueError: ``name`` is already loaded from a different library.
          PluginLoadError: see [`load_library`][pjrt.plugin.load_library].
        """
        path = os.fspath(library_path)
        with self._lock:
            existing = self._plugins.get(name)
            if existing is not None:
                if existing.library_path is not None and os.path.realpath(
                        existing.library_path) != os.path.realpath(path):
                    raise ValueError(
                        f"plugin {name!r} is already loaded from {existing.library_path}, so "
                        f"{path} cannot be loaded under the same name; load one of them under "
                        f"another name")
                return existing
            plugin_logging.apply_defaults()  # plugins read their log switches when loaded
            printed: list[str] = []
            try:
                with plugin_logging.quietly(name, printed):
                    plugin = load_library(name, path)
            except PluginLoadError as error:
                if printed:  # kept back from stderr, but the plugin's last words explain it
                    words = " | ".join(line.strip() for line in "".join(printed).splitlines()
                                       if line.strip())
                    raise PluginLoadError(
                        f"{error}; the plugin printed: {words}",
                        path=error.path, missing_libraries=error.missing_libraries,
                        missing_library=error.missing_library) from error
                raise
            self._plugins[name] = plugin
        _run_hooks(plugin_load_hooks, plugin)
        return plugin

    def add_c_api(self, name: str, c_api) -> Plugin:
        """Record a plugin whose ``PJRT_Api*`` is already in memory."""
        with self._lock:
            if name in self._plugins:
                raise ValueError(f"plugin {name!r} is already loaded")
            plugin = _require_load_functions(plugin_from_c_api(name, c_api))
            self._plugins[name] = plugin
        _run_hooks(plugin_load_hooks, plugin)
        return plugin

    def get(self, name: str) -> Plugin:
        """The plugin loaded as ``name``; KeyError (naming the loaded ones) otherwise."""
        with self._lock:
            try:
                return self._plugins[name]
            except KeyError:
                loaded = ", ".join(sorted(self._plugins)) or "none"
                raise KeyError(f"no PJRT plugin named {name!r} is loaded (loaded: {loaded}); "
                               f"call load_pjrt_plugin_dynamically first") from None

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._plugins

    def names(self) -> list[str]:
        with self._lock:
            return list(self._plugins)


default_plugins = PluginTable()


def load_pjrt_plugin_dynamically(plugin_name: str, library_path: str | os.PathLike) -> Plugin:
    """Load the PJRT plugin at ``library_path`` under ``plugin_name`` (once per name)."""
    return default_plugins.load(plugin_name, library_path)


def load_pjrt_plugin_with_c_api(plugin_name: str, c_api) -> Plugin:
    """Register a plugin from a ``PJRT_Api*`` given as a PyCapsule, int address or cffi cdata."""
    return default_plugins.add_c_api(plugin_name, c_api)


def pjrt_plugin_loaded(plugin_name: str) -> bool:
    """Whether a plugin named ``plugin_name`` has been loaded."""
    return plugin_name in default_plugins


def initialize_pjrt_plugin(plugin_name: str) -> None:
    """Initialise the loaded plugin ``plugin_name`` (``PJRT_Plugin_Initialize``, once)."""
    default_plugins.get(plugin_name).initialize()


def pjrt_plugin_initialized(plugin_name: str) -> bool:
    """Whether the loaded plugin ``plugin_name`` has been initialised."""
    return plugin_name in default_plugins and default_plugins.get(plugin_name).initialized


def plugin_of_c_api(c_api) -> Plugin:
    """The `Plugin` that ``c_api`` is (jaxlib's functions take a plugin as its ``PJRT_Api*``):
    ``c_api`` itself when it is a `Plugin`; for a ``PJRT_Api*`` (a PyCapsule, an int address
    or cffi cdata), the first loaded plugin with that table (a library loaded under two names
    has one table), or a bare `Plugin` around it when none is loaded.

    Raises:
      TypeError: ``c_api`` is of another type.
      PluginLoadError: the pointer is NULL, or the table fails a check.
    """
    if isinstance(c_api, Plugin):
        return c_api
    bare = plugin_from_c_api("c_api", c_api)
    for name in default_plugins.names():
        loaded = default_plugins.get(name)
        if loaded.api.table == bare.api.table:
            return loaded
    return bare


def get_plugin(plugin_name: str) -> Plugin:
    """The loaded [`Plugin`][pjrt.plugin.Plugin] named ``plugin_name``."""
    return default_plugins.get(plugin_name)
