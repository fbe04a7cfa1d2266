"""The PJRT stream extension: Device.get_stream_for_external_ready_events() and DLPack's
``stream`` honoured through the plugin, as jaxlib does.

XLA's CPU plugins lack the extension: each call says so, naming the plugin. NVIDIA's CUDA
plugin has it (a vendor test reads its extension chain with no GPU); a torch tensor on a
non-default stream going through pjrt is scripts/gpu-check.py's dlpack step on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from pjrt._capi import stream_extension
from pjrt._runtime.dlpack_export import _consumer_stream


def test_cpu_device_has_no_stream_for_external_ready_events(device):
    assert not stream_extension.has_stream_extension(device.client.plugin.api)
    with pytest.raises(pjrt.UnsupportedFeatureError) as raised:
        device.get_stream_for_external_ready_events()
    message = str(raised.value)
    assert f"plugin {device.client.plugin.name!r}" in message
    assert "PJRT_Get_Stream_For_External_Ready_Events (PJRT_Extension_Type_Stream)" in message
    assert "extensions it offers: " in message


def test_waiting_on_a_stream_is_refused_by_a_cpu_plugin(device):
    array = pjrt.device_put(np.arange(4, dtype=np.float32), device)
    refused = pytest.raises(pjrt.UnsupportedFeatureError,
                            match="PJRT_Wait_Until_Buffer_Ready_On_Stream")
    with refused, array.client.raw_handle.calling() as handle:
        stream_extension.wait_until_ready_on_stream(handle.api, array.live_buffers()[0], 7)
    np.testing.assert_array_equal(np.asarray(array), np.arange(4, dtype=np.float32))


def test_a_stream_for_host_memory_is_refused_as_dlpack_says(device):
    array = pjrt.device_put(np.arange(4, dtype=np.float32), device)
    with pytest.raises(BufferError, match="stream=None"):
        array.__dlpack__(stream=1)
    np.testing.assert_array_equal(np.from_dlpack(array), np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("stream, expected", [(None, None), (-1, None), (1, 1), (2, 2),
                                              (0x7F00_0000_1234, 0x7F00_0000_1234)])
def test_consumer_streams_dlpack_defines(stream, expected):
    assert _consumer_stream(stream) == expected


@pytest.mark.parametrize("stream, error", [(0, BufferError), (True, TypeError),
                                           ("1", TypeError), (1.0, TypeError)])
def test_consumer_streams_dlpack_refuses(stream, error):
    with pytest.raises(error):
        _consumer_stream(stream)


@pytest.mark.vendor
def test_the_cuda_plugin_offers_the_stream_extension():
    """NVIDIA's plugin lists the extension, at the size of version 0 (base and two
    functions), which is what pjrt reads; loading the plugin needs no GPU."""
    import pjrt_cuda
    from pjrt._capi import api as _c
    from pjrt._pjrt_cffi import lib

    plugin = pjrt.plugin_api.load_plugin("cuda", pjrt_cuda.library_path())
    assert stream_extension.has_stream_extension(plugin.api)
    extension = _c.find_extension(plugin.api, lib.PJRT_Extension_Type_Stream)
    assert extension.struct_size == stream_extension._EXTENSION_SIZE == 40
