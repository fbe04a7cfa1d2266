"""What a plugin package uses from pjrt: one declaration that pjrt and JAX both discover.

A plugin package is a pip package that ships (or finds) a PJRT plugin library and advertises a
module in the ``jax_plugins`` entry-point group. Both pjrt and JAX import that module and call
its ``initialize()``. The package describes its plugin once, as a [`PluginDeclaration`][pjrt.plugin_api.PluginDeclaration],
and hands the call to it::

    from pjrt import plugin_api

    PLUGIN = plugin_api.PluginDeclaration(
        "myaccel", library=library_path, priority=400, options=client_options,
        version=__version__)

    def initialize():
        PLUGIN.initialize()

[`PluginDeclaration.initialize`][pjrt.plugin_api.PluginDeclaration.initialize] finds out which host is calling. Under pjrt's discovery it
registers the library with the registry that is discovering (a missing library, a library
that cannot be loaded or a package that does not match the core is recorded as the backend's
reason). Under JAX it registers the same library, priority and options with JAX's own
registry, so one package serves both; a package whose platform JAX already serves another way
says ``serve_jax=False`` and is left out there. Called by anyone else, it does nothing.

Besides the declaration, this module gathers what plugin packages need from the core, so that
they depend on one module: loading a library or a PyCapsule, creating a client or a topology
of a loaded plugin, registering factories directly, registering custom-call handlers (and
deferring their costly set-up), the version check and the library finder.
See docs/vendors.md.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from ._version import __version__ as core_version
from . import plugin
from ._loading.library_search import format_missing
from .errors import PluginLoadError
# The default-backend priorities, re-exported for plugin packages (their one home is
# pjrt._loading.platforms, beside the platform names).
from ._loading.platforms import (DEFAULT_PLUGIN_PRIORITY as DEFAULT_PLUGIN_PRIORITY,
                                 PLATFORM_PRIORITIES as PLATFORM_PRIORITIES)
from .plugin import Plugin
from .plugin_support import (GpuKernels, check_plugin_version, find_installed_wheel,
                             find_module_library)

if TYPE_CHECKING:
    from .client import Client
    from .topology import DeviceTopology

# The registry, discovery, clients and topologies are imported when first used, not here: a
# plugin package imports this module when it is imported, and ``import pjrt_cpu`` followed
# by a client of its library must stay as quick as the core alone.

logger = logging.getLogger(__name__)

__all__ = ["PluginDeclaration", "Plugin", "PluginLoadError", "Client", "DeviceTopology",
           "discovering", "register_plugin", "register_backend_factory", "register_unavailable",
           "GpuKernels", "check_plugin_version", "find_installed_wheel", "find_module_library",
           "load_plugin", "load_pjrt_plugin_with_c_api", "create_client", "make_topology",
           "register_custom_call_target", "register_target_preparation", "jax_is_calling",
           "PLATFORM_PRIORITIES", "DEFAULT_PLUGIN_PRIORITY"]

#: Where JAX keeps its backend registry; JAX's own discovery runs from there.
JAX_BRIDGE_MODULE = "jax._src.xla_bridge"

def discovering() -> bool:
    """True while pjrt's discovery is calling plugin modules' ``initialize()``."""
    from ._registry import discovery

    return discovery.discovering()


def register_plugin(*args: Any, **kwargs: Any) -> Plugin | None:
    """Load a plugin library and register it as a backend (see
    [`pjrt.registry.register_plugin`][pjrt.registry.register_plugin])."""
    from . import registry

    return registry.register_plugin(*args, **kwargs)


def register_backend_factory(*args: Any, **kwargs: Any) -> None:
    """Register a backend factory (see [`pjrt.registry.register_backend_factory`][pjrt.registry.register_backend_factory])."""
    from . import registry

    registry.register_backend_factory(*args, **kwargs)


def register_unavailable(*args: Any, **kwargs: Any) -> None:
    """Record that a backend cannot come up, and why (see
    [`pjrt.registry.register_unavailable`][pjrt.registry.register_unavailable])."""
    from . import registry

    registry.register_unavailable(*args, **kwargs)


def register_custom_call_target(name: str, fn: Any, platform: str = "cpu",
                                api_version: int = 1, traits: int = 0) -> None:
    """Register a custom-call handler that programs on ``platform`` may call, for every
    plugin serving it now or later (see
    [`pjrt.ffi.register_custom_call_target`][pjrt.ffi.register_custom_call_target], which
    this calls; ``traits`` are ``pjrt.ffi.CustomCallTargetTraits`` bits)."""
    from . import ffi  # numpy and the FFI machinery: only when a package registers kernels

    ffi.register_custom_call_target(name, fn, platform=platform, api_version=api_version,
                                    traits=traits)


def register_target_preparation(targets: Iterable[str], prepare: Callable[[], object],
                                platform: str = "cpu") -> None:
    """Run ``prepare()`` once, before the first program calling one of ``targets`` on
    ``platform`` is compiled: for handlers whose set-up is costly and most programs never
    need (see [`pjrt.ffi.register_target_preparation`][pjrt.ffi.register_target_preparation],
    which this calls)."""
    from . import ffi

    ffi.register_target_preparation(targets, prepare, platform=platform)


def __getattr__(name: str) -> Any:
    # Client and DeviceTopology, for plugin packages' annotations, without importing them here.
    if name == "Client":
        from .client import Client
        return Client
    if name == "DeviceTopology":
        from .topology import DeviceTopology
        return DeviceTopology
    raise AttributeError(f"module 'pjrt.plugin_api' has no attribute {name!r}")


def load_plugin(platform: str, library_path: str | os.PathLike) -> Plugin:
    """Load ``library_path`` as plugin ``platform`` in pjrt's process-wide table (once)."""
    return plugin.load_pjrt_plugin_dynamically(platform, library_path)


def load_pjrt_plugin_with_c_api(platform: str, c_api: Any) -> Plugin:
    """Add a plugin whose ``PJRT_Api*`` is already in memory: a PyCapsule (what a plugin's
    Python extension hands out), an int address or a cffi pointer."""
    return plugin.load_pjrt_plugin_with_c_api(platform, c_api)


def create_client(loaded: Plugin, options: Mapping[str, Any] | None = None, *,
                  distributed_client: Any = None) -> Client:
    """Initialise a loaded plugin if needed and create a client of it with ``options``
    (spanning processes through ``distributed_client``, as in
    [`pjrt.client.create_client`][pjrt.client.create_client])."""
    from . import client

    if distributed_client is None:
        return client.create_client(loaded, options)
    return client.create_client(loaded, options, distributed_client=distributed_client)


def make_topology(loaded: Plugin, topology_name: str = "",
                  options: Mapping[str, Any] | None = None) -> DeviceTopology:
    """Ask a loaded plugin to describe ``topology_name`` (compiling without its devices)."""
    from . import topology

    return topology.make_topology(loaded, topology_name, options)


def jax_is_calling() -> Any | None:
    """JAX's backend registry module while JAX's plugin discovery is under way, else None.

    JAX calls every ``jax_plugins`` module's ``initialize()`` from that module, holding its
    plugin lock, before it marks its plugins registered; that is how a call from JAX is told
    from anyone else's in a process that merely has JAX loaded (a JAX version without those
    markers counts as calling whenever it is loaded). The module is looked up, never
    imported: importing JAX here would cost every pjrt process half a second and start JAX's
    own discovery.
    """
    if discovering():
        return None
    bridge = sys.modules.get(JAX_BRIDGE_MODULE)
    if bridge is None:
        return None
    done = getattr(bridge, "_plugins_registered", None)
    lock = getattr(bridge, "_plugin_lock", None)
    if done is None or lock is None:
        return bridge
    return bridge if not done and lock.locked() else None


class PluginDeclaration:
    """A plugin as its package declares it, once, for pjrt and for JAX.

    Only ``platform`` and one of ``library`` and ``c_api`` are required; the rest say how
    pjrt should treat the plugin (``make_client``, ``make_topology``, ``new_client`` and
    ``explain_load_error`` are pjrt's alone: JAX makes its clients its own way).
    """

    # A plain class rather than a dataclass: plugin packages import this module when they
    # are imported, and dataclasses would add its import time to every start-up.
    __slots__ = ("platform", "library", "c_api", "priority", "options", "make_client",
                 "make_topology", "new_client", "explain_load_error", "version", "serve_jax")

    def __init__(self, platform: str, *,
                 library: str | os.PathLike | Callable[[], str] | None = None,
                 c_api: Callable[[], Any] | None = None,
                 priority: int = DEFAULT_PLUGIN_PRIORITY,
                 options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
                 make_client: Callable[[Plugin, dict], Client] | None = None,
                 make_topology: Callable[[Plugin, str, dict], Any] | None = None,
                 new_client: Callable[..., Client] | None = None,
                 explain_load_error: Callable[[PluginLoadError], PluginLoadError] | None = None,
                 version: str | None = None,
                 serve_jax: bool = True):
        #: The platform name the plugin is registered under, in both hosts.
        object.__setattr__(self, "platform", platform)
        #: The plugin's shared library, or a function that finds it (raising FileNotFoundError
        #: with what to install when it is missing). Called at each registration, not at import.
        object.__setattr__(self, "library", library)
        #: Instead of ``library``: a function returning the plugin's ``PJRT_Api*`` as a PyCapsule.
        object.__setattr__(self, "c_api", c_api)
        #: Default-backend priority in both hosts (`PLATFORM_PRIORITIES` for pjrt's platforms).
        object.__setattr__(self, "priority", priority)
        #: Client create options, or a function returning them, called each time a client is
        #: made (so that a bad environment variable is the backend's reason, not a lost plugin).
        object.__setattr__(self, "options", options)
        #: ``make_client(plugin, options) -> Client``: code around client creation (check
        #: libraries, time it). [`create_client`][pjrt.plugin_api.create_client] when None.
        object.__setattr__(self, "make_client", make_client)
        #: ``make_topology(plugin, topology_name, options)``; [`make_topology`][pjrt.plugin_api.make_topology] when None.
        object.__setattr__(self, "make_topology", make_topology)
        #: ``new_client(plugin, **settings) -> Client``: a client of its own from settings the
        #: package defines (``pjrt.make_cpu_client(num_devices)`` calls the ``cpu`` one).
        object.__setattr__(self, "new_client", new_client)
        #: Turns the PluginLoadError of a library that cannot be loaded into a clearer one (what
        #: to install); returning the error unchanged keeps it.
        object.__setattr__(self, "explain_load_error", explain_load_error)
        #: The package's version; when given, a package that does not match the core's major and
        #: minor version is not registered with pjrt (and says so).
        object.__setattr__(self, "version", version)
        #: Whether JAX calling ``initialize()`` registers the library with JAX. False for a
        #: platform JAX already serves another way (its own CPU backend, its own CUDA wheel).
        object.__setattr__(self, "serve_jax", serve_jax)
        if (self.library is None) == (self.c_api is None):
            raise ValueError(f"the plugin declaration of {self.platform!r} needs exactly one "
                             f"of library and c_api")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a PluginDeclaration is immutable; make a new one to change {name}")

    def __repr__(self) -> str:
        given = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__
                          if n == "platform" or getattr(self, n) is not None)
        return f"PluginDeclaration({given})"

    def initialize(self) -> str | None:
        """Register the plugin with whichever host is calling; the package's ``initialize()``.

        Returns:
          ``"pjrt"`` or ``"jax"``: the host it registered with; None when neither asked (or
          JAX asked and ``serve_jax`` is False).

        Raises:
          PluginLoadError: under pjrt, the library is missing or cannot be loaded, or the
            package does not match the core; the reason is also recorded as the backend's.
        """
        if discovering():
            self.register_with_pjrt()
            return "pjrt"
        bridge = jax_is_calling()
        if bridge is None:
            return None
        if not self.serve_jax:
            logger.debug("JAX asked for %r; this package leaves that platform to JAX",
                         self.platform)
            return None
        self.register_with_jax(bridge)
        return "jax"

    def register_with_pjrt(self) -> Plugin | None:
        """Register the plugin with pjrt (the discovering registry, else the default one).

        Returns:
          The loaded plugin; None when PJRT_PLATFORMS leaves the platform out (it is then
          loaded when first needed).

        Raises:
          PluginLoadError: see `initialize`.
        """
        if self.version is not None and not check_plugin_version(
                self.platform, core_version, self.version):
            self._unavailable(PluginLoadError(
                f"the {self.platform!r} plugin package {self.version} does not match pjrt "
                f"{core_version}; install versions whose major.minor agree"))
        try:
            library_path = self.library_path() if self.library is not None else None
            c_api = self.c_api() if self.c_api is not None else None
        except FileNotFoundError as error:
            self._unavailable(PluginLoadError(str(error), path=error.filename), error)
        try:
            return register_plugin(self.platform, self.priority, library_path, self.options,
                                   c_api, make_client=self.make_client,
                                   make_topology=self.make_topology, new_client=self.new_client)
        except PluginLoadError as error:
            explained = self.explain_load_error(error) if self.explain_load_error else error
            if explained is error:
                raise  # register_plugin has recorded it
            self._unavailable(_keep_missing_libraries(explained, error), error)

    def register_with_jax(self, bridge: Any) -> None:
        """Register the library, priority and options with JAX's registry (``bridge`` is
        ``jax._src.xla_bridge``); JAX loads the library and makes its clients itself."""
        library_path = self.library_path() if self.library is not None else None
        c_api = self.c_api() if self.c_api is not None else None
        # JAX reads callable options when it brings the backend up, as pjrt does.
        bridge.register_plugin(self.platform, priority=self.priority, library_path=library_path,
                               c_api=c_api, options=self.options)

    def library_path(self) -> str:
        """The library's absolute path (FileNotFoundError when it cannot be found)."""
        found = self.library() if callable(self.library) else self.library
        return os.fspath(found)  # pyright: ignore[reportArgumentType, reportCallIssue]

    def _unavailable(self, failure: PluginLoadError, cause: Exception | None = None):
        register_unavailable(self.platform, failure, priority=self.priority)
        raise failure from cause


def _keep_missing_libraries(explained: PluginLoadError, error: PluginLoadError) -> PluginLoadError:
    """``explained``, still carrying every missing library ``error`` listed: a plugin's
    explanation adds advice, and must not cut the list down to the one name it knows of."""
    missing = error.missing_libraries
    if not missing or getattr(explained, "missing_libraries", ()):
        return explained
    message = str(explained)
    absent = [library for library in missing if library.name not in message]
    if absent:
        message += "\nEvery library it needs that is missing:\n" + format_missing(list(missing))
    return PluginLoadError(message, path=explained.path, missing_libraries=missing)
