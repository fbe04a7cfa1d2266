"""Choosing the build of XLA's CPU plugin that pjrt-cpu loads: PJRT_CPU_BUILD (a build's name
or a library's path), ``build=`` of ``pjrt_cpu.library_path`` and ``make_cpu_client``, and
the order of preference when nothing is chosen. Both builds the tests install are loaded for
real and asked their PJRT C API version (xla-cpu-pjrt 0.81, fastatomstruct-xla-cpu 0.106)."""
from __future__ import annotations

import importlib.metadata
import sys

import pytest

import pjrt_cpu
from conftest import CPU_PLUGINS, child_env, cpu_plugin_path, run_python, run_tiny

#: build name -> the test plugin of conftest that is the same library
TEST_PLUGIN_OF = {"xla-cpu-pjrt": "xla_cpu_0_81", "fastatomstruct-xla-cpu": "xla_cpu_0_106"}
MODULE_OF = {name: pjrt_cpu.BUILDS[name].module for name in TEST_PLUGIN_OF}


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(pjrt_cpu.BUILD_ENV, raising=False)
    return monkeypatch


def hide(monkeypatch, build: str) -> None:
    """Make ``build`` not installed for this process's import system (a None entry in
    sys.modules is how Python blocks a module: find_spec answers None)."""
    monkeypatch.setitem(sys.modules, pjrt_cpu.BUILDS[build].module, None)


def test_the_known_builds_are_the_installed_libraries_with_their_api_versions():
    for name, test_plugin in TEST_PLUGIN_OF.items():
        assert pjrt_cpu.library_path(name) == cpu_plugin_path(test_plugin)
        assert pjrt_cpu.BUILDS[name].api_minor == CPU_PLUGINS[test_plugin][2]


@pytest.mark.parametrize("name", sorted(TEST_PLUGIN_OF))
def test_build_argument_loads_that_build(name, unset):
    client = pjrt_cpu.make_cpu_client(2, build=name)
    try:
        assert client.plugin.library_path == cpu_plugin_path(TEST_PLUGIN_OF[name])
        assert client.plugin.api_version == (0, pjrt_cpu.BUILDS[name].api_minor)
        assert client.device_count() == 2
        run_tiny(client.local_devices()[1])
    finally:
        client.close()


SHOW_DEFAULT = """
import pjrt
backend = pjrt.get_backend()
print(pjrt.default_backend(), pjrt.backend_pjrt_c_api_version(), backend.plugin.library_path)
"""


@pytest.mark.parametrize("name", sorted(TEST_PLUGIN_OF))
def test_setting_chooses_the_build_pjrt_discovers(name):
    """PJRT_CPU_BUILD=<name>: the cpu backend pjrt discovers runs that build."""
    out = run_python(SHOW_DEFAULT, env=child_env(**{pjrt_cpu.BUILD_ENV: name})).stdout.split()
    minor = pjrt_cpu.BUILDS[name].api_minor
    assert out == ["cpu", f"(0,", f"{minor})", cpu_plugin_path(TEST_PLUGIN_OF[name])]


def test_setting_takes_a_library_path():
    path = cpu_plugin_path("xla_cpu_0_106")
    out = run_python(SHOW_DEFAULT, env=child_env(**{pjrt_cpu.BUILD_ENV: path})).stdout.split()
    assert out == ["cpu", "(0,", "106)", path]


def test_a_library_path_is_recognised_as_its_build(unset):
    assert pjrt_cpu.chosen_build(cpu_plugin_path("xla_cpu_0_81")) is pjrt_cpu.BUILDS["xla-cpu-pjrt"]
    unset.setenv(pjrt_cpu.BUILD_ENV, cpu_plugin_path("xla_cpu_0_106"))
    assert pjrt_cpu.chosen_build() is pjrt_cpu.BUILDS["fastatomstruct-xla-cpu"]


def test_unknown_name_is_a_clear_error(unset):
    with pytest.raises(FileNotFoundError, match="build='xla-cpu' names no build of XLA's CPU "
                       "plugin; name one of xla-cpu-pjrt, fastatomstruct-xla-cpu"):
        pjrt_cpu.library_path("xla-cpu")
    unset.setenv(pjrt_cpu.BUILD_ENV, "newest")
    with pytest.raises(FileNotFoundError, match="PJRT_CPU_BUILD='newest' names no build"):
        pjrt_cpu.library_path()


def test_unknown_name_in_the_setting_is_the_cpu_backends_reason():
    result = run_python("""
        import pjrt
        try:
            pjrt.get_backend("cpu")
        except RuntimeError as error:
            print(error)
        """, env=child_env(**{pjrt_cpu.BUILD_ENV: "newest"}))
    assert "cpu: PluginLoadError: PJRT_CPU_BUILD='newest' names no build" in result.stdout


def test_missing_library_path_is_a_clear_error(unset, tmp_path):
    missing = tmp_path / "libpjrt_cpu.so"
    with pytest.raises(FileNotFoundError, match="no plugin library is there") as caught:
        pjrt_cpu.library_path(missing)
    assert str(missing) in str(caught.value)


def test_named_build_not_installed_names_the_pip_command(unset):
    hide(unset, "fastatomstruct-xla-cpu")
    with pytest.raises(FileNotFoundError, match=r"the fastatomstruct-xla-cpu build of XLA's "
                       r"CPU plugin is not installed; pip install 'pjrt-cpu\[fast\]'"):
        pjrt_cpu.library_path("fastatomstruct-xla-cpu")
    unset.setenv(pjrt_cpu.BUILD_ENV, "fastatomstruct-xla-cpu")
    with pytest.raises(FileNotFoundError, match=r"pip install 'pjrt-cpu\[fast\]'"):
        pjrt_cpu.make_cpu_client(1)
    hide(unset, "xla-cpu-pjrt")
    with pytest.raises(FileNotFoundError, match=r"pip install 'xla-cpu-pjrt==0\.0\.1'"):
        pjrt_cpu.library_path("xla-cpu-pjrt")


def test_order_of_preference_when_nothing_is_chosen(unset):
    assert pjrt_cpu.PREFERENCE == ("fastatomstruct-xla-cpu", "xla-cpu-pjrt")
    assert pjrt_cpu.installed_builds()[:2] == list(pjrt_cpu.PREFERENCE)
    assert pjrt_cpu.library_path() == cpu_plugin_path("xla_cpu_0_106")
    unset.setenv(pjrt_cpu.BUILD_ENV, "  ")  # empty: as if unset
    assert pjrt_cpu.chosen_build() is pjrt_cpu.BUILDS["fastatomstruct-xla-cpu"]
    # The first one missing, the next is loaded.
    hide(unset, "fastatomstruct-xla-cpu")
    assert pjrt_cpu.library_path() == cpu_plugin_path("xla_cpu_0_81")
    assert pjrt_cpu.installed_builds()[:1] == ["xla-cpu-pjrt"]
    hide(unset, "xla-cpu-pjrt")
    with pytest.raises(FileNotFoundError, match=r"no build of XLA's CPU plugin is installed.*"
                       r"pip install 'pjrt-cpu\[fast\]'"):
        pjrt_cpu.library_path()


def test_the_default_backend_runs_the_preferred_build():
    out = run_python(SHOW_DEFAULT, env=child_env(drop=(pjrt_cpu.BUILD_ENV,))).stdout.split()
    assert out == ["cpu", "(0,", "106)", cpu_plugin_path("xla_cpu_0_106")]


def test_fast_extra_installs_the_preferred_build():
    """pip's view of the installed pjrt-cpu: xla-cpu-pjrt always, fastatomstruct with [fast]."""
    requires = importlib.metadata.requires("pjrt-cpu") or []
    assert "xla-cpu-pjrt==0.0.1" in requires
    assert 'fastatomstruct-xla-cpu==2026.6.23; extra == "fast"' in requires
    assert pjrt_cpu.BUILDS["fastatomstruct-xla-cpu"].install == "pjrt-cpu[fast]"
