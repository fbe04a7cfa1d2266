"""Programs exported by jax.export, run by pjrt.

jax (in this test process only) exports functions and serializes them; a subprocess that never
imports jax reads the bytes with :func:`pjrt.exported.deserialize_exported`, runs them on the
CPU plugin with eight devices, and writes its results, which are compared here with jax's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

#: Left out of the quick run: exports made by jax, run in fresh interpreters.
pytestmark = pytest.mark.slow

pytest.importorskip("flatbuffers", reason="pjrt[export] and jax's serialization need it")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import export  # noqa: E402

from pjrt.exported import Aval, deserialize_exported  # noqa: E402

DEVICES = 8


def _child_env() -> dict:
    env = dict(os.environ)
    env["PJRT_CPU_DEVICE_COUNT"] = str(DEVICES)
    env.pop("JAX_PLATFORMS", None)
    return env


def run_without_jax(tmp_path, body: str) -> dict:
    """Run ``body`` in a fresh interpreter that imports pjrt but never jax; it fills
    ``results`` (a dict of JSON values), which is returned."""
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        import pjrt
        from pjrt.exported import deserialize_exported
        results = {}
        def load(name):
            with open(name + ".bin", "rb") as f:
                return deserialize_exported(f.read())
    """) + textwrap.dedent(body) + textwrap.dedent("""
        assert "jax" not in sys.modules, "the child imported jax"
        results["jax_imported"] = "jax" in sys.modules
        print("RESULTS " + json.dumps(results))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):])


def _mlp(x, params):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return {"logits": hidden @ params["w2"], "mean": [hidden.mean()], "nothing": None}


def _mlp_args(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    params = {"w1": rng.standard_normal((8, 16)).astype(np.float32),
              "b1": rng.standard_normal((16,)).astype(np.float32),
              "w2": rng.standard_normal((16, 3)).astype(np.float32),
              "unused": np.zeros((5,), np.float32)}
    return x, params


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Serialized exports written to a directory, and what jax computes for each."""
    directory = tmp_path_factory.mktemp("exports")
    rng = np.random.default_rng(0)
    x, params = _mlp_args(rng)
    np.savez(directory / "mlp_args.npz", x=x, **params)
    expected = {}
    for name, platforms in (("single", None), ("multi", ("cpu", "cuda")),
                            ("cuda_only", ("cuda",))):
        exp = export.export(jax.jit(_mlp), platforms=platforms)(x, params)
        (directory / f"{name}.bin").write_bytes(exp.serialize())
        expected[name] = exp
    expected["mlp_result"] = jax.jit(_mlp)(x, params)

    # Sharded over eight devices: an abstract mesh, so jax needs no eight devices of its own.
    mesh = jax.sharding.AbstractMesh((2, 4), ("x", "y"))
    named = jax.sharding.NamedSharding
    pspec = jax.sharding.PartitionSpec

    def matmul(a, b):
        return jnp.sin(a) @ b, (a * 2).sum(axis=1)

    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    np.savez(directory / "matmul_args.npz", a=a, b=b)
    exp = export.export(jax.jit(
        matmul, in_shardings=(named(mesh, pspec("x", None)), named(mesh, pspec(None, "y"))),
        out_shardings=(named(mesh, pspec("x", "y")), named(mesh, pspec("x")))))(
        jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype))
    (directory / "sharded.bin").write_bytes(exp.serialize())
    expected["sharded"] = exp
    expected["matmul_result"] = tuple(np.asarray(r) for r in jax.jit(matmul)(a, b))

    poly = export.export(jax.jit(lambda v, w: jax.nn.relu(v @ w)))(
        jax.ShapeDtypeStruct(export.symbolic_shape("b, 784"), np.float32),
        jax.ShapeDtypeStruct((784, 32), np.float32))
    (directory / "poly.bin").write_bytes(poly.serialize())
    expected["poly"] = poly
    return directory, expected


def test_metadata_matches_jax(exports):
    directory, expected = exports
    for name in ("single", "multi", "sharded", "poly"):
        blob = (directory / f"{name}.bin").read_bytes()
        ours = deserialize_exported(blob)
        theirs = export.deserialize(blob)  # jax's own reading, shardings as HloShardings
        assert ours.fun_name == theirs.fun_name
        assert ours.platforms == theirs.platforms
        assert ours.nr_devices == theirs.nr_devices
        assert ours.module_kept_var_idx == theirs.module_kept_var_idx
        assert ours.mlir_module_serialized == theirs.mlir_module_serialized
        assert ours.uses_global_constants == theirs.uses_global_constants
        assert ours.calling_convention_version == theirs.calling_convention_version
        for mine, jaxs in zip(ours.in_avals + ours.out_avals, theirs.in_avals + theirs.out_avals):
            assert mine.dtype == jaxs.dtype
            assert tuple(str(d) for d in mine.shape) == tuple(str(d) for d in jaxs.shape)
        assert ours.in_tree.num_leaves == theirs.in_tree.num_leaves
        assert ours.out_tree.num_leaves == theirs.out_tree.num_leaves
        for mine, jaxs in zip(ours.in_shardings + ours.out_shardings,
                              tuple(theirs.in_shardings_hlo) + tuple(theirs.out_shardings_hlo)):
            assert (mine is None) == (jaxs is None)
            if mine is not None:
                assert str(mine) == f"HloSharding({jaxs})" or repr(mine) == \
                    f"HloSharding({jaxs})", (mine, jaxs)


def test_pytree_round_trip_matches_jax(exports):
    directory, expected = exports
    ours = deserialize_exported((directory / "single.bin").read_bytes())
    x, params = _mlp_args(np.random.default_rng(1))
    leaves, _ = jax.tree_util.tree_flatten(((x, params), {}))
    mine = ours.in_tree.flatten(((x, params), {}))
    assert len(mine) == len(leaves) and all(a is b for a, b in zip(mine, leaves))
    rebuilt = ours.out_tree.unflatten([1, 2])
    assert rebuilt == jax.tree_util.tree_unflatten(expected["single"].out_tree, [1, 2])


def test_single_and_multi_platform_exports_run_without_jax(exports):
    directory, expected = exports
    results = run_without_jax(directory, """
        args = np.load("mlp_args.npz")
        x = args["x"]
        params = {k: args[k] for k in ("w1", "b1", "w2", "unused")}
        for name in ("single", "multi"):
            exp = load(name)
            out = exp(x, params)
            assert out["nothing"] is None and isinstance(out["mean"], list)
            results[name] = {"logits": np.asarray(out["logits"]).tolist(),
                             "mean": float(np.asarray(out["mean"][0]))}
        results["index"] = load("multi").compile().platform_index
    """)
    jax_result = expected["mlp_result"]
    for name in ("single", "multi"):
        np.testing.assert_allclose(results[name]["logits"], np.asarray(jax_result["logits"]),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results[name]["mean"], float(jax_result["mean"][0]),
                                   rtol=1e-5)
    assert results["index"] == 0


def test_sharded_export_runs_on_eight_devices_without_jax(exports):
    directory, expected = exports
    results = run_without_jax(directory, """
        args = np.load("matmul_args.npz")
        exp = load("sharded")
        program = exp.compile()
        product, sums = program(args["a"], args["b"])
        results["product"] = np.asarray(product).tolist()
        results["sums"] = np.asarray(sums).tolist()
        results["devices"] = len(program.program.devices)
        results["placed"] = [repr(s.to_hlo_sharding(2)) for s in program.program.input_shardings]
        results["exported"] = [repr(s) for s in exp.in_shardings]
        results["out_sharding"] = repr(product.sharding.to_hlo_sharding(2))
    """)
    product, sums = expected["matmul_result"]
    np.testing.assert_allclose(results["product"], product, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results["sums"], sums, rtol=1e-5, atol=1e-5)
    assert results["devices"] == DEVICES
    assert results["placed"] == results["exported"]
    assert results["out_sharding"] == repr(
        deserialize_exported((directory / "sharded.bin").read_bytes()).out_shardings[0])


def test_refusals_are_clear(exports):
    directory, _ = exports
    results = run_without_jax(directory, """
        def error(f):
            try:
                f()
            except Exception as e:
                return f"{type(e).__name__}: {e}"
            return None
        x = np.ones((4, 784), np.float32)
        w = np.ones((784, 32), np.float32)
        results["poly"] = error(lambda: load("poly")(x, w))
        results["cuda"] = error(lambda: load("cuda_only").compile())
        client = pjrt.get_backend()
        results["too_few"] = error(lambda: load("sharded").compile(client.local_devices()[:2]))
        args = np.load("mlp_args.npz")
        params = {k: args[k] for k in ("w1", "b1", "w2")}
        results["structure"] = error(lambda: load("single")(args["x"], params))
        params["unused"] = np.zeros((6,), np.float32)
        results["shape"] = error(lambda: load("single")(args["x"], params))
        results["damaged"] = error(lambda: deserialize_exported(b"not an export at all"))
    """)
    assert "symbolic dimensions 'b'" in results["poly"] and "concrete shapes" in results["poly"]
    assert "exported for platforms ('cuda',), not for 'cpu'" in results["cuda"]
    assert "exported for 8 devices; 2 were given" in results["too_few"]
    assert "must be a dict with keys ['b1', 'unused', 'w1', 'w2']" in results["structure"]
    assert "float32[5]" in results["shape"]
    assert results["damaged"].startswith("ValueError")


def test_too_few_devices_on_the_backend(exports, client):
    directory, _ = exports
    exp = deserialize_exported((directory / "sharded.bin").read_bytes())
    small = pjrt_client_with_devices(client, 2)
    with pytest.raises(ValueError, match="exported for 8 devices, but the cpu backend has 2"):
        exp.compile(client=small)


def pjrt_client_with_devices(client, count):
    import pjrt

    return pjrt.make_c_api_client(client.plugin.name, {"cpu_device_count": count})


def test_runs_on_both_plugins_in_process(exports, client):
    directory, expected = exports
    x, params = _mlp_args(np.random.default_rng(0))
    for name in ("single", "multi"):
        exp = deserialize_exported((directory / f"{name}.bin").read_bytes())
        out = exp.compile(client=client)(x, params)
        np.testing.assert_allclose(np.asarray(out["logits"]),
                                   np.asarray(expected["mlp_result"]["logits"]),
                                   rtol=1e-5, atol=1e-5)


def test_missing_flatbuffers_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_flatbuffers(name, *args, **kwargs):
        if name == "flatbuffers" or name.startswith("flatbuffers."):
            raise ImportError("No module named 'flatbuffers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flatbuffers)
    with pytest.raises(ImportError, match=r"pjrt\[export\]"):
        deserialize_exported(b"\x00" * 16)


def test_aval_text():
    assert str(Aval((2, "b"), np.dtype(np.float32))) == "float32[2,b]"
    assert not Aval((2, "b"), np.dtype(np.float32)).is_static


# --------------------------------------------------------------------------
# Raw modules through pjrt.compile
# --------------------------------------------------------------------------

def _multi_platform_module(platforms):
    def f(x, y):
        return jnp.sin(x) * y

    args = (np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(3.0))
    exp = export.export(jax.jit(f), platforms=platforms)(*args)
    return exp, args, np.asarray(jax.jit(f)(*args))


@pytest.mark.parametrize("form", ["text", "bytecode"])
def test_raw_multi_platform_module_gets_its_platform_index(client, form):
    import pjrt

    exp, args, expected = _multi_platform_module(("cpu", "cuda"))
    module = exp.mlir_module() if form == "text" else exp.mlir_module_serialized
    device = client.local_devices()[0]
    program = pjrt.compile(module, device)
    assert program.platform_index == 0
    np.testing.assert_allclose(np.asarray(program(*args)), expected, rtol=1e-6)
    # Callers that pass the index themselves keep working.
    np.testing.assert_allclose(np.asarray(program(np.int32(0), *args)), expected, rtol=1e-6)
    # cpu second in the list: the caller says so.
    exp, args, expected = _multi_platform_module(("cuda", "cpu"))
    module = exp.mlir_module() if form == "text" else exp.mlir_module_serialized
    program = pjrt.compile(module, device, platform_index=1)
    np.testing.assert_allclose(np.asarray(program(*args)), expected, rtol=1e-6)


def test_platform_index_for_a_program_without_one_is_refused(client):
    import pjrt

    text = jax.jit(lambda x: x + 1).lower(np.ones(3, np.float32)).as_text()
    with pytest.raises(ValueError, match="takes no platform index"):
        pjrt.compile(text, client.local_devices()[0], platform_index=0)
    assert pjrt.compile(text, client.local_devices()[0]).platform_index is None


def _callback_programs():
    def printed(x):
        jax.debug.print("x = {x}", x=x)
        return x * 2

    def pure(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    x = np.ones(3, np.float32)
    return {"debug.print": jax.jit(printed).lower(x).as_text(),
            "pure_callback": jax.jit(pure).lower(x).as_text()}


@pytest.mark.parametrize("kind", ["debug.print", "pure_callback"])
def test_host_callbacks_are_refused_before_the_plugin_sees_them(client, kind):
    import pjrt

    text = _callback_programs()[kind]
    with pytest.raises(ValueError, match="host callback 'xla_ffi_python_cpu_callback'.*cannot "
                                         "run outside that process"):
        pjrt.compile(text, client.local_devices()[0])


def test_shape_polymorphic_module_is_refused_with_the_symbolic_arguments(exports, client):
    import pjrt

    _, expected = exports
    text = expected["poly"].mlir_module()
    with pytest.raises(ValueError, match=r"symbolic \(shape-polymorphic\) dimensions "
                                         r"\(%arg0: tensor<\?x784xf32>\).*concrete shapes"):
        pjrt.compile(text, client.local_devices()[0])
