/*
 * xla_ffi_c_api.h -- XLA FFI C API declarations for the `pjrt` Python host.
 *
 * XLA FFI is the interface through which a compiled XLA program calls
 * "custom call" handlers written outside XLA: a `stablehlo.custom_call` with
 * `api_version = 4` names a target, and the runtime looks the target up in a
 * registry of handlers and calls it with one XLA_FFI_CallFrame describing the
 * operands, results and attributes. Handlers reach the runtime back through
 * the XLA_FFI_Api table the call frame points to (to build errors, for one).
 *
 * This header is ABI-compatible with XLA FFI API version 0.3 (the version in
 * jaxlib 0.10.2, xla/ffi/api/c_api.h): every struct, enum value and table slot
 * below has the layout and order of that version. The interface is
 * Apache-2.0 licensed by the OpenXLA authors; the text and comments here are
 * our own. Handlers use it from C (plugins/cpu's LAPACK kernels) and pjrt's
 * cffi module decodes call frames for handlers written in Python.
 *
 * Versioning follows PJRT's rules (see pjrt_c_api.h): structs start with
 * `struct_size` and only grow at the end, and a struct's size is the offset
 * of its last field plus that field's size. The runtime asks a handler which
 * FFI version it was written against before accepting it (see "Metadata"
 * below); a handler must answer with a version the runtime supports.
 *
 * Like pjrt_c_api.h this file is fed to cffi after every line starting with
 * '#' is deleted (integer #defines excepted), so it uses no preprocessor
 * features beyond the include guard, the includes, the C++ linkage guards and
 * integer #defines, and every declaration is plain C.
 */
#ifndef PJRT_C_API_XLA_FFI_C_API_H_
#define PJRT_C_API_XLA_FFI_C_API_H_

#include <stddef.h>
#include <stdint.h>

/* C++ linkage guard, opening half; laid out as in pjrt_c_api.h so that cffi
   sees one comment running to the "end of guard" marker.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

/* The FFI version these declarations describe. */
#define XLA_FFI_API_MAJOR 0
#define XLA_FFI_API_MINOR 3

typedef struct XLA_FFI_Api XLA_FFI_Api;
typedef struct XLA_FFI_InternalApi XLA_FFI_InternalApi;

/* -------- Extensions --------------------------------------------------- */

/* Kinds of structs that can hang off an `extension_start` list. */
typedef enum {
  XLA_FFI_Extension_Metadata = 1
} XLA_FFI_Extension_Type;

/* Common head of every extension struct; `next` is NULL at the list's end. */
typedef struct XLA_FFI_Extension_Base XLA_FFI_Extension_Base;
struct XLA_FFI_Extension_Base {
  size_t struct_size;
  XLA_FFI_Extension_Type type;
  XLA_FFI_Extension_Base* next;
};

/* -------- Version ------------------------------------------------------ */

typedef struct XLA_FFI_Api_Version XLA_FFI_Api_Version;
struct XLA_FFI_Api_Version {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int major_version; /* filled in by whoever answers the question */
  int minor_version;
};

/* -------- Errors ------------------------------------------------------- */

/* An error object owned by the runtime. A handler that fails returns one
   made with XLA_FFI_Error_Create; the runtime frees it. NULL means success. */
typedef struct XLA_FFI_Error XLA_FFI_Error;

/* Status codes; the same numbering as PJRT_Error_Code (absl's codes). */
typedef enum {
  XLA_FFI_Error_Code_OK = 0,
  XLA_FFI_Error_Code_CANCELLED = 1,
  XLA_FFI_Error_Code_UNKNOWN = 2,
  XLA_FFI_Error_Code_INVALID_ARGUMENT = 3,
  XLA_FFI_Error_Code_DEADLINE_EXCEEDED = 4,
  XLA_FFI_Error_Code_NOT_FOUND = 5,
  XLA_FFI_Error_Code_ALREADY_EXISTS = 6,
  XLA_FFI_Error_Code_PERMISSION_DENIED = 7,
  XLA_FFI_Error_Code_RESOURCE_EXHAUSTED = 8,
  XLA_FFI_Error_Code_FAILED_PRECONDITION = 9,
  XLA_FFI_Error_Code_ABORTED = 10,
  XLA_FFI_Error_Code_OUT_OF_RANGE = 11,
  XLA_FFI_Error_Code_UNIMPLEMENTED = 12,
  XLA_FFI_Error_Code_INTERNAL = 13,
  XLA_FFI_Error_Code_UNAVAILABLE = 14,
  XLA_FFI_Error_Code_DATA_LOSS = 15,
  XLA_FFI_Error_Code_UNAUTHENTICATED = 16
} XLA_FFI_Error_Code;

typedef struct XLA_FFI_Error_Create_Args XLA_FFI_Error_Create_Args;
struct XLA_FFI_Error_Create_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const char* message; /* NUL-terminated; copied by the runtime */
  XLA_FFI_Error_Code errc;
};

/* Makes a new error; the message is copied. */
typedef XLA_FFI_Error* XLA_FFI_Error_Create(XLA_FFI_Error_Create_Args* args);

typedef struct XLA_FFI_Error_GetMessage_Args XLA_FFI_Error_GetMessage_Args;
struct XLA_FFI_Error_GetMessage_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Error* error;
  const char* message; /* out; lives as long as the error */
};

typedef void XLA_FFI_Error_GetMessage(XLA_FFI_Error_GetMessage_Args* args);

typedef struct XLA_FFI_Error_Destroy_Args XLA_FFI_Error_Destroy_Args;
struct XLA_FFI_Error_Destroy_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Error* error;
};

/* Frees an error that came back from an XLA_FFI_Api call. */
typedef void XLA_FFI_Error_Destroy(XLA_FFI_Error_Destroy_Args* args);

/* -------- Element types ------------------------------------------------ */

/* Element types of buffers, scalars and arrays; the numbers are those of
   xla::PrimitiveType and match PJRT_Buffer_Type where both have a type. */
typedef enum {
  XLA_FFI_DataType_INVALID = 0,
  XLA_FFI_DataType_PRED = 1,
  XLA_FFI_DataType_S1 = 30,
  XLA_FFI_DataType_S2 = 26,
  XLA_FFI_DataType_S4 = 21,
  XLA_FFI_DataType_S8 = 2,
  XLA_FFI_DataType_S16 = 3,
  XLA_FFI_DataType_S32 = 4,
  XLA_FFI_DataType_S64 = 5,
  XLA_FFI_DataType_U1 = 31,
  XLA_FFI_DataType_U2 = 27,
  XLA_FFI_DataType_U4 = 22,
  XLA_FFI_DataType_U8 = 6,
  XLA_FFI_DataType_U16 = 7,
  XLA_FFI_DataType_U32 = 8,
  XLA_FFI_DataType_U64 = 9,
  XLA_FFI_DataType_F16 = 10,
  XLA_FFI_DataType_F32 = 11,
  XLA_FFI_DataType_F64 = 12,
  XLA_FFI_DataType_BF16 = 16,
  XLA_FFI_DataType_C64 = 15,
  XLA_FFI_DataType_C128 = 18,
  XLA_FFI_DataType_TOKEN = 17,
  XLA_FFI_DataType_F8E5M2 = 19,
  XLA_FFI_DataType_F8E3M4 = 29,
  XLA_FFI_DataType_F8E4M3 = 28,
  XLA_FFI_DataType_F8E4M3FN = 20,
  XLA_FFI_DataType_F8E4M3B11FNUZ = 23,
  XLA_FFI_DataType_F8E5M2FNUZ = 24,
  XLA_FFI_DataType_F8E4M3FNUZ = 25,
  XLA_FFI_DataType_F4E2M1FN = 32,
  XLA_FFI_DataType_F8E8M0FNU = 33
} XLA_FFI_DataType;

/* -------- Operands, results and attributes ------------------------------ */

/* A dense array in device memory: an operand or a result of the call. On
   the CPU backend `data` is host memory. Elements are laid out as the
   custom call's operand_layouts/result_layouts say (row-major when none
   are given); `dims` lists the logical dimensions, major to minor. */
typedef struct XLA_FFI_Buffer XLA_FFI_Buffer;
struct XLA_FFI_Buffer {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims; /* rank entries */
};

/* What one entry of XLA_FFI_Args.args points to. */
typedef enum {
  XLA_FFI_ArgType_BUFFER = 1
} XLA_FFI_ArgType;

/* What one entry of XLA_FFI_Rets.rets points to. */
typedef enum {
  XLA_FFI_RetType_BUFFER = 1
} XLA_FFI_RetType;

/* What one entry of XLA_FFI_Attrs.attrs points to: an XLA_FFI_Array, an
   XLA_FFI_Attrs (a nested dictionary), an XLA_FFI_Scalar or an
   XLA_FFI_ByteSpan (a string). */
typedef enum {
  XLA_FFI_AttrType_ARRAY = 1,
  XLA_FFI_AttrType_DICTIONARY = 2,
  XLA_FFI_AttrType_SCALAR = 3,
  XLA_FFI_AttrType_STRING = 4
} XLA_FFI_AttrType;

/* Per-call state of the runtime; opaque to handlers. */
typedef struct XLA_FFI_ExecutionContext XLA_FFI_ExecutionContext;

/* A string as pointer and length; not NUL-terminated. */
typedef struct XLA_FFI_ByteSpan XLA_FFI_ByteSpan;
struct XLA_FFI_ByteSpan {
  const char* ptr;
  size_t len;
};

/* One scalar attribute; `value` points to a value of type `dtype`. */
typedef struct XLA_FFI_Scalar XLA_FFI_Scalar;
struct XLA_FFI_Scalar {
  XLA_FFI_DataType dtype;
  void* value;
};

/* A dense array attribute of `size` elements of type `dtype`. */
typedef struct XLA_FFI_Array XLA_FFI_Array;
struct XLA_FFI_Array {
  XLA_FFI_DataType dtype;
  size_t size;
  void* data;
};

/* -------- User types --------------------------------------------------- */

typedef struct XLA_FFI_TypeId XLA_FFI_TypeId;
struct XLA_FFI_TypeId {
  int64_t type_id; /* 0 means "not assigned" */
};

typedef struct XLA_FFI_TypeInfo XLA_FFI_TypeInfo;
struct XLA_FFI_TypeInfo {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  void (*deleter)(void* object);
};

/* -------- Futures (asynchronous handlers) ------------------------------ */

typedef struct XLA_FFI_Future XLA_FFI_Future;

typedef struct XLA_FFI_Future_Create_Args XLA_FFI_Future_Create_Args;
struct XLA_FFI_Future_Create_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_Future_Create(XLA_FFI_Future_Create_Args* args);

typedef struct XLA_FFI_Future_SetAvailable_Args XLA_FFI_Future_SetAvailable_Args;
struct XLA_FFI_Future_SetAvailable_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future;
};

typedef XLA_FFI_Error* XLA_FFI_Future_SetAvailable(
    XLA_FFI_Future_SetAvailable_Args* args);

typedef struct XLA_FFI_Future_SetError_Args XLA_FFI_Future_SetError_Args;
struct XLA_FFI_Future_SetError_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future;
  XLA_FFI_Error* error; /* the runtime takes ownership */
};

typedef XLA_FFI_Error* XLA_FFI_Future_SetError(
    XLA_FFI_Future_SetError_Args* args);

/* -------- Call frames -------------------------------------------------- */

/* The stages at which the runtime may call a handler. A handler registered
   through PJRT's FFI extension is the "execute" member of its bundle, so it
   is called at EXECUTE (and once, at registration, for the metadata query
   described below). The other stages exist for handler bundles that keep
   state per call site; argument memory must not be read before EXECUTE. */
typedef enum {
  XLA_FFI_ExecutionStage_INSTANTIATE = 0,
  XLA_FFI_ExecutionStage_PREPARE = 1,
  XLA_FFI_ExecutionStage_INITIALIZE = 2,
  XLA_FFI_ExecutionStage_EXECUTE = 3
} XLA_FFI_ExecutionStage;

/* The operands of a call, in order. */
typedef struct XLA_FFI_Args XLA_FFI_Args;
struct XLA_FFI_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_ArgType* types; /* size entries */
  void** args;            /* size entries; XLA_FFI_Buffer* for BUFFER */
};

/* The results of a call, in order. */
typedef struct XLA_FFI_Rets XLA_FFI_Rets;
struct XLA_FFI_Rets {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_RetType* types; /* size entries */
  void** rets;            /* size entries; XLA_FFI_Buffer* for BUFFER */
};

/* The attributes of a call (the custom call's backend_config dictionary),
   sorted by name so a handler may binary-search them. */
typedef struct XLA_FFI_Attrs XLA_FFI_Attrs;
struct XLA_FFI_Attrs {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_AttrType* types;   /* size entries */
  XLA_FFI_ByteSpan** names;  /* size entries */
  void** attrs;              /* size entries; see XLA_FFI_AttrType */
};

/* Everything a handler is given for one call. */
typedef struct XLA_FFI_CallFrame XLA_FFI_CallFrame;
struct XLA_FFI_CallFrame {
  size_t struct_size;
  /* At registration the runtime calls the handler once with an
     XLA_FFI_Metadata_Extension here (and api == NULL) to ask for its
     version and traits; the handler fills them in and returns NULL. */
  XLA_FFI_Extension_Base* extension_start;
  const XLA_FFI_Api* api;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_Args args;
  XLA_FFI_Rets rets;
  XLA_FFI_Attrs attrs;
  /* out: an asynchronous handler may set a future the runtime waits on.
     The runtime's frames have this field, but struct_size counts only up
     to `attrs`. */
  XLA_FFI_Future* future;
};

/* -------- Handlers ----------------------------------------------------- */

/* A handler: returns NULL on success or an error made with the call frame's
   api->XLA_FFI_Error_Create. */
typedef XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame* call_frame);

/* Handlers for each stage; only `execute` is required. */
typedef struct XLA_FFI_Handler_Bundle XLA_FFI_Handler_Bundle;
struct XLA_FFI_Handler_Bundle {
  XLA_FFI_Handler* instantiate;
  XLA_FFI_Handler* prepare;
  XLA_FFI_Handler* initialize;
  XLA_FFI_Handler* execute;
};

/* Bits of XLA_FFI_Handler_Traits. */
typedef enum {
  /* the handler may be captured into a command buffer (GPU graphs) */
  XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE = 1
} XLA_FFI_Handler_TraitsBits;

typedef uint32_t XLA_FFI_Handler_Traits;

typedef struct XLA_FFI_Handler_Register_Args XLA_FFI_Handler_Register_Args;
struct XLA_FFI_Handler_Register_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ByteSpan name;
  XLA_FFI_ByteSpan platform;
  XLA_FFI_Handler_Bundle bundle;
  XLA_FFI_Handler_Traits traits;
};

typedef XLA_FFI_Error* XLA_FFI_Handler_Register(
    XLA_FFI_Handler_Register_Args* args);

typedef struct XLA_FFI_Type_Register_Args XLA_FFI_Type_Register_Args;
struct XLA_FFI_Type_Register_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ByteSpan name;
  XLA_FFI_TypeId* type_id; /* in: 0 to have one assigned; out: the id */
  const XLA_FFI_TypeInfo* type_info;
};

typedef XLA_FFI_Error* XLA_FFI_Type_Register(XLA_FFI_Type_Register_Args* args);

/* -------- Runtime services reachable from a handler -------------------- */

typedef struct XLA_FFI_ExecutionContext_Get_Args XLA_FFI_ExecutionContext_Get_Args;
struct XLA_FFI_ExecutionContext_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_TypeId* type_id;
  void* data; /* out: user data of that type attached to the execution */
};

typedef XLA_FFI_Error* XLA_FFI_ExecutionContext_Get(
    XLA_FFI_ExecutionContext_Get_Args* args);

typedef struct XLA_FFI_State_Set_Args XLA_FFI_State_Set_Args;
struct XLA_FFI_State_Set_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_TypeId* type_id;
  void* state;
};

typedef XLA_FFI_Error* XLA_FFI_State_Set(XLA_FFI_State_Set_Args* args);

typedef struct XLA_FFI_State_Get_Args XLA_FFI_State_Get_Args;
struct XLA_FFI_State_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_TypeId* type_id;
  void* state; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_State_Get(XLA_FFI_State_Get_Args* args);

/* The state arguments of FFI 0.2 runtimes (XLA_FFI_Api.api_version 0.2),
   which have no `stage` and always mean the INSTANTIATE stage's state. A 0.2
   runtime reads `type_id` where the structs above have `stage`, so a caller
   picks the layout by the runtime's version; the 0.3 runtime takes this one
   too (it tells the two apart by struct_size). */
typedef struct XLA_FFI_State_Args_V02 XLA_FFI_State_Args_V02;
struct XLA_FFI_State_Args_V02 {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_TypeId* type_id;
  void* state; /* in for XLA_FFI_State_Set, out for XLA_FFI_State_Get */
};

typedef struct XLA_FFI_Stream_Get_Args XLA_FFI_Stream_Get_Args;
struct XLA_FFI_Stream_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  void* stream; /* out; GPU backends only */
};

typedef XLA_FFI_Error* XLA_FFI_Stream_Get(XLA_FFI_Stream_Get_Args* args);

typedef struct XLA_FFI_DeviceMemory_Allocate_Args XLA_FFI_DeviceMemory_Allocate_Args;
struct XLA_FFI_DeviceMemory_Allocate_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  size_t size;
  size_t alignment;
  void* data; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_DeviceMemory_Allocate(
    XLA_FFI_DeviceMemory_Allocate_Args* args);

typedef struct XLA_FFI_DeviceMemory_Free_Args XLA_FFI_DeviceMemory_Free_Args;
struct XLA_FFI_DeviceMemory_Free_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  size_t size;
  void* data;
};

typedef XLA_FFI_Error* XLA_FFI_DeviceMemory_Free(
    XLA_FFI_DeviceMemory_Free_Args* args);

/* A unit of work for the runtime's thread pool. */
typedef void XLA_FFI_Task(void* data);

typedef struct XLA_FFI_ThreadPool_Schedule_Args XLA_FFI_ThreadPool_Schedule_Args;
struct XLA_FFI_ThreadPool_Schedule_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_Task* task;
  void* data;
};

typedef XLA_FFI_Error* XLA_FFI_ThreadPool_Schedule(
    XLA_FFI_ThreadPool_Schedule_Args* args);

typedef struct XLA_FFI_ThreadPool_NumThreads_Args XLA_FFI_ThreadPool_NumThreads_Args;
struct XLA_FFI_ThreadPool_NumThreads_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  int64_t* num_threads; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_ThreadPool_NumThreads(
    XLA_FFI_ThreadPool_NumThreads_Args* args);

typedef struct XLA_FFI_RunId_Get_Args XLA_FFI_RunId_Get_Args;
struct XLA_FFI_RunId_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  int64_t run_id; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_RunId_Get(XLA_FFI_RunId_Get_Args* args);

typedef struct XLA_FFI_DeviceOrdinal_Get_Args XLA_FFI_DeviceOrdinal_Get_Args;
struct XLA_FFI_DeviceOrdinal_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  int32_t device_ordinal; /* out */
};

typedef XLA_FFI_Error* XLA_FFI_DeviceOrdinal_Get(
    XLA_FFI_DeviceOrdinal_Get_Args* args);

/* -------- Metadata ----------------------------------------------------- */

/* What a handler reports about itself when asked (see XLA_FFI_CallFrame).
   The runtime sets struct_size; `state_type_id` exists only when
   struct_size reaches past it, so check before writing it. */
typedef struct XLA_FFI_Metadata XLA_FFI_Metadata;
struct XLA_FFI_Metadata {
  size_t struct_size;
  XLA_FFI_Api_Version api_version; /* out */
  XLA_FFI_Handler_Traits traits;   /* out */
  XLA_FFI_TypeId state_type_id;    /* out; 0 for stateless handlers */
};

/* The extension the runtime passes in a metadata query. */
typedef struct XLA_FFI_Metadata_Extension XLA_FFI_Metadata_Extension;
struct XLA_FFI_Metadata_Extension {
  XLA_FFI_Extension_Base extension_base;
  XLA_FFI_Metadata* metadata;
};

/* -------- The API table ------------------------------------------------ */

/* The runtime's function table, reachable from every call frame. Entries
   are only appended; check struct_size before using a late one. */
struct XLA_FFI_Api {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Api_Version api_version;
  const XLA_FFI_InternalApi* internal_api;

  XLA_FFI_Error* (*XLA_FFI_Error_Create)(XLA_FFI_Error_Create_Args* args);
  void (*XLA_FFI_Error_GetMessage)(XLA_FFI_Error_GetMessage_Args* args);
  void (*XLA_FFI_Error_Destroy)(XLA_FFI_Error_Destroy_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Handler_Register)(
      XLA_FFI_Handler_Register_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Stream_Get)(XLA_FFI_Stream_Get_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Type_Register)(XLA_FFI_Type_Register_Args* args);
  XLA_FFI_Error* (*XLA_FFI_ExecutionContext_Get)(
      XLA_FFI_ExecutionContext_Get_Args* args);
  XLA_FFI_Error* (*XLA_FFI_State_Set)(XLA_FFI_State_Set_Args* args);
  XLA_FFI_Error* (*XLA_FFI_State_Get)(XLA_FFI_State_Get_Args* args);
  XLA_FFI_Error* (*XLA_FFI_DeviceMemory_Allocate)(
      XLA_FFI_DeviceMemory_Allocate_Args* args);
  XLA_FFI_Error* (*XLA_FFI_DeviceMemory_Free)(
      XLA_FFI_DeviceMemory_Free_Args* args);
  XLA_FFI_Error* (*XLA_FFI_ThreadPool_Schedule)(
      XLA_FFI_ThreadPool_Schedule_Args* args);
  XLA_FFI_Error* (*XLA_FFI_ThreadPool_NumThreads)(
      XLA_FFI_ThreadPool_NumThreads_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Future_Create)(XLA_FFI_Future_Create_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Future_SetAvailable)(
      XLA_FFI_Future_SetAvailable_Args* args);
  XLA_FFI_Error* (*XLA_FFI_Future_SetError)(XLA_FFI_Future_SetError_Args* args);
  XLA_FFI_Error* (*XLA_FFI_RunId_Get)(XLA_FFI_RunId_Get_Args* args);
  XLA_FFI_Error* (*XLA_FFI_DeviceOrdinal_Get)(
      XLA_FFI_DeviceOrdinal_Get_Args* args);
};

/* C++ linkage guard, closing half (same layout as the opening half).
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_XLA_FFI_C_API_H_ */
