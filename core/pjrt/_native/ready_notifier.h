/* Telling an event loop that buffers became ready (see ready_notifier.c and
 * pjrt/_capi/ready_events.py, which makes `await array` work).
 *
 * A notifier is a file descriptor the loop watches and a list of the waits
 * whose events have fired. The plugin's OnReady callback, which may run on any
 * plugin thread at any time (after the loop has closed, during the
 * interpreter's exit), only appends its wait to the list and makes the
 * descriptor readable: it never calls into Python. The loop then takes the
 * fired waits (token and error) and resolves its futures.
 *
 * The notifier is reference-counted: its owner (the loop's side) holds one
 * reference and each wait still pending holds one, so the owner can let go at
 * any time; whichever lets go last frees it. Each buffer's ready event is
 * destroyed exactly once, when the wait is set up (the callback outlives it). */

typedef struct pjrt_ready_notifier pjrt_ready_notifier;

/* A new notifier with its descriptor (an eventfd on Linux, else a pipe), or
 * NULL with errno set. */
pjrt_ready_notifier* pjrt_ready_notifier_new(void);

/* The descriptor to watch for reading; valid until the notifier is freed. */
int pjrt_ready_notifier_fd(const pjrt_ready_notifier* notifier);

/* Asks whether `buffer` is ready and, when it is not and `notifier` is not
 * NULL, has the notifier told (with `token`) once it is. Returns
 *   1  done: the buffer is ready, or the plugin refused (*error_out holds the
 *      computation's error or the refusal, owned by the caller; NULL when none);
 *   0  watched: the notifier will hand back `token` with the buffer's error;
 *   2  not ready, and `notifier` is NULL: nothing is kept;
 *  -1  out of host memory.
 * The plugin must have PJRT_Event_OnReady (the caller checks). */
int pjrt_ready_notifier_watch(const PJRT_Api* api, PJRT_Buffer* buffer,
                              pjrt_ready_notifier* notifier, uint64_t token,
                              PJRT_Error** error_out);

/* Takes up to `capacity` fired waits: their tokens and errors (owned by the
 * caller, NULL for none) in `tokens` and `errors`; returns how many. Empties
 * the descriptor first, and makes it readable again if fired waits are left. */
size_t pjrt_ready_notifier_take(pjrt_ready_notifier* notifier, uint64_t* tokens,
                                PJRT_Error** errors, size_t capacity);

/* Drops the owner's reference: fired waits not taken are freed with their
 * errors, and waits still pending free themselves when their events fire. */
void pjrt_ready_notifier_release(pjrt_ready_notifier* notifier);
