"""The container of MLIR bytecode, checked before a plugin parses it.

A plugin's MLIR reader trusts the lengths and offsets written in bytecode; damaged bytes can
send it past the end of the buffer and end the process. `check_container` walks the
documented container (https://mlir.llvm.org/docs/BytecodeFormat/) in one linear pass and
refuses bytes whose structure is out of bounds:

* the magic ``ML\\xefR``, the version (a varint) and the producer string (NUL-terminated);
* each section: its id (``0..8``, each at most once), its length, its alignment (a power of
  two, with the ``0xCB`` padding bytes the format prescribes), all within the buffer;
* the sections every reader needs (strings, dialects, attributes and types, their offsets,
  the IR; and properties from version 5 on);
* the string section's lengths, which must fit its data;
* the attribute/type offset table: as many entries as it announces, each naming a dialect the
  dialect section holds, and together no longer than the attribute/type section.

What lies inside the sections (the operations, attributes and types) is for the plugin's
reader; damage there that still ends the process is what crash-isolated compilation
(`pjrt._compile.isolated_compile`) is for.
"""
from __future__ import annotations

__all__ = ["MAGIC", "is_bytecode", "check_container", "strings"]

#: The first four bytes of MLIR bytecode.
MAGIC = b"ML\xefR"

_STRING, _DIALECT, _ATTR_TYPE, _ATTR_TYPE_OFFSET, _IR, _RESOURCE, _RESOURCE_OFFSET, \
    _DIALECT_VERSIONS, _PROPERTIES = range(9)
_SECTION_NAMES = ("string", "dialect", "attribute/type", "attribute/type offset", "IR",
                  "resource", "resource offset", "dialect versions", "properties")
#: The bytecode version from which the properties section is required.
_NATIVE_PROPERTIES_VERSION = 5
#: Versions beyond this are for the plugin's reader to accept or refuse (it does so cleanly).
_MAX_ALIGNMENT = 1 << 16
_PADDING = 0xCB


def is_bytecode(program: bytes) -> bool:
    """Whether ``program`` starts like MLIR bytecode."""
    return program[:4] == MAGIC


class _Reader:
    __slots__ = ("data", "pos", "end", "what")

    def __init__(self, data: bytes, pos: int, end: int, what: str):
        self.data, self.pos, self.end, self.what = data, pos, end, what

    def fail(self, why: str) -> ValueError:
        return ValueError(f"the program's MLIR bytecode is damaged: {self.what}: {why} (at byte "
                          f"{self.pos} of {len(self.data)}); serialize the module again")

    def byte(self) -> int:
        if self.pos >= self.end:
            raise self.fail("it ends in the middle of a field")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        """MLIR's prefix varint: the first byte's trailing zeros count the bytes that follow
        (a zero first byte: eight follow)."""
        first = self.byte()
        if first & 1:
            return first >> 1
        if first == 0:
            extra, value, shift = 8, 0, 0
        else:
            extra = (first & -first).bit_length() - 1
            value, shift = first >> (extra + 1), 7 - extra
        if self.pos + extra > self.end:
            raise self.fail("it ends in the middle of a number")
        value |= int.from_bytes(self.data[self.pos:self.pos + extra], "little") << shift
        self.pos += extra
        return value


def check_container(program: bytes) -> None:
    """Refuse MLIR bytecode whose container is out of bounds (see the module's docstring).

    Raises:
      ValueError: naming the field that is damaged and where.
    """
    data = bytes(program)
    sections = _sections(data)
    _check_strings(data, *sections[_STRING])
    _check_attr_type_offsets(data, sections)


def strings(program: bytes) -> list[bytes]:
    """The strings of MLIR bytecode's string section (without their NUL terminators), in
    the order they are stored: every string attribute and symbol name of the module.

    Raises:
      ValueError: the container is damaged (as `check_container` says).
    """
    data = bytes(program)
    start, end = _sections(data)[_STRING]
    reader = _Reader(data, start, end, "the string section")
    count = reader.varint()
    if count > end - start:
        raise reader.fail(f"it announces {count} strings in {end - start} bytes")
    # The sizes (each with its NUL) are listed last string first; the data follows them.
    sizes = [reader.varint() for _ in range(count)][::-1]
    if sum(sizes) > reader.end - reader.pos:
        raise reader.fail(f"its strings take {sum(sizes)} bytes but {reader.end - reader.pos} "
                          f"remain")
    found, position = [], reader.pos
    for size in sizes:
        found.append(data[position:position + max(size - 1, 0)])
        position += size
    return found


def _sections(data: bytes) -> dict[int, tuple[int, int]]:
    """Where each section's contents start and end, after checking the header and the
    section table (and that the sections every reader needs are there)."""
    reader = _Reader(data, 0, len(data), "its header")
    if data[:4] != MAGIC:
        raise reader.fail("it does not start with the bytecode marker ML\\xefR")
    reader.pos = 4
    version = reader.varint()
    producer_end = data.find(b"\x00", reader.pos)
    if producer_end < 0:
        raise reader.fail("its producer string is not terminated")
    reader.pos = producer_end + 1
    sections: dict[int, tuple[int, int]] = {}
    while reader.pos < reader.end:
        reader.what = f"section {len(sections)}"
        id_and_aligned = reader.byte()
        section, aligned = id_and_aligned & 0x7F, id_and_aligned >> 7
        if section >= len(_SECTION_NAMES):
            raise reader.fail(f"unknown section id {section}")
        reader.what = f"the {_SECTION_NAMES[section]} section"
        if section in sections:
            raise reader.fail("it appears twice")
        length = reader.varint()
        if aligned:
            alignment = reader.varint()
            if alignment < 1 or alignment & (alignment - 1) or alignment > _MAX_ALIGNMENT:
                raise reader.fail(f"its alignment {alignment} is not a power of two up to "
                                  f"{_MAX_ALIGNMENT}")
            while reader.pos % alignment:
                if reader.byte() != _PADDING:
                    raise reader.fail("its padding is not the 0xCB bytes the format prescribes")
        if length > reader.end - reader.pos:
            raise reader.fail(f"it claims {length} bytes but {reader.end - reader.pos} remain")
        sections[section] = (reader.pos, reader.pos + length)
        reader.pos += length
    required = [_STRING, _DIALECT, _ATTR_TYPE, _ATTR_TYPE_OFFSET, _IR]
    if version >= _NATIVE_PROPERTIES_VERSION:
        required.append(_PROPERTIES)
    missing = [_SECTION_NAMES[s] for s in required if s not in sections]
    if missing:
        raise reader.fail(f"the section(s) {', '.join(missing)} are missing")
    return sections


def _check_strings(data: bytes, start: int, end: int) -> None:
    reader = _Reader(data, start, end, "the string section")
    count = reader.varint()
    if count > end - start:
        raise reader.fail(f"it announces {count} strings in {end - start} bytes")
    total = 0
    for _ in range(count):
        total += reader.varint()
    if total > reader.end - reader.pos:
        raise reader.fail(f"its strings take {total} bytes but {reader.end - reader.pos} "
                          f"remain")


def _check_attr_type_offsets(data: bytes, sections: dict) -> None:
    dialect_start, dialect_end = sections[_DIALECT]
    dialects = _Reader(data, dialect_start, dialect_end, "the dialect section").varint()
    start, end = sections[_ATTR_TYPE_OFFSET]
    reader = _Reader(data, start, end, "the attribute/type offset section")
    attributes, types = reader.varint(), reader.varint()
    if attributes + types > 2 * (end - start):
        raise reader.fail(f"it announces {attributes} attributes and {types} types in "
                          f"{end - start} bytes")
    available = sections[_ATTR_TYPE][1] - sections[_ATTR_TYPE][0]
    used = 0
    for remaining in (attributes, types):
        while remaining:
            dialect = reader.varint()
            if dialect >= dialects:
                raise reader.fail(f"an entry names dialect {dialect}, but the dialect section "
                                  f"holds {dialects}")
            count = reader.varint()
            if count == 0 or count > remaining:
                raise reader.fail(f"a group of {count} entries where {remaining} remain")
            remaining -= count
            for _ in range(count):
                used += reader.varint() >> 1
    if used > available:
        raise reader.fail(f"its entries span {used} bytes but the attribute/type section "
                          f"holds {available}")
