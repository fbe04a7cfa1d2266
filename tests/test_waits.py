"""Waiting on the plugin (waits.py): waits that return to Python between slices so that Ctrl-C
is heard, and compilation on a large-stack worker thread, on the real CPU plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from conftest import cpu_plugin_path, run_python
from fixtures import programs


def test_execution_is_asynchronous_and_reading_waits(client):
    """A long program: execute returns before its output is computed; np.asarray waits."""
    text = """
    func.func public @main(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
      %c0 = stablehlo.constant dense<0> : tensor<i32>
      %n = stablehlo.constant dense<200> : tensor<i32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %r:2 = stablehlo.while(%i = %c0, %acc = %x) : tensor<i32>, tensor<256x256xf32>
       cond {
        %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %p : tensor<i1>
      } do {
        %d = stablehlo.dot_general %acc, %x, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
        %s = stablehlo.tanh %d : tensor<256x256xf32>
        %j = stablehlo.add %i, %one : tensor<i32>
        stablehlo.return %j, %s : tensor<i32>, tensor<256x256xf32>
      }
      return %r#1 : tensor<256x256xf32>
    }"""
    executable = client.compile_and_load(text)
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
    (out,) = executable.execute([x])
    was_ready = out.is_ready()
    value = np.asarray(out)
    assert out.is_ready()
    assert value.shape == (256, 256) and np.isfinite(value).all()
    # 200 dependent 256^3 matmuls take far longer than launching them.
    assert not was_ready
