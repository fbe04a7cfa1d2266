"""jaxlib's CUDA custom-call kernels, from the JAX authors' kernel wheel.

``jax-cuda13-plugin`` / ``jax-cuda12-plugin`` carry the handlers jax's CUDA lowerings call
(cuSOLVER, cuSPARSE, the LU pivots, threefry, the hybrid eig); pjrt-cuda's ``[cuda13]`` /
``[cuda12]`` extras install the one matching the PJRT plugin, where it exists (Python 3.12
and newer for 0.12.0.1). ``gpu_solver``, ``gpu_linalg``, ``gpu_sparse`` and ``gpu_prng``
give jaxlib's names over them; the plugin registers them all when a client is made.
"""
from __future__ import annotations

from pjrt.plugin_api import GpuKernels

#: The kernel wheels, preferred first: (distribution, package).
KERNEL_WHEELS = (("jax-cuda13-plugin", "jax_cuda13_plugin"),
                 ("jax-cuda12-plugin", "jax_cuda12_plugin"))

#: The targets each module of jax-cuda13-plugin / jax-cuda12-plugin 0.12.0.1 handles.
TARGETS = {
    "solver": ("cusolver_csrlsvqr_ffi", "cusolver_geev_ffi", "cusolver_geqrf_ffi",
               "cusolver_gesvd_ffi", "cusolver_gesvdj_ffi", "cusolver_gesvdp_ffi",
               "cusolver_getrf_ffi", "cusolver_orgqr_ffi", "cusolver_ormqr_ffi",
               "cusolver_potrf_ffi", "cusolver_syevd_ffi", "cusolver_syrk_ffi",
               "cusolver_sytrd_ffi"),
    "linalg": ("cu_cholesky_update_ffi", "cu_lu_pivots_to_permutation",
               "cu_tridiagonal_solve_perturbed"),
    "sparse": ("cusparse_coo_fromdense_ffi", "cusparse_coo_matmat_ffi", "cusparse_coo_matvec_ffi",
               "cusparse_coo_todense_ffi", "cusparse_csr_fromdense_ffi", "cusparse_csr_matmat_ffi",
               "cusparse_csr_matvec_ffi", "cusparse_csr_todense_ffi", "cusparse_gtsv2_ffi"),
    "prng": ("cu_threefry2x32_ffi",),
    "hybrid": ("cuhybrid_eig_comp", "cuhybrid_eig_real", "cuhybrid_geqp3"),
}


def _pjrt_wheel():
    from . import vendor_plugin

    try:
        found = vendor_plugin()
    except FileNotFoundError:
        return None
    return found.distribution, found.version


KERNELS = GpuKernels(
    "cuda", KERNEL_WHEELS, TARGETS,
    "install it with the PJRT plugin: pip install 'pjrt-cuda[cuda13]' (or [cuda12]); the "
    "kernel wheels exist for Python 3.12 and newer",
    pjrt_version=_pjrt_wheel)
