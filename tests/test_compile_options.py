"""Tests for pjrt.compile_options and pjrt._wire.protowire.

Three kinds of test:

* Self-contained ones (no jax): hand-computed wire bytes, round trips
  through ``from_serialized``, and the TypeError/ValueError contract.
* Oracle tests against jaxlib's own C++ ``CompileOptions`` (skipped where jax
  is not installed): the same options are built in jaxlib and here, both
  serialisations are decoded with our reader into nested field dicts, and
  the dicts must be equal. jaxlib is also made to *parse* our bytes, and one
  test compiles a program on jaxlib's CPU client with them.
* ``DebugOptions`` as a table generated from XLA's ``xla.proto``: the table is
  well formed and is what scripts/generate-debug-options.py writes, the generator
  reads a proto's shapes and refuses what pjrt cannot carry, a field of each kind
  travels as an override and reads back, and on each CPU plugin the options reach
  XLA (its dump of the DebugOptions it compiled with) and change the program.
"""

from __future__ import annotations

import copy
import enum
import importlib.util
import os
import pickle
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY, child_env, cpu_plugin_path, run_python
from fixtures import programs
from pjrt._wire import debug_options_fields
from pjrt._wire import protowire as pw
from pjrt.compile_options import (
    AutotuneCacheMode,
    CompileOptions,
    DebugOptions,
    DeviceAssignment,
    EffortLevel,
    ExecutableBuildOptions,
)

# ---------------------------------------------------------------------------
# A schema-driven normaliser: bytes -> nested {field_number: value} dicts.
#
# The schema only says how to *interpret* a field (sub-message, packed list,
# map); both our bytes and jaxlib's go through the same normaliser, so any
# difference in field numbers or values shows up as a dict difference.
# Fields not in the schema are kept as raw (wire_type, value) occurrences, so
# an unexpected field on either side also makes the dicts differ.
# ---------------------------------------------------------------------------

MSG, PACKED, MAP, SCALAR = "msg", "packed", "map", "scalar"

OPTION_OVERRIDE = {1: (SCALAR,), 2: (SCALAR,), 3: (SCALAR,), 4: (SCALAR,)}
DEVICE_ASSIGNMENT = {
    1: (SCALAR,),
    2: (SCALAR,),
    3: (MSG, {1: (PACKED,)}),  # ComputationDevice.replica_device_ids
}
BUILD_OPTIONS = {
    9: (MSG, DEVICE_ASSIGNMENT),
    12: (PACKED,),
    16: (PACKED,),
    17: (PACKED,),
    18: (PACKED,),
}
COMPILE_OPTIONS = {
    3: (MSG, BUILD_OPTIONS),
    7: (MAP, OPTION_OVERRIDE),
}
# Field 3 of ExecutableBuildOptionsProto is the DebugOptions message.
BUILD_DEBUG_OPTIONS = 3


def normalise(data: bytes, schema: dict) -> dict:
    """Decode ``data`` into {field: [occurrences]} (maps: {key: value})."""
    out: dict = {}
    for field, wire_type, value in pw.decode(data):
        kind = schema.get(field, (None,))
        if kind[0] == MSG:
            out.setdefault(field, []).append(normalise(value, kind[1]))
        elif kind[0] == PACKED:
            # Packed and unpacked encodings of a repeated scalar are equal.
            items = pw.unpack_varints(value) if wire_type == pw.LEN else [value]
            out.setdefault(field, []).extend(items)
        elif kind[0] == MAP:
            entry = normalise(value, {1: (SCALAR,), 2: (MSG, kind[1])})
            key = entry[1][-1][1] if 1 in entry else b""  # raw key bytes
            out.setdefault(field, {})[key] = entry.get(2, [{}])[-1]
        else:
            out.setdefault(field, []).append((wire_type, value))
    return out


def split_debug_options(norm: dict):
    """Remove and return the raw DebugOptions message jaxlib always writes.

    jaxlib's C++ CompileOptions always carries a complete DebugOptions
    (XLA's defaults, ~900 bytes). We never write that message, on purpose:
    XLA would take it as the *whole* set of debug options (see the
    compile_options module docstring), so we send the options a user set as
    env_option_overrides instead. It is therefore excluded from the
    comparison here, and checked separately below (field numbers in
    test_debug_options_field_numbers_match_jaxlib, behaviour in
    test_jaxlib_compiles_with_our_bytes).
    """
    build = norm[3][-1]
    return build.pop(BUILD_DEBUG_OPTIONS, None)


# ---------------------------------------------------------------------------
# _protowire
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, encoded",
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),  # the example in the protobuf encoding guide
        (2**63 - 1, b"\xff" * 8 + b"\x7f"),
        # Negative ints are 64-bit two's complement: always ten bytes.
        (-1, b"\xff" * 9 + b"\x01"),
        (-(2**63), b"\x80" * 9 + b"\x01"),
    ],
)
def test_varint_encoding(value, encoded):
    assert pw.encode_varint(value) == encoded
    raw, end = pw.decode_varint(encoded)
    assert end == len(encoded)
    assert pw.to_int64(raw) == value


def test_varint_rejects_out_of_range_and_non_int():
    with pytest.raises(ValueError):
        pw.encode_varint(2**64)
    with pytest.raises(ValueError):
        pw.encode_varint(-(2**63) - 1)
    with pytest.raises(TypeError):
        pw.encode_varint(1.0)


def test_decode_every_wire_type():
    data = (
        pw.int_field(1, -5)
        + pw.double_field(2, 2.5)
        + pw.string_field(3, "hé")
        + pw.float_field(4, -0.5)
        + pw.packed_varint_field(5, [1, 300])
        + pw.message_field(6, b"")
    )
    fields = pw.decode(data)
    assert [(f, wt) for f, wt, _ in fields] == [
        (1, pw.VARINT), (2, pw.I64), (3, pw.LEN), (4, pw.I32), (5, pw.LEN), (6, pw.LEN)
    ]
    assert pw.to_int64(fields[0][2]) == -5
    assert pw.to_double(fields[1][2]) == 2.5
    assert fields[2][2].decode() == "hé"
    assert pw.to_float(fields[3][2]) == -0.5
    assert pw.unpack_varints(fields[4][2]) == [1, 300]
    assert fields[5][2] == b""  # a present, empty sub-message is kept


def test_decode_field_keys_by_hand():
    # Key = field_number << 3 | wire_type: field 12, LEN -> 98 = 0x62;
    # field 23, VARINT -> 184 = 0xb8 0x01 (two-byte varint).
    assert pw.tag(12, pw.LEN) == b"\x62"
    assert pw.tag(23, pw.VARINT) == b"\xb8\x01"
    assert pw.decode(b"\x62\x01\x00\xb8\x01\x01") == [(12, 2, b"\x00"), (23, 0, 1)]


@pytest.mark.parametrize(
    "bad",
    [
        b"\x08",              # varint value missing
        b"\x08\x80",          # varint continues past the end
        b"\x12\x05abc",       # length 5, only 3 bytes
        b"\x09\x00\x00",      # fixed64 truncated
        b"\x0d\x00",          # fixed32 truncated
        b"\x0b",              # wire type 3 (start group): unsupported
        b"\x00\x00",          # field number 0
        b"\x08" + b"\xff" * 10 + b"\x01",  # varint longer than 10 bytes
    ],
)
def test_decode_rejects_malformed(bad):
    with pytest.raises(ValueError):
        pw.decode(bad)


def test_decode_rejects_non_bytes():
    with pytest.raises(TypeError):
        pw.decode("not bytes")


def test_tag_rejects_bad_field_numbers():
    for bad in (0, -1, 2**29):
        with pytest.raises(ValueError):
            pw.tag(bad, pw.VARINT)
    with pytest.raises(ValueError):
        pw.tag(1, 3)


# ---------------------------------------------------------------------------
# Hand-computed bytes
# ---------------------------------------------------------------------------

# ExecutableBuildOptionsProto as we write it for all defaults except the
# replica count given, field by field:
#   08 ff ff ff ff ff ff ff ff ff 01   field 1 device_ordinal (VARINT) = -1,
#                                      two's complement in ten bytes
#   20 <n>                             field 4 num_replicas = n
#   28 01                              field 5 num_partitions = 1
#   62 01 00                           field 12 (LEN) allow_spmd_sharding_
#                                      propagation_to_output = packed [false]
#   92 01 01 00                        field 18 (LEN, key 146 = 92 01)
#                                      ..._to_parameters = packed [false]
#   b8 01 01                           field 23 (VARINT, key 184 = b8 01)
#                                      process_count = 1
_BUILD_DEVICE_ORDINAL = b"\x08" + b"\xff" * 9 + b"\x01"
_BUILD_TAIL = b"\x28\x01" + b"\x62\x01\x00" + b"\x92\x01\x01\x00" + b"\xb8\x01\x01"


def test_num_replicas_2_exact_bytes():
    build = _BUILD_DEVICE_ORDINAL + b"\x20\x02" + _BUILD_TAIL
    assert len(build) == 25
    # CompileOptionsProto: field 3 (LEN, key 0x1a), length 25 (0x19).
    expected = b"\x1a\x19" + build
    assert CompileOptions(num_replicas=2).SerializeAsString() == expected
    opts = CompileOptions()
    opts.num_replicas = 2
    assert opts.serialize() == expected


def test_defaults_exact_bytes():
    build = _BUILD_DEVICE_ORDINAL + b"\x20\x01" + _BUILD_TAIL
    assert CompileOptions().SerializeAsString() == b"\x1a\x19" + build


def test_top_level_flags_exact_bytes():
    opts = CompileOptions(parameter_is_tupled_arguments=True, compile_portable_executable=True,
                          profile_version=-2)
    build = _BUILD_DEVICE_ORDINAL + b"\x20\x01" + _BUILD_TAIL
    assert opts.SerializeAsString() == (
        b"\x10\x01"                    # field 2 parameter_is_tupled_arguments
        + b"\x1a\x19" + build          # field 3 executable_build_options
        + b"\x20\x01"                  # field 4 compile_portable_executable
        + b"\x28" + b"\xfe" + b"\xff" * 8 + b"\x01"  # field 5 profile_version -2
    )


@pytest.mark.parametrize(
    "value, override",
    [
        # OptionOverrideProto oneof: string 1, bool 2, int64 3, double 4.
        # A oneof member is written even when it is false/0/"".
        ("on", b"\x0a\x02on"),
        ("", b"\x0a\x00"),
        (True, b"\x10\x01"),
        (False, b"\x10\x00"),
        (7, b"\x18\x07"),
        (0, b"\x18\x00"),
        (-1, b"\x18" + b"\xff" * 9 + b"\x01"),
        (1.5, b"\x21" + struct.pack("<d", 1.5)),
    ],
)
def test_env_override_exact_bytes(value, override):
    opts = CompileOptions(env_option_overrides=[("k", value)])
    data = opts.SerializeAsString()
    # Map entry = {1: key, 2: OptionOverrideProto}; the map is field 7
    # (LEN, key 0x3a) of CompileOptionsProto and comes after field 3.
    entry = b"\x0a\x01k" + b"\x12" + bytes([len(override)]) + override
    assert data.endswith(b"\x3a" + bytes([len(entry)]) + entry)
    assert data.startswith(CompileOptions().SerializeAsString())


def test_device_assignment_exact_bytes():
    # 2 replicas x 3 computations. DeviceAssignmentProto stores columns:
    #   08 02          replica_count = 2
    #   10 03          computation_count = 3
    #   1a 04 0a 02 03 02   computation_devices[0] {replica_device_ids: [3, 2]}
    #   1a 04 0a 02 01 00   computation_devices[1] {[1, 0]}
    #   1a 04 0a 02 05 04   computation_devices[2] {[5, 4]}
    # (jaxlib 0.10.2 writes exactly these bytes for this array.)
    da = DeviceAssignment.create(np.array([[3, 1, 5], [2, 0, 4]]))
    assert da.serialize() == bytes.fromhex("080210031a040a0203021a040a0201001a040a020504")
    assert da.replica_count() == 2 and da.computation_count() == 3
    assert DeviceAssignment.from_serialized(da.serialize()) == da
    assert repr(da) == (
        "DeviceAssignment{replica_count=2, computation_count=3, "
        "Computation0{3 2} Computation1{1 0} Computation2{5 4}}"
    )


def test_build_options_exact_bytes_for_every_field():
    b = ExecutableBuildOptions(
        device_ordinal=3, num_replicas=1, num_partitions=2, use_spmd_partitioning=True,
        use_auto_spmd_partitioning=True, deduplicate_hlo=True,
        device_assignment=DeviceAssignment.create([[4, 6]]),
        alias_passthrough_params=True, run_backend_only=True,
        allow_spmd_sharding_propagation_to_output=[True, False],
        fdo_profile=b"fdo", auto_spmd_partitioning_mesh_shape=[2, 1],
        auto_spmd_partitioning_mesh_ids=[1, 0],
        allow_spmd_sharding_propagation_to_parameters=[True],
        use_shardy_partitioner=True, exec_time_optimization_effort=-0.5,
        memory_fitting_effort=0.25, process_index=1, process_count=2,
        optimization_level=EffortLevel.EFFORT_O2, memory_fitting_level=9,
    )
    da = b"\x08\x01\x10\x02\x1a\x03\x0a\x01\x04\x1a\x03\x0a\x01\x06"
    assert b.serialize() == (
        b"\x08\x03"                        # 1 device_ordinal
        + b"\x20\x01"                      # 4 num_replicas
        + b"\x28\x02"                      # 5 num_partitions
        + b"\x30\x01"                      # 6 use_spmd_partitioning
        + b"\x38\x01"                      # 7 use_auto_spmd_partitioning
        + b"\x40\x01"                      # 8 deduplicate_hlo
        + b"\x4a" + bytes([len(da)]) + da  # 9 device_assignment
        + b"\x50\x01"                      # 10 alias_passthrough_params
        + b"\x58\x01"                      # 11 run_backend_only
        + b"\x62\x02\x01\x00"              # 12 ..._to_output [true, false]
        + b"\x72\x03fdo"                   # 14 fdo_profile
        + b"\x82\x01\x02\x02\x01"          # 16 mesh_shape [2, 1] (key 130)
        + b"\x8a\x01\x02\x01\x00"          # 17 mesh_ids [1, 0] (key 138)
        + b"\x92\x01\x01\x01"              # 18 ..._to_parameters [true]
        + b"\x98\x01\x01"                  # 19 use_shardy_partitioner
        + b"\xa5\x01" + struct.pack("<f", -0.5)  # 20 float (I32, key 165)
        + b"\xad\x01" + struct.pack("<f", 0.25)  # 21 float (key 173)
        + b"\xb0\x01\x01"                  # 22 process_index
        + b"\xb8\x01\x02"                  # 23 process_count
        + b"\xc0\x01\x1d"                  # 24 optimization_level = 29
        + b"\xc8\x01\x09"                  # 25 memory_fitting_level = 9
    )


def test_debug_options_message_exact_bytes():
    d = DebugOptions(xla_dump_to="d", xla_backend_optimization_level=0,
                     xla_disable_hlo_passes=["a", "b"])
    # Field-number order: 30 (key 30<<3|2 = 242 = f2 01) twice, 31 (key 248 =
    # f8 01; the field is `optional`, so an explicit 0 is written), 109 (key
    # 874 = ea 06).
    assert d.serialize() == (
        b"\xf2\x01\x01a" + b"\xf2\x01\x01b" + b"\xf8\x01\x00" + b"\xea\x06\x01d"
    )
    assert DebugOptions.from_serialized(d.serialize()) == d


def test_debug_options_message_exact_bytes_all_fields():
    d = DebugOptions(
        xla_disable_hlo_passes=["p"], xla_backend_optimization_level=2,
        xla_llvm_disable_expensive_passes=True, xla_cpu_enable_fast_math=False,
        xla_dump_to="t", xla_dump_hlo_module_re="m", xla_dump_hlo_pass_re="r",
        xla_dump_hlo_as_text=True, xla_dump_hlo_as_proto=False,
    )
    # Keys are varints of field << 3 | wire type, e.g. 73 << 3 = 584 =
    # 4 * 128 + 72 -> c8 04. Explicitly set false values are written (the
    # DebugOptions scalars are `optional`, i.e. have explicit presence).
    assert d.serialize() == (
        b"\xf2\x01\x01p"      # 30  xla_disable_hlo_passes (LEN)
        + b"\xf8\x01\x02"     # 31  xla_backend_optimization_level
        + b"\xc8\x04\x01"     # 73  xla_llvm_disable_expensive_passes
        + b"\x98\x06\x00"     # 99  xla_cpu_enable_fast_math
        + b"\xea\x06\x01t"    # 109 xla_dump_to (LEN)
        + b"\xf2\x06\x01m"    # 110 xla_dump_hlo_module_re (LEN)
        + b"\xfa\x06\x01r"    # 111 xla_dump_hlo_pass_re (LEN)
        + b"\x80\x07\x01"     # 112 xla_dump_hlo_as_text
        + b"\x88\x07\x00"     # 113 xla_dump_hlo_as_proto
    )
    assert DebugOptions.from_serialized(d.serialize()) == d


def test_debug_options_travel_as_overrides():
    opts = CompileOptions()
    d = opts.executable_build_options.debug_options
    d.xla_dump_to = "/tmp/x"
    d.xla_disable_hlo_passes = ["algsimp", "cse"]
    d.xla_backend_optimization_level = 1
    norm = normalise(opts.SerializeAsString(), COMPILE_OPTIONS)
    # No DebugOptions message inside the build options...
    assert BUILD_DEBUG_OPTIONS not in norm[3][-1]
    # ...but one override per set field, with the types XLA expects.
    assert norm[7] == {
        b"xla_dump_to": {1: [(pw.LEN, b"/tmp/x")]},
        b"xla_disable_hlo_passes": {1: [(pw.LEN, b"algsimp,cse")]},
        b"xla_backend_optimization_level": {3: [(pw.VARINT, 1)]},
    }


# ---------------------------------------------------------------------------
# Round trips (no jax)
# ---------------------------------------------------------------------------


def _round_trip_cases():
    yield CompileOptions()
    yield CompileOptions(num_replicas=2)
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    o = CompileOptions(num_partitions=8, device_assignment=DeviceAssignment.create([perm]))
    o.executable_build_options.use_spmd_partitioning = True
    yield o
    yield CompileOptions(parameter_is_tupled_arguments=True, compile_portable_executable=True,
                         profile_version=12345678901)
    yield CompileOptions(env_option_overrides=[("s", "v"), ("e", ""), ("t", True), ("f", False),
                                               ("i", -3), ("z", 0), ("d", 0.1), ("big", 2**62)])
    b = ExecutableBuildOptions(
        device_ordinal=0, num_replicas=2, num_partitions=2,
        device_assignment=DeviceAssignment.create([[0, 1], [2, 3]]),
        use_auto_spmd_partitioning=True, auto_spmd_partitioning_mesh_shape=[2, 2],
        auto_spmd_partitioning_mesh_ids=[3, 2, 1, 0], deduplicate_hlo=True,
        alias_passthrough_params=True, run_backend_only=True,
        allow_spmd_sharding_propagation_to_parameters=[],
        allow_spmd_sharding_propagation_to_output=[True, False, True],
        use_shardy_partitioner=True, exec_time_optimization_effort=0.1,
        memory_fitting_effort=-1.0, optimization_level=EffortLevel.EFFORT_O3,
        memory_fitting_level=EffortLevel.EFFORT_O0, fdo_profile=b"\x00\xff",
        process_index=3, process_count=4,
    )
    yield CompileOptions(executable_build_options=b)
    d = DebugOptions(xla_backend_optimization_level=0, xla_cpu_enable_fast_math=False,
                     xla_llvm_disable_expensive_passes=True, xla_disable_hlo_passes=[],
                     xla_dump_to="/tmp/dump", xla_dump_hlo_module_re="jit_.*",
                     xla_dump_hlo_pass_re=".*", xla_dump_hlo_as_text=True,
                     xla_dump_hlo_as_proto=False)
    yield CompileOptions(executable_build_options=ExecutableBuildOptions(debug_options=d),
                         env_option_overrides={"xla_cpu_use_xnnpack": False})
    yield CompileOptions(executable_build_options=ExecutableBuildOptions(
        debug_options=DebugOptions(xla_disable_hlo_passes=["a", "b-c"])))


@pytest.mark.parametrize("opts", list(_round_trip_cases()), ids=repr)
def test_round_trip(opts):
    data = opts.SerializeAsString()
    back = CompileOptions.from_serialized(data)
    assert back == opts
    assert back.SerializeAsString() == data
    # Equality is not vacuous: changing anything breaks it.
    back.executable_build_options.num_replicas += 1
    assert back != opts


def test_from_serialized_reports_debug_overrides_back_as_debug_options():
    opts = CompileOptions(env_option_overrides=[("xla_dump_to", "/d"), ("xla_dump_hlo_as_text", 1)])
    back = CompileOptions.from_serialized(opts.SerializeAsString())
    # The str override has the type DebugOptions.xla_dump_to would send, so
    # it is read back there; the int one for a bool field is not, so it
    # stays an override (XLA would reject it, not us).
    assert back.executable_build_options.debug_options.xla_dump_to == "/d"
    assert back.env_option_overrides == [("xla_dump_hlo_as_text", 1)]
    assert back.SerializeAsString() != b""  # and it still serialises


def test_env_overrides_compare_as_a_map():
    a = CompileOptions(env_option_overrides=[("a", 1), ("b", 2)])
    b = CompileOptions(env_option_overrides=[("b", 2), ("a", 1)])
    assert a == b
    assert a != CompileOptions(env_option_overrides=[("a", 1), ("b", 3)])


def test_float_efforts_are_stored_as_float32():
    b = ExecutableBuildOptions(exec_time_optimization_effort=0.1)
    assert b.exec_time_optimization_effort == struct.unpack("<f", struct.pack("<f", 0.1))[0]


def test_from_serialized_strict_and_lenient():
    good = CompileOptions(num_replicas=2).SerializeAsString()
    # target_config (field 8) is not modelled: strict refuses, lenient skips.
    extra = pw.message_field(8, b"") + good
    with pytest.raises(ValueError, match="target_config"):
        CompileOptions.from_serialized(extra)
    assert CompileOptions.from_serialized(extra, strict=False) == CompileOptions(num_replicas=2)
    # An unmodelled field inside the build options (result_layout, 2) is named too.
    build = ExecutableBuildOptions().serialize() + pw.message_field(2, b"")
    with pytest.raises(ValueError, match="result_layout"):
        CompileOptions.from_serialized(pw.message_field(3, build))
    assert CompileOptions.from_serialized(pw.message_field(3, build), strict=False) == (
        CompileOptions())


@pytest.mark.parametrize("strict", [True, False])
def test_from_serialized_reads_a_debug_options_message(strict):
    # A DebugOptions message in the build options (jaxlib always writes one)
    # is accepted in both modes; its modelled fields are read.
    dbg = DebugOptions(xla_dump_to="/x", xla_backend_optimization_level=2).serialize()
    unmodelled = pw.string_field(999, "ignored")  # a field number the table does not have
    build = ExecutableBuildOptions().serialize() + pw.message_field(3, dbg + unmodelled)
    opts = CompileOptions.from_serialized(pw.message_field(3, build), strict=strict)
    assert opts.executable_build_options.debug_options == DebugOptions(
        xla_dump_to="/x", xla_backend_optimization_level=2)


def test_from_serialized_rejects_what_xla_would_misread():
    # No build options at all: XLA would read num_replicas = 0.
    with pytest.raises(ValueError, match="num_replicas"):
        CompileOptions.from_serialized(b"")
    # Wrong wire type for a known field.
    with pytest.raises(ValueError, match="num_replicas"):
        CompileOptions.from_serialized(pw.message_field(3, pw.string_field(4, "x")))
    # An override with no value (XLA: "OptionOverrideProto value not set").
    entry = pw.string_field(1, "k") + pw.message_field(2, b"")
    data = CompileOptions().SerializeAsString() + pw.message_field(7, entry)
    with pytest.raises(ValueError, match="no value"):
        CompileOptions.from_serialized(data)


def test_from_serialized_accepts_unpacked_repeated_fields():
    # Parsers must accept repeated scalars unpacked too.
    build = (pw.int_field(1, -1) + pw.int_field(4, 1) + pw.int_field(5, 1)
             + pw.int_field(16, 4) + pw.int_field(16, 2) + pw.bool_field(12, True))
    opts = CompileOptions.from_serialized(pw.message_field(3, build))
    assert opts.executable_build_options.auto_spmd_partitioning_mesh_shape == [4, 2]
    assert opts.executable_build_options.allow_spmd_sharding_propagation_to_output == [True]
    assert opts.executable_build_options.allow_spmd_sharding_propagation_to_parameters == []


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, attr, value",
    [
        (CompileOptions, "parameter_is_tupled_arguments", 1),
        (CompileOptions, "compile_portable_executable", "yes"),
        (CompileOptions, "profile_version", 1.0),
        (CompileOptions, "profile_version", True),
        (CompileOptions, "executable_build_options", {}),
        (CompileOptions, "env_option_overrides", "a=b"),
        (CompileOptions, "env_option_overrides", [("a",)]),
        (CompileOptions, "env_option_overrides", [(1, "b")]),
        (CompileOptions, "env_option_overrides", [("a", None)]),
        (CompileOptions, "env_option_overrides", [("a", [1])]),
        (CompileOptions, "num_replicas", "2"),
        (CompileOptions, "num_partitions", 2.0),
        (CompileOptions, "device_assignment", np.array([[0]])),
        (ExecutableBuildOptions, "device_ordinal", None),
        (ExecutableBuildOptions, "num_replicas", True),
        (ExecutableBuildOptions, "use_spmd_partitioning", 0),
        (ExecutableBuildOptions, "use_shardy_partitioner", None),
        (ExecutableBuildOptions, "auto_spmd_partitioning_mesh_shape", [2.0]),
        (ExecutableBuildOptions, "auto_spmd_partitioning_mesh_ids", 3),
        (ExecutableBuildOptions, "allow_spmd_sharding_propagation_to_output", [1]),
        (ExecutableBuildOptions, "allow_spmd_sharding_propagation_to_parameters", True),
        (ExecutableBuildOptions, "exec_time_optimization_effort", "0.5"),
        (ExecutableBuildOptions, "memory_fitting_effort", True),
        (ExecutableBuildOptions, "optimization_level", "O2"),
        (ExecutableBuildOptions, "fdo_profile", "text"),
        (ExecutableBuildOptions, "debug_options", None),
        (ExecutableBuildOptions, "device_assignment", [[0, 1]]),
        (DebugOptions, "xla_dump_to", b"/tmp"),
        (DebugOptions, "xla_dump_hlo_as_text", "true"),
        (DebugOptions, "xla_backend_optimization_level", 2.0),
        (DebugOptions, "xla_disable_hlo_passes", "cse"),
        (DebugOptions, "xla_disable_hlo_passes", [1]),
    ],
)
def test_wrong_type_raises_type_error_naming_attribute(make, attr, value):
    obj = make()
    with pytest.raises(TypeError, match=attr):
        setattr(obj, attr, value)
    with pytest.raises(TypeError, match=attr):
        make(**{attr: value})


@pytest.mark.parametrize(
    "make, attr, value",
    [
        (ExecutableBuildOptions, "num_replicas", 0),
        (ExecutableBuildOptions, "num_partitions", -1),
        (CompileOptions, "num_replicas", 0),
        (CompileOptions, "num_partitions", 0),
        (ExecutableBuildOptions, "device_ordinal", -2),
        (ExecutableBuildOptions, "process_count", 0),
        (ExecutableBuildOptions, "process_index", -1),
        (ExecutableBuildOptions, "exec_time_optimization_effort", 1.5),
        (ExecutableBuildOptions, "memory_fitting_effort", float("nan")),
        (ExecutableBuildOptions, "optimization_level", 3),
        (ExecutableBuildOptions, "auto_spmd_partitioning_mesh_shape", [2**63]),
        (CompileOptions, "profile_version", 2**63),
        (CompileOptions, "env_option_overrides", [("a", 1), ("a", 2)]),
        (CompileOptions, "env_option_overrides", [("a", 2**64)]),
        (DebugOptions, "xla_backend_optimization_level", 2**31),
        (DebugOptions, "xla_disable_hlo_passes", ["a,b"]),
        (DebugOptions, "xla_disable_hlo_passes", [""]),
    ],
)
def test_out_of_range_raises_value_error_naming_attribute(make, attr, value):
    with pytest.raises(ValueError, match=attr):
        setattr(make(), attr, value)


def test_device_assignment_shape_mismatch_raises_at_serialise_time():
    opts = CompileOptions(num_partitions=4)
    opts.device_assignment = DeviceAssignment.create(np.arange(8).reshape(1, 8))
    with pytest.raises(ValueError, match=r"num_replicas=1 and num_partitions=4"):
        opts.SerializeAsString()
    opts.num_partitions = 8
    opts.SerializeAsString()  # agrees now
    opts.num_replicas = 2
    with pytest.raises(ValueError, match=r"num_replicas=2 and num_partitions=8"):
        opts.serialize()


def test_in_place_mutation_is_checked_at_serialise_time():
    opts = CompileOptions()
    opts.env_option_overrides.append(("bad", object()))
    with pytest.raises(TypeError, match="env_option_overrides"):
        opts.SerializeAsString()
    opts = CompileOptions()
    opts.executable_build_options.auto_spmd_partitioning_mesh_shape.append("2")
    with pytest.raises(TypeError, match="auto_spmd_partitioning_mesh_shape"):
        opts.SerializeAsString()


def test_debug_option_set_twice_is_an_error():
    opts = CompileOptions(env_option_overrides=[("xla_dump_to", "/a")])
    opts.executable_build_options.debug_options.xla_dump_to = "/b"
    with pytest.raises(ValueError, match="xla_dump_to"):
        opts.SerializeAsString()


def test_process_index_must_be_below_count():
    b = ExecutableBuildOptions(process_index=2, process_count=2)
    with pytest.raises(ValueError, match="process_index"):
        b.serialize()


def test_forwarding_keywords_apply_to_the_given_build_options():
    b = ExecutableBuildOptions(use_spmd_partitioning=True)
    opts = CompileOptions(num_partitions=4, executable_build_options=b)
    assert opts.executable_build_options is b
    assert b.num_partitions == 4 and opts.num_partitions == 4


def test_unknown_attributes_and_kwargs_are_rejected():
    opts = CompileOptions()
    with pytest.raises(AttributeError):
        opts.num_replica = 2  # misspelt: must not be silently ignored
    with pytest.raises(TypeError, match="num_replica"):
        CompileOptions(num_replica=2)


@pytest.mark.parametrize(
    "array, exc",
    [
        ([0, 1], ValueError),                # 1-D
        (np.zeros((1, 2, 1), int), ValueError),
        (np.zeros((0, 2), int), ValueError),  # empty
        ([[0.0, 1.0]], TypeError),           # not integer
        ([[True, False]], TypeError),
        ([[0, -1]], ValueError),             # negative id
    ],
)
def test_device_assignment_create_validation(array, exc):
    with pytest.raises(exc):
        DeviceAssignment.create(array)


def test_device_assignment_is_immutable_and_copied():
    src = np.array([[0, 1]])
    da = DeviceAssignment.create(src)
    src[0, 0] = 9
    assert da.device_ids.tolist() == [[0, 1]]
    ids = da.device_ids
    ids[0, 0] = 7
    assert da.device_ids.tolist() == [[0, 1]]
    with pytest.raises(TypeError):
        DeviceAssignment([[0]])


def test_device_assignment_from_serialized_checks_counts():
    bad = pw.int_field(1, 2) + pw.int_field(2, 1) + pw.message_field(3, pw.packed_varint_field(1, [0]))
    with pytest.raises(ValueError, match="do not match"):
        DeviceAssignment.from_serialized(bad)


# ---------------------------------------------------------------------------
# Oracle: jaxlib's C++ CompileOptions
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xc():
    pytest.importorskip("jax")
    from jax._src.lib import xla_client

    return xla_client


def _permuted_1x8():
    return np.array([[5, 2, 7, 0, 3, 6, 1, 4]], dtype=np.int32)


# Each case: (name, configure_jaxlib(xc, opts), configure_ours(opts)).
ORACLE_CASES = [
    ("defaults", lambda xc, o: None, lambda o: None),
    ("num_replicas=2",
     lambda xc, o: setattr(o, "num_replicas", 2),
     lambda o: setattr(o, "num_replicas", 2)),
    ("spmd_8_partitions_permuted_assignment",
     lambda xc, o: (setattr(o, "num_partitions", 8),
                    setattr(o.executable_build_options, "use_spmd_partitioning", True),
                    setattr(o, "device_assignment", xc.DeviceAssignment.create(_permuted_1x8()))),
     lambda o: (setattr(o, "num_partitions", 8),
                setattr(o.executable_build_options, "use_spmd_partitioning", True),
                setattr(o, "device_assignment", DeviceAssignment.create(_permuted_1x8())))),
    ("2x2_assignment",
     lambda xc, o: (setattr(o, "num_replicas", 2), setattr(o, "num_partitions", 2),
                    setattr(o, "device_assignment",
                            xc.DeviceAssignment.create(np.array([[3, 0], [1, 2]], np.int32)))),
     lambda o: (setattr(o, "num_replicas", 2), setattr(o, "num_partitions", 2),
                setattr(o, "device_assignment", DeviceAssignment.create([[3, 0], [1, 2]])))),
    ("use_shardy_partitioner",
     lambda xc, o: setattr(o.executable_build_options, "use_shardy_partitioner", True),
     lambda o: setattr(o.executable_build_options, "use_shardy_partitioner", True)),
    ("env_option_overrides",
     lambda xc, o: setattr(o, "env_option_overrides", ENV_OVERRIDES),
     lambda o: setattr(o, "env_option_overrides", ENV_OVERRIDES)),
    ("parameter_is_tupled_arguments",
     lambda xc, o: setattr(o, "parameter_is_tupled_arguments", True),
     lambda o: setattr(o, "parameter_is_tupled_arguments", True)),
    ("compile_portable_executable",
     lambda xc, o: setattr(o, "compile_portable_executable", True),
     lambda o: setattr(o, "compile_portable_executable", True)),
    ("profile_version",
     lambda xc, o: setattr(o, "profile_version", 42),
     lambda o: setattr(o, "profile_version", 42)),
    ("build_options_misc",
     lambda xc, o: _set_misc(o.executable_build_options),
     lambda o: _set_misc(o.executable_build_options)),
]

ENV_OVERRIDES = [
    ("xla_dump_to", "/tmp/somewhere"),
    ("xla_some_empty_string", ""),
    ("xla_dump_hlo_as_text", True),
    ("xla_cpu_enable_fast_math", False),
    ("xla_backend_optimization_level", 2),
    ("xla_negative_int", -7),
    ("xla_some_double", 0.375),
]


def _set_misc(b):
    b.use_auto_spmd_partitioning = True
    b.auto_spmd_partitioning_mesh_shape = [2, 4]
    b.auto_spmd_partitioning_mesh_ids = [7, 6, 5, 4, 3, 2, 1, 0]
    b.allow_spmd_sharding_propagation_to_output = [True, False, True]
    b.allow_spmd_sharding_propagation_to_parameters = [False, True]
    b.exec_time_optimization_effort = -0.5
    b.memory_fitting_effort = 0.25
    b.optimization_level = 29
    b.memory_fitting_level = 9
    b.fdo_profile = b"profile-bytes"


@pytest.mark.parametrize("name, jax_setup, our_setup", ORACLE_CASES, ids=[c[0] for c in ORACLE_CASES])
def test_matches_jaxlib(xc, name, jax_setup, our_setup):
    theirs = xc.CompileOptions()
    jax_setup(xc, theirs)
    ours = CompileOptions()
    our_setup(ours)

    their_norm = normalise(theirs.SerializeAsString(), COMPILE_OPTIONS)
    our_norm = normalise(ours.SerializeAsString(), COMPILE_OPTIONS)
    their_debug = split_debug_options(their_norm)
    assert their_debug is not None  # jaxlib always writes it (see helper)
    assert split_debug_options(our_norm) is None  # we never do
    assert our_norm == their_norm


def test_matches_jaxlib_for_debug_options(xc):
    # Ours: typed DebugOptions. jaxlib: the equivalent env_option_overrides
    # (how jax itself passes per-jit compiler options).
    values = {
        "xla_backend_optimization_level": 1,
        "xla_cpu_enable_fast_math": True,
        "xla_llvm_disable_expensive_passes": True,
        "xla_disable_hlo_passes": ["algsimp", "cse"],
        "xla_dump_to": "/tmp/dump",
        "xla_dump_hlo_module_re": "jit_f.*",
        "xla_dump_hlo_pass_re": ".*",
        "xla_dump_hlo_as_text": True,
        "xla_dump_hlo_as_proto": False,
    }
    ours = CompileOptions()
    for k, v in values.items():
        setattr(ours.executable_build_options.debug_options, k, v)
    theirs = xc.CompileOptions()
    theirs.env_option_overrides = [
        (k, ",".join(v) if isinstance(v, list) else v) for k, v in values.items()
    ]
    their_norm = normalise(theirs.SerializeAsString(), COMPILE_OPTIONS)
    our_norm = normalise(ours.SerializeAsString(), COMPILE_OPTIONS)
    split_debug_options(their_norm)
    assert our_norm == their_norm
    assert len(our_norm[7]) == len(values)


def _jaxlib_debug_blob(xc, name=None, value=None) -> dict:
    opts = xc.CompileOptions()
    if name is not None:
        setattr(opts.executable_build_options.debug_options, name, value)
    norm = normalise(opts.SerializeAsString(), COMPILE_OPTIONS)
    (_, blob), = split_debug_options(norm)
    return normalise(blob, {})


@pytest.mark.parametrize(
    "name, value, jax_value",
    [
        ("xla_backend_optimization_level", 1, 1),
        ("xla_cpu_enable_fast_math", True, True),
        ("xla_llvm_disable_expensive_passes", True, True),
        ("xla_disable_hlo_passes", ["p1", "p2"], "p1,p2"),
        ("xla_dump_to", "/tmp/d", "/tmp/d"),
        ("xla_dump_hlo_module_re", "m.*", "m.*"),
        ("xla_dump_hlo_pass_re", "p.*", "p.*"),
        ("xla_dump_hlo_as_text", True, True),
        ("xla_dump_hlo_as_proto", True, True),
    ],
)
def test_debug_options_field_numbers_match_jaxlib(xc, name, value, jax_value):
    # Setting one field in jaxlib's DebugOptions changes exactly the field
    # our DebugOptions.serialize() writes, to the same encoded value.
    ours = normalise(DebugOptions(**{name: value}).serialize(), {})
    (number,) = ours
    default = _jaxlib_debug_blob(xc)
    changed = _jaxlib_debug_blob(xc, name, jax_value)
    assert changed[number] == ours[number]
    assert default.get(number) != ours[number]
    assert {k: v for k, v in changed.items() if k != number} == {
        k: v for k, v in default.items() if k != number
    }


@pytest.mark.parametrize("opts", list(_round_trip_cases()), ids=repr)
def test_jaxlib_parses_our_bytes(xc, opts):
    # jaxlib's C++ parser reads our message; what it writes back (its
    # ToProto of what it understood) equals what we wrote, apart from the
    # DebugOptions message it always adds.
    ours = opts.SerializeAsString()
    parsed = xc.CompileOptions.ParseFromString(ours)
    assert parsed.num_replicas == opts.num_replicas
    assert parsed.num_partitions == opts.num_partitions
    b, pb = opts.executable_build_options, parsed.executable_build_options
    assert pb.use_spmd_partitioning == b.use_spmd_partitioning
    assert pb.use_shardy_partitioner == b.use_shardy_partitioner
    assert pb.use_auto_spmd_partitioning == b.use_auto_spmd_partitioning
    assert list(pb.auto_spmd_partitioning_mesh_shape) == b.auto_spmd_partitioning_mesh_shape
    assert list(pb.auto_spmd_partitioning_mesh_ids) == b.auto_spmd_partitioning_mesh_ids
    assert pb.exec_time_optimization_effort == b.exec_time_optimization_effort
    assert pb.memory_fitting_effort == b.memory_fitting_effort
    assert pb.optimization_level == b.optimization_level
    assert pb.memory_fitting_level == b.memory_fitting_level
    assert bytes(pb.fdo_profile) == b.fdo_profile
    assert parsed.parameter_is_tupled_arguments == opts.parameter_is_tupled_arguments
    assert parsed.compile_portable_executable == opts.compile_portable_executable
    assert parsed.profile_version == opts.profile_version
    if b.device_assignment is None:
        assert parsed.device_assignment is None
    else:
        assert repr(parsed.device_assignment) == repr(b.device_assignment)
    expected_overrides = dict(b.debug_options.to_option_overrides() + opts.env_option_overrides)
    assert dict(parsed.env_option_overrides) == expected_overrides
    # The untouched debug options are XLA's defaults, not zeros.
    assert pb.debug_options.xla_backend_optimization_level == 3

    back = normalise(parsed.SerializeAsString(), COMPILE_OPTIONS)
    split_debug_options(back)
    mine = normalise(ours, COMPILE_OPTIONS)
    # proto3: a zero scalar and an absent one are the same value. We always
    # write device_ordinal (XLA's "unset" is -1, not 0), so when it is 0
    # jaxlib's writer drops it; compare with that one equivalence applied.
    if b.device_ordinal == 0:
        assert mine[3][-1].pop(1) == [(pw.VARINT, 0)]
        assert 1 not in back[3][-1]
    assert back == mine
    # And our reader reads jaxlib's re-serialisation (lenient: it carries
    # the DebugOptions message) to the same modelled values, apart from
    # debug options, which the message then holds as XLA's defaults.
    lenient = CompileOptions.from_serialized(parsed.SerializeAsString(), strict=False)
    lenient.executable_build_options.debug_options = b.debug_options
    assert lenient == opts


@pytest.mark.parametrize("name, jax_setup, our_setup", ORACLE_CASES, ids=[c[0] for c in ORACLE_CASES])
def test_reads_what_jaxlib_writes(xc, name, jax_setup, our_setup):
    # jaxlib's bytes (with the complete DebugOptions message it always
    # writes) parse with the default strict=True, to the options we would
    # build ourselves, apart from the debug options read out of that message.
    theirs = xc.CompileOptions()
    jax_setup(xc, theirs)
    ours = CompileOptions()
    our_setup(ours)
    parsed = CompileOptions.ParseFromString(theirs.SerializeAsString())
    debug = parsed.executable_build_options.debug_options
    # Every override jaxlib sent is there, read back as a debug option or not...
    carried = dict(debug.to_option_overrides() + parsed.env_option_overrides)
    for key, value in ours.env_option_overrides:
        assert carried[key] == value and type(carried[key]) is type(value), key
    # ...and the message's own modelled fields are XLA's defaults.
    if not ours.env_option_overrides:
        assert debug.xla_backend_optimization_level == 3
    parsed.executable_build_options.debug_options = DebugOptions()
    parsed.env_option_overrides = ours.env_option_overrides
    assert parsed == ours


def test_an_override_beats_the_debug_options_message():
    # XLA applies overrides on top of the DebugOptions message; an override
    # that cannot be read back as a typed debug option (an int for a bool
    # field) must still win over the message's value, not clash with it.
    dbg = DebugOptions(xla_dump_hlo_as_text=False, xla_dump_to="/m").serialize()
    build = ExecutableBuildOptions().serialize() + pw.message_field(3, dbg)
    entry = pw.string_field(1, "xla_dump_hlo_as_text") + pw.message_field(2, pw.int_field(3, 1))
    data = pw.message_field(3, build) + pw.message_field(7, entry)
    opts = CompileOptions.from_serialized(data)
    assert opts.executable_build_options.debug_options == DebugOptions(xla_dump_to="/m")
    assert opts.env_option_overrides == [("xla_dump_hlo_as_text", 1)]
    assert dict(normalise(opts.SerializeAsString(), COMPILE_OPTIONS)[7]) == {
        b"xla_dump_to": {1: [(pw.LEN, b"/m")]},
        b"xla_dump_hlo_as_text": {3: [(pw.VARINT, 1)]},
    }


def test_jaxlib_compiles_with_our_bytes(xc, tmp_path):
    # End to end: XLA's CompileOptions::ApplyAllOptionOverrides accepts the
    # override types our DebugOptions sends, and they take effect.
    import jax
    import jax.numpy as jnp
    from jax._src import xla_bridge

    backend = xla_bridge.get_backend("cpu")
    module = jax.jit(lambda x: x * 2.0 + 1.0).lower(jnp.ones((4,), jnp.float32)).as_text()
    opts = CompileOptions()
    d = opts.executable_build_options.debug_options
    d.xla_dump_to = str(tmp_path)
    d.xla_dump_hlo_as_text = True
    d.xla_dump_hlo_as_proto = False
    d.xla_backend_optimization_level = 2
    d.xla_llvm_disable_expensive_passes = True
    d.xla_cpu_enable_fast_math = False
    d.xla_disable_hlo_passes = ["algsimp"]
    d.xla_dump_hlo_module_re = ".*"
    parsed = xc.CompileOptions.ParseFromString(opts.SerializeAsString())
    devices = xc.DeviceList(tuple(backend.devices()[:1]))
    executable = backend.compile_and_load(module, devices, parsed)
    assert executable is not None
    dumped = os.listdir(tmp_path)
    assert any(name.endswith(".txt") for name in dumped), dumped


# ---------------------------------------------------------------------------
# DebugOptions: every field of XLA's message, from the generated table
# ---------------------------------------------------------------------------

GENERATOR_PATH = Path(__file__).resolve().parents[1] / "scripts" / "generate-debug-options.py"
TABLE_PATH = Path(debug_options_fields.__file__)

#: The wire type of one value of each type the table may hold.
TABLE_TYPES = {"bool": pw.VARINT, "int32": pw.VARINT, "int64": pw.VARINT, "enum": pw.VARINT,
               "float": pw.I32, "double": pw.I64, "string": pw.LEN, "message": pw.LEN,
               "map<string, string>": pw.LEN}
REPEATABLE_TYPES = {"bool", "int32", "int64", "enum", "string"}


@pytest.fixture(scope="module")
def generator():
    """scripts/generate-debug-options.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("generate_debug_options", GENERATOR_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple and dataclass machinery look the module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_debug_options_table_is_well_formed():
    rows = debug_options_fields.FIELDS
    assert len(rows) > 200  # the whole message, not a hand-picked subset
    names = [row[0] for row in rows]
    numbers = [row[1] for row in rows]
    assert len(set(names)) == len(names) and all(name.isidentifier() for name in names)
    assert len(set(numbers)) == len(numbers)
    assert numbers == sorted(numbers)
    assert all(1 <= n < 1 << 29 and not 19000 <= n <= 19999 for n in numbers)
    for name, number, type_, wire_type, repeated, enum_type in rows:
        assert TABLE_TYPES[type_] == wire_type, name
        assert not repeated or type_ in REPEATABLE_TYPES, name
        if type_ == "enum":
            assert enum_type is debug_options_fields.ENUMS[enum_type.__name__], name
        else:
            assert enum_type is None, name
    used = {row[5] for row in rows if row[5] is not None}
    assert used == set(debug_options_fields.ENUMS.values())
    assert set(debug_options_fields.ENUMS) == set(debug_options_fields.ENUM_VALUES)
    for enum_name, values in debug_options_fields.ENUM_VALUES.items():
        enum_type = debug_options_fields.ENUMS[enum_name]
        assert issubclass(enum_type, enum.IntEnum)
        assert [member.value for member in enum_type] == [number for _, number in values]
    repository, path, commit = debug_options_fields.SOURCE
    assert (repository, path) == ("openxla/xla", "xla/xla.proto")
    assert re.fullmatch(r"[0-9a-f]{40}", commit)


def test_debug_options_table_file_is_what_the_generator_writes(generator):
    # The committed file is the generator's rendering of its own table, byte for byte: not
    # edited by hand. (The proto it was read from is not kept here; regenerating from a copy
    # of it is the command in the file's header, with --check.)
    text = TABLE_PATH.read_text()
    assert text.startswith('"""') and "GENERATED by scripts/generate-debug-options.py" in text
    commit = debug_options_fields.SOURCE[2]
    assert f"generate-debug-options.py PATH/TO/xla/xla.proto \\\n        --commit {commit}" in text
    rows = tuple(generator.Row(name, number, type_, wire, repeated,
                               enum_type.__name__ if enum_type else None)
                 for name, number, type_, wire, repeated, enum_type in debug_options_fields.FIELDS)
    table = generator.Table(rows, dict(debug_options_fields.ENUM_VALUES),
                            dict(debug_options_fields.RANGES))
    assert generator.render(table, commit) == text
    # The ranges are the generator's own, checked against the fields they name.
    assert generator.check_ranges(rows, generator.RANGES) == debug_options_fields.RANGES


def test_the_generator_refuses_a_range_it_cannot_hold(generator):
    rows = (generator.Row("xla_count", 1, "int32", pw.VARINT, False, None),
            generator.Row("xla_names", 2, "string", pw.LEN, True, None))
    assert generator.check_ranges(rows, {"xla_count": (1, 8, "why")}) == {
        "xla_count": (1, 8, "why")}
    # A field the proto no longer has loses its range (the script says so).
    assert generator.check_ranges(rows, {"xla_gone": (1, 8, "why")}) == {}
    assert generator.missing_ranges(rows, {"xla_gone": (1, 8, "why")}) == ["xla_gone"]
    for ranges, said in [
        ({"xla_names": (1, 8, "why")}, "a repeated string field"),
        ({"xla_count": (8, 1, "why")}, "does not fit an int32"),
        ({"xla_count": (0, 2**31, "why")}, "does not fit an int32"),
        ({"xla_count": (1, 8, "")}, "says no why"),
    ]:
        with pytest.raises(generator.GenerationError, match=re.escape(said)):
            generator.check_ranges(rows, ranges)


SMALL_PROTO = '''
syntax = "proto3";
package xla;
import "xla/xla_data.proto";  // a comment with // inside

message Other { message Inner { int32 a = 1; } enum Unused { U = 0; } }

enum TopLevelMode {
  TOP_LEVEL_MODE_OFF = 0;
  TOP_LEVEL_MODE_ON = 1 [deprecated = true];
}

/* A block comment: message DebugOptions { bool not_a_field = 9; } */
message DebugOptions {
  enum CacheMode {
    CACHE_MODE_UNSPECIFIED = 0;
    CACHE_MODE_READ = 2;
  }
  enum Plain { FIRST = 0; SECOND = 1; }
  message Filter { repeated string regexes = 1; }

  optional bool
      xla_flag = 7 [deprecated = true];  // "a string in a comment"
  int32 xla_small = 3;
  optional int64 xla_big = 4;
  float xla_ratio = 5;
  double xla_precise = 6;
  string xla_path = 8;
  optional CacheMode xla_cache_mode = 10;
  DebugOptions.Plain xla_plain = 11;
  repeated Plain xla_plains = 12;
  repeated string xla_passes = 13;
  TopLevelMode xla_top = 14;
  Filter xla_filter = 15;
  repeated other.Backend xla_backends = 16;
  map<string, string> xla_extra = 500;
  oneof choice { bool xla_one = 17; }
  reserved 1, 2;
  reserved "xla_gone";
}

message ExecutionOptions { DebugOptions debug_options = 4; uint64 seed = 3; }
'''


def test_generator_reads_the_shapes_of_a_proto(generator):
    table = generator.build_table(SMALL_PROTO, external_enums=["other.Backend"])
    rows = {row.name: tuple(row[1:]) for row in table.rows}
    assert rows == {
        "xla_small": (3, "int32", 0, False, None),
        "xla_big": (4, "int64", 0, False, None),
        "xla_ratio": (5, "float", 5, False, None),
        "xla_precise": (6, "double", 1, False, None),
        "xla_flag": (7, "bool", 0, False, None),
        "xla_path": (8, "string", 2, False, None),
        "xla_cache_mode": (10, "enum", 0, False, "CacheMode"),
        "xla_plain": (11, "enum", 0, False, "Plain"),
        "xla_plains": (12, "enum", 0, True, "Plain"),
        "xla_passes": (13, "string", 2, True, None),
        "xla_top": (14, "enum", 0, False, "TopLevelMode"),
        "xla_filter": (15, "message", 2, False, None),
        "xla_backends": (16, "enum", 0, True, None),  # values unknown: another file's enum
        "xla_one": (17, "bool", 0, False, None),
        "xla_extra": (500, "map<string, string>", 2, False, None),
    }
    assert [row.number for row in table.rows] == sorted(row.number for row in table.rows)
    assert table.enums == {"CacheMode": (("CACHE_MODE_UNSPECIFIED", 0), ("CACHE_MODE_READ", 2)),
                           "Plain": (("FIRST", 0), ("SECOND", 1)),
                           "TopLevelMode": (("TOP_LEVEL_MODE_OFF", 0), ("TOP_LEVEL_MODE_ON", 1))}
    # The rendered module runs, and its enums drop the prefix every value carries.
    namespace: dict = {}
    exec(compile(generator.render(table, "0" * 40), "<generated>", "exec"), namespace)
    assert [m.name for m in namespace["CacheMode"]] == ["UNSPECIFIED", "READ"]
    assert [m.name for m in namespace["Plain"]] == ["FIRST", "SECOND"]
    assert [m.name for m in namespace["TopLevelMode"]] == ["OFF", "ON"]
    assert namespace["FIELDS"][6] == ("xla_cache_mode", 10, "enum", 0, False,
                                      namespace["CacheMode"])
    assert namespace["SOURCE"] == ("openxla/xla", "xla/xla.proto", "0" * 40)


@pytest.mark.parametrize(
    "declaration, words",
    [
        ("bool xla_a = 1; bool xla_b = 1;", "share the number 1"),
        ("bool xla_a = 1; int32 xla_a = 2;", "declared twice"),
        ("uint64 xla_a = 1;", "uint64 is not a shape pjrt carries"),
        ("repeated float xla_a = 1;", "repeated float is not a shape pjrt carries"),
        ("map<string, int64> xla_a = 1;", "map<string, int64> is not a shape"),
        ("Unknown xla_a = 1;", "--enum Unknown or --message Unknown"),
        ("bool xla_a = 1", "expected ';'"),
    ],
)
def test_generator_refuses_what_pjrt_cannot_carry(generator, declaration, words):
    with pytest.raises(generator.GenerationError, match=re.escape(words)):
        generator.build_table(f"syntax = 'proto3'; message DebugOptions {{ {declaration} }}")


def test_generator_check_mode_and_errors(generator, tmp_path, capsys):
    proto = tmp_path / "xla.proto"
    proto.write_text(SMALL_PROTO)
    out = tmp_path / "fields.py"
    args = [str(proto), "--commit", "ab" * 20, "--output", str(out), "--enum", "other.Backend"]
    assert generator.main(args) == 0
    assert generator.main(args + ["--check"]) == 0
    out.write_text(out.read_text() + "# edited\n")
    assert generator.main(args + ["--check"]) == 1
    assert "run without --check" in capsys.readouterr().err
    # Without saying what other.Backend is, the script stops and says how.
    assert generator.main(args[:-2]) == 2
    assert "--enum other.Backend" in capsys.readouterr().err
    proto.write_text("message Other {}")
    assert generator.main(args) == 2
    assert "no top-level message DebugOptions" in capsys.readouterr().err


def test_every_table_field_is_an_attribute_unset_by_default():
    d = DebugOptions()
    for name, *_ in debug_options_fields.FIELDS:
        assert getattr(d, name) is None, name
    assert d.serialize() == b"" and d.to_option_overrides() == []
    for name, enum_type in debug_options_fields.ENUMS.items():
        assert getattr(DebugOptions, name) is enum_type
    assert AutotuneCacheMode is DebugOptions.AutotuneCacheMode
    assert [m.name for m in AutotuneCacheMode] == ["UNSPECIFIED", "UPDATE", "READ"]


Cmd = DebugOptions.CommandBufferCmdType

# (field, value set, value read back, the override sent, the field in DebugOptions' message).
DEBUG_OPTION_KINDS = [
    ("xla_hlo_profile", True, True, True, b"\x48\x01"),  # bool, field 9
    ("xla_gpu_autotune_level", -2, -2, -2,  # int32, field 123: negative, ten bytes
     b"\xd8\x07" + b"\xfe" + b"\xff" * 8 + b"\x01"),
    ("xla_gpu_all_reduce_combine_threshold_bytes", 5_000_000_000, 5_000_000_000,
     5_000_000_000, b"\xe8\x09\x80\xe4\x97\xd0\x12"),  # int64 past int32, field 157
    ("xla_gpu_autotune_gemm_rtol", 0.25, 0.25, "0.25",  # float (I32), field 316; as text
     b"\xe5\x13\x00\x00\x80\x3e"),
    ("xla_gpu_autotune_gemm_rtol", 0.0, 0.0, "0.0", b"\xe5\x13\x00\x00\x00\x00"),
    ("xla_gpu_kernel_cache_file", "/foo/bar", "/foo/bar", "/foo/bar",  # string, field 306
     b"\x92\x13\x08/foo/bar"),
    ("xla_gpu_experimental_autotune_cache_mode", AutotuneCacheMode.READ,  # enum, field 324
     AutotuneCacheMode.READ, 2, b"\xa0\x14\x02"),
    ("xla_gpu_experimental_autotune_cache_mode", 1, AutotuneCacheMode.UPDATE, 1,  # its int
     b"\xa0\x14\x01"),
    ("xla_gpu_enable_command_buffer", [Cmd.FUSION, 2], [Cmd.FUSION, Cmd.CUBLAS], "1,2",
     b"\x92\x10\x02\x01\x02"),  # repeated enum, field 258, packed
    ("xla_gpu_ptx_file", ("a.ptx", "b.ptx"), ["a.ptx", "b.ptx"], "a.ptx,b.ptx",
     b"\xfa\x07\x05a.ptx" + b"\xfa\x07\x05b.ptx"),  # repeated string, field 127
    ("xla_gpu_enable_command_buffer", [], [], "", b""),  # set and empty: clears XLA's list
]


@pytest.mark.parametrize("name, value, stored, override, message", DEBUG_OPTION_KINDS,
                         ids=[f"{c[0]}={c[1]!r}" for c in DEBUG_OPTION_KINDS])
def test_debug_option_of_each_kind_travels_and_reads_back(name, value, stored, override,
                                                          message):
    opts = CompileOptions()
    setattr(opts.executable_build_options.debug_options, name, value)
    read = getattr(opts.executable_build_options.debug_options, name)
    assert read == stored and type(read) is type(stored)
    if isinstance(stored, list):
        assert [type(item) for item in read] == [type(item) for item in stored]
    # Sent as one override of the type XLA's ApplyOption takes for that field...
    data = opts.SerializeAsString()
    (entry,) = normalise(data, COMPILE_OPTIONS)[7].items()
    kind = {bool: 2, str: 1, int: 3}[type(override)]
    raw = override.encode() if isinstance(override, str) else int(override)
    if isinstance(override, int) and override < 0:
        raw += 1 << 64
    assert entry == (name.encode(), {kind: [(pw.LEN if kind == 1 else pw.VARINT, raw)]})
    # ...read back into the same field, with nothing left over, and written again the same.
    back = CompileOptions.ParseFromString(data)
    again = getattr(back.executable_build_options.debug_options, name)
    assert again == stored and type(again) is type(stored)
    assert back.env_option_overrides == [] and back == opts
    assert back.SerializeAsString() == data
    # The message form: the field's own wire encoding, and back.
    d = DebugOptions(**{name: value})
    assert d.serialize() == message
    # (A list has no presence in a message: an empty one reads back unset.)
    assert DebugOptions.from_serialized(message) == (d if message else DebugOptions())


def test_map_and_message_fields_live_in_the_message_form_only():
    d = DebugOptions(xla_backend_extra_options={"k": "v"})
    entry = pw.string_field(1, "k") + pw.string_field(2, "v")
    assert d.serialize() == pw.message_field(500, entry)
    assert DebugOptions.from_serialized(d.serialize()).xla_backend_extra_options == {"k": "v"}
    # XLA's overrides cannot carry a map ("is not a valid message value"): refused here,
    # naming the field and where it can be set instead.
    opts = CompileOptions(executable_build_options=ExecutableBuildOptions(debug_options=d))
    with pytest.raises(ValueError, match=r"xla_backend_extra_options .*XLA_FLAGS"):
        opts.SerializeAsString()
    d.xla_backend_extra_options = None  # unset again: nothing to send
    assert normalise(opts.SerializeAsString(), COMPILE_OPTIONS).get(7) is None


def test_enum_values_the_table_does_not_name_are_kept_as_numbers():
    # proto3 enums are open: a newer XLA's value read from its message is kept.
    d = DebugOptions.from_serialized(pw.int_field(324, 7))
    assert d.xla_gpu_experimental_autotune_cache_mode == 7
    assert type(d.xla_gpu_experimental_autotune_cache_mode) is int
    assert d.to_option_overrides() == [("xla_gpu_experimental_autotune_cache_mode", 7)]


def test_an_override_is_taken_back_only_if_it_would_be_written_the_same():
    overrides = [("xla_gpu_autotune_gemm_rtol", "0.1"),  # ours would be "0.10000000149011612"
                 ("xla_gpu_experimental_autotune_cache_mode", "READ"),  # ours is 2
                 ("xla_gpu_enable_command_buffer", "FUSION"),  # ours is "1"
                 ("xla_hlo_profile", "True")]  # ours is the bool
    opts = CompileOptions.ParseFromString(
        CompileOptions(env_option_overrides=overrides).SerializeAsString())
    assert opts.executable_build_options.debug_options == DebugOptions()
    assert sorted(opts.env_option_overrides) == sorted(overrides)


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("xla_gpu_experimental_autotune_cache_mode", "READ", TypeError),
        ("xla_gpu_experimental_autotune_cache_mode", Cmd.FUSION, TypeError),  # another enum
        ("xla_gpu_experimental_autotune_cache_mode", 2**31, ValueError),
        ("xla_gpu_autotune_gemm_rtol", "0.1", TypeError),
        ("xla_gpu_autotune_gemm_rtol", True, TypeError),
        ("xla_gpu_autotune_gemm_rtol", 1e39, ValueError),  # past single precision
        ("xla_gpu_all_reduce_combine_threshold_bytes", 2**63, ValueError),
        ("xla_gpu_all_reduce_combine_threshold_bytes", 1.0, TypeError),
        ("xla_gpu_enable_command_buffer", ["FUSION"], TypeError),
        ("xla_gpu_enable_command_buffer", Cmd.FUSION, TypeError),  # not a list
        ("xla_gpu_ptx_file", ["a,b"], ValueError),
        ("xla_backend_extra_options", {"k": 1}, TypeError),
        ("xla_backend_extra_options", "k=v", TypeError),
    ],
)
def test_debug_option_refuses_a_wrong_value_naming_the_field(name, value, error):
    d = DebugOptions()
    with pytest.raises(error, match=name):
        setattr(d, name, value)
    assert getattr(d, name) is None  # nothing half-set


def test_unknown_debug_option_names_are_refused_with_a_suggestion():
    d = DebugOptions()
    with pytest.raises(AttributeError, match=r"'xla_dump_too' \(did you mean 'xla_dump_to'\?\)"):
        d.xla_dump_too = "/tmp"
    with pytest.raises(AttributeError, match="env_option_overrides"):
        d.xla_some_newer_option  # noqa: B018
    with pytest.raises(TypeError, match="xla_dump_too"):
        DebugOptions(xla_dump_too="/tmp")


SPLIT_COUNT = "xla_cpu_parallel_codegen_split_count"


@pytest.mark.parametrize("value", [-1, 0, 2**31 - 1, 65537])
def test_a_debug_option_value_xla_aborts_on_is_refused_naming_the_field(value):
    said = (rf"{SPLIT_COUNT} must be from 1 to 65536, not {value}: the number of parts "
            rf"XLA:CPU splits .*isolate=True \(or PJRT_ISOLATED_COMPILE=1\)")
    d = DebugOptions()
    with pytest.raises(ValueError, match=said):
        setattr(d, SPLIT_COUNT, value)
    assert getattr(d, SPLIT_COUNT) is None
    with pytest.raises(ValueError, match=said):
        DebugOptions(**{SPLIT_COUNT: value})
    # As an option override too, as a number or as the text XLA would parse.
    for override in (value, str(value)):
        with pytest.raises(ValueError, match=rf"env_option_overrides\['{SPLIT_COUNT}'\] must "
                                             rf"be from 1 to 65536, not {value}"):
            CompileOptions(env_option_overrides=[(SPLIT_COUNT, override)])


def test_the_edges_of_a_valid_range_are_taken():
    for value in (1, 32, 65536):
        d = DebugOptions(**{SPLIT_COUNT: value})
        assert getattr(d, SPLIT_COUNT) == value
        assert CompileOptions(env_option_overrides=[(SPLIT_COUNT, value)]).env_option_overrides \
            == [(SPLIT_COUNT, value)]


def test_every_range_names_an_integer_field_of_the_table():
    types = {row[0]: (row[2], row[4]) for row in debug_options_fields.FIELDS}
    assert SPLIT_COUNT in debug_options_fields.RANGES
    for name, (lowest, highest, why) in debug_options_fields.RANGES.items():
        assert types[name] in (("int32", False), ("int64", False)), name
        assert lowest <= highest and why


@pytest.mark.parametrize("value", [1, 32])
def test_valid_split_counts_still_compile_and_run(client, value):
    executable = _compile_tiny(client, DebugOptions(**{SPLIT_COUNT: value}))
    ones = client.buffer_from_pyval(np.ones(8, np.float32), client.devices()[0])
    result = np.asarray(executable.execute([ones, ones])[0])
    np.testing.assert_allclose(result, np.tanh(np.full(8, 2.0, np.float32)), rtol=1e-6)


def test_a_refused_split_count_never_reaches_the_plugin(cpu_plugin):
    """Both values end the process in the plugin's compiler (-1: a vector of -1 parts; 2**31
    - 1: two billion JIT libraries); in a child process, so that a regression fails this test
    and not the run."""
    result = run_python(f"""
        import pjrt
        from pjrt.compile_options import CompileOptions
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu")
        for value in (-1, 2**31 - 1):
            options = CompileOptions()
            try:
                options.executable_build_options.debug_options.{SPLIT_COUNT} = value
                client.compile_and_load({TINY.read_text()!r}, client.devices()[:1], options)
                print("compiled", value)
            except ValueError as error:
                print("ValueError", error)
    """, timeout=300)
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith(f"ValueError DebugOptions.{SPLIT_COUNT} must be from 1 to 65536, "
                               f"not -1")
    assert lines[1].startswith(f"ValueError DebugOptions.{SPLIT_COUNT} must be from 1 to 65536, "
                               f"not 2147483647")


def test_an_isolated_compile_turns_a_debug_option_crash_into_an_error(cpu_plugin):
    """A value XLA ends the compile on, reaching the plugin by XLA_FLAGS (which pjrt does not
    read): an isolated compile raises IsolatedCompileCrash, and the process goes on."""
    result = run_python(f"""
        import pjrt
        from pjrt.program import IsolatedCompileCrash
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu")
        try:
            client.compile_and_load({TINY.read_text()!r}, client.devices()[:1], isolate=True)
            print("compiled")
        except IsolatedCompileCrash as error:
            print("IsolatedCompileCrash", error)
        print("still here")
    """, env=child_env(XLA_FLAGS=f"--{SPLIT_COUNT}=-1"), timeout=300)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("IsolatedCompileCrash"), result.stdout
    assert lines[-1] == "still here"


def test_debug_options_copy_and_pickle():
    d = DebugOptions(xla_dump_to="/d", xla_gpu_enable_command_buffer=[Cmd.CUDNN])
    for twin in (copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        assert twin == d and twin is not d
        twin.xla_dump_to = None
        assert twin != d and d.xla_dump_to == "/d"


def test_upstream_debug_option_names_are_all_in_the_table(xc):
    # Every DebugOptions attribute jaxlib binds is a field here.
    theirs = xc.CompileOptions().executable_build_options.debug_options
    names = {n for n in dir(theirs) if n.startswith("xla_")}
    assert names and names <= set(DebugOptions._FIELDS)


def _compile_tiny(client, debug: DebugOptions):
    opts = CompileOptions(executable_build_options=ExecutableBuildOptions(debug_options=debug))
    return client.compile_and_load(TINY.read_text(), client.devices()[:1], opts)


def test_debug_options_of_every_kind_reach_the_plugin(client, tmp_path):
    # XLA dumps the DebugOptions it compiled with (the fields that differ from its
    # defaults) beside the module: each kind of field set here is there, as XLA read it.
    d = DebugOptions(
        xla_dump_to=str(tmp_path),                                        # string
        xla_dump_hlo_as_dot=True,                                         # bool
        xla_gpu_autotune_level=2,                                         # int32
        xla_gpu_all_reduce_combine_threshold_bytes=5_000_000_000,         # int64
        xla_gpu_autotune_gemm_rtol=0.25,                                  # float
        xla_step_marker_location=DebugOptions.StepMarkerLocation.STEP_MARK_AT_TOP_LEVEL_WHILE_LOOP,
        xla_gpu_experimental_autotune_cache_mode=AutotuneCacheMode.READ,  # enum
        xla_gpu_enable_command_buffer=[Cmd.FUSION, Cmd.CUBLAS],           # repeated enum
        xla_disable_hlo_passes=["no-such-pass", "another"],               # repeated string
    )
    _compile_tiny(client, d)
    dumped = os.listdir(tmp_path)
    (options_file,) = [n for n in dumped if n.endswith(".debug_options")]
    lines = set((tmp_path / options_file).read_text().splitlines())
    assert {
        f'xla_dump_to: "{tmp_path}"',
        "xla_dump_hlo_as_dot: true",
        "xla_gpu_autotune_level: 2",
        "xla_gpu_all_reduce_combine_threshold_bytes: 5000000000",
        "xla_gpu_autotune_gemm_rtol: 0.250000",
        "xla_step_marker_location: STEP_MARK_AT_TOP_LEVEL_WHILE_LOOP",
        "xla_gpu_experimental_autotune_cache_mode: AUTOTUNE_CACHE_MODE_READ",
        "xla_gpu_enable_command_buffer: FUSION",
        "xla_gpu_enable_command_buffer: CUBLAS",
        'xla_disable_hlo_passes: "no-such-pass"',
        'xla_disable_hlo_passes: "another"',
    } <= lines, sorted(lines)
    # xla_dump_hlo_as_dot took effect: the module was dumped as graphs, not as text.
    assert any(n.endswith(".dot") for n in dumped), dumped
    assert not any(n.endswith("after_optimizations.txt") for n in dumped), dumped


def test_a_debug_option_changes_the_compiled_program(client):
    # xla_disable_all_hlo_passes, a field the hand-written subset never had: without the
    # passes XLA fuses nothing, and the optimised module says so.
    fused = _compile_tiny(client, DebugOptions()).hlo_modules()[0].to_string()
    unfused = _compile_tiny(client, DebugOptions(xla_disable_all_hlo_passes=True))
    text = unfused.hlo_modules()[0].to_string()
    assert "fusion(" in fused
    assert "fusion(" not in text and "tanh(" in text
    # And the program still computes the same thing.
    a, b = TINY.inputs()
    device = client.devices()[0]
    out = unfused.execute([client.buffer_from_pyval(a, device),
                           client.buffer_from_pyval(b, device)])
    programs.check_outputs(TINY, [np.asarray(out[0])])
