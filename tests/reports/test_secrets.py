"""The pytest entry point end to end (real collection, recorded outcomes standing in for a GPU),
in GitHub Actions mode, with secrets in the environment that must appear in no written byte."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from report_fixtures import as_report, build_scenario, built_report
from pytest_cudagate.cli import main
from pytest_cudagate.reports.benchmark_json import benchmark_document
from pytest_cudagate.host.scrub import MASK, Scrubber
from pytest_cudagate.reports.writer import write_report
from pytest_cudagate.boundary.schema import problems
from pytest_cudagate.trust.keys import generate_key_pair

pytest_plugins = ["pytester"]

SECRETS = {
    "MY_SERVICE_API_KEY": "sk-live-4f9a8b7c6d5e4f3a2b1c",
    "GH_TOKEN": "ghp_Zx81QwErTyUiOpAsDfGhJkL0987",
    "DB_PASSWORD": 'pa"ss<w>&rd%42-very',  # characters JSON, HTML and workflow commands all escape
    "DEPLOY_SECRET": "deploy-secret-7781aa",
    "CUDAGATE_SIGNING_KEY": "ed25519-private-AAAAC3NzaC1lZDI1NTE5",
    "OPENAI_API_KEY": "sk-proj-abcdefghijklmnop1234",
}
HARMLESS = {"MY_KEY_ENABLED": "1", "TOKEN_TTL": "300"}  # too short to be secrets; must not shred the text

CONFTEST = """
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, {tests!r})
from report_fixtures import scenario_for  # noqa: E402
from pytest_cudagate.items import gate_session  # noqa: E402
from pytest_cudagate.reports import pytest_hooks  # noqa: E402
from pytest_cudagate.suite.loader import load_suite  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    # No GPU here: the outcomes a GPU run of this suite gives stand in for the replays.
    runtime = gate_session(session.config)
    scenario = scenario_for(load_suite(Path(str(session.config.rootpath)) / "scale" / "cudagate.yaml"))
    leak = " ".join(os.environ[name] for name in {secrets!r})
    scenario.outcomes[1].message += "\\nenvironment dump: " + leak
    runtime.outcomes[:] = scenario.outcomes
    runtime.skipped[:] = scenario.skipped
    runtime.tested.clear()  # ... and pytest's counts of the items they stand for
    runtime.tested.update(failed=2, passed=3, skipped=1)
    runtime.fingerprint = scenario.fingerprint
    runtime.trust.clear()
    runtime.trust.update({{str(scenario.suite.path): scenario.trust[str(scenario.suite.path)] + " key " + leak}})
    pytest_hooks.session_finish(session.config, runtime, exitstatus)
"""


def forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], html.escape(value), html.escape(value, quote=False),
            value.replace("%", "%25")}


def assert_no_secret(paths: list[Path], extra_text: str = "") -> None:
    texts = {str(p): p.read_text(encoding="utf-8") for p in paths}
    texts["output"] = extra_text
    for where, text in texts.items():
        for name, value in SECRETS.items():
            for form in forms(value):
                assert form not in text, f"{name} ({form!r}) written to {where}"


@pytest.fixture
def secret_env(monkeypatch):
    for name, value in {**SECRETS, **HARMLESS}.items():
        monkeypatch.setenv(name, value)


def test_pytest_session_writes_report_benchmark_summary_and_annotations(pytester, secret_env, monkeypatch):
    build_scenario(pytester.path / "scale")
    pytester.makeconftest(CONFTEST.format(tests=str(Path(__file__).parents[1]), secrets=sorted(SECRETS)))
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-report", "out", "--cuda-gate-benchmark-json", "bench.json",
                                "-p", "no:cacheprovider")
    out = "\n".join(result.outlines + result.errlines)
    document = json.loads((pytester.path / "out" / "report.json").read_text())
    assert problems(document, "report") == []
    assert {i["nodeid"] for i in document["items"]} == {f"scale/cudagate.yaml::scale2::{c}" for c in
                                                          ("small", "edge", "perf", "perf_wide", "perf_tall", "perf_odd")}
    assert document["verdict"] == "fail" and (pytester.path / "out" / "report.html").is_file()
    assert "cudagate report: out/report.html" in out and "cudagate timings (pytest-benchmark JSON): bench.json" in out
    bench = json.loads((pytester.path / "bench.json").read_text())
    assert len(bench["benchmarks"]) == 5 and bench["benchmarks"][0]["stats"]["median"] < 1e-3  # seconds
    assert summary.read_text().startswith("## ❌ cudagate FAIL")
    annotations = [line for line in result.outlines if line.startswith(("::error", "::warning"))]
    assert len(annotations) == 4
    assert any(line.startswith("::error file=scale/scale.cu,line=1,title=cudagate%3A scale2 × edge") for line in annotations)
    assert MASK in (pytester.path / "out" / "report.html").read_text()
    written = [p for p in pytester.path.rglob("*") if p.is_file() and p.suffix in (".json", ".html", ".md")]
    assert len(written) >= 9  # report.json, report.html, 5 requests, bench.json, summary.md
    assert_no_secret(written, out)
    assert "3 passed (2 with a warning) · 1 skipped of 6" in summary.read_text()  # short flag values ("1") were left alone


def test_no_report_no_work(pytester):
    build_scenario(pytester.path / "scale")
    pytester.makeconftest(CONFTEST.format(tests=str(Path(__file__).parents[1]), secrets=[]))
    result = pytester.runpytest("--cuda-gate", "-p", "no:cacheprovider")
    assert not (pytester.path / "out").exists() and "::error" not in result.stdout.str()


def test_scrubbing_reaches_requests_benchmark_and_every_text(tmp_path, secret_env):
    scenario = build_scenario(tmp_path / "scale")
    leak = " ".join(SECRETS.values())
    scenario.outcomes[2].message += leak
    scenario.outcomes[2].latency.telemetry[0]["note"] = leak
    scenario.outcomes[0].requests[0]["kernel"]["source"] += f"\n// {leak}\n"
    scenario.trust = {str(scenario.suite.path): leak}
    scrubber = Scrubber()
    built = built_report(scenario)
    write_report(tmp_path / "out", built, scrubber)
    (tmp_path / "bench.json").write_text(scrubber.text(json.dumps(benchmark_document(as_report(scrubber.data(built.document))))))
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()] + [tmp_path / "bench.json"]
    assert_no_secret(written)
    request = json.loads(next((tmp_path / "out" / "requests").glob("*small*")).read_text())
    assert request["kernel"]["source"].endswith(f"// {' '.join([MASK] * len(SECRETS))}\n")


def test_scrubber_rules():
    scrubber = Scrubber({"API_KEY": "abcdef123", "NOT_SENSITIVE": "abcdef123456", "MY_TOKEN": "1", "X_PASSWORD": "  hunter22 \n"})
    assert scrubber.text("key abcdef123 and hunter22") == f"key {MASK} and {MASK}"
    assert scrubber.text("count 1") == "count 1"
    assert scrubber.data({"abcdef123": ["abcdef123", 3, None]}) == {MASK: [MASK, 3, None]}


def test_a_signing_keys_lines_and_pieces_reach_no_comment_or_merged_report(tmp_path, monkeypatch, capsys):
    """Issue 41, finding 3: the key's PEM body line printed without its armour, and pieces of it, are
    masked wherever they appear, not only the whole PEM."""
    generate_key_pair("alice", private_path=tmp_path / "alice.key", public_path=tmp_path / "alice.pub")
    pem = (tmp_path / "alice.key").read_text()
    body = max(pem.splitlines(), key=len)  # the base64 line between the armour
    monkeypatch.setenv("CUDAGATE_SIGNING_KEY", pem)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    built = built_report(build_scenario(tmp_path / "scale"))
    items = built.document["items"]
    items[0]["headline"] = f"the key: {body}"
    items[1]["message"] += f"\n…{body[5:29]}…"  # a piece of 24 characters, cut out of a longer text
    items[2]["case"] = body[-20:]
    built.document["suites"][0]["signature"] = json.dumps(body)  # as JSON would quote it
    write_report(tmp_path / "artifact", built, Scrubber({}))  # a job that did not know the key wrote it
    assert main(["report", "comment", str(tmp_path / "artifact"), "--out", str(tmp_path / "comment.md")]) == 0
    assert main(["report", "merge", str(tmp_path / "merged"), str(tmp_path / "artifact")]) == 0
    written = [tmp_path / "comment.md", tmp_path / "summary.md", *(tmp_path / "merged").rglob("*.*")]
    for path in written:
        text = path.read_text()
        assert not [body[i:i + 16] for i in range(len(body) - 15) if body[i:i + 16] in text], path
        assert MASK in text or path.suffix == ".json" and "requests" in path.parts, path


def test_pieces_shorter_than_sixteen_characters_are_left_alone():
    scrubber = Scrubber({"CUDAGATE_SIGNING_KEY": "MC4CAQAwBQYDK2VwBCIEIKuOCqp1mEdnLvzB7d3mQ9z0aP1Xy2W"})
    assert scrubber.text("MC4CAQAwBQYDK2V and MC4CAQAwBQYDK2Vw") == f"MC4CAQAwBQYDK2V and {MASK}"
    assert scrubber.text("xxEdnLvzB7d3mQ9z0aP1Xy2Wyy") == f"xx{MASK}yy"
