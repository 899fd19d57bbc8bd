"""Fresh inputs: values no kernel has seen, drawn at gate time and checked against the reference.

Signed cases are fixed, so a kernel can be fitted to them: right on their values and shapes, wrong
elsewhere, or right only because it returns a result it cached (by input pointer, or by call
count) from an earlier launch. For every case the gate therefore draws ``checks.fresh_inputs``
input sets (default 2), computes their expected outputs with the suite's trusted reference, and
has the worker upload each into the *same* buffers the signed inputs used and launch once more:

- ``resampled``: new values like the signed ones. An input with a distribution under ``inputs:``
  is drawn from it with a new seed; one without is the signed case's own values shuffled (floats:
  the value domain is kept) or kept as they are (integers: they may be indices or sizes).
- ``adversarial`` (every second set): the resampled values with magnitudes spread over
  2^-R..2^R (R per dtype), about 2 % of the elements set to +0.0 or -0.0 (where the input has
  both signs), then scaled by the largest power of two for which the reference's own output stays
  finite, with headroom below the output dtype's overflow limit. Integer inputs are not changed.

The absolute tolerance follows the output's scale: ``atol`` is multiplied by the RMS of the fresh
expected output over the RMS of the signed one (``rtol`` unchanged). The seed changes every gate
run (``CUDAGATE_FRESH_SEED`` fixes it) and is printed with any failure, so a failure replays.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, numpy_dtype

from pytest_cudagate.defences.reference import ReferenceRunner
from pytest_cudagate.suite.cases import draw, write_case
from pytest_cudagate.suite.model import Case, Suite

SPREAD_BITS = {"float16": 4, "float32": 16, "float64": 40}  # magnitudes spread over 2^-R..2^R
HEADROOM_BITS = {"float16": 2, "float32": 8, "float64": 16}  # |expected| stays below max * 2^-H
ZERO_FRACTION = 0.02
SCALE_STEPS = 4  # candidate global scales: 2^(E*j/4), j = 4..0, E the largest the inputs allow


@dataclass
class FreshSet:
    label: str
    root: Path  # a data folder: root/<case>/<input>.npy and root/<case>/expected/<output>.npy
    atol_scale: dict[str, float] = field(default_factory=dict)
    description: str = ""

    def spec(self, suite: Suite, case: Case) -> dict:
        """The ``fresh`` entry of a harness request's case."""
        folder = self.root / case.name
        return {"label": self.label, "description": self.description, "atol_scale": dict(self.atol_scale),
                "inputs": {p.name: str(folder / f"{p.name}.npy") for p in suite.buffers if p.is_input},
                "expected": {p.name: str(folder / "expected" / f"{p.name}.npy") for p in suite.outputs}}


def labels(count: int, adversarial: bool) -> list[str]:
    """``resampled``, ``adversarial``, ``resampled-2``, ... (all resampled without adversarial sets)."""
    names = []
    for i in range(count):
        kind = "adversarial" if adversarial and i % 2 == 1 else "resampled"
        n = sum(1 for name in names if name.split("-")[0] == kind) + 1
        names.append(kind if n == 1 else f"{kind}-{n}")
    return names


def _rng(seed: int, suite: Suite, case: Case, index: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(f"{suite.name}/{case.name}".encode()), index])


def signed_inputs(suite: Suite, case: Case) -> dict[str, np.ndarray]:
    """The case's signed input arrays in their signature shapes (read once for all its fresh sets)."""
    shapes = suite.resolved(case).shapes
    return {p.name: np.load(suite.resolved(case).inputs[p.name], allow_pickle=False).reshape(shapes[p.name])
            for p in suite.buffers if p.is_input}


def resampled_inputs(suite: Suite, case: Case, rng: np.random.Generator,
                     signed_arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
    """New input values like the signed ones; and whether any value actually changed."""
    inputs, changed = {}, False
    for param in suite.buffers:
        if not param.is_input:
            continue
        shape = suite.resolved(case).shapes[param.name]
        signed = signed_arrays[param.name]
        if param.name in suite.inputs:
            values = draw(param, shape, suite.inputs[param.name], rng)
        elif param.dtype in FLOAT_DTYPES:
            values = rng.permutation(signed.reshape(-1)).reshape(shape)
        else:
            values = signed.copy()
        changed |= not np.array_equal(values, signed)
        inputs[param.name] = values.astype(numpy_dtype(param.dtype), copy=False)
    return inputs, changed


def spread(suite: Suite, inputs: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int]:
    """Float inputs with magnitudes spread widely and signed zeros, as float64 (not yet cast); zeros placed."""
    out, zeros = {}, 0
    for param in suite.buffers:
        if not param.is_input:
            continue
        x = inputs[param.name]
        if param.dtype not in FLOAT_DTYPES:
            out[param.name] = x
            continue
        bits = SPREAD_BITS[param.dtype]
        factors = rng.uniform(-bits, bits, size=x.shape)
        values = np.exp2(factors, out=factors)  # in place: these arrays are as large as the case
        values *= x
        if values.size >= 4 and (values < 0).any() and (values > 0).any():
            where = rng.random(x.shape) < ZERO_FRACTION
            negative = rng.random(x.shape) < 0.5
            np.copyto(values, 0.0, where=where & ~negative)  # no third array as large as the case
            np.copyto(values, -0.0, where=where & negative)
            zeros += int(np.count_nonzero(where))
        out[param.name] = values
    return out, zeros


def scale_exponents(suite: Suite, spread_inputs: dict[str, np.ndarray]) -> list[int]:
    """Candidate powers of two for the float inputs, largest first, ending at 0."""
    most = None
    for param in suite.buffers:
        if param.is_input and param.dtype in FLOAT_DTYPES:
            biggest = float(np.max(np.abs(spread_inputs[param.name]), initial=0.0))
            if biggest > 0:
                room = int(np.floor(np.log2(float(np.finfo(numpy_dtype(param.dtype)).max) / biggest))) - 2
                most = room if most is None else min(most, room)
    if not most or most <= 0:
        return [0]
    return list(dict.fromkeys(int(round(most * j / SCALE_STEPS)) for j in range(SCALE_STEPS, -1, -1)))


class Scaled(Sequence):
    """The adversarial candidates, one per exponent, each built when first read: a Python reference
    stops at the first usable one, so the rest (each as large as the case) are never built."""

    def __init__(self, suite: Suite, spread_inputs: dict[str, np.ndarray], exponents: list[int]):
        self.suite, self.spread_inputs, self.exponents = suite, spread_inputs, exponents
        self._built: dict[int, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.exponents)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index not in self._built:
            self._built[index] = scaled(self.suite, self.spread_inputs, self.exponents[index])
        return self._built[index]


def scaled(suite: Suite, spread_inputs: dict[str, np.ndarray], exponent: int) -> dict[str, np.ndarray]:
    out = {}
    for param in suite.buffers:
        if not param.is_input:
            continue
        values = spread_inputs[param.name]
        if param.dtype in FLOAT_DTYPES:
            with np.errstate(over="ignore"):  # rounded to the input's dtype as it is computed: no float64 copy
                values = np.ldexp(values, exponent, out=np.empty(values.shape, numpy_dtype(param.dtype)),
                                  casting="same_kind")
        out[param.name] = values
    return out


def usable(suite: Suite, outputs: dict | None) -> bool:
    """The reference's output is finite and below the output dtype's overflow limit by the headroom."""
    if outputs is None:
        return False
    for param in suite.outputs:
        value = outputs.get(param.name)
        if value is None:
            return False
        if param.dtype in FLOAT_DTYPES:
            v = np.asarray(value)  # finiteness and the largest magnitude are exact in the output's own dtype
            if not np.all(np.isfinite(v)):
                return False
            limit = float(np.finfo(numpy_dtype(param.dtype)).max) * 2.0 ** -HEADROOM_BITS[param.dtype]
            if float(np.max(np.abs(v), initial=0)) > limit:
                return False
    return True


def _rms(values) -> float:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size and not (np.isfinite(v.min()) and np.isfinite(v.max())):  # min and max see any NaN or infinity
        v = v[np.isfinite(v)]
    return float(np.sqrt(np.mean(v * v))) if v.size else 0.0


def make_sets(suite: Suite, case: Case, *, count: int, adversarial: bool, seed: int, root: Path,
              client=None) -> tuple[list[FreshSet], list[str]]:
    """The fresh input sets of one case, written under ``root``; and notes on what was skipped."""
    sets: list[FreshSet] = []
    notes: list[str] = []
    if count <= 0:
        return sets, notes
    root.mkdir(parents=True, exist_ok=True)
    runner = ReferenceRunner(suite, client, root)
    signed_rms = {name: _rms(values) for name, values in suite.resolved(case).expected_outputs().items()}
    signed_arrays = signed_inputs(suite, case)
    for index, label in enumerate(labels(count, adversarial)):
        rng = _rng(seed, suite, case, index)
        inputs, changed = resampled_inputs(suite, case, rng, signed_arrays)
        if not changed:
            notes.append(f"fresh inputs on case {case.name}: every input is integer data without a distribution "
                         "under `inputs:`, so fresh sets repeat the signed values")
        if label.startswith("adversarial"):
            wide, zeros = spread(suite, inputs, rng)
            exponents = scale_exponents(suite, wide)
            candidates = Scaled(suite, wide, exponents)
            outputs = runner.outputs(case, candidates, first_usable=True, usable=usable)
            chosen = next((i for i, out in enumerate(outputs) if usable(suite, out)), None)
            if chosen is None:
                notes.append(f"adversarial fresh inputs skipped on case {case.name}: the reference's own output is not "
                             "finite on them at any scale tried (or it refused them)")
                continue
            inputs, expected = candidates[chosen], outputs[chosen]
            bits = sorted({SPREAD_BITS[p.dtype] for p in suite.buffers if p.is_input and p.dtype in FLOAT_DTYPES})
            description = (f"{label}: magnitudes spread over 2^±{'/'.join(map(str, bits)) or 0}, {zeros} signed zeros, "
                           f"scaled by 2^{exponents[chosen]}; CUDAGATE_FRESH_SEED={seed} draws them again")
        else:
            (expected,) = runner.outputs(case, [inputs])
            if expected is None:
                notes.append(f"fresh inputs ({label}) skipped on case {case.name}: the reference failed on them")
                continue
            description = f"{label}: new values like the signed ones; CUDAGATE_FRESH_SEED={seed} draws them again"
        folder = root / label
        write_case(suite, case, inputs, expected, folder)
        scale = {}
        for name, values in expected.items():
            base, now = signed_rms.get(name, 0.0), _rms(values)
            scale[name] = now / base if base > 0 and now > 0 else 1.0
        sets.append(FreshSet(label, folder, scale, description))
    return sets, notes
