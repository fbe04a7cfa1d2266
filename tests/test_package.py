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


def test_the_version_is_written_once_and_read_from_there():
    """pjrt/_version.py holds the version: the package re-exports it, the build reads it
    (without importing pjrt), and no core module imports it from the package face."""
    import ast
    import os

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    from pjrt import _version

    # The checkout's core package (the tests may run against an installed copy of it).
    core = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core")
    with open(os.path.join(core, "pyproject.toml"), "rb") as file:
        project = tomllib.load(file)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "pjrt._version.__version__"}
    assert pjrt.__version__ == _version.__version__
    for folder, _, files in os.walk(os.path.dirname(pjrt.__file__)):
        for name in (n for n in files if n.endswith(".py")):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module is None and node.level:
                    assert "__version__" not in {a.name for a in node.names}, (folder, name)
