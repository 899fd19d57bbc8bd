"""`tolerance:` (suite/check_tolerance.py): one for each output, and none for a buffer that is not one."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, problems_of, replace_once


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
