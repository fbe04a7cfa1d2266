"""Every conformance check, in the order they run: the check modules, imported in that order
(each registers its checks with `._registry` as it is imported)."""
from __future__ import annotations

import fnmatch

from . import checks_library, checks_runtime, checks_programs, checks_parallel  # noqa: F401
from ._registry import CHECKS, Check


def load_checks() -> dict[str, Check]:
    """Every check, once the modules defining them are imported."""
    return CHECKS


def select(names: list[str] | None = None, patterns: list[str] | None = None) -> list[str]:
    """The names of the checks to run, in order.

    Args:
      names: exact check names (``--check``); unknown ones raise.
      patterns: substrings or shell-style patterns (``-k``) matched against names.

    Raises:
      ValueError: a name is not a check, or nothing matches; the message lists what exists.
    """
    checks = load_checks()
    if not names and not patterns:
        return list(checks)
    unknown = [name for name in names or () if name not in checks]
    if unknown:
        raise ValueError(f"no conformance check named {', '.join(map(repr, unknown))}; "
                         f"`pjrt conform --list` shows them all")
    chosen = set(names or ())
    for pattern in patterns or ():
        glob = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        chosen.update(name for name in checks if fnmatch.fnmatchcase(name, glob))
    if not chosen:
        raise ValueError(f"no conformance check matches {', '.join(map(repr, patterns or ()))}; "
                         f"`pjrt conform --list` shows them all")
    return [name for name in checks if name in chosen]
