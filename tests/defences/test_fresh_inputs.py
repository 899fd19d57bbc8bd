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
from cudagate_harness.protocol import FLOAT_DTYPES, LOW_PRECISION

from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.defences.fresh_inputs import BOUND_BITS, HEADROOM_BITS, SPREAD_BITS, prepare, type_bits
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


def test_every_float_type_gets_bits_by_its_exponent_width_listed_or_not():
    """A type of DTYPES needs no line in the tables: a listed width is read, one between two listed takes
    the narrower's, and one narrower than all takes the narrowest's scaled down, at least 1."""
    for name in FLOAT_DTYPES | set(LOW_PRECISION):
        assert all(type_bits(table, name) >= 1 for table in (SPREAD_BITS, HEADROOM_BITS, BOUND_BITS)), name
    assert type_bits(SPREAD_BITS, "bfloat16") == SPREAD_BITS[8] and type_bits(SPREAD_BITS, "float8_e5m2") == SPREAD_BITS[5]
    assert type_bits({4: 2, 8: 16}, "float16") == 2  # width 5: the 4-bit entry
    assert type_bits({8: 16, 11: 40}, "float8_e4m3fn") == 8  # width 4 of the narrowest 8: 16 * 4 // 8
    assert type_bits({8: 1}, "float8_e4m3fn") == 1
