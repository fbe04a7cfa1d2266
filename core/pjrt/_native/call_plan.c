/* CallPlan: one executable's per-call path, on one device or several (see
 * hot_path.h for the map). It checks the arguments against the parameters,
 * launches, and adopts the outputs as Arrays; anything it does not handle it
 * leaves alone and answers None, and the caller takes the Python path, which
 * reports every error. */
#include "hot_path.h"

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
  int brief;     /* the last launch was brief: the next keeps the GIL (BRIEF_LAUNCH_NS) */
  int late;      /* the last launch, after brief ones, was late (LATE_LAUNCH_NS) */
  Py_ssize_t kept_gil; /* launches that kept the GIL */
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
  if (hp_addresses_of(&array->cache, buffers, plan->num_devices, entry->call->arguments + i,
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
    PJRT_Buffer* address = hp_address_of(&array->cache, PyList_GetItem(buffers, 0));
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
  PyObject* dtype = PyObject_GetAttr(argument, hp_names.dtype);
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
  PyObject* made = hp_array_adopt(
      (PyTypeObject*)plan->array_type, plan->client, plan->handle, buffers, plan->devices,
      PyTuple_GetItem(plan->output_shapes, k), PyTuple_GetItem(plan->output_dtypes, k),
      PyTuple_GetItem(plan->output_shardings, k), entry->call->outputs + k,
      plan->num_outputs);
  Py_DECREF(buffers);
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
      hp_wiring.buffer_destroy((const PJRT_Api*)(uintptr_t)handle->table_address,
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

/* A launch that took at most this long keeps the GIL the next time.
 *
 * Letting the GIL go around a launch of a few microseconds costs more than the
 * launch when other threads want the GIL: one of them takes it, and this thread,
 * back from the plugin, waits for it again (a hand-over each way per call, and
 * CPython restarts that wait each time the holder lets go at its own launch).
 * Keeping it is safe only while nothing the plugin may wait for during
 * PJRT_LoadedExecutable_Execute needs the GIL: XLA's CPU client blocks a launch
 * while a device has its maximum of computations in flight
 * (max_inflight_computations_per_device), and a program inlined on this thread
 * runs in the call. So a launch keeps the GIL only while no program can call
 * into Python (hp_programs_call_python: no custom-call handler in Python or
 * given as a ctypes or cffi function pointer, which may be a trampoline into
 * Python, no DLPack view with a producer's deleter, host-to-device transfer
 * manager or key-value store callback was ever made in this process; see
 * programs_may_call_python),
 * and only when the plan's last launch was brief: a program the plugin runs
 * inline, or a launch that waited at the in-flight limit, lets the GIL go from
 * then on, until a launch is brief again.
 *
 * One launch among brief ones that took longer, up to LATE_LAUNCH_NS, is taken
 * for what it nearly always is, the calling thread preempted or a page fault
 * (about 1 launch in 20 of the 8x8 program on 2 busy cores): the next launch
 * still keeps the GIL, and a second such launch in a row lets it go. Otherwise
 * each of them handed the GIL to another calling thread and took it back after
 * (8x8 program, 2 and 4 threads, load average 10-17: 0.035 to 0.053 GIL
 * hand-overs per call before, 0.007 to 0.023 with this rule). */
#define BRIEF_LAUNCH_NS 20000
#define LATE_LAUNCH_NS 1000000

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
  int64_t took;
  int keep_gil = plan->brief && !hp_programs_call_python;
  if (keep_gil) {
    int64_t started = now_ns();
    status = hp_wiring.call_run(call);
    took = now_ns() - started;
  } else {
    Py_BEGIN_ALLOW_THREADS
    int64_t started = now_ns();
    status = hp_wiring.call_run(call);
    took = now_ns() - started;
    Py_END_ALLOW_THREADS
  }
  if (took <= BRIEF_LAUNCH_NS) {
    plan->brief = 1;
    plan->late = 0;
  } else if (took <= LATE_LAUNCH_NS && plan->brief && !plan->late) {
    plan->late = 1;
  } else {
    plan->brief = 0;
    plan->late = 0;
  }
  plan->kept_gil += keep_gil;
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
  PyObject* ticket = hp_begin_call(handle);
  if (ticket == NULL) {
    Py_DECREF(arguments);
    return NULL;
  }
  PyObject* result = NULL;
  CallEntry* entry = take_entry(plan);
  if (entry == NULL) {
    hp_end_call(handle, ticket);
    Py_DECREF(arguments);
    return NULL;
  }
  /* Listed before any address is read: whatever it holds until placed is an
   * earlier call's, which can only make a release park. */
  HpRunningCall* running = NULL;
  for (int s = 0; s < HP_RUNNING_CALLS && running == NULL; ++s) {
    if (handle->running_calls[s].count == 0) {
      running = &handle->running_calls[s];
      running->arguments = entry->call->arguments;
      running->count = plan->num_devices * plan->num_parameters;
    }
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
  if (running != NULL) {
    running->count = 0;
    running->arguments = NULL;
  }
  put_entry(plan, entry);
  hp_end_call(handle, ticket);
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
    {"kept_gil", T_PYSSIZET, offsetof(CallPlan, kept_gil), READONLY,
     "how many launches kept the GIL (brief ones, while no program can call into Python)"},
    {NULL, 0, 0, 0, NULL}};

/* The parameters' shapes and dtypes, and on one device where host values of
 * each may be copied by the call: `parameters` holds per parameter (shape,
 * dtype, strides or None). Returns 0, or -1 with an exception set. */
static int read_parameters(CallPlan* plan, PyObject* parameters) {
  Py_ssize_t count = plan->num_parameters;
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *shape, *dtype, *strides;
    if (!PyArg_ParseTuple(PyTuple_GetItem(parameters, i), "O!OO", &PyTuple_Type, &shape,
                          &dtype, &strides)) {
      return -1;
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
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < count && plan->num_devices == 1; ++i) {
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
      return -1;
    }
    for (Py_ssize_t d = 0; d < ndim; ++d) {
      dims[d] = PyLong_AsSsize_t(PyTuple_GetItem(shape, d));
      dims[ndim + d] = PyLong_AsSsize_t(PyTuple_GetItem(strides, d));
    }
    if (PyErr_Occurred()) {
      return -1;
    }
    plan->host_ok[i] = 1;
  }
  return 0;
}

/* The outputs' global shapes, dtypes and shardings: `outputs` holds per
 * output (shape, dtype[, sharding]). Returns 0, or -1 with an exception set. */
static int read_outputs(CallPlan* plan, PyObject* outputs) {
  for (Py_ssize_t k = 0; k < plan->num_outputs; ++k) {
    PyObject *shape, *dtype;
    PyObject* sharding = Py_None;
    if (!PyArg_ParseTuple(PyTuple_GetItem(outputs, k), "OO|O", &shape, &dtype, &sharding)) {
      return -1;
    }
    Py_INCREF(shape);
    PyTuple_SetItem(plan->output_shapes, k, shape);
    Py_INCREF(dtype);
    PyTuple_SetItem(plan->output_dtypes, k, dtype);
    Py_INCREF(sharding);
    PyTuple_SetItem(plan->output_shardings, k, sharding);
  }
  return 0;
}

/* The plan's tables, sized for its parameters and outputs. Returns 0, or -1
 * with an exception set. */
static int allocate_tables(CallPlan* plan) {
  Py_ssize_t count = plan->num_parameters;
  plan->parameter_shapes = PyTuple_New(count);
  plan->parameter_dtypes = PyTuple_New(count);
  plan->output_shapes = PyTuple_New(plan->num_outputs);
  plan->output_dtypes = PyTuple_New(plan->num_outputs);
  plan->output_shardings = PyTuple_New(plan->num_outputs);
  plan->host_ok = PyMem_Calloc(count + 1, 1);
  plan->host_offsets = PyMem_Calloc(count + 1, sizeof(Py_ssize_t));
  plan->accepted = PyMem_Calloc(count + 1, sizeof(PyObject*));
  if (plan->parameter_shapes == NULL || plan->parameter_dtypes == NULL ||
      plan->output_shapes == NULL || plan->output_dtypes == NULL ||
      plan->output_shardings == NULL || plan->host_ok == NULL ||
      plan->host_offsets == NULL || plan->accepted == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_NoMemory();
    }
    return -1;
  }
  return 0;
}

/* CallPlan(handle, client, devices, array_type, ndarray_type, parameters,
 *          outputs, donated, hooks)
 * devices: the executable's devices, in its order.
 * parameters: per parameter (shape, dtype, strides or None: host values of it
 *   are not copied by the call); on several devices only their number counts.
 * outputs: per output (global shape, dtype, sharding or None).
 * hooks: the executable's side of a call, a tuple (new_call, prepare_donations,
 *   consume_donated, raise_error[, accept]); Python's `_runtime.launches.CallHooks`
 *   names them. accept(index, argument) -> bool, needed on several devices:
 *   whether a global argument's sharding, shape and dtype are the parameter's. */
static PyObject* plan_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *handle, *client, *devices, *array_type, *ndarray_type, *parameters, *outputs,
      *donated, *hooks, *new_call, *prepare, *consume, *raise_error;
  PyObject* accept = Py_None;
  if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "CallPlan takes positional arguments");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "O!OO!O!O!O!O!O!O!", hp_handle_type, &handle, &client,
                        &PyTuple_Type, &devices, &PyType_Type, &array_type, &PyType_Type,
                        &ndarray_type, &PyTuple_Type, &parameters, &PyTuple_Type, &outputs,
                        &PyTuple_Type, &donated, &PyTuple_Type, &hooks) ||
      !PyArg_ParseTuple(hooks, "OOOO|O", &new_call, &prepare, &consume, &raise_error,
                        &accept)) {
    return NULL;
  }
  Py_ssize_t num_devices = PyTuple_Size(devices);
  if (!PyType_IsSubtype((PyTypeObject*)array_type, hp_array_type)) {
    PyErr_SetString(PyExc_TypeError, "array_type must derive from ArrayCore");
    return NULL;
  }
  if (num_devices < 1 || num_devices > MAX_DEVICES || (num_devices > 1 && accept == Py_None)) {
    PyErr_SetString(PyExc_ValueError,
                    "a plan needs 1 to MAX_DEVICES devices, and accept on several");
    return NULL;
  }
  if (hp_wiring.call_run == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "pjrt._native_runtime is not configured");
    return NULL;
  }
  CallPlan* plan = (CallPlan*)((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
  if (plan == NULL) {
    return NULL;
  }
  plan->num_parameters = PyTuple_Size(parameters);
  plan->num_outputs = PyTuple_Size(outputs);
  plan->num_devices = num_devices;
  plan->live = 1;
  plan->inline_ = 0;
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
  if (allocate_tables(plan) < 0 || read_parameters(plan, parameters) < 0 ||
      read_outputs(plan, outputs) < 0) {
    Py_DECREF(plan);
    return NULL;
  }
  return (PyObject*)plan;
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

PyType_Spec hp_plan_spec = {"pjrt._native_runtime.CallPlan", sizeof(CallPlan), 0,
                                Py_TPFLAGS_DEFAULT, plan_slots};
