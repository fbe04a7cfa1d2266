"""Shared test set-up: the real CPU plugins every behaviour test runs against, and the fixtures
and helpers more than one test module needs.

Two builds of XLA's CPU plugin, at PJRT API 0.81 and 0.106, are both test dependencies, so
each test that takes ``client`` (or ``cpu_plugin``, ``make_client``, ``tiny``) runs twice and
version negotiation is exercised on both.

What is here:

* plugins and clients: ``cpu_plugin`` (each build, loaded once), ``client`` (one shared client
  of each build, 8 devices), ``device``, ``mesh`` (its devices as 2 x 4), ``make_client`` (fresh clients of each build, closed
  after the test: for tests that close, fork or otherwise spoil a client);
* programs: ``tiny`` (tiny_tanh compiled on ``client``), :func:`run_tiny`, ``SLOW_SUM``;
* registries: ``make_registry`` (fresh registries on their own plugin tables), ``cpu2_config``;
* the fault plugin: ``built`` (tests/fault_plugin compiled once per session),
  :func:`fault_build_module`;
* child processes: :func:`run_python` (a fresh interpreter: for crashes, exits, forks and
  anything that must not change this process);
* jax, the oracle: ``jax_cpu`` (jax on the CPU with 8 devices, its settings restored at the end
  of the session) and ``jax_devices`` (its CPU devices by id).

Markers (registered in tox.ini): ``vendor``, ``slow``, ``oracle``, ``lapack``. Tests marked
``oracle`` or ``lapack`` are also ``slow``, so ``pytest -m "not slow and not vendor"`` is the
quick set.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pjrt
from fixtures import programs

TESTS_DIR = Path(__file__).resolve().parent

# A shell starts a background job with Ctrl-C ignored, and every process it starts inherits
# that, so a child interpreter would never raise KeyboardInterrupt. The tests of Ctrl-C send
# SIGINT to their children: give it back its default meaning here, which the children inherit.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: name -> (module holding the library, library file name, PJRT API minor version it reports)
CPU_PLUGINS = {
    "xla_cpu_0_81": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so", 81),
    "xla_cpu_0_106": ("fastatomstruct_xla_cpu", "libpjrt_cpu.so", 106),
}

#: Devices every test client has, so that multi-device programs can run.
TEST_DEVICE_COUNT = 8

TINY = programs.get("tiny_tanh")


# -- markers ----------------------------------------------------------------------------------

def pytest_collection_modifyitems(config, items):
    """The long sets (``oracle``: judged against jax; ``lapack``: the linear algebra kernels)
    are slow as a whole, so ``-m "not slow"`` leaves them out with the single slow tests."""
    for item in items:
        if item.get_closest_marker("oracle") or item.get_closest_marker("lapack"):
            item.add_marker(pytest.mark.slow)


# -- plugins and clients ----------------------------------------------------------------------

#: Set to ``optional`` where the XLA CPU plugin builds are absent on purpose (a GPU machine
#: running only the gpu tests, scripts/gpu-check.sh): tests that need them are skipped there,
#: with the reason. Anywhere else a missing build is an error.
CPU_PLUGINS_ENV = "PJRT_TESTS_CPU_PLUGINS"


def cpu_plugin_path(name: str) -> str:
    """Where the named test plugin's library is installed (an error if it is not, or a skip
    when PJRT_TESTS_CPU_PLUGINS=optional)."""
    module, filename, _ = CPU_PLUGINS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get(CPU_PLUGINS_ENV) == "optional":
            pytest.skip(f"test dependency {module} is not installed here "
                        f"({CPU_PLUGINS_ENV}=optional)")
        raise RuntimeError(f"test dependency {module} is not installed; run the tests through "
                           f"tox (see README)")
    for directory in spec.submodule_search_locations:
        path = os.path.join(directory, filename)
        if os.path.isfile(path):
            return path
    raise RuntimeError(f"{filename} not found in {module}")


@pytest.fixture(scope="session", params=sorted(CPU_PLUGINS))
def cpu_plugin(request) -> pjrt.Plugin:
    """Each CPU plugin, loaded once for the session."""
    return pjrt.load_pjrt_plugin_dynamically(request.param, cpu_plugin_path(request.param))


@pytest.fixture(scope="session")
def client(cpu_plugin) -> pjrt.Client:
    """A client of each CPU plugin with TEST_DEVICE_COUNT devices, shared by the session:
    tests must not close it (take ``make_client`` for that)."""
    return pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": TEST_DEVICE_COUNT})


@pytest.fixture
def device(client) -> pjrt.Device:
    return client.local_devices()[0]


@pytest.fixture
def mesh(client) -> pjrt.Mesh:
    """``client``'s 8 devices as a 2 x 4 mesh with axes ``("x", "y")``."""
    return pjrt.Mesh(np.array(client.devices()).reshape(2, 4), ("x", "y"))


@pytest.fixture
def make_client(cpu_plugin):
    """Fresh clients of each CPU plugin: ``make_client(devices=2)``; closed after the test
    (closing twice is harmless, so a test may close one itself)."""
    made = []

    def make(devices: int = 2, **options) -> pjrt.Client:
        own = pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": devices, **options})
        made.append(own)
        return own

    yield make
    for own in made:
        own.close()


# -- programs ---------------------------------------------------------------------------------

@pytest.fixture
def tiny(client) -> pjrt.LoadedExecutable:
    """tiny_tanh (two float32[8] in, ``tanh(a * b + 1)`` out) compiled on ``client``."""
    return client.compile_and_load(TINY.read_text())


#: A program that runs for a while (40 passes over 4 MiB, all ones in: 40 everywhere out), so
#: that other calls overlap it.
SLOW_SUM = """
func.func public @main(%x: tensor<1048576xf32>) -> tensor<1048576xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %n = stablehlo.constant dense<40> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<1048576xf32>
  %r:2 = stablehlo.while(%i = %c0, %acc = %zero) : tensor<i32>, tensor<1048576xf32>
   cond {
    %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.add %acc, %x : tensor<1048576xf32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s : tensor<i32>, tensor<1048576xf32>
  }
  return %r#1 : tensor<1048576xf32>
}"""


def run_tiny(device) -> None:
    """Compile and run tiny_tanh on ``device`` and check it against numpy."""
    compiled = pjrt.compile(TINY.read_text(), device)
    programs.check_outputs(TINY, [np.asarray(compiled(*TINY.inputs()))])


# -- registries -------------------------------------------------------------------------------

@pytest.fixture
def make_registry():
    """Fresh registries, each on its own plugin table unless given one; their clients are
    closed afterwards. ``make_registry(environ, table=..., discover=...)``."""
    from pjrt import registry
    from pjrt.plugin import PluginTable

    made = []

    def make(environ: dict | None = None, *, table: PluginTable | None = None,
             **kwargs) -> registry.BackendRegistry:
        reg = registry.BackendRegistry(table or PluginTable(), environ=environ or {}, **kwargs)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        if reg.backends_are_initialized():
            for backend in reg.backends().values():
                backend.close()  # clear_backends() only forgets them
        reg.clear_backends()


@pytest.fixture
def cpu2_config(tmp_path) -> str:
    """PJRT_NAMES_AND_LIBRARY_PATHS entry: the 0.106 CPU plugin as ``cpu2`` with 3 devices."""
    import json

    config = tmp_path / "cpu2.json"
    config.write_text(json.dumps({"library_path": cpu_plugin_path("xla_cpu_0_106"),
                                  "create_options": {"cpu_device_count": 3}}))
    return f"cpu2:{config}"


# -- the vendors' plugin wheels (the vendor tox environment) ----------------------------------

def vendor_library(distribution: str, filename: str) -> str:
    """Path of ``filename`` inside the installed ``distribution`` (a vendor's plugin wheel)."""
    import importlib.metadata

    files = importlib.metadata.distribution(distribution).files or []
    for file in files:
        if file.name == filename:
            return str(file.locate())
    raise AssertionError(f"{filename} not found in the {distribution} distribution")


@pytest.fixture
def libtpu_v5e(monkeypatch):
    """``(library path, plugin, topology)``: libtpu loaded as ``vendor_tpu`` and a v5e:2x2
    topology, which needs no TPU; the topology is closed afterwards."""
    from pjrt.topology import make_topology

    # Off Google Cloud, libtpu retries the metadata server for minutes; skip the lookup.
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    path = vendor_library("libtpu", "libtpu.so")
    plugin = pjrt.load_pjrt_plugin_dynamically("vendor_tpu", path)
    topology = make_topology(plugin, "v5e:2x2")
    yield path, plugin, topology
    topology.close()


# -- the fault plugin -------------------------------------------------------------------------

def fault_build_module():
    """tests/fault_plugin/build.py, loaded by path (so it works whatever pytest's import mode
    is) and once per process."""
    name = "fault_plugin_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS_DIR / "fault_plugin" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The fault plugin and the broken libraries, compiled once per test session."""
    return fault_build_module().build_all(tmp_path_factory.mktemp("fault_plugin_build"))


# -- child processes --------------------------------------------------------------------------

def child_env(*, drop: tuple[str, ...] = (), **extra: str) -> dict:
    """This environment for a child interpreter, without the variables whose names start with
    one of ``drop``, with ``extra`` set, and with this process's import path."""
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    if (any("PJRT_PLATFORMS".startswith(prefix) for prefix in drop)
            and "PJRT_PLATFORMS" not in extra and "JAX_PLATFORMS" in env):
        # pjrt reads JAX_PLATFORMS (kept for jax, the oracle) when PJRT_PLATFORMS is unset:
        # an empty PJRT_PLATFORMS keeps the child's pjrt selecting no platform, as meant.
        env["PJRT_PLATFORMS"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def run_python(source: str, *args: str, env: dict | None = None, timeout: float = 120,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run ``source`` (dedented) in a fresh interpreter with ``args`` as ``sys.argv[1:]``.

    ``env`` defaults to :func:`child_env`. With ``check``, a non-zero exit fails the test with
    the child's output; the result (text stdout and stderr) is returned either way.
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(source), *map(str, args)],
                            capture_output=True, text=True, timeout=timeout,
                            env=child_env() if env is None else env)
    if check:
        assert result.returncode == 0, (f"the child exited with code {result.returncode}:\n"
                                        f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return result


def failures_in_threads(work, count: int = 4) -> list:
    """Run ``work(seed)`` for seeds ``0 .. count - 1`` in as many threads at once; the
    exceptions they raised (the test asserts there are none)."""
    import threading

    failures: list = []

    def guarded(seed):
        try:
            work(seed)
        except BaseException as error:  # noqa: BLE001 - reported by the calling test
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


# -- jax, the oracle --------------------------------------------------------------------------

JAX_DEVICE_COUNT = 8


@pytest.fixture(scope="session")
def jax_cpu():
    """jax on the CPU with at least 8 devices (whatever the environment says), for the tests
    that judge pjrt against it. Its platform and device count are set through its config before
    its backends start, and set back at the end of the session (a setting that can no longer
    change once the backends are up is left as it is then)."""
    jax = pytest.importorskip("jax")
    from jax._src import xla_bridge

    changed = []
    if not xla_bridge.backends_are_initialized():
        if jax.config.jax_platforms != "cpu":
            changed.append(("jax_platforms", jax.config.jax_platforms))
            jax.config.update("jax_platforms", "cpu")
        if xla_bridge.num_cpu_devices.value < JAX_DEVICE_COUNT:
            changed.append(("jax_num_cpu_devices", xla_bridge.num_cpu_devices.value))
            jax.config.update("jax_num_cpu_devices", JAX_DEVICE_COUNT)
    if len(jax.devices("cpu")) < JAX_DEVICE_COUNT:
        # jax's CPU backend was started elsewhere with fewer devices: start it again.
        from jax.extend.backend import clear_backends

        clear_backends()
        changed.append(("jax_num_cpu_devices", xla_bridge.num_cpu_devices.value))
        jax.config.update("jax_num_cpu_devices", JAX_DEVICE_COUNT)
    found = len(jax.devices("cpu"))
    if found < JAX_DEVICE_COUNT:
        pytest.fail(f"jax sees {found} CPU devices, the oracle needs {JAX_DEVICE_COUNT}")
    yield jax
    for name, value in reversed(changed):
        with contextlib.suppress(RuntimeError):  # refused once the backends are up
            jax.config.update(name, value)


@pytest.fixture(scope="session")
def jax_devices(jax_cpu) -> dict:
    """jax's CPU devices by id (at least 8)."""
    return {d.id: d for d in jax_cpu.devices("cpu")}


@contextlib.contextmanager
def jax_partitioner(jax, name: str):
    """Lower (and run) with Shardy (``"shardy"``) or with GSPMD; the flag is restored after."""
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", name == "shardy")
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def pjrt_cuda_libraries():
    """pjrt-cuda's `libraries` module, loaded by path: it needs only the standard library,
    and pjrt-cuda is not installed in every test environment."""
    import importlib.util

    path = TESTS_DIR.parent / "plugins" / "cuda" / "pjrt_cuda" / "libraries.py"
    name = "pjrt_cuda_libraries_by_path"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
