"""The per-call path in C (pjrt._native_runtime.CallPlan): calls of programs on several devices
with global Arrays laid out as the parameters need, the Arrays it makes and frees, and the plugin's
errors on that path. (Single-device calls: tests/test_executable_calls.py.)"""
from __future__ import annotations

import gc
import json

import numpy as np
import pytest

import pjrt
from conftest import child_env, cpu_plugin_path, failures_in_threads, run_python

NUM_DEVICES = 8

AFFINE = """
module @affine attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<16xf32> {mhlo.sharding = "{devices=[8]<=[8]}"},
                         %y: tensor<16xf32> {mhlo.sharding = "{devices=[8]<=[8]}"})
      -> (tensor<16xf32> {mhlo.sharding = "{devices=[8]<=[8]}"},
          tensor<16xf32> {mhlo.sharding = "{replicated}"}) {
    %two = stablehlo.constant dense<2.0> : tensor<16xf32>
    %0 = stablehlo.multiply %x, %two : tensor<16xf32>
    %1 = stablehlo.add %0, %y : tensor<16xf32>
    %2 = stablehlo.subtract %x, %y : tensor<16xf32>
    return %1, %2 : tensor<16xf32>, tensor<16xf32>
  }
}"""

DONATING = """
module @donating attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<16xf32> {mhlo.sharding = "{devices=[8]<=[8]}",
                                             tf.aliasing_output = 0 : i32})
      -> (tensor<16xf32> {mhlo.sharding = "{devices=[8]<=[8]}"}) {
    %one = stablehlo.constant dense<1.0> : tensor<16xf32>
    %0 = stablehlo.add %x, %one : tensor<16xf32>
    return %0 : tensor<16xf32>
  }
}"""


@pytest.fixture
def spmd(client):
    """The affine program over the first 8 devices, with its arguments placed twice: with the
    program's own input shardings, and with equal NamedShardings built by hand."""
    mesh = pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES], dtype=object), ("x",))
    compiled = pjrt.compile(AFFINE, mesh)
    x_host = np.arange(16, dtype=np.float32)
    y_host = np.linspace(-1, 1, 16, dtype=np.float32)
    own = [pjrt.device_put(v, s) for v, s in zip((x_host, y_host), compiled.input_shardings)]
    named_sharding = pjrt.NamedSharding(mesh, pjrt.P("x"))
    named = [pjrt.device_put(v, named_sharding) for v in (x_host, y_host)]
    return compiled, (x_host, y_host), own, named


def _expected(x, y):
    return x * 2 + y, x - y


def test_laid_out_arguments_take_one_call_with_either_sharding(spmd):
    compiled, hosts, own, named = spmd
    executable = compiled.executable
    assert executable.execute_laid_out(own) is None  # not before the first execute_global
    compiled(*own)
    for arguments in (own, named, own, named):
        outputs = executable.execute_laid_out(arguments)
        assert outputs is not None
        for got, want, sharding in zip(outputs, _expected(*hosts), executable.output_shardings):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
            assert got.sharding is sharding
            assert got.shape == (16,) and got.dtype == np.float32
            assert len(got.addressable_shards) == NUM_DEVICES
        # The program's call takes the same path, and gives the same.
        first, second = compiled(*arguments)
        np.testing.assert_allclose(np.asarray(first), _expected(*hosts)[0], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(second), _expected(*hosts)[1], rtol=1e-6)


def test_anything_else_is_left_to_the_full_path(spmd, client):
    compiled, hosts, own, named = spmd
    executable = compiled.executable
    compiled(*own)
    replicated = pjrt.device_put(hosts[0], pjrt.NamedSharding(
        pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES], dtype=object), ("x",)), pjrt.P()))
    single = client.buffer_from_pyval(hosts[0])
    deleted = pjrt.device_put(hosts[0], compiled.input_shardings[0])
    deleted.delete()
    for arguments in ([hosts[0], own[1]], [replicated, own[1]], [single, own[1]],
                      [deleted, own[1]], [own[0]], (own[0], own[1], own[1]),
                      iter(own)):
        assert executable.execute_laid_out(arguments) is None, arguments
    # ... where each is placed, resharded, or refused with the full path's errors.
    first, _ = compiled(hosts[0], own[1])
    np.testing.assert_allclose(np.asarray(first), _expected(*hosts)[0], rtol=1e-6)
    first, _ = compiled(replicated, own[1])
    np.testing.assert_allclose(np.asarray(first), _expected(*hosts)[0], rtol=1e-6)
    with pytest.raises(pjrt.DeletedArrayError):
        compiled(deleted, own[1])
    with pytest.raises(TypeError, match="2 arguments"):
        compiled(own[0])


def test_an_unloaded_executable_or_closed_client_leaves_the_path(make_client):
    own_client = make_client(devices=NUM_DEVICES)
    mesh = pjrt.Mesh(np.array(own_client.devices()[:NUM_DEVICES], dtype=object), ("x",))
    compiled = pjrt.compile(AFFINE, mesh)
    hosts = (np.ones(16, np.float32), np.zeros(16, np.float32))
    own = [pjrt.device_put(v, s) for v, s in zip(hosts, compiled.input_shardings)]
    compiled(*own)
    assert compiled.executable.execute_laid_out(own) is not None
    compiled.executable.delete()
    assert compiled.executable.execute_laid_out(own) is None
    with pytest.raises(RuntimeError, match="deleted"):
        compiled(*own)
    compiled = pjrt.compile(AFFINE, mesh)
    compiled(*own)
    assert compiled.executable.execute_laid_out(own) is not None
    own_client.close()
    assert compiled.executable.execute_laid_out(own) is None
    with pytest.raises(pjrt.ClosedClientError):
        compiled(*own)


def test_outputs_are_freed_when_collected(spmd, client):
    compiled, hosts, own, named = spmd
    compiled(*own)
    gc.collect()  # arrays earlier tests left in reference cycles
    registry = client.raw_handle.buffers
    before = len(registry)
    outputs = [compiled(*own) for _ in range(20)]
    assert len(registry) == before + 40
    views = [np.asarray(first) for first, _ in outputs[:3]]  # numpy reads keep their memory
    del outputs
    gc.collect()
    assert len(registry) == before
    for view in views:
        np.testing.assert_allclose(view, _expected(*hosts)[0], rtol=1e-6)


def test_donation_on_the_path(client):
    mesh = pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES], dtype=object), ("x",))
    compiled = pjrt.compile(DONATING, mesh)
    sharding = compiled.input_shardings[0]
    x = pjrt.device_put(np.zeros(16, np.float32), sharding)
    for step in range(1, 6):
        previous, x = x, compiled(x)
        assert previous.is_deleted()  # donated to the program, as on the full path
        np.testing.assert_array_equal(np.asarray(x), np.full(16, step, np.float32))
    # What numpy read before the donation keeps its value.
    view = np.asarray(x)
    result = compiled(x)
    np.testing.assert_array_equal(view, np.full(16, 5, np.float32))
    np.testing.assert_array_equal(np.asarray(result), np.full(16, 6, np.float32))


def test_threads_calling_one_program_each_get_their_own_results(spmd):
    compiled, hosts, own, named = spmd
    compiled(*own)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            x = rng.standard_normal(16).astype(np.float32)
            placed = pjrt.device_put(x, compiled.input_shardings[0])
            first, second = compiled(placed, own[1])
            np.testing.assert_allclose(np.asarray(first), x * 2 + hosts[1], rtol=1e-5)
            np.testing.assert_allclose(np.asarray(second), x - hosts[1], rtol=1e-5)

    failures = failures_in_threads(work)
    assert not failures, failures


LAUNCH_FAILS = r"""
import json, sys
import numpy as np
import pjrt
pjrt.load_pjrt_plugin_dynamically("fault", sys.argv[1])
client = pjrt.make_c_api_client("fault", {"cpu_device_count": 8})
mesh = pjrt.Mesh(np.array(client.devices()[:8], dtype=object), ("x",))
programs = json.loads(sys.argv[2])
report = {}
spmd = pjrt.compile(programs["spmd"], mesh)
x = pjrt.device_put(np.arange(16, dtype=np.float32), spmd.input_shardings[0])
single = client.compile_and_load(programs["single"], client.local_devices()[:1])
a = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
for name, call in (("spmd", lambda: spmd(x, x)), ("single", lambda: single.execute([a]))):
    outcomes = []
    for _ in range(4):
        try:
            call()
            outcomes.append("ok")
        except pjrt.XlaRuntimeError as error:
            outcomes.append(str(error))
    report[name] = outcomes
healthy = pjrt.compile(programs["healthy"], mesh)
report["healthy"] = np.asarray(healthy(x)).tolist()
report["x"] = np.asarray(x).tolist()
print(json.dumps(report))
"""

SINGLE_FAILING = """
func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}""".replace("func.func", "module @fails_later_single {\nfunc.func", 1) + "\n}"

HEALTHY = DONATING.replace("@donating", "@healthy").replace(
    ",\n                                             tf.aliasing_output = 0 : i32", "")


def test_a_launch_error_on_the_path_is_raised_and_the_client_goes_on(built):
    programs = {"spmd": AFFINE.replace("@affine", "@fails_later_spmd"),
                "single": SINGLE_FAILING, "healthy": HEALTHY}
    env = child_env(PJRT_FAULT="fail_execute:fails_later",
                    PJRT_FAULT_DELEGATE=cpu_plugin_path("xla_cpu_0_106"))
    result = run_python(LAUNCH_FAILS, str(built.fault_plugin), json.dumps(programs), env=env)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("spmd", "single"):
        outcomes = report[name]
        # The first launch runs (off-thread); the later ones, on the per-call path, fail.
        assert outcomes[0] == "ok", report
        for outcome in outcomes[1:]:
            assert "PJRT_LoadedExecutable_Execute failed" in outcome, report
    assert report["healthy"] == [v + 1 for v in report["x"]]
