"""benchmarks/card_floor.py derive on CPU: the between-card floor from measure outputs and ledgers, and
the shipped _BETWEEN_CARD_OFFSET against every kept card-floor file."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import card_floor  # noqa: E402
from evidence_header import with_header  # noqa: E402
from pytest_cudagate.boundary import schema  # noqa: E402
from pytest_cudagate.judge import stats  # noqa: E402

EVIDENCE = ROOT / "benchmarks" / "evidence"


def measured(path: Path, card: str, runs: dict[tuple[str, str], list[float]], held: bool = True) -> Path:
    """A file as ``card_floor.py measure --json`` writes it, with made-up levels on ``card``."""
    levels = [{"suite": "matmul", "kernel": kernel, "case": case, "card": card, "gpu_name": "NVIDIA H200",
               "driver": "580.159.04", "held": held, "session": f"host-{card}", "run_levels_ms": levels}
              for (kernel, case), levels in runs.items()]
    document = with_header({"levels": levels}, ROOT / "benchmarks" / "card_floor.py", ["measure", "--json", path.name],
                           card=f"NVIDIA H200 {card}, driver 580.159.04")
    assert schema.problems(document, "card-floor") == []
    path.write_text(json.dumps(document))
    return path


def test_the_floor_is_the_widest_run_against_the_other_cards_approval(tmp_path, capsys):
    a = measured(tmp_path / "a.json", "GPU-a", {("mm", "perf"): [1.00, 1.00], ("sm", "perf"): [2.0, 2.0]})
    b = measured(tmp_path / "b.json", "GPU-b", {("mm", "perf"): [1.05, 0.97], ("sm", "perf"): [2.02, 2.02]})
    out = tmp_path / "derived.json"
    assert card_floor.main(["derive", str(a), str(b), "--json", str(out)]) == 0
    # mm: B's runs against A's mean are +5 % and -3 %; A's runs against B's geometric mean are the reverse of
    # its centre, -ln(1.05 * 0.97) / 2 = -0.94 %. The widest is ln(1.05).
    document = json.loads(out.read_text())
    assert document["floor"] == pytest.approx(0.05, rel=1e-12)
    assert schema.problems(document, "card-floor-derived") == []
    (mm, sm) = document["offsets"]
    assert (mm["low"], mm["high"]) == (pytest.approx(-0.03), pytest.approx(0.05))
    assert (mm["approval_card"], mm["today_card"]) == ("GPU-a", "GPU-b")
    assert sm["high"] == pytest.approx(0.01) and sm["low"] == pytest.approx(1 / 1.01 - 1)
    assert "floor: ±5.00 %" in capsys.readouterr().out


def test_a_slower_card_counts_by_its_log_offset(tmp_path):
    # -8 % is ln(0.92) = -0.0834 in log space, wider than +8 % (0.0770): the floor is 1/0.92 - 1 = 8.7 %.
    a = measured(tmp_path / "a.json", "GPU-a", {("k", "c"): [1.0, 1.0]})
    b = measured(tmp_path / "b.json", "GPU-b", {("k", "c"): [0.92, 0.92]})
    out = tmp_path / "derived.json"
    assert card_floor.main(["derive", str(a), str(b), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["floor"] == pytest.approx(1 / 0.92 - 1)


def test_runs_of_one_card_or_of_held_and_unheld_timing_give_no_floor(tmp_path, capsys):
    a = measured(tmp_path / "a.json", "GPU-a", {("k", "c"): [1.0, 1.01]})
    again = measured(tmp_path / "a2.json", "GPU-a", {("k", "c"): [1.2, 1.2]})  # another session, same card
    unheld = measured(tmp_path / "b.json", "GPU-b", {("k", "c"): [1.3, 1.3]}, held=False)
    assert card_floor.main(["derive", str(a), str(again), str(unheld)]) == 1
    assert "no (kernel, case) timed on two cards the same way in 3 file(s)" in capsys.readouterr().err


def test_ledgers_are_read_by_their_baselines_cards(tmp_path):
    # The shipped matmul ledger, and a copy as if approved on another card 3 % slower.
    ledger = json.loads((ROOT / "examples" / "matmul" / "cudagate.approvals.json").read_text())
    for approval in ledger["approvals"].values():
        for baseline in approval["baselines"].values():
            baseline["fingerprint"]["uuid"] += "-other"
            for entry in baseline["cases"].values():
                entry["run_p10_ms"] = [1.03 * math.exp(sum(map(math.log, entry["run_p10_ms"])) / len(entry["run_p10_ms"]))] * 2
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / "cudagate.approvals.json"
    copy.write_text(json.dumps(ledger))
    out = tmp_path / "derived.json"
    assert card_floor.main(["derive", str(ROOT / "examples" / "matmul" / "cudagate.approvals.json"), str(copy),
                            "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    # Each case's widest offset is the 3 % shift plus the spread of the shipped runs around their mean.
    assert all(o["cards"] == 2 for o in document["offsets"]) and document["offsets"]
    assert 0.03 <= document["floor"] < 0.2


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"rows": []}', "field 'levels' missing"),
    ('{"levels": [{"card": "x"}]}', "schemas/card-floor.schema.json"),
])
def test_a_bad_file_is_refused_in_one_line(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert card_floor.main(["derive", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"card_floor: {bad}: " in err and message in err


def kept() -> list[Path]:
    """The measured files, and the shipped ledgers, whose baselines keep the approval runs of their card."""
    measured = sorted(p for p in EVIDENCE.rglob("card-floor-*.json") if not p.name.startswith("card-floor-derived-"))
    return measured + (sorted((EVIDENCE.parents[1] / "examples").glob("*/cudagate.approvals.json")) if measured else [])


def test_the_shipped_offset_covers_the_kept_evidence():
    files = kept()
    if not files:
        pytest.skip("no card-floor evidence kept yet: run `python benchmarks/card_floor.py measure` on two cards")
    found = card_floor.offsets([entry for path in files for entry in card_floor.load(path)])
    assert found, f"the kept card-floor files time no (kernel, case) on two cards: {[p.name for p in files]}"
    assert stats._BETWEEN_CARD_OFFSET >= card_floor.floor_of(found)
