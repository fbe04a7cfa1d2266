"""Edge values never reach a plugin's CHECK: every public callable, called with 0, negative,
huge, empty, None and wrongly typed values, returns or raises an exception, and never ends the
process (the walk is tests/api_sweep.py, in a child per group and plugin build). Then the cases
the walk found, one by one, with the error each now raises.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, child_env, cpu_plugin_path
from api_sweep import GROUPS

SWEEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_sweep.py")


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_public_callable_survives_edge_values(plugin, group):
    result = subprocess.run([sys.executable, SWEEP, cpu_plugin_path(plugin), group],
                            capture_output=True, text=True, timeout=900, env=child_env())
    lines = result.stdout.strip().splitlines()
    last_call = next((line for line in reversed(lines) if line.startswith("CALL ")), "")
    assert result.returncode == 0 and lines and lines[-1].startswith("DONE"), (
        f"exit {result.returncode} during {last_call!r}\n{result.stderr[-3000:]}")
    assert int(lines[-1].split()[1]) > 0


def test_a_default_device_assignment_of_nothing_is_a_value_error(client):
    # XLA's CPU plugin aborts the process on 0 replicas ("Check failed: replica_count > 0").
    for counts in [(0,), (1, 0), (-1,), (2**40,), (70000, 1), (300, 300)]:
        with pytest.raises(ValueError, match="num_replicas|num_partitions"):
            client.default_device_assignment(*counts)
    with pytest.raises(TypeError, match="num_replicas must be an int"):
        client.default_device_assignment("2")
    assert client.default_device_assignment(2, 3).shape == (2, 3)


def test_a_device_ordinal_past_int32_is_refused_before_the_compile():
    # XLA keeps it in an int: 2**31 wrapped to a negative ordinal and aborted the process.
    options = pjrt.CompileOptions()
    with pytest.raises(ValueError, match="device_ordinal"):
        options.executable_build_options.device_ordinal = 2**31
    options.executable_build_options.device_ordinal = 2**31 - 1


@pytest.mark.parametrize("ndim", [2**31, -1, 65])
def test_a_rank_no_array_has_is_refused_before_lists_of_that_length_are_built(mesh, ndim):
    # A rank of 2**31 made lists of 2**31 entries: the process was killed for memory.
    sharding = pjrt.NamedSharding(mesh, pjrt.P("x"))
    for call in (sharding.to_hlo_sharding, pjrt.P("x").normalized, sharding.to_sdy_text,
                 pjrt.SingleDeviceSharding(mesh.devices.flat[0]).to_hlo_sharding):
        with pytest.raises(ValueError, match="ndim"):
            call(ndim)
    assert len(pjrt.P("x").normalized(64)) == 64


def test_a_client_needing_more_threads_than_the_process_may_start_is_refused(cpu_plugin):
    # 65536 devices are 131072 plugin threads, past vm.max_map_count's mappings: the plugin
    # aborted when one could not be started.
    with pytest.raises(ValueError, match="threads"):
        pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 65536})
    assert np.asarray(pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2})
                      .buffer_from_pyval(np.ones(2, np.float32))).tolist() == [1.0, 1.0]
