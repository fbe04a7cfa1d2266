"""Ctrl-C in a child process, sent while the child is really inside the blocking call.

A timer that fires a fixed time into the work was at the mercy of the machine's load: on a
busy machine the signal could land before the call had started (the test then measured
nothing, or the ``KeyboardInterrupt`` left the script outside its ``try``), and a child whose
call then never ended spun until the parent's time limit. Here:

* `CHILD_SOURCE` goes at the top of the child's script. Its ``interrupt(name, work, inside=...)``
  sends SIGINT only once the child's main thread is inside the wait it names (read from the
  thread's current frames, so nothing in pjrt is changed for the test), sends it again every
  `RESEND_SECONDS` until the ``KeyboardInterrupt`` arrives, never after ``work()`` has
  returned, and prints a JSON line ``{"case": name, "interrupted": ..., "latency": ...}``
  where the latency counts from the **first** signal. The child also ends if the test process
  dies (`pjrt._compile.parent_watch`).
* `run_child_process` runs the child in a process group of its own and kills the group
  whatever happens, so nothing is left spinning after a failure or a time-out.
* `run_cpu_child` puts the two together for a script that uses one of the CPU plugins.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import child_env

#: Seconds a KeyboardInterrupt may take to reach the caller once the signal is sent to a child
#: that is inside the call (the wait slices are 50 ms; the rest is a loaded machine).
LATENCY = 1.5

#: Seconds between two signals to a child that has not reacted (more than LATENCY, so a lost
#: first signal still fails the latency check rather than being hidden by the second).
RESEND_SECONDS = 3.0

CHILD_SOURCE = '''
import json as _ih_json, os as _ih_os, signal as _ih_signal, sys as _ih_sys
import threading as _ih_threading, time as _ih_time
from pjrt._compile.parent_watch import end_with_parent as _ih_end_with_parent

_ih_end_with_parent(_ih_os.getppid())  # a killed test process leaves nothing spinning

#: Where a blocking call waits, as (a function on the caller's stack, the innermost one):
#: "worker" for a native call on one of pjrt's worker threads (a launch the plugin runs
#: inline, a compile, a client creation, a backend coming up), "event" for a sliced wait on a
#: plugin event (block_until_ready, a read to the host), "shards" for the one wait on every
#: shard of a global array (its block_until_ready).
_IH_INSIDE = {"worker": ("call_off_thread", "wait"),
              "event": ("wait_for_waiter", "wait_for_waiter"),
              "shards": ("wait_buffers_ready", "wait_buffers_ready")}


def _ih_is_inside(thread_id, inside):
    frame = _ih_sys._current_frames().get(thread_id)
    outer, innermost = _IH_INSIDE[inside]
    if frame is None or frame.f_code.co_name != innermost:
        return False
    while frame is not None:
        if frame.f_code.co_name == outer:
            return True
        frame = frame.f_back
    return False


def interrupt(name, work, inside=None, after=0.0, resend=%(resend)r, give_up=120.0):
    """Run work(), sending this process SIGINT once at least ``after`` seconds have passed
    and (unless ``inside`` is None) the main thread waits inside the call ``inside`` names;
    again every ``resend`` seconds until it arrives. Prints the case's report; returns
    whether the KeyboardInterrupt came."""
    caller = _ih_threading.get_ident()
    finished = _ih_threading.Event()
    lock = _ih_threading.Lock()
    sends = []
    seen_inside = []

    def send():
        deadline = _ih_time.monotonic() + give_up
        if finished.wait(after):
            return
        while inside is not None and not _ih_is_inside(caller, inside):
            if finished.wait(0.005) or _ih_time.monotonic() > deadline:
                return
        seen_inside.append(True)
        while True:
            with lock:
                if finished.is_set():
                    return
                sends.append(_ih_time.monotonic())
                _ih_os.kill(_ih_os.getpid(), _ih_signal.SIGINT)
            if finished.wait(resend):
                return

    sender = _ih_threading.Thread(target=send, name="interrupt-sender", daemon=True)
    start = _ih_time.monotonic()
    try:
        sender.start()
        work()
        with lock:
            finished.set()
        if sends:  # one was sent as the work ended: take its KeyboardInterrupt here
            _ih_time.sleep(resend)
    except KeyboardInterrupt:
        now = _ih_time.monotonic()
        with lock:
            finished.set()
        print(_ih_json.dumps({
            "case": name, "interrupted": True, "sends": len(sends),
            "latency": now - sends[0] if sends else None, "elapsed": now - start}), flush=True)
        return True
    print(_ih_json.dumps({"case": name, "interrupted": False, "inside": bool(seen_inside),
                          "elapsed": _ih_time.monotonic() - start}), flush=True)
    return False
''' % {"resend": RESEND_SECONDS}


def child_reports(stdout: str) -> dict:
    """The child's JSON lines that name a case, by case."""
    reports = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            fields = json.loads(line)
            if "case" in fields:
                reports[fields["case"]] = fields
    return reports


def assert_interrupted(report: dict) -> None:
    """The case was interrupted, by the first signal, within `LATENCY` seconds of it."""
    assert report["interrupted"], report
    assert report["latency"] is not None, report  # a KeyboardInterrupt nobody sent
    assert report["latency"] < LATENCY, report


def _text(output) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _kill_group(process: subprocess.Popen) -> None:
    # Only while the child is not yet reaped: its pid (the group's id) cannot be reused then.
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()


def run_child_process(command: list[str], *, env: dict, timeout: float
                      ) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``command`` in a process group of its own; its result and wall time. Fails the test
    with the child's output if it has not ended within ``timeout`` seconds; the group is
    killed in any case (a time-out, a failure, the test being interrupted)."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            pytest.fail(f"the child did not end within {timeout} s\nstdout:\n"
                        f"{_text(stdout)[-3000:]}\nstderr:\n{_text(stderr)[-6000:]}")
    finally:
        _kill_group(process)
    elapsed = time.monotonic() - start
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), elapsed


def run_cpu_child(plugin_path: str, body: str, *, timeout: float = 300) -> dict:
    """Run ``body`` (dedented) in a fresh interpreter after `CHILD_SOURCE`, with ``json``,
    ``np`` and ``pjrt`` imported and the plugin library ``plugin_path`` loaded as "cpu",
    through `run_child_process`; fail unless it exits with 0; its reports by case."""
    prelude = textwrap.dedent(f"""
        import json
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {plugin_path!r})
    """)
    command = [sys.executable, "-c", CHILD_SOURCE + prelude + textwrap.dedent(body)]
    result, _ = run_child_process(command, env=child_env(), timeout=timeout)
    assert result.returncode == 0, (f"the child exited with code {result.returncode}:\n"
                                    f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return child_reports(result.stdout)
