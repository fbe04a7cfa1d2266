"""The messages of XLA's coordination service, as bytes on the wire.

jaxlib's distributed runtime (its ``DistributedRuntimeService`` and ``DistributedRuntimeClient``)
speaks gRPC service ``xla.coordination.CoordinationService`` (XLA's
``xla/pjrt/distributed/coordination/coordination_service.proto``). This module writes and
reads its requests and responses with pjrt's own protobuf wire code (`pjrt._wire.protowire`),
so the coordination service needs grpcio but not protobuf.

Each message is a plain ``dict`` of the fields it carries (absent fields read as proto3
zeros); ``encode_<Message>`` writes one, ``decode_<Message>`` reads one. Only the fields
XLA's service and agent use are modelled; unknown fields are skipped when reading.

An error status carries, as absl does over gRPC, its payloads in the trailing metadata
``grpc-status-details-bin``: a ``GrpcPayloadContainer`` (``map<string, bytes> payloads = 1``).
XLA's agent tells a service's answer from a transport failure by the payload
`COORDINATION_ERROR_KEY`, and a client of another service instance by
`SERVICE_MISMATCH_KEY`.
"""
from __future__ import annotations

import struct

from .._wire import protowire as pw

SERVICE = "xla.coordination.CoordinationService"
#: The methods of the service, in the order of the proto.
METHODS = ("RegisterTask", "Heartbeat", "ShutdownTask", "WatchTasks", "InsertKeyValue",
           "GetKeyValue", "TryGetKeyValue", "IncrementKeyValue", "GetKeyValueDir",
           "DeleteKeyValue", "Barrier", "CancelBarrier", "GetAliveTasks", "PollForError")

STATUS_DETAILS_KEY = "grpc-status-details-bin"
COORDINATION_ERROR_KEY = "type.googleapis.com/tensorflow.CoordinationServiceError"
SERVICE_MISMATCH_KEY = "type.googleapis.com/tensorflow.ServiceMismatchError"
BARRIER_ERROR_KEY = "type.googleapis.com/tensorflow.BarrierError"

# TaskState
UNSPECIFIED, UNINITIALIZED, DISCONNECTED, CONNECTED, ERROR = range(5)

_FIXED64 = struct.Struct("<Q")

#: An error status as the service answers it: ``(code, message, source task or None)``;
#: None is OK.
Status = tuple


def make_status(code: int, message: str, source_task: int | None = None) -> Status:
    """The error status ``code`` (an `ErrorCode`) with ``message``, naming the task it came
    from when there is one."""
    return (int(code), message, source_task)


def method_path(method: str) -> str:
    """The gRPC path of ``method``: ``/xla.coordination.CoordinationService/<method>``."""
    return f"/{SERVICE}/{method}"


# -- writing ---------------------------------------------------------------------------------

def _fixed64(number: int, value: int) -> bytes:
    if not value:
        return b""
    return pw.tag(number, pw.I64) + _FIXED64.pack(value & 0xFFFFFFFFFFFFFFFF)


def _int(number: int, value: int) -> bytes:
    return pw.int_field(number, value) if value else b""


def _bool(number: int, value: bool) -> bytes:
    return pw.bool_field(number, True) if value else b""


def _str(number: int, value: str) -> bytes:
    return pw.string_field(number, value) if value else b""


def _bytes(number: int, value: bytes) -> bytes:
    return pw.bytes_field(number, value) if value else b""


def _packed(number: int, values) -> bytes:
    return pw.packed_varint_field(number, [int(v) for v in values]) if values else b""


def encode_incarnations(task_incarnation: int, service_incarnation: int,
                        task_id: int = 0) -> bytes:
    """``Incarnations``: which incarnation of a task speaks to which of the service."""
    return (_int(1, task_id) + _fixed64(2, task_incarnation)
            + _fixed64(3, service_incarnation))


def _incarnations_field(message: dict) -> bytes:
    body = message.get("incarnations")
    return b"" if body is None else pw.message_field(1, body)


def encode_kv(key: str, value: bytes) -> bytes:
    """``KeyValueEntry``."""
    return _str(1, key) + _bytes(2, value)


def encode_request(method: str, message: dict) -> bytes:
    """The request of ``method`` with the fields of ``message`` (``incarnations`` already
    written by `encode_incarnations`)."""
    m = message
    if method == "RegisterTask":
        return _fixed64(3, m.get("incarnation", 0)) + _int(5, m.get("source_task_id", 0))
    head = _incarnations_field(m)
    if method == "Heartbeat":
        return head + _fixed64(2, m.get("incarnation", 0)) + _int(3, m.get("source_task_id", 0))
    if method in ("PollForError", "ShutdownTask"):
        return head + _int(2, m.get("source_task_id", 0))
    if method == "WatchTasks":
        return head + _int(2, m.get("version_number", 0))
    if method == "InsertKeyValue":
        return (head + pw.message_field(2, encode_kv(m["key"], m.get("value", b"")))
                + _bool(3, m.get("allow_overwrite", False)))
    if method in ("GetKeyValue", "TryGetKeyValue"):
        return head + _str(2, m["key"])
    if method == "IncrementKeyValue":
        return head + _str(2, m["key"]) + _int(3, m.get("increment", 0))
    if method == "GetKeyValueDir":
        return head + _str(2, m["directory_key"])
    if method == "DeleteKeyValue":
        return head + _str(2, m["key"]) + _bool(3, m.get("is_directory", False))
    if method == "Barrier":
        return (head + _str(2, m["barrier_id"]) + _int(3, m.get("barrier_timeout_in_ms", 0))
                + _packed(4, m.get("task_ids", ())) + _int(5, m.get("source_task_id", 0))
                + _int(6, m.get("counter", 0)))
    if method == "CancelBarrier":
        return (head + _str(2, m["barrier_id"]) + _int(3, m.get("counter", 0))
                + _int(4, m.get("source_task_id", 0)))
    if method == "GetAliveTasks":
        return (head + _int(2, m.get("requesting_task_id", 0))
                + _packed(3, m.get("task_ids", ())))
    raise ValueError(f"no request {method!r} in the coordination service")


def encode_task_info(info: dict) -> bytes:
    """``TaskInfo``: a task's state as ``WatchTasks`` reports it."""
    payload = b""
    if info.get("error_code"):
        payload = pw.message_field(5, _bool(3, False) + _int(4, info["task_id"]))
    return (_int(1, info["task_id"]) + _int(2, info["state"]) + _int(3, info.get("error_code", 0))
            + _str(4, info.get("error_message", "")) + payload
            + _fixed64(6, info.get("incarnation", 0)))


def encode_response(method: str, message: dict) -> bytes:
    """The response of ``method`` with the fields of ``message``."""
    m = message
    if method in ("RegisterTask", "Heartbeat"):
        return _fixed64(1, m.get("service_incarnation", 0))
    if method in ("GetKeyValue", "TryGetKeyValue", "IncrementKeyValue"):
        return pw.message_field(1, encode_kv(m.get("key", ""), m.get("value", b"")))
    if method == "GetKeyValueDir":
        return _str(1, m.get("directory_key", "")) + b"".join(
            pw.message_field(2, encode_kv(k, v)) for k, v in m.get("kv", ()))
    if method == "Barrier":
        return _int(1, m.get("counter", 0))
    if method == "GetAliveTasks":
        ids = m.get("alive_task_ids", ())
        incarnations = m.get("incarnations", ())
        packed = b"".join(_FIXED64.pack(i) for i in incarnations)
        return _packed(1, ids) + (pw.bytes_field(2, packed) if packed else b"")
    if method == "WatchTasks":
        return b"".join(pw.message_field(1, encode_task_info(i))
                        for i in m.get("task_state", ())) + _int(2, m.get("version_number", 0))
    return b""


# -- reading ---------------------------------------------------------------------------------

def _signed(raw: int) -> int:
    return pw.to_int64(raw)


def _decode_kv(data: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _, raw in pw.iter_fields(data):
        if number == 1:
            key = bytes(raw).decode("utf-8", "surrogateescape")
        elif number == 2:
            value = bytes(raw)
    return key, value


def decode_incarnations(data: bytes) -> dict:
    out = {"task_id": 0, "task_incarnation": 0, "service_incarnation": 0}
    for number, _, raw in pw.iter_fields(data):
        if number == 1:
            out["task_id"] = pw.to_int32(raw)
        elif number == 2:
            out["task_incarnation"] = raw
        elif number == 3:
            out["service_incarnation"] = raw
    return out


def _ints(wire_type: int, raw) -> list[int]:
    return [pw.to_int32(v) for v in pw.read_varints(wire_type, raw)]


# Request fields by method: number -> (name, kind).
_REQUEST_FIELDS = {
    "RegisterTask": {3: ("incarnation", "u64"), 5: ("source_task_id", "i32")},
    "Heartbeat": {1: ("incarnations", "inc"), 2: ("incarnation", "u64"),
                  3: ("source_task_id", "i32")},
    "PollForError": {1: ("incarnations", "inc"), 2: ("source_task_id", "i32")},
    "ShutdownTask": {1: ("incarnations", "inc"), 2: ("source_task_id", "i32")},
    "WatchTasks": {1: ("incarnations", "inc"), 2: ("version_number", "i64")},
    "InsertKeyValue": {1: ("incarnations", "inc"), 2: ("kv", "kv"),
                       3: ("allow_overwrite", "bool")},
    "GetKeyValue": {1: ("incarnations", "inc"), 2: ("key", "str")},
    "TryGetKeyValue": {1: ("incarnations", "inc"), 2: ("key", "str")},
    "IncrementKeyValue": {1: ("incarnations", "inc"), 2: ("key", "str"),
                          3: ("increment", "i64")},
    "GetKeyValueDir": {1: ("incarnations", "inc"), 2: ("directory_key", "str")},
    "DeleteKeyValue": {1: ("incarnations", "inc"), 2: ("key", "str"),
                       3: ("is_directory", "bool")},
    "Barrier": {1: ("incarnations", "inc"), 2: ("barrier_id", "str"),
                3: ("barrier_timeout_in_ms", "i64"), 4: ("task_ids", "ints"),
                5: ("source_task_id", "i32"), 6: ("counter", "i64")},
    "CancelBarrier": {1: ("incarnations", "inc"), 2: ("barrier_id", "str"),
                      3: ("counter", "i64"), 4: ("source_task_id", "i32")},
    "GetAliveTasks": {1: ("incarnations", "inc"), 2: ("requesting_task_id", "i32"),
                      3: ("task_ids", "ints")},
}

_ZEROS = {"u64": 0, "i32": 0, "i64": 0, "bool": False, "str": "", "kv": ("", b""),
          "inc": None}


def decode_request(method: str, data: bytes) -> dict:
    """The fields of a request of ``method`` (absent ones as their zero; ``incarnations`` a
    dict or None, ``kv`` a ``(key, value)`` pair, ``task_ids`` a list)."""
    fields = _REQUEST_FIELDS[method]
    out: dict = {}
    for name, kind in fields.values():
        out[name] = [] if kind == "ints" else _ZEROS[kind]
    for number, wire_type, raw in pw.iter_fields(data):
        field = fields.get(number)
        if field is None:
            continue
        name, kind = field
        if kind == "u64":
            out[name] = raw
        elif kind == "i32":
            out[name] = pw.to_int32(raw)
        elif kind == "i64":
            out[name] = _signed(raw)
        elif kind == "bool":
            out[name] = bool(raw)
        elif kind == "str":
            out[name] = bytes(raw).decode("utf-8", "surrogateescape")
        elif kind == "kv":
            out[name] = _decode_kv(raw)
        elif kind == "inc":
            out[name] = decode_incarnations(raw)
        elif kind == "ints":
            out[name].extend(_ints(wire_type, raw))
    return out


def decode_response(method: str, data: bytes) -> dict:
    """The fields of a response of ``method``."""
    out: dict = {}
    if method in ("RegisterTask", "Heartbeat"):
        out["service_incarnation"] = 0
        for number, _, raw in pw.iter_fields(data):
            if number == 1:
                out["service_incarnation"] = raw
    elif method in ("GetKeyValue", "TryGetKeyValue", "IncrementKeyValue"):
        out["key"], out["value"] = "", b""
        for number, _, raw in pw.iter_fields(data):
            if number == 1:
                out["key"], out["value"] = _decode_kv(raw)
    elif method == "GetKeyValueDir":
        out["kv"] = []
        for number, _, raw in pw.iter_fields(data):
            if number == 2:
                out["kv"].append(_decode_kv(raw))
    elif method == "Barrier":
        out["counter"] = 0
        for number, _, raw in pw.iter_fields(data):
            if number == 1:
                out["counter"] = _signed(raw)
    elif method == "GetAliveTasks":
        out["alive_task_ids"], out["incarnations"] = [], []
        for number, wire_type, raw in pw.iter_fields(data):
            if number == 1:
                out["alive_task_ids"].extend(_ints(wire_type, raw))
            elif number == 2:
                if wire_type == pw.LEN:
                    out["incarnations"].extend(
                        v for (v,) in _FIXED64.iter_unpack(bytes(raw)))
                else:
                    out["incarnations"].append(raw)
    return out


# -- error statuses --------------------------------------------------------------------------

def encode_payloads(payloads: dict[str, bytes]) -> bytes:
    """A ``GrpcPayloadContainer`` holding ``payloads`` (type URL -> serialised message)."""
    return b"".join(pw.message_field(1, pw.string_field(1, key) + pw.bytes_field(2, value))
                    for key, value in payloads.items())


def decode_payloads(data: bytes) -> dict[str, bytes]:
    """The payloads of a ``GrpcPayloadContainer``; {} for bytes that are not one."""
    payloads: dict[str, bytes] = {}
    try:
        for number, _, entry in pw.iter_fields(data):
            if number != 1:
                continue
            key, value = _decode_kv(entry)  # map entries are (key = 1, value = 2)
            payloads[key] = value
    except (ValueError, TypeError):
        return {}
    return payloads


def coordination_error_payload(source_task_id: int | None = None,
                               is_reported_error: bool = False) -> bytes:
    """``CoordinationServiceError``: marks a status as the service's answer, and names the
    task the error came from."""
    body = _bool(3, is_reported_error)
    if source_task_id is not None:
        body += pw.int_field(4, source_task_id)
    return body


def source_task_of(payload: bytes) -> int | None:
    """The ``source_task_id`` of a ``CoordinationServiceError`` payload, or None."""
    try:
        for number, _, raw in pw.iter_fields(payload):
            if number == 4:
                return pw.to_int32(raw)
    except (ValueError, TypeError):
        pass
    return None
