"""One process of a multi-process test job, started by ``pjrt launch`` from test_distributed.py.

Usage: distributed_worker.py MODE PLUGIN_LIBRARY OUTPUT_DIR

``multinode``: joins the job (``pjrt.distributed.initialize()`` from the launcher's
environment), makes a client of the multi-process test plugin, builds global arrays three
ways and writes what it sees to OUTPUT_DIR/<process id>.json for the test to judge.
``cuda-allreduce``: sums an array sharded over one GPU per process with a program compiled
on a mesh spanning the processes, and writes the result.

With ``PJRT_TEST_START_LINE=PATH`` set, the process imports everything, writes
``PATH.ready.<pid>`` and waits for PATH to exist before it joins the job: the test then starts
every process's ``initialize`` within milliseconds of the others, as a launcher would.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import pjrt
from pjrt import distributed

LOCAL_DEVICES = 2


def _shards(array) -> list:
    return [{"device": s.device.id,
             "index": [[sl.start, sl.stop] for sl in s.index],
             "value": np.asarray(s.data).tolist()} for s in array.addressable_shards]


def multinode(library: str) -> dict:
    plugin = pjrt.load_pjrt_plugin_dynamically("multinode", library)
    # What a plugin package declares for a plugin that spans processes.
    plugin.option_types.update({"node_id": int, "num_nodes": int, "local_device_count": int})
    client = pjrt.make_c_api_client("multinode", {"local_device_count": LOCAL_DEVICES})
    state = distributed.global_state
    devices = client.devices()
    mesh = pjrt.Mesh(np.array(devices).reshape(state.num_processes, LOCAL_DEVICES), ("x", "y"))
    sharding = pjrt.NamedSharding(mesh, pjrt.P("x", "y"))
    rows = state.num_processes * 2
    global_value = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    mine = global_value[2 * state.process_id: 2 * state.process_id + 2]
    from_local = pjrt.make_array_from_process_local_data(sharding, mine)
    from_callback = pjrt.make_array_from_callback(global_value.shape, sharding,
                                                  lambda index: global_value[index])
    singles = [client.buffer_from_pyval(global_value[index], device) for device, index in
               sharding.addressable_devices_indices_map(global_value.shape).items()]
    from_singles = pjrt.make_array_from_single_device_arrays(global_value.shape, sharding,
                                                            singles)
    replicated = pjrt.NamedSharding(mesh, pjrt.P())
    whole = pjrt.make_array_from_process_local_data(replicated, global_value)
    try:
        np.asarray(from_local)
        read_error = None
    except ValueError as error:
        read_error = str(error)
    result = {
        "process_id": state.process_id,
        "client_process_index": client.process_index(),
        "registry_process_count": len({d.process_index for d in devices}),
        "devices": [[d.id, d.process_index, d.is_addressable] for d in devices],
        "local_devices": [d.id for d in client.local_devices()],
        "global_shape": list(from_local.shape),
        "array_devices": sorted(d.id for d in from_local.devices()),
        "fully_addressable": from_local.is_fully_addressable,
        "read_error": read_error,
        "from_local": _shards(from_local),
        "from_callback": _shards(from_callback),
        "from_singles": _shards(from_singles),
        "replicated": _shards(whole),
        "singles_still_usable": [np.asarray(a).tolist() for a in singles],
    }
    client.close()
    return result


def cuda_allreduce(_library: str) -> dict:
    # Lowered by jax on its CPU backend: the program only needs two partitions.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh as JaxMesh, NamedSharding as JaxSharding, PartitionSpec

    jax_mesh = JaxMesh(np.array(jax.devices("cpu")[:2]), ("x",))
    lowered = jax.jit(lambda x: jnp.sum(x, axis=0, keepdims=True),
                      in_shardings=JaxSharding(jax_mesh, PartitionSpec("x")),
                      out_shardings=JaxSharding(jax_mesh, PartitionSpec())).lower(
        jax.ShapeDtypeStruct((2, 4), jnp.float32))
    devices = pjrt.get_backend("cuda").devices()
    mesh = pjrt.Mesh(np.array(devices[:2]), ("x",))
    program = pjrt.compile(lowered.as_text(), mesh)
    state = distributed.global_state
    local = np.full((1, 4), state.process_id + 1, dtype=np.float32)
    x = pjrt.make_array_from_process_local_data(pjrt.NamedSharding(mesh, pjrt.P("x")), local)
    out = program(x)
    return {"process_id": state.process_id, "sum": _shards(out)}


def _wait_at_the_start_line() -> None:
    start_line = os.environ.get("PJRT_TEST_START_LINE")
    if not start_line:
        return
    with open(f"{start_line}.ready.{os.getpid()}", "w"):
        pass
    deadline = time.monotonic() + 60
    while not os.path.exists(start_line):
        if time.monotonic() > deadline:
            sys.exit("the test never opened the start line")
        time.sleep(0.005)


def main() -> None:
    mode, library, output = sys.argv[1:4]
    _wait_at_the_start_line()
    distributed.initialize()
    result = {"multinode": multinode, "cuda-allreduce": cuda_allreduce}[mode](library)
    with open(os.path.join(output, f"{result['process_id']}.json"), "w") as f:
        json.dump(result, f)
    distributed.shutdown()


if __name__ == "__main__":
    main()
