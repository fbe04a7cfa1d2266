"""Running a program on every device with global Arrays: the part of
`pjrt.executable.LoadedExecutable` behind `execute_global` (``pjrt.compile``'s calls), with its
native per-call plan (a `CallPlan` on several devices) and the checks of the full path.

`GlobalCalls` is a base class of the executable: it keeps no state of its own and uses the
executable's fields, declared below for type checkers.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .._capi import handles, long_runs
from .._capi.api import HEADER_VERSION
from .._capi.native import MAX_DEVICES, CallPlan
from .._pjrt_cffi import ffi
from .._profiling import recorder
from ..array import Array, check_device_sets
from ..errors import UnsupportedFeatureError
from ..sharding import global_shape_of_shards
from .executable_metadata import ExecutableMetadata
from .host_values import HostCopies, check_shards, host_array
from .launches import (Call, LaunchState, buffer_metadata, call_hooks, consume_donated,
                       new_call, not_row_major, prepare_donations)

_NULL = ffi.NULL

#: True while a trace runs (pjrt.profiler): `execute_laid_out` then times the native per-call path
#: from Python. A global of this module (`recorder.follow` keeps it) is the cheapest test per
#: call.
_tracing = recorder.active
recorder.follow(globals())


class GlobalCalls(ExecutableMetadata):
    """`execute_global` and `execute_laid_out` of `pjrt.executable.LoadedExecutable`."""

    if TYPE_CHECKING:  # what the executable provides
        _handle: handles.ClientHandle
        _client: Any
        _pointer: Any
        _donated: tuple
        _dynamic_outputs: frozenset
        _parameter_specs: tuple | None
        _layout_checks: dict
        _output_specs: Any
        _output_orders: tuple
        _output_global_shapes: tuple | None
        _declared_output_shapes: tuple | None
        _global_plan: CallPlan | None
        _global_plan_wanted: bool
        _launch_state: CallPlan | LaunchState

        def _check_count(self, count: int) -> None: ...
        def _thread_call(self, count: int, num_devices: int = 1) -> Call: ...
        def _launch(self, call: Call, keep: tuple, events: Any = None) -> None: ...

    def execute_global(self, arguments: Sequence[Array], *,
                       copy_host_values: bool = False) -> list[Array]:
        """Run on every device with global Arrays laid out as `input_shardings` say;
        returns global Arrays laid out as `output_shardings` say.

        ``pjrt.compile`` places or reshards arguments to those shardings before calling this.
        With ``copy_host_values``, arguments may also be numpy arrays, cut into shards and
        copied to the devices for this call only (see `execute`).

        Raises:
          DeviceAssignmentMismatchError: an argument sits on other devices.
          ValueError: an argument's sharding or shape does not match the parameter's.
          TypeError: wrong number of arguments, or not an Array.
        """
        outputs = self.execute_laid_out(arguments)
        if outputs is None:
            outputs = self._execute_global_checked(arguments, copy_host_values)
            if self._global_plan_wanted:
                self._make_global_plan()
        return outputs

    def execute_laid_out(self, arguments: Sequence[Array]) -> list[Array] | None:
        """`execute_global` for the call made in loops: every argument a global Array whose
        shards sit on the executable's devices, in their order, with a sharding that lays it
        out as the parameter needs (the parameter's own, or one seen equivalent to it before).
        Returns the outputs, or None, having done nothing, when the call needs anything
        else (placing, resharding, host values, or the checks that word an error): then call
        `execute_global`. Available once `execute_global` has run once."""
        plan = self._global_plan
        if plan is not None and _tracing:  # a trace records the launch (see _tracing)
            return recorder.run_plan(self, plan, arguments, False)
        return plan.run(arguments, False) if plan is not None else None

    def _make_global_plan(self) -> None:
        self._global_plan_wanted = False
        plan = self._new_global_plan()
        if plan is None:
            return
        plan.inline = self._launch_state.inline
        self._launch_state = plan
        self._global_plan = plan
        if self._pointer == _NULL:  # unloaded meanwhile by another thread (see _release)
            plan.live = 0

    @handles.native_method
    def _execute_global_checked(self, arguments: Sequence, copy_host_values: bool) -> list[Array]:
        self._live_pointer()
        if self._dynamic_outputs and len(self._devices) > 1:
            raise UnsupportedFeatureError(
                "global outputs of dynamic size", self._handle.api.plugin_name,
                self._handle.api.version, HEADER_VERSION,
                why=f"outputs {sorted(self._dynamic_outputs)} have a dimension whose size each "
                    f"call decides, which a sharded global Array cannot hold; run the program "
                    f"with execute_sharded, which returns each device's outputs at their size")
        if self._signature is None:
            raise UnsupportedFeatureError(
                "PJRT_Executable_OptimizedProgram", self._handle.api.plugin_name,
                self._handle.api.version, HEADER_VERSION,
                why="the plugin does not say what the program's parameters are, so their "
                    "layouts are unknown; pass per-device Arrays to execute_sharded instead")
        self._check_count(len(arguments))
        if self._output_shapes is not None and self._output_global_shapes is None:
            self._output_global_shapes = self._check_output_layouts()  # before anything runs
        devices = self._devices
        shardings = self.input_shardings
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
                check_shards(i, host.shape, host.dtype, sharding,
                             self._parameter_specs[i] if self._parameter_specs else None)
                hosts.append((i, host, sharding))
                rows.append(None)
                continue
            buffers = argument.live_buffers()
            if not laid_out[i] and not (argument.sharding == sharding):
                raise ValueError(f"argument {i} is laid out as {argument.sharding!r} but the "
                                 f"program expects {sharding!r}; place it with "
                                 f"pjrt.device_put(x, sharding)")
            check_shards(i, argument.shape, argument.dtype, sharding,
                         self._parameter_specs[i] if self._parameter_specs else None)
            if argument.stored_order is not None and i not in self._layout_checks:
                raise not_row_major(i, argument)
            if argument.shard_devices == devices:  # the shards in the program's device order
                rows.append(buffers)
            else:
                by_device = dict(zip(argument.shard_devices, buffers))
                rows.append([by_device[d] for d in devices])
        num_devices = len(devices)
        keep = prepare_donations(self._donated, [list(arguments)]) if self._donated else ()
        call = self._thread_call(len(arguments), num_devices)
        copies = HostCopies(self._client, len(arguments) * num_devices) if hosts else None
        try:
            position = 0
            for d in range(num_devices):
                for row in rows:
                    if row is not None:
                        call.arguments[position] = row[d]
                    position += 1
            if copies is not None:
                for i, host, sharding in hosts:
                    copies.add_sharded(i, len(arguments), host, sharding, devices,
                                       i in self._donated)
                copies.start(call.arguments)
            self._launch(call, keep)
            outputs = call.outputs
            count = self._num_outputs
            per_output = [[outputs[d * count + j] for d in range(num_devices)]
                          for j in range(count)]
        finally:
            if copies is not None:
                long_runs.free_after(call, copies.free)
            call.busy = False
        consume_donated(self._donated, [list(arguments)], keep)
        results = []
        for j, (buffers, sharding) in enumerate(zip(per_output, self.output_shardings)):
            if self._output_shapes is not None:
                global_shape, dtype = self._output_global_shape(j), self._output_dtypes[j]
            else:
                shard_shape, dtype = buffer_metadata(self._client, buffers[0])
                global_shape = global_shape_of_shards(sharding, shard_shape)
            results.append(Array(self._client, buffers, devices, global_shape, dtype, None,
                                 sharding, physical_order=self._output_orders[j]))
        return results

    def _output_global_shape(self, index: int) -> tuple:
        shapes = self._output_global_shapes
        if shapes is None:
            shapes = self._output_global_shapes = self._check_output_layouts()
        return shapes[index]

    def _new_global_plan(self) -> CallPlan | None:
        """The `CallPlan` of `execute_global`, for a program on several devices of this process
        whose outputs are all known and row-major; None for any other. Its arguments are global
        Arrays whose shardings `_fits_parameter` approved once (shardings are immutable)."""
        devices = self._devices
        if (self._output_shapes is None or self._signature is None
                or self._global_devices is not None or any(self._output_orders)
                or not 1 < len(devices) <= MAX_DEVICES):
            return None
        try:
            shardings = tuple(self.input_shardings)
            outputs = tuple((self._output_global_shape(j), self._output_dtypes[j],
                             sharding)
                            for j, sharding in enumerate(self.output_shardings))
        except Exception:  # noqa: BLE001 - shardings this path cannot hold: the full one runs
            return None
        handle = self._handle
        donated = self._donated
        count = len(shardings)
        fixed = (_NULL, _NULL, _NULL)  # no host values on this path
        make_call = functools.partial(new_call, handle, self._pointer, _NULL,
                                      self._num_outputs, count, fixed, len(devices))
        return CallPlan(handle, self._client, devices, Array, np.ndarray,
                        (((), None, None),) * count, outputs, donated,
                        call_hooks(handle, donated, make_call,
                                   functools.partial(_fits_parameter, shardings,
                                                     self._parameter_specs)))

    def _check_output_layouts(self) -> tuple:
        """Each output's global shape, from its shards; ValueError when the program declares
        another one (XLA pads uneven shards, which an Array cannot represent, as in jax)."""
        shard_shapes = [shape for shape, _ in self._output_specs or ()]
        shapes = tuple(global_shape_of_shards(sharding, shard_shape)
                       for sharding, shard_shape in zip(self.output_shardings, shard_shapes))
        # A replicated program declares per-replica shapes; only partitioned ones are compared.
        declared = (self._declared_output_shapes or ()) if self._replicas == 1 else ()
        for i, (shape, wanted) in enumerate(zip(shapes, declared)):
            if wanted is not None and tuple(wanted) != shape:
                sharding = self.output_shardings[i].to_hlo_sharding(len(wanted))
                raise ValueError(
                    f"output {i} has shape {tuple(wanted)}, which {sharding} splits unevenly "
                    f"(XLA pads its shards to {shard_shapes[i]}); pjrt, like jax, holds only "
                    f"evenly sharded arrays: shard that output along dimensions it divides")
        return shapes


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
