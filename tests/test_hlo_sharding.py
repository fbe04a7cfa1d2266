"""HloSharding: text, proto and normalisation, judged against jaxlib's own HloSharding."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from pjrt.hlo_sharding import HloSharding, OpShardingType

jax = pytest.importorskip("jax")
xc = pytest.importorskip("jax._src.lib").xla_client

REPLICATED, MANUAL, UNREDUCED = (OpShardingType.REPLICATED, OpShardingType.MANUAL,
                                 OpShardingType.UNREDUCED)

# Spellings XLA prints, and spellings it normalises (subgroup order, size-one subgroups,
# iota canonicalisation, replication groups sorted, V1 fallbacks).
TEXTS = [
    "{replicated}", "{manual}", "{unknown}", "{unreduced}", "{maximal device=3}",
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
    "{devices=[2,2]0,2,1,3}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={replicated, manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={replicated,manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual, manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={replicated, replicated}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}",
    "{devices=[2,1,4]<=[8] last_tile_dims={replicated}}",
    "{devices=[2,1,1,4]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[1,1,8]<=[8] last_tile_dims={manual}}",
    "{devices=[1,1,8]<=[8] last_tile_dim_replicate}",
    "{devices=[2,4,1]<=[8] last_tile_dim_replicate}",
    "{devices=[8]<=[8]}", "{devices=[8]0,1,2,3,4,5,6,7}",
    "{devices=[4,2]<=[2,2,2]T(2,0,1)}", "{devices=[2,2]<=[2,2]T(0,1)}",
    "{devices=[2,4]<=[2,2,2]T(0,1,2)}", "{devices=[8,1]<=[2,4]T(1,0)}",
    "{devices=[4,2]<=[2,2,2]T(1,0,2)}", "{devices=[2,4]<=[2,2,2]T(2,1,0)}",
    "{devices=[2,2]3,2,1,0 last_tile_dim_replicate}",
    "{devices=[2,4]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[2,4]<=[2,2,2]T(2,0,1) last_tile_dim_replicate}",
    "{devices=[2,6]<=[2,3,2]T(1,0,2) last_tile_dim_replicate}",
    "{devices=[2,2,2]7,6,5,4,3,2,1,0 last_tile_dims={manual, replicated}}",
    "{devices=[2,2,2]<=[2,2,2]T(2,1,0) last_tile_dims={replicated, manual}}",
    "{devices=[3,2,2]<=[3,2,2]T(1,2,0) last_tile_dims={replicated, manual}}",
    "{devices=[1,1]<=[1]}",
    "{ replicated }",
    '{devices=[2,2]<=[4] metadata={op_name="a" source_line=3}}',
    "{{replicated}, {maximal device=1}}",
    "{{replicated}, {manual}, {replicated}, {replicated}, {replicated}, {maximal device=1}}",
    "{}",
]


def _jax(text: str):
    return xc.HloSharding.from_string(text)


def _jax_proto(sharding) -> bytes:
    return sharding.to_proto().SerializeToString()


def _jax_from_proto(data: bytes):
    op_sharding = xc.OpSharding()
    op_sharding.ParseFromString(data)
    return xc.HloSharding.from_proto(op_sharding)


def _metadata_free(data: bytes) -> bytes:
    # Our proto leaves metadata (field 7) out; compare jaxlib's bytes without it.
    return _jax_proto(_jax_from_proto(data))


@pytest.mark.parametrize("text", TEXTS)
def test_text_prints_as_xla_prints_it(text):
    ours, theirs = HloSharding.from_string(text), _jax(text)
    assert str(ours) == str(theirs)
    assert HloSharding.from_string(str(ours)) == ours


@pytest.mark.parametrize("text", [t for t in TEXTS if "metadata" not in t])
def test_proto_bytes_match_jaxlib(text):
    ours, theirs = HloSharding.from_string(text), _jax(text)
    assert ours.to_proto() == _jax_proto(theirs)
    assert HloSharding.from_proto(_jax_proto(theirs)) == HloSharding.from_proto(ours.to_proto())
    assert str(_jax_from_proto(ours.to_proto())) == str(_jax_from_proto(_jax_proto(theirs)))


def _random_text(rng: random.Random) -> str:
    def split(n, k):
        dims = [1] * k
        for prime in (2, 2, 2, 2, 3, 3, 5):
            while n % prime == 0:
                dims[rng.randrange(k)] *= prime
                n //= prime
        return dims

    n = rng.choice([2, 4, 6, 8, 12, 16, 24])
    dims = split(n, rng.randint(1, 4))
    joined = ",".join(map(str, dims))
    if rng.random() < 0.6:
        reshape = split(n, rng.randint(1, 4))
        perm = list(range(len(reshape)))
        rng.shuffle(perm)
        tiles = f"devices=[{joined}]<=[{','.join(map(str, reshape))}]"
        if len(reshape) > 1:
            tiles += f"T({','.join(map(str, perm))})"
    else:
        ids = list(range(n))
        rng.shuffle(ids)
        tiles = f"devices=[{joined}]{','.join(map(str, ids))}"
    roll = rng.random()
    if roll < 0.3:
        tiles += " last_tile_dim_replicate"
    elif roll < 0.7:
        types = [rng.choice(["replicated", "manual", "unreduced"])
                 for _ in range(rng.randint(1, len(dims)))]
        tiles += " last_tile_dims={" + ", ".join(types) + "}"
    return "{" + tiles + "}"


def test_random_tile_assignments_match_jaxlib():
    """Text, bytes, proto parsing both ways and every query, over random tilings."""
    rng = random.Random(20240607)
    for _ in range(1500):
        text = _random_text(rng)
        ours, theirs = HloSharding.from_string(text), _jax(text)
        assert str(ours) == str(theirs), text
        assert ours.to_proto() == _jax_proto(theirs), text
        assert str(_jax_from_proto(ours.to_proto())) == str(_jax_from_proto(_jax_proto(theirs)))
        assert str(HloSharding.from_proto(_jax_proto(theirs))) == str(
            _jax_from_proto(_jax_proto(theirs))), text
        for query in ("is_replicated", "is_manual", "is_maximal", "is_tiled"):
            assert getattr(ours, query)() == getattr(theirs, query)(), (text, query)
        if ours.is_tiled():
            assert ours.tile_assignment_dimensions == tuple(theirs.tile_assignment_dimensions())
            assert ours.tile_assignment_devices == tuple(theirs.tile_assignment_devices())
            assert ours.num_devices() == theirs.num_devices()
            assert ours.replicate_on_last_tile_dim() == theirs.replicate_on_last_tile_dim()
            assert [int(t) for t in ours.subgroup_types] == [
                int(t.value) for t in theirs.subgroup_types()]
            assert ours.is_tile_assignment_iota() == theirs.is_tile_assignment_iota()


def _jax_types(types):
    return [xc.OpSharding.Type(int(t)) for t in types]


def test_iota_tile_matches_jaxlib():
    rng = random.Random(7)
    cases = [((2, 4), None, None, ()), ((4, 2), (2, 4), (1, 0), ()),
             ((4, 1, 2), (2, 4), (1, 0), (REPLICATED,)),
             ((2, 2, 2), (2, 2, 2), (0, 2, 1), (REPLICATED, MANUAL))]
    for _ in range(200):
        axes = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
        perm = list(range(len(axes)))
        rng.shuffle(perm)
        ndata = rng.randint(0, len(axes))
        groups = [axes[p] for p in perm]
        dims = groups[:ndata] + ([int(np.prod(groups[ndata:]))] if ndata < len(axes) else [])
        types = (rng.choice([REPLICATED, MANUAL]),) if ndata < len(axes) else ()
        if not dims:
            continue
        cases.append((tuple(dims), tuple(axes), tuple(perm), types))
    for dims, reshape, perm, types in cases:
        ours = HloSharding.iota_tile(dims, reshape, perm, subgroup_types=types)
        theirs = xc.HloSharding.iota_tile(list(dims), list(reshape or []), list(perm or []),
                                          _jax_types(types))
        assert str(ours) == str(theirs), (dims, reshape, perm, types)


def test_tiled_matches_jaxlib_device_ordering():
    rng = np.random.default_rng(3)
    for shape, types in [((2, 4), ()), ((2, 2, 2), (REPLICATED,)), ((4, 2), (MANUAL,)),
                         ((2, 2, 2), (REPLICATED, MANUAL)), ((1, 2, 4), (MANUAL, REPLICATED))]:
        for _ in range(5):
            ids = rng.permutation(8).reshape(shape)
            ours = HloSharding.tiled(ids, subgroup_types=types)
            theirs = xc.HloSharding.subgroup_with_device_ordering(ids.astype(np.int64),
                                                                  _jax_types(types))
            assert str(ours) == str(theirs)


def test_partial_replication_sorts_each_group():
    sharding = HloSharding.tiled(np.array([[3, 2], [1, 0]]), last_tile_dim_replicate=True)
    assert str(sharding) == "{devices=[2,2]2,3,0,1 last_tile_dim_replicate}"
    assert sharding.replicate_on_last_tile_dim() and sharding.subgroup_types == ()


def test_iota_and_explicit_spellings_are_equal():
    iota = HloSharding.from_string("{devices=[2,2]<=[2,2]T(1,0)}")
    listed = HloSharding.from_string("{devices=[2,2]0,2,1,3}")
    assert iota == listed and hash(iota) == hash(listed)
    assert str(iota) != str(listed)
    assert iota.is_tile_assignment_iota() and not listed.is_tile_assignment_iota()
    assert _jax(str(iota)) == _jax(str(listed))
    assert iota != HloSharding.from_string("{devices=[2,2]<=[4]}")
    assert HloSharding.iota_tile((2, 2), (2, 2), (1, 0)) == iota
    assert len({iota, listed, HloSharding.tiled(np.array([[0, 2], [1, 3]]))}) == 1


def test_layouts_that_differ_are_not_equal():
    shardings = [HloSharding.replicate(), HloSharding.manual(), HloSharding.maximal(0),
                 HloSharding.maximal(1), HloSharding.iota_tile((8,)),
                 HloSharding.iota_tile((2, 4)), HloSharding.iota_tile((4, 2)),
                 HloSharding.iota_tile((2, 4), last_tile_dim_replicate=True),
                 HloSharding.iota_tile((2, 4), subgroup_types=(MANUAL,)),
                 HloSharding.tuple_sharding([HloSharding.replicate()])]
    for i, a in enumerate(shardings):
        for j, b in enumerate(shardings):
            assert (a == b) == (i == j), (a, b)
    assert HloSharding.replicate() != "{replicated}"


def test_queries_on_the_simple_kinds_match_jaxlib():
    for ours in (HloSharding.replicate(), HloSharding.manual(), HloSharding.maximal(3)):
        theirs = _jax(str(ours))
        assert ours.is_replicated() == theirs.is_replicated()
        assert ours.is_manual() == theirs.is_manual()
        assert ours.is_maximal() == theirs.is_maximal()   # XLA's IsTileMaximal
        assert ours.is_tiled() == theirs.is_tiled()
        assert ours.num_devices() == theirs.num_devices()
        assert ours.tile_assignment_dimensions == tuple(theirs.tile_assignment_dimensions())
        assert ours.tile_assignment_devices == tuple(theirs.tile_assignment_devices())
    assert HloSharding.maximal(3).unique_device() == 3
    assert HloSharding.replicate().unique_device() is None
    assert HloSharding.replicate().is_maximal()     # as in XLA: no tiling


def test_iota_accessors():
    sharding = HloSharding.iota_tile((4, 1, 2), (2, 4), (1, 0), last_tile_dim_replicate=True)
    assert sharding.iota_reshape_dims == (2, 4) and sharding.iota_transpose_perm == (1, 0)
    assert sharding.tile_assignment_devices == (0, 4, 1, 5, 2, 6, 3, 7)
    assert sharding.tiled_data_rank() == 2
    assert sharding.tile_assignment.shape == (4, 1, 2)
    with pytest.raises(ValueError):
        sharding.tile_assignment[0, 0, 0] = 9


def test_tuple_sharding():
    elements = [HloSharding.replicate()] * 5 + [HloSharding.maximal(1)]
    sharding = HloSharding.tuple_sharding(elements)
    text = str(sharding)
    assert text == str(_jax(text))
    assert "/*index=5*/" in text
    parsed = HloSharding.from_string(text)
    assert parsed.is_tuple() and parsed.tuple_elements() == tuple(elements)
    assert parsed == sharding and HloSharding.from_proto(sharding.to_proto()) == sharding
    assert not sharding.is_replicated()
    assert HloSharding.tuple_sharding([HloSharding.replicate()] * 2).is_replicated()
    with pytest.raises(ValueError, match="tuple"):
        sharding.num_devices()
    with pytest.raises(TypeError):
        HloSharding.tuple_sharding([sharding])


def test_pickle_round_trip():
    for text in ("{replicated}", "{devices=[2,2]0,2,1,3}", "{devices=[4,2]<=[2,4]T(1,0)}"):
        sharding = HloSharding.from_string(text)
        again = pickle.loads(pickle.dumps(sharding))
        assert again == sharding and str(again) == text


def test_immutable_and_not_directly_constructible():
    with pytest.raises(TypeError, match="replicate"):
        HloSharding()
    with pytest.raises(AttributeError):
        HloSharding.replicate().foo = 1


@pytest.mark.parametrize("text", [
    "", "{", "replicated", "{replicated", "{replicated}}", "{bogus}", "{maximal}",
    "{maximal device=1 devices=[2]0,1}", "{devices=[2,2]0,1,2}", "{devices=[2,2]0,1,2,2}",
    "{devices=[2,2]<=[8]}", "{devices=[2,4]<=[2,4]}", "{devices=[2,4]<=[8]T(0)}",
    "{devices=[2,2]<=[2,2]T(0,0)}", "{devices=[1,1]0}", "{devices=[0,2]<=[0]}",
    "{devices=[2,2]<=[4] last_tile_dims={sideways}}", "{replicated manual}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual} last_tile_dim_replicate}",
    "{devices=[2,2]<=[4] shard_as 1}", "{{replicated}, {{manual}}}",
])
def test_malformed_text_is_a_value_error(text):
    with pytest.raises(ValueError, match="invalid sharding"):
        HloSharding.from_string(text)


def test_from_string_needs_a_str():
    with pytest.raises(TypeError):
        HloSharding.from_string(b"{replicated}")


def test_from_proto_normalises_like_xla():
    # A tile assignment of one device reads as replicated (XLA's FromProto).
    one = xc.OpSharding()
    one.type = xc.OpSharding.Type.OTHER
    one.tile_assignment_dimensions = [1]
    one.tile_assignment_devices = [0]
    assert HloSharding.from_proto(one.SerializeToString()) == HloSharding.replicate()
    assert str(xc.HloSharding.from_proto(one)) == "{replicated}"
    # Unpacked repeated fields (as old writers produce) read the same as packed ones.
    from pjrt._wire import protowire as wire
    unpacked = (wire.int_field(1, 3) + wire.int_field(3, 2) + wire.int_field(3, 2)
                + b"".join(wire.int_field(4, d) for d in (0, 2, 1, 3)))
    assert str(HloSharding.from_proto(unpacked)) == "{devices=[2,2]0,2,1,3}"


@pytest.mark.parametrize("text", TEXTS)
def test_from_proto_accepts_an_op_sharding_message(text):
    # jaxlib's xla_client.OpSharding is a protobuf message: from_proto takes it as it is.
    message = _jax(text).to_proto()
    assert not isinstance(message, bytes)
    ours = HloSharding.from_proto(message)
    assert ours == HloSharding.from_proto(message.SerializeToString())
    assert str(ours) == str(xc.HloSharding.from_proto(message))


def test_from_proto_refuses_what_is_neither_bytes_nor_a_message():
    with pytest.raises(TypeError, match="OpSharding"):
        HloSharding.from_proto("{replicated}")

    class Broken:
        def SerializeToString(self):
            return "not bytes"

    with pytest.raises(TypeError, match="SerializeToString"):
        HloSharding.from_proto(Broken())


@pytest.mark.parametrize("data", [
    b"\x08\x63",                        # unknown type
    b"\x08\x01",                        # maximal without a device
    b"\x08\x03\x1a\x02\x02\x02",        # tiled without devices
    b"\x08\x03\x1a\x02\x02\x02\"\x03\x00\x01\x02",   # 3 devices for [2,2]
    b"\x08\x03\x1a\x02\x02\x02J\x01\x04",            # iota without a transpose
    b"\x08\x03\x1a\x02\x02\x02J\x01\x04R\x01\x00X\x01",   # a shard group
    b"\x72\x00",                        # named_sharding (V3)
    b"\x08",                            # truncated
])
def test_malformed_proto_is_a_value_error(data):
    with pytest.raises(ValueError):
        HloSharding.from_proto(data)


def test_constructor_validation():
    with pytest.raises(ValueError, match="more than once"):
        HloSharding.tiled(np.array([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=">= 0"):
        HloSharding.tiled(np.array([0, -1]))
    with pytest.raises(TypeError, match="integer"):
        HloSharding.tiled(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="at least one dimension"):
        HloSharding.tiled(np.array(3))
    with pytest.raises(ValueError, match="not both"):
        HloSharding.tiled(np.arange(4).reshape(2, 2), last_tile_dim_replicate=True,
                          subgroup_types=(MANUAL,))
    with pytest.raises(ValueError, match="subgroup type"):
        HloSharding.tiled(np.arange(4).reshape(2, 2), subgroup_types=(OpShardingType.OTHER,))
    with pytest.raises(ValueError, match="permutation"):
        HloSharding.iota_tile((2, 4), (2, 4), (0, 0))
    with pytest.raises(ValueError, match="hold"):
        HloSharding.iota_tile((2, 4), (2, 2))
    with pytest.raises(ValueError, match=">= 0"):
        HloSharding.maximal(-1)
