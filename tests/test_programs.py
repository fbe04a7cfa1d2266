"""Every committed StableHLO fixture, compiled and run on each real CPU plugin.

The numbers are checked against each program's numpy reference (tests/fixtures/programs.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures import programs

SINGLE_DEVICE = [p.name for p in programs.single_device_programs()]
SPMD = [p.name for p in programs.spmd_programs()]


def _run(client, program_text, inputs, device=None):
    device = device or client.local_devices()[0]
    executable = client.compile_and_load(program_text, [device])
    arrays = [client.buffer_from_pyval(x, device) for x in inputs]
    return executable, executable.execute(arrays)


@pytest.mark.parametrize("name", SINGLE_DEVICE)
def test_program_matches_numpy(client, name):
    program = programs.get(name)
    inputs = program.inputs()
    executable, outputs = _run(client, program.read_text(), inputs)
    programs.check_outputs(program, [np.asarray(o) for o in outputs])
    # The executable's reported output metadata agrees with what came back.
    assert executable.num_outputs == len(outputs)
    assert [o.shape for o in outputs] == [np.asarray(e).shape for e in program.expected()]


def test_outputs_metadata_matches_program(client):
    program = programs.get("multi_output")
    executable = client.compile_and_load(program.read_text())
    expected = program.expected()
    assert executable.output_shapes == tuple(e.shape for e in expected)
    assert executable.output_dtypes == tuple(e.dtype for e in expected)
    inputs = program.inputs()
    assert executable.input_shapes == tuple((x.shape, x.dtype) for x in inputs)


def test_bytecode_program_runs(client):
    program = programs.get("tiny_tanh")
    with open(programs.os.path.join(programs.FIXTURES_DIR, programs.BYTECODE_FILE), "rb") as f:
        bytecode = f.read()
    _, outputs = _run(client, bytecode, program.inputs())
    programs.check_outputs(program, [np.asarray(o) for o in outputs])


def test_different_device_runs_there(client):
    program = programs.get("tiny_tanh")
    device = client.local_devices()[3]
    executable, outputs = _run(client, program.read_text(), program.inputs(), device)
    assert executable.local_devices() == [device]
    assert outputs[0].device is device
    programs.check_outputs(program, [np.asarray(o) for o in outputs])


def _shards(host: np.ndarray, indices: dict) -> list:
    return [host[tuple(slice(lo, hi) for lo, hi in indices[str(d)])] for d in range(len(indices))]


@pytest.mark.parametrize("variant", ["shardy", "gspmd"])
@pytest.mark.parametrize("name", SPMD)
def test_spmd_program_on_eight_devices(client, name, variant):
    program = programs.get(name)
    layout = programs.load_manifest()["programs"][name]["spmd"]
    shard_info = layout["variants"][variant]
    devices = [client.lookup_device(i) for i in layout["device_ids"]]
    executable = client.compile_and_load(program.read_text(variant), devices)
    assert executable.local_devices() == devices
    assert executable.num_partitions() == len(devices)

    inputs = program.inputs()
    arguments = []
    for host, indices in zip(inputs, shard_info["input_shard_indices"]):
        arguments.append([client.buffer_from_pyval(shard, device)
                          for shard, device in zip(_shards(host, indices), devices)])
    results = executable.execute_sharded(arguments).disassemble_into_single_device_arrays()

    expected = program.expected()
    assert len(results) == len(expected)
    for per_device, indices, reference in zip(results, shard_info["output_shard_indices"], expected):
        for d, shard in enumerate(per_device):
            assert shard.device is devices[d]
            want = _shards(reference, indices)[d]
            np.testing.assert_allclose(np.asarray(shard), want, rtol=program.rtol, atol=program.atol)
