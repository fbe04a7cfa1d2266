"""XLA's text form of a sharding (``{devices=[2,1]0,1}``): the parser.

The text is what XLA prints for an ``HloSharding`` and what ``mhlo.sharding`` attributes
hold. The parser checks the grammar and hands each sharding to a *factory* (the
[`HloSharding`][pjrt.hlo_sharding.HloSharding] class, passed in by its caller) through its public
constructors, so errors from either carry the offset in the text.
"""
from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

from .op_sharding import SUBGROUP_BY_NAME, OpShardingType
from .lexer import TokenStream

__all__ = ["parse_sharding_text"]


def parse_sharding_text(text: str, factory):
    """Parse XLA's sharding text, building the result with ``factory`` (see the module
    docstring; it provides ``replicate``, ``manual``, ``unknown``, ``unreduced``, ``maximal``,
    ``tiled``, ``iota_tile`` and ``tuple_sharding``).

    Raises:
      ValueError: the text is not a valid sharding; the message shows where.
    """
    return _Parser(text, factory).parse()


_TOKEN = re.compile(r"""
    (?P<space>\s+|/\*.*?\*/)
  | (?P<punct><=|[{}\[\](),=])
  | (?P<int>-?\d+)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
""", re.VERBOSE | re.DOTALL)


class _Parser(TokenStream):
    """Recursive-descent parser for XLA's sharding text; builds through ``factory``."""

    def __init__(self, text: str, factory):
        super().__init__(text, _TOKEN, "sharding")
        self.factory = factory

    def int_list(self, open_: str, close: str) -> list[int]:
        self.expect(open_)
        values = [self.integer()]
        while self.peek() == ",":
            self.next()
            values.append(self.integer())
        self.expect(close)
        return values

    def parse(self) :
        self.expect("{")
        if self.peek() in ("{", "}"):
            elements = []
            if self.peek() != "}":
                elements.append(self.single(expect_brace=True))
                while self.peek() == ",":
                    self.next()
                    elements.append(self.single(expect_brace=True))
            self.expect("}")
            result = self.factory.tuple_sharding(elements)
        else:
            result = self.single(expect_brace=False)
        if self.index != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r} after the sharding")
        return result

    def skip_braced(self) -> None:
        self.expect("{")
        depth = 1
        while depth:
            text = self.next()[1]
            depth += {"{": 1, "}": -1}.get(text, 0)

    def single(self, expect_brace: bool) :
        if expect_brace:
            self.expect("{")
        start = self.tokens[self.index - 1][2]
        flags: set[str] = set()
        device: Optional[int] = None
        dims: Optional[list[int]] = None
        devices: Optional[list[int]] = None
        iota: Optional[tuple[list[int], list[int]]] = None
        subgroups: Optional[list[OpShardingType]] = None
        while self.peek() != "}":
            kind, text, pos = self.next()
            if text in ("replicated", "manual", "unknown", "unreduced", "maximal",
                        "last_tile_dim_replicate"):
                flags.add(text)
            elif text == "device":
                self.expect("=")
                device = self.integer()
            elif text == "devices":
                self.expect("=")
                dims = self.int_list("[", "]")
                if self.peek() == "<=":
                    self.next()
                    reshape_dims = self.int_list("[", "]")
                    perm = list(range(len(reshape_dims)))
                    if self.peek() == "T":
                        if len(reshape_dims) == 1:
                            raise self.error("a one-dimensional iota takes no transpose")
                        self.next()
                        perm = self.int_list("(", ")")
                    elif len(reshape_dims) > 1:
                        raise self.error("expected 'T(' with the transpose of a multi-"
                                         "dimensional iota")
                    iota = (reshape_dims, perm)
                else:
                    devices = [self.integer()]
                    while self.peek() == ",":
                        self.next()
                        devices.append(self.integer())
            elif text == "last_tile_dims":
                self.expect("=")
                self.expect("{")
                subgroups = []
                while True:
                    kind, name, pos = self.next()
                    if name not in SUBGROUP_BY_NAME:
                        raise self.error(f"unknown subgroup type {name!r}", pos)
                    subgroups.append(SUBGROUP_BY_NAME[name])
                    if self.peek() != ",":
                        break
                    self.next()
                self.expect("}")
            elif text == "metadata":
                self.expect("=")
                self.skip_braced()
            elif text in ("shard_as", "shard_like"):
                raise self.error("shard groups (shard_as / shard_like) are not supported", pos)
            else:
                raise self.error(f"unexpected {text!r}", pos)
        self.expect("}")
        return self.build(start, flags, device, dims, devices, iota, subgroups)

    def build(self, start, flags, device, dims, devices, iota, subgroups) :
        def error(message):
            return self.error(message, start)
        simple = flags & {"replicated", "manual", "unknown", "unreduced"}
        if simple:
            if len(simple) > 1 or "maximal" in flags or dims is not None or device is not None:
                raise error("a replicated, manual, unknown or unreduced sharding takes "
                            "nothing else")
            (name,) = simple
            return {"replicated": self.factory.replicate, "manual": self.factory.manual,
                    "unknown": self.factory.unknown, "unreduced": self.factory.unreduced}[name]()
        if "maximal" in flags:
            if device is None or dims is not None:
                raise error("a maximal sharding needs exactly 'device=N'")
            if device < 0:
                raise error("device ids must be >= 0")
            return self.factory.maximal(device)
        if dims is None:
            raise error("expected 'devices=[...]', 'replicated', 'manual' or 'maximal'")
        if device is not None:
            raise error("'device=' belongs to maximal shardings")
        if subgroups is not None and "last_tile_dim_replicate" in flags:
            raise error("give either last_tile_dim_replicate or last_tile_dims, not both")
        if any(d <= 0 for d in dims):
            raise error(f"tile dimensions must be positive, got {dims}")
        replicate_last = "last_tile_dim_replicate" in flags
        types = tuple(subgroups or ())
        if len(types) > len(dims):
            raise error(f"{len(types)} subgroup types for {len(dims)} tile dimensions")
        try:
            if iota is not None:
                reshape_dims, perm = iota
                return self.factory.iota_tile(dims, reshape_dims, perm,
                                              last_tile_dim_replicate=replicate_last,
                                              subgroup_types=types)
            if len(devices) <= 1:
                raise ValueError("a tiled sharding needs more than one device")
            if math.prod(dims) != len(devices):
                raise ValueError(f"tile dimensions {dims} hold {math.prod(dims)} devices "
                                 f"but {len(devices)} are listed")
            return self.factory.tiled(np.array(devices, dtype=np.int64).reshape(dims),
                                     last_tile_dim_replicate=replicate_last,
                                     subgroup_types=types)
        except ValueError as problem:
            raise error(str(problem)) from None
