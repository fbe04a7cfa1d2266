"""The hardware vendors' real PJRT plugins, loaded on whatever machine the tests run on.

These run in the ``vendor`` tox environment, which installs jax-cuda13-pjrt, jax-cuda12-pjrt,
libtpu, jax-rocm10-pjrt and jax-rocm7-pjrt (``pytest -m vendor``). On a machine without the hardware each plugin must
load (or fail to load with the missing library named), report its version, and fail client
creation with its own message wrapped in XlaRuntimeError; with the hardware, the client
must come up instead.
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import shutil
import subprocess

import numpy as np
import pytest

import pjrt
from conftest import vendor_library
from pjrt._loading import library_search as _library_search

HAS_LDD = shutil.which("ldd") is not None

pytestmark = pytest.mark.vendor


def _has_nvidia_gpu() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _has_amd_gpu() -> bool:
    return os.path.exists("/dev/kfd")


def _has_tpu() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


@pytest.mark.parametrize("cuda", [13, 12])
def test_cuda_plugin(cuda):
    # PJRT API 0.116 is newer than our header (0.114): the loader negotiates it down.
    name = f"vendor_cuda{cuda}"
    plugin = pjrt.load_pjrt_plugin_dynamically(
        name, vendor_library(f"jax-cuda{cuda}-pjrt", "xla_cuda_plugin.so"))
    assert plugin.api_version == (0, 116)
    attributes = plugin.attributes()
    assert cuda * 1000 <= attributes["cuda_version"] < (cuda + 1) * 1000
    if _has_nvidia_gpu():
        client = pjrt.make_c_api_client(name)
        assert client.platform == "cuda" and client.devices()
        array = client.buffer_from_pyval(np.arange(4.0))
        np.testing.assert_array_equal(np.asarray(array), np.arange(4.0))
        return
    with pytest.raises(pjrt.XlaRuntimeError) as info:
        pjrt.make_c_api_client(name)
    assert info.value.code_name == "FAILED_PRECONDITION"
    assert "No visible GPU devices" in info.value.plugin_message


def test_tpu_plugin(monkeypatch):
    # Off Google Cloud, libtpu retries the metadata server for minutes; skip the lookup.
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    plugin = pjrt.load_pjrt_plugin_dynamically("vendor_tpu", vendor_library("libtpu", "libtpu.so"))
    assert plugin.api_version == (0, 117)
    assert plugin.attributes()["stablehlo_minimum_version"] == [0, 9, 0]
    if _has_tpu():
        client = pjrt.make_c_api_client("vendor_tpu")
        assert client.platform == "tpu" and client.devices()
        return
    with pytest.raises(pjrt.XlaRuntimeError) as info:
        pjrt.make_c_api_client("vendor_tpu")
    assert info.value.code_name == "NOT_FOUND"
    assert "TPU initialization failed" in info.value.plugin_message


@pytest.mark.parametrize("distribution", ["jax-rocm10-pjrt", "jax-rocm7-pjrt"])
def test_rocm_plugin_names_the_missing_library(distribution):
    path = vendor_library(distribution, "xla_rocm_plugin.so")
    if _has_amd_gpu():
        plugin = pjrt.load_pjrt_plugin_dynamically("vendor_rocm", path)
        assert plugin.api_version[0] == 0
        return
    with pytest.raises(pjrt.PluginLoadError) as info:
        pjrt.load_pjrt_plugin_dynamically("vendor_rocm", path)
    missing = info.value.missing_library
    assert missing is not None and ".so" in missing
    assert missing in str(info.value) and "install" in str(info.value)
    assert not pjrt.xla_client.pjrt_plugin_loaded("vendor_rocm")


def test_all_vendor_plugins_coexist_with_the_cpu_plugin(cpu_plugin):
    """Several plugins, each with its own copy of XLA, loaded into one process."""
    for cuda in (13, 12):
        pjrt.load_pjrt_plugin_dynamically(
            f"vendor_cuda{cuda}", vendor_library(f"jax-cuda{cuda}-pjrt", "xla_cuda_plugin.so"))
    pjrt.load_pjrt_plugin_dynamically("vendor_tpu", vendor_library("libtpu", "libtpu.so"))
    with pjrt.make_c_api_client(cpu_plugin.name) as client:
        np.testing.assert_array_equal(np.asarray(client.buffer_from_pyval(np.arange(3))), [0, 1, 2])


def test_tpu_topology_compiles_ahead_of_time_without_a_tpu(libtpu_v5e):
    """libtpu describes a v5e slice and compiles for it with no TPU attached."""
    _, _, topology = libtpu_v5e
    assert topology.platform == "tpu"
    assert [d.device_kind for d in topology.device_descriptions()] == ["TPU v5 lite"] * 4
    program = open(os.path.join(os.path.dirname(__file__), "fixtures", "tiny_tanh.mlir")).read()
    executable = topology.compile_to_bytes(program)
    assert isinstance(executable, bytes) and len(executable) > 1000
    with pytest.raises(pjrt.XlaRuntimeError):
        topology.compile_to_bytes("func.func @main( not a program")
    topology.close()
    with pytest.raises(RuntimeError, match="closed"):
        topology.device_descriptions()


def test_a_topology_compile_refuses_extents_xla_cannot_multiply_out(libtpu_v5e):
    """A tensor type whose extents overflow int64 when multiplied in order, though it holds
    no element, is refused before libtpu's compiler, as a client's compile refuses it
    (XLA's CPU plugins cannot compile without a client)."""
    _, _, topology = libtpu_v5e
    tensor = "tensor<3x2305843009213693952x0xf32>"
    program = f"func.func public @main(%x: {tensor}) -> {tensor} {{ return %x : {tensor} }}"
    with pytest.raises(ValueError, match=r"the program's tensor<3x2305843009213693952x0xf32> "
                                         r"\(line 1\) cannot be given to a plugin"):
        topology.compile_to_bytes(program)


def test_tpu_compile_only_devices_and_jaxlibs_topology_names(libtpu_v5e):
    """jaxlib's ahead-of-time path: a TPU topology by its xla_client names, its compile-only
    devices, and a compile for one and for all four of them."""
    from pjrt import xla_client

    _, plugin, topology = libtpu_v5e
    same = xla_client.make_c_api_device_topology(plugin, "v5e:2x2")
    assert [d.id for d in same.device_descriptions()] == [
        d.id for d in topology.device_descriptions()]
    devices = topology._make_compile_only_devices()
    assert [(d.platform, d.device_kind) for d in devices] == [("tpu", "TPU v5 lite")] * 4
    compile_only = devices[0].client
    assert all(d.client is compile_only for d in devices) and compile_only.device_count() == 4
    program = open(os.path.join(os.path.dirname(__file__), "fixtures", "tiny_tanh.mlir")).read()
    one = topology.compile_to_bytes(program, devices=devices[:1])
    four = topology.compile_to_bytes(program, devices=devices)
    assert len(one) > 1000 and len(four) > 1000 and one != four
    # The unloaded executable of PJRT_Compile on the topology, inspected as jaxlib's is.
    executable = compile_only.compile(program, devices)
    assert "tanh" in executable.hlo_modules()[0].to_string()
    assert executable.get_compiled_memory_stats().argument_size_in_bytes > 0
    assert executable.get_output_memory_kinds() == [["device"]]
    assert len(executable.get_parameter_layouts()) == 2
    assert len(executable.serialize()) > 1000
    with pytest.raises(RuntimeError, match="compile-only devices"):
        executable.execute([])
    executable.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        executable.serialize()
    tpu = xla_client.make_tfrt_tpu_c_api_device_topology("v5e:2x2")
    assert tpu.platform == "tpu" and len(tpu.device_descriptions()) == 4
    with pytest.raises(pjrt.XlaRuntimeError):
        xla_client.make_tfrt_tpu_c_api_device_topology("not-a-topology")
    same.close()


# -- the missing-library report over real wheels (pjrt._loading.library_search; ldd is the oracle) ----

def _ldd_missing(path) -> set[str]:
    output = subprocess.run(["ldd", str(path)], capture_output=True, text=True,
                            timeout=60).stdout
    return {line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line}


def _names(missing) -> list[str]:
    return [library.name for library in missing]


def test_xla_cuda12_wheel_lists_all_it_lacks_driver_first():
    path = vendor_library("xla-cuda12-pjrt", "xla_gpu_pjrt.so")
    expected = _ldd_missing(path) if HAS_LDD else None
    if expected == set():
        pytest.skip("every library the CUDA plugin needs is installed here")
    with pytest.raises(pjrt.PluginLoadError) as info:
        pjrt.load_pjrt_plugin_dynamically("xla_cuda12_missing", path)
    missing = info.value.missing_libraries
    if expected is not None:
        assert set(_names(missing)) == expected
    message = str(info.value)
    for library in missing:
        assert library.name in message
    if "libcuda.so.1" in _names(missing):
        assert missing[0].is_driver and "NVIDIA's driver" in message
        assert info.value.missing_library == missing[0].name
    by_name = {library.name: library for library in missing}
    if "libcupti.so.12" in by_name:
        assert by_name["libcupti.so.12"].pip_package == "nvidia-cuda-cupti-cu12"
        assert "pip install" in message and "nvidia-cuda-cupti-cu12" in message


@pytest.mark.parametrize("distribution", ["jax-rocm10-pjrt", "jax-rocm7-pjrt"])
def test_rocm_wheel_lists_all_it_lacks_runtime_first(distribution):
    path = vendor_library(distribution, "xla_rocm_plugin.so")
    expected = _ldd_missing(path) if HAS_LDD else None
    if expected == set():
        pytest.skip("every library the ROCm plugin needs is installed here")
    missing = _library_search.missing_libraries(path)
    if expected is not None:
        assert set(_names(missing)) == expected
    drivers = [library.name for library in missing if library.is_driver]
    assert _names(missing)[:len(drivers)] == drivers
    assert {"libamdhip64.so.7", "libhsa-runtime64.so.1"} & set(_names(missing)) <= set(drivers)


#: Where the vendor environment installs jax-oneapi-pjrt: outside the import path, since its
#: jax_plugins.xla_oneapi module would otherwise be discovered as a fifth backend.
ONEAPI_SITE_VARIABLE = "PJRT_TEST_ONEAPI_SITE"


def _oneapi_library() -> str:
    site = os.environ.get(ONEAPI_SITE_VARIABLE)
    if site:
        path = os.path.join(site, "jax_plugins", "xla_oneapi", "xla_oneapi_plugin.so")
        assert os.path.isfile(path), f"{ONEAPI_SITE_VARIABLE}={site} holds no {path}"
        return path
    try:
        return vendor_library("jax-oneapi-pjrt", "xla_oneapi_plugin.so")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"jax-oneapi-pjrt is not installed: pip install --no-deps --target DIR "
                    f"jax-oneapi-pjrt==0.11.2 and set {ONEAPI_SITE_VARIABLE}=DIR (tox -e vendor "
                    f"does this)")


def test_oneapi_wheel_lists_all_it_lacks_level_zero_first():
    path = _oneapi_library()
    expected = _ldd_missing(path) if HAS_LDD else None
    if expected == set():
        pytest.skip("every library the oneAPI plugin needs is installed here")
    with pytest.raises(pjrt.PluginLoadError) as info:
        pjrt.load_pjrt_plugin_dynamically("oneapi_missing", path)
    missing = info.value.missing_libraries
    if expected is not None:
        assert sorted(_names(missing)) == sorted(expected)
    # The Level Zero loader (and its layer) come with Intel's GPU driver: first, and alone.
    drivers = [library.name for library in missing if library.is_driver]
    assert _names(missing)[:len(drivers)] == drivers
    assert all(name.startswith("libze_") for name in drivers)
    if "libze_loader.so.1" in _names(missing):
        assert info.value.missing_library == "libze_loader.so.1"
    # Everything else is a oneAPI runtime wheel, named with the pip command that installs it.
    message = str(info.value)
    for library in missing:
        assert library.provider is not None, library.name
        assert library.name in message
        if not library.is_driver:
            assert library.pip_package and library.pip_package in message, library.name
    assert "pip install " in message and "provider not known to pjrt" not in message


@pytest.mark.parametrize("distribution, filename", [
    # NVIDIA's plugin links no CUDA library: it opens them when a client is made (the
    # providers of those names are checked in test_library_search.py).
    ("jax-cuda13-pjrt", "xla_cuda_plugin.so"),
    ("jax-cuda12-pjrt", "xla_cuda_plugin.so"),
    ("libtpu", "libtpu.so"),
])
def test_plugins_that_need_nothing_missing_report_nothing(distribution, filename):
    path = vendor_library(distribution, filename)
    if HAS_LDD:
        assert _ldd_missing(path) == set()
    # (That each loads is test_cuda_plugin's and test_tpu_plugin's to check.)
    assert _library_search.missing_libraries(path) == []
