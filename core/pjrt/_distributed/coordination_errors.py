"""The errors of the distributed runtime (`pjrt.xla_client.DistributedRuntimeClient`).

Each is an [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError] whose text starts with the status
code, as jaxlib's are (``"DEADLINE_EXCEEDED: Barrier timed out..."``); a wait that ran out of
time is also a `TimeoutError`, and the loss of another process of the job names it in
``lost_process``.
"""
from __future__ import annotations

from ..errors import ErrorCode, XlaRuntimeError


class DistributedRuntimeError(XlaRuntimeError):
    """An error of the coordination service or of the way to it.

    Attributes:
      code: the [`ErrorCode`][pjrt.errors.ErrorCode] (gRPC's status codes).
      lost_process: the id of the process whose loss caused it (it stopped sending
        heartbeats, or restarted), or None.
    """

    def __init__(self, code: ErrorCode | int, message: str, lost_process: int | None = None):
        super().__init__(code, message)
        self.lost_process = lost_process


class DistributedTimeoutError(DistributedRuntimeError, TimeoutError):
    """A wait of the distributed runtime ran out of time (``DEADLINE_EXCEEDED``)."""


def make_error(code: ErrorCode | int, message: str,
               lost_process: int | None = None) -> DistributedRuntimeError:
    """The error of ``code``: a `DistributedTimeoutError` for ``DEADLINE_EXCEEDED``."""
    cls = DistributedTimeoutError if int(code) == ErrorCode.DEADLINE_EXCEEDED else \
        DistributedRuntimeError
    return cls(code, message, lost_process)
