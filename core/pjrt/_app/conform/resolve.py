"""Which library a ``pjrt conform PLUGIN`` argument names, without loading it here.

The library is loaded only in worker processes, where a crash in ``dlopen`` or ``GetPjrtApi``
is a check's failure. So a platform name is resolved from the plugin packages' declarations
and PJRT_NAMES_AND_LIBRARY_PATHS, as pjrt's discovery would find them, but nothing is loaded.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable, Mapping, Union, cast

from ..._registry import discovery
from ..._loading import elf as _elf
from ...errors import PluginLoadError
from ...plugin_api import PluginDeclaration


@dataclasses.dataclass(frozen=True)
class Target:
    """The plugin under test.

    Attributes:
      library: the shared library's absolute path.
      name: the name it is loaded under in the workers (its platform name when known).
      options: create options its package declares (none for a bare library).
    """

    library: str
    name: str
    options: dict


#: What a package declares: a library path or a function finding it; create options or a
#: function making them.
_Library = Union[str, "os.PathLike[str]", Callable[[], str]]
_Options = Union[Mapping[str, Any], Callable[[], Mapping[str, Any]], None]


def _looks_like_path(plugin: str) -> bool:
    return os.sep in plugin or plugin.endswith(".so") or os.path.exists(plugin)


def _declarations() -> dict[str, tuple[_Library, _Options]]:
    """platform -> (library or a function finding it, options) of installed plugin packages."""
    found: dict[str, tuple[_Library, _Options]] = {}
    for module, for_jax, directory in discovery.iter_classified(discovery.find_plugin_modules()):
        if for_jax:  # JAX's own wheel: its library sits beside the module
            library = discovery.find_library(directory)
            if library is not None:
                found.setdefault(discovery.platform_of_jax_module(module.module), (library, None))
            continue
        try:
            loaded = importlib.import_module(module.module)
        except Exception:  # noqa: BLE001 - a broken package is not the plugin asked for
            continue
        declared = [value for value in vars(loaded).values()
                    if isinstance(value, PluginDeclaration) and value.library is not None]
        for value in declared:
            found.setdefault(value.platform, (value.library, value.options))
        platform, finder = getattr(loaded, "PLATFORM", None), getattr(loaded, "library_path", None)
        if not declared and isinstance(platform, str) and callable(finder):
            # A package written before declarations: its platform and library finder.
            found.setdefault(platform, (cast(Callable[[], str], finder), None))
    return found


def _plugin_in_directory(argument: str, directory: str) -> str:
    """The one PJRT plugin library directly inside ``directory`` (a wheel's package folder,
    say): the shared libraries there that export GetPjrtApi, judged from their headers.

    Raises:
      ValueError: none of them is a plugin, or several are; the message names what was
        looked at and what to give instead.
    """
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise ValueError(f"{argument}: cannot list the directory ({error.strerror})") from None
    libraries = [os.path.join(directory, name) for name in names
                 if ".so" in name and os.path.isfile(os.path.join(directory, name))]
    plugins = []
    for library in libraries:
        try:
            _elf.check_plugin_library(library, os.path.basename(library))
        except PluginLoadError:
            continue
        plugins.append(library)
    if len(plugins) == 1:
        return plugins[0]
    if plugins:
        raise ValueError(f"{argument} is a directory holding {len(plugins)} PJRT plugin "
                         f"libraries ({', '.join(os.path.basename(p) for p in plugins)}); "
                         f"give the path of the one to check")
    seen = (f"its shared libraries ({', '.join(os.path.basename(p) for p in libraries)}) "
            f"do not export GetPjrtApi" if libraries else "it holds no shared library (*.so)")
    raise ValueError(f"{argument} is a directory, and no PJRT plugin library is in it: {seen}; "
                     f"give the path of the plugin's shared library (a .so file that exports "
                     f"GetPjrtApi) or the platform name of an installed plugin")


def resolve_plugin(plugin: str) -> Target:
    """The `Target` that ``plugin`` (a library path, a directory holding one plugin
    library, or a platform name) names.

    Raises:
      ValueError: the path is not a file, a directory holds no plugin library or several, or
        no installed plugin serves that platform; the message lists the platforms that are
        installed.
    """
    if _looks_like_path(plugin):
        path = os.path.abspath(plugin)
        if os.path.isdir(path):
            path = _plugin_in_directory(plugin, path)
        if not os.path.isfile(path):
            raise ValueError(f"{plugin}: no such file; give the path of a PJRT plugin's shared "
                             f"library or the platform name of an installed plugin")
        return Target(path, os.path.basename(path), {})
    for entry in discovery.plugins_from_env(os.environ.get(discovery.ENV_VARIABLE)):
        if entry.name == plugin:
            return Target(os.path.abspath(entry.library_path), plugin, dict(entry.options or {}))
    declared = _declarations()
    if plugin not in declared:
        known = ", ".join(sorted(declared)) or "none"
        raise ValueError(f"no installed plugin serves platform {plugin!r} (installed: {known}); "
                         f"give the path of the plugin's shared library instead")
    library, options = declared[plugin]
    if callable(library):
        try:
            library = library()
        except FileNotFoundError as error:
            raise ValueError(f"platform {plugin!r}: {error}") from None
    if callable(options):
        options = options()
    return Target(os.path.abspath(os.fspath(library)), plugin, dict(options or {}))
