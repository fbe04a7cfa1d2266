"""StableHLO programs generated for the stress tests: slow to run, slow to compile, deeply nested.

Each generator returns MLIR text; sizes are parameters so that a test can calibrate them to the
machine it runs on.
"""
from __future__ import annotations

#: A program of one elementwise step, ``tanh(a * b + 1)`` on two ``tensor<8xf32>``.
TINY = """
module @tiny {
  func.func public @main(%a: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<8xf32> {
    %0 = stablehlo.multiply %a, %b : tensor<8xf32>
    %one = stablehlo.constant dense<1.0> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %2 = stablehlo.add %0, %1 : tensor<8xf32>
    %3 = stablehlo.tanh %2 : tensor<8xf32>
    return %3 : tensor<8xf32>
  }
}
"""


def tiny_reference(a, b):
    import numpy as np

    return np.tanh(a * b + np.float32(1))


def while_program(iterations: int, size: int = 64) -> str:
    """``v <- sin(v) + v``, ``iterations`` times, on a ``tensor<size x f32>``: runs for a time
    proportional to ``iterations`` (the loop bound is a constant, so it cannot be skipped)."""
    t = f"tensor<{size}xf32>"
    return f"""
module @slow_loop {{
  func.func public @main(%x: {t}) -> {t} {{
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, {t}
    cond {{
      %limit = stablehlo.constant dense<{iterations}> : tensor<i32>
      %p = stablehlo.compare LT, %i, %limit, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    }} do {{
      %one = stablehlo.constant dense<1> : tensor<i32>
      %j = stablehlo.add %i, %one : tensor<i32>
      %s = stablehlo.sine %v : {t}
      %w = stablehlo.add %s, %v : {t}
      stablehlo.return %j, %w : tensor<i32>, {t}
    }}
    return %r#1 : {t}
  }}
}}
"""


def unrolled_program(length: int, size: int = 8) -> str:
    """A chain of ``length`` dependent elementwise ops: compile time grows faster than linearly
    with ``length`` (about 2 s at 2000 on a loaded 2-core machine)."""
    t = f"tensor<{size}xf32>"
    lines = [f"    %v0 = stablehlo.sine %x : {t}"]
    for i in range(1, length):
        op = "stablehlo.add" if i % 2 else "stablehlo.multiply"
        lines.append(f"    %v{i} = {op} %v{i - 1}, %x : {t}")
    body = "\n".join(lines)
    return f"""
module @unrolled {{
  func.func public @main(%x: {t}) -> {t} {{
{body}
    return %v{length - 1} : {t}
  }}
}}
"""


def nested_case_program(depth: int) -> str:
    """``depth`` ``stablehlo.case`` ops, each nested in branch 0 of the one around it; every
    level adds 1, so the result is ``x + depth``. XLA's compiler recurses once per level
    (a few KiB of stack each)."""
    t = "tensor<f32>"
    out = ["module @nested {",
           f"  func.func public @main(%x: {t}) -> {t} {{",
           "    %index = stablehlo.constant dense<0> : tensor<i32>",
           f"    %one = stablehlo.constant dense<1.0> : {t}"]
    for level in range(depth, 0, -1):
        out.append(f'    %r{level} = "stablehlo.case"(%index) ({{')
    out.append(f"    stablehlo.return %x : {t}")
    for level in range(1, depth + 1):
        out.append("    }, {")
        out.append(f"    stablehlo.return %one : {t}")
        out.append(f"    }}) : (tensor<i32>) -> {t}")
        out.append(f"    %o{level} = stablehlo.add %r{level}, %one : {t}")
        ret = "return" if level == depth else "stablehlo.return"
        out.append(f"    {ret} %o{level} : {t}")
    out += ["  }", "}"]
    return "\n".join(out)
