"""benchmarks/public_kernels.py without a GPU: its arguments, and its tables rendered from saved JSON
(the measurement itself runs on the GPU machine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import public_kernels  # noqa: E402
from evidence_header import with_header  # noqa: E402
from pytest_cudagate.boundary import schema  # noqa: E402

REDUCTION = ["reduce0", "reduce1", "reduce2", "reduce3", "reduce4", "reduce5", "reduce6"]


def row(suite: str, kernel: str, case: str, median: float | None, verdict: str = "passed", message: str = "") -> dict:
    project = "cuda_samples" if suite.startswith("cuda_samples") else "sgemm_cuda"
    return {"project": project, "suite": suite, "kernel": kernel, "case": case,
            "kind": "performance" if median is not None else "correctness", "verdict": verdict,
            "message": message, "median_ms": median, "launches": 100 if median is not None else 0}


def reduction_rows(medians: list[float]) -> list[dict]:
    suite_of = {k: ("cuda_samples_reduce_blocks" if k in REDUCTION[:3] else
                    "cuda_samples_reduce_pairs" if k in REDUCTION[3:6] else "cuda_samples_reduce_grid_stride")
                for k in REDUCTION}
    rows = [row(suite_of[k], k, "correct_1001", None) for k in REDUCTION]
    return rows + [row(suite_of[k], k, "perf_4194303", m) for k, m in zip(REDUCTION, medians)]


def document(rows: list[dict]) -> dict:
    meta = {"command": "python benchmarks/public_kernels.py --quick", "date": "2026-12-10 10:00 UTC",
            "gpu": "NVIDIA H100 80GB HBM3", "quick": True, "session": "h100-20261210T100000"}
    return with_header({"meta": meta, "rows": rows}, BENCHMARKS / "public_kernels.py", ["--quick"],
                       card="NVIDIA H100 80GB HBM3")


def saved(tmp_path: Path, rows: list[dict], name: str = "public-kernels-h100.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document(rows)))
    return path


def test_a_saved_run_renders_a_table_per_project_with_the_published_order(tmp_path, capsys):
    rows = reduction_rows([4.1, 2.0, 1.1, 0.61, 0.40, 0.33, 0.21])
    rows += [row("sgemm_cuda", "k01_naive", "correct_136x136x136", None),
             row("sgemm_cuda", "k03_smem_caching", "correct_136x136x136", None, "failed",
                 "the kernel wrote past the end of buffer 'C': 64 canary bytes of its guard zone changed")]
    path = saved(tmp_path, rows)
    assert schema.problems(json.loads(path.read_text()), "public-kernels") == []
    assert public_kernels.main(["--merge", str(path)]) == 0
    out = capsys.readouterr().out
    assert "**cuda_samples**" in out and "**sgemm_cuda**" in out
    assert "| cuda_samples_reduce_blocks | reduce0 | passed | perf_4194303 4.1000 | 1 | 1 |" in out
    assert "| cuda_samples_reduce_grid_stride | reduce6 | passed | perf_4194303 0.2100 | 7 | 7 |" in out
    assert "Measured order matches the published order (perf_4194303): yes." in out
    assert "https://developer.download.nvidia.com/assets/cuda/files/reduction.pdf" in out
    assert ("| sgemm_cuda | k03_smem_caching | failed correct_136x136x136: the kernel wrote past the end of buffer "
            "'C'") in out
    assert "Measured order matches the published order (perf_2048): not measured: k01_naive" in out


def test_a_version_faster_than_published_is_named(tmp_path, capsys):
    path = saved(tmp_path, reduction_rows([4.1, 2.0, 1.1, 0.61, 0.30, 0.33, 0.21]))
    assert public_kernels.main(["--merge", str(path)]) == 0
    assert ("Measured order matches the published order (perf_4194303): no, against the published order reduce4 "
            "is faster than reduce5.") in capsys.readouterr().out


def test_merge_joins_the_files_of_a_split_run(tmp_path, capsys):
    rows = reduction_rows([4.1, 2.0, 1.1, 0.61, 0.40, 0.33, 0.21])
    first = saved(tmp_path, [r for r in rows if r["suite"] != "cuda_samples_reduce_grid_stride"], "public-kernels-a.json")
    second = saved(tmp_path, [r for r in rows if r["suite"] == "cuda_samples_reduce_grid_stride"], "public-kernels-b.json")
    assert public_kernels.main(["--merge", str(first), str(second)]) == 0
    assert "(perf_4194303): yes." in capsys.readouterr().out


@pytest.mark.parametrize("argv, said", [
    (["--suite", "nosuch"], "public_kernels: --suite 'nosuch' is not a public suite; the suites: "
                            "cuda_samples_reduce_blocks, cuda_samples_reduce_grid_stride"),
    (["--merge", "x.json", "--quick"], "public_kernels: --merge prints the tables of kept files: it takes no --quick"),
])
def test_a_wrong_argument_is_one_line_and_exit_2(capsys, argv, said):
    assert public_kernels.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


def test_a_file_that_breaks_the_schema_is_refused_naming_it(tmp_path, capsys):
    broken = document(reduction_rows([1.0] * 7))
    broken["rows"][0]["verdict"] = "maybe"
    path = tmp_path / "public-kernels-broken.json"
    path.write_text(json.dumps(broken))
    assert public_kernels.main(["--merge", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"public_kernels: {path}: ") and "maybe" in err and err.count("\n") == 1, err


def test_quick_copies_time_fewer_launches_without_a_sanitizer(tmp_path):
    folder = public_kernels.suites(["llm_c_softmax_forward"])[0]
    copy = public_kernels.quick_copy(folder, tmp_path / "softmax_forward")
    from pytest_cudagate.suite.loader import load_suite

    suite = load_suite(copy / "cudagate.yaml")
    assert (suite.timing.warmup, suite.timing.repeat) == (2, 10)
    assert not suite.checks.sanitizer
    assert (folder / "cudagate.yaml").read_text() != (copy / "cudagate.yaml").read_text()
