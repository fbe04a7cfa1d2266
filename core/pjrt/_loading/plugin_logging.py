"""How loud plugins are: their own logging switches, and what they write to stderr.

PJRT plugins log from C++ (absl, XLA's TSL logging, libtpu's start-up code) straight to file
descriptor 2. On a machine without a GPU or TPU, bringing up the CUDA or TPU plugin only to
learn that it has no hardware prints a dozen lines (``failed call to cuInit``, libtpu's
``InitGoogle`` and ``TPU_*`` warnings, a "Source Location Trace") that say nothing the
backend's reason does not. So, unless told otherwise with `LOG_LEVEL_ENV`:

* before a plugin library is loaded, the plugins' own log threshold is raised to warnings
  (``TF_CPP_MIN_LOG_LEVEL=1``, which is what XLA's plugins read; a value the user set is
  kept), which silences XLA's ``I0000 ... cpu_device_count set via create_options`` line;
* what a plugin writes to stderr while a backend that was not asked for by name is loaded and
  brought up is captured (`capture_stderr`) and kept with that backend
  (``pjrt.registry.backend_logs()``, ``pjrt info -v``) instead of being printed.

``PJRT_LOG_LEVEL`` (or `set_log_level`, public as ``pjrt.plugin.set_log_level``) is the one switch:

``quiet`` (the default)
    as above;
``warning``
    the same threshold, nothing captured: every plugin's warnings and errors reach stderr;
``info``
    nothing changed or captured: the plugins log as they do by default.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
from typing import Any, Iterator, Mapping

#: The environment variable that sets how much plugins may print.
LOG_LEVEL_ENV = "PJRT_LOG_LEVEL"

#: The levels, quietest first.
LOG_LEVELS = ("quiet", "warning", "info")

#: The plugins' own switches, by level: set when not already set. TF_CPP_MIN_LOG_LEVEL is
#: read by XLA's logging in every plugin built from XLA (CPU, CUDA, ROCm, libtpu's XLA);
#: 1 drops INFO lines and keeps warnings and errors.
_PLUGIN_ENV_DEFAULTS = {
    "quiet": {"TF_CPP_MIN_LOG_LEVEL": "1"},
    "warning": {"TF_CPP_MIN_LOG_LEVEL": "1"},
    "info": {},
}

_level_override: str | None = None

logger = logging.getLogger(__name__)


def _check_level(level: str, where: str) -> str:
    normalized = level.strip().lower()
    if normalized not in LOG_LEVELS:
        raise ValueError(f"{where} is {level!r}; use one of {', '.join(LOG_LEVELS)}")
    return normalized


def set_log_level(level: str | None) -> None:
    """Set how much plugins may print: ``"quiet"``, ``"warning"`` or ``"info"``.

    Overrides `LOG_LEVEL_ENV`; None goes back to it. The plugins' own switches are
    environment variables read when their library is loaded, so call this before the first
    backend comes up (capturing applies from the next backend brought up).

    Raises:
      ValueError: ``level`` is not one of `LOG_LEVELS`.
    """
    global _level_override
    _level_override = None if level is None else _check_level(level, "the log level")


def log_level(environ=None) -> str:
    """The log level in force: `set_log_level`'s, else `LOG_LEVEL_ENV`'s, else quiet.

    Raises:
      ValueError: `LOG_LEVEL_ENV` names no level.
    """
    if _level_override is not None:
        return _level_override
    value = (os.environ if environ is None else environ).get(LOG_LEVEL_ENV, "")
    if not value.strip():
        return "quiet"
    return _check_level(value, LOG_LEVEL_ENV)


def apply_plugin_log_defaults(level: str) -> None:
    """Set the plugins' logging variables for ``level``, keeping any the user has set."""
    for name, value in _PLUGIN_ENV_DEFAULTS[level].items():
        os.environ.setdefault(name, value)


def apply_defaults() -> None:
    """`apply_plugin_log_defaults` for the level in force, before a library is loaded.

    An unknown `LOG_LEVEL_ENV` counts as ``quiet`` here; the registry reports it.
    """
    try:
        level = log_level()
    except ValueError:
        level = "quiet"
    apply_plugin_log_defaults(level)


#: One redirect of file descriptor 2 at a time, process-wide: two threads redirecting at
#: once would each restore what the other had put there, leaving stderr in a temporary file.
_capture_lock = threading.RLock()


@contextlib.contextmanager
def capture_stderr(sink: list[str]) -> Iterator[None]:
    """Send file descriptor 2 to a temporary file while the block runs; keep what came.

    What was written is appended to ``sink`` (when not blank) as text. Both Python's and C's
    writes to stderr are caught, from every thread: the redirect is process-wide, so it holds
    a process-wide lock; keep the block short. Blocks may nest.
    """
    with _capture_lock:
        with _capture_stderr(sink):
            yield


@contextlib.contextmanager
def _capture_stderr(sink: list[str]) -> Iterator[None]:
    _flush_python_stderr()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all (closed by a daemon): nothing to keep it from
        yield
        return
    try:
        import tempfile  # only when output is kept back

        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                _flush_python_stderr()
                os.dup2(saved, 2)
                captured.seek(0)
                text = captured.read().decode("utf-8", errors="replace")
                if text.strip():
                    sink.append(text)
    finally:
        os.close(saved)


def _flush_python_stderr() -> None:
    # Python buffers what it writes to sys.stderr; flush so that text lands on the side of
    # the redirect it was written on.
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


def start(environ=None) -> bool:
    """Apply the plugins' logging defaults for the level in force, before any plugin loads.

    Returns:
      Whether output of backends not asked for is to be captured (the level is ``quiet``).

    Raises:
      ValueError: `LOG_LEVEL_ENV` names no level.
    """
    level = log_level(environ)
    apply_plugin_log_defaults(level)
    return level == "quiet"


class PluginOutput:
    """What plugins wrote to stderr, kept by the backend (or plugin module) it came from;
    and the warnings about the operator's own settings, which are not plugin output and are
    written to stderr once the capture in progress ends (`warn_operator`)."""

    def __init__(self):
        self._text: dict[str, str] = {}
        self._depth = 0  # captures in progress (they nest)
        self._pending: list[str] = []

    def warn_operator(self, message: str) -> None:
        """Log ``message`` as a warning about the operator's own configuration (a name given
        twice, an entry that cannot be used): at once, or, while plugin output is being kept
        back, as soon as that ends, so that it reaches stderr instead of being kept."""
        if self._depth:
            self._pending.append(message)
        else:
            logger.warning("%s", message)

    @contextlib.contextmanager
    def kept(self, enabled: bool, owner: str,
             registrations: Mapping[str, Any] | None = None,
             printed: list[str] | None = None) -> Iterator[None]:
        """Capture stderr while the block runs (when ``enabled``) and keep what came.

        ``owner`` is a platform, or the plugin module being discovered: then the text is kept
        under each platform the module registered (its ``registrations`` entries whose
        ``module`` it is, known only after the block), else under the module's name; it is
        also appended to ``printed`` when given. Whether enabled or not, the block has
        decided for the calls inside it: `quietly` does nothing there.
        """
        decided = _output_decided.set(True)
        if not enabled:
            try:
                yield
            finally:
                _output_decided.reset(decided)
            return
        captured: list[str] = []
        self._depth += 1
        try:
            with capture_stderr(captured):
                yield
        finally:
            _output_decided.reset(decided)
            self._depth -= 1
            if printed is not None:
                printed.extend(captured)
            if captured:
                names = [name for name, registration in (registrations or {}).items()
                         if getattr(registration, "module", None) == owner] or [owner]
                for name in names:
                    self._text[name] = self._text.get(name, "") + "".join(captured)
            if not self._depth:
                pending, self._pending = self._pending, []
                for message in dict.fromkeys(pending):  # each once, in order
                    logger.warning("%s", message)

    def as_dict(self) -> dict[str, str]:
        """What was kept, by platform (or plugin module)."""
        return dict(self._text)

    def clear(self) -> None:
        self._text.clear()


#: Whether a caller up the stack (the registry bringing a backend up) has decided what
#: becomes of plugin output; then `quietly` leaves it to that caller.
_output_decided: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pjrt_plugin_output_decided", default=False)

#: What plugins printed while loaded or making a client outside the registry.
_direct_output = PluginOutput()


@contextlib.contextmanager
def quietly(plugin_name: str, printed: list[str] | None = None) -> Iterator[None]:
    """Keep back what a plugin prints while it is loaded or makes a client outside the
    registry (``load_pjrt_plugin_dynamically``, ``make_c_api_client``), as the registry keeps
    back what backends print: at the ``quiet`` level (the default) it is kept by plugin
    name (`plugin_logs`) and appended to ``printed``; at the others it is printed. In
    the registry's own bring-up, which decides for itself, this does nothing.
    """
    try:
        quiet = log_level() == "quiet"
    except ValueError:  # an unknown PJRT_LOG_LEVEL counts as quiet here; the registry says so
        quiet = True
    if _output_decided.get() or not quiet:
        yield
        return
    with _direct_output.kept(True, plugin_name, printed=printed):
        yield


def plugin_logs() -> dict[str, str]:
    """What plugins printed while loaded or making clients outside the registry, by the name
    they were loaded under (the registry's backends: ``pjrt.registry.backend_logs()``)."""
    return _direct_output.as_dict()
