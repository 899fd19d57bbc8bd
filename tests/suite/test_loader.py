"""Loading cudagate.yaml (suite/loader.py): the examples load, the file is read, parsed and held to the
schema, and suites are discovered. What each part of the file must hold is tested in the files of its
checks (test_check_*.py)."""

from __future__ import annotations

import pytest

from helpers import EXAMPLES, SUITE_YAML, line_of, load_text, problems_of, replace_once, write_suite
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.loader import SUITE_FILENAME, discover, load_suite

# -- the examples ---------------------------------------------------------------------------------

def test_softmax_example_loads():
    suite = load_suite(EXAMPLES / "softmax" / SUITE_FILENAME)
    assert suite.name == "softmax"
    assert [p.name for p in suite.signature] == ["x", "y", "rows", "cols"]
    assert [p.name for p in suite.outputs] == ["y"]
    assert suite.reference.python == "reference.py:softmax_rows"
    assert suite.reference.program is None
    assert [k.name for k in suite.kernels] == ["softmax_rows"]
    assert suite.kernels[0].source == (EXAMPLES / "softmax" / "softmax.cu").resolve()
    assert any(c.kind == "performance" and not c.holdout for c in suite.cases)
    assert any(c.holdout for c in suite.cases)
    assert suite.data_dir == (EXAMPLES / "softmax" / "cases").resolve()
    case = suite.case("correct_7x33")
    assert suite.counts(case) == {"x": 231, "y": 231}
    assert suite.shape(suite.signature[1], case) == (7, 33)
    assert suite.kernels[0].launch_for(case.name).resolve(case.scalars) == {
        "grid": [7, 1, 1], "block": [256, 1, 1], "shared_bytes": 0}


def test_matmul_example_loads():
    suite = load_suite(EXAMPLES / "matmul" / SUITE_FILENAME)
    assert suite.name == "matmul"
    assert suite.reference.program is not None
    assert suite.reference.program.entry == "matmul_ref"
    assert [k.name for k in suite.kernels] == ["matmul_f32"]
    assert suite.kernels[0].entry == "matmul_f32"  # defaults to the kernel's name
    assert suite.tolerance["c"].atol == pytest.approx(1e-4)
    assert suite.timing.repeat == 100 and suite.timing.cache == "cold"
    assert suite.threshold == pytest.approx(0.02)
    case = suite.case("correct_31x37x29")
    assert suite.counts(case) == {"a": 31 * 29, "b": 29 * 37, "c": 31 * 37}
    launch = suite.kernels[0].launch_for(case.name).resolve(case.scalars)
    assert launch["grid"] == [3, 2, 1] and launch["block"] == [16, 16, 1]


def test_defaults_of_a_minimal_suite(tmp_path):
    suite = load_text(tmp_path, SUITE_YAML)
    assert suite.timing.warmup == 10 and suite.timing.repeat == 100
    assert suite.threshold == pytest.approx(0.02)
    assert suite.tolerance["y"].nan == "fail"
    assert suite.tolerance["y"].max_rel_norm is None
    assert suite.kernels[0].options == ()
    assert suite.kernels[0].arch_suffix == ""
    assert suite.inputs == {}


def test_unknown_kernel_or_case_lookups_name_the_suite(tmp_path):
    suite = load_text(tmp_path, SUITE_YAML)
    with pytest.raises(KeyError, match="scale2"):
        suite.kernel("nope")
    with pytest.raises(KeyError, match="no case 'nope'"):
        suite.case("nope")


def test_launch_overrides_replace_the_launch_for_their_case(tmp_path):
    text = replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                        "    launch: {grid: [rows], block: [128]}\n"
                        "    launch_overrides:\n"
                        "      perf: {grid: [\"cdiv(rows, 2)\", 2], block: [64], shared_bytes: \"cols * 4\"}\n")
    suite = load_text(tmp_path, text)
    kernel = suite.kernels[0]
    perf, small = suite.case("perf"), suite.case("small")
    assert kernel.launch_for("perf").resolve(perf.scalars) == {"grid": [32, 2, 1], "block": [64, 1, 1], "shared_bytes": 1024}
    assert kernel.launch_for("small").resolve(small.scalars)["block"] == [128, 1, 1]


# -- bad suites -----------------------------------------------------------------------------------

def test_invalid_yaml(tmp_path):
    text = replace_once(SUITE_YAML, "cases:\n", "cases: [\n")
    _, message = problems_of(tmp_path, text)
    assert "not valid YAML" in message
    assert "line " in message and "column " in message


def test_unreadable_file(tmp_path):
    with pytest.raises(FileError, match="cannot read the suite file"):
        load_suite(tmp_path / "missing" / SUITE_FILENAME)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""])
def test_top_level_must_be_a_mapping(tmp_path, text):
    _, message = problems_of(tmp_path, text)
    assert "(top level): expected a mapping" in message
    assert "signature" in message and "kernels" in message


@pytest.mark.parametrize("key", ["tolerance", "kernels", "cases", "signature", "reference"])
def test_missing_required_key(tmp_path, key):
    lines = SUITE_YAML.splitlines(keepends=True)
    start = line_of(SUITE_YAML, f"{key}:") - 1
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):
        end += 1
    text = "".join(lines[:start] + lines[end:])
    _, message = problems_of(tmp_path, text)
    assert f"line 1: (top level): '{key}' is a required property" in message


def test_unknown_top_level_key_lists_the_allowed_keys(tmp_path):
    _, message = problems_of(tmp_path, SUITE_YAML + "colour: blue\n")
    assert "'colour' was unexpected" in message
    allowed = message.split("allowed keys: ", 1)[1].split("\n")[0].split(", ")
    assert allowed == sorted(allowed) and {"cases", "kernels", "reference", "signature", "tolerance"} <= set(allowed)
    assert "line 1" in message


def test_unknown_kernel_key_names_the_kernel_line(tmp_path):
    text = replace_once(SUITE_YAML, "    source: scale.cu\n", "    source: scale.cu\n    sauce: hot\n")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, '- name: scale2')}: kernels[0]:" in message
    assert "'sauce' was unexpected" in message
    assert "allowed keys: arch_suffix, args, classes, compiler, entry, launch, launch_overrides, library_baseline, name, options, outputs, requires, source" in message


def test_param_with_both_buffer_and_scalar(tmp_path):
    text = replace_once(SUITE_YAML, "{name: rows, scalar: int32}", "{name: rows, scalar: int32, buffer: float32}")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'name: rows')}: signature[2]: expected a parameter is either" in message
    assert "{name, scalar: DTYPE}" in message


def test_buffer_without_intent(tmp_path):
    text = replace_once(SUITE_YAML, "{name: x, buffer: float32, intent: in,", "{name: x, buffer: float32,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'name: x,')}: signature[0]: expected" in message
    assert "intent: in|out|inout" in message


def test_bad_expression_syntax(tmp_path):
    text = replace_once(SUITE_YAML, "grid: [rows]", 'grid: ["rows +"]')
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'rows +')}: kernels[0].launch.grid[0]: cannot parse 'rows +'" in message
    assert "allowed: integers" in message


def test_forbidden_expression(tmp_path):
    text = replace_once(SUITE_YAML, "block: [128]", "block: [\"__import__('os')\"]")
    _, message = problems_of(tmp_path, text)
    assert "kernels[0].launch.block[0]" in message
    assert "only cdiv/min/max/ceil/floor calls are allowed" in message


def test_reference_with_both_python_and_source(tmp_path):
    text = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                        "  python: reference.py:scale_rows\n  source: scale.cu\n")
    _, message = problems_of(tmp_path, text)
    assert "reference: expected the reference is either" in message


def test_several_schema_problems_are_reported_together(tmp_path):
    text = replace_once(SUITE_YAML, "kind: correctness", "kind: correct")
    text = replace_once(text, "  y: {atol: 1.0e-6,", "  y: {atol: -1,")
    error, message = problems_of(tmp_path, text)
    assert len(error.problems) == 2
    assert f"line {line_of(text, 'kind: correct,')}: cases[0].kind" in message
    assert f"line {line_of(text, 'atol: -1')}: tolerance.y.atol" in message


def test_a_file_that_is_not_utf8_is_a_file_error(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    path.write_bytes(SUITE_YAML.replace("row by row", "caf\xe9").encode("latin-1"))
    with pytest.raises(FileError):
        load_suite(path)


# -- discover -------------------------------------------------------------------------------------

def test_discover_finds_suites_below_folders_sorted(tmp_path):
    b = write_suite(tmp_path / "b", data=False)
    a = write_suite(tmp_path / "a" / "deep", data=False)
    (tmp_path / "a" / "other.yaml").write_text("x: 1\n")
    assert discover([tmp_path]) == [a, b]


def test_discover_takes_named_yaml_files_as_they_are(tmp_path):
    named = tmp_path / "custom.yml"
    other = tmp_path / "gate.yaml"
    assert discover([named, other, tmp_path / "notes.txt"]) == [named, other]


def test_discover_on_the_examples():
    found = discover([EXAMPLES])
    assert [p.parent.name for p in found] == ["attention", "fir", "matmul", "rmsnorm", "softmax", "split_reduce"]
    for path in found:
        load_suite(path)


def test_discover_nothing(tmp_path):
    assert discover([tmp_path]) == []
