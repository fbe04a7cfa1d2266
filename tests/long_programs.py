"""A StableHLO program that runs for a while, for the tests of waits and of reads of values still
being computed."""
from __future__ import annotations


def matmul_loop(iterations: int, *, then: str = "",
                returns: str = "%r#1 : tensor<256x256xf32>") -> str:
    """``iterations`` dependent 256 x 256 matmuls, ``acc <- tanh(acc . x)`` from ``acc = x``.

    The loop bound is a constant, so XLA cannot skip the work, and XLA's CPU plugin runs a
    program this costly asynchronously: execute returns at once and the wait is in pjrt. The
    loop leaves its counter (``tensor<i32>``) in ``%r#0`` and the matrix in ``%r#1``; ``then``
    is more operations after it, and ``returns`` is what the program returns, written as
    ``values : types`` (the types are also the signature's results).
    """
    result_types = returns.split(" : ", 1)[1]
    return f"""
    func.func public @main(%x: tensor<256x256xf32>) -> ({result_types}) {{
      %c0 = stablehlo.constant dense<0> : tensor<i32>
      %n = stablehlo.constant dense<{iterations}> : tensor<i32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %r:2 = stablehlo.while(%i = %c0, %acc = %x) : tensor<i32>, tensor<256x256xf32>
       cond {{
        %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %p : tensor<i1>
      }} do {{
        %d = stablehlo.dot_general %acc, %x, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
        %s = stablehlo.tanh %d : tensor<256x256xf32>
        %j = stablehlo.add %i, %one : tensor<i32>
        stablehlo.return %j, %s : tensor<i32>, tensor<256x256xf32>
      }}
      {then}
      return {returns}
    }}"""
