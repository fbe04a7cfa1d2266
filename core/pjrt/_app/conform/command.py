"""``pjrt conform``: the command line over [`run`][pjrt._app.conform.run]."""
from __future__ import annotations

import argparse
import sys

from .catalog import load_checks
from .report import FAIL, PASS
from .runner import DEFAULT_TIMEOUT, run


def parse_option(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` as a create option: an int, a float, true/false, a comma-separated
    list of ints, or else a string.

    Raises:
      ValueError: there is no ``=`` or no name.
    """
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--option {text!r}: write it as NAME=VALUE, e.g. cpu_device_count=8")
    value = value.strip()
    if value.lower() in ("true", "false"):
        return name.strip(), value.lower() == "true"
    for convert in (int, float):
        try:
            return name.strip(), convert(value)
        except ValueError:
            pass
    if "," in value:
        try:
            return name.strip(), [int(part) for part in value.split(",")]
        except ValueError:
            pass
    return name.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``pjrt conform``."""
    parser.add_argument("plugin", metavar="PLUGIN", nargs="?",
                        help="the plugin's shared library (or the directory holding it), or "
                             "the platform name of an installed plugin package (cpu, cuda, "
                             "tpu...)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="NAME=VALUE",
                        help="a client create option (repeat for more), e.g. "
                             "cpu_device_count=8")
    parser.add_argument("--topology", default="", metavar="NAME",
                        help="the topology to compile for without a client (e.g. v5e:2x2); "
                             "the plugin's own by default")
    parser.add_argument("--check", action="append", default=[], metavar="NAME",
                        help="run only this check (repeat for more)")
    parser.add_argument("-k", action="append", default=[], metavar="PATTERN", dest="patterns",
                        help="run only checks whose names contain PATTERN (or match it as a "
                             "shell pattern, e.g. 'transfer.*')")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"how long one check may run before it fails as hung "
                             f"(default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")


def _progress_line(stream):
    if not stream.isatty():
        return None

    def show(index: int, total: int, name: str) -> None:
        stream.write(f"\r\033[K[{index}/{total}] {name}")
        stream.flush()
    return show


def main(args: argparse.Namespace) -> int:
    """Run ``pjrt conform`` with parsed ``args``; 0 when every check that applies passed.

    Raises:
      ValueError: a bad option, check name, pattern or plugin (a usage error).
    """
    if args.list:
        for name, check in load_checks().items():
            print(f"{name:<36} {check.doc}")
        return 0
    if not args.plugin:
        raise ValueError("name the plugin to check: a library path or a platform name")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, not {args.timeout:g}")
    options = dict(parse_option(text) for text in args.option)
    progress = _progress_line(sys.stderr)
    try:
        report = run(args.plugin, checks=args.check or None, patterns=args.patterns or None,
                     options=options, topology=args.topology, timeout=args.timeout, progress=progress)
    finally:
        if progress is not None:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
    # A terminal gets a table that fits it; a file, a pipe or -v gets every reason whole.
    full = bool(getattr(args, "verbose", False)) or not sys.stdout.isatty()
    print(report.format_table(full=full))
    if args.json:
        report.write_json(args.json)
    counts = report.counts()
    return 0 if report.passed and counts[PASS] + counts[FAIL] > 0 else 1
