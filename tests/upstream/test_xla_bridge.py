"""JAX's registry tests, ported: ``tests/xla_bridge_test.py`` of jax-ml/jax at tag jax-v0.10.2.

Each test keeps upstream's name and assertions. What differs:

* ``xb`` (``jax._src.xla_bridge``, a module of globals) is a fresh
  ``pjrt.registry.BackendRegistry`` per test, with no plugin discovery, so that a test's
  factories are the only ones (upstream swaps ``xb._backend_factories`` for ``{}``); the
  plugin-registration tests take a fresh registry that discovers, on its own environment
  (upstream sets ``os.environ``), and ``xb.register_pjrt_plugin_factories_from_env()`` is
  that registry's discovery, which reads ``PJRT_NAMES_AND_LIBRARY_PATHS``
  (``xb.registrations()``);
* ``xb._backend_factories`` is ``xb.registrations()`` and ``xb._backends`` is
  ``xb.backends()``;
* ``config.jax_platforms(...)`` is ``xb.set_platforms(...)``;
* ``self.assertLogs("jax._src.xla_bridge", ...)`` reads the ``pjrt.registry`` logger (and
  ``assertLogs(level="WARNING")`` the ``pjrt`` loggers' warnings);
* ``compiler.get_compile_options`` is ``pjrt.registry.get_compile_options``; jax's flag
  ``config.jax_xla_profile_version(v)`` is its argument ``profile_version=v``, and
  ``mock.patch.object(compiler, "get_latest_profile_version", ...)`` replaces
  ``pjrt.registry.get_latest_profile_version`` (the same hook) with ``monkeypatch``;
* the plugin libraries upstream mocks (``load_pjrt_plugin_dynamically``,
  ``make_c_api_client``) are real: XLA's CPU plugin (``cpu_plugin``, each build) and copies of
  the fault plugin (tests/fault_plugin), which reports the create options its client
  received; ``mock_make.assert_called_once_with("name1", options, None)`` becomes: one client
  was created, of the plugin registered as ``name1``, and the plugin received ``options``;
* ``test_num_cpu_devices_update``: pjrt has no ``jax_num_cpu_devices`` setting (pjrt-cpu reads
  ``PJRT_CPU_DEVICE_COUNT`` when it makes a client); the registry's setting that must be made
  before the backends come up is ``set_platforms``, which keeps jax's rule (the same value may
  be set again, another is refused) and its words ("... should be called before backends are
  initialized").
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil

import pytest

import pjrt
from pjrt import registry as registry_module
from pjrt.client import create_client
from pjrt.plugin import PluginTable

ENV = "PJRT_NAMES_AND_LIBRARY_PATHS"
HEADER_MAJOR, HEADER_MINOR = pjrt.PJRT_C_API_VERSION
_FAULT_NORMAL = 1  # FAULT_MODE_NORMAL in tests/fault_plugin/fault_plugin.c


class _DummyBackend:

    def __init__(self, platform, device_count):
        self.platform = platform
        self._device_count = device_count

    def device_count(self):
        return self._device_count

    def process_index(self):
        return 0

    def devices(self):
        return []

    def local_devices(self):
        return []

    def _get_all_devices(self):
        return self.devices()


def _register_factory(xb, platform: str, priority, device_count=1,
                      assert_used_at_most_once=False, experimental=False):
    used = []

    def factory():
        if assert_used_at_most_once:
            assert not used, f"Backend factory for {platform} was called more than once"
            used.append(True)
        return _DummyBackend(platform, device_count)

    xb.register_backend_factory(platform, factory, priority=priority,
                                fail_quietly=False, experimental=experimental)


@pytest.fixture
def xb():
    """upstream's GetBackendTest.setUp: a registry of its own, with a CPU factory."""
    xb = registry_module.BackendRegistry(PluginTable(), environ={}, discover=False)
    # get_backend logic assumes CPU platform is always present.
    _register_factory(xb, "cpu", 0)
    return xb


class _FaultCopy:
    """A private copy of the fault plugin, configured before any registry loads it: a real
    PJRT plugin that records the create options of the client it last made."""

    def __init__(self, built, directory, tag: str):
        self.path = str(directory / f"libfault_{tag}.so")
        shutil.copyfile(built.fault_plugin, self.path)
        self.lib = ctypes.CDLL(self.path, mode=os.RTLD_LOCAL)
        self.lib.fault_configure(HEADER_MAJOR, HEADER_MINOR, ctypes.c_size_t(0), _FAULT_NORMAL)
        self.lib.fault_last_create_options.restype = ctypes.c_char_p
        self.lib.fault_client_create_calls.restype = ctypes.c_long

    @property
    def last_create_options(self) -> str:
        return self.lib.fault_last_create_options().decode()

    @property
    def client_create_calls(self) -> int:
        return self.lib.fault_client_create_calls()


@pytest.fixture
def fault_copy(built, tmp_path):
    """``fault_copy(tag)``: a configured copy of the fault plugin (see `_FaultCopy`)."""
    return lambda tag: _FaultCopy(built, tmp_path, tag)


@pytest.fixture
def discovering_xb():
    """``discovering_xb(environ)``: a fresh registry that discovers plugins, on ``environ``;
    the clients it made are closed afterwards."""
    made = []

    def make(environ):
        xb = registry_module.BackendRegistry(PluginTable(), environ=environ)
        made.append(xb)
        return xb

    yield make
    for xb in made:
        if xb.backends_are_initialized():
            for backend in xb.backends().values():
                backend.close()
        xb.clear_backends()


def _options_received(fault: _FaultCopy, options: dict) -> str:
    """How the fault plugin writes ``options`` when a client is created with them."""
    def text(value):
        if isinstance(value, bool):
            return f"bool:{int(value)}"
        if isinstance(value, int):
            return f"int:{value}"
        if isinstance(value, float):
            return f"float:{value:g}"
        if isinstance(value, list):
            return "list:" + ",".join(str(v) for v in value)
        return f"str:{value}"
    return ";".join(f"{key}={text(value)}" for key, value in options.items())


class TestXlaBridgeTest:
    """Upstream's XlaBridgeTest, on the default registry (as upstream's runs on jax's) but for
    the plugin-registration tests, which take registries of their own."""

    def test_set_device_assignment_no_partition(self):
        compile_options = registry_module.get_compile_options(
            num_replicas=4, num_partitions=1, device_assignment=[0, 1, 2, 3])
        assert compile_options.device_assignment.replica_count() == 4
        assert compile_options.device_assignment.computation_count() == 1

    def test_set_device_assignment_with_partition(self):
        compile_options = registry_module.get_compile_options(
            num_replicas=2, num_partitions=2, device_assignment=[[0, 1], [2, 3]])
        assert compile_options.device_assignment.replica_count() == 2
        assert compile_options.device_assignment.computation_count() == 2

    def test_set_fdo_profile(self):
        compile_options = registry_module.get_compile_options(
            num_replicas=1, num_partitions=1, fdo_profile=b"test_profile"
        )
        assert compile_options.executable_build_options.fdo_profile == b"test_profile"

    def test_autofdo_profile(self, monkeypatch):

        class _DummyBackend:
            platform: str = "tpu"

        # --jax_xla_profile_version takes precedence.
        jax_flag_profile = 1
        another_profile = 2
        with monkeypatch.context() as patch:
            patch.setattr(registry_module, "get_latest_profile_version",
                          lambda _: another_profile)
            assert registry_module.get_compile_options(
                num_replicas=3, num_partitions=4, backend=_DummyBackend(),
                profile_version=jax_flag_profile,
            ).profile_version == jax_flag_profile

        # Use whatever non-zero value the function get_latest_profile_version
        # returns if --jax_xla_profile_version is not set.
        profile_version = 1
        with monkeypatch.context() as patch:
            patch.setattr(registry_module, "get_latest_profile_version",
                          lambda _: profile_version)
            assert registry_module.get_compile_options(
                num_replicas=3, num_partitions=4, backend=_DummyBackend(),
            ).profile_version == profile_version

        # If the function returns 0, something is wrong, so expect that we set
        # profile_version to -1 instead to ensure that no attempt is made to
        # retrieve the latest profile later.
        error_return = 0
        no_profile_dont_retrieve = -1
        with monkeypatch.context() as patch:
            patch.setattr(registry_module, "get_latest_profile_version",
                          lambda _: error_return)
            assert registry_module.get_compile_options(
                num_replicas=3, num_partitions=4, backend=_DummyBackend(),
            ).profile_version == no_profile_dont_retrieve

    def test_deterministic_serialization(self):
        c1 = registry_module.get_compile_options(
            num_replicas=2,
            num_partitions=3,
            env_options_overrides={"1": "1", "2": "2"},
        )
        c2 = registry_module.get_compile_options(
            num_replicas=2,
            num_partitions=3,
            env_options_overrides={"2": "2", "1": "1"},  # order changed
        )
        c1str = c1.SerializeAsString()

        # Idempotence.
        assert c1str == c1.SerializeAsString()
        # Map order does not matter.
        assert c1str == c2.SerializeAsString()

    def test_local_devices(self):
        assert registry_module.local_devices()  # (assertNotEmpty)
        with pytest.raises(ValueError, match="Unknown process_index 100"):
            registry_module.local_devices(100)
        with pytest.raises(RuntimeError, match="Unknown backend foo"):
            registry_module.local_devices(backend="foo")

    def test_register_plugin(self, discovering_xb, fault_copy, cpu_plugin, caplog):
        name1 = fault_copy("name1")
        path1, path2 = name1.path, cpu_plugin.library_path
        with caplog.at_level(logging.WARNING, logger="pjrt"):
            xb = discovering_xb({ENV: f"name1:{path1},name2:{path2},name3"})
            xb.registrations()
        registration = xb.registrations()["name1"]
        client = registration.factory()

        log_output = [record.getMessage() for record in caplog.records
                      if record.levelno >= logging.WARNING]
        assert re.search(
            rf"invalid value name3 in env var PJRT_NAMES_AND_LIBRARY_PATHS"
            rf" name1.{re.escape(path1)},name2.{re.escape(path2)},name3",
            log_output[0])
        assert "name1" in xb.registrations()
        assert "name2" in xb.registrations()
        assert registration.priority == 400
        assert registration.experimental

        options = {}
        # (mock_make.assert_called_once_with("name1", options, None))
        assert name1.client_create_calls == 1
        assert client.plugin is registration.plugin and client.plugin.name == "name1"
        assert name1.last_create_options == _options_received(name1, options)
        client.close()

    def test_register_plugin_with_config(self, discovering_xb, fault_copy, tmp_path):
        name1 = fault_copy("config")
        # Upstream's testdata/example_pjrt_plugin_config.json, naming a real library.
        test_json_file_path = tmp_path / "example_pjrt_plugin_config.json"
        test_json_file_path.write_text(json.dumps({
            "library_path": name1.path,
            "create_options": {
                "int_option": 64,
                "int_list_option": [32, 64],
                "string_option": "string",
                "float_option": 1.0,
            },
        }))
        xb = discovering_xb({ENV: f"name1:{test_json_file_path}"})
        xb.registrations()
        registration = xb.registrations()["name1"]
        client = registration.factory()

        assert "name1" in xb.registrations()
        assert registration.priority == 400
        assert registration.experimental

        # The expectation is specified in example_pjrt_plugin_config.json.
        options = {
            "int_option": 64,
            "int_list_option": [32, 64],
            "string_option": "string",
            "float_option": 1.0,
            }

        assert name1.client_create_calls == 1
        assert name1.last_create_options == _options_received(name1, options)
        client.close()

    def test_register_plugin_with_lazy_config(self, fault_copy):
        options = {"bar": "baz"}

        def getopts():
            return options

        foo = fault_copy("lazy")
        xb = registry_module.BackendRegistry(PluginTable(), environ={}, discover=False)
        xb.register_plugin("foo", options=getopts, library_path=foo.path)
        client = xb.registrations()["foo"].factory()
        # (make_c_api_client received every option getopts() returned)
        received = dict(item.split("=", 1) for item in foo.last_create_options.split(";"))
        for k in options:
            assert received[k] == f"str:{options[k]}"
        assert foo.client_create_calls == 1  # (mock_make.assert_called_once())
        client.close()

    def test_num_cpu_devices_update(self):
        registry_module.devices()

        current_val = registry_module.default_registry.selected_platforms()

        registry_module.set_platforms(current_val)

        with pytest.raises(
            RuntimeError,
            match=re.escape("set_platforms() should be called before backends are"
                            " initialized"),
        ):
            registry_module.set_platforms([*(current_val or ["cpu"]), "platform_B"])


class TestGetBackendTest:

    def test_default(self, xb):
        _register_factory(xb, "platform_A", 20)
        _register_factory(xb, "platform_B", 10)

        backend = xb.get_backend()
        assert backend.platform == "platform_A"
        # All backends initialized.
        assert len(xb.backends()) == len(xb.registrations())

    def test_specific_platform(self, xb):
        _register_factory(xb, "platform_A", 20)
        _register_factory(xb, "platform_B", 10)

        backend = xb.get_backend("platform_B")
        assert backend.platform == "platform_B"
        # All backends initialized.
        assert len(xb.backends()) == len(xb.registrations())

    def test_unknown_backend_error(self, xb):
        with pytest.raises(RuntimeError, match="Unknown backend foo"):
            xb.get_backend("foo")

    def test_backend_init_error(self, xb):
        def factory():
            raise RuntimeError("I'm not a real backend")

        xb.register_backend_factory("error", factory, priority=10, fail_quietly=False)

        with pytest.raises(RuntimeError,
                           match="Unable to initialize backend 'error': I'm not a real backend"):
            xb.get_backend("error")

    def test_no_devices(self, xb):
        _register_factory(xb, "no_devices", -10, device_count=0)
        with pytest.raises(RuntimeError, match="Unable to initialize backend 'no_devices': "
                                               "Backend 'no_devices' provides no devices."):
            xb.get_backend("no_devices")

    def test_factory_returns_none(self, xb):
        xb.register_backend_factory("none", lambda: None, priority=10, fail_quietly=False)
        with pytest.raises(RuntimeError, match="Unable to initialize backend 'none': "
                                               "Could not initialize backend 'none'"):
            xb.get_backend("none")

    def test_jax_platforms_flag(self, xb):
        _register_factory(xb, "platform_A", 20, assert_used_at_most_once=True)
        _register_factory(xb, "platform_B", 10, assert_used_at_most_once=True)

        xb.set_platforms("cpu,platform_A")
        backend = xb.get_backend()
        assert backend.platform == "cpu"
        # Only specified backends initialized.
        assert len(xb.backends()) == 2

        backend = xb.get_backend("platform_A")
        assert backend.platform == "platform_A"

        with pytest.raises(RuntimeError, match="Unknown backend platform_B"):
            backend = xb.get_backend("platform_B")

    def test_experimental_warning(self, xb, caplog):
        _register_factory(xb, "platform_A", 20, experimental=True)

        with caplog.at_level(logging.WARNING, logger="pjrt.registry"):
            _ = xb.get_backend()
        assert any(
            record.name == "pjrt.registry" and record.levelname == "WARNING"
            and "Platform 'platform_A' is experimental and not all JAX functionality may be "
                "correctly supported!" in record.getMessage()
            for record in caplog.records)
