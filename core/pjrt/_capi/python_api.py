"""CPython's C API and the C library, reached through ctypes: the one module of the core that
uses ctypes. (The PJRT C API is cffi's, in ``pjrt._pjrt_cffi``; the per-call path is the C
extension's, ``pjrt._native_runtime``.)

What is here has no other way in from Python: PyCapsule functions (a DLPack capsule, a plugin's
``PJRT_Api*`` handed over as a capsule), a reference that is never given back, and Linux's
parent-death signal. Every CPython function is called through a private view of the
interpreter's library, never through ``ctypes.pythonapi``, whose function objects are shared
by the whole process: setting ``argtypes`` on one of those changes them for every other user.
"""
from __future__ import annotations

import ctypes
import sys

# The library ``ctypes.pythonapi`` opens (the running process on POSIX, the interpreter's DLL
# on Windows), opened again: its function objects are this module's own.
_api = (ctypes.PyDLL("python", handle=sys.dllhandle)  # pyright: ignore[reportAttributeAccessIssue]
        if sys.platform == "win32" else ctypes.PyDLL(None))
_capsule_new = _api.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_capsule_get_name = _api.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_is_valid = _api.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_pointer = _api.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = _api.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_void_p]
_incref = _api.Py_IncRef
_incref.restype = None
_incref.argtypes = [ctypes.py_object]

#: Linux's prctl option that delivers a signal when the parent thread dies.
_PR_SET_PDEATHSIG = 1


def capsule_new(pointer: int, name: int, destructor: int) -> object:
    """A new PyCapsule of ``pointer``, named by the C string at ``name`` (which must outlive
    it), with the C ``destructor`` at that address (0: none)."""
    return _capsule_new(pointer, name, destructor or None)


def capsule_is_valid(capsule: object, name: bytes) -> bool:
    """Whether ``capsule`` is a live PyCapsule named ``name``."""
    try:
        return bool(_capsule_is_valid(capsule, name))
    except ctypes.ArgumentError:
        return False


def capsule_pointer(capsule: object, name: bytes | None) -> int:
    """The pointer a PyCapsule named ``name`` (None: unnamed) holds, as an address (0 for NULL).

    Raises:
      ValueError: ``capsule`` is not a PyCapsule of that name (CPython's own error).
    """
    return _capsule_get_pointer(capsule, name) or 0


def capsule_name(capsule: object) -> bytes | None:
    """The name a PyCapsule carries (None: unnamed), the one its pointer must be asked with.

    Raises:
      ValueError: ``capsule`` is not a PyCapsule (CPython's own error).
    """
    return _capsule_get_name(capsule)


def ctypes_pointer_address(obj: object) -> int | None:
    """The address a ctypes function pointer or ``c_void_p`` holds (None for NULL); None too
    when ``obj`` is neither."""
    if isinstance(obj, ctypes._CFuncPtr):  # noqa: SLF001 - the public type has no other name  # pyright: ignore[reportAttributeAccessIssue]
        return ctypes.cast(obj, ctypes.c_void_p).value  # pyright: ignore[reportArgumentType]
    if isinstance(obj, ctypes.c_void_p):
        return obj.value
    return None


def capsule_set_name(capsule: object, name: int) -> int:
    """Rename ``capsule`` to the C string at ``name`` (which must outlive it); 0 on success."""
    return _capsule_set_name(capsule, name)


def keep_forever(obj: object) -> None:
    """Take a reference to ``obj`` that is never given back, so that the interpreter's
    teardown, which clears modules and collects what they held, never frees it."""
    _incref(obj)


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when the thread that started it ends
    (``prctl(PR_SET_PDEATHSIG)``); False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
