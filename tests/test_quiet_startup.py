"""A quiet start-up, and messages that keep what matters.

Plugins log from C straight to file descriptor 2. Bringing up backends that were not asked
for (to see whether they can come up) must not print their logs; what they wrote is kept with
the backend (``pjrt.registry.backend_logs()``, ``pjrt info -v``), and ``PJRT_LOG_LEVEL``
turns it back on. The vendor tests run the real CUDA, ROCm and TPU plugins on a machine
without their hardware, where each of them is noisy.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

import pjrt
from pjrt import registry
from pjrt._app import cli
from pjrt._loading import plugin_logging
from pjrt.plugin import PluginTable

#: Lines the vendors' plugins print while failing to find their hardware.
PLUGIN_LOG_MARKERS = ("cuInit", "InitGoogle", "Source Location Trace", "TPU_ACCELERATOR_TYPE",
                      "absl::InitializeLog", "E0000", "I0000", "could not load its library")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (this one), with ``env`` added to the environment."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PJRT_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL", "PJRT_PLATFORMS")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=300)


def plugin_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(m in line for m in PLUGIN_LOG_MARKERS)]


def write_to_fd2(text: str) -> None:
    """Write to file descriptor 2 from C, as a plugin does (Python's sys.stderr is not used)."""
    data = text.encode()
    ctypes.CDLL(None).write(2, data, len(data))


def noisy_failing_factory(text: str):
    def factory():
        write_to_fd2(text)
        raise RuntimeError("no hardware here")
    return factory


@pytest.fixture
def fresh_registry():
    reg = registry.BackendRegistry(PluginTable(), environ={})
    yield reg
    reg.clear_backends()


# -- the plugins' own logging -----------------------------------------------------------------

def test_cpu_plugin_info_line_is_quiet_by_default_and_back_with_the_switch():
    # XLA's CPU plugin logs "cpu_device_count set via create_options" at INFO level when a
    # client is made with that option; pjrt raises its threshold unless told otherwise.
    code = "import pjrt; c = pjrt.make_cpu_client(4); print(c.device_count())"
    quiet = run_python(code)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "4"
    assert "cpu_device_count set via create_options" not in quiet.stderr
    assert plugin_lines(quiet.stderr) == []

    loud = run_python(code, PJRT_LOG_LEVEL="info")
    assert loud.returncode == 0, loud.stderr
    assert "cpu_device_count set via create_options: 4" in loud.stderr


def test_a_threshold_the_user_set_is_kept():
    # The plugin logs at the user's threshold; whether it reaches stderr is PJRT_LOG_LEVEL's
    # to say: quiet (the default) keeps it with the plugin, as for every client.
    code = ("import os, pjrt; from pjrt._loading import plugin_logging; pjrt.make_cpu_client(2); "
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL']); "
            "print(''.join(plugin_logging.plugin_logs().values()).replace(chr(10), ' '))")
    result = run_python(code, TF_CPP_MIN_LOG_LEVEL="0")
    threshold, kept = result.stdout.splitlines()
    assert threshold == "0"
    assert "cpu_device_count set via create_options: 2" in kept
    shown = run_python(code, TF_CPP_MIN_LOG_LEVEL="0", PJRT_LOG_LEVEL="warning")
    assert "cpu_device_count set via create_options: 2" in shown.stderr


def test_an_unknown_log_level_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="PJRT_LOG_LEVEL is 'loud'; use one of quiet, warning"):
        plugin_logging.log_level({"PJRT_LOG_LEVEL": "loud"})
    assert plugin_logging.log_level({}) == "quiet"
    assert plugin_logging.log_level({"PJRT_LOG_LEVEL": " Info "}) == "info"


# -- what a backend not asked for prints -------------------------------------------------------

def test_output_of_a_backend_not_asked_for_is_kept_not_printed(fresh_registry, capfd):
    fresh_registry.register_backend_factory("noisy", noisy_failing_factory("noisy: E0000 cuInit\n"))
    assert "cpu" in fresh_registry.backends()
    out, err = capfd.readouterr()
    assert "cuInit" not in err
    assert fresh_registry.backend_errors()["noisy"] == "RuntimeError: no hardware here"
    assert fresh_registry.plugin_output.as_dict()["noisy"] == "noisy: E0000 cuInit\n"
    # stderr works again afterwards
    write_to_fd2("after\n")
    assert capfd.readouterr().err == "after\n"


def test_a_backend_asked_for_by_name_speaks_for_itself(fresh_registry, capfd):
    fresh_registry.register_backend_factory("noisy", noisy_failing_factory("noisy: asked\n"))
    fresh_registry.set_platforms(["cpu", "noisy"])
    with pytest.raises(RuntimeError, match="Unable to initialize backend 'noisy'"):
        fresh_registry.backends()
    assert "noisy: asked" in capfd.readouterr().err
    assert "noisy" not in fresh_registry.plugin_output.as_dict()


def test_log_level_warning_captures_nothing(capfd):
    reg = registry.BackendRegistry(PluginTable(), environ={"PJRT_LOG_LEVEL": "warning"})
    try:
        reg.register_backend_factory("noisy", noisy_failing_factory("noisy: shown\n"))
        reg.backends()
        assert "noisy: shown" in capfd.readouterr().err
        assert reg.plugin_output.as_dict() == {}
    finally:
        reg.clear_backends()


def test_pjrt_info_verbose_shows_what_was_kept(fresh_registry, capsys):
    fresh_registry.register_backend_factory("noisy", noisy_failing_factory("noisy: kept line\n"))
    assert cli.main(["info"], registry=fresh_registry) == 0
    out = capsys.readouterr().out
    assert "x noisy: failed: RuntimeError: no hardware here" in out
    assert "kept from noisy, not shown: pjrt info -v shows it" in out
    assert "noisy: kept line" not in out
    fresh_registry.clear_backends()
    fresh_registry.register_backend_factory("noisy", noisy_failing_factory("noisy: kept line\n"))
    assert cli.main(["info", "-v"], registry=fresh_registry) == 0
    assert "    noisy: kept line" in capsys.readouterr().out.splitlines()


# -- pjrt info: versions and whole reasons ----------------------------------------------------

def test_pjrt_info_reports_versions(fresh_registry, capsys):
    import ml_dtypes
    import numpy

    assert cli.main(["info", "--json"], registry=fresh_registry) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    assert versions["python"].startswith(".".join(map(str, sys.version_info[:3])))
    assert versions["numpy"] == numpy.__version__
    assert versions["ml_dtypes"] == ml_dtypes.__version__
    assert versions["pjrt"].startswith(pjrt.__version__)
    assert "pjrt-cpu" in versions and "xla-cpu-pjrt" in versions


def test_pjrt_info_wraps_a_long_reason_instead_of_cutting_it(fresh_registry, capsys):
    reason = ("the plugin cannot be loaded: it needs libexample.so.1, which was not found. "
              "Install the runtime, or add its library directory to LD_LIBRARY_PATH. "
              "The loader said: libexample.so.1: cannot open shared object file")
    fresh_registry.register_unavailable("longreason", RuntimeError(reason))
    assert cli.main(["info"], registry=fresh_registry) == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).count(" ".join(f"RuntimeError: {reason}".split())) == 1
    assert all(len(line) <= 120 for line in out.splitlines() if "longreason" in line)


# -- pjrt run: the whole compile error, located in the file -----------------------------------

def test_pjrt_run_keeps_the_whole_compile_error_and_names_the_file(tmp_path, capsys):
    program = tmp_path / "broken.mlir"
    program.write_text("func.func public @main(%a: tensor<8xf32>) -> tensor<8xf32> {\n"
                       "  %0 = stablehlo.no_such_op %a : tensor<8xf32>\n"
                       "  return %0 : tensor<8xf32>\n}\n")
    reg = registry.BackendRegistry(PluginTable(), environ={})
    try:
        assert cli.main(["run", str(program), "--platform", "cpu"], registry=reg) == cli.FAILED
    finally:
        reg.clear_backends()
    err = capsys.readouterr().err
    assert f"{program}:2:8: error: custom op 'stablehlo.no_such_op' is unknown" in err
    assert " -:2:8" not in err
    # the plugin's later diagnostic lines are kept too, not cut
    assert "Failed to parse using StableHLO" in err and "downgraded." in err
    assert len(err.strip().splitlines()) == 1


# -- the vendors' real plugins, on a machine without their hardware ---------------------------

def _vendor_plugins_installed() -> bool:
    from importlib import metadata

    try:
        return all(metadata.version(p) for p in ("pjrt-cuda", "pjrt-tpu", "pjrt-rocm"))
    except metadata.PackageNotFoundError:
        return False


needs_vendor_plugins = pytest.mark.skipif(
    not _vendor_plugins_installed(), reason="needs pjrt-cuda, pjrt-rocm and pjrt-tpu (tox -e vendor)")


@pytest.mark.vendor
@needs_vendor_plugins
def test_vendor_pjrt_info_is_quiet_and_says_why():
    result = subprocess.run([sys.executable, "-m", "pjrt", "info"], capture_output=True,
                            text=True, timeout=300,
                            env={k: v for k, v in os.environ.items()
                                 if k not in ("PJRT_LOG_LEVEL", "PJRT_PLATFORMS")})
    assert plugin_lines(result.stderr) == [], result.stderr
    assert result.stderr == ""
    out = result.stdout
    failed = {line.split(":")[0].strip(" x") for line in out.splitlines()
              if line.startswith("  x ")}
    # Whatever hardware is missing, each backend that failed says why, in full: ROCm's
    # reason names the missing library and what to do about it.
    for name in failed:
        assert f"x {name}: failed: " in out
    if "rocm" in failed:
        rocm = " ".join(out[out.index("x rocm: failed: "):].split())
        assert "which the loader did not find" in rocm and "libhsa-runtime64" in rocm
        assert "LD_LIBRARY_PATH" in rocm
    if "cuda" in failed:
        assert "No visible GPU devices" in out or "CUDA" in out
    if "tpu" in failed:
        assert "TPU" in out[out.index("x tpu: failed: "):]


@pytest.mark.vendor
@needs_vendor_plugins
def test_vendor_devices_prints_no_plugin_logs_and_keeps_them():
    code = ("import pjrt, json; print(pjrt.devices()); "
            "print(json.dumps({'errors': pjrt.backend_errors(), "
            "'logs': pjrt.registry.backend_logs()}))")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    # Each accelerator that did not come up says why, and what it printed is kept with it.
    for name in report["errors"]:
        assert report["errors"][name]
    assert set(report["logs"]) <= set(report["errors"]) | {"cpu"}
    loud = run_python("import pjrt; pjrt.devices()", PJRT_LOG_LEVEL="warning")
    kept = "".join(report["logs"].values())
    for marker in PLUGIN_LOG_MARKERS:
        if marker in kept:
            assert marker in loud.stderr


# -- plugins loaded and clients made directly, outside the registry ---------------------------

_DIRECT_LOAD = """
import json, sys
import pjrt
from pjrt._loading import plugin_logging
try:
    pjrt.load_pjrt_plugin_dynamically("faulty", sys.argv[1])
except pjrt.PluginLoadError as error:
    print(json.dumps({"error": str(error), "logs": plugin_logging.plugin_logs()}))
"""

_DELEGATE_LINE = "fault plugin: PJRT_FAULT_DELEGATE"


def test_a_plugin_loaded_directly_is_quiet_and_its_words_are_kept(built):
    """The fault plugin prints a line when the library it forwards to cannot be loaded, and
    then refuses to start: the line is kept back (plugin_logs()), and the load error quotes
    it, since it is the plugin's own reason."""
    code = _DIRECT_LOAD
    quiet = subprocess.run([sys.executable, "-c", code, str(built.fault_plugin)],
                           capture_output=True, text=True, timeout=120,
                           env={**run_python_env(), "PJRT_FAULT_DELEGATE": "/nonexistent/d.so"})
    assert _DELEGATE_LINE not in quiet.stderr, quiet.stderr
    report = json.loads(quiet.stdout)
    assert _DELEGATE_LINE in report["logs"]["faulty"]
    assert "returned NULL" in report["error"] and _DELEGATE_LINE in report["error"]
    loud = subprocess.run([sys.executable, "-c", code, str(built.fault_plugin)],
                          capture_output=True, text=True, timeout=120,
                          env={**run_python_env(), "PJRT_FAULT_DELEGATE": "/nonexistent/d.so",
                               "PJRT_LOG_LEVEL": "warning"})
    assert _DELEGATE_LINE in loud.stderr
    assert json.loads(loud.stdout)["logs"] == {}


def run_python_env() -> dict:
    """The environment :func:`run_python` gives a child, without its added variables."""
    from conftest import child_env

    return {k: v for k, v in child_env().items()
            if k not in ("PJRT_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL", "PJRT_PLATFORMS")}


def test_a_direct_client_inside_the_registry_leaves_the_choice_to_it(fresh_registry, capfd):
    """A backend asked for by name speaks for itself: the direct-client capture must not
    take its output away from the registry's decision."""
    fresh_registry.register_backend_factory(
        "loud", lambda: (write_to_fd2("a plugin line\n"), pjrt.make_cpu_client(1))[1])
    fresh_registry.set_platforms("loud")
    fresh_registry.backends()
    assert "a plugin line" in capfd.readouterr().err
    assert plugin_logging.plugin_logs().get("cpu", "").count("a plugin line") == 0


@pytest.mark.vendor
def test_a_cuda_client_made_directly_prints_nothing_and_keeps_the_plugins_words():
    """jax-cuda12-pjrt prints lines about cuInit when it finds no GPU: made through
    make_c_api_client, as through the registry, they are kept, not printed."""
    import glob

    from conftest import vendor_library

    if glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("this machine has an NVIDIA GPU: the plugin has nothing to complain of")
    code = ("import json, sys, pjrt\n"
            "from pjrt._loading import plugin_logging\n"
            "pjrt.load_pjrt_plugin_dynamically('direct_cuda', sys.argv[1])\n"
            "try:\n"
            "    pjrt.make_c_api_client('direct_cuda')\n"
            "except pjrt.XlaRuntimeError as error:\n"
            "    print(json.dumps({'error': str(error), 'logs': plugin_logging.plugin_logs()}))\n")
    path = vendor_library("jax-cuda12-pjrt", "xla_cuda_plugin.so")
    quiet = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                           timeout=300, env=run_python_env())
    assert plugin_lines(quiet.stderr) == [], quiet.stderr
    report = json.loads(quiet.stdout)
    assert "No visible GPU devices" in report["error"]
    assert "cuInit" in report["logs"]["direct_cuda"]
    loud = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                          timeout=300, env={**run_python_env(), "PJRT_LOG_LEVEL": "warning"})
    assert "cuInit" in loud.stderr
