"""The distributions carry every module of their source tree: a subpackage missing from a
pyproject's package list installs nowhere, which only an installed copy shows."""
import pathlib
import re

import pytest

from conftest import pjrt_cuda_libraries

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


# -- the vendor wheels the hardware packages pin -------------------------------------------------

def _pins(text: str) -> dict[str, str]:
    """``distribution -> version`` of each ``name==version`` requirement in ``text``."""
    return dict(re.findall(r'^\s*"?([A-Za-z0-9][A-Za-z0-9_.-]*)==([0-9][^"\s;,]*)', text, re.M))


def _vendor_environment() -> str:
    text = (ROOT / "tox.ini").read_text()
    return text.split("[testenv:vendor]", 1)[1].split("\n[", 1)[0]


def test_the_vendor_environment_runs_every_file_with_vendor_tests():
    """The other environments deselect ``vendor`` tests: a file the vendor environment does not
    name would have its vendor tests run nowhere."""
    commands = re.search(r"^commands = pytest (.*)$", _vendor_environment(), re.M)
    assert commands, "the vendor environment has no pytest command"
    named = {pathlib.PurePosixPath(word).name for word in commands.group(1).split()
             if word.endswith(".py")}
    marked = {path.name for path in (ROOT / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.vendor\b", path.read_text())}
    assert marked <= named, sorted(marked - named)


@pytest.mark.parametrize("project, distributions", [
    ("plugins/cuda", ["jax-cuda13-pjrt", "jax-cuda12-pjrt"]),
    ("plugins/rocm", ["jax-rocm10-pjrt", "jax-rocm7-pjrt"]),
    ("plugins/tpu", ["libtpu"])])
def test_the_vendor_environment_installs_the_releases_the_packages_pin(project, distributions):
    pinned = _pins((ROOT / project / "pyproject.toml").read_text())
    installed = _pins(_vendor_environment())
    for distribution in distributions:
        assert pinned[distribution] == installed[distribution], distribution
        # The package's README names the release it pins.
        assert f"`{distribution}` {pinned[distribution]}" in (ROOT / project / "README.md").read_text()


def test_each_rocm_extra_installs_the_wheel_pjrt_rocm_looks_for():
    # Loaded by path: pjrt-rocm is not installed in every test environment.
    import importlib.util

    path = ROOT / "plugins" / "rocm" / "pjrt_rocm" / "__init__.py"
    spec = importlib.util.spec_from_file_location("pjrt_rocm_by_path", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    text = (ROOT / "plugins" / "rocm" / "pyproject.toml").read_text()
    extras = dict(re.findall(r'^(rocm[0-9]+) = \[([^\]]*)\]', text, re.M))
    assert set(extras) == {extra for *_, extra in module.VENDOR_WHEELS}
    for _, distribution, _, extra in module.VENDOR_WHEELS:
        # The PJRT plugin wheel, and jaxlib's kernel wheel of the same release beside it.
        pins = _pins(extras[extra])
        kernels = distribution.replace("-pjrt", "-plugin")
        assert list(pins) == [distribution, kernels], extra
        assert pins[kernels] == pins[distribution], extra
    # Without an extra, pjrt-rocm installs no plugin wheel: the user picks the ROCm release.
    dependencies = text.split("\ndependencies = [", 1)[1].split("]", 1)[0]
    assert "jax-rocm" not in dependencies


@pytest.mark.parametrize("cuda", [12, 13])
def test_each_cuda_extra_installs_the_libraries_pjrt_cuda_checks_at_its_floors(cuda):
    libraries = pjrt_cuda_libraries()
    text = (ROOT / "plugins" / "cuda" / "pyproject.toml").read_text()
    extra = text.split(f"\ncuda{cuda} = [", 1)[1].split("]", 1)[0]
    floors = dict(re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)', extra))
    assert f"jax-cuda{cuda}-pjrt==" in extra
    for component in libraries.COMPONENTS_BY_CUDA[cuda]:
        floor = tuple(int(p) for p in floors[component.distribution].split("."))
        assert floor[:len(component.minimum)] == component.minimum, component.name


def test_the_supported_pjrt_api_range_is_stated_once_and_matches_the_code():
    from pjrt._capi import api as _c

    row = [line for line in (ROOT / "docs" / "index.md").read_text().splitlines()
           if line.startswith("| PJRT C API |")]
    assert len(row) == 1
    major, minor = _c.HEADER_VERSION
    assert f"header {major}.{minor}" in row[0]
    assert f"API 0.{_c.MIN_SUPPORTED_MINOR} and newer are accepted" in row[0]
    # Elsewhere the range is referred to, not restated (a restated copy goes stale).
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if path.name != "index.md":
            assert not re.search(r"from (API )?0\.\d+ up|0\.\d+ and newer", path.read_text()), path
