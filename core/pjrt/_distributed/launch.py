"""``pjrt launch -n N script.py``: run a script as N processes of one job on this machine.

Each process gets the environment [`pjrt.distributed.initialize`][pjrt.distributed.initialize] reads
(``PJRT_COORDINATOR``, ``PJRT_NUM_PROCESSES``, ``PJRT_PROCESS_ID`` and, with
``devices_per_process``, ``PJRT_LOCAL_DEVICE_IDS``), so the script calls
``pjrt.distributed.initialize()`` with no arguments. Without a coordinator the job runs on
XLA's coordination service at ``127.0.0.1:<a free port>``, which process 0 starts.

When one process fails the others are stopped (they would otherwise wait at a barrier for it
until their timeout); the launcher's exit status is the first failing process's.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Mapping, Sequence

from ..distributed import (COORDINATOR_ENV, LOCAL_DEVICE_IDS_ENV, NUM_PROCESSES_ENV,
                          PROCESS_ID_ENV, TIMEOUT_ENV)

#: Seconds a stopped process gets to exit after SIGTERM before it is killed.
_STOP_GRACE_SECONDS = 5.0


def process_environment(base: Mapping[str, str], coordinator: str, num_processes: int, process_id: int,
                        devices_per_process: int | None = None,
                        timeout: float | None = None) -> dict[str, str]:
    """The environment of process ``process_id`` of a job (a copy of ``base``)."""
    environment = dict(base)
    environment[COORDINATOR_ENV] = coordinator
    environment[NUM_PROCESSES_ENV] = str(num_processes)
    environment[PROCESS_ID_ENV] = str(process_id)
    if devices_per_process:
        first = process_id * devices_per_process
        environment[LOCAL_DEVICE_IDS_ENV] = ",".join(
            str(i) for i in range(first, first + devices_per_process))
    if timeout is not None:
        environment[TIMEOUT_ENV] = str(timeout)
    return environment


def launch(script: str, arguments: Sequence[str] = (), *, num_processes: int,
           coordinator: str | None = None, devices_per_process: int | None = None,
           timeout: float | None = None, python: str | None = None) -> int:
    """Run ``python script arguments...`` as ``num_processes`` processes; returns 0 when all
    succeed, else the exit status of the first that failed.

    Raises:
      ValueError: ``num_processes`` is less than 1.
      FileNotFoundError: ``script`` does not exist.
    """
    if num_processes < 1:
        raise ValueError(f"-n must be at least 1, not {num_processes}")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"no script {script!r}")
    if coordinator is None:
        coordinator = f"127.0.0.1:{free_port()}"
    processes = []
    try:
        for process_id in range(num_processes):
            environment = process_environment(os.environ, coordinator, num_processes,
                                              process_id, devices_per_process, timeout)
            processes.append(subprocess.Popen([python or sys.executable, script, *arguments],
                                              env=environment))
        return _wait(processes)
    finally:
        _stop(processes)


def free_port() -> int:
    """A TCP port of 127.0.0.1 no process listens on now (the system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(processes: list) -> int:
    """Wait for every process; at the first failure stop the rest and return its status."""
    running = list(processes)
    while running:
        for process in list(running):
            status = process.poll()
            if status is None:
                continue
            running.remove(process)
            if status != 0:
                print(f"pjrt launch: process {processes.index(process)} exited with status "
                      f"{status}; stopping the others", file=sys.stderr)
                _stop(running)
                return status if status > 0 else 1
        time.sleep(0.05)
    return 0


def _stop(processes: list) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
