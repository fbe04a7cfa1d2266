"""cffi build script for ``pjrt._pjrt_cffi``, the core's single C boundary.

Run by setuptools (``cffi_modules`` in setup.py). It compiles, in cffi's API mode, our
PJRT C API header together with the helpers in ``_native/shim.c``. API mode lets the C
compiler check every struct layout we touch against the header, and calls through it are
cheaper than through libffi.

The cffi declarations are the header itself with its preprocessor lines removed: the header
is written so that what remains is plain C that cffi can read.
"""
import pathlib
import re

import cffi

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"


def _find_header_dir() -> pathlib.Path:
    """The directory holding pjrt_c_api.h: the packaged copy, else the repository's."""
    for candidate in (PACKAGE_DIR / "include", PACKAGE_DIR.parent.parent / "pjrt_c_api"):
        if (candidate / "pjrt_c_api.h").is_file():
            return candidate
    raise FileNotFoundError("pjrt_c_api.h not found next to the pjrt package or in ../pjrt_c_api")


_INTEGER_DEFINE = re.compile(r"#\s*define\s+\w+\s+-?\d+\s*$")


def declarations_from_header(text: str) -> str:
    """The header as cffi declarations: preprocessor lines go, integer #defines stay."""
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not _INTEGER_DEFINE.match(stripped):
            continue
        kept.append(line)
    return "\n".join(kept)


HEADER_DIR = _find_header_dir()
_header_text = (HEADER_DIR / "pjrt_c_api.h").read_text()
#: Headers declared after pjrt_c_api.h, in this order: XLA FFI (custom-call handlers), the
#: PJRT FFI extension that registers them (see pjrt/ffi.py), the layouts extension (see
#: pjrt/layouts.py), the profiler extension (see pjrt/_profiling/plugin_profilers.py) and the
#: custom partitioner extension (see pjrt/_capi/custom_partitioner.py).
_EXTRA_HEADERS = ("xla_ffi_c_api.h", "pjrt_c_api_ffi_extension.h",
                  "pjrt_c_api_layouts_extension.h", "pjrt_c_api_profiler_extension.h",
                  "pjrt_c_api_custom_partitioner_extension.h")
_shim_declarations = (NATIVE_DIR / "shim.h").read_text()
#: The key-value callbacks of multi-process clients: C helpers (kv.h, kv.c) and the Python
#: callbacks cffi makes C entry points for (kv_python.cdef; see
#: pjrt/_distributed/kv_callbacks.py).
_kv_declarations = (NATIVE_DIR / "kv.h").read_text()
#: DLPack's structs and the capsule helpers (see pjrt/dlpack.py).
_dlpack_declarations = (NATIVE_DIR / "dlpack.h").read_text()
#: One wait for all the shards of a global array (see pjrt/_capi/waits.py).
_spmd_declarations = (NATIVE_DIR / "spmd.h").read_text()
#: The one-call read of a small ready buffer (see pjrt/_runtime/host_reads.py); its C uses shim.c's.
_host_reads_declarations = (NATIVE_DIR / "host_reads.h").read_text()
#: Waking an event loop when buffers become ready (see pjrt/_capi/ready_events.py); its C uses
#: shim.c's.
_ready_notifier_declarations = (NATIVE_DIR / "ready_notifier.h").read_text()

ffibuilder = cffi.FFI()
ffibuilder.cdef(declarations_from_header(_header_text))
for _extra in _EXTRA_HEADERS:
    ffibuilder.cdef(declarations_from_header((HEADER_DIR / _extra).read_text()))
ffibuilder.cdef(_shim_declarations)
ffibuilder.cdef(_kv_declarations)
ffibuilder.cdef((NATIVE_DIR / "kv_python.cdef").read_text())
ffibuilder.cdef(declarations_from_header(_dlpack_declarations))
ffibuilder.cdef(_spmd_declarations)
ffibuilder.cdef(_host_reads_declarations)
ffibuilder.cdef(_ready_notifier_declarations)
ffibuilder.set_source(
    "pjrt._pjrt_cffi",
    '#include "pjrt_c_api.h"\n'
    + "".join(f'#include "{_extra}"\n' for _extra in _EXTRA_HEADERS)
    + _shim_declarations
    + "\n"
    + (NATIVE_DIR / "shim.c").read_text()
    + "\n" + _kv_declarations + "\n"
    + (NATIVE_DIR / "kv.c").read_text()
    + "\n"
    + _dlpack_declarations
    + "\n"
    + (NATIVE_DIR / "dlpack.c").read_text()
    + "\n" + _spmd_declarations + "\n"
    + (NATIVE_DIR / "spmd.c").read_text()
    + "\n" + _host_reads_declarations + "\n"
    + (NATIVE_DIR / "host_reads.c").read_text()
    + "\n" + _ready_notifier_declarations + "\n"
    + (NATIVE_DIR / "ready_notifier.c").read_text(),
    include_dirs=[str(HEADER_DIR)],
    libraries=["dl"],
    extra_compile_args=["-O2", "-Wall"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(PACKAGE_DIR.parent), verbose=True)
