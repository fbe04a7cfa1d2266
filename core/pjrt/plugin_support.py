"""Helpers for plugin packages: version checks and importing their optional submodules."""
from __future__ import annotations

import importlib
import re
import warnings
from types import ModuleType

from . import _version

#: Where each platform's pjrt plugin package lives.
PLUGIN_PACKAGES = {"cpu": "pjrt_cpu", "cuda": "pjrt_cuda", "rocm": "pjrt_rocm", "tpu": "pjrt_tpu"}

_VERSION_PREFIX = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def _release(version: str) -> tuple[int, ...]:
    match = _VERSION_PREFIX.match(version)
    if match is None:
        raise ValueError(f"cannot read a version number from {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def check_plugin_version(plugin_name: str, core_version: str, plugin_version: str) -> bool:
    """Whether a plugin package of ``plugin_version`` works with this core ``core_version``.

    They work together when their major and minor numbers agree (pjrt's packages are
    released together). Otherwise a RuntimeWarning says so and False is returned.
    """
    if _release(core_version)[:2] == _release(plugin_version)[:2]:
        return True
    warnings.warn(f"pjrt plugin {plugin_name} {plugin_version} is installed, but it does not "
                  f"match pjrt {core_version}; it will not be used. Install matching versions.",
                  RuntimeWarning, stacklevel=2)
    return False


def import_from_plugin(plugin_name: str, submodule_name: str, *,
                       check_version: bool = True) -> ModuleType | None:
    """Import ``submodule_name`` of the plugin package of ``plugin_name`` (e.g. ``cuda``).

    Returns None when the package or submodule is not installed, or when its version does
    not match the core (with a warning).

    Raises:
      ValueError: ``plugin_name`` is not a platform pjrt ships a package for.
    """
    package = PLUGIN_PACKAGES.get(plugin_name)
    if package is None:
        raise ValueError(f"unknown plugin {plugin_name!r}; known: {', '.join(PLUGIN_PACKAGES)}")
    try:
        module = importlib.import_module(f"{package}.{submodule_name}")
    except ImportError:
        return None
    if check_version:
        parent = importlib.import_module(package)
        plugin_version = getattr(parent, "__version__", None)
        if plugin_version and not check_plugin_version(package, _version.__version__,
                                                       plugin_version):
            return None
    return module


def find_installed_wheel(module: str, filename: str,
                         distribution: str) -> tuple[str, str | None] | None:
    """``(library path, version)`` of a vendor wheel whose package ``module`` is installed,
    None when it is not; the version is None when the distribution's metadata is missing.

    A plugin package offering several vendor wheels (CUDA 12 and 13, ROCm 7 and 10) asks this
    of each, in its order of preference.

    Raises:
      FileNotFoundError: the package is installed but ``filename`` is missing from it.
    """
    import importlib.util
    from importlib import metadata

    try:
        installed = importlib.util.find_spec(module) is not None
    except ImportError:  # no parent package (jax_plugins) at all
        installed = False
    if not installed:
        return None
    library = find_module_library(module, filename, distribution)
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        version = None
    return library, version


def find_module_library(module: str, filename: str, distribution: str) -> str:
    """Absolute path of ``filename`` inside the package ``module``, found without importing it
    (plugin wheels written for JAX import jax in their ``__init__``).

    Raises:
      FileNotFoundError: the package is not installed (the message names the distribution to
        install), or the file is missing from it.
    """
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{distribution}, which provides {filename}, is not installed; "
                                f"pip install {distribution}")
    for directory in spec.submodule_search_locations:
        candidate = os.path.join(directory, filename)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"{distribution} is installed but {filename} is missing from "
                            f"{list(spec.submodule_search_locations)}; reinstall {distribution}")
