"""The missing-library report: a plugin's whole dependency tree resolved as the dynamic loader
resolves it, read from ELF headers without loading anything (pjrt._loading.library_search), and the
PluginLoadError of a failed dlopen carrying every missing library.

``ldd`` is the oracle where it is installed: it runs the real loader over the same tree.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

import pjrt
from pjrt._loading import library_providers as _library_providers
from pjrt._loading import library_search as _library_search

from conftest import pjrt_cuda_libraries

HAS_GCC = shutil.which("gcc") is not None
HAS_LDD = shutil.which("ldd") is not None

_PLUGIN_C = textwrap.dedent("""
    extern int origin_answer(void);
    extern int gone_one_answer(void);
    const void* GetPjrtApi(void) {
      return (origin_answer() + gone_one_answer()) ? (const void*)0 : (const void*)0;
    }
""")


def _compile(source: str, output, *flags: str) -> None:
    source_file = output.with_suffix(".c")
    source_file.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(output), str(source_file),
                    "-Wl,--no-as-needed", *flags], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A would-be plugin that needs ``liborigin_dep.so`` (found through its ``$ORIGIN/deps``
    RUNPATH) and ``libgone_one.so``; ``liborigin_dep.so`` needs ``libgone_two.so``. Both
    ``gone`` libraries are deleted after linking, and their copies are kept in ``spare/``."""
    if not HAS_GCC:
        pytest.skip("needs gcc to build the libraries")
    out = tmp_path_factory.mktemp("tree")
    deps, spare = out / "deps", out / "spare"
    deps.mkdir()
    spare.mkdir()
    for stem in ("gone_one", "gone_two"):
        _compile(f"int {stem}_answer(void) {{ return 1; }}\n", spare / f"lib{stem}.so")
    _compile("extern int gone_two_answer(void);\n"
             "int origin_answer(void) { return gone_two_answer(); }\n",
             deps / "liborigin_dep.so", f"-L{spare}", "-lgone_two")
    plugin = out / "libplugin_needing_three.so"
    _compile(_PLUGIN_C, plugin, f"-L{deps}", f"-L{spare}", "-lorigin_dep", "-lgone_one",
             "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/deps")
    # Built against the spares; now move them where no search path looks.
    hidden = out / "hidden"
    spare.rename(hidden)
    return plugin, hidden


def _ldd_missing(path, env=None) -> set[str]:
    output = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60,
                            env=env).stdout
    return {line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line}


def _names(missing) -> list[str]:
    return [library.name for library in missing]


def test_every_missing_library_of_the_tree_is_found_and_origin_is_honoured(tree):
    plugin, _hidden = tree
    missing = _library_search.missing_libraries(str(plugin), environ={})
    # liborigin_dep.so is found through $ORIGIN/deps; what it needs is looked for in turn.
    assert sorted(_names(missing)) == ["libgone_one.so", "libgone_two.so"]
    needed_by = {library.name: library.needed_by for library in missing}
    assert needed_by["libgone_one.so"] == str(plugin)
    assert os.path.basename(needed_by["libgone_two.so"]) == "liborigin_dep.so"
    if HAS_LDD:
        environment = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        assert set(_names(missing)) == _ldd_missing(plugin, environment)


def test_ld_library_path_is_searched(tree):
    plugin, hidden = tree
    missing = _library_search.missing_libraries(str(plugin),
                                                environ={"LD_LIBRARY_PATH": f"/nowhere:{hidden}"})
    assert missing == []


def test_the_failed_load_error_carries_the_whole_list(tree):
    plugin, _hidden = tree
    with pytest.raises(pjrt.PluginLoadError) as info:
        pjrt.load_pjrt_plugin_dynamically("needs_three", plugin)
    error = info.value
    assert sorted(_names(error.missing_libraries)) == ["libgone_one.so", "libgone_two.so"]
    assert error.missing_library in {"libgone_one.so", "libgone_two.so"}
    message = str(error)
    assert "libgone_one.so" in message and "libgone_two.so" in message
    assert "liborigin_dep.so" not in message.partition("The loader said")[0]
    assert "LD_LIBRARY_PATH" in message and str(plugin) in message


def test_the_loader_cache_is_read_as_ldconfig_lists_it():
    if not os.path.exists("/etc/ld.so.cache") or not shutil.which("ldconfig"):
        pytest.skip("no loader cache or ldconfig on this system")
    with open("/etc/ld.so.cache", "rb") as cache:
        parsed = _library_search._parse_cache(cache.read())
    if parsed is None:
        pytest.skip("the cache here is in the old format only")
    listed = _library_search._ldconfig_listing()
    assert parsed == listed and len(parsed) > 0


def test_an_unreadable_cache_falls_back_to_ldconfig():
    assert _library_search._parse_cache(b"not a cache at all") is None
    assert _library_search._parse_cache(b"glibc-ld.so.cache1.1" + b"\xff" * 40) is None


@pytest.mark.parametrize("name, cuda, provider, is_driver", [
    ("libcuda.so.1", None, "NVIDIA's driver (not a pip package)", True),
    ("libcupti.so.12", None, "nvidia-cuda-cupti-cu12", False),
    ("libcublas.so.13", None, "nvidia-cublas", False),
    ("libcudnn_ops.so.9", 12, "nvidia-cudnn-cu12", False),
    ("libcudnn.so.9", 13, "nvidia-cudnn-cu13", False),
    ("libnccl.so.2", 13, "nvidia-nccl-cu13", False),
])
def test_nvidia_providers(name, cuda, provider, is_driver):
    found = _library_providers.provider(name, cuda)
    assert found is not None
    assert (found.description, found.is_driver) == (provider, is_driver)


def test_a_library_whose_name_does_not_say_the_cuda_release_names_both_wheels():
    found = _library_providers.provider("libnccl.so.2")
    assert found is not None and found.pip_package is None
    assert "nvidia-nccl-cu12" in found.description and "nvidia-nccl-cu13" in found.description


def test_rocm_and_oneapi_runtimes_are_drivers():
    for name in ("libamdhip64.so.7", "libhsa-runtime64.so.1", "libze_loader.so.1"):
        found = _library_providers.provider(name)
        assert found is not None and found.is_driver, name
    assert _library_providers.provider("libmade_up.so.3") is None


@pytest.mark.parametrize("name, wheel", [
    # cuFFT 11 ships with CUDA 12 only, cuFFT 12 and cuSOLVER 12 with CUDA 13 only.
    ("libcufft.so.11", "nvidia-cufft-cu12"),
    ("libcufft.so.12", "nvidia-cufft"),
    ("libcusolver.so.12", "nvidia-cusolver"),
    ("libnvrtc-builtins.so.13.0", "nvidia-cuda-nvrtc"),
])
def test_a_soname_that_tells_the_cuda_release_picks_its_wheel(name, wheel):
    found = _library_providers.provider(name)
    assert found is not None and found.pip_package == wheel


def test_a_cuda_13_tree_is_told_by_its_cufft_and_cusolver_names():
    # No library here carries the CUDA release as its major version (libcusparse.so.12 is in
    # CUDA 12 and 13 alike), but cuFFT 12 and cuSOLVER 12 exist in CUDA 13 only.
    assert _library_providers.cuda_major(["libcusparse.so.12", "libcufft.so.12"]) == 13
    assert _library_providers.cuda_major(["libcusparse.so.12", "libcusolver.so.12"]) == 13
    assert _library_providers.cuda_major(["libcusparse.so.12", "libcufft.so.11"]) == 12
    # cuSOLVER 11 is in CUDA 11 and 12: it says nothing.
    assert _library_providers.cuda_major(["libcusparse.so.12", "libcusolver.so.11"]) is None


@pytest.mark.parametrize("cuda", [12, 13])
def test_each_library_the_cuda_plugin_opens_is_named_with_the_wheel_pjrt_cuda_installs(cuda):
    """jax-cudaNN-pjrt links no CUDA library (its load needs none); it opens these when a client
    is made. Each is named with the wheel that pjrt-cuda[cudaNN] installs for it, in a tree of
    that release, and alone wherever its name tells the release."""
    components = pjrt_cuda_libraries().COMPONENTS_BY_CUDA[cuda]
    names = [name for component in components for name in component.libraries]
    assert _library_providers.cuda_major(names) == cuda
    for component in components:
        for name in component.libraries:
            found = _library_providers.provider(name, cuda)
            assert found is not None and found.pip_package == component.distribution, name
            alone = _library_providers.provider(name)
            assert alone is not None and component.distribution in alone.description, name


@pytest.mark.parametrize("name, wheel", [
    # Read from the files of the wheels jax-oneapi-plugin 0.11.2's with-oneapi extra pins.
    ("libumf.so.0", "umf"),
    ("libhwloc.so.15", "tcmlib"),
    ("libOpenCL.so.1", "intel-opencl-rt"),
    ("libirc.so", "intel-cmplr-lib-rt"),
    ("libmkl_def.so.2", "mkl"),
    ("libmkl_vml_avx2.so.2", "mkl"),
    ("libmkl_sycl_dft.so.5", "onemkl-sycl-dft"),
    ("libmkl_sycl_lapack.so.5", "onemkl-sycl-lapack"),
    ("libmkl_sycl_rng.so.5", "onemkl-sycl-rng"),
    ("libmkl_sycl_sparse.so.5", "onemkl-sycl-sparse"),
    ("libpti_view.so.0", "intel-pti"),
])
def test_oneapi_runtime_wheels(name, wheel):
    found = _library_providers.provider(name)
    assert found is not None and found.pip_package == wheel and not found.is_driver


def test_an_unknown_mkl_sycl_library_is_not_guessed_into_the_mkl_wheel():
    # The SYCL parts of oneMKL are separate wheels; one not checked is reported bare.
    assert _library_providers.provider("libmkl_sycl_made_up.so.5") is None


def test_the_level_zero_layers_come_with_its_loader():
    # Debian's libze1 (and Intel's level-zero package) installs them beside libze_loader.so.1.
    loader = _library_providers.provider("libze_loader.so.1")
    for name in ("libze_tracing_layer.so.1", "libze_validation_layer.so.1"):
        assert _library_providers.provider(name) == loader, name
