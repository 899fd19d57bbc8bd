"""The loader's checker (suite/checker.py): every problem of a suite file is reported, all at once, each on
its line."""

from __future__ import annotations

from helpers import SUITE_YAML, problems_of, replace_once


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
