"""XLA's coordination service on a gRPC server: jaxlib's ``DistributedRuntimeService``.

`GrpcCoordinationServer` serves `CoordinationService`'s rules as the gRPC service
``xla.coordination.CoordinationService``, reading and writing the bytes of
`pjrt._distributed.coordination_messages`. It drives gRPC's core server from one thread of its
own (a daemon thread, which never holds the interpreter's exit) through grpcio's Cython layer:
the thread waits on the server's completion queue, reads each request, runs its handler and
starts the batch that answers it, with no hand-off to another thread or an event loop (a
call costs about what one costs jaxlib's C++ service; grpcio's thread-pool and asyncio servers
took 1.5-2.5x that, most of it moving each call between threads). A handler that waits (a
registration, a barrier, a blocking get, error polling) hands the service a ``done`` callback
and returns; whichever thread calls ``done`` later starts the answer, so a job of many
processes holds no thread per wait. A blocking get whose caller goes away (its deadline
passed, or it cancelled) is forgotten when gRPC closes its call; a later answer to any other
call whose caller went away is dropped by gRPC.

Where grpcio's Cython layer is not what this module expects (a grpcio far from the versions
tested), the service runs on grpcio's public asyncio server instead, with the same handlers.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import weakref
from typing import Callable

from ..errors import ErrorCode
from . import coordination_messages as msg
from .coordination_messages import make_status
from .coordination_service import CoordinationService

logger = logging.getLogger(__name__)


def import_grpc():
    try:
        import grpc  # pyright: ignore[reportMissingImports]  (optional: pjrt[distributed])
    except ImportError as error:
        raise ImportError("pjrt's distributed runtime needs grpcio: pip install "
                          "'pjrt[distributed]' (or pip install grpcio)") from error
    return grpc


def _core_layer():
    """grpcio's Cython layer, or None where it lacks what `_CoreServer` uses."""
    try:
        from grpc._cython import cygrpc  # pyright: ignore[reportMissingImports]
    except ImportError:
        return None
    needed = {"Server": ("add_http2_port", "request_call", "register_completion_queue",
                         "start", "shutdown", "cancel_all_calls"),
              "CompletionQueue": ("poll",), "Call": ("start_server_batch",),
              "CompletionType": ("queue_timeout", "queue_shutdown")}
    for name, attributes in needed.items():
        holder = getattr(cygrpc, name, None)
        if holder is None or not all(hasattr(holder, a) for a in attributes):
            return None
    for name in ("ReceiveMessageOperation", "ReceiveCloseOnServerOperation",
                 "SendInitialMetadataOperation", "SendMessageOperation",
                 "SendStatusFromServerOperation"):
        if not hasattr(cygrpc, name):
            return None
    return cygrpc


_SERVER_OPTIONS = (
    # One service per port: without this, gRPC lets a second server bind a port in use
    # (SO_REUSEPORT), and clients would reach either at random.
    ("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1))


class _Handlers:
    """The service's methods on request bytes: each reads its request and answers through
    ``call`` (`_CoreCall` or `_AsyncCall`) at once, or hands the service a callback that
    answers later and marks the call held (``call.hold``)."""

    def __init__(self, service: CoordinationService):
        self.service = service
        self.table = {name: getattr(self, "_" + name) for name in msg.METHODS}
        incarnation = service.incarnation
        self._incarnation_reply = msg.encode_response(
            "RegisterTask", {"service_incarnation": incarnation})
        self._mismatch_payloads = msg.encode_payloads(
            {msg.COORDINATION_ERROR_KEY: b"",
             msg.SERVICE_MISMATCH_KEY: b"\x09" + incarnation.to_bytes(8, "little")})
        self._payloads: dict = {}

    def fail(self, call, status) -> None:
        code, message, source = status
        payload = self._payloads.get(source)
        if payload is None:
            payload = self._payloads[source] = msg.encode_payloads(
                {msg.COORDINATION_ERROR_KEY: msg.coordination_error_payload(source)})
        call.answer(b"", code or ErrorCode.UNKNOWN, message, payload)

    def _check(self, request: dict, call) -> bool:
        incarnations = request.get("incarnations")
        got = incarnations["service_incarnation"] if incarnations else 0
        if got == self.service.incarnation:
            return True
        call.answer(b"", ErrorCode.INTERNAL,
                    f"this process speaks to an earlier coordination service at this address "
                    f"(incarnation {got}; this one is {self.service.incarnation}): it belongs "
                    f"to a job that has ended; start it again with the new job",
                    self._mismatch_payloads)
        return False

    def _RegisterTask(self, data: bytes, call) -> None:
        request = msg.decode_request("RegisterTask", data)

        def done(status) -> None:
            if status is not None:
                self.fail(call, status)
            else:
                call.answer(self._incarnation_reply)

        self.service.register_task(request["source_task_id"], request["incarnation"], done)
        call.hold()

    def _Heartbeat(self, data: bytes, call) -> None:
        request = msg.decode_request("Heartbeat", data)
        if not self._check(request, call):
            return
        error = self.service.heartbeat(request["source_task_id"], request["incarnation"])
        if error is not None:
            return self.fail(call, error)
        call.answer(self._incarnation_reply)  # the same bytes as RegisterTask's response

    def _ShutdownTask(self, data: bytes, call) -> None:
        request = msg.decode_request("ShutdownTask", data)
        if not self._check(request, call):
            return

        def done(status) -> None:
            if status is not None:
                self.fail(call, status)
            else:
                call.answer(b"")

        self.service.shutdown_task(request["source_task_id"], done)
        call.hold()

    def _WatchTasks(self, data: bytes, call) -> None:
        request = msg.decode_request("WatchTasks", data)
        if not self._check(request, call):
            return

        def done(infos, version) -> None:
            call.answer(msg.encode_response("WatchTasks", {"task_state": infos,
                                                           "version_number": version}))

        self.service.watch_tasks(request["version_number"], done)
        call.hold()

    def _InsertKeyValue(self, data: bytes, call) -> None:
        request = msg.decode_request("InsertKeyValue", data)
        if not self._check(request, call):
            return
        key, value = request["kv"]
        error = self.service.store.insert(key, value, request["allow_overwrite"])
        if error is None:
            call.answer(b"")
        else:
            self.fail(call, error)

    def _GetKeyValue(self, data: bytes, call) -> None:
        request = msg.decode_request("GetKeyValue", data)
        if not self._check(request, call):
            return
        key = request["key"]
        store = self.service.store
        value = store.try_get(key)
        if value is not None:
            return call.answer(msg.encode_response("GetKeyValue", {"key": key, "value": value}))

        def done(status, value=b"") -> None:
            if status is not None:
                self.fail(call, status)
            else:
                call.answer(msg.encode_response("GetKeyValue", {"key": key, "value": value}))

        store.get(key, done)
        call.hold(lambda: store.forget_get(key, done))  # the caller went away

    def _TryGetKeyValue(self, data: bytes, call) -> None:
        request = msg.decode_request("TryGetKeyValue", data)
        if not self._check(request, call):
            return
        key = request["key"]
        value = self.service.store.try_get(key)
        if value is None:
            return self.fail(call, make_status(ErrorCode.NOT_FOUND,
                                               f"Config key {key} not found."))
        call.answer(msg.encode_response("TryGetKeyValue", {"key": key, "value": value}))

    def _IncrementKeyValue(self, data: bytes, call) -> None:
        request = msg.decode_request("IncrementKeyValue", data)
        if not self._check(request, call):
            return
        error, value = self.service.store.increment(request["key"], request["increment"])
        if error is not None:
            return self.fail(call, error)
        call.answer(msg.encode_response("IncrementKeyValue", {"key": request["key"],
                                                              "value": value}))

    def _GetKeyValueDir(self, data: bytes, call) -> None:
        request = msg.decode_request("GetKeyValueDir", data)
        if not self._check(request, call):
            return
        entries = self.service.store.get_dir(request["directory_key"])
        call.answer(msg.encode_response("GetKeyValueDir", {"kv": entries}))

    def _DeleteKeyValue(self, data: bytes, call) -> None:
        request = msg.decode_request("DeleteKeyValue", data)
        if not self._check(request, call):
            return
        self.service.store.delete(request["key"])
        call.answer(b"")

    def _Barrier(self, data: bytes, call) -> None:
        request = msg.decode_request("Barrier", data)
        if not self._check(request, call):
            return

        def done(status, counter) -> None:
            if status is not None:
                self.fail(call, status)
            else:
                call.answer(msg.encode_response("Barrier", {"counter": counter}))

        self.service.barrier(request["barrier_id"], request["counter"],
                             request["barrier_timeout_in_ms"] / 1000.0,
                             request["source_task_id"], request["task_ids"], done)
        call.hold()

    def _CancelBarrier(self, data: bytes, call) -> None:
        request = msg.decode_request("CancelBarrier", data)
        if not self._check(request, call):
            return
        error = self.service.cancel_barrier(request["barrier_id"], request["counter"],
                                            request["source_task_id"])
        if error is None:
            call.answer(b"")
        else:
            self.fail(call, error)

    def _GetAliveTasks(self, data: bytes, call) -> None:
        request = msg.decode_request("GetAliveTasks", data)
        if not self._check(request, call):
            return

        def done(status, alive, incarnations) -> None:
            if status is not None:
                self.fail(call, status)
            else:
                call.answer(msg.encode_response("GetAliveTasks", {
                    "alive_task_ids": alive, "incarnations": incarnations}))

        self.service.get_alive_tasks(request["requesting_task_id"], request["task_ids"], done)
        call.hold()

    def _PollForError(self, data: bytes, call) -> None:
        request = msg.decode_request("PollForError", data)
        if not self._check(request, call):
            return
        self.service.poll_for_error(request["source_task_id"],
                                    lambda status: self.fail(call, status))
        call.hold()


_NEW_CALL = object()
_SHUTDOWN = object()


class _CoreCall:
    """One call on `_CoreServer`: its request is read; ``answer`` sends the response (or an
    error status) from any thread, once."""

    __slots__ = ("_core", "_call", "_answered", "_held", "_on_cancel", "_lock")

    def __init__(self, core, call, lock):
        self._core = core
        self._call = call
        self._answered = False
        self._held = False
        self._on_cancel = None
        self._lock = lock

    def answer(self, response: bytes, code: int = 0, details: str = "",
               trailing: bytes | None = None) -> None:
        with self._lock:
            if self._answered:
                return
            self._answered = True
            held = self._held
        core = self._core
        metadata = None if trailing is None else ((msg.STATUS_DETAILS_KEY, trailing),)
        if code:
            operations = [core.SendInitialMetadataOperation(None, 0),
                          core.SendStatusFromServerOperation(
                              metadata, int(code), details.encode("utf-8", "replace"), 0)]
        else:
            operations = [core.SendInitialMetadataOperation(None, 0),
                          core.SendMessageOperation(response, 0),
                          core.SendStatusFromServerOperation(None, 0, b"", 0)]
        if not held:
            operations.append(core.ReceiveCloseOnServerOperation(0))
        try:
            self._call.start_server_batch(operations, None)
        except Exception:  # noqa: BLE001 - the call has ended (its caller went away)
            pass

    def hold(self, on_cancel: Callable | None = None) -> None:
        """The answer comes later; with ``on_cancel``, watch for the caller going away
        meanwhile (without, an answer to a caller that went away is dropped by gRPC: one
        completion fewer per barrier call)."""
        if on_cancel is None:
            return
        with self._lock:
            if self._answered:
                return
            self._held = True
            self._on_cancel = on_cancel
        try:
            self._call.start_server_batch((self._core.ReceiveCloseOnServerOperation(0),),
                                          self._closed)
        except Exception:  # noqa: BLE001
            pass

    def _closed(self, event) -> None:
        if not event.batch_operations[0].cancelled():
            return
        with self._lock:
            if self._answered:
                return
            self._answered = True
            on_cancel, self._on_cancel = self._on_cancel, None
        if on_cancel is not None:
            on_cancel()


class _CoreServer:
    """gRPC's core server driven from one thread (see the module's docstring)."""

    def __init__(self, core, address: str, handlers: _Handlers):
        self._core = core
        self._handlers = handlers.table
        self._lock = threading.Lock()
        self._queue = core.CompletionQueue()
        self._server = core.Server(_SERVER_OPTIONS, False)
        self._server.register_completion_queue(self._queue)
        self.port = self._server.add_http2_port(address.encode())
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if self.port:
            self._server.start()
            self._server.request_call(self._queue, self._queue, _NEW_CALL)
            self._thread = threading.Thread(target=self._serve, name="pjrt-coordination",
                                            daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        core, queue, server = self._core, self._queue, self._server
        timeout, closed = core.CompletionType.queue_timeout, core.CompletionType.queue_shutdown
        serving = True
        while True:
            event = queue.poll()
            kind = event.completion_type
            if kind == timeout:
                continue
            if kind == closed:
                break
            tag = event.tag
            try:
                if tag is _NEW_CALL:
                    if not event.success:
                        serving = False  # the server is shutting down
                        continue
                    if serving:
                        server.request_call(queue, queue, _NEW_CALL)
                    self._receive(event)
                elif tag is _SHUTDOWN:
                    break
                elif tag is not None:
                    tag(event)
            except Exception:  # noqa: BLE001 - the server keeps serving
                logger.exception("the coordination service failed to handle a call")
            event = tag = None
        self._stopped.set()

    def _receive(self, event) -> None:
        call = event.call
        method = event.call_details.method
        name = method.rsplit(b"/", 1)[-1].decode("ascii", "replace")
        handler = self._handlers.get(name)
        answer = _CoreCall(self._core, call, self._lock)
        if handler is None or method != _PATHS.get(name):
            answer.answer(b"", ErrorCode.UNIMPLEMENTED,
                          f"method {method.decode('ascii', 'replace')} is not served here")
            return

        def received(done_event) -> None:
            data = done_event.batch_operations[0].message() if done_event.success else None
            if data is None:
                return answer.answer(b"", ErrorCode.CANCELLED, "the request did not arrive")
            try:
                handler(data, answer)
            except Exception as error:  # noqa: BLE001 - an answer, not a dead server
                logger.exception("coordination service handler %s failed", name)
                answer.answer(b"", ErrorCode.INTERNAL, f"{name} failed: {error!r}")

        call.start_server_batch((self._core.ReceiveMessageOperation(0),), received)

    def stop(self, grace: float | None) -> None:
        if self._thread is None:
            return
        self._server.shutdown(self._queue, _SHUTDOWN)
        if not self._stopped.wait(grace or 0):
            self._server.cancel_all_calls()
        self._thread.join(10)


_PATHS = {name: msg.method_path(name).encode() for name in msg.METHODS}


class _AsyncCall:
    """One call on `_AsyncServer`: ``answer`` settles the future its handler awaits."""

    __slots__ = ("_loop", "_thread", "future", "_on_cancel")

    def __init__(self, loop, thread: int):
        self._loop = loop
        self._thread = thread
        self.future = loop.create_future()
        self._on_cancel = None

    def answer(self, response: bytes, code: int = 0, details: str = "",
               trailing: bytes | None = None) -> None:
        result = (response, code, details, trailing)
        if threading.get_ident() == self._thread:
            _settle(self.future, result)
        else:
            self._loop.call_soon_threadsafe(_settle, self.future, result)

    def hold(self, on_cancel: Callable | None = None) -> None:
        self._on_cancel = on_cancel


class _AsyncServer:
    """grpcio's asyncio server on an event loop of its own thread: where its Cython layer
    is not the one `_CoreServer` drives."""

    def __init__(self, grpc, address: str, handlers: _Handlers):
        self._grpc = grpc
        self._codes = {code.value[0]: code for code in grpc.StatusCode}
        self._loop = asyncio.new_event_loop()
        self._loop_thread = 0
        self._server = None
        ready = threading.Event()
        outcome: list = []

        def run() -> None:
            self._loop_thread = threading.get_ident()
            asyncio.set_event_loop(self._loop)
            try:
                outcome.append(self._loop.run_until_complete(self._start(address, handlers)))
            except BaseException as error:  # noqa: BLE001 - handed to the constructor
                outcome.append(error)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="pjrt-coordination", daemon=True)
        self._thread.start()
        ready.wait()
        result = outcome[0]
        if isinstance(result, BaseException):
            self._thread.join(5)
            self._loop.close()
            raise result
        self.port = result
        if not result:
            self._thread.join(5)
            self._loop.close()

    async def _start(self, address: str, handlers: _Handlers) -> int:
        grpc = self._grpc
        server = grpc.aio.server(options=list(_SERVER_OPTIONS))
        table = {name: grpc.unary_unary_rpc_method_handler(self._wrap(handler))
                 for name, handler in handlers.table.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(msg.SERVICE,
                                                                              table),))
        port = server.add_insecure_port(address)
        if port:
            await server.start()
            self._server = server
        else:
            self._loop.call_soon(self._loop.stop)
        return port

    def _wrap(self, handler):
        async def handle(data: bytes, context) -> bytes:
            call = _AsyncCall(self._loop, self._loop_thread)
            handler(data, call)
            try:
                response, code, details, trailing = await call.future
            except asyncio.CancelledError:
                if call._on_cancel is not None:
                    call._on_cancel()
                raise
            if not code:
                return response
            if trailing is not None:
                context.set_trailing_metadata(((msg.STATUS_DETAILS_KEY, trailing),))
            context.set_code(self._codes.get(code, self._codes[ErrorCode.UNKNOWN]))
            context.set_details(details)
            return b""
        return handle

    def stop(self, grace: float | None) -> None:
        server, self._server = self._server, None
        if server is not None and self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(server.stop(grace), self._loop).result(
                    (grace or 0) + 10)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)


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
        handlers = _Handlers(service)
        core = _core_layer()
        error = None
        try:
            self._transport = (_CoreServer(core, address, handlers) if core is not None
                               else _AsyncServer(grpc, address, handlers))
            port = self._transport.port
        except Exception as failure:  # noqa: BLE001 - reported as the address's fault below
            error, port = failure, 0
        if not port:
            service.stop()
            raise OSError(f"the coordination service cannot listen on {address}: the port is "
                          f"in use (another job's service?) or the host is not an address of "
                          f"this machine") from error
        self.port = port

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop the service (pending waits end with an error) and the server."""
        self.service.stop()
        self._transport.stop(grace)


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
