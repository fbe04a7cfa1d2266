"""JAX's API tests that test the backend registry, ported: ``tests/api_test.py`` of
jax-ml/jax at tag jax-v0.10.2 (commit 990e6a0b84138346e6a38785412f36356e0e5dc3).

Of upstream's 8245 lines, these tests are about the registry rather than about tracing; the
others, and the registry-adjacent ones that need jax's tracing machinery, are listed in
docs/jaxlib-parity.md with the reason each is not here. Each test keeps upstream's name and
assertions. What differs:

* ``jax.local_devices`` / ``jax.default_backend`` / ``jax.devices`` are ``pjrt``'s, on the
  default registry as upstream's on jax's;
* ``test_num_cpu_devices_called_after_initialization``: pjrt has no ``jax_num_cpu_devices``
  setting (pjrt-cpu reads ``PJRT_CPU_DEVICE_COUNT`` when it makes a client); the registry's
  setting that must be made before the backends come up is ``pjrt.set_platforms``, which
  keeps jax's words ("... should be called before backends are initialized");
* ``test_no_backend_warning_on_cpu_if_platform_specified``: ``jax.config.update(
  'jax_platform_name', 'cpu')`` is ``pjrt.set_platforms('cpu')`` and ``jax.numpy.arange(10)``
  is a program compiled and run; jax's warning ("An NVIDIA GPU may be present on this machine,
  ...") is pjrt's, which starts with the same words. Upstream's child runs on a machine
  without an NVIDIA GPU, where the warning can never appear; the child here makes the
  registry see an NVIDIA device node (a file standing for ``/dev/nvidia0``), so the test fails
  if choosing the platform does not silence the warning.
"""
from __future__ import annotations

import re
import subprocess
import sys
import unittest

import pytest

import pjrt

from conftest import child_env


class TestAPITest:

    def test_default_backend(self):
        first_local_device = pjrt.local_devices()[0]
        assert first_local_device.platform == pjrt.default_backend()

    def test_num_cpu_devices_called_after_initialization(self):
        pjrt.devices()
        with pytest.raises(
                RuntimeError,
                match=re.escape("set_platforms() should be called before backends are "
                                "initialized")):
            pjrt.set_platforms(["cpu", "platform_B"])


_WARNING_NOT_EXPECTED = """
import sys
from pjrt import registry
registry._NVIDIA_DEVICE_NODES = (sys.argv[1],)  # an NVIDIA GPU seems to be here
import pjrt
pjrt.set_platforms('cpu')
pjrt.compile('''func.func public @main() -> tensor<10xi32> {
  %0 = stablehlo.iota dim = 0 : tensor<10xi32>
  return %0 : tensor<10xi32>
}''')()
"""


class TestBackendsTest:

    @unittest.skipIf(not sys.executable, "test requires sys.executable")
    def test_no_backend_warning_on_cpu_if_platform_specified(self, tmp_path):
        node = tmp_path / "nvidia0"
        node.touch()
        warning_not_expected = _WARNING_NOT_EXPECTED

        result = subprocess.run([sys.executable, '-c', warning_not_expected, str(node)],
                                check=True, capture_output=True,
                                env=child_env(drop=("PJRT_PLATFORMS",)))
        assert "may be present" not in result.stderr.decode()
