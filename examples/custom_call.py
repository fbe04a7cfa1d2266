"""Call Python from a compiled program: a custom-call target registered with the plugin.

    python examples/custom_call.py

The program calls ``stablehlo.custom_call @example_softplus``; pjrt registers the Python
function below with the CPU plugin's FFI extension, which calls it with numpy views of the
operand and result buffers and the call's attributes.
"""
import numpy as np

import pjrt

PROGRAM = """
func.func public @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.custom_call @example_softplus(%x) {api_version = 4 : i32,
      backend_config = {beta = 2.0 : f32}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.add %0, %0 : tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}
"""


def softplus(operands, results, attributes):
    """softplus(x) = log(1 + exp(beta x)) / beta, written into the result buffer."""
    (x,), (out,), beta = operands, results, attributes["beta"]
    out[...] = np.log1p(np.exp(beta * x)) / beta


def main() -> None:
    pjrt.register_custom_call_target("example_softplus", softplus, platform="cpu")
    f = pjrt.compile(PROGRAM, pjrt.devices()[0])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    result = np.asarray(f(x))
    expected = 2 * np.log1p(np.exp(2 * x)) / 2
    print("result:", np.array2string(result, precision=4))
    print("matches numpy:", bool(np.allclose(result, expected, rtol=1e-6)))


if __name__ == "__main__":
    main()
