"""XLA's CPU PJRT plugin, packaged for the pjrt host.

The plugin library itself comes from another distribution: one of the builds in `BUILDS`
(``xla-cpu-pjrt``, installed with this package, or ``fastatomstruct-xla-cpu``, installed by
``pip install pjrt-cpu[fast]``), chosen by PJRT_CPU_BUILD or else by `PREFERENCE`. This
package finds it and registers it with pjrt's backend registry when pjrt discovers installed
plugins (through the ``jax_plugins`` entry point, which calls
[`initialize`][pjrt_cpu.initialize]).
"""
from __future__ import annotations

import os
import warnings

from pjrt import plugin_api

from .lapack import register_lapack_kernels
from .cpu_sparse import register_sparse_kernels

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cpu"

#: Default-backend priority: the platform's entry in pjrt's one table of priorities (a GPU
#: outranks the TPU, which outranks the CPU, as in JAX).
PRIORITY = plugin_api.PLATFORM_PRIORITIES[PLATFORM]

#: Environment variable with the number of CPU devices a client exposes.
DEVICE_COUNT_ENV = "PJRT_CPU_DEVICE_COUNT"

#: Environment variable choosing the build of XLA's CPU plugin: a name in `BUILDS`, or the
#: path of a plugin library. Read each time the library is looked for (when pjrt discovers the
#: plugin, or a client of this package's own is made).
BUILD_ENV = "PJRT_CPU_BUILD"


class Build:
    """A build of XLA's CPU plugin published on PyPI: where its library lies once installed.

    Attributes:
      name: the distribution's name, which PJRT_CPU_BUILD and ``build=`` take.
      module: the package holding the library (found without importing it).
      filename: the library's file name in that package.
      install: the pip requirement that installs it.
      api_minor: the PJRT C API minor version its library reports.
    """

    __slots__ = ("name", "module", "filename", "install", "api_minor")

    def __init__(self, name: str, module: str, filename: str, install: str, api_minor: int):
        self.name = name
        self.module = module
        self.filename = filename
        self.install = install
        self.api_minor = api_minor

    def __repr__(self) -> str:
        return f"Build({self.name!r}, PJRT API 0.{self.api_minor})"

    def library_path(self) -> str:
        """Absolute path of this build's library.

        Raises:
          FileNotFoundError: the build is not installed (the message names the pip command),
            or its library is missing from it.
        """
        try:
            return plugin_api.find_module_library(self.module, self.filename, self.name)
        except FileNotFoundError as error:
            if "is not installed" not in str(error):
                raise
            raise FileNotFoundError(
                f"the {self.name} build of XLA's CPU plugin is not installed; "
                f"pip install {self.install!r}") from None


#: The builds this package knows by name (plugins/cpu/README.md compares them).
BUILDS = {build.name: build for build in (
    # By the OpenXLA authors; PJRT 0.81. A dependency of this package. Its XNNPACK fusions
    # reuse packed weights by buffer address, so pjrt compiles for it without XNNPACK.
    Build("xla-cpu-pjrt", "xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so",
          "xla-cpu-pjrt==0.0.1", 81),
    # XLA of June 2026 repackaged by fastatomstruct; PJRT 0.106; right answers with XNNPACK.
    Build("fastatomstruct-xla-cpu", "fastatomstruct_xla_cpu", "libpjrt_cpu.so",
          "pjrt-cpu[fast]", 106),
    # jaxlib 0.11.2's XLA repackaged by lammps-jax; PJRT 0.115; its wheel requires jax<=0.11.2
    # (``pip install --no-deps`` leaves jax out). Loaded only when chosen.
    Build("lammps-jax-pjrt-cpu", "lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so",
          "lammps-jax-pjrt-cpu==0.11.2", 115),
)}

#: The builds loaded when PJRT_CPU_BUILD is unset, the first installed one winning.
PREFERENCE = ("fastatomstruct-xla-cpu", "xla-cpu-pjrt")


def _chosen(build: str | os.PathLike | None) -> str:
    if build is not None:
        return os.fspath(build)
    return os.environ.get(BUILD_ENV, "").strip()


def library_path(build: str | os.PathLike | None = None) -> str:
    """Absolute path of the XLA CPU plugin library pjrt loads.

    Args:
      build: a name in `BUILDS` or a library's path; None: PJRT_CPU_BUILD, and when that is
        unset or empty, the first installed build of `PREFERENCE`.

    Raises:
      FileNotFoundError: the named build is not installed (the message names the pip
        command), the name is none of `BUILDS`, the path is no file, or no build of
        `PREFERENCE` is installed.
    """
    chosen = _chosen(build)
    source = "build=" if build is not None else f"{BUILD_ENV}="
    if chosen:
        if chosen in BUILDS:
            return BUILDS[chosen].library_path()
        if os.sep in chosen or chosen.endswith(".so"):
            if not os.path.isfile(chosen):
                raise FileNotFoundError(
                    f"{source}{chosen!r}: no plugin library is there; name an existing file, "
                    f"or a build: {', '.join(BUILDS)}")
            return os.path.abspath(chosen)
        raise FileNotFoundError(
            f"{source}{chosen!r} names no build of XLA's CPU plugin; name one of "
            f"{', '.join(BUILDS)}, or the path of a plugin library")
    for name in PREFERENCE:
        try:
            return BUILDS[name].library_path()
        except FileNotFoundError:
            continue
    raise FileNotFoundError(
        f"no build of XLA's CPU plugin is installed (looked for {', '.join(PREFERENCE)}); "
        f"pip install {BUILDS[PREFERENCE[0]].install!r}, or set {BUILD_ENV} to a library's path")


def chosen_build(build: str | os.PathLike | None = None) -> Build | None:
    """The build of `BUILDS` that [`library_path`][pjrt_cpu.library_path] would load for
    ``build``; None when a library is named by its path and is none of theirs.

    Raises:
      FileNotFoundError: as `library_path`.
    """
    path = os.path.realpath(library_path(build))
    for candidate in BUILDS.values():
        try:
            if os.path.realpath(candidate.library_path()) == path:
                return candidate
        except FileNotFoundError:
            continue
    return None


def installed_builds() -> list[str]:
    """The names of `BUILDS` installed here, in `PREFERENCE` order, then the rest."""
    order = list(PREFERENCE) + [name for name in BUILDS if name not in PREFERENCE]
    found = []
    for name in order:
        try:
            BUILDS[name].library_path()
        except FileNotFoundError:
            continue
        found.append(name)
    return found


#: The most CPU devices a client is made with: client creation in XLA's CPU plugin is
#: quadratic in the device count.
MAX_DEVICES = 8192


def client_options(num_devices: int | None = None) -> dict:
    """Create options for a CPU client: ``num_devices``, else PJRT_CPU_DEVICE_COUNT, else none.

    Raises:
      ValueError: the environment variable is not a positive integer (the message names it).
    """
    if num_devices is None:
        value = os.environ.get(DEVICE_COUNT_ENV, "").strip()
        if not value:
            return {}
        try:
            num_devices = int(value)
        except ValueError:
            raise ValueError(f"{DEVICE_COUNT_ENV}={value!r} is not an integer; set it to the "
                             f"number of CPU devices (1 or more), or unset it") from None
        if num_devices < 1:
            raise ValueError(f"{DEVICE_COUNT_ENV}={value!r}: the number of CPU devices must be "
                             f"at least 1; set it to 1 or more, or unset it")
    if num_devices < 1:
        raise ValueError(f"the number of CPU devices must be at least 1, not {num_devices}")
    if num_devices > MAX_DEVICES:
        raise ValueError(
            f"{num_devices} CPU devices asked for (through {DEVICE_COUNT_ENV} or num_devices); "
            f"XLA's CPU plugin takes time growing with the square of the device count to make "
            f"a client (about 4.5 s for 4000 devices on a 2-core machine), so more than "
            f"{MAX_DEVICES} would look like a hang. Ask for {MAX_DEVICES} or fewer")
    return {"cpu_device_count": int(num_devices)}


def _register_kernels() -> None:
    try:
        register_lapack_kernels(PLATFORM)
        register_sparse_kernels(PLATFORM)
    except (ImportError, OSError, RuntimeError) as exc:
        # The plugin is still useful without them; only linear algebra needs the kernels.
        warnings.warn(f"pjrt_cpu: the LAPACK and sparse custom-call kernels are unavailable "
                      f"({exc}); programs using jnp.linalg or jax.experimental.sparse will "
                      f"fail to compile", RuntimeWarning,
                      stacklevel=3)


def _create(plugin, options: dict):
    # The kernels are registered with pjrt before the client comes up, which is when pjrt
    # hands them to the plugin (registering again is a no-op).
    _register_kernels()
    return plugin_api.create_client(plugin, options)


def _new_client(plugin, num_devices: int | None = None):
    return _create(plugin, client_options(num_devices))


def _load(build: str | os.PathLike | None):
    path = library_path(build)
    if build is None:
        return plugin_api.load_plugin(PLATFORM, path)
    try:
        return plugin_api.load_plugin(PLATFORM, path)
    except ValueError:
        # This process already has another build as "cpu": this one gets a name of its own.
        return plugin_api.load_plugin(f"{PLATFORM}:{os.fspath(build)}", path)


def make_cpu_client(num_devices: int | None = None, *,
                    build: str | os.PathLike | None = None):
    """A new client of XLA's CPU plugin with ``num_devices`` devices (else
    PJRT_CPU_DEVICE_COUNT, else the plugin's own default).

    Args:
      num_devices: the number of CPU devices.
      build: the build of XLA's CPU plugin, as for [`library_path`][pjrt_cpu.library_path]
        (None: PJRT_CPU_BUILD, else `PREFERENCE`). A build other than the one this process
        already loaded as ``cpu`` is loaded under the plugin name ``cpu:<build>``.

    Raises:
      FileNotFoundError: the build is not installed (see `library_path`).
      ValueError: ``num_devices`` (or the variable) is not a positive integer.
    """
    return _new_client(_load(build), num_devices)


#: The plugin, as pjrt and JAX discover it. JAX has a CPU backend of its own, so under JAX
#: this package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, options=client_options,
    make_client=_create, new_client=_new_client, version=__version__, serve_jax=False)


def initialize() -> None:
    """Register the CPU plugin with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point. Under JAX it does
    nothing: JAX has its own CPU backend and kernels. Otherwise the LAPACK custom-call kernels
    are registered with pjrt for the ``cpu`` platform (see [`pjrt_cpu.lapack`][pjrt_cpu.lapack]), and, while
    pjrt discovers, the plugin. The device count (PJRT_CPU_DEVICE_COUNT) is read when the
    client is made, so a bad value is the ``cpu`` backend's reason, not a missing backend.
    """
    if plugin_api.jax_is_calling() is not None:
        return
    _register_kernels()
    PLUGIN.initialize()
