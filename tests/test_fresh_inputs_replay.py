"""A fresh-input seed draws bit for bit the sets it drew before the fresh inputs were made cheaper
(digests recorded at 5ad7a70), so a failure printed with CUDAGATE_FRESH_SEED still replays: the
inputs, the reference's outputs, the descriptions and the tolerance scales of four sets, resampled
and adversarial, for an input without a distribution (shuffled) and one with (drawn anew)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.defences.fresh_inputs import make_sets
from pytest_cudagate.suite.loader import load_suite

NORMAL_X = replace_once(SUITE_YAML, "tolerance:", "inputs:\n  x: {distribution: normal, mean: 0.5, std: 2}\ntolerance:")


@pytest.mark.parametrize("yaml_text, digest", [
    (SUITE_YAML, "6b89b63ea21ce9dfd46cec21baf2c1b2364951e577fa261a16f8a73e5dcd3379"),
    (NORMAL_X, "51543dbd71456a72853c2b4ced8678dfbf28b8291ba20494de58e4f6e674777f"),
], ids=["shuffled", "distribution"])
def test_a_fresh_seed_draws_the_sets_it_drew_before(tmp_path, yaml_text, digest):
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=yaml_text))
    case = suite.case("perf")
    sets, notes = make_sets(suite, case, count=4, adversarial=True, seed=1234, root=tmp_path / "fresh")
    assert [s.label for s in sets] == ["resampled", "adversarial", "resampled-2", "adversarial-2"] and notes == []
    h = hashlib.sha256()
    for fresh in sets:
        spec = fresh.spec(suite, case)
        h.update(json.dumps({k: v for k, v in spec.items() if k not in ("inputs", "expected")}, sort_keys=True).encode())
        for path in [*spec["inputs"].values(), *spec["expected"].values()]:
            h.update(np.load(path).tobytes())
    assert h.hexdigest() == digest
