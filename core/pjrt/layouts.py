"""Memory layouts: how an array's elements are ordered (and tiled) in device memory.

A [`Layout`][pjrt.layouts.Layout] is XLA's layout of one array: ``minor_to_major`` (the dimensions from the
fastest-varying to the slowest; ``(1, 0)`` is row-major for a matrix), optional tiles, and
the element size in bits when elements are packed. [`PjRtLayout`][pjrt.layouts.PjRtLayout] is what a runtime hands
out (jaxlib's name): a Layout read from a buffer, a client's default, or a compiled program's
parameter or result. [`Format`][pjrt.layouts.Format] pairs a layout with a sharding, as ``Array.format``
gives it.

Where they come from:

* a buffer's layout: the core API's ``PJRT_Buffer_GetMemoryLayout`` (every plugin we support);
* a client's default layout, and an executable's parameter and output layouts: the plugin's
  layouts extension (``PJRT_Extension_Type_Layouts``). A plugin without it (or with a version
  that lacks the entry) raises [`UnsupportedFeatureError`][pjrt.errors.UnsupportedFeatureError]; both CPU plugins
  on PyPI have it.

The extension hands layouts out serialised as XLA's ``LayoutProto``, which this module reads
and writes (``Layout.to_proto``/``from_proto``), so a Layout also travels inside
``CompileOptions.argument_layouts``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from . import dtypes
from ._capi import api as _c
from ._wire import protowire as pw
from ._wire.shape_extents import check_extents
from ._pjrt_cffi import ffi, lib
from .errors import UnsupportedFeatureError, check

__all__ = ["Layout", "PjRtLayout", "Format", "layouts_extension", "has_layouts_extension",
           "buffer_layout", "default_layout", "executable_layouts", "module_layouts"]

_NULL = ffi.NULL


class Layout:
    """XLA's layout of one array (jaxlib's ``Layout``).

    Args:
      minor_to_major: dimension numbers from most minor (fastest varying) to most major.
      tiling: tiles, outermost first, each a tuple of tile dimensions.
      element_size_in_bits: the size of a packed element; 0 means the type's own size.

    Raises:
      ValueError: ``minor_to_major`` is not a permutation of ``range(rank)``, or a tile has
        a dimension below 1.
    """

    __slots__ = ("_minor_to_major", "_tiling", "_element_size_in_bits")

    def __init__(self, minor_to_major: Sequence[int], tiling: Sequence[Sequence[int]] = (),
                 element_size_in_bits: int = 0):
        order = tuple(int(d) for d in minor_to_major)
        if sorted(order) != list(range(len(order))):
            raise ValueError(f"minor_to_major {order} is not a permutation of the dimensions "
                             f"0..{len(order) - 1}")
        tiles = tuple(tuple(int(d) for d in tile) for tile in tiling)
        for tile in tiles:
            if any(d < 1 and d != -1 for d in tile):  # -1: XLA's "combine dimensions" marker
                raise ValueError(f"tile {tile} has a dimension below 1")
        if element_size_in_bits < 0:
            raise ValueError(f"element_size_in_bits must be >= 0, not {element_size_in_bits}")
        self._minor_to_major = order
        self._tiling = tiles
        self._element_size_in_bits = int(element_size_in_bits)

    def minor_to_major(self) -> tuple[int, ...]:
        """Dimensions from most minor to most major."""
        return self._minor_to_major

    def tiling(self) -> tuple[tuple[int, ...], ...]:
        """The tiles, outermost first (empty when untiled)."""
        return self._tiling

    def element_size_in_bits(self) -> int:
        """The packed element size in bits (0: the element type's own size)."""
        return self._element_size_in_bits

    def is_row_major(self) -> bool:
        """Whether this is the dense row-major (C order) layout numpy uses."""
        rank = len(self._minor_to_major)
        return (self._minor_to_major == tuple(range(rank - 1, -1, -1))
                and all(all(d == 1 for d in tile) for tile in self._tiling)
                and self._element_size_in_bits == 0)

    def to_string(self) -> str:
        """XLA's spelling: ``{1,0}``, ``{1,0:T(8,128)}``, ``{0:T(1024)E(4)}``."""
        text = ",".join(str(d) for d in self._minor_to_major)
        suffix = "".join("T(" + ",".join("*" if d == -1 else str(d) for d in tile) + ")"
                         for tile in self._tiling)
        if self._element_size_in_bits:
            suffix += f"E({self._element_size_in_bits})"
        return "{" + text + (":" + suffix if suffix else "") + "}"

    # -- XLA's LayoutProto -------------------------------------------------------------------

    def to_proto(self) -> bytes:
        """Serialise as ``xla.LayoutProto``."""
        out = pw.packed_varint_field(1, self._minor_to_major) if self._minor_to_major else b""
        for tile in self._tiling:
            out += pw.message_field(6, pw.packed_varint_field(1, tile))
        if self._element_size_in_bits:
            out += pw.int_field(7, self._element_size_in_bits)
        return out

    @classmethod
    def from_proto(cls, data: bytes) -> "Layout":
        """Read an ``xla.LayoutProto`` (fields other than the order, tiles and element size,
        such as a memory space, are not kept).

        Raises:
          ValueError: the message is malformed.
        """
        order, tiles, size = [], [], 0
        for number, wire_type, raw in pw.decode(bytes(data)):
            if number == 1:
                order.extend(pw.to_int64(v) for v in
                             pw.read_varints(wire_type, raw, "LayoutProto.minor_to_major"))
            elif number == 6:
                pw.expect_wire_type(wire_type, pw.LEN, "LayoutProto.tiles")
                dims = []
                for tile_number, tile_wire, tile_raw in pw.decode(raw):
                    if tile_number == 1:
                        dims.extend(pw.to_int64(v) for v in
                                    pw.read_varints(tile_wire, tile_raw, "TileProto.dimensions"))
                tiles.append(tuple(dims))
            elif number == 7:
                pw.expect_wire_type(wire_type, pw.VARINT, "LayoutProto.element_size_in_bits")
                size = pw.to_int64(raw)
        return cls(order, tiles, size)

    @classmethod
    def from_string(cls, text: str) -> "Layout":
        """Parse XLA's spelling (see `to_string`).

        Raises:
          ValueError: the text is not a layout this module can read.
        """
        body = text.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise ValueError(f"a layout is written like '{{1,0}}', not {text!r}")
        body = body[1:-1]
        order_text, _, rest = body.partition(":")
        order = [int(d) for d in order_text.split(",") if d.strip()]
        tiles, size = [], 0
        while rest:
            if rest.startswith("T("):
                inner, _, rest = rest[2:].partition(")")
                tiles.append(tuple(-1 if d.strip() == "*" else int(d) for d in inner.split(",")))
            elif rest.startswith("E("):
                inner, _, rest = rest[2:].partition(")")
                size = int(inner)
            else:
                raise ValueError(f"cannot read the layout attribute {rest!r} in {text!r}")
        return cls(order, tiles, size)

    # -- value semantics ---------------------------------------------------------------------

    def _key(self) -> tuple:
        return (self._minor_to_major, self._tiling, self._element_size_in_bits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"Layout({self.to_string()})"


class PjRtLayout:
    """A layout as a runtime hands it out (jaxlib's ``PjRtLayout``): wraps a [`Layout`][pjrt.layouts.Layout].

    Compares and hashes by the layout it wraps.
    """

    __slots__ = ("_layout",)

    def __init__(self, layout: Layout):
        if not isinstance(layout, Layout):
            raise TypeError(f"PjRtLayout wraps a Layout, not {type(layout).__name__}")
        self._layout = layout

    def _xla_layout(self) -> Layout:
        """The XLA [`Layout`][pjrt.layouts.Layout] (jaxlib's accessor name)."""
        return self._layout

    @property
    def layout(self) -> Layout:
        """The XLA [`Layout`][pjrt.layouts.Layout]."""
        return self._layout

    def serialize(self) -> bytes:
        """The layout as ``xla.LayoutProto`` bytes (what `deserialize` reads)."""
        return self._layout.to_proto()

    @classmethod
    def deserialize(cls, data: bytes) -> "PjRtLayout":
        """Read what `serialize` (or a plugin's layouts extension) wrote."""
        return cls(_parse_serialized(data))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PjRtLayout):
            return NotImplemented
        return self._layout == other._layout

    def __hash__(self) -> int:
        return hash(self._layout)

    def __str__(self) -> str:
        return self._layout.to_string()

    def __repr__(self) -> str:
        return f"PjRtLayout({self._layout.to_string()})"


@dataclasses.dataclass(frozen=True)
class Format:
    """A layout together with a sharding: where an array's shards live and how each is laid
    out in memory (``Array.format``; ``jax.Format`` in jax)."""

    #: The layout of each shard (None: the runtime's default).
    layout: PjRtLayout | None
    #: The array's sharding (None: not fixed).
    sharding: Any = None


def _parse_serialized(data: bytes) -> Layout:
    """A layout from what a plugin's ``PJRT_Layouts_MemoryLayout_Serialize`` gave: a
    ``LayoutProto`` (current plugins) or XLA's text spelling (older ones)."""
    data = bytes(data)
    if data.startswith(b"{"):
        return Layout.from_string(data.decode("ascii", errors="replace"))
    return Layout.from_proto(data)


# -- the layouts extension -------------------------------------------------------------------

def _entry_end(entry: str) -> int:
    """Bytes of PJRT_Layouts_Extension up to the end of ``entry``: older ones are shorter."""
    return ffi.offsetof("PJRT_Layouts_Extension", entry) + ffi.sizeof("void *")


def layouts_extension(api: _c.Api, entry: str):
    """The plugin's ``PJRT_Layouts_Extension*``, checked to have ``entry`` set.

    Raises:
      UnsupportedFeatureError: the plugin offers no layouts extension, or one without
        ``entry``; the message names the extensions it does offer.
    """
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_Layouts)
    if extension is not None and extension.struct_size >= _entry_end(entry):
        typed = ffi.cast("PJRT_Layouts_Extension *", extension)
        if getattr(typed, entry) != _NULL:
            return typed
    offered = ", ".join(str(int(e.type)) for e in _c.extensions(api)) or "none"
    why = ("its layouts extension is an older version without this entry" if extension
           is not None else "it does not offer the PJRT layouts extension "
           f"(extension types it offers: {offered})")
    raise UnsupportedFeatureError(f"{entry} (PJRT_Extension_Type_Layouts)", api.plugin_name,
                                  api.version, _c.HEADER_VERSION, why=why)


def has_layouts_extension(api: _c.Api, entry: str = "PJRT_Layouts_PJRT_Client_GetDefaultLayout"
                          ) -> bool:
    """Whether the plugin's layouts extension has ``entry``."""
    try:
        layouts_extension(api, entry)
    except UnsupportedFeatureError:
        return False
    return True


def _read_and_free(api: _c.Api, extension, layout, *, owned: bool) -> PjRtLayout:
    """Serialise a ``PJRT_Layouts_MemoryLayout*`` into a [`PjRtLayout`][pjrt.layouts.PjRtLayout]; frees it when
    ``owned`` (layouts an executable hands out belong to the executable)."""
    try:
        args = api.new_args("PJRT_Layouts_MemoryLayout_Serialize_Args")
        args.layout = layout
        check(api, extension.PJRT_Layouts_MemoryLayout_Serialize(args))
        try:
            data = ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
        finally:
            if args.serialized_layout_deleter != _NULL:
                args.serialized_layout_deleter(args.serialized_layout)
        return PjRtLayout(_parse_serialized(data))
    finally:
        if owned:
            destroy = api.new_args("PJRT_Layouts_MemoryLayout_Destroy_Args")
            destroy.layout = layout
            check(api, extension.PJRT_Layouts_MemoryLayout_Destroy(destroy))


def default_layout(api: _c.Api, client_pointer, dtype, shape: Sequence[int]) -> PjRtLayout:
    """The layout the client gives a new buffer of ``dtype`` and ``shape`` (the caller
    brackets this with a native call on the client).

    Raises:
      UnsupportedFeatureError: the plugin has no layouts extension with default layouts.
      TypeError: ``dtype`` has no PJRT equivalent.
      ValueError: a dimension is negative, or the extents overflow int64
        (`pjrt._wire.shape_extents`).
    """
    extension = layouts_extension(api, "PJRT_Layouts_PJRT_Client_GetDefaultLayout")
    buffer_type = dtypes.to_pjrt_type(dtype)
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {tuple(dims)} has a negative dimension")
    # XLA makes the shape with its extents rule, and aborts the process where it fails.
    element = dtypes.from_pjrt_type(buffer_type)
    check_extents(dims, element.itemsize, f"the shape {tuple(dims)} of {element}")
    args = api.new_args("PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args")
    args.client = client_pointer
    args.type = buffer_type
    keep = ffi.new("int64_t[]", dims) if dims else _NULL
    args.dims = keep
    args.num_dims = len(dims)
    check(api, extension.PJRT_Layouts_PJRT_Client_GetDefaultLayout(args))
    return _read_and_free(api, extension, args.layout, owned=True)


def executable_layouts(api: _c.Api, executable_pointer, which: str) -> list[PjRtLayout]:
    """The layouts of a compiled program's ``"parameters"`` or ``"outputs"``.

    Raises:
      UnsupportedFeatureError: the plugin's layouts extension lacks the entry.
    """
    if which == "parameters":
        entry = "PJRT_Layouts_PJRT_Executable_GetParameterLayouts"
        args = api.new_args("PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args")
    elif which == "outputs":
        entry = "PJRT_Layouts_PJRT_Executable_GetOutputLayouts"
        args = api.new_args("PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args")
    else:
        raise ValueError(f"which must be 'parameters' or 'outputs', not {which!r}")
    extension = layouts_extension(api, entry)
    args.executable = executable_pointer
    check(api, getattr(extension, entry)(args))
    count = args.num_parameters if which == "parameters" else args.num_outputs
    return [_read_and_free(api, extension, args.layouts[i], owned=False) for i in range(count)]


def stored_order(layout: "PjRtLayout | Layout") -> tuple[int, ...] | None:
    """The dimensions from major to minor that ``layout`` stores, or None when it is the
    row-major (default) order."""
    if isinstance(layout, PjRtLayout):
        layout = layout.layout
    minor_to_major = tuple(layout.minor_to_major())
    if minor_to_major == tuple(range(len(minor_to_major) - 1, -1, -1)):
        return None
    return tuple(reversed(minor_to_major))


def buffer_layout(api: _c.Api, buffer) -> PjRtLayout:
    """The layout of a buffer's data, through the core API (``PJRT_Buffer_GetMemoryLayout``).

    Raises:
      UnsupportedFeatureError: the plugin lacks ``PJRT_Buffer_GetMemoryLayout``.
      ValueError: the plugin describes the buffer by byte strides, which no XLA layout
        spells.
    """
    args = api.new_args("PJRT_Buffer_GetMemoryLayout_Args")
    args.buffer = buffer
    api.call("PJRT_Buffer_GetMemoryLayout", args)
    layout = args.layout
    if layout.type != lib.PJRT_Buffer_MemoryLayout_Type_Tiled:
        raise ValueError("the plugin describes this buffer's layout by byte strides, which "
                         "has no XLA layout spelling")
    tiled = layout.tiled
    order = [tiled.minor_to_major[i] for i in range(tiled.minor_to_major_size)]
    tiles, at = [], 0
    for t in range(tiled.num_tiles):
        size = tiled.tile_dim_sizes[t]
        tiles.append(tuple(tiled.tile_dims[at + i] for i in range(size)))
        at += size
    return PjRtLayout(Layout(order, tiles))


def module_layouts(serialized_module: bytes) -> tuple[list[PjRtLayout], list[PjRtLayout]]:
    """The parameter and output layouts of a compiled program, read from its optimised
    ``HloModuleProto`` (``host_program_shape``): what plugins whose layouts extension lacks
    the executable entries still say about them. A tuple-shaped result gives one layout per
    element.

    Raises:
      ValueError: the module has no program shape, or a shape without a layout.
    """
    parameters: list[PjRtLayout] = []
    outputs: list[PjRtLayout] = []
    program = None
    for number, wire_type, raw in pw.decode(bytes(serialized_module)):
        if number == 4 and wire_type == pw.LEN:
            program = raw
    if program is None:
        raise ValueError("the compiled module carries no program shape")
    for number, wire_type, raw in pw.decode(program):
        if number == 1 and wire_type == pw.LEN:
            parameters.extend(_shape_layouts(raw))
        elif number == 2 and wire_type == pw.LEN:
            outputs.extend(_shape_layouts(raw))
    return parameters, outputs


def _shape_layouts(shape: bytes) -> list[PjRtLayout]:
    """The layouts of a ``ShapeProto``'s leaves (tuples flattened)."""
    element_type, tuples, layout, rank = 0, [], None, 0
    for number, wire_type, raw in pw.decode(shape):
        if number == 2 and wire_type == pw.VARINT:
            element_type = raw
        elif number == 3:
            rank += len(pw.read_varints(wire_type, raw, "ShapeProto.dimensions"))
        elif number == 4 and wire_type == pw.LEN:
            tuples.append(raw)
        elif number == 5 and wire_type == pw.LEN:
            layout = Layout.from_proto(raw)
    if element_type == dtypes.XLA_TUPLE_TYPE:
        return [leaf for element in tuples for leaf in _shape_layouts(element)]
    if layout is None:
        layout = Layout(tuple(range(rank - 1, -1, -1)))
    return [PjRtLayout(layout)]


def layouts_arguments_must_have(parameter_layouts: list[PjRtLayout]) -> dict[int, PjRtLayout]:
    """index -> layout, for the parameters an executable takes in a layout other than
    row-major: an argument must come in that layout.

    Only the order and the tiles count. A packed element size (``E(4)`` on an int4
    parameter) is how the device stores a sub-byte type, every buffer of that type has it, and
    a buffer's layout as PJRT reports it (``PJRT_Buffer_GetMemoryLayout``) cannot say it.
    """
    checks = {}
    for i, layout in enumerate(parameter_layouts):
        placed = Layout(layout.layout.minor_to_major(), layout.layout.tiling())
        if not placed.is_row_major():
            checks[i] = PjRtLayout(placed)
    return checks
