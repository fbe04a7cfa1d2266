"""The model corpus: programs lowered from flax, equinox, optax, diffrax, jax.scipy and torch
(through torchax), with their inputs and the outputs jax computed for them.

Reads tests/fixtures/models/ (written by tests/models/generate.py) with numpy and ml_dtypes
only, so tests and benchmarks can use it without jax::

    from models import corpus
    for fixture in corpus.fixtures():
        program = fixture.program()          # StableHLO text, or an Exported blob
        inputs, expected = fixture.inputs(), fixture.expected()
        ...
        fixture.check(outputs)               # assert they match jax's within tolerance

For an ``exported`` fixture, ``inputs()`` are the export's flattened inputs: rebuild the
call's arguments with ``pjrt.deserialize_exported(blob).in_tree.unflatten(inputs)``.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import ml_dtypes
import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def _restore(stored: np.ndarray, info: dict) -> np.ndarray:
    """An array as generate.py stored it (bits for dtypes npz cannot hold) -> its dtype."""
    dtype = info["dtype"]
    if stored.dtype.name != dtype:
        stored = stored.view(np.dtype(getattr(ml_dtypes, dtype)))
    assert list(stored.shape) == info["shape"], (stored.shape, info)
    return stored


class Fixture:
    """One model of the corpus: its program, inputs, expected outputs and metadata."""

    def __init__(self, name: str):
        self.name = name
        self.folder = FIXTURES / name
        self.meta = json.loads((self.folder / "meta.json").read_text())

    def __repr__(self) -> str:
        return f"Fixture({self.name!r}: {self.family}, {self.library}, {self.format})"

    family = property(lambda self: self.meta["family"])
    library = property(lambda self: self.meta["library"])
    #: "mlir" (StableHLO text) or "exported" (a jax.export serialization)
    format = property(lambda self: self.meta["format"])
    #: 1, or 8 for an SPMD program over :attr:`mesh`
    devices = property(lambda self: self.meta["devices"])
    slow = property(lambda self: self.meta["slow"])
    custom_calls = property(lambda self: self.meta["custom_calls"])

    @property
    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """(shape, axis names) of the device mesh, devices 0..n-1 in order; None for one
        device."""
        mesh = self.meta["mesh"]
        return None if mesh is None else (tuple(mesh["shape"]), tuple(mesh["axis_names"]))

    def input_specs(self) -> list:
        """Per flattened input, its partition spec (a list of axis names / lists / None), or
        None for a single-device fixture."""
        return [i["spec"] for i in self.meta["inputs"]]

    def output_specs(self) -> list:
        return [o["spec"] for o in self.meta["outputs"]]

    def program(self) -> str | bytes:
        """The StableHLO text (format "mlir") or the serialized export (format "exported")."""
        path = self.folder / self.meta["program"]
        return path.read_text() if self.format == "mlir" else path.read_bytes()

    @functools.cache
    def _arrays(self, which: str) -> tuple:
        infos = self.meta["inputs" if which == "inputs" else "outputs"]
        prefix = "in" if which == "inputs" else "out"
        with np.load(self.folder / f"{which}.npz") as stored:
            return tuple(_restore(stored[f"{prefix}{i:03d}"], info)
                         for i, info in enumerate(infos))

    def inputs(self) -> list[np.ndarray]:
        """The flattened inputs (fresh list; the arrays are shared, do not write to them)."""
        return list(self._arrays("inputs"))

    def expected(self) -> list[np.ndarray]:
        """What jax computed, one array per flattened output."""
        return list(self._arrays("expected"))

    def tolerance(self, index: int) -> tuple[float, float]:
        """(rtol, atol) for output ``index``."""
        info = self.meta["outputs"][index]
        return info.get("rtol", self.meta["rtol"]), info.get("atol", self.meta["atol"])

    def check(self, outputs) -> None:
        """Assert that ``outputs`` (anything np.asarray takes, one per flattened output) match
        the expected ones: integers and booleans exactly, floats within :meth:`tolerance`."""
        outputs = list(outputs)
        expected = self.expected()
        assert len(outputs) == len(expected), \
            f"{self.name}: {len(outputs)} outputs, expected {len(expected)}"
        for index, (got, want) in enumerate(zip(outputs, expected)):
            got = np.asarray(got)
            where = f"{self.name} output {index}"
            assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
            assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, expected {want.dtype}"
            if want.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want, err_msg=where)
            else:
                rtol, atol = self.tolerance(index)
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                           rtol=rtol, atol=atol, err_msg=where)


def names() -> list[str]:
    """The fixtures' names, sorted."""
    return sorted(p.parent.name for p in FIXTURES.glob("*/meta.json"))


@functools.cache
def load(name: str) -> Fixture:
    """The fixture called ``name``."""
    if not (FIXTURES / name / "meta.json").is_file():
        raise KeyError(f"no model fixture {name!r}; there are {names()}")
    return Fixture(name)


def fixtures() -> list[Fixture]:
    """Every fixture, by name."""
    return [load(name) for name in names()]
