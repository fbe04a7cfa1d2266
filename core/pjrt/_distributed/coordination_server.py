"""XLA's coordination service on a gRPC server: jaxlib's ``DistributedRuntimeService``.

`GrpcCoordinationServer` serves `CoordinationService`'s rules as the gRPC service
``xla.coordination.CoordinationService``, with generic handlers that take and return the bytes
`pjrt._distributed.coordination_messages` reads and writes. The server is gRPC's asyncio
server, on an event loop of its own (a daemon thread, which never holds the interpreter's
exit): a handler that waits (a registration, a barrier, a blocking get, error polling) awaits
a future its ``done`` callback settles, so a job of many processes holds no thread per wait,
and a caller that goes away cancels its handler.
"""
from __future__ import annotations

import asyncio
import atexit
import sys
import threading
import weakref

from ..errors import ErrorCode
from . import coordination_messages as msg
from .coordination_messages import make_status
from .coordination_service import CoordinationService


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
        self._loop = asyncio.new_event_loop()
        self._loop_thread = 0
        self._server = None
        started: asyncio.Future | None = None
        ready = threading.Event()
        outcome: list = []

        def run() -> None:
            self._loop_thread = threading.get_ident()
            asyncio.set_event_loop(self._loop)
            try:
                outcome.append(self._loop.run_until_complete(self._start(grpc, address)))
            except BaseException as error:  # noqa: BLE001 - handed to the constructor
                outcome.append(error)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="pjrt-coordination", daemon=True)
        self._thread.start()
        ready.wait()
        del started
        result = outcome[0]
        if isinstance(result, BaseException) or not result:
            service.stop()
            self._thread.join(5)
            self._loop.close()
            raise OSError(f"the coordination service cannot listen on {address}: the port is "
                          f"in use (another job's service?) or the host is not an address of "
                          f"this machine") from (result if isinstance(result, BaseException)
                                                 else None)
        self.port = result

    async def _start(self, grpc, address: str) -> int:
        server = grpc.aio.server(
            # One service per port: without this, gRPC lets a second server bind a port in use
            # (SO_REUSEPORT), and clients would reach either at random.
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1)])
        handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(self, "_" + name))
                    for name in msg.METHODS}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(msg.SERVICE, handlers),))
        port = server.add_insecure_port(address)
        if port:
            await server.start()
            self._server = server
        return port

    def _waiter(self):
        """A future of the loop and the ``done`` callback that settles it from any thread."""
        future = self._loop.create_future()

        def finish(*result) -> None:
            if threading.get_ident() == self._loop_thread:
                if not future.done():
                    future.set_result(result)
            else:
                self._loop.call_soon_threadsafe(_settle, future, result)

        return future, finish

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

    async def _RegisterTask(self, data: bytes, context) -> bytes:
        request = msg.decode_request("RegisterTask", data)
        pending, finish = self._waiter()
        self.service.register_task(request["source_task_id"], request["incarnation"],
                                   finish)
        result = await pending
        if result[0] is not None:
            return self._fail(context, result[0])
        return msg.encode_response("RegisterTask",
                                   {"service_incarnation": self.service.incarnation})

    async def _Heartbeat(self, data: bytes, context) -> bytes:
        request = msg.decode_request("Heartbeat", data)
        if not self._check(request, context):
            return b""
        error = self.service.heartbeat(request["source_task_id"], request["incarnation"])
        if error is not None:
            return self._fail(context, error)
        return msg.encode_response("Heartbeat", {"service_incarnation": self.service.incarnation})

    async def _ShutdownTask(self, data: bytes, context) -> bytes:
        request = msg.decode_request("ShutdownTask", data)
        if not self._check(request, context):
            return b""
        pending, finish = self._waiter()
        self.service.shutdown_task(request["source_task_id"], finish)
        result = await pending
        if result[0] is not None:
            return self._fail(context, result[0])
        return b""

    async def _WatchTasks(self, data: bytes, context) -> bytes:
        request = msg.decode_request("WatchTasks", data)
        if not self._check(request, context):
            return b""
        pending, finish = self._waiter()
        self.service.watch_tasks(request["version_number"], finish)
        result = await pending
        infos, version = result
        return msg.encode_response("WatchTasks", {"task_state": infos, "version_number": version})

    async def _InsertKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("InsertKeyValue", data)
        if not self._check(request, context):
            return b""
        key, value = request["kv"]
        error = self.service.store.insert(key, value, request["allow_overwrite"])
        return b"" if error is None else self._fail(context, error)

    async def _GetKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetKeyValue", data)
        if not self._check(request, context):
            return b""
        key = request["key"]
        value = self.service.store.try_get(key)
        if value is None:
            pending, finish = self._waiter()
            self.service.store.get(key, finish)
            try:
                result = await pending
            except asyncio.CancelledError:
                self.service.store.forget_get(key, finish)  # the caller went away
                raise
            if result[0] is not None:
                return self._fail(context, result[0])
            value = result[1]
        return msg.encode_response("GetKeyValue", {"key": key, "value": value})

    async def _TryGetKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("TryGetKeyValue", data)
        if not self._check(request, context):
            return b""
        key = request["key"]
        value = self.service.store.try_get(key)
        if value is None:
            return self._fail(context, make_status(ErrorCode.NOT_FOUND, f"Config key {key} not found."))
        return msg.encode_response("TryGetKeyValue", {"key": key, "value": value})

    async def _IncrementKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("IncrementKeyValue", data)
        if not self._check(request, context):
            return b""
        error, value = self.service.store.increment(request["key"], request["increment"])
        if error is not None:
            return self._fail(context, error)
        return msg.encode_response("IncrementKeyValue", {"key": request["key"], "value": value})

    async def _GetKeyValueDir(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetKeyValueDir", data)
        if not self._check(request, context):
            return b""
        entries = self.service.store.get_dir(request["directory_key"])
        return msg.encode_response("GetKeyValueDir", {"kv": entries})

    async def _DeleteKeyValue(self, data: bytes, context) -> bytes:
        request = msg.decode_request("DeleteKeyValue", data)
        if not self._check(request, context):
            return b""
        self.service.store.delete(request["key"])
        return b""

    async def _Barrier(self, data: bytes, context) -> bytes:
        request = msg.decode_request("Barrier", data)
        if not self._check(request, context):
            return b""
        pending, finish = self._waiter()
        self.service.barrier(request["barrier_id"], request["counter"],
                             request["barrier_timeout_in_ms"] / 1000.0,
                             request["source_task_id"], request["task_ids"], finish)
        result = await pending
        status, counter = result
        if status is not None:
            return self._fail(context, status)
        return msg.encode_response("Barrier", {"counter": counter})

    async def _CancelBarrier(self, data: bytes, context) -> bytes:
        request = msg.decode_request("CancelBarrier", data)
        if not self._check(request, context):
            return b""
        error = self.service.cancel_barrier(request["barrier_id"], request["counter"],
                                            request["source_task_id"])
        return b"" if error is None else self._fail(context, error)

    async def _GetAliveTasks(self, data: bytes, context) -> bytes:
        request = msg.decode_request("GetAliveTasks", data)
        if not self._check(request, context):
            return b""
        pending, finish = self._waiter()
        self.service.get_alive_tasks(request["requesting_task_id"], request["task_ids"],
                                     finish)
        result = await pending
        status, alive, incarnations = result
        if status is not None:
            return self._fail(context, status)
        return msg.encode_response("GetAliveTasks", {"alive_task_ids": alive,
                                                     "incarnations": incarnations})

    async def _PollForError(self, data: bytes, context) -> bytes:
        request = msg.decode_request("PollForError", data)
        if not self._check(request, context):
            return b""
        pending, finish = self._waiter()
        self.service.poll_for_error(request["source_task_id"], finish)
        result = await pending
        return self._fail(context, result[0])

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop the service (pending waits end with an error) and the server."""
        self.service.stop()
        server, self._server = self._server, None
        if server is not None and self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(server.stop(grace), self._loop).result(
                    (grace or 0) + 10)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)


def _settle(future, result) -> None:
    if not future.done():
        future.set_result(result)


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
                 shutdown_timeout: float | None = None, recoverable: bool | None = None, *,
                 initial_values: dict[str, bytes] | None = None):
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"num_nodes must be a positive int, not {num_nodes!r}")
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"the service's address must be 'host:port' (or '[::]:port'), not "
                             f"{address!r}")
        service = CoordinationService(
            num_nodes, 100.0 if heartbeat_timeout is None else float(heartbeat_timeout),
            3600.0 if cluster_register_timeout is None else float(cluster_register_timeout),
            300.0 if shutdown_timeout is None else float(shutdown_timeout), bool(recoverable))
        for key, value in (initial_values or {}).items():  # there before any process joins
            service.store.insert(key, value, allow_overwrite=True)
        self._server: GrpcCoordinationServer | None = GrpcCoordinationServer(address, service)
        self.address = address
        self.port = self._server.port
        self.num_nodes = num_nodes
        _live_services.add(self)

    def shutdown(self) -> None:
        """Stop the service: waits still pending end with an error; the port is free again
        when this returns. Does nothing the second time."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __del__(self):
        try:
            if not sys.is_finalizing():  # the loop's thread no longer runs then
                self.shutdown()
        except Exception:  # noqa: BLE001 - nothing may escape a finaliser
            pass

    def __repr__(self) -> str:
        state = "stopped" if self._server is None else f"listening on port {self.port}"
        return f"DistributedRuntimeService({self.address!r}, num_nodes={self.num_nodes}, {state})"


#: Services still running, stopped at exit while their event loops still run (the clients of
#: this process are closed first: their module registers its hook later).
_live_services: "weakref.WeakSet[DistributedRuntimeService]" = weakref.WeakSet()


@atexit.register
def _stop_services_at_exit() -> None:
    for service in list(_live_services):
        try:
            service.shutdown()
        except Exception:  # noqa: BLE001 - the exit goes on
            pass


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
