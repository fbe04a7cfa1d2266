"""Running one program over several processes: ``pjrt.distributed.initialize``.

Each process calls [`initialize`][pjrt.distributed.initialize] once, before creating clients, with the same
coordinator, the number of processes and its own id. From then on every client made through
the registry (``pjrt.devices()``, ``pjrt.get_backend()``...) or by ``make_c_api_client`` is a
multi-process client: its plugin gets the key-value callbacks and the create options
``node_id`` and ``num_nodes`` (to plugins that declare them), exchanges its topology with the
other processes, and lists every process's devices. Devices of other processes are
non-addressable (``device.is_addressable`` is False, ``device.process_index`` says whose).

The coordinator is, as in jax, an address, or names a key-value store (see
[`pjrt.kv_store`][pjrt.kv_store]):

* ``host:port`` (jax's form, and what ``pjrt launch`` uses): XLA's coordination service.
  Process 0 starts it, listening on ``coordinator_bind_address`` (``[::]:port`` by default);
  every process connects to ``host:port``. It needs grpcio (``pip install 'pjrt[distributed]'``)
  and no server to install; jax and torch_xla processes speak the same protocol. A process
  that dies or hangs is seen by the others within ``heartbeat_timeout``.
* ``sqlite:///path/job.db`` (or a path that exists or has a ``/``): a SQLite file all
  processes of one machine open; use a new file for each job.
* ``redis://host:port/db``: a Redis server, for processes on several machines.
* ``jax``: jax's coordination service, after ``jax.distributed.initialize`` in this process.
* or a [`KeyValueStore`][pjrt.kv_store.KeyValueStore] object.

Environment fallbacks, read when an argument is None (``pjrt launch`` sets them):

* ``PJRT_COORDINATOR``: the coordinator.
* ``PJRT_NUM_PROCESSES``: the number of processes.
* ``PJRT_PROCESS_ID``: this process's id, 0 to ``num_processes - 1``.
* ``PJRT_LOCAL_DEVICE_IDS``: comma-separated local device numbers this process uses (passed
  as ``visible_devices`` to plugins that declare it).
* ``PJRT_DISTRIBUTED_TIMEOUT``: seconds to wait for the other processes (default 300).

Under a cluster launcher the number of processes and this process's id (and, with several
processes on one host, its local device) are read from the launcher's own variables when
neither an argument nor a ``PJRT_*`` variable gives them: SLURM's ``srun``, Open MPI's and
MPICH's ``mpirun`` (and PMIx), and Kubernetes indexed jobs. ``PJRT_CLUSTER_DETECTION``
(``auto``, ``off``, or one launcher: ``slurm``, ``mpi``, ``k8s``) chooses; see
`detect_cluster`. The coordinator is always named by the operator.

A store serves one job. Each process claims its id in the store (the coordination service
does it itself), so a second process with the same id, an id out of range, a process that
counts the job differently, or a store left by an earlier job is refused with an error that
says which.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Mapping, Sequence

from ._distributed.coordination_errors import DistributedRuntimeError, DistributedTimeoutError

if TYPE_CHECKING:
    from ._distributed.coordination_client import DistributedRuntimeClient
    from ._distributed.coordination_server import DistributedRuntimeService
    from .kv_store import KeyValueStore

__all__ = ["initialize", "shutdown", "is_initialized", "global_state", "DistributedState",
           "COORDINATOR_ENV", "NUM_PROCESSES_ENV", "PROCESS_ID_ENV", "LOCAL_DEVICE_IDS_ENV",
           "TIMEOUT_ENV", "CLUSTER_DETECTION_ENV", "open_store", "next_client_prefix",
           "detect_cluster", "ClusterEnvironment", "check_job", "job_store", "JobStore",
           "DistributedRuntimeError", "DistributedTimeoutError"]

COORDINATOR_ENV = "PJRT_COORDINATOR"
NUM_PROCESSES_ENV = "PJRT_NUM_PROCESSES"
PROCESS_ID_ENV = "PJRT_PROCESS_ID"
LOCAL_DEVICE_IDS_ENV = "PJRT_LOCAL_DEVICE_IDS"
TIMEOUT_ENV = "PJRT_DISTRIBUTED_TIMEOUT"
CLUSTER_DETECTION_ENV = "PJRT_CLUSTER_DETECTION"
DEFAULT_TIMEOUT_SECONDS = 300.0


class DistributedState:
    """What [`initialize`][pjrt.distributed.initialize] set up for this process.

    Attributes:
      store: the shared key-value store (None before [`initialize`][pjrt.distributed.initialize]).
      coordinator: how it was named.
      num_processes: processes in the job.
      process_id: this process's id.
      local_device_ids: the local devices this process uses, or None for all.
      timeout: seconds to wait for the other processes.
      generation: how many times this process initialised: names the job's keys in the store
        (``pjrt/job/<generation>/...``: who holds each id, who left, why the job failed), so a
        process that leaves and joins again starts afresh, while a new process meeting an
        earlier job's keys is refused.
      client_counts: plugin name -> clients made with this store so far (names each client's
        key prefix).
      owns_store: whether this module opened the store (closed by shutdown); a store passed
        in belongs to its caller.
      cluster: the launcher whose variables gave the number of processes or this process's
        id (``"slurm"``, ``"mpi"``, ``"k8s"``), or None.
      local_process_id: this process's rank among the processes of its host, when the
        launcher says it.
      member: what this process wrote as its claim on its id (host, pid and a random part).
      client: this process's [`DistributedRuntimeClient`][pjrt._distributed.coordination_client.DistributedRuntimeClient]
        when the coordinator is an address, else None.
      service: the coordination service process 0 started (None elsewhere).
    """

    # A plain class, not a dataclass: client creation reads it, and start-up stays light.
    def __init__(self, store: "KeyValueStore | None" = None, coordinator: object = None,
                 num_processes: int = 1, process_id: int = 0,
                 local_device_ids: tuple[int, ...] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, generation: int = 0,
                 client_counts: dict | None = None, owns_store: bool = False,
                 cluster: str | None = None, local_process_id: int | None = None,
                 member: str = ""):
        self.store = store
        self.coordinator = coordinator
        self.num_processes = num_processes
        self.process_id = process_id
        self.local_device_ids = local_device_ids
        self.timeout = timeout
        self.generation = generation
        self.client_counts = {} if client_counts is None else client_counts
        self.owns_store = owns_store
        self.cluster = cluster
        self.local_process_id = local_process_id
        self.member = member
        self.client: "DistributedRuntimeClient | None" = None
        self.service: "DistributedRuntimeService | None" = None

    def __repr__(self) -> str:
        return (f"DistributedState(num_processes={self.num_processes}, "
                f"process_id={self.process_id}, coordinator={self.coordinator!r})")


#: The state of this process; read it, change it only through initialize/shutdown.
global_state = DistributedState()
_lock = threading.Lock()


def _env_int(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _env_device_ids() -> tuple[int, ...] | None:
    value = os.environ.get(LOCAL_DEVICE_IDS_ENV, "").strip()
    if not value:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"{LOCAL_DEVICE_IDS_ENV}={value!r}: write comma-separated device "
                         f"numbers such as 0,1") from None


# -- cluster launchers -------------------------------------------------------------------------

#: Launcher names PJRT_CLUSTER_DETECTION (and initialize's cluster_detection_method) accept.
CLUSTER_LAUNCHERS = ("slurm", "mpi", "k8s")

#: Variables that list the devices a process sees. One device listed means the process was
#: given its own (a wrapper's ``CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK``): the plugin
#: numbers it 0, so the local rank would name a device that is not there.
_VISIBLE_DEVICE_LISTS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                         "TPU_VISIBLE_CHIPS")


class ClusterEnvironment:
    """What a cluster launcher's variables say about this process.

    Attributes:
      launcher: ``"slurm"``, ``"mpi"`` or ``"k8s"``.
      num_processes: processes in the job, or None where the launcher does not say.
      process_id: this process's id (its rank), or None.
      local_process_id: its rank among the job's processes on this host, or None.
      shares_host: whether other processes of the job run on this host (None: not said).
      binds_devices: whether the launcher gave each process devices of its own (``srun
        --gpus-per-task``), so that each sees only those.
      origins: for each attribute above that is set, the variable that gave it, as
        ``NAME=value`` (for messages).
    """

    def __init__(self, launcher: str, source: str):
        self.launcher = launcher
        self.source = source  # the launcher as its variables name it: "Open MPI", "PMIx"...
        self.num_processes: int | None = None
        self.process_id: int | None = None
        self.local_process_id: int | None = None
        self.shares_host: bool | None = None
        self.binds_devices = False
        self.origins: dict[str, str] = {}

    def read(self, environ: Mapping[str, str], field: str, *names: str) -> int | None:
        """Set ``field`` from the first of ``names`` that is set; returns its value."""
        for name in names:
            value = _env_int(name, environ)
            if value is not None:
                setattr(self, field, value)
                self.origins[field] = f"{name}={value}"
                return value
        return None

    def local_device_ids(self, environ: Mapping[str, str]) -> tuple[int, ...] | None:
        """The device a process gets when several share a host: the one its local rank
        numbers (as jax does). None (every device it sees) when it has the host to itself,
        when the launcher does not say, or when the launcher or a wrapper already gave it
        devices of its own (``srun --gpus-per-task``; a single device in
        ``CUDA_VISIBLE_DEVICES`` or the like)."""
        if not self.shares_host or self.local_process_id is None or self.binds_devices:
            return None
        for name in _VISIBLE_DEVICE_LISTS:
            listed = environ.get(name, "").strip()
            if listed and len(listed.split(",")) == 1:
                return None
        return (self.local_process_id,)

    def __repr__(self) -> str:
        return (f"ClusterEnvironment({self.launcher!r}, num_processes={self.num_processes}, "
                f"process_id={self.process_id}, local_process_id={self.local_process_id})")


def _slurm(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    # A job step started by srun. The step variables are set by srun only: in the batch script
    # of sbatch, SLURM_PROCID is 0 and SLURM_NTASKS counts the whole allocation, so a script
    # run there directly must not wait for processes that were never started.
    if "SLURM_STEP_NODELIST" not in environ or "SLURM_PROCID" not in environ:
        return None
    found = ClusterEnvironment("slurm", "SLURM")
    count = found.read(environ, "num_processes", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    found.read(environ, "process_id", "SLURM_PROCID")
    found.read(environ, "local_process_id", "SLURM_LOCALID")
    hosts = _env_int("SLURM_STEP_NUM_NODES", environ) or _env_int("SLURM_NNODES", environ)
    if count is not None and hosts:
        found.shares_host = count > hosts
    found.binds_devices = bool(environ.get("SLURM_GPUS_PER_TASK", "").strip())
    return found


def _open_mpi(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    if "OMPI_COMM_WORLD_RANK" not in environ:
        return None
    found = ClusterEnvironment("mpi", "Open MPI")
    found.read(environ, "num_processes", "OMPI_COMM_WORLD_SIZE")
    found.read(environ, "process_id", "OMPI_COMM_WORLD_RANK")
    found.read(environ, "local_process_id", "OMPI_COMM_WORLD_LOCAL_RANK")
    local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", environ)
    if local_size is not None:
        found.shares_host = local_size > 1
    return found


def _hydra(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    # MPICH's and Intel MPI's launcher (Hydra) speak PMI.
    if "PMI_RANK" not in environ:
        return None
    found = ClusterEnvironment("mpi", "MPICH/Intel MPI")
    found.read(environ, "num_processes", "PMI_SIZE")
    found.read(environ, "process_id", "PMI_RANK")
    found.read(environ, "local_process_id", "MPI_LOCALRANKID")
    local_size = _env_int("MPI_LOCALNRANKS", environ)
    if local_size is not None:
        found.shares_host = local_size > 1
    return found


def _pmix(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    # PMIx servers (Open MPI 5's prterun, srun --mpi=pmix) export the rank only; the count
    # comes with the launcher's own variables, which must agree.
    if "PMIX_RANK" not in environ:
        return None
    found = ClusterEnvironment("mpi", "PMIx")
    found.read(environ, "process_id", "PMIX_RANK")
    return found


def _kubernetes(environ: Mapping[str, str]) -> ClusterEnvironment | None:
    # An indexed Job (completionMode: Indexed) gives each pod its index; the number of pods is
    # in the Job's spec, not in the pod's environment, so the operator sets PJRT_NUM_PROCESSES.
    if "JOB_COMPLETION_INDEX" not in environ:
        return None
    found = ClusterEnvironment("k8s", "a Kubernetes indexed Job")
    found.read(environ, "process_id", "JOB_COMPLETION_INDEX")
    return found


_DETECTORS = (_slurm, _open_mpi, _hydra, _pmix, _kubernetes)

_FIELD_WORDS = {"num_processes": "the number of processes", "process_id": "this process's id",
                "local_process_id": "this process's rank on its host"}


def detect_cluster(method: str | None = None,
                   environ: Mapping[str, str] | None = None) -> ClusterEnvironment | None:
    """What the cluster launcher that started this process says about it, or None.

    Launchers and the variables read:

    * ``slurm`` (``srun``): ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``, ``SLURM_PROCID``,
      ``SLURM_LOCALID``, ``SLURM_STEP_NUM_NODES``; only in a job step (``SLURM_STEP_NODELIST``
      set), not in the batch script itself.
    * ``mpi``: Open MPI (``OMPI_COMM_WORLD_SIZE``, ``_RANK``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``),
      MPICH and Intel MPI (``PMI_SIZE``, ``PMI_RANK``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``)
      and PMIx (``PMIX_RANK``).
    * ``k8s``: a Kubernetes indexed Job (``JOB_COMPLETION_INDEX``, the id only).

    Args:
      method: ``"auto"`` (every launcher; those present must agree), ``"off"``, or one
        launcher's name (only its variables are read, and they must be there);
        ``PJRT_CLUSTER_DETECTION`` or ``"auto"`` when None.
      environ: the variables to read; ``os.environ`` when None.

    Raises:
      ValueError: an unknown method; a named launcher whose variables are missing; a variable
        that is not an integer; or two launchers whose variables disagree.
    """
    environ = os.environ if environ is None else environ
    method = _detection_method(method, environ)
    if method == "off":
        return None
    found = [e for e in (detect(environ) for detect in _DETECTORS)
             if e is not None and method in ("auto", e.launcher)]
    if not found:
        if method != "auto":
            raise ValueError(f"{CLUSTER_DETECTION_ENV}={method}, but none of its variables is "
                             f"set in this process (see pjrt.distributed.detect_cluster); set "
                             f"{CLUSTER_DETECTION_ENV}=auto or off, or start the process with "
                             f"that launcher")
        return None
    return _merge(found)


def _detection_method(method: str | None, environ: Mapping[str, str]) -> str:
    """``method`` (or ``PJRT_CLUSTER_DETECTION``, or ``"auto"``), checked and normalised."""
    if method is None:
        method = environ.get(CLUSTER_DETECTION_ENV, "").strip() or "auto"
    method = method.strip().lower()
    if method in ("off", "deactivate", "none"):  # jax spells it "deactivate"
        return "off"
    if method != "auto" and method not in CLUSTER_LAUNCHERS:
        raise ValueError(f"cluster detection {method!r} is not one of auto, off, "
                         f"{', '.join(CLUSTER_LAUNCHERS)} (set {CLUSTER_DETECTION_ENV})")
    return method


def _merge(found: list[ClusterEnvironment]) -> ClusterEnvironment:
    """One answer from the launchers present, refusing any two that disagree."""
    merged = ClusterEnvironment(found[0].launcher, found[0].source)
    for field in ("num_processes", "process_id", "local_process_id"):
        givers = [e for e in found if getattr(e, field) is not None]
        if len({getattr(e, field) for e in givers}) > 1:
            said = ", ".join(f"{e.origins[field]} ({e.source})" for e in givers)
            raise ValueError(
                f"the cluster launchers' variables disagree on {_FIELD_WORDS[field]}: {said}. "
                f"Set {CLUSTER_DETECTION_ENV} to the launcher that started this process "
                f"({', '.join(CLUSTER_LAUNCHERS)}), or give the job's layout yourself "
                f"({NUM_PROCESSES_ENV} and {PROCESS_ID_ENV})")
        if givers:
            setattr(merged, field, getattr(givers[0], field))
            merged.origins[field] = givers[0].origins[field]
            if field == "num_processes":
                merged.launcher, merged.source = givers[0].launcher, givers[0].source
    shares = [e.shares_host for e in found if e.shares_host is not None]
    merged.shares_host = any(shares) if shares else None
    merged.binds_devices = any(e.binds_devices for e in found)
    return merged


def open_store(coordinator) -> tuple["KeyValueStore", bool]:
    """The store ``coordinator`` names (see the module docstring), and whether it was opened
    here (and so is closed by [`shutdown`][pjrt.distributed.shutdown]).

    Raises:
      ValueError: the coordinator names no kind of store pjrt knows.
    """
    # Imported here: a process that never spans processes never loads sqlite3 or redis.
    from .kv_store import RedisStore, SQLiteStore, as_store

    if not isinstance(coordinator, (str, os.PathLike)):
        return as_store(coordinator), False
    text = os.fspath(coordinator)
    if text.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(text), True
    if text == "jax":
        from .kv_store import JaxDistributedStore

        return JaxDistributedStore(), False
    named = text
    if text.startswith("sqlite://"):
        text = text[len("sqlite://"):]
    elif not isinstance(coordinator, os.PathLike) and not (
            "/" in text or os.sep in text or os.path.exists(text)):
        # A bare word is never taken for a file: "host:port" is the coordination service's
        # address (initialize handles it), anything else a mistake.
        text = ""
    if not text or "://" in text:
        raise ValueError(f"coordinator {named!r} names no store pjrt knows; give host:port "
                         f"(XLA's coordination service, started by process 0), "
                         f"sqlite:///path/to/job.db, redis://host:port/db, or jax")
    return SQLiteStore(text), True


# -- joining a job ---------------------------------------------------------------------------

_ONE_STORE_PER_JOB = ("A store serves one job: if it was left by an earlier job, start this one "
                      "with a new store (a new SQLite file, or another Redis database; "
                      "`redis-cli -n DB FLUSHDB` empties one)")


def _job_key(generation: int, *parts: object) -> str:
    """Keys of the job's membership: which process holds each id, who left, what failed."""
    return "/".join(("pjrt/job", str(generation), *map(str, parts)))


def _member_name() -> str:
    """This process as other processes' messages name it; the random part tells apart two
    processes whose pids match on different hosts, or a pid reused since an earlier job."""
    return f"pid {os.getpid()} on {socket.gethostname()} [{uuid.uuid4().hex[:8]}]"


def _fail_job(store, generation: int, message: str) -> None:
    """Record why the job cannot go on, so that every process of it stops with that reason
    (the first failure recorded wins)."""
    from .kv_store import claim

    claim(store, _job_key(generation, "failed"), message.encode("utf-8", "replace"))


def _failure(store, generation: int) -> str | None:
    held = store.try_get(_job_key(generation, "failed"))
    return None if held is None else held.decode("utf-8", "replace")


def _failed_elsewhere(message: str) -> RuntimeError:
    return RuntimeError(f"the job was stopped by another of its processes: {message}")


def _join(store, generation: int, num_processes: int, process_id: int, member: str,
          timeout: float) -> None:
    """Claim ``process_id`` in ``store`` and wait until every id of the job is claimed.

    Each refusal is recorded in the store before it is raised, so that the other processes
    stop too, with the same reason.
    """
    from .kv_store import claim

    if not 0 <= process_id < num_processes:
        message = (f"process id {process_id} ({member}) is outside 0..{num_processes - 1} for a "
                   f"job of {num_processes} processes; give each process its own id from 0 to "
                   f"{num_processes - 1}")
        _fail_job(store, generation, message)
        raise ValueError(message)
    holder = claim(store, _job_key(generation, "process", process_id), member.encode())
    if holder != member.encode():
        holder_text = holder.decode("utf-8", "replace")
        if store.try_get(_job_key(generation, "left", process_id)) is not None:
            message = (f"the store holds a job that has finished: process {process_id} "
                       f"({holder_text}) joined it and left. {_ONE_STORE_PER_JOB}")
        else:
            message = (f"process id {process_id} is claimed twice: by {holder_text} and by "
                       f"{member}. Give each process its own id from 0 to {num_processes - 1}. "
                       f"{_ONE_STORE_PER_JOB}")
        _fail_job(store, generation, message)
        raise RuntimeError(message)
    size = claim(store, _job_key(generation, "size"), f"{num_processes} {member}".encode())
    counted, _, counter = size.decode("utf-8", "replace").partition(" ")
    if counted != str(num_processes):
        message = (f"the processes disagree on the size of the job: {member} was started for "
                   f"{num_processes} processes, {counter} for {counted}. Start every process "
                   f"with the same number. {_ONE_STORE_PER_JOB}")
        _fail_job(store, generation, message)
        raise RuntimeError(message)
    _wait_for_all(store, generation, "process", num_processes, timeout, "join")


def _wait_for_all(store, generation: int, kind: str, num_processes: int, timeout: float,
                  what: str) -> None:
    """Wait until ``kind/<id>`` is set for every id, stopping at once when a process has
    recorded a failure (it would never come otherwise, and we would wait ``timeout``)."""
    deadline = time.monotonic() + max(0.0, timeout)
    for other in range(num_processes):
        key = _job_key(generation, kind, other)
        pause = 0.001
        while store.try_get(key) is None:
            failure = _failure(store, generation)
            if failure is not None:
                raise _failed_elsewhere(failure)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"process {other} of {num_processes} did not {what} within "
                                   f"{timeout:g} s")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
    # A process refused after the others had all arrived (a duplicate id among them).
    failure = _failure(store, generation)
    if failure is not None:
        raise _failed_elsewhere(failure)


def check_job() -> None:
    """Raise if a process of this job has recorded a failure since it started (a duplicate
    process id, say). Client creation calls it; a job that is not initialised passes.

    Raises:
      RuntimeError: the failure, as the process that found it wrote it.
    """
    store = global_state.store
    if store is None:
        return
    failure = _failure(store, global_state.generation)
    if failure is not None:
        raise _failed_elsewhere(failure)


class JobStore:
    """The job's store as its clients use it: a blocking get also stops, with the reason, as
    soon as a process of the job has recorded a failure, instead of waiting out its timeout
    for a process that will never write.

    Attributes:
      store: the store `initialize` opened.
      generation: the job's generation (see `DistributedState`).
    """

    def __init__(self, store: "KeyValueStore", generation: int):
        self.store = store
        self.generation = generation

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def try_get(self, key: str) -> bytes | None:
        return self.store.try_get(key)

    def get(self, key: str, timeout: float) -> bytes:
        from .kv_store import wait_for

        if getattr(self.store, "reports_failures", False):
            return self.store.get(key, timeout)  # ends with the job's error by itself

        def probe():
            value = self.store.try_get(key)
            if value is None:
                failure = _failure(self.store, self.generation)
                if failure is not None:
                    raise _failed_elsewhere(failure)
            return value

        return wait_for(probe, key, timeout)

    def claim(self, key: str, value: bytes) -> bytes:
        from .kv_store import claim

        return claim(self.store, key, value)

    def barrier(self, name: str, process_id: int, num_processes: int, timeout: float) -> None:
        failure = _failure(self.store, self.generation)
        if failure is not None:
            raise _failed_elsewhere(failure)
        self.store.barrier(name, process_id, num_processes, timeout)

    def __repr__(self) -> str:
        return f"JobStore({self.store!r}, generation={self.generation})"


def job_store() -> JobStore:
    """The store of the job `initialize` joined, as clients use it (see `JobStore`).

    Raises:
      RuntimeError: not initialised.
    """
    store = global_state.store
    if store is None:
        raise RuntimeError("pjrt.distributed.initialize(...) has not been called")
    return JobStore(store, global_state.generation)


def _missing_message(missing: list[str], cluster: ClusterEnvironment | None) -> str:
    message = f"pjrt.distributed.initialize needs {', '.join(missing)}"
    if cluster is None:
        return message + "; or start the processes with `pjrt launch -n N script.py`"
    said = ", ".join(cluster.origins.values())
    return (f"{message}. This process was started by {cluster.source} ({said}); the "
            f"coordinator is always yours to name: {COORDINATOR_ENV}=redis://host:6379/0 for "
            f"processes on several machines")


def initialize(coordinator_address=None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: Sequence[int] | None = None,
               timeout: float | None = None, cluster_detection_method: str | None = None,
               coordinator_bind_address: str | None = None,
               heartbeat_timeout: float | None = None,
               shutdown_timeout: float | None = None) -> None:
    """Join this process to a job of ``num_processes`` processes sharing a coordinator.

    As in jax::

        pjrt.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=i)

    process 0 starts XLA's coordination service on port 1234 and every process connects to
    it; the coordinator may also name a key-value store (see the module docstring).

    Call it once in each process, before creating clients (clients made earlier stay
    single-process). It waits until every process has joined.

    Each value comes from its argument, else its ``PJRT_*`` variable, else (the number of
    processes, this process's id and, with several processes on one host, the local device) the
    cluster launcher's variables (see `detect_cluster`).

    Args:
      coordinator_address: ``host:port`` of the coordination service, or a key-value store
        (see the module docstring); ``PJRT_COORDINATOR`` when None.
      num_processes: ``PJRT_NUM_PROCESSES`` when None, else the launcher's.
      process_id: this process's id, 0 to num_processes - 1; ``PJRT_PROCESS_ID`` when None,
        else the launcher's.
      local_device_ids: local device numbers this process uses (plugins that declare
        ``visible_devices`` get them); ``PJRT_LOCAL_DEVICE_IDS`` when None.
      timeout: seconds to wait for the other processes; ``PJRT_DISTRIBUTED_TIMEOUT`` or 300.
      cluster_detection_method: ``"auto"``, ``"off"``, ``"slurm"``, ``"mpi"`` or ``"k8s"``;
        ``PJRT_CLUSTER_DETECTION`` or ``"auto"`` when None.
      coordinator_bind_address: where process 0's coordination service listens;
        ``JAX_COORDINATOR_BIND_ADDRESS`` or ``[::]:<port>`` (every interface) when None.
      heartbeat_timeout: seconds after which a silent process is lost (100).
      shutdown_timeout: seconds `shutdown` waits for the other processes (300).

    Raises:
      RuntimeError: already initialised (call `shutdown` first); or the job was refused
        in this or another process: a process id claimed twice, processes that disagree on
        the number of processes, or a store left by an earlier job.
      ValueError: an argument is missing (and its variable unset) or out of range, or the
        launchers' variables disagree.
      TimeoutError: not every process joined within ``timeout``.
      OSError: process 0 cannot listen on the coordinator's port (it is in use).
      ImportError: the coordinator is an address and grpcio is missing.
    """
    coordinator, num_processes, process_id, local_device_ids, timeout = _from_environment(
        coordinator_address, num_processes, process_id, local_device_ids, timeout)
    cluster = None
    _detection_method(cluster_detection_method, os.environ)  # a misspelt value is an error
    if num_processes is None or process_id is None:
        cluster = detect_cluster(cluster_detection_method)
        if cluster is not None:
            if num_processes is None:
                num_processes = cluster.num_processes
            if process_id is None:
                process_id = cluster.process_id
            if local_device_ids is None:
                local_device_ids = cluster.local_device_ids(os.environ)
    _check_layout(coordinator, num_processes, process_id, cluster)
    assert num_processes is not None and process_id is not None  # checked above
    with _lock:
        if global_state.store is not None:
            raise RuntimeError("pjrt.distributed.initialize was already called in this "
                               "process; call pjrt.distributed.shutdown() first")
        generation = global_state.generation + 1
        member = _member_name()
        from ._distributed.runtime_job import is_address, join

        if isinstance(coordinator, str) and is_address(coordinator.strip()):
            store, client, service = join(
                coordinator.strip(), num_processes, process_id,
                bind_address=coordinator_bind_address, timeout=timeout,
                heartbeat_timeout=heartbeat_timeout, shutdown_timeout=shutdown_timeout,
                failure_key=_job_key(generation, "failed"))
            owned = False
        else:
            store, owned = _join_store(coordinator, generation, num_processes, process_id,
                                       member, timeout)
            client = service = None
        global_state.client = client
        global_state.service = service
        global_state.store = store
        global_state.owns_store = owned
        global_state.coordinator = coordinator
        global_state.num_processes = num_processes
        global_state.process_id = process_id
        global_state.local_device_ids = (tuple(int(i) for i in local_device_ids)
                                         if local_device_ids is not None else None)
        global_state.timeout = float(timeout)
        global_state.generation = generation
        global_state.client_counts = {}
        global_state.cluster = cluster.launcher if cluster is not None else None
        global_state.local_process_id = (cluster.local_process_id if cluster is not None
                                         else None)
        global_state.member = member


def _from_environment(coordinator, num_processes, process_id, local_device_ids, timeout):
    """The arguments of `initialize`, each from its ``PJRT_*`` variable when None."""
    if coordinator is None:
        coordinator = os.environ.get(COORDINATOR_ENV, "").strip() or None
    if num_processes is None:
        num_processes = _env_int(NUM_PROCESSES_ENV)
    if process_id is None:
        process_id = _env_int(PROCESS_ID_ENV)
    if local_device_ids is None:
        local_device_ids = _env_device_ids()
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV, "").strip() or DEFAULT_TIMEOUT_SECONDS)
    return coordinator, num_processes, process_id, local_device_ids, timeout


def _check_layout(coordinator, num_processes: int | None, process_id: int | None,
                  cluster: ClusterEnvironment | None) -> None:
    missing = [f"{what} (or {variable})" for what, value, variable in (
        ("coordinator", coordinator, COORDINATOR_ENV),
        ("num_processes", num_processes, NUM_PROCESSES_ENV),
        ("process_id", process_id, PROCESS_ID_ENV)) if value is None]
    if missing:
        raise ValueError(_missing_message(missing, cluster))
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, not {num_processes}")


def _join_store(coordinator, generation: int, num_processes: int, process_id: int,
                member: str, timeout: float):
    """The job on the key-value store ``coordinator`` names: open it, claim the id."""
    store, owned = open_store(coordinator)
    try:
        _join(store, generation, num_processes, process_id, member, timeout)
    except BaseException:
        if owned and hasattr(store, "close"):
            store.close()  # pyright: ignore[reportAttributeAccessIssue]  (hasattr above)
        raise
    return store, owned


def is_initialized() -> bool:
    """Whether [`initialize`][pjrt.distributed.initialize] was called (and [`shutdown`][pjrt.distributed.shutdown] not since)."""
    return global_state.store is not None


def shutdown(*, wait: bool = True) -> None:
    """Leave the job: wait (with ``wait``) until every process got here, so that none exits
    while another still reads the store, then close a store [`initialize`][pjrt.distributed.initialize] opened.

    Clients made while initialised keep working on what they hold; new clients are
    single-process. Does nothing when not initialised.

    Raises:
      TimeoutError: with ``wait``, another process did not reach shutdown in time (the
        state is reset all the same).
      RuntimeError: with ``wait``, a process of the job recorded a failure (a duplicate
        process id that joined late, say); the state is reset all the same.
    """
    with _lock:
        store = global_state.store
        if store is None:
            return
        generation = global_state.generation
        client, service = global_state.client, global_state.service
        if client is not None:
            from ._distributed.runtime_job import leave

            try:
                leave(client, service, wait)
            finally:
                global_state.client = global_state.service = None
                _reset_state()
            return
        try:
            # Marks this id as gone, so that a later job meeting the store is told it is stale.
            store.set(_job_key(generation, "left", global_state.process_id),
                      global_state.member.encode())
            if wait:
                _wait_for_all(store, generation, "left", global_state.num_processes,
                              global_state.timeout, "reach shutdown")
        finally:
            if global_state.owns_store and hasattr(store, "close"):
                store.close()  # pyright: ignore[reportAttributeAccessIssue]  (hasattr above)
            _reset_state()


def _reset_state() -> None:
    global_state.store = None
    global_state.owns_store = False
    global_state.num_processes = 1
    global_state.process_id = 0
    global_state.local_device_ids = None
    global_state.cluster = None
    global_state.local_process_id = None
    global_state.member = ""


def next_client_prefix(platform: str) -> str:
    """The key prefix of the next client of ``platform``: the k-th client a process makes
    pairs with the k-th of every other process, so each process must make its clients of a
    platform in the same order (as jax does)."""
    with _lock:
        count = global_state.client_counts.get(platform, 0)
        global_state.client_counts[platform] = count + 1
    return f"pjrt/{platform}/{count}/"

