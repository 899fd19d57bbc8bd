"""`requires:` over derived scalars (issue 44): a kernel's preconditions may read what `derived:`
computes from the case's scalars, through `cudagate check` and `pytest --cuda-gate` on the fake GPU."""

from __future__ import annotations

from fake_worker import fake_gpu_project
from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main

# n = rows * cols is 150 on `small` and 16384 on `perf`: the wide version takes perf only.
DERIVED_YAML = replace_once(SUITE_YAML, "cases:\n", """\
  - name: scale2_wide
    source: scale.cu
    entry: scale2
    requires: ["n % 256 == 0", "half >= 100"]
    launch: {grid: [rows], block: [128]}
derived: {n: rows * cols, half: n // 2}
cases:
""")
SKIP = "kernel scale2_wide requires n % 256 == 0 (n=150): case small is not one of its cases"


def test_check_skips_a_case_by_a_derived_scalar(tmp_path, capsys):
    path = write_suite(tmp_path / "scale", yaml_text=DERIVED_YAML)
    code = main(["check", "--allow-unsigned", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"  skips: {SKIP}" in out.splitlines()


def test_the_gate_skips_a_case_by_a_derived_scalar(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=DERIVED_YAML)
    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", "-rs", timeout=180)
    result.stdout.fnmatch_lines_random(["*cudagate.yaml::scale2_wide::perf PASSED*",
                                        "*cudagate.yaml::scale2_wide::small SKIPPED*", f"SKIPPED*{SKIP}"])
    result.assert_outcomes(passed=5, skipped=1)


def test_a_requires_over_an_unknown_name_is_one_line(tmp_path, capsys):
    path = write_suite(tmp_path / "scale", yaml_text=DERIVED_YAML.replace("half >= 100", "quarter >= 100"), data=False)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("kernels[1].requires[1]: 'quarter >= 100' uses quarter, which is neither a scalar parameter nor a "
            "derived scalar (scalars: cols, half, n, rows); name those only") in err
    assert "Traceback" not in err
