"""Serialized executables that say which plugin build made them.

The bytes a plugin writes for a compiled executable (``PJRT_Executable_Serialize``) are only
meaningful to that same build of that plugin: another build may accept them and run something
else, returning wrong numbers without any error. So pjrt wraps them in a small envelope that
records the [`PluginIdentity`][pjrt.compilation_cache.PluginIdentity] of the producer, and `unpack` refuses bytes whose
producer is not the plugin now loading them.

Envelope format (version 1), all integers big-endian::

    offset  size  field
    0       8     magic, b"PJRTEXE\\x00"
    8       2     format version (unsigned), 1
    10      4     header length H (unsigned)
    14      H     header: a UTF-8 JSON object, see below
    14+H    ...   payload: the plugin's own serialized executable, exactly ``payload_size`` bytes

The header's keys:

* ``platform``: the platform name (``PJRT_Client_PlatformName``), e.g. ``"cpu"``;
* ``platform_version``: ``PJRT_Client_PlatformVersion`` (for a topology,
  ``PJRT_TopologyDescription_PlatformVersion``);
* ``api_version``: ``[major, minor]``, the PJRT C API version the plugin reports;
* ``library_sha256``: hex SHA-256 of the plugin's library file, or null for a plugin handed
  over in memory;
* ``library``: the library's file name, for messages only (never compared);
* ``payload_size`` and ``payload_sha256``: the payload's length and hex SHA-256, so a truncated
  or damaged envelope is reported instead of being handed to the plugin.

Readers ignore header keys they do not know; a change that older readers cannot ignore bumps
the format version.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
from typing import Any

from .._pjrt_cffi import ffi
from ..errors import IncompatibleExecutableError
from ..plugin import Plugin

#: The first bytes of every envelope.
MAGIC = b"PJRTEXE\x00"
#: The envelope format this module writes (and the newest it reads).
FORMAT_VERSION = 1

_PREFIX = struct.Struct(">8sHI")  # magic, format version, header length
#: Headers are a few hundred bytes; a larger length means the bytes are not an envelope.
_MAX_HEADER = 1 << 20


@dataclasses.dataclass(frozen=True)
class PluginIdentity:
    """What identifies the build of a plugin that made (or is loading) an executable.

    Attributes:
      platform: the platform name, e.g. ``"cpu"``.
      platform_version: the plugin's platform version string.
      api_version: ``(major, minor)`` PJRT C API version the plugin reports.
      library_sha256: hex SHA-256 of the plugin's library file; None when the plugin was handed
        over in memory, whose build therefore cannot be verified.
      library: the library's file name, shown in messages; not part of the identity, since the
        same build may be installed under different paths.
    """

    platform: str
    platform_version: str
    api_version: tuple[int, int]
    library_sha256: str | None
    library: str | None = dataclasses.field(default=None, compare=False)

    @property
    def verifiable(self) -> bool:
        """Whether the build is pinned by a library hash (False for in-memory plugins)."""
        return self.library_sha256 is not None

    def describe(self) -> str:
        """A one-line description for messages."""
        major, minor = self.api_version
        build = (f"library sha256 {self.library_sha256[:16]}..." if self.library_sha256
                 else "library handed over in memory, build unknown")
        where = f"{self.library}, " if self.library else ""
        return (f"platform {self.platform!r} version {self.platform_version!r}, PJRT API "
                f"{major}.{minor}, {where}{build}")

    def to_header(self) -> dict:
        """The identity's fields as the envelope header stores them."""
        return {"platform": self.platform, "platform_version": self.platform_version,
                "api_version": list(self.api_version), "library_sha256": self.library_sha256,
                "library": self.library}


class DigestCache:
    """SHA-256 digests of library files, each computed at most once per file version.

    A file is known by its real path, size and modification time: a library replaced on disk
    is hashed again, the same one reached through a symlink is not. ``computed`` counts the
    files actually read.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._digests: dict[tuple, str] = {}
        self.computed = 0
        #: A directory where digests are also remembered across processes (see
        #: `remember_in`), or None.
        self.memo_directory: str | None = None

    def remember_in(self, directory: str | os.PathLike | None) -> None:
        """Also keep digests in ``directory`` (None: only in this process), so that a new
        process does not read a 100+ MB library again; the persistent compilation cache keeps
        them beside its entries. A file is still known by its path, size and modification
        time, so a library replaced on disk is hashed again."""
        self.memo_directory = None if directory is None else os.fspath(directory)

    def digest(self, path: str | os.PathLike) -> str:
        """The hex SHA-256 of the file at ``path`` (read only if not cached).

        Raises:
          OSError: the file cannot be read.
        """
        real = os.path.realpath(path)
        stat = os.stat(real)
        key = (real, stat.st_size, stat.st_mtime_ns)
        digest = self._digests.get(key)
        if digest is not None:
            return digest
        # One lock for all files: two threads serializing at once hash a library only once.
        with self._lock:
            digest = self._digests.get(key)
            if digest is None:
                digest = self._remembered(key)
                if digest is None:
                    digest = _file_sha256(real)
                    self.computed += 1
                    self._remember(key, digest)
                self._digests[key] = digest
        return digest

    def _memo_path(self, key: tuple) -> str | None:
        if self.memo_directory is None:
            return None
        name = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:32]
        return os.path.join(self.memo_directory, f"library-{name}.sha256")

    def _remembered(self, key: tuple) -> str | None:
        path = self._memo_path(key)
        try:
            with open(path, encoding="ascii") as file:  # type: ignore[arg-type]
                text = file.read().strip()
        except (OSError, TypeError, UnicodeDecodeError):
            return None
        return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None

    def _remember(self, key: tuple, digest: str) -> None:
        path = self._memo_path(key)
        if path is None:
            return
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="ascii") as file:
                file.write(digest)
            os.replace(temporary, path)  # whole or absent, whoever writes at the same time
        except OSError:
            pass  # remembering is an optimisation: the digest stays right without it

    def __contains__(self, path: str | os.PathLike) -> bool:
        real = os.path.realpath(path)
        stat = os.stat(real)
        return (real, stat.st_size, stat.st_mtime_ns) in self._digests


def _file_sha256(path: str) -> str:
    with open(path, "rb") as file:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+: reads without Python-level copies
            return hashlib.file_digest(file, "sha256").hexdigest()
        digest = hashlib.sha256()
        chunk = bytearray(1 << 20)
        view = memoryview(chunk)
        while True:
            size = file.readinto(chunk)
            if not size:
                return digest.hexdigest()
            digest.update(view[:size])


#: The process-wide cache `plugin_identity` uses.
library_digests = DigestCache()


def plugin_identity(plugin: Plugin, platform: str, platform_version: str) -> PluginIdentity:
    """The identity of ``plugin`` as a client (or topology) of it reports itself.

    The library is hashed the first time this is asked for it in the process (a few tenths of
    a second for a 250 MB library), never when the plugin is loaded.

    Raises:
      OSError: the plugin's library file can no longer be read.
    """
    path = plugin.library_path
    return PluginIdentity(
        platform=platform, platform_version=platform_version,
        api_version=tuple(plugin.api_version),  # pyright: ignore[reportArgumentType]
        library_sha256=library_digests.digest(path) if path is not None else None,
        library=os.path.basename(path) if path is not None else None)


def pack(payload: bytes, identity: PluginIdentity) -> bytes:
    """Wrap a plugin's serialized executable in an envelope naming ``identity`` as its maker."""
    payload = bytes(payload)
    header = identity.to_header()
    header["payload_size"] = len(payload)
    header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(encoded)) + encoded + payload


def is_packed(blob: bytes) -> bool:
    """Whether ``blob`` starts like an envelope (it may still be damaged or truncated, even
    to a few bytes of the marker)."""
    head = bytes(blob[:len(MAGIC)])
    return bool(head) and MAGIC.startswith(head)


def read_identity(blob: bytes) -> PluginIdentity:
    """The identity recorded in an envelope, without comparing it to anything.

    Raises:
      ValueError: ``blob`` is not an envelope, or is truncated or damaged.
    """
    identity, _ = _open(blob)
    return identity


def unpack(blob: bytes, identity: PluginIdentity, *, trust_unverified: bool = False) -> bytes:
    """The plugin's serialized executable inside ``blob``, if ``identity`` may load it.

    Args:
      blob: bytes written by `pack` (``LoadedExecutable.serialize()``).
      identity: the plugin that is about to load the executable.
      trust_unverified: you vouch that these bytes were produced by this exact plugin build.
        Accepts bytes without an envelope (e.g. written by another program) and envelopes
        whose maker or loader cannot be verified (a plugin handed over in memory). An
        envelope that names a different build is refused all the same. The plugin trusts
        such bytes too: damaged or hostile ones can crash the process or run a wrong
        program; load bytes from elsewhere with ``isolate=True`` (see
        `pjrt._compile.isolated_compile`), never with this flag alone.

    Raises:
      IncompatibleExecutableError: another plugin build made the executable, or its maker
        cannot be verified and ``trust_unverified`` is not set; the message names both.
      ValueError: the envelope is truncated or damaged.
    """
    if not is_packed(blob):
        if trust_unverified:
            return bytes(blob)
        raise IncompatibleExecutableError(
            f"these {len(blob)} bytes are not a serialized executable written by pjrt (they "
            f"lack its header), so the plugin build that made them is unknown; loading them "
            f"with another build can run the wrong program silently. Loading with: "
            f"{identity.describe()}. Recompile the program with this plugin, or, if you know "
            f"this exact plugin build produced them, pass trust_unverified=True.",
            made_by=None, loading_with=identity)
    made_by, payload = _open(blob)
    if made_by == identity and identity.verifiable:
        return payload
    unhashed = dataclasses.replace(made_by, library_sha256=None)
    if unhashed != dataclasses.replace(identity, library_sha256=None) or (
            made_by.verifiable and identity.verifiable):
        raise IncompatibleExecutableError(
            f"this executable was compiled by a different plugin build than the one loading "
            f"it, and may run the wrong program without any error. Made by: {made_by.describe()}. Loading with: "
            f"{identity.describe()}. Recompile the program with this plugin, or load the "
            f"executable with the plugin that made it.",
            made_by=made_by, loading_with=identity)
    if not trust_unverified:
        raise IncompatibleExecutableError(
            f"the plugin build cannot be verified because a plugin handed over in memory has no "
            f"library to hash. Made by: {made_by.describe()}. Loading with: "
            f"{identity.describe()}. Recompile the program with this plugin, or, if you know "
            f"this exact plugin build produced it, pass trust_unverified=True.",
            made_by=made_by, loading_with=identity)
    return payload


def _open(blob: bytes | memoryview) -> tuple[PluginIdentity, bytes]:
    """Split an envelope into its identity and payload, checking every field."""
    blob = memoryview(blob).cast("B") if not isinstance(blob, bytes) else blob
    if len(blob) < _PREFIX.size:
        raise _damaged(f"it is {len(blob)} bytes long, shorter than the envelope's "
                       f"{_PREFIX.size}-byte prefix")
    magic, version, header_size = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise _damaged("it does not start with pjrt's envelope marker")
    if version != FORMAT_VERSION:
        newer = " (written by a newer pjrt; upgrade pjrt to read it)" if version > FORMAT_VERSION \
            else ""
        raise ValueError(f"serialized executable envelope has format version {version}; this "
                         f"pjrt reads version {FORMAT_VERSION}{newer}")
    if header_size > _MAX_HEADER or _PREFIX.size + header_size > len(blob):
        raise _damaged(f"its header claims {header_size} bytes but only "
                       f"{len(blob) - _PREFIX.size} follow the prefix")
    header_bytes = bytes(blob[_PREFIX.size:_PREFIX.size + header_size])
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise _damaged(f"its header is not valid JSON ({error})") from None
    identity, payload_size, payload_sha256 = _header_fields(header)
    payload = bytes(blob[_PREFIX.size + header_size:])
    if len(payload) != payload_size:
        raise _damaged(f"its header announces a {payload_size}-byte executable but "
                       f"{len(payload)} bytes follow (truncated or padded)")
    if hashlib.sha256(payload).hexdigest() != payload_sha256:
        raise _damaged("the executable's bytes do not match the checksum in its header")
    return identity, payload


def _header_fields(header) -> tuple[PluginIdentity, int, str]:
    """The identity, payload size and payload checksum of a decoded header, type-checked."""
    if not isinstance(header, dict):
        raise _damaged("its header is not a JSON object")

    def field(name: str, types: type | tuple[type, ...], nullable: bool = False) -> Any:
        value = header.get(name)
        if value is None and nullable:
            return None
        if not isinstance(value, types) or isinstance(value, bool):
            raise _damaged(f"its header field {name!r} is missing or has the wrong type")
        return value

    api_version = field("api_version", list)
    if len(api_version) != 2 or not all(type(part) is int for part in api_version):
        raise _damaged("its header field 'api_version' is not [major, minor]")
    identity = PluginIdentity(
        platform=field("platform", str), platform_version=field("platform_version", str),
        api_version=(api_version[0], api_version[1]),
        library_sha256=field("library_sha256", str, nullable=True),
        library=field("library", str, nullable=True))
    payload_size = field("payload_size", int)
    if payload_size < 0:
        raise _damaged("its header field 'payload_size' is negative")
    return identity, payload_size, field("payload_sha256", str)


def _damaged(why: str) -> ValueError:
    return ValueError(f"the serialized executable is truncated or damaged: {why}. Serialize it "
                      f"again from the compiled program (LoadedExecutable.serialize()).")


def executable_bytes(api, executable) -> bytes:
    """The plugin's own bytes for a ``PJRT_Executable`` (``PJRT_Executable_Serialize``), to
    be wrapped by `pack`."""
    args = api.call_new("PJRT_Executable_Serialize", executable=executable)
    try:
        return ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
    finally:
        if args.serialized_executable_deleter != ffi.NULL:
            args.serialized_executable_deleter(args.serialized_executable)
