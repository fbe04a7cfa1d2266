"""How ``mlp.mlir`` was made: a small layer lowered by jax with shardings over a 2x4 mesh.

Needs jax (not a dependency of pjrt); run it to remake the program::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python lower_mlp.py

The program takes ``x[8,16]`` split over both mesh axes and ``w[16,8]`` replicated, and
returns ``tanh(x @ w)`` split by rows over ``x``.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def layer(x, w):
    return jnp.tanh(x @ w)


def main() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    lowered = jax.jit(
        layer,
        in_shardings=(NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P())),
        out_shardings=NamedSharding(mesh, P("x")),
    ).lower(jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.mlir")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"// tanh(x @ w) over a 2x4 mesh, lowered by jax {jax.__version__} "
                f"(examples/programs/lower_mlp.py).\n")
        f.write(lowered.as_text())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
