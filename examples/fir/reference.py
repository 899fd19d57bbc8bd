"""Trusted reference for the FIR filter: a float64 correlation, rounded once to float32.

scipy picks the direct sum or an FFT by size. In float64 the FFT's error (about 1e-16 of the
largest terms) is some eight orders below the float32 kernel's own, and it takes 20 ms instead of
0.35 s for the 131072 x 32768 case, whose fresh inputs are referenced on every gate run. On every
signed case it rounds to the same float32 outputs as the direct sum.
"""

import numpy as np
from scipy.signal import correlate


def fir_valid(x, h, n, taps):
    y = correlate(x.astype(np.float64), h.astype(np.float64)[:taps], mode="valid", method="auto")
    return y[:n].astype(np.float32)
