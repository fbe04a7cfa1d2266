"""Serialized executables name the plugin build that made them; other builds refuse them.

The two CPU plugins (XLA at PJRT API 0.81 and 0.106) both call themselves platform "cpu",
version "cpu", yet each misreads the other's executables; these tests check that pjrt tells
them apart, round trips on each, and refuses bytes it cannot vouch for.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, TEST_DEVICE_COUNT, cpu_plugin_path, run_python
from fixtures import programs
from pjrt._runtime import serialization
from pjrt._pjrt_cffi import ffi
from pjrt.errors import IncompatibleExecutableError

TINY = programs.get("tiny_tanh")
PRODUCER_CONSUMER = [("xla_cpu_0_106", "xla_cpu_0_81"), ("xla_cpu_0_81", "xla_cpu_0_106")]


@pytest.fixture(scope="module")
def clients():
    """A client of each CPU plugin at once, by plugin name, for tests across builds."""
    made = {}
    for name in sorted(CPU_PLUGINS):
        pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
        made[name] = pjrt.make_c_api_client(name, {"cpu_device_count": TEST_DEVICE_COUNT})
    yield made
    for client in made.values():
        client.close()


def _run_tiny(client, executable) -> None:
    arguments = [client.buffer_from_pyval(v) for v in TINY.inputs()]
    outputs = executable.execute(arguments)
    programs.check_outputs(TINY, [np.asarray(outputs[0])])


def _identity(client) -> serialization.PluginIdentity:
    return serialization.plugin_identity(client.plugin, client.platform, client.platform_version)


def _split(blob: bytes) -> tuple[dict, bytes]:
    """The decoded header and the payload of an envelope, read independently of pjrt."""
    magic, version, size = struct.unpack(">8sHI", blob[:14])
    assert magic == b"PJRTEXE\x00" and version == 1
    return json.loads(blob[14:14 + size]), blob[14 + size:]


def _join(header: dict, payload: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack(">8sHI", b"PJRTEXE\x00", 1, len(encoded)) + encoded + payload


# -- round trips ---------------------------------------------------------------------------


def test_round_trip_runs_the_program(client):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    loaded = client.deserialize_executable(blob)
    _run_tiny(client, loaded)


def test_envelope_records_the_plugin(client):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    header, payload = _split(blob)
    path = client.plugin.library_path
    with open(path, "rb") as file:
        expected_sha256 = hashlib.file_digest(file, "sha256").hexdigest()
    assert header["platform"] == client.platform == "cpu"
    assert header["platform_version"] == client.platform_version
    assert header["api_version"] == list(client.plugin.api_version)
    assert header["library_sha256"] == expected_sha256
    assert header["library"] == os.path.basename(path)
    assert header["payload_size"] == len(payload)
    assert header["payload_sha256"] == hashlib.sha256(payload).hexdigest()
    assert serialization.read_identity(blob) == _identity(client)


# -- across builds -------------------------------------------------------------------------


@pytest.mark.parametrize("producer, consumer", PRODUCER_CONSUMER)
def test_other_build_refuses(clients, producer, consumer):
    made_by, loading_with = clients[producer], clients[consumer]
    blob = made_by.compile_and_load(TINY.read_text()).serialize()
    with pytest.raises(IncompatibleExecutableError) as info:
        loading_with.deserialize_executable(blob)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.made_by == _identity(made_by) and error.loading_with == _identity(loading_with)
    message = str(error)
    made_minor, loading_minor = CPU_PLUGINS[producer][2], CPU_PLUGINS[consumer][2]
    assert f"Made by: platform 'cpu' version 'cpu', PJRT API 0.{made_minor}" in message
    assert f"Loading with: platform 'cpu' version 'cpu', PJRT API 0.{loading_minor}" in message
    assert CPU_PLUGINS[producer][1] in message and CPU_PLUGINS[consumer][1] in message
    assert "Recompile the program with this plugin" in message
    assert "load the executable with the plugin that made it" in message
    # Even vouching for the bytes does not override a proven mismatch.
    with pytest.raises(IncompatibleExecutableError):
        loading_with.deserialize_executable(blob, trust_unverified=True)
    # The plugin that made it still loads it.
    _run_tiny(made_by, made_by.deserialize_executable(blob))


# -- damaged and forged envelopes ------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("library_sha256", "0" * 64),
    ("api_version", [0, 99]),
    ("platform_version", "cpu 2"),
    ("platform", "gpu"),
    ("library_sha256", None),
])
def test_tampered_identity_is_refused(client, field, value):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    header, payload = _split(blob)
    header[field] = value
    with pytest.raises(IncompatibleExecutableError, match="Recompile the program"):
        client.deserialize_executable(_join(header, payload))


def test_library_name_alone_is_not_part_of_the_identity(client):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    header, payload = _split(blob)
    header["library"] = "renamed.so"
    _run_tiny(client, client.deserialize_executable(_join(header, payload)))


def test_truncated_blob_is_refused(client):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    header_end = 14 + struct.unpack(">I", blob[10:14])[0]
    for cut in (1, 9, 13, 14, 20, header_end - 1, header_end, header_end + 100, len(blob) - 1):
        with pytest.raises(ValueError, match="truncated or damaged") as info:
            client.deserialize_executable(blob[:cut])
        assert not isinstance(info.value, IncompatibleExecutableError), cut
    with pytest.raises(ValueError, match="truncated or padded"):
        client.deserialize_executable(blob + b"\0")


@pytest.mark.parametrize("damage", ["payload_byte", "header_byte", "header_not_object",
                                    "header_size", "bad_types", "format_version"])
def test_damaged_envelope_is_a_clear_error(client, damage):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    header, payload = _split(blob)
    if damage == "payload_byte":
        middle = len(payload) // 2
        broken, match = _join(header, payload[:middle] + bytes([payload[middle] ^ 0xFF])
                              + payload[middle + 1:]), "checksum"
    elif damage == "header_byte":
        broken, match = blob[:15] + b"\xff" + blob[16:], "not valid JSON"
    elif damage == "header_not_object":
        encoded = b"[1, 2]"
        broken = struct.pack(">8sHI", b"PJRTEXE\x00", 1, len(encoded)) + encoded + payload
        match = "not a JSON object"
    elif damage == "header_size":
        broken, match = blob[:10] + struct.pack(">I", 0xFFFFFFFF) + blob[14:], "header claims"
    elif damage == "bad_types":
        broken, match = _join({**header, "payload_size": "7056"}, payload), "'payload_size'"
    else:
        broken, match = blob[:8] + struct.pack(">H", 2) + blob[10:], "newer pjrt"
    with pytest.raises(ValueError, match=match):
        client.deserialize_executable(broken)
    _run_tiny(client, client.deserialize_executable(blob))  # and the process goes on


# -- bytes without an envelope -----------------------------------------------------------------


def test_bare_plugin_bytes_need_the_opt_in(client):
    blob = client.compile_and_load(TINY.read_text()).serialize()
    bare = serialization.unpack(blob, _identity(client))
    assert not serialization.is_packed(bare)
    with pytest.raises(IncompatibleExecutableError) as info:
        client.deserialize_executable(bare)
    message = str(info.value)
    assert "lack its header" in message and "trust_unverified=True" in message
    assert f"PJRT API 0.{client.plugin.api_version[1]}" in message
    assert info.value.made_by is None
    loaded = client.deserialize_executable(bare, trust_unverified=True)
    _run_tiny(client, loaded)
    # bytes-like objects other than bytes are accepted too
    _run_tiny(client, client.deserialize_executable(bytearray(blob)))
    _run_tiny(client, client.deserialize_executable(memoryview(bare), trust_unverified=True))


def test_plugin_handed_over_in_memory_cannot_be_verified(clients):
    on_disk = clients["xla_cpu_0_106"].plugin
    address = int(ffi.cast("uintptr_t", on_disk.api.table))
    plugin = pjrt.plugin_api.load_pjrt_plugin_with_c_api("xla_cpu_0_106_in_memory", address)
    with pjrt.make_c_api_client(plugin.name, {"cpu_device_count": 1}) as client:
        identity = _identity(client)
        assert identity.library_sha256 is None and not identity.verifiable
        blob = client.compile_and_load(TINY.read_text()).serialize()
        with pytest.raises(IncompatibleExecutableError, match="handed over in memory"):
            client.deserialize_executable(blob)
        _run_tiny(client, client.deserialize_executable(blob, trust_unverified=True))
        # The on-disk plugin cannot tell whether the in-memory one was its own build.
        on_disk_client = clients["xla_cpu_0_106"]
        with pytest.raises(IncompatibleExecutableError, match="handed over in memory"):
            on_disk_client.deserialize_executable(blob)
        _run_tiny(on_disk_client, on_disk_client.deserialize_executable(blob,
                                                                        trust_unverified=True))
        # Another build is refused whatever the caller vouches for.
        with pytest.raises(IncompatibleExecutableError, match="different plugin build"):
            clients["xla_cpu_0_81"].deserialize_executable(blob, trust_unverified=True)


# -- the library hash --------------------------------------------------------------------------


def test_library_is_hashed_once_per_process(client):
    path = client.plugin.library_path
    executable = client.compile_and_load(TINY.read_text())
    blob = executable.serialize()
    assert path in serialization.library_digests
    computed = serialization.library_digests.computed
    for _ in range(3):
        blob = executable.serialize()
        client.deserialize_executable(blob)
    assert serialization.library_digests.computed == computed


def test_digest_cache_reads_each_file_version_once(tmp_path):
    cache = serialization.DigestCache()
    library = tmp_path / "plugin.so"
    library.write_bytes(b"first build" * 100_000)
    link = tmp_path / "link.so"
    link.symlink_to(library)
    first = cache.digest(library)
    assert first == hashlib.sha256(library.read_bytes()).hexdigest()
    assert cache.digest(link) == first and cache.digest(str(library)) == first
    assert cache.computed == 1
    library.write_bytes(b"second build" * 100_000)
    os.utime(library, ns=(0, 10**18))  # a new mtime even on coarse file systems
    assert cache.digest(library) == hashlib.sha256(library.read_bytes()).hexdigest() != first
    assert cache.computed == 2


def test_loading_and_client_creation_hash_nothing():
    name = "xla_cpu_0_81"
    code = (
        "import sys, pjrt\n"
        f"pjrt.load_pjrt_plugin_dynamically({name!r}, {cpu_plugin_path(name)!r})\n"
        f"client = pjrt.make_c_api_client({name!r})\n"
        "client.compile_and_load(open(sys.argv[1]).read())\n"
        "serialization = sys.modules.get('pjrt._runtime.serialization')\n"
        "print(serialization.library_digests.computed if serialization else 'not imported')\n"
    )
    result = run_python(code, TINY.path())
    assert result.stdout.strip().splitlines()[-1] in ("0", "not imported")


# -- the envelope on its own ---------------------------------------------------------------------


def test_pack_and_unpack_without_a_plugin():
    identity = serialization.PluginIdentity("cpu", "cpu", (0, 81), "ab" * 32, "x.so")
    blob = serialization.pack(b"\x00payload\xff", identity)
    assert blob.startswith(serialization.MAGIC)
    assert serialization.unpack(blob, identity) == b"\x00payload\xff"
    renamed = serialization.PluginIdentity("cpu", "cpu", (0, 81), "ab" * 32, "y.so")
    assert serialization.unpack(blob, renamed) == b"\x00payload\xff"
    other = serialization.PluginIdentity("cpu", "cpu", (0, 106), "ab" * 32, "x.so")
    with pytest.raises(IncompatibleExecutableError, match="PJRT API 0.81.*PJRT API 0.106"):
        serialization.unpack(blob, other)
    assert serialization.pack(b"", identity) and serialization.unpack(
        serialization.pack(b"", identity), identity) == b""
    with pytest.raises(IncompatibleExecutableError, match="lack its header"):
        serialization.unpack(b"", identity)


# -- ahead-of-time compilation ---------------------------------------------------------------------


@pytest.mark.vendor
def test_topology_compile_names_the_topology_plugin(libtpu_v5e):
    """libtpu compiles for a v5e slice with no TPU; the bytes name libtpu's build."""
    path, plugin, topology = libtpu_v5e
    blob = topology.compile_to_bytes(TINY.read_text())
    made_by = serialization.read_identity(blob)
    with open(path, "rb") as file:
        expected_sha256 = hashlib.file_digest(file, "sha256").hexdigest()
    assert made_by == serialization.PluginIdentity(
        "tpu", topology.platform_version, plugin.api_version, expected_sha256)
    assert made_by.library == "libtpu.so"
    assert len(serialization.unpack(blob, made_by)) > 1000
