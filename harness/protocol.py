"""The worker protocol: JSON lines on stdin (requests) and stdout (responses).

A request asks the worker to ``compile`` a kernel or to ``run`` it on a list of cases. The worker
answers each ``run`` request with one ``compile`` line, one ``case`` line per case, in order, and
a ``done`` line, so that a client that loses the worker mid-request keeps every case already
answered. Large arrays travel as ``.npy`` files, never inline. ``schemas/harness-request`` and
``schemas/harness-response`` are the formal contract.
"""

from __future__ import annotations

import numpy as np

# Element types a signature may name; the C spelling is what a kernel parameter should use.
DTYPES: dict[str, tuple[str, str]] = {
    "float16": ("<f2", "__half"),
    "float32": ("<f4", "float"),
    "float64": ("<f8", "double"),
    "int8": ("<i1", "signed char"),
    "int16": ("<i2", "short"),
    "int32": ("<i4", "int"),
    "int64": ("<i8", "long long"),
    "uint8": ("<u1", "unsigned char"),
    "uint16": ("<u2", "unsigned short"),
    "uint32": ("<u4", "unsigned int"),
    "uint64": ("<u8", "unsigned long long"),
}
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})

# Output buffers are filled with a byte pattern before every launch; a different one on the second
# validation launch. An element holding the first pattern after launch 1 AND the second after
# launch 2 was never written (a legitimate -1 or NaN result cannot match both). 0xFF makes a float a
# NaN, so an unwritten float always fails the comparison even before it is counted.
POISON_FIRST = 0xFF
POISON_SECOND = 0x7F

# Sticky CUDA errors corrupt the context: the worker reports the case and exits so the client starts
# a fresh worker for the remaining cases.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_TRAP",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_UNKNOWN",
})
EXIT_STICKY = 3


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(DTYPES[name][0])


def unwritten_mask(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Elements that still held the first poison after launch 1 and the second after launch 2."""
    itemsize = first.dtype.itemsize
    a = first.reshape(-1).view(np.uint8).reshape(-1, itemsize)
    b = second.reshape(-1).view(np.uint8).reshape(-1, itemsize)
    return np.all(a == POISON_FIRST, axis=1) & np.all(b == POISON_SECOND, axis=1)
