"""Create options for the CUDA plugin's client, read from the environment.

The variables are the ones JAX users already set (``XLA_PYTHON_CLIENT_*``), so a process
configured for JAX gets the same GPU memory behaviour from pjrt. Each is parsed strictly: a
value the plugin would misread is a ValueError that names the variable, raised before the
plugin sees anything.
"""
from __future__ import annotations

import os
from typing import Mapping

ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
MEMORY_FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
#: JAX's older name for XLA_CLIENT_MEM_FRACTION; still honoured, but not both at once.
LEGACY_MEMORY_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
COLLECTIVE_MEMORY_ENV = "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB"
#: Like CUDA_VISIBLE_DEVICES, but read by pjrt alone: "all" or "0,2". Device numbers are the
#: ones CUDA reports after CUDA_VISIBLE_DEVICES has been applied.
VISIBLE_DEVICES_ENV = "PJRT_CUDA_VISIBLE_DEVICES"

#: Create options the CUDA plugin reads, declared to pjrt (``Plugin.option_types``): with
#: ``node_id`` and ``num_nodes`` declared, pjrt lets the plugin join a job of several
#: processes (see ``pjrt.distributed``) and passes it ``visible_devices`` from
#: ``PJRT_LOCAL_DEVICE_IDS``.
OPTION_TYPES = {"node_id": int, "num_nodes": int, "visible_devices": list,
                "allowed_devices": list, "platform_name": str, "allocator": str,
                "memory_fraction": float, "preallocate": bool, "collective_memory_size": int,
                "enable_mock_nccl": bool, "mock_gpu_topology": str}

#: The allocators jax-cuda12-pjrt 0.10.2 accepts (its own error message lists them).
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _memory_fraction(environ: Mapping[str, str]) -> float | None:
    current, legacy = _get(environ, MEMORY_FRACTION_ENV), _get(environ, LEGACY_MEMORY_FRACTION_ENV)
    if current and legacy:
        # Two answers to one question: refuse rather than pick one silently.
        raise ValueError(f"both {MEMORY_FRACTION_ENV} and {LEGACY_MEMORY_FRACTION_ENV} are set; "
                         f"keep {MEMORY_FRACTION_ENV} and unset {LEGACY_MEMORY_FRACTION_ENV}, "
                         f"its deprecated name")
    name, value = (MEMORY_FRACTION_ENV, current) if current else (LEGACY_MEMORY_FRACTION_ENV, legacy)
    if not value:
        return None
    try:
        fraction = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number; give the fraction of GPU memory "
                         f"to use, e.g. 0.75") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{name}={value!r} is out of range; the fraction of GPU memory must be "
                         f"greater than 0 and at most 1")
    return fraction


def _preallocate(environ: Mapping[str, str]) -> bool | None:
    value = _get(environ, PREALLOCATE_ENV)
    if not value:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{PREALLOCATE_ENV}={value!r} is not a boolean; use true or false")


def _collective_memory_bytes(environ: Mapping[str, str]) -> int | None:
    value = _get(environ, COLLECTIVE_MEMORY_ENV)
    if not value:
        return None
    try:
        megabytes = int(value)
    except ValueError:
        raise ValueError(f"{COLLECTIVE_MEMORY_ENV}={value!r} is not a whole number of "
                         f"megabytes") from None
    if megabytes < 0:
        raise ValueError(f"{COLLECTIVE_MEMORY_ENV}={value!r} is negative")
    return megabytes * (1 << 20)


def parse_visible_devices(value: str | None, variable: str = VISIBLE_DEVICES_ENV) -> list[int] | None:
    """``"all"`` or empty -> None (every device); ``"0,2"`` -> ``[0, 2]``.

    Raises:
      ValueError: an entry is not a non-negative integer, or one is repeated; the message
        names ``variable``.
    """
    value = (value or "").strip()
    if not value or value.lower() == "all":
        return None
    devices = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"{variable}={value!r}: {part!r} is not a device number; write "
                             f"\"all\" or comma-separated device numbers such as \"0,1\"")
        device = int(part)
        if device in devices:
            raise ValueError(f"{variable}={value!r} lists device {device} twice")
        devices.append(device)
    return devices


def generate_pjrt_gpu_plugin_options(environ: Mapping[str, str] | None = None) -> dict:
    """The CUDA client's create options, from the environment.

    Reads XLA_PYTHON_CLIENT_ALLOCATOR (-> ``allocator``), XLA_CLIENT_MEM_FRACTION or its old
    name XLA_PYTHON_CLIENT_MEM_FRACTION (-> ``memory_fraction``, a float),
    XLA_PYTHON_CLIENT_PREALLOCATE (-> ``preallocate``, a bool),
    XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB (-> ``collective_memory_size``, in bytes) and
    PJRT_CUDA_VISIBLE_DEVICES (-> ``visible_devices``, a list of ints). Unset variables leave
    the plugin's defaults alone; ``platform_name`` and ``allocator`` are always present.

    Args:
      environ: the variables to read (``os.environ`` when None).

    Raises:
      ValueError: a variable has a value the plugin cannot take; the message names it.
    """
    environ = os.environ if environ is None else environ
    options: dict = {"platform_name": "cuda"}
    allocator = _get(environ, ALLOCATOR_ENV).lower() or "default"
    if allocator not in ALLOCATORS:
        raise ValueError(f"{ALLOCATOR_ENV}={environ.get(ALLOCATOR_ENV)!r} is not an allocator the "
                         f"CUDA plugin knows; use one of {', '.join(ALLOCATORS)}")
    options["allocator"] = allocator
    fraction = _memory_fraction(environ)
    if fraction is not None:
        options["memory_fraction"] = fraction
    preallocate = _preallocate(environ)
    if preallocate is not None:
        options["preallocate"] = preallocate
    collective = _collective_memory_bytes(environ)
    if collective is not None:
        options["collective_memory_size"] = collective
    visible = parse_visible_devices(environ.get(VISIBLE_DEVICES_ENV))
    if visible is not None:
        options["visible_devices"] = visible
    return options
