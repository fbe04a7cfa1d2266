/*
 * lapack_kernels.c -- XLA FFI handlers for the CPU LAPACK custom calls that
 * jax lowers linear algebra to (lapack_<t><routine>_ffi targets, and
 * tridiagonal_solve_perturbed_ffi, which is jaxlib's own C++ rather than
 * LAPACK and is reimplemented here in C).
 *
 * XLA's standalone CPU plugin does not ship these handlers: jaxlib registers
 * its own copies in-process, which a PJRT host without jaxlib cannot use. This
 * library provides handlers with the same operands, results, attributes and
 * info conventions as jaxlib 0.10's kernels, so programs lowered by jax run
 * unchanged.
 *
 * No LAPACK is linked. pjrt_cpu takes the routines SciPy exports from
 * scipy.linalg.cython_lapack / cython_blas (PyCapsules) and hands their
 * addresses to pjrt_cpu_lapack_set(). Those are C wrappers with the Fortran
 * argument convention: every argument is passed by pointer, LAPACK integers
 * are 32-bit, and the hidden string-length arguments of character parameters
 * are not passed (the wrappers supply none; single-character options do not
 * need them).
 *
 * Layouts: jax's lowering asks XLA for column-major matrices (operand and
 * result layouts {rank-2, rank-1, rank-3, ..., 0}) for every operand/result of
 * the largest rank, so a buffer holds a batch of Fortran-ordered matrices, one
 * after another. Lower-rank buffers (pivots, taus, eigenvalues, info) keep the
 * default row-major layout, which is also one contiguous run per batch entry.
 * The handlers rely on this; the Python tests check it against numpy.
 *
 * Results aliased to operands (output_operand_aliases) may or may not share
 * memory with them; every handler copies an operand into its result first
 * when the two differ, then works in place as LAPACK does.
 *
 * The library's files, which setup.py compiles into one shared object:
 *   lapack_kernels.c         this file: the handlers XLA calls (one per
 *                            target), the table of targets, and the
 *                            functions pjrt_cpu reads it through;
 *   lapack_common.h/.c       element types, the LAPACK routines handed over
 *                            (pjrt_cpu_lapack_set) and their signatures, and
 *                            the call-frame helpers every kernel uses;
 *   lapack_factorizations.c  potrf, getrf, geqrf, geqp3, orgqr, ormqr, trsm;
 *   lapack_decompositions.c  gesdd/gesvd, syevd, geev, gees, gehrd, sytrd;
 *   lapack_tridiagonal.c     gtsv and tridiagonal_solve_perturbed;
 *   sparse_kernels.c         cpu_csr_sparse_dense_ffi, jaxlib's CPU sparse
 *                            kernel (not LAPACK: a table of its own, read by
 *                            pjrt_cpu.cpu_sparse).
 */
#include <stddef.h>

#include "lapack_common.h"

/* ------------------------------------------------------------------------ */
/* Handlers: one C function per target, as XLA identifies handlers by address */
/* ------------------------------------------------------------------------ */

static XLA_FFI_Error* dispatch(XLA_FFI_CallFrame* frame, const char* target, int r, int t) {
  if (lk_answer_metadata_query(frame)) return NULL;
  /* Only the execute stage carries data; the others have nothing to prepare. */
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  call c = {frame, target};
  switch (r) {
    case R_POTRF: return lk_potrf_kernel(&c, t);
    case R_GETRF: return lk_getrf_kernel(&c, t);
    case R_GEQRF: return lk_geqrf_kernel(&c, t);
    case R_GEQP3: return lk_geqp3_kernel(&c, t);
    case R_ORGQR: return lk_orgqr_kernel(&c, t);
    case R_ORMQR: return lk_ormqr_kernel(&c, t);
    case R_TRSM: return lk_trsm_kernel(&c, t);
    case R_GESDD: return lk_svd_kernel(&c, t, 0);
    case R_GESVD: return lk_svd_kernel(&c, t, 1);
    case R_SYEVD: return lk_syevd_kernel(&c, t);
    case R_GEEV: return lk_geev_kernel(&c, t);
    case R_GEES: return lk_gees_kernel(&c, t);
    case R_GEHRD: return lk_gehrd_kernel(&c, t);
    case R_SYTRD: return lk_sytrd_kernel(&c, t);
    case R_GTSV: return lk_gtsv_kernel(&c, t);
    case K_TRIDIAGONAL_SOLVE_PERTURBED: return lk_tridiagonal_solve_perturbed_kernel(&c);
    default: return lk_fail(&c, XLA_FFI_Error_Code_INTERNAL, "unknown routine%s", "");
  }
}

#define HANDLER(target, r, t)                                         \
  static XLA_FFI_Error* handle_##target(XLA_FFI_CallFrame* frame) {   \
    return dispatch(frame, #target, r, t);                            \
  }

#define FOR_EACH_TARGET(X)                                                               \
  X(lapack_spotrf_ffi, R_POTRF, T_S) X(lapack_dpotrf_ffi, R_POTRF, T_D)                  \
  X(lapack_cpotrf_ffi, R_POTRF, T_C) X(lapack_zpotrf_ffi, R_POTRF, T_Z)                  \
  X(lapack_sgetrf_ffi, R_GETRF, T_S) X(lapack_dgetrf_ffi, R_GETRF, T_D)                  \
  X(lapack_cgetrf_ffi, R_GETRF, T_C) X(lapack_zgetrf_ffi, R_GETRF, T_Z)                  \
  X(lapack_sgeqrf_ffi, R_GEQRF, T_S) X(lapack_dgeqrf_ffi, R_GEQRF, T_D)                  \
  X(lapack_cgeqrf_ffi, R_GEQRF, T_C) X(lapack_zgeqrf_ffi, R_GEQRF, T_Z)                  \
  X(lapack_sgeqp3_ffi, R_GEQP3, T_S) X(lapack_dgeqp3_ffi, R_GEQP3, T_D)                  \
  X(lapack_cgeqp3_ffi, R_GEQP3, T_C) X(lapack_zgeqp3_ffi, R_GEQP3, T_Z)                  \
  X(lapack_sorgqr_ffi, R_ORGQR, T_S) X(lapack_dorgqr_ffi, R_ORGQR, T_D)                  \
  X(lapack_cungqr_ffi, R_ORGQR, T_C) X(lapack_zungqr_ffi, R_ORGQR, T_Z)                  \
  X(lapack_sormqr_ffi, R_ORMQR, T_S) X(lapack_dormqr_ffi, R_ORMQR, T_D)                  \
  X(lapack_cunmqr_ffi, R_ORMQR, T_C) X(lapack_zunmqr_ffi, R_ORMQR, T_Z)                  \
  X(lapack_strsm_ffi, R_TRSM, T_S) X(lapack_dtrsm_ffi, R_TRSM, T_D)                      \
  X(lapack_ctrsm_ffi, R_TRSM, T_C) X(lapack_ztrsm_ffi, R_TRSM, T_Z)                      \
  X(lapack_sgesdd_ffi, R_GESDD, T_S) X(lapack_dgesdd_ffi, R_GESDD, T_D)                  \
  X(lapack_cgesdd_ffi, R_GESDD, T_C) X(lapack_zgesdd_ffi, R_GESDD, T_Z)                  \
  X(lapack_sgesvd_ffi, R_GESVD, T_S) X(lapack_dgesvd_ffi, R_GESVD, T_D)                  \
  X(lapack_cgesvd_ffi, R_GESVD, T_C) X(lapack_zgesvd_ffi, R_GESVD, T_Z)                  \
  X(lapack_ssyevd_ffi, R_SYEVD, T_S) X(lapack_dsyevd_ffi, R_SYEVD, T_D)                  \
  X(lapack_cheevd_ffi, R_SYEVD, T_C) X(lapack_zheevd_ffi, R_SYEVD, T_Z)                  \
  X(lapack_sgeev_ffi, R_GEEV, T_S) X(lapack_dgeev_ffi, R_GEEV, T_D)                      \
  X(lapack_cgeev_ffi, R_GEEV, T_C) X(lapack_zgeev_ffi, R_GEEV, T_Z)                      \
  X(lapack_sgees_ffi, R_GEES, T_S) X(lapack_dgees_ffi, R_GEES, T_D)                      \
  X(lapack_cgees_ffi, R_GEES, T_C) X(lapack_zgees_ffi, R_GEES, T_Z)                      \
  X(lapack_sgehrd_ffi, R_GEHRD, T_S) X(lapack_dgehrd_ffi, R_GEHRD, T_D)                  \
  X(lapack_cgehrd_ffi, R_GEHRD, T_C) X(lapack_zgehrd_ffi, R_GEHRD, T_Z)                  \
  X(lapack_ssytrd_ffi, R_SYTRD, T_S) X(lapack_dsytrd_ffi, R_SYTRD, T_D)                  \
  X(lapack_chetrd_ffi, R_SYTRD, T_C) X(lapack_zhetrd_ffi, R_SYTRD, T_Z)                  \
  X(lapack_sgtsv_ffi, R_GTSV, T_S) X(lapack_dgtsv_ffi, R_GTSV, T_D)                      \
  X(lapack_cgtsv_ffi, R_GTSV, T_C) X(lapack_zgtsv_ffi, R_GTSV, T_Z)                      \
  X(tridiagonal_solve_perturbed_ffi, K_TRIDIAGONAL_SOLVE_PERTURBED, T_ANY)

FOR_EACH_TARGET(HANDLER)

typedef struct {
  const char* name;
  XLA_FFI_Handler* handler;
  int routine;
  int type;
} target_entry;

#define ENTRY(target, r, t) {#target, handle_##target, r, t},
static const target_entry TARGETS[] = {FOR_EACH_TARGET(ENTRY)};
#define NUM_TARGETS ((int)(sizeof(TARGETS) / sizeof(TARGETS[0])))

/* The number of custom-call targets this library handles. */
PJRT_CPU_EXPORT int pjrt_cpu_lapack_num_targets(void) { return NUM_TARGETS; }

/* Target i's custom-call name (e.g. "lapack_dpotrf_ffi"), or NULL. */
PJRT_CPU_EXPORT const char* pjrt_cpu_lapack_target_name(int i) {
  return (i >= 0 && i < NUM_TARGETS) ? TARGETS[i].name : NULL;
}

/* Target i's XLA_FFI_Handler, or NULL. */
PJRT_CPU_EXPORT void* pjrt_cpu_lapack_target_handler(int i) {
  return (i >= 0 && i < NUM_TARGETS) ? (void*)TARGETS[i].handler : NULL;
}

/* Whether every routine target i needs has been provided. */
PJRT_CPU_EXPORT int pjrt_cpu_lapack_target_ready(int i) {
  if (i < 0 || i >= NUM_TARGETS) return 0;
  if (TARGETS[i].routine >= NUM_ROUTINES) return 1; /* needs no LAPACK routine */
  return lk_routine_provided(TARGETS[i].routine, TARGETS[i].type);
}
