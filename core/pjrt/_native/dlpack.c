/* DLPack helpers: see dlpack.h. Compiled into the core's cffi extension,
 * whose generated source includes Python.h (only the stable ABI is used). */

typedef struct {
  DLManagedTensorVersioned versioned;
  DLManagedTensor legacy;
  PyObject* owner;   /* strong reference, dropped by the deleter */
  int64_t dims[];    /* shape, then strides when given */
} pjrt_dlpack_export_ctx;

static const char* const pjrt_dlpack_names[4] = {
    "dltensor", "dltensor_versioned", "used_dltensor",
    "used_dltensor_versioned"};

const char* pjrt_dlpack_capsule_name(int which) {
  return (which >= 0 && which < 4) ? pjrt_dlpack_names[which] : NULL;
}

static void pjrt_dlpack_drop_owner(pjrt_dlpack_export_ctx* ctx) {
  /* A deleter may run on any thread, and after the interpreter has gone
   * (a consumer freeing late at exit): then the reference is left alone. */
  if (ctx->owner != NULL && Py_IsInitialized()) {
    PyGILState_STATE state = PyGILState_Ensure();
    Py_DecRef(ctx->owner);
    PyGILState_Release(state);
  }
  free(ctx);
}

static void pjrt_dlpack_delete_versioned(DLManagedTensorVersioned* self) {
  if (self != NULL) pjrt_dlpack_drop_owner((pjrt_dlpack_export_ctx*)self->manager_ctx);
}

static void pjrt_dlpack_delete_legacy(DLManagedTensor* self) {
  if (self != NULL) pjrt_dlpack_drop_owner((pjrt_dlpack_export_ctx*)self->manager_ctx);
}

void* pjrt_dlpack_export(uintptr_t owner, void* data, int32_t device_type,
                         int32_t device_id, uint8_t code, uint8_t bits,
                         int32_t ndim, const int64_t* shape,
                         const int64_t* strides, uint64_t flags,
                         int versioned) {
  size_t count = (size_t)(ndim > 0 ? ndim : 0) * (strides != NULL ? 2 : 1);
  pjrt_dlpack_export_ctx* ctx = (pjrt_dlpack_export_ctx*)calloc(
      1, sizeof(pjrt_dlpack_export_ctx) + count * sizeof(int64_t) + sizeof(int64_t));
  if (ctx == NULL) return NULL;
  DLTensor* tensor = versioned ? &ctx->versioned.dl_tensor : &ctx->legacy.dl_tensor;
  tensor->data = data;
  tensor->device.device_type = (DLDeviceType)device_type;
  tensor->device.device_id = device_id;
  tensor->ndim = ndim;
  tensor->dtype.code = code;
  tensor->dtype.bits = bits;
  tensor->dtype.lanes = 1;
  tensor->byte_offset = 0;
  for (int32_t i = 0; i < ndim; ++i) ctx->dims[i] = shape[i];
  tensor->shape = ctx->dims;
  tensor->strides = NULL;
  if (strides != NULL) {
    for (int32_t i = 0; i < ndim; ++i) ctx->dims[ndim + i] = strides[i];
    tensor->strides = ctx->dims + ndim;
  }
  ctx->owner = (PyObject*)owner;
  Py_IncRef(ctx->owner);
  if (versioned) {
    ctx->versioned.version.major = PJRT_DLPACK_MAJOR;
    ctx->versioned.version.minor = PJRT_DLPACK_MINOR;
    ctx->versioned.manager_ctx = ctx;
    ctx->versioned.deleter = pjrt_dlpack_delete_versioned;
    ctx->versioned.flags = flags;
    return &ctx->versioned;
  }
  ctx->legacy.manager_ctx = ctx;
  ctx->legacy.deleter = pjrt_dlpack_delete_legacy;
  return &ctx->legacy;
}

void pjrt_dlpack_export_abandon(void* managed, int versioned) {
  if (managed == NULL) return;
  if (versioned)
    pjrt_dlpack_delete_versioned((DLManagedTensorVersioned*)managed);
  else
    pjrt_dlpack_delete_legacy((DLManagedTensor*)managed);
}

void pjrt_dlpack_capsule_destructor(void* capsule_pointer) {
  PyObject* capsule = (PyObject*)capsule_pointer;
  /* Called with the GIL held, possibly while an exception is being raised:
   * keep it, since the capsule calls below may set their own. */
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, pjrt_dlpack_names[1])) {
    DLManagedTensorVersioned* managed =
        (DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, pjrt_dlpack_names[1]);
    if (managed != NULL && managed->deleter != NULL) managed->deleter(managed);
  } else if (PyCapsule_IsValid(capsule, pjrt_dlpack_names[0])) {
    DLManagedTensor* managed =
        (DLManagedTensor*)PyCapsule_GetPointer(capsule, pjrt_dlpack_names[0]);
    if (managed != NULL && managed->deleter != NULL) managed->deleter(managed);
  }
  /* A renamed ("used_...") capsule belongs to its consumer: nothing to do. */
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

static void pjrt_dlpack_run_deleter(void* managed, int versioned) {
  if (managed == NULL || !Py_IsInitialized()) return;
  /* The producer's deleter may touch Python objects (numpy's and jax's do). */
  PyGILState_STATE state = PyGILState_Ensure();
  if (versioned) {
    DLManagedTensorVersioned* tensor = (DLManagedTensorVersioned*)managed;
    if (tensor->deleter != NULL) tensor->deleter(tensor);
  } else {
    DLManagedTensor* tensor = (DLManagedTensor*)managed;
    if (tensor->deleter != NULL) tensor->deleter(tensor);
  }
  PyGILState_Release(state);
}

void pjrt_dlpack_release_versioned(void* device_buffer_ptr, void* managed) {
  (void)device_buffer_ptr;
  pjrt_dlpack_run_deleter(managed, 1);
}

void pjrt_dlpack_release_legacy(void* device_buffer_ptr, void* managed) {
  (void)device_buffer_ptr;
  pjrt_dlpack_run_deleter(managed, 0);
}

#ifndef _WIN32
#include <errno.h>
#include <unistd.h>
#endif

int pjrt_dlpack_readable(uintptr_t address, size_t size) {
  if (size == 0) return 1;
  if (address == 0 || address + size < address) return 0;
#ifdef _WIN32
  return 1; /* no cheap probe there: trust the producer */
#else
  int fds[2];
  if (pipe(fds) != 0) return -1;
  int readable = 1;
  size_t done = 0;
  char sink[4096];
  while (done < size) {
    size_t chunk = size - done < sizeof sink ? size - done : sizeof sink;
    ssize_t written = write(fds[1], (const char*)address + done, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      readable = errno == EFAULT ? 0 : -1;
      break;
    }
    if (read(fds[0], sink, (size_t)written) < 0) { readable = -1; break; }
    done += (size_t)written;
  }
  close(fds[0]);
  close(fds[1]);
  return readable;
#endif
}
