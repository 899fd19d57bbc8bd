"""Trusted reference for the FIR filter: a float64 correlation, rounded once to float32.

numpy alone (scipy.signal costs about a second to import, on every gate run): the direct sum up to
256 taps, above that an FFT. In float64 the FFT's error (about 1e-16 of the largest terms) is some
eight orders below the float32 kernel's own, and it takes 13 ms instead of 0.35 s for the
131072 x 32768 case, whose fresh inputs are referenced on every gate run. On every signed case it
rounds to the same float32 outputs as the direct sum.
"""

import numpy as np

DIRECT_TAPS = 256  # about where the direct sum (n * taps work) stops beating the FFT; the host decides exactly


def _fft_size(length):
    """The smallest 2^a * 3^b * 5^c at least ``length``: sizes numpy's FFT takes quickly."""
    best = 1 << (length - 1).bit_length()
    fives = 1
    while fives < best:
        threes = fives
        while threes < best:
            size = threes
            while size < length:
                size *= 2
            best = min(best, size)
            threes *= 3
        fives *= 5
    return best


def fir_valid(x, h, n, taps):
    x, h = x.astype(np.float64), h.astype(np.float64)[:taps]
    if taps <= DIRECT_TAPS:
        y = np.correlate(x, h, mode="valid")
    else:
        # circular correlation over at least len(x) points: the valid outputs never wrap
        size = _fft_size(x.size)
        y = np.fft.irfft(np.fft.rfft(x, size) * np.conj(np.fft.rfft(h, size)), size)
    return y[:n].astype(np.float32)
