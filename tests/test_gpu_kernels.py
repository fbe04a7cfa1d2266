"""jaxlib's kernel modules under pjrt's packages: the CPU LAPACK kernels under jaxlib's names,
and the GPU kernels jax's CUDA and ROCm lowerings call, from the kernel wheels
(``jax-cuda13-plugin`` and friends) that pjrt-cuda's and pjrt-rocm's extras install.

The GPU tests run in the ``vendor`` tox environment (Python 3.12, where the kernel wheels
exist): jax lowers each linear-algebra program for ``cuda`` and ``rocm`` with no GPU, and
every custom-call target it emits must be one the packages register. Running the programs
needs a GPU: scripts/gpu-check.py does that.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pjrt import ffi
from pjrt.plugin_support import GpuKernels

#: Where the vendor environment installs jax (outside the import path; see tox.ini).
JAX_SITE_VARIABLE = "PJRT_TEST_JAX_SITE"

# The linear-algebra programs, lowered by jax in a child process for each platform; f32 and
# f64, unbatched and with a batch dimension. Prints {platform: sorted targets}.
_LOWER_PROGRAMS = r"""
import json, re, sys
import numpy as np
import jax, jax.numpy as jnp
from jax import export
jax.config.update("jax_enable_x64", True)
programs = {
    "solve": (jnp.linalg.solve, ["nn", "n2"]), "inv": (jnp.linalg.inv, ["nn"]),
    "det": (jnp.linalg.det, ["nn"]), "slogdet": (jnp.linalg.slogdet, ["nn"]),
    "lu": (jax.lax.linalg.lu, ["nn"]), "cholesky": (jnp.linalg.cholesky, ["nn"]),
    "qr": (jnp.linalg.qr, ["nn"]), "eigh": (jnp.linalg.eigh, ["nn"]),
    "svd": (jnp.linalg.svd, ["nn"]), "lstsq": (jnp.linalg.lstsq, ["nn", "n2"]),
    "pinv": (jnp.linalg.pinv, ["nn"]),
    "tridiagonal_solve": (jax.lax.linalg.tridiagonal_solve, ["n", "n", "n", "n2"]),
}
shapes = {"nn": (4, 4), "n2": (4, 2), "n": (4,)}
found = {}
for platform in sys.argv[1:]:
    targets = found.setdefault(platform, {})
    for name, (fn, kinds) in programs.items():
        for dtype in (np.float32, np.float64):
            for batch in ((), (3,)):
                if name == "lstsq" and batch:
                    continue  # jnp.linalg.lstsq takes no batch
                args = [jax.ShapeDtypeStruct(batch + shapes[k], dtype) for k in kinds]
                # ROCm's gtsv2 has no compatibility guarantee in jax's export checks.
                checks = [export.DisabledSafetyCheck.custom_call("hipsparse_gtsv2_ffi")]
                exported = export.export(jax.jit(fn), platforms=[platform],
                                         disabled_checks=checks)(*args)
                for target in re.findall(r"stablehlo.custom_call @([\w.]+)",
                                         exported.mlir_module()):
                    targets.setdefault(target, set()).add(name)
    found[platform] = {t: sorted(p) for t, p in targets.items()}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def lowered_targets():
    """{platform: {target: [programs]}} of every custom call jax lowers the programs to."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    site = os.environ.get(JAX_SITE_VARIABLE)
    if site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
    elif importlib.util.find_spec("jax") is None:
        pytest.fail(f"jax is not installed: pip install --no-deps --target DIR jax==0.10.2 "
                    f"jaxlib==0.10.2 opt_einsum and set {JAX_SITE_VARIABLE}=DIR "
                    f"(tox -e vendor does)")
    run = subprocess.run([sys.executable, "-c", _LOWER_PROGRAMS, "cuda", "rocm"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


# -- CPU: jaxlib's lapack module -----------------------------------------------------------------

def test_lapack_registrations_match_jaxlibs():
    """pjrt_cpu.lapack.registrations() names every target jaxlib's does, all typed FFI."""
    jaxlib_lapack = pytest.importorskip("jaxlib.lapack")
    from pjrt_cpu import lapack

    ours = lapack.registrations()
    assert list(ours) == ["cpu"]
    theirs = jaxlib_lapack.registrations()["cpu"]
    assert sorted((name, version) for name, _, version in ours["cpu"]) == \
        sorted((name, version) for name, _, version in theirs)
    assert all(address for _, address, _ in ours["cpu"])
    assert sorted(lapack.batch_partitionable_targets()) == \
        sorted(jaxlib_lapack.batch_partitionable_targets())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128,
                                   np.dtype("float32")])
def test_prepare_lapack_call_names_jaxlibs_target(dtype):
    jaxlib_lapack = pytest.importorskip("jaxlib.lapack")
    from pjrt_cpu import lapack

    assert lapack.prepare_lapack_call("getrf_ffi", dtype) == \
        jaxlib_lapack.prepare_lapack_call("getrf_ffi", dtype)
    assert lapack.provide_lapack()  # the routines were handed over


def test_build_lapack_fn_target_refuses_other_types():
    from pjrt_cpu import lapack

    with pytest.raises(NotImplementedError, match="float16"):
        lapack.build_lapack_fn_target("getrf_ffi", np.float16)


# -- the error when no kernel wheel is installed ------------------------------------------------

def test_missing_kernel_wheel_fails_the_compile_naming_it():
    """With no kernel wheel installed, registering makes a program calling one of the
    targets fail before it compiles, saying which wheel to install; others are untouched."""
    kernels = GpuKernels("pjrt_test_gpu", [("jax-nothing13-plugin", "pjrt_test_no_such_pkg")],
                         {"solver": ("pjrt_test_getrf_ffi",)}, "pip install it")
    assert kernels.wheel() is None
    assert kernels.registrations("solver") == {"PJRT_TEST_GPU": []}
    assert kernels.register() == []
    kernels.register()  # again, as for a second client: still one preparation
    ffi.prepare_targets("pjrt_test_gpu", b"stablehlo.custom_call @other_target")
    with pytest.raises(RuntimeError, match="pjrt_test_getrf_ffi") as raised:
        ffi.prepare_targets("pjrt_test_gpu", b"stablehlo.custom_call @pjrt_test_getrf_ffi")
    assert isinstance(raised.value.__cause__, ImportError)
    assert "jax-nothing13-plugin, which is not installed; pip install it" in str(raised.value)
    with pytest.raises(ImportError, match="jax-nothing13-plugin"):
        kernels.module("solver")


# -- CUDA ----------------------------------------------------------------------------------------

CUDA_MODULES = ("gpu_solver", "gpu_linalg", "gpu_sparse", "gpu_prng")


def _cuda_registrations():
    import pjrt_cuda._kernels  # noqa: F401

    found = {}
    for module in CUDA_MODULES:
        registrations = importlib.import_module(f"pjrt_cuda.{module}").registrations()
        assert list(registrations) == ["CUDA"]
        for name, capsule, api_version in registrations["CUDA"]:
            found[name] = (capsule, api_version)
    return found


@pytest.mark.vendor
def test_cuda_modules_have_jaxlibs_shape_and_every_kernel():
    """Each module's registrations() is {"CUDA": [(target, capsule, api_version)]}, over the
    kernel wheel of the PJRT plugin's own build, and together they hold every target of
    the wheel's modules."""
    from pjrt_cuda import _kernels, gpu_solver

    distribution, package, version = _kernels.KERNELS.wheel()
    assert distribution == "jax-cuda13-plugin"  # CUDA 13's PJRT plugin is the one in use
    assert version == importlib.metadata.version("jax-cuda13-pjrt")
    found = _cuda_registrations()
    expected = {name for names in _kernels.TARGETS.values() for name in names}
    assert set(found) == expected
    for name, (capsule, api_version) in found.items():
        assert type(capsule).__name__ == "PyCapsule" and api_version == 1, name
    assert "cusolver_getrf_ffi" in gpu_solver.batch_partitionable_targets()
    assert gpu_solver.has_magma() is False  # no MAGMA on this machine


@pytest.mark.vendor
def test_cuda_registrations_cover_what_jax_lowers(lowered_targets):
    """Every custom call in jax's CUDA lowering of solve, inv, det, slogdet, lu, cholesky,
    qr, eigh, svd, lstsq, pinv and tridiagonal_solve (f32, f64, batched) is registered."""
    found = _cuda_registrations()
    lowered = lowered_targets["cuda"]
    assert {"cusolver_getrf_ffi", "cu_lu_pivots_to_permutation", "cusolver_potrf_ffi",
            "cusolver_geqrf_ffi", "cusolver_orgqr_ffi", "cusolver_syevd_ffi",
            "cusolver_gesvdj_ffi", "cusparse_gtsv2_ffi"} <= set(lowered)
    missing = {target: programs for target, programs in lowered.items() if target not in found}
    assert not missing


@pytest.mark.vendor
def test_cuda_kernels_reach_the_plugins_ffi_extension():
    """register_kernels() registers every handler with pjrt for cuda, and binding the loaded
    CUDA plugin (no GPU needed) hands each to its FFI extension, which queries the handler's
    FFI version and accepts it. Compiling a program that calls one needs a GPU."""
    import pjrt
    import pjrt_cuda

    registered = pjrt_cuda.register_kernels()
    assert set(registered) == set(_cuda_registrations())
    assert set(registered) <= set(ffi.custom_call_targets("cuda"))
    plugin = pjrt.plugin_api.load_plugin("cuda", pjrt_cuda.library_path())
    assert ffi.has_ffi_extension(plugin)
    ffi.bind_plugin_platform(plugin, "cuda")  # raises if the plugin refuses one


@pytest.mark.vendor
def test_cuda_make_client_registers_kernels_then_fails_without_a_gpu():
    import pjrt
    import pjrt_cuda

    plugin = pjrt.plugin_api.load_plugin("cuda", pjrt_cuda.library_path())
    with pytest.raises(pjrt.XlaRuntimeError, match="No visible GPU devices"):
        pjrt_cuda.make_client(plugin, {"platform_name": "cuda"})
    assert "cusolver_getrf_ffi" in ffi.custom_call_targets("cuda")


# -- ROCm ----------------------------------------------------------------------------------------

@pytest.mark.vendor
def test_rocm_kernel_targets_cover_what_jax_lowers(lowered_targets):
    """Every custom call in jax's ROCm lowering of the programs is a target of pjrt-rocm's
    table, and each table entry is named in the kernel wheel's module (its modules link
    against ROCm's libraries, so without ROCm they cannot be imported to list them)."""
    from pjrt_rocm import _kernels

    table = {name: module for module, names in _kernels.TARGETS.items() for name in names}
    missing = sorted(set(lowered_targets["rocm"]) - set(table))
    assert not missing
    distribution, package, _ = _kernels.KERNELS.wheel()
    directory = os.path.dirname(importlib.util.find_spec(package).origin)
    for name, module in table.items():
        with open(os.path.join(directory, f"_{module}.so"), "rb") as library:
            assert name.encode() + b"\0" in library.read(), (name, module)


@pytest.mark.vendor
def test_rocm_modules_without_rocm_say_what_is_missing():
    """Where ROCm is not installed the kernel modules cannot load: registrations() raises
    ImportError naming the module and the library, and register_kernels() leaves a program
    calling one failing with that reason."""
    import pjrt_rocm
    from pjrt_rocm import gpu_solver

    try:
        registrations = gpu_solver.registrations()
    except ImportError as exc:
        assert "jax_rocm10_plugin._solver cannot be loaded" in str(exc)
        assert ".so" in str(exc)  # the loader's message names the library it lacks
    else:
        pytest.skip(f"ROCm is installed here: {len(registrations['ROCM'])} solver kernels")
    assert pjrt_rocm.register_kernels() == []
    with pytest.raises(RuntimeError, match="hipsolver_getrf_ffi.*cannot be loaded"):
        ffi.prepare_targets("rocm", b"stablehlo.custom_call @hipsolver_getrf_ffi")
