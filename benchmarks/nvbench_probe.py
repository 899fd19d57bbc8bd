"""Cold GPU time of request kernels as nvbench measures it (the ``cuda-bench`` wheel), in this process.

    python benchmarks/nvbench_probe.py SPEC.json OUT.json

SPEC: ``{"kernels": [{"label": ..., "request": RUN_REQUEST.json, "source": optional replacement text}]}``.
Each kernel is one nvbench benchmark: cold measurements only (nvbench flushes L2 before every sample and
times each launch with its own events), the "entropy" stopping criterion, everything else at nvbench's
defaults. OUT gets ``{label: {"median_s", "mean_s", "samples"}}``. The gate's own code is not involved:
the benchmarks use it as the independent measurement, run in a fresh process each time.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import cupy
from cuda import bench
from cuda.bench.results import BenchmarkResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from request_kernels import RequestKernel  # noqa: E402


def register(kernel: RequestKernel) -> None:
    launch = kernel.launcher(cupy)

    def measure(state) -> None:
        device = state.get_device()
        state.exec(lambda handle: launch(cupy.cuda.ExternalStream(handle.get_stream().addressof(), device)),
                   batched=False)

    benchmark = bench.register(measure)
    benchmark.set_name(kernel.label)
    benchmark.set_stopping_criterion("entropy")


def main(argv: list[str]) -> int:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    for entry in spec["kernels"]:
        kernel = RequestKernel.load(Path(entry["request"]), entry["label"], entry.get("source"))
        register(kernel)
    folder = Path(tempfile.mkdtemp(prefix="nvbench-"))
    bench.run_all_benchmarks([sys.argv[0], "--devices", "0", "--jsonbin", str(folder / "result.json")])
    result = BenchmarkResult.from_json(folder / "result.json")
    answer = {}
    for label, sub in result.items():
        state = sub[0]
        mean = state.summaries.get("nv/cold/time/gpu/mean")
        answer[label] = {"median_s": state.center(statistics.median),
                         "mean_s": None if mean is None or mean.value is None else float(mean.value),
                         "samples": 0 if state.samples is None else len(state.samples)}
    out_path.write_text(json.dumps(answer, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
