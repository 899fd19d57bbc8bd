"""`cudagate optimize --proposer openai` tells the model each candidate's latency as a multiple of the suite's
library baseline: the real HarnessEvaluator on the fake worker (with the fake cuBLAS of tests/judge/test_library.py),
a scripted OpenAI-compatible server, and what the model read. The library is timed once per performance case
per session, beside the initial kernel; a candidate's multiple is derived through the initial kernel."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("openai")

from cudagate_harness.library import ADAPTERS  # noqa: E402
from fake_worker import FakeKernel, install  # noqa: E402
from helpers import replace_once  # noqa: E402
from optimize_fakes import ScriptedServer, answer  # noqa: E402
from test_library import BASELINE, MM_CU, MM_YAML, PARAMS, FakeSgemm, missing, mm_kernel, write_mm  # noqa: E402
from test_loop import assert_pack_valid, parse  # noqa: E402
from pytest_cudagate.optimize.cli import run_optimize  # noqa: E402

LAUNCH = {"grid": ["cdiv(n, 16)", "cdiv(m, 16)"], "block": ["16", "16"]}


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-library-feedback")


def use_library(monkeypatch, loader=FakeSgemm) -> None:
    monkeypatch.setitem(ADAPTERS, "cublas_sgemm", dataclasses.replace(ADAPTERS["cublas_sgemm"], load=loader))


def kernel_for(spec: dict) -> FakeKernel:
    """The `mm` product; a source marked ``// slow`` takes 20 µs a launch instead of 10 µs."""
    if "// slow" not in spec["source"]:
        return FakeKernel(mm_kernel, PARAMS)

    def slow(launch) -> None:
        mm_kernel(launch)
        launch.device.clock += 0.010

    return FakeKernel(slow, PARAMS)


def optimize_mm(tmp_path, monkeypatch, yaml_text: str = MM_YAML):
    """Two rounds of the openai proposer on the `mm` suite: a slow candidate, then another.
    (pack folder, history, the prompts the model read, every worker request)."""
    suite = write_mm(tmp_path / "mm", yaml_text)
    workers = install(monkeypatch, tmp_path, kernel_for)
    script = [answer(MM_CU + "// slow\n", title="slow", grid=LAUNCH["grid"], block=LAUNCH["block"]),
              answer(MM_CU + "// slow, again\n", title="slow again", grid=LAUNCH["grid"], block=LAUNCH["block"])]
    results = tmp_path / "results"
    with ScriptedServer(script) as server:
        code = run_optimize(parse(suite, "mm", "--allow-unsigned", "--results", results, "--quiet", "--proposer",
                                  "openai", "--base-url", server.url, "--max-iterations", 2))
    pack = sorted(results.glob("run-*"))[-1]
    assert code == 1, (pack / "summary.json").read_text()  # both slower than the initial kernel: nothing to gate
    assert_pack_valid(pack)
    prompts = [request["messages"][-1]["content"] for request in server.requests]
    system = server.requests[0]["messages"][0]["content"]
    return json.loads((pack / "history.json").read_text()), prompts, system, [r for w in workers for r in w.requests]


def test_the_model_reads_each_candidates_multiple_of_cublas_and_the_library_is_timed_once_per_case(
        tmp_path, monkeypatch):
    use_library(monkeypatch)
    history, prompts, system, requests = optimize_mm(tmp_path, monkeypatch)
    assert len(prompts) == 2
    # The initial kernel (10 µs) beside cuBLAS (5 µs), measured: in every round's case list.
    for prompt in prompts:
        assert ("- square: performance, m=32, n=32, k=32, initial kernel 10.00 µs; cuBLAS SGEMM 5.00 µs, the initial "
                "kernel takes 2.000× its time (99% CI [2.000, 2.000], interleaved)") in prompt
    # Round 1's candidate (20 µs: 2× the initial) in round 2's evidence: 4× cuBLAS, derived and labelled so.
    assert ("case square: median 20.00 µs (initial 10.00 µs in the same run; ratio 2.000, 99% CI [2.000, 2.000], "
            "2.000× the current best; 4.000× cuBLAS SGEMM (derived via the initial kernel, 98% interval [4.000, 4.000]; cuBLAS SGEMM median "
            "5.00 µs))") in prompts[1]
    assert "4.000× cuBLAS SGEMM (derived via the initial kernel" in prompts[1].split("case wide:")[1]
    assert "The library baseline cuBLAS SGEMM is timed once per case beside the initial kernel" in system
    # Once per performance case per session: two runs of the initial kernel, none for the candidates.
    timed = [r for r in requests if "library" in r]
    assert [(r["op"], r["cases"][0]["name"]) for r in timed] == [("run", "square"), ("run", "wide")]
    compares = [r for r in requests if r["op"] == "compare"]
    assert len(compares) == 6 and not any("library" in r for r in compares)  # 3 attempts × 2 cases
    assert all(r["kernel"]["source"] == MM_CU for r in timed)
    # history.json keeps the figure per attempt and case (its schema checked above).
    attempts = {a["attempt"]: {c["case"]: c for c in a["cases"]} for a in history["attempts"]}
    assert sorted(attempts) == [0, 1, 2]
    one = attempts[1]["wide"]["vs_library"]
    assert one["ratio"] == pytest.approx(4.0) and one["low"] <= one["ratio"] <= one["high"]
    assert one["initial_vs_library"]["ratio"] == pytest.approx(2.0) and one["library_ms"] == pytest.approx(0.005)
    assert one["via"] == "the initial kernel" and one["error"] is None and one["confidence"] == pytest.approx(0.98)
    assert attempts[0]["square"]["vs_library"]["ratio"] == pytest.approx(2.0)
    assert attempts[0]["small"]["vs_library"] is None  # correctness cases are not timed


@pytest.mark.parametrize("broken, words", [
    ("missing", "× cuBLAS SGEMM: no ratio (cuBLAS not found (nowhere): pip install 'cuda-toolkit[cublas]' or set "
                "CUDAGATE_CUBLAS)"),
    ("swapped", "× cuBLAS SGEMM: no ratio (its output does not match the reference (check the suite's "
                "library_baseline args): output 'c':"),
])
def test_a_missing_library_or_a_wrong_mapping_shows_its_error_and_the_search_goes_on(tmp_path, monkeypatch, broken,
                                                                                     words):
    use_library(monkeypatch, missing if broken == "missing" else FakeSgemm)
    yaml_text = replace_once(MM_YAML, "args: {a: a, b: b,", "args: {a: b, b: a,") if broken == "swapped" else MM_YAML
    history, prompts, _, requests = optimize_mm(tmp_path, monkeypatch, yaml_text)
    assert [a["status"] for a in history["attempts"]] == ["passed"] * 3  # never fails a candidate
    assert words in prompts[0] and words in prompts[1].split("Evidence from round 1:")[1]
    assert "derived via the initial kernel" not in prompts[1]
    assert len([r for r in requests if "library" in r]) == 2  # a failed library is not retried per candidate
    case = history["attempts"][1]["cases"][-1]
    assert case["vs_library"]["ratio"] is None and case["vs_library"]["error"]


def test_a_suite_without_a_baseline_says_nothing_of_a_library_and_times_none(tmp_path, monkeypatch):
    use_library(monkeypatch)
    history, prompts, system, requests = optimize_mm(tmp_path, monkeypatch, MM_YAML.replace(BASELINE, ""))
    assert not any("cuBLAS" in text or "library" in text for text in [system, *prompts])
    assert not any("library" in r for r in requests)
    assert all(c["vs_library"] is None for a in history["attempts"] for c in a["cases"])
