"""The backends this process can use: registered lazily, initialised once, chosen by priority.

A backend is a [`Client`][pjrt.client.Client] made by a factory registered under a platform name
(``cpu``, ``cuda``, ``rocm``, ``tpu``, or a vendor's own). Nothing happens at import: on the
first question the installed plugins are discovered (entry points, ``jax_plugins`` modules and
``PJRT_NAMES_AND_LIBRARY_PATHS``; see the operators' guide), then each
selected factory is called once. The state lives in a [`BackendRegistry`][pjrt.registry.BackendRegistry] behind one
lock; the module-level functions use `default_registry` and keep JAX's names.

``PJRT_PLATFORMS=cuda,cpu`` (or [`set_platforms`][pjrt.registry.set_platforms]) lists the platforms to bring up, the
first the default; each must come up, and the others are never loaded. Unset, every backend
is tried, failures are kept ([`backend_errors`][pjrt.registry.backend_errors]), and the highest priority up is default.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._registry import discovery
from ._loading import startup
from .client import Client
from .plugin import Plugin, default_plugins
from ._registry.registrations import BackendRegistrations
# Re-exported (the ``X as X`` form) where the registry's users look for them: the
# registrations' types, whose home was this module; platform names, aliases and
# PJRT_PLATFORMS; whether discovery is running.
from ._registry.registrations import (BackendFactory as BackendFactory,
                                     BackendRegistration as BackendRegistration,
                                     Options as Options)
from ._loading.platforms import (NON_EXPERIMENTAL_PLATFORMS as NON_EXPERIMENTAL_PLATFORMS,
                                 PLATFORM_ALIASES as PLATFORM_ALIASES,
                                 PLATFORMS_ENV as PLATFORMS_ENV,
                                 expand_platform_alias as expand_platform_alias,
                                 is_gpu as is_gpu, parse_platforms as parse_platforms)
from ._registry.discovery import discovering as discovering

if TYPE_CHECKING:
    from .device import Device
    from .topology import DeviceTopology

logger = logging.getLogger(__name__)

_NVIDIA_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")


class BackendRegistry(BackendRegistrations):
    """Backend factories, the clients they made and why others failed, behind one lock.

    What is registered, discovered and selected is kept by the base class
    (`pjrt.registrations.BackendRegistrations`); this class brings backends up and answers
    questions about them."""

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
        return parse_platforms(self._env(self.platforms_variable())) or []

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
                    f"{self.platforms_variable()} asks for {alias!r}, but no plugin for "
                    f"{' or '.join(members)} is registered (registered: {known}); install "
                    f"one, or remove {alias!r} from {self.platforms_variable()}")
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

    def _selection_source(self) -> str:
        """Where the platforms to bring up were chosen, in words."""
        if self._platforms_override is not None:
            return "set_platforms()"
        return self.platforms_variable()

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
        variable = self.platforms_variable()
        return (f"it was asked for in {variable} as {asked}; set {variable}='' to use "
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
            raise RuntimeError(f"Unknown backend {platform}: it is registered but not in "
                               f"{self._selection_source()} ({','.join(selected)}); add it "
                               f"there to use it")
        raise RuntimeError(f"Unknown backend {platform}; backends available: "
                           f"{', '.join(backends)}")

    def default_backend(self) -> str:
        """The platform name of the default backend."""
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
