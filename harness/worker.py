"""The worker process: ``python -m cudagate_harness.worker`` reads JSON-line requests on stdin.

It owns one CUDA context for its whole life (context creation costs ~0.35 s) and caches loaded
modules, so repeated requests pay only for their launches. After a sticky fault it answers the case
and exits with :data:`~cudagate_harness.protocol.EXIT_STICKY`; the client starts a fresh one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import PROTOCOL_VERSION
from .compiler import CompileOptionError, compile_kernel, nvrtc_version
from .driver import CudaError, Device
from .protocol import EXIT_STICKY
from .runner import run_case


class Worker:
    def __init__(self, device: Device, emit):
        self.device = device
        self.emit = emit
        self.modules: dict[str, tuple[object, object]] = {}
        self._flush_ptr = 0
        self._flush_bytes = 0

    def flush_l2(self) -> None:
        # Writing twice the L2's size evicts whatever the last launch left there (cold-cache timing).
        if not self._flush_ptr:
            self._flush_bytes = max(2 * self.device.attribute("L2_CACHE_SIZE"), 1 << 20)
            self._flush_ptr = self.device.alloc(self._flush_bytes)
        self.device.fill(self._flush_ptr, 0, self._flush_bytes)

    def function_for(self, kernel: dict, arch: str):
        result = compile_kernel(kernel["source"], entry=kernel["entry"], arch=arch,
                                source_name=kernel.get("source_name", "kernel.cu"),
                                options=kernel.get("options", []), headers=kernel.get("headers", {}))
        if not result.ok:
            return result, None
        if result.key not in self.modules:
            self.modules[result.key] = self.device.load(result.cubin, result.lowered_name)
        return result, self.modules[result.key][1]

    def handle(self, request: dict) -> None:
        rid = request.get("id")
        op = request.get("op")
        if op not in ("run", "compile"):
            self.emit({"type": "error", "id": rid, "message": f"unknown op {op!r}"})
            return
        kernel = request["kernel"]
        arch = request.get("arch") or self.device.arch + kernel.get("arch_suffix", "")
        try:
            result, function = self.function_for(kernel, arch)
        except CompileOptionError as exc:
            self.emit({"type": "compile", "id": rid, "ok": False, "arch": arch, "log": str(exc)})
            self.emit({"type": "done", "id": rid})
            return
        except CudaError as exc:  # cuModuleLoadData: e.g. a cubin the driver cannot load
            self.emit({"type": "compile", "id": rid, "ok": False, "arch": arch, "log": str(exc)})
            self.emit({"type": "done", "id": rid})
            return
        self.emit({"type": "compile", "id": rid, **result.to_json()})
        if op == "run" and function is not None:
            base = Path(request.get("base_dir", "."))
            output_dir = Path(request["output_dir"])
            for case in request["cases"]:
                body = run_case(self.device, function, request["signature"], case, base=base,
                                timing=request.get("timing"), output_dir=output_dir, flush=self.flush_l2)
                self.emit({"type": "case", "id": rid, **body})
                if body.get("error", {}).get("kind") == "fault":
                    self.emit({"type": "done", "id": rid})
                    sys.exit(EXIT_STICKY)
        self.emit({"type": "done", "id": rid})


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
        info = device.describe()
    except Exception as exc:  # no driver, no device, or a broken install: all mean "cannot replay"
        emit({"type": "hello", "protocol": PROTOCOL_VERSION, "ok": False, "pid": os.getpid(),
              "error": f"no CUDA device: {exc}"})
        return 0
    emit({"type": "hello", "protocol": PROTOCOL_VERSION, "ok": True, "pid": os.getpid(),
          "device": info, "nvrtc_version": nvrtc_version()})
    worker = Worker(device, emit)
    for line in lines if lines is not None else sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            emit({"type": "error", "id": None, "message": f"request is not JSON: {exc}"})
            continue
        worker.handle(request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
