"""Case data: seeded generation with a Python reference, and the checks against the signature."""

from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest

from helpers import EXAMPLES, REFERENCE_PY, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.suite.cases import (
    CaseDataError,
    case_data_fix,
    case_seed,
    check_case_data,
)
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.defences.reference import ReferenceFailure, ReferenceRunner
from pytest_cudagate.suite.loader import load_suite


def digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.npy"))}


def reference_module(folder):
    spec = importlib.util.spec_from_file_location("scale_reference_for_tests", folder / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generate_writes_inputs_with_real_variation_and_reference_outputs(suite_path):
    suite = load_suite(suite_path)
    reference = reference_module(suite_path.parent)
    x_param, y_param = suite.signature[0], suite.signature[1]
    for case in suite.cases:
        x = np.load(suite.input_path(case, x_param))
        y = np.load(suite.expected_path(case, y_param))
        assert x.dtype == np.float32
        assert x.size == suite.counts(case)["x"]
        assert x.shape == suite.shape(x_param, case)
        assert np.count_nonzero(x) == x.size  # no zeros to hide an unwritten output
        assert len(np.unique(x)) > x.size // 2  # not constant, not a handful of values
        assert x.min() < 0 < x.max()
        assert np.all(np.abs(x) <= 1.0)  # the float default: uniform in [-1, 1]
        np.testing.assert_array_equal(y, reference.scale_rows(x, **case.scalars))
        assert check_case_data(suite, case) == []


def test_generate_returns_the_case_folders(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    suite = load_suite(path)
    folders = generate(suite)
    assert folders == [suite.data_dir / "small", suite.data_dir / "perf"]
    assert sorted(p.name for p in folders[0].rglob("*.npy")) == ["x.npy", "y.npy"]
    assert (folders[0] / "expected" / "y.npy").is_file()


def test_only_the_cases_asked_for(tmp_path):
    suite = load_suite(write_suite(tmp_path / "s", data=False))
    generate(suite, [suite.case("perf")])
    assert (suite.data_dir / "perf" / "x.npy").is_file()
    assert not (suite.data_dir / "small").exists()


def test_cases_differ_from_each_other(suite_path):
    suite = load_suite(suite_path)
    small = np.load(suite.input_path(suite.case("small"), suite.signature[0]))
    perf = np.load(suite.input_path(suite.case("perf"), suite.signature[0]))
    assert not np.array_equal(small.reshape(-1), perf.reshape(-1)[: small.size])


def test_seeds_are_stable(tmp_path):
    suite = load_suite(write_suite(tmp_path / "s", data=False))
    generate(suite, data_dir=tmp_path / "one")
    generate(suite, data_dir=tmp_path / "two")
    one, two = digest(tmp_path / "one"), digest(tmp_path / "two")
    assert len(one) == 4
    assert one == two
    assert case_seed(suite, suite.cases[0]) == case_seed(load_suite(suite.path), suite.cases[0])


def test_seed_offset_draws_fresh_values(tmp_path):
    suite = load_suite(write_suite(tmp_path / "s", data=False))
    generate(suite, data_dir=tmp_path / "base")
    generate(suite, data_dir=tmp_path / "fresh", seed_offset=1)
    case, x = suite.case("small"), suite.signature[0]
    base = np.load(tmp_path / "base" / "small" / "x.npy")
    fresh = np.load(tmp_path / "fresh" / "small" / "x.npy")
    assert base.shape == fresh.shape
    assert np.count_nonzero(base != fresh) > base.size * 0.9
    # The expected outputs follow the fresh inputs.
    np.testing.assert_array_equal(np.load(tmp_path / "fresh" / "small" / "expected" / "y.npy"),
                                  reference_module(suite.root).scale_rows(fresh, **case.scalars))
    assert suite.input_path(case, x).parent.name == "small"


def test_explicit_seed_is_used(tmp_path):
    text = replace_once(SUITE_YAML, "{name: small, kind: correctness,", "{name: small, kind: correctness, seed: 7,")
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    assert case_seed(suite, suite.case("small")) == 7
    generate(suite, [suite.case("small")])
    x = np.load(suite.input_path(suite.case("small"), suite.signature[0]))
    expected = np.random.default_rng(7).uniform(-1.0, 1.0, size=(3, 50)).astype(np.float32)
    np.testing.assert_array_equal(x, expected)


def test_suite_name_and_case_name_both_feed_the_default_seed(tmp_path):
    a = load_suite(write_suite(tmp_path / "a", data=False))
    b = load_suite(write_suite(tmp_path / "b", yaml_text=SUITE_YAML.replace("suite: scale", "suite: scale_b"), data=False))
    assert case_seed(a, a.case("small")) != case_seed(b, b.case("small"))
    assert case_seed(a, a.case("small")) != case_seed(a, a.case("perf"))


def test_distributions_from_the_suite(tmp_path):
    text = SUITE_YAML + "inputs:\n  x: {distribution: normal, mean: 100, std: 0.5}\n"
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text))
    x = np.load(suite.input_path(suite.case("perf"), suite.signature[0]))
    assert 99.9 < float(x.mean()) < 100.1
    assert 0.4 < float(x.std()) < 0.6


def test_integer_inputs(tmp_path):
    text = SUITE_YAML.replace("{name: x, buffer: float32,", "{name: x, buffer: int32,")
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text))
    x = np.load(suite.input_path(suite.case("perf"), suite.signature[0]))
    assert x.dtype == np.int32
    assert -100 <= x.min() < 0 < x.max() <= 100
    assert len(np.unique(x)) > 100


def test_a_constant_input_is_refused(tmp_path):
    text = SUITE_YAML + "inputs:\n  x: {distribution: uniform, low: 1, high: 1}\n"
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    with pytest.raises(CaseDataError, match="input 'x' came out constant"):
        generate(suite)
    assert not suite.data_dir.exists()  # nothing half-written


def test_a_cuda_reference_needs_a_gpu(tmp_path):
    text = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                        "  source: scale.cu\n  entry: scale2\n  launch: {grid: [rows], block: [128]}\n")
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    with pytest.raises(ReferenceFailure, match="needs a GPU"):
        generate(suite)


def test_reference_function_missing(tmp_path):
    text = replace_once(SUITE_YAML, "reference.py:scale_rows", "reference.py:no_such_function")
    suite = load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    with pytest.raises(ReferenceFailure, match="no function 'no_such_function'"):
        generate(suite)


def test_reference_returning_the_wrong_thing(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    (path.parent / "reference.py").write_text("def scale_rows(x, rows, cols):\n    return {'z': x}\n")
    with pytest.raises(ReferenceFailure, match=r"must return the outputs \['y'\]"):
        generate(load_suite(path))


def test_reference_may_return_a_dict_or_tuple(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    suite = load_suite(path)
    case = suite.case("small")
    x = np.arange(150, dtype=np.float32).reshape(3, 50)
    (path.parent / "reference.py").write_text("def scale_rows(x, rows, cols):\n    return {'y': x * 3}\n")
    np.testing.assert_array_equal(ReferenceRunner(suite).python(case, {"x": x})["y"], x * 3)
    (path.parent / "reference.py").write_text("def scale_rows(x, rows, cols):\n    return (x * 4,)\n")
    np.testing.assert_array_equal(ReferenceRunner(suite).python(case, {"x": x})["y"], x * 4)


def test_reference_cannot_change_the_inputs_written(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    (path.parent / "reference.py").write_text(REFERENCE_PY + "\n\ndef mutate(x, rows, cols):\n"
                                              "    y = scale_rows(x, rows, cols)\n    x[...] = 0\n    return y\n")
    text = replace_once(SUITE_YAML, "reference.py:scale_rows", "reference.py:mutate")
    path.write_text(text)
    suite = load_suite(path)
    generate(suite, [suite.case("small")])
    x = np.load(suite.input_path(suite.case("small"), suite.signature[0]))
    assert np.count_nonzero(x) == x.size


# -- check_case_data ------------------------------------------------------------------------------

def test_missing_file(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    suite.input_path(case, suite.signature[0]).unlink()
    problems = check_case_data(suite, case)
    assert len(problems) == 1
    assert problems[0].endswith("small/x.npy: missing")
    assert check_case_data(suite, suite.case("perf")) == []


def test_missing_expected_output(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("perf")
    suite.expected_path(case, suite.signature[1]).unlink()
    problems = check_case_data(suite, case)
    assert len(problems) == 1 and problems[0].endswith("perf/expected/y.npy: missing")


def test_wrong_dtype(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    path = suite.input_path(case, suite.signature[0])
    np.save(path, np.load(path).astype(np.float64))
    problems = check_case_data(suite, case)
    assert len(problems) == 1
    assert "holds float64, but the signature says x is float32" in problems[0]


def test_expected_outputs_must_be_numbers(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    np.save(suite.expected_path(case, suite.signature[1]), np.array(["a"] * 150))
    problems = check_case_data(suite, case)
    assert len(problems) == 1 and "not plain numbers" in problems[0]


def test_wrong_element_count(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    np.save(suite.input_path(case, suite.signature[0]), np.zeros(149, np.float32))
    np.save(suite.expected_path(case, suite.signature[1]), np.zeros(151, np.float32))
    problems = check_case_data(suite, case)
    assert len(problems) == 2
    assert "x.npy: holds 149 elements, but x has size rows*cols = 150 in case 'small'" in problems[0]
    assert "y.npy: holds 151 elements, but y has size rows*cols = 150" in problems[1]


def test_not_an_npy_file(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    suite.input_path(case, suite.signature[0]).write_bytes(b"this is not a numpy file at all")
    problems = check_case_data(suite, case)
    assert len(problems) == 1 and "not a readable .npy file" in problems[0]


def test_an_empty_npy_file_is_a_problem_not_a_crash(suite_path):
    suite = load_suite(suite_path)
    case = suite.case("small")
    suite.input_path(case, suite.signature[0]).write_bytes(b"")
    problems = check_case_data(suite, case)
    assert len(problems) == 1 and "x.npy" in problems[0]


def test_the_fix_names_the_command(suite_path):
    suite = load_suite(suite_path)
    assert "cudagate cases generate" in case_data_fix(suite)
    assert "cudagate.yaml" in case_data_fix(suite)


@pytest.mark.parametrize("name", ["softmax", "matmul"])
def test_committed_example_data_matches_the_signature(name):
    suite = load_suite(EXAMPLES / name / "cudagate.yaml")
    for case in suite.cases:
        assert check_case_data(suite, case) == [], case.name


def test_committed_softmax_expected_outputs_are_the_reference(tmp_path):
    suite = load_suite(EXAMPLES / "softmax" / "cudagate.yaml")
    for case in suite.cases:
        x = np.load(suite.input_path(case, suite.signature[0]))
        y = np.load(suite.expected_path(case, suite.signature[1]))
        np.testing.assert_array_equal(y, ReferenceRunner(suite).python(case, {"x": x})["y"])
        assert len(np.unique(x)) > x.size // 2
