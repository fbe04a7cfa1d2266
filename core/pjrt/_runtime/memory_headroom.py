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

Creating a client and compiling need address space too, and fail worse: XLA's CPU plugin
starts two pools of threads when a client is created and a pool of code-generation threads at
its first compile, and a thread it cannot create, or a ``std::bad_alloc`` inside, ends the
process (``Check failed: ... pthread_create() failed``, ``terminate called``). `check_client`
and `check_compile` raise `MemoryError` first when what is left cannot hold what those steps
were measured to take (each thread: its 8 MiB stack and a 64 MiB malloc arena).

Cost: a launch needing less than `CHECKED_FROM_BYTES` per device is never checked (the
executable decides once, at its first launch, and small ones keep the per-call fast path);
a bigger one reads the limit (one ``getrlimit`` call) at every launch, and the process's size
only when a limit is set, so a limit set at any time, by any means, is seen at the next launch.
"""
from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not a Unix system: no RLIMIT_AS to respect
    resource = None  # type: ignore[assignment]

#: The most address space kept free beyond a launch's outputs and temporaries: one glibc
#: malloc arena (64 MiB on 64-bit systems), which a plugin thread's first allocation reserves.
#: On the 0.81 CPU build a 64 MiB product ran with 128 MiB left and crashed with 124 MiB.
ARENA_RESERVE_BYTES = 64 << 20

#: Launches needing less than this per device are not checked: none was seen to end the
#: process, and they are the calls made in loops, where a system call each would show.
CHECKED_FROM_BYTES = 1 << 20

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def address_space_limit() -> int | None:
    """The soft address-space limit in bytes (``RLIMIT_AS``), or None when none is set."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def address_space_used() -> int:
    """This process's virtual memory size in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[0]) * _PAGE


def headroom() -> int | None:
    """Bytes of address space left under the limit; None when no limit is set (or the
    process's size cannot be read)."""
    limit = address_space_limit()
    if limit is None:
        return None
    try:
        return limit - address_space_used()
    except (OSError, ValueError, IndexError):
        return None


#: The stack of each thread of XLA's pools.
PLUGIN_THREAD_STACK_BYTES = 8 << 20

#: What a client takes beyond its pools' threads: pjrt's first worker thread (its stack) and
#: the plugin's own state.
CLIENT_BASE_BYTES = 96 << 20

#: What the plugin's first compile takes beyond its code-generation threads (LLVM's state),
#: and what any later compile keeps in reserve.
FIRST_COMPILE_BYTES = 96 << 20
LATER_COMPILE_BYTES = 32 << 20


def threads_need(new_threads: int) -> int:
    """Address space that ``new_threads`` more threads of a plugin take: each its stack, and
    each a malloc arena while glibc's cap (8 per core) is not reached; threads beyond the cap
    share the arenas there are."""
    cores = os.cpu_count() or 1
    arenas_left = max(0, 8 * cores - max(_threads_running() - 1, 0))  # (the main thread's
    # allocations use the main arena)
    return (new_threads * PLUGIN_THREAD_STACK_BYTES
            + min(new_threads, arenas_left) * ARENA_RESERVE_BYTES)


def client_need(device_count: int | None) -> int:
    """Address space that creating a client with ``device_count`` devices is expected to take:
    XLA's CPU client starts two pools of ``max(cores, devices)`` threads (measured: 8 devices
    on 2 cores took 1153 MiB, 32 devices 1541 MiB)."""
    return CLIENT_BASE_BYTES + threads_need(client_threads(device_count))


def client_threads(device_count: int | None) -> int:
    """The threads XLA's CPU client starts: two pools of ``max(cores, devices)``."""
    return 2 * max(os.cpu_count() or 1, device_count or 1)


def compile_need(first: bool) -> int:
    """Address space a compile is expected to take: the first one starts the plugin's
    code-generation threads (one more than the cores) and LLVM."""
    if not first:
        return LATER_COMPILE_BYTES
    return FIRST_COMPILE_BYTES + threads_need((os.cpu_count() or 1) + 1)


def _threads_running() -> int:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 1


def check_client(plugin_name: str, device_count: int | None) -> None:
    """Raise MemoryError if a client of ``plugin_name`` cannot be created in the address space
    left under the limit (see `client_need`)."""
    if address_space_limit() is not None:  # (the need is only worked out under a limit)
        _check_step(f"create a client of plugin {plugin_name!r}", client_need(device_count))


#: Clients of up to this many threads are not checked against the system's thread limits.
THREADS_CHECKED_FROM = 256


def check_threads(plugin_name: str, device_count: int | None) -> None:
    """Raise ValueError if a client with ``device_count`` devices needs more threads than this
    process may start: each takes two memory mappings (its stack and guard page) under
    ``vm.max_map_count``, and counts against ``RLIMIT_NPROC``. (XLA's CPU plugin aborts when a
    thread cannot be started; 65536 devices need 131072 threads.)"""
    threads = client_threads(device_count)
    if threads < THREADS_CHECKED_FROM:
        return
    running = _threads_running()
    allowed = []
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as limit, \
                open("/proc/self/maps", "rb") as maps:
            allowed.append(((int(limit.read()) - sum(1 for _ in maps)) // 2 - 64,
                            "vm.max_map_count"))
    except (OSError, ValueError):
        pass
    if resource is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY:
            allowed.append((soft - running - 64, "RLIMIT_NPROC (ulimit -u)"))
    for room, what in allowed:
        if threads > room:
            raise ValueError(
                f"a client of plugin {plugin_name!r} with {device_count} devices starts "
                f"{threads} threads, and this process can start about {max(room, 0)} more "
                f"under {what}: ask for fewer devices (cpu_device_count)")


#: The plugins (`id` of their `Api`, which lives as long as the process) that have compiled.
_compiled: set[int] = set()


def check_compile(api) -> None:
    """Raise MemoryError if a compile by the plugin of ``api`` cannot run in the address space
    left under the limit (its first compile takes the most)."""
    if address_space_limit() is not None:
        _check_step("compile the program", compile_need(first=id(api) not in _compiled))


def note_compiled(api) -> None:
    """Record that the plugin of ``api`` has compiled (its later compiles take less)."""
    _compiled.add(id(api))


def _check_step(what: str, need: int) -> None:
    left = headroom()
    if left is None or need <= left:
        return
    limit = address_space_limit() or 0
    raise MemoryError(
        f"not enough address space left to {what}: it takes about {_size(need)} (the plugin's "
        f"threads, their stacks and malloc arenas), and {_size(max(left, 0))} is left under "
        f"this process's address-space limit (RLIMIT_AS, {_size(limit)}). The plugin was not "
        f"called: it ends the process when it cannot start a thread. Raise the limit "
        f"(ulimit -v) or free memory first")


def launch_need(executable) -> int:
    """Bytes of address space one launch of ``executable`` needs per device beyond what
    exists already (outputs and temporaries; without the arena reserve)."""
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


def check_launch(executable, need_per_device: int, num_devices: int) -> None:
    """Raise MemoryError if a launch of ``executable`` on ``num_devices`` devices, needing
    ``need_per_device`` bytes on each, cannot fit in the address space left under the limit."""
    left = headroom()
    if left is None:
        return
    need = need_per_device * max(num_devices, 1)
    reserve = min(need, ARENA_RESERVE_BYTES)
    if need + reserve <= left:
        return
    limit = address_space_limit() or 0
    raise MemoryError(
        f"not enough address space left to run {_name(executable)}: it needs about "
        f"{_size(need)} for its outputs and temporaries on {num_devices} device(s), plus "
        f"{_size(reserve)} kept for the plugin's own work inside the run, and "
        f"{_size(max(left, 0))} is left under this process's address-space limit "
        f"(RLIMIT_AS, {_size(limit)}). The plugin was not called: it can end the process "
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
