"""Awaiting arrays from asyncio (pjrt/_capi/ready_events.py, _native/ready_notifier.c):
``await x`` and ``await pjrt.ready(...)`` on both CPU plugins, with real programs still
running: the loop goes on meanwhile and no thread waits; errors, cancellation, deleted arrays
and closed clients; a loop closed, or the interpreter exiting, while the plugin's callbacks
are still to come; several loops in several threads; uvloop where it is installed."""
from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time

import numpy as np
import pytest

import pjrt
from pjrt._capi import ready_events
from conftest import child_env, cpu_plugin_path, failures_in_threads, run_python
from long_programs import matmul_loop
from test_exit import PRELUDE, _run_many
from test_waits import SHARD_INDICES, _program_calling, _refusing_from_shard_2

#: Iterations of `matmul_loop` that keep a device busy for a second or more (about 0.5 ms
#: each on an idle machine).
LONG = 2500

X = np.full((256, 256), 0.01, np.float32)


def _long(client, iterations: int = LONG, device=None):
    device = device or client.devices()[0]
    return client.compile_and_load(matmul_loop(iterations), [device])


class _Ticker:
    """A task that counts its turns every few milliseconds while the loop runs, and the most
    Python threads seen meanwhile (a wait on a thread would show as one more)."""

    def __init__(self):
        self.ticks = 0
        self.threads = threading.active_count()
        self._stop = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self):
        while not self._stop:
            self.ticks += 1
            self.threads = max(self.threads, threading.active_count())
            await asyncio.sleep(0.005)

    async def stop(self) -> int:
        self._stop = True
        await self.task
        return self.ticks


def _no_watches_left(timeout: float = 30) -> bool:
    """Whether every loop's notifier has gone (each goes once its last wait has fired)."""
    deadline = time.monotonic() + timeout
    while ready_events._registry and time.monotonic() < deadline:
        time.sleep(0.01)
    return not ready_events._registry


# -- awaiting -----------------------------------------------------------------------------------

def test_awaiting_a_long_result_leaves_the_loop_running(client):
    """A program running for a second or more: the await resolves to the array itself, with
    its value, while another task kept turning, and no thread was started for the wait."""
    executable = _long(client)
    x = client.buffer_from_pyval(X)
    (reference,) = executable.execute([x])
    expected = np.asarray(reference)

    async def main():
        ticker = _Ticker()
        (out,) = executable.execute([x])
        was_ready = out.is_ready()
        ticker.threads = threads_before = threading.active_count()
        started = time.monotonic()
        awaited = await out
        elapsed = time.monotonic() - started
        extra_threads = ticker.threads - threads_before
        ticks = await ticker.stop()
        return out, awaited, was_ready, elapsed, ticks, extra_threads

    out, awaited, was_ready, elapsed, ticks, extra_threads = asyncio.run(main())
    assert not was_ready
    assert awaited is out and out.is_ready()
    np.testing.assert_array_equal(np.asarray(out), expected)
    # The ticker turns every 5 ms: a blocked loop would have let it turn once or twice.
    assert ticks >= min(20, elapsed / 0.005 / 4), (ticks, elapsed)
    assert extra_threads == 0
    assert _no_watches_left()


def test_awaiting_many_arrays_at_once(client):
    """pjrt.ready over results on eight devices and over a global array of four shards, and
    asyncio.gather over the same arrays awaited one by one: one notifier serves them all."""
    devices = client.devices()
    executables = [_long(client, LONG // 4, device) for device in devices]
    inputs = [client.buffer_from_pyval(X, device) for device in devices]
    compiled = pjrt.compile(matmul_loop(LONG // 4), devices[:4], replicated=True)
    stacked = np.stack([X * (i + 1) for i in range(4)])

    async def main():
        ticker = _Ticker()
        outs = [e.execute([x])[0] for e, x in zip(executables, inputs)]
        global_out = compiled(stacked)
        was_ready = [o.is_ready() for o in outs] + [global_out.is_ready()]
        got = await pjrt.ready(*outs, global_out)
        assert len(got) == 9 and all(a is b for a, b in zip(got, (*outs, global_out)))
        again = [e.execute([x])[0] for e, x in zip(executables, inputs)]
        gathered = await asyncio.gather(*again, compiled(stacked))
        await ticker.stop()
        return outs, global_out, again, gathered, was_ready, ticker.ticks

    outs, global_out, again, gathered, was_ready, ticks = asyncio.run(main())
    assert not all(was_ready)
    assert all(o.is_ready() for o in outs + again) and global_out.is_ready()
    assert all(s.data.is_ready() for s in global_out.addressable_shards)
    assert all(a is b for a, b in zip(gathered, again))
    one = np.asarray(outs[0])
    for out in outs + again:
        np.testing.assert_array_equal(np.asarray(out), one)
    single = pjrt.compile(matmul_loop(LONG // 4), devices[0])
    for i, shard in enumerate(gathered[-1].addressable_shards):
        np.testing.assert_allclose(np.asarray(shard.data), np.asarray(single(stacked[i])),
                                   rtol=1e-5)
    assert ticks > 1
    assert _no_watches_left()


def test_arrays_already_computed_resolve_without_the_loop(client):
    """An array already computed, or already failed, resolves (or raises) at the first step
    of the coroutine: no event loop is running here at all."""
    done = client.buffer_from_pyval(X).block_until_ready()

    async def one():
        return await done

    async def several():
        return await pjrt.ready(done, done)

    with pytest.raises(StopIteration) as stop:
        one().send(None)
    assert stop.value.value is done
    with pytest.raises(StopIteration) as stop:
        several().send(None)
    assert [a is done for a in stop.value.value] == [True, True]
    # pjrt.ready() of nothing is ().
    with pytest.raises(StopIteration) as stop:
        pjrt.ready().send(None)
    assert stop.value.value == ()


def test_a_running_loop_is_needed_only_for_what_still_runs(client):
    """Outside a loop, an unfinished array says so through asyncio's own error."""
    (out,) = _long(client, LONG // 4).execute([client.buffer_from_pyval(X)])

    async def one():
        return await out

    coroutine = one()
    with pytest.raises(RuntimeError, match="no running event loop"):
        coroutine.send(None)
    out.block_until_ready()


def test_ready_refuses_what_is_not_an_array(client):
    async def main():
        await pjrt.ready(client.buffer_from_pyval(X), np.zeros(3))

    with pytest.raises(TypeError, match="argument 1 is numpy.ndarray"):
        asyncio.run(main())


# -- errors -------------------------------------------------------------------------------------

def _refusing(client, message: str, iterations: int):
    """A program whose Python custom call raises ``message`` after ``iterations`` matmuls
    (run asynchronously, so the error reaches the await through the ready event)."""
    target = f"awaitable_{message.replace(' ', '_')}_{id(client)}"

    def refuse(operands, results, attributes):
        raise ValueError(message)

    pjrt.register_custom_call_target(target, refuse)
    return client.compile_and_load(matmul_loop(iterations, then=(
        f"%y = stablehlo.custom_call @{target}(%r#1) {{api_version = 4 : i32}} : "
        f"(tensor<256x256xf32>) -> tensor<256x256xf32>"),
        returns="%y : tensor<256x256xf32>"))


def test_a_failed_computation_raises_its_error(client):
    """The computation's error, as block_until_ready raises it; with several arrays, the
    first failed one in argument order, whichever failed first in time."""
    x = client.buffer_from_pyval(X)
    late = _refusing(client, "late refusal", LONG // 2)
    early = _refusing(client, "early refusal", 10)

    async def main():
        (bad,) = late.execute([x])
        was_ready = bad.is_ready()
        with pytest.raises(pjrt.XlaRuntimeError, match="late refusal") as awaited:
            await bad
        (slow_bad,) = late.execute([x])
        (quick_bad,) = early.execute([x])
        (ok,) = _long(client, 10).execute([x])
        with pytest.raises(pjrt.XlaRuntimeError, match="late refusal"):
            await pjrt.ready(ok, slow_bad, quick_bad)
        assert quick_bad.is_ready() and slow_bad.is_ready()
        return bad, awaited.value, was_ready, ok

    bad, error, was_ready, ok = asyncio.run(main())
    assert not was_ready
    with pytest.raises(pjrt.XlaRuntimeError) as blocked:
        bad.block_until_ready()
    assert str(error) == str(blocked.value) and error.code == blocked.value.code
    assert ok.is_ready()
    assert _no_watches_left()


def test_a_failed_shard_raises_while_the_loop_waits(client):
    """A global array whose shards 2 and 3 fail only once the await has begun (their handler
    waits for a gate the ticker opens): the error of shard 2, the first in order, comes
    through the events' callbacks; the other shards hold their values."""
    target = f"awaitable_shards_{id(client)}"
    gate = threading.Event()
    pjrt.register_custom_call_target(target, _refusing_from_shard_2(gate))
    compiled = pjrt.compile(_program_calling(target), client.devices()[:4], replicated=True)

    async def open_gate_soon():
        await asyncio.sleep(0.2)
        gate.set()

    async def main():
        out = compiled(SHARD_INDICES)
        was_ready = out.is_ready()
        opener = asyncio.get_running_loop().create_task(open_gate_soon())
        try:
            with pytest.raises(pjrt.XlaRuntimeError, match="shard 2 refused on purpose") as caught:
                await out
        finally:
            gate.set()
            await opener
        return out, caught.value, was_ready

    out, error, was_ready = asyncio.run(main())
    assert not was_ready and "shard 3" not in str(error)
    np.testing.assert_array_equal(np.asarray(out.addressable_shards[0].data), np.zeros((256, 256)))
    assert _no_watches_left()


def test_deleted_arrays_and_closed_clients_raise_as_block_until_ready_does(make_client):
    own = make_client()
    x = own.buffer_from_pyval(X)
    (deleted,) = _long(own, 10).execute([x])
    deleted.delete()
    survivor = own.buffer_from_pyval(X)

    async def awaiting(array):
        await array

    with pytest.raises(pjrt.DeletedArrayError) as awaited:
        asyncio.run(awaiting(deleted))
    with pytest.raises(pjrt.DeletedArrayError) as blocked:
        deleted.block_until_ready()
    assert str(awaited.value) == str(blocked.value)
    assert "BlockHostUntilReady() called on deleted or donated buffer" in str(awaited.value)
    own.close()
    with pytest.raises(pjrt.ClosedClientError) as awaited:
        asyncio.run(awaiting(survivor))
    with pytest.raises(pjrt.ClosedClientError) as blocked:
        survivor.block_until_ready()
    assert str(awaited.value) == str(blocked.value)


# -- cancellation -------------------------------------------------------------------------------

def test_cancelling_the_await_leaves_the_computation_and_the_array(client):
    """A timeout cancels the wait, not the program: the array reads right afterwards, and the
    wait's notifier goes once the event it no longer waits for has fired."""
    executable = _long(client)
    x = client.buffer_from_pyval(X)
    (reference,) = executable.execute([x])
    expected = np.asarray(reference)

    async def main():
        (out,) = executable.execute([x])
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(out, 0.05)
        cancelled_while_running = not out.is_ready()
        (other,) = executable.execute([x])
        task = asyncio.get_running_loop().create_task(pjrt.ready(other))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return out, other, cancelled_while_running

    out, other, cancelled_while_running = asyncio.run(main())
    assert cancelled_while_running
    np.testing.assert_array_equal(np.asarray(out), expected)
    np.testing.assert_array_equal(np.asarray(other), expected)
    assert _no_watches_left()


# -- loops that close, interpreters that exit ---------------------------------------------------

def test_a_loop_closed_before_the_event_fires(cpu_plugin):
    """The loop is closed while its await is pending; the event fires afterwards into the
    notifier nobody reads (no crash, no call into the dead loop), the next await in another
    loop lets that notifier go (its descriptor is closed), and the process exits cleanly. In
    a child process."""
    result = run_python(PRELUDE + textwrap.dedent("""
        import asyncio, os, time
        from long_programs import matmul_loop

        def open_descriptors():
            return len(os.listdir("/proc/self/fd"))

        long = client.compile_and_load(matmul_loop(LONG), [device])
        x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32), device)
        before = open_descriptors()
        loop = asyncio.new_event_loop()
        (out,) = long.execute([x])

        async def waiter():
            return await out

        task = loop.create_task(waiter())
        loop.run_until_complete(asyncio.sleep(0.05))
        assert not out.is_ready() and not task.done()
        loop.close()
        out.block_until_ready()  # the callback fires now, into the closed loop's notifier
        time.sleep(0.2)
        assert not task.done()
        (again,) = long.execute([x])

        async def fresh():
            return await again

        assert asyncio.run(fresh()) is again
        assert open_descriptors() == before, (open_descriptors(), before)
        assert np.array_equal(np.asarray(out), np.asarray(again))
        task = None  # (a pending task garbage-collected would only be reported)
        print("clean")
    """).replace("LONG", str(LONG // 2)), cpu_plugin_path(cpu_plugin.name))
    assert result.stdout.strip().endswith("clean")
    for sign in ("Traceback", "Fatal Python error", "Segmentation fault"):
        assert sign not in result.stderr, result.stderr


EXIT_WITH_AWAITS = PRELUDE + textwrap.dedent("""
    import asyncio, os, random, threading
    from long_programs import matmul_loop

    random.seed(os.getpid())
    long = client.compile_and_load(matmul_loop(random.randrange(50, 800)), [device])
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32), device)
    outs = [long.execute([x])[0] for _ in range(4)]
    CASE
""")

#: How the interpreter ends while awaits are pending: the loop left open at exit; the loop
#: closed first; the loop running in a daemon thread, still awaiting, at exit.
EXIT_CASES = {
    "open": """
        loop = asyncio.new_event_loop()
        tasks = [loop.create_task(pjrt.ready(o)) for o in outs]
        loop.run_until_complete(asyncio.sleep(random.uniform(0, 0.1)))
    """,
    "closed": """
        loop = asyncio.new_event_loop()
        tasks = [loop.create_task(pjrt.ready(o)) for o in outs]
        loop.run_until_complete(asyncio.sleep(random.uniform(0, 0.1)))
        loop.close()
        sys.exit(3)
    """,
    "thread": """
        async def forever():
            await pjrt.ready(*outs)
            await asyncio.Event().wait()

        threading.Thread(target=asyncio.run, args=(forever(),), daemon=True).start()
        threading.Event().wait(random.uniform(0, 0.2))
    """,
}


@pytest.mark.parametrize("case", sorted(EXIT_CASES))
def test_interpreter_exit_with_awaits_pending(cpu_plugin, case):
    """Many interpreters end while their awaits are pending and the programs still run, so
    the plugin's callbacks come during the exit or after Python has finalised: each ends
    with its own status and without a crash or a traceback."""
    source = EXIT_WITH_AWAITS.replace("CASE", textwrap.dedent(EXIT_CASES[case]).strip())
    expected = 3 if case == "closed" else 0
    runs = [(source, [cpu_plugin_path(cpu_plugin.name)], expected)] * 6
    assert _run_many(runs) == []


# -- threads and other loops --------------------------------------------------------------------

def test_several_loops_in_several_threads(client):
    """Four threads, each running its own loop (twice in a row) that awaits programs on its
    own device and on a shared one: every await resolves to its own array with its value."""
    devices = client.devices()
    shared = _long(client, LONG // 8, devices[7])
    x_shared = client.buffer_from_pyval(X, devices[7])
    (reference,) = shared.execute([x_shared])
    expected = np.asarray(reference)

    def work(seed: int):
        own = _long(client, LONG // 8, devices[seed])
        x = client.buffer_from_pyval(X, devices[seed])

        async def main():
            ticker = _Ticker()
            outs = [own.execute([x])[0] for _ in range(3)] + [shared.execute([x_shared])[0]]
            got = await asyncio.gather(*outs)
            assert all(a is b for a, b in zip(got, outs))
            await ticker.stop()
            return outs

        for _ in range(2):
            for out in asyncio.run(main()):
                np.testing.assert_array_equal(np.asarray(out), expected)

    assert failures_in_threads(work, 4) == []
    assert _no_watches_left()


def test_uvloop(client):
    """The same await under uvloop's loop (tested with uvloop 0.23 where it is installed; it
    is no dependency of pjrt)."""
    uvloop = pytest.importorskip("uvloop")
    executable = _long(client)
    x = client.buffer_from_pyval(X)

    async def main():
        ticker = _Ticker()
        (out,) = executable.execute([x])
        was_ready = out.is_ready()
        awaited = await out
        (other,) = executable.execute([x])
        task = asyncio.get_running_loop().create_task(pjrt.ready(other))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return out, awaited, other, was_ready, await ticker.stop()

    out, awaited, other, was_ready, ticks = uvloop.run(main())
    assert not was_ready and awaited is out and ticks > 20
    np.testing.assert_array_equal(np.asarray(out), np.asarray(other))
    assert _no_watches_left()


def test_a_plugin_without_on_ready_is_awaited_all_the_same(built, cpu_plugin):
    """A plugin without PJRT_Event_OnReady (the fault plugin forwarding to XLA's CPU plugin,
    that entry left out): the await still resolves, and raises a failed shard's error, with
    the loop running meanwhile. In a child process, which loads the fault plugin with its own
    settings."""
    result = run_python("""
        import asyncio, json, sys, threading
        import numpy as np, pjrt
        from long_programs import matmul_loop
        from test_waits import SHARD_INDICES, _program_calling, _refusing_from_shard_2

        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu", {"cpu_device_count": 4})
        report = {"on_ready": client.raw_handle.api.has("PJRT_Event_OnReady")}
        long = client.compile_and_load(matmul_loop(1000), [client.devices()[0]])
        gate = threading.Event()
        pjrt.register_custom_call_target("refuse", _refusing_from_shard_2(gate))
        compiled = pjrt.compile(_program_calling("refuse"), client.devices()[:4],
                                replicated=True)

        async def main():
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.005)

            ticker = asyncio.get_running_loop().create_task(tick())
            (out,) = long.execute([client.buffer_from_pyval(np.ones((256, 256), np.float32))])
            report["was_ready"] = out.is_ready()
            report["same"] = (await out) is out
            report["ticks"] = ticks
            failing = compiled(SHARD_INDICES)
            asyncio.get_running_loop().call_later(0.1, gate.set)
            try:
                await failing
            except pjrt.XlaRuntimeError as error:
                report["error"] = str(error)
            ticker.cancel()

        asyncio.run(main())
        print(json.dumps(report))
    """, built.fault_plugin, env=child_env(
        drop=("PJRT_FAULT",), PJRT_FAULT_DELEGATE=cpu_plugin_path(cpu_plugin.name),
        PJRT_FAULT="no_on_ready"), timeout=300)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["on_ready"] is False, report
    assert report["was_ready"] is False and report["same"] is True, report
    assert report["ticks"] > 5, report
    assert "shard 2 refused on purpose" in report["error"], report
