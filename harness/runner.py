"""Run one compiled kernel on one case: allocate, poison, launch, validate, time, capture.

The order is fixed and reviewable: validation launch 1 (outputs poisoned with one pattern), the
warm-ups and timed launches, validation launch 2 (the other pattern). Both validation launches'
outputs go back to the client, so a kernel that is only right the first time, or only right
because memory still held an earlier result, fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .driver import CudaError, Device
from .protocol import POISON_FIRST, POISON_SECOND, numpy_dtype, unwritten_mask

MAX_EVENTS_IN_FLIGHT = 256  # stays well under the ~1,100-command stream queue limit


class CaseInputError(ValueError):
    """Case data that does not match the signature (wrong dtype, count or missing file)."""


@dataclass
class Buffer:
    name: str
    dtype: np.dtype
    intent: str
    count: int
    host: np.ndarray | None  # the input (in/inout); None for pure outputs
    ptr: int = 0
    pristine: int = 0  # device copy of an inout buffer's input, restored before every launch

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def pack_arguments(signature: list[dict], buffers: dict[str, Buffer], scalars: dict) -> tuple[np.ndarray, list]:
    """The ``kernelParams`` array: one pointer per parameter, each to that parameter's bytes.

    Returns the array and the storage it points into, which must stay alive until the launch.
    """
    storage: list[np.ndarray] = []
    for param in signature:
        if param["kind"] == "buffer":
            storage.append(np.array([buffers[param["name"]].ptr], dtype=np.uint64))
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
            except (OSError, ValueError) as exc:
                raise CaseInputError(f"case {case['name']!r}: cannot read {path}: {exc}") from None
            if host.dtype != dtype:
                raise CaseInputError(f"case {case['name']!r}: {path} holds {host.dtype}, signature says {param['dtype']}")
            if host.size != spec["count"]:
                raise CaseInputError(f"case {case['name']!r}: {path} holds {host.size} elements, the size expression gives {spec['count']}")
            host = np.ascontiguousarray(host.reshape(-1))
        buffers[name] = Buffer(name, dtype, param["intent"], int(spec["count"]), host)
    return buffers


class CaseRun:
    """Everything for one case on one device; ``run()`` returns the response body."""

    def __init__(self, device: Device, function, signature: list[dict], case: dict, base: Path,
                 flush: Callable[[], None] | None):
        self.device = device
        self.function = function
        self.signature = signature
        self.case = case
        self.buffers = load_buffers(signature, case, base)
        self.flush = flush
        launch = case["launch"]
        self.grid = tuple(int(v) for v in launch["grid"])
        self.block = tuple(int(v) for v in launch["block"])
        self.shared = int(launch.get("shared_bytes", 0))

    def run(self, timing: dict | None, output_dir: Path) -> dict:
        dev = self.device
        try:
            for buf in self.buffers.values():
                buf.ptr = dev.alloc(buf.nbytes)
                if buf.intent == "inout":
                    buf.pristine = dev.alloc(buf.nbytes)
                    dev.upload(buf.pristine, buf.host)
                elif buf.intent == "in":
                    dev.upload(buf.ptr, buf.host)
            if self.shared > 48 * 1024:
                dev.allow_dynamic_shared(self.function, self.shared)
            self.params, self._storage = pack_arguments(self.signature, self.buffers, self.case["scalars"])
            first = self._validation_launch(POISON_FIRST)
            samples = self._time(timing) if timing else None
            second = self._validation_launch(POISON_SECOND)
            return self._result(first, second, samples, timing, output_dir)
        finally:
            for buf in self.buffers.values():
                for ptr in (buf.ptr, buf.pristine):
                    if ptr:
                        dev.free(ptr)

    def _restore(self) -> None:
        for buf in self.buffers.values():
            if buf.intent == "inout":
                self.device.copy(buf.ptr, buf.pristine, buf.nbytes)

    def _launch(self) -> None:
        self.device.launch(self.function, self.grid, self.block, self.shared, self.params)

    def _validation_launch(self, poison: int) -> dict[str, np.ndarray]:
        dev = self.device
        self._restore()
        for buf in self.buffers.values():
            if buf.intent == "out":
                dev.fill(buf.ptr, poison, buf.nbytes)
        self._launch()
        dev.synchronize()
        return {name: dev.download(buf.ptr, np.empty(buf.count, buf.dtype))
                for name, buf in self.buffers.items()}

    def _time(self, timing: dict) -> list[float]:
        dev = self.device
        for _ in range(int(timing["warmup"])):
            self._restore()
            self._launch()
        cold = timing.get("cache", "cold") == "cold"
        remaining = int(timing["repeat"])
        pairs = [(dev.event(), dev.event()) for _ in range(min(remaining, MAX_EVENTS_IN_FLIGHT))]
        samples: list[float] = []
        try:
            while remaining:
                batch = pairs[: min(remaining, len(pairs))]
                for start, end in batch:
                    self._restore()
                    if cold and self.flush:
                        self.flush()
                    dev.record(start)
                    self._launch()
                    dev.record(end)
                dev.synchronize()
                samples.extend(dev.elapsed_ms(start, end) for start, end in batch)
                remaining -= len(batch)
        finally:
            for start, end in pairs:
                dev.destroy_event(start)
                dev.destroy_event(end)
        return samples

    def _result(self, first, second, samples, timing, output_dir: Path) -> dict:
        case_dir = output_dir / self.case["name"]
        case_dir.mkdir(parents=True, exist_ok=True)
        outputs, inputs_modified = {}, {}
        for name, buf in self.buffers.items():
            if buf.intent == "in":
                changed = int(np.count_nonzero(first[name].view(np.uint8) != buf.host.view(np.uint8))
                              or np.count_nonzero(second[name].view(np.uint8) != buf.host.view(np.uint8)))
                if changed:
                    inputs_modified[name] = changed
                continue
            path = case_dir / f"{name}.npy"
            np.save(path, first[name])
            differing = int(np.count_nonzero(np.any(
                first[name].view(np.uint8).reshape(buf.count, -1) != second[name].view(np.uint8).reshape(buf.count, -1), axis=1)))
            entry = {"path": str(path), "differing_second_launch": differing,
                     "unwritten": int(np.count_nonzero(unwritten_mask(first[name], second[name])))}
            if differing:
                entry["second_path"] = str(case_dir / f"{name}.second.npy")
                np.save(entry["second_path"], second[name])
            outputs[name] = entry
        body = {"status": "ok", "outputs": outputs, "inputs_modified": inputs_modified}
        if samples is not None:
            body["timing"] = {"samples_ms": samples, "warmup": int(timing["warmup"]),
                              "repeat": int(timing["repeat"]), "cache": timing.get("cache", "cold")}
        return body


def run_case(device: Device, function, signature, case, *, base: Path, timing, output_dir: Path, flush) -> dict:
    """Run one case; a CUDA or input error becomes an error body instead of an exception."""
    start = time.perf_counter()
    try:
        body = CaseRun(device, function, signature, case, base, flush).run(timing, output_dir)
    except CaseInputError as exc:
        body = {"status": "error", "error": {"kind": "input", "code": "BAD_CASE_DATA", "message": str(exc)}}
    except CudaError as exc:
        kind = "fault" if exc.sticky else ("oom" if exc.code == "CUDA_ERROR_OUT_OF_MEMORY" else "launch")
        body = {"status": "error", "error": {"kind": kind, "code": exc.code, "message": str(exc)}}
    body["case"] = case["name"]
    body["seconds"] = time.perf_counter() - start
    return body
