"""docs/evidence.md is what benchmarks/tables.py renders from the kept JSON, and a hand-edit fails the check;
the evidence header names command, commit, card and date, and files of today's code replace older ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tables  # noqa: E402
from evidence_header import Header, read_header, with_header  # noqa: E402

DIGESTS = ROOT / "benchmarks" / "evidence" / "trust-2026-12-02" / "digest-cost-e4f6915.json"


def test_the_page_is_what_the_kept_files_render(capsys):
    assert tables.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def test_a_hand_edit_fails_the_check_with_a_diff(tmp_path, capsys):
    page = tmp_path / "evidence.md"
    text = (ROOT / "docs" / "evidence.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 4096 | "))  # a digest-cost figure
    page.write_text(text.replace(row, row.replace("| 4096 | ", "| 4096 | 1", 1)))
    assert tables.main(["--check", "--page", str(page)]) == 1
    captured = capsys.readouterr()
    assert f"-{row.replace('| 4096 | ', '| 4096 | 1', 1)}" in captured.out and f"+{row}" in captured.out
    assert "run `python benchmarks/tables.py`" in captured.err


def test_writing_then_checking_agrees(tmp_path):
    page = tmp_path / "evidence.md"
    assert tables.main(["--page", str(page)]) == 0
    assert tables.main(["--check", "--page", str(page)]) == 0


def headed(document: dict, commit: str, date: str, dirty: bool = False) -> dict:
    header = Header("python benchmarks/digest_cost.py --json out.json", commit, dirty, "NVIDIA H200 GPU-new, driver 1",
                    date, "benchmarks/digest_cost.py")
    return {**header.to_json(), **document}


def test_files_with_the_header_replace_older_ones_and_the_newest_wins(tmp_path):
    evidence = tmp_path / "evidence"
    (evidence / "old").mkdir(parents=True)
    shutil.copy(DIGESTS, evidence / "old" / DIGESTS.name)
    only_old = tables.render(evidence)
    section = only_old.split("## Output digests")[1].split("\n## ")[0]
    assert "**Older evidence**" in section and "| not recorded | not recorded | NVIDIA H200 | not recorded |" in section

    raw = json.loads(DIGESTS.read_text())
    (evidence / "new").mkdir()
    (evidence / "new" / "digest-cost-a.json").write_text(json.dumps(headed(raw, "a" * 40, "2026-12-03T09:00:00Z")))
    changed = {**raw, "rows": [{**raw["rows"][0], "digest_us": 9.99}]}
    (evidence / "new" / "digest-cost-b.json").write_text(
        json.dumps(headed(changed, "b" * 40, "2026-12-03T10:00:00Z", dirty=True)))
    section = tables.render(evidence).split("## Output digests")[1].split("\n## ")[0]
    assert "Older evidence" not in section and DIGESTS.name not in section and "digest-cost-a.json" not in section
    assert ("| `new/digest-cost-b.json` | `python benchmarks/digest_cost.py --json out.json` | `bbbbbbbbbbbb` "
            "(uncommitted changes) | NVIDIA H200 GPU-new, driver 1 | 2026-12-03T10:00:00Z |") in section
    assert "| 4096 | 9.99 |" in section


def test_a_section_without_files_says_so_and_invents_nothing(tmp_path):
    (tmp_path / "evidence").mkdir()
    text = tables.render(tmp_path / "evidence")
    assert text.count("No kept file yet") == len(tables.SECTIONS)
    assert "| file |" not in text


def test_a_broken_kept_file_names_itself(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "digest-cost-x.json").write_text("{")
    with pytest.raises(SystemExit, match=r"tables.py: digest-cost-x.json: cannot read it as JSON"):
        tables.render(evidence)
    (evidence / "digest-cost-x.json").write_text(json.dumps({"evidence": {"command": "x"}, "rows": []}))
    with pytest.raises(SystemExit, match=r"digest-cost-x.json: field 'evidence': evidence header lacks commit, dirty"):
        tables.render(evidence)


def test_the_header_names_how_what_and_when():
    document = with_header({"rows": []}, ROOT / "benchmarks" / "gate_speed.py", ["--json", "a b.json"], card="card X")
    assert list(document) == ["evidence", "rows"]
    header = read_header(document)
    assert header.command == "python benchmarks/gate_speed.py --json 'a b.json'"
    assert header.script == "benchmarks/gate_speed.py" and header.card == "card X"
    assert header.commit is None or len(header.commit) == 40
    assert header.date.endswith("Z") and header.date[:4].isdigit()
    assert read_header({"rows": []}) is None


def claims() -> list[list[str]]:
    """The rows of docs/claims.md's table of measured figures, as cells."""
    text = (ROOT / "docs" / "claims.md").read_text().split("## Measured figures")[1].split("\n## ")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ")]
    assert rows[0][0] == "figure" and len(rows) > 1
    return rows[1:]


def test_each_claim_names_a_figure_its_section_prints():
    page = (ROOT / "docs" / "evidence.md").read_text()
    anchors = {s.anchor: s for s in tables.SECTIONS}
    for figure, printed, where, kept, script in claims():
        anchor = where.split("(evidence.md#")[1].rstrip(")")
        assert anchor in anchors, (figure, where)
        section = page.split(f'<a id="{anchor}"></a>')[1].split("<a id=")[0]
        if printed == "none yet":
            assert "No kept file yet" in section, f"{anchor} has evidence now: quote its figure in docs/claims.md"
        else:
            assert printed.strip("`") in section, (figure, printed, anchor)
        assert kept.strip("`").removeprefix("benchmarks/evidence/") in anchors[anchor].globs, (figure, kept)
        assert (ROOT / script.strip("`").split()[0]).is_file(), script


def test_a_named_commit_is_recorded_and_compared_where_git_knows_it(monkeypatch):
    # A GPU machine's copy of the tree may carry no .git, or a stale one: the run names its commit.
    monkeypatch.setenv("CUDAGATE_EVIDENCE_COMMIT", "0" * 40)
    header = read_header(with_header({}, ROOT / "benchmarks" / "tables.py", []))
    assert (header.commit, header.dirty) == ("0" * 40, None)  # no such commit: whether it differs is unknown
    monkeypatch.delenv("CUDAGATE_EVIDENCE_COMMIT")
    here = read_header(with_header({}, ROOT / "benchmarks" / "tables.py", []))
    if here.commit is None:
        pytest.skip("this checkout has no git")
    monkeypatch.setenv("CUDAGATE_EVIDENCE_COMMIT", here.commit)
    assert read_header(with_header({}, ROOT / "benchmarks" / "tables.py", [])).dirty is here.dirty


@pytest.mark.slow
def test_each_section_renders_what_its_script_writes(tmp_path):
    # The CPU scripts write their --json here; the GPU ones are covered by the kept files above.
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    for args in (["run_level_rounds.py", "--json", str(evidence / "run-level-rounds-t.json")],
                 ["gate_speed.py", "--plugin-only", "--repeats", "1", "--json", str(evidence / "gate-speed-t.json")],
                 ["history_speed.py", "--commits", "3", "--cases", "1", "--rounds", "20",
                  "--json", str(evidence / "history-speed-t.json")]):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / args[0]), *args[1:]], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 1) and (evidence / Path(args[-1]).name).is_file(), done.stderr[-2000:]
    levels = [{"suite": "s", "kernel": "k", "case": "c", "card": card, "gpu_name": "NVIDIA H200", "driver": "1",
               "held": True, "session": card, "run_levels_ms": runs} for card, runs in (("GPU-a", [1.0, 1.0]),
                                                                                         ("GPU-b", [1.04, 1.04]))]
    floor = with_header({"levels": levels}, ROOT / "benchmarks" / "card_floor.py")
    (evidence / "card-floor-t.json").write_text(json.dumps(floor))
    text = tables.render(evidence)
    section = {s.anchor: text.split(f'<a id="{s.anchor}"></a>')[1].split("<a id=")[0] for s in tables.SECTIONS}
    assert "| **worst** |" in section["run-level-rounds"]
    assert "#### Plugin off" in section["gate-speed"] and "cost of the installed plugin" in section["gate-speed"]
    assert "| record | 3 reports x 1 cases, one command |" in section["history-speed"]
    assert "| k | c | yes | 2 | -3.85 % | +4.00 % | GPU-a → GPU-b |" in section["card-floor"]
    assert "Floor: ±4.00 %." in section["card-floor"] and "at least the floor" in section["card-floor"]
    for anchor in ("run-level-rounds", "gate-speed", "history-speed", "card-floor"):
        assert "Older evidence" not in section[anchor] and "| file | command | commit | card | date |" in section[anchor]
