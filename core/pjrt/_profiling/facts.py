"""An event's facts as JSON can hold them: no value given to an annotation can cost a trace.

The facts of pjrt's own events are numbers and text already; those of the user's annotations
(``TraceAnnotation("step", **facts)``, ``set_metadata``) can be anything, and are made JSON
when the annotation ends (their values then, not later) and again when the trace is written.
This module imports nothing of pjrt.
"""
from __future__ import annotations

import math
import numbers

#: How deep `json_facts` follows lists and dicts inside one another; what lies deeper is text.
_MAX_DEPTH = 32


def json_facts(args: dict) -> dict:
    """An event's facts in a form JSON holds, whatever they are: strings, finite numbers
    (numpy's too), booleans and None as they are; lists, tuples and dicts followed, their keys
    made text where they are not strings; everything else made text, as ``str`` gives it
    (``repr`` when that fails, the type's name when both do). NaN and infinities are text
    (``"nan"``, ``"inf"``: JSON has no form for them); a list or dict inside itself is
    ``"[...]"`` or ``"{...}"`` there, as Python prints it."""
    return _json_dict(args, set(), 0)


def _json_value(value, open_containers: set, depth: int):
    if value is None or type(value) in (bool, str):
        return value
    try:
        if isinstance(value, numbers.Real):  # an IntEnum as its number, as json writes it
            if isinstance(value, numbers.Integral):
                return bool(value) if isinstance(value, bool) else int(value)
            number = float(value)
            return number if math.isfinite(number) else _text(number)
        if isinstance(value, (list, tuple, dict)):
            if id(value) in open_containers:
                return "{...}" if isinstance(value, dict) else "[...]"
            if depth >= _MAX_DEPTH:
                return f"<{type(value).__name__} nested deeper than {_MAX_DEPTH} levels>"
            if isinstance(value, dict):
                return _json_dict(value, open_containers, depth)
            open_containers.add(id(value))
            try:
                return [_json_value(item, open_containers, depth + 1) for item in list(value)]
            finally:
                open_containers.discard(id(value))
    except Exception:  # noqa: BLE001 - a value that cannot be followed is still a fact
        pass
    return _text(value)


def _json_dict(mapping: dict, open_containers: set, depth: int) -> dict:
    open_containers.add(id(mapping))
    try:
        return {(key if type(key) is str else _text(key)):
                _json_value(item, open_containers, depth + 1)
                for key, item in list(mapping.items())}
    finally:
        open_containers.discard(id(mapping))


def _text(value) -> str:
    for convert in (str, repr):
        try:
            text = convert(value)
            if type(text) is str:
                return text
        except Exception:  # noqa: BLE001 - a value that cannot say what it is still gets a fact
            pass
    return f"<{type(value).__name__} object>"
