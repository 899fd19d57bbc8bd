"""Per-block sums of reduce0..reduce2: block b reduces elements [256 b, 256 b + 256), in float64."""

import numpy as np

THREADS = 256


def block_sums(g_idata, n):
    blocks = -(-n // THREADS)
    padded = np.zeros(blocks * THREADS)
    padded[:n] = g_idata
    return padded.reshape(blocks, THREADS).sum(axis=1).astype(np.float32)
