"""A client of XLA's coordination service: what every process of a job connects.

It speaks the protocol of jaxlib's ``DistributedRuntimeClient`` (the coordination service
agent of XLA), so it joins a service that pjrt, jax or torch_xla started, with jaxlib's
methods. Where jaxlib's client ends the process on a lost peer, this one raises: every wait
(a barrier, a blocking get, the registration) ends with a
[`DistributedRuntimeError`][pjrt._distributed.coordination_errors.DistributedRuntimeError] naming the lost process as
soon as the service reports it, and ``missed_heartbeat_callback`` is called when given.

A long wait is a series of calls of at most a second each (a get and a barrier may be asked
again without harm), so that between two an error of the job ends it; gRPC checks for signals
while it waits, so Ctrl-C interrupts one (``KeyboardInterrupt``). The calls go through
`pjrt._distributed.coordination_channel` (gRPC's core channel driven below grpcio's public
API, that API where grpcio differs); the error poll waits on a thread of its own.

A registration the service refuses as a second incarnation of this process's id (ABORTED,
naming this process: it restarted into a running job that is not recoverable, or two
processes have its id) raises at once: asking again could not succeed against that service.
"""
from __future__ import annotations

import atexit
import logging
import random
import sys
import threading
import time
import weakref
from typing import Callable, Sequence

from ..errors import ErrorCode
from . import coordination_messages as msg
from .coordination_channel import RpcFailure, open_channel
from .coordination_errors import DistributedRuntimeError, make_error
from .coordination_server import import_grpc

logger = logging.getLogger(__name__)

#: The longest call of a long wait: how soon it sees an error of the job (a lost process).
_SLICE_S = 1.0
_PATHS = {name: msg.method_path(name).encode() for name in msg.METHODS}


def _seconds(value, default: float) -> float:
    return float(default if value is None else value)


class DistributedRuntimeClient:
    """A process's connection to the job's coordination service (jaxlib's
    ``DistributedRuntimeClient``); made by `get_distributed_runtime_client`.

    Times are seconds; the ``timeout_in_ms`` of each call is milliseconds, as in jaxlib.
    """

    def __init__(self, address: str, node_id: int, rpc_timeout: float | None = None,
                 init_timeout: float | None = None, shutdown_timeout: float | None = None,
                 heartbeat_timeout: float | None = None,
                 missed_heartbeat_callback: Callable | None = None,
                 shutdown_on_destruction: bool | None = None,
                 use_compression: bool | None = None, recoverable: bool | None = None):
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"the coordination service's address must be 'host:port', not "
                             f"{address!r}")
        if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
            raise ValueError(f"node_id must be a non-negative int, not {node_id!r}")
        self.address = address
        self.node_id = node_id
        self.rpc_timeout = _seconds(rpc_timeout, 120.0)
        self.init_timeout = _seconds(init_timeout, 300.0)
        self.shutdown_timeout = _seconds(shutdown_timeout, 300.0)
        self.heartbeat_timeout = _seconds(heartbeat_timeout, 100.0)
        self.missed_heartbeat_callback = missed_heartbeat_callback
        self.shutdown_on_destruction = True if shutdown_on_destruction is None else bool(
            shutdown_on_destruction)
        self.use_compression = bool(use_compression)
        self.recoverable = bool(recoverable)
        self.incarnation = random.getrandbits(63) | 1
        self.service_incarnation = 0
        self._grpc = import_grpc()
        self._channel = None
        self._incarnations = b""
        self._lock = threading.Lock()
        self._connected = False
        self._error: DistributedRuntimeError | None = None
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._poll = None
        self._poll_thread: threading.Thread | None = None
        self._barrier_counters: dict[str, int] = {}
        self._open()

    # -- transport -------------------------------------------------------------------------------

    def _open(self) -> None:
        self._channel = open_channel(self._grpc, self.address, self.use_compression)

    def _request(self, method: str, **fields) -> bytes:
        if method != "RegisterTask":
            fields["incarnations"] = self._incarnations
        return msg.encode_request(method, fields)

    @staticmethod
    def _payloads(failure: RpcFailure) -> dict:
        for key, value in failure.trailing:
            if key == msg.STATUS_DETAILS_KEY:
                return msg.decode_payloads(value)
        return {}

    def _source_of(self, failure: RpcFailure):
        """The process the service's error names (its coordination payload), or None."""
        payload = self._payloads(failure).get(msg.COORDINATION_ERROR_KEY)
        return None if payload is None else msg.source_task_of(payload)

    def _error_of(self, failure: RpcFailure) -> DistributedRuntimeError:
        """A failed call as a `DistributedRuntimeError`."""
        number, details = failure.code, failure.details
        payloads = self._payloads(failure) if failure.trailing else {}
        lost = None
        if msg.COORDINATION_ERROR_KEY in payloads:
            lost = msg.source_task_of(payloads[msg.COORDINATION_ERROR_KEY])
        if msg.SERVICE_MISMATCH_KEY in payloads and not details:
            details = "the coordination service restarted"
        if number == ErrorCode.UNAVAILABLE and not lost and "heartbeat" not in details:
            details = (f"the coordination service at {self.address} cannot be reached "
                       f"({details})")
        return make_error(number, details, lost if lost != self.node_id else None)

    def _send(self, method: str, request: bytes, timeout: float | None) -> bytes:
        """One call of ``method``, its error as a `DistributedRuntimeError`."""
        try:
            return self._channel.unary(_PATHS[method], request, timeout)
        except RpcFailure as failure:
            raise self._error_of(failure) from None

    def _call(self, method: str, request: bytes, timeout: float | None = None) -> bytes:
        """A call that ends quickly (a set, a try-get): one blocking RPC."""
        if self._error is not None or not self._connected:
            self._check_usable()
        return self._send(method, request, self.rpc_timeout if timeout is None else timeout)

    def _wait(self, method: str, request: bytes, timeout: float | None,
              what: str, check_error: bool = True) -> bytes:
        """A call that may wait long, as calls of at most `_SLICE_S` each, asked again while
        time is left and the job has no error; the service's own DEADLINE_EXCEEDED (a
        barrier's) ends it at once."""
        if check_error:
            self._check_usable()
        unary, path = self._channel.unary, _PATHS[method]
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = _SLICE_S if deadline is None else deadline - time.monotonic()
            piece = min(_SLICE_S, max(0.0, left))
            try:
                return unary(path, request, piece)
            except RpcFailure as failure:
                late = failure.code == ErrorCode.DEADLINE_EXCEEDED
                if not late or self._is_answer(failure) or left <= piece:
                    if check_error and self._error is not None and not late:
                        raise self._job_error(what) from None
                    raise self._error_of(failure) from None
            if check_error and self._error is not None:
                raise self._job_error(what)

    def _is_answer(self, failure: RpcFailure) -> bool:
        """Whether a failure is the service's answer (it carries the coordination payload),
        not the transport's."""
        return bool(failure.trailing) and \
            msg.COORDINATION_ERROR_KEY in self._payloads(failure)

    def _job_error(self, what: str) -> DistributedRuntimeError:
        error = self._error
        assert error is not None
        return make_error(error.code, f"{what} ended: {error.plugin_message}",
                          error.lost_process)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._job_error("the call")
        if not self._connected:
            raise make_error(ErrorCode.FAILED_PRECONDITION,
                             "the distributed runtime client is not connected: call connect() "
                             "first" if self._channel is None else
                             "the distributed runtime client was shut down")

    # -- connecting ------------------------------------------------------------------------------

    def connect(self) -> None:
        """Register with the service, waiting (up to ``init_timeout``) until every process of
        the job has; then send heartbeats and listen for the job's errors.

        Raises:
          DistributedRuntimeError: the service refused this process (an id outside the job,
            a second process with this id), or the job did not form in time
            (``DistributedTimeoutError``, which says whether the service was reachable).
        """
        with self._lock:
            if self._connected:
                raise make_error(ErrorCode.FAILED_PRECONDITION,
                                 "the distributed runtime client is already connected")
            if self._channel is None:
                self._open()
        request = self._request("RegisterTask", incarnation=self.incarnation,
                                source_task_id=self.node_id)
        deadline = time.monotonic() + self.init_timeout
        attempt = 0
        last: DistributedRuntimeError | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            attempt += 1
            try:
                reply = self._register(request, left)
            except RpcFailure as failure:
                error = last = self._error_of(failure)
                if error.code == ErrorCode.ABORTED and self._source_of(failure) == self.node_id:
                    raise self._restarted_error(error) from None
                retry = error.code in (ErrorCode.UNAVAILABLE, ErrorCode.ABORTED) or (
                    error.code == ErrorCode.DEADLINE_EXCEEDED and
                    deadline - time.monotonic() > 0.05)
                if not retry:
                    raise make_error(error.code, f"process {self.node_id} could not join the "
                                                 f"job at {self.address}: "
                                                 f"{error.plugin_message}",
                                     error.lost_process) from None
                time.sleep(min(max(0.0, deadline - time.monotonic()),
                               0.05 * min(2 ** attempt, 20) * random.uniform(0.5, 1.0)))
                continue
            self.service_incarnation = msg.decode_response("RegisterTask",
                                                           reply)["service_incarnation"]
            break
        else:  # pragma: no cover - the loop only leaves by break or raise
            pass
        if not self.service_incarnation:
            if last is not None and last.code == ErrorCode.UNAVAILABLE:
                text = (f"no coordination service answered at {self.address} within "
                        f"{self.init_timeout:g} s: is process 0 running, and is the address "
                        f"right and reachable from this machine? ({last.plugin_message})")
            else:
                text = (f"process {self.node_id}: the job did not form within "
                        f"{self.init_timeout:g} s; the service at {self.address} answered, but "
                        f"not every process registered"
                        + (f" ({last.plugin_message})" if last is not None else ""))
            raise make_error(ErrorCode.DEADLINE_EXCEEDED, text)
        self._incarnations = msg.encode_incarnations(self.incarnation, self.service_incarnation)
        self._connected = True
        _live_clients.add(self)
        self._stop.clear()
        self._start_polling()
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                            name=f"pjrt-heartbeats-{self.node_id}")
        self._heartbeats.start()

    def _register(self, request: bytes, timeout: float) -> bytes:
        """One registration call, waited on whole (an incarnation must not ask twice while
        it waits); Ctrl-C interrupts it and cancels the call."""
        call = self._channel.start(_PATHS["RegisterTask"], request, timeout)
        try:
            return call.result()
        except RpcFailure:
            raise
        except BaseException:
            call.cancel()
            raise

    def _restarted_error(self, error: DistributedRuntimeError) -> DistributedRuntimeError:
        """The service refused this process's registration as a second incarnation of its
        id (ABORTED naming it): asking again cannot succeed against this service."""
        me = self.node_id
        return make_error(ErrorCode.ABORTED,
                          f"process {me} cannot join the job at {self.address}: the service "
                          f"already had process {me} (this process restarted into a running "
                          f"job that is not recoverable, or a second process was started with "
                          f"id {me}), and has set it in error. Start the whole job again, "
                          f"service included, or make the job recoverable (recoverable=True "
                          f"for the service and every client). The service said: "
                          f"{error.plugin_message}")

    def _start_polling(self) -> None:
        request = self._request("PollForError", source_task_id=self.node_id)
        self._poll = self._channel.start(_PATHS["PollForError"], request)
        self._poll_thread = threading.Thread(target=self._polling, args=(self._poll,),
                                             daemon=True, name=f"pjrt-errors-{self.node_id}")
        self._poll_thread.start()

    def _polling(self, call) -> None:
        """Wait for the answer of the error poll (it only ever answers with an error)."""
        try:
            call.result()
        except RpcFailure as failure:
            if failure.code != ErrorCode.CANCELLED and not self._stop.is_set():
                self._fail(self._error_of(failure))  # CANCELLED: a shutdown, here or there
        except BaseException:  # noqa: BLE001 - the channel closed under it at exit
            pass

    def _fail(self, error: DistributedRuntimeError) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = error
        logger.error("the job's coordination service reported an error: %s", error)
        callback = self.missed_heartbeat_callback
        if callback is not None:
            try:
                callback(error)
            except Exception:  # noqa: BLE001 - the callback's failure is the user's to log
                logger.exception("missed_heartbeat_callback raised")

    def _heartbeat_loop(self) -> None:
        interval = max(0.05, self.heartbeat_timeout / 2)
        request = self._request("Heartbeat", incarnation=self.incarnation,
                                source_task_id=self.node_id)
        failing_since = None
        while not self._stop.wait(interval):
            try:
                reply = self._channel.unary(_PATHS["Heartbeat"], request, interval)
            except RpcFailure as error:
                if self._stop.is_set():
                    return
                failure = self._error_of(error)
                if failure.code == ErrorCode.UNAVAILABLE or \
                        failure.code == ErrorCode.DEADLINE_EXCEEDED:
                    now = time.monotonic()
                    failing_since = failing_since or now
                    if now - failing_since < self.heartbeat_timeout:
                        continue
                    failure = make_error(ErrorCode.UNAVAILABLE,
                                         f"the coordination service at {self.address} stopped "
                                         f"answering heartbeats for {self.heartbeat_timeout:g} "
                                         f"s: process 0 has ended or hangs", 0)
                self._fail(failure)
                return
            except Exception:  # noqa: BLE001 - a closed channel while shutting down
                return
            failing_since = None
            got = msg.decode_response("Heartbeat", reply)["service_incarnation"]
            if got != self.service_incarnation:
                self._fail(make_error(ErrorCode.ABORTED,
                                      "the coordination service restarted: this process "
                                      "belongs to a job that has ended", 0))
                return

    # -- shutting down ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Pass the shutdown barrier with every other process (up to ``shutdown_timeout``),
        then disconnect. Does nothing when not connected.

        Raises:
          DistributedRuntimeError: the shutdown barrier failed (a process never reached it,
            or one was lost); this client is disconnected all the same.
        """
        with self._lock:
            if not self._connected:
                return
            self._connected = False
        failure = None
        if self._error is None:
            request = self._request("ShutdownTask", source_task_id=self.node_id)
            try:
                self._wait("ShutdownTask", request, self.shutdown_timeout + 5.0, "shutdown",
                           check_error=False)
            except DistributedRuntimeError as error:
                failure = error
        self.close()
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Disconnect without the shutdown barrier: stop the heartbeats and the error poll and
        close the channel (the service sees this process as lost once its heartbeats stop)."""
        self._connected = False
        self._stop.set()
        poll, self._poll = self._poll, None
        if poll is not None:
            poll.cancel()
        for name in ("_heartbeats", "_poll_thread"):
            thread = getattr(self, name)
            setattr(self, name, None)
            if thread is not None and thread is not threading.current_thread():
                thread.join(5.0)
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def __del__(self):
        try:
            if self._connected and not sys.is_finalizing():
                if self.shutdown_on_destruction:
                    self.shutdown()
                else:
                    self._connected = False
                    self.close()
        except Exception:  # noqa: BLE001 - nothing may escape a finaliser
            pass

    # -- key-value store -------------------------------------------------------------------------

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        """Set ``key`` to the text ``value``; ALREADY_EXISTS unless ``allow_overwrite``."""
        self.key_value_set_bytes(key, value.encode("utf-8"), allow_overwrite)

    def key_value_set_bytes(self, key: str, value: bytes, allow_overwrite: bool = False) -> None:
        """Set ``key`` to ``value``; ALREADY_EXISTS unless ``allow_overwrite``."""
        self._call("InsertKeyValue", self._request("InsertKeyValue", key=key, value=bytes(value),
                                                   allow_overwrite=allow_overwrite))

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        """The text value of ``key``, waiting up to ``timeout_in_ms`` for a process to set
        it (`DistributedTimeoutError` then)."""
        return self.blocking_key_value_get_bytes(key, timeout_in_ms).decode("utf-8")

    def blocking_key_value_get_bytes(self, key: str, timeout_in_ms: int) -> bytes:
        """The value of ``key``, waiting up to ``timeout_in_ms`` for a process to set it."""
        try:
            reply = self._wait("GetKeyValue", self._request("GetKeyValue", key=key),
                               max(0, timeout_in_ms) / 1000.0, f"the get of key {key!r}")
        except DistributedRuntimeError as error:
            if error.code == ErrorCode.DEADLINE_EXCEEDED and self._error is None:
                raise make_error(ErrorCode.DEADLINE_EXCEEDED,
                                 f"key {key!r} was not set by another process within "
                                 f"{timeout_in_ms} ms") from None
            raise
        return msg.decode_response("GetKeyValue", reply)["value"]

    def key_value_try_get(self, key: str) -> str:
        """The text value of ``key``; NOT_FOUND at once when it is not set."""
        return self.key_value_try_get_bytes(key).decode("utf-8")

    def key_value_try_get_bytes(self, key: str) -> bytes:
        """The value of ``key``; NOT_FOUND at once when it is not set."""
        reply = self._call("TryGetKeyValue", self._request("TryGetKeyValue", key=key))
        return msg.decode_response("TryGetKeyValue", reply)["value"]

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]:
        """Every ``(key, text value)`` under the directory ``key`` (keys ``key/...``)."""
        return [(k, v.decode("utf-8")) for k, v in self.key_value_dir_get_bytes(key)]

    def key_value_dir_get_bytes(self, key: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` under the directory ``key`` (keys ``key/...``)."""
        reply = self._call("GetKeyValueDir", self._request("GetKeyValueDir", directory_key=key))
        return msg.decode_response("GetKeyValueDir", reply)["kv"]

    def key_value_delete(self, key: str) -> None:
        """Delete ``key`` and every key under the directory ``key/``."""
        self._call("DeleteKeyValue", self._request("DeleteKeyValue", key=key))

    def key_value_increment(self, key: str, increment: int) -> int:
        """Add ``increment`` to the integer held by ``key`` (0 when unset); the new value."""
        reply = self._call("IncrementKeyValue", self._request("IncrementKeyValue", key=key,
                                                              increment=int(increment)))
        return int(msg.decode_response("IncrementKeyValue", reply)["value"])

    # -- synchronisation -------------------------------------------------------------------------

    def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int,
                        process_ids: Sequence[int] | None = None) -> None:
        """Wait until every process (or those of ``process_ids``, this one among them) has
        called the barrier ``barrier_id``; `DistributedTimeoutError` after ``timeout_in_ms``
        counted from the first arrival. An id may be used again once the barrier passed."""
        counter = self._barrier_counters.get(barrier_id, 0)
        request = self._request("Barrier", barrier_id=barrier_id,
                                barrier_timeout_in_ms=int(timeout_in_ms),
                                task_ids=list(process_ids or ()),
                                source_task_id=self.node_id, counter=counter)
        try:
            # The service ends the barrier at its deadline; the call's own deadline is later,
            # so that the service's answer (naming who is missing) arrives first.
            reply = self._wait("Barrier", request, timeout_in_ms / 1000.0 + 10.0,
                               f"barrier {barrier_id!r}")
        except DistributedRuntimeError:
            self._barrier_counters[barrier_id] = counter + 1
            raise
        self._barrier_counters[barrier_id] = msg.decode_response("Barrier", reply)["counter"] + 1

    def get_live_nodes(self, process_ids: Sequence[int]) -> dict[int, int]:
        """Wait until every live process of ``process_ids`` has asked, then map the live
        ones to their incarnation numbers."""
        reply = self._wait("GetAliveTasks",
                           self._request("GetAliveTasks", requesting_task_id=self.node_id,
                                         task_ids=list(process_ids)),
                           None, "get_live_nodes")
        decoded = msg.decode_response("GetAliveTasks", reply)
        return dict(zip(decoded["alive_task_ids"], decoded["incarnations"]))

    def __repr__(self) -> str:
        state = "connected" if self._connected else "not connected"
        return f"DistributedRuntimeClient({self.address!r}, node_id={self.node_id}, {state})"


#: Clients still connected, closed at exit (without the shutdown barrier, which could wait on
#: processes that are not ending) while gRPC still runs.
_live_clients: "weakref.WeakSet[DistributedRuntimeClient]" = weakref.WeakSet()


@atexit.register
def _close_clients_at_exit() -> None:
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - the exit goes on
            pass


def get_distributed_runtime_client(address: str, node_id: int, rpc_timeout: int | None = None,
                                   init_timeout: int | None = None,
                                   shutdown_timeout: int | None = None,
                                   heartbeat_timeout: int | None = None,
                                   missed_heartbeat_callback: Callable | None = None,
                                   shutdown_on_destruction: bool | None = None,
                                   use_compression: bool | None = None,
                                   recoverable: bool | None = None) -> DistributedRuntimeClient:
    """A client of the coordination service at ``address`` for process ``node_id``
    (jaxlib's function of the same name; times in seconds: rpc_timeout 120, init_timeout
    300, shutdown_timeout 300, heartbeat_timeout 100 by default). Call ``connect()`` next.

    Raises:
      ImportError: grpcio is missing (``pip install 'pjrt[distributed]'``).
      ValueError: ``address`` or ``node_id`` is malformed.
    """
    return DistributedRuntimeClient(address, node_id, rpc_timeout, init_timeout,
                                    shutdown_timeout, heartbeat_timeout,
                                    missed_heartbeat_callback, shutdown_on_destruction,
                                    use_compression, recoverable)
