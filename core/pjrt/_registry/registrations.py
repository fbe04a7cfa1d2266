"""What a backend registry knows before any backend comes up: the registered backend factories,
the plugin libraries behind them, what discovery found, and which platforms were chosen.

`Registrations` holds that state and the steps that fill it: registering a factory or a plugin
library, discovering installed plugin packages, JAX plugin wheels and
`PJRT_NAMES_AND_LIBRARY_PATHS`, and choosing platforms. A
[`BackendRegistry`][pjrt.registry.BackendRegistry] owns one (its ``registered`` attribute),
brings the backends up from it and answers questions about them; programs use the
module-level functions of `pjrt.registry`, which keep JAX's names.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any, Callable, Collection, Mapping, Sequence

from . import discovery
from ..client import Client, create_client
from ..errors import PluginLoadError
from .._loading import plugin_logging
from .._loading.platforms import (DEFAULT_PLUGIN_PRIORITY, JAX_PLATFORMS_ENV,
                                 NON_EXPERIMENTAL_PLATFORMS, PLATFORM_PRIORITIES, PLATFORMS_ENV,
                                 expand_platform_alias, parse_platforms)
from ..plugin import Plugin, PluginTable

# The registry's logger: what discovery reports is the registry's to say.
logger = logging.getLogger("pjrt.registry")

BackendFactory = Callable[[], Client]

#: Create options, or a function that reads them when a client is made.
Options = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None


@dataclasses.dataclass
class BackendRegistration:
    """One registered backend factory, and why each field exists."""

    #: Makes the client; called at most once per initialisation of the registry.
    factory: BackendFactory
    #: Higher wins the default (`pjrt.plugin_api.PLATFORM_PRIORITIES`: accelerators outrank
    #: the CPU).
    priority: int = 0
    #: When the platform was not asked for by name, a failure is recorded and skipped
    #: rather than raised, so one broken plugin cannot stop the others. Plugin libraries
    #: (`register_plugin`, PJRT_NAMES_AND_LIBRARY_PATHS) register with False, as in jax:
    #: a plugin someone installed or named is meant to be used, so its failure is loud.
    fail_quietly: bool = True
    #: Plugins this project does not test warn once when they come up.
    experimental: bool = False
    #: Makes a topology description (compiling without the hardware), if the plugin can.
    make_topology: Callable[..., Any] | None = None
    #: Where the registration came from, for ``pjrt info``.
    source: str = "api"
    #: The plugin behind the factory, once loaded (None for plain factories).
    plugin: Plugin | None = None
    #: The plugin module whose ``initialize()`` (or library) made this registration, if any.
    module: str | None = None
    #: Makes a client of its own (not the shared backend) from keyword settings the plugin
    #: package defines; `make_cpu_client` calls the one registered for ``cpu``.
    new_client: Callable[..., Client] | None = None
    #: Why the backend cannot come up, for registrations of an unavailable plugin.
    failure: Exception | None = None


def _read_options(options: Options) -> dict:
    return dict((options() if callable(options) else options) or {})


def _default_topology(plugin: Plugin, topology_name: str, options: dict):
    from ..topology import make_topology

    return make_topology(plugin, topology_name, options)


def _failing(error: Exception) -> Callable[..., Any]:
    """A factory (or topology factory) that raises ``error``."""
    def factory(*args, **kwargs):
        raise error
    return factory


class Registrations:
    """Registered backend factories, discovered plugins and the chosen platforms: what a
    [`BackendRegistry`][pjrt.registry.BackendRegistry] owns before any backend comes up.

    The registry reads ``entries`` (name ->
    [`BackendRegistration`][pjrt.registry.BackendRegistration]), ``quiet``, ``environ``, ``plugin_output`` and ``discovery_records``, and calls the methods
    below; it shares its lock, and says which backends are up through ``started``.
    """

    def __init__(self, plugins: PluginTable | None = None, *, discover: bool = True,
                 environ: Mapping[str, str] | None = None,
                 lock: threading.RLock | None = None,
                 started: Callable[[], Collection[str] | None] = lambda: None):
        """Args:
          plugins: where plugin libraries are loaded (a fresh table in tests).
          discover: look for installed plugin modules and PJRT_NAMES_AND_LIBRARY_PATHS.
          environ: the environment to read (``os.environ`` when None).
          lock: the owner's lock, which every change here is made under.
          started: the names of the backends brought up so far (None before any bring-up);
            a backend that is up cannot be registered again, nor the platforms chosen anew.
        """
        self.lock = lock if lock is not None else threading.RLock()
        self._started = started
        self._plugins = plugins if plugins is not None else PluginTable()
        #: The environment read (None: ``os.environ``).
        self.environ = environ
        self._discover_enabled = discover
        self._discovered = False
        #: Whether what plugins print during start-up is kept rather than shown.
        self.quiet = False
        #: The registered backends, by name; changed only by the methods here.
        self.entries: dict[str, BackendRegistration] = {}
        self.plugin_output = plugin_logging.PluginOutput()  # what plugins printed, by backend
        self._platforms_override: list[str] | None = None
        self.discovery_records: list[discovery.DiscoveryRecord] = []

    def env(self, name: str) -> str | None:
        """Environment variable ``name`` as this registry reads it."""
        return (self.environ if self.environ is not None else os.environ).get(name)

    def platforms_variable(self) -> str:
        """The environment variable that lists the platforms to bring up: PJRT_PLATFORMS,
        or jax's JAX_PLATFORMS when PJRT_PLATFORMS is unset (so a jax user's environment
        is honoured; PJRT_PLATFORMS wins when both are set, even empty)."""
        if self.env(PLATFORMS_ENV) is None and self.env(JAX_PLATFORMS_ENV) is not None:
            return JAX_PLATFORMS_ENV
        return PLATFORMS_ENV

    # -- registration ----------------------------------------------------------------------

    def register_backend_factory(self, name: str, factory: BackendFactory, *, priority: int = 0,
                                 fail_quietly: bool = True, experimental: bool = False,
                                 make_topology: Callable[..., Any] | None = None,
                                 source: str = "api", module: str | None = None,
                                 new_client: Callable[..., Client] | None = None) -> None:
        """Register ``factory`` as the maker of backend ``name`` (replacing any earlier one).

        The keyword arguments are the fields of [`BackendRegistration`][pjrt.registry.BackendRegistration].

        Raises:
          RuntimeError: backend ``name`` is already initialised.
        """
        self._add(name, BackendRegistration(
            factory, priority, fail_quietly, experimental, make_topology, source, module=module,
            new_client=new_client))

    def _add(self, name: str, registration: BackendRegistration) -> None:
        with self.lock:
            started = self._started()
            if started is not None and name in started:
                raise RuntimeError(f"backend {name!r} is already initialised; call "
                                   f"clear_backends() before registering it again")
            self.entries[name] = registration

    def register_unavailable(self, name: str, error: Exception, *, priority: int = 0,
                             source: str = "api", module: str | None = None,
                             fail_quietly: bool = True) -> None:
        """Record that backend ``name`` cannot come up, and why (``backend_errors()`` says it).

        Bringing it up, making its topology or a client of it raises ``error``; with
        ``fail_quietly=False`` that stops start-up even when ``name`` was not asked for.
        """
        self._add(name, BackendRegistration(
            _failing(error), priority, fail_quietly, name not in NON_EXPERIMENTAL_PLATFORMS,
            _failing(error), source, module=module, failure=error))

    def register_plugin(self, plugin_name: str, priority: int = DEFAULT_PLUGIN_PRIORITY,
                        library_path: str | os.PathLike | None = None,
                        options: Options = None, c_api: Any = None, *,
                        make_client: Callable[[Plugin, dict], Client] | None = None,
                        make_topology: Callable[[Plugin, str, dict], Any] | None = None,
                        new_client: Callable[..., Client] | None = None,
                        source: str = "api", module: str | None = None) -> Plugin | None:
        """Load a PJRT plugin and register a backend factory that makes its client.

        The registration has ``fail_quietly=False``, as jax's has: when every backend is
        tried, a plugin that fails to come up stops start-up with the reason instead of
        leaving the CPU in its place (GPU and TPU plugins on a machine without such a device
        are the exception; see `pjrt.registry`). A library that cannot be loaded raises here
        and is recorded quietly as the backend's reason.

        Args:
          plugin_name: the platform name to register (e.g. ``"cuda"``).
          priority: default-backend priority (higher wins).
          library_path: the plugin's shared library; exactly one of this and ``c_api``.
          options: client create options, or a function returning them that is called each
            time a client is made (so that a bad setting is the backend's reason, not a
            discovery failure).
          c_api: a ``PJRT_Api*`` already in memory (PyCapsule, int address or cffi pointer).
          make_client: ``make_client(plugin, options) -> Client``, to run code around client
            creation (check libraries, time it); [`pjrt.client.create_client`][pjrt.client.create_client] when None.
          make_topology: ``make_topology(plugin, topology_name, options)``, to describe
            topologies; [`pjrt.topology.make_topology`][pjrt.topology.make_topology] when None.
          new_client: ``new_client(plugin, **settings) -> Client``, a client of its own from
            settings the plugin package defines (what `make_cpu_client` calls).

        Returns:
          The loaded [`Plugin`][pjrt.plugin.Plugin]; None when platform selection excludes this platform
          (the registration is kept, and its library is loaded when a later selection asks
          for the platform, or when a topology or client of it is asked for).

        Raises:
          ValueError: neither or both of ``library_path`` and ``c_api`` were given.
          PluginLoadError: the library could not be loaded. The failure is also recorded as
            the backend's reason, so ``backend_errors()`` shows it.
        """
        if (library_path is None) == (c_api is None):
            raise ValueError(f"register_plugin({plugin_name!r}) needs exactly one of "
                             f"library_path and c_api")
        create = make_client or create_client
        describe = make_topology or _default_topology
        # A placeholder factory until load() below exists.
        registration = BackendRegistration(
            lambda: None, priority, False,  # pyright: ignore[reportArgumentType]
            plugin_name not in NON_EXPERIMENTAL_PLATFORMS,
            source=source, module=module)
        loaded: list[Plugin] = []
        # Its own lock, not the registry's: a bring-up calls load() on a worker thread while
        # the registry's lock is held by the thread waiting for it.
        load_lock = threading.Lock()

        def load() -> Plugin:
            # Loaded once per registration (a c_api table cannot be added twice); the
            # PluginTable returns the same plugin when the library is asked for again.
            with load_lock:
                if not loaded:
                    if library_path is not None:
                        loaded.append(self._plugins.load(plugin_name, library_path))
                    else:
                        loaded.append(self._plugins.add_c_api(plugin_name, c_api))
                    registration.plugin = loaded[0]
                return loaded[0]

        registration.factory = lambda: create(load(), _read_options(options))
        registration.make_topology = (
            lambda topology_name="", **topology_options: describe(
                load(), topology_name, topology_options))
        if new_client is not None:
            registration.new_client = lambda **settings: new_client(load(), **settings)
        with self.lock:
            selected = self.selected_platforms()
            if selected is not None and plugin_name not in selected:
                # Platforms not asked for are not loaded now, but the registration stays
                # usable: a later selection, a topology or a new client loads the library.
                self._add(plugin_name, registration)
                return None
            try:
                plugin = load()
            except (PluginLoadError, ValueError) as error:  # ValueError: the name is taken,
                # by a registration (which stays) or by a library loaded by hand (the reason).
                taken_by_hand = (isinstance(error, ValueError)
                                 and plugin_name not in self.entries)
                if isinstance(error, PluginLoadError) or taken_by_hand:
                    self.register_unavailable(plugin_name, error, priority=priority, source=source,
                                              module=module)
                if taken_by_hand:
                    self.plugin_output.warn_operator(f"backend {plugin_name!r}: {error}")
                raise
            # Registered once loaded: a name already taken by another library (ValueError)
            # leaves the first registration in place.
            self._add(plugin_name, registration)
            return plugin

    # -- discovery -------------------------------------------------------------------------

    def discover(self) -> None:
        """Run discovery once (again after `forget_discovered`), unless turned off."""
        if self._discovered or not self._discover_enabled:
            self._discovered = True
            return
        # Read the environment first: a broken configuration file raises before any plugin
        # is touched, and raises again on the next question instead of being half-applied.
        env_plugins = discovery.plugins_from_env(self.env(discovery.ENV_VARIABLE))
        self.quiet = quiet = plugin_logging.start(self.environ)  # before any plugin loads
        self._discovered = True
        modules = discovery.find_plugin_modules()
        jax_only = []
        for module, for_jax, directory in discovery.iter_classified(modules):
            if for_jax:
                jax_only.append((module, directory))
                continue
            context = discovery.DiscoveryContext(self, module.source, module.module)
            with self.plugin_output.kept(quiet, module.module, self.entries), \
                    discovery.discovery_scope(context):
                self.discovery_records.append(discovery.initialize_module(module))
        for module, directory in jax_only:
            with self.plugin_output.kept(quiet, module.module, self.entries):
                self._register_jax_wheel(module, directory)
        for entry in env_plugins:
            with self.plugin_output.kept(quiet, entry.name):
                self._register_env_plugin(entry)

    def _register_jax_wheel(self, module: discovery.PluginModule, directory: str | None) -> None:
        platform = discovery.platform_of_jax_module(module.module)
        record = discovery.DiscoveryRecord(module.module, module.source + " (JAX plugin)",
                                           "registered library")
        self.discovery_records.append(record)
        if platform in self.entries:
            record.action = "skipped"
            record.detail = f"a pjrt plugin already serves {platform!r}"
            return
        library = discovery.find_library(directory)
        if library is None:
            record.action, record.detail = "skipped", "written for JAX; no PJRT library beside it"
            return
        record.detail = f"{library} as {platform!r}"
        try:
            priority = PLATFORM_PRIORITIES.get(platform, DEFAULT_PLUGIN_PRIORITY)
            self.register_plugin(platform, priority=priority, library_path=library,
                                 source=module.source, module=module.module)
        except (PluginLoadError, ValueError) as error:
            record.action, record.detail = "failed", str(error)
            logger.warning("JAX plugin %s: its library %s could not be loaded: %s",
                           module.module, library, error)

    def _register_env_plugin(self, entry: discovery.EnvPlugin) -> None:
        source = f"{discovery.ENV_VARIABLE}" + (f" ({entry.config_file})" if entry.config_file else "")
        record = discovery.DiscoveryRecord(entry.name, source, "registered library", entry.library_path)
        self.discovery_records.append(record)
        if entry.name in self.entries:
            taken = self.entries[entry.name]
            record.action, record.detail = "skipped", f"{entry.name!r} is already registered"
            self.plugin_output.warn_operator(discovery.taken_name(entry, taken.module or taken.source))
            return
        try:
            self.register_plugin(entry.name, library_path=entry.library_path,
                                 options=entry.options, source=source)
        except (PluginLoadError, ValueError) as error:
            record.action, record.detail = "failed", str(error)
            # The operator named this library: as in jax, that it cannot be loaded stops
            # start-up (with the reason and the way out) rather than leaving it out quietly.
            self.register_unavailable(entry.name, error, priority=DEFAULT_PLUGIN_PRIORITY,
                                      source=source, fail_quietly=False)

    # -- platform selection ----------------------------------------------------------------

    def set_platforms(self, platforms: str | Sequence[str] | None) -> None:
        """Choose the platforms to bring up (overrides PJRT_PLATFORMS); None restores it.

        Like jax's settings that shape the backends (``jax_num_cpu_devices``), the choice is
        made before they come up: once they are up, choosing what is already chosen is
        allowed and anything else is refused.

        Raises:
          RuntimeError: backends are already initialised with another choice (call
            `clear_backends` first).
        """
        with self.lock:
            platforms = parse_platforms(platforms)
            if self._started() is not None:
                chosen = (platforms if platforms is not None
                          else parse_platforms(self.env(self.platforms_variable())))
                if self._expand(chosen) == self.selected_platforms():
                    return  # the backends up are the ones this choice brings up
                raise RuntimeError("set_platforms() should be called before backends are "
                                   "initialized: they are already initialised with "
                                   f"{self._selection_text()}; call clear_backends() before "
                                   "choosing platforms")
            if platforms != self._platforms_override and self._discovered:
                # Discovery registered plugins under the old selection (skipping the
                # libraries it excluded); redo it under the new one.
                self.forget_discovered()
            self._platforms_override = platforms

    def _selection_text(self) -> str:
        if self._platforms_override is not None:
            return f"set_platforms({','.join(self._platforms_override)!r})"
        written = self.env(self.platforms_variable())
        return (f"{self.platforms_variable()}={written!r}" if parse_platforms(written)
                else "every registered platform")

    def requested(self) -> list[str]:
        """The platform names as written in set_platforms() or PJRT_PLATFORMS, aliases kept."""
        if self._platforms_override is not None:
            return self._platforms_override
        return parse_platforms(self.env(self.platforms_variable())) or []

    def chosen_by_call(self) -> bool:
        """Whether set_platforms() made the choice (rather than the environment)."""
        return self._platforms_override is not None

    def selection_source(self) -> str:
        """Where the platforms to bring up were chosen, in words."""
        return "set_platforms()" if self.chosen_by_call() else self.platforms_variable()

    def selected_platforms(self) -> list[str] | None:
        """The platforms asked for (aliases kept as written), or None for all."""
        if self._platforms_override is not None:
            return self._expand(self._platforms_override)
        return self._expand(parse_platforms(self.env(self.platforms_variable())))

    def _expand(self, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        expanded: list[str] = []
        for name in names:
            for platform in expand_platform_alias(name):
                if platform not in expanded:
                    expanded.append(platform)
        return expanded

    def forget_discovered(self) -> None:
        """Drop what discovery registered (it is redone next time); the API's registrations stay."""
        self.entries = {name: r for name, r in self.entries.items()
                               if r.source == "api"}
        self.plugin_output.clear()
        self._discovered = False
        self.discovery_records = []
