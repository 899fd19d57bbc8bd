"""Seeded case arrays: the inputs drawn for a case, and where a case's arrays are written.

Inputs come from a seeded generator with real variation (never all zeros or ones, which hide
unwritten outputs and wrong indexing). Stored cases (suite/cases.py), generated cases
(suite/generated.py) and fresh inputs (defences/fresh_inputs.py, through the cheaper
:func:`draw_fresh`) all draw through here, so a generated case's inputs are bit for bit what
``cudagate cases generate`` would have stored.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, LOW_PRECISION, encode, finfo, numpy_dtype

from pytest_cudagate.suite.model import Case, Distribution, Param, Suite, default_bounds


def case_seed(suite: Suite, case: Case) -> int:
    if case.seed is not None:
        return case.seed
    digest = hashlib.sha256(f"{suite.name}/{case.name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _rounded(values: np.ndarray, name: str) -> np.ndarray:
    """Drawn ``values`` rounded to the low-precision type ``name`` (its bits), clipped first to its
    finite range: the loader refuses a distribution whose bulk lies beyond it, and the rare normal
    draw past mean ± 6 std becomes the largest finite value instead of NaN or Inf."""
    limit = float(finfo(name).max)
    return encode(np.clip(values, -limit, limit, out=values), name)


def draw(param: Param, shape: tuple[int, ...], dist: Distribution | None, rng: np.random.Generator) -> np.ndarray:
    """``param``'s values for a case, drawn in float64 (integers: int64) and cast to its dtype; a
    bfloat16 or float8 input is rounded to nearest (:func:`_rounded`)."""
    dtype = numpy_dtype(param.dtype)
    floating = param.dtype in FLOAT_DTYPES or param.dtype in LOW_PRECISION
    if dist is None:
        kind = "uniform" if floating else "integers"
        dist = Distribution(kind, *default_bounds(kind, param.dtype))
    if dist.distribution == "outliers":
        values = with_outliers(draw(Param(param.name, param.kind, "float64", param.intent), shape, dist.base, rng),
                               dist, rng)
    elif dist.distribution == "normal":
        values = rng.normal(dist.mean, dist.std, size=shape)
    elif dist.distribution == "integers":
        values = rng.integers(int(dist.low), int(dist.high), size=shape, endpoint=True)
    else:
        values = rng.uniform(dist.low, dist.high, size=shape)
    if param.dtype in LOW_PRECISION:
        return _rounded(values.astype(np.float64), param.dtype)
    return values.astype(dtype)


def with_outliers(values: np.ndarray, dist: Distribution, rng: np.random.Generator) -> np.ndarray:
    """``values`` (drawn from ``dist.base``) with ``dist.k`` of each row or block, at distinct places
    drawn anew, replaced by ±scale·u, u uniform in [0.5, 1]; a last block shorter than the others
    gets those of its k places that fall inside it."""
    group = dist.group(values.shape)
    flat = values.reshape(-1)
    groups = -(-flat.size // group)
    places = np.argpartition(rng.random((groups, group)), dist.k - 1, axis=1)[:, :dist.k]
    places = (places + group * np.arange(groups)[:, None]).reshape(-1)
    size = rng.uniform(0.5, 1.0, size=places.size) * dist.scale
    size[rng.random(places.size) < 0.5] *= -1
    inside = places < flat.size
    flat[places[inside]] = size[inside].astype(flat.dtype)
    return values


def draw_fresh(param: Param, shape: tuple[int, ...], dist: Distribution, rng: np.random.Generator) -> np.ndarray:
    """A new draw from ``dist`` made in the input's own precision (float32 for float16, float32,
    bfloat16 and float8, then rounded; integers in their dtype where the bounds fit), a few times
    less work than :func:`draw`'s float64 draw and cast. For fresh inputs only: signed
    and generated cases stay drawn by :func:`draw`, whose values their digests sign."""
    dtype = numpy_dtype(param.dtype)
    if dist.distribution == "outliers":  # drawn in the input's own precision, then its outliers placed
        work = param if param.dtype in FLOAT_DTYPES else Param(param.name, param.kind, "float32", param.intent)
        values = with_outliers(draw_fresh(work, shape, dist.base, rng), dist, rng)
        return _rounded(values, param.dtype) if param.dtype in LOW_PRECISION else values.astype(dtype, copy=False)
    if param.dtype in LOW_PRECISION:
        if dist.distribution == "integers":
            values = rng.integers(int(dist.low), int(dist.high), size=shape, endpoint=True).astype(np.float32)
        else:
            values = draw_fresh(Param(param.name, param.kind, "float32", param.intent), shape, dist, rng)
        return _rounded(values, param.dtype)
    if dist.distribution == "integers":
        low, high = int(dist.low), int(dist.high)
        if dtype.kind in "iu" and np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return rng.integers(low, high, size=shape, endpoint=True, dtype=dtype)
        return rng.integers(low, high, size=shape, endpoint=True).astype(dtype)  # wraps or rounds as draw() does
    work = np.float32 if dtype.kind == "f" and dtype.itemsize <= 4 else np.float64
    if dist.distribution == "normal":
        values = rng.standard_normal(size=shape, dtype=work)
        values *= dist.std
        values += dist.mean
    else:
        values = rng.random(size=shape, dtype=work)
        values *= dist.high - dist.low
        values += dist.low
    return values.astype(dtype, copy=False)


def draw_inputs(suite: Suite, case: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = suite.resolved(case).shapes
    return {p.name: draw(p, shapes[p.name], suite.inputs.get(p.name), rng)
            for p in suite.buffers if p.is_input}


def write_case(suite: Suite, case: Case, inputs: dict[str, np.ndarray], expected: dict[str, np.ndarray],
               data_dir: Path | None = None) -> Path:
    folder = (data_dir or suite.data_dir) / case.name
    (folder / "expected").mkdir(parents=True, exist_ok=True)
    for name, array in inputs.items():
        np.save(folder / f"{name}.npy", array)
    for name, array in expected.items():
        np.save(folder / "expected" / f"{name}.npy", array)
    return folder
