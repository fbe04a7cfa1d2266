"""Builds custom_calls_testlib.c and hands out its handlers as jaxlib's test module does.

jaxlib's ``custom_calls_testlib`` is a Python extension with two functions: ``registrations()``
(target name -> a PyCapsule of the handler, or a dict of capsules for a bundle of stages) and
``type_ids()`` (type name -> a PyCapsule of the ``XLA_FFI_TypeId`` its handlers read).
`load` gives the same two functions over the C library compiled here with the system C
compiler (``cc``, or ``$CC``). Run it directly to check the build by hand::

    python tests/ffi/build.py /tmp/ffi
"""
from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: pjrt's header: the handlers are built against the same one as pjrt.
HEADER_DIR = HERE.parent.parent / "pjrt_c_api"
SOURCE = HERE / "custom_calls_testlib.c"

#: The names jaxlib's module registers -> the C functions (a dict: a bundle of stages).
REGISTRATIONS = {
    "always_fail": "always_fail",
    "always_succeed": "always_succeed",
    "subtract_f32": "subtract_f32",
    "subtract_f32_cst": "subtract_f32_cst",
    "stateful": {"instantiate": "state_instantiate", "execute": "state_execute"},
}
#: The type names jaxlib's module registers -> the C variables holding their XLA_FFI_TypeId.
TYPE_IDS = {"test_ffi_state": "test_ffi_state_id"}

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def build(directory: str | os.PathLike) -> Path:
    """Compile the library into ``directory`` (created if needed) and return its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    library = out / "libcustom_calls_testlib.so"
    compiler = shlex.split(os.environ.get("CC", "cc"))
    command = [*compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-I{HEADER_DIR}",
               "-o", str(library), str(SOURCE)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building {library.name} failed:\n$ {shlex.join(command)}\n"
                           f"{result.stdout}{result.stderr}")
    return library


class CustomCallsTestlib:
    """jaxlib's ``custom_calls_testlib`` module, over the compiled library."""

    def __init__(self, library: str | os.PathLike):
        self.library = ctypes.CDLL(str(library))

    def _capsule(self, symbol: str):
        address = ctypes.cast(getattr(self.library, symbol), ctypes.c_void_p).value
        return _new_capsule(address, None, None)

    def registrations(self) -> dict:
        """Target name -> a PyCapsule of its handler, or a dict of them for a bundle."""
        return {name: ({stage: self._capsule(symbol) for stage, symbol in symbol.items()}
                       if isinstance(symbol, dict) else self._capsule(symbol))
                for name, symbol in REGISTRATIONS.items()}

    def type_ids(self) -> dict:
        """Type name -> a PyCapsule of the ``XLA_FFI_TypeId`` the handlers read."""
        return {name: _new_capsule(ctypes.addressof(ctypes.c_int64.in_dll(self.library, symbol)),
                                   None, None)
                for name, symbol in TYPE_IDS.items()}

    def type_id_value(self, type_name: str) -> int:
        """The id the handlers read for ``type_name`` (0 until it is registered)."""
        return ctypes.c_int64.in_dll(self.library, TYPE_IDS[type_name]).value


def load(directory: str | os.PathLike) -> CustomCallsTestlib:
    """Build the library into ``directory`` and load it."""
    return CustomCallsTestlib(build(directory))


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "."))
