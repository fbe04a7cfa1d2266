"""The backends this process can use: registered lazily, initialised once, chosen by priority.

A backend is a [`Client`][pjrt.client.Client] made by a factory registered under a platform name
(``cpu``, ``cuda``, ``rocm``, ``tpu``, or a vendor's own). Nothing happens at import: on the
first question the installed plugins are discovered (entry points, ``jax_plugins`` modules and
``PJRT_NAMES_AND_LIBRARY_PATHS``; see the operators' guide), then each
selected factory is called once. The state lives in a [`BackendRegistry`][pjrt.registry.BackendRegistry] behind one
lock; the module-level functions use `default_registry` and keep JAX's names.

``PJRT_PLATFORMS=cuda,cpu`` (or [`set_platforms`][pjrt.registry.set_platforms]) lists the platforms to bring up, the
first the default; each must come up, and the others are never loaded. Unset, every backend
is tried and the highest priority up is default. As in jax, a plugin library (registered by
a plugin package or named in ``PJRT_NAMES_AND_LIBRARY_PATHS``) that fails to come up then
stops start-up with the reason, since whoever installed or named it meant it to be used;
factories registered with ``fail_quietly=True``, the TPU plugin (as jax registers it), and a
GPU plugin on a machine that shows no such GPU (which jax skips) are recorded instead
([`backend_errors`][pjrt.registry.backend_errors]) and the others come up.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ._registry import discovery
from ._loading import startup
from .client import Client
from .plugin import Plugin, PluginTable, default_plugins
from ._registry.registrations import Registrations
# Re-exported (the ``X as X`` form) where the registry's users look for them: the
# registrations' types, whose home was this module; platform names, aliases and
# PJRT_PLATFORMS; whether discovery is running.
from ._registry.registrations import (BackendFactory as BackendFactory,
                                     BackendRegistration as BackendRegistration,
                                     Options as Options)
from ._loading.platforms import DEFAULT_PLUGIN_PRIORITY
from ._loading.platforms import (NON_EXPERIMENTAL_PLATFORMS as NON_EXPERIMENTAL_PLATFORMS,
                                 PLATFORM_ALIASES as PLATFORM_ALIASES,
                                 PLATFORMS_ENV as PLATFORMS_ENV,
                                 expand_platform_alias as expand_platform_alias,
                                 is_gpu as is_gpu, parse_platforms as parse_platforms)
from ._registry.discovery import discovering as discovering

if TYPE_CHECKING:
    from .compile_options import CompileOptions
    from .device import Device
    from .topology import DeviceTopology

logger = logging.getLogger(__name__)

_NVIDIA_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
#: The device nodes of AMD's GPU driver (KFD), and WSL's.
_AMD_DEVICE_NODES = ("/dev/kfd", "/dev/dxg")

#: jax registers its TPU backend with fail_quietly=True: libtpu is installed in many images
#: that run on machines without a TPU.
_QUIET_PLATFORMS = frozenset({"tpu"})


def _device_nodes(platform: str) -> tuple[str, ...] | None:
    """The device nodes whose presence says a ``platform`` GPU may be here (None: not a GPU)."""
    return {"cuda": _NVIDIA_DEVICE_NODES, "rocm": _AMD_DEVICE_NODES}.get(platform)


def _fails_quietly(name: str, registration: BackendRegistration) -> bool:
    """Whether backend ``name``, not asked for by name, is skipped rather than raised when it
    fails: as registered, or as jax treats it (TPU always; a GPU platform when the machine
    shows no such GPU, where jax does not even try)."""
    if registration.fail_quietly or name in _QUIET_PLATFORMS:
        return True
    nodes = _device_nodes(name)
    return nodes is not None and not any(os.path.exists(node) for node in nodes)


class BackendRegistry:
    """Backend factories, the clients they made and why others failed, behind one lock.

    What is registered, discovered and selected is kept by the
    `pjrt._registry.registrations.Registrations` it owns (``registered``); this class
    brings backends up from it and answers questions about them."""

    def __init__(self, plugins: PluginTable | None = None, *, discover: bool = True,
                 environ: Mapping[str, str] | None = None):
        """Args:
          plugins: where plugin libraries are loaded (a fresh table in tests).
          discover: look for installed plugin modules and PJRT_NAMES_AND_LIBRARY_PATHS.
          environ: the environment to read (``os.environ`` when None).
        """
        self._lock = threading.RLock()
        self._backends: dict[str, Client] | None = None
        self._errors: dict[str, str] = {}
        self._default: str | None = None
        self._warned_experimental: set[str] = set()
        #: What is registered, discovered and chosen, under this registry's lock.
        self.registered = Registrations(plugins, discover=discover, environ=environ,
                                        lock=self._lock, started=lambda: self._backends)

    # -- registration (kept by ``registered``) -----------------------------------------------

    def register_backend_factory(self, name: str, factory: BackendFactory, **fields: Any) -> None:
        """Register ``factory`` as the maker of backend ``name``
        (`pjrt._registry.registrations.Registrations.register_backend_factory`)."""
        self.registered.register_backend_factory(name, factory, **fields)

    def register_unavailable(self, name: str, error: Exception, **fields: Any) -> None:
        """Record that backend ``name`` cannot come up, and why
        (`pjrt._registry.registrations.Registrations.register_unavailable`)."""
        self.registered.register_unavailable(name, error, **fields)

    def register_plugin(self, plugin_name: str, *args: Any, **kwargs: Any) -> Plugin | None:
        """Load a PJRT plugin and register a backend that makes its client
        (`pjrt._registry.registrations.Registrations.register_plugin`)."""
        return self.registered.register_plugin(plugin_name, *args, **kwargs)

    def set_platforms(self, platforms: str | Sequence[str] | None) -> None:
        """Choose the platforms to bring up (overrides PJRT_PLATFORMS); None restores it
        (`pjrt._registry.registrations.Registrations.set_platforms`)."""
        self.registered.set_platforms(platforms)

    def selected_platforms(self) -> list[str] | None:
        """The platforms asked for (aliases expanded), or None for all."""
        return self.registered.selected_platforms()

    def platforms_variable(self) -> str:
        """PJRT_PLATFORMS, or JAX_PLATFORMS when only that is set."""
        return self.registered.platforms_variable()

    @property
    def discovery_records(self) -> list[discovery.DiscoveryRecord]:
        """What discovery did with each plugin module and library it found."""
        return self.registered.discovery_records

    @property
    def plugin_output(self) -> Any:
        """What plugins printed while discovered or brought up unasked, by backend."""
        return self.registered.plugin_output

    # -- initialisation --------------------------------------------------------------------

    def backends(self) -> dict[str, Client]:
        """Every backend that came up, by platform name (initialising on first call).

        Raises:
          RuntimeError: a platform asked for by name failed, or nothing came up; the
            message says which backends failed and why.
        """
        with self._lock:
            if self._backends is None:
                self.registered.discover()
                self._backends = {}
                try:
                    self._initialize_all()
                except BaseException:
                    self._backends = None
                    raise
                self._suggest_missing()
            return dict(self._backends)

    def _plan(self) -> list[tuple[str, int, bool]]:
        selected = self.selected_platforms()
        if selected is None:
            return [(name, r.priority, _fails_quietly(name, r))
                    for name, r in self.registered.entries.items()]
        # "gpu" expands to cuda and rocm; only the members that are registered are required,
        # but at least one must be, or asking for a GPU silently gives none.
        for alias in self.registered.requested():
            members = PLATFORM_ALIASES.get(alias)
            if members and not any(m in self.registered.entries for m in members):
                known = ", ".join(sorted(self.registered.entries)) or "none"
                raise RuntimeError(
                    f"{self.platforms_variable()} asks for {alias!r}, but no plugin for "
                    f"{' or '.join(members)} is registered (registered: {known}); install "
                    f"one, or remove {alias!r} from {self.platforms_variable()}")
        # Listed platforms: the order is the priority, and every one must come up.
        names = [p for p in selected if p in self.registered.entries or not self._is_alias_member(p)]
        return [(name, len(names) - i, False) for i, name in enumerate(names)]

    def _is_alias_member(self, platform: str) -> bool:
        return any(platform in PLATFORM_ALIASES.get(r, ()) for r in self.registered.requested())

    def _initialize_all(self) -> None:
        best = None
        # A backend not asked for by name: what its plugin prints is kept, not shown, whether
        # its failure would be quiet or not (a loud failure's reason is in its error, what
        # the plugin printed in backend_logs()).
        capture = self.registered.quiet and self.selected_platforms() is None
        for name, priority, fail_quietly in self._plan():
            try:
                client = self._initialize_one(name, capture=capture)
            except Exception as error:  # noqa: BLE001 - recorded, or raised with a hint
                reason = f"{type(error).__name__}: {error}"
                self._errors[name] = reason
                if not fail_quietly:
                    # The seed's words first (jax users' log filters and tests match them).
                    raise RuntimeError(f"Unable to initialize backend {name!r}: {error} "
                                       f"({type(error).__name__}; "
                                       f"{self._why_required(name)})") from error
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
        if self.registered.chosen_by_call():
            return ("it was asked for with set_platforms(); call set_platforms(None) to use "
                    "whatever comes up")
        if self.selected_platforms() is None:
            return self._why_loud(name)
        # Name what the user wrote: "gpu", not the "cuda" it stands for.
        written = next((r for r in self.registered.requested() if name in expand_platform_alias(r)), name)
        asked = f"{written!r}" + (f" (which stands for {name!r})" if written != name else "")
        variable = self.platforms_variable()
        return (f"it was asked for in {variable} as {asked}; set {variable}='' to use "
                f"whatever comes up, or remove {written!r} from it")

    def _why_loud(self, name: str) -> str:
        """Why backend ``name``, not asked for by name, stops start-up, and the ways out."""
        registration = self.registered.entries.get(name)
        variable = self.platforms_variable()
        skip = (f"set {variable}=cpu to skip this backend" if name != "cpu"
                else f"set {variable} to the platforms to use")
        if registration is not None and registration.source.startswith(discovery.ENV_VARIABLE):
            return (f"it is named in {discovery.ENV_VARIABLE}, and a plugin named there must "
                    f"come up; fix or remove that entry, or {skip}")
        if registration is not None and registration.module is not None:
            return (f"the plugin package {registration.module} registered it with "
                    f"fail_quietly=False, as jax's plugins do; you may need to uninstall the "
                    f"failing plugin package, or {skip}")
        return (f"it was registered with fail_quietly=False, so its failure stops start-up; "
                f"fix the cause, or {skip}")

    def _initialize_one(self, name: str, capture: bool = False) -> Client:
        registration = self.registered.entries.get(name)
        if registration is None:
            known = ", ".join(sorted(self.registered.entries)) or "none"
            raise RuntimeError(f"no backend named {name!r} is registered (registered: {known}); "
                               f"{_package_hint(name)}{self._failed_modules()}")
        client = startup.bring_up(name, registration.factory,
                                  timeout=startup.init_timeout(self.registered.environ),
                                  close=lambda client: client.close(),
                                  keep_output=lambda: self.plugin_output.kept(capture, name))
        if client is None or client.device_count() == 0:
            raise RuntimeError(f"Backend {name!r} provides no devices." if client is not None
                               else f"Could not initialize backend {name!r}: its factory "
                                    f"returned no client")
        # Only a backend that came up is worth this warning; one that failed says why instead.
        if registration.experimental and name not in self._warned_experimental:
            self._warned_experimental.add(name)
            logger.warning("Platform %r is experimental and not all JAX functionality may be "
                           "correctly supported! (its plugin is not one this project tests)",
                           name)
        return client

    def _nothing_came_up(self) -> str:
        if not self.registered.entries:  # the failures that left none registered lead
            return (f"no PJRT backend is registered{self._failed_modules(lead=True) or ':'} "
                    f"install a plugin package such as pjrt-cpu (pip install pjrt-cpu), or name "
                    f"a plugin library in {discovery.ENV_VARIABLE}")
        lines = [f"  {name}: {self._errors.get(name, 'not started')}"
                 for name in self.registered.entries]
        return "no PJRT backend could be started:\n" + "\n".join(lines)

    def _suggest_missing(self) -> None:
        if ("cuda" in self._backends  # pyright: ignore[reportOperatorIssue]
                or not any(os.path.exists(p) for p in _NVIDIA_DEVICE_NODES)):
            return
        selected = self.selected_platforms()
        if selected is not None and "cuda" not in selected:
            return  # the user chose the platforms; the GPU was left out on purpose
        # jax's words first, for those who filter jax's logs for them.
        if "cuda" in self._errors:
            logger.warning("CUDA backend failed to initialize: %s (an NVIDIA GPU seems "
                           "present)", self._errors["cuda"])
        elif "cuda" not in self.registered.entries:
            logger.warning("An NVIDIA GPU may be present on this machine, but no CUDA plugin "
                           "is installed; pip install pjrt-cuda to use it. Falling back to "
                           "%s.", self._default)

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
            self.registered.discover()
            return platform in self.registered.entries or platform in PLATFORM_ALIASES

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
        if selected is not None and platform in self.registered.entries:
            raise RuntimeError(f"Unknown backend {platform}: it is registered but not in "
                               f"{self.registered.selection_source()} ({','.join(selected)}); add it "
                               f"there to use it")
        raise RuntimeError(f"Unknown backend {platform}; backends available: "
                           f"{', '.join(backends)}")

    def default_backend(self) -> str:
        """The platform of the default backend (its client's ``platform``, as in jax): ``cpu``
        for a CPU plugin whatever name it was registered under."""
        return self.get_backend().platform

    def default_backend_name(self) -> str:
        """The name the default backend is registered under (``cpu2`` for a CPU plugin named
        so in PJRT_NAMES_AND_LIBRARY_PATHS; `default_backend` says ``cpu`` for it)."""
        self.backends()
        return self._default  # pyright: ignore[reportReturnType]

    def backend_errors(self) -> dict[str, str]:
        """Why each backend that failed to start failed (initialising them first if needed).

        Unlike [`backends`][pjrt.registry.backends], this answers even when initialisation raised (a platform
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
            self.registered.discover()
            return dict(self.registered.entries)

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
            self.registered.forget_discovered()

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
            self.registered.discover()
            registration = self.registered.entries.get(platform)
            if registration is not None:
                return registration
            known = ", ".join(sorted(self.registered.entries)) or "none"
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


default_registry = BackendRegistry(default_plugins)


# -- the module-level API, on the default registry ---------------------------------------------

def _target() -> tuple[BackendRegistry | Registrations, str, str | None]:
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


def register_plugin(plugin_name: str, priority: int = DEFAULT_PLUGIN_PRIORITY, library_path=None,
                    options=None, c_api=None, *, make_client=None, make_topology=None,
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
    """The client for ``platform`` (the default backend when None; a backend, as is)."""
    if platform is not None and not isinstance(platform, str):
        # jax's functions take a backend client too (any backend object a factory made)
        return platform
    return default_registry.get_backend(platform)


def default_backend() -> str:
    """The platform of the default backend (``get_backend().platform``, as in jax)."""
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
        raise ValueError(f"Unknown process_index {process_index}; the {client.platform} backend "
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


def backend_pjrt_c_api_version(platform: str | Client | None = None) -> tuple[int, int] | None:
    """``(major, minor)``: the PJRT C API version a backend's plugin was driven at.

    None for a backend that is not a PJRT C API client (a factory's own object), as in jax.

    Raises:
      RuntimeError: as [`get_backend`][pjrt.registry.get_backend] (unknown or failed backend).
    """
    backend = get_backend(platform)
    major = getattr(backend, "pjrt_c_api_major_version", None)
    minor = getattr(backend, "pjrt_c_api_minor_version", None)
    return None if major is None or minor is None else (major, minor)


def _plugin_attribute(backend: Any, name: str) -> Any:
    # jaxlib's clients answer a plugin attribute as an attribute of the client; ours keep
    # them on their plugin (PJRT_Plugin_Attributes).
    plugin = getattr(backend, "plugin", None)
    if isinstance(plugin, Plugin):
        return plugin.attributes().get(name)
    return getattr(backend, name, None)


def backend_xla_version(platform: str | Client | None = None) -> int | None:
    """The ``xla_version`` a backend's plugin reports among its attributes; None when it
    reports none (as in jax: a plugin built before XLA versioned its C API).

    Raises:
      RuntimeError: as [`get_backend`][pjrt.registry.get_backend] (unknown or failed backend).
    """
    return _plugin_attribute(get_backend(platform), "xla_version")


def backend_stablehlo_version(platform: str | Client | None = None) -> Sequence[int] | None:
    """The StableHLO version a backend's plugin reports as current
    (``stablehlo_current_version``, e.g. ``[1, 13, 3]``); None when it reports none.

    Raises:
      RuntimeError: as [`get_backend`][pjrt.registry.get_backend] (unknown or failed backend).
    """
    return _plugin_attribute(get_backend(platform), "stablehlo_current_version")


#: jax's ``profile_version`` for "no XLA-AutoFDO profile; do not look for one later".
NO_PROFILE_DONT_RETRIEVE = -1


def get_latest_profile_version(backend: Any) -> int:
    """The XLA-AutoFDO profile version to compile with when none is given; jax's hook, which
    a deployment with a profile service replaces. This one has none:
    `NO_PROFILE_DONT_RETRIEVE`. A hook returning 0 is an error (logged, and no profile used)."""
    del backend
    return NO_PROFILE_DONT_RETRIEVE


#: Options jax passes in ``env_options_overrides`` that are fields of the build options.
_BUILD_OPTION_OVERRIDES = ("exec_time_optimization_effort", "memory_fitting_effort",
                           "optimization_level", "memory_fitting_level")


def get_compile_options(num_replicas: int, num_partitions: int, device_assignment: Any = None,
                        use_spmd_partitioning: bool = True, use_shardy_partitioner: bool = True,
                        use_auto_spmd_partitioning: bool = False,
                        auto_spmd_partitioning_mesh_shape: Sequence[int] | None = None,
                        auto_spmd_partitioning_mesh_ids: Sequence[int] | None = None,
                        env_options_overrides: Mapping[str, Any] | None = None,
                        fdo_profile: bytes | None = None, detailed_logging: bool = True,
                        backend: Client | None = None, *,
                        profile_version: int = 0) -> CompileOptions:
    """Compile options as jax derives them for a program (jax's ``compiler.get_compile_options``).

    Args:
      num_replicas: replicas to compile for.
      num_partitions: partitions to compile for.
      device_assignment: which device runs each (replica, partition): a
        `DeviceAssignment`, or ids or devices shaped ``[num_replicas, num_partitions]``
        (a flat list when ``num_partitions`` is 1); None leaves the choice to the plugin.
      use_spmd_partitioning: SPMD partitioning (jax always uses it).
      use_shardy_partitioner: partition with Shardy rather than GSPMD (jax's default).
      use_auto_spmd_partitioning: let XLA choose the shardings, over a mesh of
        ``auto_spmd_partitioning_mesh_shape`` with device ids
        ``auto_spmd_partitioning_mesh_ids``.
      env_options_overrides: compiler options by name (``xla_*`` debug options and the
        like); ``exec_time_optimization_effort``, ``memory_fitting_effort``,
        ``optimization_level`` and ``memory_fitting_level`` set those build options instead.
        Written in name order: the options are a map, and the same map serializes the same.
      fdo_profile: a feedback-directed-optimisation profile for XLA.
      detailed_logging: whether XLA may log details about this compilation (its default;
        False is sent as ``xla_detailed_logging``).
      backend: the client compiled for, which `get_latest_profile_version` is asked about.
      profile_version: the XLA-AutoFDO profile version (jax's ``jax_xla_profile_version``);
        0 asks `get_latest_profile_version` when ``backend`` is given, else none is used.

    Returns:
      A [`CompileOptions`][pjrt.compile_options.CompileOptions].

    Raises:
      ValueError: ``device_assignment`` does not match ``num_replicas`` or
        ``num_partitions``.
    """
    from .compile_options import CompileOptions, DeviceAssignment

    options = CompileOptions()
    options.num_replicas = num_replicas
    options.num_partitions = num_partitions
    build = options.executable_build_options
    build.use_spmd_partitioning = use_spmd_partitioning
    build.use_shardy_partitioner = use_shardy_partitioner
    build.use_auto_spmd_partitioning = use_auto_spmd_partitioning
    if auto_spmd_partitioning_mesh_shape is not None:
        build.auto_spmd_partitioning_mesh_shape = list(auto_spmd_partitioning_mesh_shape)
    if auto_spmd_partitioning_mesh_ids is not None:
        build.auto_spmd_partitioning_mesh_ids = list(auto_spmd_partitioning_mesh_ids)
    if fdo_profile is not None:
        build.fdo_profile = fdo_profile
    if device_assignment is not None:
        if not isinstance(device_assignment, DeviceAssignment):
            device_assignment = DeviceAssignment.create(
                _device_ids(device_assignment, num_replicas, num_partitions))
        if (device_assignment.replica_count(), device_assignment.computation_count()) != (
                num_replicas, num_partitions):
            raise ValueError(
                f"device_assignment is {device_assignment.replica_count()}x"
                f"{device_assignment.computation_count()} but the program has {num_replicas} "
                f"replicas x {num_partitions} partitions; give one device per replica and "
                f"partition")
        options.device_assignment = device_assignment
    overrides = dict(env_options_overrides or {})
    for name in _BUILD_OPTION_OVERRIDES:
        if name in overrides:
            setattr(build, name, overrides.pop(name))
    if not detailed_logging and "xla_detailed_logging" not in overrides:  # the user's wins
        build.debug_options.xla_detailed_logging = False
    options.env_option_overrides = sorted(overrides.items())
    if profile_version > 0:
        options.profile_version = profile_version
    else:
        options.profile_version = NO_PROFILE_DONT_RETRIEVE
        if backend is not None:
            latest = get_latest_profile_version(backend)
            if latest != 0:
                options.profile_version = latest
            else:
                logger.error("get_compile_options: the XLA-AutoFDO profile version is 0; "
                             "get_latest_profile_version should return a version or %d",
                             NO_PROFILE_DONT_RETRIEVE)
    return options


def _device_ids(assignment: Any, num_replicas: int, num_partitions: int) -> Any:
    """Device ids shaped ``[num_replicas, num_partitions]`` from ids or devices, as jax
    accepts them (a flat list when there is one partition)."""
    import numbers

    import numpy as np

    from .device import Device

    array = np.array(assignment, dtype=object)
    if array.ndim == 1 and num_partitions == 1:
        array = array[:, None]
    if array.ndim < 1 or array.shape[0] != num_replicas:
        raise ValueError(f"device_assignment does not match num_replicas: {assignment} vs "
                         f"{num_replicas}; give one row of devices per replica")
    if array.ndim != 2 or array.shape[1] != num_partitions:
        raise ValueError(f"device_assignment does not match num_partitions: {assignment} vs "
                         f"{num_partitions}; give one device per partition in each row")

    def device_id(entry: Any) -> int:
        if isinstance(entry, Device):
            return entry.id
        if isinstance(entry, numbers.Integral) and not isinstance(entry, bool):
            return int(entry)
        raise TypeError(f"device_assignment holds {entry!r}; give devices or integer device "
                        f"ids")

    return np.array([[device_id(entry) for entry in row] for row in array], dtype=np.int64)



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
