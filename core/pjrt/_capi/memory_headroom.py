"""A launch that cannot fit under the process's address-space limit is refused before the plugin
runs it.

Under ``RLIMIT_AS`` a CPU plugin can end the process instead of failing cleanly: XLA's 0.81 CPU
build, running a 4096 x 4096 ``float32`` product with less than about 128 MiB of address
space left, allocates the 64 MiB output and then dies with SIGSEGV in its kernel, which needs a
fresh per-thread malloc arena (glibc reserves 64 MiB of address space for one) and does not
check that it got it. Nothing pjrt allocates fails first, and the plugin never calls back, so
the only host-side cure is not to start such a launch: `check_launch` compares what is left
under the limit with what the launch needs, and raises `MemoryError` when it does not fit.

What a launch needs, per device it runs on: its outputs and temporaries as the compiled
memory statistics give them (``PJRT_Executable_GetCompiledMemoryStats``; the outputs' sizes
from the executable's shapes where a plugin lacks them), counting device memory only on a CPU
plugin (where device memory is the process's). The workspace a kernel allocates inside the run
is in no statistics (a product's temporaries are reported as 0), so as much again is kept in
reserve, up to `ARENA_RESERVE_BYTES` (the address space one new glibc arena takes): small
launches, which need no fresh arena, are not refused for want of 64 MiB. This is a bound
measured on XLA's CPU plugins, not a guarantee for every kernel.

Cost: none while no limit is set beyond reading one module flag, `limited`, at the call site.
The limit is read when this module is imported and again whenever Python's
``resource.setrlimit`` or ``resource.prlimit`` is called (they are wrapped here to say so); a
limit set some other way (through ctypes, or by another process's ``prlimit``) is seen after
the next of those calls or `refresh`.
"""
from __future__ import annotations

import functools
import os
import weakref

try:
    import resource
except ImportError:  # not a Unix system: no RLIMIT_AS to respect
    resource = None  # type: ignore[assignment]

#: The most address space kept free beyond a launch's outputs and temporaries: one glibc
#: malloc arena (64 MiB on 64-bit systems), which a plugin thread's first allocation reserves.
#: On the 0.81 CPU build a 64 MiB product ran with 128 MiB left and crashed with 124 MiB.
ARENA_RESERVE_BYTES = 64 << 20

#: Whether an address-space limit is set (kept current by `refresh`).
limited = False
_limit = 0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: Bytes each executable needs per device, worked out on its first launch under a limit.
_needs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def refresh() -> None:
    """Read the address-space limit again."""
    global limited, _limit
    if resource is None:
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limited = soft != resource.RLIM_INFINITY
    _limit = soft if limited else 0


def address_space_used() -> int:
    """This process's virtual memory size in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[0]) * _PAGE


def headroom() -> int | None:
    """Bytes of address space left under the limit; None when no limit is set (or the
    process's size cannot be read)."""
    if not limited:
        return None
    try:
        return _limit - address_space_used()
    except (OSError, ValueError, IndexError):
        return None


def launch_need(executable, num_devices: int) -> int:
    """Bytes of address space a launch of ``executable`` on ``num_devices`` devices needs
    beyond what exists already (outputs and temporaries; without the arena reserve)."""
    try:
        per_device = _needs[executable]
    except (KeyError, TypeError):
        per_device = _per_device_need(executable)
        try:
            _needs[executable] = per_device
        except TypeError:  # not weakly referable: worked out each time
            pass
    return per_device * max(num_devices, 1)


def _per_device_need(executable) -> int:
    on_cpu = executable.client.platform == "cpu"
    try:
        stats = executable.get_compiled_memory_stats()
    except Exception:  # noqa: BLE001 - a plugin without statistics: the outputs' sizes
        stats = None
    if stats is not None:
        need = stats.host_output_size_in_bytes + stats.host_temp_size_in_bytes
        if on_cpu:
            need += stats.output_size_in_bytes + stats.temp_size_in_bytes
        if need or not on_cpu:
            return need
    if not on_cpu:
        return 0
    try:
        import numpy as np

        shapes, types = executable.output_shapes, executable.output_dtypes
        if shapes is None or types is None:
            return 0
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(kind).itemsize
                   for shape, kind in zip(shapes, types))
    except Exception:  # noqa: BLE001 - unknown sizes: nothing to compare
        return 0


def check_launch(executable, num_devices: int) -> None:
    """Raise MemoryError if a launch of ``executable`` on ``num_devices`` devices cannot fit
    in the address space left under the limit. Called only while `limited`."""
    left = headroom()
    if left is None:
        return
    need = launch_need(executable, num_devices)
    reserve = min(need, ARENA_RESERVE_BYTES)
    if need + reserve <= left:
        return
    raise MemoryError(
        f"not enough address space left to run {_name(executable)}: it needs about "
        f"{_size(need)} for its outputs and temporaries on {num_devices} device(s), plus "
        f"{_size(reserve)} kept for the plugin's own work inside the run, and "
        f"{_size(max(left, 0))} is left under this process's address-space limit "
        f"(RLIMIT_AS, {_size(_limit)}). The plugin was not called: it can end the process "
        f"when an allocation inside the run fails. Raise the limit or free memory first")


def _name(executable) -> str:
    try:
        return f"program {executable.name()!r}"
    except Exception:  # noqa: BLE001 - only for the message
        return "the program"


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.0f} MiB"
    return f"{nbytes / 1024:.0f} KiB"


def _wrap(setter):
    @functools.wraps(setter)
    def set_and_refresh(*args, **kwargs):
        try:
            return setter(*args, **kwargs)
        finally:
            refresh()

    set_and_refresh.__pjrt_refreshes__ = True  # pyright: ignore[reportFunctionMemberAccess]
    return set_and_refresh


def _watch_the_setters() -> None:
    for name in ("setrlimit", "prlimit"):
        setter = getattr(resource, name, None)
        if setter is not None and not getattr(setter, "__pjrt_refreshes__", False):
            setattr(resource, name, _wrap(setter))


if resource is not None:
    refresh()
    _watch_the_setters()
