"""The coordination service's less travelled paths, on pjrt's service and on jaxlib's (the
oracle), with real processes on 127.0.0.1: a recoverable job whose process restarts and
rejoins, ``WatchTasks`` and error polling when a process is lost, ``CancelBarrier``.

jaxlib 0.10.2's client has no method for ``WatchTasks`` or ``CancelBarrier`` (its agent polls
for errors itself); those requests are sent as pjrt's client writes them, to both services.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

grpc = pytest.importorskip("grpc", reason="pjrt[distributed] (grpcio) is not installed")

from pjrt import xla_client  # noqa: E402
from pjrt._distributed import coordination_messages as msg  # noqa: E402
from pjrt._distributed.coordination_errors import DistributedRuntimeError  # noqa: E402
from pjrt._wire import protowire as pw  # noqa: E402
from pjrt.errors import ErrorCode  # noqa: E402

from conftest import child_env  # noqa: E402
from test_coordination import _jaxlib, connect_all, free_port, pjrt_clients, start_service  # noqa: E402

KINDS = ["pjrt", "jaxlib"]


def send(client, method: str, timeout: float = 10, **fields) -> bytes:
    """One request of ``method`` from a connected pjrt client; the response bytes, or the
    service's answer as a `DistributedRuntimeError`."""
    return client._send(method, client._request(method, **fields), timeout)


def watch(client, version: int, timeout: float = 10) -> tuple[dict[int, tuple], int]:
    """``WatchTasks``: {task: (state, error code)} and the version of the job's state."""
    data = send(client, "WatchTasks", timeout, version_number=version)
    tasks: dict[int, tuple] = {}
    current = 0
    for number, _, raw in pw.iter_fields(data):
        if number == 2:
            current = raw
        elif number == 1:
            info = {n: v for n, _, v in pw.iter_fields(raw)}
            tasks[info.get(1, 0)] = (info.get(2, 0), info.get(3, 0))
    return tasks, current


def barrier_error(client, barrier_id: str, timeout_ms: int = 10_000, **fields):
    """The error of a barrier request (None when it passes)."""
    try:
        send(client, "Barrier", timeout_ms / 1000 + 5, barrier_id=barrier_id,
             barrier_timeout_in_ms=timeout_ms, source_task_id=client.node_id, **fields)
    except DistributedRuntimeError as error:
        return error
    return None


# -- CancelBarrier ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_cancel_barrier_as_jaxlib_service_does(kind):
    _jaxlib()
    address = f"127.0.0.1:{free_port()}"
    service = start_service(kind, address, 2, heartbeat_timeout=10)
    a, b = pjrt_clients(address, 2)
    try:
        connect_all([a, b])
        # A barrier in flight, cancelled by the other process: the waiter is told at once.
        outcome: list = []

        def wait():
            try:
                a.wait_at_barrier("step", 20_000)
                outcome.append(None)
            except DistributedRuntimeError as error:
                outcome.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.5)
        start = time.monotonic()
        send(b, "CancelBarrier", barrier_id="step", counter=0, source_task_id=1)
        waiter.join(15)
        assert time.monotonic() - start < 5
        assert outcome and outcome[0] is not None and outcome[0].code == ErrorCode.CANCELLED
        assert "cancel" in str(outcome[0]) and "1" in str(outcome[0])
        # The next instance of the id passes (each client counts the failed one).
        b._barrier_counters["step"] = 1  # b never called instance 0 itself
        threads = [threading.Thread(target=c.wait_at_barrier, args=("step", 20_000))
                               for c in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert a._barrier_counters["step"] == b._barrier_counters["step"] == 2
        # A barrier that has passed, or another instance than the service's: refused.
        with pytest.raises(DistributedRuntimeError) as passed:
            send(b, "CancelBarrier", barrier_id="step", counter=1, source_task_id=1)
        assert passed.value.code == ErrorCode.FAILED_PRECONDITION
        assert "passed" in str(passed.value)
        with pytest.raises(DistributedRuntimeError) as other:
            send(b, "CancelBarrier", barrier_id="step", counter=7, source_task_id=1)
        assert other.value.code == ErrorCode.FAILED_PRECONDITION
        # Cancelled before anyone reached it: whoever reaches that instance later fails at
        # once with INVALID_ARGUMENT (the service knows no participants for it), every time.
        send(b, "CancelBarrier", barrier_id="early", counter=0, source_task_id=1)
        for caller in (a, b):
            start = time.monotonic()
            error = barrier_error(caller, "early", 3_000)
            assert time.monotonic() - start < 2
            assert error is not None and error.code == ErrorCode.INVALID_ARGUMENT, error
            if kind == "pjrt":
                assert "cancelled by process 1 before any process reached it" in str(error)
    finally:
        for client in (a, b):
            client.close()
        service.shutdown()


# -- WatchTasks and error polling ------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_watch_tasks_and_poll_for_error_see_a_lost_process(kind):
    _jaxlib()
    address = f"127.0.0.1:{free_port()}"
    service = start_service(kind, address, 3, heartbeat_timeout=1)
    called: list = []
    clients = pjrt_clients(address, 3, heartbeat_timeout=1,
                           missed_heartbeat_callback=called.append)
    try:
        connect_all(clients)
        tasks, version = watch(clients[0], -1)
        assert tasks == {0: (msg.CONNECTED, 0), 1: (msg.CONNECTED, 0), 2: (msg.CONNECTED, 0)}
        # A watch of the current version waits for a change: process 2 going silent.
        changed: list = []
        watcher = threading.Thread(target=lambda: changed.append(watch(clients[0], version)))
        watcher.start()
        time.sleep(0.3)
        assert not changed  # nothing changed yet
        clients[2].close()  # no shutdown: its heartbeats stop
        watcher.join(10)
        tasks, newer = changed[0]
        assert newer > version
        assert tasks[2] == (msg.ERROR, ErrorCode.UNAVAILABLE)
        assert tasks[0] == tasks[1] == (msg.CONNECTED, 0)
        # The pending error polls of the others answered: each client holds the error (and
        # then calls its callback, on the thread that polled).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (all(c._error for c in clients[:2])
                                                   and len(called) >= 2):
            time.sleep(0.05)
        for client in clients[:2]:
            assert client._error is not None and client._error.code == ErrorCode.UNAVAILABLE
            assert "heartbeat" in str(client._error)
            if kind == "pjrt":
                assert client._error.lost_process == 2
        assert len(called) == 2
        with pytest.raises(DistributedRuntimeError, match="heartbeat"):
            clients[1].wait_at_barrier("after", 5_000)
        # A poll after the error is answered at once, with the same error.
        start = time.monotonic()
        with pytest.raises(DistributedRuntimeError) as polled:
            send(clients[1], "PollForError", 5, source_task_id=1)
        assert time.monotonic() - start < 2
        assert polled.value.code == ErrorCode.UNAVAILABLE
        assert watch(clients[0], -1)[0] == tasks
    finally:
        for client in clients:
            client.close()
        service.shutdown()


# -- a recoverable job -----------------------------------------------------------------------

RESTARTING_CHILD = textwrap.dedent("""
    import sys
    kind, address, step = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "jaxlib":
        from jax._src.lib import _jax as runtime
    else:
        from pjrt import xla_client as runtime
    c = runtime.get_distributed_runtime_client(address, 1, init_timeout=30,
                                               heartbeat_timeout=2)
    c.connect()
    if step == "first":
        c.key_value_set("first/1", "x")
        print("connected", flush=True)
        sys.stdin.readline()  # killed meanwhile
    else:
        print("found", c.key_value_try_get("first/1"), flush=True)
        c.key_value_set("rejoined", "yes")
        c.wait_at_barrier("after", 20000)
        print("passed", flush=True)
        c.shutdown()
        print("shut", flush=True)
""")


def _child(kind: str, address: str, step: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RESTARTING_CHILD, kind, address, step],
                            env=child_env(JAX_PLATFORMS="cpu"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("service_kind,client_kind,late", [
    ("pjrt", "pjrt", False), ("pjrt", "jaxlib", False), ("jaxlib", "pjrt", False),
    ("jaxlib", "jaxlib", False),
    pytest.param("pjrt", "pjrt", True, marks=pytest.mark.slow),
    pytest.param("jaxlib", "pjrt", True, marks=pytest.mark.slow)])
def test_a_process_of_a_recoverable_job_restarts_and_rejoins(service_kind, client_kind, late):
    """Process 1 is killed and started again with a new incarnation: on a recoverable
    service it joins the running job (before the service saw it lost, or after, ``late``),
    and process 0 never sees an error."""
    _jaxlib()
    address = f"127.0.0.1:{free_port()}"
    service = start_service(service_kind, address, 2, heartbeat_timeout=2, recoverable=True)
    survivor = xla_client.get_distributed_runtime_client(address, 0, init_timeout=30,
                                                         heartbeat_timeout=2)
    first = _child(client_kind, address, "first")
    again = None
    try:
        survivor.connect()
        assert first.stdout.readline().strip() == "connected"
        first.kill()
        first.wait()
        if late:  # the service has set process 1 in error (no heartbeat for 2 s)
            time.sleep(4)
        again = _child(client_kind, address, "again")
        assert survivor.blocking_key_value_get("rejoined", 30_000) == "yes"
        survivor.wait_at_barrier("after", 20_000)
        out, err = again.communicate(timeout=60)
        assert again.returncode == 0, err[-3000:]
        assert out.split() == ["found", "x", "passed", "shut"]
        assert survivor._error is None
        survivor.key_value_set("still", "working")
        assert survivor.key_value_try_get("still") == "working"
        survivor.shutdown()
    finally:
        for child in (first, again):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
        survivor.close()
        service.shutdown()


# -- a job that is not recoverable -------------------------------------------------------------

@pytest.mark.parametrize("service_kind", KINDS)
def test_a_restarted_process_of_a_job_that_is_not_recoverable_is_refused_at_once(service_kind):
    """Process 1 is killed and started again while the job runs: the service refuses the new
    incarnation (ABORTED, naming process 1) and sets the job in error; pjrt's client raises
    that at once (jaxlib's asks again until init_timeout, then ends its process)."""
    _jaxlib()
    address = f"127.0.0.1:{free_port()}"
    service = start_service(service_kind, address, 2, heartbeat_timeout=10)
    seen: list = []
    survivor = xla_client.get_distributed_runtime_client(address, 0, init_timeout=30,
                                                         heartbeat_timeout=10,
                                                         missed_heartbeat_callback=seen.append)
    first = _child("pjrt", address, "first")
    again = None
    try:
        survivor.connect()
        assert first.stdout.readline().strip() == "connected"
        first.kill()
        first.wait()
        start = time.monotonic()
        again = subprocess.Popen([sys.executable, "-c", REFUSED_CHILD, address],
                                 env=child_env(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        out, err = again.communicate(timeout=60)
        took = time.monotonic() - start
        assert again.returncode == 0, err[-3000:]
        code, message = out.strip().split(" ", 1)
        assert code == "ABORTED", out
        assert "process 1 cannot join the job" in message and "recoverable" in message
        assert took < 20  # not init_timeout's 30 s (an interpreter starts within it)
        # The job is in error, as on jaxlib's service: the survivor's waits end naming 1.
        with pytest.raises(DistributedRuntimeError) as lost:
            survivor.wait_at_barrier("after", 20_000)
        assert lost.value.code == ErrorCode.ABORTED
        if service_kind == "pjrt":
            assert lost.value.lost_process == 1
        assert seen and seen[0].code == ErrorCode.ABORTED
    finally:
        for child in (first, again):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
        survivor.close()
        service.shutdown()


REFUSED_CHILD = textwrap.dedent("""
    import sys
    from pjrt import xla_client
    from pjrt._distributed.coordination_errors import DistributedRuntimeError
    c = xla_client.get_distributed_runtime_client(sys.argv[1], 1, init_timeout=30,
                                                  heartbeat_timeout=10)
    try:
        c.connect()
        print("JOINED joined", flush=True)
    except DistributedRuntimeError as error:
        print(error.code.name, error, flush=True)
""")
