"""A tour of pjrt on the CPU plugin: ``pjrt demo`` (or ``python -m pjrt demo``).

Makes a client of XLA's CPU plugin (from whichever plugin package is registered for ``cpu``,
normally ``pjrt-cpu``) with 8 devices, lists them, runs a
bundled StableHLO program on one device and an SPMD program sharded over all eight, checks
both against numpy and prints timings.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from .._capi.api import HEADER_VERSION
from ..program import compile as compile_program
from ..registry import default_registry
from ..sharding import Mesh, NamedSharding, P
from ..transfers import device_put

PROGRAMS = os.path.join(os.path.dirname(__file__), "demo_programs")
DEVICE_COUNT = 8


def _read(name: str) -> str:
    with open(os.path.join(PROGRAMS, name), encoding="utf-8") as f:
        return f.read()


def _median_microseconds(call, repeats: int = 7, loops: int = 200) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            call()
        samples.append((time.perf_counter() - start) / loops * 1e6)
    return sorted(samples)[len(samples) // 2]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class DemoUnavailable(RuntimeError):
    """The demo cannot run here (no CPU plugin); the message says what to install."""


def main(registry=None) -> None:
    """Run the tour, printing as it goes.

    Args:
      registry: the [`BackendRegistry`][pjrt.registry.BackendRegistry] whose ``cpu`` plugin package
        makes the client (the default registry when None).

    Raises:
      DemoUnavailable: no CPU plugin package is installed, or its plugin cannot be loaded.
    """
    started = time.perf_counter()
    registry = registry if registry is not None else default_registry
    try:
        client = registry.new_client("cpu", num_devices=DEVICE_COUNT)
    except (RuntimeError, FileNotFoundError) as error:
        raise DemoUnavailable(f"the demo runs on XLA's CPU plugin, which is not available: "
                              f"{error}") from error
    plugin = client.plugin
    major, minor = plugin.api_version
    print(f"plugin      {plugin.library_path}")
    print(f"PJRT API    {major}.{minor} (plugin), {HEADER_VERSION[0]}."
          f"{HEADER_VERSION[1]} (our header)")
    attributes = plugin.attributes()
    print("StableHLO   {}..{}".format(".".join(map(str, attributes["stablehlo_minimum_version"])),
                                      ".".join(map(str, attributes["stablehlo_current_version"]))))
    print(f"client      {client.platform} {client.platform_version}, ready in "
          f"{(time.perf_counter() - started) * 1e3:.0f} ms")
    device = client.local_devices()[0]
    print(f"devices     {', '.join(map(str, client.devices()))}")
    print(f"memories    {', '.join(m.kind for m in device.addressable_memories())} "
          f"(default: {device.default_memory().kind})")

    # One device: softmax(x @ w + b).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    start = time.perf_counter()
    softmax_layer = compile_program(_read("matmul_softmax.mlir"), device)
    compile_ms = (time.perf_counter() - start) * 1e3
    result = np.asarray(softmax_layer(x, w, b))
    expected = _softmax(x.astype(np.float64) @ w + b)
    error = np.abs(result - expected).max()
    args = [client.buffer_from_pyval(v, device) for v in (x, w, b)]
    per_call = _median_microseconds(lambda: softmax_layer.executable.execute(args))
    with_read = _median_microseconds(lambda: np.asarray(softmax_layer.executable.execute(args)[0]))
    print("\none device: softmax(x[4,8] @ w[8,5] + b)")
    print(f"  compiled in {compile_ms:.1f} ms; max |pjrt - numpy| = {error:.2e}")
    print(f"  execute {per_call:.1f} us per call, {with_read:.1f} us with the result read back")
    print("  row sums:", np.round(result.sum(axis=1), 6))

    # Eight devices: x[8,16] split by rows, w[16,4] replicated, an SPMD program (Shardy).
    mesh = Mesh(np.array(client.local_devices()), ("x",))
    xs = rng.standard_normal((8, 16)).astype(np.float32)
    ws = rng.standard_normal((16, 4)).astype(np.float32)
    start = time.perf_counter()
    matmul = compile_program(_read("spmd_matmul.shardy.mlir"), mesh)
    compile_ms = (time.perf_counter() - start) * 1e3
    x_global = device_put(xs, NamedSharding(mesh, P("x")))
    w_global = device_put(ws, NamedSharding(mesh, P()))
    product = matmul(x_global, w_global)
    error = np.abs(np.asarray(product) - xs.astype(np.float64) @ ws).max()
    per_call = _median_microseconds(lambda: matmul(x_global, w_global), loops=50)
    shards = product.addressable_shards
    print(f"\n{DEVICE_COUNT} devices: x[8,16] @ w[16,4], rows of x split over the devices")
    print(f"  compiled in {compile_ms:.1f} ms with {matmul.executable.num_partitions()} "
          f"partitions; max |pjrt - numpy| = {error:.2e}")
    print(f"  result {product.shape}, laid out as "
          f"{matmul.output_shardings[0].to_hlo_sharding(2)}: shards of {shards[0].data.shape} on "
          f"{', '.join(str(s.device) for s in shards[:2])}, ...")
    print(f"  execute over {DEVICE_COUNT} devices: {per_call:.1f} us per call")
    client.close()


if __name__ == "__main__":
    try:
        main()
    except DemoUnavailable as error:
        sys.exit(f"pjrt demo: {error}")
