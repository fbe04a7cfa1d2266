/* C helpers for the key-value callbacks a multi-process client hands its plugin
 * (see pjrt/_distributed/kv_callbacks.py). The callbacks themselves are Python functions
 * (cffi `extern "Python"`, declared in kv_python.cdef); what must not run in
 * Python lives here: a value handed to the plugin is malloc'd memory that the
 * plugin frees through pjrt_kv_value_free, from any thread, at any time, even
 * while the interpreter holds no lock for it.
 *
 * This file is read twice: by the C compiler, and by the build script as part
 * of the cffi declarations, so it holds plain declarations only.
 */

/* A malloc'd copy of `size` bytes at `data` (size 0 gives a 1-byte block);
 * NULL when out of memory. */
char* pjrt_kv_value_copy(const char* data, size_t size);

/* Frees a value made by pjrt_kv_value_copy; the plugin calls it as the
 * value's deleter. */
void pjrt_kv_value_free(char* value);

/* Builds the plugin's error through the `callback_error` the plugin put in the
 * callback's arguments; NULL when the plugin gave none. */
PJRT_Error* pjrt_kv_error(PJRT_CallbackError* callback_error,
                          PJRT_Error_Code code, const char* message,
                          size_t message_size);
