"""Every module path a docstring or comment of the core names exists.

Docstrings and comments point readers at other modules (``pjrt._capi.handles``,
``pjrt/_runtime/host_reads.py``, ``_native/host_views.c``); a path left behind by a move sends
the reader to a file that is not there. Dotted paths are resolved by importing them (a module,
then attributes of it), not through the old paths ``pjrt._moved`` still answers; file paths
against the package's files. ``_moved.py`` itself, which lists old paths, is left out, and
so is an old path on a line that calls it one.
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import tokenize

import pjrt
from pjrt import _moved

CORE = os.path.dirname(os.path.abspath(pjrt.__file__))
#: ``pjrt.a.b``, not inside a longer dotted name or a file name.
DOTTED = re.compile(r"(?<![\w.\-/])pjrt((?:\.[A-Za-z_]\w*)+)")
#: A file of the package: ``pjrt/x.py``, ``_native/y.c``, ``_runtime/z.py`` and the like.
FOLDERS = ("pjrt", "_native", "_capi", "_runtime", "_registry", "_loading", "_sharding", "_wire",
           "_compile", "_app", "_distributed", "_profiling")
FILE = re.compile(r"(?<![\w/.])((?:" + "|".join(FOLDERS) + r")/[\w/]+\.(?:py|pyi|c|h))\b")


def sources():
    """``(file, line number, text)`` of each comment and docstring of the core (every line of
    the C files, whose comments are their only prose)."""
    for folder, _, files in os.walk(CORE):
        for name in sorted(files):
            if not name.endswith((".py", ".pyi", ".c", ".h")) or name == "_moved.py":
                continue
            path = os.path.join(folder, name)
            where = os.path.relpath(path, CORE)
            text = open(path, encoding="utf-8").read()
            if not name.endswith((".py", ".pyi")):
                yield from ((where, n, line) for n, line in enumerate(text.splitlines(), 1))
                continue
            with open(path, "rb") as source:
                for token in tokenize.tokenize(source.readline):
                    if token.type == tokenize.COMMENT:
                        yield where, token.start[0], token.string
            for node in ast.walk(ast.parse(text)):
                if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                        and isinstance(node.value.value, str)):  # docstrings, bare strings
                    for offset, line in enumerate(node.value.value.splitlines()):
                        yield where, node.lineno + offset, line


def dotted_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[-1] in ("py", "pyi", "so", "c", "h"):
        return True  # a file name ("pjrt.py"), not a path
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in _moved.MOVED_MODULES:
            return False  # answered by the shim, but not where the module is
        try:
            target = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attribute in parts[k:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def file_exists(path: str) -> bool:
    relative = path.split("/", 1)[1] if path.startswith("pjrt/") else path
    return os.path.exists(os.path.join(CORE, relative))


def test_every_module_path_the_core_names_exists():
    missing = []
    for where, number, line in sources():
        for match in DOTTED.finditer(line):
            dotted = "pjrt" + match.group(1)
            if "old path" in line and dotted in _moved.MOVED_MODULES:
                continue  # an old path named as one, while the shim still answers it
            if not dotted_exists(dotted):
                missing.append(f"{where}:{number}: {dotted}")
        for match in FILE.finditer(line):
            if not file_exists(match.group(1)):
                missing.append(f"{where}:{number}: {match.group(1)}")
    assert not missing, "paths named in the core that do not exist:\n" + "\n".join(missing)


def test_the_check_finds_a_stale_path():
    """The patterns see both forms (a check that matched nothing would pass anything)."""
    line = "see pjrt._runtime.no_such_module and pjrt/_capi/no_such_file.py"
    assert [m.group(0) for m in DOTTED.finditer(line)] == ["pjrt._runtime.no_such_module"]
    assert [m.group(1) for m in FILE.finditer(line)] == ["pjrt/_capi/no_such_file.py"]
    assert not dotted_exists("pjrt._runtime.no_such_module")
    assert not file_exists("pjrt/_capi/no_such_file.py")
    assert dotted_exists("pjrt._runtime.host_reads.to_numpy") and file_exists("_native/shim.h")
