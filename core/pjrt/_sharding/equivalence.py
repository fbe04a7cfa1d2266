"""One token object per layout class, so that two shardings are compared by identity.

``Sharding.is_equivalent_to`` asks whether two shardings put the same shards of an array of
some rank on the same devices, in the same order and memory kind. Answering it from scratch
builds both HloShardings and compares them with the device tuples; a call of an SPMD program
with an argument placed by an equal sharding the user built asks it on every call.

Instead each sharding computes once per rank the *key* of its layout (a hashable normal form:
the HloSharding, or one marker for every replicated spelling, the memory kind and the device
tuple) and keeps the token this module hands out for that key. Equal keys get the very same
token for as long as some sharding holds it, so the question becomes ``token_a is token_b``.

The tokens are held only by the shardings (the table's values are weak): when the last
sharding of a layout is collected its entry goes, and a later sharding with the same key gets
a fresh token, which no live sharding holds. Nothing is keyed by ``id()``, so an address reused
by a new object cannot inherit an old verdict; the shardings that cache tokens refuse to be
changed after they are built.
"""
from __future__ import annotations

import threading
import weakref

__all__ = ["REPLICATED", "LayoutToken", "layout_token", "live_layouts"]


class LayoutToken:
    """The identity of one layout class (see the module docstring); compared with ``is``."""

    __slots__ = ("__weakref__",)

    def __repr__(self) -> str:
        return f"<layout token {id(self):#x}>"

    # A token is an identity: a copy must be the token itself, and one cannot be rebuilt
    # elsewhere (a sharding copied with its cache keeps comparing right).
    def __copy__(self) -> "LayoutToken":
        return self

    def __deepcopy__(self, memo) -> "LayoutToken":
        return self

    def __reduce__(self):
        raise TypeError("a layout token cannot be pickled: it stands for a layout only in "
                        "this process")


class _Replicated:
    """The layout part of the key of every replicated spelling (and one-device layouts)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REPLICATED"


#: Stands in for the HloSharding of any replicated-like layout in a key.
REPLICATED = _Replicated()

_tokens: "weakref.WeakValueDictionary[tuple, LayoutToken]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def layout_token(key: tuple) -> LayoutToken:
    """The token of ``key`` (hashable; equal keys, equal layouts): the one a live sharding
    already holds for an equal key, else a new one."""
    with _lock:
        token = _tokens.get(key)
        if token is None:
            token = _tokens[key] = LayoutToken()
        return token


def live_layouts() -> int:
    """How many layout tokens are still held by some sharding (for tests)."""
    return len(_tokens)
