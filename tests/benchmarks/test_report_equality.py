"""benchmarks/report_equality.py: times apart, two reports of the same examples must say the same."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

from pytest_cudagate.boundary import schema

ROOT = Path(__file__).resolve().parents[2]
ITEM = {"nodeid": "s.yaml::k::perf", "status": "warning", "phases": {"timing": 0.5}, "worker_s": 0.7,
        "warning": "latency pass: today's run level is +0.4% of the approved runs",
        "latency": {"verdict": "pass", "samples_ms": [0.1, 0.2]},
        "correctness": {"passed": False, "median_ms": 0.1, "comparisons": [{"mismatches": 12, "max_abs_error": 3.5}]},
        "requests": [{"output_dir": "/dev/shm/cudagate-run-123-abcd/k"}],
        "reproduce": ["cudagate run /tmp/before-report/requests/s-k-perf-5956ebdd.json",
                      "cudagate run requests/s-k-perf-5956ebdd.json"]}


def equality(tmp_path: Path, after_item: dict) -> subprocess.CompletedProcess:
    for name, item in (("before", ITEM), ("after", after_item)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"items": [item], "runs": [{}]}))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report_equality.py"), "before.json", "after.json",
                           "--json", "report-equality-1.json"], cwd=tmp_path, capture_output=True, text=True)


def test_times_and_run_folders_are_not_differences(tmp_path):
    after = copy.deepcopy(ITEM)
    after.update(phases={"timing": 0.4, "ipc": 0.1}, worker_s=0.6,
                 warning="latency pass: today's run level is -1.2% of the approved runs")
    after["latency"]["samples_ms"] = [0.1, 0.2, 0.3]
    after["correctness"]["median_ms"] = 0.11
    after["requests"][0]["output_dir"] = "/dev/shm/cudagate-run-456-wxyz/k"
    after["reproduce"] = ["cudagate run /tmp/after-report/requests/s-k-perf-5956ebdd.json",  # another --cuda-gate-report
                          "cudagate run '/tmp/my report/requests/s-k-perf-5956ebdd.json'"]
    after["head_start_s"] = 0.25  # a time the code before did not record
    done = equality(tmp_path, after)
    assert done.returncode == 0, done.stdout
    assert "| differences | 0 |" in done.stdout
    kept = json.loads((tmp_path / "report-equality-1.json").read_text())
    assert schema.problems(kept, "report-equality") == []


def test_a_changed_verdict_or_a_missing_field_is_a_difference(tmp_path):
    after = copy.deepcopy(ITEM)
    after["latency"]["verdict"] = "regressed"
    del after["warning"]
    after["correctness"]["comparisons"][0]["mismatches"] = 4000  # the same seed: a correctness figure is exact
    after["headline"] = "output 'y': 4000 of 16384 elements outside tolerance"  # words are compared masked
    after["reproduce"] = ["cudagate run /tmp/after-report/requests/s-k-large-5956ebdd.json",  # another request
                          ITEM["reproduce"][1]]
    del after["correctness"]["median_ms"]  # a time one side lacks: a time
    done = equality(tmp_path, after)
    assert done.returncode == 1
    assert "| differences | 5 |" in done.stdout, done.stdout
    assert '- s.yaml::k::perf.reproduce[0]: "cudagate run <report>/requests/s-k-perf-5956ebdd.json" before' in done.stdout
    assert "- s.yaml::k::perf.correctness.comparisons[0].mismatches: 12 before, 4000 after" in done.stdout
    assert "- s.yaml::k::perf.headline: only after" in done.stdout
    assert '- s.yaml::k::perf.latency.verdict: "pass" before, "regressed" after' in done.stdout
    assert "- s.yaml::k::perf.warning: only before" in done.stdout


def test_a_measured_block_that_one_side_lacks_is_a_difference_where_it_holds_a_verdict(tmp_path):
    after = copy.deepcopy(ITEM)
    del after["latency"]  # the verdict went with it
    done = equality(tmp_path, after)
    assert done.returncode == 1 and "| differences | 1 |" in done.stdout, done.stdout
    assert "- s.yaml::k::perf.latency: only before" in done.stdout
