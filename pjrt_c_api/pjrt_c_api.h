/*
 * pjrt_c_api.h -- PJRT C API declarations for the `pjrt` Python host.
 *
 * This header declares the plugin interface that PJRT plugins export through
 * GetPjrtApi(). It is ABI-compatible with OpenXLA's PJRT C API version 0.114
 * (xla/pjrt/c/pjrt_c_api.h): every struct, enum value and PJRT_Api slot below
 * has the same layout and order as that version. Declarations follow the
 * upstream interface, which is Apache-2.0 licensed by the OpenXLA authors;
 * the text and comments here are our own.
 *
 * How versioning works
 *   - PJRT only grows by appending: new PJRT_Api entries go at the end of the
 *     table and new struct fields go at the end of their struct.
 *   - Every struct starts with `struct_size`. The side that fills a struct
 *     sets it to the size it knows about (offset of its last known field plus
 *     that field's size), so the other side can tell which fields exist.
 *   - A plugin built for an older minor version returns a shorter PJRT_Api
 *     table. Before reading an entry, check that api->struct_size reaches
 *     past that entry (and that it is non-NULL); never assume 0.114.
 *   - Entries and fields added after 0.81 are marked "since 0.NN".
 *
 * Conventions
 *   - Every API function takes a single *_Args struct and returns NULL on
 *     success or a PJRT_Error* the caller must release with
 *     PJRT_Error_Destroy (PJRT_Error_Destroy/PJRT_Error_Message return void).
 *   - Output strings and arrays are owned by the object they came from and
 *     live as long as it, unless a field says a deleter must be called.
 *   - Handles such as PJRT_Client or PJRT_Buffer are opaque.
 *
 * This file is also fed to cffi (core/pjrt/_build_cffi.py drops every line
 * starting with '#' except integer #defines). Apart from the include guard,
 * the includes, the C++ linkage guards and the two integer version macros it
 * uses no preprocessor features, and every declaration is plain C; keep it
 * that way.
 */
#ifndef PJRT_C_API_PJRT_C_API_H_
#define PJRT_C_API_PJRT_C_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* C++ linkage guard, opening half. Our cffi build feeds this file to cffi
   after deleting every line that starts with '#'. Laid out like this, what
   cffi sees of the guard is one comment running to the "end of guard"
   marker, while a C or C++ compiler sees this comment end on the next line
   and then the usual #ifdef block. Keep both halves in this shape.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

/* Version of the interface declared here. The major number changes only on
   ABI breaks; the minor number grows with every appended field or entry. */
#define PJRT_API_MAJOR 0
#define PJRT_API_MINOR 114

/* -------- Extensions --------------------------------------------------- */

/* Identifies an extension struct in the extension_start chain. */
typedef enum {
  PJRT_Extension_Type_Gpu_Custom_Call = 0,
  PJRT_Extension_Type_Profiler = 1,
  PJRT_Extension_Type_Custom_Partitioner = 2,
  PJRT_Extension_Type_Stream = 3,
  PJRT_Extension_Type_Layouts = 4,
  PJRT_Extension_Type_FFI = 5,
  PJRT_Extension_Type_MemoryDescriptions = 6,
  PJRT_Extension_Type_Triton = 7,
  PJRT_Extension_Type_RawBuffer = 8,
  PJRT_Extension_Type_PhaseCompile = 9,
  PJRT_Extension_Type_Example = 10,
  PJRT_Extension_Type_Unknown = 11,
  PJRT_Extension_Type_CrossHostTransfers = 12,
  PJRT_Extension_Type_ExecutableMetadata = 13,
  PJRT_Extension_Type_Callback = 14,
  PJRT_Extension_Type_HostAllocator = 15,
  PJRT_Extension_Type_TpuTopology = 16,
  PJRT_Extension_Type_TpuExecutable = 17,
  PJRT_Extension_Type_Megascale = 18,
  PJRT_Extension_Type_Shardings = 19,
  PJRT_Extension_Type_AbiVersion = 20,
  PJRT_Extension_Type_Collectives = 21,
  PJRT_Extension_Type_MultiSlice = 22,
  PJRT_Extension_Type_HostMemoryAllocator = 23,
  PJRT_Extension_Type_XlaTransform = 24
} PJRT_Extension_Type;

/* Common head of every extension struct. Extensions form a singly linked
   list starting at an `extension_start` field; walk it and match `type`. */
typedef struct PJRT_Extension_Base PJRT_Extension_Base;
struct PJRT_Extension_Base {
  size_t struct_size;
  PJRT_Extension_Type type;
  PJRT_Extension_Base* next; /* NULL ends the list */
};

/* -------- Handles and forward declarations ----------------------------- */

/* Opaque objects created and owned by the plugin. */
typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_TopologyDescription PJRT_TopologyDescription;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;
typedef struct PJRT_FulfillAliasBufferCallback PJRT_FulfillAliasBufferCallback;
typedef struct PJRT_AsyncHostToDeviceTransferManager
    PJRT_AsyncHostToDeviceTransferManager;
typedef struct PJRT_PhaseCompiler PJRT_PhaseCompiler;
typedef struct PJRT_ExecuteContext PJRT_ExecuteContext;
typedef struct PJRT_CopyToDeviceStream PJRT_CopyToDeviceStream;
typedef struct PJRT_AsyncTrackingEvent PJRT_AsyncTrackingEvent;
typedef struct PJRT_MultiSlice_Config PJRT_MultiSlice_Config;

/* Opaque holders that keep serialized bytes alive until their deleter runs. */
typedef struct PJRT_DeviceAssignmentSerialized PJRT_DeviceAssignmentSerialized;
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;
typedef struct PJRT_SerializedTopology PJRT_SerializedTopology;
typedef struct PJRT_SerializedCompileOptions PJRT_SerializedCompileOptions;
typedef struct PJRT_DeviceAttributes PJRT_DeviceAttributes;

/* Structs defined below. */
typedef struct PJRT_Api_Version PJRT_Api_Version;
typedef struct PJRT_Error_Destroy_Args PJRT_Error_Destroy_Args;
typedef struct PJRT_Error_Message_Args PJRT_Error_Message_Args;
typedef struct PJRT_Error_GetCode_Args PJRT_Error_GetCode_Args;
typedef struct PJRT_Error_ForEachPayload_Args PJRT_Error_ForEachPayload_Args;
typedef struct PJRT_NamedValue PJRT_NamedValue;
typedef struct PJRT_Plugin_Initialize_Args PJRT_Plugin_Initialize_Args;
typedef struct PJRT_Plugin_Attributes_Args PJRT_Plugin_Attributes_Args;
typedef struct PJRT_Event_Destroy_Args PJRT_Event_Destroy_Args;
typedef struct PJRT_Event_IsReady_Args PJRT_Event_IsReady_Args;
typedef struct PJRT_Event_Error_Args PJRT_Event_Error_Args;
typedef struct PJRT_Event_Await_Args PJRT_Event_Await_Args;
typedef struct PJRT_Event_OnReady_Args PJRT_Event_OnReady_Args;
typedef struct PJRT_Event_Create_Args PJRT_Event_Create_Args;
typedef struct PJRT_Event_Set_Args PJRT_Event_Set_Args;
typedef struct PJRT_KeyValueGetCallback_Args PJRT_KeyValueGetCallback_Args;
typedef struct PJRT_KeyValueTryGetCallback_Args
    PJRT_KeyValueTryGetCallback_Args;
typedef struct PJRT_KeyValuePutCallback_Args PJRT_KeyValuePutCallback_Args;
typedef struct PJRT_Client_Create_Args PJRT_Client_Create_Args;
typedef struct PJRT_Client_Destroy_Args PJRT_Client_Destroy_Args;
typedef struct PJRT_Client_PlatformName_Args PJRT_Client_PlatformName_Args;
typedef struct PJRT_Client_ProcessIndex_Args PJRT_Client_ProcessIndex_Args;
typedef struct PJRT_Client_PlatformVersion_Args
    PJRT_Client_PlatformVersion_Args;
typedef struct PJRT_Client_TopologyDescription_Args
    PJRT_Client_TopologyDescription_Args;
typedef struct PJRT_Client_Devices_Args PJRT_Client_Devices_Args;
typedef struct PJRT_Client_AddressableDevices_Args
    PJRT_Client_AddressableDevices_Args;
typedef struct PJRT_Client_LookupDevice_Args PJRT_Client_LookupDevice_Args;
typedef struct PJRT_Client_LookupAddressableDevice_Args
    PJRT_Client_LookupAddressableDevice_Args;
typedef struct PJRT_ProcessInfo PJRT_ProcessInfo;
typedef struct PJRT_Client_UpdateGlobalProcessInfo_Args
    PJRT_Client_UpdateGlobalProcessInfo_Args;
typedef struct PJRT_Client_AddressableMemories_Args
    PJRT_Client_AddressableMemories_Args;
typedef struct PJRT_Program PJRT_Program;
typedef struct PJRT_Client_Compile_Args PJRT_Client_Compile_Args;
typedef struct PJRT_Client_Load_Args PJRT_Client_Load_Args;
typedef struct PJRT_Client_DefaultDeviceAssignment_Args
    PJRT_Client_DefaultDeviceAssignment_Args;
typedef struct PJRT_Client_DmaMap_Args PJRT_Client_DmaMap_Args;
typedef struct PJRT_Client_DmaUnmap_Args PJRT_Client_DmaUnmap_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_Destroy_Args
    PJRT_AsyncHostToDeviceTransferManager_Destroy_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_TransferData_Args
    PJRT_AsyncHostToDeviceTransferManager_TransferData_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args
    PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_Device_Args
    PJRT_AsyncHostToDeviceTransferManager_Device_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args
    PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args
    PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args
    PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args
    PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args;
typedef struct PJRT_Buffer_MemoryLayout_Tiled PJRT_Buffer_MemoryLayout_Tiled;
typedef struct PJRT_Buffer_MemoryLayout_Strides
    PJRT_Buffer_MemoryLayout_Strides;
typedef struct PJRT_Buffer_MemoryLayout PJRT_Buffer_MemoryLayout;
typedef struct PJRT_Client_CreateUninitializedBuffer_Args
    PJRT_Client_CreateUninitializedBuffer_Args;
typedef struct PJRT_Client_CreateErrorBuffer_Args
    PJRT_Client_CreateErrorBuffer_Args;
typedef struct PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args
    PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args;
typedef struct PJRT_Client_CreateAliasBuffer_Args
    PJRT_Client_CreateAliasBuffer_Args;
typedef struct PJRT_Client_FulfillAliasBuffer_Args
    PJRT_Client_FulfillAliasBuffer_Args;
typedef struct PJRT_Client_BufferFromHostBuffer_Args
    PJRT_Client_BufferFromHostBuffer_Args;
typedef struct PJRT_Client_CreateViewOfDeviceBuffer_Args
    PJRT_Client_CreateViewOfDeviceBuffer_Args;
typedef struct PJRT_ShapeSpec PJRT_ShapeSpec;
typedef struct PJRT_Client_CreateBuffersForAsyncHostToDevice_Args
    PJRT_Client_CreateBuffersForAsyncHostToDevice_Args;
typedef struct PJRT_DeviceDescription_Id_Args PJRT_DeviceDescription_Id_Args;
typedef struct PJRT_DeviceDescription_ProcessIndex_Args
    PJRT_DeviceDescription_ProcessIndex_Args;
typedef struct PJRT_DeviceDescription_Attributes_Args
    PJRT_DeviceDescription_Attributes_Args;
typedef struct PJRT_DeviceDescription_Kind_Args
    PJRT_DeviceDescription_Kind_Args;
typedef struct PJRT_DeviceDescription_DebugString_Args
    PJRT_DeviceDescription_DebugString_Args;
typedef struct PJRT_DeviceDescription_ToString_Args
    PJRT_DeviceDescription_ToString_Args;
typedef struct PJRT_Device_GetDescription_Args PJRT_Device_GetDescription_Args;
typedef struct PJRT_Device_IsAddressable_Args PJRT_Device_IsAddressable_Args;
typedef struct PJRT_Device_LocalHardwareId_Args
    PJRT_Device_LocalHardwareId_Args;
typedef struct PJRT_Device_AddressableMemories_Args
    PJRT_Device_AddressableMemories_Args;
typedef struct PJRT_Device_DefaultMemory_Args PJRT_Device_DefaultMemory_Args;
typedef struct PJRT_Device_MemoryStats_Args PJRT_Device_MemoryStats_Args;
typedef struct PJRT_Device_ClearMemoryStats_Args
    PJRT_Device_ClearMemoryStats_Args;
typedef struct PJRT_Device_PoisonExecution_Args
    PJRT_Device_PoisonExecution_Args;
typedef struct PJRT_Device_CreateAsyncTrackingEvent_Args
    PJRT_Device_CreateAsyncTrackingEvent_Args;
typedef struct PJRT_AsyncTrackingEvent_Destroy_Args
    PJRT_AsyncTrackingEvent_Destroy_Args;
typedef struct PJRT_Device_GetAttributes_Args PJRT_Device_GetAttributes_Args;
typedef struct PJRT_Memory_Id_Args PJRT_Memory_Id_Args;
typedef struct PJRT_Memory_Kind_Args PJRT_Memory_Kind_Args;
typedef struct PJRT_Memory_Kind_Id_Args PJRT_Memory_Kind_Id_Args;
typedef struct PJRT_Memory_DebugString_Args PJRT_Memory_DebugString_Args;
typedef struct PJRT_Memory_ToString_Args PJRT_Memory_ToString_Args;
typedef struct PJRT_Memory_AddressableByDevices_Args
    PJRT_Memory_AddressableByDevices_Args;
typedef struct PJRT_ExecuteContext_Create_Args PJRT_ExecuteContext_Create_Args;
typedef struct PJRT_ExecuteContext_Destroy_Args
    PJRT_ExecuteContext_Destroy_Args;
typedef struct PJRT_Executable_Destroy_Args PJRT_Executable_Destroy_Args;
typedef struct PJRT_LoadedExecutable_Destroy_Args
    PJRT_LoadedExecutable_Destroy_Args;
typedef struct PJRT_LoadedExecutable_GetExecutable_Args
    PJRT_LoadedExecutable_GetExecutable_Args;
typedef struct PJRT_LoadedExecutable_GetDeviceAssignment_Args
    PJRT_LoadedExecutable_GetDeviceAssignment_Args;
typedef struct PJRT_Executable_Name_Args PJRT_Executable_Name_Args;
typedef struct PJRT_Executable_NumReplicas_Args
    PJRT_Executable_NumReplicas_Args;
typedef struct PJRT_Executable_NumPartitions_Args
    PJRT_Executable_NumPartitions_Args;
typedef struct PJRT_LoadedExecutable_AddressableDevices_Args
    PJRT_LoadedExecutable_AddressableDevices_Args;
typedef struct PJRT_LogicalDeviceIds PJRT_LogicalDeviceIds;
typedef struct PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args;
typedef struct PJRT_Executable_OptimizedProgram_Args
    PJRT_Executable_OptimizedProgram_Args;
typedef struct PJRT_LoadedExecutable_Delete_Args
    PJRT_LoadedExecutable_Delete_Args;
typedef struct PJRT_LoadedExecutable_IsDeleted_Args
    PJRT_LoadedExecutable_IsDeleted_Args;
typedef struct PJRT_Chunk PJRT_Chunk;
typedef struct PJRT_SendCallbackInfo PJRT_SendCallbackInfo;
typedef struct PJRT_RecvCallbackInfo PJRT_RecvCallbackInfo;
typedef struct PJRT_HloOutputCallbackInfo PJRT_HloOutputCallbackInfo;
typedef struct PJRT_ExecuteOptions PJRT_ExecuteOptions;
typedef struct PJRT_LoadedExecutable_Execute_Args
    PJRT_LoadedExecutable_Execute_Args;
typedef struct PJRT_Executable_NumOutputs_Args PJRT_Executable_NumOutputs_Args;
typedef struct PJRT_Executable_SizeOfGeneratedCodeInBytes_Args
    PJRT_Executable_SizeOfGeneratedCodeInBytes_Args;
typedef struct PJRT_Executable_Fingerprint_Args
    PJRT_Executable_Fingerprint_Args;
typedef struct PJRT_Executable_GetCostAnalysis_Args
    PJRT_Executable_GetCostAnalysis_Args;
typedef struct PJRT_Executable_GetCompiledMemoryStats_Args
    PJRT_Executable_GetCompiledMemoryStats_Args;
typedef struct PJRT_Executable_OutputElementTypes_Args
    PJRT_Executable_OutputElementTypes_Args;
typedef struct PJRT_Executable_OutputDimensions_Args
    PJRT_Executable_OutputDimensions_Args;
typedef struct PJRT_Executable_OutputMemoryKinds_Args
    PJRT_Executable_OutputMemoryKinds_Args;
typedef struct PJRT_Executable_ParameterMemoryKinds_Args
    PJRT_Executable_ParameterMemoryKinds_Args;
typedef struct PJRT_Executable_Serialize_Args PJRT_Executable_Serialize_Args;
typedef struct PJRT_Executable_GetCompileOptions_Args
    PJRT_Executable_GetCompileOptions_Args;
typedef struct PJRT_LoadOptions PJRT_LoadOptions;
typedef struct PJRT_Executable_DeserializeAndLoad_Args
    PJRT_Executable_DeserializeAndLoad_Args;
typedef struct PJRT_LoadedExecutable_Fingerprint_Args
    PJRT_LoadedExecutable_Fingerprint_Args;
typedef struct PJRT_Buffer_Destroy_Args PJRT_Buffer_Destroy_Args;
typedef struct PJRT_Buffer_ElementType_Args PJRT_Buffer_ElementType_Args;
typedef struct PJRT_Buffer_Dimensions_Args PJRT_Buffer_Dimensions_Args;
typedef struct PJRT_Buffer_UnpaddedDimensions_Args
    PJRT_Buffer_UnpaddedDimensions_Args;
typedef struct PJRT_Buffer_DynamicDimensionIndices_Args
    PJRT_Buffer_DynamicDimensionIndices_Args;
typedef struct PJRT_Buffer_GetMemoryLayout_Args
    PJRT_Buffer_GetMemoryLayout_Args;
typedef struct PJRT_Buffer_ToHostBuffer_Args PJRT_Buffer_ToHostBuffer_Args;
typedef struct PJRT_Buffer_OnDeviceSizeInBytes_Args
    PJRT_Buffer_OnDeviceSizeInBytes_Args;
typedef struct PJRT_Buffer_Delete_Args PJRT_Buffer_Delete_Args;
typedef struct PJRT_Buffer_IsDeleted_Args PJRT_Buffer_IsDeleted_Args;
typedef struct PJRT_Buffer_CopyRawToHost_Args PJRT_Buffer_CopyRawToHost_Args;
typedef struct PJRT_Buffer_CopyRawToHostFuture_Callback_Args
    PJRT_Buffer_CopyRawToHostFuture_Callback_Args;
typedef struct PJRT_Buffer_CopyRawToHostFuture_Args
    PJRT_Buffer_CopyRawToHostFuture_Args;
typedef struct PJRT_Buffer_DonateWithControlDependency_Callback_Args
    PJRT_Buffer_DonateWithControlDependency_Callback_Args;
typedef struct PJRT_Buffer_DonateWithControlDependency_Args
    PJRT_Buffer_DonateWithControlDependency_Args;
typedef struct PJRT_Buffer_Bitcast_Args PJRT_Buffer_Bitcast_Args;
typedef struct PJRT_Buffer_CopyToDevice_Args PJRT_Buffer_CopyToDevice_Args;
typedef struct PJRT_Buffer_CopyToMemory_Args PJRT_Buffer_CopyToMemory_Args;
typedef struct PJRT_Buffer_IsOnCpu_Args PJRT_Buffer_IsOnCpu_Args;
typedef struct PJRT_Buffer_Device_Args PJRT_Buffer_Device_Args;
typedef struct PJRT_Buffer_Memory_Args PJRT_Buffer_Memory_Args;
typedef struct PJRT_Buffer_ReadyEvent_Args PJRT_Buffer_ReadyEvent_Args;
typedef struct PJRT_Buffer_UnsafePointer_Args PJRT_Buffer_UnsafePointer_Args;
typedef struct PJRT_Buffer_IncreaseExternalReferenceCount_Args
    PJRT_Buffer_IncreaseExternalReferenceCount_Args;
typedef struct PJRT_Buffer_DecreaseExternalReferenceCount_Args
    PJRT_Buffer_DecreaseExternalReferenceCount_Args;
typedef struct PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args;
typedef struct PJRT_CopyToDeviceStream_Destroy_Args
    PJRT_CopyToDeviceStream_Destroy_Args;
typedef struct PJRT_CopyToDeviceStream_AddChunk_Args
    PJRT_CopyToDeviceStream_AddChunk_Args;
typedef struct PJRT_CopyToDeviceStream_TotalBytes_Args
    PJRT_CopyToDeviceStream_TotalBytes_Args;
typedef struct PJRT_CopyToDeviceStream_GranuleSize_Args
    PJRT_CopyToDeviceStream_GranuleSize_Args;
typedef struct PJRT_CopyToDeviceStream_CurrentBytes_Args
    PJRT_CopyToDeviceStream_CurrentBytes_Args;
typedef struct PJRT_TopologyDescription_Create_Args
    PJRT_TopologyDescription_Create_Args;
typedef struct PJRT_TopologyDescription_Destroy_Args
    PJRT_TopologyDescription_Destroy_Args;
typedef struct PJRT_TopologyDescription_PlatformVersion_Args
    PJRT_TopologyDescription_PlatformVersion_Args;
typedef struct PJRT_TopologyDescription_PlatformName_Args
    PJRT_TopologyDescription_PlatformName_Args;
typedef struct PJRT_TopologyDescription_GetDeviceDescriptions_Args
    PJRT_TopologyDescription_GetDeviceDescriptions_Args;
typedef struct PJRT_TopologyDescription_Serialize_Args
    PJRT_TopologyDescription_Serialize_Args;
typedef struct PJRT_TopologyDescription_Deserialize_Args
    PJRT_TopologyDescription_Deserialize_Args;
typedef struct PJRT_TopologyDescription_Attributes_Args
    PJRT_TopologyDescription_Attributes_Args;
typedef struct PJRT_TopologyDescription_Fingerprint_Args
    PJRT_TopologyDescription_Fingerprint_Args;
typedef struct PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args
    PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args;
typedef struct PJRT_TopologyDescription_GetMemorySpaceKindIds_Args
    PJRT_TopologyDescription_GetMemorySpaceKindIds_Args;
typedef struct PJRT_Compile_Args PJRT_Compile_Args;
typedef struct PJRT_Api PJRT_Api;

/* -------- Version ------------------------------------------------------- */
struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  /* set by the plugin to the PJRT_API_MAJOR it was built with */
  int major_version;
  /* set by the plugin to the PJRT_API_MINOR it was built with */
  int minor_version;
};

/* -------- Errors -------------------------------------------------------- */
struct PJRT_Error_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
};

/* Releases an error object. Passing NULL is allowed. */
typedef void PJRT_Error_Destroy(PJRT_Error_Destroy_Args* args);

struct PJRT_Error_Message_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message; /* out; lives as long as `error` */
  size_t message_size;
};

/* Reads the error text; the returned bytes belong to `error` and die with
   it. */
typedef void PJRT_Error_Message(PJRT_Error_Message_Args* args);

/* Status codes; numerically the same as absl::StatusCode. */
typedef enum {
  PJRT_Error_Code_OK = 0,
  PJRT_Error_Code_CANCELLED = 1,
  PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3,
  PJRT_Error_Code_DEADLINE_EXCEEDED = 4,
  PJRT_Error_Code_NOT_FOUND = 5,
  PJRT_Error_Code_ALREADY_EXISTS = 6,
  PJRT_Error_Code_PERMISSION_DENIED = 7,
  PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9,
  PJRT_Error_Code_ABORTED = 10,
  PJRT_Error_Code_OUT_OF_RANGE = 11,
  PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13,
  PJRT_Error_Code_UNAVAILABLE = 14,
  PJRT_Error_Code_DATA_LOSS = 15,
  PJRT_Error_Code_UNAUTHENTICATED = 16
} PJRT_Error_Code;

struct PJRT_Error_GetCode_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_Code code; /* out */
};

/* Reads the status code carried by `error`. */
typedef PJRT_Error* PJRT_Error_GetCode(PJRT_Error_GetCode_Args* args);

/* Receives one payload entry (key and value bytes are only valid during the
   call). */
typedef void (*PJRT_Error_PayloadVisitor)(const char* key, size_t key_size,
                                          const char* value, size_t value_size,
                                          void* user_arg);

struct PJRT_Error_ForEachPayload_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_PayloadVisitor visitor;
  void* user_arg; /* handed back to `visitor` untouched */
};

/* Calls `visitor` once per key/value payload attached to an error. Since
   0.99. */
typedef PJRT_Error* PJRT_Error_ForEachPayload(
    PJRT_Error_ForEachPayload_Args* args);

typedef PJRT_Error* (*PJRT_CallbackError)(PJRT_Error_Code code,
                                          const char* message,
                                          size_t message_size);

/* Which union member of PJRT_NamedValue is valid. */
typedef enum {
  PJRT_NamedValue_kString = 0,
  PJRT_NamedValue_kInt64 = 1,
  PJRT_NamedValue_kInt64List = 2,
  PJRT_NamedValue_kFloat = 3,
  PJRT_NamedValue_kBool = 4
} PJRT_NamedValue_Type;

/* -------- Named values -------------------------------------------------- */
struct PJRT_NamedValue {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* name; /* not NUL-terminated; use name_size */
  size_t name_size;
  PJRT_NamedValue_Type type; /* selects the union member below */
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size; /* element count for strings/lists, 1 for scalars */
};

/* -------- Plugin -------------------------------------------------------- */
struct PJRT_Plugin_Initialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
};

/* One-time plugin setup; call once, before anything else. */
typedef PJRT_Error* PJRT_Plugin_Initialize(PJRT_Plugin_Initialize_Args* args);

struct PJRT_Plugin_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  /* out; valid for the life of the process */
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
};

/* Lists plugin-wide attributes (versions etc.). The array lives as long as
   the process. */
typedef PJRT_Error* PJRT_Plugin_Attributes(PJRT_Plugin_Attributes_Args* args);

/* -------- Events -------------------------------------------------------- */
struct PJRT_Event_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};

/* Releases an event. Passing NULL is allowed. */
typedef PJRT_Error* PJRT_Event_Destroy(PJRT_Event_Destroy_Args* args);

struct PJRT_Event_IsReady_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
  bool is_ready; /* out */
};

/* Non-blocking poll: true once the event completed, with or without error. */
typedef PJRT_Error* PJRT_Event_IsReady(PJRT_Event_IsReady_Args* args);

struct PJRT_Event_Error_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};

/* Status of a ready event (NULL on success). Each returned error is a new
   object the caller destroys. */
typedef PJRT_Error* PJRT_Event_Error(PJRT_Event_Error_Args* args);

struct PJRT_Event_Await_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};

/* Blocks until the event is ready and returns its status; the caller
   destroys a returned error. */
typedef PJRT_Error* PJRT_Event_Await(PJRT_Event_Await_Args* args);

typedef void (*PJRT_Event_OnReadyCallback)(PJRT_Error* error, void* user_arg);

struct PJRT_Event_OnReady_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
  /* receives ownership of the error it is given */
  PJRT_Event_OnReadyCallback callback;
  void* user_arg; /* passed to `callback` untouched */
};

/* Registers a callback run once the event is ready. */
typedef PJRT_Error* PJRT_Event_OnReady(PJRT_Event_OnReady_Args* args);

struct PJRT_Event_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event; /* out; caller destroys */
};

/* Creates an unset event that the caller later completes with
   PJRT_Event_Set. Since 0.89. */
typedef PJRT_Error* PJRT_Event_Create(PJRT_Event_Create_Args* args);

struct PJRT_Event_Set_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event; /* must come from PJRT_Event_Create */
  PJRT_Error_Code error_code; /* PJRT_Error_Code_OK for success */
  const char* error_message; /* copied; may be freed after the call */
  size_t error_message_size;
};

/* Completes an event made by PJRT_Event_Create, with OK or an error. Since
   0.89. */
typedef PJRT_Error* PJRT_Event_Set(PJRT_Event_Set_Args* args);

/* -------- Client -------------------------------------------------------- */
typedef void (*PJRT_KeyValueGetCallback_ValueDeleter)(char* value);

struct PJRT_KeyValueGetCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  int timeout_in_ms;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value; /* out; freed through value_deleter_callback */
  size_t value_size;
  /* out; PJRT calls it after copying `value` */
  PJRT_KeyValueGetCallback_ValueDeleter value_deleter_callback;
};

typedef PJRT_Error* (*PJRT_KeyValueGetCallback)(
    PJRT_KeyValueGetCallback_Args* args);

typedef void (*PJRT_KeyValueTryGetCallback_ValueDeleter)(char* value);

struct PJRT_KeyValueTryGetCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value; /* out; freed through value_deleter_callback */
  size_t value_size;
  /* out; PJRT calls it after copying `value` */
  PJRT_KeyValueTryGetCallback_ValueDeleter value_deleter_callback;
};

typedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(
    PJRT_KeyValueTryGetCallback_Args* args);

struct PJRT_KeyValuePutCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  const char* value; /* only valid during the callback */
  size_t value_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
};

typedef PJRT_Error* (*PJRT_KeyValuePutCallback)(
    PJRT_KeyValuePutCallback_Args* args);

struct PJRT_Client_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  /* plugin-specific options; read during the call */
  const PJRT_NamedValue* create_options;
  size_t num_options;
  /* optional cross-process key/value store hooks */
  PJRT_KeyValueGetCallback kv_get_callback;
  void* kv_get_user_arg;
  PJRT_KeyValuePutCallback kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client; /* out; release with PJRT_Client_Destroy */
  /* like kv_get_callback but fails fast on a missing key */
  PJRT_KeyValueTryGetCallback kv_try_get_callback;
  void* kv_try_get_user_arg;
};

/* Creates a client; the caller later releases it with PJRT_Client_Destroy. */
typedef PJRT_Error* PJRT_Client_Create(PJRT_Client_Create_Args* args);

struct PJRT_Client_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
};

/* Shuts down and releases a client. Passing NULL is allowed. */
typedef PJRT_Error* PJRT_Client_Destroy(PJRT_Client_Destroy_Args* args);

struct PJRT_Client_PlatformName_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_name; /* out; owned by the client */
  size_t platform_name_size;
};

/* Platform name such as "cpu" or "gpu"; the string is owned by the client. */
typedef PJRT_Error* PJRT_Client_PlatformName(
    PJRT_Client_PlatformName_Args* args);

struct PJRT_Client_ProcessIndex_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int process_index; /* out */
};

/* Index of this process in a multi-process job (0 when single-process). */
typedef PJRT_Error* PJRT_Client_ProcessIndex(
    PJRT_Client_ProcessIndex_Args* args);

struct PJRT_Client_PlatformVersion_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_version; /* out; owned by the client */
  size_t platform_version_size;
};

/* Free-form platform version text; owned by the client. */
typedef PJRT_Error* PJRT_Client_PlatformVersion(
    PJRT_Client_PlatformVersion_Args* args);

struct PJRT_Client_TopologyDescription_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  /* out; owned by the client, do not destroy */
  PJRT_TopologyDescription* topology;
};

/* Runtime topology of the client; owned by the client. */
typedef PJRT_Error* PJRT_Client_TopologyDescription(
    PJRT_Client_TopologyDescription_Args* args);

struct PJRT_Client_Devices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* devices; /* out; owned by the client */
  size_t num_devices;
};

/* All devices the runtime can see, addressable or not. Array owned by the
   client. */
typedef PJRT_Error* PJRT_Client_Devices(PJRT_Client_Devices_Args* args);

struct PJRT_Client_AddressableDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices; /* out; owned by the client */
  size_t num_addressable_devices;
};

/* Devices this client can issue work to. Array owned by the client. */
typedef PJRT_Error* PJRT_Client_AddressableDevices(
    PJRT_Client_AddressableDevices_Args* args);

struct PJRT_Client_LookupDevice_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int id;
  PJRT_Device* device; /* out; owned by the client */
};

/* Finds a device by its global id. */
typedef PJRT_Error* PJRT_Client_LookupDevice(
    PJRT_Client_LookupDevice_Args* args);

struct PJRT_Client_LookupAddressableDevice_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int local_hardware_id;
  PJRT_Device* addressable_device; /* out; owned by the client */
};

/* Finds an addressable device by its local hardware id. */
typedef PJRT_Error* PJRT_Client_LookupAddressableDevice(
    PJRT_Client_LookupAddressableDevice_Args* args);

/* State of one process of a multi-process job. */
typedef enum {
  PJRT_ProcessState_kUnspecified = 0,
  PJRT_ProcessState_kUninitialized = 1,
  PJRT_ProcessState_kDisconnected = 2,
  PJRT_ProcessState_kConnected = 3,
  PJRT_ProcessState_kError = 4
} PJRT_ProcessState;

struct PJRT_ProcessInfo {
  size_t struct_size;
  int task_id;
  uint64_t incarnation_id;
  PJRT_ProcessState state;
  int error_code;
  const char* error_message;
  size_t error_message_size;
};

struct PJRT_Client_UpdateGlobalProcessInfo_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_ProcessInfo* process_infos;
  size_t num_process_infos;
};

/* Tells the client the state of every process in the job. */
typedef PJRT_Error* PJRT_Client_UpdateGlobalProcessInfo(
    PJRT_Client_UpdateGlobalProcessInfo_Args* args);

struct PJRT_Client_AddressableMemories_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Memory* const* addressable_memories; /* out; owned by the client */
  size_t num_addressable_memories;
};

/* Memory spaces this client can transfer to and from. Array owned by the
   client. */
typedef PJRT_Error* PJRT_Client_AddressableMemories(
    PJRT_Client_AddressableMemories_Args* args);

struct PJRT_Program {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  char* code; /* program bytes, owned by the caller */
  size_t code_size;
  const char* format; /* e.g. "mlir" (StableHLO) or "hlo" */
  size_t format_size;
};

struct PJRT_Client_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program; /* read during the call only */
  const char* compile_options; /* serialized CompileOptionsProto */
  size_t compile_options_size;
  /* out; release with PJRT_LoadedExecutable_Destroy */
  PJRT_LoadedExecutable* executable;
};

/* Compiles a program (StableHLO/HLO) into a loaded executable the caller
   must destroy. */
typedef PJRT_Error* PJRT_Client_Compile(PJRT_Client_Compile_Args* args);

struct PJRT_Client_Load_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Executable* executable; /* not consumed; caller still destroys it */
  /* Serialized CompileOptionsProto; only read during the call. */
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* loaded_executable; /* out; caller destroys */
};

/* Loads an unloaded executable onto the client's devices. Since 0.95. */
typedef PJRT_Error* PJRT_Client_Load(PJRT_Client_Load_Args* args);

struct PJRT_Client_DefaultDeviceAssignment_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int num_replicas;
  int num_partitions;
  size_t default_assignment_size; /* at least num_replicas * num_partitions */
  int* default_assignment; /* caller-owned array, filled by the call */
};

/* Fills a caller-owned int array with the default replica x partition device
   ids. */
typedef PJRT_Error* PJRT_Client_DefaultDeviceAssignment(
    PJRT_Client_DefaultDeviceAssignment_Args* args);

struct PJRT_Client_DmaMap_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  void* data;
  size_t size;
};

/* Registers host memory for DMA. */
typedef PJRT_Error* PJRT_Client_DmaMap(PJRT_Client_DmaMap_Args* args);

struct PJRT_Client_DmaUnmap_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  void* data;
};

/* Unregisters host memory from DMA. */
typedef PJRT_Error* PJRT_Client_DmaUnmap(PJRT_Client_DmaUnmap_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
};

/* Releases a transfer manager. NULL allowed. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_Destroy(
    PJRT_AsyncHostToDeviceTransferManager_Destroy_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_TransferData_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  int buffer_index;
  const void* data; /* must stay valid until done_with_h2d_transfer fires */
  int64_t offset;
  int64_t transfer_size;
  bool is_last_transfer;
  PJRT_Event* done_with_h2d_transfer; /* out; caller destroys */
};

/* Sends raw bytes into one of the manager's buffers. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_TransferData(
    PJRT_AsyncHostToDeviceTransferManager_TransferData_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  int buffer_index;
  PJRT_Buffer* buffer_out; /* out; caller destroys */
};

/* Hands out one of the manager's buffers (once per index). */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer(
    PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_Device_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  PJRT_Device* device_out;
};

/* Device the manager transfers to. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_Device(
    PJRT_AsyncHostToDeviceTransferManager_Device_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  size_t buffer_count;
};

/* Number of buffers the manager owns. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_BufferCount(
    PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  int buffer_index;
  size_t buffer_size;
};

/* On-device size of one of the manager's buffers. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_BufferSize(
    PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  int buffer_index;
  PJRT_Error_Code error_code;
  const char* error_message;
  size_t error_message_size;
};

/* Marks one of the manager's buffers as failed. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_SetBufferError(
    PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  const PJRT_NamedValue* transfer_metadata;
  size_t num_metadata;
};

/* Attaches key/value metadata to the transfer. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_AddMetadata(
    PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args* args);

/* Element types. Values are ABI: never renumbered, only appended. */
typedef enum {
  PJRT_Buffer_Type_INVALID = 0, /* placeholder, never a real type */
  PJRT_Buffer_Type_PRED = 1,
  PJRT_Buffer_Type_S8 = 2,
  PJRT_Buffer_Type_S16 = 3,
  PJRT_Buffer_Type_S32 = 4,
  PJRT_Buffer_Type_S64 = 5,
  PJRT_Buffer_Type_U8 = 6,
  PJRT_Buffer_Type_U16 = 7,
  PJRT_Buffer_Type_U32 = 8,
  PJRT_Buffer_Type_U64 = 9,
  PJRT_Buffer_Type_F16 = 10,
  PJRT_Buffer_Type_F32 = 11,
  PJRT_Buffer_Type_F64 = 12,
  PJRT_Buffer_Type_BF16 = 13,
  PJRT_Buffer_Type_C64 = 14,
  PJRT_Buffer_Type_C128 = 15,
  PJRT_Buffer_Type_F8E5M2 = 16,
  PJRT_Buffer_Type_F8E4M3FN = 17,
  PJRT_Buffer_Type_F8E4M3B11FNUZ = 18,
  PJRT_Buffer_Type_F8E5M2FNUZ = 19,
  PJRT_Buffer_Type_F8E4M3FNUZ = 20,
  PJRT_Buffer_Type_S4 = 21,
  PJRT_Buffer_Type_U4 = 22,
  PJRT_Buffer_Type_TOKEN = 23,
  PJRT_Buffer_Type_S2 = 24,
  PJRT_Buffer_Type_U2 = 25,
  PJRT_Buffer_Type_F8E4M3 = 26,
  PJRT_Buffer_Type_F8E3M4 = 27,
  PJRT_Buffer_Type_F8E8M0FNU = 28,
  PJRT_Buffer_Type_F4E2M1FN = 29,
  PJRT_Buffer_Type_S1 = 30, /* since 0.94 */
  PJRT_Buffer_Type_U1 = 31, /* since 0.94 */
  PJRT_Buffer_Type_F6E2M3FN = 32, /* newer than 0.81 */
  PJRT_Buffer_Type_F6E3M2FN = 33 /* newer than 0.81 */
} PJRT_Buffer_Type;

/* What PJRT_Client_BufferFromHostBuffer may assume about the host data. */
typedef enum {
  /* data is only read during the call */
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall = 0,
  /* data must stay unchanged until done_with_host_buffer fires */
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes = 1,
  /* buffer may alias data read-only for its whole life */
  PJRT_HostBufferSemantics_kImmutableZeroCopy = 2,
  /* buffer may alias and write data for its whole life */
  PJRT_HostBufferSemantics_kMutableZeroCopy = 3
} PJRT_HostBufferSemantics;

/* Selects the active member of PJRT_Buffer_MemoryLayout. */
typedef enum {
  PJRT_Buffer_MemoryLayout_Type_Tiled = 0,
  PJRT_Buffer_MemoryLayout_Type_Strides = 1
} PJRT_Buffer_MemoryLayout_Type;

struct PJRT_Buffer_MemoryLayout_Tiled {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  /* logical dimension indices, most minor first */
  const int64_t* minor_to_major;
  size_t minor_to_major_size;
  const int64_t* tile_dims; /* all tiles' dimensions, concatenated */
  const size_t* tile_dim_sizes; /* rank of each tile; num_tiles entries */
  size_t num_tiles;
};

struct PJRT_Buffer_MemoryLayout_Strides {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const int64_t* byte_strides; /* one per dimension; may be negative */
  size_t num_byte_strides;
};

struct PJRT_Buffer_MemoryLayout {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  union {
    PJRT_Buffer_MemoryLayout_Tiled tiled;
    PJRT_Buffer_MemoryLayout_Strides strides;
  };
  /* which union member (tiled/strides) is valid */
  PJRT_Buffer_MemoryLayout_Type type;
};

struct PJRT_Client_CreateUninitializedBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const int64_t* shape_dims;
  size_t shape_num_dims;
  PJRT_Buffer_Type shape_element_type;
  PJRT_Buffer_MemoryLayout* shape_layout;
  PJRT_Device* device;
  PJRT_Memory* memory;
  PJRT_Buffer* buffer; /* out; caller destroys */
};

/* Allocates a buffer without contents. */
typedef PJRT_Error* PJRT_Client_CreateUninitializedBuffer(
    PJRT_Client_CreateUninitializedBuffer_Args* args);

struct PJRT_Client_CreateErrorBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  /* The error the buffer carries. The message is copied. */
  PJRT_Error_Code error_code;
  const char* error_message;
  size_t error_message_size;
  /* Shape the buffer pretends to have. */
  const int64_t* shape_dims;
  size_t shape_num_dims;
  PJRT_Buffer_Type shape_element_type;
  PJRT_Buffer_MemoryLayout* shape_layout; /* may be NULL */
  PJRT_Memory* memory; /* memory space the buffer claims to live in */
  PJRT_Buffer* buffer; /* out; caller destroys */
  /* Optional key/value payloads attached to the error (since 0.103). */
  const PJRT_NamedValue* payload;
  size_t num_payload;
};

/* Creates a buffer that holds no memory and carries an error; executions
   consuming it fail with that error. Since 0.82. */
typedef PJRT_Error* PJRT_Client_CreateErrorBuffer(
    PJRT_Client_CreateErrorBuffer_Args* args);

struct PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
  int buffer_index;
  const void* data; /* must stay valid until done_with_h2d_transfer fires */
  /* Shape and layout of `data` on the host. */
  const int64_t* shape_dims;
  size_t shape_num_dims;
  PJRT_Buffer_Type shape_element_type;
  PJRT_Buffer_MemoryLayout* shape_layout;
  PJRT_Event* done_with_h2d_transfer; /* out; caller destroys */
};

/* Sends a host literal (with its own shape/layout) into a manager buffer.
   Since 0.83. */
typedef PJRT_Error* PJRT_AsyncHostToDeviceTransferManager_TransferLiteral(
    PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args* args);

struct PJRT_Client_CreateAliasBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Memory* memory;
  const int64_t* shape_dims;
  size_t shape_num_dims;
  PJRT_Buffer_Type shape_element_type;
  PJRT_Buffer_MemoryLayout* shape_layout;
  PJRT_Buffer* alias_buffer; /* out; caller destroys */
  /* out; hand to PJRT_Client_FulfillAliasBuffer */
  PJRT_FulfillAliasBufferCallback* fulfill_alias_buffer_cb;
};

/* Creates a placeholder buffer to be bound later with FulfillAliasBuffer. */
typedef PJRT_Error* PJRT_Client_CreateAliasBuffer(
    PJRT_Client_CreateAliasBuffer_Args* args);

struct PJRT_Client_FulfillAliasBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Buffer* buffer;
  PJRT_Error_Code status_code;
  const char* error_message;
  size_t error_message_size;
  PJRT_FulfillAliasBufferCallback* fulfill_alias_buffer_cb;
};

/* Binds (or fails) an alias buffer created by CreateAliasBuffer. */
typedef PJRT_Error* PJRT_Client_FulfillAliasBuffer(
    PJRT_Client_FulfillAliasBuffer_Args* args);

struct PJRT_Client_BufferFromHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data; /* host bytes; see host_buffer_semantics for lifetime */
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides; /* optional; empty means dense major-to-minor */
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device; /* destination when `memory` is NULL */
  PJRT_Memory* memory; /* destination memory space; may be NULL */
  PJRT_Buffer_MemoryLayout* device_layout; /* may be NULL (default layout) */
  /* out; `data` may be freed once it fires; caller destroys */
  PJRT_Event* done_with_host_buffer;
  PJRT_Buffer* buffer; /* out; release with PJRT_Buffer_Destroy */
};

/* Starts an async host-to-device copy and returns the new buffer. */
typedef PJRT_Error* PJRT_Client_BufferFromHostBuffer(
    PJRT_Client_BufferFromHostBuffer_Args* args);

struct PJRT_Client_CreateViewOfDeviceBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  void* device_buffer_ptr; /* foreign memory; not owned by the new buffer */
  const int64_t* dims;
  size_t num_dims;
  PJRT_Buffer_Type element_type;
  PJRT_Buffer_MemoryLayout* layout;
  PJRT_Device* device; /* ignored when `memory` is set */
  /* optional; called when the view is done with the memory */
  void (*on_delete_callback)(void* device_buffer_ptr, void* user_arg);
  void* on_delete_callback_arg;
  intptr_t stream; /* optional platform stream handle (e.g. for DLPack) */
  PJRT_Buffer* buffer; /* out; caller destroys */
  PJRT_Memory* memory;
};

/* Wraps foreign device memory as a non-owning buffer. */
typedef PJRT_Error* PJRT_Client_CreateViewOfDeviceBuffer(
    PJRT_Client_CreateViewOfDeviceBuffer_Args* args);

struct PJRT_ShapeSpec {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Buffer_Type element_type;
};

struct PJRT_Client_CreateBuffersForAsyncHostToDevice_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_ShapeSpec* shape_specs;
  size_t num_shape_specs;
  PJRT_Buffer_MemoryLayout** device_layouts; /* optional, one per shape spec */
  size_t num_device_layouts;
  PJRT_Memory* memory;
  /* out; caller destroys */
  PJRT_AsyncHostToDeviceTransferManager* transfer_manager;
};

/* Creates buffers to be filled later through a transfer manager. */
typedef PJRT_Error* PJRT_Client_CreateBuffersForAsyncHostToDevice(
    PJRT_Client_CreateBuffersForAsyncHostToDevice_Args* args);

/* -------- Device descriptions ------------------------------------------- */
struct PJRT_DeviceDescription_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;
};

/* Global id of the described device. */
typedef PJRT_Error* PJRT_DeviceDescription_Id(
    PJRT_DeviceDescription_Id_Args* args);

struct PJRT_DeviceDescription_ProcessIndex_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int process_index;
};

/* Index of the process the described device belongs to. */
typedef PJRT_Error* PJRT_DeviceDescription_ProcessIndex(
    PJRT_DeviceDescription_ProcessIndex_Args* args);

struct PJRT_DeviceDescription_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  size_t num_attributes;
  const PJRT_NamedValue* attributes;
};

/* Vendor-specific device attributes; owned by the description. */
typedef PJRT_Error* PJRT_DeviceDescription_Attributes(
    PJRT_DeviceDescription_Attributes_Args* args);

struct PJRT_DeviceDescription_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
};

/* Device kind string (e.g. a GPU model name); owned by the description. */
typedef PJRT_Error* PJRT_DeviceDescription_Kind(
    PJRT_DeviceDescription_Kind_Args* args);

struct PJRT_DeviceDescription_DebugString_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* debug_string;
  size_t debug_string_size;
};

/* Verbose text for logs; owned by the description. */
typedef PJRT_Error* PJRT_DeviceDescription_DebugString(
    PJRT_DeviceDescription_DebugString_Args* args);

struct PJRT_DeviceDescription_ToString_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* to_string;
  size_t to_string_size;
};

/* Short text for users; owned by the description. */
typedef PJRT_Error* PJRT_DeviceDescription_ToString(
    PJRT_DeviceDescription_ToString_Args* args);

/* -------- Devices ------------------------------------------------------- */
struct PJRT_Device_GetDescription_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
};

/* Description of a device; owned by the device. */
typedef PJRT_Error* PJRT_Device_GetDescription(
    PJRT_Device_GetDescription_Args* args);

struct PJRT_Device_IsAddressable_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  bool is_addressable;
};

/* Whether this client can issue work to the device. */
typedef PJRT_Error* PJRT_Device_IsAddressable(
    PJRT_Device_IsAddressable_Args* args);

struct PJRT_Device_LocalHardwareId_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int local_hardware_id;
};

/* Local hardware id (e.g. CUDA ordinal), -1 when undefined. */
typedef PJRT_Error* PJRT_Device_LocalHardwareId(
    PJRT_Device_LocalHardwareId_Args* args);

struct PJRT_Device_AddressableMemories_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_Memory* const* memories;
  size_t num_memories;
};

/* Memory spaces the device can address. Array owned by the device. */
typedef PJRT_Error* PJRT_Device_AddressableMemories(
    PJRT_Device_AddressableMemories_Args* args);

struct PJRT_Device_DefaultMemory_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_Memory* memory;
};

/* The device's default memory space. */
typedef PJRT_Error* PJRT_Device_DefaultMemory(
    PJRT_Device_DefaultMemory_Args* args);

struct PJRT_Device_MemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int64_t bytes_in_use; /* out; always set */
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
  /* Newer than 0.81. */
  int64_t peak_allocated_bytes; /* out */
  bool peak_allocated_bytes_is_set; /* out */
};

/* Allocator statistics for diagnostics; most fields are optional (see
   *_is_set). */
typedef PJRT_Error* PJRT_Device_MemoryStats(PJRT_Device_MemoryStats_Args* args);

struct PJRT_Device_ClearMemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
};

/* Resets the device's allocator statistics (peaks etc.). Added after 0.104
   (at or before 0.114). */
typedef PJRT_Error* PJRT_Device_ClearMemoryStats(
    PJRT_Device_ClearMemoryStats_Args* args);

struct PJRT_Device_PoisonExecution_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int32_t launch_id; /* matches PJRT_ExecuteOptions.launch_id */
  /* Error to inject; the message is copied. */
  PJRT_Error_Code error_code;
  const char* error_message;
  size_t error_message_size;
  bool poisoned; /* out: false if no matching execution was pending */
  /* Optional key/value payloads attached to the error (since 0.100). */
  const PJRT_NamedValue* payload;
  size_t num_payload;
};

/* Makes the earliest unfinished execution with `launch_id` on this device
   fail with the given error. Since 0.85. */
typedef PJRT_Error* PJRT_Device_PoisonExecution(
    PJRT_Device_PoisonExecution_Args* args);

struct PJRT_Device_CreateAsyncTrackingEvent_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  const char* description; /* copied */
  size_t description_size;
  PJRT_AsyncTrackingEvent* event; /* out; caller destroys */
};

/* Creates a tracking event for profiling; the caller destroys it. Since
   0.86. */
typedef PJRT_Error* PJRT_Device_CreateAsyncTrackingEvent(
    PJRT_Device_CreateAsyncTrackingEvent_Args* args);

struct PJRT_AsyncTrackingEvent_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_AsyncTrackingEvent* event;
};

/* Releases a tracking event. Since 0.86. */
typedef PJRT_Error* PJRT_AsyncTrackingEvent_Destroy(
    PJRT_AsyncTrackingEvent_Destroy_Args* args);

struct PJRT_Device_GetAttributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  const PJRT_NamedValue* attributes; /* out; backed by `device_attributes` */
  size_t num_attributes; /* out */
  PJRT_DeviceAttributes* device_attributes; /* out; keeps `attributes` alive */
  /* out; the caller must call it once on `device_attributes`. */
  void (*attributes_deleter)(PJRT_DeviceAttributes* device_attributes);
};

/* Attributes of a live device; kept alive until the returned deleter runs.
   Since 0.92. */
typedef PJRT_Error* PJRT_Device_GetAttributes(
    PJRT_Device_GetAttributes_Args* args);

/* -------- Memory spaces ------------------------------------------------- */
struct PJRT_Memory_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  int id;
};

/* Id of a memory space. */
typedef PJRT_Error* PJRT_Memory_Id(PJRT_Memory_Id_Args* args);

struct PJRT_Memory_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* kind;
  size_t kind_size;
};

/* Kind string of a memory space (e.g. "device", "pinned_host"). */
typedef PJRT_Error* PJRT_Memory_Kind(PJRT_Memory_Kind_Args* args);

struct PJRT_Memory_Kind_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  int kind_id;
};

/* Numeric id of the memory kind. */
typedef PJRT_Error* PJRT_Memory_Kind_Id(PJRT_Memory_Kind_Id_Args* args);

struct PJRT_Memory_DebugString_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* debug_string;
  size_t debug_string_size;
};

/* Verbose text for logs; owned by the memory. */
typedef PJRT_Error* PJRT_Memory_DebugString(PJRT_Memory_DebugString_Args* args);

struct PJRT_Memory_ToString_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* to_string;
  size_t to_string_size;
};

/* Short text for users; owned by the memory. */
typedef PJRT_Error* PJRT_Memory_ToString(PJRT_Memory_ToString_Args* args);

struct PJRT_Memory_AddressableByDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  PJRT_Device* const* devices;
  size_t num_devices;
};

/* Devices that can address this memory space. */
typedef PJRT_Error* PJRT_Memory_AddressableByDevices(
    PJRT_Memory_AddressableByDevices_Args* args);

/* -------- Execute context ----------------------------------------------- */
struct PJRT_ExecuteContext_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context; /* out; caller destroys */
};

/* Creates an execute context the caller destroys. */
typedef PJRT_Error* PJRT_ExecuteContext_Create(
    PJRT_ExecuteContext_Create_Args* args);

struct PJRT_ExecuteContext_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context;
};

/* Releases an execute context. NULL allowed. */
typedef PJRT_Error* PJRT_ExecuteContext_Destroy(
    PJRT_ExecuteContext_Destroy_Args* args);

/* -------- Executables --------------------------------------------------- */
struct PJRT_Executable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
};

/* Releases an (unloaded) executable. Passing NULL is allowed. */
typedef PJRT_Error* PJRT_Executable_Destroy(PJRT_Executable_Destroy_Args* args);

struct PJRT_LoadedExecutable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
};

/* Releases a loaded executable (and deletes its runtime state). NULL
   allowed. */
typedef PJRT_Error* PJRT_LoadedExecutable_Destroy(
    PJRT_LoadedExecutable_Destroy_Args* args);

struct PJRT_LoadedExecutable_GetExecutable_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable; /* out; caller destroys */
};

/* Returns the unloaded executable behind a loaded one; the caller destroys
   it. */
typedef PJRT_Error* PJRT_LoadedExecutable_GetExecutable(
    PJRT_LoadedExecutable_GetExecutable_Args* args);

struct PJRT_LoadedExecutable_GetDeviceAssignment_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  const char* serialized_bytes; /* out; valid until the deleter runs */
  size_t serialized_bytes_size;
  PJRT_DeviceAssignmentSerialized*
      serialized_device_assignment;
  void (*serialized_device_assignment_deleter)(
      PJRT_DeviceAssignmentSerialized* da);
};

/* Serialized DeviceAssignmentProto; bytes live until the returned deleter
   runs. */
typedef PJRT_Error* PJRT_LoadedExecutable_GetDeviceAssignment(
    PJRT_LoadedExecutable_GetDeviceAssignment_Args* args);

struct PJRT_Executable_Name_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  const char* executable_name;
  size_t executable_name_size;
};

/* Name of the executable; owned by it. */
typedef PJRT_Error* PJRT_Executable_Name(PJRT_Executable_Name_Args* args);

struct PJRT_Executable_NumReplicas_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_replicas;
};

/* Number of replicas the executable was compiled for. */
typedef PJRT_Error* PJRT_Executable_NumReplicas(
    PJRT_Executable_NumReplicas_Args* args);

struct PJRT_Executable_NumPartitions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_partitions;
};

/* Number of partitions the executable was compiled for. */
typedef PJRT_Error* PJRT_Executable_NumPartitions(
    PJRT_Executable_NumPartitions_Args* args);

struct PJRT_LoadedExecutable_AddressableDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
};

/* Devices the loaded executable runs on. */
typedef PJRT_Error* PJRT_LoadedExecutable_AddressableDevices(
    PJRT_LoadedExecutable_AddressableDevices_Args* args);

/* A device's position in the replica x partition grid. */
struct PJRT_LogicalDeviceIds {
  int replica;
  int partition;
};

struct PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  /* out; one entry per addressable device, owned by the executable. */
  const PJRT_LogicalDeviceIds* addressable_device_logical_ids;
  size_t num_addressable_device_logical_ids; /* out */
};

/* (replica, partition) ids of each addressable device of the executable.
   Since 0.96. */
typedef PJRT_Error* PJRT_LoadedExecutable_AddressableDeviceLogicalIds(
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args* args);

struct PJRT_Executable_OptimizedProgram_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  PJRT_Program* program;
};

/* Optimized program text. Call with program->code NULL to learn the size,
   then again with a caller buffer. */
typedef PJRT_Error* PJRT_Executable_OptimizedProgram(
    PJRT_Executable_OptimizedProgram_Args* args);

struct PJRT_LoadedExecutable_Delete_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
};

/* Drops the runtime object early; the handle still needs
   PJRT_LoadedExecutable_Destroy. */
typedef PJRT_Error* PJRT_LoadedExecutable_Delete(
    PJRT_LoadedExecutable_Delete_Args* args);

struct PJRT_LoadedExecutable_IsDeleted_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  bool is_deleted;
};

/* Whether PJRT_LoadedExecutable_Delete was called. */
typedef PJRT_Error* PJRT_LoadedExecutable_IsDeleted(
    PJRT_LoadedExecutable_IsDeleted_Args* args);

struct PJRT_Chunk {
  void* data; /* ownership passes with the chunk */
  size_t size;
  /* frees `data`; called by whoever ends up owning the chunk */
  void (*deleter)(void* data, void* deleter_arg);
  void* deleter_arg;
};

struct PJRT_TransferMetadata;

typedef PJRT_Error* (*PJRT_SendCallback)(PJRT_Chunk* chunk,
                                         PJRT_CallbackError* callback_error,
                                         size_t total_size_in_bytes, bool done,
                                         void* user_arg);

typedef void (*PJRT_RecvCallback)(PJRT_CopyToDeviceStream* stream,
                                  void* user_arg);

struct PJRT_SendCallbackInfo {
  int64_t channel_id; /* matches the channel of the send op in the program */
  void* user_arg;
  PJRT_SendCallback send_callback;
};

struct PJRT_RecvCallbackInfo {
  int64_t channel_id; /* matches the channel of the recv op in the program */
  void* user_arg;
  PJRT_RecvCallback recv_callback;
};

/* Caller-supplied callback fed with values produced inside the HLO program.
   The exact parameter list is our best reading of 0.114; only the fact that
   this is a function pointer matters for the struct layout. */
typedef PJRT_Error* (*PJRT_HloOutputCallback)(void* user_arg,
                                              int64_t callback_id,
                                              PJRT_Buffer* const* operands,
                                              size_t num_operands);

struct PJRT_HloOutputCallbackInfo {
  void* user_arg; /* handed back to `callback` */
  PJRT_HloOutputCallback callback;
  int64_t callback_id;
  size_t num_operands;
};

struct PJRT_ExecuteOptions {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  /* per device: array of num_send_ops entries */
  PJRT_SendCallbackInfo** send_callbacks;
  /* per device: array of num_recv_ops entries */
  PJRT_RecvCallbackInfo** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id; /* ties together launches of the same multi-host program */
  /* arguments that must not be donated */
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  PJRT_ExecuteContext* context; /* optional; must outlive the execution */
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
  /* Multi-slice setup for this run; may be NULL (since 0.97). */
  const PJRT_MultiSlice_Config* multi_slice_config;
  /* Newer than 0.97: */
  /* true: host callbacks see data in major-to-minor layout. */
  bool use_major_to_minor_data_layout_for_callbacks;
  /* Callbacks fed from HLO outputs; caller-owned array, valid for the call. */
  PJRT_HloOutputCallbackInfo* hlo_output_callbacks;
  size_t num_hlo_output_callbacks;
};

struct PJRT_LoadedExecutable_Execute_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options; /* read during the call */
  /* [num_devices][num_args] input buffers */
  PJRT_Buffer* const* const* argument_lists;
  size_t num_devices;
  size_t num_args;
  /* caller-allocated [num_devices][num_outputs]; filled with new buffers the
     caller destroys */
  PJRT_Buffer** const* output_lists;
  /* optional, per device; out events the caller destroys */
  PJRT_Event** device_complete_events;
  /* optional: run a single-device program on this device */
  PJRT_Device* execute_device;
};

/* Runs the executable on one or more devices. */
typedef PJRT_Error* PJRT_LoadedExecutable_Execute(
    PJRT_LoadedExecutable_Execute_Args* args);

struct PJRT_Executable_NumOutputs_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
};

/* Number of outputs per device. */
typedef PJRT_Error* PJRT_Executable_NumOutputs(
    PJRT_Executable_NumOutputs_Args* args);

struct PJRT_Executable_SizeOfGeneratedCodeInBytes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  int64_t size_in_bytes;
};

/* Size of generated code, or -1 when unknown. */
typedef PJRT_Error* PJRT_Executable_SizeOfGeneratedCodeInBytes(
    PJRT_Executable_SizeOfGeneratedCodeInBytes_Args* args);

struct PJRT_Executable_Fingerprint_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  const char* executable_fingerprint;
  size_t executable_fingerprint_size;
};

/* Fingerprint string of the executable; owned by it. */
typedef PJRT_Error* PJRT_Executable_Fingerprint(
    PJRT_Executable_Fingerprint_Args* args);

struct PJRT_Executable_GetCostAnalysis_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_properties;
  const PJRT_NamedValue* properties;
};

/* Cost-analysis properties; owned by the executable. */
typedef PJRT_Error* PJRT_Executable_GetCostAnalysis(
    PJRT_Executable_GetCostAnalysis_Args* args);

struct PJRT_Executable_GetCompiledMemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  int64_t generated_code_size_in_bytes;
  int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes;
  int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes;
  int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes;
  int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes;
  int64_t total_size_in_bytes; /* out; since 0.90 */
  /* since 0.104 */
  int64_t total_allocation_bytes; /* out */
  int64_t indefinite_allocations; /* out */
  int64_t peak_unpadded_heap_bytes; /* out */
};

/* Memory usage figures computed at compile time. */
typedef PJRT_Error* PJRT_Executable_GetCompiledMemoryStats(
    PJRT_Executable_GetCompiledMemoryStats_Args* args);

struct PJRT_Executable_OutputElementTypes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  PJRT_Buffer_Type* output_types;
  size_t num_output_types;
};

/* Element type of each output. */
typedef PJRT_Error* PJRT_Executable_OutputElementTypes(
    PJRT_Executable_OutputElementTypes_Args* args);

struct PJRT_Executable_OutputDimensions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
  const int64_t* dims;
  const size_t* dim_sizes;
};

/* Dimensions of each output, flattened. */
typedef PJRT_Error* PJRT_Executable_OutputDimensions(
    PJRT_Executable_OutputDimensions_Args* args);

struct PJRT_Executable_OutputMemoryKinds_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
  const char* const* memory_kinds;
  const size_t* memory_kind_sizes;
};

/* Memory kind of each output; owned by the executable. */
typedef PJRT_Error* PJRT_Executable_OutputMemoryKinds(
    PJRT_Executable_OutputMemoryKinds_Args* args);

struct PJRT_Executable_ParameterMemoryKinds_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_parameters; /* out */
  const char* const* memory_kinds; /* out; owned by the executable */
  const size_t* memory_kind_sizes; /* out */
};

/* Memory kind of each parameter; owned by the executable. Since 0.102. */
typedef PJRT_Error* PJRT_Executable_ParameterMemoryKinds(
    PJRT_Executable_ParameterMemoryKinds_Args* args);

struct PJRT_Executable_Serialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable;
  const char* serialized_bytes; /* out; valid until the deleter runs */
  size_t serialized_bytes_size;
  /* out; keeps serialized_bytes alive */
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(
      PJRT_SerializedExecutable* exec);
};

/* Serializes the executable; the bytes live until the caller runs the
   returned deleter. */
typedef PJRT_Error* PJRT_Executable_Serialize(
    PJRT_Executable_Serialize_Args* args);

struct PJRT_Executable_GetCompileOptions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  /* out; serialized CompileOptionsProto, valid until the deleter runs. */
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedCompileOptions* serialized_compile_options; /* out */
  /* out; the caller must call it once on `serialized_compile_options`. */
  void (*serialized_compile_options_deleter)(
      PJRT_SerializedCompileOptions* options);
};

/* Serialized CompileOptionsProto used to build the executable; bytes live
   until the deleter runs. Since 0.87. */
typedef PJRT_Error* PJRT_Executable_GetCompileOptions(
    PJRT_Executable_GetCompileOptions_Args* args);

/* Extra settings for PJRT_Executable_DeserializeAndLoad. Note: unlike most
   structs this one has no extension_start. */
struct PJRT_LoadOptions {
  size_t struct_size;
  const char* computation_origin; /* free-form label; read during the call */
  size_t computation_origin_size;
  const PJRT_MultiSlice_Config* multi_slice_config; /* may be NULL */
};

struct PJRT_Executable_DeserializeAndLoad_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable; /* out; caller destroys */
  /* optional replacement CompileOptionsProto */
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
  /* Optional extra load settings; may be NULL. Newer than 0.81. */
  const PJRT_LoadOptions* load_options;
};

/* Rebuilds a loaded executable from PJRT_Executable_Serialize output. */
typedef PJRT_Error* PJRT_Executable_DeserializeAndLoad(
    PJRT_Executable_DeserializeAndLoad_Args* args);

struct PJRT_LoadedExecutable_Fingerprint_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  const char* executable_fingerprint;
  size_t executable_fingerprint_size;
};

/* Deprecated: prefer PJRT_Executable_Fingerprint. */
typedef PJRT_Error* PJRT_LoadedExecutable_Fingerprint(
    PJRT_LoadedExecutable_Fingerprint_Args* args);

/* -------- Buffers ------------------------------------------------------- */
struct PJRT_Buffer_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};

/* Releases a buffer handle and its device memory if not already deleted. */
typedef PJRT_Error* PJRT_Buffer_Destroy(PJRT_Buffer_Destroy_Args* args);

struct PJRT_Buffer_ElementType_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type type;
};

/* Element type of the buffer. */
typedef PJRT_Error* PJRT_Buffer_ElementType(PJRT_Buffer_ElementType_Args* args);

struct PJRT_Buffer_Dimensions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* dims;
  size_t num_dims;
};

/* Dimensions of the buffer; array owned by the buffer. */
typedef PJRT_Error* PJRT_Buffer_Dimensions(PJRT_Buffer_Dimensions_Args* args);

struct PJRT_Buffer_UnpaddedDimensions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* unpadded_dims;
  size_t num_dims;
};

/* Unpadded dimensions (differ from Dimensions for dynamic shapes). */
typedef PJRT_Error* PJRT_Buffer_UnpaddedDimensions(
    PJRT_Buffer_UnpaddedDimensions_Args* args);

struct PJRT_Buffer_DynamicDimensionIndices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const size_t* dynamic_dim_indices;
  size_t num_dynamic_dims;
};

/* Indices of the dynamic dimensions. */
typedef PJRT_Error* PJRT_Buffer_DynamicDimensionIndices(
    PJRT_Buffer_DynamicDimensionIndices_Args* args);

struct PJRT_Buffer_GetMemoryLayout_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_MemoryLayout layout;
};

/* On-device memory layout of the buffer. */
typedef PJRT_Error* PJRT_Buffer_GetMemoryLayout(
    PJRT_Buffer_GetMemoryLayout_Args* args);

struct PJRT_Buffer_ToHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  PJRT_Buffer_MemoryLayout* host_layout; /* optional layout for `dst` */
  void* dst; /* caller memory; NULL to query dst_size only */
  size_t dst_size;
  PJRT_Event* event; /* out; `dst` is filled when it fires; caller destroys */
};

/* Async device-to-host copy. With dst NULL, only reports the needed size. */
typedef PJRT_Error* PJRT_Buffer_ToHostBuffer(
    PJRT_Buffer_ToHostBuffer_Args* args);

struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  size_t on_device_size_in_bytes;
};

/* Bytes the buffer occupies on device. */
typedef PJRT_Error* PJRT_Buffer_OnDeviceSizeInBytes(
    PJRT_Buffer_OnDeviceSizeInBytes_Args* args);

struct PJRT_Buffer_Delete_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};

/* Frees device memory now; the handle still needs PJRT_Buffer_Destroy. */
typedef PJRT_Error* PJRT_Buffer_Delete(PJRT_Buffer_Delete_Args* args);

struct PJRT_Buffer_IsDeleted_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_deleted;
};

/* Whether the buffer's device memory was deleted. */
typedef PJRT_Error* PJRT_Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* args);

struct PJRT_Buffer_CopyRawToHost_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  void* dst; /* caller memory, valid until `event` fires */
  int64_t offset;
  int64_t transfer_size;
  PJRT_Event* event; /* out; caller destroys */
};

/* Async raw byte copy of part of a buffer into caller memory. */
typedef PJRT_Error* PJRT_Buffer_CopyRawToHost(
    PJRT_Buffer_CopyRawToHost_Args* args);

/* Passed to `future_ready_callback` of PJRT_Buffer_CopyRawToHostFuture. */
struct PJRT_Buffer_CopyRawToHostFuture_Callback_Args {
  size_t struct_size;
  void* callback_data; /* the value returned in the Future args */
  /* OK: copy into `dst`; otherwise the copy is abandoned with this error. */
  PJRT_Error_Code error_code;
  const char* error_message;
  size_t error_message_size;
  void* dst; /* caller memory of at least `transfer_size` bytes */
};

struct PJRT_Buffer_CopyRawToHostFuture_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  int64_t offset;
  int64_t transfer_size;
  PJRT_Event* event; /* out; fires when the copy is done; caller destroys */
  void* callback_data; /* out; pass back to `future_ready_callback` */
  /* out; the caller calls it exactly once to supply the destination. */
  void (*future_ready_callback)(
      PJRT_Buffer_CopyRawToHostFuture_Callback_Args* args);
};

/* Like CopyRawToHost, but the destination is supplied later through the
   returned callback. Since 0.84. */
typedef PJRT_Error* PJRT_Buffer_CopyRawToHostFuture(
    PJRT_Buffer_CopyRawToHostFuture_Args* args);

/* Passed to `dependency_ready_callback` of
   PJRT_Buffer_DonateWithControlDependency. */
struct PJRT_Buffer_DonateWithControlDependency_Callback_Args {
  size_t struct_size;
  void* callback_data;
  PJRT_Error_Code error_code; /* OK when the dependency completed cleanly */
  const char* error_message;
  size_t error_message_size;
};

struct PJRT_Buffer_DonateWithControlDependency_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer; /* donated; do not use it afterwards */
  void* callback_data; /* out */
  /* out; the caller calls it exactly once when the dependency is done. */
  void (*dependency_ready_callback)(
      PJRT_Buffer_DonateWithControlDependency_Callback_Args* args);
  PJRT_Buffer* out_buffer; /* out; caller destroys */
};

/* Donates a buffer whose reuse waits on a caller-signalled dependency. Since
   0.88. */
typedef PJRT_Error* PJRT_Buffer_DonateWithControlDependency(
    PJRT_Buffer_DonateWithControlDependency_Args* args);

struct PJRT_Buffer_Bitcast_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type element_type;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Buffer_MemoryLayout* device_layout; /* may be NULL */
  PJRT_Buffer* out_buffer; /* out; caller destroys */
};

/* Makes a new buffer that views the same memory with another
   type/shape/layout. Since 0.98. */
typedef PJRT_Error* PJRT_Buffer_Bitcast(PJRT_Buffer_Bitcast_Args* args);

struct PJRT_Buffer_CopyToDevice_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* dst_device;
  PJRT_Buffer* dst_buffer; /* out; caller destroys */
};

/* Copies the buffer to another device; the caller owns the new buffer. */
typedef PJRT_Error* PJRT_Buffer_CopyToDevice(
    PJRT_Buffer_CopyToDevice_Args* args);

struct PJRT_Buffer_CopyToMemory_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Memory* dst_memory;
  PJRT_Buffer* dst_buffer; /* out; caller destroys */
};

/* Copies the buffer into another memory space; the caller owns the new
   buffer. */
typedef PJRT_Error* PJRT_Buffer_CopyToMemory(
    PJRT_Buffer_CopyToMemory_Args* args);

struct PJRT_Buffer_IsOnCpu_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_on_cpu;
};

/* Whether the buffer's memory is host memory. */
typedef PJRT_Error* PJRT_Buffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* args);

struct PJRT_Buffer_Device_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* device;
};

/* Device the buffer lives on. */
typedef PJRT_Error* PJRT_Buffer_Device(PJRT_Buffer_Device_Args* args);

struct PJRT_Buffer_Memory_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Memory* memory;
};

/* Memory space the buffer lives in. */
typedef PJRT_Error* PJRT_Buffer_Memory(PJRT_Buffer_Memory_Args* args);

struct PJRT_Buffer_ReadyEvent_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Event* event; /* out; caller destroys */
};

/* Event that fires when the buffer's data is ready; the caller destroys it. */
typedef PJRT_Error* PJRT_Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args);

struct PJRT_Buffer_UnsafePointer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  uintptr_t buffer_pointer;
};

/* Raw device address of the buffer (platform specific). */
typedef PJRT_Error* PJRT_Buffer_UnsafePointer(
    PJRT_Buffer_UnsafePointer_Args* args);

struct PJRT_Buffer_IncreaseExternalReferenceCount_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};

/* Pins the device memory for an external user (e.g. DLPack). */
typedef PJRT_Error* PJRT_Buffer_IncreaseExternalReferenceCount(
    PJRT_Buffer_IncreaseExternalReferenceCount_Args* args);

struct PJRT_Buffer_DecreaseExternalReferenceCount_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};

/* Undoes one IncreaseExternalReferenceCount. */
typedef PJRT_Error* PJRT_Buffer_DecreaseExternalReferenceCount(
    PJRT_Buffer_DecreaseExternalReferenceCount_Args* args);

struct PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  void* device_memory_ptr;
};

/* Opaque device memory pointer, valid while an external reference is held. */
typedef PJRT_Error* PJRT_Buffer_OpaqueDeviceMemoryDataPointer(
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args);

/* -------- Copy-to-device streams ---------------------------------------- */
struct PJRT_CopyToDeviceStream_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_CopyToDeviceStream* stream;
};

/* Releases a copy-to-device stream. */
typedef PJRT_Error* PJRT_CopyToDeviceStream_Destroy(
    PJRT_CopyToDeviceStream_Destroy_Args* args);

struct PJRT_CopyToDeviceStream_AddChunk_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_CopyToDeviceStream* stream;
  PJRT_Chunk* chunk; /* taken over by the stream */
  PJRT_Event* transfer_complete; /* out; caller destroys */
};

/* Queues a chunk; the stream takes the chunk's data and calls its deleter. */
typedef PJRT_Error* PJRT_CopyToDeviceStream_AddChunk(
    PJRT_CopyToDeviceStream_AddChunk_Args* args);

struct PJRT_CopyToDeviceStream_TotalBytes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_CopyToDeviceStream* stream;
  int64_t total_bytes;
};

/* Total bytes the stream expects. */
typedef PJRT_Error* PJRT_CopyToDeviceStream_TotalBytes(
    PJRT_CopyToDeviceStream_TotalBytes_Args* args);

struct PJRT_CopyToDeviceStream_GranuleSize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_CopyToDeviceStream* stream;
  int64_t granule_size_in_bytes;
};

/* Chunk sizes must be a multiple of this. */
typedef PJRT_Error* PJRT_CopyToDeviceStream_GranuleSize(
    PJRT_CopyToDeviceStream_GranuleSize_Args* args);

struct PJRT_CopyToDeviceStream_CurrentBytes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_CopyToDeviceStream* stream;
  int64_t current_bytes;
};

/* Bytes queued so far. */
typedef PJRT_Error* PJRT_CopyToDeviceStream_CurrentBytes(
    PJRT_CopyToDeviceStream_CurrentBytes_Args* args);

/* -------- Topology descriptions ----------------------------------------- */
struct PJRT_TopologyDescription_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* topology_name;
  size_t topology_name_size;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  PJRT_TopologyDescription* topology; /* out; caller destroys */
};

/* Builds a topology description from options; the caller destroys it. */
typedef PJRT_Error* PJRT_TopologyDescription_Create(
    PJRT_TopologyDescription_Create_Args* args);

struct PJRT_TopologyDescription_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
};

/* Releases a topology description. */
typedef PJRT_Error* PJRT_TopologyDescription_Destroy(
    PJRT_TopologyDescription_Destroy_Args* args);

struct PJRT_TopologyDescription_PlatformVersion_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  const char* platform_version;
  size_t platform_version_size;
};

/* Platform version of the topology; owned by it. */
typedef PJRT_Error* PJRT_TopologyDescription_PlatformVersion(
    PJRT_TopologyDescription_PlatformVersion_Args* args);

struct PJRT_TopologyDescription_PlatformName_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_TopologyDescription* topology;
  const char* platform_name;
  size_t platform_name_size;
};

/* Platform name of the topology; owned by it. */
typedef PJRT_Error* PJRT_TopologyDescription_PlatformName(
    PJRT_TopologyDescription_PlatformName_Args* args);

struct PJRT_TopologyDescription_GetDeviceDescriptions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_TopologyDescription* topology;
  PJRT_DeviceDescription* const* descriptions;
  size_t num_descriptions;
};

/* Descriptions of every device in the topology; owned by it. */
typedef PJRT_Error* PJRT_TopologyDescription_GetDeviceDescriptions(
    PJRT_TopologyDescription_GetDeviceDescriptions_Args* args);

struct PJRT_TopologyDescription_Serialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  const char* serialized_bytes; /* out; valid until the deleter runs */
  size_t serialized_bytes_size;
  PJRT_SerializedTopology* serialized_topology;
  void (*serialized_topology_deleter)(
      PJRT_SerializedTopology* serialized_topology);
};

/* Serializes the topology; bytes live until the returned deleter runs. */
typedef PJRT_Error* PJRT_TopologyDescription_Serialize(
    PJRT_TopologyDescription_Serialize_Args* args);

struct PJRT_TopologyDescription_Deserialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* serialized_topology;
  size_t serialized_topology_size;
  PJRT_TopologyDescription* topology; /* out; caller destroys */
};

/* Rebuilds a topology from PJRT_TopologyDescription_Serialize output. */
typedef PJRT_Error* PJRT_TopologyDescription_Deserialize(
    PJRT_TopologyDescription_Deserialize_Args* args);

struct PJRT_TopologyDescription_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
};

/* Platform-specific topology attributes; owned by the topology. */
typedef PJRT_Error* PJRT_TopologyDescription_Attributes(
    PJRT_TopologyDescription_Attributes_Args* args);

struct PJRT_TopologyDescription_Fingerprint_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  uint64_t fingerprint; /* out */
};

/* Stable 64-bit fingerprint of the topology. Since 0.101. */
typedef PJRT_Error* PJRT_TopologyDescription_Fingerprint(
    PJRT_TopologyDescription_Fingerprint_Args* args);

struct PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  int memory_space_kind_id;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Buffer_Type element_type;
  PJRT_Buffer_MemoryLayout* layout; /* may be NULL */
  char* serialized_shape; /* out; serialized ShapeProto */
  size_t serialized_shape_size; /* out */
  /* out; the caller must call it once on `serialized_shape`. */
  void (*serialized_shape_deleter)(char* serialized_shape);
};

/* Serialized ShapeProto of the canonical on-device form of a shape in a
   memory space. Added after 0.104 (at or before 0.114). */
typedef PJRT_Error* PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace(
    PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args* args);

struct PJRT_TopologyDescription_GetMemorySpaceKindIds_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  const int* memory_space_kind_ids; /* out; owned by the topology */
  size_t num_memory_space_kind_ids; /* out */
};

/* Memory-space kind ids known to the topology; owned by it. Added after
   0.104 (at or before 0.114). */
typedef PJRT_Error* PJRT_TopologyDescription_GetMemorySpaceKindIds(
    PJRT_TopologyDescription_GetMemorySpaceKindIds_Args* args);

/* -------- Ahead-of-time compile ----------------------------------------- */
struct PJRT_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_TopologyDescription* topology;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_Client* client; /* optional; NULL compiles without a client */
  PJRT_Executable* executable; /* out; release with PJRT_Executable_Destroy */
};

/* Ahead-of-time compile against a topology (client optional); returns an
   unloaded executable. */
typedef PJRT_Error* PJRT_Compile(PJRT_Compile_Args* args);

/* -------- The API table ------------------------------------------------ */

/* Returned by a plugin's GetPjrtApi(). Entries are in ABI order; a plugin
   built for an older minor version stops earlier, so compare
   `struct_size` with the entry's offset before using it.
   Each entry is a pointer to the function type of the same name declared
   above (e.g. the PJRT_Client_Create entry has type PJRT_Client_Create*).
   The pointer types are spelled out rather than written as
   `PJRT_Client_Create* PJRT_Client_Create;`, because C++ compilers such as
   GCC reject a member that reuses the name of the type it is declared
   with; the layout is identical either way. */
struct PJRT_Api {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;
  void (*PJRT_Error_Destroy)(PJRT_Error_Destroy_Args* args);
  void (*PJRT_Error_Message)(PJRT_Error_Message_Args* args);
  PJRT_Error* (*PJRT_Error_GetCode)(PJRT_Error_GetCode_Args* args);
  PJRT_Error* (*PJRT_Plugin_Initialize)(PJRT_Plugin_Initialize_Args* args);
  PJRT_Error* (*PJRT_Plugin_Attributes)(PJRT_Plugin_Attributes_Args* args);
  PJRT_Error* (*PJRT_Event_Destroy)(PJRT_Event_Destroy_Args* args);
  PJRT_Error* (*PJRT_Event_IsReady)(PJRT_Event_IsReady_Args* args);
  PJRT_Error* (*PJRT_Event_Error)(PJRT_Event_Error_Args* args);
  PJRT_Error* (*PJRT_Event_Await)(PJRT_Event_Await_Args* args);
  PJRT_Error* (*PJRT_Event_OnReady)(PJRT_Event_OnReady_Args* args);
  PJRT_Error* (*PJRT_Client_Create)(PJRT_Client_Create_Args* args);
  PJRT_Error* (*PJRT_Client_Destroy)(PJRT_Client_Destroy_Args* args);
  PJRT_Error* (*PJRT_Client_PlatformName)(PJRT_Client_PlatformName_Args* args);
  PJRT_Error* (*PJRT_Client_ProcessIndex)(PJRT_Client_ProcessIndex_Args* args);
  PJRT_Error* (*PJRT_Client_PlatformVersion)(
      PJRT_Client_PlatformVersion_Args* args);
  PJRT_Error* (*PJRT_Client_Devices)(PJRT_Client_Devices_Args* args);
  PJRT_Error* (*PJRT_Client_AddressableDevices)(
      PJRT_Client_AddressableDevices_Args* args);
  PJRT_Error* (*PJRT_Client_LookupDevice)(PJRT_Client_LookupDevice_Args* args);
  PJRT_Error* (*PJRT_Client_LookupAddressableDevice)(
      PJRT_Client_LookupAddressableDevice_Args* args);
  PJRT_Error* (*PJRT_Client_AddressableMemories)(
      PJRT_Client_AddressableMemories_Args* args);
  PJRT_Error* (*PJRT_Client_Compile)(PJRT_Client_Compile_Args* args);
  PJRT_Error* (*PJRT_Client_DefaultDeviceAssignment)(
      PJRT_Client_DefaultDeviceAssignment_Args* args);
  PJRT_Error* (*PJRT_Client_BufferFromHostBuffer)(
      PJRT_Client_BufferFromHostBuffer_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_Id)(
      PJRT_DeviceDescription_Id_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_ProcessIndex)(
      PJRT_DeviceDescription_ProcessIndex_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_Attributes)(
      PJRT_DeviceDescription_Attributes_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_Kind)(
      PJRT_DeviceDescription_Kind_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_DebugString)(
      PJRT_DeviceDescription_DebugString_Args* args);
  PJRT_Error* (*PJRT_DeviceDescription_ToString)(
      PJRT_DeviceDescription_ToString_Args* args);
  PJRT_Error* (*PJRT_Device_GetDescription)(
      PJRT_Device_GetDescription_Args* args);
  PJRT_Error* (*PJRT_Device_IsAddressable)(
      PJRT_Device_IsAddressable_Args* args);
  PJRT_Error* (*PJRT_Device_LocalHardwareId)(
      PJRT_Device_LocalHardwareId_Args* args);
  PJRT_Error* (*PJRT_Device_AddressableMemories)(
      PJRT_Device_AddressableMemories_Args* args);
  PJRT_Error* (*PJRT_Device_DefaultMemory)(
      PJRT_Device_DefaultMemory_Args* args);
  PJRT_Error* (*PJRT_Device_MemoryStats)(PJRT_Device_MemoryStats_Args* args);
  PJRT_Error* (*PJRT_Memory_Id)(PJRT_Memory_Id_Args* args);
  PJRT_Error* (*PJRT_Memory_Kind)(PJRT_Memory_Kind_Args* args);
  PJRT_Error* (*PJRT_Memory_DebugString)(PJRT_Memory_DebugString_Args* args);
  PJRT_Error* (*PJRT_Memory_ToString)(PJRT_Memory_ToString_Args* args);
  PJRT_Error* (*PJRT_Memory_AddressableByDevices)(
      PJRT_Memory_AddressableByDevices_Args* args);
  PJRT_Error* (*PJRT_Executable_Destroy)(PJRT_Executable_Destroy_Args* args);
  PJRT_Error* (*PJRT_Executable_Name)(PJRT_Executable_Name_Args* args);
  PJRT_Error* (*PJRT_Executable_NumReplicas)(
      PJRT_Executable_NumReplicas_Args* args);
  PJRT_Error* (*PJRT_Executable_NumPartitions)(
      PJRT_Executable_NumPartitions_Args* args);
  PJRT_Error* (*PJRT_Executable_NumOutputs)(
      PJRT_Executable_NumOutputs_Args* args);
  PJRT_Error* (*PJRT_Executable_SizeOfGeneratedCodeInBytes)(
      PJRT_Executable_SizeOfGeneratedCodeInBytes_Args* args);
  PJRT_Error* (*PJRT_Executable_GetCostAnalysis)(
      PJRT_Executable_GetCostAnalysis_Args* args);
  PJRT_Error* (*PJRT_Executable_OutputMemoryKinds)(
      PJRT_Executable_OutputMemoryKinds_Args* args);
  PJRT_Error* (*PJRT_Executable_OptimizedProgram)(
      PJRT_Executable_OptimizedProgram_Args* args);
  PJRT_Error* (*PJRT_Executable_Serialize)(
      PJRT_Executable_Serialize_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_Destroy)(
      PJRT_LoadedExecutable_Destroy_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_GetExecutable)(
      PJRT_LoadedExecutable_GetExecutable_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_AddressableDevices)(
      PJRT_LoadedExecutable_AddressableDevices_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_Delete)(
      PJRT_LoadedExecutable_Delete_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_IsDeleted)(
      PJRT_LoadedExecutable_IsDeleted_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_Execute)(
      PJRT_LoadedExecutable_Execute_Args* args);
  PJRT_Error* (*PJRT_Executable_DeserializeAndLoad)(
      PJRT_Executable_DeserializeAndLoad_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_Fingerprint)(
      PJRT_LoadedExecutable_Fingerprint_Args* args);
  PJRT_Error* (*PJRT_Buffer_Destroy)(PJRT_Buffer_Destroy_Args* args);
  PJRT_Error* (*PJRT_Buffer_ElementType)(PJRT_Buffer_ElementType_Args* args);
  PJRT_Error* (*PJRT_Buffer_Dimensions)(PJRT_Buffer_Dimensions_Args* args);
  PJRT_Error* (*PJRT_Buffer_UnpaddedDimensions)(
      PJRT_Buffer_UnpaddedDimensions_Args* args);
  PJRT_Error* (*PJRT_Buffer_DynamicDimensionIndices)(
      PJRT_Buffer_DynamicDimensionIndices_Args* args);
  PJRT_Error* (*PJRT_Buffer_GetMemoryLayout)(
      PJRT_Buffer_GetMemoryLayout_Args* args);
  PJRT_Error* (*PJRT_Buffer_OnDeviceSizeInBytes)(
      PJRT_Buffer_OnDeviceSizeInBytes_Args* args);
  PJRT_Error* (*PJRT_Buffer_Device)(PJRT_Buffer_Device_Args* args);
  PJRT_Error* (*PJRT_Buffer_Memory)(PJRT_Buffer_Memory_Args* args);
  PJRT_Error* (*PJRT_Buffer_Delete)(PJRT_Buffer_Delete_Args* args);
  PJRT_Error* (*PJRT_Buffer_IsDeleted)(PJRT_Buffer_IsDeleted_Args* args);
  PJRT_Error* (*PJRT_Buffer_CopyToDevice)(PJRT_Buffer_CopyToDevice_Args* args);
  PJRT_Error* (*PJRT_Buffer_ToHostBuffer)(PJRT_Buffer_ToHostBuffer_Args* args);
  PJRT_Error* (*PJRT_Buffer_IsOnCpu)(PJRT_Buffer_IsOnCpu_Args* args);
  PJRT_Error* (*PJRT_Buffer_ReadyEvent)(PJRT_Buffer_ReadyEvent_Args* args);
  PJRT_Error* (*PJRT_Buffer_UnsafePointer)(
      PJRT_Buffer_UnsafePointer_Args* args);
  PJRT_Error* (*PJRT_Buffer_IncreaseExternalReferenceCount)(
      PJRT_Buffer_IncreaseExternalReferenceCount_Args* args);
  PJRT_Error* (*PJRT_Buffer_DecreaseExternalReferenceCount)(
      PJRT_Buffer_DecreaseExternalReferenceCount_Args* args);
  PJRT_Error* (*PJRT_Buffer_OpaqueDeviceMemoryDataPointer)(
      PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args);
  PJRT_Error* (*PJRT_CopyToDeviceStream_Destroy)(
      PJRT_CopyToDeviceStream_Destroy_Args* args);
  PJRT_Error* (*PJRT_CopyToDeviceStream_AddChunk)(
      PJRT_CopyToDeviceStream_AddChunk_Args* args);
  PJRT_Error* (*PJRT_CopyToDeviceStream_TotalBytes)(
      PJRT_CopyToDeviceStream_TotalBytes_Args* args);
  PJRT_Error* (*PJRT_CopyToDeviceStream_GranuleSize)(
      PJRT_CopyToDeviceStream_GranuleSize_Args* args);
  PJRT_Error* (*PJRT_CopyToDeviceStream_CurrentBytes)(
      PJRT_CopyToDeviceStream_CurrentBytes_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_Create)(
      PJRT_TopologyDescription_Create_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_Destroy)(
      PJRT_TopologyDescription_Destroy_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_PlatformName)(
      PJRT_TopologyDescription_PlatformName_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_PlatformVersion)(
      PJRT_TopologyDescription_PlatformVersion_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_GetDeviceDescriptions)(
      PJRT_TopologyDescription_GetDeviceDescriptions_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_Serialize)(
      PJRT_TopologyDescription_Serialize_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_Attributes)(
      PJRT_TopologyDescription_Attributes_Args* args);
  PJRT_Error* (*PJRT_Compile)(PJRT_Compile_Args* args);
  PJRT_Error* (*PJRT_Executable_OutputElementTypes)(
      PJRT_Executable_OutputElementTypes_Args* args);
  PJRT_Error* (*PJRT_Executable_OutputDimensions)(
      PJRT_Executable_OutputDimensions_Args* args);
  PJRT_Error* (*PJRT_Buffer_CopyToMemory)(PJRT_Buffer_CopyToMemory_Args* args);
  PJRT_Error* (*PJRT_Client_CreateViewOfDeviceBuffer)(
      PJRT_Client_CreateViewOfDeviceBuffer_Args* args);
  PJRT_Error* (*PJRT_Executable_Fingerprint)(
      PJRT_Executable_Fingerprint_Args* args);
  PJRT_Error* (*PJRT_Client_TopologyDescription)(
      PJRT_Client_TopologyDescription_Args* args);
  PJRT_Error* (*PJRT_Executable_GetCompiledMemoryStats)(
      PJRT_Executable_GetCompiledMemoryStats_Args* args);
  PJRT_Error* (*PJRT_Memory_Kind_Id)(PJRT_Memory_Kind_Id_Args* args);
  PJRT_Error* (*PJRT_ExecuteContext_Create)(
      PJRT_ExecuteContext_Create_Args* args);
  PJRT_Error* (*PJRT_ExecuteContext_Destroy)(
      PJRT_ExecuteContext_Destroy_Args* args);
  PJRT_Error* (*PJRT_Buffer_CopyRawToHost)(
      PJRT_Buffer_CopyRawToHost_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_Destroy)(
      PJRT_AsyncHostToDeviceTransferManager_Destroy_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_TransferData)(
      PJRT_AsyncHostToDeviceTransferManager_TransferData_Args* args);
  PJRT_Error* (*PJRT_Client_CreateBuffersForAsyncHostToDevice)(
      PJRT_Client_CreateBuffersForAsyncHostToDevice_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer)(
      PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_Device)(
      PJRT_AsyncHostToDeviceTransferManager_Device_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_BufferCount)(
      PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_BufferSize)(
      PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_SetBufferError)(
      PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args* args);
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_AddMetadata)(
      PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args* args);
  PJRT_Error* (*PJRT_Client_DmaMap)(PJRT_Client_DmaMap_Args* args);
  PJRT_Error* (*PJRT_Client_DmaUnmap)(PJRT_Client_DmaUnmap_Args* args);
  PJRT_Error* (*PJRT_Client_CreateUninitializedBuffer)(
      PJRT_Client_CreateUninitializedBuffer_Args* args);
  PJRT_Error* (*PJRT_Client_UpdateGlobalProcessInfo)(
      PJRT_Client_UpdateGlobalProcessInfo_Args* args);
  PJRT_Error* (*PJRT_TopologyDescription_Deserialize)(
      PJRT_TopologyDescription_Deserialize_Args* args);
  PJRT_Error* (*PJRT_Client_CreateAliasBuffer)(
      PJRT_Client_CreateAliasBuffer_Args* args);
  PJRT_Error* (*PJRT_Client_FulfillAliasBuffer)(
      PJRT_Client_FulfillAliasBuffer_Args* args);
  PJRT_Error* (*PJRT_LoadedExecutable_GetDeviceAssignment)(
      PJRT_LoadedExecutable_GetDeviceAssignment_Args* args);
  /* Entries below were appended after 0.81. */
  /* since 0.82 */
  PJRT_Error* (*PJRT_Client_CreateErrorBuffer)(
      PJRT_Client_CreateErrorBuffer_Args* args);
  /* since 0.83 */
  PJRT_Error* (*PJRT_AsyncHostToDeviceTransferManager_TransferLiteral)(
      PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args* args);
  /* since 0.84 */
  PJRT_Error* (*PJRT_Buffer_CopyRawToHostFuture)(
      PJRT_Buffer_CopyRawToHostFuture_Args* args);
  /* since 0.85 */
  PJRT_Error* (*PJRT_Device_PoisonExecution)(
      PJRT_Device_PoisonExecution_Args* args);
  /* since 0.86 */
  PJRT_Error* (*PJRT_Device_CreateAsyncTrackingEvent)(
      PJRT_Device_CreateAsyncTrackingEvent_Args* args);
  /* since 0.86 */
  PJRT_Error* (*PJRT_AsyncTrackingEvent_Destroy)(
      PJRT_AsyncTrackingEvent_Destroy_Args* args);
  /* since 0.87 */
  PJRT_Error* (*PJRT_Executable_GetCompileOptions)(
      PJRT_Executable_GetCompileOptions_Args* args);
  /* since 0.88 */
  PJRT_Error* (*PJRT_Buffer_DonateWithControlDependency)(
      PJRT_Buffer_DonateWithControlDependency_Args* args);
  /* since 0.89 */
  PJRT_Error* (*PJRT_Event_Create)(PJRT_Event_Create_Args* args);
  /* since 0.89 */
  PJRT_Error* (*PJRT_Event_Set)(PJRT_Event_Set_Args* args);
  /* since 0.92 */
  PJRT_Error* (*PJRT_Device_GetAttributes)(
      PJRT_Device_GetAttributes_Args* args);
  /* since 0.95 */
  PJRT_Error* (*PJRT_Client_Load)(PJRT_Client_Load_Args* args);
  /* since 0.96 */
  PJRT_Error* (*PJRT_LoadedExecutable_AddressableDeviceLogicalIds)(
      PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args* args);
  /* since 0.98 */
  PJRT_Error* (*PJRT_Buffer_Bitcast)(PJRT_Buffer_Bitcast_Args* args);
  /* since 0.99 */
  PJRT_Error* (*PJRT_Error_ForEachPayload)(
      PJRT_Error_ForEachPayload_Args* args);
  /* since 0.101 */
  PJRT_Error* (*PJRT_TopologyDescription_Fingerprint)(
      PJRT_TopologyDescription_Fingerprint_Args* args);
  /* since 0.102 */
  PJRT_Error* (*PJRT_Executable_ParameterMemoryKinds)(
      PJRT_Executable_ParameterMemoryKinds_Args* args);
  /* after 0.104 */
  PJRT_Error* (*PJRT_Device_ClearMemoryStats)(
      PJRT_Device_ClearMemoryStats_Args* args);
  /* after 0.104 */
  PJRT_Error* (*PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace)(
      PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args* args);
  /* after 0.104 */
  PJRT_Error* (*PJRT_TopologyDescription_GetMemorySpaceKindIds)(
      PJRT_TopologyDescription_GetMemorySpaceKindIds_Args* args);
};

/* C++ linkage guard, closing half (same layout as the opening half).
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_PJRT_C_API_H_ */
