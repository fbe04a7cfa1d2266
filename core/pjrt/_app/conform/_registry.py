"""The conformance checks: their stable names, what each needs, and the order they run in.

A check is a function of a `Context` that returns a detail
line (or None) when it passes, raises `Skip` when it does not apply to the plugin, and
raises anything else when it fails. Its name is dotted (``transfer.roundtrip.int4``) and
stable: CI configurations select checks by it.

``needs`` names the checks a check builds on: when one of them failed, the check is skipped
with that reason instead of failing again for the same cause.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


class Skip(Exception):
    """The check does not apply to this plugin; the message says why."""


class CheckFailed(AssertionError):
    """The plugin answered, but not as PJRT requires; the message says what it did."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check.

    Attributes:
      name: the stable dotted name.
      run: ``run(context) -> str | None``; the detail of a pass.
      needs: names of checks whose failure makes this one meaningless.
      doc: one line saying what is checked.
    """

    name: str
    run: Callable
    needs: tuple[str, ...]
    doc: str


#: Every check, in the order they run.
CHECKS: dict[str, Check] = {}

#: The check that creates the shared client; most checks need it.
CLIENT = "client.create"
#: The check that loads the library and calls GetPjrtApi.
LOADED = "library.get_pjrt_api"


def check(name: str, *, needs: tuple[str, ...] = (CLIENT,)):
    """Register the decorated function as the check ``name`` (its docstring's first line is
    the check's description)."""
    def register(fn: Callable) -> Callable:
        add(name, fn, needs, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        return fn
    return register


def add(name: str, fn: Callable, needs: tuple[str, ...], doc: str) -> None:
    """Register ``fn`` as the check ``name`` (for checks made in a loop, one per dtype)."""
    if name in CHECKS:
        raise ValueError(f"conformance check {name!r} is defined twice")
    CHECKS[name] = Check(name, fn, tuple(needs), doc)


def blocked_by(name: str, failed: set[str]) -> str | None:
    """The failed check that ``name`` builds on, if any (its dependencies' too)."""
    seen: set[str] = set()
    pending = list(CHECKS[name].needs)
    while pending:
        need = pending.pop(0)
        if need in seen:
            continue
        seen.add(need)
        if need in failed:
            return need
        if need in CHECKS:
            pending.extend(CHECKS[need].needs)
    return None
