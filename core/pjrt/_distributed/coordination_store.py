"""The coordination service's key-value store: a directory tree of keys.

Keys are normalised as XLA's service does (no leading or trailing ``/``, none doubled), so
``"/a//b/"`` and ``"a/b"`` are one key; a directory get returns the keys under ``dir/`` in
key order; a delete removes a key and every key under it; an increment keeps the integer as
its decimal text. A blocking get waits (its ``done`` called later) until a set or an
increment gives the key a value.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..errors import ErrorCode
from .coordination_messages import Status, make_status


def normalize_key(key: str) -> str:
    """``key`` as the store keeps it: no leading or trailing ``/``, none doubled."""
    return "/".join(part for part in key.split("/") if part)


class DirectoryStore:
    """The key-value store of one job; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._store: dict[str, bytes] = {}
        self._waiting_gets: dict[str, list[Callable]] = {}

    def insert(self, key: str, value: bytes, allow_overwrite: bool) -> Status | None:
        key = normalize_key(key)
        with self._lock:
            if not allow_overwrite and key in self._store:
                return make_status(ErrorCode.ALREADY_EXISTS, f"Config key {key} already exists.")
            self._store[key] = value
            waiting = self._waiting_gets.pop(key, None)
        for done in waiting or ():
            done(None, value)
        return None

    def get(self, key: str, done: Callable) -> None:
        key = normalize_key(key)
        with self._lock:
            value = self._store.get(key)
            if value is None:
                self._waiting_gets.setdefault(key, []).append(done)
                return
        done(None, value)

    def forget_get(self, key: str, done: Callable) -> None:
        """Drop a blocking get whose caller went away."""
        with self._lock:
            waiting = self._waiting_gets.get(normalize_key(key))
            if waiting and done in waiting:
                waiting.remove(done)

    def try_get(self, key: str) -> bytes | None:
        with self._lock:
            return self._store.get(normalize_key(key))

    def increment(self, key: str, increment: int) -> tuple[Status | None, bytes]:
        key = normalize_key(key)
        with self._lock:
            held = self._store.get(key)
            try:
                current = int(held.decode("ascii")) if held is not None else 0
            except (UnicodeDecodeError, ValueError):
                return make_status(ErrorCode.INVALID_ARGUMENT,
                               f"the value of {key!r} is not an integer"), b""
            value = str(current + increment).encode()
            self._store[key] = value
            waiting = self._waiting_gets.pop(key, None)
        for done in waiting or ():
            done(None, value)
        return None, value

    def get_dir(self, directory: str) -> list[tuple[str, bytes]]:
        prefix = normalize_key(directory) + "/"
        with self._lock:
            return sorted((k, v) for k, v in self._store.items() if k.startswith(prefix))

    def delete(self, key: str) -> None:
        key = normalize_key(key)
        prefix = key + "/"
        with self._lock:
            self._store.pop(key, None)
            for name in [k for k in self._store if k.startswith(prefix)]:
                del self._store[name]

    def stop(self) -> None:
        """End every blocking get with ABORTED (the service is shutting down)."""
        with self._lock:
            waiting, self._waiting_gets = self._waiting_gets, {}
        for dones in waiting.values():
            for done in dones:
                done(make_status(ErrorCode.ABORTED, "the coordination service is shutting down"),
                     b"")
