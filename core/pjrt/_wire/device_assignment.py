"""``DeviceAssignment``: which device runs each (replica, computation) of a program.

Its wire form is XLA's ``DeviceAssignmentProto`` (``xla/xla_data.proto``), a sub-message of
the build options in [`pjrt.compile_options`][pjrt.compile_options], which is where users import it from. It is
a 2-D array rather than a flat table of fields, so it is written by hand here.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from . import protowire as pw
from .proto_message import INT64_MAX

__all__ = ["DeviceAssignment"]


class _DA:
    """``DeviceAssignmentProto`` (xla/xla_data.proto)."""
    REPLICA_COUNT = 1          # int32
    COMPUTATION_COUNT = 2      # int32
    COMPUTATION_DEVICES = 3    # repeated ComputationDevice
    # ComputationDevice:
    REPLICA_DEVICE_IDS = 1     # repeated int64


class DeviceAssignment:
    """Which device runs each (replica, computation) of a program.

    Mirrors jaxlib's ``xla_client.DeviceAssignment``: an immutable 2-D array of
    device ids shaped ``[replica_count, computation_count]``; with SPMD
    partitioning the computations are the partitions. Build one with
    `create`.
    """

    __slots__ = ("_ids",)

    def __init__(self, *args, **kwargs):
        raise TypeError("use DeviceAssignment.create(array) to build a DeviceAssignment")

    @classmethod
    def create(cls, array: Any) -> "DeviceAssignment":
        """Build an assignment from a 2-D integer array of device ids.

        Args:
            array: array-like of ints shaped ``[replica_count,
                computation_count]``; ``array[r, c]`` is the id of the device
                that runs replica ``r`` of computation ``c``.

        Returns:
            A new `DeviceAssignment` (it keeps its own copy).

        Raises:
            TypeError: the array is not of an integer dtype.
            ValueError: the array is not 2-D, is empty, or holds a negative id.
        """
        arr = np.asarray(array)
        if arr.ndim != 2:
            raise ValueError(
                "DeviceAssignment.create() needs a 2-D array shaped "
                f"[replica_count, computation_count], got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise TypeError(
                f"DeviceAssignment.create() needs integer device ids, got dtype {arr.dtype}"
            )
        if arr.size == 0:
            raise ValueError(
                f"DeviceAssignment.create() needs at least one replica and one "
                f"computation, got shape {arr.shape}"
            )
        if arr.dtype.kind == "u" and arr.max() > INT64_MAX:
            raise ValueError("DeviceAssignment device ids must fit in int64")
        arr = arr.astype(np.int64)
        if (arr < 0).any():
            raise ValueError(f"DeviceAssignment device ids must be >= 0, got {arr.min()}")
        return cls._from_checked(arr)

    @classmethod
    def _from_checked(cls, arr: np.ndarray) -> "DeviceAssignment":
        self = object.__new__(cls)
        arr = np.array(arr, dtype=np.int64, copy=True)
        arr.setflags(write=False)
        self._ids = arr
        return self

    def replica_count(self) -> int:
        """Number of replicas (rows)."""
        return int(self._ids.shape[0])

    def computation_count(self) -> int:
        """Number of computations, i.e. partitions (columns)."""
        return int(self._ids.shape[1])

    @property
    def device_ids(self) -> np.ndarray:
        """A writable copy of the ``[replica_count, computation_count]`` ids."""
        return self._ids.copy()

    def serialize(self) -> bytes:
        """Serialise as ``xla.DeviceAssignmentProto``.

        The proto stores the array column by column: one ``ComputationDevice``
        per computation, each listing the device of every replica.
        """
        out = [
            pw.int_field(_DA.REPLICA_COUNT, self.replica_count()),
            pw.int_field(_DA.COMPUTATION_COUNT, self.computation_count()),
        ]
        for c in range(self.computation_count()):
            column = pw.packed_varint_field(
                _DA.REPLICA_DEVICE_IDS, (int(v) for v in self._ids[:, c])
            )
            # Always emit the ComputationDevice, even if it were empty, so the
            # count of computation_devices matches computation_count.
            out.append(pw.message_field(_DA.COMPUTATION_DEVICES, column))
        return b"".join(out)

    @classmethod
    def from_serialized(cls, data: bytes) -> "DeviceAssignment":
        """Parse an ``xla.DeviceAssignmentProto``.

        Raises:
            ValueError: the message is malformed or its counts disagree with
                its device lists (XLA's ``DeviceAssignment::Deserialize``
                rejects the same messages).
        """
        replica_count = computation_count = 0
        columns: List[List[int]] = []
        for field, wt, value in pw.iter_fields(data):
            if field == _DA.REPLICA_COUNT:
                pw.expect_wire_type(wt, pw.VARINT, "DeviceAssignmentProto.replica_count")
                replica_count = pw.to_int32(value)
            elif field == _DA.COMPUTATION_COUNT:
                pw.expect_wire_type(wt, pw.VARINT,
                                      "DeviceAssignmentProto.computation_count")
                computation_count = pw.to_int32(value)
            elif field == _DA.COMPUTATION_DEVICES:
                pw.expect_wire_type(wt, pw.LEN, "DeviceAssignmentProto.computation_devices")
                ids: List[int] = []
                for f2, wt2, v2 in pw.iter_fields(value):
                    if f2 == _DA.REPLICA_DEVICE_IDS:
                        ids.extend(pw.to_int64(v) for v in pw.read_varints(
                            wt2, v2, "ComputationDevice.replica_device_ids"))
                columns.append(ids)
        if replica_count <= 0 or computation_count <= 0:
            raise ValueError(
                f"DeviceAssignmentProto has replica_count={replica_count}, "
                f"computation_count={computation_count}; both must be > 0"
            )
        if len(columns) != computation_count or any(len(c) != replica_count for c in columns):
            raise ValueError(
                "DeviceAssignmentProto device lists do not match "
                f"replica_count={replica_count} x computation_count={computation_count}"
            )
        return cls.create(np.array(columns, dtype=np.int64).T)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceAssignment):
            return NotImplemented
        return self._ids.shape == other._ids.shape and bool((self._ids == other._ids).all())

    def __hash__(self) -> int:
        return hash((self._ids.shape, self._ids.tobytes()))

    def __repr__(self) -> str:
        # Same layout as jaxlib's repr, for familiarity.
        comps = " ".join(
            f"Computation{c}{{{' '.join(str(int(v)) for v in self._ids[:, c])}}}"
            for c in range(self.computation_count())
        )
        return (
            f"DeviceAssignment{{replica_count={self.replica_count()}, "
            f"computation_count={self.computation_count()}, {comps}}}"
        )
