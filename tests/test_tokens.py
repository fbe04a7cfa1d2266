"""Tokens of a program's run (pjrt.tokens), on the real CPU plugins: the plugin's completion
events, one per device, waited for once each; taken once from the results; on every path a
launch can take (the caller's thread, a worker)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pjrt

from fixtures import programs

TINY = programs.get("tiny_tanh")


def _inputs(client, device):
    return [client.buffer_from_pyval(x, device) for x in TINY.inputs()]


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "worker"])
def test_execute_with_token_waits_for_the_run(client, inline):
    executable = client.compile_and_load(TINY.read_text(), client.local_devices()[:1])
    executable.launches_inline = inline
    arguments = _inputs(client, client.local_devices()[0])
    outputs, token = executable.execute_with_token(arguments)
    token.block_until_ready()
    token.block_until_ready()  # each event is waited for once; later waits return
    a, b = TINY.inputs()
    np.testing.assert_allclose(np.asarray(outputs[0]), np.tanh(a * b + 1), rtol=1e-6)


def test_a_sharded_token_has_one_token_per_device(client):
    devices = client.local_devices()[:2]
    executable = client.compile_and_load(TINY.read_text(), devices, replicated=True)
    arguments = [[client.buffer_from_pyval(x, d) for d in devices] for x in TINY.inputs()]
    results = executable.execute_sharded(arguments, with_tokens=True)
    token = results.consume_token()
    for device in devices:
        token.get_token_for_device_id(device.id).block_until_ready()
    token.block_until_ready()
    with pytest.raises(ValueError, match="not on device"):
        token.get_token_for_device_id(client.local_devices()[2].id)
    with pytest.raises(RuntimeError, match="taken once"):
        results.consume_token()
    outputs = results.disassemble_into_single_device_arrays()
    a, b = TINY.inputs()
    for array in outputs[0]:
        np.testing.assert_allclose(np.asarray(array), np.tanh(a * b + 1), rtol=1e-6)


def test_results_without_tokens_have_none_to_give(client):
    devices = client.local_devices()[:2]
    executable = client.compile_and_load(TINY.read_text(), devices, replicated=True)
    arguments = [[client.buffer_from_pyval(x, d) for d in devices] for x in TINY.inputs()]
    results = executable.execute_sharded(arguments)
    with pytest.raises(RuntimeError, match="with_tokens=True"):
        results.consume_token()


def test_dropped_tokens_leave_the_client_working_and_a_closed_clients_token_raises(
        make_client):
    """Tokens dropped unwaited (their events freed under a ticket) leave the client and its
    later runs working; a token whose client is closed raises ClosedClientError when waited
    on, and dropping it calls nothing on the closed client (no crash)."""
    client = make_client()
    executable = client.compile_and_load(TINY.read_text(), client.local_devices()[:1])
    arguments = _inputs(client, client.local_devices()[0])
    for _ in range(50):
        outputs, token = executable.execute_with_token(arguments)
        del token  # its event is freed with it, under a ticket on the open client
    gc.collect()
    outputs, token = executable.execute_with_token(arguments)
    np.asarray(outputs[0])
    client.close()
    with pytest.raises(pjrt.ClosedClientError):
        token.block_until_ready()
    del token
    gc.collect()  # a closed client's event is left alone: nothing of it may be called
