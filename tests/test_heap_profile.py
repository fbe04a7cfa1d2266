"""Client.heap_profile: the live arrays' and executables' memory as a pprof profile, read back
with protobuf's own parser against profile.proto's schema (a decoder independent of the
writer), on both CPU plugin builds."""
from __future__ import annotations

import collections
import gc
import gzip

import numpy as np
import pytest

import pjrt
from pjrt import profiler
from pjrt._profiling import heap
from pjrt.sharding import NamedSharding, PartitionSpec as P
from conftest import run_python


def _profile_class():
    """``perftools.profiles.Profile`` of pprof's profile.proto, built from its schema."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    schema = descriptor_pb2.FileDescriptorProto(name="heap_test_profile.proto",
                                                package="heap_test", syntax="proto3")
    messages = {
        "Profile": [("sample_type", 1, F.TYPE_MESSAGE, True, "ValueType"),
                    ("sample", 2, F.TYPE_MESSAGE, True, "Sample"),
                    ("location", 4, F.TYPE_MESSAGE, True, "Location"),
                    ("function", 5, F.TYPE_MESSAGE, True, "Function"),
                    ("string_table", 6, F.TYPE_STRING, True, None),
                    ("time_nanos", 9, F.TYPE_INT64, False, None),
                    ("period_type", 11, F.TYPE_MESSAGE, False, "ValueType"),
                    ("period", 12, F.TYPE_INT64, False, None),
                    ("default_sample_type", 14, F.TYPE_INT64, False, None)],
        "ValueType": [("type", 1, F.TYPE_INT64, False, None),
                      ("unit", 2, F.TYPE_INT64, False, None)],
        "Sample": [("location_id", 1, F.TYPE_UINT64, True, None),
                   ("value", 2, F.TYPE_INT64, True, None),
                   ("label", 3, F.TYPE_MESSAGE, True, "Label")],
        "Label": [("key", 1, F.TYPE_INT64, False, None), ("str", 2, F.TYPE_INT64, False, None),
                  ("num", 3, F.TYPE_INT64, False, None)],
        "Location": [("id", 1, F.TYPE_UINT64, False, None),
                     ("line", 4, F.TYPE_MESSAGE, True, "Line")],
        "Line": [("function_id", 1, F.TYPE_UINT64, False, None),
                 ("line", 2, F.TYPE_INT64, False, None)],
        "Function": [("id", 1, F.TYPE_UINT64, False, None), ("name", 2, F.TYPE_INT64, False, None),
                     ("system_name", 3, F.TYPE_INT64, False, None),
                     ("filename", 4, F.TYPE_INT64, False, None),
                     ("start_line", 5, F.TYPE_INT64, False, None)],
    }
    for name, fields in messages.items():
        message = schema.message_type.add(name=name)
        for field_name, number, kind, repeated, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind,
                                      label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                field.type_name = f".heap_test.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("heap_test.Profile"))


_Profile = None


def read_profile(data: bytes, all_kinds: bool = False, ours: bool = True):
    """``(profile, samples)``: samples as dicts with ``count``, ``bytes``, ``labels`` and
    ``stack`` (function names, innermost first); only the buffers' unless ``all_kinds``."""
    global _Profile
    if _Profile is None:
        _Profile = _profile_class()
    if data[:2] == b"\x1f\x8b":  # gzip: what device_memory_profile and pprof's files hold
        data = gzip.decompress(data)
    profile = _Profile.FromString(data)
    strings = list(profile.string_table)
    assert strings[0] == ""
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("allocations", "count"), ("space", "bytes")]
    if ours:  # jaxlib's sets neither
        assert strings[profile.default_sample_type] == "space" and profile.time_nanos > 0
    functions = {f.id: (strings[f.name], strings[f.filename]) for f in profile.function}
    locations = {loc.id: [functions[line.function_id] for line in loc.line]
                 for loc in profile.location}
    samples = []
    for sample in profile.sample:
        if not all_kinds and strings[sample.label[0].str] != "buffer":
            continue
        stack = [frame for location_id in sample.location_id for frame in locations[location_id]]
        samples.append({"count": sample.value[0], "bytes": sample.value[1],
                        "labels": {strings[l.key]: strings[l.str] for l in sample.label},
                        "stack": [name for name, _ in stack]})
    return profile, samples


def by_device(samples) -> dict:
    totals: dict = collections.Counter()
    for sample in samples:
        totals[sample["labels"]["device"]] += sample["bytes"]
    return dict(totals)


@pytest.fixture
def sites_off():
    previous = profiler.record_array_sites(False)
    yield
    profiler.record_array_sites(previous)


def test_samples_add_up_to_the_live_arrays_bytes(make_client, sites_off):
    client = make_client(devices=2)
    first, second = client.devices()
    small = client.buffer_from_pyval(np.ones(1000, np.float32), first)
    big = client.buffer_from_pyval(np.ones((128, 64), np.float64), second)
    mesh = pjrt.Mesh(np.array(client.devices()), ("x",))
    split = pjrt.device_put(np.arange(64, dtype=np.int32), NamedSharding(mesh, P("x")))
    _, samples = read_profile(client.heap_profile())
    live = small.on_device_size_in_bytes() + big.on_device_size_in_bytes() + \
        split.on_device_size_in_bytes()
    assert sum(s["bytes"] for s in samples) == live == 4000 + 65536 + 256
    assert sum(s["count"] for s in samples) == 4  # one buffer per shard
    assert by_device(samples) == {first.debug_string(): 4000 + 128,
                                  second.debug_string(): 65536 + 128}
    assert {(s["labels"]["kind"], s["labels"]["memory_kind"]) for s in samples} == {
        ("buffer", "device")}
    assert {tuple(s["stack"]) for s in samples} == {(heap.UNRECORDED,)}
    del big
    gc.collect()
    _, samples = read_profile(client.heap_profile())
    assert by_device(samples) == {first.debug_string(): 4000 + 128, second.debug_string(): 128}
    small.delete()
    _, samples = read_profile(client.heap_profile())
    assert sum(s["bytes"] for s in samples) == 256


def test_memory_kinds_are_told_apart(make_client, sites_off):
    client = make_client(devices=2)
    mesh = pjrt.Mesh(np.array(client.devices()), ("x",))
    pinned = pjrt.device_put(np.zeros(512, np.float32),
                             NamedSharding(mesh, P("x"), memory_kind="pinned_host"))
    on_device = pjrt.device_put(np.zeros(256, np.float32), NamedSharding(mesh, P()))
    _, samples = read_profile(client.heap_profile())
    kinds: dict = collections.Counter()
    for sample in samples:
        kinds[sample["labels"]["memory_kind"]] += sample["bytes"]
    assert dict(kinds) == {"pinned_host": 2048, "device": 2 * 1024}
    del pinned, on_device


def _made_here(client, device, size):
    return client.buffer_from_pyval(np.zeros(size, np.uint8), device)


def _made_elsewhere(client, device):
    made = []
    for _ in range(3):  # (not a comprehension: before Python 3.12 that is a frame of its own)
        made.append(_made_here(client, device, 100))
    return made


def test_recorded_sites_group_the_bytes(make_client, sites_off):
    client = make_client(devices=1)
    device = client.devices()[0]
    before = client.buffer_from_pyval(np.zeros(10, np.uint8), device)
    assert profiler.record_array_sites(True) is False and heap.recording()
    own = _made_here(client, device, 1000)
    three = _made_elsewhere(client, device)
    computed = pjrt.device_put(np.zeros(7, np.uint8), device)
    profiler.record_array_sites(False)
    after = client.buffer_from_pyval(np.zeros(20, np.uint8), device)
    _, samples = read_profile(client.heap_profile())
    stacks = {tuple(s["stack"][:2]): (s["count"], s["bytes"]) for s in samples}
    test_name = "test_recorded_sites_group_the_bytes"
    assert stacks[("_made_here", test_name)] == (1, 1000)
    assert stacks[("_made_here", "_made_elsewhere")] == (3, 300)
    assert stacks[(test_name, "pytest_pyfunc_call")] == (1, 7)  # pjrt's own frames left out
    assert stacks[(heap.UNRECORDED,)] == (2, 30)
    assert sum(s["bytes"] for s in samples) == 1337
    del before, own, three, computed, after


def test_a_dead_arrays_site_is_forgotten(make_client, sites_off):
    client = make_client(devices=1)
    device = client.devices()[0]
    profiler.record_array_sites(True)
    try:
        made = _made_here(client, device, 64)
        key = id(made)
        assert heap.site_of(key)[0][1] == "_made_here"
        del made
        gc.collect()
        assert heap.site_of(key) is None and key not in heap._sites
    finally:
        profiler.record_array_sites(False)


def test_heap_profile_of_a_closed_client(make_client):
    client = make_client(devices=1)
    client.close()
    with pytest.raises(pjrt.ClosedClientError):
        client.heap_profile()


def test_recording_from_the_environment():
    result = run_python("""
        import sys
        import numpy as np
        sys.path.insert(0, "tests")
        import pjrt
        from conftest import cpu_plugin_path
        from pjrt._profiling import heap
        plugin = pjrt.load_pjrt_plugin_dynamically("p", cpu_plugin_path("xla_cpu_0_106"))
        client = pjrt.make_c_api_client("p", {"cpu_device_count": 1})
        def allocate():
            return client.buffer_from_pyval(np.zeros(4096, np.uint8))
        kept = allocate()
        raw = client.heap_profile()
        print(heap.recording(), b"allocate" in raw, heap.UNRECORDED.encode() in raw)
    """, env=dict(__import__("conftest").child_env(), PJRT_ARRAY_SITES="1"))
    assert result.stdout.split() == ["True", "True", "False"]


def test_device_memory_profile():
    """jax's ``ProfilerTest.testDeviceMemoryProfile`` (tests/profiler_test.py, jax 0.10.2;
    ``jnp.ones((20,)) + 7.`` made with pjrt), on pjrt's default backend."""
    x = pjrt.device_put(np.ones((20,), np.float32) + 7.0)
    assert isinstance(profiler.device_memory_profile(), bytes)
    del x


def test_device_memory_profile_of_a_backend_and_saved(tmp_path, sites_off):
    backend = pjrt.get_backend("cpu")
    x = pjrt.device_put(np.ones((20,), np.float32), backend.devices()[0])
    path = tmp_path / "memory.pb.gz"
    gc.collect()
    gc.disable()  # no earlier test's garbage freed between the two profiles
    try:
        _, samples = read_profile(profiler.device_memory_profile("cpu"))
        profiler.save_device_memory_profile(path, backend=backend)
    finally:
        gc.enable()
    assert sum(s["bytes"] for s in samples
               if s["labels"]["device"] == x.device.debug_string()) >= 80
    _, saved = read_profile(path.read_bytes())
    assert sum(s["bytes"] for s in saved) == sum(s["bytes"] for s in samples)
    del x


def test_the_profile_is_jaxlibs_bare_message_and_jax_gzips_it(make_client, jax_cpu):
    """jaxlib's Client.heap_profile() is the serialised Profile, which jax's
    device_memory_profile gzips: ours are the same forms."""
    import jax

    theirs = jax.devices("cpu")[0].client.heap_profile()
    ours = make_client(devices=1).heap_profile()
    for data, mine in ((theirs, False), (ours, True)):
        assert data[:2] != b"\x1f\x8b"
        read_profile(data, all_kinds=True, ours=mine)  # a Profile: allocations and space
    # Devices are labelled as jaxlib labels them: the device's DebugString (through the C
    # API, PJRT_DeviceDescription_DebugString).
    x = pjrt.device_put(np.ones(4, np.float32), pjrt.get_backend("cpu").devices()[0])
    labels = {s["labels"]["device"] for s in read_profile(
        pjrt.get_backend("cpu").heap_profile())[1]}
    assert x.device.debug_string() in labels
    del x
    assert jax.profiler.device_memory_profile()[:2] == b"\x1f\x8b"
    assert profiler.device_memory_profile()[:2] == b"\x1f\x8b"


def test_executables_are_counted_as_jaxlib_counts_them(make_client, sites_off):
    from conftest import TINY

    client = make_client(devices=1)
    first = client.compile_and_load(TINY.read_text(), client.devices())
    second = client.compile_and_load(TINY.read_text(), client.devices())
    _, samples = read_profile(client.heap_profile(), all_kinds=True)
    executables = [s for s in samples if s["labels"]["kind"] == "executable"]
    assert all(set(s["labels"]) == {"kind"} for s in executables)  # no device, as jaxlib's
    assert sum(s["count"] for s in executables) == 2
    assert sum(s["bytes"] for s in executables) == (
        first.size_of_generated_code_in_bytes() + second.size_of_generated_code_in_bytes())
    assert {s["stack"][0] for s in executables} == {f"executable {first.name()}"}
    first.delete()
    _, samples = read_profile(client.heap_profile(), all_kinds=True)
    assert sum(s["count"] for s in samples if s["labels"]["kind"] == "executable") == 1
