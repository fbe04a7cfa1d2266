"""XLA's coordination service and client as pjrt speaks them (``pjrt.xla_client``'s
``get_distributed_runtime_service`` / ``get_distributed_runtime_client``), against jaxlib's
(the oracle) both ways, on real processes on 127.0.0.1.

jaxlib's C++ client ends its process on some errors, so each jaxlib client runs in a child
interpreter; jaxlib's service runs in this process.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

grpc = pytest.importorskip("grpc", reason="pjrt[distributed] (grpcio) is not installed")

from pjrt import xla_client  # noqa: E402
from pjrt.errors import ErrorCode  # noqa: E402
from pjrt._distributed import coordination_channel, coordination_server  # noqa: E402
from pjrt._distributed.coordination_errors import (DistributedRuntimeError,  # noqa: E402
                                                   DistributedTimeoutError)

from conftest import child_env  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _jaxlib():
    pytest.importorskip("jax", reason="jaxlib is the oracle of these tests")
    from jax._src.lib import _jax

    return _jax


def start_service(kind: str, address: str, num_nodes: int, **options):
    """jaxlib's service, pjrt's, or pjrt's on grpcio's asyncio server (``pjrt-asyncio``: the
    transport where grpcio's Cython layer is not the one pjrt drives)."""
    if kind == "jaxlib":
        return _jaxlib().get_distributed_runtime_service(address, num_nodes, **options)
    if kind == "pjrt-asyncio":
        original = coordination_server._core_layer
        coordination_server._core_layer = lambda: None
        try:
            service = xla_client.get_distributed_runtime_service(address, num_nodes, **options)
        finally:
            coordination_server._core_layer = original
        assert type(service._server._transport).__name__ == "_AsyncServer"
        return service
    service = xla_client.get_distributed_runtime_service(address, num_nodes, **options)
    assert type(service._server._transport).__name__ == "_CoreServer"
    return service


def connect_all(clients) -> None:
    errors = []

    def connect(client):
        try:
            client.connect()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=connect, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]


def in_threads(*calls):
    """Run each ``(function, args)`` on its own thread; the results in order (or raise)."""
    results: list = [None] * len(calls)

    def run(i, function, args):
        try:
            results[i] = function(*args)
        except BaseException as error:  # noqa: BLE001
            results[i] = error

    threads = [threading.Thread(target=run, args=(i, f, a)) for i, (f, a) in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def pjrt_clients(address: str, n: int, public: bool = False, **options):
    """pjrt's clients, driving gRPC's core channel through grpcio's Cython layer, or with
    ``public`` on grpcio's public API (where that layer is not the one pjrt drives)."""
    options.setdefault("init_timeout", 30)
    options.setdefault("heartbeat_timeout", 10)
    original = coordination_channel.core_layer
    if public:
        coordination_channel.core_layer = lambda: None
    try:
        clients = [xla_client.get_distributed_runtime_client(address, i, **options)
                   for i in range(n)]
    finally:
        coordination_channel.core_layer = original
    for client in clients:
        assert type(client._channel).__name__ == ("PublicChannel" if public else "CoreChannel")
    return clients


# -- the key-value store and barriers, the same on both services ---------------------------

@pytest.mark.parametrize("kind,client", [
    ("pjrt", "core"), ("pjrt-asyncio", "core"), ("jaxlib", "core"), ("pjrt", "public"),
    ("jaxlib", "public")])
def test_store_semantics_match_jaxlib_service(kind, client):
    address = f"127.0.0.1:{free_port()}"
    service = start_service(kind, address, 2, heartbeat_timeout=10)
    a, b = pjrt_clients(address, 2, public=client == "public")
    try:
        connect_all([a, b])
        a.key_value_set("job/config", "one")
        assert b.key_value_try_get("job/config") == "one"
        assert b.blocking_key_value_get("//job//config/", 1000) == "one"  # keys are normalised
        with pytest.raises(DistributedRuntimeError) as taken:
            b.key_value_set("job/config", "two")
        assert taken.value.code == ErrorCode.ALREADY_EXISTS
        b.key_value_set("job/config", "two", allow_overwrite=True)
        assert a.key_value_try_get("job/config") == "two"
        a.key_value_set_bytes("dir/x", b"\x00\xff")
        a.key_value_set("dir/sub/y", "y")
        a.key_value_set("dirt", "not under dir/")
        assert b.key_value_dir_get_bytes("dir") == [("dir/sub/y", b"y"), ("dir/x", b"\x00\xff")]
        assert b.key_value_dir_get("dir/sub/") == [("dir/sub/y", "y")]
        assert a.key_value_increment("count", 3) == 3
        assert b.key_value_increment("count", -5) == -2
        b.key_value_delete("dir")
        assert a.key_value_dir_get("dir") == []
        assert a.key_value_try_get("dirt") == "not under dir/"
        with pytest.raises(DistributedRuntimeError) as missing:
            a.key_value_try_get("dir/x")
        assert missing.value.code == ErrorCode.NOT_FOUND
        with pytest.raises(DistributedTimeoutError):
            a.blocking_key_value_get("never", 200)
        # A blocking get is answered by a later set.
        got = in_threads((b.blocking_key_value_get_bytes, ("later", 10_000)),
                         (lambda: (time.sleep(0.3), a.key_value_set_bytes("later", b"v")), ()))
        assert got[0] == b"v"
        # Barriers: the whole job, again under the same id, and named participants.
        for _ in range(2):
            in_threads((a.wait_at_barrier, ("step", 10_000)), (b.wait_at_barrier, ("step", 10_000)))
        in_threads((a.wait_at_barrier, ("pair", 10_000, [0, 1])),
                   (b.wait_at_barrier, ("pair", 10_000, [0, 1])))
        a.wait_at_barrier("alone", 10_000, [0])
        with pytest.raises(DistributedTimeoutError):
            a.wait_at_barrier("late", 300)
        live = in_threads((a.get_live_nodes, ([0, 1],)), (b.get_live_nodes, ([0, 1],)))
        assert live[0] == live[1] and set(live[0]) == {0, 1}
        assert live[0][0] == a.incarnation and live[0][1] == b.incarnation
        in_threads((a.shutdown, ()), (b.shutdown, ()))
    finally:
        for client in (a, b):
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001
                pass
        service.shutdown()


@pytest.mark.parametrize("kind,client", [("pjrt", "core"), ("jaxlib", "core"),
                                         ("jaxlib", "public")])
def test_use_compression(kind, client):
    """``use_compression`` (gzip on the channel): values and barriers as without it."""
    address = f"127.0.0.1:{free_port()}"
    service = start_service(kind, address, 2, heartbeat_timeout=10)
    a, b = pjrt_clients(address, 2, public=client == "public", use_compression=True)
    try:
        connect_all([a, b])
        value = bytes(range(256)) * 4096 + b"end"  # 1 MiB and 3 bytes
        a.key_value_set_bytes("big", value)
        assert b.blocking_key_value_get_bytes("big", 5_000) == value
        in_threads((a.wait_at_barrier, ("z", 10_000)), (b.wait_at_barrier, ("z", 10_000)))
        in_threads((a.shutdown, ()), (b.shutdown, ()))
    finally:
        for c in (a, b):
            c.close()
        service.shutdown()


# -- jaxlib's client against pjrt's service, pjrt's client against jaxlib's -----------------

JAXLIB_CHILD = textwrap.dedent("""
    import sys
    from jax._src.lib import _jax
    address = sys.argv[1]
    c = _jax.get_distributed_runtime_client(address, 1, init_timeout=30, heartbeat_timeout=10)
    c.connect()
    c.key_value_set("from_jax/a", "A")
    c.key_value_set_bytes("from_jax/b/c", b"\\x01\\x02")
    c.key_value_set("from_jax_ready", "1")
    print("got", c.blocking_key_value_get("from_pjrt", 20000), flush=True)
    print("dir", sorted(c.key_value_dir_get("from_pjrt_dir")), flush=True)
    print("inc", c.key_value_increment("count", 5), flush=True)
    c.wait_at_barrier("mixed", 20000)
    c.wait_at_barrier("mixed", 20000)
    c.wait_at_barrier("pair", 20000, [0, 1])
    print("live", sorted(c.get_live_nodes([0, 1])), flush=True)
    c.key_value_delete("from_pjrt_dir")
    c.wait_at_barrier("deleted", 20000)
    c.shutdown()
    print("shut", flush=True)
""")


@pytest.mark.parametrize("kind", ["pjrt", "pjrt-asyncio", "jaxlib"])
def test_mixed_job_of_jaxlib_and_pjrt_clients(kind):
    """A job of a jaxlib client and a pjrt client, on pjrt's service and on jaxlib's."""
    _jaxlib()
    address = f"127.0.0.1:{free_port()}"
    service = start_service(kind, address, 2, heartbeat_timeout=10)
    child = subprocess.Popen([sys.executable, "-c", JAXLIB_CHILD, address],
                             env=child_env(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    client = xla_client.get_distributed_runtime_client(address, 0, init_timeout=30,
                                                       heartbeat_timeout=10)
    try:
        client.connect()
        client.key_value_set("from_pjrt_dir/x", "1")
        client.key_value_set("from_pjrt_dir/y/z", "2")
        client.key_value_set("from_pjrt", "P")
        assert client.blocking_key_value_get("from_jax_ready", 20_000) == "1"
        assert client.key_value_try_get("from_jax/a") == "A"
        assert client.key_value_dir_get_bytes("from_jax") == [("from_jax/a", b"A"),
                                                              ("from_jax/b/c", b"\x01\x02")]
        client.wait_at_barrier("mixed", 20_000)
        client.wait_at_barrier("mixed", 20_000)
        assert client.key_value_increment("count", 1) == 6
        client.wait_at_barrier("pair", 20_000, [0, 1])
        assert sorted(client.get_live_nodes([0, 1])) == [0, 1]
        client.wait_at_barrier("deleted", 20_000)
        assert client.key_value_dir_get("from_pjrt_dir") == []
        client.shutdown()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-3000:]
        assert out.splitlines() == ["got P", "dir [('from_pjrt_dir/x', '1'), "
                                    "('from_pjrt_dir/y/z', '2')]", "inc 5", "live [0, 1]",
                                    "shut"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        client.shutdown()
        service.shutdown()


# -- failures --------------------------------------------------------------------------------

PEER_CHILD = textwrap.dedent("""
    import sys, time
    from pjrt import xla_client
    c = xla_client.get_distributed_runtime_client(sys.argv[1], int(sys.argv[2]),
                                                  init_timeout=30, heartbeat_timeout=2)
    c.connect()
    print("connected", flush=True)
    time.sleep(600)
""")


def test_dead_peer_ends_the_others_waits_naming_it():
    address = f"127.0.0.1:{free_port()}"
    service = xla_client.get_distributed_runtime_service(address, 3, heartbeat_timeout=2)
    peers = [subprocess.Popen([sys.executable, "-c", PEER_CHILD, address, str(i)],
                              env=child_env(), stdout=subprocess.PIPE, text=True)
             for i in (1, 2)]
    seen = []
    client = xla_client.get_distributed_runtime_client(address, 0, init_timeout=30,
                                                       heartbeat_timeout=2,
                                                       missed_heartbeat_callback=seen.append)
    try:
        client.connect()
        for peer in peers:
            assert peer.stdout.readline().strip() == "connected"
        peers[1].send_signal(signal.SIGKILL)
        peers[1].wait()
        start = time.monotonic()
        with pytest.raises(DistributedRuntimeError) as lost:
            client.wait_at_barrier("never-complete", 120_000)
        waited = time.monotonic() - start
        assert waited < 2 + 10, waited  # the heartbeat timeout and the checks' period
        assert "process 2" in str(lost.value)
        assert lost.value.lost_process == 2
        # The service ends the barrier and answers every process's error poll; the callback
        # follows the poll's answer.
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(seen) == 1 and seen[0].lost_process == 2
        # Later calls say the same at once, and the process is still alive to say it.
        with pytest.raises(DistributedRuntimeError, match="process 2"):
            client.blocking_key_value_get("anything", 60_000)
    finally:
        for peer in peers:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
        client.shutdown()
        service.shutdown()


INTERRUPTED_CHILD = textwrap.dedent("""
    import sys, time
    from pjrt import xla_client
    from pjrt._distributed import coordination_channel
    address = sys.argv[1]
    if sys.argv[2] == "public":
        coordination_channel.core_layer = lambda: None
    service = xla_client.get_distributed_runtime_service(address, 2)
    c = xla_client.get_distributed_runtime_client(address, 0, init_timeout=30)
    c2 = xla_client.get_distributed_runtime_client(address, 1, init_timeout=30)
    assert type(c._channel).__name__ == {"public": "PublicChannel"}.get(sys.argv[2],
                                                                       "CoreChannel")
    import threading
    t = threading.Thread(target=c2.connect); t.start(); c.connect(); t.join()
    print("waiting", flush=True)
    start = time.monotonic()
    try:
        c.wait_at_barrier("forever", 600_000)
    except KeyboardInterrupt:
        print("interrupted after %.1f" % (time.monotonic() - start), flush=True)
    try:
        c.blocking_key_value_get("never", 600_000)
    except KeyboardInterrupt:
        print("interrupted get", flush=True)
    service.shutdown()
    print("done", flush=True)
""")


@pytest.mark.parametrize("client", ["core", "public"])
def test_ctrl_c_interrupts_a_barrier_and_a_blocking_get(client):
    address = f"127.0.0.1:{free_port()}"
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_CHILD, address, client],
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().strip()
        assert line.startswith("interrupted after"), line
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == "interrupted get"
        out, err = child.communicate(timeout=30)
        assert out.strip() == "done", err[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


REGISTERING_CHILD = textwrap.dedent("""
    import sys, time
    from pjrt import xla_client
    from pjrt._distributed import coordination_channel
    address = sys.argv[1]
    if sys.argv[2] == "public":
        coordination_channel.core_layer = lambda: None
    service = xla_client.get_distributed_runtime_service(address, 2)
    c = xla_client.get_distributed_runtime_client(address, 0, init_timeout=600)
    print("registering", flush=True)
    start = time.monotonic()
    try:
        c.connect()  # process 1 never comes
    except KeyboardInterrupt:
        print("interrupted after %.1f" % (time.monotonic() - start), flush=True)
    service.shutdown()
    print("done", flush=True)
""")


@pytest.mark.parametrize("client", ["core", "public"])
def test_ctrl_c_interrupts_the_registration(client):
    address = f"127.0.0.1:{free_port()}"
    child = subprocess.Popen([sys.executable, "-c", REGISTERING_CHILD, address, client],
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "registering"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().strip()
        assert line.startswith("interrupted after"), line
        assert float(line.split()[-1]) < 10
        out, err = child.communicate(timeout=30)
        assert out.strip() == "done", err[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _connections_to(port: int) -> int:
    """Established TCP connections of this machine to ``port``."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in rows.read().splitlines()[1:]:
                fields = row.split()
                count += fields[2].endswith(f":{port:04X}") and fields[3] == "01"
    return count


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")
@pytest.mark.parametrize("client", ["core", "public"])
def test_a_client_dropped_unconnected_closes_its_connection(client):
    import gc

    port = free_port()
    address = f"127.0.0.1:{port}"
    service = xla_client.get_distributed_runtime_service(address, 2)
    try:
        dropped, = pjrt_clients(address, 1, public=client == "public")
        with pytest.raises(DistributedRuntimeError):  # a call before connect(): NOT_FOUND
            dropped._send("TryGetKeyValue", dropped._request("TryGetKeyValue", key="k"), 10)
        assert _connections_to(port) == 1
        del dropped
        gc.collect()
        deadline = time.monotonic() + 10
        while _connections_to(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections_to(port) == 0
    finally:
        service.shutdown()


def test_port_in_use_is_refused():
    address = f"127.0.0.1:{free_port()}"
    service = xla_client.get_distributed_runtime_service(address, 1)
    try:
        with pytest.raises(OSError, match="in use"):
            xla_client.get_distributed_runtime_service(address, 1)
    finally:
        service.shutdown()


def test_unreachable_address_fails_within_init_timeout():
    address = f"127.0.0.1:{free_port()}"
    client = xla_client.get_distributed_runtime_client(address, 0, init_timeout=1)
    start = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match="no coordination service answered"):
        client.connect()
    assert time.monotonic() - start < 5


def test_an_id_outside_the_job_is_refused_at_once():
    address = f"127.0.0.1:{free_port()}"
    service = xla_client.get_distributed_runtime_service(address, 2)
    client = xla_client.get_distributed_runtime_client(address, 5, init_timeout=30)
    try:
        start = time.monotonic()
        with pytest.raises(DistributedRuntimeError, match="disagree on the size") as refused:
            client.connect()
        assert refused.value.code == ErrorCode.INVALID_ARGUMENT
        assert time.monotonic() - start < 5
    finally:
        service.shutdown()


def test_two_processes_with_one_id():
    address = f"127.0.0.1:{free_port()}"
    service = xla_client.get_distributed_runtime_service(address, 2)
    twins = [xla_client.get_distributed_runtime_client(address, 0, init_timeout=30)
             for _ in range(2)]
    other = xla_client.get_distributed_runtime_client(address, 1, init_timeout=30)
    try:
        outcomes: dict = {}

        def connect(name, client):
            try:
                client.connect()
                outcomes[name] = "joined"
            except DistributedRuntimeError as error:
                outcomes[name] = error

        threads = [threading.Thread(target=connect, args=(i, c)) for i, c in enumerate(twins)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        other.connect()
        for thread in threads:
            thread.join(30)
        # While the job forms, the later registration wins; the earlier process is told.
        refused = [o for o in outcomes.values() if isinstance(o, DistributedRuntimeError)]
        assert sorted(map(str, outcomes.values())).count("joined") == 1, outcomes
        assert len(refused) == 1 and "two processes" in str(refused[0])
        # Once the job runs, a third process with id 0 sets the job in error, and is told so
        # at once (asking again cannot succeed).
        third = xla_client.get_distributed_runtime_client(address, 0, init_timeout=20)
        start = time.monotonic()
        with pytest.raises(DistributedRuntimeError, match="second process was started with id 0"):
            third.connect()
        assert time.monotonic() - start < 10
        with pytest.raises(DistributedRuntimeError, match="second process"):
            other.wait_at_barrier("after", 30_000)
    finally:
        service.shutdown()


def test_same_address_twice_and_a_client_of_the_earlier_job():
    address = f"127.0.0.1:{free_port()}"
    for _ in range(2):
        service = xla_client.get_distributed_runtime_service(address, 2)
        clients = pjrt_clients(address, 2)
        connect_all(clients)
        clients[0].key_value_set("k", "v")
        assert clients[1].key_value_try_get("k") == "v"
        in_threads(*[(c.shutdown, ()) for c in clients])
        service.shutdown()
    # A client whose service ended meets the next job's service: refused, with the reason.
    service = xla_client.get_distributed_runtime_service(address, 1)
    old = pjrt_clients(address, 1)[0]
    old.connect()
    service.shutdown()
    service = xla_client.get_distributed_runtime_service(address, 1)
    try:
        with pytest.raises(DistributedRuntimeError, match="earlier coordination service"):
            old.key_value_set("k", "v")
    finally:
        old.close()
        service.shutdown()


MEMBER_CHILD = textwrap.dedent("""
    import sys
    from pjrt import xla_client
    address, rank = sys.argv[1], int(sys.argv[2])
    c = xla_client.get_distributed_runtime_client(address, rank, init_timeout=240,
                                                  heartbeat_timeout=60)
    c.connect()
    c.key_value_set(f"members/{rank}", str(rank))
    c.wait_at_barrier("all-set", 240_000)
    assert len(c.key_value_dir_get("members")) == int(sys.argv[3])
    c.wait_at_barrier("all-read", 240_000)
    c.shutdown()
    print("ok", flush=True)
""")


@pytest.mark.slow
def test_64_processes_join_and_pass_barriers():
    count = 64
    address = f"127.0.0.1:{free_port()}"
    service = xla_client.get_distributed_runtime_service(address, count + 1,
                                                         heartbeat_timeout=60)
    children = [subprocess.Popen([sys.executable, "-c", MEMBER_CHILD, address, str(rank),
                                  str(count + 1)], env=child_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for rank in range(1, count + 1)]
    client = xla_client.get_distributed_runtime_client(address, 0, init_timeout=240,
                                                       heartbeat_timeout=60)
    try:
        client.connect()
        client.key_value_set("members/0", "0")
        client.wait_at_barrier("all-set", 240_000)
        assert sorted(int(v) for _, v in client.key_value_dir_get("members")) == \
            list(range(count + 1))
        client.wait_at_barrier("all-read", 240_000)
        client.shutdown()
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0 and out.strip() == "ok", err[-2000:]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        service.shutdown()


JAX_PROCESS = textwrap.dedent("""
    import sys
    import jax
    address, rank = sys.argv[1], int(sys.argv[2])
    jax.distributed.initialize(address, num_processes=2, process_id=rank,
                               initialization_timeout=60)
    from jax._src import distributed
    c = distributed.global_state.client
    c.key_value_set("from_jax", "J")
    print("got", c.blocking_key_value_get("from_pjrt", 30000), flush=True)
    c.wait_at_barrier("both", 30000)
    jax.distributed.shutdown()
    print("done", flush=True)
""")


@pytest.mark.parametrize("jax_rank", [0, 1], ids=["jax-starts-the-service",
                                                  "pjrt-starts-the-service"])
def test_a_job_of_a_jax_process_and_a_pjrt_process(jax_rank):
    """jax.distributed.initialize in one process, pjrt.distributed.initialize in the other,
    on one address: one job, whichever process 0 is."""
    _jaxlib()
    from pjrt import distributed

    address = f"127.0.0.1:{free_port()}"
    child = subprocess.Popen([sys.executable, "-c", JAX_PROCESS, address, str(jax_rank)],
                             env=child_env(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        distributed.initialize(address, 2, 1 - jax_rank, timeout=60)
        try:
            client = distributed.global_state.client
            client.key_value_set("from_pjrt", "P")
            assert client.blocking_key_value_get("from_jax", 30_000) == "J"
            client.wait_at_barrier("both", 30_000)
        finally:
            distributed.shutdown()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-3000:]
        assert out.split() == ["got", "P", "done"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_without_grpcio_the_error_names_the_extra():
    script = textwrap.dedent("""
        import sys
        sys.modules["grpc"] = None  # as if grpcio were not installed
        from pjrt import xla_client
        for make in (lambda: xla_client.get_distributed_runtime_service("127.0.0.1:1", 1),
                     lambda: xla_client.get_distributed_runtime_client("127.0.0.1:1", 0)):
            try:
                make()
            except ImportError as error:
                print(error)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'pjrt[distributed]'" in line for line in lines)


def test_a_process_that_never_shuts_down_exits_at_once():
    script = textwrap.dedent("""
        import sys
        from pjrt import xla_client
        service = xla_client.get_distributed_runtime_service(sys.argv[1], 1)
        client = xla_client.get_distributed_runtime_client(sys.argv[1], 0)
        client.connect()
        client.key_value_set("a", "b")
    """)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, f"127.0.0.1:{free_port()}"],
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - start < 8  # it took 11 s when the finalisers stopped them
