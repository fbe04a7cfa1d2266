"""What a trace records of pjrt's own work, while ``pjrt.profiler`` runs one.

The hooks in the layers that do the work (compiles, launches, transfers, waits, host reads)
are one or two lines each: they read `active`, a module attribute that is False unless a trace
runs, and do nothing more when it is. While it is True they take the clock
(``started = recorder.now()``) and, once the work is done, hand the start to one of the
functions below, which appends one complete event to the current `Recording`: its category,
name, start and end (``time.perf_counter_ns``), the native id of the thread that did the work,
and a few facts (program, devices, bytes, whether the compilation cache had it).

Events are appended to a list, which is safe from any thread under the GIL; a recording that
has ended takes no more (an event that ends after ``stop_trace`` is dropped, one that began
before ``start_trace`` is clipped to the trace's start). `Span` brackets work whose facts are
learnt inside it: the compile's span is annotated by the compilation cache it calls
(`annotate`), and ``pjrt.profiler.TraceAnnotation`` is a span of the user's.

This module imports nothing of pjrt but `facts` (which imports nothing), so that every layer
may call it; what it is told about (executables, devices, arrays) it reads through their
public members.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

from .facts import json_facts

#: True while a trace records. The hooks read it before anything else: with no trace running,
#: that read is all they cost.
active = False

#: Called with True when a trace starts and with False when it ends. A module on the per-call
#: path (``pjrt.executable``) keeps a flag of its own through one, which is cheaper to test than
#: `active` (a global of its own module, not an attribute of this one).
switches: list = []


def follow(namespace: dict, name: str = "_tracing") -> None:
    """Keep ``namespace[name]`` (a per-call module's globals) equal to `active`, through one of
    `switches`: the one way a module on the per-call path gets its own flag."""
    namespace[name] = active
    switches.append(lambda on: namespace.__setitem__(name, on))


now = time.perf_counter_ns


class Recording:
    """The events of one trace, and what it noted (plugins that record nothing, failures)."""

    def __init__(self):
        self.pid = os.getpid()
        self.origin_ns = now()  # the trace's start, on the events' clock
        self.wall_origin_ns = time.time_ns()  # the same instant since the epoch
        self.end_ns: int | None = None
        #: (category, name, start_ns, end_ns, native thread id, args or None)
        self.events: list[tuple] = []
        #: native thread id -> the thread's name when it first recorded
        self.threads: dict[int, str] = {}
        self.notes: list[str] = []


_recording: Recording | None = None
_spans = threading.local()


def begin() -> Recording:
    """Start recording; the caller (``pjrt.profiler``) makes sure no trace runs."""
    global _recording, active
    recording = Recording()
    _recording = recording
    active = True
    for switch in switches:
        switch(True)
    return recording


def end() -> Recording | None:
    """Stop recording; the recording that ran (None if none did)."""
    global _recording, active
    for switch in switches:
        switch(False)
    active = False
    recording, _recording = _recording, None
    if recording is not None:
        recording.end_ns = now()
    return recording


def note(text: str) -> None:
    """Say something about the whole trace (written into the trace file)."""
    recording = _recording
    if recording is not None:
        recording.notes.append(text)


def add(category: str, name: str, started: int, args: dict | None = None) -> None:
    """A complete event of this thread, from ``started`` (a `now` value) to now."""
    ended = now()
    recording = _recording
    if recording is None:
        return
    thread = threading.get_native_id()
    if thread not in recording.threads:
        recording.threads[thread] = threading.current_thread().name
    recording.events.append((category, name, max(started, recording.origin_ns), ended, thread,
                             args))


class Span:
    """``with Span(category, name, args):`` records one event over the block, on this thread;
    spans nest. Inside, `annotate` adds facts to the innermost open span of the thread. With no
    trace running it records nothing."""

    __slots__ = ("category", "name", "args", "started")

    def __init__(self, category: str, name: str, args: dict | None = None):
        self.category = category
        self.name = name
        self.args = dict(args) if args else {}
        self.started = 0

    def __enter__(self) -> "Span":
        if active:
            self.started = now()
            stack = getattr(_spans, "stack", None)
            if stack is None:
                stack = _spans.stack = []
            stack.append(self)
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if not self.started:
            return
        stack = _spans.stack
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:  # exited out of order (a generator's span): drop it all the same
            stack.remove(self)
        if error is not None:
            try:
                said = str(error)
            except Exception:  # noqa: BLE001 - the error the block raised is the one to see
                said = "(its message could not be read)"
            self.args["error"] = f"{kind.__name__}: {said}"
        add(self.category, self.name, self.started, json_facts(self.args) if self.args else None)
        self.started = 0


def annotate(key: str, value: Any, category: str | None = None) -> None:
    """Set ``key`` on the innermost span open on this thread (of ``category``, when given)."""
    for span in reversed(getattr(_spans, "stack", None) or ()):
        if category is None or span.category == category:
            span.args[key] = value
            return


# -- the facts the hooks record -----------------------------------------------------------------

def device_text(device) -> str:
    """``cpu:0``: a device's platform and id."""
    try:
        return f"{device.platform}:{device.id}"
    except Exception:  # noqa: BLE001 - a trace never fails the work it records
        return str(device)


_labels: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()


def executable_label(executable) -> tuple[str, str]:
    """An executable's program name and devices (``jit_f``, ``cpu:0,cpu:1``), asked of the
    plugin once per executable."""
    label = _labels.get(executable)
    if label is None:
        try:
            name = executable.name()
        except Exception:  # noqa: BLE001 - an unloaded executable still gets an event
            name = "program"
        try:
            devices = ",".join(device_text(d) for d in executable.local_devices())
        except Exception:  # noqa: BLE001
            devices = ""
        label = _labels[executable] = (name or "program", devices)
    return label


def launched(executable, started: int, path: str, device=None) -> None:
    """One launch of ``executable`` by the named path (``CallPlan``: the native per-call path;
    ``python``: the full one, on this thread or on a worker)."""
    name, devices = executable_label(executable)
    add("launch", name, started, {"program": name,
                                  "devices": device_text(device) if device else devices,
                                  "path": path})


def run_plan(executable, plan, arguments, copy_host_values: bool):
    """``plan.run(arguments, copy_host_values)`` (a `CallPlan`, the native per-call path),
    recorded as a launch of ``executable`` when the plan made it; None, as the plan answers,
    when the call needs the full path (whose launch records itself)."""
    started = now()
    outputs = plan.run(arguments, copy_host_values)
    if outputs is not None:
        launched(executable, started, "CallPlan")
    return outputs


def transferred(started: int, host, device, memory=None) -> None:
    """One host-to-device copy of the numpy array ``host`` (started, not awaited)."""
    args = {"device": device_text(device), "bytes": int(host.nbytes),
            "shape": list(host.shape), "dtype": str(host.dtype)}
    if memory is not None:
        args["memory"] = str(getattr(memory, "kind", memory))
    add("transfer", "host-to-device", started, args)


def waited(started: int, array) -> None:
    """One wait for an array's value (``block_until_ready``)."""
    add("wait", "block_until_ready", started, _array_facts(array))


def read(started: int, array, is_view: bool) -> None:
    """One read of an array's value to the host that Python made (``Array.__array__``)."""
    facts = _array_facts(array)
    facts["copy"] = not is_view
    add("read", "device-to-host", started, facts)


def _array_facts(array) -> dict:
    try:
        return {"shape": list(array.shape), "dtype": str(array.dtype),
                "bytes": int(array.nbytes),
                "devices": ",".join(device_text(d) for d in array.shard_devices)}
    except Exception:  # noqa: BLE001 - a deleted array still gets an event
        return {}
