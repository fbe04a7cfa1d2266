"""Install the built wheels the way a user does and check that what was installed works.

    python scripts/check-wheels.py [--dist DIR] [--hardware-packages]

Run by the `install-py*` environments of tox.ini with the environment's Python and no C
compiler reachable (tox.ini says how). Everything runs in a fresh temporary directory outside
the checkout, so that nothing can be imported from its sources. Steps, each of which exits
non-zero when it fails:

1. pip installs the `pjrt` and `pjrt-cpu` wheel files of DIR (dist/ by default) with
   `--only-binary :all:`, so neither they nor any dependency can be built from source;
2. `pjrt` and `pjrt_cpu` are imported from this environment's site-packages, and pip recorded
   the wheel files of DIR as where they came from;
3. `pjrt info` runs, and its `--json` form shows the cpu backend up and default, served by the
   `pjrt-cpu` package of the wheel's version;
4. README.md's Python code blocks run as tests/test_docs_snippets.py runs them (its own
   extraction; the blocks' asserts and exit code decide), in a fresh interpreter;
5. `pjrt demo` (what README's first command runs) exits 0 and its results match numpy;
6. a program jax lowered to a LAPACK custom call runs on pjrt-cpu's kernels and matches numpy;
7. the control: pip building `pjrt` from its sdist here fails at compiling its C code;
8. with --hardware-packages: the pjrt-cuda, pjrt-rocm and pjrt-tpu wheels install with
   `--no-deps` (their vendors' libraries are hundreds of MB each; the `vendor` environment
   runs them), import, register their entry points, and their backends fail cleanly, naming
   the vendor package to install, while the cpu backend stays up.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
# platform -> (package, what its backend's reason says to install without its vendor's wheel)
HARDWARE = {"cuda": ("pjrt_cuda", "'pjrt-cuda[cuda13]'"),
            "rocm": ("pjrt_rocm", "'pjrt-rocm[rocm10]'"),
            "tpu": ("pjrt_tpu", "libtpu")}
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++", "x86_64-linux-gnu-gcc")


class CheckFailed(Exception):
    """One check did not hold; the message says which and what was seen."""


def step(title: str) -> None:
    """Print the heading of the next step."""
    print(f"\n== {title}", flush=True)


def run(argv: list[str], cwd: pathlib.Path, env: dict[str, str] | None = None,
        show: bool = True, label: str = "") -> str:
    """Run ``argv``; its output, or CheckFailed with that output when it exits non-zero."""
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    if show or result.returncode:
        print(output.rstrip())
    label = label or " ".join([pathlib.Path(argv[0]).name, *argv[1:3]])
    print(f"   ({label}: exit {result.returncode}, "
          f"{time.perf_counter() - started:.1f} s)", flush=True)
    if result.returncode:
        raise CheckFailed(f"{' '.join(argv)} exited with {result.returncode}")
    return result.stdout


def the_wheel(dist: pathlib.Path, distribution: str) -> pathlib.Path:
    """The one wheel file of ``distribution`` in ``dist``."""
    wheels = sorted(dist.glob(f"{distribution.replace('-', '_')}-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one {distribution} wheel in {dist}, found "
                          f"{[w.name for w in wheels] or 'none'}: run bash scripts/build-wheels.sh")
    return wheels[0]


def check_no_compiler() -> None:
    """No C compiler on PATH and CC names none, so nothing below can compile C."""
    found = {name: shutil.which(name) for name in COMPILERS if shutil.which(name)}
    if found:
        raise CheckFailed(f"a C compiler is reachable on PATH ({found}); run this from the "
                          f"install-py* environments of tox.ini, which take it away")
    for variable in ("CC", "CXX"):
        value = os.environ.get(variable)
        if not value or subprocess.run([*shlex.split(value), "--version"],
                                       capture_output=True).returncode == 0:
            raise CheckFailed(f"{variable} should name a command that fails (it is {value!r})")
    print(f"no {', '.join(COMPILERS)} on PATH; CC={os.environ['CC']} CXX={os.environ['CXX']}")


def check_sdist_fails(cwd: pathlib.Path, dist: pathlib.Path) -> None:
    """The control: pip building the core from its sdist here fails at compiling its C code, so
    the installs above compiled nothing."""
    sdists = sorted(dist.glob("pjrt-*.tar.gz"))
    if len(sdists) != 1:
        raise CheckFailed(f"expected one pjrt sdist in {dist}, found {[s.name for s in sdists]}")
    env = {k: v for k, v in os.environ.items() if k != "PIP_ONLY_BINARY"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-binary", "pjrt",
         "--target", str(cwd / "sdist-build"), str(sdists[0])],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    if result.returncode == 0 or "_pjrt_cffi" not in output:
        print(output.rstrip())
        raise CheckFailed("building pjrt from its sdist should have failed at compiling the cffi "
                          f"extension (exit {result.returncode})")
    print(f"building {sdists[0].name} fails at compiling pjrt._pjrt_cffi, as it should "
          f"({time.perf_counter() - started:.1f} s)")


def check_outside_checkout(cwd: pathlib.Path) -> None:
    """Nothing can come from the checkout's sources: not the working directory, not PYTHONPATH."""
    if cwd == ROOT or ROOT in cwd.parents:
        raise CheckFailed(f"run this from outside the checkout ({ROOT}), not from {cwd}")
    if os.environ.get("PYTHONPATH"):
        raise CheckFailed(f"PYTHONPATH is set ({os.environ['PYTHONPATH']}); the packages must "
                          f"come from the installed wheels")


def check_installed(cwd: pathlib.Path, wheels: dict[str, pathlib.Path]) -> None:
    """Each package imports from site-packages, installed from its wheel file."""
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for distribution, wheel in wheels.items():
        module = distribution.replace("-", "_")
        probe = ("import importlib.metadata as m, json, " + module + "\n"
                 "d = m.distribution(" + repr(distribution) + ")\n"
                 "print(json.dumps([" + module + ".__file__, d.version, "
                 "d.read_text('direct_url.json'), [f.name for f in d.files or []]]))\n")
        file, version, direct_url, files = json.loads(
            run([sys.executable, "-c", probe], cwd, show=False, label=f"import {module}"))
        where = pathlib.Path(file).resolve()
        if not any(pathlib.Path(s).resolve() in where.parents for s in site):
            raise CheckFailed(f"{module} was imported from {file}, not from this environment's "
                              f"site-packages ({', '.join(sorted(site))})")
        url = json.loads(direct_url or "{}").get("url", "")
        if url != wheel.resolve().as_uri():
            raise CheckFailed(f"pip installed {distribution} from {url or 'an index'}, "
                              f"not from {wheel}")
        if f"-{version}-" not in wheel.name:
            raise CheckFailed(f"{distribution} {version} installed, but the wheel is {wheel.name}")
        print(f"{module} {version} from {file} (installed from {wheel.name})")
        # Every Python module imports on this Python (the checks below reach only some); a
        # shared library beside them (pjrt_cpu's LAPACK kernels) is no Python module.
        walk = ("import importlib, importlib.util, pkgutil, " + module + "\n"
                "for m in pkgutil.walk_packages(" + module + ".__path__, '" + module + ".'):\n"
                "    if importlib.util.find_spec(m.name).origin.endswith('.py'):\n"
                "        importlib.import_module(m.name)\n")
        run([sys.executable, "-c", walk], cwd, show=False, label=f"every {module} module")
        if module == "pjrt":
            extensions = [f for f in files if f.startswith("_pjrt_cffi") and f.endswith(".so")]
            if not extensions:
                raise CheckFailed(f"the pjrt wheel installed no compiled cffi extension: {files}")


def check_info(cwd: pathlib.Path, env: dict[str, str], version: str,
               hardware: bool) -> None:
    """`pjrt info` works, and its JSON shows the cpu backend up, served by our package."""
    pjrt = str(pathlib.Path(sys.executable).with_name("pjrt"))
    run([pjrt, "info"], cwd, env)
    info = json.loads(run([pjrt, "info", "--json"], cwd, env, show=False))
    plugins = {p["name"]: p for p in info["plugins"]}
    backends = {b["name"]: b for b in info["backends"]}
    cpu = backends.get("cpu", {})
    if cpu.get("status") != "up" or not cpu.get("default") or not cpu.get("device_count"):
        raise CheckFailed(f"pjrt info: the cpu backend is not up and default: {cpu}")
    if (plugins["cpu"]["package"], plugins["cpu"]["package_version"]) != ("pjrt-cpu", version):
        raise CheckFailed(f"pjrt info: cpu is served by {plugins['cpu']}, not pjrt-cpu {version}")
    if info["pjrt_version"] != version:
        raise CheckFailed(f"pjrt info reports pjrt {info['pjrt_version']}, expected {version}")
    print(f"pjrt info: cpu backend up and default, {cpu['device_count']} devices, "
          f"PJRT API {cpu['plugin_api_version']}")
    if hardware:
        for platform, (_, vendor) in HARDWARE.items():
            backend = backends.get(platform, {})
            if backend.get("status") != "failed" or f"pip install {vendor}" not in backend["reason"]:
                raise CheckFailed(f"pjrt info: the {platform} backend should have failed, saying "
                                  f"to pip install {vendor}; it reads {backend}")
        print("pjrt info: cuda, rocm and tpu are reported unavailable, naming "
              + ", ".join(vendor for _, vendor in HARDWARE.values()))


def check_readme(cwd: pathlib.Path, env: dict[str, str]) -> None:
    """README's Python blocks, extracted and run as tests/test_docs_snippets.py runs them."""
    spec = importlib.util.spec_from_file_location("test_docs_snippets",
                                                  ROOT / "tests" / "test_docs_snippets.py")
    assert spec and spec.loader
    snippets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippets)
    script, left_out = snippets.script_of(ROOT / "README.md")
    if not script.strip():
        raise CheckFailed("README.md has no Python block to run")
    # The blocks open files under examples/ relative to the working directory: a copy of them
    # sits beside the program, outside the checkout. The first lines make sure the pjrt the
    # blocks use is the installed one.
    shutil.copytree(ROOT / "examples", cwd / "examples", dirs_exist_ok=True)
    program = cwd / "readme_snippets.py"
    program.write_text(
        "import pathlib, sysconfig, pjrt\n"
        "_site = pathlib.Path(sysconfig.get_paths()['platlib']).resolve()\n"
        "assert _site in pathlib.Path(pjrt.__file__).resolve().parents, pjrt.__file__\n"
        + script, encoding="utf-8")
    run([sys.executable, str(program)], cwd, env)
    blocks = script.count("# --- README.md:")
    print(f"README.md: {blocks} Python blocks ran"
          + (f"; left out: {', '.join(left_out)}" if left_out else ""))


def check_demo(cwd: pathlib.Path, env: dict[str, str]) -> None:
    """`pjrt demo` runs and its two programs agree with numpy."""
    output = run([str(pathlib.Path(sys.executable).with_name("pjrt")), "demo"], cwd, env)
    errors = [float(e) for e in re.findall(r"max \|pjrt - numpy\| = (\S+?);?$", output, re.M)]
    if len(errors) != 2 or max(errors) > 1e-4:
        raise CheckFailed(f"pjrt demo: expected two results within 1e-4 of numpy, got {errors}")
    print(f"pjrt demo: both programs within {max(errors):.1e} of numpy")


LAPACK_PROGRAM = """\
import sys
import numpy as np
import pjrt
a = np.random.default_rng(0).standard_normal((5, 5))
a = a @ a.T + 5 * np.eye(5)
program = pjrt.compile(open(sys.argv[1]).read(), pjrt.devices()[0])
error = np.abs(np.asarray(program(a)) - np.linalg.cholesky(a)).max()
assert error < 1e-12, f"cholesky differs from numpy's by {error}"
print(f"cholesky (lapack_dpotrf_ffi) within {error:.1e} of numpy")
"""


def check_lapack(cwd: pathlib.Path, env: dict[str, str]) -> None:
    """pjrt-cpu's LAPACK kernels (the wheel's own C library over SciPy's LAPACK) serve a
    program that jax lowered to a LAPACK custom call."""
    program = cwd / "cholesky.py"
    program.write_text(LAPACK_PROGRAM, encoding="utf-8")
    run([sys.executable, str(program),
         str(ROOT / "tests" / "fixtures" / "linalg" / "cholesky.float64.mlir")], cwd, env)


def check_hardware_packages(cwd: pathlib.Path, dist: pathlib.Path) -> None:
    """The three hardware packages' wheels install (without their vendors' libraries) and
    import, and each registers its ``jax_plugins`` entry point."""
    wheels = [the_wheel(dist, module.replace("_", "-")) for module, _ in HARDWARE.values()]
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:",
         *map(str, wheels)], cwd)
    check_installed(cwd, {module.replace("_", "-"): wheel
                          for (module, _), wheel in zip(HARDWARE.values(), wheels)})
    probe = ("import importlib.metadata as m, json\n"
             + "".join(f"import {module}\n" for module, _ in HARDWARE.values())
             + "print(json.dumps(sorted(e.value for e in m.entry_points(group='jax_plugins'))))\n")
    entry_points = json.loads(run([sys.executable, "-c", probe], cwd, show=False,
                                  label="entry points"))
    expected = sorted(["pjrt_cpu", *(module for module, _ in HARDWARE.values())])
    if entry_points != expected:
        raise CheckFailed(f"jax_plugins entry points {entry_points}, expected {expected}")
    print(f"jax_plugins entry points: {', '.join(entry_points)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dist", type=pathlib.Path, default=ROOT / "dist")
    parser.add_argument("--hardware-packages", action="store_true",
                        help="also install pjrt-cuda, pjrt-rocm and pjrt-tpu (--no-deps)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pjrt-wheels-") as directory:
        return check(args.dist.resolve(), pathlib.Path(directory).resolve(),
                     args.hardware_packages)


def check(dist: pathlib.Path, cwd: pathlib.Path, hardware_packages: bool) -> int:
    """Run the checks in ``cwd``; 0 when all pass, else 1 (saying which failed)."""
    print(f"Python {sys.version.split()[0]} at {sys.executable}; working in {cwd}")
    # What the snippets test sets, for the same reasons: the CPU plugin alone, jax (absent
    # here anyway) on the CPU, and no device count or log level from the caller. pjrt reads
    # JAX_PLATFORMS when PJRT_PLATFORMS is unset: an empty PJRT_PLATFORMS brings up every
    # backend, as `pjrt info` is checked to.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PJRT_PLATFORMS", "PJRT_CPU_DEVICE_COUNT", "PJRT_LOG_LEVEL")}
    env.update(JAX_PLATFORMS="cpu", PJRT_PLATFORMS="")
    try:
        check_outside_checkout(cwd)
        check_no_compiler()
        step("pip install --only-binary :all: the pjrt and pjrt-cpu wheels")
        wheels = {name: the_wheel(dist, name) for name in ("pjrt", "pjrt-cpu")}
        # A reused environment may hold an earlier build of the same version, which pip would
        # keep: remove ours first (their dependencies stay).
        run([sys.executable, "-m", "pip", "uninstall", "--yes", "pjrt", "pjrt-cpu",
             *(module.replace("_", "-") for module, _ in HARDWARE.values())], cwd, show=False)
        run([sys.executable, "-m", "pip", "install", "--only-binary", ":all:",
             *map(str, wheels.values())], cwd)
        version = wheels["pjrt"].name.split("-")[1]
        step("where the packages came from")
        check_installed(cwd, wheels)
        step("pjrt info")
        check_info(cwd, env, version, hardware=False)
        step("README.md's Python blocks")
        check_readme(cwd, dict(env, PJRT_PLATFORMS="cpu"))
        step("pjrt demo")
        check_demo(cwd, env)
        step("pjrt-cpu's LAPACK kernels")
        check_lapack(cwd, dict(env, PJRT_PLATFORMS="cpu"))
        step("the control: no C compiler here")
        check_sdist_fails(cwd, dist)
        if hardware_packages:
            step("the pjrt-cuda, pjrt-rocm and pjrt-tpu wheels, without their vendors' libraries")
            check_hardware_packages(cwd, dist)
            check_info(cwd, env, version, hardware=True)
    except CheckFailed as error:
        print(f"\nFAILED: {error}", file=sys.stderr)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
