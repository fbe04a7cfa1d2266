"""Build hook: compiles the cffi extension that is the core's single C boundary.

The PJRT C API header lives at the repository root (``pjrt_c_api/``) so that plugin
packages written in C can include the same file. A build from the repository copies it into
``pjrt/include/`` first; a build from an sdist finds the copy already there.
"""
import pathlib
import shutil

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
SHARED_HEADER_DIR = HERE.parent / "pjrt_c_api"
PACKAGED_HEADER_DIR = HERE / "pjrt" / "include"

if SHARED_HEADER_DIR.is_dir():
    PACKAGED_HEADER_DIR.mkdir(exist_ok=True)
    for header in SHARED_HEADER_DIR.glob("*.h"):
        shutil.copyfile(header, PACKAGED_HEADER_DIR / header.name)

setup(cffi_modules=["pjrt/_build_cffi.py:ffibuilder"])
