"""Client, Device and Memory on the real CPU plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, TEST_DEVICE_COUNT


def test_plugin_reports_its_api_version(cpu_plugin):
    major, minor = cpu_plugin.api_version
    assert (major, minor) == (0, CPU_PLUGINS[cpu_plugin.name][2])
    assert pjrt.xla_client.pjrt_plugin_loaded(cpu_plugin.name)


def test_plugin_attributes_carry_stablehlo_versions(cpu_plugin):
    attributes = cpu_plugin.attributes()
    current = attributes["stablehlo_current_version"]
    minimum = attributes["stablehlo_minimum_version"]
    assert isinstance(current, list) and len(current) == 3
    assert tuple(minimum) <= tuple(current)


def test_client_identity(client):
    assert client.platform == "cpu"
    assert isinstance(client.platform_version, str)
    assert client.process_index() == 0
    assert client.device_count() == TEST_DEVICE_COUNT
    assert client.local_device_count() == TEST_DEVICE_COUNT
    assert client.devices() == client.local_devices()


def test_lookup_missing_device(client):
    with pytest.raises(ValueError, match="no device with id 99"):
        client.lookup_device(99)


def test_default_device_assignment(client):
    assignment = client.default_device_assignment(2, 4)
    assert assignment.shape == (2, 4)
    assert sorted(assignment.ravel().tolist()) == list(range(8))


def test_live_arrays_and_device_live_buffers(client):
    device = client.local_devices()[5]
    array = client.buffer_from_pyval(np.arange(3), device)
    assert array in client.live_arrays()
    assert array in device.live_buffers()
    array.delete()
    assert array not in client.live_arrays()


def test_close_frees_everything_and_is_idempotent(make_client):
    own = make_client(2)
    array = own.buffer_from_pyval(np.ones(4, np.float32))
    own.close()
    own.close()
    assert own.is_closed and array.is_deleted()
    with pytest.raises(pjrt.ClosedClientError):
        np.asarray(array)
    with pytest.raises(pjrt.ClosedClientError):
        own.buffer_from_pyval(np.ones(2))


def test_client_as_context_manager(cpu_plugin):
    with pjrt.make_c_api_client(cpu_plugin.name) as own:
        value = np.asarray(own.buffer_from_pyval(np.arange(5)))
    assert own.is_closed
    np.testing.assert_array_equal(value, np.arange(5))


def test_bad_option_types_are_type_errors_naming_the_key(cpu_plugin):
    with pytest.raises(TypeError, match="'cpu_device_count'"):
        pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": "8"})
    with pytest.raises(TypeError, match="'weird'"):
        pjrt.make_c_api_client(cpu_plugin.name, {"weird": {"a": 1}})
    with pytest.raises(TypeError, match="'floats'"):
        pjrt.make_c_api_client(cpu_plugin.name, {"floats": [1.5, 2.5]})


def test_unknown_plugin_name(client):
    with pytest.raises(KeyError, match="no PJRT plugin named 'nope'"):
        pjrt.make_c_api_client("nope")


def test_buffer_from_pyval_to_another_clients_device_is_refused(client, make_client):
    other = make_client(1)
    with pytest.raises(ValueError, match="belongs to another client.*pass a device of this cpu client"):
        client.buffer_from_pyval(np.ones(2), other.devices()[0])


@pytest.mark.parametrize("target", ["memory", "name"])
def test_buffer_from_pyval_to_something_not_a_device_says_so(client, target):
    device = client.devices()[1]
    wrong = device.default_memory() if target == "memory" else "cpu:1"
    with pytest.raises(TypeError, match="Device") as info:
        client.buffer_from_pyval(np.ones(2), wrong)
    assert "PJRT_" not in str(info.value)  # in pjrt's words, not the C binding's



def test_compile_takes_options_as_the_second_argument_as_older_jaxlib_did(client):
    """jaxlib once took ``compile(program, options)``; today's takes the devices second. A
    CompileOptions there is taken as the options, and giving them twice is refused."""
    options = pjrt.CompileOptions()
    program = "func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }"
    executable = client.compile(program, options)
    x = client.buffer_from_pyval(np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(executable.execute([x])[0]), [1, 1])
    with pytest.raises(TypeError, match="given twice"):
        client.compile(program, options, compile_options=options)
    again = client.deserialize_executable(client.serialize_executable(executable))
    np.testing.assert_array_equal(np.asarray(again.execute([x])[0]), [1, 1])
