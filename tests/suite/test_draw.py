"""The outliers distribution: a base distribution with k large values in every row (or block), drawn by
`cudagate cases generate` and drawn anew, like every other distribution, by the gate's fresh inputs."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.defences.fresh_inputs import prepare
from pytest_cudagate.suite.loader import load_suite

OUTLIERS = replace_once(SUITE_YAML, "tolerance:", "inputs:\n  x: {distribution: outliers, base: {distribution: normal, "
                                                  "mean: 0, std: 1}, k: 2, scale: 100}\ntolerance:")


def outliers_per_row(x: np.ndarray) -> np.ndarray:
    return np.count_nonzero(np.abs(x) >= 50, axis=-1)


def generated(folder, yaml_text=OUTLIERS):
    path = write_suite(folder, yaml_text=yaml_text, data=False)
    assert main(["cases", "generate", str(path)]) == 0
    suite = load_suite(path)
    return suite, {c.name: np.load(suite.input_path(c, suite.buffers[0])).reshape(suite.shape(suite.buffers[0], c))
                   for c in suite.cases}


def test_cases_generate_draws_k_outliers_in_every_row_and_again_alike(tmp_path):
    suite, drawn = generated(tmp_path / "a")
    for name, x in drawn.items():
        assert np.all(outliers_per_row(x) == 2), name
        big = np.abs(x[np.abs(x) >= 50])
        assert big.min() >= 50 and big.max() <= 100 and (x >= 50).any() and (x <= -50).any()
        rest = x[np.abs(x) < 50]
        assert abs(rest.mean()) < 0.3 and 0.8 < rest.std() < 1.2  # the base: normal(0, 1)
    _, again = generated(tmp_path / "b")
    assert all(np.array_equal(drawn[n], again[n]) for n in drawn)  # seeded: the same suite draws the same


def test_outliers_per_block(tmp_path):
    text = replace_once(OUTLIERS, "scale: 100}", "scale: 100, per: 32}")
    _, drawn = generated(tmp_path / "s", text)
    assert np.all(outliers_per_row(drawn["perf"].reshape(-1, 32)) == 2)
    small = drawn["small"].reshape(-1)  # 150 elements: 4 blocks of 32, and a last one of 22
    assert np.all(outliers_per_row(small[:128].reshape(-1, 32)) == 2) and outliers_per_row(small[128:]) <= 2


def test_fresh_inputs_draw_the_outliers_anew(tmp_path):
    suite, drawn = generated(tmp_path / "s")
    case = suite.case("perf")
    sets, notes = prepare(suite, case, count=2, adversarial=True, seed=3, root=tmp_path / "fresh").finish()
    assert notes == []
    x = np.load(sets[0].spec(suite, case)["inputs"]["x"]).reshape(drawn["perf"].shape)
    assert np.all(outliers_per_row(x) == 2)
    moved = (np.abs(x) >= 50) != (np.abs(drawn["perf"]) >= 50)
    assert moved.any(axis=1).mean() > 0.9  # new places, not the signed case's
    # the adversarial set's bound is 2^24 times the outliers' size, the larger scale
    adversarial = np.load(sets[1].spec(suite, case)["inputs"]["x"])
    assert np.abs(adversarial).max() <= 2.0 ** 24 * 100


@pytest.mark.parametrize("entry, message", [
    ("{distribution: outliers, k: 50, scale: 10}",
     "inputs.x.k: 50 outliers in a row of 50 elements (case 'small') leave no value of the base distribution; "
     "make k at most 49"),
    ("{distribution: outliers, scale: 10}", "an outliers distribution needs `k`"),
    ("{distribution: normal, k: 2}", "`base`, `k`, `scale` and `per` belong to `distribution: outliers`"),
    ("{distribution: outliers, base: {distribution: outliers, k: 1, scale: 2}, k: 1, scale: 10}",
     "inputs.x.base.distribution: 'outliers' cannot be an outliers distribution's base"),
    ("{distribution: outliers, k: 2, scale: 0}", "inputs.x.scale: 0 is less than or equal to the minimum of 0"),
])
def test_a_malformed_outliers_distribution_is_refused_in_one_line(tmp_path, capsys, entry, message):
    path = write_suite(tmp_path / "s", yaml_text=replace_once(SUITE_YAML, "tolerance:", f"inputs:\n  x: {entry}\ntolerance:"),
                       data=False)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
