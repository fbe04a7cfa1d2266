"""The rule every array shape handed to a plugin must keep: its extents' running product fits
in int64.

XLA builds each shape it is given (a buffer's, a streamed buffer's, a layout's, every tensor
type of a program) by multiplying the element's byte width by the extents one at a time, first
to last, and refuses the shape when any of those products overflows a signed 64-bit integer,
even when a later extent is 0 and the shape holds no element (``(2**62, 2**62, 0)``, or
``(3, 2**61, 0)`` of 4-byte elements). Where that refusal comes up inside a plugin's C API
call, it ends the process (XLA's CPU plugins abort on it), so pjrt checks the same rule first,
here, for every path that passes a shape on. A numpy array always keeps it: numpy refuses an
array whose byte width times the product of its non-zero extents overflows.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["INT64_MAX", "check_extents", "extents_overflow"]

#: The largest value of a C ``int64_t``.
INT64_MAX = (1 << 63) - 1

#: What the error says the rule is.
RULE = ("XLA needs the element's byte width times the extents, multiplied in order, to fit "
        "in int64 (2**63 - 1) at every step, even when a later extent is 0")


def extents_overflow(dims: Sequence[int], element_bytes: int) -> int | None:
    """The index of the first extent at which the running product ``element_bytes * dims[0]
    * ... * dims[i]`` passes `INT64_MAX`, or None when it never does. Dynamic extents
    (negative: ``?`` in a program, XLA's unbounded size) are skipped, as XLA skips them."""
    product = element_bytes
    for index, extent in enumerate(dims):
        if extent < 0:
            continue
        product *= extent
        if product > INT64_MAX:
            return index
    return None


def check_extents(dims: Sequence[int], element_bytes: int, what: str) -> None:
    """Refuse a shape XLA cannot hold (see the module's description).

    Args:
      dims: the extents.
      element_bytes: the element's width in bytes (1 for types packed below a byte).
      what: how the error names the shape (``"shapes[0] ((3, 4), float32)"``).

    Raises:
      ValueError: the running product overflows; the error names the shape, the extent at
        which it overflows, and the rule.
    """
    index = extents_overflow(dims, element_bytes)
    if index is not None:
        prefix = " * ".join([str(element_bytes)] + [str(d) for d in dims[:index + 1] if d >= 0])
        raise ValueError(f"{what} cannot be given to a plugin: its extents overflow int64 at "
                         f"dimension {index} ({prefix} bytes > 2**63 - 1). {RULE}; "
                         f"make the extents smaller")
