/* C helpers for the key-value callbacks; see kv.h. */
#include <stdlib.h>
#include <string.h>

char* pjrt_kv_value_copy(const char* data, size_t size) {
  char* copy = malloc(size ? size : 1);
  if (copy != NULL && size) memcpy(copy, data, size);
  return copy;
}

void pjrt_kv_value_free(char* value) { free(value); }

PJRT_Error* pjrt_kv_error(PJRT_CallbackError* callback_error,
                          PJRT_Error_Code code, const char* message,
                          size_t message_size) {
  if (callback_error == NULL || *callback_error == NULL) return NULL;
  return (*callback_error)(code, message, message_size);
}
