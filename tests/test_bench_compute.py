"""benchmarks/bench_compute.py (compute-bound programs, pjrt on each CPU plugin build next to
jax's own CPU backend) run ``--quick`` on a few of its programs: every row has a time for jax
and for each build, a ratio, and results that agree with jax's.
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
SCRIPT = ROOT / "benchmarks" / "bench_compute.py"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="bench_compute.py's programs are lowered by jax, "
                                       "not installed here")

#: Small programs of each kind (a while loop, a scan, a sort, a scatter, an FFT, a conv).
PROGRAMS = ("shortest-paths", "rnn-step", "sort", "scatter-add", "fft", "conv-pool-dense")


def is_number(cell: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?", cell) is not None


@pytest.fixture(scope="module")
def output() -> str:
    plugins = [f"--plugin=test-{name}={cpu_plugin_path(name)}" for name in sorted(CPU_PLUGINS)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--markdown", "--only", ",".join(PROGRAMS),
         *plugins, "--builds", ",".join(f"test-{name}" for name in sorted(CPU_PLUGINS))],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env=child_env(PJRT_PLATFORMS="", JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, (f"bench_compute.py exited with {done.returncode}:\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.mark.slow
def test_every_row_has_times_ratios_and_agreeing_results(output):
    builds = [f"test-{name}" for name in sorted(CPU_PLUGINS)]
    for build in builds:
        assert re.search(rf"^# build {build}: PJRT 0\.\d+, \d+ devices, /", output, re.M), output
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    headers = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    assert headers == (["program", "jax ms"] + [f"{b} ms" for b in builds]
                       + [f"{b}/jax" for b in builds] + [f"{b}/jax CPU time" for b in builds]
                       + ["notes"]), headers
    rows = [dict(zip(headers, (c.strip() for c in line.strip("| ").split(" | "))))
            for line in lines[2:]]
    assert len(rows) == len(PROGRAMS), rows
    for row in rows:
        for column in ["jax ms"] + [f"{b} ms" for b in builds]:
            assert is_number(row[column]) and float(row[column]) > 0, (column, row)
        for build in builds:
            assert re.fullmatch(r"\d+(\.\d+)?x", row[f"{build}/jax"]), row
            assert re.fullmatch(r"\d+(\.\d+)?x", row[f"{build}/jax CPU time"]), row
        notes = row["notes"]
        assert notes.startswith("results agree with jax (max relative difference "), notes
        differences = re.search(r"difference (\S+), tolerance (\S+)\)", notes)
        values = [float(v) for v in differences.group(1).split("/")]
        assert len(values) == len(builds)
        assert all(v <= float(differences.group(2)) for v in values), notes
