"""Loading cudagate.yaml: the examples load, and every kind of mistake is reported usefully."""

from __future__ import annotations

from pathlib import Path

import pytest
from cudagate_harness.protocol import DTYPES

from helpers import EXAMPLES, SUITE_YAML, line_of, replace_once, write_suite
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.loader import SUITE_FILENAME, discover, load_suite


def load_text(tmp_path: Path, text: str):
    """Write the scale suite's files with ``text`` as its yaml (no case data) and load it."""
    path = write_suite(tmp_path / "s", yaml_text=text, data=False)
    return load_suite(path)


def problems_of(tmp_path: Path, text: str) -> tuple[FileError, str]:
    with pytest.raises(FileError) as excinfo:
        load_text(tmp_path, text)
    error = excinfo.value
    assert error.path.endswith(SUITE_FILENAME)
    assert str(error).startswith(error.path + ":\n")  # the message names the file first
    return error, str(error)


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


def test_unknown_dtype(tmp_path):
    """The schema takes any name; the loader refuses one not in DTYPES, listing them (the one list)."""
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: cols, scalar: int31}")
    _, message = problems_of(tmp_path, text)
    assert (f"line {line_of(text, 'name: cols')}: signature[3].scalar: 'int31' is not a dtype cudagate knows; "
            f"write one of {', '.join(DTYPES)}") in message


def test_size_expression_with_an_unknown_name(tmp_path):
    text = replace_once(SUITE_YAML, "{name: x, buffer: float32, intent: in, size: rows*cols,",
                        "{name: x, buffer: float32, intent: in, size: rows*colz,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'colz')}: signature[0].size:" in message
    assert "'rows*colz' uses colz" in message
    assert "scalars: cols, rows" in message


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


def test_duplicate_case_names(tmp_path):
    text = replace_once(SUITE_YAML, "{name: perf,", "{name: small,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'kind: performance')}: cases[1].name: case name 'small' is used twice" in message


def test_duplicate_kernel_names(tmp_path):
    text = replace_once(SUITE_YAML, "cases:\n", "  - name: scale2\n    source: scale.cu\n"
                                               "    launch: {grid: [rows], block: [64]}\ncases:\n")
    _, message = problems_of(tmp_path, text)
    second = [n for n, line in enumerate(text.splitlines(), 1) if "name: scale2" in line][1]
    assert f"line {second}: kernels[1].name: kernel name 'scale2' is used twice" in message


def test_duplicate_param_names(tmp_path):
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: rows, scalar: int64}")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'scalar: int64')}: signature[3].name: parameter name 'rows' is used twice" in message


def test_a_suite_needs_a_performance_case(tmp_path):
    text = replace_once(SUITE_YAML, "kind: performance", "kind: correctness")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'name: small')}: cases: at least one non-holdout case needs kind: performance" in message


def test_a_holdout_performance_case_does_not_count(tmp_path):
    text = replace_once(SUITE_YAML, "kind: performance,", "kind: performance, holdout: true,")
    _, message = problems_of(tmp_path, text)
    assert "needs kind: performance" in message


def test_a_suite_needs_an_output(tmp_path):
    text = replace_once(SUITE_YAML, "intent: out", "intent: in")
    _, message = problems_of(tmp_path, text)
    assert "no buffer has intent out or inout" in message


def test_tolerance_for_a_non_output(tmp_path):
    text = replace_once(SUITE_YAML, "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n",
                        "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n  x: {atol: 1.0}\n")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'x: {atol: 1.0}')}: tolerance.x: 'x' is not an output buffer (outputs: y)" in message


def test_output_without_tolerance(tmp_path):
    text = SUITE_YAML.replace("  y: {atol: 1.0e-6, rtol: 1.0e-5}\n", "  x: {atol: 1.0}\n")
    _, message = problems_of(tmp_path, text)
    assert "tolerance: output 'y' has no tolerance; add `y: {atol: ..., rtol: ...}`" in message
    assert f"line {line_of(text, 'x: {atol: 1.0}')}: tolerance" in message


def test_inputs_for_a_non_input(tmp_path):
    text = SUITE_YAML + "inputs:\n  y: {distribution: normal}\n"
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'distribution: normal')}: inputs.y: 'y' is not an input buffer (inputs: x)" in message


def test_launch_override_for_an_unknown_case(tmp_path):
    text = replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                        "    launch: {grid: [rows], block: [128]}\n    launch_overrides:\n"
                        "      nosuch: {grid: [1], block: [32]}\n")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nosuch')}: kernels[0].launch_overrides.nosuch: no case named 'nosuch' (cases: perf, small)" in message


def test_missing_kernel_source(tmp_path):
    text = replace_once(SUITE_YAML, "source: scale.cu", "source: nothere.cu")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nothere.cu')}: kernels[0].source: file 'nothere.cu' not found next to the suite" in message


def test_missing_python_reference(tmp_path):
    text = replace_once(SUITE_YAML, "python: reference.py:", "python: nope.py:")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nope.py')}: reference.python: file 'nope.py' not found" in message


def test_reference_with_both_python_and_source(tmp_path):
    text = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                        "  python: reference.py:scale_rows\n  source: scale.cu\n")
    _, message = problems_of(tmp_path, text)
    assert "reference: expected the reference is either" in message


def test_int_scalar_given_a_fraction(tmp_path):
    text = replace_once(SUITE_YAML, "rows: 3,", "rows: 2.5,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'rows: 2.5')}: cases[0].scalars.rows: rows is int32, so its value must be a whole number, not 2.5" in message


def test_float_scalar_accepts_a_fraction(tmp_path):
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: cols, scalar: int32}\n  - {name: alpha, scalar: float32}")
    text = text.replace("cols: 50}", "cols: 50, alpha: 2.5}").replace("cols: 256}", "cols: 256, alpha: 1}")
    suite = load_text(tmp_path, text)
    assert suite.case("small").scalars["alpha"] == 2.5


def test_case_missing_a_scalar_and_giving_an_unknown_one(tmp_path):
    text = replace_once(SUITE_YAML, "scalars: {rows: 3, cols: 50}", "scalars: {rows: 3, colz: 50}")
    _, message = problems_of(tmp_path, text)
    assert "cases[0].scalars: scalar 'cols' has no value in case 'small'" in message
    assert "cases[0].scalars.colz: 'colz' is not a scalar parameter of the signature" in message


def test_int_scalar_out_of_range(tmp_path):
    text = replace_once(SUITE_YAML, "cols: 256}", "cols: 3000000000}")
    _, message = problems_of(tmp_path, text)
    assert "cases[1].scalars.cols" in message


def test_shape_and_size_disagree(tmp_path):
    text = replace_once(SUITE_YAML, "size: rows*cols, shape: [rows, cols]}\n  - {name: y",
                        "size: rows*cols+1, shape: [rows, cols]}\n  - {name: y")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'name: small')}: cases[0]: buffer 'x': shape [3, 50] holds 150 elements but size gives 151" in message
    assert "cases[1]: buffer 'x': shape [64, 256] holds 16384 elements but size gives 16385" in message


def test_negative_size(tmp_path):
    text = SUITE_YAML.replace("size: rows*cols,", "size: rows*cols - 200,").replace("shape: [rows, cols]", "shape: [rows]")
    _, message = problems_of(tmp_path, text)
    assert "buffer 'x' gets a negative size (-50) in case 'small'" in message


def test_zero_grid_dimension(tmp_path):
    text = replace_once(SUITE_YAML, "rows: 3,", "rows: 0,")
    _, message = problems_of(tmp_path, text)
    assert (f"line {line_of(text, 'rows: 0')}: cases[0]: scale2 launch in case 'small': "
            "grid.x = 0 is outside 1..2147483647") in message
    assert "cases[1]" not in message


def test_launch_expression_failing_for_one_case(tmp_path):
    text = replace_once(SUITE_YAML, "block: [128]", 'block: ["256 // (cols - 50)"]')
    _, message = problems_of(tmp_path, text)
    assert "cases[0]: scale2 launch in case 'small'" in message
    assert "division by zero" in message


def test_several_problems_are_reported_together(tmp_path):
    text = replace_once(SUITE_YAML, "kind: performance", "kind: correctness")
    text = replace_once(text, "source: scale.cu", "source: nothere.cu")
    text = replace_once(text, "rows: 3,", "rows: 2.5,")
    error, message = problems_of(tmp_path, text)
    assert len(error.problems) == 3
    assert "needs kind: performance" in message
    assert "nothere.cu" in message
    assert "whole number" in message
    assert all(p.startswith("line ") for p in error.problems)


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
