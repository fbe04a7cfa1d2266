"""Move numpy arrays to a device, between devices, and back to the host.

    python examples/move_arrays.py
"""
import numpy as np

import pjrt


def main() -> None:
    first, *others = pjrt.devices()
    host = np.arange(12, dtype=np.float32).reshape(3, 4)

    on_device = pjrt.device_put(host, first)          # host -> device
    print(f"on {on_device.device}: shape={on_device.shape} dtype={on_device.dtype}")

    target = others[0] if others else first
    moved = pjrt.device_put(on_device, target)        # device -> device
    print(f"copied to {moved.device}")

    back = np.asarray(moved)                           # device -> host (waits for the copy)
    print("round trip equal:", bool(np.array_equal(back, host)))
    print("sum:", float(back.sum()))


if __name__ == "__main__":
    main()
