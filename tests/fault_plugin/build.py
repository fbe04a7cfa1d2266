"""Builds the fault-injection plugin and the broken libraries the loading tests need.

Everything is compiled with the system C compiler (``cc``, or ``$CC``) into a directory the
caller chooses, normally a pytest session temporary directory, so nothing lands in the
source tree. Run it directly to check the build by hand::

    python tests/fault_plugin/build.py /tmp/fault
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: Our PJRT C API header: the plugin must be built against the same one as pjrt.
HEADER_DIR = REPO / "pjrt_c_api"

#: The dependency the "missing library" case links against and then loses.
MISSING_DEP_NAME = "pjrt_missing_dep"

_NOT_A_PLUGIN_C = """\
/* A valid shared library that is not a PJRT plugin: no GetPjrtApi. */
int not_a_pjrt_plugin(void) { return 1; }
"""

_MISSING_DEP_C = """\
/* A dependency that is deleted after the plugin below is linked against it. */
int pjrt_missing_dep_answer(void) { return 42; }
"""

_NEEDS_DEP_C = """\
/* A would-be plugin that needs libpjrt_missing_dep.so to load at all. Calling into the
 * dependency keeps the linker from dropping it (some toolchains link --as-needed). */
extern int pjrt_missing_dep_answer(void);
const void* GetPjrtApi(void) {
  return pjrt_missing_dep_answer() == 42 ? (const void*)0 : (const void*)0;
}
"""


_UNRESOLVED_C = """\
/* A would-be plugin whose GetPjrtApi calls a function no library defines. Linked lazily,
 * it loads, and the process dies with "symbol lookup error" (exit code 127) at the call. */
extern const void* pjrt_fault_nowhere_defined(void);
const void* GetPjrtApi(void) { return pjrt_fault_nowhere_defined(); }
"""

_DATA_ENTRY_C = """\
/* GetPjrtApi exported as data, not code: calling it jumps into these bytes. */
const unsigned char GetPjrtApi[64] = {0xff, 0xff, 0xff, 0xff};
"""

_TABLE_PAST_ITS_MEMORY_C = """\
/* A plugin whose PJRT_Api claims the full size of our header's table, while only its
 * version header lies in readable memory: the page after it is made unreadable. A host
 * that trusted struct_size would crash reading the first function entry. */
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>
#include "pjrt_c_api.h"

const PJRT_Api* GetPjrtApi(void) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char* region = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
  if (region == MAP_FAILED || mprotect(region + page, page, PROT_NONE) != 0) return NULL;
  size_t head = offsetof(PJRT_Api, PJRT_Error_Destroy);
  PJRT_Api* api = (PJRT_Api*)(region + page - head);
  api->struct_size = sizeof(PJRT_Api);
  api->extension_start = NULL;
  api->pjrt_api_version.struct_size = sizeof(PJRT_Api_Version);
  api->pjrt_api_version.extension_start = NULL;
  api->pjrt_api_version.major_version = PJRT_API_MAJOR;
  api->pjrt_api_version.minor_version = PJRT_API_MINOR;
  return api;
}
"""


@dataclasses.dataclass(frozen=True)
class Built:
    """Paths of the libraries :func:`build_all` made.

    Attributes:
      fault_plugin: the fault-injection PJRT plugin (copy it before loading; see the tests).
      not_a_plugin: a shared library without ``GetPjrtApi``.
      needs_missing_dep: a library whose dependency ``libpjrt_missing_dep.so`` was deleted.
      missing_dep_name: the file name of that deleted dependency.
      fault_plugin_sysv_hash: the fault plugin linked with only the old SysV symbol hash
        table (no GNU hash), as some toolchains still produce.
      unresolved_symbol: a library whose ``GetPjrtApi`` calls ``pjrt_fault_nowhere_defined``,
        which no library defines, linked for lazy binding.
      data_entry_point: a library exporting ``GetPjrtApi`` as a data object.
      table_past_its_memory: a library whose ``PJRT_Api`` claims more bytes than are mapped.
      multinode_plugin: a plugin spanning processes, which exchanges its topology through the
        host's key-value callbacks (``multinode_plugin.c``).
    """

    fault_plugin: Path
    not_a_plugin: Path
    needs_missing_dep: Path
    missing_dep_name: str
    fault_plugin_sysv_hash: Path
    unresolved_symbol: Path
    data_entry_point: Path
    table_past_its_memory: Path
    multinode_plugin: Path | None = None


def _compile(sources: list[Path], output: Path, extra: list[str] = ()) -> None:
    """Compile ``sources`` into the shared library ``output``; a failure shows the compiler's
    own output, which is what one needs to fix it."""
    compiler = shlex.split(os.environ.get("CC", "cc"))
    command = [*compiler, "-shared", "-fPIC", "-O1", "-Wall", f"-I{HEADER_DIR}", "-o",
               str(output), *map(str, sources), *extra]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building {output.name} failed:\n$ {shlex.join(command)}\n"
                           f"{result.stdout}{result.stderr}")


def build_all(directory: str | os.PathLike) -> Built:
    """Build every test library into ``directory`` (created if needed)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    fault_plugin = out / "libfault_plugin.so"
    # -ldl: the plugin loads the real plugin it forwards to (PJRT_FAULT_DELEGATE).
    _compile([HERE / "fault_plugin.c"], fault_plugin, ["-ldl"])

    not_a_plugin_c = out / "not_a_plugin.c"
    not_a_plugin_c.write_text(_NOT_A_PLUGIN_C)
    not_a_plugin = out / "libnot_a_plugin.so"
    _compile([not_a_plugin_c], not_a_plugin)

    # The dependency goes in its own directory, which the dependent library names as its
    # run path: so the library loads while the dependency exists, and the only reason it
    # fails later is that the dependency was deleted.
    dep_dir = out / "dep"
    dep_dir.mkdir(exist_ok=True)
    dep_c = dep_dir / "missing_dep.c"
    dep_c.write_text(_MISSING_DEP_C)
    dep = dep_dir / f"lib{MISSING_DEP_NAME}.so"
    _compile([dep_c], dep)
    needs_dep_c = out / "needs_missing_dep.c"
    needs_dep_c.write_text(_NEEDS_DEP_C)
    needs_missing_dep = out / "libneeds_missing_dep.so"
    _compile([needs_dep_c], needs_missing_dep,
             ["-Wl,--no-as-needed", f"-L{dep_dir}", f"-l{MISSING_DEP_NAME}",
              f"-Wl,-rpath,{dep_dir}"])
    dep.unlink()

    fault_plugin_sysv_hash = out / "libfault_plugin_sysv_hash.so"
    _compile([HERE / "fault_plugin.c"], fault_plugin_sysv_hash, ["-Wl,--hash-style=sysv", "-ldl"])

    hostile = {}
    for stem, source, extra in (
            # -z lazy: some toolchains bind everything at load by default, which would hide
            # what a lazily bound plugin does.
            ("unresolved_symbol", _UNRESOLVED_C, ["-Wl,-z,lazy"]),
            ("data_entry_point", _DATA_ENTRY_C, []),
            ("table_past_its_memory", _TABLE_PAST_ITS_MEMORY_C, [])):
        source_file = out / f"{stem}.c"
        source_file.write_text(source)
        hostile[stem] = out / f"lib{stem}.so"
        _compile([source_file], hostile[stem], extra)

    multinode_plugin = build_multinode_plugin(out)

    return Built(fault_plugin=fault_plugin, multinode_plugin=multinode_plugin, not_a_plugin=not_a_plugin,
                 needs_missing_dep=needs_missing_dep, missing_dep_name=dep.name,
                 fault_plugin_sysv_hash=fault_plugin_sysv_hash, **hostile)


def build_multinode_plugin(directory: str | os.PathLike) -> Path:
    """Build only the multi-process plugin into ``directory``; returns its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    multinode_plugin = out / "libmultinode_plugin.so"
    _compile([HERE / "multinode_plugin.c"], multinode_plugin, ["-pthread"])
    return multinode_plugin


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIRECTORY")
    print(build_all(sys.argv[1]))
