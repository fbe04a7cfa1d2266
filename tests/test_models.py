"""The model corpus (tests/fixtures/models): real programs from flax (linen and nnx), equinox,
optax, diffrax, jax.scipy and torch (through torchax), compiled and run by pjrt on both CPU
plugin builds and compared with the outputs jax computed when they were generated.

Nothing here runs jax: the programs are StableHLO text compiled with :func:`pjrt.compile`, or
jax.export blobs read with :func:`pjrt.deserialize_exported` and called with the pytree the
export recorded. Each runs once with numpy inputs and once with inputs already on the devices
(pjrt Arrays, laid out by the shardings the fixture records). Eight-device fixtures run as
SPMD programs over the client's eight devices. ``test_runs_without_jax`` runs the whole corpus
in an interpreter that never imports jax.
"""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
import pjrt_cpu

from conftest import run_python
from models import corpus

FIXTURES = corpus.fixtures()


def _params(where=lambda fixture: True):
    """The fixtures' names, the heavier ones (their metadata says) marked slow."""
    return [pytest.param(f.name, id=f.name, marks=[pytest.mark.slow] if f.slow else [])
            for f in FIXTURES if where(f)]


@pytest.fixture(scope="module", autouse=True)
def lapack_kernels():
    """The LAPACK handlers jax's linear algebra calls (gp_loglik), as plugin discovery
    registers them."""
    pjrt_cpu.initialize()


def _devices(client, fixture: corpus.Fixture) -> list:
    devices = client.devices()
    assert len(devices) >= fixture.devices, f"{fixture.name} needs {fixture.devices} devices"
    return devices[:fixture.devices]


def _mesh(client, fixture: corpus.Fixture) -> pjrt.Mesh:
    shape, names = fixture.mesh
    return pjrt.Mesh(np.array(_devices(client, fixture)).reshape(shape), names)


def _spec(entry) -> pjrt.PartitionSpec:
    return pjrt.PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in entry))


_compiled: dict = {}


def _compile(client, fixture: corpus.Fixture):
    """The fixture compiled on ``client`` (once per client): a CompiledProgram for text, an
    ExportedExecutable for an export."""
    key = (id(client), fixture.name)
    if key not in _compiled:
        if fixture.format == "mlir":
            _compiled[key] = pjrt.compile(fixture.program(), _devices(client, fixture))
        else:
            exported = pjrt.deserialize_exported(fixture.program())
            _compiled[key] = exported.compile(_devices(client, fixture), client=client)
    return _compiled[key]


def _run(client, fixture: corpus.Fixture, inputs) -> list:
    """Run the fixture on ``inputs`` (its flattened inputs): the flattened outputs."""
    compiled = _compile(client, fixture)
    if fixture.format == "mlir":
        outputs = compiled(*inputs)
        return list(outputs) if isinstance(outputs, tuple) else [outputs]
    args, kwargs = compiled.exported.in_tree.unflatten(inputs)
    return compiled.exported.out_tree.flatten(compiled(*args, **kwargs))


def _on_devices(client, fixture: corpus.Fixture) -> list:
    """The fixture's inputs as pjrt Arrays: on the first device, or laid out over the mesh as
    its metadata says."""
    inputs = fixture.inputs()
    if fixture.devices == 1:
        device = client.devices()[0]
        return [pjrt.device_put(x, device) for x in inputs]
    mesh = _mesh(client, fixture)
    return [pjrt.device_put(x, pjrt.NamedSharding(mesh, _spec(spec)))
            for x, spec in zip(inputs, fixture.input_specs())]


@pytest.mark.parametrize("name", _params())
def test_numpy_inputs(client, name):
    fixture = corpus.load(name)
    outputs = _run(client, fixture, fixture.inputs())
    fixture.check(outputs)
    for output in outputs:
        assert isinstance(output, pjrt.Array)
        assert len(output.sharding.device_set) == fixture.devices


@pytest.mark.parametrize("name", _params())
def test_device_inputs(client, name):
    fixture = corpus.load(name)
    arrays = _on_devices(client, fixture)
    outputs = _run(client, fixture, arrays)
    fixture.check(outputs)
    if fixture.devices > 1:
        mesh = _mesh(client, fixture)
        for index, (output, spec) in enumerate(zip(outputs, fixture.output_specs())):
            want = pjrt.NamedSharding(mesh, _spec(spec))
            assert output.sharding.is_equivalent_to(want, output.ndim), \
                f"output {index}: {output.sharding} is not {want}"
    assert not any(a.is_deleted() for a in arrays), "the inputs were not donated"


@pytest.mark.parametrize("name", _params(lambda f: f.devices > 1))
def test_sharded_programs_expect_the_recorded_layout(client, name):
    """The compiled program's input shardings are the ones the fixture was lowered with, so
    the device-resident run above was not resharded behind the test's back."""
    fixture = corpus.load(name)
    compiled = _compile(client, fixture)
    program = compiled if fixture.format == "mlir" else compiled.program
    mesh = _mesh(client, fixture)
    for index, (sharding, spec, info) in enumerate(zip(
            program.input_shardings, fixture.input_specs(), fixture.meta["inputs"])):
        want = pjrt.NamedSharding(mesh, _spec(spec))
        assert sharding.is_equivalent_to(want, len(info["shape"])), \
            f"input {index}: {sharding} is not {want}"


@pytest.mark.parametrize("name", _params(lambda f: f.format == "exported"))
def test_exported_structure(name):
    """deserialize_exported reads the pytree and avals the export recorded."""
    fixture = corpus.load(name)
    exported = pjrt.deserialize_exported(fixture.program())
    assert exported.platforms == ("cpu",)
    assert exported.nr_devices == fixture.devices
    assert exported.in_tree.num_leaves == len(fixture.meta["inputs"])
    assert exported.out_tree.num_leaves == len(fixture.meta["outputs"])
    for aval, info in zip(exported.in_avals + exported.out_avals,
                          fixture.meta["inputs"] + fixture.meta["outputs"]):
        assert list(aval.shape) == info["shape"] and np.dtype(aval.dtype).name == info["dtype"]
    args, kwargs = exported.in_tree.unflatten(fixture.inputs())
    assert kwargs == {}
    assert [id(x) for x in exported.in_tree.flatten((args, kwargs))] == \
        [id(x) for x in fixture.inputs()]


def test_corpus_is_complete_and_meaningful():
    """The corpus covers the families it promises, and its references are not degenerate (a
    constant or all-zero output would let a broken program pass)."""
    families = {f.family for f in FIXTURES}
    assert {"mlp", "cnn", "cnn-train", "transformer", "transformer-train", "rnn", "vae",
            "mlp-train", "low-precision", "lapack", "ode", "many-arguments", "data-parallel",
            "tensor-parallel"} <= families
    libraries = {part for f in FIXTURES for part in f.library.split("+")}
    assert {"flax.linen", "flax.nnx", "equinox", "optax", "torch", "torchax", "diffrax",
            "jax.scipy"} <= libraries
    assert any(len(f.meta["inputs"]) >= 300 for f in FIXTURES)
    assert sum(f.format == "exported" for f in FIXTURES) >= 3
    for fixture in FIXTURES:
        varied = [o for o in fixture.expected() if o.size > 1]
        assert any(np.ptp(o.astype(np.float64)) > 0 for o in varied) or not varied, fixture.name
        for output in fixture.expected():
            if output.dtype.kind == "f" or output.dtype.name == "bfloat16":
                assert np.isfinite(output.astype(np.float64)).all(), fixture.name


def test_changed_inputs_change_the_outputs(client):
    """The comparison has teeth: the same program on other weights misses the references."""
    fixture = corpus.load("flax_mlp")
    inputs = [x * 1.01 if x.dtype.kind == "f" else x for x in fixture.inputs()]
    with pytest.raises(AssertionError):
        fixture.check(_run(client, fixture, inputs))


@pytest.mark.slow
def test_runs_without_jax(cpu_plugin):
    """The whole corpus, on each plugin build, in an interpreter that never imports jax."""
    from conftest import cpu_plugin_path

    run_python("""
        import sys
        import numpy as np
        import pjrt, pjrt_cpu
        sys.path.insert(0, sys.argv[3])
        from models import corpus
        pjrt_cpu.initialize()
        pjrt.load_pjrt_plugin_dynamically(sys.argv[1], sys.argv[2])
        client = pjrt.make_c_api_client(sys.argv[1], {"cpu_device_count": 8})
        for fixture in corpus.fixtures():
            devices = client.devices()[:fixture.devices]
            if fixture.format == "mlir":
                outputs = pjrt.compile(fixture.program(), devices)(*fixture.inputs())
                outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
            else:
                exported = pjrt.deserialize_exported(fixture.program())
                args, kwargs = exported.in_tree.unflatten(fixture.inputs())
                result = exported.compile(devices, client=client)(*args, **kwargs)
                outputs = exported.out_tree.flatten(result)
            fixture.check(outputs)
        assert "jax" not in sys.modules, "the corpus run imported jax"
        print("ran", len(corpus.fixtures()))
    """, cpu_plugin.name, cpu_plugin_path(cpu_plugin.name), corpus.FIXTURES.parent.parent,
        timeout=600)
