"""bfloat16, FP8 and multi-launch kernels on a real GPU: the examples' kernels and an FP8 kernel built
with <cuda_fp8.h> and CUB pass every defence, and the planted cheat of each new path is rejected with
its reason (a bfloat16 kernel that writes half of each element's bytes, a final pass that is skipped,
a first pass that writes past its scratch buffer)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpu_support import copy_suite, suite_yaml

from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.session import open_worker
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import load_suite

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parent / "dtypes_and_steps"

FP8_YAML = """\
suite: quantize
signature:
  - {name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols]}
  - {name: y, buffer: float8_e4m3fn, intent: out, size: rows*cols, shape: [rows, cols]}
  - {name: rows, scalar: int32}
  - {name: cols, scalar: int32}
reference: {python: reference.py:quantize}
inputs:
  x: {distribution: normal, mean: 0, std: 1}
tolerance:
  y: {atol: 1.0e-2}
kernels:
  - {name: quantize_fp8, source: quantize_fp8.cu, entry: "quantize<128>", launch: {grid: [rows], block: [128]}}
cases:
  - {name: correct_5x300, kind: correctness, scalars: {rows: 5, cols: 300}}
  - {name: perf_1024x4096, kind: performance, scalars: {rows: 1024, cols: 4096}}
"""

FP8_REFERENCE = """\
import numpy as np


def quantize(x, rows, cols):
    x = x.astype(np.float64).reshape(rows, cols)
    return x * 448.0 / np.abs(x).max(axis=1, keepdims=True)
"""


def replay(client, fingerprint, path: Path, out: Path) -> dict:
    suite = load_suite(path)
    gate = Gate(client, fingerprint, GateOptions(), out)
    ledger = Ledger.for_suite(suite)
    return {(p.name, c.name): gate.replay(suite, p, c, ledger) for p in suite.kernels for c in suite.cases}


def with_kernels(root: Path, extra: list[dict], perf: dict) -> Path:
    """The suite at ``root`` unsigned, with the planted kernels added beside its own and one stored
    performance case of scalars ``perf`` (the copy keeps no generated case)."""
    (root / "cudagate.sig.json").unlink(missing_ok=True)
    for source in KERNELS.iterdir():
        shutil.copy(source, root / source.name)
    path = root / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["kernels"] += extra
    raw["cases"].append({"name": "perf_small", "kind": "performance", "scalars": perf})
    raw["checks"] = {"sanitizer": "off"}
    path.write_text(suite_yaml(raw))
    suite = load_suite(path)
    generate(suite, [suite.case("perf_small")])
    return path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dtypes_and_steps")
    rmsnorm = with_kernels(copy_suite("rmsnorm", tmp), [
        {"name": "half_bytes", "source": "half_bytes.cu", "launch": {"grid": ["rows"], "block": [256]}}],
        {"rows": 512, "cols": 2048})
    split = copy_suite("split_reduce", tmp)
    first = {"args": ["x", "partials", "rows", "cols"], "launch": {"grid": ["cdiv(cols, 2048)", "rows"], "block": [256]}}
    last = {"args": ["partials", "y", "rows", "cols"], "launch": {"grid": ["cdiv(rows, 128)"], "block": [128]}}
    split = with_kernels(split, [
        {"name": "skips_final_pass", "source": "split_cheats.cu",
         "steps": [{"entry": "row_partials", **first}, {"entry": "row_finish_skipped", **last}]},
        {"name": "past_scratch", "source": "split_cheats.cu",
         "steps": [{"entry": "row_partials_past_scratch", **first}, {"entry": "row_finish", **last}]}],
        {"rows": 64, "cols": 16384})
    fp8 = tmp / "quantize"
    fp8.mkdir()
    (fp8 / "cudagate.yaml").write_text(FP8_YAML)
    (fp8 / "reference.py").write_text(FP8_REFERENCE)
    shutil.copy(KERNELS / "quantize_fp8.cu", fp8)
    generate(load_suite(fp8 / "cudagate.yaml"))
    found = {}
    with open_worker(timeout_s=60) as worker:
        for path in (rmsnorm, split, fp8 / "cudagate.yaml"):
            found.update(replay(worker.client, worker.fingerprint, path, tmp / "out"))
    return found


@pytest.mark.parametrize("kernel", ["rmsnorm_bf16", "row_sums_split", "quantize_fp8"])
def test_the_honest_kernels_pass_every_defence(outcomes, kernel):
    cases = [case for (name, case) in outcomes if name == kernel]
    assert cases
    for case in cases:
        outcome = outcomes[kernel, case]
        assert not outcome.failed, outcome.message
        assert outcome.correctness.passed and not outcome.correctness.problems, outcome.message


@pytest.mark.parametrize("kernel, case, reasons", [
    ("half_bytes", "correct_7x100", ["elements outside tolerance"]),
    ("skips_final_pass", "correct_5x3000", ["5 elements were never written by the kernel"]),
    ("past_scratch", "correct_5x3000", ["the kernel wrote past the end of buffer 'partials': 4 canary bytes of its "
                                        "guard zone changed, the nearest 0 bytes after its end"]),
])
def test_each_cheat_of_a_new_path_is_rejected(outcomes, kernel, case, reasons):
    outcome = outcomes[kernel, case]
    assert outcome.failed, outcome.warning
    for reason in reasons:
        assert reason in outcome.message, outcome.message
