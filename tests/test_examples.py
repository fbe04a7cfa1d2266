"""The programs in examples/ run as written, each in a fresh interpreter, and print what
their comments promise (real results of XLA's CPU plugin, checked against numpy)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, **env: str) -> str:
    """Run examples/NAME.py with the CPU plugin as the only backend; its stdout."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PJRT_CPU_DEVICE_COUNT", "PJRT_PLATFORMS")}
    environ.update({"PJRT_PLATFORMS": "cpu", **env})
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True,
                            text=True, env=environ, cwd=EXAMPLES.parent, timeout=300)
    assert result.returncode == 0, f"{name}.py failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_every_example_is_tested():
    tested = {"list_devices", "move_arrays", "compile_and_run", "sharded_mesh", "custom_call"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_list_devices():
    out = run_example("list_devices", PJRT_CPU_DEVICE_COUNT="3")
    assert "backend cpu: cpu" in out and "3 devices" in out
    assert "default backend: cpu" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ")] == [
        "CpuDevice(id=0)", "CpuDevice(id=1)", "CpuDevice(id=2)"]
    assert "memories=[device, pinned_host, unpinned_host]" in out


def test_move_arrays():
    out = run_example("move_arrays")
    assert "on CpuDevice(id=0): shape=(3, 4) dtype=float32" in out
    assert "copied to CpuDevice(id=1)" in out
    assert "round trip equal: True" in out
    assert "sum: 66.0" in out


def test_compile_and_run():
    out = run_example("compile_and_run")
    assert "a * b + a = [11.0, 42.0, 93.0, 164.0]" in out
    assert "matches numpy: True" in out
    assert "a * a + a = [2.0, 6.0, 12.0, 20.0]" in out


def test_sharded_mesh_over_eight_devices():
    out = run_example("sharded_mesh")  # asks for 8 CPU devices itself
    assert "mesh: {'x': 2, 'y': 4}" in out
    assert "spec=P('x', 'y')" in out
    assert "matches numpy: True" in out


def test_sharded_mesh_says_what_it_needs_with_too_few_devices():
    environ = {k: v for k, v in os.environ.items() if k != "PJRT_PLATFORMS"}
    environ.update(PJRT_PLATFORMS="cpu", PJRT_CPU_DEVICE_COUNT="2")
    result = subprocess.run([sys.executable, str(EXAMPLES / "sharded_mesh.py")],
                            capture_output=True, text=True, env=environ, timeout=300)
    assert result.returncode != 0
    assert "needs 8 devices; the default backend has 2 (set PJRT_CPU_DEVICE_COUNT=8)" in (
        result.stderr)


def test_custom_call():
    out = run_example("custom_call")
    assert "matches numpy: True" in out
    assert "result: [[0.1269 0.2633 0.513 ]" in out


@pytest.mark.parametrize("name", ["mlp.mlir"])
def test_shipped_programs_say_where_they_come_from(name):
    first = (EXAMPLES / "programs" / name).read_text().splitlines()[0]
    assert first.startswith("//") and "lower_mlp.py" in first
