"""The ``pjrt`` command (also ``python -m pjrt``): what is installed, running a StableHLO
file, the demo, and the conformance checks for plugin vendors.

``pjrt info``
    The pjrt version and PJRT C API version, the versions of Python, numpy, ml_dtypes, cffi
    and each plugin package (with the vendor wheels they need), the plugins discovery found
    and where from, the backends that came up (or why not, wrapped, never cut), their
    devices, memories and memory statistics. ``-v`` adds what each plugin printed while it
    was brought up (kept back by default; see [`set_log_level`][pjrt.plugin.set_log_level]).
    ``--platform P`` looks at one platform only (the others are not loaded); ``--json`` prints the same facts
    for programs to read.

``pjrt run PROGRAM.mlir [--input a.npy ...]``
    Compiles a StableHLO program (text, or bytecode) on one device, feeds it arrays from
    ``.npy`` files, saves the outputs as ``out0.npy``, ``out1.npy``, ... and prints a preview
    of each with the compile and run times.

``pjrt demo``
    A tour on XLA's CPU plugin: a client of 8 devices, a bundled program run on one device
    and an SPMD program sharded over all eight, checked against numpy, with timings.

``pjrt conform PLUGIN``
    Checks, one named check at a time and in worker processes, whether a PJRT plugin (a
    library, a directory, or an installed platform's name) does what a host needs; each check
    passes, fails or is skipped, and a plugin that crashes or hangs fails only the check it
    was running. ``--check NAME`` and ``-k PATTERN`` select checks, ``-o NAME=VALUE`` passes
    create options, ``--json FILE`` writes the report (see the vendors' guide, "Conformance").

``pjrt launch -n N SCRIPT.py [ARGS...]``
    Runs a script as N processes of one job on this machine (see `pjrt._distributed.launch`); each
    calls ``pjrt.distributed.initialize()`` with no arguments.

``pjrt trace [--log-dir DIR] -- python PROGRAM.py [ARGS...]``
    Runs a Python program (or ``python -m MODULE``) in this interpreter with a trace
    (``pjrt.profiler``) from its start to its end, written under DIR (``pjrt-trace`` unless
    given), prints where the files went, and exits with the program's status.

Exit status: 0 on success; 1 when pjrt or a plugin failed (a program that does not compile,
a backend that did not come up); 2 when the command line or its files are wrong (a missing
file, the wrong number of inputs, an input of the wrong shape or dtype). Errors are one line
on stderr; ``--verbose`` adds the traceback and the plugin's full message.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import platform as platform_module
import re
import sys
import textwrap
import time
import traceback
from typing import Any, Sequence

import numpy as np

from .._registry import discovery
from .._version import __version__
from .. import registry as registry_module
from .._capi.api import HEADER_VERSION

#: Exit statuses.
OK, FAILED, USAGE = 0, 1, 2

#: The first bytes of MLIR bytecode.
_BYTECODE_MAGIC = b"ML\xefR"

#: How long a reason may be on one line of ``pjrt info`` before it is cut.
_REASON_WIDTH = 110


class CommandError(Exception):
    """A failure the command reports as one line, with the exit status it maps to."""

    def __init__(self, message: str, status: int = FAILED, detail: str | None = None):
        super().__init__(message)
        self.status = status
        #: The full text behind a shortened message, shown with --verbose.
        self.detail = detail


# -- small helpers --------------------------------------------------------------------------

def _version_text(version: Sequence[int] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def _first_line(text: object) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return " ".join(line.split())
    return ""


def shorten(text: str, width: int = _REASON_WIDTH) -> str:
    """One line of ``text``: its first non-empty line, cut at ``width`` with an ellipsis.

    A plugin's message often carries a long second paragraph (a loader's search path, an
    MLIR diagnostic); the first line says what went wrong.
    """
    line = _first_line(text)
    more = line != " ".join(str(text).split())
    if len(line) > width:
        line, more = line[:width - 3].rstrip(), True
    return line + " ..." if more else line


def _distribution_of_module(module: str | None) -> tuple[str, str] | None:
    """``(distribution, version)`` that installed ``module``, when the metadata says."""
    if not module:
        return None
    from importlib import metadata

    top = module.split(".")[0]
    names = metadata.packages_distributions().get(top, [])
    # A namespace package (jax_plugins) is shared; find the one that owns this module.
    relative = module.replace(".", "/")
    for name in dict.fromkeys(names):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if len(set(names)) == 1 or any(str(f).startswith(relative) for f in dist.files or ()):
            return dist.metadata["Name"], dist.version
    return None


def _distribution_of_file(path: str | None) -> tuple[str, str] | None:
    """``(distribution, version)`` that installed the file at ``path``, if it is installed."""
    if not path:
        return None
    real = os.path.realpath(path)
    for entry in sys.path:
        root = os.path.realpath(entry or os.curdir)
        if os.path.isdir(root) and real.startswith(root + os.sep):
            relative = os.path.relpath(real, root)
            module = os.path.splitext(relative)[0].replace(os.sep, ".")
            found = _distribution_of_module(module)
            if found:
                return found
    return None


# -- pjrt info ------------------------------------------------------------------------------

#: The distributions whose versions ``pjrt info`` always reports: the core and what it needs.
_CORE_DISTRIBUTIONS = ("pjrt", "numpy", "ml_dtypes", "cffi")


def _installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _requirement_names(distribution: str) -> list[str]:
    """The names of the distributions ``distribution`` requires (markers ignored), and those
    its extras require that are installed: pjrt-cuda's vendor wheel comes with an extra
    (``pjrt-cuda[cuda13]``), and an extra nobody installed is not what is running."""
    from importlib import metadata

    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in requires:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if not match:
            continue
        if "extra ==" in requirement and _installed_version(match.group(1)) is None:
            continue
        names.append(match.group(1))
    return names


def gather_versions(plugin_packages: Sequence[str]) -> dict[str, str | None]:
    """Python's version and each relevant distribution's: the core, its dependencies, the
    plugin packages and what each of them requires (the vendors' wheels). None: not found."""
    versions: dict[str, str | None] = {
        "python": f"{platform_module.python_version()} ({platform_module.python_implementation()}"
                  f", {platform_module.system()} {platform_module.machine()})",
    }
    names: list[str] = list(_CORE_DISTRIBUTIONS)
    for package in plugin_packages:
        names.append(package)
        names.extend(_requirement_names(package))
    for name in dict.fromkeys(names):
        if name not in versions:
            versions[name] = _installed_version(name)
    if versions.get("pjrt") is None:
        versions["pjrt"] = f"{__version__} (not installed: from {os.path.dirname(os.path.dirname(__file__))})"
    return versions


def _where_from(registration, records_by_module: dict) -> str:
    """``entry point``, ``namespace``, ``env var`` or ``api``, with the module or file."""
    source = registration.source
    if source.startswith(discovery.ENV_VARIABLE):
        config = source[len(discovery.ENV_VARIABLE):].strip(" ()")
        return f"env var {discovery.ENV_VARIABLE}" + (f" ({config})" if config else "")
    if registration.module:
        record = records_by_module.get(registration.module)
        jax = " (JAX plugin)" if record is not None and "JAX plugin" in record.source else ""
        return f"{source} {registration.module}{jax}"
    return source


def gather_info(reg: registry_module.BackendRegistry, platform: str | None = None) -> dict:
    """Everything ``pjrt info`` reports, as plain data (what ``--json`` prints).

    Brings the backends up (only ``platform`` when given and nothing is up yet); a failure to
    do so is reported in ``"error"`` rather than raised.
    """
    info: dict[str, Any] = {
        "pjrt_version": __version__,
        "pjrt_c_api_version": _version_text(HEADER_VERSION),
        "platform": platform,
        "plugins": [],
        "discovery": [],
        "backends": [],
        "versions": {},
        "logs": {},
        "error": None,
    }
    if platform is not None and not reg.backends_are_initialized():
        # Selecting first means the other plugins are never loaded: a broken one cannot
        # get in the way of looking at this one.
        reg.set_platforms([platform])
    try:
        registrations = reg.registrations()
    except (ValueError, OSError) as error:  # a broken PJRT_NAMES_AND_LIBRARY_PATHS config
        info["error"] = f"{type(error).__name__}: {error}"
        return info
    records_by_module = {r.name: r for r in reg.discovery_records}

    try:
        backends = reg.backends()
        errors = reg.backend_errors()
        default = reg.default_backend_name()
    except Exception as error:  # noqa: BLE001 - reported, with what could be found
        info["error"] = str(error)
        backends, default = {}, None
        errors = reg.backend_errors()  # answers even now, with each backend's reason

    wanted = None if platform is None else set(registry_module.expand_platform_alias(platform))
    for name, registration in registrations.items():
        if wanted is not None and name not in wanted:
            continue
        plugin = registration.plugin
        package = (_distribution_of_module(registration.module)
                   or _distribution_of_file(plugin.library_path if plugin else None))
        info["plugins"].append({
            "name": name,
            "from": _where_from(registration, records_by_module),
            "module": registration.module,
            "library_path": plugin.library_path if plugin else None,
            "plugin_api_version": _version_text(plugin.api_version) if plugin else None,
            "package": package[0] if package else None,
            "package_version": package[1] if package else None,
            "priority": registration.priority,
        })
    for record in reg.discovery_records:
        info["discovery"].append(dataclasses.asdict(record))
    info["versions"] = gather_versions([p["package"] for p in info["plugins"] if p["package"]])
    info["logs"] = {name: text for name, text in reg.plugin_output.as_dict().items()
                    if wanted is None or name in wanted}

    for name, client in backends.items():
        if wanted is not None and name not in wanted:
            continue
        devices = []
        for device in client.devices():
            devices.append({
                "id": device.id,
                "kind": device.device_kind,
                "memories": [m.kind for m in device.addressable_memories()],
                "default_memory": device.default_memory().kind,
                "memory_stats": device.memory_stats(),
            })
        info["backends"].append({
            "name": name,
            "status": "up",
            "platform": client.platform,
            "platform_version": client.platform_version,
            "plugin_api_version": _version_text(client.plugin.api_version),
            "device_count": client.device_count(),
            "default": name == default,
            "devices": devices,
            "memory_stats_clear": _clear_support(client),
        })
    for name, reason in errors.items():
        if wanted is None or name in wanted:
            info["backends"].append({"name": name, "status": "failed", "reason": reason})
    return info


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def _clear_support(client) -> str:
    """Whether the backend's devices can reset their memory statistics: "supported", or
    "not supported" and why. Tried on the first device of the client info made for itself,
    which has done nothing yet, so the reset changes nothing anyone reads."""
    from ..errors import UnsupportedFeatureError, XlaRuntimeError

    device = client.devices()[0]
    try:
        device.clear_memory_stats()
    except UnsupportedFeatureError:
        api = client.plugin.api
        if not api.has("PJRT_Device_ClearMemoryStats"):
            return (f"not supported (PJRT API {_version_text(api.version)} has no "
                    f"PJRT_Device_ClearMemoryStats)")
        return "not supported (the plugin answers UNIMPLEMENTED)"
    except XlaRuntimeError as error:
        return f"failed: {shorten(str(error), 200)}"
    return "supported"


def _stats_text(stats: dict | None) -> str:
    if stats is None:
        return "not reported"
    if not stats:
        return "none reported"
    return ", ".join(f"{key}={value}" for key, value in stats.items())


def _wrapped(text: str, first: str, indent: str, width: int = _REASON_WIDTH) -> list[str]:
    """``first`` followed by ``text``, wrapped to ``width`` (nothing cut), each line of
    ``text`` kept as its own paragraph."""
    lines: list[str] = []
    paragraphs = [" ".join(line.split()) for line in str(text).splitlines() if line.strip()]
    for number, paragraph in enumerate(paragraphs or [""]):
        lines += textwrap.wrap(paragraph, width=width,
                               initial_indent=first if number == 0 else indent,
                               subsequent_indent=indent, break_on_hyphens=False,
                               break_long_words=False) or [first.rstrip()]
    return lines


def format_info(info: dict, verbose: bool = False) -> str:
    """``pjrt info`` as text a person reads at a glance.

    With ``verbose``, also what each plugin printed while it was brought up (kept, not
    shown, by default; see [`set_log_level`][pjrt.plugin.set_log_level]).
    """
    lines = [f"pjrt {info['pjrt_version']}, PJRT C API {info['pjrt_c_api_version']} (header)"]

    versions = info.get("versions") or {}
    if versions:
        lines += ["", "Versions"]
        lines += _table([[name, version or "not installed"] for name, version in versions.items()])

    lines += ["", "Plugins"]
    if info["plugins"]:
        rows = [["name", "from", "PJRT API", "package", "library"]]
        for plugin in info["plugins"]:
            package = (f"{plugin['package']} {plugin['package_version']}"
                       if plugin["package"] else "-")
            rows.append([plugin["name"], plugin["from"], plugin["plugin_api_version"] or "-",
                         package, plugin["library_path"] or "(not loaded)"])
        lines += _table(rows)
    else:
        lines.append("  none found")
    # Modules that registered nothing would otherwise be invisible: say why. (A registered
    # plugin that failed is shown under Backends.)
    registered = {p["name"] for p in info["plugins"]} | {p["module"] for p in info["plugins"]}
    unregistered = [r for r in info["discovery"]
                    if r["action"] in ("failed", "skipped") and r["name"] not in registered]
    for record in unregistered:
        lines.append(f"  {record['action']}: {record['name']} ({record['source']}): "
                     f"{shorten(record['detail'])}")

    lines += ["", "Backends"]
    up = [b for b in info["backends"] if b["status"] == "up"]
    failed = [b for b in info["backends"] if b["status"] != "up"]
    if up:
        rows = [["  name", "platform", "version", "devices", "PJRT API"]]
        for backend in up:
            rows.append([("* " if backend["default"] else "  ") + backend["name"],
                         backend["platform"], backend["platform_version"],
                         str(backend["device_count"]), backend["plugin_api_version"]])
        lines += _table(rows)
    else:
        lines.append("  none came up")
    for backend in failed:
        lines += _wrapped(backend["reason"], f"  x {backend['name']}: failed: ", "      ")
    if any(b["default"] for b in up):
        lines.append("  (* the default backend)")
    if info["error"] and not failed:  # otherwise the failed backends above say it
        lines.append(f"  error: {shorten(info['error'], 1000)}")

    if up:
        lines += ["", "Devices"]
        for backend in up:
            lines.append(f"  {backend['name']}")
            rows = [["id", "kind", "memories", "memory stats"]]
            for device in backend["devices"]:
                memories = ", ".join(
                    m + ("*" if m == device["default_memory"] else "") for m in device["memories"])
                rows.append([str(device["id"]), device["kind"], memories,
                             _stats_text(device["memory_stats"])])
            lines += _table(rows, indent="    ")
            if backend.get("memory_stats_clear"):
                lines.append(f"    clearing memory stats: {backend['memory_stats_clear']}")
        lines.append("  (* marks a device's default memory)")

    logs = info.get("logs") or {}
    if logs:
        lines += ["", "Plugin output"]
        if verbose:
            for name, text in logs.items():
                lines.append(f"  {name}:")
                lines += ["    " + line.rstrip() for line in text.splitlines() if line.strip()]
        else:
            lines.append(f"  kept from {', '.join(logs)}, not shown: pjrt info -v shows it "
                         f"(PJRT_LOG_LEVEL=warning lets plugins print)")
    return "\n".join(lines)


def _cmd_info(args, reg) -> int:
    info = gather_info(reg, args.platform)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(format_info(info, verbose=args.verbose))
    up = any(b["status"] == "up" for b in info["backends"])
    return OK if up and not info["error"] else FAILED


# -- pjrt run -------------------------------------------------------------------------------

def _read_program(path: str) -> tuple[str | bytes, str]:
    """The program as text or bytecode, and which it is."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CommandError(f"no such program file: {path}", USAGE) from None
    except OSError as error:
        raise CommandError(f"cannot read program {path}: {error.strerror or error}",
                           USAGE) from None
    if data.startswith(_BYTECODE_MAGIC) or path.endswith(".mlirbc"):
        return data, "StableHLO bytecode"
    try:
        return data.decode("utf-8"), "StableHLO text"
    except UnicodeDecodeError:
        # Not text: hand the bytes over and let the plugin's parser judge them.
        return data, "binary"


#: An MLIR location in a program parsed from memory: ``-:LINE:COLUMN``.
_ANONYMOUS_LOCATION = re.compile(r"(?<![\w./-])-:(\d+):(\d+)")


def _name_locations(message: str, path: str) -> str:
    """``message`` with the parser's ``-:2:8`` locations written as ``path:2:8``."""
    return _ANONYMOUS_LOCATION.sub(lambda m: f"{path}:{m.group(1)}:{m.group(2)}", message)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


_NPY_MAGIC = b"\x93NUMPY"


def _read_input(path: str, index: int) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            # np.load takes anything that is not .npy for a pickle and says so; a wrong file
            # deserves a plainer message.
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise CommandError(f"input {index} ({path}) is not a .npy file (save arrays "
                                   f"with numpy.save)", USAGE)
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise CommandError(f"no such input file: {path}", USAGE) from None
    except (OSError, ValueError, EOFError) as error:
        raise CommandError(f"input {index} ({path}) is not a readable .npy array: "
                           f"{_first_line(error)}", USAGE) from None


def _describe(shape: Sequence[int], dtype) -> str:
    return f"{np.dtype(dtype).name}[{','.join(map(str, shape))}]"


def _check_inputs(executable, arrays: list[np.ndarray], paths: list[str]) -> None:
    expected = executable.input_shapes
    if expected is None:
        return  # the plugin did not say; execute() checks what it can
    if len(arrays) != len(expected):
        given = ", ".join(paths) if paths else "none"
        raise CommandError(f"the program takes {_plural(len(expected), 'input')} but "
                           f"{len(arrays)} {'was' if len(arrays) == 1 else 'were'} given "
                           f"({given}); pass one --input FILE.npy per parameter", USAGE)
    for index, (array, want, path) in enumerate(zip(arrays, expected, paths)):
        if want is None:
            continue
        shape, dtype = want
        if tuple(array.shape) != tuple(shape) or (dtype is not None and array.dtype != dtype):
            raise CommandError(f"input {index} ({path}) is {_describe(array.shape, array.dtype)}"
                               f" but the program expects {_describe(shape, dtype)}", USAGE)


def _preview(array: np.ndarray) -> str:
    text = np.array2string(array, threshold=8, edgeitems=3, precision=5, max_line_width=10**6,
                           separator=" ")
    return " ".join(text.split())


def _pick_device(reg, platform: str | None, device_id: int | None):
    try:
        client = reg.get_backend(platform)
    except RuntimeError as error:
        reason = reg.backend_errors().get(platform) if platform else None
        message = (f"platform {platform!r} did not come up: {reason}" if reason
                   else str(error))
        raise CommandError(shorten(message, 1000), FAILED, detail=str(error)) from error
    if device_id is None:
        return client, client.local_devices()[0]
    try:
        return client, client.lookup_device(device_id)
    except ValueError as error:
        raise CommandError(str(error), USAGE) from None


def _cmd_run(args, reg) -> int:
    from ..errors import XlaRuntimeError

    program, kind = _read_program(args.program)
    paths = list(args.input or [])
    arrays = [_read_input(path, i) for i, path in enumerate(paths)]
    if args.platform is not None and not reg.backends_are_initialized():
        reg.set_platforms([args.platform])  # the others are never loaded
    client, device = _pick_device(reg, args.platform, args.device)

    started = time.perf_counter()
    try:
        executable = client.compile_and_load(program, [device])
    except XlaRuntimeError as error:
        # The plugin's whole diagnostic, uncut (its later lines may say which op or type is
        # at fault), its lines joined to keep errors to one line. Its locations name the
        # buffer "-"; name the file instead.
        message = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        message = _name_locations(message, args.program)
        raise CommandError(f"{args.program} does not compile: {message}", FAILED) from error
    compile_seconds = time.perf_counter() - started
    _check_inputs(executable, arrays, paths)

    placed = [client.buffer_from_pyval(array, device) for array in arrays]
    started = time.perf_counter()
    try:
        outputs = executable.execute(placed)
        for output in outputs:
            output.block_until_ready()
    except (TypeError, ValueError) as error:  # what execute() checks itself
        raise CommandError(str(error), USAGE) from error
    run_seconds = time.perf_counter() - started
    results = [np.asarray(output) for output in outputs]

    output_dir = args.output_dir or os.curdir
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as error:
        raise CommandError(f"cannot create output directory {output_dir}: "
                           f"{error.strerror or error}", FAILED) from None
    backend = args.platform or reg.default_backend_name()
    print(f"program  {args.program} ({kind}, {_plural(len(arrays), 'input')}, "
          f"{_plural(len(results), 'output')})")
    print(f"device   {device} of backend {backend!r} (platform {client.platform} "
          f"{client.platform_version})")
    print(f"compile  {compile_seconds * 1e3:.1f} ms")
    print(f"run      {run_seconds * 1e3:.3f} ms")
    for index, result in enumerate(results):
        path = os.path.join(output_dir, f"out{index}.npy")
        np.save(path, result)
        print(f"out{index}     {_describe(result.shape, result.dtype)}  {_preview(result)}  "
              f"-> {path}")
    return OK


# -- pjrt demo ------------------------------------------------------------------------------

def _cmd_demo(args, reg) -> int:
    from . import demo

    try:
        demo.main(reg)
    except demo.DemoUnavailable as error:
        raise CommandError(str(error)) from error
    return OK


# -- pjrt conform ---------------------------------------------------------------------------

def _cmd_conform(args, reg) -> int:
    from .conform import command

    try:
        return command.main(args)
    except ValueError as error:
        raise CommandError(str(error), USAGE) from error


def _cmd_launch(args, reg) -> int:
    from .._distributed.launch import launch

    try:
        return launch(args.script, args.arguments, num_processes=args.num_processes,
                      coordinator=args.coordinator, devices_per_process=args.devices_per_process,
                      timeout=args.timeout)
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(str(error), USAGE) from error


def _cmd_trace(args, reg) -> int:
    from .trace_command import UsageError, run

    try:
        return run(args.program, args.log_dir, perfetto=args.perfetto)
    except UsageError as error:
        raise CommandError(str(error), USAGE) from error


# -- the command line -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``pjrt`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true",
                        help="show tracebacks, full plugin messages and discovery logs")

    parser = argparse.ArgumentParser(
        prog="pjrt", parents=[common],
        description="A Python host for PJRT plugins: inspect them and run StableHLO.")
    parser.add_argument("--version", action="version",
                        version=f"pjrt {__version__} (PJRT C API {_version_text(HEADER_VERSION)})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    info = commands.add_parser("info", parents=[common],
                               help="plugins, backends, devices and memory of this machine")
    info.add_argument("--platform", metavar="P",
                      help="look at platform P only (the other plugins are not loaded)")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(handler=_cmd_info)

    run = commands.add_parser("run", parents=[common],
                              help="compile and run a StableHLO program on one device")
    run.add_argument("program", metavar="PROGRAM",
                     help="StableHLO as text (.mlir) or bytecode (.mlirbc)")
    run.add_argument("--input", "-i", action="append", metavar="FILE.npy",
                     help="an input array, once per program parameter, in order")
    run.add_argument("--platform", metavar="P", help="the backend to run on (default: the "
                     "default backend)")
    run.add_argument("--device", type=int, metavar="N", help="the id of the device to run on "
                     "(default: the backend's first device)")
    run.add_argument("--output-dir", "-o", metavar="DIR",
                     help="where out0.npy, out1.npy, ... are written (default: here)")
    run.set_defaults(handler=_cmd_run)

    demo = commands.add_parser("demo", parents=[common], help="the tour of the CPU plugin")
    demo.set_defaults(handler=_cmd_demo)

    from .conform.command import add_arguments as add_conform_arguments

    conform = commands.add_parser("conform", parents=[common],
                                  help="check, one by one, what a PJRT plugin does right")
    add_conform_arguments(conform)
    conform.set_defaults(handler=_cmd_conform)

    launch = commands.add_parser("launch", parents=[common],
                                 help="run a script as N processes of one job on this machine")
    launch.add_argument("-n", "--num-processes", type=int, required=True, metavar="N")
    launch.add_argument("--coordinator", metavar="ADDRESS", help="host:port of the job's "
                        "coordination service (default: 127.0.0.1 and a free port), or a "
                        "key-value store: sqlite:///path/job.db, redis://host:port/db")
    launch.add_argument("--devices-per-process", type=int, metavar="K", help="give process i "
                        "the local devices i*K .. i*K+K-1 (PJRT_LOCAL_DEVICE_IDS)")
    launch.add_argument("--timeout", type=float, metavar="S",
                        help="seconds each process waits for the others")
    launch.add_argument("script", metavar="SCRIPT")
    launch.add_argument("arguments", nargs=argparse.REMAINDER, metavar="ARGS")
    launch.set_defaults(handler=_cmd_launch)

    trace = commands.add_parser("trace", parents=[common],
                                help="run a Python program with a trace (pjrt.profiler)",
                                usage="pjrt trace [--log-dir DIR] [--perfetto] -- python "
                                      "PROGRAM.py [ARGS...]")
    trace.add_argument("--log-dir", default="pjrt-trace", metavar="DIR",
                       help="where the trace goes: DIR/plugins/profile/<run>/ (default: "
                            "pjrt-trace)")
    trace.add_argument("--perfetto", action="store_true",
                       help="also write perfetto_trace.json.gz, as jax's create_perfetto_trace")
    trace.add_argument("program", nargs=argparse.REMAINDER, metavar="-- python PROGRAM.py ARGS",
                       help="the program and its arguments, after --")
    trace.set_defaults(handler=_cmd_trace)
    return parser


@contextlib.contextmanager
def _logging_to_stderr(verbose: bool):
    # Plugin discovery reports through logging; a command shows those reports on stderr,
    # unless the program embedding main() has set logging up already.
    logger = logging.getLogger("pjrt")
    if logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pjrt: %(levelname)s: %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def main(argv: Sequence[str] | None = None, *,
         registry: registry_module.BackendRegistry | None = None) -> int:
    """Run the ``pjrt`` command with ``argv`` (``sys.argv[1:]`` when None).

    Args:
      argv: the arguments after the program name.
      registry: the backend registry to use (the default registry when None); a program
        embedding the command, or a test, can give a registry of its own.

    Returns:
      The exit status: 0 success, 1 failure, 2 a wrong command line or input.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse has printed its usage message; return its status rather than exit,
        # so that main() can be called from Python.
        return exit_.code if isinstance(exit_.code, int) else USAGE
    reg = registry if registry is not None else registry_module.default_registry
    with _logging_to_stderr(args.verbose):
        try:
            return args.handler(args, reg)
        except CommandError as error:
            if args.verbose:
                traceback.print_exc()
                if error.detail:
                    print(error.detail, file=sys.stderr)
            print(f"pjrt {args.command}: error: {error}", file=sys.stderr)
            return error.status
        except KeyboardInterrupt:
            print(f"pjrt {args.command}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            # The reader went away (``pjrt info | head``); nothing is left to say to it, and
            # Python must not fail again flushing stdout at exit.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return FAILED
        except Exception as error:  # noqa: BLE001 - one line unless asked for the traceback
            if args.verbose:
                traceback.print_exc()
            print(f"pjrt {args.command}: error: {type(error).__name__}: "
                  f"{shorten(str(error), 300)}", file=sys.stderr)
            return FAILED
