"""`inputs:` (suite/check_inputs.py): a distribution for an input buffer only."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, problems_of


def test_inputs_for_a_non_input(tmp_path):
    text = SUITE_YAML + "inputs:\n  y: {distribution: normal}\n"
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'distribution: normal')}: inputs.y: 'y' is not an input buffer (inputs: x)" in message
