"""pjrt.dtypes, the one element-type table, judged against jax's own dtype mapping and the
XLA CPU plugin."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pjrt import dtypes


def test_every_supported_dtype_round_trips_through_both_numberings():
    assert len(set(dtypes.SUPPORTED_DTYPES)) == len(dtypes.SUPPORTED_DTYPES)
    for dtype in dtypes.SUPPORTED_DTYPES:
        assert dtypes.from_pjrt_type(dtypes.to_pjrt_type(dtype)) == dtype
        assert dtypes.from_xla_type(dtypes.to_xla_type(dtype)) == dtype


@pytest.mark.parametrize("dtype, number, name", [
    (np.bool_, 1, "pred"), (np.int8, 2, "s8"), (np.int32, 4, "s32"), (np.uint64, 9, "u64"),
    (np.float16, 10, "f16"), (np.float32, 11, "f32"), (np.float64, 12, "f64"),
    (np.complex64, 15, "c64"), (ml_dtypes.bfloat16, 16, "bf16"), (np.complex128, 18, "c128"),
    (ml_dtypes.float8_e4m3fn, 20, "f8e4m3fn"), (ml_dtypes.int4, 21, "s4"),
])
def test_xla_numbers_and_names(dtype, number, name):
    assert dtypes.to_xla_type(dtype) == number
    assert dtypes.xla_type_name(number) == name
    assert dtypes.from_xla_type(number) == np.dtype(dtype)


def test_non_array_types_have_a_name_and_no_dtype():
    assert dtypes.XLA_TUPLE_TYPE == 13
    for number, name in ((13, "tuple"), (14, "opaque"), (17, "token")):
        assert dtypes.xla_type_name(number) == name
        assert dtypes.from_xla_type(number) is None
    assert dtypes.xla_type_name(999) == "type999"


def test_unsupported_dtypes_are_type_errors_listing_the_supported_ones():
    with pytest.raises(TypeError, match="float32"):
        dtypes.to_pjrt_type(np.dtype("U3"))
    with pytest.raises(TypeError, match="float32"):
        dtypes.to_xla_type(object)
    with pytest.raises(TypeError, match="12345"):
        dtypes.from_pjrt_type(12345)


def test_xla_numbers_and_names_match_jaxlib():
    # jaxlib's own PrimitiveType enum (xla_data.proto) names every number the table knows.
    pytest.importorskip("jax")
    from jax._src.lib import xla_client as xc

    # The enum says OPAQUE_TYPE; HLO text (and so the table) says opaque.
    known = {int(member): name.lower().replace("opaque_type", "opaque")
             for name, member in xc.PrimitiveType.__members__.items()}
    for number, name in known.items():
        if number:  # 0 is PRIMITIVE_TYPE_INVALID
            assert dtypes.xla_type_name(number) == name, number
    # Every dtype's number is one jaxlib's enum knows, save the 2-bit integers it does not bind.
    missing = {np.dtype(d).name for d in dtypes.SUPPORTED_DTYPES
               if dtypes.to_xla_type(d) not in known}
    assert missing <= {"int2", "uint2"}, missing


def test_the_cpu_plugin_reports_the_pjrt_numbers(client):
    # A buffer placed with our PJRT_Buffer_Type reports that type back from the plugin.
    for dtype in (np.float32, np.int8, np.uint16, np.bool_, np.complex64, ml_dtypes.bfloat16):
        host = np.arange(4).astype(dtype)
        array = client.buffer_from_pyval(host)
        assert array.dtype == np.dtype(dtype)
        assert np.array_equal(np.asarray(array), host)
