"""A persistent compilation cache: compiled executables kept on disk across processes.

Set ``PJRT_COMPILATION_CACHE_DIR`` (or call [`set_compilation_cache_dir`][pjrt.compilation_cache.set_compilation_cache_dir]) and every
compile looks there first. An entry is found by a key that hashes everything the compiled
code depends on:

* the program's bytes (text or bytecode, as given);
* the serialized compile options (they hold the device assignment, so the device ids are in
  the key, and the replica/partition counts and every build option);
* the identity of the plugin build ([`PluginIdentity`][pjrt.compilation_cache.PluginIdentity]: platform,
  platform version, PJRT API version and the SHA-256 of the plugin's library);
* the devices compiled for (their ids and kinds) and how many devices the client has;
* the environment that changes what the compiler makes ([`compile_environment`][pjrt.compilation_cache.compile_environment]):
  ``XLA_FLAGS`` (``--xla_cpu_enable_fast_math`` changes what ``maximum(NaN, 1)`` returns) and
  every other variable whose name starts with one of `COMPILE_ENVIRONMENT_PREFIXES`
  (``XLA_``, ``TF_``: XLA's plugins read their debug and tuning switches from those), except
  the logging-only ones in `COMPILE_ENVIRONMENT_IGNORED`;
* pjrt's own version (it chooses the options and rewrites programs before compiling).

An entry file is a 48-byte header (the marker ``b"PJRTCCE1"``, the entry's key as 32 raw
bytes, the payload's length as 8 bytes, big-endian) followed by what
`LoadedExecutable.serialize` writes: the plugin's bytes inside pjrt's envelope naming the
plugin build. So an entry copied or renamed under another key is refused (it would run the
other program), so is one made by another build, and a truncated one. Reads are bounded by the
declared length and the cache's size bound, and only regular files are read (an entry that is
a link to ``/dev/zero`` or a FIFO is refused, not read until memory runs out); a refused entry
is deleted and the program compiled again. Plugins handed over in memory have no library
to hash, so their compiles are never cached.

Several processes may share a directory: entries are written to a temporary file and moved
into place with `os.replace` (atomic on POSIX and Windows), so a reader sees a whole
entry or none. The directory is kept under a size bound by deleting the entries used least
recently (a hit refreshes an entry's modification time).

Hits, misses and evictions are logged at DEBUG level on this module's logger; entries that
cannot be read or loaded at WARNING.
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat as stat_module
import struct
import tempfile
import threading
from typing import cast

from . import _version
from ._profiling import recorder
from ._runtime import serialization
# Re-exported, its public home: the plugin build a cache entry and a serialized executable
# name (IncompatibleExecutableError's made_by and loading_with).
from ._runtime.serialization import PluginIdentity as PluginIdentity

logger = logging.getLogger(__name__)

__all__ = ["CompilationCache", "get_compilation_cache", "set_compilation_cache_dir",
           "compile_environment", "CACHE_DIR_ENV", "MAX_BYTES_ENV", "DEFAULT_MAX_BYTES",
           "COMPILE_ENVIRONMENT_PREFIXES", "COMPILE_ENVIRONMENT_IGNORED", "PluginIdentity"]

#: The environment variable naming the cache directory.
CACHE_DIR_ENV = "PJRT_COMPILATION_CACHE_DIR"
#: The environment variable bounding the directory's size in bytes.
MAX_BYTES_ENV = "PJRT_COMPILATION_CACHE_MAX_BYTES"
#: The default bound: 1 GiB.
DEFAULT_MAX_BYTES = 1 << 30

#: Environment variables whose names start with one of these are part of every key: XLA's
#: plugins read compiler switches from ``XLA_FLAGS`` and other ``XLA_*`` and ``TF_*`` names.
COMPILE_ENVIRONMENT_PREFIXES = ("XLA_", "TF_")
#: ... except these, which only change what the plugin logs.
COMPILE_ENVIRONMENT_IGNORED = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE",
                               "TF_CPP_LOG_THREAD_ID", "TF_CPP_MIN_VLOG_LEVEL")

_SUFFIX = ".pjrtexe"
#: Bumped when the key's recipe changes, so that old entries are never found.
_KEY_VERSION = b"pjrt-compilation-cache-2"
#: An entry's header: marker, key (raw SHA-256), payload length.
_ENTRY_HEADER = struct.Struct(">8s32sQ")
_ENTRY_MARKER = b"PJRTCCE1"


def compile_environment(environ=None) -> tuple[tuple[str, str], ...]:
    """The environment variables that change what a plugin compiles, sorted: ``XLA_FLAGS``
    and the other names with a prefix in `COMPILE_ENVIRONMENT_PREFIXES`, less
    `COMPILE_ENVIRONMENT_IGNORED`."""
    environ = os.environ if environ is None else environ
    return tuple(sorted((name, value) for name, value in environ.items()
                        if name.startswith(COMPILE_ENVIRONMENT_PREFIXES)
                        and name not in COMPILE_ENVIRONMENT_IGNORED))


def _stored_key(key: str) -> bytes:
    """What an entry's header holds of its key: 32 bytes, whatever the key's spelling."""
    return hashlib.sha256(key.encode("utf-8")).digest()


class _RefusedEntry(Exception):
    """An entry that is not what its name says: the reason is the message."""


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
    def key(program: bytes, serialized_options: bytes, identity: PluginIdentity,
            devices: str = "", environment: tuple | None = None) -> str:
        """The entry name for ``program`` compiled with these options by this plugin build,
        for ``devices`` (a description of the devices compiled for), under ``environment``
        (default: [`compile_environment`][pjrt.compilation_cache.compile_environment] now)."""
        if environment is None:
            environment = compile_environment()
        digest = hashlib.sha256(_KEY_VERSION)
        for part in (program, serialized_options,
                     repr(sorted(identity.to_header().items())).encode("utf-8"),
                     devices.encode("utf-8"), repr(environment).encode("utf-8"),
                     _version.__version__.encode("utf-8")):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + _SUFFIX)

    def get(self, key: str) -> bytes | None:
        """The entry's bytes, or None on a miss; a hit marks the entry recently used.

        An entry that is not a regular file, is larger than the size bound, was written under
        another key, or is truncated is logged, deleted and reported as a miss.
        """
        path = self._path(key)
        recorder.annotate("cache", "miss", "compile")  # a trace's compile event says which
        try:
            blob = self._read(path, key)
        except FileNotFoundError:
            logger.debug("compilation cache miss %s", key[:16])
            return None
        except _RefusedEntry as error:
            logger.warning("compilation cache entry %s is refused (%s); compiling again", path,
                           error)
            _remove(path)
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
        recorder.annotate("cache", "hit", "compile")
        return blob

    def _read(self, path: str, key: str) -> bytes:
        """The payload of the entry at ``path``, checked against ``key``; reads at most the
        length the entry declares (and never more than the size bound)."""
        # O_NONBLOCK: opening a FIFO planted as an entry must not wait for a writer.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        descriptor = os.open(path, flags)
        with os.fdopen(descriptor, "rb", buffering=0) as file:
            info = os.fstat(descriptor)
            if not stat_module.S_ISREG(info.st_mode):
                raise _RefusedEntry("it is not a regular file")
            if info.st_size > self.max_bytes + _ENTRY_HEADER.size:
                raise _RefusedEntry(f"it is {info.st_size} bytes, over the cache's "
                                    f"{self.max_bytes}-byte bound")
            header = file.read(_ENTRY_HEADER.size)
            if len(header) < _ENTRY_HEADER.size:
                raise _RefusedEntry(f"it is truncated ({len(header)} bytes, shorter than "
                                    f"an entry's header)")
            marker, stored_key, size = _ENTRY_HEADER.unpack(header)
            if marker != _ENTRY_MARKER:
                raise _RefusedEntry("it does not start with a compilation cache entry's marker")
            if stored_key != _stored_key(key):
                raise _RefusedEntry("it was stored under another key: it holds another "
                                    "program or compile")
            if size != info.st_size - _ENTRY_HEADER.size:
                raise _RefusedEntry(f"it declares {size} bytes but holds "
                                    f"{info.st_size - _ENTRY_HEADER.size} (truncated or "
                                    f"padded)")
            blob = file.read(size)
            if len(blob) != size:
                raise _RefusedEntry(f"it declares {size} bytes but only {len(blob)} could be "
                                    f"read (truncated)")
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
                    file.write(_ENTRY_HEADER.pack(_ENTRY_MARKER, _stored_key(key),
                                                  len(blob)))
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
        recorder.annotate("cache", "miss (its entry could not be loaded)", "compile")
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
    """The cache compiles use: the one set by [`set_compilation_cache_dir`][pjrt.compilation_cache.set_compilation_cache_dir], else the
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
