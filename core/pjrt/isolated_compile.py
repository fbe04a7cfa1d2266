"""Crash-isolated compilation: compile (or deserialize) in a child process first.

A plugin's compiler trusts the program it is given. pjrt checks what it can before
(:mod:`pjrt.program_checks`, :mod:`pjrt.mlir_bytecode`), but damage inside MLIR bytecode's
sections, or inside a plugin's own serialized executable, can still make the compiler crash
the process (SIGSEGV, SIGABRT, SIGILL). A service that loads programs it did not make itself
can ask for isolation: ``pjrt.compile(..., isolate=True)``,
``client.compile_and_load(..., isolate=True)``, ``client.deserialize_executable(...,
isolate=True)``, or ``PJRT_ISOLATED_COMPILE=1`` for every compile and deserialization in the
process. The same plugin library, with the same create options, first compiles the program
with the same compile options in a worker process; only when it succeeds does this process
compile it. A crash in the worker becomes an :class:`IsolatedCompileCrash` (an
:class:`~pjrt.errors.XlaRuntimeError`) naming the signal and the plugin's last words, and the
next isolated compile starts a new worker. A compile error is raised as the plugin reported it.

What it costs: one worker process per plugin and create options, started on the first isolated
compile (an interpreter, the plugin, a client: about a second), then each isolated compile
compiles twice, once in the worker and once here, plus the copies of the program through a
pipe. Compiles that hit the persistent compilation cache are not repeated in the worker (the
entry was made by this build from these bytes and is checked on read).

Limits: the worker makes a single-process client (``node_id``/``num_nodes`` and the key-value
callbacks of a multi-process client are not passed on); custom-call targets registered in this
process by Python code are not registered in the worker, so a program that needs them at
compile time fails there (the error says so); a plugin handed over in memory cannot be
isolated (there is no library to load again); a worker that hangs makes the compile hang.
Isolation catches what crashes the compiler or loader every time; a damaged executable loaded
with ``trust_unverified`` that the worker loads can still crash this process (the damage may
be read nondeterministically, or only when the executable is freed or run).
"""
from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from typing import TYPE_CHECKING

from .errors import XlaRuntimeError

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ISOLATE_ENV", "IsolatedCompileCrash", "isolation_requested", "check_in_worker",
           "shutdown_workers"]

#: Set to ``1`` to isolate every compile and deserialization of the process.
ISOLATE_ENV = "PJRT_ISOLATED_COMPILE"
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


def isolation_requested(isolate: bool | None) -> bool:
    """``isolate`` when given, else whether ``PJRT_ISOLATED_COMPILE`` is set to a true value."""
    if isolate is not None:
        return bool(isolate)
    return os.environ.get(ISOLATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class _Worker:
    """One child process holding the plugin and a client, compiling on request."""

    def __init__(self, library: str, plugin_name: str, options: dict):
        self.lock = threading.Lock()
        self.output = tempfile.TemporaryFile()
        to_child_read, self._to_child = os.pipe()
        self._from_child, from_child_write = os.pipe()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env.pop(ISOLATE_ENV, None)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        source = ("import sys; from pjrt._isolated_worker import serve; "
                  "serve(int(sys.argv[1]), int(sys.argv[2]))")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", source, str(to_child_read), str(from_child_write)],
                stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.output,
                pass_fds=(to_child_read, from_child_write), env=env, start_new_session=True)
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        self.send({"library": library, "plugin": plugin_name, "options": options})
        ready = self.receive()
        if ready is None or ready.get("setup_error"):
            why = ready["setup_error"] if ready else " | ".join(self.death())
            self.close()
            raise RuntimeError(f"the isolation worker could not load plugin {plugin_name!r} "
                               f"from {library} and make a client with {options}: {why}")

    def send(self, message: dict) -> None:
        send_message(self._to_child, message)

    def receive(self) -> dict | None:
        """The worker's answer, or None when it died."""
        return receive_message(self._from_child)

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
        for descriptor in (self._to_child, self._from_child):
            try:
                os.close(descriptor)
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.output.close()


def send_message(descriptor: int, message: dict) -> None:
    """Write one message to the other side of an isolation pipe: its pickled length, then it.

    A closed pipe (the worker died) is not an error here: the next `receive_message` returns
    None, and the caller reads how the worker ended."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        try:
            written = os.write(descriptor, view)
        except BrokenPipeError:
            return
        view = view[written:]


def receive_message(descriptor: int) -> dict | None:
    """The next message from the other side of an isolation pipe, or None when it closed."""
    head = _read_exactly(descriptor, _LENGTH.size)
    if head is None:
        return None
    body = _read_exactly(descriptor, _LENGTH.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read_exactly(descriptor: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(descriptor, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_workers: dict[tuple, _Worker] = {}
_workers_lock = threading.Lock()


def _worker_for(client: "Client") -> tuple[tuple, _Worker]:
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
            worker = _workers[key] = _Worker(plugin.library_path, plugin.name, options)
    return key, worker


def check_in_worker(client: "Client", kind: str, payload: bytes, options: bytes) -> None:
    """Compile (``kind="compile"``: ``payload`` is the program) or deserialize
    (``kind="deserialize"``: the plugin's serialized executable) in the isolation worker with
    the same serialized compile ``options``; return when the plugin succeeded there.

    Raises:
      IsolatedCompileCrash: the worker died on it.
      XlaRuntimeError: the plugin refused it there (its error, as it reported it).
      ValueError: the plugin cannot be isolated (handed over in memory).
      RuntimeError: the worker could not load the plugin or make its client.
    """
    what = "program" if kind == "compile" else "serialized executable"
    key, worker = _worker_for(client)
    with worker.lock:
        worker.send({"kind": kind, "payload": payload, "options": options})
        answer = worker.receive()
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
