"""JAX's pmap tests that test the backend registry, ported: ``tests/pmap_test.py`` of
jax-ml/jax at tag jax-v0.10.2 (commit 990e6a0b84138346e6a38785412f36356e0e5dc3).

Two of upstream's tests are about the registry rather than about pmap: that the default
order of ``jax.devices()`` is the order a program replicated over every device runs in, and
that it still is after ``clear_backends()`` (the devices of the new backend, not cached ones of
the old). The other tests need jax's tracing machinery (see docs/jaxlib-parity.md). Each test
keeps upstream's name and assertions. What differs:

* ``pmap(lambda x: x)`` is ``_pmap_identity``: the identity written as StableHLO text and
  compiled with ``replicated=True`` (one copy per device on its slice of the leading axis)
  for the devices jax's pmap takes when given none, the backend's default device assignment
  for that many replicas (``get_default_device_assignment(n)`` in jax,
  ``Client.default_device_assignment``, the plugin's, here);
* the result's ``.sharding`` is pjrt's ``PmapSharding``, whose ``_device_assignment`` is
  jax's;
* ``jax.devices()``, ``jax.device_count()`` and ``src_api.clear_backends()`` are pjrt's, on the
  default registry, brought up with 8 CPU devices for these tests (jax's CI runs them on 8,
  through ``--xla_force_host_platform_device_count``; pjrt-cpu reads
  ``PJRT_CPU_DEVICE_COUNT``): the backends are cleared before and after, so that other tests
  get the default registry as the environment makes it.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pjrt
import pjrt_cpu

_IDENTITY = """
func.func public @main(%x: tensor<i64>) -> tensor<i64> {
  return %x : tensor<i64>
}
"""


def _pmap_identity(x):
    """``pmap(lambda x: x)(x)`` over as many devices as ``x`` has rows."""
    backend = pjrt.get_backend()
    assignment = backend.default_device_assignment(len(x))
    devices = [backend.lookup_device(int(i)) for i in assignment[:, 0]]
    return pjrt.compile(_IDENTITY, devices, replicated=True)(x)


@pytest.fixture
def eight_devices(monkeypatch):
    """The default registry's backends, brought up again with 8 CPU devices."""
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "8")
    pjrt.clear_backends()
    assert pjrt.device_count() == 8
    yield
    pjrt.clear_backends()
    monkeypatch.undo()


@pytest.mark.usefixtures("eight_devices")
class TestPythonPmapTest:

    def testDefaultDeviceOrdering(self):
        # Users rely on the fact that the default order of jax.devices() matches
        # the default order of pmap for single-host jobs.
        device_order = pjrt.devices()
        pmap_sharding = _pmap_identity(np.arange(pjrt.device_count())).sharding
        assert device_order == list(pmap_sharding._device_assignment)

    def testDefaultDeviceOrderingAfterClearBackends(self):
        # Test that clear_backends() properly drops cached PyDevice objects in pmap
        # so that pointer-based __eq__ doesn't fail.
        # Execute pmap first to populate the cache
        _pmap_identity(np.arange(pjrt.device_count()))

        pjrt.clear_backends()
        gc.collect()
        device_order_after = pjrt.devices()

        pmap_sharding = _pmap_identity(np.arange(pjrt.device_count())).sharding
        assert device_order_after == list(pmap_sharding._device_assignment)
