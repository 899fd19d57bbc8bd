"""Adversarial fresh inputs that an honest one-pass LayerNorm survives, and a domain cheat that fails them.

A float32 LayerNorm that takes the variance in one pass (E[x²] − mean², then rsqrt) is correct at
every magnitude a model produces, but its sum of squares overflows near 2^64. The adversarial sets
once reached the reference's headroom (2^100 and more for a LayerNorm, whose output stays of order
one), where it computed inf − inf; they now stop at 2^24 times the input's scale (docs/hardening.md).
The gate itself draws the sets and judges the kernels here, on the simulated GPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from helpers import SUITE_YAML, replace_once, write_suite
from fake_worker import FakeKernel, FakeWorker
from test_hardening_gate import Fingerprint

from pytest_cudagate.defences.expected import generate
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust.approvals import Ledger

EPS = 1e-5
LAYERNORM_PY = f"""\
import numpy as np


def layernorm(x, rows, cols):
    x = x.astype(np.float64).reshape(rows, cols)
    centred = x - x.mean(axis=1, keepdims=True)
    return (centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + {EPS})).astype(np.float32)
"""
LAYERNORM_YAML = (replace_once(replace_once(replace_once(SUITE_YAML, "suite: scale", "suite: layernorm"),
                                            "python: reference.py:scale_rows", "python: layernorm.py:layernorm"),
                               "  y: {atol: 1.0e-6, rtol: 1.0e-5}", "  y: {atol: 1.0e-4, rtol: 1.0e-4}")
                  .replace("cases:\n", "inputs:\n  x: {distribution: normal, mean: 0, std: 1}\ncases:\n")
                  + "  - {name: wide, kind: correctness, scalars: {rows: 4, cols: 4096}}\n")
SEEDS = range(1, 7)


def _rows(launch):
    rows, cols = launch.args["rows"], launch.args["cols"]
    x = launch.array("x", np.float32, rows * cols).reshape(rows, cols)
    return x, launch.array("y", np.float32, rows * cols).reshape(rows, cols), np.float32(cols)


def one_pass(launch):
    """Honest: sums of x and x² in float32, variance E[x²] − mean², as the H100 kernels of issue 44."""
    x, y, n = _rows(launch)
    with np.errstate(all="ignore"):
        mean = x.sum(axis=1, dtype=np.float32, keepdims=True) / n
        var = (x * x).sum(axis=1, dtype=np.float32, keepdims=True) / n - mean * mean
        y[:] = (x - mean) * (np.float32(1) / np.sqrt(var + np.float32(EPS)))


def clips_inputs(launch):
    """A value-domain cheat: clips x to ±1000, which the inputs it was shown (|x| of a few units) never
    reach, so right on them and on resampled ones, wrong on rows with an outlier."""
    x, y, n = _rows(launch)
    x = np.clip(x, -1000, 1000)
    mean = x.sum(axis=1, dtype=np.float32, keepdims=True) / n
    var = ((x - mean) ** 2).sum(axis=1, dtype=np.float32, keepdims=True) / n
    y[:] = (x - mean) / np.sqrt(var + np.float32(EPS))


def suite_at(folder: Path, yaml_text: str = LAYERNORM_YAML):
    path = write_suite(folder, yaml_text=yaml_text, data=False)
    (folder / "layernorm.py").write_text(LAYERNORM_PY, encoding="utf-8")
    suite = load_suite(path)
    generate(suite)
    return suite


def replay(suite, body, tmp_path: Path, seed: int) -> dict:
    params = [p.protocol() for p in suite.signature]
    gate = Gate(FakeWorker({"k": FakeKernel(body, params)}), Fingerprint(), GateOptions(fresh_seed=seed),
                tmp_path / f"out{seed}")
    program = dataclasses.replace(suite.kernels[0], name="k", entry="k")
    return {case.name: gate.replay(suite, program, case, Ledger.for_suite(suite)) for case in suite.cases}


@pytest.fixture(scope="module")
def layernorm(tmp_path_factory):
    return suite_at(tmp_path_factory.mktemp("layernorm") / "s")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_one_pass_float32_layernorm_passes_every_default_adversarial_set(layernorm, tmp_path, seed):
    for case, outcome in replay(layernorm, one_pass, tmp_path, seed).items():
        assert not outcome.failed, f"case {case}, seed {seed}:\n{outcome.message}"


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_layernorm_fitted_to_the_value_domain_still_fails_them(layernorm, tmp_path, seed):
    for case, outcome in replay(layernorm, clips_inputs, tmp_path, seed).items():
        assert outcome.failed, f"case {case}, seed {seed} passed"
        assert "wrong on fresh inputs (adversarial: magnitudes spread over 2^±16" in outcome.message, outcome.message
        assert "at most 2^24 × each input's scale" in outcome.message, outcome.message
        assert "wrong on fresh inputs (resampled" not in outcome.message  # the signed domain's values pass


def test_a_signed_adversarial_max_takes_the_sets_as_far_as_it_says(tmp_path):
    wide = replace_once(LAYERNORM_YAML, "std: 1}", "std: 1, adversarial_max: 1.0e+37}")
    outcomes = replay(suite_at(tmp_path / "s", wide), one_pass, tmp_path, seed=1)
    for case, outcome in outcomes.items():  # past 2^64 the one-pass sum of squares is inf, and inf - inf NaN
        assert outcome.failed and "x at most 1e+37" in outcome.message, outcome.message
        assert "actual nan" in outcome.message, outcome.message
