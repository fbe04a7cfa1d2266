/* read_small: the first read of a small computed value, in one C call (see
 * hot_path.h for the map, and pjrt/_runtime/host_reads.py for the reads around it). */
#include "hot_path.h"

/* Reads of this many bytes or more are views, not copies. */
static Py_ssize_t small_read_limit;

/* The bytes of a small array's value, for `HostReads.__array__` to wrap: one
 * dense row-major buffer that is not shared, not a shard and not laid out
 * otherwise, smaller than the view threshold, whose value has been computed.
 * Anything else (including a value still being computed, or an error, which
 * the Python path then meets again and raises) gives None, having changed
 * nothing. The copy goes into a bytes object made for it, before anything
 * else can see it. */
PyObject* hp_read_small(PyObject* module, PyObject* argument) {
  if (hp_wiring.host_read == NULL || !PyObject_TypeCheck(argument, hp_array_type)) {
    Py_RETURN_NONE;
  }
  ArrayCore* array = (ArrayCore*)argument;
  if (array->handle == NULL || !PyObject_TypeCheck(array->handle, hp_handle_type) ||
      array->sharding != Py_None || array->parent != Py_None || array->shared != Py_False ||
      array->physical_order != Py_None || array->shape == NULL ||
      !PyTuple_CheckExact(array->shape) || array->dtype == NULL) {
    Py_RETURN_NONE;
  }
  HandleCore* handle = (HandleCore*)array->handle;
  if (handle->closed != Py_False || handle->table_address == 0) {
    Py_RETURN_NONE;
  }
  PyObject* itemsize = PyObject_GetAttr(array->dtype, hp_names.itemsize);
  Py_ssize_t size = itemsize != NULL ? PyLong_AsSsize_t(itemsize) : -1;
  Py_XDECREF(itemsize);
  for (Py_ssize_t d = 0; size >= 0 && size < small_read_limit &&
                         d < PyTuple_Size(array->shape); ++d) {
    Py_ssize_t extent = PyLong_AsSsize_t(PyTuple_GetItem(array->shape, d));
    /* (a product past the limit is all that counts: never one that overflows) */
    size = extent < 0 ? -1 : extent > 0 && size > small_read_limit / extent ? small_read_limit
                                                                            : size * extent;
  }
  if (size < 0 || size >= small_read_limit) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject* ticket = hp_begin_call(handle);
  if (ticket == NULL) {
    return NULL;
  }
  PyObject* result = NULL;
  /* Read under the ticket: a delete() from now on waits for this read. */
  PyObject* buffers = array->buffers;
  PJRT_Buffer* address = NULL;
  if (buffers != NULL && PyList_CheckExact(buffers) && PyList_Size(buffers) == 1) {
    address = hp_address_of(&array->cache, PyList_GetItem(buffers, 0));
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
    status = hp_wiring.host_read(api, address, destination, (size_t)size);
    Py_END_ALLOW_THREADS
    if (status != PJRT_HOST_READ_DONE) {
      if (status != PJRT_HOST_READ_NOT_READY) { /* the Python path meets it again */
        hp_wiring.error_destroy(api, (PJRT_Error*)status);
      }
      Py_CLEAR(result);
    }
  }
  hp_end_call(handle, ticket);
  if (result == NULL && !PyErr_Occurred()) {
    Py_RETURN_NONE;
  }
  return result;
}

/* set_small_read_limit(view_threshold_bytes): reads of this many bytes or
 * more are views (the policy is pjrt._runtime.host_reads's). */
PyObject* hp_set_small_read_limit(PyObject* module, PyObject* limit) {
  Py_ssize_t bytes = PyLong_AsSsize_t(limit);
  if (bytes < 0) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "the small-read limit is a size in bytes");
    }
    return NULL;
  }
  small_read_limit = bytes;
  Py_RETURN_NONE;
}
