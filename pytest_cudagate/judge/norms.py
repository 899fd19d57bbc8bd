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


def euclidean_norm(values: np.ndarray) -> float:
    """||values|| of a float64 array (any shape); inf where the sum of squares overflows, NaN with a NaN."""
    flat = values.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # as a BLAS dot: inf and NaN come back without a warning
        return math.sqrt(float(np.einsum("i,i->", flat, flat)))
