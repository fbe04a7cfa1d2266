"""Checks across devices (collectives, SPMD with Shardy and GSPMD), compiling without a
client (topologies), and, last, destroying the shared client."""
from __future__ import annotations

import numpy as np

from ...errors import XlaRuntimeError
from ...program import compile as compile_program
from ...sharding import Mesh
from ...topology import make_topology
from . import programs
from ._context import refused
from ._registry import CheckFailed, Skip, check
from .checks_programs import COMPILED, can_compile, expect


@check("collectives.all_reduce", needs=(COMPILED,))
def all_reduce(ctx):
    """An all-reduce across every device, one replica each, sums the replicas' values."""
    can_compile(ctx)
    devices = ctx.devices(2)
    count = len(devices)
    compiled = compile_program(programs.all_reduce(count), devices, client=ctx.client,
                               replicated=True)
    x = np.arange(4 * count, dtype=np.float32).reshape(count, 4)
    out = np.asarray(compiled(x))
    expect("result", out, np.broadcast_to(x.sum(axis=0), (count, 4)).astype(np.float32),
            exact=True)
    return f"{count} replicas"


def _spmd(ctx, text_for) -> str:
    can_compile(ctx)
    devices = ctx.devices(2)
    count = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    compiled = compile_program(text_for(count), mesh, client=ctx.client)
    x = np.arange(2 * count * 4, dtype=np.float32).reshape(2 * count, 4)
    scaled, total = compiled(x)
    expect("2x+1 (row-sharded)", np.asarray(scaled), x * 2 + 1, exact=True)
    expect("x.sum(0) (replicated)", np.asarray(total), x.sum(axis=0), exact=True)
    shards = scaled.addressable_shards
    if len(shards) != count:
        raise CheckFailed(f"the sharded output has {len(shards)} shards on {count} devices")
    return f"{count} partitions; sharded and replicated outputs right"


@check("spmd.shardy", needs=(COMPILED,))
def spmd_shardy(ctx):
    """A program with Shardy (sdy) shardings is partitioned over every device."""
    return _spmd(ctx, programs.spmd_shardy)


@check("spmd.gspmd", needs=(COMPILED,))
def spmd_gspmd(ctx):
    """The same program with GSPMD mhlo.sharding annotations."""
    return _spmd(ctx, programs.spmd_gspmd)


@check("topology.compile_only", needs=("library.get_pjrt_api",))
def topology_compile_only(ctx):
    """When the plugin describes its topology, a program compiles against it without a client."""
    if not ctx.api.has("PJRT_TopologyDescription_Create"):
        raise Skip("the plugin has no PJRT_TopologyDescription_Create")
    if not ctx.api.has("PJRT_Compile"):
        raise Skip("the plugin has no PJRT_Compile")
    name = ctx.topology
    try:
        topology = make_topology(ctx.plugin, name)
    except XlaRuntimeError as error:
        if not name:  # a plugin may describe only named topologies, or only with its hardware
            raise Skip(f"the plugin describes no topology of its own here: {refused(error)} "
                       f"(name one with --topology)") from None
        raise
    try:
        descriptions = topology.device_descriptions()
        compiled = topology.compile(programs.renamed(programs.ELEMENTWISE,
                                                     "conform_topology_compile_only"))
    finally:
        topology.close()
    if not compiled:
        raise CheckFailed("PJRT_Compile returned an empty executable")
    where = f"topology {name!r}" if name else "its own topology"
    return f"{where}: {len(descriptions)} device(s); {len(compiled)} bytes compiled"


@check("client.destroy")
def destroy(ctx):
    """PJRT_Client_Destroy frees the client after everything above."""
    ctx.client  # the shared client exists even when only this check was asked for
    ctx.close()
    return "destroyed"
