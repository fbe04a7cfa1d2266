"""Clients: a plugin's view of its devices, and the owner of everything made through it.

A [`Client`][pjrt.client.Client] wraps ``PJRT_Client``. The C handle itself lives in a small
`ClientHandle` that arrays and executables keep alive; the handle refers
to nothing that refers back to it, so it is freed only after every buffer and executable made
through it, whatever order the garbage collector finds them in, and never while a call on it
is running (see `pjrt._capi.handles` for the rules).
"""
from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Sequence


from . import distributed
from ._loading import plugin_logging
from ._loading import startup
from ._loading import vendor_quirks
from . import plugin as plugin_module
from ._capi.api import to_str
from ._pjrt_cffi import ffi
from .device import Device, Memory, handle_key
from .errors import ClosedClientError
from ._capi.handles import ClientHandle, HostBufferSemantics, fork_generation
from ._capi.options import (XLA_OPTION_TYPES, NamedValues, OptionValue, check_option_types,
                            check_option_values)
from ._runtime import memory_headroom
from ._capi.off_thread import call_off_thread
from ._runtime import handler_launches

if TYPE_CHECKING:
    import numpy

    from .array import Array
    from .compile_options import CompileOptions
    from .executable import LoadedExecutable
    from .streaming import TransferManager


if os.environ.get("PJRT_ARRAY_SITES", "") not in ("", "0"):
    # Where arrays are made is recorded from the first one on (Client.heap_profile).
    from ._profiling import heap as _heap  # noqa: F401 - importing it turns recording on

#: Entries the C helpers call without looking them up; a client needs all of them (the list
#: is the plugin module's, which requires them at load).
REQUIRED_FUNCTIONS = plugin_module.HELPER_FUNCTIONS


_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def live_clients() -> list["Client"]:
    """Every client of this process that is not closed."""
    return [client for client in list(_live_clients) if not client.is_closed]


#: The most devices `Client.default_device_assignment` assigns (the most a CPU client has).
MAX_ASSIGNED_DEVICES = 65536


class Client:
    """A PJRT client: devices, memories, transfers and compilation for one plugin.

    Made by [`make_c_api_client`][pjrt.client.make_c_api_client]. Names follow jaxlib's ``Client``.
    """

    def __init__(self, plugin: plugin_module.Plugin, handle: ClientHandle):
        self.plugin = plugin
        self._api = plugin.api
        self._handle = handle
        self._lock = threading.Lock()
        self._devices_by_handle: dict[int, Device] = {}
        self._memories_by_handle: dict[int, Memory] = {}
        #: The create options the client was made with (as checked), so that a worker
        #: process can make the same client (crash-isolated compilation).
        self.create_options: dict = {}
        api = self._api
        name = api.call_new("PJRT_Client_PlatformName", client=handle.pointer)
        self.platform: str = to_str(name.platform_name, name.platform_name_size)
        version = api.call_new("PJRT_Client_PlatformVersion", client=handle.pointer)
        self.platform_version: str = to_str(version.platform_version, version.platform_version_size)
        self._process_index = int(api.call_new("PJRT_Client_ProcessIndex",
                                               client=handle.pointer).process_index)
        all_devices = api.call_new("PJRT_Client_Devices", client=handle.pointer)
        self._devices = [self._device(all_devices.devices[i]) for i in range(all_devices.num_devices)]
        local = api.call_new("PJRT_Client_AddressableDevices", client=handle.pointer)
        self._local_devices = [self._device(local.addressable_devices[i])
                               for i in range(local.num_addressable_devices)]
        _live_clients.add(self)

    # -- handles ---------------------------------------------------------------------------

    @property
    def handle(self) -> ClientHandle:
        """The live C handle; raises [`ClosedClientError`][pjrt.errors.ClosedClientError] after `close`."""
        if self._handle.closed:
            raise ClosedClientError(f"{self._handle.closed_reason} ({self.platform} client)")
        return self._handle

    # -- named interfaces for pjrt's own modules -------------------------------------------
    # Device, Memory, Array and the transfer and compile modules reach the client through
    # these members only.

    @property
    def raw_handle(self) -> ClientHandle:
        """The client's `ClientHandle`, closed or not (`handle` refuses a closed client).

        For code that brackets a native call with `raw_handle.calling()` (which raises
        `ClosedClientError` itself), that runs inside such a call already, or that frees what
        a failed call made.
        """
        return self._handle

    def device_from_pointer(self, pointer) -> Device:
        """The one `Device` of this client for a `PJRT_Device*` the plugin returned (made the
        first time the pointer is seen)."""
        return self._device(pointer)

    def memory_from_pointer(self, pointer) -> Memory:
        """The one `Memory` of this client for a `PJRT_Memory*` the plugin returned (made the
        first time the pointer is seen)."""
        return self._memory(pointer)

    def _device(self, pointer) -> Device:
        key = handle_key(pointer)
        device = self._devices_by_handle.get(key)
        if device is None:
            device = Device(self, pointer)
            self._devices_by_handle[key] = device
        return device

    def _memory(self, pointer) -> Memory:
        key = handle_key(pointer)
        memory = self._memories_by_handle.get(key)
        if memory is None:
            memory = Memory(self, pointer)
            self._memories_by_handle[key] = memory
        return memory

    # -- queries ---------------------------------------------------------------------------

    @property
    def runtime_type(self) -> str:
        return "pjrt_c_api"

    def process_index(self) -> int:
        """This process's index among the processes of a multi-process client (0 alone)."""
        return self._process_index

    def host_id(self) -> int:
        return self._process_index

    def devices(self) -> list[Device]:
        """All devices of the client, addressable or not."""
        return list(self._devices)

    def _get_all_devices(self) -> list[Device]:
        """jaxlib's name for `devices` (every device, addressable or not)."""
        return self.devices()

    @property
    def pjrt_c_api_major_version(self) -> int:
        """The major PJRT C API version the client's plugin was negotiated at."""
        return self.plugin.api_version[0]

    @property
    def pjrt_c_api_minor_version(self) -> int:
        """The minor PJRT C API version the client's plugin was negotiated at."""
        return self.plugin.api_version[1]

    def local_devices(self) -> list[Device]:
        """The devices this process can address."""
        return list(self._local_devices)

    def device_count(self) -> int:
        return len(self._devices)

    def local_device_count(self) -> int:
        return len(self._local_devices)

    def addressable_memories(self) -> list[Memory]:
        """Every memory the client's addressable devices can reach."""
        with self._handle.calling() as handle:
            args = self._api.call_new("PJRT_Client_AddressableMemories", client=handle.pointer)
            return [self._memory(args.addressable_memories[i])
                    for i in range(args.num_addressable_memories)]

    def device_from_local_hardware_id(self, local_hardware_id: int) -> Device:
        """The addressable device with this local hardware id; ValueError listing the ids
        otherwise."""
        for device in self._local_devices:
            if local_hardware_id is not None and device.local_hardware_id == local_hardware_id:
                return device
        ids = ", ".join(str(d.local_hardware_id) for d in self._local_devices)
        raise ValueError(f"no addressable device with local hardware id {local_hardware_id} on "
                         f"this {self.platform} client (local hardware ids: {ids})")

    def lookup_device(self, device_id: int) -> Device:
        """The device with global id ``device_id``; ValueError listing the ids otherwise."""
        for device in self._devices:
            if device.id == device_id:
                return device
        ids = ", ".join(str(d.id) for d in self._devices)
        raise ValueError(f"no device with id {device_id} on this {self.platform} client "
                         f"(device ids: {ids})")

    def live_arrays(self) -> list:
        """Arrays made through this client that are alive and not deleted, newest first (as
        jaxlib lists them).

        Arrays are not tracked one by one (that would slow every execution down); this walks
        the objects the garbage collector knows, so it is meant for debugging, not hot loops.
        """
        from .array import Array

        handle = self._handle
        arrays = [o for o in gc.get_objects()
                  if type(o) is Array and o._handle is handle and not o.is_deleted()]
        # The handle registers each owner's buffers as the owner is made, so its registry's
        # order is the order of making; a shard or clone sorts with its owner.
        newest_first = {owner: place for place, owner in enumerate(reversed(list(handle.buffers)))}
        last = len(newest_first)
        return sorted(arrays, key=lambda array: newest_first.get(array._owner_id(), last))

    def live_buffers(self) -> list:
        return self.live_arrays()

    def heap_profile(self) -> bytes:
        """The memory this client's live arrays and executables hold, as a pprof profile
        (jaxlib's method; the serialised ``Profile`` message, not compressed, as jaxlib's;
        [`pjrt.profiler.device_memory_profile`][pjrt.profiler.device_memory_profile] gzips
        it). Arrays' buffers are grouped by device, memory kind and the site where the arrays
        were made, executables by name; each sample has the values ``allocations`` (count)
        and ``space`` (bytes) and the label ``kind`` (``buffer`` or ``executable``), a
        buffer's also ``device`` and ``memory_kind``. Sites are recorded while
        [`record_array_sites`][pjrt.profiler.record_array_sites] is on (or with
        ``PJRT_ARRAY_SITES=1`` in the environment); read the file with ``pprof`` (see the
        profiling guide).

        Raises:
          ClosedClientError: the client is closed.
        """
        from ._profiling.heap import heap_profile

        return heap_profile(self)

    def live_executables(self) -> list:
        """Loaded executables made through this client that are alive and not deleted."""
        from .executable import loaded_on  # (executables come with numpy; a client does not)

        return loaded_on(self)

    def default_device_assignment(self, num_replicas: int, num_partitions: int = 1) -> "numpy.ndarray":
        """The plugin's default device ids, shaped ``[num_replicas, num_partitions]``.

        Raises:
          TypeError, ValueError: a count that is not an int from 1 up, or more than
            `MAX_ASSIGNED_DEVICES` devices in all (XLA's CPU plugin aborts the process on 0).
        """
        import numpy as np

        from ._wire.proto_message import check_int  # (it needs numpy, which clients do not)

        num_replicas = check_int("num_replicas", num_replicas, 1, MAX_ASSIGNED_DEVICES)
        num_partitions = check_int("num_partitions", num_partitions, 1, MAX_ASSIGNED_DEVICES)
        total = num_replicas * num_partitions
        if total > MAX_ASSIGNED_DEVICES:
            raise ValueError(f"num_replicas * num_partitions is {total}; at most "
                             f"{MAX_ASSIGNED_DEVICES} devices can be assigned")
        ids = ffi.new("int[]", total)
        args = self._api.new_args("PJRT_Client_DefaultDeviceAssignment_Args")
        args.num_replicas = num_replicas
        args.num_partitions = num_partitions
        args.default_assignment_size = total
        args.default_assignment = ids
        with self._handle.calling() as handle:
            args.client = handle.pointer
            self._api.call("PJRT_Client_DefaultDeviceAssignment", args)
        return np.array(list(ids), dtype=np.int64).reshape(num_replicas, num_partitions)

    def get_default_layout(self, dtype, shape: Sequence[int], device: Device | None = None):
        """The [`PjRtLayout`][pjrt.layouts.PjRtLayout] this client gives a new buffer of ``dtype``
        and ``shape`` (``device`` is accepted for jaxlib's signature: a PJRT client has one
        default layout for all its devices).

        Raises:
          UnsupportedFeatureError: the plugin has no layouts extension.
          TypeError: ``dtype`` has no PJRT equivalent.
          ValueError: a dimension is negative, or the element's byte width times the
            dimensions, multiplied in order, passes 2**63 - 1 at some step (XLA's rule,
            which a 0 extent later does not lift).
        """
        # Imported here: layouts need numpy, which making a client must not import.
        from .layouts import default_layout

        if device is not None and device.client is not self:
            raise ValueError(f"{device} belongs to another client")
        with self._handle.calling() as handle:
            return default_layout(self._api, handle.pointer, dtype, shape)

    # -- transfers and compilation (see array.py and executable.py) ------------------------

    def buffer_from_pyval(self, argument: Any, device: Device | None = None,
                          force_copy: bool = False,
                          host_buffer_semantics: HostBufferSemantics | int =
                          HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                          memory: Memory | None = None) -> Array:
        """Copy a numpy array (or anything ``np.asarray`` takes) to ``device``.

        Args:
          argument: the host value.
          device: the target device; the first local device when None.
          force_copy: with ZERO_COPY semantics, copy anyway.
          host_buffer_semantics: see `HostBufferSemantics`.
          memory: a memory of ``device`` to place the buffer in (its default when None).

        Returns:
          An [`Array`][pjrt.array.Array].

        Raises:
          TypeError: the value's dtype has no PJRT equivalent.
          ValueError: the device belongs to another client.
        """
        from .array import array_from_host

        if force_copy and host_buffer_semantics == HostBufferSemantics.ZERO_COPY:
            host_buffer_semantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
        return array_from_host(self, argument, device, host_buffer_semantics, memory)

    def create_buffers_for_async_host_to_device(self, shapes: Sequence, memory: Memory
                                                ) -> TransferManager:
        """Buffers in ``memory`` whose bytes the host sends later, in chunks: a
        [`TransferManager`][pjrt.streaming.TransferManager] (see [`pjrt.streaming`][pjrt.streaming]).

        Args:
          shapes: each buffer's ``(shape, dtype)`` pair, or a ``pjrt.shapes.Shape`` (an array
            shape, static, row-major).
          memory: a memory of one of the client's devices (``device.default_memory()``, or
            another of ``device.addressable_memories()``).

        Raises:
          UnsupportedFeatureError: the plugin cannot stream transfers (older than PJRT C API
            0.60, an entry missing, or it answers UNIMPLEMENTED); the message names it.
          TypeError, ValueError: a spec that is not an array shape of a supported dtype, or
            a memory of another client.
          ClosedClientError: the client is closed.
        """
        from .streaming import create_transfer_manager

        return create_transfer_manager(self, shapes, memory)

    def compile_and_load(self, computation: str | bytes, executable_devices: Sequence[Device]
                         | None = None, compile_options: CompileOptions | None = None, *,
                         replicated: bool = False, isolate: bool | None = None
                         ) -> LoadedExecutable:
        """Compile a StableHLO program (MLIR text ``str`` or bytecode ``bytes``) and load it.

        Args:
          computation: the program.
          executable_devices: the devices it runs on; with several and no ``compile_options``,
            the program is compiled as an SPMD program partitioned over them in this order
            (or, with ``replicated``, as one replica per device).
          compile_options: a [`CompileOptions`][pjrt.compile_options.CompileOptions]; when given, its
            device assignment wins over ``executable_devices``. Older jaxlib took the options
            as the second argument; a `CompileOptions` there is taken as ``compile_options``.
          replicated: run one copy of the program per device, each on its own slice of the
            data (pmap-style), instead of partitioning it.
          isolate: compile in a worker process first, so that a compiler crash on a damaged
            program is an error here, not the end of this process (it raises
            ``pjrt.program.IsolatedCompileCrash``); None: as ``PJRT_ISOLATED_COMPILE`` says.

        Returns:
          A [`LoadedExecutable`][pjrt.executable.LoadedExecutable].
        """
        # Imported here, as the compiler is: a process that only makes a client and moves
        # arrays never loads them (nor numpy, which the option messages use).
        from ._compile.pipeline import compile_program
        from ._compile.program_facts import read_program
        from .compile_options import CompileOptions

        if isinstance(executable_devices, CompileOptions):
            if compile_options is not None:
                raise TypeError("compile options given twice: as the second argument (where "
                                "the devices go) and as compile_options; pass them once")
            executable_devices, compile_options = None, executable_devices
        return compile_program(self, read_program(computation), executable_devices,
                               compile_options, replicated=replicated, isolate=isolate)

    #: Another name for `compile_and_load`. (jaxlib's ``Client.compile`` returns an
    #: executable that is not yet loaded; pjrt has no such type, so prefer the explicit name.)
    compile = compile_and_load

    def serialize_executable(self, executable: LoadedExecutable) -> bytes:
        """``executable.serialize()`` (jaxlib's name on the client): bytes that
        `deserialize_executable` loads again with this plugin build."""
        return executable.serialize()

    def deserialize_executable(self, serialized: bytes,
                               compile_options: CompileOptions | None = None, *,
                               trust_unverified: bool = False,
                               isolate: bool | None = None) -> LoadedExecutable:
        """Load an executable produced by ``LoadedExecutable.serialize()`` with this plugin.

        ``trust_unverified``: you vouch that ``serialized`` was produced by this exact plugin
        build (needed for bytes that do not say which build made them). The plugin then
        trusts the bytes too: damaged ones can crash the process or run a wrong program.
        ``isolate``: load them in a worker process first, so that a crash there is an error
        here (``pjrt.program.IsolatedCompileCrash``); None: as ``PJRT_ISOLATED_COMPILE`` says.

        Raises:
          IncompatibleExecutableError: another plugin build made the executable, or the
            bytes do not say which did.
          ValueError: the serialized executable is truncated or damaged.
        """
        from ._compile.pipeline import deserialize_executable

        return deserialize_executable(self, serialized, compile_options,
                                      trust_unverified=trust_unverified, isolate=isolate)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Free every array and executable made through this client, then the client.

        Idempotent. Using the client or its arrays afterwards raises ClosedClientError.
        """
        from ._capi.transfer_manager import close_managers_of

        if self._handle.generation != fork_generation():
            # The parent's client, in a forked child: closed by the fork, and nothing of it is
            # freed here. Checked first: a thread of the parent may have held the locks below.
            _live_clients.discard(self)
            return
        handler_launches.close_stand_ins(self)  # clients of its own, made for handlers
        with self._lock:
            _live_clients.discard(self)
            # Transfer managers refer to the client in the plugin: they go first.
            close_managers_of(self._handle)
            self._handle.close()

    @property
    def is_closed(self) -> bool:
        return self._handle.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self) -> str:
        return (f"Client(platform={self.platform!r}, devices={len(self._devices)}, "
                f"plugin={self.plugin.name!r})")


def make_c_api_client(plugin_name: str, options: Mapping[str, OptionValue] | None = None,
                      distributed_client=None, transfer_server_factory=None) -> Client:
    """Create a client of the loaded plugin ``plugin_name``.

    Args:
      plugin_name: a name given to ``load_pjrt_plugin_dynamically``.
      options: create options for the plugin, e.g. ``{"cpu_device_count": 8}``; values are
        str, int, float, bool or a list of ints.
      distributed_client: a [`KeyValueStore`][pjrt.kv_store.KeyValueStore] or jax's
        ``DistributedRuntimeClient``: makes a multi-process client whose plugin exchanges
        its topology through it (see [`create_client`][pjrt.client.create_client]). None: the store of
        [`pjrt.distributed.initialize`][pjrt.distributed.initialize] when it was called, else a single-process client.
      transfer_server_factory: not supported; passing one raises NotImplementedError.

    Raises:
      KeyError: no plugin of that name is loaded.
      TypeError: an option has a value of a type options cannot take, or a known option
        (XLA's own, or one the plugin declares in ``Plugin.option_types``) has a value of the
        wrong type; the message names the key.
      XlaRuntimeError: the plugin refused to create a client (its message is kept).
      UnsupportedFeatureError: a client spanning processes, of a plugin that cannot span
        processes (one that does not declare ``node_id`` and ``num_nodes``).
    """
    if transfer_server_factory is not None:
        raise NotImplementedError("transfer servers (cross-host device-to-device transfers) are "
                                  "not supported by pjrt")
    return create_client(plugin_module.get_plugin(plugin_name), options,
                         distributed_client=distributed_client)


#: plugin -> the fork generation in which it made its first client.
_plugin_generations: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check_not_inherited(plugin: plugin_module.Plugin) -> None:
    """Refuse a client of a plugin that already runs clients in the parent of a fork: the
    plugin's threads and locks did not survive the fork, so it would hang or abort."""
    generation = _plugin_generations.setdefault(plugin, fork_generation())
    if generation != fork_generation():
        raise RuntimeError(
            f"plugin {plugin.name!r} made a client in the parent process before os.fork(); it "
            f"cannot make another in the forked child (its threads and locks were not copied). "
            f"Start worker processes with the 'spawn' or 'forkserver' method, or fork before "
            f"creating any client")


def create_client(plugin: plugin_module.Plugin,
                  options: Mapping[str, OptionValue] | None = None, *,
                  distributed_client=None) -> Client:
    """Initialise ``plugin`` if needed and create a client of it (see make_c_api_client).

    With a ``distributed_client``, or after [`pjrt.distributed.initialize`][pjrt.distributed.initialize], the plugin
    gets the key-value callbacks and, when it declares them, the options ``node_id``,
    ``num_nodes`` and ``visible_devices`` (see `pjrt._distributed.multiprocess.multiprocess_options`).
    """
    callbacks = None
    if distributed_client is not None or distributed.is_initialized():
        from ._distributed import multiprocess

        options, callbacks = multiprocess.prepare(plugin, options, distributed_client)
    checked = check_option_types(options, {**XLA_OPTION_TYPES, **plugin.option_types})
    check_option_values(checked)
    named = NamedValues(checked)
    _check_not_inherited(plugin)
    vendor_quirks.prepare(plugin)
    api = plugin.api
    for function in REQUIRED_FUNCTIONS:
        api.require(function, why="pjrt cannot manage buffers without it")
    args = api.new_args("PJRT_Client_Create_Args")
    args.create_options = named.array
    args.num_options = named.count
    if callbacks is not None:
        callbacks.fill(args)
    report_stage = startup.stage_reporter()

    def create():
        if not plugin.initialized:
            report_stage(f"initialising plugin {plugin.name!r} (PJRT_Plugin_Initialize)")
            plugin.initialize()
        report_stage(f"creating a client of plugin {plugin.name!r} (PJRT_Client_Create)")
        api.call("PJRT_Client_Create", args)
        return args.client

    def close_late(pointer) -> None:
        # The caller was interrupted: nobody will use this client, so it is freed here, on
        # the worker (the callbacks stay alive until it is gone).
        late = ClientHandle(api, pointer)
        late.keep_alive = callbacks
        late.close()

    # Refused before the plugin is asked when it could not start its threads (it aborts then).
    memory_headroom.check_threads(plugin.name, checked.get("cpu_device_count"))
    memory_headroom.check_client(plugin.name, checked.get("cpu_device_count"))
    # On a worker thread, so that Ctrl-C reaches the caller while the plugin starts up.
    # Plugins print while they start (cuInit failing, libtpu's environment): quiet by
    # default, as when the registry brings a backend up (pjrt._loading.plugin_logging.quietly).
    # (The key-value callbacks then run on the worker too, so Ctrl-C reaches this thread as a
    # KeyboardInterrupt while it waits, never the plugin's error for a cancelled get.)
    with plugin_logging.quietly(plugin.name):
        pointer = call_off_thread(create, close_late)
    handle = ClientHandle(api, pointer)
    # The plugin may call the callbacks for as long as its client lives.
    handle.keep_alive = callbacks
    client = Client(plugin, handle)
    client.create_options = checked
    plugin_module.notify_client_created(client)
    return client


# A custom-call handler's launch on its own program's device runs on a client like this one
# (`pjrt._runtime.handler_launches`, which lies below the client and cannot make one).
handler_launches.make_client_like = (
    lambda client: create_client(client.plugin, client.create_options))
