/* Waiting on every shard of a global array at once (see spmd.c). */

typedef struct pjrt_spmd_group pjrt_spmd_group;

/* Asks each of the `count` buffers for its ready event and waits up to
 * `slice_ms` for them all, with one wake-up when the last one fires.
 * Returns 1 when every buffer is ready or failed: *error_out then holds the
 * error of the first buffer, in buffer order, that failed (NULL when none did;
 * the others' errors are dropped). Returns 0 when the slice ran out first:
 * *group_out is then a group to wait on in further slices with
 * pjrt_spmd_group_wait and to give back with pjrt_spmd_group_finish.
 * A plugin without PJRT_Event_OnReady is waited on buffer by buffer, without
 * slices. */
int pjrt_spmd_buffers_wait(const PJRT_Api* api, PJRT_Buffer** buffers,
                           size_t count, int64_t slice_ms,
                           pjrt_spmd_group** group_out, PJRT_Error** error_out);

/* Waits up to `timeout_ms` for the group's last event; 1 once all fired. */
int pjrt_spmd_group_wait(pjrt_spmd_group* group, int64_t timeout_ms);

/* Drops the caller's reference (the group is freed when its last event has
 * fired too). Returns the first failed buffer's error when all have fired,
 * else NULL (the events still pending drop theirs). */
PJRT_Error* pjrt_spmd_group_finish(pjrt_spmd_group* group);
