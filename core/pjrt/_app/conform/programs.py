"""The StableHLO programs the conformance checks compile, written by hand as text.

Each module is named ``@conform_<check>`` so that the name of a compiled executable says which
check made it. The SPMD programs follow the form jax 0.10.2 lowers sharded functions to
(``tests/fixtures/spmd_*``), with the mesh sized to the devices at hand.
"""
from __future__ import annotations

ELEMENTWISE = """
module @conform_elementwise {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.multiply %a, %b : tensor<2x3xf32>
    %1 = stablehlo.tanh %0 : tensor<2x3xf32>
    %c = stablehlo.constant dense<1.000000e+00> : tensor<2x3xf32>
    %2 = stablehlo.add %1, %c : tensor<2x3xf32>
    %3 = stablehlo.subtract %2, %b : tensor<2x3xf32>
    return %3 : tensor<2x3xf32>
  }
}
"""

REDUCE = """
module @conform_reduce {
  func.func public @main(%x: tensor<4x5xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x5xf32>, tensor<f32>) -> tensor<4xf32>
    %low = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %1 = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [0] : (tensor<4x5xf32>, tensor<f32>) -> tensor<5xf32>
    return %0, %1 : tensor<4xf32>, tensor<5xf32>
  }
}
"""

WHILE_LOOP = """
module @conform_while_loop {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %start = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %start, %acc = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %n = stablehlo.constant dense<10> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      %half = stablehlo.constant dense<5.000000e-01> : tensor<4xf32>
      %a = stablehlo.multiply %acc, %half : tensor<4xf32>
      %f = stablehlo.convert %i : (tensor<i32>) -> tensor<f32>
      %fb = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<4xf32>
      %s = stablehlo.add %a, %fb : tensor<4xf32>
      stablehlo.return %next, %s : tensor<i32>, tensor<4xf32>
    }
    return %r#1 : tensor<4xf32>
  }
}
"""

SORT = """
module @conform_sort {
  func.func public @main(%x: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xi32>) {
    %idx = stablehlo.iota dim = 0 : tensor<16xi32>
    %0:2 = "stablehlo.sort"(%x, %idx) <{dimension = 0 : i64, is_stable = true}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
      %lt = stablehlo.compare LT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    }) : (tensor<16xf32>, tensor<16xi32>) -> (tensor<16xf32>, tensor<16xi32>)
    return %0#0, %0#1 : tensor<16xf32>, tensor<16xi32>
  }
}
"""

MULTI_OUTPUT = """
module @conform_multi_output {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<3xi32>) -> (tensor<3xf32>, tensor<3xi32>, tensor<3xi1>, tensor<f32>) {
    %0 = stablehlo.add %x, %x : tensor<3xf32>
    %1 = stablehlo.multiply %y, %y : tensor<3xi32>
    %yf = stablehlo.convert %y : (tensor<3xi32>) -> tensor<3xf32>
    %2 = stablehlo.compare GT, %x, %yf, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %3 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
    return %0, %1, %2, %3 : tensor<3xf32>, tensor<3xi32>, tensor<3xi1>, tensor<f32>
  }
}
"""

DONATION = """
module @conform_donation {
  func.func public @main(%x: tensor<8xf32> {tf.aliasing_output = 0 : i32}) -> tensor<8xf32> {
    %one = stablehlo.constant dense<1.000000e+00> : tensor<8xf32>
    %0 = stablehlo.add %x, %one : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""


def renamed(program: str, name: str) -> str:
    """``program`` as module ``@name``: each check compiles a module of its own name, so
    that the executable it makes (and a fault a plugin has in it) names the check."""
    head, _, rest = program.partition("module @")
    return f"{head}module @{name}{rest[rest.index(' '):]}"


#: Not StableHLO at all.
NOT_A_PROGRAM = "this is not a StableHLO program {"

#: Well-formed MLIR that does not verify: an add of mismatched shapes.
ILL_TYPED = """
module @conform_ill_typed {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<4xf32>) -> tensor<3xf32> {
    %0 = stablehlo.add %x, %y : (tensor<3xf32>, tensor<4xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""


def custom_call(target: str) -> str:
    """A program calling the FFI handler ``target`` on a 2x3 f32 with two attributes."""
    return f"""
module @conform_ffi_custom_call {{
  func.func public @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {{
    %0 = stablehlo.custom_call @{target}(%x) {{api_version = 4 : i32,
        backend_config = {{scale = 2.0 : f32, offset = 1 : i64}}}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }}
}}
"""


def all_reduce(replicas: int) -> str:
    """A program summing a 4-vector across ``replicas`` replicas."""
    group = ", ".join(str(i) for i in range(replicas))
    return f"""
module @conform_all_reduce attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = {replicas} : i32}} {{
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
    %0 = "stablehlo.all_reduce"(%x) <{{replica_groups = dense<[[{group}]]> : tensor<1x{replicas}xi64>}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }}) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }}
}}
"""


def _spmd(name: str, partitions: int, header: str, sharded: str, replicated: str) -> str:
    rows = 2 * partitions
    return f"""
module @{name} attributes {{mhlo.num_partitions = {partitions} : i32, mhlo.num_replicas = 1 : i32}} {{{header}
  func.func public @main(%arg0: tensor<{rows}x4xf32> {{{sharded}}}) -> (tensor<{rows}x4xf32> {{jax.result_info = "result[0]", {sharded}}}, tensor<4xf32> {{jax.result_info = "result[1]", {replicated}}}) {{
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<{rows}x4xf32>
    %1 = stablehlo.multiply %arg0, %0 : tensor<{rows}x4xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<{rows}x4xf32>
    %3 = stablehlo.add %1, %2 : tensor<{rows}x4xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %4 = stablehlo.reduce(%arg0 init: %cst_1) applies stablehlo.add across dimensions = [0] : (tensor<{rows}x4xf32>, tensor<f32>) -> tensor<4xf32>
    return %3, %4 : tensor<{rows}x4xf32>, tensor<4xf32>
  }}
}}
"""


def spmd_shardy(partitions: int) -> str:
    """``(2*x + 1, x.sum(0))`` with x row-sharded over a 1-D Shardy mesh of ``partitions``."""
    header = (f'\n  sdy.mesh @mesh = <["x"={partitions}]> {{stablehlo.mesh = {{axes = '
              f'[{{name = "x", size = {partitions} : i64}}]}}}}')
    return _spmd("conform_spmd_shardy", partitions, header,
                 'sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>',
                 "sdy.sharding = #sdy.sharding<@mesh, [{}]>")


def spmd_gspmd(partitions: int) -> str:
    """The same program with GSPMD ``mhlo.sharding`` annotations."""
    return _spmd("conform_spmd_gspmd", partitions, "",
                 f'mhlo.sharding = "{{devices=[{partitions},1]<=[{partitions}]}}"',
                 'mhlo.sharding = "{replicated}"')
