/* The C side of a host read (see pjrt/_runtime/host_reads.py): everything a
 * `np.asarray(array)` of a ready buffer asks of the plugin, in one call: where
 * its memory is, for a view (pjrt_host_address), or a copy of it
 * (pjrt_host_read).
 *
 * This file is read twice: by the C compiler, and by the build script as part
 * of the cffi declarations, so it holds plain declarations only.
 */

/* What pjrt_host_read and pjrt_host_address return when they do not return an
 * error. */
typedef enum {
  PJRT_HOST_READ_DONE = 0,      /* the value was copied */
  PJRT_HOST_READ_NOT_READY = 1  /* still being computed: nothing was copied */
} pjrt_host_read_status;

/* Copies the value of `buffer` into `destination` (dense row-major, `size`
 * bytes) if it has been computed, without waiting for it otherwise: checks the
 * buffer's ready event, then copies as pjrt_shim_buffer_to_host does (a memcpy
 * when the buffer lives in host memory). Returns PJRT_HOST_READ_DONE,
 * PJRT_HOST_READ_NOT_READY (the caller waits where Ctrl-C can interrupt it and
 * calls again), or else the address of the PJRT_Error* of the computation or
 * of the copy, owned by the caller. `size` 0 only checks readiness and error.
 * Python passes a `bytes` object made for this read alone as `destination`
 * (cffi hands over its character array; see private_bytes in
 * pjrt/_runtime/host_reads.py), or ffi.from_buffer of a numpy array. */
intptr_t pjrt_host_read(const PJRT_Api* api, PJRT_Buffer* buffer,
                        void* destination, size_t size);

/* The host address of `buffer`'s memory (dense row-major, `size` bytes) if it
 * has been computed, without waiting for it otherwise: checks the buffer's
 * ready event as pjrt_host_read does, then writes to `address` where the
 * buffer lies in host memory, as pjrt_shim_buffer_host_address finds it, or 0
 * where it does not (device memory, or a padded layout). Returns what
 * pjrt_host_read returns. */
intptr_t pjrt_host_address(const PJRT_Api* api, PJRT_Buffer* buffer, size_t size,
                           uintptr_t* address);
