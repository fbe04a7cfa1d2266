"""The plugins' own profilers during one trace: their device activity, as XSpace bytes.

A plugin with the PJRT profiler extension gets a profiler when the trace starts, if a client
of it exists then, or when its first client is made during the trace (plugins record what their
clients do; one never brought up has nothing to record). At the end each profiler is stopped,
its XSpace collected and the profiler freed. A plugin without the extension, or whose profiler
fails, is noted in the trace, and the rest go on; with ``raise_error_on_start_failure`` a
failure to start raises instead, as jax's option says.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .._capi import profiler_extension
from ..errors import XlaRuntimeError
from . import recorder, xspace

if TYPE_CHECKING:
    from ..plugin import Plugin

logger = logging.getLogger("pjrt.profiler")


class PluginProfilers:
    """The profilers of one trace, one per plugin that has one."""

    def __init__(self, options: bytes, raise_on_start_failure: bool):
        self._options = options
        self._raise = raise_on_start_failure
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._running: list[tuple[str, profiler_extension.PluginProfiler]] = []
        self._stopped = False

    def add(self, plugin: "Plugin") -> None:
        """Start ``plugin``'s profiler, once per trace; note it when it has none."""
        with self._lock:
            if self._stopped or plugin.name in self._seen:
                return
            self._seen.add(plugin.name)
            found = profiler_extension.find(plugin.api)
            if not isinstance(found, profiler_extension.ProfilerTable):
                why = (found if isinstance(found, str) else
                       "it has no profiler extension (PJRT_Extension_Type_Profiler)")
                _note(f"plugin {plugin.name!r} records no device activity: {why}; the trace "
                      f"holds pjrt's own events for it")
                return
            profiler = None
            try:
                profiler = found.create(self._options)
                profiler.start()
            except XlaRuntimeError as error:
                if profiler is not None:
                    _quietly(profiler.destroy)
                if self._raise:
                    raise
                _note(f"plugin {plugin.name!r} records no device activity: {error}")
                return
            self._running.append((plugin.name, profiler))
            logger.debug("the profiler of plugin %r started", plugin.name)

    def finish(self) -> list[tuple[str, bytes]]:
        """Stop every profiler and collect what it recorded: ``(plugin name, XSpace bytes)``
        for each that recorded something; failures are noted."""
        with self._lock:
            self._stopped = True
            running, self._running = self._running, []
        collected = []
        for name, profiler in running:
            try:
                profiler.stop()
                data = xspace.checked(profiler.collect())
            except (XlaRuntimeError, ValueError) as error:
                _note(f"the device activity of plugin {name!r} is lost: {error}")
                continue
            finally:
                _quietly(profiler.destroy)
            if data:
                planes = xspace.plane_names(data)
                for message in xspace.errors(data):
                    _note(f"the profiler of plugin {name!r} reported: {message}")
                _note(f"plugin {name!r} recorded {len(planes)} "
                      f"plane{'' if len(planes) == 1 else 's'} "
                      f"({', '.join(planes) or 'unnamed'}): see the .xplane.pb file")
                collected.append((name, data))
            else:
                _note(f"the profiler of plugin {name!r} recorded nothing")
        return collected


def _note(text: str) -> None:
    recorder.note(text)
    logger.info("%s", text)


def _quietly(work) -> None:
    try:
        work()
    except XlaRuntimeError as error:
        logger.warning("%s", error)
