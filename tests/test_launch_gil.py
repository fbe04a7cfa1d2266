"""A brief launch keeps the GIL (pjrt._native_runtime.CallPlan): threads calling one client
hand the GIL over at their waits, not at every launch; and it lets the GIL go for good once a
program may call into Python, where keeping it could deadlock.

Each case runs in a fresh interpreter: whether a launch keeps the GIL is a property of the
process (a Python custom-call handler registered by another test turns it off for good)."""
from __future__ import annotations

from conftest import run_python

PRELUDE = """
import sys, threading, time
import numpy as np
import pjrt, pjrt_cpu
from pjrt._capi import native_runtime

pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
client = pjrt.make_c_api_client("cpu", {"cpu_device_count": 2})
devices = client.local_devices()[:2]
TANH = '''
module @tanh_matmul {
  func.func public @main(%x: tensor<8x8xf32>, %y: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0]
        : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.tanh %0 : tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}'''
host = np.random.default_rng(0).standard_normal((8, 8), np.float32)
expected = np.tanh(host @ host)
"""


def test_brief_launches_keep_the_gil_and_threads_get_right_results():
    """Four threads on two devices, with and without reads: every result is right, and the
    launches after the first few kept the GIL (none can call into Python here)."""
    run_python(PRELUDE + """
assert native_runtime.launches_keep_gil()
executables = [client.compile_and_load(TANH, [d]) for d in devices]
arguments = [[client.buffer_from_pyval(host, d)] * 2 for d in devices]
failures = []

def work(i):
    try:
        exe, args = executables[i % 2], arguments[i % 2]
        for n in range(400):
            out = exe.execute(args)[0]
            if n % 2:
                np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    except BaseException as error:
        failures.append(error)

threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failures, failures
kept = [exe._launcher.plan.kept_gil for exe in executables]
# 800 launches each; under a heavy load some take longer than a brief launch and let it go.
assert all(k > 400 for k in kept), kept
""")


def test_a_python_handler_turns_it_off_and_a_launch_past_the_in_flight_limit_completes():
    """A program whose Python handler runs on the plugin's threads, launched 40 times in a row
    with a plain program between (the CPU plugin blocks a launch while 32 computations are in
    flight on its device): each blocked launch must let the GIL go, or the handlers it waits
    for never run. Before the handler is registered, the plain program's launches keep it."""
    result = run_python(PRELUDE + """
plain = client.compile_and_load(TANH, [devices[0]])
x = client.buffer_from_pyval(host, devices[0])
for _ in range(50):
    plain.execute([x, x])
kept_before = plain._launcher.plan.kept_gil
assert kept_before > 0, kept_before
ran = []

def slow_add_one(operands, results, attributes):
    time.sleep(0.01)
    ran.append(1)
    results[0][...] = operands[0] + 1

pjrt.register_custom_call_target("launch_gil_slow_add_one", slow_add_one, platform="cpu")
assert not native_runtime.launches_keep_gil()
HANDLER = '''
module @handler {
  func.func public @main(%x: tensor<8x8xf32>, %y: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0]
        : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.custom_call @launch_gil_slow_add_one(%0) {has_side_effect = true,
        api_version = 4 : i32, backend_config = {}} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}'''
handler = client.compile_and_load(HANDLER, [devices[0]])
np.asarray(handler.execute([x, x])[0])
outputs = []
for _ in range(40):
    outputs.append(handler.execute([x, x])[0])
    plain.execute([x, x])
for out in outputs:
    np.testing.assert_allclose(np.asarray(out), host @ host + 1, rtol=1e-5, atol=1e-4)
assert len(ran) == 41, len(ran)
assert handler._launcher.plan.kept_gil == 0
assert plain._launcher.plan.kept_gil == kept_before
print("ok")
""", timeout=60)
    assert result.stdout.strip() == "ok"


def test_transfer_managers_and_dlpack_views_turn_it_off():
    """Each thing that lets a program in flight wait on Python turns the kept GIL off, in a
    process of its own: a host-to-device transfer manager (Python fills its buffers), a DLPack
    view of foreign memory (the producer's deleter takes the GIL), a handler given as a ctypes
    function pointer (which may be a trampoline into Python, as this one is), and such a
    trampoline's address given as an int (it is in libffi's anonymous memory, not in a
    library's code)."""
    cases = {
        "transfer manager": """
memory = devices[0].default_memory()
manager = client.create_buffers_for_async_host_to_device([((8, 8), np.float32)], memory)
""",
        "dlpack view": """
raw = np.zeros(256 + 64, np.uint8)
start = -raw.ctypes.data % 64  # the plugin views only memory aligned to 64 bytes
foreign = raw[start:start + 256].view(np.float32).reshape(8, 8)
foreign[...] = np.arange(64, dtype=np.float32).reshape(8, 8)
view = pjrt.dlpack.from_dlpack(foreign, device=devices[0], copy=False)
np.testing.assert_array_equal(np.asarray(view), foreign)
""",
        "ctypes handler": """
import ctypes
handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda frame: None)
pjrt.register_custom_call_target("launch_gil_ctypes", handler, platform="cpu")
""",
        "ctypes handler by address": """
import ctypes
handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda frame: None)
address = ctypes.cast(handler, ctypes.c_void_p).value
pjrt.register_custom_call_target("launch_gil_ctypes_int", address, platform="cpu")
""",
        "cffi callback by address": """
import cffi
ffi = cffi.FFI()
handler = ffi.callback("void *(void *)", lambda frame: ffi.NULL)
address = int(ffi.cast("uintptr_t", handler))
pjrt.register_custom_call_target("launch_gil_cffi_int", address, platform="cpu")
""",
    }
    for name, source in cases.items():
        result = run_python(PRELUDE + f"""
assert native_runtime.launches_keep_gil()
{source}
print(native_runtime.launches_keep_gil())
""", check=False)
        assert result.returncode == 0, (name, result.stderr[-3000:])
        assert result.stdout.strip() == "False", (name, result.stdout)


def test_the_plugins_own_c_kernels_leave_it_on():
    """The CPU plugin package's LAPACK kernels, registered by address when its backend comes
    up, are taken to be C: launches go on keeping the GIL."""
    result = run_python(PRELUDE + """
a = np.array([[4.0, 1.0], [1.0, 3.0]], np.float32)
x = pjrt.device_put(a)
kernels = [t for t in pjrt.custom_call_targets("cpu") if "lapack" in t]
assert kernels, "no LAPACK kernel registered"
print(native_runtime.launches_keep_gil())
""")
    assert result.stdout.strip() == "True", result.stdout
