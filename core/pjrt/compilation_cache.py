"""A persistent compilation cache: compiled executables kept on disk across processes.

Set ``PJRT_COMPILATION_CACHE_DIR`` (or call :func:`set_compilation_cache_dir`) and every
compile looks there first. An entry is found by a key that hashes everything the compiled
code depends on:

* the program's bytes (text or bytecode, as given);
* the serialized compile options (they hold the device assignment, so the device ids are in
  the key, and the replica/partition counts and every build option);
* the identity of the plugin build (:class:`pjrt.serialization.PluginIdentity`: platform,
  platform version, PJRT API version and the SHA-256 of the plugin's library).

Entries are what :meth:`LoadedExecutable.serialize` writes: the plugin's bytes inside pjrt's
envelope naming the plugin build, so an entry is refused (and recompiled over) if it was made
by another build, even under a colliding key. Plugins handed over in memory have no library
to hash, so their compiles are never cached.

Several processes may share a directory: entries are written to a temporary file and moved
into place with :func:`os.replace` (atomic on POSIX and Windows), so a reader sees a whole
entry or none. The directory is kept under a size bound by deleting the entries used least
recently (a hit refreshes an entry's modification time).

Hits, misses and evictions are logged at DEBUG level on this module's logger; entries that
cannot be read or loaded at WARNING.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from typing import cast

from . import serialization
from .serialization import PluginIdentity

logger = logging.getLogger(__name__)

__all__ = ["CompilationCache", "get_compilation_cache", "set_compilation_cache_dir",
           "CACHE_DIR_ENV", "MAX_BYTES_ENV", "DEFAULT_MAX_BYTES"]

#: The environment variable naming the cache directory.
CACHE_DIR_ENV = "PJRT_COMPILATION_CACHE_DIR"
#: The environment variable bounding the directory's size in bytes.
MAX_BYTES_ENV = "PJRT_COMPILATION_CACHE_MAX_BYTES"
#: The default bound: 1 GiB.
DEFAULT_MAX_BYTES = 1 << 30

_SUFFIX = ".pjrtexe"
#: Bumped when the key's recipe changes, so that old entries are never found.
_KEY_VERSION = b"pjrt-compilation-cache-1"


class CompilationCache:
    """Compiled executables in one directory, bounded to ``max_bytes``.

    Args:
      directory: where the entries live; created if missing.
      max_bytes: the most the entries may take together; the least recently used go first.

    Raises:
      ValueError: ``max_bytes`` is not positive.
      OSError: the directory cannot be created.
    """

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        if int(max_bytes) <= 0:
            raise ValueError(f"the compilation cache's max_bytes must be positive, got "
                             f"{max_bytes}")
        self.directory = os.fspath(directory)
        self.max_bytes = int(max_bytes)
        os.makedirs(self.directory, exist_ok=True)
        # The plugin's identity is part of every key: remember its library's digest here too,
        # so that a warm start does not read the library again.
        serialization.library_digests.remember_in(self.directory)

    @staticmethod
    def key(program: bytes, serialized_options: bytes, identity: PluginIdentity) -> str:
        """The entry name for ``program`` compiled with these options by this plugin build."""
        digest = hashlib.sha256(_KEY_VERSION)
        for part in (program, serialized_options,
                     repr(sorted(identity.to_header().items())).encode("utf-8")):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + _SUFFIX)

    def get(self, key: str) -> bytes | None:
        """The entry's bytes, or None on a miss; a hit marks the entry recently used."""
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                blob = file.read()
        except FileNotFoundError:
            logger.debug("compilation cache miss %s", key[:16])
            return None
        except OSError as error:
            logger.warning("compilation cache entry %s cannot be read (%s); compiling", path,
                           error)
            return None
        try:
            os.utime(path)
        except OSError:
            pass  # evicted by another process meanwhile: the bytes read are still whole
        logger.debug("compilation cache hit %s (%d bytes)", key[:16], len(blob))
        return blob

    def put(self, key: str, blob: bytes) -> None:
        """Store an entry (atomically), then trim the directory to ``max_bytes``.

        An entry larger than ``max_bytes`` is not stored. Failures to write are logged, not
        raised: the cache only ever saves time.
        """
        if len(blob) > self.max_bytes:
            logger.debug("compilation cache: %s is %d bytes, over the %d-byte bound; not "
                         "stored", key[:16], len(blob), self.max_bytes)
            return
        try:
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-",
                                                 suffix=_SUFFIX)
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(blob)
                os.replace(temporary, self._path(key))
            except BaseException:
                _remove(temporary)
                raise
        except OSError as error:
            logger.warning("compilation cache: cannot store %s in %s (%s)", key[:16],
                           self.directory, error)
            return
        logger.debug("compilation cache stored %s (%d bytes)", key[:16], len(blob))
        self.evict()

    def discard(self, key: str) -> None:
        """Remove an entry (one that failed to load)."""
        _remove(self._path(key))

    def entries(self) -> list[tuple[str, int, float]]:
        """``(path, size, mtime)`` of every entry, least recently used first."""
        found = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not name.endswith(_SUFFIX) or name.startswith(".tmp-"):
                continue
            path = os.path.join(self.directory, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue  # removed by another process
            found.append((path, stat.st_size, stat.st_mtime))
        found.sort(key=lambda entry: entry[2])
        return found

    def evict(self) -> None:
        """Delete the least recently used entries until the rest fit in ``max_bytes``."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for path, size, _ in entries:
            if total <= self.max_bytes:
                break
            _remove(path)
            total -= size
            logger.debug("compilation cache evicted %s (%d bytes)", os.path.basename(path),
                         size)

    def clear(self) -> None:
        """Delete every entry."""
        for path, _, _ in self.entries():
            _remove(path)

    def __repr__(self) -> str:
        return f"CompilationCache({self.directory!r}, max_bytes={self.max_bytes})"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


_lock = threading.Lock()
#: The cache set by set_compilation_cache_dir; _UNSET while the environment decides.
_UNSET = object()
_explicit: object = _UNSET
_from_env: tuple[str, str, CompilationCache | None] | None = None


def set_compilation_cache_dir(directory: str | os.PathLike | None, *,
                              max_bytes: int | None = None) -> CompilationCache | None:
    """Cache compiled executables in ``directory`` from now on, in this process; None turns
    the cache off (``PJRT_COMPILATION_CACHE_DIR`` is then ignored too).

    Args:
      directory: the cache directory, created if missing; None disables caching.
      max_bytes: the size bound (default ``PJRT_COMPILATION_CACHE_MAX_BYTES`` or 1 GiB).

    Returns:
      The cache now in use, or None.

    Raises:
      ValueError: ``max_bytes`` is not positive.
      OSError: the directory cannot be created.
    """
    global _explicit
    cache = None
    if directory is not None:
        cache = CompilationCache(directory, max_bytes if max_bytes is not None
                                 else _env_max_bytes())
    else:
        serialization.library_digests.remember_in(None)
    with _lock:
        _explicit = cache
    return cache


def get_compilation_cache() -> CompilationCache | None:
    """The cache compiles use: the one set by :func:`set_compilation_cache_dir`, else the
    directory ``PJRT_COMPILATION_CACHE_DIR`` names, else None."""
    global _from_env
    explicit = _explicit
    if explicit is not _UNSET:
        return cast("CompilationCache | None", explicit)
    directory = os.environ.get(CACHE_DIR_ENV, "")
    limit = os.environ.get(MAX_BYTES_ENV, "")
    known = _from_env
    if known is not None and known[0] == directory and known[1] == limit:
        return known[2]
    cache = None
    if directory:
        try:
            cache = CompilationCache(directory, _env_max_bytes())
        except (OSError, ValueError) as error:
            logger.warning("%s=%s cannot be used (%s); compiling without a cache",
                           CACHE_DIR_ENV, directory, error)
    with _lock:
        _from_env = (directory, limit, cache)
    return cache


def _env_max_bytes() -> int:
    text = os.environ.get(MAX_BYTES_ENV, "")
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV}={text!r} is not a number of bytes") from None
    if value <= 0:
        raise ValueError(f"{MAX_BYTES_ENV}={text!r} must be positive")
    return value
