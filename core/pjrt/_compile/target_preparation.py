"""Set-up that custom-call targets need before the first program calling them compiles.

Some handlers are cheap to register but costly to make ready: pjrt-cpu's LAPACK kernels take
their routines from SciPy, whose import costs more than the rest of pjrt's start-up, and most
programs call no LAPACK. `register_target_preparation` defers such set-up; the compile
path calls `prepare_targets` with each program, which runs what that program needs.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable

__all__ = ["canonical_platform", "prepare_targets", "register_target_preparation"]

#: Platform names that denote the same XLA platform (XLA canonicalises "cpu" to "host").
_PLATFORM_ALIASES = {"host": "cpu"}


def canonical_platform(platform: str) -> str:
    """The name custom-call registrations use for ``platform`` ("host" is "cpu")."""
    if not isinstance(platform, str) or not platform:
        raise TypeError(f"platform must be a non-empty string, not {platform!r}")
    lowered = platform.lower()
    return _PLATFORM_ALIASES.get(lowered, lowered)


#: Targets are looked for by the first bytes of their names first: a compile of a large
#: program then scans it a few times, not once per target (61 for pjrt-cpu's LAPACK kernels).
_PREFIX_BYTES = 6


class _Preparation:
    __slots__ = ("targets", "by_prefix", "prepare", "done", "lock")

    def __init__(self, targets: tuple[bytes, ...], prepare: Callable[[], object]):
        self.targets = targets
        by_prefix: dict[bytes, list[bytes]] = {}
        for name in targets:
            by_prefix.setdefault(name[:_PREFIX_BYTES], []).append(name)
        self.by_prefix = {prefix: tuple(names) for prefix, names in by_prefix.items()}
        self.prepare = prepare
        self.done = False
        self.lock = threading.Lock()

    def named_in(self, program: bytes) -> list[bytes]:
        """The targets ``program`` names."""
        return [name for prefix, names in self.by_prefix.items() if prefix in program
                for name in names if name in program]


_registry_lock = threading.Lock()
#: canonical platform -> preparations not yet run (see register_target_preparation).
_pending: dict[str, list[_Preparation]] = {}


def register_target_preparation(targets: Iterable[str], prepare: Callable[[], object],
                                platform: str = "cpu") -> None:
    """Run ``prepare()`` once, before the first program that calls one of ``targets`` on
    ``platform`` is compiled (or, since its program cannot be read, before any serialized
    executable is loaded there).

    For handlers whose set-up is costly and most programs never need: pjrt-cpu's LAPACK
    kernels take their routines from SciPy, whose import costs more than the rest of start-up.
    A ``prepare`` that raises is tried again by the next such compile. Registering the same
    ``prepare`` again (as a plugin package does for each client it makes) adds its targets to
    the one pending preparation.
    """
    names = {name.encode() for name in targets}
    if not names:
        return
    with _registry_lock:
        pending = _pending.setdefault(canonical_platform(platform), [])
        for index, preparation in enumerate(pending):
            if preparation.prepare is prepare and not preparation.done:
                names.update(preparation.targets)
                pending[index] = _Preparation(tuple(sorted(names)), prepare)
                return
        pending.append(_Preparation(tuple(sorted(names)), prepare))


def prepare_targets(platform: str, program: bytes | None) -> None:
    """Run the preparations `register_target_preparation` keeps for ``platform`` whose
    targets ``program`` (StableHLO text or bytecode, whose strings are stored whole) names;
    all of them when ``program`` is None.

    Raises:
      RuntimeError: a preparation failed (its error is the cause).
    """
    if not _pending:
        return
    canonical = canonical_platform(platform)
    for preparation in list(_pending.get(canonical, ())):
        if preparation.done:
            continue
        named = list(preparation.targets) if program is None else preparation.named_in(program)
        if not named:
            continue
        with preparation.lock:  # one thread prepares; the others wait for it
            if preparation.done:
                continue
            try:
                preparation.prepare()
            except Exception as exc:
                names = [n.decode() for n in named]
                raise RuntimeError(
                    f"the custom-call targets {', '.join(names[:4])}"
                    f"{' ...' if len(names) > 4 else ''} on {canonical} could not be set up: "
                    f"{type(exc).__name__}: {exc}") from exc
            preparation.done = True
        with _registry_lock:
            pending = _pending.get(canonical, [])
            if preparation in pending:
                pending.remove(preparation)
            if not pending:
                _pending.pop(canonical, None)
