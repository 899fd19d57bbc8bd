"""A team's operation gated from one suite (issue 44's "done when"): cuBLAS GEMM, a memset and two kernels,
then cuBLAS GEMM again, in two versions, one with a precondition of its own, every defence on (the
adversarial fresh inputs included), as `pytest --cuda-gate` runs it. The GPU is simulated: the kernels
are NumPy bodies, cuBLAS a column-major NumPy GEMM behind the real adapter's calls
(tests/suite/test_library_steps.py); tests/gpu/test_steps_gpu.py runs the example on a GPU."""

from __future__ import annotations

from pathlib import Path

from helpers import replace_once
from test_library_steps import ATTENTION_YAML, attention_suite

from pytest_cudagate.defences.expected import generate

TESTS = Path(__file__).resolve().parents[1]

# A second version for rows in whole blocks of 64: its own launch, and a precondition the others lack.
VERSIONS = replace_once(ATTENTION_YAML, "\ncases:\n", """
  - name: attention_t64
    source: attention.cu
    requires: ["T % 64 == 0"]
    steps:
      - library: cublas_gemm
        args: {a: q, b: k, c: scores}
        options: {m: T, n: T, k: D, trans_b: true, alpha: scale, batch: H}
      - memset: {buffer: rowmax, value: -inf}
      - entry: row_max
        args: [scores, rowmax, T]
        launch: {grid: ["T / 64", H*T], block: [64]}
      - entry: softmax_rows
        args: [scores, rowmax, T]
        launch: {grid: [H*T], block: [256]}
      - library: cublas_gemm
        args: {a: scores, b: v, c: out}
        options: {m: T, n: D, k: T, batch: H}

cases:
""")
# Small cases, so the simulated GPU's NumPy GEMMs stay quick: T of 37 and 100 break the second version's
# precondition, T of 64 and 128 meet it.
CASES = """cases:
  - {name: correct_2x37x16, kind: correctness, scalars: {H: 2, T: 37, D: 16, scale: 0.25}}
  - {name: correct_2x64x16, kind: correctness, scalars: {H: 2, T: 64, D: 16, scale: 0.25}}
  - {name: perf_2x128x16, kind: performance, scalars: {H: 2, T: 128, D: 16, scale: 0.25}}
  - {name: holdout_3x100x8, kind: performance, holdout: true, scalars: {H: 3, T: 100, D: 8, scale: 0.35}}
"""
VERSIONS = VERSIONS[:VERSIONS.index("cases:\n")] + CASES

CONFTEST = """
import dataclasses
import os
import sys

sys.path[:0] = {folders!r}
from cudagate_harness.library import ADAPTERS  # noqa: E402
from fake_worker import FakeKernel, FakeWorker, use_client  # noqa: E402
from test_library_steps import fake_gemm, row_max, softmax_rows  # noqa: E402

ADAPTERS["cublas_gemm"] = dataclasses.replace(ADAPTERS["cublas_gemm"], load=fake_gemm)
ARGS = [{{"name": "scores", "kind": "buffer", "dtype": "float32", "intent": "scratch"}},
        {{"name": "rowmax", "kind": "buffer", "dtype": "float32", "intent": "scratch"}},
        {{"name": "T", "kind": "scalar", "dtype": "int32"}}]
use_client(lambda **options: FakeWorker({{"row_max": FakeKernel(row_max, ARGS),
                                          "softmax_rows": FakeKernel(softmax_rows, ARGS)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


def test_an_operation_of_library_calls_memsets_and_kernels_in_two_versions_is_gated_from_one_suite(pytester,
                                                                                                    monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    suite = attention_suite(pytester.path / "attention", VERSIONS)
    generate(suite)
    assert [k.name for k in suite.kernels] == ["attention_causal", "attention_t64"]
    assert suite.checks.fresh_inputs and suite.inputs["q"].adversarial_max == 4  # the defence is on
    folders = [str(TESTS)] + sorted(str(p) for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__")
    (pytester.path / "conftest.py").write_text(CONFTEST.format(folders=folders))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", "-rs", timeout=240)
    meets = ("correct_2x64x16", "perf_2x128x16")
    result.stdout.fnmatch_lines_random(
        [f"*cudagate.yaml::attention_causal::{case} PASSED*" for case in (
            "correct_2x37x16", *meets, "holdout_3x100x8")]
        + [f"*cudagate.yaml::attention_t64::{case} PASSED*" for case in meets]
        + [f"*cudagate.yaml::attention_t64::{case} SKIPPED*" for case in ("correct_2x37x16", "holdout_3x100x8")]
        + ["*T % 64 == 0*"])
    assert result.ret == 0, result.stdout.str()[-3000:]
