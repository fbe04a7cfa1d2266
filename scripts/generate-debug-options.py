"""Generate pjrt's table of XLA's ``DebugOptions`` fields from a copy of ``xla/xla.proto``.

    python scripts/generate-debug-options.py PATH/TO/xla/xla.proto --commit SHA [--check]

Reads the ``DebugOptions`` message of openxla/xla's ``xla/xla.proto`` (PATH is a local copy of
the file at commit SHA) and writes ``core/pjrt/_wire/debug_options_fields.py``: one row per
field (name, number, type, wire type, repeated or not, enum) and one ``IntEnum`` per enum the
fields use. ``pjrt.compile_options.DebugOptions`` is built from that table, so updating pjrt to
a newer XLA is running this script on the newer file. ``--check`` compares instead of writing
and exits 1 when the file would change.

The proto says nothing of a field's valid values, but XLA ends the process (an assertion, a
vector sized by the value) on some integer values rather than failing the compile. The
``RANGES`` table below names the fields pjrt knows such a range for, each found by trying
values on XLA's CPU plugins; the generated module carries it, and ``DebugOptions`` refuses a
value outside it. A range naming a field that is not an integer stops the script; one naming
a field the proto lacks is left out, with a note.

Only the shapes pjrt can carry are accepted (see ``SINGULAR`` and ``REPEATED`` below); a field
of any other shape stops the script with its name, so that the table never holds a field the
core cannot serialise. A field typed with an enum or message declared in another file needs
``--enum TYPE`` or ``--message TYPE`` to say which it is (the script reads one file).

The parser knows just enough of the protobuf language for this file: comments, messages, enums,
fields (``optional``/``repeated``, ``map<,>``, options in brackets), ``oneof``, ``reserved``
and ``option`` statements. It is no general .proto parser.
"""
from __future__ import annotations

import argparse
import json
import keyword
import re
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "core" / "pjrt" / "_wire" / "debug_options_fields.py"
UPSTREAM_REPOSITORY = "openxla/xla"
UPSTREAM_PATH = "xla/xla.proto"
MESSAGE = "DebugOptions"

# Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, I32 = 0, 1, 2, 5

#: Singular field types pjrt carries, with the wire type of one value.
SINGULAR = {"bool": VARINT, "int32": VARINT, "int64": VARINT, "enum": VARINT, "float": I32,
            "double": I64, "string": LEN, "message": LEN}
#: Repeated field types pjrt carries (the wire type is an element's; numbers are packed).
REPEATED = {"bool": VARINT, "int32": VARINT, "int64": VARINT, "enum": VARINT, "string": LEN}
#: The one map type DebugOptions uses.
MAP_STRING_STRING = "map<string, string>"
#: Every scalar type of the protobuf language (so that one pjrt does not carry is named as such).
PROTO_SCALARS = {"double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
                 "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"}


#: Integer fields whose values outside a range end XLA's compile instead of failing it:
#: name -> (lowest, highest, what the field is and what happens outside). Each was tried on
#: XLA's CPU plugins (0.81 and 0.106) in child processes. Other integer fields have no range
#: here: the CPU plugins took -1, 0 and 2**31 - 1 for every other CPU or backend-agnostic one
#: (a count such as xla_dump_max_hlo_modules means "no limit" at -1), and the GPU and TPU
#: ones cannot be tried without their plugins.
RANGES: Dict[str, Tuple[int, int, str]] = {
    "xla_cpu_parallel_codegen_split_count": (
        1, 1 << 16,
        "the number of parts XLA:CPU splits a program's LLVM module into, one JIT library "
        "each, made before compiling: a negative count ends the process, 0 is refused by "
        "the compiler, and 2**20 took over two minutes and 1.6 GB"),
}


class GenerationError(Exception):
    """The proto cannot be turned into a table; the message says which declaration and why."""


class Row(NamedTuple):
    """One field of the table."""

    name: str
    number: int
    type: str            # a key of SINGULAR / REPEATED, or MAP_STRING_STRING
    wire_type: int
    repeated: bool
    enum: Optional[str]  # the enum's name where type is "enum" and its values are known


class Table(NamedTuple):
    """What the generated module holds: the fields, in number order, and the enums they use."""

    rows: Tuple[Row, ...]
    enums: Dict[str, Tuple[Tuple[str, int], ...]]  # name -> ((proto value name, number), ...)
    #: name -> (lowest, highest, why) for the integer fields `RANGES` knows a range for.
    ranges: Dict[str, Tuple[int, int, str]] = {}


# ---------------------------------------------------------------------------------------------
# Reading the proto
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))
  | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<punct>[{}\[\]()<>;=,:])
""", re.VERBOSE | re.DOTALL)


def tokenize(text: str) -> List[Tuple[str, int]]:
    """The tokens of ``text`` with their line numbers, comments and spaces left out."""
    tokens: List[Tuple[str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise GenerationError(f"line {line}: cannot read {text[pos:pos + 20]!r}")
        kind, value = match.lastgroup, match.group()
        if kind not in ("space", "line_comment", "block_comment"):
            tokens.append((value, line))
        line += value.count("\n")
        pos = match.end()
    return tokens


class _Field(NamedTuple):
    label: str   # "", "optional" or "repeated"
    type: str    # as written; "map<K, V>" for maps
    name: str
    number: int
    line: int


class _Message(NamedTuple):
    fields: List[_Field]
    enums: Dict[str, List[Tuple[str, int]]]
    messages: Dict[str, "_Message"]


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.pos = 0

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.tokens[index][0] if index < len(self.tokens) else ""

    @property
    def line(self) -> int:
        return self.tokens[min(self.pos, len(self.tokens) - 1)][1] if self.tokens else 0

    def take(self, expected: Optional[str] = None) -> str:
        if self.pos >= len(self.tokens):
            raise GenerationError(f"unexpected end of file (wanted {expected or 'more'})")
        token = self.tokens[self.pos][0]
        if expected is not None and token != expected:
            raise GenerationError(f"line {self.line}: expected {expected!r}, found {token!r}")
        self.pos += 1
        return token

    def skip_statement(self) -> None:
        """Skip to the end of a statement or a braced block (``option``, ``service``, ...)."""
        depth = 0
        while True:
            token = self.take()
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth == 0:
                    return
            elif token == ";" and depth == 0:
                return

    def skip_options(self) -> None:
        if self.peek() == "[":
            depth = 0
            while True:
                token = self.take()
                depth += token == "["
                depth -= token == "]"
                if depth == 0:
                    return

    def file(self) -> _Message:
        top = _Message([], {}, {})
        while self.pos < len(self.tokens):
            token = self.peek()
            if token == "message":
                self.take()
                name = self.take()
                top.messages[name] = self.message_body()
            elif token == "enum":
                self.take()
                name = self.take()
                top.enums[name] = self.enum_body()
            elif token == ";":
                self.take()
            else:  # syntax, package, import, option, service, extend
                self.skip_statement()
        return top

    def message_body(self) -> _Message:
        message = _Message([], {}, {})
        self.take("{")
        while self.peek() != "}":
            token = self.peek()
            if token == "message":
                self.take()
                name = self.take()
                message.messages[name] = self.message_body()
            elif token == "enum":
                self.take()
                name = self.take()
                message.enums[name] = self.enum_body()
            elif token == "oneof":
                self.take()
                self.take()
                self.take("{")
                while self.peek() != "}":
                    if self.peek() == "option":
                        self.skip_statement()
                    else:
                        message.fields.append(self.field())
                self.take("}")
            elif token in ("reserved", "option", "extensions"):
                self.skip_statement()
            elif token == "extend":
                raise GenerationError(f"line {self.line}: 'extend' inside a message is not "
                                      f"supported")
            elif token == ";":
                self.take()
            else:
                message.fields.append(self.field())
        self.take("}")
        return message

    def enum_body(self) -> List[Tuple[str, int]]:
        values: List[Tuple[str, int]] = []
        self.take("{")
        while self.peek() != "}":
            if self.peek() in ("option", "reserved"):
                self.skip_statement()
                continue
            if self.peek() == ";":
                self.take()
                continue
            name = self.take()
            self.take("=")
            number = _integer(self.take(), self.line)
            self.skip_options()
            self.take(";")
            values.append((name, number))
        self.take("}")
        return values

    def field(self) -> _Field:
        line = self.line
        label = ""
        if self.peek() in ("optional", "repeated", "required"):
            label = self.take()
        if self.peek() == "map" and self.peek(1) == "<":
            self.take()
            self.take("<")
            key = self.take()
            self.take(",")
            value = self.take()
            self.take(">")
            type_ = f"map<{key}, {value}>"
        else:
            type_ = self.take()
        name = self.take()
        self.take("=")
        number = _integer(self.take(), self.line)
        self.skip_options()
        self.take(";")
        return _Field(label, type_, name, number, line)


def _integer(token: str, line: int) -> int:
    try:
        return int(token, 0)
    except ValueError:
        raise GenerationError(f"line {line}: expected a number, found {token!r}") from None


# ---------------------------------------------------------------------------------------------
# Turning DebugOptions into the table
# ---------------------------------------------------------------------------------------------


def build_table(text: str, external_enums: Sequence[str] = (),
                external_messages: Sequence[str] = ()) -> Table:
    """The table of ``DebugOptions`` in the proto source ``text``.

    Raises:
        GenerationError: the message is missing, a field has a shape pjrt does not carry or a
            type the file does not declare, or two fields share a name or number.
    """
    top = _Parser(text).file()
    if MESSAGE not in top.messages:
        raise GenerationError(f"no top-level message {MESSAGE} in the file")
    debug = top.messages[MESSAGE]
    rows: List[Row] = []
    enums: Dict[str, Tuple[Tuple[str, int], ...]] = {}
    for field in debug.fields:
        where = f"{MESSAGE}.{field.name} (line {field.line})"
        type_, enum_name, values = _resolve(field.type, debug, top, external_enums,
                                            external_messages, where)
        repeated = field.label == "repeated"
        if type_ == MAP_STRING_STRING:
            rows.append(Row(field.name, field.number, type_, LEN, False, None))
            continue
        shapes = REPEATED if repeated else SINGULAR
        if type_ not in shapes:
            raise GenerationError(
                f"{where}: {'repeated ' if repeated else ''}{field.type} is not a shape pjrt "
                f"carries; teach pjrt.compile_options and this script's "
                f"{'REPEATED' if repeated else 'SINGULAR'} table about it first")
        if enum_name is not None and values is not None:
            if enum_name in enums and enums[enum_name] != values:
                raise GenerationError(f"{where}: two different enums are named {enum_name}")
            enums[enum_name] = values
        rows.append(Row(field.name, field.number, type_, shapes[type_], repeated,
                        enum_name if values is not None else None))
    _check_unique(rows)
    rows.sort(key=lambda row: row.number)
    return Table(tuple(rows), {name: enums[name] for name in sorted(enums)})


#: The values an integer field of each type can hold.
_INTEGER_LIMITS = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}


def check_ranges(rows: Sequence[Row], ranges: Dict[str, Tuple[int, int, str]]
                 ) -> Dict[str, Tuple[int, int, str]]:
    """The ranges of ``ranges`` whose fields the table has, sorted by name, each checked
    against its field (`missing_ranges` names the others).

    Raises:
        GenerationError: a range names a field that is not a single integer, or has bounds
            that are out of order or outside the field's type.
    """
    by_name = {row.name: row for row in rows}
    for name, (lowest, highest, why) in ranges.items():
        row = by_name.get(name)
        if row is None:
            continue
        if row.type not in _INTEGER_LIMITS or row.repeated:
            raise GenerationError(f"RANGES names {name}, a {'repeated ' if row.repeated else ''}"
                                  f"{row.type} field: ranges are for single integers")
        floor, ceiling = _INTEGER_LIMITS[row.type]
        if not floor <= lowest <= highest <= ceiling or not why:
            raise GenerationError(f"RANGES[{name!r}] = {lowest}..{highest} does not fit an "
                                  f"{row.type} (or says no why)")
    return {name: ranges[name] for name in sorted(ranges) if name in by_name}


def missing_ranges(rows: Sequence[Row], ranges: Dict[str, Tuple[int, int, str]]) -> List[str]:
    """The fields ``ranges`` names that the table does not have (a field XLA removed)."""
    names = {row.name for row in rows}
    return sorted(name for name in ranges if name not in names)


def _resolve(type_: str, debug: _Message, top: _Message, external_enums: Sequence[str],
             external_messages: Sequence[str], where: str):
    """(type, enum name, enum values) for a field's declared type."""
    if type_.startswith("map<"):
        if type_ != MAP_STRING_STRING:
            raise GenerationError(f"{where}: {type_} is not a shape pjrt carries (only "
                                  f"{MAP_STRING_STRING})")
        return MAP_STRING_STRING, None, None
    if type_ in PROTO_SCALARS:
        return type_, None, None
    if type_ in external_enums:
        return "enum", type_.rsplit(".", 1)[-1], None
    if type_ in external_messages:
        return "message", None, None
    # Names are looked up in DebugOptions first, then at the top of the file, as protoc
    # does for a name declared in this file (with or without the package prefix).
    short = type_.lstrip(".")
    for prefix in ("xla.", f"xla.{MESSAGE}.", f"{MESSAGE}."):
        if short.startswith(prefix):
            short = short[len(prefix):]
    for scope in (debug, top):
        if short in scope.enums:
            values = tuple(scope.enums[short])
            if not values:
                raise GenerationError(f"{where}: enum {short} has no values")
            return "enum", short, values
        if short in scope.messages:
            return "message", None, None
    raise GenerationError(
        f"{where}: type {type_} is not declared in this file; if it is an enum or a message "
        f"of another file, say so with --enum {type_} or --message {type_}")


def _check_unique(rows: Sequence[Row]) -> None:
    seen_numbers: Dict[int, str] = {}
    seen_names = set()
    for row in rows:
        if row.number in seen_numbers:
            raise GenerationError(f"{MESSAGE}.{row.name} and {MESSAGE}."
                                  f"{seen_numbers[row.number]} share the number {row.number}")
        if row.name in seen_names:
            raise GenerationError(f"{MESSAGE}.{row.name} is declared twice")
        if not 1 <= row.number < (1 << 29):
            raise GenerationError(f"{MESSAGE}.{row.name} has the number {row.number}, outside "
                                  f"1..2**29-1")
        seen_numbers[row.number] = row.name
        seen_names.add(row.name)


# ---------------------------------------------------------------------------------------------
# Writing the module
# ---------------------------------------------------------------------------------------------


def python_member_names(enum_name: str, values: Sequence[Tuple[str, int]]) -> List[str]:
    """The Python member names of an enum: the proto names without the prefix that the
    protobuf style guide has every value carry (``AUTOTUNE_CACHE_MODE_READ`` of
    ``AutotuneCacheMode`` is ``READ``, as jaxlib names it), where every value has that prefix
    and every name left is a usable identifier; else the proto names unchanged."""
    prefix = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_",
                    enum_name).upper() + "_"
    names = [name for name, _ in values]
    stripped = [name[len(prefix):] for name in names]
    if all(name.startswith(prefix) for name in names) and all(
            s.isidentifier() and not keyword.iskeyword(s) and not s[0].isdigit()
            for s in stripped):
        return stripped
    return names


def _q(text: str) -> str:
    """A Python string literal in double quotes (the house style)."""
    return json.dumps(text)


def render(table: Table, commit: str) -> str:
    """The text of the generated module for ``table``, read from ``commit``'s file."""
    names = ["SOURCE", "FIELDS", "ENUMS", "ENUM_VALUES", "RANGES", *table.enums]
    out: List[str] = [f'''"""XLA's ``DebugOptions`` message as data: its fields and their enums.

GENERATED by scripts/generate-debug-options.py; do not edit. It was made from
{UPSTREAM_REPOSITORY}'s ``{UPSTREAM_PATH}`` at commit {commit} with

    python scripts/generate-debug-options.py PATH/TO/{UPSTREAM_PATH} \\
        --commit {commit}

and the same command with ``--check`` says whether this file is what it writes.
`pjrt.compile_options.DebugOptions` is built from `FIELDS`.
"""
from __future__ import annotations

import enum
from typing import Dict, Optional, Tuple, Type

__all__ = [
{"".join(f"    {_q(name)},{chr(10)}" for name in names)}]

#: Where the table comes from: (repository, path, commit).
SOURCE = ({_q(UPSTREAM_REPOSITORY)}, {_q(UPSTREAM_PATH)}, {_q(commit)})''']
    for name, values in table.enums.items():
        out.append(f"\n\nclass {name}(enum.IntEnum):")
        out.append(f'    """``xla.{MESSAGE}.{name}``."""\n')
        for member, (_, number) in zip(python_member_names(name, values), values):
            out.append(f"    {member} = {number}")
    out.append("\n")
    out.append("#: Every enum of the table by its proto name.")
    out.append("ENUMS = {")
    out.extend(f"    {_q(name)}: {name}," for name in table.enums)
    out.append("}")
    out.append("")
    out.append("#: Every enum's values as the proto names them: ((name, number), ...) in "
               "declaration")
    out.append("#: order. The classes above drop the prefix every value of an enum carries, "
               "where")
    out.append("#: they all do (AUTOTUNE_CACHE_MODE_READ is AutotuneCacheMode.READ).")
    out.append("ENUM_VALUES = {")
    for name, values in table.enums.items():
        out.append(f"    {_q(name)}: (")
        out.extend(f"        ({_q(value)}, {number})," for value, number in values)
        out.append("    ),")
    out.append("}")
    out.append("")
    out.append("#: (name, number, type, wire type, repeated, enum) per field, in number order. The")
    out.append("#: type is bool, int32, int64, float, double, string, enum, message or")
    out.append("#: map<string, string>; the wire type is that of one value (0 VARINT, 1 I64, "
               "2 LEN,")
    out.append("#: 5 I32), repeated numbers being packed; enum is the enum class, or None where")
    out.append("#: the values are not known (an enum of another file).")
    out.append("FIELDS: Tuple[Tuple[str, int, str, int, bool, Optional[Type[enum.IntEnum]]], ...] "
               "= (")
    for row in table.rows:
        enum_ref = row.enum if row.enum is not None else "None"
        out.append(f"    ({_q(row.name)}, {row.number}, {_q(row.type)}, {row.wire_type}, "
                   f"{row.repeated}, {enum_ref}),")
    out.append(")")
    out.append("")
    out.append("#: The integer fields whose values outside a range end XLA's compile instead of "
               "failing")
    out.append("#: it: name -> (lowest, highest, what the field is and what happens outside). "
               "Kept in")
    out.append("#: scripts/generate-debug-options.py (RANGES), where it says how each was found.")
    out.append("RANGES: Dict[str, Tuple[int, int, str]] = {")
    for name, (lowest, highest, why) in table.ranges.items():
        out.append(f"    {_q(name)}: (")
        out.append(f"        {lowest}, {highest},")
        for line in _wrapped(why, 88 - 9):
            out.append(f"        {_q(line)}")
        out[-1] += "),"
    out.append("}")
    return "\n".join(out) + "\n"


def _wrapped(text: str, width: int) -> List[str]:
    """``text`` cut at spaces into pieces whose literals fit ``width`` columns (the pieces
    keep their spaces, so that the literals concatenate back to ``text``)."""
    pieces: List[str] = []
    line = ""
    for word in text.split(" "):
        candidate = f"{line} {word}" if line else word
        if line and len(_q(candidate + " ")) > width:
            pieces.append(line + " ")
            line = word
        else:
            line = candidate
    pieces.append(line)
    return pieces


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("proto", type=Path, help=f"a copy of {UPSTREAM_PATH}")
    parser.add_argument("--commit", required=True,
                        help=f"the {UPSTREAM_REPOSITORY} commit the copy is from")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--enum", action="append", default=[], metavar="TYPE",
                        help="a field type that is an enum of another file")
    parser.add_argument("--message", action="append", default=[], metavar="TYPE",
                        help="a field type that is a message of another file")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the output file is not what would be written")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{7,40}", args.commit):
        parser.error(f"--commit {args.commit!r} is not a git commit (hex digits)")
    try:
        table = build_table(args.proto.read_text(), args.enum, args.message)
        table = table._replace(ranges=check_ranges(table.rows, RANGES))
    except (GenerationError, OSError) as error:
        print(f"generate-debug-options: {error}", file=sys.stderr)
        return 2
    for name in missing_ranges(table.rows, RANGES):
        print(f"generate-debug-options: note: RANGES names {name}, which this {MESSAGE} does "
              f"not have; its range is left out", file=sys.stderr)
    text = render(table, args.commit)
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"generate-debug-options: {args.output} is not what {args.proto} gives; "
                  f"run without --check to rewrite it", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}: {len(table.rows)} fields, {len(table.enums)} enums")
    return 0


if __name__ == "__main__":
    sys.exit(main())
