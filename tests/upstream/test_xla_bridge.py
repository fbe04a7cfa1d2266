"""JAX's registry tests, ported: ``tests/xla_bridge_test.py`` of jax-ml/jax at tag jax-v0.10.2.

Each test keeps upstream's name and assertions. What differs:

* ``xb`` (``jax._src.xla_bridge``, a module of globals) is a fresh
  ``pjrt.registry.BackendRegistry`` per test, with no plugin discovery, so that a test's
  factories are the only ones (upstream swaps ``xb._backend_factories`` for ``{}``);
* ``xb._backend_factories`` is ``xb.registrations()`` and ``xb._backends`` is
  ``xb.backends()``;
* ``config.jax_platforms(...)`` is ``xb.set_platforms(...)``;
* ``self.assertLogs("jax._src.xla_bridge", ...)`` reads the ``pjrt.registry`` logger.

The tests of upstream's ``XlaBridgeTest`` that are not here yet (compile options, FDO
profiles, plugin registration from the environment, ``jax_num_cpu_devices``) are listed in
docs/jaxlib-parity.md.
"""
from __future__ import annotations

import logging

import pytest

from pjrt import registry as registry_module
from pjrt.plugin import PluginTable


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


class TestXlaBridgeTest:
    """Upstream's XlaBridgeTest, on the default registry (as upstream's runs on jax's)."""

    def test_local_devices(self):
        assert registry_module.local_devices()  # (assertNotEmpty)
        with pytest.raises(ValueError, match="Unknown process_index 100"):
            registry_module.local_devices(100)
        with pytest.raises(RuntimeError, match="Unknown backend foo"):
            registry_module.local_devices(backend="foo")


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
