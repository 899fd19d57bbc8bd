"""Per-kernel preconditions and parameters (issue 44, item 2): `requires:`, `args:` on a one-launch
kernel and `outputs:`, through `cudagate check`, `pytest --cuda-gate` on the fake GPU and signing."""

from __future__ import annotations

import json

import pytest

from fake_worker import fake_gpu_project, install, scale_kernels, scale_xy
from helpers import KERNEL_CU, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.defences.sanitizer import sanitizer_case
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust.approvals import Ledger
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


@pytest.mark.slow
def test_a_case_that_breaks_a_kernels_requires_is_skipped_for_that_kernel_only(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=REQUIRES_YAML)
    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", "-rs", "--cuda-gate-report", "out", timeout=180)
    result.stdout.fnmatch_lines_random([
        "*cudagate.yaml::scale2::small PASSED*",
        "*cudagate.yaml::scale2::perf PASSED*",
        "*cudagate.yaml::scale2_wide::perf PASSED*",
        "*cudagate.yaml::scale2_wide::small SKIPPED*",
        f"SKIPPED*{SKIP}",
    ])
    result.assert_outcomes(passed=5, skipped=1)  # two compile items, three cases
    # The report leaves the absent case out: it is no skip of the gate's (which would make the run a warning).
    document = json.loads((pytester.path / "out" / "report.json").read_text(encoding="utf-8"))
    assert document["counts"]["skipped"] == 0 and document["counts"]["passed"] == 5
    assert {(i["kernel"], i["case"]) for i in document["items"]} == {("scale2", "small"), ("scale2", "perf"),
                                                                    ("scale2_wide", "perf")}


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
    ("args: [x, rows, cols, z]", "kernels[0].args[3]: 'z' is not a parameter of the signature (parameters: x, y, "
                                 "rows, cols)"),
    ("args: [x, rows, cols]", "kernels[0].args: output buffer 'y' is not in `args`, so it is never written; add it, "
                              "or name the outputs the kernel is judged on in `outputs:`"),
])
def test_bad_args_of_a_one_launch_kernel_are_one_line_each(tmp_path, capsys, kernel, line):
    text = replace_once(SUITE_YAML, "    source: scale.cu\n", f"    source: scale.cu\n    {kernel}\n")
    path = write_suite(tmp_path / "scale", yaml_text=text, data=False)
    code, out = cli(capsys, "check", path)
    assert code == EXIT_INPUT, out
    assert line in out, out


TWO_OUTPUTS_YAML = replace_once(replace_once(replace_once(
    SUITE_YAML, "  - {name: rows, scalar: int32}\n",
    "  - {name: z, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}\n  - {name: rows, scalar: int32}\n"),
    "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n", "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n  z: {atol: 1.0e-6, rtol: 1.0e-5}\n"),
    "    launch: {grid: [rows], block: [128]}\n", """\
    args: [x, y, rows, cols]
    outputs: [y]
    launch: {grid: [rows], block: [128]}
  - name: lazy
    source: scale.cu
    entry: both_bad
    outputs: [z]
    launch: {grid: [rows], block: [128]}
  - name: full
    source: scale.cu
    entry: both_bad
    launch: {grid: [rows], block: [128]}
""")
TWO_OUTPUTS_REFERENCE = """\
import numpy as np


def scale_rows(x, rows, cols):
    x = x.astype(np.float64).reshape(rows, cols)
    return (x * 2).astype(np.float32), (x + 1).astype(np.float32)
"""
TWO_OUTPUTS_CU = KERNEL_CU + """
extern "C" __global__ void both_bad(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ z,
                                    int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        y[r * cols + c] = 3.0f * x[r * cols + c];
        z[r * cols + c] = x[r * cols + c] + 1.0f;
    }
}
"""
# The fake GPU runs the same: scale2 writes y = 2x only; both_bad writes z = x + 1 right and y = 3x wrong.
TWO_OUTPUTS_CONFTEST = """
import os
import sys

import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, scale_kernels, use_client  # noqa: E402

PARAMS = SCALE_PARAMS[:2] + [{{"name": "z", "kind": "buffer", "dtype": "float32", "intent": "out"}}] + SCALE_PARAMS[2:]


def both_bad(launch):
    n = launch.args["rows"] * launch.args["cols"]
    x = launch.array("x", np.float32, n)
    launch.array("y", np.float32, n)[:] = 3 * x
    launch.array("z", np.float32, n)[:] = x + 1


use_client(lambda **options: FakeWorker({{**scale_kernels(), "both_bad": FakeKernel(both_bad, PARAMS)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


@pytest.mark.slow
def test_a_kernel_is_judged_on_the_outputs_it_names_only(pytester, monkeypatch):
    from pathlib import Path

    from pytest_cudagate.defences.expected import generate

    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    path = write_suite(pytester.path / "scale", yaml_text=TWO_OUTPUTS_YAML, data=False, kernel_source=TWO_OUTPUTS_CU)
    (path.parent / "reference.py").write_text(TWO_OUTPUTS_REFERENCE, encoding="utf-8")
    generate(load_suite(path))
    (pytester.path / "conftest.py").write_text(TWO_OUTPUTS_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", timeout=180)
    result.stdout.fnmatch_lines_random([
        "*cudagate.yaml::scale2::small PASSED*",  # z is not among its args, and not judged
        "*cudagate.yaml::lazy::small PASSED*",  # its y is wrong, but it is judged on z only
        "*cudagate.yaml::full::small FAILED*",  # judged on every output: y is wrong
    ])
    assert "output 'y'" in result.stdout.str()
    result.assert_outcomes(passed=7, failed=2)


def wide_only(launch):
    """Right where cols is a multiple of 4 (its precondition), garbage elsewhere."""
    x, y, _ = scale_xy(launch)
    y[:] = 2 * x if launch.args["cols"] % 4 == 0 else -1


def test_approve_leaves_out_the_cases_a_kernel_requires_away(tmp_path, monkeypatch, capsys):
    suite_path = write_suite(tmp_path / "scale")
    workers = install(monkeypatch, tmp_path, scale_kernels(wide_only))
    # Without its precondition the kernel fails the small case (cols 50) and is refused.
    assert main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"]) == 1
    assert "scale2: NOT approved" in capsys.readouterr().out
    suite_path.write_text(replace_once(SUITE_YAML, "    source: scale.cu\n",
                                       '    source: scale.cu\n    requires: ["cols % 4 == 0"]\n'), encoding="utf-8")
    asked_before = sum(len(worker.requests) for worker in workers)
    code = main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"])
    assert code == 0, capsys.readouterr().out
    later = [r for worker in workers for r in worker.requests][asked_before:]
    assert later and "small" not in {c["name"] for r in later for c in r.get("cases", [])}  # never run or baselined
    (baseline,) = Ledger.for_suite(load_suite(suite_path)).approvals["scale2"].baselines.values()
    assert set(baseline.cases) == {"perf"}


def test_check_builds_no_class_variant_only_absent_cases_run(tmp_path, capsys):
    text = replace_once(replace_once(
        SUITE_YAML, "    source: scale.cu\n",
        '    source: scale.cu\n    requires: ["cols >= 64"]\n    classes: {narrow: {options: ["-DNARROW=1"]}}\n'),
        "{name: small, kind: correctness, scalars:", "{name: small, kind: correctness, class: narrow, scalars:")
    path = write_suite(tmp_path / "scale", yaml_text=text)
    code, out = cli(capsys, "check", "--allow-unsigned", path)
    assert code == 0, out
    assert "scale2: compiles" in out
    assert "variant of class narrow" not in out  # only the small case (cols 50, absent) runs that build


def test_compute_sanitizer_runs_a_kernel_on_a_case_it_requires(tmp_path):
    """The suite's smallest correctness case (small, cols 50) is not one of scale2_wide's: the sanitizer
    runs it on its own smallest (a correctness case it meets), not on none at all."""
    yaml_text = replace_once(REQUIRES_YAML, "  - {name: perf,",
                             "  - {name: wide, kind: correctness, scalars: {rows: 5, cols: 64}}\n  - {name: perf,")
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=yaml_text))
    assert sanitizer_case(suite, "scale2").name == "small"
    assert sanitizer_case(suite, "scale2_wide").name == "wide"
