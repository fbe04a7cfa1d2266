"""The hardware plugin packages pjrt-cuda, pjrt-rocm and pjrt-tpu, on the vendors' real wheels.

These run in the ``vendor`` tox environment, which installs the three packages with
jax-cuda13-pjrt, jax-cuda12-pjrt, jax-rocm10-pjrt, jax-rocm7-pjrt, libtpu and one NVIDIA runtime
wheel per CUDA major (nvidia-cuda-runtime, nvidia-cuda-runtime-cu12). On a machine without a
GPU or TPU each backend must fail with its reason recorded while the CPU backend comes up as
the default; where the hardware exists (its device nodes are present) the backend must come up.

Discovery is exercised on fresh registries (``BackendRegistry(PluginTable())``), and the
questions about what got imported are answered by a fresh interpreter, since other test
modules import jax into this one.
"""
from __future__ import annotations

import glob
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pathlib
import re

import pytest

from pjrt import plugin_api, registry
from pjrt.errors import PluginLoadError, XlaRuntimeError
from pjrt._capi.options import XLA_OPTION_TYPES, check_option_types
from pjrt.plugin import PluginTable

import pjrt_cpu
from conftest import run_python, vendor_library

ROOT = pathlib.Path(__file__).resolve().parent.parent

try:
    import pjrt_cuda
    import pjrt_rocm
    import pjrt_tpu
    from pjrt_cuda import libraries
except ImportError as error:
    # The core tox environment does not install these packages; there every test here is
    # deselected (they are all `vendor`), but the module must still import.
    _MISSING = str(error)
    pjrt_cuda = pjrt_rocm = pjrt_tpu = libraries = None
else:
    _MISSING = None

pytestmark = pytest.mark.vendor

HAS_NVIDIA_GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
HAS_AMD_GPU = os.path.exists("/dev/kfd")
HAS_TPU = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))

#: Variables that would change what discovery or the plugins do; each test starts without them.
_PLUGIN_VARIABLES = (
    "PJRT_PLATFORMS", "PJRT_NAMES_AND_LIBRARY_PATHS", "TPU_LIBRARY_PATH",
    "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB",
    "PJRT_CUDA_VISIBLE_DEVICES", "PJRT_CUDA_SKIP_VERSION_CHECK",
)


@pytest.fixture(autouse=True)
def plugin_environment(monkeypatch):
    if _MISSING:
        pytest.fail(f"the hardware plugin packages are not installed ({_MISSING}); run these "
                    f"tests in the vendor tox environment (tox -e vendor)")
    for name in _PLUGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # Off Google Cloud libtpu would retry the metadata server for minutes.
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    # pjrt-tpu may set this one in os.environ itself; setting it here first makes monkeypatch
    # restore the variable's absence afterwards.
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "")
    monkeypatch.delenv("ALLOW_MULTIPLE_LIBTPU_LOAD")
    # GPU memory: take little, and only when asked, where a GPU exists.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _expected_up() -> dict[str, bool]:
    return {"cpu": True, "cuda": HAS_NVIDIA_GPU, "rocm": HAS_AMD_GPU, "tpu": HAS_TPU}


def _expected_default() -> str:
    up = _expected_up()
    return max((p for p in up if up[p]), key=lambda p: {"cuda": 500, "rocm": 500, "tpu": 300,
                                                          "cpu": 0}[p])


# -- the packages ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, distribution, platform, priority", [
    ("pjrt_cuda", "jax-cuda13-pjrt", "cuda", 500),  # CUDA 13's, with both installed
    ("pjrt_rocm", "jax-rocm10-pjrt", "rocm", 500),  # ROCm 10's, with both installed
    ("pjrt_tpu", "libtpu", "tpu", 300),
])
def test_library_path_is_the_file_inside_the_vendor_wheel(name, distribution, platform, priority):
    module = sys.modules[name]
    path = module.library_path()
    assert os.path.isabs(path) and os.path.isfile(path)
    files = {os.path.realpath(str(f.locate()))
             for f in importlib.metadata.distribution(distribution).files or []}
    assert os.path.realpath(path) in files
    assert (module.PLATFORM, module.PRIORITY) == (platform, priority)
    assert module.__version__ == "0.1.0"
    assert importlib.metadata.version(module.__name__.replace("_", "-")) == "0.1.0"


def _pins(project: str) -> dict[str, str]:
    """``distribution -> version`` of each ``name==version`` requirement in a pyproject."""
    text = (ROOT / project / "pyproject.toml").read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)==([0-9][^";,]*)"', text))


@pytest.mark.parametrize("project, distribution, library, api_version", [
    ("plugins/cuda", "jax-cuda13-pjrt", "xla_cuda_plugin.so", (0, 116)),
    ("plugins/cuda", "jax-cuda12-pjrt", "xla_cuda_plugin.so", (0, 116)),
    ("plugins/tpu", "libtpu", "libtpu.so", (0, 117)),
])
def test_the_installed_vendor_wheel_is_the_pinned_release_and_loads(project, distribution,
                                                                      library, api_version):
    """The release each package pins is the one installed here, and its library loads with
    the PJRT API version the package's docs name (ROCm's needs ROCm itself to load: see
    test_rocm_missing_library_names_it_and_how_to_install_rocm)."""
    assert importlib.metadata.version(distribution) == _pins(project)[distribution]
    plugin = PluginTable().load(f"pinned_{distribution}", vendor_library(distribution, library))
    assert plugin.api_version == api_version
    assert f"{api_version[0]}.{api_version[1]}" in (ROOT / project / "README.md").read_text()


@pytest.mark.parametrize("distribution", ["jax-rocm10-pjrt", "jax-rocm7-pjrt"])
def test_the_installed_rocm_wheel_is_the_pinned_release(distribution):
    assert importlib.metadata.version(distribution) == _pins("plugins/rocm")[distribution]
    assert os.path.isfile(vendor_library(distribution, "xla_rocm_plugin.so"))


def test_cuda_13_is_chosen_when_both_wheels_are_installed_and_named():
    found = pjrt_cuda.vendor_plugin()
    assert (found.cuda, found.distribution) == (13, "jax-cuda13-pjrt")
    assert found.version == importlib.metadata.version("jax-cuda13-pjrt")
    assert str(found) == f"jax-cuda13-pjrt {found.version}"
    assert found.library == vendor_library("jax-cuda13-pjrt", "xla_cuda_plugin.so")


def test_cuda_12_is_found_when_it_is_the_only_wheel(monkeypatch):
    # As if jax-cuda13-pjrt were not installed: its module name is one no package has.
    monkeypatch.setattr(pjrt_cuda, "VENDOR_WHEELS", (
        (13, "jax-cuda13-pjrt", "jax_plugins.xla_cuda13_absent"), *pjrt_cuda.VENDOR_WHEELS[1:]))
    found = pjrt_cuda.vendor_plugin()
    assert (found.cuda, found.distribution) == (12, "jax-cuda12-pjrt")
    assert pjrt_cuda.library_path() == vendor_library("jax-cuda12-pjrt", "xla_cuda_plugin.so")
    # The CUDA 12 wheels' layout is the one looked for then.
    (runtime,) = [f for f in pjrt_cuda.prepare_cuda_libraries() if f.component.name == "CUDA runtime"]
    assert runtime.component.distribution == "nvidia-cuda-runtime-cu12"


def test_no_cuda_wheel_is_a_clear_error_naming_both_extras(monkeypatch, make_registry):
    monkeypatch.setattr(pjrt_cuda, "VENDOR_WHEELS", tuple(
        (cuda, distribution, module + "_absent")
        for cuda, distribution, module in pjrt_cuda.VENDOR_WHEELS))
    with pytest.raises(FileNotFoundError) as info:
        pjrt_cuda.vendor_plugin()
    message = str(info.value)
    assert "jax-cuda13-pjrt" in message and "jax-cuda12-pjrt" in message
    assert "pjrt-cuda[cuda13]" in message and "pjrt-cuda[cuda12]" in message
    reg = make_registry()
    assert "pjrt-cuda[cuda13]" in reg.backend_errors()["cuda"] and "cpu" in reg.backends()


def test_pjrt_info_names_the_vendor_wheels_an_extra_installed():
    # pjrt-cuda requires its vendor wheel through an extra (pjrt-cuda[cuda13]); pjrt info
    # reports those that are installed, and no extra's requirement that is not.
    from pjrt._app import cli

    versions = cli.gather_versions(["pjrt-cuda"])
    for distribution in ("jax-cuda13-pjrt", "jax-cuda12-pjrt", "nvidia-cuda-runtime"):
        assert versions[distribution] == importlib.metadata.version(distribution)
    assert "nvidia-cudnn-cu13" not in versions  # an extra's requirement not installed here


@pytest.mark.parametrize("name", ["pjrt_cuda", "pjrt_rocm", "pjrt_tpu"])
def test_each_package_advertises_a_jax_plugins_entry_point(name):
    entry_points = importlib.metadata.entry_points(group="jax_plugins")
    assert name in {ep.value for ep in entry_points}


@pytest.mark.parametrize("name", ["pjrt_cuda", "pjrt_rocm", "pjrt_tpu"])
def test_initialize_outside_discovery_registers_nothing(name, monkeypatch):
    module = sys.modules[name]
    calls = []
    for function in ("register_plugin", "register_backend_factory", "register_unavailable"):
        monkeypatch.setattr(plugin_api, function, lambda *a, **k: calls.append(a))
    assert not registry.discovering()
    assert module.initialize() is None
    assert module.PLUGIN.initialize() is None  # neither pjrt nor JAX asked
    assert calls == []


@pytest.mark.parametrize("name", ["pjrt_cpu", "pjrt_cuda", "pjrt_rocm", "pjrt_tpu"])
def test_each_package_declares_its_plugin_and_leaves_jax_alone(name):
    declaration = sys.modules[name].PLUGIN
    assert isinstance(declaration, plugin_api.PluginDeclaration)
    assert declaration.platform == sys.modules[name].PLATFORM
    assert declaration.priority == sys.modules[name].PRIORITY
    # JAX serves these platforms itself (its CPU backend, the vendors' own jax_plugins modules).
    assert declaration.serve_jax is False


def test_under_jax_initialize_imports_neither_jax_nor_the_vendor_modules():
    """What JAX does: import each jax_plugins entry point and call initialize()."""
    child = textwrap.dedent("""
        import json, sys
        import pjrt_cuda, pjrt_rocm, pjrt_tpu
        for module in (pjrt_cuda, pjrt_rocm, pjrt_tpu):
            module.initialize()
        from pjrt.plugin import default_plugins
        print(json.dumps({
            "imported": sorted(m for m in ("jax", "libtpu", "jax_plugins.xla_cuda12",
                                           "jax_plugins.xla_cuda13", "jax_plugins.xla_rocm7",
                                           "jax_plugins.xla_rocm10") if m in sys.modules),
            "loaded": default_plugins.names(),
        }))
    """)
    result = run_python(child, timeout=60)
    assert json.loads(result.stdout.splitlines()[-1]) == {"imported": [], "loaded": []}


# -- discovery with all four packages installed ------------------------------------------------

_DISCOVERY_CHILD = textwrap.dedent("""
    import json, sys
    from pjrt import registry
    from pjrt.plugin import PluginTable
    reg = registry.BackendRegistry(PluginTable(), environ={})
    default = reg.default_backend()
    print(json.dumps({
        "default": default,
        "up": sorted(reg.backends()),
        "errors": reg.backend_errors(),
        "records": {r.name: [r.action, r.detail] for r in reg.discovery_records},
        "priorities": {name: r.priority for name, r in reg.registrations().items()},
        "imported": sorted(m for m in ("jax", "libtpu", "jax_plugins.xla_cuda12",
                                       "jax_plugins.xla_cuda13", "jax_plugins.xla_rocm7",
                                       "jax_plugins.xla_rocm10") if m in sys.modules),
    }))
""")


@pytest.fixture(scope="module")
def discovered():
    """Discovery in a fresh interpreter: what came up, why the rest did not, what was imported."""
    env = {k: v for k, v in os.environ.items() if k not in _PLUGIN_VARIABLES}
    env["TPU_SKIP_MDS_QUERY"] = "1"
    # This process may already hold libtpu's lockfile.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    result = run_python(_DISCOVERY_CHILD, env=env)
    return json.loads(result.stdout.splitlines()[-1])


def test_discovery_makes_the_best_backend_that_came_up_the_default(discovered):
    assert discovered["default"] == _expected_default()
    assert discovered["up"] == sorted(p for p, up in _expected_up().items() if up)
    assert discovered["priorities"] == {"cpu": 0, "cuda": 500, "rocm": 500, "tpu": 300}


def test_discovery_records_why_each_missing_backend_failed(discovered):
    errors = discovered["errors"]
    if not HAS_NVIDIA_GPU:
        assert "FAILED_PRECONDITION" in errors["cuda"]
        assert "No visible GPU devices" in errors["cuda"]
    if not HAS_AMD_GPU:
        assert errors["rocm"].startswith("PluginLoadError:")
        assert ".so" in errors["rocm"] and pjrt_rocm.ROCM_INSTALL_URL in errors["rocm"]
        assert "LD_LIBRARY_PATH" in errors["rocm"]
    if not HAS_TPU:
        assert "NOT_FOUND" in errors["tpu"] and "TPU initialization failed" in errors["tpu"]
    assert "cpu" not in errors


def test_jax_only_modules_are_skipped_and_jax_is_never_imported(discovered):
    records = discovered["records"]
    for module, platform in (("jax_plugins.xla_cuda12", "cuda"), ("jax_plugins.xla_cuda13", "cuda"),
                             ("jax_plugins.xla_rocm7", "rocm"), ("jax_plugins.xla_rocm10", "rocm")):
        action, detail = records[module]
        assert action == "skipped" and f"already serves {platform!r}" in detail
    assert records["pjrt_cuda"][0] == "initialized"
    assert records["pjrt_tpu"][0] == "initialized"
    assert records["pjrt_rocm"][0] == ("initialized" if HAS_AMD_GPU else "failed")
    assert discovered["imported"] == []


def test_fresh_registry_in_process_matches(make_registry):
    reg = make_registry()
    assert reg.default_backend() == _expected_default()
    registrations = reg.registrations()
    for platform in ("cuda", "rocm", "tpu"):
        assert registrations[platform].source == "entry point"
        assert registrations[platform].module == f"pjrt_{platform}"
    assert set(reg.backend_errors()) == {p for p, up in _expected_up().items() if not up}


# -- CUDA: options from the environment --------------------------------------------------------

def test_gpu_options_default_to_the_plugins_own():
    options = pjrt_cuda.generate_pjrt_gpu_plugin_options({})
    assert options == {"platform_name": "cuda", "allocator": "default"}


def test_gpu_options_from_every_variable(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "BFC")
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", ".25")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "False")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "64")
    monkeypatch.setenv("PJRT_CUDA_VISIBLE_DEVICES", " 1, 0 ")
    options = pjrt_cuda.client_options()
    assert options == {"platform_name": "cuda", "allocator": "bfc", "memory_fraction": 0.25,
                       "preallocate": False, "collective_memory_size": 64 << 20,
                       "visible_devices": [1, 0]}
    assert type(options["memory_fraction"]) is float
    assert type(options["preallocate"]) is bool
    assert type(options["collective_memory_size"]) is int
    assert all(type(d) is int for d in options["visible_devices"])
    # pjrt's own check of XLA's option types accepts every one of them.
    assert check_option_types(options, XLA_OPTION_TYPES) == options


def test_gpu_options_old_memory_fraction_name_and_all_devices(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    monkeypatch.setenv("PJRT_CUDA_VISIBLE_DEVICES", "all")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "1")
    options = pjrt_cuda.generate_pjrt_gpu_plugin_options()
    assert options["memory_fraction"] == 0.5 and options["preallocate"] is True
    assert "visible_devices" not in options


@pytest.mark.parametrize("variables, named", [
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "malloc"}, "XLA_PYTHON_CLIENT_ALLOCATOR"),
    ({"XLA_CLIENT_MEM_FRACTION": "most"}, "XLA_CLIENT_MEM_FRACTION"),
    ({"XLA_CLIENT_MEM_FRACTION": "1.5"}, "XLA_CLIENT_MEM_FRACTION"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0"}, "XLA_PYTHON_CLIENT_MEM_FRACTION"),
    ({"XLA_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4"},
     "XLA_PYTHON_CLIENT_MEM_FRACTION"),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "maybe"}, "XLA_PYTHON_CLIENT_PREALLOCATE"),
    ({"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "1.5"}, "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB"),
    ({"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "-1"}, "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB"),
    ({"PJRT_CUDA_VISIBLE_DEVICES": "0,gpu1"}, "PJRT_CUDA_VISIBLE_DEVICES"),
    ({"PJRT_CUDA_VISIBLE_DEVICES": "-1"}, "PJRT_CUDA_VISIBLE_DEVICES"),
    ({"PJRT_CUDA_VISIBLE_DEVICES": "0,0"}, "PJRT_CUDA_VISIBLE_DEVICES"),
])
def test_gpu_options_bad_value_is_a_value_error_naming_the_variable(monkeypatch, variables, named):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=named):
        pjrt_cuda.generate_pjrt_gpu_plugin_options()


def test_the_cuda_plugin_accepts_the_generated_options(monkeypatch):
    """The real plugin takes every generated option: without a GPU it gets as far as looking
    for devices (FAILED_PRECONDITION), not INVALID_ARGUMENT about an option."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.1")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "0")
    monkeypatch.setenv("PJRT_CUDA_VISIBLE_DEVICES", "0")
    plugin = PluginTable().load("cuda", pjrt_cuda.library_path())
    if HAS_NVIDIA_GPU:
        with pjrt_cuda.make_client(plugin) as client:
            assert client.platform == "cuda" and len(client.devices()) == 1
        return
    with pytest.raises(XlaRuntimeError) as info:
        pjrt_cuda.make_client(plugin)
    assert info.value.code_name == "FAILED_PRECONDITION"


def test_a_bad_gpu_variable_is_the_cuda_backends_reason(monkeypatch, make_registry):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "malloc")
    reg = make_registry()
    assert "cuda" not in reg.backends() and "cpu" in reg.backends()
    reason = reg.backend_errors()["cuda"]
    assert reason.startswith("ValueError:") and "XLA_PYTHON_CLIENT_ALLOCATOR='malloc'" in reason


# -- CUDA: the NVIDIA pip libraries ------------------------------------------------------------

@pytest.mark.parametrize("cuda, distribution, directory", [
    (12, "nvidia-cuda-runtime-cu12", "cuda_runtime"),
    (13, "nvidia-cuda-runtime", "cu13"),  # CUDA 13's wheels share nvidia/cu13/lib
])
def test_the_pip_cuda_runtime_is_found_and_its_version_read_from_the_library(cuda, distribution,
                                                                            directory):
    found = {f.component.name: f for f in libraries.find_cuda_libraries(cuda=cuda)}
    runtime = found["CUDA runtime"]
    assert runtime.component.distribution == distribution
    assert runtime.directory.endswith(os.path.join("nvidia", directory, "lib"))
    assert runtime.version_source == "library" and runtime.load_error is None
    wheel = tuple(int(p) for p in importlib.metadata.version(distribution).split("."))
    assert runtime.version == wheel[:2] and runtime.version[0] == cuda
    libraries.check_versions(list(found.values()))  # the vendor env's runtimes pass


def _fake_site(tmp_path, *, library: bytes | None = None, metadata_version: str | None = None,
               distribution: str = "nvidia-cudnn-cu12"):
    """A site directory holding a fake cuDNN wheel (``distribution``): its library and/or its
    dist-info."""
    lib_dir = tmp_path / "site" / "nvidia" / "cudnn" / "lib"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libcudnn.so.9").write_bytes(library if library is not None else b"not an ELF")
    if metadata_version:
        info = tmp_path / "site" / f"{distribution.replace('-', '_')}-{metadata_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\n"
                                       f"Version: {metadata_version}\n")
    return str(tmp_path / "site")


def _compiled_cudnn(tmp_path, code: int) -> bytes:
    # A library exporting cudnnGetVersion, built without a soname so that nothing else in the
    # process could mistake it for the real libcudnn.so.9.
    source = tmp_path / "fake_cudnn.c"
    source.write_text(f"#include <stddef.h>\nsize_t cudnnGetVersion(void) {{ return {code}; }}\n")
    output = tmp_path / "fake_cudnn.so"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", str(output),
                    str(source)], check=True, capture_output=True)
    return output.read_bytes()


def test_an_old_cudnn_library_is_named_with_the_upgrade_command(tmp_path):
    site = _fake_site(tmp_path, library=_compiled_cudnn(tmp_path, 90100))
    (found,) = libraries.find_cuda_libraries([site])
    assert (found.component.name, found.version, found.version_source) == ("cuDNN", (9, 1, 0),
                                                                            "library")
    with pytest.raises(libraries.CudaLibraryVersionError) as info:
        libraries.check_versions([found])
    message = str(info.value)
    assert "cuDNN 9.1.0" in message and "9.10" in message and found.directory in message
    assert "pip install --upgrade 'nvidia-cudnn-cu12>=9.10'" in message
    assert "'pjrt-cuda[cuda12]'" in message
    assert info.value.too_old == [found]


def test_a_recent_enough_cudnn_passes(tmp_path):
    site = _fake_site(tmp_path, library=_compiled_cudnn(tmp_path, 91001))
    (found,) = libraries.find_cuda_libraries([site])
    assert found.version == (9, 10, 1)
    libraries.check_versions([found])


def test_the_wheel_metadata_tells_when_the_library_cannot(tmp_path):
    site = _fake_site(tmp_path, metadata_version="9.1.0.70")
    (found,) = libraries.find_cuda_libraries([site])
    assert found.load_error and found.version == (9, 1, 0, 70)
    assert found.version_source == "metadata"
    with pytest.raises(libraries.CudaLibraryVersionError, match=r"cuDNN 9\.1\.0\.70"):
        libraries.check_versions([found])


def test_an_old_pip_library_is_the_cuda_backends_reason(tmp_path, monkeypatch, make_registry):
    # jax-cuda13-pjrt is the plugin chosen here, so CUDA 13's cuDNN wheel is the one checked.
    monkeypatch.syspath_prepend(_fake_site(tmp_path, metadata_version="9.1.0.70",
                                           distribution="nvidia-cudnn-cu13"))
    reg = make_registry()
    reason = reg.backend_errors()["cuda"]
    assert reason.startswith("CudaLibraryVersionError:") and "cuDNN 9.1.0.70" in reason
    assert f"too old for {pjrt_cuda.vendor_plugin()}" in reason
    assert "'nvidia-cudnn-cu13>=9.12'" in reason and "'pjrt-cuda[cuda13]'" in reason
    assert "cpu" in reg.backends()
    # The check can be skipped; then the plugin's own verdict comes back.
    monkeypatch.setenv(pjrt_cuda.SKIP_VERSION_CHECK_ENV, "1")
    reg = make_registry()
    if HAS_NVIDIA_GPU:
        assert "cuda" in reg.backends()
    else:
        assert "No visible GPU devices" in reg.backend_errors()["cuda"]


# -- ROCm --------------------------------------------------------------------------------------

def test_rocm_10_is_chosen_when_both_wheels_are_installed_and_named():
    found = pjrt_rocm.vendor_plugin()
    assert (found.rocm, found.distribution, found.extra) == ("10.1", "jax-rocm10-pjrt", "rocm10")
    assert found.version == importlib.metadata.version("jax-rocm10-pjrt")
    assert str(found) == f"jax-rocm10-pjrt {found.version}"
    assert found.library == vendor_library("jax-rocm10-pjrt", "xla_rocm_plugin.so")
    assert pjrt_rocm.library_path() == found.library


def test_rocm_7_is_found_when_it_is_the_only_wheel(monkeypatch):
    # As if jax-rocm10-pjrt were not installed: its module name is one no package has.
    monkeypatch.setattr(pjrt_rocm, "VENDOR_WHEELS", (
        ("10.1", "jax-rocm10-pjrt", "jax_plugins.xla_rocm10_absent", "rocm10"),
        *pjrt_rocm.VENDOR_WHEELS[1:]))
    found = pjrt_rocm.vendor_plugin()
    assert (found.rocm, found.distribution, found.extra) == ("7", "jax-rocm7-pjrt", "rocm7")
    assert found.version == importlib.metadata.version("jax-rocm7-pjrt")
    assert pjrt_rocm.library_path() == vendor_library("jax-rocm7-pjrt", "xla_rocm_plugin.so")


def test_no_rocm_wheel_is_a_clear_error_naming_both_extras(monkeypatch, make_registry):
    monkeypatch.setattr(pjrt_rocm, "VENDOR_WHEELS", tuple(
        (rocm, distribution, module + "_absent", extra)
        for rocm, distribution, module, extra in pjrt_rocm.VENDOR_WHEELS))
    with pytest.raises(FileNotFoundError) as info:
        pjrt_rocm.vendor_plugin()
    message = str(info.value)
    assert "jax-rocm10-pjrt" in message and "jax-rocm7-pjrt" in message
    assert "pjrt-rocm[rocm10]" in message and "pjrt-rocm[rocm7]" in message
    reg = make_registry()
    assert "pjrt-rocm[rocm10]" in reg.backend_errors()["rocm"] and "cpu" in reg.backends()


def _ldd_missing(path: str) -> list[str] | None:
    """What ``ldd`` says the loader cannot find for ``path`` (None without ldd)."""
    import shutil

    if shutil.which("ldd") is None:
        return None
    output = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60).stdout
    return [line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line]


#: The ROCm runtimes everything else needs: they come first in the report.
_ROCM_DRIVERS = ["libhsa-runtime64.so.1", "libamdhip64.so.7"]


@pytest.mark.skipif(HAS_AMD_GPU, reason="an AMD GPU is present: the ROCm plugin is expected to load")
@pytest.mark.parametrize("distribution, rocm", [("jax-rocm10-pjrt", "10.1"),
                                                ("jax-rocm7-pjrt", "7")])
def test_rocm_wheel_without_rocm_names_every_missing_library_and_how_to_install(
        distribution, rocm):
    path = vendor_library(distribution, "xla_rocm_plugin.so")
    with pytest.raises(PluginLoadError) as info:
        PluginTable().load("rocm", path)
    missing = [library.name for library in info.value.missing_libraries]
    expected = _ldd_missing(path)
    if expected is not None:
        assert sorted(missing) == sorted(expected)
    assert missing[:2] == _ROCM_DRIVERS
    assert [library.is_driver for library in info.value.missing_libraries] == (
        [True, True] + [False] * (len(missing) - 2))
    explained = pjrt_rocm.explain_load_error(info.value)
    assert explained.path == info.value.path == path
    assert explained.missing_library == info.value.missing_library == _ROCM_DRIVERS[0]
    assert explained.missing_libraries == info.value.missing_libraries
    message = str(explained)
    assert f"from {distribution} " in message and f"from ROCm {rocm}," in message
    assert pjrt_rocm.ROCM_INSTALL_URL in message
    assert "/opt/rocm/lib" in message and "LD_LIBRARY_PATH" in message
    for name in missing:
        assert name in message
    # The runtimes' line comes before every other library's.
    assert message.index(_ROCM_DRIVERS[1]) < min(message.index(name) for name in missing[2:])


@pytest.mark.skipif(HAS_AMD_GPU, reason="an AMD GPU is present: the ROCm plugin is expected to load")
def test_rocm_backends_reason_keeps_the_advice_and_every_missing_library(make_registry):
    with pytest.raises(PluginLoadError) as info:
        PluginTable().load("rocm", pjrt_rocm.library_path())
    message = str(pjrt_rocm.explain_load_error(info.value))
    reg = make_registry()
    recorded = reg.backend_errors()["rocm"]
    assert recorded == f"PluginLoadError: {message}"
    assert "jax-rocm10-pjrt" in recorded and "ROCm 10.1" in recorded
    for library in info.value.missing_libraries:
        assert library.name in recorded
    record = next(r for r in reg.discovery_records if r.name == "pjrt_rocm")
    assert record.action == "failed" and f"PluginLoadError: {record.detail}" == recorded


@pytest.mark.skipif(not HAS_AMD_GPU, reason="needs an AMD GPU (/dev/kfd)")
def test_rocm_comes_up_on_an_amd_gpu(make_registry):
    reg = make_registry()
    assert reg.get_backend("rocm").platform == "rocm"


def test_other_load_errors_are_left_alone():
    error = PluginLoadError("plugin 'rocm': no file at /nowhere", path="/nowhere")
    assert pjrt_rocm.explain_load_error(error) is error


# -- TPU ---------------------------------------------------------------------------------------

def test_tpu_library_path_honours_the_variable(monkeypatch):
    wheel_library = pjrt_tpu.library_path()
    monkeypatch.setenv("TPU_LIBRARY_PATH", wheel_library)
    assert pjrt_tpu.library_path() == wheel_library


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_tpu_library_path_naming_no_file_is_a_clear_error(monkeypatch, tmp_path, kind,
                                                          make_registry):
    target = tmp_path / "libtpu.so" if kind == "missing" else tmp_path
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(target))
    with pytest.raises(FileNotFoundError) as info:
        pjrt_tpu.library_path()
    message = str(info.value)
    assert f"TPU_LIBRARY_PATH={str(target)!r}" in message and "unset it" in message
    reg = make_registry()
    assert reg.backend_errors()["tpu"] == f"PluginLoadError: {message}"
    assert "cpu" in reg.backends()


def test_slow_tpu_client_creation_logs_a_warning(monkeypatch, caplog, make_registry):
    # The threshold is shrunk and client creation made slower than it, deterministically:
    # libtpu itself answers in milliseconds here.
    import pjrt.client

    real_create = pjrt.client.create_client

    def slow_create(plugin, options=None):
        if plugin.name == "tpu":
            time.sleep(0.3)
        return real_create(plugin, options)

    monkeypatch.setattr(pjrt.client, "create_client", slow_create)
    monkeypatch.setattr(pjrt_tpu, "SLOW_INIT_WARNING_SECONDS", 0.01)
    with caplog.at_level(logging.WARNING, logger="pjrt_tpu"):
        reg = make_registry()
        reg.backends()
    warnings = [r for r in caplog.records if r.name == "pjrt_tpu"]
    assert len(warnings) == 1 and "more than 0.01 seconds" in warnings[0].getMessage()
    if not HAS_TPU:
        assert "TPU initialization failed" in reg.backend_errors()["tpu"]


def test_fast_tpu_client_creation_logs_nothing_and_leaves_no_timer(caplog):
    plugin = PluginTable().load("tpu", pjrt_tpu.library_path())
    with caplog.at_level(logging.WARNING, logger="pjrt_tpu"):
        try:
            pjrt_tpu.make_client(plugin).close()
        except XlaRuntimeError as error:
            assert not HAS_TPU and error.code_name == "NOT_FOUND"
    assert [r for r in caplog.records if r.name == "pjrt_tpu"] == []
    assert not [t for t in threading.enumerate()
                if isinstance(t, threading.Timer) and t.is_alive()]


def test_tpu_topology_without_a_tpu(make_registry):
    reg = make_registry()
    topology = reg.make_pjrt_topology("tpu", "v5e:2x2")
    assert topology.platform == "tpu"
    devices = topology.device_descriptions()
    assert len(devices) == 4 and {d.device_kind for d in devices} == {"TPU v5 lite"}
    assert len(pjrt_tpu.make_topology("v4:2x2x1").device_descriptions()) == 8
    with pytest.raises(XlaRuntimeError) as info:
        reg.make_pjrt_topology("tpu", "not-a-topology")
    assert info.value.code_name == "INVALID_ARGUMENT"


def test_tpu_topology_when_pjrt_platforms_leaves_tpu_out():
    reg = registry.BackendRegistry(PluginTable(), environ={"PJRT_PLATFORMS": "cpu"})
    try:
        topology = reg.make_pjrt_topology("tpu", "v5e:2x2")
        assert len(topology.device_descriptions()) == 4
        assert sorted(reg.backends()) == ["cpu"]  # no TPU backend was brought up for it
    finally:
        reg.clear_backends()


def test_libtpu_switches_are_set_only_off_google_cloud_without_a_tpu(monkeypatch, tmp_path):
    product = tmp_path / "product_name"
    monkeypatch.setattr(pjrt_tpu, "DMI_PRODUCT_NAME", str(product))
    monkeypatch.setattr(pjrt_tpu, "TPU_DEVICE_PATTERNS", (str(tmp_path / "accel*"),))
    switches = ("TPU_SKIP_MDS_QUERY", "ALLOW_MULTIPLE_LIBTPU_LOAD")

    def configured(product_name: str | None, *, tpu: bool = False, preset: str | None = None):
        for name in switches:
            monkeypatch.delenv(name, raising=False)
            if preset is not None:
                monkeypatch.setenv(name, preset)
        if product_name is None:
            product.unlink(missing_ok=True)
        else:
            product.write_text(product_name + "\n")
        (tmp_path / "accel0").unlink(missing_ok=True)
        if tpu:
            (tmp_path / "accel0").touch()
        pjrt_tpu.configure_environment()
        return tuple(os.environ.get(name) for name in switches)

    assert configured("Standard PC (Q35 + ICH9, 2009)") == ("1", "1")
    assert configured(None) == ("1", "1")  # a container that hides the product name
    assert configured("Google Compute Engine") == (None, "1")
    assert configured("Standard PC", tpu=True) == (None, None)
    assert configured("Standard PC", preset="0") == ("0", "0")


def test_discovery_without_tpu_skip_mds_query_does_not_wait_for_the_metadata_server():
    """Off Google Cloud and without a TPU, pjrt-tpu sets TPU_SKIP_MDS_QUERY=1 itself (without it
    libtpu spends minutes retrying the metadata server before failing), and
    ALLOW_MULTIPLE_LIBTPU_LOAD=1, so this second process is not stopped by libtpu's lockfile."""
    child = textwrap.dedent("""
        import json, os, time
        from pjrt import registry
        from pjrt.plugin import PluginTable
        start = time.monotonic()
        reg = registry.BackendRegistry(PluginTable(), environ={})
        errors = reg.backend_errors()
        print(json.dumps({"seconds": time.monotonic() - start, "tpu": errors.get("tpu"),
                          "skip": os.environ.get("TPU_SKIP_MDS_QUERY")}))
    """)
    # Left to pjrt-tpu: both libtpu switches (this process may hold libtpu's lockfile).
    env = {k: v for k, v in os.environ.items() if k not in _PLUGIN_VARIABLES
           and k not in ("TPU_SKIP_MDS_QUERY", "ALLOW_MULTIPLE_LIBTPU_LOAD")}
    result = run_python(child, env=env)
    outcome = json.loads(result.stdout.splitlines()[-1])
    if HAS_TPU or pjrt_tpu.on_google_cloud():
        assert outcome["skip"] is None  # libtpu needs the metadata server there
    else:
        assert outcome["skip"] == "1" and outcome["seconds"] < 30
        assert "TPU initialization failed" in outcome["tpu"]
