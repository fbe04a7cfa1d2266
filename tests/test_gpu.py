"""pjrt on one or more NVIDIA GPUs, through pjrt-cuda and whichever CUDA plugin wheel is
installed (``pytest -m gpu``; scripts/gpu-check.sh runs them on a GPU machine).

Without an NVIDIA GPU every test here skips, saying so. They need neither the XLA CPU plugins
nor jax: results are judged against numpy.
"""
from __future__ import annotations

import os
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest

import pjrt
from fixtures import programs

pytestmark = pytest.mark.gpu


def _nvidia_gpu_names() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists, by name (none without the tool or a GPU)."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return re.findall(r"^GPU \d+: (.+?) \(UUID", done.stdout, re.M)


GPU_NAMES = _nvidia_gpu_names()


@pytest.fixture(scope="module")
def cuda_client():
    """A client of the installed CUDA plugin over all visible GPUs, taking memory as needed."""
    if not GPU_NAMES:
        pytest.skip("needs an NVIDIA GPU (nvidia-smi lists none here)")
    pjrt_cuda = pytest.importorskip("pjrt_cuda", reason="the pjrt-cuda package is not installed")
    from pjrt.plugin import PluginTable

    vendor = pjrt_cuda.vendor_plugin()  # with a GPU, a missing plugin wheel is a failure
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        plugin = PluginTable().load("cuda", vendor.library)
        client = pjrt_cuda.make_client(plugin)
    yield client
    client.close()


def test_the_devices_are_the_gpus_nvidia_smi_lists(cuda_client):
    devices = cuda_client.devices()
    assert cuda_client.platform == "cuda"
    assert all(d.platform == "cuda" for d in devices)
    assert [d.id for d in devices] == list(range(len(devices)))
    assert all(d.default_memory().kind == "device" for d in devices)
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        # The same models, whatever order CUDA and nvidia-smi each number them in.
        assert sorted(d.device_kind for d in devices) == sorted(GPU_NAMES)
    assert cuda_client.local_devices() == devices  # one process: all are local


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                                   np.int8, np.uint32, np.int64, np.bool_, np.complex64])
def test_host_to_gpu_and_back_keeps_every_value(cuda_client, dtype):
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        host = rng.integers(0, 2, size=(3, 5, 7)).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        host = rng.integers(info.min, info.max, size=(3, 5, 7), dtype=dtype, endpoint=True)
    elif dtype == np.complex64:
        host = (rng.standard_normal((3, 5, 7)) + 1j * rng.standard_normal((3, 5, 7))).astype(dtype)
    else:
        host = rng.standard_normal((3, 5, 7)).astype(dtype)
    for device in cuda_client.devices():
        array = cuda_client.buffer_from_pyval(host, device)
        assert array.devices() == {device}
        back = np.asarray(array)
        assert back.dtype == host.dtype and back.shape == host.shape
        np.testing.assert_array_equal(back, host)


def test_gpu_to_gpu_copy(cuda_client):
    devices = cuda_client.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two GPUs to copy between ({len(devices)} here)")
    host = np.arange(1000, dtype=np.float32)
    array = cuda_client.buffer_from_pyval(host, devices[0])
    moved = array.copy_to_device(devices[-1])
    assert moved.devices() == {devices[-1]}
    np.testing.assert_array_equal(np.asarray(moved), host)


#: Single-device test programs whose results on a GPU match numpy's at their own tolerances
#: (those with float matrix products are left out: the GPU may use TF32 for them).
GPU_PROGRAMS = ["tiny_tanh", "reductions", "while_loop", "sort", "integer_ops", "bool_ops",
                "cumsum", "shape_ops"]


@pytest.mark.parametrize("name", GPU_PROGRAMS)
def test_compile_and_execute_against_numpy(cuda_client, name):
    program = programs.get(name)
    device = cuda_client.devices()[-1]
    compiled = pjrt.compile(program.read_text(), device)
    outputs = compiled(*program.inputs())
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    assert all(o.devices() == {device} for o in outputs)
    programs.check_outputs(program, [np.asarray(o) for o in outputs])
