/* HandleCore: the fields of pjrt._capi.handles.ClientHandle and the rules
 * that run on them (see hot_path.h for the map of the extension).
 *
 * The ownership rules are pjrt._capi.handles's: a call holds a ticket on its
 * client while the GIL is released around the plugin; a buffer is freed by
 * whoever takes its list out of the handle's registry, and only when no other
 * call that may pass it is running (otherwise it is parked until the older
 * calls end; see calls_that_may_use). This
 * file is the one place those two rules are carried out; Python's handle
 * decides what a closed client raises, and settles what is parked. */
#include "hot_path.h"

/* ---- buffer addresses ---------------------------------------------------- */

PJRT_Buffer* hp_address_of(AddressCache* cache, PyObject* buffer) {
  if (cache->source == buffer) {
    return cache->address;
  }
  if (PyObject_SetItem(hp_wiring.address_slot, hp_names.index_zero, buffer) < 0) {
    return NULL;
  }
  PJRT_Buffer* address = hp_wiring.address_slot_memory[0];
  Py_INCREF(buffer);
  Py_XSETREF(cache->source, buffer);
  cache->address = address;
  return address;
}

int hp_addresses_of(AddressCache* cache, PyObject* buffers, Py_ssize_t count,
                    PJRT_Buffer** out, Py_ssize_t stride) {
  if (count == 1) {
    PJRT_Buffer* address = hp_address_of(cache, PyList_GetItem(buffers, 0));
    out[0] = address;
    return address == NULL ? -1 : 0;
  }
  PyObject* sources = cache->sources;
  int cached = sources != NULL && cache->addresses != NULL && PyTuple_Size(sources) == count;
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
      if (PyObject_SetItem(hp_wiring.address_slot, hp_names.index_zero,
                           PyTuple_GetItem(fresh, d)) < 0) {
        Py_DECREF(fresh);
        PyMem_Free(addresses);
        return -1;
      }
      addresses[d] = hp_wiring.address_slot_memory[0];
    }
    Py_XSETREF(cache->sources, fresh);
    PyMem_Free(cache->addresses);
    cache->addresses = addresses;
  }
  for (Py_ssize_t d = 0; d < count; ++d) {
    out[d * stride] = cache->addresses[d];
  }
  return 0;
}

void hp_address_cache_clear(AddressCache* cache) {
  Py_CLEAR(cache->source);
  Py_CLEAR(cache->sources);
  PyMem_Free(cache->addresses);
  cache->addresses = NULL;
  cache->address = NULL;
}

/* ---- the type ------------------------------------------------------------ */

#define HANDLE_FIELDS(apply)                                                  \
  apply(api) apply(table) apply(pointer) apply(closed) apply(closed_reason)   \
  apply(buffers) apply(executables) apply(viewed) apply(buffer_exports)       \
  apply(released_while_viewed)                                                \
  apply(holds) apply(pending_holds) apply(active) apply(tickets) apply(parked) \
  apply(generation) apply(keep_alive)

#define HANDLE_MEMBER(field) {#field, T_OBJECT_EX, offsetof(HandleCore, field), 0, NULL},
static PyMemberDef handle_members[] = {
    HANDLE_FIELDS(HANDLE_MEMBER)
    {"_lock", T_OBJECT_EX, offsetof(HandleCore, lock), 0, NULL},
    {"_table_address", T_ULONGLONG, offsetof(HandleCore, table_address), 0,
     "the address of the PJRT_Api table (`table`), for the C side"},
    {NULL, 0, 0, 0, NULL}};
#undef HANDLE_MEMBER

static int handle_traverse(PyObject* op, visitproc visit, void* arg) {
  HandleCore* self = (HandleCore*)op;
  Py_VISIT(Py_TYPE(op));
#define VISIT_FIELD(field) Py_VISIT(self->field);
  HANDLE_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
  Py_VISIT(self->lock);
  return 0;
}

static int handle_clear(PyObject* op) {
  HandleCore* self = (HandleCore*)op;
#define CLEAR_FIELD(field) Py_CLEAR(self->field);
  HANDLE_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
  Py_CLEAR(self->lock);
  return 0;
}

static void handle_dealloc(PyObject* op) {
  PyTypeObject* type = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  handle_clear(op);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(op);
  Py_DECREF(type);
}

/* ---- call tickets -------------------------------------------------------- */

/* handle.settle(), keeping an exception already set. */
static void settle(PyObject* handle) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* result = PyObject_CallMethodObjArgs(handle, hp_names.settle, NULL);
  if (result == NULL) {
    PyErr_WriteUnraisable(handle);
  }
  Py_XDECREF(result);
  PyErr_Restore(type, value, traceback);
}

/* The ticket of the oldest running call (borrowed: `active` keeps insertion
 * order, and a ticket is inserted when its call begins), or NULL when none
 * runs. */
static PyObject* oldest_active(HandleCore* handle) {
  Py_ssize_t position = 0;
  PyObject *key, *value;
  return PyDict_Next(handle->active, &position, &key, &value) ? key : NULL;
}

/* Whether the parked `entry` was parked before every running call began (so
 * none of them can be using what it holds): its ticket is older than
 * `oldest`, or no call runs. */
static int parked_before(PyObject* entry, PyObject* oldest) {
  if (!PyTuple_CheckExact(entry) || PyTuple_Size(entry) != 3) {
    return oldest == NULL;
  }
  if (oldest == NULL) {
    return 1;
  }
  int older = PyObject_RichCompareBool(PyTuple_GetItem(entry, 0), oldest, Py_LT);
  if (older < 0) {
    PyErr_Clear();
    return 1; /* settle() decides */
  }
  return older;
}

/* Whether settle() has anything to free among the parked entries. */
static int parked_freeable(HandleCore* handle) {
  PyObject* oldest = oldest_active(handle);
  Py_ssize_t count = PyList_Size(handle->parked);
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (parked_before(PyList_GetItem(handle->parked, i), oldest)) {
      return 1;
    }
  }
  return 0;
}

/* The buffers a parked entry releases, when it is a plain release of buffers
 * (kind "buffers", its list of cdata, no host memory held) that no running
 * call can be using: their addresses in out[0..*count), and 1. 0 otherwise
 * (settle() takes care of it). */
static int parked_plain_buffers(PyObject* entry, PyObject* oldest, PJRT_Buffer** out,
                                Py_ssize_t* count) {
  if (!PyTuple_CheckExact(entry) || PyTuple_Size(entry) != 3 ||
      !parked_before(entry, oldest)) {
    return 0;
  }
  PyObject* kind = PyTuple_GetItem(entry, 1);
  PyObject* payload = PyTuple_GetItem(entry, 2);
  if (kind != hp_names.buffers &&
      (!PyUnicode_Check(kind) || PyUnicode_CompareWithASCIIString(kind, "buffers") != 0)) {
    return 0;
  }
  if (!PyTuple_CheckExact(payload) || PyTuple_Size(payload) != 2) {
    return 0;
  }
  PyObject* buffers = PyTuple_GetItem(payload, 0);
  PyObject* holds = PyTuple_GetItem(payload, 1);
  if (holds != Py_None && !(PyList_CheckExact(holds) && PyList_Size(holds) == 0)) {
    return 0;
  }
  Py_ssize_t size = PyList_CheckExact(buffers) ? PyList_Size(buffers) : 0;
  if (size < 1 || size > MAX_DEVICES) {
    return 0;
  }
  for (Py_ssize_t d = 0; d < size; ++d) {
    if (PyObject_SetItem(hp_wiring.address_slot, hp_names.index_zero,
                         PyList_GetItem(buffers, d)) < 0) {
      PyErr_Clear();
      return 0;
    }
    out[d] = hp_wiring.address_slot_memory[0];
  }
  *count = size;
  return 1;
}

/* Frees the parked buffers that no running call can be using, with the GIL
 * held throughout (so no call begins, and the client is not closed, meanwhile),
 * as free_or_park frees buffers at once. Only plain releases of buffers of an
 * open client, and only under the handle's lock (settle() may be freeing on
 * another thread, having let the GIL go); everything else stays for settle().
 * Without this, with two or more threads calling, nearly every release is
 * parked (another call runs) and every call's end ran settle() in Python. */
static void free_parked_buffers(HandleCore* handle) {
  if (handle->closed != Py_False || handle->table_address == 0 || handle->lock == NULL ||
      handle->pending_holds == NULL || !PyList_CheckExact(handle->pending_holds) ||
      PyList_Size(handle->pending_holds) != 0 || !parked_freeable(handle)) {
    return;
  }
  PyObject* acquired = PyObject_CallMethod(handle->lock, "acquire", "O", Py_False);
  if (acquired == NULL) {
    PyErr_Clear();
    return;
  }
  int locked = acquired == Py_True;
  Py_DECREF(acquired);
  if (!locked) {
    return; /* settle() runs on another thread, and looks again before it stops */
  }
  const PJRT_Api* api = (const PJRT_Api*)(uintptr_t)handle->table_address;
  PyObject* oldest = oldest_active(handle);
  Py_XINCREF(oldest);
  PyObject* parked = handle->parked;
  Py_INCREF(parked);
  for (Py_ssize_t i = 0; i < PyList_Size(parked);) {
    PJRT_Buffer* addresses[MAX_DEVICES];
    Py_ssize_t count = 0;
    PyObject* entry = PyList_GetItem(parked, i);
    if (!parked_plain_buffers(entry, oldest, addresses, &count)) {
      ++i;
      continue;
    }
    /* Out of the list first: whoever finds it there frees it. */
    Py_INCREF(entry);
    if (PyList_SetSlice(parked, i, i + 1, NULL) < 0) {
      PyErr_Clear();
      Py_DECREF(entry);
      break;
    }
    for (Py_ssize_t d = 0; d < count; ++d) {
      hp_wiring.buffer_destroy(api, addresses[d]);
    }
    Py_DECREF(entry);
  }
  Py_DECREF(parked);
  Py_XDECREF(oldest);
  PyObject* released = PyObject_CallMethod(handle->lock, "release", NULL);
  if (released == NULL) {
    PyErr_WriteUnraisable((PyObject*)handle);
  }
  Py_XDECREF(released);
}

void hp_end_call(HandleCore* handle, PyObject* ticket) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  /* Whether this is the oldest running call: only its end (or the end of the
   * last call running) can make something parked free to go, since whatever
   * is parked while a call runs is parked after that call began. */
  int oldest = 1;
  int parked_now = handle->parked != NULL && PyList_CheckExact(handle->parked) &&
                   PyList_Size(handle->parked) != 0;
  if (parked_now && handle->active != NULL && PyDict_CheckExact(handle->active)) {
    /* Asked only when something is parked: most calls end with nothing parked. */
    PyObject* first = oldest_active(handle);
    oldest = first == NULL || first == ticket ||
             PyObject_RichCompareBool(first, ticket, Py_EQ) != 0;
    PyErr_Clear();
  }
  if (handle->active == NULL || PyDict_DelItem(handle->active, ticket) < 0) {
    PyErr_Clear();
  }
  Py_DECREF(ticket);
  if (handle->closed != Py_False) {
    PyErr_Restore(type, value, traceback);
    settle((PyObject*)handle);
    return;
  }
  /* settle() runs only when something parked can be freed now: the end of a
   * call that is not the oldest running frees nothing. */
  int settling = 0;
  if (handle->parked != NULL && PyList_CheckExact(handle->parked) &&
      PyList_Size(handle->parked) != 0 && handle->active != NULL &&
      PyDict_CheckExact(handle->active)) {
    if (!oldest && PyDict_Size(handle->active) != 0) {
      PyErr_Restore(type, value, traceback);
      return; /* the oldest call still runs: nothing parked can go yet */
    }
    free_parked_buffers(handle);
    settling = PyList_Size(handle->parked) != 0 && parked_freeable(handle);
  } else if (handle->parked != NULL && PyList_Size(handle->parked) != 0) {
    settling = 1;
  }
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
  if (settling) {
    settle((PyObject*)handle);
  }
}

PyObject* hp_begin_call(HandleCore* handle) {
  if (handle->tickets == NULL || handle->active == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "the client's handle is not set up");
    return NULL;
  }
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

static PyObject* handle_take_ticket(PyObject* op, PyObject* unused) {
  return hp_begin_call((HandleCore*)op);
}

static PyObject* handle_end(PyObject* op, PyObject* ticket) {
  Py_INCREF(ticket); /* hp_end_call takes a reference */
  hp_end_call((HandleCore*)op, ticket);
  if (PyErr_Occurred()) {
    return NULL;
  }
  Py_RETURN_NONE;
}

/* ---- releasing buffers --------------------------------------------------- */

/* Whether the handle's tables are what ClientHandle.__init__ made them (a
 * handle being collected has had them cleared). */
static int tables_in_place(HandleCore* handle) {
  return handle->buffers != NULL && PyDict_CheckExact(handle->buffers) &&
         handle->active != NULL && PyDict_CheckExact(handle->active) &&
         handle->parked != NULL && PyList_CheckExact(handle->parked) &&
         handle->holds != NULL && PyDict_CheckExact(handle->holds) &&
         handle->viewed != NULL && PyDict_CheckExact(handle->viewed) &&
         handle->tickets != NULL;
}

/* `key`'s value taken out of `dict` (a new reference), or NULL when absent. */
static PyObject* pop_item(PyObject* dict, PyObject* key) {
  PyObject* value = PyDict_GetItem(dict, key); /* borrowed */
  if (value == NULL) {
    return NULL;
  }
  Py_INCREF(value);
  if (PyDict_DelItem(dict, key) < 0) {
    PyErr_Clear();
  }
  return value;
}

/* How many running calls may be using one of `addresses`: those in `active`
 * but this release's own, less the listed CallPlan calls that pass none of
 * them. With the GIL held: a listed call writes its addresses holding it. */
static Py_ssize_t calls_that_may_use(HandleCore* handle, PJRT_Buffer* const* addresses,
                                     Py_ssize_t count) {
  Py_ssize_t others = PyDict_Size(handle->active) - 1;
  for (int s = 0; s < HP_RUNNING_CALLS && others > 0; ++s) {
    const HpRunningCall* running = &handle->running_calls[s];
    if (running->count == 0) {
      continue;
    }
    int passes = 0;
    for (Py_ssize_t a = 0; a < running->count && !passes; ++a) {
      for (Py_ssize_t d = 0; d < count && !passes; ++d) {
        passes = running->arguments[a] == addresses[d];
      }
    }
    others -= !passes;
  }
  return others;
}

/* Frees `buffers` (taken out of the registry by this call, `ticket`) now if no
 * other call is running, or parks them with the host memory they may read.
 * Returns 0, or -1 with an exception set. */
static int free_or_park(HandleCore* handle, PyObject* ticket, PyObject* buffers,
                        PyObject* holds, AddressCache* cache) {
  PJRT_Buffer* addresses[MAX_DEVICES];
  Py_ssize_t count = PyList_CheckExact(buffers) ? PyList_Size(buffers) : 0;
  int now = count >= 1 && count <= MAX_DEVICES &&
            (holds == NULL || (PyList_Check(holds) && PyList_Size(holds) == 0));
  if (now && hp_addresses_of(cache, buffers, count, addresses, 1) < 0) {
    PyErr_Clear(); /* not cdata: the settling frees them */
    now = 0;
  }
  /* Read after the addresses, whose reading may allocate and so let other
   * threads run: with no other call running none can be using the buffers
   * (calls that start from now on find their owner released), nor with only
   * CallPlan calls running that do not pass them (calls_that_may_use), whatever
   * is parked: those entries wait for their own calls (while one was parked,
   * every later release used to park too, 0.06-0.17 per call with 4 threads on
   * 2 devices). A closed client (or one inherited through fork, which is closed
   * too) parks: its settling decides what may still be freed. */
  now = now && handle->closed == Py_False &&
        handle->table_address != 0 && calls_that_may_use(handle, addresses, count) == 0;
  if (now) {
    const PJRT_Api* api = (const PJRT_Api*)(uintptr_t)handle->table_address;
    for (Py_ssize_t d = 0; d < count; ++d) {
      hp_wiring.buffer_destroy(api, addresses[d]);
    }
    return 0;
  }
  PyObject* entry = Py_BuildValue("(OO(OO))", ticket, hp_names.buffers, buffers,
                                  holds != NULL ? holds : Py_None);
  int status = entry != NULL ? PyList_Append(handle->parked, entry) : -1;
  Py_XDECREF(entry);
  return status;
}

int hp_release_buffers(HandleCore* handle, PyObject* owner_id, AddressCache* cache) {
  if (!tables_in_place(handle)) {
    return 0; /* the handle is being collected: its client is gone with it */
  }
  /* The ticket comes first: a client being torn down either sees it (and
   * waits for it) or has already emptied `buffers` (and this finds nothing). */
  PyObject* ticket = hp_begin_call(handle);
  if (ticket == NULL) {
    return -1;
  }
  int status = 0;
  PyObject* buffers = pop_item(handle->buffers, owner_id); /* one caller wins */
  if (buffers != NULL) {
    /* An owner's views and holds are recorded while it lives, never after. */
    if (PyDict_Size(handle->viewed) != 0) {
      Py_XDECREF(pop_item(handle->viewed, owner_id));
    }
    PyObject* holds = PyDict_Size(handle->holds) != 0 ? pop_item(handle->holds, owner_id)
                                                      : NULL;
    AddressCache scratch = {NULL, NULL, NULL, NULL};
    status = free_or_park(handle, ticket, buffers, holds, cache != NULL ? cache : &scratch);
    hp_address_cache_clear(&scratch);
    Py_XDECREF(holds);
    Py_DECREF(buffers);
  }
  hp_end_call(handle, ticket);
  return status;
}

static PyObject* handle_release_buffers(PyObject* op, PyObject* owner_id) {
  if (hp_release_buffers((HandleCore*)op, owner_id, NULL) < 0) {
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"take_ticket", handle_take_ticket, METH_NOARGS,
     "take_ticket() -> ticket: register a native call as running (whether the client is "
     "closed is the caller's to check: see ClientHandle.begin); end it with end(ticket)"},
    {"end", handle_end, METH_O,
     "end(ticket): the call has ended; frees what was waiting for it to end"},
    {"release_buffers", handle_release_buffers, METH_O,
     "release_buffers(owner_id): the buffers of owner_id are no longer wanted: free them "
     "once no call that may be using them is running (at once if none is)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot handle_slots[] = {
    {Py_tp_doc, "The fields of a ClientHandle (pjrt._capi.handles) and its call tickets."},
    {Py_tp_members, handle_members},
    {Py_tp_methods, handle_methods},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_dealloc, handle_dealloc},
    {0, NULL}};

PyType_Spec hp_handle_spec = {
    "pjrt._native_runtime.HandleCore", sizeof(HandleCore), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, handle_slots};
