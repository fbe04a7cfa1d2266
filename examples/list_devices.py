"""List the backends that came up, why the others did not, and the default backend's devices.

    python examples/list_devices.py
"""
import pjrt


def main() -> None:
    for name, client in pjrt.backends().items():
        print(f"backend {name}: {client.platform} {client.platform_version}, "
              f"PJRT API {'.'.join(map(str, client.plugin.api_version))}, "
              f"{client.device_count()} devices")
    for name, reason in pjrt.backend_errors().items():
        print(f"backend {name} did not come up: {reason}")
    print(f"default backend: {pjrt.default_backend()}")
    for device in pjrt.devices():
        memories = ", ".join(m.kind for m in device.addressable_memories())
        print(f"  {device} kind={device.device_kind} memories=[{memories}]")


if __name__ == "__main__":
    main()
