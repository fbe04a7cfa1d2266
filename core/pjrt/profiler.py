"""Traces of what pjrt ran, with jax's ``jax.profiler`` names.

``with pjrt.profiler.trace(log_dir):`` (or `start_trace` / `stop_trace`) records pjrt's own
work while it runs, and writes it where jax writes its traces,
``log_dir/plugins/profile/<run>/``:

* ``<host>.trace.json.gz``: one event per compile (with the program's name, its devices and
  whether the compilation cache had it), launch (program, devices, and the path that launched
  it: ``CallPlan``, the native per-call path, or ``python``), host-to-device transfer, wait
  (``block_until_ready``) and host read that Python made, and the regions marked with
  `TraceAnnotation`, each with its thread, in the Chrome trace-event format that
  ui.perfetto.dev and chrome://tracing open;
* ``<host>.xplane.pb``: the device activity that plugins with the PJRT profiler extension
  (NVIDIA's and Google's) recorded themselves, in their format (an XSpace, as jax writes it),
  for TensorBoard's profile plugin or xprof. XLA's CPU plugins have no such profiler: the trace
  says so in a note.

Reads that numpy makes through the buffer protocol (``np.asarray`` of a value in host memory:
the memory itself, no copy, in C) are not in the trace: only reads that take Python's path
(``Array.__array__``: a value in device memory, several shards, ml_dtypes) are.

With no trace running, the hooks cost one test of a flag, and the per-call path in C is the one
that runs. While a trace runs, each launch of that path is timed from Python.

``pjrt trace -- python prog.py [args]`` runs a program with a trace from its start to its end.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable, Iterator, NamedTuple, TypeVar

from . import plugin as plugin_module
from ._profiling import recorder, trace_file
from .client import live_clients
from ._profiling.plugin_profilers import PluginProfilers
from ._wire import protowire

__all__ = ["ProfileOptions", "TraceFiles", "start_trace", "stop_trace", "trace",
           "TraceAnnotation", "StepTraceAnnotation", "annotate_function", "is_tracing",
           "record_array_sites", "device_memory_profile", "save_device_memory_profile"]

_Function = TypeVar("_Function", bound=Callable[..., Any])


class ProfileOptions:
    """What the plugins' profilers are asked to record (``tensorflow.ProfileOptions``), with
    jax's attributes and defaults. pjrt's own events do not depend on them.

    Attributes:
      host_tracer_level: how much of the plugin's host activity (its TraceMe events): 0 none,
        1 critical, 2 info (default), 3 verbose.
      device_tracer_level: 1 (default) records device activity (kernels, copies), 0 does not.
      python_tracer_level: 1 (default, as jax's) asks a plugin that can for Python frames.
      enable_hlo_proto: include the compiled programs' HLO (default True, as jax's).
      include_dataset_ops: as tensorflow's option (default True).
      start_timestamp_ns, duration_ms: a start time and a length for the plugin's profilers
        (0: start now, run until stopped).
      repository_path, session_id: passed on as they are.
      raise_error_on_start_failure: a plugin profiler that fails to start raises from
        `start_trace` (default False: the failure is noted in the trace, which goes on).
      advanced_configuration: plugin-specific settings, name -> str, bool or int.
    """

    def __init__(self):
        self.host_tracer_level = 2
        self.device_tracer_level = 1
        self.python_tracer_level = 1
        self.enable_hlo_proto = True
        self.include_dataset_ops = True
        self.start_timestamp_ns = 0
        self.duration_ms = 0
        self.repository_path = ""
        self.session_id = ""
        self.raise_error_on_start_failure = False
        self.advanced_configuration: dict[str, str | bool | int] = {}

    def SerializeAsString(self) -> bytes:  # noqa: N802 - protobuf's name, as CompileOptions'
        """The options as a serialised ``tensorflow.ProfileOptions`` (what a plugin's profiler
        is created with).

        Raises:
          TypeError: an ``advanced_configuration`` value is not a str, bool or int.
        """
        parts = [protowire.varint_field(5, 1),  # version: these options are explicit
                 protowire.bool_field(1, self.include_dataset_ops),
                 protowire.varint_field(2, int(self.host_tracer_level)),
                 protowire.varint_field(3, int(self.device_tracer_level)),
                 protowire.varint_field(4, int(self.python_tracer_level)),
                 protowire.bool_field(7, self.enable_hlo_proto),
                 protowire.varint_field(8, int(self.start_timestamp_ns)),
                 protowire.varint_field(9, int(self.duration_ms))]
        if self.repository_path:
            parts.append(protowire.string_field(10, str(self.repository_path)))
        for key, value in sorted(self.advanced_configuration.items()):
            # AdvancedConfigValue: string_value 1, bool_value 2, int64_value 3 (bool first:
            # a bool is an int in Python).
            if isinstance(value, bool):
                encoded = protowire.bool_field(2, value)
            elif isinstance(value, int):
                encoded = protowire.int_field(3, value)
            elif isinstance(value, str):
                encoded = protowire.string_field(1, value)
            else:
                raise TypeError(f"advanced_configuration[{key!r}] is a {type(value).__name__}; "
                                f"give a str, bool or int")
            parts.append(protowire.message_field(12, protowire.string_field(1, str(key))
                                                 + protowire.message_field(2, encoded)))
        parts.append(protowire.bool_field(13, self.raise_error_on_start_failure))
        if self.session_id:
            parts.append(protowire.string_field(14, str(self.session_id)))
        return b"".join(parts)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"ProfileOptions({fields})"


class TraceFiles(NamedTuple):
    """What a trace wrote (`stop_trace`'s result): paths, None for a file not written."""

    directory: str
    #: ``<host>.trace.json.gz``: pjrt's events (Chrome trace-event JSON, gzipped).
    trace: str
    #: ``<host>.xplane.pb``: the plugins' own device activity (XSpace), where one recorded any.
    xplane: str | None
    #: ``perfetto_trace.json.gz``, with ``create_perfetto_trace``.
    perfetto: str | None
    #: What the trace noted: plugins without a profiler, profilers that failed.
    notes: tuple[str, ...]


class _Session:
    def __init__(self, log_dir: str, perfetto: bool, profilers: PluginProfilers):
        self.log_dir = log_dir
        self.perfetto = perfetto
        self.profilers = profilers


_lock = threading.Lock()
_session: _Session | None = None


def is_tracing() -> bool:
    """Whether a trace is running."""
    return _session is not None


def start_trace(log_dir: os.PathLike | str, create_perfetto_link: bool = False,
                create_perfetto_trace: bool = False,
                profiler_options: ProfileOptions | None = None) -> None:
    """Start a trace; `stop_trace` ends it and writes its files under ``log_dir``.

    Only one trace runs at a time. The plugins that have the PJRT profiler extension start
    their own profilers: those with a client now, and the others when their first client is
    made during the trace.

    Args:
      log_dir: where the files go (``log_dir/plugins/profile/<run>/``), created if needed: a
        str, bytes or ``os.PathLike`` path (`TraceFiles` gives str paths).
      create_perfetto_link: not supported (jax serves the trace to ui.perfetto.dev and waits
        for the browser); True raises ValueError.
      create_perfetto_trace: also write ``perfetto_trace.json.gz`` (the same events; the
        trace file itself opens in ui.perfetto.dev too).
      profiler_options: what the plugins' profilers record (`ProfileOptions`).

    Raises:
      RuntimeError: a trace is already running.
      ValueError: ``create_perfetto_link`` is True, or ``log_dir`` is empty.
      TypeError: ``log_dir`` is not a path, or ``profiler_options`` is not a
        `ProfileOptions`.
      OSError: ``log_dir`` cannot be made a directory.
      XlaRuntimeError: a plugin's profiler failed to start and
        ``profiler_options.raise_error_on_start_failure`` is set.
    """
    global _session
    if create_perfetto_link:
        raise ValueError("create_perfetto_link is not supported: pjrt does not serve traces; "
                         "pass create_perfetto_trace=True and open perfetto_trace.json.gz (or "
                         "the .trace.json.gz) at https://ui.perfetto.dev")
    options = profiler_options if profiler_options is not None else ProfileOptions()
    if not isinstance(options, ProfileOptions):
        raise TypeError(f"profiler_options must be a pjrt.profiler.ProfileOptions, not "
                        f"{type(options).__name__}")
    directory = _directory(log_dir)
    with _lock:
        if _session is not None:
            raise RuntimeError("Profile has already been started. Only one profile may be run "
                               "at a time: call pjrt.profiler.stop_trace() first")
        os.makedirs(directory, exist_ok=True)
        profilers = PluginProfilers(options.SerializeAsString(),
                                    options.raise_error_on_start_failure)
        recorder.begin()
        try:
            for plugin in _plugins_with_clients():
                profilers.add(plugin)
        except BaseException:
            profilers.finish()
            recorder.end()
            raise
        _session = _Session(directory, create_perfetto_trace, profilers)


def _directory(log_dir) -> str:
    """``log_dir`` as a str path (a bytes path decoded as the file system does)."""
    try:
        directory = os.fsdecode(log_dir)
    except TypeError:
        raise TypeError(f"log_dir must be a path (a str, bytes or os.PathLike), not "
                        f"{type(log_dir).__name__}") from None
    if not directory:
        raise ValueError("log_dir is empty: give the directory the trace's files go under "
                         "(\".\" for this one)")
    return directory


def stop_trace() -> TraceFiles:
    """End the running trace and write its files (see the module's description).

    Returns:
      The `TraceFiles` written (jax's returns None).

    Raises:
      RuntimeError: no trace is running.
    """
    global _session
    with _lock:
        session = _session
        if session is None:
            raise RuntimeError("No profile started: call pjrt.profiler.start_trace(log_dir) "
                               "first, or use `with pjrt.profiler.trace(log_dir):`")
        _session = None
        try:
            planes = session.profilers.finish()
        finally:
            recording = recorder.end()
        assert recording is not None
        written = trace_file.write(session.log_dir, recording, planes,
                                   perfetto=session.perfetto)
    return TraceFiles(os.path.dirname(written["trace"]), written["trace"],
                      written.get("xplane"), written.get("perfetto"), tuple(recording.notes))


@contextlib.contextmanager
def trace(log_dir: os.PathLike | str, create_perfetto_link: bool = False,
          create_perfetto_trace: bool = False,
          profiler_options: ProfileOptions | None = None) -> Iterator[None]:
    """``with trace(log_dir):``: `start_trace` on entry, `stop_trace` on exit (arguments as
    `start_trace`'s)."""
    start_trace(log_dir, create_perfetto_link, create_perfetto_trace, profiler_options)
    try:
        yield
    finally:
        stop_trace()


class TraceAnnotation:
    """``with TraceAnnotation("name", **facts):`` marks a region of the user's in the trace:
    one event over the block, on this thread, with ``facts`` as its arguments. Annotations
    nest; with no trace running they record nothing (and cost little).

    Args:
      name: the event's name.
      **kwargs: facts shown with the event, read when the block ends (any values: made text
        where JSON has no form for them, such as non-string keys, NaN, a list inside itself
        or an arbitrary object; none can cost the trace).
    """

    __slots__ = ("_span",)

    #: The category of the events (Chrome trace ``cat``).
    category = "annotation"

    def __init__(self, name: str, **kwargs: Any):
        self._span = recorder.Span(self.category, str(name), kwargs)

    def __enter__(self) -> "TraceAnnotation":
        self._span.__enter__()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self._span.__exit__(kind, error, traceback)

    def set_metadata(self, **kwargs: Any) -> None:
        """Add facts to the annotation (shown with its event)."""
        self._span.args.update(kwargs)

    @staticmethod
    def is_enabled() -> bool:
        """Whether a trace is running (whether annotations record anything)."""
        return recorder.active


class StepTraceAnnotation(TraceAnnotation):
    """A `TraceAnnotation` for one step of a loop (training steps): ``step_num=`` names it.

    Example: ``with StepTraceAnnotation("train", step_num=step):``."""

    __slots__ = ()
    category = "step"


def annotate_function(func: _Function, name: str | None = None,
                      **decorator_kwargs: Any) -> _Function:
    """Decorator: each call of ``func`` is a `TraceAnnotation` named ``name`` (its qualified
    name by default), with ``decorator_kwargs`` as its facts. Use
    ``functools.partial(annotate_function, name=...)`` to name it.
    """
    label = name or getattr(func, "__qualname__", None) or func.__name__

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not recorder.active:
            return func(*args, **kwargs)
        with TraceAnnotation(label, **decorator_kwargs):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


# -- plugins' own profilers -----------------------------------------------------------------

def record_array_sites(enabled: bool = True) -> bool:
    """Record where each new array is made (its Python stack, outside pjrt), so that
    [`Client.heap_profile`][pjrt.client.Client.heap_profile] groups device memory by it;
    ``False`` stops. Returns the previous setting. ``PJRT_ARRAY_SITES=1`` in the environment
    turns it on when pjrt is imported. Off, making an array costs one pointer test more;
    on, a walk of the caller's stack.
    """
    from ._profiling import heap

    return heap.record_array_sites(enabled)


def device_memory_profile(backend=None) -> bytes:
    """The memory the live arrays and executables of ``backend`` hold, as a gzipped pprof
    profile (jax's name): [`Client.heap_profile`][pjrt.client.Client.heap_profile], gzipped,
    of the backend ``pjrt.get_backend(backend)`` returns (a platform name, a `Client`, or
    None for the default backend)."""
    from ._profiling import heap
    from .registry import get_backend

    return heap.gzipped(get_backend(backend).heap_profile())


def save_device_memory_profile(filename: os.PathLike | str, backend=None) -> None:
    """Write [`device_memory_profile`][pjrt.profiler.device_memory_profile] (gzipped) to
    ``filename`` (jax's name), for ``pprof``."""
    profile = device_memory_profile(backend)
    with open(filename, "wb") as stream:
        stream.write(profile)


def _plugins_with_clients() -> list:
    """The plugins that have an open client, each once."""
    seen: dict[str, Any] = {}
    for client in live_clients():
        seen.setdefault(client.plugin.name, client.plugin)
    return list(seen.values())


def _client_created(client) -> None:
    """A client made during a trace starts its plugin's profiler (see `PluginProfilers`)."""
    session = _session
    if session is not None:
        session.profilers.add(client.plugin)


if _client_created not in plugin_module.client_created_hooks:
    plugin_module.client_created_hooks.append(_client_created)
