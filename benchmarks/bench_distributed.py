"""XLA's coordination service and client: pjrt's (``pjrt.xla_client``) next to jaxlib's C++
ones (``jaxlib._jax``), on this machine, each job all pjrt or all jaxlib.

Rows: the latency of one key-value set, blocking get (of a key already set) and try-get, from
process 0 of a 2-process job; the time of one barrier across 2, 8, 32 and 64 processes
(the mean of ``--barriers`` barriers after one warm-up); the time for 64 processes, already
started and imported, to join (process 0's ``connect()``, which returns once every process
has registered). Every process is a fresh interpreter on 127.0.0.1; process 0 also runs the
service. Under each row, its CPU time: process 0's per call (its client and the service) for
the key-value rows, the sum over the job's processes per barrier for a barrier row (each
process measures its own and writes it to the store), split into process 0's (the service
and a client) and the mean of the others' (a client each); on a loaded machine these move
less than the times. The ratio column is pjrt / jaxlib (the goal: at most 1.5; the CPU's
split is not counted in it).

    python benchmarks/bench_distributed.py                 # ~1-2 min on 2 cores
    python benchmarks/bench_distributed.py --sizes 2,8 --ops 300 --barriers 20   # quick
    python benchmarks/bench_distributed.py --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

GOAL = 1.5


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- one process of a job --------------------------------------------------------------------

def worker(impl: str, n: int, rank: int, port: int, ops: int, barriers: int) -> None:
    if impl == "jaxlib":
        from jaxlib import _jax as runtime  # pyright: ignore[reportMissingImports]
    else:
        from pjrt import xla_client as runtime
        if impl == "pjrt-public":  # the client on grpcio's public API (its fallback)
            from pjrt._distributed import coordination_channel
            coordination_channel.core_layer = lambda: None
    address = f"127.0.0.1:{port}"
    service = None
    if rank == 0:
        service = runtime.get_distributed_runtime_service(address, n, heartbeat_timeout=100)
    client = runtime.get_distributed_runtime_client(address, rank, init_timeout=300,
                                                    heartbeat_timeout=100)
    print("ready", flush=True)
    sys.stdin.readline()  # the start line: every process imported and waiting
    start = time.perf_counter()
    client.connect()
    joined = time.perf_counter() - start
    result: dict = {"join_s": joined}
    client.wait_at_barrier("warm-up", 600_000)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(barriers):
        client.wait_at_barrier(f"b{i}", 600_000)
    result["barrier_s"] = (time.perf_counter() - start) / max(1, barriers)
    # This process's CPU time per barrier (its client, and for process 0 the service too);
    # process 0 adds up the job's.
    client.key_value_set(f"cpu/{rank}", repr((time.process_time() - cpu) / max(1, barriers)))
    if rank == 0 and ops:
        value = b"x" * 64
        client.key_value_set_bytes("bench/key", value, allow_overwrite=True)
        for name, call in (
                ("set_s", lambda: client.key_value_set_bytes("bench/key", value, True)),
                ("get_s", lambda: client.blocking_key_value_get_bytes("bench/key", 10_000)),
                ("try_get_s", lambda: client.key_value_try_get_bytes("bench/key"))):
            for _ in range(min(ops, 50)):
                call()
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(ops):
                call()
            result[name] = (time.perf_counter() - start) / ops
            result[name + "_cpu"] = (time.process_time() - cpu) / ops
    client.wait_at_barrier("done", 600_000)
    if rank == 0:
        cpus = {key.rsplit("/", 1)[-1]: float(v) for key, v in client.key_value_dir_get("cpu")}
        result["barrier_cpu_s"] = sum(cpus.values())
        # Process 0 runs the service and a client, every other process only a client: the
        # two differ by far (the sum's ratio moves towards the clients' as the job grows).
        result["barrier_cpu0_s"] = cpus.get("0", 0.0)
        others = [v for key, v in cpus.items() if key != "0"]
        result["barrier_cpu_other_s"] = sum(others) / len(others) if others else None
    client.shutdown()
    if service is not None:
        service.shutdown()
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def run_job(impl: str, n: int, ops: int, barriers: int) -> dict:
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    processes = [subprocess.Popen(
        [sys.executable, __file__, "--worker", impl, str(n), str(rank), str(port), str(ops),
         str(barriers)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=env) for rank in range(n)]
    try:
        for process in processes:
            line = process.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"{impl} worker did not start ({line!r})")
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        out = processes[0].communicate(timeout=600)[0]
        for process in processes[1:]:
            process.wait(timeout=120)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"{impl} job of {n} gave no result")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,8,32,64")
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--barriers", type=int, default=50)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--public", action="store_true",
                        help="add a column: pjrt's client on grpcio's public API (the fallback "
                             "where grpcio's Cython layer is not the one it drives)")
    parser.add_argument("--worker", nargs=6, metavar="ARG")
    args = parser.parse_args()
    if args.worker:
        impl, n, rank, port, ops, barriers = args.worker
        worker(impl, int(n), int(rank), int(port), int(ops), int(barriers))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    impls = ["jaxlib", "pjrt"] + (["pjrt-public"] if args.public else [])
    try:
        import jaxlib  # noqa: F401  pyright: ignore[reportMissingImports]
    except ImportError:
        print("# SKIPPED jaxlib: not installed")
        impls = impls[1:]
    rows: list[tuple[str, dict[str, float]]] = []
    results: dict[tuple[str, int], dict] = {}
    for n in sizes:
        for impl in impls:
            results[impl, n] = run_job(impl, n, args.ops if n == sizes[0] else 0,
                                       args.barriers)
    first = sizes[0]
    for key, label in (("set_s", "key_value_set"), ("get_s", "blocking_key_value_get"),
                       ("try_get_s", "key_value_try_get")) if args.ops else ():
        rows.append((f"{label} (job of {first})",
                     {impl: results[impl, first][key] for impl in impls}))
        rows.append(("  CPU, process 0", {impl: results[impl, first][key + "_cpu"]
                                           for impl in impls}))
    for n in sizes:
        rows.append((f"barrier, {n} processes", {impl: results[impl, n]["barrier_s"]
                                                 for impl in impls}))
        rows.append((f"  CPU, all {n} processes", {impl: results[impl, n]["barrier_cpu_s"]
                                                   for impl in impls}))
        rows.append(("    process 0 (service, client)", {
            impl: results[impl, n].get("barrier_cpu0_s") for impl in impls}))
        if n > 1:
            rows.append(("    each other process (client)", {
                impl: results[impl, n].get("barrier_cpu_other_s") for impl in impls}))
    last = sizes[-1]
    rows.append((f"join, {last} processes", {impl: results[impl, last]["join_s"]
                                             for impl in impls}))
    worst = 0.0
    public = args.public
    if args.markdown:
        print("| | jaxlib (C++) | pjrt | pjrt / jaxlib |" + (" pjrt, public API | ratio |\n"
              if public else "\n") + "| --- | ---: | ---: | ---: |" + (" ---: | ---: |"
                                                                         if public else ""))
    else:
        print(f"{'':34} {'jaxlib (C++)':>14} {'pjrt':>12} {'ratio':>8}"
              + (f" {'pjrt, public API':>17} {'ratio':>8}" if public else ""))

    def fmt(seconds):
        return "-" if seconds is None else (f"{seconds * 1e6:.0f} us" if seconds < 0.01
                                            else f"{seconds * 1e3:.1f} ms")
    for label, cells in rows:
        j, p, q = cells.get("jaxlib"), cells["pjrt"], cells.get("pjrt-public")
        ratio = p / j if j and p else float("nan")
        other = q / j if j and q else float("nan")
        if j and not label.startswith("    "):  # the CPU's split is not a row of the goal
            worst = max(worst, ratio)
        if args.markdown:
            print(f"| {label} | {fmt(j)} | {fmt(p)} | {ratio:.2f} |"
                  + (f" {fmt(q)} | {other:.2f} |" if public else ""))
        else:
            print(f"{label:34} {fmt(j):>14} {fmt(p):>12} {ratio:>8.2f}"
                  + (f" {fmt(q):>17} {other:>8.2f}" if public else ""))
    print(f"# worst ratio {worst:.2f} (goal <= {GOAL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
