"""Every ```python block in README.md and docs/*.md runs as written.

Each file's blocks run in order, in one fresh interpreter with the CPU plugin as the only
backend and the repository root as the working directory (snippets open files under
examples/). A block that needs hardware or jax says so on a line of its own:
``# doctest: needs-gpu``, ``# doctest: needs-tpu`` or ``# doctest: needs-jax``; it is left
out, and the test reports which blocks were. A block that is not meant to run on its own (a
fragment of a plugin package) says ``# doctest: skip`` and why. A block that only includes a
file (``--8<-- "examples/NAME.py"``, on the docs site) is that file, which
tests/test_examples.py runs.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"#\s*doctest:\s*(needs-gpu|needs-tpu|needs-jax|skip)\b")
_INCLUDE = re.compile(r'^\s*--8<--\s*"[^"]+"\s*$')


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each ```python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in _BLOCK.finditer(text)]


def script_of(path: pathlib.Path) -> tuple[str, list[str]]:
    """The blocks of ``path`` that run, as one script, and a note for each one left out."""
    parts, left_out = [], []
    for number, code in python_blocks(path):
        lines = [line for line in code.splitlines() if line.strip()]
        if lines and all(_INCLUDE.match(line) for line in lines):
            left_out.append(f"{path.name}:{number} (an included file)")
            continue
        marker = _MARKER.search(code)
        if marker:
            left_out.append(f"{path.name}:{number} ({marker.group(1)})")
            continue
        parts.append(f"# --- {path.name}:{number}\n{code}")
    return "\n".join(parts), left_out


def test_the_documents_have_snippets():
    assert sum(len(python_blocks(p)) for p in DOCUMENTS) >= 5


def test_included_files_exist():
    for path in DOCUMENTS:
        for _, code in python_blocks(path):
            for line in code.splitlines():
                if _INCLUDE.match(line):
                    included = line.split('"')[1]
                    assert (ROOT / included).is_file(), f"{path.name} includes {included}"


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if script_of(p)[0].strip()],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_snippets_run(path, tmp_path):
    script, left_out = script_of(path)
    program = tmp_path / f"snippets_of_{path.stem}.py"
    program.write_text(script, encoding="utf-8")
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PJRT_PLATFORMS", "PJRT_CPU_DEVICE_COUNT", "PJRT_LOG_LEVEL")}
    environ.update(PJRT_PLATFORMS="cpu", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                            cwd=ROOT, env=environ, timeout=600)
    assert result.returncode == 0, (
        f"the python snippets of {path.name} failed (blocks start at '# --- {path.name}:LINE')"
        f":\n{result.stderr[-4000:]}")
    if left_out:
        print("left out:", ", ".join(left_out))


#: A Sphinx role (`:class:`...``): mkdocstrings renders it as literal text, not as a link.
_SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj|ref):`")


def test_docstrings_use_the_cross_references_the_site_renders():
    """The API reference is built by mkdocstrings, which links Markdown cross-references
    (`[Name][pjrt.module.Name]`) and shows Sphinx roles as raw text: none may be left."""
    found = []
    for package in (ROOT / "core" / "pjrt", *sorted((ROOT / "plugins").glob("*/pjrt_*"))):
        for path in sorted(package.rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _SPHINX_ROLE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "Sphinx roles in docstrings:\n" + "\n".join(found)
