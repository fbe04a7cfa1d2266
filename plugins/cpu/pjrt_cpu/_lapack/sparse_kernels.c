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
 * a read outside the buffers.
 *
 * Threads: a product of enough work (stored values plus rows, times the dense
 * operand's columns: MIN_WORK_PER_THREAD each) runs on up to as many threads
 * as the process has cores (or as pjrt_cpu_sparse_set_max_threads says): its
 * rows are cut into contiguous chunks of about equal work, CHUNKS_PER_THREAD
 * per thread, which the calling thread and the helpers it starts claim one at
 * a time. The calling thread returns once every chunk is done, so no thread
 * touches the product's buffers after the call; on a busy machine it claims
 * the chunks of helpers the scheduler has not run yet, and a helper that
 * starts after the last chunk was claimed only lets go of the job (heap
 * memory of its own, freed by its last user). No state is shared between
 * calls, so concurrent calls need no lock; a forked child has none of the
 * helpers and needs none. Each output row is written by one thread, adding
 * its entries in stored order, so the result is the same, bit for bit, on any
 * number of threads. A helper that cannot be started leaves its share to the
 * others.
 */
#if !defined(_WIN32)
#define _GNU_SOURCE /* sched_getaffinity */
#endif
/* The row updates are independent across the dense operand's columns: let GCC
   vectorise them (its -O2 cost model leaves loops of unknown length alone). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include <complex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(_WIN32)
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#endif

#include "lapack_common.h"

static const char TARGET[] = "cpu_csr_sparse_dense_ffi";

/* out[i, :] = sum over the row's entries of value * rhs[column, :], entries
   in stored order, for rows first <= i < last. Integer types add and multiply
   as unsigned (wrapping, as XLA's integers do) to stay clear of signed
   overflow. */
#define CSR_PRODUCT(name, T, ACC, I)                                               \
  static void name(const void* data, const void* indptr, const void* indices,      \
                   const void* rhs, void* out, int64_t first, int64_t last,        \
                   int64_t k) {                                                    \
    const T* v = (const T*)data;                                                   \
    const I* p = (const I*)indptr;                                                 \
    const I* col = (const I*)indices;                                              \
    const T* b = (const T*)rhs;                                                    \
    T* o = (T*)out;                                                                \
    for (int64_t i = first; i < last; ++i) {                                       \
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
                        int64_t, int64_t);

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

/* ------------------------------------------------------------------------ */
/* Splitting a product over threads                                         */
/* ------------------------------------------------------------------------ */

/* Multiply-adds (plus one per output element written) a thread is given at
   the least: below this, starting a thread costs more than it saves. */
#define MIN_WORK_PER_THREAD ((int64_t)1 << 17)
/* The most threads one product uses. */
#define MAX_THREADS 64

/* The most threads a product may use; 0: as many as the process's cores. */
static int max_threads_setting = 0;
/* Threads started for products since the library was loaded. */
static int64_t threads_started = 0;

/* Sets the most threads a product may use (0: the process's cores; 1: the
   calling thread alone; more than the cores is taken as asked) and returns
   the previous setting. Products already running keep theirs. */
PJRT_CPU_EXPORT int pjrt_cpu_sparse_set_max_threads(int n) {
  if (n < 0) n = 0;
  return __atomic_exchange_n(&max_threads_setting, n, __ATOMIC_RELAXED);
}

/* The setting of pjrt_cpu_sparse_set_max_threads. */
PJRT_CPU_EXPORT int pjrt_cpu_sparse_max_threads(void) {
  return __atomic_load_n(&max_threads_setting, __ATOMIC_RELAXED);
}

/* Threads started for products since the library was loaded. */
PJRT_CPU_EXPORT int64_t pjrt_cpu_sparse_threads_started(void) {
  return __atomic_load_n(&threads_started, __ATOMIC_RELAXED);
}

/* The cores this process may run on (its affinity mask), at least 1. */
static int usable_cores(void) {
#if defined(_WIN32)
  return 1;
#else
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? (int)online : 1;
#endif
}

/* The rows of a product, cut into chunks of about equal work that the calling
   thread and its helpers claim one at a time. The job lives on the heap until
   its last user lets go: a helper that starts late (the machine is busy) finds
   every chunk claimed and leaves without touching the product's buffers. */
typedef struct {
  product_fn* product;
  const void *data, *indptr, *indices, *rhs;
  void* out;
  int64_t k;
  int chunks;
  int next;      /* the next chunk to claim (atomic) */
  int users;     /* the calling thread and each helper started (atomic) */
#if !defined(_WIN32)
  pthread_mutex_t lock;
  pthread_cond_t all_done;
#endif
  int done;      /* chunks finished (under lock) */
  int64_t bounds[]; /* chunk c is rows [bounds[c], bounds[c + 1]) */
} product_job;

/* Claims and runs chunks until none is left; returns how many it ran. */
static int run_chunks(product_job* job) {
  int ran = 0;
  for (;;) {
    int c = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
    if (c >= job->chunks) return ran;
    job->product(job->data, job->indptr, job->indices, job->rhs, job->out, job->bounds[c],
                 job->bounds[c + 1], job->k);
    ++ran;
  }
}

#if !defined(_WIN32)
static void let_go(product_job* job) {
  if (__atomic_sub_fetch(&job->users, 1, __ATOMIC_ACQ_REL) == 0) {
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->all_done);
    free(job);
  }
}

/* Adds `ran` finished chunks; wakes the calling thread when they are all done. */
static void finished(product_job* job, int ran) {
  if (ran == 0) return;
  pthread_mutex_lock(&job->lock);
  job->done += ran;
  if (job->done == job->chunks) pthread_cond_signal(&job->all_done);
  pthread_mutex_unlock(&job->lock);
}

static void* helper_thread(void* argument) {
  product_job* job = (product_job*)argument;
  finished(job, run_chunks(job));
  let_go(job);
  return NULL;
}
#endif

/* The first row whose work before it, (indptr[row] + row) * k, reaches
   `target`; rows in [lo, hi]. indptr is checked, so never decreases. */
static int64_t row_at_work(const void* indptr, int wide, int64_t lo, int64_t hi, int64_t k,
                           double target) {
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if ((double)(index_at(indptr, wide, mid) + mid) * (double)k < target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/* Chunks per thread: a helper the machine is slow to run holds up at most
   one small chunk, and the calling thread claims the rest. */
#define CHUNKS_PER_THREAD 4

/* out = A @ rhs over rows [0, rows), on as many threads as the work warrants. */
static void run_product(product_fn* product, const void* data, const void* indptr,
                        const void* indices, const void* rhs, void* out, int wide,
                        int64_t rows, int64_t k) {
  int threads = pjrt_cpu_sparse_max_threads();
  if (threads == 0) threads = usable_cores();
  /* The values the rows use (indptr is checked: it ends within nnz). */
  double work = ((double)index_at(indptr, wide, rows) + (double)rows) * (double)k;
  if ((double)threads * (double)MIN_WORK_PER_THREAD > work) {
    threads = (int)(work / (double)MIN_WORK_PER_THREAD);
  }
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if ((int64_t)threads > rows) threads = (int)rows;
#if defined(_WIN32)
  threads = 1;
#endif
  int chunks = threads * CHUNKS_PER_THREAD;
  if ((int64_t)chunks > rows) chunks = (int)rows;
  product_job* job = threads > 1 && k > 0
      ? (product_job*)malloc(sizeof(product_job) + sizeof(int64_t) * (size_t)(chunks + 1))
      : NULL;
  if (job == NULL) {
    product(data, indptr, indices, rhs, out, 0, rows, k);
    return;
  }
#if !defined(_WIN32)
  job->product = product;
  job->data = data;
  job->indptr = indptr;
  job->indices = indices;
  job->rhs = rhs;
  job->out = out;
  job->k = k;
  job->chunks = chunks;
  job->next = 0;
  job->done = 0;
  job->users = 1;
  job->bounds[0] = 0;
  for (int c = 1; c < chunks; ++c) {
    job->bounds[c] = row_at_work(indptr, wide, job->bounds[c - 1], rows, k,
                                 work * c / chunks);
  }
  job->bounds[chunks] = rows;
  pthread_mutex_init(&job->lock, NULL);
  pthread_cond_init(&job->all_done, NULL);
  /* The helpers start with the signals sent to the process blocked, so that
     they go to the threads that handle them (Python's, for one); the signals
     of a fault stay as they were, for a crash handler to report. A helper
     that cannot start leaves its share to the others. */
  sigset_t all, previous;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGABRT);
  int masked = pthread_sigmask(SIG_SETMASK, &all, &previous) == 0;
  pthread_attr_t attributes;
  int detached = pthread_attr_init(&attributes) == 0;
  if (detached) pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  for (int t = 1; t < threads && detached; ++t) {
    pthread_t id;
    __atomic_add_fetch(&job->users, 1, __ATOMIC_ACQ_REL);
    if (pthread_create(&id, &attributes, helper_thread, job) != 0) {
      __atomic_sub_fetch(&job->users, 1, __ATOMIC_ACQ_REL);
      break;
    }
    __atomic_add_fetch(&threads_started, 1, __ATOMIC_RELAXED);
  }
  if (detached) pthread_attr_destroy(&attributes);
  if (masked) pthread_sigmask(SIG_SETMASK, &previous, NULL);
  finished(job, run_chunks(job));
  /* Every chunk is claimed now; wait for those a helper is still running. */
  pthread_mutex_lock(&job->lock);
  while (job->done < job->chunks) pthread_cond_wait(&job->all_done, &job->lock);
  pthread_mutex_unlock(&job->lock);
  let_go(job);
#endif
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
  run_product(product, data->data, indptr->data, indices->data, rhs->data, out->data, wide,
              rows, k);
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
