"""The client's side of gRPC: unary calls to the coordination service, as bytes.

`CoreChannel` drives gRPC's core channel through grpcio's Cython layer (``cygrpc``): a call
is one batch of the six operations of a unary call on a call with a completion queue of its
own, waited on by the calling thread (gRPC checks for signals every 200 ms meanwhile, so
Ctrl-C interrupts a wait, and the interrupted call is cancelled). That skips grpcio's public
layer (its per-call state, event handling and error objects: about a fifth of a call's CPU
time on the client). `PublicChannel` is grpcio's public API, for a grpcio whose Cython layer
is not what `core_layer` checks for; both answer the same way.

A failed call raises `RpcFailure` with the status code (an int, as in `pjrt.errors.ErrorCode`),
the details and the trailing metadata.
"""
from __future__ import annotations

import inspect
import sys
import time
from typing import Any, Sequence

from ..errors import ErrorCode
from . import coordination_messages as msg

#: How long one wait of `PublicChannel` lasts before it looks for a signal again.
_SLICE_S = 1.0

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
    # Reconnect quickly while the service starts (the default backs off to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0))
_GZIP = 2  # grpc_compression_algorithm's GRPC_COMPRESS_GZIP
_METHOD_PATHS = tuple(msg.method_path(name).encode() for name in msg.METHODS)


class RpcFailure(Exception):
    """A call that ended with a status other than OK."""

    def __init__(self, code: int, details: str, trailing: Sequence[Any] | None = ()):
        super().__init__(code, details)
        self.code = code
        self.details = details
        self.trailing = tuple(trailing or ())


def core_layer():
    """grpcio's Cython layer, or None where its client side is not what `CoreChannel`
    drives (the names it uses, and the arguments of ``Channel.segregated_call``)."""
    try:
        from grpc._cython import cygrpc  # pyright: ignore[reportMissingImports]
    except ImportError:
        return None
    needed = {"Channel": ("segregated_call", "close"), "SegregatedCall": ("next_event", "cancel"),
              "ReceiveStatusOnClientOperation": ("code", "details", "trailing_metadata"),
              "ReceiveMessageOperation": ("message",), "PropagationConstants": (
                  "GRPC_PROPAGATE_DEFAULTS",)}
    for name, attributes in needed.items():
        holder = getattr(cygrpc, name, None)
        if holder is None or not all(hasattr(holder, a) for a in attributes):
            return None
    for name in ("SendInitialMetadataOperation", "SendMessageOperation",
                 "SendCloseFromClientOperation", "ReceiveInitialMetadataOperation"):
        if not hasattr(cygrpc, name):
            return None
    try:
        parameters = list(inspect.signature(cygrpc.Channel.segregated_call).parameters)
    except (TypeError, ValueError):
        return None
    if parameters[:8] != ["self", "flags", "method", "host", "deadline", "metadata",
                          "credentials", "operationses_and_tags"]:
        return None
    return cygrpc


class _CoreCall:
    """A call in flight on `CoreChannel` (the error poll, the registration)."""

    __slots__ = ("_call", "_operations")

    def __init__(self, call, operations):
        self._call = call
        self._operations = operations

    def result(self) -> bytes:
        """Wait for the answer (Ctrl-C interrupts; the call is then cancelled)."""
        self._call.next_event()
        return _outcome(self._operations)

    def cancel(self) -> None:
        try:
            self._call.cancel(ErrorCode.CANCELLED, "cancelled by the client")
        except Exception:  # noqa: BLE001 - the call has ended
            pass


def _outcome(operations) -> bytes:
    status = operations[5]
    code = status.code()
    if code:
        raise RpcFailure(code, status.details() or "", status.trailing_metadata())
    message = operations[4].message()
    return b"" if message is None else message


class CoreChannel:
    """gRPC's core channel to ``address`` driven through grpcio's Cython layer ``core``."""

    def __init__(self, core, address: str, compression: bool = False):
        self._core = core
        options = _CHANNEL_OPTIONS + ((("grpc.default_compression_algorithm", _GZIP),)
                                      if compression else ())
        self._channel = core.Channel(address.encode(), options, None)
        self._flags = core.PropagationConstants.GRPC_PROPAGATE_DEFAULTS
        # Each method registered with the channel once, here (registering is not
        # thread-safe): a call of a registered method skips looking up its path.
        register = getattr(self._channel, "get_registered_call_handle", None)
        if register is None or "registered_call_handle" not in inspect.signature(
                core.Channel.segregated_call).parameters:
            self._handles = None
        else:
            self._handles = {path: register(path) for path in _METHOD_PATHS}

    def _start(self, path: bytes, request: bytes, timeout: float | None) -> _CoreCall:
        core = self._core
        operations = (core.SendInitialMetadataOperation(None, 0),
                      core.SendMessageOperation(request, 0),
                      core.SendCloseFromClientOperation(0),
                      core.ReceiveInitialMetadataOperation(0),
                      core.ReceiveMessageOperation(0),
                      core.ReceiveStatusOnClientOperation(0))
        deadline = None if timeout is None else time.time() + max(0.0, timeout)
        batch = ((operations, None),)
        handle = None if self._handles is None else self._handles.get(path)
        if handle is None:
            call = self._channel.segregated_call(self._flags, path, None, deadline, None, None,
                                                 batch)
        else:
            call = self._channel.segregated_call(self._flags, path, None, deadline, None, None,
                                                 batch, None, handle)
        return _CoreCall(call, operations)

    def unary(self, path: bytes, request: bytes, timeout: float | None) -> bytes:
        """One call: the response's bytes, or `RpcFailure`."""
        return self._start(path, request, timeout).result()

    def start(self, path: bytes, request: bytes, timeout: float | None = None) -> _CoreCall:
        """A call to wait on later (``result()``) or cancel."""
        return self._start(path, request, timeout)

    def close(self) -> None:
        """Cancel the calls in flight and close the channel (again: nothing)."""
        self._channel.close(ErrorCode.CANCELLED, "the client closed its channel")

    def __del__(self):
        # grpcio's core channel object does not close itself: without this, a client
        # dropped unclosed (one that never connected) would keep its connection.
        try:
            if not sys.is_finalizing():
                self.close()
        except Exception:  # noqa: BLE001 - nothing may escape a finaliser
            pass


class _PublicCall:
    __slots__ = ("_future", "_grpc")

    def __init__(self, grpc, future):
        self._grpc = grpc
        self._future = future

    def result(self) -> bytes:
        grpc = self._grpc
        while True:
            try:
                return self._future.result(timeout=_SLICE_S)
            except grpc.FutureTimeoutError:
                continue
            except grpc.RpcError as error:
                raise _failure(error) from None
            except BaseException:
                self._future.cancel()
                raise

    def cancel(self) -> None:
        self._future.cancel()


def _failure(error) -> RpcFailure:
    code = error.code() if callable(getattr(error, "code", None)) else None
    number = code.value[0] if code is not None else ErrorCode.UNKNOWN
    details = (error.details() if callable(getattr(error, "details", None)) else None) or ""
    try:
        trailing = error.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - a cancelled call has none
        trailing = ()
    return RpcFailure(number, details, trailing)


class PublicChannel:
    """The same calls through grpcio's public API."""

    def __init__(self, grpc, address: str, compression: bool = False):
        self._grpc = grpc
        self._channel = grpc.insecure_channel(
            address, options=list(_CHANNEL_OPTIONS),
            compression=grpc.Compression.Gzip if compression else None)
        self._calls: dict[bytes, Any] = {}

    def _callable(self, path: bytes):
        call = self._calls.get(path)
        if call is None:
            call = self._calls[path] = self._channel.unary_unary(path.decode())
        return call

    def unary(self, path: bytes, request: bytes, timeout: float | None) -> bytes:
        try:
            return self._callable(path)(request, timeout=timeout)
        except self._grpc.RpcError as error:
            raise _failure(error) from None

    def start(self, path: bytes, request: bytes, timeout: float | None = None) -> _PublicCall:
        return _PublicCall(self._grpc, self._callable(path).future(request, timeout=timeout))

    def close(self) -> None:
        self._channel.close()


def open_channel(grpc, address: str, compression: bool = False):
    """`CoreChannel` where grpcio's Cython layer is the one it drives, else `PublicChannel`."""
    core = core_layer()
    if core is not None:
        return CoreChannel(core, address, compression)
    return PublicChannel(grpc, address, compression)
