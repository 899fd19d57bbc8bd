"""--cuda-gate-benchmark-json: pytest-benchmark's own loader and compare command read the file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from report_fixtures import as_report, build_scenario, built_report
from pytest_cudagate.reports.benchmark_json import benchmark_document

pytest.importorskip("pytest_benchmark", reason="pytest-benchmark is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench")
    document = built_report(build_scenario(base / "scale")).document
    path = base / "0001_cudagate.json"
    path.write_text(json.dumps(benchmark_document(as_report(document), base)))
    return document, path


def test_the_file_loads_with_pytest_benchmarks_storage(saved):
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage

    document, path = saved
    storage = FileStorage(path.parent, logger=Logger(Logger.QUIET), default_machine_id="cudagate")
    loaded = {b["fullname"]: b for b in storage.load_benchmarks(str(path))}
    assert set(loaded) == {"scale/cudagate.yaml::scale2::perf", "scale/cudagate.yaml::scale2::perf@approved",
                           "scale/cudagate.yaml::scale2::perf_wide", "scale/cudagate.yaml::scale2::perf_wide@approved",
                           "scale/cudagate.yaml::scale2::perf_tall"}
    perf = loaded["scale/cudagate.yaml::scale2::perf"]
    current_ms = next(i for i in document["items"] if i["case"] == "perf")["latency"]["current"]["median"]
    assert perf["median"] == pytest.approx(current_ms / 1000, rel=1e-4)  # seconds, not ms
    assert perf["rounds"] == 800 and perf["extra_info"]["latency_verdict"] == "regressed"


def test_statistics_match_pytest_benchmarks(saved):
    from pytest_benchmark.stats import Stats

    _, path = saved
    for bench in json.loads(path.read_text())["benchmarks"]:
        reference = Stats()
        for value in bench["stats"]["data"]:
            reference.update(value)
        for field in Stats.fields:
            expected = getattr(reference, field)
            assert bench["stats"][field] == (expected if isinstance(expected, str) else pytest.approx(expected, rel=1e-12)), field


def test_pytest_benchmark_compare_reads_it(saved):
    _, path = saved
    result = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path), "--columns=min,median,max"],
                            capture_output=True, text=True, timeout=120, cwd=path.parent)
    assert result.returncode == 0, result.stderr
    assert "Failed to load" not in result.stdout + result.stderr
    assert "scale2[perf]" in result.stdout and "scale2[perf]@approved" in result.stdout
    assert "time in us" in result.stdout  # it scaled seconds to microseconds: the unit is right
