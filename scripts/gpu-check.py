"""The steps of scripts/gpu-check.sh: pjrt and pjrt-cuda, installed from local wheels, checked
on this machine's NVIDIA GPUs with the CUDA plugin wheel installed here.

Each step runs in a child process with a time limit (all of them together stay under
``--budget`` seconds) and ends as PASS, FAIL or SKIP with its reason. The last, ``bench``
(benchmarks/bench_gpu.py: pjrt next to jax on the first device), runs in what the behaviour
steps left of the budget, so that it never costs one of them its verdict. The report file holds
the verdicts and each step's output; stdout gets the verdicts. Exit status: 0 when no step
failed, else 1.

Only the standard library is imported here: the children import pjrt from ``--site``.
``--platform cpu`` runs the program steps on the CPU plugin instead, to check this script on
a machine without a GPU (with pjrt-cpu installed).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: How much of a step's output the report keeps (its end).
OUTPUT_LIMIT = 12000

#: Seconds the bench step may take: bench_gpu.py's full run (about a minute on one H100,
#: under 150 s), and its --quick run (smaller transfers, shorter loops).
BENCH_LIMIT = 180
BENCH_QUICK_LIMIT = 90


@dataclasses.dataclass
class Step:
    name: str
    verdict: str = "SKIP"  # PASS, FAIL or SKIP
    reason: str = ""
    seconds: float = 0.0
    output: str = ""


class Checker:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.platform = args.platform
        self.deadline = time.monotonic() + args.budget
        self.steps: list[Step] = []
        self.env = dict(os.environ)
        if args.site:
            self.env["PYTHONPATH"] = os.pathsep.join(
                [args.site, *filter(None, [os.environ.get("PYTHONPATH")])])
        # Several processes share the GPUs here (and torch): each takes memory as it needs it.
        self.env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-"))
        #: Report lines written after the verdicts (the benchmark's table).
        self.report_sections: list[str] = []

    # -- running ---------------------------------------------------------------------------

    def run(self, name: str, argv: list[str], limit: float, *, env: dict | None = None,
            cwd: pathlib.Path | None = None) -> tuple[Step, subprocess.CompletedProcess | None]:
        """Run ``argv`` as step ``name``; PASS when it exits 0."""
        step = Step(name)
        self.steps.append(step)
        left = self.deadline - time.monotonic() - 5
        if left < 10:
            step.reason = "no time left in the budget"
            return step, None
        limit = min(limit, left)
        started = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=cwd or self.work, env=env or self.env,
                                  capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as error:
            step.seconds = time.monotonic() - started
            step.verdict, step.reason = "FAIL", f"did not finish in {limit:.0f} s"
            step.output = _text(error.stdout) + _text(error.stderr)
            return step, None
        step.seconds = time.monotonic() - started
        step.output = done.stdout + done.stderr
        if done.returncode == 0:
            step.verdict = "PASS"
        else:
            step.verdict = "FAIL"
            last = [line for line in step.output.splitlines() if line.strip()][-1:]
            step.reason = f"exit status {done.returncode}" + (f": {last[0][:200]}" if last else "")
        return step, done

    def python(self, name: str, source: str, limit: float, *args: str,
               env: dict | None = None) -> tuple[Step, subprocess.CompletedProcess | None]:
        program = self.work / f"{name}.py"
        program.write_text(source, encoding="utf-8")
        return self.run(name, [sys.executable, str(program), *args], limit, env=env)

    def skip(self, name: str, reason: str) -> Step:
        step = Step(name, "SKIP", reason)
        self.steps.append(step)
        return step

    # -- the steps --------------------------------------------------------------------------

    def install(self) -> bool:
        if not self.args.site:
            self.skip("install", "--site not given: using the pjrt already importable")
            return True
        wheels = sorted(pathlib.Path(self.args.wheels).resolve().glob("*.whl"))
        if not wheels:
            step = Step("install", "FAIL", f"no wheels in {self.args.wheels}: run "
                        f"bash scripts/gpu-check-prepare.sh where there is a network, and carry "
                        f"the folder with the checkout")
            self.steps.append(step)
            return False
        shutil.rmtree(self.args.site, ignore_errors=True)
        step, done = self.run("install", [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
            "--no-compile", "--disable-pip-version-check", "--target", self.args.site,
            *map(str, wheels)], 120)
        if step.verdict != "PASS":
            return False
        # The children must import these copies, not others.
        probe = ("import pathlib, sys, cffi, pjrt, pjrt_cuda\n"
                 "site = pathlib.Path(sys.argv[1]).resolve()\n"
                 "for m in (pjrt, pjrt_cuda):\n"
                 "    assert site in pathlib.Path(m.__file__).resolve().parents, m.__file__\n"
                 "print('pjrt', pjrt.__version__, 'from', pathlib.Path(pjrt.__file__).parent,"
                 " '; cffi', cffi.__version__)\n")
        checked, _ = self.python("install-probe", probe, 60, self.args.site)
        self.steps.remove(checked)
        step.output += checked.output
        if checked.verdict != "PASS":
            step.verdict, step.reason = "FAIL", f"installed, but {checked.reason}"
            return False
        step.reason = f"{len(wheels)} wheels: {', '.join(w.name.split('-')[0] for w in wheels)}"
        return True

    def vendor(self) -> None:
        if self.platform != "cuda":
            self.skip("vendor-plugin", f"--platform {self.platform}")
            return
        step, done = self.python("vendor-plugin", VENDOR_PROGRAM, 60)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.splitlines()[0]

    def info(self) -> None:
        # The table is for the report; the verdict is read from --json, whose fields do not
        # depend on column widths (a platform version such as "cuda 13000" holds a space).
        step, done = self.run("pjrt-info", [sys.executable, "-m", "pjrt", "info"], 120)
        if done is None or step.verdict != "PASS":
            return
        listed = subprocess.run([sys.executable, "-m", "pjrt", "info", "--json"], cwd=self.work,
                                env=self.env, capture_output=True, text=True, timeout=120)
        try:
            backends = json.loads(listed.stdout)["backends"]
        except (ValueError, KeyError, TypeError):
            step.verdict = "FAIL"
            step.reason = f"pjrt info --json printed no backends (exit status {listed.returncode})"
            return
        mine = [b for b in backends if b.get("name") == self.platform]
        if not mine or mine[0].get("status") != "up":
            step.verdict = "FAIL"
            reason = mine[0].get("reason") if mine else "not listed"
            step.reason = f"the {self.platform} backend did not come up: {reason}"
        else:
            step.reason = (f"{self.platform} backend up with {mine[0].get('device_count')} "
                           f"device(s), PJRT API {mine[0].get('plugin_api_version')}")

    def conform(self) -> None:
        report = self.work / "conform.json"
        step, done = self.run("pjrt-conform", [
            sys.executable, "-m", "pjrt", "conform", self.platform, "--timeout", "60",
            "--json", str(report)], 200)
        if report.is_file():
            counts = json.loads(report.read_text()).get("counts", {})
            summary = ", ".join(f"{value} {key}" for key, value in counts.items())
            step.reason = f"{summary}" + (f"; {step.reason}" if step.reason else "")

    def readme(self) -> None:
        snippets = _load_snippets()
        script, left_out = snippets.script_of(ROOT / "README.md")
        shutil.copytree(ROOT / "examples", self.work / "examples", dirs_exist_ok=True)
        if self.platform == "cpu":
            env = {**self.env, "PJRT_PLATFORMS": "cpu"}
            step, _ = self.python("readme", script, 120, env=env)
            step.reason = step.reason or f"{script.count('# --- README.md:')} blocks ran as written"
            return
        gpu_script, notes = readme_on_cuda(script, self.gpu_count())
        if gpu_script is None:
            step = Step("readme", "FAIL", notes)
            self.steps.append(step)
            return
        step, _ = self.python("readme", gpu_script, 120)
        ran = gpu_script.count("# --- README.md:")
        step.reason = step.reason or (f"{ran} blocks ran on cuda" + (f"; {notes}" if notes else "")
                                      + (f"; not run: {', '.join(left_out)}" if left_out else ""))

    def sharded(self) -> None:
        step, done = self.python("sharded", SHARDED_PROGRAM, 120, self.platform)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.strip().splitlines()[-1]

    def partitioned_custom_call(self) -> None:
        step, done = self.python("partitioned-custom-call", PARTITIONED_CUSTOM_CALL_PROGRAM, 120,
                                 self.platform)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.strip().splitlines()[-1]

    def profile(self) -> None:
        step, done = self.python("profile", PROFILE_PROGRAM, 120, self.platform)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.strip().splitlines()[-1]

    def dlpack(self) -> None:
        if importlib.util.find_spec("torch") is None:
            self.skip("dlpack-torch", "torch is not installed")
            return
        step, done = self.python("dlpack-torch", DLPACK_PROGRAM, 120, self.platform)
        if done is not None and done.returncode == 0:
            last = done.stdout.strip().splitlines()[-1]
            if last.startswith("SKIP "):
                step.verdict, step.reason = "SKIP", last[5:]
            else:
                step.reason = last

    def linalg(self) -> None:
        if importlib.util.find_spec("jax") is None:
            self.skip("linalg", "jax is not installed (it exports the programs)")
            return
        env = {**self.env, "JAX_PLATFORMS": "cpu", "PJRT_PLATFORMS": self.platform}
        step, done = self.python("linalg", LINALG_PROGRAM, 240, self.platform, env=env)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.strip().splitlines()[-1]

    def gpu_client(self) -> None:
        if self.platform != "cuda":
            self.skip("gpu-client", f"--platform {self.platform}: make_gpu_client needs a GPU")
            return
        step, done = self.python("gpu-client", GPU_CLIENT_PROGRAM, 120)
        if done is not None and done.returncode == 0:
            step.reason = done.stdout.strip().splitlines()[-1]

    def gpu_tests(self) -> None:
        if self.platform != "cuda":
            self.skip("pytest-gpu", f"--platform {self.platform}")
            return
        env = {**self.env, "PJRT_TESTS_CPU_PLUGINS": "optional"}
        files = [str(ROOT / "tests" / name) for name in ("test_gpu.py", "test_distributed.py")]
        step, done = self.run("pytest-gpu", [
            sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q",
            "-rs", *files], 240, env=env, cwd=ROOT)
        summary = [line for line in step.output.splitlines()
                   if re.search(r"\d+ (passed|failed|skipped|error)", line)]
        if summary:
            step.reason = summary[-1].strip("= ")

    def bench(self) -> None:
        """benchmarks/bench_gpu.py's table, in the time left: the full run, else its quick
        form, else none (SKIP, with the seconds left)."""
        left = self.deadline - time.monotonic() - 5
        quick = self.platform == "cpu" or left < BENCH_LIMIT
        if left < (BENCH_QUICK_LIMIT if quick else BENCH_LIMIT):
            self.skip("bench", f"only {max(left, 0):.0f} s of the budget left; the benchmark "
                               f"needs {BENCH_LIMIT} s ({BENCH_QUICK_LIMIT} s with --quick)")
            return
        step, done = self.run("bench", [
            sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--platform",
            self.platform, "--markdown", *(["--quick"] if quick else [])],
            BENCH_QUICK_LIMIT if quick else BENCH_LIMIT, cwd=ROOT)
        if done is None:
            return
        card = re.search(r"^# device: (.+)$", done.stdout, re.M)
        table = [line for line in done.stdout.splitlines() if line.startswith("|")]
        failed = re.search(r"^FAILED: (.+)$", done.stdout, re.M)
        run = "quick run" if quick else "full run"
        if table:
            # The whole printout (header, table, verdict) right after the verdicts; the step's
            # own output below keeps what the libraries logged.
            self.report_sections += ["", f"== bench ({run}): pjrt next to jax on "
                                         f"{card.group(1) if card else self.platform}",
                                     *done.stdout.rstrip().splitlines()]
            step.output = done.stderr
        if failed:
            step.reason = f"{run}: {failed.group(1)[:300]}"
        elif step.verdict == "PASS":
            step.reason = (f"{run} on {card.group(1) if card else self.platform}: "
                           f"{max(len(table) - 2, 0)} rows (table below the verdicts)")

    def gpu_count(self) -> int:
        try:
            done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return len(re.findall(r"^GPU \d+", done.stdout, re.M)) if done.returncode == 0 else 0

    # -- the report -------------------------------------------------------------------------

    def header(self) -> list[str]:
        lines = [f"pjrt GPU check, {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node()}",
                 f"python {sys.version.split()[0]} at {sys.executable}",
                 f"checkout {ROOT}" + (f", wheels {self.args.wheels}, site {self.args.site}"
                                       if self.args.site else ""),
                 f"platform checked: {self.platform}"]
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            lines += [f"GPU {line}" for line in smi.stdout.strip().splitlines()]
        except (OSError, subprocess.TimeoutExpired):
            lines.append("nvidia-smi: not available")
        return lines

    def write(self, report: pathlib.Path, started: float) -> int:
        failed = [s for s in self.steps if s.verdict == "FAIL"]
        verdicts = [f"{s.verdict:4}  {s.name:14} {s.seconds:6.1f} s  {s.reason}" for s in self.steps]
        total = (f"{'FAILED' if failed else 'PASSED'}: "
                 f"{sum(s.verdict == 'PASS' for s in self.steps)} passed, {len(failed)} failed, "
                 f"{sum(s.verdict == 'SKIP' for s in self.steps)} skipped, in "
                 f"{time.monotonic() - started:.0f} s")
        details = []
        for s in self.steps:
            if s.output:
                text = s.output[-OUTPUT_LIMIT:]
                cut = "(... its beginning left out)\n" if len(s.output) > OUTPUT_LIMIT else ""
                details += ["", f"== {s.name}: {s.verdict}", cut + text.rstrip()]
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("\n".join([*self.header(), "", *verdicts, "", total,
                                     *self.report_sections, *details]) + "\n",
                          encoding="utf-8")
        print("\n".join([*verdicts, total, f"report: {report}"]))
        return 1 if failed else 0


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _load_snippets():
    """tests/test_docs_snippets.py, the README extractor the tests use, loaded by path."""
    spec = importlib.util.spec_from_file_location("test_docs_snippets",
                                                  ROOT / "tests" / "test_docs_snippets.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: README's blocks use the CPU plugin; on a GPU machine without it they run on the CUDA plugin
#: with these texts replaced (each must be found, so that a README change is noticed here).
README_ON_CUDA = (
    ("import pjrt, pjrt_cpu", "import pjrt, pjrt_cuda"),
    ('pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())',
     'pjrt.load_pjrt_plugin_dynamically("cuda", pjrt_cuda.library_path())'),
    ('pjrt.make_c_api_client("cpu", {"cpu_device_count": 8})',
     'pjrt.make_c_api_client("cuda", pjrt_cuda.client_options())'),
    ('pjrt.set_platforms("cpu")', 'pjrt.set_platforms("cuda")'),
)

#: Appended to README's script on the GPU: its first block's results against numpy.
README_CHECKS = """
# --- checks of README.md's results (scripts/gpu-check.py)
_a = np.arange(8, dtype=np.float32)
np.testing.assert_allclose(np.asarray(y), np.tanh(_a * _a), rtol=1e-5, atol=1e-6)
_ones = np.ones(8, np.float32)
np.testing.assert_allclose(np.asarray(f(_ones, _ones)), np.tanh(_ones), rtol=1e-5, atol=1e-6)
assert client.platform == "cuda" and device.platform == "cuda", (client.platform, device)
print("README.md's program on", device.device_kind, "equals numpy's")
"""

#: The README block that needs 8 devices: examples/programs/mlp.mlir is lowered for a 2x4 mesh.
README_EIGHT_DEVICES = 'reshape(2, 4), ("x", "y"))'


def readme_on_cuda(script: str, gpus: int) -> tuple[str | None, str]:
    """README's script with the CPU plugin replaced by the CUDA plugin; None and why when a
    text to replace is gone. Blocks that need 8 devices are cut off with fewer GPUs."""
    for cpu_text, cuda_text in README_ON_CUDA:
        if cpu_text not in script:
            return None, (f"README.md no longer contains {cpu_text!r}: update README_ON_CUDA in "
                          f"scripts/gpu-check.py")
        script = script.replace(cpu_text, cuda_text)
    # The blocks show results rather than check them; on the GPU they are checked here.
    script += README_CHECKS
    notes = ""
    if gpus < 8:
        blocks = script.split("\n# --- ")
        kept = [b for b in blocks if README_EIGHT_DEVICES not in b]
        if len(kept) < len(blocks):
            left = [b.split("\n", 1)[0] for b in blocks if README_EIGHT_DEVICES in b]
            notes = f"left out {', '.join(left)} (a 2x4 mesh: needs 8 GPUs, {gpus} here)"
            script = "\n# --- ".join(kept)
    return script, notes


VENDOR_PROGRAM = """\
import pjrt_cuda
from pjrt_cuda import libraries
vendor = pjrt_cuda.vendor_plugin()
print(f"{vendor} (CUDA {vendor.cuda})")
print(f"library {vendor.library}")
for found in libraries.find_cuda_libraries(cuda=vendor.cuda):
    print(f"  {found.component.name:13} {found.version_text:10} ({found.version_source}) "
          f"{found.directory}" + (f" load error: {found.load_error}" if found.load_error else ""))
libraries.check_versions(libraries.find_cuda_libraries(cuda=vendor.cuda), str(vendor))
"""

#: A program over all the platform's devices: each one's rows plus the sum of all rows (an
#: all-reduce when there are several devices), checked against numpy.
SHARDED_PROGRAM = """\
import sys
import numpy as np
import pjrt

platform = sys.argv[1]
pjrt.set_platforms(platform)
devices = pjrt.devices()
n = len(devices)
sharding = "{devices=[%d,1]%s}" % (n, ",".join(str(i) for i in range(n)))
rows = 2 * n
program = f'''
module @sharded attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{rows}x4xf32> {{mhlo.sharding = "{sharding}"}})
      -> (tensor<{rows}x4xf32> {{mhlo.sharding = "{sharding}"}}) {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1]
        : (tensor<{rows}x4xf32>, tensor<f32>) -> tensor<f32>
    %all = stablehlo.broadcast_in_dim %sum, dims = [] : (tensor<f32>) -> tensor<{rows}x4xf32>
    %y = stablehlo.add %x, %all : tensor<{rows}x4xf32>
    return %y : tensor<{rows}x4xf32>
  }}
}}'''
mesh = pjrt.Mesh(np.array(devices), ("x",))
host = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
x = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x", None)))
y = pjrt.compile(program, mesh)(x)
np.testing.assert_array_equal(np.asarray(y), host + host.sum())
shard_devices = sorted(s.device.id for s in y.addressable_shards)
assert shard_devices == sorted(d.id for d in devices), shard_devices
print(f"{n}-device mesh over {platform} ({devices[0].device_kind}): rows + all-reduced sum "
      f"equal numpy's, one shard per device")
"""

#: One program compiled and run under pjrt.profiler.trace: pjrt's events in the trace file, and
#: on the GPU the plugin's own device activity (its PJRT profiler extension) in the .xplane.pb
#: file, which must exist and hold planes. The CPU plugins have no profiler: the trace says so.
PROFILE_PROGRAM = """\
import gzip
import json
import os
import sys
import tempfile

import numpy as np
import pjrt
from pjrt import profiler
from pjrt._profiling import xspace

platform = sys.argv[1]
pjrt.set_platforms(platform)
device = pjrt.devices()[0]
log_dir = tempfile.mkdtemp(prefix="pjrt-profile-")
x = pjrt.device_put(np.full((256, 256), 0.5, np.float32), device)
with profiler.trace(log_dir):
    with profiler.TraceAnnotation("matmul steps"):
        matmul = pjrt.compile('''
func.func public @main(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0]
      : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  return %y : tensor<256x256xf32>
}''', device)
        for _ in range(5):
            y = matmul(x)
        y.block_until_ready()
run, = (os.path.join(log_dir, "plugins", "profile", name)
        for name in os.listdir(os.path.join(log_dir, "plugins", "profile")))
trace, = (name for name in os.listdir(run) if name.endswith(".trace.json.gz"))
with gzip.open(os.path.join(run, trace), "rt") as stream:
    document = json.load(stream)
events = [e for e in document["traceEvents"] if e["ph"] == "X"]
launches = [e for e in events if e["cat"] == "launch"]
assert len(launches) == 5, launches
assert {e["args"]["devices"] for e in launches} == {f"{platform}:{device.id}"}, launches
assert any(e["cat"] == "compile" for e in events) and any(e["cat"] == "wait" for e in events)
np.testing.assert_allclose(np.asarray(y), np.full((256, 256), 64.0, np.float32))
notes = document["otherData"]["notes"]
for note in notes:
    print("note:", note)
planes = [name for name in os.listdir(run) if name.endswith(".xplane.pb")]
if platform == "cpu":
    assert not planes and any("no profiler extension" in n for n in notes), (planes, notes)
    print(f"{len(events)} events in {trace}; the CPU plugin has no profiler extension, as the "
          f"trace notes")
    sys.exit(0)
assert planes, f"no .xplane.pb in {run}: the plugin recorded no device activity ({notes})"
path = os.path.join(run, planes[0])
size = os.path.getsize(path)
assert size > 0, f"{path} is empty"
names = xspace.plane_names(open(path, "rb").read())
assert names, f"{path} holds no planes"
devices = [n for n in names if n.startswith("/device:")]
print(f"{len(events)} events in {trace}; {planes[0]}: {size} bytes, {len(names)} planes "
      f"({', '.join(devices) or 'no /device: plane'}; others: "
      f"{', '.join(n for n in names if n not in devices) or 'none'})")
"""

#: A custom call partitioned by Python callbacks through the plugin's custom partitioner
#: extension (pjrt.xla_client.register_custom_call_partitioner): the plugin's SPMD partitioner
#: asks the callbacks for each device's computation (twice the rows of its shard), checked
#: against numpy. XLA's CPU builds have no such extension: there the refusal is checked.
PARTITIONED_CUSTOM_CALL_PROGRAM = """\
import sys
import numpy as np
import pjrt
from pjrt import xla_client
from pjrt.errors import UnsupportedFeatureError
from pjrt.hlo_sharding import HloSharding

platform = sys.argv[1]
pjrt.set_platforms(platform)
client = pjrt.get_backend(platform)
devices = client.devices()
n = len(devices)
calls = []


def infer(arg_shapes, arg_shardings, result_shape, config):
    calls.append("infer")
    return arg_shardings[0]


def propagate(user_sharding, shape, config):
    calls.append("propagate")
    return user_sharding


def partition(arg_shapes, arg_shardings, result_shape, result_sharding, config):
    calls.append("partition")
    rows, columns = arg_shapes[0].dimensions()
    local = f"tensor<{rows // n}x{columns}xf32>"
    module = f\'\'\'
module @per_device {{
  func.func public @main(%x: {local}) -> {local} {{
    %y = stablehlo.add %x, %x : {local}
    return %y : {local}
  }}
}}\'\'\'
    split = HloSharding.iota_tile((n, 1))
    return module, [split], split


try:
    xla_client.register_custom_call_partitioner("pjrt_check_double_rows", propagate, partition,
                                                infer, c_api=client.plugin)
except UnsupportedFeatureError as error:
    if platform != "cpu":
        raise
    assert "Custom_Partitioner" in str(error), error
    print(f"the CPU plugin has no custom partitioner extension, as expected: {error}")
    sys.exit(0)
sharding = "{devices=[%d,1]<=[%d]}" % (n, n)
rows = 2 * n
program = f\'\'\'
module @partitioned attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{rows}x4xf32> {{mhlo.sharding = "{sharding}"}})
      -> (tensor<{rows}x4xf32> {{mhlo.sharding = "{sharding}"}}) {{
    %y = stablehlo.custom_call @pjrt_check_double_rows(%x) {{backend_config = "rows",
        mhlo.sharding = "{sharding}"}} : (tensor<{rows}x4xf32>) -> tensor<{rows}x4xf32>
    return %y : tensor<{rows}x4xf32>
  }}
}}\'\'\'
mesh = pjrt.Mesh(np.array(devices), ("x",))
host = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
x = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x", None)))
y = pjrt.compile(program, mesh)(x)
np.testing.assert_array_equal(np.asarray(y), host * 2)
assert "partition" in calls, calls
print(f"{n}-device custom call partitioned by Python callbacks ({', '.join(sorted(set(calls)))}) "
      f"on {devices[0].device_kind}: equal to numpy's")
"""

#: A torch tensor on the GPU into pjrt and back, through a program, checked against torch.
DLPACK_PROGRAM = """\
import sys
import numpy as np
import torch
import pjrt

platform = sys.argv[1]
if platform == "cuda" and not torch.cuda.is_available():
    print("SKIP torch has no CUDA here")
    sys.exit(0)
pjrt.set_platforms(platform)
device = pjrt.devices()[0]
where = "cuda:0" if platform == "cuda" else "cpu"
tensor = torch.arange(24, dtype=torch.float32, device=where).reshape(4, 6) * 1.5
array = pjrt.from_dlpack(tensor)
assert array.devices() == {device} or next(iter(array.devices())).platform == platform, array
np.testing.assert_array_equal(np.asarray(array), tensor.cpu().numpy())
double = pjrt.compile('''
func.func public @main(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %y = stablehlo.add %x, %x : tensor<4x6xf32>
  return %y : tensor<4x6xf32>
}''', device)
result = double(array)
back = torch.from_dlpack(result)
assert back.device.type == torch.device(where).type, back.device
torch.testing.assert_close(back, tensor * 2)
# And the other way: a pjrt Array read by torch without leaving the device.
again = torch.from_dlpack(pjrt.from_dlpack(back))
torch.testing.assert_close(again, tensor * 2)
if platform == "cuda":
    # Streams: torch's work on a non-default stream, handed to pjrt with no host wait (pjrt
    # asks for it on the device's stream for external ready events), and a long pjrt program
    # read by torch on that stream (the plugin makes the stream wait for the result).
    stream = device.get_stream_for_external_ready_events()
    assert stream, stream
    side = torch.cuda.Stream()
    n = 2048
    with torch.cuda.stream(side):
        base = torch.rand(n, n, device=where) / n
        product = base
        for _ in range(20):
            product = product @ base + base
        handed = pjrt.from_dlpack(product)
    expected = product.cpu().numpy()
    np.testing.assert_allclose(np.asarray(handed), expected, rtol=1e-4, atol=1e-6)
    chain = pjrt.compile('''
func.func public @main(%x: tensor<2048x2048xf32>) -> tensor<2048x2048xf32> {
  %a = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0]
      : (tensor<2048x2048xf32>, tensor<2048x2048xf32>) -> tensor<2048x2048xf32>
  %b = stablehlo.dot_general %a, %x, contracting_dims = [1] x [0]
      : (tensor<2048x2048xf32>, tensor<2048x2048xf32>) -> tensor<2048x2048xf32>
  %c = stablehlo.dot_general %b, %x, contracting_dims = [1] x [0]
      : (tensor<2048x2048xf32>, tensor<2048x2048xf32>) -> tensor<2048x2048xf32>
  return %c : tensor<2048x2048xf32>
}''', device)
    source = pjrt.device_put(np.full((n, n), 1.0 / n, np.float32), device)
    with torch.cuda.stream(side):
        out = chain(source)  # still running when torch takes it
        read = torch.from_dlpack(out)  # __dlpack__(stream=side's handle)
        total = float(read.sum())
    assert abs(total - n * n / n) < 1e-2 * n, total
    print(f"streams: pjrt's external-ready stream {stream:#x}; torch work on a side stream "
          f"taken by pjrt, and a pjrt program read by torch on that stream, without host waits")
print(f"torch {torch.__version__} tensor on {where} -> pjrt ({device.device_kind}) -> program "
      f"-> torch on {back.device}: values equal")
"""


#: jax's linear algebra, exported by jax for the platform and run by pjrt (on cuda: the
#: cuSOLVER/cuSPARSE kernels of the kernel wheel, registered by pjrt-cuda): solve, inv, det,
#: slogdet, lu, cholesky, qr, eigh, svd, lstsq, pinv and tridiagonal_solve, in f32 and f64,
#: without and with a batch dimension, well- and ill-conditioned (condition 1e3 in f32, 1e10
#: in f64), each judged against numpy by a backward error (residual or reconstruction) or,
#: where numpy's answer is unique, the forward error scaled by the condition; in units of the
#: type's epsilon, at most 200 * n. jax stays on the CPU: it only exports.
LINALG_PROGRAM = """\
import os
import sys

import numpy as np

platform = sys.argv[1]
import jax  # noqa: E402  (the child's environment keeps jax on the CPU: it only exports)
import jax.numpy as jnp  # noqa: E402
from jax import export  # noqa: E402

import pjrt  # noqa: E402

jax.config.update("jax_enable_x64", True)
pjrt.set_platforms(platform)
device = pjrt.devices()[0]
rng = np.random.default_rng(0)
N = 6


def matrix(batch, dtype, cond):
    # Q1 diag(s) Q2 with singular values from 1 down to 1/cond.
    shape = batch + (N, N)
    q1, _ = np.linalg.qr(rng.standard_normal(shape))
    q2, _ = np.linalg.qr(rng.standard_normal(shape))
    s = np.geomspace(1.0, 1.0 / cond, N)
    return (q1 * s[..., None, :]) @ q2


def spd(batch, dtype, cond):
    q, _ = np.linalg.qr(rng.standard_normal(batch + (N, N)))
    s = np.geomspace(1.0, 1.0 / cond, N)
    return (q * s[..., None, :]) @ np.swapaxes(q, -1, -2)


def scale(a):
    return np.linalg.norm(a, axis=(-2, -1)).max()


def sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def checks(name, dtype, batch, cond):
    # (function, inputs, error(result, *inputs) -> relative error)
    a = matrix(batch, dtype, cond).astype(dtype)
    b = rng.standard_normal(batch + (N, 2)).astype(dtype)
    eye = np.eye(N, dtype=dtype)
    t = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
    if name == "solve":
        return jnp.linalg.solve, [a, b], lambda x, a, b: np.abs(a @ x - b).max() / (
            scale(a) * np.abs(x).max() + np.abs(b).max())
    if name == "inv":
        return jnp.linalg.inv, [a], lambda x, a: np.abs(a @ x - eye).max() / (
            scale(a) * np.abs(x).max())
    if name == "det":
        def det_error(d, a):
            want = np.linalg.det(a.astype(np.float64))
            return np.abs(d - want).max() / (np.abs(want).max() * cond)
        return jnp.linalg.det, [a], det_error
    if name == "slogdet":
        return (lambda a: tuple(jnp.linalg.slogdet(a))), [a], lambda r, a: max(
            np.abs(r[0] - np.linalg.slogdet(a.astype(np.float64))[0]).max(),
            np.abs(r[1] - np.linalg.slogdet(a.astype(np.float64))[1]).max() / cond)
    if name == "lu":
        def err(r, a):
            lu, _, perm = r
            lower = np.tril(lu, -1) + eye
            upper = np.triu(lu)
            permuted = np.take_along_axis(a, perm[..., :, None].astype(np.int64), axis=-2)
            return np.abs(lower @ upper - permuted).max() / scale(a)
        return jax.lax.linalg.lu, [a], err
    if name == "cholesky":
        s = spd(batch, dtype, cond).astype(dtype)
        return jnp.linalg.cholesky, [s], lambda l, s: np.abs(l @ t(l) - s).max() / scale(s)
    if name == "qr":
        return (lambda a: tuple(jnp.linalg.qr(a))), [a], lambda r, a: max(
            np.abs(r[0] @ r[1] - a).max() / scale(a), np.abs(t(r[0]) @ r[0] - eye).max())
    if name == "eigh":
        s = sym(a)
        return (lambda s: tuple(jnp.linalg.eigh(s))), [s], lambda r, s: max(
            np.abs((r[1] * r[0][..., None, :]) @ t(r[1]) - s).max() / scale(s),
            np.abs(r[0] - np.linalg.eigvalsh(s.astype(np.float64))).max() / scale(s))
    if name == "svd":
        return (lambda a: tuple(jnp.linalg.svd(a, full_matrices=False))), [a], lambda r, a: max(
            np.abs((r[0] * r[1][..., None, :]) @ r[2] - a).max() / scale(a),
            np.abs(r[1] - np.linalg.svd(a.astype(np.float64), compute_uv=False)).max() / scale(a))
    if name == "lstsq":
        tall = rng.standard_normal((2 * N, N)).astype(dtype)
        rhs = rng.standard_normal((2 * N, 2)).astype(dtype)
        want = np.linalg.lstsq(tall.astype(np.float64), rhs.astype(np.float64), rcond=None)[0]
        return (lambda a, b: jnp.linalg.lstsq(a, b)[0]), [tall, rhs], \\
            lambda x, a, b: np.abs(x - want).max() / np.abs(want).max()
    if name == "pinv":
        want = np.linalg.pinv(a.astype(np.float64))
        return jnp.linalg.pinv, [a], lambda x, a: np.abs(x - want).max() / (
            np.abs(want).max() * cond)
    if name == "tridiagonal_solve":
        d = (4 + rng.random(batch + (N,))).astype(dtype)
        dl = rng.random(batch + (N,)).astype(dtype)
        du = rng.random(batch + (N,)).astype(dtype)
        dl[..., 0] = 0
        du[..., -1] = 0
        def err(x, dl, d, du, b):
            full = np.zeros(batch + (N, N), dtype)
            idx = np.arange(N)
            full[..., idx, idx] = d
            full[..., idx[1:], idx[:-1]] = dl[..., 1:]
            full[..., idx[:-1], idx[1:]] = du[..., :-1]
            return np.abs(full @ x - b).max() / (scale(full) * np.abs(x).max())
        return jax.lax.linalg.tridiagonal_solve, [dl, d, du, b], err
    raise ValueError(name)


NAMES = ["solve", "inv", "det", "slogdet", "lu", "cholesky", "qr", "eigh", "svd", "lstsq",
         "pinv", "tridiagonal_solve"]
worst, failures, runs = {}, [], 0
for name in NAMES:
    for dtype in (np.float32, np.float64):
        eps = np.finfo(dtype).eps
        for batch in ((), (3,)):
            if name == "lstsq" and batch:
                continue
            conds = [10.0] + ([] if name in ("tridiagonal_solve", "lstsq") else
                              [1e3 if dtype == np.float32 else 1e10])
            for cond in conds:
                fn, inputs, error = checks(name, dtype, batch, cond)
                exported = export.export(jax.jit(fn), platforms=[platform])(*inputs)
                mine = pjrt.deserialize_exported(exported.serialize())
                out = mine(*inputs)
                if isinstance(out, pjrt.Array):
                    result = np.asarray(out)
                else:
                    result = tuple(np.asarray(o) for o in out)
                value = float(error(result, *inputs)) / eps
                runs += 1
                key = f"{name} {np.dtype(dtype).name}"
                worst[key] = max(worst.get(key, 0.0), value)
                if not np.isfinite(value) or value > 200 * N:
                    failures.append(f"{key} batch={batch} cond={cond:g}: error {value:.1f} eps")
for key, value in worst.items():
    print(f"  {key:28} worst error {value:8.1f} eps")
if failures:
    print("FAILED:", "; ".join(failures))
    sys.exit(1)
print(f"{runs} linear-algebra programs exported by jax {jax.__version__} ran on {platform} "
      f"({device.device_kind}) and matched numpy (worst {max(worst.values()):.1f} eps)")
"""

#: make_gpu_client with a GpuAllocatorConfig: BFC at half, then a quarter, of device 0's
#: memory, not preallocated; the device's bytes_limit must follow the fraction, and a program
#: must run on the client.
GPU_CLIENT_PROGRAM = """\
import numpy as np
from pjrt import xla_client

Kind = xla_client.GpuAllocatorConfig.Kind
limits = {}
for fraction in (0.5, 0.25):
    config = xla_client.GpuAllocatorConfig(Kind.BFC, fraction, False, 0)
    client = xla_client.make_gpu_client(platform_name="cuda", allowed_devices={0},
                                        allocator_config=config)
    assert len(client.local_devices()) == 1, client.local_devices()
    device = client.local_devices()[0]
    x = client.buffer_from_pyval(np.arange(6, dtype=np.float32), device)
    program = client.compile_and_load('''
func.func public @main(%x: tensor<6xf32>) -> tensor<6xf32> {
  %y = stablehlo.multiply %x, %x : tensor<6xf32>
  return %y : tensor<6xf32>
}''', [device])
    y, = program.execute([x])
    np.testing.assert_array_equal(np.asarray(y), np.arange(6, dtype=np.float32) ** 2)
    stats = device.memory_stats() or {}
    limits[fraction] = stats.get("bytes_limit")
    print(f"BFC memory_fraction={fraction}: bytes_limit {limits[fraction]} on "
          f"{device.device_kind}")
    client.close()
assert all(limits.values()), limits
ratio = limits[0.25] / limits[0.5]
assert 0.4 < ratio < 0.6, f"a quarter's bytes_limit is {ratio:.2f} of a half's"
print(f"make_gpu_client with GpuAllocatorConfig(BFC): bytes_limit {limits[0.5]} at 0.5, "
      f"{limits[0.25]} at 0.25 (ratio {ratio:.2f}); a program ran on each")
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", required=True, type=pathlib.Path)
    parser.add_argument("--wheels", default=str(ROOT / ".gpu-check"),
                        help="the folder gpu-check-prepare.sh filled")
    parser.add_argument("--site", default="/tmp/pjrt-site",
                        help="where the wheels are installed; '' uses the pjrt importable now")
    parser.add_argument("--platform", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--budget", type=float, default=555,
                        help="seconds for all the steps together")
    args = parser.parse_args(argv)
    started = time.monotonic()
    checker = Checker(args)
    if checker.install():
        checker.vendor()
        checker.info()
        checker.conform()
        checker.readme()
        checker.sharded()
        checker.partitioned_custom_call()
        checker.profile()
        checker.dlpack()
        checker.linalg()
        checker.gpu_client()
        checker.gpu_tests()
        checker.bench()
    else:
        for name in ("vendor-plugin", "pjrt-info", "pjrt-conform", "readme", "sharded",
                     "partitioned-custom-call", "profile", "dlpack-torch", "linalg", "gpu-client",
                     "pytest-gpu"):
            checker.skip(name, "the install failed")
        checker.skip("bench", "the install failed")
    return checker.write(args.report, started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
