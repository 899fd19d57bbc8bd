"""`cudagate optimize --proposer openai` against a scripted OpenAI-compatible server on 127.0.0.1, through the
real openai SDK: structured output, tool calls, malformed answers, refusals, rate limits, candidates that
do not compile or are wrong, model budgets, and what the audit pack records (never the key)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openai")

from optimize_fakes import (BROKEN_SOURCE, ScriptedServer, answer, completion, error, fake_source,  # noqa: E402
                            opt_suite, tool_call)
from test_loop import assert_pack_valid, optimize  # noqa: E402
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.optimize.research import Notes

SECRET = "sk-test-DO-NOT-LEAK-0123456789abcdef"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


@pytest.fixture
def suite(tmp_path):
    return opt_suite(tmp_path / "scale")


@pytest.fixture
def notes(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "memory.md").write_text("# Coalescing\n\nConsecutive threads should read consecutive addresses: "
                                      "coalesced global loads.\n\n# Occupancy\n\nMore resident warps hide latency.\n")
    (folder / "unrelated.txt").write_text("Nothing about kernels here, only gardening.\n")
    outside = tmp_path / "secret.md"
    outside.write_text("coalesced coalesced coalesced: a file outside the notes folder\n")
    (folder / "link.md").symlink_to(outside)
    return folder


def run(tmp_path, suite, script, *argv, sleeps=None, **evaluator):
    with ScriptedServer(script) as server:
        result = optimize(tmp_path, suite, "--proposer", "openai", "--base-url", server.url, *argv,
                          evaluator=evaluator or None, sleep=(sleeps.append if sleeps is not None else lambda s: None))
    return (*result, server)


def test_full_conversation(tmp_path, suite, notes):
    sleeps = []
    script = [
        # round 1: rate limited, then a tool call, then not JSON, then a kernel that does not compile, then a good one
        error(429, "slow down", retry_after="0.25"),
        tool_call("coalesced loads"),
        completion("here is my kernel: {not json"),
        answer(BROKEN_SOURCE, title="typo"),
        answer(fake_source("latency=0.012"), title="good"),
        # round 2: a refusal, then a wrong kernel (ends the round: wrong is evidence, not a repair)
        completion(None, refusal="I cannot help with that."),
        answer(fake_source("wrong latency=0.004"), title="too clever"),
        # round 3: the best, with a per-case launch override
        answer(fake_source("latency=0.009"), title="best", block=["256"],
               overrides=[{"case": "perf2", "grid": ["rows"], "block": ["512"], "shared_bytes": "0"}]),
    ]
    code, pack, summary, history, evaluator, server = run(
        tmp_path, suite, script, "--max-iterations", 3, "--nvidia-research", "--research-dir", notes,
        "--description", "rows are short", sleeps=sleeps)
    assert code == 0, summary
    assert_pack_valid(pack)
    assert sleeps == [0.25]  # Retry-After honoured
    stages = [(a["round"], a["repair"], a["stage"]) for a in history["attempts"]]
    assert stages == [(0, 0, "done"), (1, 0, "proposal"), (1, 1, "compile"), (1, 2, "done"),
                      (2, 0, "proposal"), (2, 1, "correctness"), (3, 0, "done")]
    assert "not valid JSON" in history["attempts"][1]["rejection"]
    assert "refused" in history["attempts"][4]["rejection"]
    assert summary["best"]["label"] == "best" and summary["best"]["launch_overrides"]["perf2"]["block"] == ["512"]
    assert summary["repairs"] == 3 and summary["stop_reason"] == "max_iterations"

    # every request went out as strict structured output, with the tool, the effort and a token cap
    assert len(server.requests) == len(script) == summary["usage"]["model_calls"]
    for request in server.requests:
        assert request["response_format"]["type"] == "json_schema"
        assert request["response_format"]["json_schema"]["strict"] is True
        assert request["model"] == "gpt-5-mini" and request["reasoning_effort"] == "medium"
        assert request["tools"][0]["function"]["name"] == "search_notes"
        assert 256 <= request["max_completion_tokens"] <= 32000
    assert {k.lower(): v for k, v in server.headers[0].items()}["authorization"] == f"Bearer {SECRET}"
    # the tool answered from the notes folder only (not through the link that leads out of it)
    tool_message = next(m for m in server.requests[2]["messages"] if m["role"] == "tool")
    assert "[memory.md]" in tool_message["content"] and "outside the notes folder" not in tool_message["content"]
    # the repairs went back into the same conversation
    assert "not valid JSON" in server.requests[3]["messages"][-1]["content"]
    assert "not_declared_anywhere" in server.requests[4]["messages"][-1]["content"]
    assert "rows are short" in server.requests[1]["messages"][1]["content"]
    # round 3 saw the evidence of round 2, as a proposer may see it
    prompt = server.requests[7]["messages"][1]["content"]
    assert "Evidence from round 2" in prompt and "7 of 150 elements outside tolerance" in prompt
    for request in server.requests:
        text = json.dumps(request)
        assert "hidden_77x300" not in text and "rows=77" not in text
        assert "expected 0.123456" not in text and "0.123456" not in text  # never an expected value
        assert ".npy" not in text
    # the pack: one file per request, usage totals, no key anywhere
    calls = sorted(pack.glob("model-*.json"))
    assert len(calls) == len(script)
    first = json.loads(calls[0].read_text())
    assert first["error"]["status"] == 429 and first["response"] is None and first["try"] == 1
    second = json.loads(calls[1].read_text())
    assert second["try"] == 2 and second["usage"]["prompt_tokens"] == 1200 and second["cost_usd"] > 0
    assert summary["usage"]["prompt_tokens"] == 1200 * 7 and summary["usage"]["completion_tokens"] == 800 * 7
    assert summary["usage"]["reasoning_tokens"] == 300 * 7
    expected_cost = 7 * ((1200 - 200) * 0.25 + 200 * 0.025 + 800 * 2.0) / 1e6
    assert summary["usage"]["estimated_cost_usd"] == pytest.approx(expected_cost, rel=1e-6)
    assert {a["attempt"]: len(a["model_calls"]) for a in history["attempts"]} == {0: 0, 1: 3, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}
    for path in pack.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path.name
    assert summary["proposer"]["endpoint"] == server.url


def test_model_call_budget(tmp_path, suite):
    script = [answer(fake_source("latency=0.015")), answer(fake_source("latency=0.012")), answer(fake_source("latency=0.01"))]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--max-model-calls", 2)
    assert summary["stop_reason"] == "max_model_calls" and len(server.requests) == 2
    assert summary["usage"]["model_calls"] == 2 and summary["outcome"] == "winner"


def realistic(entry: dict) -> dict:
    return {**entry, "realistic_usage": True}


def test_token_budget_caps_each_call_and_stops(tmp_path, suite):
    script = [realistic(answer(fake_source(f"latency=0.01{n}"), completion_tokens=3000)) for n in range(5)]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--max-tokens", 9000)
    assert summary["stop_reason"] == "max_tokens"
    assert 2 <= len(server.requests) < 5
    assert summary["usage"]["total_tokens"] <= 9000  # hard: each call was capped to what was left
    caps = [r["max_completion_tokens"] for r in server.requests]
    assert caps[0] > caps[-1] and all(c < 9000 for c in caps)


def test_dollar_budget(tmp_path, suite):
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"gpt-5-mini": {"input": 100.0, "output": 400.0}}))
    script = [realistic(answer(fake_source(f"latency=0.01{n}"), completion_tokens=2000)) for n in range(5)]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--budget-usd", 2.5, "--price-table", table)
    assert summary["stop_reason"] == "budget_usd"
    assert summary["usage"]["estimated_cost_usd"] <= 2.5 and 2 <= len(server.requests) < 5
    assert summary["usage"]["price_per_mtok"]["input_per_mtok"] == 100.0


def test_dollar_budget_needs_a_price(tmp_path, suite):
    with pytest.raises(CudagateError, match="needs a price"):
        run(tmp_path, suite, [], "--budget-usd", 1, "--model", "my-local-model")


def test_auth_error_ends_the_run(tmp_path, suite):
    script = [error(401, "invalid api key", retry_after=None, kind="invalid_api_key")]
    code, pack, summary, history, _, server = run(tmp_path, suite, script)
    assert summary["stop_reason"] == "model_error" and "401" in summary["stop_detail"]
    assert code == 1 and len(server.requests) == 1
    assert_pack_valid(pack)


def test_server_errors_are_retried_then_stop(tmp_path, suite):
    sleeps = []
    script = [error(503, "overloaded", retry_after=None, kind="server_error")] * 4
    *_, summary, history, _, server = run(tmp_path, suite, script, sleeps=sleeps)
    assert summary["stop_reason"] == "model_error" and len(server.requests) == 4
    assert sleeps == [1.0, 2.0, 4.0]
    assert summary["usage"]["model_calls"] == 4


def test_repairs_are_bounded(tmp_path, suite):
    script = [completion("{}")] * 3 + [answer(fake_source("latency=0.01"))]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--max-repairs", 2, "--max-iterations", 2)
    rounds = [(a["round"], a["repair"], a["stage"]) for a in history["attempts"]]
    assert rounds == [(0, 0, "done"), (1, 0, "proposal"), (1, 1, "proposal"), (1, 2, "proposal"), (2, 0, "done")]
    assert "does not match the schema" in history["attempts"][1]["rejection"]
    assert summary["outcome"] == "winner"


def test_cut_off_answer_and_empty_choices(tmp_path, suite):
    script = [completion('{"title": "x", "idea": "y", "sou', finish_reason="length"),
              answer(fake_source("latency=0.01"))]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--max-iterations", 1)
    assert "cut off" in history["attempts"][1]["rejection"]
    assert "answer more briefly" in server.requests[1]["messages"][-1]["content"]


def test_no_reasoning_effort_for_local_models(tmp_path, suite):
    script = [answer(fake_source("latency=0.01"))]
    *_, summary, history, _, server = run(tmp_path, suite, script, "--max-iterations", 1, "--reasoning-effort", "none",
                                          "--model", "qwen-coder")
    assert "reasoning_effort" not in server.requests[0] and "tools" not in server.requests[0]
    assert summary["usage"]["estimated_cost_usd"] is None  # no price known for this model


def test_notes_search_ranks_relevant_paragraphs(notes):
    found = Notes(notes).search("coalesced global loads")
    assert found and found[0].file == "memory.md" and all(c.file != "link.md" for c in found)
    assert Notes(notes).answer("quantum chromodynamics").startswith("no notes match")
