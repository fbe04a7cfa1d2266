/*
 * custom_calls_testlib.c -- the custom-call handlers of jaxlib's client tests, in C.
 *
 * jaxlib's xla_client_test.py registers the handlers of its C++ test module
 * custom_calls_testlib (XLA FFI handlers written with XLA's C++ binding). These
 * are the same handlers written against pjrt's XLA FFI header
 * (pjrt_c_api/xla_ffi_c_api.h), checking what the C++ binding checks: the
 * stage, the number, element types and ranks of operands and results, and the
 * attributes. tests/ffi/build.py compiles this file; the tests register the
 * handlers through pjrt.xla_client as jaxlib's tests do.
 *
 * Every handler answers XLA's metadata query with FFI version 0.1, which both
 * tested plugins accept, and keeps its state through the FFI runtime of the
 * call frame, whose state arguments changed layout between FFI 0.2 and 0.3.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xla_ffi_c_api.h"

/* -------- what every handler does first -------------------------------- */

static int answered_metadata_query(XLA_FFI_CallFrame* frame) {
  XLA_FFI_Extension_Base* extension = frame->extension_start;
  for (; extension != NULL; extension = extension->next) {
    if (extension->type == XLA_FFI_Extension_Metadata) {
      XLA_FFI_Metadata* metadata =
          ((XLA_FFI_Metadata_Extension*)extension)->metadata;
      metadata->api_version.major_version = 0;
      metadata->api_version.minor_version = 1;
      if (metadata->struct_size >=
          offsetof(XLA_FFI_Metadata, traits) + sizeof(metadata->traits)) {
        metadata->traits = 0;
      }
      return 1;
    }
  }
  return 0;
}

static XLA_FFI_Error* make_error(const XLA_FFI_CallFrame* frame,
                                 XLA_FFI_Error_Code code,
                                 const char* message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.message = message;
  args.errc = code;
  return frame->api->XLA_FFI_Error_Create(&args);
}

static XLA_FFI_Error* invalid(const XLA_FFI_CallFrame* frame,
                              const char* message) {
  return make_error(frame, XLA_FFI_Error_Code_INVALID_ARGUMENT, message);
}

/* The checks of the C++ binding's Bind().Arg/Ret: counts, then each buffer's
   element type and rank (a negative rank: any). */
static XLA_FFI_Error* check_signature(const XLA_FFI_CallFrame* frame,
                                      XLA_FFI_ExecutionStage stage,
                                      int64_t num_args, int64_t num_rets) {
  if (frame->stage != stage) {
    return invalid(frame, "Wrong execution stage");
  }
  if (frame->args.size != num_args) {
    return invalid(frame, "Wrong number of arguments");
  }
  if (frame->rets.size != num_rets) {
    return invalid(frame, "Wrong number of results");
  }
  return NULL;
}

static XLA_FFI_Buffer* typed_buffer(void* pointer, XLA_FFI_DataType dtype,
                                    int64_t rank) {
  XLA_FFI_Buffer* buffer = (XLA_FFI_Buffer*)pointer;
  if (buffer->dtype != dtype || (rank >= 0 && buffer->rank != rank)) {
    return NULL;
  }
  return buffer;
}

/* -------- stateless handlers ------------------------------------------- */

XLA_FFI_Error* always_fail(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_EXECUTE, 0, 1);
  if (error != NULL) return error;
  return make_error(frame, XLA_FFI_Error_Code_INTERNAL, "Failed intentionally");
}

XLA_FFI_Error* always_succeed(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  return check_signature(frame, XLA_FFI_ExecutionStage_EXECUTE, 0, 1);
}

XLA_FFI_Error* subtract_f32(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_EXECUTE, 2, 1);
  if (error != NULL) return error;
  XLA_FFI_Buffer* a = typed_buffer(frame->args.args[0], XLA_FFI_DataType_F32, 0);
  XLA_FFI_Buffer* b = typed_buffer(frame->args.args[1], XLA_FFI_DataType_F32, 0);
  XLA_FFI_Buffer* out =
      typed_buffer(frame->rets.rets[0], XLA_FFI_DataType_F32, 0);
  if (a == NULL || b == NULL || out == NULL) {
    return invalid(frame, "Wrong buffer type: want f32[] operands and result");
  }
  *(float*)out->data = *(const float*)a->data - *(const float*)b->data;
  return NULL;
}

/* The f32 scalar attribute `name` (attributes are sorted by name). */
static const float* f32_attribute(const XLA_FFI_CallFrame* frame,
                                  const char* name) {
  size_t length = strlen(name);
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    const XLA_FFI_ByteSpan* key = frame->attrs.names[i];
    if (key->len != length || memcmp(key->ptr, name, length) != 0) continue;
    if (frame->attrs.types[i] != XLA_FFI_AttrType_SCALAR) return NULL;
    const XLA_FFI_Scalar* scalar = (const XLA_FFI_Scalar*)frame->attrs.attrs[i];
    return scalar->dtype == XLA_FFI_DataType_F32 ? (const float*)scalar->value
                                                 : NULL;
  }
  return NULL;
}

XLA_FFI_Error* subtract_f32_cst(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_EXECUTE, 1, 1);
  if (error != NULL) return error;
  XLA_FFI_Buffer* a = typed_buffer(frame->args.args[0], XLA_FFI_DataType_F32, 0);
  XLA_FFI_Buffer* out =
      typed_buffer(frame->rets.rets[0], XLA_FFI_DataType_F32, 0);
  const float* cst = f32_attribute(frame, "cst");
  if (a == NULL || out == NULL) {
    return invalid(frame, "Wrong buffer type: want an f32[] operand and result");
  }
  if (cst == NULL) {
    return invalid(frame, "Missing attribute: want cst, an f32 scalar");
  }
  *(float*)out->data = *(const float*)a->data - *cst;
  return NULL;
}

/* -------- a stateful handler ------------------------------------------- */

typedef struct TestFfiState {
  int32_t value;
} TestFfiState;

/* Assigned by the plugin when the tests register the type (0 until then). */
XLA_FFI_TypeId test_ffi_state_id = {0};

/* Frees a TestFfiState; the tests may hand it to register_custom_type_id. */
void test_ffi_state_delete(void* state) { free(state); }

static int state_args_have_stage(const XLA_FFI_CallFrame* frame) {
  const XLA_FFI_Api_Version* version = &frame->api->api_version;
  return version->major_version > 0 || version->minor_version >= 3;
}

static XLA_FFI_Error* set_state(XLA_FFI_CallFrame* frame, XLA_FFI_TypeId* type_id,
                                void* state) {
  if (state_args_have_stage(frame)) {
    XLA_FFI_State_Set_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.ctx = frame->ctx;
    args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    args.type_id = type_id;
    args.state = state;
    return frame->api->XLA_FFI_State_Set(&args);
  }
  XLA_FFI_State_Args_V02 args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.ctx = frame->ctx;
  args.type_id = type_id;
  args.state = state;
  return frame->api->XLA_FFI_State_Set((XLA_FFI_State_Set_Args*)&args);
}

static XLA_FFI_Error* get_state(XLA_FFI_CallFrame* frame, XLA_FFI_TypeId* type_id,
                                void** state) {
  XLA_FFI_Error* error;
  if (state_args_have_stage(frame)) {
    XLA_FFI_State_Get_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.ctx = frame->ctx;
    args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    args.type_id = type_id;
    error = frame->api->XLA_FFI_State_Get(&args);
    *state = args.state;
    return error;
  }
  XLA_FFI_State_Args_V02 args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.ctx = frame->ctx;
  args.type_id = type_id;
  error = frame->api->XLA_FFI_State_Get((XLA_FFI_State_Get_Args*)&args);
  *state = args.state;
  return error;
}

static XLA_FFI_Error* instantiate_with(XLA_FFI_CallFrame* frame,
                                       XLA_FFI_TypeId* type_id, int32_t value) {
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_INSTANTIATE, 0, 0);
  if (error != NULL) return error;
  TestFfiState* state = (TestFfiState*)malloc(sizeof *state);
  if (state == NULL) {
    return make_error(frame, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "out of memory");
  }
  state->value = value;
  error = set_state(frame, type_id, state);
  if (error != NULL) free(state);
  return error;
}

static XLA_FFI_Error* execute_with(XLA_FFI_CallFrame* frame,
                                   XLA_FFI_TypeId* type_id) {
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_EXECUTE, 0, 1);
  if (error != NULL) return error;
  XLA_FFI_Buffer* out =
      typed_buffer(frame->rets.rets[0], XLA_FFI_DataType_S32, 0);
  if (out == NULL) return invalid(frame, "Wrong buffer type: want an s32[] result");
  void* state = NULL;
  error = get_state(frame, type_id, &state);
  if (error != NULL) return error;
  *(int32_t*)out->data = ((const TestFfiState*)state)->value;
  return NULL;
}

XLA_FFI_Error* state_instantiate(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  return instantiate_with(frame, &test_ffi_state_id, 42);
}

XLA_FFI_Error* state_execute(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  return execute_with(frame, &test_ffi_state_id);
}

/* -------- pjrt's own tests: a stateful handler that counts ---------------- */

/* A second state type, whose deleter the tests choose; the value each call
   site's state holds is the number of instantiations before it, plus 100. */
XLA_FFI_TypeId counted_state_id = {0};
int64_t counted_instantiations = 0;

XLA_FFI_Error* counted_instantiate(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  int32_t value = (int32_t)(100 + counted_instantiations);
  XLA_FFI_Error* error = instantiate_with(frame, &counted_state_id, value);
  if (error == NULL) ++counted_instantiations;
  return error;
}

XLA_FFI_Error* counted_execute(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  return execute_with(frame, &counted_state_id);
}

/* An instantiate handler that keeps no state: counts its calls only. */
int64_t stateless_instantiations = 0;

XLA_FFI_Error* stateless_instantiate(XLA_FFI_CallFrame* frame) {
  if (answered_metadata_query(frame)) return NULL;
  XLA_FFI_Error* error =
      check_signature(frame, XLA_FFI_ExecutionStage_INSTANTIATE, 0, 0);
  if (error == NULL) ++stateless_instantiations;
  return error;
}
