"""Run compiled kernels on one case: allocate, poison, launch, validate, time, capture.

The order is fixed and reviewable: validation launch 1 (outputs poisoned with one pattern), the
warm-ups and timed launches, validation launch 2 (the other pattern). Both validation launches'
outputs go back to the client, so a kernel that is only right the first time, or only right
because memory still held an earlier result, fails.

Timing follows what the H200 taught us (shared/brief/h200-timing-notes.md): each timed launch
sits alone between its own event pair, after an L2 flush (cold) and after a random 0-3 empty
launches, because small kernels' cold timings alternate by 3-5% with their position in the queue;
for two kernels the order within every round is random too, so an A/A comparison is exchangeable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .driver import CudaError, Device
from .protocol import POISON_FIRST, POISON_SECOND, numpy_dtype, unwritten_mask

MAX_EVENTS_IN_FLIGHT = 256  # stays well under the ~1,100-command stream queue limit
DEFAULT_PAD_MAX = 3
ROTATION_BYTES = 256 << 20  # rotate through at most this much memory per case
MAX_COPIES = 4


def rotation_copies(signature: list[dict], case: dict, requested: int | None) -> int:
    """How many buffer copies timed launches rotate through: ``requested``, or as many as fit."""
    if requested:
        return int(requested)
    sizes = {p["name"]: numpy_dtype(p["dtype"]).itemsize for p in signature if p["kind"] == "buffer"}
    nbytes = sum(sizes[name] * int(spec["count"]) for name, spec in case["buffers"].items() if name in sizes)
    return max(1, min(MAX_COPIES, ROTATION_BYTES // max(nbytes, 1)))


class CaseInputError(ValueError):
    """Case data that does not match the signature (wrong dtype, count or missing file)."""


@dataclass
class Buffer:
    name: str
    dtype: np.dtype
    intent: str
    count: int
    host: np.ndarray | None  # the input (in/inout); None for pure outputs
    ptrs: list[int] = field(default_factory=list)  # one device copy per rotation slot
    pristine: int = 0  # device copy of an inout buffer's input, restored before every launch

    @property
    def ptr(self) -> int:
        return self.ptrs[0]

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


@dataclass
class Launchable:
    """A loaded kernel with the launch configuration it uses on this case."""

    function: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int

    @classmethod
    def of(cls, function, launch: dict) -> Launchable:
        return cls(function, tuple(int(v) for v in launch["grid"]), tuple(int(v) for v in launch["block"]),
                   int(launch.get("shared_bytes", 0)))


def pack_arguments(signature: list[dict], buffers: dict[str, Buffer], scalars: dict, slot: int = 0) -> tuple[np.ndarray, list]:
    """The ``kernelParams`` array: one pointer per parameter, each to that parameter's bytes.

    Returns the array and the storage it points into, which must stay alive until the launch.
    """
    storage: list[np.ndarray] = []
    for param in signature:
        if param["kind"] == "buffer":
            storage.append(np.array([buffers[param["name"]].ptrs[slot]], dtype=np.uint64))
        else:
            storage.append(np.array([scalars[param["name"]]], dtype=numpy_dtype(param["dtype"])))
    return np.array([item.ctypes.data for item in storage], dtype=np.uint64), storage


def load_buffers(signature: list[dict], case: dict, base: Path) -> dict[str, Buffer]:
    buffers = {}
    for param in signature:
        if param["kind"] != "buffer":
            continue
        name = param["name"]
        spec = case["buffers"].get(name)
        if spec is None:
            raise CaseInputError(f"case {case['name']!r} gives no size for buffer {name!r}")
        dtype = numpy_dtype(param["dtype"])
        host = None
        if param["intent"] in ("in", "inout"):
            if not spec.get("input"):
                raise CaseInputError(f"case {case['name']!r}: input buffer {name!r} has no data file")
            path = base / spec["input"]
            try:
                host = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:  # EOFError: an empty file
                raise CaseInputError(f"case {case['name']!r}: cannot read {path}: {exc}") from None
            if host.dtype != dtype:
                raise CaseInputError(f"case {case['name']!r}: {path} holds {host.dtype}, signature says {param['dtype']}")
            if host.size != spec["count"]:
                raise CaseInputError(f"case {case['name']!r}: {path} holds {host.size} elements, the size expression gives {spec['count']}")
            host = np.ascontiguousarray(host.reshape(-1))
        buffers[name] = Buffer(name, dtype, param["intent"], int(spec["count"]), host)
    return buffers


class CaseRun:
    """One case's buffers on one device, shared by every kernel launched on it.

    Timed launches rotate through ``copies`` copies of the buffers at different addresses: a cold
    small kernel's time depends on where its data sits (L2 slices, memory channels), so one fixed
    placement would bias a run's median in a way the next process, with other addresses, does not
    share. Use as a context manager: buffers are allocated on entry and always freed on exit.
    """

    def __init__(self, device: Device, signature: list[dict], case: dict, base: Path,
                 flush: Callable[[], None] | None = None, pad: Launchable | None = None, seed: int = 0,
                 copies: int = 1):
        self.device = device
        self.signature = signature
        self.case = case
        self.buffers = load_buffers(signature, case, base)
        self.flush = flush
        self.pad = pad
        self.rng = np.random.default_rng(seed)
        self.copies = max(1, copies)
        self.params: list[np.ndarray] = []
        self._storage: list = []
        self._slot = 0

    def __enter__(self) -> CaseRun:
        dev = self.device
        try:
            for buf in self.buffers.values():
                if buf.intent == "inout":
                    buf.pristine = dev.alloc(buf.nbytes)
                    dev.upload(buf.pristine, buf.host)
                for _ in range(self.copies):
                    buf.ptrs.append(dev.alloc(buf.nbytes))
                    if buf.intent == "in":
                        dev.upload(buf.ptrs[-1], buf.host)
        except BaseException:
            self.__exit__()
            raise
        for slot in range(self.copies):
            params, storage = pack_arguments(self.signature, self.buffers, self.case["scalars"], slot)
            self.params.append(params)
            self._storage.append(storage)
        return self

    def __exit__(self, *exc) -> None:
        for buf in self.buffers.values():
            for ptr in [*buf.ptrs, buf.pristine]:
                if ptr:
                    self.device.free(ptr)
            buf.ptrs, buf.pristine = [], 0

    def prepare(self, kernel: Launchable) -> None:
        if kernel.shared > 48 * 1024:  # above 48 KiB a kernel must opt in to dynamic shared memory
            self.device.allow_dynamic_shared(kernel.function, kernel.shared)

    def _restore(self, slot: int = 0) -> None:
        for buf in self.buffers.values():
            if buf.intent == "inout":
                self.device.copy(buf.ptrs[slot], buf.pristine, buf.nbytes)

    def _launch(self, kernel: Launchable, slot: int = 0) -> None:
        self.device.launch(kernel.function, kernel.grid, kernel.block, kernel.shared, self.params[slot])

    def validation_launch(self, kernel: Launchable, poison: int) -> dict[str, np.ndarray]:
        dev = self.device
        self._restore()
        for buf in self.buffers.values():
            if buf.intent == "out":
                dev.fill(buf.ptr, poison, buf.nbytes)
        self._launch(kernel)
        dev.synchronize()
        return {name: dev.download(buf.ptr, np.empty(buf.count, buf.dtype)) for name, buf in self.buffers.items()}

    def warm_up(self, kernels: list[Launchable], count: int, min_ms: float = 0.0) -> None:
        """``count`` launches of each kernel, then more until ``min_ms`` of wall time has passed.

        The time floor matters for µs kernels: ten launches are over before an idle GPU's clocks
        have ramped up, and run-to-run medians then differ by several percent.
        """
        start = time.perf_counter()
        launched = 0
        while launched < count or (time.perf_counter() - start) * 1000 < min_ms:
            for _ in range(max(count, 1) if launched < count else 64):
                slot = launched % self.copies
                for kernel in kernels:
                    self._restore(slot)
                    self._launch(kernel, slot)
                launched += 1
            self.device.synchronize()

    def time_rounds(self, kernels: list[Launchable], rounds: int, *, cold: bool, pad_max: int = DEFAULT_PAD_MAX,
                    batch: int = 1) -> tuple[list[list[float]], list[int]]:
        """Time ``rounds`` rounds; each round times every kernel once, in random order.

        Returns one sample list per kernel (ms per launch) and, per round, the index of the kernel
        that went first. ``batch`` > 1 (hot cache only) puts that many launches in one event pair
        for kernels too short for one pair to resolve.
        """
        if cold and batch > 1:
            raise ValueError("batching launches in one event pair needs hot-cache timing: a flush cannot sit between them")
        dev = self.device
        samples: list[list[float]] = [[] for _ in kernels]
        firsts: list[int] = []
        per_round = len(kernels)
        rounds_per_batch = max(1, MAX_EVENTS_IN_FLIGHT // per_round)
        pairs = [(dev.event(), dev.event()) for _ in range(min(rounds, rounds_per_batch) * per_round)]
        try:
            remaining = rounds
            while remaining:
                todo = min(remaining, rounds_per_batch)
                slots = []
                for _ in range(todo):
                    order = self.rng.permutation(per_round) if per_round > 1 else [0]
                    firsts.append(int(order[0]))
                    slot = self._slot % self.copies  # both kernels of a round use the same copy
                    self._slot += 1
                    for index in order:
                        start, end = pairs[len(slots)]
                        self._restore(slot)
                        if cold and self.flush:
                            self.flush()
                        for _ in range(int(self.rng.integers(0, pad_max + 1)) if self.pad else 0):
                            self._launch(self.pad)
                        dev.record(start)
                        for _ in range(batch):
                            self._launch(kernels[index], slot)
                        dev.record(end)
                        slots.append((int(index), start, end))
                dev.synchronize()
                for index, start, end in slots:
                    samples[index].append(dev.elapsed_ms(start, end) / batch)
                remaining -= todo
        finally:
            for start, end in pairs:
                dev.destroy_event(start)
                dev.destroy_event(end)
        return samples, firsts

    def outputs(self, first: dict, second: dict, output_dir: Path, prefix: str = "") -> dict:
        """Save outputs and report unwritten elements, launch-to-launch differences, input writes."""
        case_dir = output_dir / self.case["name"]
        case_dir.mkdir(parents=True, exist_ok=True)
        outputs, inputs_modified = {}, {}
        for name, buf in self.buffers.items():
            if buf.intent == "in":
                changed = max(_changed(first[name], buf.host), _changed(second[name], buf.host))
                if changed:
                    inputs_modified[name] = changed
                continue
            path = case_dir / f"{prefix}{name}.npy"
            np.save(path, first[name])
            differing = _changed(first[name], second[name])
            entry = {"path": str(path), "differing_second_launch": differing,
                     "unwritten": int(np.count_nonzero(unwritten_mask(first[name], second[name])))}
            if differing:
                entry["second_path"] = str(case_dir / f"{prefix}{name}.second.npy")
                np.save(entry["second_path"], second[name])
            outputs[name] = entry
        return {"outputs": outputs, "inputs_modified": inputs_modified}


def _changed(a: np.ndarray, b: np.ndarray) -> int:
    """Elements whose bytes differ (NaN-safe, -0.0 differs from 0.0)."""
    width = a.dtype.itemsize
    return int(np.count_nonzero(np.any(a.view(np.uint8).reshape(-1, width) != b.view(np.uint8).reshape(-1, width), axis=1)))


def error_body(exc: Exception) -> dict:
    if isinstance(exc, CaseInputError):
        return {"status": "error", "error": {"kind": "input", "code": "BAD_CASE_DATA", "message": str(exc)}}
    kind = "fault" if exc.sticky else ("oom" if exc.code == "CUDA_ERROR_OUT_OF_MEMORY" else "launch")
    return {"status": "error", "error": {"kind": kind, "code": exc.code, "message": str(exc)}}


def run_case(device: Device, kernel: Launchable, signature, case, *, base: Path, timing: dict | None,
             output_dir: Path, flush=None, pad: Launchable | None = None) -> dict:
    """Validate ``kernel`` on one case (and time it if ``timing``); errors become an error body."""
    start = time.perf_counter()
    try:
        copies = rotation_copies(signature, case, timing.get("rotate")) if timing else 1
        with CaseRun(device, signature, case, base, flush, pad, seed=int((timing or {}).get("seed", 0)),
                     copies=copies) as run:
            run.prepare(kernel)
            first = run.validation_launch(kernel, POISON_FIRST)
            body = {"status": "ok"}
            if timing:
                run.warm_up([kernel], int(timing["warmup"]), float(timing.get("warmup_ms", 0)))
                samples, _ = run.time_rounds([kernel], int(timing["repeat"]), cold=timing.get("cache", "cold") == "cold",
                                             pad_max=int(timing.get("pad_max", DEFAULT_PAD_MAX)),
                                             batch=int(timing.get("batch", 1)))
                body["timing"] = {"samples_ms": samples[0], "warmup": int(timing["warmup"]),
                                  "repeat": int(timing["repeat"]), "cache": timing.get("cache", "cold")}
            second = run.validation_launch(kernel, POISON_SECOND)
            body.update(run.outputs(first, second, output_dir))
    except (CaseInputError, CudaError) as exc:
        body = error_body(exc)
    body["case"] = case["name"]
    body["seconds"] = time.perf_counter() - start
    return body
