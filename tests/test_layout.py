"""The core's folders and their import rule (docs/architecture.md, "Folders and the import rule").

Each private subpackage may import only the folders and modules below it; the package face is
never imported from inside; importing pjrt and creating a client loads nothing of the compiler.
"""
from __future__ import annotations

import ast
import json
import os
import sys
import warnings

import pytest

import pjrt
from conftest import run_python

CORE = os.path.dirname(os.path.abspath(pjrt.__file__))

#: What each private folder may import, besides itself: folders (``_wire``) and top-level
#: modules (``errors``). ``_compile`` is the top internal layer and may import anything.
ALLOWED = {
    "_wire": {"errors", "dtypes"},
    "_capi": {"_wire", "errors", "dtypes", "layouts", "_pjrt_cffi", "_hot_path"},
    "_loading": {"_capi", "errors", "plugin_logging"},
    "_sharding": {"_wire", "errors", "hlo_sharding", "mesh"},
    "_distributed": {"_capi", "errors", "kv_store", "distributed", "_pjrt_cffi"},
}
FOLDERS = set(ALLOWED) | {"_compile"}


def core_modules():
    for folder, _, files in os.walk(CORE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, CORE)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    yield ["pjrt", *rel[:-1]], True, path
                else:
                    yield ["pjrt", *rel], False, path


def is_module(parts):
    base = os.path.join(CORE, *parts[1:])
    return os.path.isfile(base + ".py") or os.path.isdir(base)


def imports(parts, is_package, path):
    """The pjrt modules a file imports (outside ``if TYPE_CHECKING:``), as dotted parts."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = parts if is_package else parts[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            else:
                target = (node.module or "").split(".")
            if target[0] != "pjrt":
                continue
            named = [target + [a.name] for a in node.names if is_module(target + [a.name])]
            if named and len(named) == len(node.names):
                yield from ((node.lineno, t) for t in named)
            else:
                yield node.lineno, target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pjrt":
                    yield node.lineno, a.name.split(".")
                elif a.name.split(".")[0].startswith("pjrt_"):
                    yield node.lineno, a.name.split(".")


def test_each_private_folder_imports_only_what_its_rule_allows():
    broken = []
    seen = set()
    for parts, is_package, path in core_modules():
        if len(parts) < 3 or parts[1] not in FOLDERS:
            continue
        seen.add(parts[1])
        folder = parts[1]
        for line, target in imports(parts, is_package, path):
            where = f"{'.'.join(parts)}:{line} imports {'.'.join(target)}"
            if target == ["pjrt"] or target[0] != "pjrt":
                broken.append(where + " (the package face or a plugin package)")
                continue
            if folder == "_compile" or target[1] == folder:
                continue
            if target[1] not in ALLOWED[folder]:
                broken.append(where)
    assert seen == FOLDERS, f"folders missing from the package: {FOLDERS - seen}"
    assert not broken, "imports against the folder rule:\n" + "\n".join(broken)


def test_importing_pjrt_and_creating_a_client_loads_nothing_of_the_compiler(cpu_plugin):
    out = run_python('''
        import json, sys, pjrt
        client = pjrt.make_c_api_client("cpu" if pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1]) else "")
        assert len(client.devices()) >= 1
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("pjrt._compile"))))
        ''', cpu_plugin.library_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("old, new", [("pjrt.handles", "pjrt._capi.handles"),
                                      ("pjrt.compiler", "pjrt._compile.pipeline"),
                                      ("pjrt.sharding_text", "pjrt._sharding.program_text")])
def test_an_old_internal_path_still_imports_the_moved_module_with_a_warning(old, new):
    import importlib
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
               for w in caught)


PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")


def test_plugin_packages_reach_the_core_only_through_plugin_api():
    """pjrt's own plugin packages import one module of the core, ``pjrt.plugin_api``
    (imports inside functions included), so that the core's other modules can change."""
    reached = {}
    packages = [os.path.join(PLUGINS, name, f"pjrt_{name}") for name in sorted(os.listdir(PLUGINS))]
    packages = [p for p in packages if os.path.isdir(p)]
    assert len(packages) >= 4
    for package in packages:
        for folder, _, files in os.walk(package):
            for name in (n for n in files if n.endswith(".py")):
                path = os.path.join(folder, name)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and not node.level:
                        module = node.module or ""
                        targets = ([f"{module}.{a.name}" for a in node.names]
                                   if module == "pjrt" else [module])
                    else:
                        continue
                    for target in targets:
                        if target.split(".")[0] == "pjrt":
                            reached.setdefault(target, []).append(
                                f"{os.path.relpath(path, PLUGINS)}:{node.lineno}")
    assert set(reached) == {"pjrt.plugin_api"}, reached


#: The C structs filled in by hand outside the C boundary (``_capi/``), by module; every other
#: struct is made by ``Api.new_args``. docs/architecture.md, section 1, lists the same.
HAND_BUILT_STRUCTS = {
    ("pjrt.options", "PJRT_NamedValue"),
    ("pjrt.executable_metadata", "PJRT_Program"),
    ("pjrt.ffi", "PJRT_FFI_Register_Handler_Args"),
    ("pjrt.ffi", "XLA_FFI_Error_Create_Args"),
    ("pjrt.executable", "pjrt_shim_call"),  # our helper's own struct, reused call after call
}


def test_c_structs_are_made_by_the_c_boundary_except_the_documented_few():
    import re

    from pjrt._pjrt_cffi import ffi

    # A struct, or an array of structs (not a pointer to a pointer, nor an array of them).
    allocation = re.compile(r'ffi\.new\(\s*"\s*(\w+)\s*(?:\*|\[\s*\d*\s*\])\s*"')
    found = set()
    for parts, _, path in core_modules():
        if parts[1:2] == ["_capi"] or parts[-1] == "_build_cffi":
            continue
        for name in allocation.findall(open(path, encoding="utf-8").read()):
            try:
                kind = ffi.typeof(name).kind
            except ffi.error:
                continue  # a C scalar type (char, int64_t, ...)
            if kind == "struct":
                found.add((".".join(parts), name))
    assert found == HAND_BUILT_STRUCTS
    text = open(os.path.join(os.path.dirname(PLUGINS), "docs", "architecture.md"),
                encoding="utf-8").read()
    for _, name in HAND_BUILT_STRUCTS:
        assert f"`{name}`" in text, name
