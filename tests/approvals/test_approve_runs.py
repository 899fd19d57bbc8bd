"""`cudagate approve --runs N` on the simulated GPU: N independent runs, each in a fresh worker, one
median per run and case in the ledger, one run's launches for the plots, and the build it approved."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fake_worker import install, scale_kernels, scale_xy
from helpers import write_suite
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.judge.stats import run_level
from pytest_cudagate.suite.loader import load_suite

RNG = np.random.default_rng(5)


def jittery(launch):
    x, y, _ = scale_xy(launch)
    y[:] = 2 * x
    launch.device.clock += RNG.uniform(0, 1e-3)


@pytest.fixture
def suite(tmp_path):
    return load_suite(write_suite(tmp_path / "scale"))


@pytest.fixture
def started(tmp_path, monkeypatch):
    """Every worker `cudagate approve` starts."""
    return install(monkeypatch, tmp_path, scale_kernels(jittery))


def test_runs_are_independent_workers_with_one_median_each(suite, started, capsys):
    assert main(["approve", str(suite.path), "--runs", "3", "--approved-by", "alice"]) == 0
    assert len(started) == 3
    approval = Ledger.for_suite(suite).approvals["scale2"]
    (baseline,) = approval.baselines.values()
    perf = baseline.cases["perf"]
    assert len(perf["run_p10_ms"]) == 3 and len(set(perf["run_p10_ms"])) == 3
    assert len(perf["samples_ms"]) == suite.timing.baseline_rounds
    assert perf["run_p10_ms"][0] == run_level(perf["samples_ms"])
    assert approval.build["nvrtc_version"] and approval.build["options"] == list(suite.kernels[0].options)
    assert set(approval.build["cubin_sha256"]) == {"sm_90"}
    assert "baseline of 3 run(s), 10th percentiles: perf " in capsys.readouterr().out


def test_the_default_is_five_runs(suite, started):
    assert main(["approve", str(suite.path)]) == 0
    assert len(started) == 5
    raw = json.loads((suite.root / "cudagate.approvals.json").read_text())
    assert len(next(iter(raw["approvals"]["scale2"]["baselines"].values()))["cases"]["perf"]["run_p10_ms"]) == 5


def test_no_runs_is_refused_before_any_gpu_work(suite, started, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["approve", str(suite.path), "--runs", "0"])
    assert exited.value.code == 2
    assert started == []
    assert "--runs: '0' is not a whole number from 1 to 100" in capsys.readouterr().err
