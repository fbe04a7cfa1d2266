/* ArrayCore: the fields of pjrt.array.Array (its base class), its one
 * constructor, and its finaliser (see hot_path.h for the map).
 *
 * Every Array is made here: by `ArrayCore.__init__` (Array's own __init__,
 * for transfers and shards), by `ArrayCore._adopt` (an executable's output
 * on the Python path) and by hp_array_adopt (the C path), all through
 * fill(). When an Array is collected its finaliser marks it deleted and hands
 * its buffers to the handle (hp_release_buffers): a finaliser in C rather
 * than a __del__, since one Python frame per Array freed would cost more than
 * the rest of a small call. */
#include "hot_path.h"

#define ARRAY_MEMBER(field, name) {name, T_OBJECT_EX, offsetof(ArrayCore, field), 0, NULL},
static PyMemberDef array_members[] = {HP_ARRAY_FIELDS(ARRAY_MEMBER){NULL, 0, 0, 0, NULL}};
#undef ARRAY_MEMBER

static int array_traverse(PyObject* op, visitproc visit, void* arg) {
  ArrayCore* self = (ArrayCore*)op;
  Py_VISIT(Py_TYPE(op));
#define VISIT_FIELD(field, name) Py_VISIT(self->field);
  HP_ARRAY_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
  Py_VISIT(self->cache.source);
  Py_VISIT(self->cache.sources);
  Py_VISIT(self->interruption);
  return 0;
}

static int array_clear(PyObject* op) {
  ArrayCore* self = (ArrayCore*)op;
#define CLEAR_FIELD(field, name) Py_CLEAR(self->field);
  HP_ARRAY_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
  hp_address_cache_clear(&self->cache);
  Py_CLEAR(self->interruption);
  return 0;
}

static void array_dealloc(PyObject* op) {
  PyTypeObject* type = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  array_clear(op);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(op);
  Py_DECREF(type);
}

/* ---- the constructor ----------------------------------------------------- */

/* Hands a new owner to the site recorder. Its failure is reported as
 * unraisable and does not stop the array from being made. */
static void record_site(ArrayCore* self) {
  PyObject* recorder = hp_array_site_recorder;
  Py_INCREF(recorder); /* it may be replaced while it runs */
  PyObject* result = PyObject_CallFunctionObjArgs(recorder, (PyObject*)self, NULL);
  if (result == NULL) {
    PyErr_WriteUnraisable(recorder);
  }
  Py_XDECREF(result);
  Py_DECREF(recorder);
}

/* Fills a new array's fields. Unless it borrows a `parent`'s buffers, the
 * array's buffers are registered with the handle under its id first, and
 * `_handle` is set last: until then a failure leaves an array whose finaliser
 * does nothing, and the buffers to the caller. Returns 0, or -1 with an
 * exception set. */
static int fill(ArrayCore* self, PyObject* client, PyObject* handle, PyObject* buffers,
                PyObject* devices, PyObject* shape, PyObject* dtype, PyObject* sharding,
                PyObject* parent, PyObject* physical_order) {
  if (self->handle != NULL) {
    PyErr_SetString(PyExc_TypeError, "an Array is made once; make a new one");
    return -1;
  }
  if (!PyObject_TypeCheck(handle, hp_handle_type) ||
      ((HandleCore*)handle)->buffers == NULL ||
      !PyDict_Check(((HandleCore*)handle)->buffers)) {
    PyErr_SetString(PyExc_TypeError, "an Array's handle must be its client's ClientHandle");
    return -1;
  }
#define SET(field, value) \
  do {                    \
    Py_INCREF(value);     \
    Py_XSETREF(self->field, (value)); \
  } while (0)
  SET(client, client);
  SET(buffers, buffers);
  SET(devices, devices);
  SET(shape, shape);
  SET(dtype, dtype);
  SET(host_copy, Py_None);
  SET(host_view, Py_None);
  SET(deleted_reason, Py_None);
  SET(sharding, sharding);
  SET(parent, parent);
  SET(shared, Py_False);
  SET(physical_order, physical_order);
  SET(queries, Py_None);
  if (parent == Py_None) {
    PyObject* owner_id = PyLong_FromVoidPtr(self);
    int status = owner_id != NULL
                     ? PyDict_SetItem(((HandleCore*)handle)->buffers, owner_id, buffers)
                     : -1;
    Py_XDECREF(owner_id);
    if (status < 0) {
      return -1;
    }
  }
  SET(handle, handle);
#undef SET
  if (parent == Py_None && hp_array_site_recorder != NULL) {
    record_site(self);
  }
  return 0;
}

/* Remembers the addresses of an adopted array's buffers (which the caller
 * read already), so that its first call and its release need not ask cffi. */
static int cache_addresses(ArrayCore* array, PyObject* buffers,
                           PJRT_Buffer* const* addresses, Py_ssize_t stride) {
  Py_ssize_t count = PyList_Size(buffers);
  if (count == 1) {
    PyObject* buffer = PyList_GetItem(buffers, 0);
    Py_INCREF(buffer);
    array->cache.source = buffer;
    array->cache.address = addresses[0];
    return 0;
  }
  PyObject* sources = PyList_AsTuple(buffers);
  PJRT_Buffer** copies = PyMem_Malloc(count * sizeof(PJRT_Buffer*));
  if (sources == NULL || copies == NULL) {
    Py_XDECREF(sources);
    PyMem_Free(copies);
    return -1;
  }
  for (Py_ssize_t d = 0; d < count; ++d) {
    copies[d] = addresses[d * stride];
  }
  array->cache.sources = sources;
  array->cache.addresses = copies;
  return 0;
}

PyObject* hp_array_adopt(PyTypeObject* type, PyObject* client, PyObject* handle,
                         PyObject* buffers, PyObject* devices, PyObject* shape,
                         PyObject* dtype, PyObject* sharding,
                         PJRT_Buffer* const* addresses, Py_ssize_t stride) {
  PyObject* made = ((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
  if (made == NULL) {
    return NULL;
  }
  ArrayCore* array = (ArrayCore*)made;
  if ((addresses != NULL && cache_addresses(array, buffers, addresses, stride) < 0) ||
      fill(array, client, handle, buffers, devices, shape, dtype, sharding, Py_None,
           Py_None) < 0) {
    if (!PyErr_Occurred()) {
      PyErr_NoMemory();
    }
    Py_DECREF(made);
    return NULL;
  }
  return made;
}

/* The arguments both Python constructors take. */
static int parse_fields(PyObject* args, PyObject* kwargs, PyObject** fields) {
  static char* keywords[] = {"client", "handle",   "buffers", "devices", "shape",
                             "dtype",  "sharding", "parent",  "physical_order", NULL};
  fields[6] = fields[7] = fields[8] = Py_None;
  return PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!OOO|OOO", keywords, &fields[0],
                                     &fields[1], &PyList_Type, &fields[2], &fields[3],
                                     &fields[4], &fields[5], &fields[6], &fields[7],
                                     &fields[8]);
}

/* ArrayCore.__init__(client, handle, buffers, devices, shape, dtype,
 *                    sharding=None, parent=None, physical_order=None) */
static int array_init(PyObject* op, PyObject* args, PyObject* kwargs) {
  PyObject* f[9];
  if (!parse_fields(args, kwargs, f)) {
    return -1;
  }
  return fill((ArrayCore*)op, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]);
}

/* ArrayCore._adopt(...): the same arguments; a new array made without
 * calling the class (an executable's outputs, one per call). */
static PyObject* array_adopt(PyObject* cls, PyObject* args, PyObject* kwargs) {
  PyObject* f[9];
  if (!PyType_Check(cls) || !parse_fields(args, kwargs, f)) {
    return NULL;
  }
  PyTypeObject* type = (PyTypeObject*)cls;
  PyObject* made = ((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
  if (made != NULL &&
      fill((ArrayCore*)made, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]) < 0) {
    Py_CLEAR(made);
  }
  return made;
}

/* ---- the finaliser ------------------------------------------------------- */

/* Marks the array collected and hands its buffers back to the handle. */
static void array_finalize(PyObject* op) {
  ArrayCore* self = (ArrayCore*)op;
  PyObject *type, *value, *traceback;
  if (self->handle == NULL) {
    return; /* never filled in */
  }
  PyErr_Fetch(&type, &value, &traceback);
  Py_INCREF(Py_None);
  Py_XSETREF(self->buffers, Py_None);
  Py_INCREF(hp_names.collected);
  Py_XSETREF(self->deleted_reason, hp_names.collected);
  PyObject* owner_id = PyLong_FromVoidPtr(op);
  int status = owner_id != NULL ? 0 : -1;
  if (owner_id != NULL && PyObject_TypeCheck(self->handle, hp_handle_type)) {
    status = hp_release_buffers((HandleCore*)self->handle, owner_id, &self->cache);
  }
  Py_XDECREF(owner_id);
  if (status < 0) {
    PyErr_WriteUnraisable(op);
  }
  PyErr_Restore(type, value, traceback);
}

static PyMethodDef array_methods[] = {
    {"_adopt", (PyCFunction)(void (*)(void))array_adopt,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "_adopt(client, handle, buffers, devices, shape, dtype, sharding=None, parent=None, "
     "physical_order=None) -> a new array owning buffers, made without calling the class"},
    {"_take_interruption", hp_array_take_interruption, METH_NOARGS,
     "_take_interruption() -> the exception (a KeyboardInterrupt, a program's error) that "
     "ended this thread's last wait in the buffer protocol, which numpy dropped before "
     "calling __array__; or None"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot array_slots[] = {
    {Py_tp_doc, "The fields of a pjrt Array and its one constructor (see pjrt.array.Array)."},
    {Py_tp_members, array_members},
    {Py_tp_methods, array_methods},
    {Py_tp_init, array_init},
    {Py_tp_traverse, array_traverse},
    {Py_tp_clear, array_clear},
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_finalize, array_finalize},
    {Py_bf_getbuffer, (void*)hp_array_getbuffer},
    {Py_bf_releasebuffer, (void*)hp_array_releasebuffer},
    {0, NULL}};

PyType_Spec hp_array_spec = {
    "pjrt._native_runtime.ArrayCore", sizeof(ArrayCore), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, array_slots};
