"""Finding PJRT plugins installed in this environment, without importing what cannot help.

Three sources, read once when the registry is first used:

* modules under the ``jax_plugins`` namespace package, and entry points in the group
  ``jax_plugins`` — the convention JAX set, which plugin wheels already follow;
* the ``PJRT_NAMES_AND_LIBRARY_PATHS`` environment variable, for plugins that are not packaged.

A plugin module written for pjrt is imported and its ``initialize()`` registers it. A module
written for JAX alone (its source imports ``jax``) is not imported: its ``initialize()`` would
talk to JAX's registry, and importing it without JAX installed fails. When such a wheel carries
a PJRT library next to the module, that library is registered directly under the module's
platform name, unless a pjrt plugin already serves that platform.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import pkgutil
import re
import sys
import threading
from typing import Any, Iterator

from ..errors import PluginLoadError

logger = logging.getLogger(__name__)

PLUGIN_GROUP = "jax_plugins"
NAMESPACE_PACKAGE = "jax_plugins"
ENV_VARIABLE = "PJRT_NAMES_AND_LIBRARY_PATHS"

_IMPORTS_JAX = re.compile(r"^\s*(?:import\s+jax\b|from\s+jax[\s.])", re.MULTILINE)
_IMPORTS_PJRT = re.compile(r"^\s*(?:import\s+pjrt\b|from\s+pjrt[\s.])", re.MULTILINE)
_LIBRARY_NAME = re.compile(r".*(?:plugin|pjrt).*\.so$")
# JAX wheel module names carry the platform and a toolkit version: xla_cuda12, xla_rocm7.
_FOREIGN_MODULE_NAME = re.compile(r"^(?:xla_)?(?P<platform>[a-z]+?)\d*(?:_plugin)?$")


@dataclasses.dataclass(frozen=True)
class PluginModule:
    """A module found by discovery, and where it was found."""

    #: Importable module name, e.g. ``pjrt_cuda`` or ``jax_plugins.xla_cuda12``.
    module: str
    #: ``"entry point"`` or ``"namespace"``.
    source: str
    #: The distribution that installed it, when known.
    distribution: str | None = None


@dataclasses.dataclass
class DiscoveryRecord:
    """What discovery did with one plugin module or environment entry (for ``pjrt info``)."""

    name: str
    source: str
    action: str  # "initialized", "registered library", "skipped", "failed"
    detail: str = ""


def _entry_points():
    from importlib.metadata import entry_points

    return entry_points(group=PLUGIN_GROUP)


def find_plugin_modules() -> list[PluginModule]:
    """Every plugin module under the namespace package or advertised by an entry point."""
    found: dict[str, PluginModule] = {}
    try:
        namespace = importlib.import_module(NAMESPACE_PACKAGE)
    except ImportError:
        namespace = None
    if namespace is not None:
        for info in pkgutil.iter_modules(namespace.__path__, NAMESPACE_PACKAGE + "."):
            found.setdefault(info.name, PluginModule(info.name, "namespace"))
    for entry_point in _entry_points():
        module = entry_point.value.split(":")[0].strip()
        distribution = getattr(getattr(entry_point, "dist", None), "name", None)
        # An entry point names the same module the namespace scan found: keep one record.
        found[module] = PluginModule(module, "entry point", distribution)
    return sorted(found.values(), key=lambda m: m.module)


def _module_source(module: str) -> tuple[str | None, str | None]:
    """The module's source text and directory, found without importing the module."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None, None
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None, None
    directory = (os.path.dirname(spec.origin) if spec.origin.endswith("__init__.py")
                 or not spec.submodule_search_locations else list(spec.submodule_search_locations)[0])
    try:
        with open(spec.origin, encoding="utf-8", errors="replace") as f:
            return f.read(), directory
    except OSError:
        return None, directory


def written_for_jax(source: str) -> bool:
    """Whether a plugin module's source imports jax and not pjrt (so it is JAX's plugin)."""
    return bool(_IMPORTS_JAX.search(source)) and not _IMPORTS_PJRT.search(source)


def platform_of_jax_module(module: str) -> str:
    """The platform a JAX plugin module serves, from its name: ``xla_cuda12`` -> ``cuda``."""
    leaf = module.rsplit(".", 1)[-1]
    match = _FOREIGN_MODULE_NAME.match(leaf)
    return match.group("platform") if match else leaf


def find_library(directory: str | None) -> str | None:
    """A PJRT plugin library (``*plugin*.so`` / ``*pjrt*.so``) in ``directory``, if any."""
    if not directory or not os.path.isdir(directory):
        return None
    names = sorted(n for n in os.listdir(directory) if _LIBRARY_NAME.match(n))
    return os.path.join(directory, names[0]) if names else None


@dataclasses.dataclass(frozen=True)
class EnvPlugin:
    """One ``name:path`` entry of PJRT_NAMES_AND_LIBRARY_PATHS."""

    name: str
    library_path: str
    options: dict | None
    config_file: str | None = None


def read_plugin_config(json_path: str, entry_name: str | None = None) -> tuple[str, dict | None]:
    """``(library_path, create_options)`` from a plugin's JSON configuration file.

    Args:
      json_path: the file.
      entry_name: the platform name the file was given for in PJRT_NAMES_AND_LIBRARY_PATHS,
        named in error messages.

    Raises:
      ValueError: the file cannot be read or decoded, is not a JSON object, has no string
        ``library_path``, or its ``create_options`` is not an object. The message names the
        file (and the entry) and says what to change.
    """
    where = f"PJRT plugin configuration {json_path}" + (
        f" (entry {entry_name!r} of {ENV_VARIABLE})" if entry_name else "")
    try:
        with open(json_path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as error:
        raise ValueError(f"{where} cannot be read: {error.strerror or error}; fix the path in "
                         f"{ENV_VARIABLE}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not UTF-8 text (byte {error.start}: {error.reason}); "
                         f"save it as UTF-8 JSON") from None
    except RecursionError:
        # json recurses once per nesting level; a file nested this deep is no configuration.
        raise ValueError(f"{where} is nested too deeply to be read; a configuration is an "
                         f"object with \"library_path\" and \"create_options\"") from None
    except json.JSONDecodeError as error:
        # json's own message gives a line and column but not the file.
        raise ValueError(f"{where} is not valid JSON: {error}") from None
    if not isinstance(config, dict) or "library_path" not in config:
        raise ValueError(f"{where} has no \"library_path\" field; it must name the plugin's "
                         f"shared library")
    library_path = config["library_path"]
    if not isinstance(library_path, str) or not library_path.strip():
        raise ValueError(f"\"library_path\" in {where} must be a non-empty string naming the "
                         f"plugin's shared library, not {json.dumps(library_path)}")
    options = config.get("create_options")
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"\"create_options\" in {where} must be an object of option names "
                         f"to values, not {type(options).__name__}")
    return library_path, options


def plugins_from_env(value: str | None) -> list[EnvPlugin]:
    """Parse ``name1:path1,name2:path2`` (``;`` between name and path on Windows).

    An entry is a name and a path with one separator between them, as jax reads the variable.
    A malformed entry is a warning in jax's words ("invalid value ... in env var
    PJRT_NAMES_AND_LIBRARY_PATHS ...") followed by what is wrong with it and the format; the
    other entries are still returned. A path ending in ``.json`` is a configuration file (see
    `read_plugin_config`).

    Raises:
      ValueError: a JSON configuration that cannot be used (see `read_plugin_config`).
    """
    plugins = []
    separator = ";" if sys.platform == "win32" else ":"
    for entry in (value or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        parts = [part.strip() for part in entry.split(separator)]
        problem = _malformed(parts, separator)
        if problem:
            logger.warning("invalid value %s in env var %s %s: %s; write each entry as "
                           "name%spath, e.g. myaccel%s/opt/myaccel/lib/pjrt_myaccel.so", entry,
                           ENV_VARIABLE, value, problem, separator, separator)
            continue
        name, path = parts
        if path.endswith(".json"):
            library_path, options = read_plugin_config(path, name)
            plugins.append(EnvPlugin(name, library_path, options, config_file=path))
        else:
            plugins.append(EnvPlugin(name, path, None))
    return plugins


def _malformed(parts: list[str], separator: str) -> str:
    """What is wrong with an entry split at its separators, or "" when it is a name and a path."""
    if len(parts) == 1:
        return f"it has no {separator!r} between a name and a path"
    if len(parts) > 2:
        # jax refuses these too: a forgotten comma ("a:/x.so:b:/y.so") would otherwise load
        # a library whose path swallowed the next entry.
        return (f"it has {len(parts) - 1} {separator!r} separators, not one (separate entries "
                f"with ',')")
    name, path = parts
    if not name:
        return "it has no name"
    if not path:
        return "its path is empty"
    return ""


def taken_name(entry: EnvPlugin, owner: str) -> str:
    """What to tell the operator whose entry names a platform ``owner`` already registered."""
    return (f"{ENV_VARIABLE} names {entry.name!r} ({entry.library_path}), which is already "
            f"registered by {owner}; ignoring that entry: give it another name (e.g. "
            f"{entry.name}2:{entry.library_path})")


def iter_classified(modules: list[PluginModule]) -> Iterator[tuple[PluginModule, bool, str | None]]:
    """Each module with whether it was written for JAX alone, and its directory."""
    for module in modules:
        source, directory = _module_source(module.module)
        yield module, bool(source) and written_for_jax(source), directory


# -- who is discovering ---------------------------------------------------------------------

@dataclasses.dataclass
class DiscoveryContext:
    """Who is discovering on this thread, and which plugin module it is initialising."""

    #: The [`BackendRegistry`][pjrt.registry.BackendRegistry] that is discovering.
    registry: Any
    source: str = "api"
    module: str | None = None


_discovering = threading.local()


def discovering() -> bool:
    """True while pjrt's discovery is calling plugin modules' ``initialize()``.

    JAX calls every ``jax_plugins`` module's ``initialize()`` too; a plugin module asks this
    (through [`pjrt.plugin_api`][pjrt.plugin_api]) to know which host is calling.
    """
    return current_context() is not None


def current_context() -> DiscoveryContext | None:
    """The discovery under way on this thread, or None."""
    return getattr(_discovering, "context", None)


@contextlib.contextmanager
def discovery_scope(context: DiscoveryContext):
    """Make ``context`` the discovery under way on this thread while the block runs."""
    # A plugin module registers through the module-level functions; while this scope is open
    # they reach the registry that is discovering (a test's or the CLI's, not only the
    # default one) and label the registration with the module it came from.
    previous = current_context()
    _discovering.context = context
    try:
        yield
    finally:
        _discovering.context = previous


def initialize_module(module: PluginModule) -> DiscoveryRecord:
    """Import ``module`` and call its ``initialize()``; what happened, as a record.

    A failure is recorded (and logged), never raised: one broken plugin must not stop the
    others.
    """
    record = DiscoveryRecord(module.module, module.source, "initialized")
    try:
        imported = importlib.import_module(module.module)
        initialize = getattr(imported, "initialize", None)
        if initialize is None:
            record.action, record.detail = "skipped", "the module has no initialize()"
            return record
        initialize()
    except Exception as error:  # noqa: BLE001 - one broken plugin must not stop startup
        record.action = "failed"
        # A PluginLoadError already says what is wrong and what to do; keep its words.
        is_load_error = isinstance(error, PluginLoadError)
        record.detail = str(error) if is_load_error else f"{type(error).__name__}: {error}"
        if is_load_error:
            logger.warning("plugin module %s could not load its library: %s; skipping it",
                           module.module, error)
        else:
            logger.warning("plugin module %s could not be %s (%s: %s); skipping it",
                           module.module, "imported" if isinstance(error, ImportError)
                           else "initialised", type(error).__name__, error)
    return record
