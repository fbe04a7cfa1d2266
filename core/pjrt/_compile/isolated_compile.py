"""Crash-isolated compilation: compile (or deserialize) in a child process first.

A plugin's compiler trusts the program it is given. pjrt checks what it can before
(`pjrt._compile.program_checks`, `pjrt._wire.mlir_bytecode`), but damage inside MLIR bytecode's
sections, or inside a plugin's own serialized executable, can still make the compiler crash
the process (SIGSEGV, SIGABRT, SIGILL). A service that loads programs it did not make itself
can ask for isolation: ``pjrt.compile(..., isolate=True)``,
``client.compile_and_load(..., isolate=True)``, ``client.deserialize_executable(...,
isolate=True)``, or ``PJRT_ISOLATED_COMPILE=1`` for every compile and deserialization in the
process. The same plugin library, with the same create options, first compiles the program
with the same compile options in a worker process; only when it succeeds does this process
compile it. A crash in the worker becomes an [`IsolatedCompileCrash`][pjrt.program.IsolatedCompileCrash] (an
[`XlaRuntimeError`][pjrt.errors.XlaRuntimeError]) naming the signal and the plugin's last words, and the
next isolated compile starts a new worker. A compile error is raised as the plugin reported it.

What it costs: one worker process per plugin and create options, started on the first isolated
compile (an interpreter, the plugin, a client: about a second), then each isolated compile
compiles twice, once in the worker and once here, plus the copies of the program through a
pipe. Compiles that hit the persistent compilation cache are not repeated in the worker (the
entry was made by this build from these bytes and is checked on read).

Time limit: an isolated compile (starting the worker included) that has not finished in
``PJRT_ISOLATED_COMPILE_TIMEOUT`` seconds (600 unless set; ``inf`` for none) is an
[`IsolatedCompileTimeout`][pjrt.program.IsolatedCompileTimeout]: the worker is killed, this process compiles nothing, and the
next isolated compile starts a new worker. Ctrl-C while waiting for the worker raises
``KeyboardInterrupt`` at once and kills the worker too (its answer would otherwise be read by
the next compile).

Custom calls: compiling a program that calls ``stablehlo.custom_call @target`` needs only
the target's registration, not its handler. The worker registers every target a program may
name (the custom-call targets of a text program; the identifier-like strings of a bytecode
one) with a handler that is never run, since it runs no program. A serialized executable's
targets cannot be read from its bytes: each one the plugin reports missing when loading it
(a name its bytes hold) is registered, and the executable loaded again. So a program calling
targets registered here (`pjrt.register_custom_call_target`, a plugin package's own kernels)
compiles there as here; one calling a target registered nowhere compiles there, and the
plugin refuses it here, exactly as without isolation. (Handler traits, which only GPU command
buffers read, are not known there.)

Limits: the worker makes a single-process client (``node_id``/``num_nodes`` and the key-value
callbacks of a multi-process client are not passed on); a plugin handed over in memory cannot
be isolated (there is no library to load again). Isolation catches what crashes the compiler
or loader every time; a damaged executable loaded with ``trust_unverified`` that the worker
loads can still crash this process (the damage may be read nondeterministically, or only when
the executable is freed or run).
"""
from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING

from ..errors import ErrorCode, XlaRuntimeError

if TYPE_CHECKING:
    from ..device import ClientView

__all__ = ["ISOLATE_ENV", "TIMEOUT_ENV", "DEFAULT_TIMEOUT", "IsolatedCompileCrash",
           "IsolatedCompileTimeout", "isolation_requested", "isolation_timeout",
           "check_in_worker", "shutdown_workers"]

#: Set to ``1`` to isolate every compile and deserialization of the process.
ISOLATE_ENV = "PJRT_ISOLATED_COMPILE"
#: Seconds an isolated compile may take in the worker (``inf``: no limit).
TIMEOUT_ENV = "PJRT_ISOLATED_COMPILE_TIMEOUT"
#: The limit when ``PJRT_ISOLATED_COMPILE_TIMEOUT`` is unset: far above any sane compile (a
#: large model compiles in tens of seconds), so that only a hang reaches it.
DEFAULT_TIMEOUT = 600.0
#: Create options that tie a client to other processes; the worker's client is alone.
_MULTIPROCESS_OPTIONS = ("node_id", "num_nodes")
_LENGTH = struct.Struct(">Q")
_STDERR_LINES = 6


class IsolatedCompileCrash(XlaRuntimeError):
    """The plugin's compiler crashed on a program (or a serialized executable) in the
    isolation worker; this process never gave it to the plugin.

    Attributes:
      signal_name: the signal that ended the worker (``"SIGSEGV"``), or its exit status.
      plugin_output: the last lines the plugin wrote to stderr.
    """

    def __init__(self, what: str, signal_name: str, plugin_output: str):
        self.signal_name = signal_name
        self.plugin_output = plugin_output
        super().__init__(13, f"the plugin's compiler crashed ({signal_name}) on this {what} in "
                             f"the isolation worker; it was not compiled in this process. "
                             f"The {what} is damaged or triggers a compiler bug. Plugin "
                             f"output: {plugin_output or '(none)'}")


class IsolatedCompileTimeout(XlaRuntimeError):
    """The isolation worker did not finish a compile (or deserialization) within
    ``PJRT_ISOLATED_COMPILE_TIMEOUT`` seconds; it was killed, and this process never gave the
    program to the plugin. The code is ``DEADLINE_EXCEEDED``.

    Attributes:
      timeout: the limit, in seconds.
    """

    def __init__(self, what: str, timeout: float):
        self.timeout = timeout
        super().__init__(ErrorCode.DEADLINE_EXCEEDED,
                         f"the isolation worker did not finish with this {what} within the "
                         f"limit of {timeout:g} s ({TIMEOUT_ENV}); it was killed and the {what} "
                         f"was not compiled in this process. The plugin's compiler may hang on "
                         f"it; if it only needs longer, raise {TIMEOUT_ENV}")


def isolation_requested(isolate: bool | None) -> bool:
    """``isolate`` when given, else whether ``PJRT_ISOLATED_COMPILE`` is set to a true value."""
    if isolate is not None:
        return bool(isolate)
    return os.environ.get(ISOLATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def isolation_timeout() -> float:
    """Seconds an isolated compile may take: ``PJRT_ISOLATED_COMPILE_TIMEOUT``, else
    `DEFAULT_TIMEOUT` (``math.inf`` when the variable says ``inf``).

    Raises:
      ValueError: the variable is not a positive number of seconds.
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # also refuses nan
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds; set it "
                         f"to e.g. 600, or to inf for no limit")
    return value


class _DeadlinePassed(Exception):
    """The worker did not answer before the deadline (turned into IsolatedCompileTimeout)."""


class _Worker:
    """One child process holding the plugin and a client, compiling on request."""

    def __init__(self, library: str, plugin_name: str, options: dict, deadline: float):
        self.lock = threading.Lock()
        self.closed = False
        self.output = tempfile.TemporaryFile()
        to_child_read, self._to_child = os.pipe()
        self._from_child, from_child_write = os.pipe()
        # Writes wait in poll() (bounded, interruptible), never in a blocking write() to a
        # worker that stopped reading.
        os.set_blocking(self._to_child, False)
        package_root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 2))
        env = dict(os.environ)
        env.pop(ISOLATE_ENV, None)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        source = ("import sys; from pjrt._compile.isolated_worker import serve; "
                  "serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", source, str(to_child_read), str(from_child_write),
                 str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.output,
                pass_fds=(to_child_read, from_child_write), env=env, start_new_session=True)
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        try:
            self.send({"library": library, "plugin": plugin_name, "options": options},
                      deadline)
            ready = self.receive(deadline)
        except BaseException:
            self.close()
            raise
        if ready is None or ready.get("setup_error"):
            why = ready["setup_error"] if ready else " | ".join(self.death())
            self.close()
            raise RuntimeError(f"the isolation worker could not load plugin {plugin_name!r} "
                               f"from {library} and make a client with {options}: {why}")

    def send(self, message: dict, deadline: float) -> None:
        send_message(self._to_child, message, deadline)

    def receive(self, deadline: float) -> dict | None:
        """The worker's answer, or None when it died."""
        return receive_message(self._from_child, deadline)

    def alive(self) -> bool:
        return self.process.poll() is None

    def death(self) -> tuple[str, str]:
        """How the worker ended, and its last lines on stderr."""
        status = self.process.wait()
        if status < 0:
            try:
                how = signal.Signals(-status).name
            except ValueError:
                how = f"signal {-status}"
        else:
            how = f"exit status {status}"
        self.output.flush()
        self.output.seek(0)
        text = self.output.read().decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return how, " | ".join(lines[-_STDERR_LINES:])

    def close(self) -> None:
        self.closed = True
        for descriptor in (self._to_child, self._from_child):
            try:
                os.close(descriptor)
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL also ends a stopped process
        self.process.wait()
        self.output.close()


def _wait_until_ready(descriptor: int, event: int, deadline: float | None) -> None:
    """Wait in poll() until ``descriptor`` is ready for ``event`` (or hung up).

    In poll() a signal's handler runs at once (Ctrl-C raises KeyboardInterrupt here).

    Raises:
      _DeadlinePassed: at ``deadline`` (a ``time.monotonic()`` value; None: no deadline).
    """
    poller = select.poll()
    poller.register(descriptor, event)
    while True:
        if deadline is None or math.isinf(deadline):
            milliseconds = None
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _DeadlinePassed()
            milliseconds = max(1, math.ceil(left * 1000))
        if poller.poll(milliseconds):
            return


def send_message(descriptor: int, message: dict, deadline: float | None = None) -> None:
    """Write one message to the other side of an isolation pipe: its pickled length, then it.

    A closed pipe (the worker died) is not an error here: the next `receive_message` returns
    None, and the caller reads how the worker ended. On a non-blocking descriptor a full pipe
    is waited for until ``deadline`` (`_DeadlinePassed` then)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        try:
            written = os.write(descriptor, view)
        except BrokenPipeError:
            return
        except BlockingIOError:
            _wait_until_ready(descriptor, select.POLLOUT, deadline)
            continue
        view = view[written:]


def receive_message(descriptor: int, deadline: float | None = None) -> dict | None:
    """The next message from the other side of an isolation pipe, or None when it closed.

    With a ``deadline`` (a ``time.monotonic()`` value), `_DeadlinePassed` is raised when the
    whole message has not come by then."""
    head = _read_exactly(descriptor, _LENGTH.size, deadline)
    if head is None:
        return None
    body = _read_exactly(descriptor, _LENGTH.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


def _read_exactly(descriptor: int, size: int, deadline: float | None) -> bytes | None:
    chunks, left = [], size
    while left:
        if deadline is not None:
            _wait_until_ready(descriptor, select.POLLIN, deadline)
        chunk = os.read(descriptor, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_workers: dict[tuple, _Worker] = {}
_workers_lock = threading.Lock()


def _worker_for(client: "ClientView", deadline: float) -> tuple[tuple, _Worker]:
    plugin = client.plugin
    if plugin.library_path is None:
        raise ValueError(f"plugin {plugin.name!r} was handed over in memory: crash-isolated "
                         f"compilation needs its library file to load it again in a worker "
                         f"process; load the plugin from its file, or compile without "
                         f"isolate=True")
    options = {k: v for k, v in client.create_options.items() if k not in _MULTIPROCESS_OPTIONS}
    key = (plugin.library_path, plugin.name, repr(sorted(options.items())))
    with _workers_lock:
        worker = _workers.get(key)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.close()
            worker = _workers[key] = _Worker(plugin.library_path, plugin.name, options,
                                             deadline)
    return key, worker


def _discard(key: tuple, worker: _Worker) -> None:
    """Forget ``worker`` (the next isolated compile starts a new one) and end it."""
    with _workers_lock:
        if _workers.get(key) is worker:
            del _workers[key]
    worker.close()


def check_in_worker(client: "ClientView", kind: str, payload: bytes, options: bytes) -> None:
    """Compile (``kind="compile"``: ``payload`` is the program) or deserialize
    (``kind="deserialize"``: the plugin's serialized executable) in the isolation worker with
    the same serialized compile ``options``; return when the plugin succeeded there.

    Raises:
      IsolatedCompileCrash: the worker died on it.
      IsolatedCompileTimeout: the worker did not finish within `isolation_timeout` seconds.
      KeyboardInterrupt: Ctrl-C while waiting (the worker is killed).
      XlaRuntimeError: the plugin refused it there (its error, as it reported it).
      ValueError: the plugin cannot be isolated (handed over in memory), or
        ``PJRT_ISOLATED_COMPILE_TIMEOUT`` is not a positive number.
      RuntimeError: the worker could not load the plugin or make its client.
    """
    what = "program" if kind == "compile" else "serialized executable"
    timeout = isolation_timeout()
    deadline = time.monotonic() + timeout
    while True:
        try:
            key, worker = _worker_for(client, deadline)
        except _DeadlinePassed:
            raise IsolatedCompileTimeout(what, timeout) from None
        left = deadline - time.monotonic()
        if not worker.lock.acquire(timeout=-1 if math.isinf(left) else max(left, 0)):
            raise IsolatedCompileTimeout(what, timeout)
        if not worker.closed:
            break
        worker.lock.release()  # ended while this thread waited for it: take a new one
    try:
        worker.send({"kind": kind, "payload": payload, "options": options}, deadline)
        answer = worker.receive(deadline)
    except _DeadlinePassed:
        _discard(key, worker)
        raise IsolatedCompileTimeout(what, timeout) from None
    except BaseException:
        # Ctrl-C (or any failure) mid-request: the worker's answer would be read by the next
        # compile, so this worker is ended and the next compile starts a new one.
        _discard(key, worker)
        raise
    finally:
        worker.lock.release()
    if answer is None:
        with _workers_lock:
            if _workers.get(key) is worker:
                del _workers[key]
        how, output = worker.death()
        worker.close()
        raise IsolatedCompileCrash(what, how, output)
    if answer.get("error") is not None:
        code, message = answer["error"]
        raise XlaRuntimeError(code, f"{message} (reported by the isolation worker)")


def shutdown_workers() -> None:
    """End every isolation worker (they are also ended when this process exits)."""
    with _workers_lock:
        workers = list(_workers.values())
        _workers.clear()
    for worker in workers:
        worker.close()
