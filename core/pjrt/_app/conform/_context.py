"""What the checks share inside one worker process: the plugin, its client, and direct C calls.

The transfer and event checks call the plugin's own entry points through cffi
(``PJRT_Client_BufferFromHostBuffer``, ``PJRT_Buffer_ToHostBuffer``, ``PJRT_Event_*``) rather
than pjrt's Array, which reads host-memory buffers through a view and would never notice a
plugin whose ``ToHostBuffer`` writes the wrong bytes.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..._pjrt_cffi import ffi
from ...client import create_client
from ...errors import XlaRuntimeError
from ...plugin import load_pjrt_plugin_dynamically
from ._registry import Skip

_NULL = ffi.NULL

#: PJRT_HostBufferSemantics values.
IMMUTABLE_ONLY_DURING_CALL = 0
IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1


class Context:
    """The plugin under test, loaded on first use, and the client the checks share.

    Attributes:
      library: the plugin's shared library.
      name: the name the plugin is loaded under in the worker.
      options: the create options of the shared client.
      topology: the topology the compile-only check asks for ("" for the plugin's own).
    """

    def __init__(self, library: str, name: str, options: dict, topology: str = ""):
        self.library = library
        self.topology = topology
        self.name = name
        self.options = options
        self._plugin = None
        self._client = None
        self.closed = False
        #: Facts the checks learn about the plugin, for the report's header.
        self.info: dict = {}

    @property
    def plugin(self):
        """The loaded `Plugin` (loads the library on first use)."""
        if self._plugin is None:
            self._plugin = load_pjrt_plugin_dynamically(self.name, self.library)
        return self._plugin

    @property
    def api(self):
        return self.plugin.api

    def new_client(self, options: dict | None = None):
        """A new client of the plugin (the caller closes it)."""
        return create_client(self.plugin, self.options if options is None else options)

    @property
    def client(self):
        """The shared client, created on first use."""
        if self.closed:
            raise Skip("the shared client was destroyed by client.destroy")
        if self._client is None:
            self._client = self.new_client()
        return self._client

    def close(self) -> None:
        """Destroy the shared client (PJRT_Client_Destroy)."""
        if self._client is not None:
            self._client.close()
        self.closed = True

    def devices(self, at_least: int = 1) -> list:
        """The client's addressable devices; Skip when there are fewer than ``at_least``."""
        devices = self.client.local_devices()
        if len(devices) < at_least:
            raise Skip(f"needs {at_least} devices, the client has {len(devices)} (a CPU "
                       f"plugin makes more with --option cpu_device_count=8)")
        return devices

    # -- direct C calls -------------------------------------------------------------------

    def device_pointers(self) -> list:
        """The shared client's addressable ``PJRT_Device*``, as the plugin lists them."""
        args = self.api.call_new("PJRT_Client_AddressableDevices",
                                 client=self.client.handle.pointer)
        return [args.addressable_devices[i] for i in range(args.num_addressable_devices)]

    def await_event(self, event) -> None:
        """PJRT_Event_Await then PJRT_Event_Destroy on ``event`` (NULL: nothing to wait for)."""
        if event == _NULL:
            return
        try:
            self.api.call_new("PJRT_Event_Await", event=event)
        finally:
            self.api.call_new("PJRT_Event_Destroy", event=event)

    def put(self, host: np.ndarray, *, device=None, byte_strides=None,
            semantics: int = IMMUTABLE_ONLY_DURING_CALL, wait: bool = True,
            buffer_type: int | None = None):
        """PJRT_Client_BufferFromHostBuffer of ``host`` onto ``device`` (a ``PJRT_Device*``;
        the first addressable one when None), read through ``byte_strides`` when given; returns ``(PJRT_Buffer*, done_with_host_buffer event or NULL)``. With
        ``wait`` the event is awaited and destroyed here (and NULL is returned for it)."""
        client = self.client
        device = device if device is not None else self.device_pointers()[0]
        api = self.api
        args = api.new_args("PJRT_Client_BufferFromHostBuffer_Args")
        keep = []
        args.client = client.handle.pointer
        if byte_strides is not None:
            data = ffi.cast("void *", host.__array_interface__["data"][0])
            strides = ffi.new("int64_t[]", list(byte_strides))
            keep.append(strides)
            args.byte_strides = strides
            args.num_byte_strides = len(byte_strides)
        elif not host.flags.c_contiguous:
            raise ValueError("put() needs a C-contiguous array or explicit byte strides")
        else:
            data = ffi.from_buffer(host.reshape(-1) if host.nbytes else np.zeros(1, np.uint8))
        args.data = data
        args.type = dtypes.to_pjrt_type(host.dtype) if buffer_type is None else buffer_type
        dims = ffi.new("int64_t[]", list(host.shape) or [0])
        args.dims = dims
        args.num_dims = host.ndim
        args.host_buffer_semantics = semantics
        args.device = device
        api.call("PJRT_Client_BufferFromHostBuffer", args)
        buffer, done = args.buffer, args.done_with_host_buffer
        if wait:
            self.await_event(done)
            done = _NULL
        return buffer, done

    def to_host(self, buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Read ``buffer`` through PJRT_Buffer_ToHostBuffer into a new array, awaiting the
        event the plugin returns."""
        out = np.zeros(shape, dtype)
        dst = ffi.from_buffer(out.reshape(-1)) if out.nbytes else ffi.new("char[1]")
        args = self.api.call_new("PJRT_Buffer_ToHostBuffer", src=buffer, dst=dst,
                                 dst_size=out.nbytes)
        self.await_event(args.event)
        return out

    def destroy(self, buffer) -> None:
        """PJRT_Buffer_Destroy."""
        self.api.call_new("PJRT_Buffer_Destroy", buffer=buffer)

    def roundtrip(self, host: np.ndarray, **put_options) -> np.ndarray:
        """``host`` to the device and back, through the plugin's own entry points."""
        buffer, _ = self.put(host, **put_options)
        try:
            ready = self.api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event
            self.await_event(ready)
            shape = tuple(host.shape)
            return self.to_host(buffer, shape, host.dtype)
        finally:
            self.destroy(buffer)


def refused(error: XlaRuntimeError) -> str:
    """How a refusal reads in a skip or failure line: the code's name and the message."""
    return f"{error.code_name}: {' '.join(error.plugin_message.split())}"
