"""A fresh-input seed draws bit for bit the sets recorded here (digests recorded when a shuffled input's
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
    (SUITE_YAML, "96766777f5a1ce99f205db2df19eb01d17571c7e37433d3aa1bbac8b5998f48a"),
    (NORMAL_X, "491533143ba71f64e88d5b23235676f044e24206977a29831f437ae6cce7aeb0"),
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
