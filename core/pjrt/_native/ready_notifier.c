/* Implementation of ready_notifier.h. Compiled in the same unit as shim.c,
 * after it: SHIM_ARGS, shim_drop_error and shim_await_and_destroy come from
 * there. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

typedef struct ready_watch ready_watch;

struct ready_watch {
  const PJRT_Api* api;
  pjrt_ready_notifier* notifier;
  uint64_t token;
  PJRT_Error* error;
  ready_watch* next;
};

struct pjrt_ready_notifier {
  pthread_mutex_t mutex;
  int read_fd;
  int write_fd; /* the same descriptor as read_fd for an eventfd */
  int references; /* the owner's, and one per wait not yet freed */
  int released; /* the owner has let go: nobody takes fired waits any more */
  ready_watch* fired_head;
  ready_watch* fired_tail;
};

static void notifier_signal(pjrt_ready_notifier* notifier) {
  /* Non-blocking: a full pipe or a large eventfd count is already readable. */
  uint64_t one = 1;
  ssize_t written = write(notifier->write_fd, &one, notifier->read_fd == notifier->write_fd
                                                        ? sizeof(one) : 1);
  (void)written;
}

static void notifier_drain(pjrt_ready_notifier* notifier) {
  char scratch[64];
  while (read(notifier->read_fd, scratch, sizeof(scratch)) > 0) {
    if (notifier->read_fd == notifier->write_fd) break; /* an eventfd reads as one count */
  }
}

static void notifier_free(pjrt_ready_notifier* notifier) {
  close(notifier->read_fd);
  if (notifier->write_fd != notifier->read_fd) close(notifier->write_fd);
  pthread_mutex_destroy(&notifier->mutex);
  free(notifier);
}

/* Drops one reference; frees the notifier when it was the last. */
static void notifier_unref(pjrt_ready_notifier* notifier) {
  pthread_mutex_lock(&notifier->mutex);
  int last = --notifier->references == 0;
  pthread_mutex_unlock(&notifier->mutex);
  if (last) notifier_free(notifier);
}

pjrt_ready_notifier* pjrt_ready_notifier_new(void) {
  pjrt_ready_notifier* notifier = calloc(1, sizeof(*notifier));
  if (notifier == NULL) {
    errno = ENOMEM;
    return NULL;
  }
#if defined(__linux__)
  notifier->read_fd = notifier->write_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (notifier->read_fd < 0) {
    int saved = errno;
    free(notifier);
    errno = saved;
    return NULL;
  }
#else
  int fds[2];
  if (pipe(fds) != 0) {
    int saved = errno;
    free(notifier);
    errno = saved;
    return NULL;
  }
  for (int i = 0; i < 2; ++i) {
    fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
    fcntl(fds[i], F_SETFD, fcntl(fds[i], F_GETFD) | FD_CLOEXEC);
  }
  notifier->read_fd = fds[0];
  notifier->write_fd = fds[1];
#endif
  pthread_mutex_init(&notifier->mutex, NULL);
  notifier->references = 1;
  return notifier;
}

int pjrt_ready_notifier_fd(const pjrt_ready_notifier* notifier) {
  return notifier->read_fd;
}

/* The plugin's OnReady callback: any thread, any time. No Python here. */
static void ready_watch_fired(PJRT_Error* error, void* user_arg) {
  ready_watch* watch = (ready_watch*)user_arg;
  pjrt_ready_notifier* notifier = watch->notifier;
  watch->error = error;
  watch->next = NULL;
  pthread_mutex_lock(&notifier->mutex);
  if (!notifier->released) {
    int was_empty = notifier->fired_head == NULL;
    if (was_empty) {
      notifier->fired_head = watch;
    } else {
      notifier->fired_tail->next = watch;
    }
    notifier->fired_tail = watch;
    if (was_empty) notifier_signal(notifier);
    pthread_mutex_unlock(&notifier->mutex);
    return;
  }
  pthread_mutex_unlock(&notifier->mutex);
  /* Nobody will take it: free it here, with its reference. */
  shim_drop_error(watch->api, error);
  free(watch);
  notifier_unref(notifier);
}

int pjrt_ready_notifier_watch(const PJRT_Api* api, PJRT_Buffer* buffer,
                              pjrt_ready_notifier* notifier, uint64_t token,
                              PJRT_Error** error_out) {
  PJRT_Event* pending;
  if (shim_buffer_ready_now(api, buffer, &pending, error_out)) return 1;
  if (notifier == NULL) {
    pjrt_shim_event_destroy(api, pending);
    return 2;
  }
  ready_watch* watch = calloc(1, sizeof(*watch));
  if (watch == NULL) {
    pjrt_shim_event_destroy(api, pending);
    return -1;
  }
  watch->api = api;
  watch->notifier = notifier;
  watch->token = token;
  pthread_mutex_lock(&notifier->mutex);
  notifier->references++; /* the callback's, taken before it can run */
  pthread_mutex_unlock(&notifier->mutex);
  SHIM_ARGS(PJRT_Event_OnReady_Args, on_ready, user_arg);
  on_ready.event = pending;
  on_ready.callback = ready_watch_fired;
  on_ready.user_arg = watch;
  PJRT_Error* error = api->PJRT_Event_OnReady(&on_ready);
  /* The event is no longer needed: the callback stays registered without it. */
  pjrt_shim_event_destroy(api, pending);
  if (error != NULL) {
    /* No callback will come. */
    free(watch);
    notifier_unref(notifier);
    *error_out = error;
    return 1;
  }
  return 0;
}

size_t pjrt_ready_notifier_take(pjrt_ready_notifier* notifier, uint64_t* tokens,
                                PJRT_Error** errors, size_t capacity) {
  size_t count = 0;
  ready_watch* taken = NULL;
  pthread_mutex_lock(&notifier->mutex);
  notifier_drain(notifier);
  while (notifier->fired_head != NULL && count < capacity) {
    ready_watch* watch = notifier->fired_head;
    notifier->fired_head = watch->next;
    tokens[count] = watch->token;
    errors[count] = watch->error;
    ++count;
    --notifier->references; /* never the last: the owner holds one */
    watch->next = taken;
    taken = watch;
  }
  if (notifier->fired_head == NULL) {
    notifier->fired_tail = NULL;
  } else {
    notifier_signal(notifier); /* come back for the rest */
  }
  pthread_mutex_unlock(&notifier->mutex);
  while (taken != NULL) {
    ready_watch* next = taken->next;
    free(taken);
    taken = next;
  }
  return count;
}

void pjrt_ready_notifier_release(pjrt_ready_notifier* notifier) {
  pthread_mutex_lock(&notifier->mutex);
  notifier->released = 1;
  ready_watch* fired = notifier->fired_head;
  notifier->fired_head = notifier->fired_tail = NULL;
  pthread_mutex_unlock(&notifier->mutex);
  while (fired != NULL) {
    ready_watch* next = fired->next;
    shim_drop_error(fired->api, fired->error);
    free(fired);
    notifier_unref(notifier); /* never the last: the owner's is dropped below */
    fired = next;
  }
  notifier_unref(notifier);
}
