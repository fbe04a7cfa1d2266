"""What provides the shared libraries that accelerator plugins need: a pip package, or a
part of the system that pip cannot install (a driver, a vendor SDK).

Used by `pjrt._loading.library_search` to turn a list of missing names into a list of things to
install. Only names whose provider is known for certain are listed; any other name is
reported bare. Names are matched by their stem (the part before ``.so``) and, where it tells
the CUDA release apart, the major version after it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NVIDIA_DRIVER = "NVIDIA's driver (not a pip package)"
_ROCM = "ROCm's {} package (AMD's ROCm, not on PyPI)"
_LEVEL_ZERO = "the oneAPI Level Zero loader with Intel's GPU driver (not a pip package)"
#: The Level Zero loader's package installs its layers beside it (Debian's libze1 holds all
#: three), so a missing layer is fixed by the same install as a missing loader.
_LEVEL_ZERO_STEMS = ("libze_loader", "libze_tracing_layer", "libze_validation_layer")

#: Libraries of NVIDIA's driver: installed with the kernel module, never by pip.
_NVIDIA_DRIVER_STEMS = ("libcuda", "libnvidia-ptxjitcompiler", "libnvidia-ml",
                        "libnvidia-nvvm", "libnvcuvid", "libnvidia-encode")

#: NVIDIA's wheels: stem -> (CUDA 12 wheel, CUDA 13 wheel). Since CUDA 13 NVIDIA publishes
#: most of them without the ``-cu13`` suffix.
_NVIDIA_WHEELS = {
    "libcudart": ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"),
    "libcupti": ("nvidia-cuda-cupti-cu12", "nvidia-cuda-cupti"),
    "libcublas": ("nvidia-cublas-cu12", "nvidia-cublas"),
    "libcublasLt": ("nvidia-cublas-cu12", "nvidia-cublas"),
    "libcufft": ("nvidia-cufft-cu12", "nvidia-cufft"),
    "libcusolver": ("nvidia-cusolver-cu12", "nvidia-cusolver"),
    "libcusparse": ("nvidia-cusparse-cu12", "nvidia-cusparse"),
    "libcurand": ("nvidia-curand-cu12", "nvidia-curand"),
    "libnvrtc": ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc"),
    "libnvrtc-builtins": ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc"),
    "libnvJitLink": ("nvidia-nvjitlink-cu12", "nvidia-nvjitlink"),
    "libnvToolsExt": ("nvidia-nvtx-cu12", "nvidia-nvtx"),
    "libcudnn": ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13"),
    "libnccl": ("nvidia-nccl-cu12", "nvidia-nccl-cu13"),
    "libnvshmem_host": ("nvidia-nvshmem-cu12", "nvidia-nvshmem-cu13"),
}
#: Stems whose soname's major version is the CUDA release (libcudart.so.12 is CUDA 12).
_CUDA_VERSIONED_STEMS = ("libcudart", "libcupti", "libcublas", "libcublasLt", "libnvrtc",
                         "libnvrtc-builtins", "libnvJitLink")
#: Stems whose soname's major version tells the CUDA release though it is not the release:
#: stem -> {soname major: CUDA release}. cuFFT 11 ships with CUDA 12 only and cuFFT 12 with
#: CUDA 13; cuSOLVER 12 with CUDA 13 (cuSOLVER 11 with both CUDA 11 and 12, so it does not
#: tell). libcusparse.so.12 is in CUDA 12 and 13 alike.
_CUDA_RELEASE_BY_MAJOR = {"libcufft": {11: 12, 12: 13}, "libcusolver": {12: 13}}

#: ROCm: stem -> (component, whether it is the driver-level runtime everything else needs).
_ROCM_COMPONENTS = {
    "libhsa-runtime64": ("hsa-rocr", True),
    "libamdhip64": ("hip-runtime-amd", True),
    "librocprofiler-sdk": ("rocprofiler-sdk", False),
    "libroctracer64": ("roctracer", False),
    "librccl": ("rccl", False),
    "libMIOpen": ("miopen-hip", False),
    "librocblas": ("rocblas", False),
    "libhipblas": ("hipblas", False),
    "libhipblaslt": ("hipblaslt", False),
    "libhipfft": ("hipfft", False),
    "librocfft": ("rocfft", False),
    "libhipsolver": ("hipsolver", False),
    "librocsolver": ("rocsolver", False),
    "libhipsparse": ("hipsparse", False),
    "librocsparse": ("rocsparse", False),
    "libamd_smi": ("amd-smi-lib", False),
    "librocm_smi64": ("rocm-smi-lib", False),
    "libamd_comgr": ("comgr", False),
    "libhiprtc": ("hip-runtime-amd", False),
}

#: Intel oneAPI's runtime wheels on PyPI: stem -> wheel. Read from the wheels that
#: jax-oneapi-plugin 0.11.2's with-oneapi extra pins (intel-sycl-rt 2025.1.1, mkl 2025.1.0,
#: umf 0.10.0, tcmlib 1.3.0, ...). Every other ``libmkl_*`` library is in the mkl wheel.
_ONEAPI_WHEELS = {
    "libsycl": "intel-sycl-rt",
    "libur_loader": "intel-cmplr-lib-ur",
    "libur_adapter_level_zero": "intel-cmplr-lib-ur",
    "libur_adapter_opencl": "intel-cmplr-lib-ur",
    "libumf": "umf",
    "libhwloc": "tcmlib",
    "libtcm": "tcmlib",
    "libOpenCL": "intel-opencl-rt",
    "libsvml": "intel-cmplr-lib-rt",
    "libimf": "intel-cmplr-lib-rt",
    "libintlc": "intel-cmplr-lib-rt",
    "libirc": "intel-cmplr-lib-rt",
    "libirng": "intel-cmplr-lib-rt",
    "libiomp5": "intel-openmp",
    "libmpi": "impi-rt",
    "libpti_view": "intel-pti",
    "libpti_metrics": "intel-pti",
    "libccl": "oneccl",
    "libtbb": "tbb",
    "libtbbmalloc": "tbb",
    "libmkl_sycl_blas": "onemkl-sycl-blas",
    "libmkl_sycl_dft": "onemkl-sycl-dft",
    "libmkl_sycl_lapack": "onemkl-sycl-lapack",
    "libmkl_sycl_rng": "onemkl-sycl-rng",
    "libmkl_sycl_sparse": "onemkl-sycl-sparse",
}

_SONAME = re.compile(r"^(?P<stem>.+?)\.so(?:\.(?P<major>\d+))?")


def _split(name: str) -> tuple[str, int | None]:
    match = _SONAME.match(name.rsplit("/", 1)[-1])
    if match is None:
        return name, None
    major = match.group("major")
    return match.group("stem"), int(major) if major else None


def _cuda_release(stem: str, major: int | None) -> int | None:
    """The CUDA release (12, 13) that one library's soname says, when it says one."""
    if stem in _CUDA_VERSIONED_STEMS:
        return major if major in (12, 13) else None
    return _CUDA_RELEASE_BY_MAJOR.get(stem, {}).get(major) if major is not None else None


def cuda_major(names: list[str]) -> int | None:
    """The CUDA release (12, 13) that a dependency tree's names point to, if they agree."""
    majors = {_cuda_release(*_split(name)) for name in names} - {None}
    return majors.pop() if len(majors) == 1 else None


@dataclass(frozen=True)
class Provider:
    """What provides a library.

    Attributes:
      description: the pip package or system component, in words.
      pip_package: the one pip package to install, when it is one.
      is_driver: whether it is part of the accelerator's driver or its lowest runtime, which
        must be present before anything else can work.
    """

    description: str
    pip_package: str | None = None
    is_driver: bool = False


def provider(name: str, cuda: int | None = None) -> Provider | None:
    """What provides the library ``name``; None when pjrt does not know.

    Args:
      name: a library name as DT_NEEDED writes it.
      cuda: the CUDA release of the tree it is in, to pick between the CUDA 12 and CUDA 13
        wheels of a library whose name does not say.
    """
    stem, major = _split(name)
    if stem in _NVIDIA_DRIVER_STEMS:
        return Provider(_NVIDIA_DRIVER, is_driver=True)
    wheels = _NVIDIA_WHEELS.get(stem) or _NVIDIA_WHEELS.get(stem.split("_")[0])
    if wheels is not None:
        cuda = _cuda_release(stem, major) or cuda
        if cuda in (12, 13):
            return Provider(wheels[cuda - 12], wheels[cuda - 12])
        return Provider(f"{wheels[0]} for CUDA 12, {wheels[1]} for CUDA 13")
    if stem in _ROCM_COMPONENTS:
        component, is_driver = _ROCM_COMPONENTS[stem]
        return Provider(_ROCM.format(component), is_driver=is_driver)
    if stem.startswith("librocm_sysdeps_"):
        return Provider("AMD's ROCm (a system library it bundles; not on PyPI)")
    if stem in _LEVEL_ZERO_STEMS:
        return Provider(_LEVEL_ZERO, is_driver=True)
    wheel = _ONEAPI_WHEELS.get(stem)
    if wheel is None and stem.startswith("libmkl_") and not stem.startswith("libmkl_sycl_"):
        wheel = "mkl"
    if wheel is not None:
        return Provider(f"{wheel} (an Intel oneAPI runtime wheel)", wheel)
    return None
