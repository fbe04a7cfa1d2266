"""Element types: PJRT's ``PJRT_Buffer_Type`` and XLA's ``PrimitiveType`` next to numpy dtypes.

numpy covers the standard types; ml_dtypes adds bfloat16, the float8 family and the sub-byte
integers. A type is listed only when both our header and the installed ml_dtypes know it.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ._pjrt_cffi import lib

# (PJRT_Buffer_Type suffix, XLA PrimitiveType number, numpy dtype or ml_dtypes attribute).
# PrimitiveType numbers are those of xla_data.proto; they differ from PJRT's numbering.
_TYPES = (
    ("PRED", 1, np.bool_),
    ("S8", 2, np.int8),
    ("S16", 3, np.int16),
    ("S32", 4, np.int32),
    ("S64", 5, np.int64),
    ("U8", 6, np.uint8),
    ("U16", 7, np.uint16),
    ("U32", 8, np.uint32),
    ("U64", 9, np.uint64),
    ("F16", 10, np.float16),
    ("F32", 11, np.float32),
    ("F64", 12, np.float64),
    ("BF16", 16, "bfloat16"),
    ("C64", 15, np.complex64),
    ("C128", 18, np.complex128),
    ("F8E5M2", 19, "float8_e5m2"),
    ("F8E4M3FN", 20, "float8_e4m3fn"),
    ("F8E4M3B11FNUZ", 23, "float8_e4m3b11fnuz"),
    ("F8E5M2FNUZ", 24, "float8_e5m2fnuz"),
    ("F8E4M3FNUZ", 25, "float8_e4m3fnuz"),
    ("S4", 21, "int4"),
    ("U4", 22, "uint4"),
    ("S2", 26, "int2"),
    ("U2", 27, "uint2"),
    ("F8E4M3", 28, "float8_e4m3"),
    ("F8E3M4", 29, "float8_e3m4"),
    ("F8E8M0FNU", 33, "float8_e8m0fnu"),
    ("F4E2M1FN", 32, "float4_e2m1fn"),
)

_PJRT_TO_DTYPE: dict[int, np.dtype] = {}
_DTYPE_TO_PJRT: dict[np.dtype, int] = {}
_XLA_TO_DTYPE: dict[int, np.dtype] = {}

for _suffix, _xla_number, _kind in _TYPES:
    _pjrt_number = getattr(lib, "PJRT_Buffer_Type_" + _suffix, None)
    _scalar = getattr(ml_dtypes, _kind, None) if isinstance(_kind, str) else _kind
    if _pjrt_number is None or _scalar is None:
        continue
    _dtype = np.dtype(_scalar)
    _PJRT_TO_DTYPE[_pjrt_number] = _dtype
    _DTYPE_TO_PJRT[_dtype] = _pjrt_number
    _XLA_TO_DTYPE[_xla_number] = _dtype

#: Every dtype an Array may have.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(_DTYPE_TO_PJRT)


def to_pjrt_type(dtype) -> int:
    """The ``PJRT_Buffer_Type`` for a numpy dtype; TypeError listing the supported ones."""
    dtype = np.dtype(dtype)
    try:
        return _DTYPE_TO_PJRT[dtype]
    except KeyError:
        names = ", ".join(sorted(d.name for d in SUPPORTED_DTYPES))
        raise TypeError(f"arrays of dtype {dtype} cannot be placed on a PJRT device; "
                        f"supported dtypes: {names}") from None


def from_pjrt_type(buffer_type: int) -> np.dtype:
    """The numpy dtype for a ``PJRT_Buffer_Type`` value."""
    try:
        return _PJRT_TO_DTYPE[buffer_type]
    except KeyError:
        raise TypeError(f"PJRT buffer type {buffer_type} has no numpy equivalent here") from None


def from_xla_type(primitive_type: int) -> np.dtype | None:
    """The numpy dtype for an XLA ``PrimitiveType`` number, or None (tuples, tokens, ...)."""
    return _XLA_TO_DTYPE.get(primitive_type)
