/*
 * pjrt_c_api_profiler_extension.h -- the PJRT profiler extension, for the
 * `pjrt` host.
 *
 * A plugin that can record its own device activity offers this extension in
 * its PJRT_Api extension_start list (type PJRT_Extension_Type_Profiler). It
 * points at a small function table of its own (PLUGIN_Profiler_Api): make a
 * profiler from serialised tensorflow.ProfileOptions, start it, stop it, and
 * collect what it recorded as a serialised tensorflow.profiler.XSpace. Its
 * errors are its own type, read and freed through the same table, not
 * PJRT_Error.
 *
 * ABI-compatible with OpenXLA's extension (version 1:
 * xla/pjrt/c/pjrt_c_api_profiler_extension.h, and the table it points to,
 * xla/backends/profiler/plugin/profiler_c_api.h), whose interface is
 * Apache-2.0 licensed by the OpenXLA authors; the text and comments here are
 * our own. The table grew by appending entries: read its struct_size before
 * calling an entry.
 *
 * The same cffi rules as pjrt_c_api.h apply: no preprocessor features beyond
 * the include guard, includes, the C++ linkage guards and integer #defines.
 * Include pjrt_c_api.h first.
 */
#ifndef PJRT_C_API_PJRT_C_API_PROFILER_EXTENSION_H_
#define PJRT_C_API_PJRT_C_API_PROFILER_EXTENSION_H_

#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h"

/* C++ linkage guard, opening half; laid out as in pjrt_c_api.h.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

#define PJRT_API_PROFILER_EXTENSION_VERSION 1
#define PLUGIN_PROFILER_VERSION 1

/* A profiler the plugin made; freed with the table's destroy. */
typedef struct PLUGIN_Profiler PLUGIN_Profiler;
/* An error of the profiler table (not a PJRT_Error); freed with error_destroy. */
typedef struct PLUGIN_Profiler_Error PLUGIN_Profiler_Error;

typedef struct PLUGIN_Profiler_Error_Destroy_Args
    PLUGIN_Profiler_Error_Destroy_Args;
struct PLUGIN_Profiler_Error_Destroy_Args {
  size_t struct_size;
  void* priv;
  PLUGIN_Profiler_Error* error; /* may be NULL */
};

typedef void PLUGIN_Profiler_Error_Destroy(
    PLUGIN_Profiler_Error_Destroy_Args* args);

typedef struct PLUGIN_Profiler_Error_Message_Args
    PLUGIN_Profiler_Error_Message_Args;
struct PLUGIN_Profiler_Error_Message_Args {
  size_t struct_size;
  void* priv;
  const PLUGIN_Profiler_Error* error;
  const char* message; /* out; lives as long as the error */
  size_t message_size; /* out */
};

typedef void PLUGIN_Profiler_Error_Message(
    PLUGIN_Profiler_Error_Message_Args* args);

typedef struct PLUGIN_Profiler_Error_GetCode_Args
    PLUGIN_Profiler_Error_GetCode_Args;
struct PLUGIN_Profiler_Error_GetCode_Args {
  size_t struct_size;
  void* priv;
  const PLUGIN_Profiler_Error* error;
  int code; /* out; a PJRT_Error_Code number */
};

typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_Error_GetCode(
    PLUGIN_Profiler_Error_GetCode_Args* args);

typedef struct PLUGIN_Profiler_Create_Args PLUGIN_Profiler_Create_Args;
struct PLUGIN_Profiler_Create_Args {
  size_t struct_size;
  const char* options; /* serialised tensorflow.ProfileOptions */
  size_t options_size;
  PLUGIN_Profiler* profiler; /* out */
};

typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_Create(
    PLUGIN_Profiler_Create_Args* args);

typedef struct PLUGIN_Profiler_Destroy_Args PLUGIN_Profiler_Destroy_Args;
struct PLUGIN_Profiler_Destroy_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
};

typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_Destroy(
    PLUGIN_Profiler_Destroy_Args* args);

typedef struct PLUGIN_Profiler_Start_Args PLUGIN_Profiler_Start_Args;
struct PLUGIN_Profiler_Start_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
};

typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_Start(
    PLUGIN_Profiler_Start_Args* args);

typedef struct PLUGIN_Profiler_Stop_Args PLUGIN_Profiler_Stop_Args;
struct PLUGIN_Profiler_Stop_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
};

typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_Stop(
    PLUGIN_Profiler_Stop_Args* args);

typedef struct PLUGIN_Profiler_CollectData_Args
    PLUGIN_Profiler_CollectData_Args;
struct PLUGIN_Profiler_CollectData_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
  /* in/out. Called with NULL, a plugin either sets it to bytes of its own
     (valid until the profiler is destroyed) or only sets
     buffer_size_in_bytes, for a second call with a buffer that large. */
  uint8_t* buffer;
  size_t buffer_size_in_bytes; /* out */
};

/* The recorded activity, a serialised tensorflow.profiler.XSpace; call after
   stop. */
typedef PLUGIN_Profiler_Error* PLUGIN_Profiler_CollectData(
    PLUGIN_Profiler_CollectData_Args* args);

typedef struct PLUGIN_Profiler_Api PLUGIN_Profiler_Api;
struct PLUGIN_Profiler_Api {
  size_t struct_size;
  void* priv;
  PLUGIN_Profiler_Error_Destroy* error_destroy;
  PLUGIN_Profiler_Error_Message* error_message;
  PLUGIN_Profiler_Error_GetCode* error_get_code;
  PLUGIN_Profiler_Create* create;
  PLUGIN_Profiler_Destroy* destroy;
  PLUGIN_Profiler_Start* start;
  PLUGIN_Profiler_Stop* stop;
  PLUGIN_Profiler_CollectData* collect_data;
  /* Entries a newer table appends come after collect_data. */
};

typedef struct PJRT_Profiler_Extension {
  PJRT_Extension_Base base;
  /* NULL where the extension only rides along a call's arguments */
  PLUGIN_Profiler_Api* profiler_api;
  /* meaningful only as a call's argument extension */
  int64_t traceme_context_id;
} PJRT_Profiler_Extension;

/* C++ linkage guard, closing half.
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_PJRT_C_API_PROFILER_EXTENSION_H_ */
