"""The files a suite names (suite/check_files.py): a kernel source or a Python reference that is not there."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, problems_of, replace_once


def test_missing_kernel_source(tmp_path):
    text = replace_once(SUITE_YAML, "source: scale.cu", "source: nothere.cu")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nothere.cu')}: kernels[0].source: file 'nothere.cu' not found next to the suite" in message


def test_missing_python_reference(tmp_path):
    text = replace_once(SUITE_YAML, "python: reference.py:", "python: nope.py:")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nope.py')}: reference.python: file 'nope.py' not found" in message
