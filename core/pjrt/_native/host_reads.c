/* Implementation of host_reads.h. Compiled in the same unit as shim.c, after
 * it: SHIM_ARGS and the buffer helpers come from there. */

/* Whether `buffer`'s value has been computed: PJRT_HOST_READ_DONE (and it has
 * no error), PJRT_HOST_READ_NOT_READY, or the computation's PJRT_Error*. */
static intptr_t host_read_ready(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Error* error;
  SHIM_ARGS(PJRT_Buffer_ReadyEvent_Args, ready, event);
  ready.buffer = buffer;
  if ((error = api->PJRT_Buffer_ReadyEvent(&ready)) != NULL)
    return (intptr_t)error;
  SHIM_ARGS(PJRT_Event_IsReady_Args, is_ready, is_ready);
  is_ready.event = ready.event;
  error = api->PJRT_Event_IsReady(&is_ready);
  if (error != NULL || !is_ready.is_ready) {
    pjrt_shim_event_destroy(api, ready.event);
    return error != NULL ? (intptr_t)error : PJRT_HOST_READ_NOT_READY;
  }
  /* The event has fired: awaiting it only fetches the computation's error. */
  SHIM_ARGS(PJRT_Event_Await_Args, await_args, event);
  await_args.event = ready.event;
  error = api->PJRT_Event_Await(&await_args);
  pjrt_shim_event_destroy(api, ready.event);
  return error != NULL ? (intptr_t)error : PJRT_HOST_READ_DONE;
}

intptr_t pjrt_host_read(const PJRT_Api* api, PJRT_Buffer* buffer,
                        void* destination, size_t size) {
  intptr_t status = host_read_ready(api, buffer);
  if (status != PJRT_HOST_READ_DONE || size == 0) return status;
  PJRT_Error* error = pjrt_shim_buffer_to_host(api, buffer, destination, size);
  return error != NULL ? (intptr_t)error : PJRT_HOST_READ_DONE;
}

intptr_t pjrt_host_address(const PJRT_Api* api, PJRT_Buffer* buffer, size_t size,
                           uintptr_t* address) {
  *address = 0;
  intptr_t status = host_read_ready(api, buffer);
  if (status != PJRT_HOST_READ_DONE) return status;
  PJRT_Error* error = pjrt_shim_buffer_host_address(api, buffer, size, address);
  return error != NULL ? (intptr_t)error : PJRT_HOST_READ_DONE;
}
