"""Helpers for plugin packages: version checks, importing their optional submodules, and
the GPU custom-call kernels of JAX's kernel wheels ([`GpuKernels`][pjrt.plugin_support.GpuKernels])."""
from __future__ import annotations

import importlib
import re
import warnings
from types import ModuleType
from typing import Any

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


class GpuKernels:
    """jaxlib's GPU custom-call kernels for one platform, from the kernel wheels JAX's authors
    publish (``jax-cuda13-plugin``, ``jax-rocm7-plugin``, ...).

    jax lowers ``jnp.linalg`` and friends for a GPU to FFI custom calls (``cusolver_getrf_ffi``,
    ``hipsolver_potrf_ffi``, ...) whose handlers are not in the vendor's PJRT plugin but in
    the kernel wheel's modules (``_solver``, ``_linalg``, ``_sparse``, ``_prng``, ``_hybrid``).
    Those modules import without jax; each has ``registrations()``, a dict of target name to
    an ``XLA_FFI_Handler*`` capsule. A plugin package makes one of these, and
    [`register`][pjrt.plugin_support.GpuKernels.register] hands every handler to pjrt's FFI
    registry for its platform, which passes them to each plugin serving it.

    Args:
      platform: pjrt's platform name, e.g. ``"cuda"``.
      wheels: the kernel wheels, preferred first, as ``(distribution, package)`` pairs, e.g.
        ``("jax-cuda13-plugin", "jax_cuda13_plugin")``.
      targets: the targets each module of the wheels handles (module name without its
        underscore -> names), for the error raised when no wheel is installed and a program
        calls one.
      install_hint: what to install, for the errors.
      pjrt_version: returns ``(distribution, version)`` of the PJRT plugin wheel in use, or
        None when it is not known. The kernel wheel named like it (``jax-cuda13-plugin`` for
        ``jax-cuda13-pjrt``) is preferred, and one of another version is not used (JAX pins
        the two to one version), with a RuntimeWarning.
    """

    #: The modules of a kernel wheel, by jaxlib's name for the module using each.
    MODULES = ("solver", "linalg", "sparse", "prng", "hybrid")

    def __init__(self, platform: str, wheels, targets, install_hint: str, pjrt_version=None):
        self.platform = platform
        self.wheels = tuple(wheels)
        self.targets = {module: tuple(names) for module, names in targets.items()}
        self.install_hint = install_hint
        self.pjrt_version = pjrt_version
        self._failures: dict[str, Any] = {}

    def wheel(self) -> tuple[str, str, str | None] | None:
        """``(distribution, package, version)`` of the kernel wheel to use, None when none is
        installed (or the installed one's version differs from the PJRT plugin's)."""
        import importlib.util
        from importlib import metadata

        wanted = self.pjrt_version() if self.pjrt_version is not None else None
        wheels = self.wheels
        if wanted is not None:
            # The kernel wheel of the PJRT plugin's own build first (jax-cuda13-pjrt's
            # kernels are jax-cuda13-plugin's).
            twin = wanted[0].replace("-pjrt", "-plugin")
            wheels = tuple(sorted(wheels, key=lambda wheel: wheel[0] != twin))
        for distribution, package in wheels:
            try:
                if importlib.util.find_spec(package) is None:
                    continue
            except ImportError:
                continue
            try:
                version = metadata.version(distribution)
            except metadata.PackageNotFoundError:
                version = None
            if wanted is not None and version is not None and wanted[1] is not None \
                    and _release(version) != _release(wanted[1]):
                warnings.warn(f"{distribution} {version} is installed, but the PJRT plugin is "
                              f"{wanted[0]} {wanted[1]}; its kernels are not used (they are "
                              f"built for one version of the plugin). {self.install_hint}",
                              RuntimeWarning, stacklevel=2)
                continue
            return distribution, package, version
        return None

    def module(self, name: str) -> ModuleType:
        """The kernel wheel's module ``_name`` (``name`` one of `MODULES`).

        Raises:
          ImportError: no kernel wheel is installed (the message names the packages and how
            to install one), or its module cannot be loaded.
        """
        if name not in self.MODULES:
            raise ValueError(f"{name!r} is not a kernel module; one of {', '.join(self.MODULES)}")
        found = self.wheel()
        if found is None:
            raise ImportError(self.missing_message())
        distribution, package, _ = found
        try:
            return importlib.import_module(f"{package}._{name}")
        except ImportError as exc:
            raise ImportError(f"{distribution}'s module {package}._{name} cannot be loaded "
                              f"({exc}); {self.install_hint}") from exc

    def missing_message(self, target: str | None = None) -> str:
        """Why a program calling ``target`` cannot run: no kernel wheel is installed."""
        names = " or ".join(distribution for distribution, _ in self.wheels)
        what = f"the custom call {target} is" if target else "jax's GPU kernels are"
        return (f"{what} handled by a kernel of {names}, which is not installed; "
                f"{self.install_hint}")

    def registrations(self, *names: str) -> dict[str, list[tuple[str, Any, int]]]:
        """jaxlib's ``registrations()`` of the modules ``names``: ``{PLATFORM: [(target,
        capsule, api_version), ...]}``, with the platform in jaxlib's upper case; api_version
        is 1 (typed FFI) for ``*_ffi`` targets of the solver, sparse and PRNG modules, as in
        jaxlib, and for every target of the linalg and hybrid modules. Empty when no kernel
        wheel is installed.
        """
        entries: list[tuple[str, Any, int]] = []
        if self.wheel() is not None:
            for name in names:
                typed_only = name in ("linalg", "hybrid")
                for target, capsule in self.module(name).registrations().items():
                    entries.append((target, capsule,
                                    1 if typed_only else int(target.endswith("_ffi"))))
        return {self.platform.upper(): entries}

    def register(self) -> list[str]:
        """Register every typed-FFI handler of the installed kernel wheel with pjrt for this
        platform. Where none is installed, or a module of it cannot be loaded (ROCm's link
        against ROCm's libraries), a program calling one of its `targets` fails to compile
        with an error saying why and what to install. The hybrid kernels' set-up (which
        imports SciPy for LAPACK) runs before the first program calling one compiles.

        Returns:
          The targets registered (none without a kernel wheel).
        """
        from . import ffi

        registered = []
        for name in self.MODULES:
            try:
                module = self.module(name)
            except ImportError as exc:
                # One failing preparation per module, whatever the number of clients made.
                fail = self._failures.setdefault(name, _raiser(ImportError(str(exc))))
                ffi.register_target_preparation(self.targets.get(name, ()), fail,
                                                platform=self.platform)
                continue
            targets = [(target, capsule) for target, capsule in module.registrations().items()
                       if name in ("linalg", "hybrid") or target.endswith("_ffi")]
            for target, capsule in targets:
                ffi.register_custom_call_target(target, capsule, platform=self.platform)
                registered.append(target)
            if name == "hybrid" and targets:
                ffi.register_target_preparation([t for t, _ in targets], module.initialize,
                                                platform=self.platform)
        return registered


def _raiser(error: Exception):
    def fail() -> None:
        raise error
    return fail
