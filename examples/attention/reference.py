"""Trusted reference for causal multi-head attention: computed in float64, rounded once to float32."""

import numpy as np


def attention(q, k, v, H, T, D, scale):
    """Causal attention per head in float64: softmax(scale·Q·Kᵀ, keys after the query masked)·V."""
    q, k, v = (np.asarray(a, dtype=np.float64).reshape(H, T, D) for a in (q, k, v))
    scores = np.float64(scale) * q @ k.transpose(0, 2, 1)
    scores[:, np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf
    scores -= scores.max(axis=2, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=2, keepdims=True)
    return (p @ v).astype(np.float32)
