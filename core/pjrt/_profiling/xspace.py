"""The bytes a plugin's profiler hands back: a serialised ``tensorflow.profiler.XSpace``.

pjrt writes them to ``<host>.xplane.pb`` as they are, as jax does, without reading them
through a schema; it only walks the top level to check them and to name the planes (one per
device, and the plugin's host threads) in what it reports. Only the fields read here are
listed (``tsl/profiler/protobuf/xplane.proto``).

The XSpaces of several plugins are joined by concatenation, which protobuf reads as one
message with the repeated fields of both (every field of XSpace is repeated).
"""
from __future__ import annotations

from .._wire import protowire

_PLANES = 1  # XSpace.planes: repeated XPlane
_ERRORS = 2  # XSpace.errors: repeated string
_PLANE_NAME = 2  # XPlane.name: string


def checked(data: bytes) -> bytes:
    """``data`` as an XSpace, checked at its top level.

    XLA's own plugin profiler answers with one zero byte past the message (its buffer is a
    byte longer than the message). A zero byte cannot start a field, so a message never ends
    with one that way: it is dropped.

    Raises:
      ValueError: the bytes are not a protobuf message.
    """
    try:
        protowire.decode(data)
        return bytes(data)
    except ValueError as error:
        if data[-1:] == b"\0":
            try:
                protowire.decode(data[:-1])
                return bytes(data[:-1])
            except ValueError:
                pass
        raise ValueError(f"the plugin's profile is not an XSpace message ({error})") from None


def plane_names(data: bytes) -> list[str]:
    """The name of each plane of an XSpace (``/device:GPU:0``, ``/host:CPU``, ...)."""
    names = []
    for number, wire_type, value in protowire.iter_fields(data):
        if number == _PLANES and wire_type == protowire.LEN:
            name = ""
            for field, kind, item in protowire.iter_fields(value):
                if field == _PLANE_NAME and kind == protowire.LEN:
                    name = protowire.to_str(item, "XPlane.name")
            names.append(name)
    return names


def errors(data: bytes) -> list[str]:
    """What the profiler reported as errors in the XSpace (``XSpace.errors``)."""
    return [protowire.to_str(value, "XSpace.errors")
            for number, wire_type, value in protowire.iter_fields(data)
            if number == _ERRORS and wire_type == protowire.LEN]
