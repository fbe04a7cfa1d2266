/*
 * sparse_kernels.c -- the XLA FFI handler of cpu_csr_sparse_dense_ffi, the
 * custom call jax lowers products of a CSR (BCSR) matrix and a dense matrix or
 * vector to on CPU (jax.experimental.sparse). jaxlib registers its own kernel
 * in-process; XLA's standalone CPU plugin has none.
 *
 * Operands, as jax passes them:
 *   0 data     [nnz]           the stored values
 *   1 indptr   [rows + 1]      row i's values are data[indptr[i]:indptr[i+1]]
 *   2 indices  [nnz]           their columns
 *   3 rhs      [cols] or [cols, k], row-major
 * Result:      [rows] or [rows, k], row-major: out = A @ rhs.
 * The values, rhs and out share one element type: int32, int64, float32,
 * float64, complex64 or complex128; indptr and indices are both int32 or both
 * int64. Repeated (row, column) entries add up, as in jaxlib.
 *
 * Every index is checked before the first value is read: indptr must start at
 * 0, never decrease and end within nnz, and each column must lie in [0, cols);
 * a bad matrix is an INVALID_ARGUMENT error naming the offending entry, never
 * a read outside the buffers. The product runs on the calling thread.
 */
/* The row updates are independent across the dense operand's columns: let GCC
   vectorise them (its -O2 cost model leaves loops of unknown length alone). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include <complex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lapack_common.h"

static const char TARGET[] = "cpu_csr_sparse_dense_ffi";

/* out[i, :] = sum over the row's entries of value * rhs[column, :], entries
   in stored order. Integer types add and multiply as unsigned (wrapping, as
   XLA's integers do) to stay clear of signed overflow. */
#define CSR_PRODUCT(name, T, ACC, I)                                               \
  static void name(const void* data, const void* indptr, const void* indices,      \
                   const void* rhs, void* out, int64_t rows, int64_t k) {          \
    const T* v = (const T*)data;                                                   \
    const I* p = (const I*)indptr;                                                 \
    const I* col = (const I*)indices;                                              \
    const T* b = (const T*)rhs;                                                    \
    T* o = (T*)out;                                                                \
    for (int64_t i = 0; i < rows; ++i) {                                           \
      T* restrict row = o + i * k;                                                 \
      for (int64_t j = 0; j < k; ++j) row[j] = (T)0;                               \
      for (int64_t e = (int64_t)p[i]; e < (int64_t)p[i + 1]; ++e) {                \
        const T* restrict brow = b + (int64_t)col[e] * k;                          \
        ACC value = (ACC)v[e];                                                     \
        for (int64_t j = 0; j < k; ++j) row[j] = (T)((ACC)row[j] + value * (ACC)brow[j]); \
      }                                                                            \
    }                                                                              \
  }

typedef void product_fn(const void*, const void*, const void*, const void*, void*, int64_t,
                        int64_t);

CSR_PRODUCT(csr_s32_i32, int32_t, uint32_t, int32_t)
CSR_PRODUCT(csr_s32_i64, int32_t, uint32_t, int64_t)
CSR_PRODUCT(csr_s64_i32, int64_t, uint64_t, int32_t)
CSR_PRODUCT(csr_s64_i64, int64_t, uint64_t, int64_t)
CSR_PRODUCT(csr_f32_i32, float, float, int32_t)
CSR_PRODUCT(csr_f32_i64, float, float, int64_t)
CSR_PRODUCT(csr_f64_i32, double, double, int32_t)
CSR_PRODUCT(csr_f64_i64, double, double, int64_t)
CSR_PRODUCT(csr_c64_i32, float complex, float complex, int32_t)
CSR_PRODUCT(csr_c64_i64, float complex, float complex, int64_t)
CSR_PRODUCT(csr_c128_i32, double complex, double complex, int32_t)
CSR_PRODUCT(csr_c128_i64, double complex, double complex, int64_t)

/* The product for an element type and an index width (4 or 8 bytes); NULL for
   an element type the kernel does not take. */
static product_fn* product_for(XLA_FFI_DataType dtype, int wide) {
  switch (dtype) {
    case XLA_FFI_DataType_S32: return wide ? csr_s32_i64 : csr_s32_i32;
    case XLA_FFI_DataType_S64: return wide ? csr_s64_i64 : csr_s64_i32;
    case XLA_FFI_DataType_F32: return wide ? csr_f32_i64 : csr_f32_i32;
    case XLA_FFI_DataType_F64: return wide ? csr_f64_i64 : csr_f64_i32;
    case XLA_FFI_DataType_C64: return wide ? csr_c64_i64 : csr_c64_i32;
    case XLA_FFI_DataType_C128: return wide ? csr_c128_i64 : csr_c128_i32;
    default: return NULL;
  }
}

static inline int64_t index_at(const void* p, int wide, int64_t i) {
  return wide ? ((const int64_t*)p)[i] : (int64_t)((const int32_t*)p)[i];
}

/* An INVALID_ARGUMENT error whose message is printf's of `fmt` (integer
   arguments as long long). */
static XLA_FFI_Error* invalid(call* c, const char* fmt, ...) {
  char detail[256];
  va_list arguments;
  va_start(arguments, fmt);
  vsnprintf(detail, sizeof(detail), fmt, arguments);
  va_end(arguments);
  return lk_fail(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s", detail);
}

/* Checks indptr (monotonic, from 0, within nnz) and every column index. */
static XLA_FFI_Error* check_indices(call* c, const void* indptr, const void* indices,
                                    int wide, int64_t rows, int64_t cols, int64_t nnz) {
  int64_t previous = index_at(indptr, wide, 0);
  if (previous != 0) {
    return invalid(c, "indptr[0] is %lld; a CSR matrix's first row starts at 0",
                   (long long)previous);
  }
  for (int64_t i = 1; i <= rows; ++i) {
    int64_t next = index_at(indptr, wide, i);
    if (next < previous || next > nnz) {
      return invalid(c, "indptr[%lld] is %lld: indptr must not decrease and must end within "
                        "the %lld stored values", (long long)i, (long long)next, (long long)nnz);
    }
    previous = next;
  }
  for (int64_t e = 0; e < previous; ++e) {
    int64_t column = index_at(indices, wide, e);
    if (column < 0 || column >= cols) {
      return invalid(c, "indices[%lld] is %lld, outside the %lld columns of the matrix",
                     (long long)e, (long long)column, (long long)cols);
    }
  }
  return NULL;
}

/* Operand and result shapes: returns rows, cols, k (1 for a vector) and nnz. */
static XLA_FFI_Error* read_shapes(call* c, int64_t* rows, int64_t* cols, int64_t* k,
                                  int64_t* nnz) {
  XLA_FFI_Buffer *data = arg(c, 0), *indptr = arg(c, 1), *indices = arg(c, 2);
  XLA_FFI_Buffer *rhs = arg(c, 3), *out = ret(c, 0);
  if (data->rank != 1 || indptr->rank != 1 || indices->rank != 1) {
    return invalid(c, "data, indptr and indices must be vectors (ranks %lld, %lld, %lld)",
                   (long long)data->rank, (long long)indptr->rank, (long long)indices->rank);
  }
  if (rhs->rank < 1 || rhs->rank > 2 || out->rank != rhs->rank) {
    return invalid(c, "the dense operand and the result must both be vectors or both "
                      "matrices (ranks %lld and %lld)", (long long)rhs->rank, (long long)out->rank);
  }
  *nnz = data->dims[0];
  *rows = out->dims[0];
  *cols = rhs->dims[0];
  *k = rhs->rank == 2 ? rhs->dims[1] : 1;
  if (indices->dims[0] != *nnz) {
    return invalid(c, "indices has %lld entries for %lld stored values",
                   (long long)indices->dims[0], (long long)*nnz);
  }
  if (indptr->dims[0] != *rows + 1) {
    return invalid(c, "indptr has %lld entries; the result's %lld rows need one more",
                   (long long)indptr->dims[0], (long long)*rows);
  }
  if (out->rank == 2 && out->dims[1] != *k) {
    return invalid(c, "the result has %lld columns, the dense operand %lld",
                   (long long)out->dims[1], (long long)*k);
  }
  return NULL;
}

static XLA_FFI_Error* csr_sparse_dense(XLA_FFI_CallFrame* frame) {
  if (lk_answer_metadata_query(frame)) return NULL;
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  call c = {frame, TARGET};
  CHECK(lk_expect_counts(&c, 4, 1));
  XLA_FFI_Buffer *data = arg(&c, 0), *indptr = arg(&c, 1), *indices = arg(&c, 2);
  XLA_FFI_Buffer *rhs = arg(&c, 3), *out = ret(&c, 0);
  if (data->dtype != rhs->dtype || data->dtype != out->dtype) {
    return invalid(&c, "element type mismatch: data, the dense operand and the result have "
                       "XLA types %lld, %lld and %lld", (long long)data->dtype,
                   (long long)rhs->dtype, (long long)out->dtype);
  }
  if (indptr->dtype != indices->dtype ||
      (indptr->dtype != XLA_FFI_DataType_S32 && indptr->dtype != XLA_FFI_DataType_S64)) {
    return invalid(&c, "indptr and indices must both be int32 or both int64 (XLA types %lld "
                       "and %lld)", (long long)indptr->dtype, (long long)indices->dtype);
  }
  int wide = indptr->dtype == XLA_FFI_DataType_S64;
  product_fn* product = product_for(data->dtype, wide);
  if (product == NULL) {
    return invalid(&c, "element type %lld is not one the kernel takes (int32, int64, float32, "
                       "float64, complex64, complex128)", (long long)data->dtype);
  }
  int64_t rows = 0, cols = 0, k = 0, nnz = 0;
  CHECK(read_shapes(&c, &rows, &cols, &k, &nnz));
  CHECK(check_indices(&c, indptr->data, indices->data, wide, rows, cols, nnz));
  product(data->data, indptr->data, indices->data, rhs->data, out->data, rows, k);
  return NULL;
}

typedef struct {
  const char* name;
  XLA_FFI_Handler* handler;
} sparse_target;

static const sparse_target SPARSE_TARGETS[] = {{TARGET, csr_sparse_dense}};
#define NUM_SPARSE_TARGETS ((int)(sizeof(SPARSE_TARGETS) / sizeof(SPARSE_TARGETS[0])))

/* The number of sparse custom-call targets this library handles. */
PJRT_CPU_EXPORT int pjrt_cpu_sparse_num_targets(void) { return NUM_SPARSE_TARGETS; }

/* Sparse target i's custom-call name, or NULL. */
PJRT_CPU_EXPORT const char* pjrt_cpu_sparse_target_name(int i) {
  return (i >= 0 && i < NUM_SPARSE_TARGETS) ? SPARSE_TARGETS[i].name : NULL;
}

/* Sparse target i's XLA_FFI_Handler, or NULL. */
PJRT_CPU_EXPORT void* pjrt_cpu_sparse_target_handler(int i) {
  return (i >= 0 && i < NUM_SPARSE_TARGETS) ? (void*)SPARSE_TARGETS[i].handler : NULL;
}
