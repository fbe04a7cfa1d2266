"""NVIDIA's CUDA libraries installed from pip: finding them, loading them, checking versions.

The CUDA plugin wheels (``jax-cuda13-pjrt``, ``jax-cuda12-pjrt``) do not bundle CUDA. It opens the CUDA libraries itself when a client is
created, looking in its RPATH (``site-packages/nvidia/*/lib`` beside it) and then the system
search path. Two things can go wrong that its own messages explain poorly:

* the NVIDIA wheels (``nvidia-cudnn-cu12``, ``nvidia-cudnn-cu13`` and friends) sit in another site directory than the
  plugin (a user site, a layered virtual environment), so its RPATH misses them; and
* an old wheel is found, and the plugin fails deep inside a kernel or aborts the process.

So, before the client is created, `find_cuda_libraries` looks for each wheel's library
directory on ``sys.path``, loads the libraries (with ``RTLD_GLOBAL`` when preloading, so the
plugin's later ``dlopen`` of the same soname reuses these copies, the way JAX does it) and reads
each one's version from the library itself where it exports a version call that needs no GPU,
else from the wheel's metadata. `check_versions` then compares them with the oldest
versions the plugin works with and says which wheel to upgrade, and how.

Libraries that are not installed from pip (a system CUDA under /usr/local/cuda) are left to
the plugin, which finds them on the loader's path and checks them itself.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import sys
from typing import Callable, Iterable, Sequence

logger = logging.getLogger(__name__)

Version = tuple  # of ints, most significant first


def _get_int(library: ctypes.CDLL, function: str) -> int | None:
    value = ctypes.c_int()
    status = getattr(library, function)(ctypes.byref(value))
    return value.value if status == 0 else None


def _get_major_minor(library: ctypes.CDLL, function: str) -> Version | None:
    major, minor = ctypes.c_int(), ctypes.c_int()
    status = getattr(library, function)(ctypes.byref(major), ctypes.byref(minor))
    return (major.value, minor.value) if status == 0 else None


def _get_property_triplet(library: ctypes.CDLL, function: str) -> Version | None:
    # cuBLAS, cuFFT, cuSPARSE and cuSOLVER share libraryPropertyType:
    # MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2.
    parts = []
    for kind in (0, 1, 2):
        value = ctypes.c_int()
        if getattr(library, function)(kind, ctypes.byref(value)) != 0:
            return None
        parts.append(value.value)
    return tuple(parts)


def _cudart_version(library: ctypes.CDLL) -> Version | None:
    # cudaRuntimeGetVersion answers without a driver or a GPU: 12090 is CUDA 12.9.
    code = _get_int(library, "cudaRuntimeGetVersion")
    return None if code is None else (code // 1000, code % 1000 // 10)


def _cudnn_version(library: ctypes.CDLL) -> Version | None:
    function = library.cudnnGetVersion
    function.restype = ctypes.c_size_t
    code = int(function())
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 used major*1000.
    if code >= 90000:
        return (code // 10000, code % 10000 // 100, code % 100)
    return (code // 1000, code % 1000 // 100, code % 100)


def _nccl_version(library: ctypes.CDLL) -> Version | None:
    code = _get_int(library, "ncclGetVersion")
    if code is None:
        return None
    # Since NCCL 2.9 the code is major*10000 + minor*100 + patch; before, major*1000.
    if code >= 20900:
        return (code // 10000, code % 10000 // 100, code % 100)
    return (code // 1000, code % 1000 // 100, code % 100)


def _reader(function: str, read: Callable[[ctypes.CDLL, str], Version | None]):
    return lambda library: read(library, function)


@dataclasses.dataclass(frozen=True)
class Component:
    """One NVIDIA pip wheel the CUDA plugin can use."""

    #: What NVIDIA calls it, for messages.
    name: str
    #: The pip distribution that installs it.
    distribution: str
    #: Its directory under ``site-packages/nvidia``.
    directory: str
    #: Library file names in load order; the last is the one whose version is read.
    libraries: tuple
    #: The oldest version the plugin works with, compared on as many parts as it has.
    minimum: Version
    #: Reads the version from the loaded library; None: only the wheel's metadata tells.
    read_version: Callable[[ctypes.CDLL], Version | None] | None = None

    @property
    def requirement(self) -> str:
        """A pip requirement that fixes a too-old copy, e.g. ``nvidia-cudnn-cu12>=9.8``."""
        return f"{self.distribution}>={'.'.join(map(str, self.minimum))}"


#: The NVIDIA wheels jax-cuda12-pjrt 0.12.0.1 uses, in an order where each one's dependencies
#: come first (cuSOLVER and cuSPARSE need nvJitLink and cuBLAS). The minimums are the floors
#: JAX itself sets for this plugin: jax-cuda12-plugin 0.12.0.1 requires these versions of the
#: wheels (``jax[cuda12]``, read from its METADATA), compared on major.minor.
COMPONENTS_CUDA12: tuple = (
    Component("CUDA runtime", "nvidia-cuda-runtime-cu12", "cuda_runtime", ("libcudart.so.12",),
              (12, 1), _cudart_version),
    Component("NVRTC", "nvidia-cuda-nvrtc-cu12", "cuda_nvrtc", ("libnvrtc.so.12",), (12, 1),
              _reader("nvrtcVersion", _get_major_minor)),
    Component("nvJitLink", "nvidia-nvjitlink-cu12", "nvjitlink", ("libnvJitLink.so.12",),
              (12, 1), _reader("nvJitLinkVersion", _get_major_minor)),
    Component("cuBLAS", "nvidia-cublas-cu12", "cublas", ("libcublasLt.so.12", "libcublas.so.12"),
              (12, 1), _reader("cublasGetProperty", _get_property_triplet)),
    Component("CUPTI", "nvidia-cuda-cupti-cu12", "cuda_cupti", ("libcupti.so.12",), (12, 1)),
    Component("cuSPARSE", "nvidia-cusparse-cu12", "cusparse", ("libcusparse.so.12",), (12, 1),
              _reader("cusparseGetProperty", _get_property_triplet)),
    Component("cuSOLVER", "nvidia-cusolver-cu12", "cusolver", ("libcusolver.so.11",), (11, 4),
              _reader("cusolverGetProperty", _get_property_triplet)),
    Component("cuFFT", "nvidia-cufft-cu12", "cufft", ("libcufft.so.11",), (11, 0),
              _reader("cufftGetProperty", _get_property_triplet)),
    Component("NCCL", "nvidia-nccl-cu12", "nccl", ("libnccl.so.2",), (2, 18), _nccl_version),
    Component("NVSHMEM", "nvidia-nvshmem-cu12", "nvshmem", ("libnvshmem_host.so.3",), (3, 2)),
    Component("cuDNN", "nvidia-cudnn-cu12", "cudnn", ("libcudnn.so.9",), (9, 10), _cudnn_version),
)

#: Kept under its old name: the CUDA 12 set.
COMPONENTS: tuple = COMPONENTS_CUDA12

#: The NVIDIA wheels jax-cuda13-pjrt 0.12.0.1 uses, with the floors jax-cuda13-plugin
#: 0.12.0.1 requires (``jax[cuda13]``). CUDA 13's toolkit wheels drop the ``-cu13`` suffix and
#: install their libraries together under ``nvidia/cu13/lib``; cuDNN, NCCL and NVSHMEM keep
#: the suffix and their own directories.
COMPONENTS_CUDA13: tuple = (
    Component("CUDA runtime", "nvidia-cuda-runtime", "cu13", ("libcudart.so.13",), (13, 0),
              _cudart_version),
    Component("NVRTC", "nvidia-cuda-nvrtc", "cu13", ("libnvrtc.so.13",), (13, 0),
              _reader("nvrtcVersion", _get_major_minor)),
    Component("nvJitLink", "nvidia-nvjitlink", "cu13", ("libnvJitLink.so.13",), (13, 0),
              _reader("nvJitLinkVersion", _get_major_minor)),
    Component("cuBLAS", "nvidia-cublas", "cu13", ("libcublasLt.so.13", "libcublas.so.13"),
              (13, 0), _reader("cublasGetProperty", _get_property_triplet)),
    Component("CUPTI", "nvidia-cuda-cupti", "cu13", ("libcupti.so.13",), (13, 0)),
    Component("cuSPARSE", "nvidia-cusparse", "cu13", ("libcusparse.so.12",), (12, 6),
              _reader("cusparseGetProperty", _get_property_triplet)),
    Component("cuSOLVER", "nvidia-cusolver", "cu13", ("libcusolver.so.12",), (12, 0),
              _reader("cusolverGetProperty", _get_property_triplet)),
    Component("cuFFT", "nvidia-cufft", "cu13", ("libcufft.so.12",), (12, 0),
              _reader("cufftGetProperty", _get_property_triplet)),
    Component("NCCL", "nvidia-nccl-cu13", "nccl", ("libnccl.so.2",), (2, 27), _nccl_version),
    Component("NVSHMEM", "nvidia-nvshmem-cu13", "nvshmem", ("libnvshmem_host.so.3",), (3, 3)),
    Component("cuDNN", "nvidia-cudnn-cu13", "cudnn", ("libcudnn.so.9",), (9, 12), _cudnn_version),
)

#: CUDA major version -> the NVIDIA wheels its plugin uses.
COMPONENTS_BY_CUDA: dict = {12: COMPONENTS_CUDA12, 13: COMPONENTS_CUDA13}


@dataclasses.dataclass
class FoundLibrary:
    """A component found on the search path, and what is known about it."""

    component: Component
    #: The ``.../nvidia/<name>/lib`` directory it was found in.
    directory: str
    #: Its version, or None when neither the library nor the wheel's metadata told.
    version: Version | None
    #: Where the version came from: "library", "metadata" or "unknown".
    version_source: str
    #: Why loading it failed, if it did (the plugin may still manage, or fail with its own).
    load_error: str | None = None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown"


class CudaLibraryVersionError(RuntimeError):
    """An installed NVIDIA library is older than the CUDA plugin needs.

    ``too_old`` lists the `FoundLibrary` entries that failed the check.
    """

    def __init__(self, message: str, too_old: Sequence[FoundLibrary]):
        self.too_old = list(too_old)
        super().__init__(message)


_VERSION_PREFIX = re.compile(r"\d+(?:\.\d+)*")


def _parse_version(text: str) -> Version | None:
    match = _VERSION_PREFIX.match(text or "")
    return tuple(int(p) for p in match.group(0).split(".")) if match else None


def _metadata_version(site_dir: str, distribution: str) -> Version | None:
    """The version of ``distribution`` as installed in ``site_dir`` (from its dist-info)."""
    from importlib import metadata

    wanted = re.sub(r"[-_.]+", "-", distribution).lower()
    for dist in metadata.distributions(path=[site_dir]):
        name = re.sub(r"[-_.]+", "-", dist.metadata.get("Name") or "").lower()  # pyright: ignore[reportAttributeAccessIssue]
        if name == wanted:
            return _parse_version(dist.version)
    return None


def _site_dirs(search_path: Iterable[str] | None) -> list[str]:
    dirs = []
    for entry in (sys.path if search_path is None else search_path):
        entry = os.path.abspath(entry or os.curdir)
        if entry not in dirs and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs.append(entry)
    return dirs


def find_cuda_libraries(search_path: Iterable[str] | None = None, *,
                        preload: bool = False, cuda: int = 12) -> list[FoundLibrary]:
    """The NVIDIA pip libraries under ``search_path``, loaded, with their versions.

    For each component the first ``<dir>/nvidia/<name>/lib`` holding its library wins, as
    Python's own imports would. The libraries are loaded to read their versions; with
    ``preload`` they are loaded ``RTLD_GLOBAL`` so that the CUDA plugin, which opens them
    by soname, gets these copies. A library that fails to load is reported in
    ``load_error`` and its version is taken from the wheel's metadata.

    Args:
      search_path: directories to look in (``sys.path`` when None).
      preload: make the loaded libraries visible to the CUDA plugin.
      cuda: the CUDA major version of the plugin (12 or 13): which wheels to look for.
    """
    mode = ctypes.RTLD_GLOBAL if preload else ctypes.RTLD_LOCAL
    found = []
    sites = _site_dirs(search_path)
    for component in COMPONENTS_BY_CUDA[cuda]:
        for site in sites:
            directory = os.path.join(site, "nvidia", component.directory, "lib")
            if os.path.isfile(os.path.join(directory, component.libraries[-1])):
                found.append(_inspect(component, site, directory, mode))
                break
    return found


def _inspect(component: Component, site: str, directory: str, mode: int) -> FoundLibrary:
    library = load_error = None
    for name in component.libraries:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        try:
            library = ctypes.CDLL(path, mode=mode)
        except OSError as error:
            load_error = str(error)
            library = None
            break
    version = None
    source = "unknown"
    if library is not None and component.read_version is not None:
        try:
            version = component.read_version(library)
        except (AttributeError, OSError, ValueError) as error:
            # An unusual build without the call: fall back to the wheel's metadata.
            logger.debug("could not read %s's version from %s: %s", component.name, directory,
                         error)
        if version is not None:
            source = "library"
    if version is None:
        version = _metadata_version(site, component.distribution)
        if version is not None:
            source = "metadata"
    return FoundLibrary(component, directory, version, source, load_error)


def _too_old(found: FoundLibrary) -> bool:
    minimum = found.component.minimum
    return found.version is not None and tuple(found.version[:len(minimum)]) < minimum


def _cuda_of(found: Sequence[FoundLibrary]) -> int:
    """The CUDA major version whose wheel set ``found`` belongs to (12 when unsure)."""
    for cuda, components in COMPONENTS_BY_CUDA.items():
        if found and found[0].component in components:
            return cuda
    return 12


def check_versions(found: Sequence[FoundLibrary], plugin: str = "the CUDA plugin") -> None:
    """Raise if any found library is older than the CUDA plugin needs.

    Libraries whose version is unknown pass; the plugin checks what it loads itself.
    ``plugin`` names the plugin wheel in the message (e.g. ``jax-cuda13-pjrt 0.12.0.1``).

    Raises:
      CudaLibraryVersionError: names each library that is too old, the version found, the
        oldest that works, where it was found and the pip command that upgrades it.
    """
    too_old = [f for f in found if _too_old(f)]
    if not too_old:
        return
    lines = [f"  {f.component.name} {f.version_text} (from {f.component.distribution} in "
             f"{f.directory}) is older than "
             f"{'.'.join(map(str, f.component.minimum))}, the oldest the CUDA plugin works with"
             for f in too_old]
    upgrade = " ".join(f"'{f.component.requirement}'" for f in too_old)
    raise CudaLibraryVersionError(
        f"the CUDA libraries installed from pip are too old for {plugin}:\n"
        + "\n".join(lines)
        + f"\nUpgrade them with: pip install --upgrade {upgrade}"
        + f"\n(or pip install --upgrade 'pjrt-cuda[cuda{_cuda_of(too_old)}]' for the whole set; set "
          "PJRT_CUDA_SKIP_VERSION_CHECK=1 to skip this check)", too_old)
