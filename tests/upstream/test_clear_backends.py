"""JAX's clear_backends test, ported: ``tests/clear_backends_test.py`` of jax-ml/jax at tag
jax-v0.10.2 (commit 990e6a0b84138346e6a38785412f36356e0e5dc3).

The test keeps upstream's name and assertions. What differs:

* ``jax.jit(lambda x, y: x * y)`` is ``pjrt.compile`` of the same computation written as
  StableHLO text, on int64 scalars so that Python ints call it as written (jax traces them
  as int32); the compiled program belongs to the backend it was compiled on, and keeps
  working on it after ``clear_backends`` (which, as in jax, closes nothing), where jax's
  jitted function compiles again for the new backend;
* ``self.assertEqual(g(1, 2), 2)`` reads the result with ``np.asarray`` first: jax's
  ``Array`` compares to a number elementwise, pjrt's ``Array`` does not;
* ``xb.get_backend()`` is ``pjrt.registry.get_backend()`` and ``api.clear_backends()`` is
  ``pjrt.registry.clear_backends()``, on the default registry as upstream's on jax's.
"""
from __future__ import annotations

import numpy as np

import pjrt
from pjrt import registry as xb

# lambda x, y: x * y
_MULTIPLY = """
func.func public @main(%x: tensor<i64>, %y: tensor<i64>) -> tensor<i64> {
  %0 = stablehlo.multiply %x, %y : tensor<i64>
  return %0 : tensor<i64>
}
"""


class TestClearBackendsTest:

    def test_clear_backends(self):
        g = pjrt.compile(_MULTIPLY)
        assert np.asarray(g(1, 2)) == 2
        assert xb.get_backend().live_executables()  # (assertNotEmpty)
        xb.clear_backends()
        assert not xb.get_backend().live_executables()  # (assertEmpty)
        assert np.asarray(g(1, 2)) == 2
