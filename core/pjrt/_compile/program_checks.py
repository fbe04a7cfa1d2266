"""Structural checks of a StableHLO text program, made before a plugin's compiler sees it.

XLA's compiler trusts what it is given: a sharding whose tile assignment does not hold its
own device count, ``{manual}`` on an argument of ``main``, or a function that calls itself end
the process (a check failure, a division by zero, a stack overflow) instead of returning an
error. What can be checked from the text is checked here, in one linear pass per kind, so that
such a program is refused with an error that names the attribute or the functions:

* every ``mhlo.sharding = "..."`` (on arguments, results and operations) parses as a sharding
  ([`pjrt.hlo_sharding.HloSharding.from_string`][pjrt.hlo_sharding.HloSharding.from_string]), holds no more devices than the program
  is compiled for (exactly as many when it is partitioned), and ``main`` takes and returns no
  ``{manual}`` or ``{unknown}`` value in a partitioned program;
* every ``sdy.mesh`` is well formed and fits the devices (its device ids are in range and
  distinct), and every Shardy tensor sharding names a defined mesh (or carries an inline one
  that fits) and that mesh's axes: ``#sdy.sharding<...>`` on arguments and results, each
  entry of ``#sdy.sharding_per_value<[...]>`` on operations, and the shardings of
  ``sdy.sharding_constraint``, ``sdy.reshard`` and the ``in_shardings``/``out_shardings`` of
  ``sdy.manual_computation``. A sub-axis ``"x":(p)s`` (the ``s`` devices of axis ``x`` after
  its first ``p``) must have ``p >= 1``, ``1 < s <`` the axis size and ``p * s`` dividing
  it: XLA computes ``p * s`` in 64 bits and divides by it, so ``"y":(4611686018427387904)4``
  ends the process (SIGFPE) in both tested plugins;
* no function reaches itself through ``func.call`` (or any symbol reference to a function):
  XLA inlines calls recursively and overflows its stack on a cycle.

Bytecode cannot be read without MLIR; `pjrt._wire.mlir_bytecode` checks its container instead.
"""
from __future__ import annotations

import math
import re

from ..hlo_sharding import HloSharding
from .._sharding.program_text import parse_sdy_mesh, parse_sdy_sharding

__all__ = ["check_program_structure", "check_shardings", "check_main_shardings",
           "check_no_recursion",
           "MAX_SHARDING_DEVICES"]

#: The most devices a sharding of an unpartitioned program may name: XLA ignores such a
#: sharding but still builds its device list (``<=[2147483647]`` takes 16 GB, then aborts).
MAX_SHARDING_DEVICES = 1 << 16

#: (The string's body as an unrolled loop: runs of plain characters, then escapes; matching
#: it a character at a time through an alternation costs ten times as much.)
_MHLO_SHARDING = re.compile(rb'mhlo\.sharding\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"')
_SDY_MESH = re.compile(rb'sdy\.mesh\s+@("(?:[^"\\]|\\.)*"|[\w.$-]+)\s*=\s*')
_SDY_SHARDING = re.compile(rb"#sdy\.sharding<")
#: Where Shardy tensor shardings are written: ``#sdy.sharding<``, ``#sdy.sharding_per_value<``
#: (a list), the operand of ``sdy.sharding_constraint``/``sdy.reshard``, and the lists of
#: ``sdy.manual_computation``. (Three patterns, each led by a literal, which the regex
#: engine finds at C speed; one alternation of them scans twenty times slower.)
_SDY_TENSOR_SHARDINGS = (
    re.compile(rb"#sdy\.sharding(_per_value)?<"),
    re.compile(rb"sdy\.(?:sharding_constraint|reshard)\s+%[\w#.$-]+\s*(?=<)()"),
    re.compile(rb"_shardings\s*=\s*(?=\[)()"),  # after "in" or "out" (checked in the loop)
)
_IN_OR_OUT = re.compile(rb"(?:^|\W)(?:in|out)$")
#: An axis of a tensor sharding: its quoted name, and a sub-axis's ``:(pre-size)size``.
_SDY_AXIS_REF = re.compile(rb'"((?:[^"\\]|\\.)*)"(?:\s*:\s*\(\s*(-?\d+)\s*\)\s*(-?\d+))?')
_SDY_MESH_REFERENCE = re.compile(rb'<\s*@("(?:[^"\\]|\\.)*"|[\w.$-]+)|<\s*(?:mesh\s*)?(?=<)')
_FUNCTION = re.compile(rb'func\.func\s+(?:(?:public|private|nested)\s+)?@("(?:[^"\\]|\\.)*"|[\w.$-]+)')
_SYMBOL_REFERENCE = re.compile(rb'@("(?:[^"\\]|\\.)*"|[\w.$-]+)')


def check_program_structure(program: bytes, partitions: int, signature=None) -> None:
    """All the checks of this module, for a text program compiled over ``partitions``
    partitions (1: not partitioned); ``signature`` is ``main``'s
    (`pjrt._sharding.program_text.ProgramSignature`), when it could be read.

    Raises:
      ValueError: naming the attribute or functions at fault and what to do.
    """
    check_shardings(program, partitions)
    if signature is not None and partitions > 1:
        check_main_shardings(signature)
    check_no_recursion(program)


def check_main_shardings(signature) -> None:
    """Refuse ``{manual}`` or ``{unknown}`` on an argument or result of a partitioned
    program's ``main`` (XLA fails a check on them and ends the process).

    Raises:
      ValueError: naming the argument or result.
    """
    for kind, shardings in (("argument", signature.input_shardings),
                            ("result", signature.output_shardings)):
        for index, sharding in enumerate(shardings):
            if isinstance(sharding, HloSharding) and (sharding.is_manual()
                                                      or sharding.is_unknown()):
                raise ValueError(
                    f"{kind} {index} of the program's @main has mhlo.sharding = "
                    f"\"{sharding}\": a partitioned program's arguments and results must be "
                    f"laid out over the devices (manual and unknown shardings belong inside "
                    f"the program, on the values shard_map makes manual); fix the annotation")


def _line_of(program: bytes, offset: int) -> int:
    return program.count(b"\n", 0, offset) + 1


def _unescape(text: bytes) -> str:
    # MLIR string escapes: \" \\ and \XX (two hex digits).
    out = re.sub(rb"\\([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text)
    return out.replace(b'\\"', b'"').replace(b"\\\\", b"\\").decode("utf-8", "replace")


def check_shardings(program: bytes, partitions: int) -> None:
    """Check every GSPMD and Shardy sharding annotation of a text program (see the module's
    docstring).

    Raises:
      ValueError: naming the attribute, its line and what is wrong.
    """
    has_mhlo = b"mhlo.sharding" in program
    has_sdy = b"sdy." in program
    if not (has_mhlo or has_sdy):
        return
    if has_mhlo:
        # A program repeats few shardings many times: each distinct one is checked once (the
        # set is made at C speed; its position is looked up only to name it in an error).
        for text in set(_MHLO_SHARDING.findall(program)):
            _checked_hlo_sharding(program, text, partitions)
    if has_sdy:
        _check_sdy(program, partitions)


#: A "tiled" sharding over one device (`{devices=[1,1]0}`), as written for a one-device mesh:
#: XLA's sharding parser calls it invalid, yet plugins compile programs carrying it (the
#: annotation is dropped with one partition), so it is let through as they let it through.
_ONE_DEVICE_TILING = re.compile(r"\{devices=\[1(?:,1)*\](?:0|<=\[1\])\}")


def _checked_hlo_sharding(program: bytes, raw: bytes, partitions: int) -> None:
    text = _unescape(raw)
    if partitions <= 1 and _ONE_DEVICE_TILING.fullmatch(text):
        return
    try:
        sharding = HloSharding.from_string(text)
        for leaf in (sharding.tuple_elements() if sharding.is_tuple() else (sharding,)):
            _check_leaf(leaf, partitions)
    except ValueError as error:
        line = _line_of(program, program.find(b'"' + raw + b'"'))
        raise ValueError(f"the program's mhlo.sharding = \"{text}\" (line {line}) is not "
                         f"valid here: {error}; fix the annotation") from None


def _check_leaf(leaf: HloSharding, partitions: int) -> None:
    if leaf.is_maximal():
        device = leaf.unique_device()
        if device is not None and not 0 <= device < max(partitions, 1):
            raise ValueError(f"it places a value on device {device}, but the program is "
                             f"compiled for {partitions} partition(s)")
        return
    if not leaf.is_tiled():
        return
    count = math.prod(leaf.tile_assignment_dimensions)
    if partitions > 1 and count != partitions:
        raise ValueError(f"it spreads a value over {count} devices, but the program is "
                         f"compiled for {partitions}; compile it for {count} devices or fix it")
    if count > MAX_SHARDING_DEVICES:
        raise ValueError(f"it spreads a value over {count} devices, more than pjrt accepts "
                         f"({MAX_SHARDING_DEVICES})")


def _check_sdy(program: bytes, partitions: int) -> None:
    meshes = {}
    for match in _SDY_MESH.finditer(program):
        name = match.group(1).decode("utf-8", "replace")
        name = _unescape(name[1:-1].encode()) if name.startswith('"') else name
        line = _line_of(program, match.start())
        try:
            end = _closing_angle(program, match.end())
            mesh = parse_sdy_mesh(program[match.end():end].decode("utf-8", "replace"))
        except ValueError as error:
            raise ValueError(f"the program's sdy.mesh @{name} (line {line}) is malformed: "
                             f"{error}; fix the mesh") from None
        _check_sdy_mesh(mesh, f"sdy.mesh @{name} (line {line})", partitions)
        meshes[name] = mesh
    for match in _SDY_SHARDING.finditer(program):
        if program[match.start() - 1:match.start()] == b'"':
            continue  # inside a string (a frontend attribute): not read by the plugin as such
        try:
            end = _closing_angle(program, match.end() - 1)
        except ValueError as error:
            raise ValueError(f"the program's #sdy.sharding at line "
                             f"{_line_of(program, match.start())} is malformed: {error}") \
                from None
        attribute = program[match.start():end]
        if b'":(' in attribute or b'": (' in attribute:
            continue  # a sub-axis: pjrt's reader takes none; checked below
        try:
            sharding = parse_sdy_sharding(attribute.decode("utf-8", "replace"), meshes)
        except ValueError as error:
            raise ValueError(f"the program's {attribute.decode('utf-8', 'replace')} (line "
                             f"{_line_of(program, match.start())}) is not a valid sharding: "
                             f"{error}; fix the annotation") from None
        if sharding.mesh_name is None:
            _check_sdy_mesh(sharding.mesh, f"inline mesh of line "
                            f"{_line_of(program, match.start())}", partitions)
    _check_sdy_tensor_shardings(program, meshes, partitions)


def _check_sdy_tensor_shardings(program: bytes, meshes: dict, partitions: int) -> None:
    """Check every Shardy tensor sharding of the program against its mesh, sub-axes included
    (see the module's docstring). Each distinct sharding text is checked once."""
    checked: set[bytes] = set()
    matches = [match for pattern in _SDY_TENSOR_SHARDINGS for match in pattern.finditer(program)]
    for match in matches:
        if program[match.start() - 1:match.start()] == b'"':
            continue  # inside a string (a frontend attribute): not read by the plugin as such
        if match.group(0).startswith(b"_") and not _IN_OR_OUT.search(
                program, max(match.start() - 4, 0), match.start()):
            continue
        start = match.end() - 1 if match.group(0).startswith(b"#") else match.end()
        try:
            if program[start:start + 1] == b"[" or match.group(1):
                if match.group(1):  # #sdy.sharding_per_value<[...]>
                    start = _skip_space(program, start + 1)
                pieces = _list_items(program, start)
            else:
                pieces = [(start, _angle_end(program, start))]
        except ValueError as error:
            raise ValueError(f"the program's Shardy sharding at line "
                             f"{_line_of(program, match.start())} is malformed: {error}; fix "
                             f"the annotation") from None
        for begin, end in pieces:
            text = program[begin:end]
            if text in checked:
                continue
            try:
                inline_mesh = _check_tensor_sharding(text, meshes)
            except ValueError as error:
                raise ValueError(f"the program's Shardy sharding {text.decode('utf-8', 'replace')} "
                                 f"(line {_line_of(program, begin)}) is not valid: {error}; fix "
                                 f"the annotation") from None
            if inline_mesh is not None:
                _check_sdy_mesh(inline_mesh, f"inline mesh of line {_line_of(program, begin)}",
                                partitions)
            checked.add(text)


def _skip_space(program: bytes, index: int) -> int:
    while program[index:index + 1].isspace():
        index += 1
    return index


#: A ``<...>`` with no ``<`` inside (strings skipped): most shardings, matched at C speed.
_FLAT_ANGLE = re.compile(rb'<(?:[^<>"-]|"(?:[^"\\]|\\.)*"|-(?!>))*>')


def _angle_end(program: bytes, start: int) -> int:
    """`_closing_angle`, at C speed when nothing is nested."""
    flat = _FLAT_ANGLE.match(program, start)
    return flat.end() if flat is not None else _closing_angle(program, start)


def _list_items(program: bytes, start: int) -> list[tuple[int, int]]:
    """The ``<...>`` items of the list ``[<...>, <...>]`` that starts at ``start``."""
    if program[start:start + 1] != b"[":
        raise ValueError(f"expected '[' at line {_line_of(program, start)}")
    items, index = [], _skip_space(program, start + 1)
    if program[index:index + 1] == b"]":
        return items
    while True:
        end = _angle_end(program, index)
        items.append((index, end))
        index = _skip_space(program, end)
        separator = program[index:index + 1]
        if separator == b"]":
            return items
        if separator != b",":
            raise ValueError(f"expected ',' or ']' at line {_line_of(program, index)}")
        index = _skip_space(program, index + 1)


def _check_tensor_sharding(text: bytes, meshes: dict):
    """Check one tensor sharding ``<@mesh, [{"x":(1)2}, {}], replicated={"y"}>`` (or with an
    inline mesh ``<mesh<[...]>, ...>``): its mesh exists, and every axis it names is an axis
    of that mesh, sub-axes within it, none used twice. Returns its inline mesh, if any (for
    the caller to fit to the devices), else None."""
    reference = _SDY_MESH_REFERENCE.match(text)
    if reference is None:
        raise ValueError("it names no mesh ('@name' or an inline mesh<[...]>)")
    if reference.group(1) is not None:
        name = _symbol(reference.group(1))
        if name not in meshes:
            raise ValueError(f"it names mesh @{name}, which the program does not define "
                             f"(sdy.mesh @{name} = <[...]>)")
        mesh, rest, inline = meshes[name], text[reference.end():], None
    else:
        mesh_start = reference.end()
        mesh_end = _closing_angle(text, mesh_start)
        mesh = inline = parse_sdy_mesh(text[mesh_start:mesh_end].decode("utf-8", "replace"))
        rest = text[mesh_end:]
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    whole, parts = set(), set()
    for axis in _SDY_AXIS_REF.finditer(rest):
        name = _unescape(axis.group(1))
        if name not in sizes:
            raise ValueError(f"axis {name!r} is not an axis of its mesh "
                             f"{list(mesh.axis_names)}")
        if axis.group(2) is None:
            if name in whole:
                raise ValueError(f"axis {name!r} is used twice")
            whole.add(name)
            continue
        pre, size, full = int(axis.group(2)), int(axis.group(3)), sizes[name]
        # Exact integers here; the plugin multiplies pre and size in 64 bits and divides.
        if pre < 1 or not 1 < size < full or full % (pre * size):
            raise ValueError(f"sub-axis \"{name}\":({pre}){size} does not fit axis {name!r} "
                             f"of size {full} (it needs pre-size >= 1, 1 < size < {full}, and "
                             f"pre-size * size dividing {full})")
        if (name, pre, size) in parts:
            raise ValueError(f"sub-axis \"{name}\":({pre}){size} is used twice")
        parts.add((name, pre, size))
    overlap = whole & {name for name, _, _ in parts}
    if overlap:
        raise ValueError(f"axis {sorted(overlap)[0]!r} is used both whole and as a sub-axis")
    return inline


def _check_sdy_mesh(mesh, where: str, partitions: int) -> None:
    if any(size < 1 for size in mesh.axis_sizes):
        raise ValueError(f"the program's {where} has an axis of size < 1 ({mesh}); fix the mesh")
    size = math.prod(mesh.axis_sizes)
    limit = partitions if partitions > 1 else MAX_SHARDING_DEVICES
    if size > limit:
        raise ValueError(f"the program's {where} holds {size} devices, but the program is "
                         f"compiled for {partitions}; compile it for {size} devices or fix "
                         f"the mesh")
    ids = mesh.device_ids
    if ids is not None:
        if len(set(ids)) != len(ids) or any(not 0 <= i < max(partitions, size) for i in ids):
            raise ValueError(f"the program's {where} lists device ids {list(ids)}: they must "
                             f"be distinct and below {max(partitions, size)}; fix the mesh")


def _closing_angle(program: bytes, start: int) -> int:
    """Index just past the ``>`` matching the ``<`` at ``start`` (strings skipped; ``->``
    is no closer)."""
    if program[start:start + 1] != b"<":
        raise ValueError(f"expected '<' at offset {start}")
    depth, index, end = 0, start, len(program)
    while index < end:
        char = program[index]
        if char == 0x22:  # a string: skip to its closing quote
            index += 1
            while index < end and program[index] != 0x22:
                index += 2 if program[index] == 0x5C else 1
        elif char == 0x3C:
            depth += 1
        elif char == 0x3E and program[index - 1] != 0x2D:
            depth -= 1
            if depth == 0:
                return index + 1
        elif char == 0x0A and index - start > 1 << 16:
            break  # no attribute spans lines this long: stop, so that many unclosed '<' stay linear
        index += 1
    raise ValueError(f"the '<' at line {_line_of(program, start)} is never closed")


def check_no_recursion(program: bytes) -> None:
    """Refuse a text program whose functions call themselves, directly or through others.

    The call graph is read from the text: the functions are the ``func.func`` definitions,
    and a function calls every function its body refers to by symbol (``func.call @f``, a
    composite's ``decomposition = @f``, a custom call's ``called_computations``).

    Raises:
      ValueError: naming the cycle.
    """
    definitions = list(_FUNCTION.finditer(program))
    if len(definitions) < 1 or b"@" not in program:
        return
    names = [_symbol(m.group(1)) for m in definitions]
    known = set(names)
    calls: dict[str, set[str]] = {name: set() for name in names}
    for index, match in enumerate(definitions):
        body_end = definitions[index + 1].start() if index + 1 < len(definitions) else len(program)
        # The references after the function's own name: its signature and body.
        for reference in _SYMBOL_REFERENCE.finditer(program, match.end(), body_end):
            callee = _symbol(reference.group(1))
            if callee in known:
                calls[names[index]].add(callee)
    cycle = _find_cycle(calls)
    if cycle:
        path = " -> ".join(f"@{name}" for name in cycle)
        raise ValueError(f"the program's functions call themselves ({path}); XLA inlines "
                         f"every call and cannot compile recursion (it would overflow its "
                         f"stack). Write the repetition as a stablehlo.while loop instead")


def _symbol(raw: bytes) -> str:
    name = raw.decode("utf-8", "replace")
    return name[1:-1] if name.startswith('"') else name


def _find_cycle(calls: dict[str, set[str]]) -> list[str]:
    """A cycle of the call graph as a path that starts and ends at the same function, or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in calls:
        if root in state:
            continue
        path = [root]
        iterators = [iter(sorted(calls[root]))]
        state[root] = 1
        while iterators:
            callee = next(iterators[-1], None)
            if callee is None:
                state[path.pop()] = 2
                iterators.pop()
                continue
            seen = state.get(callee)
            if seen == 1:
                return path[path.index(callee):] + [callee]
            if seen is None:
                state[callee] = 1
                path.append(callee)
                iterators.append(iter(sorted(calls[callee])))
    return []
