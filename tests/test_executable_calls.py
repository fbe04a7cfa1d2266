"""execute()'s per-call path: arguments passed straight to one C call once an executable launches
inline, and every other argument still checked (or copied) as before."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from pjrt._capi import long_runs
from conftest import failures_in_threads
from fixtures import programs

TINY = programs.get("tiny_tanh")


def _expected(a, b):
    return np.tanh(np.asarray(a, np.float32) * np.asarray(b, np.float32) + 1)


def _warm(executable, a, b):
    """Runs the first call, which launches through a worker; later calls launch inline."""
    executable.execute([a, b])
    assert executable.launches_inline


def test_mixed_device_and_host_arguments_give_the_right_values(client, tiny):
    a_host, b_host = TINY.inputs()
    a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
    _warm(tiny, a, b)
    want = _expected(a_host, b_host)
    for arguments in ([a, b], [a_host, b_host], [a, b_host], [a_host, b]):
        for _ in range(3):  # the call structs are reused: each call sees only its own values
            (out,) = tiny.execute(arguments, copy_host_values=True)
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    assert not a.is_deleted() and not b.is_deleted()


def test_host_values_the_call_cannot_take_directly_still_work(client, tiny):
    a_host, b_host = TINY.inputs()
    a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
    _warm(tiny, a, b)
    want = _expected(a_host, b_host)
    strided = np.empty(16, np.float32)
    strided[::2] = a_host
    swapped = a_host.astype(a_host.dtype.newbyteorder(">"))
    # Not contiguous, another byte order, a list: the full path copies each of them. A host
    # value accepted first and a later one refused leave nothing behind for the next call.
    for first, second in ((a_host, strided[::2]), (a_host, swapped), (a_host, list(b_host)),
                          (strided[::2], b_host)):
        (out,) = tiny.execute([first, second], copy_host_values=True)
        np.testing.assert_allclose(np.asarray(out), _expected(first, second), rtol=1e-6)
        (out,) = tiny.execute([a, b])
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)


def test_wrong_arguments_are_refused_after_the_first_call(client, tiny):
    a_host, b_host = TINY.inputs()
    a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
    _warm(tiny, a, b)
    with pytest.raises(TypeError, match="dtype"):
        tiny.execute([a_host, b_host.astype(np.float64)], copy_host_values=True)
    with pytest.raises(TypeError, match="shape"):
        tiny.execute([a, client.buffer_from_pyval(np.ones(4, np.float32))])
    with pytest.raises(TypeError, match="execute takes pjrt Arrays"):
        tiny.execute([a_host, b])  # host values only with copy_host_values
    with pytest.raises(ValueError, match="copy_to_device"):
        tiny.execute([a, client.buffer_from_pyval(b_host, client.local_devices()[1])])
    deleted = client.buffer_from_pyval(b_host)
    deleted.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        tiny.execute([a, deleted])
    (out,) = tiny.execute([a, b])
    np.testing.assert_allclose(np.asarray(out), _expected(a_host, b_host), rtol=1e-5,
                                           atol=1e-6)


def test_deleted_executable_and_closed_client_raise(make_client):
    own = make_client(devices=1)
    executable = own.compile_and_load(TINY.read_text())
    a_host, b_host = TINY.inputs()
    a, b = own.buffer_from_pyval(a_host), own.buffer_from_pyval(b_host)
    _warm(executable, a, b)
    other = own.compile_and_load(TINY.read_text())
    _warm(other, a, b)
    executable.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        executable.execute([a, b])
    own.close()
    with pytest.raises(pjrt.ClosedClientError):
        other.execute([a, b])
    with pytest.raises(pjrt.ClosedClientError):
        other.execute([a_host, b_host], copy_host_values=True)


def test_threads_calling_one_executable_each_get_their_own_results(client, tiny):
    _warm(tiny, *(client.buffer_from_pyval(v) for v in TINY.inputs()))

    def work(seed):
        rng = np.random.default_rng(seed)
        for k in range(150):
            a_host = rng.standard_normal(8).astype(np.float32)
            b_host = rng.standard_normal(8).astype(np.float32)
            arguments = ([client.buffer_from_pyval(a_host), b_host] if k % 2
                         else [a_host, client.buffer_from_pyval(b_host)])
            (out,) = tiny.execute(arguments, copy_host_values=True)
            np.testing.assert_allclose(np.asarray(out), _expected(a_host, b_host), rtol=1e-5,
                                       atol=1e-6)

    failures = failures_in_threads(work)
    assert not failures, failures[0]


def test_a_launch_that_runs_long_sends_the_next_ones_to_a_worker(client, monkeypatch):
    executable = client.compile_and_load(TINY.read_text())
    a, b = (client.buffer_from_pyval(v) for v in TINY.inputs())
    _warm(executable, a, b)
    # Every launch now counts as long; the call structs made from here on carry the limit.
    monkeypatch.setattr(long_runs, "INLINE_LIMIT_SECONDS", 0.0)
    executable._launcher.plan.drop_idle_calls()
    (out,) = executable.execute([a, b])
    np.testing.assert_allclose(np.asarray(out), _expected(*TINY.inputs()), rtol=1e-6)
    assert not executable.launches_inline


DONATING_TWO = """
func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def test_donation_after_the_first_call(client):
    executable = client.compile_and_load(DONATING_TWO)
    ones = np.ones(4, np.float32)
    executable.execute([client.buffer_from_pyval(ones), client.buffer_from_pyval(ones)])
    assert executable.launches_inline
    x, y = client.buffer_from_pyval(ones), client.buffer_from_pyval(ones * 2)
    (out,) = executable.execute([x, y])
    np.testing.assert_array_equal(np.asarray(out), ones * 3)
    assert x.is_deleted() and not y.is_deleted()  # consumed, as on the first call
    with pytest.raises(pjrt.DeletedArrayError, match="donated"):
        executable.execute([x, y])
    with pytest.raises(ValueError, match="donated"):
        executable.execute([y, y])
    assert not y.is_deleted()
    # An Array numpy reads is not donated: the plugin copies it, and the view stays valid.
    z = client.buffer_from_pyval(ones * 5)
    view = np.asarray(z)
    (out,) = executable.execute([z, y])
    np.testing.assert_array_equal(np.asarray(out), ones * 7)
    np.testing.assert_array_equal(view, ones * 5)
    # A host value in the donated slot is a copy made for the call alone.
    (out,) = executable.execute([ones, y], copy_host_values=True)
    np.testing.assert_array_equal(np.asarray(out), ones * 3)
    np.testing.assert_array_equal(ones, np.ones(4, np.float32))


DONATING_THREE = """
func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<4xf32>, %c: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  %1 = stablehlo.add %0, %c : tensor<4xf32>
  return %1 : tensor<4xf32>
}"""


def test_refused_donations_leave_nothing_behind_for_the_next_call(client):
    """A donated Array also passed in another slot is refused before the launch, every time
    (here 50 times in a row, some with a host value in the last slot); the Array stays
    intact, and the next proper call runs with its own arguments only (none of a refused
    call's slots or host values) and donates."""
    executable = client.compile_and_load(DONATING_THREE)
    ones = np.ones(4, np.float32)
    executable.execute([client.buffer_from_pyval(ones * k) for k in (1, 2, 3)])
    assert executable.launches_inline  # the per-call path from here on
    x, other = client.buffer_from_pyval(ones), client.buffer_from_pyval(ones * 50)
    host = np.full(4, 100, np.float32)
    for attempt in range(50):
        last = host if attempt % 2 else other
        with pytest.raises(ValueError, match="argument 0 is donated to the program and also "
                                             "passed as argument 1"):
            executable.execute([x, x, last], copy_host_values=True)
        assert not x.is_deleted()
    y, z = client.buffer_from_pyval(ones * 2), client.buffer_from_pyval(ones * 3)
    for want in (ones * 6, ones * 11):  # twice: the second call reuses the first one's struct
        (out,) = executable.execute([x, y, z])
        np.testing.assert_array_equal(np.asarray(out), want)  # x + 2 + 3
        assert x.is_deleted() and not y.is_deleted() and not z.is_deleted()
        x = out  # donated in turn by the next call
    np.testing.assert_array_equal(np.asarray(other), ones * 50)

