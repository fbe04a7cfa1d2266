"""The backends this process can use, made lazily from registered factories.

A backend is a :class:`~pjrt.client.Client` made by a factory registered under a platform
name. Nothing is made before the first question; then every factory is tried once, in priority
order, and the results (clients, or the reasons they failed) are kept. The state lives in a
:class:`BackendRegistry`; the module-level functions use one default instance.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable

from .client import Client

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class BackendRegistration:
    """One registered backend factory."""

    #: Makes the client; called at most once, on first use of the registry.
    factory: Callable[[], Client]
    #: Higher wins the default; CPU is 0 so that any accelerator plugin outranks it.
    priority: int = 0
    #: When True a failing factory is recorded and skipped, rather than raised.
    fail_quietly: bool = True


class BackendRegistry:
    """Backend factories and the clients they made, behind one lock."""

    def __init__(self):
        self._lock = threading.RLock()
        self._registrations: dict[str, BackendRegistration] = {}
        self._backends: dict[str, Client] | None = None
        self._errors: dict[str, str] = {}

    def register_backend_factory(self, name: str, factory: Callable[[], Client], *,
                                 priority: int = 0, fail_quietly: bool = True) -> None:
        """Register ``factory`` as the maker of backend ``name``.

        Raises:
          RuntimeError: backends were already initialised (call :meth:`clear_backends` first).
        """
        with self._lock:
            if self._backends is not None:
                raise RuntimeError(f"cannot register backend {name!r}: backends are already "
                                   f"initialised; call clear_backends() first")
            self._registrations[name] = BackendRegistration(factory, priority, fail_quietly)

    def backends(self) -> dict[str, Client]:
        """Every backend that came up, by platform name (initialising them on first call)."""
        with self._lock:
            if self._backends is None:
                self._backends = self._initialize_all()
            return dict(self._backends)

    def _initialize_all(self) -> dict[str, Client]:
        made: dict[str, Client] = {}
        order = sorted(self._registrations.items(), key=lambda item: -item[1].priority)
        for name, registration in order:
            try:
                made[name] = registration.factory()
            except Exception as error:  # noqa: BLE001 - recorded, and raised if not quiet
                self._errors[name] = f"{type(error).__name__}: {error}"
                if not registration.fail_quietly:
                    raise
                logger.info("backend %r did not start: %s", name, error)
        return made

    def backend_errors(self) -> dict[str, str]:
        """Why each backend that failed to start failed."""
        self.backends()
        with self._lock:
            return dict(self._errors)

    def get_backend(self, platform: str | None = None) -> Client:
        """The backend for ``platform``, or the default one.

        Raises:
          RuntimeError: no such backend came up; the message lists each backend and why.
        """
        backends = self.backends()
        if platform is None:
            if not backends:
                raise RuntimeError(self._nothing_came_up())
            return backends[self.default_backend()]
        if platform in backends:
            return backends[platform]
        reason = self._errors.get(platform)
        if reason:
            raise RuntimeError(f"backend {platform!r} failed to start: {reason}")
        known = ", ".join(sorted(backends)) or "none"
        raise RuntimeError(f"unknown backend {platform!r}; backends available: {known}")

    def default_backend(self) -> str:
        """The platform name of the highest-priority backend that came up."""
        backends = self.backends()
        if not backends:
            raise RuntimeError(self._nothing_came_up())
        return max(backends, key=lambda name: self._registrations[name].priority)

    def _nothing_came_up(self) -> str:
        if not self._registrations:
            return ("no PJRT backend is registered: install a plugin package such as pjrt-cpu "
                    "(pip install ./plugins/cpu)")
        lines = [f"  {name}: {self._errors.get(name, 'not started')}" for name in self._registrations]
        return "no PJRT backend could be started:\n" + "\n".join(lines)

    def clear_backends(self) -> None:
        """Forget the clients made so far (closing them); the next question starts afresh."""
        with self._lock:
            for client in (self._backends or {}).values():
                client.close()
            self._backends = None
            self._errors = {}

    def backends_are_initialized(self) -> bool:
        with self._lock:
            return self._backends is not None


def _make_cpu_backend() -> Client:
    import os

    try:
        import pjrt_cpu
    except ImportError as error:
        raise RuntimeError("the CPU plugin package is not installed: pip install ./plugins/cpu "
                           "(pjrt-cpu)") from error
    from .client import make_c_api_client
    from .plugin import load_pjrt_plugin_dynamically

    load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    options = {}
    count = os.environ.get("PJRT_CPU_DEVICE_COUNT")
    if count:
        options["cpu_device_count"] = int(count)
    return make_c_api_client("cpu", options)


default_registry = BackendRegistry()
default_registry.register_backend_factory("cpu", _make_cpu_backend, priority=0)


def backends() -> dict[str, Client]:
    """Every backend that came up, by platform name."""
    return default_registry.backends()


def get_backend(platform: str | None = None) -> Client:
    """The client for ``platform`` (the default backend when None)."""
    return default_registry.get_backend(platform)


def default_backend() -> str:
    """The platform name of the default backend."""
    return default_registry.default_backend()


def devices(backend: str | None = None) -> list:
    """All devices of ``backend`` (the default backend when None)."""
    return get_backend(backend).devices()


def local_devices(backend: str | None = None) -> list:
    """The devices of ``backend`` this process can address."""
    return get_backend(backend).local_devices()


def device_count(backend: str | None = None) -> int:
    return get_backend(backend).device_count()


def local_device_count(backend: str | None = None) -> int:
    return get_backend(backend).local_device_count()
