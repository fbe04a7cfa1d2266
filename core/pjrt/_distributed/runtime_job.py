"""A job on XLA's coordination service: what ``initialize("host:port", n, i)`` sets up.

Process 0 starts the service ([`DistributedRuntimeService`][pjrt._distributed.coordination_server.DistributedRuntimeService])
on the bind address (``[::]:port`` by default, as jax does), every process connects a
[`DistributedRuntimeClient`][pjrt._distributed.coordination_client.DistributedRuntimeClient] to the coordinator's
address, and the client's key-value store becomes the job's store (`ServiceStore`), through
which the plugins' key-value callbacks go. The service itself refuses a second process with
an id, an id outside the job and a client of an earlier job; `join` adds the check that a
process counts the job as process 0 does (process 0's service holds its count from the start).
A job is the coordination protocol and nothing more, so jax's processes
(``jax.distributed.initialize``) and pjrt's can make up one job, whichever started the service.
"""
from __future__ import annotations

import atexit
import os
import re
import time

from ..kv_store import JaxDistributedStore
from .coordination_client import DistributedRuntimeClient
from .coordination_errors import DistributedRuntimeError, DistributedTimeoutError
from .coordination_server import DistributedRuntimeService

#: jax's defaults for a job on the coordination service (seconds).
HEARTBEAT_TIMEOUT_SECONDS = 100.0
SHUTDOWN_TIMEOUT_SECONDS = 300.0

#: Where process 0's service holds the number of processes it was started for.
_SIZE_KEY = "pjrt/job/num_processes"

#: ``host:port``, ``[v6 address]:port``: a coordinator that is an address, never a file name.
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.%a-zA-Z]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def is_address(text: str) -> bool:
    """Whether ``text`` is ``host:port`` (the coordination service's address)."""
    match = _ADDRESS.match(text)
    return match is not None and 0 < int(match.group(2)) < 65536


def default_bind_address(address: str) -> str:
    """Where process 0's service listens when not told: every interface, the same port."""
    return "[::]:" + address.rsplit(":", 1)[1]


class ServiceStore(JaxDistributedStore):
    """The job's key-value store on the coordination service, through this process's client.

    A blocking get ends with the job's error as soon as the service reports one (a lost
    process), or, looking once a second, when a process of the job recorded why it stopped
    under ``failure_key``; the job needs no polling of its own (``reports_failures``).
    """

    reports_failures = True

    def __init__(self, client: DistributedRuntimeClient, failure_key: str):
        super().__init__(client)
        self.client = client
        self.failure_key = failure_key

    def get(self, key: str, timeout: float) -> bytes:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                return self.client.blocking_key_value_get_bytes(
                    key, int(max(0.0, min(left, 1.0)) * 1000))
            except DistributedTimeoutError:
                if left <= 1.0:
                    raise TimeoutError(f"key {key!r} was not set by another process within "
                                       f"{timeout:g} s") from None
            failure = self.try_get(self.failure_key)
            if failure is not None:
                raise RuntimeError(f"the job was stopped by another of its processes: "
                                   f"{failure.decode('utf-8', 'replace')}")

    def __repr__(self) -> str:
        return f"ServiceStore({self.client.address!r}, process {self.client.node_id})"


def join(address: str, num_processes: int, process_id: int, *, bind_address: str | None,
         timeout: float, heartbeat_timeout: float | None, shutdown_timeout: float | None,
         failure_key: str
         ) -> tuple[ServiceStore, DistributedRuntimeClient, DistributedRuntimeService | None]:
    """Start the service (process 0, on ``bind_address``, else
    ``JAX_COORDINATOR_BIND_ADDRESS``, else every interface), connect this process, and check
    that every process counts the job alike. A refusal is recorded under ``failure_key``,
    where the others' gets (and client creation) find it.

    Raises:
      ValueError: ``process_id`` is outside the job.
      OSError: process 0 cannot listen on the bind address (the port is in use).
      DistributedRuntimeError: the service refused this process, or the job did not form
        within ``timeout`` (a `TimeoutError` then).
      RuntimeError: the processes disagree on the number of processes (in every process).
    """
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is outside 0..{num_processes - 1} for a job "
                         f"of {num_processes} processes; give each process its own id from 0 "
                         f"to {num_processes - 1}")
    if bind_address is None:
        bind_address = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", "").strip() or None
    heartbeat_timeout = float(HEARTBEAT_TIMEOUT_SECONDS if heartbeat_timeout is None
                              else heartbeat_timeout)
    shutdown_timeout = float(SHUTDOWN_TIMEOUT_SECONDS if shutdown_timeout is None
                             else shutdown_timeout)
    service = None
    if process_id == 0:
        service = DistributedRuntimeService(
            bind_address or default_bind_address(address), num_processes,
            heartbeat_timeout=heartbeat_timeout, cluster_register_timeout=timeout,
            shutdown_timeout=shutdown_timeout,
            initial_values={_SIZE_KEY: str(num_processes).encode()})
    client = DistributedRuntimeClient(address, process_id, init_timeout=timeout,
                                      heartbeat_timeout=heartbeat_timeout,
                                      shutdown_timeout=shutdown_timeout,
                                      shutdown_on_destruction=False)
    try:
        client.connect()
        # A process started for fewer processes than process 0 joins the service: it is told
        # here (the others see it lost once it has gone). Absent: jax's process 0.
        try:
            counted = int(client.key_value_try_get(_SIZE_KEY))
        except DistributedRuntimeError:
            counted = num_processes
        if counted != num_processes:
            message = (f"the processes disagree on the size of the job (process 0: {counted}, "
                       f"process {process_id}: {num_processes}); start every process with the "
                       f"same number of processes")
            client.key_value_set(failure_key, message, allow_overwrite=True)
            raise RuntimeError(message)
    except BaseException:
        client.close()  # the client never joined: no barrier to pass
        if service is not None:
            service.shutdown()
        raise
    # A process that exits without shutdown() disconnects without the barrier (the others
    # see it lost at their next wait), and process 0's service stops.
    atexit.register(_at_exit, client, service)
    return ServiceStore(client, failure_key), client, service


def _at_exit(client: DistributedRuntimeClient, service: DistributedRuntimeService | None) -> None:
    client.close()
    if service is not None:
        service.shutdown()


def leave(client: DistributedRuntimeClient, service: DistributedRuntimeService | None,
          wait: bool) -> None:
    """Pass the shutdown barrier (with ``wait``), disconnect, and stop process 0's service."""
    atexit.unregister(_at_exit)
    try:
        if wait:
            client.shutdown()
    finally:
        client.close()  # idempotent after shutdown
        if service is not None:
            service.shutdown()
