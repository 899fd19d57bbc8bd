"""Library baselines: a vendor routine (cuBLAS SGEMM) timed beside the kernel, for information only.

A suite's kernel may name ``library_baseline: {adapter: NAME, args: {ROLE: PARAMETER, ...}}``. The
adapter is a :class:`LibraryBaseline` that the runner enqueues on the worker's stream exactly where
it would launch a kernel (:meth:`cudagate_harness.runner.CaseRun.time_library`): same poisoned
outputs, cold-L2 flush, pad launches, warm-up floor and interleaved rounds. Its answer never
changes a verdict: a library that is missing, refuses the call or computes something else than
the reference is reported in the baseline's column instead of failing the case.

:data:`ADAPTERS` is the registry; the suite loader reads the roles from it, the worker loads the
library through it (``$CUDAGATE_CUBLAS``, then pip's CUDA wheels, then the system's loader path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .messages import LibrarySpec
from .protocol import numpy_dtype

INT32_MAX = 2**31 - 1


class LibraryUnavailable(RuntimeError):
    """The library cannot be used here (not installed, wrong version); the message says what to do."""


class LibraryCallError(RuntimeError):
    """The library refused or failed one call (a status other than success)."""


class LibraryBaseline(Protocol):
    """A library routine the runner enqueues like a kernel launch.

    ``pointers`` maps each buffer role to the device address of this launch's copy of the buffer
    the suite mapped to it, ``scalars`` each scalar role to its value on the case.
    """

    def enqueue(self, pointers: Mapping[str, int], scalars: Mapping[str, int]) -> None: ...


@dataclass(frozen=True)
class Adapter:
    """What an adapter needs from a suite's signature, and how the worker obtains it."""

    label: str  # how reports name the library
    buffers: Mapping[str, tuple[str, bool]]  # role -> (dtype, written by the call)
    scalars: tuple[str, ...]  # integer scalar roles
    load: Callable[[object], LibraryBaseline]  # (harness Device) -> a ready baseline; LibraryUnavailable
    # (elements per buffer role, value per scalar role, parameter per role) -> why the call does not fit, or None
    fits: Callable[[Mapping[str, int], Mapping[str, int], Mapping[str, str]], str | None]

    @property
    def roles(self) -> tuple[str, ...]:
        return (*self.buffers, *self.scalars)


@dataclass(frozen=True)
class LibraryLaunch:
    """An adapter bound to one suite's mapping of roles to parameter names (a request's ``library``)."""

    adapter: Adapter
    args: Mapping[str, str]  # role -> parameter name
    baseline: LibraryBaseline

    def problem(self, buffers: Mapping[str, object], scalars: Mapping[str, object]) -> str | None:
        """Why the call does not fit the case (``buffers``: the runner's, with dtype, intent and
        count), or None. Checked before anything runs: a call reading past a buffer would fault and
        take the kernel's case with it; one writing an input would corrupt the kernel's inputs."""
        for role, (dtype, writes) in self.adapter.buffers.items():
            buf = buffers.get(self.args[role])
            if buf is None:
                return f"{role}: {self.args[role]!r} is not a buffer of the signature"
            if buf.dtype != numpy_dtype(dtype):
                return f"{role}: buffer {buf.name} holds {buf.dtype}, the call needs {dtype}"
            if writes and buf.intent == "in":
                return f"{role}: the call writes it, but buffer {buf.name} is an input"
        for role in self.adapter.scalars:
            value = scalars.get(self.args[role])
            if not isinstance(value, int) or isinstance(value, bool):
                return f"{role}: {self.args[role]!r} is not an integer scalar of the case"
        return self.adapter.fits({role: buffers[self.args[role]].count for role in self.adapter.buffers},
                                 {role: int(scalars[self.args[role]]) for role in self.adapter.scalars}, self.args)

    def enqueue(self, pointers: Mapping[str, int], scalars: Mapping[str, int]) -> None:
        self.baseline.enqueue({role: pointers[self.args[role]] for role in self.adapter.buffers},
                              {role: int(scalars[self.args[role]]) for role in self.adapter.scalars})


# -- cuBLAS ---------------------------------------------------------------------------------------------

CUBLAS_HINT = "pip install 'cuda-toolkit[cublas]' (or torch, whose wheels bring it) or set CUDAGATE_CUBLAS=/path/to/libcublas.so"
# Folders of the pip wheels that ship libcublas, under a site-packages folder: CUDA 13's single
# wheel layout first, then CUDA 12's per-library one.
WHEEL_FOLDERS = ("nvidia/cu13/lib", "nvidia/cublas/lib")
_STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
           13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}
CUBLAS_OP_N = 0
CUBLAS_POINTER_MODE_HOST = 0
CUBLAS_DEFAULT_MATH = 0  # no TF32: SGEMM in full float32, as the kernel it is compared with


def find_cublas(environ: Mapping[str, str] = os.environ, search: Iterable[str] | None = None) -> tuple[str | None, str]:
    """Where libcublas is: ``(path or loader name, how it was found)``, or ``(None, where it was looked for)``.

    Order: ``$CUDAGATE_CUBLAS`` (a file; when set, nothing else is tried), ``libcublas.so.*`` in
    :data:`WHEEL_FOLDERS` under each folder of ``search`` (default ``sys.path``, where pip's
    site-packages are), then ``ctypes.util.find_library("cublas")``.
    """
    given = environ.get("CUDAGATE_CUBLAS")
    if given:
        if Path(given).is_file():
            return given, "CUDAGATE_CUBLAS"
        return None, f"CUDAGATE_CUBLAS={given} is not a file"
    for root in (sys.path if search is None else search):
        for folder in WHEEL_FOLDERS:
            found = sorted(Path(root or ".", folder).glob("libcublas.so*"), key=lambda p: (len(p.name), p.name))
            if found:
                return str(found[0]), f"the pip wheel folder {Path(root, folder)}"
    name = ctypes.util.find_library("cublas")
    if name:
        return name, "the system's library path"
    return None, f"not in CUDAGATE_CUBLAS, {' or '.join(WHEEL_FOLDERS)} under site-packages, or the system's library path"


class _Cublas:
    """A cuBLAS handle on the worker's stream: the library found (:func:`find_cublas`) and loaded, each
    function of ``FUNCTIONS`` typed, pointer mode host (alpha and beta live in host memory) and the
    default math mode (no TF32)."""

    FUNCTIONS: dict[str, list] = {}

    def __init__(self, device):
        path, how = find_cublas()
        if path is None:
            raise LibraryUnavailable(f"cuBLAS not found ({how}): {CUBLAS_HINT}")
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise LibraryUnavailable(f"cuBLAS at {path} (found in {how}) does not load: {exc}; {CUBLAS_HINT}") from None
        self.lib, self.path = lib, path
        self.handle = ctypes.c_void_p()
        for fn, types in (("cublasCreate_v2", [ctypes.POINTER(ctypes.c_void_p)]),
                          ("cublasSetStream_v2", [ctypes.c_void_p, ctypes.c_void_p]),
                          ("cublasSetPointerMode_v2", [ctypes.c_void_p, ctypes.c_int]),
                          ("cublasSetMathMode", [ctypes.c_void_p, ctypes.c_int]), *self.FUNCTIONS.items()):
            function = getattr(lib, fn, None)
            if function is None:
                raise LibraryUnavailable(f"{path} has no {fn}: not a cuBLAS library this adapter can use; {CUBLAS_HINT}")
            function.argtypes, function.restype = types, ctypes.c_int
        self._check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2", LibraryUnavailable)
        self._check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(int(device.stream))), "cublasSetStream_v2")
        self._check(lib.cublasSetPointerMode_v2(self.handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode_v2")
        self._check(lib.cublasSetMathMode(self.handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")

    @staticmethod
    def _check(status: int, call: str, error: type[Exception] = LibraryCallError) -> None:
        if status:
            raise error(f"{call}: CUBLAS_STATUS_{_STATUS.get(status, status)}")


class CublasSgemm(_Cublas):
    """Row-major float32 C(m×n) = A(m×k)·B(k×n) with ``cublasSgemm_v2`` on the worker's stream.

    cuBLAS is column-major: the row-major buffers read as C^T (n×m), A^T (k×m) and B^T (n×k), so
    the call computes C^T = B^T·A^T: no transposes, m' = n, n' = m, B with ld n, A with ld k, C
    with ld n (alpha = 1, beta = 0).
    """

    FUNCTIONS = {"cublasSgemm_v2": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int]}

    def __init__(self, device):
        super().__init__(device)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def enqueue(self, pointers: Mapping[str, int], scalars: Mapping[str, int]) -> None:
        m, n, k = scalars["m"], scalars["n"], scalars["k"]
        self._check(self.lib.cublasSgemm_v2(self.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, ctypes.byref(self.alpha),
                                            pointers["b"], n, pointers["a"], k, ctypes.byref(self.beta),
                                            pointers["c"], n), "cublasSgemm_v2")


def _sgemm_fits(counts: Mapping[str, int], scalars: Mapping[str, int], names: Mapping[str, str]) -> str | None:
    m, n, k = scalars["m"], scalars["n"], scalars["k"]
    if not all(1 <= v <= INT32_MAX for v in (m, n, k)):
        return f"m, n, k = {m}, {n}, {k}: each must be 1 to {INT32_MAX}"
    for role, need in (("a", m * k), ("b", k * n), ("c", m * n)):
        if counts[role] < need:
            return (f"{role}: buffer {names[role]} holds {counts[role]} elements, the call reads or writes {need} "
                    f"(m={m}, n={n}, k={k})")
    return None


# -- library steps: a call that is part of the operation (``steps: - library: NAME``) -------------------

@dataclass(frozen=True)
class StepAdapter:
    """A library routine a kernel's ``steps:`` may call. Its buffers are named by role; its options are
    integer expressions (``"int"``), number expressions (``"number"``), booleans (``"bool"``) or one of a
    few words (a tuple of them), resolved per case by the client: the worker gets plain values."""

    label: str
    buffers: Mapping[str, bool]  # role -> written by the call
    options: Mapping[str, str | tuple[str, ...]]  # option -> its kind
    required: tuple[str, ...]  # options without a default
    types: Callable[[Mapping[str, str]], str | None]  # dtype per role -> why the call cannot take them, or None
    complete: Callable[[Mapping[str, object]], dict]  # resolved options -> every option, defaults filled in
    fits: Callable[[Mapping[str, int], Mapping[str, object]], str | None]  # elements per role, complete options
    load: Callable[[object], object]  # (harness Device) -> a call with enqueue(pointers, dtypes, options)


# cudaDataType_t of the matrices, and the compute type: float32 accumulation for every input type.
_CUDA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}
CUBLAS_OP_T = 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_I, _P, _L = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong


class CublasGemm(_Cublas):
    """C = alpha·op(A)·op(B) + beta·C with ``cublasGemmEx`` (``cublasGemmStridedBatchedEx`` for a
    batch), float32 accumulation (CUBLAS_COMPUTE_32F) whatever the matrices' type.

    A row-major operation is the column-major one on the transposed matrices: C^T = op(B)^T·op(A)^T,
    so the call swaps A and B, and m and n, and keeps each operand's transpose flag and leading
    dimension (a row-major matrix with row stride ld reads as its transpose, column-major with ld)."""

    FUNCTIONS = {
        "cublasGemmEx": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I],
        "cublasGemmStridedBatchedEx": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _L, _P, _I, _I, _L, _P, _P, _I, _I,
                                       _L, _I, _I, _I],
    }

    def enqueue(self, pointers: Mapping[str, int], dtypes: Mapping[str, str], options: Mapping[str, object]) -> None:
        o = options
        alpha, beta = ctypes.c_float(float(o["alpha"])), ctypes.c_float(float(o["beta"]))
        a = (pointers["a"], _CUDA_TYPES[dtypes["a"]], o["lda"], o["stride_a"], CUBLAS_OP_T if o["trans_a"] else CUBLAS_OP_N)
        b = (pointers["b"], _CUDA_TYPES[dtypes["b"]], o["ldb"], o["stride_b"], CUBLAS_OP_T if o["trans_b"] else CUBLAS_OP_N)
        m, n = o["m"], o["n"]
        if o["layout"] == "row":
            a, b, m, n = b, a, n, m
        c = (pointers["c"], _CUDA_TYPES[dtypes["c"]], o["ldc"], o["stride_c"])
        if o["batch"] == 1:
            self._check(self.lib.cublasGemmEx(
                self.handle, a[4], b[4], m, n, o["k"], ctypes.byref(alpha), a[0], a[1], a[2], b[0], b[1], b[2],
                ctypes.byref(beta), c[0], c[1], c[2], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx")
            return
        self._check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, a[4], b[4], m, n, o["k"], ctypes.byref(alpha), a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3],
            ctypes.byref(beta), c[0], c[1], c[2], c[3], o["batch"], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx")


def _gemm_types(dtypes: Mapping[str, str]) -> str | None:
    a, b, c = dtypes["a"], dtypes["b"], dtypes["c"]
    if a not in ("float32", "bfloat16", "float16") or b != a or c not in (a, "float32"):
        return (f"cublas_gemm multiplies float32, bfloat16 or float16 matrices, a and b of one type and c of "
                f"theirs or float32; here a is {a}, b is {b}, c is {c}")
    return None


def _stored(options: Mapping[str, object]) -> dict[str, tuple[int, int]]:
    """Each matrix as it lies in memory: (rows, columns) before any transpose."""
    m, n, k = options["m"], options["n"], options["k"]
    return {"a": (k, m) if options["trans_a"] else (m, k), "b": (n, k) if options["trans_b"] else (k, n), "c": (m, n)}


def _gemm_complete(given: Mapping[str, object]) -> dict:
    """Defaults: row-major, no transposes, alpha 1, beta 0, packed leading dimensions (a row's length
    row-major, a column's column-major), one matrix, and batch strides of one packed matrix each."""
    options = {"layout": "row", "trans_a": False, "trans_b": False, "alpha": 1.0, "beta": 0.0, "batch": 1, **given}
    row = options["layout"] == "row"
    for role, (rows, cols) in _stored(options).items():
        ld = options.setdefault(f"ld{role}", cols if row else rows)
        options.setdefault(f"stride_{role}", (rows if row else cols) * ld)
    return options


def _gemm_fits(counts: Mapping[str, int], options: Mapping[str, object]) -> str | None:
    m, n, k, batch = options["m"], options["n"], options["k"], options["batch"]
    if not all(1 <= v <= INT32_MAX for v in (m, n, k, batch)):
        return f"m, n, k, batch = {m}, {n}, {k}, {batch}: each must be 1 to {INT32_MAX}"
    row = options["layout"] == "row"
    for role, (rows, cols) in _stored(options).items():
        ld, stride = options[f"ld{role}"], options[f"stride_{role}"]
        least = cols if row else rows
        if not least <= ld <= INT32_MAX:
            return (f"ld{role} = {ld}: a {options['layout']}-major {rows}×{cols} {role} needs a leading dimension of "
                    f"{least} to {INT32_MAX}")
        span = (rows - 1) * ld + cols if row else (cols - 1) * ld + rows
        if batch > 1 and not (span <= stride if role == "c" else 0 <= stride):
            return (f"stride_{role} = {stride}: " + (f"the batch's matrices of c overlap (each spans {span} elements)"
                                                     if role == "c" else "a stride is 0 or more"))
        need = (batch - 1) * stride + span
        if counts[role] < need:
            return (f"{role}: the call reads or writes {need} elements (m={m}, n={n}, k={k}, ld{role}={ld}"
                    f"{f', batch={batch}, stride_{role}={stride}' if batch > 1 else ''}), the buffer holds {counts[role]}")
    return None


_GEMM_OPTIONS = {"m": "int", "n": "int", "k": "int", "layout": ("row", "col"), "trans_a": "bool", "trans_b": "bool",
                 "alpha": "number", "beta": "number", "lda": "int", "ldb": "int", "ldc": "int", "batch": "int",
                 "stride_a": "int", "stride_b": "int", "stride_c": "int"}

ADAPTERS: dict[str, Adapter | StepAdapter] = {
    "cublas_sgemm": Adapter(label="cuBLAS SGEMM", buffers={"a": ("float32", False), "b": ("float32", False),
                                                           "c": ("float32", True)},
                            scalars=("m", "n", "k"), load=CublasSgemm, fits=_sgemm_fits),
    "cublas_gemm": StepAdapter(label="cuBLAS GEMM", buffers={"a": False, "b": False, "c": True},
                               options=_GEMM_OPTIONS, required=("m", "n", "k"), types=_gemm_types,
                               complete=_gemm_complete, fits=_gemm_fits, load=CublasGemm),
}


def known(kind: type) -> list[str]:
    """The registered adapters of ``kind`` (:class:`Adapter`: library baselines; :class:`StepAdapter`:
    library steps), by name."""
    return sorted(name for name, adapter in ADAPTERS.items() if isinstance(adapter, kind))
# name -> "module:ATTRIBUTE" (JSON): the adapters a gate run's plugins add (pytest_cudagate.hookspecs),
# given to the worker process, which imports one when a request first names it.
ADAPTERS_ENV = "CUDAGATE_LIBRARY_ADAPTERS"


def register(name: str, where: str) -> None:
    """Add the :class:`Adapter` at ``where`` ("module:ATTRIBUTE", importable by this Python) to
    :data:`ADAPTERS` as ``name``; a name taken or an object that cannot be had raises
    LibraryUnavailable saying which."""
    module, _, attribute = where.partition(":")
    if name in ADAPTERS:
        raise LibraryUnavailable(f"library adapter {name!r} ({where}): the name is taken by {ADAPTERS[name].label}")
    try:
        adapter = getattr(importlib.import_module(module), attribute)
    except Exception as exc:  # whatever the module raises on import: it is not ours to crash on
        raise LibraryUnavailable(f"library adapter {name!r}: cannot import {where}: {type(exc).__name__}: {exc}") from None
    if not isinstance(adapter, (Adapter, StepAdapter)):
        raise LibraryUnavailable(f"library adapter {name!r}: {where} is a {type(adapter).__name__}, not a "
                                 "cudagate_harness.library.Adapter (a baseline) or StepAdapter (a step)")
    ADAPTERS[name] = adapter


# Only the harness worker imports what ADAPTERS_ENV names (:func:`read_plugin_adapters`): a client
# process (``cudagate run`` checking a request) never imports a module its environment names.
_plugin_adapters = False


def read_plugin_adapters() -> None:
    """Let :func:`lookup` import the adapters :data:`ADAPTERS_ENV` names (the worker, at its start)."""
    global _plugin_adapters
    _plugin_adapters = True


def lookup(name: str) -> Adapter | StepAdapter | str | None:
    """The adapter registered as ``name``, importing one a plugin added (:data:`ADAPTERS_ENV`) the first
    time it is named, in the worker only; None where no adapter has the name, a string saying why where
    it cannot be had."""
    if name in ADAPTERS or not _plugin_adapters:
        return ADAPTERS.get(name)
    try:
        added = json.loads(os.environ.get(ADAPTERS_ENV) or "{}")
    except ValueError:
        added = None
    if not (isinstance(added, dict) and all(isinstance(where, str) for where in added.values())):
        return (f"library adapter {name[:40]!r}: ${ADAPTERS_ENV} is not a JSON object of name to "
                '"module:ATTRIBUTE"; unset it (a gate run sets it for its worker from its plugins)')
    if name not in added:
        return None
    try:
        register(name, added[name])
    except LibraryUnavailable as exc:
        return str(exc)
    return ADAPTERS[name]


def bind(spec: LibrarySpec, device, loaded: dict[str, LibraryBaseline | str]) -> LibraryLaunch | str:
    """A request's ``library`` field bound to its adapter, loaded once per worker into ``loaded``
    (the baseline, or why it is unavailable); a string says why there is no baseline."""
    name = str(spec.adapter)
    adapter = lookup(name)
    if isinstance(adapter, str):
        return adapter
    if not isinstance(adapter, Adapter):
        return f"unknown library baseline adapter {name!r} (known: {', '.join(known(Adapter))})"
    args = dict(spec.args)
    missing = [role for role in adapter.roles if role not in args]
    if missing:
        return f"library baseline {name}: args name no parameter for {', '.join(missing)}"
    if name not in loaded:
        try:
            loaded[name] = adapter.load(device)
        except (LibraryUnavailable, LibraryCallError) as exc:
            loaded[name] = str(exc)
    baseline = loaded[name]
    return baseline if isinstance(baseline, str) else LibraryLaunch(adapter, args, baseline)
