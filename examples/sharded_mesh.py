"""Run an SPMD program, lowered by jax with shardings, over a 2x4 mesh of CPU devices.

The CPU plugin makes 4 devices unless told otherwise; this example asks for 8 with
PJRT_CPU_DEVICE_COUNT (set before the backend comes up), so run it as it is::

    python examples/sharded_mesh.py

The program is ``programs/mlp.mlir`` (``tanh(x @ w)``, made by ``programs/lower_mlp.py``).
"""
import os

os.environ.setdefault("PJRT_CPU_DEVICE_COUNT", "8")

import numpy as np  # noqa: E402

import pjrt  # noqa: E402

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "mlp.mlir")


def main() -> None:
    devices = pjrt.devices()
    if len(devices) < 8:
        raise SystemExit(f"this example needs 8 devices; the default backend has {len(devices)}"
                         f" (set PJRT_CPU_DEVICE_COUNT=8)")
    mesh = pjrt.Mesh(np.array(devices[:8]).reshape(2, 4), ("x", "y"))
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)

    x = pjrt.device_put(x_host, pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    with open(PROGRAM, encoding="utf-8") as f:
        layer = pjrt.compile(f.read(), mesh)
    y = layer(x, w)                              # w, a host array, is placed as needed

    print("mesh:", dict(mesh.shape))
    print("x sharding:", x.sharding)
    print("y sharding:", y.sharding)
    for shard in y.addressable_shards[:2]:
        print(f"  {shard.device} holds y{shard.index}")
    error = np.abs(np.asarray(y) - np.tanh(x_host.astype(np.float64) @ w)).max()
    print(f"max |pjrt - numpy| = {error:.1e}")
    print("matches numpy:", bool(error < 1e-5))


if __name__ == "__main__":
    main()
