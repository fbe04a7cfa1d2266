"""pjrt.profiler: traces of what pjrt ran, on both CPU plugins.

A trace's files are read back as a viewer reads them (the gzipped Chrome trace-event JSON):
compiles (with the compilation cache's hit or miss), launches on either path, transfers, waits
and host reads, each with its program, devices and thread, at times that make sense; the
regions users mark; the ``pjrt trace`` command; the errors of starting twice or stopping
what never started; and tracing toggled while other threads launch.

XLA's CPU plugins have no profiler of their own (no PJRT profiler extension), which the trace
notes. The path that collects a plugin's own profile is exercised with the fault plugin's
profiler extension, which records nothing real (a fixed one-plane XSpace): it shows how pjrt
drives the extension and handles its failures. A real profile is checked on an NVIDIA GPU by
scripts/gpu-check.py.
"""
from __future__ import annotations

import ctypes
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pjrt
from pjrt import compilation_cache, profiler
from pjrt._app import cli, trace_command
from pjrt._profiling import xspace
from pjrt._wire import protowire

from conftest import child_env
from fixtures import programs

TINY = programs.get("tiny_tanh")


@pytest.fixture(autouse=True)
def no_trace_left_running():
    """A failing test must not leave its trace running for the next."""
    yield
    if profiler.is_tracing():
        profiler.stop_trace()


def read_trace(path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        return json.load(stream)


def complete_events(document: dict, category: str | None = None) -> list[dict]:
    return [e for e in document["traceEvents"]
            if e["ph"] == "X" and (category is None or e["cat"] == category)]


def check_times(document: dict) -> None:
    """Every event lies within the trace, and thread names are given for every thread."""
    length_us = document["otherData"]["duration_ns"] / 1000
    named = {e["tid"] for e in document["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    process, = [e for e in document["traceEvents"] if e["name"] == "process_name"]
    for event in complete_events(document):
        assert event["ts"] >= 0 and event["dur"] >= 0, event
        assert event["ts"] + event["dur"] <= length_us + 1, (event, length_us)
        assert event["tid"] in named, event
        assert event["pid"] == process["pid"], event


# -- what a trace records ---------------------------------------------------------------------

def test_a_traced_compile_run_and_read_names_what_ran(client, tmp_path):
    source = TINY.read_text()
    devices = client.local_devices()[:2]
    compilation_cache.set_compilation_cache_dir(tmp_path / "cache")
    try:
        with profiler.trace(tmp_path / "log"):
            executable = client.compile_and_load(source)
            again = client.compile_and_load(source)  # the same program: the cache has it now
            a = client.buffer_from_pyval(np.arange(8, dtype=np.float32))
            b = client.buffer_from_pyval(np.ones(8, dtype=np.float32))
            out, = again.execute([a, b])
            out.block_until_ready()
            local = np.asarray(out)  # a host buffer: numpy views it, no Python read
            mesh = pjrt.Mesh(np.array(devices), ("x",))
            sharded = pjrt.device_put(np.arange(8, dtype=np.float32).reshape(2, 4),
                                      pjrt.NamedSharding(mesh, pjrt.P("x")))
            whole = np.asarray(sharded)  # two shards, assembled by Array.__array__
    finally:
        compilation_cache.set_compilation_cache_dir(None)
        compilation_cache._explicit = compilation_cache._UNSET
    np.testing.assert_allclose(local, np.tanh(np.arange(8) + 1), rtol=1e-6)
    np.testing.assert_array_equal(whole, np.arange(8).reshape(2, 4))
    del executable

    runs = glob.glob(str(tmp_path / "log" / "plugins" / "profile" / "*"))
    assert len(runs) == 1
    files = os.listdir(runs[0])
    assert files == [f"{_host()}.trace.json.gz"]  # no .xplane.pb: the plugin has no profiler
    document = read_trace(os.path.join(runs[0], files[0]))
    check_times(document)
    me = threading.get_native_id()

    compiles = complete_events(document, "compile")
    assert [e["args"]["cache"] for e in compiles] == ["miss", "hit"]
    for event in compiles:
        assert event["name"] == "compile jit_tiny_tanh"
        assert event["args"]["program"] == "jit_tiny_tanh"
        assert event["args"]["devices"] == f"{client.platform}:{devices[0].id}"
        assert event["tid"] == me and event["dur"] > 0

    launch, = complete_events(document, "launch")
    assert launch["name"] == "jit_tiny_tanh" and launch["args"]["program"] == "jit_tiny_tanh"
    assert launch["args"]["devices"] == f"cpu:{devices[0].id}"
    assert launch["args"]["path"] in ("CallPlan", "python")
    assert launch["ts"] >= compiles[1]["ts"] + compiles[1]["dur"]  # in the order they ran

    transfers = complete_events(document, "transfer")
    assert [t["args"]["bytes"] for t in transfers] == [32, 32, 16, 16]
    assert {t["args"]["device"] for t in transfers[2:]} == {f"cpu:{d.id}" for d in devices}
    assert transfers[0]["args"]["shape"] == [8] and transfers[0]["args"]["dtype"] == "float32"
    assert transfers[1]["ts"] + transfers[1]["dur"] <= launch["ts"]

    wait, = complete_events(document, "wait")
    assert wait["name"] == "block_until_ready" and wait["ts"] >= launch["ts"]
    assert wait["args"]["devices"] == f"cpu:{devices[0].id}"

    read, = complete_events(document, "read")  # only the sharded array's: see above
    assert read["args"]["shape"] == [2, 4] and read["args"]["copy"] is True
    assert read["args"]["devices"] == ",".join(f"cpu:{d.id}" for d in devices)

    assert all(e["tid"] == me and e["pid"] == os.getpid() for e in complete_events(document))
    assert {e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M"
            and e.get("tid") == me} == {threading.current_thread().name}
    notes = document["otherData"]["notes"]
    assert any(f"plugin {client.plugin.name!r} records no device activity" in note
               and "no profiler extension" in note for note in notes), notes
    assert any(e["ph"] == "i" and e["name"] == note for e in document["traceEvents"]
               for note in notes)


def test_launches_name_the_path_that_ran_them(client, tmp_path):
    executable = client.compile_and_load(TINY.read_text(), client.local_devices()[:2],
                                         replicated=True)
    shards = [[client.buffer_from_pyval(np.ones(8, np.float32), d)
               for d in client.local_devices()[:2]] for _ in range(2)]
    executable.execute_sharded(shards)  # the first launch of an executable runs on a worker
    single = client.compile_and_load(TINY.read_text())
    a = client.buffer_from_pyval(np.ones(8, np.float32))
    single.execute([a, a])
    with profiler.trace(tmp_path):
        single.execute([a, a])  # device-resident Arrays: the native per-call path
        single.execute([a, np.ones(8, np.float32)], copy_host_values=True)
        with pytest.raises(TypeError):  # refused by the full path, which words the error
            single.execute([a])
        results = executable.execute_sharded(shards)  # always the Python path
    document = read_trace(_only_trace(tmp_path))
    paths = [(e["args"]["path"], e["args"]["devices"]) for e in complete_events(document,
                                                                             "launch")]
    d0, d1 = (d.id for d in client.local_devices()[:2])
    assert paths == [("CallPlan", f"cpu:{d0}"), ("CallPlan", f"cpu:{d0}"),
                     ("python", f"cpu:{d0},cpu:{d1}")]
    np.testing.assert_allclose(np.asarray(results.disassemble_into_single_device_arrays()[0][1]),
                               np.tanh(np.ones(8) * 1 + 1), rtol=1e-6)


def test_stop_trace_says_what_it_wrote_and_a_perfetto_copy(client, tmp_path):
    profiler.start_trace(tmp_path, create_perfetto_trace=True)
    client.buffer_from_pyval(np.zeros(3, np.int32))
    files = profiler.stop_trace()
    assert os.path.dirname(files.trace) == files.directory
    assert files.directory.startswith(str(tmp_path / "plugins" / "profile"))
    assert files.xplane is None
    assert read_trace(files.perfetto) == read_trace(files.trace)
    transfer, = complete_events(read_trace(files.trace), "transfer")
    assert transfer["args"]["bytes"] == 12 and transfer["args"]["dtype"] == "int32"
    assert any("no profiler extension" in note for note in files.notes)


def test_a_second_trace_in_the_same_second_gets_its_own_directory(tmp_path):
    written = []
    for _ in range(4):
        with profiler.trace(tmp_path):
            pass
        written.append(glob.glob(str(tmp_path / "plugins" / "profile" / "*")))
    assert [len(runs) for runs in written] == [1, 2, 3, 4]
    for run in written[-1]:
        assert os.listdir(run) == [f"{_host()}.trace.json.gz"]


def test_nothing_is_recorded_outside_a_trace(client, tmp_path):
    a = client.buffer_from_pyval(np.ones(8, np.float32))
    with profiler.TraceAnnotation("before"):
        pass
    assert not profiler.TraceAnnotation.is_enabled()
    with profiler.trace(tmp_path):
        assert profiler.TraceAnnotation.is_enabled()
        with profiler.TraceAnnotation("inside"):
            a.block_until_ready()
    a.block_until_ready()
    with profiler.TraceAnnotation("after"):
        pass
    events = complete_events(read_trace(_only_trace(tmp_path)))
    assert [(e["cat"], e["name"]) for e in events] == [("annotation", "inside"),
                                                        ("wait", "block_until_ready")]


# -- annotations -------------------------------------------------------------------------------

@profiler.annotate_function
def annotated_step(client, value):
    return client.buffer_from_pyval(value).block_until_ready()


def test_annotations_nest_and_carry_their_facts(client, tmp_path):
    named = profiler.annotate_function(lambda: None, name="named", kind="lambda")
    with profiler.trace(tmp_path):
        with profiler.TraceAnnotation("outer", batch=3) as outer:
            for step in range(2):
                with profiler.StepTraceAnnotation("train", step_num=step):
                    annotated_step(client, np.full(4, step, np.float32))
            named()
            outer.set_metadata(done=True)
    document = read_trace(_only_trace(tmp_path))
    check_times(document)
    events = complete_events(document)
    outer_event, = [e for e in events if e["name"] == "outer"]
    assert outer_event["cat"] == "annotation"
    assert outer_event["args"] == {"batch": 3, "done": True}
    steps = [e for e in events if e["cat"] == "step"]
    assert [(s["name"], s["args"]) for s in steps] == [("train", {"step_num": 0}),
                                                       ("train", {"step_num": 1})]
    functions = [e for e in events if e["name"] == "annotated_step"]
    named_event, = [e for e in events if e["name"] == "named"]
    assert named_event["args"] == {"kind": "lambda"}
    assert len(functions) == 2

    def inside(inner, outer):
        return (outer["ts"] <= inner["ts"]
                and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 0.002)

    for step, function in zip(steps, functions):
        assert inside(step, outer_event) and inside(function, step)
        transfer, = [e for e in complete_events(document, "transfer") if inside(e, function)]
        wait, = [e for e in complete_events(document, "wait") if inside(e, function)]
        assert transfer["ts"] < wait["ts"]
    assert inside(named_event, outer_event)
    assert not inside(steps[1], steps[0])


def test_an_annotation_records_the_error_that_ended_it(tmp_path):
    with profiler.trace(tmp_path):
        with pytest.raises(KeyError):
            with profiler.TraceAnnotation("failing"):
                raise KeyError("missing")
    event, = complete_events(read_trace(_only_trace(tmp_path)))
    assert event["name"] == "failing" and "KeyError" in event["args"]["error"]


class _Unprintable:
    """A value that cannot say what it is: its str and repr raise."""

    def __str__(self):
        raise RuntimeError("no text")

    __repr__ = __str__


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def strict_json(path) -> dict:
    """The trace as a strict JSON parser (a browser's) reads it: NaN and Infinity refused."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    with gzip.open(path, "rt", encoding="utf-8") as stream:
        return json.load(stream, parse_constant=refuse)


def test_annotation_values_json_has_no_form_for_are_written_as_text(tmp_path):
    cycle = [1]
    cycle.append(cycle)
    loop = {"name": "loop"}
    loop["self"] = loop
    deep = []
    inner = deep
    for _ in range(100):
        inner.append([])
        inner = inner[0]
    batch = [1, 2]
    with profiler.trace(tmp_path):
        with profiler.TraceAnnotation("keys", shape={(1, 2): 3, 4: "four", None: 0}):
            pass
        with profiler.TraceAnnotation("cycles", cycle=cycle, loop=loop):
            pass
        with profiler.TraceAnnotation("numbers", nan=float("nan"), inf=-np.inf,
                                      np_int=np.int64(7), np_float=np.float32(0.5),
                                      huge=2 ** 70):
            pass
        with profiler.TraceAnnotation("objects", unprintable=_Unprintable(), kind=complex(1, 2),
                                      items=(b"ab", {1, 2} - {2}), deep=deep) as objects:
            objects.set_metadata(dtype=np.dtype("float32"))
        with pytest.raises(_UnprintableError):
            with profiler.TraceAnnotation("failing"):
                raise _UnprintableError()
        with profiler.TraceAnnotation("read at the end", batch=batch):
            batch.append(3)
        batch.append(4)  # after the block: not in its event
    events = {e["name"]: e["args"] for e in complete_events(strict_json(_only_trace(tmp_path)))}
    assert events["keys"] == {"shape": {"(1, 2)": 3, "4": "four", "None": 0}}
    assert events["cycles"] == {"cycle": [1, "[...]"], "loop": {"name": "loop", "self": "{...}"}}
    assert events["numbers"] == {"nan": "nan", "inf": "-inf", "np_int": 7, "np_float": 0.5,
                                 "huge": 2 ** 70}
    objects = events["objects"]
    assert objects["unprintable"] == "<_Unprintable object>"
    assert objects["kind"] == "(1+2j)" and objects["items"] == ["b'ab'", "{1}"]
    assert objects["dtype"] == "float32"
    depth = 0
    inner = objects["deep"]
    while isinstance(inner, list):
        inner, depth = inner[0], depth + 1
    assert 10 < depth < 100 and "nested deeper" in inner
    assert events["failing"] == {"error": "_UnprintableError: (its message could not be read)"}
    assert events["read at the end"] == {"batch": [1, 2, 3]}


def test_a_bytes_log_dir_is_a_path(tmp_path):
    profiler.start_trace(os.fsencode(tmp_path / "bytes"))
    with profiler.TraceAnnotation("step"):
        pass
    files = profiler.stop_trace()
    assert isinstance(files.trace, str) and files.trace == _only_trace(tmp_path / "bytes")
    event, = complete_events(read_trace(files.trace))
    assert event["name"] == "step"


# -- misuse ------------------------------------------------------------------------------------

def test_starting_twice_and_stopping_what_never_started_are_clear_errors(tmp_path):
    with pytest.raises(RuntimeError, match="No profile started"):
        profiler.stop_trace()
    profiler.start_trace(tmp_path / "one")
    with pytest.raises(RuntimeError, match="already been started.*stop_trace"):
        profiler.start_trace(tmp_path / "two")
    with pytest.raises(RuntimeError, match="already been started"):
        with profiler.trace(tmp_path / "three"):
            pass
    assert profiler.is_tracing()  # the first trace goes on
    files = profiler.stop_trace()
    assert files.directory.startswith(str(tmp_path / "one"))
    assert not os.path.exists(tmp_path / "two") and not os.path.exists(tmp_path / "three")
    with pytest.raises(RuntimeError, match="No profile started"):
        profiler.stop_trace()
    with profiler.trace(tmp_path / "four"):  # and a new one starts
        pass


def test_arguments_jax_takes_that_pjrt_refuses(tmp_path):
    with pytest.raises(ValueError, match="create_perfetto_link is not supported.*"
                                         "create_perfetto_trace=True"):
        profiler.start_trace(tmp_path, create_perfetto_link=True)
    with pytest.raises(TypeError, match="ProfileOptions"):
        profiler.start_trace(tmp_path, profiler_options={"host_tracer_level": 2})
    assert not profiler.is_tracing()


@pytest.mark.parametrize("log_dir, error, said", [
    (3, TypeError, "log_dir must be a path .*not int"),
    (None, TypeError, "log_dir must be a path .*not NoneType"),
    ("", ValueError, "log_dir is empty"),
    (b"", ValueError, "log_dir is empty"),
])
def test_a_log_dir_that_is_no_path_is_refused_when_the_trace_starts(log_dir, error, said):
    with pytest.raises(error, match=said):
        profiler.start_trace(log_dir)
    assert not profiler.is_tracing()


# -- threads -----------------------------------------------------------------------------------

def test_tracing_toggled_while_other_threads_launch(client, tmp_path):
    executable = client.compile_and_load(TINY.read_text())
    a = client.buffer_from_pyval(np.arange(8, dtype=np.float32))
    expected = np.tanh(np.arange(8, dtype=np.float32) + 1)
    executable.execute([a, a])
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = []
    workers: dict[int, str] = {}

    launched: list[int] = []

    def launch_until_stopped(index: int) -> None:
        workers[threading.get_native_id()] = threading.current_thread().name
        done = 0
        try:
            while not stop.is_set() or done < 20:
                out, = executable.execute([a, np.ones(8, np.float32)], copy_host_values=True)
                np.testing.assert_allclose(np.asarray(out.block_until_ready()), expected,
                                           rtol=1e-6)
                done += 1
                launched.append(index)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        counts.append(done)

    threads = [threading.Thread(target=launch_until_stopped, args=(i,), name=f"launcher-{i}")
               for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(5):
            with profiler.trace(tmp_path / str(round_)):
                with profiler.TraceAnnotation("main", round=round_):
                    executable.execute([a, a])[0].block_until_ready()
                wanted, deadline = len(launched) + 6, time.monotonic() + 30
                while len(launched) < wanted and time.monotonic() < deadline:
                    time.sleep(0.001)  # the other threads launch meanwhile
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    assert len(counts) == 3 and min(counts) >= 20
    seen_workers = set()
    for round_ in range(5):
        document = read_trace(_only_trace(tmp_path / str(round_)))
        check_times(document)
        names = {e["tid"]: e["args"]["name"] for e in document["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        for event in complete_events(document, "launch"):
            assert event["tid"] in workers or event["tid"] == threading.get_native_id()
            assert names[event["tid"]] == workers.get(event["tid"], "MainThread")
            assert event["name"] == "jit_tiny_tanh"
            seen_workers.add(event["tid"])
    assert seen_workers & set(workers)  # the other threads' launches were recorded


# -- ProfileOptions ----------------------------------------------------------------------------

def test_profile_options_serialize_as_tensorflow_profile_options():
    options = profiler.ProfileOptions()
    fields = protowire.group_fields(options.SerializeAsString())
    value = {number: occurrences[0][2] if isinstance(occurrences[0], tuple) else occurrences[0]
             for number, occurrences in fields.items()}
    # version 5, include_dataset_ops 1, host 2, device 3, python 4, enable_hlo_proto 7
    assert {n: value[n] for n in (5, 1, 2, 3, 4, 7)} == {5: 1, 1: 1, 2: 2, 3: 1, 4: 1, 7: 1}
    options.host_tracer_level = 3
    options.advanced_configuration = {"gpu_max_events": 7, "enabled": True, "mode": "x"}
    encoded = options.SerializeAsString()
    entries = [protowire.group_fields(entry) for number, _, entry
               in protowire.iter_fields(encoded) if number == 12]
    assert [protowire.to_str(e[1][0][2] if isinstance(e[1][0], tuple) else e[1][0])
            for e in entries] == ["enabled", "gpu_max_events", "mode"]
    assert protowire.decode(encoded)[2][2] == 3
    options.advanced_configuration = {"bad": 1.5}
    with pytest.raises(TypeError, match=r"advanced_configuration\['bad'\] is a float"):
        options.SerializeAsString()


# -- a plugin's own profiler, through the fault plugin's extension --------------------------------

@pytest.fixture
def profiled_plugin(built, tmp_path, monkeypatch):
    """``make(mode)``: a fresh copy of the fault plugin whose profiler extension behaves as
    ``mode`` says (see fault_plugin.c), loaded under a name of its own; ``(plugin, ctypes
    library)``. Clients made of it are closed after the test."""
    made = []
    clients = []

    def make(mode: str):
        copy = tmp_path / f"libfault_profiler_{mode}_{len(made)}.so"
        shutil.copyfile(built.fault_plugin, copy)
        monkeypatch.setenv("PJRT_FAULT_PROFILER", mode)  # read when the plugin loads
        name = f"fault_profiler_{mode}_{os.getpid()}_{len(made)}_{tmp_path.name[-12:]}"
        plugin = pjrt.load_pjrt_plugin_dynamically(name, copy)
        made.append(plugin)
        return plugin, ctypes.CDLL(str(copy))

    def client_of(plugin):
        client = pjrt.make_c_api_client(plugin.name)
        clients.append(client)
        return client

    make.client_of = client_of
    yield make
    for client in clients:
        client.close()


def profiler_counts(library) -> list[int]:
    counts = (ctypes.c_long * 4)()
    library.fault_profiler_counts(counts)
    return list(counts)  # created, destroyed, errors created, errors destroyed


@pytest.mark.parametrize("mode", ["record", "record_sized"])
def test_a_plugin_profile_is_written_as_the_plugin_gave_it(profiled_plugin, tmp_path, mode):
    plugin, library = profiled_plugin(mode)
    client = profiled_plugin.client_of(plugin)  # a client before the trace starts
    with profiler.trace(tmp_path / "log"):
        client.buffer_from_pyval(np.ones(4, np.float32)).block_until_ready()
    run, = glob.glob(str(tmp_path / "log" / "plugins" / "profile" / "*"))
    data = open(os.path.join(run, f"{_host()}.xplane.pb"), "rb").read()
    # The one-plane XSpace the fault profiler answers, without XLA's extra zero byte.
    assert xspace.plane_names(data) == ["/device:FAULT:0"]
    assert data.endswith(b"\x22\x05fault") and len(data) == 28
    assert profiler_counts(library) == [1, 1, 0, 0]
    assert library.fault_misuse_count() == 0
    size = ctypes.c_size_t()
    library.fault_profiler_options.restype = ctypes.c_void_p
    address = library.fault_profiler_options(ctypes.byref(size))
    assert ctypes.string_at(address, size.value) == profiler.ProfileOptions().SerializeAsString()
    notes = read_trace(_only_trace(tmp_path / "log"))["otherData"]["notes"]
    assert f"plugin {plugin.name!r} recorded 1 plane (/device:FAULT:0): see the .xplane.pb file" \
        in notes


def test_a_plugin_brought_up_during_a_trace_is_profiled_from_then(profiled_plugin, tmp_path):
    plugin, library = profiled_plugin("record")
    with profiler.trace(tmp_path):
        assert profiler_counts(library) == [0, 0, 0, 0]  # no client yet: nothing to record
        client = profiled_plugin.client_of(plugin)
        assert profiler_counts(library) == [1, 0, 0, 0]
        client.buffer_from_pyval(np.ones(2, np.float32))
        profiled_plugin.client_of(plugin)  # a second client: the same profiler
    assert profiler_counts(library) == [1, 1, 0, 0]
    files = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(files) == 1 and os.path.getsize(files[0]) == 28


@pytest.mark.parametrize("mode, said", [
    ("fail_create", "failed to create a profiler: fault plugin: profiler create failed"),
    ("fail_start", "failed to start: fault plugin: profiler start failed"),
    ("fail_stop", "is lost: UNAVAILABLE: the profiler of plugin .* failed to stop"),
    ("fail_collect", "is lost: UNAVAILABLE: .*failed to hand over what it recorded"),
    ("garbage", "is lost: the plugin's profile is not an XSpace message"),
    ("small_table", "records no device activity: its profiler table is 72 bytes, smaller "
                    "than the 80 bytes"),
])
def test_a_failing_plugin_profiler_is_noted_and_the_trace_goes_on(profiled_plugin, tmp_path,
                                                                   mode, said):
    import re

    plugin, library = profiled_plugin(mode)
    client = profiled_plugin.client_of(plugin)
    with profiler.trace(tmp_path):
        client.buffer_from_pyval(np.ones(4, np.float32))
    run, = glob.glob(str(tmp_path / "plugins" / "profile" / "*"))
    assert os.listdir(run) == [f"{_host()}.trace.json.gz"]
    document = read_trace(os.path.join(run, os.listdir(run)[0]))
    notes = [n for n in document["otherData"]["notes"] if repr(plugin.name) in n]
    assert len(notes) == 1 and re.search(said, notes[0]), notes
    transfer, = complete_events(document, "transfer")  # pjrt's own events are all there
    assert transfer["args"]["device"].startswith("fault:")
    created, destroyed, errors, errors_freed = profiler_counts(library)
    assert created == destroyed  # every profiler made is freed, once
    assert errors == errors_freed == (0 if mode in ("garbage", "small_table") else 1)
    assert library.fault_misuse_count() == 0


def test_a_profiler_that_fails_to_start_can_stop_the_trace_from_starting(profiled_plugin,
                                                                         tmp_path):
    plugin, library = profiled_plugin("fail_start")
    profiled_plugin.client_of(plugin)
    options = profiler.ProfileOptions()
    options.raise_error_on_start_failure = True
    with pytest.raises(pjrt.XlaRuntimeError, match="UNAVAILABLE: the profiler of plugin .* "
                                                   "failed to start"):
        profiler.start_trace(tmp_path, profiler_options=options)
    assert not profiler.is_tracing()
    assert profiler_counts(library) == [1, 1, 1, 1]
    with profiler.trace(tmp_path):  # without the option the trace runs, and says why
        pass


# -- pjrt trace --------------------------------------------------------------------------------

PROGRAM = """
import sys
import numpy as np
import pjrt

pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
client = pjrt.make_c_api_client("cpu")
executable = client.compile_and_load(open(sys.argv[2]).read())
x = client.buffer_from_pyval(np.ones(8, np.float32))
with pjrt.profiler.TraceAnnotation("the program's own"):
    out, = executable.execute([x, x])
print("result", np.asarray(out.block_until_ready())[0], sys.argv[3:])
sys.exit(3)
"""


def test_pjrt_trace_runs_a_program_with_a_trace_and_says_where_it_went(cpu_plugin, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = child_env(drop=("PJRT_", "JAX_"), PJRT_PLATFORMS="", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "pjrt", "trace", "--log-dir", str(tmp_path / "log"), "--",
         "python", str(script), cpu_plugin.library_path, TINY.path(), "--flag", "x"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 3, result.stderr  # the program's own status
    assert f"result {np.tanh(2.0):.7}"[:12] in result.stdout
    assert "['--flag', 'x']" in result.stdout
    trace, = glob.glob(str(tmp_path / "log" / "plugins" / "profile" / "*" / "*.trace.json.gz"))
    assert f"pjrt trace: the trace is in {os.path.dirname(trace)}" in result.stderr
    assert f"pjrt's events: {trace}" in result.stderr
    assert "note: plugin 'cpu' records no device activity" in result.stderr
    document = read_trace(trace)
    check_times(document)
    names = [(e["cat"], e["name"]) for e in complete_events(document)]
    assert ("compile", "compile jit_tiny_tanh") in names
    assert ("transfer", "host-to-device") in names
    assert ("annotation", "the program's own") in names
    assert ("launch", "jit_tiny_tanh") in names and ("wait", "block_until_ready") in names


def test_pjrt_trace_runs_a_module_and_shows_its_error(tmp_path):
    (tmp_path / "failing_module.py").write_text(textwrap.dedent("""
        import sys
        print("argv", sys.argv[1:])
        raise LookupError("the program failed")
        """))
    env = child_env(drop=("PJRT_", "JAX_"), PJRT_PLATFORMS="", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-m", "pjrt", "trace", "--log-dir", "out", "--",
                             "python3", "-m", "failing_module", "a"],
                            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 1
    assert "argv ['a']" in result.stdout
    assert "LookupError: the program failed" in result.stderr
    assert "pjrt trace: the trace is in" in result.stderr
    assert len(glob.glob(str(tmp_path / "out" / "plugins" / "profile" / "*"))) == 1


def test_pjrt_trace_keeps_the_status_of_a_program_that_stops_the_trace(tmp_path, capsys):
    program = tmp_path / "stopper.py"
    program.write_text(textwrap.dedent("""
        import sys
        from pjrt import profiler
        with profiler.TraceAnnotation("before the stop"):
            pass
        print("written", profiler.stop_trace().trace)
        sys.exit(3)
        """))
    status = trace_command.run(["--", "python", str(program)], str(tmp_path / "out"))
    said = capsys.readouterr()
    assert status == 3  # the program's, not the failure of a second stop_trace
    assert not profiler.is_tracing()
    assert "pjrt trace: the program stopped the trace itself" in said.err
    written = said.out.split("written ", 1)[1].strip()
    assert written == _only_trace(tmp_path / "out")
    event, = complete_events(read_trace(written))
    assert event["name"] == "before the stop"


@pytest.mark.parametrize("command, said", [
    ([], "say which program to run"),
    (["--", "python"], "say which program to run"),
    (["--", "python", "-u", "prog.py"], "pjrt trace takes a program and its arguments, not "
                                        "the interpreter option '-u'"),
    (["--", "bash", "run.sh"], "'bash' is not a file; pjrt trace runs Python programs"),
    (["--", "python", "-m"], "-m needs a module name"),
])
def test_pjrt_trace_says_how_to_call_it(command, said, capsys, tmp_path):
    status = cli.main(["trace", "--log-dir", str(tmp_path), *command])
    error = capsys.readouterr().err
    assert status == cli.USAGE
    assert f"pjrt trace: error: {said}" in error and "pjrt trace [--log-dir DIR] --" in error
    assert not profiler.is_tracing() and not os.listdir(tmp_path)


def _only_trace(log_dir) -> str:
    trace, = glob.glob(str(log_dir / "plugins" / "profile" / "*" / "*.trace.json.gz"))
    return trace


def _host() -> str:
    import socket

    return socket.gethostname()
