"""The worker process: ``python -m cudagate_harness.worker`` reads JSON-line requests on stdin.

It owns one CUDA context for its whole life (context creation costs ~0.35 s) and caches loaded
modules, so repeated requests pay only for their launches. After a sticky fault it answers the case
and exits with :data:`~cudagate_harness.protocol.EXIT_STICKY`; the client starts a fresh one.

``compare`` is a conversation: after each chunk of interleaved rounds the worker reports the
samples and waits for the client to say ``more`` or ``stop``. The statistics that decide stay on the
client side; the worker only measures.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from . import PROTOCOL_VERSION, telemetry
from .compiler import CompileOptionError, compile_kernel, nvrtc_version
from .driver import CudaError, Device
from .protocol import EXIT_STICKY, POISON_FIRST, POISON_SECOND
from .runner import DEFAULT_PAD_MAX, CaseInputError, CaseRun, Launchable, error_body, rotation_copies, run_case

PAD_SOURCE = 'extern "C" __global__ void cudagate_pad() {}'
ROLES = ("approved", "current")


class Worker:
    def __init__(self, device: Device, emit, source):
        self.device = device
        self.emit = emit
        self.source = source
        self.modules: dict[str, tuple[object, object]] = {}
        self.info = device.describe()
        self._flush_ptr = 0
        self._flush_bytes = 0
        self._pad: Launchable | None = None

    def flush_l2(self) -> None:
        # Writing twice the L2's size evicts whatever the last launch left there (cold-cache timing).
        if not self._flush_ptr:
            self._flush_bytes = max(2 * self.info["l2_bytes"], 1 << 20)
            self._flush_ptr = self.device.alloc(self._flush_bytes)
        self.device.fill(self._flush_ptr, 0, self._flush_bytes)

    def pad(self) -> Launchable:
        if self._pad is None:
            result, function = self.function_for({"source": PAD_SOURCE, "entry": "cudagate_pad"}, self.device.arch)
            self._pad = Launchable(function, (1, 1, 1), (1, 1, 1), 0)
        return self._pad

    def state(self) -> dict:
        return telemetry.device_state(self.device.ordinal, self.info["pci_bus_id"])

    def function_for(self, kernel: dict, arch: str):
        result = compile_kernel(kernel["source"], entry=kernel["entry"], arch=arch,
                                source_name=kernel.get("source_name", "kernel.cu"),
                                options=kernel.get("options", []), headers=kernel.get("headers", {}))
        if not result.ok:
            return result, None
        if result.key not in self.modules:
            self.modules[result.key] = self.device.load(result.cubin, result.lowered_name)
        return result, self.modules[result.key][1]

    def compiled(self, rid, kernel: dict, arch: str | None, role: str | None = None):
        """Compile and load ``kernel``, emitting its compile line; the function, or None on failure."""
        arch = arch or self.device.arch + kernel.get("arch_suffix", "")
        extra = {"role": role} if role else {}
        try:
            result, function = self.function_for(kernel, arch)
        except (CompileOptionError, CudaError) as exc:  # refused option, or a cubin the driver rejects
            self.emit({"type": "compile", "id": rid, "ok": False, "arch": arch, "log": str(exc), **extra})
            return None
        self.emit({"type": "compile", "id": rid, **result.to_json(), **extra})
        return function

    def handle(self, request: dict) -> None:
        rid = request.get("id")
        op = request.get("op")
        try:
            if op == "compare":
                self.compare(rid, request)
            elif op in ("run", "compile"):
                self.run(rid, request, op)
            else:
                self.emit({"type": "error", "id": rid, "message": f"unknown op {op!r}"})
                return
        except (KeyError, TypeError, ValueError) as exc:
            self.emit({"type": "error", "id": rid, "message": f"malformed {op} request: {exc!r}"})
            return
        self.emit({"type": "done", "id": rid})

    def run(self, rid, request: dict, op: str) -> None:
        function = self.compiled(rid, request["kernel"], request.get("arch"))
        if op != "run" or function is None:
            return
        base = Path(request.get("base_dir", "."))
        output_dir = Path(request["output_dir"])
        timing = request.get("timing")
        pad = self.pad() if timing and timing.get("pad_max", DEFAULT_PAD_MAX) else None
        for case in request["cases"]:
            body = run_case(self.device, Launchable.of(function, case["launch"]), request["signature"], case,
                            base=base, timing=timing, output_dir=output_dir, flush=self.flush_l2, pad=pad)
            self.answer(rid, body)

    def compare(self, rid, request: dict) -> None:
        """Validate both kernels, then time them interleaved, chunk by chunk, until told to stop."""
        functions = {}
        for role in ROLES:
            functions[role] = self.compiled(rid, request["kernels"][role], request.get("arch"), role)
            if functions[role] is None:
                return
        case, timing = request["case"], request["timing"]
        kernels = [Launchable.of(functions[role], request["launches"][role]) for role in ROLES]
        cold = timing.get("cache", "cold") == "cold"
        start = time.perf_counter()
        try:
            with CaseRun(self.device, request["signature"], case, Path(request.get("base_dir", ".")),
                         self.flush_l2, self.pad(), seed=int(timing.get("seed", 0)),
                         copies=rotation_copies(request["signature"], case, timing.get("rotate"))) as run:
                for kernel in kernels:
                    run.prepare(kernel)
                firsts = [run.validation_launch(k, POISON_FIRST) for k in kernels]
                run.warm_up(kernels, int(timing["warmup"]), float(timing.get("warmup_ms", 0)))
                rounds = int(timing.get("chunk", 100))
                while rounds > 0:
                    before = self.state()
                    t0 = time.perf_counter()
                    samples, order = run.time_rounds(kernels, rounds, cold=cold, batch=int(timing.get("batch", 1)),
                                                     pad_max=int(timing.get("pad_max", DEFAULT_PAD_MAX)))
                    wall = time.perf_counter() - t0
                    after = self.state()
                    self.emit({"type": "chunk", "id": rid, "approved": samples[0], "current": samples[1],
                               "first": [ROLES[i] for i in order], "wall_s": wall, "state": after,
                               "disturbances": telemetry.disturbances(before, after)})
                    rounds = self._next_rounds()
                seconds = [run.validation_launch(k, POISON_SECOND) for k in kernels]
                output_dir = Path(request["output_dir"])
                body = {"status": "ok", **run.outputs(firsts[1], seconds[1], output_dir)}
                body["approved"] = run.outputs(firsts[0], seconds[0], output_dir, prefix="approved.")
        except (CaseInputError, CudaError) as exc:
            body = error_body(exc)
        body["case"] = case["name"]
        body["seconds"] = time.perf_counter() - start
        self.answer(rid, body)

    def _next_rounds(self) -> int:
        """The client's decision after a chunk: more rounds, or 0 to stop (also when it is gone)."""
        for line in self.source:
            if line.strip():
                reply = json.loads(line)
                return int(reply.get("rounds", 0)) if reply.get("op") == "more" else 0
        return 0

    def answer(self, rid, body: dict) -> None:
        self.emit({"type": "case", "id": rid, **body})
        if body.get("error", {}).get("kind") == "fault":
            self.emit({"type": "done", "id": rid})
            sys.exit(EXIT_STICKY)


def main(lines=None) -> int:
    """Serve requests from ``lines`` (default: stdin) until it ends."""
    # The protocol owns the real stdout; anything else that prints (a library, a warning) goes to
    # stderr so it can never corrupt a response line.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def emit(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    ordinal = int(os.environ.get("CUDAGATE_DEVICE", "0"))
    try:
        device = Device(ordinal)
        source = iter(lines if lines is not None else sys.stdin)
        worker = Worker(device, emit, source)
    except Exception as exc:  # no driver, no device, or a broken install: all mean "cannot replay"
        emit({"type": "hello", "protocol": PROTOCOL_VERSION, "ok": False, "pid": os.getpid(),
              "error": f"no CUDA device: {exc}"})
        return 0
    emit({"type": "hello", "protocol": PROTOCOL_VERSION, "ok": True, "pid": os.getpid(), "device": worker.info,
          "identity": telemetry.device_identity(ordinal, worker.info["pci_bus_id"]),
          "nvrtc_version": nvrtc_version(), "cuda_bindings_version": _bindings_version()})
    for line in source:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            emit({"type": "error", "id": None, "message": f"request is not JSON: {exc}"})
            continue
        worker.handle(request)
    return 0


def _bindings_version() -> str:
    try:
        from importlib.metadata import version

        return version("cuda-bindings")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
