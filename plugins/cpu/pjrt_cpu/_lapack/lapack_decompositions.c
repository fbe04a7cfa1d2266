/*
 * lapack_decompositions.c -- the kernels behind jax's matrix decompositions:
 * singular values (gesdd, gesvd), the eigendecompositions of symmetric or
 * Hermitian (syevd/heevd) and general (geev) matrices, the Schur form (gees),
 * and the Hessenberg (gehrd) and tridiagonal (sytrd/hetrd) reductions.
 *
 * They share more than the factorizations do: several results per call,
 * real-valued results (singular values, eigenvalues, tridiagonals) of a
 * complex matrix, and real and complex spellings of a routine that take
 * different workspaces.
 */
#include <complex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lapack_common.h"

/* One call of gesvd or gesdd, in its real or complex spelling: the workspace
   query (NULL matrices, lwork = -1) and each batch entry's computation alike.
   jobz is both of gesvd's jobu and jobvt; gesvd takes no iwork, and the real
   routines no rwork. */
static void call_svd(void* fn, int use_gesvd, int cplx, char* jobz, lapack_int* m, lapack_int* n,
                     void* a, lapack_int* lda, void* s, void* u, lapack_int* ldu, void* vt,
                     lapack_int* ldvt, void* work, lapack_int* lwork, void* rwork, void* iwork,
                     lapack_int* info) {
  if (use_gesvd && cplx) {
    ((gesvd_cplx_fn*)fn)(jobz, jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, rwork, info);
  } else if (use_gesvd) {
    ((gesvd_real_fn*)fn)(jobz, jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, info);
  } else if (cplx) {
    ((gesdd_cplx_fn*)fn)(jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, rwork, iwork,
                         info);
  } else {
    ((gesdd_real_fn*)fn)(jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, iwork, info);
  }
}

/* SVD (gesdd, divide and conquer, or gesvd, QR iteration):
   [x] -> [x_out, s, u, vt, info]; attribute mode ('A', 'S' or 'N'). */
static const signature SVD = {
    1, 5, {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_REAL, "s"}, {RESULT(4), E_S32, "info"}}};

XLA_FFI_Error* lk_svd_kernel(call* c, int t, int use_gesvd) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &SVD));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *s = ret(c, 1), *u = ret(c, 2),
                 *vt = ret(c, 3), *info = ret(c, 4);
  char mode;
  CHECK(lk_byte_attr(c, "mode", &mode));
  if (mode != 'A' && mode != 'S' && mode != 'N') {
    return lk_fail(c, XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "SVD computation mode %s is not supported", mode == 'O' ? "O" : "?");
  }
  int64_t batch, ub, vb;
  lapack_int m, n, u_rows, u_cols, vt_rows, vt_cols;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  CHECK(lk_split_matrix(c, u, "u", &ub, &u_rows, &u_cols));
  CHECK(lk_split_matrix(c, vt, "vt", &vb, &vt_rows, &vt_cols));
  void* fn = lk_routine(c, use_gesvd ? R_GESVD : R_GESDD, t, &error);
  if (fn == NULL) return error;
  int cplx = ti->is_complex;
  lapack_int lda = imax(m, 1), ldu = imax(m, 1), ldvt = imax(vt_rows, 1);
  lapack_int mn = imin(m, n), mx = imax(m, n), lwork = -1, qinfo = 0;
  any_elem query = {0};
  char jobz = mode;
  call_svd(fn, use_gesvd, cplx, &jobz, &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, &query,
           &lwork, NULL, NULL, &qinfo);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  int64_t rwork_size = 0;
  if (cplx) {
    if (use_gesvd) {
      rwork_size = 5 * (int64_t)mn;
    } else if (mode == 'N') {
      rwork_size = 7 * (int64_t)mn;
    } else {
      int64_t a1 = 5 * (int64_t)mn * mn + 5 * (int64_t)mn;
      int64_t a2 = 2 * (int64_t)mx * mn + 2 * (int64_t)mn * mn + mn;
      rwork_size = a1 > a2 ? a1 : a2;
    }
  }
  void* work = lk_scratch(c, lwork, ti->size, &error);
  void* iwork = work ? lk_scratch(c, 8 * (int64_t)mn, sizeof(lapack_int), &error) : NULL;
  void* rwork = (iwork && cplx) ? lk_scratch(c, rwork_size, real_size(t), &error) : NULL;
  if (work == NULL || iwork == NULL || (cplx && rwork == NULL)) {
    free(work);
    free(iwork);
    free(rwork);
    return error;
  }
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* sp = s->data;
  char* up = u->data;
  char* vp = vt->data;
  lapack_int* inf = info->data;
  int64_t s_step = last_dim(s);
  for (int64_t b = 0; b < batch; ++b) {
    call_svd(fn, use_gesvd, cplx, &jobz, &m, &n, a, &lda, sp, up, &ldu, vp, &ldvt, work, &lwork,
             rwork, iwork, &inf[b]);
    a = STEP(a, (int64_t)m * n, ti->size);
    sp = STEP(sp, s_step, real_size(t));
    up = STEP(up, (int64_t)u_rows * u_cols, ti->size);
    vp = STEP(vp, (int64_t)vt_rows * vt_cols, ti->size);
  }
  free(work);
  free(iwork);
  free(rwork);
  return NULL;
}

/* Symmetric/Hermitian eigendecomposition (divide and conquer):
   [x] -> [x_out (eigenvectors), w, info]; attributes mode ('V'/'N'), uplo.
   Workspace sizes are LAPACK's documented minimums, as jax uses. */
static const signature SYEVD = {
    1, 3,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_REAL, "eigenvalues"}, {RESULT(2), E_S32, "info"}}};

XLA_FFI_Error* lk_syevd_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &SYEVD));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *w = ret(c, 1), *info = ret(c, 2);
  char mode, uplo;
  CHECK(lk_byte_attr(c, "mode", &mode));
  CHECK(lk_byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int rows, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = lk_routine(c, R_SYEVD, t, &error);
  if (fn == NULL) return error;
  int vectors = mode == 'V';
  int64_t nn = n;
  int64_t lwork64, lrwork64 = 0, liwork64 = vectors ? 3 + 5 * nn : 1;
  if (ti->is_complex) {
    lwork64 = vectors ? 2 * nn + nn * nn : nn + 1;
    lrwork64 = vectors ? 1 + 5 * nn + 2 * nn * nn : (nn > 1 ? nn : 1);
  } else {
    lwork64 = vectors ? 1 + 6 * nn + 2 * nn * nn : 2 * nn + 1;
  }
  lapack_int lwork, lrwork = 0, liwork;
  CHECK(lk_checked_int(c, lwork64, &lwork));
  CHECK(lk_checked_int(c, lrwork64, &lrwork));
  CHECK(lk_checked_int(c, liwork64, &liwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  void* iwork = work ? lk_scratch(c, liwork, sizeof(lapack_int), &error) : NULL;
  void* rwork = (iwork && ti->is_complex) ? lk_scratch(c, lrwork, real_size(t), &error) : NULL;
  if (work == NULL || iwork == NULL || (ti->is_complex && rwork == NULL)) {
    free(work);
    free(iwork);
    free(rwork);
    return error;
  }
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* wp = w->data;
  lapack_int* inf = info->data;
  lapack_int lda = imax(n, 1);
  for (int64_t b = 0; b < batch; ++b) {
    if (ti->is_complex) {
      ((heevd_fn*)fn)(&mode, &uplo, &n, a, &lda, wp, work, &lwork, rwork, &lrwork, iwork,
                      &liwork, &inf[b]);
    } else {
      ((syevd_fn*)fn)(&mode, &uplo, &n, a, &lda, wp, work, &lwork, iwork, &liwork, &inf[b]);
    }
    a = STEP(a, nn * nn, ti->size);
    wp = STEP(wp, n, real_size(t));
  }
  free(work);
  free(iwork);
  free(rwork);
  return NULL;
}

static int all_finite(const void* data, int64_t count, int t) {
  switch (t) {
    case T_S: case T_C: {
      const float* p = data;
      int64_t k = count * (t == T_C ? 2 : 1);
      for (int64_t i = 0; i < k; ++i) if (!isfinite(p[i])) return 0;
      return 1;
    }
    default: {
      const double* p = data;
      int64_t k = count * (t == T_Z ? 2 : 1);
      for (int64_t i = 0; i < k; ++i) if (!isfinite(p[i])) return 0;
      return 1;
    }
  }
}

/* Real geev returns a complex-conjugate pair of eigenvectors as two real
   columns (re, im); spell them out as complex columns, as jax does. */
static void unpack_eigenvectors(int t, lapack_int n, const void* wi, const void* packed,
                                void* unpacked) {
  int64_t nn = n;
  if (t == T_S) {
    const float* im = wi;
    const float* v = packed;
    float complex* out = unpacked;
    for (int64_t j = 0; j < nn;) {
      if (im[j] == 0.0f || isnan(im[j]) || j + 1 == nn) {
        for (int64_t k = 0; k < nn; ++k) out[j * nn + k] = v[j * nn + k];
        j += 1;
      } else {
        for (int64_t k = 0; k < nn; ++k) {
          float re = v[j * nn + k], img = v[(j + 1) * nn + k];
          out[j * nn + k] = re + img * I;
          out[(j + 1) * nn + k] = re - img * I;
        }
        j += 2;
      }
    }
  } else {
    const double* im = wi;
    const double* v = packed;
    double complex* out = unpacked;
    for (int64_t j = 0; j < nn;) {
      if (im[j] == 0.0 || isnan(im[j]) || j + 1 == nn) {
        for (int64_t k = 0; k < nn; ++k) out[j * nn + k] = v[j * nn + k];
        j += 1;
      } else {
        for (int64_t k = 0; k < nn; ++k) {
          double re = v[j * nn + k], img = v[(j + 1) * nn + k];
          out[j * nn + k] = re + img * I;
          out[(j + 1) * nn + k] = re - img * I;
        }
        j += 2;
      }
    }
  }
}

/* General eigendecomposition. Real types: [x] -> [wr, wi, vl, vr, info] with
   complex vl/vr; complex types: [x] -> [w, vl, vr, info]. Attributes
   compute_left/compute_right ('V'/'N'). A matrix with a NaN or infinity is
   not handed to LAPACK; its info is -4, as in jax. */
static const signature GEEV_REAL = {
    1, 5,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(2), E_CPLX, "left eigenvectors"},
     {RESULT(3), E_CPLX, "right eigenvectors"}, {RESULT(4), E_S32, "info"}}};
static const signature GEEV_COMPLEX = {
    1, 4,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_CPLX, "left eigenvectors"},
     {RESULT(2), E_CPLX, "right eigenvectors"}, {RESULT(3), E_S32, "info"}}};

XLA_FFI_Error* lk_geev_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  int cplx = ti->is_complex;
  CHECK(lk_expect_signature(c, t, cplx ? &GEEV_COMPLEX : &GEEV_REAL));
  XLA_FFI_Buffer* x = arg(c, 0);
  XLA_FFI_Buffer *wr = ret(c, 0), *wi = cplx ? NULL : ret(c, 1);
  XLA_FFI_Buffer *vl = ret(c, cplx ? 1 : 2), *vr = ret(c, cplx ? 2 : 3),
                 *info = ret(c, cplx ? 3 : 4);
  char jobvl, jobvr;
  CHECK(lk_byte_attr(c, "compute_left", &jobvl));
  CHECK(lk_byte_attr(c, "compute_right", &jobvr));
  int64_t batch;
  lapack_int rows, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = lk_routine(c, R_GEEV, t, &error);
  if (fn == NULL) return error;
  int64_t nn = n;
  lapack_int ld = imax(n, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  /* Complex types: extra1 is rwork (2n reals), which the workspace query may
     already touch. Real types: extra1/extra2 receive the packed real left and
     right eigenvectors before they are spelled out as complex columns. */
  void* extra1 = lk_scratch(c, cplx ? 2 * nn : nn * nn, cplx ? real_size(t) : ti->size, &error);
  if (extra1 == NULL) return error;
  if (cplx) {
    ((geev_cplx_fn*)fn)(&jobvl, &jobvr, &n, NULL, &ld, NULL, NULL, &ld, NULL, &ld, &query,
                        &lwork, extra1, &qinfo);
  } else {
    ((geev_real_fn*)fn)(&jobvl, &jobvr, &n, NULL, &ld, NULL, NULL, NULL, &ld, NULL, &ld, &query,
                        &lwork, &qinfo);
  }
  error = lk_checked_int(c, lk_work_size_from(&query, t), &lwork);
  void* work = error ? NULL : lk_scratch(c, lwork, ti->size, &error);
  void* a = work ? lk_scratch(c, nn * nn, ti->size, &error) : NULL;
  void* extra2 = (a && !cplx) ? lk_scratch(c, nn * nn, ti->size, &error) : NULL;
  if (work == NULL || a == NULL || (!cplx && extra2 == NULL)) {
    free(work);
    free(a);
    free(extra1);
    free(extra2);
    return error;
  }
  const char* xp = x->data;
  char* wrp = wr->data;
  char* wip = wi ? wi->data : NULL;
  char* vlp = vl->data;
  char* vrp = vr->data;
  lapack_int* inf = info->data;
  size_t csize = LK_TYPES[cplx ? t : t + 2].size; /* complex element of the same precision */
  for (int64_t b = 0; b < batch; ++b) {
    memcpy(a, xp, (size_t)(nn * nn) * ti->size);
    if (!all_finite(a, nn * nn, t)) {
      inf[b] = -4;
    } else if (cplx) {
      ((geev_cplx_fn*)fn)(&jobvl, &jobvr, &n, a, &ld, wrp, vlp, &ld, vrp, &ld, work, &lwork,
                          extra1, &inf[b]);
    } else {
      ((geev_real_fn*)fn)(&jobvl, &jobvr, &n, a, &ld, wrp, wip, extra1, &ld, extra2, &ld, work,
                          &lwork, &inf[b]);
      if (inf[b] == 0) {
        if (jobvl == 'V') unpack_eigenvectors(t, n, wip, extra1, vlp);
        if (jobvr == 'V') unpack_eigenvectors(t, n, wip, extra2, vrp);
      }
    }
    if (jobvl != 'V') memset(vlp, 0, (size_t)(nn * nn) * csize);
    if (jobvr != 'V') memset(vrp, 0, (size_t)(nn * nn) * csize);
    xp += (size_t)(nn * nn) * ti->size;
    wrp = STEP(wrp, nn, ti->size);
    if (wip) wip = STEP(wip, nn, ti->size);
    vlp = STEP(vlp, nn * nn, csize);
    vrp = STEP(vrp, nn * nn, csize);
  }
  free(work);
  free(a);
  free(extra1);
  free(extra2);
  return NULL;
}

/* Schur decomposition. Real types: [x] -> [t, vs, wr, wi, sdim, info];
   complex types: [x] -> [t, vs, w, sdim, info]. Attributes mode ('V'/'N')
   and sort (only 'N': jax passes no selection function). */
static const signature GEES_REAL = {
    1, 6,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(4), E_S32, "sdim"}, {RESULT(5), E_S32, "info"}}};
static const signature GEES_COMPLEX = {
    1, 5,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(3), E_S32, "sdim"}, {RESULT(4), E_S32, "info"}}};

XLA_FFI_Error* lk_gees_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  int cplx = ti->is_complex;
  CHECK(lk_expect_signature(c, t, cplx ? &GEES_COMPLEX : &GEES_REAL));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *vs = ret(c, 1), *wr = ret(c, 2);
  XLA_FFI_Buffer* wi = cplx ? NULL : ret(c, 3);
  XLA_FFI_Buffer *sdim = ret(c, cplx ? 3 : 4), *info = ret(c, cplx ? 4 : 5);
  char mode, sort;
  CHECK(lk_byte_attr(c, "mode", &mode));
  CHECK(lk_byte_attr(c, "sort", &sort));
  if (sort != 'N') {
    return lk_fail(c, XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "ordering eigenvalues on the diagonal is not implemented%s", "");
  }
  int64_t batch;
  lapack_int rows, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = lk_routine(c, R_GEES, t, &error);
  if (fn == NULL) return error;
  int64_t nn = n;
  lapack_int ld = imax(n, 1), lwork = -1, qinfo = 0, qsdim = 0;
  any_elem query = {0};
  if (cplx) {
    ((gees_cplx_fn*)fn)(&mode, &sort, NULL, &n, NULL, &ld, &qsdim, NULL, NULL, &ld, &query,
                        &lwork, NULL, NULL, &qinfo);
  } else {
    ((gees_real_fn*)fn)(&mode, &sort, NULL, &n, NULL, &ld, &qsdim, NULL, NULL, NULL, &ld, &query,
                        &lwork, NULL, &qinfo);
  }
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  void* rwork = (work && cplx) ? lk_scratch(c, nn, real_size(t), &error) : NULL;
  if (work == NULL || (cplx && rwork == NULL)) {
    free(work);
    free(rwork);
    return error;
  }
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* vsp = vs->data;
  char* wrp = wr->data;
  char* wip = wi ? wi->data : NULL;
  lapack_int* sd = sdim->data;
  lapack_int* inf = info->data;
  for (int64_t b = 0; b < batch; ++b) {
    if (cplx) {
      ((gees_cplx_fn*)fn)(&mode, &sort, NULL, &n, a, &ld, &sd[b], wrp, vsp, &ld, work, &lwork,
                          rwork, NULL, &inf[b]);
    } else {
      ((gees_real_fn*)fn)(&mode, &sort, NULL, &n, a, &ld, &sd[b], wrp, wip, vsp, &ld, work,
                          &lwork, NULL, &inf[b]);
    }
    a = STEP(a, nn * nn, ti->size);
    vsp = STEP(vsp, nn * nn, ti->size);
    wrp = STEP(wrp, nn, ti->size);
    if (wip) wip = STEP(wip, nn, ti->size);
  }
  free(work);
  free(rwork);
  return NULL;
}

/* Hessenberg reduction: [x] -> [x_out, tau, info]; attributes low, high
   (LAPACK's ilo/ihi, 1-based). */
static const signature GEHRD = {
    1, 3, {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_ELEM, "tau"}, {RESULT(2), E_S32, "info"}}};

XLA_FFI_Error* lk_gehrd_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &GEHRD));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *tau = ret(c, 1), *info = ret(c, 2);
  lapack_int low, high;
  CHECK(lk_int_attr(c, "low", &low));
  CHECK(lk_int_attr(c, "high", &high));
  int64_t batch;
  lapack_int m, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  gehrd_fn* fn = (gehrd_fn*)lk_routine(c, R_GEHRD, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  fn(&n, &low, &high, NULL, &lda, NULL, &query, &lwork, &qinfo);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* tp = tau->data;
  lapack_int* inf = info->data;
  int64_t tau_step = last_dim(tau);
  for (int64_t b = 0; b < batch; ++b) {
    fn(&n, &low, &high, a, &lda, tp, work, &lwork, &inf[b]);
    a = STEP(a, (int64_t)m * n, ti->size);
    tp = STEP(tp, tau_step, ti->size);
  }
  free(work);
  return NULL;
}

/* Tridiagonal reduction of a symmetric/Hermitian matrix:
   [x] -> [x_out, d, e, tau, info]; attribute uplo. */
static const signature SYTRD = {
    1, 5,
    {{OPERAND(0), E_ELEM, "x"}, {RESULT(1), E_REAL, "diagonal"},
     {RESULT(2), E_REAL, "off-diagonal"}, {RESULT(3), E_ELEM, "tau"}, {RESULT(4), E_S32, "info"}}};

XLA_FFI_Error* lk_sytrd_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &SYTRD));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *d = ret(c, 1), *e = ret(c, 2),
                 *tau = ret(c, 3), *info = ret(c, 4);
  char uplo;
  CHECK(lk_byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int m, n;
  CHECK(lk_split_matrix(c, x, "x", &batch, &m, &n));
  sytrd_fn* fn = (sytrd_fn*)lk_routine(c, R_SYTRD, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  fn(&uplo, &n, NULL, &lda, NULL, NULL, NULL, &query, &lwork, &qinfo);
  CHECK(lk_checked_int(c, lk_work_size_from(&query, t), &lwork));
  void* work = lk_scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  lk_copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* dp = d->data;
  char* ep = e->data;
  char* tp = tau->data;
  lapack_int* inf = info->data;
  int64_t d_step = last_dim(d), e_step = last_dim(e), tau_step = last_dim(tau);
  for (int64_t b = 0; b < batch; ++b) {
    fn(&uplo, &n, a, &lda, dp, ep, tp, work, &lwork, &inf[b]);
    a = STEP(a, (int64_t)m * n, ti->size);
    dp = STEP(dp, d_step, real_size(t));
    ep = STEP(ep, e_step, real_size(t));
    tp = STEP(tp, tau_step, ti->size);
  }
  free(work);
  return NULL;
}
