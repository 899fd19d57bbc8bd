"""Per-block sums of reduce3..reduce5: block b reduces elements [512 b, 512 b + 512), in float64."""

import numpy as np

PER_BLOCK = 512


def pair_block_sums(g_idata, n):
    blocks = -(-n // PER_BLOCK)
    padded = np.zeros(blocks * PER_BLOCK)
    padded[:n] = g_idata
    return padded.reshape(blocks, PER_BLOCK).sum(axis=1).astype(np.float32)
