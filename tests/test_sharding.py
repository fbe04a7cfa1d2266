"""Mesh, PartitionSpec, the Sharding classes and their program annotations (pjrt.mesh,
pjrt.sharding, pjrt._sharding.annotations), judged against jax 0.10.2 on 8 CPU devices.

The text parsing beneath them has its own tests, in test_sharding_text.py."""
from __future__ import annotations

import gc
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, TEST_DEVICE_COUNT, cpu_plugin_path
from pjrt.hlo_sharding import HloSharding
from pjrt.sharding import (GSPMDSharding, IndivisibleError, Mesh, NamedSharding, P,
                           PartitionSpec, Sharding, SingleDeviceSharding,
                           check_and_canonicalize_memory_kind, check_spec_axes,
                           hlo_sharding_from_sdy, partition_spec_from_sdy,
                           sdy_sharding_from_spec, sharding_from_mhlo_text,
                           spec_to_hlo_sharding)
from pjrt._sharding.program_text import SdyMesh, parse_program_shardings, parse_sdy_sharding

jax = pytest.importorskip("jax")
js = pytest.importorskip("jax.sharding")
from jax._src.lib import xla_client as xc  # noqa: E402
from jax._src.sharding_impls import GSPMDSharding as JaxGSPMDSharding  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def devices():
    """Our 8 CPU devices; one plugin is enough, sharding is host-side arithmetic."""
    name = sorted(CPU_PLUGINS)[0]
    pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
    client = pjrt.make_c_api_client(name, {"cpu_device_count": TEST_DEVICE_COUNT})
    return client.devices()


def _meshes(devices, jax_devices, shape, names, order=None):
    ids = list(range(int(np.prod(shape)))) if order is None else list(order)
    ours = Mesh(np.array([devices[i] for i in ids], dtype=object).reshape(shape), names)
    theirs = js.Mesh(np.array([jax_devices[i] for i in ids]).reshape(shape), names)
    return ours, theirs


def _by_id(mapping):
    return {device.id: index for device, index in mapping.items()}


# --------------------------------------------------------------------------
# The grid: every spec on many meshes and shapes, against jax
# --------------------------------------------------------------------------

MESHES = [
    ((8,), ("x",), None),
    ((2, 4), ("x", "y"), None),
    ((4, 2), ("x", "y"), None),
    ((2, 2, 2), ("x", "y", "z"), None),
    ((1, 8), ("x", "y"), None),
    ((8, 1), ("x", "y"), None),
    ((2, 1, 4), ("x", "y", "z"), None),
    ((2, 4), ("x", "y"), (3, 1, 4, 0, 7, 5, 2, 6)),
    ((2, 2, 2), ("a", "b", "c"), (7, 6, 5, 4, 3, 2, 1, 0)),
    ((4,), ("x",), (2, 0, 3, 1)),
]


def _specs(names, ndim):
    """Every way to give each axis to one dimension (or none), in every order within a
    dimension; both full-length specs and specs with the trailing dimensions left out."""
    seen = set()
    for owners in itertools.product(range(-1, ndim), repeat=len(names)):
        per_dim = [[n for n, o in zip(names, owners) if o == d] for d in range(ndim)]
        for orders in itertools.product(*(itertools.permutations(axes) for axes in per_dim)):
            entries = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                       for axes in orders]
            used = [i for i, e in enumerate(entries) if e is not None]
            for length in {ndim, (used[-1] + 1) if used else 0}:
                key = tuple(entries[:length])
                if key not in seen:
                    seen.add(key)
                    yield key


def _shapes(ndim):
    even = [(24,) * ndim, (8,) * ndim]
    uneven = [(6,) * ndim, (3,) * ndim, (1,) * ndim, (0,) * ndim,
              tuple([12, 6, 2][:ndim]), tuple([4, 3, 8][:ndim])]
    return even + uneven


def _raises(call):
    try:
        return call(), None
    except Exception as error:  # noqa: BLE001 - the oracle's exception types vary
        return None, error


@pytest.mark.parametrize("shape,names,order", MESHES,
                         ids=[f"{'x'.join(map(str, m[0]))}{'-perm' if m[2] else ''}"
                              for m in MESHES])
def test_grid_matches_jax(devices, jax_devices, shape, names, order):
    mesh, jax_mesh = _meshes(devices, jax_devices, shape, names, order)
    checked = 0
    for ndim in range(0, 4):
        for entries in _specs(names, ndim):
            ours = NamedSharding(mesh, P(*entries))
            theirs = js.NamedSharding(jax_mesh, js.PartitionSpec(*entries))
            context = (shape, order, entries, ndim)
            assert str(ours.to_hlo_sharding(ndim)) == str(
                theirs._to_xla_hlo_sharding(ndim)), context
            assert ours.is_fully_replicated == theirs.is_fully_replicated, context
            assert ours._device_assignment == tuple(
                devices[d.id] for d in theirs._device_assignment)
            for global_shape in _shapes(ndim):
                our_shape, our_error = _raises(lambda: ours.shard_shape(global_shape))
                their_shape, their_error = _raises(lambda: theirs.shard_shape(global_shape))
                assert (our_error is None) == (their_error is None), (context, global_shape,
                                                                     our_error, their_error)
                if our_error is not None:
                    assert isinstance(our_error, IndivisibleError), our_error
                    with pytest.raises(IndivisibleError):
                        ours.devices_indices_map(global_shape)
                    with pytest.raises(ValueError):
                        theirs.devices_indices_map(global_shape)
                    continue
                assert our_shape == their_shape, (context, global_shape)
                assert _by_id(ours.devices_indices_map(global_shape)) == _by_id(
                    theirs.devices_indices_map(global_shape)), (context, global_shape)
                checked += 1
    assert checked > 20


def test_unconstrained_lowers_like_none(devices, jax_devices):
    mesh, jax_mesh = _meshes(devices, jax_devices, (2, 4), ("x", "y"))
    ours = NamedSharding(mesh, P(P.UNCONSTRAINED, "y"))
    theirs = js.NamedSharding(jax_mesh, js.PartitionSpec(js.PartitionSpec.UNCONSTRAINED, "y"))
    assert str(ours.to_hlo_sharding(2)) == str(theirs._to_xla_hlo_sharding(2))
    assert ours.to_sdy_text() == '#sdy.sharding<@mesh, [{?}, {"y"}]>'


def test_worked_example_from_the_docstring(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    assert str(NamedSharding(mesh, P("x", "y")).to_hlo_sharding(2)) == "{devices=[2,4]<=[8]}"
    assert str(NamedSharding(mesh, P("y", "x")).to_hlo_sharding(2)) == \
        "{devices=[4,2]<=[2,4]T(1,0)}"
    assert str(NamedSharding(mesh, P("x")).to_hlo_sharding(2)) == \
        "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert str(NamedSharding(mesh, P()).to_hlo_sharding(2)) == "{replicated}"
    assert spec_to_hlo_sharding(("x", "y"), (2, 4), P("y", "x"), 2) == \
        NamedSharding(mesh, P("y", "x")).to_hlo_sharding(2)


def test_manual_axes_lower_like_jax():
    # jax only marks axes manual inside shard_map; compare with what it builds there.
    ours = spec_to_hlo_sharding(("x", "y"), (2, 4), P("x"), 2, manual_axes=("y",))
    theirs = xc.HloSharding.iota_tile([2, 1, 4], [2, 4], [0, 1], [xc.OpSharding.Type.MANUAL])
    assert str(ours) == str(theirs) == "{devices=[2,1,4]<=[8] last_tile_dims={manual}}"
    mixed = spec_to_hlo_sharding(("x", "y", "z"), (2, 2, 2), P(), 1, manual_axes=("y",))
    assert str(mixed) == "{devices=[1,2,4]<=[2,2,2]T(1,0,2) last_tile_dims={manual, replicated}}"


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

def test_spec_errors_name_the_spec_the_axis_and_the_mesh(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    with pytest.raises(ValueError, match=r"P\('z',\).*'z'.*\('x', 'y'\)"):
        NamedSharding(mesh, P("z"))
    with pytest.raises(ValueError,
                       match=r"P\('x', \('y', 'x'\)\).*'x' more than once.*\('x', 'y'\)"):
        NamedSharding(mesh, P("x", ("y", "x")))
    sharding = NamedSharding(mesh, P("x", "y", None))
    with pytest.raises(ValueError,
                       match=r"P\('x', 'y', None\) has 3 entries.*rank 2.*\('x', 'y'\)"):
        sharding.to_hlo_sharding(2)
    with pytest.raises(ValueError, match="3 entries"):
        sharding.shard_shape((4, 4))
    with pytest.raises(ValueError, match="3 entries"):
        sharding.devices_indices_map((4, 4))
    with pytest.raises(TypeError):
        NamedSharding(mesh, ("x",))


def test_indivisible_error_names_dimension_shape_and_factor(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    sharding = NamedSharding(mesh, P(None, ("x", "y")))
    with pytest.raises(IndivisibleError, match=r"dimension 1 of shape \(4, 6\) into 8 shards.*6"):
        sharding.shard_shape((4, 6))
    assert issubclass(IndivisibleError, ValueError)
    with pytest.raises(TypeError):
        sharding.shard_shape((4.0, 8))
    with pytest.raises(ValueError, match=">= 0"):
        sharding.shard_shape((-1, 8))


def test_mesh_validation(devices):
    grid = np.array(devices).reshape(2, 4)
    with pytest.raises(ValueError, match="twice"):
        Mesh(np.array([devices[0], devices[1], devices[0], devices[2]]), "x")
    with pytest.raises(ValueError, match=r"shape \(2, 4\).*\('x',\)"):
        Mesh(grid, ("x",))
    with pytest.raises(ValueError, match="unique"):
        Mesh(grid, ("x", "x"))
    with pytest.raises(TypeError, match="Devices"):
        Mesh(np.arange(8).reshape(2, 4), ("x", "y"))
    with pytest.raises(TypeError, match="str"):
        Mesh(grid, ("x", 1))
    with pytest.raises(ValueError, match="rectangular"):
        Mesh([[devices[0], devices[1]], [devices[2]]], ("x", "y"))


def test_mesh_cannot_mix_clients(devices):
    name = sorted(CPU_PLUGINS)[0]
    other = pjrt.make_c_api_client(name, {"cpu_device_count": 2})
    with pytest.raises(ValueError, match="clients"):
        Mesh([devices[0], other.devices()[1]], "x")


def test_mesh_properties(devices, jax_devices):
    order = (3, 1, 4, 0, 7, 5, 2, 6)
    mesh, jax_mesh = _meshes(devices, jax_devices, (2, 4), ("x", "y"), order)
    assert mesh.shape == dict(jax_mesh.shape) and list(mesh.shape) == ["x", "y"]
    assert mesh.axis_names == ("x", "y") and mesh.axis_sizes == (2, 4)
    assert mesh.size == 8 and not mesh.empty
    assert mesh.device_ids.tolist() == jax_mesh.device_ids.tolist()
    assert mesh.devices.shape == (2, 4) and mesh.devices[0, 0] is devices[3]
    assert mesh.local_devices == [devices[i] for i in order]
    assert list(mesh.device_list) == [devices[i] for i in order]
    assert str(mesh) == "Mesh('x': 2, 'y': 4)"
    assert mesh.to_sdy_text() == 'sdy.mesh @mesh = <["x"=2, "y"=4]>'
    assert mesh.to_sdy_text("my mesh") == 'sdy.mesh @"my mesh" = <["x"=2, "y"=4]>'
    with pytest.raises(ValueError):
        mesh.devices[0, 0] = devices[0]
    with pytest.raises(ValueError):
        mesh.device_ids[0, 0] = 1
    with pytest.raises(AttributeError):
        mesh.axis_names = ("a", "b")
    one_d = Mesh(devices, "x")           # a bare str names the one axis
    assert one_d.axis_names == ("x",)
    empty = Mesh(np.empty((), dtype=object), ())
    assert empty.empty and empty.size == 0 and str(empty) == "Mesh()"
    with pytest.raises(ValueError, match="devices"):
        NamedSharding(empty, P())


def test_mesh_equality_and_hash(devices):
    grid = np.array(devices).reshape(2, 4)
    a, b = Mesh(grid, ("x", "y")), Mesh(grid.tolist(), ["x", "y"])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Mesh(grid, ("x", "z"))
    assert a != Mesh(grid.reshape(4, 2), ("x", "y"))
    assert a != Mesh(grid[:, ::-1], ("x", "y"))
    assert a != "mesh"


# --------------------------------------------------------------------------
# PartitionSpec and equality rules
# --------------------------------------------------------------------------

SPEC_ENTRIES = [(), (None,), ("x",), ("x", None), (("x",),), (("x", "y"),), ((),),
                (["x", "y"],), ("y", "x"), (None, ("y", "x")), (None, None)]


def test_partition_spec_normalises_and_compares_like_jax():
    for a, b in itertools.product(SPEC_ENTRIES, repeat=2):
        assert (P(*a) == P(*b)) == (js.PartitionSpec(*a) == js.PartitionSpec(*b)), (a, b)
        if P(*a) == P(*b):
            assert hash(P(*a)) == hash(P(*b))
    for entries in SPEC_ENTRIES:
        assert repr(P(*entries)) == repr(js.PartitionSpec(*entries))
    spec = P("x", ("y", "z"))
    assert len(spec) == 2 and spec[1] == ("y", "z") and list(spec) == ["x", ("y", "z")]
    assert spec.axis_names() == ("x", "y", "z")
    assert spec.normalized(3) == P("x", ("y", "z"), None)
    assert PartitionSpec is P and P.UNCONSTRAINED is not None
    with pytest.raises(AttributeError):
        spec.foo = 1
    with pytest.raises(TypeError):
        P(1)
    with pytest.raises(TypeError):
        P(("x", 2))


def test_named_sharding_equality_matches_jax(devices, jax_devices):
    mesh, jax_mesh = _meshes(devices, jax_devices, (2, 4), ("x", "y"))
    other, jax_other = _meshes(devices, jax_devices, (2, 4), ("x", "y"), tuple(range(8))[::-1])
    cases = [(mesh, jax_mesh, e) for e in SPEC_ENTRIES] + [(other, jax_other, ("x",))]
    for (m1, j1, e1), (m2, j2, e2) in itertools.product(cases, repeat=2):
        ours = NamedSharding(m1, P(*e1)) == NamedSharding(m2, P(*e2))
        theirs = (js.NamedSharding(j1, js.PartitionSpec(*e1))
                  == js.NamedSharding(j2, js.PartitionSpec(*e2)))
        assert ours == theirs, (e1, e2)
        if ours:
            assert hash(NamedSharding(m1, P(*e1))) == hash(NamedSharding(m2, P(*e2)))
    # P('x') and P('x', None) differ as objects but place the same shards.
    a, b = NamedSharding(mesh, P("x")), NamedSharding(mesh, P("x", None))
    assert a != b and a.is_equivalent_to(b, 2)


def test_memory_kind_is_canonicalised_like_jax(devices, jax_devices):
    mesh, jax_mesh = _meshes(devices, jax_devices, (8,), ("x",))
    default = NamedSharding(mesh, P("x"))
    assert default.memory_kind == js.NamedSharding(jax_mesh, js.PartitionSpec("x")).memory_kind
    assert default == NamedSharding(mesh, P("x"), memory_kind=default.memory_kind)
    host = default.with_memory_kind("pinned_host")
    assert host.memory_kind == "pinned_host" and host != default
    assert not host.is_equivalent_to(default, 1)
    with pytest.raises(ValueError, match="hbm.*pinned_host"):
        NamedSharding(mesh, P("x"), memory_kind="hbm")
    single = SingleDeviceSharding(devices[0])
    assert single.memory_kind == default.memory_kind
    assert single.with_memory_kind("unpinned_host").memory_kind == "unpinned_host"


def test_check_and_canonicalize_memory_kind_matches_jaxlib(devices, jax_devices):
    ours = pjrt.DeviceList(devices)
    theirs = xc.DeviceList(tuple(jax_devices[i] for i in range(8)))
    for kind in (None, "device", "pinned_host", "unpinned_host"):
        assert check_and_canonicalize_memory_kind(kind, ours) == \
            xc.check_and_canonicalize_memory_kind(kind, theirs)
    # A sequence of devices does as well as a DeviceList.
    assert check_and_canonicalize_memory_kind(None, devices[:2]) == \
        check_and_canonicalize_memory_kind(None, ours)
    with pytest.raises(ValueError):
        xc.check_and_canonicalize_memory_kind("hbm", theirs)
    with pytest.raises(ValueError, match=r"'hbm'.*device, pinned_host, unpinned_host"):
        check_and_canonicalize_memory_kind("hbm", ours)
    with pytest.raises(TypeError, match="memory_kind"):
        check_and_canonicalize_memory_kind(3, ours)


# --------------------------------------------------------------------------
# SingleDeviceSharding and GSPMDSharding
# --------------------------------------------------------------------------

def test_single_device_sharding(devices, jax_devices):
    ours = SingleDeviceSharding(devices[3])
    theirs = js.SingleDeviceSharding(jax_devices[3])
    for shape in [(), (5,), (3, 0)]:
        assert _by_id(ours.devices_indices_map(shape)) == _by_id(theirs.devices_indices_map(shape))
        assert ours.shard_shape(shape) == theirs.shard_shape(shape)
    assert ours.is_fully_replicated and ours.is_fully_addressable
    assert ours.device_set == {devices[3]} == ours.addressable_devices
    assert ours.num_devices == 1 and ours._device_assignment == (devices[3],)
    assert ours.to_hlo_sharding(2).is_replicated()
    assert ours == SingleDeviceSharding(devices[3]) and ours != SingleDeviceSharding(devices[2])
    assert hash(ours) == hash(SingleDeviceSharding(devices[3]))
    one = Mesh(np.array([devices[3]]), ("x",))
    assert ours.is_equivalent_to(NamedSharding(one, P("x")), 1)
    assert ours != NamedSharding(one, P("x"))          # different classes, as in jax
    with pytest.raises(TypeError):
        SingleDeviceSharding(3)


GSPMD_TEXTS = ["{replicated}", "{maximal device=2}", "{devices=[2,4]<=[8]}",
               "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
               "{devices=[2,2,2]7,6,5,4,3,2,1,0 last_tile_dim_replicate}",
               "{devices=[8,1]3,1,4,0,7,5,2,6}", "{devices=[1,1,8]<=[8] last_tile_dim_replicate}"]


@pytest.mark.parametrize("text", GSPMD_TEXTS)
def test_gspmd_sharding_matches_jax(devices, jax_devices, text):
    order = (3, 1, 4, 0, 7, 5, 2, 6)
    ours = GSPMDSharding([devices[i] for i in order], HloSharding.from_string(text))
    theirs = JaxGSPMDSharding([jax_devices[i] for i in order], xc.HloSharding.from_string(text))
    assert ours.is_fully_replicated == theirs.is_fully_replicated
    for shape in [(8, 8), (16, 4), (4, 8), (3, 8), (0, 8)]:
        our_shape, our_error = _raises(lambda: ours.shard_shape(shape))
        their_shape, their_error = _raises(lambda: theirs.shard_shape(shape))
        assert (our_error is None) == (their_error is None), (shape, our_error, their_error)
        if our_error is None:
            assert our_shape == their_shape
            assert _by_id(ours.devices_indices_map(shape)) == _by_id(
                theirs.devices_indices_map(shape))
    assert str(ours.to_hlo_sharding(2)) == str(theirs._to_xla_hlo_sharding(2))
    # The same sharding arrives as our object, as proto bytes or as jaxlib's objects.
    proto = xc.HloSharding.from_string(text).to_proto()
    for form in (proto.SerializeToString(), proto, xc.HloSharding.from_string(text)):
        assert GSPMDSharding([devices[i] for i in order], form) == ours


def test_gspmd_equality_and_validation(devices):
    replicated = GSPMDSharding.get_replicated(devices)
    assert replicated == GSPMDSharding(devices, HloSharding.from_string("{maximal device=0}"))
    assert hash(replicated) == hash(GSPMDSharding(devices, HloSharding.maximal(0)))
    assert replicated != GSPMDSharding(devices[::-1], HloSharding.replicate())
    tiled = GSPMDSharding(devices, HloSharding.iota_tile((2, 4)))
    assert tiled == GSPMDSharding(devices, HloSharding.tiled(np.arange(8).reshape(2, 4)))
    assert tiled != replicated
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    assert tiled.is_equivalent_to(NamedSharding(mesh, P("x", "y")), 2)
    assert tiled != NamedSharding(mesh, P("x", "y"))
    assert sharding_from_mhlo_text("{devices=[2,4]<=[8]}", devices) == tiled
    with pytest.raises(ValueError, match="0..3"):
        GSPMDSharding(devices[:4], HloSharding.iota_tile((2, 4)))
    with pytest.raises(ValueError, match="device 9"):
        GSPMDSharding(devices, HloSharding.maximal(9))
    with pytest.raises(ValueError, match="tuple"):
        GSPMDSharding(devices, HloSharding.from_string("{{replicated}}"))
    with pytest.raises(ValueError, match="twice"):
        GSPMDSharding([devices[0], devices[0]], HloSharding.replicate())
    with pytest.raises(TypeError):
        GSPMDSharding(devices, "{replicated}")
    manual = GSPMDSharding(devices, HloSharding.manual())
    with pytest.raises(ValueError, match="manual"):
        manual.shard_shape((8,))


def test_sharding_common_properties(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    sharding = NamedSharding(mesh, P("y"))
    assert sharding.device_set == set(devices) == sharding.addressable_devices
    assert sharding.is_fully_addressable and sharding.num_devices == 8
    assert sharding._device_assignment == tuple(devices)
    assert sharding._to_xla_hlo_sharding(2) == sharding.to_hlo_sharding(2)
    assert sharding.to_mhlo_text(2) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert sharding.addressable_devices_indices_map((8, 2)) == sharding.devices_indices_map((8, 2))
    assert repr(sharding) == ("NamedSharding(mesh=Mesh('x': 2, 'y': 4), spec=P('y',), "
                              f"memory_kind={sharding.memory_kind})")


# --------------------------------------------------------------------------
# Shardy and GSPMD text
# --------------------------------------------------------------------------

def _lowered_attributes(jax_mesh, specs, shape):
    """The main signature's sharding attributes as jax 0.10.2 lowers them (Shardy)."""
    shardings = tuple(js.NamedSharding(jax_mesh, js.PartitionSpec(*s)) for s in specs)
    args = [jax.ShapeDtypeStruct(shape, np.float32, sharding=s) for s in shardings]
    text = jax.jit(lambda *xs: xs, in_shardings=shardings,
                   out_shardings=shardings).lower(*args).as_text()
    return text


@pytest.mark.parametrize("shape,names,specs", [
    ((2, 4), ("x", "y"), [("x", "y"), ("y", "x"), ("x",), (), (("x", "y"),), (None, "y")]),
    ((2, 2, 2), ("a", "b", "c"), [("c", ("a", "b")), (("b", "a", "c"),), ("b",)]),
    ((1, 8), ("x", "y"), [("x", "y"), ("y",)]),
])
def test_sdy_text_matches_jax_lowering(devices, jax_devices, shape, names, specs):
    mesh, jax_mesh = _meshes(devices, jax_devices, shape, names)
    text = _lowered_attributes(jax_mesh, specs, (8, 8))
    assert mesh.to_sdy_text() in text
    inputs, outputs = parse_program_shardings(text)
    assert len(inputs) == len(outputs) == len(specs)
    for spec, parsed in zip(specs, inputs):
        ours = NamedSharding(mesh, P(*spec))
        assert ours.to_sdy_text(2) in text
        assert parsed.mesh_name == "mesh"
        assert hlo_sharding_from_sdy(parsed) == ours.to_hlo_sharding(2)
        assert partition_spec_from_sdy(parsed) == P(*spec).normalized(2)
        assert str(sdy_sharding_from_spec(mesh, P(*spec), 2)) == ours.to_sdy_text(2)
        assert NamedSharding.from_sdy_text(ours.to_sdy_text(2), mesh).is_equivalent_to(ours, 2)


def test_sdy_shardings_convert_like_xla():
    meshes = {"mesh": (("x", "y", "z"), (2, 2, 2))}
    parsed = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x", ?}, {?}, {"y", "z"}p1, {}]>',
                                meshes)
    assert partition_spec_from_sdy(parsed) == P("x", P.UNCONSTRAINED, ("y", "z"), None)
    assert str(hlo_sharding_from_sdy(parsed)) == "{devices=[2,1,4,1]<=[8]}"
    replicated = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x"}], replicated={"y"}>', meshes)
    assert partition_spec_from_sdy(replicated) == P("x")
    assert str(hlo_sharding_from_sdy(replicated)) == \
        "{devices=[2,4]<=[8] last_tile_dim_replicate}"
    inline = parse_sdy_sharding('#sdy.sharding<mesh<["x"=2, "y"=4]>, [{"y"}, {}]>', {})
    assert str(hlo_sharding_from_sdy(inline)) == \
        "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    ordered = parse_sdy_sharding('#sdy.sharding<@m, [{"x"}]>',
                                 {"m": SdyMesh(("x",), (4,), (3, 1, 0, 2))})
    assert str(hlo_sharding_from_sdy(ordered)) == "{devices=[4]3,1,0,2}"
    maximal = parse_sdy_sharding("#sdy.sharding<@m, [{}, {}]>", {"m": SdyMesh((), (), (5,))})
    assert str(hlo_sharding_from_sdy(maximal)) == "{maximal device=5}"
    unreduced = parse_sdy_sharding('#sdy.sharding<@mesh, [{"x"}], unreduced={"y"}>', meshes)
    # As jax lowers it: x tiles, then the z (replicated) and y (unreduced) subgroups,
    # which XLA reorders to unreduced first.
    theirs = xc.HloSharding.iota_tile([2, 2, 2], [2, 2, 2], [0, 2, 1],
                                      [xc.OpSharding.Type.REPLICATED, xc.OpSharding.Type.UNREDUCED])
    assert str(hlo_sharding_from_sdy(unreduced)) == str(theirs)
    with pytest.raises(TypeError, match="SdySharding"):
        partition_spec_from_sdy(P("x"))
    with pytest.raises(TypeError, match="SdySharding"):
        hlo_sharding_from_sdy("#sdy.sharding<@mesh, [{}]>")


def test_sdy_sharding_from_spec(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    sharding = sdy_sharding_from_spec(mesh, P(("y", "x"), P.UNCONSTRAINED), 3, mesh_name="m")
    assert str(sharding) == '#sdy.sharding<@m, [{"y", "x"}, {?}, {}]>'
    assert sharding.mesh == SdyMesh(("x", "y"), (2, 4))
    assert hlo_sharding_from_sdy(sharding) == NamedSharding(mesh, P(("y", "x"))).to_hlo_sharding(3)
    assert str(sdy_sharding_from_spec(mesh, P())) == "#sdy.sharding<@mesh, []>"
    with pytest.raises(ValueError, match=r"2 entries, more than the array's rank 1"):
        sdy_sharding_from_spec(mesh, P("x", "y"), 1)
    with pytest.raises(ValueError, match="'z'"):
        sdy_sharding_from_spec(mesh, P("z"))
    with pytest.raises(ValueError, match="mesh name"):
        sdy_sharding_from_spec(mesh, P("x"), mesh_name="")
    with pytest.raises(ValueError, match="more than the array's rank 1"):
        NamedSharding(mesh, P("x", "y")).to_sdy_text(1)


def test_check_spec_axes():
    check_spec_axes(P("x", ("y", "z"), None, P.UNCONSTRAINED), ("x", "y", "z"))
    with pytest.raises(ValueError, match=r"names axis 'w'.*\('x', 'y'\)"):
        check_spec_axes(P("w"), ["x", "y"])
    with pytest.raises(ValueError, match="'x' more than once"):
        check_spec_axes(P("x", "x"), ("x",))


def test_from_sdy_text_checks_the_mesh(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    sharding = NamedSharding.from_sdy_text('#sdy.sharding<@any_name, [{}, {"y", "x"}]>', mesh)
    assert sharding == NamedSharding(mesh, P(None, ("y", "x")))
    with pytest.raises(ValueError, match="'z'"):
        NamedSharding.from_sdy_text('#sdy.sharding<@mesh, [{"z"}]>', mesh)
    with pytest.raises(ValueError, match="own mesh"):
        NamedSharding.from_sdy_text('#sdy.sharding<mesh<["x"=8]>, [{"x"}]>', mesh)
    with pytest.raises(ValueError, match="unreduced"):
        NamedSharding.from_sdy_text('#sdy.sharding<@mesh, [{"x"}], unreduced={"y"}>', mesh)


# --------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------

def _spmd_variants():
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    for name, entry in manifest["programs"].items():
        if isinstance(entry, dict) and "spmd" in entry:
            for variant, info in entry["spmd"]["variants"].items():
                yield pytest.param(info, id=f"{name}-{variant}")


@pytest.mark.parametrize("info", list(_spmd_variants()))
def test_program_shardings_match_the_manifest(info):
    inputs, outputs = parse_program_shardings((FIXTURES / info["file"]).read_text())

    def as_text(parsed):
        return str(parsed if isinstance(parsed, HloSharding) else hlo_sharding_from_sdy(parsed))
    assert [as_text(s) for s in inputs] == info["jax_input_hlo_shardings"]
    assert [as_text(s) for s in outputs] == info["jax_output_hlo_shardings"]


# --------------------------------------------------------------------------
# Equivalence (answered from a token each sharding computes once per rank)
# --------------------------------------------------------------------------

def _layouts(devices, jax_devices):
    """(ours, jax's) NamedShardings for rank-2 arrays: equal ones spelled apart, other specs,
    device orders, mesh shapes and memory kinds."""
    out = []
    for shape, names, order in [((8,), ("x",), None), ((8,), ("x",), (1, 0, 2, 3, 4, 5, 6, 7)),
                                ((2, 4), ("x", "y"), None), ((4, 2), ("x", "y"), None),
                                ((2, 4), ("x", "y"), (3, 1, 4, 0, 7, 5, 2, 6))]:
        mesh, jax_mesh = _meshes(devices, jax_devices, shape, names, order)
        specs = [(), (None, None), (names[0],), (names[0], None), (names[-1],),
                 (None, names[0]), (tuple(names),)]
        for spec in specs:
            for kind in (None, "pinned_host"):
                out.append((NamedSharding(mesh, P(*spec), memory_kind=kind),
                            js.NamedSharding(jax_mesh, js.PartitionSpec(*spec), memory_kind=kind)))
    return out


def test_equivalence_matches_jax_on_every_pair(devices, jax_devices):
    """Every pair of a grid of layouts, rank 2: the verdict is jax's, both ways, asked twice
    (the second time from the cached tokens)."""
    layouts = _layouts(devices, jax_devices)
    equivalent_pairs = 0
    for (a, ja), (b, jb) in itertools.product(layouts, repeat=2):
        want = ja.is_equivalent_to(jb, 2)
        for _ in range(2):
            assert a.is_equivalent_to(b, 2) == want, (a, b)
            assert b.is_equivalent_to(a, 2) == want, (a, b)
        equivalent_pairs += want and a != b
    assert equivalent_pairs > 0  # the grid holds equivalent layouts spelled differently


def test_an_equal_named_sharding_is_equivalent_to_the_compiled_one_and_others_are_not(devices):
    """A GSPMDSharding as a compiled program reports it, against NamedShardings a user builds."""
    mesh8 = Mesh(np.array(devices), ("x",))
    program = GSPMDSharding(devices, HloSharding.from_string("{devices=[8]<=[8]}"))
    assert NamedSharding(mesh8, P("x")).is_equivalent_to(program, 1)
    assert NamedSharding(mesh8, P("x")).is_equivalent_to(NamedSharding(mesh8, P("x")), 1)
    # The same layout on a 2 x 4 mesh whose axes both split the one dimension, in order.
    mesh24 = Mesh(np.array(devices).reshape(2, 4), ("a", "b"))
    assert NamedSharding(mesh24, P(("a", "b"))).is_equivalent_to(program, 1)
    swapped = [devices[1], devices[0], *devices[2:]]
    different = {
        "another spec": NamedSharding(mesh8, P(None)),
        "another device order": NamedSharding(Mesh(np.array(swapped), ("x",)), P("x")),
        "another mesh shape": NamedSharding(mesh24, P("a")),
        "axes in another order": NamedSharding(mesh24, P(("b", "a"))),
        "another memory kind": NamedSharding(mesh8, P("x"), memory_kind="pinned_host"),
        "fewer devices": NamedSharding(Mesh(np.array(devices[:4]), ("x",)), P("x")),
    }
    for why, sharding in different.items():
        for _ in range(2):
            assert not sharding.is_equivalent_to(program, 1), why
            assert not program.is_equivalent_to(sharding, 1), why


def test_equivalence_cannot_be_fooled_by_a_mutated_or_collected_sharding(devices):
    """The shardings refuse to change once built, and a verdict is never kept by id(): a
    sharding collected and another built at the same address gets its own answer."""
    from pjrt._sharding import equivalence

    mesh = Mesh(np.array(devices), ("x",))
    program = GSPMDSharding(devices, HloSharding.from_string("{devices=[8]<=[8]}"))
    named = NamedSharding(mesh, P("x"))
    assert named.is_equivalent_to(program, 1)
    for sharding, name, value in [(named, "_spec", P(None)), (named, "_mesh", mesh),
                                  (program, "_hlo", HloSharding.replicate()),
                                  (SingleDeviceSharding(devices[0]), "_device", devices[1])]:
        with pytest.raises(AttributeError, match="immutable"):
            setattr(sharding, name, value)
    assert named.spec == P("x") and named.is_equivalent_to(program, 1)
    assert not program.is_equivalent_to(NamedSharding(mesh, P(None)), 1)
    # A copy carries the cached tokens, which stay the very same objects.
    import copy
    copied = copy.copy(named)
    assert copied is not named and copied.is_equivalent_to(program, 1)
    token = named._layout_token(1)
    assert copy.copy(token) is token and copy.deepcopy(token) is token

    reused = 0
    for _ in range(200):
        first = NamedSharding(mesh, P("x"))
        address = id(first)
        assert first.is_equivalent_to(program, 1)
        del first                                      # freed here: it holds no cycle
        other = NamedSharding(mesh, P(None))          # often at the same address
        reused += id(other) == address
        assert not other.is_equivalent_to(program, 1), f"address reused {reused} times"
        del other
    # A layout's token lives only as long as a sharding holds it.
    held = equivalence.live_layouts()
    replicated = [NamedSharding(Mesh(np.array(devices[i:i + 2]), ("x",)), P(None))
                  for i in range(0, 8, 2)]
    assert all(not r.is_equivalent_to(program, 1) for r in replicated)
    assert equivalence.live_layouts() == held + 4
    del replicated
    gc.collect()
    assert equivalence.live_layouts() == held


def test_shard_shape_from_its_cache_still_checks_the_shape(devices):
    """A shape asked again is answered from the cache, but only for plain int sizes: a bool
    (equal to 1, with the same hash) is still refused, numpy ints still accepted."""
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P())
    for _ in range(2):
        assert sharding.shard_shape((1,)) == (1,)
        assert sharding.shard_shape((np.int64(1),)) == (1,)
        assert sharding.shard_shape([1]) == (1,)
        with pytest.raises(TypeError, match="must hold ints"):
            sharding.shard_shape((True,))
        with pytest.raises(ValueError, match=">= 0"):
            sharding.shard_shape((-1,))


def test_sharding_subclasses_are_compared_in_full(devices):
    """A Sharding subclass pjrt does not know may change: it gets no token, each answer is
    computed afresh from its HloSharding."""
    class Switchable(Sharding):
        def __init__(self, hlo):
            self.hlo = hlo

        def to_hlo_sharding(self, ndim):
            return self.hlo

        @property
        def _device_assignment(self):
            return tuple(devices)

        @property
        def memory_kind(self):
            return program.memory_kind

    program = GSPMDSharding(devices, HloSharding.from_string("{devices=[8]<=[8]}"))
    mine = Switchable(HloSharding.from_string("{devices=[8]<=[8]}"))
    assert mine.is_equivalent_to(program, 1) and program.is_equivalent_to(mine, 1)
    mine.hlo = HloSharding.replicate()
    assert not mine.is_equivalent_to(program, 1) and not program.is_equivalent_to(mine, 1)


# --------------------------------------------------------------------------
# Module layout
# --------------------------------------------------------------------------

def test_sharding_names_are_importable_from_pjrt_sharding():
    import pickle

    from pjrt import mesh, sharding
    from pjrt._sharding import annotations as sharding_annotations
    for name in pjrt._LAZY["sharding"]:
        assert getattr(pjrt, name) is getattr(sharding, name)
    for module in (mesh, sharding_annotations):
        for name in module.__all__:
            assert getattr(sharding, name) is getattr(module, name), name
    assert sharding.UNCONSTRAINED is P.UNCONSTRAINED
    spec = P("x", P.UNCONSTRAINED, ("y", "z"))
    assert pickle.loads(pickle.dumps(spec)) == spec
