"""``pjrt.compile``: compile a StableHLO program and call it like a function."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .array import Array
from .client import Client
from .device import Device
from .executable import LoadedExecutable


class CompiledProgram:
    """A compiled program that takes numpy arrays or pjrt Arrays and returns Arrays.

    Calling it places host arguments on the program's device, runs it, and returns a single
    Array for a one-output program and a tuple of Arrays otherwise.
    """

    def __init__(self, executable: LoadedExecutable):
        self.executable = executable
        self._device = executable.local_devices()[0] if len(executable.local_devices()) == 1 else None

    @property
    def devices(self) -> list[Device]:
        return self.executable.local_devices()

    def __call__(self, *arguments):
        device = self._device
        if device is None:
            raise NotImplementedError("calling a multi-device program with whole arrays needs "
                                      "shardings; use executable.execute_sharded with per-device "
                                      "Arrays")
        placed = []
        client = device.client
        for argument in arguments:
            if isinstance(argument, Array):
                if argument._devices[0] is not device and not argument.is_deleted():
                    argument = argument.copy_to_device(device)
            else:
                argument = client.buffer_from_pyval(np.asarray(argument), device)
            placed.append(argument)
        outputs = self.executable.execute(placed)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __repr__(self) -> str:
        return f"CompiledProgram({self.executable!r})"


def compile(program: str | bytes, devices: Sequence[Device] | Device | None = None,
            compile_options=None, *, client: Client | None = None) -> CompiledProgram:
    """Compile a StableHLO program (text or bytecode) for ``devices``.

    Args:
      program: StableHLO as MLIR text or bytecode.
      devices: a device, or a list of devices (several: an SPMD program over them); the
        default backend's first device when None.
      compile_options: optional :class:`~pjrt.compile_options.CompileOptions`.
      client: the client to compile with; taken from ``devices`` or the default backend.

    Returns:
      A :class:`CompiledProgram`.
    """
    if isinstance(devices, Device):
        devices = [devices]
    if client is None:
        if devices:
            client = devices[0].client
        else:
            from .registry import get_backend

            client = get_backend()
    executable = client.compile_and_load(program, list(devices) if devices else None,
                                         compile_options)
    return CompiledProgram(executable)
