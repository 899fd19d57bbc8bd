"""GPT-2 LayerNorm forward (eps 1e-5, biased variance) in float64, with the row means and reciprocal
standard deviations the llm.c kernels also store."""

import numpy as np


def layernorm_forward(inp, weight, bias, N, C, B, T, block_size):
    if N != B * T:
        raise ValueError(f"a case's N must be B * T (the rows llm.c's kernels see): N={N}, B={B}, T={T}")
    x = inp.astype(np.float64).reshape(N, C)
    mean = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(axis=1) + 1e-5)
    out = (x - mean[:, None]) * rstd[:, None] * weight.astype(np.float64) + bias.astype(np.float64)
    return out.astype(np.float32), mean.astype(np.float32), rstd.astype(np.float32)
