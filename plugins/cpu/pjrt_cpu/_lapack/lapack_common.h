/*
 * lapack_common.h -- what the files of the LAPACK kernel library share: the
 * element types, the LAPACK routines (their numbering and SciPy's signatures),
 * the call-frame helpers every kernel uses, and the kernels themselves, which
 * lapack_kernels.c dispatches to. lapack_kernels.c describes the library.
 *
 * Functions and tables one file defines for the others carry the prefix lk_
 * (constants LK_); -fvisibility=hidden keeps them inside the library, whose
 * only exports are the pjrt_cpu_lapack_* functions (PJRT_CPU_EXPORT). The
 * one-line helpers are static inline here rather than calls into another file.
 */
#ifndef PJRT_CPU_LAPACK_COMMON_H
#define PJRT_CPU_LAPACK_COMMON_H

#include <complex.h>
#include <stddef.h>
#include <stdint.h>

#include "xla_ffi_c_api.h"

#if defined(_WIN32)
#define PJRT_CPU_EXPORT __declspec(dllexport)
#else
#define PJRT_CPU_EXPORT __attribute__((visibility("default")))
#endif

typedef int lapack_int;

/* ------------------------------------------------------------------------ */
/* Element types                                                            */
/* ------------------------------------------------------------------------ */

enum { T_S = 0, T_D = 1, T_C = 2, T_Z = 3, NUM_TYPES = 4 };

typedef struct {
  char prefix;              /* LAPACK's letter */
  size_t size;              /* bytes per element */
  int is_complex;
  XLA_FFI_DataType dtype;   /* the element type of the matrices */
  XLA_FFI_DataType real;    /* the type of singular values, eigenvalues of */
                            /* Hermitian matrices, tridiagonals */
  XLA_FFI_DataType cplx;    /* the complex type of the same precision */
} type_info;

extern const type_info LK_TYPES[NUM_TYPES];

static inline size_t real_size(int t) { return (t == T_S || t == T_C) ? 4 : 8; }

/* A LAPACK workspace query writes the optimal size as an element of the
   routine's type (the real part for complex routines). */
int64_t lk_work_size_from(const void* w, int t);

/* Scratch element big enough for any type's workspace-query answer. */
typedef union { float f; double d; float complex c; double complex z; } any_elem;

/* ------------------------------------------------------------------------ */
/* LAPACK routines handed over by Python (lapack_common.c keeps them)       */
/* ------------------------------------------------------------------------ */

enum {
  R_POTRF, R_GETRF, R_GEQRF, R_GEQP3, R_ORGQR, R_ORMQR, R_TRSM, R_GESDD,
  R_GESVD, R_SYEVD, R_GEEV, R_GEES, R_GEHRD, R_SYTRD, R_GTSV, NUM_ROUTINES
};

/* Kernels that call no LAPACK routine (numbered after the routines), and the
   type of a target that serves every element type, dispatching on the
   operands' dtype. */
enum { K_TRIDIAGONAL_SOLVE_PERTURBED = NUM_ROUTINES };
enum { T_ANY = -1 };

/* Whether routine r of type t has been provided (pjrt_cpu_lapack_set). */
int lk_routine_provided(int r, int t);

/* SciPy's cython_lapack / cython_blas signatures of the routines. */
typedef void potrf_fn(char*, lapack_int*, void*, lapack_int*, lapack_int*);
typedef void getrf_fn(lapack_int*, lapack_int*, void*, lapack_int*, lapack_int*, lapack_int*);
typedef void geqrf_fn(lapack_int*, lapack_int*, void*, lapack_int*, void*, void*, lapack_int*,
                      lapack_int*);
typedef void geqp3_real_fn(lapack_int*, lapack_int*, void*, lapack_int*, lapack_int*, void*,
                           void*, lapack_int*, lapack_int*);
typedef void geqp3_cplx_fn(lapack_int*, lapack_int*, void*, lapack_int*, lapack_int*, void*,
                           void*, lapack_int*, void*, lapack_int*);
typedef void orgqr_fn(lapack_int*, lapack_int*, lapack_int*, void*, lapack_int*, void*, void*,
                      lapack_int*, lapack_int*);
typedef void ormqr_fn(char*, char*, lapack_int*, lapack_int*, lapack_int*, void*, lapack_int*,
                      void*, void*, lapack_int*, void*, lapack_int*, lapack_int*);
typedef void trsm_fn(char*, char*, char*, char*, lapack_int*, lapack_int*, void*, void*,
                     lapack_int*, void*, lapack_int*);
typedef void gesdd_real_fn(char*, lapack_int*, lapack_int*, void*, lapack_int*, void*, void*,
                           lapack_int*, void*, lapack_int*, void*, lapack_int*, lapack_int*,
                           lapack_int*);
typedef void gesdd_cplx_fn(char*, lapack_int*, lapack_int*, void*, lapack_int*, void*, void*,
                           lapack_int*, void*, lapack_int*, void*, lapack_int*, void*,
                           lapack_int*, lapack_int*);
typedef void gesvd_real_fn(char*, char*, lapack_int*, lapack_int*, void*, lapack_int*, void*,
                           void*, lapack_int*, void*, lapack_int*, void*, lapack_int*,
                           lapack_int*);
typedef void gesvd_cplx_fn(char*, char*, lapack_int*, lapack_int*, void*, lapack_int*, void*,
                           void*, lapack_int*, void*, lapack_int*, void*, lapack_int*, void*,
                           lapack_int*);
typedef void syevd_fn(char*, char*, lapack_int*, void*, lapack_int*, void*, void*, lapack_int*,
                      lapack_int*, lapack_int*, lapack_int*);
typedef void heevd_fn(char*, char*, lapack_int*, void*, lapack_int*, void*, void*, lapack_int*,
                      void*, lapack_int*, lapack_int*, lapack_int*, lapack_int*);
typedef void geev_real_fn(char*, char*, lapack_int*, void*, lapack_int*, void*, void*, void*,
                          lapack_int*, void*, lapack_int*, void*, lapack_int*, lapack_int*);
typedef void geev_cplx_fn(char*, char*, lapack_int*, void*, lapack_int*, void*, void*,
                          lapack_int*, void*, lapack_int*, void*, lapack_int*, void*,
                          lapack_int*);
typedef void gees_real_fn(char*, char*, void*, lapack_int*, void*, lapack_int*, lapack_int*,
                          void*, void*, void*, lapack_int*, void*, lapack_int*, lapack_int*,
                          lapack_int*);
typedef void gees_cplx_fn(char*, char*, void*, lapack_int*, void*, lapack_int*, lapack_int*,
                          void*, void*, lapack_int*, void*, lapack_int*, void*, lapack_int*,
                          lapack_int*);
typedef void gehrd_fn(lapack_int*, lapack_int*, lapack_int*, void*, lapack_int*, void*, void*,
                      lapack_int*, lapack_int*);
typedef void sytrd_fn(char*, lapack_int*, void*, lapack_int*, void*, void*, void*, void*,
                      lapack_int*, lapack_int*);
typedef void gtsv_fn(lapack_int*, lapack_int*, void*, void*, void*, void*, lapack_int*,
                     lapack_int*);

/* ------------------------------------------------------------------------ */
/* Call-frame helpers (lapack_common.c)                                     */
/* ------------------------------------------------------------------------ */

/* One call of a handler: its frame, and its target's name for messages. */
typedef struct {
  XLA_FFI_CallFrame* frame;
  const char* target;
} call;

/* Answers XLA's metadata query (the call made at registration with an
   XLA_FFI_Metadata_Extension and no API table). Returns 1 if it was one. */
int lk_answer_metadata_query(XLA_FFI_CallFrame* frame);

/* An error "<target>: <fmt with detail for %s>". */
XLA_FFI_Error* lk_fail(call* c, XLA_FFI_Error_Code code, const char* fmt, const char* detail);

static inline XLA_FFI_Buffer* arg(call* c, int i) {
  return (XLA_FFI_Buffer*)c->frame->args.args[i];
}
static inline XLA_FFI_Buffer* ret(call* c, int i) {
  return (XLA_FFI_Buffer*)c->frame->rets.rets[i];
}

static inline int64_t last_dim(const XLA_FFI_Buffer* b) {
  return b->rank > 0 ? b->dims[b->rank - 1] : 1;
}

int64_t lk_elements(const XLA_FFI_Buffer* b);

/* Attributes: a one-byte scalar (a character or a flag), a 32-bit integer. */
XLA_FFI_Error* lk_byte_attr(call* c, const char* name, char* out);
XLA_FFI_Error* lk_int_attr(call* c, const char* name, lapack_int* out);

/* The buffers a kernel takes, which lk_expect_signature checks before the
   kernel reads any of them: the operand and result counts (all buffers), then
   the element type of each listed buffer, in order, under the name its error
   message uses. A buffer is OPERAND(i) or RESULT(i); its type is the kernel's
   element type (E_ELEM), the real or complex type of the same precision
   (E_REAL, E_CPLX), or 32-bit integers (E_S32). Buffers the kernel takes any
   type for are not listed. */
enum { E_ELEM, E_REAL, E_CPLX, E_S32 };
#define OPERAND(i) (i)
#define RESULT(i) (-1 - (i))
#define MAX_CHECKED_BUFFERS 6

typedef struct {
  int buffer;        /* OPERAND(i) or RESULT(i) */
  int type;          /* E_ELEM, E_REAL, E_CPLX or E_S32 */
  const char* what;  /* its name in the error message */
} buffer_check;

typedef struct {
  int64_t operands, results;
  buffer_check checks[MAX_CHECKED_BUFFERS];  /* up to the first with what == NULL */
} signature;

XLA_FFI_Error* lk_expect_counts(call* c, int64_t nargs, int64_t nrets);
XLA_FFI_Error* lk_expect_signature(call* c, int t, const signature* s);

/* Splits a [..., rows, cols] buffer into batch count and matrix size. */
XLA_FFI_Error* lk_split_matrix(call* c, const XLA_FFI_Buffer* b, const char* what,
                               int64_t* batch, lapack_int* rows, lapack_int* cols);

void lk_copy_if_different(const XLA_FFI_Buffer* in, XLA_FFI_Buffer* out, size_t elem);

/* Routine r of type t, or NULL with *error saying it has not been provided. */
void* lk_routine(call* c, int r, int t, XLA_FFI_Error** error);

/* malloc'ed room for count (at least 1) elements, or NULL with *error set. */
void* lk_scratch(call* c, int64_t count, size_t elem, XLA_FFI_Error** error);

/* v as a LAPACK integer, or an error if it does not fit. */
XLA_FFI_Error* lk_checked_int(call* c, int64_t v, lapack_int* out);

static inline lapack_int imax(lapack_int a, lapack_int b) { return a > b ? a : b; }
static inline lapack_int imin(lapack_int a, lapack_int b) { return a < b ? a : b; }

#define CHECK(expr)                          \
  do {                                       \
    XLA_FFI_Error* error_ = (expr);          \
    if (error_ != NULL) return error_;       \
  } while (0)

/* Bytes between consecutive batch entries of a buffer with `per` elements each. */
#define STEP(ptr, per, elem) ((char*)(ptr) + (size_t)(per) * (elem))

/* ------------------------------------------------------------------------ */
/* Kernels, by family: one per routine, called with the element type        */
/* ------------------------------------------------------------------------ */

/* lapack_factorizations.c */
XLA_FFI_Error* lk_potrf_kernel(call* c, int t);
XLA_FFI_Error* lk_getrf_kernel(call* c, int t);
XLA_FFI_Error* lk_geqrf_kernel(call* c, int t);
XLA_FFI_Error* lk_geqp3_kernel(call* c, int t);
XLA_FFI_Error* lk_orgqr_kernel(call* c, int t);
XLA_FFI_Error* lk_ormqr_kernel(call* c, int t);
XLA_FFI_Error* lk_trsm_kernel(call* c, int t);

/* lapack_decompositions.c */
XLA_FFI_Error* lk_svd_kernel(call* c, int t, int use_gesvd);
XLA_FFI_Error* lk_syevd_kernel(call* c, int t);
XLA_FFI_Error* lk_geev_kernel(call* c, int t);
XLA_FFI_Error* lk_gees_kernel(call* c, int t);
XLA_FFI_Error* lk_gehrd_kernel(call* c, int t);
XLA_FFI_Error* lk_sytrd_kernel(call* c, int t);

/* lapack_tridiagonal.c */
XLA_FFI_Error* lk_gtsv_kernel(call* c, int t);
XLA_FFI_Error* lk_tridiagonal_solve_perturbed_kernel(call* c);

#endif /* PJRT_CPU_LAPACK_COMMON_H */
