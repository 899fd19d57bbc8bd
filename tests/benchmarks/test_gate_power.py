"""benchmarks/gate_power.py without a GPU: its tables, --merge, the upper bound, the peer-version check
and the per-card streams, on synthetic rows and fake comparisons (the GPU paths run on the H200)."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gate_power  # noqa: E402
from gate_power import Gpu, UsageError  # noqa: E402

CARDS = [Gpu(i, f"GPU-{i}0000000-aaaa", "NVIDIA H200", f"GPU-{i}0000000-aaaa") for i in range(3)]


def meta(session: str, cards: list[Gpu], command: str = "python benchmarks/gate_power.py --aa-only 6") -> dict:
    return {"command": command, "date": "2026-12-02 10:00 UTC", "gpu": f"{len(cards)}× NVIDIA H200 (driver 580.1)",
            "gpus": [c.to_json() for c in cards], "session": session}


def gate_row(session: str, card: Gpu, target: float, verdict: str, n: int, ratio: float = 1.0) -> dict:
    rng = np.random.default_rng(n)
    approved = list(0.015 + rng.normal(0, 0.0003, 60))
    return {"tool": "cudagate", "suite": "matmul", "case": "perf_256", "target": target, "rep": n,
            "verdict": verdict, "status": "passed", "ratio": ratio, "pairs": 60 + n, "wall_s": 6.0 + n,
            "approved": approved, "current": [a * ratio for a in approved], "session": session,
            "gpu": card.index, "gpu_uuid": card.uuid}


def run_file(tmp_path: Path, name: str, session: str, cards: list[Gpu], verdicts: list[str]) -> Path:
    rows = [gate_row(session, cards[n % len(cards)], 0.0, v, n) for n, v in enumerate(verdicts)]
    path = tmp_path / name
    path.write_text(json.dumps({"meta": meta(session, cards), "rows": rows}))
    return path


# -- the upper bound ----------------------------------------------------------------------------------

def test_upper_bound_is_clopper_pearson_one_sided():
    assert gate_power.upper95(0, 200) == pytest.approx(1 - 0.05 ** (1 / 200), rel=1e-9)  # 1.49 %
    assert gate_power.upper95(1, 100) == pytest.approx(0.0466, abs=5e-4)
    assert gate_power.upper95(5, 5) == 1.0
    bounds = [gate_power.upper95(k, 200) for k in range(5)]
    assert bounds == sorted(bounds) and bounds[0] < 0.015 < bounds[1]


# -- the tables --------------------------------------------------------------------------------------

def synthetic_run() -> tuple[list[dict], list[dict]]:
    """One main run on cards 0-1 (A/A and +5 %, truth and peers) and an A/A-only run on card 2."""
    rows = [{"tool": "nvbench", "suite": "matmul", "target": t, "proc": p, "ratio": r, "base_us": 14.8,
             "session": "s1"} for t, rs in ((0.0, (0.999, 1.001, 1.0)), (0.05, (1.049, 1.05, 1.051)))
            for p, r in enumerate(rs)]
    rows += [gate_row("s1", CARDS[n % 2], 0.0, "regressed" if n == 0 else "pass", n) for n in range(4)]
    rows += [gate_row("s1", CARDS[n % 2], 0.05, "regressed", n, ratio=1.05) for n in range(4)]
    rows += [{"tool": "peers", "suite": "matmul", "target": t, "rep": n, "exit": 0, "session": "s1",
              "pytest-benchmark median:2%": t > 0 and n < 3, "gpucheck default": False,
              "gpucheck min_effect 1.02": t > 0, "asv factor 1.1": False, "asv factor 1.02": t > 0 and n == 0,
              "gpu": n % 2, "gpu_uuid": CARDS[n % 2].uuid} for t in (0.0, 0.05) for n in range(4)]
    rows += [{"tool": "cudagate", "suite": "matmul", "target": 0.0, "rep": 9, "error": "no report.json",
              "wall_s": 1.0, "session": "s1"}]
    rows += [gate_row("s2", CARDS[2], 0.0, "inconclusive" if n == 1 else "pass", n) for n in range(2)]
    metas = [meta("s1", CARDS[:2], "python benchmarks/gate_power.py --gpus 2"), meta("s2", CARDS[2:])]
    return rows, metas


def table_line(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_main_table_gives_truth_gate_and_peers_per_variant():
    rows, metas = synthetic_run()
    text = gate_power.tables(rows, metas)
    main = text.split("### A/A")[0]
    aa = table_line(main, "| matmul perf_256 | A/A")
    slow = table_line(main, "| matmul perf_256 | +5%")
    assert aa[2] == "+0.00 % [-0.10, +0.10] (3)" and slow[2] == "+5.00 % [+4.90, +5.10] (3)"
    assert aa[3] == "+0.00 % [+0.00, +0.00] (6)" and slow[3] == "+5.00 % [+5.00, +5.00] (4)"  # the gate's own estimates
    assert aa[4] == "17% (1/6)" and aa[5] == "17% (1/6)"  # both sessions' A/A; the error row is not a verdict
    assert slow[4] == "100% (4/4)" and slow[5] == "0% (0/4)"
    assert slow[6:11] == ["75% (3/4)", "0% (0/4)", "100% (4/4)", "0% (0/4)", "25% (1/4)"]
    assert aa[6:11] == ["0% (0/4)"] * 5
    assert slow[11] == "7.5 / 9.0"
    assert "1 comparison(s) gave no verdict" in main


def test_a_a_summary_counts_cards_and_sessions_with_per_card_false_alarms():
    rows, metas = synthetic_run()
    text = gate_power.tables(rows, metas)
    summary = next(line for line in text.splitlines() if line.startswith("A/A:"))
    assert ("`regressed` in 1 of 6 comparisons, each in a fresh process, on 3 distinct card(s) over 2 session(s) "
            "(the cards of one host share it)") in summary
    assert summary.endswith(f"{gate_power.upper95(1, 6):.1%}.")
    assert table_line(text, f"| `{CARDS[0].uuid}`") == [f"`{CARDS[0].uuid}`", "NVIDIA H200", "1", "2", "1", "0", "0"]
    assert table_line(text, f"| `{CARDS[1].uuid}`")[3:] == ["2", "0", "0", "0"]
    assert table_line(text, f"| `{CARDS[2].uuid}`")[3:] == ["2", "0", "1", "0"]


def test_the_a_a_symmetry_counts_skew_in_each_direction():
    """Identical copies: a process where one reads more than 3 % slower counts on its side."""
    rows = [gate_row("s1", CARDS[0], 0.0, "pass", n) for n in range(5)]
    for row, factor in zip(rows, (1.10, 1.05, 1.0, 1.0, 0.95)):  # the approved copy 10 % and 5 % slower, then 5 % faster
        row["approved"] = [a * factor for a in row["current"]]
    rows[0]["verdict"], rows[0]["ratio"] = "improved", 0.91
    text = gate_power.tables(rows, [meta("s1", CARDS[:1])])
    assert table_line(text, "| matmul perf_256 | 5 |")[2:4] == ["2", "1"]
    assert table_line(text, f"| `{CARDS[0].uuid}`")[-1] == "1"  # the improved verdict
    assert table_line(text, "| matmul perf_256 | 5 |")[4] == "+0.00 % [-9.00, +0.00] (5)"


def test_the_a_a_symmetry_counts_launches_in_the_slow_tail_of_each_copy():
    """Launches that waited inside their event pair form a second mode several µs above the kernel's time."""
    rows = [gate_row("s1", CARDS[0], 0.0, "pass", n) for n in range(2)]
    for row in rows:
        row["approved"] = [a * (2.0 if i % 4 == 0 else 1.0) for i, a in enumerate(row["approved"])]  # 15 of 60
    text = gate_power.tables(rows, [meta("s1", CARDS[:1])])
    assert table_line(text, "| matmul perf_256 | 2 |")[-1] == "25% / 0%"


def test_rows_of_the_first_edition_count_one_card_per_session():
    rows = [{k: v for k, v in gate_row(s, CARDS[0], 0.0, "pass", n).items() if k not in ("gpu", "gpu_uuid")}
            for s in ("old-a", "old-b") for n in range(3)]
    text = gate_power.tables(rows, [{k: v for k, v in meta(s, []).items() if k != "gpus"} for s in ("old-a", "old-b")])
    assert "0 of 6 comparisons, each in a fresh process, on 2 distinct card(s)" in text
    bare = [{k: v for k, v in row.items() if k not in ("approved", "current")} for row in rows]
    assert "identical copies" in text and "identical copies" not in gate_power.tables(bare, [meta("old-a", [])])
    assert table_line(text, "| `old-a/gpu0`")[1:] == ["—", "1", "3", "0", "0", "0"]


def test_every_session_is_named_above_every_table():
    rows, metas = synthetic_run()
    lines = gate_power.tables(rows, metas).splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("### ")]
    assert len(headings) == 3
    for start, end in zip(headings, headings[1:] + [len(lines)]):
        block = lines[start:end]
        first_table = next(i for i, line in enumerate(block) if line.startswith("| "))
        above = "\n".join(block[:first_table])
        for m in metas:
            assert f"- `{m['command']}` — {m['date']} — {m['gpu']} — session `{m['session']}`" in above


def test_the_same_samples_table_applies_the_rules_to_the_gates_samples():
    rows, metas = synthetic_run()
    same = gate_power.tables(rows, metas).split("### the rule alone")[1]
    slow = table_line(same, "| matmul perf_256 | +5%")
    assert slow[2] == "100% (4/4)" and slow[3] == "100% (4/4)" and slow[4] == "0% (0/4)"  # median:2% and :5%
    assert slow[-1] == "61"  # median of 60..63 rounds, whole


# -- --merge -----------------------------------------------------------------------------------------

def test_merge_prints_the_tables_of_every_session(tmp_path, capsys):
    a = run_file(tmp_path, "a.json", "host-a-1", CARDS[:2], ["pass", "regressed", "pass", "pass"])
    b = run_file(tmp_path, "b.json", "host-b-1", CARDS[2:], ["pass", "pass"])
    assert gate_power.main(["--merge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Each tool as its users run it")
    assert f"Merged by `python benchmarks/gate_power.py --merge {a} {b}` from:" in out
    assert "session `host-a-1`" in out.split("| suite")[0] and "session `host-b-1`" in out.split("| suite")[0]
    assert "`regressed` in 1 of 6 comparisons" in out and "on 3 distinct card(s)" in out and "over 2 session(s)" in out


@pytest.mark.parametrize("spoil, expected", [
    (lambda p: p.unlink(), r"a\.json: cannot read it \(No such file or directory\): pass files written by --json"),
    (lambda p: p.write_text("{"), r"a\.json: not JSON \(.*\): pass files written by --json"),
    (lambda p: p.write_text(json.dumps({"rows": []})), r"a\.json: \(top level\): 'meta' is a required property"),
    (lambda p: p.write_text(json.dumps({"meta": meta("x", []), "rows": [
        {k: v for k, v in gate_row("x", CARDS[0], 0.0, "pass", 0).items() if k != "verdict"}]})),
     r"a\.json: rows\[0\]: 'verdict' is a required property \(schemas/gate-power\.schema\.json\)"),
])
def test_merge_refuses_a_bad_file_in_one_line(tmp_path, capsys, spoil, expected):
    path = run_file(tmp_path, "a.json", "host-a-1", CARDS[:1], ["pass"])
    spoil(path)
    assert gate_power.main(["--merge", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(expected, err), err


def test_merge_refuses_one_session_twice(tmp_path, capsys):
    a = run_file(tmp_path, "a.json", "host-a-1", CARDS[:1], ["pass"])
    copy = tmp_path / "copy.json"
    copy.write_text(a.read_text())
    assert gate_power.main(["--merge", str(a), str(copy)]) == 2
    assert f"copy.json: session host-a-1 is already in {a}: pass each run once" in capsys.readouterr().err


# -- the peer tools' versions ------------------------------------------------------------------------

def fake_site(root: Path, versions: dict[str, str]) -> str:
    """A folder that, first on PYTHONPATH, makes importlib.metadata report ``versions``."""
    for name, version in versions.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(root)


@pytest.mark.parametrize("pytest_v, bench_v", [("9.2.0", "5.2.3"), ("9.2.0", "5.3.0"), ("10.0.1", "5.1.0")])
def test_a_pytest_benchmark_that_cannot_run_stops_the_run_before_the_gpu(tmp_path, monkeypatch, capsys,
                                                                          pytest_v, bench_v):
    monkeypatch.setenv("PYTHONPATH", fake_site(tmp_path, {"pytest": pytest_v, "pytest-benchmark": bench_v,
                                                           "gpucheck": "0.1.0"}))
    monkeypatch.setattr(gate_power, "prepare", lambda *a: pytest.fail("prepared a suite after a failed check"))
    assert gate_power.main(["--quick", "--gpus", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gate_power: pytest-benchmark {bench_v} does not run under pytest {pytest_v} (its fixture reads "
                   "Node._nodeid, gone since pytest 9.2): carry pytest-benchmark>=5.3.1 with the other wheels, "
                   "or run the peers under pytest<9.2")


@pytest.mark.parametrize("pytest_v, bench_v", [("9.2.0", "5.3.1"), ("9.1.3", "5.2.3"), ("8.4.0", "5.1.0")])
def test_working_peer_versions_pass_the_check(tmp_path, pytest_v, bench_v):
    wanted = {"pytest": pytest_v, "pytest-benchmark": bench_v, "gpucheck": "0.1.0"}
    env = {"PYTHONPATH": fake_site(tmp_path, wanted), **gate_power.peers_env(CARDS[0])}
    assert gate_power.check_peer_tools(env) == wanted


def test_the_check_runs_in_the_peers_environment():
    env = gate_power.peers_env(CARDS[1])
    assert env == {"PYTEST_ADDOPTS": "", "CUDA_VISIBLE_DEVICES": CARDS[1].uuid}
    assert gate_power.peers_env(gate_power.UNPINNED) == {"PYTEST_ADDOPTS": ""}


# -- streams -----------------------------------------------------------------------------------------

def test_streams_run_concurrently_one_card_each_in_job_order():
    barrier = threading.Barrier(3, timeout=20)  # only passes if the three streams' first jobs overlap
    seen = []

    def job(gpu: Gpu, n: int) -> list[dict]:
        if n < 3:
            barrier.wait()
        seen.append((gpu.index, n))
        return [{"tool": "cudagate", "n": n, "env": gpu.env()}]

    rows = gate_power.run_streams(CARDS, 8, job)
    assert sorted(r["n"] for r in rows) == list(range(8))
    for row in rows:
        card = CARDS[row["n"] % 3]
        assert (row["gpu"], row["gpu_uuid"], row["env"]) == (card.index, card.uuid,
                                                                {"CUDA_VISIBLE_DEVICES": card.uuid})
    for card in CARDS:
        assert [n for i, n in seen if i == card.index] == list(range(card.index, 8, 3))


def test_a_stream_starts_no_job_that_would_end_past_the_deadline():
    now = [0.0]
    ran = []

    def job(gpu: Gpu, n: int) -> list[dict]:
        ran.append(n)
        now[0] += 10.0
        return [{"n": n}]

    rows = gate_power.run_streams(CARDS[:1], 5, job, deadline_s=25.0, clock=lambda: now[0])
    assert ran == [0, 1] and [r["n"] for r in rows] == [0, 1]  # a third would end at 30 s


@pytest.mark.parametrize("requested, found, expected", [
    (None, CARDS, CARDS), (2, CARDS, CARDS[:2]), (None, [], [gate_power.UNPINNED]), (1, [], [gate_power.UNPINNED])])
def test_gpus_picks_the_first_cards(requested, found, expected):
    assert gate_power.streams_for(requested, found) == expected


@pytest.mark.parametrize("requested, found, message", [
    (4, CARDS, "--gpus 4: NVML sees only 3 GPU(s) here"), (2, [], "--gpus 2: NVML sees only 0 GPU(s) here"),
    (0, CARDS, "--gpus 0: give at least 1")])
def test_gpus_beyond_the_cards_is_refused(requested, found, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        gate_power.streams_for(requested, found)


def fake_prepare(name: str, work: Path, env: dict) -> gate_power.Prepared:
    """gate_power.prepare without a GPU: an approved one-kernel suite folder."""
    root = work / name / "approved"
    root.mkdir(parents=True)
    (root / "k.cu").write_text("__global__ void k() {}\n")
    (root / "cudagate.yaml").write_text("kernels: []\n")
    return gate_power.Prepared(name, root, "k.cu", "k", f"perf_{name}", root / "request.json", 10.0)


def test_aa_only_spreads_fresh_comparisons_over_the_cards_and_writes_a_mergeable_file(tmp_path, monkeypatch,
                                                                                       capsys):
    """The whole --aa-only path with the GPU parts faked: which card, which report folder, which file."""
    calls = []

    def fake_comparison(suite_yaml: Path, report: Path, env: dict) -> dict:
        calls.append((suite_yaml.parent.parent.name, report, env["CUDA_VISIBLE_DEVICES"]))
        assert "identical copy (A/A)" in (suite_yaml.parent / "k.cu").read_text()
        return {"verdict": "regressed" if report.name == "aa-4" else "pass", "status": "passed", "ratio": 1.0,
                "low": 0.99, "high": 1.01, "pairs": 80, "measurement_s": 1.2, "wall_s": 6.0, "exit": 0,
                "approved": [0.015] * 5, "current": [0.015] * 5}

    monkeypatch.setattr(gate_power, "visible_gpus", lambda: CARDS[:2])
    monkeypatch.setattr(gate_power, "prepare", fake_prepare)
    monkeypatch.setattr(gate_power, "gate_comparison", fake_comparison)
    out = tmp_path / "aa.json"
    assert gate_power.main(["--aa-only", "6", "--json", str(out)]) == 0
    assert sorted(report.name for _, report, _ in calls) == [f"aa-{n}" for n in range(6)]
    for suite, report, pin in calls:
        n = int(report.name.split("-")[1])
        assert suite == gate_power.SUITES[n % 2] and pin == CARDS[n % 2].uuid
    document = gate_power.load_runs([out])[0]
    assert [g["uuid"] for g in document["meta"]["gpus"]] == [CARDS[0].uuid, CARDS[1].uuid]
    assert {(r["rep"], r["gpu_uuid"]) for r in document["rows"]} == {(n, CARDS[n % 2].uuid) for n in range(6)}
    text = capsys.readouterr().out
    assert "`regressed` in 1 of 6 comparisons, each in a fresh process, on 2 distinct card(s)" in text


@pytest.mark.parametrize("text, expected", [("0,3,5", (0.0, 0.03, 0.05)), ("5,0", (0.0, 0.05)), ("1.5", (0.015,))])
def test_targets_are_percents_sorted(text, expected):
    assert gate_power.parse_targets(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0,three", "0,60", "3,3", "-1"])
def test_bad_targets_are_refused_in_one_line(text, capsys):
    with pytest.raises(SystemExit) as exit_:
        gate_power.main(["--targets", text])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--targets" in err and "write e.g. 0,3,5" in err


def test_gate_only_runs_no_peer_and_only_the_targets_asked(tmp_path, monkeypatch):
    """--targets 0,3,5 --gate-only: the gate's comparisons and nvbench's truth for those variants, no peer tool
    (not even its version check)."""
    compared = []

    def no_peers(*args, **kwargs):
        raise AssertionError("a peer tool ran under --gate-only")

    def fake_comparison(suite_yaml: Path, report: Path, env: dict) -> dict:
        compared.append(report.name)
        return {"verdict": "pass", "status": "passed", "ratio": 1.0, "low": 0.99, "high": 1.01, "pairs": 80,
                "measurement_s": 1.2, "wall_s": 3.0, "exit": 0, "approved": [0.015] * 5, "current": [0.015] * 5}

    monkeypatch.setattr(gate_power, "visible_gpus", lambda: CARDS[:1])
    monkeypatch.setattr(gate_power, "prepare", fake_prepare)
    monkeypatch.setattr(gate_power, "calibrate", lambda prepared, targets, work, env: {
        (p.name, t): int(t * 1e5) for p in prepared for t in targets})
    monkeypatch.setattr(gate_power, "nvbench", lambda probes, work, env: {p["label"]: 1e-5 for p in probes})
    monkeypatch.setattr(gate_power, "check_peer_tools", no_peers)
    monkeypatch.setattr(gate_power, "peers_rep", no_peers)
    monkeypatch.setattr(gate_power, "gate_comparison", fake_comparison)
    out = tmp_path / "rerun.json"
    assert gate_power.main(["--targets", "0,3,5", "--gate-only", "--reps", "2", "--truth-procs", "1",
                            "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert sorted({r["target"] for r in rows if r["tool"] == "cudagate"}) == pytest.approx([0.0, 0.03, 0.05])
    assert not [r for r in rows if r["tool"] == "peers"]
    assert len(compared) == 2 * len(gate_power.SUITES) * 3
