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
 */
#include <complex.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xla_ffi_c_api.h"

#if defined(_WIN32)
#define PJRT_CPU_EXPORT __declspec(dllexport)
#else
#define PJRT_CPU_EXPORT __attribute__((visibility("default")))
#endif

/* The FFI version these handlers report when XLA asks (see pjrt/ffi.py,
   HANDLER_FFI_VERSION): they use only the call frame and XLA_FFI_Error_Create,
   which are unchanged since 0.1, the oldest version current plugins accept. */
enum { HANDLER_FFI_MAJOR = 0, HANDLER_FFI_MINOR = 1 };

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

static const type_info TYPES[NUM_TYPES] = {
    {'s', 4, 0, XLA_FFI_DataType_F32, XLA_FFI_DataType_F32, XLA_FFI_DataType_C64},
    {'d', 8, 0, XLA_FFI_DataType_F64, XLA_FFI_DataType_F64, XLA_FFI_DataType_C128},
    {'c', 8, 1, XLA_FFI_DataType_C64, XLA_FFI_DataType_F32, XLA_FFI_DataType_C64},
    {'z', 16, 1, XLA_FFI_DataType_C128, XLA_FFI_DataType_F64, XLA_FFI_DataType_C128},
};

static size_t real_size(int t) { return (t == T_S || t == T_C) ? 4 : 8; }

/* A LAPACK workspace query writes the optimal size as an element of the
   routine's type (the real part for complex routines). */
static int64_t work_size_from(const void* w, int t) {
  double v = (t == T_S || t == T_C) ? (double)*(const float*)w : *(const double*)w;
  if (!(v >= 1.0)) return 1;
  return (int64_t)v;
}

/* ------------------------------------------------------------------------ */
/* LAPACK routines handed over by Python                                    */
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

/* Routine names without the type letter: real spelling, complex spelling. */
static const char* const ROUTINE_NAMES[NUM_ROUTINES][2] = {
    {"potrf", "potrf"}, {"getrf", "getrf"}, {"geqrf", "geqrf"},
    {"geqp3", "geqp3"}, {"orgqr", "ungqr"}, {"ormqr", "unmqr"},
    {"trsm", "trsm"},   {"gesdd", "gesdd"}, {"gesvd", "gesvd"},
    {"syevd", "heevd"}, {"geev", "geev"},   {"gees", "gees"},
    {"gehrd", "gehrd"}, {"sytrd", "hetrd"}, {"gtsv", "gtsv"},
};

static void* routines[NUM_ROUTINES][NUM_TYPES];

/* Records the address of LAPACK/BLAS routine `name` (e.g. "dpotrf",
   "zheevd", "strsm"). Returns 1 when the name is one this library uses, 0
   otherwise (the address is then ignored). */
PJRT_CPU_EXPORT int pjrt_cpu_lapack_set(const char* name, void* fn) {
  if (name == NULL || name[0] == '\0') return 0;
  int t;
  switch (name[0]) {
    case 's': t = T_S; break;
    case 'd': t = T_D; break;
    case 'c': t = T_C; break;
    case 'z': t = T_Z; break;
    default: return 0;
  }
  for (int r = 0; r < NUM_ROUTINES; ++r) {
    if (strcmp(name + 1, ROUTINE_NAMES[r][TYPES[t].is_complex]) == 0) {
      routines[r][t] = fn;
      return 1;
    }
  }
  return 0;
}

/* The LAPACK/BLAS routine names the handlers need, one per call with i from
   0; NULL past the end. pjrt_cpu uses it to look each one up in SciPy. */
PJRT_CPU_EXPORT const char* pjrt_cpu_lapack_routine_name(int i) {
  static char names[NUM_ROUTINES * NUM_TYPES][8];
  if (i < 0 || i >= NUM_ROUTINES * NUM_TYPES) return NULL;
  int r = i / NUM_TYPES, t = i % NUM_TYPES;
  snprintf(names[i], sizeof(names[i]), "%c%s", TYPES[t].prefix,
           ROUTINE_NAMES[r][TYPES[t].is_complex]);
  return names[i];
}

/* ------------------------------------------------------------------------ */
/* Call-frame helpers                                                       */
/* ------------------------------------------------------------------------ */

typedef struct {
  XLA_FFI_CallFrame* frame;
  const char* target;
} call;

static XLA_FFI_Error* fail(call* c, XLA_FFI_Error_Code code, const char* fmt,
                           const char* detail) {
  char message[512];
  char body[384];
  snprintf(body, sizeof(body), fmt, detail ? detail : "");
  snprintf(message, sizeof(message), "%s: %s", c->target, body);
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = offsetof(XLA_FFI_Error_Create_Args, errc) + sizeof(args.errc);
  args.message = message;
  args.errc = code;
  return c->frame->api->XLA_FFI_Error_Create(&args);
}

/* Answers XLA's metadata query (the call made at registration with an
   XLA_FFI_Metadata_Extension and no API table). Returns 1 if it was one. */
static int answer_metadata_query(XLA_FFI_CallFrame* frame) {
  for (XLA_FFI_Extension_Base* e = frame->extension_start; e != NULL; e = e->next) {
    if (e->type == XLA_FFI_Extension_Metadata) {
      XLA_FFI_Metadata* m = ((XLA_FFI_Metadata_Extension*)e)->metadata;
      m->api_version.major_version = HANDLER_FFI_MAJOR;
      m->api_version.minor_version = HANDLER_FFI_MINOR;
      if (m->struct_size >= offsetof(XLA_FFI_Metadata, traits) + sizeof(m->traits)) {
        m->traits = 0;
      }
      return 1;
    }
  }
  return 0;
}

static XLA_FFI_Buffer* arg(call* c, int i) {
  return (XLA_FFI_Buffer*)c->frame->args.args[i];
}
static XLA_FFI_Buffer* ret(call* c, int i) {
  return (XLA_FFI_Buffer*)c->frame->rets.rets[i];
}

static int64_t elements(const XLA_FFI_Buffer* b) {
  int64_t n = 1;
  for (int64_t i = 0; i < b->rank; ++i) n *= b->dims[i];
  return n;
}

/* The attribute `name`, or NULL. Attributes are few; a scan is enough. */
static void* find_attr(call* c, const char* name, XLA_FFI_AttrType* type) {
  const XLA_FFI_Attrs* attrs = &c->frame->attrs;
  size_t len = strlen(name);
  for (int64_t i = 0; i < attrs->size; ++i) {
    const XLA_FFI_ByteSpan* n = attrs->names[i];
    if (n->len == len && memcmp(n->ptr, name, len) == 0) {
      *type = attrs->types[i];
      return attrs->attrs[i];
    }
  }
  return NULL;
}

/* A one-byte attribute: jax passes characters ('L', 'V', ...) as ui8 and
   flags as i1; both arrive as one-byte scalars. */
static XLA_FFI_Error* byte_attr(call* c, const char* name, char* out) {
  XLA_FFI_AttrType type;
  XLA_FFI_Scalar* s = (XLA_FFI_Scalar*)find_attr(c, name, &type);
  if (s == NULL) return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "missing attribute %s", name);
  if (type != XLA_FFI_AttrType_SCALAR ||
      (s->dtype != XLA_FFI_DataType_U8 && s->dtype != XLA_FFI_DataType_S8 &&
       s->dtype != XLA_FFI_DataType_PRED)) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "attribute %s must be a one-byte scalar", name);
  }
  *out = *(const char*)s->value;
  return NULL;
}

static XLA_FFI_Error* int_attr(call* c, const char* name, lapack_int* out) {
  XLA_FFI_AttrType type;
  XLA_FFI_Scalar* s = (XLA_FFI_Scalar*)find_attr(c, name, &type);
  if (s == NULL) return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "missing attribute %s", name);
  if (type != XLA_FFI_AttrType_SCALAR) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attribute %s must be a scalar", name);
  }
  switch (s->dtype) {
    case XLA_FFI_DataType_S32: *out = *(const int32_t*)s->value; return NULL;
    case XLA_FFI_DataType_S64: {
      int64_t v = *(const int64_t*)s->value;
      if (v > INT_MAX || v < INT_MIN) break;
      *out = (lapack_int)v;
      return NULL;
    }
    default: break;
  }
  return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
              "attribute %s must be a 32-bit integer", name);
}

/* Checks operand/result counts. */
static XLA_FFI_Error* expect_counts(call* c, int64_t nargs, int64_t nrets) {
  if (c->frame->args.size != nargs || c->frame->rets.size != nrets) {
    char detail[96];
    snprintf(detail, sizeof(detail), "%lld operands and %lld results",
             (long long)nargs, (long long)nrets);
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "expected %s", detail);
  }
  for (int64_t i = 0; i < nargs; ++i) {
    if (c->frame->args.types[i] != XLA_FFI_ArgType_BUFFER) {
      return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "operands must be buffers%s", "");
    }
  }
  for (int64_t i = 0; i < nrets; ++i) {
    if (c->frame->rets.types[i] != XLA_FFI_RetType_BUFFER) {
      return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "results must be buffers%s", "");
    }
  }
  return NULL;
}

static XLA_FFI_Error* expect_dtype(call* c, const XLA_FFI_Buffer* b,
                                   XLA_FFI_DataType dtype, const char* what) {
  if (b->dtype != dtype) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s has the wrong element type", what);
  }
  return NULL;
}

/* Splits a [..., rows, cols] buffer into batch count and matrix size. */
static XLA_FFI_Error* split_matrix(call* c, const XLA_FFI_Buffer* b, const char* what,
                                   int64_t* batch, lapack_int* rows, lapack_int* cols) {
  if (b->rank < 2) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s must have rank >= 2", what);
  }
  int64_t n = 1;
  for (int64_t i = 0; i < b->rank - 2; ++i) n *= b->dims[i];
  int64_t r = b->dims[b->rank - 2], k = b->dims[b->rank - 1];
  if (r > INT_MAX || k > INT_MAX) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "%s is too large for 32-bit LAPACK", what);
  }
  *batch = n;
  *rows = (lapack_int)r;
  *cols = (lapack_int)k;
  return NULL;
}

static int64_t last_dim(const XLA_FFI_Buffer* b) {
  return b->rank > 0 ? b->dims[b->rank - 1] : 1;
}

static void copy_if_different(const XLA_FFI_Buffer* in, XLA_FFI_Buffer* out, size_t elem) {
  if (in->data != out->data) {
    memmove(out->data, in->data, (size_t)elements(in) * elem);
  }
}

static void* routine(call* c, int r, int t, XLA_FFI_Error** error) {
  void* fn = routines[r][t];
  if (fn == NULL) {
    char name[16];
    snprintf(name, sizeof(name), "%c%s", TYPES[t].prefix, ROUTINE_NAMES[r][TYPES[t].is_complex]);
    *error = fail(c, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                  "LAPACK routine %s has not been provided; call "
                  "pjrt_cpu.lapack.provide_lapack() (which takes it from SciPy) first", name);
  }
  return fn;
}

static void* scratch(call* c, int64_t count, size_t elem, XLA_FFI_Error** error) {
  if (count < 1) count = 1;
  void* p = malloc((size_t)count * elem);
  if (p == NULL) {
    *error = fail(c, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "out of memory for LAPACK workspace%s", "");
  }
  return p;
}

static lapack_int imax(lapack_int a, lapack_int b) { return a > b ? a : b; }
static lapack_int imin(lapack_int a, lapack_int b) { return a < b ? a : b; }

static XLA_FFI_Error* checked_int(call* c, int64_t v, lapack_int* out) {
  if (v > INT_MAX || v < 0) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "workspace too large for 32-bit LAPACK%s", "");
  }
  *out = (lapack_int)v;
  return NULL;
}

#define CHECK(expr)                          \
  do {                                       \
    XLA_FFI_Error* error_ = (expr);          \
    if (error_ != NULL) return error_;       \
  } while (0)

/* Bytes between consecutive batch entries of a buffer with `per` elements each. */
#define STEP(ptr, per, elem) ((char*)(ptr) + (size_t)(per) * (elem))

/* ------------------------------------------------------------------------ */
/* Routine prototypes (SciPy's cython_lapack / cython_blas signatures)       */
/* ------------------------------------------------------------------------ */

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

/* Scratch element big enough for any type's workspace-query answer. */
typedef union { float f; double d; float complex c; double complex z; } any_elem;

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

/* Cholesky: operands [x]; results [x_out, info]; attribute uplo. */
static XLA_FFI_Error* potrf_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 2));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *info = ret(c, 1);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char uplo;
  CHECK(byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int rows, n;
  CHECK(split_matrix(c, x, "x", &batch, &rows, &n));
  potrf_fn* fn = (potrf_fn*)routine(c, R_POTRF, t, &error);
  if (fn == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* getrf_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 3));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *ipiv = ret(c, 1), *info = ret(c, 2);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, ipiv, XLA_FFI_DataType_S32, "ipiv"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  int64_t batch;
  lapack_int m, n;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  getrf_fn* fn = (getrf_fn*)routine(c, R_GETRF, t, &error);
  if (fn == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* geqrf_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 2));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *tau = ret(c, 1);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, tau, ti->dtype, "tau"));
  int64_t batch;
  lapack_int m, n;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  geqrf_fn* fn = (geqrf_fn*)routine(c, R_GEQRF, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&m, &n, NULL, &lda, NULL, &query, &lwork, &info);
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* geqp3_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 2, 3));
  XLA_FFI_Buffer *x = arg(c, 0), *jpvt = arg(c, 1);
  XLA_FFI_Buffer *x_out = ret(c, 0), *jpvt_out = ret(c, 1), *tau = ret(c, 2);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, jpvt, XLA_FFI_DataType_S32, "jpvt"));
  int64_t batch;
  lapack_int m, n;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  void* fn = routine(c, R_GEQP3, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  float rquery[2];
  if (ti->is_complex) {
    ((geqp3_cplx_fn*)fn)(&m, &n, NULL, &lda, NULL, NULL, &query, &lwork, rquery, &info);
  } else {
    ((geqp3_real_fn*)fn)(&m, &n, NULL, &lda, NULL, NULL, &query, &lwork, &info);
  }
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  void* rwork = NULL;
  if (ti->is_complex) {
    rwork = scratch(c, 2 * (int64_t)n, real_size(t), &error);
    if (rwork == NULL) { free(work); return error; }
  }
  copy_if_different(x, x_out, ti->size);
  copy_if_different(jpvt, jpvt_out, sizeof(lapack_int));
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
static XLA_FFI_Error* orgqr_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 2, 1));
  XLA_FFI_Buffer *x = arg(c, 0), *tau = arg(c, 1), *x_out = ret(c, 0);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, tau, ti->dtype, "tau"));
  int64_t batch;
  lapack_int m, n, k;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  CHECK(checked_int(c, last_dim(tau), &k));
  orgqr_fn* fn = (orgqr_fn*)routine(c, R_ORGQR, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&m, &n, &k, NULL, &lda, NULL, &query, &lwork, &info);
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* ormqr_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 3, 1));
  XLA_FFI_Buffer *a = arg(c, 0), *tau = arg(c, 1), *cm = arg(c, 2), *c_out = ret(c, 0);
  CHECK(expect_dtype(c, a, ti->dtype, "a"));
  CHECK(expect_dtype(c, tau, ti->dtype, "tau"));
  CHECK(expect_dtype(c, cm, ti->dtype, "c"));
  char left, transpose;
  CHECK(byte_attr(c, "left", &left));
  CHECK(byte_attr(c, "transpose", &transpose));
  int64_t batch, a_batch;
  lapack_int m, n, a_rows, a_cols, k;
  CHECK(split_matrix(c, cm, "c", &batch, &m, &n));
  CHECK(split_matrix(c, a, "a", &a_batch, &a_rows, &a_cols));
  CHECK(checked_int(c, last_dim(tau), &k));
  ormqr_fn* fn = (ormqr_fn*)routine(c, R_ORMQR, t, &error);
  if (fn == NULL) return error;
  char side = left ? 'L' : 'R';
  char trans = transpose ? (ti->is_complex ? 'C' : 'T') : 'N';
  lapack_int lda = imax(a_rows, 1), ldc = imax(m, 1), info = 0, lwork = -1;
  any_elem query = {0};
  fn(&side, &trans, &m, &n, &k, NULL, &lda, NULL, NULL, &ldc, &query, &lwork, &info);
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  copy_if_different(cm, c_out, ti->size);
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
static XLA_FFI_Error* trsm_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 2, 1));
  XLA_FFI_Buffer *a = arg(c, 0), *bm = arg(c, 1), *b_out = ret(c, 0);
  CHECK(expect_dtype(c, a, ti->dtype, "a"));
  CHECK(expect_dtype(c, bm, ti->dtype, "b"));
  char side, uplo, trans, diag;
  CHECK(byte_attr(c, "side", &side));
  CHECK(byte_attr(c, "uplo", &uplo));
  CHECK(byte_attr(c, "trans_x", &trans));
  CHECK(byte_attr(c, "diag", &diag));
  int64_t batch, a_batch;
  lapack_int m, n, a_rows, a_cols;
  CHECK(split_matrix(c, bm, "b", &batch, &m, &n));
  CHECK(split_matrix(c, a, "a", &a_batch, &a_rows, &a_cols));
  trsm_fn* fn = (trsm_fn*)routine(c, R_TRSM, t, &error);
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
  copy_if_different(bm, b_out, ti->size);
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

/* SVD (gesdd, divide and conquer, or gesvd, QR iteration):
   [x] -> [x_out, s, u, vt, info]; attribute mode ('A', 'S' or 'N'). */
static XLA_FFI_Error* svd_kernel(call* c, int t, int use_gesvd) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 5));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *s = ret(c, 1), *u = ret(c, 2),
                 *vt = ret(c, 3), *info = ret(c, 4);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, s, ti->real, "s"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char mode;
  CHECK(byte_attr(c, "mode", &mode));
  if (mode != 'A' && mode != 'S' && mode != 'N') {
    return fail(c, XLA_FFI_Error_Code_UNIMPLEMENTED,
                "SVD computation mode %s is not supported", mode == 'O' ? "O" : "?");
  }
  int64_t batch, ub, vb;
  lapack_int m, n, u_rows, u_cols, vt_rows, vt_cols;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  CHECK(split_matrix(c, u, "u", &ub, &u_rows, &u_cols));
  CHECK(split_matrix(c, vt, "vt", &vb, &vt_rows, &vt_cols));
  void* fn = routine(c, use_gesvd ? R_GESVD : R_GESDD, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), ldu = imax(m, 1), ldvt = imax(vt_rows, 1);
  lapack_int mn = imin(m, n), mx = imax(m, n), lwork = -1, qinfo = 0;
  any_elem query = {0};
  char jobz = mode;
  /* Workspace query. */
  if (use_gesvd) {
    if (ti->is_complex) {
      ((gesvd_cplx_fn*)fn)(&jobz, &jobz, &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt,
                           &query, &lwork, NULL, &qinfo);
    } else {
      ((gesvd_real_fn*)fn)(&jobz, &jobz, &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt,
                           &query, &lwork, &qinfo);
    }
  } else {
    if (ti->is_complex) {
      ((gesdd_cplx_fn*)fn)(&jobz, &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, &query,
                           &lwork, NULL, NULL, &qinfo);
    } else {
      ((gesdd_real_fn*)fn)(&jobz, &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, &query,
                           &lwork, NULL, &qinfo);
    }
  }
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  int64_t rwork_size = 0;
  if (ti->is_complex) {
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
  void* work = scratch(c, lwork, ti->size, &error);
  void* iwork = work ? scratch(c, 8 * (int64_t)mn, sizeof(lapack_int), &error) : NULL;
  void* rwork = (iwork && ti->is_complex) ? scratch(c, rwork_size, real_size(t), &error) : NULL;
  if (work == NULL || iwork == NULL || (ti->is_complex && rwork == NULL)) {
    free(work);
    free(iwork);
    free(rwork);
    return error;
  }
  copy_if_different(x, x_out, ti->size);
  char* a = x_out->data;
  char* sp = s->data;
  char* up = u->data;
  char* vp = vt->data;
  lapack_int* inf = info->data;
  int64_t s_step = last_dim(s);
  for (int64_t b = 0; b < batch; ++b) {
    if (use_gesvd) {
      if (ti->is_complex) {
        ((gesvd_cplx_fn*)fn)(&jobz, &jobz, &m, &n, a, &lda, sp, up, &ldu, vp, &ldvt, work,
                             &lwork, rwork, &inf[b]);
      } else {
        ((gesvd_real_fn*)fn)(&jobz, &jobz, &m, &n, a, &lda, sp, up, &ldu, vp, &ldvt, work,
                             &lwork, &inf[b]);
      }
    } else {
      if (ti->is_complex) {
        ((gesdd_cplx_fn*)fn)(&jobz, &m, &n, a, &lda, sp, up, &ldu, vp, &ldvt, work, &lwork,
                             rwork, iwork, &inf[b]);
      } else {
        ((gesdd_real_fn*)fn)(&jobz, &m, &n, a, &lda, sp, up, &ldu, vp, &ldvt, work, &lwork,
                             iwork, &inf[b]);
      }
    }
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
static XLA_FFI_Error* syevd_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 3));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *w = ret(c, 1), *info = ret(c, 2);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, w, ti->real, "eigenvalues"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char mode, uplo;
  CHECK(byte_attr(c, "mode", &mode));
  CHECK(byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int rows, n;
  CHECK(split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = routine(c, R_SYEVD, t, &error);
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
  CHECK(checked_int(c, lwork64, &lwork));
  CHECK(checked_int(c, lrwork64, &lrwork));
  CHECK(checked_int(c, liwork64, &liwork));
  void* work = scratch(c, lwork, ti->size, &error);
  void* iwork = work ? scratch(c, liwork, sizeof(lapack_int), &error) : NULL;
  void* rwork = (iwork && ti->is_complex) ? scratch(c, lrwork, real_size(t), &error) : NULL;
  if (work == NULL || iwork == NULL || (ti->is_complex && rwork == NULL)) {
    free(work);
    free(iwork);
    free(rwork);
    return error;
  }
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* geev_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  int cplx = ti->is_complex;
  CHECK(expect_counts(c, 1, cplx ? 4 : 5));
  XLA_FFI_Buffer* x = arg(c, 0);
  XLA_FFI_Buffer *wr = ret(c, 0), *wi = cplx ? NULL : ret(c, 1);
  XLA_FFI_Buffer *vl = ret(c, cplx ? 1 : 2), *vr = ret(c, cplx ? 2 : 3),
                 *info = ret(c, cplx ? 3 : 4);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, vl, ti->cplx, "left eigenvectors"));
  CHECK(expect_dtype(c, vr, ti->cplx, "right eigenvectors"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char jobvl, jobvr;
  CHECK(byte_attr(c, "compute_left", &jobvl));
  CHECK(byte_attr(c, "compute_right", &jobvr));
  int64_t batch;
  lapack_int rows, n;
  CHECK(split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = routine(c, R_GEEV, t, &error);
  if (fn == NULL) return error;
  int64_t nn = n;
  lapack_int ld = imax(n, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  /* Complex types: extra1 is rwork (2n reals), which the workspace query may
     already touch. Real types: extra1/extra2 receive the packed real left and
     right eigenvectors before they are spelled out as complex columns. */
  void* extra1 = scratch(c, cplx ? 2 * nn : nn * nn, cplx ? real_size(t) : ti->size, &error);
  if (extra1 == NULL) return error;
  if (cplx) {
    ((geev_cplx_fn*)fn)(&jobvl, &jobvr, &n, NULL, &ld, NULL, NULL, &ld, NULL, &ld, &query,
                        &lwork, extra1, &qinfo);
  } else {
    ((geev_real_fn*)fn)(&jobvl, &jobvr, &n, NULL, &ld, NULL, NULL, NULL, &ld, NULL, &ld, &query,
                        &lwork, &qinfo);
  }
  error = checked_int(c, work_size_from(&query, t), &lwork);
  void* work = error ? NULL : scratch(c, lwork, ti->size, &error);
  void* a = work ? scratch(c, nn * nn, ti->size, &error) : NULL;
  void* extra2 = (a && !cplx) ? scratch(c, nn * nn, ti->size, &error) : NULL;
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
  size_t csize = TYPES[cplx ? t : t + 2].size; /* complex element of the same precision */
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
static XLA_FFI_Error* gees_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  int cplx = ti->is_complex;
  CHECK(expect_counts(c, 1, cplx ? 5 : 6));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *vs = ret(c, 1), *wr = ret(c, 2);
  XLA_FFI_Buffer* wi = cplx ? NULL : ret(c, 3);
  XLA_FFI_Buffer *sdim = ret(c, cplx ? 3 : 4), *info = ret(c, cplx ? 4 : 5);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, sdim, XLA_FFI_DataType_S32, "sdim"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char mode, sort;
  CHECK(byte_attr(c, "mode", &mode));
  CHECK(byte_attr(c, "sort", &sort));
  if (sort != 'N') {
    return fail(c, XLA_FFI_Error_Code_UNIMPLEMENTED,
                "ordering eigenvalues on the diagonal is not implemented%s", "");
  }
  int64_t batch;
  lapack_int rows, n;
  CHECK(split_matrix(c, x, "x", &batch, &rows, &n));
  void* fn = routine(c, R_GEES, t, &error);
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
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  void* rwork = (work && cplx) ? scratch(c, nn, real_size(t), &error) : NULL;
  if (work == NULL || (cplx && rwork == NULL)) {
    free(work);
    free(rwork);
    return error;
  }
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* gehrd_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 3));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *tau = ret(c, 1), *info = ret(c, 2);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, tau, ti->dtype, "tau"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  lapack_int low, high;
  CHECK(int_attr(c, "low", &low));
  CHECK(int_attr(c, "high", &high));
  int64_t batch;
  lapack_int m, n;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  gehrd_fn* fn = (gehrd_fn*)routine(c, R_GEHRD, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  fn(&n, &low, &high, NULL, &lda, NULL, &query, &lwork, &qinfo);
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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
static XLA_FFI_Error* sytrd_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 1, 5));
  XLA_FFI_Buffer *x = arg(c, 0), *x_out = ret(c, 0), *d = ret(c, 1), *e = ret(c, 2),
                 *tau = ret(c, 3), *info = ret(c, 4);
  CHECK(expect_dtype(c, x, ti->dtype, "x"));
  CHECK(expect_dtype(c, d, ti->real, "diagonal"));
  CHECK(expect_dtype(c, e, ti->real, "off-diagonal"));
  CHECK(expect_dtype(c, tau, ti->dtype, "tau"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  char uplo;
  CHECK(byte_attr(c, "uplo", &uplo));
  int64_t batch;
  lapack_int m, n;
  CHECK(split_matrix(c, x, "x", &batch, &m, &n));
  sytrd_fn* fn = (sytrd_fn*)routine(c, R_SYTRD, t, &error);
  if (fn == NULL) return error;
  lapack_int lda = imax(m, 1), lwork = -1, qinfo = 0;
  any_elem query = {0};
  fn(&uplo, &n, NULL, &lda, NULL, NULL, NULL, &query, &lwork, &qinfo);
  CHECK(checked_int(c, work_size_from(&query, t), &lwork));
  void* work = scratch(c, lwork, ti->size, &error);
  if (work == NULL) return error;
  copy_if_different(x, x_out, ti->size);
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

/* General tridiagonal solve: [dl, d, du, b] -> [dl_out, d_out, du_out, b_out,
   info]. jax's dl starts with a padding element (dl[0] = 0) and du ends with
   one, so LAPACK's sub-diagonal starts at dl + 1. */
static XLA_FFI_Error* gtsv_kernel(call* c, int t) {
  const type_info* ti = &TYPES[t];
  XLA_FFI_Error* error = NULL;
  CHECK(expect_counts(c, 4, 5));
  XLA_FFI_Buffer *dl = arg(c, 0), *d = arg(c, 1), *du = arg(c, 2), *bm = arg(c, 3);
  XLA_FFI_Buffer *dl_out = ret(c, 0), *d_out = ret(c, 1), *du_out = ret(c, 2),
                 *b_out = ret(c, 3), *info = ret(c, 4);
  CHECK(expect_dtype(c, dl, ti->dtype, "dl"));
  CHECK(expect_dtype(c, d, ti->dtype, "d"));
  CHECK(expect_dtype(c, du, ti->dtype, "du"));
  CHECK(expect_dtype(c, bm, ti->dtype, "b"));
  CHECK(expect_dtype(c, info, XLA_FFI_DataType_S32, "info"));
  int64_t batch;
  lapack_int m, nrhs;
  CHECK(split_matrix(c, bm, "b", &batch, &m, &nrhs));
  gtsv_fn* fn = (gtsv_fn*)routine(c, R_GTSV, t, &error);
  if (fn == NULL) return error;
  copy_if_different(dl, dl_out, ti->size);
  copy_if_different(d, d_out, ti->size);
  copy_if_different(du, du_out, ti->size);
  copy_if_different(bm, b_out, ti->size);
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

static XLA_FFI_Error* tridiagonal_solve_perturbed_kernel(call* c) {
  CHECK(expect_counts(c, 4, 1));
  XLA_FFI_Buffer *dl = arg(c, 0), *d = arg(c, 1), *du = arg(c, 2), *bm = arg(c, 3);
  XLA_FFI_Buffer* x = ret(c, 0);
  int t;
  switch (d->dtype) {
    case XLA_FFI_DataType_F32: t = T_S; break;
    case XLA_FFI_DataType_F64: t = T_D; break;
    case XLA_FFI_DataType_C64: t = T_C; break;
    case XLA_FFI_DataType_C128: t = T_Z; break;
    default:
      return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                  "unsupported element type%s (float32, float64, complex64 or complex128)", "");
  }
  static tsp_solve_fn* const SOLVERS[NUM_TYPES] = {
      (tsp_solve_fn*)tsp_solve_s, (tsp_solve_fn*)tsp_solve_d,
      (tsp_solve_fn*)tsp_solve_c, (tsp_solve_fn*)tsp_solve_z};
  const type_info* ti = &TYPES[t];
  CHECK(expect_dtype(c, dl, ti->dtype, "dl"));
  CHECK(expect_dtype(c, du, ti->dtype, "du"));
  CHECK(expect_dtype(c, bm, ti->dtype, "b"));
  CHECK(expect_dtype(c, x, ti->dtype, "the result"));
  int64_t batch;
  lapack_int n, nrhs;
  CHECK(split_matrix(c, bm, "b", &batch, &n, &nrhs));
  if (elements(dl) != batch * n || elements(d) != batch * n || elements(du) != batch * n) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "dl, d and du must have b's shape without its last dimension%s", "");
  }
  if (elements(x) != elements(bm)) {
    return fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "the result must have b's shape%s", "");
  }
  copy_if_different(bm, x, ti->size);
  if (batch == 0 || n == 0 || nrhs == 0) return NULL;
  XLA_FFI_Error* error = NULL;
  char* work = scratch(c, 3 * (int64_t)n + nrhs, ti->size, &error);
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

/* ------------------------------------------------------------------------ */
/* Handlers: one C function per target, as XLA identifies handlers by address */
/* ------------------------------------------------------------------------ */

static XLA_FFI_Error* dispatch(XLA_FFI_CallFrame* frame, const char* target, int r, int t) {
  if (answer_metadata_query(frame)) return NULL;
  /* Only the execute stage carries data; the others have nothing to prepare. */
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  call c = {frame, target};
  switch (r) {
    case R_POTRF: return potrf_kernel(&c, t);
    case R_GETRF: return getrf_kernel(&c, t);
    case R_GEQRF: return geqrf_kernel(&c, t);
    case R_GEQP3: return geqp3_kernel(&c, t);
    case R_ORGQR: return orgqr_kernel(&c, t);
    case R_ORMQR: return ormqr_kernel(&c, t);
    case R_TRSM: return trsm_kernel(&c, t);
    case R_GESDD: return svd_kernel(&c, t, 0);
    case R_GESVD: return svd_kernel(&c, t, 1);
    case R_SYEVD: return syevd_kernel(&c, t);
    case R_GEEV: return geev_kernel(&c, t);
    case R_GEES: return gees_kernel(&c, t);
    case R_GEHRD: return gehrd_kernel(&c, t);
    case R_SYTRD: return sytrd_kernel(&c, t);
    case R_GTSV: return gtsv_kernel(&c, t);
    case K_TRIDIAGONAL_SOLVE_PERTURBED: return tridiagonal_solve_perturbed_kernel(&c);
    default: return fail(&c, XLA_FFI_Error_Code_INTERNAL, "unknown routine%s", "");
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
  return routines[TARGETS[i].routine][TARGETS[i].type] != NULL;
}
