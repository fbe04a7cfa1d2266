"""jax 0.10.2 as the judge of sharded execution on 8 CPU devices.

Every program here is lowered in the test itself by ``jax.jit(f, in_shardings=...,
out_shardings=...).lower(*args)``, once with Shardy (jax's default) and once with GSPMD
(``jax_use_shardy_partitioner=False``), on a jax mesh whose device list may be permuted. pjrt
compiles the same text with ``pjrt.compile(text, mesh)`` over a pjrt Mesh of the client's
devices in the same id order, and must agree with jax on:

* the output values (``np.asarray(jitted(*args))``), called with host arrays, with global
  Arrays placed with other shardings (resharded by pjrt), and with global Arrays placed
  exactly as the program expects (``execute_global``);
* the output shardings: ``compiled.output_shardings[i].to_hlo_sharding(ndim)`` against
  ``str(jax_out.sharding._to_xla_hlo_sharding(ndim))``, and which slice lands on which device
  (``{shard.device.id: shard.index}`` against ``devices_indices_map``);
* the input shardings, likewise, against ``lowered.compile().input_shardings``.

A generated grid does the same for an elementwise program over meshes (8,), (2,4), (4,2),
(2,2,2) and a permuted (2,4). Bad inputs (impossible meshes, wrong shapes, arrays on other
devices) must be clear errors after which the client keeps working.

jax must see 8 CPU devices: the ``jax_devices`` fixture (conftest.py) sees to it. These tests
are marked ``oracle`` (and so ``slow``).
"""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from conftest import jax_partitioner
from ml_dtypes import bfloat16

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax.sharding import NamedSharding as JaxNamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as JaxP  # noqa: E402
from jax._src.interpreters import mlir  # noqa: E402

NUM_DEVICES = 8
PERMUTED = (3, 1, 7, 5, 0, 2, 6, 4)
IDENTITY = tuple(range(NUM_DEVICES))
PARTITIONERS = ("shardy", "gspmd")

pytestmark = pytest.mark.oracle


# --------------------------------------------------------------------------------------------
# the oracle: what jax lowers, compiles, reports and computes


def _id_map(index_map: dict) -> dict:
    return {device.id: index for device, index in index_map.items()}


def _jax_mesh(jax_devices: dict, shape, names, order):
    return JaxMesh(np.array([jax_devices[i] for i in order], dtype=object).reshape(shape), names)


def _our_mesh(client, shape, names, order):
    return pjrt.Mesh(np.array([client.lookup_device(i) for i in order], dtype=object)
                     .reshape(shape), names)


class Oracle:
    """jax's view of one program: text, shardings, placements and output values."""

    def __init__(self, jax_devices, fn, mesh_shape, axis_names, order, in_specs, out_specs,
                 inputs, variant, donate=()):
        self.mesh_shape, self.axis_names, self.order = mesh_shape, axis_names, order
        self.inputs = inputs
        self.donate = tuple(donate)
        mesh = _jax_mesh(jax_devices, mesh_shape, axis_names, order)
        kwargs = {}
        if in_specs is not None:
            kwargs["in_shardings"] = tuple(JaxNamedSharding(mesh, JaxP(*s)) for s in in_specs)
        if out_specs is not None:
            outs = tuple(JaxNamedSharding(mesh, JaxP(*s)) for s in out_specs)
            kwargs["out_shardings"] = outs if len(outs) > 1 else outs[0]
        if donate:
            kwargs["donate_argnums"] = tuple(donate)
        with jax_partitioner(jax, variant):
            jitted = jax.jit(fn, **kwargs)
            lowered = jitted.lower(*inputs)
            self.text = lowered.as_text()
            self.bytecode = mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))
            compiled = lowered.compile()
            in_shardings = compiled.input_shardings[0]
            # Fresh jax arrays each time: a donated one is consumed.
            placed = [jax.device_put(x, s) for x, s in zip(inputs, in_shardings)]
            outputs = jitted(*placed)
            jax.block_until_ready(outputs)
        self.deleted = [p.is_deleted() for p in placed]   # what jax's donation consumed
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        self.values = [np.asarray(o) for o in outputs]
        self.out_shapes = [tuple(o.shape) for o in outputs]
        self.out_hlo = [str(o.sharding._to_xla_hlo_sharding(o.ndim)) for o in outputs]
        self.out_indices = [_id_map(o.sharding.devices_indices_map(o.shape)) for o in outputs]
        self.in_hlo = [str(s._to_xla_hlo_sharding(x.ndim)) for s, x in zip(in_shardings, inputs)]
        self.in_indices = [_id_map(s.devices_indices_map(x.shape))
                           for s, x in zip(in_shardings, inputs)]
        if "shardy" == variant:
            assert "sdy.sharding" in self.text and "mhlo.sharding" not in self.text
        else:
            assert "mhlo.sharding" in self.text and "sdy." not in self.text


_ORACLES: dict = {}


def oracle(jax_devices, key, **kwargs) -> Oracle:
    """jax's answer for ``key``, computed once (the two plugin parametrisations share it)."""
    if key not in _ORACLES:
        _ORACLES[key] = Oracle(jax_devices, **kwargs)
    return _ORACLES[key]


# --------------------------------------------------------------------------------------------
# checking pjrt against the oracle


def _assert_values(outputs, want: Oracle, exact: bool, what: str):
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    assert len(outputs) == len(want.values), what
    for i, (got, expected) in enumerate(zip(outputs, want.values)):
        assert isinstance(got, pjrt.Array), what
        assert got.shape == expected.shape and got.dtype == expected.dtype, (what, i)
        value = np.asarray(got)
        if exact:
            np.testing.assert_array_equal(value, expected, err_msg=f"{what}: output {i}")
        else:
            np.testing.assert_allclose(value, expected, rtol=2e-6, atol=1e-6,
                                       err_msg=f"{what}: output {i}")


def _assert_output_layout(outputs, want: Oracle, what: str):
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    for i, got in enumerate(outputs):
        assert str(got.sharding.to_hlo_sharding(got.ndim)) == want.out_hlo[i], (what, i)
        placement = {shard.device.id: shard.index for shard in got.addressable_shards}
        assert placement == want.out_indices[i], (what, i)
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          want.values[i][shard.index])


def _other_spec(mesh: pjrt.Mesh, expected, shape):
    """A NamedSharding over ``mesh`` laying ``shape`` out otherwise than ``expected`` (another
    spec that divides the shape), or None if every candidate is equivalent."""
    ndim = len(shape)
    names = mesh.axis_names
    for spec in (pjrt.P(), pjrt.P(names[0]), pjrt.P(None, names[-1]), pjrt.P(names),
                 pjrt.P(names[-1])):
        if len(spec) > ndim:
            continue
        sharding = pjrt.NamedSharding(mesh, spec)
        try:
            sharding.shard_shape(shape)
        except ValueError:
            continue
        if not sharding.is_equivalent_to(expected, ndim):
            return sharding
    return None


def _other_device_order(mesh: pjrt.Mesh, expected, ndim: int):
    """``expected``'s layout over the same devices in reverse order: each slice on another
    device (unless replicated)."""
    devices = list(mesh.device_list)[::-1]
    return pjrt.GSPMDSharding(devices, expected.to_hlo_sharding(ndim))


def check_against_oracle(client, want: Oracle, exact: bool = True, bytecode: bool = False):
    """Compile ``want.text`` (or its bytecode) with pjrt and compare everything with jax."""
    mesh = _our_mesh(client, want.mesh_shape, want.axis_names, want.order)
    compiled = pjrt.compile(want.bytecode if bytecode else want.text, mesh)
    assert [d.id for d in compiled.devices] == list(want.order)

    # The layouts the compiled program reports.
    assert len(compiled.input_shardings) == len(want.inputs)
    for i, (sharding, x) in enumerate(zip(compiled.input_shardings, want.inputs)):
        assert str(sharding.to_hlo_sharding(x.ndim)) == want.in_hlo[i], f"input {i}"
        assert _id_map(sharding.devices_indices_map(x.shape)) == want.in_indices[i], f"input {i}"
    assert len(compiled.output_shardings) == len(want.values)
    for i, (sharding, shape) in enumerate(zip(compiled.output_shardings, want.out_shapes)):
        assert str(sharding.to_hlo_sharding(len(shape))) == want.out_hlo[i], f"output {i}"
        assert _id_map(sharding.devices_indices_map(shape)) == want.out_indices[i], f"output {i}"

    # 1. Host arrays.
    outputs = compiled(*want.inputs)
    _assert_values(outputs, want, exact, "host arrays")
    _assert_output_layout(outputs, want, "host arrays")

    # 2. Global Arrays placed with other shardings (another spec where one fits, then the
    #    same layout over the devices in another order): pjrt reshards them.
    for how in ("other spec", "other device order"):
        shardings = []
        for x, expected in zip(want.inputs, compiled.input_shardings):
            other = _other_spec(mesh, expected, x.shape) if how == "other spec" else None
            shardings.append(other or _other_device_order(mesh, expected, x.ndim))
        others = [pjrt.device_put(x, s) for x, s in zip(want.inputs, shardings)]
        if how == "other spec":
            for placed, expected in zip(others, compiled.input_shardings):
                assert not placed.sharding.is_equivalent_to(expected, placed.ndim)
        outputs = compiled(*others)
        _assert_values(outputs, want, exact, f"global arrays, {how}")
        _assert_output_layout(outputs, want, f"global arrays, {how}")
        for placed, x in zip(others, want.inputs):   # the caller's arrays are never donated
            assert not placed.is_deleted()
            np.testing.assert_array_equal(np.asarray(placed), x)

    # 3. Global Arrays placed as the program expects, through execute_global directly.
    exact_args = [pjrt.device_put(x, s) for x, s in zip(want.inputs, compiled.input_shardings)]
    outputs = compiled.executable.execute_global(exact_args)
    _assert_values(outputs, want, exact, "execute_global")
    _assert_output_layout(outputs, want, "execute_global")
    assert [placed.is_deleted() for placed in exact_args] == want.deleted
    return compiled


# --------------------------------------------------------------------------------------------
# the programs


def _ints(rng, shape, dtype=np.float32, low=-4, high=5):
    """Small integers (as ``dtype``): sums and products are exact whatever the order."""
    return rng.integers(low, high, size=shape).astype(dtype)


def _inputs(name: str, shapes) -> list:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [_ints(rng, *entry) if isinstance(entry[0], tuple) else _ints(rng, entry)
            for entry in shapes]


def _matmul(x, w):
    return x @ w


def _mlp(x, w1, b1, w2):
    # The first contraction is over x's dimension 1, split over 'y': a reduction across
    # devices; the second contracts the hidden dimension, split over 'y' again.
    h = jnp.maximum(x @ w1 + b1, 0.0)
    return h @ w2


def _elementwise(x, y):
    return x * y + 1.0


def _replicated_out(x):
    return jnp.sum(x, axis=0) * 2.0


def _several_outputs(x, y):
    return x * 2.0, jnp.sum(x * y), (x + y).T, jnp.max(y, axis=1)


def _donated(x, y):
    return x * 3.0 - y


def _shard_transpose(x):
    return jnp.transpose(x, (1, 0, 2)) + 1.0


def _mixed_dtypes(i, b, h, s):
    return i * 3 - 1, b + b, (h * 2).astype(jnp.float32), s * 2.0


# name -> (function, mesh shape, axis names, in specs, out specs, input shapes (or
#          (shape, dtype)), donate_argnums)
PROGRAMS = {
    "matmul": (_matmul, (2, 4), ("x", "y"), [("x", "y"), ("y", None)], [("x", None)],
               [(8, 16), (16, 8)], ()),
    "mlp_reduce_over_sharded_axis": (
        _mlp, (2, 4), ("x", "y"), [("x", "y"), ("y", None), (), (None, "y")], [("x", "y")],
        [(8, 16), (16, 8), (8,), (8, 16)], ()),
    "elementwise_2d_mesh": (_elementwise, (2, 4), ("x", "y"), [("x", "y"), ("x", "y")],
                            [("x", "y")], [(8, 8), (8, 8)], ()),
    "replicated_output": (_replicated_out, (2, 4), ("x", "y"), [("x", "y")], [()],
                          [(8, 8)], ()),
    "several_outputs": (_several_outputs, (2, 4), ("x", "y"), [("x", "y"), ("y", None)],
                        [("x", None), (), ("y", "x"), ("x",)], [(8, 8), (8, 8)], ()),
    "donated_sharded_input": (_donated, (2, 4), ("x", "y"), [("x", "y"), ("y",)],
                              [("x", "y")], [(8, 8), (8, 8)], (0,)),
    "three_axes": (_shard_transpose, (2, 2, 2), ("a", "b", "c"), [("a", ("b", "c"), None)],
                   [("c", None, "a")], [(4, 8, 2)], ()),
    "mixed_dtypes": (_mixed_dtypes, (4, 2), ("x", "y"), [("x",), (None, "y"), ("y", "x"), ()],
                     [(None,), ("x", "y"), (), ()],
                     [((8,), np.int32), ((8, 4), bfloat16), ((4, 8), np.float16), ((), np.float32)],
                     ()),
    # The output's shards have another shape than the donated input's: nothing to alias.
    "donated_not_aliasable": (_donated, (2, 4), ("x", "y"), [("x", "y"), ()], [("y", "x")],
                              [(8, 8), (8, 8)], (0,)),
}


@pytest.mark.parametrize("order", [IDENTITY, PERMUTED], ids=["ordered", "permuted"])
@pytest.mark.parametrize("variant", PARTITIONERS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_jax(client, jax_devices, name, variant, order):
    fn, mesh_shape, names, in_specs, out_specs, shapes, donate = PROGRAMS[name]
    want = oracle(jax_devices, ("program", name, variant, order), fn=fn, mesh_shape=mesh_shape,
                  axis_names=names, order=order, in_specs=in_specs, out_specs=out_specs,
                  inputs=_inputs(name, shapes), variant=variant, donate=donate)
    compiled = check_against_oracle(client, want)
    assert compiled.executable.donated_parameters == frozenset(donate)


def test_the_programs_really_shard(jax_devices):
    # Guard against a vacuous oracle: the texts carry the shardings asked for.
    fn, mesh_shape, names, in_specs, out_specs, shapes, _ = PROGRAMS["several_outputs"]
    inputs = _inputs("several_outputs", shapes)
    for variant in PARTITIONERS:
        want = Oracle(jax_devices, fn, mesh_shape, names, PERMUTED, in_specs, out_specs, inputs,
                      variant)
        assert want.out_hlo == ["{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                                "{replicated}", "{devices=[4,2]<=[2,4]T(1,0)}",
                                "{devices=[2,4]<=[8] last_tile_dim_replicate}"]
        assert want.out_indices[0][3] == (slice(0, 4), slice(None))   # device 3 is first


@pytest.mark.parametrize("variant", PARTITIONERS)
def test_bytecode_matches_jax(client, jax_devices, variant):
    name = "several_outputs"
    fn, mesh_shape, names, in_specs, out_specs, shapes, donate = PROGRAMS[name]
    want = oracle(jax_devices, ("program", name, variant, PERMUTED), fn=fn, mesh_shape=mesh_shape,
                  axis_names=names, order=PERMUTED, in_specs=in_specs, out_specs=out_specs,
                  inputs=_inputs(name, shapes), variant=variant, donate=donate)
    check_against_oracle(client, want, bytecode=True)


# Programs whose text leaves an argument's or a result's sharding to the partitioner: jax
# compiles them with allow_spmd_sharding_propagation_to_parameters/_output set for those.

def _mlp_tanh(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def _constrained(x):
    return jax.lax.with_sharding_constraint(x * 2.0, JaxNamedSharding(
        JaxMesh(np.array(jax.devices("cpu")[:NUM_DEVICES]).reshape(2, 4), ("x", "y")),
        JaxP("x", "y")))


PROPAGATED = {
    # result unannotated: jax propagates P('x') to it
    "unannotated_result": (_mlp_tanh, (4, 2), ("x", "y"), [("x", None), (None, "y"), ("y", None)],
                           None, [(16, 8), (8, 8), (8, 4)]),
    # argument unannotated: jax propagates the constraint's P('x', 'y') back to it
    "unannotated_argument": (_constrained, (2, 4), ("x", "y"), None, [("x", "y")], [(8, 8)]),
}


@pytest.mark.parametrize("variant", PARTITIONERS)
@pytest.mark.parametrize("name", sorted(PROPAGATED))
def test_unannotated_shardings_are_propagated_as_jax_does(client, jax_devices, name, variant):
    fn, mesh_shape, names, in_specs, out_specs, shapes = PROPAGATED[name]
    want = oracle(jax_devices, ("propagated", name, variant), fn=fn, mesh_shape=mesh_shape,
                  axis_names=names, order=IDENTITY, in_specs=in_specs, out_specs=out_specs,
                  inputs=_inputs(name, shapes), variant=variant)
    assert "replicated" not in "".join(want.in_hlo + want.out_hlo)   # jax did propagate
    check_against_oracle(client, want, exact=False)


# --------------------------------------------------------------------------------------------
# the generated grid: an elementwise program over meshes x specs x partitioners


GRID_MESHES = {
    "8": ((8,), ("x",), IDENTITY),
    "2x4": ((2, 4), ("x", "y"), IDENTITY),
    "4x2": ((4, 2), ("x", "y"), IDENTITY),
    "2x2x2": ((2, 2, 2), ("x", "y", "z"), IDENTITY),
    "2x4_permuted": ((2, 4), ("x", "y"), PERMUTED),
}
GRID_SHAPE = (8, 8)


def _grid_specs(names: tuple) -> list[tuple]:
    specs = [(), (names[0],), (None, names[-1]), (names,)]
    if len(names) > 1:
        specs.append((names[-1], names[:-1]))
    unique = []
    for spec in specs:
        if pjrt.P(*spec) not in [pjrt.P(*s) for s in unique]:
            unique.append(spec)
    return unique


def _grid_cases():
    for mesh_name, (_, names, _) in GRID_MESHES.items():
        specs = _grid_specs(names)
        for k, spec in enumerate(specs):
            out_spec = specs[(k + 1) % len(specs)]   # the output is laid out otherwise
            for variant in PARTITIONERS:
                yield pytest.param(mesh_name, spec, out_spec, variant,
                                   id=f"{mesh_name}-{pjrt.P(*spec)}->{pjrt.P(*out_spec)}-"
                                      f"{variant}".replace(" ", ""))


def _grid_program(x, y):
    return x * 2.0 + y


@pytest.mark.parametrize("mesh_name, in_spec, out_spec, variant", list(_grid_cases()))
def test_elementwise_grid_matches_jax(client, jax_devices, mesh_name, in_spec, out_spec, variant):
    mesh_shape, names, order = GRID_MESHES[mesh_name]
    rng = np.random.default_rng(7)
    inputs = [_ints(rng, GRID_SHAPE), _ints(rng, GRID_SHAPE)]
    want = oracle(jax_devices, ("grid", mesh_name, in_spec, out_spec, variant), fn=_grid_program,
                  mesh_shape=mesh_shape, axis_names=names, order=order,
                  in_specs=[in_spec, out_spec], out_specs=[out_spec], inputs=inputs,
                  variant=variant)
    check_against_oracle(client, want)


def test_grid_covers_every_mesh_and_both_partitioners():
    cases = [p.values for p in _grid_cases()]
    assert {c[0] for c in cases} == set(GRID_MESHES)
    assert {c[3] for c in cases} == set(PARTITIONERS)
    assert len(cases) >= 40


# --------------------------------------------------------------------------------------------
# bad input: clear errors, and the client keeps working


@pytest.fixture
def elementwise(client, jax_devices):
    """(compiled elementwise program on a 2x4 mesh, its mesh, its oracle)."""
    want = oracle(jax_devices, ("program", "elementwise_2d_mesh", "shardy", IDENTITY),
                  fn=_elementwise, mesh_shape=(2, 4), axis_names=("x", "y"), order=IDENTITY,
                  in_specs=[("x", "y"), ("x", "y")], out_specs=[("x", "y")],
                  inputs=[_ints(np.random.default_rng(1), (8, 8)) for _ in range(2)],
                  variant="shardy")
    mesh = _our_mesh(client, (2, 4), ("x", "y"), IDENTITY)
    return pjrt.compile(want.text, mesh), mesh, want


def _still_works(compiled, want):
    _assert_values(compiled(*want.inputs), want, True, "a correct call after an error")


def test_mesh_larger_than_the_device_list(client, elementwise):
    compiled, _, want = elementwise
    devices = client.devices()
    assert len(devices) == NUM_DEVICES
    # 16 mesh positions from 8 devices can only repeat them.
    with pytest.raises(ValueError, match="cannot hold a device twice"):
        pjrt.Mesh(np.array(devices * 2, dtype=object).reshape(4, 4), ("x", "y"))
    with pytest.raises(ValueError, match="appears twice"):
        pjrt.compile(want.text, devices * 2)
    # A device id past the client's devices.
    with pytest.raises(ValueError) as error:
        client.lookup_device(NUM_DEVICES + 8)
    assert str(NUM_DEVICES + 8) in str(error.value)
    _still_works(compiled, want)


@pytest.mark.parametrize("variant", PARTITIONERS)
def test_program_for_more_devices_than_given(client, jax_devices, variant):
    # A program lowered for 8 partitions, compiled for 4 devices.
    want = oracle(jax_devices, ("program", "elementwise_2d_mesh", variant, IDENTITY),
                  fn=_elementwise, mesh_shape=(2, 4), axis_names=("x", "y"), order=IDENTITY,
                  in_specs=[("x", "y"), ("x", "y")], out_specs=[("x", "y")],
                  inputs=[_ints(np.random.default_rng(1), (8, 8)) for _ in range(2)],
                  variant=variant)
    small = _our_mesh(client, (2, 2), ("x", "y"), IDENTITY[:4])
    with pytest.raises((ValueError, pjrt.XlaRuntimeError)) as error:
        compiled = pjrt.compile(want.text, small)
        compiled(*want.inputs)
    message = str(error.value)
    assert "8" in message and "4" in message, message
    check_against_oracle(client, want)


def test_duplicate_devices_in_a_mesh(client, elementwise):
    compiled, _, want = elementwise
    d = client.devices()
    with pytest.raises(ValueError, match=r"cannot hold a device twice: .*appear more than once"):
        pjrt.Mesh(np.array([d[0], d[1], d[0], d[2]], dtype=object), "x")
    with pytest.raises(ValueError, match="appears twice"):
        pjrt.compile(want.text, [d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[0]])
    _still_works(compiled, want)


def test_mismatched_shapes(client, elementwise):
    compiled, mesh, want = elementwise
    x, y = want.inputs
    with pytest.raises((TypeError, ValueError), match="argument 0") as error:
        compiled(np.ones((16, 8), np.float32), y)
    assert "16" in str(error.value)
    with pytest.raises((TypeError, ValueError), match="argument 1"):
        compiled(x, np.ones((8, 8), np.float64))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        compiled(x)
    wrong = pjrt.device_put(np.ones((8, 16), np.float32),
                            pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    with pytest.raises((TypeError, ValueError), match="argument 1"):
        compiled(x, wrong)
    with pytest.raises((TypeError, ValueError), match="argument 0"):
        compiled.executable.execute_global([wrong, wrong])
    assert not wrong.is_deleted()
    _still_works(compiled, want)


def test_arrays_on_the_wrong_devices(client, elementwise):
    compiled, _, want = elementwise
    x, y = want.inputs
    four = pjrt.Mesh(np.array(client.devices()[:4], dtype=object).reshape(2, 2), ("x", "y"))
    elsewhere = pjrt.device_put(y, pjrt.NamedSharding(four, pjrt.P("x", "y")))
    right = pjrt.device_put(x, compiled.input_shardings[0])
    with pytest.raises(pjrt.DeviceAssignmentMismatchError) as error:
        compiled(right, elsewhere)
    message = str(error.value)
    assert "argument 1 is on cpu devices [0, 1, 2, 3]" in message, message
    assert "runs on cpu devices [0, 1, 2, 3, 4, 5, 6, 7]" in message, message
    single = pjrt.device_put(y, client.devices()[5])
    with pytest.raises(pjrt.DeviceAssignmentMismatchError,
                       match=r"argument 0 is on .*5.*argument 1 is on .*5"):
        compiled.executable.execute_global([single, single])
    assert not elsewhere.is_deleted() and not single.is_deleted() and not right.is_deleted()
    _still_works(compiled, want)


def test_wrong_devices_error_counts_host_arguments(client, elementwise):
    # Argument 0 is a host array, argument 1 an Array on 4 of the 8 devices: the error must
    # name argument 1. (pjrt.program.CompiledProgram._place_global checks only the Arrays,
    # renumbered from 0, so today it says "argument 0".)
    compiled, _, want = elementwise
    x, y = want.inputs
    four = pjrt.Mesh(np.array(client.devices()[:4], dtype=object).reshape(2, 2), ("x", "y"))
    elsewhere = pjrt.device_put(y, pjrt.NamedSharding(four, pjrt.P("x", "y")))
    with pytest.raises(pjrt.DeviceAssignmentMismatchError) as error:
        compiled(x, elsewhere)
    message = str(error.value)
    assert "argument 1 is on cpu devices [0, 1, 2, 3]" in message, message
    _still_works(compiled, want)


def test_arrays_laid_out_otherwise_are_refused_by_execute_global(client, elementwise):
    compiled, mesh, want = elementwise
    x, y = want.inputs
    rows = pjrt.device_put(x, pjrt.NamedSharding(mesh, pjrt.P("x")))
    right = pjrt.device_put(y, compiled.input_shardings[1])
    with pytest.raises(ValueError, match="argument 0 is laid out as"):
        compiled.executable.execute_global([rows, right])
    # pjrt.compile's callable reshards the same arrays instead.
    _assert_values(compiled(rows, right), want, True, "resharded")
    _still_works(compiled, want)
