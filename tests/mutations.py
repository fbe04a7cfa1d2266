"""Deterministic mutations of programs and serialized executables, for the damaged-input tests
(``tests/test_damaged_programs.py``): each takes bytes (or text) and a seed and returns a
damaged copy; the same seed always gives the same damage."""
from __future__ import annotations

import random
import re

#: Values a mutated sharding number takes: small, zero, off by one, huge.
_NUMBERS = ("0", "1", "2", "3", "7", "9", "16", "65", "2147483647", "-1",
            "4611686018427387904")  # 2**62: a product of two overflows 64 bits
_SHARDING_CHARS = "0123456789[]{}<>=,T() "
_ATTRIBUTE = re.compile(r'(mhlo\.sharding = "[^"]*"|#sdy\.sharding(?:_per_value)?<[^\n]*?\]>|'
                        r'sdy\.sharding_constraint %\w+ <[^\n]*?\]>|sdy\.mesh @\w+ = <[^>]*>)')


def flip_bytes(blob: bytes, seed: int, *, skip: int = 0) -> bytes:
    """``blob`` with one to four bytes (after the first ``skip``) set to random values."""
    rng = random.Random(seed)
    damaged = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        damaged[rng.randrange(skip, len(damaged))] = rng.randrange(256)
    return bytes(damaged)


def damage_shardings(text: str, seed: int) -> str:
    """``text`` with one sharding annotation damaged: a number replaced, a character changed,
    or a piece cut out."""
    rng = random.Random(seed)
    attributes = list(_ATTRIBUTE.finditer(text))
    match = rng.choice(attributes)
    attribute = match.group(0)
    how = rng.randrange(3)
    numbers = list(re.finditer(r"\d+", attribute))
    if how == 0 and numbers:
        number = rng.choice(numbers)
        attribute = (attribute[:number.start()] + rng.choice(_NUMBERS)
                     + attribute[number.end():])
    elif how == 1:
        at = rng.randrange(len(attribute))
        attribute = attribute[:at] + rng.choice(_SHARDING_CHARS) + attribute[at + 1:]
    else:
        at = rng.randrange(len(attribute))
        attribute = attribute[:at] + attribute[at + rng.randint(1, 6):]
    return text[:match.start()] + attribute + text[match.end():]
