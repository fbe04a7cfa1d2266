"""AMD's ROCm PJRT plugin, packaged for the pjrt host.

The plugin library comes from the ``jax-rocm7-pjrt`` wheel. Unlike the CUDA plugin, it links
directly against ROCm's libraries (HIP, hipBLASLt, MIOpen, rocprofiler-sdk, ...), so on a
machine without ROCm 7 it cannot even be loaded. pjrt reports that as a PluginLoadError naming
the missing library; this package adds what to do about it (install ROCm, or point the loader
at it) and records that as the rocm backend's reason in ``pjrt.backend_errors()``.

The wheel's own ``jax_plugins.xla_rocm7`` module imports jax; it is found without being
imported, and pjrt's discovery skips it once this package has registered ``rocm``.
"""
from __future__ import annotations

from pjrt import plugin_api

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "rocm"

#: Default-backend priority: a GPU outranks the TPU (300) and the CPU (0), as in JAX.
PRIORITY = 500

#: Where to read how to install ROCm.
ROCM_INSTALL_URL = "https://rocm.docs.amd.com/projects/install-on-linux/en/latest/"

#: The usual library directory of a ROCm installation.
ROCM_LIBRARY_DIR = "/opt/rocm/lib"

_LIBRARY_MODULE = "jax_plugins.xla_rocm7"
_LIBRARY_FILE = "xla_rocm_plugin.so"


def library_path() -> str:
    """Absolute path of the ROCm plugin library inside the jax-rocm7-pjrt wheel.

    Raises:
      FileNotFoundError: jax-rocm7-pjrt is not installed, or its library is missing.
    """
    return plugin_api.find_module_library(_LIBRARY_MODULE, _LIBRARY_FILE, "jax-rocm7-pjrt")


def install_hint(missing_library: str | None) -> str:
    """What to tell someone whose ROCm plugin cannot find ``missing_library``."""
    what = missing_library or "a ROCm library"
    return (f"it needs {what}, which comes with ROCm and was not found. Install ROCm 7 (see "
            f"{ROCM_INSTALL_URL}; e.g. the `rocm` meta-package), or, if ROCm is installed "
            f"outside the loader's path, add its library directory (usually {ROCM_LIBRARY_DIR}) "
            f"to LD_LIBRARY_PATH")


def explain_load_error(error):
    """A PluginLoadError like ``error``, with the ROCm install hint when a library is missing.

    ``path`` and ``missing_library`` are kept; errors with no missing library are returned
    unchanged.
    """
    if getattr(error, "missing_library", None) is None:
        return error
    # Keep the loader's own words, which pjrt puts last.
    loader = str(error).partition("The loader said: ")[2] or str(error)
    return plugin_api.PluginLoadError(f"the ROCm plugin {error.path} cannot be loaded: "
                           f"{install_hint(error.missing_library)}. The loader said: {loader}",
                           path=error.path, missing_library=error.missing_library)


#: The plugin, as pjrt discovers it. JAX gets ROCm from the jax-rocm7-pjrt wheel's own
#: ``jax_plugins.xla_rocm7`` module, so under JAX this package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, explain_load_error=explain_load_error,
    version=__version__, serve_jax=False)


def initialize() -> None:
    """Register the ROCm plugin with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point; under JAX it does
    nothing. When the library cannot be loaded, the failure, with the ROCm hint, is
    registered as the backend's reason and raised for discovery to record.
    """
    PLUGIN.initialize()
