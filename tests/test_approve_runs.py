"""`cudagate approve --runs N` on the simulated GPU: N independent runs, each in a fresh worker, one
median per run and case in the ledger, one run's launches for the plots, and the build it approved."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import write_suite
from test_hardening_fakes import FakeDevice, FakeKernel, InProcessClient

import pytest_cudagate.cli as cli
from pytest_cudagate.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.gate import BASELINE_ROUNDS
from pytest_cudagate.suite.loader import load_suite

RNG = np.random.default_rng(5)


def jittery(launch):
    n = launch.args["rows"] * launch.args["cols"]
    launch.array("y", np.float32, n)[:] = 2 * launch.array("x", np.float32, n)
    launch.device.clock += RNG.uniform(0, 1e-3)


class Harness(InProcessClient):
    """HarnessClient's interface for `cudagate approve`: each instance is one fresh worker."""

    started = 0
    kernels: dict = {}

    def __init__(self, *, timeout_s: float, env=None):
        super().__init__(self.kernels)

    def start(self) -> dict:
        Harness.started += 1
        return {"device": FakeDevice().describe(), "pid": 1, "nvrtc_version": "13.0"}

    @property
    def device(self) -> dict:
        return FakeDevice().describe()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def suite(tmp_path, monkeypatch):
    suite = load_suite(write_suite(tmp_path / "scale"))
    Harness.started = 0
    Harness.kernels = {"scale2": FakeKernel(jittery, [p.protocol() for p in suite.signature])}
    monkeypatch.setattr(cli, "HarnessClient", Harness)
    return suite


def test_runs_are_independent_workers_with_one_median_each(suite, capsys):
    assert main(["approve", str(suite.path), "--runs", "3", "--approved-by", "alice"]) == 0
    assert Harness.started == 3
    approval = Ledger.for_suite(suite).approvals["scale2"]
    (baseline,) = approval.baselines.values()
    perf = baseline.cases["perf"]
    assert len(perf["run_medians_ms"]) == 3 and len(set(perf["run_medians_ms"])) == 3
    assert len(perf["samples_ms"]) == BASELINE_ROUNDS and perf["summary"]["median"] == perf["run_medians_ms"][0]
    assert approval.build["nvrtc_version"] and approval.build["options"] == list(suite.kernels[0].options)
    assert set(approval.build["cubin_sha256"]) == {"sm_90"}
    out = capsys.readouterr().out
    assert "run 3 of 3 done" in out and "baseline of 3 run(s): perf " in out


def test_the_default_is_five_runs(suite):
    assert main(["approve", str(suite.path)]) == 0
    assert Harness.started == 5
    raw = json.loads((suite.root / "cudagate.approvals.json").read_text())
    assert len(next(iter(raw["approvals"]["scale2"]["baselines"].values()))["cases"]["perf"]["run_medians_ms"]) == 5


def test_no_runs_is_refused_before_any_gpu_work(suite, capsys):
    assert main(["approve", str(suite.path), "--runs", "0"]) == 2
    assert Harness.started == 0
    assert "--runs 0: at least one run" in capsys.readouterr().err
