"""``pjrt conform`` against real plugins and against the fault plugin's injected faults.

Both XLA CPU plugin builds must pass every check that applies. The fault plugin, forwarding to
a real CPU plugin (PJRT_FAULT_DELEGATE), misbehaves in one entry point at a time (PJRT_FAULT):
each fault must fail exactly the check that meets it, with the signal or timeout recorded, and
the run must go on to the end. The vendors' plugins, on a machine without their hardware, must
fail client creation with their own message and skip what depends on it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import ml_dtypes
import pytest

import pjrt
from pjrt import dtypes
from pjrt._app import cli, conform

from conftest import CPU_PLUGINS, TEST_DEVICE_COUNT, cpu_plugin_path, vendor_library

#: Left out of the quick run: each run starts worker interpreters.
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent

_spec = importlib.util.spec_from_file_location("fault_plugin_build", HERE / "fault_plugin" / "build.py")
if _spec.name in sys.modules:
    fault_build = sys.modules[_spec.name]
else:
    fault_build = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = fault_build  # dataclasses look their module up there
    _spec.loader.exec_module(fault_build)

#: The one check a CPU plugin may skip: it describes no topology to compile for.
CPU_SKIPS = {"topology.compile_only"}
#: What a CPU run may take, on two shared cores (measured runs take a few seconds).
TIME_BUDGET_S = 300
OPTIONS = {"cpu_device_count": TEST_DEVICE_COUNT}


@pytest.fixture(scope="module")
def fault_plugin(tmp_path_factory) -> str:
    return str(fault_build.build_all(tmp_path_factory.mktemp("conform_fault")).fault_plugin)


# -- the real CPU plugins ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CPU_PLUGINS))
def test_cpu_plugins_pass_every_check_that_applies(name):
    started = time.monotonic()
    report = conform.run(cpu_plugin_path(name), options=OPTIONS, timeout=TIME_BUDGET_S)
    elapsed = time.monotonic() - started
    print(f"\n{name}: {len(report.results)} checks {report.counts()} in {elapsed:.1f}s")
    assert report.failed() == [], report.format_table()
    assert report.passed
    skipped = {r.name for r in report.results if r.status == conform.SKIP}
    assert skipped <= CPU_SKIPS, report.format_table()
    assert report.counts()["pass"] >= 30
    assert elapsed < TIME_BUDGET_S
    assert report.info["api_version"] == f"0.{CPU_PLUGINS[name][2]}"
    # The checks the product promises are all there and passed.
    for check in ("library.elf", "api.function_table", "transfer.roundtrip.int4",
                  "transfer.roundtrip.float8_e4m3fn", "transfer.roundtrip.bfloat16",
                  "transfer.zero_size", "transfer.scalar", "transfer.strided",
                  "compile.sort", "execute.donation", "ffi.custom_call",
                  "collectives.all_reduce", "spmd.shardy", "spmd.gspmd", "errors.bad_program",
                  "errors.codes", "events.async", "executable.serialize_roundtrip"):
        assert report.result(check).status == conform.PASS, check
    assert "FFI" in report.info["extensions"]


def test_check_names_are_stable_and_unique():
    names = conform.check_names()
    assert len(names) == len(set(names)) >= 30
    assert names[0] == "library.elf" and names[-1] == "client.destroy"
    for dtype in dtypes.SUPPORTED_DTYPES:
        assert f"transfer.roundtrip.{dtype.name}" in names


def test_command_line_selects_checks_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    status = cli.main(["conform", cpu_plugin_path("xla_cpu_0_106"), "-o",
                       f"cpu_device_count={TEST_DEVICE_COUNT}", "-k", "spmd",
                       "--check", "transfer.roundtrip.uint4", "--json", str(out)])
    table = capsys.readouterr().out
    assert status == 0, table
    assert "PASS  spmd.shardy" in table and "conforms: 3 passed" in table
    report = json.loads(out.read_text())
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == ["transfer.roundtrip.uint4", "spmd.shardy",
                                                      "spmd.gspmd"]
    assert all(c["status"] == "pass" and c["seconds"] >= 0 for c in report["checks"])


def test_command_line_refuses_unknown_checks_and_plugins(capsys):
    assert cli.main(["conform", cpu_plugin_path("xla_cpu_0_81"), "--check", "no.such"]) == 2
    assert "no conformance check named 'no.such'" in capsys.readouterr().err
    assert cli.main(["conform", "/nonexistent/libplugin.so"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["conform", "no_such_platform"]) == 2
    assert "no installed plugin serves platform 'no_such_platform'" in capsys.readouterr().err


# -- injected faults --------------------------------------------------------------------------

def _run_fault(monkeypatch, fault_plugin, fault: str | None, timeout: float = 60):
    monkeypatch.setenv("PJRT_FAULT_DELEGATE", cpu_plugin_path("xla_cpu_0_106"))
    if fault is None:
        monkeypatch.delenv("PJRT_FAULT", raising=False)
    else:
        monkeypatch.setenv("PJRT_FAULT", fault)
    started = time.monotonic()
    report = conform.run(fault_plugin, options=OPTIONS, timeout=timeout)
    return report, time.monotonic() - started


def test_forwarding_fault_plugin_without_a_fault_conforms(monkeypatch, fault_plugin):
    """The baseline of the fault tests: forwarding alone changes nothing."""
    report, _ = _run_fault(monkeypatch, fault_plugin, None)
    assert report.failed() == [], report.format_table()
    assert report.counts()["pass"] >= 30


def test_abort_in_compile_fails_that_compile_only(monkeypatch, fault_plugin):
    report, elapsed = _run_fault(monkeypatch, fault_plugin, "abort_compile:@conform_sort")
    assert report.failed() == ["compile.sort"], report.format_table()
    sort = report.result("compile.sort")
    assert sort.signal == "SIGABRT"
    assert "killed by SIGABRT during this check" in sort.detail
    assert "aborting in PJRT_Client_Compile" in sort.detail  # the plugin's last words
    # The checks after it ran in a new worker.
    assert report.result("compile.multi_output").status == conform.PASS
    assert report.result("client.destroy").status == conform.PASS
    assert elapsed < 120


def test_abort_in_every_compile_fails_every_compiling_check(monkeypatch, fault_plugin):
    report, _ = _run_fault(monkeypatch, fault_plugin, "abort_compile")
    failed = set(report.failed())
    assert failed == {"compile.elementwise", "compile.reduce", "compile.while_loop",
                      "compile.sort", "compile.multi_output", "errors.bad_program"}, \
        report.format_table()
    # Checks resting on a program compiling are skipped for it, not failed again.
    for name in ("execute.donation", "ffi.custom_call", "spmd.shardy", "collectives.all_reduce"):
        assert report.result(name).detail == "needs compile.elementwise, which failed"
    assert all(report.result(name).signal == "SIGABRT" for name in failed)


def test_wrong_bytes_from_to_host_buffer_fail_that_transfer(monkeypatch, fault_plugin):
    bf16 = dtypes.to_pjrt_type(ml_dtypes.bfloat16)
    report, _ = _run_fault(monkeypatch, fault_plugin, f"corrupt_to_host:{bf16}")
    assert report.failed() == ["transfer.roundtrip.bfloat16"], report.format_table()
    result = report.result("transfer.roundtrip.bfloat16")
    assert "PJRT_Buffer_ToHostBuffer returned other bytes: element 0" in result.detail
    assert result.signal is None and not result.timed_out


def test_hang_in_execute_times_out_that_check(monkeypatch, fault_plugin):
    timeout = 10
    report, elapsed = _run_fault(monkeypatch, fault_plugin, "hang_execute:conform_while_loop",
                                 timeout=timeout)
    assert report.failed() == ["compile.while_loop"], report.format_table()
    result = report.result("compile.while_loop")
    assert result.timed_out and f"did not finish within {timeout}s" in result.detail
    assert timeout <= result.seconds < timeout + 5
    assert report.result("compile.sort").status == conform.PASS
    assert elapsed < 120


def test_abort_in_client_create_keeps_the_plugins_last_words(monkeypatch, fault_plugin):
    """What a plugin prints as it dies while making its client is quoted: the worker's stderr
    is conform's to keep, so the plugin is not made quiet there."""
    monkeypatch.delenv("PJRT_LOG_LEVEL", raising=False)
    report, _ = _run_fault(monkeypatch, fault_plugin, "abort_create")
    created = report.result("client.create")
    assert created.status == conform.FAIL and created.signal == "SIGABRT"
    assert "fault plugin: aborting in PJRT_Client_Create" in created.detail


def test_null_api_fails_get_pjrt_api_and_skips_the_rest(monkeypatch, fault_plugin):
    report, _ = _run_fault(monkeypatch, fault_plugin, "null_api")
    assert report.failed() == ["library.get_pjrt_api"], report.format_table()
    assert "returned NULL" in report.result("library.get_pjrt_api").detail
    assert report.result("library.elf").status == conform.PASS
    rest = report.results[2:]
    assert rest and all(r.status == conform.SKIP for r in rest)
    assert all("library.get_pjrt_api" in r.detail for r in rest)


def test_command_exits_nonzero_on_a_fault_and_survives_it(monkeypatch, fault_plugin, tmp_path,
                                                          capsys):
    monkeypatch.setenv("PJRT_FAULT_DELEGATE", cpu_plugin_path("xla_cpu_0_81"))
    monkeypatch.setenv("PJRT_FAULT", "abort_compile:@conform_reduce")
    out = tmp_path / "report.json"
    status = cli.main(["conform", fault_plugin, "-k", "compile.", "--json", str(out)])
    table = capsys.readouterr().out
    assert status == 1
    assert "FAIL  compile.reduce" in table and "DOES NOT CONFORM" in table
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["counts"]["fail"] == 1
    assert {c["name"]: c["signal"] for c in report["checks"]}["compile.reduce"] == "SIGABRT"


def test_plugin_without_compile_is_told_so_once(monkeypatch, fault_plugin):
    """The fault plugin on its own holds buffers but compiles nothing: the function table
    check names what is missing, and the compile checks are skipped for it."""
    monkeypatch.delenv("PJRT_FAULT_DELEGATE", raising=False)
    monkeypatch.delenv("PJRT_FAULT", raising=False)
    report = conform.run(fault_plugin, timeout=60)
    assert report.failed() == ["api.function_table"], report.format_table()
    assert "PJRT_Client_Compile" in report.result("api.function_table").detail
    assert report.result("compile.sort").detail == "the plugin has no PJRT_Client_Compile"
    assert report.result("transfer.roundtrip.float32").status == conform.PASS
    int4 = report.result("transfer.roundtrip.int4")
    assert int4.status == conform.SKIP and "does not take int4" in int4.detail


# -- the vendors' plugins, without their hardware --------------------------------------------

@pytest.mark.vendor
@pytest.mark.parametrize("distribution, filename, code, message", [
    ("jax-cuda13-pjrt", "xla_cuda_plugin.so", "FAILED_PRECONDITION", "No visible GPU devices"),
    ("jax-cuda12-pjrt", "xla_cuda_plugin.so", "FAILED_PRECONDITION", "No visible GPU devices"),
    ("libtpu", "libtpu.so", "NOT_FOUND", "TPU initialization failed"),
])
def test_vendor_plugin_without_hardware_reports_client_creation(monkeypatch, distribution,
                                                                 filename, code, message):
    import glob

    if glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/accel*"):
        pytest.skip("this machine has accelerator hardware")
    # Off Google Cloud, libtpu retries the metadata server for minutes; skip the lookup.
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    # Other tests in this process may have loaded libtpu, which then holds its one-process
    # lock file; the worker's libtpu would report that instead of the missing TPU.
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    report = conform.run(vendor_library(distribution, filename), timeout=120)
    created = report.result("client.create")
    assert created.status == conform.FAIL
    assert f"{code}: {message}" in created.detail
    assert report.result("api.function_table").status == conform.PASS
    client_checks = [r for r in report.results if r.name.startswith(("transfer.", "compile.",
                                                                       "spmd.", "devices."))]
    assert client_checks and all(r.status == conform.SKIP for r in client_checks)
    assert set(report.failed()) == {"client.create"}, report.format_table()


@pytest.mark.vendor
@pytest.mark.parametrize("distribution", ["jax-rocm10-pjrt", "jax-rocm7-pjrt"])
def test_rocm_plugin_without_its_libraries_reports_the_missing_one(distribution):
    if os.path.exists("/dev/kfd"):
        pytest.skip("this machine has an AMD GPU")
    report = conform.run(vendor_library(distribution, "xla_rocm_plugin.so"),
                              timeout=120)
    assert report.result("library.elf").status == conform.PASS
    loaded = report.result("library.get_pjrt_api")
    assert loaded.status == conform.FAIL
    # The whole report, the ROCm runtimes first, not only the library dlopen stopped at.
    assert loaded.detail.index("libhsa-runtime64.so.1") < loaded.detail.index("libamdhip64.so.7")
    assert loaded.detail.index("libamdhip64.so.7") < loaded.detail.index("libMIOpen.so.1")
    assert report.failed() == ["library.get_pjrt_api"]


# -- what the operator reads ------------------------------------------------------------------

@pytest.fixture(scope="module")
def plugin_missing_hyphenated_libraries(tmp_path_factory) -> str:
    """A would-be plugin (it exports GetPjrtApi) needing two libraries with hyphens in their
    names, both deleted after linking."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the library")
    out = tmp_path_factory.mktemp("hyphens")
    gone = out / "gone"
    gone.mkdir()
    for stem in ("roc-profiler-sdk-like", "another-made-up-runtime"):
        source = gone / f"{stem}.c"
        source.write_text(f"int {stem.replace('-', '_')}(void) {{ return 1; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(gone / f"lib{stem}.so.1"),
                        f"-Wl,-soname,lib{stem}.so.1", str(source)], check=True, timeout=60)
    plugin_c = out / "plugin.c"
    plugin_c.write_text("extern int roc_profiler_sdk_like(void);\n"
                        "extern int another_made_up_runtime(void);\n"
                        "const void* GetPjrtApi(void) {\n"
                        "  return (roc_profiler_sdk_like() + another_made_up_runtime())\n"
                        "      ? (const void*)0 : (const void*)0;\n}\n")
    plugin = out / "libhyphen_plugin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plugin), str(plugin_c),
                    "-Wl,--no-as-needed", f"-L{gone}", f"-l:libroc-profiler-sdk-like.so.1",
                    "-l:libanother-made-up-runtime.so.1"], check=True, timeout=60)
    shutil.rmtree(gone)
    return str(plugin)


def test_piped_output_keeps_every_reason_whole(plugin_missing_hyphenated_libraries, capsys):
    """Not a terminal (here, pytest's capture): no detail is wrapped, cut or broken at a
    hyphen, so each missing library can be searched for and the loader's words are there."""
    status = cli.main(["conform", plugin_missing_hyphenated_libraries, "-k", "library."])
    table = capsys.readouterr().out
    assert status == 1, table
    line = next(line for line in table.splitlines() if line.startswith("FAIL  library.get_pjrt_api"))
    for name in ("libroc-profiler-sdk-like.so.1", "libanother-made-up-runtime.so.1"):
        assert name in line
    assert line.rstrip().endswith("No such file or directory")


def _detail_lines(table: str, name: str) -> list[str]:
    """The lines a check's row takes in a table: its own and the indented ones after it."""
    lines = table.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"FAIL  {name} "))
    rest = []
    for line in lines[first + 1:]:
        if not line.startswith("      "):
            break
        rest.append(line)
    return [lines[first]] + rest


def test_a_terminal_table_wraps_whole_words_and_verbose_keeps_every_line(
        plugin_missing_hyphenated_libraries):
    report = conform.run(plugin_missing_hyphenated_libraries, patterns=["library."],
                              timeout=60)
    detail = " ".join(report.result("library.get_pjrt_api").detail.split())
    full = _detail_lines(report.format_table(width=72, full=True), "library.get_pjrt_api")
    short = _detail_lines(report.format_table(width=72), "library.get_pjrt_api")
    # -v: every word of the reason, none broken, in order.
    words = " ".join(full).split()[3:]  # less the mark, the name and the time
    assert " ".join(words) == detail
    # The terminal's table: at most four lines, each word whole.
    assert len(short) == 4 < len(full)
    assert " ".join(" ".join(short).split()[3:]) in detail


def test_a_directory_names_the_plugin_library_inside_it(tmp_path, capsys):
    folder = tmp_path / "wheel_package"
    folder.mkdir()
    os.symlink(cpu_plugin_path("xla_cpu_0_106"), folder / "xla_cpu_plugin.so")
    (folder / "README.txt").write_text("not a library\n")
    status = cli.main(["conform", str(folder), "--check", "library.elf"])
    table = capsys.readouterr().out
    assert status == 0, table
    assert f"library: {folder / 'xla_cpu_plugin.so'}" in table
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["conform", str(empty)]) == 2
    error = capsys.readouterr().err
    assert "is a directory" in error and "no PJRT plugin library" in error
    assert "GetPjrtApi" in error


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signal_to_conform_ends_its_worker(signal_name, fault_plugin):
    """The worker hangs in execute; the run is told to stop, or killed outright (it then
    runs no clean-up at all): the worker must end too, not hang on as an orphan."""
    import signal
    import subprocess

    from conftest import child_env

    env = child_env(PJRT_FAULT_DELEGATE=cpu_plugin_path("xla_cpu_0_106"),
                    PJRT_FAULT="hang_execute:conform_while_loop")
    process = subprocess.Popen([sys.executable, "-m", "pjrt", "conform", fault_plugin,
                                "--check", "compile.while_loop", "--timeout", "60"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not workers and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            workers = _children(process.pid)
        assert workers, "no worker started"
        time.sleep(1.0)  # let the worker reach its check
        process.send_signal(getattr(signal, signal_name))
        process.wait(timeout=30)
        ended = time.monotonic() + 30  # generous: a loaded machine may be slow to reap it
        while any(_alive(pid) for pid in workers) and time.monotonic() < ended:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), f"a worker outlived {signal_name}"
        assert process.returncode != 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        # Killed by pid, not as the run's children: an orphan is init's child.
        for pid in set(workers) | set(_children(process.pid)):
            if _alive(pid):
                os.kill(pid, 9)
