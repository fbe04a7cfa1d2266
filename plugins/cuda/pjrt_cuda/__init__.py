"""NVIDIA's CUDA PJRT plugin, packaged for the pjrt host.

The plugin library comes from the ``jax-cuda12-pjrt`` wheel (published by the JAX authors).
That wheel also installs a ``jax_plugins.xla_cuda12`` module written for JAX: it imports jax,
so this package finds the library beside it without importing it, and pjrt's discovery skips
that module once this package serves ``cuda``.

Registration is cheap and needs no GPU: :func:`initialize` only loads the plugin library (a
CPU-only machine can do that) and registers a factory. The work that needs the CUDA libraries
happens in the factory, when the backend is first brought up: it reads the client options from
the environment (:func:`generate_pjrt_gpu_plugin_options`), preloads the NVIDIA pip libraries
and checks their versions (:mod:`pjrt_cuda.libraries`), then creates the client. Whatever fails
there is recorded as the cuda backend's reason in ``pjrt.backend_errors()``, and the other
backends still come up.
"""
from __future__ import annotations

import logging
import os
import sys

from .options import generate_pjrt_gpu_plugin_options, parse_visible_devices

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cuda"

#: Default-backend priority: a GPU outranks the TPU (300) and the CPU (0), as in JAX.
PRIORITY = 500

#: Set to 1 to create the client even when a pip-installed CUDA library looks too old.
SKIP_VERSION_CHECK_ENV = "PJRT_CUDA_SKIP_VERSION_CHECK"

_LIBRARY_MODULE = "jax_plugins.xla_cuda12"
_LIBRARY_FILE = "xla_cuda_plugin.so"

logger = logging.getLogger(__name__)

__all__ = ["PLATFORM", "PRIORITY", "library_path", "client_options", "initialize",
           "make_client", "prepare_cuda_libraries", "generate_pjrt_gpu_plugin_options",
           "parse_visible_devices"]


def library_path() -> str:
    """Absolute path of the CUDA plugin library inside the jax-cuda12-pjrt wheel.

    Found with ``importlib.util.find_spec``, which locates ``jax_plugins.xla_cuda12`` without
    running it (running it would import jax).

    Raises:
      FileNotFoundError: jax-cuda12-pjrt is not installed, or its library is missing.
    """
    from pjrt.plugin_support import find_module_library

    return find_module_library(_LIBRARY_MODULE, _LIBRARY_FILE, "jax-cuda12-pjrt")


def client_options() -> dict:
    """Create options for a CUDA client, from the environment.

    Same as :func:`generate_pjrt_gpu_plugin_options`; named like ``pjrt_cpu.client_options``.
    """
    return generate_pjrt_gpu_plugin_options()


def prepare_cuda_libraries() -> list:
    """Preload the NVIDIA pip libraries and check their versions (unless skipped).

    Returns:
      The :class:`~pjrt_cuda.libraries.FoundLibrary` entries found (empty without any).

    Raises:
      CudaLibraryVersionError: one is older than the plugin needs.
    """
    from . import libraries

    found = libraries.find_cuda_libraries(preload=True)
    for entry in found:
        logger.debug("CUDA library %s %s from %s (version from %s)", entry.component.name,
                     entry.version_text, entry.directory, entry.version_source)
    if os.environ.get(SKIP_VERSION_CHECK_ENV, "").strip() not in ("", "0"):
        logger.info("%s is set: not checking the CUDA libraries' versions", SKIP_VERSION_CHECK_ENV)
    else:
        libraries.check_versions(found)
    return found


def make_client(plugin, options: dict | None = None):
    """Create a CUDA client of the loaded ``plugin``: options, libraries, then the client.

    Args:
      plugin: the loaded CUDA :class:`pjrt.Plugin`.
      options: create options; from the environment when None.

    Raises:
      ValueError: an XLA_* or PJRT_CUDA_* variable has a bad value (named in the message).
      CudaLibraryVersionError: a pip-installed CUDA library is too old.
      XlaRuntimeError: the plugin refused, e.g. FAILED_PRECONDITION without a visible GPU.
    """
    from pjrt.client import create_client

    if options is None:
        options = generate_pjrt_gpu_plugin_options()
    prepare_cuda_libraries()
    return create_client(plugin, options)


def initialize() -> None:
    """Register the CUDA plugin with pjrt's registry.

    pjrt's discovery calls this through the ``jax_plugins`` entry point. JAX calls every
    ``jax_plugins`` entry point too; then pjrt is not discovering and this does nothing.
    A missing plugin library is registered as the backend's failure, so that
    ``pjrt.backend_errors()`` says why cuda is absent.
    """
    registry = sys.modules.get("pjrt.registry")
    if registry is None or not registry.discovering():
        return
    from pjrt.errors import PluginLoadError

    try:
        path = library_path()
    except FileNotFoundError as error:
        failure = PluginLoadError(str(error))
        registry.register_unavailable(PLATFORM, failure, priority=PRIORITY)
        raise failure from error
    # register_plugin loads the library (no GPU needed) and records a failure to load as the
    # backend's reason; it returns None when PJRT_PLATFORMS leaves cuda out.
    plugin = registry.register_plugin(PLATFORM, priority=PRIORITY, library_path=path)
    if plugin is None:
        return
    # Replace its factory with ours, which reads options and checks libraries only when the
    # backend is brought up, and keep its topology factory.
    registry.register_backend_factory(PLATFORM, lambda: make_client(plugin), priority=PRIORITY,
                                      make_topology=_topology_factory(plugin))


def _topology_factory(plugin):
    def make_topology(topology_name: str = "", **options):
        from pjrt.topology import make_topology as make

        return make(plugin, topology_name, options)
    return make_topology

