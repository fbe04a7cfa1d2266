"""The core's folders and their import rule (docs/architecture.md, "Folders and the import rule").

Each private subpackage may import only the folders and modules below it; the package face is
never imported from inside; importing pjrt and creating a client loads nothing of the compiler;
the modules below the client form a ladder, and the core's import graph has no cycle even with
annotation-only imports counted.
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
#: modules (``errors``). ``_compile`` is the top internal layer and ``_app`` (pjrt's own
#: programs) the top of all; both may import anything.
ALLOWED = {
    "_wire": {"errors", "dtypes"},
    "_capi": {"_wire", "errors", "dtypes", "layouts", "_pjrt_cffi", "_native_runtime"},
    "_loading": {"_capi", "errors"},
    "_sharding": {"_wire", "errors", "hlo_sharding", "mesh"},
    "_distributed": {"_capi", "_wire", "errors", "kv_store", "distributed", "_pjrt_cffi"},
    "_profiling": {"_capi", "_wire", "errors"},
    "_runtime": {"_capi", "_wire", "errors", "dtypes", "layouts", "hlo_sharding", "sharding",
                 "plugin", "array", "_pjrt_cffi", "_profiling"},
    "_registry": {"_loading", "errors", "client", "plugin", "topology"},
}
FOLDERS = set(ALLOWED) | {"_compile", "_app"}


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
            if folder in ("_compile", "_app") or target[1] == folder:
                continue
            if target[1] not in ALLOWED[folder]:
                broken.append(where)
    assert seen == FOLDERS, f"folders missing from the package: {FOLDERS - seen}"
    assert not broken, "imports against the folder rule:\n" + "\n".join(broken)


def test_nothing_in_the_library_imports_its_programs():
    """``_app`` (the ``pjrt`` command, the demo, ``pjrt conform``) is built on the library; the
    library never imports it, but ``python -m pjrt`` (``pjrt/__main__.py``) starts it."""
    found = []
    for parts, is_package, path in core_modules():
        if parts[1:2] == ["_app"] or parts == ["pjrt", "__main__"]:
            continue
        found += [f"{'.'.join(parts)}:{line}" for line, target in imports(parts, is_package, path)
                  if target[1:2] == ["_app"]]
    assert not found, found


def test_importing_pjrt_and_creating_a_client_loads_nothing_of_the_compiler(cpu_plugin):
    out = run_python('''
        import json, sys, pjrt
        client = pjrt.make_c_api_client("cpu" if pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1]) else "")
        assert len(client.devices()) >= 1
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("pjrt._compile"))))
        ''', cpu_plugin.library_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("old, new", [("pjrt.discovery", "pjrt._registry.discovery"),
                                      ("pjrt.registrations", "pjrt._registry.registrations"),
                                      ("pjrt.options", "pjrt._capi.options"),
                                      ("pjrt.cli", "pjrt._app.cli"),
                                      ("pjrt.conform.report", "pjrt._app.conform.report")])
def test_an_old_internal_path_still_imports_the_moved_module_with_a_warning(old, new):
    import importlib
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
               for w in caught)


def test_the_old_paths_kept_are_those_the_api_reference_documented():
    """Old paths are kept only where the API reference once named the module (``::: pjrt.x``
    in docs/api, as the history shows); internal modules that were never documented there
    (``pjrt.handles``, ``pjrt.compiler``, ``pjrt.waits``, ...) no longer import."""
    import importlib

    from pjrt import _moved

    kept = {old for old in _moved.MOVED_MODULES if old.count(".") == 1}
    assert kept == {"pjrt.cli", "pjrt.conform", "pjrt.demo", "pjrt.discovery",
                    "pjrt.executable_metadata", "pjrt.isolated_compile", "pjrt.options",
                    "pjrt.plugin_logging", "pjrt.registrations", "pjrt.serialization"}
    for old in ("pjrt.handles", "pjrt.compiler", "pjrt.waits", "pjrt._host_values"):
        sys.modules.pop(old, None)
        with pytest.raises(ImportError):
            importlib.import_module(old)


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
    ("pjrt._runtime.executable_metadata", "PJRT_Program"),
    ("pjrt.ffi", "PJRT_FFI_Register_Handler_Args"),
    ("pjrt._runtime.launches", "pjrt_shim_call"),  # our helper's own struct, reused call after call
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


# -- the layers of the core's middle ---------------------------------------------------------

#: From the bottom up (docs/architecture.md, "The layers below the client"): each module
#: imports only modules of the entries before it, counting every import -- at module level,
#: inside functions, and the annotation-only ones under ``if TYPE_CHECKING:``. The client sits
#: at the top; the modules below name it only as the protocol `pjrt.device.ClientView`.
LAYERS = ["pjrt.device", "pjrt.device_list", "pjrt.mesh", "pjrt._sharding.annotations",
          "pjrt.sharding", "pjrt._runtime.host_reads", "pjrt._runtime.dlpack_export",
          "pjrt.array",
          "pjrt._runtime.executable_metadata", "pjrt._runtime.numpy_arguments",
          "pjrt._runtime.launches", "pjrt._runtime.launcher", "pjrt._runtime.global_calls",
          "pjrt.executable",
          "pjrt._compile.isolated_compile", "pjrt._compile.pipeline", "pjrt.client"]


def full_import_graph() -> dict[str, set[str]]:
    """Core module -> the core modules it imports anywhere in its source, annotation-only
    imports included. The package face (``pjrt``) imports every public module lazily and is
    left out as an importer."""
    modules = {".".join(parts): (is_package, path) for parts, is_package, path in core_modules()}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (is_package, path) in modules.items():
        if name == "pjrt":
            continue
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    module = ".".join(base + (node.module.split(".") if node.module else []))
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names]
                targets = subs if node.module is None else [module, *subs]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_the_graph_reads_annotation_only_imports():
    """The graph the tests below judge sees imports under ``if TYPE_CHECKING:`` and inside
    functions (a reader that skipped them would pass anything)."""
    graph = full_import_graph()
    assert "pjrt.device" in graph["pjrt._runtime.numpy_arguments"]  # under TYPE_CHECKING only
    assert "pjrt._compile.pipeline" in graph["pjrt.client"]  # inside methods only
    assert "pjrt.array" in graph["pjrt.client"]


def test_the_core_import_graph_has_no_cycle_even_with_annotation_only_imports():
    graph = full_import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "import cycles (annotation-only imports included):\n" + "\n".join(
        " ".join(c) + "\n    " + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}"
                                          for m in c) for c in cycles)


def test_each_layer_imports_only_the_layers_below_it():
    graph = full_import_graph()
    assert set(LAYERS) <= set(graph), set(LAYERS) - set(graph)
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [f"{name} -> {target}" for name in LAYERS for target in sorted(graph[name])
              if target in rank and rank[target] >= rank[name]]
    assert not upward, "imports of a layer above (or beside):\n" + "\n".join(upward)


def test_nothing_below_the_array_layer_reaches_the_array_or_the_client():
    """Not even through a module outside `LAYERS`: what lies below ``pjrt.array`` never
    imports it, nor the client, however indirectly."""
    graph = full_import_graph()
    reached_from = {}
    for start in LAYERS[:LAYERS.index("pjrt.array")]:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        reached_from[start] = sorted(seen & {"pjrt.array", "pjrt.client"})
    assert not any(reached_from.values()), reached_from


def test_the_client_is_what_the_lower_layers_say_they_need(client):
    """`pjrt.device.ClientView` (what the layers below the client use of it) names only members
    a real Client has."""
    from pjrt.device import ClientView

    typing_own = {"_abc_impl", "_is_protocol", "_is_runtime_protocol"}
    members = set(ClientView.__annotations__) | {
        name for name in vars(ClientView) if not name.startswith("__") and name not in typing_own}
    assert {"raw_handle", "device_from_pointer", "platform", "plugin"} <= members
    # Through documented members only: what the client does for an internal mechanism (the
    # stand-ins of handler launches, the executables it lists) is a hook or the mechanism's
    # own state, not a member the client must widen its public face for.
    assert not [name for name in members if name.startswith("_")], members
    assert "stand_in" not in members and not hasattr(client, "stand_in")
    missing = sorted(name for name in members if not hasattr(client, name))
    assert not missing, missing


# -- one object, one place ------------------------------------------------------------------

def split_classes(limit: int = 450) -> list[str]:
    """Core classes that inherit from core classes defined in other modules which no other
    core class inherits from, over ``limit`` lines together (as the size rule counts a class):
    one object spread over several files to fit the rule, where composition belongs
    (docs/architecture.md, "One object, one place")."""
    classes: dict[str, list[tuple[str, list[str], int]]] = {}  # name -> [(module, bases, lines)]
    for parts, _, path in core_modules():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                lines = node.end_lineno - node.lineno + 1  # pyright: ignore[reportOperatorIssue]
                classes.setdefault(node.name, []).append((".".join(parts), bases, lines))
    subclasses: dict[str, int] = {}
    for defs in classes.values():
        for _, bases, _ in defs:
            for base in bases:
                subclasses[base] = subclasses.get(base, 0) + 1

    def pieces(module: str, bases: list[str]) -> list[tuple[str, int]]:
        found = []
        for base in bases:
            homes = classes.get(base, [])
            if len(homes) == 1 and homes[0][0] != module and subclasses[base] == 1:
                found.append((f"{homes[0][0]}.{base}", homes[0][2]))
                found += pieces(homes[0][0], homes[0][1])
        return found

    split = []
    for name, defs in classes.items():
        for module, bases, lines in defs:
            chain = pieces(module, bases)
            if chain and lines + sum(n for _, n in chain) > limit:
                split.append(f"{module}.{name}")
    return sorted(split)


def test_no_class_is_split_over_modules_through_a_base_that_exists_only_for_it():
    assert not split_classes()


def test_the_finder_of_split_classes_finds_one(tmp_path, monkeypatch):
    """The check above sees a class split through a base in another module (a finder that
    found nothing would pass anything)."""
    package = tmp_path / "pjrt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_base.py").write_text("class Base:\n" + "    x = 1\n" * 300)
    (package / "whole.py").write_text("from ._base import Base\n\n\nclass Whole(Base):\n"
                                      + "    y = 1\n" * 200)
    monkeypatch.setattr(sys.modules[__name__], "CORE", str(package))
    assert split_classes() == ["pjrt.whole.Whole"]


def test_the_registry_owns_its_registrations():
    """What is registered, discovered and chosen is an object the registry holds, not a
    base class: the registry's questions go to ``registered`` through its documented methods."""
    from pjrt._registry.registrations import Registrations
    from pjrt.registry import BackendRegistry

    assert BackendRegistry.__bases__ == (object,)
    registry = BackendRegistry(discover=False, environ={})
    assert isinstance(registry.registered, Registrations)
    registry.register_backend_factory("none", lambda: None, priority=3)
    assert registry.registered.entries["none"].priority == 3
    assert registry.registrations()["none"] is registry.registered.entries["none"]


def test_an_arrays_reads_to_the_host_are_functions_over_it(client):
    """An Array's reads to the host are a collaborator (free functions over the Array, as
    jaxlib's PyArray hands them to a PyHostValue), not a base class: the Array's only base is
    its C core, and its methods hand over to `pjrt._runtime.host_reads`."""
    import numpy as np

    from pjrt._capi.native_runtime import ArrayCore
    from pjrt._runtime import host_reads
    from pjrt.array import Array

    assert Array.__bases__ == (ArrayCore,)
    assert not [name for name, value in vars(host_reads).items()
                if isinstance(value, type) and issubclass(value, ArrayCore)]
    x = client.buffer_from_pyval(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert host_reads.to_numpy(x).tolist() == x.to_py().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_an_executable_holds_its_description_and_its_launcher(client):
    """A LoadedExecutable is composed, not split over bases: it holds its description (read
    once at load, a value its questions go to) and a launcher that holds what it launches."""
    import numpy as np

    from pjrt._runtime.executable_metadata import ExecutableMetadata
    from pjrt._runtime.launcher import Launcher
    from pjrt.executable import LoadedExecutable

    assert LoadedExecutable.__bases__ == (object,)
    executable = client.compile_and_load(open(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fixtures", "tiny_tanh.mlir")).read())
    assert isinstance(executable.metadata, ExecutableMetadata)
    assert isinstance(executable._launcher, Launcher)
    assert executable._launcher.metadata is executable.metadata
    assert executable.name() == executable.metadata.name()
    assert executable.input_shardings is executable.metadata.input_shardings
    assert executable.local_devices() == executable.metadata.local_devices()
    # A question asked of an executable nothing else holds keeps it loaded while it runs.
    assert client.compile_and_load(open(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fixtures", "tiny_tanh.mlir")).read()
    ).serialize()
    x = client.buffer_from_pyval(np.ones(8, np.float32))
    assert np.asarray(executable.execute([x, x])[0]).shape == (8,)


def test_ctypes_is_used_by_one_module_of_the_core():
    """Besides cffi (the PJRT C API) and the C extension (the per-call path), the one native
    boundary is pjrt._capi.python_api: CPython's C API and libc through ctypes."""
    import re

    found = {".".join(parts) for parts, _, path in core_modules()
             if re.search(r"^\s*(import ctypes|from ctypes\b)",
                          open(path, encoding="utf-8").read(), re.M)}
    assert found == {"pjrt._capi.python_api"}, sorted(found)


#: What the C boundary holds: the plugin's table, handles, waits and native calls, the structs
#: and options a plugin reads, the extensions' C calls. Policy built on them lives beside what it
#: governs (the address-space check in `_runtime`, helper processes' supervision in `_compile`,
#: an Array's DLPack export in `_runtime`).
CAPI_MODULES = {"api", "custom_partitioner", "dlpack_structs", "exit_guard", "ffi_handlers",
                "ffi_state", "handler_devices", "handles", "long_runs", "native_runtime",
                "off_thread", "options", "profiler_extension", "python_api", "ready_events",
                "staging", "stream_extension", "transfer_manager", "waits"}


def test_the_c_boundary_holds_what_it_says_and_the_architecture_page_draws_each_module():
    """`_capi` holds the modules `CAPI_MODULES` names, no more (a new one is a choice, made
    here); each module of `_capi` and `_runtime` has its row in docs/architecture.md; the
    policy moved out of `_capi` does not come back."""
    found = {parts[-1] for parts, is_package, _ in core_modules()
             if parts[1:2] == ["_capi"] and not is_package}
    assert found == CAPI_MODULES, (sorted(found - CAPI_MODULES), sorted(CAPI_MODULES - found))
    text = open(os.path.join(os.path.dirname(PLUGINS), "docs", "architecture.md"),
                encoding="utf-8").read()
    missing = [f"{parts[1]}/{parts[-1]}.py" for parts, is_package, _ in core_modules()
               if parts[1:2] in (["_capi"], ["_runtime"]) and not is_package
               and f"`{parts[1]}/{parts[-1]}.py`" not in text]
    assert not missing, missing
    from pjrt._runtime import dlpack_export, memory_headroom  # noqa: F401 - their homes
    from pjrt._compile import parent_watch  # noqa: F401


def test_no_module_imports_something_under_its_own_name():
    """A module never imports another thing under its own name: ``pjrt.ffi`` (XLA's custom
    calls) takes cffi's ``ffi`` as ``cffi_ffi``, so a reader of ``cffi_ffi.cast(...)`` there is
    never left to guess which FFI is meant."""
    imported_as_own_name = []
    for parts, is_package, path in core_modules():
        if is_package:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue  # (``annotations`` imports nothing named annotations)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and parts[-1] in [
                    a.asname or a.name.split(".")[0] for a in node.names]:
                imported_as_own_name.append((".".join(parts), node.lineno))
    assert not imported_as_own_name, imported_as_own_name


# -- one way to bracket a native call ---------------------------------------------------------

#: Modules whose native call hands its ticket to a worker thread, which ends it when an
#: abandoned launch or compile finishes there: ``ClientHandle.begin``/``end``, which such a
#: ticket needs, since it outlives the block that took it.
TICKETS_HANDED_ON = {"pjrt._runtime.launches", "pjrt._capi.long_runs",
                     "pjrt._compile.pipeline", "pjrt.topology"}

#: Each way of bracketing a native call, as it is written in Python.
_BRACKETS = {
    "with calling()": r"\.calling\(",
    "begin/end": r"\bhandle\.begin\(\)",
    "take_ticket/end": r"\.take_ticket\(\)",
    "decorator": r"^\s*@\s*[\w.]*(native_method|native_call|_client_call)\b",
}


def bracket_spellings(text: str) -> set[str]:
    """The ways ``text`` brackets a native call (see `_BRACKETS`)."""
    import re

    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return {name for name, pattern in _BRACKETS.items() if re.search(pattern, code, re.M)}


def test_a_native_call_is_bracketed_one_way():
    """Every native call on a client's objects opens with ``with handle.calling():`` (the open
    check and the count of calls in flight, as sqlite3 opens each method with its connection
    check); ``begin``/``end`` only where the ticket is handed to a worker, and the handle's own
    module alone takes tickets without the check."""
    found = {}
    for parts, _, path in core_modules():
        name = ".".join(parts)
        if name != "pjrt._capi.handles":
            found[name] = bracket_spellings(open(path, encoding="utf-8").read())
    uses = {name: spellings - {"with calling()"} for name, spellings in found.items()}
    assert {name for name, rest in uses.items() if rest - {"begin/end"}} == set(), \
        {name: rest for name, rest in uses.items() if rest - {"begin/end"}}
    assert {name for name, rest in uses.items() if "begin/end" in rest} == TICKETS_HANDED_ON
    assert sum("with calling()" in spellings for spellings in found.values()) >= 15


def test_the_bracket_finder_finds_each_spelling():
    planted = ("@handles.native_method\ndef f(self): pass\n"
               "ticket = handle.take_ticket()\n"
               "ticket = self.handle.begin()\n"
               "with client.raw_handle.calling():\n    pass\n"
               "recorder.begin()  # handle.take_ticket() in a comment\n")
    assert bracket_spellings(planted) == set(_BRACKETS)
    assert bracket_spellings("recorder.begin()\n# handle.begin()\n") == set()
