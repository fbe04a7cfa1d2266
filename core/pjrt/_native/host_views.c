/* An Array's memory through the buffer protocol: `np.asarray(array)`,
 * `memoryview(array)` and `bytes(array)` of a value in host memory are the
 * buffer itself, read-only, with no copy and no Python frame (see hot_path.h
 * for the map, and pjrt/_runtime/host_reads.py for the reads this leaves to
 * Python).
 *
 * What the buffer protocol exports: one buffer (a single-device array, a
 * shard or a clone) whose value has been computed and lies in host memory, of
 * a dtype with a buffer-protocol format (numpy's own; ml_dtypes' have none).
 * Anything else raises BufferError, which numpy takes as "no buffer" before it
 * calls `__array__`: the Python path then copies, assembles, or raises the
 * precise error (a deleted array, a closed client, a failed computation).
 *
 * The memory outlives every export. Each export holds the Array (the consumer,
 * a memoryview, holds `view->obj`), so collection cannot free it; and while an
 * owner's memory is exported the owner is listed in its handle's
 * `buffer_exports`, which `delete()`, donation and `Client.close()` consult
 * (ClientHandle.is_viewed): they leave the memory to the last export's
 * release, which calls the handle back. */
#include "hot_path.h"

/* An ArrayCore's host_state. */
enum { HOST_UNKNOWN = 0, HOST_MEMORY = 1, NOT_HOST_MEMORY = 2 };

/* Stands in for the memory of an empty buffer (which may have no address). */
static char empty_memory[1];

/* dtype -> (its format as bytes, its itemsize), or None where it has no
 * format; filled by the wiring's buffer_format on first use. The entries stay
 * in the dict, so the formats handed out live as long as the module. */
static PyObject* formats;

/* The format of `dtype` and its itemsize, or NULL with an exception set
 * (BufferError where the buffer protocol has no format for it). */
static const char* format_of(PyObject* dtype, Py_ssize_t* itemsize) {
  if (formats == NULL && (formats = PyDict_New()) == NULL) {
    return NULL;
  }
  PyObject* entry = PyDict_GetItem(formats, dtype); /* borrowed */
  if (entry == NULL) {
    if (hp_wiring.buffer_format == NULL) {
      PyErr_SetString(PyExc_RuntimeError, "pjrt._native_runtime is not configured");
      return NULL;
    }
    PyObject* format = PyObject_CallFunctionObjArgs(hp_wiring.buffer_format, dtype, NULL);
    if (format == NULL) {
      return NULL;
    }
    PyObject* size = format != Py_None ? PyObject_GetAttr(dtype, hp_names.itemsize) : NULL;
    if (format != Py_None && (!PyBytes_Check(format) || size == NULL ||
                              !PyLong_Check(size) || PyLong_AsSsize_t(size) <= 0)) {
      Py_DECREF(format);
      Py_XDECREF(size);
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "buffer_format must return bytes or None");
      }
      return NULL;
    }
    entry = format == Py_None ? Py_NewRef(Py_None) : PyTuple_Pack(2, format, size);
    Py_DECREF(format);
    Py_XDECREF(size);
    int status = entry != NULL ? PyDict_SetItem(formats, dtype, entry) : -1;
    Py_XDECREF(entry); /* the dict holds it */
    if (status < 0) {
      return NULL;
    }
  }
  if (entry == Py_None) {
    PyErr_Format(PyExc_BufferError,
                 "the buffer protocol has no format for %R; np.asarray reads it", dtype);
    return NULL;
  }
  *itemsize = PyLong_AsSsize_t(PyTuple_GetItem(entry, 1));
  return PyBytes_AsString(PyTuple_GetItem(entry, 0));
}

/* ---- the owner's exports ---------------------------------------------------- */

/* The array whose id the buffers are registered under (a shard's or a clone's
 * parent). */
static ArrayCore* owner_of(ArrayCore* array) {
  PyObject* parent = array->parent;
  return parent != NULL && parent != Py_None && PyObject_TypeCheck(parent, hp_array_type)
             ? (ArrayCore*)parent
             : array;
}

/* Whether `handle` is a HandleCore. The type of the last one seen is
 * remembered (and held, so that its address is never another type's), since
 * walking a subclass's bases on every read costs more than the rest of the
 * check. */
static int is_handle(PyObject* handle) {
  static PyObject* known;
  if (handle == NULL) {
    return 0;
  }
  if ((PyObject*)Py_TYPE(handle) == known) {
    return 1;
  }
  if (!PyObject_TypeCheck(handle, hp_handle_type)) {
    return 0;
  }
  Py_INCREF(Py_TYPE(handle));
  Py_XSETREF(known, (PyObject*)Py_TYPE(handle));
  return 1;
}

/* Lists the owner in buffer_exports before counting: whoever looks at the
 * dict (on this thread or another) sees the export once it exists. Inserting
 * and deleting an int key runs no Python code, so the two steps of each of
 * these functions are not interleaved with another thread's. */
static int export_add(HandleCore* handle, ArrayCore* owner) {
  if (owner->exports == 0) {
    PyObject* key = PyLong_FromVoidPtr(owner); /* its id() */
    int status = key != NULL ? PyDict_SetItem(handle->buffer_exports, key, (PyObject*)owner)
                             : -1;
    Py_XDECREF(key);
    if (status < 0) {
      return -1;
    }
  }
  owner->exports += 1;
  return 0;
}

/* The end of an export. The last one of an owner released while exported (or
 * of a closed client) hands the memory back: handle._view_gone(owner_id). */
static void export_remove(HandleCore* handle, ArrayCore* owner) {
  owner->exports -= 1;
  if (owner->exports != 0) {
    return;
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* key = PyLong_FromVoidPtr(owner);
  if (key != NULL && handle->buffer_exports != NULL &&
      PyDict_DelItem(handle->buffer_exports, key) < 0) {
    PyErr_Clear();
  }
  int released = key != NULL && handle->released_while_viewed != NULL &&
                 PySet_Contains(handle->released_while_viewed, key) == 1;
  PyErr_Clear();
  if (key != NULL && (released || (handle->closed != NULL && handle->closed != Py_False))) {
    PyObject* result = PyObject_CallMethod((PyObject*)handle, "_view_gone", "O", key);
    if (result == NULL) {
      PyErr_WriteUnraisable((PyObject*)handle);
    }
    Py_XDECREF(result);
  }
  Py_XDECREF(key);
  PyErr_Restore(type, value, traceback);
}

/* ---- the buffer protocol ---------------------------------------------------- */

/* Raises the Python path's error for an array that is deleted, or whose
 * client is closed (Array.live_buffers words it); BufferError otherwise. */
static int raise_not_live(ArrayCore* array) {
  PyObject* result = PyObject_CallMethod((PyObject*)array, "live_buffers", NULL);
  if (result != NULL) {
    Py_DECREF(result);
    PyErr_SetString(PyExc_BufferError, "the array's buffers changed while it was read");
  }
  return -1;
}

/* Waits, in Python where Ctrl-C can interrupt it, for the value of `buffer` (a
 * cdata of the array's list) and raises the computation's error.
 *
 * numpy takes any error of the buffer protocol as "no buffer" and goes on to
 * `__array__`, dropping it: the error that ends the wait is kept on the array
 * for this thread, and `__array__` raises that same exception again
 * (_take_interruption). That matters for a Ctrl-C, and for the exceptions a
 * failed program hands over once (a handler's KeyboardInterrupt, SystemExit or
 * RecursionError, pjrt.errors.carry_across_plugin): a second wait would find
 * only the plugin's error. A direct memoryview() raises it at once; the next
 * read on this thread forgets it. */
static int wait_ready(ArrayCore* array, HandleCore* handle, PyObject* buffer,
                      PJRT_Buffer* address) {
  /* The first slice of the wait here, letting the GIL go once: a value computed
   * within it (nearly every read of a brief program) is had without a Python
   * frame. Anything else (an error to word, a wait long enough for Ctrl-C to
   * matter) goes to the Python wait, which starts over. The memory stays while
   * the GIL is let go: the owner is listed in buffer_exports. */
  const PJRT_Api* api = (const PJRT_Api*)(uintptr_t)handle->table_address;
  pjrt_shim_waiter* waiter = NULL;
  PJRT_Error* error = NULL;
  int fired;
  Py_BEGIN_ALLOW_THREADS
  fired = hp_wiring.buffer_wait(api, address, hp_wiring.wait_slice_ms, &waiter, &error);
  if (!fired && waiter != NULL) {
    error = hp_wiring.waiter_finish(waiter);
  }
  Py_END_ALLOW_THREADS
  if (fired && error == NULL) {
    return 0;
  }
  if (error != NULL) {
    hp_wiring.error_destroy(api, error);
  }
  PyObject* result =
      PyObject_CallFunctionObjArgs(hp_wiring.wait_ready, handle->api, buffer, NULL);
  if (result != NULL) {
    Py_DECREF(result);
    return 0;
  }
  {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL) {
      PyException_SetTraceback(value, traceback);
    }
    Py_XINCREF(value);
    Py_XSETREF(array->interruption, value);
    array->interrupted_thread = PyThread_get_thread_ident();
    PyErr_Restore(type, value, traceback);
  }
  return -1;
}

PyObject* hp_array_take_interruption(PyObject* op, PyObject* unused) {
  ArrayCore* array = (ArrayCore*)op;
  PyObject* interruption = array->interruption;
  if (interruption == NULL || array->interrupted_thread != PyThread_get_thread_ident()) {
    Py_RETURN_NONE;
  }
  array->interruption = NULL; /* the reference passes to the caller */
  return interruption;
}

/* Makes sure `array` (live, one buffer) knows whether its memory is host
 * memory, and where: asks the plugin once the value is computed (the answer
 * holds for the buffer's life). Returns 0, or -1 with an exception set. */
static int find_host_memory(ArrayCore* array, HandleCore* handle, Py_ssize_t nbytes) {
  for (int attempt = 0; array->host_state == HOST_UNKNOWN; ++attempt) {
    if (handle->closed != Py_False || handle->table_address == 0 ||
        !PyList_CheckExact(array->buffers) || PyList_Size(array->buffers) != 1 ||
        owner_of(array)->buffers == Py_None) {
      return raise_not_live(array);
    }
    PyObject* buffer = PyList_GetItem(array->buffers, 0);
    PJRT_Buffer* address = hp_address_of(&array->cache, buffer);
    if (address == NULL) {
      return -1;
    }
    const PJRT_Api* api = (const PJRT_Api*)(uintptr_t)handle->table_address;
    uintptr_t memory = 0;
    intptr_t status = hp_wiring.host_address(api, address, (size_t)nbytes, &memory);
    if (status == PJRT_HOST_READ_DONE) {
      array->host_address = memory;
      array->host_state = memory != 0 || nbytes == 0 ? HOST_MEMORY : NOT_HOST_MEMORY;
      break;
    }
    if (status != PJRT_HOST_READ_NOT_READY) { /* the wait raises it, worded */
      hp_wiring.error_destroy(api, (PJRT_Error*)status);
    }
    if (attempt == 1) {
      PyErr_SetString(PyExc_RuntimeError,
                      "the plugin reported a buffer not ready after waiting for it");
      return -1;
    }
    Py_INCREF(buffer); /* the wait runs Python: the list may change meanwhile */
    int waited = wait_ready(array, handle, buffer, address);
    Py_DECREF(buffer);
    if (waited < 0) {
      return -1;
    }
  }
  return 0;
}

/* Fills dims[0..ndim) with the shape and dims[ndim..2 ndim) with the strides
 * of the stored bytes (row-major, or in `physical_order` major to minor).
 * Returns the size in bytes, or -1 with an exception set. */
static Py_ssize_t shape_and_strides(ArrayCore* array, Py_ssize_t itemsize, Py_ssize_t ndim,
                                    Py_ssize_t* dims) {
  Py_ssize_t* strides = dims + ndim;
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    dims[d] = PyLong_AsSsize_t(PyTuple_GetItem(array->shape, d));
    if (dims[d] < 0) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_BufferError, "an Array's shape has a negative extent");
      }
      return -1;
    }
  }
  PyObject* order = array->physical_order;
  int ordered = order != Py_None && PyTuple_Check(order) && PyTuple_Size(order) == ndim;
  if (order != Py_None && !ordered) {
    PyErr_SetString(PyExc_BufferError, "an Array's stored order does not match its shape");
    return -1;
  }
  Py_ssize_t step = itemsize;
  for (Py_ssize_t k = ndim - 1; k >= 0; --k) { /* minor to major */
    Py_ssize_t d = ordered ? PyLong_AsSsize_t(PyTuple_GetItem(order, k)) : k;
    if (d < 0 || d >= ndim) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_BufferError, "an Array's stored order is not a permutation");
      }
      return -1;
    }
    strides[d] = step;
    if (dims[d] != 0 && step > PY_SSIZE_T_MAX / dims[d]) {
      PyErr_SetString(PyExc_BufferError, "an Array's size overflows");
      return -1;
    }
    step *= dims[d];
  }
  return step;
}

int hp_array_getbuffer(PyObject* op, Py_buffer* view, int flags) {
  ArrayCore* array = (ArrayCore*)op;
  view->obj = NULL;
  if (array->interruption != NULL && array->interrupted_thread == PyThread_get_thread_ident()) {
    Py_CLEAR(array->interruption); /* a new read: the last one's error was seen or dropped */
  }
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError,
                    "an Array's memory is read-only; copy it (np.array(x)) to write");
    return -1;
  }
  if (!is_handle(array->handle) || array->shape == NULL || !PyTuple_Check(array->shape) ||
      array->dtype == NULL) {
    PyErr_SetString(PyExc_BufferError, "this Array is not set up");
    return -1;
  }
  HandleCore* handle = (HandleCore*)array->handle;
  if (!PyList_CheckExact(array->buffers) || PyList_Size(array->buffers) != 1) {
    if (array->buffers == Py_None) {
      return raise_not_live(array);
    }
    PyErr_SetString(PyExc_BufferError,
                    "an Array on several devices has no single buffer; np.asarray assembles "
                    "its value");
    return -1;
  }
  if (handle->buffer_exports == NULL || !PyDict_CheckExact(handle->buffer_exports)) {
    PyErr_SetString(PyExc_BufferError, "the client's handle is not set up");
    return -1;
  }
  Py_ssize_t itemsize;
  const char* format = format_of(array->dtype, &itemsize);
  if (format == NULL) {
    return -1;
  }
  Py_ssize_t ndim = PyTuple_Size(array->shape);
  Py_ssize_t* dims = PyMem_Malloc((size_t)(2 * ndim + 1) * sizeof(Py_ssize_t));
  if (dims == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t nbytes = shape_and_strides(array, itemsize, ndim, dims);
  int contiguous = array->physical_order == Py_None;
  if (nbytes >= 0 && !contiguous && (flags & PyBUF_STRIDES) != PyBUF_STRIDES) {
    PyErr_SetString(PyExc_BufferError,
                    "this Array is stored in another order: ask for strides (numpy does)");
    nbytes = -1;
  }
  /* Registered before the array is checked: a delete() that runs from here on
   * (any Python code below may let another thread run) leaves the memory. */
  ArrayCore* owner = owner_of(array);
  if (nbytes < 0 || export_add(handle, owner) < 0) {
    PyMem_Free(dims);
    return -1;
  }
  if (find_host_memory(array, handle, nbytes) < 0) {
    export_remove(handle, owner);
    PyMem_Free(dims);
    return -1;
  }
  if (array->host_state != HOST_MEMORY || array->buffers == Py_None ||
      owner->buffers == Py_None || handle->closed != Py_False) {
    export_remove(handle, owner);
    PyMem_Free(dims);
    if (array->host_state != HOST_MEMORY) {
      PyErr_SetString(PyExc_BufferError,
                      "this Array's memory is not host memory; np.asarray copies it");
      return -1;
    }
    return raise_not_live(array);
  }
  view->buf = array->host_address != 0 ? (void*)array->host_address : empty_memory;
  view->obj = op;
  Py_INCREF(op);
  view->len = nbytes;
  view->readonly = 1;
  view->internal = dims;
  view->suboffsets = NULL;
  if ((flags & PyBUF_ND) == PyBUF_ND) {
    view->itemsize = itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char*)format : NULL;
    view->ndim = (int)ndim;
    view->shape = dims;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + ndim : NULL;
  } else { /* plain bytes, as bytes(array) asks */
    view->itemsize = 1;
    view->format = (flags & PyBUF_FORMAT) ? "B" : NULL;
    view->ndim = 1;
    view->shape = NULL;
    view->strides = NULL;
  }
  return 0;
}

void hp_array_releasebuffer(PyObject* op, Py_buffer* view) {
  ArrayCore* array = (ArrayCore*)op;
  PyMem_Free(view->internal);
  view->internal = NULL;
  if (is_handle(array->handle)) {
    export_remove((HandleCore*)array->handle, owner_of(array));
  }
}
