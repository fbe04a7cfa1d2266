"""What an executable's optimised HLO module says about its signature.

The PJRT C API reports an executable's outputs but not its parameters. The optimised module
(``PJRT_Executable_OptimizedProgram``, a serialised ``HloModuleProto``) does: its entry
program shape gives each parameter's per-device shape and element type, and its alias table
says which parameters are donated to outputs. Only those fields are read here.

Field numbers (xla/service/hlo.proto, xla/xla_data.proto):
  HloModuleProtoWithConfig: hlo_module = 1, config = 2.
  HloModuleProto: host_program_shape = 4, input_output_alias = 8, buffer_donor = 18.
  ProgramShapeProto: parameters = 1, result = 2.
  ShapeProto: element_type = 2, dimensions = 3, tuple_shapes = 4.
  HloInputOutputAliasProto: entries = 1; AliasEntryProto: parameter_number = 2.
  HloBufferDonorProto: entries = 1; BufferDonorEntryProto: parameter_number = 1.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import _protowire as wire
from .dtypes import from_xla_type

_TUPLE_TYPE = 13


@dataclasses.dataclass(frozen=True)
class ShapeInfo:
    """One array's per-device shape and dtype (dtype None for tokens and other non-arrays)."""

    shape: tuple
    dtype: np.dtype | None


@dataclasses.dataclass(frozen=True)
class ModuleSignature:
    """Parameters of an entry computation and the parameters donated to its outputs."""

    parameters: tuple  # of ShapeInfo, or None for a tuple-shaped parameter
    donated_parameters: frozenset


def _fields(message: bytes) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for number, _, value in wire.decode(message):
        grouped.setdefault(number, []).append(value)
    return grouped


def _shape(message: bytes) -> ShapeInfo | None:
    fields = _fields(message)
    element_type = fields.get(2, [0])[0]
    if element_type == _TUPLE_TYPE:
        return None
    dimensions: list[int] = []
    for chunk in fields.get(3, []):
        # Packed (bytes) in files written by proto3, one varint each otherwise.
        if isinstance(chunk, bytes):
            dimensions.extend(wire.to_int64(v) for v in wire.unpack_varints(chunk))
        else:
            dimensions.append(wire.to_int64(chunk))
    return ShapeInfo(tuple(dimensions), from_xla_type(element_type))


def _donated(fields: dict[int, list]) -> set:
    donated = set()
    for alias_table in fields.get(8, []):
        for entry in _fields(alias_table).get(1, []):
            donated.add(wire.to_int64(_fields(entry).get(2, [0])[0]))
    for donor_table in fields.get(18, []):
        for entry in _fields(donor_table).get(1, []):
            donated.add(wire.to_int64(_fields(entry).get(1, [0])[0]))
    return donated


def module_from_module_with_config(serialized: bytes) -> bytes:
    """The ``HloModuleProto`` inside a serialised ``HloModuleProtoWithConfig``."""
    modules = _fields(serialized).get(1)
    if not modules:
        raise ValueError("HloModuleProtoWithConfig without a module")
    return modules[0]


def module_signature(serialized_module: bytes) -> ModuleSignature:
    """Read the parameters and donations out of a serialised ``HloModuleProto``."""
    fields = _fields(serialized_module)
    parameters: tuple = ()
    for program_shape in fields.get(4, [])[:1]:
        parameters = tuple(_shape(p) for p in _fields(program_shape).get(1, []))
    return ModuleSignature(parameters, frozenset(_donated(fields)))
