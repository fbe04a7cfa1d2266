/* Implementation of host_reads.h. Compiled in the same unit as shim.c, after
 * it: SHIM_ARGS and the buffer helpers come from there. */

intptr_t pjrt_host_read(const PJRT_Api* api, PJRT_Buffer* buffer,
                        void* destination, size_t size) {
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
  if (error == NULL && size != 0)
    error = pjrt_shim_buffer_to_host(api, buffer, destination, size);
  return error != NULL ? (intptr_t)error : PJRT_HOST_READ_DONE;
}
