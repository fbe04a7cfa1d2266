/* A tiny PJRT plugin for testing how pjrt loads plugins and handles their
 * failures.
 *
 * It implements just enough of the PJRT C API for pjrt's Client to work: two
 * fake devices, one memory each, host buffers that live in malloc'd memory,
 * and trivially ready events. Everything else in the table is NULL.
 *
 * The tests steer it through exported control functions (called with ctypes)
 * before pjrt loads it: the API version it reports, how many bytes of the
 * function table it claims to fill in (struct_size), which step fails, and
 * which entries to leave NULL. Because the state lives in this library's
 * globals, each configuration needs its own copy of the .so under a new file
 * name: dlopen hands back the already-loaded object for a path it has seen,
 * and a copy (another inode) gets a fresh set of globals.
 *
 * Each device keeps memory statistics of its buffers (bytes in use and the
 * peak since the last PJRT_Device_ClearMemoryStats), which PJRT_Device_MemoryStats
 * reports with every field that carries a peak, peak_allocated_bytes (PJRT API
 * 0.113) included whenever the host's struct has room for it, whatever API
 * version the plugin reports: a host must read it only from plugins whose API
 * has it.
 *
 * Every object handed to the host carries a magic word, and is kept (not
 * freed) after it is destroyed, so that a double destroy or a use after
 * destroy is caught and counted as misuse instead of corrupting the heap.
 * Each implemented function also checks that its own entry lies inside the
 * table size it published: a host that calls past struct_size is misusing an
 * old plugin's table, and is told so with an error and a misuse count.
 *
 * A process that cannot call the control functions (one a host starts to run
 * a plugin in, such as `pjrt conform`'s workers) steers it through the
 * environment instead, read when GetPjrtApi is called:
 *
 *   PJRT_FAULT_DELEGATE=/path/to/plugin.so  forward every call to that real
 *       plugin, whose table (version, size, extensions) this one then reports,
 *       replacing only the entries the fault below needs.
 *   PJRT_FAULT=FAULT[:ARGUMENT], FAULT one of
 *       null_api               GetPjrtApi returns NULL;
 *       abort_compile[:TEXT]   PJRT_Client_Compile aborts the process (only
 *                              for programs whose code contains TEXT);
 *       corrupt_to_host[:TYPE] PJRT_Buffer_ToHostBuffer flips the bits of the
 *                              first byte it writes (only for buffers whose
 *                              PJRT_Buffer_Type number is TYPE);
 *       hang_execute[:NAME]    PJRT_LoadedExecutable_Execute never returns
 *                              (only for executables whose name contains NAME);
 *       fail_execute[:NAME]    PJRT_LoadedExecutable_Execute returns an error
 *                              from the second launch of each executable on
 *                              (whose name contains NAME), so that a host has
 *                              seen it run once;
 *       abort_create           PJRT_Client_Create prints a line on stderr and
 *                              aborts the process.
 *       crash_deserialize[:TEXT]  PJRT_Executable_DeserializeAndLoad dies of
 *                              SIGSEGV, as a loader reading damaged bytes does
 *                              (only for serialized bytes that contain TEXT).
 *       slow_client_create[:SECONDS]  PJRT_Client_Create sleeps SECONDS (default
 *                              an hour) before it answers, as a plugin looking
 *                              for hardware or servers that are not there.
 *       no_on_ready            the table has no PJRT_Event_OnReady, as a plugin
 *                              older than it: events can only be awaited.
 *   abort_compile, corrupt_to_host, hang_execute, fail_execute, abort_create,
 *   crash_deserialize and no_on_ready need
 *   PJRT_FAULT_DELEGATE (this plugin compiles nothing); slow_client_create needs it
 *   unset.
 *   PJRT_FAULT_PROFILER=MODE  a profiler extension, with or without a
 *       delegate (see "a profiler extension" below).
 *   PJRT_FAULT_PARTITIONER=MODE  a custom partitioner extension, with or
 *       without a delegate (see "a custom partitioner extension" below).
 */
#define _GNU_SOURCE /* memmem */
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pjrt_c_api.h"
#include "pjrt_c_api_profiler_extension.h"
#include "pjrt_c_api_custom_partitioner_extension.h"

#define FAULT_EXPORT __attribute__((visibility("default")))

/* What the plugin does wrong; the numbers are part of the tests' interface. */
enum {
  FAULT_MODE_NORMAL = 1,
  FAULT_MODE_CLIENT_CREATE_FAILS = 2,
  FAULT_MODE_INITIALIZE_FAILS = 3,
  FAULT_MODE_NULL_API = 4,
};

#define FAULT_NUM_DEVICES 2
#define MAGIC_LIVE 0x4641554cu /* "FAUL" */
#define MAGIC_DEAD 0x44454144u /* "DEAD" */

/* ---- configuration and counters ---------------------------------------- */

static int g_major = PJRT_API_MAJOR;
static int g_minor = PJRT_API_MINOR;
static size_t g_table_size = 0; /* 0: the whole table as our header knows it */
static size_t g_claimed_size = 0; /* nonzero: struct_size published, true or not */
static int g_mode = FAULT_MODE_NORMAL;
static int g_failure_code = PJRT_Error_Code_FAILED_PRECONDITION;
static char g_failure_message[256] = "no fault devices";

static long g_errors_created, g_errors_destroyed;
static long g_clients_created, g_clients_destroyed;
static long g_buffers_created, g_buffers_destroyed;
static long g_events_created, g_events_destroyed;
static long g_initialize_calls, g_client_create_calls;
static long g_misuse;
static char g_last_misuse[256];
static char g_last_options[1024];

/* The fault the environment selects (see the top; read in GetPjrtApi). */
static char g_fault[64];
static char g_fault_argument[256];
static int fault_is(const char* name);

/* Counters may be bumped from whichever thread the host's garbage collector
 * runs on, so they are updated atomically. */
static void bump(long* counter) { __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST); }
static long read_counter(long* counter) { return __atomic_load_n(counter, __ATOMIC_SEQ_CST); }

static void misuse(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(g_last_misuse, sizeof(g_last_misuse), format, args);
  va_end(args);
  bump(&g_misuse);
}

/* ---- the handle types the header leaves opaque ------------------------- */

struct PJRT_Error {
  unsigned magic;
  PJRT_Error_Code code;
  char message[256];
};

struct PJRT_Event {
  unsigned magic;
};

struct PJRT_DeviceDescription {
  int id;
  int process_index;
};

struct PJRT_Memory {
  unsigned magic;
  int id;
  PJRT_Device* device;
};

struct PJRT_Device {
  unsigned magic;
  PJRT_Client* client;
  PJRT_DeviceDescription description;
  PJRT_Memory memory;
  long bytes_in_use; /* of its live buffers (atomic: buffers go on any thread) */
  long peak_bytes; /* the most bytes_in_use since the client began or the last clear */
};

struct PJRT_Client {
  unsigned magic;
  long live_buffers;
  PJRT_Device devices[FAULT_NUM_DEVICES];
  PJRT_Device* device_list[FAULT_NUM_DEVICES];
  PJRT_Memory* memory_list[FAULT_NUM_DEVICES];
};

struct PJRT_Buffer {
  unsigned magic;
  PJRT_Client* client;
  PJRT_Device* device;
  size_t size;
  void* data;
};

static PJRT_Error* make_error(PJRT_Error_Code code, const char* format, ...) {
  PJRT_Error* error = calloc(1, sizeof(*error));
  if (error == NULL) abort(); /* a test plugin has no better answer */
  va_list args;
  va_start(args, format);
  vsnprintf(error->message, sizeof(error->message), format, args);
  va_end(args);
  error->magic = MAGIC_LIVE;
  error->code = code;
  bump(&g_errors_created);
  return error;
}

/* ---- the function table ------------------------------------------------- */

/* Room past our header's table, so a "newer" plugin can report a bigger
 * struct_size without claiming memory that is not there. */
static struct {
  PJRT_Api api;
  void* newer_entries[16];
} g_table;

/* Whether the entry at `offset` lies inside the table size we published. */
static int published(size_t offset) {
  return g_table.api.struct_size >= offset + sizeof(void*);
}

/* Every PJRT_Error-returning function starts with this. */
#define GUARD(function)                                                       \
  do {                                                                        \
    if (!published(offsetof(PJRT_Api, function))) {                          \
      misuse("%s called past the end of the table", #function);              \
      return make_error(PJRT_Error_Code_INTERNAL,                             \
                        "%s called past the end of the table (struct_size "   \
                        "%zu)", #function, g_table.api.struct_size);          \
    }                                                                         \
  } while (0)

#define CHECK_HANDLE(function, handle, what)                                    \
  do {                                                                          \
    if ((handle) == NULL || (handle)->magic != MAGIC_LIVE) {                    \
      misuse("%s got a %s " what, #function, (handle) == NULL ? "NULL" : "dead"); \
      return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: bad " what,       \
                        #function);                                             \
    }                                                                           \
  } while (0)

/* ---- errors ------------------------------------------------------------- */

static void impl_PJRT_Error_Destroy(PJRT_Error_Destroy_Args* args) {
  PJRT_Error* error = args->error;
  if (error == NULL) return;
  if (error->magic != MAGIC_LIVE) {
    misuse("PJRT_Error_Destroy on an error already destroyed");
    return;
  }
  /* Kept, not freed, so that a second destroy is seen (see the top). */
  error->magic = MAGIC_DEAD;
  bump(&g_errors_destroyed);
}

static void impl_PJRT_Error_Message(PJRT_Error_Message_Args* args) {
  const PJRT_Error* error = args->error;
  if (error == NULL || error->magic != MAGIC_LIVE) {
    misuse("PJRT_Error_Message on a dead error");
    args->message = "";
    args->message_size = 0;
    return;
  }
  args->message = error->message;
  args->message_size = strlen(error->message);
}

static PJRT_Error* impl_PJRT_Error_GetCode(PJRT_Error_GetCode_Args* args) {
  GUARD(PJRT_Error_GetCode);
  CHECK_HANDLE(PJRT_Error_GetCode, args->error, "error");
  args->code = args->error->code;
  return NULL;
}

/* ---- plugin ------------------------------------------------------------- */

static PJRT_Error* impl_PJRT_Plugin_Initialize(PJRT_Plugin_Initialize_Args* args) {
  (void)args;
  GUARD(PJRT_Plugin_Initialize);
  bump(&g_initialize_calls);
  if (g_mode == FAULT_MODE_INITIALIZE_FAILS) {
    return make_error((PJRT_Error_Code)g_failure_code, "%s", g_failure_message);
  }
  return NULL;
}

static const int64_t kAttributeList[] = {1, 2, 3};
static PJRT_NamedValue g_attributes[5];

static void fill_attributes(void) {
  static const char* names[] = {"fault_name", "fault_answer", "fault_list",
                                "fault_ratio", "fault_enabled"};
  for (int i = 0; i < 5; ++i) {
    g_attributes[i].struct_size = sizeof(PJRT_NamedValue);
    g_attributes[i].name = names[i];
    g_attributes[i].name_size = strlen(names[i]);
    g_attributes[i].value_size = 1;
  }
  g_attributes[0].type = PJRT_NamedValue_kString;
  g_attributes[0].string_value = "fault-injector";
  g_attributes[0].value_size = strlen("fault-injector");
  g_attributes[1].type = PJRT_NamedValue_kInt64;
  g_attributes[1].int64_value = 42;
  g_attributes[2].type = PJRT_NamedValue_kInt64List;
  g_attributes[2].int64_array_value = kAttributeList;
  g_attributes[2].value_size = 3;
  g_attributes[3].type = PJRT_NamedValue_kFloat;
  g_attributes[3].float_value = 0.5f;
  g_attributes[4].type = PJRT_NamedValue_kBool;
  g_attributes[4].bool_value = true;
}

static PJRT_Error* impl_PJRT_Plugin_Attributes(PJRT_Plugin_Attributes_Args* args) {
  GUARD(PJRT_Plugin_Attributes);
  args->attributes = g_attributes;
  args->num_attributes = 5;
  return NULL;
}

/* ---- events (all born ready) ------------------------------------------- */

static PJRT_Event* make_event(void) {
  PJRT_Event* event = calloc(1, sizeof(*event));
  if (event == NULL) abort();
  event->magic = MAGIC_LIVE;
  bump(&g_events_created);
  return event;
}

static PJRT_Error* impl_PJRT_Event_Destroy(PJRT_Event_Destroy_Args* args) {
  GUARD(PJRT_Event_Destroy);
  CHECK_HANDLE(PJRT_Event_Destroy, args->event, "event");
  args->event->magic = MAGIC_DEAD;
  bump(&g_events_destroyed);
  return NULL;
}

static PJRT_Error* impl_PJRT_Event_IsReady(PJRT_Event_IsReady_Args* args) {
  GUARD(PJRT_Event_IsReady);
  CHECK_HANDLE(PJRT_Event_IsReady, args->event, "event");
  args->is_ready = true;
  return NULL;
}

static PJRT_Error* impl_PJRT_Event_Await(PJRT_Event_Await_Args* args) {
  GUARD(PJRT_Event_Await);
  CHECK_HANDLE(PJRT_Event_Await, args->event, "event");
  return NULL;
}

/* ---- clients ------------------------------------------------------------ */

/* Writes the create options into g_last_options as "name=type:value;..." so
 * a test can see exactly what crossed the C boundary. */
static void record_options(const PJRT_NamedValue* options, size_t count) {
  size_t used = 0;
  g_last_options[0] = '\0';
#define APPEND(...)                                                        \
  do {                                                                     \
    if (used < sizeof(g_last_options))                                     \
      used += snprintf(g_last_options + used, sizeof(g_last_options) - used, \
                       __VA_ARGS__);                                       \
  } while (0)
  for (size_t i = 0; i < count; ++i) {
    const PJRT_NamedValue* option = &options[i];
    APPEND("%s%.*s=", i ? ";" : "", (int)option->name_size, option->name);
    switch (option->type) {
      case PJRT_NamedValue_kString:
        APPEND("str:%.*s", (int)option->value_size, option->string_value);
        break;
      case PJRT_NamedValue_kInt64:
        APPEND("int:%lld", (long long)option->int64_value);
        break;
      case PJRT_NamedValue_kInt64List:
        APPEND("list:");
        for (size_t j = 0; j < option->value_size; ++j) {
          APPEND("%s%lld", j ? "," : "", (long long)option->int64_array_value[j]);
        }
        break;
      case PJRT_NamedValue_kFloat:
        APPEND("float:%g", (double)option->float_value);
        break;
      case PJRT_NamedValue_kBool:
        APPEND("bool:%d", option->bool_value ? 1 : 0);
        break;
      default:
        APPEND("unknown");
    }
  }
#undef APPEND
}

static PJRT_Error* impl_PJRT_Client_Create(PJRT_Client_Create_Args* args) {
  GUARD(PJRT_Client_Create);
  bump(&g_client_create_calls);
  record_options(args->create_options, args->num_options);
  if (fault_is("slow_client_create")) {
    unsigned seconds = g_fault_argument[0] ? (unsigned)atoi(g_fault_argument) : 3600;
    while (seconds > 0) seconds = sleep(seconds); /* a signal does not cut it short */
  }
  if (g_mode == FAULT_MODE_CLIENT_CREATE_FAILS) {
    return make_error((PJRT_Error_Code)g_failure_code, "%s", g_failure_message);
  }
  PJRT_Client* client = calloc(1, sizeof(*client));
  if (client == NULL) abort();
  client->magic = MAGIC_LIVE;
  for (int i = 0; i < FAULT_NUM_DEVICES; ++i) {
    PJRT_Device* device = &client->devices[i];
    device->magic = MAGIC_LIVE;
    device->client = client;
    device->description.id = i;
    device->description.process_index = 0;
    device->memory.magic = MAGIC_LIVE;
    device->memory.id = i;
    device->memory.device = device;
    client->device_list[i] = device;
    client->memory_list[i] = &device->memory;
  }
  args->client = client;
  bump(&g_clients_created);
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_Destroy(PJRT_Client_Destroy_Args* args) {
  GUARD(PJRT_Client_Destroy);
  CHECK_HANDLE(PJRT_Client_Destroy, args->client, "client");
  if (args->client->live_buffers != 0) {
    /* A real plugin's buffers point into the client; they must go first. */
    misuse("PJRT_Client_Destroy with %ld buffers still alive",
           args->client->live_buffers);
  }
  args->client->magic = MAGIC_DEAD;
  bump(&g_clients_destroyed);
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_PlatformName(PJRT_Client_PlatformName_Args* args) {
  GUARD(PJRT_Client_PlatformName);
  CHECK_HANDLE(PJRT_Client_PlatformName, args->client, "client");
  args->platform_name = "fault";
  args->platform_name_size = strlen("fault");
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_ProcessIndex(PJRT_Client_ProcessIndex_Args* args) {
  GUARD(PJRT_Client_ProcessIndex);
  CHECK_HANDLE(PJRT_Client_ProcessIndex, args->client, "client");
  args->process_index = 0;
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_PlatformVersion(PJRT_Client_PlatformVersion_Args* args) {
  GUARD(PJRT_Client_PlatformVersion);
  CHECK_HANDLE(PJRT_Client_PlatformVersion, args->client, "client");
  args->platform_version = "fault 1.0";
  args->platform_version_size = strlen("fault 1.0");
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_Devices(PJRT_Client_Devices_Args* args) {
  GUARD(PJRT_Client_Devices);
  CHECK_HANDLE(PJRT_Client_Devices, args->client, "client");
  args->devices = args->client->device_list;
  args->num_devices = FAULT_NUM_DEVICES;
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_AddressableDevices(
    PJRT_Client_AddressableDevices_Args* args) {
  GUARD(PJRT_Client_AddressableDevices);
  CHECK_HANDLE(PJRT_Client_AddressableDevices, args->client, "client");
  args->addressable_devices = args->client->device_list;
  args->num_addressable_devices = FAULT_NUM_DEVICES;
  return NULL;
}

static PJRT_Error* impl_PJRT_Client_AddressableMemories(
    PJRT_Client_AddressableMemories_Args* args) {
  GUARD(PJRT_Client_AddressableMemories);
  CHECK_HANDLE(PJRT_Client_AddressableMemories, args->client, "client");
  args->addressable_memories = args->client->memory_list;
  args->num_addressable_memories = FAULT_NUM_DEVICES;
  return NULL;
}

/* ---- devices and memories ---------------------------------------------- */

static PJRT_Error* impl_PJRT_DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* args) {
  GUARD(PJRT_DeviceDescription_Id);
  args->id = args->device_description->id;
  return NULL;
}

static PJRT_Error* impl_PJRT_DeviceDescription_ProcessIndex(
    PJRT_DeviceDescription_ProcessIndex_Args* args) {
  GUARD(PJRT_DeviceDescription_ProcessIndex);
  args->process_index = args->device_description->process_index;
  return NULL;
}

static PJRT_Error* impl_PJRT_DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* args) {
  GUARD(PJRT_DeviceDescription_Kind);
  args->device_kind = "fault device";
  args->device_kind_size = strlen("fault device");
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_GetDescription(PJRT_Device_GetDescription_Args* args) {
  GUARD(PJRT_Device_GetDescription);
  CHECK_HANDLE(PJRT_Device_GetDescription, args->device, "device");
  args->device_description = &args->device->description;
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_IsAddressable(PJRT_Device_IsAddressable_Args* args) {
  GUARD(PJRT_Device_IsAddressable);
  CHECK_HANDLE(PJRT_Device_IsAddressable, args->device, "device");
  args->is_addressable = true;
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* args) {
  GUARD(PJRT_Device_LocalHardwareId);
  CHECK_HANDLE(PJRT_Device_LocalHardwareId, args->device, "device");
  /* Distinct from the id, so a test can tell which one it read. */
  args->local_hardware_id = 100 + args->device->description.id;
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_AddressableMemories(
    PJRT_Device_AddressableMemories_Args* args) {
  GUARD(PJRT_Device_AddressableMemories);
  CHECK_HANDLE(PJRT_Device_AddressableMemories, args->device, "device");
  /* One memory per device; device i's memory sits at memory_list[i]. */
  args->memories =
      &args->device->client->memory_list[args->device->description.id];
  args->num_memories = 1;
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_DefaultMemory(PJRT_Device_DefaultMemory_Args* args) {
  GUARD(PJRT_Device_DefaultMemory);
  CHECK_HANDLE(PJRT_Device_DefaultMemory, args->device, "device");
  args->memory = &args->device->memory;
  return NULL;
}

/* Counts `delta` bytes in (or out of) the device's use, raising its peak. */
static void count_bytes(PJRT_Device* device, long delta) {
  long now = __atomic_add_fetch(&device->bytes_in_use, delta, __ATOMIC_SEQ_CST);
  long peak = __atomic_load_n(&device->peak_bytes, __ATOMIC_SEQ_CST);
  while (now > peak && !__atomic_compare_exchange_n(&device->peak_bytes, &peak, now, 0,
                                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
}

static PJRT_Error* impl_PJRT_Device_MemoryStats(PJRT_Device_MemoryStats_Args* args) {
  GUARD(PJRT_Device_MemoryStats);
  CHECK_HANDLE(PJRT_Device_MemoryStats, args->device, "device");
  PJRT_Device* device = args->device;
  long in_use = __atomic_load_n(&device->bytes_in_use, __ATOMIC_SEQ_CST);
  long peak = __atomic_load_n(&device->peak_bytes, __ATOMIC_SEQ_CST);
  args->bytes_in_use = in_use;
  args->peak_bytes_in_use = peak;
  args->peak_bytes_in_use_is_set = true;
  args->bytes_limit = 1L << 30;
  args->bytes_limit_is_set = true;
  size_t end = offsetof(PJRT_Device_MemoryStats_Args, peak_allocated_bytes_is_set) +
               sizeof(args->peak_allocated_bytes_is_set);
  if (args->struct_size >= end) { /* see the top */
    args->peak_allocated_bytes = peak;
    args->peak_allocated_bytes_is_set = true;
  }
  return NULL;
}

static PJRT_Error* impl_PJRT_Device_ClearMemoryStats(PJRT_Device_ClearMemoryStats_Args* args) {
  GUARD(PJRT_Device_ClearMemoryStats);
  CHECK_HANDLE(PJRT_Device_ClearMemoryStats, args->device, "device");
  PJRT_Device* device = args->device;
  __atomic_store_n(&device->peak_bytes, __atomic_load_n(&device->bytes_in_use, __ATOMIC_SEQ_CST),
                   __ATOMIC_SEQ_CST);
  return NULL;
}

static PJRT_Error* impl_PJRT_Memory_Id(PJRT_Memory_Id_Args* args) {
  GUARD(PJRT_Memory_Id);
  CHECK_HANDLE(PJRT_Memory_Id, args->memory, "memory");
  args->id = args->memory->id;
  return NULL;
}

static PJRT_Error* impl_PJRT_Memory_Kind(PJRT_Memory_Kind_Args* args) {
  GUARD(PJRT_Memory_Kind);
  CHECK_HANDLE(PJRT_Memory_Kind, args->memory, "memory");
  args->kind = "device";
  args->kind_size = strlen("device");
  return NULL;
}

static PJRT_Error* impl_PJRT_Memory_AddressableByDevices(
    PJRT_Memory_AddressableByDevices_Args* args) {
  GUARD(PJRT_Memory_AddressableByDevices);
  CHECK_HANDLE(PJRT_Memory_AddressableByDevices, args->memory, "memory");
  PJRT_Device* device = args->memory->device;
  args->devices = &device->client->device_list[device->description.id];
  args->num_devices = 1;
  return NULL;
}

/* ---- buffers ------------------------------------------------------------ */

/* Bytes per element, or 0 for a type this plugin does not hold. */
static size_t element_size(PJRT_Buffer_Type type) {
  switch (type) {
    case PJRT_Buffer_Type_PRED:
    case PJRT_Buffer_Type_S8:
    case PJRT_Buffer_Type_U8:
      return 1;
    case PJRT_Buffer_Type_S16:
    case PJRT_Buffer_Type_U16:
    case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32:
    case PJRT_Buffer_Type_U32:
    case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64:
    case PJRT_Buffer_Type_U64:
    case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default:
      return 0;
  }
}

static PJRT_Error* impl_PJRT_Client_BufferFromHostBuffer(
    PJRT_Client_BufferFromHostBuffer_Args* args) {
  GUARD(PJRT_Client_BufferFromHostBuffer);
  CHECK_HANDLE(PJRT_Client_BufferFromHostBuffer, args->client, "client");
  PJRT_Device* device = args->device;
  if (args->memory != NULL) {
    CHECK_HANDLE(PJRT_Client_BufferFromHostBuffer, args->memory, "memory");
    device = args->memory->device;
  }
  CHECK_HANDLE(PJRT_Client_BufferFromHostBuffer, device, "device");
  if (device->client != args->client) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "device %d belongs to another client", device->description.id);
  }
  if (args->num_byte_strides != 0) {
    return make_error(PJRT_Error_Code_UNIMPLEMENTED, "byte strides are not supported");
  }
  size_t size = element_size(args->type);
  if (size == 0) {
    return make_error(PJRT_Error_Code_UNIMPLEMENTED, "buffer type %d is not supported",
                      (int)args->type);
  }
  for (size_t i = 0; i < args->num_dims; ++i) size *= (size_t)args->dims[i];
  PJRT_Buffer* buffer = calloc(1, sizeof(*buffer));
  if (buffer == NULL) abort();
  buffer->data = malloc(size ? size : 1);
  if (buffer->data == NULL) abort();
  memcpy(buffer->data, args->data, size);
  buffer->magic = MAGIC_LIVE;
  buffer->client = args->client;
  buffer->device = device;
  buffer->size = size;
  args->client->live_buffers++;
  count_bytes(device, (long)size);
  /* The copy is done before we return, whatever the semantics asked. */
  args->done_with_host_buffer = NULL;
  args->buffer = buffer;
  bump(&g_buffers_created);
  return NULL;
}

static PJRT_Error* impl_PJRT_Buffer_Destroy(PJRT_Buffer_Destroy_Args* args) {
  GUARD(PJRT_Buffer_Destroy);
  CHECK_HANDLE(PJRT_Buffer_Destroy, args->buffer, "buffer");
  PJRT_Buffer* buffer = args->buffer;
  if (buffer->client->magic != MAGIC_LIVE) {
    misuse("PJRT_Buffer_Destroy after its client was destroyed");
  }
  buffer->client->live_buffers--;
  count_bytes(buffer->device, -(long)buffer->size);
  free(buffer->data);
  buffer->data = NULL;
  buffer->magic = MAGIC_DEAD;
  bump(&g_buffers_destroyed);
  return NULL;
}

static PJRT_Error* impl_PJRT_Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  GUARD(PJRT_Buffer_ToHostBuffer);
  CHECK_HANDLE(PJRT_Buffer_ToHostBuffer, args->src, "buffer");
  PJRT_Buffer* buffer = args->src;
  args->event = NULL;
  if (args->dst == NULL) { /* a size query */
    args->dst_size = buffer->size;
    return NULL;
  }
  if (args->dst_size < buffer->size) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "destination holds %zu bytes, the buffer %zu", args->dst_size,
                      buffer->size);
  }
  memcpy(args->dst, buffer->data, buffer->size);
  return NULL;
}

static PJRT_Error* impl_PJRT_Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args) {
  GUARD(PJRT_Buffer_ReadyEvent);
  CHECK_HANDLE(PJRT_Buffer_ReadyEvent, args->buffer, "buffer");
  args->event = make_event();
  return NULL;
}

static PJRT_Error* impl_PJRT_Buffer_Memory(PJRT_Buffer_Memory_Args* args) {
  GUARD(PJRT_Buffer_Memory);
  CHECK_HANDLE(PJRT_Buffer_Memory, args->buffer, "buffer");
  args->memory = &args->buffer->device->memory;
  return NULL;
}

/* ---- table assembly ----------------------------------------------------- */

/* The entries this plugin fills in; also the names fault_table_offset and
 * fault_unset understand. */
#define FAULT_ENTRIES(X)                  \
  X(PJRT_Error_Destroy)                   \
  X(PJRT_Error_Message)                   \
  X(PJRT_Error_GetCode)                   \
  X(PJRT_Plugin_Initialize)               \
  X(PJRT_Plugin_Attributes)               \
  X(PJRT_Event_Destroy)                   \
  X(PJRT_Event_IsReady)                   \
  X(PJRT_Event_Await)                     \
  X(PJRT_Client_Create)                   \
  X(PJRT_Client_Destroy)                  \
  X(PJRT_Client_PlatformName)             \
  X(PJRT_Client_ProcessIndex)             \
  X(PJRT_Client_PlatformVersion)          \
  X(PJRT_Client_Devices)                  \
  X(PJRT_Client_AddressableDevices)       \
  X(PJRT_Client_AddressableMemories)      \
  X(PJRT_Client_BufferFromHostBuffer)     \
  X(PJRT_DeviceDescription_Id)            \
  X(PJRT_DeviceDescription_ProcessIndex)  \
  X(PJRT_DeviceDescription_Kind)          \
  X(PJRT_Device_GetDescription)           \
  X(PJRT_Device_IsAddressable)            \
  X(PJRT_Device_LocalHardwareId)          \
  X(PJRT_Device_AddressableMemories)      \
  X(PJRT_Device_DefaultMemory)            \
  X(PJRT_Device_MemoryStats)              \
  X(PJRT_Device_ClearMemoryStats)         \
  X(PJRT_Memory_Id)                       \
  X(PJRT_Memory_Kind)                     \
  X(PJRT_Memory_AddressableByDevices)     \
  X(PJRT_Buffer_Destroy)                  \
  X(PJRT_Buffer_Memory)                   \
  X(PJRT_Buffer_ToHostBuffer)             \
  X(PJRT_Buffer_ReadyEvent)

/* Entries left NULL that tests still want to cut the table at. */
#define FAULT_LANDMARKS(X) \
  X(PJRT_Client_Compile)   \
  X(PJRT_Client_DefaultDeviceAssignment) \
  X(PJRT_Buffer_CopyToMemory)

/* Names of entries fault_unset asked to leave NULL (up to 8). */
static char g_unset[8][64];
static int g_num_unset;

static void fill_table(void) {
  memset(&g_table, 0, sizeof(g_table));
  g_table.api.struct_size = g_claimed_size ? g_claimed_size
                            : g_table_size ? g_table_size : sizeof(PJRT_Api);
  g_table.api.pjrt_api_version.struct_size = sizeof(PJRT_Api_Version);
  g_table.api.pjrt_api_version.major_version = g_major;
  g_table.api.pjrt_api_version.minor_version = g_minor;
  /* Each implementation is named impl_<entry>. */
#define SET_ENTRY(name) g_table.api.name = impl_##name;
  FAULT_ENTRIES(SET_ENTRY)
#undef SET_ENTRY
  for (int i = 0; i < g_num_unset; ++i) {
#define CLEAR_ENTRY(name) \
  if (strcmp(g_unset[i], #name) == 0) g_table.api.name = NULL;
    FAULT_ENTRIES(CLEAR_ENTRY)
#undef CLEAR_ENTRY
  }
}

/* ---- faults selected by the environment (see the top) ------------------- */

static const PJRT_Api* g_delegate; /* the real plugin's table, when delegating */

static void read_fault_environment(void) {
  const char* spec = getenv("PJRT_FAULT");
  g_fault[0] = g_fault_argument[0] = '\0';
  if (spec == NULL) return;
  const char* colon = strchr(spec, ':');
  size_t length = colon ? (size_t)(colon - spec) : strlen(spec);
  if (length >= sizeof(g_fault)) length = sizeof(g_fault) - 1;
  memcpy(g_fault, spec, length);
  g_fault[length] = '\0';
  if (colon) snprintf(g_fault_argument, sizeof(g_fault_argument), "%s", colon + 1);
}

static int fault_is(const char* name) { return strcmp(g_fault, name) == 0; }

/* Whether `text` (not NUL-terminated) contains the fault's argument; an empty
 * argument matches everything. */
static int argument_in(const void* text, size_t size) {
  size_t wanted = strlen(g_fault_argument);
  if (wanted == 0) return 1;
  return text != NULL && memmem(text, size, g_fault_argument, wanted) != NULL;
}

static void drop_error(PJRT_Error* error) {
  if (error == NULL) return;
  PJRT_Error_Destroy_Args args = {sizeof(args), NULL, error};
  g_delegate->PJRT_Error_Destroy(&args);
}

static PJRT_Error* fault_Client_Compile(PJRT_Client_Compile_Args* args) {
  const PJRT_Program* program = args->program;
  if (fault_is("abort_compile") &&
      argument_in(program ? program->code : NULL, program ? program->code_size : 0)) {
    fprintf(stderr, "fault plugin: aborting in PJRT_Client_Compile (PJRT_FAULT=%s)\n",
            getenv("PJRT_FAULT"));
    abort();
  }
  return g_delegate->PJRT_Client_Compile(args);
}

static PJRT_Error* fault_Executable_DeserializeAndLoad(
    PJRT_Executable_DeserializeAndLoad_Args* args) {
  if (fault_is("crash_deserialize") &&
      argument_in(args->serialized_executable, args->serialized_executable_size)) {
    fprintf(stderr, "fault plugin: SIGSEGV in PJRT_Executable_DeserializeAndLoad "
            "(PJRT_FAULT=%s)\n", getenv("PJRT_FAULT"));
    fflush(stderr);
    raise(SIGSEGV);
  }
  return g_delegate->PJRT_Executable_DeserializeAndLoad(args);
}

static PJRT_Error* fault_Client_Create(PJRT_Client_Create_Args* args) {
  if (fault_is("abort_create")) {
    fprintf(stderr, "fault plugin: aborting in PJRT_Client_Create (PJRT_FAULT=%s)\n",
            getenv("PJRT_FAULT"));
    abort();
  }
  return g_delegate->PJRT_Client_Create(args);
}

/* Whether the loaded executable's name contains the fault's argument. */
static int executable_matches(PJRT_LoadedExecutable* loaded) {
  if (g_fault_argument[0] == '\0') return 1;
  PJRT_LoadedExecutable_GetExecutable_Args get = {sizeof(get), NULL, loaded, NULL};
  PJRT_Error* error = g_delegate->PJRT_LoadedExecutable_GetExecutable(&get);
  if (error != NULL) {
    drop_error(error);
    return 0;
  }
  PJRT_Executable_Name_Args name = {sizeof(name), NULL, get.executable, NULL, 0};
  error = g_delegate->PJRT_Executable_Name(&name);
  int matches = error == NULL && argument_in(name.executable_name, name.executable_name_size);
  drop_error(error);
  PJRT_Executable_Destroy_Args destroy = {sizeof(destroy), NULL, get.executable};
  drop_error(g_delegate->PJRT_Executable_Destroy(&destroy));
  return matches;
}

/* The errors this plugin made while forwarding to a delegate (fail_execute),
 * told apart from the delegate's by the three error entries below. */
static PJRT_Error* g_own_errors[64];
static int g_num_own_errors;

static int is_own_error(const PJRT_Error* error) {
  for (int i = 0; i < g_num_own_errors; ++i) {
    if (g_own_errors[i] == error) return 1;
  }
  return 0;
}

static PJRT_Error* own_error(PJRT_Error* error) {
  if (g_num_own_errors < 64) g_own_errors[g_num_own_errors++] = error;
  return error;
}

static void forward_Error_Destroy(PJRT_Error_Destroy_Args* args) {
  if (is_own_error(args->error)) {
    impl_PJRT_Error_Destroy(args);
  } else {
    g_delegate->PJRT_Error_Destroy(args);
  }
}

static void forward_Error_Message(PJRT_Error_Message_Args* args) {
  if (is_own_error(args->error)) {
    impl_PJRT_Error_Message(args);
  } else {
    g_delegate->PJRT_Error_Message(args);
  }
}

static PJRT_Error* forward_Error_GetCode(PJRT_Error_GetCode_Args* args) {
  if (is_own_error(args->error)) return impl_PJRT_Error_GetCode(args);
  return g_delegate->PJRT_Error_GetCode(args);
}

/* Whether `loaded` has been launched before (fail_execute); remembers up to 64. */
static int launched_before(PJRT_LoadedExecutable* loaded) {
  static PJRT_LoadedExecutable* seen[64];
  static int num_seen;
  for (int i = 0; i < num_seen; ++i) {
    if (seen[i] == loaded) return 1;
  }
  if (num_seen < 64) seen[num_seen++] = loaded;
  return 0;
}

static PJRT_Error* fault_LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* args) {
  if (fault_is("fail_execute") && executable_matches(args->executable) &&
      launched_before(args->executable)) {
    return own_error(make_error(
        PJRT_Error_Code_INTERNAL,
        "fault plugin: PJRT_LoadedExecutable_Execute failed (PJRT_FAULT=%s)",
        getenv("PJRT_FAULT")));
  }
  if (fault_is("hang_execute") && executable_matches(args->executable)) {
    fprintf(stderr, "fault plugin: hanging in PJRT_LoadedExecutable_Execute (PJRT_FAULT=%s)\n",
            getenv("PJRT_FAULT"));
    for (;;) sleep(1000);
  }
  return g_delegate->PJRT_LoadedExecutable_Execute(args);
}

static PJRT_Error* fault_Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  PJRT_Error* error = g_delegate->PJRT_Buffer_ToHostBuffer(args);
  if (error != NULL || !fault_is("corrupt_to_host") || args->dst == NULL || args->dst_size == 0) {
    return error;
  }
  if (g_fault_argument[0] != '\0') {
    PJRT_Buffer_ElementType_Args type = {sizeof(type), NULL, args->src, 0};
    error = g_delegate->PJRT_Buffer_ElementType(&type);
    if (error != NULL) {
      drop_error(error);
      return NULL;
    }
    if ((int)type.type != atoi(g_fault_argument)) return NULL;
  }
  if (args->event != NULL) { /* the copy must be done before its bytes are spoilt */
    PJRT_Event_Await_Args await = {sizeof(await), NULL, args->event};
    error = g_delegate->PJRT_Event_Await(&await);
    if (error != NULL) return error;
  }
  ((unsigned char*)args->dst)[0] ^= 0xFF;
  return NULL;
}

/* The real plugin's table, with the entries a fault needs replaced; NULL (and
 * a line on stderr) when the real plugin cannot be loaded. */
static const PJRT_Api* delegating_table(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "fault plugin: PJRT_FAULT_DELEGATE: %s\n", dlerror());
    return NULL;
  }
  const PJRT_Api* (*get_api)(void) = (const PJRT_Api* (*)(void))dlsym(library, "GetPjrtApi");
  const PJRT_Api* real = get_api ? get_api() : NULL;
  if (real == NULL) {
    fprintf(stderr, "fault plugin: PJRT_FAULT_DELEGATE %s gave no PJRT_Api\n", path);
    return NULL;
  }
  g_delegate = real;
  size_t size = real->struct_size < sizeof(g_table) ? real->struct_size : sizeof(g_table);
  memset(&g_table, 0, sizeof(g_table));
  memcpy(&g_table, real, size);
#define REPLACE(entry, function)                                             \
  if (offsetof(PJRT_Api, entry) + sizeof(void*) <= size && g_table.api.entry) \
    g_table.api.entry = function;
  REPLACE(PJRT_Client_Create, fault_Client_Create)
  REPLACE(PJRT_Client_Compile, fault_Client_Compile)
  REPLACE(PJRT_Executable_DeserializeAndLoad, fault_Executable_DeserializeAndLoad)
  REPLACE(PJRT_LoadedExecutable_Execute, fault_LoadedExecutable_Execute)
  REPLACE(PJRT_Buffer_ToHostBuffer, fault_Buffer_ToHostBuffer)
  if (fault_is("fail_execute")) {
    REPLACE(PJRT_Error_Destroy, forward_Error_Destroy)
    REPLACE(PJRT_Error_Message, forward_Error_Message)
    REPLACE(PJRT_Error_GetCode, forward_Error_GetCode)
  }
#undef REPLACE
  if (fault_is("no_on_ready")) g_table.api.PJRT_Event_OnReady = NULL;
  return &g_table.api;
}

/* ---- a profiler extension (PJRT_FAULT_PROFILER) ------------------------- */

/* PJRT_FAULT_PROFILER=MODE puts a PJRT_Profiler_Extension first in the
 * extension chain (read in GetPjrtApi; with or without a delegate). Its
 * profiler records nothing real: collect hands back a fixed XSpace of one
 * plane, "/device:FAULT:0". MODE is one of
 *   record         collect hands over the profiler's own bytes, with one zero
 *                  byte past the message, as XLA's plugin profiler does;
 *   record_sized   collect answers only the size until given a buffer;
 *   fail_create, fail_start, fail_stop, fail_collect
 *                  that call returns an error (UNAVAILABLE, "fault plugin:
 *                  profiler <call> failed");
 *   garbage        collect hands over bytes that are no protobuf message;
 *   small_table    the profiler table's struct_size ends before collect_data.
 * Every profiler and error is counted, and kept after it is destroyed, so a
 * double destroy or a call on a destroyed profiler counts as misuse. */

struct PLUGIN_Profiler {
  unsigned magic;
  int running;
  int stopped;
  unsigned char buffer[64]; /* collect's own bytes (record) */
};

struct PLUGIN_Profiler_Error {
  unsigned magic;
  int code;
  char message[128];
};

static char g_profiler_mode[32];
static long g_profilers_created, g_profilers_destroyed;
static long g_profiler_errors_created, g_profiler_errors_destroyed;
static char g_profiler_options[256];
static size_t g_profiler_options_size;

/* XSpace { planes: XPlane { id: 1, name: "/device:FAULT:0" }, hostnames: "fault" } */
static const unsigned char k_fault_xspace[] = {
    0x0a, 0x13, 0x08, 0x01, 0x12, 0x0f, '/', 'd', 'e', 'v', 'i', 'c', 'e', ':',
    'F',  'A',  'U',  'L',  'T',  ':',  '0', 0x22, 0x05, 'f', 'a', 'u', 'l', 't'};

/* What XLA's profiler checks struct_size against: the end of the last field. */
#define PLUGIN_PROFILER_GETCODE_ARGS_SIZE \
  (offsetof(PLUGIN_Profiler_Error_GetCode_Args, code) + sizeof(int))

static int profiler_mode_is(const char* mode) { return strcmp(g_profiler_mode, mode) == 0; }

static PLUGIN_Profiler_Error* profiler_error(const char* call) {
  PLUGIN_Profiler_Error* error = calloc(1, sizeof(*error));
  if (error == NULL) abort();
  error->magic = MAGIC_LIVE;
  error->code = PJRT_Error_Code_UNAVAILABLE;
  snprintf(error->message, sizeof(error->message), "fault plugin: profiler %s failed", call);
  bump(&g_profiler_errors_created);
  return error;
}

static void profiler_error_destroy(PLUGIN_Profiler_Error_Destroy_Args* args) {
  if (args->error == NULL) return;
  if (args->error->magic != MAGIC_LIVE) {
    misuse("profiler error destroyed twice or never made");
    return;
  }
  args->error->magic = MAGIC_DEAD;
  bump(&g_profiler_errors_destroyed);
}

static void profiler_error_message(PLUGIN_Profiler_Error_Message_Args* args) {
  args->message = args->error->message;
  args->message_size = strlen(args->error->message);
}

static PLUGIN_Profiler_Error* profiler_error_get_code(PLUGIN_Profiler_Error_GetCode_Args* args) {
  if (args->struct_size != PLUGIN_PROFILER_GETCODE_ARGS_SIZE) {
    misuse("PLUGIN_Profiler_Error_GetCode_Args of %zu bytes", args->struct_size);
  }
  args->code = args->error->code;
  return NULL;
}

/* Whether `profiler` is one this plugin made and has not destroyed. */
static int live_profiler(const PLUGIN_Profiler* profiler, const char* call) {
  if (profiler == NULL || profiler->magic != MAGIC_LIVE) {
    misuse("profiler %s on a profiler that is not live", call);
    return 0;
  }
  return 1;
}

static PLUGIN_Profiler_Error* profiler_create(PLUGIN_Profiler_Create_Args* args) {
  if (profiler_mode_is("fail_create")) return profiler_error("create");
  g_profiler_options_size = args->options_size < sizeof(g_profiler_options)
                                ? args->options_size : sizeof(g_profiler_options);
  memcpy(g_profiler_options, args->options, g_profiler_options_size);
  PLUGIN_Profiler* profiler = calloc(1, sizeof(*profiler));
  if (profiler == NULL) abort();
  profiler->magic = MAGIC_LIVE;
  bump(&g_profilers_created);
  args->profiler = profiler;
  return NULL;
}

static PLUGIN_Profiler_Error* profiler_destroy(PLUGIN_Profiler_Destroy_Args* args) {
  if (!live_profiler(args->profiler, "destroy")) return NULL;
  args->profiler->magic = MAGIC_DEAD;
  bump(&g_profilers_destroyed);
  return NULL;
}

static PLUGIN_Profiler_Error* profiler_start(PLUGIN_Profiler_Start_Args* args) {
  if (!live_profiler(args->profiler, "start")) return profiler_error("start");
  if (profiler_mode_is("fail_start")) return profiler_error("start");
  args->profiler->running = 1;
  return NULL;
}

static PLUGIN_Profiler_Error* profiler_stop(PLUGIN_Profiler_Stop_Args* args) {
  if (!live_profiler(args->profiler, "stop")) return profiler_error("stop");
  if (profiler_mode_is("fail_stop")) return profiler_error("stop");
  args->profiler->running = 0;
  args->profiler->stopped = 1;
  return NULL;
}

static PLUGIN_Profiler_Error* profiler_collect(PLUGIN_Profiler_CollectData_Args* args) {
  PLUGIN_Profiler* profiler = args->profiler;
  if (!live_profiler(profiler, "collect")) return profiler_error("collect");
  if (profiler_mode_is("fail_collect")) return profiler_error("collect");
  if (!profiler->stopped) {
    misuse("profiler collect before stop");
    return profiler_error("collect");
  }
  const unsigned char* data = k_fault_xspace;
  size_t size = sizeof(k_fault_xspace);
  if (profiler_mode_is("garbage")) {
    static const unsigned char garbage[] = {0xff, 0xff, 0xff, 0xff};
    data = garbage;
    size = sizeof(garbage);
  }
  if (profiler_mode_is("record_sized")) {
    if (args->buffer != NULL) memcpy(args->buffer, data, size);
    args->buffer_size_in_bytes = size;
    return NULL;
  }
  memcpy(profiler->buffer, data, size); /* the rest of buffer is zero: one byte past */
  args->buffer = profiler->buffer;
  args->buffer_size_in_bytes = profiler_mode_is("record") ? size + 1 : size;
  return NULL;
}

static PLUGIN_Profiler_Api g_profiler_table;
static PJRT_Profiler_Extension g_profiler_extension;

/* `api` (this plugin's table, or NULL) with the profiler extension first in
 * its chain when PJRT_FAULT_PROFILER asks for one. */
static const PJRT_Api* with_profiler(const PJRT_Api* api) {
  const char* mode = getenv("PJRT_FAULT_PROFILER");
  snprintf(g_profiler_mode, sizeof(g_profiler_mode), "%s", mode ? mode : "");
  if (api == NULL || g_profiler_mode[0] == '\0') return api;
  g_profiler_table = (PLUGIN_Profiler_Api){
      .struct_size = profiler_mode_is("small_table")
                         ? offsetof(PLUGIN_Profiler_Api, collect_data)
                         : sizeof(PLUGIN_Profiler_Api),
      .error_destroy = profiler_error_destroy,
      .error_message = profiler_error_message,
      .error_get_code = profiler_error_get_code,
      .create = profiler_create,
      .destroy = profiler_destroy,
      .start = profiler_start,
      .stop = profiler_stop,
      .collect_data = profiler_collect,
  };
  g_profiler_extension.base.struct_size = sizeof(g_profiler_extension);
  g_profiler_extension.base.type = PJRT_Extension_Type_Profiler;
  g_profiler_extension.base.next = g_table.api.extension_start;
  g_profiler_extension.profiler_api = &g_profiler_table;
  g_table.api.extension_start = &g_profiler_extension.base;
  return api;
}

/* ---- a custom partitioner extension (PJRT_FAULT_PARTITIONER) -------------- */

/* PJRT_FAULT_PARTITIONER=MODE puts a PJRT_Custom_Partitioner_Extension first
 * in the extension chain. It records what the host registers: each target's
 * name and callback table (which the tests then call through, as a compiler
 * would), and the batch-partitionable names. MODE "refuse" answers every
 * registration with INVALID_ARGUMENT. */

#define MAX_PARTITIONERS 16
static char g_partitioner_mode[32];
static char g_partitioner_names[MAX_PARTITIONERS][128];
static JAX_CustomCallPartitioner_Callbacks* g_partitioner_callbacks[MAX_PARTITIONERS];
static int g_num_partitioners;
static char g_batch_names[MAX_PARTITIONERS][128];
static int g_num_batch_names;

static int copy_name(char* out, size_t out_size, const char* name, size_t size) {
  if (name == NULL || size == 0 || size >= out_size) return -1;
  memcpy(out, name, size);
  out[size] = '\0';
  return 0;
}

static PJRT_Error* register_partitioner(PJRT_Register_Custom_Partitioner_Args* args) {
  if (strcmp(g_partitioner_mode, "refuse") == 0) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "fault plugin: custom partitioners are refused");
  }
  if (args->struct_size < sizeof(*args) || args->callbacks == NULL ||
      g_num_partitioners == MAX_PARTITIONERS ||
      copy_name(g_partitioner_names[g_num_partitioners], sizeof(g_partitioner_names[0]),
                args->name, args->name_size) != 0) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "fault plugin: a custom partitioner needs a name and callbacks");
  }
  g_partitioner_callbacks[g_num_partitioners++] = args->callbacks;
  return NULL;
}

static PJRT_Error* register_batch_partitionable(PJRT_Register_Batch_Partitionable_Args* args) {
  if (strcmp(g_partitioner_mode, "refuse") == 0) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "fault plugin: batch partitionable targets are refused");
  }
  if (g_num_batch_names == MAX_PARTITIONERS ||
      copy_name(g_batch_names[g_num_batch_names], sizeof(g_batch_names[0]), args->name,
                args->name_size) != 0) {
    return make_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "fault plugin: a batch partitionable target needs a name");
  }
  g_num_batch_names++;
  return NULL;
}

static PJRT_Custom_Partitioner_Extension g_partitioner_extension;

/* `api` with the custom partitioner extension first in its chain when
 * PJRT_FAULT_PARTITIONER asks for one. */
static const PJRT_Api* with_partitioner(const PJRT_Api* api) {
  const char* mode = getenv("PJRT_FAULT_PARTITIONER");
  snprintf(g_partitioner_mode, sizeof(g_partitioner_mode), "%s", mode ? mode : "");
  if (api == NULL || g_partitioner_mode[0] == '\0') return api;
  g_partitioner_extension.struct_size = sizeof(g_partitioner_extension);
  g_partitioner_extension.type = PJRT_Extension_Type_Custom_Partitioner;
  g_partitioner_extension.next = g_table.api.extension_start;
  g_partitioner_extension.register_custom_partitioner = register_partitioner;
  g_partitioner_extension.register_batch_partitionable = register_batch_partitionable;
  g_table.api.extension_start = (PJRT_Extension_Base*)&g_partitioner_extension;
  return api;
}

/* ---- exported interface -------------------------------------------------- */

FAULT_EXPORT const PJRT_Api* GetPjrtApi(void) {
  read_fault_environment();
  if (g_mode == FAULT_MODE_NULL_API || fault_is("null_api")) return NULL;
  const char* delegate = getenv("PJRT_FAULT_DELEGATE");
  if (delegate != NULL && delegate[0] != '\0') {
    return with_partitioner(with_profiler(delegating_table(delegate)));
  }
  fill_attributes();
  fill_table();
  return with_partitioner(with_profiler(&g_table.api));
}

/* Sets what GetPjrtApi reports: the API version, the table size in bytes
 * (0 for our header's full table; at most the table plus 16 spare entries),
 * and the mode (FAULT_MODE_*). Call before the host loads the plugin. */
FAULT_EXPORT void fault_configure(int major, int minor, size_t table_size_bytes,
                                  int mode) {
  g_major = major;
  g_minor = minor;
  g_table_size = table_size_bytes > sizeof(g_table) ? sizeof(g_table) : table_size_bytes;
  g_mode = mode;
}

/* Publishes `bytes` as the table's struct_size, however much memory is really
 * behind it (fault_configure keeps the size within the table): a corrupt table
 * that the host must refuse before reading entries past its end. */
FAULT_EXPORT void fault_claim_struct_size(size_t bytes) { g_claimed_size = bytes; }

/* The error code and message a failing Initialize or Client_Create returns. */
FAULT_EXPORT void fault_set_failure(int code, const char* message) {
  g_failure_code = code;
  snprintf(g_failure_message, sizeof(g_failure_message), "%s", message);
}

/* Leaves the entry `name` (e.g. "PJRT_Client_BufferFromHostBuffer") NULL in
 * the table. Returns 0, or -1 for a name this plugin does not fill in. */
FAULT_EXPORT int fault_unset(const char* name) {
  int known = 0;
#define IS_KNOWN(entry) known |= strcmp(name, #entry) == 0;
  FAULT_ENTRIES(IS_KNOWN)
#undef IS_KNOWN
  if (!known || g_num_unset == 8) return -1;
  snprintf(g_unset[g_num_unset++], sizeof(g_unset[0]), "%s", name);
  return 0;
}

/* Byte offset of a table entry, for choosing where to cut the table; -1 for
 * a name this file does not list. */
FAULT_EXPORT long fault_table_offset(const char* name) {
#define OFFSET_OF(entry) \
  if (strcmp(name, #entry) == 0) return (long)offsetof(PJRT_Api, entry);
  FAULT_ENTRIES(OFFSET_OF)
  FAULT_LANDMARKS(OFFSET_OF)
#undef OFFSET_OF
  return -1;
}

/* sizeof(PJRT_Api) as our header defines it: the full table. */
FAULT_EXPORT long fault_full_table_size(void) { return (long)sizeof(PJRT_Api); }

FAULT_EXPORT long fault_errors_created(void) { return read_counter(&g_errors_created); }
FAULT_EXPORT long fault_errors_destroyed(void) { return read_counter(&g_errors_destroyed); }
FAULT_EXPORT long fault_clients_created(void) { return read_counter(&g_clients_created); }
FAULT_EXPORT long fault_clients_destroyed(void) { return read_counter(&g_clients_destroyed); }
FAULT_EXPORT long fault_buffers_created(void) { return read_counter(&g_buffers_created); }
FAULT_EXPORT long fault_buffers_destroyed(void) { return read_counter(&g_buffers_destroyed); }
FAULT_EXPORT long fault_events_created(void) { return read_counter(&g_events_created); }
FAULT_EXPORT long fault_events_destroyed(void) { return read_counter(&g_events_destroyed); }
FAULT_EXPORT long fault_initialize_calls(void) { return read_counter(&g_initialize_calls); }
FAULT_EXPORT long fault_client_create_calls(void) { return read_counter(&g_client_create_calls); }

/* How many protocol violations the host committed (double destroy, use of a
 * destroyed handle, a call past the table end, a client destroyed before its
 * buffers), and a description of the latest. */
FAULT_EXPORT long fault_misuse_count(void) { return read_counter(&g_misuse); }
/* The profiler extension's counts: profilers created and destroyed, errors
 * created and destroyed (PJRT_FAULT_PROFILER). */
FAULT_EXPORT void fault_profiler_counts(long counts[4]) {
  counts[0] = read_counter(&g_profilers_created);
  counts[1] = read_counter(&g_profilers_destroyed);
  counts[2] = read_counter(&g_profiler_errors_created);
  counts[3] = read_counter(&g_profiler_errors_destroyed);
}
/* The options the last profiler was created with, and their size. */
FAULT_EXPORT const char* fault_profiler_options(size_t* size) {
  *size = g_profiler_options_size;
  return g_profiler_options;
}
FAULT_EXPORT const char* fault_last_misuse(void) { return g_last_misuse; }

/* The options the last PJRT_Client_Create received, "name=type:value;...". */
FAULT_EXPORT const char* fault_last_create_options(void) { return g_last_options; }

/* The custom partitioners registered (PJRT_FAULT_PARTITIONER): how many, and
 * the name and callback table of the i-th (NULL past the end). */
FAULT_EXPORT int fault_partitioner_count(void) { return g_num_partitioners; }
FAULT_EXPORT const char* fault_partitioner_name(int i) {
  return i >= 0 && i < g_num_partitioners ? g_partitioner_names[i] : NULL;
}
FAULT_EXPORT void* fault_partitioner_callbacks(int i) {
  return i >= 0 && i < g_num_partitioners ? (void*)g_partitioner_callbacks[i] : NULL;
}
/* The targets registered as batch partitionable: how many, and the i-th. */
FAULT_EXPORT int fault_batch_partitionable_count(void) { return g_num_batch_names; }
FAULT_EXPORT const char* fault_batch_partitionable_name(int i) {
  return i >= 0 && i < g_num_batch_names ? g_batch_names[i] : NULL;
}

/* ---- calling the registered callbacks, as a compiler would ---------------- */

static char g_partitioner_error[512];

/* The message of the last callback error fault_partitioner_infer or
 * fault_partitioner_propagate met. */
FAULT_EXPORT const char* fault_partitioner_error(void) { return g_partitioner_error; }

/* Copies `value` into out (room for out_size bytes) and returns its size, or
 * -1 when it does not fit. */
static long copy_out(JAX_CustomCallPartitioner_string value, char* out, size_t out_size) {
  if (value.size > out_size) return -1;
  if (value.size > 0) memcpy(out, value.data, value.size);
  return (long)value.size;
}

/* Ends a callback's answer: its error as -2 - code (the message kept), and the
 * host's results released through its cleanup_fn. */
static long finish_call(JAX_CustomCallPartitioner_version_and_error* header, long result) {
  if (header->has_error) {
    snprintf(g_partitioner_error, sizeof(g_partitioner_error), "%.*s",
             (int)header->error_msg.size, header->error_msg.data);
    result = -2 - (long)header->code;
  }
  if (header->cleanup_fn != NULL) header->cleanup_fn(header->data);
  return result;
}

/* Calls the i-th partitioner's infer_sharding for one operand of shape
 * `shape` (a ShapeProto; its sharding an OpSharding, or none when
 * sharding_size is 0) whose result has the same shape, with backend config
 * `config`. Returns the inferred sharding's size (copied into out), 0 when
 * the callback inferred none, -1 for a bad index or too small an out, or
 * -2 - code for the callback's error. */
FAULT_EXPORT long fault_partitioner_infer(int i, const char* shape, size_t shape_size,
                                          const char* sharding, size_t sharding_size,
                                          const char* config, size_t config_size, char* out,
                                          size_t out_size) {
  if (i < 0 || i >= g_num_partitioners) return -1;
  JAX_CustomCallPartitioner_Callbacks* callbacks = g_partitioner_callbacks[i];
  JAX_CustomCallPartitioner_aval operand;
  memset(&operand, 0, sizeof(operand));
  operand.shape.data = shape;
  operand.shape.size = shape_size;
  operand.has_sharding = sharding_size > 0;
  operand.sharding.data = sharding;
  operand.sharding.size = sharding_size;
  JAX_CustomCallPartitioner_InferShardingFromOperands_Args args;
  memset(&args, 0, sizeof(args));
  args.header.api_version = 0;
  args.num_args = 1;
  args.op_args = &operand;
  args.result_shape = operand.shape;
  args.backend_config.data = config;
  args.backend_config.size = config_size;
  callbacks->infer_sharding(callbacks, &args);
  long result = 0;
  if (!args.header.has_error && args.has_result_sharding) {
    result = copy_out(args.result_sharding, out, out_size);
  }
  return finish_call(&args.header, result);
}

/* Calls the i-th partitioner's propagate_user_sharding with a user's
 * `sharding` of a result of shape `shape`. Returns the size of the sharding
 * the callback answered (copied into out), -1 for a bad index or too small an
 * out, or -2 - code for the callback's error. */
FAULT_EXPORT long fault_partitioner_propagate(int i, const char* shape, size_t shape_size,
                                              const char* sharding, size_t sharding_size,
                                              char* out, size_t out_size) {
  if (i < 0 || i >= g_num_partitioners) return -1;
  JAX_CustomCallPartitioner_Callbacks* callbacks = g_partitioner_callbacks[i];
  JAX_CustomCallPartitioner_PropagateUserSharding_Args args;
  memset(&args, 0, sizeof(args));
  args.result_shape.data = shape;
  args.result_shape.size = shape_size;
  args.result_sharding.data = sharding;
  args.result_sharding.size = sharding_size;
  callbacks->propagate_user_sharding(callbacks, &args);
  long result = args.header.has_error ? 0 : copy_out(args.result_sharding, out, out_size);
  return finish_call(&args.header, result);
}

/* Drops the i-th partitioner as a compiler does when it is done with it: its
 * dtor. Returns 0, or -1 for a bad index. */
FAULT_EXPORT int fault_partitioner_destroy(int i) {
  if (i < 0 || i >= g_num_partitioners || g_partitioner_callbacks[i] == NULL) return -1;
  JAX_CustomCallPartitioner_Callbacks* callbacks = g_partitioner_callbacks[i];
  g_partitioner_callbacks[i] = NULL;
  callbacks->dtor(callbacks);
  return 0;
}
