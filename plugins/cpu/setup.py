"""Build hook for pjrt-cpu: compiles the LAPACK custom-call kernels (see pjrt_cpu/lapack.py).

The metadata lives in pyproject.toml; this file only adds the C library. It is compiled
as a setuptools extension, but it is a plain shared library without any Python API:
pjrt_cpu loads it with ctypes and registers its handlers through pjrt.ffi. So its file name
carries no Python version (``_lapack_kernels.so``) and the wheel is tagged
``py3-none-<platform>``: one wheel serves every Python.

The kernels include ``xla_ffi_c_api.h``, which lives at the repository root (``pjrt_c_api/``)
beside the core's other headers. A build from the repository copies it into
``pjrt_cpu/_lapack/include/`` first, so that an sdist carries it; a build from an sdist finds
the copy already there. A build without a C compiler stops with a message saying so.
"""
import os
import pathlib
import shlex
import shutil
import sys
import sysconfig

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1 keeps it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
SHARED_HEADER = HERE.parent.parent / "pjrt_c_api" / "xla_ffi_c_api.h"
PACKAGED_HEADER_DIR = HERE / "pjrt_cpu" / "_lapack" / "include"

if SHARED_HEADER.is_file():
    PACKAGED_HEADER_DIR.mkdir(exist_ok=True)
    shutil.copyfile(SHARED_HEADER, PACKAGED_HEADER_DIR / SHARED_HEADER.name)


def require_c_compiler(package: str) -> None:
    """Stop with a clear message when the C compiler setuptools would call is missing."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    program = shlex.split(compiler)[0] if compiler.strip() else "cc"
    if shutil.which(program) is None:
        source = "CC" if os.environ.get("CC") else "Python's build configuration"
        sys.exit(f"error: building {package} from source needs a C compiler, and {program!r} "
                 f"(from {source}) "
                 f"was not found. Install one (Debian/Ubuntu: apt-get install gcc; Fedora: "
                 f"dnf install gcc), set CC to a compiler, or install a prebuilt wheel of "
                 f"{package} (pip install --only-binary=:all: {package}).")


class BuildSharedLibrary(build_ext):
    """build_ext for a library that is not a Python module: no PyInit_, no version tag."""

    def get_export_symbols(self, ext):
        return list(ext.export_symbols or [])

    def get_ext_filename(self, fullname):
        # _lapack_kernels.so, not _lapack_kernels.cpython-311-x86_64-linux-gnu.so: the
        # library does not depend on the Python that built it.
        return os.path.join(*fullname.split(".")) + ".so"


class PlatformWheel(bdist_wheel):
    """A wheel for any Python 3 on this platform: the C library uses no Python API."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


def _building() -> bool:
    # Metadata queries (egg_info, sdist, dist_info) compile nothing and need no compiler.
    return any(arg.startswith(("build", "bdist", "install", "develop", "editable_wheel"))
               for arg in sys.argv[1:])


if _building():
    require_c_compiler("pjrt-cpu")

BUILD = dict(
    ext_modules=[
        Extension(
            "pjrt_cpu._lapack_kernels",
            # The handlers and their table, the shared helpers, then the kernels by family
            # (lapack_kernels.c says which file holds what).
            sources=["pjrt_cpu/_lapack/lapack_kernels.c",
                     "pjrt_cpu/_lapack/lapack_common.c",
                     "pjrt_cpu/_lapack/lapack_factorizations.c",
                     "pjrt_cpu/_lapack/lapack_decompositions.c",
                     "pjrt_cpu/_lapack/lapack_tridiagonal.c",
                     "pjrt_cpu/_lapack/sparse_kernels.c"],
            depends=["pjrt_cpu/_lapack/lapack_common.h"],
            include_dirs=["pjrt_cpu/_lapack/include"],
            extra_compile_args=["-O2", "-std=c99", "-fvisibility=hidden", "-Wall", "-pthread"],
            # The sparse kernel splits large products over threads (sparse_kernels.c).
            extra_link_args=["-pthread"],
            libraries=["m"],
        )
    ],
    cmdclass={"build_ext": BuildSharedLibrary, "bdist_wheel": PlatformWheel},
)

if ("build_ext" in sys.argv and "--inplace" in sys.argv
        and int(setuptools.__version__.split(".")[0]) < 77):
    # A development build in place with an older setuptools, which cannot read the SPDX
    # license in pyproject.toml: build the library without reading the metadata at all.
    from setuptools import Distribution

    distribution = Distribution(dict(BUILD, name="pjrt-cpu", packages=["pjrt_cpu"],
                                     script_args=sys.argv[1:]))
    distribution.parse_command_line()
    distribution.run_commands()
else:
    setup(**BUILD)
