/*
 * lapack_common.c -- what every kernel of the LAPACK kernel library uses: the
 * element-type table, the table of LAPACK routines Python hands over (with
 * the two exported functions Python learns the names from and fills it
 * through), and the call-frame helpers that check operands, read attributes
 * and report errors. lapack_kernels.c describes the library as a whole;
 * lapack_common.h declares what is here.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lapack_common.h"

/* ------------------------------------------------------------------------ */
/* Element types                                                            */
/* ------------------------------------------------------------------------ */

const type_info LK_TYPES[NUM_TYPES] = {
    {'s', 4, 0, XLA_FFI_DataType_F32, XLA_FFI_DataType_F32, XLA_FFI_DataType_C64},
    {'d', 8, 0, XLA_FFI_DataType_F64, XLA_FFI_DataType_F64, XLA_FFI_DataType_C128},
    {'c', 8, 1, XLA_FFI_DataType_C64, XLA_FFI_DataType_F32, XLA_FFI_DataType_C64},
    {'z', 16, 1, XLA_FFI_DataType_C128, XLA_FFI_DataType_F64, XLA_FFI_DataType_C128},
};

int64_t lk_work_size_from(const void* w, int t) {
  double v = (t == T_S || t == T_C) ? (double)*(const float*)w : *(const double*)w;
  if (!(v >= 1.0)) return 1;
  return (int64_t)v;
}

/* ------------------------------------------------------------------------ */
/* LAPACK routines handed over by Python                                    */
/* ------------------------------------------------------------------------ */

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
    if (strcmp(name + 1, ROUTINE_NAMES[r][LK_TYPES[t].is_complex]) == 0) {
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
  snprintf(names[i], sizeof(names[i]), "%c%s", LK_TYPES[t].prefix,
           ROUTINE_NAMES[r][LK_TYPES[t].is_complex]);
  return names[i];
}

int lk_routine_provided(int r, int t) { return routines[r][t] != NULL; }

void* lk_routine(call* c, int r, int t, XLA_FFI_Error** error) {
  void* fn = routines[r][t];
  if (fn == NULL) {
    char name[16];
    snprintf(name, sizeof(name), "%c%s", LK_TYPES[t].prefix,
             ROUTINE_NAMES[r][LK_TYPES[t].is_complex]);
    *error = lk_fail(c, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                     "LAPACK routine %s has not been provided; call "
                     "pjrt_cpu.lapack.provide_lapack() (which takes it from SciPy) first", name);
  }
  return fn;
}

/* ------------------------------------------------------------------------ */
/* Call-frame helpers                                                       */
/* ------------------------------------------------------------------------ */

/* The FFI version the handlers report when XLA asks (see pjrt/ffi.py,
   HANDLER_FFI_VERSION): they use only the call frame and XLA_FFI_Error_Create,
   which are unchanged since 0.1, the oldest version current plugins accept. */
enum { HANDLER_FFI_MAJOR = 0, HANDLER_FFI_MINOR = 1 };

int lk_answer_metadata_query(XLA_FFI_CallFrame* frame) {
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

XLA_FFI_Error* lk_fail(call* c, XLA_FFI_Error_Code code, const char* fmt, const char* detail) {
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

int64_t lk_elements(const XLA_FFI_Buffer* b) {
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
XLA_FFI_Error* lk_byte_attr(call* c, const char* name, char* out) {
  XLA_FFI_AttrType type;
  XLA_FFI_Scalar* s = (XLA_FFI_Scalar*)find_attr(c, name, &type);
  if (s == NULL) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "missing attribute %s", name);
  }
  if (type != XLA_FFI_AttrType_SCALAR ||
      (s->dtype != XLA_FFI_DataType_U8 && s->dtype != XLA_FFI_DataType_S8 &&
       s->dtype != XLA_FFI_DataType_PRED)) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                   "attribute %s must be a one-byte scalar", name);
  }
  *out = *(const char*)s->value;
  return NULL;
}

XLA_FFI_Error* lk_int_attr(call* c, const char* name, lapack_int* out) {
  XLA_FFI_AttrType type;
  XLA_FFI_Scalar* s = (XLA_FFI_Scalar*)find_attr(c, name, &type);
  if (s == NULL) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "missing attribute %s", name);
  }
  if (type != XLA_FFI_AttrType_SCALAR) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attribute %s must be a scalar", name);
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
  return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "attribute %s must be a 32-bit integer", name);
}

/* Checks operand/result counts, and that all of them are buffers. */
XLA_FFI_Error* lk_expect_counts(call* c, int64_t nargs, int64_t nrets) {
  if (c->frame->args.size != nargs || c->frame->rets.size != nrets) {
    char detail[96];
    snprintf(detail, sizeof(detail), "%lld operands and %lld results",
             (long long)nargs, (long long)nrets);
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "expected %s", detail);
  }
  for (int64_t i = 0; i < nargs; ++i) {
    if (c->frame->args.types[i] != XLA_FFI_ArgType_BUFFER) {
      return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "operands must be buffers%s", "");
    }
  }
  for (int64_t i = 0; i < nrets; ++i) {
    if (c->frame->rets.types[i] != XLA_FFI_RetType_BUFFER) {
      return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "results must be buffers%s", "");
    }
  }
  return NULL;
}

static XLA_FFI_Error* expect_dtype(call* c, const XLA_FFI_Buffer* b,
                                   XLA_FFI_DataType dtype, const char* what) {
  if (b->dtype != dtype) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s has the wrong element type", what);
  }
  return NULL;
}

/* The set-up every kernel repeated as its first lines, once: counts, then
   element types in the order listed (the first mismatch is the error). */
XLA_FFI_Error* lk_expect_signature(call* c, int t, const signature* s) {
  CHECK(lk_expect_counts(c, s->operands, s->results));
  const type_info* ti = &LK_TYPES[t];
  for (int i = 0; i < MAX_CHECKED_BUFFERS && s->checks[i].what != NULL; ++i) {
    const buffer_check* k = &s->checks[i];
    XLA_FFI_Buffer* b = k->buffer >= 0 ? arg(c, k->buffer) : ret(c, -1 - k->buffer);
    XLA_FFI_DataType dtype = k->type == E_ELEM   ? ti->dtype
                             : k->type == E_REAL ? ti->real
                             : k->type == E_CPLX ? ti->cplx
                                                 : XLA_FFI_DataType_S32;
    CHECK(expect_dtype(c, b, dtype, k->what));
  }
  return NULL;
}

XLA_FFI_Error* lk_split_matrix(call* c, const XLA_FFI_Buffer* b, const char* what,
                               int64_t* batch, lapack_int* rows, lapack_int* cols) {
  if (b->rank < 2) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s must have rank >= 2", what);
  }
  int64_t n = 1;
  for (int64_t i = 0; i < b->rank - 2; ++i) n *= b->dims[i];
  int64_t r = b->dims[b->rank - 2], k = b->dims[b->rank - 1];
  if (r > INT_MAX || k > INT_MAX) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                   "%s is too large for 32-bit LAPACK", what);
  }
  *batch = n;
  *rows = (lapack_int)r;
  *cols = (lapack_int)k;
  return NULL;
}

void lk_copy_if_different(const XLA_FFI_Buffer* in, XLA_FFI_Buffer* out, size_t elem) {
  if (in->data != out->data) {
    memmove(out->data, in->data, (size_t)lk_elements(in) * elem);
  }
}

void* lk_scratch(call* c, int64_t count, size_t elem, XLA_FFI_Error** error) {
  if (count < 1) count = 1;
  void* p = malloc((size_t)count * elem);
  if (p == NULL) {
    *error = lk_fail(c, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                     "out of memory for LAPACK workspace%s", "");
  }
  return p;
}

XLA_FFI_Error* lk_checked_int(call* c, int64_t v, lapack_int* out) {
  if (v > INT_MAX || v < 0) {
    return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                   "workspace too large for 32-bit LAPACK%s", "");
  }
  *out = (lapack_int)v;
  return NULL;
}
