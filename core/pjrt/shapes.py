"""XLA's element types and shapes as jaxlib names them: [`PrimitiveType`][pjrt.shapes.PrimitiveType] and [`Shape`][pjrt.shapes.Shape].

``PrimitiveType`` is an IntEnum built from [`pjrt.dtypes`][pjrt.dtypes]' one table of element types
(XLA's ``xla_data.proto`` numbering). ``Shape`` is an array shape (element type, dimensions,
optional layout and dynamic dimensions) or a tuple of shapes; it reads XLA's text spelling
(``f32[2,3]{1,0}``, ``(s32[], f32[4])``) and converts to and from ``xla.ShapeProto``, which is
how argument layouts travel in ``CompileOptions``.
"""
from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import dtypes
from ._wire import protowire as pw
from ._wire.shape_extents import check_extents
from .layouts import Layout

__all__ = ["PrimitiveType", "Shape", "ShapeIndex"]


def _primitive_type_members() -> dict[str, int]:
    members = {"PRIMITIVE_TYPE_INVALID": 0}
    for number in range(1, 64):
        name = dtypes.xla_type_name(number)
        if name.startswith("type"):
            continue  # a number the table does not know
        members["OPAQUE_TYPE" if name == "opaque" else name.upper()] = number
    return members


#: XLA's element types (``xla.PrimitiveType``), by jaxlib's names: ``PRED``, ``S32``, ``F32``,
#: ``BF16``, ``TUPLE``, ``TOKEN``, ...
if TYPE_CHECKING:
    # What the type checker reads: the members the table below yields, spelled out so that
    # ``PrimitiveType.F32`` is checkable (tests/test_shapes.py keeps the two in step).
    class PrimitiveType(enum.IntEnum):
        """XLA's element types (``xla.PrimitiveType``), as jaxlib names them."""
        PRIMITIVE_TYPE_INVALID = 0
        PRED = 1
        S8 = 2
        S16 = 3
        S32 = 4
        S64 = 5
        U8 = 6
        U16 = 7
        U32 = 8
        U64 = 9
        F16 = 10
        F32 = 11
        F64 = 12
        TUPLE = 13
        OPAQUE_TYPE = 14
        C64 = 15
        BF16 = 16
        TOKEN = 17
        C128 = 18
        F8E5M2 = 19
        F8E4M3FN = 20
        S4 = 21
        U4 = 22
        F8E4M3B11FNUZ = 23
        F8E5M2FNUZ = 24
        F8E4M3FNUZ = 25
        S2 = 26
        U2 = 27
        F8E4M3 = 28
        F8E3M4 = 29
        F4E2M1FN = 32
        F8E8M0FNU = 33
else:
    PrimitiveType = enum.IntEnum("PrimitiveType", _primitive_type_members(), module=__name__)
    PrimitiveType.__doc__ = "XLA's element types (``xla.PrimitiveType``), as jaxlib names them."


def _element_type(value) -> PrimitiveType:
    if isinstance(value, PrimitiveType):
        return value
    if isinstance(value, str) and value.upper() in PrimitiveType.__members__:
        return PrimitiveType[value.upper()]
    return PrimitiveType(dtypes.to_xla_type(value))


_NAME_TO_TYPE = {member.name.lower(): member for member in PrimitiveType}
_ARRAY_TEXT = re.compile(r"\s*([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?\s*")


class Shape:
    """An XLA shape (jaxlib's ``Shape``): an array shape or a tuple of shapes.

    ``Shape("f32[2,3]{1,0}")`` reads XLA's text spelling; `array_shape` and
    `tuple_shape` build one from parts.

    Raises:
      ValueError: the text is not a shape this class can read.
    """

    __slots__ = ("_element_type", "_dimensions", "_layout", "_dynamic", "_tuple_shapes")

    def __init__(self, s: str):
        parsed = _parse(s)
        self._element_type = parsed._element_type
        self._dimensions = parsed._dimensions
        self._layout = parsed._layout
        self._dynamic = parsed._dynamic
        self._tuple_shapes = parsed._tuple_shapes

    @classmethod
    def _make(cls, element_type, dimensions=(), layout=None, dynamic=None, tuple_shapes=None):
        self = cls.__new__(cls)
        self._element_type = element_type
        self._dimensions = tuple(int(d) for d in dimensions)
        if layout is None and tuple_shapes is None and element_type != PrimitiveType.TOKEN:
            # As in XLA: an array shape without a layout gets the row-major one.
            layout = Layout(tuple(range(len(self._dimensions) - 1, -1, -1)))
        self._layout = layout
        self._dynamic = tuple(bool(b) for b in dynamic) if dynamic else (False,) * len(
            self._dimensions)
        self._tuple_shapes = tuple(tuple_shapes) if tuple_shapes is not None else None
        if layout is not None and len(layout.minor_to_major()) != len(self._dimensions):
            raise ValueError(f"layout {layout} has {len(layout.minor_to_major())} dimensions; "
                             f"the shape has {len(self._dimensions)}")
        if len(self._dynamic) != len(self._dimensions):
            raise ValueError("dynamic_dimensions needs one entry per dimension")
        if tuple_shapes is None and self._dimensions:
            element = dtypes.from_xla_type(int(element_type))
            if element is not None:
                check_extents(self._dimensions, element.itemsize, f"the shape {self}")
        return self

    @staticmethod
    def array_shape(type, dims_seq: Sequence[int] = (), layout_seq: Sequence[int] | None = None,
                    dynamic_dimensions: Sequence[bool] | None = None) -> "Shape":
        """An array shape of element ``type`` (a numpy dtype or [`PrimitiveType`][pjrt.shapes.PrimitiveType]),
        dimensions ``dims_seq`` and minor-to-major ``layout_seq`` (row-major when None).

        Raises:
          TypeError: ``type`` is not an element type.
          ValueError: a dimension is negative, the element's byte width times the
            dimensions, multiplied in order, passes 2**63 - 1 at some step (XLA's rule, which
            a 0 later does not lift: ``(2**62, 2**62, 0)``), or the layout or dynamic
            dimensions do not match the rank.
        """
        element_type = _element_type(type)
        dims = tuple(int(d) for d in dims_seq)
        if any(d < 0 for d in dims):
            raise ValueError(f"dimensions must be >= 0, got {dims}")
        layout = Layout(layout_seq) if layout_seq is not None else None
        return Shape._make(element_type, dims, layout, dynamic_dimensions)

    @staticmethod
    def tuple_shape(shapes: Sequence["Shape"]) -> "Shape":
        """A tuple shape of ``shapes``."""
        return Shape._make(PrimitiveType.TUPLE, tuple_shapes=list(shapes))

    @staticmethod
    def token_shape() -> "Shape":
        """The shape of a token."""
        return Shape._make(PrimitiveType.TOKEN)

    # -- queries -----------------------------------------------------------------------------

    def element_type(self) -> PrimitiveType:
        """The element type (``TUPLE`` for a tuple shape)."""
        return self._element_type

    xla_element_type = element_type

    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of the elements.

        Raises:
          ValueError: a tuple or token shape has no dtype.
        """
        dtype = dtypes.from_xla_type(int(self._element_type))
        if dtype is None:
            raise ValueError(f"a {self._element_type.name} shape has no numpy dtype")
        return dtype

    def dimensions(self) -> tuple[int, ...]:
        """The dimensions of an array shape."""
        return self._dimensions

    def rank(self) -> int:
        return len(self._dimensions)

    def is_array(self) -> bool:
        return self._tuple_shapes is None and self._element_type != PrimitiveType.TOKEN

    def is_tuple(self) -> bool:
        return self._tuple_shapes is not None

    def is_token(self) -> bool:
        return self._element_type == PrimitiveType.TOKEN

    def tuple_shapes(self) -> list["Shape"]:
        """The element shapes of a tuple shape.

        Raises:
          ValueError: the shape is not a tuple.
        """
        if self._tuple_shapes is None:
            raise ValueError(f"{self} is not a tuple shape")
        return list(self._tuple_shapes)

    def leaf_count(self) -> int:
        """The number of array (and token) shapes inside, counting nested tuples."""
        if self._tuple_shapes is None:
            return 1
        return sum(s.leaf_count() for s in self._tuple_shapes)

    def is_dynamic_dimension(self, dimension: int) -> bool:
        return self._dynamic[dimension]

    def layout(self) -> Layout | None:
        """The layout of an array shape, when it has one."""
        return self._layout

    def with_major_to_minor_layout_if_absent(self) -> "Shape":
        """This shape with row-major layouts wherever none is set (tuples included)."""
        if self._tuple_shapes is not None:
            return Shape.tuple_shape([s.with_major_to_minor_layout_if_absent()
                                      for s in self._tuple_shapes])
        if self._layout is not None or not self.is_array():
            return self
        rank = len(self._dimensions)
        return Shape._make(self._element_type, self._dimensions,
                           Layout(tuple(range(rank - 1, -1, -1))), self._dynamic)

    # -- text and proto ----------------------------------------------------------------------

    def to_string(self) -> str:
        """XLA's spelling: ``f32[2,3]{1,0}``, ``(s32[], f32[4])``, ``token[]``."""
        if self._tuple_shapes is not None:
            return "(" + ", ".join(s.to_string() for s in self._tuple_shapes) + ")"
        dims = ",".join(("<=" if dyn else "") + str(d)
                        for d, dyn in zip(self._dimensions, self._dynamic))
        text = f"{self._element_type.name.lower()}[{dims}]"
        if self._layout is not None and self._dimensions:
            text += self._layout.to_string()
        return text

    def to_proto(self) -> bytes:
        """Serialise as ``xla.ShapeProto``."""
        out = pw.int_field(2, int(self._element_type))
        if self._dimensions:
            out += pw.packed_varint_field(3, self._dimensions)
        for shape in self._tuple_shapes or ():
            out += pw.message_field(4, shape.to_proto())
        if self._layout is not None:
            out += pw.message_field(5, self._layout.to_proto())
        if any(self._dynamic):
            out += pw.packed_bool_field(6, self._dynamic)
        return out

    @classmethod
    def from_proto(cls, data: bytes) -> "Shape":
        """Read an ``xla.ShapeProto``.

        Raises:
          ValueError: the message is malformed or names an unknown element type.
        """
        element_type, dims, tuples, layout, dynamic = 0, [], [], None, []
        for number, wire_type, raw in pw.decode(bytes(data)):
            if number == 2:
                pw.expect_wire_type(wire_type, pw.VARINT, "ShapeProto.element_type")
                element_type = raw
            elif number == 3:
                dims.extend(pw.to_int64(v) for v in
                            pw.read_varints(wire_type, raw, "ShapeProto.dimensions"))
            elif number == 4:
                pw.expect_wire_type(wire_type, pw.LEN, "ShapeProto.tuple_shapes")
                tuples.append(cls.from_proto(raw))
            elif number == 5:
                pw.expect_wire_type(wire_type, pw.LEN, "ShapeProto.layout")
                layout = Layout.from_proto(raw)
            elif number == 6:
                dynamic.extend(bool(v) for v in
                               pw.read_varints(wire_type, raw, "ShapeProto.is_dynamic_dimension"))
        try:
            kind = PrimitiveType(element_type)
        except ValueError:
            raise ValueError(f"ShapeProto has unknown element type {element_type}") from None
        if kind == PrimitiveType.TUPLE:
            return cls._make(kind, tuple_shapes=tuples)
        return cls._make(kind, dims, layout, dynamic or None)

    # -- value semantics ---------------------------------------------------------------------

    def _key(self) -> tuple:
        return (self._element_type, self._dimensions, self._layout, self._dynamic,
                self._tuple_shapes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"Shape({self.to_string()!r})"


def _parse(text: str) -> Shape:
    if not isinstance(text, str):
        raise TypeError(f"Shape() reads XLA's text spelling, a str, not {type(text).__name__}")
    shape, rest = _parse_one(text.strip(), text)
    if rest.strip():
        raise ValueError(f"unexpected {rest!r} after the shape in {text!r}")
    return shape


def _parse_one(text: str, whole: str) -> tuple[Shape, str]:
    text = text.lstrip()
    if text.startswith("("):
        shapes, rest = [], text[1:].lstrip()
        if rest.startswith(")"):
            return Shape.tuple_shape([]), rest[1:]
        while True:
            shape, rest = _parse_one(rest, whole)
            shapes.append(shape)
            rest = rest.lstrip()
            if rest.startswith(","):
                rest = rest[1:]
                continue
            if rest.startswith(")"):
                return Shape.tuple_shape(shapes), rest[1:]
            raise ValueError(f"cannot read the tuple shape {whole!r}")
    match = _ARRAY_TEXT.match(text)
    if match is None:
        raise ValueError(f"cannot read {whole!r} as a shape (write it like 'f32[2,3]{{1,0}}')")
    name, dims_text, layout_text = match.groups()
    kind = _NAME_TO_TYPE.get(name)
    if kind is None:
        raise ValueError(f"unknown element type {name!r} in {whole!r}")
    dims, dynamic = [], []
    for part in (p.strip() for p in dims_text.split(",") if p.strip()):
        dynamic.append(part.startswith("<="))
        dims.append(int(part[2:] if part.startswith("<=") else part))
    layout = Layout.from_string(layout_text) if layout_text else None
    if kind == PrimitiveType.TOKEN:
        return Shape.token_shape(), text[match.end():]
    return Shape._make(kind, dims, layout, dynamic), text[match.end():]


class ShapeIndex:
    """A path into a (possibly nested) tuple shape: the indices of the elements to descend
    through, outermost first (jaxlib's ``ShapeIndex``; ``ShapeIndex(())`` is the shape itself).
    Equal paths compare and hash equal."""

    __slots__ = ("_path",)

    def __init__(self, path=()):
        indices = tuple(path)
        for index in indices:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise TypeError(f"a ShapeIndex is made of non-negative ints; got {index!r} in "
                                f"{path!r}")
        self._path = indices

    def __eq__(self, other) -> bool:
        return isinstance(other, ShapeIndex) and self._path == other._path

    def __hash__(self) -> int:
        return hash((ShapeIndex, self._path))

    def __iter__(self):
        return iter(self._path)

    def __len__(self) -> int:
        return len(self._path)

    def __repr__(self) -> str:
        return f"ShapeIndex({self._path!r})"
