"""Discovery of installed plugins, on real plugin libraries.

Each test writes small plugin packages into a temporary directory and puts it on
``sys.path``: an entry point is a ``<dist>.dist-info`` with ``entry_points.txt`` beside the
module, a namespace module is a file under ``jax_plugins/``. The packages register XLA's real
CPU plugin libraries under platform names of their own, and a fresh
:class:`~pjrt.registry.BackendRegistry` with its own :class:`~pjrt.plugin.PluginTable` finds
them, so no test shares registry state with another.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import textwrap

import pytest

import pjrt
import pjrt_cpu
from pjrt import registry
from pjrt._registry import discovery
from pjrt.plugin import PluginTable

from conftest import cpu_plugin_path, run_tiny
from fixtures import programs

TINY = programs.get("tiny_tanh")
LIB_81 = cpu_plugin_path("xla_cpu_0_81")
LIB_106 = cpu_plugin_path("xla_cpu_0_106")
ENV = discovery.ENV_VARIABLE

# Every module the tests write starts with this, so that teardown can forget exactly them.
PREFIX = "pjrt_test_plugin_"


# -- writing plugin packages ----------------------------------------------------------------

def pjrt_module_source(platform: str, library: str, *, priority: int = 400,
                       options: dict | None = None) -> str:
    """A plugin module written for pjrt, shaped like pjrt_cpu's: it registers ``library``
    as ``platform`` only when pjrt's discovery calls it, and counts its calls."""
    return textwrap.dedent(f"""\
        import pjrt.registry

        calls = 0

        def initialize():
            global calls
            calls += 1
            if not pjrt.registry.discovering():
                return
            pjrt.registry.register_plugin({platform!r}, priority={priority},
                                          library_path={library!r}, options={options!r})
        """)


JAX_ONLY_SOURCE = textwrap.dedent("""\
    # Written for JAX: initialize() talks to JAX's own registry.
    import jax._src.xla_bridge as xb

    raise RuntimeError("pjrt must never import a plugin module written for JAX")

    def initialize():
        xb.register_plugin("never", library_path="never.so")
    """)


class PluginDir:
    """A directory on ``sys.path`` that tests write plugin packages into."""

    def __init__(self, path):
        self.path = path

    def module(self, name: str, source: str) -> str:
        """A top-level module ``name`` (not advertised anywhere by itself)."""
        (self.path / f"{name}.py").write_text(source)
        return name

    def entry_point(self, module: str, source: str | None, *, version: str = "0.3.1",
                    entry_name: str | None = None) -> str:
        """An installed distribution advertising ``module`` in the ``jax_plugins`` group.

        With ``source`` None only the entry point is written: it names a missing module.
        """
        if source is not None:
            self.module(module, source)
        dist = module.replace("_", "-")
        info = self.path / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(
            f"[jax_plugins]\n{entry_name or module} = {module}\n")
        return module

    def namespace_module(self, leaf: str, source: str) -> str:
        """``jax_plugins.<leaf>`` as a single file of the namespace package."""
        directory = self.path / "jax_plugins"
        directory.mkdir(exist_ok=True)
        (directory / f"{leaf}.py").write_text(source)
        return f"jax_plugins.{leaf}"

    def jax_wheel(self, leaf: str, library: str | None, library_name: str) -> str:
        """A package laid out like JAX's plugin wheels: ``jax_plugins/<leaf>/__init__.py``
        that imports jax, with a symlink to a real plugin library beside it."""
        package = self.path / "jax_plugins" / leaf
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(JAX_ONLY_SOURCE)
        if library is not None:
            os.symlink(library, package / library_name)
        return f"jax_plugins.{leaf}"


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A fresh directory of plugin packages on sys.path, forgotten again afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    # The jax_plugins namespace package remembers the directories it spans; drop it so that
    # this test sees its own directory and no earlier test's.
    monkeypatch.delitem(sys.modules, "jax_plugins", raising=False)
    monkeypatch.syspath_prepend(str(root))  # also invalidates importlib's caches
    yield PluginDir(root)
    for name in [n for n in sys.modules if n.startswith((PREFIX, "jax_plugins"))]:
        del sys.modules[name]


def records(reg) -> dict[str, tuple[str, str]]:
    return {r.name: (r.source, r.action) for r in reg.discovery_records}


def messages_about(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if name in r.getMessage()]


# -- plugin modules -------------------------------------------------------------------------

def test_entry_point_module_registers_a_real_library_under_a_new_name(plugin_dir, make_registry):
    module = plugin_dir.entry_point(PREFIX + "ep", pjrt_module_source(
        "epcpu", LIB_106, options={"cpu_device_count": 2}))
    reg = make_registry()
    backends = reg.backends()

    # pjrt_cpu's own entry point is found next to ours.
    assert set(backends) == {"cpu", "epcpu"}
    client = reg.get_backend("epcpu")
    assert client.device_count() == 2
    assert client.plugin.api_version == (0, 106)
    run_tiny(client.devices()[1])

    registration = reg.registrations()["epcpu"]
    assert (registration.source, registration.module) == ("entry point", module)
    assert registration.plugin.library_path == LIB_106
    assert records(reg)[module] == ("entry point", "initialized")
    assert sys.modules[module].calls == 1


def test_namespace_module_is_found_and_initialised(plugin_dir, make_registry):
    module = plugin_dir.namespace_module(PREFIX + "ns", pjrt_module_source("nscpu", LIB_81))
    reg = make_registry()
    assert reg.get_backend("nscpu").devices()
    assert records(reg)[module] == ("namespace", "initialized")
    assert reg.registrations()["nscpu"].source == "namespace"
    run_tiny(reg.get_backend("nscpu").devices()[0])


def test_module_is_initialised_once_even_when_found_twice(plugin_dir, make_registry):
    # Advertised by an entry point and also present under the namespace package.
    module = plugin_dir.namespace_module(PREFIX + "both", pjrt_module_source("bothcpu", LIB_81))
    plugin_dir.entry_point(module, None, entry_name="both")
    reg = make_registry()
    assert "bothcpu" in reg.backends()
    assert [r.name for r in reg.discovery_records].count(module) == 1
    assert records(reg)[module] == ("entry point", "initialized")
    assert sys.modules[module].calls == 1


def test_initialize_under_jax_registers_nothing(plugin_dir, make_registry):
    # JAX calls every jax_plugins initialize(); outside pjrt's discovery it must do nothing.
    module = plugin_dir.entry_point(PREFIX + "quiet", pjrt_module_source("quietcpu", LIB_81))
    __import__(module).initialize()
    assert not registry.discovering()
    assert "quietcpu" not in registry.default_registry.registered.entries
    assert not pjrt.xla_client.pjrt_plugin_loaded("quietcpu")
    # Under discovery it registers with the registry that is discovering.
    reg = make_registry()
    assert "quietcpu" in reg.registrations()
    assert "quietcpu" not in registry.default_registry.registered.entries


@pytest.mark.parametrize("case", ["raises", "import_error", "missing_module", "bad_library"])
def test_a_broken_module_is_logged_once_and_startup_goes_on(plugin_dir, make_registry, caplog,
                                                            case):
    module = PREFIX + case
    if case == "raises":
        source = "def initialize():\n    raise RuntimeError('the board is on fire')\n"
        reason = "the board is on fire"
    elif case == "import_error":
        source = "import pjrt_test_no_such_dependency\n\ndef initialize():\n    pass\n"
        reason = "pjrt_test_no_such_dependency"
    elif case == "missing_module":
        source = None  # the entry point names a module that is not installed
        reason = module
    else:
        source = pjrt_module_source("badcpu", "/nonexistent/libbad_pjrt.so")
        reason = "no file at /nonexistent/libbad_pjrt.so"
    plugin_dir.entry_point(module, source)
    caplog.set_level(logging.INFO, logger="pjrt")

    reg = make_registry()
    assert reg.default_backend() == "cpu"  # the working plugin still comes up
    record = {r.name: r for r in reg.discovery_records}[module]
    assert record.action == "failed" and reason in record.detail

    logged = messages_about(caplog, module)
    assert len(logged) == 1, logged
    assert reason in logged[0]
    if case in ("import_error", "missing_module"):
        assert "could not be imported" in logged[0]
    if case == "bad_library":
        # The registration keeps the reason, so the failure is visible from the registry too.
        assert "no file at" in reg.backend_errors()["badcpu"]


def test_a_package_whose_plugin_fails_to_come_up_stops_startup(plugin_dir, make_registry):
    """A plugin package's library loads but its client cannot be made: as in jax (whose
    plugins register with fail_quietly=False) start-up stops with the reason and the ways
    out, rather than leaving the program on the CPU."""
    module = plugin_dir.entry_point(PREFIX + "refuses", pjrt_module_source(
        "refusingcpu", LIB_81, options={"cpu_device_count": 0}))
    reg = make_registry()
    with pytest.raises(RuntimeError) as info:
        reg.backends()
    message = str(info.value)
    assert message.startswith("Unable to initialize backend 'refusingcpu': ")
    assert f"the plugin package {module} registered it with fail_quietly=False" in message
    assert ("you may need to uninstall the failing plugin package, or set PJRT_PLATFORMS=cpu "
            "to skip this backend") in message
    assert records(reg)[module] == ("entry point", "initialized")
    assert set(make_registry({"PJRT_PLATFORMS": "cpu"}).backends()) == {"cpu"}


def test_module_without_initialize_is_skipped(plugin_dir, make_registry):
    module = plugin_dir.entry_point(PREFIX + "noinit", "VALUE = 1\n")
    reg = make_registry()
    assert reg.default_backend() == "cpu"
    record = {r.name: r for r in reg.discovery_records}[module]
    assert (record.action, record.detail) == ("skipped", "the module has no initialize()")
    assert sys.modules[module].VALUE == 1  # it was imported to look


# -- modules written for JAX ----------------------------------------------------------------

def test_jax_plugin_library_is_registered_without_importing_the_module(plugin_dir,
                                                                        make_registry):
    module = plugin_dir.jax_wheel("xla_jaxcpu7", LIB_81, "xla_jaxcpu_pjrt_plugin.so")
    reg = make_registry()
    backends = reg.backends()

    assert set(backends) == {"cpu", "jaxcpu"}  # the platform comes from the module's name
    assert module not in sys.modules
    registration = reg.registrations()["jaxcpu"]
    assert registration.plugin.library_path.endswith("xla_jaxcpu_pjrt_plugin.so")
    assert (registration.source, registration.module) == ("namespace", module)
    assert records(reg)[module] == ("namespace (JAX plugin)", "registered library")
    # An accelerator-like platform outranks the CPU plugin for the default.
    assert reg.default_backend_name() == "jaxcpu"
    run_tiny(backends["jaxcpu"].devices()[0])


def test_jax_plugin_for_a_platform_pjrt_already_serves_is_skipped(plugin_dir, make_registry):
    module = plugin_dir.jax_wheel("xla_cpu", LIB_106, "xla_cpu_plugin.so")
    table = PluginTable()
    reg = registry.BackendRegistry(table, environ={})
    try:
        assert reg.default_backend() == "cpu"
        record = {r.name: r for r in reg.discovery_records}[module]
        assert record.action == "skipped"
        assert "already serves 'cpu'" in record.detail
        # Loaded once, from pjrt_cpu's library, not again from the wheel's.
        assert table.names() == ["cpu"]
        assert table.get("cpu").library_path == pjrt_cpu.library_path()
        assert module not in sys.modules
    finally:
        reg.clear_backends()


def test_jax_plugin_without_a_library_is_skipped(plugin_dir, make_registry):
    module = plugin_dir.jax_wheel("xla_nolib", None, "")
    reg = make_registry()
    assert set(reg.backends()) == {"cpu"}
    record = {r.name: r for r in reg.discovery_records}[module]
    assert (record.action, record.detail) == ("skipped",
                                              "written for JAX; no PJRT library beside it")
    assert module not in sys.modules


def test_written_for_jax_and_platform_names():
    assert discovery.written_for_jax("import jax\n")
    assert discovery.written_for_jax("from jax._src import xla_bridge\n")
    assert not discovery.written_for_jax("import jaxlib_helpers\n")
    assert not discovery.written_for_jax("import jax\nimport pjrt.registry\n")
    assert discovery.platform_of_jax_module("jax_plugins.xla_cuda12") == "cuda"
    assert discovery.platform_of_jax_module("jax_plugins.xla_rocm7") == "rocm"
    assert discovery.platform_of_jax_module("jax_plugins.xla_tpu_plugin") == "tpu"


# -- names and priorities -------------------------------------------------------------------

def test_duplicate_platform_from_another_library_fails_that_module_only(plugin_dir,
                                                                        make_registry, caplog):
    # Modules are initialised in name order: _a wins the name, _b asks for it again.
    first = plugin_dir.entry_point(PREFIX + "dup_a", pjrt_module_source("dupcpu", LIB_81))
    second = plugin_dir.entry_point(PREFIX + "dup_b", pjrt_module_source("dupcpu", LIB_106))
    caplog.set_level(logging.INFO, logger="pjrt")
    reg = make_registry()

    assert reg.get_backend("dupcpu").plugin.library_path == LIB_81
    assert records(reg)[first][1] == "initialized"
    assert records(reg)[second][1] == "failed"
    logged = messages_about(caplog, second)
    assert len(logged) == 1 and "already loaded" in logged[0]


def test_duplicate_platform_from_the_same_library_keeps_one_backend(plugin_dir, make_registry):
    plugin_dir.entry_point(PREFIX + "same_a", pjrt_module_source("samecpu", LIB_81))
    plugin_dir.entry_point(PREFIX + "same_b", pjrt_module_source("samecpu", LIB_81,
                                                                 priority=900))
    reg = make_registry()
    assert set(reg.backends()) == {"cpu", "samecpu"}
    # The later registration replaced the earlier one.
    assert reg.registrations()["samecpu"].module == PREFIX + "same_b"
    assert reg.default_backend_name() == "samecpu"


def test_priorities_decide_the_default(plugin_dir, make_registry):
    plugin_dir.entry_point(PREFIX + "lo", pjrt_module_source("locpu", LIB_81, priority=10))
    plugin_dir.entry_point(PREFIX + "hi", pjrt_module_source("hicpu", LIB_106, priority=700))
    reg = make_registry()
    assert set(reg.backends()) == {"cpu", "locpu", "hicpu"}
    assert reg.default_backend_name() == "hicpu"
    assert reg.get_backend().plugin.api_version == (0, 106)
    # Listed platforms: the order is the priority.
    listed = make_registry({"PJRT_PLATFORMS": "locpu,hicpu"})
    assert listed.default_backend_name() == "locpu"
    assert set(listed.backends()) == {"locpu", "hicpu"}


def test_discovery_records_describe_every_decision(plugin_dir, make_registry, tmp_path):
    good = plugin_dir.entry_point(PREFIX + "rec_good", pjrt_module_source("goodcpu", LIB_81))
    noinit = plugin_dir.entry_point(PREFIX + "rec_noinit", "")
    broken = plugin_dir.entry_point(PREFIX + "rec_broken",
                                    "def initialize():\n    raise ValueError('nope')\n")
    wheel = plugin_dir.jax_wheel("xla_reccpu", LIB_81, "reccpu_pjrt_plugin.so")
    reg = make_registry({ENV: f"envcpu:{LIB_106},ghost:{tmp_path}/ghost_plugin.so"})
    reg.registrations()  # discovery, and nothing brought up
    assert records(reg) == {
        "pjrt_cpu": ("entry point", "initialized"),
        good: ("entry point", "initialized"),
        noinit: ("entry point", "skipped"),
        broken: ("entry point", "failed"),
        wheel: ("namespace (JAX plugin)", "registered library"),
        "envcpu": (ENV, "registered library"),
        "ghost": (ENV, "failed"),
    }
    by_name = {r.name: r for r in reg.discovery_records}
    assert by_name[broken].detail == "ValueError: nope"
    assert "no file at" in by_name["ghost"].detail
    assert "no file at" in reg.backend_errors()["ghost"]
    # The library the operator named cannot be loaded: start-up stops (see
    # test_env_library_that_cannot_be_loaded_stops_startup); without it the rest comes up.
    with pytest.raises(RuntimeError, match="Unable to initialize backend 'ghost'"):
        reg.backends()
    reg.set_platforms("cpu,goodcpu,reccpu,envcpu")
    assert set(reg.backends()) == {"cpu", "goodcpu", "reccpu", "envcpu"}


def test_clear_backends_rediscovers(plugin_dir, make_registry):
    module = plugin_dir.entry_point(PREFIX + "again", pjrt_module_source("againcpu", LIB_81))
    reg = make_registry()
    old = reg.get_backend("againcpu")
    reg.clear_backends()
    assert not old.is_closed  # forgotten, not closed: it is freed with its last reference
    old.close()
    assert reg.discovery_records == []
    new = reg.get_backend("againcpu")
    assert new is not old and not new.is_closed
    assert sys.modules[module].calls == 2
    assert len(reg.discovery_records) == 2  # pjrt_cpu and ours, once each


# -- PJRT_NAMES_AND_LIBRARY_PATHS -----------------------------------------------------------

def test_env_library(make_registry):
    reg = make_registry({ENV: f"envcpu:{LIB_106}"})
    client = reg.get_backend("envcpu")
    assert client.plugin.library_path == LIB_106
    registration = reg.registrations()["envcpu"]
    assert registration.source == ENV
    run_tiny(client.devices()[0])


def test_env_json_with_create_options(make_registry, tmp_path):
    config = tmp_path / "cpu2.json"
    config.write_text(json.dumps({"library_path": LIB_106,
                                  "create_options": {"cpu_device_count": 3}}))
    reg = make_registry({ENV: f"cpu2:{config}"})
    client = reg.get_backend("cpu2")
    assert client.device_count() == 3
    assert [d.id for d in client.devices()] == [0, 1, 2]
    run_tiny(client.devices()[2])
    assert reg.registrations()["cpu2"].source == f"{ENV} ({config})"
    assert records(reg)["cpu2"] == (f"{ENV} ({config})", "registered library")


def test_the_same_library_serves_two_names_in_two_tables(make_registry, tmp_path):
    # pjrt_cpu loads XLA's CPU library as "cpu"; the environment asks for it again as
    # "cpu2" with other options. Both clients are real and independent.
    config = tmp_path / "cpu2.json"
    config.write_text(json.dumps({"library_path": pjrt_cpu.library_path(),
                                  "create_options": {"cpu_device_count": 3}}))
    reg = make_registry({ENV: f"cpu2:{config}"})
    other = make_registry()
    cpu2, cpu = reg.get_backend("cpu2"), other.get_backend("cpu")
    assert cpu2.device_count() == 3
    assert cpu2.plugin.api.table == cpu.plugin.api.table  # one library in the process
    run_tiny(cpu2.devices()[2])
    run_tiny(cpu.devices()[0])


def test_malformed_env_entries_are_named_and_the_rest_load(make_registry, caplog):
    caplog.set_level(logging.WARNING, logger="pjrt")
    value = f"nocolon, :{LIB_81},emptypath: ,envcpu:{LIB_81}"
    reg = make_registry({ENV: value})
    assert set(reg.backends()) == {"cpu", "envcpu"}
    warnings = [r.getMessage() for r in caplog.records if "invalid value" in r.getMessage()]
    assert len(warnings) == 3
    assert warnings[0].startswith(f"invalid value nocolon in env var {ENV} {value}: ")
    assert warnings[1].startswith(f"invalid value :{LIB_81} in env var {ENV} {value}: ")
    assert warnings[2].startswith(f"invalid value emptypath: in env var {ENV} {value}: ")


def test_env_json_without_library_path_is_a_value_error_naming_the_file(make_registry,
                                                                        tmp_path):
    config = tmp_path / "broken.json"
    config.write_text(json.dumps({"create_options": {"cpu_device_count": 2}}))
    reg = make_registry({ENV: f"broken:{config}"})
    for _ in range(2):  # raised again, not forgotten after the first question
        with pytest.raises(ValueError, match="library_path") as excinfo:
            reg.backends()
        assert str(config) in str(excinfo.value)
    assert not reg.backends_are_initialized()


def test_env_json_that_is_not_json_names_the_file(tmp_path):
    config = tmp_path / "garbled.json"
    config.write_text("{library_path: ")
    with pytest.raises(ValueError, match="not valid JSON") as excinfo:
        discovery.read_plugin_config(str(config))
    assert str(config) in str(excinfo.value)


def test_env_library_that_cannot_be_loaded_stops_startup(make_registry):
    """As in jax, a library the operator named that cannot be loaded is an error, not a
    backend quietly left out (which would leave the program on the CPU): the error gives
    jax's words, the reason and the ways out. Leaving it out of PJRT_PLATFORMS is one."""
    entries = f"ghost:/nonexistent/ghost_plugin.so,envcpu:{LIB_81}"
    reg = make_registry({ENV: entries})
    for _ in range(2):  # the same answer each time, nothing half-initialised
        with pytest.raises(RuntimeError) as info:
            reg.backends()
        message = str(info.value)
        assert message.startswith("Unable to initialize backend 'ghost': plugin 'ghost': no "
                                  "file at /nonexistent/ghost_plugin.so")
        assert f"it is named in {ENV}" in message and "fix or remove that entry" in message
        assert "set PJRT_PLATFORMS=cpu to skip this backend" in message
    assert not reg.backends_are_initialized()
    assert "no file at /nonexistent/ghost_plugin.so" in reg.backend_errors()["ghost"]

    chosen = make_registry({ENV: entries, "PJRT_PLATFORMS": "cpu,envcpu"})
    assert set(chosen.backends()) == {"cpu", "envcpu"}
    with pytest.raises(RuntimeError, match="Unknown backend ghost: it is registered but not "
                                           "in PJRT_PLATFORMS"):
        chosen.get_backend("ghost")


def test_env_library_whose_client_fails_stops_startup(make_registry, tmp_path):
    """A library that loads but whose client cannot be made (a create option XLA's CPU
    plugin refuses) stops start-up too, instead of leaving only the CPU up."""
    config = tmp_path / "refused.json"
    config.write_text(json.dumps({"library_path": LIB_106,
                                  "create_options": {"cpu_device_count": 0}}))
    reg = make_registry({ENV: f"refused:{config}"})
    with pytest.raises(RuntimeError) as info:
        reg.backends()
    message = str(info.value)
    assert message.startswith("Unable to initialize backend 'refused': ")
    assert "'cpu_device_count'" in message and f"it is named in {ENV}" in message
    assert reg.registrations()["refused"].fail_quietly is False
    assert "cpu_device_count" in reg.backend_errors()["refused"]


def test_env_entry_for_a_registered_name_is_ignored_with_a_warning(make_registry, caplog):
    caplog.set_level(logging.WARNING, logger="pjrt")
    reg = make_registry({ENV: f"cpu:{LIB_106}"})
    assert reg.get_backend("cpu").plugin.library_path == pjrt_cpu.library_path()
    assert records(reg)["cpu"] == (ENV, "skipped")
    assert len(messages_about(caplog, "already registered")) == 1


def test_plugins_from_env_parses_names_paths_and_configs(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"library_path": "/x/lib.so", "create_options": {"a": 1}}))
    assert discovery.plugins_from_env(None) == []
    assert discovery.plugins_from_env("") == []
    assert discovery.plugins_from_env(f" one:/a/one.so , two:{config},") == [
        discovery.EnvPlugin("one", "/a/one.so", None),
        discovery.EnvPlugin("two", "/x/lib.so", {"a": 1}, config_file=str(config)),
    ]
