"""Build hook for pjrt-cpu: compiles the LAPACK custom-call kernels (see pjrt_cpu/lapack.py).

The metadata lives in pyproject.toml; this file only adds the C library. It is compiled
as a setuptools extension, but it is a plain shared library without any Python API:
pjrt_cpu loads it with ctypes and registers its handlers through pjrt.ffi.

The kernels include ``xla_ffi_c_api.h``, which lives at the repository root (``pjrt_c_api/``)
beside the core's other headers. A build from the repository copies it into
``pjrt_cpu/_lapack/include/`` first, so that an sdist carries it; a build from an sdist finds
the copy already there.
"""
import pathlib
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
SHARED_HEADER = HERE.parent.parent / "pjrt_c_api" / "xla_ffi_c_api.h"
PACKAGED_HEADER_DIR = HERE / "pjrt_cpu" / "_lapack" / "include"

if SHARED_HEADER.is_file():
    PACKAGED_HEADER_DIR.mkdir(exist_ok=True)
    shutil.copyfile(SHARED_HEADER, PACKAGED_HEADER_DIR / SHARED_HEADER.name)


class BuildSharedLibrary(build_ext):
    """build_ext for a library that is not a Python module: it exports no PyInit_ symbol."""

    def get_export_symbols(self, ext):
        return list(ext.export_symbols or [])


setup(
    ext_modules=[
        Extension(
            "pjrt_cpu._lapack_kernels",
            sources=["pjrt_cpu/_lapack/lapack_kernels.c"],
            include_dirs=["pjrt_cpu/_lapack/include"],
            extra_compile_args=["-O2", "-std=c99", "-fvisibility=hidden", "-Wall"],
            libraries=["m"],
        )
    ],
    cmdclass={"build_ext": BuildSharedLibrary},
)
