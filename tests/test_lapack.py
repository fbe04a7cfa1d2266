"""jax's linear algebra, lowered for CPU, running on XLA's CPU plugins through pjrt.

The fixtures (tests/fixtures/linalg, see linalg_programs.py) are ``jnp.linalg`` and
``jax.scipy.linalg`` programs lowered by jax 0.10.2; on CPU they call LAPACK custom calls
(``lapack_dpotrf_ffi`` and 59 more) and jaxlib's ``tridiagonal_solve_perturbed_ffi`` (the
inverse iteration of ``eigh_tridiagonal``), which XLA's standalone plugin does not have.
pjrt_cpu ships them (pjrt_cpu.lapack) and registers them through pjrt.ffi. Every fixture runs on both test
plugins and is checked against numpy/scipy (invariants where a decomposition is not unique)
and against the outputs jax itself produced for the same inputs, including the NaN/info
behaviour on singular, non-positive-definite and non-finite inputs.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pjrt
import pjrt_cpu
from pjrt_cpu import lapack

from conftest import run_python
from fixtures.linalg import linalg_programs as programs

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "linalg"

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]
JAX_OUTPUTS = np.load(FIXTURES / "jax_outputs.npz")

# The whole set is long: marked lapack (and so slow), left out of the quick run.
pytestmark = pytest.mark.lapack

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
    # 15 routines x 4 types, and tridiagonal_solve_perturbed_ffi (one target, every type).
    assert len(lapack.targets()) == 61
    assert set(lapack.OTHER_TARGETS) <= set(lapack.targets())


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
    result = run_python(script, timeout=300)
    assert "No FFI handler registered for lapack_spotrf_ffi" in result.stdout
    assert "OK after registering" in result.stdout


# -- tridiagonal_solve_perturbed_ffi: eigh_tridiagonal's inverse iteration -----------------

EIGH_TRIDIAGONAL = sorted((name, case) for name, info in MANIFEST.items()
                          if info["program"] == "eigh_tridiagonal" for case in info["cases"])


@pytest.mark.parametrize(("fixture", "case"), EIGH_TRIDIAGONAL)
def test_eigh_tridiagonal_eigenvectors_match_jax_up_to_phase(client, fixture, case):
    """Each eigenvector of a well-separated eigenvalue is jax's up to a sign (a phase for
    complex types), and in the degenerate case (zero off-diagonal, repeated diagonal entries:
    exactly singular shifted systems, clusters) batch entry 1 still gets an orthonormal
    eigenbasis from the perturbed pivots."""
    info = MANIFEST[fixture]
    program = programs.PROGRAMS["eigh_tridiagonal"]
    inputs = _case(fixture, case, "in")
    (w, v), (jax_w, jax_v) = _run(client, fixture, inputs), _case(fixture, case, "out")
    tol = _tolerance(fixture)
    entries = range(len(w)) if info["batched"] else [None]
    for i in entries:
        ours, theirs, values = (v, jax_v, jax_w) if i is None else (v[i], jax_v[i], jax_w[i])
        if not np.all(np.isfinite(theirs)):
            continue  # the NaN case: the finiteness pattern is test_bad_inputs_behave_like_jax's
        values = programs.wide(values)
        gaps = np.diff(values)
        scale = max(1.0, float(np.max(np.abs(values))))
        separated = np.ones(len(values), bool)
        separated[:-1] &= gaps > np.sqrt(tol) * scale
        separated[1:] &= gaps > np.sqrt(tol) * scale
        overlap = np.abs(np.sum(np.conj(programs.wide(theirs)) * programs.wide(ours), axis=0))
        programs.assert_close(overlap[separated], np.ones(int(separated.sum())), tol,
                              f"|<v, v_jax>| of entry {i}")
        if case == "degenerate" and i == 1:
            program.check([x[1] for x in inputs], [w[1], v[1]], tol)


def _perturbed_solve_program(batch: int, n: int, nrhs: int, element: str) -> str:
    vector, matrix = f"tensor<{batch}x{n}x{element}>", f"tensor<{batch}x{n}x{nrhs}x{element}>"
    return f"""
module @tridiagonal_solve_perturbed {{
  func.func public @main(%dl: {vector}, %d: {vector}, %du: {vector}, %b: {matrix}) -> {matrix} {{
    %0 = stablehlo.custom_call @tridiagonal_solve_perturbed_ffi(%dl, %d, %du, %b) {{
      api_version = 4 : i32, mhlo.backend_config = {{}},
      operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>,
                         dense<[1, 0]> : tensor<2xindex>, dense<[1, 2, 0]> : tensor<3xindex>],
      result_layouts = [dense<[1, 2, 0]> : tensor<3xindex>]
    }} : ({vector}, {vector}, {vector}, {matrix}) -> {matrix}
    return %0 : {matrix}
  }}
}}
"""


_ELEMENTS = {np.float32: "f32", np.float64: "f64", np.complex64: "complex<f32>",
             np.complex128: "complex<f64>"}


def _random_tridiagonal(rng, batch, n, dtype):
    def draw(*shape):
        x = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)
    dl, d, du = draw(batch, n), draw(batch, n), draw(batch, n)
    dl[:, 0] = 0
    du[:, -1] = 0
    return dl, d, du


def _dense(dl, d, du):
    return np.diag(d) + np.diag(dl[1:], -1) + np.diag(du[:-1], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("n", [1, 2, 3, 64])
def test_perturbed_solve_on_singular_systems_gives_null_vectors(client, dtype, n):
    """Called directly on T - lambda I for exact eigenvalues lambda of T (and, for entry 0, a
    matrix with an exactly zero row): finite solutions that, normalized, are null vectors;
    entry 1 is a regular system and matches a dense solve. Sizes 1 and 2 take the kernel's
    special paths, 64 a long elimination with row swaps; three right-hand sides."""
    rng = np.random.default_rng(n)
    batch, nrhs = 4, 3
    dl, d, du = _random_tridiagonal(rng, batch, n, dtype)
    d[1] += 8  # diagonally dominant: regular
    # Entries 2 and 3: Hermitian T shifted by one of its eigenvalues (computed in float64).
    for i in (2, 3):
        du[i, :-1] = np.conj(dl[i, 1:])
        d[i] = d[i].real
        t = _dense(programs.wide(dl[i]), programs.wide(d[i]), programs.wide(du[i]))
        d[i] -= np.linalg.eigvalsh(t)[(i * 7) % n]
    # Entry 0: an exactly zero row (n - 1) // 2 and column.
    k = (n - 1) // 2
    d[0, k] = dl[0, k] = du[0, k] = 0
    if k + 1 < n:
        dl[0, k + 1] = 0
    if k > 0:
        du[0, k - 1] = 0
    b = rng.standard_normal((batch, n, nrhs)).astype(dtype)
    x = np.asarray(pjrt.compile(_perturbed_solve_program(batch, n, nrhs, _ELEMENTS[dtype]),
                                client=client)(dl, d, du, b))
    assert x.shape == b.shape and x.dtype == np.dtype(dtype)
    assert np.all(np.isfinite(x))
    eps = np.finfo(dtype).eps
    for i in range(batch):
        t = _dense(programs.wide(dl[i]), programs.wide(d[i]), programs.wide(du[i]))
        xi = programs.wide(x[i])
        if i == 1:
            expected = np.linalg.solve(t, programs.wide(b[i]))
            programs.assert_close(xi, expected, 1e3 * eps, "regular system vs numpy")
            continue
        for j in range(nrhs):
            v = xi[:, j] / np.max(np.abs(xi[:, j]))  # (up to ~1/safemin: scale before the norm)
            v = v / np.linalg.norm(v)
            residual = np.linalg.norm(t @ v)
            assert residual <= 100 * n * eps * max(1.0, np.linalg.norm(t, 1)), (i, j, residual)


def test_perturbed_solve_rejects_unsupported_types(client):
    """float16 is not a type jax lowers the target for: an error naming it, not a crash."""
    program = _perturbed_solve_program(2, 4, 1, "f16")
    executable = pjrt.compile(program, client=client)
    z = np.zeros((2, 4), np.float16)
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        np.asarray(executable(z, z, z, np.zeros((2, 4, 1), np.float16)))
    assert excinfo.value.code == pjrt.ErrorCode.INVALID_ARGUMENT
    assert "tridiagonal_solve_perturbed_ffi" in str(excinfo.value)
    assert "unsupported element type" in str(excinfo.value)


def test_scipy_is_imported_only_for_a_program_that_calls_lapack():
    """Start-up and programs without linear algebra leave SciPy alone (its import costs more
    than the rest of start-up); the first LAPACK program brings it in and runs."""
    script = f"""
        import sys
        import numpy as np
        import pjrt
        compiled = pjrt.compile('''
        func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
          %0 = stablehlo.add %x, %x : tensor<3xf32>
          return %0 : tensor<3xf32>
        }}''', pjrt.devices()[0])
        np.testing.assert_array_equal(np.asarray(compiled(np.ones(3, np.float32))), [2, 2, 2])
        print("scipy before:", "scipy" in sys.modules)
        text = open({str(FIXTURES / "cholesky.float64.mlir")!r}).read()
        m = np.random.default_rng(0).standard_normal((5, 5))
        a = m @ m.T + 5 * np.eye(5)
        lower = np.asarray(pjrt.compile(text, pjrt.devices()[0])(a))
        np.testing.assert_allclose(lower, np.linalg.cholesky(a), rtol=1e-10)
        print("scipy after:", "scipy" in sys.modules)
    """
    result = run_python(script, timeout=300)
    assert "scipy before: False" in result.stdout
    assert "scipy after: True" in result.stdout


def test_without_scipy_a_lapack_program_is_refused_clearly():
    script = f"""
        import sys
        sys.modules["scipy"] = None  # as if SciPy were not installed
        import pjrt
        text = open({str(FIXTURES / "cholesky.float64.mlir")!r}).read()
        try:
            pjrt.compile(text, pjrt.devices()[0])
        except RuntimeError as exc:
            print("ERROR", exc)
        ok = pjrt.compile('''
        func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
          return %x : tensor<3xf32>
        }}''', pjrt.devices()[0])
        print("other programs still compile")
    """
    result = run_python(script, timeout=300)
    assert "ERROR the custom-call targets lapack_dpotrf_ffi" in result.stdout
    assert "ImportError" in result.stdout and "pip install scipy" in result.stdout
    assert "other programs still compile" in result.stdout
