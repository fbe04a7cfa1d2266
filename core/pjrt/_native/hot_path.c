/* pjrt._hot_path: the per-call path of single-device programs, in CPython's C API.
 *
 * Everything else in the core reaches the plugin through the cffi extension
 * (_pjrt_cffi). A call made in a loop, though, was mostly Python around one
 * cffi call: checking each argument, taking the ownership ticket, building the
 * output Arrays, and freeing each one again in a Python __del__. This module
 * does those steps in C and nothing else; it calls the plugin only through two
 * functions of the cffi extension (pjrt_shim_call_run and
 * pjrt_shim_buffer_destroy), whose addresses it is given at set-up.
 *
 * Its three types:
 *   ArrayCore  - the fields of pjrt.array.Array, its base class, so that C
 *                reads and fills them directly and frees an Array's buffer
 *                when it is collected (tp_finalize);
 *   HandleCore - the fields of pjrt._capi.handles.ClientHandle, its base
 *                class, which that freeing reads;
 *   CallPlan   - one single-device executable's per-call path: checks the
 *                arguments against the parameters, runs the program, wraps
 *                the outputs. Anything it does not handle it leaves alone and
 *                answers None, and the caller takes the full Python path,
 *                which reports every error.
 *
 * The ownership rules are pjrt._capi.handles's, unchanged: a call holds a
 * ticket on its client while the GIL is released around the plugin; a buffer
 * is freed by whoever takes its list out of the handle's registry, and only
 * when no other call is running (otherwise the Python path parks it).
 *
 * PJRT_Buffer* values live in Python as cffi cdata objects (an Array's buffer
 * list). C gets the address behind one by assigning it into a cffi array whose
 * address it knows (cffi's own, checked conversion), and makes one from an
 * address by indexing such an array; an Array caches its buffer's address.
 *
 * Only the limited API is used, so the one abi3 wheel serves every Python. */
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
#define PyBUF_ND 0x0008
#define PyBUF_STRIDES (0x0010 | PyBUF_ND)
#endif

#ifndef Py_XSETREF /* not in the limited API before 3.12 */
#define Py_XSETREF(target, value)      \
  do {                                 \
    PyObject* old_ = (PyObject*)(target); \
    (target) = (value);                \
    Py_XDECREF(old_);                  \
  } while (0)
#endif

typedef int (*call_run_fn)(pjrt_shim_call*);
typedef int (*execute_fn)(const PJRT_Api*, PJRT_LoadedExecutable*, PJRT_Buffer**, size_t,
                          size_t, PJRT_Buffer**, size_t, const int64_t*, size_t,
                          PJRT_Device*, PJRT_Event**, PJRT_Error**);

typedef intptr_t (*host_read_fn)(const PJRT_Api*, PJRT_Buffer*, void*, size_t);

/* The most devices whose buffers C frees itself (more go through Python). */
#define MAX_DEVICES 64
typedef void (*buffer_destroy_fn)(const PJRT_Api*, PJRT_Buffer*);

/* Set once by configure(). */
static PyObject* address_slot;               /* a cffi PJRT_Buffer*[1] */
static PJRT_Buffer** address_slot_memory;    /* its memory */
static buffer_destroy_fn buffer_destroy;      /* pjrt_shim_buffer_destroy */
static PyObject* str_release_buffers;
static PyObject* str_settle;
static PyObject* str_dtype;
static PyObject* str_collected;
static PyObject* index_zero;
static PyObject* str_itemsize;
static host_read_fn host_read;          /* pjrt_host_read, set by configure_reads() */
static Py_ssize_t small_read_limit;     /* reads of this many bytes or more are views */

static PyTypeObject* ArrayCore_Type;
static PyTypeObject* HandleCore_Type;

/* ---- HandleCore ---------------------------------------------------------- */

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
} HandleCore;

#define HANDLE_FIELD(name, field) \
  {name, T_OBJECT_EX, offsetof(HandleCore, field), 0, NULL}
static PyMemberDef handle_members[] = {
    HANDLE_FIELD("api", api),
    HANDLE_FIELD("table", table),
    HANDLE_FIELD("pointer", pointer),
    HANDLE_FIELD("closed", closed),
    HANDLE_FIELD("closed_reason", closed_reason),
    HANDLE_FIELD("buffers", buffers),
    HANDLE_FIELD("executables", executables),
    HANDLE_FIELD("viewed", viewed),
    HANDLE_FIELD("released_while_viewed", released_while_viewed),
    HANDLE_FIELD("holds", holds),
    HANDLE_FIELD("pending_holds", pending_holds),
    HANDLE_FIELD("active", active),
    HANDLE_FIELD("tickets", tickets),
    HANDLE_FIELD("parked", parked),
    HANDLE_FIELD("generation", generation),
    HANDLE_FIELD("keep_alive", keep_alive),
    HANDLE_FIELD("_lock", lock),
    {"_table_address", T_ULONGLONG, offsetof(HandleCore, table_address), 0,
     "the address of the PJRT_Api table (`table`), for the C side"},
    {NULL, 0, 0, 0, NULL}};

#define HANDLE_FIELDS(apply)                                                  \
  apply(api) apply(table) apply(pointer) apply(closed) apply(closed_reason)   \
  apply(buffers) apply(executables) apply(viewed) apply(released_while_viewed) \
  apply(holds) apply(pending_holds) apply(active) apply(tickets) apply(parked) \
  apply(generation) apply(keep_alive) apply(lock)

static int handle_traverse(PyObject* op, visitproc visit, void* arg) {
  HandleCore* self = (HandleCore*)op;
  Py_VISIT(Py_TYPE(op));
#define VISIT_FIELD(field) Py_VISIT(self->field);
  HANDLE_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
  return 0;
}

static int handle_clear(PyObject* op) {
  HandleCore* self = (HandleCore*)op;
#define CLEAR_FIELD(field) Py_CLEAR(self->field);
  HANDLE_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
  return 0;
}

static void handle_dealloc(PyObject* op) {
  PyTypeObject* type = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  handle_clear(op);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(op);
  Py_DECREF(type);
}

static PyType_Slot handle_slots[] = {
    {Py_tp_doc, "The fields of a ClientHandle (pjrt._capi.handles), readable from C."},
    {Py_tp_members, handle_members},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_dealloc, handle_dealloc},
    {0, NULL}};

static PyType_Spec handle_spec = {
    "pjrt._hot_path.HandleCore", sizeof(HandleCore), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, handle_slots};

/* handle.settle(), keeping an exception already set. */
static void settle(PyObject* handle) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* result = PyObject_CallMethodObjArgs(handle, str_settle, NULL);
  if (result == NULL) {
    PyErr_WriteUnraisable(handle);
  }
  Py_XDECREF(result);
  PyErr_Restore(type, value, traceback);
}

/* The end of a call: drops its ticket, frees what waited for it. */
static void end_call(HandleCore* handle, PyObject* ticket) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyDict_DelItem(handle->active, ticket) < 0) {
    PyErr_Clear();
  }
  Py_DECREF(ticket);
  PyErr_Restore(type, value, traceback);
  if (PyList_Size(handle->parked) != 0 || handle->closed != Py_False) {
    settle((PyObject*)handle);
  }
}

/* The start of a call: its ticket (a new reference), registered as active. */
static PyObject* begin_call(HandleCore* handle) {
  PyObject* ticket = PyIter_Next(handle->tickets);
  if (ticket == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "the client's tickets ran out");
    }
    return NULL;
  }
  if (PyDict_SetItem(handle->active, ticket, Py_None) < 0) {
    Py_DECREF(ticket);
    return NULL;
  }
  return ticket;
}

/* ---- ArrayCore ----------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject* client;
  PyObject* handle;
  PyObject* buffers;
  PyObject* devices;
  PyObject* shape;
  PyObject* dtype;
  PyObject* host_copy;
  PyObject* host_view;
  PyObject* deleted_reason;
  PyObject* sharding;
  PyObject* parent;
  PyObject* shared;
  PyObject* physical_order;
  /* The cdata `address` was read from (kept, so that its address is never
   * reused by another one while cached). */
  PyObject* address_source;
  PJRT_Buffer* address;
  /* The same for an array of several buffers: the tuple of their cdata, and
   * their addresses (PyMem memory). */
  PyObject* address_sources;
  PJRT_Buffer** addresses;
} ArrayCore;

#define ARRAY_FIELD(name, field) \
  {name, T_OBJECT_EX, offsetof(ArrayCore, field), 0, NULL}
static PyMemberDef array_members[] = {
    ARRAY_FIELD("_client", client),
    ARRAY_FIELD("_handle", handle),
    ARRAY_FIELD("_buffers", buffers),
    ARRAY_FIELD("_devices", devices),
    ARRAY_FIELD("shape", shape),
    ARRAY_FIELD("dtype", dtype),
    ARRAY_FIELD("_host_copy", host_copy),
    ARRAY_FIELD("_host_view", host_view),
    ARRAY_FIELD("_deleted_reason", deleted_reason),
    ARRAY_FIELD("_sharding", sharding),
    ARRAY_FIELD("_parent", parent),
    ARRAY_FIELD("_shared", shared),
    ARRAY_FIELD("_physical_order", physical_order),
    {NULL, 0, 0, 0, NULL}};

#define ARRAY_FIELDS(apply)                                                \
  apply(client) apply(handle) apply(buffers) apply(devices) apply(shape)   \
  apply(dtype) apply(host_copy) apply(host_view) apply(deleted_reason)     \
  apply(sharding) apply(parent) apply(shared) apply(physical_order)        \
  apply(address_source) apply(address_sources)

static int array_traverse(PyObject* op, visitproc visit, void* arg) {
  ArrayCore* self = (ArrayCore*)op;
  Py_VISIT(Py_TYPE(op));
#define VISIT_FIELD(field) Py_VISIT(self->field);
  ARRAY_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
  return 0;
}

static int array_clear(PyObject* op) {
  ArrayCore* self = (ArrayCore*)op;
#define CLEAR_FIELD(field) Py_CLEAR(self->field);
  ARRAY_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
  PyMem_Free(self->addresses);
  self->addresses = NULL;
  return 0;
}

static void array_dealloc(PyObject* op) {
  PyTypeObject* type = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  array_clear(op);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(op);
  Py_DECREF(type);
}

/* The PJRT_Buffer* behind the cdata `buffer` (one of the array's), or NULL
 * with an exception set when it is not a PJRT_Buffer* cdata. */
static PJRT_Buffer* buffer_address(ArrayCore* array, PyObject* buffer) {
  if (array->address_source == buffer) {
    return array->address;
  }
  if (PyObject_SetItem(address_slot, index_zero, buffer) < 0) {
    return NULL;
  }
  PJRT_Buffer* address = address_slot_memory[0];
  Py_INCREF(buffer);
  Py_XSETREF(array->address_source, buffer);
  array->address = address;
  return address;
}

/* The addresses of the array's `count` buffers (`buffers`, a list), written
 * to out[d * stride]. Returns 0, or -1 with an exception set. */
static int buffer_addresses(ArrayCore* array, PyObject* buffers, Py_ssize_t count,
                            PJRT_Buffer** out, Py_ssize_t stride) {
  if (count == 1) {
    PJRT_Buffer* address = buffer_address(array, PyList_GetItem(buffers, 0));
    out[0] = address;
    return address == NULL ? -1 : 0;
  }
  PyObject* sources = array->address_sources;
  int cached = sources != NULL && array->addresses != NULL && PyTuple_Size(sources) == count;
  for (Py_ssize_t d = 0; cached && d < count; ++d) {
    cached = PyList_GetItem(buffers, d) == PyTuple_GetItem(sources, d);
  }
  if (!cached) {
    PyObject* fresh = PyList_AsTuple(buffers);
    PJRT_Buffer** addresses = PyMem_Malloc(count * sizeof(PJRT_Buffer*));
    if (fresh == NULL || addresses == NULL) {
      Py_XDECREF(fresh);
      PyMem_Free(addresses);
      if (!PyErr_Occurred()) {
        PyErr_NoMemory();
      }
      return -1;
    }
    for (Py_ssize_t d = 0; d < count; ++d) {
      if (PyObject_SetItem(address_slot, index_zero, PyTuple_GetItem(fresh, d)) < 0) {
        Py_DECREF(fresh);
        PyMem_Free(addresses);
        return -1;
      }
      addresses[d] = address_slot_memory[0];
    }
    Py_XSETREF(array->address_sources, fresh);
    PyMem_Free(array->addresses);
    array->addresses = addresses;
  }
  for (Py_ssize_t d = 0; d < count; ++d) {
    out[d * stride] = array->addresses[d];
  }
  return 0;
}

/* ClientHandle.release_buffers(id(array)) for the common case (at most
 * MAX_DEVICES buffers, no other call running, nothing parked, no host memory
 * held, client open): the same steps, without Python frames. Returns 1 when
 * done, 0 when the Python method must run instead (nothing was changed), -1 on
 * error. The ticket covers everything from the look-up to the destroy, during
 * which the plugin may call back into Python (a DLPack deleter). */
static int release_owned_buffer(ArrayCore* array, PyObject* owner_id) {
  HandleCore* handle = (HandleCore*)array->handle;
  if (handle->closed != Py_False || handle->table_address == 0 ||
      handle->buffers == NULL || handle->active == NULL || handle->parked == NULL ||
      handle->holds == NULL || handle->viewed == NULL || handle->tickets == NULL ||
      !PyDict_CheckExact(handle->buffers) || !PyDict_CheckExact(handle->active) ||
      !PyList_CheckExact(handle->parked) || !PyDict_CheckExact(handle->holds) ||
      !PyDict_CheckExact(handle->viewed) || PyDict_Size(handle->active) != 0 ||
      PyList_Size(handle->parked) != 0 || PyDict_Size(handle->holds) != 0) {
    return 0;
  }
  /* The ticket comes first: reading the addresses of a multi-buffer array may
   * allocate, and so run a collection, and other threads meanwhile; under the
   * ticket none of them can free these buffers (a close parks its teardown). */
  PyObject* ticket = begin_call(handle);
  if (ticket == NULL) {
    return -1;
  }
  int done = 0;
  PyObject* buffers = PyDict_GetItem(handle->buffers, owner_id); /* borrowed */
  Py_XINCREF(buffers);
  Py_ssize_t count = buffers != NULL && PyList_CheckExact(buffers) ? PyList_Size(buffers) : 0;
  PJRT_Buffer* addresses[MAX_DEVICES];
  if (buffers == NULL) {
    done = 1; /* nothing registered: a shard, or freed already */
  } else if (count < 1 || count > MAX_DEVICES ||
             buffer_addresses(array, buffers, count, addresses, 1) < 0) {
    PyErr_Clear(); /* the Python path frees it */
  } else if (PyDict_GetItem(handle->buffers, owner_id) != buffers) {
    done = 1; /* taken meanwhile by whoever frees it */
  } else if (PyDict_Size(handle->active) == 1 && PyList_Size(handle->parked) == 0 &&
             PyDict_Size(handle->holds) == 0 && handle->closed == Py_False) {
    /* Still no other call running: none can be using the buffers. */
    done = PyDict_DelItem(handle->buffers, owner_id) == 0 ? 1 : -1;
    if (done == 1 && PyDict_Size(handle->viewed) != 0 &&
        PyDict_GetItem(handle->viewed, owner_id) != NULL &&
        PyDict_DelItem(handle->viewed, owner_id) < 0) {
      PyErr_Clear();
    }
    for (Py_ssize_t d = 0; done == 1 && d < count; ++d) {
      buffer_destroy((const PJRT_Api*)(uintptr_t)handle->table_address, addresses[d]);
    }
  }
  Py_XDECREF(buffers);
  end_call(handle, ticket);
  return done;
}

/* What Array.__del__ did: mark the array collected, hand its buffers back. */
static void array_finalize(PyObject* op) {
  ArrayCore* self = (ArrayCore*)op;
  PyObject *type, *value, *traceback;
  if (self->handle == NULL) {
    return; /* never filled in */
  }
  PyErr_Fetch(&type, &value, &traceback);
  Py_INCREF(Py_None);
  Py_XSETREF(self->buffers, Py_None);
  Py_INCREF(str_collected);
  Py_XSETREF(self->deleted_reason, str_collected);
  PyObject* owner_id = PyLong_FromVoidPtr(op);
  int done = -1;
  if (owner_id != NULL) {
    done = PyObject_TypeCheck(self->handle, HandleCore_Type)
               ? release_owned_buffer(self, owner_id)
               : 0;
    if (done == 0) {
      PyObject* result = PyObject_CallMethodObjArgs(self->handle, str_release_buffers,
                                                    owner_id, NULL);
      done = result == NULL ? -1 : 1;
      Py_XDECREF(result);
    }
    Py_DECREF(owner_id);
  }
  if (done < 0) {
    PyErr_WriteUnraisable(op);
  }
  PyErr_Restore(type, value, traceback);
}

static PyType_Slot array_slots[] = {
    {Py_tp_doc, "The fields of a pjrt Array, readable from C (see pjrt.array.Array)."},
    {Py_tp_members, array_members},
    {Py_tp_traverse, array_traverse},
    {Py_tp_clear, array_clear},
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_finalize, array_finalize},
    {0, NULL}};

static PyType_Spec array_spec = {
    "pjrt._hot_path.ArrayCore", sizeof(ArrayCore), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, array_slots};

/* ---- CallPlan ------------------------------------------------------------ */

/* One caller's call struct (pjrt_shim_call), made by the plan's `new_call`
 * (Python, so that cffi owns its memory) and reused. */
typedef struct {
  PyObject* owner;      /* keeps the struct and its arrays alive */
  pjrt_shim_call* call;
  PyObject* outputs;    /* the cffi PJRT_Buffer*[] behind call->outputs */
  int64_t* keep;        /* non-donatable argument indices */
  Py_buffer* views;     /* host arguments' buffers, during a call */
  char* viewing;
} CallEntry;

typedef struct {
  PyObject_HEAD
  int live;      /* cleared when the executable is unloaded */
  int inline_;   /* launches run on the calling thread (see pjrt._capi.long_runs) */
  Py_ssize_t num_parameters;
  Py_ssize_t num_outputs;
  Py_ssize_t num_devices;
  PyObject* handle;
  PyObject* client;
  PyObject* device;             /* devices[0] */
  PyObject* devices;            /* the executable's, in its order */
  PyObject* array_type;
  PyObject* ndarray_type;
  PyObject* parameter_shapes;   /* tuple */
  PyObject* parameter_dtypes;   /* tuple */
  char* host_ok;                /* per parameter: host values may be copied */
  Py_ssize_t* host_dims;        /* per parameter: ndim entries, then ndim strides */
  Py_ssize_t* host_offsets;     /* where each parameter's entries start */
  PyObject* output_shapes;      /* tuple (global shapes) */
  PyObject* output_dtypes;      /* tuple */
  PyObject* output_shardings;   /* tuple; None each on one device */
  /* Several devices: per parameter, the last (sharding, shape, dtype) `accept`
   * approved (a tuple, or NULL): an argument with that very sharding object
   * and that shape and dtype is laid out as the parameter needs. */
  PyObject* accept;
  PyObject** accepted;
  PyObject* donated;            /* tuple of parameter indices */
  PyObject* new_call;
  PyObject* prepare_donations;
  PyObject* consume_donated;
  PyObject* raise_error;
  call_run_fn call_run;         /* one device: pjrt_shim_call_run */
  execute_fn execute;           /* several: pjrt_shim_execute */
  CallEntry** pool;
  Py_ssize_t pool_size;
  Py_ssize_t pool_capacity;
} CallPlan;

static void entry_free(CallEntry* entry) {
  Py_XDECREF(entry->owner);
  Py_XDECREF(entry->outputs);
  PyMem_Free(entry->keep);
  PyMem_Free(entry->views);
  PyMem_Free(entry->viewing);
  PyMem_Free(entry);
}

static CallEntry* entry_new(CallPlan* plan) {
  PyObject* made = PyObject_CallObject(plan->new_call, NULL);
  if (made == NULL) {
    return NULL;
  }
  PyObject *owner, *address, *outputs;
  if (!PyArg_ParseTuple(made, "OOO", &owner, &address, &outputs)) {
    Py_DECREF(made);
    return NULL;
  }
  Py_ssize_t count = plan->num_parameters > 0 ? plan->num_parameters : 1;
  CallEntry* entry = PyMem_Calloc(1, sizeof(CallEntry));
  if (entry == NULL) {
    Py_DECREF(made);
    PyErr_NoMemory();
    return NULL;
  }
  entry->call = (pjrt_shim_call*)PyLong_AsVoidPtr(address);
  entry->owner = owner;
  entry->outputs = outputs;
  Py_INCREF(owner);
  Py_INCREF(outputs);
  Py_DECREF(made);
  entry->keep = PyMem_Calloc(count, sizeof(int64_t));
  entry->views = PyMem_Calloc(count, sizeof(Py_buffer));
  entry->viewing = PyMem_Calloc(count, 1);
  if (entry->call == NULL || entry->keep == NULL || entry->views == NULL ||
      entry->viewing == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_NoMemory();
    }
    entry_free(entry);
    return NULL;
  }
  return entry;
}

static CallEntry* take_entry(CallPlan* plan) {
  if (plan->pool_size > 0) {
    return plan->pool[--plan->pool_size];
  }
  return entry_new(plan);
}

static void put_entry(CallPlan* plan, CallEntry* entry) {
  if (plan->pool_size == plan->pool_capacity) {
    Py_ssize_t capacity = plan->pool_capacity ? plan->pool_capacity * 2 : 4;
    CallEntry** pool = PyMem_Realloc(plan->pool, capacity * sizeof(CallEntry*));
    if (pool == NULL) {
      entry_free(entry); /* only memory: the next call makes another */
      return;
    }
    plan->pool = pool;
    plan->pool_capacity = capacity;
  }
  plan->pool[plan->pool_size++] = entry;
}

/* Drops the host arguments' buffer views and pointers of a call. */
static void let_go_of_host_values(CallPlan* plan, CallEntry* entry) {
  for (Py_ssize_t i = 0; i < plan->num_parameters; ++i) {
    entry->call->host_data[i] = NULL;
    if (entry->viewing[i]) {
      entry->viewing[i] = 0;
      PyBuffer_Release(&entry->views[i]);
    }
  }
}

/* 1 when `value` is `expected` or equal to it, 0 otherwise (errors cleared). */
static int same(PyObject* value, PyObject* expected) {
  if (value == expected) {
    return 1;
  }
  int equal = PyObject_RichCompareBool(value, expected, Py_EQ);
  if (equal < 0) {
    PyErr_Clear();
    return 0;
  }
  return equal;
}

/* Whether `array`'s shards sit on the plan's devices, in the plan's order. */
static int on_plan_devices(CallPlan* plan, ArrayCore* array) {
  PyObject* devices = array->devices;
  if (devices == plan->devices) {
    return 1;
  }
  if (devices == NULL || !PyTuple_CheckExact(devices) ||
      PyTuple_Size(devices) != plan->num_devices) {
    return 0;
  }
  for (Py_ssize_t d = 0; d < plan->num_devices; ++d) {
    if (PyTuple_GetItem(devices, d) != PyTuple_GetItem(plan->devices, d)) {
      return 0;
    }
  }
  return 1;
}

/* Places global argument i of a program on several devices: 1 when it can go
 * this way, 0 when not, -1 on error. */
static int place_global_argument(CallPlan* plan, CallEntry* entry, Py_ssize_t i,
                                 PyObject* argument) {
  if ((PyObject*)Py_TYPE(argument) != plan->array_type) {
    return 0;
  }
  ArrayCore* array = (ArrayCore*)argument;
  if (array->parent != Py_None || array->physical_order != Py_None ||
      array->sharding == NULL || array->sharding == Py_None || array->shape == NULL ||
      array->dtype == NULL || !on_plan_devices(plan, array)) {
    return 0;
  }
  PyObject* accepted = plan->accepted[i];
  if (accepted == NULL || PyTuple_GetItem(accepted, 0) != array->sharding ||
      !same(array->shape, PyTuple_GetItem(accepted, 1)) ||
      !same(array->dtype, PyTuple_GetItem(accepted, 2))) {
    /* Python says whether this sharding lays the argument out as the parameter
     * needs (the sharding objects are immutable, so the answer is kept). */
    PyObject* index = PyLong_FromSsize_t(i);
    PyObject* answer =
        index ? PyObject_CallFunctionObjArgs(plan->accept, index, argument, NULL) : NULL;
    Py_XDECREF(index);
    if (answer == NULL) {
      return -1;
    }
    int fits = answer == Py_True;
    Py_DECREF(answer);
    if (!fits) {
      return 0;
    }
    PyObject* entry_tuple = PyTuple_Pack(3, array->sharding, array->shape, array->dtype);
    if (entry_tuple == NULL) {
      return -1;
    }
    Py_XSETREF(plan->accepted[i], entry_tuple);
  }
  /* Read after the Python call above, which may let other threads run. */
  PyObject* buffers = array->buffers;
  if (buffers == NULL || !PyList_CheckExact(buffers) ||
      PyList_Size(buffers) != plan->num_devices) {
    return 0;
  }
  if (buffer_addresses(array, buffers, plan->num_devices, entry->call->arguments + i,
                       plan->num_parameters) < 0) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

/* Places argument i into the call: 1 when it can go this way, 0 when not, -1
 * on error. */
static int place_argument(CallPlan* plan, CallEntry* entry, Py_ssize_t i,
                          PyObject* argument, int copy_host_values) {
  pjrt_shim_call* call = entry->call;
  if (plan->num_devices != 1) {
    return place_global_argument(plan, entry, i, argument);
  }
  if ((PyObject*)Py_TYPE(argument) == plan->array_type) {
    ArrayCore* array = (ArrayCore*)argument;
    PyObject* buffers = array->buffers;
    PyObject* devices = array->devices;
    if (buffers == NULL || !PyList_CheckExact(buffers) || PyList_Size(buffers) != 1 ||
        devices == NULL || !PyTuple_CheckExact(devices) || PyTuple_Size(devices) < 1 ||
        PyTuple_GetItem(devices, 0) != plan->device || array->parent != Py_None ||
        array->physical_order != Py_None || array->shape == NULL || array->dtype == NULL ||
        !same(array->shape, PyTuple_GetItem(plan->parameter_shapes, i)) ||
        !same(array->dtype, PyTuple_GetItem(plan->parameter_dtypes, i))) {
      return 0;
    }
    PJRT_Buffer* address = buffer_address(array, PyList_GetItem(buffers, 0));
    if (address == NULL) {
      PyErr_Clear();
      return 0;
    }
    call->arguments[i] = address;
    call->host_data[i] = NULL;
    return 1;
  }
  if (!copy_host_values || !plan->host_ok[i] ||
      (PyObject*)Py_TYPE(argument) != plan->ndarray_type) {
    return 0;
  }
  PyObject* dtype = PyObject_GetAttr(argument, str_dtype);
  if (dtype == NULL) {
    PyErr_Clear();
    return 0;
  }
  int same_dtype = same(dtype, PyTuple_GetItem(plan->parameter_dtypes, i));
  Py_DECREF(dtype);
  if (!same_dtype) {
    return 0;
  }
  Py_buffer* view = &entry->views[i];
  if (PyObject_GetBuffer(argument, view, PyBUF_STRIDES) < 0) {
    PyErr_Clear();
    return 0;
  }
  entry->viewing[i] = 1;
  const Py_ssize_t* expected = plan->host_dims + plan->host_offsets[i];
  Py_ssize_t ndim = (plan->host_offsets[i + 1] - plan->host_offsets[i]) / 2;
  if (view->ndim != ndim || view->buf == NULL) {
    return 0;
  }
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    if (view->shape[d] != expected[d] || view->strides[d] != expected[ndim + d]) {
      return 0;
    }
  }
  call->host_data[i] = view->buf;
  return 1;
}

/* The cdata of the plugin's output at `position` of the call's output array
 * (cffi arrays are mappings to the C API, not sequences). */
static PyObject* output_buffer(CallEntry* entry, Py_ssize_t position) {
  PyObject* index = PyLong_FromSsize_t(position);
  PyObject* buffer = index != NULL ? PyObject_GetItem(entry->outputs, index) : NULL;
  Py_XDECREF(index);
  return buffer;
}

/* A new Array for output k of a finished call, owning its buffers (one per
 * device, found device-major in the call's output array). */
static PyObject* adopt_output(CallPlan* plan, CallEntry* entry, Py_ssize_t k) {
  PyTypeObject* type = (PyTypeObject*)plan->array_type;
  Py_ssize_t count = plan->num_devices;
  PyObject* buffers = PyList_New(count);
  if (buffers == NULL) {
    return NULL;
  }
  for (Py_ssize_t d = 0; d < count; ++d) {
    PyObject* buffer = output_buffer(entry, d * plan->num_outputs + k);
    if (buffer == NULL) {
      Py_DECREF(buffers);
      return NULL;
    }
    PyList_SetItem(buffers, d, buffer); /* steals the new reference */
  }
  PyObject* sources = count == 1 ? NULL : PyList_AsTuple(buffers);
  PJRT_Buffer** addresses = count == 1 ? NULL : PyMem_Malloc(count * sizeof(PJRT_Buffer*));
  PyObject* made = NULL;
  if (count == 1 || (sources != NULL && addresses != NULL)) {
    made = ((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
  }
  if (made == NULL) {
    Py_DECREF(buffers);
    Py_XDECREF(sources);
    PyMem_Free(addresses);
    if (!PyErr_Occurred()) {
      PyErr_NoMemory();
    }
    return NULL;
  }
  ArrayCore* array = (ArrayCore*)made;
#define SET(field, value) (Py_INCREF(value), array->field = (value))
  SET(client, plan->client);
  SET(devices, plan->devices);
  SET(shape, PyTuple_GetItem(plan->output_shapes, k));
  SET(dtype, PyTuple_GetItem(plan->output_dtypes, k));
  SET(host_copy, Py_None);
  SET(host_view, Py_None);
  SET(deleted_reason, Py_None);
  SET(sharding, PyTuple_GetItem(plan->output_shardings, k));
  SET(parent, Py_None);
  SET(physical_order, Py_None);
  SET(shared, Py_False);
#undef SET
  array->buffers = buffers;
  if (count == 1) {
    PyObject* buffer = PyList_GetItem(buffers, 0);
    Py_INCREF(buffer);
    array->address_source = buffer;
    array->address = entry->call->outputs[k];
  } else {
    for (Py_ssize_t d = 0; d < count; ++d) {
      addresses[d] = entry->call->outputs[d * plan->num_outputs + k];
    }
    array->address_sources = sources;
    array->addresses = addresses;
  }
  /* Registered before `_handle` is set: until then a failure here leaves an
   * array whose finaliser does nothing, and the buffer to the caller. */
  PyObject* owner_id = PyLong_FromVoidPtr(made);
  HandleCore* handle = (HandleCore*)plan->handle;
  if (owner_id == NULL || PyDict_SetItem(handle->buffers, owner_id, buffers) < 0) {
    Py_XDECREF(owner_id);
    Py_DECREF(made);
    return NULL;
  }
  Py_DECREF(owner_id);
  Py_INCREF(plan->handle);
  array->handle = plan->handle;
  return made;
}

/* The outputs of a finished call as a list of new Arrays; a failure frees
 * the buffers no Array owns yet. */
static PyObject* adopt_outputs(CallPlan* plan, CallEntry* entry) {
  PyObject* outputs = PyList_New(plan->num_outputs);
  Py_ssize_t k = 0;
  if (outputs != NULL) {
    for (; k < plan->num_outputs; ++k) {
      PyObject* array = adopt_output(plan, entry, k);
      if (array == NULL) {
        break;
      }
      PyList_SetItem(outputs, k, array);
    }
    if (k == plan->num_outputs) {
      return outputs;
    }
  }
  HandleCore* handle = (HandleCore*)plan->handle;
  for (; k < plan->num_outputs; ++k) {
    for (Py_ssize_t d = 0; d < plan->num_devices; ++d) {
      buffer_destroy((const PJRT_Api*)(uintptr_t)handle->table_address,
                     entry->call->outputs[d * plan->num_outputs + k]);
    }
  }
  Py_XDECREF(outputs);
  return NULL;
}

static int64_t now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* pjrt_shim_call_run's counterpart for a program on several devices (no host
 * values): the same PJRT_SHIM_CALL_* bits; out of host memory is an error
 * with call->error NULL. */
static int launch_on_devices(CallPlan* plan, pjrt_shim_call* call) {
  PJRT_Error* error = NULL;
  int failed;
  int64_t started = now_ns();
  Py_BEGIN_ALLOW_THREADS
  failed = plan->execute(call->api, call->executable, call->arguments,
                         (size_t)plan->num_devices, call->num_arguments, call->outputs,
                         call->num_outputs, call->non_donatable, call->num_non_donatable,
                         NULL, NULL, &error);
  Py_END_ALLOW_THREADS
  call->error = error;
  return (failed || error != NULL ? PJRT_SHIM_CALL_ERROR : 0) |
         (now_ns() - started > call->slow_ns ? PJRT_SHIM_CALL_SLOW : 0);
}

/* Runs the prepared call, donating what the program donates. Returns the
 * outputs, or NULL with an exception. */
static PyObject* launch(CallPlan* plan, CallEntry* entry, PyObject* arguments) {
  pjrt_shim_call* call = entry->call;
  PyObject* keep = NULL;
  if (PyTuple_Size(plan->donated) != 0) {
    keep = PyObject_CallFunctionObjArgs(plan->prepare_donations, arguments, NULL);
    if (keep == NULL) {
      let_go_of_host_values(plan, entry);
      return NULL;
    }
    Py_ssize_t count = PyTuple_Check(keep) ? PyTuple_Size(keep) : -1;
    if (count < 0 || count > plan->num_parameters) {
      let_go_of_host_values(plan, entry);
      Py_DECREF(keep);
      PyErr_SetString(PyExc_SystemError, "bad non-donatable indices");
      return NULL;
    }
    for (Py_ssize_t j = 0; j < count; ++j) {
      entry->keep[j] = PyLong_AsLongLong(PyTuple_GetItem(keep, j));
    }
    if (PyErr_Occurred()) {
      let_go_of_host_values(plan, entry);
      Py_DECREF(keep);
      return NULL;
    }
    call->non_donatable = count ? entry->keep : NULL;
    call->num_non_donatable = (size_t)count;
  }
  int status;
  if (plan->num_devices == 1) {
    Py_BEGIN_ALLOW_THREADS
    status = plan->call_run(call);
    Py_END_ALLOW_THREADS
  } else {
    status = launch_on_devices(plan, call);
  }
  call->non_donatable = NULL;
  call->num_non_donatable = 0;
  let_go_of_host_values(plan, entry);
  if (status & PJRT_SHIM_CALL_SLOW) {
    plan->inline_ = 0;
  }
  if ((status & PJRT_SHIM_CALL_ERROR) && call->error == NULL) {
    Py_XDECREF(keep);
    return PyErr_NoMemory();
  }
  if (status & PJRT_SHIM_CALL_ERROR) {
    /* Takes call->error and raises it. */
    PyObject* none = PyObject_CallFunctionObjArgs(plan->raise_error, entry->owner, NULL);
    Py_XDECREF(none);
    Py_XDECREF(keep);
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_SystemError, "the plugin's error was not raised");
    }
    return NULL;
  }
  PyObject* outputs = adopt_outputs(plan, entry);
  if (keep != NULL) {
    PyObject* none = PyObject_CallFunctionObjArgs(plan->consume_donated, arguments, keep,
                                                  NULL);
    Py_DECREF(keep);
    if (none == NULL) {
      Py_XDECREF(outputs);
      return NULL;
    }
    Py_DECREF(none);
  }
  return outputs;
}

/* plan.run(arguments, copy_host_values): the outputs, or None when this call
 * must take the full path (nothing was done). */
static PyObject* plan_run(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
  CallPlan* plan = (CallPlan*)op;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "run(arguments, copy_host_values)");
    return NULL;
  }
  int copy_host_values = args[1] == Py_True;
  if (!plan->inline_ || !plan->live ||
      (!PyList_CheckExact(args[0]) && !PyTuple_CheckExact(args[0]))) {
    Py_RETURN_NONE;
  }
  /* A tuple of the arguments, held for the whole call: Python code that runs
   * meanwhile (a collection, `accept`) cannot change or free them under us. */
  PyObject* arguments =
      PyList_CheckExact(args[0]) ? PyList_AsTuple(args[0]) : (Py_INCREF(args[0]), args[0]);
  if (arguments == NULL) {
    return NULL;
  }
  Py_ssize_t count = PyTuple_Size(arguments);
  if (count != plan->num_parameters) {
    Py_DECREF(arguments);
    Py_RETURN_NONE;
  }
  HandleCore* handle = (HandleCore*)plan->handle;
  /* Every pointer is read after the ticket is taken (see pjrt._capi.handles). */
  PyObject* ticket = begin_call(handle);
  if (ticket == NULL) {
    Py_DECREF(arguments);
    return NULL;
  }
  PyObject* result = NULL;
  CallEntry* entry = take_entry(plan);
  if (entry == NULL) {
    end_call(handle, ticket);
    Py_DECREF(arguments);
    return NULL;
  }
  int placed = 1;
  for (Py_ssize_t i = 0; i < count && placed > 0; ++i) {
    placed = place_argument(plan, entry, i, PyTuple_GetItem(arguments, i), copy_host_values);
  }
  if (placed < 0) {
    let_go_of_host_values(plan, entry);
  } else if (placed && plan->live && handle->closed == Py_False) {
    result = launch(plan, entry, arguments);
  } else {
    let_go_of_host_values(plan, entry);
    Py_INCREF(Py_None);
    result = Py_None;
  }
  put_entry(plan, entry);
  end_call(handle, ticket);
  Py_DECREF(arguments);
  return result;
}

/* plan.drop_idle_calls(): frees the idle call structs; later calls make new
 * ones (which read the settings they copy, such as the slow-launch limit, anew). */
static PyObject* plan_drop_idle_calls(PyObject* op, PyObject* unused) {
  CallPlan* plan = (CallPlan*)op;
  while (plan->pool_size > 0) {
    entry_free(plan->pool[--plan->pool_size]);
  }
  Py_RETURN_NONE;
}

static PyMethodDef plan_methods[] = {
    {"drop_idle_calls", plan_drop_idle_calls, METH_NOARGS,
     "drop_idle_calls(): free the idle call structs; later calls make new ones"},
    {"run", (PyCFunction)(void (*)(void))plan_run, METH_FASTCALL,
     "run(arguments, copy_host_values) -> list of Arrays, or None: take the full path"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef plan_members[] = {
    {"live", T_INT, offsetof(CallPlan, live), 0,
     "cleared when the executable is unloaded: calls then take the full path"},
    {"inline", T_INT, offsetof(CallPlan, inline_), 0,
     "whether launches run on the calling thread (see pjrt._capi.long_runs)"},
    {NULL, 0, 0, 0, NULL}};

/* CallPlan(handle, client, devices, array_type, ndarray_type, parameters,
 *          outputs, donated, new_call, prepare_donations, consume_donated,
 *          raise_error, launch_address, accept=None)
 * devices: the executable's devices, in its order.
 * parameters: per parameter (shape, dtype, strides or None: host values of it
 *   are not copied by the call); on several devices only their number counts.
 * outputs: per output (global shape, dtype, sharding or None).
 * launch_address: pjrt_shim_call_run on one device, pjrt_shim_execute on
 *   several, where accept(index, argument) -> bool says whether a global
 *   argument's sharding, shape and dtype are the parameter's. */
static PyObject* plan_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *handle, *client, *devices, *array_type, *ndarray_type, *parameters, *outputs,
      *donated, *new_call, *prepare, *consume, *raise_error, *launch_address;
  PyObject* accept = Py_None;
  if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "CallPlan takes positional arguments");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "O!OO!O!O!O!O!O!OOOOO!|O", HandleCore_Type, &handle, &client,
                        &PyTuple_Type, &devices, &PyType_Type, &array_type, &PyType_Type,
                        &ndarray_type, &PyTuple_Type, &parameters, &PyTuple_Type, &outputs,
                        &PyTuple_Type, &donated, &new_call, &prepare, &consume, &raise_error,
                        &PyLong_Type, &launch_address, &accept)) {
    return NULL;
  }
  Py_ssize_t num_devices = PyTuple_Size(devices);
  if (!PyType_IsSubtype((PyTypeObject*)array_type, ArrayCore_Type)) {
    PyErr_SetString(PyExc_TypeError, "array_type must derive from ArrayCore");
    return NULL;
  }
  if (num_devices < 1 || num_devices > MAX_DEVICES || (num_devices > 1 && accept == Py_None)) {
    PyErr_SetString(PyExc_ValueError,
                    "a plan needs 1 to MAX_DEVICES devices, and accept on several");
    return NULL;
  }
  CallPlan* plan = (CallPlan*)((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
  if (plan == NULL) {
    return NULL;
  }
  Py_ssize_t count = PyTuple_Size(parameters);
  plan->num_parameters = count;
  plan->num_outputs = PyTuple_Size(outputs);
  plan->num_devices = num_devices;
  plan->live = 1;
  plan->inline_ = 0;
  void* launch = PyLong_AsVoidPtr(launch_address);
  if (num_devices == 1) {
    plan->call_run = (call_run_fn)launch;
  } else {
    plan->execute = (execute_fn)launch;
  }
#define KEEP(field, value) (Py_INCREF(value), plan->field = (value))
  KEEP(handle, handle);
  KEEP(client, client);
  KEEP(devices, devices);
  KEEP(device, PyTuple_GetItem(devices, 0));
  KEEP(array_type, array_type);
  KEEP(ndarray_type, ndarray_type);
  KEEP(donated, donated);
  KEEP(new_call, new_call);
  KEEP(prepare_donations, prepare);
  KEEP(consume_donated, consume);
  KEEP(raise_error, raise_error);
  KEEP(accept, accept);
#undef KEEP
  plan->parameter_shapes = PyTuple_New(count);
  plan->parameter_dtypes = PyTuple_New(count);
  plan->output_shapes = PyTuple_New(plan->num_outputs);
  plan->output_dtypes = PyTuple_New(plan->num_outputs);
  plan->output_shardings = PyTuple_New(plan->num_outputs);
  plan->host_ok = PyMem_Calloc(count + 1, 1);
  plan->host_offsets = PyMem_Calloc(count + 1, sizeof(Py_ssize_t));
  plan->accepted = PyMem_Calloc(count + 1, sizeof(PyObject*));
  if (launch == NULL || plan->parameter_shapes == NULL || plan->parameter_dtypes == NULL ||
      plan->output_shapes == NULL || plan->output_dtypes == NULL ||
      plan->output_shardings == NULL || plan->host_ok == NULL ||
      plan->host_offsets == NULL || plan->accepted == NULL) {
    goto fail;
  }
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *shape, *dtype, *strides;
    if (!PyArg_ParseTuple(PyTuple_GetItem(parameters, i), "O!OO", &PyTuple_Type, &shape,
                          &dtype, &strides)) {
      goto fail;
    }
    Py_INCREF(shape);
    PyTuple_SetItem(plan->parameter_shapes, i, shape);
    Py_INCREF(dtype);
    PyTuple_SetItem(plan->parameter_dtypes, i, dtype);
    plan->host_offsets[i] = total;
    total += 2 * PyTuple_Size(shape);
  }
  plan->host_offsets[count] = total;
  plan->host_dims = PyMem_Calloc(total + 1, sizeof(Py_ssize_t));
  if (plan->host_dims == NULL) {
    goto fail;
  }
  for (Py_ssize_t i = 0; i < count && num_devices == 1; ++i) {
    PyObject* parameter = PyTuple_GetItem(parameters, i);
    PyObject* shape = PyTuple_GetItem(parameter, 0);
    PyObject* strides = PyTuple_GetItem(parameter, 2);
    Py_ssize_t ndim = PyTuple_Size(shape);
    Py_ssize_t* dims = plan->host_dims + plan->host_offsets[i];
    if (strides == Py_None) {
      continue;
    }
    if (!PyTuple_Check(strides) || PyTuple_Size(strides) != ndim) {
      PyErr_SetString(PyExc_ValueError, "strides must match the shape");
      goto fail;
    }
    for (Py_ssize_t d = 0; d < ndim; ++d) {
      dims[d] = PyLong_AsSsize_t(PyTuple_GetItem(shape, d));
      dims[ndim + d] = PyLong_AsSsize_t(PyTuple_GetItem(strides, d));
    }
    if (PyErr_Occurred()) {
      goto fail;
    }
    plan->host_ok[i] = 1;
  }
  for (Py_ssize_t k = 0; k < plan->num_outputs; ++k) {
    PyObject *shape, *dtype;
    PyObject* sharding = Py_None;
    if (!PyArg_ParseTuple(PyTuple_GetItem(outputs, k), "OO|O", &shape, &dtype, &sharding)) {
      goto fail;
    }
    Py_INCREF(shape);
    PyTuple_SetItem(plan->output_shapes, k, shape);
    Py_INCREF(dtype);
    PyTuple_SetItem(plan->output_dtypes, k, dtype);
    Py_INCREF(sharding);
    PyTuple_SetItem(plan->output_shardings, k, sharding);
  }
  return (PyObject*)plan;
fail:
  if (!PyErr_Occurred()) {
    PyErr_NoMemory();
  }
  Py_DECREF(plan);
  return NULL;
}

static void plan_dealloc(PyObject* op) {
  CallPlan* plan = (CallPlan*)op;
  PyTypeObject* type = Py_TYPE(op);
  for (Py_ssize_t i = 0; i < plan->pool_size; ++i) {
    entry_free(plan->pool[i]);
  }
  if (plan->accepted != NULL) {
    for (Py_ssize_t i = 0; i < plan->num_parameters; ++i) {
      Py_XDECREF(plan->accepted[i]);
    }
  }
  PyMem_Free(plan->accepted);
  PyMem_Free(plan->pool);
  PyMem_Free(plan->host_ok);
  PyMem_Free(plan->host_dims);
  PyMem_Free(plan->host_offsets);
  Py_XDECREF(plan->handle);
  Py_XDECREF(plan->client);
  Py_XDECREF(plan->device);
  Py_XDECREF(plan->devices);
  Py_XDECREF(plan->array_type);
  Py_XDECREF(plan->ndarray_type);
  Py_XDECREF(plan->parameter_shapes);
  Py_XDECREF(plan->parameter_dtypes);
  Py_XDECREF(plan->output_shapes);
  Py_XDECREF(plan->output_dtypes);
  Py_XDECREF(plan->output_shardings);
  Py_XDECREF(plan->donated);
  Py_XDECREF(plan->new_call);
  Py_XDECREF(plan->prepare_donations);
  Py_XDECREF(plan->consume_donated);
  Py_XDECREF(plan->raise_error);
  Py_XDECREF(plan->accept);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(op);
  Py_DECREF(type);
}

static PyType_Slot plan_slots[] = {
    {Py_tp_doc, "An executable's per-call path (see pjrt.executable)."},
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_methods, plan_methods},
    {Py_tp_members, plan_members},
    {0, NULL}};

static PyType_Spec plan_spec = {"pjrt._hot_path.CallPlan", sizeof(CallPlan), 0,
                                Py_TPFLAGS_DEFAULT, plan_slots};

/* ---- small reads --------------------------------------------------------- */

/* The bytes of a small array's value, for `HostReads.__array__` to wrap: one
 * dense row-major buffer that is not shared, not a shard and not laid out
 * otherwise, smaller than the view threshold, whose value has been computed.
 * Anything else (including a value still being computed, or an error, which
 * the Python path then meets again and raises) gives None, having changed
 * nothing. The copy goes into a bytes object made for it, before anything
 * else can see it. */
static PyObject* read_small(PyObject* module, PyObject* argument) {
  if (host_read == NULL || !PyObject_TypeCheck(argument, ArrayCore_Type)) {
    Py_RETURN_NONE;
  }
  ArrayCore* array = (ArrayCore*)argument;
  if (array->handle == NULL || !PyObject_TypeCheck(array->handle, HandleCore_Type) ||
      array->sharding != Py_None || array->parent != Py_None || array->shared != Py_False ||
      array->physical_order != Py_None || array->shape == NULL ||
      !PyTuple_CheckExact(array->shape) || array->dtype == NULL) {
    Py_RETURN_NONE;
  }
  HandleCore* handle = (HandleCore*)array->handle;
  if (handle->closed != Py_False || handle->table_address == 0) {
    Py_RETURN_NONE;
  }
  PyObject* itemsize = PyObject_GetAttr(array->dtype, str_itemsize);
  Py_ssize_t size = itemsize != NULL ? PyLong_AsSsize_t(itemsize) : -1;
  Py_XDECREF(itemsize);
  for (Py_ssize_t d = 0; size >= 0 && size < small_read_limit &&
                         d < PyTuple_Size(array->shape); ++d) {
    Py_ssize_t extent = PyLong_AsSsize_t(PyTuple_GetItem(array->shape, d));
    size = extent < 0 ? -1 : size * extent;
  }
  if (size < 0 || size >= small_read_limit) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject* ticket = begin_call(handle);
  if (ticket == NULL) {
    return NULL;
  }
  PyObject* result = NULL;
  /* Read under the ticket: a delete() from now on waits for this read. */
  PyObject* buffers = array->buffers;
  PJRT_Buffer* address = NULL;
  if (buffers != NULL && PyList_CheckExact(buffers) && PyList_Size(buffers) == 1) {
    address = buffer_address(array, PyList_GetItem(buffers, 0));
  }
  if (address == NULL) {
    PyErr_Clear();
  } else {
    result = PyBytes_FromStringAndSize(NULL, size);
  }
  if (result != NULL) {
    const PJRT_Api* api = (const PJRT_Api*)(uintptr_t)handle->table_address;
    char* destination = PyBytes_AsString(result);
    intptr_t status;
    Py_BEGIN_ALLOW_THREADS
    status = host_read(api, address, destination, (size_t)size);
    Py_END_ALLOW_THREADS
    if (status != PJRT_HOST_READ_DONE) {
      if (status != PJRT_HOST_READ_NOT_READY) {
        PJRT_Error_Destroy_Args destroy;
        memset(&destroy, 0, sizeof(destroy));
        /* (the struct ends with `error`: its size as the header gives it) */
        destroy.struct_size = offsetof(PJRT_Error_Destroy_Args, error) + sizeof(destroy.error);
        destroy.error = (PJRT_Error*)status;
        api->PJRT_Error_Destroy(&destroy);
      }
      Py_CLEAR(result);
    }
  }
  end_call(handle, ticket);
  if (result == NULL && !PyErr_Occurred()) {
    Py_RETURN_NONE;
  }
  return result;
}

/* configure_reads(host_read_address, view_threshold_bytes) */
static PyObject* configure_reads(PyObject* module, PyObject* args) {
  PyObject* address;
  Py_ssize_t limit;
  if (!PyArg_ParseTuple(args, "O!n", &PyLong_Type, &address, &limit)) {
    return NULL;
  }
  host_read_fn function = (host_read_fn)PyLong_AsVoidPtr(address);
  if (function == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "configure_reads needs pjrt_host_read's address");
    }
    return NULL;
  }
  host_read = function;
  small_read_limit = limit;
  Py_RETURN_NONE;
}

/* ---- module -------------------------------------------------------------- */

/* configure(address_slot, address_slot_address, buffer_destroy_address) */
static PyObject* configure(PyObject* module, PyObject* args) {
  PyObject *slot, *slot_address, *destroy_address;
  if (!PyArg_ParseTuple(args, "OO!O!", &slot, &PyLong_Type, &slot_address, &PyLong_Type,
                        &destroy_address)) {
    return NULL;
  }
  PJRT_Buffer** memory = (PJRT_Buffer**)PyLong_AsVoidPtr(slot_address);
  buffer_destroy_fn destroy = (buffer_destroy_fn)PyLong_AsVoidPtr(destroy_address);
  if (memory == NULL || destroy == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "configure needs non-NULL addresses");
    }
    return NULL;
  }
  Py_INCREF(slot);
  Py_XSETREF(address_slot, slot);
  address_slot_memory = memory;
  buffer_destroy = destroy;
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"read_small", read_small, METH_O,
     "read_small(array) -> bytes of its value, or None: take the full read"},
    {"configure_reads", configure_reads, METH_VARARGS,
     "configure_reads(host_read_address, view_threshold_bytes): pjrt_host_read, and the size "
     "from which reads are views"},
    {"configure", configure, METH_VARARGS,
     "configure(address_slot, address_slot_address, buffer_destroy_address): the cffi "
     "PJRT_Buffer*[1] used to read a cdata's address, and pjrt_shim_buffer_destroy."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pjrt._hot_path",
    "The per-call path of single-device programs (see the C source's opening comment).",
    -1, module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hot_path(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == NULL) {
    return NULL;
  }
  str_release_buffers = PyUnicode_InternFromString("release_buffers");
  str_settle = PyUnicode_InternFromString("settle");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_collected = PyUnicode_InternFromString("garbage-collected");
  index_zero = PyLong_FromLong(0);
  str_itemsize = PyUnicode_InternFromString("itemsize");
  ArrayCore_Type = (PyTypeObject*)PyType_FromSpec(&array_spec);
  HandleCore_Type = (PyTypeObject*)PyType_FromSpec(&handle_spec);
  PyObject* plan_type = PyType_FromSpec(&plan_spec);
  if (str_release_buffers == NULL || str_settle == NULL || str_dtype == NULL ||
      str_collected == NULL || index_zero == NULL || str_itemsize == NULL || ArrayCore_Type == NULL || HandleCore_Type == NULL ||
      plan_type == NULL) {
    Py_XDECREF(plan_type);
    Py_DECREF(module);
    return NULL;
  }
  Py_INCREF(ArrayCore_Type);
  Py_INCREF(HandleCore_Type);
  if (PyModule_AddObject(module, "ArrayCore", (PyObject*)ArrayCore_Type) < 0 ||
      PyModule_AddObject(module, "HandleCore", (PyObject*)HandleCore_Type) < 0 ||
      PyModule_AddObject(module, "CallPlan", plan_type) < 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
