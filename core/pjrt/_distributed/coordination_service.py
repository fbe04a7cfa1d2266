"""XLA's coordination service, in Python: what process 0 of a job runs.

The same gRPC service (``xla.coordination.CoordinationService``) and the same rules as the
service jaxlib's ``get_distributed_runtime_service`` starts, so that jaxlib's clients and
pjrt's ([`DistributedRuntimeClient`][pjrt._distributed.coordination_client.DistributedRuntimeClient]) can join it:

* Tasks (processes) ``0 .. num_tasks - 1`` register with a random incarnation number; the
  registration waits until every task has registered (a barrier), so a job forms at once.
  A task registering again with another incarnation while it is connected has restarted (or
  is a second process with its id): it is set in error and the error goes to every task.
* Each task sends heartbeats; one silent for ``heartbeat_timeout`` is set in error, and the
  error reaches every task through its pending ``PollForError`` call, which only ever
  returns with an error.
* Barriers have an id, a deadline set by the first arrival, optional participants, and a
  counter for reuse of an id; one fails when a participant is in error or leaves.
* ``ShutdownTask`` is a barrier of every task (``shutdown_timeout``), after which all
  disconnect together.
* The key-value store is a directory tree: keys are normalised (no leading, trailing or
  doubled ``/``), a directory get returns the keys under ``dir/``, a delete removes a key
  and its directory.

The rules take callbacks, as XLA's service does: a request that waits (a registration, a
barrier, a blocking get, error polling) hands a ``done`` that a later request or the
health-check thread calls. The transport is `pjrt._distributed.coordination_server`.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from ..errors import ErrorCode
from . import coordination_messages as msg
from .coordination_messages import Status, make_status
from .coordination_store import DirectoryStore

logger = logging.getLogger(__name__)

_REGISTER_BARRIER = "[Init]Wait_for_all_tasks_to_register"
_SHUTDOWN_BARRIER = "Shutdown"
#: How often the health-check thread looks for silent tasks and expired barriers (at most).
_CHECK_INTERVAL_S = 1.0



class _Task:
    __slots__ = ("state", "incarnation", "status", "last_heartbeat", "grace_until", "barriers")

    def __init__(self):
        self.state = msg.DISCONNECTED
        self.incarnation = 0
        self.status: Status | None = None
        self.last_heartbeat = 0.0
        self.grace_until = 0.0
        self.barriers: set[str] = set()


class _Barrier:
    __slots__ = ("id", "counter", "passed", "initialized", "result", "tasks", "pending",
                 "callbacks", "deadline", "initiating_task")

    def __init__(self, barrier_id: str):
        self.id = barrier_id
        self.counter = 0
        self.passed = False
        self.initialized = False
        self.result: Status | None = None
        self.tasks: dict[int, bool] = {}
        self.pending = 0
        self.callbacks: dict[int, Callable] = {}
        self.deadline = 0.0
        self.initiating_task = -1

    def name(self, counter: int | None = None) -> str:
        return f"{self.id}::{self.counter if counter is None else counter}"

    def participants_error(self, task: int, tasks: list[int], num_tasks: int) -> Status | None:
        """Why ``task`` naming ``tasks`` (none: the whole job of ``num_tasks``) disagrees with
        the barrier's participants, or None."""
        if not tasks:
            if len(self.tasks) == num_tasks:
                return None
            return make_status(ErrorCode.INVALID_ARGUMENT,
                               f"barrier {self.name()}: this process named no participants (the "
                               f"whole job), another named {sorted(self.tasks)}; call it with "
                               f"the same process_ids everywhere")
        if len(tasks) != len(self.tasks) or any(t not in self.tasks for t in tasks):
            return make_status(ErrorCode.INVALID_ARGUMENT,
                               f"barrier {self.name()}: the processes name different "
                               f"participants ({sorted(tasks)} and {sorted(self.tasks)}); call "
                               f"it with the same process_ids everywhere")
        if task not in self.tasks:
            return make_status(ErrorCode.INVALID_ARGUMENT,
                               f"process {task} called barrier {self.name()} but is not among "
                               f"its participants {sorted(self.tasks)}")
        return None

    def timeout_message(self, register_timeout: float) -> str:
        """What a barrier that ran out of time says: who is missing."""
        missing = [t for t, arrived in self.tasks.items() if not arrived]
        shown = ", ".join(str(t) for t in missing[:8]) + (" ..." if len(missing) > 8 else "")
        arrived = len(self.tasks) - len(missing)
        if self.id == _REGISTER_BARRIER:
            return (f"the job did not form: {arrived} of {len(self.tasks)} processes registered "
                    f"with the coordination service within {register_timeout:g} s; missing: "
                    f"process {shown}")
        return (f"barrier {self.id!r} timed out: {arrived} of {len(self.tasks)} processes "
                f"reached it; missing: process {shown}")


class _Aliveness:
    """Pending ``GetAliveTasks`` calls: a call for a set of tasks returns once every live
    task of the set has asked, the same answer to each."""

    def __init__(self):
        self._entries: list[dict] = []

    def add(self, requesting_task: int, tasks: list[int], done: Callable) -> None:
        wanted = set(tasks)
        if requesting_task not in wanted:
            done(make_status(ErrorCode.INVALID_ARGUMENT,
                             f"process {requesting_task} asked which of {sorted(wanted)} are "
                             f"alive but is not among them"), [], [])
            return
        for entry in self._entries:
            if entry["tasks"] == wanted:
                break
        else:
            entry = {"tasks": wanted, "in": set(), "dones": []}
            self._entries.append(entry)
        entry["in"].add(requesting_task)
        entry["dones"].append(done)

    def refresh(self, alive: Callable[[int], bool], incarnation: Callable[[int], int]) -> None:
        for entry in list(self._entries):
            live = sorted(t for t in entry["tasks"] if alive(t))
            if set(live) <= entry["in"]:
                incarnations = [incarnation(t) for t in live]
                for done in entry["dones"]:
                    done(None, live, incarnations)
                self._entries.remove(entry)

    def stop(self) -> None:
        entries, self._entries = self._entries, []
        for entry in entries:
            for done in entry["dones"]:
                done(make_status(ErrorCode.ABORTED, "the coordination service is shutting down"),
                     [], [])


class _ErrorPolling:
    """The tasks' ``PollForError`` calls: pending until the job's first error, which answers
    them all (and every later poll at once)."""

    def __init__(self):
        self.started = False  # a task has polled: errors reach the tasks this way
        self._result: Status | None = None
        self._pollers: dict[int, Callable] = {}

    def add(self, task: int, done: Callable) -> None:
        if self._result is not None:
            done(self._result)
            return
        self.remove(task, "a newer error poll from the same process")
        self._pollers[task] = done

    def remove(self, task: int, reason: str) -> None:
        done = self._pollers.pop(task, None)
        if done is not None:
            done(make_status(ErrorCode.CANCELLED, reason))

    def answer(self, result: Status) -> None:
        if self._result is not None:
            return
        self._result = result
        pollers, self._pollers = self._pollers, {}
        for done in pollers.values():
            done(result)


class _Watching:
    """``WatchTasks`` calls: each returns the tasks' states once they differ from the version
    its caller knows."""

    def __init__(self):
        self.version = 0
        self._watchers: list[Callable] = []

    @staticmethod
    def infos(tasks: dict) -> list[dict]:
        return [{"task_id": task, "state": state.state, "incarnation": state.incarnation,
                 "error_code": state.status[0] if state.status else 0,
                 "error_message": state.status[1] if state.status else ""}
                for task, state in tasks.items()]

    def changed(self, tasks: dict) -> None:
        self.version += 1
        watchers, self._watchers = self._watchers, []
        if watchers:
            infos = self.infos(tasks)
            for done in watchers:
                done(infos, self.version)

    def watch(self, version: int, tasks: dict, done: Callable) -> None:
        if version >= 0 and version == self.version:
            self._watchers.append(done)
        else:
            done(self.infos(tasks), self.version)

    def stop(self) -> None:
        watchers, self._watchers = self._watchers, []
        for done in watchers:
            done([], -1)


class CoordinationService:
    """The service's state and rules, without the transport (see `GrpcCoordinationServer`).

    Args:
      num_tasks: processes in the job.
      heartbeat_timeout: seconds without a heartbeat after which a task is lost.
      cluster_register_timeout: seconds the first registration waits for the others.
      shutdown_timeout: seconds the shutdown barrier waits; 0 disconnects each task alone.
      recoverable: tasks may restart and register again (no error is propagated then).
    """

    def __init__(self, num_tasks: int, heartbeat_timeout: float = 100.0,
                 cluster_register_timeout: float = 3600.0, shutdown_timeout: float = 300.0,
                 recoverable: bool = False):
        self.num_tasks = num_tasks
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.cluster_register_timeout = float(cluster_register_timeout)
        self.shutdown_timeout = float(shutdown_timeout)
        self.recoverable = bool(recoverable)
        self.incarnation = random.getrandbits(63) | 1
        self._lock = threading.RLock()
        self._tasks = {i: _Task() for i in range(num_tasks)}
        self._barriers: dict[str, _Barrier] = {}
        self._ongoing: set[str] = set()
        #: The key-value store (its own lock: a get never waits for the job's state).
        self.store = DirectoryStore()
        self._stopped = False
        self._polling = _ErrorPolling()
        self._aliveness = _Aliveness()
        self._watching = _Watching()
        self._wake = threading.Condition(self._lock)
        self._checker = threading.Thread(target=self._check_loop, name="pjrt-coordination-health",
                                         daemon=True)
        self._checker.start()

    # -- health --------------------------------------------------------------------------------

    def _check_loop(self) -> None:
        interval = min(_CHECK_INTERVAL_S, max(0.05, self.heartbeat_timeout / 4))
        with self._wake:
            while not self._stopped:
                self._wake.wait(interval)
                if self._stopped:
                    return
                try:
                    self._check_heartbeats()
                    self._check_barriers()
                except Exception:  # noqa: BLE001 - the checker must keep running
                    logger.exception("coordination service health check failed")

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        stale = [task for task, state in self._tasks.items()
                 if state.state == msg.CONNECTED
                 and now - state.last_heartbeat > self.heartbeat_timeout]
        for task in stale:
            self._set_task_error(task, make_status(
                ErrorCode.UNAVAILABLE,
                f"process {task} sent no heartbeat for {self.heartbeat_timeout:g} s: it has "
                f"died, hangs, or lost its connection to the coordination service", task))
        if stale:
            names = ", ".join(str(t) for t in stale[:3])
            self._propagate(make_status(
                ErrorCode.UNAVAILABLE,
                f"process {names} of the job stopped sending heartbeats (none for "
                f"{self.heartbeat_timeout:g} s): it has died, hangs, or lost its connection "
                f"to the coordination service. Look at its output for an earlier error",
                stale[0]))

    def _check_barriers(self) -> None:
        now = time.monotonic()
        for barrier_id in list(self._ongoing):
            barrier = self._barriers[barrier_id]
            if now <= barrier.deadline:
                continue
            self._pass_barrier(barrier, make_status(
                ErrorCode.DEADLINE_EXCEEDED, barrier.timeout_message(self.cluster_register_timeout)))

    # -- tasks -----------------------------------------------------------------------------------

    def _unknown_task(self, task: int, what: str) -> Status:
        return make_status(ErrorCode.INVALID_ARGUMENT,
                       f"{what} from process {task}, but the job has {self.num_tasks} "
                       f"processes (ids 0 to {self.num_tasks - 1}): the processes disagree on "
                       f"the size of the job, or the id is wrong")

    def register_task(self, task: int, incarnation: int, done: Callable) -> None:
        with self._lock:
            if self._stopped:
                return done(make_status(ErrorCode.INTERNAL,
                                    "the coordination service has stopped; a new job needs a "
                                    "new service"))
            state = self._tasks.get(task)
            if state is None:
                return done(self._unknown_task(task, "a registration"))
            if state.state == msg.DISCONNECTED or (
                    self.recoverable and state.status is not None
                    and state.status[0] == ErrorCode.UNAVAILABLE):
                state.incarnation = incarnation

                def connect_after(result, counter, task=task, incarnation=incarnation):
                    state = self._tasks[task]
                    if result is None and incarnation == state.incarnation:
                        self._connect(task, incarnation)
                        done(None)
                    elif result is None or result[0] == ErrorCode.CANCELLED:
                        done(make_status(ErrorCode.ALREADY_EXISTS,
                                     f"process {task} registered again from another process "
                                     f"(a newer incarnation) while this one waited: are two "
                                     f"processes started with id {task}?", task))
                    else:
                        done(result)

                self._barrier_locked(_REGISTER_BARRIER, 0, self.cluster_register_timeout, task,
                                     [], connect_after)
                self._state_changed()
                return None
            if state.state == msg.CONNECTED:
                if state.incarnation == incarnation or self.recoverable:
                    self._connect(task, incarnation)
                    return done(None)
                text = (f"process {task} connected again with another incarnation while the "
                        f"job runs: it restarted, or a second process was started with id "
                        f"{task}")
            else:
                text = (f"process {task} tried to connect while it is in error "
                        f"({state.status[1] if state.status else 'unknown'})")
            error = make_status(ErrorCode.ABORTED, text, task)
            self._set_task_error(task, error)
            self._propagate(error)
            return done(error)

    def _connect(self, task: int, incarnation: int) -> None:
        state = self._tasks[task]
        state.incarnation = incarnation
        state.state = msg.CONNECTED
        state.status = None
        state.last_heartbeat = time.monotonic()
        self._state_changed()

    def heartbeat(self, task: int, incarnation: int) -> Status | None:
        with self._lock:
            if self._stopped:
                return make_status(ErrorCode.INTERNAL, "the coordination service has stopped")
            state = self._tasks.get(task)
            if state is None:
                return self._unknown_task(task, "a heartbeat")
            if state.status is not None:
                return make_status(ErrorCode.ABORTED,
                               f"process {task} is in error: {state.status[1]}", task)
            if state.state == msg.DISCONNECTED and time.monotonic() > state.grace_until:
                return make_status(ErrorCode.INVALID_ARGUMENT,
                               f"process {task} sent a heartbeat but is not registered; the "
                               f"service may have restarted: register again")
            if state.incarnation == incarnation:
                state.last_heartbeat = time.monotonic()
                return None
            if self.recoverable:
                return None
            error = make_status(ErrorCode.ABORTED,
                            f"process {task} sent a heartbeat from another incarnation than "
                            f"the one registered: it restarted, or two processes have id {task}",
                            task)
            self._set_task_error(task, error)
            self._propagate(error)
            return error

    def _set_task_error(self, task: int, error: Status) -> None:
        state = self._tasks[task]
        if state.state == msg.ERROR:
            return
        state.state = msg.ERROR
        state.status = error
        self._leave_barriers(task, f"process {task} is in error: {error[1]}")
        self._refresh_aliveness()
        self._state_changed()

    def _set_all_tasks_error(self, error: Status) -> None:
        for task in self._tasks:
            self._set_task_error(task, error)

    def _propagate(self, error: Status) -> None:
        if self.recoverable:
            return
        if self._polling.started:
            self._polling.answer(error)
        else:
            self._set_all_tasks_error(make_status(
                ErrorCode.INTERNAL, f"every process was set in error, none polling for errors: "
                                    f"{error[1]}", error[2]))

    def poll_for_error(self, task: int, done: Callable) -> None:
        with self._lock:
            if self._stopped:
                return done(make_status(ErrorCode.CANCELLED, "the coordination service is shutting "
                                                         "down"))
            self._polling.started = True
            state = self._tasks.get(task)
            if state is None:
                return done(self._unknown_task(task, "error polling"))
            if state.state == msg.DISCONNECTED and time.monotonic() > state.grace_until:
                return done(make_status(ErrorCode.FAILED_PRECONDITION,
                                    f"process {task} polls for errors but is not registered"))
            if state.state == msg.ERROR:
                return done(make_status(ErrorCode.FAILED_PRECONDITION,
                                    f"process {task} is already in error: "
                                    f"{state.status[1] if state.status else ''}", task))
            self._polling.add(task, done)
            return None

    def shutdown_task(self, task: int, done: Callable) -> None:
        if self.shutdown_timeout > 0 and not self.recoverable:
            def after(result, counter):
                if result is None:
                    done(None)
                else:
                    done(make_status(result[0], f"the shutdown barrier failed: {result[1]}",
                                 result[2]))
            with self._lock:
                self._barrier_locked(_SHUTDOWN_BARRIER, 0, self.shutdown_timeout, task,
                                     list(self._tasks), after)
            return
        with self._lock:
            done(self._disconnect(task))

    def _disconnect(self, task: int) -> Status | None:
        if self._stopped:
            return make_status(ErrorCode.INTERNAL, "the coordination service has stopped")
        state = self._tasks.get(task)
        if state is None:
            return self._unknown_task(task, "a disconnection")
        if state.state == msg.DISCONNECTED:
            return make_status(ErrorCode.FAILED_PRECONDITION,
                           f"process {task} is already disconnected")
        state.state = msg.DISCONNECTED
        state.status = None
        state.grace_until = time.monotonic() + self.heartbeat_timeout
        self._leave_barriers(task, f"process {task} disconnected")
        self._refresh_aliveness()
        self._polling.remove(task, f"process {task} has disconnected")
        self._state_changed()
        return None

    # -- watching and aliveness ----------------------------------------------------------------

    def _state_changed(self) -> None:
        self._watching.changed(self._tasks)

    def watch_tasks(self, version: int, done: Callable) -> None:
        with self._lock:
            self._watching.watch(version, self._tasks, done)

    def get_alive_tasks(self, requesting_task: int, tasks: list[int], done: Callable) -> None:
        with self._lock:
            self._aliveness.add(requesting_task, tasks, done)
            self._refresh_aliveness()

    def _refresh_aliveness(self) -> None:
        self._aliveness.refresh(
            lambda t: t in self._tasks and self._tasks[t].state == msg.CONNECTED,
            lambda t: self._tasks[t].incarnation)

    # -- barriers --------------------------------------------------------------------------------

    def barrier(self, barrier_id: str, counter: int, timeout: float, task: int,
                tasks: list[int], done: Callable) -> None:
        with self._lock:
            self._barrier_locked(barrier_id, counter, timeout, task, tasks, done)

    def _barrier_locked(self, barrier_id: str, counter: int, timeout: float, task: int,
                        tasks: list[int], done: Callable) -> None:
        if self._stopped:
            return done(make_status(ErrorCode.INTERNAL,
                                f"barrier {barrier_id!r} called after the coordination service "
                                f"shut down"), counter)
        barrier = self._barriers.get(barrier_id)
        if barrier is None:
            barrier = self._barriers[barrier_id] = _Barrier(barrier_id)
        new_instance = ((not barrier.initialized and counter == 0)
                        or (barrier.passed and counter == barrier.counter + 1))
        if (barrier.passed and self.recoverable and counter == 0
                and barrier_id not in (_REGISTER_BARRIER, _SHUTDOWN_BARRIER)):
            new_instance = True
            counter = barrier.counter + 1
        if new_instance:
            error = self._init_barrier(barrier, counter, timeout, task, tasks)
            if error is not None:
                return done(error, counter)
        previous = barrier.callbacks.get(task)
        if previous is not None:
            previous(make_status(ErrorCode.CANCELLED,
                             f"a newer call of barrier {barrier.name()} from the same process"),
                     barrier.counter)
        barrier.callbacks[task] = done
        if not new_instance and counter != barrier.counter and not (
                self.recoverable and counter == 0):
            self._pass_barrier(barrier, make_status(
                ErrorCode.INTERNAL,
                f"barrier {barrier.name(counter)} was called, but the service is at its "
                f"instance {barrier.counter}: a process or the service restarted, or one "
                f"process ran ahead of the others"))
            return None
        if barrier.passed and counter == barrier.counter and not barrier.tasks:  # as XLA's:
            barrier.result = _cancelled_early(barrier.result)  # no participants known
            return barrier.callbacks.pop(task)(barrier.result, barrier.counter)
        if not self._check_barrier_tasks(barrier, task, tasks):
            return None
        if barrier.passed and counter == barrier.counter:
            callback = barrier.callbacks.pop(task)
            if barrier.id == _SHUTDOWN_BARRIER:
                error = self._disconnect(task)
                if error is not None:
                    return callback(error, barrier.counter)
            return callback(barrier.result, barrier.counter)
        if not barrier.tasks.get(task, True):
            barrier.tasks[task] = True
            barrier.pending -= 1
            if barrier.pending == 0:
                self._pass_barrier(barrier, None)
        return None

    def _init_barrier(self, barrier: _Barrier, counter: int, timeout: float, task: int,
                      tasks: list[int]) -> Status | None:
        barrier.counter = counter
        barrier.passed = False
        barrier.initialized = True
        barrier.result = None
        barrier.initiating_task = task
        barrier.callbacks = {}
        if barrier.tasks:
            for t in barrier.tasks:
                barrier.tasks[t] = False
        elif not tasks:
            barrier.tasks = {t: False for t in self._tasks}
        else:
            for t in tasks:
                if t not in self._tasks:
                    error = make_status(ErrorCode.INVALID_ARGUMENT,
                                    f"barrier {barrier.name()} names process {t}, which is not "
                                    f"in the job of {self.num_tasks} processes")
                    self._pass_barrier(barrier, error)
                    return error
                barrier.tasks[t] = False
        barrier.pending = len(barrier.tasks)
        if not self.recoverable:
            for t in barrier.tasks:
                state = self._tasks[t]
                if state.state == msg.ERROR:
                    error = make_status(ErrorCode.INTERNAL,
                                    f"barrier {barrier.name()} cannot pass: process {t} was "
                                    f"already in error: "
                                    f"{state.status[1] if state.status else ''}", t)
                    self._pass_barrier(barrier, error)
                    return error
        barrier.deadline = time.monotonic() + max(0.0, timeout)
        self._ongoing.add(barrier.id)
        for t in barrier.tasks:
            self._tasks[t].barriers.add(barrier.id)
        return None

    def _check_barrier_tasks(self, barrier: _Barrier, task: int, tasks: list[int]) -> bool:
        error = barrier.participants_error(task, tasks, len(self._tasks))
        if error is not None:
            self._pass_barrier(barrier, error)
        return error is None

    def _pass_barrier(self, barrier: _Barrier, result: Status | None) -> None:
        barrier.passed = True
        barrier.result = result
        for t in barrier.tasks:
            if t in self._tasks:
                self._tasks[t].barriers.discard(barrier.id)
        self._ongoing.discard(barrier.id)
        callbacks, barrier.callbacks = barrier.callbacks, {}
        for done in callbacks.values():
            done(result, barrier.counter)
        if barrier.id == _REGISTER_BARRIER and result is not None:
            self._set_all_tasks_error(make_status(ErrorCode.INTERNAL,
                                              f"the job did not form: {result[1]}"))
            return
        if barrier.id == _SHUTDOWN_BARRIER and not self._stopped:
            if result is None:
                for t in self._tasks:
                    if self._tasks[t].state != msg.DISCONNECTED:
                        self._disconnect(t)
            else:
                error = make_status(ErrorCode.INTERNAL, f"the shutdown barrier failed: {result[1]}",
                                result[2])
                self._propagate(error)
                self._set_all_tasks_error(error)

    def cancel_barrier(self, barrier_id: str, counter: int, task: int) -> Status | None:
        with self._lock:
            if self._stopped:
                return make_status(ErrorCode.INTERNAL, "the coordination service has stopped")
            barrier = self._barriers.get(barrier_id)
            if barrier is None:
                barrier = self._barriers[barrier_id] = _Barrier(barrier_id)
            if barrier.counter != counter:
                return make_status(ErrorCode.FAILED_PRECONDITION,
                               f"barrier {barrier_id}::{counter} was cancelled, but the service "
                               f"is at its instance {barrier.counter}")
            if barrier.passed:
                return make_status(ErrorCode.FAILED_PRECONDITION,
                               f"barrier {barrier.name()} has already passed")
            barrier.initialized = True  # cancelled before anyone came: later arrivals fail
            self._pass_barrier(barrier, make_status(ErrorCode.CANCELLED,
                                                f"barrier {barrier.name()} was cancelled by "
                                                f"process {task}"))
            return None

    def _leave_barriers(self, task: int, reason: str) -> None:
        state = self._tasks[task]
        for barrier_id in list(state.barriers):
            barrier = self._barriers[barrier_id]
            if self.recoverable:
                if barrier.tasks.get(task):
                    barrier.tasks[task] = False
                    barrier.pending += 1
                done = barrier.callbacks.pop(task, None)
                if done is not None:
                    done(make_status(ErrorCode.CANCELLED, f"barrier {barrier.name()}: {reason}"),
                         barrier.counter)
                continue
            self._pass_barrier(barrier, make_status(
                ErrorCode.INTERNAL, f"barrier {barrier.name()} failed: {reason}", task))

    # -- stopping --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Fail every ongoing barrier and wait, and stop the health checks."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._wake.notify_all()
            for barrier in list(self._barriers.values()):
                if not barrier.passed and barrier.initialized:
                    self._pass_barrier(barrier, make_status(
                        ErrorCode.ABORTED,
                        f"barrier {barrier.name()} failed: the coordination service is "
                        f"shutting down"))
            self._barriers.clear()
            self._watching.stop()
            if self._polling.started:
                self._polling.answer(make_status(ErrorCode.CANCELLED,
                                               "the coordination service is shutting down"))
        self._aliveness.stop()
        self.store.stop()


def _cancelled_early(result: Status | None) -> Status | None:
    """The answer to a call of a barrier instance cancelled before any process reached it."""
    if result is None or result[0] != ErrorCode.CANCELLED:
        return result
    return make_status(ErrorCode.INVALID_ARGUMENT,
                       f"{result[1]} before any process reached it: this instance of the "
                       f"barrier has no participants; use the next one")
