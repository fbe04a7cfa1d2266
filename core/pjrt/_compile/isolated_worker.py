"""The isolation worker: the child process behind crash-isolated compilation.

`pjrt._compile.isolated_compile` starts it as `python -c "from pjrt._compile.isolated_worker import serve; ..."`
with two pipe descriptors and its own pid; the worker ends when that process does (a killed
parent leaves no worker behind, even one busy in a compile). It loads the plugin and makes a client as told, then compiles or
deserializes each request exactly as the parent will, and answers with None or the plugin's
error. If the plugin's compiler crashes on a program, this process dies instead of the
parent, which reads how it ended. Nothing in the package imports this module: it is the
worker's entry point only, so it may import the client layers freely.
"""
from __future__ import annotations

import re
import threading

from .. import compilation_cache
from .parent_watch import end_with_parent
from .._wire import mlir_bytecode
from .._pjrt_cffi import ffi
from ..client import make_c_api_client
from ..errors import ErrorCode, XlaRuntimeError
from ..executable import LoadedExecutable
from ..ffi import register_custom_call_target
from .isolated_compile import receive_message, send_message
from ..plugin import load_pjrt_plugin_dynamically
from .pipeline import program_argument
from .program_facts import ProgramFacts, read_program


def serve(read_fd: int, write_fd: int, parent: int | None = None) -> None:
    """The worker's loop: load the plugin and make a client as told, then compile or
    deserialize each request and answer with None or the plugin's error. With ``parent``
    (a pid), the worker ends when that process does."""
    if parent is not None:
        # Not thread-bound: the worker serves whichever thread of the parent compiles next.
        end_with_parent(parent)
    def answer(message: dict) -> None:
        send_message(write_fd, message)

    def read() -> dict | None:
        return receive_message(read_fd)

    compilation_cache.set_compilation_cache_dir(None)
    setup = read()
    if setup is None:
        return
    try:
        load_pjrt_plugin_dynamically(setup["plugin"], setup["library"])
        client = make_c_api_client(setup["plugin"], setup["options"])
    except Exception as error:  # reported to the parent, which raises it with context
        answer({"setup_error": f"{type(error).__name__}: {error}"})
        return
    answer({"ready": True})
    registered: set[str] = set()  # custom-call targets registered here
    api = client.handle.api
    # Deeply nested programs recurse deeply in XLA's compiler: a large stack, as in-process.
    threading.stack_size(1 << 30)
    while True:
        request = read()
        if request is None:
            return
        outcome: dict = {}
        job: dict = request  # bound here: the closure below sees it as a dict

        def work():
            try:
                compile_or_load_with_targets(api, client, job, registered)
                outcome["error"] = None
            except XlaRuntimeError as error:
                outcome["error"] = (int(error.code), error.plugin_message)
            except (ValueError, TypeError) as error:  # a description pjrt cannot read
                outcome["error"] = (3, f"{type(error).__name__}: {error}")

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        answer(outcome)


def _never_run(operands, results, attributes):
    """The handler of every custom-call target in the worker: compiling needs only the
    target's name, and the worker runs no program."""
    raise RuntimeError("the isolation worker runs no program")


#: A custom-call target named in a text program (``stablehlo.custom_call @target``, or the
#: generic form's ``call_target_name = "target"``).
_TEXT_TARGET = re.compile(rb'custom_call\s*@("(?:[^"\\]|\\.)*"|[\w.$-]+)'
                          rb'|call_target_name\s*=\s*"((?:[^"\\]|\\.)*)"')
#: What a target name looks like; a bytecode program's other strings (locations, numbers,
#: file names) need no registration.
_TARGET_NAME = re.compile(rb"[A-Za-z_][\w.$-]{0,255}")


def named_targets(program: ProgramFacts) -> set[str]:
    """The custom-call targets ``program`` may call: those a text program names, or every
    name-like string of a bytecode program (which cannot be read without MLIR; registering a
    name no custom call uses changes nothing)."""
    if program.is_bytecode:
        try:
            candidates = mlir_bytecode.strings(program.code)
        except ValueError:  # damaged: the plugin's reader will say so
            return set()
    else:
        candidates = [quoted or generic or plain for plain, generic in
                      _TEXT_TARGET.findall(program.code)
                      for quoted in [plain[1:-1] if plain.startswith(b'"') else b""]]
    return {name.decode() for name in candidates if _TARGET_NAME.fullmatch(name)}


def register_targets(platform: str, program: ProgramFacts, registered: set[str]) -> None:
    """Register the custom-call targets ``program`` may call on ``platform`` (those not in
    ``registered``, which is updated) with a handler that is never run, so that the plugin
    here compiles it as the parent's does, where the handlers are registered."""
    for name in named_targets(program) - registered:
        register_custom_call_target(name, _never_run, platform=platform)
        registered.add(name)


#: XLA's error for a custom call whose target is not registered (loading an executable).
_MISSING_TARGET = re.compile(r"No FFI handler registered for (\S+) on a platform")
#: The most targets one serialized executable may need registered here, one load each.
_MAX_LOAD_RETRIES = 64


def compile_or_load_with_targets(api, client, request: dict, registered: set[str]) -> None:
    """Compile or deserialize the request as the parent will, registering the custom-call
    targets it needs first.

    A program's targets are read from it (`named_targets`). A serialized executable's cannot
    be: its bytes hold machine code and many strings. It is loaded, and each target the
    plugin reports missing (a name its bytes hold) is registered before loading it again,
    as the parent, where the handlers are registered, loads it."""
    if request["kind"] == "compile":
        # Read here as the parent read it: the same facts make the same PJRT_Program.
        program = read_program(request["payload"])
        register_targets(client.platform, program, registered)
        compile_and_free(api, client, program, request["options"])
        return
    for _ in range(_MAX_LOAD_RETRIES):
        try:
            load_and_free(api, client, request["payload"], request["options"])
            return
        except XlaRuntimeError as error:
            missing = _MISSING_TARGET.search(error.plugin_message or "")
            name = missing.group(1) if missing else None
            if (error.code != ErrorCode.NOT_FOUND or name is None or name in registered
                    or not _TARGET_NAME.fullmatch(name.encode())
                    or name.encode() not in request["payload"]):
                raise
            register_custom_call_target(name, _never_run, platform=client.platform)
            registered.add(name)
    load_and_free(api, client, request["payload"], request["options"])


def compile_and_free(api, client, program: ProgramFacts, options: bytes) -> None:
    """Compile ``program`` with the serialized compile ``options`` as the parent will, read
    the executable's description as a LoadedExecutable does (damaged executables can crash
    there too), then free it."""
    program_struct, keepalive = program_argument(program)
    options_buffer = ffi.new("char[]", options)
    args = api.new_args("PJRT_Client_Compile_Args")
    args.program = program_struct
    args.compile_options = options_buffer
    args.compile_options_size = len(options)
    args.client = client.handle.pointer
    api.call("PJRT_Client_Compile", args)
    del keepalive, options_buffer
    LoadedExecutable(client, args.executable).delete()


def load_and_free(api, client, serialized: bytes, options: bytes) -> None:
    """Deserialize ``serialized`` (with the serialized compile ``options`` overriding its
    own, when given) as the parent will, read its description, then free it."""
    data = ffi.new("char[]", serialized)
    args = api.new_args("PJRT_Executable_DeserializeAndLoad_Args")
    args.serialized_executable = data
    args.serialized_executable_size = len(serialized)
    if options:
        options_buffer = ffi.new("char[]", options)
        args.overridden_serialized_compile_options = options_buffer
        args.overridden_serialized_compile_options_size = len(options)
    args.client = client.handle.pointer
    api.call("PJRT_Executable_DeserializeAndLoad", args)
    LoadedExecutable(client, args.loaded_executable).delete()
