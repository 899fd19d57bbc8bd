"""Held timed launches on a real GPU: the worker holds its stream, and a long hot batch completes
(one held batch of 1024 launches once blocked the host behind the driver's full launch queue)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.worker.requests import run_request

from gpu_support import copy_suite

pytestmark = pytest.mark.gpu


def test_the_worker_holds_and_a_1024_launch_hot_batch_completes(tmp_path: Path):
    suite = load_suite(copy_suite("softmax", tmp_path) / "cudagate.yaml")
    program = suite.kernels[0]
    case = next(c for c in suite.cases if c.kind == "performance")
    timing = {"warmup": 2, "repeat": 3, "cache": "hot", "warmup_ms": 0, "batch": 1024}
    with HarnessClient(timeout_s=30) as client:
        hello = client.start()
        result = client.run(run_request(suite, program, [case], output_dir=tmp_path / "out", timing=timing))
    assert hello["timing_hold"] is True
    body = result.cases[case.name]
    assert body["status"] == "ok", body
    assert body["timing"]["held"] is True and len(body["timing"]["samples_ms"]) == 3
    assert client.restarts == 0
