/* Implementation of host_reads.h. Compiled in the same unit as shim.c, after
 * it: SHIM_ARGS and the buffer helpers come from there. */

/* Whether `buffer`'s value has been computed: PJRT_HOST_READ_DONE (and it has
 * no error), PJRT_HOST_READ_NOT_READY (the caller waits, and meets any error
 * then), or the computation's PJRT_Error*. */
static intptr_t host_read_ready(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Event* pending;
  PJRT_Error* error;
  if (shim_buffer_ready_now(api, buffer, &pending, &error)) {
    return error != NULL ? (intptr_t)error : PJRT_HOST_READ_DONE;
  }
  pjrt_shim_event_destroy(api, pending);
  return PJRT_HOST_READ_NOT_READY;
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
