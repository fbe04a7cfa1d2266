/* A test plugin that spans processes: each process's client holds its own
 * few fake devices and learns the others' through the key-value callbacks its
 * host passes to PJRT_Client_Create, the way NVIDIA's plugin exchanges its
 * topology:
 *
 *   every node puts   local_topology/multinode/<node_id> = "<local devices>"
 *   node 0 reads them all (blocking get), and puts
 *                     global_topology/multinode = "<n0>,<n1>,..."
 *   every node reads global_topology/multinode (blocking get)
 *
 * Each node also try-gets a key nobody sets and requires NOT_FOUND, so a host
 * whose try-get callback misbehaves cannot make a client. Devices are numbered
 * globally in node order; a device is addressable only in its own process.
 * Buffers live in malloc'd memory on addressable devices. There is no compiler.
 *
 * Create options: node_id, num_nodes (int64) and local_device_count (int64,
 * default 2). With num_nodes > 1 all three key-value callbacks are required.
 *
 * The library also exports multinode_kv_* functions that drive a host's
 * callbacks from C threads, as a plugin would, for the store contract tests.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"

#define MN_EXPORT __attribute__((visibility("default")))
#define MN_MAX_DEVICES 64
#define MN_MAGIC 0x4d4e4f44u /* "MNOD" */
#define MN_TOPOLOGY_TIMEOUT_MS 60000

struct PJRT_Error {
  PJRT_Error_Code code;
  char message[512];
};

struct PJRT_Event {
  int ready;
};

struct PJRT_DeviceDescription {
  int id;
  int process_index;
};

struct PJRT_Memory {
  int id;
  PJRT_Device* device;
};

struct PJRT_Device {
  unsigned magic;
  PJRT_Client* client;
  int index; /* position in the client's global list */
  int addressable;
  PJRT_DeviceDescription description;
  PJRT_Memory memory;
};

struct PJRT_Client {
  unsigned magic;
  int node_id;
  int num_nodes;
  int num_devices;
  int first_local; /* index of this node's first device */
  int num_local;
  PJRT_Device devices[MN_MAX_DEVICES];
  PJRT_Device* device_list[MN_MAX_DEVICES];
  PJRT_Memory* memory_list[MN_MAX_DEVICES];
};

struct PJRT_Buffer {
  PJRT_Device* device;
  size_t size;
  void* data;
};

static PJRT_Error* make_error(PJRT_Error_Code code, const char* format, ...) {
  PJRT_Error* error = calloc(1, sizeof(*error));
  if (error == NULL) abort();
  va_list args;
  va_start(args, format);
  vsnprintf(error->message, sizeof(error->message), format, args);
  va_end(args);
  error->code = code;
  return error;
}

/* What a host's callback_error builds: an error of this plugin. */
static PJRT_Error* callback_error(PJRT_Error_Code code, const char* message,
                                  size_t message_size) {
  return make_error(code, "%.*s", (int)message_size, message);
}

static void error_destroy(PJRT_Error_Destroy_Args* args) { free(args->error); }

static void error_message(PJRT_Error_Message_Args* args) {
  args->message = args->error->message;
  args->message_size = strlen(args->error->message);
}

static PJRT_Error* error_get_code(PJRT_Error_GetCode_Args* args) {
  args->code = args->error->code;
  return NULL;
}

static PJRT_Error* plugin_initialize(PJRT_Plugin_Initialize_Args* args) {
  (void)args;
  return NULL;
}

/* ---- the host's key-value store, as a plugin sees it -------------------- */

typedef struct {
  PJRT_KeyValueGetCallback get;
  void* get_arg;
  PJRT_KeyValuePutCallback put;
  void* put_arg;
  PJRT_KeyValueTryGetCallback try_get;
  void* try_get_arg;
} kv_t;

static PJRT_Error* kv_put(const kv_t* kv, const char* key, const char* value) {
  PJRT_CallbackError on_error = callback_error;
  PJRT_KeyValuePutCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = sizeof(args);
  args.key = key;
  args.key_size = strlen(key);
  args.value = value;
  args.value_size = strlen(value);
  args.callback_error = &on_error;
  args.user_arg = kv->put_arg;
  return kv->put(&args);
}

/* On success *out is a malloc'd, NUL-terminated copy; the host's value is
 * handed back through its deleter. */
static PJRT_Error* kv_get(const kv_t* kv, const char* key, int timeout_ms, char** out) {
  PJRT_CallbackError on_error = callback_error;
  PJRT_KeyValueGetCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = sizeof(args);
  args.key = key;
  args.key_size = strlen(key);
  args.timeout_in_ms = timeout_ms;
  args.callback_error = &on_error;
  args.user_arg = kv->get_arg;
  PJRT_Error* error = kv->get(&args);
  if (error != NULL) return error;
  if (args.value_deleter_callback == NULL) {
    return make_error(PJRT_Error_Code_INTERNAL, "get of %s gave no value deleter", key);
  }
  *out = malloc(args.value_size + 1);
  memcpy(*out, args.value, args.value_size);
  (*out)[args.value_size] = '\0';
  args.value_deleter_callback(args.value);
  return NULL;
}

static PJRT_Error* kv_try_get(const kv_t* kv, const char* key, char** out) {
  PJRT_CallbackError on_error = callback_error;
  PJRT_KeyValueTryGetCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = sizeof(args);
  args.key = key;
  args.key_size = strlen(key);
  args.callback_error = &on_error;
  args.user_arg = kv->try_get_arg;
  PJRT_Error* error = kv->try_get(&args);
  if (error != NULL) return error;
  if (args.value_deleter_callback == NULL) {
    return make_error(PJRT_Error_Code_INTERNAL, "try-get of %s gave no value deleter", key);
  }
  *out = malloc(args.value_size + 1);
  memcpy(*out, args.value, args.value_size);
  (*out)[args.value_size] = '\0';
  args.value_deleter_callback(args.value);
  return NULL;
}

/* ---- clients ------------------------------------------------------------ */

static int64_t option_int(const PJRT_NamedValue* options, size_t count,
                          const char* name, int64_t fallback) {
  for (size_t i = 0; i < count; ++i) {
    if (options[i].type == PJRT_NamedValue_kInt64 &&
        options[i].name_size == strlen(name) &&
        memcmp(options[i].name, name, options[i].name_size) == 0) {
      return options[i].int64_value;
    }
  }
  return fallback;
}

/* Learns every node's device count through the store; counts[i] for node i. */
static PJRT_Error* exchange_topology(const kv_t* kv, int node_id, int num_nodes,
                                     int num_local, int* counts) {
  char key[128], value[32];
  char* text = NULL;
  snprintf(key, sizeof(key), "probe/multinode/never_set/%d", node_id);
  PJRT_Error* error = kv_try_get(kv, key, &text);
  if (error == NULL) {
    free(text);
    return make_error(PJRT_Error_Code_INTERNAL, "try-get of %s found a value", key);
  }
  if (error->code != PJRT_Error_Code_NOT_FOUND) {
    PJRT_Error* wrong = make_error(PJRT_Error_Code_INTERNAL,
                                   "try-get of a missing key gave code %d (%s), not NOT_FOUND",
                                   (int)error->code, error->message);
    free(error);
    return wrong;
  }
  free(error);
  snprintf(key, sizeof(key), "local_topology/multinode/%d", node_id);
  snprintf(value, sizeof(value), "%d", num_local);
  if ((error = kv_put(kv, key, value)) != NULL) return error;
  char global[1024];
  if (node_id == 0) {
    size_t used = 0;
    global[0] = '\0';
    for (int node = 0; node < num_nodes; ++node) {
      snprintf(key, sizeof(key), "local_topology/multinode/%d", node);
      if ((error = kv_get(kv, key, MN_TOPOLOGY_TIMEOUT_MS, &text)) != NULL) return error;
      used += snprintf(global + used, sizeof(global) - used, "%s%s", node ? "," : "", text);
      free(text);
    }
    if ((error = kv_put(kv, "global_topology/multinode", global)) != NULL) return error;
  } else {
    if ((error = kv_get(kv, "global_topology/multinode", MN_TOPOLOGY_TIMEOUT_MS, &text)) != NULL)
      return error;
    snprintf(global, sizeof(global), "%s", text);
    free(text);
  }
  char* cursor = global;
  for (int node = 0; node < num_nodes; ++node) {
    char* end = NULL;
    long count = strtol(cursor, &end, 10);
    if (end == cursor || count < 1) {
      return make_error(PJRT_Error_Code_INTERNAL, "bad global topology \"%s\"", global);
    }
    counts[node] = (int)count;
    cursor = *end == ',' ? end + 1 : end;
  }
  return NULL;
}

static PJRT_Error* client_create(PJRT_Client_Create_Args* args) {
  int node_id = (int)option_int(args->create_options, args->num_options, "node_id", 0);
  int num_nodes = (int)option_int(args->create_options, args->num_options, "num_nodes", 1);
  int num_local = (int)option_int(args->create_options, args->num_options,
                                  "local_device_count", 2);
  if (num_nodes < 1 || node_id < 0 || node_id >= num_nodes || num_local < 1 ||
      num_local * num_nodes > MN_MAX_DEVICES) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "bad topology: node_id %d, num_nodes %d, local_device_count %d",
                      node_id, num_nodes, num_local);
  }
  int counts[MN_MAX_DEVICES];
  counts[0] = num_local;
  if (num_nodes > 1) {
    /* Like NVIDIA's plugin: the store exists only with all three callbacks. */
    size_t need = offsetof(PJRT_Client_Create_Args, kv_try_get_user_arg) + sizeof(void*);
    if (args->struct_size < need || args->kv_get_callback == NULL ||
        args->kv_put_callback == NULL || args->kv_try_get_callback == NULL) {
      return make_error(PJRT_Error_Code_FAILED_PRECONDITION,
                        "num_nodes %d needs the kv_get, kv_put and kv_try_get callbacks",
                        num_nodes);
    }
    kv_t kv = {args->kv_get_callback, args->kv_get_user_arg, args->kv_put_callback,
               args->kv_put_user_arg, args->kv_try_get_callback, args->kv_try_get_user_arg};
    PJRT_Error* error = exchange_topology(&kv, node_id, num_nodes, num_local, counts);
    if (error != NULL) return error;
    if (counts[node_id] != num_local) {
      return make_error(PJRT_Error_Code_INTERNAL, "the global topology gives node %d %d devices,"
                        " not %d", node_id, counts[node_id], num_local);
    }
  }
  PJRT_Client* client = calloc(1, sizeof(*client));
  if (client == NULL) abort();
  client->magic = MN_MAGIC;
  client->node_id = node_id;
  client->num_nodes = num_nodes;
  int index = 0;
  for (int node = 0; node < num_nodes; ++node) {
    if (index + counts[node] > MN_MAX_DEVICES) {
      free(client);
      return make_error(PJRT_Error_Code_INTERNAL, "too many devices in the job");
    }
    if (node == node_id) {
      client->first_local = index;
      client->num_local = counts[node];
    }
    for (int i = 0; i < counts[node]; ++i, ++index) {
      PJRT_Device* device = &client->devices[index];
      device->magic = MN_MAGIC;
      device->client = client;
      device->index = index;
      device->addressable = node == node_id;
      device->description.id = index;
      device->description.process_index = node;
      device->memory.id = index;
      device->memory.device = device;
      client->device_list[index] = device;
      client->memory_list[index] = &device->memory;
    }
  }
  client->num_devices = index;
  args->client = client;
  return NULL;
}

static PJRT_Error* client_destroy(PJRT_Client_Destroy_Args* args) {
  args->client->magic = 0;
  free(args->client);
  return NULL;
}

static PJRT_Error* client_platform_name(PJRT_Client_PlatformName_Args* args) {
  args->platform_name = "multinode";
  args->platform_name_size = strlen("multinode");
  return NULL;
}

static PJRT_Error* client_platform_version(PJRT_Client_PlatformVersion_Args* args) {
  args->platform_version = "multinode 1.0";
  args->platform_version_size = strlen("multinode 1.0");
  return NULL;
}

static PJRT_Error* client_process_index(PJRT_Client_ProcessIndex_Args* args) {
  args->process_index = args->client->node_id;
  return NULL;
}

static PJRT_Error* client_devices(PJRT_Client_Devices_Args* args) {
  args->devices = args->client->device_list;
  args->num_devices = args->client->num_devices;
  return NULL;
}

static PJRT_Error* client_addressable_devices(PJRT_Client_AddressableDevices_Args* args) {
  args->addressable_devices = &args->client->device_list[args->client->first_local];
  args->num_addressable_devices = args->client->num_local;
  return NULL;
}

static PJRT_Error* client_addressable_memories(PJRT_Client_AddressableMemories_Args* args) {
  args->addressable_memories = &args->client->memory_list[args->client->first_local];
  args->num_addressable_memories = args->client->num_local;
  return NULL;
}

/* ---- devices and memories ---------------------------------------------- */

static PJRT_Error* description_id(PJRT_DeviceDescription_Id_Args* args) {
  args->id = args->device_description->id;
  return NULL;
}

static PJRT_Error* description_process_index(PJRT_DeviceDescription_ProcessIndex_Args* args) {
  args->process_index = args->device_description->process_index;
  return NULL;
}

static PJRT_Error* description_kind(PJRT_DeviceDescription_Kind_Args* args) {
  args->device_kind = "multinode device";
  args->device_kind_size = strlen("multinode device");
  return NULL;
}

static PJRT_Error* device_get_description(PJRT_Device_GetDescription_Args* args) {
  args->device_description = &args->device->description;
  return NULL;
}

static PJRT_Error* device_is_addressable(PJRT_Device_IsAddressable_Args* args) {
  args->is_addressable = args->device->addressable;
  return NULL;
}

static PJRT_Error* device_local_hardware_id(PJRT_Device_LocalHardwareId_Args* args) {
  PJRT_Device* device = args->device;
  args->local_hardware_id = device->addressable ? device->index - device->client->first_local : -1;
  return NULL;
}

static PJRT_Error* device_addressable_memories(PJRT_Device_AddressableMemories_Args* args) {
  args->memories = &args->device->client->memory_list[args->device->index];
  args->num_memories = 1;
  return NULL;
}

static PJRT_Error* device_default_memory(PJRT_Device_DefaultMemory_Args* args) {
  args->memory = &args->device->memory;
  return NULL;
}

static PJRT_Error* memory_id(PJRT_Memory_Id_Args* args) {
  args->id = args->memory->id;
  return NULL;
}

static PJRT_Error* memory_kind(PJRT_Memory_Kind_Args* args) {
  args->kind = "device";
  args->kind_size = strlen("device");
  return NULL;
}

static PJRT_Error* memory_addressable_by_devices(PJRT_Memory_AddressableByDevices_Args* args) {
  PJRT_Device* device = args->memory->device;
  args->devices = &device->client->device_list[device->index];
  args->num_devices = 1;
  return NULL;
}

/* ---- events and buffers ------------------------------------------------- */

static PJRT_Error* event_destroy(PJRT_Event_Destroy_Args* args) {
  free(args->event);
  return NULL;
}

static PJRT_Error* event_is_ready(PJRT_Event_IsReady_Args* args) {
  args->is_ready = true;
  return NULL;
}

static PJRT_Error* event_await(PJRT_Event_Await_Args* args) {
  (void)args;
  return NULL;
}

static size_t element_size(PJRT_Buffer_Type type) {
  switch (type) {
    case PJRT_Buffer_Type_PRED: case PJRT_Buffer_Type_S8: case PJRT_Buffer_Type_U8:
      return 1;
    case PJRT_Buffer_Type_S16: case PJRT_Buffer_Type_U16: case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32: case PJRT_Buffer_Type_U32: case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64: case PJRT_Buffer_Type_U64: case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default:
      return 0;
  }
}

static PJRT_Error* buffer_from_host(PJRT_Client_BufferFromHostBuffer_Args* args) {
  PJRT_Device* device = args->memory != NULL ? args->memory->device : args->device;
  if (device == NULL || device->client != args->client) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "no device of this client given");
  }
  if (!device->addressable) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "device %d belongs to process %d; this is process %d", device->index,
                      device->description.process_index, args->client->node_id);
  }
  if (args->num_byte_strides != 0) {
    return make_error(PJRT_Error_Code_UNIMPLEMENTED, "byte strides are not supported");
  }
  size_t size = element_size(args->type);
  if (size == 0) {
    return make_error(PJRT_Error_Code_UNIMPLEMENTED, "buffer type %d", (int)args->type);
  }
  for (size_t i = 0; i < args->num_dims; ++i) size *= (size_t)args->dims[i];
  PJRT_Buffer* buffer = calloc(1, sizeof(*buffer));
  if (buffer == NULL) abort();
  buffer->data = malloc(size ? size : 1);
  if (buffer->data == NULL) abort();
  memcpy(buffer->data, args->data, size);
  buffer->device = device;
  buffer->size = size;
  args->done_with_host_buffer = NULL;
  args->buffer = buffer;
  return NULL;
}

static PJRT_Error* buffer_destroy(PJRT_Buffer_Destroy_Args* args) {
  free(args->buffer->data);
  free(args->buffer);
  return NULL;
}

static PJRT_Error* buffer_to_host(PJRT_Buffer_ToHostBuffer_Args* args) {
  PJRT_Buffer* buffer = args->src;
  args->event = NULL;
  if (args->dst == NULL) {
    args->dst_size = buffer->size;
    return NULL;
  }
  if (args->dst_size < buffer->size) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "destination too small");
  }
  memcpy(args->dst, buffer->data, buffer->size);
  return NULL;
}

static PJRT_Error* buffer_ready_event(PJRT_Buffer_ReadyEvent_Args* args) {
  args->event = calloc(1, sizeof(PJRT_Event));
  if (args->event == NULL) abort();
  args->event->ready = 1;
  return NULL;
}

static PJRT_Error* buffer_memory(PJRT_Buffer_Memory_Args* args) {
  args->memory = &args->buffer->device->memory;
  return NULL;
}

/* ---- the table ------------------------------------------------------------ */

static PJRT_Api g_api;

MN_EXPORT const PJRT_Api* GetPjrtApi(void) {
  memset(&g_api, 0, sizeof(g_api));
  g_api.struct_size = sizeof(PJRT_Api);
  g_api.pjrt_api_version.struct_size = sizeof(PJRT_Api_Version);
  g_api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  g_api.pjrt_api_version.minor_version = PJRT_API_MINOR;
  g_api.PJRT_Error_Destroy = error_destroy;
  g_api.PJRT_Error_Message = error_message;
  g_api.PJRT_Error_GetCode = error_get_code;
  g_api.PJRT_Plugin_Initialize = plugin_initialize;
  g_api.PJRT_Event_Destroy = event_destroy;
  g_api.PJRT_Event_IsReady = event_is_ready;
  g_api.PJRT_Event_Await = event_await;
  g_api.PJRT_Client_Create = client_create;
  g_api.PJRT_Client_Destroy = client_destroy;
  g_api.PJRT_Client_PlatformName = client_platform_name;
  g_api.PJRT_Client_ProcessIndex = client_process_index;
  g_api.PJRT_Client_PlatformVersion = client_platform_version;
  g_api.PJRT_Client_Devices = client_devices;
  g_api.PJRT_Client_AddressableDevices = client_addressable_devices;
  g_api.PJRT_Client_AddressableMemories = client_addressable_memories;
  g_api.PJRT_Client_BufferFromHostBuffer = buffer_from_host;
  g_api.PJRT_DeviceDescription_Id = description_id;
  g_api.PJRT_DeviceDescription_ProcessIndex = description_process_index;
  g_api.PJRT_DeviceDescription_Kind = description_kind;
  g_api.PJRT_Device_GetDescription = device_get_description;
  g_api.PJRT_Device_IsAddressable = device_is_addressable;
  g_api.PJRT_Device_LocalHardwareId = device_local_hardware_id;
  g_api.PJRT_Device_AddressableMemories = device_addressable_memories;
  g_api.PJRT_Device_DefaultMemory = device_default_memory;
  g_api.PJRT_Memory_Id = memory_id;
  g_api.PJRT_Memory_Kind = memory_kind;
  g_api.PJRT_Memory_AddressableByDevices = memory_addressable_by_devices;
  g_api.PJRT_Buffer_Destroy = buffer_destroy;
  g_api.PJRT_Buffer_Memory = buffer_memory;
  g_api.PJRT_Buffer_ToHostBuffer = buffer_to_host;
  g_api.PJRT_Buffer_ReadyEvent = buffer_ready_event;
  return &g_api;
}

/* ---- driving a host's callbacks from C threads --------------------------- */

typedef struct {
  const kv_t* kv;
  const char* tag;
  int thread;
  int keys;
  int timeout_ms;
  int failures;
  char failure[256];
} stress_t;

static void stress_fail(stress_t* job, const char* format, ...) {
  if (job->failures++ == 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(job->failure, sizeof(job->failure), format, args);
    va_end(args);
  }
}

static void* stress_thread(void* arg) {
  stress_t* job = arg;
  char key[256], value[64];
  char* text = NULL;
  for (int k = 0; k < job->keys; ++k) {
    snprintf(key, sizeof(key), "%s/thread%d/key%d", job->tag, job->thread, k);
    snprintf(value, sizeof(value), "value %d.%d", job->thread, k);
    PJRT_Error* error = kv_put(job->kv, key, value);
    if (error) { stress_fail(job, "put %s: %s", key, error->message); free(error); continue; }
    error = kv_try_get(job->kv, key, &text);
    if (error) { stress_fail(job, "try-get %s: %s", key, error->message); free(error); continue; }
    if (strcmp(text, value) != 0) stress_fail(job, "try-get %s gave \"%s\"", key, text);
    free(text);
    error = kv_get(job->kv, key, job->timeout_ms, &text);
    if (error) { stress_fail(job, "get %s: %s", key, error->message); free(error); continue; }
    if (strcmp(text, value) != 0) stress_fail(job, "get %s gave \"%s\"", key, text);
    free(text);
    snprintf(key, sizeof(key), "%s/thread%d/missing%d", job->tag, job->thread, k);
    error = kv_try_get(job->kv, key, &text);
    if (error == NULL) { stress_fail(job, "try-get %s found \"%s\"", key, text); free(text); }
    else {
      if (error->code != PJRT_Error_Code_NOT_FOUND)
        stress_fail(job, "try-get %s: code %d (%s)", key, (int)error->code, error->message);
      free(error);
    }
  }
  return NULL;
}

/* Runs `threads` threads, each putting `keys` keys under `tag`, reading each
 * back with try-get and blocking get, and try-getting a missing key (which
 * must be NOT_FOUND). Returns the number of failures; the first is described
 * in `report`. */
MN_EXPORT int multinode_kv_stress(PJRT_KeyValueGetCallback get, void* get_arg,
                                  PJRT_KeyValuePutCallback put, void* put_arg,
                                  PJRT_KeyValueTryGetCallback try_get, void* try_get_arg,
                                  const char* tag, int threads, int keys, int timeout_ms,
                                  char* report, size_t report_size) {
  kv_t kv = {get, get_arg, put, put_arg, try_get, try_get_arg};
  pthread_t ids[64];
  stress_t jobs[64];
  if (threads > 64) threads = 64;
  for (int t = 0; t < threads; ++t) {
    jobs[t] = (stress_t){&kv, tag, t, keys, timeout_ms, 0, ""};
    pthread_create(&ids[t], NULL, stress_thread, &jobs[t]);
  }
  int failures = 0;
  report[0] = '\0';
  for (int t = 0; t < threads; ++t) {
    pthread_join(ids[t], NULL);
    if (jobs[t].failures && !failures) snprintf(report, report_size, "%s", jobs[t].failure);
    failures += jobs[t].failures;
  }
  return failures;
}

/* One blocking get from a C thread of its own; returns the error code (0 for
 * OK) and the value (or the error's message) in `out`. */
typedef struct {
  kv_t kv;
  const char* key;
  int timeout_ms;
  int code;
  char* out;
  size_t out_size;
} one_get_t;

static void* one_get_thread(void* arg) {
  one_get_t* job = arg;
  char* text = NULL;
  PJRT_Error* error = kv_get(&job->kv, job->key, job->timeout_ms, &text);
  if (error) {
    job->code = (int)error->code;
    snprintf(job->out, job->out_size, "%s", error->message);
    free(error);
  } else {
    job->code = 0;
    snprintf(job->out, job->out_size, "%s", text);
    free(text);
  }
  return NULL;
}

MN_EXPORT int multinode_kv_get(PJRT_KeyValueGetCallback get, void* get_arg, const char* key,
                               int timeout_ms, char* out, size_t out_size) {
  one_get_t job = {{get, get_arg, NULL, NULL, NULL, NULL}, key, timeout_ms, -1, out, out_size};
  pthread_t id;
  pthread_create(&id, NULL, one_get_thread, &job);
  pthread_join(id, NULL);
  return job.code;
}

/* One put from the calling thread; returns the error code (0 for OK). */
MN_EXPORT int multinode_kv_put(PJRT_KeyValuePutCallback put, void* put_arg, const char* key,
                               const char* value) {
  kv_t kv = {NULL, NULL, put, put_arg, NULL, NULL};
  PJRT_Error* error = kv_put(&kv, key, value);
  if (error == NULL) return 0;
  int code = (int)error->code;
  free(error);
  return code;
}
