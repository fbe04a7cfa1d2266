"""A mutation fuzzer over what pjrt compiles and loads: jax exports, MLIR bytecode, sharding
annotations in text and serialized executables, each damaged by deterministic seeds
(``tests/mutations.py``). Each set runs in a child process that compiles every mutation with
crash isolation, and reports how each ended: refused by pjrt's structural checks, refused by
the plugin, crashed the plugin's compiler in the isolation worker, or compiled.

The assertions: the child (which stands for a service loading untrusted programs) survives
every mutation; damage to sharding annotations, which pjrt's checks can read, never reaches a
compiler that crashes on it; damage to a serialized executable never reaches the plugin (the
envelope's checksum refuses it). The plugin's own bytes loaded with ``trust_unverified`` are
not fuzzed here: a damaged executable that loads in the isolation worker can still crash this
process nondeterministically, or when it is freed, so that is no test a process survives (see
docs/threads-and-processes.md). Whether a given mutation crashes a plugin is the plugin's
undefined behaviour, different from one machine to the next, so no assertion here counts on a
crash; the loader crash the isolation must survive is made on purpose, by the fault plugin. ``PJRT_FUZZ_MUTATIONS=N`` runs N mutations per set instead of the
default (a few hundred in all, bounded to well under a minute on two cores).
"""
from __future__ import annotations

import json
import os

import pytest

from conftest import TESTS_DIR, run_python

#: Mutations per set and plugin; the environment variable asks for more.
MUTATIONS = int(os.environ.get("PJRT_FUZZ_MUTATIONS", "24"))
FIXTURES = TESTS_DIR / "fixtures"

_FUZZ = """
import json, sys
import pjrt
from conftest import cpu_plugin_path
from mutations import damage_shardings, flip_bytes
from pjrt._runtime import serialization
from pjrt.exported import deserialize_exported
from pjrt.program import IsolatedCompileCrash

name, kind, count, fixtures = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {"cpu_device_count": 8})
outcomes = {"refused by pjrt": 0, "refused by the plugin": 0, "crashed in the worker": 0,
            "compiled": 0}
crashes = []


def attempt(seed, action):
    try:
        action()
        outcomes["compiled"] += 1
    except IsolatedCompileCrash as crash:
        outcomes["crashed in the worker"] += 1
        crashes.append((seed, crash.signal_name))
    except pjrt.XlaRuntimeError:
        outcomes["refused by the plugin"] += 1
    except ValueError:
        outcomes["refused by pjrt"] += 1


if kind == "export":
    blob = open(f"{fixtures}/models/torch_mlp/exported.bin", "rb").read()
    for seed in range(count):
        damaged = flip_bytes(blob, seed)
        attempt(seed, lambda: pjrt.compile(deserialize_exported(damaged).mlir_module_serialized,
                                           client.devices()[:1], isolate=True))
elif kind == "bytecode":
    blob = open(f"{fixtures}/tiny_tanh.mlirbc", "rb").read()
    for seed in range(count):
        damaged = flip_bytes(blob, seed, skip=4)
        attempt(seed, lambda: client.compile_and_load(damaged, isolate=True))
elif kind == "shardings":
    from test_program_checks import SHARDY_OPS  # Shardy on operations, with sub-axes

    texts = [open(f"{fixtures}/{n}.mlir").read() for n in
             ("spmd_mlp.gspmd", "spmd_mlp.shardy", "spmd_matmul.gspmd", "spmd_matmul.shardy")]
    texts.append(SHARDY_OPS)
    for seed in range(count):
        damaged = damage_shardings(texts[seed % len(texts)], seed)
        attempt(seed, lambda: client.compile_and_load(damaged, client.devices(), isolate=True))
elif kind == "executable":
    # What pjrt writes: the plugin's bytes in an envelope with their checksum.
    made = client.compile_and_load(open(f"{fixtures}/tiny_tanh.mlir").read()).serialize()
    for seed in range(count):
        damaged = flip_bytes(made, seed)
        attempt(seed, lambda: client.deserialize_executable(damaged, isolate=True))
print("OUTCOMES", json.dumps({"outcomes": outcomes, "crashes": crashes}))
"""


def _fuzz(plugin_name: str, kind: str) -> dict:
    done = run_python(_FUZZ, plugin_name, kind, str(MUTATIONS), str(FIXTURES), timeout=600)
    line = [l for l in done.stdout.splitlines() if l.startswith("OUTCOMES ")][-1]
    report = json.loads(line[len("OUTCOMES "):])
    print(f"\n{plugin_name} {kind}: {report['outcomes']} crashes (seed, signal): "
          f"{report['crashes']}")
    assert sum(report["outcomes"].values()) == MUTATIONS
    return report


@pytest.mark.parametrize("kind", ["export", "bytecode", "executable"])
def test_isolated_compiles_survive_damaged_inputs(cpu_plugin, kind):
    report = _fuzz(cpu_plugin.name, kind)
    if kind == "executable":
        # The envelope's checksum refuses every damaged byte before the plugin sees it.
        assert report["outcomes"]["refused by pjrt"] == MUTATIONS, report


def test_damaged_sharding_annotations_never_crash_the_compiler(cpu_plugin):
    report = _fuzz(cpu_plugin.name, "shardings")
    assert report["outcomes"]["crashed in the worker"] == 0, report["crashes"]
    assert report["outcomes"]["refused by pjrt"] > 0


def test_a_crash_in_the_worker_is_an_error_and_the_next_compile_works(built, cpu_plugin):
    """With PJRT_ISOLATED_COMPILE=1, a serialized executable that crashes the plugin's loader
    is an IsolatedCompileCrash naming the signal; the next compile starts a new worker and
    runs. The crash is made on purpose: the fault plugin, delegating to each CPU build, dies
    of SIGSEGV in PJRT_Executable_DeserializeAndLoad (a damaged executable that crashed one
    machine's loader loaded fine on another)."""
    source = """
    import sys
    import numpy as np
    import pjrt
    from pjrt.program import IsolatedCompileCrash

    library, fixtures = sys.argv[1:]
    pjrt.load_pjrt_plugin_dynamically("faulty", library)
    client = pjrt.make_c_api_client("faulty", {"cpu_device_count": 1})
    text = open(f"{fixtures}/tiny_tanh.mlir").read()
    made = client.compile_and_load(text).serialize()
    try:
        client.deserialize_executable(made, trust_unverified=True)
        print("LOADED")
    except IsolatedCompileCrash as crash:
        print("CRASH", crash.signal_name, "|", crash)
    program = pjrt.compile(text, client.devices()[0])
    x = np.full(8, 0.5, np.float32)
    print("RESULT", float(np.asarray(program(x, x))[0]), float(np.tanh(np.float32(1.25))))
    """
    from conftest import child_env, cpu_plugin_path

    environment = child_env(PJRT_ISOLATED_COMPILE="1", PJRT_FAULT="crash_deserialize",
                            PJRT_FAULT_DELEGATE=cpu_plugin_path(cpu_plugin.name))
    done = run_python(source, str(built.fault_plugin), str(FIXTURES), timeout=120,
                      env=environment)
    crash = [l for l in done.stdout.splitlines() if l.startswith("CRASH ")]
    assert crash and crash[0].startswith("CRASH SIGSEGV"), done.stdout + done.stderr[-2000:]
    assert "the plugin's compiler crashed (SIGSEGV" in crash[0], done.stdout
    result = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][0].split()
    assert abs(float(result[1]) - float(result[2])) < 1e-6
