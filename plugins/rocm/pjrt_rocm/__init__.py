"""AMD's ROCm PJRT plugin, packaged for the pjrt host.

The plugin library comes from one of AMD's JAX wheels: ``jax-rocm10-pjrt`` (installed by
``pip install 'pjrt-rocm[rocm10]'``, built for ROCm 10.1) or ``jax-rocm7-pjrt``
(``pjrt-rocm[rocm7]``, ROCm 7). When both are installed ROCm 10 is used; `vendor_plugin()`
says which was found. Unlike the CUDA plugin, the library links directly against ROCm's
libraries (HSA, HIP, hipBLASLt, MIOpen, rocprofiler-sdk, ...), so on a machine without ROCm it
cannot even be loaded. pjrt reports that as a PluginLoadError listing every library the loader
cannot find, the driver-level runtimes (``libhsa-runtime64``, ``libamdhip64``) first; this
package adds what to do about it (install that ROCm release, or point the loader at it) and
records that as the rocm backend's reason in ``pjrt.backend_errors()``.

Each wheel's own ``jax_plugins.xla_rocmNN`` module imports jax; it is found without being
imported, and pjrt's discovery skips it once this package has registered ``rocm``.
"""
from __future__ import annotations

import dataclasses

from pjrt import plugin_api

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "rocm"

#: Default-backend priority: the platform's entry in pjrt's one table of priorities (a GPU
#: outranks the TPU, which outranks the CPU, as in JAX).
PRIORITY = plugin_api.PLATFORM_PRIORITIES[PLATFORM]

#: Where to read how to install ROCm.
ROCM_INSTALL_URL = "https://rocm.docs.amd.com/projects/install-on-linux/en/latest/"

#: The usual library directory of a ROCm installation.
ROCM_LIBRARY_DIR = "/opt/rocm/lib"

_LIBRARY_FILE = "xla_rocm_plugin.so"

#: Create options the ROCm plugin reads (XLA's GPU plugin, as the CUDA one), declared to pjrt.
OPTION_TYPES = {"node_id": int, "num_nodes": int, "visible_devices": list,
                "platform_name": str, "allocator": str, "memory_fraction": float,
                "preallocate": bool, "collective_memory_size": int, "enable_mock_nccl": bool,
                "mock_gpu_topology": str}

#: The vendor wheels this package drives, preferred first: (ROCm release in words,
#: distribution, module, extra). The wheels' own summaries name the release they were built
#: against: ROCm 10.1.0 for jax-rocm10-pjrt 0.12.0, ROCm 7.14.0 for jax-rocm7-pjrt 0.12.0.
VENDOR_WHEELS: tuple = (
    ("10.1", "jax-rocm10-pjrt", "jax_plugins.xla_rocm10", "rocm10"),
    ("7", "jax-rocm7-pjrt", "jax_plugins.xla_rocm7", "rocm7"),
)

__all__ = ["PLATFORM", "PRIORITY", "VendorPlugin", "vendor_plugin", "library_path",
           "install_hint", "explain_load_error", "make_client", "register_kernels", "initialize"]


@dataclasses.dataclass(frozen=True)
class VendorPlugin:
    """The ROCm plugin wheel found: which ROCm release, which wheel release, and its library."""

    #: The ROCm release the wheel is built for, e.g. ``"10.1"`` or ``"7"``.
    rocm: str
    #: Its distribution name, e.g. ``jax-rocm10-pjrt``.
    distribution: str
    #: Its installed version, e.g. ``0.12.0`` (None when its metadata is unreadable).
    version: str | None
    #: The plugin library's absolute path.
    library: str
    #: The pjrt-rocm extra that installs it, e.g. ``rocm10``.
    extra: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version or '(version unknown)'}"


def _installed_wheels():
    """The ROCm plugin wheels installed, in the order of `VENDOR_WHEELS`.

    Found with ``importlib.util.find_spec``, which locates ``jax_plugins.xla_rocmNN`` without
    running it (running it would import jax).
    """
    for rocm, distribution, module, extra in VENDOR_WHEELS:
        found = plugin_api.find_installed_wheel(module, _LIBRARY_FILE, distribution)
        if found is not None:
            library, version = found
            yield VendorPlugin(rocm, distribution, version, library, extra)


def vendor_plugin() -> VendorPlugin:
    """The installed ROCm plugin wheel, ROCm 10 first when both are installed.

    Raises:
      FileNotFoundError: neither jax-rocm10-pjrt nor jax-rocm7-pjrt is installed (the message
        says how to install one), or the installed one lacks its library.
    """
    for found in _installed_wheels():
        return found
    raise FileNotFoundError(
        "no ROCm plugin wheel is installed (pjrt-rocm drives jax-rocm10-pjrt or "
        "jax-rocm7-pjrt); install the one for your ROCm with pip install 'pjrt-rocm[rocm10]' "
        "(ROCm 10.1) or pip install 'pjrt-rocm[rocm7]' (ROCm 7)")


def library_path() -> str:
    """Absolute path of the ROCm plugin library inside the vendor wheel found by
    `vendor_plugin()` (jax-rocm10-pjrt, else jax-rocm7-pjrt).

    Raises:
      FileNotFoundError: neither wheel is installed, or its library is missing.
    """
    return vendor_plugin().library


def _wheel_of(path: str | None) -> VendorPlugin | None:
    """The installed wheel whose library is ``path``, if one is."""
    import os

    if path is None:
        return None
    try:
        for found in _installed_wheels():
            if os.path.realpath(path) == os.path.realpath(found.library):
                return found
    except FileNotFoundError:  # a wheel without its library: not the one that was loaded
        pass
    return None


def install_hint(missing_library: str | None, rocm: str | None = None) -> str:
    """What to tell someone whose ROCm plugin cannot find ``missing_library``.

    ``rocm`` is the ROCm release the plugin was built for (``"10.1"``, ``"7"``), when known.
    """
    what = missing_library or "a ROCm library"
    release = f"ROCm {rocm}" if rocm else "ROCm"
    return (f"it needs {what} from {release}, which the loader did not find. Install "
            f"{release} (see {ROCM_INSTALL_URL}; e.g. the `rocm` meta-package), or, if it is "
            f"installed outside the loader's path, add its library directory (usually "
            f"{ROCM_LIBRARY_DIR}) to LD_LIBRARY_PATH")


def explain_load_error(error):
    """A PluginLoadError like ``error``, with the ROCm install hint when a library is missing.

    ``path``, ``missing_library`` and ``missing_libraries`` (every library the loader cannot
    find, drivers first) are kept, and so is pjrt's own message listing them; errors with no
    missing library are returned unchanged.
    """
    if getattr(error, "missing_library", None) is None:
        return error
    wheel = _wheel_of(error.path)
    source = f" (from {wheel})" if wheel else ""
    missing = tuple(getattr(error, "missing_libraries", ()))
    first = error.missing_library
    if len(missing) > 1:
        first = f"{first} and {len(missing) - 1} more of its libraries (all listed below)"
    return plugin_api.PluginLoadError(
        f"the ROCm plugin {error.path}{source} cannot be loaded: "
        f"{install_hint(first, wheel.rocm if wheel else None)}.\n{error}",
        path=error.path, missing_library=error.missing_library, missing_libraries=missing)


def register_kernels() -> list[str]:
    """Register jaxlib's ROCm kernels (hipSOLVER, hipSPARSE, ...: every handler of the kernel
    wheel, ``jax-rocm10-plugin`` or ``jax-rocm7-plugin``) with pjrt for the ``rocm``
    platform; pjrt hands them to the plugin's FFI extension when its client comes up.
    [`make_client`][pjrt_rocm.make_client] calls it. Without a kernel wheel (or where its
    modules cannot load), a program calling one of them fails to compile with an error
    saying what to install.

    Returns:
      The targets registered (none without a loadable kernel wheel).
    """
    from ._kernels import KERNELS

    return KERNELS.register()


def make_client(plugin, options: dict | None = None, *, distributed_client=None):
    """Create a ROCm client of the loaded ``plugin``, jaxlib's ROCm kernels registered first
    ([`register_kernels`][pjrt_rocm.register_kernels]).

    Raises:
      XlaRuntimeError: the plugin refused, e.g. without a visible GPU.
    """
    plugin.option_types.update(OPTION_TYPES)
    register_kernels()
    return plugin_api.create_client(plugin, options or {},
                                    distributed_client=distributed_client)


#: The plugin, as pjrt discovers it. JAX gets ROCm from the vendor wheel's own
#: ``jax_plugins.xla_rocmNN`` module, so under JAX this package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, explain_load_error=explain_load_error,
    make_client=make_client, version=__version__, serve_jax=False)


def initialize() -> None:
    """Register the ROCm plugin with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point; under JAX it does
    nothing. When the library cannot be loaded, the failure, with the ROCm hint, is
    registered as the backend's reason and raised for discovery to record.
    """
    PLUGIN.initialize()
