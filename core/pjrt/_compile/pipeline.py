"""The compile pipeline: a program and devices in, a [`LoadedExecutable`][pjrt.executable.LoadedExecutable] out.

Its input is a program read once (`pjrt._compile.program_facts.read_program`): ``main``'s
sharding annotations choose the compile options of an SPMD program, its declared result
shapes let the executable tell an unevenly sharded output from an even one, its bytes key the
compilation cache and become the ``PJRT_Program``. Every static tensor type in a text program
is checked against the largest extent a plugin can address before the plugin's compiler sees
it (XLA aborts the process on an overflowing extent); so are its sharding annotations and its
call graph (`pjrt._compile.program_checks`). Of a bytecode program, the container is checked
(`pjrt._wire.mlir_bytecode`). With ``isolate`` (or ``PJRT_ISOLATED_COMPILE=1``) the program
is compiled in a worker process first (`pjrt._compile.isolated_compile`).
Compilation itself runs on a thread with a large stack (deeply nested programs recurse deeply
in XLA's compiler) while the caller waits where Ctrl-C reaches it.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .. import compilation_cache
from .._runtime import serialization
from . import isolated_compile
from .._capi import handles
from .._runtime import memory_headroom
from .._capi.api import Api
from .._profiling import recorder
from .._wire import mlir_bytecode
from .._wire.shape_extents import check_extents, extents_overflow
from . import program_checks
from .._pjrt_cffi import ffi
from ..compile_options import CompileOptions, DeviceAssignment
from ..errors import IncompatibleExecutableError, XlaRuntimeError
from ..executable import LoadedExecutable
from .program_facts import MAIN_ARGUMENTS, ProgramFacts
from .target_preparation import prepare_targets
from .._capi.off_thread import run_on_compile_thread

if TYPE_CHECKING:
    from ..device import ClientView, Device


def default_compile_options(devices: Sequence["Device"], program: ProgramFacts, *,
                            replicated: bool = False) -> CompileOptions:
    """Options for running ``program`` on ``devices``: one device, SPMD over all of them, or
    (``replicated``) one copy of the program per device, each on its own data."""
    options = CompileOptions()
    build = options.executable_build_options
    ids = [d.id for d in devices]
    if replicated:
        build.num_replicas = len(devices)
        build.num_partitions = 1
        build.device_assignment = DeviceAssignment.create(np.array(ids, np.int64).reshape(-1, 1))
        return options
    build.num_replicas = 1
    build.num_partitions = len(devices)
    if len(devices) > 1:
        build.use_spmd_partitioning = True
        build.use_shardy_partitioner = program.uses_shardy
        # As jax does: let the partitioner choose the layout of arguments and results the
        # program leaves unannotated (XLA keeps them replicated otherwise, under GSPMD). A
        # program whose signature is unknown (bytecode) keeps XLA's defaults.
        inputs, outputs = program.unannotated()
        if any(inputs):
            build.allow_spmd_sharding_propagation_to_parameters = inputs
        if any(outputs):
            build.allow_spmd_sharding_propagation_to_output = outputs
    build.device_assignment = DeviceAssignment.create(np.array([ids], dtype=np.int64))
    return options


#: XLA options jaxlib compiles every CPU program with where XLA's own default differs, so that
#: pjrt's programs compute what jax's do: min and max propagate NaN (XLA's CPU default,
#: "fast min/max", returns the other operand: max(nan, 1) is 1 there, nan in jax).
JAX_CPU_DEFAULTS = (("xla_cpu_enable_fast_min_max", False),)

#: The first PJRT C API minor version of XLA's CPU plugin whose XNNPACK fusions give right
#: answers. Older builds (xla-cpu-pjrt 0.0.1 speaks 0.81) keep the weights a dot packed at its
#: last call and reuse them whenever the weight's buffer has the same address, whatever its
#: values now: an Array freed and another placed where it was, or a numpy argument copied into
#: recycled memory, gets the old weights' product (benchmarks/README.md, "Real models"). On
#: them pjrt compiles without XNNPACK unless the caller chose (`XNNPACK_OFF`).
XNNPACK_RIGHT_FROM_MINOR = 106
XNNPACK_OFF = ("xla_cpu_use_xnnpack", False)


def serialize_with_jax_defaults(platform: str, options: CompileOptions,
                                api_minor: int | None = None) -> bytes:
    """``options`` serialised with `JAX_CPU_DEFAULTS` on the CPU for each option the caller
    left unset (neither a ``debug_options`` field nor an ``env_option_overrides`` entry), and
    with `XNNPACK_OFF` on a CPU plugin older than `XNNPACK_RIGHT_FROM_MINOR` (``api_minor``:
    the plugin's PJRT C API minor version, when known) unless the caller set it; ``options``
    itself is left as it was."""
    if platform != "cpu":
        return options.SerializeAsString()
    debug = options.executable_build_options.debug_options
    given_overrides = list(options.env_option_overrides)
    chosen = {key for key, _ in given_overrides}
    filled = [name for name, _ in JAX_CPU_DEFAULTS
              if name not in chosen and getattr(debug, name) is None]
    xnnpack_off = (api_minor is not None and api_minor < XNNPACK_RIGHT_FROM_MINOR
                   and XNNPACK_OFF[0] not in chosen)
    if not filled and not xnnpack_off:
        return options.SerializeAsString()
    defaults = dict(JAX_CPU_DEFAULTS)
    try:
        for name in filled:
            setattr(debug, name, defaults[name])
        if xnnpack_off:
            options.env_option_overrides = given_overrides + [XNNPACK_OFF]
        return options.SerializeAsString()
    finally:
        for name in filled:
            setattr(debug, name, None)
        if xnnpack_off:
            options.env_option_overrides = given_overrides


#: A static tensor type in program text: its dimensions and its element type.
_STATIC_TENSOR = re.compile(rb"tensor<((?:\d+x)+)(complex<\w+>|\w+)")
#: An element type's bit width, from its name: ``i1``, ``ui4``, ``f32``, ``bf16``, ``f8E4M3FN``.
_ELEMENT_BITS = re.compile(rb"(?:[su]?i|ui|f|bf)(\d+)(?:E\w*)?")


def _element_bytes(element: bytes) -> int:
    """An element type's byte width as XLA counts it (a byte for types below one; 16, the
    widest, for a type it does not know)."""
    complex_part = element.startswith(b"complex<")
    match = _ELEMENT_BITS.fullmatch(element[8:-1] if complex_part else element)
    if match is None:
        return 16
    width = max(1, -(-int(match.group(1)) // 8))
    return 2 * width if complex_part else width


def check_static_extents(program: bytes) -> None:
    """Refuse a text program with a static tensor type that XLA cannot hold: the element's
    byte width times the extents, multiplied in order, must fit in int64 at every step
    (`pjrt._wire.shape_extents`: so ``tensor<3x2305843009213693952x0xf32>`` is refused though it
    holds nothing).

    XLA makes each shape it reads with that rule and, in a plugin's compile, aborts the process
    where it fails (in a function's signature, or any type its optimiser keeps), so the check
    is made here, on every static tensor type of the text, where it can be an exception.

    Raises:
      ValueError: naming the tensor type, the extent at which the product overflows, and the
        rule.
    """
    seen = set()
    for match in _STATIC_TENSOR.finditer(program):
        if match.group(0) in seen:
            continue  # a program repeats few types many times: each is sized once
        seen.add(match.group(0))
        dims = [int(d) for d in match.group(1)[:-1].split(b"x")]
        element_bytes = _element_bytes(match.group(2))
        if extents_overflow(dims, element_bytes) is not None:
            text = match.group(0).decode("ascii", "replace")
            line = program.count(b"\n", 0, match.start()) + 1
            check_extents(dims, element_bytes, f"the program's {text}> (line {line})")


#: The custom calls jax lowers host callbacks to (``jax.debug.print``, ``pure_callback``,
#: ``io_callback``, equinox's runtime checks): FFI (and older) handlers that jaxlib registers
#: in its own process, and whose operands name an entry of that process's callback table.
_HOST_CALLBACK = re.compile(
    rb"xla_(?:ffi_|buffer_)?(?:partitioned_)?python_(?:cpu|gpu)_callback")


def check_host_callbacks(program: bytes) -> None:
    """Refuse a program that calls back into the Python process that lowered it.

    Raises:
      ValueError: naming the callback custom call and why it cannot run here.
    """
    match = _HOST_CALLBACK.search(program)
    if match is not None:
        name = match.group(0).decode("ascii")
        raise ValueError(
            f"the program calls the host callback {name!r} (jax.debug.print, "
            f"jax.pure_callback, io_callback or a runtime check lower to it): its handler and "
            f"the Python function it calls live in the jax process that lowered the program, "
            f"so it cannot run outside that process. Remove the callback before exporting "
            f"(or run the program with jax)")


def check_static_signature(program: bytes) -> None:
    """Refuse a text program whose ``main`` takes arrays of unknown (``?``) dimensions.

    jax specialises a shape-polymorphic module to the actual shapes (StableHLO shape
    refinement) before compiling it; PJRT plugins compile what they are given and cannot
    translate the dynamic operations such a module keeps.

    Raises:
      ValueError: naming the arguments and how to export with concrete shapes.
    """
    match = MAIN_ARGUMENTS.search(program)
    _check_static_arguments(match.group(1) if match is not None else None)


def _check_static_arguments(main_arguments: bytes | None) -> None:
    if main_arguments is None or b"?" not in main_arguments:
        return
    dynamic = re.findall(rb"(%\w+)\s*:\s*(tensor<[^>]*\?[^>]*>)", main_arguments)
    listed = ", ".join(f"{n.decode()}: {t.decode()}" for n, t in dynamic) or "some arguments"
    raise ValueError(
        f"main takes arrays of symbolic (shape-polymorphic) dimensions ({listed}); jax "
        f"refines such a module to the actual shapes before compiling, which PJRT plugins do "
        f"not do. Export or lower it with concrete shapes (jax.ShapeDtypeStruct((8, 784), ...) "
        f"instead of jax.export.symbolic_shape(...)), once per shape you need")


def check_contents(program: ProgramFacts) -> None:
    """The checks that do not depend on the devices: static extents, host callbacks, symbolic
    dimensions of ``main`` (see each).

    Raises:
      ValueError: naming what the program holds that no plugin can compile.
    """
    check_static_extents(program.code)
    check_host_callbacks(program.code)
    _check_static_arguments(program.main_arguments)


def check_structure(program: ProgramFacts, partitions: int) -> None:
    """What pjrt can check of a program's structure before the plugin's compiler, which ends
    the process on some damage: shardings and recursion in text
    (`pjrt._compile.program_checks`), the container of bytecode (`pjrt._wire.mlir_bytecode`).

    Raises:
      ValueError: naming the damage.
    """
    if program.is_bytecode:
        mlir_bytecode.check_container(program.code)
    else:
        program_checks.check_program_structure(program.code, max(int(partitions), 1),
                                               program.signature)


def _check_devices(client: "ClientView", devices: Sequence["Device"]) -> list:
    devices = list(devices)
    if not devices:
        raise ValueError("executable_devices is empty; pass at least one device")
    seen = set()
    for device in devices:
        if getattr(device, "client", None) is not client:
            raise ValueError(f"{device!r} is not a device of this {client.platform} client")
        if device in seen:
            raise ValueError(f"{device} appears twice in executable_devices")
        seen.add(device)
    return devices


def compile_program(client: "ClientView", program: ProgramFacts, executable_devices=None,
                    compile_options: CompileOptions | None = None, *,
                    replicated: bool = False, isolate: bool | None = None
                    ) -> "LoadedExecutable":
    """Compile and load a program read by `read_program`: the one compile behind
    [`Client.compile_and_load`][pjrt.client.Client.compile_and_load] and
    [`pjrt.compile`][pjrt.program.compile] (see the former for the arguments). The checks,
    the compile options, the cache key, the ``PJRT_Program`` and the executable's declared
    result shapes all come from ``program``."""
    if recorder.active:  # a trace records the compile (pjrt.profiler)
        return _traced_compile(client, program, executable_devices, compile_options,
                               replicated, isolate)
    return _compile(client, program, executable_devices, compile_options, replicated, isolate)


def _traced_compile(client: "ClientView", program: ProgramFacts, executable_devices,
                    compile_options: CompileOptions | None, replicated: bool,
                    isolate: bool | None) -> "LoadedExecutable":
    """`compile_program` as one event of the running trace: the program's name and devices,
    and what the compilation cache said (``off`` when none is used; the cache marks ``hit`` or
    ``miss`` on the event)."""
    with recorder.Span("compile", "compile", {"platform": client.platform,
                                              "cache": "off"}) as span:
        executable = _compile(client, program, executable_devices, compile_options,
                              replicated, isolate)
        name, devices = recorder.executable_label(executable)
        span.name = f"compile {name}"
        span.args.update(program=name, devices=devices)
        return executable


def _compile(client: "ClientView", program: ProgramFacts, executable_devices,
             compile_options: CompileOptions | None, replicated: bool,
             isolate: bool | None) -> "LoadedExecutable":
    check_contents(program)
    handle = client.handle
    devices = None
    if compile_options is None:
        devices = _check_devices(client, executable_devices or client.local_devices()[:1])
        compile_options = default_compile_options(devices, program, replicated=replicated)
    elif compile_options.device_assignment is None and executable_devices:
        devices = _check_devices(client, executable_devices)
        build = compile_options.executable_build_options
        replicas, partitions = build.num_replicas, build.num_partitions
        if replicas * partitions != len(devices):
            raise ValueError(f"compile options ask for {replicas} replicas x {partitions} "
                             f"partitions but {len(devices)} devices were given")
        ids = np.array([d.id for d in devices], dtype=np.int64).reshape(replicas, partitions)
        build.device_assignment = DeviceAssignment.create(ids)
    elif executable_devices:
        # Both name the devices: they must agree, or the caller would get another placement
        # than the one asked for without a word.
        given = [d.id for d in _check_devices(client, executable_devices)]
        assigned = [int(i) for i in
                    np.asarray(compile_options.device_assignment.device_ids).reshape(-1)]
        if given != assigned:
            raise ValueError(f"executable_devices (ids {given}) and the device assignment in "
                             f"compile_options (ids {assigned}) disagree; pass one of them")
    check_structure(program, compile_options.executable_build_options.num_partitions)
    serialized_options = serialize_with_jax_defaults(client.platform, compile_options,
                                                    client.plugin.api_version[1])
    declared = program.result_shapes
    prepare_targets(client.platform, program.code)

    cache, cache_key = _cache_entry(client, program, serialized_options)
    if cache_key is not None:
        cached = _load_cached(client, cache, cache_key, declared)
        if cached is not None:
            return cached
    if isolated_compile.isolation_requested(isolate):
        isolated_compile.check_in_worker(client, "compile", program.code, serialized_options)

    api = handle.api
    program_struct, keepalive = program_argument(program)
    options_buffer = ffi.new("char[]", serialized_options)
    args = api.new_args("PJRT_Client_Compile_Args")
    args.program = program_struct
    args.compile_options = options_buffer
    args.compile_options_size = len(serialized_options)

    def compile_on_worker(held=(keepalive, options_buffer)):  # kept until the plugin ends
        args.client = handle.pointer
        api.call("PJRT_Client_Compile", args)
        return args.executable

    memory_headroom.check_compile(api)
    ticket = handle.begin()
    # On a thread with a large stack, so that deeply nested programs do not overflow it, and
    # so that Ctrl-C interrupts the wait; an abandoned result is freed on the worker.
    pointer = run_on_compile_thread(handle, ticket, compile_on_worker,
                                    lambda loaded: handles.destroy_loaded_executable(api, loaded))
    memory_headroom.note_compiled(api)
    try:
        del keepalive
        executable = LoadedExecutable(client, pointer, declared_output_shapes=declared,
                                      global_devices=devices)
    finally:
        handle.end(ticket)
    if cache_key is not None:
        _store(executable, cache, cache_key)
    return executable


def _cache_entry(client: "ClientView", program: ProgramFacts, serialized_options: bytes) -> tuple:
    """The persistent cache in use and this compile's key in it; (None, None) when there is
    no cache or the plugin's build cannot be identified (handed over in memory)."""
    cache = compilation_cache.get_compilation_cache()
    if cache is None:
        return None, None
    try:
        identity = serialization.plugin_identity(client.plugin, client.platform,
                                                 client.platform_version)
    except OSError:
        return None, None
    if not identity.verifiable:
        return None, None
    # The device ids compiled for are in the options; the kinds and the count of the client's
    # devices are what the plugin may also tune the code to.
    devices = client.devices()
    described = f"{len(devices)} devices: {sorted({d.device_kind for d in devices})}"
    return cache, cache.key(program.code, serialized_options, identity, described)


def _load_cached(client, cache, key: str, declared) -> LoadedExecutable | None:
    blob = cache.get(key)
    if blob is None:
        return None
    try:
        return deserialize_executable(client, blob, declared_output_shapes=declared,
                                      targets_prepared=True)
    except (IncompatibleExecutableError, ValueError, XlaRuntimeError) as error:
        compilation_cache.logger.warning(
            "compilation cache entry %s cannot be loaded (%s); compiling again", key[:16],
            error)
        cache.discard(key)
        return None


def _store(executable: LoadedExecutable, cache, key: str) -> None:
    try:
        blob = executable.serialize()
    except XlaRuntimeError as error:  # plugins that cannot serialize: nothing to keep
        compilation_cache.logger.debug("compilation cache: not stored (%s)", error)
        return
    cache.put(key, blob)


def program_argument(program: ProgramFacts) -> tuple:
    """A ``PJRT_Program*`` for a program read by `read_program`, and the memory it points
    into (to be kept until the plugin's call returns)."""
    program_struct = Api.new_args("PJRT_Program")  # zero-filled, struct_size set
    code = ffi.new("char[]", program.code)
    program_struct.code = code
    program_struct.code_size = len(program.code)
    encoded_format = program.format.encode("ascii")
    program_format = ffi.new("char[]", encoded_format)
    program_struct.format = program_format
    program_struct.format_size = len(encoded_format)
    return program_struct, (code, program_format)


def deserialize_executable(client: "ClientView", serialized: bytes,
                           compile_options: CompileOptions | None = None, *,
                           trust_unverified: bool = False,
                           declared_output_shapes=None,
                           targets_prepared: bool = False,
                           isolate: bool | None = None) -> LoadedExecutable:
    """Load an executable serialised by [`LoadedExecutable.serialize`][pjrt.executable.LoadedExecutable.serialize].

    ``trust_unverified``: you vouch that ``serialized`` was produced by this exact plugin
    build; bytes without pjrt's envelope are then handed to the plugin as they are, and the
    plugin trusts them: damaged or hostile bytes can crash the process or run a wrong
    program. For bytes you did not make, load with ``isolate=True`` (a crash is then an
    error) and never with ``trust_unverified``.
    ``isolate``: deserialize in a worker process first (see `pjrt._compile.isolated_compile`);
    None: as ``PJRT_ISOLATED_COMPILE`` says.
    ``targets_prepared``: the custom-call targets the program calls are known to be set up
    (see [`pjrt.ffi.register_target_preparation`][pjrt.ffi.register_target_preparation]); otherwise every pending set-up for
    the platform runs first, since the program cannot be read.

    Raises:
      IncompatibleExecutableError: another plugin build made the executable, or the bytes do
        not say which did (see `pjrt._runtime.serialization.unpack`).
      ValueError: the serialized executable is truncated or damaged.
    """
    api = client.raw_handle.api
    if not targets_prepared:
        prepare_targets(client.platform, None)
    serialized = serialization.unpack(
        serialized, serialization.plugin_identity(client.plugin, client.platform,
                                                  client.platform_version),
        trust_unverified=trust_unverified)
    if isolated_compile.isolation_requested(isolate):
        isolated_compile.check_in_worker(
            client, "deserialize", serialized,
            compile_options.SerializeAsString() if compile_options is not None else b"")
    data = ffi.new("char[]", serialized)
    args = api.new_args("PJRT_Executable_DeserializeAndLoad_Args")
    args.serialized_executable = data
    args.serialized_executable_size = len(serialized)
    if compile_options is not None:
        options = compile_options.SerializeAsString()
        options_buffer = ffi.new("char[]", options)
        args.overridden_serialized_compile_options = options_buffer
        args.overridden_serialized_compile_options_size = len(options)
    with client.raw_handle.calling() as handle:
        args.client = handle.pointer
        api.call("PJRT_Executable_DeserializeAndLoad", args)
        return LoadedExecutable(client, args.loaded_executable,
                                declared_output_shapes=declared_output_shapes)
