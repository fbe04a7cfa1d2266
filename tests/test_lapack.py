"""jax's linear algebra, lowered for CPU, running on XLA's CPU plugins through pjrt.

The fixtures (tests/fixtures/linalg, see linalg_programs.py) are ``jnp.linalg`` and
``jax.scipy.linalg`` programs lowered by jax 0.10.2; on CPU they call LAPACK custom calls
(``lapack_dpotrf_ffi`` and 59 more) that XLA's standalone plugin does not have. pjrt_cpu ships
them (pjrt_cpu.lapack) and registers them through pjrt.ffi. Every fixture runs on both test
plugins and is checked against numpy/scipy (invariants where a decomposition is not unique)
and against the outputs jax itself produced for the same inputs, including the NaN/info
behaviour on singular, non-positive-definite and non-finite inputs.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pjrt
import pjrt_cpu
from pjrt_cpu import lapack

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "linalg"
sys.path.insert(0, str(FIXTURES))
import linalg_programs as programs  # noqa: E402

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]
JAX_OUTPUTS = np.load(FIXTURES / "jax_outputs.npz")

NORMAL = sorted(MANIFEST)
SPECIAL = sorted((name, case) for name, info in MANIFEST.items()
                 for case in info["cases"] if case != "normal")


@pytest.fixture(scope="module", autouse=True)
def lapack_kernels():
    """Registers the LAPACK handlers, as pjrt's plugin discovery will (idempotent)."""
    pjrt_cpu.initialize()


_executables: dict = {}


def _run(client, fixture: str, inputs) -> list[np.ndarray]:
    key = (id(client), fixture)
    executable = _executables.get(key)
    if executable is None:
        executable = pjrt.compile((FIXTURES / f"{fixture}.mlir").read_text(), client=client)
        _executables[key] = executable
    outputs = executable(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [np.asarray(x) for x in outputs]


def _case(fixture: str, case: str, kind: str) -> list[np.ndarray]:
    count = len(MANIFEST[fixture]["inputs" if kind == "in" else "outputs"])
    return [JAX_OUTPUTS[f"{fixture}/{case}/{kind}{i}"] for i in range(count)]


def _tolerance(fixture: str) -> float:
    return programs.TOLERANCE[MANIFEST[fixture]["dtype"]]


@pytest.mark.parametrize("fixture", NORMAL)
def test_matches_numpy_and_jax(client, fixture):
    info = MANIFEST[fixture]
    program = programs.PROGRAMS[info["program"]]
    inputs = _case(fixture, "normal", "in")
    outputs = _run(client, fixture, inputs)
    expected = _case(fixture, "normal", "out")
    assert [(list(x.shape), x.dtype.name) for x in outputs] == \
        [(o["shape"], o["dtype"]) for o in info["outputs"]]
    programs.check_outputs(program, inputs, outputs, info["dtype"], info["batched"])
    tol = _tolerance(fixture)
    for i in program.unique:
        programs.assert_close(outputs[i], expected[i], tol * 10, f"output {i} vs jax")
    for i in program.multiset:
        for ours, theirs in zip(np.reshape(outputs[i], (-1, outputs[i].shape[-1])),
                                np.reshape(expected[i], (-1, expected[i].shape[-1]))):
            programs.assert_same_multiset(ours, theirs, tol, f"output {i} vs jax")


@pytest.mark.parametrize(("fixture", "case"), SPECIAL)
def test_bad_inputs_behave_like_jax(client, fixture, case):
    """Batch entry 1 is NaN/inf/singular/not positive definite: the same non-finite
    entries as jax (NaN where jax's info check fails), and the good entries still right."""
    info = MANIFEST[fixture]
    program = programs.PROGRAMS[info["program"]]
    inputs = _case(fixture, case, "in")
    outputs = _run(client, fixture, inputs)
    expected = _case(fixture, case, "out")
    for i, (ours, theirs) in enumerate(zip(outputs, expected)):
        if ours.dtype.kind in "fc":
            np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs),
                                          err_msg=f"non-finite entries of output {i}")
    good = {0, 2}
    programs.check_outputs(program, inputs, outputs, info["dtype"], True, only=good)
    tol = _tolerance(fixture)
    for i in program.unique:
        ours, theirs = programs.wide(outputs[i]), programs.wide(expected[i])
        finite = np.isfinite(theirs)
        programs.assert_close(np.where(finite, ours, 0), np.where(finite, theirs, 0), tol * 10,
                              f"finite entries of output {i} vs jax")


def test_every_target_jax_lowers_to_is_registered():
    used = set()
    for info in MANIFEST.values():
        used.update(info["custom_calls"])
    registered = set(pjrt.custom_call_targets("cpu"))
    assert used <= registered, sorted(used - registered)
    assert set(lapack.targets()) <= registered
    assert len(lapack.targets()) == 60  # 15 routines x 4 types


def test_registering_again_is_harmless(client):
    names = pjrt_cpu.register_lapack_kernels()
    assert pjrt_cpu.register_lapack_kernels() == names
    out = _run(client, "det.float32", _case("det.float32", "normal", "in"))
    assert np.isfinite(out[0])


def test_kernels_read_scipy_lapack():
    names = lapack.provide_lapack()
    assert "dpotrf" in names and "zheevd" in names and "ctrsm" in names
    assert len(names) == 60


_POTRF_PROGRAM = """
module @potrf {
  func.func public @main(%a: tensor<4x64x64xf64>) -> (tensor<4x64x64xf64>, tensor<4xi32>) {
    %0:2 = stablehlo.custom_call @lapack_dpotrf_ffi(%a) {
      mhlo.backend_config = {uplo = 76 : ui8},
      operand_layouts = [dense<[1, 2, 0]> : tensor<3xindex>],
      result_layouts = [dense<[1, 2, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>]
    } : (tensor<4x64x64xf64>) -> (tensor<4x64x64xf64>, tensor<4xi32>)
    return %0#0, %0#1 : tensor<4x64x64xf64>, tensor<4xi32>
  }
}
"""


def test_hand_written_custom_call_gets_column_major_matrices_and_info(client):
    """Larger matrices than the fixtures, called directly: the column-major layouts jax
    asks for reach the kernel, and LAPACK's info comes back per batch entry."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 64, 64))
    spd = a @ np.swapaxes(a, -1, -2) + 64 * np.eye(64)
    spd[2, 10, 10] = -1e6  # the leading 11x11 minor of entry 2 is not positive definite
    factor, info = pjrt.compile(_POTRF_PROGRAM, client=client)(spd)
    factor, info = np.asarray(factor), np.asarray(info)
    np.testing.assert_array_equal(info, [0, 0, 11, 0])
    for i in (0, 1, 3):
        np.testing.assert_allclose(np.tril(factor[i]), np.linalg.cholesky(spd[i]),
                                   rtol=1e-10, atol=1e-10)
        # LAPACK leaves the other triangle alone.
        np.testing.assert_array_equal(np.triu(factor[i], 1), np.triu(spd[i], 1))


@pytest.mark.parametrize(("attributes", "code", "text"), [
    ("", pjrt.ErrorCode.INVALID_ARGUMENT, "missing attribute uplo"),
    ('uplo = "L"', pjrt.ErrorCode.INVALID_ARGUMENT, "one-byte scalar"),
])
def test_kernel_reports_bad_calls_as_errors(client, attributes, code, text):
    """A malformed call is an XlaRuntimeError naming the target, not a crash."""
    program = _POTRF_PROGRAM.replace("mhlo.backend_config = {uplo = 76 : ui8}",
                                     f"mhlo.backend_config = {{{attributes}}}")
    executable = pjrt.compile(program, client=client)
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        np.asarray(executable(np.eye(64)[None].repeat(4, 0))[1])
    assert excinfo.value.code == code
    assert "lapack_dpotrf_ffi" in str(excinfo.value) and text in str(excinfo.value)


def test_schur_with_sorting_is_unimplemented_like_jax(client):
    text = (FIXTURES / "schur.float64.mlir").read_text().replace("sort = 78 : ui8",
                                                                  "sort = 83 : ui8")
    executable = pjrt.compile(text, client=client)
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        np.asarray(executable(np.eye(5))[0])
    assert excinfo.value.code == pjrt.ErrorCode.UNIMPLEMENTED
    assert "lapack_dgees_ffi" in str(excinfo.value)


def test_without_the_kernels_xla_reports_the_missing_target(tmp_path):
    """What the kernels fix: a fresh process that never registers them cannot compile."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        import pjrt
        from conftest import cpu_plugin_path
        pjrt.load_pjrt_plugin_dynamically("xla_cpu_0_106", cpu_plugin_path("xla_cpu_0_106"))
        client = pjrt.make_c_api_client("xla_cpu_0_106")
        text = open({str(FIXTURES / "cholesky.float32.mlir")!r}).read()
        try:
            pjrt.compile(text, client=client)
        except pjrt.XlaRuntimeError as exc:
            print("ERROR", exc)
        import pjrt_cpu
        pjrt_cpu.register_lapack_kernels()
        pjrt.compile(text, client=client)
        print("OK after registering")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "No FFI handler registered for lapack_spotrf_ffi" in result.stdout
    assert "OK after registering" in result.stdout
