"""XLA's CPU PJRT plugin, packaged for the pjrt host.

The plugin library itself comes from the ``xla-cpu-pjrt`` distribution; this package finds it
and registers it with pjrt's backend registry when pjrt discovers installed plugins (through
the ``jax_plugins`` entry point, which calls [`initialize`][pjrt_cpu.initialize]).
"""
from __future__ import annotations

import os
import warnings

from pjrt import plugin_api

from .lapack import register_lapack_kernels
from .cpu_sparse import register_sparse_kernels

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cpu"

#: Default-backend priority: the platform's entry in pjrt's one table of priorities (a GPU
#: outranks the TPU, which outranks the CPU, as in JAX).
PRIORITY = plugin_api.PLATFORM_PRIORITIES[PLATFORM]

#: Environment variable with the number of CPU devices a client exposes.
DEVICE_COUNT_ENV = "PJRT_CPU_DEVICE_COUNT"

_LIBRARY_MODULE = "xla_plugins.xla_cpu_pjrt"
_LIBRARY_FILE = "xla_cpu_pjrt.so"


def library_path() -> str:
    """Absolute path of XLA's CPU plugin library.

    Raises:
      FileNotFoundError: ``xla-cpu-pjrt`` is not installed, or its library is missing.
    """
    return plugin_api.find_module_library(_LIBRARY_MODULE, _LIBRARY_FILE, "xla-cpu-pjrt")


#: The most CPU devices a client is made with: client creation in XLA's CPU plugin is
#: quadratic in the device count.
MAX_DEVICES = 8192


def client_options(num_devices: int | None = None) -> dict:
    """Create options for a CPU client: ``num_devices``, else PJRT_CPU_DEVICE_COUNT, else none.

    Raises:
      ValueError: the environment variable is not a positive integer (the message names it).
    """
    if num_devices is None:
        value = os.environ.get(DEVICE_COUNT_ENV, "").strip()
        if not value:
            return {}
        try:
            num_devices = int(value)
        except ValueError:
            raise ValueError(f"{DEVICE_COUNT_ENV}={value!r} is not an integer; set it to the "
                             f"number of CPU devices (1 or more), or unset it") from None
        if num_devices < 1:
            raise ValueError(f"{DEVICE_COUNT_ENV}={value!r}: the number of CPU devices must be "
                             f"at least 1; set it to 1 or more, or unset it")
    if num_devices < 1:
        raise ValueError(f"the number of CPU devices must be at least 1, not {num_devices}")
    if num_devices > MAX_DEVICES:
        raise ValueError(
            f"{num_devices} CPU devices asked for (through {DEVICE_COUNT_ENV} or num_devices); "
            f"XLA's CPU plugin takes time growing with the square of the device count to make "
            f"a client (about 4.5 s for 4000 devices on a 2-core machine), so more than "
            f"{MAX_DEVICES} would look like a hang. Ask for {MAX_DEVICES} or fewer")
    return {"cpu_device_count": int(num_devices)}


def _register_kernels() -> None:
    try:
        register_lapack_kernels(PLATFORM)
        register_sparse_kernels(PLATFORM)
    except (ImportError, OSError, RuntimeError) as exc:
        # The plugin is still useful without them; only linear algebra needs the kernels.
        warnings.warn(f"pjrt_cpu: the LAPACK and sparse custom-call kernels are unavailable "
                      f"({exc}); programs using jnp.linalg or jax.experimental.sparse will "
                      f"fail to compile", RuntimeWarning,
                      stacklevel=3)


def _create(plugin, options: dict):
    # The kernels are registered with pjrt before the client comes up, which is when pjrt
    # hands them to the plugin (registering again is a no-op).
    _register_kernels()
    return plugin_api.create_client(plugin, options)


def _new_client(plugin, num_devices: int | None = None):
    return _create(plugin, client_options(num_devices))


def make_cpu_client(num_devices: int | None = None):
    """A new client of XLA's CPU plugin with ``num_devices`` devices (else
    PJRT_CPU_DEVICE_COUNT, else the plugin's own default).

    Raises:
      FileNotFoundError: ``xla-cpu-pjrt`` is not installed.
      ValueError: ``num_devices`` (or the variable) is not a positive integer.
    """
    return _new_client(plugin_api.load_plugin(PLATFORM, library_path()), num_devices)


#: The plugin, as pjrt and JAX discover it. JAX has a CPU backend of its own, so under JAX
#: this package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, options=client_options,
    make_client=_create, new_client=_new_client, version=__version__, serve_jax=False)


def initialize() -> None:
    """Register the CPU plugin with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point. Under JAX it does
    nothing: JAX has its own CPU backend and kernels. Otherwise the LAPACK custom-call kernels
    are registered with pjrt for the ``cpu`` platform (see [`pjrt_cpu.lapack`][pjrt_cpu.lapack]), and, while
    pjrt discovers, the plugin. The device count (PJRT_CPU_DEVICE_COUNT) is read when the
    client is made, so a bad value is the ``cpu`` backend's reason, not a missing backend.
    """
    if plugin_api.jax_is_calling() is not None:
        return
    _register_kernels()
    PLUGIN.initialize()
