"""Runs the checks in worker processes, so that a plugin that crashes or hangs fails the check
it was running and the run goes on.

One worker runs the selected checks in order and reports each over a pipe before starting the
next. When the worker dies (a signal, an exit) or a check outlives the time limit (the worker
is killed), that check fails with the signal or the timeout and the plugin's last words on
stderr, and a new worker takes the checks that are left.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Callable

from ._registry import blocked_by
from .catalog import load_checks, select as select_checks
from .report import FAIL, SKIP, CheckResult, Report
from .resolve import resolve_plugin

#: Seconds one check may run before its worker is killed.
DEFAULT_TIMEOUT = 120.0
#: Lines of the plugin's stderr quoted in a crash's detail.
_STDERR_LINES = 4

Progress = Callable[[int, int, str], None]


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen
    reader: IO[bytes]
    output: IO[bytes]  # the file the worker's stdout and stderr go to
    buffer: bytes = b""

    def lines(self, timeout: float) -> list[dict] | None:
        """The messages that arrive within ``timeout`` seconds ([] when none did); None when
        the worker closed the pipe (it exited or died)."""
        ready, _, _ = select.select([self.reader], [], [], max(timeout, 0))
        if not ready:
            return []
        chunk = os.read(self.reader.fileno(), 65536)
        if not chunk:
            return None
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in complete if line.strip()]

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()

    def stderr_tail(self) -> str:
        self.output.flush()
        self.output.seek(0)
        text = self.output.read().decode("utf-8", errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-_STDERR_LINES:])

    def close(self) -> None:
        self.reader.close()
        self.output.close()


def _start_worker(job: dict, python: str) -> _Worker:
    read_fd, write_fd = os.pipe()
    output = tempfile.TemporaryFile()
    env = dict(os.environ)
    # The worker imports this same pjrt, wherever it was imported from.
    package_root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # The worker's stderr is already kept (and quoted when the plugin crashes or hangs): let
    # the plugin write there rather than into a capture that dies with the worker.
    env.setdefault("PJRT_LOG_LEVEL", "warning")
    try:
        process = subprocess.Popen(
            [python, "-m", "pjrt._app.conform._worker", "--report-fd", str(write_fd),
             "--parent-pid", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=output, stderr=output, pass_fds=(write_fd,),
            env=env, start_new_session=True)
    finally:
        os.close(write_fd)
    worker = _Worker(process, os.fdopen(read_fd, "rb", buffering=0), output)
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(job).encode())
        process.stdin.close()
    except BaseException:
        # Interrupted (or the worker died at once): no worker may outlive its run.
        worker.kill()
        worker.close()
        raise
    return worker


@contextlib.contextmanager
def _termination_ends_the_run():
    """Make SIGTERM end the run as SIGINT does, by an exception, so that the ``finally``
    that kills the worker runs: the workers are in sessions of their own (a plugin's crash
    must not take the run with it), so nothing else would end them, and a terminated
    ``pjrt conform`` would leave a worker running on. The process still exits with the
    status of a SIGTERM (143). A handler the program set itself is left in place."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _death(worker: _Worker) -> tuple[str, str | None]:
    """How the worker ended: a sentence, and the signal's name if one killed it."""
    code = worker.process.wait()
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the plugin's process was killed by {name}", name
    return f"the plugin's process exited with status {code}", None


def run(plugin: str, *, checks: list[str] | None = None, patterns: list[str] | None = None,
        options: dict | None = None, topology: str = "", timeout: float = DEFAULT_TIMEOUT,
        progress: Progress | None = None, python: str | None = None) -> Report:
    """Run the conformance checks against ``plugin`` and report on each.

    Args:
      plugin: a plugin's shared library path, or the platform name of an installed plugin
        package (``cpu``, ``cuda``...) or of a PJRT_NAMES_AND_LIBRARY_PATHS entry.
      checks: exact check names to run (all when neither this nor ``patterns`` is given).
      patterns: substrings or shell patterns of check names to run.
      options: client create options (a platform name brings its package's own, which these
        update).
      topology: the topology ``topology.compile_only`` describes and compiles for (e.g.
        ``"v5e:2x2"``); the plugin's own when empty.
      timeout: seconds each check may run before it fails as hung.
      progress: called as ``progress(index, total, name)`` when each check starts.
      python: the interpreter that runs the workers (this one by default).

    Returns:
      A [`Report`][pjrt._app.conform.report.Report]; ``report.passed`` is False when any check failed.

    Raises:
      ValueError: an unknown check name, a pattern matching nothing, or a plugin that is
        neither a file nor a known platform name.
    """
    with _termination_ends_the_run():
        return _run(plugin, checks, patterns, options, topology, timeout, progress, python)


def _run(plugin: str, checks: list[str] | None, patterns: list[str] | None,
         options: dict | None, topology: str, timeout: float, progress: Progress | None,
         python: str | None) -> Report:
    started = time.perf_counter()
    names = select_checks(checks, patterns)
    target = resolve_plugin(plugin)
    job_options = {**target.options, **(options or {})}
    all_checks = load_checks()
    results: dict[str, CheckResult] = {}
    failed: set[str] = set()
    info: dict = {}
    pending = list(names)
    while pending:
        job = {"library": target.library, "name": target.name, "options": job_options,
               "topology": topology, "checks": pending, "failed": sorted(failed)}
        worker = _start_worker(job, python or sys.executable)
        current, current_start = None, time.perf_counter()
        try:
            while True:
                left = current_start + timeout - time.perf_counter()
                messages = worker.lines(left) if left > 0 else []
                if messages is None:  # the worker is gone
                    break
                if not messages and time.perf_counter() - current_start >= timeout:
                    worker.kill()
                    name = current or pending[0]
                    what = "check" if current else "worker start-up"
                    tail = worker.stderr_tail()
                    results[name] = CheckResult(
                        name, FAIL, f"timed out: the {what} did not finish within {timeout:g}s "
                        f"(the plugin hung; its worker was killed)" + (f"; stderr: {tail}" if tail else ""),
                        time.perf_counter() - current_start, timed_out=True)
                    failed.add(name)
                    current = None
                    break
                for message in messages:
                    if "start" in message:
                        current, current_start = message["start"], time.perf_counter()
                        if progress is not None:
                            progress(names.index(current) + 1, len(names), current)
                    elif "result" in message:
                        result = CheckResult(**message["result"])
                        results[result.name] = result
                        if result.status == FAIL:
                            failed.add(result.name)
                        info.update(message.get("info") or {})
                        current, current_start = None, time.perf_counter()
            if messages is None and current is not None:
                sentence, signal_name = _death(worker)
                tail = worker.stderr_tail()
                results[current] = CheckResult(
                    current, FAIL, sentence + " during this check" +
                    (f"; stderr: {tail}" if tail else ""),
                    time.perf_counter() - current_start, signal=signal_name)
                failed.add(current)
            elif messages is None and not any(n in results for n in pending):
                # Died before its first check: charge that check, so the run moves on.
                sentence, signal_name = _death(worker)
                tail = worker.stderr_tail()
                results[pending[0]] = CheckResult(
                    pending[0], FAIL, f"{sentence} before the check started" +
                    (f"; stderr: {tail}" if tail else ""), signal=signal_name)
                failed.add(pending[0])
        finally:
            worker.kill()
            worker.close()
        pending = [name for name in pending if name not in results]
        # Checks resting on one that just failed are skipped here, without a new worker.
        while pending and blocked_by(pending[0], failed) and all_checks:
            name = pending.pop(0)
            results[name] = CheckResult(name, SKIP,
                                        f"needs {blocked_by(name, failed)}, which failed")
    return Report(plugin, target.library, [results[name] for name in names],
                  time.perf_counter() - started, info)
