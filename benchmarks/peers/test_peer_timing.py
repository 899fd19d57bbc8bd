"""The peers as their users run them, on one kernel version per process (driven by gate_power.py).

    CUDAGATE_PEERS=SPEC.json pytest benchmarks/peers -p no:cacheprovider --benchmark-autosave ...

SPEC: ``{"mode": "baseline"|"compare", "kernels": {SUITE: {"request": RUN_REQUEST.json, "source": text}},
"gpucheck_baseline": FILE, "gpucheck_out": FILE}``. Per suite, one pytest-benchmark test (the ``benchmark``
fixture around a launch and a synchronize, all at pytest-benchmark's defaults; saving and comparing are
pytest-benchmark's own ``--benchmark-autosave`` / ``--benchmark-compare-fail`` in separate processes) and one
gpucheck test (its ``gpu_benchmark`` fixture at its defaults; in "baseline" mode its raw times are saved with
``gpucheck.analysis.regression.save_baseline``, in "compare" mode they are judged by ``detect_regression``
at its defaults and with ``min_effect=1.02``, the 2 % threshold, and the verdicts written to gpucheck_out).
"""

from __future__ import annotations

import torch  # first: importing torch after cuda-bindings and cupy has failed on the GPU image

import json
import os
import sys
from pathlib import Path

import cupy
import pytest
from gpucheck.analysis.regression import detect_regression, load_baseline, save_baseline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from request_kernels import RequestKernel  # noqa: E402

SPEC = json.loads(Path(os.environ["CUDAGATE_PEERS"]).read_text())
SUITES = sorted(SPEC["kernels"])


def launcher(suite: str, sync: bool):
    """A host-timed benchmark must wait for the kernel; gpucheck's events need only the launch."""
    entry = SPEC["kernels"][suite]
    launch = RequestKernel.load(Path(entry["request"]), suite, entry.get("source")).launcher(cupy)
    stream = cupy.cuda.Stream.null  # the legacy default stream, the one torch's events record on

    def once() -> None:
        launch(stream)
        if sync:
            stream.synchronize()

    once()  # compile and load outside every measurement
    stream.synchronize()
    return once


@pytest.mark.parametrize("suite", SUITES)
def test_pytest_benchmark(benchmark, suite):
    benchmark(launcher(suite, sync=True))


@pytest.mark.parametrize("suite", SUITES)
def test_gpucheck(gpu_benchmark, suite):
    assert torch.cuda.is_available()
    times = list(gpu_benchmark(launcher(suite, sync=True)).raw_times)
    store = Path(SPEC["gpucheck_baseline"])
    if SPEC["mode"] == "baseline":
        save_baseline(store, suite, times)
        return
    baseline = load_baseline(store, suite)
    assert baseline, f"{store}: no gpucheck baseline for {suite}"
    verdicts = {"default": detect_regression(times, baseline), "min_effect_1.02": detect_regression(
        times, baseline, min_effect=1.02)}
    out = Path(SPEC["gpucheck_out"])
    found = json.loads(out.read_text()) if out.is_file() else {}
    found[suite] = {name: {"regression": r.is_regression, "pvalue": r.pvalue, "change_pct": r.change_pct}
                    for name, r in verdicts.items()}
    out.write_text(json.dumps(found, indent=1))
