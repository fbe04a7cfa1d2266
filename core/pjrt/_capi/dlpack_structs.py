"""DLPack capsules: the C structs behind ``__dlpack__`` and ``from_dlpack``, both ways.

The protocol: a producer hands out a PyCapsule named ``"dltensor_versioned"`` (DLPack 1.x, a
``DLManagedTensorVersioned*``) or ``"dltensor"`` (legacy, a ``DLManagedTensor*``). A consumer
that takes the tensor renames the capsule ``"used_..."`` and owns it from then on: it calls the
tensor's deleter when done. A capsule nobody consumed deletes the tensor when it is collected.

Exporting (`make_capsule`): a capsule over memory whose tensor keeps an owner object alive
until the consumer lets go. What ``Array.__dlpack__`` shares, copies or refuses, and how the
Array's buffer is kept meanwhile, is decided beside the Array, in
``pjrt._runtime.dlpack_export``.

Importing (`consume`): the tensor's description is read and the capsule is renamed. The
caller then either wraps the memory in a buffer (``PJRT_Client_CreateViewOfDeviceBuffer``,
whose ``on_delete_callback`` runs the producer's deleter when the plugin frees the buffer) or
copies it and calls `Consumed.release` itself.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import dtypes
from .._pjrt_cffi import ffi, lib
from ..errors import ConsumedCapsuleError
from .python_api import capsule_is_valid, capsule_new, capsule_pointer, capsule_set_name

_NULL = ffi.NULL

#: DLPack device types by PJRT platform name (device memory), and for their host memories.
DEVICE_TYPES = {"cpu": lib.kDLCPU, "cuda": lib.kDLCUDA, "rocm": lib.kDLROCM}
HOST_DEVICE_TYPES = {"cuda": lib.kDLCUDAHost, "rocm": lib.kDLROCMHost}
#: Platform names by DLPack device type.
PLATFORMS = {lib.kDLCPU: "cpu", lib.kDLCUDA: "cuda", lib.kDLROCM: "rocm"}

#: The newest DLPack ABI this side speaks.
VERSION = (lib.PJRT_DLPACK_MAJOR, lib.PJRT_DLPACK_MINOR)

# (DLPack type code, bits) by dtype name; only types DLPack defines and ml_dtypes holds in
# whole bytes (sub-byte types are unpacked on the host, which DLPack cannot describe).
_CODES = {
    "bool": (lib.kDLBool, 8),
    "int8": (lib.kDLInt, 8), "int16": (lib.kDLInt, 16), "int32": (lib.kDLInt, 32),
    "int64": (lib.kDLInt, 64),
    "uint8": (lib.kDLUInt, 8), "uint16": (lib.kDLUInt, 16), "uint32": (lib.kDLUInt, 32),
    "uint64": (lib.kDLUInt, 64),
    "float16": (lib.kDLFloat, 16), "float32": (lib.kDLFloat, 32), "float64": (lib.kDLFloat, 64),
    "bfloat16": (lib.kDLBfloat, 16),
    "complex64": (lib.kDLComplex, 64), "complex128": (lib.kDLComplex, 128),
    "float8_e3m4": (lib.kDLFloat8_e3m4, 8), "float8_e4m3": (lib.kDLFloat8_e4m3, 8),
    "float8_e4m3b11fnuz": (lib.kDLFloat8_e4m3b11fnuz, 8),
    "float8_e4m3fn": (lib.kDLFloat8_e4m3fn, 8), "float8_e4m3fnuz": (lib.kDLFloat8_e4m3fnuz, 8),
    "float8_e5m2": (lib.kDLFloat8_e5m2, 8), "float8_e5m2fnuz": (lib.kDLFloat8_e5m2fnuz, 8),
    "float8_e8m0fnu": (lib.kDLFloat8_e8m0fnu, 8),
}
_DTYPE_CODES = {np.dtype(d): code for d in dtypes.SUPPORTED_DTYPES
                for name, code in _CODES.items() if np.dtype(d).name == name}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
#: Dtypes that travel through DLPack both ways.
SUPPORTED_DTYPES: tuple = tuple(sorted(_DTYPE_CODES, key=lambda d: d.name))
# Older producers (DLPack < 0.8) spell bool as an unsigned 8-bit integer of code 6 or as
# kDLUInt with 1 bit; both read as bool.
_CODE_DTYPES.setdefault((lib.kDLUInt, 1), np.dtype(np.bool_))


def dtype_code(dtype: np.dtype) -> tuple[int, int]:
    """``(DLDataTypeCode, bits)`` for a dtype; BufferError when DLPack cannot carry it."""
    try:
        return _DTYPE_CODES[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(sorted(d.name for d in _DTYPE_CODES))
        raise BufferError(f"DLPack cannot carry arrays of dtype {dtype}; it can carry "
                          f"{names}") from None


def dtype_of(code: int, bits: int, lanes: int) -> np.dtype:
    """The dtype of a DLPack ``DLDataType``; BufferError for one pjrt cannot hold."""
    if lanes != 1:
        raise BufferError(f"DLPack tensors with {lanes} lanes per element (vector types) "
                          f"have no pjrt dtype")
    dtype = _CODE_DTYPES.get((code, bits))
    if dtype is None:
        raise BufferError(f"the DLPack type (code {code}, {bits} bits) has no pjrt dtype")
    return dtype


def row_major_strides(shape: tuple) -> tuple:
    """Element strides of a dense row-major array of ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def is_row_major(shape: tuple, strides: tuple | None) -> bool:
    """Whether element ``strides`` describe a dense row-major array (strides of dimensions of
    extent 1, and of empty arrays, do not matter)."""
    if strides is None or math.prod(shape) == 0:
        return True
    expected = row_major_strides(shape)
    return all(extent == 1 or s == e for extent, s, e in zip(shape, strides, expected))


# -- capsules through CPython's C API ------------------------------------------------------

# PyCapsule functions through CPython's C API: `pjrt._capi.python_api`, the core's one ctypes
# module, which keeps a private view of them (``ctypes.pythonapi``'s are shared).


def _address(pointer) -> int:
    return int(ffi.cast("uintptr_t", pointer))


# Static C strings: a capsule keeps a pointer to its name for as long as it lives.
_NAMES = [_address(lib.pjrt_dlpack_capsule_name(i)) for i in range(4)]
_NAME_BYTES = [b"dltensor", b"dltensor_versioned"]
#: The names a consumer gives a capsule it has taken the tensor out of.
_USED_NAME_BYTES = (b"used_dltensor", b"used_dltensor_versioned")
_DESTRUCTOR = _address(ffi.addressof(lib, "pjrt_dlpack_capsule_destructor"))


def make_capsule(owner, data: int, device: tuple[int, int], dtype: np.dtype, shape: tuple,
                 strides: tuple, *, versioned: bool, read_only: bool, copied: bool):
    """A new DLPack capsule over ``data`` whose tensor keeps ``owner`` alive until deleted."""
    code, bits = dtype_code(dtype)
    ndim = len(shape)
    c_shape = ffi.new("int64_t[]", [int(d) for d in shape]) if ndim else _NULL
    c_strides = ffi.new("int64_t[]", [int(s) for s in strides]) if ndim else _NULL
    flags = ((lib.PJRT_DLPACK_FLAG_READ_ONLY if read_only else 0)
             | (lib.PJRT_DLPACK_FLAG_IS_COPIED if copied else 0))
    managed = lib.pjrt_dlpack_export(id(owner), ffi.cast("void *", data), device[0], device[1],
                                     code, bits, ndim, c_shape, c_strides, flags,
                                     int(versioned))
    if managed == _NULL:
        raise MemoryError("no memory for a DLPack tensor")
    try:
        return capsule_new(_address(managed), _NAMES[int(versioned)], _DESTRUCTOR)
    except BaseException:
        lib.pjrt_dlpack_export_abandon(managed, int(versioned))
        raise


# -- importing -----------------------------------------------------------------------------

@dataclasses.dataclass
class Consumed:
    """A DLPack tensor taken from a capsule: the caller owns it and must either hand
    `managed` to a buffer's ``on_delete_callback`` or call `release`."""

    managed: object
    versioned: bool
    data: int
    device: tuple
    dtype: np.dtype
    shape: tuple
    strides: tuple | None
    read_only: bool
    released: bool = False
    #: Set once a buffer's on_delete_callback owns the tensor.
    handed_over: bool = False

    @property
    def deleter(self):
        """The C callback that runs the producer's deleter (for ``on_delete_callback``)."""
        return (lib.pjrt_dlpack_release_versioned if self.versioned
                else lib.pjrt_dlpack_release_legacy)

    def release(self) -> None:
        """Run the producer's deleter (once)."""
        if not self.released and not self.handed_over:
            self.released = True
            self.deleter(_NULL, self.managed)

    def host_view(self) -> np.ndarray:
        """A numpy view of the tensor's memory (host memory only; valid until release)."""
        itemsize = self.dtype.itemsize
        shape = self.shape
        strides = self.strides if self.strides is not None else row_major_strides(shape)
        if math.prod(shape) == 0:
            return np.empty(shape, self.dtype)
        low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides)) * itemsize
        high = (sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + 1) * itemsize
        raw = ffi.buffer(ffi.cast("char *", self.data + low), high - low)
        flat = np.frombuffer(raw, dtype=np.uint8)
        return np.ndarray(shape, dtype=self.dtype, buffer=flat, offset=-low,
                          strides=tuple(s * itemsize for s in strides))


def _was_consumed(capsule) -> bool:
    """Whether ``capsule`` is a DLPack capsule a consumer has renamed ``used_...``."""
    return any(capsule_is_valid(capsule, name) for name in _USED_NAME_BYTES)


def consume(capsule) -> Consumed:
    """Take the tensor out of a DLPack capsule (renaming it ``used_...``).

    Raises:
      ConsumedCapsuleError: the capsule was consumed already (a ``BufferError``, and the
        ``RuntimeError`` jaxlib raises).
      BufferError: the object is not an unconsumed DLPack capsule, or the tensor has a
        dtype or lane count pjrt cannot hold (the capsule is then left to its producer).
      ValueError: a field of the tensor is damaged (ndim, shape, strides, byte_offset, data
        pointer, device), named in the message; the capsule is left to its producer.
    """
    versioned = None
    for flag, name in ((True, _NAME_BYTES[1]), (False, _NAME_BYTES[0])):
        if capsule_is_valid(capsule, name):
            versioned = flag
            break
    if versioned is None:
        if _was_consumed(capsule):
            raise ConsumedCapsuleError(
                "this DLPack capsule was consumed already, and a DLPack tensor may be consumed "
                "at most once; export the array again for another consumer")
        raise BufferError("expected an unconsumed DLPack capsule ('dltensor' or "
                          "'dltensor_versioned'); a capsule can be consumed only once")
    address = capsule_pointer(capsule, _NAME_BYTES[int(versioned)])
    struct = "DLManagedTensorVersioned" if versioned else "DLManagedTensor"
    _require(_readable(address or 0, ffi.sizeof(struct)),
             f"the capsule's {struct} pointer leads to memory that cannot be read")
    if versioned:
        managed = ffi.cast("DLManagedTensorVersioned *", address)
        if managed.version.major > VERSION[0]:
            raise BufferError(f"the producer's DLPack version {managed.version.major}."
                              f"{managed.version.minor} is newer than this side's "
                              f"{VERSION[0]}.{VERSION[1]}")
        tensor = managed.dl_tensor
        read_only = bool(managed.flags & lib.PJRT_DLPACK_FLAG_READ_ONLY)
    else:
        managed = ffi.cast("DLManagedTensor *", address)
        tensor = managed.dl_tensor
        read_only = False
    dtype = dtype_of(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    device = _checked_device(tensor)
    shape, strides = _checked_geometry(tensor)
    data = _checked_data(tensor, device, dtype, shape, strides)
    if capsule_set_name(capsule, _NAMES[2 + int(versioned)]) != 0:
        raise BufferError("could not mark the DLPack capsule as consumed")
    return Consumed(managed, bool(versioned), data, device, dtype, shape, strides, read_only)


# -- checking a producer's tensor before anything reads through it -------------------------
#
# A capsule is a C struct of pointers that pjrt follows: a wrong field (a damaged or hostile
# producer) would crash the process. Each field is checked first; a bad one is a ValueError
# naming it, and the capsule is left unconsumed.

#: The most dimensions a tensor may have (XLA's shapes have far fewer in practice).
MAX_NDIM = 64
#: No tensor spans more bytes than this (nor lies beyond it): far above any real memory, and
#: far enough below 2**64 that address arithmetic cannot wrap.
_MAX_BYTES = 1 << 56
#: Device types a DLPack tensor may name (DLPack's DLDeviceType values).
_KNOWN_DEVICE_TYPES = frozenset({1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})
#: Device types whose memory this process reads directly.
_HOST_DEVICE_TYPES = frozenset({lib.kDLCPU, lib.kDLCUDAHost, lib.kDLROCMHost,
                                lib.kDLCUDAManaged})


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(f"invalid DLPack tensor: {problem}; the producer handed over a "
                         f"damaged capsule (nothing was read or consumed)")


def _readable(address: int, size: int) -> bool:
    return lib.pjrt_dlpack_readable(address, size) != 0


def _checked_device(tensor) -> tuple[int, int]:
    device = (int(tensor.device.device_type), int(tensor.device.device_id))
    _require(device[0] in _KNOWN_DEVICE_TYPES, f"device type {device[0]} is not one DLPack "
                                               f"defines")
    _require(device[1] >= 0, f"device id {device[1]} is negative")
    return device


def _checked_geometry(tensor) -> tuple[tuple, tuple | None]:
    """``(shape, element strides or None)``, read only once their pointers check out."""
    ndim = int(tensor.ndim)
    _require(0 <= ndim <= MAX_NDIM, f"ndim is {ndim}; it must be 0 to {MAX_NDIM}")
    if not ndim:
        return (), None
    for name in ("shape", "strides"):
        pointer = getattr(tensor, name)
        if name == "shape":
            _require(pointer != _NULL, f"ndim is {ndim} but the shape pointer is NULL")
        if pointer != _NULL:
            _require(_readable(_address(pointer), 8 * ndim),
                     f"its {name} pointer leads to memory that cannot be read")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    _require(all(extent >= 0 for extent in shape), f"its shape {shape} has a negative extent")
    strides = (tuple(int(tensor.strides[i]) for i in range(ndim))
               if tensor.strides != _NULL else None)
    return shape, strides


def _checked_data(tensor, device: tuple, dtype: np.dtype, shape: tuple,
                  strides: tuple | None) -> int:
    """The address of the first element, once the whole span of elements is known to lie
    in addressable memory (and, for host memory, its first and last bytes to be readable)."""
    offset = int(tensor.byte_offset)
    _require(offset < _MAX_BYTES, f"its byte_offset {offset} is beyond any memory")
    count = math.prod(shape)
    itemsize = dtype.itemsize
    _require(count * itemsize < _MAX_BYTES, f"its shape {shape} of {dtype} spans more bytes "
                                            f"than any memory holds")
    base = _address(tensor.data)
    if count == 0:
        return base + offset
    _require(base != 0, f"its data pointer is NULL but its shape {shape} holds {count} "
                        f"elements")
    steps = strides if strides is not None else row_major_strides(shape)
    low = sum(min(0, (n - 1) * s) for n, s in zip(shape, steps)) * itemsize
    high = (sum(max(0, (n - 1) * s) for n, s in zip(shape, steps)) + 1) * itemsize
    _require(high - low < _MAX_BYTES, f"its strides {strides} span more bytes than any "
                                      f"memory holds")
    first, end = base + offset + low, base + offset + high
    _require(0 < first and end < _MAX_BYTES, f"its elements (data {base:#x}, byte_offset "
                                             f"{offset}, strides {strides}) lie outside "
                                             f"addressable memory")
    if device[0] in _HOST_DEVICE_TYPES:
        _require(_readable(first, 1) and _readable(end - 1, 1),
                 f"its elements (data {base:#x}, byte_offset {offset}, strides {strides}) "
                 f"are not readable memory of this process")
    return base + offset
