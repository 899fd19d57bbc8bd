"""Every expression evaluated on every case (suite/check_resolved.py): sizes, shapes and launches that do
not fit a case are named with it."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, problems_of, replace_once


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
