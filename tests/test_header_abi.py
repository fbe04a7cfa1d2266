"""Our PJRT C API header against the upstream header the xla-cpu-pjrt wheel ships (0.81).

PJRT only appends: every struct of 0.81 must exist in our header with every one of its fields
at the same offset, and the PJRT_Api table must list 0.81's functions at the same offsets.
The upstream offsets come from the C compiler, reading the wheel's own header.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import cpu_plugin_path
from pjrt._pjrt_cffi import ffi
from pjrt.plugin import load_library


def _upstream_header() -> str:
    library = cpu_plugin_path("xla_cpu_0_81")
    header = os.path.join(os.path.dirname(library), "include", "pjrt_c_api.h")
    assert os.path.isfile(header), f"xla-cpu-pjrt no longer ships {header}"
    return header


def _probe_program(header: str, probes: list) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{header}"', "int main(void) {"]
    for struct, field in probes:
        lines.append(f'  printf("%zu\\n", offsetof(struct {struct}, {field}));')
    lines.append("  return 0;\n}")
    return "\n".join(lines)


def _upstream_offsets(header: str, probes: list, workdir) -> dict:
    """Offsets of ``probes`` that the upstream header has; fields it lacks fail to compile
    and are dropped, one round of compiler errors at a time."""
    probes = list(probes)
    source, binary = workdir / "probe.c", workdir / "probe"
    for _ in range(50):
        source.write_text(_probe_program(header, probes))
        result = subprocess.run(["cc", "-std=c11", "-w", str(source), "-o", str(binary)],
                                capture_output=True, text=True)
        if result.returncode == 0:
            break
        # Line N of the program probes probes[N - 5] (four lines of preamble).
        failing = {int(m.group(1)) - 5 for m in re.finditer(r"probe\.c:(\d+):\d+: error", result.stderr)}
        assert failing, result.stderr[:2000]
        probes = [p for i, p in enumerate(probes) if i not in failing]
    else:
        pytest.fail("could not build the offset probe against the upstream header")
    values = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(probes, map(int, values)))


def test_every_0_81_struct_and_field_sits_where_upstream_puts_it(tmp_path):
    header = _upstream_header()
    with open(header, encoding="utf-8") as f:
        upstream_structs = sorted(set(re.findall(r"struct (PJRT_\w+) \{", f.read())))
    assert len(upstream_structs) > 100
    probes = []
    for struct in upstream_structs:
        try:
            fields = ffi.typeof(f"struct {struct}").fields
        except ffi.error:
            pytest.fail(f"our header lacks struct {struct}, which PJRT 0.81 has")
        probes.extend((struct, name) for name, _ in fields)
    upstream = _upstream_offsets(header, probes, tmp_path)
    assert len(upstream) > 800  # every 0.81 field was compared, not a handful
    mismatched = [(s, f, off, ffi.offsetof(f"struct {s}", f)) for (s, f), off in upstream.items()
                  if ffi.offsetof(f"struct {s}", f) != off]
    assert mismatched == []
    # What upstream lacks is what was appended since 0.81: always after its last field.
    for struct in upstream_structs:
        known = [off for (s, _), off in upstream.items() if s == struct]
        ours = [f for f in ffi.typeof(f"struct {struct}").fields
                if (struct, f[0]) not in upstream]
        assert all(field.offset > max(known) for _, field in ours), struct


def test_the_api_table_keeps_0_81_order(tmp_path):
    header = _upstream_header()
    functions = [name for name, _ in ffi.typeof("PJRT_Api").fields][3:]
    upstream = _upstream_offsets(header, [("PJRT_Api", f) for f in functions], tmp_path)
    for (_, function), offset in upstream.items():
        assert ffi.offsetof("PJRT_Api", function) == offset, function
    # The plugin built from that header reports a table that ends exactly at its last entry.
    plugin = load_library("abi_probe", cpu_plugin_path("xla_cpu_0_81"))
    assert plugin.api.table.struct_size == max(upstream.values()) + ffi.sizeof("void *")
    assert len(upstream) == 118
