/*
 * pjrt_c_api_custom_partitioner_extension.h -- the PJRT custom partitioner
 * extension, for the `pjrt` host.
 *
 * A plugin whose compiler partitions programs over devices (SPMD) may let its
 * host decide how a custom call is partitioned: it offers this extension in
 * its PJRT_Api extension_start list (type
 * PJRT_Extension_Type_Custom_Partitioner). The host registers, under a
 * custom-call target name, a table of callbacks (JAX_CustomCallPartitioner_
 * Callbacks) that the plugin's partitioner calls while it compiles: to infer
 * the call's result sharding from its operands', to propagate a user's
 * sharding back to the call, and to partition the call (the host answers with
 * an MLIR module of the per-device computation and the shardings it wants).
 * A target may instead be registered as batch partitionable.
 *
 * Every value crosses as bytes: shapes are serialised xla.ShapeProto,
 * shardings serialised xla.OpSharding. The plugin owns the arguments of a
 * callback; the host owns what it returns until the plugin calls the
 * header's cleanup_fn with its data.
 *
 * ABI-compatible with OpenXLA's extension (version 1:
 * xla/pjrt/c/pjrt_c_api_custom_partitioner_extension.h), whose interface is
 * Apache-2.0 licensed by the OpenXLA authors; the text and comments here are
 * our own.
 *
 * The same cffi rules as pjrt_c_api.h apply: no preprocessor features beyond
 * the include guard, includes, the C++ linkage guards and integer #defines.
 * Include pjrt_c_api.h first.
 */
#ifndef PJRT_C_API_PJRT_C_API_CUSTOM_PARTITIONER_EXTENSION_H_
#define PJRT_C_API_PJRT_C_API_CUSTOM_PARTITIONER_EXTENSION_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h"

/* C++ linkage guard, opening half; laid out as in pjrt_c_api.h.
# */
#ifdef __cplusplus
extern "C" {
#endif
/* end of guard */

#define PJRT_API_CUSTOM_PARTITIONER_EXTENSION_VERSION 1

typedef struct JAX_CustomCallPartitioner_string JAX_CustomCallPartitioner_string;
typedef struct JAX_CustomCallPartitioner_aval JAX_CustomCallPartitioner_aval;
typedef struct JAX_CustomCallPartitioner_version_and_error
    JAX_CustomCallPartitioner_version_and_error;
typedef struct JAX_CustomCallPartitioner_Partition_Args
    JAX_CustomCallPartitioner_Partition_Args;
typedef struct JAX_CustomCallPartitioner_InferShardingFromOperands_Args
    JAX_CustomCallPartitioner_InferShardingFromOperands_Args;
typedef struct JAX_CustomCallPartitioner_PropagateUserSharding_Args
    JAX_CustomCallPartitioner_PropagateUserSharding_Args;
typedef struct JAX_CustomCallPartitioner_Callbacks JAX_CustomCallPartitioner_Callbacks;

/* Bytes that are not NUL-terminated. */
struct JAX_CustomCallPartitioner_string {
  const char* data;
  size_t size;
};

/* An operand or result: its shape, and its sharding when it has one. */
struct JAX_CustomCallPartitioner_aval {
  JAX_CustomCallPartitioner_string shape;
  bool has_sharding;
  JAX_CustomCallPartitioner_string sharding;
};

/* The head of every callback's arguments. The plugin sets api_version; the
 * host sets the rest: its results stay valid until the plugin calls
 * cleanup_fn(data), and a failure is has_error with a code and a message
 * (which cleanup_fn frees too). */
struct JAX_CustomCallPartitioner_version_and_error {
  int64_t api_version;
  void* data;                      /* out */
  void (*cleanup_fn)(void* data);  /* out */
  bool has_error;                  /* out */
  PJRT_Error_Code code;            /* out */
  JAX_CustomCallPartitioner_string error_msg; /* out */
};

/* partition: the per-device computation of the call. */
struct JAX_CustomCallPartitioner_Partition_Args {
  JAX_CustomCallPartitioner_version_and_error header;

  size_t num_args;
  JAX_CustomCallPartitioner_aval* op_args;
  JAX_CustomCallPartitioner_aval op_result;
  JAX_CustomCallPartitioner_string backend_config;

  /* out: an MLIR module (text or bytecode), one sharding per operand, and the
   * result's sharding */
  JAX_CustomCallPartitioner_string mlir_module;
  JAX_CustomCallPartitioner_string* args_sharding;
  JAX_CustomCallPartitioner_string result_sharding;
};

/* infer_sharding: the result's sharding from the operands', if any. */
struct JAX_CustomCallPartitioner_InferShardingFromOperands_Args {
  JAX_CustomCallPartitioner_version_and_error header;

  size_t num_args;
  JAX_CustomCallPartitioner_aval* op_args;
  JAX_CustomCallPartitioner_string result_shape;
  JAX_CustomCallPartitioner_string backend_config;

  bool has_result_sharding;                          /* out */
  JAX_CustomCallPartitioner_string result_sharding;  /* out */
};

/* propagate_user_sharding: the sharding the call should have, given the one
 * a user of its result wants (in result_sharding, which the host replaces). */
struct JAX_CustomCallPartitioner_PropagateUserSharding_Args {
  JAX_CustomCallPartitioner_version_and_error header;

  JAX_CustomCallPartitioner_string backend_config;

  JAX_CustomCallPartitioner_string result_shape;

  JAX_CustomCallPartitioner_string result_sharding; /* in and out */
};

/* The host's callbacks for one target; the plugin calls dtor when it drops
 * them. */
struct JAX_CustomCallPartitioner_Callbacks {
  int64_t version;
  void* private_data;
  void (*dtor)(JAX_CustomCallPartitioner_Callbacks* data);
  void (*partition)(JAX_CustomCallPartitioner_Callbacks* data,
                    JAX_CustomCallPartitioner_Partition_Args* args);
  void (*infer_sharding)(
      JAX_CustomCallPartitioner_Callbacks* data,
      JAX_CustomCallPartitioner_InferShardingFromOperands_Args* args);
  void (*propagate_user_sharding)(
      JAX_CustomCallPartitioner_Callbacks* data,
      JAX_CustomCallPartitioner_PropagateUserSharding_Args* args);
  bool can_side_effecting_have_replicated_sharding;
};

typedef struct PJRT_Register_Custom_Partitioner_Args
    PJRT_Register_Custom_Partitioner_Args;
struct PJRT_Register_Custom_Partitioner_Args {
  size_t struct_size;
  const char* name; /* valid during the call */
  size_t name_size;
  JAX_CustomCallPartitioner_Callbacks* callbacks;
};

/* Registers the callbacks of custom-call target `name`. */
typedef PJRT_Error* PJRT_Register_Custom_Partitioner(
    PJRT_Register_Custom_Partitioner_Args* args);

typedef struct PJRT_Register_Batch_Partitionable_Args
    PJRT_Register_Batch_Partitionable_Args;
struct PJRT_Register_Batch_Partitionable_Args {
  size_t struct_size;
  const char* name;
  size_t name_size;
};

/* Registers custom-call target `name` as partitionable along its batch
 * dimension. */
typedef PJRT_Error* PJRT_Register_Batch_Partitionable(
    PJRT_Register_Batch_Partitionable_Args* args);

typedef struct PJRT_Custom_Partitioner_Extension {
  size_t struct_size;
  PJRT_Extension_Type type;
  PJRT_Extension_Base* next;
  PJRT_Register_Custom_Partitioner* register_custom_partitioner;
  PJRT_Register_Batch_Partitionable* register_batch_partitionable;
} PJRT_Custom_Partitioner_Extension;

/* C++ linkage guard, closing half.
# */
#ifdef __cplusplus
}
#endif
/* end of guard */

#endif /* PJRT_C_API_PJRT_C_API_CUSTOM_PARTITIONER_EXTENSION_H_ */
