"""``Client.heap_profile()``: the memory a client's live arrays and executables hold, as a pprof
profile (a serialised ``perftools.profiles.Profile``, ``profile.proto``, written with
`pjrt._wire.protowire`; ``pjrt.profiler.device_memory_profile`` gzips it, as jax does).

Every buffer the client's handle owns (its registry of owners, which every array that owns
memory joins when it is made) is one allocation, and so is every live executable (its
generated code, ``PJRT_Executable_SizeOfGeneratedCodeInBytes``), as in jaxlib. Each sample has
two values, ``allocations`` (count) and ``space`` (bytes; a buffer's
``PJRT_Buffer_OnDeviceSizeInBytes``), and the label ``kind`` (``"buffer"`` or
``"executable"``); a buffer's also ``device`` and ``memory_kind``. Samples of the same kind,
device, memory kind and site are summed. An executable's one frame names it.

**Sites.** While recording is on (`record_array_sites`, or ``PJRT_ARRAY_SITES=1`` in the
environment when pjrt is imported), each new array remembers the Python stack that made it,
outside pjrt's own files, and its samples carry that stack; an array made while recording
was off has the one frame `UNRECORDED`. When recording is off the array constructor (in C)
only tests a pointer.
"""
from __future__ import annotations

import functools
import gzip
import os
import sys
import threading
import time
import weakref

from .._capi.native_runtime import set_array_site_recorder
from .._wire import protowire as pw
from ..errors import UnsupportedFeatureError, XlaRuntimeError

#: The environment variable that turns recording on when pjrt is imported ("1").
ENV = "PJRT_ARRAY_SITES"
#: The frame of arrays made while sites were not recorded.
UNRECORDED = f"(site not recorded: {ENV}=1 or pjrt.profiler.record_array_sites())"
#: At most this many frames of a site are kept (the innermost ones).
MAX_FRAMES = 64

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_lock = threading.Lock()
_recording = False
#: id(array) -> (weak reference to the array, its site: ((file, function, first line, line),
#: ... innermost first)).
_sites: dict[int, tuple] = {}


def record_array_sites(enabled: bool = True) -> bool:
    """Turn the recording of where arrays are made on or off; returns the previous state."""
    global _recording
    with _lock:
        previous = _recording
        _recording = bool(enabled)
        set_array_site_recorder(_record if _recording else None)
        return previous


def recording() -> bool:
    """Whether array sites are being recorded."""
    return _recording


def _forget(key: int, reference) -> None:
    entry = _sites.get(key)
    if entry is not None and entry[0] is reference:
        _sites.pop(key, None)


def _record(array) -> None:
    """The recorder the array constructor calls: the caller's stack, outside pjrt."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    frames = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append((code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno))
        frame = frame.f_back
    key = id(array)
    _sites[key] = (weakref.ref(array, functools.partial(_forget, key)), tuple(frames))


def site_of(owner_id: int):
    """The recorded site of the live array ``owner_id``, or None."""
    entry = _sites.get(owner_id)
    if entry is None or entry[0]() is None:
        return None
    return entry[1]


# -- the profile ---------------------------------------------------------------------------

def _device_label(device) -> str:
    """What jaxlib labels a device with: the plugin's debug string (``cpu:0``; ``TFRT_CPU_0``
    from older CPU builds), else pjrt's name for it."""
    try:
        return device.debug_string() or str(device)
    except (XlaRuntimeError, UnsupportedFeatureError):
        return str(device)


def _buffer_facts(client, api, buffer, labels: dict):
    """``(device label, memory kind, bytes)`` of a live buffer; None for a deleted one (a
    donated input's buffer, say, which holds no memory). ``labels`` caches the devices'."""
    if api.call_new("PJRT_Buffer_IsDeleted", buffer=buffer).is_deleted:
        return None
    try:
        size = int(api.call_new("PJRT_Buffer_OnDeviceSizeInBytes",
                                buffer=buffer).on_device_size_in_bytes)
    except XlaRuntimeError:
        return None
    device = client.device_from_pointer(api.call_new("PJRT_Buffer_Device", buffer=buffer).device)
    kind = "device"
    if api.has("PJRT_Buffer_Memory"):
        memory = api.call_new("PJRT_Buffer_Memory", buffer=buffer).memory
        kind = client.memory_from_pointer(memory).kind
    label = labels.get(device)
    if label is None:
        label = labels[device] = _device_label(device)
    return label, kind, size


def live_allocations(client) -> dict:
    """``(kind, site, device, memory kind) -> [count, bytes]`` over the buffers the client's
    live arrays own (kind ``"buffer"``; site: the recorded frames, or None) and its live
    executables (kind ``"executable"``, the site a frame naming it, no device or memory
    kind)."""
    groups: dict = {}
    labels: dict = {}
    with client.raw_handle.calling() as handle:
        api = handle.api
        for owner_id, buffers in list(handle.buffers.items()):
            site = site_of(owner_id)
            for buffer in list(buffers or ()):
                if not buffer:  # None, or a NULL pointer
                    continue
                facts = _buffer_facts(client, api, buffer, labels)
                if facts is None:
                    continue
                totals = groups.setdefault(("buffer", site, facts[0], facts[1]), [0, 0])
                totals[0] += 1
                totals[1] += facts[2]
    for executable in client.live_executables():
        try:
            size = int(executable.size_of_generated_code_in_bytes())
            site = (("", f"executable {executable.name()}", 0, 0),)
        except (XlaRuntimeError, UnsupportedFeatureError):
            continue  # deleted meanwhile, or a plugin that cannot tell
        totals = groups.setdefault(("executable", site, None, None), [0, 0])
        totals[0] += 1
        totals[1] += size
    return groups


class _Strings:
    def __init__(self):
        self.table: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        index = self._index.get(text)
        if index is None:
            index = self._index[text] = len(self.table)
            self.table.append(text)
        return index


def _value_type(strings: _Strings, kind: str, unit: str) -> bytes:
    return pw.int_field(1, strings(kind)) + pw.int_field(2, strings(unit))


def encode_profile(groups: dict, time_nanos: int) -> bytes:
    """``groups`` (as `live_allocations` makes them) as an uncompressed ``Profile`` message."""
    strings = _Strings()
    functions: dict[tuple, int] = {}
    locations: dict[tuple, int] = {}
    out = [pw.message_field(1, _value_type(strings, "allocations", "count")),
           pw.message_field(1, _value_type(strings, "space", "bytes"))]

    def location(filename: str, name: str, first_line: int, line: int) -> int:
        function_key = (filename, name, first_line)
        function_id = functions.get(function_key)
        if function_id is None:
            function_id = functions[function_key] = len(functions) + 1
        key = (function_id, line)
        location_id = locations.get(key)
        if location_id is None:
            location_id = locations[key] = len(locations) + 1
        return location_id

    def label(key: str, value: str) -> bytes:
        return pw.message_field(3, pw.int_field(1, strings(key)) + pw.int_field(2, strings(value)))

    for (kind, site, device, memory_kind), (count, size) in sorted(
            groups.items(), key=lambda item: (-item[1][1], item[0][0], str(item[0][2]),
                                              str(item[0][3]))):
        frames: tuple[tuple[str, str, int, int], ...] = site or (("", UNRECORDED, 0, 0),)
        ids = [location(filename, name, first_line, line)
               for filename, name, first_line, line in frames]
        labels = label("kind", kind)
        if device is not None:
            labels += label("device", device) + label("memory_kind", memory_kind)
        out.append(pw.message_field(2, pw.packed_varint_field(1, ids)
                                    + pw.packed_varint_field(2, [count, size]) + labels))
    for (function_id, line), location_id in locations.items():
        line_message = pw.int_field(1, function_id) + pw.int_field(2, line)
        out.append(pw.message_field(4, pw.int_field(1, location_id)
                                    + pw.message_field(4, line_message)))
    for (filename, name, first_line), function_id in functions.items():
        out.append(pw.message_field(5, pw.int_field(1, function_id) + pw.int_field(2, strings(name))
                                    + pw.int_field(3, strings(name))
                                    + pw.int_field(4, strings(filename))
                                    + pw.int_field(5, first_line)))
    period_type = _value_type(strings, "space", "bytes")
    default_type = strings("space")
    out.extend(pw.string_field(6, text) for text in strings.table)
    out.append(pw.int_field(9, time_nanos))
    out.append(pw.message_field(11, period_type))
    out.append(pw.int_field(12, 1))
    out.append(pw.int_field(14, default_type))
    return b"".join(out)


def heap_profile(client) -> bytes:
    """The pprof profile of ``client``'s live arrays and executables (see the module
    docstring), not compressed, as jaxlib's ``Client.heap_profile`` returns it."""
    return encode_profile(live_allocations(client), time.time_ns())


def gzipped(profile: bytes) -> bytes:
    """``profile`` as pprof's files hold it (what jax's ``device_memory_profile`` returns)."""
    return gzip.compress(profile, mtime=0)


if os.environ.get(ENV, "") not in ("", "0"):
    record_array_sites(True)
