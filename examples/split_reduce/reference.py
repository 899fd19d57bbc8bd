"""Trusted reference for row sums: float64, rounded once to float32."""

import numpy as np


def row_sums(x, rows, cols):
    return x.astype(np.float64).reshape(rows, cols).sum(axis=1).astype(np.float32)
