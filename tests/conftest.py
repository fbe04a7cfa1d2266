"""Shared test set-up: the real CPU plugins every behaviour test runs against.

Two builds of XLA's CPU plugin, at PJRT API 0.81 and 0.106, are both test dependencies, so
each test that takes ``client`` runs twice and version negotiation is exercised on both.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

import pjrt

#: name -> (module holding the library, library file name, PJRT API minor version it reports)
CPU_PLUGINS = {
    "xla_cpu_0_81": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so", 81),
    "xla_cpu_0_106": ("fastatomstruct_xla_cpu", "libpjrt_cpu.so", 106),
}

#: Devices every test client has, so that multi-device programs can run.
TEST_DEVICE_COUNT = 8


def cpu_plugin_path(name: str) -> str:
    """Where the named test plugin's library is installed (an error if it is not)."""
    module, filename, _ = CPU_PLUGINS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
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
    """A client of each CPU plugin with TEST_DEVICE_COUNT devices."""
    return pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": TEST_DEVICE_COUNT})


@pytest.fixture
def device(client) -> pjrt.Device:
    return client.local_devices()[0]
