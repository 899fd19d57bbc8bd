"""The Euclidean norm in float64 without BLAS.

``np.linalg.norm`` of a vector is a BLAS dot product. OpenBLAS runs it on a pool of one thread per
core, and those threads spin between calls; the gate checks a large case's outputs from several
threads at once, and on a 16-core GPU runner the pools took the cores from the rest of the run
(warm examples 5.4 against 4.6 s with one BLAS thread). numpy's own sum-of-products loop needs no
threads; on one core it is slower than the BLAS dot (about 2 ms for 4M values), a small part of an
output's check (benchmarks/judge_speed.py compares the two under threads).
"""

from __future__ import annotations

import math

import numpy as np

_TINY = float(np.finfo(np.float64).tiny)


def euclidean_norm(values: np.ndarray) -> float:
    """||values|| in float64, of an array of any shape and real dtype. Where the sum of squares would
    overflow or underflow (values beyond about 1e154, or below 1e-154), it is taken over the values
    divided by the largest magnitude, so a relative norm of such outputs still means something; inf
    with an infinity, NaN with a NaN."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    total = float(np.einsum("i,i->", flat, flat))  # numpy's loop: no BLAS, no floating-point warnings
    if _TINY <= total < math.inf or math.isnan(total):
        return math.sqrt(total)
    biggest = float(np.max(np.abs(flat))) if flat.size else 0.0
    if biggest == 0.0 or math.isinf(biggest):
        return biggest
    scaled = flat / biggest
    return biggest * math.sqrt(float(np.einsum("i,i->", scaled, scaled)))
