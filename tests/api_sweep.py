"""The walk of tests/test_api_sweep.py, run in a child interpreter: every public callable of
every public class and of the package, called with edge values (0, negative, huge, empty, None,
wrong types). A call may return or raise an ``Exception``; nothing may end the process.

``python tests/api_sweep.py PLUGIN_LIBRARY GROUP`` walks one group (see `GROUPS`) and prints a
line before each call (``CALL name(args)``), flushed, so that the parent can name the call a
crash happened in; the last line is ``DONE n`` with the number of calls made.
"""
from __future__ import annotations

import inspect
import itertools
import sys
import warnings

import numpy as np

import pjrt

#: Values each parameter is tried with, alone and in every parameter at once.
EDGES = (0, -1, 1, 2, 2**31, 2**63, -2**63, 2**64, 1e308, float("nan"), None, "", "x",
         [], [0], [-1], [2**63], (), (0,), {}, {"x": -1}, b"", object(), np.int64(-1),
         np.zeros((0,), np.float32), np.float32(0.5))

#: Methods that end the object they are called on: called last, once each walk is done.
ENDING = {"close", "delete", "release", "clear_backends"}

#: Public callables that wait on something outside the process (a coordinator, other
#: processes, a network store) or start other processes; their bad-input checks are tested
#: in their own modules.
OUTSIDE = {"initialize", "launch", "make_array_from_process_local_data", "set_platforms",
           "set_compilation_cache_dir"}

TINY = """func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.tanh %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def objects(library: str) -> dict:
    """The public objects of each kind, made on a client of the plugin at ``library``."""
    pjrt.load_pjrt_plugin_dynamically("sweep", library)
    client = pjrt.make_c_api_client("sweep", {"cpu_device_count": 2})
    device = client.devices()[0]
    executable = client.compile_and_load(TINY, [device])
    array = client.buffer_from_pyval(np.arange(4, dtype=np.float32), device)
    mesh = pjrt.Mesh(np.array(client.devices()), ("x",))
    found = {
        "client": client, "device": device, "memory": device.default_memory(),
        "executable": executable, "array": array, "mesh": mesh,
        "named_sharding": pjrt.NamedSharding(mesh, pjrt.P("x")),
        "single_sharding": pjrt.SingleDeviceSharding(device),
        "partition_spec": pjrt.P("x"), "device_list": pjrt.DeviceList(tuple(client.devices())),
        "compile_options": pjrt.CompileOptions(),
        "compiled_program": pjrt.compile(TINY, device),
        "plugin": pjrt.get_plugin("sweep"),
    }
    global_array = pjrt.device_put(np.arange(8, dtype=np.float32), found["named_sharding"])
    found["global_array"] = global_array
    found["shard"] = global_array.addressable_shards[0]
    for name, make in (("layout", lambda: client.get_default_layout(np.float32, (4,))),
                       ("format", lambda: array.format)):
        try:
            found[name] = make()
        except Exception:  # noqa: BLE001 - a plugin without layouts
            pass
    return found


def public_callables(obj, constructors: bool = False) -> list[tuple[str, object]]:
    """The public callables of ``obj``; its public classes too, with ``constructors`` (a
    module's classes are called as constructors)."""
    names = []
    for name in dir(obj):
        if name.startswith("_") or name in OUTSIDE:
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001 - a property that raises is an answer too
            continue
        if callable(value) and (constructors or not inspect.isclass(value)):
            if inspect.isclass(value) and issubclass(value, BaseException):
                continue  # an exception's constructor takes anything, by design
            names.append((name, value))
    return names


def argument_sets(function) -> list[tuple[tuple, dict]]:
    """Edge values for each parameter of ``function`` alone, and in all at once."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return [((value,), {}) for value in EDGES] + [((), {})]
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p for p in signature.parameters.values() if p.kind == p.KEYWORD_ONLY]
    sets: list[tuple[tuple, dict]] = [((), {})]
    for value in EDGES:
        sets.append((tuple(value for _ in positional), {}))
        for index in range(len(positional)):
            sets.append(((value,) * (index + 1), {}))
        for parameter in keyword:
            sets.append(((), {parameter.name: value}))
    return sets


def call(label: str, function, args: tuple, kwargs: dict, counter) -> None:
    shown = ", ".join([*(_short(a) for a in args), *(f"{k}={_short(v)}" for k, v in kwargs.items())])
    print(f"CALL {label}({shown})", flush=True)
    next(counter)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            function(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an exception is a fine answer to a bad value
        pass


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."


def walk(found: dict, group: str) -> int:
    counter = itertools.count()
    ending = []
    targets = [(name, found[name]) for name in GROUPS[group] if name in found]
    if group == "package":
        from pjrt import xla_client

        targets = [("pjrt", pjrt), ("xla_client", xla_client)]
    if group == "options":
        return walk_compile_options(found, counter)
    for kind, obj in targets:
        for name, function in public_callables(obj, constructors=group == "package"):
            if name in ENDING:
                ending.append((f"{kind}.{name}", function))
                continue
            for args, kwargs in argument_sets(function):
                call(f"{kind}.{name}", function, args, kwargs, counter)
    for label, function in ending:
        for args, kwargs in argument_sets(function):
            call(label, function, args, kwargs, counter)
    return next(counter)


def walk_compile_options(found: dict, counter) -> int:
    """Every settable field of CompileOptions and its build options set to each edge value;
    each value accepted is compiled with, on the client."""
    client, device = found["client"], found["device"]
    for owner_name in ("options", "build_options"):
        probe = pjrt.CompileOptions()
        owner = probe if owner_name == "options" else probe.executable_build_options
        fields = [name for name in dir(owner) if not name.startswith("_")
                  and not name.isupper() and not callable(getattr(owner, name, None))]
        for field in fields:
            for value in EDGES:
                options = pjrt.CompileOptions()
                target = options if owner_name == "options" else options.executable_build_options
                try:
                    setattr(target, field, value)
                except Exception:  # noqa: BLE001 - refused when set: fine
                    continue
                call(f"compile with {owner_name}.{field}={_short(value)}",
                     client.compile_and_load, (TINY, [device]), {"compile_options": options},
                     counter)
    return next(counter)


#: Which objects each child walks (a crash in one names its group).
GROUPS = {
    "client": ["client"],
    "devices": ["device", "memory", "device_list", "plugin"],
    "arrays": ["array"],
    "executables": ["executable", "compiled_program", "compile_options"],
    "shardings": ["mesh", "named_sharding", "single_sharding", "partition_spec", "layout",
                  "format"],
    "global_arrays": ["global_array", "shard"],
    "options": [],
    "package": [],
}


if __name__ == "__main__":
    library, group = sys.argv[1], sys.argv[2]
    print(f"DONE {walk(objects(library), group)}", flush=True)
