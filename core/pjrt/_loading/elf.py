"""Checks a plugin's shared library file before the dynamic loader is given it.

``dlopen`` trusts the file it maps: a plugin library cut short by a failed download or a full
disk maps pages past the end of the file, and the first touch of one kills the process with
SIGBUS, inside ``dlopen`` itself. A ``GetPjrtApi`` that is a data object, not a function, is
jumped into. Neither can be caught once it has happened, so `check_plugin_library`
reads the ELF headers first and turns each such defect into a
[`PluginLoadError`][pjrt.errors.PluginLoadError] that says what is wrong and what to do.

Only headers and tables are read, with positioned reads (plugins are hundreds of MB): the file
header, the program headers, the dynamic section, and the few hash-table and symbol entries
on the way to ``GetPjrtApi``. That is the same path the dynamic loader takes, so a symbol
found here is the one ``dlsym`` will find.
"""
from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass

from ..errors import PluginLoadError

#: The function every PJRT plugin exports.
ENTRY_POINT = b"GetPjrtApi"

_MAGIC = b"\x7fELF"
_CLASS_64 = 2
_DATA_LITTLE, _DATA_BIG = 1, 2
_TYPE_SHARED = 3
_TYPE_NAMES = {0: "of no type", 1: "a relocatable object (.o), not yet linked",
               2: "an executable", 4: "a core dump"}
#: e_machine values, and the names platform.machine() gives the same machines.
_MACHINES = {62: "x86-64", 183: "aarch64", 21: "ppc64", 22: "s390x", 243: "riscv64"}
_HOST_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21,
                  "ppc64": 21, "s390x": 22, "riscv64": 243}

_PT_LOAD, _PT_DYNAMIC = 1, 2
_PF_X = 1
_DT_NULL, _DT_NEEDED, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ = 0, 1, 4, 5, 6, 10
_DT_RPATH, _DT_RUNPATH = 15, 29
_DT_GNU_HASH = 0x6FFFFEF5
_SHN_UNDEF = 0
_STT_NAMES = {0: "NOTYPE", 1: "OBJECT (data)", 2: "FUNC", 3: "SECTION", 4: "FILE",
              5: "COMMON", 6: "TLS (thread-local data)", 10: "IFUNC"}
_STT_FUNCTIONS = (2, 10)  # a function, or a GNU indirect function (its resolver runs first)

_HEADER_SIZE = 64
_PHDR_SIZE = 56
_SYM_SIZE = 24
#: A dynamic section is a few hundred bytes; more than this is a corrupt header.
_MAX_DYNAMIC_BYTES = 1 << 20
#: Longest hash chain walked; real ones hold a handful of symbols, so more is a loop.
_MAX_CHAIN = 1 << 16
#: Dynamic strings are read in chunks of this many bytes, up to the longest one believed (a
#: search path of a few dozen directories is a few KB; Bazel-built plugins have such paths).
_STRING_CHUNK = 4096
_MAX_STRING = 1 << 20

_REINSTALL = "reinstall the plugin"


class _Defect(Exception):
    """What is wrong with the file, and what to do about it."""

    def __init__(self, what: str, todo: str = _REINSTALL):
        super().__init__(what)
        self.what = what
        self.todo = todo


class _NoEntryPoint(Exception):
    """A sound shared library that does not define GetPjrtApi: not a plugin at all."""


def check_plugin_library(path: str, plugin_name: str) -> None:
    """Check that ``path`` is a shared library this process can load and that it defines
    ``GetPjrtApi`` as a function, reading only its headers and tables.

    Args:
      path: the library file (it exists and is not a directory).
      plugin_name: the name it is being loaded under, for messages.

    Raises:
      PluginLoadError: the file cannot be read, is not an ELF shared library for this
        machine, is truncated (a loadable segment runs past its end), or does not define
        ``GetPjrtApi`` as a function. The message names the file, the defect and the remedy.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise PluginLoadError(f"plugin {plugin_name!r}: {path} cannot be read ({error.strerror}); "
                              f"check its permissions", path=path) from None
    try:
        _ElfFile(fd, os.fstat(fd).st_size).check()
    except _NoEntryPoint:
        raise PluginLoadError(
            f"{path} is a shared library but does not export GetPjrtApi, so it is not a PJRT "
            f"plugin; check the path given for plugin {plugin_name!r}", path=path) from None
    except _Defect as defect:
        raise PluginLoadError(
            f"{path} could not be loaded as a shared library for plugin {plugin_name!r}: "
            f"{defect.what}; {defect.todo}", path=path) from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DynamicLinks:
    """What a shared library's dynamic section tells the loader about finding its dependencies.

    Attributes:
      needed: the DT_NEEDED names, in the order the loader loads them.
      rpath: the DT_RPATH directories, as written (``$ORIGIN`` not expanded).
      runpath: the DT_RUNPATH directories, as written.
    """

    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]


def read_dynamic_links(path: str) -> DynamicLinks | None:
    """The dependencies and search paths of the shared library at ``path``, read from its
    headers without loading it.

    Returns:
      None when the file cannot be read or is not an ELF file the loader would map into this
      process (another machine, 32-bit, another byte order, corrupt): the loader passes over
      such a file and searches on, so callers do the same.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return _ElfFile(fd, os.fstat(fd).st_size).links()
    except (_Defect, OSError, struct.error):
        return None
    finally:
        os.close(fd)


def host_machine() -> int | None:
    """The ELF machine number of this process's machine; None for one not known here."""
    return _HOST_MACHINES.get(os.uname().machine.lower())


def _machine_name(machine: int) -> str:
    return _MACHINES.get(machine, f"ELF machine {machine}")


class _ElfFile:
    """One open library file, read with positioned reads only."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.order = "<"
        self.loads: list[tuple[int, int, int, int, int]] = []  # (vaddr, offset, filesz, memsz, flags)
        self.symtab = self.strtab = self.strsz = 0  # file offsets (and size) of the dynamic tables

    def read(self, offset: int, count: int, what: str) -> bytes:
        """``count`` bytes at ``offset``; a _Defect naming ``what`` if the file is shorter."""
        if offset < 0 or offset + count > self.size:
            raise _Defect(f"the file is truncated: {what} at byte {offset} needs {count} bytes "
                          f"but the file has {self.size} bytes")
        data = os.pread(self.fd, count, offset)
        if len(data) != count:  # the file shrank under us
            raise _Defect(f"the file is truncated: {what} at byte {offset} could not be read")
        return data

    def check(self) -> None:
        e_type, e_phoff, e_phnum = self._read_header()
        if e_type != _TYPE_SHARED:
            raise _Defect(f"it is {_TYPE_NAMES.get(e_type, f'of ELF type {e_type}')}, not a "
                          f"shared library", "check the path: it must name the plugin's .so file")
        dynamic = self._read_program_headers(e_phoff, e_phnum)
        self._check_entry_point(dynamic)

    def links(self) -> DynamicLinks:
        """The names in the dynamic section that the loader's search uses."""
        _type, e_phoff, e_phnum = self._read_header()
        offset, size = self._read_program_headers(e_phoff, e_phnum)
        entries = self._dynamic_entries(offset, size)
        strtab = next((value for tag, value in entries if tag == _DT_STRTAB), None)
        if strtab is None:
            return DynamicLinks((), (), ())
        self.strtab = self._file_offset(strtab, "string table")
        self.strsz = next((value for tag, value in entries if tag == _DT_STRSZ), 0)

        def strings(wanted: int) -> list[str]:
            return [self._string(value) for tag, value in entries if tag == wanted]

        def search_path(wanted: int) -> tuple[str, ...]:
            return tuple(part for text in strings(wanted) for part in text.split(":"))

        return DynamicLinks(tuple(strings(_DT_NEEDED)), search_path(_DT_RPATH),
                            search_path(_DT_RUNPATH))

    def _string(self, offset: int) -> str:
        """The NUL-terminated string at ``offset`` in the dynamic string table."""
        if self.strsz and offset >= self.strsz:
            raise _Defect(f"a dynamic entry names string {offset}, past the string table")
        start = self.strtab + offset
        data = b""
        while b"\0" not in data and len(data) < _MAX_STRING:
            count = min(_STRING_CHUNK, self.size - (start + len(data)))
            if count <= 0:
                break
            data += self.read(start + len(data), count, "a dynamic string")
        return data.partition(b"\0")[0].decode("utf-8", "surrogateescape")

    def _read_header(self) -> tuple[int, int, int]:
        """Check the file is a 64-bit ELF file for this machine: its (type, phoff, phnum)."""
        start = os.pread(self.fd, 8, 0)
        if start[:4] != _MAGIC:
            raise _Defect(f"it is not an ELF shared library (it starts with {start!r})",
                          "check the path: it must name the plugin's .so file")
        ident = self.read(0, 16, "the ELF identification")
        if ident[4] != _CLASS_64:
            raise _Defect("it is a 32-bit library and this process is 64-bit",
                          "install the 64-bit build of the plugin")
        if ident[5] not in (_DATA_LITTLE, _DATA_BIG):
            raise _Defect(f"its ELF header is corrupt (byte order {ident[5]})")
        order_here = _DATA_LITTLE if sys.byteorder == "little" else _DATA_BIG
        if ident[5] != order_here:
            theirs = "little" if ident[5] == _DATA_LITTLE else "big"
            raise _Defect(f"it is a {theirs}-endian library and this machine is "
                          f"{sys.byteorder}-endian", "install the plugin built for this machine")
        self.order = "<" if ident[5] == _DATA_LITTLE else ">"
        header = self.read(0, _HEADER_SIZE, "the ELF header")
        (e_type, e_machine, _version, _entry, e_phoff, _shoff, _flags, _ehsize, e_phentsize,
         e_phnum, _shentsize, _shnum, _shstrndx) = struct.unpack_from(
            self.order + "HHIQQQIHHHHHH", header, 16)
        expected = host_machine()
        if expected is not None and e_machine != expected:
            raise _Defect(f"it is built for {_machine_name(e_machine)} and this machine is "
                          f"{_machine_name(expected)}",
                          f"install the plugin built for {_machine_name(expected)}")
        if e_phnum == 0 or e_phentsize != _PHDR_SIZE:
            raise _Defect(f"its ELF header is corrupt ({e_phnum} program headers of "
                          f"{e_phentsize} bytes)")
        return e_type, e_phoff, e_phnum

    def _read_program_headers(self, phoff: int, phnum: int) -> tuple[int, int]:
        """Check each loadable segment lies inside the file; the dynamic section's place."""
        table = self.read(phoff, phnum * _PHDR_SIZE, f"the table of {phnum} program headers")
        dynamic = None
        for index in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = \
                struct.unpack_from(self.order + "IIQQQQQQ", table, index * _PHDR_SIZE)
            if p_type == _PT_LOAD:
                end = p_offset + p_filesz
                if end > self.size:
                    raise _Defect(f"the file is truncated: segment {index} ends at byte {end} "
                                  f"but the file has {self.size} bytes")
                self.loads.append((p_vaddr, p_offset, p_filesz, p_memsz, p_flags))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if not self.loads:
            raise _Defect("it has no loadable segments")
        if dynamic is None:
            raise _Defect("it has no dynamic section, so it exports nothing",
                          "check the path: it must name the plugin's .so file")
        return dynamic

    def _file_offset(self, address: int, what: str) -> int:
        """Where the link-time ``address`` lies in the file."""
        for vaddr, offset, filesz, _memsz, _flags in self.loads:
            if vaddr <= address < vaddr + filesz:
                return offset + (address - vaddr)
        raise _Defect(f"its {what} (address {address:#x}) lies in no loadable segment")

    def _dynamic_entries(self, offset: int, size: int) -> list[tuple[int, int]]:
        """The dynamic section's (tag, value) entries, in order, up to DT_NULL."""
        size = min(size, _MAX_DYNAMIC_BYTES)
        data = self.read(offset, size - size % 16, "the dynamic section")
        entries = []
        for tag, value in struct.iter_unpack(self.order + "qQ", data):
            if tag == _DT_NULL:
                break
            entries.append((tag, value))
        return entries

    def _check_entry_point(self, dynamic: tuple[int, int]) -> None:
        tags: dict[int, int] = {}
        for tag, value in self._dynamic_entries(*dynamic):
            tags.setdefault(tag, value)
        if _DT_SYMTAB not in tags or _DT_STRTAB not in tags:
            raise _Defect("its dynamic section has no symbol table")
        self.symtab = self._file_offset(tags[_DT_SYMTAB], "symbol table")
        self.strtab = self._file_offset(tags[_DT_STRTAB], "string table")
        self.strsz = tags.get(_DT_STRSZ, 0)
        if _DT_GNU_HASH in tags:
            symbols = self._gnu_hash_lookup(self._file_offset(tags[_DT_GNU_HASH], "GNU hash table"))
        elif _DT_HASH in tags:
            symbols = self._sysv_hash_lookup(self._file_offset(tags[_DT_HASH], "hash table"))
        else:
            raise _Defect("it has no symbol hash table, so no symbol in it can be looked up")
        self._check_symbols(symbols)

    def _check_symbols(self, symbols: list[tuple[int, int, int, int]]) -> None:
        """Judge the symbols named GetPjrtApi: (info, other, shndx, value) each."""
        name = ENTRY_POINT.decode()
        defined = [s for s in symbols if s[2] != _SHN_UNDEF]
        if not defined:  # absent, or only imported from another library
            raise _NoEntryPoint()
        functions = [s for s in defined if s[0] & 0xF in _STT_FUNCTIONS]
        if not functions:
            kind = _STT_NAMES.get(defined[0][0] & 0xF, f"type {defined[0][0] & 0xF}")
            raise _Defect(f"it exports {name} as a symbol of type {kind}, not as a function, "
                          f"so calling it would run data as code",
                          f"rebuild the plugin with {name} as a function, or reinstall it")
        value = functions[0][3]
        for vaddr, _offset, _filesz, memsz, flags in self.loads:
            if flags & _PF_X and vaddr <= value < vaddr + memsz:
                return
        raise _Defect(f"its {name} (address {value:#x}) lies outside its executable code")

    def _symbol(self, index: int) -> tuple[int, int, int, int] | None:
        """Symbol ``index`` as (info, other, shndx, value) if it is named GetPjrtApi."""
        entry = self.read(self.symtab + index * _SYM_SIZE, _SYM_SIZE, f"symbol {index}")
        st_name, st_info, st_other, st_shndx, st_value, _size = struct.unpack(
            self.order + "IBBHQQ", entry)
        wanted = len(ENTRY_POINT) + 1
        if self.strsz and st_name + wanted > self.strsz:
            return None
        if self.read(self.strtab + st_name, wanted, "a symbol name") != ENTRY_POINT + b"\0":
            return None
        return st_info, st_other, st_shndx, st_value

    def _words(self, offset: int, count: int, what: str) -> tuple[int, ...]:
        return struct.unpack(f"{self.order}{count}I", self.read(offset, 4 * count, what))

    def _gnu_hash_lookup(self, offset: int) -> list[tuple[int, int, int, int]]:
        nbuckets, symoffset, bloom_size, _shift = self._words(offset, 4, "the GNU hash table")
        if nbuckets == 0:
            return []
        digest = 5381
        for byte in ENTRY_POINT:
            digest = (digest * 33 + byte) & 0xFFFFFFFF
        buckets = offset + 16 + 8 * bloom_size
        (index,) = self._words(buckets + 4 * (digest % nbuckets), 1, "a GNU hash bucket")
        if index < symoffset:
            return []
        chain = buckets + 4 * nbuckets
        found = []
        for _ in range(_MAX_CHAIN):
            (link,) = self._words(chain + 4 * (index - symoffset), 1, "a GNU hash chain")
            if link | 1 == digest | 1:
                symbol = self._symbol(index)
                if symbol is not None:
                    found.append(symbol)
            if link & 1:
                break
            index += 1
        return found

    def _sysv_hash_lookup(self, offset: int) -> list[tuple[int, int, int, int]]:
        nbucket, nchain = self._words(offset, 2, "the hash table")
        if nbucket == 0:
            return []
        digest = 0
        for byte in ENTRY_POINT:
            digest = ((digest << 4) + byte) & 0xFFFFFFFF
            high = digest & 0xF0000000
            digest ^= high >> 24
            digest &= ~high & 0xFFFFFFFF
        (index,) = self._words(offset + 8 + 4 * (digest % nbucket), 1, "a hash bucket")
        chain = offset + 8 + 4 * nbucket
        found = []
        for _ in range(min(nchain, _MAX_CHAIN)):
            if index == 0 or index >= nchain:
                break
            symbol = self._symbol(index)
            if symbol is not None:
                found.append(symbol)
            (index,) = self._words(chain + 4 * index, 1, "a hash chain")
        return found
