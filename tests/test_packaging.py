"""The distributions carry every module of their source tree: a subpackage missing from a
pyproject's package list installs nowhere, which only an installed copy shows."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _declared_packages(pyproject: pathlib.Path) -> set[str]:
    match = re.search(r"^packages\s*=\s*\[([^\]]*)\]", pyproject.read_text(), re.M)
    assert match, f"{pyproject} declares no packages list"
    return set(re.findall(r'"([^"]+)"', match.group(1)))


def _source_packages(top: pathlib.Path) -> set[str]:
    return {".".join(init.parent.relative_to(top.parent).parts)
            for init in top.rglob("__init__.py") if "build" not in init.parts}


@pytest.mark.parametrize("project, top", [
    ("core", "pjrt"), ("plugins/cpu", "pjrt_cpu"), ("plugins/cuda", "pjrt_cuda"),
    ("plugins/rocm", "pjrt_rocm"), ("plugins/tpu", "pjrt_tpu")])
def test_every_source_package_is_declared(project, top):
    directory = ROOT / project
    assert _source_packages(directory / top) == _declared_packages(directory / "pyproject.toml")
