"""`cudagate optimize` end to end on the CPU: the loop, the gate of the winner, budgets, Ctrl-C and the
audit pack, with a fake harness layer (tests/optimize_fakes.py) and the replay proposer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from optimize_fakes import BROKEN_SOURCE, FakeEvaluator, fake_source, opt_suite, write_proposals
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.optimize.cli import EXIT_INTERRUPTED, EXIT_NO_WINNER, EXIT_WINNER, register, run_optimize
from pytest_cudagate.boundary.schema import problems as schema_problems

SCHEMAS = {"history.json": "optimize-history", "summary.json": "optimize-summary"}


def parse(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["optimize", *map(str, argv)])


def optimize(tmp_path: Path, suite: Path, *argv, evaluator: dict | None = None, **kwargs):
    """Run the command with a FakeEvaluator; (exit code, pack folder, summary, history, the evaluator)."""
    made = {}

    def factory(s, p, ledger):
        made["evaluator"] = FakeEvaluator(s, p, ledger, **(evaluator or {}))
        return made["evaluator"]

    results = tmp_path / "results"
    code = run_optimize(parse(suite, "scale2", "--allow-unsigned", "--results", results, "--quiet", *argv),
                        evaluator_factory=factory, **kwargs)
    pack = sorted(results.glob("run-*"))[-1]
    summary = json.loads((pack / "summary.json").read_text())
    history = json.loads((pack / "history.json").read_text())
    return code, pack, summary, history, made.get("evaluator")


def assert_pack_valid(pack: Path) -> None:
    for name, schema in SCHEMAS.items():
        assert schema_problems(json.loads((pack / name).read_text()), schema) == [], name
    for path in pack.glob("model-*.json"):
        assert schema_problems(json.loads(path.read_text()), "optimize-model-call") == [], path.name
    for path in pack.glob("best-case-*.json"):
        request = json.loads(path.read_text())
        assert schema_problems(request, "harness-request") == [], path.name
        for case in request["cases"]:  # `cudagate run` resolves these against the request's folder
            for spec in case["buffers"].values():
                if "input" in spec:
                    assert (pack / spec["input"]).is_file(), spec["input"]
            assert case["expected"] and all((pack / p).is_file() for p in case["expected"].values())
            assert case["tolerance"] and case["shapes"]
    assert json.loads((pack / "summary.json").read_text())["schema_problems"] == []
    assert not list(pack.glob(".*.tmp"))


@pytest.fixture
def suite(tmp_path) -> Path:
    return opt_suite(tmp_path / "scale")


def test_replay_run_picks_the_fast_correct_candidate_and_rejects_the_rest(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [
        {"marker": "latency=0.030", "label": "slow"},
        {"marker": "latency=0.010", "label": "fast"},
        {"marker": "wrong latency=0.005", "label": "wrong but fast"},
        {"source": BROKEN_SOURCE, "label": "does not compile"},
        {"marker": "fault", "label": "faults"},
        {"marker": "holdout-wrong latency=0.008", "label": "fitted to the visible cases"},
    ])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    assert code == EXIT_WINNER
    assert_pack_valid(pack)
    attempts = {a["label"]: a for a in history["attempts"]}
    assert attempts["initial kernel"]["attempt"] == 0 and attempts["initial kernel"]["status"] == "passed"
    assert attempts["slow"]["status"] == "passed" and attempts["slow"]["speedup_vs_initial"] == pytest.approx(2 / 3)
    wrong = attempts["wrong but fast"]
    assert wrong["status"] == "rejected" and wrong["stage"] == "correctness" and "7 of 150" in wrong["rejection"]
    assert wrong["geomean_ms"] is None
    broken = attempts["does not compile"]
    assert broken["stage"] == "compile" and "not_declared_anywhere" in broken["rejection"]
    assert broken["compile"]["ok"] is False
    assert attempts["faults"]["stage"] == "performance" and "ILLEGAL_ADDRESS" in attempts["faults"]["rejection"]
    fitted = attempts["fitted to the visible cases"]
    assert fitted["status"] == "passed" and fitted["validation"]["passed"] is False
    assert "hidden_77x300 (holdout)" in fitted["validation"]["rejection"]
    # the fastest passing candidate failed the gate, so the next one was gated and won
    assert summary["outcome"] == "winner" and summary["best"]["label"] == "fast"
    assert summary["best"]["validated"] is True and summary["best"]["speedup_vs_initial"] == pytest.approx(2.0)
    assert [r["label"] for r in summary["rejected_by_gate"]] == ["fitted to the visible cases"]
    assert summary["stop_reason"] == "proposer_exhausted" and summary["rounds"] == 6
    assert summary["passed_attempts"] == 3 and summary["rejected_attempts"] == 3
    assert [c.label for c in evaluator.validated] == ["fitted to the visible cases", "fast"]
    assert (pack / "best.cu").read_text() == fake_source("latency=0.010")
    assert summary["best_case_files"] == {"best-case-1.json": "small", "best-case-2.json": "perf",
                                          "best-case-3.json": "perf2", "best-case-4.json": "hidden_77x300"}
    replay = json.loads((pack / "best-case-4.json").read_text())
    assert replay["kernel"]["source"] == fake_source("latency=0.010") and replay["cases"][0]["name"] == "hidden_77x300"
    assert replay["timing"]["repeat"] == 100
    for name in ("heatmap.png", "heatmap.svg", "report.html", "best.cu", "history.json", "summary.json"):
        assert name in summary["files"], name
    html = (pack / "report.html").read_text()
    assert "WINNER" in html and "<svg" in html and "fitted to the visible cases" in html and "<script" not in html
    assert evaluator.closed


def test_every_run_gets_a_new_folder(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    first = optimize(tmp_path, suite, "--proposer", f"replay:{props}")[1]
    second = optimize(tmp_path, suite, "--proposer", f"replay:{props}")[1]
    assert (first.name, second.name) == ("run-001", "run-002")
    (tmp_path / "results" / "run-007").mkdir()
    assert optimize(tmp_path, suite, "--proposer", f"replay:{props}")[1].name == "run-008"
    assert json.loads((first / "summary.json").read_text())["run"] == "run-001"


def test_round_limit_is_a_stop_reason(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": f"latency=0.0{n}"} for n in range(11, 16)])
    code, pack, summary, history, _ = optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--max-iterations", 3)
    assert summary["stop_reason"] == "max_iterations" and summary["rounds"] == 3
    assert [a["round"] for a in history["attempts"]] == [0, 1, 2, 3]
    assert code == EXIT_WINNER and summary["best"]["label"] == "proposal 1"


def test_no_candidate_faster_than_the_initial_kernel(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.025"}, {"marker": "wrong latency=0.001"}])
    code, pack, summary, _, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    assert code == EXIT_NO_WINNER and summary["outcome"] == "no_improvement" and summary["best"] is None
    assert "nothing to gate" in summary["validation_note"] and evaluator.validated == []
    assert not (pack / "best.cu").exists() and not list(pack.glob("best-case-*.json"))
    assert_pack_valid(pack)


@pytest.mark.slow
def test_all_gated_candidates_rejected(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "holdout-wrong latency=0.010"},
                                                 {"marker": "regressed latency=0.012"},
                                                 {"marker": "holdout-wrong latency=0.015"},
                                                 {"marker": "latency=0.019"}])
    code, pack, summary, _, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--validate-top", 2)
    assert code == EXIT_NO_WINNER and summary["outcome"] == "rejected" and summary["best"] is None
    assert len(evaluator.validated) == 2 and len(summary["rejected_by_gate"]) == 2
    assert "2 more were not gated" in summary["validation_note"]
    assert summary["fastest_unvalidated"]["attempt"] == 1
    assert "regressed" in summary["rejected_by_gate"][1]["reason"]
    assert "REJECTED" in (pack / "report.html").read_text()
    assert_pack_valid(pack)


def test_gpu_budget_stops_the_search_and_keeps_the_gate_reserve(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": f"latency=0.0{n}"} for n in range(11, 18)])
    # 6 s of GPU per evaluation, 0.3 minutes (18 s) of budget, 2 s reserved for the gate
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}",
                                                       "--max-gpu-minutes", 0.3, evaluator={"gpu_s": 6.0})
    assert summary["stop_reason"] == "max_gpu_minutes" and "GPU minutes" in summary["stop_detail"]
    assert len(evaluator.evaluated) == 3  # 0, 6, 12 s spent before each: the 4th would start at 18 - 2 reserved
    assert summary["outcome"] == "winner"  # the reserve still gated the fastest
    assert history["attempts"][-1]["stage"] == "done"
    assert_pack_valid(pack)


def test_wall_budget(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": f"latency=0.0{n}"} for n in range(11, 18)])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}",
                                                       "--max-wall-minutes", 0.004, evaluator={"sleep_s": 0.1})
    assert summary["stop_reason"] == "max_wall_minutes"
    assert len(evaluator.evaluated) < 8
    assert_pack_valid(pack)


def test_ctrl_c_leaves_a_complete_pack(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": f"latency=0.0{n}"} for n in range(11, 18)])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}",
                                                       evaluator={"interrupt_after": 3})
    assert code == EXIT_INTERRUPTED
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "interrupted"
    assert summary["outcome"] == "not_validated" and evaluator.validated == []
    assert [a["stage"] for a in history["attempts"]] == ["done", "done", "done", "compile"]
    assert "interrupted" in history["attempts"][-1]["rejection"]
    assert_pack_valid(pack)
    assert (pack / "report.html").is_file()


def test_initial_kernel_that_fails_its_own_cases(tmp_path, suite):
    (suite.parent / "scale.cu").write_text(fake_source("wrong"))
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    assert code == EXIT_NO_WINNER and summary["stop_reason"] == "initial_failed"
    assert summary["outcome"] == "initial_failed" and len(history["attempts"]) == 1
    assert_pack_valid(pack)


def test_nsight_summary_feeds_the_history(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}, {"marker": "wrong"}])
    _, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--use-nsight")
    assert [a["nsight"] is not None for a in history["attempts"]] == [True, True, False]
    assert history["attempts"][1]["nsight"]["achieved_occupancy_pct"] == 48.0
    assert len(evaluator.profiled) == 2


def test_static_checks_reject_before_any_gpu_time(tmp_path, suite):
    escape = '#include "cudagate.yaml"\n' + fake_source()
    system = "#include </etc/passwd>\n" + fake_source()
    props = write_proposals(tmp_path / "props", [
        {"source": escape, "label": "reads a suite file"},
        {"source": system, "label": "reads a system file"},
        {"marker": "latency=0.01", "label": "too many threads", "launch": {"grid": ["rows"], "block": ["cols * 8"]}},
        {"marker": "latency=0.01", "label": "unknown name", "launch": {"grid": ["rows"], "block": ["BLOCK"]}},
        {"marker": "latency=0.01", "label": "python", "launch": {"grid": ["__import__('os')"], "block": ["32"]}},
        {"marker": "latency=0.01", "label": "names a holdout case",
         "launch_overrides": {"hidden_77x300": {"grid": ["rows"], "block": ["64"]}}},
        {"source": fake_source().replace("scale2", "other_name"), "label": "no entry"},
        {"marker": "latency=0.01", "label": "same as initial", "source": (suite.parent / "scale.cu").read_text()},
    ])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}",
                                                       "--max-iterations", 8)
    by_label = {a["label"]: a for a in history["attempts"]}
    assert 'line 1: #include "cudagate.yaml"' in by_label["reads a suite file"]["rejection"]
    assert "#include </etc/passwd>" in by_label["reads a system file"]["rejection"]
    assert "threads" in by_label["too many threads"]["rejection"]
    assert "uses BLOCK" in by_label["unknown name"]["rejection"]
    assert by_label["python"]["stage"] == "static"
    assert "not one of the cases" in by_label["names a holdout case"]["rejection"]
    assert "does not define the entry 'scale2'" in by_label["no entry"]["rejection"]
    assert by_label["same as initial"]["stage"] == "duplicate" and "attempt 0" in by_label["same as initial"]["rejection"]
    assert len(evaluator.evaluated) == 1  # only the initial kernel reached the (fake) GPU
    assert all(a["compile"] is None for a in history["attempts"][1:])
    # a static message never names a case the proposer may not know of
    for attempt in history["attempts"]:
        if attempt["stage"] == "static" and attempt["label"] != "names a holdout case":
            assert "hidden" not in (attempt["rejection"] or "")
    assert_pack_valid(pack)


def test_untrusted_suite_is_refused(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    args = parse(suite, "scale2", "--proposer", f"replay:{props}", "--results", tmp_path / "r", "--quiet")
    with pytest.raises(CudagateError, match="not trusted"):
        run_optimize(args, evaluator_factory=lambda s, p, l: FakeEvaluator(s, p, l))
    assert not (tmp_path / "r").exists()


def test_replay_of_an_audit_pack(tmp_path, suite):
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.030"}, {"marker": "latency=0.010"}])
    first = optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    again = optimize(tmp_path, suite, "--proposer", f"replay:{first[1]}")
    assert [a["candidate"]["source_sha256"] for a in again[3]["attempts"]] == \
           [a["candidate"]["source_sha256"] for a in first[3]["attempts"]]
    assert again[2]["best"]["source_sha256"] == first[2]["best"]["source_sha256"]


def test_optimize_help_says_what_a_run_needs(capsys):
    from pytest_cudagate.cli import main

    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for need in ("Needs a CUDA GPU", "the [optimize] extra and OPENAI_API_KEY", "KERNEL's approved version",
                 "--allow-unsigned"):
        assert need in text, text
