"""pjrt.plugin_api: one plugin declaration that pjrt and JAX both discover, on real plugins.

The package under test is written by the test into a temporary directory and installed there
as a distribution with a ``jax_plugins`` entry point, the way pip would install it. It declares
the second CPU plugin build (``fastatomstruct-xla-cpu``, PJRT API 0.106) under a platform name
of its own, ``altcpu``. One fresh interpreter runs a JAX program on it (jax 0.10.2 discovers the
package and calls its ``initialize()``), another runs a program on it through pjrt; the numbers
are checked against numpy in both.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import textwrap

import pytest

import pjrt
import pjrt_cpu
from pjrt import plugin_api, registry
from pjrt._pjrt_cffi import ffi
from pjrt.plugin import PluginTable

from conftest import cpu_plugin_path, run_python
from fixtures import programs

LIB_106 = cpu_plugin_path("xla_cpu_0_106")
CORE = os.path.dirname(os.path.dirname(pjrt.__file__))
CPU_PACKAGE = os.path.dirname(os.path.dirname(pjrt_cpu.__file__))

ALTCPU_SOURCE = textwrap.dedent('''\
    """A vendor's plugin package: the fastatomstruct CPU plugin build as platform altcpu."""
    from pjrt import plugin_api

    __version__ = "0.1.0"

    def library_path():
        return plugin_api.find_module_library("fastatomstruct_xla_cpu", "libpjrt_cpu.so",
                                              "fastatomstruct-xla-cpu")

    PLUGIN = plugin_api.PluginDeclaration(
        "altcpu", library=library_path, priority=100,
        options=lambda: {"cpu_device_count": 2}, version=__version__)

    def initialize():
        global host
        host = PLUGIN.initialize()

    host = None
    ''')


@pytest.fixture(scope="module")
def altcpu_site(tmp_path_factory):
    """A directory laid out like ``pip install --target``: the module and its dist-info."""
    site = tmp_path_factory.mktemp("altcpu_site")
    (site / "pjrt_altcpu.py").write_text(ALTCPU_SOURCE)
    info = site / "pjrt_altcpu-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pjrt-altcpu\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[jax_plugins]\npjrt_altcpu = pjrt_altcpu\n")
    (info / "RECORD").write_text("")
    return site


def run_child(source: str, site, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("JAX_", "PJRT_", "XLA_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(site), CORE, CPU_PACKAGE])
    environ.update(env)
    result = run_python(source, env=environ, timeout=300)
    return json.loads(result.stdout.splitlines()[-1])


JAX_CHILD = """
    import json
    import numpy as np
    import jax, jax.numpy as jnp
    import pjrt, pjrt_altcpu, pjrt_cpu

    devices = jax.devices("altcpu")
    x = jax.device_put(jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4), devices[1])
    y = jax.jit(lambda a: jnp.tanh(a @ a.T) + jnp.sum(a))(x)
    expected = np.tanh(np.arange(12.0).reshape(3, 4) @ np.arange(12.0).reshape(3, 4).T) + 66
    print(json.dumps({
        "host": pjrt_altcpu.host,
        "devices": len(devices),
        "on": [d.id for d in y.devices()],
        "same_client": list(y.devices())[0].client is devices[0].client,
        "error": float(np.abs(np.asarray(y) - expected).max()),
        "backends": sorted(jax._src.xla_bridge.backends()),
        "pjrt_registered_nothing": not pjrt.registry.default_registry.backends_are_initialized()
            and pjrt.custom_call_targets("cpu") == {},
    }))
"""


@pytest.mark.slow  # jax started in a fresh interpreter
@pytest.mark.parametrize("platforms", ["altcpu", "altcpu,cpu"])
def test_jax_runs_a_program_on_the_declared_plugin(altcpu_site, platforms):
    outcome = run_child(JAX_CHILD, altcpu_site, JAX_PLATFORMS=platforms)
    assert outcome["host"] == "jax"
    assert outcome["devices"] == 2  # the declaration's options reached JAX
    assert outcome["on"] == [1] and outcome["same_client"]
    assert outcome["error"] < 1e-5
    assert outcome["backends"] == sorted(platforms.split(","))
    # pjrt_cpu's initialize() was called by JAX too, and left JAX's own cpu alone.
    assert outcome["pjrt_registered_nothing"]


PJRT_CHILD = """
    import json
    import numpy as np
    import pjrt, pjrt_altcpu

    program = open(%r).read()
    client = pjrt.get_backend("altcpu")
    registration = pjrt.registry.default_registry.registrations()["altcpu"]
    add_one = pjrt.compile(program, client.devices()[1])
    a = np.arange(8, dtype=np.float32)
    out = np.asarray(add_one(a, a))
    print(json.dumps({
        "host": pjrt_altcpu.host,
        "library": client.plugin.library_path,
        "api": list(client.plugin.api_version),
        "devices": client.device_count(),
        "source": registration.source,
        "error": float(np.abs(out - np.tanh(a * a + 1)).max()),
    }))
"""


def test_pjrt_runs_a_program_on_the_same_declaration(altcpu_site):
    program = programs.get("tiny_tanh")
    outcome = run_child(PJRT_CHILD % program.path(), altcpu_site, PJRT_PLATFORMS="altcpu,cpu")
    assert outcome["host"] == "pjrt"
    assert os.path.realpath(outcome["library"]) == os.path.realpath(LIB_106)
    assert outcome["api"] == [0, 106] and outcome["devices"] == 2
    assert outcome["source"] == "entry point"
    assert outcome["error"] < 1e-6


def test_a_call_from_neither_host_registers_nothing(monkeypatch):
    calls = []
    for name in ("register_plugin", "register_backend_factory", "register_unavailable"):
        monkeypatch.setattr(plugin_api, name, lambda *a, **k: calls.append(a))
    declaration = plugin_api.PluginDeclaration("nobody", library=LIB_106)
    assert not plugin_api.discovering()
    # jax is imported in this process (other tests use it), but its discovery is not running.
    assert plugin_api.jax_is_calling() is None
    assert declaration.initialize() is None
    assert calls == []


def test_a_declaration_needs_exactly_one_of_library_and_c_api():
    with pytest.raises(ValueError, match="exactly one of library and c_api"):
        plugin_api.PluginDeclaration("none")
    with pytest.raises(ValueError, match="exactly one of library and c_api"):
        plugin_api.PluginDeclaration("both", library=LIB_106, c_api=lambda: None)


def test_register_with_pjrt_directly_uses_options_read_late(monkeypatch):
    reg = registry.BackendRegistry(PluginTable(), environ={}, discover=False)
    count = {"n": 3}
    made = []

    def make_client(plugin, options):
        made.append(options)
        return plugin_api.create_client(plugin, options)

    declaration = plugin_api.PluginDeclaration(
        "late", library=lambda: LIB_106, options=lambda: {"cpu_device_count": count["n"]},
        make_client=make_client)
    from pjrt._registry import discovery

    with discovery.discovery_scope(discovery.DiscoveryContext(reg)):
        assert declaration.initialize() == "pjrt"
    count["n"] = 2  # read when the client is made, not at registration
    assert reg.get_backend("late").device_count() == 2
    assert made == [{"cpu_device_count": 2}]
    reg.clear_backends()


def test_a_missing_library_is_the_backends_reason():
    reg = registry.BackendRegistry(PluginTable(), environ={}, discover=False)

    def missing():
        raise FileNotFoundError("pjrt-ghost's library is not installed; pip install ghost")

    declaration = plugin_api.PluginDeclaration("ghost", library=missing)
    from pjrt._registry import discovery

    with discovery.discovery_scope(discovery.DiscoveryContext(reg)):
        with pytest.raises(pjrt.PluginLoadError, match="pip install ghost"):
            declaration.initialize()
    reg.register_plugin("cpu", library_path=LIB_106)
    assert "pip install ghost" in reg.backend_errors()["ghost"]
    with pytest.raises(pjrt.PluginLoadError, match="pip install ghost"):
        reg.make_pjrt_topology("ghost")
    with pytest.raises(RuntimeError, match="pip install ghost"):
        reg.new_client("ghost")
    reg.clear_backends()


def test_a_package_that_does_not_match_the_core_is_not_registered():
    reg = registry.BackendRegistry(PluginTable(), environ={}, discover=False)
    declaration = plugin_api.PluginDeclaration("oldpkg", library=LIB_106, version="7.3.0")
    from pjrt._registry import discovery

    with discovery.discovery_scope(discovery.DiscoveryContext(reg)):
        with pytest.warns(RuntimeWarning, match="does not match"):
            with pytest.raises(pjrt.PluginLoadError, match="7.3.0 does not match pjrt"):
                declaration.initialize()
    assert "oldpkg" not in PluginTable().names()
    assert "does not match" in reg.registrations()["oldpkg"].failure.args[0]


def test_a_c_api_declaration_registers_the_capsule():
    # A PyCapsule holding the PJRT_Api*, as a plugin's own Python extension hands it out.
    donor = PluginTable().load("donor", LIB_106)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(int(ffi.cast("uintptr_t", donor.api.table)), None, None)
    assert type(capsule).__name__ == "PyCapsule"
    reg = registry.BackendRegistry(PluginTable(), environ={}, discover=False)
    declaration = plugin_api.PluginDeclaration("incore", c_api=lambda: capsule)
    from pjrt._registry import discovery

    with discovery.discovery_scope(discovery.DiscoveryContext(reg)):
        declaration.initialize()
    client = reg.get_backend("incore")
    assert client.plugin.library_path is None and client.plugin.api_version == (0, 106)
    reg.clear_backends()


_TARGET_NUMBERS = itertools.count()


def test_a_plugin_package_registers_kernels_and_their_set_up_through_plugin_api(client):
    """What pjrt-cpu's LAPACK kernels use: a handler registered through plugin_api runs in a
    program, and the set-up deferred with it runs once, when the first program naming the
    target is compiled (not at registration, not for programs that do not call it)."""
    import numpy as np

    target = f"plugin_api_scale_{next(_TARGET_NUMBERS)}"  # XLA keeps handlers for good
    prepared = []
    plugin_api.register_custom_call_target(
        target, lambda operands, results, attributes: operands[0] * 3, platform="cpu")
    plugin_api.register_target_preparation([target], lambda: prepared.append(1), platform="cpu")
    assert prepared == []
    pjrt.compile(programs.get("tiny_tanh").read_text(), client=client)
    assert prepared == []
    program = f"""
    func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
      %0 = stablehlo.custom_call @{target}(%x) {{api_version = 4 : i32}} : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }}"""
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(pjrt.compile(program, client=client)(x)), x * 3)
    pjrt.compile(program, client=client)
    assert prepared == [1]
    assert pjrt.custom_call_targets("cpu")[target] is not None


def test_the_plugin_packages_take_their_priority_from_the_one_table(monkeypatch):
    """Priorities are written once (pjrt.plugin_api.PLATFORM_PRIORITIES): each of pjrt's
    plugin packages registers with its platform's entry, and a GPU outranks the TPU, which
    outranks the CPU, with any other plugin library between the TPU and a GPU."""
    import importlib
    import sys

    plugins = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
    table = plugin_api.PLATFORM_PRIORITIES
    before = set(sys.modules)
    try:
        for platform in ("cpu", "cuda", "rocm", "tpu"):
            if f"pjrt_{platform}" not in sys.modules:  # the packages from this checkout
                monkeypatch.syspath_prepend(os.path.join(plugins, platform))
            package = importlib.import_module(f"pjrt_{platform}")
            assert package.PRIORITY == table[platform], platform
    finally:  # the packages not installed here are not left importable
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("pjrt_cuda", "pjrt_rocm", "pjrt_tpu"):
                del sys.modules[name]
    assert (table["cuda"] == table["rocm"] > plugin_api.DEFAULT_PLUGIN_PRIORITY > table["tpu"]
            > table["cpu"])
    assert plugin_api.PluginDeclaration("x", library="x.so").priority == (
        plugin_api.DEFAULT_PLUGIN_PRIORITY)
