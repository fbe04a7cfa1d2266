"""Generate the model corpus: real programs from real ML libraries, lowered by jax.

Each model becomes a folder under ``tests/fixtures/models/<name>/`` with

* ``module.mlir`` (StableHLO text from ``jax.jit(f).lower(...)``) or ``exported.bin``
  (``jax.export.export(...).serialize()``, read back by :func:`pjrt.deserialize_exported`);
* ``inputs.npz`` and ``expected.npz``: the flattened inputs (``in000``, ``in001``...) and the
  outputs jax computed for them on the CPU (``out000``...). Dtypes numpy cannot store
  (bfloat16, float8, int4) are stored as their bits and named in ``meta.json``;
* ``meta.json``: family, library, format, device count and mesh, per-input and per-output
  shapes, dtypes and partition specs, tolerances, and the versions of everything used.

The libraries (flax, equinox, optax, diffrax, torch, torchax) are needed here only; the tests
read the files with numpy and pjrt. Run from the repository root, in an environment with them
(see tests/models/README.md):

    python tests/models/generate.py [NAME ...]

It forces jax onto the CPU with 8 host devices before importing it. Weights and inputs come
from fixed seeds, so regenerating with the same versions gives the same files.
"""
from __future__ import annotations

import os

os.environ["JAX_PLATFORMS"] = "cpu"
# equinox's runtime checks (eqx.error_if, used by diffrax) would otherwise lower to jax host
# callbacks, which only jax's runtime can serve: make them return NaN instead.
os.environ["EQX_ON_ERROR"] = "nan"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import functools  # noqa: E402
import re  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_platforms", "cpu")

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "models"
COMMAND = "python tests/models/generate.py"
DEVICES = 8

#: Output tolerances are at least these for low-precision dtypes (one unit in the last place
#: is 2**-8 relative for bfloat16), so a different but correct rounding passes.
_RTOL_FLOOR = {"bfloat16": 1e-2, "float16": 1e-3, "float8_e4m3fn": 0.125, "float8_e5m2": 0.25}

#: Dtypes numpy's npz cannot round-trip: stored as the unsigned integers of their bits.
_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8,
         "int4": np.uint8, "uint4": np.uint8}

MODELS = {}


def model(name, *, family, library, slow=False, rtol=1e-5, atol=1e-5):
    """Register a builder: it returns ``(fn, args)`` or ``(fn, args, sharding info)``."""
    def register(build):
        MODELS[name] = dict(build=build, family=family, library=library, slow=slow,
                            rtol=rtol, atol=atol)
        return build
    return register


def versions() -> dict:
    names = ["jax", "jaxlib", "flax", "equinox", "optax", "diffrax", "torch", "torchax",
             "numpy", "ml_dtypes", "flatbuffers"]
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _store(array) -> tuple[np.ndarray, dict]:
    array = np.asarray(array)
    info = {"shape": list(array.shape), "dtype": array.dtype.name}
    if array.dtype.name in _BITS:
        array = np.ascontiguousarray(array).view(_BITS[array.dtype.name])
    return array, info


def _spec_json(sharding) -> list | None:
    if sharding is None:
        return None
    return [list(e) if isinstance(e, tuple) else e for e in sharding.spec]


def _plain(tree):
    """Namedtuples (optax's states) -> tuples, recursively: an export's pytree then has only
    tuples, lists, dicts and None, which a reader needs no Python classes for."""
    if isinstance(tree, tuple):
        return tuple(_plain(t) for t in tree)
    if isinstance(tree, list):
        return [_plain(t) for t in tree]
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    return tree


def _on_plain(fn, args):
    """``fn`` taking and returning plain containers, with the leaves in the same order."""
    structure = jax.tree_util.tree_structure(args)

    @functools.wraps(fn)
    def plain_fn(*plain_args):
        leaves = jax.tree_util.tree_leaves(plain_args)
        return _plain(fn(*jax.tree_util.tree_unflatten(structure, leaves)))
    return plain_fn, _plain(args)


def write(name: str, entry: dict, built) -> None:
    fn, args = _on_plain(built[0], built[1])
    options = built[2] if len(built) > 2 else {}
    fmt = options.get("format", "mlir")
    mesh = options.get("mesh")
    in_shardings = options.get("in_shardings")
    out_shardings = options.get("out_shardings")

    # Every input stays a parameter of the text module (jax drops unused ones by default, an
    # export records which it kept).
    jit_kwargs = {"keep_unused": fmt == "mlir"}
    if mesh is not None:
        in_shardings, out_shardings = _plain(in_shardings), _plain(out_shardings)
        jit_kwargs.update(in_shardings=in_shardings, out_shardings=out_shardings)
    jitted = jax.jit(fn, **jit_kwargs)
    leaves, treedef = jax.tree_util.tree_flatten(args)
    outputs = jitted(*args)
    out_leaves = jax.tree_util.tree_leaves(outputs)

    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if fmt == "mlir":
        text = jitted.lower(*args).as_text(debug_info=False)
        header = (f"// GENERATED FILE, do not edit. Regenerate with: {COMMAND} {name}\n")
        (folder / "module.mlir").write_text(header + text)
        program_file = "module.mlir"
        module_text = text
    else:
        specs = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in leaves]
        exp = jax.export.export(jitted)(*jax.tree_util.tree_unflatten(treedef, specs))
        (folder / "exported.bin").write_bytes(exp.serialize())
        program_file = "exported.bin"
        module_text = exp.mlir_module()
    custom_calls = sorted(set(re.findall(r"custom_call @([A-Za-z0-9_.]+)", module_text)))
    custom_calls = [c for c in custom_calls if not c.startswith(("Sharding", "xla.sdy"))]
    assert "xla_ffi_python_cpu_callback" not in custom_calls, f"{name} calls back into Python"

    ins, in_info = {}, []
    flat_in_shardings = (jax.tree_util.tree_leaves(
        in_shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
        if in_shardings is not None else [None] * len(leaves))
    for i, (leaf, sharding) in enumerate(zip(leaves, flat_in_shardings)):
        ins[f"in{i:03d}"], info = _store(leaf)
        info["spec"] = _spec_json(sharding)
        in_info.append(info)
    outs, out_info = {}, []
    flat_out_shardings = (jax.tree_util.tree_leaves(
        out_shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
        if out_shardings is not None else [None] * len(out_leaves))
    for i, (leaf, sharding) in enumerate(zip(out_leaves, flat_out_shardings)):
        value = np.asarray(leaf)
        if value.dtype.kind == "f" and value.size:
            assert np.all(np.isfinite(value.astype(np.float64))), f"{name}: non-finite output"
        outs[f"out{i:03d}"], info = _store(value)
        info["spec"] = _spec_json(sharding)
        if value.dtype.name in _RTOL_FLOOR:
            info["rtol"] = max(entry["rtol"], _RTOL_FLOOR[value.dtype.name])
        out_info.append(info)
    np.savez_compressed(folder / "inputs.npz", **ins)
    np.savez_compressed(folder / "expected.npz", **outs)

    meta = {
        "_generated_by": f"GENERATED FILE, do not edit. Regenerate with: {COMMAND} {name}",
        "name": name,
        "family": entry["family"],
        "library": entry["library"],
        "description": " ".join((fn.__doc__ or "").split()),
        "format": fmt,
        "program": program_file,
        "sha256": hashlib.sha256((folder / program_file).read_bytes()).hexdigest(),
        "devices": DEVICES if mesh is not None else 1,
        "mesh": ({"shape": list(mesh.devices.shape), "axis_names": list(mesh.axis_names)}
                 if mesh is not None else None),
        "slow": entry["slow"],
        "custom_calls": custom_calls,
        "rtol": entry["rtol"],
        "atol": entry["atol"],
        "inputs": in_info,
        "outputs": out_info,
        "versions": versions(),
    }
    text = json.dumps(meta, indent=1)
    # One line per input and output, so that a 300-input meta.json stays readable.
    for key in ("inputs", "outputs"):
        text = text.replace(json.dumps({key: meta[key]}, indent=1)[2:-2],
                            f' "{key}": [\n  ' + ",\n  ".join(json.dumps(i) for i in meta[key])
                            + "\n ]")
    (folder / "meta.json").write_text(text + "\n")
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{name:28s} {fmt:9s} {len(in_info):4d} in {len(out_info):4d} out {size/1024:8.1f} KiB")


def _rng(seed):
    return np.random.default_rng(seed)


def _key(seed):
    return jax.random.PRNGKey(seed)


def _np_tree(tree):
    """jax arrays -> numpy, custom containers -> plain dicts (so exports need no classes)."""
    return jax.tree_util.tree_map(np.asarray, tree)


def mesh8(shape=(DEVICES,), names=("data",)):
    devices = np.array(jax.devices("cpu")[:DEVICES]).reshape(shape)
    return Mesh(devices, names)


# -- flax linen -------------------------------------------------------------------------------

@model("flax_mlp", family="mlp", library="flax.linen")
def flax_mlp():
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.gelu(nn.Dense(64)(x))
            x = nn.gelu(nn.Dense(64)(x))
            return nn.log_softmax(nn.Dense(10)(x))

    net = MLP()
    x = _rng(0).standard_normal((16, 32)).astype(np.float32)
    params = _np_tree(net.init(_key(0), x))

    def forward(params, x):
        """A three-layer GELU MLP with a log-softmax head."""
        return net.apply(params, x)
    return forward, (params, x)


class _CNN:
    @staticmethod
    def make():
        import flax.linen as nn

        class CNN(nn.Module):
            @nn.compact
            def __call__(self, x, train: bool):
                for features in (8, 16):
                    x = nn.Conv(features, (3, 3), padding="SAME")(x)
                    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
                    x = nn.relu(x)
                    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
                x = x.reshape((x.shape[0], -1))
                return nn.Dense(10)(x)
        return CNN()


@model("flax_cnn_bn_forward", family="cnn", library="flax.linen")
def flax_cnn_bn_forward():
    net = _CNN.make()
    x = _rng(1).standard_normal((4, 16, 16, 3)).astype(np.float32)
    variables = net.init(_key(1), x, train=False)
    # Non-trivial running statistics, so that inference really uses them.
    variables = _np_tree(variables)
    r = _rng(2)
    for layer in variables["batch_stats"].values():
        layer["mean"] = r.standard_normal(layer["mean"].shape).astype(np.float32) * 0.1
        layer["var"] = (1 + r.random(layer["var"].shape)).astype(np.float32)

    def forward(variables, x):
        """Conv-BatchNorm-ReLU-pool twice and a dense head, inference mode."""
        return net.apply(variables, x, train=False)
    return forward, (variables, x)


@model("flax_cnn_bn_train", family="cnn-train", library="flax.linen+optax", rtol=1e-4,
       atol=1e-5, slow=True)
def flax_cnn_bn_train():
    import optax

    net = _CNN.make()
    r = _rng(3)
    x = r.standard_normal((8, 16, 16, 3)).astype(np.float32)
    labels = r.integers(0, 10, (8,)).astype(np.int32)
    variables = _np_tree(net.init(_key(3), x, train=False))
    tx = optax.sgd(0.05, momentum=0.9)
    opt_state = _np_tree(tx.init(variables["params"]))

    def train_step(params, batch_stats, opt_state, x, labels):
        """One SGD-with-momentum step of the BatchNorm CNN (batch statistics updated)."""
        def loss_fn(params):
            logits, updates = net.apply({"params": params, "batch_stats": batch_stats}, x,
                                        train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates["batch_stats"]
        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_stats, opt_state, loss
    return train_step, (variables["params"], variables["batch_stats"], opt_state, x, labels), \
        {"format": "exported"}


@model("flax_lstm_scan", family="rnn", library="flax.linen")
def flax_lstm_scan():
    import flax.linen as nn

    class Seq(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.RNN(nn.OptimizedLSTMCell(24))(x)
            h = nn.RNN(nn.GRUCell(16))(h)
            return nn.Dense(4)(h[:, -1])

    net = Seq()
    x = _rng(4).standard_normal((4, 20, 8)).astype(np.float32)
    params = _np_tree(net.init(_key(4), x))

    def forward(params, x):
        """An LSTM then a GRU over 20 steps (lax.scan), a dense head on the last step."""
        return net.apply(params, x)
    return forward, (params, x)


@model("flax_vae", family="vae", library="flax.linen", rtol=1e-5, atol=1e-5)
def flax_vae():
    import flax.linen as nn

    class VAE(nn.Module):
        latent: int = 8

        @nn.compact
        def __call__(self, x, key):
            h = nn.relu(nn.Dense(64)(x))
            mean, logvar = nn.Dense(self.latent)(h), nn.Dense(self.latent)(h)
            eps = jax.random.normal(key, mean.shape)
            z = mean + jnp.exp(0.5 * logvar) * eps
            recon = nn.sigmoid(nn.Dense(x.shape[-1])(nn.relu(nn.Dense(64)(z))))
            kl = -0.5 * jnp.sum(1 + logvar - mean ** 2 - jnp.exp(logvar), axis=-1)
            bce = -jnp.sum(x * jnp.log(recon + 1e-6) + (1 - x) * jnp.log(1 - recon + 1e-6),
                           axis=-1)
            return recon, z, (bce + kl).mean()

    net = VAE()
    x = _rng(5).random((8, 49)).astype(np.float32)
    key = np.asarray(_key(5))  # raw threefry key data, uint32[2]
    params = _np_tree(net.init(_key(6), x, key))

    def forward(params, x, key):
        """VAE forward with the reparameterisation noise drawn from a threefry key."""
        return net.apply(params, x, key)
    return forward, (params, x, key)


# -- flax nnx ---------------------------------------------------------------------------------

def _transformer():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, heads, rngs):
            self.ln1 = nnx.LayerNorm(d, rngs=rngs)
            # No biases: a key bias has no effect on softmax attention, so its gradient is
            # rounding noise, which Adam would scale up to a full step of arbitrary sign.
            self.attn = nnx.MultiHeadAttention(heads, d, decode=False, use_bias=False,
                                               rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, rngs=rngs)
            self.up = nnx.Linear(d, 4 * d, rngs=rngs)
            self.down = nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x):
            seq = x.shape[1]
            mask = nnx.make_causal_mask(jnp.ones((x.shape[0], seq)))
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class LM(nnx.Module):
        def __init__(self, vocab, d, heads, rngs):
            self.embed = nnx.Embed(vocab, d, rngs=rngs)
            self.block = Block(d, heads, rngs)
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, vocab, rngs=rngs)

        def __call__(self, tokens):
            return self.head(self.ln(self.block(self.embed(tokens))))

    lm = LM(50, 32, 4, nnx.Rngs(7))
    graphdef, state = nnx.split(lm)
    params = _np_tree(state.to_pure_dict())
    tokens = _rng(7).integers(0, 50, (4, 12)).astype(np.int32)

    def apply(params, tokens):
        st = nnx.State(state)
        nnx.replace_by_pure_dict(st, params)
        return nnx.merge(graphdef, st)(tokens)
    return apply, params, tokens


@model("nnx_transformer_forward", family="transformer", library="flax.nnx", rtol=1e-5,
       atol=2e-5)
def nnx_transformer_forward():
    apply, params, tokens = _transformer()

    def forward(params, tokens):
        """Embedding, one pre-LN causal transformer block (4 heads), LM head."""
        return apply(params, tokens)
    return forward, (params, tokens)


@model("nnx_transformer_train", family="transformer-train", library="flax.nnx+optax",
       slow=True, rtol=1e-4, atol=2e-5)
def nnx_transformer_train():
    import optax

    apply, params, tokens = _transformer()
    tx = optax.adam(1e-3)
    opt_state = _np_tree(tx.init(params))

    def train_step(params, opt_state, tokens):
        """Next-token cross-entropy, grads, one optax Adam step."""
        def loss_fn(params):
            logits = apply(params, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, tokens[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step, (params, opt_state, tokens), {"format": "exported"}


# -- equinox ----------------------------------------------------------------------------------

@model("equinox_mlp_train", family="mlp-train", library="equinox+optax", rtol=1e-4,
       atol=1e-5, slow=True)
def equinox_mlp_train():
    import equinox as eqx
    import optax

    mlp = eqx.nn.MLP(6, 3, 32, 3, activation=jax.nn.tanh, key=_key(8))
    arrays, static = eqx.partition(mlp, eqx.is_array)
    leaves, tree = jax.tree_util.tree_flatten(arrays)
    leaves = [np.asarray(a) for a in leaves]
    tx = optax.adamw(3e-3, weight_decay=1e-4)
    opt_state = _np_tree(tx.init(leaves))
    r = _rng(8)
    x = r.standard_normal((32, 6)).astype(np.float32)
    y = r.standard_normal((32, 3)).astype(np.float32)

    def train_step(leaves, opt_state, x, y):
        """eqx.nn.MLP, filter_value_and_grad of an MSE loss, one optax AdamW step."""
        @eqx.filter_value_and_grad
        def loss_fn(model, x, y):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)
        model = eqx.combine(jax.tree_util.tree_unflatten(tree, leaves), static)
        loss, grads = loss_fn(model, x, y)
        grads = jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array))
        updates, opt_state = tx.update(grads, opt_state, leaves)
        return optax.apply_updates(leaves, updates), opt_state, loss
    return train_step, (leaves, opt_state, x, y), {"format": "exported"}


# -- low precision ----------------------------------------------------------------------------

@model("lowp_fp8_int4", family="low-precision", library="jax.numpy", rtol=1e-5, atol=1e-5)
def lowp_fp8_int4():
    r = _rng(9)
    w1 = r.standard_normal((32, 64)).astype(np.float32) * 0.3
    w2 = r.standard_normal((64, 16)).astype(np.float32)
    # fp8 e4m3 weights with a per-output-channel scale.
    s1 = (np.abs(w1).max(axis=0) / 448.0).astype(np.float32)
    q1 = (w1 / s1).astype(ml_dtypes.float8_e4m3fn)
    # int4 weights (-8..7) with per-group scales (groups of 16 rows).
    s2 = (np.abs(w2).reshape(4, 16, 16).max(axis=1) / 7.0).astype(np.float32)
    q2 = np.clip(np.round(w2.reshape(4, 16, 16) / s2[:, None, :]), -8, 7).astype(
        ml_dtypes.int4).reshape(64, 16)
    x = r.standard_normal((8, 32)).astype(ml_dtypes.bfloat16)

    def forward(q1, s1, q2, s2, x):
        """A two-layer MLP whose weights are fp8 e4m3 and int4, dequantised in the program."""
        w1 = q1.astype(jnp.float32) * s1
        w2 = (q2.astype(jnp.float32).reshape(4, 16, 16) * s2[:, None, :]).reshape(64, 16)
        h = jax.nn.silu(jnp.dot(x.astype(jnp.float32), w1,
                                precision=jax.lax.Precision.HIGHEST))
        return jnp.dot(h, w2, precision=jax.lax.Precision.HIGHEST).astype(jnp.bfloat16), h
    return forward, (q1, s1, q2, s2, x)


# -- LAPACK -----------------------------------------------------------------------------------

@model("gp_loglik", family="lapack", library="jax.scipy", rtol=1e-4, atol=1e-4)
def gp_loglik():
    from jax.scipy.linalg import cho_solve, solve_triangular

    r = _rng(10)
    xs = r.uniform(-3, 3, (24, 2)).astype(np.float32)
    ys = (np.sin(xs[:, 0]) * np.cos(xs[:, 1]) + 0.1 * r.standard_normal(24)).astype(np.float32)
    xq = r.uniform(-3, 3, (6, 2)).astype(np.float32)
    hyper = np.array([0.8, 1.2, 0.1], np.float32)  # length scale, amplitude, noise

    def gp(hyper, xs, ys, xq):
        """Gaussian-process regression: log marginal likelihood (Cholesky), posterior mean
        and variance (triangular solves), the spectrum (eigh) and a QR of the features."""
        ls, amp, noise = hyper[0], hyper[1], hyper[2]

        def kernel(a, b):
            d2 = jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)
            return amp ** 2 * jnp.exp(-0.5 * d2 / ls ** 2)
        k = kernel(xs, xs) + (noise ** 2 + 1e-4) * jnp.eye(xs.shape[0])
        chol = jnp.linalg.cholesky(k)
        alpha = cho_solve((chol, True), ys)
        loglik = (-0.5 * ys @ alpha - jnp.sum(jnp.log(jnp.diag(chol)))
                  - 0.5 * xs.shape[0] * jnp.log(2 * jnp.pi))
        kq = kernel(xq, xs)
        mean = kq @ alpha
        v = solve_triangular(chol, kq.T, lower=True)
        var = amp ** 2 - jnp.sum(v * v, axis=0)
        eigvals = jnp.linalg.eigh(k)[0]
        r_factor = jnp.linalg.qr(jnp.concatenate([xs, xs ** 2], axis=1), mode="r")
        return loglik, mean, var, eigvals, jnp.abs(jnp.diag(r_factor))
    return gp, (hyper, xs, ys, xq)


# -- diffrax ----------------------------------------------------------------------------------

@model("diffrax_ode", family="ode", library="diffrax", rtol=1e-4, atol=1e-5, slow=True)
def diffrax_ode():
    import diffrax

    y0 = np.array([1.0, 0.5], np.float32)
    params = np.array([1.1, 0.4, 0.4, 0.1], np.float32)  # Lotka-Volterra

    def solve(y0, params):
        """Lotka-Volterra solved by diffrax Tsit5 with an adaptive PID step controller."""
        a, b, c, d = params[0], params[1], params[2], params[3]

        def field(t, y, args):
            prey, pred = y[0], y[1]
            return jnp.stack([a * prey - b * prey * pred, d * prey * pred - c * pred])
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field), diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.1, y0=y0,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 10.0, 11)),
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-6),
            max_steps=4096, throw=False)
        return sol.ys, sol.stats["num_steps"]
    return solve, (y0, params)


# -- many arguments ---------------------------------------------------------------------------

@model("resmlp_deep", family="many-arguments", library="jax.numpy", slow=True, rtol=1e-4,
       atol=1e-4)
def resmlp_deep():
    r = _rng(11)
    width, depth = 16, 80
    blocks = [{"w": (r.standard_normal((width, width)) / np.sqrt(width) * 0.5).astype(np.float32),
               "b": (0.01 * r.standard_normal(width)).astype(np.float32),
               "gamma": (1 + 0.05 * r.standard_normal(width)).astype(np.float32),
               "beta": (0.05 * r.standard_normal(width)).astype(np.float32)}
              for _ in range(depth)]
    x = r.standard_normal((8, width)).astype(np.float32)

    def forward(blocks, x):
        """A residual MLP of 80 blocks (LayerNorm, dense, GELU): 320 parameter arrays."""
        for blk in blocks:
            h = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
            h = h * blk["gamma"] + blk["beta"]
            x = x + jax.nn.gelu(jnp.dot(h, blk["w"], precision=jax.lax.Precision.HIGHEST)
                                + blk["b"])
        return x, jnp.sum(x ** 2)
    return forward, (blocks, x)


# -- 8 devices --------------------------------------------------------------------------------

@model("dp_train_8dev", family="data-parallel", library="flax.linen+optax", slow=True,
       rtol=1e-4, atol=1e-5)
def dp_train_8dev():
    import flax.linen as nn
    import optax

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.tanh(nn.Dense(32)(x)))

    net = Net()
    r = _rng(12)
    x = r.standard_normal((64, 12)).astype(np.float32)
    y = r.integers(0, 4, (64,)).astype(np.int32)
    params = _np_tree(net.init(_key(12), x))
    tx = optax.adam(1e-2)
    opt_state = _np_tree(tx.init(params))
    mesh = mesh8()
    rep = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("data"))

    def train_step(params, opt_state, x, y):
        """Data-parallel Adam step: batch split over 8 devices, parameters replicated."""
        def loss_fn(params):
            logits = net.apply(params, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    p_sh = jax.tree_util.tree_map(lambda _: rep, params)
    o_sh = jax.tree_util.tree_map(lambda _: rep, opt_state)
    return train_step, (params, opt_state, x, y), {
        "mesh": mesh, "in_shardings": (p_sh, o_sh, batch, batch),
        "out_shardings": (p_sh, o_sh, rep)}


@model("tp_mlp_8dev", family="tensor-parallel", library="jax.numpy", rtol=1e-5, atol=1e-5)
def tp_mlp_8dev():
    r = _rng(13)
    x = r.standard_normal((8, 32)).astype(np.float32)
    w1 = (r.standard_normal((32, 128)) / np.sqrt(32)).astype(np.float32)
    b1 = (0.1 * r.standard_normal(128)).astype(np.float32)
    w2 = (r.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32)
    mesh = mesh8((2, 4), ("data", "model"))

    def mlp(x, w1, b1, w2):
        """Megatron-style MLP over a 2 x 4 mesh: w1 split by columns, w2 by rows over
        "model", the batch over "data"."""
        h = jax.nn.relu(jnp.dot(x, w1, precision=jax.lax.Precision.HIGHEST) + b1)
        return jnp.dot(h, w2, precision=jax.lax.Precision.HIGHEST)
    ns = functools.partial(NamedSharding, mesh)
    return mlp, (x, w1, b1, w2), {
        "format": "exported", "mesh": mesh,
        "in_shardings": (ns(P("data", None)), ns(P(None, "model")), ns(P("model")),
                         ns(P("model", None))),
        "out_shardings": ns(P("data", None))}


@model("tp_mlp_8dev_text", family="tensor-parallel", library="jax.numpy", rtol=1e-5,
       atol=1e-5)
def tp_mlp_8dev_text():
    fn, args, options = tp_mlp_8dev()
    return fn, args, {**options, "format": "mlir"}


# -- torch ------------------------------------------------------------------------------------

def _import_torchax():
    """torchax with torch 2.13: torchax's op tables name the named-tensor overloads
    (``aten.prod.dim_Dimname``...) that torch 2.13 removed. Those entries only key tables
    of ops a traced model never reaches, so a missing one is given a placeholder."""
    import torch
    import torch._ops as ops

    original = ops.OpOverloadPacket.__getattr__
    if not getattr(original, "_corpus_shim", False):
        def getattr_(self, key):
            try:
                return original(self, key)
            except AttributeError:
                if "imname" in key.lower() or key.startswith("names_") or "_names" in key:
                    return ("removed named-tensor overload", self._qualified_op_name, key)
                raise
        getattr_._corpus_shim = True
        ops.OpOverloadPacket.__getattr__ = getattr_
    import torchax
    return torch, torchax


@model("torch_cnn", family="cnn", library="torch+torchax", rtol=1e-5, atol=1e-5)
def torch_cnn():
    torch, torchax = _import_torchax()
    torch.manual_seed(14)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10),
        torch.nn.LogSoftmax(dim=-1))
    net.eval()
    weights, jax_fn = torchax.extract_jax(net)
    weights = {k: np.asarray(v) for k, v in weights.items()}
    x = _rng(14).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        torch_out = net(torch.from_numpy(x)).numpy()

    def forward(weights, x):
        """A torch.nn CNN (conv, batch norm, max pool, adaptive pool) exported by torchax."""
        return jax_fn(weights, (x,))
    jax_out = np.asarray(jax.jit(forward)(weights, x))
    np.testing.assert_allclose(jax_out, torch_out, rtol=1e-4, atol=1e-5)
    return forward, (weights, x)


@model("torch_mlp", family="mlp", library="torch+torchax", rtol=1e-5, atol=1e-5)
def torch_mlp():
    torch, torchax = _import_torchax()
    torch.manual_seed(15)
    net = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.SiLU(),
                              torch.nn.LayerNorm(48), torch.nn.Linear(48, 5))
    weights, jax_fn = torchax.extract_jax(net)
    weights = {k: np.asarray(v) for k, v in weights.items()}
    x = _rng(15).standard_normal((6, 20)).astype(np.float32)
    with torch.no_grad():
        torch_out = net(torch.from_numpy(x)).numpy()

    def forward(weights, x):
        """A torch.nn MLP (Linear, SiLU, LayerNorm) exported by torchax, as a jax export."""
        return jax_fn(weights, (x,))
    np.testing.assert_allclose(np.asarray(jax.jit(forward)(weights, x)), torch_out,
                               rtol=1e-4, atol=1e-5)
    return forward, (weights, x), {"format": "exported"}


def main(names: list[str]) -> None:
    assert len(jax.devices("cpu")) >= DEVICES, jax.devices()
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        sys.exit(f"unknown models {unknown}; known: {sorted(MODELS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or MODELS:
        entry = MODELS[name]
        write(name, entry, entry["build"]())
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"total {total / 2**20:.2f} MiB in {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
