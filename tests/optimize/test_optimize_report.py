"""`report.html`, `heatmap.svg` and `heatmap.png` of an optimize pack: readable values (no reprs), the gate's
verdicts, a best-so-far chart with one point per round and a heatmap whose cells stay legible for a search
of 100+ attempts. Packs come from `cudagate optimize` with the fake harness (tests/optimize_fakes.py)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from helpers import replace_once, write_suite
from optimize_fakes import BASE_MS, OPT_SUITE_YAML, FakeEvaluator, committed_project, opt_suite, write_proposals
from pytest_cudagate.optimize.cli import run_optimize
from pytest_cudagate.optimize.evaluator import Evaluation, Validation
from pytest_cudagate.optimize.report import render
from test_loop import assert_pack_valid, parse

MIN_CELL_W, MIN_CELL_H = 60, 32  # px: two lines of text fit


# -- a realistic autotune search: 7 rounds of 16 over 120 points, a few wrong ----------------------------

BIG_SPACE_YAML = replace_once(OPT_SUITE_YAML, "tunables: {BLOCK: [128, 64, 256, 512]}",
                              "tunables: {BLOCK: [128, 64, 256, 512], UNROLL: [1, 2, 3, 4, 5, 6], SKEW: [0, 1, 2, 3, 4]}")
WEIGHT = {"perf": {128: 1.0, 64: 1.15, 256: 0.7, 512: 0.9}, "perf2": {128: 1.0, 64: 1.2, 256: 0.85, 512: 0.75}}


def latency(candidate, case: str) -> float:
    d = candidate.defines
    if not d:
        return BASE_MS
    return BASE_MS * WEIGHT.get(case, WEIGHT["perf"])[d["BLOCK"]] * (1 + 0.06 * abs(d["UNROLL"] - 4)) * (1 + 0.03 * d["SKEW"])


class WrongOnSkew4(FakeEvaluator):
    """Every SKEW=4 point writes wrong outputs (the search rejects a share of each round); the gate reports
    its fresh inputs and compute-sanitizer as the harness evaluator does."""

    def validate(self, candidate) -> Validation:
        validation = super().validate(candidate)
        validation.checks = {
            "fresh_inputs": {"sets_per_case": 2, "adversarial": True, "seed": validation.fresh_seed,
                             "cases": "every case, holdout included"},
            "sanitizer": {"tools": ["memcheck", "racecheck"], "case": "small", "binary": None, "ran": False}}
        return validation

    def evaluate(self, candidate) -> Evaluation:
        if candidate.defines.get("SKEW") == 4:
            self.evaluated.append(candidate)
            message = "scale2 × small: FAILED\noutput 'y': 7 of 150 elements outside tolerance"
            return Evaluation(stage="correctness", passed=False, compile=self.compile(candidate), gpu_s=self.gpu_s,
                              rejection=message, rejection_for_model=message)
        return super().evaluate(candidate)


def run_pack(tmp_path: Path, suite: Path, *argv, evaluator=FakeEvaluator, **options):
    """``cudagate optimize`` on ``suite`` with a fake harness: (exit code, pack folder, summary, history)."""
    results = tmp_path / "results"
    code = run_optimize(parse(suite, "scale2", "--allow-unsigned", "--results", results, "--quiet", *argv),
                        evaluator_factory=lambda s, p, ledger: evaluator(s, p, ledger, **options))
    pack = sorted(results.glob("run-*"))[-1]
    return code, pack, json.loads((pack / "summary.json").read_text()), json.loads((pack / "history.json").read_text())


def autotune_pack(tmp_path: Path):
    """``cudagate optimize --proposer autotune --batch 16 --max-iterations 7``: (pack, summary, history)."""
    suite = write_suite(tmp_path / "scale", yaml_text=BIG_SPACE_YAML)
    code, pack, summary, history = run_pack(tmp_path, suite, "--proposer", "autotune", "--batch", 16,
                                            "--max-iterations", 7, evaluator=WrongOnSkew4, latency_fn=latency)
    assert code == 0, summary["stop_detail"]
    return pack, summary, history


# Building it runs the whole search (tens of seconds): its tests are slow, and the fast run keeps the
# small packs' tests below.
@pytest.fixture(scope="module")
def long_search(tmp_path_factory):
    return autotune_pack(tmp_path_factory.mktemp("long"))


def fact(html: str, name: str) -> str:
    """The cell of the facts table's row ``name`` (rows follow each other in a fixed order)."""
    start = html.index(f"<tr><th>{name}</th><td>") + len(f"<tr><th>{name}</th><td>")
    end = html.index("</td></tr><tr><th>", start)
    while html.count("<table", start, end) != html.count("</table>", start, end):  # a nested table's rows
        end = html.index("</td></tr><tr><th>", end + 1)
    return html[start:end]


def cells(svg: str) -> list[tuple[float, float]]:
    return [(float(w), float(h)) for w, h in re.findall(r'<rect class="cell" x="[^"]*" y="[^"]*" width="([\d.]+)" '
                                                         r'height="([\d.]+)"', svg)]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def assert_no_repr(html: str) -> None:
    for token in ("{'", "['", "': ", ">None<", ">True<", ">False<", "<script", "src=", "href=", "url("):
        assert token not in html, token


@pytest.mark.slow
def test_a_long_search_reads_as_text_and_tables(long_search):
    pack, summary, history = long_search
    assert_pack_valid(pack)
    assert summary["attempts"] == 113 and summary["rounds"] == 7 and summary["rejected_attempts"] > 0
    html = (pack / "report.html").read_text()
    assert_no_repr(html)
    proposer = fact(html, "proposer")
    assert "<b>autotune</b>" in proposer and "<th>tunables (default first)</th>" in proposer
    assert "<th>UNROLL</th><td>1, 2, 3, 4, 5, 6</td>" in proposer and "grid (rows) · block (BLOCK)" in proposer
    assert "batch <b>16</b>" in fact(html, "options")
    budgets = fact(html, "budgets")
    assert re.search(r"<tr class=failed><td>rounds</td><td class=num>7</td><td class=num>7</td>", budgets)
    assert "max_iterations" in fact(html, "stop reason")
    assert "not a git repository" in fact(html, "git") and "--propose" in fact(html, "git")
    assert "case file(s)" in fact(html, "oracle")
    assert "BLOCK=256" in html and "grid (rows) · block (256)" in html  # the winner's defines and launch


@pytest.mark.slow
def test_the_gate_row_holds_the_final_gates_verdicts(long_search):
    pack, summary, history = long_search
    best = summary["best"]
    assert best["gate"]["passed"] is True and best["gate"]["checks"]["sanitizer"]["tools"] == ["memcheck", "racecheck"]
    assert [c["gate"]["status"] for c in best["cases"]] == ["passed"] * 4
    gate = fact((pack / "report.html").read_text(), "gate")
    assert f"attempt {best['attempt']} against the approved kernel on every case, holdout included" in gate
    rows = re.findall(r"<tr><td>([^<]+)</td><td>\w+</td><td>(holdout|)</td><td><span class=\"pill (\w+)\">", gate)
    assert rows == [("small", "", "passed"), ("perf", "", "improved"), ("perf2", "", "improved"),
                    ("hidden_77x300", "holdout", "improved")]
    perf = next(c for c in best["cases"] if c["case"] == "perf")["gate"]["ratio_vs_approved"]
    assert f"{perf['ratio']:.3f} [{perf['low']:.3f}, {perf['high']:.3f}] (99%)" in gate
    assert "fresh inputs: <b>2</b> set(s) a case plus adversarial inputs, seed 1234" in gate
    assert "compute-sanitizer (memcheck, racecheck) on case <code>small</code>: <b>did not run" in gate


@pytest.mark.slow
def test_the_chart_has_one_point_per_round(long_search):
    pack, summary, history = long_search
    html = (pack / "report.html").read_text()
    points = re.findall(r'<circle class="point" data-round="(\d+)" cx="([\d.]+)" cy="([\d.]+)"', html)
    assert [int(r) for r, _, _ in points] == list(range(summary["rounds"] + 1))
    xs, ys = [float(x) for _, x, _ in points], [float(y) for _, _, y in points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    assert ys == sorted(ys) and ys[0] < ys[-1]  # best so far only improves: lower latency is further down
    assert html.count('<circle class="winner"') == 1 and f"gated winner #{summary['best']['attempt']}" in html


@pytest.mark.slow
def test_the_heatmap_stays_legible_for_113_attempts(long_search):
    pack, summary, history = long_search
    columns, rows = summary["rounds"] + 1, len(summary["initial"]["latency_ms"]) + 1  # + the geomean row
    inline = (pack / "report.html").read_text().split("<h2>Latency per case per round</h2>")[1].split("</svg>")[0]
    standalone = (pack / "heatmap.svg").read_text()
    for svg in (inline, standalone):
        found = cells(svg)
        assert len(found) == rows * columns
        assert min(w for w, _ in found) >= MIN_CELL_W and min(h for _, h in found) >= MIN_CELL_H
        width = float(re.search(r'<svg [^>]*width="([\d.]+)"', svg).group(1))
        assert width >= columns * MIN_CELL_W  # drawn at its own size, never squeezed into the page
        assert svg.count('<rect class="winner"') == 1 and ">round 7<" in svg and ">geomean<" in svg
    assert 'class="plot' not in inline.split(">")[0] and '<div class="scroll">' in (pack / "report.html").read_text()
    width, height = png_size(pack / "heatmap.png")
    assert width >= columns * MIN_CELL_W and height >= rows * MIN_CELL_H


@pytest.mark.slow
def test_an_older_pack_renders_with_dashes(long_search, tmp_path):
    pack, summary, history = long_search
    old = json.loads(json.dumps(summary))
    for key in ("proposer", "settings", "budgets", "oracle", "git", "device", "review_branch", "stop_reasons"):
        old.pop(key, None)
    del old["best"]["gate"]
    for case in old["best"]["cases"]:
        if case["gate"]:
            case["gate"].pop("status"), case["gate"].pop("warning")
    html = render(old, history, tmp_path)
    assert_no_repr(html)
    assert fact(html, "proposer") == "–" and fact(html, "budgets") == "–"
    gate = fact(html, "gate")  # the history's record of the winner's gate fills in
    assert gate.count('class="pill improved"') == 3 and "fresh inputs: <b>2</b>" in gate
    bare = render({"run": "run-001", "outcome": "winner", "best": {"attempt": 3, "cases": []}}, {"attempts": []},
                  tmp_path)
    assert "WINNER" in bare and "fresh inputs and compute-sanitizer: –" in bare


def test_a_rejected_run_names_the_failed_gates(tmp_path):
    props = write_proposals(tmp_path / "props", [{"marker": "holdout-wrong latency=0.010"},
                                                 {"marker": "regressed latency=0.012"}])
    code, pack, summary, history = run_pack(tmp_path, opt_suite(tmp_path / "scale"), "--proposer", f"replay:{props}")
    assert summary["outcome"] == "rejected"
    html = (pack / "report.html").read_text()
    assert_no_repr(html)
    gate = fact(html, "gate")
    assert "the 2 fastest candidate(s) failed the gate" in gate
    assert "attempt 1 (proposal 1): case hidden_77x300 (holdout)" in gate and "attempt 2 (proposal 2)" in gate
    assert "<th>recorded rounds from</th>" in fact(html, "proposer") and "<th>recorded rounds</th><td>2</td>" in fact(html, "proposer")
    assert (pack / "heatmap.svg").read_text().count('<rect class="gate-failed"') == 2


def test_an_initial_kernel_that_fails_gives_no_chart(tmp_path):
    suite = opt_suite(tmp_path / "scale")
    (suite.parent / "scale.cu").write_text("// fake: wrong\n" + (suite.parent / "scale.cu").read_text())
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    code, pack, summary, history = run_pack(tmp_path, suite, "--proposer", f"replay:{props}")
    html = (pack / "report.html").read_text()
    assert summary["outcome"] == "initial_failed" and "no chart: the initial kernel was never timed" in html
    assert fact(html, "gate") == "not run" and not (pack / "heatmap.svg").exists()
    assert_no_repr(html)


def test_the_review_branch_is_in_the_report(tmp_path):
    repo = committed_project(tmp_path / "project", pytest.importorskip("git"))
    suite = tmp_path / "project" / "kernels" / "scale" / "cudagate.yaml"
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010", "launch": {"grid": ["rows"],
                                                                                         "block": ["256"]}}])
    code, pack, summary, history = run_pack(tmp_path, suite, "--proposer", f"replay:{props}", "--propose")
    assert code == 0
    assert_pack_valid(pack)
    branch = summary["review_branch"]
    assert branch["branch"] == f"cudagate/optimize-scale-scale2-{pack.name}" and branch["launch_changed"] is True
    assert branch["base"] == repo.head.commit.hexsha and branch["commit"] == repo.heads[branch["branch"]].commit.hexsha
    row = fact((pack / "report.html").read_text(), "git")
    assert f"review branch <code>{branch['branch']}</code> at <code>{branch['commit'][:12]}</code>" in row
    assert "kernels/scale/cudagate.yaml, kernels/scale/scale.cu" in row and "cudagate sign" in row
    assert f'commit <code title="{repo.head.commit.hexsha}">' in row and "clean working tree" in row


@pytest.mark.slow
def test_markup_in_a_pack_is_shown_as_text(long_search, tmp_path):
    """A pack is a file anyone can edit and carries model-written text: nothing in it becomes markup,
    and a latency that is not a finite number draws no point rather than breaking the page."""
    pack, summary, history = long_search
    payload = '<script>alert(1)</script><img src=x onerror="y">'
    hostile = json.loads(json.dumps(summary))
    hostile["outcome"], hostile["best"]["attempt"], hostile["best"]["label"] = payload, payload, payload
    attempts = json.loads(json.dumps(history))
    for attempt in attempts["attempts"][:5]:
        attempt["attempt"], attempt["label"], attempt["reason"] = payload, payload, payload
    attempts["attempts"][0]["geomean_ms"] = float("nan")
    html = render(hostile, attempts, tmp_path)
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
