"""The persistent compilation cache: entries across processes, keys, bounds and refusals.

A small transformer lowered by jax (in this test process) is compiled in fresh
subprocesses that never import jax: the first fills the cache, the second loads from it;
both are timed from interpreter start to the first result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pjrt
from pjrt import compilation_cache
from pjrt.compilation_cache import CompilationCache, set_compilation_cache_dir

#: Left out of the quick run: fresh interpreters compiling cold and warm.
pytestmark = pytest.mark.slow

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402


def _transformer_text(layers=4, width=256, heads=8, seq=64, vocab=1024):
    """StableHLO text of a decoder-only transformer's forward pass (weights as arguments)."""
    rng = np.random.default_rng(0)

    def dense(shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    params = {"embed": dense((vocab, width)), "out": dense((width, vocab)), "layers": [
        {"qkv": dense((width, 3 * width)), "proj": dense((width, width)),
         "up": dense((width, 4 * width)), "down": dense((4 * width, width)),
         "g1": np.ones(width, np.float32), "g2": np.ones(width, np.float32)}
        for _ in range(layers)]}

    def norm(x, g):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g

    def forward(params, tokens):
        x = params["embed"][tokens]
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        for layer in params["layers"]:
            q, k, v = jnp.split(norm(x, layer["g1"]) @ layer["qkv"], 3, axis=-1)
            q, k, v = (t.reshape(seq, heads, width // heads).transpose(1, 0, 2) for t in (q, k, v))
            scores = jnp.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(width // heads), -1e9)
            attended = (jax.nn.softmax(scores, -1) @ v).transpose(1, 0, 2).reshape(seq, width)
            x = x + attended @ layer["proj"]
            x = x + jax.nn.gelu(norm(x, layer["g2"]) @ layer["up"]) @ layer["down"]
        return jax.nn.log_softmax(x @ params["out"], -1)

    tokens = rng.integers(0, vocab, seq).astype(np.int32)
    text = jax.jit(forward).lower(params, tokens).as_text()
    leaves = jax.tree_util.tree_leaves((params, tokens))
    return text, leaves, np.asarray(jax.jit(forward)(params, tokens))


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("transformer")
    text, leaves, expected = _transformer_text()
    (directory / "model.mlir").write_text(text)
    np.savez(directory / "args.npz", *leaves)
    return directory, expected


_CHILD = textwrap.dedent("""
    import time
    start = time.perf_counter()
    import json, logging, sys
    import numpy as np
    import pjrt
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logger = logging.getLogger("pjrt.compilation_cache")
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    text = open("model.mlir").read()
    args = np.load("args.npz")
    leaves = [args[f"arr_{i}"] for i in range(len(args.files))]
    program = pjrt.compile(text)
    result = np.asarray(program(*leaves))
    elapsed = time.perf_counter() - start
    np.save("result.npy", result)
    print("RESULTS " + json.dumps({"seconds": elapsed, "log": records,
                                   "jax": "jax" in sys.modules}))
""")


def _run_child(directory, cache_dir) -> dict:
    env = dict(os.environ, PJRT_COMPILATION_CACHE_DIR=str(cache_dir))
    env.pop("JAX_PLATFORMS", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-4000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULTS ")][-1]
    results = json.loads(line[len("RESULTS "):])
    results["wall"] = wall
    results["result"] = np.load(directory / "result.npy")
    return results


def test_warm_cache_in_a_fresh_process(transformer, tmp_path):
    directory, expected = transformer
    cache_dir = tmp_path / "cache"
    cold = _run_child(directory, cache_dir)
    warm = _run_child(directory, cache_dir)
    assert not cold["jax"] and not warm["jax"]
    assert any("miss" in m for m in cold["log"]) and any("stored" in m for m in cold["log"])
    assert any("hit" in m for m in warm["log"]) and not any("miss" in m for m in warm["log"])
    np.testing.assert_allclose(cold["result"], expected, rtol=2e-4, atol=2e-4)
    np.testing.assert_array_equal(warm["result"], cold["result"])
    ratio = warm["seconds"] / cold["seconds"]
    print(f"\nimport + compile + first call of a 4-layer transformer: cold {cold['seconds']:.2f} s, "
          f"warm {warm['seconds']:.2f} s, ratio {ratio:.2f} (process wall: cold "
          f"{cold['wall']:.2f} s, warm {warm['wall']:.2f} s)")
    assert ratio < 0.8, (cold["seconds"], warm["seconds"])
    assert len(CompilationCache(cache_dir).entries()) == 1


@pytest.fixture
def cache_dir(tmp_path):
    cache = set_compilation_cache_dir(tmp_path / "cache")
    yield cache
    set_compilation_cache_dir(None)
    compilation_cache._explicit = compilation_cache._UNSET


ADD = """
func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_in_process_hits_key_on_devices_and_plugin(cache_dir, client, caplog):
    caplog.set_level("DEBUG", logger="pjrt.compilation_cache")
    x = np.arange(4, dtype=np.float32)
    devices = client.local_devices()
    first = pjrt.compile(ADD, devices[0])
    assert len(cache_dir.entries()) == 1
    again = pjrt.compile(ADD, devices[0])
    assert any("hit" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(np.asarray(again(x, x)), np.asarray(first(x, x)))
    # Another device is another key: the device assignment is compiled in.
    other = pjrt.compile(ADD, devices[1])
    assert len(cache_dir.entries()) == 2
    assert other.devices == [devices[1]]
    np.testing.assert_array_equal(np.asarray(other(x, x)), 2 * x)


def test_entry_from_another_plugin_build_is_refused(cache_dir, client, caplog, tmp_path):
    from pjrt._runtime import serialization

    device = client.local_devices()[0]
    pjrt.compile(ADD, device)
    (entry,) = cache_dir.entries()
    key = os.path.basename(entry[0])[:-len(".pjrtexe")]
    blob = cache_dir.get(key)
    identity = serialization.read_identity(blob)
    payload = blob[-serialization.unpack(blob, identity).__len__():]
    forged = serialization.pack(payload, serialization.PluginIdentity(
        identity.platform, identity.platform_version, identity.api_version, "0" * 64))
    cache_dir.put(key, forged)
    caplog.set_level("WARNING", logger="pjrt.compilation_cache")
    program = pjrt.compile(ADD, device)
    assert any("cannot be loaded" in r.getMessage() and "different plugin build" in
               r.getMessage() for r in caplog.records)
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(np.asarray(program(x, x)), 2 * x)
    # The bad entry was replaced by a good one.
    assert serialization.read_identity(cache_dir.get(key)) == identity


def test_size_bound_evicts_least_recently_used(tmp_path):
    cache = CompilationCache(tmp_path, max_bytes=350)
    for index, key in enumerate(["a", "b", "c"]):
        cache.put(key, bytes(100))
        os.utime(cache._path(key), (1000 + index, 1000 + index))
    # a and b fit with c only after the oldest goes
    names = sorted(os.path.basename(p) for p, _, _ in cache.entries())
    assert names == ["b.pjrtexe", "c.pjrtexe"]
    assert cache.get("b") is not None  # refreshes b
    cache.put("d", bytes(100))
    names = sorted(os.path.basename(p) for p, _, _ in cache.entries())
    assert names == ["b.pjrtexe", "d.pjrtexe"]
    cache.put("huge", bytes(1000))
    assert cache.get("huge") is None
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_environment_variable_and_off_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("PJRT_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("PJRT_COMPILATION_CACHE_MAX_BYTES", "12345")
    try:
        cache = compilation_cache.get_compilation_cache()
        assert cache is not None and cache.directory == str(tmp_path / "env")
        assert cache.max_bytes == 12345
        assert set_compilation_cache_dir(None) is None
        assert compilation_cache.get_compilation_cache() is None
    finally:
        compilation_cache._explicit = compilation_cache._UNSET
    with pytest.raises(ValueError, match="positive"):
        CompilationCache(tmp_path, max_bytes=0)


def test_concurrent_writers_leave_whole_entries(tmp_path):
    script = textwrap.dedent("""
        import sys
        from pjrt.compilation_cache import CompilationCache
        cache = CompilationCache(sys.argv[1], max_bytes=1 << 30)
        for i in range(200):
            cache.put("shared", bytes([int(sys.argv[2])]) * 100000)
    """)
    writers = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(n)])
               for n in (1, 2, 3)]
    cache = CompilationCache(tmp_path)
    seen = 0
    while any(w.poll() is None for w in writers):
        blob = cache.get("shared")
        if blob is not None:
            assert len(blob) == 100000 and len(set(blob)) == 1
            seen += 1
    assert all(w.wait() == 0 for w in writers)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_a_new_process_does_not_hash_the_library_again(tmp_path):
    """The plugin's digest, part of every key, is remembered in the cache directory: a second
    process reads it instead of the 100+ MB library; a changed library is hashed again."""
    from pjrt._runtime import serialization

    library = tmp_path / "plugin.so"
    library.write_bytes(b"not a real library, only bytes to hash" * 1000)
    cache_dir = tmp_path / "cache"
    first, second = serialization.DigestCache(), serialization.DigestCache()
    first.remember_in(cache_dir)
    os.makedirs(cache_dir)
    digest = first.digest(library)
    assert first.computed == 1
    second.remember_in(cache_dir)
    assert second.digest(library) == digest and second.computed == 0
    library.write_bytes(b"another build" * 1000)
    assert second.digest(library) != digest and second.computed == 1
