/* pjrt._native_runtime: the core's native runtime, in CPython's C API.
 *
 * Everything else in the core reaches the plugin through the cffi extension
 * (_pjrt_cffi). A call made in a loop, though, was mostly Python around one
 * cffi call: taking the ownership ticket, checking each argument, building the
 * output Arrays, and freeing each one again in a Python __del__. This
 * extension owns those steps, once each, and Python calls it; Python keeps the
 * policy (which errors to raise and their words, parking, teardown).
 *
 * One file per concept, from the bottom up:
 *   handle_core.c - HandleCore, the fields of pjrt._capi.handles.ClientHandle
 *                   (its base class) and the rules on them: call tickets
 *                   (take_ticket / end) and the release of an owner's
 *                   buffers, at once when no other call runs, else parked;
 *                   and the cache of a buffer cdata's address;
 *   array_core.c  - ArrayCore, the fields of pjrt.array.Array (its base
 *                   class), its one constructor (adopt) and its finaliser,
 *                   which hands the buffers back to the handle;
 *   call_plan.c   - CallPlan, one executable's per-call path on one or
 *                   several devices: places the arguments, launches,
 *                   adopts the outputs. What it does not handle it leaves
 *                   alone and answers None; the caller takes the Python path,
 *                   which reports every error;
 *   host_views.c  - ArrayCore's buffer protocol: np.asarray and memoryview of
 *                   a value in host memory are the buffer itself;
 *   hot_path.c    - the module: its wiring (configure) and its types.
 *
 * The plugin is reached only through functions of the cffi extension, whose
 * addresses configure() is given once, by pjrt._capi.native_runtime.
 *
 * PJRT_Buffer* values live in Python as cffi cdata objects (an Array's buffer
 * list). C gets the address behind one by assigning it into a cffi array whose
 * address it knows (cffi's own, checked conversion), and keeps it in an
 * AddressCache.
 *
 * Only the limited API is used, so the one abi3 wheel serves every Python. */
#ifndef PJRT_HOT_PATH_H_
#define PJRT_HOT_PATH_H_

#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"
#include "shim.h"
#include "host_reads.h"

#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030B0000
/* The buffer protocol entered the limited API in 3.11, with the struct and
 * functions CPython has had unchanged since 3.3; 3.10 exports the same
 * symbols, so declaring them here keeps one abi3 build for 3.10 too. */
typedef struct {
  void* buf;
  PyObject* obj;
  Py_ssize_t len;
  Py_ssize_t itemsize;
  int readonly;
  int ndim;
  char* format;
  Py_ssize_t* shape;
  Py_ssize_t* strides;
  Py_ssize_t* suboffsets;
  void* internal;
} Py_buffer;
PyAPI_FUNC(int) PyObject_GetBuffer(PyObject* obj, Py_buffer* view, int flags);
PyAPI_FUNC(void) PyBuffer_Release(Py_buffer* view);
#define PyBUF_WRITABLE 0x0001
#define PyBUF_FORMAT 0x0004
#define PyBUF_ND 0x0008
#define PyBUF_STRIDES (0x0010 | PyBUF_ND)
/* The slots' numbers are part of the stable ABI; 3.10 takes them in a type's
 * spec (it has since 3.9) but its limited headers hide them. */
#define Py_bf_getbuffer 1
#define Py_bf_releasebuffer 2
#endif

#ifndef Py_XSETREF /* not in the limited API before 3.12 */
#define Py_XSETREF(target, value)      \
  do {                                 \
    PyObject* old_ = (PyObject*)(target); \
    (target) = (value);                \
    Py_XDECREF(old_);                  \
  } while (0)
#endif

/* The most devices whose buffers C handles itself (more go through Python). */
#define MAX_DEVICES 64

/* ---- wiring (hot_path.c) ------------------------------------------------- */

typedef int (*call_run_fn)(pjrt_shim_call*);
typedef intptr_t (*host_address_fn)(const PJRT_Api*, PJRT_Buffer*, size_t, uintptr_t*);
typedef void (*buffer_destroy_fn)(const PJRT_Api*, PJRT_Buffer*);
typedef void (*error_destroy_fn)(const PJRT_Api*, PJRT_Error*);
typedef int (*buffer_wait_fn)(const PJRT_Api*, PJRT_Buffer*, int64_t, pjrt_shim_waiter**,
                              PJRT_Error**);
typedef PJRT_Error* (*waiter_finish_fn)(pjrt_shim_waiter*);

/* The cffi extension's functions this one calls, set once by configure(). */
typedef struct {
  PyObject* address_slot;            /* a cffi PJRT_Buffer*[1] */
  PJRT_Buffer** address_slot_memory; /* its memory */
  buffer_destroy_fn buffer_destroy;  /* pjrt_shim_buffer_destroy */
  error_destroy_fn error_destroy;    /* pjrt_shim_error_destroy */
  call_run_fn call_run;              /* pjrt_shim_call_run, the one launcher */
  host_address_fn host_address;      /* pjrt_host_address */
  buffer_wait_fn buffer_wait;        /* pjrt_shim_buffer_wait: a host view's first wait */
  waiter_finish_fn waiter_finish;    /* pjrt_shim_waiter_finish */
  int64_t wait_slice_ms;             /* how long that first wait may last */
  PyObject* wait_ready;    /* (api, buffer cdata): waits for its value, raises its error */
  PyObject* buffer_format; /* (dtype) -> its buffer-protocol format as bytes, or None */
} hp_wiring_t;
extern hp_wiring_t hp_wiring;

/* Interned strings and constants, made when the module is imported. */
typedef struct {
  PyObject* settle;
  PyObject* dtype;
  PyObject* itemsize;
  PyObject* collected;   /* an Array's deleted reason once collected */
  PyObject* buffers;     /* the kind of a parked release */
  PyObject* index_zero;
} hp_names_t;
extern hp_names_t hp_names;

extern PyTypeObject* hp_array_type;
extern PyTypeObject* hp_handle_type;

/* Called with each new Array that owns its buffers while set (NULL when not:
 * the constructor then pays one pointer test); pjrt._profiling.heap records
 * where arrays are made with it. */
extern PyObject* hp_array_site_recorder;

/* Set once a program the plugin runs may call into Python: launches then let
 * the GIL go (see BRIEF_LAUNCH_NS in call_plan.c). */
extern int hp_programs_call_python;

/* ---- handle_core.c ------------------------------------------------------- */

/* The addresses behind an owner's buffer cdata, kept with the cdata they were
 * read from (held, so that an address is never reused while cached). One
 * buffer: `source` and `address`; several: the tuple `sources` and
 * `addresses` (PyMem memory). */
typedef struct {
  PyObject* source;
  PJRT_Buffer* address;
  PyObject* sources;
  PJRT_Buffer** addresses;
} AddressCache;

/* The PJRT_Buffer* behind the cdata `buffer`, or NULL with an exception set
 * when it is not a PJRT_Buffer* cdata. */
PJRT_Buffer* hp_address_of(AddressCache* cache, PyObject* buffer);
/* The addresses of `count` buffers (`buffers`, a list), written to
 * out[d * stride]. Returns 0, or -1 with an exception set. */
int hp_addresses_of(AddressCache* cache, PyObject* buffers, Py_ssize_t count,
                    PJRT_Buffer** out, Py_ssize_t stride);
void hp_address_cache_clear(AddressCache* cache);

/* A CallPlan call running on a client: the buffers it passes to its launch
 * (see HandleCore.running_calls). */
typedef struct {
  PJRT_Buffer** arguments;
  Py_ssize_t count;
} HpRunningCall;

#define HP_RUNNING_CALLS 16

typedef struct {
  PyObject_HEAD
  PyObject* api;
  PyObject* table;
  PyObject* pointer;
  PyObject* closed;
  PyObject* closed_reason;
  PyObject* buffers;
  PyObject* executables;
  PyObject* viewed;
  PyObject* buffer_exports;
  PyObject* released_while_viewed;
  PyObject* holds;
  PyObject* pending_holds;
  PyObject* active;
  PyObject* tickets;
  PyObject* parked;
  PyObject* generation;
  PyObject* keep_alive;
  PyObject* lock;
  unsigned long long table_address; /* the PJRT_Api* behind `table` */
  /* CallPlan calls in `active` and the buffers each passes (an empty slot has
   * count 0): a release need not park for a running call that does not pass
   * its buffers. Without this, one call waiting (a thread preempted in its
   * launch) parked every output the GIL's holder let go meanwhile: hundreds
   * of entries, a collection of the young generation now and then, and their
   * buffers freed in a burst. A call not listed here (its slots all taken,
   * or not a CallPlan's) counts as using every buffer, as before. */
  HpRunningCall running_calls[HP_RUNNING_CALLS];
} HandleCore;

/* The start of a call: its ticket (a new reference), registered as active. */
PyObject* hp_begin_call(HandleCore* handle);
/* The end of a call: drops its ticket, frees what waited for it. Keeps an
 * exception already set. */
void hp_end_call(HandleCore* handle, PyObject* ticket);
/* Releases the buffers of `owner_id` (see handle_core.c). `cache` may be
 * NULL. Returns 0, or -1 with an exception set. */
int hp_release_buffers(HandleCore* handle, PyObject* owner_id, AddressCache* cache);

extern PyType_Spec hp_handle_spec;

/* ---- array_core.c -------------------------------------------------------- */

/* An Array's fields: (C name, Python name). The one list: the struct, the
 * member table, the collector's walk and the constructor are made from it,
 * and tests/test_native_core.py checks _native_runtime.pyi's stubs against it.
 * `_queries` keeps the answers of buffer queries an Array asks once (None
 * until the first; see _kept in pjrt/array.py), so that a query kept
 * on the Array needs no field of its own here. */
#define HP_ARRAY_FIELDS(apply)                                                  \
  apply(client, "_client") apply(handle, "_handle") apply(buffers, "_buffers")  \
  apply(devices, "_devices") apply(shape, "shape") apply(dtype, "dtype")        \
  apply(host_copy, "_host_copy") apply(host_view, "_host_view")                 \
  apply(deleted_reason, "_deleted_reason") apply(sharding, "_sharding")         \
  apply(parent, "_parent") apply(shared, "_shared")                             \
  apply(physical_order, "_physical_order") apply(queries, "_queries")

typedef struct {
  PyObject_HEAD
#define HP_DECLARE_FIELD(field, name) PyObject* field;
  HP_ARRAY_FIELDS(HP_DECLARE_FIELD)
#undef HP_DECLARE_FIELD
  AddressCache cache;
  Py_ssize_t exports;     /* buffer-protocol exports of this owner's memory alive */
  int host_state;         /* whether the memory is host memory: see host_views.c */
  uintptr_t host_address; /* where, once known */
  PyObject* interruption; /* the error (a Ctrl-C, say) that ended a wait of the
                           * buffer protocol, kept for __array__ */
  unsigned long interrupted_thread; /* the thread it ended the wait of */
} ArrayCore;

/* A new Array of `type` (ArrayCore or a subclass) owning `buffers` (a list,
 * one per device; registered under the new array's id with `handle`), made
 * without calling `type`. `addresses` (may be NULL) are the buffers'
 * PJRT_Buffer*, at addresses[d * stride]. Returns NULL with an exception set,
 * leaving the buffers to the caller. */
PyObject* hp_array_adopt(PyTypeObject* type, PyObject* client, PyObject* handle,
                         PyObject* buffers, PyObject* devices, PyObject* shape,
                         PyObject* dtype, PyObject* sharding,
                         PJRT_Buffer* const* addresses, Py_ssize_t stride);

extern PyType_Spec hp_array_spec;

/* ---- call_plan.c / host_views.c ------------------------------------------ */

extern PyType_Spec hp_plan_spec;

/* ArrayCore's buffer protocol (slots of hp_array_spec), and its method
 * _take_interruption(). */
int hp_array_getbuffer(PyObject* op, Py_buffer* view, int flags);
void hp_array_releasebuffer(PyObject* op, Py_buffer* view);
PyObject* hp_array_take_interruption(PyObject* op, PyObject* unused);

#endif /* PJRT_HOT_PATH_H_ */
