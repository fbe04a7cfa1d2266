"""jax's questions about hosts and backends, answered from the registry's clients.

"Host" here is jax's older word for a process of a job (``jax.host_id`` is
``jax.process_index``): the module keeps that word because its functions are jax's, under
jax's names, and a jax user looks for them by it. Nothing here is about host memory.

``host_id``/``host_ids``/``host_count`` are jax's older names for process indices and counts;
``get_device_backend`` finds the client of a device; ``using_pjrt_c_api`` says whether a backend
is driven through the PJRT C API (always, in pjrt). Each takes a platform name, a Client, or
None for the default backend, as jax's functions do.
"""
from __future__ import annotations

from typing import cast

from .client import Client
from .device import Device
from .registry import get_backend, process_count, process_index

__all__ = ["host_id", "host_ids", "host_count", "using_pjrt_c_api", "get_device_backend"]


def host_id(backend: str | Client | None = None) -> int:
    """This process's index (jax's older name for `process_index`)."""
    return process_index(backend)


def host_ids(backend: str | Client | None = None) -> list[int]:
    """The process indices of every device of the backend, sorted."""
    return sorted({d.process_index for d in get_backend(backend).devices()})


def host_count(backend: str | Client | None = None) -> int:
    """The number of processes (jax's older name for `process_count`)."""
    return process_count(backend)


def using_pjrt_c_api(backend: str | Client | None = None) -> bool:
    """Whether the backend is driven through the PJRT C API: always True in pjrt (the backend
    is still brought up, so that an unknown platform raises as in jax)."""
    get_backend(backend)
    return True


def get_device_backend(device: Device | None = None) -> Client:
    """The client that ``device`` belongs to (the default backend when None).

    Raises:
      TypeError: ``device`` is not a pjrt Device.
    """
    if device is None:
        return get_backend()
    if not isinstance(device, Device):
        raise TypeError(f"get_device_backend takes a pjrt Device, not {type(device).__name__}")
    # (the layers below the client type it as a ClientView; a Device's client is a Client)
    return cast(Client, device.client)
