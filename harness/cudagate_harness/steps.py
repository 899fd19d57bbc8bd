"""The steps of an operation that are not kernel launches: a memset, a copy and a library call.

A kernel given as ``steps:`` may set a buffer to a value, copy one buffer into another or call a
library routine between its launches. Each is enqueued on the worker's stream, on the same copy of
the buffers as the launches around it, so the operation is launched, timed (one event pair around
all its steps) and checked as one unit, and compute-sanitizer's run replays it whole.

On the wire (a case's ``launch`` list, resolved by the client) a step is one of:

- ``{"memset": {"buffer": NAME, "bits": WORD}}``: every element of the buffer set to the element
  whose bits are ``WORD`` (the client encodes the value for the buffer's type);
- ``{"copy": {"from": NAME, "to": NAME, "count": N}}``: the first ``N`` elements;
- ``{"library": ADAPTER, "args": {ROLE: NAME}, "options": {...}}``: a registered
  :class:`~cudagate_harness.library.StepAdapter` with every option resolved to a plain value.

:func:`step_problems` refuses what could fault or write an input before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .driver import CudaError
from .library import ADAPTERS, LibraryCallError, LibraryUnavailable, StepAdapter, known, lookup
from .messages import CopyStep, LibraryStep, MemsetStep
from .protocol import dtype_name, numpy_dtype

KINDS = ("memset", "copy", "library")
FLOAT32_MAX = float(np.finfo(np.float32).max)


def kind_of(step) -> str:
    """``memset``, ``copy``, ``library`` or ``entry`` (a kernel launch)."""
    found = [k for k in KINDS if isinstance(step, dict) and k in step]
    return found[0] if len(found) == 1 and "entry" not in step else ("entry" if not found else "mixed")


def step_problems(at: str, step: dict, params: Mapping[str, dict], counts: Mapping[str, int]) -> list[str]:
    """Why a non-launch step (``at`` names it) cannot run on a case: ``params`` the signature's
    entries by name, ``counts`` the case's buffers' element counts. Empty when it can."""
    kind = kind_of(step)
    if kind == "mixed":
        return [f"{at}: a step is one of a launch (entry), memset, copy or library call"]
    body = step[kind]

    def buffer(name, writes: bool) -> tuple[dict | None, str | None]:
        param = params.get(name) if isinstance(name, str) else None
        if param is None or param.get("kind") != "buffer" or name not in counts:
            return None, f"{at}: {str(name)[:80]!r} is not a buffer of the signature"
        if writes and param.get("intent") == "in":
            return None, f"{at}: it writes {name}, an input (inputs stay unchanged)"
        return param, None

    if kind == "memset":
        param, problem = buffer(body.get("buffer") if isinstance(body, dict) else None, True)
        if problem:
            return [problem]
        bits, width = body.get("bits"), numpy_dtype(param["dtype"]).itemsize
        if type(bits) is not int or not 0 <= bits < 1 << (8 * width):
            return [f"{at}: memset bits must be an integer of {8 * width} bits (one {param['dtype']} element)"]
        return []
    if kind == "copy":
        if not isinstance(body, dict):
            return [f"{at}: copy must be an object with from, to and count"]
        source, problem = buffer(body.get("from"), False)
        target, other = buffer(body.get("to"), True)
        if problem or other:
            return [problem or other]
        if source["dtype"] != target["dtype"]:
            return [f"{at}: copy from {body['from']} ({source['dtype']}) to {body['to']} ({target['dtype']})"]
        count = body.get("count")
        if type(count) is not int or not 0 <= count <= min(counts[body["from"]], counts[body["to"]]):
            return [f"{at}: copy count must be an integer from 0 to the smaller buffer's element count"]
        return []
    adapter = lookup(body) if isinstance(body, str) else None
    if isinstance(adapter, str):  # a plugin's adapter the worker cannot import
        return [f"{at}: {adapter}"]
    if not isinstance(adapter, StepAdapter):
        return [f"{at}: unknown library step adapter {str(body)[:40]!r} (known: {', '.join(known(StepAdapter))})"]
    args, options = step.get("args"), step.get("options")
    if not (isinstance(args, dict) and set(args) == set(adapter.buffers)):
        return [f"{at}: args must map {', '.join(adapter.buffers)} to buffers"]
    dtypes = {}
    for role, writes in adapter.buffers.items():
        param, problem = buffer(args[role], writes)
        if problem:
            return [problem]
        dtypes[role] = param["dtype"]
    problem = adapter.types(dtypes)
    if problem:
        return [f"{at}: {problem}"]
    if not (isinstance(options, dict) and set(options) == set(adapter.options)
            and all(_fits_kind(options[name], kind) for name, kind in adapter.options.items())):
        return [f"{at}: options must give every option of {body} as a plain value (a number finite, within float32)"]
    problem = adapter.fits({role: counts[args[role]] for role in adapter.buffers}, options)
    return [f"{at}: {problem}"] if problem else []


def _fits_kind(value, kind) -> bool:
    if kind == "int":
        return type(value) is int
    if kind == "number":  # finite and within float32, as the library is given it (no OverflowError, inf or NaN)
        return type(value) in (int, float) and abs(value) <= FLOAT32_MAX
    if kind == "bool":
        return type(value) is bool
    return value in kind


@dataclass
class Memset:
    buffer: str
    bits: int

    def enqueue(self, device, buffers, slot: int) -> None:
        buf = buffers[self.buffer]
        device.set_elements(buf.ptrs[slot], self.bits, buf.dtype.itemsize, buf.count)


@dataclass
class Copy:
    source: str
    target: str
    count: int

    def enqueue(self, device, buffers, slot: int) -> None:
        source, target = buffers[self.source], buffers[self.target]
        device.copy(target.ptrs[slot], source.ptrs[slot], self.count * source.dtype.itemsize)


@dataclass
class LibraryCall:
    """A library step: the adapter's call is loaded on first use, once per worker (``loaded``), so a
    library that is missing fails the cases that need it, with its hint, and nothing else."""

    adapter: str
    args: dict[str, str]  # role -> buffer
    options: dict
    loaded: dict  # adapter name -> its call, or why it cannot be made (the worker's, shared)

    def enqueue(self, device, buffers, slot: int) -> None:
        adapter = ADAPTERS[self.adapter]
        if self.adapter not in self.loaded:
            try:
                self.loaded[self.adapter] = adapter.load(device)
            except (LibraryUnavailable, LibraryCallError) as exc:
                self.loaded[self.adapter] = str(exc)
        call = self.loaded[self.adapter]
        if isinstance(call, str):
            raise CudaError("LIBRARY_UNAVAILABLE", f"library step {self.adapter}", call)
        pointers = {role: buffers[name].ptrs[slot] for role, name in self.args.items()}
        dtypes = {role: dtype_name(buffers[name].dtype) for role, name in self.args.items()}
        try:
            call.enqueue(pointers, dtypes, self.options)
        except LibraryCallError as exc:
            raise CudaError("LIBRARY_CALL_FAILED", f"library step {self.adapter}", str(exc)) from None


def build(step: MemsetStep | CopyStep | LibraryStep, loaded: dict):
    """The runnable form of a non-launch step of a request :func:`step_problems` accepted."""
    if isinstance(step, MemsetStep):
        return Memset(step.memset.buffer, step.memset.bits)
    if isinstance(step, CopyStep):
        return Copy(step.copy.from_, step.copy.to, step.copy.count)
    return LibraryCall(step.library, dict(step.args), dict(step.options), loaded)
