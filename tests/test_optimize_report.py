"""`report.html`, `heatmap.svg` and `heatmap.png` of an optimize pack: readable values (no reprs), the gate's
verdicts, a best-so-far chart with one point per round and a heatmap whose cells stay legible for a search
of 100+ attempts. Packs come from `cudagate optimize` with the fake harness (tests/optimize_fakes.py)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from helpers import replace_once, write_suite
from optimize_fakes import BASE_MS, OPT_SUITE_YAML, FakeEvaluator, opt_suite, write_proposals
from pytest_cudagate.optimize.cli import run_optimize
from pytest_cudagate.optimize.evaluator import Evaluation, Validation
from pytest_cudagate.optimize.report import render
from test_optimize_loop import assert_pack_valid, parse

MIN_CELL_W, MIN_CELL_H = 60, 32  # px: two lines of text fit


# -- a realistic autotune search: 7 rounds of 16 over 120 points, a few wrong ----------------------------

BIG_SPACE_YAML = replace_once(OPT_SUITE_YAML, "tunables: {BLOCK: [128, 64, 256, 512]}",
                              "tunables: {BLOCK: [128, 64, 256, 512], UNROLL: [1, 2, 3, 4, 5, 6], SKEW: [0, 1, 2, 3, 4]}")
WEIGHT = {"perf": {128: 1.0, 64: 1.15, 256: 0.7, 512: 0.9}, "perf2": {128: 1.0, 64: 1.2, 256: 0.85, 512: 0.75}}


def latency(candidate, case: str) -> float:
    d = candidate.defines
    if not d:
        return BASE_MS
    return BASE_MS * WEIGHT.get(case, WEIGHT["perf"])[d["BLOCK"]] * (1 + 0.06 * abs(d["UNROLL"] - 4)) * (1 + 0.03 * d["SKEW"])


class WrongOnSkew4(FakeEvaluator):
    """Every SKEW=4 point writes wrong outputs (the search rejects a share of each round); the gate reports
    its fresh inputs and compute-sanitizer as the harness evaluator does."""

    def validate(self, candidate) -> Validation:
        validation = super().validate(candidate)
        validation.checks = {
            "fresh_inputs": {"sets_per_case": 2, "adversarial": True, "seed": validation.fresh_seed,
                             "cases": "every case, holdout included"},
            "sanitizer": {"tools": ["memcheck", "racecheck"], "case": "small", "binary": None, "ran": False}}
        return validation

    def evaluate(self, candidate) -> Evaluation:
        if candidate.defines.get("SKEW") == 4:
            self.evaluated.append(candidate)
            message = "scale2 × small: FAILED\noutput 'y': 7 of 150 elements outside tolerance"
            return Evaluation(stage="correctness", passed=False, compile=self.compile(candidate), gpu_s=self.gpu_s,
                              rejection=message, rejection_for_model=message)
        return super().evaluate(candidate)


def run_pack(tmp_path: Path, suite: Path, *argv, evaluator=FakeEvaluator, **options):
    """``cudagate optimize`` on ``suite`` with a fake harness: (exit code, pack folder, summary, history)."""
    results = tmp_path / "results"
    code = run_optimize(parse(suite, "scale2", "--allow-unsigned", "--results", results, "--quiet", *argv),
                        evaluator_factory=lambda s, p, ledger: evaluator(s, p, ledger, **options))
    pack = sorted(results.glob("run-*"))[-1]
    return code, pack, json.loads((pack / "summary.json").read_text()), json.loads((pack / "history.json").read_text())


def autotune_pack(tmp_path: Path):
    """``cudagate optimize --proposer autotune --batch 16 --max-iterations 7``: (pack, summary, history)."""
    suite = write_suite(tmp_path / "scale", yaml_text=BIG_SPACE_YAML)
    code, pack, summary, history = run_pack(tmp_path, suite, "--proposer", "autotune", "--batch", 16,
                                            "--max-iterations", 7, evaluator=WrongOnSkew4, latency_fn=latency)
    assert code == 0, summary["stop_detail"]
    return pack, summary, history
