"""Whether an address lies in a loaded shared library's code.

A custom-call handler handed over as a bare address may be C in a library or a trampoline into
Python that libffi made (a ``CFUNCTYPE`` of a Python function, an ``ffi.callback``); launches
may keep the GIL only while no handler can call Python (see `pjrt.ffi`). Trampolines live in
anonymous executable memory, a library's functions in its file-backed mapping; Linux lists
both in ``/proc/self/maps``.
"""
from __future__ import annotations


class LibraryCode:
    """Which addresses lie in a shared library's file-backed mapping (``/proc/self/maps``).

    A trampoline into Python (a ``CFUNCTYPE`` of a Python function, an ``ffi.callback``) lives
    in anonymous executable memory that libffi maps; a C kernel lives in the library it was
    loaded from. The ranges are read once and again only for an address they do not hold
    (a library loaded since)."""

    def __init__(self):
        self._ranges: list[tuple[int, int]] | None = None

    @staticmethod
    def _read() -> list[tuple[int, int]]:
        ranges = []
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if not path.startswith("/") or path.endswith("(deleted)"):
                    continue  # anonymous, [heap], memfd: or a file gone: nothing to trust
                low, high = fields[0].split("-")
                ranges.append((int(low, 16), int(high, 16)))
        return ranges

    def holds(self, address: int) -> bool:
        if self._ranges is not None and self._within(address):
            return True
        try:  # not known yet, or a library loaded since the last read
            self._ranges = self._read()
        except OSError:  # no /proc: nothing can be told apart, so trust nothing
            return False
        return self._within(address)

    def _within(self, address: int) -> bool:
        return any(low <= address < high for low, high in self._ranges or ())


_code = LibraryCode()


def holds(address: int) -> bool:
    """Whether ``address`` lies in a loaded library's file-backed mapping (False where
    ``/proc/self/maps`` cannot be read: nothing is trusted then)."""
    return _code.holds(address)
