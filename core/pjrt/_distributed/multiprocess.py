"""What a client spanning processes adds to client creation: the store, the options, the refusal.

`prepare` is called by [`pjrt.client.create_client`][pjrt.client.create_client] when a key-value store is in play
(passed as ``distributed_client``, or set up by [`pjrt.distributed.initialize`][pjrt.distributed.initialize]). It decides
which create options the plugin gets and builds the key-value callbacks.

Only a plugin that declares the create options ``node_id`` and ``num_nodes`` (in
``Plugin.option_types``, as the CUDA package does) is given them; a job of several processes
on a plugin that does not is refused with [`UnsupportedFeatureError`][pjrt.errors.UnsupportedFeatureError] before the plugin
is called, since such a plugin (XLA's CPU builds among them) would quietly make a
single-process client and every cross-process program would then fail or hang.
"""
from __future__ import annotations

from typing import Mapping

from .. import distributed
from .._capi.api import HEADER_VERSION
from ..errors import UnsupportedFeatureError
from .kv_callbacks import KeyValueCallbacks
from ..kv_store import as_store

#: Create options through which a plugin learns its place in the job.
NODE_ID_OPTION = "node_id"
NUM_NODES_OPTION = "num_nodes"
VISIBLE_DEVICES_OPTION = "visible_devices"


def spans_processes(plugin) -> bool:
    """Whether ``plugin`` declares the create options a multi-process client needs."""
    return {NODE_ID_OPTION, NUM_NODES_OPTION} <= set(plugin.option_types)


def multiprocess_options(plugin, options: Mapping | None, num_processes: int, process_id: int,
                         local_device_ids) -> dict:
    """``options`` plus ``node_id``/``num_nodes`` (and ``visible_devices`` from
    ``local_device_ids``) for a plugin that declares them; options given explicitly win."""
    merged = dict(options or {})
    if not spans_processes(plugin):
        return merged
    merged.setdefault(NODE_ID_OPTION, process_id)
    merged.setdefault(NUM_NODES_OPTION, num_processes)
    if local_device_ids is not None and VISIBLE_DEVICES_OPTION in plugin.option_types:
        merged.setdefault(VISIBLE_DEVICES_OPTION, [int(i) for i in local_device_ids])
    return merged


def prepare(plugin, options: Mapping | None, distributed_client) -> tuple[dict, KeyValueCallbacks]:
    """The create options and key-value callbacks of a multi-process client of ``plugin``.

    Args:
      plugin: the loaded plugin.
      options: the caller's create options; ``node_id`` and ``num_nodes`` there win over the
        job's.
      distributed_client: a store or jax ``DistributedRuntimeClient``; the one
        [`pjrt.distributed.initialize`][pjrt.distributed.initialize] opened when None.

    Raises:
      ValueError: a store was given, but neither the options nor ``initialize`` say the
        number of processes and this one's id.
      UnsupportedFeatureError: several processes, and the plugin cannot span processes.
      RuntimeError: another process of the job was refused after this one joined (a process
        id claimed twice); the plugin would otherwise wait for it, or pair with it.
    """
    state = distributed.global_state
    if distributed_client is not None:
        store = as_store(distributed_client)
    else:
        distributed.check_job()
        store = distributed.job_store()  # create_client calls this once initialised
    given = dict(options or {})
    if NUM_NODES_OPTION in given or NODE_ID_OPTION in given:
        num_processes = int(given.get(NUM_NODES_OPTION, state.num_processes))
        process_id = int(given.get(NODE_ID_OPTION, state.process_id))
    elif distributed.is_initialized():
        num_processes, process_id = state.num_processes, state.process_id
    else:
        raise ValueError("a multi-process client needs its place in the job: call "
                         "pjrt.distributed.initialize(...) first, or pass the options "
                         "node_id and num_nodes")
    if num_processes > 1 and not spans_processes(plugin):
        raise UnsupportedFeatureError(
            "clients spanning processes", plugin.name, plugin.api_version,
            HEADER_VERSION,
            why=(f"the plugin does not declare the create options node_id and num_nodes, so it "
                 f"cannot join a job of {num_processes} processes (XLA's CPU plugin builds have "
                 f"no cross-process collectives). Run a single process, or use a plugin that "
                 f"spans processes, such as CUDA"))
    merged = multiprocess_options(plugin, given, num_processes, process_id,
                                  state.local_device_ids if distributed.is_initialized() else None)
    callbacks = KeyValueCallbacks(store, distributed.next_client_prefix(plugin.name))
    return merged, callbacks
