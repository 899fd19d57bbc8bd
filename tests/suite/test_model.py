"""ResolvedCase: one case's sizes, shapes, launches and data files, evaluated once per case."""

from __future__ import annotations

import dataclasses

import numpy as np

from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Launch


def test_a_case_is_resolved_once_with_everything_the_pipeline_reads(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    resolved = suite.resolved(case)
    assert suite.resolved(case) is resolved
    assert resolved.counts == {"x": 150, "y": 150} and resolved.shapes == {"x": (3, 50), "y": (3, 50)}
    assert resolved.launch(suite.kernels[0]) == {"grid": [3, 1, 1], "block": [128, 1, 1], "shared_bytes": 0}
    assert resolved.launch(Launch(("rows * 2",), ("64",))) == {"grid": [6, 1, 1], "block": [64, 1, 1], "shared_bytes": 0}
    assert resolved.inputs == {"x": suite.data_dir / "small" / "x.npy"}
    expected = resolved.expected_outputs()
    x = np.load(resolved.inputs["x"])
    np.testing.assert_array_equal(expected["y"].reshape(3, 50), (x.astype(np.float64) * 2).astype(np.float32))


def test_a_case_that_is_not_the_suites_own_is_resolved_for_itself(suite_path):
    suite = load_suite(suite_path)
    bigger = dataclasses.replace(suite.case("small"), scalars={"rows": 4, "cols": 10})
    assert suite.resolved(bigger).counts == {"x": 40, "y": 40}
    assert suite.resolved(suite.case("small")).counts == {"x": 150, "y": 150}
