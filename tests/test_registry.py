"""The backend registry: laziness, platform selection, aliases, errors, threads, and the
module-level API on the default registry.

Tests build their own :class:`~pjrt.registry.BackendRegistry` on a fresh
:class:`~pjrt.plugin.PluginTable` and a given environment, so no state leaks between them.
Every backend is a real client of XLA's CPU plugin; factories that are counted still make
real clients.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import pjrt
import pjrt_cpu
from pjrt import registry
from pjrt._pjrt_cffi import ffi
from pjrt.client import create_client
from pjrt.plugin import PluginTable

from conftest import cpu_plugin_path, run_tiny
from fixtures import programs

TINY = programs.get("tiny_tanh")
LIB_81 = cpu_plugin_path("xla_cpu_0_81")
LIB_106 = cpu_plugin_path("xla_cpu_0_106")
ENV = "PJRT_NAMES_AND_LIBRARY_PATHS"


class CountingFactory:
    """A backend factory that counts its calls and makes a real CPU client each time."""

    def __init__(self, table: PluginTable, name: str, library: str = LIB_81, devices: int = 1):
        self.table, self.name, self.library, self.devices = table, name, library, devices
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            self.calls += 1
        plugin = self.table.load(self.name, self.library)
        return create_client(plugin, {"cpu_device_count": self.devices})


def failing(message: str):
    def factory():
        raise OSError(message)
    return factory


# -- laziness -------------------------------------------------------------------------------

def test_nothing_is_loaded_or_called_until_asked(make_registry):
    table = PluginTable()
    reg = make_registry(table=table)
    factory = CountingFactory(table, "lazy")
    reg.register_backend_factory("lazy", factory)
    assert factory.calls == 0
    assert table.names() == [] and reg.discovery_records == []
    assert not reg.backends_are_initialized()

    # Looking at the registrations discovers plugins and loads their libraries, but makes
    # no client.
    assert set(reg.registrations()) == {"cpu", "lazy"}
    assert factory.calls == 0 and not reg.backends_are_initialized()

    assert set(reg.backends()) == {"cpu", "lazy"}
    assert reg.backends_are_initialized()
    reg.backends()
    reg.get_backend("lazy")
    assert factory.calls == 1


def test_registry_reads_its_own_environment(make_registry, monkeypatch):
    monkeypatch.setenv("PJRT_PLATFORMS", "nosuch")
    reg = make_registry({})
    assert reg.default_backend() == "cpu"


def test_concurrent_first_questions_initialise_each_factory_once(make_registry):
    table = PluginTable()
    reg = make_registry(table=table, discover=False)
    factories = [CountingFactory(table, f"t{i}", devices=i + 1) for i in range(3)]
    for i, factory in enumerate(factories):
        reg.register_backend_factory(factory.name, factory, priority=i)
    barrier = threading.Barrier(16)
    seen, errors = [], []

    def ask(i):
        try:
            barrier.wait()
            client = reg.get_backend() if i % 2 else reg.backends()["t1"]
            seen.append(client)
        except Exception as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [f.calls for f in factories] == [1, 1, 1]
    assert len(seen) == 16
    assert {c.plugin.name for c in seen} == {"t1", "t2"}
    assert reg.default_backend_name() == "t2" and reg.get_backend().device_count() == 3


# -- clear_backends --------------------------------------------------------------------------

@pytest.mark.parametrize("library", [LIB_81, LIB_106], ids=["0.81", "0.106"])
def test_clear_backends_closes_nothing(make_registry, library):
    """As in jax, clear_backends() only forgets the backends: arrays and executables made
    before keep working, and the old client is freed once the last of them goes."""
    import gc
    import weakref

    table = PluginTable()
    reg = make_registry(table=table, discover=False)
    reg.register_backend_factory("t", CountingFactory(table, "t", library))
    old = reg.get_backend("t")
    executable = old.compile_and_load(TINY.read_text())
    inputs = [old.buffer_from_pyval(x) for x in TINY.inputs()]
    reg.clear_backends()
    new = reg.get_backend("t")
    assert new is not old and not old.is_closed
    (out,) = executable.execute(inputs)
    programs.check_outputs(TINY, [np.asarray(out)])
    (fresh,) = new.compile_and_load(TINY.read_text()).execute(
        [new.buffer_from_pyval(x) for x in TINY.inputs()])
    programs.check_outputs(TINY, [np.asarray(fresh)])
    old_handle = weakref.ref(old._handle)
    del old, executable, inputs, out
    gc.collect()
    assert old_handle() is None, "the forgotten client outlived its last array and executable"


@pytest.mark.parametrize("library", [LIB_81, LIB_106], ids=["0.81", "0.106"])
def test_clear_backends_while_threads_compile_and_call(make_registry, library):
    """Three threads compile and call on the backend they got while clear_backends() runs
    over and over (at least 20 times): every call gives the right value, none is refused."""
    table = PluginTable()
    reg = make_registry(table=table, discover=False)
    reg.register_backend_factory("t", CountingFactory(table, "t", library))
    results, errors = [], []
    start = threading.Barrier(4)

    def compile_and_call():
        start.wait()
        for _ in range(10):
            try:
                client = reg.get_backend("t")
                executable = client.compile_and_load(TINY.read_text())
                (out,) = executable.execute([client.buffer_from_pyval(x)
                                             for x in TINY.inputs()])
                programs.check_outputs(TINY, [np.asarray(out)])
                results.append(1)
            except Exception as error:  # noqa: BLE001 - reported by the assert below
                errors.append(repr(error))

    threads = [threading.Thread(target=compile_and_call) for _ in range(3)]
    for thread in threads:
        thread.start()
    start.wait()
    clears = 0
    while any(thread.is_alive() for thread in threads) or clears < 20:
        reg.clear_backends()
        clears += 1
        time.sleep(0.005)
    assert errors == [] and len(results) == 30, (errors[:3], len(results))


# -- platform selection ---------------------------------------------------------------------

def test_platforms_env_brings_up_only_the_listed_platform(make_registry, cpu2_config):
    table = PluginTable()
    reg = make_registry({"PJRT_PLATFORMS": "cpu2", ENV: cpu2_config}, table=table)
    other = CountingFactory(table, "other")
    reg.register_backend_factory("other", other, priority=1000)

    backends = reg.backends()
    assert set(backends) == {"cpu2"}
    # The default backend's registration is cpu2; its platform, what jax's
    # default_backend() answers, is the CPU plugin's.
    assert reg.default_backend_name() == "cpu2" and reg.default_backend() == "cpu"
    assert backends["cpu2"].device_count() == 3
    run_tiny(backends["cpu2"].devices()[1])
    # The others were registered but never touched: no call, no library loaded.
    assert other.calls == 0
    assert table.names() == ["cpu2"]
    assert set(reg.registrations()) == {"cpu", "cpu2", "other"}
    assert reg.registrations()["cpu"].plugin is None
    with pytest.raises(RuntimeError, match="Unknown backend cpu: it is registered but not in PJRT_PLATFORMS"):
        reg.get_backend("cpu")


def test_a_listed_platform_that_fails_is_a_loud_error(make_registry):
    reg = make_registry({"PJRT_PLATFORMS": "broken,cpu"})
    reg.register_backend_factory("broken", failing("no device attached"))
    for _ in range(2):  # not cached as a half-initialised state
        with pytest.raises(RuntimeError) as excinfo:
            reg.backends()
        message = str(excinfo.value)
        assert "Unable to initialize backend 'broken'" in message
        assert "'broken': no device attached (OSError;" in message
        assert "PJRT_PLATFORMS=''" in message  # the hint
    assert not reg.backends_are_initialized()


def test_a_listed_platform_that_is_not_registered_is_named(make_registry):
    reg = make_registry({"PJRT_PLATFORMS": "cpu,nosuch"})
    with pytest.raises(RuntimeError, match="no backend named 'nosuch' is registered") as info:
        reg.backends()
    assert "registered: cpu" in str(info.value)


def test_unlisted_failures_are_recorded_not_raised(make_registry):
    reg = make_registry()
    reg.register_backend_factory("flaky", failing("driver too old"), priority=900)
    assert reg.default_backend() == "cpu"
    assert reg.backend_errors() == {"flaky": "OSError: driver too old"}
    with pytest.raises(RuntimeError, match="'flaky' failed to initialise: OSError: driver"):
        reg.get_backend("flaky")
    with pytest.raises(RuntimeError, match="Unknown backend nosuch"):
        reg.get_backend("nosuch")


@pytest.mark.parametrize("platforms", ["gpu", "gpu,cpu"])
def test_gpu_alias_without_a_gpu_plugin_is_a_clear_error(make_registry, platforms):
    reg = make_registry({"PJRT_PLATFORMS": platforms})
    with pytest.raises(RuntimeError) as excinfo:
        reg.backends()
    message = str(excinfo.value)
    assert "'gpu'" in message and "cuda or rocm" in message
    assert "registered: cpu" in message


def test_gpu_alias_brings_up_the_registered_member(make_registry):
    # XLA's CPU library registered under a GPU platform name stands for a GPU plugin here:
    # what is tested is the alias, and the client behind it is real.
    table = PluginTable()
    reg = make_registry({"PJRT_PLATFORMS": "gpu"}, table=table)
    reg.register_plugin("rocm", library_path=LIB_81, options={"cpu_device_count": 2})
    assert set(reg.backends()) == {"rocm"}
    assert reg.canonicalize_platform("gpu") == "rocm"
    assert reg.get_backend("gpu") is reg.get_backend("rocm")
    assert reg.get_backend("gpu").device_count() == 2
    assert "cpu" not in table.names()


def test_set_platforms_overrides_the_environment(make_registry, cpu2_config):
    reg = make_registry({"PJRT_PLATFORMS": "nosuch", ENV: cpu2_config})
    reg.set_platforms(["cpu"])
    assert set(reg.backends()) == {"cpu"}
    reg.set_platforms("cpu")  # what is chosen already may be chosen again, as in jax
    with pytest.raises(RuntimeError, match="already initialised with set_platforms\\('cpu'\\); "
                                           "call clear_backends\\(\\)"):
        reg.set_platforms("cpu2")

    old = reg.get_backend("cpu")
    reg.clear_backends()
    assert not reg.backends_are_initialized()
    assert not old.is_closed  # forgotten, not closed (see test_clear_backends_closes_nothing)
    old.close()
    reg.set_platforms("cpu2, cpu")  # spaces are forgiven (names are case-sensitive, as in jax)
    assert reg.selected_platforms() == ["cpu2", "cpu"]
    assert set(reg.backends()) == {"cpu2", "cpu"}
    assert reg.default_backend_name() == "cpu2"

    reg.clear_backends()
    reg.set_platforms(None)  # back to PJRT_PLATFORMS, which names nothing registered
    with pytest.raises(RuntimeError, match="no backend named 'nosuch'"):
        reg.backends()


def test_changing_the_selection_after_discovery_redoes_it(make_registry, cpu2_config):
    table = PluginTable()
    reg = make_registry({ENV: cpu2_config}, table=table)
    reg.set_platforms("cpu2")
    assert set(reg.registrations()) == {"cpu", "cpu2"}
    assert table.names() == ["cpu2"]  # cpu was discovered but excluded
    reg.set_platforms(None)
    assert set(reg.backends()) == {"cpu", "cpu2"}
    assert set(table.names()) == {"cpu", "cpu2"}


def test_an_api_plugin_excluded_at_registration_loads_when_selected_later(make_registry):
    table = PluginTable()
    reg = make_registry({"PJRT_PLATFORMS": "cpu"}, table=table)
    assert reg.register_plugin("late", library_path=LIB_106) is None
    assert "late" not in table.names()
    assert set(reg.backends()) == {"cpu"}
    reg.clear_backends()
    reg.set_platforms("late")
    assert reg.get_backend("late").plugin.api_version == (0, 106)
    assert "late" in table.names()


def test_aliases_and_names(make_registry):
    assert registry.expand_platform_alias("gpu") == ["cuda", "rocm"]
    assert registry.expand_platform_alias("cpu") == ["cpu"]
    assert registry.is_gpu("cuda") and registry.is_gpu("rocm")
    assert not registry.is_gpu("gpu") and not registry.is_gpu("cpu")

    reg = make_registry()
    reg.register_backend_factory("flaky", failing("gone"))
    assert reg.is_known_platform("cpu")
    assert reg.is_known_platform("gpu")  # an alias is known even with no member
    assert reg.is_known_platform("flaky")  # registered, even though it will fail
    assert not reg.is_known_platform("nosuch")
    assert not reg.backends_are_initialized()  # asking what is known starts nothing
    assert reg.canonicalize_platform("cpu") == "cpu"
    assert reg.canonicalize_platform("nosuch") == "nosuch"
    with pytest.raises(RuntimeError, match="no gpu backend is available"):
        reg.canonicalize_platform("gpu")


# -- nothing came up ------------------------------------------------------------------------

def test_nothing_came_up_lists_every_backend_and_why(make_registry):
    reg = make_registry(discover=False)
    reg.register_backend_factory("alpha", failing("alpha has no devices attached"))
    reg.register_backend_factory("beta", lambda: None)
    with pytest.raises(RuntimeError) as excinfo:
        reg.backends()
    lines = str(excinfo.value).splitlines()
    assert lines[0] == "no PJRT backend could be started:"
    assert lines[1:] == ["  alpha: OSError: alpha has no devices attached",
                         "  beta: RuntimeError: Could not initialize backend 'beta': its factory returned no client"]


def test_nothing_registered_says_what_to_install(make_registry):
    reg = make_registry(discover=False)
    with pytest.raises(RuntimeError, match="no PJRT backend is registered.*pjrt-cpu"):
        reg.backends()


# -- registering ----------------------------------------------------------------------------

def test_registering_an_initialised_name_is_refused(make_registry):
    table = PluginTable()
    reg = make_registry(table=table, discover=False)
    reg.register_backend_factory("x", CountingFactory(table, "x"))
    reg.get_backend("x")
    with pytest.raises(RuntimeError, match="'x' is already initialised"):
        reg.register_backend_factory("x", CountingFactory(table, "x"))
    # A name that is not initialised yet may still be added, and after a clear, replaced.
    reg.register_backend_factory("y", CountingFactory(table, "y"))
    reg.clear_backends()
    again = CountingFactory(table, "x", devices=2)
    reg.register_backend_factory("x", again)
    assert reg.get_backend("x").device_count() == 2 and again.calls == 1


def test_register_plugin_needs_exactly_one_source(make_registry):
    reg = make_registry(discover=False)
    with pytest.raises(ValueError, match="exactly one of library_path and c_api"):
        reg.register_plugin("none")
    with pytest.raises(ValueError, match="exactly one of library_path and c_api"):
        reg.register_plugin("both", library_path=LIB_81, c_api=1)
    assert reg.registrations() == {}


def test_register_plugin_from_a_c_api_address(make_registry):
    loaded = PluginTable().load("origin", LIB_106)
    address = int(ffi.cast("uintptr_t", loaded.api.table))
    reg = make_registry(discover=False)
    plugin = reg.register_plugin("capi", c_api=address, options={"cpu_device_count": 2})
    assert plugin.library_path is None and plugin.api_version == (0, 106)
    client = reg.get_backend("capi")
    assert client.device_count() == 2
    run_tiny(client.devices()[1])


def test_register_plugin_with_a_missing_library_records_the_reason(make_registry):
    reg = make_registry()
    with pytest.raises(pjrt.PluginLoadError, match="no file at /nonexistent/x.so"):
        reg.register_plugin("gone", library_path="/nonexistent/x.so")
    assert reg.default_backend() == "cpu"
    assert "no file at /nonexistent/x.so" in reg.backend_errors()["gone"]


def test_a_plugin_that_fails_to_come_up_stops_startup(make_registry):
    """register_plugin registers with fail_quietly=False, as jax's does: a plugin that
    loads but cannot make its client is an error, not a backend quietly left out."""
    reg = make_registry(discover=False)
    reg.register_plugin("cpu", library_path=LIB_106)
    reg.register_plugin("vendorx", library_path=LIB_81, options={"cpu_device_count": 0})
    assert reg.registrations()["vendorx"].fail_quietly is False
    with pytest.raises(RuntimeError) as info:
        reg.backends()
    message = str(info.value)
    assert message.startswith("Unable to initialize backend 'vendorx': ")
    assert "'cpu_device_count'" in message
    assert "registered with fail_quietly=False" in message
    assert "set PJRT_PLATFORMS=cpu to skip this backend" in message
    assert "cpu_device_count" in reg.backend_errors()["vendorx"]
    reg.set_platforms("cpu")  # the way out the message gives
    assert set(reg.backends()) == {"cpu"}


def _device_nodes(monkeypatch, tmp_path, *, nvidia: bool = False, amd: bool = False):
    """Make the registry see NVIDIA's and AMD's device nodes, or not."""
    def nodes(present: bool, name: str) -> tuple:
        node = tmp_path / name
        if present:
            node.touch()
        return (str(node),)
    monkeypatch.setattr(registry, "_NVIDIA_DEVICE_NODES", nodes(nvidia, "nvidia0"))
    monkeypatch.setattr(registry, "_AMD_DEVICE_NODES", nodes(amd, "kfd"))


def _refusing_plugins(reg, *platforms):
    """Register XLA's CPU library under ``platforms``, each with a create option it refuses:
    plugins that load and then fail to make their client, as a GPU plugin does without a GPU."""
    reg.register_plugin("cpu", library_path=LIB_106)
    for platform in platforms:
        reg.register_plugin(platform, library_path=LIB_81, options={"cpu_device_count": 0})


def test_gpu_and_tpu_plugins_without_their_device_fail_quietly(make_registry, monkeypatch,
                                                               tmp_path):
    """As in jax: cuda is not a loud failure where no NVIDIA device node exists (jax does not
    even try it), rocm neither without AMD's (jax's rocm plugin steps aside), and tpu never
    (jax registers it with fail_quietly=True). The reasons are kept."""
    _device_nodes(monkeypatch, tmp_path)
    reg = make_registry(discover=False)
    _refusing_plugins(reg, "cuda", "rocm", "tpu")
    assert set(reg.backends()) == {"cpu"}
    assert set(reg.backend_errors()) == {"cuda", "rocm", "tpu"}
    assert all("cpu_device_count" in reason for reason in reg.backend_errors().values())


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_a_gpu_plugin_that_fails_where_its_gpu_is_present_stops_startup(
        make_registry, monkeypatch, tmp_path, platform):
    _device_nodes(monkeypatch, tmp_path, nvidia=platform == "cuda", amd=platform == "rocm")
    reg = make_registry(discover=False)
    _refusing_plugins(reg, "cuda", "rocm")
    with pytest.raises(RuntimeError, match=f"Unable to initialize backend '{platform}': "):
        reg.backends()


def test_backend_versions_come_from_the_plugin(make_registry):
    """jax's backend_pjrt_c_api_version, backend_xla_version and backend_stablehlo_version:
    what each plugin reports (its attributes and the API version it was driven at)."""
    reg = make_registry(discover=False)
    reg.register_plugin("old", library_path=LIB_81, priority=1)
    reg.register_plugin("new", library_path=LIB_106, priority=2)
    old, new = reg.get_backend("old"), reg.get_backend("new")
    for client, api, stablehlo in ((old, (0, 81), [1, 13, 3]), (new, (0, 106), [1, 16, 1])):
        assert registry.backend_pjrt_c_api_version(client) == api
        assert registry.backend_xla_version(client) == 2
        assert registry.backend_stablehlo_version(client) == stablehlo
        assert client.plugin.attributes()["stablehlo_current_version"] == stablehlo


def test_backend_versions_of_the_default_backend_and_unknown_ones():
    client = pjrt.get_backend()
    attributes = client.plugin.attributes()
    assert registry.backend_pjrt_c_api_version() == client.plugin.api_version
    assert registry.backend_xla_version() == attributes.get("xla_version")
    assert registry.backend_stablehlo_version("cpu") == attributes.get("stablehlo_current_version")
    for question in (registry.backend_pjrt_c_api_version, registry.backend_xla_version,
                     registry.backend_stablehlo_version):
        with pytest.raises(RuntimeError, match="Unknown backend nosuch"):
            question("nosuch")


def test_backend_versions_of_a_backend_that_is_no_plugin_client(make_registry):
    """A factory's own object (no PJRT C API client): None, as jax answers for such."""
    class NotAPlugin:
        platform = "other"

        def device_count(self):
            return 1

        def close(self):
            pass

    reg = make_registry(discover=False)
    reg.register_backend_factory("other", NotAPlugin)
    backend = reg.get_backend("other")
    assert registry.backend_pjrt_c_api_version(backend) is None
    assert registry.backend_xla_version(backend) is None
    assert registry.backend_stablehlo_version(backend) is None


# -- the module-level API on the default registry -------------------------------------------

def test_module_level_api_uses_the_installed_cpu_plugin():
    devices = pjrt.devices()
    assert devices and all(d.platform == "cpu" for d in devices)
    assert pjrt.default_backend() == "cpu"
    assert "cpu" in pjrt.backends()
    assert pjrt.get_backend() is pjrt.get_backend("cpu")
    assert pjrt.backends_are_initialized()
    assert pjrt.device_count() == len(devices) == pjrt.local_device_count()
    assert pjrt.local_devices() == devices
    assert pjrt.process_index() == 0 and pjrt.process_count() == 1
    # The build pjrt-cpu chooses (pjrt_cpu.PREFERENCE, or PJRT_CPU_BUILD) and its API version.
    build = pjrt_cpu.chosen_build()
    assert pjrt.get_backend().plugin.library_path == pjrt_cpu.library_path()
    assert pjrt.backend_pjrt_c_api_version() == pjrt.get_backend().plugin.api_version == (
        0, build.api_minor)
    assert pjrt.registry.is_known_platform("cpu") and pjrt.registry.canonicalize_platform("cpu") == "cpu"

    compiled = pjrt.compile(TINY.read_text())  # no device: the default backend's first
    assert compiled.devices == [devices[0]]
    programs.check_outputs(TINY, [np.asarray(compiled(*TINY.inputs()))])

    with pytest.raises(ValueError, match="Unknown process_index 5"):
        pjrt.local_devices(process_index=5)


def test_make_cpu_client():
    with pjrt.make_cpu_client(num_devices=3) as client:
        assert client.platform == "cpu" and client.device_count() == 3
        run_tiny(client.devices()[2])


def test_cpu_device_count_from_the_environment(monkeypatch):
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "2")
    assert pjrt_cpu.client_options() == {"cpu_device_count": 2}
    assert pjrt_cpu.client_options(5) == {"cpu_device_count": 5}  # an argument wins
    with pjrt.make_cpu_client() as client:
        assert client.device_count() == 2
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "two")
    with pytest.raises(ValueError, match="PJRT_CPU_DEVICE_COUNT='two' is not an integer"):
        pjrt_cpu.client_options()
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "0")
    with pytest.raises(ValueError, match="at least 1"):
        pjrt_cpu.client_options()
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, " ")
    assert pjrt_cpu.client_options() == {}


def test_fork_after_initialisation_warns():
    pjrt.backends()
    # Capture every warning: jax, when another test has imported it, warns about fork too.
    with pytest.warns(RuntimeWarning) as caught:
        pid = os.fork()
        if pid == 0:  # the child leaves at once, before touching anything
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ours = [w for w in caught if "was called while pjrt clients are open" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    assert "'spawn' start method" in str(ours[0].message)


# -- plugin packages ------------------------------------------------------------------------

def test_check_plugin_version():
    assert pjrt.plugin_api.check_plugin_version("pjrt_cpu", "0.1.0", "0.1.7")
    assert pjrt.plugin_api.check_plugin_version("pjrt_cpu", "1.2.3", "1.2.0rc1")
    with pytest.warns(RuntimeWarning, match="pjrt_cpu 0.2.0 is installed, but it does not "
                                            "match pjrt 0.1.0"):
        assert pjrt.plugin_api.check_plugin_version("pjrt_cpu", "0.1.0", "0.2.0") is False


def test_import_from_plugin(tmp_path, monkeypatch):
    assert pjrt.plugin_support.import_from_plugin("cpu", "no_such_submodule") is None
    with pytest.raises(ValueError, match="unknown plugin 'nosuch'"):
        pjrt.plugin_support.import_from_plugin("nosuch", "anything")

    # Give pjrt_cpu a real submodule from a directory added to its package path.
    (tmp_path / "extra_kernels.py").write_text("ANSWER = 42\n")
    monkeypatch.setattr(pjrt_cpu, "__path__", [*pjrt_cpu.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "pjrt_cpu.extra_kernels", raising=False)
    try:
        assert pjrt.plugin_support.import_from_plugin("cpu", "extra_kernels").ANSWER == 42
        monkeypatch.setattr(pjrt_cpu, "__version__", "7.0.0")
        with pytest.warns(RuntimeWarning, match="pjrt_cpu 7.0.0"):
            assert pjrt.plugin_support.import_from_plugin("cpu", "extra_kernels") is None
        assert pjrt.plugin_support.import_from_plugin("cpu", "extra_kernels", check_version=False).ANSWER == 42
    finally:
        sys.modules.pop("pjrt_cpu.extra_kernels", None)


# -- warnings at start-up -------------------------------------------------------------------

def test_an_untested_platform_warns_once_when_it_comes_up(make_registry, caplog):
    reg = make_registry(discover=False)
    reg.register_plugin("vendorx", library_path=LIB_81, options={"cpu_device_count": 1})
    with caplog.at_level("WARNING", logger="pjrt.registry"):
        reg.get_backend("vendorx")
        reg.get_backend("vendorx")
    warnings_about_it = [r for r in caplog.records if "'vendorx'" in r.getMessage()]
    assert len(warnings_about_it) == 1
    assert "is experimental and not all JAX functionality" in warnings_about_it[0].getMessage()


def test_nvidia_device_nodes_without_a_cuda_backend_give_the_install_hint(
        make_registry, caplog, monkeypatch, tmp_path):
    node = tmp_path / "nvidia0"
    node.write_text("")
    monkeypatch.setattr(registry, "_NVIDIA_DEVICE_NODES", (str(node),))
    reg = make_registry()
    with caplog.at_level("WARNING", logger="pjrt.registry"):
        assert reg.default_backend() == "cpu"
    hints = [r.getMessage() for r in caplog.records if "NVIDIA GPU" in r.getMessage()]
    assert len(hints) == 1 and "pip install pjrt-cuda" in hints[0]


def test_no_hint_without_nvidia_device_nodes(make_registry, caplog, monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_NVIDIA_DEVICE_NODES", (str(tmp_path / "absent"),))
    reg = make_registry()
    with caplog.at_level("WARNING", logger="pjrt.registry"):
        reg.backends()
    assert not [r for r in caplog.records if "NVIDIA GPU" in r.getMessage()]


def test_platform_names_are_case_sensitive(make_registry, cpu2_config):
    """A backend registered under a mixed-case name is selected by that name (jax keeps
    names as written); another spelling names another platform."""
    reg = make_registry({ENV: cpu2_config})
    cpu = reg.registrations()["cpu2"].factory
    reg.register_backend_factory("platform_A", cpu, priority=500, fail_quietly=False)
    reg.set_platforms("platform_A")
    assert reg.selected_platforms() == ["platform_A"]
    assert set(reg.backends()) == {"platform_A"}
    assert reg.get_backend().device_count() >= 1
    reg.get_backend().close()
    reg.clear_backends()
    reg.set_platforms("PLATFORM_A")
    with pytest.raises(RuntimeError, match="no backend named 'PLATFORM_A' is registered"):
        reg.backends()


def test_jax_platforms_is_honoured_when_pjrt_platforms_is_unset(make_registry, cpu2_config):
    """A jax user's environment says JAX_PLATFORMS=cpu: pjrt brings up only that, unless
    PJRT_PLATFORMS is set (even empty), which wins."""
    reg = make_registry({"JAX_PLATFORMS": "cpu2", ENV: cpu2_config})
    assert reg.platforms_variable() == "JAX_PLATFORMS"
    assert reg.selected_platforms() == ["cpu2"]
    assert set(reg.backends()) == {"cpu2"}
    with pytest.raises(RuntimeError, match="Unknown backend cpu: .* not in JAX_PLATFORMS"):
        reg.get_backend("cpu")
    both = make_registry({"JAX_PLATFORMS": "cpu2", "PJRT_PLATFORMS": "", ENV: cpu2_config})
    assert both.platforms_variable() == "PJRT_PLATFORMS"
    assert both.selected_platforms() is None


def test_get_compile_options_detailed_logging_keeps_the_users_override():
    """detailed_logging=False turns XLA's detailed logging off through DebugOptions, unless
    env_options_overrides sets it itself, whose value then wins (not both: XLA refuses that)."""
    from pjrt.registry import get_compile_options

    quiet = get_compile_options(1, 1, detailed_logging=False)
    assert quiet.executable_build_options.debug_options.xla_detailed_logging is False
    quiet.SerializeAsString()
    chosen = get_compile_options(1, 1, detailed_logging=False,
                                 env_options_overrides={"xla_detailed_logging": True})
    assert dict(chosen.env_option_overrides)["xla_detailed_logging"] is True
    chosen.SerializeAsString()  # set once: no conflict
