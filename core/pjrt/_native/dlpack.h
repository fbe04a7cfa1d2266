/* DLPack: the C structs of the array interchange protocol, and the helpers
 * that let pjrt arrays travel in its capsules both ways.
 *
 * The structs follow the DLPack specification (dlpack.h, version 1.1 of the
 * ABI); the declarations here are written from its field list. They are plain
 * C so that this file serves both the C compiler and the cffi declarations
 * (see _build_cffi.py), which is also why the helpers take a Python object as
 * the integer address CPython gives it (`id()`), and a capsule as `void*`.
 */

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/* Device types (a subset: the ones pjrt's plugins can hold). */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

/* Type codes; `bits` and `lanes` of DLDataType complete the type. */
typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e3m4 = 7,
  kDLFloat8_e4m3 = 8,
  kDLFloat8_e4m3b11fnuz = 9,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14,
  kDLFloat6_e2m3fn = 15,
  kDLFloat6_e3m2fn = 16,
  kDLFloat4_e2m1fn = 17
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;    /* in elements; NULL means compact row-major */
  uint64_t byte_offset;
} DLTensor;

/* The legacy capsule payload ("dltensor"). */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

/* The versioned capsule payload ("dltensor_versioned", DLPack >= 1.0). */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* Bits of DLManagedTensorVersioned.flags. */
#define PJRT_DLPACK_FLAG_READ_ONLY 1
#define PJRT_DLPACK_FLAG_IS_COPIED 2

/* The DLPack version pjrt's versioned capsules carry. */
#define PJRT_DLPACK_MAJOR 1
#define PJRT_DLPACK_MINOR 1

/* Export: a new managed tensor over `data` whose manager keeps the Python
 * object at address `owner` alive (a new strong reference, dropped by the
 * tensor's deleter, which takes the GIL). `strides` may be NULL. Returns a
 * DLManagedTensorVersioned* when `versioned`, else a DLManagedTensor*; NULL
 * when out of memory. */
void* pjrt_dlpack_export(uintptr_t owner, void* data, int32_t device_type,
                         int32_t device_id, uint8_t code, uint8_t bits,
                         int32_t ndim, const int64_t* shape,
                         const int64_t* strides, uint64_t flags,
                         int versioned);

/* Frees a managed tensor made by pjrt_dlpack_export that was never handed
 * to a capsule (e.g. when making the capsule failed). */
void pjrt_dlpack_export_abandon(void* managed, int versioned);

/* The capsule names (static strings): 0 legacy, 1 versioned, 2 legacy used,
 * 3 versioned used. */
const char* pjrt_dlpack_capsule_name(int which);

/* PyCapsule destructor for exported capsules: deletes the managed tensor
 * unless a consumer renamed the capsule (taking ownership). Its real
 * parameter is a PyObject*. */
void pjrt_dlpack_capsule_destructor(void* capsule);

/* Import: the deleter to pass as PJRT_Client_CreateViewOfDeviceBuffer's
 * on_delete_callback, with the consumed managed tensor as its argument; it
 * runs the producer's deleter (taking the GIL) once the plugin lets go. */
void pjrt_dlpack_release_versioned(void* device_buffer_ptr, void* managed);
void pjrt_dlpack_release_legacy(void* device_buffer_ptr, void* managed);

/* Whether the `size` bytes at `address` can be read without a fault (1), or
 * not (0): checked by handing them to write() on a pipe, which the kernel
 * answers with EFAULT instead of a signal. Lets a DLPack consumer refuse a
 * tensor whose pointers lead nowhere. -1 when no pipe could be made. */
int pjrt_dlpack_readable(uintptr_t address, size_t size);
