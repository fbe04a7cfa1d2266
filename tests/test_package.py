"""The package's public surface: every exported name resolves, and start-up stays light."""
from __future__ import annotations

import textwrap

import pjrt

from conftest import cpu_plugin_path, run_python


def test_every_public_name_resolves():
    for name in pjrt.__all__:
        assert getattr(pjrt, name) is not None, name
    assert pjrt.ffi.register_custom_call_target is pjrt.register_custom_call_target
    assert callable(pjrt.device_put)  # a function, not the module it lives in


def test_loading_a_plugin_and_creating_a_client_does_not_import_numpy():
    script = textwrap.dedent(f"""
        import sys
        import pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path("xla_cpu_0_81")!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        assert len(client.devices()) == 2
        print("numpy" in sys.modules, "pjrt.sharding" in sys.modules)
    """)
    result = run_python(script)
    assert result.stdout.split() == ["False", "False"]
