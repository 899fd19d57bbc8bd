"""`cudagate approve` goes through the gate: it refuses a kernel `pytest --cuda-gate` fails, for the
same reasons and in the same words, and records a kernel the gate passes (fake worker, no GPU)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from fake_worker import install, scale_kernels, scale_xy
from helpers import write_suite
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import SIGNING_KEY_ENV, generate_key_pair

pytest_plugins = ["pytester"]


def first_row(launch):
    x, y, _ = scale_xy(launch)
    y[: launch.args["cols"]] = 2 * x[: launch.args["cols"]]


def writes_past_end(launch):
    x, y, n = scale_xy(launch)
    y[:] = 2 * x
    launch.at("y", np.float32, n, 3)[:] = 7.0


def memorised(launch):  # right on the signed inputs only: caught by the fresh inputs
    x, y, n = scale_xy(launch)
    memory = launch.state.setdefault("memory", {})
    key = x.tobytes()
    if len(memory) < 2:
        memory.setdefault(key, 2 * x)
    y[:] = memory.get(key, np.zeros(n, np.float32))


@pytest.mark.parametrize("body", [first_row, writes_past_end, memorised])
def test_approve_refuses_what_the_gate_fails_in_the_same_words(pytester, monkeypatch, capsys, body):
    monkeypatch.setenv("CUDAGATE_FRESH_SEED", "7")
    suite_path = write_suite(pytester.path / "scale")
    install(monkeypatch, pytester.path, scale_kernels(body))
    gate = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(suite_path.parent),
                               "-p", "no:cacheprovider")
    failures = {report.nodeid.rsplit("::", 1)[-1]: report.longreprtext for report in gate.getfailures()}
    assert set(failures) == {"small", "perf"}
    capsys.readouterr()

    assert main(["approve", str(suite_path), "--approved-by", "reviewer"]) == 1
    out = capsys.readouterr().out
    assert "scale2: NOT approved; it fails the gate:\n" in out
    for case, words in failures.items():
        assert textwrap.indent(f"{case}: {words}", "  ") in out
    assert "scale2" not in Ledger.for_suite(load_suite(suite_path)).approvals


def test_approve_records_a_kernel_the_gate_passes_with_its_baseline(tmp_path, monkeypatch, capsys):
    suite_path = write_suite(tmp_path / "scale")
    workers = install(monkeypatch, tmp_path, scale_kernels())
    assert main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "scale2: approved" in out and "by reviewer; baseline of 1 run(s), 10th percentiles: perf " in out
    suite = load_suite(suite_path)
    approval = Ledger.for_suite(suite).approvals["scale2"]
    (baseline,) = approval.baselines.values()
    assert set(baseline.cases) == {"perf"}
    assert len(baseline.cases["perf"]["samples_ms"]) == suite.timing.baseline_rounds == 300
    fresh = [r for r in workers[0].requests if any(c.get("fresh") for c in r.get("cases", []))]
    assert fresh, "approve checks fresh inputs, as the gate does"
    assert len(workers) == 1 and workers[0].closed


def test_approve_signs_for_the_pull_request_it_names_and_only_with_a_key(tmp_path, monkeypatch, capsys):
    suite_path = write_suite(tmp_path / "scale")
    install(monkeypatch, tmp_path, scale_kernels())
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    assert main(["approve", str(suite_path), "--runs", "1", "--pull-request", "4"]) == 2
    assert capsys.readouterr().err == (f"cudagate: --pull-request 4: names what a signing is for, and without --key (or "
                                       f"${SIGNING_KEY_ENV}) approve signs nothing; pass it to `cudagate sign` after "
                                       "review\n")
    assert not Ledger.for_suite(load_suite(suite_path)).exists  # refused before any run
    generate_key_pair("alice", private_path=tmp_path / "alice.key", public_path=tmp_path / "alice.pub")
    assert main(["approve", str(suite_path), "--runs", "1", "--key", str(tmp_path / "alice.key"),
                 "--pull-request", "4"]) == 0
    ledger = Ledger.for_suite(load_suite(suite_path))
    assert ledger.pull_request == 4 and ledger.signature is not None and ledger.sequence == 1
