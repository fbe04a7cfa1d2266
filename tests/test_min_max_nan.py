"""Programs compiled by pjrt on the CPU compute min and max as jax's do: NaN propagates.

XLA's CPU compiler defaults to "fast" min/max (``xla_cpu_enable_fast_min_max``), where
``max(nan, 1)`` is 1; jaxlib compiles every program with it off. pjrt does the same unless the
caller sets the option, and a caller who sets it gets what they asked for. numpy
(``np.maximum``, ``np.max``) is the oracle: it propagates NaN as jax does.
"""
from __future__ import annotations

import numpy as np
import pytest

import pjrt

MIN_MAX = """
func.func @main(%x: tensor<32xf32>, %y: tensor<32xf32>)
    -> (tensor<32xf32>, tensor<32xf32>, tensor<f32>, tensor<f32>) {
  %max = stablehlo.maximum %x, %y : tensor<32xf32>
  %min = stablehlo.minimum %x, %y : tensor<32xf32>
  %low = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %high = stablehlo.constant dense<0x7F800000> : tensor<f32>
  %reduced_max = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [0]
      : (tensor<32xf32>, tensor<f32>) -> tensor<f32>
  %reduced_min = stablehlo.reduce(%x init: %high) applies stablehlo.minimum across dimensions = [0]
      : (tensor<32xf32>, tensor<f32>) -> tensor<f32>
  return %max, %min, %reduced_max, %reduced_min
      : tensor<32xf32>, tensor<32xf32>, tensor<f32>, tensor<f32>
}
"""

X = np.array([np.nan, 1, 2, np.nan, 5, -1, np.nan, 3] * 4, np.float32)
Y = np.array([1, np.nan, 2, 0, np.nan, -2, 7, 3] * 4, np.float32)


def run(client, options=None):
    compiled = pjrt.compile(MIN_MAX, client.devices()[0], options)
    return [np.asarray(value) for value in compiled(X, Y)]


def test_min_and_max_propagate_nan_as_numpy_and_jax_do(client):
    got = run(client)
    expected = [np.maximum(X, Y), np.minimum(X, Y), np.max(X), np.min(X)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    assert np.isnan(got[2]) and np.isnan(got[3])


def test_the_callers_choice_of_fast_min_max_wins_and_is_left_as_set(client):
    options = pjrt.CompileOptions()
    options.executable_build_options.debug_options.xla_cpu_enable_fast_min_max = True
    got = run(client, options)
    # Fast min/max returns the operand that is not NaN where only one is: XLA's own default.
    assert got[0][1] == 1.0 and got[1][4] == 5.0
    assert options.executable_build_options.debug_options.xla_cpu_enable_fast_min_max is True
    # The same through env_option_overrides, as jax sends per-jit compiler options.
    options = pjrt.CompileOptions()
    options.env_option_overrides = [("xla_cpu_enable_fast_min_max", True)]
    got = run(client, options)
    assert got[0][1] == 1.0


def test_the_callers_options_keep_the_option_unset(client):
    options = pjrt.CompileOptions()
    got = run(client, options)
    assert np.isnan(got[0][1])
    assert options.executable_build_options.debug_options.xla_cpu_enable_fast_min_max is None
    assert options.env_option_overrides == []


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
