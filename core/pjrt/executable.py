"""Running compiled programs: ``PJRT_LoadedExecutable`` and its metadata.

Programs are compiled by `pjrt._compile.pipeline`, which makes the executables this module runs.

[`LoadedExecutable`][pjrt.executable.LoadedExecutable] owns the loaded executable and the
``PJRT_Executable`` view of it. It is made of two parts it holds: its description
([`ExecutableMetadata`][pjrt.executable.ExecutableMetadata], ``executable.metadata``), which
reads once, at load time, everything a call needs (the devices, the outputs' shapes and
dtypes, the parameters' shapes and dtypes and which parameters are donated), and whose
questions the executable answers; and its launcher (`pjrt._runtime.launcher.Launcher`), which
holds what it launches and the native per-call plans. A call checks its arguments in Python
(a wrong count, shape, dtype or device is a clear error before the plugin sees it) and makes a
single C call.
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from . import dtypes
from ._capi import handles
from ._capi import long_runs
from ._capi.native_runtime import CallPlan
from ._profiling import recorder
from ._pjrt_cffi import ffi
from .array import Array, array_from_host
# CompiledMemoryStats and ExecutableMetadata are re-exported: their home was this module;
# HloModule is public here.
from ._runtime.executable_metadata import (CompiledMemoryStats, ExecutableMetadata,  # noqa: F401
                                           HloModule)
from .errors import ArgumentMismatchError
from ._runtime.numpy_arguments import HostCopies
from ._runtime import global_calls
from ._runtime.launcher import Launcher
from ._runtime import handler_launches
from ._capi.handler_devices import handlers_of_asynchronous_programs as _handlers_running
from ._runtime.launches import (array_from_buffer, call_hooks, consume_donated,
                                launch_on_device, new_call, not_row_major, prepare_donations,
                                refuse_no_device, unpadded)
from ._capi.staging import CALL_STAGING_THRESHOLD_BYTES
from . import tokens
from .tokens import ShardedToken, Token

if TYPE_CHECKING:
    from .device import ClientView, Device

_NULL = ffi.NULL
_adopt = Array._adopt

#: True while a trace runs (pjrt.profiler): `execute` then times the native per-call path
#: from Python. A global of this module (`recorder.follow` keeps it) is the cheapest test per
#: call.
_tracing = recorder.active
recorder.follow(globals())


def _call_parameters(metadata: ExecutableMetadata, api) -> tuple | None:
    """Per parameter ``(shape, dtype, strides)`` for the checks of `execute`'s per-call path
    (strides None where host values of it are not copied by the call), and the fixed part of its
    C call; None where every call takes the full checks (several devices, parameters or outputs
    of unknown shape or dtype, layouts other than row-major)."""
    specs = metadata.parameter_specs
    if (len(metadata.devices) != 1 or metadata.layout_checks
            or metadata.output_specs is None or specs is None
            or any(spec is None or spec[1] is None for spec in specs)):
        return None
    copies = api.has("PJRT_Client_BufferFromHostBuffer")
    parameters, types, num_dims, dims = [], [], [], []
    for shape, dtype in specs:  # pyright: ignore[reportGeneralTypeIssues]  (checked above)
        # Host values of the parameter are copied by the C call itself when they are small
        # (larger ones go through staging), dense row-major, of its shape and dtype.
        strides = pjrt_type = None
        try:
            pjrt_type = dtypes.to_pjrt_type(dtype)
            size = math.prod(shape) * dtype.itemsize
            if copies and 0 < size < CALL_STAGING_THRESHOLD_BYTES:
                strides = np.empty(shape, dtype).strides  # row-major's, as numpy writes them
        except (TypeError, ValueError):
            pass  # host values of this parameter take the full path
        parameters.append((tuple(shape), dtype, strides))
        types.append(pjrt_type or 0)
        num_dims.append(len(shape))
        dims.extend(shape)
    fixed = (ffi.new("PJRT_Buffer_Type[]", types or [0]),
             ffi.new("size_t[]", num_dims or [0]), ffi.new("int64_t[]", dims or [0]))
    return tuple(parameters), fixed


#: Every loaded executable alive, of every client (`loaded_on` picks one client's).
_loaded: "weakref.WeakSet[LoadedExecutable]" = weakref.WeakSet()


def loaded_on(client: "ClientView") -> list["LoadedExecutable"]:
    """The executables loaded on ``client`` that are alive and not deleted
    (`Client.live_executables`)."""
    return [e for e in list(_loaded) if e.client is client and not e.is_deleted()]


class ExecuteResults:
    """Outputs of [`LoadedExecutable.execute_sharded`][pjrt.executable.LoadedExecutable.execute_sharded], one Array per output and device."""

    def __init__(self, outputs: list[list[Array]], token: ShardedToken | None = None):
        self._outputs = outputs
        self._token = token

    def consume_token(self) -> ShardedToken:
        """The run's [`ShardedToken`][pjrt.tokens.ShardedToken] (``execute_sharded(...,
        with_tokens=True)``); it can be taken once.

        Raises:
          RuntimeError: the call was made without ``with_tokens``, or the token was taken.
        """
        token, self._token = self._token, None
        if token is None:
            raise RuntimeError("this run has no token to give: call execute_sharded(..., "
                               "with_tokens=True) for one (each can be taken once)")
        return token

    def __len__(self) -> int:
        return len(self._outputs)

    def disassemble_into_single_device_arrays(self) -> list[list[Array]]:
        """``result[i][d]``: output ``i`` on the executable's ``d``-th device."""
        return [list(per_device) for per_device in self._outputs]


class _Described:
    """A question to the executable's description, answered by it (``executable.name()`` is
    ``executable.metadata.name()``): see [`ExecutableMetadata`][pjrt.executable.ExecutableMetadata]."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, executable: Any, owner: type | None = None) -> Any:
        if executable is None:
            return getattr(ExecutableMetadata, self.name)
        answer = getattr(executable.metadata, self.name)
        if not callable(answer):
            return answer

        @functools.wraps(answer)
        def asked(*args, **kwargs):
            return answer(*args, **kwargs)

        # The executable, and so its loaded program, lives while the question runs (as a
        # bound method keeps its object): ``load(...).serialize()`` asks of no freed program.
        setattr(asked, "executable", executable)
        return asked


class LoadedExecutable:
    """A compiled program loaded on its devices (``PJRT_LoadedExecutable``).

    What the program says about itself is its ``metadata``
    ([`ExecutableMetadata`][pjrt.executable.ExecutableMetadata]), read once at load; the
    executable answers the same questions (``name()``, ``input_shardings``,
    ``cost_analysis()``, ``serialize()``, ...) through it.
    """

    # What the program says about itself: the description's members, answered by it.
    client, local_devices = _Described(), _Described()
    addressable_devices, global_devices = _Described(), _Described()
    num_outputs, output_shapes, output_dtypes = _Described(), _Described(), _Described()
    input_shapes, donated_parameters = _Described(), _Described()
    input_shardings, output_shardings = _Described(), _Described()
    name, num_replicas, num_partitions = _Described(), _Described(), _Described()
    fingerprint, size_of_generated_code_in_bytes = _Described(), _Described()
    get_compiled_memory_stats, cost_analysis = _Described(), _Described()
    output_memory_kinds, get_output_memory_kinds = _Described(), _Described()
    get_parameter_layouts, get_output_layouts = _Described(), _Described()
    input_layouts, output_layouts = _Described(), _Described()
    optimized_module_proto, hlo_text, as_text = _Described(), _Described(), _Described()
    hlo_modules, serialize = _Described(), _Described()

    def __init__(self, client: "ClientView", pointer, *,
                 declared_output_shapes: tuple | None = None,
                 global_devices: Sequence["Device"] | None = None):
        self._client = client
        self._handle = client.raw_handle
        self.metadata: Any = None
        self._launcher: Any = None
        api = self._handle.api
        self._handle.executables[id(self)] = (pointer, _NULL)
        try:
            api.require("PJRT_LoadedExecutable_Execute")
            executable = api.call_new("PJRT_LoadedExecutable_GetExecutable",
                                      loaded_executable=pointer).executable
            self._handle.executables[id(self)] = (pointer, executable)
            #: What the program says about itself, read once here (`ExecutableMetadata`).
            self.metadata = metadata = ExecutableMetadata(
                client, pointer, executable, global_devices=global_devices,
                declared_output_shapes=declared_output_shapes)
            self._launcher = launcher = Launcher(self._handle, pointer, metadata)
            # The facts the full paths read on every call, bound once from the description.
            self._devices, self._num_outputs = metadata.devices, metadata.num_outputs
            self._signature, self._donated = metadata.signature, metadata.donated
            self._parameter_specs = metadata.parameter_specs
            self._layout_checks = metadata.layout_checks
            self._output_shapes, self._output_dtypes = metadata.output_shapes, metadata.output_dtypes
            self._output_orders = metadata.output_orders
            #: Outputs whose size each call decides (see `unpadded`): they take the full path.
            self._dynamic_outputs = metadata.dynamic_outputs
            parameters = (_call_parameters(metadata, api)
                          if not any(self._output_orders) and not self._dynamic_outputs
                          else None)
            if parameters is not None:  # the per-call path of `execute`
                launcher.plan = launcher.state = _make_plan(client, launcher, *parameters)
            launcher.global_plan_wanted = len(self._devices) > 1 and not self._dynamic_outputs
        except BaseException:
            self._release()
            raise
        # Freed when this object goes, by a finaliser that holds only the handle and the id.
        weakref.finalize(self, self._handle.release_executable, id(self)).atexit = False
        _loaded.add(self)

    # -- ownership -------------------------------------------------------------------------

    def _release(self) -> None:
        # Cleared before the handle is released: a call that starts after this sees it.
        if self._launcher is not None:
            self._launcher.release()
        if self.metadata is not None:
            self.metadata.forget()
        self._handle.release_executable(id(self))

    def _live_pointer(self):
        """The ``PJRT_LoadedExecutable*``, for a call on it (RuntimeError once unloaded,
        ClosedClientError once its client is closed)."""
        pointer = self._launcher.pointer
        if pointer == _NULL:
            raise RuntimeError("this executable has been deleted")
        self.metadata._live_pointer()  # its client closed
        return pointer

    @property
    def launches_inline(self) -> bool:
        """Whether the next launch runs on the calling thread (see `pjrt._capi.long_runs`)."""
        return self._launcher.inline

    @launches_inline.setter
    def launches_inline(self, value: bool) -> None:
        self._launcher.inline = value

    def delete(self) -> None:
        """Unload the executable; later calls raise RuntimeError. Calls running in other
        threads finish first (the plugin's executable is freed after them)."""
        self._release()

    def is_deleted(self) -> bool:
        return self._launcher.pointer == _NULL or self._handle.closed

    # -- execution -------------------------------------------------------------------------

    def _check_argument(self, index: int, argument, device) -> object:
        if not isinstance(argument, Array):
            raise TypeError(f"argument {index} is a {type(argument).__name__}; execute takes "
                            f"pjrt Arrays (use client.buffer_from_pyval or pjrt.compile)")
        buffers = argument.live_buffers()
        if index in self._layout_checks and argument.layout != self._layout_checks[index]:
            raise ValueError(f"argument {index} is laid out as {argument.layout}; the program "
                             f"was compiled to take {self._layout_checks[index]}")
        if index not in self._layout_checks and argument.stored_order is not None:
            raise not_row_major(index, argument)
        if argument._handle is not self._handle:
            raise ValueError(f"argument {index} belongs to another client ({argument.client!r}) "
                             f"than this executable ({self._client!r}); copy it with "
                             f"copy_to_device({device}) first")
        if argument.shard_devices[0] is not device or len(buffers) != 1:
            where = ", ".join(map(str, argument.shard_devices))
            raise ValueError(f"argument {index} is on {where} "
                             f"but this executable runs it on {device}; copy it with "
                             f"copy_to_device first")
        signature = self._signature
        if signature is not None and index < len(signature.parameters):
            expected = signature.parameters[index]
            if expected is not None and (argument.shape != expected.shape
                                         or (expected.dtype is not None
                                             and argument.dtype != expected.dtype)):
                raise ArgumentMismatchError(index, argument.shape, argument.dtype,
                                            expected.shape, expected.dtype)
        return buffers[0]

    def _check_count(self, count: int) -> None:
        signature = self._signature
        if signature is not None and count != len(signature.parameters):
            raise TypeError(f"the program takes {len(signature.parameters)} arguments, "
                            f"{count} were given")

    def execute(self, arguments: Sequence[Array], *,
                copy_host_values: bool = False, device: "Device | None" = None) -> list[Array]:
        """Run on the executable's single device; returns one Array per output.

        Execution is asynchronous: the call returns once the work is queued; reading an output
        waits for it. Arguments the program donates are consumed (they read as deleted).
        With ``copy_host_values``, arguments may also be numpy arrays (or anything
        ``np.asarray`` takes): they are copied to the device for this call only, all in one
        native call.

        ``device``: where to run a portable executable (compiled with
        ``CompileOptions.compile_portable_executable``, it has no device of its own, and
        ``local_devices()`` is empty); its arguments must be Arrays on that device.

        An output with a dimension of dynamic size (``stablehlo.set_dimension_size``, bounded)
        has the size the call gave; since that size is part of the value, such a call waits for
        its outputs before it returns.

        Raises:
          TypeError: wrong number, shape or dtype of arguments, or a non-Array argument.
          ValueError: an argument lives on another device; ``device`` is missing for a
            portable executable or given for one that is not.
          DeletedArrayError: an argument was deleted or donated before.
          XlaRuntimeError: the plugin failed to launch the program.
        """
        # The per-call path (pjrt._capi.native_runtime's CallPlan.run): live single-device
        # Arrays and small numpy arrays that are what the parameters are go straight into one C
        # call (checks, ticket, host copies, launch, output Arrays). It answers None for
        # anything else, having done nothing, and the full path below checks everything and
        # reports every error.
        if _handlers_running and self._launch_waits_for_its_handler(device):
            return self._execute_on_stand_in([arguments], device, copy_host_values)[0]
        plan = self._launcher.plan
        if plan is not None and device is None:
            outputs = (recorder.run_plan(self, plan, arguments, copy_host_values) if _tracing
                       else plan.run(arguments, copy_host_values))  # (see _tracing)
            if outputs is not None:
                return outputs
        if device is not None or not self._devices:
            return self._execute_portable(arguments, device, copy_host_values)
        return self._execute_checked(arguments, copy_host_values)

    def _execute_portable(self, arguments: Sequence[Array], device: "Device | None",
                          copy_host_values: bool) -> list[Array]:
        """`execute` of a portable executable on ``device`` (the plugin's ``execute_device``),
        launched on a worker thread while the caller waits where Ctrl-C reaches it."""
        devices = self._devices
        if len(devices) == 1 and device == devices[0]:
            return self._execute_checked(arguments, copy_host_values)  # its own device
        if devices:
            raise ValueError(f"device= chooses where a portable executable runs "
                             f"(CompileOptions.compile_portable_executable); this one was "
                             f"compiled for {', '.join(map(str, devices))} and runs there: "
                             f"call execute without device=")
        if device is None:
            raise ValueError("this executable is portable (compiled with CompileOptions."
                             "compile_portable_executable) and has no device of its own: "
                             "pass execute(arguments, device=...) to choose one")
        if getattr(device, "client", None) is not self._client:
            raise ValueError(f"device= must be a device of this executable's client "
                             f"({self._client!r}), not {device!r}")
        handle = self._handle
        with handle.calling(closed_ok=True):
            self._live_pointer()
            count = len(arguments)
            self._check_count(count)
            buffers = ffi.new("PJRT_Buffer*[]", max(count, 1))
            for i, argument in enumerate(arguments):
                buffers[i] = self._check_argument(i, argument, device)
            keep = prepare_donations(self._donated, [arguments]) if self._donated else ()
            self._launcher.check_headroom(1)
            outputs = launch_on_device(handle, self._launcher.pointer, buffers, count,
                                        self._num_outputs, keep, device)
            consume_donated(self._donated, [arguments], keep)
            return self._wrap_outputs(outputs, 0, (device,))

    def execute_with_token(self, arguments: Sequence[Array], *,
                           copy_host_values: bool = False) -> tuple[list[Array], Token]:
        """`execute`, and the run's [`Token`][pjrt.tokens.Token] (its completion).

        Raises:
          ValueError: the executable runs on several devices (use ``execute_sharded``), or on
            none: a portable one (run it with ``execute(arguments, device=...)``).
        """
        if _handlers_running and handler_launches.launch_waits_for_its_handler(self._devices):
            outputs = self._execute_on_stand_in([arguments], None, copy_host_values)[0]
            return outputs, Token(tokens.finished(self._handle, 1))
        slots = ffi.new("PJRT_Event*[]", 1)
        outputs = self._execute_checked(arguments, copy_host_values, slots)
        return outputs, Token(tokens.take_events(self._handle, slots, 1))

    def _execute_checked(self, arguments: Sequence, copy_host_values: bool,
                         events=_NULL) -> list[Array]:
        """`execute` with every check that builds an error message, and host values of any
        kind (see `pjrt._runtime.numpy_arguments`)."""
        devices = self._devices
        if len(devices) != 1:
            refuse_no_device(devices, "execute_with_token")
            raise ValueError(f"this executable runs on {len(devices)} devices; use "
                             f"execute_sharded")
        # One native call on the client (its closed check is below, with the other checks):
        # every pointer is read after the ticket is taken, so nothing read here is freed before
        # it ends.
        handle = self._handle
        call = copies = None
        with handle.calling(closed_ok=True):
            try:
                specs = self._parameter_specs
                count = len(arguments)
                if self._launcher.pointer == _NULL or handle.closed or (specs is not None
                                                               and count != len(specs)):
                    self._live_pointer()
                    self._check_count(count)
                device = devices[0]
                call = self._launcher.thread_call(count)
                argument_array = call.arguments
                for i, argument in enumerate(arguments):
                    if copy_host_values and not isinstance(argument, Array):
                        if copies is None:
                            copies = HostCopies(self._client, count)
                        copies.add_value(i, argument, specs[i] if specs else None, device,
                                         i in self._donated)
                        continue
                    argument_array[i] = self._check_argument(i, argument, device)
                if copies is not None:
                    copies.start(argument_array)
                if self._donated:
                    keep = prepare_donations(self._donated, [arguments])
                    self._launcher.launch(call, keep, events)
                    consume_donated(self._donated, [arguments], keep)
                else:
                    self._launcher.launch(call, (), events)
                return self._wrap_outputs(call.outputs, 0, devices)
            finally:
                if copies is not None:
                    long_runs.free_after(call, copies.free)
                if call is not None:
                    call.busy = False

    def execute_sharded(self, arguments: Sequence[Sequence[Array]], *,
                        with_tokens: bool = False) -> ExecuteResults:
        """Run on every device of the executable.

        Args:
          arguments: ``arguments[i][d]`` is argument ``i`` on the executable's ``d``-th device
            (``local_devices()`` order), a single-device Array.
          with_tokens: keep the run's completion, for the results' ``consume_token()``.

        Returns:
          [`ExecuteResults`][pjrt.executable.ExecuteResults]; ``disassemble_into_single_device_arrays()[i][d]`` is output
          ``i`` on device ``d``.

        Raises:
          ValueError: the executable is portable (it has no devices of its own: run it with
            ``execute(arguments, device=...)``), or an argument has another number of shards
            than the executable has devices.
        """
        with self._handle.calling():
            self._live_pointer()
            refuse_no_device(self._devices, "execute_sharded")
            num_devices = len(self._devices)
            self._check_count(len(arguments))
            for i, shards in enumerate(arguments):
                if len(shards) != num_devices:
                    raise ValueError(f"argument {i} has {len(shards)} shards; the executable "
                                     f"runs on {num_devices} devices")
            if _handlers_running and handler_launches.launch_waits_for_its_handler(self._devices):
                per_device = [list(shards) for shards in zip(*arguments)] if arguments else [
                    [] for _ in self._devices]
                outputs = self._execute_on_stand_in(per_device, None, False)
                return ExecuteResults(
                    [list(per_output) for per_output in zip(*outputs)],
                    ShardedToken(tokens.finished(self._handle, num_devices),
                                 [device.id for device in self._devices]) if with_tokens else None)
            # Device-major, as the plugin takes them: every argument of device 0, then device 1...
            flat = [self._check_argument(i, shards[d], device)
                    for d, device in enumerate(self._devices) for i, shards in enumerate(arguments)]
            per_device_arguments = list(zip(*arguments)) if arguments else []
            keep = prepare_donations(self._donated, per_device_arguments) if self._donated else ()
            call = self._launcher.thread_call(len(arguments), num_devices)
            slots = ffi.new("PJRT_Event*[]", num_devices) if with_tokens else _NULL
            try:
                for position, buffer in enumerate(flat):
                    call.arguments[position] = buffer
                self._launcher.launch(call, keep, slots)
                outputs = call.outputs
            finally:
                call.busy = False
            token = (ShardedToken(tokens.take_events(self._handle, slots, num_devices),
                                  [device.id for device in self._devices])
                     if with_tokens else None)
            consume_donated(self._donated, per_device_arguments, keep)
            results: list[list[Any]] = [[None] * num_devices for _ in range(self._num_outputs)]
            for d, device in enumerate(self._devices):
                for i, array in enumerate(self._wrap_outputs(outputs, d, (device,))):
                    results[i][d] = array
            return ExecuteResults(results, token)

    def _launch_waits_for_its_handler(self, device: "Device | None") -> bool:
        """Whether `execute` on ``device`` (None: the executable's own) would queue behind the
        program running the handler this thread is in. A ``device`` that `_execute_portable`
        would refuse is left to it, to say why."""
        if device is None:
            return handler_launches.launch_waits_for_its_handler(self._devices)
        return (not self._devices and getattr(device, "client", None) is self._client
                and handler_launches.launch_waits_for_its_handler((device,)))

    def _execute_on_stand_in(self, arguments: Sequence[Sequence[Any]], device: "Device | None",
                             copy_host_values: bool) -> list[list[Array]]:
        """A launch from inside a custom-call handler on the device whose program runs the
        handler, which would queue behind that program: run on a stand-in client instead (see
        `pjrt._runtime.handler_launches`). ``arguments[d][i]``: argument ``i`` on device ``d``;
        returns ``outputs[d][i]``, Arrays on this executable's devices."""
        self._live_pointer()
        devices = self._devices if device is None else (device,)
        for d, shard in enumerate(arguments):
            self._check_count(len(shard))
            for i, argument in enumerate(shard):
                if not (copy_host_values and not isinstance(argument, Array)):
                    self._check_argument(i, argument, devices[d])
        outputs = handler_launches.run_on_stand_in(self, self._client, devices, arguments,
                                                   portable=not self._devices)
        for shard in arguments:  # consumed, as the launch here would have consumed them
            for i in self._donated:
                if i < len(shard) and isinstance(shard[i], Array):
                    shard[i].delete()
        return [[array_from_host(self._client, value, place,
                                 handles.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
                 for value in shard]
                for shard, place in zip(outputs, devices)]

    def _wrap_outputs(self, outputs, device_index: int, devices: tuple) -> list[Array]:
        client = self._client
        count = self._num_outputs
        base = device_index * count
        shapes, output_dtypes = self._output_shapes, self._output_dtypes
        if shapes is None:
            arrays = [array_from_buffer(client, outputs[base + i], devices)
                      for i in range(count)]
        else:
            handle, orders = self._handle, self._output_orders
            arrays = [_adopt(client, handle, [outputs[base + i]], devices, shapes[i],
                             output_dtypes[i], None, None, orders[i])
                      for i in range(count)]
        for i in self._dynamic_outputs:
            arrays[i] = unpadded(client, arrays[i])
        return arrays

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
        if outputs is None:  # the full path (pjrt._runtime.global_calls)
            launcher = self._launcher
            outputs = global_calls.execute_checked(launcher, self._client, arguments,
                                                   copy_host_values, self._check_count)
            if launcher.global_plan_wanted:
                global_calls.make_plan(launcher, self._client)
        return outputs

    def execute_laid_out(self, arguments: Sequence[Array]) -> list[Array] | None:
        """`execute_global` for the call made in loops: every argument a global Array whose
        shards sit on the executable's devices, in their order, with a sharding that lays it
        out as the parameter needs (the parameter's own, or one seen equivalent to it before).
        Returns the outputs, or None, having done nothing, when the call needs anything
        else (placing, resharding, host values, or the checks that word an error): then call
        `execute_global`. Available once `execute_global` has run once."""
        plan = self._launcher.global_plan
        if plan is not None and _tracing:  # a trace records the launch (see _tracing)
            return recorder.run_plan(self, plan, arguments, False)
        return plan.run(arguments, False) if plan is not None else None

    def __call__(self, *arguments: Array) -> list[Array]:
        return self.execute(arguments)

    def __repr__(self) -> str:
        devices = ", ".join(str(d) for d in self._devices)
        return f"LoadedExecutable(outputs={self._num_outputs}, devices=[{devices}])"


def _make_plan(client: "ClientView", launcher: Launcher, parameters: tuple,
               fixed: tuple) -> CallPlan:
    """The `CallPlan` of a single-device executable whose parameters and outputs are all
    known (see `_call_parameters`). It holds no reference to the executable, whose unloading
    it learns through ``live``."""
    handle, metadata = launcher.handle, launcher.metadata
    device = metadata.devices[0]
    donated = metadata.donated
    output_specs = metadata.output_specs
    assert output_specs is not None  # a plan is made only when the outputs are known
    make_call = functools.partial(new_call, handle, launcher.pointer, device.pointer,
                                  metadata.num_outputs, len(parameters), fixed)
    return CallPlan(handle, client, metadata.devices, Array, np.ndarray,
                    parameters, tuple(output_specs), donated,
                    call_hooks(handle, donated, make_call))
