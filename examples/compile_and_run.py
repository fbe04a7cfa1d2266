"""Compile a StableHLO program and run it on one device.

    python examples/compile_and_run.py
"""
import numpy as np

import pjrt

PROGRAM = """
func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %a, %b : tensor<4xf32>
  %1 = stablehlo.add %0, %a : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


def main() -> None:
    device = pjrt.devices()[0]
    f = pjrt.compile(PROGRAM, device)            # a callable taking numpy arrays or Arrays
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    result = np.asarray(f(a, b))
    print("a * b + a =", result.tolist())
    print("matches numpy:", bool(np.array_equal(result, a * b + a)))

    # The same through the client: an executable, its signature, and execute() on Arrays.
    client = pjrt.get_backend()
    executable = client.compile_and_load(PROGRAM, [device])
    print("inputs:", executable.input_shapes, "outputs:", executable.output_shapes)
    x = client.buffer_from_pyval(a, device)
    (y,) = executable.execute([x, x])            # asynchronous; reading y waits for it
    print("a * a + a =", np.asarray(y).tolist())


if __name__ == "__main__":
    main()
