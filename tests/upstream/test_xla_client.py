"""jaxlib's own client tests, ported: ``jaxlib/xla_client_test.py`` at jax-ml/jax commit
4e644eeec3cee6e65e5ca4c6e67c8f1f19603dc5 (2025-04-24, the file's last version).

Each test keeps upstream's name and assertions. What differs:

* ``self.backend`` is the ``client`` fixture: a client of each CPU plugin, made through
  ``pjrt.xla_client`` (jaxlib's names);
* computations upstream builds with ``XlaBuilder`` are written here as the same StableHLO
  text (``_compile``), and ``execute_with_python_values`` is the helper of the same name below;
* the DLPack capsule is made with ``Array.__dlpack__`` and consumed with
  ``pjrt.from_dlpack`` (jaxlib: ``_xla.buffer_to_dlpack_managed_tensor`` and
  ``_xla.dlpack_managed_tensor_to_buffer``).

This file grows test by test towards the whole runtime part of upstream's suite; the methods
not ported yet are listed in docs/jaxlib-parity.md.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import pjrt
from pjrt import xla_client


def _compile(backend, program: str):
    return backend.compile(program)


def execute_with_python_values(executable, arguments, backend):
    """Upstream's helper: each argument placed on the executable's device, the outputs read."""
    device = executable.local_devices()[0]
    put = [backend.buffer_from_pyval(argument, device) for argument in arguments]
    return [np.asarray(output) for output in executable.execute(put)]


# f32 scalar -> f32 scalar: Add(Parameter(0), Constant(3.14)).
ADD_CONSTANT = """
func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = stablehlo.constant dense<3.140000e+00> : tensor<f32>
  %1 = stablehlo.add %arg0, %0 : tensor<f32>
  return %1 : tensor<f32>
}
"""

# s32 scalar parameter, returned.
S32_PARAMETER = """
func.func public @main(%arg0: tensor<i32>) -> tensor<i32> {
  return %arg0 : tensor<i32>
}
"""


@pytest.fixture
def backend(client):
    return client


class TestBufferTest:
    """Upstream's BufferTest, the runtime methods."""

    def testCannotCallWithDeletedBuffers(self, backend):
        compiled_c = _compile(backend, ADD_CONSTANT)
        arg = np.float32(1.11)
        arg_buffer = backend.buffer_from_pyval(arg)
        arg_buffer.delete()
        with pytest.raises(xla_client.XlaRuntimeError):
            compiled_c.execute([arg_buffer])

    def testXlaShapeIndex(self):
        a = xla_client.ShapeIndex((1, 2))
        b = xla_client.ShapeIndex((1, 2))
        c = xla_client.ShapeIndex((2, 3))
        assert a == b
        assert b != c

    def testBlockUntilReadyRaisesOnDeletedBuffer(self, backend):
        arg = np.array([[1., 2.]], np.float32)
        buffer = backend.buffer_from_pyval(arg)
        buffer.delete()
        with pytest.raises(RuntimeError, match=re.escape(
                "BlockHostUntilReady() called on deleted or donated buffer")):
            buffer.block_until_ready()


class TestEmbeddedComputationsTest:
    """Upstream's EmbeddedComputationsTest, the runtime methods."""

    def testInvokeWithWrongElementType(self, backend):
        f32_scalar_2 = np.float32(2)

        def TestFun():
            return execute_with_python_values(_compile(backend, S32_PARAMETER),
                                              [f32_scalar_2], backend)

        with pytest.raises(RuntimeError, match=r"Invalid argument: Argument does not match.*"
                                               r"want s32\[\], got f32\[\].*"):
            TestFun()


class TestDLPackTest:
    """Upstream's DLPackTest, the runtime methods."""

    def testTensorsCanBeConsumedOnceOnly(self, backend):
        x = np.array(np.random.rand(3, 4, 5, 6), dtype=np.float32)
        buffer = backend.buffer_from_pyval(x)
        dlt = buffer.__dlpack__()

        def ConsumeDLPackTensor():
            _ = pjrt.from_dlpack(dlt, backend.local_devices()[0])

        ConsumeDLPackTensor()
        with pytest.raises(RuntimeError, match=".*a DLPack tensor may be consumed at most once.*"):
            ConsumeDLPackTensor()
