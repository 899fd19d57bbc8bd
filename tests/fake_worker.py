"""The CPU tests' one fake worker: :class:`FakeWorker` implements the same
:class:`~pytest_cudagate.worker.client.Worker` Protocol as the real ``HarnessClient``, running the
real harness ``Worker`` in this process on a simulated GPU.

``FakeDevice`` has the methods of :class:`cudagate_harness.driver.Device` the runner and worker
use; launches run a Python function at once, so the whole run/compare flow (poison, guard zones,
scrub, rotation, timed-output checks, fresh inputs) is exercised without CUDA. A kernel body gets
a :class:`Launch` with its arguments by name and views of device memory; writing outside an
allocation is an illegal address (sticky), as on a GPU. Each launch advances the device clock by
10 µs; a body may add more (``launch.device.clock += ...``) to look slower.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cudagate_harness import digest
from cudagate_harness.compiler import check_options
from cudagate_harness.driver import CudaError
from cudagate_harness.messages import Kernel as HarnessKernel, to_json
from cudagate_harness.protocol import numpy_dtype
from cudagate_harness.worker import Worker
from pytest_cudagate import session
from pytest_cudagate.worker import spawn
from pytest_cudagate.worker.client import CompareResult, RunResult, reply_body

LIMITS = {
    "MAX_THREADS_PER_BLOCK": 1024, "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024, "MAX_BLOCK_DIM_Z": 64,
    "MAX_GRID_DIM_X": 2**31 - 1, "MAX_GRID_DIM_Y": 65535, "MAX_GRID_DIM_Z": 65535,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448, "COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0,
    "MULTIPROCESSOR_COUNT": 4, "L2_CACHE_SIZE": 1 << 16, "WARP_SIZE": 32,
}


@dataclass
class FakeKernel:
    """A kernel: ``body(launch)``; ``params`` are the signature entries (harness protocol form)."""

    body: object
    params: list[dict]
    static_shared: int = 0
    max_threads: int = 1024
    registers: int = 32
    state: dict = field(default_factory=dict)  # a kernel's "device globals": survive launches


class Launch:
    def __init__(self, device: FakeDevice, kernel: FakeKernel, args: dict, grid, block, shared):
        self.device, self.kernel, self.args = device, kernel, args
        self.grid, self.block, self.shared = grid, block, shared

    @property
    def state(self) -> dict:
        return self.kernel.state

    def array(self, name: str, dtype, count: int) -> np.ndarray:
        """A writable view of ``count`` elements at buffer argument ``name``."""
        return self.device.view(self.args[name], np.dtype(dtype), count)

    def at(self, name: str, dtype, offset_elements: int, count: int) -> np.ndarray:
        itemsize = np.dtype(dtype).itemsize
        return self.device.view(self.args[name] + offset_elements * itemsize, np.dtype(dtype), count)


class _Event:
    def __init__(self):
        self.t = 0.0


class FakeDevice:
    def __init__(self, ordinal: int = 0):
        self.ordinal = ordinal
        self._bases: list[int] = []
        self._memory: dict[int, np.ndarray] = {}
        self._next = 0x7F0000000000
        self.sticky: CudaError | None = None
        self.clock = 0.0
        self.shared_word = 0  # what "uninitialised" shared memory holds right now
        self.launches = 0
        self.holds = self.released = 0  # host-released holds of the stream (Device.hold / release)
        self.holdable = True  # Device.can_hold: False plays a driver without stream memory operations
        self.holding = False
        self.behind_hold = self.most_behind_hold = 0  # launches enqueued behind the current hold, and the most
        self.flushed = False  # a memset of 1 MiB or more (the L2 flush) happened; kernels may clear it

    # -- like Device ----------------------------------------------------------------------------
    def attribute(self, name: str) -> int:
        return LIMITS[name]

    @property
    def arch(self) -> str:
        return "sm_90"

    def describe(self) -> dict:
        return {"ordinal": self.ordinal, "name": "Fake GPU", "arch": "sm_90", "compute_capability": "9.0",
                "sm_count": LIMITS["MULTIPROCESSOR_COUNT"], "l2_bytes": LIMITS["L2_CACHE_SIZE"],
                "memory_total_bytes": 1 << 34, "max_threads_per_block": 1024,
                "max_shared_per_block_optin": LIMITS["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"],
                "warp_size": LIMITS["WARP_SIZE"], "cuda_driver_version": "13.0", "pci_bus_id": "0000:00:00.0",
                "uuid": "GPU-00000000-0000-0000-0000-000000000000"}

    def _check(self):
        if self.sticky is not None:
            raise self.sticky

    def alloc(self, nbytes: int) -> int:
        self._check()
        base = self._next
        size = max(int(nbytes), 1)
        self._memory[base] = np.full(size, 0x3C, dtype=np.uint8)  # "leftover" bytes, never zero
        bisect.insort(self._bases, base)
        self._next += ((size + 511) // 512) * 512 + (1 << 20)  # a gap: past it is an illegal address
        return base

    def free(self, ptr: int) -> None:
        if ptr in self._memory:
            del self._memory[ptr]
            self._bases.remove(ptr)

    def view(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        i = bisect.bisect_right(self._bases, ptr) - 1
        nbytes = int(count) * dtype.itemsize
        if i < 0:
            raise self._fault(ptr)
        base = self._bases[i]
        mem = self._memory[base]
        offset = ptr - base
        if offset < 0 or offset + nbytes > mem.size:
            raise self._fault(ptr)
        return mem[offset:offset + nbytes].view(dtype)

    def _fault(self, ptr: int) -> CudaError:
        self.sticky = CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize", f"address {ptr:#x}")
        return self.sticky

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._check()
        array = np.ascontiguousarray(array)
        self.view(ptr, np.dtype(np.uint8), array.nbytes)[:] = array.reshape(-1).view(np.uint8)

    def download(self, ptr: int, array: np.ndarray) -> np.ndarray:
        self._check()
        array.reshape(-1).view(np.uint8)[:] = self.view(ptr, np.dtype(np.uint8), array.nbytes)
        return array

    def pinned(self, count: int) -> np.ndarray:
        return np.zeros(max(1, count), np.uint64)

    def free_pinned(self, array: np.ndarray) -> None:
        pass

    def download_async(self, ptr: int, array: np.ndarray) -> None:
        self.download(ptr, array)

    def fill(self, ptr: int, byte: int, nbytes: int) -> None:
        self._check()
        if nbytes:
            self.view(ptr, np.dtype(np.uint8), nbytes)[:] = byte
            self.flushed |= nbytes >= 1 << 20

    def fill2d(self, ptr: int, pitch: int, byte: int, width: int, height: int) -> None:
        self._check()
        if width and height:
            rows = self.view(ptr, np.dtype(np.uint8), pitch * (height - 1) + width)
            for row in range(height):
                rows[row * pitch:row * pitch + width] = byte
    def set_elements(self, ptr: int, bits: int, itemsize: int, count: int) -> None:
        self._check()
        words = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
        self.view(ptr, np.dtype(words), count)[:] = bits

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._check()
        if nbytes:
            self.view(dst, np.dtype(np.uint8), nbytes)[:] = self.view(src, np.dtype(np.uint8), nbytes)

    def synchronize(self) -> None:
        self._check()

    def synchronize_all(self) -> None:
        self._check()

    def allow_dynamic_shared(self, function, nbytes: int) -> None:
        if nbytes > LIMITS["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"]:
            raise CudaError("CUDA_ERROR_INVALID_VALUE", "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")

    def function_attribute(self, function: FakeKernel, name: str) -> int:
        return {"SHARED_SIZE_BYTES": function.static_shared, "MAX_THREADS_PER_BLOCK": function.max_threads,
                "NUM_REGS": function.registers}[name]

    def launch(self, function: FakeKernel, grid, block, shared_bytes: int, params: np.ndarray) -> None:
        self._check()
        threads = block[0] * block[1] * block[2]
        if threads > min(1024, function.max_threads):
            raise CudaError("CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel")
        args = {}
        for i, param in enumerate(function.params):
            address = int(params[i])
            if param["kind"] == "buffer":
                args[param["name"]] = ctypes.c_uint64.from_address(address).value
            else:
                dtype = numpy_dtype(param["dtype"])
                args[param["name"]] = np.frombuffer(ctypes.string_at(address, dtype.itemsize), dtype)[0].item()
        self.launches += 1
        if self.holding:  # a real driver blocks the host once about a thousand launches wait behind a hold
            self.behind_hold += 1
            self.most_behind_hold = max(self.most_behind_hold, self.behind_hold)
        self.clock += 0.01
        try:
            function.body(Launch(self, function, args, tuple(grid), tuple(block), shared_bytes))
        except CudaError:
            pass  # a fault: sticky, reported at the next synchronisation like a real one
        if function.params:  # any launch but the empty pad kernel: the next one sees no flush before it
            self.flushed = False

    # -- a host-released hold: the fake stream runs at once, so only the count is kept -------------
    def hold(self) -> None:
        self.holds += 1
        self.holding, self.behind_hold = True, 0

    def release(self) -> None:
        self.released += 1
        self.holding = False

    def can_hold(self) -> bool:
        return self.holdable

    # -- events -----------------------------------------------------------------------------------
    def event(self):
        return _Event()

    def record(self, event) -> None:
        event.t = self.clock

    def elapsed_ms(self, start, end) -> float:
        return end.t - start.t

    def destroy_event(self, event) -> None:
        pass


# -- a worker on the fake device ----------------------------------------------------------------------
class FakeCompileResult:
    def __init__(self, entry: str, arch: str):
        self.ok, self.key, self.log, self.arch, self.entry = True, entry, "", arch, entry

    def to_json(self) -> dict:
        return {"ok": True, "arch": self.arch, "key": self.key, "cache_hit": True, "seconds": 0.0, "log": "",
                "lowered_name": self.entry, "resources": {}}


def scrub_kernel() -> FakeKernel:
    def body(launch: Launch) -> None:
        launch.device.shared_word = launch.args["pattern"]

    return FakeKernel(body, [{"name": "pattern", "kind": "scalar", "dtype": "uint32"},
                             {"name": "words", "kind": "scalar", "dtype": "uint32"}])


def digest_kernel() -> FakeKernel:
    """``cudagate_digest``, computed by the numpy definition the CUDA source is tested against."""
    def body(launch: Launch) -> None:
        data = launch.device.view(launch.args["data"], np.dtype(np.uint8), launch.args["nbytes"])
        out = launch.array("out", np.uint64, 1)
        out[0] = (int(out[0]) + digest.digest(data, launch.args["key"])) & digest.MASK

    return FakeKernel(body, [{"name": "data", "kind": "buffer"}, {"name": "nbytes", "kind": "scalar", "dtype": "uint64"},
                             {"name": "key", "kind": "scalar", "dtype": "uint64"}, {"name": "out", "kind": "buffer"}])


Kernels = dict[str, FakeKernel] | Callable[[dict], FakeKernel]

# The signature of the helpers' `scale` suite (y = 2 * x, rows × cols float32), in protocol form.
SCALE_PARAMS = [{"name": "x", "kind": "buffer", "dtype": "float32", "intent": "in"},
                {"name": "y", "kind": "buffer", "dtype": "float32", "intent": "out"},
                {"name": "rows", "kind": "scalar", "dtype": "int32"}, {"name": "cols", "kind": "scalar", "dtype": "int32"}]


def scale_xy(launch: Launch):
    """A `scale` kernel's x and y as arrays, and their element count."""
    n = launch.args["rows"] * launch.args["cols"]
    return launch.array("x", np.float32, n), launch.array("y", np.float32, n), n


def honest(launch: Launch) -> None:
    x, y, _ = scale_xy(launch)
    y[:] = 2 * x


def scale_kernels(body=honest, entry: str = "scale2") -> dict[str, FakeKernel]:
    """The `scale` suite's kernel entry compiled to ``body``."""
    return {entry: FakeKernel(body, SCALE_PARAMS)}


def make_worker(kernels: Kernels, device: FakeDevice | None = None, emit=None, source=None,
                state: Callable[[], dict] | None = None, clock: Callable[[], int | None] | None = None) -> Worker:
    """A real :class:`Worker` on a :class:`FakeDevice`; a kernel spec compiles to ``kernels[entry]``
    (or ``kernels(spec)``, which may read the source). ``state``: the worker's NVML view (none: {});
    ``clock``: its SM clock reading before a warm-up (none: no reading)."""
    builtin = {"cudagate_pad": FakeKernel(lambda launch: None, []), "cudagate_scrub": scrub_kernel(),
               digest.ENTRY: digest_kernel()}

    class FakeDeviceWorker(Worker):
        def function_for(self, kernel: HarnessKernel, arch: str):
            check_options(list(kernel.options))  # compile_kernel's refusals, without NVRTC
            entry = kernel.entry
            function = builtin.get(entry) or (kernels(to_json(kernel)) if callable(kernels) else kernels[entry])
            return FakeCompileResult(entry, arch), function

        def state(self) -> dict:
            return state() if state is not None else {}

        def sm_clock(self) -> int | None:
            return clock() if clock is not None else None

    return FakeDeviceWorker(device or FakeDevice(), emit or (lambda message: None), source or iter(()))


class FakeWorker:
    """A :class:`~pytest_cudagate.worker.client.Worker` over the real harness worker on a
    :class:`FakeDevice`, in this process; it records every request it answers.

    A sticky fault ends the worker (as a real one exits); the next request gets a fresh one.
    """

    def __init__(self, kernels: Kernels, *, timeout_s: float = 60.0, env: dict | None = None,
                 state: Callable[[], dict] | None = None):
        self.kernels = kernels
        self.state = state
        self.timeout_s = timeout_s
        self.env = env
        self.worker: Worker | None = None
        self.hello: dict | None = None
        self.restarts = 0
        self.start_seconds = 0.0  # it starts at once
        self.requests: list[dict] = []
        self.spawned = False  # spawn() was called: the plugin's early start took this worker
        self.closed = False

    @property
    def device(self) -> dict:
        return (self.hello or {}).get("device", {})

    def spawn(self) -> None:
        self.spawned = True

    def start(self) -> dict:
        self.hello = {"type": "hello", "protocol": 1, "ok": True, "pid": os.getpid(), "device": FakeDevice().describe(),
                      "identity": {"driver_version": "580.00"}, "nvrtc_version": "13.0", "cuda_bindings_version": "13.0",
                      "timing_hold": True}
        return self.hello

    def close(self) -> None:
        self.closed = True

    def _worker(self, lines: list) -> Worker:
        if self.worker is None:
            self.worker = make_worker(self.kernels, state=self.state)
        self.worker.emit = lines.append
        return self.worker

    def _handle(self, request: dict, lines: list, source) -> None:
        self.requests.append(request)
        worker = self._worker(lines)
        worker.source = source
        try:
            worker.handle(json.loads(json.dumps(request)))
        except SystemExit:
            self.worker, self.restarts = None, self.restarts + 1
        for line in lines:
            if line["type"] == "error":
                raise RuntimeError(f"harness worker rejected the request: {line['message']}")

    def run(self, request: dict) -> RunResult:
        lines: list = []
        self._handle(request, lines, iter(()))
        result = RunResult(compile={})
        for line in lines:
            if line["type"] == "compile":
                result.compile = reply_body(line)
            elif line["type"] == "case":
                result.cases[line["case"]] = reply_body(line)
        return result

    def compare(self, request: dict, decide) -> CompareResult:
        result = CompareResult()
        lines: list = []

        def replies():
            while True:
                chunk = next(line for line in reversed(lines) if line["type"] == "chunk")
                result.chunks.append(chunk)
                rounds = decide(chunk)
                yield json.dumps({"op": "more", "rounds": rounds} if rounds > 0 else {"op": "stop"})

        self._handle(request, lines, replies())
        for line in lines:
            if line["type"] == "compile":
                result.compile[line.get("role", "current")] = reply_body(line)
            elif line["type"] == "case":
                result.body = reply_body(line)
        return result


def install(monkeypatch, tmp_path: Path, kernels: Kernels) -> list[FakeWorker]:
    """Make :func:`pytest_cudagate.session.open_worker` start :class:`FakeWorker` on ``kernels``
    (GPU locks under ``tmp_path``); returns every worker started."""
    started: list[FakeWorker] = []

    def start(**options) -> FakeWorker:
        started.append(FakeWorker(kernels, **options))
        return started[-1]

    monkeypatch.setattr(session, "HarnessClient", start)
    monkeypatch.setattr(spawn, "HarnessClient", start)
    monkeypatch.setenv("CUDAGATE_LOCK_DIR", str(tmp_path / "locks"))
    return started


def use_client(factory) -> None:
    """Make every worker a run in this process starts ``factory(**options)``: the process the plugin
    spawns early (worker/spawn.py) and the one open_worker starts (session.py); for a pytester
    project's conftest, which outlives any monkeypatch."""
    session.HarnessClient = spawn.HarnessClient = factory


def fake_gpu_project(folder: Path) -> Path:
    """A ``conftest.py`` in ``folder`` (a pytester project) that makes every worker its ``pytest
    --cuda-gate`` starts :class:`FakeWorker` on the scale kernel, with its GPU locks in ``folder/.locks``
    (made when a lock is first taken); returns that lock folder."""
    (folder / "conftest.py").write_text(f"""
import os
import sys

sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from fake_worker import FakeWorker, scale_kernels  # noqa: E402

from fake_worker import use_client  # noqa: E402

use_client(lambda **options: FakeWorker(scale_kernels(), **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
""")
    return folder / ".locks"
