"""The backends this process can use: registered lazily, initialised once, chosen by priority.

A backend is a :class:`~pjrt.client.Client` made by a factory registered under a platform name
(``cpu``, ``cuda``, ``rocm``, ``tpu``, or a vendor's own). Nothing happens at import: on the
first question the installed plugins are discovered (see :mod:`pjrt.discovery`), then each
selected factory is called once. The state lives in a :class:`BackendRegistry` behind one
lock; the module-level functions use :data:`default_registry` and keep JAX's names.

``PJRT_PLATFORMS=cuda,cpu`` (or :func:`set_platforms`) lists the platforms to bring up, the
first the default; each must come up, and the others are never loaded. Unset, every backend
is tried, failures are kept (:func:`backend_errors`), and the highest priority up is default.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from . import discovery, plugin_logging, startup
from .client import Client, create_client
from .errors import PluginLoadError
from .plugin import Plugin, PluginTable, default_plugins
# Platform names, aliases and PJRT_PLATFORMS, re-exported where the registry's users look.
from .platforms import (NON_EXPERIMENTAL_PLATFORMS, PLATFORM_ALIASES, PLATFORMS_ENV,  # noqa: F401
                        expand_platform_alias, is_gpu, parse_platforms)

if TYPE_CHECKING:
    from .device import Device
    from .topology import DeviceTopology

logger = logging.getLogger(__name__)

_NVIDIA_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")

BackendFactory = Callable[[], Client]

#: Create options, or a function that reads them when a client is made.
Options = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None


@dataclasses.dataclass
class BackendRegistration:
    """One registered backend factory, and why each field exists."""

    #: Makes the client; called at most once per initialisation of the registry.
    factory: BackendFactory
    #: Higher wins the default: accelerators (cuda 500, tpu 300) outrank cpu (0).
    priority: int = 0
    #: When the platform was not asked for by name, a failure is recorded and skipped
    #: rather than raised, so one broken plugin cannot stop the others.
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
    #: package defines; :func:`make_cpu_client` calls the one registered for ``cpu``.
    new_client: Callable[..., Client] | None = None
    #: Why the backend cannot come up, for registrations of an unavailable plugin.
    failure: Exception | None = None


#: True while pjrt's discovery is calling plugin modules' ``initialize()``.
discovering = discovery.discovering



class BackendRegistry:
    """Backend factories, the clients they made and why others failed, behind one lock."""

    def __init__(self, plugins: PluginTable | None = None, *, discover: bool = True,
                 environ: Mapping[str, str] | None = None):
        """Args:
          plugins: where plugin libraries are loaded (a fresh table in tests).
          discover: look for installed plugin modules and PJRT_NAMES_AND_LIBRARY_PATHS.
          environ: the environment to read (``os.environ`` when None).
        """
        self._lock = threading.RLock()
        self._plugins = plugins if plugins is not None else PluginTable()
        self._environ = environ
        self._discover_enabled = discover
        self._discovered = self._quiet = False
        self._registrations: dict[str, BackendRegistration] = {}
        self._backends: dict[str, Client] | None = None
        self._errors: dict[str, str] = {}
        self.plugin_output = plugin_logging.PluginOutput()  # what plugins printed, by backend
        self._default: str | None = None
        self._platforms_override: list[str] | None = None
        self._warned_experimental: set[str] = set()
        self.discovery_records: list[discovery.DiscoveryRecord] = []

    def _env(self, name: str) -> str | None:
        return (self._environ if self._environ is not None else os.environ).get(name)

    # -- registration ----------------------------------------------------------------------

    def register_backend_factory(self, name: str, factory: BackendFactory, *, priority: int = 0,
                                 fail_quietly: bool = True, experimental: bool = False,
                                 make_topology: Callable[..., Any] | None = None,
                                 source: str = "api", module: str | None = None,
                                 new_client: Callable[..., Client] | None = None) -> None:
        """Register ``factory`` as the maker of backend ``name`` (replacing any earlier one).

        The keyword arguments are the fields of :class:`BackendRegistration`.

        Raises:
          RuntimeError: backend ``name`` is already initialised.
        """
        self._add(name, BackendRegistration(
            factory, priority, fail_quietly, experimental, make_topology, source, module=module,
            new_client=new_client))

    def _add(self, name: str, registration: BackendRegistration) -> None:
        with self._lock:
            if self._backends is not None and name in self._backends:
                raise RuntimeError(f"backend {name!r} is already initialised; call "
                                   f"clear_backends() before registering it again")
            self._registrations[name] = registration

    def register_unavailable(self, name: str, error: Exception, *, priority: int = 0,
                             source: str = "api", module: str | None = None) -> None:
        """Record that backend ``name`` cannot come up, and why (``backend_errors()`` says it).

        Bringing it up, making its topology or a client of it raises ``error``.
        """
        self._add(name, BackendRegistration(
            _failing(error), priority, True, name not in NON_EXPERIMENTAL_PLATFORMS,
            _failing(error), source, module=module, failure=error))

    def register_plugin(self, plugin_name: str, priority: int = 400,
                        library_path: str | os.PathLike | None = None,
                        options: Options = None, c_api: Any = None, *,
                        make_client: Callable[[Plugin, dict], Client] | None = None,
                        make_topology: Callable[[Plugin, str, dict], Any] | None = None,
                        new_client: Callable[..., Client] | None = None,
                        source: str = "api", module: str | None = None) -> Plugin | None:
        """Load a PJRT plugin and register a backend factory that makes its client.

        Args:
          plugin_name: the platform name to register (e.g. ``"cuda"``).
          priority: default-backend priority (higher wins).
          library_path: the plugin's shared library; exactly one of this and ``c_api``.
          options: client create options, or a function returning them that is called each
            time a client is made (so that a bad setting is the backend's reason, not a
            discovery failure).
          c_api: a ``PJRT_Api*`` already in memory (PyCapsule, int address or cffi pointer).
          make_client: ``make_client(plugin, options) -> Client``, to run code around client
            creation (check libraries, time it); :func:`pjrt.client.create_client` when None.
          make_topology: ``make_topology(plugin, topology_name, options)``, to describe
            topologies; :func:`pjrt.topology.make_topology` when None.
          new_client: ``new_client(plugin, **settings) -> Client``, a client of its own from
            settings the plugin package defines (what :func:`make_cpu_client` calls).

        Returns:
          The loaded :class:`Plugin`; None when platform selection excludes this platform
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
            lambda: None, priority, True,  # pyright: ignore[reportArgumentType]
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
        with self._lock:
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
                                 and plugin_name not in self._registrations)
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

    def _discover(self) -> None:
        if self._discovered or not self._discover_enabled:
            self._discovered = True
            return
        # Read the environment first: a broken configuration file raises before any plugin
        # is touched, and raises again on the next question instead of being half-applied.
        env_plugins = discovery.plugins_from_env(self._env(discovery.ENV_VARIABLE))
        self._quiet = quiet = plugin_logging.start(self._environ)  # before any plugin loads
        self._discovered = True
        modules = discovery.find_plugin_modules()
        jax_only = []
        for module, for_jax, directory in discovery.iter_classified(modules):
            if for_jax:
                jax_only.append((module, directory))
                continue
            context = discovery.DiscoveryContext(self, module.source, module.module)
            with self.plugin_output.kept(quiet, module.module, self._registrations), \
                    discovery.discovery_scope(context):
                self.discovery_records.append(discovery.initialize_module(module))
        for module, directory in jax_only:
            with self.plugin_output.kept(quiet, module.module, self._registrations):
                self._register_jax_wheel(module, directory)
        for entry in env_plugins:
            with self.plugin_output.kept(quiet, entry.name):
                self._register_env_plugin(entry)

    def _register_jax_wheel(self, module: discovery.PluginModule, directory: str | None) -> None:
        platform = discovery.platform_of_jax_module(module.module)
        record = discovery.DiscoveryRecord(module.module, module.source + " (JAX plugin)",
                                           "registered library")
        self.discovery_records.append(record)
        if platform in self._registrations:
            record.action = "skipped"
            record.detail = f"a pjrt plugin already serves {platform!r}"
            return
        library = discovery.find_library(directory)
        if library is None:
            record.action, record.detail = "skipped", "written for JAX; no PJRT library beside it"
            return
        record.detail = f"{library} as {platform!r}"
        try:
            self.register_plugin(platform, priority=_DEFAULT_PRIORITIES.get(platform, 400),
                                 library_path=library, source=module.source,
                                 module=module.module)
        except (PluginLoadError, ValueError) as error:
            record.action, record.detail = "failed", str(error)
            logger.warning("JAX plugin %s: its library %s could not be loaded: %s",
                           module.module, library, error)

    def _register_env_plugin(self, entry: discovery.EnvPlugin) -> None:
        source = f"{discovery.ENV_VARIABLE}" + (f" ({entry.config_file})" if entry.config_file else "")
        record = discovery.DiscoveryRecord(entry.name, source, "registered library", entry.library_path)
        self.discovery_records.append(record)
        if entry.name in self._registrations:
            taken = self._registrations[entry.name]
            record.action, record.detail = "skipped", f"{entry.name!r} is already registered"
            self.plugin_output.warn_operator(discovery.taken_name(entry, taken.module or taken.source))
            return
        try:
            self.register_plugin(entry.name, library_path=entry.library_path,
                                 options=entry.options, source=source)
        except (PluginLoadError, ValueError) as error:
            record.action, record.detail = "failed", str(error)
            self.plugin_output.warn_operator(f"{discovery.ENV_VARIABLE} entry {entry.name!r}: {error}")

    # -- platform selection ----------------------------------------------------------------

    def set_platforms(self, platforms: str | Sequence[str] | None) -> None:
        """Choose the platforms to bring up (overrides PJRT_PLATFORMS); None restores it.

        Raises:
          RuntimeError: backends are already initialised (call :meth:`clear_backends`).
        """
        with self._lock:
            if self._backends is not None:
                raise RuntimeError("backends are already initialised; call clear_backends() "
                                   "before choosing platforms")
            platforms = parse_platforms(platforms)
            if platforms != self._platforms_override and self._discovered:
                # Discovery registered plugins under the old selection (skipping the
                # libraries it excluded); redo it under the new one.
                self._forget_discovered()
            self._platforms_override = platforms

    def selected_platforms(self) -> list[str] | None:
        """The platforms asked for (aliases kept as written), or None for all."""
        if self._platforms_override is not None:
            return self._expand(self._platforms_override)
        return self._expand(parse_platforms(self._env(PLATFORMS_ENV)))

    def _expand(self, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        expanded: list[str] = []
        for name in names:
            for platform in expand_platform_alias(name):
                if platform not in expanded:
                    expanded.append(platform)
        return expanded

    # -- initialisation --------------------------------------------------------------------

    def backends(self) -> dict[str, Client]:
        """Every backend that came up, by platform name (initialising on first call).

        Raises:
          RuntimeError: a platform asked for by name failed, or nothing came up; the
            message says which backends failed and why.
        """
        with self._lock:
            if self._backends is None:
                self._discover()
                self._backends = {}
                try:
                    self._initialize_all()
                except BaseException:
                    self._backends = None
                    raise
                self._suggest_missing()
            return dict(self._backends)

    def _requested(self) -> list[str]:
        """The platform names as written in set_platforms() or PJRT_PLATFORMS, aliases kept."""
        if self._platforms_override is not None:
            return self._platforms_override
        return parse_platforms(self._env(PLATFORMS_ENV)) or []

    def _plan(self) -> list[tuple[str, int, bool]]:
        selected = self.selected_platforms()
        if selected is None:
            return [(name, r.priority, r.fail_quietly) for name, r in self._registrations.items()]
        # "gpu" expands to cuda and rocm; only the members that are registered are required,
        # but at least one must be, or asking for a GPU silently gives none.
        for alias in self._requested():
            members = PLATFORM_ALIASES.get(alias)
            if members and not any(m in self._registrations for m in members):
                known = ", ".join(sorted(self._registrations)) or "none"
                raise RuntimeError(
                    f"{PLATFORMS_ENV} asks for {alias!r}, but no plugin for "
                    f"{' or '.join(members)} is registered (registered: {known}); install "
                    f"one, or remove {alias!r} from {PLATFORMS_ENV}")
        # Listed platforms: the order is the priority, and every one must come up.
        names = [p for p in selected if p in self._registrations or not self._is_alias_member(p)]
        return [(name, len(names) - i, False) for i, name in enumerate(names)]

    def _is_alias_member(self, platform: str) -> bool:
        return any(platform in PLATFORM_ALIASES.get(r, ()) for r in self._requested())

    def _initialize_all(self) -> None:
        best = None
        for name, priority, fail_quietly in self._plan():
            try:  # a backend not asked for by name: what its plugin prints is kept, not shown
                client = self._initialize_one(name, capture=self._quiet and fail_quietly)
            except Exception as error:  # noqa: BLE001 - recorded, or raised with a hint
                reason = f"{type(error).__name__}: {error}"
                self._errors[name] = reason
                if not fail_quietly:
                    raise RuntimeError(f"unable to initialise backend {name!r}: {reason} "
                                       f"({self._why_required(name)})") from error
                logger.info("backend %r did not start: %s", name, reason)
                continue
            self._backends[name] = client
            if best is None or priority > best[1]:
                best = (name, priority)
        if best is None:
            raise RuntimeError(self._nothing_came_up())
        self._default = best[0]

    def _why_required(self, name: str) -> str:
        """Why a failure of backend ``name`` stops initialisation, and what to do about it."""
        if self._platforms_override is not None:
            return ("it was asked for with set_platforms(); call set_platforms(None) to use "
                    "whatever comes up")
        if self.selected_platforms() is None:
            return ("its plugin registered it with fail_quietly=False, so its failure stops "
                    f"start-up; fix the cause, or set {PLATFORMS_ENV} to the platforms to use")
        # Name what the user wrote: "gpu", not the "cuda" it stands for.
        written = next((r for r in self._requested() if name in expand_platform_alias(r)), name)
        asked = f"{written!r}" + (f" (which stands for {name!r})" if written != name else "")
        return (f"it was asked for in {PLATFORMS_ENV} as {asked}; set {PLATFORMS_ENV}='' to use "
                f"whatever comes up, or remove {written!r} from it")

    def _initialize_one(self, name: str, capture: bool = False) -> Client:
        registration = self._registrations.get(name)
        if registration is None:
            known = ", ".join(sorted(self._registrations)) or "none"
            raise RuntimeError(f"no backend named {name!r} is registered (registered: {known}); "
                               f"{_package_hint(name)}{self._failed_modules()}")
        client = startup.bring_up(name, registration.factory,
                                  timeout=startup.init_timeout(self._environ),
                                  close=lambda client: client.close(),
                                  keep_output=lambda: self.plugin_output.kept(capture, name))
        if client is None or client.device_count() == 0:
            raise RuntimeError(f"backend {name!r} has no devices" if client is not None else
                               f"the factory of backend {name!r} returned no client")
        # Only a backend that came up is worth this warning; one that failed says why instead.
        if registration.experimental and name not in self._warned_experimental:
            self._warned_experimental.add(name)
            logger.warning("platform %r comes from a plugin this project does not test; not "
                           "every feature may work", name)
        return client

    def _nothing_came_up(self) -> str:
        if not self._registrations:  # the failures that left none registered lead
            return (f"no PJRT backend is registered{self._failed_modules(lead=True) or ':'} "
                    f"install a plugin package such as pjrt-cpu (pip install pjrt-cpu), or name "
                    f"a plugin library in {discovery.ENV_VARIABLE}")
        lines = [f"  {name}: {self._errors.get(name, 'not started')}"
                 for name in self._registrations]
        return "no PJRT backend could be started:\n" + "\n".join(lines)

    def _suggest_missing(self) -> None:
        if ("cuda" in self._backends  # pyright: ignore[reportOperatorIssue]
                or not any(os.path.exists(p) for p in _NVIDIA_DEVICE_NODES)):
            return
        selected = self.selected_platforms()
        if selected is not None and "cuda" not in selected:
            return  # the user chose the platforms; the GPU was left out on purpose
        if "cuda" in self._errors:
            logger.warning("an NVIDIA GPU seems present but the CUDA backend failed: %s",
                           self._errors["cuda"])
        elif "cuda" not in self._registrations:
            logger.warning("an NVIDIA GPU seems present but no CUDA plugin is installed; "
                           "pip install pjrt-cuda to use it (falling back to %s)", self._default)

    # -- queries ---------------------------------------------------------------------------

    def canonicalize_platform(self, platform: str) -> str:
        """Replace an alias with the platform that came up (``gpu`` -> ``cuda``)."""
        members = PLATFORM_ALIASES.get(platform)
        if members is None:
            return platform
        up = self.backends()
        for member in members:
            if member in up:
                return member
        raise RuntimeError(f"no {platform} backend is available ({', '.join(members)} did not "
                           f"come up); backends available: {', '.join(up) or 'none'}")

    def is_known_platform(self, platform: str) -> bool:
        """Whether ``platform`` is registered or is an alias (it may still have failed)."""
        with self._lock:
            self._discover()
            return platform in self._registrations or platform in PLATFORM_ALIASES

    def get_backend(self, platform: str | None = None) -> Client:
        """The client of ``platform`` (the default backend when None).

        Raises:
          RuntimeError: the platform is unknown or failed to start; says why.
        """
        backends = self.backends()
        if platform is None:
            return backends[self._default]  # pyright: ignore[reportArgumentType]
        platform = self.canonicalize_platform(platform)
        if platform in backends:
            return backends[platform]
        if platform in self._errors:
            raise RuntimeError(f"backend {platform!r} failed to initialise: "
                               f"{self._errors[platform]}; backends available: "
                               f"{', '.join(backends)}")
        selected = self.selected_platforms()
        if selected is not None and platform in self._registrations:
            raise RuntimeError(f"backend {platform!r} is not in {PLATFORMS_ENV} "
                               f"({','.join(selected)}); add it there to use it")
        raise RuntimeError(f"unknown backend {platform!r}; backends available: "
                           f"{', '.join(backends)}")

    def default_backend(self) -> str:
        """The platform name of the default backend."""
        self.backends()
        return self._default  # pyright: ignore[reportReturnType]

    def backend_errors(self) -> dict[str, str]:
        """Why each backend that failed to start failed (initialising them first if needed).

        Unlike :meth:`backends`, this answers even when initialisation raised (a platform
        asked for by name failed, or nothing came up): the reasons are what one wants then.
        """
        with self._lock:
            try:
                self.backends()
            except RuntimeError:
                pass
            return dict(self._errors)

    def registrations(self) -> dict[str, BackendRegistration]:
        """The registered backends (discovering plugins first), by name."""
        with self._lock:
            self._discover()
            return dict(self._registrations)

    def backends_are_initialized(self) -> bool:
        with self._lock:
            return self._backends is not None

    def clear_backends(self) -> None:
        """Forget the backends made so far; the next question discovers and initialises afresh.

        As in jax, nothing is closed: arrays and executables made before keep working (in
        any thread, during the call too), and each old client is freed once nothing refers
        to it any more (its last array and executable gone). ``Client.close()`` frees one at
        once. Registrations made through the API stay; those made by discovery are redone.
        """
        with self._lock:
            self._backends = None
            self._errors = {}
            self._default = None
            self._forget_discovered()

    def _forget_discovered(self) -> None:
        # Registrations made through the API stay; discovery's are redone next time.
        self._registrations = {name: r for name, r in self._registrations.items()
                               if r.source == "api"}
        self.plugin_output.clear()
        self._discovered = False
        self.discovery_records = []

    def make_pjrt_topology(self, platform: str, topology_name: str = "",
                           **options: Any) -> DeviceTopology:
        """A topology description of ``platform``, for compiling without its devices.

        Works whether or not PJRT_PLATFORMS selects ``platform``: describing a topology
        brings up no backend.

        Raises:
          RuntimeError: no plugin is registered for the platform, or it cannot describe
            topologies.
          PluginLoadError: the platform's plugin cannot be loaded.
        """
        registration = self._registration_for(platform, "make a topology description")
        if registration.make_topology is None:
            raise RuntimeError(f"platform {platform!r} cannot make a topology description "
                               f"(it was registered as a plain backend factory, from "
                               f"{registration.source})")
        return registration.make_topology(topology_name, **options)

    def new_client(self, platform: str, **settings) -> Client:
        """A client of ``platform``'s plugin of its own (not the backend's), from ``settings``.

        Which settings a platform takes is up to its plugin package (``cpu``:
        ``num_devices``).

        Raises:
          RuntimeError: no plugin package is registered for the platform, or it does not
            make clients of its own, or its plugin cannot be loaded (the reason is kept).
        """
        registration = self._registration_for(platform, "make a client")
        if registration.failure is not None:
            raise RuntimeError(f"the {platform} plugin cannot be loaded: "
                               f"{registration.failure}") from registration.failure
        if registration.new_client is None:
            raise RuntimeError(f"the {platform!r} backend registered from {registration.source} "
                               f"cannot make clients of its own; install its plugin package "
                               f"({_package_hint(platform)})")
        return registration.new_client(**settings)

    def _registration_for(self, platform: str, purpose: str) -> BackendRegistration:
        with self._lock:
            self._discover()
            registration = self._registrations.get(platform)
            if registration is not None:
                return registration
            known = ", ".join(sorted(self._registrations)) or "none"
        raise RuntimeError(f"cannot {purpose} for {platform!r}: no plugin for it is registered "
                           f"(registered: {known}); {_package_hint(platform)}"
                           f"{self._failed_modules()}")

    def _failed_modules(self, lead: bool = False) -> str:
        failed = [f"{r.name}: {r.detail}" for r in self.discovery_records if r.action == "failed"]
        if failed and lead:  # the cause first, when it is why nothing is registered
            return " because plugin modules failed during discovery: " + "; ".join(failed) + ";"
        return (" (plugin modules that failed during discovery: " + "; ".join(failed) + ")"
                if failed else "")


def _package_hint(platform: str) -> str:
    if platform in NON_EXPERIMENTAL_PLATFORMS:
        return f"pip install pjrt-{platform}"
    return (f"install the plugin package for {platform!r}, or name its library in "
            f"{discovery.ENV_VARIABLE}")


_DEFAULT_PRIORITIES = {"cuda": 500, "rocm": 500, "tpu": 300, "cpu": 0}


def _read_options(options: Options) -> dict:
    return dict((options() if callable(options) else options) or {})


def _default_topology(plugin: Plugin, topology_name: str, options: dict):
    from .topology import make_topology

    return make_topology(plugin, topology_name, options)


def _failing(error: Exception) -> Callable[..., Any]:
    """A factory (or topology factory) that raises ``error``."""
    def factory(*args, **kwargs):
        raise error
    return factory


default_registry = BackendRegistry(default_plugins)


# -- the module-level API, on the default registry ---------------------------------------------

def _target() -> tuple[BackendRegistry, str, str | None]:
    """The registry a module-level registration goes to, with its source and module.

    Inside discovery that is the discovering registry; otherwise the default one.
    """
    context = discovery.current_context()
    if context is None:
        return default_registry, "api", None
    return context.registry, context.source, context.module


def register_backend_factory(name: str, factory: BackendFactory, *, priority: int = 0,
                             fail_quietly: bool = True, experimental: bool = False,
                             make_topology: Callable[..., Any] | None = None,
                             new_client: Callable[..., Client] | None = None) -> None:
    """Register a backend factory (see BackendRegistry.register_backend_factory).

    Called by a plugin module's ``initialize()`` during discovery, it registers with the
    registry that is discovering; otherwise with the default registry.
    """
    registry, source, module = _target()
    registry.register_backend_factory(name, factory, priority=priority,
                                      fail_quietly=fail_quietly, experimental=experimental,
                                      make_topology=make_topology, source=source, module=module,
                                      new_client=new_client)


def register_unavailable(name: str, error: Exception, *, priority: int = 0) -> None:
    """Record that backend ``name`` cannot come up, and why (``backend_errors()`` shows it).

    For plugin packages whose ``initialize()`` finds that their library is missing.
    """
    registry, source, module = _target()
    registry.register_unavailable(name, error, priority=priority, source=source, module=module)


def register_plugin(plugin_name: str, priority: int = 400, library_path=None, options=None,
                    c_api=None, *, make_client=None, make_topology=None,
                    new_client=None) -> Plugin | None:
    """Load a PJRT plugin and register it as a backend (see BackendRegistry.register_plugin).

    Called by a plugin module's ``initialize()`` during discovery, it registers with the
    registry that is discovering; otherwise with the default registry.
    """
    registry, source, module = _target()
    return registry.register_plugin(plugin_name, priority, library_path, options, c_api,
                                    make_client=make_client, make_topology=make_topology,
                                    new_client=new_client, source=source, module=module)


def set_platforms(platforms: str | Sequence[str] | None) -> None:
    """Choose the platforms to bring up, like PJRT_PLATFORMS (None: back to the variable)."""
    default_registry.set_platforms(platforms)


def backends() -> dict[str, Client]:
    """Every backend that came up, by platform name."""
    return default_registry.backends()


def backend_errors() -> dict[str, str]:
    """Why each backend that failed to start failed."""
    return default_registry.backend_errors()


def backend_logs() -> dict[str, str]:
    """What each plugin wrote to stderr while discovered or brought up unasked, by backend."""
    backend_errors()  # brings the backends up, even when that raises
    return default_registry.plugin_output.as_dict()


def get_backend(platform: str | Client | None = None) -> Client:
    """The client for ``platform`` (the default backend when None; a Client, as is)."""
    if isinstance(platform, Client):  # jaxlib's functions take a backend client too
        return platform
    return default_registry.get_backend(platform)


def default_backend() -> str:
    """The platform name of the default backend."""
    return default_registry.default_backend()


def canonicalize_platform(platform: str) -> str:
    """``gpu`` -> the GPU platform that came up; other names unchanged."""
    return default_registry.canonicalize_platform(platform)


def is_known_platform(platform: str) -> bool:
    """Whether ``platform`` is registered or an alias."""
    return default_registry.is_known_platform(platform)


def backends_are_initialized() -> bool:
    return default_registry.backends_are_initialized()


def clear_backends() -> None:
    """Forget every backend client (closing none); the next question initialises afresh."""
    default_registry.clear_backends()


def devices(backend: str | Client | None = None) -> list[Device]:
    """All devices of ``backend`` (the default backend when None)."""
    return get_backend(backend).devices()


def local_devices(process_index: int | None = None, backend: str | Client | None = None,
                  host_id: int | None = None) -> list[Device]:
    """The devices of ``backend`` that belong to ``process_index`` (this process by default;
    ``host_id`` is jax's older name for it).

    Raises:
      ValueError: ``process_index`` is not one of the backend's processes.
    """
    process_index = host_id if process_index is None else process_index
    client = get_backend(backend)
    if process_index is None:
        process_index = client.process_index()
    if not 0 <= process_index < process_count(backend):
        raise ValueError(f"unknown process_index {process_index}; the {client.platform} backend "
                         f"has {process_count(backend)} process(es)")
    return [d for d in client.devices() if d.process_index == process_index]


def device_count(backend: str | Client | None = None) -> int:
    return get_backend(backend).device_count()


def local_device_count(backend: str | Client | None = None) -> int:
    return get_backend(backend).local_device_count()


def process_index(backend: str | Client | None = None) -> int:
    return get_backend(backend).process_index()


def process_count(backend: str | Client | None = None) -> int:
    """The number of processes the backend's devices belong to."""
    return len({d.process_index for d in get_backend(backend).devices()})


def backend_pjrt_c_api_version(platform: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` PJRT C API version of a backend's plugin."""
    return get_backend(platform).plugin.api_version


def make_pjrt_topology(platform: str, topology_name: str = "", **options: Any) -> DeviceTopology:
    """A topology description of ``platform`` for compiling without its devices."""
    return default_registry.make_pjrt_topology(platform, topology_name, **options)


def make_cpu_client(num_devices: int | None = None) -> Client:
    """A new client of the CPU plugin, with ``num_devices`` devices (its own default if None).

    The client comes from the plugin package registered for ``cpu`` (``pjrt-cpu``), which
    says how to make one; it is a client of its own, not the ``cpu`` backend's.

    Raises:
      RuntimeError: no CPU plugin package is installed, or its plugin cannot be loaded.
    """
    return default_registry.new_client("cpu", num_devices=num_devices)
