"""What discovery and the registry say when something is wrong: the real cause, and the fix.

Each test sets up one mistake a user makes (a broken plugin configuration file, a bad variable,
a missing package) on fresh registries and real plugin libraries, and checks the message.
"""
from __future__ import annotations

import json
import logging

import pytest

import pjrt
import pjrt_cpu
from pjrt import registry
from pjrt._app import cli, demo
from pjrt._registry import discovery

from conftest import cpu_plugin_path

LIB_106 = cpu_plugin_path("xla_cpu_0_106")
ENV = discovery.ENV_VARIABLE


# -- plugin configuration files -------------------------------------------------------------

@pytest.mark.parametrize("value", [42, None, ["/x.so"], ""])
def test_a_library_path_that_is_not_a_string_names_file_and_entry_every_time(
        make_registry, tmp_path, value):
    config = tmp_path / "odd.json"
    config.write_text(json.dumps({"library_path": value}))
    reg = make_registry({ENV: f"oddcpu:{config}"})
    for _ in range(3):  # the same answer on every question, never a silent success
        with pytest.raises(ValueError) as info:
            reg.backends()
        message = str(info.value)
        assert str(config) in message and "'oddcpu'" in message
        assert "must be a non-empty string" in message
    assert not reg.backends_are_initialized()
    with pytest.raises(ValueError, match="oddcpu"):
        reg.registrations()


def test_a_configuration_that_is_not_utf8_names_the_file(tmp_path):
    config = tmp_path / "latin1.json"
    config.write_bytes(b'{"library_path": "/opt/caf\xe9/plugin.so"}')
    with pytest.raises(ValueError, match="is not UTF-8 text") as info:
        discovery.read_plugin_config(str(config), "latin")
    assert str(config) in str(info.value) and "'latin'" in str(info.value)


def test_a_configuration_nested_too_deeply_names_the_file(make_registry, tmp_path):
    config = tmp_path / "deep.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    reg = make_registry({ENV: f"deep:{config}"})
    with pytest.raises(ValueError, match="nested too deeply") as info:
        reg.backends()
    assert str(config) in str(info.value)


def test_a_configuration_file_that_is_missing_names_it(tmp_path):
    missing = tmp_path / "gone.json"
    with pytest.raises(ValueError, match="cannot be read") as info:
        discovery.plugins_from_env(f"gone:{missing}")
    assert str(missing) in str(info.value) and ENV in str(info.value)


def test_create_options_of_the_wrong_type_names_the_type(tmp_path):
    config = tmp_path / "opts.json"
    config.write_text(json.dumps({"library_path": LIB_106, "create_options": [1, 2]}))
    with pytest.raises(ValueError, match="must be an object of option names to values, "
                                         "not list"):
        discovery.read_plugin_config(str(config))


# -- platform selection ---------------------------------------------------------------------

def test_gpu_in_pjrt_platforms_is_named_as_written(make_registry):
    reg = make_registry({"PJRT_PLATFORMS": "gpu,cpu"}, discover=False)
    reg.register_plugin("cpu", library_path=LIB_106)
    with pytest.raises(pjrt.PluginLoadError):
        reg.register_plugin("cuda", library_path="/nonexistent/xla_cuda_plugin.so")
    with pytest.raises(RuntimeError) as info:
        reg.backends()
    message = str(info.value)
    assert "Unable to initialize backend 'cuda'" in message
    assert "PJRT_PLATFORMS as 'gpu' (which stands for 'cuda')" in message
    assert "remove 'gpu' from it" in message and "remove 'cuda'" not in message


def test_a_loud_factory_that_was_not_asked_for_says_why_it_stops_startup(make_registry):
    reg = make_registry(discover=False)
    reg.register_plugin("cpu", library_path=LIB_106)

    def broken():
        raise OSError("the device is busy")

    reg.register_backend_factory("loud", broken, fail_quietly=False)
    with pytest.raises(RuntimeError) as info:
        reg.backends()
    message = str(info.value)
    assert "the device is busy" in message and "fail_quietly=False" in message
    assert "asked for in PJRT_PLATFORMS" not in message


def _nvidia_node(monkeypatch, tmp_path):
    node = tmp_path / "nvidia0"
    node.touch()
    monkeypatch.setattr(registry, "_NVIDIA_DEVICE_NODES", (str(node),))


def test_no_cuda_advice_when_the_user_chose_cpu(make_registry, monkeypatch, tmp_path, caplog):
    _nvidia_node(monkeypatch, tmp_path)
    caplog.set_level(logging.WARNING, logger="pjrt")
    reg = make_registry({"PJRT_PLATFORMS": "cpu"}, discover=False)
    reg.register_plugin("cpu", library_path=LIB_106)
    # pjrt-cuda is installed (its registration exists) but cpu was chosen.
    reg.register_plugin("cuda", library_path="/nonexistent/xla_cuda_plugin.so")
    assert set(reg.backends()) == {"cpu"}
    assert not [r for r in caplog.records if "NVIDIA" in r.getMessage()]


def test_cuda_advice_when_no_cuda_plugin_is_installed(make_registry, monkeypatch, tmp_path,
                                                       caplog):
    _nvidia_node(monkeypatch, tmp_path)
    caplog.set_level(logging.WARNING, logger="pjrt")
    reg = make_registry(discover=False)
    reg.register_plugin("cpu", library_path=LIB_106)
    reg.backends()
    advice = [r.getMessage() for r in caplog.records if "NVIDIA" in r.getMessage()]
    assert len(advice) == 1 and "pip install pjrt-cuda" in advice[0]


def test_topology_of_a_platform_left_out_of_pjrt_platforms(make_registry):
    reg = make_registry({"PJRT_PLATFORMS": "cpu"}, discover=False)
    seen = []

    def describe(plugin, topology_name, options):
        seen.append((plugin.api_version, topology_name, options))
        return "a description"

    assert reg.register_plugin("tpu", library_path=LIB_106, make_topology=describe) is None
    assert reg.make_pjrt_topology("tpu", "v5e:2x2", flag=1) == "a description"
    assert seen == [((0, 106), "v5e:2x2", {"flag": 1})]
    # Without a topology factory of its own, the plugin itself is asked (and answers).
    reg.register_plugin("other", library_path=LIB_106)
    with pytest.raises(pjrt.XlaRuntimeError, match="Topology not supported"):
        reg.make_pjrt_topology("other")
    with pytest.raises(RuntimeError, match="no plugin for it is registered"):
        reg.make_pjrt_topology("nothing")


# -- the CPU plugin package -----------------------------------------------------------------

def test_a_bad_device_count_names_the_variable(make_registry, monkeypatch):
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "abc")
    reg = make_registry()
    assert "cpu" in reg.registrations()
    error = reg.backend_errors()["cpu"]
    assert "PJRT_CPU_DEVICE_COUNT='abc' is not an integer" in error and "unset it" in error
    asked = make_registry({"PJRT_PLATFORMS": "cpu"})
    with pytest.raises(RuntimeError, match="PJRT_CPU_DEVICE_COUNT='abc'") as info:
        asked.backends()
    assert "install its plugin package" not in str(info.value)
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "2")
    assert make_registry().get_backend("cpu").device_count() == 2


def test_without_a_cpu_plugin_the_hints_name_the_package(make_registry, capsys):
    reg = make_registry(discover=False)
    with pytest.raises(RuntimeError, match=r"pip install pjrt-cpu\)") as info:
        reg.backends()
    assert "./plugins" not in str(info.value)
    with pytest.raises(RuntimeError, match="pip install pjrt-cpu"):
        reg.new_client("cpu", num_devices=2)
    with pytest.raises(demo.DemoUnavailable, match="pip install pjrt-cpu"):
        demo.main(reg)
    assert cli.main(["demo"], registry=reg) == cli.FAILED
    err = capsys.readouterr().err
    assert "pjrt demo: error:" in err and "pip install pjrt-cpu" in err
    assert "Traceback" not in err and "ModuleNotFoundError" not in err


def test_make_cpu_client_comes_from_the_cpu_package(make_registry, tmp_path):
    with pjrt_cpu.make_cpu_client(3) as client:
        assert client.device_count() == 3
    reg = make_registry()
    with reg.new_client("cpu", num_devices=2) as client:
        assert client.device_count() == 2
        assert client.plugin.library_path == pjrt_cpu.library_path()
    # A cpu backend registered as a bare library, not by a package: no clients of its own.
    env_only = make_registry(discover=False)
    env_only.register_plugin("cpu", library_path=LIB_106)
    with pytest.raises(RuntimeError, match="cannot make clients of its own; install its "
                                           "plugin package \\(pip install pjrt-cpu\\)"):
        env_only.new_client("cpu", num_devices=2)


# -- the operator's own settings in conflict ------------------------------------------------

_CONFLICT_CHILD = """
import sys
import pjrt
from pjrt import registry
library = sys.argv[1]
if sys.argv[2] == "load":
    pjrt.load_pjrt_plugin_dynamically("cpu", library)
try:
    print("devices:", len(pjrt.devices("cpu")))
except RuntimeError as error:
    print("error:", str(error).replace(chr(10), " "))
print("errors:", registry.backend_errors())
print("logs:", registry.backend_logs())
"""


def _lines(stdout: str, prefix: str) -> str:
    return next(line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix))


def test_an_env_entry_for_a_taken_name_is_a_warning_on_stderr_once():
    """The operator's setting is ignored: they are told on stderr (once), not in the plugins'
    kept output, and the installed cpu backend still comes up."""
    from conftest import child_env, run_python

    env = child_env(drop=("PJRT_",), **{ENV: f"cpu:{LIB_106}"})
    result = run_python(_CONFLICT_CHILD, LIB_106, "env", env=env)
    assert int(_lines(result.stdout, "devices: ")) > 0
    warnings = [line for line in result.stderr.splitlines() if "already registered" in line]
    assert len(warnings) == 1, result.stderr
    assert "'cpu'" in warnings[0] and LIB_106 in warnings[0] and "pjrt_cpu" in warnings[0]
    assert "already registered" not in _lines(result.stdout, "logs: ")


def test_a_name_taken_by_the_operators_own_library_leads_the_error():
    """Another library loaded as 'cpu' first: pjrt-cpu cannot register its own under that
    name. The error leads with that, backend_errors() holds it, stderr says it once."""
    from conftest import child_env, run_python

    # pjrt-cpu's own build is xla-cpu-pjrt (0.81); the operator's library is the other build.
    result = run_python(_CONFLICT_CHILD, LIB_106, "load",
                        env=child_env(drop=("PJRT_",), PJRT_CPU_BUILD="xla-cpu-pjrt"))
    error = _lines(result.stdout, "error: ")
    assert error.startswith("no PJRT backend could be started:")
    assert f"cpu: ValueError: plugin 'cpu' is already loaded from {LIB_106}" in error
    assert "install" not in error.partition("already loaded")[0]
    assert "already loaded from" in _lines(result.stdout, "errors: ")
    assert len([line for line in result.stderr.splitlines() if "already loaded" in line]) == 1


@pytest.mark.parametrize("entry, what", [
    ("emptypath:", "its path is empty"),
    (f":{LIB_106}", "it has no name"),
    ("nocolon", "it has no ':' between a name and a path"),
    (f"one:{LIB_106}:two:{LIB_106}", "it has 3 ':' separators, not one (separate entries "
                                     "with ',')"),
])
def test_a_malformed_env_entry_says_what_is_missing_and_the_format(entry, what, caplog):
    """jax's words first (it warns, and goes on with the other entries), then what is wrong
    and the format."""
    caplog.set_level(logging.WARNING, logger="pjrt")
    assert discovery.plugins_from_env(entry) == []
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"invalid value {entry} in env var {ENV} {entry}: {what}; ")
    assert "write each entry as name:path, e.g." in message


def test_an_empty_library_path_is_named_empty():
    with pytest.raises(pjrt.PluginLoadError) as info:
        pjrt.load_pjrt_plugin_dynamically("empty_path", "")
    assert "the library path is empty" in str(info.value)
    assert "no file at" not in str(info.value)


@pytest.mark.parametrize("value, words", [
    (2 ** 70, ["'big'", str(2 ** 70), "64-bit signed integer", str(2 ** 63 - 1)]),
    ([1, -2 ** 64], ["'big' (item 1)", str(-2 ** 64), str(-2 ** 63)]),
    (1e39, ["'big'", "1e+39", "32-bit float"]),
    ("\udc80", ["'big'", "UTF-8"]),
])
def test_an_option_value_that_cannot_be_converted_names_the_option(client, value, words):
    with pytest.raises((OverflowError, ValueError)) as info:
        pjrt.make_c_api_client(client.plugin.name, {"big": value})
    for word in words:
        assert word in str(info.value)


def test_the_largest_option_values_still_reach_the_plugin(client):
    limits = {"largest": 2 ** 63 - 1, "smallest": -2 ** 63, "list": [2 ** 63 - 1, -2 ** 63]}
    pjrt.make_c_api_client(client.plugin.name, limits).close()
