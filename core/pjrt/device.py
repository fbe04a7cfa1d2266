"""Devices and memories of a client.

[`Device`][pjrt.device.Device] and [`Memory`][pjrt.device.Memory] do not own anything: the client owns the C objects, and
each PJRT handle maps to exactly one Python object per client, so devices and memories compare
by identity and can be dict keys and mesh elements.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ._capi.api import HEADER_VERSION, to_str
from ._pjrt_cffi import ffi
from .errors import ErrorCode, UnsupportedFeatureError, XlaRuntimeError
from ._capi.handles import ClientHandle
from ._capi.options import named_values_to_dict

if TYPE_CHECKING:
    from .plugin import Plugin


class ClientView(Protocol):
    """What the modules below the client use of a [`Client`][pjrt.client.Client] (its one
    implementation): devices, memories, arrays, executables and the compile pipeline name
    this, never `pjrt.client`, so that the client stays at the top of the import layers
    (see docs/architecture.md)."""

    plugin: Plugin
    platform: str
    platform_version: str
    #: The create options the client was made with (for a worker's copy of the client).
    create_options: dict

    @property
    def handle(self) -> ClientHandle:
        """The live C handle (raises ClosedClientError once closed)."""
        ...

    @property
    def raw_handle(self) -> ClientHandle:
        """The C handle, closed or not."""
        ...

    def device_from_pointer(self, pointer) -> Device: ...
    def memory_from_pointer(self, pointer) -> Memory: ...
    def devices(self) -> list[Device]: ...
    def local_devices(self) -> list[Device]: ...
    def process_index(self) -> int: ...
    def live_arrays(self) -> list: ...


def _live_api(client: ClientView):
    """The client's API table (for methods that run as a native call on the client)."""
    return client.plugin.api


#: The PJRT API that added ``peak_allocated_bytes`` to ``PJRT_Device_MemoryStats_Args`` (0.110's
#: header lacks it, 0.113's has it).
_PEAK_ALLOCATED_SINCE = (0, 113)

# Device and Memory methods run as one native call on their client (``with
# self._client_handle.calling():``): their handles belong to the client and are freed with it,
# so a closed client raises ClosedClientError. (Each keeps the client's handle, taken once.)


class Device:
    """A device of a [`Client`][pjrt.client.Client] (``PJRT_Device``).

    Attributes follow jaxlib's ``Device``: ``id``, ``process_index``, ``host_id``,
    ``platform``, ``device_kind``, ``local_hardware_id`` (None when not addressable),
    ``client``. `pointer` is its `PJRT_Device*`, for pjrt's own native calls (owned by
    the client, valid while the client is open).
    """

    __slots__ = ("client", "pointer", "_client_handle", "_description", "id", "process_index",
                 "device_kind", "local_hardware_id", "is_addressable", "_default_memory",
                 "__weakref__")

    def __init__(self, client: ClientView, handle):
        api = client.plugin.api
        self.client = client
        self.pointer = handle
        self._client_handle = client.raw_handle
        self._description = api.call_new("PJRT_Device_GetDescription", device=handle).device_description
        description = self._description
        self.id = int(api.call_new("PJRT_DeviceDescription_Id", device_description=description).id)
        self.process_index = int(api.call_new("PJRT_DeviceDescription_ProcessIndex",
                                              device_description=description).process_index)
        kind = api.call_new("PJRT_DeviceDescription_Kind", device_description=description)
        self.device_kind = to_str(kind.device_kind, kind.device_kind_size)
        self.is_addressable = bool(api.call_new("PJRT_Device_IsAddressable",
                                                device=handle).is_addressable)
        self.local_hardware_id = None
        if self.is_addressable and api.has("PJRT_Device_LocalHardwareId"):
            hardware_id = int(api.call_new("PJRT_Device_LocalHardwareId",
                                           device=handle).local_hardware_id)
            self.local_hardware_id = hardware_id if hardware_id >= 0 else None
        self._default_memory = None

    @property
    def host_id(self) -> int:
        """Same as ``process_index`` (jaxlib's older name)."""
        return self.process_index

    @property
    def platform(self) -> str:
        """The client's platform name, e.g. ``"cpu"``."""
        return self.client.platform

    def attributes(self) -> dict:
        """Plugin-specific description attributes (``PJRT_DeviceDescription_Attributes``)."""
        with self._client_handle.calling():
            api = _live_api(self.client)
            args = api.call_new("PJRT_DeviceDescription_Attributes",
                                device_description=self._description)
            return named_values_to_dict(args.attributes, args.num_attributes)

    def addressable_memories(self) -> list["Memory"]:
        """The memories this device can address directly."""
        with self._client_handle.calling():
            client = self.client
            args = _live_api(client).call_new("PJRT_Device_AddressableMemories",
                                              device=self.pointer)
            return [client.memory_from_pointer(args.memories[i]) for i in range(args.num_memories)]

    def default_memory(self) -> "Memory":
        """The memory a buffer lands in when no memory is named."""
        with self._client_handle.calling():
            if self._default_memory is None:
                client = self.client
                args = _live_api(client).call_new("PJRT_Device_DefaultMemory", device=self.pointer)
                self._default_memory = client.memory_from_pointer(args.memory)
            return self._default_memory

    def memory(self, kind: str) -> "Memory":
        """The addressable memory of this kind (e.g. ``"device"``, ``"pinned_host"``).

        Raises:
          ValueError: the device has no memory of that kind; the message lists those it has.
        """
        memories = self.addressable_memories()
        for memory in memories:
            if memory.kind == kind:
                return memory
        kinds = ", ".join(repr(m.kind) for m in memories) or "none"
        raise ValueError(f"{self} has no memory of kind {kind!r}; its memory kinds: {kinds}")

    def memory_stats(self) -> dict[str, int] | None:
        """Allocator statistics, or None when the plugin does not report them.

        ``bytes_in_use`` always, and those of ``peak_bytes_in_use``, ``num_allocs``,
        ``largest_alloc_size``, ``bytes_limit``, ``bytes_reserved``, ``peak_bytes_reserved``,
        ``bytes_reservable_limit``, ``largest_free_block_bytes``, ``pool_bytes``,
        ``peak_pool_bytes`` and ``peak_allocated_bytes`` (read from plugins of PJRT API 0.113
        on, whose struct has it) that the plugin sets. Where the plugin supports
        `clear_memory_stats`, the peaks count from the last clear.
        """
        with self._client_handle.calling():
            api = _live_api(self.client)
            if not api.has("PJRT_Device_MemoryStats"):
                return None
            args = api.new_args("PJRT_Device_MemoryStats_Args")
            args.device = self.pointer
            try:
                api.call("PJRT_Device_MemoryStats", args)
            except XlaRuntimeError as error:
                if error.code in (ErrorCode.UNIMPLEMENTED, ErrorCode.FAILED_PRECONDITION):
                    return None
                raise
            stats = {"bytes_in_use": int(args.bytes_in_use)}
            optional = (
                ("peak_bytes_in_use", "peak_bytes_in_use_is_set"),
                ("num_allocs", "num_allocs_is_set"),
                ("largest_alloc_size", "largest_alloc_size_is_set"),
                ("bytes_limit", "bytes_limit_is_set"),
                ("bytes_reserved", "bytes_reserved_is_set"),
                ("peak_bytes_reserved", "peak_bytes_reserved_is_set"),
                ("bytes_reservable_limit", "bytes_reservable_limit_is_set"),
                ("largest_free_block_bytes", "largest_free_block_bytes_is_set"),
                ("pool_bytes", "pool_bytes_is_set"),
                ("peak_pool_bytes", "peak_pool_bytes_is_set"),
            )
            if api.version >= _PEAK_ALLOCATED_SINCE:
                # A plugin of an older API knows a shorter struct and never writes these fields.
                optional += (("peak_allocated_bytes", "peak_allocated_bytes_is_set"),)
            for name, flag in optional:
                if getattr(args, flag):
                    stats[name] = int(getattr(args, name))
            return stats

    def clear_memory_stats(self) -> None:
        """Reset the device's allocator statistics (its peaks start again from what is in use
        now), through ``PJRT_Device_ClearMemoryStats`` (PJRT API 0.106 on).

        Raises:
          UnsupportedFeatureError: the plugin does not provide the call, or answers that it
            does not implement it (XLA's CPU plugins: the 0.81 build has no entry, the 0.106
            build answers UNIMPLEMENTED).
        """
        with self._client_handle.calling():
            api = _live_api(self.client)
            function = "PJRT_Device_ClearMemoryStats"
            if not api.has(function):
                raise UnsupportedFeatureError(function, api.plugin_name, api.version,
                                              HEADER_VERSION,
                                              why="the call came with PJRT API 0.106")
            try:
                api.call_new(function, device=self.pointer)
            except XlaRuntimeError as error:
                if error.code != ErrorCode.UNIMPLEMENTED:
                    raise
                raise UnsupportedFeatureError(
                    function, api.plugin_name, api.version, HEADER_VERSION,
                    why=f"its table has the entry, but it answers {error}") from None

    def get_stream_for_external_ready_events(self) -> int:
        """The device's stream (a ``cudaStream_t`` / ``hipStream_t`` as an int) on which
        memory handed to the plugin from outside should be made ready; what
        [`pjrt.from_dlpack`][pjrt.dlpack.from_dlpack] passes a GPU producer as its
        ``__dlpack__(stream=...)`` (the PJRT stream extension, as in jaxlib).

        Raises:
          UnsupportedFeatureError: the plugin has no stream extension (XLA's CPU plugins);
            the message names the plugin.
        """
        with self._client_handle.calling():
            from ._capi.stream_extension import stream_for_external_ready_events

            return stream_for_external_ready_events(_live_api(self.client), self.pointer)

    def live_buffers(self) -> list:
        """The live arrays with a buffer on this device."""
        return [array for array in self.client.live_arrays() if self in array.devices()]

    def to_string(self) -> str:
        """The plugin's short description of the device."""
        with self._client_handle.calling():
            api = _live_api(self.client)
            args = api.call_new("PJRT_DeviceDescription_ToString",
                                device_description=self._description)
            return to_str(args.to_string, args.to_string_size)

    def debug_string(self) -> str:
        """The plugin's detailed description of the device."""
        with self._client_handle.calling():
            api = _live_api(self.client)
            args = api.call_new("PJRT_DeviceDescription_DebugString",
                                device_description=self._description)
            return to_str(args.debug_string, args.debug_string_size)

    def __repr__(self) -> str:
        return f"{self.client.platform.capitalize()}Device(id={self.id})"

    def __str__(self) -> str:
        return repr(self)


class Memory:
    """A memory space of a client (``PJRT_Memory``): ``kind``, ``id``, ``process_index``,
    ``platform``, `addressable_by_devices`. `pointer` is its `PJRT_Memory*`, for pjrt's
    own native calls (owned by the client, valid while the client is open)."""

    __slots__ = ("client", "pointer", "_client_handle", "id", "kind", "kind_id", "__weakref__")

    def __init__(self, client: ClientView, handle):
        api = client.plugin.api
        self.client = client
        self.pointer = handle
        self._client_handle = client.raw_handle
        self.id = int(api.call_new("PJRT_Memory_Id", memory=handle).id)
        kind = api.call_new("PJRT_Memory_Kind", memory=handle)
        self.kind = to_str(kind.kind, kind.kind_size)
        self.kind_id = (int(api.call_new("PJRT_Memory_Kind_Id", memory=handle).kind_id)
                        if api.has("PJRT_Memory_Kind_Id") else None)

    @property
    def platform(self) -> str:
        return self.client.platform

    @property
    def process_index(self) -> int:
        devices = self.addressable_by_devices()
        return devices[0].process_index if devices else self.client.process_index()

    def addressable_by_devices(self) -> list[Device]:
        """The devices that can address this memory."""
        with self._client_handle.calling():
            client = self.client
            args = _live_api(client).call_new("PJRT_Memory_AddressableByDevices",
                                              memory=self.pointer)
            return [client.device_from_pointer(args.devices[i]) for i in range(args.num_devices)]

    def to_string(self) -> str:
        with self._client_handle.calling():
            api = _live_api(self.client)
            args = api.call_new("PJRT_Memory_ToString", memory=self.pointer)
            return to_str(args.to_string, args.to_string_size)

    def __repr__(self) -> str:
        return f"Memory(id={self.id}, kind={self.kind!r})"

    def __str__(self) -> str:
        return self.kind


# Cdata pointers are compared by address; keys of the client's handle caches.
def handle_key(handle) -> int:
    return int(ffi.cast("uintptr_t", handle))
