# The per-call path's extension (_native/hot_path.c), for type checkers: they need no build.
# ArrayCore's and HandleCore's fields are declared where they are assigned (pjrt.array.Array,
# pjrt._capi.handles.ClientHandle), so the checker takes their types from there.
from typing import Any, Callable


class ArrayCore: ...


class HandleCore: ...


class CallPlan:
    live: int
    inline: int

    def __init__(self, handle: HandleCore, client: Any, devices: tuple, array_type: type,
                 ndarray_type: type, parameters: tuple, outputs: tuple, donated: tuple,
                 new_call: Callable[[], tuple], prepare_donations: Callable[..., tuple],
                 consume_donated: Callable[..., None], raise_error: Callable[..., None],
                 launch_address: int, accept: Callable[..., bool] | None = ...) -> None: ...

    def run(self, arguments: Any, copy_host_values: bool) -> list | None: ...

    def drop_idle_calls(self) -> None: ...


def configure(address_slot: Any, address_slot_address: int,
              buffer_destroy_address: int) -> None: ...


def read_small(array: Any) -> bytes | None: ...


def configure_reads(host_read_address: int, view_threshold_bytes: int) -> None: ...
