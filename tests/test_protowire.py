"""The one protobuf field reader (pjrt._wire.protowire), judged against the real protobuf runtime
where jax brings it along, and by hand-computed bytes."""
from __future__ import annotations

import pytest

from pjrt._wire import protowire as pw


def test_iter_fields_walks_lazily_in_wire_order():
    data = pw.int_field(3, 7) + pw.string_field(1, "a") + pw.int_field(3, 8)
    fields = pw.iter_fields(data)
    assert next(fields) == (3, pw.VARINT, 7)
    assert list(fields) == [(1, pw.LEN, b"a"), (3, pw.VARINT, 8)]
    assert pw.decode(data) == list(pw.iter_fields(data))


def test_iter_fields_reports_malformed_data_where_it_is_reached():
    fields = pw.iter_fields(pw.int_field(1, 1) + b"\x12\x05ab")
    assert next(fields) == (1, pw.VARINT, 1)
    with pytest.raises(ValueError, match="truncated"):
        next(fields)
    with pytest.raises(TypeError, match="bytes"):
        next(pw.iter_fields("text"))


def test_group_fields_keeps_every_occurrence():
    data = (pw.int_field(2, 1) + pw.message_field(5, b"") + pw.int_field(2, 3)
            + pw.packed_varint_field(4, [1, 2]))
    assert pw.group_fields(data) == {2: [1, 3], 5: [b""], 4: [b"\x01\x02"]}


def test_repeated_varints_accept_packed_and_unpacked():
    packed = pw.packed_varint_field(4, [5, 300])
    unpacked = pw.int_field(4, 5) + pw.int_field(4, 300)
    both = pw.group_fields(packed)[4], pw.group_fields(unpacked)[4]
    assert [pw.repeated_varints(x) for x in both] == [[5, 300], [5, 300]]
    assert pw.read_varints(pw.LEN, b"\x05\xac\x02") == [5, 300]
    assert pw.read_varints(pw.VARINT, 9) == [9]
    with pytest.raises(ValueError, match="dims"):
        pw.read_varints(pw.I32, 0, "dims")


def test_expect_wire_type_names_the_field():
    pw.expect_wire_type(pw.LEN, pw.LEN, "x")
    with pytest.raises(ValueError, match=r"Shape\.dims: wire type VARINT, expected LEN"):
        pw.expect_wire_type(pw.VARINT, pw.LEN, "Shape.dims")


def test_to_str_and_signed_conversions():
    assert pw.to_str("hé".encode()) == "hé"
    with pytest.raises(ValueError, match="name"):
        pw.to_str(b"\xff", "name")
    assert pw.to_int64((1 << 64) - 1) == -1
    assert pw.to_int32((1 << 64) - 2) == -2
    assert pw.to_float(int.from_bytes(b"\x00\x00\xc0\x3f", "little")) == 1.5


def test_reader_agrees_with_the_protobuf_runtime():
    # A real OpSharding message built by the protobuf runtime jaxlib ships.
    pytest.importorskip("jax")
    from jax._src.lib import xla_client as xc

    message = xc.OpSharding()
    message.type = xc.OpSharding.Type.OTHER
    message.tile_assignment_dimensions = [2, 300]
    message.tile_assignment_devices = list(range(600))
    message.replicate_on_last_tile_dim = True
    fields = pw.group_fields(message.SerializeToString())
    assert fields[1] == [3]
    assert pw.repeated_varints(fields[3]) == [2, 300]
    assert pw.repeated_varints(fields[4]) == list(range(600))
    assert fields[6] == [1]
    # And the runtime reads what the writer produces.
    ours = (pw.int_field(1, 3) + pw.packed_varint_field(3, [4, 2])
            + pw.packed_varint_field(4, range(8)))
    back = xc.OpSharding()
    back.ParseFromString(ours)
    assert list(back.tile_assignment_dimensions) == [4, 2]
    assert list(back.tile_assignment_devices) == list(range(8))
