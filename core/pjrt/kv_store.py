"""Key-value stores that processes of one multi-process client share.

A plugin that spans processes (NVIDIA's, for one) exchanges its topology, and later the ids of
its collective communicators, through a key-value store its host provides: the host hands it
three callbacks (put, blocking get, try-get; see `pjrt._distributed.kv_callbacks`) that end in one of
these stores. Every store here keeps its data in an engine others maintain:

* [`SQLiteStore`][pjrt.kv_store.SQLiteStore]: a SQLite file (WAL mode) that processes on one machine open together;
  needs no server, so it is the default for ``pjrt launch`` and single-machine tests.
* [`RedisStore`][pjrt.kv_store.RedisStore]: a Redis server (``redis-py``, installed with ``pip install pjrt[redis]``)
  for processes on several machines.
* [`JaxDistributedStore`][pjrt.kv_store.JaxDistributedStore]: jax's own coordination service, for a process that already
  ran ``jax.distributed.initialize``.

All stores are safe to call from many threads at once (plugins call from their own threads)
and hold bytes. Keys are strings.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Callable, Protocol, runtime_checkable

__all__ = ["KeyValueStore", "SQLiteStore", "RedisStore", "JaxDistributedStore", "PrefixedStore",
           "as_store", "wait_for", "claim"]


@runtime_checkable
class KeyValueStore(Protocol):
    """What a store offers: the operations a plugin's callbacks and a barrier need.

    Implementations must be thread-safe.
    """

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing an older value)."""

    def get(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for another process to set
        it; raises `TimeoutError` when it is still missing then."""
        ...

    def try_get(self, key: str) -> bytes | None:
        """The value of ``key``, or None at once when no process has set it."""

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        """Wait until ``num_processes`` processes reached the barrier ``name`` (each name used
        once); raises `TimeoutError` after ``timeout`` seconds."""

    # Optional: ``claim(key, value) -> bytes`` sets ``key`` only if no process set it before,
    # in one atomic step, and returns the value the key holds afterwards (``value`` itself when
    # this call set it). Every store here has it; see `claim` for stores without it.


def claim(store, key: str, value: bytes) -> bytes:
    """Set ``key`` to ``value`` unless another process set it first; the value ``key`` holds
    afterwards (``value`` when this call won).

    Processes use it to take something only one of them may have (a process id in a job). It
    is atomic with the stores of this module; a store without a ``claim`` method gets a
    read-then-write that two processes racing within milliseconds can both win.
    """
    method: Callable[[str, bytes], bytes] | None = getattr(store, "claim", None)
    if callable(method):
        return method(key, bytes(value))
    held = store.try_get(key)
    if held is not None:
        return held
    store.set(key, value)
    return bytes(value)


def wait_for(probe, key: str, timeout: float):
    """Call ``probe()`` until it returns something other than None, backing off from 1 ms to
    50 ms between tries; raises TimeoutError naming ``key`` after ``timeout`` seconds."""
    deadline = time.monotonic() + max(0.0, timeout)
    pause = 0.001
    while True:
        value = probe()
        if value is not None:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"key {key!r} was not set by another process within "
                               f"{timeout:g} s")
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _barrier_by_keys(store, name: str, process_id: int, num_processes: int,
                     timeout: float) -> None:
    """A barrier built on set/try_get: each process sets its own arrival key, then waits for
    every other process's."""
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is outside 0..{num_processes - 1}")
    store.set(f"barrier/{name}/{process_id}", b"1")
    deadline = time.monotonic() + timeout
    for other in range(num_processes):
        key = f"barrier/{name}/{other}"
        try:
            store.get(key, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise TimeoutError(f"barrier {name!r}: process {other} of {num_processes} did not "
                               f"arrive within {timeout:g} s") from None


class SQLiteStore:
    """A store in a SQLite file, shared by the processes of one machine.

    The database runs in WAL mode, so readers never wait for the writer, and every connection
    waits (``busy_timeout``) rather than fail while another process writes. Each thread opens
    its own connection (SQLite connections are not to be shared between threads).

    Args:
      path: the database file; created with its table if missing. Put it on a local disk:
        SQLite's locking is unreliable on network file systems (use [`RedisStore`][pjrt.kv_store.RedisStore] there).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._connection()  # creates the file and table now, so errors show up here

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            if self._closed:
                raise RuntimeError(f"the key-value store {self.path} is closed")
            connection = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                         check_same_thread=False)
            connection.execute("PRAGMA busy_timeout = 30000")
            _retry_while_locked(lambda: connection.execute("PRAGMA journal_mode = WAL"))
            _retry_while_locked(lambda: connection.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)"))
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def set(self, key: str, value: bytes) -> None:
        connection = self._connection()
        _retry_while_locked(lambda: connection.execute(
            "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, bytes(value))))

    def try_get(self, key: str) -> bytes | None:
        connection = self._connection()
        row = _retry_while_locked(lambda: connection.execute(
            "SELECT value FROM kv WHERE key = ?", (key,)).fetchone())
        return None if row is None else bytes(row[0])

    def get(self, key: str, timeout: float) -> bytes:
        return wait_for(lambda: self.try_get(key), key, timeout)

    def claim(self, key: str, value: bytes) -> bytes:
        connection = self._connection()
        # One statement, so SQLite's write lock makes it atomic across processes; a claimed
        # key is never replaced, so reading it afterwards gives the winner's value.
        _retry_while_locked(lambda: connection.execute(
            "INSERT OR IGNORE INTO kv (key, value) VALUES (?, ?)", (key, bytes(value))))
        held = self.try_get(key)
        assert held is not None  # inserted above, by this call or an earlier one
        return held

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        _barrier_by_keys(self, name, process_id, num_processes, timeout)

    def close(self) -> None:
        """Close every connection this object opened (the file stays)."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"


def _retry_while_locked(statement, seconds: float = 30.0):
    """Run ``statement()``, again while SQLite says the database is locked or busy.

    SQLite's busy timeout does not cover every case: switching a new file to WAL mode, and the
    first read of a WAL file another process is recovering, report "database is locked" at
    once when processes open the store together.
    """
    import time

    deadline = time.monotonic() + seconds
    pause = 0.005
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as error:
            text = str(error)
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class RedisStore:
    """A store on a Redis server, for processes on several machines.

    Args:
      url: a Redis URL, e.g. ``redis://coordinator:6379/0``.
      namespace: prefix of every key this store writes, so that several jobs can share one
        server; give each job its own.

    Raises:
      ImportError: ``redis-py`` is not installed (``pip install pjrt[redis]``).
    """

    def __init__(self, url: str, namespace: str = "pjrt"):
        try:
            import redis  # pyright: ignore[reportMissingImports]  (optional: pjrt[redis])
        except ImportError as error:
            raise ImportError("RedisStore needs the redis package: pip install 'pjrt[redis]' "
                              "(or pip install redis)") from error
        self.url = url
        self.namespace = namespace
        # redis-py's client keeps a thread-safe connection pool.
        self._redis = redis.Redis.from_url(url)

    def _key(self, key: str) -> str:
        return f"{self.namespace}/{key}"

    def set(self, key: str, value: bytes) -> None:
        self._redis.set(self._key(key), bytes(value))

    def try_get(self, key: str) -> bytes | None:
        value = self._redis.get(self._key(key))
        return None if value is None else bytes(value)

    def get(self, key: str, timeout: float) -> bytes:
        return wait_for(lambda: self.try_get(key), key, timeout)

    def claim(self, key: str, value: bytes) -> bytes:
        # SET NX is atomic on the server; a claimed key is never replaced.
        self._redis.set(self._key(key), bytes(value), nx=True)
        held = self.try_get(key)
        assert held is not None
        return held

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        _barrier_by_keys(self, name, process_id, num_processes, timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, namespace={self.namespace!r})"


class JaxDistributedStore:
    """jax's coordination service as a store, for a process that ran
    ``jax.distributed.initialize``: pjrt's clients then share jax's coordinator.

    Args:
      client: a jaxlib ``DistributedRuntimeClient``; the one ``jax.distributed`` made when None.

    Raises:
      RuntimeError: no client given and ``jax.distributed.initialize`` has not been called.
    """

    def __init__(self, client=None):
        if client is None:
            from jax._src import distributed as jax_distributed  # pyright: ignore[reportMissingImports]

            client = jax_distributed.global_state.client
            if client is None:
                raise RuntimeError("jax.distributed.initialize(...) has not been called in this "
                                   "process; call it first, or pass its client")
        self._client = client

    def set(self, key: str, value: bytes) -> None:
        self._client.key_value_set_bytes(key, bytes(value), allow_overwrite=True)

    def try_get(self, key: str) -> bytes | None:
        try:
            return bytes(self._client.key_value_try_get_bytes(key))
        except Exception as error:  # noqa: BLE001 - jaxlib reports a missing key as an error
            if "NOT_FOUND" in str(error) or "not found" in str(error).lower():
                return None
            raise

    def get(self, key: str, timeout: float) -> bytes:
        try:
            return bytes(self._client.blocking_key_value_get_bytes(key, int(timeout * 1000)))
        except Exception as error:  # noqa: BLE001
            if "DEADLINE_EXCEEDED" in str(error):
                raise TimeoutError(f"key {key!r} was not set by another process within "
                                   f"{timeout:g} s") from error
            raise

    def claim(self, key: str, value: bytes) -> bytes:
        try:
            self._client.key_value_set_bytes(key, bytes(value), allow_overwrite=False)
        except Exception as error:  # noqa: BLE001 - jaxlib reports a taken key as an error
            if "ALREADY_EXISTS" not in str(error) and "already exists" not in str(error).lower():
                raise
        held = self.try_get(key)
        assert held is not None
        return held

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        try:
            self._client.wait_at_barrier(name, int(timeout * 1000))
        except Exception as error:  # noqa: BLE001
            if "DEADLINE_EXCEEDED" in str(error):
                raise TimeoutError(f"barrier {name!r} timed out after {timeout:g} s") from error
            raise

    def __repr__(self) -> str:
        return f"JaxDistributedStore({self._client!r})"


class PrefixedStore:
    """A view of ``store`` whose keys all start with ``prefix``: each client gets its own, so
    two clients (or two jobs) never read each other's topology."""

    def __init__(self, store: KeyValueStore, prefix: str):
        self.store = store
        self.prefix = prefix

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self.prefix + key, value)

    def try_get(self, key: str) -> bytes | None:
        return self.store.try_get(self.prefix + key)

    def get(self, key: str, timeout: float) -> bytes:
        return self.store.get(self.prefix + key, timeout)

    def claim(self, key: str, value: bytes) -> bytes:
        return claim(self.store, self.prefix + key, value)

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        self.store.barrier(self.prefix + name, process_id, num_processes, timeout)

    def __repr__(self) -> str:
        return f"PrefixedStore({self.store!r}, {self.prefix!r})"


def as_store(store_or_client) -> KeyValueStore:
    """``store_or_client`` as a [`KeyValueStore`][pjrt.kv_store.KeyValueStore]: a store is returned as it is, a jaxlib
    ``DistributedRuntimeClient`` is wrapped in [`JaxDistributedStore`][pjrt.kv_store.JaxDistributedStore].

    Raises:
      TypeError: it is neither.
    """
    if all(callable(getattr(store_or_client, name, None))
           for name in ("set", "get", "try_get", "barrier")):
        return store_or_client
    if all(callable(getattr(store_or_client, name, None))
           for name in ("key_value_set_bytes", "blocking_key_value_get_bytes",
                        "key_value_try_get_bytes", "wait_at_barrier")):
        return JaxDistributedStore(store_or_client)
    raise TypeError(f"distributed_client must be a pjrt.kv_store.KeyValueStore (set, get, "
                    f"try_get, barrier) or jax's DistributedRuntimeClient, not "
                    f"{type(store_or_client).__name__}")
