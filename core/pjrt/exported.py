"""Programs exported by ``jax.export``: read what ``Exported.serialize()`` writes, and run it.

``jax.export`` turns a jitted function into a StableHLO module plus what a caller needs to
call it the way the function was called: the avals (shape and dtype) of the flattened inputs
and outputs, the pytree structure of the arguments and results, the shardings, the platforms
it was lowered for, which inputs the module kept, and its effects. ``Exported.serialize()``
writes all of it as one flatbuffer. [`deserialize_exported`][pjrt.exported.deserialize_exported] reads that flatbuffer with
the ``flatbuffers`` package's runtime reader (no jax needed) into an [`Exported`][pjrt.exported.Exported], which
is called like the original function::

    exported = pjrt.deserialize_exported(open("model.bin", "rb").read())
    outputs = exported(params, {"x": x})      # the same pytree jax's exp.call takes

Calling conventions the module follows, and that this module honours:

* a module exported for several platforms takes first an ``int32`` scalar, the index of the
  running platform in `Exported.platforms`; it is filled in here;
* inputs the function did not use are not parameters of the module
  (`Exported.module_kept_var_idx` lists the ones kept); they are dropped here;
* a module exported for ``nr_devices`` > 1 is an SPMD program over that many devices; it is
  compiled over the backend's first ``nr_devices`` devices and its inputs are placed by the
  exported shardings.

Refused, with a message saying why: ordered effects (the module threads tokens that only
jax's runtime supplies), a platform the module was not exported for, more devices than the
backend has, shape-polymorphic inputs (XLA's PJRT plugins do not refine shapes; export with
concrete shapes), and custom pytree nodes (their Python classes are not in the bytes).

Schema facts (jax 0.10.2's ``jax/_src/export/serialization.fbs``, as the generated reader
spells them): each table field ``i`` sits at vtable offset ``4 + 2*i``; the fields used are
listed in the ``_EXPORTED``, ``_TREE``... tables below.
"""
from __future__ import annotations

import dataclasses
import logging
import struct
from typing import Any, Sequence, cast

import ml_dtypes
import numpy as np

from .array import Array
from .client import Client
from .device import Device
from ._wire import mlir_bytecode
from .hlo_sharding import HloSharding
from .mesh import PartitionSpec
from .program import CompiledProgram, compile as compile_program
from ._sharding.annotations import spec_to_hlo_sharding

logger = logging.getLogger(__name__)

__all__ = ["Aval", "Exported", "ExportedExecutable", "PyTreeDef", "deserialize_exported"]

# --------------------------------------------------------------------------
# The flatbuffer schema: field numbers and enumerations
# --------------------------------------------------------------------------

#: Field numbers of table ``Exported``.
_EXPORTED = dict(
    function_name=1, in_tree=2, in_avals=3, out_tree=4, out_avals=5, nr_devices_short=6,
    in_shardings=7, out_shardings=8, platforms=9, ordered_effects=10, unordered_effects=11,
    disabled_checks=12, mlir_module_serialized=13, calling_convention_version=14,
    module_kept_var_idx=15, uses_global_constants=16, nr_devices=18, unique_avals=19,
    unique_abstract_meshes=20, unique_named_shardings=21, in_avals_idxs=22,
    out_avals_idxs=23, in_shardings_idxs=24, out_shardings_idxs=25)
#: Field numbers of ``PyTreeDef``, ``AbstractValue``, ``AbstractMesh``, ``NamedSharding``,
#: ``PartitionSpec``, ``PartitionSpecOneAxis``, ``Sharding``, ``Effect``.
_TREE = dict(kind=0, children=1, children_names=2, custom_name=3)
_AVAL = dict(kind=0, shape=1, dtype=2)
_MESH = dict(axis_sizes=0, axis_names=1, axis_types=2)
_NAMED = dict(mesh=0, spec=1, memory_kind=2, abstract_mesh_idx=3)
_SPEC = dict(partitions=0, reduced=1, unreduced=2)
_SPEC_AXIS = dict(axes=0)
_SHARDING = dict(hlo_sharding_proto=1, named_sharding=2)
_EFFECT = dict(type_name=0)

_TREE_LEAF, _TREE_NONE, _TREE_TUPLE, _TREE_LIST, _TREE_DICT, _TREE_CUSTOM = range(6)
_AVAL_SHAPED_ARRAY = 0
_AXIS_MANUAL = 3

#: ``DType`` enumeration -> numpy dtype name (ml_dtypes names for the narrow floats).
_DTYPES = {
    0: "bool", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "uint8", 6: "uint16",
    7: "uint32", 8: "uint64", 9: "float16", 10: "float32", 11: "float64", 12: "complex64",
    13: "complex128", 14: "bfloat16", 15: "int4", 16: "uint4", 17: "float8_e4m3b11fnuz",
    18: "float8_e4m3fn", 19: "float8_e4m3fnuz", 20: "float8_e5m2", 21: "float8_e5m2fnuz",
    23: "float8_e4m3", 24: "float8_e3m4", 25: "float8_e8m0fnu", 26: "float4_e2m1fn"}
#: ``DType`` values with no array type outside jax.
_JAX_ONLY_DTYPES = {22: "float0", 27: "key<fry>", 28: "key<rbg>", 29: "key<unsafe_rbg>"}

#: jax's names of the platforms a module can be exported for, by PJRT platform name.
_PLATFORM_ALIASES = {"gpu": ("cuda", "rocm")}


def _flatbuffers():
    try:
        import flatbuffers  # noqa: F401  # pyright: ignore[reportMissingImports]  (optional: pjrt[export])
        from flatbuffers import number_types, table  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise ImportError(
            "reading a serialized jax Exported needs the 'flatbuffers' package (the format "
            "jax writes it in); install it with: pip install 'pjrt[export]'") from None
    return table, number_types


class _Table:
    """One flatbuffer table, read by field number.

    Every offset is checked before it is followed (flatbuffers' Python reader trusts them:
    a damaged one reads from the wrong place, wraps around to the buffer's end, or silently
    returns a shortened module): the table and its vtable lie within the buffer, each field
    within its table, and each string and vector within the buffer.
    """

    __slots__ = ("_tab", "_types", "_size")

    def __init__(self, tab, types):
        self._tab = tab
        self._types = types
        self._size = _verified_table(tab.Bytes, tab.Pos)

    def _offset(self, field: int) -> int:
        return self._tab.Offset(4 + 2 * field)

    def _field(self, field: int, width: int) -> int:
        """The absolute position of a field of ``width`` bytes, or 0 when it is absent."""
        offset = self._offset(field)
        if offset and offset + width > self._size:
            raise _damaged(f"field {field} of a table lies outside the table")
        return self._tab.Pos + offset if offset else 0

    def _target(self, field: int, item_width: int, what: str) -> tuple[int, int]:
        """``(start, count)`` of the vector or string that field ``field`` points to."""
        at = self._field(field, 4)
        if not at:
            return 0, 0
        buffer = self._tab.Bytes
        target = at + int.from_bytes(buffer[at:at + 4], "little")
        if target + 4 > len(buffer):
            raise _damaged(f"a {what} lies past the end")
        count = int.from_bytes(buffer[target:target + 4], "little")
        if target + 4 + count * item_width > len(buffer):
            raise _damaged(f"a {what} of {count} items runs past the end")
        return target + 4, count

    def has(self, field: int) -> bool:
        return self._offset(field) != 0

    def scalar(self, field: int, flags, default=0):
        at = self._field(field, flags.bytewidth)
        return self._tab.Get(flags, at) if at else default

    def string(self, field: int) -> str | None:
        if not self._offset(field):
            return None
        start, length = self._target(field, 1, "string")
        return bytes(self._tab.Bytes[start:start + length]).decode("utf-8")

    def table(self, field: int) -> "_Table | None":
        at = self._field(field, 4)
        if not at:
            return None
        return self._sub(at + int.from_bytes(self._tab.Bytes[at:at + 4], "little"))

    def _sub(self, position: int) -> "_Table":
        return _Table(type(self._tab)(self._tab.Bytes, position), self._types)

    def _elements(self, start: int, count: int) -> list[int]:
        """The absolute positions an offset vector's elements point to."""
        buffer = self._tab.Bytes
        return [start + 4 * i + int.from_bytes(buffer[start + 4 * i:start + 4 * i + 4],
                                               "little") for i in range(count)]

    def tables(self, field: int) -> list["_Table"]:
        start, length = self._target(field, 4, "vector of tables")
        return [self._sub(position) for position in self._elements(start, length)]

    def strings(self, field: int) -> list[str]:
        start, length = self._target(field, 4, "vector of strings")
        buffer, out = self._tab.Bytes, []
        for position in self._elements(start, length):
            if position + 4 > len(buffer):
                raise _damaged("a string lies past the end")
            size = int.from_bytes(buffer[position:position + 4], "little")
            if position + 4 + size > len(buffer):
                raise _damaged(f"a string of {size} bytes runs past the end")
            out.append(bytes(buffer[position + 4:position + 4 + size]).decode("utf-8"))
        return out

    def numbers(self, field: int, flags) -> list[int]:
        size = flags.bytewidth
        start, length = self._target(field, size, "vector of numbers")
        return [self._tab.Get(flags, start + size * i) for i in range(length)]

    def raw_bytes(self, field: int) -> bytes:
        start, length = self._target(field, 1, "byte vector")
        return bytes(self._tab.Bytes[start:start + length])


def _verified_table(buffer, position: int) -> int:
    """The size of the table at ``position``, after checking that it and its vtable lie
    within ``buffer`` and that every field the vtable lists lies within the table."""
    size = len(buffer)
    if not 0 <= position <= size - 4:
        raise _damaged(f"a table at offset {position} lies outside its {size} bytes")
    vtable = position - int.from_bytes(buffer[position:position + 4], "little", signed=True)
    if not 0 <= vtable <= size - 4:
        raise _damaged(f"a table's vtable at offset {vtable} lies outside its {size} bytes")
    vtable_size = int.from_bytes(buffer[vtable:vtable + 2], "little")
    table_size = int.from_bytes(buffer[vtable + 2:vtable + 4], "little")
    if vtable_size < 4 or vtable_size % 2 or vtable + vtable_size > size:
        raise _damaged(f"a vtable claims {vtable_size} bytes")
    if table_size < 4 or position + table_size > size:
        raise _damaged(f"a table claims {table_size} bytes")
    for slot in range(vtable + 4, vtable + vtable_size, 2):
        if int.from_bytes(buffer[slot:slot + 2], "little") >= table_size:
            raise _damaged("a table's field lies outside the table")
    return table_size


def _damaged(why: str) -> ValueError:
    return ValueError(f"these bytes are not a serialized jax export, or are damaged: {why}")


# --------------------------------------------------------------------------
# Avals, shardings, pytrees
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Aval:
    """The shape and dtype of one flattened input or output.

    ``shape`` holds ints, and a str for each symbolic (shape-polymorphic) dimension, as jax
    wrote it (``"b"``, ``"2*b"``).
    """

    shape: tuple
    dtype: np.dtype

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a number."""
        return all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class _NamedSharding:
    """A sharding as jax exports it: an abstract mesh (names, sizes, types) and a spec."""

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    manual_axes: frozenset
    spec: PartitionSpec
    unreduced: frozenset

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        return spec_to_hlo_sharding(self.axis_names, self.axis_sizes, self.spec, ndim,
                                    unreduced_axes=self.unreduced,
                                    manual_axes=self.manual_axes)


class PyTreeDef:
    """The structure of a pytree of tuples, lists, dicts and None, with array leaves.

    Read from jax's serialized ``PyTreeDef``. Dicts are flattened in the key order jax
    stored (sorted), as jax flattens them.
    """

    __slots__ = ("kind", "children", "keys", "custom_name")

    def __init__(self, kind: int, children: tuple = (), keys: tuple = (),
                 custom_name: str | None = None):
        self.kind = kind
        self.children = children
        self.keys = keys
        self.custom_name = custom_name

    @property
    def num_leaves(self) -> int:
        """How many leaves the structure has."""
        if self.kind == _TREE_LEAF:
            return 1
        return sum(child.num_leaves for child in self.children)

    def flatten(self, value, path: str = "") -> list:
        """The leaves of ``value``, which must have this structure.

        Raises:
          TypeError: ``value`` has another structure; the message names where.
        """
        leaves: list = []
        self._flatten(value, path, leaves)
        return leaves

    def _flatten(self, value, path: str, leaves: list) -> None:
        kind = self.kind
        if kind == _TREE_LEAF:
            leaves.append(value)
        elif kind == _TREE_NONE:
            if value is not None:
                raise TypeError(f"{path or 'the input'} must be None, as when it was exported; "
                                f"got {type(value).__name__}")
        elif kind in (_TREE_TUPLE, _TREE_LIST):
            expected = tuple if kind == _TREE_TUPLE else list
            if type(value) is not expected or len(value) != len(self.children):
                raise TypeError(
                    f"{path or 'the input'} must be a {expected.__name__} of "
                    f"{len(self.children)} elements, as when it was exported; got "
                    f"{_describe(value)}")
            for index, (child, item) in enumerate(zip(self.children, value)):
                child._flatten(item, f"{path}[{index}]", leaves)
        elif kind == _TREE_DICT:
            if not isinstance(value, dict) or set(value) != set(self.keys):
                raise TypeError(
                    f"{path or 'the input'} must be a dict with keys {sorted(self.keys)}, as "
                    f"when it was exported; got {_describe(value)}")
            for key, child in zip(self.keys, self.children):
                child._flatten(value[key], f"{path}[{key!r}]", leaves)
        else:
            raise TypeError(self._custom_error(path))

    def unflatten(self, leaves: Sequence) -> Any:
        """The pytree of this structure holding ``leaves`` in order.

        Raises:
          TypeError: the structure has a custom node.
          ValueError: ``leaves`` is not ``num_leaves`` long.
        """
        if len(leaves) != self.num_leaves:
            raise ValueError(f"the structure has {self.num_leaves} leaves, {len(leaves)} given")
        return self._build(iter(leaves), "")

    def _build(self, leaves, path: str):
        kind = self.kind
        if kind == _TREE_LEAF:
            return next(leaves)
        if kind == _TREE_NONE:
            return None
        children = [c._build(leaves, f"{path}[{i}]") for i, c in enumerate(self.children)]
        if kind == _TREE_TUPLE:
            return tuple(children)
        if kind == _TREE_LIST:
            return children
        if kind == _TREE_DICT:
            return dict(zip(self.keys, children))
        raise TypeError(self._custom_error(path))

    def _custom_error(self, path: str) -> str:
        return (f"{path or 'the pytree'} is a custom pytree node {self.custom_name!r}; its "
                f"Python class is not part of the serialized export, so pjrt cannot take or "
                f"rebuild it. Export a function whose inputs and outputs are tuples, lists, "
                f"dicts and arrays")

    def __repr__(self) -> str:
        if self.kind == _TREE_LEAF:
            return "*"
        if self.kind == _TREE_NONE:
            return "None"
        inner = ", ".join(map(repr, self.children))
        if self.kind == _TREE_TUPLE:
            return f"({inner}{',' if len(self.children) == 1 else ''})"
        if self.kind == _TREE_LIST:
            return f"[{inner}]"
        if self.kind == _TREE_DICT:
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.keys, self.children)) + "}"
        return f"{self.custom_name}({inner})"


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} elements"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return f"a {type(value).__name__}"


# --------------------------------------------------------------------------
# Reading the flatbuffer
# --------------------------------------------------------------------------

#: The deepest pytree read: jax's own are a few levels deep; a damaged export could nest
#: them until Python's recursion limit.
_MAX_TREE_DEPTH = 200


def _read_tree(node: _Table, types, depth: int = 0) -> PyTreeDef:
    kind = node.scalar(_TREE["kind"], types.Int8Flags)
    if kind not in range(6):
        raise ValueError(f"the serialized export has a pytree node of unknown kind {kind}")
    if depth > _MAX_TREE_DEPTH:
        raise ValueError(f"the serialized export nests its pytree more than "
                         f"{_MAX_TREE_DEPTH} levels deep; it is damaged")
    children = tuple(_read_tree(c, types, depth + 1) for c in node.tables(_TREE["children"]))
    keys = tuple(node.strings(_TREE["children_names"])) if kind == _TREE_DICT else ()
    if kind == _TREE_DICT and len(keys) != len(children):
        raise ValueError("the serialized export has a dict node whose keys and children differ "
                         "in number")
    return PyTreeDef(kind, children, keys, node.string(_TREE["custom_name"]))


def _read_aval(node: _Table, types) -> Aval:
    kind = node.scalar(_AVAL["kind"], types.Int8Flags)
    if kind != _AVAL_SHAPED_ARRAY:
        raise ValueError("the serialized export has an abstract token among its inputs or "
                         "outputs; only arrays can be passed outside jax")
    code = node.scalar(_AVAL["dtype"], types.Int8Flags)
    if code in _JAX_ONLY_DTYPES:
        raise ValueError(f"the serialized export has an input or output of dtype "
                         f"{_JAX_ONLY_DTYPES[code]}, which exists only inside jax")
    if code not in _DTYPES:
        raise ValueError(f"the serialized export uses dtype number {code}, unknown to this "
                         f"pjrt (written by a newer jax?)")
    name = _DTYPES[code]
    dtype = np.dtype(getattr(ml_dtypes, name, name))
    shape = tuple(int(d) if d.strip().isdigit() else d.strip()
                  for d in node.strings(_AVAL["shape"]))
    return Aval(shape, dtype)


def _read_mesh(node: _Table, types) -> tuple:
    names = tuple(node.strings(_MESH["axis_names"]))
    sizes = tuple(node.numbers(_MESH["axis_sizes"], types.Uint32Flags))
    axis_types = node.numbers(_MESH["axis_types"], types.Int8Flags)
    manual = frozenset(n for n, t in zip(names, axis_types) if t == _AXIS_MANUAL)
    if len(names) != len(sizes):
        raise ValueError("the serialized export has a mesh whose axis names and sizes differ "
                         "in number")
    return names, sizes, manual


def _read_named_sharding(node: _Table, meshes: list, types) -> _NamedSharding:
    if meshes:
        index = node.scalar(_NAMED["abstract_mesh_idx"], types.Uint32Flags)
        if index >= len(meshes):
            raise ValueError("the serialized export names a mesh it does not hold")
        names, sizes, manual = meshes[index]
    else:  # older exports repeat the mesh in each sharding
        # jax writes the mesh whenever it writes no mesh index.
        names, sizes, manual = _read_mesh(cast(_Table, node.table(_NAMED["mesh"])), types)
    spec_node = node.table(_NAMED["spec"])
    partitions = []
    for axis in spec_node.tables(_SPEC["partitions"]):
        axes = tuple(axis.strings(_SPEC_AXIS["axes"]))
        partitions.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    unreduced = frozenset(spec_node.strings(_SPEC["unreduced"]))
    return _NamedSharding(names, sizes, manual, PartitionSpec(*partitions), unreduced)


def _read_sharding(node: _Table, meshes: list, types):
    """A ``Sharding`` table of an older export: a named sharding, an OpSharding, or None."""
    named = node.table(_SHARDING["named_sharding"])
    if named is not None:
        return _read_named_sharding(named, meshes, types)
    if node.has(_SHARDING["hlo_sharding_proto"]):
        return HloSharding.from_proto(node.raw_bytes(_SHARDING["hlo_sharding_proto"]))
    return None


def _by_index(items: list, indices: list, what: str, none_at_zero: bool = False) -> tuple:
    out = []
    for index in indices:
        if none_at_zero:
            if index == 0:
                out.append(None)
                continue
            index -= 1
        if index >= len(items):
            raise ValueError(f"the serialized export refers to {what} {index}, which it does "
                             f"not hold")
        out.append(items[index])
    return tuple(out)


def deserialize_exported(blob: bytes | bytearray | memoryview) -> "Exported":
    """Read the bytes ``jax.export.Exported.serialize()`` wrote (jax 0.10.2's format and
    the older ones it reads), without jax.

    Returns:
      An [`Exported`][pjrt.exported.Exported], callable with the pytree of arrays the exported function took.

    Raises:
      ImportError: the ``flatbuffers`` package is missing (``pip install 'pjrt[export]'``).
      ValueError: the bytes are not a serialized export, or are damaged.
    """
    table_module, types = _flatbuffers()
    data = bytearray(blob)
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes are too short to be a serialized jax export")
    root = int.from_bytes(data[0:4], "little")
    if root + 4 > len(data):
        raise ValueError("these bytes are not a serialized jax export (its root offset points "
                         "past the end)")
    try:
        exported = _read_exported(_Table(table_module.Table(data, root), types), types)
    except (IndexError, UnicodeDecodeError, OverflowError, struct.error) as error:
        raise ValueError(f"these bytes are not a serialized jax export, or are damaged "
                         f"({type(error).__name__}: {error})") from None
    # The module is the plugin's to parse; its container is checked here, where the error
    # can say it came from the export.
    if mlir_bytecode.is_bytecode(exported.mlir_module_serialized):
        try:
            mlir_bytecode.check_container(exported.mlir_module_serialized)
        except ValueError as error:
            raise ValueError(f"the serialized jax export's module is damaged: {error}") \
                from None
    return exported


def _read_exported(exp: _Table, types) -> "Exported":
    f = _EXPORTED
    module = exp.raw_bytes(f["mlir_module_serialized"])
    if not module:
        raise ValueError("the serialized jax export holds no module")
    meshes = [_read_mesh(m, types) for m in exp.tables(f["unique_abstract_meshes"])]
    unique_avals = [_read_aval(a, types) for a in exp.tables(f["unique_avals"])]
    unique_shardings = [_read_named_sharding(s, meshes, types)
                        for s in exp.tables(f["unique_named_shardings"])]

    def avals(idx_field, old_field):
        if exp.has(idx_field):
            return _by_index(unique_avals, exp.numbers(idx_field, types.Uint32Flags), "aval")
        return tuple(_read_aval(a, types) for a in exp.tables(old_field))

    def shardings(idx_field, old_field):
        if exp.has(idx_field):
            return _by_index(unique_shardings, exp.numbers(idx_field, types.Uint32Flags),
                             "sharding", none_at_zero=True)
        return tuple(_read_sharding(s, meshes, types) for s in exp.tables(old_field))

    in_avals = avals(f["in_avals_idxs"], f["in_avals"])
    out_avals = avals(f["out_avals_idxs"], f["out_avals"])
    in_shardings = shardings(f["in_shardings_idxs"], f["in_shardings"])
    out_shardings = shardings(f["out_shardings_idxs"], f["out_shardings"])
    # jax writes both trees in every export.
    in_tree = _read_tree(cast(_Table, exp.table(f["in_tree"])), types)
    out_tree = _read_tree(cast(_Table, exp.table(f["out_tree"])), types)
    if in_tree.num_leaves != len(in_avals) or out_tree.num_leaves != len(out_avals):
        raise ValueError("the serialized export's pytree structures do not match its avals")
    nr_devices = (exp.scalar(f["nr_devices"], types.Uint32Flags)
                  or exp.scalar(f["nr_devices_short"], types.Int16Flags))
    return Exported(
        fun_name=exp.string(f["function_name"]) or "",
        in_tree=in_tree, out_tree=out_tree, in_avals=in_avals, out_avals=out_avals,
        in_named_shardings=in_shardings or (None,) * len(in_avals),
        out_named_shardings=out_shardings or (None,) * len(out_avals),
        nr_devices=max(int(nr_devices), 1),
        platforms=tuple(exp.strings(f["platforms"])),
        ordered_effects=tuple(e.string(_EFFECT["type_name"])
                              for e in exp.tables(f["ordered_effects"])),
        unordered_effects=tuple(e.string(_EFFECT["type_name"])
                                for e in exp.tables(f["unordered_effects"])),
        mlir_module_serialized=module,
        calling_convention_version=exp.scalar(f["calling_convention_version"],
                                              types.Uint16Flags),
        module_kept_var_idx=tuple(exp.numbers(f["module_kept_var_idx"], types.Uint16Flags)),
        uses_global_constants=bool(exp.scalar(f["uses_global_constants"], types.BoolFlags)))


# --------------------------------------------------------------------------
# Exported and its executable
# --------------------------------------------------------------------------

def _to_hlo(sharding, aval: Aval) -> HloSharding | None:
    if sharding is None or isinstance(sharding, HloSharding):
        return sharding
    return sharding.to_hlo_sharding(len(aval.shape))


@dataclasses.dataclass(frozen=True, eq=False)
class Exported:
    """A program exported by ``jax.export``, as [`deserialize_exported`][pjrt.exported.deserialize_exported] reads it.

    Attributes:
      fun_name: the exported function's name.
      in_tree, out_tree: the [`PyTreeDef`][pjrt.exported.PyTreeDef] of ``(args, kwargs)`` and of the result.
      in_avals, out_avals: one [`Aval`][pjrt.exported.Aval] per flattened input / output.
      platforms: the platforms the module was lowered for (``"cpu"``, ``"cuda"``...).
      nr_devices: how many devices the module runs on (an SPMD program when > 1).
      module_kept_var_idx: the flattened inputs the module takes, in order; the others were
        unused and are dropped.
      mlir_module_serialized: the module: a StableHLO portable artifact (bytecode).
      ordered_effects, unordered_effects: the effects' type names.
      calling_convention_version, uses_global_constants: as jax records them.

    Calling it compiles the module once for the default backend (see `compile`) and
    runs it: ``exported(*args, **kwargs)`` returns the result pytree of pjrt Arrays.
    """

    fun_name: str
    in_tree: PyTreeDef
    out_tree: PyTreeDef
    in_avals: tuple
    out_avals: tuple
    in_named_shardings: tuple = dataclasses.field(repr=False)
    out_named_shardings: tuple = dataclasses.field(repr=False)
    nr_devices: int
    platforms: tuple
    ordered_effects: tuple
    unordered_effects: tuple
    mlir_module_serialized: bytes = dataclasses.field(repr=False)
    calling_convention_version: int
    module_kept_var_idx: tuple
    uses_global_constants: bool
    _compiled: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                        compare=False)

    @property
    def in_shardings(self) -> tuple:
        """Per flattened input: its [`HloSharding`][pjrt.hlo_sharding.HloSharding] over the
        ``nr_devices`` devices, or None where jax left it to the compiler."""
        return tuple(_to_hlo(s, a) for s, a in zip(self.in_named_shardings, self.in_avals))

    @property
    def out_shardings(self) -> tuple:
        """Per flattened output: its HloSharding, or None."""
        return tuple(_to_hlo(s, a) for s, a in zip(self.out_named_shardings, self.out_avals))

    @property
    def has_platform_index_argument(self) -> bool:
        """Whether the module takes the running platform's index first (jax adds it when
        exporting for more than one platform)."""
        return len(self.platforms) > 1

    def platform_index(self, platform: str) -> int:
        """The index of the PJRT platform ``platform`` in `platforms`.

        Raises:
          ValueError: the module was not exported for that platform.
        """
        names = _PLATFORM_ALIASES.get(platform, (platform,))
        for index, exported_for in enumerate(self.platforms):
            if exported_for in names or exported_for == platform:
                return index
        raise ValueError(
            f"{self.fun_name or 'this function'} was exported for platforms "
            f"{self.platforms}, not for {platform!r}; export it with "
            f"jax.export.export(..., platforms=({', '.join(map(repr, self.platforms))}, "
            f"{platform!r})), or run it on a backend of one of those platforms")

    def compile(self, devices: Sequence[Device] | None = None, *,
                client: Client | None = None) -> "ExportedExecutable":
        """Compile the module for a backend.

        Args:
          devices: the ``nr_devices`` devices to run on, in mesh order; the client's first
            ``nr_devices`` devices when None.
          client: the backend; the devices' client, or the default backend, when None.

        Raises:
          ValueError: the export has ordered effects or symbolic shapes, was not exported for
            the backend's platform, or needs more devices than the backend has.
        """
        self._check_runnable()
        if client is None:
            if devices:
                # (typed below the client as a ClientView; a Device's client is a Client)
                client = cast(Client, devices[0].client)
            else:
                from .registry import get_backend

                client = get_backend()
        if devices is None:
            available = client.local_devices()
            if len(available) < self.nr_devices:
                raise ValueError(
                    f"{self.fun_name or 'this function'} was exported for {self.nr_devices} "
                    f"devices, but the {client.platform} backend has {len(available)}; run it "
                    f"on a backend with at least {self.nr_devices} devices (for the CPU "
                    f"plugin: PJRT_CPU_DEVICE_COUNT={self.nr_devices})")
            devices = available[:self.nr_devices]
        else:
            devices = list(devices)
            if len(devices) != self.nr_devices:
                raise ValueError(f"{self.fun_name or 'this function'} was exported for "
                                 f"{self.nr_devices} devices; {len(devices)} were given")
        index = self.platform_index(client.platform)
        logger.debug("compiling exported %s for %s on %d devices", self.fun_name,
                     client.platform, len(devices))
        program = compile_program(self.mlir_module_serialized, devices, client=client)
        return ExportedExecutable(self, program,
                                  index if self.has_platform_index_argument else None)

    def _check_runnable(self) -> None:
        if self.ordered_effects:
            raise ValueError(
                f"{self.fun_name or 'this function'} has ordered effects "
                f"({', '.join(self.ordered_effects)}): its module threads tokens that only "
                f"jax's runtime supplies; run it with jax, or export a function without "
                f"ordered side effects")
        symbolic = sorted({d for a in self.in_avals for d in a.shape if not isinstance(d, int)})
        if symbolic:
            raise ValueError(
                f"{self.fun_name or 'this function'} was exported with symbolic dimensions "
                f"{', '.join(map(repr, symbolic))} (shape polymorphism); jax specialises such "
                f"a module to the actual shapes before compiling, which PJRT plugins do not "
                f"do. Export it with concrete shapes (jax.ShapeDtypeStruct((8, 784), ...) "
                f"instead of jax.export.symbolic_shape(...)), once per shape you need")

    def __call__(self, *args, **kwargs):
        """Run on the default backend (compiled on the first call); see `compile`."""
        executable = self._compiled.get(None)
        if executable is None:
            executable = self._compiled.setdefault(None, self.compile())
        return executable(*args, **kwargs)


class ExportedExecutable:
    """An [`Exported`][pjrt.exported.Exported] compiled for a backend: called with the exported function's
    arguments, it returns its result pytree of pjrt Arrays."""

    def __init__(self, exported: Exported, program: CompiledProgram,
                 platform_index: int | None):
        self.exported = exported
        self.program = program
        self.platform_index = platform_index
        self._index_argument = (np.array(platform_index, np.int32)
                                if platform_index is not None else None)

    def __call__(self, *args, **kwargs):
        exported = self.exported
        leaves = exported.in_tree.flatten((args, kwargs), "(args, kwargs)")
        # Every input is checked, the unused ones too, as jax checks them.
        for index, (leaf, aval) in enumerate(zip(leaves, exported.in_avals)):
            shape, dtype = _shape_and_dtype(leaf)
            if shape != aval.shape or dtype != aval.dtype:
                raise TypeError(f"input {index} of {exported.fun_name or 'the function'} "
                                f"(flattened) is {dtype}{list(shape)}, but it was exported "
                                f"for {aval}")
        arguments = [leaves[index] for index in exported.module_kept_var_idx]
        if self._index_argument is not None:
            arguments.insert(0, self._index_argument)
        outputs = self.program(*arguments)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        return exported.out_tree.unflatten(list(outputs))

    def __repr__(self) -> str:
        return f"ExportedExecutable({self.exported.fun_name!r}, {self.program!r})"


def _shape_and_dtype(value) -> tuple[tuple, np.dtype]:
    if isinstance(value, Array):
        return tuple(value.shape), np.dtype(value.dtype)
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        value = np.asarray(value)
    return tuple(value.shape), np.dtype(value.dtype)
