"""Element types: numpy dtypes next to PJRT's ``PJRT_Buffer_Type`` and XLA's ``PrimitiveType``.

This is the package's one table of element types. Each row gives XLA's ``PrimitiveType``
number and name (``xla_data.proto``; the name is how HLO text spells the type), the
``PJRT_Buffer_Type`` it travels as through the C API, and the numpy dtype that holds it on
the host. numpy covers the standard types; ml_dtypes adds bfloat16, the float8 family and the
sub-byte integers. A type maps to a dtype only when both our header and the installed
ml_dtypes know it; the non-array types (tuple, opaque, token) have a name and no dtype.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ._pjrt_cffi import lib

__all__ = ["SUPPORTED_DTYPES", "XLA_TUPLE_TYPE", "to_pjrt_type", "from_pjrt_type",
           "to_xla_type", "from_xla_type", "xla_type_name"]

# (XLA PrimitiveType number, XLA name, PJRT_Buffer_Type suffix, numpy dtype or ml_dtypes
# attribute). The two numberings differ: PJRT's enum has its own order.
_TYPES = (
    (1, "pred", "PRED", np.bool_),
    (2, "s8", "S8", np.int8),
    (3, "s16", "S16", np.int16),
    (4, "s32", "S32", np.int32),
    (5, "s64", "S64", np.int64),
    (6, "u8", "U8", np.uint8),
    (7, "u16", "U16", np.uint16),
    (8, "u32", "U32", np.uint32),
    (9, "u64", "U64", np.uint64),
    (10, "f16", "F16", np.float16),
    (11, "f32", "F32", np.float32),
    (12, "f64", "F64", np.float64),
    (13, "tuple", None, None),
    (14, "opaque", None, None),
    (15, "c64", "C64", np.complex64),
    (16, "bf16", "BF16", "bfloat16"),
    (17, "token", None, None),
    (18, "c128", "C128", np.complex128),
    (19, "f8e5m2", "F8E5M2", "float8_e5m2"),
    (20, "f8e4m3fn", "F8E4M3FN", "float8_e4m3fn"),
    (21, "s4", "S4", "int4"),
    (22, "u4", "U4", "uint4"),
    (23, "f8e4m3b11fnuz", "F8E4M3B11FNUZ", "float8_e4m3b11fnuz"),
    (24, "f8e5m2fnuz", "F8E5M2FNUZ", "float8_e5m2fnuz"),
    (25, "f8e4m3fnuz", "F8E4M3FNUZ", "float8_e4m3fnuz"),
    (26, "s2", "S2", "int2"),
    (27, "u2", "U2", "uint2"),
    (28, "f8e4m3", "F8E4M3", "float8_e4m3"),
    (29, "f8e3m4", "F8E3M4", "float8_e3m4"),
    (32, "f4e2m1fn", "F4E2M1FN", "float4_e2m1fn"),
    (33, "f8e8m0fnu", "F8E8M0FNU", "float8_e8m0fnu"),
)

#: XLA's ``PrimitiveType`` number of a tuple shape.
XLA_TUPLE_TYPE = 13

_XLA_NAMES: dict[int, str] = {}
_PJRT_TO_DTYPE: dict[int, np.dtype] = {}
_DTYPE_TO_PJRT: dict[np.dtype, int] = {}
_XLA_TO_DTYPE: dict[int, np.dtype] = {}
_DTYPE_TO_XLA: dict[np.dtype, int] = {}

for _xla_number, _xla_name, _suffix, _kind in _TYPES:
    _XLA_NAMES[_xla_number] = _xla_name
    if _suffix is None:
        continue
    _pjrt_number = getattr(lib, "PJRT_Buffer_Type_" + _suffix, None)
    _scalar = getattr(ml_dtypes, _kind, None) if isinstance(_kind, str) else _kind
    if _pjrt_number is None or _scalar is None:
        continue
    _dtype = np.dtype(_scalar)
    _PJRT_TO_DTYPE[_pjrt_number] = _dtype
    _DTYPE_TO_PJRT[_dtype] = _pjrt_number
    _XLA_TO_DTYPE[_xla_number] = _dtype
    _DTYPE_TO_XLA[_dtype] = _xla_number

#: Every dtype an Array may have.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(_DTYPE_TO_PJRT)


def _unsupported(dtype: np.dtype) -> TypeError:
    names = ", ".join(sorted(d.name for d in SUPPORTED_DTYPES))
    return TypeError(f"arrays of dtype {dtype} cannot be placed on a PJRT device; "
                     f"supported dtypes: {names}")


def to_pjrt_type(dtype) -> int:
    """The ``PJRT_Buffer_Type`` for a numpy dtype; TypeError listing the supported ones."""
    dtype = np.dtype(dtype)
    try:
        return _DTYPE_TO_PJRT[dtype]
    except KeyError:
        raise _unsupported(dtype) from None


def from_pjrt_type(buffer_type: int) -> np.dtype:
    """The numpy dtype for a ``PJRT_Buffer_Type`` value; TypeError for one without."""
    try:
        return _PJRT_TO_DTYPE[buffer_type]
    except KeyError:
        raise TypeError(f"PJRT buffer type {buffer_type} has no numpy equivalent here") from None


def to_xla_type(dtype) -> int:
    """The XLA ``PrimitiveType`` number for a numpy dtype; TypeError listing the supported ones."""
    dtype = np.dtype(dtype)
    try:
        return _DTYPE_TO_XLA[dtype]
    except KeyError:
        raise _unsupported(dtype) from None


def from_xla_type(primitive_type: int) -> np.dtype | None:
    """The numpy dtype for an XLA ``PrimitiveType`` number, or None (tuples, tokens, ...)."""
    return _XLA_TO_DTYPE.get(primitive_type)


def xla_type_name(primitive_type: int) -> str:
    """XLA's name for a ``PrimitiveType`` number as HLO text spells it (``f32``, ``bf16``,
    ``token``); ``type<N>`` for a number this table does not know."""
    return _XLA_NAMES.get(primitive_type, f"type{primitive_type}")
