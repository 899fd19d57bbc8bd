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
  both signs), then scaled by the largest power of two that keeps every input within its bound
  (``adversarial_max`` where the suite signs one, else 2^B times the input's scale, B per dtype:
  :func:`input_bound`) and the reference's own output finite, with headroom below the output
  dtype's overflow limit. Integer inputs are not changed.

The absolute tolerance follows the output's scale: ``atol`` is multiplied by the RMS of the fresh
expected output over the RMS of the signed one (``rtol`` unchanged). The seed changes every gate
run (``CUDAGATE_FRESH_SEED`` fixes it) and is printed with any failure, so a failure replays.

:func:`prepare` draws the sets and needs no worker, so the gate runs it ahead, while the worker runs
the case before (defences/fresh_ahead.py); for a CUDA reference it writes every candidate where the
worker reads it, and :meth:`Prepared.finish` runs them all in one request, in the case's own turn.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, LOW_PRECISION, encode, finfo, numpy_dtype
from cudagate_harness.protocol import values as float_values

from pytest_cudagate.host import trash
from pytest_cudagate.defences.reference import ReferenceRunner
from pytest_cudagate.suite.cases import write_case
from pytest_cudagate.suite.draw import draw_fresh
from pytest_cudagate.suite.model import Case, Suite

# The per-type bits below are keyed by a float type's exponent width (its finfo's nexp), which fixes
# the binades it spans, so a type of DTYPES needs no entry of its own (bfloat16 is float32's 8 bits,
# float8_e5m2 float16's 5; :func:`type_bits` works out a width not listed).
# Magnitudes spread over 2^-R..2^R, and |expected| kept below max * 2^-H. float8_e4m3fn's normal
# numbers (4 bits) span only 2^-6..448 and float8_e5m2's (5 bits) 2^-14..57344, so their spread
# stays within a few binades of values of order one, representable, not subnormal.
SPREAD_BITS = {4: 2, 5: 4, 8: 16, 11: 40}
HEADROOM_BITS = {4: 1, 5: 2, 8: 8, 11: 16}
# An adversarial input's largest |value| is at most 2^B times its scale (:func:`input_scale`): wide
# enough that a float32 exp overflows (past 88) and a float16 intermediate overflows (past 65504) on
# inputs of scale 1, and well past the outliers a model's activations hold (10^3..10^4 times their
# typical size), yet far below where a correct one-pass sum of squares in float32 overflows (about
# 2^64 / sqrt(n) for n elements), which the reference's headroom alone let the values reach.
BOUND_BITS = {4: 4, 5: 8, 8: 24, 11: 128}
NORMAL_REACH = 3  # a normal distribution's scale: |mean| + 3 std
FLOATING = FLOAT_DTYPES | frozenset(LOW_PRECISION)
ZERO_FRACTION = 0.02
SCALE_STEPS = 4  # candidate global scales: 2^(E*j/4), j = 4..0, E the largest the inputs allow


def type_bits(table: dict[int, int], dtype: str) -> int:
    """``table``'s bits for the float type ``dtype``, by its exponent width: a width between two listed
    takes the narrower one's, and one narrower than all (FP6, FP4: 2 or 3 bits) the narrowest's scaled
    down to its width, at least 1, so its values stay within the few binades it has."""
    width = finfo(dtype).nexp
    listed = [w for w in table if w <= width]
    if listed:
        return table[max(listed)]
    narrowest = min(table)
    return max(1, table[narrowest] * width // narrowest)


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


def signed_inputs(suite: Suite, case: Case) -> Callable[[str], np.ndarray]:
    """The case's signed input arrays by name in their signature shapes, each read when first asked
    for (inputs with a distribution never are) and once for all the case's fresh sets."""
    loaded: dict[str, np.ndarray] = {}

    def signed(name: str) -> np.ndarray:
        if name not in loaded:
            resolved = suite.resolved(case)
            loaded[name] = np.load(resolved.inputs[name], allow_pickle=False).reshape(resolved.shapes[name])
        return loaded[name]
    return signed


def arrays_in_place(suite: Suite, case: Case) -> bool:
    """Whether the case's signed arrays can be read now: a generated case's once it is materialised."""
    return not case.generated or suite.arrays_dir(case) != suite.case_dir(case)


def reads_signed_inputs(suite: Suite) -> bool:
    """Whether fresh sets are drawn from signed values: an input without a distribution is."""
    return any(p.is_input and p.name not in suite.inputs for p in suite.buffers)


def kept_inputs(suite: Suite) -> list[str]:
    """The inputs a fresh set keeps as signed: integer data without a distribution (indices, say)."""
    return [p.name for p in suite.buffers if p.is_input and p.name not in suite.inputs and p.dtype not in FLOATING]


def changes_inputs(suite: Suite) -> bool:
    """Whether fresh sets hold new values: not where every input is integer data without a distribution."""
    return any(p.name in suite.inputs or p.dtype in FLOATING for p in suite.buffers if p.is_input)


def resampled_inputs(suite: Suite, case: Case, rng: np.random.Generator,
                     signed: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """New input values like the signed ones."""
    inputs = {}
    for param in suite.buffers:
        if not param.is_input:
            continue
        if param.name in suite.inputs:
            inputs[param.name] = draw_fresh(param, suite.shape(param, case), suite.inputs[param.name], rng)
        elif param.dtype in FLOATING:  # a low-precision input's bits are shuffled, as its values are
            values = signed(param.name)
            inputs[param.name] = nudged(rng.permutation(values.reshape(-1)), rng).reshape(values.shape)
        else:
            inputs[param.name] = signed(param.name)
    return inputs


def nudged(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``values`` with the last bit of about half their finite non-zero elements flipped (where it stays
    finite): one unit in the last place, so a shuffle of the signed values no longer holds their
    multiset of bit patterns, which a kernel could recognise whatever the order (a sum or XOR of them)."""
    flipped = values.copy()
    bits = flipped.view(np.dtype(f"u{flipped.dtype.itemsize}"))
    bits ^= (rng.random(values.size) < 0.5).astype(bits.dtype)
    keep = ~np.isfinite(flipped.astype(np.float64)) | (values.astype(np.float64) == 0)
    flipped[keep] = values[keep]
    return flipped


def zero_positions(rng: np.random.Generator, size: int) -> np.ndarray:
    """Flat indices where a Bernoulli(ZERO_FRACTION) draw per element would hit, drawn as the gaps
    between hits: a few percent of the draws one per element takes."""
    expected = size * ZERO_FRACTION
    batch = int(expected + 8 * np.sqrt(expected)) + 16  # nearly always one batch reaches the end
    chunks, last = [], -1
    while last < size:
        hits = np.cumsum(rng.geometric(ZERO_FRACTION, size=batch)) + last
        chunks.append(hits)
        last = int(hits[-1])
    hits = np.concatenate(chunks)
    return hits[hits < size]


def spread(suite: Suite, inputs: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int]:
    """Float inputs with magnitudes spread widely and signed zeros, not yet scaled nor cast: each
    value times 2^k, k drawn from -R..R, in float32 (float64 for float64 inputs), which holds them
    exactly (no exp2, whose rounding differs between CPUs' libraries); and the zeros placed. A
    bfloat16 or float8 input is spread from its float32 values and rounded back in :func:`scaled`."""
    out, zeros = {}, 0
    for param in suite.buffers:
        if not param.is_input:
            continue
        x = float_values(inputs[param.name])
        if param.dtype not in FLOATING:
            out[param.name] = x
            continue
        bits = type_bits(SPREAD_BITS, param.dtype)
        powers = rng.integers(-bits, bits, size=x.shape, endpoint=True, dtype=np.int32)
        values = np.ldexp(x, powers, dtype=np.float64 if param.dtype == "float64" else np.float32)
        flat = values.reshape(-1)
        # fmin/fmax skip NaN, as the element-wise comparisons they replace do
        if flat.size >= 4 and np.fmin.reduce(flat) < 0 < np.fmax.reduce(flat):
            where = zero_positions(rng, flat.size)
            flat[where] = np.where(rng.random(where.size) < 0.5, -0.0, 0.0)
            zeros += int(where.size)
        out[param.name] = values
    return out, zeros


def magnitude(values: np.ndarray) -> float:
    """The largest |value| (NaN where any is NaN), without an array of absolute values."""
    return max(float(values.max(initial=0)), -float(values.min(initial=0))) if values.size else 0.0


def input_scale(suite: Suite, name: str, values: np.ndarray) -> float:
    """The scale of an input's values: its distribution's reach (uniform and integers: the larger of
    |low| and |high|; normal: |mean| + 3 std; outliers: the larger of scale and its base's), or, without one, the largest |value| of the signed case
    (``values`` are those, shuffled)."""
    dist = suite.inputs.get(name)
    return magnitude(float_values(values)) if dist is None else reach(dist)


def reach(dist) -> float:
    if dist.distribution == "outliers":  # its outliers' size, or its base's reach where that is larger
        return max(float(dist.scale), reach(dist.base))
    if dist.distribution == "normal":
        return abs(dist.mean) + NORMAL_REACH * dist.std
    return max(abs(dist.low), abs(dist.high))


def input_bound(suite: Suite, param, values: np.ndarray) -> float:
    """The largest |value| an adversarial set gives ``param``: its signed ``adversarial_max``, else
    2^B times its scale (B per dtype, :data:`BOUND_BITS`)."""
    dist = suite.inputs.get(param.name)
    if dist is not None and dist.adversarial_max is not None:
        return float(dist.adversarial_max)
    return float(np.ldexp(input_scale(suite, param.name, values), type_bits(BOUND_BITS, param.dtype)))


def bound_text(suite: Suite) -> str:
    """What bounds an adversarial set's magnitudes, for its description."""
    signed = sorted(name for name, d in suite.inputs.items() if d.adversarial_max is not None)
    bits = sorted({type_bits(BOUND_BITS, p.dtype) for p in suite.buffers
                   if p.is_input and p.dtype in FLOATING and p.name not in signed})
    parts = [f"at most 2^{'/'.join(map(str, bits))} × each input's scale"] if bits else []
    parts += [f"{name} at most {suite.inputs[name].adversarial_max:g}" for name in signed]
    return ", ".join(parts) or "no float inputs"


def scale_exponents(suite: Suite, spread_inputs: dict[str, np.ndarray], bounds: dict[str, float]) -> list[int]:
    """Candidate powers of two for the float inputs, largest first, ending at 0 (or one below 0, where
    the spread alone takes an input past its bound)."""
    most = None
    for param in suite.buffers:
        if param.is_input and param.dtype in FLOATING:
            biggest = magnitude(spread_inputs[param.name])
            if biggest > 0:  # NaN is not: as before, an input holding NaN sets no bound
                room = (int(np.floor(np.log2(float(finfo(param.dtype).max) / biggest))) - 2
                        if np.isfinite(biggest) else 0)
                if np.isfinite(biggest) and bounds.get(param.name, 0) > 0:
                    room = min(room, int(np.floor(np.log2(bounds[param.name] / biggest))))
                most = room if most is None else min(most, room)
    if not most:
        return [0]
    if most < 0:
        return [most]
    return list(dict.fromkeys(int(round(most * j / SCALE_STEPS)) for j in range(SCALE_STEPS, -1, -1)))


class Scaled(Sequence):
    """The adversarial candidates, one per exponent, each built when read (and built again, rather than
    kept: each is as large as the case, and a Python reference stops at the first usable one)."""

    def __init__(self, suite: Suite, spread_inputs: dict[str, np.ndarray], exponents: list[int]):
        self.suite, self.spread_inputs, self.exponents = suite, spread_inputs, exponents

    def __len__(self) -> int:
        return len(self.exponents)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return scaled(self.suite, self.spread_inputs, self.exponents[index])


def scaled(suite: Suite, spread_inputs: dict[str, np.ndarray], exponent: int) -> dict[str, np.ndarray]:
    out = {}
    for param in suite.buffers:
        if not param.is_input:
            continue
        values = spread_inputs[param.name]
        if param.dtype in LOW_PRECISION:  # scaled exactly in float32, then rounded to the input's type
            values = encode(np.ldexp(values, exponent, dtype=np.float32), param.dtype)
        elif param.dtype in FLOAT_DTYPES:
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
        if param.dtype in FLOATING:
            limit = float(finfo(param.dtype).max) * 2.0 ** -type_bits(HEADROOM_BITS, param.dtype)
            if not magnitude(float_values(np.asarray(value))) <= limit:  # exact in the output's dtype; NaN, Inf fail
                return False
    return True


def _rms(values) -> float:
    v = float_values(np.asarray(values)).reshape(-1)
    if v.size and v.dtype.kind == "f" and not (np.isfinite(v.min()) and np.isfinite(v.max())):
        v = v[np.isfinite(v)]  # min and max see any NaN or infinity
    biggest = magnitude(v)
    if biggest == 0:
        return 0.0
    # over the largest magnitude, so float32 squares neither overflow nor lose the scale; numpy's
    # pairwise sum is exact enough for a tolerance's scale, and the same in every thread
    work = np.divide(v, biggest, dtype=np.float32 if v.dtype.itemsize <= 4 else np.float64)
    np.square(work, out=work)
    return biggest * float(np.sqrt(float(work.sum()) / v.size))


@dataclass
class Draft:
    """One fresh set drawn, before the reference has run on it."""

    label: str
    candidates: Sequence[dict[str, np.ndarray]]  # its inputs; an adversarial set's one per scale, largest first
    exponents: tuple[int, ...] = (0,)
    zeros: int = 0
    staged: list[Path] = field(default_factory=list)  # a CUDA reference's: the candidates' data folders

    @property
    def adversarial(self) -> bool:
        return self.label.startswith("adversarial")


def draft(suite: Suite, case: Case, label: str, rng: np.random.Generator, signed: Callable[[str], np.ndarray]) -> Draft:
    inputs = resampled_inputs(suite, case, rng, signed)
    if not label.startswith("adversarial"):
        return Draft(label, [inputs])
    bounds = {p.name: input_bound(suite, p, inputs[p.name]) for p in suite.buffers
              if p.is_input and p.dtype in FLOATING}
    wide, zeros = spread(suite, inputs, rng)
    exponents = scale_exponents(suite, wide, bounds)
    return Draft(label, Scaled(suite, wide, exponents), tuple(exponents), zeros)


def stage(suite: Suite, case: Case, draft: Draft, root: Path) -> None:
    """Write a draft's candidates where a CUDA reference's worker reads them, and let go of the arrays:
    a resampled set's straight into its set's folder, each adversarial candidate into one of its own."""
    for index, inputs in enumerate(draft.candidates):
        data = root / f"{draft.label}.scales" / str(index) if draft.adversarial else root / draft.label
        write_case(suite, case, inputs, {}, data)
        draft.staged.append(data)
    draft.candidates = ()


@dataclass
class Prepared:
    """A case's fresh sets as far as they go without the worker (:func:`prepare`)."""

    suite: Suite
    case: Case
    seed: int
    root: Path
    drafts: list[Draft] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sets: list[FreshSet] | None = None  # None until the reference has run

    def finish(self, client=None) -> tuple[list[FreshSet], list[str]]:
        """The fresh sets, written under ``root``, and notes on what was skipped: the reference run on
        what is drawn (a CUDA one through ``client``, every candidate of every set in one request)."""
        if self.sets is None:
            runner = ReferenceRunner(self.suite, client, self.root)
            if self.suite.reference.python:
                outputs = [runner.outputs(self.case, d.candidates, first_usable=True, usable=usable) for d in self.drafts]
            else:
                flat = iter(runner.outputs(self.case, [path for d in self.drafts for path in d.staged]))
                outputs = [[next(flat) for _ in d.staged] for d in self.drafts]
            signed_rms = {name: _rms(v) for name, v in self.suite.resolved(self.case).expected_outputs().items()}
            kept = (self._keep(d, out, signed_rms) for d, out in zip(self.drafts, outputs))
            self.sets, self.drafts = [s for s in kept if s is not None], []
        return self.sets, self.notes

    def _keep(self, draft: Draft, outputs: list, signed_rms: dict[str, float]) -> FreshSet | None:
        """The set ``draft`` becomes, written under ``root``; None with a note where the reference failed."""
        suite, case, label = self.suite, self.case, draft.label
        if draft.adversarial:
            chosen = next((i for i, out in enumerate(outputs) if usable(suite, out)), None)
        else:
            chosen = 0 if outputs[0] is not None else None
        folder, scales = self.root / label, self.root / f"{label}.scales"
        if chosen is None:
            if draft.staged:  # its inputs, written for the worker
                trash.discard(scales if draft.adversarial else folder)
            self.notes.append(f"adversarial fresh inputs skipped on case {case.name}: the reference's own output is "
                              "not finite on them at any scale tried (or it refused them)" if draft.adversarial else
                              f"fresh inputs ({label}) skipped on case {case.name}: the reference failed on them")
            return None
        if draft.staged:  # its inputs stay where the worker read them
            if draft.adversarial:
                os.replace(draft.staged[chosen], folder)
                trash.discard(scales)
            write_case(suite, case, {}, outputs[chosen], folder)
        else:
            write_case(suite, case, draft.candidates[chosen], outputs[chosen], folder)
        if draft.adversarial:
            bits = sorted({type_bits(SPREAD_BITS, p.dtype) for p in suite.buffers
                           if p.is_input and p.dtype in FLOATING})
            description = (f"{label}: magnitudes spread over 2^±{'/'.join(map(str, bits)) or 0}, {draft.zeros} signed "
                           f"zeros, scaled by 2^{draft.exponents[chosen]} ({bound_text(suite)}); "
                           f"CUDAGATE_FRESH_SEED={self.seed} draws them again")
        else:
            description = f"{label}: new values like the signed ones; CUDAGATE_FRESH_SEED={self.seed} draws them again"
        scale = {}
        for name, values in outputs[chosen].items():
            base, now = signed_rms.get(name, 0.0), _rms(values)
            scale[name] = now / base if base > 0 and now > 0 else 1.0
        return FreshSet(label, folder, scale, description)


def prepare(suite: Suite, case: Case, *, count: int, adversarial: bool, seed: int, root: Path,
            reference: bool = True) -> Prepared:
    """The fresh sets of one case drawn (for a CUDA reference, written where its worker reads them)
    and, with ``reference``, finished by a Python reference: what needs the worker, or a generated
    case's arrays not yet in place (``reference=False``), is left to :meth:`Prepared.finish`. Needs
    no worker, so the gate runs it ahead (defences/fresh_ahead.py)."""
    prepared = Prepared(suite, case, seed, root)
    if count <= 0:
        prepared.sets = []
        return prepared
    root.mkdir(parents=True, exist_ok=True)
    if not changes_inputs(suite):
        prepared.notes.append(f"fresh inputs on case {case.name}: every input is integer data without a distribution "
                              "under `inputs:`, so fresh sets repeat the signed values")
    signed = signed_inputs(suite, case)
    for index, label in enumerate(labels(count, adversarial)):
        prepared.drafts.append(draft(suite, case, label, _rng(seed, suite, case, index), signed))
        if not suite.reference.python:
            stage(suite, case, prepared.drafts[-1], root)
    if suite.reference.python and reference:
        prepared.finish()
    return prepared
