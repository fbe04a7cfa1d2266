# The native runtime, pjrt._native_runtime (_native/hot_path.h names its files), for type
# checkers: they need no build. HandleCore's fields are declared where they are assigned
# (pjrt._capi.handles.ClientHandle.__init__); ArrayCore's are set in C, by its one constructor,
# so they are declared here, and tests/test_native_core.py checks these names against the C
# field list (HP_ARRAY_FIELDS), the one source, and the constructors' arguments against its
# fill().
from typing import Any, Callable, TypeVar

import numpy as np

MAX_DEVICES: int

_Array = TypeVar("_Array", bound="ArrayCore")


class HandleCore:
    def take_ticket(self) -> int: ...

    def end(self, ticket: int) -> None: ...

    def release_buffers(self, owner_id: int) -> None: ...


class ArrayCore:
    _client: Any
    _handle: Any
    _buffers: list | None
    _devices: tuple
    shape: tuple[int, ...]
    dtype: np.dtype
    _host_copy: np.ndarray | None
    _host_view: Any
    _deleted_reason: str | None
    _sharding: Any
    _parent: Any
    _shared: bool
    _physical_order: tuple | None
    _queries: dict | None

    def __init__(self, client: Any, handle: HandleCore, buffers: list, devices: tuple,
                 shape: tuple, dtype: np.dtype, sharding: Any = ..., parent: Any = ...,
                 physical_order: tuple | None = ...) -> None: ...

    @classmethod
    def _adopt(cls: type[_Array], client: Any, handle: HandleCore, buffers: list,
               devices: tuple, shape: tuple, dtype: np.dtype, sharding: Any = ...,
               parent: Any = ..., physical_order: tuple | None = ...) -> _Array: ...

    def _take_interruption(self) -> BaseException | None: ...

    # The buffer protocol (np.asarray, memoryview, bytes of a value in host memory).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...


class CallPlan:
    live: int
    inline: int
    kept_gil: int  # read-only

    def __init__(self, handle: HandleCore, client: Any, devices: tuple, array_type: type,
                 ndarray_type: type, parameters: tuple, outputs: tuple, donated: tuple,
                 hooks: tuple, /) -> None:
        """``hooks``: (new_call, prepare_donations, consume_donated, raise_error[, accept]),
        named by `pjrt._runtime.launches.CallHooks`."""

    def run(self, arguments: Any, copy_host_values: bool) -> list | None: ...

    def drop_idle_calls(self) -> None: ...


def configure(address_slot: Any, address_slot_address: int, *, buffer_destroy: int,
              error_destroy: int, call_run: int, host_address: int, buffer_wait: int,
              waiter_finish: int, wait_slice_ms: int,
              wait_ready: Callable[[Any, Any], None],
              buffer_format: Callable[[np.dtype], bytes | None]) -> None: ...


def set_array_site_recorder(recorder: Callable[[Any], object] | None) -> None: ...
def programs_may_call_python() -> None: ...
def launches_keep_gil() -> bool: ...
