/* Small C helpers that sit beside the PJRT C API in the core's cffi extension.
 *
 * Each helper does in one C call what would otherwise take several round trips
 * through cffi on a hot path (execute, host transfers, freeing handles), or
 * what Python cannot do safely (dlopen with RTLD_LOCAL and a readable reason).
 * cffi releases the GIL for the whole call, so a helper that waits on the
 * plugin lets other Python threads run.
 *
 * This file is read twice: by the C compiler, and by the build script as part
 * of the cffi declarations, so it holds plain declarations only.
 */

/* Outcomes of pjrt_shim_load. */
typedef enum {
  PJRT_SHIM_LOAD_OK = 0,
  PJRT_SHIM_LOAD_DLOPEN_FAILED = 1,  /* message holds dlerror() */
  PJRT_SHIM_LOAD_NO_SYMBOL = 2,      /* no GetPjrtApi in the library */
  PJRT_SHIM_LOAD_NULL_API = 3        /* GetPjrtApi returned NULL */
} pjrt_shim_load_status;

/* Opens `path` with RTLD_NOW | RTLD_LOCAL (RTLD_LOCAL so that several
 * plugins, each with its own copy of XLA, can live in one process; RTLD_NOW so
 * that a function no library defines is a load error naming it, not an exit
 * when it is first called), and calls its GetPjrtApi. The library is never
 * closed: a plugin's threads may outlive any handle. The caller checks the
 * file beforehand (pjrt._loading.elf): dlopen trusts the file's headers. */
int pjrt_shim_load(const char* path, const PJRT_Api** api_out,
                   char* message, size_t message_size);

/* Reads a PJRT_Api* from the address held by a PyCapsule or an integer. */
const PJRT_Api* pjrt_shim_api_from_address(uintptr_t address);

/* The number of bytes of `api`'s table that the plugin filled in, and whether
 * a given entry (by byte offset) lies inside it and is set. */
int pjrt_shim_has_entry(const PJRT_Api* api, size_t entry_offset);

/* Runs `executable` on `num_devices` devices. `arguments` holds
 * num_devices * num_arguments buffers, device-major; `outputs` receives
 * num_devices * num_outputs new buffers, device-major, owned by the caller.
 * `execute_device` may be NULL (run on the executable's own devices).
 * When `complete_events` is not NULL it receives one event per device, owned
 * by the caller. Returns 0 and sets *error_out to the plugin's error (NULL on
 * success), or returns -1 when the host is out of memory. */
int pjrt_shim_execute(const PJRT_Api* api, PJRT_LoadedExecutable* executable,
                      PJRT_Buffer** arguments, size_t num_devices,
                      size_t num_arguments, PJRT_Buffer** outputs,
                      size_t num_outputs,
                      const int64_t* non_donatable_input_indices,
                      size_t num_non_donatable_input_indices,
                      PJRT_Device* execute_device,
                      PJRT_Event** complete_events, PJRT_Error** error_out);

/* Everything one call of an executable needs, set up once per executable
 * (and per concurrent caller) so that a call passes one pointer: the one call
 * struct of every launch, on one device or several, from C or from Python.
 * The caller fills `arguments` (and on one device `host_data`) and reads
 * `outputs` and `error` back. */
typedef struct {
  const PJRT_Api* api;
  PJRT_Client* client;
  PJRT_LoadedExecutable* executable;
  /* The devices the call runs on, all of the executable's (device-major
   * `arguments` and `outputs`); 1 for a single-device program. Host values
   * (`host_data`) are copied only on one device. */
  size_t num_devices;
  PJRT_Device* device;
  size_t num_arguments;     /* per device */
  size_t num_outputs;       /* per device */
  PJRT_Buffer** arguments;  /* num_devices * num_arguments; a host value's slot is filled here */
  PJRT_Buffer** outputs;    /* num_devices * num_outputs new buffers, owned by the caller */
  /* Per argument: dense row-major host memory to copy to `device` for this
   * call alone (kImmutableOnlyDuringCall), or NULL for a buffer already in
   * `arguments`. Its element type, and dimensions taken in turn from
   * `host_dims`, are the parameter's: `host_types[i]`, `host_num_dims[i]`. */
  const void** host_data;
  const PJRT_Buffer_Type* host_types;
  const size_t* host_num_dims;
  const int64_t* host_dims;
  /* Donated arguments the plugin must copy instead of reusing (numpy reads
   * them), as PJRT_ExecuteOptions.non_donatable_input_indices. */
  const int64_t* non_donatable;
  size_t num_non_donatable;
  /* A launch that takes longer than this is reported (PJRT_SHIM_CALL_SLOW). */
  int64_t slow_ns;
  /* NULL, or num_devices slots that receive each device's completion event
   * (owned by the caller; a token of the call). */
  PJRT_Event** complete_events;
  PJRT_Error* error;        /* the plugin's error, owned by the caller */
} pjrt_shim_call;

/* Bits of pjrt_shim_call_run's result. */
typedef enum {
  PJRT_SHIM_CALL_ERROR = 1,  /* call->error is set; no outputs were made */
  PJRT_SHIM_CALL_SLOW = 2    /* the copies and launch took longer than slow_ns */
} pjrt_shim_call_status;

/* The one launcher: on one device, copies the host values of `call` (if
 * any), launches the executable with every argument, frees the copies again
 * (the plugin keeps what the launched program reads) and clears `host_data`;
 * on several, launches it on all of them. Returns 0, or PJRT_SHIM_CALL_*
 * bits (an error with call->error NULL: the host ran out of memory). Where
 * it runs (the caller's thread or a worker) is the caller's choice. */
int pjrt_shim_call_run(pjrt_shim_call* call);

/* Starts a host-to-device copy of a dense row-major array. With
 * kImmutableOnlyDuringCall the plugin copies before returning; with
 * kImmutableUntilTransferCompletes this helper waits for the plugin to finish
 * reading the host memory before it returns; with the zero-copy semantics the
 * buffer may use the host memory directly, and *done_out receives the event
 * that fires when the plugin no longer needs it (owned by the caller, who must
 * keep the memory until then; NULL when the plugin gives none). */
PJRT_Error* pjrt_shim_buffer_from_host(
    const PJRT_Api* api, PJRT_Client* client, const void* data,
    PJRT_Buffer_Type type, const int64_t* dims, size_t num_dims,
    PJRT_HostBufferSemantics semantics, PJRT_Device* device,
    PJRT_Memory* memory, PJRT_Buffer** buffer_out, PJRT_Event** done_out);

/* Starts `count` host-to-device copies in one call, as pjrt_shim_buffer_from_host
 * would one by one: item i reads `data[i]` (type `types[i]`, `num_dims[i]`
 * dimensions taken in turn from `dims`) onto `devices[i]` with `semantics[i]`.
 * Its new buffer goes to `buffers_out[slots[i]]` (an execute argument array)
 * and its done event, for the zero-copy semantics, to `done_out[i]`.
 * *made_out is the number of items made (all of them, or, after an error, the
 * failing item's index): those are owned by the caller, the rest untouched. */
PJRT_Error* pjrt_shim_buffers_from_host(
    const PJRT_Api* api, PJRT_Client* client, size_t count,
    const void* const* data, const PJRT_Buffer_Type* types,
    const int64_t* dims, const size_t* num_dims, const int* semantics,
    PJRT_Device* const* devices, const size_t* slots, PJRT_Buffer** buffers_out,
    PJRT_Event** done_out, size_t* made_out);

/* Copies `buffer` into `destination` (dense row-major, `size` bytes) and
 * waits for the copy to finish. The caller has already waited for the buffer
 * to be ready (pjrt_shim_buffer_wait, which Ctrl-C can interrupt). A buffer
 * that lives in host memory (PJRT_Buffer_IsOnCpu) and whose on-device size is
 * exactly `size` is read directly: a plain memcpy, which on CPU plugins is
 * several times faster than the plugin's asynchronous ToHostBuffer. */
PJRT_Error* pjrt_shim_buffer_to_host(const PJRT_Api* api, PJRT_Buffer* buffer,
                                     void* destination, size_t size);

/* Waits for `buffer` to be ready; returns its error, if any. */
PJRT_Error* pjrt_shim_buffer_await_ready(const PJRT_Api* api,
                                         PJRT_Buffer* buffer);

/* If `buffer` lives in host memory (PJRT_Buffer_IsOnCpu) as a dense array of
 * exactly `size` bytes, sets *address_out to its first byte; otherwise sets
 * *address_out to 0. The caller has already waited for the buffer to be ready.
 * Host-resident buffers can then be read without a copy. */
PJRT_Error* pjrt_shim_buffer_host_address(const PJRT_Api* api,
                                          PJRT_Buffer* buffer, size_t size,
                                          uintptr_t* address_out);

/* Frees a PJRT_Error* (NULL is allowed) that nothing will report. */
void pjrt_shim_error_destroy(const PJRT_Api* api, PJRT_Error* error);

/* Frees one buffer, dropping any error (see pjrt_shim_buffers_destroy). */
void pjrt_shim_buffer_destroy(const PJRT_Api* api, PJRT_Buffer* buffer);

/* Frees `count` buffers. Errors from the plugin are freed and dropped: there
 * is no caller to report them to when a garbage-collected array goes away. */
void pjrt_shim_buffers_destroy(const PJRT_Api* api, PJRT_Buffer** buffers,
                               size_t count);

/* Waits for an event, then frees it; any error either returns is dropped. */
void pjrt_shim_event_await_and_destroy(const PJRT_Api* api, PJRT_Event* event);

/* Frees an event, dropping any error the plugin returns. */
void pjrt_shim_event_destroy(const PJRT_Api* api, PJRT_Event* event);

/* A wait on a PJRT_Event that the caller can give up on. The plugin's OnReady
 * callback and the caller each hold a reference; whichever lets go last frees
 * it (and the event's error, if the caller gave up). Waiting in slices of
 * `timeout_ms` lets Python handle signals (Ctrl-C) between them. */
typedef struct pjrt_shim_waiter pjrt_shim_waiter;

/* Starts waiting on `event` and frees the event (the callback outlives it).
 * Returns NULL with *error_out set when the plugin refuses, or on no memory
 * (then *error_out is NULL too). */
pjrt_shim_waiter* pjrt_shim_waiter_start(const PJRT_Api* api, PJRT_Event* event,
                                         PJRT_Error** error_out);

/* Starts waiting on `event` as pjrt_shim_waiter_start does, but leaves the
 * event to the caller, who may start more waits on it (one per thread waiting)
 * and frees it once none will start: each waiter outlives it. */
pjrt_shim_waiter* pjrt_shim_waiter_watch(const PJRT_Api* api, PJRT_Event* event,
                                         PJRT_Error** error_out);

/* Starts waiting until `buffer` is ready. Returns 1 when it already is (its
 * error, if any, in *error_out) and 0 with *waiter_out set otherwise. */
int pjrt_shim_buffer_ready_waiter(const PJRT_Api* api, PJRT_Buffer* buffer,
                                  pjrt_shim_waiter** waiter_out,
                                  PJRT_Error** error_out);

/* Waits up to `timeout_ms` for the event; returns 1 once it has fired. */
int pjrt_shim_waiter_wait(pjrt_shim_waiter* waiter, int64_t timeout_ms);

/* Drops the caller's reference. Returns the event's error when it has fired
 * (owned by the caller), else NULL; an error arriving later is freed. */
PJRT_Error* pjrt_shim_waiter_finish(pjrt_shim_waiter* waiter);

/* Waits up to `slice_ms` for `buffer` to be ready, in one call. Returns 1 when
 * the wait is over (*error_out holds the computation's error, or NULL), and 0
 * when the slice passed first: *waiter_out then continues the wait (see
 * pjrt_shim_waiter_wait and pjrt_shim_waiter_finish). A plugin without
 * PJRT_Event_OnReady is waited for without slices. */
int pjrt_shim_buffer_wait(const PJRT_Api* api, PJRT_Buffer* buffer, int64_t slice_ms,
                          pjrt_shim_waiter** waiter_out, PJRT_Error** error_out);

/* Makes the process end, from now on, through _exit(status) when the C library's
 * exit() runs: its exit handlers and the libraries' destructors are skipped.
 * The handler is registered now and again at the very end of Python's
 * finalisation (Py_AtExit), since exit() runs the handlers registered last
 * first and a plugin thread still running may register a destructor of its own
 * meanwhile (a function-local static made on first use). Returns 0 when it
 * could be arranged (glibc's on_exit). */
int pjrt_shim_skip_teardown_at_exit(void);

/* The id of the device whose program called the FFI handler of `frame` (an
 * XLA_FFI_CallFrame*; void here, for the C files that do not see XLA FFI's
 * header) in *ordinal_out, through XLA_FFI_DeviceOrdinal_Get; returns 1, or 0
 * when the plugin's FFI API lacks the call or refuses it (its error is freed). */
int pjrt_shim_ffi_device_ordinal(const void* frame, int32_t* ordinal_out);
