"""Launch request kernels for an outside timer, in a fresh process (driven by timing_fidelity.py).

    python benchmarks/kernel_timers.py loop SPEC.json N         # each kernel N times, for ncu to time
    python benchmarks/kernel_timers.py do_bench SPEC.json OUT.json

SPEC is nvbench_probe.py's: ``{"kernels": [{"label", "request", "source"?}]}``. ``loop`` launches the
kernels in SPEC order, N launches each, on CuPy's null stream (under ``ncu`` every launch is a profiled
kernel). ``do_bench`` times each with ``triton.testing.do_bench`` at its defaults (cold: it zeroes a
256 MB buffer before every launch; median of the launches that fit in 100 ms) and writes ms per label.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from request_kernels import RequestKernel  # noqa: E402


def kernels(spec_path: str) -> list[RequestKernel]:
    spec = json.loads(Path(spec_path).read_text())
    return [RequestKernel.load(Path(k["request"]), k["label"], k.get("source")) for k in spec["kernels"]]


def loop(spec_path: str, count: int) -> None:
    import cupy

    stream = cupy.cuda.Stream.null
    launchers = [k.launcher(cupy) for k in kernels(spec_path)]  # compiled before the first profiled launch
    for launch in launchers:
        for _ in range(count):
            launch(stream)
    stream.synchronize()


def do_bench(spec_path: str, out_path: str) -> None:
    import torch  # before cupy: importing torch after cuda-bindings and cupy has failed on the GPU image
    import cupy
    import triton.testing

    answer = {}
    for kernel in kernels(spec_path):
        launch = kernel.launcher(cupy)

        def on_torch_stream() -> None:
            launch(cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))

        on_torch_stream()
        torch.cuda.synchronize()
        answer[kernel.label] = triton.testing.do_bench(on_torch_stream, return_mode="median")
    Path(out_path).write_text(json.dumps(answer, indent=1))


if __name__ == "__main__":
    mode, spec, arg = sys.argv[1:4]
    if mode == "loop":
        loop(spec, int(arg))
    elif mode == "do_bench":
        do_bench(spec, arg)
    else:
        sys.exit(f"unknown mode {mode!r}: loop or do_bench")
