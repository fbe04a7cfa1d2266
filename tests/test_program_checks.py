"""Damage pjrt can see before the plugin's compiler does: sharding annotations that do not fit
the devices, recursive calls, out-of-range client options, MLIR bytecode and jax exports whose
structure is out of bounds. Each of these ended the process inside the plugin (a check
failure, SIGFPE, a stack overflow, SIGABRT) before pjrt checked it; the risky compiles run in a
child process, which must survive them all and report each error.
"""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import pjrt
from pjrt import mlir_bytecode, program_checks
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
