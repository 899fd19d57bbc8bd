"""The host side of the GPU test that puts the SGEMM template's cp.async pipeline with split K under
compute-sanitizer (tests/gpu/test_optimize_gpu.py): its points are what it says they are (the pipeline in
steady state in every K group, edges in M and N), its requests are valid harness requests, and every point
compiles for sm_90 and fits one resident block, so on the GPU a finding can only be the kernel's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from test_optimize_gpu import SANITIZED, SANITIZER_POINTS, sanitized_case, sanitizer_requests
from pytest_cudagate.boundary import schema
from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.suite.loader import load_suite
from helpers import EXAMPLES

REGISTERS_PER_SM = 65536


def test_the_points_cover_the_pipeline_with_split_k_in_steady_state_with_edges():
    combos = {(p["STAGES"], p["SK"]) for p in SANITIZER_POINTS}
    assert combos >= {(3, 2), (4, 4), (4, 1)}
    assert {p["BK"] for p in SANITIZER_POINTS} >= {8, 16}
    assert min(p["BM"] * p["BN"] for p in SANITIZER_POINTS) <= 32 * 32
    assert max(p["BM"] * p["BN"] for p in SANITIZER_POINTS) >= 128 * 128
    m, n, k = (SANITIZED.scalars[s] for s in "mnk")
    for point in SANITIZER_POINTS:
        per_group = math.ceil(k / point["BK"]) // point["SK"]  # the fewest K tiles one group multiplies
        assert per_group >= 2 * point["STAGES"], point  # every buffer refilled at least once
        assert m % point["BM"] and n % point["BN"] and m % point["TM"] and n % point["TN"], point


@pytest.mark.slow
def test_each_request_is_valid_and_each_point_compiles_and_fits_one_block(tmp_path):
    reference = sanitized_case(tmp_path / "data")
    assert reference.shape == (SANITIZED.scalars["m"], SANITIZED.scalars["n"])
    requests = sanitizer_requests(tmp_path / "data")
    assert [point for point, _ in requests] == SANITIZER_POINTS
    suite = load_suite(EXAMPLES / "matmul" / "cudagate.yaml")
    kernel = suite.kernel("matmul_f32")
    tuner = AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout])
    for point, request in requests:
        assert schema.problems(request, "harness-request") == [], point
        (case,) = request["cases"]
        assert case["scalars"] == SANITIZED.scalars and np.load(case["buffers"]["a"]["input"]).shape == (67, 520)
        assert all(f"#define {name} {value}" in request["kernel"]["source"] for name, value in point.items())
        block, shared = case["launch"]["block"], case["launch"]["shared_bytes"]
        threads = block[0] * block[1] * block[2]
        assert block[2] == point["SK"] and threads <= 1024 and shared <= 227 * 1024, (point, case["launch"])
        values = {name: choices[0] for name, choices in kernel.tunables.items()} | point
        candidate = tuner.candidate(tuple(values[n] for n in tuner.names))
        result = compile_program(candidate.program(kernel), "sm_90", candidate.text)
        assert result.ok, (point, result.log)
        assert threads * result.resources["registers"] <= REGISTERS_PER_SM, (point, result.resources)
