/*
 * lapack_tridiagonal.c -- the tridiagonal solvers: LAPACK's gtsv
 * (lapack_<t>gtsv_ffi, jax's lax.linalg.tridiagonal_solve), and
 * tridiagonal_solve_perturbed_ffi, the variant that perturbs tiny pivots
 * instead of failing, which jaxlib implements in its own C++ and this file in
 * C (one target for all four types; the description is above the solver).
 */
#include <complex.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "lapack_common.h"

/* General tridiagonal solve: [dl, d, du, b] -> [dl_out, d_out, du_out, b_out,
   info]. jax's dl starts with a padding element (dl[0] = 0) and du ends with
   one, so LAPACK's sub-diagonal starts at dl + 1. */
static const signature GTSV = {
    4, 5,
    {{OPERAND(0), E_ELEM, "dl"}, {OPERAND(1), E_ELEM, "d"}, {OPERAND(2), E_ELEM, "du"},
     {OPERAND(3), E_ELEM, "b"}, {RESULT(4), E_S32, "info"}}};

XLA_FFI_Error* lk_gtsv_kernel(call* c, int t) {
  const type_info* ti = &LK_TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(lk_expect_signature(c, t, &GTSV));
  XLA_FFI_Buffer *dl = arg(c, 0), *d = arg(c, 1), *du = arg(c, 2), *bm = arg(c, 3);
  XLA_FFI_Buffer *dl_out = ret(c, 0), *d_out = ret(c, 1), *du_out = ret(c, 2),
                 *b_out = ret(c, 3), *info = ret(c, 4);
  int64_t batch;
  lapack_int m, nrhs;
  CHECK(lk_split_matrix(c, bm, "b", &batch, &m, &nrhs));
  gtsv_fn* fn = (gtsv_fn*)lk_routine(c, R_GTSV, t, &error);
  if (fn == NULL) return error;
  lk_copy_if_different(dl, dl_out, ti->size);
  lk_copy_if_different(d, d_out, ti->size);
  lk_copy_if_different(du, du_out, ti->size);
  lk_copy_if_different(bm, b_out, ti->size);
  char* dlp = dl_out->data;
  char* dp = d_out->data;
  char* dup = du_out->data;
  char* bp = b_out->data;
  lapack_int* inf = info->data;
  lapack_int ldb = imax(m, 1);
  for (int64_t b = 0; b < batch; ++b) {
    if (m > 0) {
      fn(&m, &nrhs, STEP(dlp, 1, ti->size), dp, dup, bp, &ldb, &inf[b]);
    } else {
      inf[b] = 0;
    }
    dlp = STEP(dlp, m, ti->size);
    dp = STEP(dp, m, ti->size);
    dup = STEP(dup, m, ti->size);
    bp = STEP(bp, (int64_t)m * nrhs, ti->size);
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Tridiagonal solve with perturbed pivots (not a LAPACK routine)           */
/* ------------------------------------------------------------------------ */

/* tridiagonal_solve_perturbed_ffi: jax's lowering of
   lax.linalg.tridiagonal_solve(..., perturb_singular=True), which
   jax.scipy.linalg.eigh_tridiagonal uses for inverse iteration. One target for
   every type (the handler looks at the element type): [dl, d, du, b] -> [x],
   no attributes, no info. dl, d and du are [..., n] (dl[0] and du[n-1] are
   padding), b and x are [..., n, nrhs] column-major matrices.

   The matrix may be numerically singular (T - lambda I with lambda an
   eigenvalue), so this is Gaussian elimination with partial pivoting in the
   manner of LAPACK's xLAGTF/xLAGTS, not xGTSV: row k+1 is swapped up when its
   sub-diagonal entry, relative to the row's 1-norm, beats the current pivot
   relative to its row's; the forward substitution is done during the
   elimination; U (diagonal and two super-diagonals) is kept in scratch. In the
   back substitution a pivot of magnitude below 1 that would make x overflow
   (or that is zero) is moved away from zero, in the direction of its real
   part's sign, by steps starting at eps * max|U| and doubling (xLAGTS's
   JOB = -1 rule); a pivot below the safe minimum whose row is small enough is
   instead scaled up together with the row. Rows of x are then multiplied by
   the pivot's reciprocal. */

/* std::max's rule (the first argument unless the second is larger), NaNs and
   all, so that the perturbation matches jaxlib's for the same input. */
#define TSP_MAX(a, b) ((a) < (b) ? (b) : (a))

/* Complex quotients by Smith's algorithm, in the working precision: what
   jaxlib's kernel gets from its compiler, so the rounding noise that becomes
   the eigenvector's phase in inverse iteration is the same. (C's own complex
   division may call libgcc's __divsc3, which works in double for complex64.) */
#define DEFINE_SMITH_DIVIDE(SUFFIX, T, R, FABS)                                                \
  static T tsp_div_##SUFFIX(T a, T b) {                                                        \
    union { T c; R p[2]; } x, y, q;                                                            \
    x.c = a;                                                                                   \
    y.c = b;                                                                                   \
    if (FABS(y.p[0]) >= FABS(y.p[1])) {                                                        \
      R ratio = y.p[1] / y.p[0];                                                               \
      R denominator = y.p[0] + y.p[1] * ratio;                                                 \
      q.p[0] = (x.p[0] + x.p[1] * ratio) / denominator;                                        \
      q.p[1] = (x.p[1] - x.p[0] * ratio) / denominator;                                        \
    } else {                                                                                   \
      R ratio = y.p[0] / y.p[1];                                                               \
      R denominator = y.p[1] + y.p[0] * ratio;                                                 \
      q.p[0] = (x.p[0] * ratio + x.p[1]) / denominator;                                        \
      q.p[1] = (x.p[1] * ratio - x.p[0]) / denominator;                                        \
    }                                                                                          \
    return q.c;                                                                                \
  }
DEFINE_SMITH_DIVIDE(c, float complex, float, fabsf)
DEFINE_SMITH_DIVIDE(z, double complex, double, fabs)
static float tsp_div_s(float a, float b) { return a / b; }
static double tsp_div_d(double a, double b) { return a / b; }

#define DEFINE_PERTURBED_SOLVE(SUFFIX, T, R, ABS, RE, COPYSIGN, EPSILON, TINY, HUGE_)          \
  static void tsp_guard_##SUFFIX(R perturb, T* pivot, T* row, lapack_int nrhs) {               \
    const R one = 1;                                                                           \
    const R small = one / (HUGE_);                                                             \
    const R safemin = small < (TINY) ? (TINY) : small * (one + (EPSILON));                     \
    const R bignum = one / safemin;                                                            \
    R size = ABS(*pivot);                                                                      \
    if (size >= one) return;                                                                   \
    R step = COPYSIGN(TSP_MAX((R)fabs((double)perturb), safemin), RE(*pivot));                 \
    R largest = 0;                                                                             \
    for (lapack_int j = 0; j < nrhs; ++j) {                                                    \
      R a = ABS(row[j]);                                                                       \
      if (j == 0 || largest < a || a != a) largest = a;                                        \
    }                                                                                          \
    int done = 0;                                                                              \
    while (size < one && !done) {                                                              \
      if (size < safemin) {                                                                    \
        if (size == 0 || largest * safemin > size) {                                           \
          *pivot += step;                                                                      \
          step *= 2;                                                                           \
        } else {                                                                               \
          *pivot *= bignum;                                                                    \
          for (lapack_int j = 0; j < nrhs; ++j) row[j] *= bignum;                              \
          done = 1;                                                                            \
        }                                                                                      \
      } else if (largest > size * bignum) {                                                    \
        *pivot += step;                                                                        \
        step *= 2;                                                                             \
      } else {                                                                                 \
        done = 1;                                                                              \
      }                                                                                        \
      size = ABS(*pivot);                                                                      \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* x: on entry the right-hand sides, on exit the solution (n x nrhs, column-major).      */  \
  /* u: 3n scratch elements; row: nrhs scratch elements.                                   */  \
  static void tsp_solve_##SUFFIX(lapack_int n, lapack_int nrhs, const T* dl, const T* d,       \
                                 const T* du, T* x, T* u, T* row) {                            \
    if (n <= 0) return;                                                                        \
    const R eps = (EPSILON);                                                                   \
    if (n == 1) {                                                                              \
      T p = d[0];                                                                              \
      for (lapack_int j = 0; j < nrhs; ++j) row[j] = x[(int64_t)j * n];                        \
      tsp_guard_##SUFFIX(eps * ABS(p), &p, row, nrhs);                                         \
      for (lapack_int j = 0; j < nrhs; ++j) {                                                  \
        x[(int64_t)j * n] = tsp_div_##SUFFIX(row[j], p);                                       \
      }                                                                                        \
      return;                                                                                  \
    }                                                                                          \
    T* u0 = u; /* U's diagonal */                                                              \
    T* u1 = u + n; /* first super-diagonal */                                                  \
    T* u2 = u + 2 * (int64_t)n; /* second super-diagonal (from row swaps) */                   \
    for (int64_t i = 0; i < 3 * (int64_t)n; ++i) u[i] = 0;                                     \
    u0[0] = d[0];                                                                              \
    u1[0] = du[0];                                                                             \
    R max_u = TSP_MAX(ABS(u0[0]), ABS(u1[0]));                                                 \
    R norm_k = ABS(u0[0]) + ABS(u1[0]); /* 1-norm of the pivot row's U part */                 \
    for (lapack_int k = 0; k + 1 < n; ++k) {                                                   \
      const int has_super = k + 2 < n;                                                         \
      u0[k + 1] = d[k + 1];                                                                    \
      R norm_next = ABS(dl[k + 1]) + ABS(d[k + 1]);                                            \
      if (has_super) norm_next += ABS(du[k + 1]);                                              \
      if (dl[k + 1] == 0) {                                                                    \
        /* Nothing to eliminate below the pivot. */                                            \
        norm_k = norm_next;                                                                    \
        u1[k + 1] = du[k + 1];                                                                 \
        u2[k] = 0;                                                                             \
      } else {                                                                                 \
        R rel_pivot = u0[k] == 0 ? 0 : ABS(u0[k]) / norm_k;                                    \
        R rel_sub = ABS(dl[k + 1]) / norm_next;                                                \
        if (rel_sub <= rel_pivot) {                                                            \
          /* Keep row k as the pivot row; eliminate dl[k+1]. */                                \
          norm_k = norm_next;                                                                  \
          T m = tsp_div_##SUFFIX(dl[k + 1], u0[k]);                                            \
          u0[k + 1] -= m * u1[k];                                                              \
          u1[k + 1] = du[k + 1];                                                               \
          u2[k] = 0;                                                                           \
          for (lapack_int j = 0; j < nrhs; ++j) {                                              \
            T* col = x + (int64_t)j * n;                                                       \
            col[k + 1] = col[k + 1] - m * col[k];                                              \
          }                                                                                    \
        } else {                                                                               \
          /* Row k+1 becomes the pivot row; eliminate what row k had left. */                  \
          T m = tsp_div_##SUFFIX(u0[k], dl[k + 1]);                                            \
          T old_super = u1[k];                                                                 \
          u0[k] = dl[k + 1];                                                                   \
          u0[k + 1] = old_super - m * d[k + 1];                                                \
          u1[k] = d[k + 1];                                                                    \
          if (has_super) {                                                                     \
            u2[k] = du[k + 1];                                                                 \
            u1[k + 1] = -m * du[k + 1];                                                        \
          }                                                                                    \
          for (lapack_int j = 0; j < nrhs; ++j) {                                              \
            T* col = x + (int64_t)j * n;                                                       \
            T below = col[k + 1];                                                              \
            col[k + 1] = col[k] - m * below;                                                   \
            col[k] = below;                                                                    \
          }                                                                                    \
          norm_k = ABS(u0[k + 1]) + ABS(u1[k + 1]);                                            \
        }                                                                                      \
      }                                                                                        \
      /* Row n-2 of U is left out of max|U|, as in jaxlib. */                                  \
      if (has_super) {                                                                         \
        max_u = TSP_MAX(max_u, ABS(u0[k]));                                                    \
        max_u = TSP_MAX(max_u, ABS(u1[k]));                                                    \
        max_u = TSP_MAX(max_u, ABS(u2[k]));                                                    \
      }                                                                                        \
    }                                                                                          \
    max_u = TSP_MAX(max_u, ABS(u0[n - 1]));                                                    \
    const R perturb = eps * max_u;                                                             \
    for (lapack_int k = n - 1; k >= 0; --k) {                                                  \
      for (lapack_int j = 0; j < nrhs; ++j) {                                                  \
        const T* col = x + (int64_t)j * n;                                                     \
        T v = col[k];                                                                          \
        if (k + 1 < n) v = v - u1[k] * col[k + 1];                                             \
        if (k + 2 < n) v = v - u2[k] * col[k + 2];                                             \
        row[j] = v;                                                                            \
      }                                                                                        \
      T p = u0[k];                                                                             \
      tsp_guard_##SUFFIX(perturb, &p, row, nrhs);                                              \
      const T inverse = tsp_div_##SUFFIX((T)1, p);                                             \
      for (lapack_int j = 0; j < nrhs; ++j) x[(int64_t)j * n + k] = row[j] * inverse;          \
    }                                                                                          \
  }

#define TSP_IDENTITY(v) (v)
DEFINE_PERTURBED_SOLVE(s, float, float, fabsf, TSP_IDENTITY, copysignf, FLT_EPSILON, FLT_MIN,
                       FLT_MAX)
DEFINE_PERTURBED_SOLVE(d, double, double, fabs, TSP_IDENTITY, copysign, DBL_EPSILON, DBL_MIN,
                       DBL_MAX)
DEFINE_PERTURBED_SOLVE(c, float complex, float, cabsf, crealf, copysignf, FLT_EPSILON, FLT_MIN,
                       FLT_MAX)
DEFINE_PERTURBED_SOLVE(z, double complex, double, cabs, creal, copysign, DBL_EPSILON, DBL_MIN,
                       DBL_MAX)

typedef void tsp_solve_fn(lapack_int, lapack_int, const void*, const void*, const void*, void*,
                          void*, void*);

/* The buffers that must have the type d's element type picked (checked after
   the counts, which lk_expect_signature then checks again, harmlessly). */
static const signature TRIDIAGONAL_SOLVE_PERTURBED = {
    4, 1,
    {{OPERAND(0), E_ELEM, "dl"}, {OPERAND(2), E_ELEM, "du"}, {OPERAND(3), E_ELEM, "b"},
     {RESULT(0), E_ELEM, "the result"}}};

XLA_FFI_Error* lk_tridiagonal_solve_perturbed_kernel(call* c) {
  CHECK(lk_expect_counts(c, 4, 1));
  XLA_FFI_Buffer *dl = arg(c, 0), *d = arg(c, 1), *du = arg(c, 2), *bm = arg(c, 3);
  XLA_FFI_Buffer* x = ret(c, 0);
  int t;
  switch (d->dtype) {
    case XLA_FFI_DataType_F32: t = T_S; break;
    case XLA_FFI_DataType_F64: t = T_D; break;
    case XLA_FFI_DataType_C64: t = T_C; break;
    case XLA_FFI_DataType_C128: t = T_Z; break;
    default:
      return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     "unsupported element type%s (float32, float64, complex64 or "
                     "complex128)", "");
  }
  static tsp_solve_fn* const SOLVERS[NUM_TYPES] = {
      (tsp_solve_fn*)tsp_solve_s, (tsp_solve_fn*)tsp_solve_d,
      (tsp_solve_fn*)tsp_solve_c, (tsp_solve_fn*)tsp_solve_z};
  const type_info* ti = &LK_TYPES[t];
  CHECK(lk_expect_signature(c, t, &TRIDIAGONAL_SOLVE_PERTURBED));
  int64_t batch;
  lapack_int n, nrhs;
  CHECK(lk_split_matrix(c, bm, "b", &batch, &n, &nrhs));
  if (lk_elements(dl) != batch * n || lk_elements(d) != batch * n || lk_elements(du) != batch * n) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                   "dl, d and du must have b's shape without its last dimension%s", "");
  }
  if (lk_elements(x) != lk_elements(bm)) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "the result must have b's shape%s", "");
  }
  lk_copy_if_different(bm, x, ti->size);
  if (batch == 0 || n == 0 || nrhs == 0) return NULL;
  XLA_FFI_Error* error = NULL;
  char* work = lk_scratch(c, 3 * (int64_t)n + nrhs, ti->size, &error);
  if (work == NULL) return error;
  const char *dlp = dl->data, *dp = d->data, *dup = du->data;
  char* xp = x->data;
  for (int64_t b = 0; b < batch; ++b) {
    SOLVERS[t](n, nrhs, dlp, dp, dup, xp, work, STEP(work, 3 * (int64_t)n, ti->size));
    dlp = STEP(dlp, n, ti->size);
    dp = STEP(dp, n, ti->size);
    dup = STEP(dup, n, ti->size);
    xp = STEP(xp, (int64_t)n * nrhs, ti->size);
  }
  free(work);
  return NULL;
}
