#!/usr/bin/env python
"""Real-model calls: pjrt next to jax 0.10.2 driving the same XLA CPU plugin library.

One run measures, on the same machine:

  (a) per-call time of six models, each called and waited on, with its inputs either as
      numpy arrays (the library places them for the call) or already on the devices:
        * ``mlp``: an MLP forward pass, 784-512-512-10 on a batch of 128 (7 arguments);
        * ``transformer``: a 2-layer pre-norm transformer encoder forward pass, width 256,
          4 heads, sequence 128, batch 4 (27 arguments);
        * ``data-parallel``: an SGD training step of an MLP on 8 devices, the batch split
          over them and the parameters replicated (8 arguments);
        * ``many-args``: a residual MLP with 247 blocks of 64x64 (742 arguments);
        * ``adam``: a training step of the MLP above with Adam, the parameters and both
          moments passed in and returned (21 arguments);
        * ``residual-50``: a residual MLP with 50 blocks of 256x256 on a batch of 128
          (101 arguments, each weight 256 KiB);
  (b) import + compile + first call of the transformer in fresh processes, with an empty
      persistent compilation cache (cold) and with one that holds it (warm).

jax loads the very plugin library pjrt does (``pjrt_cpu.library_path()``, XLA's CPU plugin)
through ``jax._src.xla_bridge.register_plugin`` with 8 devices, so both drive the same runtime;
the programs are what jax lowers, and pjrt compiles that StableHLO text. jax is needed: it
writes the programs and is the reference.

Usage::

    python benchmarks/bench_models.py              # full run (about 4 minutes on 2 cores)
    python benchmarks/bench_models.py --quick      # fewer, shorter repeats
    python benchmarks/bench_models.py --only a     # one section (a or b)
    python benchmarks/bench_models.py --markdown   # the table as Markdown (for the README)

Per-call cells are medians of interleaved loops (`wall_and_cpu_medians`: wall time, and the
process's CPU time beside it); start-up cells are medians of fresh processes.
"""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time

# The plugin is registered with jax before its backends start (see load_jax).
os.environ["JAX_PLATFORMS"] = "pjrtcpu"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_core import QUICK, Settings, calibrate, cpu_model, format_ratio  # noqa: E402

NUM_DEVICES = 8
MODELS = ("mlp", "transformer", "data-parallel", "many-args", "adam", "residual-50")
#: Goals for pjrt/jax: numpy inputs, device-resident inputs (of the CPU time, which the other
#: work on a shared machine sways less than wall time), warm/cold start.
GOAL_NUMPY, GOAL_DEVICE, GOAL_WARM = 1.0, 1.0, 0.35


# --------------------------------------------------------------------------------------------
# the models, written with jax


def _dense(rng, n_in: int, n_out: int) -> tuple:
    return ((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
            np.zeros(n_out, np.float32))


def _mlp_apply(jnp, params, x):
    for w, b in params[:-1]:
        x = jnp.maximum(x @ w + b, 0)
    w, b = params[-1]
    return x @ w + b


def build_mlp(jax, jnp, rng):
    params = [_dense(rng, a, b) for a, b in ((784, 512), (512, 512), (512, 10))]
    x = rng.standard_normal((128, 784)).astype(np.float32)
    return (lambda params, x: _mlp_apply(jnp, params, x)), (params, x), None


def build_transformer(jax, jnp, rng, layers: int = 2, width: int = 256, heads: int = 4,
                      seq: int = 128, batch: int = 4):
    def layer_params():
        return {"ln1": np.ones(width, np.float32), "qkv": _dense(rng, width, 3 * width),
                "out": _dense(rng, width, width), "ln2": np.ones(width, np.float32),
                "up": _dense(rng, width, 4 * width), "down": _dense(rng, 4 * width, width)}

    params = [layer_params() for _ in range(layers)]
    x = rng.standard_normal((batch, seq, width)).astype(np.float32)

    def norm(x, scale):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-6) * scale

    def apply(params, x):
        for p in params:
            h = norm(x, p["ln1"])
            qkv = h @ p["qkv"][0] + p["qkv"][1]
            q, k, v = jnp.split(qkv.reshape(batch, seq, 3 * heads, width // heads), 3, axis=2)
            att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(width // heads))
            mixed = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(batch, seq, width)
            x = x + mixed @ p["out"][0] + p["out"][1]
            h = norm(x, p["ln2"])
            x = x + jax.nn.gelu(h @ p["up"][0] + p["up"][1]) @ p["down"][0] + p["down"][1]
        return x

    return apply, (params, x), None


def build_data_parallel(jax, jnp, rng):
    params = [_dense(rng, a, b) for a, b in ((256, 512), (512, 512), (512, 10))]
    x = rng.standard_normal((256, 256)).astype(np.float32)
    y = rng.integers(0, 10, 256).astype(np.int32)

    def loss(params, x, y):
        logits = jax.nn.log_softmax(_mlp_apply(jnp, params, x))
        return -jnp.mean(jnp.take_along_axis(logits, y[:, None], axis=1))

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

    return step, (params, x, y), "data-parallel"


def build_many_args(jax, jnp, rng, blocks: int = 247, width: int = 64):
    params = [(*_dense(rng, width, width), np.ones(width, np.float32)) for _ in range(blocks)]
    x = rng.standard_normal((32, width)).astype(np.float32)

    def apply(params, x):
        for w, b, g in params:
            x = x + jnp.tanh(x @ w + b) * g
        return x

    return apply, (params, x), None


def build_adam(jax, jnp, rng):
    params = [_dense(rng, a, b) for a, b in ((784, 512), (512, 512), (512, 10))]
    m = [(np.zeros_like(w), np.zeros_like(b)) for w, b in params]
    v = [(np.zeros_like(w), np.zeros_like(b)) for w, b in params]
    x = rng.standard_normal((128, 784)).astype(np.float32)
    y = rng.integers(0, 10, 128).astype(np.int32)

    def loss(params, x, y):
        logits = jax.nn.log_softmax(_mlp_apply(jnp, params, x))
        return -jnp.mean(jnp.take_along_axis(logits, y[:, None], axis=1))

    def step(params, m, v, t, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        t = t + 1
        b1, b2, eps, rate = 0.9, 0.999, 1e-8, 1e-3
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        m_scale, v_scale = 1 / (1 - b1 ** t), 1 / (1 - b2 ** t)
        params = jax.tree.map(
            lambda p, m, v: p - rate * (m * m_scale) / (jnp.sqrt(v * v_scale) + eps),
            params, m, v)
        return params, m, v, t, value

    return step, (params, m, v, np.zeros((), np.float32), x, y), None


def build_residual_50(jax, jnp, rng, blocks: int = 50, width: int = 256):
    params = [_dense(rng, width, width) for _ in range(blocks)]
    x = rng.standard_normal((128, width)).astype(np.float32)

    def apply(params, x):
        for w, b in params:
            x = x + jax.nn.relu(x @ w + b)
        return x

    return apply, (params, x), None


BUILDERS = {"mlp": build_mlp, "transformer": build_transformer,
            "data-parallel": build_data_parallel, "many-args": build_many_args,
            "adam": build_adam, "residual-50": build_residual_50}


# --------------------------------------------------------------------------------------------
# the two libraries


def placed_at(value: np.ndarray, remainder: int) -> np.ndarray:
    """A copy of ``value`` whose data starts ``remainder`` bytes past a 64-byte boundary."""
    raw = np.empty(value.nbytes + 128, np.uint8)
    offset = (remainder - raw.ctypes.data) % 64
    copy = raw[offset:offset + value.nbytes].view(value.dtype).reshape(value.shape)
    copy[...] = value
    return copy


@functools.cache
def load_jax(plugin_path: str):
    """jax with the plugin registered (once per process: jax refuses a second registration)."""
    from jax._src import xla_bridge

    xla_bridge.register_plugin("pjrtcpu", library_path=plugin_path,
                               options={"cpu_device_count": NUM_DEVICES})
    import jax
    import jax.numpy as jnp

    return jax, jnp


class Case:
    """One model, jitted by jax and compiled by pjrt from the StableHLO jax lowers."""

    def __init__(self, name: str, jax, jnp, pjrt, client):
        rng = np.random.default_rng(0)
        function, args, kind = BUILDERS[name](jax, jnp, rng)
        leaves, tree = jax.tree.flatten(args)
        # numpy's own allocations start 16 bytes past a 64-byte boundary, or on one, by chance.
        # jax aliases host memory on a boundary instead of copying it, pjrt always copies:
        # the inputs are placed both ways, so that each row says which case it measures.
        leaves = [placed_at(v, 16) for v in leaves]
        self.leaves = leaves
        self.aligned = [placed_at(v, 0) for v in leaves]
        flat = lambda *values: function(*jax.tree.unflatten(tree, values))  # noqa: E731
        jax_devices = jax.devices()
        if kind == "data-parallel":
            mesh = jax.sharding.Mesh(np.array(jax_devices), ("batch",))
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
            shardings = [replicated] * (len(leaves) - 2) + [split, split]
            self.jitted = jax.jit(flat, in_shardings=shardings)
            self.jax_placed = [jax.device_put(v, s) for v, s in zip(leaves, shardings)]
            target = pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES]), ("batch",))
        else:
            self.jitted = jax.jit(flat)
            self.jax_placed = [jax.device_put(v, jax_devices[0]) for v in leaves]
            target = client.devices()[0]
        text = self.jitted.lower(*leaves).as_text()
        self.compiled = pjrt.compile(text, target)
        self.pjrt_placed = [pjrt.device_put(v, s)
                            for v, s in zip(leaves, self.compiled.input_shardings)]
        self.jax = jax
        self.pjrt = pjrt
        self._check()

    def _check(self) -> None:
        expected = self.jax.tree.leaves(self.jitted(*self.leaves))
        got = self.compiled(*self.leaves)
        got = list(got) if isinstance(got, tuple) else [got]
        for e, g in zip(expected, got):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-4, atol=2e-5)
        aligned = self.compiled(*self.aligned)
        got = list(aligned) if isinstance(aligned, tuple) else [aligned]
        for e, g in zip(expected, got):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-4, atol=2e-5)

    def runs(self) -> dict:
        jax, pjrt, jitted, compiled = self.jax, self.pjrt, self.jitted, self.compiled
        perf = time.perf_counter_ns

        def jax_run(args):
            def run(n: int) -> int:
                start = perf()
                for _ in range(n):
                    jax.block_until_ready(jitted(*args))
                return perf() - start
            return run

        def pjrt_run(args):
            def run(n: int) -> int:
                start = perf()
                for _ in range(n):
                    out = compiled(*args)
                    pjrt.block_until_ready(list(out) if isinstance(out, tuple) else [out])
                    # Freed before the next call, as jax's loop frees its result: outputs
                    # kept across the next call cost either library up to 15 % more
                    # (the Adam step's 8 MB of outputs; see benchmarks/README.md).
                    del out
                return perf() - start
            return run

        return {"jax numpy": jax_run(self.leaves), "pjrt numpy": pjrt_run(self.leaves),
                "jax aligned": jax_run(self.aligned), "pjrt aligned": pjrt_run(self.aligned),
                "jax device": jax_run(self.jax_placed), "pjrt device": pjrt_run(self.pjrt_placed)}


def wall_and_cpu_medians(runs: dict, settings: Settings) -> tuple[dict, dict]:
    """Per call, the median seconds of wall time and of the process's CPU time (every
    thread's) of each ``run(n)``, its timed loops interleaved with the others' as in
    ``bench_core.per_call_medians``. The CPU time is what other work on a shared machine
    sways least: it counts the cycles the call cost, not the ones it waited for a core."""
    sizes = {name: calibrate(run, settings.target_s) for name, run in runs.items()}
    wall: dict = {name: [] for name in runs}
    cpu: dict = {name: [] for name in runs}
    for _ in range(settings.repeats):
        for name, run in runs.items():
            n = sizes[name]
            started = time.process_time_ns()
            wall[name].append(run(n) / 1e9 / n)
            cpu[name].append((time.process_time_ns() - started) / 1e9 / n)
    import statistics

    return ({name: statistics.median(v) for name, v in wall.items()},
            {name: statistics.median(v) for name, v in cpu.items()})


def bench_calls(plugin_path: str, settings: Settings, models) -> list[list[str]]:
    jax, jnp = load_jax(plugin_path)
    import pjrt

    pjrt.load_pjrt_plugin_dynamically("bench_cpu", plugin_path)
    client = pjrt.make_c_api_client("bench_cpu", {"cpu_device_count": NUM_DEVICES})
    rows = []
    for name in models:
        case = Case(name, jax, jnp, pjrt, client)
        medians, cpu = wall_and_cpu_medians(case.runs(), settings)
        for inputs, label, goal in (
                ("numpy", "numpy inputs", GOAL_NUMPY),
                ("aligned", "numpy inputs on 64-byte boundaries (jax aliases them)", None),
                ("device", "device inputs", GOAL_DEVICE)):
            j, p = medians[f"jax {inputs}"] * 1e6, medians[f"pjrt {inputs}"] * 1e6
            ratio = p / j
            cpu_ratio = cpu[f"pjrt {inputs}"] / cpu[f"jax {inputs}"]
            rows.append([f"{name} ({len(case.leaves)} args), {label}", f"{j:.0f}", f"{p:.0f}",
                         format_ratio(ratio), format_ratio(cpu_ratio),
                         "-" if goal is None else f"<= {goal}",
                         "-" if goal is None else "met" if round(cpu_ratio, 2) <= goal
                         else "NOT met"])
        del case
    client.close()
    return rows


# --------------------------------------------------------------------------------------------
# (b) a fresh process with a cold and a warm compilation cache

_START = """\
import time
started = time.perf_counter()
import numpy as np
import pjrt
program = open({program!r}).read()
compiled = pjrt.compile(program, pjrt.devices()[0])
inputs = np.load({inputs!r})
out = compiled(*[inputs[f"a{{i}}"] for i in range(len(inputs.files))])
np.asarray(out)
print(time.perf_counter() - started)
"""


def bench_start(plugin_path: str, settings: Settings) -> list[list[str]]:
    jax, jnp = load_jax(plugin_path)
    function, args, _ = build_transformer(jax, jnp, np.random.default_rng(0))
    leaves, tree = jax.tree.flatten(args)
    text = jax.jit(lambda *v: function(*jax.tree.unflatten(tree, v))).lower(*leaves).as_text()
    repeats = max(3, settings.process_repeats)
    with tempfile.TemporaryDirectory() as tmp:
        program, inputs = os.path.join(tmp, "transformer.mlir"), os.path.join(tmp, "inputs.npz")
        with open(program, "w") as f:
            f.write(text)
        np.savez(inputs, **{f"a{i}": v for i, v in enumerate(leaves)})
        source = _START.format(program=program, inputs=inputs)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PJRT_"))}
        # As an installed package runs: with its modules' bytecode cached (kept out of the
        # checkout), written by a first run that is not measured.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")

        def run(cache: str) -> float:
            out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                                 env={**env, "PJRT_COMPILATION_CACHE_DIR": cache})
            if out.returncode != 0:
                raise RuntimeError(f"the start-up probe failed:\n{out.stderr[-3000:]}")
            return float(out.stdout.strip().splitlines()[-1])

        cold, warm = [], []
        run(os.path.join(tmp, "cache-unmeasured"))
        for i in range(repeats):
            cache = os.path.join(tmp, f"cache{i}")
            cold.append(run(cache))  # an empty directory: compiles and writes the entry
            warm.append(run(cache))  # the same directory: loads the entry
    import statistics

    c, w = statistics.median(cold), statistics.median(warm)
    return [["transformer: import + compile + first call, fresh process", f"{c * 1e3:.0f}",
             f"{w * 1e3:.0f}", format_ratio(w / c), f"<= {GOAL_WARM}",
             "met" if w / c <= GOAL_WARM else "NOT met"]]


# --------------------------------------------------------------------------------------------


CALL_HEADERS = ("measurement", "jax (us)", "pjrt (us)", "pjrt/jax", "CPU time pjrt/jax",
                "goal (CPU time)", "status")
START_HEADERS = ("pjrt, persistent compilation cache", "cold (ms)", "warm (ms)", "warm/cold",
                 "goal", "status")


def render(rows: list[list[str]], markdown: bool, headers: tuple) -> str:
    if markdown:
        out = ["| " + " | ".join(headers) + " |",
               "| " + " | ".join(["---"] + ["---:"] * (len(headers) - 3) + ["---", "---"]) + " |"]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(v.rjust(w) if 0 < i < len(headers) - 2 else v.ljust(w)
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter repeats")
    parser.add_argument("--only", default="a,b", help="sections to run, of a,b")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"models for section a, of {','.join(MODELS)}")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if sections - {"a", "b"} or set(models) - set(MODELS):
        parser.error("--only takes a and/or b; --models a subset of " + ",".join(MODELS))
    settings = QUICK if args.quick else Settings()
    import pjrt_cpu

    plugin_path = pjrt_cpu.library_path()
    started = time.perf_counter()
    calls = bench_calls(plugin_path, settings, models) if "a" in sections else []
    start = bench_start(plugin_path, settings) if "b" in sections else []
    import jax

    print(f"# real-model calls, pjrt next to jax {jax.__version__} on the same plugin "
          f"({'quick' if args.quick else 'full'} run, {time.perf_counter() - started:.0f} s)")
    print(f"# plugin: {plugin_path}")
    print(f"# cpu: {cpu_model()}, {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(f"# per-call cells: medians of {settings.repeats} interleaved loops of ~"
          f"{settings.target_s} s, each call waited on")
    for rows, headers in ((calls, CALL_HEADERS), (start, START_HEADERS)):
        if rows:
            print()
            print(render(rows, args.markdown, headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
