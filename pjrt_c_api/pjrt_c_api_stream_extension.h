/*
 * pjrt_c_api_stream_extension.h -- the PJRT stream extension, for the `pjrt`
 * host.
 *
 * A GPU plugin lets its host exchange device memory with other libraries
 * (DLPack: PyTorch, CuPy) without the host waiting: it offers this extension
 * in its PJRT_Api extension_start list (type PJRT_Extension_Type_Stream).
 *
 * get_stream gives the device's stream on which memory handed to the plugin
 * from outside should be made ready (a cudaStream_t or hipStream_t, as an
 * integer): a producer makes that stream wait for its own work, then the
 * plugin may read the memory. wait_stream makes a consumer's stream wait until
 * a buffer's value is computed, so the consumer may read it on that stream.
 *
 * ABI-compatible with OpenXLA's extension (version 0:
 * xla/pjrt/c/pjrt_c_api_stream_extension.h), whose interface is Apache-2.0
 * licensed by the OpenXLA authors; the text and comments here are our own.
 * pjrt reads the layout in core/pjrt/_capi/stream_extension.py without this
 * header being compiled in; it is here to say what that code reads.
 *
 * The same cffi rules as pjrt_c_api.h apply. Include pjrt_c_api.h first.
 */
#ifndef PJRT_C_API_PJRT_C_API_STREAM_EXTENSION_H_
#define PJRT_C_API_PJRT_C_API_STREAM_EXTENSION_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PJRT_API_STREAM_EXTENSION_VERSION 0

/* Unlike most PJRT argument structs, these two have no extension_start. */
struct PJRT_Get_Stream_For_External_Ready_Events_Args {
  size_t struct_size;
  PJRT_Device* device;
  intptr_t stream; /* out: the device's stream for external ready events */
};
typedef struct PJRT_Get_Stream_For_External_Ready_Events_Args
    PJRT_Get_Stream_For_External_Ready_Events_Args;

typedef PJRT_Error* PJRT_Get_Stream_For_External_Ready_Events(
    PJRT_Get_Stream_For_External_Ready_Events_Args* args);

struct PJRT_Wait_Until_Buffer_Ready_On_Stream_Args {
  size_t struct_size;
  intptr_t stream; /* the consumer's stream, on the buffer's device */
  PJRT_Buffer* buffer;
};
typedef struct PJRT_Wait_Until_Buffer_Ready_On_Stream_Args
    PJRT_Wait_Until_Buffer_Ready_On_Stream_Args;

typedef PJRT_Error* PJRT_Wait_Until_Buffer_Ready_On_Stream(
    PJRT_Wait_Until_Buffer_Ready_On_Stream_Args* args);

typedef struct PJRT_Stream_Extension {
  PJRT_Extension_Base base;
  PJRT_Get_Stream_For_External_Ready_Events* get_stream;
  PJRT_Wait_Until_Buffer_Ready_On_Stream* wait_stream;
} PJRT_Stream_Extension;

#ifdef __cplusplus
}
#endif

#endif /* PJRT_C_API_PJRT_C_API_STREAM_EXTENSION_H_ */
