"""The `cudagate` command: check, cases generate, run (no GPU here), --version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import BROKEN_CU, EXAMPLES, SUITE_YAML, line_of, replace_once, write_suite
from pytest_cudagate import __version__
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_FAILED, EXIT_INPUT, EXIT_NO_GPU
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.loader import load_suite


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- check ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_the_examples(capsys):
    code, out, err = run(capsys, "check", EXAMPLES)
    assert code == 0, out + err
    assert "suite 'matmul' is valid (1 kernel(s), 5 case(s))" in out
    assert "suite 'softmax' is valid (1 kernel(s), 5 case(s))" in out
    assert "suite 'fir' is valid (1 kernel(s), 9 case(s))" in out
    assert "matmul_f32: compiles for sm_90" in out
    assert "reference: compiles for sm_90" in out  # matmul's CUDA reference is compiled too
    assert "softmax_rows: compiles for sm_90" in out
    assert "fir_valid: compiles for sm_90" in out
    assert "suite 'rmsnorm' is valid (1 kernel(s), 5 case(s))" in out
    assert "rmsnorm_bf16: compiles for sm_90" in out  # a templated entry, with <cuda_bf16.h>
    assert "row_sums_split: compiles for sm_90" in out  # two steps
    assert "suite 'attention' is valid (1 kernel(s), 5 case(s))" in out  # cuBLAS, memset and kernel steps
    assert "attention_causal: compiles for sm_90" in out
    registers = [line for line in out.splitlines() if "registers" in line]
    assert len(registers) == 7
    assert all(line.split("; ")[1].split()[0].isdigit() for line in registers)
    assert err == ""


def test_check_a_suite_twice_uses_the_cache(capsys, suite_path, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    assert run(capsys, "check", "--allow-unsigned", suite_path)[0] == 0
    code, out, _ = run(capsys, "check", "--allow-unsigned", suite_path)
    assert code == 0 and "(cached)" in out


def test_check_several_architectures(capsys, suite_path):
    code, out, _ = run(capsys, "check", "--allow-unsigned", suite_path, "--arch", "sm_80", "--arch", "sm_90")
    assert code == 0
    assert "scale2: compiles for sm_80" in out
    assert "scale2: compiles for sm_90" in out


def test_check_arch_defaults_to_the_project_setting_else_sm_90(capsys, tmp_path):
    """What `check --help` says: the nearest pyproject.toml's [tool.cudagate] arch, else sm_90."""
    path = write_suite(tmp_path / "project" / "suites" / "s")
    code, out, _ = run(capsys, "check", "--allow-unsigned", path)
    assert code == 0 and "scale2: compiles for sm_90" in out, out
    (tmp_path / "project" / "pyproject.toml").write_text('[tool.cudagate]\narch = "sm_80"\n')
    code, out, _ = run(capsys, "check", "--allow-unsigned", path)
    assert code == 0 and "scale2: compiles for sm_80" in out and "sm_90" not in out, out
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert ("(default: `arch` of [tool.cudagate] in the pyproject.toml nearest above each suite, else sm_90;"
            in " ".join(capsys.readouterr().out.split()))


def test_check_a_bad_suite(capsys, tmp_path):
    text = replace_once(SUITE_YAML, "rows: 3,", "rows: 2.5,")
    path = write_suite(tmp_path / "s", yaml_text=text, data=False)
    code, out, err = run(capsys, "check", "--allow-unsigned", path)
    assert code == EXIT_INPUT == 2
    assert str(path) in err
    assert f"line {line_of(text, 'rows: 2.5')}: cases[0].scalars.rows" in err
    assert "whole number" in err
    assert "Traceback" not in err


def test_check_a_suite_with_a_compile_error(capsys, tmp_path):
    path = write_suite(tmp_path / "s", kernel_source=BROKEN_CU)
    code, out, _ = run(capsys, "check", "--allow-unsigned", path)
    assert code == EXIT_FAILED == 1
    assert "scale2: does NOT compile for sm_90" in out
    assert "scale.cu(3): error" in out


def test_check_bad_case_data(capsys, suite_path):
    np.save(suite_path.parent / "cases" / "perf" / "x.npy", np.zeros(3, dtype=np.float32))
    code, out, _ = run(capsys, "check", "--allow-unsigned", suite_path)
    assert code == EXIT_INPUT  # bad input (issue 13)
    assert "case perf:" in out and "holds 3 elements" in out
    assert "cudagate cases generate" in out
    assert "scale2: compiles for sm_90" in out  # still compiled and reported


def test_check_with_nothing_to_check(capsys, tmp_path):
    code, _, err = run(capsys, "check", tmp_path)
    assert code == EXIT_INPUT
    assert "no cudagate.yaml found" in err


def test_check_requires_a_suite(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["check"])
    assert excinfo.value.code == 2


# -- cases generate ----------------------------------------------------------------------------------

def test_cases_generate_with_a_python_reference(capsys, tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    code, out, err = run(capsys, "cases", "generate", path)
    assert code == 0, err
    suite = load_suite(path)
    assert [line for line in out.splitlines()] == [f"wrote {suite.data_dir / c.name}" for c in suite.cases]
    assert run(capsys, "check", "--allow-unsigned", path)[0] == 0  # the data it wrote passes the checks


def test_cases_generate_one_case(capsys, tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    code, out, _ = run(capsys, "cases", "generate", path, "--case", "perf")
    assert code == 0
    assert out.strip().endswith("perf")
    assert not (path.parent / "cases" / "small").exists()


@pytest.mark.parametrize("dtype, low", [("int32", -100), ("uint8", 0), ("float32", -100)])
def test_integers_without_bounds_draw_the_default_range(capsys, tmp_path, dtype, low):
    """`{distribution: integers}` alone draws in [-100, 100] (unsigned [0, 100]), as an integer buffer
    without `inputs` does (schemas/suite.schema.json), never only -1, 0 and 1."""
    text = replace_once(SUITE_YAML, "{name: x, buffer: float32,", f"{{name: x, buffer: {dtype},")
    path = write_suite(tmp_path / "s", yaml_text=text + "inputs:\n  x: {distribution: integers}\n", data=False)
    code, _, err = run(capsys, "cases", "generate", path, "--case", "perf")
    assert code == 0, err
    x = np.load(path.parent / "cases" / "perf" / "x.npy")
    assert x.dtype == np.dtype(dtype) and x.min() == low and x.max() == 100


def test_switching_a_case_to_generated_removes_its_stale_arrays_only(capsys, tmp_path):
    """The arrays a case no longer stores would block `cudagate sign`: generate removes them, saying so,
    and touches no other case; switched back, the record and sample go the same way."""
    path = write_suite(tmp_path / "s")
    perf, small = path.parent / "cases" / "perf", path.parent / "cases" / "small"
    path.write_text(replace_once(SUITE_YAML, "cols: 256}}", "cols: 256}, generated: true}"))
    code, out, err = run(capsys, "cases", "generate", path, "--case", "perf")
    assert code == 0, err
    assert "removed" in out and f"perf{os.sep}x.npy: case 'perf' is generated now" in out, out
    assert sorted(p.relative_to(perf).as_posix() for p in perf.rglob("*.npy")) == ["sample/y.npy"]
    assert (small / "x.npy").is_file() and (small / "expected" / "y.npy").is_file()
    path.write_text(SUITE_YAML)
    code, out, err = run(capsys, "cases", "generate", path, "--case", "perf")
    assert code == 0 and f"perf{os.sep}generated.json: case 'perf' is stored now" in out, err
    assert not (perf / "generated.json").exists() and not (perf / "sample").exists()
    assert run(capsys, "check", "--allow-unsigned", path)[0] == 0


def test_cases_generate_warns_of_a_large_stored_case(capsys, tmp_path):
    """Over 64 MiB of arrays in one stored case (here 2048 x 4100 float32 values, in and out: 64.1 MiB) the
    warning suggests `generated: true`; a generated case of that size writes a few KiB and no warning."""
    big = replace_once(SUITE_YAML, "{rows: 64, cols: 256}", "{rows: 2048, cols: 4100}")
    path = write_suite(tmp_path / "s", yaml_text=big, data=False)
    code, out, err = run(capsys, "cases", "generate", path)
    assert code == 0, err
    assert out.count("warning: case") == 1, out
    assert ("warning: case 'perf' stores 64.1 MiB of arrays (over 64 MiB) to commit; `generated: true` on the case "
            "keeps only their digests and an output sample") in out, out
    path.write_text(replace_once(big, "cols: 4100}}", "cols: 4100}, generated: true}"))
    code, out, err = run(capsys, "cases", "generate", path, "--case", "perf")
    assert code == 0 and "warning: case" not in out and "removed" in out, out


def test_cases_generate_an_unknown_case(capsys, tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    code, _, err = run(capsys, "cases", "generate", path, "--case", "nope")
    assert code == EXIT_INPUT
    assert "no case 'nope'" in err


def test_cases_generate_with_a_cuda_reference_needs_a_gpu(capsys, tmp_path):
    text = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                        "  source: scale.cu\n  entry: scale2\n  launch: {grid: [rows], block: [128]}\n")
    path = write_suite(tmp_path / "s", yaml_text=text, data=False)
    code, _, err = run(capsys, "cases", "generate", path)
    assert code == EXIT_NO_GPU
    assert "no CUDA device" in err


# -- run ----------------------------------------------------------------------------------------------

def write_request(tmp_path, suite_path) -> Path:
    suite = load_suite(suite_path)
    request = run_request(suite, suite.kernels[0], list(suite.cases), output_dir=tmp_path / "out",
                          timing=suite.timing.to_json(), expected=True)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    return path


def test_run_without_a_gpu(capsys, tmp_path, suite_path):
    request = write_request(tmp_path, suite_path)
    code, out, err = run(capsys, "run", request)
    assert code == EXIT_NO_GPU == 3
    assert "no CUDA device" in err
    assert out == ""


def test_run_a_request_that_is_not_json(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"op": "run", ')
    code, _, err = run(capsys, "run", path)
    assert code == EXIT_INPUT
    assert str(path) in err and "cannot read the request" in err


def test_run_a_request_that_breaks_the_schema(capsys, tmp_path, suite_path):
    path = write_request(tmp_path, suite_path)
    request = json.loads(path.read_text())
    del request["kernel"]["source"]
    request["cases"][0]["launch"]["grid"] = [0, 1, 1]
    path.write_text(json.dumps(request))
    code, _, err = run(capsys, "run", path)
    assert code == EXIT_INPUT
    assert str(path) in err
    assert "kernel: 'source' is a required property" in err
    assert "cases[0].launch.grid[0]" in err


def test_run_a_missing_request(capsys, tmp_path):
    code, _, err = run(capsys, "run", tmp_path / "nope.json")
    assert code == EXIT_INPUT
    assert "nope.json" in err


# -- version and the console script ---------------------------------------------------------------------

def test_version(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"cudagate {__version__}"


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main([])
    assert excinfo.value.code == 2
    # one line, as every refusal of the command (tests/boundary/test_options.py)
    assert capsys.readouterr().err == ("cudagate: the following arguments are required: COMMAND; see `cudagate "
                                       "--help`\n")


def test_the_console_script(tmp_path):
    script = Path(sys.executable).with_name("cudagate")
    assert script.is_file(), "the cudagate console script is not installed next to this Python"
    text = replace_once(SUITE_YAML, "kind: performance", "kind: correctness")
    bad = write_suite(tmp_path / "bad", yaml_text=text, data=False)
    env = dict(os.environ)
    result = subprocess.run([str(script), "check", str(EXAMPLES / "softmax"), str(bad)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == EXIT_INPUT, result.stdout + result.stderr
    assert "suite 'softmax' is valid" in result.stdout
    assert "softmax_rows: compiles for sm_90" in result.stdout
    assert result.stderr.startswith(f"cudagate: {bad}")
    assert "needs kind: performance" in result.stderr
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"cudagate {__version__}"


HEAVY = ("numpy", "jsonschema", "git", "yaml")


def _loaded_by(argv: list[str]) -> tuple[str, list[str]]:
    code = ("import sys\nfrom pytest_cudagate.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    return done.stdout, done.stdout.strip().splitlines()[-1]


def test_cudagate_help_lists_every_command_and_imports_none_of_their_modules():
    """`cudagate --help` (and a mistyped command) load no subcommand's module; a subcommand's
    own --help loads its module, whose options it lists."""
    out, loaded = _loaded_by(["--help"])
    assert loaded == "[]"
    for name in ("check", "approve", "gate", "report", "history", "bisect", "optimize", "cases"):
        assert f"    {name}" in out
    assert _loaded_by(["nonsense"])[1] == "[]"
    out, loaded = _loaded_by(["report", "--help"])
    assert "merge" in out and loaded != "[]"
