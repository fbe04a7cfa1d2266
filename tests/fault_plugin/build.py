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


@dataclasses.dataclass(frozen=True)
class Built:
    """Paths of the libraries :func:`build_all` made.

    Attributes:
      fault_plugin: the fault-injection PJRT plugin (copy it before loading; see the tests).
      not_a_plugin: a shared library without ``GetPjrtApi``.
      needs_missing_dep: a library whose dependency ``libpjrt_missing_dep.so`` was deleted.
      missing_dep_name: the file name of that deleted dependency.
    """

    fault_plugin: Path
    not_a_plugin: Path
    needs_missing_dep: Path
    missing_dep_name: str


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
    _compile([HERE / "fault_plugin.c"], fault_plugin)

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

    return Built(fault_plugin=fault_plugin, not_a_plugin=not_a_plugin,
                 needs_missing_dep=needs_missing_dep, missing_dep_name=dep.name)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIRECTORY")
    print(build_all(sys.argv[1]))
