"""Running a program on every device with global Arrays: ``execute_global`` of
`pjrt.executable.LoadedExecutable` (``pjrt.compile``'s calls), with its native per-call plan (a
`CallPlan` on several devices) and the checks of the full path.

Free functions over what the executable holds: its description
(`pjrt._runtime.executable_metadata.ExecutableMetadata`) and its launcher
(`pjrt._runtime.launcher.Launcher`), which keeps the plan.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .._capi import long_runs
from .._capi.api import HEADER_VERSION
from .._capi.native_runtime import MAX_DEVICES, CallPlan
from .._pjrt_cffi import ffi
from ..array import Array, check_device_sets
from ..errors import UnsupportedFeatureError
from ..sharding import global_shape_of_shards
from .numpy_arguments import HostCopies, check_shards, host_array
from .launches import (buffer_metadata, call_hooks, consume_donated, new_call, not_row_major,
                       prepare_donations)

if TYPE_CHECKING:
    from .executable_metadata import ExecutableMetadata
    from .launcher import Launcher

_NULL = ffi.NULL


def make_plan(launcher: "Launcher", client: Any) -> None:
    """After the first full call: the launcher's global plan, where the program allows one."""
    launcher.global_plan_wanted = False
    plan = _new_plan(launcher, client)
    if plan is not None:
        launcher.use_plan(plan, global_plan=True)


def execute_checked(launcher: "Launcher", client: Any, arguments: Sequence,
                    copy_host_values: bool, check_count) -> list[Array]:
    """`execute_global` with every check that words an error, and host values; one native
    call on the client. ``check_count(count)``: the executable's argument-count check."""
    handle = launcher.handle
    with handle.calling():
        return _execute_checked(launcher, client, arguments, copy_host_values, check_count)


def _execute_checked(launcher: "Launcher", client: Any, arguments: Sequence,
                     copy_host_values: bool, check_count) -> list[Array]:
    metadata = launcher.metadata
    api = launcher.handle.api
    if launcher.pointer == _NULL:
        raise RuntimeError("this executable has been deleted")
    if metadata.dynamic_outputs and len(metadata.devices) > 1:
        raise UnsupportedFeatureError(
            "global outputs of dynamic size", api.plugin_name, api.version, HEADER_VERSION,
            why=f"outputs {sorted(metadata.dynamic_outputs)} have a dimension whose size each "
                f"call decides, which a sharded global Array cannot hold; run the program "
                f"with execute_sharded, which returns each device's outputs at their size")
    if metadata.signature is None:
        raise UnsupportedFeatureError(
            "PJRT_Executable_OptimizedProgram", api.plugin_name, api.version, HEADER_VERSION,
            why="the plugin does not say what the program's parameters are, so their "
                "layouts are unknown; pass per-device Arrays to execute_sharded instead")
    check_count(len(arguments))
    if metadata.output_shapes is not None:
        metadata.check_output_layouts()  # before anything runs
    devices = metadata.devices
    specs = metadata.parameter_specs
    shardings = metadata.input_shardings
    # Arguments placed by pjrt.compile carry these very sharding objects, or equivalent
    # ones (the same devices in the same order): the set comparison is needed only for
    # the others.
    laid_out = [type(a) is Array and ((mine := a.sharding) is s
                                      or mine.is_equivalent_to(s, a.ndim))
                for a, s in zip(arguments, shardings)]
    if not all(laid_out):
        check_device_sets(arguments, devices, host_values_allowed=copy_host_values)
    rows: list = []
    hosts = []
    for i, (argument, sharding) in enumerate(zip(arguments, shardings)):
        if copy_host_values and not isinstance(argument, Array):
            host = host_array(i, argument, None)
            check_shards(i, host.shape, host.dtype, sharding, specs[i] if specs else None)
            hosts.append((i, host, sharding))
            rows.append(None)
            continue
        buffers = argument.live_buffers()
        if not laid_out[i] and not (argument.sharding == sharding):
            raise ValueError(f"argument {i} is laid out as {argument.sharding!r} but the "
                             f"program expects {sharding!r}; place it with "
                             f"pjrt.device_put(x, sharding)")
        check_shards(i, argument.shape, argument.dtype, sharding, specs[i] if specs else None)
        if argument.stored_order is not None and i not in metadata.layout_checks:
            raise not_row_major(i, argument)
        if argument.shard_devices == devices:  # the shards in the program's device order
            rows.append(buffers)
        else:
            by_device = dict(zip(argument.shard_devices, buffers))
            rows.append([by_device[d] for d in devices])
    num_devices = len(devices)
    donated = metadata.donated
    keep = prepare_donations(donated, [list(arguments)]) if donated else ()
    call = launcher.thread_call(len(arguments), num_devices)
    copies = HostCopies(client, len(arguments) * num_devices) if hosts else None
    try:
        position = 0
        for d in range(num_devices):
            for row in rows:
                if row is not None:
                    call.arguments[position] = row[d]
                position += 1
        if copies is not None:
            for i, host, sharding in hosts:
                copies.add_sharded(i, len(arguments), host, sharding, devices, i in donated)
            copies.start(call.arguments)
        launcher.launch(call, keep)
        outputs = call.outputs
        count = metadata.num_outputs
        per_output = [[outputs[d * count + j] for d in range(num_devices)]
                      for j in range(count)]
    finally:
        if copies is not None:
            long_runs.free_after(call, copies.free)
        call.busy = False
    consume_donated(donated, [list(arguments)], keep)
    results = []
    for j, (buffers, sharding) in enumerate(zip(per_output, metadata.output_shardings)):
        if metadata.output_shapes is not None:
            global_shape = metadata.output_global_shape(j)
            dtype = metadata.output_dtypes[j]  # pyright: ignore[reportOptionalSubscript]
        else:
            shard_shape, dtype = buffer_metadata(client, buffers[0])
            global_shape = global_shape_of_shards(sharding, shard_shape)
        results.append(Array(client, buffers, devices, global_shape, dtype, None,
                             sharding, physical_order=metadata.output_orders[j]))
    return results


def _new_plan(launcher: "Launcher", client: Any) -> CallPlan | None:
    """The `CallPlan` of `execute_global`, for a program on several devices of this process
    whose outputs are all known and row-major; None for any other. Its arguments are global
    Arrays whose shardings `_fits_parameter` approved once (shardings are immutable)."""
    metadata = launcher.metadata
    devices = metadata.devices
    if (metadata.output_shapes is None or metadata.signature is None
            or metadata.spans_processes or any(metadata.output_orders)
            or not 1 < len(devices) <= MAX_DEVICES):
        return None
    try:
        shardings = tuple(metadata.input_shardings)
        outputs = tuple((metadata.output_global_shape(j),
                         metadata.output_dtypes[j],  # pyright: ignore[reportOptionalSubscript]
                         sharding)
                        for j, sharding in enumerate(metadata.output_shardings))
    except Exception:  # noqa: BLE001 - shardings this path cannot hold: the full one runs
        return None
    handle = launcher.handle
    donated = metadata.donated
    count = len(shardings)
    fixed = (_NULL, _NULL, _NULL)  # no host values on this path
    make_call = functools.partial(new_call, handle, launcher.pointer, _NULL,
                                  metadata.num_outputs, count, fixed, len(devices))
    return CallPlan(handle, client, devices, Array, np.ndarray,
                    (((), None, None),) * count, outputs, donated,
                    call_hooks(handle, donated, make_call,
                               functools.partial(_fits_parameter, shardings,
                                                 metadata.parameter_specs)))


def _fits_parameter(shardings: tuple, specs: tuple | None, index: int, argument: Array) -> bool:
    """Whether a global Array is laid out as parameter ``index`` needs: its sharding is the
    parameter's or an equivalent one, and its shards have the parameter's shape and dtype."""
    sharding = shardings[index]
    try:
        mine = argument.sharding
        if mine is not sharding and not mine.is_equivalent_to(sharding, argument.ndim):
            return False
        check_shards(index, argument.shape, argument.dtype, sharding,
                     specs[index] if specs else None)
    except Exception:  # noqa: BLE001 - any doubt: the full path checks and words the error
        return False
    return True
