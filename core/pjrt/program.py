"""``pjrt.compile``: compile a StableHLO program and call it like a function.

One device: arguments are placed on it. Several devices (a list or a `Mesh`): the program
is compiled as an SPMD program over them and called with global arrays, each placed or
resharded to the layout the compiled program expects; with ``replicated=True`` one copy runs per
device on its slice of the leading axis, and the outputs are stacked.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .array import Array
from ._compile.pipeline import compile_program
# What crash-isolated compilation raises (``isolate=True``): re-exported, their public home.
from ._compile.isolated_compile import (IsolatedCompileCrash as IsolatedCompileCrash,
                                        IsolatedCompileTimeout as IsolatedCompileTimeout)
from ._compile.program_facts import read_program
from .client import Client
from .device import ClientView, Device
from .errors import DeviceAssignmentMismatchError
from .transfers import device_put, in_default_memory, is_placed_as
from .array import check_device_sets
from .executable import LoadedExecutable

if TYPE_CHECKING:
    from .compile_options import CompileOptions
    from .mesh import Mesh


class CompiledProgram:
    """A compiled program that takes numpy arrays or pjrt Arrays and returns Arrays.

    It returns a single Array for a one-output program and a tuple of Arrays otherwise.
    """

    def __init__(self, executable: LoadedExecutable, *, platform_index: int | None = None):
        self.executable = executable
        devices = executable.global_devices()
        self._device = devices[0] if len(devices) == 1 else None
        #: Per parameter, whether a host value is copied by the call itself (see _place_global).
        self._copied_by_call: tuple | None = None
        #: The platform index a multi-platform jax export takes first, supplied when the
        #: caller leaves it out; None for other programs.
        self.platform_index = platform_index
        self._index_argument = None
        if platform_index is not None:
            shapes = executable.input_shapes
            self._index_argument = np.array(platform_index, np.int32)
            self._parameter_count = len(shapes) if shapes is not None else None

    @property
    def devices(self) -> list[Device]:
        return self.executable.local_devices()

    @property
    def input_shardings(self) -> tuple:
        return self.executable.input_shardings

    @property
    def output_shardings(self) -> tuple:
        return self.executable.output_shardings

    def __call__(self, *arguments: Any) -> Any:
        """Run the program: one [`Array`][pjrt.array.Array] for a program with one output, else a tuple.

        (Typed ``Any``: which of the two depends on the program, known only when compiled.)
        """
        if self._index_argument is not None and len(arguments) != self._parameter_count:
            arguments = (self._index_argument, *arguments)
        if self._device is not None:
            try:
                outputs = self.executable.execute(arguments, copy_host_values=True)
            except ValueError:
                mismatch = self._device_mismatch(arguments)  # the clearer message, if the cause
                if mismatch is None:
                    raise
                raise mismatch from None
        else:
            outputs = self.executable.execute_laid_out(arguments)
            if outputs is None:
                outputs = self.executable.execute_global(self._place_global(arguments),
                                                         copy_host_values=True)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _device_mismatch(self, arguments) -> DeviceAssignmentMismatchError | None:
        device = self._device
        for i, argument in enumerate(arguments):
            if (isinstance(argument, Array) and argument.shard_devices != (device,)
                    and not argument.is_deleted()):
                return DeviceAssignmentMismatchError(
                    f"the program runs on {device}, but argument {i} is on "
                    f"{', '.join(map(str, argument.shard_devices))}; move it with "
                    f"pjrt.device_put(x, {device}) first")
        return None

    def _place_global(self, arguments) -> list:
        shardings = self.executable.input_shardings
        if len(arguments) != len(shardings):
            raise TypeError(f"the program takes {len(shardings)} arguments, "
                            f"{len(arguments)} were given")
        # Arrays laid out as the parameters are (with these very shardings, or equivalent
        # ones) go as they are: the usual call, checked with no set or memory lookups.
        for argument, sharding in zip(arguments, shardings):
            if type(argument) is not Array or not is_placed_as(argument, sharding):
                break
        else:
            return list(arguments)
        check_device_sets(arguments, tuple(self.devices), host_values_allowed=True)
        # Host values bound for the devices' default memory are copied by the call itself;
        # the rest (Arrays to reshard, values for another memory kind) are placed first.
        direct = self._copied_by_call
        if direct is None:
            direct = self._copied_by_call = tuple(map(in_default_memory, shardings))
        return [a if ok and not isinstance(a, Array)
                else device_put(a if isinstance(a, Array) else np.asarray(a), s)
                for a, s, ok in zip(arguments, shardings, direct)]

    def __repr__(self) -> str:
        return f"CompiledProgram({self.executable!r})"


def compile(program: str | bytes, devices: Device | Sequence[Device] | Mesh | None = None,
            compile_options: CompileOptions | None = None, *,
            client: Client | None = None, replicated: bool = False,
            platform_index: int | None = None, isolate: bool | None = None) -> CompiledProgram:
    """Compile a StableHLO program (text or bytecode) for ``devices``.

    Args:
      program: StableHLO as MLIR text or bytecode.
      devices: a Device, a list of Devices, or a [`Mesh`][pjrt.sharding.Mesh] (its devices in
        mesh order); several make an SPMD program over them. The default backend's first
        device when None.
      compile_options: optional [`CompileOptions`][pjrt.compile_options.CompileOptions].
      client: the client to compile with; taken from ``devices`` or the default backend.
      replicated: with several devices, run one copy per device on its slice of the leading
        axis (pmap-style) instead of partitioning the program.
      platform_index: for a module ``jax.export`` lowered for several platforms (its
        ``main`` takes first ``tensor<i32> {jax.global_constant = "_platform_index"}``):
        the index of the platform it runs on in the export's ``platforms`` tuple, passed for
        the caller. A raw module does not record that tuple, so the default is 0, the first
        platform listed (jax's ``platforms=`` order); a caller may still pass the index
        itself as the first argument. [`pjrt.exported.deserialize_exported`][pjrt.exported.deserialize_exported] reads the
        tuple and chooses the index itself.
      isolate: compile in a worker process first, so that a compiler crash on a damaged or
        hostile program is an error ([`IsolatedCompileCrash`][pjrt.program.IsolatedCompileCrash])
        instead of the end of this process; costs a second compile (see the API reference's
        crash isolation section). None: as the ``PJRT_ISOLATED_COMPILE`` environment variable
        says.

    Returns:
      A [`CompiledProgram`][pjrt.program.CompiledProgram].

    Raises:
      ValueError: ``platform_index`` is given for a program that takes none, or is
        negative; the program calls jax host callbacks or has symbolic shapes (see
        `pjrt._compile.pipeline`).
    """
    from .sharding import Mesh

    facts = read_program(program)  # the one reading of the program, used by all that follows
    if platform_index is not None:
        if not facts.takes_platform_index:
            raise ValueError("platform_index was given, but the program's main takes no "
                             "platform index (it was not exported for several platforms)")
        if int(platform_index) < 0:
            raise ValueError(f"platform_index must be >= 0, got {platform_index}")

    if isinstance(devices, Device):
        devices = [devices]
    elif isinstance(devices, Mesh):
        devices = list(devices.devices.flat)
    elif devices is not None:
        devices = list(devices)
    owner: ClientView | None = client
    if owner is None:
        if devices:
            owner = devices[0].client
        else:
            from .registry import get_backend

            owner = get_backend()
    # The compile behind Client.compile_and_load, given the program already read.
    executable = compile_program(owner, facts, devices or None, compile_options,
                                 replicated=replicated, isolate=isolate)
    return CompiledProgram(
        executable,
        platform_index=(int(platform_index or 0) if facts.takes_platform_index else None))
