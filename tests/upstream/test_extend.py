"""JAX's ``jax.extend`` test of the backend registry's names, ported: ``tests/extend_test.py``
of jax-ml/jax at tag jax-v0.10.2 (commit 990e6a0b84138346e6a38785412f36356e0e5dc3).

Upstream's ``ExtendTest.test_symbols`` checks that ``jax.extend``'s modules hand out the very
functions of jax's internals. Its backend part is the registry's: ``jax.extend.backend`` is
pjrt's package face (``pjrt``), the names programs use, and ``xla_bridge`` (with
``api.clear_backends``) is ``pjrt.registry``, where the functions live. Kept: the three
names the face exports (``backends``, ``clear_backends``, ``get_backend``). Left out, and
listed in docs/jaxlib-parity.md: ``backend_xla_version`` and ``register_backend_factory``,
which pjrt keeps in ``pjrt.registry`` alone (the one module they live in, so there is no
second name to compare), and the ``random``, ``core`` and ``linear_util`` names, which are
jax's tracing machinery. The other tests of the file (custom PRNG implementations, MLIR
lowering rules, HloSharding protos through ``jax.extend.sharding``) are not about the
registry.
"""
from __future__ import annotations

import pjrt
from pjrt import registry as xla_bridge


class TestExtendTest:

    def test_symbols(self):
        # Assume these are tested elsewhere, only check equivalence
        assert pjrt.backends is xla_bridge.backends
        assert pjrt.clear_backends is xla_bridge.clear_backends
        assert pjrt.get_backend is xla_bridge.get_backend
