"""Shardy and GSPMD sharding text, and the signatures of programs (pjrt._sharding.program_text).

Plain text in, plain data out: no devices and no jax are needed. The programs under
fixtures/ were lowered by jax 0.10.2 (see fixtures/manifest.json), so parsing them is
checked against what jax wrote.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_python
from pjrt.hlo_sharding import HloSharding
from pjrt._sharding.program_text import (SdyDim, SdyMesh, SdySharding, parse_program_result_shapes,
                                parse_program_shardings, parse_sdy_mesh, parse_sdy_sharding,
                                parse_sdy_sharding_for_mesh)

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def test_the_text_layer_does_not_import_the_sharding_types():
    code = ("import sys, pjrt._sharding.program_text; "
            "print(sorted(m for m in sys.modules if m in "
            "('pjrt.sharding', 'pjrt.mesh', 'pjrt._sharding.annotations')))")
    out = run_python(code)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------
# sdy.mesh
# --------------------------------------------------------------------------

def test_parse_sdy_mesh_forms():
    assert parse_sdy_mesh('sdy.mesh @mesh = <["x"=2, "y"=4]> {stablehlo.mesh = {}}') == \
        SdyMesh(("x", "y"), (2, 4))
    assert parse_sdy_mesh('<["a"=4], device_ids=[3, 2, 1, 0]>') == \
        SdyMesh(("a",), (4,), (3, 2, 1, 0))
    assert parse_sdy_mesh("<[], device_ids=[3]>") == SdyMesh((), (), (3,))
    assert parse_sdy_mesh('mesh<["x"=8]>') == parse_sdy_mesh('#sdy.mesh<["x"=8]>') == \
        SdyMesh(("x",), (8,))
    assert parse_sdy_mesh('sdy.mesh @"my mesh" = <["odd \\"axis\\""=2]>') == \
        SdyMesh(('odd "axis"',), (2,))
    assert parse_sdy_mesh("<[]>") == SdyMesh((), ())


def test_sdy_mesh_prints_and_reads_back():
    mesh = SdyMesh(("x", "y"), (2, 4))
    assert str(mesh) == '<["x"=2, "y"=4]>'
    assert mesh.to_definition() == 'sdy.mesh @mesh = <["x"=2, "y"=4]>'
    assert mesh.to_definition("my mesh") == 'sdy.mesh @"my mesh" = <["x"=2, "y"=4]>'
    ordered = SdyMesh(("a",), (4,), (3, 2, 1, 0))
    assert str(ordered) == '<["a"=4], device_ids=[3, 2, 1, 0]>'
    for value in (mesh, ordered, SdyMesh((), (), (5,))):
        assert parse_sdy_mesh(value.to_definition("m")) == value
    with pytest.raises(ValueError, match="non-empty str"):
        mesh.to_definition("")


@pytest.mark.parametrize("text,message", [
    ('<["a"=4], device_ids=[0, 1]>', "2 device ids for a mesh of 4"),
    ('<["x"=2, "x"=4]>', "repeat"),
    ('<["x"=2', "end of text"),
    ('<["x"=two]>', "expected an integer, found 'two'"),
    ("<[x=2]>", "expected a quoted name, found 'x'"),
    ('<["x"=2], ids=[0, 1]>', "expected 'device_ids', found 'ids'"),
    ('<["x"=2]> extra', "unexpected 'extra'"),
    ("", "end of text"),
    ('<["x"=2] ~', "unexpected character '~'"),
])
def test_parse_sdy_mesh_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_sdy_mesh(text)
    assert "invalid Shardy text" in str(error.value)


# --------------------------------------------------------------------------
# #sdy.sharding
# --------------------------------------------------------------------------

MESHES = {"mesh": (("x", "y", "z"), (2, 2, 2))}


def test_parse_sdy_sharding_forms():
    parsed = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x", ?}, {?}, {"y", "z"}p1, {}]>',
                                MESHES)
    assert parsed.mesh_name == "mesh" and parsed.mesh == SdyMesh(("x", "y", "z"), (2, 2, 2))
    assert parsed.dims == (SdyDim(("x",), True), SdyDim((), True), SdyDim(("y", "z")),
                           SdyDim(()))
    assert parsed.replicated_axes == parsed.unreduced_axes == ()
    # The priority is dropped; the rest prints back as written.
    assert str(parsed) == '#sdy.sharding<@mesh, [{"x", ?}, {?}, {"y", "z"}, {}]>'
    replicated = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x"}], replicated={"y"}>', MESHES)
    assert replicated.replicated_axes == ("y",)
    assert str(replicated) == '#sdy.sharding<@mesh, [{"x"}], replicated={"y"}>'
    unreduced = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x"}], unreduced={"y", "z"}>',
                                   MESHES)
    assert unreduced.unreduced_axes == ("y", "z")
    assert str(unreduced) == '#sdy.sharding<@mesh, [{"x"}], unreduced={"y", "z"}>'
    inline = parse_sdy_sharding('#sdy.sharding<mesh<["x"=2, "y"=4]>, [{"y"}, {}]>', {})
    assert inline.mesh_name is None and inline.mesh == SdyMesh(("x", "y"), (2, 4))
    assert str(inline) == '#sdy.sharding<mesh<["x"=2, "y"=4]>, [{"y"}, {}]>'
    scalar = parse_sdy_sharding("#sdy.sharding<@mesh, []>", MESHES)
    assert scalar.dims == ()
    quoted = parse_sdy_sharding('#sdy.sharding<@"my mesh", [{"x"}]>', {"my mesh": (("x",), (8,))})
    assert quoted.mesh_name == "my mesh"
    assert str(quoted) == '#sdy.sharding<@"my mesh", [{"x"}]>'
    # The leading "#sdy.sharding" may be left out, as inside an attribute list.
    assert parse_sdy_sharding('<@mesh, [{"x"}]>', MESHES) == \
        parse_sdy_sharding('#sdy.sharding<@mesh, [{"x"}]>', MESHES)


class _MeshLike:
    axis_names = ("x", "y")
    axis_sizes = (2, 4)


@pytest.mark.parametrize("mesh", [
    (("x", "y"), (2, 4)), (["x", "y"], [2, 4]), SdyMesh(("x", "y"), (2, 4)), _MeshLike(),
])
def test_parse_sdy_sharding_takes_meshes_in_several_forms(mesh):
    parsed = parse_sdy_sharding('#sdy.sharding<@m, [{"y"}, {"x"}]>', {"m": mesh})
    assert parsed.mesh == SdyMesh(("x", "y"), (2, 4))
    assert parsed == SdySharding("m", SdyMesh(("x", "y"), (2, 4)),
                                 (SdyDim(("y",)), SdyDim(("x",))))


@pytest.mark.parametrize("text,message", [
    ('#sdy.sharding<@other, [{"x"}]>', "@other, which is not defined (meshes: @mesh)"),
    ('#sdy.sharding<@mesh, [{"w"}]>', "'w', which is not in its mesh axes"),
    ('#sdy.sharding<@mesh, [{"x"}, {"x"}]>', "more than once"),
    ('#sdy.sharding<@mesh, [{"x"}], replicated={"x"}>', "more than once"),
    ('#sdy.sharding<@mesh, [{"x":(1)2}]>', "sub-axes"),
    ('#sdy.sharding<@mesh, [{?, "x"}]>', "after the axes"),
    ('#sdy.sharding<@mesh, [{"x"}]', "end of text"),
    ('#sdy.sharding<@mesh, [{"x"}], sideways={}>', "sideways"),
    ('#sdy.sharding<@mesh, [{"x"}]> trailing', "unexpected 'trailing'"),
    ("#sdy.sharding<@mesh>", "expected ',', found '>'"),
    ('#sdy.sharding<@mesh, [{x}]>', "expected a quoted name, found 'x'"),
    ('#sdy.sharding<@mesh, [{"x" "y"}]>', "expected '}'"),
    ('#sdy.sharding<[{"x"}]>', "expected '@mesh_name' or an inline mesh"),
    ("", "end of text"),
])
def test_parse_sdy_sharding_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_sdy_sharding(text, {"mesh": (("x", "y"), (2, 4))})


def test_parse_sdy_sharding_type_errors():
    with pytest.raises(TypeError, match="str"):
        parse_sdy_sharding(b'#sdy.sharding<@mesh, []>', MESHES)
    with pytest.raises(TypeError, match="mesh @mesh must be"):
        parse_sdy_sharding("#sdy.sharding<@mesh, []>", {"mesh": 8})
    with pytest.raises(ValueError, match="2 axis names but 1 sizes"):
        parse_sdy_sharding("#sdy.sharding<@mesh, []>", {"mesh": (("x", "y"), (8,))})


def test_parse_sdy_sharding_for_mesh():
    mesh = SdyMesh(("x", "y"), (2, 4))
    parsed = parse_sdy_sharding_for_mesh('#sdy.sharding<@any_name, [{}, {"y", "x"}]>', mesh)
    assert parsed.mesh_name == "any_name" and parsed.mesh == mesh
    assert parsed.dims == (SdyDim(()), SdyDim(("y", "x")))
    same = parse_sdy_sharding_for_mesh('#sdy.sharding<mesh<["x"=2, "y"=4]>, [{"x"}]>', mesh)
    assert same.mesh == mesh and same.mesh_name is None
    with pytest.raises(ValueError, match="own mesh"):
        parse_sdy_sharding_for_mesh('#sdy.sharding<mesh<["x"=8]>, [{"x"}]>', mesh)
    with pytest.raises(ValueError, match="own mesh"):
        parse_sdy_sharding_for_mesh(
            '#sdy.sharding<mesh<["x"=2, "y"=4], device_ids=[7, 6, 5, 4, 3, 2, 1, 0]>, []>', mesh)
    with pytest.raises(ValueError, match="'z'"):
        parse_sdy_sharding_for_mesh('#sdy.sharding<@mesh, [{"z"}]>', mesh)
    with pytest.raises(TypeError, match="SdyMesh"):
        parse_sdy_sharding_for_mesh('#sdy.sharding<@mesh, []>', (("x",), (8,)))


# --------------------------------------------------------------------------
# Program signatures
# --------------------------------------------------------------------------

def _spmd_variants():
    for name, entry in MANIFEST["programs"].items():
        if isinstance(entry, dict) and "spmd" in entry:
            for variant, info in entry["spmd"]["variants"].items():
                yield pytest.param(entry["spmd"], info, id=f"{name}-{variant}")


def _padded(spec, rank):
    dims = []
    for entry in list(spec) + [None] * (rank - len(spec)):
        dims.append(SdyDim(() if entry is None else (entry,) if isinstance(entry, str)
                           else tuple(entry)))
    return tuple(dims)


@pytest.mark.parametrize("spmd,info", list(_spmd_variants()))
def test_program_shardings_are_what_jax_wrote(spmd, info):
    inputs, outputs = parse_program_shardings((FIXTURES / info["file"]).read_text())
    assert len(inputs) == len(spmd["in_specs"]) and len(outputs) == len(spmd["out_specs"])
    if info["file"].endswith(".gspmd.mlir"):
        # GSPMD strings parse to the HloShardings jax lowered.
        assert all(isinstance(s, HloSharding) for s in inputs + outputs)
        assert [str(s) for s in inputs] == info["jax_input_hlo_shardings"]
        assert [str(s) for s in outputs] == info["jax_output_hlo_shardings"]
        return
    # Shardy attributes parse to the specs jax was given, over the mesh it was given.
    mesh = SdyMesh(tuple(spmd["axis_names"]), tuple(spmd["mesh_shape"]))
    shapes = spmd["in_shapes"] + spmd["out_shapes"]
    for parsed, spec, shape in zip(inputs + outputs, spmd["in_specs"] + spmd["out_specs"],
                                   shapes):
        assert isinstance(parsed, SdySharding)
        assert parsed.mesh_name == "mesh" and parsed.mesh == mesh
        assert parsed.dims == _padded(spec, len(shape))


def _text_programs():
    for name, entry in MANIFEST["programs"].items():
        if not isinstance(entry, dict):
            continue
        for file in entry["files"].values():
            if file.endswith(".mlir"):
                yield pytest.param(file, entry["outputs"], id=file)


@pytest.mark.parametrize("file,outputs", list(_text_programs()))
def test_program_result_shapes_are_what_jax_wrote(file, outputs):
    shapes = parse_program_result_shapes((FIXTURES / file).read_text())
    assert shapes == tuple(tuple(o["shape"]) for o in outputs)


def test_program_result_shapes_of_plain_signatures():
    text = ("func.func public @main(%a: tensor<8xf32>) -> (tensor<?x4xf32>, tensor<2x3xi1>, "
            "tensor<f32> {mhlo.sharding = \"{replicated}\"}) {")
    assert parse_program_result_shapes(text) == (None, (2, 3), ())
    assert parse_program_result_shapes(
        "func.func public @main(%a: tensor<8xf32>) -> tensor<8x2xbf16> {") == ((8, 2),)
    assert parse_program_result_shapes("func.func public @main(%a: tensor<8xf32>) {") == ()
    assert parse_program_result_shapes(
        "func.func public @main() -> (tensor<2xcomplex<f32>>, !stablehlo.token) {") == \
        ((2,), None)
    assert parse_program_result_shapes(
        "func.func public @main() -> tensor<3x2xcomplex<f64>> {") == ((3, 2),)
    assert parse_program_result_shapes(
        "func.func public @main() -> (tensor<*xf32>, tensor<4x?xf32>) {") == (None, None)


def test_program_shardings_on_plain_signatures():
    text = """
    module {
      sdy.mesh @"odd mesh" = <["x"=8]>
      func.func public @main(%a: tensor<8xf32>,
          %b: tensor<8xf32> {sdy.sharding = #sdy.sharding<@"odd mesh", [{"x"}]>} loc("b"))
          -> tensor<8xf32> {
        return %a : tensor<8xf32>
      }
    }"""
    inputs, outputs = parse_program_shardings(text)
    assert inputs[0] is None and inputs[1].mesh_name == "odd mesh" and outputs == (None,)
    assert inputs[1].dims == (SdyDim(("x",)),)
    text = ('func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[4]<=[4]}", '
            'mhlo.other = "x,y"}) -> (tensor<4xf32> {mhlo.sharding = "{replicated}"}, '
            'tensor<f32>) {')
    inputs, outputs = parse_program_shardings(text)
    assert inputs == (HloSharding.iota_tile((4,)),)
    assert outputs == (HloSharding.replicate(), None)
    assert parse_program_shardings("func.func public @main() {") == ((), ())
    # A helper function before main, and "->" inside a string, do not confuse the reader.
    text = ('func.func private @helper(%x: tensor<2xf32>) -> tensor<2xf32> {}\n'
            'func.func public @main(%a: tensor<2xf32> {mhlo.sharding = "{maximal device=1}", '
            'jax.name = "a->b"}) -> (tensor<2xf32> {mhlo.sharding = "{manual}"}) {')
    inputs, outputs = parse_program_shardings(text)
    assert inputs == (HloSharding.maximal(1),) and outputs == (HloSharding.manual(),)


@pytest.mark.parametrize("text,message", [
    ("func.func private @helper() {", "no 'func.func public @main'"),
    ('func.func public @main(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {',
     "argument 0 of the program's @main: the sharding '#sdy.sharding<@mesh, [{\"x\"}]>' refers "
     "to mesh @mesh, which is not defined"),
    ('func.func public @main(%a: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[8]"}) {',
     "argument 0 of the program's @main: invalid sharding '{devices=[4]<=[8]'"),
    ('func.func public @main(%a: tensor<8xf32> {mhlo.sharding = {replicated}}) {',
     "mhlo.sharding must be a string"),
    ("func.func public @main(%a: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32> "
     '{mhlo.sharding = "{bogus}"}) {', "result 1 of the program's @main: invalid sharding"),
    ("func.func public @main(%a: tensor<8xf32>",
     "signature of the program's @main is malformed: the '(' at line 1, column 23 is never "
     "closed"),
    ("func.func public @main(%a: tensor<8xf32>]) {",
     "']' at line 1, column 41 does not close the '(' at line 1, column 23"),
    ("func.func public @main() -> (tensor<8xf32> {mhlo.sharding = \"{replicated}\"} {",
     "signature of the program's @main is malformed"),
    ('sdy.mesh @mesh = <["x"=2, "y"=>\nfunc.func public @main() {',
     "the program's sdy.mesh @mesh is malformed"),
    ('sdy.mesh @mesh = ["x"=2]\nfunc.func public @main() {',
     "the program's sdy.mesh @mesh is malformed: expected '<' at line 1, column 18"),
    ('sdy.mesh @mesh = <["x"=2, "x"=4]>\nfunc.func public @main() {', "repeat"),
    ('sdy.mesh @mesh = <["x"=2]>\nfunc.func public @main(%a: tensor<8xf32> '
     '{sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"x"}]>}) {', "more than once"),
])
def test_malformed_programs_raise_a_clear_value_error(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_program_shardings(text)


def test_program_text_must_be_a_str():
    with pytest.raises(TypeError, match="program_text must be a str, got bytes"):
        parse_program_shardings(b"func.func public @main() {")
    with pytest.raises(TypeError, match="program_text must be a str"):
        parse_program_result_shapes(None)
