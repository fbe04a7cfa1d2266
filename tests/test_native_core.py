"""The native runtime (``pjrt._native_runtime``, wired by ``pjrt._capi.native_runtime``) as the
one owner of its rules, on the real CPU plugins: an Array's field list is C's and its stubs
agree with it; every Array, whichever way it is made, comes out of the one constructor; the
call tickets and the release of buffers are the handle's, for Python and C callers alike.
"""
from __future__ import annotations

import ast
import gc
import pathlib

import numpy as np
import pytest

from fixtures import programs
from pjrt._capi import native_runtime
from pjrt.array import Array

CORE = pathlib.Path(__file__).resolve().parent.parent / "core" / "pjrt"
TINY = programs.get("tiny_tanh")


def _c_fields(cls: type) -> set[str]:
    """The names of a C type's member table (its fields, as C declares them)."""
    return {name for name, value in vars(cls).items()
            if type(value).__name__ == "member_descriptor"}


def _stub_fields(class_name: str) -> set[str]:
    tree = ast.parse((CORE / "_native_runtime.pyi").read_text())
    stub = next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == class_name)
    return {node.target.id for node in stub.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def test_the_typing_stubs_declare_exactly_the_c_fields_of_an_array():
    fields = _c_fields(native_runtime.ArrayCore)
    assert {"_handle", "_buffers", "shape", "dtype", "_sharding"} <= fields
    assert _stub_fields("ArrayCore") == fields


def test_the_field_list_is_written_once_in_c():
    """The struct, member table, traversal and constructor all come from HP_ARRAY_FIELDS."""
    header = (CORE / "_native" / "hot_path.h").read_text()
    sources = "".join(path.read_text() for path in (CORE / "_native").glob("*.c"))
    for field in _c_fields(native_runtime.ArrayCore):
        assert f'"{field}"' in header  # named in the one list
        if field.startswith("_"):
            assert f'"{field}"' not in sources  # and in no hand-written table
    assert sources.count("offsetof(ArrayCore,") == 1  # the member table, made from the list


def _field_list() -> list[tuple[str, str]]:
    """HP_ARRAY_FIELDS, the source of an Array's fields: (C name, Python name) in its order."""
    import re

    header = (CORE / "_native" / "hot_path.h").read_text()
    body = header[header.index("#define HP_ARRAY_FIELDS(apply)"):]
    body = body[:body.index("\n\n")]
    return re.findall(r'apply\((\w+), "(\w+)"\)', body)


def _c_function(source: str, name: str) -> tuple[list[str], str]:
    """The parameter names and the body of the C function ``name`` defined in ``source``."""
    import re

    start = re.search(rf"^static int {name}\(([^)]*)\)\s*{{", source, re.M)
    assert start is not None, name
    parameters = [p.split("*")[-1].strip() for p in start.group(1).split(",")]
    depth, end = 1, start.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        end += 1
    return parameters, source[start.end():end]


def _stub_parameters(class_name: str, method: str) -> list[str]:
    tree = ast.parse((CORE / "_native_runtime.pyi").read_text())
    stub = next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == class_name)
    function = next(node for node in stub.body
                    if isinstance(node, ast.FunctionDef) and node.name == method)
    return [a.arg for a in function.args.args[1:]]


def test_fill_and_the_stubs_follow_the_one_field_list():
    """HP_ARRAY_FIELDS is the source: the type's members are its Python names; ``fill()``, the
    one constructor, sets each of its fields exactly once; fill's parameters are fields of the
    list, in the order the constructors' keywords and the stubs of ``__init__`` and ``_adopt``
    take them."""
    import re

    fields = _field_list()
    assert {python for _, python in fields} == _c_fields(native_runtime.ArrayCore)
    source = (CORE / "_native" / "array_core.c").read_text()
    parameters, body = _c_function(source, "fill")
    assert parameters[0] == "self"
    c_names = [c for c, _ in fields]
    sets = re.findall(r"^\s*SET\((\w+),", body, re.M)
    assert sorted(sets) == sorted(c_names), "fill() sets each field once"
    taken = parameters[1:]
    assert set(taken) <= set(c_names)
    keywords = re.search(r"keywords\[\] = \{([^}]*)\}", source).group(1)
    assert re.findall(r'"(\w+)"', keywords) == taken
    assert _stub_parameters("ArrayCore", "__init__") == taken
    assert _stub_parameters("ArrayCore", "_adopt") == taken


def test_every_way_of_making_an_array_fills_every_field(client, device):
    executable = client.compile_and_load(TINY.read_text())
    made = client.buffer_from_pyval(np.arange(8, dtype=np.float32), device)  # __init__
    (by_plan,) = executable.execute([made, made])  # the C per-call path
    # A strided host value is one the C path leaves to Python, which copies it and runs the call.
    strided = np.arange(16, dtype=np.float32)[::2]
    (by_python,) = executable.execute([made, strided], copy_host_values=True)
    adopted = Array._adopt(client, client.raw_handle, [made.live_buffers()[0]], (device,),
                           (8,), np.dtype(np.float32))
    try:
        for array in (made, by_plan, by_python, adopted):
            assert type(array) is Array
            for field in _c_fields(native_runtime.ArrayCore):
                getattr(array, field)  # set: an unset field raises AttributeError
            assert array.shape == (8,) and array.dtype == np.float32
        a = np.arange(8, dtype=np.float32)
        np.testing.assert_allclose(np.asarray(by_plan), np.tanh(a * a + 1), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(by_python), np.tanh(a * strided + 1), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(adopted), np.arange(8, dtype=np.float32))
    finally:
        # `adopted` was given `made`'s buffer: it must not be freed twice.
        client.raw_handle.buffers.pop(id(adopted))


def test_an_array_is_made_once(client, device):
    array = client.buffer_from_pyval(np.zeros(4, np.float32), device)
    with pytest.raises(TypeError, match="made once"):
        native_runtime.ArrayCore.__init__(array, client, client.raw_handle, [], (device,), (4,),
                                  np.dtype(np.float32))
    np.testing.assert_array_equal(np.asarray(array), np.zeros(4, np.float32))


def test_an_array_needs_its_clients_handle(client, device):
    with pytest.raises(TypeError, match="ClientHandle"):
        Array._adopt(client, object(), [], (device,), (4,), np.dtype(np.float32))


def test_tickets_are_the_handles_for_python_and_c(client, device):
    handle = client.raw_handle
    running = dict(handle.active)
    ticket = handle.take_ticket()
    assert ticket in handle.active
    try:
        # A buffer released while this call runs waits for it (parked), not freed under it.
        array = client.buffer_from_pyval(np.ones(8, np.float32), device)
        owner = id(array)
        del array
        gc.collect()
        assert owner not in handle.buffers
        assert any(entry[0] > ticket and entry[1] == "buffers" for entry in handle.parked)
    finally:
        handle.end(ticket)
    assert ticket not in handle.active
    assert dict(handle.active) == running
    assert not any(entry[1] == "buffers" and entry[0] > ticket for entry in handle.parked)


def _count_settles(monkeypatch, handle) -> list:
    """Counts the handle's settle() calls (the Python side of freeing what was parked)."""
    calls = []
    settle = type(handle).settle

    def counting(self):
        calls.append(1)
        return settle(self)

    monkeypatch.setattr(type(handle), "settle", counting)
    return calls


def test_parked_buffers_are_freed_when_the_oldest_call_ends_without_python(
        client, device, monkeypatch):
    """A release while other calls run is parked; the end of a newer call frees nothing, and
    the end of the oldest frees it in C: no call's end runs settle() for plain buffers (with
    several threads calling, nearly every release is parked)."""
    handle = client.raw_handle
    assert not handle.active and not handle.parked
    settles = _count_settles(monkeypatch, handle)
    older = handle.take_ticket()
    newer = handle.take_ticket()
    try:
        array = client.buffer_from_pyval(np.ones(8, np.float32), device)
        owner = id(array)
        del array
        gc.collect()
        assert owner not in handle.buffers
        assert [entry[1] for entry in handle.parked] == ["buffers"]
        handle.end(newer)
        newer = None
        assert [entry[1] for entry in handle.parked] == ["buffers"]  # `older` may use it
    finally:
        if newer is not None:
            handle.end(newer)
        handle.end(older)
    assert not handle.parked and not handle.active
    assert settles == []


def test_threads_calling_one_client_leave_nothing_parked(client, device, monkeypatch):
    """Two threads calling at once: a release while the other's call runs is freed at once
    when that call does not pass its buffers, and anything parked is freed in C as calls end
    (before, each call's end ran settle() in Python)."""
    import threading

    handle = client.raw_handle
    executable = client.compile_and_load(TINY.read_text())
    a = client.buffer_from_pyval(np.arange(8, dtype=np.float32), device)
    executable.execute([a, a])  # the first launch decides where launches run
    settles = _count_settles(monkeypatch, handle)
    owned = len(handle.buffers)

    def work():
        for _ in range(2000):
            executable.execute([a, a])

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not handle.parked and not handle.active
    assert len(handle.buffers) == owned
    assert settles == []
    (out,) = executable.execute([a, a])
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(out), np.tanh(x * x + 1), rtol=1e-6)


def test_release_frees_at_once_when_no_call_runs(client, device):
    handle = client.raw_handle
    array = client.buffer_from_pyval(np.ones(8, np.float32), device)
    owner = id(array)
    parked = len(handle.parked)
    handle.release_buffers(owner)  # the array is now an owner without buffers
    assert owner not in handle.buffers and len(handle.parked) == parked
    handle.release_buffers(owner)  # released twice: the second finds nothing
    array._buffers = None  # (so that its collection has nothing to hand back either)
    del array


def test_the_plan_spans_at_most_the_c_limit_of_devices():
    assert native_runtime.MAX_DEVICES == 64


def test_a_buffer_query_kept_on_the_array_is_asked_once_and_a_deleted_array_still_raises(
        client, device):
    """``_queries`` is the one place an Array keeps a buffer query's answer (a kept query
    needs no C field of its own): ``memory_kind`` is asked of the plugin at the first read,
    agrees with a fresh answer and is the same answer afterwards, and a deleted Array raises
    as before."""
    import pjrt

    array = client.buffer_from_pyval(np.ones(8, np.float32), device)
    assert array._queries is None  # nothing asked yet: every way of making one leaves it so
    kind = array.memory_kind
    assert kind == pjrt.array._ask_memory_kind(array) == device.default_memory().kind
    assert array._queries == {"memory_kind": kind}
    assert array.memory_kind is kind  # the kept answer, not a new one
    array.delete()
    with pytest.raises(pjrt.errors.DeletedArrayError):
        array.memory_kind


DONOR = """
module @donor {
  func.func public @main(%x: tensor<8xf32> {tf.aliasing_output = 0 : i32},
                         %y: tensor<8xf32>) -> tensor<8xf32> {
    %0 = stablehlo.add %x, %y : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}"""


def test_a_release_during_a_call_parks_only_what_the_call_passes(client, device, monkeypatch):
    """A CallPlan call running (held here in its donation hook, its arguments placed) makes a
    release park only buffers the call passes: another array's buffers are freed at once, and
    an argument of the call deleted meanwhile waits until the call ends, without making the
    releases after it park. Before, with several threads calling, one call preempted in its
    launch parked every output the others let go."""
    from pjrt._runtime import launches

    handle = client.raw_handle
    during = []
    prepare = launches.prepare_call_donations

    def holding(donated, arguments):
        for step in during:
            step()
        return prepare(donated, arguments)

    monkeypatch.setattr(launches, "prepare_call_donations", holding)
    executable = client.compile_and_load(DONOR)
    x_host = np.arange(8, dtype=np.float32)
    y = client.buffer_from_pyval(np.full(8, 2.0, np.float32), device)
    for _ in range(2):  # the first launch decides where launches run; then the plan is made
        executable.execute([client.buffer_from_pyval(x_host, device), y])
    plan = executable._launcher.plan
    assert plan is not None and not handle.parked
    seen = {}

    def release_others_and_an_argument():
        other = client.buffer_from_pyval(np.ones(8, np.float32), device)
        owner = id(other)
        parked = len(handle.parked)
        assert len(handle.active) == 1  # this call
        del other
        assert owner not in handle.buffers
        seen["other parked"] = len(handle.parked) - parked
        y.delete()  # passed by this call: it must outlive the launch
        seen["argument parked"] = len(handle.parked) - parked
        third = client.buffer_from_pyval(np.ones(8, np.float32), device)
        del third  # freed at once, though something else is parked
        seen["then"] = len(handle.parked) - parked

    during.append(release_others_and_an_argument)
    x = client.buffer_from_pyval(x_host, device)
    (out,) = plan.run([x, y], False)
    during.clear()
    assert seen == {"other parked": 0, "argument parked": 1, "then": 1}
    assert not handle.parked and not handle.active
    np.testing.assert_array_equal(np.asarray(out), x_host + 2)
