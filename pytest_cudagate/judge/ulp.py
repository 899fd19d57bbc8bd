"""Units in the last place of an output's own type: the ``ulp:`` part of a tolerance.

The spacing of a value ``x`` in a float type of ``p`` significant bits and least normal exponent
``emin`` is ``2^(max(floor(log2 |x|), emin) - (p - 1))``: the gap from ``|x|`` to the next value of
that type away from zero (``np.spacing`` for float32, with the subnormals' fixed gap below the least
normal value). It is computed from the type's limits (:func:`cudagate_harness.protocol.finfo`), so
float16, float32, float64, bfloat16 and both FP8 types are measured alike, in float64, on the
expected value whatever type it is stored in.
"""

from __future__ import annotations

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, LOW_PRECISION, finfo

ULP_DTYPES = FLOAT_DTYPES | frozenset(LOW_PRECISION)


def spacing(values: np.ndarray, dtype: str) -> np.ndarray:
    """One ulp of each of ``values`` (finite float64) in ``dtype``, as float64."""
    info = finfo(dtype)
    _, exponent = np.frexp(values)  # |x| = m * 2^exponent, m in [0.5, 1): floor(log2 |x|) = exponent - 1
    exponent = np.where(values == 0, info.minexp, np.maximum(exponent - 1, info.minexp))
    return np.ldexp(1.0, exponent - info.nmant)


def allowed(atol: float, rtol: float, ulp: int | None, dtype: str | None, e: np.ndarray,
            magnitude: np.ndarray | None = None) -> np.ndarray:
    """Each element's allowance: ``atol + rtol*|e|``, or ``ulp`` units of ``e`` in ``dtype`` where that
    is more (an element passes within either)."""
    magnitude = np.abs(e) if magnitude is None else magnitude
    allowance = np.multiply(magnitude, rtol)
    allowance += atol
    if ulp is not None and dtype in ULP_DTYPES:
        with np.errstate(invalid="ignore", over="ignore"):
            np.maximum(allowance, ulp * spacing(e, dtype), out=allowance)
    return allowance


def distance(actual: float, expected: float, dtype: str) -> float:
    """``|actual - expected|`` in ulps of ``expected`` in ``dtype``."""
    return abs(actual - expected) / float(spacing(np.float64(expected), dtype))
