"""The worker process: runs checks in order and reports each over a pipe before the next.

Started by `pjrt._app.conform.runner` as ``python -m pjrt._app.conform._worker --report-fd N
--parent-pid P`` with the job as JSON on stdin; it ends when the runner's process does (a killed
runner leaves no worker behind, even one hung in the plugin). Each check is announced (``{"start": name}``) before it runs and
its result sent after, so that when the plugin kills this process the runner knows which
check did it. The plugin's own output goes wherever the runner sent stdout and stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from ..._compile.parent_watch import end_with_parent
from ...errors import XlaRuntimeError
from ._context import Context, refused
from ._registry import Skip, blocked_by
from .catalog import load_checks
from .report import FAIL, PASS, SKIP


def _describe_failure(error: BaseException) -> str:
    if isinstance(error, XlaRuntimeError):
        return refused(error)
    if isinstance(error, AssertionError):
        return str(error) or "assertion failed"
    return f"{type(error).__name__}: {error}"


def run_one(check, context: Context, failed: set[str]) -> dict:
    """Run ``check`` and return its result as a dict (never raises, short of the plugin
    killing the process)."""
    blocker = blocked_by(check.name, failed)
    if blocker is not None:
        return {"name": check.name, "status": SKIP, "detail": f"needs {blocker}, which failed",
                "seconds": 0.0}
    start = time.perf_counter()
    try:
        detail = check.run(context)
        status = PASS
    except Skip as skip:
        status, detail = SKIP, str(skip)
    except Exception as error:  # noqa: BLE001 - any error is the check's failure
        status, detail = FAIL, _describe_failure(error)
        if os.environ.get("PJRT_CONFORM_TRACEBACKS"):
            traceback.print_exc()
    seconds = time.perf_counter() - start
    if status == FAIL:
        failed.add(check.name)
    return {"name": check.name, "status": status, "detail": detail or "", "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pjrt._app.conform._worker")
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        # The runner's thread that started this worker kills it before going on.
        end_with_parent(args.parent_pid, thread_bound=True)
    job = json.load(sys.stdin)
    report = os.fdopen(args.report_fd, "w", buffering=1)

    def send(message: dict) -> None:
        report.write(json.dumps(message) + "\n")
        report.flush()

    checks = load_checks()
    context = Context(job["library"], job["name"], job["options"], job["topology"])
    failed = set(job["failed"])
    for name in job["checks"]:
        send({"start": name})
        send({"result": run_one(checks[name], context, failed), "info": context.info})
    send({"done": True})
    report.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a plugin's destructors running at exit are not under test,
    # and one that hangs there would be charged to no check.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
