"""A fresh-input seed draws bit for bit the sets recorded here (digests recorded when adversarial
magnitudes came to be bounded by 2^24 × the input's scale; a shuffled input's
values came to be moved by one unit in the last place, half of them), so a failure
printed with CUDAGATE_FRESH_SEED replays: the inputs, the reference's outputs, the descriptions and
the tolerance scales of four sets, resampled and adversarial, for an input without a distribution
(shuffled) and one with (drawn anew). A change that draws other values records new digests."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.defences.fresh_inputs import prepare
from pytest_cudagate.suite.loader import load_suite

NORMAL_X = replace_once(SUITE_YAML, "tolerance:", "inputs:\n  x: {distribution: normal, mean: 0.5, std: 2}\ntolerance:")


@pytest.mark.parametrize("yaml_text, digest", [
    (SUITE_YAML, "ddeba9708ce5c82000934453eef8fc62b43b1ae4c4bd217e43d02807ca2d0191"),
    (NORMAL_X, "a86334eb9c302863a5eba03904f9dac95707b43730879da728fe76d4a655d6de"),
], ids=["shuffled", "distribution"])
def test_a_fresh_seed_draws_the_sets_it_drew_before(tmp_path, yaml_text, digest):
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=yaml_text))
    case = suite.case("perf")
    sets, notes = prepare(suite, case, count=4, adversarial=True, seed=1234, root=tmp_path / "fresh").finish()
    assert [s.label for s in sets] == ["resampled", "adversarial", "resampled-2", "adversarial-2"] and notes == []
    h = hashlib.sha256()
    for fresh in sets:
        spec = fresh.spec(suite, case)
        h.update(json.dumps({k: v for k, v in spec.items() if k not in ("inputs", "expected")}, sort_keys=True).encode())
        for path in [*spec["inputs"].values(), *spec["expected"].values()]:
            h.update(np.load(path).tobytes())
    assert h.hexdigest() == digest
