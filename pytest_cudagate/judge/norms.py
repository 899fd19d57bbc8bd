"""The Euclidean norm in float64 without BLAS.

``np.linalg.norm`` of a vector is a BLAS dot product. OpenBLAS runs it on a pool of as many threads
as the host has cores, which then spin between calls; the gate checks outputs from several threads
at once, and on a 16-core GPU runner those pools took the cores from everything else in the run
(warm examples 5.4 s, against 4.6 s with one BLAS thread). numpy's own sum-of-products loop is as
fast as a single BLAS thread here and needs no threads.
"""

from __future__ import annotations

import math

import numpy as np


def euclidean_norm(values: np.ndarray) -> float:
    """||values|| of a float64 array (any shape); inf where the sum of squares overflows, NaN with a NaN."""
    flat = values.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # as a BLAS dot: inf and NaN come back without a warning
        return math.sqrt(float(np.einsum("i,i->", flat, flat)))
