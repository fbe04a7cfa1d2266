"""jaxlib's ROCm custom-call kernels, from AMD's kernel wheel.

``jax-rocm10-plugin`` / ``jax-rocm7-plugin`` carry the handlers jax's ROCm lowerings call
(hipSOLVER, hipSPARSE, the LU pivots, threefry, the hybrid eig); pjrt-rocm's ``[rocm10]`` /
``[rocm7]`` extras install the one matching the PJRT plugin, where it exists (Python 3.12
and newer for 0.12.0). Their modules link against ROCm's libraries, so they load only where
ROCm is installed. ``gpu_solver``, ``gpu_linalg``, ``gpu_sparse`` and ``gpu_prng`` give
jaxlib's names over them; the plugin registers them all when a client is made.
"""
from __future__ import annotations

from pjrt.plugin_api import GpuKernels

#: The kernel wheels, preferred first: (distribution, package).
KERNEL_WHEELS = (("jax-rocm10-plugin", "jax_rocm10_plugin"),
                 ("jax-rocm7-plugin", "jax_rocm7_plugin"))

#: The targets each module of jax-rocm10-plugin / jax-rocm7-plugin 0.12.0 handles.
TARGETS = {
    "solver": ("hipsolver_geqrf_ffi", "hipsolver_gesdd_ffi", "hipsolver_gesvd_ffi",
               "hipsolver_gesvdj_ffi", "hipsolver_getrf_ffi", "hipsolver_orgqr_ffi",
               "hipsolver_ormqr_ffi", "hipsolver_potrf_ffi", "hipsolver_syevd_ffi",
               "hipsolver_syrk_ffi", "hipsolver_sytrd_ffi"),
    "linalg": ("hip_cholesky_update_ffi", "hip_lu_pivots_to_permutation",
               "hip_tridiagonal_solve_perturbed"),
    "sparse": ("hipsparse_coo_fromdense_ffi", "hipsparse_coo_matmat_ffi",
               "hipsparse_coo_matvec_ffi", "hipsparse_coo_todense_ffi",
               "hipsparse_csr_fromdense_ffi", "hipsparse_csr_matmat_ffi",
               "hipsparse_csr_matvec_ffi", "hipsparse_csr_todense_ffi", "hipsparse_gtsv2_ffi"),
    "prng": ("hip_threefry2x32_ffi",),
    "hybrid": ("hiphybrid_eig_comp", "hiphybrid_eig_real", "hiphybrid_geqp3"),
}


def _pjrt_wheel():
    from . import vendor_plugin

    try:
        found = vendor_plugin()
    except FileNotFoundError:
        return None
    return found.distribution, found.version


KERNELS = GpuKernels(
    "rocm", KERNEL_WHEELS, TARGETS,
    "install it with the PJRT plugin: pip install 'pjrt-rocm[rocm10]' (or [rocm7]), on "
    "Python 3.12 or newer, and ROCm itself (the kernels link against its libraries)",
    pjrt_version=_pjrt_wheel)
