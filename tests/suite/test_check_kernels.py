"""`kernels:` (suite/check_kernels.py): each name once, launch overrides for cases the suite has."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, problems_of, replace_once


def test_duplicate_kernel_names(tmp_path):
    text = replace_once(SUITE_YAML, "cases:\n", "  - name: scale2\n    source: scale.cu\n"
                                               "    launch: {grid: [rows], block: [64]}\ncases:\n")
    _, message = problems_of(tmp_path, text)
    second = [n for n, line in enumerate(text.splitlines(), 1) if "name: scale2" in line][1]
    assert f"line {second}: kernels[1].name: kernel name 'scale2' is used twice" in message


def test_launch_override_for_an_unknown_case(tmp_path):
    text = replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                        "    launch: {grid: [rows], block: [128]}\n    launch_overrides:\n"
                        "      nosuch: {grid: [1], block: [32]}\n")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'nosuch')}: kernels[0].launch_overrides.nosuch: no case named 'nosuch' (cases: perf, small)" in message
