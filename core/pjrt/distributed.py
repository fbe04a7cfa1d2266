"""Running one program over several processes: ``pjrt.distributed.initialize``.

Each process calls :func:`initialize` once, before creating clients, with the same
coordinator, the number of processes and its own id. From then on every client made through
the registry (``pjrt.devices()``, ``pjrt.get_backend()``...) or by ``make_c_api_client`` is a
multi-process client: its plugin gets the key-value callbacks and the create options
``node_id`` and ``num_nodes`` (to plugins that declare them), exchanges its topology with the
other processes, and lists every process's devices. Devices of other processes are
non-addressable (``device.is_addressable`` is False, ``device.process_index`` says whose).

The coordinator names a key-value store (see :mod:`pjrt.kv_store`):

* ``sqlite:///path/job.db`` or a plain file path: a SQLite file all processes of one machine
  open (what ``pjrt launch`` uses); use a new file for each job.
* ``redis://host:port/db``: a Redis server, for processes on several machines.
* ``jax``: jax's coordination service, after ``jax.distributed.initialize`` in this process.
* or a :class:`~pjrt.kv_store.KeyValueStore` object.

Environment fallbacks, read when an argument is None (``pjrt launch`` sets them):

* ``PJRT_COORDINATOR``: the coordinator.
* ``PJRT_NUM_PROCESSES``: the number of processes.
* ``PJRT_PROCESS_ID``: this process's id, 0 to ``num_processes - 1``.
* ``PJRT_LOCAL_DEVICE_IDS``: comma-separated local device numbers this process uses (passed
  as ``visible_devices`` to plugins that declare it).
* ``PJRT_DISTRIBUTED_TIMEOUT``: seconds to wait for the other processes (default 300).
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .kv_store import KeyValueStore

__all__ = ["initialize", "shutdown", "is_initialized", "global_state", "DistributedState",
           "COORDINATOR_ENV", "NUM_PROCESSES_ENV", "PROCESS_ID_ENV", "LOCAL_DEVICE_IDS_ENV",
           "TIMEOUT_ENV", "open_store", "next_client_prefix"]

COORDINATOR_ENV = "PJRT_COORDINATOR"
NUM_PROCESSES_ENV = "PJRT_NUM_PROCESSES"
PROCESS_ID_ENV = "PJRT_PROCESS_ID"
LOCAL_DEVICE_IDS_ENV = "PJRT_LOCAL_DEVICE_IDS"
TIMEOUT_ENV = "PJRT_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 300.0


class DistributedState:
    """What :func:`initialize` set up for this process.

    Attributes:
      store: the shared key-value store (None before :func:`initialize`).
      coordinator: how it was named.
      num_processes: processes in the job.
      process_id: this process's id.
      local_device_ids: the local devices this process uses, or None for all.
      timeout: seconds to wait for the other processes.
      generation: how many times this process initialised (names its barriers, which are
        used once).
      client_counts: plugin name -> clients made with this store so far (names each client's
        key prefix).
      owns_store: whether this module opened the store (closed by shutdown); a store passed
        in belongs to its caller.
    """

    # A plain class, not a dataclass: client creation reads it, and start-up stays light.
    def __init__(self, store: "KeyValueStore | None" = None, coordinator: object = None,
                 num_processes: int = 1, process_id: int = 0,
                 local_device_ids: tuple[int, ...] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, generation: int = 0,
                 client_counts: dict | None = None, owns_store: bool = False):
        self.store = store
        self.coordinator = coordinator
        self.num_processes = num_processes
        self.process_id = process_id
        self.local_device_ids = local_device_ids
        self.timeout = timeout
        self.generation = generation
        self.client_counts = {} if client_counts is None else client_counts
        self.owns_store = owns_store

    def __repr__(self) -> str:
        return (f"DistributedState(num_processes={self.num_processes}, "
                f"process_id={self.process_id}, coordinator={self.coordinator!r})")


#: The state of this process; read it, change it only through initialize/shutdown.
global_state = DistributedState()
_lock = threading.Lock()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _env_device_ids() -> tuple[int, ...] | None:
    value = os.environ.get(LOCAL_DEVICE_IDS_ENV, "").strip()
    if not value:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"{LOCAL_DEVICE_IDS_ENV}={value!r}: write comma-separated device "
                         f"numbers such as 0,1") from None


def open_store(coordinator) -> tuple["KeyValueStore", bool]:
    """The store ``coordinator`` names (see the module docstring), and whether it was opened
    here (and so is closed by :func:`shutdown`).

    Raises:
      ValueError: the coordinator names no kind of store pjrt knows.
    """
    # Imported here: a process that never spans processes never loads sqlite3 or redis.
    from .kv_store import RedisStore, SQLiteStore, as_store

    if not isinstance(coordinator, (str, os.PathLike)):
        return as_store(coordinator), False
    text = os.fspath(coordinator)
    if text.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(text), True
    if text == "jax":
        from .kv_store import JaxDistributedStore

        return JaxDistributedStore(), False
    if text.startswith("sqlite://"):
        text = text[len("sqlite://"):]
    if not text or "://" in text:
        raise ValueError(f"coordinator {os.fspath(coordinator)!r} names no store pjrt knows; "
                         f"give sqlite:///path/to/job.db, a file path, redis://host:port/db, "
                         f"or jax")
    return SQLiteStore(text), True


def initialize(coordinator=None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: Sequence[int] | None = None,
               timeout: float | None = None) -> None:
    """Join this process to a job of ``num_processes`` processes sharing ``coordinator``.

    Call it once in each process, before creating clients (clients made earlier stay
    single-process). It waits until every process has joined.

    Args:
      coordinator: the key-value store (see the module docstring); ``PJRT_COORDINATOR``
        when None.
      num_processes: ``PJRT_NUM_PROCESSES`` when None.
      process_id: this process's id, 0 to num_processes - 1; ``PJRT_PROCESS_ID`` when None.
      local_device_ids: local device numbers this process uses (plugins that declare
        ``visible_devices`` get them); ``PJRT_LOCAL_DEVICE_IDS`` when None.
      timeout: seconds to wait for the other processes; ``PJRT_DISTRIBUTED_TIMEOUT`` or 300.

    Raises:
      RuntimeError: already initialised (call :func:`shutdown` first).
      ValueError: an argument is missing (and its variable unset) or out of range.
      TimeoutError: not every process joined within ``timeout``.
    """
    if coordinator is None:
        coordinator = os.environ.get(COORDINATOR_ENV, "").strip() or None
    if num_processes is None:
        num_processes = _env_int(NUM_PROCESSES_ENV)
    if process_id is None:
        process_id = _env_int(PROCESS_ID_ENV)
    if local_device_ids is None:
        local_device_ids = _env_device_ids()
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV, "").strip() or DEFAULT_TIMEOUT_SECONDS)
    missing = [f"{what} (or {variable})" for what, value, variable in (
        ("coordinator", coordinator, COORDINATOR_ENV),
        ("num_processes", num_processes, NUM_PROCESSES_ENV),
        ("process_id", process_id, PROCESS_ID_ENV)) if value is None]
    if missing:
        raise ValueError(f"pjrt.distributed.initialize needs {', '.join(missing)}; or start "
                         f"the processes with `pjrt launch -n N script.py`")
    assert num_processes is not None and process_id is not None  # `missing` was empty
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, not {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is outside 0..{num_processes - 1} for "
                         f"{num_processes} processes")
    with _lock:
        if global_state.store is not None:
            raise RuntimeError("pjrt.distributed.initialize was already called in this "
                               "process; call pjrt.distributed.shutdown() first")
        store, owned = open_store(coordinator)
        generation = global_state.generation + 1
        try:
            store.barrier(f"pjrt/initialize/{generation}", process_id, num_processes, timeout)
        except BaseException:
            if owned and hasattr(store, "close"):
                store.close()  # pyright: ignore[reportAttributeAccessIssue]  (hasattr above)
            raise
        global_state.store = store
        global_state.owns_store = owned
        global_state.coordinator = coordinator
        global_state.num_processes = num_processes
        global_state.process_id = process_id
        global_state.local_device_ids = (tuple(int(i) for i in local_device_ids)
                                         if local_device_ids is not None else None)
        global_state.timeout = float(timeout)
        global_state.generation = generation
        global_state.client_counts = {}


def is_initialized() -> bool:
    """Whether :func:`initialize` was called (and :func:`shutdown` not since)."""
    return global_state.store is not None


def shutdown(*, wait: bool = True) -> None:
    """Leave the job: wait (with ``wait``) until every process got here, so that none exits
    while another still reads the store, then close a store :func:`initialize` opened.

    Clients made while initialised keep working on what they hold; new clients are
    single-process. Does nothing when not initialised.

    Raises:
      TimeoutError: with ``wait``, another process did not reach shutdown in time (the
        state is reset all the same).
    """
    with _lock:
        store = global_state.store
        if store is None:
            return
        try:
            if wait:
                store.barrier(f"pjrt/shutdown/{global_state.generation}",
                              global_state.process_id, global_state.num_processes,
                              global_state.timeout)
        finally:
            if global_state.owns_store and hasattr(store, "close"):
                store.close()  # pyright: ignore[reportAttributeAccessIssue]  (hasattr above)
            global_state.store = None
            global_state.owns_store = False
            global_state.num_processes = 1
            global_state.process_id = 0
            global_state.local_device_ids = None


def next_client_prefix(platform: str) -> str:
    """The key prefix of the next client of ``platform``: the k-th client a process makes
    pairs with the k-th of every other process, so each process must make its clients of a
    platform in the same order (as jax does)."""
    with _lock:
        count = global_state.client_counts.get(platform, 0)
        global_state.client_counts[platform] = count + 1
    return f"pjrt/{platform}/{count}/"

