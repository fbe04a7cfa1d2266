"""Multi-process clients: the key-value stores, the callbacks a plugin calls, jobs of several
processes on one machine, and the refusal of plugins that cannot span processes.

The stores are driven the way a plugin drives them: from C threads of the multi-process test
plugin (``fault_plugin/multinode_plugin.c``), through the callbacks pjrt hands to
``PJRT_Client_Create``. Jobs of two and four processes run that plugin under ``pjrt launch``;
the real XLA CPU plugins must refuse to span processes.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pjrt
from pjrt import distributed
from pjrt._pjrt_cffi import ffi, lib
from pjrt.errors import ErrorCode
from pjrt._distributed.kv_callbacks import KeyValueCallbacks
from pjrt.kv_store import JaxDistributedStore, RedisStore, SQLiteStore, as_store, claim

from conftest import child_env

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"

def _load_fault_build():
    # Loaded by path rather than imported, so it works whatever pytest's import mode is.
    import importlib.util

    existing = sys.modules.get("fault_plugin_build")
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location("fault_plugin_build",
                                                  HERE / "fault_plugin" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fault_build = _load_fault_build()

REPORT_SIZE = 512


# -- engines -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A real redis-server on 127.0.0.1 and a free port, for this module."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    pytest.importorskip("redis", reason="the redis package is not installed (pip install redis)")
    import redis

    port = _free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--dir", str(directory)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("redis-server did not start")
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def jax_coordinator():
    """jax's coordination service and one client of it, in this process."""
    from jax._src.lib import _jax

    address = f"127.0.0.1:{_free_port()}"
    service = _jax.get_distributed_runtime_service(address, 1)
    client = _jax.get_distributed_runtime_client(address, 0, init_timeout=30)
    client.connect()
    yield client
    client.shutdown()
    service.shutdown()


@pytest.fixture(params=["sqlite", "redis", "jax"])
def store(request, tmp_path):
    """Each kind of store, fresh."""
    if request.param == "sqlite":
        made = SQLiteStore(tmp_path / "job.db")
        yield made
        made.close()
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, namespace=f"test-{tmp_path.name}")
        yield made
        made.close()
    else:
        yield JaxDistributedStore(request.getfixturevalue("jax_coordinator"))


@pytest.fixture(scope="module")
def multinode_library(tmp_path_factory) -> Path:
    return fault_build.build_multinode_plugin(tmp_path_factory.mktemp("multinode"))


@pytest.fixture(scope="module")
def driver(multinode_library):
    """The test plugin's functions that call a host's key-value callbacks from C threads."""
    driver = ctypes.CDLL(str(multinode_library))
    pointer = ctypes.c_void_p
    driver.multinode_kv_stress.argtypes = [pointer] * 6 + [
        ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
        ctypes.c_size_t]
    driver.multinode_kv_get.argtypes = [pointer, pointer, ctypes.c_char_p, ctypes.c_int,
                                        ctypes.c_char_p, ctypes.c_size_t]
    driver.multinode_kv_put.argtypes = [pointer, pointer, ctypes.c_char_p, ctypes.c_char_p]
    return driver


def _address(cdata) -> int:
    return int(ffi.cast("uintptr_t", cdata))


class _Callbacks:
    """The three callbacks pjrt gives a plugin, as addresses ctypes can pass."""

    def __init__(self, store, prefix="test/"):
        self.bound = KeyValueCallbacks(store, prefix)
        arg = _address(self.bound.user_arg)
        self.get = (_address(lib.pjrt_kv_python_get), arg)
        self.put = (_address(lib.pjrt_kv_python_put), arg)
        self.try_get = (_address(lib.pjrt_kv_python_try_get), arg)


def _c_get(driver, callbacks, key: str, timeout_ms: int) -> tuple[int, str]:
    out = ctypes.create_string_buffer(REPORT_SIZE)
    code = driver.multinode_kv_get(*callbacks.get, key.encode(), timeout_ms, out, REPORT_SIZE)
    return code, out.value.decode()


# -- the store contract, from Python ---------------------------------------------------------

def test_store_set_get_try_get(store):
    store.set("a/b", b"\x00value\xff")
    assert store.try_get("a/b") == b"\x00value\xff"
    assert store.get("a/b", 1.0) == b"\x00value\xff"
    store.set("a/b", b"newer")
    assert store.try_get("a/b") == b"newer"
    assert store.try_get("a/missing") is None


def test_store_claim_is_won_once(store):
    assert store.claim("owner", b"first") == b"first"
    assert store.claim("owner", b"second") == b"first"
    assert store.try_get("owner") == b"first"
    assert claim(store, "other", b"x") == b"x"


def test_store_claim_is_atomic_across_processes(tmp_path, request):
    # Four processes race for one key, started together: exactly one wins, and every one is
    # told the same winner.
    code = textwrap.dedent("""
        import os, sys, time
        from pjrt import distributed
        store, _ = distributed.open_store(sys.argv[1])
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.002)
        print(store.claim("the-key", sys.argv[3].encode()).decode())
    """)
    where = str(tmp_path / "race.db")
    distributed.open_store(where)[0].close()  # the file and its table exist before the race
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", code, where, str(go), f"racer {i}"],
                               stdout=subprocess.PIPE, text=True, env=child_env())
              for i in range(4)]
    time.sleep(1.0)
    go.touch()
    said = {p.communicate(timeout=60)[0].strip() for p in racers}
    assert len(said) == 1 and said.pop().startswith("racer ")


def test_store_blocking_get_times_out(store):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="missing"):
        store.get("missing", 0.3)
    assert 0.25 < time.monotonic() - started < 5


def test_store_blocking_get_waits_for_a_later_set(store):
    threading.Timer(0.3, store.set, ("later", b"here")).start()
    assert store.get("later", 10.0) == b"here"


# -- the store contract, from C threads through the callbacks --------------------------------

def test_callbacks_from_many_c_threads(store, driver):
    callbacks = _Callbacks(store)
    report = ctypes.create_string_buffer(REPORT_SIZE)
    failures = driver.multinode_kv_stress(*callbacks.get, *callbacks.put, *callbacks.try_get,
                                          b"stress", 8, 25, 5000, report, REPORT_SIZE)
    assert failures == 0, report.value.decode()
    # The values landed under the client's prefix, where another process would read them.
    assert store.try_get("test/stress/thread7/key24") == b"value 7.24"


def test_callback_try_get_of_a_missing_key_is_not_found(store, driver):
    # The stress run checks NOT_FOUND from each thread; here the blocking get's timeout.
    callbacks = _Callbacks(store)
    started = time.monotonic()
    code, message = _c_get(driver, callbacks, "never/set", 200)
    assert code == ErrorCode.DEADLINE_EXCEEDED, message
    assert "never/set" in message
    assert time.monotonic() - started < 5


def test_callback_put_then_blocking_get_in_c(store, driver):
    callbacks = _Callbacks(store)
    assert driver.multinode_kv_put(*callbacks.put, b"k", b"v1") == 0
    assert _c_get(driver, callbacks, "k", 1000) == (0, "v1")


class _BrokenStore:
    def set(self, key, value):
        raise OSError("disk on fire")

    def get(self, key, timeout):
        raise RuntimeError("store exploded")

    def try_get(self, key):
        raise KeyError(key)

    def barrier(self, *args):
        pass


def test_a_python_exception_never_crosses_into_the_plugin(driver):
    callbacks = _Callbacks(_BrokenStore())
    code, message = _c_get(driver, callbacks, "k", 100)
    assert code == ErrorCode.INTERNAL
    assert "RuntimeError: store exploded" in message
    assert driver.multinode_kv_put(*callbacks.put, b"k", b"v") == ErrorCode.INTERNAL
    report = ctypes.create_string_buffer(REPORT_SIZE)
    failures = driver.multinode_kv_stress(*callbacks.get, *callbacks.put, *callbacks.try_get,
                                          b"broken", 2, 1, 100, report, REPORT_SIZE)
    assert failures == 2 and "disk on fire" in report.value.decode()



class _InterruptedStore(_BrokenStore):
    def get(self, key, timeout):
        raise KeyboardInterrupt  # what Ctrl-C raises in a store's wait


def test_ctrl_c_in_a_callback_is_cancelled_and_kept_as_it_is(driver):
    callbacks = _Callbacks(_InterruptedStore())
    code, message = _c_get(driver, callbacks, "k", 100)
    # The plugin is told to give up, not that the store broke...
    assert code == ErrorCode.CANCELLED
    assert "key-value get interrupted: KeyboardInterrupt" in message
    # ...and the interrupt waits, with its type, for the caller to raise it.
    assert isinstance(callbacks.bound.interrupt, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        callbacks.bound.raise_interrupt()
    callbacks.bound.raise_interrupt()  # once


_SETTER = textwrap.dedent("""
    import sys, time
    from pjrt.kv_store import RedisStore, SQLiteStore
    kind, where, key = sys.argv[1:4]
    store = SQLiteStore(where) if kind == "sqlite" else RedisStore(where, namespace=sys.argv[4])
    time.sleep(0.5)
    store.set(key, b"from another process")
""")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_blocking_get_across_processes(kind, tmp_path, driver, request):
    if kind == "sqlite":
        where, namespace = str(tmp_path / "job.db"), ""
        store = SQLiteStore(where)
    else:
        where, namespace = request.getfixturevalue("redis_url"), f"across-{tmp_path.name}"
        store = RedisStore(where, namespace=namespace)
    callbacks = _Callbacks(store, prefix="job/")
    setter = subprocess.Popen([sys.executable, "-c", _SETTER, kind, where, "job/topology",
                               namespace])
    try:
        assert _c_get(driver, callbacks, "topology", 30000) == (0, "from another process")
    finally:
        assert setter.wait(30) == 0


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_barrier_across_processes(kind, tmp_path, request):
    if kind == "sqlite":
        where = str(tmp_path / "job.db")
    else:
        where = request.getfixturevalue("redis_url").replace("/0", "/1")
    code = ("import sys; from pjrt import distributed; s, _ = distributed.open_store(sys.argv[1]);"
            " s.barrier('b', int(sys.argv[2]), 3, 30); print('passed')")
    others = [subprocess.Popen([sys.executable, "-c", code, where, str(i)],
                               stdout=subprocess.PIPE, text=True) for i in (1, 2)]
    store, _ = distributed.open_store(where)
    store.barrier("b", 0, 3, 30)
    assert [p.communicate(timeout=30)[0].strip() for p in others] == ["passed", "passed"]
    with pytest.raises(TimeoutError, match="process 1 of 2 did not arrive"):
        store.barrier("lonely", 0, 2, 0.2)


# -- initialize / shutdown -----------------------------------------------------------------

#: Variables of the cluster launchers pjrt reads (and of a launcher's device binding), which a
#: test must not inherit from a machine that runs the suite under srun or mpirun.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "JOB_COMPLETION_INDEX",
                     "PJRT_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                     "ROCR_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")


@pytest.fixture
def clean_distributed(monkeypatch):
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) and name not in ("PJRT_PLATFORMS",
                                                               "PJRT_LOG_LEVEL"):
            monkeypatch.delenv(name)
    distributed.shutdown(wait=False)
    yield
    distributed.shutdown(wait=False)


def test_initialize_needs_its_arguments_or_the_environment(clean_distributed, tmp_path):
    with pytest.raises(ValueError, match="PJRT_COORDINATOR.*PJRT_NUM_PROCESSES.*"
                                         "PJRT_PROCESS_ID"):
        distributed.initialize()
    generation = distributed.global_state.generation + 1  # this process's next job
    with pytest.raises(ValueError, match=r"process id 2 \(pid \d+ .*\) is outside 0..1"):
        distributed.initialize(tmp_path / "x.db", 2, 2)
    # Recorded in the store, where the other processes of the job read why they must stop.
    failed = SQLiteStore(tmp_path / "x.db").try_get(f"pjrt/job/{generation}/failed")
    assert failed is not None and b"process id 2" in failed
    with pytest.raises(ValueError, match="names no store"):
        distributed.initialize("ftp://nowhere", 1, 0)
    assert not distributed.is_initialized()


def test_initialize_from_the_environment(clean_distributed, monkeypatch, tmp_path):
    monkeypatch.setenv(distributed.COORDINATOR_ENV, f"sqlite://{tmp_path}/job.db")
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "1")
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "0")
    monkeypatch.setenv(distributed.LOCAL_DEVICE_IDS_ENV, "3,4")
    distributed.initialize()
    assert distributed.is_initialized()
    state = distributed.global_state
    assert (state.num_processes, state.process_id, state.local_device_ids) == (1, 0, (3, 4))
    with pytest.raises(RuntimeError, match="already called"):
        distributed.initialize()
    distributed.shutdown()
    assert not distributed.is_initialized()


def test_initialize_times_out_without_the_other_processes(clean_distributed, tmp_path):
    with pytest.raises(TimeoutError, match="process 1 of 2"):
        distributed.initialize(tmp_path / "job.db", 2, 0, timeout=0.3)
    assert not distributed.is_initialized()


# -- cluster launchers ----------------------------------------------------------------------

SRUN_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[01-02]",
             "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3",
             "SLURM_LOCALID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PMIX_RANK": "3"}
HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


@pytest.mark.parametrize("environ", [SRUN_STEP, OPEN_MPI, HYDRA], ids=["srun", "openmpi",
                                                                       "hydra"])
def test_detect_cluster_reads_the_launchers_variables(environ):
    found = distributed.detect_cluster(environ=environ)
    assert (found.num_processes, found.process_id, found.local_process_id) == (4, 3, 1)
    assert found.launcher == ("slurm" if environ is SRUN_STEP else "mpi")
    # Two processes per host: each gets the device its local rank numbers, of those the
    # host's processes see...
    assert found.local_device_ids(environ) == (1,)
    assert found.local_device_ids({**environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == (1,)
    # ...unless it was given a device of its own (which the plugin numbers 0).
    assert found.local_device_ids({**environ, "CUDA_VISIBLE_DEVICES": "5"}) is None
    assert found.local_device_ids({**environ, "ROCR_VISIBLE_DEVICES": "GPU-5f3a"}) is None


def test_detect_cluster_srun_gpus_per_task_keeps_the_tasks_devices():
    environ = {**SRUN_STEP, "SLURM_GPUS_PER_TASK": "2", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert distributed.detect_cluster(environ=environ).local_device_ids(environ) is None


def test_detect_cluster_one_process_per_host_keeps_every_device():
    environ = {**SRUN_STEP, "SLURM_STEP_NUM_NODES": "4", "SLURM_LOCALID": "0"}
    assert distributed.detect_cluster(environ=environ).local_device_ids(environ) is None


def test_detect_cluster_ignores_an_sbatch_script_and_plain_processes():
    # In the batch script itself SLURM_PROCID is 0 and SLURM_NTASKS counts the allocation;
    # only srun's job step (SLURM_STEP_NODELIST) starts the processes.
    batch = {k: v for k, v in SRUN_STEP.items() if not k.startswith("SLURM_STEP")}
    assert distributed.detect_cluster(environ=batch) is None
    assert distributed.detect_cluster(environ={}) is None


def test_detect_cluster_kubernetes_indexed_job_gives_the_id_only():
    found = distributed.detect_cluster(environ={"JOB_COMPLETION_INDEX": "2"})
    assert (found.launcher, found.num_processes, found.process_id) == ("k8s", None, 2)


def test_detect_cluster_agreeing_launchers_are_one_answer():
    # srun --mpi=pmix exports PMIX_RANK beside SLURM's variables.
    found = distributed.detect_cluster(environ={**SRUN_STEP, "PMIX_RANK": "3"})
    assert (found.launcher, found.num_processes, found.process_id) == ("slurm", 4, 3)


def test_detect_cluster_refuses_launchers_that_disagree():
    # mpirun started from an interactive srun step: the step says 1 task, Open MPI 4.
    environ = {**SRUN_STEP, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1",
               "SLURM_PROCID": "0", "SLURM_LOCALID": "0", **OPEN_MPI}
    with pytest.raises(ValueError, match=r"disagree on the number of processes: "
                                         r"SLURM_STEP_NUM_TASKS=1 \(SLURM\), "
                                         r"OMPI_COMM_WORLD_SIZE=4 \(Open MPI\).*"
                                         r"PJRT_CLUSTER_DETECTION"):
        distributed.detect_cluster(environ=environ)
    # Naming the launcher settles it.
    chosen = distributed.detect_cluster("mpi", environ=environ)
    assert (chosen.num_processes, chosen.process_id) == (4, 3)
    chosen = distributed.detect_cluster(environ={**environ, "PJRT_CLUSTER_DETECTION": "slurm"})
    assert (chosen.num_processes, chosen.process_id) == (1, 0)


def test_detect_cluster_off_unknown_and_absent_launchers():
    assert distributed.detect_cluster("off", environ=SRUN_STEP) is None
    assert distributed.detect_cluster(environ={**SRUN_STEP,
                                               "PJRT_CLUSTER_DETECTION": "off"}) is None
    with pytest.raises(ValueError, match="'pbs' is not one of auto, off, slurm, mpi, k8s"):
        distributed.detect_cluster("pbs", environ=SRUN_STEP)
    with pytest.raises(ValueError, match="PJRT_CLUSTER_DETECTION=k8s, but none of its"):
        distributed.detect_cluster("k8s", environ=SRUN_STEP)
    with pytest.raises(ValueError, match="SLURM_PROCID='three' is not an integer"):
        distributed.detect_cluster(environ={**SRUN_STEP, "SLURM_PROCID": "three"})


def test_initialize_under_srun(clean_distributed, monkeypatch, tmp_path):
    for name, value in {**SRUN_STEP, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1",
                        "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(distributed.COORDINATOR_ENV, str(tmp_path / "job.db"))
    distributed.initialize(timeout=5)
    state = distributed.global_state
    assert (state.num_processes, state.process_id, state.cluster) == (1, 0, "slurm")
    assert (state.local_process_id, state.local_device_ids) == (0, None)


def test_initialize_the_operator_wins_over_the_launcher(clean_distributed, monkeypatch,
                                                        tmp_path):
    for name, value in SRUN_STEP.items():
        monkeypatch.setenv(name, value)  # 4 processes, this one 3: would wait for the others
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "1")
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "0")
    distributed.initialize(tmp_path / "job.db", timeout=5)
    state = distributed.global_state
    assert (state.num_processes, state.process_id, state.cluster) == (1, 0, None)
    distributed.shutdown()
    distributed.initialize(tmp_path / "other.db", 1, 0, timeout=5)  # arguments, likewise
    assert distributed.global_state.num_processes == 1
    distributed.shutdown()
    # A misspelt detection setting is an error even where nothing is detected.
    with pytest.raises(ValueError, match="'slrum' is not one of auto, off"):
        distributed.initialize(tmp_path / "third.db", 1, 0, cluster_detection_method="slrum")


def test_initialize_with_detection_off(clean_distributed, monkeypatch, tmp_path):
    for name, value in SRUN_STEP.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="needs num_processes .*process_id .*pjrt launch"):
        distributed.initialize(tmp_path / "job.db", cluster_detection_method="off")
    monkeypatch.setenv(distributed.CLUSTER_DETECTION_ENV, "off")
    with pytest.raises(ValueError, match="needs num_processes"):
        distributed.initialize(tmp_path / "job.db")
    assert not distributed.is_initialized()


def test_initialize_in_a_kubernetes_indexed_job(clean_distributed, monkeypatch, tmp_path):
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    with pytest.raises(ValueError, match=r"needs coordinator .*num_processes \(or "
                                         r"PJRT_NUM_PROCESSES\).*started by a Kubernetes "
                                         r"indexed Job \(JOB_COMPLETION_INDEX=0\)"):
        distributed.initialize()
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "1")  # the Job's completions
    distributed.initialize(tmp_path / "job.db", timeout=5)
    state = distributed.global_state
    assert (state.num_processes, state.process_id, state.cluster) == (1, 0, "k8s")


def test_initialize_refuses_launchers_that_disagree(clean_distributed, monkeypatch, tmp_path):
    for name, value in {**SRUN_STEP, "OMPI_COMM_WORLD_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"disagree on this process's id: SLURM_PROCID=3 "
                                         r"\(SLURM\), OMPI_COMM_WORLD_RANK=0 \(Open MPI\)"):
        distributed.initialize(tmp_path / "job.db")
    assert not distributed.is_initialized()


def test_initialize_again_with_the_same_store(clean_distributed, tmp_path):
    # A process may leave and join again: its second job has keys of its own.
    distributed.initialize(tmp_path / "job.db", 1, 0, timeout=5)
    distributed.shutdown()
    distributed.initialize(tmp_path / "job.db", 1, 0, timeout=5)
    assert distributed.is_initialized()



def test_a_recorded_failure_stops_a_clients_wait(clean_distributed, tmp_path):
    # What a process's client sees when another process is refused after this one joined: its
    # blocking get for the other's topology stops with the reason, not after its timeout.
    distributed.initialize(tmp_path / "job.db", 1, 0, timeout=5)
    view = distributed.job_store()
    failed_key = f"pjrt/job/{distributed.global_state.generation}/failed"
    threading.Timer(0.3, distributed.global_state.store.set,
                    (failed_key, b"process id 0 is claimed twice: ...")).start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped by another of its processes: process id 0 "
                                           "is claimed twice"):
        view.get("pjrt/cpu/0/topology", 30)
    assert time.monotonic() - started < 10
    with pytest.raises(RuntimeError, match="claimed twice"):
        distributed.check_job()
    with pytest.raises(RuntimeError, match="claimed twice"):
        distributed.shutdown()
    assert not distributed.is_initialized()

# -- clients --------------------------------------------------------------------------------

def test_cpu_plugins_refuse_to_span_processes(cpu_plugin, tmp_path):
    store = SQLiteStore(tmp_path / "job.db")
    with pytest.raises(pjrt.UnsupportedFeatureError,
                       match="node_id and num_nodes.*cannot join a job of 2 processes"):
        pjrt.make_c_api_client(cpu_plugin.name, {"node_id": 0, "num_nodes": 2},
                               distributed_client=store)


def test_cpu_plugin_in_a_job_of_one_process(cpu_plugin, clean_distributed, tmp_path):
    # One process needs no collectives: the client is made, with the callbacks kept alive.
    distributed.initialize(tmp_path / "job.db", 1, 0)
    with pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2}) as client:
        assert client.process_index() == 0
        assert [d.is_addressable for d in client.devices()] == [True, True]
        callbacks = client.handle.keep_alive
        assert isinstance(callbacks, KeyValueCallbacks)
        assert callbacks.prefix == f"pjrt/{cpu_plugin.name}/0/"
    with pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2}) as second:
        assert second.handle.keep_alive.prefix == f"pjrt/{cpu_plugin.name}/1/"


def test_jax_distributed_client_is_a_store(cpu_plugin, jax_coordinator):
    assert isinstance(as_store(jax_coordinator), JaxDistributedStore)
    with pjrt.make_c_api_client(cpu_plugin.name, {"node_id": 0, "num_nodes": 1},
                                distributed_client=jax_coordinator) as client:
        assert client.device_count() >= 1
    with pytest.raises(TypeError, match="KeyValueStore"):
        as_store(object())


def test_a_store_without_a_place_in_the_job_is_refused(cpu_plugin, clean_distributed, tmp_path):
    with pytest.raises(ValueError, match="node_id and num_nodes"):
        pjrt.make_c_api_client(cpu_plugin.name, distributed_client=SQLiteStore(tmp_path / "d"))


def test_transfer_servers_are_not_supported(cpu_plugin):
    with pytest.raises(NotImplementedError, match="transfer servers"):
        pjrt.make_c_api_client(cpu_plugin.name, transfer_server_factory=object())


# -- jobs of several processes ----------------------------------------------------------------

def _run_job(num_processes: int, library: Path, output: Path, coordinator=None,
             mode="multinode") -> list[dict]:
    command = [sys.executable, "-m", "pjrt", "launch", "-n", str(num_processes),
               "--timeout", "60"]
    if coordinator:
        command += ["--coordinator", coordinator]
    command += [str(WORKER), mode, str(library), str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((output / f"{i}.json").read_text()) for i in range(num_processes)]


def _check_job(results: list[dict], num_processes: int) -> None:
    local = 2
    rows = num_processes * 2
    global_value = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    for process_id, result in enumerate(results):
        assert result["process_id"] == result["client_process_index"] == process_id
        assert result["registry_process_count"] == num_processes
        # One global device list, the same in every process; addressable only at home.
        assert result["devices"] == [[i, i // local, i // local == process_id]
                                     for i in range(num_processes * local)]
        assert result["local_devices"] == [process_id * local + i for i in range(local)]
        assert result["global_shape"] == [rows, 4]
        assert result["array_devices"] == list(range(num_processes * local))
        assert result["fully_addressable"] is (num_processes == 1)
        assert "other processes" in result["read_error"]
        for name in ("from_local", "from_callback", "from_singles"):
            shards = result[name]
            assert [s["device"] for s in shards] == result["local_devices"]
            for column, shard in enumerate(shards):
                (r0, r1), (c0, c1) = shard["index"]
                assert (r0, r1) == (2 * process_id, 2 * process_id + 2)
                assert (c0, c1) == (2 * column, 2 * column + 2)
                np.testing.assert_array_equal(shard["value"], global_value[r0:r1, c0:c1])
        for shard in result["replicated"]:
            np.testing.assert_array_equal(shard["value"], global_value)
        assert len(result["singles_still_usable"]) == local


@pytest.mark.parametrize("num_processes", [2, 4])
def test_job_on_one_machine(num_processes, multinode_library, tmp_path):
    results = _run_job(num_processes, multinode_library, tmp_path)
    _check_job(results, num_processes)


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_job_on_the_coordination_service_in_jax_form(multinode_library, tmp_path):
    """initialize("127.0.0.1:PORT", n, i): process 0 starts XLA's coordination service, the
    plugin's key-value callbacks go through it; the same address serves the next job."""
    pytest.importorskip("grpc", reason="pjrt[distributed] (grpcio) is not installed")
    address = _free_address()
    for attempt in ("first", "again"):
        output = tmp_path / attempt
        output.mkdir()
        _check_job(_run_job(2, multinode_library, output, coordinator=address), 2)
    assert not list(tmp_path.glob("127.0.0.1*")) and not list(Path.cwd().glob("127.0.0.1*"))


def test_an_address_is_never_a_file_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="host:port"):
        distributed.open_store("job")
    assert not list(tmp_path.iterdir())
    # A path with a directory, or one that exists, is still a SQLite file.
    store, owned = distributed.open_store("./job.db")
    assert isinstance(store, SQLiteStore) and owned
    store.close()
    store, _ = distributed.open_store("job.db")
    assert isinstance(store, SQLiteStore)
    store.close()


def test_sizes_that_differ_are_refused_on_the_coordination_service(multinode_library,
                                                                    tmp_path):
    pytest.importorskip("grpc", reason="pjrt[distributed] (grpcio) is not installed")
    started = time.monotonic()
    outcomes = _run_workers(_ids((2, 0), (3, 1)), multinode_library, tmp_path, _free_address())
    for status, stderr in outcomes:
        assert status != 0, stderr
        assert re.search(r"the processes disagree on the size of the job \(process 0: 2, "
                         r"process 1: 3\)", stderr), stderr[-3000:]
    assert time.monotonic() - started < 25


def test_job_over_redis(multinode_library, tmp_path, redis_url):
    results = _run_job(2, multinode_library, tmp_path, coordinator=redis_url.replace("/0", "/2"))
    _check_job(results, 2)


def _run_workers(environments: list[dict], library: Path, output: Path, coordinator: str,
                 timeout: float = 30) -> list[tuple[int, str]]:
    """Run one worker per entry of ``environments`` (each adds its variables to a clean
    environment), all joining the job at the same moment; their exit statuses and stderr.

    Unlike `pjrt launch`, nothing stops the others when one fails: each must stop by itself.
    """
    start_line = output / "start-line"
    workers = []
    for extra in environments:
        env = child_env(drop=LAUNCHER_PREFIXES, PJRT_COORDINATOR=coordinator,
                        PJRT_DISTRIBUTED_TIMEOUT=str(timeout), PJRT_PLATFORMS="cpu",
                        PJRT_TEST_START_LINE=str(start_line), **extra)
        workers.append(subprocess.Popen([sys.executable, str(WORKER), "multinode",
                                         str(library), str(output)], env=env, text=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{start_line}.ready.{w.pid}").exists() or w.poll() is not None
                      for w in workers):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        start_line.touch()
        return [(w.wait(timeout + 60), w.stderr.read()) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def _ids(*layout: tuple[int, int]) -> list[dict]:
    return [{"PJRT_NUM_PROCESSES": str(n), "PJRT_PROCESS_ID": str(i)} for n, i in layout]


def _srun_tasks(count: int) -> list[dict]:
    """What srun -n COUNT on one node gives each task."""
    return [{"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node01",
             "SLURM_NTASKS": str(count), "SLURM_STEP_NUM_TASKS": str(count),
             "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "SLURM_STEP_NUM_NODES": "1",
             "SLURM_NNODES": "1"} for i in range(count)]


def _mpirun_ranks(count: int) -> list[dict]:
    """What Open MPI's mpirun -n COUNT on one node gives each rank."""
    return [{"OMPI_COMM_WORLD_SIZE": str(count), "OMPI_COMM_WORLD_RANK": str(i),
             "OMPI_COMM_WORLD_LOCAL_RANK": str(i), "OMPI_COMM_WORLD_LOCAL_SIZE": str(count),
             "PMIX_RANK": str(i)} for i in range(count)]


@pytest.mark.parametrize("launcher", ["srun-sqlite", "mpirun-redis"])
def test_job_laid_out_by_a_cluster_launcher(launcher, multinode_library, tmp_path, request):
    # No PJRT_NUM_PROCESSES or PJRT_PROCESS_ID: each process reads the launcher's variables.
    if launcher == "srun-sqlite":
        environments, coordinator = _srun_tasks(2), f"sqlite://{tmp_path}/job.db"
    else:
        environments = _mpirun_ranks(2)
        coordinator = request.getfixturevalue("redis_url").replace("/0", "/3")
    outcomes = _run_workers(environments, multinode_library, tmp_path, coordinator)
    assert [status for status, _ in outcomes] == [0, 0], outcomes
    _check_job([json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)], 2)


@pytest.mark.parametrize("layout, refusal", [
    ([(2, 0), (2, 0), (2, 1)], r"process id 0 is claimed twice: by pid \d+ on .* and by pid "),
    ([(2, 0), (2, 2)], r"process id 2 \(pid \d+ on .*\) is outside 0..1 for a job of 2"),
    ([(2, 0), (2, 1), (3, 2)], r"the processes disagree on the size of the job"),
], ids=["duplicate", "out-of-range", "sizes-differ"])
def test_a_bad_layout_is_refused_in_every_process(layout, refusal, multinode_library,
                                                  tmp_path):
    started = time.monotonic()
    outcomes = _run_workers(_ids(*layout), multinode_library, tmp_path,
                            f"sqlite://{tmp_path}/job.db")
    # Each stops with the reason, at whichever step it had reached when the refused process
    # wrote it (joining, creating its client, or leaving), and none waits out its timeout.
    for status, stderr in outcomes:
        assert status != 0, stderr
        assert re.search(refusal, stderr), stderr[-3000:]
    assert time.monotonic() - started < 25


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_store_left_by_an_earlier_job_is_refused(kind, multinode_library, tmp_path, request):
    if kind == "sqlite":
        coordinator = f"sqlite://{tmp_path}/job.db"
    else:
        coordinator = request.getfixturevalue("redis_url").replace("/0", "/4")
    first = tmp_path / "first"
    first.mkdir()
    _check_job(_run_job(2, multinode_library, first, coordinator=coordinator), 2)
    # Process 0 of a new job, alone: refused at once, where it used to pass the join on the
    # finished job's keys and build that job's 4-device client.
    alone = tmp_path / "alone"
    alone.mkdir()
    started = time.monotonic()
    (outcome,) = _run_workers(_ids((2, 0)), multinode_library, alone, coordinator)
    assert outcome[0] != 0 and not list(alone.glob("*.json"))
    assert re.search(r"the store holds a job that has finished: process 0 \(pid \d+ .*\) "
                     r"joined it and left\. A store serves one job.*new store", outcome[1]), \
        outcome[1][-3000:]
    assert time.monotonic() - started < 20
    if kind == "redis":
        return  # the store's claim works alike; one whole new job (below) is enough
    # A whole new job: every process refused.
    again = tmp_path / "again"
    again.mkdir()
    for status, stderr in _run_workers(_ids((2, 0), (2, 1)), multinode_library, again,
                                       coordinator):
        assert status != 0 and "a job that has finished" in stderr, stderr[-3000:]
    assert not list(again.glob("*.json"))


def test_launch_stops_the_job_when_a_process_fails(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from pjrt import distributed
        if os.environ["PJRT_PROCESS_ID"] == "1":
            sys.exit(3)
        distributed.initialize()  # waits for process 1, which never comes
    """))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pjrt", "launch", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert "process 1 exited with status 3" in done.stderr
    assert time.monotonic() - started < 60


# -- GPUs -----------------------------------------------------------------------------------

def _gpu_count() -> int:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return done.stdout.count("GPU ") if done.returncode == 0 else 0


@pytest.mark.gpu
def test_two_process_all_reduce_on_nvidia_gpus(tmp_path):
    if _gpu_count() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per process) and nvidia-smi")
    pytest.importorskip("pjrt_cuda", reason="the pjrt-cuda package is not installed")
    command = [sys.executable, "-m", "pjrt", "launch", "-n", "2", "--devices-per-process", "1",
               "--timeout", "120", str(WORKER), "cuda-allreduce", "-", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_PLATFORMS": "cuda"})
    assert done.returncode == 0, done.stderr[-3000:]
    for process_id in range(2):
        result = json.loads((tmp_path / f"{process_id}.json").read_text())
        (shard,) = result["sum"]
        np.testing.assert_array_equal(shard["value"], [[3.0, 3.0, 3.0, 3.0]])


_WAITING_PROCESS = """
import sys, time
import pjrt
from pjrt import distributed
process_id, library, coordinator = int(sys.argv[1]), sys.argv[2], sys.argv[3]
distributed.initialize(coordinator, num_processes=2, process_id=process_id)
plugin = pjrt.load_pjrt_plugin_dynamically("multinode", library)
plugin.option_types.update({"node_id": int, "num_nodes": int, "local_device_count": int})
if process_id == 1:
    print("joined", flush=True)
    time.sleep(60)  # never makes a client: process 0 waits for its topology
    sys.exit(0)
print("creating", flush=True)
try:
    pjrt.make_c_api_client("multinode", {"local_device_count": 2})
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
except BaseException as error:
    print(f"{type(error).__name__}: {error}", flush=True)
"""


_LOSING_PROCESS = """
import os, signal, sys, time
import pjrt
from pjrt import distributed
process_id, library, coordinator = int(sys.argv[1]), sys.argv[2], sys.argv[3]
distributed.initialize(coordinator, num_processes=2, process_id=process_id, heartbeat_timeout=2)
plugin = pjrt.load_pjrt_plugin_dynamically("multinode", library)
plugin.option_types.update({"node_id": int, "num_nodes": int, "local_device_count": int})
if process_id == 1:
    print("joined", flush=True)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)  # dies before making its client
print("creating", flush=True)
start = time.monotonic()
try:
    pjrt.make_c_api_client("multinode", {"local_device_count": 2})
except BaseException as error:
    print(f"{time.monotonic() - start:.1f} {type(error).__name__}: {error}", flush=True)
"""


def test_a_lost_process_ends_client_creation_in_the_others(multinode_library):
    """Process 1 dies while process 0's plugin waits for its topology: the wait ends within
    the heartbeat timeout with an error naming process 1, and process 0 lives on."""
    pytest.importorskip("grpc", reason="pjrt[distributed] (grpcio) is not installed")
    coordinator = _free_address()
    env = child_env(drop=("PJRT_",))
    processes = [subprocess.Popen(
        [sys.executable, "-c", _LOSING_PROCESS, str(i), str(multinode_library), coordinator],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    try:
        waiting, dying = processes
        assert waiting.stdout.readline().strip() == "creating", waiting.stderr.read()
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err[-2000:]
        seconds, _, message = out.strip().partition(" ")
        assert float(seconds) < 15, out
        assert "process 1" in message and "heartbeat" in message, (out, err[-2000:])
        assert dying.wait(10) == -signal.SIGKILL
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


@pytest.mark.parametrize("kind", ["sqlite", "service"])
def test_ctrl_c_while_a_client_waits_for_the_other_processes(kind, multinode_library, tmp_path):
    """Ctrl-C while the plugin waits in a key-value get during client creation reaches the
    caller as a KeyboardInterrupt (it was the plugin's INTERNAL error), within seconds."""
    coordinator = str(tmp_path / "job.db") if kind == "sqlite" else _free_address()
    env = child_env(drop=("PJRT_",))
    processes = [subprocess.Popen(
        [sys.executable, "-c", _WAITING_PROCESS, str(i), str(multinode_library), coordinator],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    try:
        waiting, other = processes
        assert waiting.stdout.readline().strip() == "creating", waiting.stderr.read()
        time.sleep(1.0)  # inside PJRT_Client_Create, waiting for process 1's topology
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=20)
        assert out.strip() == "KeyboardInterrupt", (out, err[-2000:])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()
