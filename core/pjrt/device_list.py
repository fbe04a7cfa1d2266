"""``DeviceList``: an immutable, hashable sequence of devices of one client.

It is what shardings and executables use to name the devices they run on; the properties
summarise the devices (are they all addressable, which memory kinds do they share).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .device import Device


class DeviceList:
    """An ordered, immutable tuple of distinct devices of one client (or compile-only devices
    of one topology, none of them addressable).

    Raises:
      ValueError (on construction): the list is empty, has a device twice, or mixes clients.
      TypeError: an element is not a Device.
    """

    __slots__ = ("_devices", "_hash")

    def __init__(self, device_assignment: Iterable[Device]):
        devices = tuple(device_assignment)
        if not devices:
            raise ValueError("a DeviceList needs at least one device")
        for device in devices:
            # A topology's compile-only devices too, as jaxlib's ahead-of-time path lists them.
            if not isinstance(device, Device) and not getattr(device, "is_compile_only", False):
                raise TypeError(f"a DeviceList holds Devices, not {type(device).__name__}")
        if len(set(devices)) != len(devices):
            repeated = sorted({str(d) for d in devices if devices.count(d) > 1})
            raise ValueError(f"a DeviceList cannot hold a device twice: {', '.join(repeated)}")
        clients = {id(d.client) for d in devices}
        if len(clients) != 1:
            raise ValueError("a DeviceList cannot mix devices of different clients")
        self._devices = devices
        self._hash = hash(devices)

    def __len__(self) -> int:
        return len(self._devices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return DeviceList(self._devices[index])
        return self._devices[index]

    def __iter__(self) -> Iterator[Device]:
        return iter(self._devices)

    def __eq__(self, other) -> bool:
        if isinstance(other, DeviceList):
            return self._devices == other._devices
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"DeviceList({', '.join(map(str, self._devices))})"

    @property
    def is_fully_addressable(self) -> bool:
        """Whether this process can address every device."""
        return all(d.is_addressable for d in self._devices)

    @property
    def addressable_device_list(self) -> "DeviceList":
        """The devices this process can address (ValueError if none)."""
        return DeviceList(d for d in self._devices if d.is_addressable)

    @property
    def process_indices(self) -> set[int]:
        return {d.process_index for d in self._devices}

    @property
    def default_memory_kind(self) -> str | None:
        """The kind of the first addressable device's default memory (None if none)."""
        for device in self._devices:
            if device.is_addressable:
                return device.default_memory().kind
        return None

    @property
    def memory_kinds(self) -> tuple[str, ...]:
        """Memory kinds addressable by the first addressable device, default first."""
        for device in self._devices:
            if device.is_addressable:
                default = device.default_memory().kind
                others = [m.kind for m in device.addressable_memories() if m.kind != default]
                return (default, *others)
        return ()

    @property
    def device_kind(self) -> str:
        """The devices' kind (ValueError if they differ)."""
        kinds = {d.device_kind for d in self._devices}
        if len(kinds) != 1:
            raise ValueError(f"the devices are of several kinds: {sorted(kinds)}")
        return kinds.pop()
