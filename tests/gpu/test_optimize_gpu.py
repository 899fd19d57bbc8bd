"""`cudagate optimize` on a real GPU: a replay of recorded matmul candidates (naive → tiled → planted wrong →
planted overfit → register-blocked) and the autotune proposer on the matmul example, each ending in the full
gate against the approved kernel. Packs are copied to $CUDAGATE_KEEP_PACKS when it is set (benchmarks)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpu_support import EXAMPLES, REPO, run
from pytest_cudagate.optimize.cli import main

pytestmark = pytest.mark.gpu

MATMUL = EXAMPLES / "matmul" / "cudagate.yaml"
PROPOSALS = EXAMPLES / "matmul" / "proposals"


def optimize(tmp_path: Path, *argv: str) -> tuple[int, Path, dict, dict]:
    results = tmp_path / "results"
    code = main([str(MATMUL), "matmul_f32", "--results", str(results), "--quiet", *argv])
    pack = sorted(results.glob("run-*"))[-1]
    keep = os.environ.get("CUDAGATE_KEEP_PACKS")
    if keep:
        shutil.copytree(pack, Path(keep) / f"{tmp_path.name}-{pack.name}", dirs_exist_ok=True)
    return code, pack, json.loads((pack / "summary.json").read_text()), json.loads((pack / "history.json").read_text())


def check_pack(pack: Path) -> None:
    from test_optimize_loop import assert_pack_valid

    assert_pack_valid(pack)


def test_replayed_candidates_pick_the_honest_register_blocked_kernel(tmp_path):
    code, pack, summary, history = optimize(tmp_path, "--proposer", f"replay:{PROPOSALS}")
    attempts = {a["candidate"]["label"]: a for a in history["attempts"]}
    initial = attempts["initial kernel"]
    naive = attempts["naive: one thread per output"]
    tiled = attempts["tiled 32x32"]
    wrong = attempts["PLANTED wrong-but-fast (drops the K tail)"]
    overfit = attempts["PLANTED overfit (visible shapes only)"]
    honest = attempts["register-blocked, 4-stage cp.async pipeline"]
    planted = {wrong["label"], overfit["label"]}
    report = json.dumps({a["label"]: (a["status"], a["stage"], a["speedup_vs_initial"],
                                      (a["validation"] or {}).get("rejection")) for a in history["attempts"]})
    assert initial["status"] == "passed" and initial["speedup_vs_initial"] == pytest.approx(1.0, abs=0.05), report
    assert naive["status"] == "passed" and naive["speedup_vs_initial"] < 1.0, report
    assert tiled["status"] == "passed", report
    assert wrong["status"] == "rejected" and wrong["stage"] == "correctness", report
    assert "correct_31x37x29" in wrong["rejection"] and "outside tolerance" in wrong["rejection"]
    assert overfit["status"] == "passed", report  # the visible cases cannot tell
    assert honest["status"] == "passed" and honest["speedup_vs_initial"] > 1.0, report
    # the winner: the fastest candidate that is not planted and passed the gate; no planted one passes it
    assert code == 0 and summary["outcome"] == "winner", (summary["validation_note"], report)
    assert summary["best"]["label"] not in planted and summary["best"]["validated"], report
    honest_kind = [a for a in history["attempts"] if a["round"] >= 1 and a["status"] == "passed" and a["label"] not in planted]
    fastest = min(honest_kind, key=lambda a: a["geomean_ms"])
    assert summary["best"]["label"] == fastest["label"] or not fastest["validation"]["passed"], report
    assert summary["best"]["label"] == honest["label"], report
    gate = {c["case"]: c for c in honest["validation"]["cases"]}
    assert gate["holdout_200x328x136"]["passed"] and gate["holdout_200x328x136"]["holdout"]
    assert honest["validation"]["checks"]["fresh_inputs"]["seed"] == honest["validation"]["fresh_seed"]
    if overfit["validation"] is None:  # ranked behind the winner, so not gated by the run: gate it here
        overfit["validation"] = gate_directly(tmp_path, overfit["candidate"])
    assert overfit["validation"]["passed"] is False
    assert "holdout_200x328x136 (holdout)" in overfit["validation"]["rejection"], overfit["validation"]
    assert "never written" in overfit["validation"]["rejection"]
    check_pack(pack)
    # the winner replays with `cudagate run`, expected outputs and tolerances included
    result = run(["-m", "pytest_cudagate.cli", "run", str(pack / "best-case-4.json")], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    replayed = json.loads(result.stdout)
    assert replayed["cases"][0]["case"] == "holdout_200x328x136" and replayed["cases"][0]["passed"] is True


def gate_directly(tmp_path: Path, recorded: dict) -> dict:
    """The full gate of a recorded candidate, as the optimizer runs it on a winner."""
    from pytest_cudagate.approvals import Ledger
    from pytest_cudagate.worker.client import HarnessClient
    from pytest_cudagate.worker.fingerprint import Fingerprint
    from pytest_cudagate.gate import GateOptions
    from pytest_cudagate.optimize.candidate import Candidate, launch_from_json
    from pytest_cudagate.optimize.evaluator import HarnessEvaluator
    from pytest_cudagate.suite.loader import load_suite

    suite = load_suite(MATMUL)
    candidate = Candidate(recorded["source"], launch_from_json(recorded["launch"]), origin="replay")
    with HarnessClient(timeout_s=60) as client:
        hello = client.start()
        evaluator = HarnessEvaluator(suite, suite.kernel("matmul_f32"), Ledger.for_suite(suite), client,
                                     Fingerprint.from_hello(hello), gate_options=GateOptions(), work_dir=tmp_path / "gate")
        return evaluator.validate(candidate).to_json()


def test_autotune_finds_a_faster_matmul(tmp_path):
    code, pack, summary, history = optimize(tmp_path, "--proposer", "autotune", "--max-iterations", "2", "--batch", "8")
    assert code == 0, summary
    best = summary["best"]
    assert best["origin"] == "autotune" and best["validated"] and best["defines"]["MATMUL_RB"] == 1
    assert best["speedup_vs_initial"] > 1.05, best
    assert all(c["gate"]["passed"] for c in best["cases"])
    assert summary["usage"]["model_calls"] == 0 and summary["stop_reason"] in ("max_iterations", "proposer_exhausted")
    text = (pack / "best.cu").read_text()
    assert "#define MATMUL_RB 1" in text and f"#define BM {best['defines']['BM']}" in text
    check_pack(pack)


def test_nsight_summary_of_the_shipped_kernel(tmp_path):
    from pytest_cudagate.optimize.nsight import find_ncu

    if find_ncu() is None:
        pytest.skip("ncu not installed")
    from pytest_cudagate.approvals import Ledger
    from pytest_cudagate.worker.client import HarnessClient
    from pytest_cudagate.worker.fingerprint import Fingerprint
    from pytest_cudagate.gate import GateOptions
    from pytest_cudagate.optimize.candidate import Candidate
    from pytest_cudagate.optimize.evaluator import HarnessEvaluator
    from pytest_cudagate.suite.loader import load_suite

    suite = load_suite(MATMUL)
    program = suite.kernel("matmul_f32")
    with HarnessClient(timeout_s=60) as client:
        hello = client.start()
        evaluator = HarnessEvaluator(suite, program, Ledger.for_suite(suite), client, Fingerprint.from_hello(hello),
                                     gate_options=GateOptions(), work_dir=tmp_path / "work")
        summary = evaluator.profile(Candidate.initial(program))
    if "error" in summary and "permission" in summary["error"].lower():
        pytest.skip(summary["error"])
    assert "error" not in summary, summary
    assert summary["registers_per_thread"] > 0 and 0 < summary["achieved_occupancy_pct"] <= 100, summary
    assert summary["case"] == "perf_384x256x320"
