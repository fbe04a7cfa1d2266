"""docs/jaxlib-parity.md stays true: every pjrt path it names exists, every difference it cites
is explained, and the registry's jaxlib-style answers match jax on the CPU plugins."""
from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import warnings

import numpy as np
import pytest

import pjrt
from pjrt import hosts, registry

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "jaxlib-parity.md"
_ROW = re.compile(r"^\| (?P<jaxlib>[^|]+) \| (?P<pjrt>[^|]+) \| (?P<status>[^|]+) \|$")


def _rows() -> list[dict]:
    rows = []
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match and not set(match["jaxlib"].strip()) <= {"-", " "} and \
                match["jaxlib"].strip() not in ("jaxlib", "#"):
            rows.append({k: v.strip() for k, v in match.groupdict().items()})
    return rows


def _resolve(path: str):
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            slots = getattr(obj, "__slots__", ())
            if part in slots or part in getattr(obj, "__annotations__", {}):
                return part  # an instance attribute
            if isinstance(obj, type) and f"self.{part} =" in inspect.getsource(obj) or \
                    isinstance(obj, type) and f"self.{part}: " in inspect.getsource(obj):
                return part  # an attribute every instance sets in __init__
            return None
    return obj


_API_ROWS = [r for r in _rows() if not r["jaxlib"].startswith("D")]
_DIFFERENCE_IDS = {r["jaxlib"] for r in _rows() if re.fullmatch(r"D\d+", r["jaxlib"])}


def test_the_doc_has_every_area_and_a_difference_table():
    assert len(_API_ROWS) > 100
    assert _DIFFERENCE_IDS == {f"D{i}" for i in range(1, len(_DIFFERENCE_IDS) + 1)}
    for name in ("`make_gpu_client`", "`Shape`", "`PrimitiveType`", "`ArrayCopySemantics`",
                 "`CustomCallTargetTraits`", "`get_topology_for_devices`",
                 "`LoadedExecutable.get_output_memory_kinds`", "`Client.get_default_layout`"):
        assert any(r["jaxlib"].startswith(name) for r in _API_ROWS), name


@pytest.mark.parametrize("row", _API_ROWS, ids=lambda r: r["jaxlib"].strip("`"))
def test_each_row_is_consistent(row):
    status = row["status"]
    assert status.split(":")[0].split(" (")[0] in ("implemented", "different",
                                                    "not applicable"), status
    for cited in re.findall(r"\(D\d+\)|: D\d+", status):
        assert cited.strip("(): ") in _DIFFERENCE_IDS, cited
    if status.startswith("not applicable"):
        assert row["pjrt"] == "—"
        return
    path = row["pjrt"].strip("`")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the doc names current homes
        assert _resolve(path) is not None, f"{path} does not exist"


def test_registry_takes_a_client_as_jax_does(client):
    assert registry.get_backend(client) is client
    assert registry.devices(client) == client.devices()
    assert registry.local_devices(backend=client) == client.local_devices()
    assert registry.local_devices(host_id=0, backend=client) == client.local_devices()
    assert registry.device_count(client) == client.device_count()
    assert registry.process_count(client) == 1


def test_host_queries_match_jax(client):
    jax = pytest.importorskip("jax")
    assert hosts.host_id(client) == jax.process_index() == 0
    assert hosts.host_ids(client) == [0]
    assert hosts.host_count(client) == jax.process_count() == 1
    assert hosts.using_pjrt_c_api(client) is True
    device = client.local_devices()[3]
    assert hosts.get_device_backend(device) is client
    with pytest.raises(TypeError, match="Device"):
        hosts.get_device_backend("cpu")


def test_hlo_sharding_from_proto_takes_jaxlib_objects():
    from jax._src.lib import xla_client as xc

    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.REPLICATED
    assert pjrt.xla_client.HloSharding.from_proto(proto).is_replicated()
    assert pjrt.xla_client.HloSharding.from_proto(proto.SerializeToString()).is_replicated()


def test_custom_call_api_version_zero_says_why():
    from pjrt.ffi import CustomCallTargetTraits

    assert int(CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE) == 1
    with pytest.raises(NotImplementedError, match="legacy custom-call ABI"):
        pjrt.register_custom_call_target("legacy_target", lambda *a: None, api_version=0)


def test_array_committed_and_copy_to_host_async(client):
    array = client.buffer_from_pyval(np.arange(3.0))
    assert array.committed is True
    assert array.copy_to_host_async() is None
    assert np.array_equal(np.asarray(array), np.arange(3.0))
