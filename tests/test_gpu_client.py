"""jaxlib's GPU client names in pjrt.xla_client: make_gpu_client, GpuAllocatorConfig and
GpuLibNotLinkedError, over NVIDIA's CUDA plugin (vendor tests: no GPU here, so client
creation ends at the plugin's own "No visible GPU devices." once it has read the options).

The CUDA plugin checks every create option's name (INVALID_ARGUMENT for one it does not read)
and the allocator's value before it looks for devices, so reaching that error shows it took
each option it was given. Creating a client on a GPU is scripts/gpu-check.py's step.
"""
from __future__ import annotations

import importlib.util

import pytest

import pjrt
from pjrt import xla_client

Kind = xla_client.GpuAllocatorConfig.Kind


def test_allocator_config_defaults_and_options():
    config = xla_client.GpuAllocatorConfig()
    assert (config.kind, config.memory_fraction, config.preallocate,
            config.collective_memory_size) == (Kind.DEFAULT, 0.75, True, 0)
    assert [kind.name for kind in Kind] == ["DEFAULT", "PLATFORM", "BFC", "CUDA_ASYNC"]
    config = xla_client.GpuAllocatorConfig(Kind.CUDA_ASYNC, 0.5, False, 1 << 20)
    assert config.options() == {"allocator": "cuda_async", "memory_fraction": 0.5,
                                "preallocate": False, "collective_memory_size": 1 << 20}
    assert "CUDA_ASYNC" in repr(config)
    # jaxlib's way: made empty, then set attribute by attribute (each checked).
    config = xla_client.GpuAllocatorConfig()
    config.kind = Kind.PLATFORM
    config.preallocate = False
    assert config.options()["allocator"] == "platform" and not config.options()["preallocate"]
    with pytest.raises(ValueError, match="at most 1"):
        config.memory_fraction = 2.0
    assert config.memory_fraction == 0.75


@pytest.mark.parametrize("kwargs, error, words", [
    ({"memory_fraction": 0.0}, ValueError, "greater than 0"),
    ({"memory_fraction": 1.5}, ValueError, "at most 1"),
    ({"memory_fraction": "half"}, TypeError, "memory_fraction"),
    ({"preallocate": 1}, TypeError, "preallocate"),
    ({"collective_memory_size": -1}, ValueError, "collective_memory_size"),
    ({"kind": 9}, ValueError, "9"),
])
def test_allocator_config_refuses_bad_values(kwargs, error, words):
    with pytest.raises(error, match=words):
        xla_client.GpuAllocatorConfig(**kwargs)


def test_no_gpu_package_is_gpu_lib_not_linked():
    if any(importlib.util.find_spec(m) for m in ("pjrt_cuda", "pjrt_rocm")):
        pytest.skip("a GPU plugin package is installed here (the vendor tests cover it)")
    with pytest.raises(xla_client.GpuLibNotLinkedError, match="pjrt-cuda or pjrt-rocm"):
        xla_client.make_gpu_client()
    with pytest.raises(xla_client.GpuLibNotLinkedError, match="pjrt-rocm"):
        xla_client.make_gpu_client(platform_name="rocm")


def test_make_gpu_client_refuses_a_non_gpu_platform():
    with pytest.raises(ValueError, match="not a GPU platform"):
        xla_client.make_gpu_client(platform_name="cpu")


@pytest.mark.vendor
def test_make_gpu_client_without_a_gpu_raises_the_plugins_error():
    with pytest.raises(pjrt.XlaRuntimeError, match="No visible GPU devices"):
        xla_client.make_gpu_client()
    with pytest.raises(pjrt.XlaRuntimeError, match="No visible GPU devices"):
        xla_client.make_gpu_client(platform_name="cuda", allowed_devices={1, 0}, mock=True,
                                   mock_gpu_topology="1x1x2")


@pytest.mark.vendor
@pytest.mark.parametrize("kind", list(Kind))
def test_allocator_config_maps_to_options_the_cuda_plugin_reads(kind):
    config = xla_client.GpuAllocatorConfig(kind, 0.5, False, 1 << 20)
    with pytest.raises(pjrt.XlaRuntimeError, match="No visible GPU devices"):
        xla_client.make_gpu_client(allocator_config=config)


@pytest.mark.vendor
def test_the_cuda_plugin_refuses_options_it_does_not_read():
    """The control for the tests above: a name the plugin does not read, and an allocator it
    does not know, are refused before it looks for devices."""
    import pjrt_cuda

    plugin = pjrt.plugin_api.load_plugin("cuda", pjrt_cuda.library_path())
    with pytest.raises(pjrt.XlaRuntimeError, match="Unexpected option name"):
        pjrt.plugin_api.create_client(plugin, {"allocator_kind": "bfc"})
    with pytest.raises(pjrt.XlaRuntimeError, match="Allocator bfc2 not supported"):
        pjrt.plugin_api.create_client(plugin, {"allocator": "bfc2"})
