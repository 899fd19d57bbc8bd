"""The boundary's rules for case data: a ``.npy`` header checked before anything is allocated."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from cudagate_harness.protocol import low_precision

from pytest_cudagate.boundary import MAX_DEPTH, MAX_NPY_BYTES, refuse


def npy_header(path: str | Path, limit: int = MAX_NPY_BYTES) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file, read from its header before anything is allocated.

    Refused: not a regular file, not a .npy, object/string/structured dtypes (but for the bits of a
    bfloat16 or float8 type, cudagate_harness.protocol.DTYPES), a byte size that overflows or
    exceeds ``limit``, and a file whose length does not match its header.
    """
    path = Path(path)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise refuse(path, "not a regular file (a device, FIFO or folder, or a link to one)")
    try:
        with open(path, "rb") as handle:
            version = npy_format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(handle, max_header_size=10000)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npy_format.read_array_header_2_0(handle, max_header_size=10000)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = handle.tell()
    # numpy parses the header text as a Python literal: a pathological one exhausts memory or the
    # parser's recursion instead of raising ValueError.
    except (OSError, ValueError, SyntaxError, TypeError, OverflowError, EOFError, MemoryError, RecursionError) as exc:
        raise refuse(path, f"not a readable .npy file ({(str(exc) or type(exc).__name__)[:200]}); regenerate it") from None
    plain = dtype.kind in "biuf" and dtype.fields is None and dtype.subdtype is None
    if dtype.hasobject or not (plain or low_precision(dtype)):
        raise refuse(path, f"holds {str(dtype)[:60]}, not plain numbers; regenerate it")
    if any(not isinstance(d, int) or d < 0 for d in shape) or len(shape) > MAX_DEPTH:
        raise refuse(path, f"has an invalid shape {str(shape)[:80]}; regenerate it")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > limit:
        raise refuse(path, f"its header declares {str(shape)[:80]} of {dtype}, over the {limit}-byte limit")
    if info.st_size != offset + nbytes:
        raise refuse(path, f"is {info.st_size} bytes but its header declares {offset + nbytes} "
                            "(truncated or padded); regenerate it")
    return tuple(shape), dtype
