/*
 * pjrt_c_api_layouts_extension.h -- the PJRT layouts extension, for the
 * `pjrt` host.
 *
 * A plugin may offer this extension in its PJRT_Api extension_start list
 * (type PJRT_Extension_Type_Layouts). It answers the layout questions the core
 * API cannot: the layout a client would give a new buffer of a shape, the
 * layouts a compiled program takes and returns, and a buffer's layout as an
 * opaque object that can be serialised (an XLA LayoutProto).
 *
 * ABI-compatible with OpenXLA's extension
 * (xla/pjrt/c/pjrt_c_api_layouts_extension.h), whose interface is Apache-2.0
 * licensed by the OpenXLA authors; the text and comments here are our own.
 * The extension grew by appending entries to PJRT_Layouts_Extension: read its
 * base.struct_size before touching an entry (older plugins end after
 * PJRT_Layouts_PJRT_Buffer_MemoryLayout).
 *
 * The same cffi rules as pjrt_c_api.h apply: no preprocessor features beyond
 * the include guard, includes, the C++ linkage guards and integer #defines.
 * Include pjrt_c_api.h first.
 */
#ifndef PJRT_C_API_PJRT_C_API_LAYOUTS_EXTENSION_H_
#define PJRT_C_API_PJRT_C_API_LAYOUTS_EXTENSION_H_

#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h"

/* C++ linkage guard, opening half; laid out as in pjrt_c_api.h.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

#define PJRT_API_LAYOUTS_EXTENSION_VERSION 3

/* A layout owned by the plugin; freed with PJRT_Layouts_MemoryLayout_Destroy
   unless a function says the layout belongs to another object. */
typedef struct PJRT_Layouts_MemoryLayout PJRT_Layouts_MemoryLayout;
/* Backs the bytes of a serialised layout until its deleter is called. */
typedef struct PJRT_Layouts_SerializedLayout PJRT_Layouts_SerializedLayout;

typedef struct PJRT_Layouts_MemoryLayout_Destroy_Args
    PJRT_Layouts_MemoryLayout_Destroy_Args;
struct PJRT_Layouts_MemoryLayout_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Layouts_MemoryLayout* layout; /* may be NULL */
};

typedef PJRT_Error* PJRT_Layouts_MemoryLayout_Destroy(
    PJRT_Layouts_MemoryLayout_Destroy_Args* args);

typedef struct PJRT_Layouts_MemoryLayout_Serialize_Args
    PJRT_Layouts_MemoryLayout_Serialize_Args;
struct PJRT_Layouts_MemoryLayout_Serialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Layouts_MemoryLayout* layout;
  const char* serialized_bytes;  /* out; valid until the deleter runs */
  size_t serialized_bytes_size;  /* out */
  PJRT_Layouts_SerializedLayout* serialized_layout; /* out */
  /* out; call once on serialized_layout when done with the bytes */
  void (*serialized_layout_deleter)(PJRT_Layouts_SerializedLayout* s_layout);
};

/* Serialises a layout (XLA's LayoutProto wire format). */
typedef PJRT_Error* PJRT_Layouts_MemoryLayout_Serialize(
    PJRT_Layouts_MemoryLayout_Serialize_Args* args);

typedef struct PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args
    PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args;
struct PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Layouts_MemoryLayout* layout; /* out; caller destroys */
};

/* The layout of a buffer's data. */
typedef PJRT_Error* PJRT_Layouts_PJRT_Buffer_MemoryLayout(
    PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args* args);

typedef struct PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args
    PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args;
struct PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Layouts_MemoryLayout* layout; /* out; caller destroys */
};

/* The layout the client gives a new buffer of this element type and shape. */
typedef PJRT_Error* PJRT_Layouts_PJRT_Client_GetDefaultLayout(
    PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args* args);

typedef struct PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args
    PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args;
struct PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology_description;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Layouts_MemoryLayout* layout; /* out; caller destroys */
};

/* As above, for a topology (compiling without the devices). */
typedef PJRT_Error* PJRT_Layouts_PJRT_Topology_GetDefaultLayout(
    PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args* args);

typedef struct PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args
    PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args;
struct PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;                  /* out */
  PJRT_Layouts_MemoryLayout** layouts; /* out; owned by the executable */
};

/* The layouts of a program's outputs. */
typedef PJRT_Error* PJRT_Layouts_PJRT_Executable_GetOutputLayouts(
    PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args* args);

typedef struct PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args
    PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args;
struct PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_parameters;               /* out */
  PJRT_Layouts_MemoryLayout** layouts; /* out; owned by the executable */
};

/* The layouts a program expects of its parameters. */
typedef PJRT_Error* PJRT_Layouts_PJRT_Executable_GetParameterLayouts(
    PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args* args);

typedef struct PJRT_Layouts_Extension {
  PJRT_Extension_Base base;
  PJRT_Layouts_MemoryLayout_Destroy* PJRT_Layouts_MemoryLayout_Destroy;
  PJRT_Layouts_MemoryLayout_Serialize* PJRT_Layouts_MemoryLayout_Serialize;
  PJRT_Layouts_PJRT_Client_GetDefaultLayout*
      PJRT_Layouts_PJRT_Client_GetDefaultLayout;
  PJRT_Layouts_PJRT_Buffer_MemoryLayout* PJRT_Layouts_PJRT_Buffer_MemoryLayout;
  /* Entries below are newer; check base.struct_size. */
  PJRT_Layouts_PJRT_Topology_GetDefaultLayout*
      PJRT_Layouts_PJRT_Topology_GetDefaultLayout;
  PJRT_Layouts_PJRT_Executable_GetOutputLayouts*
      PJRT_Layouts_PJRT_Executable_GetOutputLayouts;
  PJRT_Layouts_PJRT_Executable_GetParameterLayouts*
      PJRT_Layouts_PJRT_Executable_GetParameterLayouts;
} PJRT_Layouts_Extension;

/* C++ linkage guard, closing half.
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_PJRT_C_API_LAYOUTS_EXTENSION_H_ */
