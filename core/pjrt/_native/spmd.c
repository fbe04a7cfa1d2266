/* Implementation of spmd.h: one wait for all the shards of a global array.
 *
 * Each shard's ready event that has not fired yet is given an OnReady
 * callback that counts down the group's pending events; the waiting thread
 * sleeps on one condition variable until the count reaches zero, so an array
 * of N shards costs at most one wake-up instead of one per shard. The group
 * is reference counted (the caller's reference and one per pending callback),
 * so a caller that gives up after a slice (Ctrl-C) leaves it to the last
 * callback to free. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPMD_ARGS(type, name, last_field)                                  \
  type name;                                                               \
  memset(&name, 0, sizeof(name));                                          \
  name.struct_size = offsetof(type, last_field) + sizeof(name.last_field)

struct pjrt_spmd_slot {
  struct pjrt_spmd_group* group;
  size_t index;
};

struct pjrt_spmd_group {
  pthread_mutex_t mutex;
  pthread_cond_t done_cond;
  const PJRT_Api* api;
  PJRT_Error* error;  /* of the failed buffer with the lowest index so far */
  size_t error_index;
  size_t pending;     /* events whose callback has not come yet */
  size_t references;  /* the caller's, and one per pending callback */
  struct pjrt_spmd_slot slots[];
};

static void spmd_drop_error(const PJRT_Api* api, PJRT_Error* error) {
  if (error == NULL) return;
  SPMD_ARGS(PJRT_Error_Destroy_Args, args, error);
  args.error = error;
  api->PJRT_Error_Destroy(&args);
}

static void spmd_destroy_event(const PJRT_Api* api, PJRT_Event* event) {
  SPMD_ARGS(PJRT_Event_Destroy_Args, args, event);
  args.event = event;
  spmd_drop_error(api, api->PJRT_Event_Destroy(&args));
}

/* Keeps `error` when it comes from an earlier buffer than the one kept. */
static void spmd_keep_first(const PJRT_Api* api, PJRT_Error** kept,
                            size_t* kept_index, PJRT_Error* error, size_t index) {
  if (error == NULL) return;
  if (*kept != NULL && *kept_index < index) {
    spmd_drop_error(api, error);
    return;
  }
  spmd_drop_error(api, *kept);
  *kept = error;
  *kept_index = index;
}

static void spmd_unref_locked(struct pjrt_spmd_group* group) {
  /* Called with the mutex held; unlocks it. */
  int last = --group->references == 0;
  pthread_mutex_unlock(&group->mutex);
  if (!last) return;
  spmd_drop_error(group->api, group->error);
  pthread_cond_destroy(&group->done_cond);
  pthread_mutex_destroy(&group->mutex);
  free(group);
}

static void spmd_fired(PJRT_Error* error, void* user_arg) {
  struct pjrt_spmd_slot* slot = (struct pjrt_spmd_slot*)user_arg;
  struct pjrt_spmd_group* group = slot->group;
  pthread_mutex_lock(&group->mutex);
  spmd_keep_first(group->api, &group->error, &group->error_index, error,
                  slot->index);
  if (--group->pending == 0) pthread_cond_broadcast(&group->done_cond);
  spmd_unref_locked(group);
}

int pjrt_spmd_group_wait(pjrt_spmd_group* group, int64_t timeout_ms) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&group->mutex);
  while (group->pending != 0) {
    if (pthread_cond_timedwait(&group->done_cond, &group->mutex, &deadline) != 0)
      break;
  }
  int done = group->pending == 0;
  pthread_mutex_unlock(&group->mutex);
  return done;
}

PJRT_Error* pjrt_spmd_group_finish(pjrt_spmd_group* group) {
  pthread_mutex_lock(&group->mutex);
  PJRT_Error* error = NULL;
  if (group->pending == 0) {
    error = group->error;
    group->error = NULL;
  }
  spmd_unref_locked(group);
  return error;
}

/* Without OnReady: each buffer's event awaited in turn (no slices). */
static PJRT_Error* spmd_await_each(const PJRT_Api* api, PJRT_Buffer** buffers,
                                   size_t count) {
  PJRT_Error* kept = NULL;
  size_t kept_index = 0;
  for (size_t i = 0; i < count; i++) {
    SPMD_ARGS(PJRT_Buffer_ReadyEvent_Args, ready, event);
    ready.buffer = buffers[i];
    PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&ready);
    if (error == NULL) {
      SPMD_ARGS(PJRT_Event_Await_Args, await_args, event);
      await_args.event = ready.event;
      error = api->PJRT_Event_Await(&await_args);
      spmd_destroy_event(api, ready.event);
    }
    spmd_keep_first(api, &kept, &kept_index, error, i);
  }
  return kept;
}

int pjrt_spmd_buffers_wait(const PJRT_Api* api, PJRT_Buffer** buffers,
                           size_t count, int64_t slice_ms,
                           pjrt_spmd_group** group_out, PJRT_Error** error_out) {
  *group_out = NULL;
  *error_out = NULL;
  if (!pjrt_shim_has_entry(api, offsetof(PJRT_Api, PJRT_Event_OnReady)) ||
      !pjrt_shim_has_entry(api, offsetof(PJRT_Api, PJRT_Event_IsReady))) {
    *error_out = spmd_await_each(api, buffers, count);
    return 1;
  }
  /* Errors found before any callback is registered. */
  PJRT_Error* kept = NULL;
  size_t kept_index = 0;
  struct pjrt_spmd_group* group = NULL;
  for (size_t i = 0; i < count; i++) {
    SPMD_ARGS(PJRT_Buffer_ReadyEvent_Args, ready, event);
    ready.buffer = buffers[i];
    PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&ready);
    if (error != NULL) {
      spmd_keep_first(api, &kept, &kept_index, error, i);
      continue;
    }
    SPMD_ARGS(PJRT_Event_IsReady_Args, is_ready, is_ready);
    is_ready.event = ready.event;
    error = api->PJRT_Event_IsReady(&is_ready);
    if (error == NULL && is_ready.is_ready) {
      /* Await on a fired event returns its error at once. */
      SPMD_ARGS(PJRT_Event_Await_Args, await_args, event);
      await_args.event = ready.event;
      spmd_keep_first(api, &kept, &kept_index, api->PJRT_Event_Await(&await_args), i);
      spmd_destroy_event(api, ready.event);
      continue;
    }
    spmd_drop_error(api, error);
    if (group == NULL) {
      group = calloc(1, sizeof(*group) + count * sizeof(struct pjrt_spmd_slot));
      if (group == NULL) {
        /* Out of memory: wait for this buffer and the rest one by one. */
        SPMD_ARGS(PJRT_Event_Await_Args, await_args, event);
        await_args.event = ready.event;
        spmd_keep_first(api, &kept, &kept_index, api->PJRT_Event_Await(&await_args), i);
        spmd_destroy_event(api, ready.event);
        spmd_keep_first(api, &kept, &kept_index,
                        spmd_await_each(api, buffers + i + 1, count - i - 1), i + 1);
        *error_out = kept;
        return 1;
      }
      pthread_mutex_init(&group->mutex, NULL);
      pthread_cond_init(&group->done_cond, NULL);
      group->api = api;
      group->references = 1; /* the caller's */
    }
    struct pjrt_spmd_slot* slot = &group->slots[i];
    slot->group = group;
    slot->index = i;
    pthread_mutex_lock(&group->mutex);
    group->pending++;
    group->references++;
    pthread_mutex_unlock(&group->mutex);
    SPMD_ARGS(PJRT_Event_OnReady_Args, on_ready, user_arg);
    on_ready.event = ready.event;
    on_ready.callback = spmd_fired;
    on_ready.user_arg = slot;
    error = api->PJRT_Event_OnReady(&on_ready);
    spmd_destroy_event(api, ready.event);  /* the callback outlives the event */
    if (error != NULL) {
      /* No callback will come for this one. */
      pthread_mutex_lock(&group->mutex);
      group->pending--;
      group->references--;
      pthread_mutex_unlock(&group->mutex);
      spmd_keep_first(api, &kept, &kept_index, error, i);
    }
  }
  if (group == NULL) {
    *error_out = kept;
    return 1;
  }
  pthread_mutex_lock(&group->mutex);
  spmd_keep_first(api, &group->error, &group->error_index, kept, kept_index);
  pthread_mutex_unlock(&group->mutex);
  if (pjrt_spmd_group_wait(group, slice_ms)) {
    *error_out = pjrt_spmd_group_finish(group);
    return 1;
  }
  *group_out = group;
  return 0;
}
