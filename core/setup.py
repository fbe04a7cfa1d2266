"""Build hook: compiles the cffi extension that is the core's single C boundary.

The PJRT C API header lives at the repository root (``pjrt_c_api/``) so that plugin
packages written in C can include the same file. A build from the repository copies it into
``pjrt/include/`` first; a build from an sdist finds the copy already there.

The extension uses only CPython's limited API (cffi builds it so; its file is
``_pjrt_cffi.abi3.so``), so one wheel, tagged ``cp310-abi3``, serves every Python from 3.10
on. A build without a C compiler stops with a message saying so, before setuptools fails on
a bare ``No such file or directory: 'gcc'``.
"""
import os
import pathlib
import shlex
import shutil
import sys
import sysconfig

import setuptools
from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
SHARED_HEADER_DIR = HERE.parent / "pjrt_c_api"
PACKAGED_HEADER_DIR = HERE / "pjrt" / "include"

#: The oldest Python the one abi3 wheel is for (requires-python in pyproject.toml).
LIMITED_API_TAG = "cp310"

if SHARED_HEADER_DIR.is_dir():
    PACKAGED_HEADER_DIR.mkdir(exist_ok=True)
    for header in SHARED_HEADER_DIR.glob("*.h"):
        shutil.copyfile(header, PACKAGED_HEADER_DIR / header.name)


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


def _building() -> bool:
    # Metadata queries (egg_info, sdist, dist_info) compile nothing and need no compiler.
    return any(arg.startswith(("build", "bdist", "install", "develop", "editable_wheel"))
               for arg in sys.argv[1:])


def _setuptools_predates_pep639() -> bool:
    return int(setuptools.__version__.split(".")[0]) < 77


if _building():
    require_c_compiler("pjrt")

#: The native runtime, ``pjrt._native_runtime`` (pjrt/_native/hot_path.h names its files): a
#: small extension in CPython's own C API, limited to the stable ABI like the cffi one, so the
#: wheel stays one cp310-abi3 wheel.
NATIVE_RUNTIME_SOURCES = ["hot_path.c", "handle_core.c", "array_core.c", "call_plan.c",
                          "host_views.c"]
NATIVE_RUNTIME = setuptools.Extension(
    "pjrt._native_runtime",
    sources=[f"pjrt/_native/{name}" for name in NATIVE_RUNTIME_SOURCES],
    include_dirs=["pjrt/include", "pjrt/_native"],
    define_macros=[("Py_LIMITED_API", "0x030A0000")], py_limited_api=True,
    extra_compile_args=["-O2", "-Wall"],
    # The runtime calls no libc function itself (everything goes through Python and the cffi
    # extension), so the linker would record no libc at all; auditwheel reads which libc a
    # wheel targets from that record, and refuses an extension without one.
    extra_link_args=["-Wl,--no-as-needed", "-lc"])

BUILD = dict(cffi_modules=["pjrt/_build_cffi.py:ffibuilder"], ext_modules=[NATIVE_RUNTIME],
             options={"bdist_wheel": {"py_limited_api": LIMITED_API_TAG}})

if "build_ext" in sys.argv and "--inplace" in sys.argv and _setuptools_predates_pep639():
    # A development build in place with an older setuptools, which cannot read the SPDX
    # license in pyproject.toml: build the extension without reading the metadata at all.
    from setuptools import Distribution

    distribution = Distribution(dict(BUILD, name="pjrt", packages=["pjrt"],
                                     script_args=sys.argv[1:]))
    distribution.parse_command_line()
    distribution.run_commands()
else:
    setup(**BUILD)
