"""XLA's coordination service on a gRPC server: jaxlib's ``DistributedRuntimeService``.

`GrpcCoordinationServer` serves `CoordinationService`'s rules as the gRPC service
``xla.coordination.CoordinationService``, with generic handlers that take and return the bytes
`pjrt._distributed.coordination_messages` reads and writes. Every handler runs on a thread of
the server's pool; one that waits blocks on an event its ``done`` callback sets, looking every
second whether its caller is still there.
"""
from __future__ import annotations

import queue
import threading
from concurrent import futures

from ..errors import ErrorCode
from . import coordination_messages as msg
from .coordination_service import CoordinationService, make_status


class _Pending:
    """One waiting RPC: a handler blocks in `wait` until a callback calls `finish`."""

    __slots__ = ("event", "result")

    def __init__(self):
        self.event = threading.Event()
        self.result = None

    def finish(self, *result) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()

    def wait(self, context):
        """The result, or None when the caller went away (cancelled, deadline passed)."""
        if not self.event.is_set():
            # The RPC's end (its caller cancelled, its deadline passed) wakes it without a
            # result; add_callback refuses when the RPC has already ended.
            if not context.add_callback(self.event.set):
                return self.result if self.event.is_set() else None
            self.event.wait()
        return self.result


class _DaemonPool:
    """The gRPC server's executor, on daemon threads started as needed (up to
    ``max_workers``): a handler waiting for a barrier or for errors must not hold the
    interpreter's exit, as ``ThreadPoolExecutor``'s threads, joined at exit, would."""

    def __init__(self, max_workers: int, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._max = max_workers
        self._name = name

    def submit(self, fn, *args, **kwargs) -> futures.Future:
        future: futures.Future = futures.Future()
        self._queue.put((future, fn, args, kwargs))
        with self._lock:
            if self._idle == 0 and self._threads < self._max:
                self._threads += 1
                threading.Thread(target=self._work, daemon=True,
                                 name=f"{self._name}-{self._threads}").start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:  # noqa: BLE001 - handed to the future
                future.set_exception(error)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._queue.put(None)


def import_grpc():
    try:
        import grpc  # pyright: ignore[reportMissingImports]  (optional: pjrt[distributed])
    except ImportError as error:
        raise ImportError("pjrt's distributed runtime needs grpcio: pip install "
                          "'pjrt[distributed]' (or pip install grpcio)") from error
    return grpc


class GrpcCoordinationServer:
    """The service on a gRPC server bound to ``address`` (``host:port``, ``[::]:port``).

    Raises:
      OSError: the address cannot be bound (the port is in use, or the host is not one of
        this machine's addresses).
    """

    def __init__(self, address: str, service: CoordinationService):
        grpc = import_grpc()
        self.address = address
        self.service = service
        self._codes = {code.value[0]: code for code in grpc.StatusCode}
        workers = 4 * service.num_tasks + 32
        self._pool = _DaemonPool(workers, "pjrt-coordination")
        self._server = grpc.server(
            self._pool,  # pyright: ignore[reportArgumentType]  (submit is all gRPC uses)
            # One service per port: without this, gRPC lets a second server bind a port in use
            # (SO_REUSEPORT), and clients would reach either at random.
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1)])
        handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(self, "_" + name))
                    for name in msg.METHODS}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(msg.SERVICE, handlers),))
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as error:
            port = 0
            cause: BaseException | None = error
        else:
            cause = None
        if not port:
            service.stop()
            raise OSError(f"the coordination service cannot listen on {address}: the port is "
                          f"in use (another job's service?) or the host is not an address of "
                          f"this machine") from cause
        self.port = port
        self._server.start()

    # Each handler gets the request bytes and returns the response bytes, or sets an error.

    def _fail(self, context, status) -> bytes:
        code, message, source = status
        payloads = {msg.COORDINATION_ERROR_KEY: msg.coordination_error_payload(source)}
        context.set_trailing_metadata(((msg.STATUS_DETAILS_KEY, msg.encode_payloads(payloads)),))
        context.set_code(self._codes.get(code, self._codes[ErrorCode.UNKNOWN]))
        context.set_details(message)
        return b""

    def _check(self, request: dict, context):
        incarnations = request.get("incarnations")
        got = incarnations["service_incarnation"] if incarnations else 0
        if got != self.service.incarnation:
            code, message, _ = make_status(
                ErrorCode.INTERNAL,
                f"this process speaks to an earlier coordination service at this address "
                f"(incarnation {got}; this one is {self.service.incarnation}): it belongs to a "
                f"job that has ended; start it again with the new job")
            payloads = {msg.COORDINATION_ERROR_KEY: b"",
                        msg.SERVICE_MISMATCH_KEY: b"\x09" + self.service.incarnation.to_bytes(
                            8, "little")}
            context.set_trailing_metadata(((msg.STATUS_DETAILS_KEY,
                                            msg.encode_payloads(payloads)),))
            context.set_code(self._codes[code])
            context.set_details(message)
            return False
        return True

    def _waited(self, pending: _Pending, context):
        result = pending.wait(context)
        if result is None:
            context.set_code(self._codes[ErrorCode.CANCELLED])
            context.set_details("the caller went away")
        return result

    def _RegisterTask(self, data: bytes, context) -> bytes:
        request = msg.decode_request("RegisterTask", data)
        pending = _Pending()
        self.service.register_task(request["source_task_id"], request["incarnation"],
                                   pending.finish)
        result = self._waited(pending, context)
        if result is None:
            return b""
        if result[0] is not None:
            return self._fail(context, result[0])
        return msg.encode_response("RegisterTask",
                                   {"service_incarnation": self.service.incarnation})

    def _Heartbeat(self, data: bytes, context) -> bytes:
        request = msg.decode_request("Heartbeat", data)
        if not self._check(request, context):
            return b""
        error = self.service.heartbeat(request["source_task_id"], request["incarnation"])
        if error is not None:
            return self._fail(context, error)
        return msg.encode_response("Heartbeat", {"service_incarnation": self.service.incarnation})

    def _ShutdownTask(self, data: bytes, context) -> bytes:
        request = msg.decode_request("ShutdownTask", data)
        if not self._check(request, context):
            return b""
        pending = _Pending()
        self.service.shutdown_task(request["source_task_id"], pending.finish)
        result = self._waited(pending, context)
        if result is not None and result[0] is not None:
            return self._fail(context, result[0])
        return b""

    def _WatchTasks(self, data: bytes, context) -> bytes:
        request = msg.decode_request("WatchTasks", data)
        if not self._check(request, context):
            return b""
        pending = _Pending()
        self.service.watch_tasks(request["version_number"], pending.finish)
        result = self._waited(pending, context)
        if result is None:
            return b""
        infos, version = result
        return msg.encode_response("WatchTasks", {"task_state": infos, "version_number": version})

    def _InsertKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("InsertKeyValue", data)
        if not self._check(request, context):
            return b""
        key, value = request["kv"]
        error = self.service.insert(key, value, request["allow_overwrite"])
        return b"" if error is None else self._fail(context, error)

    def _GetKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetKeyValue", data)
        if not self._check(request, context):
            return b""
        key = request["key"]
        value = self.service.try_get(key)
        if value is None:
            pending = _Pending()
            self.service.get(key, pending.finish)
            result = self._waited(pending, context)
            if result is None:
                self.service.forget_get(key, pending.finish)
                return b""
            if result[0] is not None:
                return self._fail(context, result[0])
            value = result[1]
        return msg.encode_response("GetKeyValue", {"key": key, "value": value})

    def _TryGetKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("TryGetKeyValue", data)
        if not self._check(request, context):
            return b""
        key = request["key"]
        value = self.service.try_get(key)
        if value is None:
            return self._fail(context, make_status(ErrorCode.NOT_FOUND, f"Config key {key} not found."))
        return msg.encode_response("TryGetKeyValue", {"key": key, "value": value})

    def _IncrementKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("IncrementKeyValue", data)
        if not self._check(request, context):
            return b""
        error, value = self.service.increment(request["key"], request["increment"])
        if error is not None:
            return self._fail(context, error)
        return msg.encode_response("IncrementKeyValue", {"key": request["key"], "value": value})

    def _GetKeyValueDir(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetKeyValueDir", data)
        if not self._check(request, context):
            return b""
        entries = self.service.get_dir(request["directory_key"])
        return msg.encode_response("GetKeyValueDir", {"kv": entries})

    def _DeleteKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("DeleteKeyValue", data)
        if not self._check(request, context):
            return b""
        self.service.delete(request["key"])
        return b""

    def _Barrier(self, data: bytes, context) -> bytes:
        request = msg.decode_request("Barrier", data)
        if not self._check(request, context):
            return b""
        pending = _Pending()
        self.service.barrier(request["barrier_id"], request["counter"],
                             request["barrier_timeout_in_ms"] / 1000.0,
                             request["source_task_id"], request["task_ids"], pending.finish)
        result = self._waited(pending, context)
        if result is None:
            return b""
        status, counter = result
        if status is not None:
            return self._fail(context, status)
        return msg.encode_response("Barrier", {"counter": counter})

    def _CancelBarrier(self, data: bytes, context) -> bytes:
        request = msg.decode_request("CancelBarrier", data)
        if not self._check(request, context):
            return b""
        error = self.service.cancel_barrier(request["barrier_id"], request["counter"],
                                            request["source_task_id"])
        return b"" if error is None else self._fail(context, error)

    def _GetAliveTasks(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetAliveTasks", data)
        if not self._check(request, context):
            return b""
        pending = _Pending()
        self.service.get_alive_tasks(request["requesting_task_id"], request["task_ids"],
                                     pending.finish)
        result = self._waited(pending, context)
        if result is None:
            return b""
        status, alive, incarnations = result
        if status is not None:
            return self._fail(context, status)
        return msg.encode_response("GetAliveTasks", {"alive_task_ids": alive,
                                                     "incarnations": incarnations})

    def _PollForError(self, data: bytes, context) -> bytes:
        request = msg.decode_request("PollForError", data)
        if not self._check(request, context):
            return b""
        pending = _Pending()
        self.service.poll_for_error(request["source_task_id"], pending.finish)
        result = self._waited(pending, context)
        if result is None:
            return b""
        return self._fail(context, result[0])

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop the service (pending waits end with an error) and the server."""
        self.service.stop()
        self._server.stop(grace).wait()
        self._pool.shutdown()


class DistributedRuntimeService:
    """The coordination service of a job, listening (jaxlib's ``DistributedRuntimeService``);
    made by `get_distributed_runtime_service`.

    Attributes:
      address: the address it was asked to bind.
      port: the port it listens on (the one chosen, for a port 0).
      num_nodes: processes in the job.
    """

    def __init__(self, address: str, num_nodes: int, heartbeat_timeout: float | None = None,
                 cluster_register_timeout: float | None = None,
                 shutdown_timeout: float | None = None, recoverable: bool | None = None):
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"num_nodes must be a positive int, not {num_nodes!r}")
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"the service's address must be 'host:port' (or '[::]:port'), not "
                             f"{address!r}")
        service = CoordinationService(
            num_nodes, 100.0 if heartbeat_timeout is None else float(heartbeat_timeout),
            3600.0 if cluster_register_timeout is None else float(cluster_register_timeout),
            300.0 if shutdown_timeout is None else float(shutdown_timeout), bool(recoverable))
        self._server: GrpcCoordinationServer | None = GrpcCoordinationServer(address, service)
        self.address = address
        self.port = self._server.port
        self.num_nodes = num_nodes

    def shutdown(self) -> None:
        """Stop the service: waits still pending end with an error; the port is free again
        when this returns. Does nothing the second time."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - nothing may escape a finaliser
            pass

    def __repr__(self) -> str:
        state = "stopped" if self._server is None else f"listening on port {self.port}"
        return f"DistributedRuntimeService({self.address!r}, num_nodes={self.num_nodes}, {state})"


def get_distributed_runtime_service(address: str, num_nodes: int,
                                    heartbeat_timeout: int | None = None,
                                    cluster_register_timeout: int | None = None,
                                    shutdown_timeout: int | None = None,
                                    recoverable: bool | None = None) -> DistributedRuntimeService:
    """Start XLA's coordination service for a job of ``num_nodes`` processes on ``address``
    (jaxlib's function of the same name; times in seconds: heartbeat_timeout 100,
    cluster_register_timeout 3600, shutdown_timeout 300 by default).

    Raises:
      ImportError: grpcio is missing (``pip install 'pjrt[distributed]'``).
      OSError: the address cannot be bound (the port is in use).
      ValueError: ``num_nodes`` or ``address`` is malformed.
    """
    return DistributedRuntimeService(address, num_nodes, heartbeat_timeout,
                                     cluster_register_timeout, shutdown_timeout, recoverable)
