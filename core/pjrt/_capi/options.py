"""Name/value options (``PJRT_NamedValue``) in both directions.

Client creation takes options as a dict of str, int, list of ints, float or bool; plugins
report their attributes the same way.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Mapping, Union

from .._pjrt_cffi import ffi, lib

OptionValue = Union[str, int, float, bool, "list[int]"]

#: Create options of XLA's own plugins (CPU, CUDA, ROCm, TPU) and the value type each takes.
#: XLA reads a known option with a fixed type and aborts the process on another, so these are
#: checked here, before the plugin sees them.
XLA_OPTION_TYPES: dict[str, type] = {
    "cpu_device_count": int,
    "visible_devices": list,
    "platform_name": str,
    "allocator": str,
    "memory_fraction": float,
    "preallocate": bool,
    "collective_memory_size": int,
    "node_id": int,
    "num_nodes": int,
    "enable_mock_nccl": bool,
    "mock_gpu_topology": str,
    "should_stage_host_to_device_transfers": bool,
}

#: The values XLA's own plugins accept for their numeric create options, as closed ranges:
#: outside them XLA aborts (``cpu_device_count=-1``) or makes a useless client (``0``: one
#: with no devices). The upper bound on ``cpu_device_count`` keeps client creation, quadratic
#: in the count, from looking like a hang.
XLA_OPTION_RANGES: dict[str, tuple[float, float]] = {
    "cpu_device_count": (1, 1 << 16),
    "node_id": (0, 1 << 20),
    "num_nodes": (1, 1 << 20),
    "collective_memory_size": (0, 1 << 62),
    "memory_fraction": (0.0, 1.0),
}

_TYPE_WORDS = {int: "an int", float: "a float", bool: "a bool", str: "a str",
               list: "a list of ints"}


def _is_bool(value) -> bool:
    """bool, or numpy's bool (checked without importing numpy: if numpy is not imported yet,
    no value can be one of its bools)."""
    if isinstance(value, bool):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def _matches(value, expected: type) -> bool:
    if expected is bool:
        return _is_bool(value)
    if expected is int:
        return isinstance(value, numbers.Integral) and not _is_bool(value)
    if expected is float:
        # An int is accepted where a float is expected and sent as a float.
        return isinstance(value, numbers.Real) and not _is_bool(value)
    if expected is str:
        return isinstance(value, str)
    return isinstance(value, (list, tuple))


def check_option_types(options: Mapping[str, OptionValue] | None,
                       expected_types: Mapping[str, type]) -> dict:
    """Check declared options' value types; returns the options with floats coerced.

    Raises:
      TypeError: a declared option has a value of another type; the message names the key.
    """
    checked = dict(options or {})
    for key, value in checked.items():
        expected = expected_types.get(key)
        if expected is None:
            continue
        if not _matches(value, expected):
            raise TypeError(f"option {key!r} must be {_TYPE_WORDS[expected]}, got "
                            f"{type(value).__name__} ({value!r})")
        if expected is float:
            checked[key] = float(value)  # pyright: ignore[reportArgumentType]  # checked above
    return checked


def check_option_values(options: Mapping[str, OptionValue],
                        ranges: Mapping[str, tuple[float, float]] = XLA_OPTION_RANGES) -> None:
    """Check that known numeric options lie in the range their plugin accepts.

    Raises:
      ValueError: naming the option, its value and the range.
    """
    for key, (low, high) in ranges.items():
        value = options.get(key)
        if value is None or _is_bool(value) or not isinstance(value, numbers.Real):
            continue
        if not low <= float(value) <= high:
            raise ValueError(f"option {key!r} must be between {low} and {high}, got {value!r}"
                             + ("; a client needs at least one device" if
                                key == "cpu_device_count" and float(value) < 1 else ""))


class NamedValues:
    """A ``PJRT_NamedValue[]`` built from a dict, with the memory it points into kept alive."""

    def __init__(self, options: Mapping[str, OptionValue] | None):
        options = dict(options or {})
        self._keepalive: list = []
        self.count = len(options)
        self.array = ffi.new("PJRT_NamedValue[]", max(self.count, 1))
        size = ffi.sizeof("PJRT_NamedValue")
        for slot, (key, value) in zip(self.array, options.items()):
            if not isinstance(key, str):
                raise TypeError(f"option names must be str, got {key!r} ({type(key).__name__})")
            slot.struct_size = size
            encoded_key = _utf8(f"option name {key!r}", key)
            slot.name = self._keep(ffi.new("char[]", encoded_key))
            slot.name_size = len(encoded_key)
            self._fill_value(slot, key, value)

    def _keep(self, cdata):
        self._keepalive.append(cdata)
        return cdata

    def _fill_value(self, slot, key: str, value) -> None:
        # bool before int: bool is a subclass of int, and plugins tell the two apart.
        if _is_bool(value):
            slot.type = lib.PJRT_NamedValue_kBool
            slot.bool_value = bool(value)
            slot.value_size = 1
        elif isinstance(value, numbers.Integral):
            slot.type = lib.PJRT_NamedValue_kInt64
            slot.int64_value = _int64(key, value)
            slot.value_size = 1
        elif isinstance(value, numbers.Real):
            slot.type = lib.PJRT_NamedValue_kFloat
            slot.float_value = _float32(key, value)
            slot.value_size = 1
        elif isinstance(value, str):
            encoded = _utf8(f"option {key!r}", value)
            slot.type = lib.PJRT_NamedValue_kString
            slot.string_value = self._keep(ffi.new("char[]", encoded))
            slot.value_size = len(encoded)
        elif isinstance(value, (list, tuple)) and all(
                isinstance(v, numbers.Integral) and not _is_bool(v) for v in value):
            slot.type = lib.PJRT_NamedValue_kInt64List
            items = [_int64(key, v, index) for index, v in enumerate(value)]
            slot.int64_array_value = self._keep(ffi.new("int64_t[]", items or [0]))
            slot.value_size = len(value)
        else:
            raise TypeError(
                f"option {key!r} has a value of type {type(value).__name__} ({value!r}); "
                f"options must be str, int, float, bool or a list of ints")


#: What a PJRT_NamedValue holds: a signed 64-bit int, and a 32-bit float.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _int64(key: str, value, index: int | None = None) -> int:
    """``value`` as a C int64, or an OverflowError naming the option and the range."""
    number = int(value)
    if _INT64_MIN <= number <= _INT64_MAX:
        return number
    where = f"option {key!r}" + (f" (item {index})" if index is not None else "")
    raise OverflowError(f"{where} is {number}, which does not fit the 64-bit signed integer a "
                        f"PJRT option holds ({_INT64_MIN} to {_INT64_MAX})")


def _float32(key: str, value) -> float:
    """``value`` as a C float, or an OverflowError naming the option and the range: a finite
    value past float32's range would reach the plugin as infinity."""
    number = float(value)
    if math.isfinite(number) and abs(number) > _FLOAT32_MAX:
        raise OverflowError(f"option {key!r} is {number!r}, which does not fit the 32-bit float "
                            f"a PJRT option holds (magnitude at most {_FLOAT32_MAX:.7g})")
    return number


def _utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as error:
        raise ValueError(f"{what} cannot be encoded as UTF-8 ({error.reason} at character "
                         f"{error.start}); PJRT option names and strings are UTF-8") from None


def named_values_to_dict(values, count: int) -> dict:
    """Read ``count`` ``PJRT_NamedValue`` entries into a dict."""
    result = {}
    for i in range(count):
        entry = values[i]
        name = ffi.unpack(entry.name, entry.name_size).decode("utf-8", "replace")
        kind = entry.type
        if kind == lib.PJRT_NamedValue_kString:
            value = ffi.unpack(entry.string_value, entry.value_size).decode("utf-8", "replace")
        elif kind == lib.PJRT_NamedValue_kInt64:
            value = int(entry.int64_value)
        elif kind == lib.PJRT_NamedValue_kInt64List:
            value = list(ffi.unpack(entry.int64_array_value, entry.value_size))
        elif kind == lib.PJRT_NamedValue_kFloat:
            value = float(entry.float_value)
        elif kind == lib.PJRT_NamedValue_kBool:
            value = bool(entry.bool_value)
        else:
            continue  # A value type newer than our header: skip it rather than guess.
        result[name] = value
    return result
