"""benchmarks/bench_gpu.py (pjrt next to jax on one device; scripts/gpu-check.py runs it on
an NVIDIA GPU) run here on the CPU, ``--quick``, against each CPU plugin build: every row is
in its table, each cell of pjrt and jax holds a number or says in the row's notes why not, and
the MLP step pjrt compiles from jax's StableHLO gives jax's losses.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CPU_PLUGINS, child_env, cpu_plugin_path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"

#: The start of each row's label, in order.
ROWS = (
    "(a) tiny program, N calls then wait on the last",
    "(a) tiny program, wait on every call",
    "(b) tiny program + np.asarray(result)",
    "(c) H2D 16 MiB from pageable host memory",
    "(c) H2D 16 MiB from pinned_host memory",
    "(c) D2H 16 MiB to pageable host memory",
    "(c) D2H 16 MiB to pinned_host memory",
    "(d) H2D 64 MiB streamed, 4 x 16 MiB chunks",
    "(d) H2D 64 MiB whole (device_put)",
    "(e) MLP Adam step (4 layers, batch 256, width 1024): N steps then wait",
    "(e) MLP Adam step + np.asarray(loss) every step",
)

#: Rows every platform can measure: pjrt's cell must be a number.
ALWAYS_MEASURED = (0, 1, 2, 3, 5, 8)

HAS_JAX = importlib.util.find_spec("jax") is not None


def run_bench(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--platform", "cpu", "--quick", "--markdown", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=child_env(PJRT_PLATFORMS="", JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, (f"bench_gpu.py exited with {done.returncode}:\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def table(output: str) -> list[dict[str, str]]:
    """The Markdown table's rows, each a dict by header."""
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    headers = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    return [dict(zip(headers, (cell.strip() for cell in line.strip("| ").split(" | "))))
            for line in lines[2:]]


def is_number(cell: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?", cell) is not None


@pytest.fixture(scope="module", params=sorted(CPU_PLUGINS))
def bench_output(request) -> str:
    return run_bench("--without", "pypjrt", "--plugin", cpu_plugin_path(request.param))


def test_header_names_the_device_and_versions(bench_output):
    assert re.search(r"^# device: cpu \(cpu:0\)$", bench_output, re.M), bench_output[:2000]
    versions = re.search(r"^# versions: (.*)$", bench_output, re.M)
    assert versions and re.match(r"pjrt \d", versions.group(1)), bench_output[:2000]
    assert "# SKIPPED pypjrt: skipped (--without)" in bench_output
    if HAS_JAX:
        assert re.search(r"jax \d+\.\d+\.\d+, jaxlib \d", versions.group(1)), versions.group(1)


def test_every_row_has_a_number_or_a_reason(bench_output):
    rows = table(bench_output)
    assert len(rows) == len(ROWS), [row.get("measurement") for row in rows]
    for expected, row in zip(ROWS, rows):
        assert row["measurement"].startswith(expected), (expected, row["measurement"])
        for lib in ("pjrt", "jax") if HAS_JAX else ("pjrt",):
            cell = row[lib]
            if is_number(cell):
                assert float(cell) > 0, (lib, row)
            else:
                assert cell in ("n/a", "skip"), (lib, row)
                # The reason is in the row's notes, after the library and the word.
                reason = re.search(rf"{lib} {re.escape(cell)}: (\S.*?)(;|$)", row["notes"])
                assert reason, (lib, row)
        if HAS_JAX and is_number(row["jax"]) and is_number(row["pjrt"]):
            assert re.fullmatch(r"[\d.e+-]+x", row["pjrt/jax"]), row
    for index in ALWAYS_MEASURED:
        assert is_number(rows[index]["pjrt"]), rows[index]
    # jax has no streamed upload: its cell says so.
    if HAS_JAX:
        assert rows[7]["jax"] == "n/a" and "jax n/a: jax has no public streamed" in rows[7]["notes"]


@pytest.mark.skipif(not HAS_JAX, reason="the MLP step is lowered by jax, not installed here")
def test_mlp_losses_agree(bench_output):
    row = table(bench_output)[9]
    assert is_number(row["pjrt"]) and is_number(row["jax"]), row
    notes = row["notes"]
    assert "losses agree" in notes, notes
    difference = re.search(r"jax vs pjrt over 3 steps: max relative difference (\S+) \(within "
                           r"(\S+)\)", notes)
    assert difference and float(difference.group(1)) <= float(difference.group(2)) <= 1e-4, notes
    losses = {name: [float(v) for v in values.split(", ")]
              for name, values in re.findall(r"(jax|pjrt) \[([^\]]+)\]", notes)}
    assert set(losses) == {"jax", "pjrt"} and len(losses["pjrt"]) == 3, notes
    for a, b in zip(losses["jax"], losses["pjrt"]):
        assert b == pytest.approx(a, rel=1e-4)
    # Adam makes progress: the loss falls over the three steps.
    assert losses["pjrt"][2] < losses["pjrt"][0], losses
    for name in ("jax", "pjrt"):
        assert re.search(rf"{name}'s first loss vs numpy float64: \S+ \(within", notes), notes
