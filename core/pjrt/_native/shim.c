/* Implementation of shim.h; see there for what each helper is for. */
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The size of an args struct as this side knows it: up to the end of its
 * last field, without trailing padding, as the PJRT C API defines it. */
#define SHIM_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#define SHIM_ARGS(type, name, last_field) \
  type name;                              \
  memset(&name, 0, sizeof(name));         \
  name.struct_size = SHIM_STRUCT_SIZE(type, last_field)

/* Above this many devices the per-device pointer lists go on the heap. */
#define SHIM_STACK_DEVICES 64

/* The last field of PJRT_ExecuteOptions in our header. */
#define SHIM_EXECUTE_OPTIONS_LAST_FIELD num_hlo_output_callbacks

int pjrt_shim_load(const char* path, const PJRT_Api** api_out, char* message,
                   size_t message_size) {
  typedef const PJRT_Api* (*get_api_fn)(void);
  *api_out = NULL;
  dlerror();
  /* RTLD_NOW binds every function the library calls before dlopen returns, so
   * one that no loaded library defines fails here, with dlerror() naming it.
   * With lazy binding the same plugin loads, and the process exits with code
   * 127 ("symbol lookup error") the first time the plugin calls it: a failure
   * that cannot be caught or reported. Every real plugin we know of (the two
   * CPU ones, CUDA's and libtpu) resolves fully at load, and dlopen takes the
   * same time for them either way (10 to 25 ms with the file cached): they
   * import little beyond libc. So there is no lazy fallback. */
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char* reason = dlerror();
    snprintf(message, message_size, "%s", reason ? reason : "unknown reason");
    return PJRT_SHIM_LOAD_DLOPEN_FAILED;
  }
  dlerror();
  void* symbol = dlsym(handle, "GetPjrtApi");
  if (symbol == NULL) {
    const char* reason = dlerror();
    snprintf(message, message_size, "%s", reason ? reason : "symbol not found");
    return PJRT_SHIM_LOAD_NO_SYMBOL;
  }
  const PJRT_Api* api = ((get_api_fn)symbol)();
  if (api == NULL) {
    message[0] = '\0';
    return PJRT_SHIM_LOAD_NULL_API;
  }
  *api_out = api;
  return PJRT_SHIM_LOAD_OK;
}

const PJRT_Api* pjrt_shim_api_from_address(uintptr_t address) {
  return (const PJRT_Api*)address;
}

int pjrt_shim_has_entry(const PJRT_Api* api, size_t entry_offset) {
  if (api->struct_size < entry_offset + sizeof(void*)) return 0;
  void* entry;
  memcpy(&entry, (const char*)api + entry_offset, sizeof(entry));
  return entry != NULL;
}

int pjrt_shim_execute(const PJRT_Api* api, PJRT_LoadedExecutable* executable,
                      PJRT_Buffer** arguments, size_t num_devices,
                      size_t num_arguments, PJRT_Buffer** outputs,
                      size_t num_outputs,
                      const int64_t* non_donatable_input_indices,
                      size_t num_non_donatable_input_indices,
                      PJRT_Device* execute_device,
                      PJRT_Event** complete_events, PJRT_Error** error_out) {
  PJRT_Buffer* const* argument_stack[SHIM_STACK_DEVICES];
  PJRT_Buffer** output_stack[SHIM_STACK_DEVICES];
  PJRT_Buffer* const** argument_lists = argument_stack;
  PJRT_Buffer*** output_lists = output_stack;
  *error_out = NULL;
  if (num_devices > SHIM_STACK_DEVICES) {
    argument_lists = malloc(num_devices * sizeof(*argument_lists));
    output_lists = malloc(num_devices * sizeof(*output_lists));
    if (argument_lists == NULL || output_lists == NULL) {
      free((void*)argument_lists);
      free(output_lists);
      return -1;
    }
  }
  for (size_t d = 0; d < num_devices; ++d) {
    argument_lists[d] = arguments + d * num_arguments;
    output_lists[d] = outputs + d * num_outputs;
  }

  SHIM_ARGS(PJRT_ExecuteOptions, options, SHIM_EXECUTE_OPTIONS_LAST_FIELD);
  options.non_donatable_input_indices = non_donatable_input_indices;
  options.num_non_donatable_input_indices = num_non_donatable_input_indices;

  SHIM_ARGS(PJRT_LoadedExecutable_Execute_Args, args, execute_device);
  args.executable = executable;
  args.options = &options;
  args.argument_lists = argument_lists;
  args.num_devices = num_devices;
  args.num_args = num_arguments;
  args.output_lists = output_lists;
  args.device_complete_events = complete_events;
  args.execute_device = execute_device;
  *error_out = api->PJRT_LoadedExecutable_Execute(&args);

  if (argument_lists != argument_stack) {
    free((void*)argument_lists);
    free(output_lists);
  }
  return 0;
}

static int64_t shim_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* pjrt_shim_call_run on several devices (no host values). */
static int shim_call_run_on_devices(pjrt_shim_call* call, int64_t started) {
  PJRT_Error* error = NULL;
  int failed = pjrt_shim_execute(call->api, call->executable, call->arguments,
                                 call->num_devices, call->num_arguments, call->outputs,
                                 call->num_outputs, call->non_donatable,
                                 call->num_non_donatable, NULL, call->complete_events,
                                 &error);
  call->error = error;
  return (failed || error != NULL ? PJRT_SHIM_CALL_ERROR : 0) |
         (shim_now_ns() - started > call->slow_ns ? PJRT_SHIM_CALL_SLOW : 0);
}

int pjrt_shim_call_run(pjrt_shim_call* call) {
  if (call->num_devices > 1) {
    return shim_call_run_on_devices(call, shim_now_ns());
  }
  const PJRT_Api* api = call->api;
  const void** host_data = call->host_data;
  size_t n = call->num_arguments;
  size_t i;
  int64_t started = shim_now_ns();
  PJRT_Error* error = NULL;
  int copies = 0;
  call->error = NULL;
  for (i = 0; host_data != NULL && i < n; ++i) {
    if (host_data[i] != NULL) {
      call->arguments[i] = NULL;
      copies = 1;
    }
  }
  if (copies) {
    const int64_t* dims = call->host_dims;
    for (i = 0; i < n && error == NULL; dims += call->host_num_dims[i], ++i) {
      PJRT_Event* done = NULL;
      if (host_data[i] == NULL) continue;
      error = pjrt_shim_buffer_from_host(
          api, call->client, host_data[i], call->host_types[i],
          call->host_num_dims[i] ? dims : NULL, call->host_num_dims[i],
          PJRT_HostBufferSemantics_kImmutableOnlyDuringCall, call->device, NULL,
          &call->arguments[i], &done);
      pjrt_shim_event_destroy(api, done); /* none for this semantics */
    }
  }
  if (error == NULL) {
    PJRT_Buffer* const* argument_list = call->arguments;
    PJRT_Buffer** output_list = call->outputs;
    SHIM_ARGS(PJRT_ExecuteOptions, options, SHIM_EXECUTE_OPTIONS_LAST_FIELD);
    SHIM_ARGS(PJRT_LoadedExecutable_Execute_Args, args, execute_device);
    options.non_donatable_input_indices = call->non_donatable;
    options.num_non_donatable_input_indices = call->num_non_donatable;
    args.executable = call->executable;
    args.options = &options;
    args.argument_lists = &argument_list;
    args.num_devices = 1;
    args.num_args = n;
    args.output_lists = &output_list;
    args.device_complete_events = call->complete_events;
    error = api->PJRT_LoadedExecutable_Execute(&args);
  }
  if (copies) {
    for (i = 0; i < n; ++i) {
      if (host_data[i] == NULL) continue;
      host_data[i] = NULL;
      pjrt_shim_buffer_destroy(api, call->arguments[i]);
      call->arguments[i] = NULL;
    }
  }
  call->error = error;
  return (error != NULL ? PJRT_SHIM_CALL_ERROR : 0) |
         (shim_now_ns() - started > call->slow_ns ? PJRT_SHIM_CALL_SLOW : 0);
}

static PJRT_Error* shim_await_and_destroy(const PJRT_Api* api,
                                          PJRT_Event* event) {
  SHIM_ARGS(PJRT_Event_Await_Args, await_args, event);
  await_args.event = event;
  PJRT_Error* error = api->PJRT_Event_Await(&await_args);
  pjrt_shim_event_destroy(api, event);
  return error;
}

PJRT_Error* pjrt_shim_buffer_from_host(
    const PJRT_Api* api, PJRT_Client* client, const void* data,
    PJRT_Buffer_Type type, const int64_t* dims, size_t num_dims,
    PJRT_HostBufferSemantics semantics, PJRT_Device* device,
    PJRT_Memory* memory, PJRT_Buffer** buffer_out, PJRT_Event** done_out) {
  SHIM_ARGS(PJRT_Client_BufferFromHostBuffer_Args, args, buffer);
  args.client = client;
  args.data = data;
  args.type = type;
  args.dims = dims;
  args.num_dims = num_dims;
  args.host_buffer_semantics = semantics;
  args.device = device;
  args.memory = memory;
  *buffer_out = NULL;
  *done_out = NULL;
  PJRT_Error* error = api->PJRT_Client_BufferFromHostBuffer(&args);
  if (error != NULL) return error;
  *buffer_out = args.buffer;
  if (args.done_with_host_buffer == NULL) return NULL;
  if (semantics == PJRT_HostBufferSemantics_kImmutableZeroCopy ||
      semantics == PJRT_HostBufferSemantics_kMutableZeroCopy) {
    *done_out = args.done_with_host_buffer;
    return NULL;
  }
  if (semantics == PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes) {
    return shim_await_and_destroy(api, args.done_with_host_buffer);
  }
  pjrt_shim_event_destroy(api, args.done_with_host_buffer);
  return NULL;
}

PJRT_Error* pjrt_shim_buffers_from_host(
    const PJRT_Api* api, PJRT_Client* client, size_t count,
    const void* const* data, const PJRT_Buffer_Type* types,
    const int64_t* dims, const size_t* num_dims, const int* semantics,
    PJRT_Device* const* devices, const size_t* slots, PJRT_Buffer** buffers_out,
    PJRT_Event** done_out, size_t* made_out) {
  size_t i;
  *made_out = 0;
  for (i = 0; i < count; ++i) {
    PJRT_Error* error = pjrt_shim_buffer_from_host(
        api, client, data[i], types[i], num_dims[i] ? dims : NULL, num_dims[i],
        (PJRT_HostBufferSemantics)semantics[i], devices[i], NULL,
        &buffers_out[slots[i]], &done_out[i]);
    if (error != NULL) return error;
    *made_out = i + 1;
    dims += num_dims[i];
  }
  return NULL;
}

PJRT_Error* pjrt_shim_buffer_host_address(const PJRT_Api* api,
                                          PJRT_Buffer* buffer, size_t size,
                                          uintptr_t* address_out) {
  PJRT_Error* error;
  *address_out = 0;
  if (!pjrt_shim_has_entry(api, offsetof(PJRT_Api, PJRT_Buffer_UnsafePointer)) ||
      !pjrt_shim_has_entry(api, offsetof(PJRT_Api, PJRT_Buffer_IsOnCpu)) ||
      !pjrt_shim_has_entry(api,
                           offsetof(PJRT_Api, PJRT_Buffer_OnDeviceSizeInBytes)))
    return NULL;
  SHIM_ARGS(PJRT_Buffer_IsOnCpu_Args, on_cpu, is_on_cpu);
  on_cpu.buffer = buffer;
  if ((error = api->PJRT_Buffer_IsOnCpu(&on_cpu)) != NULL) return error;
  if (!on_cpu.is_on_cpu) return NULL;
  SHIM_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args, device_size,
            on_device_size_in_bytes);
  device_size.buffer = buffer;
  if ((error = api->PJRT_Buffer_OnDeviceSizeInBytes(&device_size)) != NULL)
    return error;
  /* Padded, tiled or packed (sub-byte) layouts differ in size: not dense. */
  if (device_size.on_device_size_in_bytes != size) return NULL;
  SHIM_ARGS(PJRT_Buffer_UnsafePointer_Args, pointer, buffer_pointer);
  pointer.buffer = buffer;
  if ((error = api->PJRT_Buffer_UnsafePointer(&pointer)) != NULL) return error;
  *address_out = pointer.buffer_pointer;
  return NULL;
}

PJRT_Error* pjrt_shim_buffer_to_host(const PJRT_Api* api, PJRT_Buffer* buffer,
                                     void* destination, size_t size) {
  uintptr_t address = 0;
  PJRT_Error* error = pjrt_shim_buffer_host_address(api, buffer, size, &address);
  if (error != NULL) return error;
  if (address != 0) {
    memcpy(destination, (const void*)address, size);
    return NULL;
  }
  SHIM_ARGS(PJRT_Buffer_ToHostBuffer_Args, args, event);
  args.src = buffer;
  args.dst = destination;
  args.dst_size = size;
  error = api->PJRT_Buffer_ToHostBuffer(&args);
  if (error != NULL) return error;
  if (args.event == NULL) return NULL;
  return shim_await_and_destroy(api, args.event);
}

PJRT_Error* pjrt_shim_buffer_await_ready(const PJRT_Api* api,
                                         PJRT_Buffer* buffer) {
  SHIM_ARGS(PJRT_Buffer_ReadyEvent_Args, args, event);
  args.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&args);
  if (error != NULL) return error;
  return shim_await_and_destroy(api, args.event);
}

static void shim_drop_error(const PJRT_Api* api, PJRT_Error* error) {
  if (error == NULL) return;
  SHIM_ARGS(PJRT_Error_Destroy_Args, args, error);
  args.error = error;
  api->PJRT_Error_Destroy(&args);
}

void pjrt_shim_error_destroy(const PJRT_Api* api, PJRT_Error* error) {
  shim_drop_error(api, error);
}

void pjrt_shim_buffer_destroy(const PJRT_Api* api, PJRT_Buffer* buffer) {
  if (buffer == NULL) return;
  SHIM_ARGS(PJRT_Buffer_Destroy_Args, args, buffer);
  args.buffer = buffer;
  shim_drop_error(api, api->PJRT_Buffer_Destroy(&args));
}

void pjrt_shim_buffers_destroy(const PJRT_Api* api, PJRT_Buffer** buffers,
                               size_t count) {
  for (size_t i = 0; i < count; ++i) {
    pjrt_shim_buffer_destroy(api, buffers[i]);
  }
}

void pjrt_shim_event_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  SHIM_ARGS(PJRT_Event_Destroy_Args, args, event);
  args.event = event;
  shim_drop_error(api, api->PJRT_Event_Destroy(&args));
}

void pjrt_shim_event_await_and_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  shim_drop_error(api, shim_await_and_destroy(api, event));
}

struct pjrt_shim_waiter {
  pthread_mutex_t mutex;
  pthread_cond_t fired_cond;
  const PJRT_Api* api;
  PJRT_Error* error;
  int fired;
  int references;
};

/* Drops the caller's or the callback's reference, outside the mutex; the last
 * one frees the waiter (the fields written under the mutex before the other's
 * drop are seen: acquire-release). */
static void shim_waiter_unref(pjrt_shim_waiter* waiter) {
  if (__atomic_sub_fetch(&waiter->references, 1, __ATOMIC_ACQ_REL) != 0) return;
  shim_drop_error(waiter->api, waiter->error);
  pthread_cond_destroy(&waiter->fired_cond);
  pthread_mutex_destroy(&waiter->mutex);
  free(waiter);
}

static void shim_waiter_fired(PJRT_Error* error, void* user_arg) {
  pjrt_shim_waiter* waiter = (pjrt_shim_waiter*)user_arg;
  pthread_mutex_lock(&waiter->mutex);
  waiter->error = error;
  waiter->fired = 1;
  pthread_mutex_unlock(&waiter->mutex);
  /* Woken after the unlock, so that the waiter does not wake into a mutex still
   * held here (a second sleep and wake-up for every wait); this reference keeps
   * the waiter alive until the broadcast is done. */
  pthread_cond_broadcast(&waiter->fired_cond);
  shim_waiter_unref(waiter);
}

pjrt_shim_waiter* pjrt_shim_waiter_start(const PJRT_Api* api, PJRT_Event* event,
                                         PJRT_Error** error_out) {
  pjrt_shim_waiter* waiter = pjrt_shim_waiter_watch(api, event, error_out);
  pjrt_shim_event_destroy(api, event);
  return waiter;
}

pjrt_shim_waiter* pjrt_shim_waiter_watch(const PJRT_Api* api, PJRT_Event* event,
                                         PJRT_Error** error_out) {
  *error_out = NULL;
  pjrt_shim_waiter* waiter = calloc(1, sizeof(*waiter));
  if (waiter == NULL) return NULL;
  pthread_mutex_init(&waiter->mutex, NULL);
  pthread_cond_init(&waiter->fired_cond, NULL);
  waiter->api = api;
  waiter->references = 2; /* the caller's and the callback's */
  SHIM_ARGS(PJRT_Event_OnReady_Args, args, user_arg);
  args.event = event;
  args.callback = shim_waiter_fired;
  args.user_arg = waiter;
  PJRT_Error* error = api->PJRT_Event_OnReady(&args);
  if (error != NULL) {
    /* No callback will come: only the caller's reference is left to drop. */
    pthread_cond_destroy(&waiter->fired_cond);
    pthread_mutex_destroy(&waiter->mutex);
    free(waiter);
    *error_out = error;
    return NULL;
  }
  return waiter;
}

/* Asks whether `buffer`'s value is computed, without waiting. Returns 1 when the
 * answer is final: the value is computed (its computation's error, if any, in
 * *error_out; the event freed), or the plugin gave no ready event (its error in
 * *error_out). Returns 0 with the unfired ready event in *pending, which the
 * caller frees or waits on. An error of PJRT_Event_IsReady counts as "not yet":
 * the wait meets the event's outcome. The one copy of this first step of every
 * wait and read (host_reads.c, ready_notifier.c use it too). */
static int shim_buffer_ready_now(const PJRT_Api* api, PJRT_Buffer* buffer,
                                 PJRT_Event** pending, PJRT_Error** error_out) {
  *pending = NULL;
  *error_out = NULL;
  SHIM_ARGS(PJRT_Buffer_ReadyEvent_Args, ready, event);
  ready.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&ready);
  if (error != NULL) {
    *error_out = error;
    return 1;
  }
  SHIM_ARGS(PJRT_Event_IsReady_Args, is_ready, is_ready);
  is_ready.event = ready.event;
  error = api->PJRT_Event_IsReady(&is_ready);
  if (error == NULL && is_ready.is_ready) {
    /* Awaiting a fired event only fetches its error. */
    *error_out = shim_await_and_destroy(api, ready.event);
    return 1;
  }
  shim_drop_error(api, error);
  *pending = ready.event;
  return 0;
}

int pjrt_shim_buffer_ready_waiter(const PJRT_Api* api, PJRT_Buffer* buffer,
                                  pjrt_shim_waiter** waiter_out,
                                  PJRT_Error** error_out) {
  *waiter_out = NULL;
  PJRT_Event* pending;
  if (shim_buffer_ready_now(api, buffer, &pending, error_out)) return 1;
  *waiter_out = pjrt_shim_waiter_start(api, pending, error_out);
  return *waiter_out == NULL ? 1 : 0;
}

int pjrt_shim_waiter_wait(pjrt_shim_waiter* waiter, int64_t timeout_ms) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&waiter->mutex);
  while (!waiter->fired) {
    if (pthread_cond_timedwait(&waiter->fired_cond, &waiter->mutex, &deadline) != 0) break;
  }
  int fired = waiter->fired;
  pthread_mutex_unlock(&waiter->mutex);
  return fired;
}

PJRT_Error* pjrt_shim_waiter_finish(pjrt_shim_waiter* waiter) {
  pthread_mutex_lock(&waiter->mutex);
  PJRT_Error* error = NULL;
  if (waiter->fired) {
    error = waiter->error;
    waiter->error = NULL;
  }
  pthread_mutex_unlock(&waiter->mutex);
  shim_waiter_unref(waiter);
  return error;
}

int pjrt_shim_buffer_wait(const PJRT_Api* api, PJRT_Buffer* buffer, int64_t slice_ms,
                          pjrt_shim_waiter** waiter_out, PJRT_Error** error_out) {
  *waiter_out = NULL;
  *error_out = NULL;
  if (!pjrt_shim_has_entry(api, offsetof(PJRT_Api, PJRT_Event_OnReady))) {
    *error_out = pjrt_shim_buffer_await_ready(api, buffer);
    return 1;
  }
  pjrt_shim_waiter* waiter = NULL;
  if (pjrt_shim_buffer_ready_waiter(api, buffer, &waiter, error_out)) return 1;
  if (pjrt_shim_waiter_wait(waiter, slice_ms)) {
    *error_out = pjrt_shim_waiter_finish(waiter);
    return 1;
  }
  *waiter_out = waiter;
  return 0;
}

#if defined(__GLIBC__)
#include <unistd.h>

static void shim_exit_now(int status, void* unused) {
  (void)unused;
  _exit(status);
}

static void shim_register_exit_now(void) { on_exit(shim_exit_now, NULL); }

int pjrt_shim_skip_teardown_at_exit(void) {
  static int registered_late = 0;
  if (on_exit(shim_exit_now, NULL) != 0) return -1;
  if (!registered_late) {
    registered_late = 1;
    Py_AtExit(shim_register_exit_now);
  }
  return 0;
}
#else
int pjrt_shim_skip_teardown_at_exit(void) { return -1; }
#endif

int pjrt_shim_ffi_device_ordinal(const void* call_frame, int32_t* ordinal_out) {
  const XLA_FFI_CallFrame* frame = (const XLA_FFI_CallFrame*)call_frame;
  const XLA_FFI_Api* api = frame == NULL ? NULL : frame->api;
  if (api == NULL) return 0;
  size_t end = offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get) + sizeof(void*);
  if (api->struct_size < end || api->XLA_FFI_DeviceOrdinal_Get == NULL) return 0;
  SHIM_ARGS(XLA_FFI_DeviceOrdinal_Get_Args, args, device_ordinal);
  args.ctx = frame->ctx;
  XLA_FFI_Error* error = api->XLA_FFI_DeviceOrdinal_Get(&args);
  if (error != NULL) {
    SHIM_ARGS(XLA_FFI_Error_Destroy_Args, destroy, error);
    destroy.error = error;
    api->XLA_FFI_Error_Destroy(&destroy);
    return 0;
  }
  *ordinal_out = args.device_ordinal;
  return 1;
}
