/*
 * lapack_factorizations.c -- the kernels that factor a matrix or apply a
 * factor: Cholesky (potrf), LU (getrf), QR (geqrf, and geqp3 with column
 * pivoting), Q from its reflectors (orgqr/ungqr), multiplication by Q
 * (ormqr/unmqr), and BLAS's triangular solve (trsm), which jax's
 * triangular_solve and the solves after LU and Cholesky lower to.
 *
 * Each kernel takes a batch of column-major matrices and calls the routine
 * once per batch entry (see lapack_kernels.c for the conventions).
 */
#include <stdlib.h>
#include <string.h>

#include "lapack_common.h"

/* Cholesky: operands [x]; results [x_out, info]; attribute uplo. */
static const signature POTRF = {1, 2, {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_S32, "info"}}};

XLA_FFI_Error* lk_potrf_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &POTRF));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *info = ret(c, 1);
  char uplo;
  CHECK(lk_byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int rows, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &rows, &n));
  potrf_fn* fn = (potrf_fn*)lk_routine(c, R_POTRF, t, &error);
  if (fn == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  lapack_int* inf = info->data;
  lapack_int lda = imax(n, 1);
  for (int64_t b = 0; b < batch; ++b) {
    fn(&uplo, &n, a, &lda, &inf[b]);
    a = STEP(a, (int64_t)n * n, ti->size);
  }
  return NULL;
}

/* LU with partial pivoting: [x] -> [x_out, ipiv, info]. */
static const signature GETRF = {
    1, 3,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_S32, "ipiv"}, {RESULT(2), E_S32, "info"}}};

XLA_FFI_Error* lk_getrf_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &GETRF));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *ipiv = ret(c, 1), *info = ret(c, 2);
  int64_t batch;
  lapack_int m, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  getrf_fn* fn = (getrf_fn*)lk_routine(c, R_GETRF, t, &error);
  if (fn == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  lapack_int* piv = ipiv->data;
  lapack_int* inf = info->data;
  lapack_int lda = imax(m, 1), k = imin(m, n);
  for (int64_t b = 0; b < batch; ++b) {
    fn(&m, &n, a, &lda, piv, &inf[b]);
    a = STEP(a, (int64_t)m * n, ti->size);
    piv += k;
  }
  return NULL;
}

/* Householder QR: [x] -> [x_out, tau]. */
static const signature GEQRF = {1, 2, {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_ELEM, "tau"}}};

XLA_FFI_Error* lk_geqrf_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &GEQRF));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *tau = ret(c, 1);
  int64_t batch;
  lapack_int m, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  geqrf_fn* fn = (geqrf_fn*)lk_routine(c, R_GEQRF, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&m, &n, NULL, &lda, NULL, &query, &lwork, &info);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* tp = tau->data;
  for (int64_t b = 0; b < batch; ++b) {
    fn(&m, &n, a, &lda, tp, work, &lwork, &info);
    a = STEP(a, (int64_t)m * n, ti->size);
    tp = STEP(tp, imin(m, n), ti->size);
  }
  free(work);
  return NULL;
}

/* QR with column pivoting: [x, jpvt] -> [x_out, jpvt_out, tau]. */
static const signature GEQP3 = {2, 3, {{OPERAND(0), E_ELEM, "x"}, {OPERAND(1), E_S32, "jpvt"}}};

XLA_FFI_Error* lk_geqp3_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &GEQP3));
  XLA_FFI_Buffer *x = arg(c, 0), *jpvt = arg(c, 1);
  XLA_FFI_Buffer *x_out = ret(c, 0), *jpvt_out = ret(c, 1), *tau = ret(c, 2);
  int64_t batch;
  lapack_int m, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  void* fn = lk_routine(c, R_GEQP3, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  float rquery[2];
  if (ti->is_complex) {
    ((geqp3_cplx_fn*)fn)(&m, &n, NULL, &lda, NULL, NULL, &query, &lwork, rquery, &info);
  } else {
    ((geqp3_real_fn*)fn)(&m, &n, NULL, &lda, NULL, NULL, &query, &lwork, &info);
  }
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  void* rwork = NULL;
  if (ti->is_complex) {
    rwork = lk_scratch(c, 2 * (int64_t)n, real_size(t), &error);
    if (rwork == NULL) { free(work); return error; }
  }
  lk_copy_if_different(x, x_out, ti->size);
  lk_copy_if_different(jpvt, jpvt_out, sizeof(lapack_int));
  char* a = x_out->data;
  lapack_int* piv = jpvt_out->data;
  char* tp = tau->data;
  for (int64_t b = 0; b < batch; ++b) {
    if (ti->is_complex) {
      ((geqp3_cplx_fn*)fn)(&m, &n, a, &lda, piv, tp, work, &lwork, rwork, &info);
    } else {
      ((geqp3_real_fn*)fn)(&m, &n, a, &lda, piv, tp, work, &lwork, &info);
    }
    a = STEP(a, (int64_t)m * n, ti->size);
    piv += n;
    tp = STEP(tp, imin(m, n), ti->size);
  }
  free(work);
  free(rwork);
  return NULL;
}

/* Q from Householder reflectors: [x, tau] -> [x_out]. */
static const signature ORGQR = {2, 1, {{OPERAND(0), E_ELEM, "x"}, {OPERAND(1), E_ELEM, "tau"}}};

XLA_FFI_Error* lk_orgqr_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &ORGQR));
  XLA_FFI_Buffer *x = arg(c, 0), *tau = arg(c, 1), *x_out = ret(c, 0);
  int64_t batch;
  lapack_int m, n, k;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  CHECK(lk_checked_int(c, last_dim(tau), &k));
  orgqr_fn* fn = (orgqr_fn*)lk_routine(c, R_ORGQR, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&m, &n, &k, NULL, &lda, NULL, &query, &lwork, &info);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* tp = tau->data;
  for (int64_t b = 0; b < batch; ++b) {
    fn(&m, &n, &k, a, &lda, tp, work, &lwork, &info);
    a = STEP(a, (int64_t)m * n, ti->size);
    tp = STEP(tp, k, ti->size);
  }
  free(work);
  return NULL;
}

/* Multiply by Q from reflectors: [a, tau, c] -> [c_out]; attributes left,
   transpose (transpose means the conjugate transpose for complex types). */
static const signature ORMQR = {
    3, 1,
    {{OPERAND(0), E_ELEM, "a"}, {OPERAND(1), E_ELEM, "tau"}, {OPERAND(2), E_ELEM, "c"}}};

XLA_FFI_Error* lk_ormqr_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &ORMQR));
  XLA_FFI_Buffer *a = arg(c, 0), *tau = arg(c, 1), *cm = arg(c, 2), *c_out = ret(c, 0);
  char left, transpose;
  CHECK(lk_byte_attr(c, "left", &left));
  CHECK(lk_byte_attr(c, "transpose", &transpose));
  int64_t batch, a_batch;
  lapack_int m, n, a_rows, a_cols, k;
  CHECK(lk_split_matrix(c, cm, "c", &batch, &m, &n));
  CHECK(lk_split_matrix(c, a, "a", &a_batch, &a_rows, &a_cols));
  CHECK(lk_checked_int(c, last_dim(tau), &k));
  ormqr_fn* fn = (ormqr_fn*)lk_routine(c, R_ORMQR, t, &error);
  if (fn == NULL) return error;
  char side = left ? 'L' : 'R';
  char trans = transpose ? (ti->is_complex ? 'C' : 'T') : 'N';
  lapack_int lda = imax(a_rows, 1), ldc = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&side, &trans, &m, &n, &k, NULL, &lda, NULL, NULL, &ldc, &query, &lwork, &info);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  lk_copy_if_different(cm, c_out, ti->size);
  char* ap = a->data;
  char* tp = tau->data;
  char* cp = c_out->data;
  for (int64_t b = 0; b < batch; ++b) {
    fn(&side, &trans, &m, &n, &k, ap, &lda, tp, cp, &ldc, work, &lwork, &info);
    ap = STEP(ap, (int64_t)a_rows * a_cols, ti->size);
    tp = STEP(tp, k, ti->size);
    cp = STEP(cp, (int64_t)m * n, ti->size);
  }
  free(work);
  return NULL;
}

/* Triangular solve (BLAS trsm, alpha = 1): [a, b] -> [b_out]; attributes
   side, uplo, trans_x, diag. */
static const signature TRSM = {2, 1, {{OPERAND(0), E_ELEM, "a"}, {OPERAND(1), E_ELEM, "b"}}};

XLA_FFI_Error* lk_trsm_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &TRSM));
  XLA_FFI_Buffer *a = arg(c, 0), *bm = arg(c, 1), *b_out = ret(c, 0);
  char side, uplo, trans, diag;
  CHECK(lk_byte_attr(c, "side", &side));
  CHECK(lk_byte_attr(c, "uplo", &uplo));
  CHECK(lk_byte_attr(c, "trans_x", &trans));
  CHECK(lk_byte_attr(c, "diag", &diag));
  int64_t batch, a_batch;
  lapack_int m, n, a_rows, a_cols;
  CHECK(lk_split_matrix(c, bm, "b", &batch, &m, &n));
  CHECK(lk_split_matrix(c, a, "a", &a_batch, &a_rows, &a_cols));
  trsm_fn* fn = (trsm_fn*)lk_routine(c, R_TRSM, t, &error);
  if (fn == NULL) return error;
  any_elem one;
  memset(&one, 0, sizeof(one));
  switch (t) {
    case T_S: one.f = 1.0f; break;
    case T_D: one.d = 1.0; break;
    case T_C: one.c = 1.0f; break;
    default: one.z = 1.0; break;
  }
  lapack_int lda = imax(side == 'L' ? m : n, 1), ldb = imax(m, 1);
  lk_copy_if_different(bm, b_out, ti->size);
  char* ap = a->data;
  char* bp = b_out->data;
  /* An empty system has nothing to solve, and BLAS may reject it. */
  if (m == 0 || n == 0) return NULL;
  int64_t a_step = a_batch == batch ? (int64_t)a_rows * a_cols : 0;
  for (int64_t b = 0; b < batch; ++b) {
    fn(&side, &uplo, &trans, &diag, &m, &n, &one, ap, &lda, bp, &ldb);
    ap = STEP(ap, a_step, ti->size);
    bp = STEP(bp, (int64_t)m * n, ti->size);
  }
  return NULL;
}
