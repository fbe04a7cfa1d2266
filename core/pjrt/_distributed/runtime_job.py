"""A job on XLA's coordination service: what ``initialize("host:port", n, i)`` sets up.

Process 0 starts the service ([`DistributedRuntimeService`][pjrt._distributed.coordination_server.DistributedRuntimeService])
on the bind address (``[::]:port`` by default, as jax does), every process connects a
[`DistributedRuntimeClient`][pjrt._distributed.coordination_client.DistributedRuntimeClient] to the coordinator's
address, and the client's key-value store becomes the job's store (`ServiceStore`), through
which the plugins' key-value callbacks go. The service itself refuses a second process with
an id, an id outside the job and a client of an earlier job; `join` adds the check that every
process counts the job alike.
"""
from __future__ import annotations

import atexit
import os
import re

from ..kv_store import JaxDistributedStore
from .coordination_client import DistributedRuntimeClient
from .coordination_server import DistributedRuntimeService

#: jax's defaults for a job on the coordination service (seconds).
HEARTBEAT_TIMEOUT_SECONDS = 100.0
SHUTDOWN_TIMEOUT_SECONDS = 300.0

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
    process), so the job's failures need no polling of their own (``reports_failures``).
    """

    reports_failures = True

    def __init__(self, client: DistributedRuntimeClient):
        super().__init__(client)
        self.client = client

    def __repr__(self) -> str:
        return f"ServiceStore({self.client.address!r}, process {self.client.node_id})"


def join(address: str, num_processes: int, process_id: int, *, bind_address: str | None,
         timeout: float, heartbeat_timeout: float | None, shutdown_timeout: float | None
         ) -> tuple[ServiceStore, DistributedRuntimeClient, DistributedRuntimeService | None]:
    """Start the service (process 0, on ``bind_address``, else
    ``JAX_COORDINATOR_BIND_ADDRESS``, else every interface), connect this process, and check
    that every process counts the job alike.

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
        service = DistributedRuntimeService(bind_address or default_bind_address(address),
                                            num_processes, heartbeat_timeout=heartbeat_timeout,
                                            cluster_register_timeout=timeout,
                                            shutdown_timeout=shutdown_timeout)
    client = DistributedRuntimeClient(address, process_id, init_timeout=timeout,
                                      heartbeat_timeout=heartbeat_timeout,
                                      shutdown_timeout=shutdown_timeout,
                                      shutdown_on_destruction=False)
    try:
        client.connect()
        # Every process says how many it counts, then reads what all said: a process started
        # for fewer processes than process 0 joins the service, and is told here, as are all.
        client.key_value_set(f"pjrt/job/size/{process_id}", str(num_processes))
        client.wait_at_barrier("pjrt/job/joined", int(timeout * 1000))
        counts = {int(key.rsplit("/", 1)[1]): int(value)
                  for key, value in client.key_value_dir_get("pjrt/job/size")}
        if len(set(counts.values())) > 1:
            said = ", ".join(f"process {i}: {n}" for i, n in sorted(counts.items()))
            raise RuntimeError(f"the processes disagree on the size of the job ({said}); "
                               f"start every process with the same number of processes")
    except BaseException:
        client.close()  # the client never joined: no barrier to pass
        if service is not None:
            service.shutdown()
        raise
    # A process that exits without shutdown() disconnects without the barrier (the others
    # see it lost at their next wait), and process 0's service stops.
    atexit.register(_at_exit, client, service)
    return ServiceStore(client), client, service


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
