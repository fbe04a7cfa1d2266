"""Old import paths of internal modules that moved into private subpackages.

Until 0.1 the internal machinery sat beside the public modules (``pjrt.cli``,
``pjrt.options``, ...). It now lives in private subpackages (``pjrt._app``, ``pjrt._capi``,
...). The old paths that the API reference once documented keep working for one more
release: the import returns the moved module and warns once with a ``DeprecationWarning``
naming the new path. Old paths the API reference never named (``handles``, ``compiler``,
``waits``, ...) are not kept: they were never promised.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: Old dotted path -> new dotted path.
MOVED_MODULES: dict[str, str] = {
    "pjrt.cli": "pjrt._app.cli",
    "pjrt.conform": "pjrt._app.conform",
    "pjrt.demo": "pjrt._app.demo",
    "pjrt.discovery": "pjrt._registry.discovery",
    "pjrt.executable_metadata": "pjrt._runtime.executable_metadata",
    "pjrt.isolated_compile": "pjrt._compile.isolated_compile",
    "pjrt.options": "pjrt._capi.options",
    "pjrt.plugin_logging": "pjrt._loading.plugin_logging",
    "pjrt.registrations": "pjrt._registry.registrations",
    "pjrt.serialization": "pjrt._runtime.serialization",
    # A moved package's submodules are listed too: found through the old package's
    # ``__path__``, they would otherwise be imported a second time under the old name.
    **{f"pjrt.conform.{name}": f"pjrt._app.conform.{name}" for name in (
        "_context", "_registry", "_worker", "catalog", "checks_library", "checks_parallel",
        "checks_programs", "checks_runtime", "command", "programs", "report", "resolve",
        "runner")},
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is internal and moved to {self.new_name}; the old path goes away in "
            f"the next release. Use the public API (see the API reference) instead.",
            DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module returned by create_module is already imported."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers imports of an old path with the moved module (and a DeprecationWarning)."""

    def find_spec(self, fullname, path=None, target=None):
        new_name = MOVED_MODULES.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    """Puts the finder first on ``sys.meta_path``, once per process: it answers only the old
    paths, and must answer a moved package's submodules before the path finder finds their
    files through the package's ``__path__``."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
