"""The worker protocol: JSON lines on stdin (requests) and stdout (responses).

A request asks the worker to ``compile`` a kernel or to ``run`` it on a list of cases. The worker
answers each ``run`` request with one ``compile`` line, one ``case`` line per case, in order, and
a ``done`` line, so that a client that loses the worker mid-request keeps every case already
answered. Large arrays travel as ``.npy`` files, never inline. ``schemas/harness-request`` and
``schemas/harness-response`` are the formal contract; :mod:`.messages` holds the request and each
kind of reply line as dataclasses.
"""

from __future__ import annotations

import re

import numpy as np

# Element types a signature may name; the C spelling is what a kernel parameter should use. The one
# list of them: the schemas take any name, and the loader and request checks refuse one not here
# (:func:`unknown_dtype`); what else the code needs of a type it reads from numpy or ml_dtypes.
DTYPES: dict[str, tuple[str | list, str]] = {
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
    # Buffers only (no scalars). numpy has no type of its own for these: an array of one holds its
    # elements' bits under a one-field structured dtype named after the type, so a .npy file (the
    # worker's outputs included) says which type its bits are, np.load(allow_pickle=False) reads it
    # back, and numpy refuses arithmetic on the bits instead of doing integer arithmetic on them.
    # Their values come from ml_dtypes (:func:`values`, :func:`encode`), which the worker never needs.
    "bfloat16": ([("bfloat16", "<u2")], "__nv_bfloat16"),
    "float8_e4m3fn": ([("float8_e4m3fn", "|u1")], "__nv_fp8_e4m3"),
    "float8_e5m2": ([("float8_e5m2", "|u1")], "__nv_fp8_e5m2"),
}
FLOAT_DTYPES = frozenset(name for name, (code, _) in DTYPES.items() if isinstance(code, str) and np.dtype(code).kind == "f")
LOW_PRECISION = tuple(name for name, (code, _) in DTYPES.items() if isinstance(code, list))


def unknown_dtype(value) -> str | None:
    """Why ``value`` is not a type of :data:`DTYPES`, with the fix; None where it is one."""
    if isinstance(value, str) and value in DTYPES:
        return None
    return f"{str(value)[:40]!r} is not a dtype cudagate knows; write one of {', '.join(DTYPES)}"

# Output buffers are filled with a byte pattern before every launch; a different one on the second
# validation launch. An element holding the first pattern after launch 1 AND the second after
# launch 2 was never written (a legitimate -1 or NaN result cannot match both). 0xFF makes a float a
# NaN, so an unwritten float always fails the comparison even before it is counted.
POISON_FIRST = 0xFF
POISON_SECOND = 0x7F
# Timed launches poison their outputs too (before the L2 flush, outside the events), so the output a
# rotation slot holds after timing is exactly what the last timed launch on it wrote.
POISON_TIMED = POISON_FIRST

# Guard zones: every device copy of every buffer sits between two zones of this many bytes filled
# with CANARY, checked after each phase of a run; a changed byte is a write outside the buffer.
# 4 KiB keeps every buffer 256-byte aligned and catches a write up to a row or so past the end.
GUARD_BYTES = 4096
CANARY = 0xA5

# Shared-memory scrub before each validation launch: every SM's shared memory is filled with the
# poison of that launch (NaN for float32 on launch 1, 3.4e38 on launch 2), so a kernel that reads
# shared memory it never wrote gets different garbage each time instead of benign leftovers.
SCRUB_WORDS = {POISON_FIRST: 0xFFFFFFFF, POISON_SECOND: 0x7F7F7F7F}

# A request's ``timeout_s``: how long its client waits for each answer line (the gate's: the case
# timeout) before it kills the worker. The request's compiles stop ANSWER_S before that (at half of
# it, at the least), so that a compile stopped at its limit is answered as such, not as a dead worker.
# Absent, the compiler's own default applies.
ANSWER_S = 1.0
TIMEOUT_S_MAX = 86400.0


def request_timeout_s(request: dict) -> float | None:
    """The request's ``timeout_s``, or None where it gives none (or one :func:`~.request_checks.request_problems` refuses)."""
    value = request.get("timeout_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= TIMEOUT_S_MAX:
        return None
    return float(value)


def compile_seconds(timeout_s: float) -> float:
    """How long a compile of a request answered within ``timeout_s`` may take."""
    return max(timeout_s / 2, timeout_s - ANSWER_S)


EXIT_STICKY = 3


_NUMPY = {name: np.dtype(code) for name, (code, _) in DTYPES.items()}


def numpy_dtype(name: str) -> np.dtype:
    """The dtype of a ``name`` buffer's host arrays and .npy files (for a :data:`LOW_PRECISION` type,
    its bits: see :data:`DTYPES`)."""
    return _NUMPY[name]


def low_precision(dtype: np.dtype) -> str | None:
    """The :data:`LOW_PRECISION` type whose bits ``dtype`` holds, or None."""
    name = dtype.names[0] if dtype.names and len(dtype.names) == 1 else None
    return name if name in LOW_PRECISION and dtype == _NUMPY[name] else None


def dtype_name(dtype: np.dtype) -> str:
    """The signature's name of ``dtype`` (``bfloat16`` for its bits; ``float32`` for float32)."""
    return low_precision(dtype) or str(dtype)


def value_type(name: str) -> np.dtype:
    """ml_dtypes' numpy type of a :data:`LOW_PRECISION` type, imported only when one is used."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def finfo(name: str):
    """Machine limits of a float type of the signature (ml_dtypes' for a :data:`LOW_PRECISION` one)."""
    if name in LOW_PRECISION:
        import ml_dtypes

        return ml_dtypes.finfo(value_type(name))
    return np.finfo(numpy_dtype(name))


def unit_roundoff(name: str) -> float:
    """u = 2^-p for a float type of p significant bits: the largest relative error of one rounding
    to nearest (bfloat16 2^-8, float8_e4m3fn 2^-4, float8_e5m2 2^-3, float32 2^-24)."""
    return float(finfo(name).eps) / 2


def values(array: np.ndarray) -> np.ndarray:
    """``array``'s values: a low-precision array's as float32 (which holds each exactly), any other
    array as it is."""
    name = low_precision(array.dtype)
    if name is None:
        return array
    bits = np.ascontiguousarray(array).view(value_type(name))
    return bits.astype(np.float32)


def encode(numbers, name: str) -> np.ndarray:
    """``numbers`` (any real array) rounded to the :data:`LOW_PRECISION` type ``name``, to nearest
    with ties to even, and held as its bits (:func:`numpy_dtype`). Wider values are rounded to float32
    first, then once to ``name`` (a double rounding, off by one unit in the last place only on a
    float64 value within 2^-24 relative of a tie): every ml_dtypes version rounds float32 alike, while
    its float64 conversion changed between versions (0.6 went through float32, 0.7 rounds directly), and
    a generated case's digest must not depend on which is installed. Beyond the type's range: Inf
    (float8_e5m2, bfloat16) or NaN (float8_e4m3fn, which has no infinity)."""
    array = np.asarray(numbers)
    if low_precision(array.dtype) == name:
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = array.astype(np.float32, copy=False).astype(value_type(name))
    return rounded.view(_NUMPY[name])


_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # one unsigned word per element


def element_words(array: np.ndarray) -> np.ndarray:
    """``array``'s elements as unsigned words of their own width, so a byte-wise test of each element
    is one integer comparison (a 4M-element output: about 2 ms instead of 100 ms over its bytes)."""
    return array.reshape(-1).view(_WORDS[array.dtype.itemsize])


def all_bytes(array: np.ndarray, byte: int) -> np.ndarray:
    """Elements of ``array`` whose every byte is ``byte`` (a poison pattern still in place)."""
    words = element_words(array)
    return words == words.dtype.type(int.from_bytes(bytes([byte]) * array.dtype.itemsize, "little"))


def unwritten_mask(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Elements that still held the first poison after launch 1 and the second after launch 2."""
    return all_bytes(first, POISON_FIRST) & all_bytes(second, POISON_SECOND)


# -- request limits: a request file can come from a pull request, so the worker checks it before use --

# CUDA's launch limits (compute capability 9.0).
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
BLOCK_THREADS_MAX = 1024
SHARED_BYTES_MAX = 228 * 1024
BUFFER_BYTES_MAX = 2**37  # one buffer; an H200 holds 141 GB
CASES_MAX = 4096
# Case and parameter names become file names under the output folder: no '/', no leading '.'.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
