/*
 * pjrt_c_api_ffi_extension.h -- the PJRT FFI extension, for the `pjrt` host.
 *
 * A plugin built on XLA may offer this extension in its PJRT_Api
 * extension_start list (type PJRT_Extension_Type_FFI). It is the door to the
 * plugin's own copy of the XLA FFI registries: through it a host registers
 * custom-call handlers (see xla_ffi_c_api.h) and user types, and attaches
 * user data to an execute context. Each plugin library carries its own XLA,
 * so a handler must be registered with every plugin that should run it.
 *
 * ABI-compatible with version 2 of OpenXLA's extension
 * (xla/pjrt/c/pjrt_c_api_ffi_extension.h), whose interface is Apache-2.0
 * licensed by the OpenXLA authors; the text and comments here are our own.
 * See PJRT_FFI_TypeID_Register_Args and PJRT_FFI_Register_Handler_Args for
 * the layout caveats.
 *
 * The same cffi rules as pjrt_c_api.h apply: no preprocessor features beyond
 * the include guard, includes, the C++ linkage guards and integer #defines.
 * Include pjrt_c_api.h first.
 */
#ifndef PJRT_C_API_PJRT_C_API_FFI_EXTENSION_H_
#define PJRT_C_API_PJRT_C_API_FFI_EXTENSION_H_

#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h"

/* C++ linkage guard, opening half; laid out as in pjrt_c_api.h.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

#define PJRT_API_FFI_EXTENSION_VERSION 2

/* -------- User types --------------------------------------------------- */

/* What the plugin does with the objects of a user type it holds, such as a
   handler's per-call-site state (XLA_FFI_State_Set in xla_ffi_c_api.h). The
   plugins pjrt is tested with refuse to hold a state whose type has no
   deleter. */
typedef struct PJRT_FFI_Type_Info PJRT_FFI_Type_Info;
struct PJRT_FFI_Type_Info {
  void (*deleter)(void* object); /* frees one object when its owner dies */
  void* serialize;   /* read by newer plugins only; NULL: not serializable */
  void* deserialize; /* read by newer plugins only; NULL: not serializable */
};

/* The plugins pjrt is tested with read `type_info` and refuse the struct
   without it (40 bytes, an earlier build of this extension). */
typedef struct PJRT_FFI_TypeID_Register_Args PJRT_FFI_TypeID_Register_Args;
struct PJRT_FFI_TypeID_Register_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* type_name;
  size_t type_name_size;
  /* in: 0 asks the plugin to assign an id, anything else is checked against
     the id already registered under that name; out: the id */
  int64_t type_id;
  const PJRT_FFI_Type_Info* type_info; /* never NULL: the plugin reads it */
};

/* The name upstream code uses for the same struct. */
typedef PJRT_FFI_TypeID_Register_Args PJRT_FFI_Type_Register_Args;

/* Registers a user type by name in the plugin's FFI type registry. */
typedef PJRT_Error* PJRT_FFI_TypeID_Register(
    PJRT_FFI_TypeID_Register_Args* args);

/* A pointer handed to FFI handlers through the execute context. */
typedef struct PJRT_FFI_UserData PJRT_FFI_UserData;
struct PJRT_FFI_UserData {
  int64_t type_id;
  void* data;
  void (*deleter)(void* data); /* may be NULL; called when the context dies */
};

typedef struct PJRT_FFI_UserData_Add_Args PJRT_FFI_UserData_Add_Args;
struct PJRT_FFI_UserData_Add_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context;
  PJRT_FFI_UserData user_data;
};

/* Attaches user data to an execute context. */
typedef PJRT_Error* PJRT_FFI_UserData_Add(PJRT_FFI_UserData_Add_Args* args);

/* -------- Handlers ----------------------------------------------------- */

/* Bits of PJRT_FFI_Register_Handler_Args.traits (the XLA FFI traits). */
typedef enum {
  PJRT_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE = 1
} PJRT_FFI_Handler_TraitsBits;

/* Note: unlike most PJRT argument structs this one has no extension_start.

   Layout history, because upstream changed it without bumping
   PJRT_API_FFI_EXTENSION_VERSION: early builds of version 2 had an
   `int api_version` between target_name_size and handler (0 selected legacy
   untyped custom calls) and no `traits`. Current builds, which this header
   follows and which both plugins pjrt is tested with use (checked by reading
   their machine code), dropped `api_version` and only take typed FFI
   handlers. The two layouts cannot be told apart from the extension itself,
   so a plugin built in between is not supported. */
typedef struct PJRT_FFI_Register_Handler_Args PJRT_FFI_Register_Handler_Args;
struct PJRT_FFI_Register_Handler_Args {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler; /* an XLA_FFI_Handler* (see xla_ffi_c_api.h) */
  const char* platform_name; /* e.g. "cpu" or "host"; case-insensitive */
  size_t platform_name_size;
  PJRT_FFI_Handler_TraitsBits traits;
};

/* Registers `handler` for custom-call target `target_name` on a platform.
   The plugin keeps the pointer for the life of the process. Current
   plugins forward this to the XLA FFI registry, which first calls the
   handler once with a metadata query (see xla_ffi_c_api.h) and rejects it
   unless it reports an FFI version the plugin supports; the rejection comes
   back as the returned error. */
typedef PJRT_Error* PJRT_FFI_Register_Handler(
    PJRT_FFI_Register_Handler_Args* args);

/* -------- The extension ------------------------------------------------ */

typedef struct PJRT_FFI_Extension PJRT_FFI_Extension;
struct PJRT_FFI_Extension {
  PJRT_Extension_Base base; /* type == PJRT_Extension_Type_FFI */
  PJRT_Error* (*type_id_register)(PJRT_FFI_TypeID_Register_Args* args);
  PJRT_Error* (*user_data_add)(PJRT_FFI_UserData_Add_Args* args);
  /* absent from the first version; check base.struct_size */
  PJRT_Error* (*register_handler)(PJRT_FFI_Register_Handler_Args* args);
};

/* The name upstream code uses for the same struct. */
typedef PJRT_FFI_Extension PJRT_FFI;

/* C++ linkage guard, closing half (same layout as the opening half).
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_PJRT_C_API_FFI_EXTENSION_H_ */
