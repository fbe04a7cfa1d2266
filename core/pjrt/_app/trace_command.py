"""``pjrt trace -- python PROGRAM.py [ARGS...]``: a Python program run with a trace from its
start to its end (``pjrt.profiler``), and where the trace went.

The program runs in this interpreter, as ``python -m cProfile`` runs one: as ``__main__``,
with ``sys.argv`` and ``sys.path[0]`` as ``python PROGRAM.py ARGS`` gives them (or ``-m
MODULE``). The trace starts before its first line and stops when it ends, by returning, by
``sys.exit`` or by an exception (shown as Python shows it); the command exits with the
program's status. Work done after that (``atexit`` handlers, threads still running) is not in
the trace, and a program that ends itself with ``os._exit`` leaves none. A program that stops
the trace itself (``pjrt.profiler.stop_trace()``) ends it there; the command says so, and
still exits with the program's status.
"""
from __future__ import annotations

import os
import re
import runpy
import sys
import traceback
from typing import Sequence

from .. import profiler

#: The first word of a command that names a Python interpreter (``python``, ``python3.12``).
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?$")

USAGE_TEXT = "pjrt trace [--log-dir DIR] -- python PROGRAM.py [ARGS...] (or python -m MODULE)"


class UsageError(ValueError):
    """The command line does not say which program to run."""


def parse(command: Sequence[str]) -> tuple[str, str, list[str]]:
    """``("script", path, args)`` or ``("module", name, args)`` from the words after ``--``.

    Raises:
      UsageError: no program, an interpreter option other than ``-m``, or a command that is
        not a Python program.
    """
    words = list(command)
    if words[:1] == ["--"]:
        words = words[1:]
    if words and _PYTHON.match(os.path.basename(words[0])):
        words = words[1:]
    if not words:
        raise UsageError(f"say which program to run: {USAGE_TEXT}")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError(f"-m needs a module name: {USAGE_TEXT}")
        return "module", words[1], words[2:]
    if words[0].startswith("-"):
        raise UsageError(f"pjrt trace takes a program and its arguments, not the interpreter "
                         f"option {words[0]!r}: {USAGE_TEXT}")
    if not os.path.isfile(words[0]):
        hint = ("" if words[0].endswith(".py") else
                "; pjrt trace runs Python programs, in its own interpreter")
        raise UsageError(f"{words[0]!r} is not a file{hint}: {USAGE_TEXT}")
    return "script", words[0], words[1:]


def run(command: Sequence[str], log_dir: str, *, perfetto: bool = False) -> int:
    """Run the program ``command`` names with a trace written under ``log_dir``; its exit
    status. Where the trace went is printed on stderr.

    Raises:
      UsageError: see `parse`.
    """
    kind, target, arguments = parse(command)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    if kind == "script":
        sys.argv = [target, *arguments]
        sys.path[0:0] = [os.path.dirname(os.path.abspath(target))]
    else:
        sys.argv = [target, *arguments]  # runpy sets argv[0] to the module's file
        sys.path[0:0] = [os.getcwd()]
    status = 0
    profiler.start_trace(log_dir, create_perfetto_trace=perfetto)
    try:
        if kind == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:  # noqa: BLE001 - shown as Python shows a program's error
        traceback.print_exc()
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if profiler.is_tracing():
            _report(profiler.stop_trace())
        else:  # the program ended the trace itself: its call wrote the files
            print("pjrt trace: the program stopped the trace itself (pjrt.profiler.stop_trace"
                  "()), which wrote its files and returned where", file=sys.stderr, flush=True)
    return status


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # as Python prints sys.exit("message")
    return 1


def _report(files) -> None:
    lines = [f"pjrt trace: the trace is in {files.directory}",
             f"  pjrt's events: {files.trace} (open it at https://ui.perfetto.dev)"]
    if files.xplane:
        lines.append(f"  the plugins' device activity: {files.xplane} (TensorBoard, xprof)")
    if files.perfetto:
        lines.append(f"  for Perfetto: {files.perfetto}")
    lines += [f"  note: {note}" for note in files.notes]
    print("\n".join(lines), file=sys.stderr, flush=True)
