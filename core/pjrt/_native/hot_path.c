/* The module pjrt._native_runtime: its wiring and its types (see hot_path.h for
 * what each file holds). */
#include "hot_path.h"

hp_wiring_t hp_wiring;
hp_names_t hp_names;
PyTypeObject* hp_array_type;
PyTypeObject* hp_handle_type;
PyObject* hp_array_site_recorder;
int hp_programs_call_python;

/* configure(address_slot, address_slot_address, *, buffer_destroy,
 *           error_destroy, call_run, host_address, buffer_wait, waiter_finish,
 *           wait_slice_ms, wait_ready, buffer_format):
 * the cffi PJRT_Buffer*[1] used to read a cdata's address, the addresses of
 * the cffi extension's functions this module calls, how long a host view's
 * first wait (in C) may last, and the two Python functions a host view needs
 * (see hot_path.h). Called once, by pjrt._capi.native_runtime. */
static PyObject* configure(PyObject* module, PyObject* args, PyObject* kwargs) {
  static char* keywords[] = {"address_slot", "address_slot_address", "buffer_destroy",
                             "error_destroy", "call_run", "host_address", "buffer_wait",
                             "waiter_finish", "wait_slice_ms", "wait_ready", "buffer_format",
                             NULL};
  PyObject *slot, *wait_ready, *buffer_format;
  PyObject* addresses[7];
  long long wait_slice_ms;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!$O!O!O!O!O!O!LOO", keywords, &slot,
                                   &PyLong_Type, &addresses[0], &PyLong_Type, &addresses[1],
                                   &PyLong_Type, &addresses[2], &PyLong_Type, &addresses[3],
                                   &PyLong_Type, &addresses[4], &PyLong_Type, &addresses[5],
                                   &PyLong_Type, &addresses[6], &wait_slice_ms, &wait_ready,
                                   &buffer_format)) {
    return NULL;
  }
  if (wait_slice_ms < 0) {
    PyErr_SetString(PyExc_ValueError, "wait_slice_ms must not be negative");
    return NULL;
  }
  if (!PyCallable_Check(wait_ready) || !PyCallable_Check(buffer_format)) {
    PyErr_SetString(PyExc_TypeError, "wait_ready and buffer_format must be callable");
    return NULL;
  }
  void* pointers[7];
  for (int i = 0; i < 7; ++i) {
    pointers[i] = PyLong_AsVoidPtr(addresses[i]);
    if (pointers[i] == NULL) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "configure needs a non-NULL %s", keywords[i + 1]);
      }
      return NULL;
    }
  }
  Py_INCREF(slot);
  Py_XSETREF(hp_wiring.address_slot, slot);
  Py_INCREF(wait_ready);
  Py_XSETREF(hp_wiring.wait_ready, wait_ready);
  Py_INCREF(buffer_format);
  Py_XSETREF(hp_wiring.buffer_format, buffer_format);
  hp_wiring.address_slot_memory = (PJRT_Buffer**)pointers[0];
  hp_wiring.buffer_destroy = (buffer_destroy_fn)pointers[1];
  hp_wiring.error_destroy = (error_destroy_fn)pointers[2];
  hp_wiring.call_run = (call_run_fn)pointers[3];
  hp_wiring.host_address = (host_address_fn)pointers[4];
  hp_wiring.buffer_wait = (buffer_wait_fn)pointers[5];
  hp_wiring.waiter_finish = (waiter_finish_fn)pointers[6];
  hp_wiring.wait_slice_ms = (int64_t)wait_slice_ms;
  Py_RETURN_NONE;
}

/* set_array_site_recorder(recorder): call recorder(array) with each new Array
 * that owns its buffers; None stops it. */
static PyObject* set_array_site_recorder(PyObject* module, PyObject* recorder) {
  if (recorder != Py_None && !PyCallable_Check(recorder)) {
    PyErr_SetString(PyExc_TypeError, "the array site recorder must be callable or None");
    return NULL;
  }
  if (recorder == Py_None) {
    Py_CLEAR(hp_array_site_recorder);
  } else {
    Py_INCREF(recorder);
    Py_XSETREF(hp_array_site_recorder, recorder);
  }
  Py_RETURN_NONE;
}

/* programs_may_call_python(): from now on, launches let the GIL go (see
 * BRIEF_LAUNCH_NS in call_plan.c). For good: what made a program able to call
 * into Python may still be referenced by programs in flight. */
static PyObject* programs_may_call_python(PyObject* module, PyObject* unused) {
  hp_programs_call_python = 1;
  Py_RETURN_NONE;
}

/* launches_keep_gil(): whether a brief launch keeps the GIL. */
static PyObject* launches_keep_gil(PyObject* module, PyObject* unused) {
  return PyBool_FromLong(!hp_programs_call_python);
}

static PyMethodDef module_methods[] = {
    {"programs_may_call_python", programs_may_call_python, METH_NOARGS,
     "programs_may_call_python(): a program the plugin runs may call into Python from now "
     "on (a custom-call handler, a DLPack producer's deleter, a transfer manager, "
     "key-value store callbacks): launches let the GIL go, for good"},
    {"launches_keep_gil", launches_keep_gil, METH_NOARGS,
     "launches_keep_gil() -> bool: whether a brief launch keeps the GIL (no program can "
     "call into Python)"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(address_slot, address_slot_address, *, buffer_destroy, error_destroy, "
     "call_run, host_address, buffer_wait, waiter_finish, wait_slice_ms, wait_ready, "
     "buffer_format): the cffi PJRT_Buffer*[1] used to read a cdata's address, the "
     "addresses of the cffi extension's functions this module calls, how long a host "
     "view's first wait may last, and the Python functions a host view needs"},
    {"set_array_site_recorder", set_array_site_recorder, METH_O,
     "set_array_site_recorder(recorder): call recorder(array) with each new Array that "
     "owns its buffers (None: stop)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pjrt._native_runtime",
    "The core's native runtime: call tickets, Arrays' fields and constructor, the per-call "
    "path (see _native/hot_path.h).",
    -1, module_methods, NULL, NULL, NULL, NULL};

static int make_names(void) {
  hp_names.settle = PyUnicode_InternFromString("settle");
  hp_names.dtype = PyUnicode_InternFromString("dtype");
  hp_names.itemsize = PyUnicode_InternFromString("itemsize");
  hp_names.collected = PyUnicode_InternFromString("garbage-collected");
  hp_names.buffers = PyUnicode_InternFromString("buffers");
  hp_names.index_zero = PyLong_FromLong(0);
  return hp_names.settle && hp_names.dtype && hp_names.itemsize && hp_names.collected &&
                 hp_names.buffers && hp_names.index_zero
             ? 0
             : -1;
}

PyMODINIT_FUNC PyInit__native_runtime(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == NULL) {
    return NULL;
  }
  hp_array_type = (PyTypeObject*)PyType_FromSpec(&hp_array_spec);
  hp_handle_type = (PyTypeObject*)PyType_FromSpec(&hp_handle_spec);
  PyObject* plan_type = PyType_FromSpec(&hp_plan_spec);
  if (make_names() < 0 || hp_array_type == NULL || hp_handle_type == NULL ||
      plan_type == NULL) {
    Py_XDECREF(plan_type);
    Py_DECREF(module);
    return NULL;
  }
  Py_INCREF(hp_array_type);
  Py_INCREF(hp_handle_type);
  if (PyModule_AddObject(module, "ArrayCore", (PyObject*)hp_array_type) < 0 ||
      PyModule_AddObject(module, "HandleCore", (PyObject*)hp_handle_type) < 0 ||
      PyModule_AddObject(module, "CallPlan", plan_type) < 0 ||
      PyModule_AddIntConstant(module, "MAX_DEVICES", MAX_DEVICES) < 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
