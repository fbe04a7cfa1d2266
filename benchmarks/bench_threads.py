#!/usr/bin/env python
"""Many threads calling one client: calls per second with 1, 2, 4 and 8 threads, next to jax.

Each thread runs ``tanh(x @ y)`` on float32 NxN inputs already on its device (``execute([a,
b])``), and, with reads, copies the result to the host (``np.asarray``). "one device": every
thread calls device 0; "several": thread i calls device i mod 2 (two CPU devices). jax runs the
same StableHLO (lowered by jax, compiled by each) on jaxlib's own CPU client, in the same
process; the two libraries' runs are interleaved, and each figure is the median of several
short runs (all threads start together; the run ends when the first thread has run its share of
time).

Usage::

    python benchmarks/bench_threads.py                      # the table (about 2-3 min on 2 cores)
    python benchmarks/bench_threads.py --quick              # fewer, shorter runs
    python benchmarks/bench_threads.py --sizes 8 --threads 1,2 --markdown
    # fixed work for counting system calls (perf stat -e syscalls:sys_enter_futex ...):
    python benchmarks/bench_threads.py --count pjrt --threads 2 --calls 20000 --size 8 --read
    # the calls alone (no imports, compiles or warm-up), with perf's control FIFOs:
    mkfifo ctl ack; perf stat --delay=-1 --control=fifo:ctl,ack -e task-clock,... \
        python benchmarks/bench_threads.py --count pjrt --threads 2 --perf-control ctl,ack

Ratios: "xN/x1" is a library's N-thread throughput over its own 1-thread throughput; "pjrt/jax"
is pjrt's over jax's with as many threads. "CPU µs/call" is the process's CPU time (every
thread's, the plugin's included) per call: what the calls cost, which a busy machine disturbs less
than it disturbs calls per second.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

DEVICES = 2


def program_text(size: int) -> str:
    """The StableHLO of tanh(x @ y) on float32 size x size, as jax lowers it."""
    import jax
    import jax.numpy as jnp

    spec = jax.ShapeDtypeStruct((size, size), np.float32)
    return jax.jit(lambda x, y: jnp.tanh(x @ y)).lower(spec, spec).as_text()


class Pjrt:
    name = "pjrt"

    def __init__(self):
        import pjrt
        import pjrt_cpu

        pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
        self.client = pjrt.make_c_api_client("cpu", {"cpu_device_count": DEVICES})
        self.devices = self.client.local_devices()[:DEVICES]
        self.executables = []

    def kept_gil(self) -> int:
        """Launches so far that kept the GIL (CallPlan.kept_gil, all executables)."""
        return sum(getattr(exe._launcher.plan, "kept_gil", 0) for exe in self.executables)

    def caller(self, size: int, device: int, read: bool):
        exe = self.client.compile_and_load(program_text(size), [self.devices[device]])
        self.executables.append(exe)
        host = np.random.default_rng(device).standard_normal((size, size), np.float32)
        a = self.client.buffer_from_pyval(host, self.devices[device])
        b = self.client.buffer_from_pyval(host, self.devices[device])
        execute = exe.execute
        if read:
            return lambda: np.asarray(execute([a, b])[0])
        return lambda: execute([a, b])

    def wait(self, value):
        if value is not None and not isinstance(value, np.ndarray):
            value[0].block_until_ready()


class Jax:
    name = "jax"

    def __init__(self):
        import jax

        jax.config.update("jax_num_cpu_devices", DEVICES)
        self.devices = jax.devices("cpu")[:DEVICES]

    def caller(self, size: int, device: int, read: bool):
        import jax
        import jax.numpy as jnp

        host = np.random.default_rng(device).standard_normal((size, size), np.float32)
        a = jax.device_put(host, self.devices[device])
        b = jax.device_put(host, self.devices[device])
        f = jax.jit(lambda x, y: jnp.tanh(x @ y))
        f(a, b).block_until_ready()
        if read:
            return lambda: np.asarray(f(a, b))
        return lambda: f(a, b)

    def wait(self, value):
        if value is not None and not isinstance(value, np.ndarray):
            value.block_until_ready()


def run_threads(lib, callers, seconds: float) -> tuple[float, float]:
    """Calls per second of all threads together, each calling its own `callers[i]`, and the
    process's CPU time per call in microseconds (the plugin's threads included)."""
    count = len(callers)
    done = [0] * count
    start = threading.Barrier(count + 1)
    stop = threading.Event()
    last = [None] * count

    def work(i):
        call = callers[i]
        start.wait()
        n = 0
        while not stop.is_set():
            for _ in range(16):
                last[i] = call()
            n += 16
        done[i] = n

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    start.wait()
    begun, cpu = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    for value in last:
        lib.wait(value)
    calls = max(sum(done), 1)
    return (calls / (time.perf_counter() - begun), (time.process_time() - cpu) / calls * 1e6)


def make_callers(lib, size, threads, several, read):
    made = {}
    callers = []
    for i in range(threads):
        device = i % DEVICES if several else 0
        if device not in made:
            made[device] = lib.caller(size, device, read)
        callers.append(made[device])
    for call in callers:  # warm-up (the first call of an executable is launched off-thread)
        for _ in range(20):
            call()
    return callers


def measure(libs, sizes, thread_counts, placements, reads, seconds, repeats):
    results = {}
    for size in sizes:
        for several in placements:
            for read in reads:
                for threads in thread_counts:
                    callers = {lib.name: make_callers(lib, size, threads, several, read)
                               for lib in libs}
                    runs = {lib.name: [] for lib in libs}
                    for _ in range(repeats):
                        for lib in libs:
                            runs[lib.name].append(run_threads(lib, callers[lib.name], seconds))
                    for lib in libs:
                        results[(lib.name, size, several, read, threads)] = (
                            statistics.median(r[0] for r in runs[lib.name]),
                            statistics.median(r[1] for r in runs[lib.name]))
                    line = "  ".join(f"{name} {statistics.median(x[0] for x in r):9.0f}"
                                     for name, r in runs.items())
                    print(f"# {size}x{size} {'several' if several else 'one'} device(s) "
                          f"{'read' if read else 'no read'} {threads} thread(s): {line}",
                          file=sys.stderr, flush=True)
    return results


def table(results, libs, sizes, thread_counts, placements, reads, markdown):
    names = [lib.name for lib in libs]
    header = ["program", "devices", "read", "threads"]
    for name in names:
        header += [f"{name} calls/s", f"{name} xN/x1", f"{name} CPU µs/call"]
    if "pjrt" in names and "jax" in names:
        header.append("pjrt/jax")
    rows = []
    for size in sizes:
        for several in placements:
            for read in reads:
                for threads in thread_counts:
                    row = [f"{size}x{size}", "2" if several else "1", "yes" if read else "no",
                           str(threads)]
                    for name in names:
                        value, cpu = results[(name, size, several, read, threads)]
                        base = results[(name, size, several, read, thread_counts[0])][0]
                        row += [f"{value:,.0f}", f"{value / base:.2f}", f"{cpu:.1f}"]
                    if "pjrt" in names and "jax" in names:
                        pjrt_rate = results[("pjrt", size, several, read, threads)][0]
                        jax_rate = results[("jax", size, several, read, threads)][0]
                        row.append(f"{pjrt_rate / jax_rate:.2f}")
                    rows.append(row)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("| " + " | ".join("---" for _ in header) + " |")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def count(lib_name, threads, calls, size, several, read, control=None):
    """Fixed work for a system-call count: `calls` calls in all, split over the threads.

    `control`: perf stat's control FIFOs ("CTL[,ACK]", as `perf stat --delay=-1
    --control=fifo:CTL,ACK` takes them); the calls are counted alone, between an "enable"
    and a "disable" sent there (the imports, compiles and warm-up are left out). Prints the
    calls' CPU time (every thread's) and wall time per call."""
    lib = Pjrt() if lib_name == "pjrt" else Jax()
    callers = make_callers(lib, size, threads, several, read) if calls else []
    share = calls // threads if threads else 0
    print("ready", file=sys.stderr, flush=True)
    ctl = ack = None
    if control:
        names = control.split(",")
        ctl = open(names[0], "w")
        ack = open(names[1]) if len(names) > 1 else None

    def tell(command):
        if ctl is not None:
            ctl.write(command + "\n")
            ctl.flush()
            if ack is not None:
                ack.readline()

    def work(call):
        value = None
        for _ in range(share):
            value = call()
        lib.wait(value)

    workers = [threading.Thread(target=work, args=(c,)) for c in callers]
    kept = lib.kept_gil() if isinstance(lib, Pjrt) else 0
    tell("enable")
    begun, cpu = time.perf_counter(), time.process_time()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - begun
    tell("disable")
    done = max(share * len(callers), 1)
    kept = f", {(lib.kept_gil() - kept) / done:.3f} kept the GIL" if isinstance(lib, Pjrt) else ""
    print(f"{lib_name} {threads} thread(s): {cpu / done * 1e6:.2f} µs CPU, "
          f"{wall / done * 1e6:.2f} µs wall per call{kept}", file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--threads", default="1,2,4,8")
    parser.add_argument("--devices", default="one,several", help="one, several, or both")
    parser.add_argument("--reads", default="no,yes")
    parser.add_argument("--seconds", type=float, default=0.5, help="one run's length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--without", default="", help="leave jax or pjrt out")
    parser.add_argument("--count", choices=("pjrt", "jax"))
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--several", action="store_true")
    parser.add_argument("--read", action="store_true")
    parser.add_argument("--release-gil", action="store_true",
                        help="every pjrt launch lets the GIL go (as once a program may call "
                             "Python), for comparison with brief launches keeping it")
    parser.add_argument("--perf-control", metavar="CTL[,ACK]",
                        help="with --count: perf stat's control FIFOs, enabled around the calls")
    args = parser.parse_args()
    if args.release_gil:
        from pjrt._capi.native_runtime import programs_may_call_python

        programs_may_call_python()
    if args.count:
        count(args.count, int(args.threads), args.calls, args.size, args.several, args.read,
              args.perf_control)
        return
    if args.quick:
        args.seconds, args.repeats = 0.2, 3
    sizes = [int(s) for s in args.sizes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    placements = [p == "several" for p in args.devices.split(",")]
    reads = [r == "yes" for r in args.reads.split(",")]
    left_out = set(args.without.split(","))
    libs = [cls() for cls in (Pjrt, Jax) if cls.name not in left_out]
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"# {os.cpu_count()} CPUs, load average {load:.1f} at the start", flush=True)
    results = measure(libs, sizes, thread_counts, placements, reads, args.seconds,
                      args.repeats)
    table(results, libs, sizes, thread_counts, placements, reads, args.markdown)


if __name__ == "__main__":
    main()
