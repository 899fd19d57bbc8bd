"""A kernel's `requires:` and `outputs:` (suite/check_requires.py): conditions over the scalars that leave it a
latency case, outputs of the signature a step writes; each problem one line of `cudagate check`."""

from __future__ import annotations

import pytest

from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT


@pytest.mark.parametrize("kernel, line", [
    ('requires: ["cols % 4"]', "kernels[0].requires[0]: 'cols % 4' is not a condition (true or false); write a "
                               "comparison (== != < <= > >=) of integer expressions over the scalars, joined by and, "
                               "or, not, e.g. 'C % 4 == 0'"),
    ('requires: ["width >= 4"]', "kernels[0].requires[0]: 'width >= 4' uses width, which is neither a scalar "
                                 "parameter nor a derived scalar (scalars: cols, rows); name those only"),
    ('requires: ["cols >= 100000"]', "kernels[0].requires: kernel 'scale2' meets its requires on no non-holdout "
                                     "performance case; add a case that meets them, or loosen them"),
    ("outputs: [x]", "kernels[0].outputs[0]: 'x' is a buffer of intent in; name outputs of the signature (intent out "
                     "or inout: y)"),
    ("args: [x, rows, cols]\n    outputs: [y]", "kernels[0].outputs[0]: output 'y' is judged but no step takes it; add "
                                                "it to the `args` of the step that writes it, or remove it from "
                                                "`outputs`"),
])
def test_bad_requires_and_outputs_are_one_line_each(tmp_path, capsys, kernel, line):
    text = replace_once(SUITE_YAML, "    source: scale.cu\n", f"    source: scale.cu\n    {kernel}\n")
    path = write_suite(tmp_path / "scale", yaml_text=text, data=False)
    assert main(["check", str(path)]) == EXIT_INPUT
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "Traceback" not in out
    assert line in out, out
