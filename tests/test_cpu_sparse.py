"""jaxlib's CPU sparse kernel (``cpu_csr_sparse_dense_ffi``, pjrt_cpu.cpu_sparse) on XLA's CPU
plugins: BCSR @ dense programs lowered by jax, run through pjrt and judged against jax running
the same program, over shapes, element types and densities; index checks on malformed
matrices; and the targets jaxlib's ``cpu_sparse.registrations()`` names."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
import pjrt_cpu
from pjrt.errors import XlaRuntimeError
from pjrt_cpu import cpu_sparse

TARGET = "cpu_csr_sparse_dense_ffi"
TOLERANCE = {"float32": 2e-5, "float64": 1e-12, "complex64": 2e-5, "complex128": 1e-12}


@pytest.fixture(scope="module", autouse=True)
def sparse_kernels():
    """Registers the kernels, as pjrt-cpu does before its clients come up (idempotent)."""
    pjrt_cpu.initialize()


def _matrix(rng, shape, dtype, density):
    dense = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        dense = dense + 1j * rng.standard_normal(shape)
    dense = np.where(rng.random(shape) < density, dense, 0).astype(dtype)
    return dense


def _check_against_jax(jax, client, rows, cols, rhs_shape, dtype, density, seed=0):
    """Lower ``M @ x`` for a BCSR ``M`` with jax, run it with pjrt, compare with jax's run."""
    from jax.experimental import sparse

    rng = np.random.default_rng(seed)
    dense = _matrix(rng, (rows, cols), dtype, density)
    x = _matrix(rng, (cols, *rhs_shape), dtype, 1.0)
    with jax.enable_x64(True):  # float64 and complex128 stay what they are
        matrix = sparse.BCSR.fromdense(jax.numpy.asarray(dense))
        product = jax.jit(lambda m, v: m @ v)
        text = product.lower(matrix, x).as_text()
        theirs = np.asarray(product(matrix, x))
        leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves((matrix, x))]
    assert f"stablehlo.custom_call @{TARGET}" in text  # jax's CPU lowering of the product
    ours = np.asarray(pjrt.compile(text, client=client)(*leaves))
    assert ours.shape == theirs.shape == (rows, *rhs_shape) and ours.dtype == theirs.dtype
    tolerance = TOLERANCE[np.dtype(dtype).name] * max(cols, 1)
    np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(ours, dense @ x, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("rows", "cols", "rhs_shape", "dtype"), [
    (6, 5, (3,), "float32"), (7, 4, (), "float64"), (5, 8, (2,), "complex64"),
    (4, 4, (), "complex128")])
def test_bcsr_products_match_jax(jax_cpu, client, rows, cols, rhs_shape, dtype):
    _check_against_jax(jax_cpu, client, rows, cols, rhs_shape, dtype, density=0.4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("density", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize(("rows", "cols", "rhs_shape"), [
    (1, 1, ()), (1, 9, (4,)), (9, 1, (1,)), (33, 17, ()), (33, 17, (8,)), (64, 128, (16,)),
    (200, 150, (3,))])
def test_bcsr_products_over_shapes_types_and_densities(jax_cpu, client, rows, cols, rhs_shape,
                                                       dtype, density):
    _check_against_jax(jax_cpu, client, rows, cols, rhs_shape, dtype, density,
                       seed=rows * 1000 + cols)


def _direct_program(rows, cols, k, nnz, element, index):
    """The custom call written out, for element and index types jax's BCSR does not make
    here (integers; int64 indices without x64)."""
    rhs = f"tensor<{cols}x{k}x{element}>"
    out = f"tensor<{rows}x{k}x{element}>"
    return f"""
    func.func public @main(%d: tensor<{nnz}x{element}>, %p: tensor<{rows + 1}x{index}>,
                           %i: tensor<{nnz}x{index}>, %b: {rhs}) -> {out} {{
      %y = stablehlo.custom_call @{TARGET}(%d, %p, %i, %b) {{api_version = 4 : i32}}
          : (tensor<{nnz}x{element}>, tensor<{rows + 1}x{index}>, tensor<{nnz}x{index}>, {rhs})
          -> {out}
      return %y : {out}
    }}"""


def _csr(dense, index_dtype):
    rows, columns = np.nonzero(dense)
    indptr = np.searchsorted(rows, np.arange(dense.shape[0] + 1)).astype(index_dtype)
    return dense[rows, columns], indptr, columns.astype(index_dtype)


@pytest.mark.parametrize(("element", "dtype"), [("i32", np.int32), ("i64", np.int64),
                                                ("f64", np.float64)])
@pytest.mark.parametrize(("index", "index_dtype"), [("i32", np.int32), ("i64", np.int64)])
def test_element_and_index_types(client, element, dtype, index, index_dtype):
    rng = np.random.default_rng(1)
    dense = np.where(rng.random((5, 6)) < 0.5, rng.integers(-9, 9, (5, 6)), 0).astype(dtype)
    rhs = rng.integers(-9, 9, (6, 3)).astype(dtype)
    data, indptr, indices = _csr(dense, index_dtype)
    program = _direct_program(5, 6, 3, len(data), element, index)
    out = pjrt.compile(program, client=client)(data, indptr, indices, rhs)
    np.testing.assert_array_equal(np.asarray(out), dense @ rhs)


def test_repeated_entries_add_up_and_empty_rows_are_zero(client):
    # Row 0 holds column 1 twice; row 1 is empty; row 2 holds column 0.
    data = np.array([1.0, 2.0, 5.0])
    indptr = np.array([0, 2, 2, 3], np.int32)
    indices = np.array([1, 1, 0], np.int32)
    rhs = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = pjrt.compile(_direct_program(3, 2, 3, 3, "f64", "i32"), client=client)(
        data, indptr, indices, rhs)
    np.testing.assert_array_equal(np.asarray(out), [3 * rhs[1], np.zeros(3), 5 * rhs[0]])


@pytest.mark.parametrize(("indptr", "indices", "message"), [
    ([0, 2, 1, 3], [0, 1, 1], r"indptr\[2\] is 1: indptr must not decrease"),
    ([1, 2, 3, 3], [0, 1, 1], r"indptr\[0\] is 1"),
    ([0, 1, 2, 4], [0, 1, 1], r"indptr\[3\] is 4: .* within the 3 stored values"),
    ([0, 1, 2, 3], [0, 2, 1], r"indices\[1\] is 2, outside the 2 columns"),
    ([0, 1, 2, 3], [0, -1, 1], r"indices\[1\] is -1, outside the 2 columns"),
])
def test_a_malformed_matrix_is_an_error_not_a_crash(client, indptr, indices, message):
    program = pjrt.compile(_direct_program(3, 2, 1, 3, "f32", "i32"), client=client)
    with pytest.raises(XlaRuntimeError, match=f"{TARGET}: {message}"):
        np.asarray(program(np.ones(3, np.float32), np.array(indptr, np.int32),
                           np.array(indices, np.int32), np.ones((2, 1), np.float32)))


def test_registrations_name_jaxlibs_targets():
    ours = cpu_sparse.registrations()
    assert [(name, version) for name, _, version in ours["cpu"]] == [(TARGET, 1)]
    assert all(address for _, address, _ in ours["cpu"])
    assert TARGET in pjrt.ffi.custom_call_targets("cpu")
    jaxlib_sparse = pytest.importorskip("jaxlib.cpu_sparse")
    assert sorted(ours) == sorted(jaxlib_sparse.registrations())
    assert sorted(name for name, *_ in ours["cpu"]) == sorted(
        name for name, *_ in jaxlib_sparse.registrations()["cpu"])


# -- threads ----------------------------------------------------------------------------------

@pytest.fixture
def max_threads():
    """``cpu_sparse.set_max_threads``, put back after the test."""
    previous = cpu_sparse.max_threads()
    yield cpu_sparse.set_max_threads
    cpu_sparse.set_max_threads(previous)


def _skewed_csr(rng, rows, cols, dtype, index_dtype):
    """A CSR matrix whose rows hold very different counts (empty rows, rows of every column),
    so that slices of equal work have unequal rows."""
    counts = rng.integers(0, 40, rows)
    counts[::97] = cols  # full rows
    counts[5::13] = 0  # empty rows
    dense = np.zeros((rows, cols), dtype)
    for i, count in enumerate(counts):
        columns = rng.choice(cols, size=count, replace=False)
        values = rng.standard_normal(count) * 3
        if np.dtype(dtype).kind == "c":
            values = values + 1j * rng.standard_normal(count)
        dense[i, columns] = values.astype(dtype) if np.dtype(dtype).kind != "i" else (
            np.rint(values).astype(dtype))
    return dense, _csr(dense, index_dtype)


def _bits(array):
    array = np.ascontiguousarray(array)
    return array.view(np.uint8)


@pytest.mark.parametrize(("element", "dtype", "index", "index_dtype"), [
    ("f32", np.float32, "i32", np.int32), ("f64", np.float64, "i64", np.int64),
    ("complex<f32>", np.complex64, "i32", np.int32), ("i64", np.int64, "i32", np.int32)])
def test_threaded_products_equal_one_thread_bit_for_bit(client, max_threads, element, dtype,
                                                        index, index_dtype):
    rng = np.random.default_rng(7)
    rows, cols, k = 1500, 700, 24
    dense, (data, indptr, indices) = _skewed_csr(rng, rows, cols, dtype, index_dtype)
    rhs = (rng.standard_normal((cols, k)) * 3).astype(dtype) if np.dtype(dtype).kind != "i" \
        else rng.integers(-50, 50, (cols, k)).astype(dtype)
    program = pjrt.compile(_direct_program(rows, cols, k, len(data), element, index),
                           client=client)
    max_threads(1)
    started = cpu_sparse._threads_started()
    one = np.asarray(program(data, indptr, indices, rhs))
    assert cpu_sparse._threads_started() == started  # the calling thread alone
    max_threads(5)  # taken as asked, whatever the machine's cores
    five = np.asarray(program(data, indptr, indices, rhs))
    assert cpu_sparse._threads_started() == started + 4
    max_threads(None)
    default = np.asarray(program(data, indptr, indices, rhs))
    # Each row is summed by one thread in stored order: the same bits on any thread count.
    assert np.array_equal(_bits(five), _bits(one)) and np.array_equal(_bits(default), _bits(one))
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(one, dense @ rhs)
    else:
        np.testing.assert_allclose(one, dense.astype(np.complex128) @ rhs, rtol=1e-4,
                                   atol=1e-3 * cols)


def test_small_products_stay_on_the_calling_thread(client, max_threads):
    rng = np.random.default_rng(3)
    dense, (data, indptr, indices) = _skewed_csr(rng, 60, 50, np.float32, np.int32)
    rhs = rng.standard_normal((50, 4)).astype(np.float32)
    program = pjrt.compile(_direct_program(60, 50, 4, len(data), "f32", "i32"), client=client)
    max_threads(8)
    started = cpu_sparse._threads_started()
    out = np.asarray(program(data, indptr, indices, rhs))
    assert cpu_sparse._threads_started() == started  # 2^17 multiply-adds a thread at the least
    np.testing.assert_allclose(out, dense @ rhs, rtol=1e-5, atol=1e-4)


def test_set_max_threads_takes_counts_or_none(max_threads):
    assert max_threads(3) in (None, *range(1, 65))
    assert cpu_sparse.max_threads() == 3
    assert max_threads(None) == 3 and cpu_sparse.max_threads() is None
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="at least 1, or None"):
            cpu_sparse.set_max_threads(bad)
    assert cpu_sparse.max_threads() is None


def test_concurrent_threaded_products(client, max_threads):
    import threading

    rng = np.random.default_rng(11)
    rows, cols, k = 1200, 600, 16
    dense, (data, indptr, indices) = _skewed_csr(rng, rows, cols, np.float64, np.int32)
    program = pjrt.compile(_direct_program(rows, cols, k, len(data), "f64", "i32"),
                           client=client)
    inputs = [rng.standard_normal((cols, k)) for _ in range(4)]
    max_threads(1)
    expected = [np.asarray(program(data, indptr, indices, rhs)) for rhs in inputs]
    max_threads(3)
    results: dict = {}

    def work(which):
        try:
            results[which] = [np.asarray(program(data, indptr, indices, inputs[which]))
                              for _ in range(5)]
        except BaseException as error:  # noqa: BLE001 - reported below
            results[which] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for which in range(4):
        assert not isinstance(results[which], BaseException), results[which]
        assert all(np.array_equal(_bits(got), _bits(expected[which]))
                   for got in results[which])


FORK_AND_EXIT = r"""
import os, sys, threading
import numpy as np
import pjrt, pjrt_cpu
from pjrt_cpu import cpu_sparse
sys.path.insert(0, sys.argv[1])
from test_cpu_sparse import _direct_program
pjrt_cpu.initialize()
client = pjrt.make_cpu_client(1)
rng = np.random.default_rng(0)
rows, cols, k = 2000, 1000, 32
dense = np.where(rng.random((rows, cols)) < 0.05, rng.standard_normal((rows, cols)), 0)
r, c = np.nonzero(dense)
data, indptr, indices = dense[r, c], np.searchsorted(r, np.arange(rows + 1)).astype(np.int32), \
    c.astype(np.int32)
rhs = rng.standard_normal((cols, k))
program = pjrt.compile(_direct_program(rows, cols, k, len(data), "f64", "i32"), client=client)
cpu_sparse.set_max_threads(4)
expected = np.asarray(program(data, indptr, indices, rhs))
assert cpu_sparse._threads_started() == 3
# A child forked after threaded products finds the kernel's state usable (no product's
# thread writes after its call, and calls share no lock) and sets and reads it.
pid = os.fork()
if pid == 0:
    cpu_sparse.set_max_threads(2)
    os._exit(0 if cpu_sparse.max_threads() == 2 else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert cpu_sparse.max_threads() == 4
np.testing.assert_array_equal(np.asarray(program(data, indptr, indices, rhs)), expected)
# The process exits while another thread runs threaded products.
def forever():
    while True:
        program(data, indptr, indices, rhs)
threading.Thread(target=forever, daemon=True).start()
print("exiting", flush=True)
"""


def test_fork_and_exit_around_threaded_products(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "fork_and_exit.py"
    script.write_text(FORK_AND_EXIT)
    done = subprocess.run([sys.executable, str(script), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr[-2000:]
