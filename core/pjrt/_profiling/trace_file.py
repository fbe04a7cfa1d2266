"""The files a trace leaves, where jax leaves them: ``<log_dir>/plugins/profile/<run>/``, the run
named by the time the trace ended (``2025_01_31_12_00_00``), holding

* ``<host>.trace.json.gz``: pjrt's events in the Chrome trace-event format (JSON object form,
  gzipped), which ui.perfetto.dev and chrome://tracing open;
* ``<host>.xplane.pb``: the plugins' own device activity, the XSpace bytes their profilers
  handed back, when one did (TensorBoard's profile plugin and xprof read it);
* ``perfetto_trace.json.gz`` with ``create_perfetto_trace``, as jax names it.

Timestamps are microseconds from the trace's start (with nanosecond digits); the wall-clock
time of that start is in ``otherData.start_time_ns``, to line the events up with the
XSpace's, which count from the epoch.

An event's facts (its ``args``: pjrt's, and the keyword arguments of the user's annotations)
are written as JSON where JSON has a form for them, and as text where it has none, so that no
value can cost the trace (`json_facts`).
"""
from __future__ import annotations

import gzip
import json
import os
import socket
import time

from .facts import json_facts
from .recorder import Recording

#: The trace-event phases used: complete events (a start and a duration), metadata (names of
#: the process and threads) and instant events (notes).
_COMPLETE, _METADATA, _INSTANT = "X", "M", "i"


def run_directory(log_dir: str) -> str:
    """A new directory for one trace's files under ``log_dir``; a second trace ending in the
    same second gets a suffix rather than mixing its files with the first's."""
    base = os.path.join(log_dir, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
    path, attempt = base, 0
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            attempt += 1
            path = f"{base}_{attempt}"


def host_name() -> str:
    return socket.gethostname() or "localhost"


def trace_events(recording: Recording) -> dict:
    """The recording as a Chrome trace-event JSON object."""
    pid = recording.pid
    origin = recording.origin_ns
    events: list[dict] = [{"ph": _METADATA, "pid": pid, "name": "process_name",
                           "args": {"name": f"pjrt (pid {pid})"}}]
    for tid, name in sorted(recording.threads.items()):
        events.append({"ph": _METADATA, "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": name}})
    for text in recording.notes:
        events.append({"ph": _INSTANT, "s": "p", "pid": pid, "tid": 0, "ts": 0.0,
                       "cat": "pjrt", "name": text})
    for category, name, start, end, tid, args in sorted(recording.events,
                                                         key=lambda event: event[2]):
        event = {"ph": _COMPLETE, "cat": category, "name": name, "pid": pid, "tid": tid,
                 "ts": round((start - origin) / 1000, 3),
                 "dur": round(max(end - start, 0) / 1000, 3)}
        if args:
            event["args"] = json_facts(args)
        events.append(event)
    end = recording.end_ns if recording.end_ns is not None else origin
    return {
        "displayTimeUnit": "ns",
        "otherData": {"producer": "pjrt", "start_time_ns": recording.wall_origin_ns,
                      "duration_ns": end - origin, "notes": list(recording.notes)},
        "traceEvents": events,
    }


def write_json_gz(path: str, document: dict) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as stream:
        json.dump(document, stream, separators=(",", ":"), allow_nan=False)


def write(log_dir: str, recording: Recording, planes: list[tuple[str, bytes]], *,
          perfetto: bool = False) -> dict[str, str]:
    """Write one trace's files; which were written, by kind (``trace``, ``xplane``,
    ``perfetto``), as paths."""
    directory = run_directory(os.fspath(log_dir))
    host = host_name()
    written = {}
    document = trace_events(recording)
    written["trace"] = os.path.join(directory, f"{host}.trace.json.gz")
    write_json_gz(written["trace"], document)
    if perfetto:
        written["perfetto"] = os.path.join(directory, "perfetto_trace.json.gz")
        write_json_gz(written["perfetto"], document)
    if planes:
        written["xplane"] = os.path.join(directory, f"{host}.xplane.pb")
        with open(written["xplane"], "wb") as stream:
            for _, data in planes:  # XSpaces concatenated read as one (see xspace.py)
                stream.write(data)
    return written
