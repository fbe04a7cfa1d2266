"""Sharding annotations as programs spell them: Shardy's ``sdy`` attributes, and the shardings
of a StableHLO module's ``main`` signature (Shardy's or GSPMD's ``mhlo.sharding`` strings).

Text in, plain data out: this module prints and parses the two forms into
`SdyMesh`, `SdySharding` and [`HloSharding`][pjrt.hlo_sharding.HloSharding] values,
which know nothing of devices. The sharding types built on them (``Mesh``,
``PartitionSpec``, ``NamedSharding``) live above, in [`pjrt.mesh`][pjrt.mesh] and
[`pjrt.sharding`][pjrt.sharding]; `pjrt._sharding.annotations` converts between the two.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import NamedTuple, Any, Mapping, Optional, Sequence

from .lexer import TokenStream
from ..hlo_sharding import HloSharding

__all__ = ["SdyDim", "SdyMesh", "SdySharding", "parse_program_result_shapes",
           "parse_program_shardings", "parse_sdy_mesh", "parse_sdy_sharding",
           "parse_sdy_sharding_for_mesh"]


# --------------------------------------------------------------------------
# Shardy text
# --------------------------------------------------------------------------

_BARE_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")


def _symbol(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a symbol name must be a non-empty str, got {name!r}")
    return name if _BARE_SYMBOL.match(name) else _quote(name)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sdy_mesh_body(axes: Sequence[tuple[str, int]], device_ids: Optional[Sequence[int]]) -> str:
    body = "[" + ", ".join(f"{_quote(n)}={s}" for n, s in axes) + "]"
    if device_ids is not None:
        body += ", device_ids=[" + ", ".join(map(str, device_ids)) + "]"
    return f"<{body}>"


@dataclasses.dataclass(frozen=True)
class SdyMesh:
    """A Shardy mesh: axis names and sizes, and the device id at each position when they
    are not ``0..n-1`` in order (``device_ids``). A mesh with no axes and one device id is
    Shardy's spelling of a single device (a maximal sharding)."""

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    device_ids: Optional[tuple[int, ...]] = None

    def __str__(self) -> str:
        return _sdy_mesh_body(tuple(zip(self.axis_names, self.axis_sizes)), self.device_ids)

    def to_definition(self, name: str = "mesh") -> str:
        """The module-level definition, e.g. ``sdy.mesh @mesh = <["x"=2, "y"=4]>`` (the
        name is quoted when it is not a bare MLIR identifier).

        Raises:
          ValueError: ``name`` is not a non-empty str.
        """
        return f"sdy.mesh @{_symbol(name)} = {self}"


@dataclasses.dataclass(frozen=True)
class SdyDim:
    """One dimension of a Shardy sharding: the axes splitting it, major first, and whether
    it is open (``?``: the partitioner may split it further)."""

    axes: tuple[str, ...]
    is_open: bool = False

    def __str__(self) -> str:
        items = [_quote(a) for a in self.axes] + (["?"] if self.is_open else [])
        return "{" + ", ".join(items) + "}"


@dataclasses.dataclass(frozen=True)
class SdySharding:
    """A parsed ``#sdy.sharding<...>``: the mesh it refers to (by name, or inline), one
    `SdyDim` per array dimension, and the explicitly replicated and unreduced axes.

    ``mesh`` is the resolved mesh definition; ``mesh_name`` is None for an inline mesh.
    ``str()`` prints the attribute back. `pjrt._sharding.annotations` turns it into a
    ``PartitionSpec`` or an ``HloSharding``.
    """

    mesh_name: Optional[str]
    mesh: SdyMesh
    dims: tuple[SdyDim, ...]
    replicated_axes: tuple[str, ...] = ()
    unreduced_axes: tuple[str, ...] = ()

    def __str__(self) -> str:
        ref = f"@{_symbol(self.mesh_name)}" if self.mesh_name else f"mesh{self.mesh}"
        text = f"#sdy.sharding<{ref}, [{', '.join(map(str, self.dims))}]"
        if self.replicated_axes:
            text += ", replicated={" + ", ".join(map(_quote, self.replicated_axes)) + "}"
        if self.unreduced_axes:
            text += ", unreduced={" + ", ".join(map(_quote, self.unreduced_axes)) + "}"
        return text + ">"


_SDY_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<int>-?\d+)
  | (?P<word>[#A-Za-z_][A-Za-z0-9_$.#-]*)
  | (?P<punct>[<>\[\]{}(),=?@:])
""", re.VERBOSE)


def _unescape(literal: str) -> str:
    """The value of an MLIR string literal (quotes included): ``\\"``, ``\\\\``, ``\\n``,
    ``\\t`` and ``\\XX`` hex bytes."""
    body = literal[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        pair = body[i + 1:i + 3]
        if len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair):
            out.append(int(pair, 16))
            i += 3
        else:
            escaped = body[i + 1:i + 2]
            out += {"n": "\n", "t": "\t"}.get(escaped, escaped).encode("utf-8")
            i += 2
    return out.decode("utf-8", "replace")


@dataclasses.dataclass
class _ParsedSdy:
    mesh_name: Optional[str]
    inline_mesh: Optional[SdyMesh]
    dims: tuple
    replicated: tuple
    unreduced: tuple
    text: str

    def resolve(self, meshes: Mapping[str, Any]) -> SdySharding:
        if self.inline_mesh is not None:
            mesh = self.inline_mesh
        elif self.mesh_name in meshes:
            mesh = _as_sdy_mesh(self.mesh_name, meshes[self.mesh_name])  # pyright: ignore[reportArgumentType]
        else:
            known = ", ".join(f"@{n}" for n in meshes) or "none"
            raise ValueError(f"the sharding {self.text!r} refers to mesh @{self.mesh_name}, "
                             f"which is not defined (meshes: {known})")
        for name in self.replicated + self.unreduced + tuple(
                a for d in self.dims for a in d.axes):
            if name not in mesh.axis_names:
                raise ValueError(f"the sharding {self.text!r} names axis {name!r}, which is "
                                 f"not in its mesh axes {mesh.axis_names}")
        return SdySharding(self.mesh_name, mesh, self.dims, self.replicated, self.unreduced)


def _as_sdy_mesh(name: str, value) -> SdyMesh:
    if isinstance(value, SdyMesh):
        return value
    if hasattr(value, "axis_names") and hasattr(value, "axis_sizes"):   # a pjrt Mesh
        return SdyMesh(tuple(value.axis_names), tuple(int(s) for s in value.axis_sizes))
    try:
        names, sizes = value
        names = (names,) if isinstance(names, str) else tuple(names)
        sizes = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        raise TypeError(f"mesh @{name} must be (axis_names, axis_sizes), an SdyMesh or a "
                        f"Mesh, got {value!r}") from None
    if any(not isinstance(n, str) for n in names):
        raise TypeError(f"mesh @{name}: axis names must be str, got {names!r}")
    if len(names) != len(sizes):
        raise ValueError(f"mesh @{name}: {len(names)} axis names but {len(sizes)} sizes")
    return SdyMesh(names, sizes)


class _SdyParser(TokenStream):
    """Parser for Shardy's ``#sdy.sharding<...>`` and mesh ``<[...]>`` attribute text."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"expected Shardy text as a str, got {type(text).__name__}")
        super().__init__(text, _SDY_TOKEN, "Shardy text")

    def string(self) -> str:
        kind, text, pos = self.next()
        if kind != "string":
            raise self.error(f"expected a quoted name, found {text!r}", pos)
        return _unescape(text)

    def symbol(self) -> str:
        kind, text, pos = self.next()
        if kind == "string":
            return _unescape(text)
        if kind == "word":
            return text
        raise self.error(f"expected a symbol name, found {text!r}", pos)

    def finish(self) -> None:
        if self.index != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r}")

    def mesh_body(self) -> SdyMesh:
        self.expect("<")
        self.expect("[")
        names, sizes = [], []
        if self.peek() != "]":
            while True:
                names.append(self.string())
                self.expect("=")
                sizes.append(self.integer())
                if not self.eat(","):
                    break
        self.expect("]")
        device_ids = None
        if self.eat(","):
            _, word, pos = self.next()
            if word != "device_ids":
                raise self.error(f"expected 'device_ids', found {word!r}", pos)
            self.expect("=")
            self.expect("[")
            device_ids = [self.integer()]
            while self.eat(","):
                device_ids.append(self.integer())
            self.expect("]")
        self.expect(">")
        if len(set(names)) != len(names):
            raise self.error(f"mesh axis names repeat: {names}")
        if device_ids is not None and len(device_ids) != math.prod(sizes):
            raise self.error(f"{len(device_ids)} device ids for a mesh of {math.prod(sizes)}")
        return SdyMesh(tuple(names), tuple(sizes),
                       None if device_ids is None else tuple(device_ids))

    def axis_list(self) -> tuple[str, ...]:
        self.expect("{")
        names = []
        if self.peek() != "}":
            while True:
                names.append(self.axis())
                if not self.eat(","):
                    break
        self.expect("}")
        return tuple(names)

    def axis(self) -> str:
        name = self.string()
        if self.peek() == ":":
            raise self.error(f"sub-axes of {name!r} are not supported")
        return name

    def dim(self) -> SdyDim:
        self.expect("{")
        axes, is_open = [], False
        while self.peek() != "}":
            if self.eat("?"):
                is_open = True
            else:
                if is_open:
                    raise self.error("'?' must come after the axes")
                axes.append(self.axis())
            if not self.eat(","):
                break
        self.expect("}")
        # A priority suffix (p0, p1, ...) orders propagation; it does not change the layout.
        if self.peek() is not None and re.fullmatch(r"p\d+", self.peek()):  # pyright: ignore[reportArgumentType, reportCallIssue]
            self.next()
        return SdyDim(tuple(axes), is_open)

    def sharding(self) -> _ParsedSdy:
        self.eat("#sdy.sharding")
        self.expect("<")
        mesh_name, inline_mesh = None, None
        if self.eat("@"):
            mesh_name = self.symbol()
        elif self.eat("mesh") or self.peek() == "<":
            inline_mesh = self.mesh_body()
        else:
            raise self.error("expected '@mesh_name' or an inline mesh")
        self.expect(",")
        self.expect("[")
        dims = []
        if self.peek() != "]":
            while True:
                dims.append(self.dim())
                if not self.eat(","):
                    break
        self.expect("]")
        extra: dict[str, tuple[str, ...]] = {"replicated": (), "unreduced": ()}
        while self.eat(","):
            _, word, pos = self.next()
            if word not in extra:
                raise self.error(f"unexpected {word!r}", pos)
            self.expect("=")
            extra[word] = self.axis_list()
        self.expect(">")
        self.finish()
        used = [a for d in dims for a in d.axes] + list(extra["replicated"]) + list(
            extra["unreduced"])
        if len(set(used)) != len(used):
            raise self.error("an axis is used more than once")
        return _ParsedSdy(mesh_name, inline_mesh, tuple(dims), extra["replicated"],
                          extra["unreduced"], self.text)


def parse_sdy_mesh(text: str) -> SdyMesh:
    """Parse a Shardy mesh: the attribute ``<["x"=2, "y"=4]>`` (optionally with
    ``device_ids=[...]``, optionally prefixed ``mesh`` or ``#sdy.mesh``), or a whole
    ``sdy.mesh @name = <...>`` line (the name is dropped; see
    `parse_program_shardings` for a module's meshes by name).

    Raises:
      ValueError: the text is not a mesh.
    """
    match = re.match(r"\s*sdy\.mesh\s+@(\"(?:[^\"\\]|\\.)*\"|[\w.$-]+)\s*=", text)
    body = text[match.end():] if match else text
    body_start = re.match(r"\s*(#sdy\.mesh|mesh)?\s*", body).end()
    parser = _SdyParser(body[body_start:])
    mesh = parser.mesh_body()
    if parser.peek() == "{":      # an attribute dictionary after the op (stablehlo.mesh = ...)
        parser.index = len(parser.tokens)
    parser.finish()
    return mesh


def parse_sdy_sharding(text: str, meshes: Mapping[str, Any]) -> SdySharding:
    """Parse ``#sdy.sharding<@mesh, [{"x"}, {}]>`` against the named meshes.

    Handles closed and open dimensions (``{"x"}``, ``{"x", ?}``, ``{?}``, ``{}``), several
    axes per dimension (``{"x", "y"}``, major first), priorities (``{"x"}p1``, dropped),
    ``replicated={...}`` and ``unreduced={...}``, and inline meshes
    (``mesh<["x"=2]>``). Sub-axes (``"x":(1)2``) are refused.

    Args:
      text: the attribute text.
      meshes: mesh name (without ``@``) to ``(axis_names, axis_sizes)``, an
        `SdyMesh`, or anything with ``axis_names`` and ``axis_sizes`` (a
        [`Mesh`][pjrt.mesh.Mesh]).

    Raises:
      ValueError: the text is malformed, refers to an unknown mesh, or names an axis the
        mesh lacks.
      TypeError: ``text`` is not a str, or a mesh in ``meshes`` has the wrong form.
    """
    return _SdyParser(text).sharding().resolve(meshes)


def parse_sdy_sharding_for_mesh(text: str, mesh: SdyMesh) -> SdySharding:
    """Parse ``#sdy.sharding<...>`` as a sharding over ``mesh``, whatever mesh name the
    text refers to (``@mesh``, ``@m``...). An inline mesh (``mesh<[...]>``) must have the
    axes of ``mesh`` and no ``device_ids``.

    Args:
      text: the attribute text, as for `parse_sdy_sharding`.
      mesh: the mesh the sharding is read against.

    Raises:
      ValueError: the text is malformed, names an axis ``mesh`` lacks, or carries an
        inline mesh other than ``mesh``.
      TypeError: ``text`` is not a str or ``mesh`` is not an `SdyMesh`.
    """
    if not isinstance(mesh, SdyMesh):
        raise TypeError(f"mesh must be an SdyMesh, got {type(mesh).__name__}")
    parsed = _SdyParser(text).sharding()
    inline = parsed.inline_mesh
    if inline is not None and (inline.axis_names != mesh.axis_names
                               or inline.axis_sizes != mesh.axis_sizes
                               or inline.device_ids is not None):
        raise ValueError(f"the sharding {text!r} carries its own mesh {inline}, which is not "
                         f"the mesh {mesh} it is read against")
    return parsed.resolve({parsed.mesh_name: mesh} if parsed.mesh_name else {})


# --------------------------------------------------------------------------
# Reading a program's shardings
# --------------------------------------------------------------------------

_CLOSERS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _where(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


#: The characters the scanners below act on; they jump from one to the next (a signature of
#: thousands of arguments is read in milliseconds, not a character at a time).
_SPECIAL = re.compile(r'["\-()\[\]{}<>,]')
#: The rest of a string literal after its opening quote, up to and including its closing one.
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def _tokens(text: str, start: int):
    """``(index, char)`` of each structural character of ``text`` from ``start``: brackets,
    commas and the ``>`` of no ``->`` arrow, outside string literals."""
    find, rest = _SPECIAL.search, _STRING_REST.match
    i = start
    while True:
        found = find(text, i)
        if found is None:
            return
        i = found.start()
        char = text[i]
        if char == '"':
            closed = rest(text, i + 1)
            if closed is None:
                return  # an unterminated string runs to the end
            i = closed.end()
            continue
        if char == "-":
            i += 2 if text.startswith("->", i) else 1
            continue
        yield i, char
        i += 1


def _scan_to_close(text: str, start: int) -> int:
    """Index just past the bracket matching ``text[start]``, skipping string literals and
    the ``->`` arrow.

    Raises:
      ValueError: a bracket closes the wrong opener, or ``text[start]`` is never closed.
    """
    stack = [(start, _CLOSERS[text[start]])]
    for i, char in _tokens(text, start + 1):
        if char in _CLOSERS:
            stack.append((i, _CLOSERS[char]))
        elif char != ",":
            opened, closer = stack[-1]
            if char != closer:
                raise ValueError(f"{char!r} at {_where(text, i)} does not close the "
                                 f"{text[opened]!r} at {_where(text, opened)}")
            stack.pop()
            if not stack:
                return i + 1
    raise ValueError(f"the {text[start]!r} at {_where(text, start)} is never closed")


def _split_top_level(text: str) -> list[str]:
    """``text`` cut at its top-level commas."""
    parts, depth, start = [], 0, 0
    for i, char in _tokens(text, 0):
        if char in _CLOSERS:
            depth += 1
        elif char != ",":
            depth -= 1
        elif depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    if tail.strip() or parts:
        parts.append(tail)
    return parts


def _top_level_brace(text: str) -> Optional[str]:
    """The contents of the first top-level ``{...}`` in ``text``, or None."""
    depth = 0
    for i, char in _tokens(text, 0):
        if char == "{" and depth == 0:
            return text[i + 1:_scan_to_close(text, i) - 1]
        if char in _CLOSERS:
            depth += 1
        elif char != ",":
            depth -= 1
    return None


def _value_sharding(piece: str, meshes: dict):
    attributes = _top_level_brace(piece)
    if attributes is None:
        return None
    for entry in _split_top_level(attributes):
        key, _, value = entry.partition("=")
        key, value = key.strip().strip('"'), value.strip()
        if key == "mhlo.sharding":
            if not (value.startswith('"') and value.endswith('"')):
                raise ValueError(f"mhlo.sharding must be a string, got {value!r}")
            return HloSharding.from_string(_unescape(value))
        if key == "sdy.sharding":
            return parse_sdy_sharding(value, meshes)
    return None


_MESH_DEF = re.compile(r"sdy\.mesh\s+@(\"(?:[^\"\\]|\\.)*\"|[\w.$-]+)\s*=\s*")
_MAIN = re.compile(r"func\.func\s+public\s+@(?:main|\"main\")\s*\(")


def parse_program_shardings(program_text: str) -> tuple[tuple, tuple]:
    """The shardings a StableHLO text module puts on its ``main`` function's arguments
    and results.

    Each entry is an [`HloSharding`][pjrt.hlo_sharding.HloSharding] (from
    ``mhlo.sharding = "..."``), an `SdySharding` (from ``sdy.sharding =
    #sdy.sharding<...>``, resolved against the module's ``sdy.mesh`` definitions; its
    ``mesh_name`` names the mesh, and `pjrt._sharding.annotations` gives its
    ``PartitionSpec`` and GSPMD form), or None where the value has no sharding.

    Args:
      program_text: the module's text.

    Returns:
      ``(input_shardings, output_shardings)``, two tuples.

    Raises:
      ValueError: there is no ``func.func public @main``, its signature is unbalanced, an
        ``sdy.mesh`` definition is malformed, or a sharding attribute is malformed or
        refers to an undefined mesh; the message says which argument or result.
      TypeError: ``program_text`` is not a str.
    """
    meshes, arguments, results = _main_signature(program_text)
    inputs = tuple(_value_sharding_of("argument", i, a, meshes)
                   for i, a in enumerate(arguments))
    outputs = tuple(_value_sharding_of("result", i, r, meshes)
                    for i, r in enumerate(results))
    return inputs, outputs


def _value_sharding_of(kind: str, index: int, piece: Optional[str], meshes: dict):
    if piece is None:
        return None
    try:
        return _value_sharding(piece, meshes)
    except ValueError as error:
        raise ValueError(f"{kind} {index} of the program's @main: {error}") from None


def _main_signature(program_text: str) -> tuple[dict, list, list]:
    """The module's ``sdy.mesh`` definitions and the text of each argument and result of its
    ``main`` (a result is None when a single result is written without parentheses, where it
    cannot carry attributes)."""
    if not isinstance(program_text, str):
        raise TypeError(f"program_text must be a str, got {type(program_text).__name__}")
    meshes: dict[str, SdyMesh] = {}
    for match in _MESH_DEF.finditer(program_text):
        name = match.group(1)
        name = _unescape(name) if name.startswith('"') else name
        try:
            if not program_text.startswith("<", match.end()):
                raise ValueError(f"expected '<' at {_where(program_text, match.end())}")
            end = _scan_to_close(program_text, match.end())
            meshes[name] = parse_sdy_mesh(program_text[match.end():end])
        except ValueError as error:
            raise ValueError(f"the program's sdy.mesh @{name} is malformed: {error}") from None
    main = _MAIN.search(program_text)
    if main is None:
        raise ValueError("the program has no 'func.func public @main' function")
    args_start = main.end() - 1
    try:
        args_end = _scan_to_close(program_text, args_start)
        arguments = _split_top_level(program_text[args_start + 1:args_end - 1])
        rest_start = len(program_text) - len(program_text[args_end:].lstrip())
        rest = program_text[rest_start:]
        results: list = []
        if rest.startswith("->"):
            results_start = len(program_text) - len(rest[2:].lstrip())
            rest = program_text[results_start:]
            if rest.startswith("("):
                end = _scan_to_close(program_text, results_start)
                results = _split_top_level(program_text[results_start + 1:end - 1])
            else:
                match = _TENSOR_TYPE.match(rest)
                results = [match.group(0) if match else None]
    except ValueError as error:
        raise ValueError(f"the signature of the program's @main is malformed: {error}") \
            from None
    return meshes, arguments, results


_TENSOR_TYPE = re.compile(r"tensor<([^>]*)>")


# A ranked tensor type's leading dimensions, each "<size>x" ("?" for a dynamic one); what
# follows is the element type, which may itself hold an "x" (complex<f32>).
_TENSOR_DIMS = re.compile(r"tensor<((?:(?:\d+|\?)x)*)")


def _tensor_shape(piece: str | None) -> tuple | None:
    match = _TENSOR_DIMS.search(piece or "")
    if match is None or piece.startswith("*", match.end()):
        return None  # not a tensor, or unranked
    dims = match.group(1).split("x")[:-1]
    if "?" in dims:
        return None  # dynamic: unknown
    return tuple(int(d) for d in dims)


def parse_program_result_shapes(program_text: str) -> tuple:
    """The shape each result of the module's ``main`` declares: a tuple of ints per
    result (``()`` for a scalar), None where the type is dynamic (``tensor<?x4xf32>``) or
    not a tensor.

    Args:
      program_text: the module's text.

    Raises:
      ValueError: there is no ``func.func public @main``, or its signature or an
        ``sdy.mesh`` definition is malformed.
      TypeError: ``program_text`` is not a str.
    """
    _, _, results = _main_signature(program_text)
    return tuple(_tensor_shape(r) for r in results)


class ProgramSignature(NamedTuple):
    """What a StableHLO text module's ``main`` declares, read in one pass: the sharding of
    each argument and result (as `parse_program_shardings` gives them) and the shape of
    each result (as `parse_program_result_shapes` gives them)."""

    input_shardings: tuple
    output_shardings: tuple
    result_shapes: tuple


def parse_program_signature(program_text: str) -> ProgramSignature:
    """Shardings and result shapes of the module's ``main``, parsing its signature once.

    Raises:
      ValueError, TypeError: as `parse_program_shardings`.
    """
    meshes, arguments, results = _main_signature(program_text)
    return ProgramSignature(
        tuple(_value_sharding_of("argument", i, a, meshes) for i, a in enumerate(arguments)),
        tuple(_value_sharding_of("result", i, r, meshes) for i, r in enumerate(results)),
        tuple(_tensor_shape(r) for r in results))
