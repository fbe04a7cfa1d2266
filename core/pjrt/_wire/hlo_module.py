"""What an executable's optimised HLO module says about its signature.

The PJRT C API reports an executable's outputs but not its parameters. The optimised module
(``PJRT_Executable_OptimizedProgram``, a serialised ``HloModuleProto``) does: its entry
program shape gives each parameter's per-device shape and element type, and its alias table
says which parameters are donated to outputs. Only those fields are read here.

Field numbers (xla/service/hlo.proto, xla/xla_data.proto):
  HloModuleProtoWithConfig: hlo_module = 1, config = 2.
  HloModuleProto: host_program_shape = 4, input_output_alias = 8, spmd_output_sharding = 12,
    spmd_parameters_shardings = 14, buffer_donor = 18.
  ProgramShapeProto: parameters = 1, result = 2.
  ShapeProto: element_type = 2, dimensions = 3, tuple_shapes = 4.
  HloInputOutputAliasProto: entries = 1; AliasEntryProto: parameter_number = 2.
  HloBufferDonorProto: entries = 1; BufferDonorEntryProto: parameter_number = 1.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import protowire as wire
from ..dtypes import XLA_TUPLE_TYPE, from_xla_type, xla_type_name


@dataclasses.dataclass(frozen=True)
class ShapeInfo:
    """One array's per-device shape and dtype (dtype None for tokens and other non-arrays)."""

    shape: tuple
    dtype: np.dtype | None


@dataclasses.dataclass(frozen=True)
class ModuleSignature:
    """Parameters of an entry computation, the parameters donated to its outputs, and the
    shardings SPMD partitioning chose (serialised ``OpSharding``; None when not partitioned)."""

    parameters: tuple  # of ShapeInfo, or None for a tuple-shaped parameter
    donated_parameters: frozenset
    parameter_shardings: tuple | None = None
    output_sharding: bytes | None = None
    #: Outputs (in flat order) with a dimension of dynamic size: their buffers are laid out at
    #: the dimension's bound, and the size each call gave is known once the value is computed.
    dynamic_outputs: frozenset = frozenset()


_fields = wire.group_fields


def _ints(occurrences: list) -> list[int]:
    # Packed (bytes) in files written by proto3, one varint each otherwise.
    return [wire.to_int64(v) for v in wire.repeated_varints(occurrences)]


def _shape(message: bytes) -> ShapeInfo | None:
    fields = _fields(message)
    element_type = fields.get(2, [0])[0]
    if element_type == XLA_TUPLE_TYPE:
        return None
    return ShapeInfo(tuple(_ints(fields.get(3, []))), from_xla_type(element_type))


def _dynamic_dimensions(message: bytes) -> list[bool]:
    """A ShapeProto's ``is_dynamic_dimension`` (field 6), one flag per dimension."""
    return [bool(v) for v in _ints(_fields(message).get(6, []))]


def _dynamic_outputs(program_shape: bytes) -> frozenset:
    """The flat output indices of a ProgramShapeProto's result (field 2) that have a dynamic
    dimension; a tuple result's elements are the outputs."""
    results = _fields(program_shape).get(2, [])
    if not results:
        return frozenset()
    result = _fields(results[0])
    outputs = (result.get(4, []) if result.get(2, [0])[0] == XLA_TUPLE_TYPE else [results[0]])
    return frozenset(i for i, output in enumerate(outputs) if any(_dynamic_dimensions(output)))


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
    dynamic_outputs: frozenset = frozenset()
    for program_shape in fields.get(4, [])[:1]:
        parameters = tuple(_shape(p) for p in _fields(program_shape).get(1, []))
        dynamic_outputs = _dynamic_outputs(program_shape)
    parameter_shardings = tuple(fields[14]) if 14 in fields else None
    output_sharding = fields[12][0] if 12 in fields else None
    return ModuleSignature(parameters, frozenset(_donated(fields)), parameter_shardings,
                           output_sharding, dynamic_outputs)


# -- a readable rendering of the optimised module ---------------------------------------------
#
# XLA's own printer lives in C++; this renders the fields of the proto that a reader needs to
# follow the program (names, shapes, opcodes, operands, called computations and the common
# attributes) in XLA's textual style. It is for people, not for parsing back.
#
# More field numbers (hlo.proto): HloModuleProto name = 1, computations = 3,
# entry_computation_id = 6. HloComputationProto name = 1, instructions = 2, id = 5,
# root_id = 6. HloInstructionProto name = 1, opcode = 2, shape = 3, parameter_number = 9,
# fusion_kind = 11, tuple_index = 13, dimensions = 14, custom_call_target = 28, id = 35,
# operand_ids = 36, called_computation_ids = 38, comparison_direction = 63.
# ShapeProto layout = 5; LayoutProto minor_to_major = 1.

def _text(chunks: list) -> str:
    return chunks[0].decode("utf-8", "replace") if chunks else ""


def shape_text(message: bytes) -> str:
    """A ShapeProto as XLA writes shapes: ``f32[8,4]{1,0}``, ``(f32[2], s32[])``."""
    fields = _fields(message)
    element_type = fields.get(2, [0])[0]
    if element_type == XLA_TUPLE_TYPE:
        return "(" + ", ".join(shape_text(s) for s in fields.get(4, [])) + ")"
    name = xla_type_name(element_type)
    if name in ("token", "opaque"):
        return f"{name}[]"
    dynamic = _dynamic_dimensions(message)
    dims = ",".join(("<=" if d < len(dynamic) and dynamic[d] else "") + str(extent)
                    for d, extent in enumerate(_ints(fields.get(3, []))))
    layout = ""
    for layout_message in fields.get(5, [])[:1]:
        minor_to_major = _ints(_fields(layout_message).get(1, []))
        if dims:
            layout = "{" + ",".join(map(str, minor_to_major)) + "}"
    return f"{name}[{dims}]{layout}"


def _instruction_text(message: bytes, names: dict, computation_names: dict, root_id: int) -> tuple:
    fields = _fields(message)
    instruction_id = wire.to_int64(fields.get(35, [0])[0])
    name = _text(fields.get(1, []))
    opcode = _text(fields.get(2, []))
    operands = ", ".join("%" + names.get(i, f"id{i}") for i in _ints(fields.get(36, [])))
    attributes = []
    if opcode == "parameter":
        operands = str(wire.to_int64(fields.get(9, [0])[0]))
    elif opcode == "constant":
        operands = "..."  # literal values are not rendered
    if opcode == "get-tuple-element":
        attributes.append(f"index={wire.to_int64(fields.get(13, [0])[0])}")
    dimensions = _ints(fields.get(14, []))
    if dimensions:
        attributes.append("dimensions={" + ",".join(map(str, dimensions)) + "}")
    if 63 in fields:
        attributes.append(f"direction={_text(fields[63])}")
    if 11 in fields:
        attributes.append(f"kind={_text(fields[11])}")
    called = ["%" + computation_names.get(i, f"id{i}") for i in _ints(fields.get(38, []))]
    if called:
        keyword = {"fusion": "calls", "while": "condition, body", "call": "to_apply",
                   "conditional": "branch_computations"}.get(opcode, "to_apply")
        if opcode == "while" and len(called) == 2:
            attributes.append(f"condition={called[0]}, body={called[1]}")
        else:
            attributes.append(f"{keyword}={', '.join(called)}")
    if 28 in fields:
        attributes.append(f'custom_call_target="{_text(fields[28])}"')
    shape = shape_text(fields[3][0]) if 3 in fields else "()"
    prefix = "ROOT " if instruction_id == root_id else ""
    line = f"  {prefix}%{name} = {shape} {opcode}({operands})"
    if attributes:
        line += ", " + ", ".join(attributes)
    return instruction_id, name, line


def module_text(serialized_module: bytes) -> str:
    """Render a serialised ``HloModuleProto`` as readable HLO text."""
    fields = _fields(serialized_module)
    computations = [_fields(c) for c in fields.get(3, [])]
    computation_names = {wire.to_int64(c.get(5, [0])[0]): _text(c.get(1, [])) for c in computations}
    entry_id = wire.to_int64(fields.get(6, [0])[0])
    lines = [f"HloModule {_text(fields.get(1, []))}", ""]
    for computation in computations:
        computation_id = wire.to_int64(computation.get(5, [0])[0])
        root_id = wire.to_int64(computation.get(6, [0])[0])
        names: dict[int, str] = {}
        body = []
        for instruction in computation.get(2, []):
            instruction_id, name, line = _instruction_text(instruction, names, computation_names,
                                                           root_id)
            names[instruction_id] = name
            body.append(line)
        header = "ENTRY " if computation_id == entry_id else ""
        lines.append(f"{header}%{_text(computation.get(1, []))} {{")
        lines.extend(body)
        lines.extend(["}", ""])
    return "\n".join(lines)
