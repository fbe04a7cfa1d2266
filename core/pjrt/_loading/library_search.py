"""Which of a shared library's dependencies the dynamic loader would not find, found without
loading it.

When ``dlopen`` fails on a missing dependency it names the first one it missed and stops; a
plugin built against a vendor's SDK often misses a dozen, so an operator fixing them one at a
time goes round a dozen times. `missing_libraries` walks the library's whole
``DT_NEEDED`` tree as the loader would (as ``ldd`` does, but without running the loader or
mapping the files: only the ELF headers are read, by `pjrt._loading.elf.read_dynamic_links`)
and returns every name it cannot find, each with the package that provides it where
`pjrt._loading.library_providers` knows it.

The search follows glibc's order for each needed name of an object:

1. a name with a slash is a path, tried as it is;
2. the ``DT_RPATH`` of the object and of the objects that loaded it, when the object has no
   ``DT_RUNPATH`` (and the program's own ``DT_RPATH`` under the same rule);
3. ``LD_LIBRARY_PATH``;
4. the object's own ``DT_RUNPATH``;
5. ``/etc/ld.so.cache`` (read directly; ``ldconfig -p`` when it cannot be parsed);
6. the standard directories.

``$ORIGIN`` (the directory of the object, after symbolic links are resolved), ``$LIB`` and
``$PLATFORM`` are expanded. A candidate file that is not a shared object for this process
(another machine, 32-bit) is passed over, as the loader passes it over. A name already
mapped into this process counts as found, as the loader reuses a loaded object with that name.

What this cannot see: the dependencies of a library that is missing (they are known only once
it is installed), and ``glibc-hwcaps`` subdirectories outside the cache.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from typing import Mapping
from dataclasses import dataclass
from functools import lru_cache

from . import elf as _elf
from . import library_providers as _library_providers

_CACHE_FILE = "/etc/ld.so.cache"
_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
#: The new-format header: magic, nlibs, len_strings, flags, 3 pad bytes, extension offset,
#: 3 unused words; then nlibs entries of (flags, key, value, osversion, hwcap).
_CACHE_HEADER = struct.Struct("<20sIIB3xI12x")
_CACHE_ENTRY = struct.Struct("<iIIIQ")
#: How many objects the walk reads at most: plugins need a few dozen; more is a loop or a
#: pathological tree, and the report stays a report.
_MAX_OBJECTS = 2000


@dataclass(frozen=True)
class MissingLibrary:
    """A dependency the loader cannot find.

    Attributes:
      name: the name as the needing library writes it (e.g. ``libcupti.so.12``).
      needed_by: the path of the first library found to need it.
      provider: the pip package or system component that provides it, in words; None where
        pjrt does not know.
      pip_package: the pip package to install for it, when it is one.
      is_driver: whether it comes with the accelerator's driver (a missing driver is the
        first thing to fix: without it nothing else matters).
    """

    name: str
    needed_by: str
    provider: str | None = None
    pip_package: str | None = None
    is_driver: bool = False


def missing_libraries(path: str, *, environ: Mapping[str, str] | None = None,
                      loaded: frozenset[str] | None = None) -> list[MissingLibrary]:
    """Every library in ``path``'s dependency tree that the dynamic loader would not find.

    Args:
      path: a shared library (typically a plugin whose ``dlopen`` failed).
      environ: the environment whose ``LD_LIBRARY_PATH`` counts; this process's by default.
      loaded: names that count as found because an object of that name is already in the
        process; those mapped into this process by default.

    Returns:
      The missing libraries, drivers first, then in the order the loader would have met them;
      each named once. Empty when everything is found (or ``path`` cannot be read).
    """
    environ = os.environ if environ is None else environ
    loaded = _loaded_names() if loaded is None else loaded
    search = _Search(environ.get("LD_LIBRARY_PATH", ""), loaded)
    missing = search.walk(os.path.abspath(path))
    cuda = _library_providers.cuda_major(search.names_seen)
    report = []
    for name, needed_by in missing:
        known = _library_providers.provider(name, cuda)
        report.append(MissingLibrary(name, needed_by) if known is None else MissingLibrary(
            name, needed_by, known.description, known.pip_package, known.is_driver))
    return sorted(report, key=lambda library: not library.is_driver)  # stable: drivers first


def format_missing(missing: list[MissingLibrary]) -> str:
    """The missing libraries grouped by what provides them, one group a line (ending with
    ``;``), drivers first, then a ``pip install`` line for those that pip provides."""
    groups: dict[str, list[str]] = {}
    for library in missing:
        groups.setdefault(library.provider or "provider not known to pjrt", []).append(
            library.name)
    lines = [f"  {provider}: {', '.join(names)}" for provider, names in groups.items()]
    packages = list(dict.fromkeys(library.pip_package for library in missing
                                  if library.pip_package))
    if packages:
        lines.append(f"  (pip install {' '.join(packages)})")
    # Each group ends with ';' so that the list still reads right when a log joins its lines.
    return ";\n".join(lines) + "."


class _Search:
    """One walk of a dependency tree, breadth first, as the loader loads it."""

    def __init__(self, ld_library_path: str, loaded: frozenset[str]):
        self.ld_library_path = _split_path(ld_library_path)
        self.resolved: set[str] = set(loaded)  # names the process would reuse
        self.names_seen: list[str] = []

    def walk(self, root: str) -> list[tuple[str, str]]:
        missing: dict[str, str] = {}
        program = _program_rpath()
        links = _elf.read_dynamic_links(root)
        if links is None:
            return []
        # (object path, its links, the chain of loaders' RPATH lists, nearest first)
        queue: list[tuple[str, _elf.DynamicLinks, tuple[str, ...]]] = [(root, links, ())]
        read = 0
        while queue and read < _MAX_OBJECTS:
            owner, owner_links, chain = queue.pop(0)
            read += 1
            rpaths = _rpath_dirs(owner, owner_links) + chain
            # The directories before the cache, in the loader's order, expanded once.
            directories = [] if owner_links.runpath else list(rpaths + program)
            directories += self.ld_library_path
            directories += _expand_all(owner_links.runpath, owner)
            for name in owner_links.needed:
                self.names_seen.append(name)
                if name in self.resolved or name in missing:
                    continue
                found = self._find(name, directories)
                if found is None:
                    missing[name] = owner
                    continue
                self.resolved.add(name)
                self.resolved.add(os.path.basename(found[0]))
                queue.append((found[0], found[1], rpaths))
        return list(missing.items())

    @staticmethod
    def _find(name: str, directories: list[str]) -> tuple[str, _elf.DynamicLinks] | None:
        """Where the loader finds ``name``: a path as it is; else the first usable file in
        ``directories`` (the RPATHs, unless DT_RUNPATH switches them off, LD_LIBRARY_PATH,
        the RUNPATH), the cache, the standard directories."""
        if "/" in name:
            return _usable(name)
        for directory in directories:
            found = _usable(os.path.join(directory, name))
            if found:
                return found
        for candidate in _cache().get(name, ()):
            found = _usable(candidate)
            if found:
                return found
        for directory in _standard_directories():
            found = _usable(os.path.join(directory, name))
            if found:
                return found
        return None


def _usable(candidate: str) -> tuple[str, _elf.DynamicLinks] | None:
    """``(path, links)`` if ``candidate`` is a file the loader would take for this process."""
    if not os.path.isfile(candidate):
        return None
    links = _elf.read_dynamic_links(candidate)
    return (candidate, links) if links is not None else None


def _rpath_dirs(owner: str, links: _elf.DynamicLinks) -> tuple[str, ...]:
    """The object's DT_RPATH directories, expanded; none when it has DT_RUNPATH."""
    if links.runpath:
        return ()
    return tuple(_expand_all(links.rpath, owner))


@lru_cache(maxsize=1)
def _program_rpath() -> tuple[str, ...]:
    """The DT_RPATH of the running program (the loader searches it for every object)."""
    program = os.path.realpath(sys.executable)
    links = _elf.read_dynamic_links(program)
    return _rpath_dirs(program, links) if links else ()


def _expand_all(entries: tuple[str, ...], owner: str) -> list[str]:
    """Search-path entries with the loader's dynamic string tokens replaced; ``$ORIGIN`` is
    the directory of ``owner`` once its symbolic links are resolved."""
    origin = os.path.dirname(os.path.realpath(owner)) if entries else ""
    return [_expand(entry, origin) for entry in entries if entry]


def _expand(entry: str, origin: str) -> str:
    for token, value in (("ORIGIN", origin), ("LIB", _lib_token()),
                         ("PLATFORM", os.uname().machine)):
        entry = entry.replace("${" + token + "}", value).replace("$" + token, value)
    return entry


def _lib_token() -> str:
    """What glibc's ``$LIB`` expands to here: ``lib64`` on 64-bit systems without multiarch."""
    multiarch = f"lib/{_multiarch()}" if _multiarch() else ""
    return multiarch if multiarch and os.path.isdir("/" + multiarch) else "lib64"


def _multiarch() -> str:
    import sysconfig
    return sysconfig.get_config_var("MULTIARCH") or ""


def _split_path(value: str) -> list[str]:
    # glibc splits LD_LIBRARY_PATH on ':' and ';'; an empty entry is the current directory.
    return [entry or "." for entry in value.replace(";", ":").split(":")] if value else []


@lru_cache(maxsize=1)
def _standard_directories() -> tuple[str, ...]:
    """The directories the loader searches last, for a 64-bit process."""
    multiarch = _multiarch()
    directories = [f"/lib/{multiarch}", f"/usr/lib/{multiarch}"] if multiarch else []
    directories += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return tuple(directories)


def _loaded_names() -> frozenset[str]:
    """Base names of the shared objects mapped into this process."""
    names = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if ".so" in path:
                    names.add(os.path.basename("/" + path))
    except OSError:
        pass
    return frozenset(names)


def _cache() -> dict[str, tuple[str, ...]]:
    """The loader's cache: name to the paths recorded for it (every machine's; the caller
    passes over files that are not for this one)."""
    try:
        stat = os.stat(_CACHE_FILE)
    except OSError:
        return {}
    return _read_cache(_CACHE_FILE, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _read_cache(path: str, _mtime: int, _size: int) -> dict[str, tuple[str, ...]]:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return {}
    entries = _parse_cache(data)
    return entries if entries is not None else _ldconfig_listing()


def _parse_cache(data: bytes) -> dict[str, tuple[str, ...]] | None:
    """The new-format (glibc 2.32 and later, or appended to the old format) cache; None when
    ``data`` holds none or it is corrupt."""
    start = data.find(_CACHE_MAGIC)
    if start < 0 or len(data) < start + _CACHE_HEADER.size:
        return None
    _magic, count, _strings, _flags, _extension = _CACHE_HEADER.unpack_from(data, start)
    table = start + _CACHE_HEADER.size
    if table + count * _CACHE_ENTRY.size > len(data):
        return None

    def string(offset: int) -> str | None:
        # Offsets count from the new-format header.
        begin = start + offset
        end = data.find(b"\0", begin)
        if not 0 <= begin < len(data) or end < 0:
            return None
        return os.fsdecode(data[begin:end])

    entries: dict[str, list[str]] = {}
    for index in range(count):
        _eflags, key, value, _osversion, _hwcap = _CACHE_ENTRY.unpack_from(
            data, table + index * _CACHE_ENTRY.size)
        name, target = string(key), string(value)
        if name is None or target is None:
            return None
        entries.setdefault(name, []).append(target)
    return {name: tuple(paths) for name, paths in entries.items()}


def _ldconfig_listing() -> dict[str, tuple[str, ...]]:
    """The cache as ``ldconfig -p`` prints it, for a cache format not parsed here."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,
                                     timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        entries: dict[str, list[str]] = {}
        for line in listing.splitlines():
            name, arrow, target = line.strip().partition(" => ")
            if arrow:
                entries.setdefault(name.split(" (")[0], []).append(target.strip())
        return {name: tuple(paths) for name, paths in entries.items()}
    return {}
