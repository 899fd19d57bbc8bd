"""Does cudagate time a kernel the way other tools do? One table, cold and hot L2.

    python benchmarks/timing_fidelity.py

The shipped kernels of the examples, on their performance cases, timed by cudagate's harness
(median of 500 launches, each alone between its own event pair) and by Triton's
`triton.testing.do_bench` (median; it flushes L2 by zeroing a 256 MB buffer before each launch) and
`do_bench_cudagraph` (hot, launches replayed from a CUDA graph, so no host dispatch inside the
timing). The same CUDA source is launched for Triton through CuPy on PyTorch's stream. Needs a GPU,
torch, triton and cupy. nvbench's Python bindings (cuda-bench) are not on our GPU image, so they are
not in the table.
"""

from __future__ import annotations

import torch  # first: importing torch after cuda-bindings and cupy has failed on the GPU image

import sys
import tempfile
from pathlib import Path

import cupy
import numpy as np
import triton.testing

from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.loader import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["examples/matmul/cudagate.yaml", "examples/softmax/cudagate.yaml"]


def cudagate_median(client, suite, program, case, cache: str) -> float:
    timing = {**suite.timing.to_json(), "repeat": 500, "cache": cache}
    result = client.run(run_request(suite, program, [case], output_dir=Path(tempfile.mkdtemp()), timing=timing))
    return float(np.median(result.cases[case.name]["timing"]["samples_ms"])) * 1000


def triton_launcher(suite, program, case):
    """A no-argument callable launching the kernel via CuPy on PyTorch's current stream."""
    module = cupy.RawModule(code=program.source.read_text(), options=("-std=c++17",))
    kernel = module.get_function(program.entry)
    launch = program.launch_for(case.name).resolve(case.scalars)
    args = []
    for param in suite.signature:
        if param.kind == "buffer":
            path = suite.input_path(case, param)
            data = np.load(path) if param.is_input else np.zeros(suite.counts(case)[param.name], np.float32)
            args.append(cupy.asarray(data))
        else:
            args.append(np.int32(case.scalars[param.name]))

    def launch_once():
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel(tuple(launch["grid"]), tuple(launch["block"]), tuple(args), shared_mem=launch["shared_bytes"])

    return launch_once


def main() -> int:
    rows = []
    with HarnessClient() as client:
        client.start()
        for path in SUITES:
            suite = load_suite(ROOT / path)
            program = suite.kernels[0]
            for case in (c for c in suite.cases if c.kind == "performance" and not c.holdout):
                fn = triton_launcher(suite, program, case)
                cold_cg = cudagate_median(client, suite, program, case, "cold")
                hot_cg = cudagate_median(client, suite, program, case, "hot")
                cold_tr = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000
                hot_tr = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1000
                rows.append((suite.name, case.name, cold_cg, cold_tr, hot_cg, hot_tr))
    print("\n| suite | case | cudagate cold µs | do_bench cold µs | diff | cudagate hot µs | do_bench_cudagraph hot µs | diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name, case, cc, tc, ch, th in rows:
        print(f"| {name} | {case} | {cc:.2f} | {tc:.2f} | {(tc / cc - 1) * 100:+.1f}% | {ch:.2f} | {th:.2f} | {(th / ch - 1) * 100:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
