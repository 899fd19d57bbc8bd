"""Per-kernel preconditions and parameters (issue 44, item 2): `requires:`, `args:` on a one-launch
kernel and `outputs:`, through `cudagate check`, `pytest --cuda-gate` on the fake GPU and signing."""

from __future__ import annotations

import pytest

from fake_worker import fake_gpu_project
from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.trust.cli import main as trust_main
from trust_project import clean_env, project  # noqa: F401 (fixtures)

# A second version of the scale kernel that needs cols a multiple of 4, at least 64: the `small`
# case (cols 50) is not one of its cases.
WIDE = """\
  - name: scale2_wide
    source: scale.cu
    entry: scale2
    requires: ["cols % 4 == 0", "cols >= 64"]
    launch: {grid: [rows], block: [128]}
"""
REQUIRES_YAML = replace_once(SUITE_YAML, "cases:\n", WIDE + "cases:\n")
SKIP = "kernel scale2_wide requires cols % 4 == 0 (cols=50): case small is not one of its cases"


def cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def test_check_says_which_cases_a_kernel_skips(tmp_path, capsys):
    path = write_suite(tmp_path / "scale", yaml_text=REQUIRES_YAML)
    code, out = cli(capsys, "check", "--allow-unsigned", path)
    assert code == 0, out
    assert f"  skips: {SKIP}" in out.splitlines()
    assert out.count("skips:") == 1  # scale2 has no requires; perf (cols 256) meets scale2_wide's


def test_a_case_that_breaks_a_kernels_requires_is_skipped_for_that_kernel_only(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=REQUIRES_YAML)
    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", "-rs", timeout=180)
    result.stdout.fnmatch_lines_random([
        "*cudagate.yaml::scale2::small PASSED*",
        "*cudagate.yaml::scale2::perf PASSED*",
        "*cudagate.yaml::scale2_wide::perf PASSED*",
        "*cudagate.yaml::scale2_wide::small SKIPPED*",
        f"SKIPPED*{SKIP}",
    ])
    result.assert_outcomes(passed=5, skipped=1)  # two compile items, three cases


ARGS_YAML = replace_once(
    replace_once(SUITE_YAML, "  - {name: rows, scalar: int32}\n",
                 "  - {name: ws, buffer: float32, intent: scratch, size: rows*cols}\n  - {name: rows, scalar: int32}\n"),
    "    launch: {grid: [rows], block: [128]}\n",
    "    args: [x, y, rows, cols]\n    outputs: [y]\n    launch: {grid: [rows], block: [128]}\n")


def test_a_one_launch_kernel_takes_the_parameters_its_args_name(pytester, monkeypatch):
    """The fused version ignores the suite's workspace: it takes x, y, rows, cols only (the fake
    scale kernel refuses any other parameter list)."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=ARGS_YAML)
    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", timeout=180)
    result.stdout.fnmatch_lines_random(["*cudagate.yaml::scale2::small PASSED*", "*cudagate.yaml::scale2::perf PASSED*"])
    result.assert_outcomes(passed=3)


def test_requires_and_outputs_are_signed(project, monkeypatch, capsys):  # noqa: F811 (fixture)
    monkeypatch.chdir(project.root)
    project.edit(lambda raw: raw["kernels"][0].update(requires=["cols >= 128"]))
    assert trust_main(["verify", str(project.suite_file)]) == 1
    out = capsys.readouterr().out
    assert "kernels.softmax_rows.requires: added ([cols >= 128])" in out
    project.sign()
    assert project.verify().ok
    project.edit(lambda raw: raw["kernels"][0].update(requires=["cols >= 1"], outputs=["y"]))
    assert trust_main(["verify", str(project.suite_file)]) == 1
    out = capsys.readouterr().out
    assert "kernels.softmax_rows.requires: [cols >= 128] → [cols >= 1]" in out
    assert "kernels.softmax_rows.outputs: added ([y])" in out


@pytest.mark.parametrize("kernel, line", [
    ('requires: ["cols % 4"]', "kernels[0].requires[0]: 'cols % 4' is not a condition (true or false); write a "
                               "comparison (== != < <= > >=) of integer expressions over the scalars, joined by and, "
                               "or, not, e.g. 'C % 4 == 0'"),
    ('requires: ["width >= 4"]', "kernels[0].requires[0]: 'width >= 4' uses width, which is not a scalar parameter "
                                 "(scalars: cols, rows); name scalars only"),
    ('requires: ["cols >= 100000"]', "kernels[0].requires: kernel 'scale2' meets its requires on no non-holdout "
                                     "performance case; add a case that meets them, or loosen them"),
    ("outputs: [x]", "kernels[0].outputs[0]: 'x' is a buffer of intent in; name outputs of the signature (intent out "
                     "or inout: y)"),
    ("args: [x, rows, cols, z]", "kernels[0].args[3]: 'z' is not a parameter of the signature (parameters: x, y, "
                                 "rows, cols)"),
    ("args: [x, rows, cols]\n    outputs: [y]", "kernels[0].outputs[0]: output 'y' is judged but no step takes it; add "
                                                "it to the `args` of the step that writes it, or remove it from "
                                                "`outputs`"),
    ("args: [x, rows, cols]", "kernels[0].args: output buffer 'y' is not in `args`, so it is never written; add it, "
                              "or name the outputs the kernel is judged on in `outputs:`"),
])
def test_bad_per_kernel_fields_are_one_line_each(tmp_path, capsys, kernel, line):
    text = replace_once(SUITE_YAML, "    source: scale.cu\n", f"    source: scale.cu\n    {kernel}\n")
    path = write_suite(tmp_path / "scale", yaml_text=text, data=False)
    code, out = cli(capsys, "check", path)
    assert code == EXIT_INPUT, out
    assert line in out, out
