"""NVIDIA's CUDA PJRT plugin, packaged for the pjrt host.

The plugin library comes from one of the JAX authors' wheels: ``jax-cuda13-pjrt`` (installed
by ``pip install 'pjrt-cuda[cuda13]'``) or ``jax-cuda12-pjrt`` (``pjrt-cuda[cuda12]``), the
same choice ``jax[cuda13]`` / ``jax[cuda12]`` offers. When both are installed CUDA 13 is used;
[`vendor_plugin`][pjrt_cuda.vendor_plugin] says which was found. Each wheel also installs a ``jax_plugins.xla_cudaNN``
module written for JAX: it imports jax, so this package finds the library beside it without
importing it, and pjrt's discovery skips that module once this package serves ``cuda``.

Registration is cheap and needs no GPU: [`initialize`][pjrt_cuda.initialize] only loads the plugin library (a
CPU-only machine can do that) and registers a factory. The work that needs the CUDA libraries
happens in the factory, when the backend is first brought up: it reads the client options from
the environment (`generate_pjrt_gpu_plugin_options`), preloads the NVIDIA pip libraries
and checks their versions (`pjrt_cuda.libraries`), then creates the client. Whatever fails
there is recorded as the cuda backend's reason in ``pjrt.backend_errors()``, and the other
backends still come up.
"""
from __future__ import annotations

import dataclasses
import logging
import os

from pjrt import plugin_api

from .options import OPTION_TYPES, generate_pjrt_gpu_plugin_options, parse_visible_devices

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cuda"

#: Default-backend priority: the platform's entry in pjrt's one table of priorities (a GPU
#: outranks the TPU, which outranks the CPU, as in JAX).
PRIORITY = plugin_api.PLATFORM_PRIORITIES[PLATFORM]

#: Set to 1 to create the client even when a pip-installed CUDA library looks too old.
SKIP_VERSION_CHECK_ENV = "PJRT_CUDA_SKIP_VERSION_CHECK"

_LIBRARY_FILE = "xla_cuda_plugin.so"

#: The vendor wheels this package drives, preferred first: (CUDA major, distribution, module).
VENDOR_WHEELS: tuple = (
    (13, "jax-cuda13-pjrt", "jax_plugins.xla_cuda13"),
    (12, "jax-cuda12-pjrt", "jax_plugins.xla_cuda12"),
)

logger = logging.getLogger(__name__)

__all__ = ["PLATFORM", "PRIORITY", "VendorPlugin", "vendor_plugin", "library_path", "client_options", "initialize",
           "make_client", "prepare_cuda_libraries", "generate_pjrt_gpu_plugin_options",
           "parse_visible_devices", "register_kernels"]


@dataclasses.dataclass(frozen=True)
class VendorPlugin:
    """The CUDA plugin wheel found: which toolkit, which release, and its library."""

    #: The CUDA major version the wheel is built for: 13 or 12.
    cuda: int
    #: Its distribution name, e.g. ``jax-cuda13-pjrt``.
    distribution: str
    #: Its installed version, e.g. ``0.12.0.1`` (None when its metadata is unreadable).
    version: str | None
    #: The plugin library's absolute path.
    library: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version or '(version unknown)'}"


def vendor_plugin() -> VendorPlugin:
    """The installed CUDA plugin wheel, CUDA 13 first when both are installed.

    Found with ``importlib.util.find_spec``, which locates ``jax_plugins.xla_cudaNN`` without
    running it (running it would import jax).

    Raises:
      FileNotFoundError: neither jax-cuda13-pjrt nor jax-cuda12-pjrt is installed (the message
        says how to install one), or the installed one lacks its library.
    """
    for cuda, distribution, module in VENDOR_WHEELS:
        found = plugin_api.find_installed_wheel(module, _LIBRARY_FILE, distribution)
        if found is not None:
            library, version = found
            return VendorPlugin(cuda, distribution, version, library)
    raise FileNotFoundError(
        "no CUDA plugin wheel is installed (pjrt-cuda drives jax-cuda13-pjrt or "
        "jax-cuda12-pjrt); install one with pip install 'pjrt-cuda[cuda13]' (CUDA 13, "
        "driver 580 or newer) or pip install 'pjrt-cuda[cuda12]' (CUDA 12)")


def library_path() -> str:
    """Absolute path of the CUDA plugin library inside the vendor wheel found by
    [`vendor_plugin`][pjrt_cuda.vendor_plugin] (jax-cuda13-pjrt, else jax-cuda12-pjrt).

    Raises:
      FileNotFoundError: neither wheel is installed, or its library is missing.
    """
    return vendor_plugin().library


def client_options() -> dict:
    """Create options for a CUDA client, from the environment.

    Same as `generate_pjrt_gpu_plugin_options`; named like ``pjrt_cpu.client_options``.
    """
    return generate_pjrt_gpu_plugin_options()


def prepare_cuda_libraries() -> list:
    """Preload the NVIDIA pip libraries and check their versions (unless skipped).

    Returns:
      The `FoundLibrary` entries found (empty without any).

    Raises:
      CudaLibraryVersionError: one is older than the plugin needs.
    """
    from . import libraries

    vendor = vendor_plugin()
    found = libraries.find_cuda_libraries(preload=True, cuda=vendor.cuda)
    for entry in found:
        logger.debug("CUDA library %s %s from %s (version from %s)", entry.component.name,
                     entry.version_text, entry.directory, entry.version_source)
    if os.environ.get(SKIP_VERSION_CHECK_ENV, "").strip() not in ("", "0"):
        logger.info("%s is set: not checking the CUDA libraries' versions", SKIP_VERSION_CHECK_ENV)
    else:
        libraries.check_versions(found, str(vendor))
    return found


def make_client(plugin, options: dict | None = None, *, distributed_client=None):
    """Create a CUDA client of the loaded ``plugin``: options, libraries, then the client.

    Args:
      plugin: the loaded CUDA `pjrt.Plugin`.
      options: create options; from the environment when None.
      distributed_client: a key-value store making a client of several processes (see
        [`pjrt.client.create_client`][pjrt.client.create_client]).

    The CUDA kernels jax's programs call are registered first ([`register_kernels`][pjrt_cuda.register_kernels]).

    Raises:
      ValueError: an XLA_* or PJRT_CUDA_* variable has a bad value (named in the message).
      CudaLibraryVersionError: a pip-installed CUDA library is too old.
      XlaRuntimeError: the plugin refused, e.g. FAILED_PRECONDITION without a visible GPU.
    """
    if options is None:
        options = generate_pjrt_gpu_plugin_options()
    plugin.option_types.update(OPTION_TYPES)
    prepare_cuda_libraries()
    register_kernels()
    return plugin_api.create_client(plugin, options, distributed_client=distributed_client)


def register_kernels() -> list[str]:
    """Register jaxlib's CUDA kernels (cuSOLVER, cuSPARSE, ...: every handler of the kernel
    wheel, ``jax-cuda13-plugin`` or ``jax-cuda12-plugin``) with pjrt for the ``cuda``
    platform; pjrt hands them to the plugin's FFI extension when its client comes up.
    [`make_client`][pjrt_cuda.make_client] calls it. Without a kernel wheel, a program
    calling one of them fails to compile with an error naming the wheel to install.

    Returns:
      The targets registered (none without the kernel wheel).
    """
    from ._kernels import KERNELS

    return KERNELS.register()


#: The plugin, as pjrt discovers it: options read from the environment and the NVIDIA
#: libraries checked when the client is made. JAX gets CUDA from the vendor wheel's own
#: ``jax_plugins.xla_cudaNN`` module, so under JAX this package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, options=client_options,
    make_client=make_client, version=__version__, serve_jax=False)


def initialize() -> None:
    """Register the CUDA plugin with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point; under JAX it does
    nothing. Loading the library needs no GPU; a missing library is registered as the
    backend's failure, so that ``pjrt.backend_errors()`` says why cuda is absent.
    """
    PLUGIN.initialize()
