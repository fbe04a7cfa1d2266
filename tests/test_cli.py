"""The ``pjrt`` command, on the real CPU plugin.

Most cases run the command the way a person does, ``python -m pjrt ...`` in a subprocess with
a controlled environment; the rest call :func:`pjrt._app.cli.main` in this process with a registry
of their own (so they do not disturb the default one) and read what it printed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import pjrt
import pjrt_cpu
from pjrt import registry
from pjrt._app import cli
from pjrt.plugin import PluginTable

from conftest import cpu_plugin_path
from fixtures import programs

TINY = programs.get("tiny_tanh")
MULTI = programs.get("multi_output")
BYTECODE = os.path.join(programs.FIXTURES_DIR, programs.BYTECODE_FILE)
LIB_106 = cpu_plugin_path("xla_cpu_0_106")
HEADER = "{}.{}".format(*pjrt.PJRT_C_API_VERSION)


def command_env(**extra: str) -> dict:
    """The environment a command runs in: this one, minus the variables that steer pjrt."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "JAX_"))}
    # JAX_PLATFORMS keeps jax on the CPU; pjrt reads it only while PJRT_PLATFORMS is unset.
    env.update(JAX_PLATFORMS="cpu", PJRT_PLATFORMS="", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def pjrt_command(*args: str, cwd=None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pjrt", *map(str, args)], cwd=cwd,
                          env=command_env(**env), capture_output=True, text=True, timeout=120)


def pjrt_lines(stderr: str) -> list[str]:
    """Our lines on stderr (the CPU plugin's own C++ logging may write there too)."""
    return [line for line in stderr.splitlines() if line.startswith(("pjrt", "usage:"))]


def save_inputs(program, directory) -> list[str]:
    paths = []
    for i, array in enumerate(program.inputs()):
        path = directory / f"{program.name}_in{i}.npy"
        np.save(path, array)
        paths.append(str(path))
    return paths


def input_flags(paths) -> list[str]:
    return [flag for path in paths for flag in ("--input", path)]


@pytest.fixture
def own_registry(make_registry):
    """A registry of the test's own (discovering the installed plugins), closed afterwards."""
    return make_registry()


# -- pjrt info ------------------------------------------------------------------------------

def test_info_shows_versions_plugin_backend_and_devices():
    result = pjrt_command("info", PJRT_CPU_DEVICE_COUNT="3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"pjrt {pjrt.__version__}, PJRT C API {HEADER} (header)")
    # The plugin: where it came from, its PJRT API version, its package and library.
    version = re.escape(pjrt_cpu.__version__)
    api = rf"0\.{pjrt_cpu.chosen_build().api_minor}"  # the build pjrt-cpu loads here
    assert re.search(rf"^  cpu +entry point pjrt_cpu +{api} +pjrt-cpu {version} +/\S+\.so$",
                     out, re.MULTILINE), out
    # The backend: default-marked, with its device count.
    assert re.search(rf"^  \* cpu +cpu +cpu +3 +{api}$", out, re.MULTILINE), out
    devices = re.findall(r"^    (\d) +cpu +device\*, pinned_host, unpinned_host +not reported$",
                         out, re.MULTILINE)
    assert devices == ["0", "1", "2"]
    assert pjrt_lines(result.stderr) == []


def test_info_json_lists_every_plugin_and_backend(cpu2_config):
    result = pjrt_command("info", "--json", PJRT_CPU_DEVICE_COUNT="2",
                          PJRT_NAMES_AND_LIBRARY_PATHS=cpu2_config)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["pjrt_version"] == pjrt.__version__
    assert info["pjrt_c_api_version"] == HEADER

    plugins = {p["name"]: p for p in info["plugins"]}
    assert set(plugins) == {"cpu", "cpu2"}
    assert plugins["cpu"]["from"] == "entry point pjrt_cpu"
    assert (plugins["cpu"]["package"], plugins["cpu"]["package_version"]) == (
        "pjrt-cpu", pjrt_cpu.__version__)
    assert plugins["cpu"]["plugin_api_version"] == f"0.{pjrt_cpu.chosen_build().api_minor}"
    config_file = cpu2_config.split(":", 1)[1]
    assert plugins["cpu2"]["from"] == f"env var PJRT_NAMES_AND_LIBRARY_PATHS ({config_file})"
    assert plugins["cpu2"]["library_path"] == LIB_106
    assert plugins["cpu2"]["plugin_api_version"] == "0.106"

    backends = {b["name"]: b for b in info["backends"]}
    assert backends["cpu"]["status"] == "up" and backends["cpu"]["device_count"] == 2
    assert backends["cpu2"]["device_count"] == 3
    # An env-var plugin has the default priority of a plugin (400), above the CPU plugin's 0.
    assert backends["cpu2"]["default"] and not backends["cpu"]["default"]
    assert [d["id"] for d in backends["cpu2"]["devices"]] == [0, 1, 2]
    assert backends["cpu2"]["devices"][0]["memory_stats"] is None


def test_info_on_an_env_library_that_cannot_be_loaded_says_why(cpu2_config):
    """A library named in PJRT_NAMES_AND_LIBRARY_PATHS that cannot be loaded stops start-up
    (as in jax): info says so, with the entry's reason, and exits 1."""
    result = pjrt_command("info", "--json",
                          PJRT_NAMES_AND_LIBRARY_PATHS=f"{cpu2_config},ghost:/nope/ghost.so")
    assert result.returncode == 1, result.stderr
    info = json.loads(result.stdout)
    assert info["error"].startswith("Unable to initialize backend 'ghost': plugin 'ghost': "
                                    "no file at /nope/ghost.so")
    assert {p["name"] for p in info["plugins"]} == {"cpu", "cpu2", "ghost"}
    assert [p["library_path"] for p in info["plugins"] if p["name"] == "ghost"] == [None]
    backends = {b["name"]: b for b in info["backends"]}
    assert backends["ghost"]["status"] == "failed"
    assert "no file at /nope/ghost.so" in backends["ghost"]["reason"]
    assert {"name": "ghost", "source": "PJRT_NAMES_AND_LIBRARY_PATHS", "action": "failed",
            "detail": "plugin 'ghost': no file at /nope/ghost.so"} in info["discovery"]


def test_info_platform_looks_at_that_platform_only(cpu2_config):
    result = pjrt_command("info", "--json", "--platform", "cpu2",
                          PJRT_NAMES_AND_LIBRARY_PATHS=f"{cpu2_config},ghost:/nope/ghost.so")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert [p["name"] for p in info["plugins"]] == ["cpu2"]
    assert [(b["name"], b["device_count"], b["default"]) for b in info["backends"]] == [
        ("cpu2", 3, True)]
    # The ghost library was never looked for, so nothing was said about it.
    assert "ghost" not in result.stderr


def test_info_on_a_platform_that_does_not_come_up_says_why():
    result = pjrt_command("info", "--platform", "tpu")
    assert result.returncode == 1
    assert re.search(r"^  x tpu: failed: RuntimeError: no backend named 'tpu' is registered",
                     result.stdout, re.MULTILINE), result.stdout
    assert "none came up" in result.stdout


def test_info_in_process_with_a_registry_of_its_own(own_registry, capsys):
    assert cli.main(["info"], registry=own_registry) == 0
    out = capsys.readouterr().out
    count = own_registry.get_backend("cpu").device_count()
    api = rf"0\.{pjrt_cpu.chosen_build().api_minor}"
    assert re.search(rf"^  \* cpu +cpu +cpu +{count} +{api}$", out, re.MULTILINE), out
    assert "(* the default backend)" in out
    assert cli.main(["info", "--json"], registry=own_registry) == 0
    info = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in info["backends"]] == ["cpu"]
    assert info["backends"][0]["device_count"] == count


def test_shorten_keeps_the_first_line_and_cuts_long_ones():
    assert cli.shorten("plain reason") == "plain reason"
    assert cli.shorten("first line\n  more detail") == "first line ..."
    long = "x" * 300
    assert cli.shorten(long, 50) == "x" * 47 + " ..."
    assert len(cli.shorten(long, 50)) == 51


# -- pjrt run -------------------------------------------------------------------------------

def test_run_saves_outputs_that_match_numpy(tmp_path):
    inputs = save_inputs(TINY, tmp_path)
    result = pjrt_command("run", TINY.path(), *input_flags(inputs), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    programs.check_outputs(TINY, [np.load(tmp_path / "out0.npy")])
    out = result.stdout
    assert "(StableHLO text, 2 inputs, 1 output)" in out
    assert re.search(r"^compile +\d+\.\d ms$", out, re.MULTILINE), out
    assert re.search(r"^run +\d+\.\d+ ms$", out, re.MULTILINE), out
    expected = TINY.expected()[0]
    assert re.search(rf"^out0 +float32\[8\]  \[ ?{expected[0]:.5f} .* -> \./out0\.npy$", out,
                     re.MULTILINE), out


def test_run_bytecode_on_a_chosen_device(tmp_path):
    inputs = save_inputs(TINY, tmp_path)
    outputs = tmp_path / "results"
    result = pjrt_command("run", BYTECODE, *input_flags(inputs), "--device", "2",
                          "--platform", "cpu", "--output-dir", outputs,
                          PJRT_CPU_DEVICE_COUNT="4")
    assert result.returncode == 0, result.stderr
    assert "StableHLO bytecode" in result.stdout
    assert "CpuDevice(id=2) of backend 'cpu'" in result.stdout
    programs.check_outputs(TINY, [np.load(outputs / "out0.npy")])


def test_run_several_outputs_in_process(own_registry, tmp_path, capsys):
    inputs = save_inputs(MULTI, tmp_path)
    status = cli.main(["run", MULTI.path(), *input_flags(inputs), "-o", str(tmp_path / "o")],
                      registry=own_registry)
    out, err = capsys.readouterr()
    assert status == 0, err
    saved = [np.load(tmp_path / "o" / f"out{i}.npy") for i in range(3)]
    programs.check_outputs(MULTI, saved)
    assert not (tmp_path / "o" / "out3.npy").exists()
    assert "float32[2,3]" in out and "int32[2]" in out and "bool[3]" in out


def test_run_errors_from_a_subprocess_are_one_line(tmp_path):
    inputs = save_inputs(TINY, tmp_path)
    result = pjrt_command("run", TINY.path(), "--input", inputs[0], cwd=tmp_path)
    assert result.returncode == 2
    assert pjrt_lines(result.stderr) == [
        f"pjrt run: error: the program takes 2 inputs but 1 was given ({inputs[0]}); pass "
        f"one --input FILE.npy per parameter"]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out0.npy").exists()

    malformed = tmp_path / "malformed.mlir"
    malformed.write_text("func.func @main() { this is not stablehlo }\n")
    result = pjrt_command("run", malformed, cwd=tmp_path)
    assert result.returncode == 1
    (line,) = pjrt_lines(result.stderr)
    assert line.startswith(f"pjrt run: error: {malformed} does not compile: ")
    assert "Traceback" not in result.stderr


def bad_case(name, tmp_path):
    """The arguments of a broken ``pjrt run``, and the message and status expected."""
    inputs = save_inputs(TINY, tmp_path)
    if name == "missing program":
        return ["run", str(tmp_path / "absent.mlir")], 2, \
            f"no such program file: {tmp_path / 'absent.mlir'}"
    if name == "missing input":
        return ["run", TINY.path(), "-i", inputs[0], "-i", str(tmp_path / "absent.npy")], 2, \
            f"no such input file: {tmp_path / 'absent.npy'}"
    if name == "too many inputs":
        return ["run", TINY.path(), *input_flags(inputs * 2)], 2, \
            "the program takes 2 inputs but 4 were given"
    if name == "shape mismatch":
        np.save(tmp_path / "short.npy", np.ones(4, np.float32))
        return ["run", TINY.path(), "-i", inputs[0], "-i", str(tmp_path / "short.npy")], 2, \
            f"input 1 ({tmp_path / 'short.npy'}) is float32[4] but the program expects float32[8]"
    if name == "dtype mismatch":
        np.save(tmp_path / "wide.npy", np.ones(8, np.float64))
        return ["run", TINY.path(), "-i", str(tmp_path / "wide.npy"), "-i", inputs[1]], 2, \
            f"input 0 ({tmp_path / 'wide.npy'}) is float64[8] but the program expects float32[8]"
    if name == "not an npy file":
        return ["run", TINY.path(), "-i", TINY.path(), "-i", inputs[1]], 2, \
            f"input 0 ({TINY.path()}) is not a .npy file (save arrays with numpy.save)"
    if name == "no such device":
        return ["run", TINY.path(), *input_flags(inputs), "--device", "99"], 2, \
            "no device with id 99 on this cpu client"
    if name == "malformed program":
        (tmp_path / "bad.mlir").write_text("module { func.func @main( }")
        return ["run", str(tmp_path / "bad.mlir")], 1, f"{tmp_path / 'bad.mlir'} does not compile"
    if name == "unknown platform":
        return ["run", TINY.path(), "--platform", "nosuch"], 1, \
            "platform 'nosuch' did not come up: RuntimeError: no backend named 'nosuch'"
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["missing program", "missing input", "too many inputs",
                                  "shape mismatch", "dtype mismatch", "not an npy file",
                                  "no such device", "malformed program", "unknown platform"])
def test_run_errors_are_one_clear_line(name, tmp_path, capsys):
    argv, status, message = bad_case(name, tmp_path)
    # A registry per case: "unknown platform" selects platforms, which a used one refuses.
    reg = registry.BackendRegistry(PluginTable(), environ={})
    try:
        assert cli.main(argv, registry=reg) == status
    finally:
        reg.clear_backends()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"pjrt run: error: {message}"), lines[0]
    assert out == ""


def test_verbose_adds_the_traceback_and_the_full_message(own_registry, tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @main() { %0 = stablehlo.bogus : tensor<f32> }\n")
    assert cli.main(["run", str(bad), "--verbose"], registry=own_registry) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "Failed to parse" in err  # the plugin's second line, cut from the short message
    assert err.splitlines()[-1].startswith(f"pjrt run: error: {bad} does not compile")


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["run"], ["run", "x.mlir", "--device",
                                                                 "two"]])
def test_usage_errors_exit_with_status_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pjrt")
    assert "Traceback" not in err


def test_help_and_version(capsys):
    assert cli.main(["--help"]) == 0
    assert "info" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pjrt {pjrt.__version__} (PJRT C API {HEADER})"


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "pjrt")
    result = subprocess.run([script, "--version"], env=command_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pjrt {pjrt.__version__} (PJRT C API {HEADER})"


# -- pjrt demo ------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_runs_and_checks_against_numpy():
    result = pjrt_command("demo")
    assert result.returncode == 0, result.stderr
    assert "max |pjrt - numpy|" in result.stdout
    assert "execute over 8 devices" in result.stdout
