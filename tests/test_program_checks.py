"""Damage pjrt can see before the plugin's compiler does: sharding annotations that do not fit
the devices, recursive calls, out-of-range client options, MLIR bytecode and jax exports whose
structure is out of bounds. Each of these ended the process inside the plugin (a check
failure, SIGFPE, a stack overflow, SIGABRT) before pjrt checked it; the risky compiles run in a
child process, which must survive them all and report each error.
"""
from __future__ import annotations

import json
import re
import signal
import struct

import numpy as np
import pytest

import pjrt
from pjrt._wire import mlir_bytecode
from pjrt._compile import program_checks
from pjrt.exported import deserialize_exported

from conftest import TESTS_DIR, run_python

FIXTURES = TESTS_DIR / "fixtures"
SPMD = (FIXTURES / "spmd_elementwise_2d.gspmd.mlir").read_text()
ARGUMENT = '{mhlo.sharding = "{devices=[2,4]<=[8]}"}) ->'

#: name -> (a damaged program, devices to compile it for, words the error must hold)
SHARDING_CASES = {
    "tile count mismatch": (SPMD.replace(ARGUMENT, ARGUMENT.replace(
        "{devices=[2,4]<=[8]}", "{devices=[2,1,9]<=[8] last_tile_dim_replicate}")), 8,
        "mhlo.sharding"),
    "empty iota": (SPMD.replace(ARGUMENT, ARGUMENT.replace("<=[8]", "<=[0]")), 8,
                   "invalid sharding"),
    "manual argument": (SPMD.replace(ARGUMENT, ARGUMENT.replace("{devices=[2,4]<=[8]}",
                                                                "{manual}")), 8, "manual"),
    "huge iota": (SPMD.replace(ARGUMENT, ARGUMENT.replace(
        "{devices=[2,4]<=[8]}", "{devices=[2147483647]<=[2147483647]}")), 1,
        "more than pjrt accepts"),
    "op sharding": (SPMD.replace(
        "%1 = stablehlo.multiply %arg0, %0 : tensor<8x8xf32>",
        "%1 = stablehlo.multiply %arg0, %0 {mhlo.sharding = \"{devices=[4,4]<=[16]}\"} : "
        "tensor<8x8xf32>"), 8, "16 devices"),
    "self recursion": ("""
func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = func.call @f(%arg0) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @f(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = func.call @f(%arg0) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}""", 1, "@f -> @f"),
    "mutual recursion": ("""
func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = func.call @even(%arg0) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @even(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = func.call @odd(%arg0) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @odd(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = func.call @even(%arg0) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}""", 1, "@even -> @odd -> @even"),
}

#: Compiles each case of a JSON file in argv[2] and prints one line per case.
_COMPILE_CASES = """
import json, sys
import pjrt
from conftest import cpu_plugin_path

name, path = sys.argv[1], sys.argv[2]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {"cpu_device_count": 8})
for case, (program, devices, _) in json.load(open(path)).items():
    try:
        pjrt.compile(program, client.devices()[:devices])
        print("CASE", case, "|", "compiled", flush=True)
    except (ValueError, pjrt.XlaRuntimeError) as error:
        print("CASE", case, "|", str(error).replace("\\n", " "), flush=True)
"""


def test_damaged_annotations_and_recursion_are_refused(cpu_plugin, tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(SHARDING_CASES))
    done = run_python(_COMPILE_CASES, cpu_plugin.name, str(path), timeout=120)
    seen = dict(line[len("CASE "):].split(" | ", 1) for line in done.stdout.splitlines()
                if line.startswith("CASE "))
    for case, (_, _, words) in SHARDING_CASES.items():
        assert words in seen[case], (case, seen[case])


def test_good_programs_pass_the_checks():
    for name in ("spmd_elementwise_2d.gspmd", "spmd_mlp.gspmd", "spmd_mlp.shardy",
                 "spmd_matmul.shardy", "while_loop"):
        text = (FIXTURES / f"{name}.mlir").read_bytes()
        program_checks.check_program_structure(text, 8)
        program_checks.check_program_structure(text, 1)


def test_a_one_device_mesh_compiles_and_runs(client):
    """pjrt annotates a program for a one-device mesh with `{devices=[1,1]0}`, which XLA's
    sharding parser calls invalid but every plugin compiles; the checks let it through."""
    program = """module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x2xf32> {mhlo.sharding = "{devices=[1,1]0}"})
      -> (tensor<4x2xf32> {mhlo.sharding = "{devices=[1,1]0}"}) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<4x2xf32>
    return %0 : tensor<4x2xf32>
  }
}"""
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    compiled = pjrt.compile(program, devices=client.devices()[:1])
    np.testing.assert_array_equal(np.asarray(compiled(x)), x + x)
    # The same over a one-device mesh, with the argument placed by a NamedSharding.
    mesh = pjrt.Mesh(np.array(client.devices()[:1]), ("x",))
    placed = pjrt.device_put(x, pjrt.NamedSharding(mesh, pjrt.P("x", None)))
    np.testing.assert_array_equal(np.asarray(pjrt.compile(program, mesh)(placed)), x + x)


def test_cpu_device_count_out_of_range(cpu_plugin):
    source = """
    import sys
    import pjrt
    from conftest import cpu_plugin_path

    name = sys.argv[1]
    pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
    for count in (0, -1):
        try:
            pjrt.make_c_api_client(name, {"cpu_device_count": count})
            print("MADE", count)
        except ValueError as error:
            print("REFUSED", count, error)
    """
    done = run_python(source, cpu_plugin.name, timeout=60)
    assert "REFUSED 0 option 'cpu_device_count'" in done.stdout
    assert "REFUSED -1 option 'cpu_device_count'" in done.stdout


def _sections(blob: bytes) -> list[tuple[int, int, int]]:
    """``(id, start of the length field, start of the data)`` of each section."""
    reader = mlir_bytecode._Reader(blob, 4, len(blob), "test")
    reader.varint()
    reader.pos = blob.index(b"\0", reader.pos) + 1
    found = []
    while reader.pos < len(blob):
        ident = reader.byte()
        length_at = reader.pos
        length = reader.varint()
        if ident >> 7:
            alignment = reader.varint()
            while reader.pos % alignment:
                reader.pos += 1
        found.append((ident & 0x7F, length_at, reader.pos))
        reader.pos += length
    return found


def test_bytecode_container_damage_is_refused(cpu_plugin, tmp_path):
    blob = (FIXTURES / "tiny_tanh.mlirbc").read_bytes()
    mlir_bytecode.check_container(blob)
    damaged = {
        "truncated": blob[:len(blob) // 2],
        "unknown section": blob + b"\x0e\x03\x00",
    }
    _, length_at, _ = _sections(blob)[0]
    damaged["long section"] = blob[:length_at] + b"\x00" + struct.pack("<Q", 1 << 40) + \
        blob[length_at + 1:]
    for why, bad in damaged.items():
        with pytest.raises(ValueError, match="bytecode is damaged"):
            mlir_bytecode.check_container(bad)
        (tmp_path / f"{why}.mlirbc").write_bytes(bad)
    source = """
    import pathlib, sys
    import pjrt
    from conftest import cpu_plugin_path

    name, folder = sys.argv[1], pathlib.Path(sys.argv[2])
    pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
    client = pjrt.make_c_api_client(name, {"cpu_device_count": 1})
    for path in sorted(folder.glob("*.mlirbc")):
        try:
            client.compile_and_load(path.read_bytes())
            print("COMPILED", path.stem)
        except ValueError as error:
            print("REFUSED", path.stem, error)
    """
    done = run_python(source, cpu_plugin.name, str(tmp_path), timeout=60)
    for why in damaged:
        assert f"REFUSED {why} the program's MLIR bytecode is damaged" in done.stdout, done.stdout


def test_export_with_offsets_out_of_bounds_is_refused():
    blob = (FIXTURES / "models" / "torch_mlp" / "exported.bin").read_bytes()
    module = deserialize_exported(blob).mlir_module_serialized
    root = int.from_bytes(blob[:4], "little")
    at = blob.index(module) - 4  # the module's length, before its bytes
    damaged = {
        "root past the end": len(blob).to_bytes(4, "little") + blob[4:],
        "vtable before the start": blob[:root] + (1 << 30).to_bytes(4, "little") +
        blob[root + 4:],
        "module longer than the buffer": blob[:at] + len(blob).to_bytes(4, "little") +
        blob[at + 4:],
    }
    for why, bad in damaged.items():
        with pytest.raises(ValueError, match="serialized jax export") as caught:
            deserialize_exported(bad)
        assert "past the end" in str(caught.value) or "outside" in str(caught.value), why


# -- Shardy shardings on operations, and sub-axes ----------------------------------------------

#: A Shardy program over a 2 x 4 mesh: shardings on the argument and result, one per value on
#: an operation, and a sharding constraint (the forms jax lowers).
SHARDY = """module @sdy attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func public @main(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}]>}) -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}]>}) {
    %0 = stablehlo.sine %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>]>} : tensor<8x8xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"y"}, {}]> : tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}"""
PER_VALUE = '#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>]>'
CONSTRAINT = '<@mesh, [{"y"}, {}]> : tensor'
SHARDY_ARGUMENT = '%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}]>}'


#: Shardy on operations with sub-axes and an inline mesh, all valid (the mutation fuzz of
#: tests/test_damaged_programs.py damages it too).
SHARDY_OPS = """module @spmd_ops attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func public @main(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y":(1)2}]>}) -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}]>}) {
    %0 = stablehlo.sine %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y":(2)2}, {"x"}]>]>} : tensor<8x8xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"y":(1)2}, {}]> : tensor<8x8xf32>
    %2 = stablehlo.add %1, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<mesh<["a"=2, "b"=4]>, [{"a"}, {"b":(1)2}]>]>} : tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}"""


def per_value(entries: str) -> str:
    return SHARDY.replace(PER_VALUE, f"#sdy.sharding_per_value<[{entries}]>")


#: Sub-axes ``"y":(pre-size)size`` of the 4-device axis "y" that Shardy accepts.
GOOD_SUB_AXES = {
    "per value": per_value('<@mesh, [{"y":(1)2}, {"y":(2)2}]>'),
    "argument": SHARDY.replace(SHARDY_ARGUMENT, SHARDY_ARGUMENT.replace('{"y"}', '{"y":(1)2}')),
    "constraint": SHARDY.replace(CONSTRAINT, '<@mesh, [{"y":(2)2}, {}]> : tensor'),
}

#: name -> (a damaged Shardy program, words pjrt's error must hold). The first two ended the
#: process in both tested plugins (SIGFPE: pre-size * size overflows 64 bits to 0, then
#: divides); the plugins' verifiers refuse the others cleanly, and pjrt now says so first.
SHARDY_CASES = {
    "sub-axis overflow on a value": (
        per_value('<@mesh, [{"y":(4611686018427387904)4}, {}]>'), '"y":(4611686018427387904)4'),
    "sub-axis overflow on an argument": (
        SHARDY.replace(SHARDY_ARGUMENT, SHARDY_ARGUMENT.replace(
            '{"y"}', '{"y":(4611686018427387904)4}')), '"y":(4611686018427387904)4'),
    "sub-axis not dividing": (per_value('<@mesh, [{"y":(1)3}, {}]>'), "does not fit axis 'y'"),
    "sub-axis as large as its axis": (per_value('<@mesh, [{"y":(1)4}, {}]>'), "1 < size < 4"),
    "sub-axis and its axis": (per_value('<@mesh, [{"y":(1)2}, {"y"}]>'),
                              "both whole and as a sub-axis"),
    "unknown mesh on a value": (per_value('<@nomesh, [{"x"}, {}]>'), "mesh @nomesh"),
    "unknown axis on a value": (per_value('<@mesh, [{"z"}, {}]>'), "axis 'z'"),
    "axis twice on a value": (per_value('<@mesh, [{"x"}, {"x"}]>'), "used twice"),
    "inline mesh too large on a value": (per_value('<mesh<["a"=16]>, [{"a"}, {}]>'),
                                         "holds 16 devices"),
    "device out of range on a value": (per_value('<mesh<[], device_ids=[99]>, []>'),
                                       "device ids [99]"),
    "unknown axis in a constraint": (SHARDY.replace(CONSTRAINT, '<@mesh, [{"z"}, {}]> : tensor'),
                                     "axis 'z'"),
}


def test_good_shardy_programs_pass_the_checks_and_compile(client):
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
    for name, text in {"plain": SHARDY, **GOOD_SUB_AXES, "ops": SHARDY_OPS}.items():
        program_checks.check_program_structure(text.encode(), 8)
        compiled = pjrt.compile(text, client.devices()[:8])
        want = np.sin(x) + x if name == "ops" else np.sin(x)
        np.testing.assert_allclose(np.asarray(compiled(x)), want, rtol=1e-6, err_msg=name)


def test_shardings_jax_lowers_pass_the_checks(jax_cpu):
    """jax 0.10.2 writes shardings on arguments and results, sharding constraints, a
    shard_map's manual computation, and a callback's ``#sdy.sharding_per_value`` over a
    one-device mesh: all of them pass."""
    jax, jnp = jax_cpu, jax_cpu.numpy
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices("cpu")[:8])
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P("x", "y")))

    def constrained(a):
        b = jax.lax.with_sharding_constraint(jnp.sin(a), NamedSharding(mesh, P("y", None)))
        return b, a + 1

    def manual(a):
        return jax.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(a)

    def callback(a):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct((8, 8), jnp.float32), a)

    lowered = {fn.__name__: jax.jit(fn).lower(x).as_text()
               for fn in (constrained, manual, callback)}
    assert "sdy.sharding_constraint" in lowered["constrained"]
    assert "in_shardings=[<@mesh" in lowered["manual"]
    assert "#sdy.sharding_per_value<[<@maximal_mesh_0, []>]>" in lowered["callback"]
    # Each program with an axis its mesh lacks, in the operation's sharding only.
    damage = {"constrained": r'(sdy\.sharding_constraint %\w+ <@mesh, \[)\{"y"\}',
              "manual": r'(in_shardings=\[<@mesh, \[)\{"x"\}',
              "callback": r"(#sdy\.sharding_per_value<\[<@maximal_mesh_0, \[)()"}
    for name, text in lowered.items():
        program_checks.check_program_structure(text.encode(), 8)
        damaged, count = re.subn(damage[name], r'\1{"z"}', text)
        assert count == 1, name
        with pytest.raises(ValueError, match="Shardy sharding .* axis 'z'"):
            program_checks.check_program_structure(damaged.encode(), 8)


def test_damaged_shardy_shardings_are_refused(cpu_plugin, tmp_path):
    cases = {name: (text, 8, words) for name, (text, words) in SHARDY_CASES.items()}
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    done = run_python(_COMPILE_CASES, cpu_plugin.name, str(path), timeout=120)
    seen = dict(line[len("CASE "):].split(" | ", 1) for line in done.stdout.splitlines()
                if line.startswith("CASE "))
    for case, (_, _, words) in cases.items():
        assert "Shardy sharding" in seen[case] or "inline mesh" in seen[case], (case, seen[case])
        assert words in seen[case], (case, seen[case])


def test_a_sub_axis_overflow_crashes_the_plugin_without_the_check(cpu_plugin, tmp_path):
    """Why the sub-axis check exists: without it, the plugin's compiler ends the process."""
    source = """
    import sys
    import pjrt
    from pjrt._compile import program_checks
    from conftest import cpu_plugin_path

    name, program = sys.argv[1], open(sys.argv[2]).read()
    program_checks.check_shardings = lambda *args: None  # what pjrt did before the check
    pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
    client = pjrt.make_c_api_client(name, {"cpu_device_count": 8})
    print("COMPILING", flush=True)
    client.compile_and_load(program, client.devices())
    print("COMPILED", flush=True)
    """
    path = tmp_path / "overflow.mlir"
    path.write_text(SHARDY_CASES["sub-axis overflow on a value"][0])
    done = run_python(source, cpu_plugin.name, str(path), timeout=120, check=False)
    assert "COMPILING" in done.stdout and "COMPILED" not in done.stdout
    assert done.returncode == -signal.SIGFPE, (done.returncode, done.stderr[-2000:])
