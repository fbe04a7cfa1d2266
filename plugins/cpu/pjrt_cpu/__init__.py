"""XLA's CPU PJRT plugin, packaged for the pjrt host.

The plugin library itself comes from the ``xla-cpu-pjrt`` distribution; this package finds it
and registers it with pjrt's backend registry when pjrt discovers installed plugins (through
the ``jax_plugins`` entry point, which calls :func:`initialize`).
"""
from __future__ import annotations

import os
import sys
import warnings

from .lapack import register_lapack_kernels

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cpu"

#: Default-backend priority: the lowest, so any accelerator plugin is preferred.
PRIORITY = 0

#: Environment variable with the number of CPU devices a client exposes.
DEVICE_COUNT_ENV = "PJRT_CPU_DEVICE_COUNT"

_LIBRARY_MODULE = "xla_plugins.xla_cpu_pjrt"
_LIBRARY_FILE = "xla_cpu_pjrt.so"


def library_path() -> str:
    """Absolute path of XLA's CPU plugin library.

    Raises:
      FileNotFoundError: ``xla-cpu-pjrt`` is not installed, or its library is missing.
    """
    from pjrt.plugin_support import find_module_library

    return find_module_library(_LIBRARY_MODULE, _LIBRARY_FILE, "xla-cpu-pjrt")


def client_options(num_devices: int | None = None) -> dict:
    """Create options for a CPU client: ``num_devices``, else PJRT_CPU_DEVICE_COUNT, else none.

    Raises:
      ValueError: the environment variable is not a positive integer.
    """
    if num_devices is None:
        value = os.environ.get(DEVICE_COUNT_ENV, "").strip()
        if not value:
            return {}
        try:
            num_devices = int(value)
        except ValueError:
            raise ValueError(f"{DEVICE_COUNT_ENV}={value!r} is not an integer") from None
    if num_devices < 1:
        raise ValueError(f"the number of CPU devices must be at least 1, not {num_devices}")
    return {"cpu_device_count": int(num_devices)}


def initialize() -> None:
    """Register the CPU plugin with pjrt's registry, and the LAPACK kernels jax programs need.

    pjrt's discovery calls this through the ``jax_plugins`` entry point. JAX calls every
    ``jax_plugins`` entry point too; then pjrt is not imported, and this does nothing. With
    pjrt imported, the LAPACK custom-call handlers are always registered for the ``cpu``
    platform (see :mod:`pjrt_cpu.lapack`); registering the plugin itself happens only while
    pjrt is discovering.
    """
    if "pjrt" not in sys.modules:
        return
    try:
        register_lapack_kernels(PLATFORM)
    except (ImportError, OSError, RuntimeError) as exc:
        # The plugin is still useful without them; only linear algebra needs the kernels.
        warnings.warn(f"pjrt_cpu: the LAPACK custom-call kernels are unavailable ({exc}); "
                      f"programs using jnp.linalg will fail to compile", RuntimeWarning,
                      stacklevel=2)
    registry = sys.modules.get("pjrt.registry")
    if registry is None or not registry.discovering():
        return
    registry.register_plugin(PLATFORM, priority=PRIORITY, library_path=library_path(),
                             options=client_options())
