"""Render docs/evidence.md from the kept JSON under benchmarks/evidence/, so no measured figure is typed.

    python benchmarks/tables.py            # rewrite docs/evidence.md
    python benchmarks/tables.py --check    # exit 1, with a diff, when docs/evidence.md is not what it renders

Each section of the page comes from the files its entry in ``SECTIONS`` matches (globs under
benchmarks/evidence/), through the script that wrote them (its own table code where it has one). A
file written with ``evidence_header.with_header`` names its command, commit, card and date; once a
section has such a file, files without the header drop out of it. A section of header-less files is
shown as older evidence, "commit: not recorded". ``pick="newest"`` keeps the one file of the latest
date; ``pick="all"`` keeps every match (runs merged over sessions or cards). To add evidence: write the
script's ``--json`` under benchmarks/evidence/ with a name its section's globs match, then run this.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from evidence_header import Header, read_header  # noqa: E402

PAGE = ROOT / "docs" / "evidence.md"
EVIDENCE = ROOT / "benchmarks" / "evidence"


@dataclass(frozen=True)
class Kept:
    """One kept file: where it is (relative to the repository root), its content and its header."""

    path: str
    document: dict
    header: Header | None

    @property
    def date(self) -> str:
        """Its date: the header's, else the date the script itself wrote in (older files), else ''."""
        if self.header:
            return self.header.date
        meta = self.document.get("meta") if isinstance(self.document.get("meta"), dict) else self.document
        return str(meta.get("date") or meta.get("created") or "")


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    globs: tuple[str, ...]  # under benchmarks/evidence/
    pick: str  # "newest" or "all"
    render: Callable[[list[Kept]], str]
    about: str  # one line: what the section measures
    exclude: str = ""  # a name prefix its globs also match that belongs elsewhere


# -- renderers: each takes the kept files of its section and returns markdown ------------------------

def render_gate_power(files: list[Kept]) -> str:
    import gate_power

    merged = "python benchmarks/gate_power.py --merge " + " ".join(f.path for f in files)
    return gate_power.tables([r for f in files for r in f.document["rows"]], [f.document["meta"] for f in files],
                             merged=merged).replace("\n### ", "\n#### ").replace("### ", "#### ", 1)


def render_timing_fidelity(files: list[Kept]) -> str:
    from timing_fidelity import cell

    results = files[0].document["results"]
    tools = list(results)
    labels = list(results["cudagate"])
    out = ["| kernel | " + " | ".join(f"{tool} cold µs" for tool in tools) + " |", "|---|" + "---|" * len(tools)]
    for label in labels:
        ref = results["cudagate"][label]
        out.append(f"| {label} | " + " | ".join(cell(results[t][label], None if t == "cudagate" else ref)
                                               for t in tools) + " |")
    procs = {t: max((len(v) for v in results[t].values()), default=0) for t in tools}
    out.append("\nmedian [min, max] over fresh processes (" + ", ".join(f"{t}: {n}" for t, n in procs.items())
               + "); in brackets after a peer: its median against cudagate's")
    out += [f"\nnot measured: {e[:300]}" for e in files[0].document.get("errors", [])]
    return "\n".join(out)


def render_bisect_power(files: list[Kept]) -> str:
    from bisect_power import table

    return table(files[0].document["meta"], files[0].document["runs"])


def render_release_drift(files: list[Kept]) -> str:
    from release_drift import table

    return table({k: v for k, v in files[0].document.items() if k != "evidence"})


def render_gate_speed(files: list[Kept]) -> str:
    out = []
    for kept in files[0].document["tables"]:
        out += [f"#### {kept['title']}", "", "| what | value |", "|---|---|",
                *(f"| {what} | {value} |" for what, value in kept["rows"]), ""]
    return "\n".join(out).rstrip()


def render_gate_speed_each(files: list[Kept]) -> str:
    """Several runs side by side (the same card before and after a change): each file's tables under its commit."""
    out = []
    for kept in files:
        h = kept.header
        card = f", {h.card}" if h and h.card else ""
        out += [f"#### `{h.commit[:12] if h and h.commit else 'commit not recorded'}`: {kept.path.rsplit('/', 1)[-1]}{card}", ""]
        for t in kept.document["tables"]:
            out += [f"{t['title']}:", "", "| what | value |", "|---|---|", *(f"| {w} | {v} |" for w, v in t["rows"]), ""]
    return "\n".join(out).rstrip()


def render_report_equality(files: list[Kept]) -> str:
    out = []
    for kept in files:
        d = kept.document
        out += [f"#### {kept.path.rsplit('/', 1)[-1]}", "",
                f"{len(d['differences'])} differences:" if d["differences"] else "0 differences.", "",
                "| | |", "|---|---|", *(f"| {label} | {value} |" for label, value in d["rows"]), "",
                *(f"- {line}" for line in d["differences"]), ""]
    return "\n".join(out).rstrip()


def render_history_speed(files: list[Kept]) -> str:
    d = files[0].document
    out = [f"{d['commits']} commits × {d['cases']} cases, {d['rounds']} rounds a case; {d['cpus']} CPUs, "
           f"Python {d['python']}; history {d['history_bytes'] / 2**20:.1f} MiB, page {d['page_bytes'] / 2**20:.1f} MiB",
           "", "| step | what | seconds | ms per report | target |", "|---|---|---:|---:|---|"]
    for row in d["rows"]:
        per = f"{row['per_report_ms']:.1f}" if row["per_report_ms"] is not None else ""
        target = "" if row["target_s"] is None else f"≤ {row['target_s']:g} s: {'met' if row['met'] else 'MISSED'}"
        out.append(f"| {row['step']} | {row['what']} | {row['seconds']:.2f} | {per} | {target} |")
    return "\n".join(out)


def render_run_level_rounds(files: list[Kept]) -> str:
    d = files[0].document
    counts = [str(n) for n in d["counts"]]
    out = [f"Level = 10th percentile. Offset: the larger of |level(first N) / level(all) - 1| and the same for the "
           f"last N launches, %. Spread: standard deviation of ln(level) over the approval runs, %; the gate floors "
           f"it at {d['floor_pct']:.1f} % (RUN_SPREAD_FLOOR). Ledgers: {', '.join(d['ledgers'])}.", "",
           "| case | launches | " + " | ".join(f"offset, N={n}" for n in counts)
           + " | spread of the approval runs | stopping rule: launches | stopping rule: offset |",
           "|---|---|" + "---|" * len(counts) + "---|---|---|"]
    rows = d["rows"]
    for r in rows:
        out.append(f"| {r['case']} | {r['launches']} | " + " | ".join(f"{r['offset_pct'][n]:.2f}" for n in counts)
                   + f" | {r['spread_pct']:.2f} | {r['ruled_launches']} | {r['ruled_offset_pct']:.2f} |")
    out.append("| **worst** | | " + " | ".join(f"**{max(r['offset_pct'][n] for r in rows):.2f}**" for n in counts)
               + f" | {max(r['spread_pct'] for r in rows):.2f} | | **{max(r['ruled_offset_pct'] for r in rows):.2f}** |")
    return "\n".join(out)


def render_card_floor(files: list[Kept]) -> str:
    import card_floor
    from pytest_cudagate.judge import stats

    # The shipped ledgers keep their approval runs' levels, on the card that approved them: a second card
    ledgers = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*/cudagate.approvals.json"))
    levels = ([card_floor.Levels(**entry) for f in files for entry in f.document["levels"]]
              + [entry for path in ledgers for entry in card_floor.load(ROOT / path)])
    found = card_floor.offsets(levels)
    if not found:
        cards = sorted({e.card for e in levels})
        return (f"No (kernel, case) was timed on two cards the same way yet (cards so far: {', '.join(cards) or 'none'}):"
                " no floor is derived from these files.")
    floor = card_floor.floor_of(found)
    verdict = "at least" if stats._BETWEEN_CARD_OFFSET >= floor else "BELOW"
    return (f"`python benchmarks/card_floor.py derive {' '.join([f.path for f in files] + ledgers)}`\n\n"
            f"{card_floor.table(found)}\n\n"
            f"Floor: ±{100 * floor:.2f} %. The shipped `_BETWEEN_CARD_OFFSET` (pytest_cudagate/judge/stats.py) is "
            f"±{100 * stats._BETWEEN_CARD_OFFSET:.1f} %, {verdict} the floor.")


def render_hang_cost(files: list[Kept]) -> str:
    from hang_cost import table

    return table(files[0].document)


def render_digest_cost(files: list[Kept]) -> str:
    d = files[0].document
    out = [f"{d['device']}, {d['rounds']} cold rounds, medians of {d['repeats']}", "",
           "| output bytes | digest µs | wall ms/launch, without | with | added | checked |", "|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['output_bytes']} | {r['digest_us']:.2f} | {r['wall_ms_per_launch_without']:.4f} | "
                   f"{r['wall_ms_per_launch_with']:.4f} | {r['added_pct']:+.1f} % | {r['launches_checked']} |")
    return "\n".join(out)


def render_hostile_kernels(files: list[Kept]) -> str:
    from hostile_kernels import tables

    return "\n\n".join(tables(f.document["truth"], f.document["rows"], f.document["meta"]) for f in files)


def render_public_kernels(files: list[Kept]) -> str:
    from public_kernels import tables

    return "\n\n".join(tables(f.document) for f in files)


SECTIONS = (
    Section("decisions", "Gate power: the decision rows (A/A, +3 %, +5 %)",
            ("**/gate-power-decisions-*.json", "trust-2026-12-02/gate-power-after-d6781b0.json"), "newest", render_gate_power,
            "What `pytest --cuda-gate` says about an identical copy and about copies made 3 % and 5 % slower, each "
            "comparison in a fresh process, beside nvbench's measure of the true slowdown.",
            ),
    Section("steps-power", "Gate power on an operation of steps: attention (cuBLAS GEMM, memset, two kernels, cuBLAS GEMM)",
            ("**/gate-power-attention-*.json",), "all", render_gate_power,
            "examples/attention approved, then copies whose `row_max` kernel spins at the start of every block, "
            "judged by `pytest --cuda-gate` in a fresh process each; the true slowdown of the whole operation is "
            "nvbench's, replaying every step (the cuBLAS calls through CuPy's cuBLAS)."),
    Section("held-aa", "Gate power: A/A false alarms on held timing",
            ("**/gate-power-aa-held-*.json",), "all", render_gate_power,
            "How often the gate calls an identical copy `regressed`, over many fresh processes, sessions and cards."),
    Section("card-floor", "Between-card floor of a stored baseline",
            ("**/card-floor-*.json",), "all", render_card_floor,
            "How far an unchanged kernel's run level moves between cards: the floor under a stored-baseline verdict.",
            exclude="card-floor-derived-"),
    Section("release-drift", "Release gate: drift against a stored release",
            ("**/release-drift-*.json",), "newest", render_release_drift,
            "The stored-runs judgement of unchanged kernels, a slow creep of approvals, and a toolchain change."),
    Section("timing-fidelity", "Timing fidelity: cudagate against other timers",
            ("**/timing-fidelity-*.json",), "newest", render_timing_fidelity,
            "The same cold launches timed by cudagate, nvbench, Nsight Compute and Triton's do_bench."),
    Section("gate-speed", "What the gate costs around the kernels",
            ("**/gate-speed-*.json",), "newest", render_gate_speed,
            "Plugin off, and `pytest --cuda-gate examples` first and warm.", exclude="gate-speed-path-"),
    Section("gate-path", "What the gate costs around the kernels: before and after pipelining, one card",
            ("**/gate-speed-path-*.json",), "all", render_gate_speed_each,
            "`pytest --cuda-gate examples` run by the code before the next case was sent while one is judged (79ff75a) "
            "and by the code after (756eac7), on one card in one session; 4285322 and ac34bf8 each on another H200; "
            "then one prepare thread (bdae3b3) against one per three cores, four on a 16-core runner: 30536c7 on a "
            "fifth H200 and 317d06c on a sixth, each pair in one session (folders card-af671d16 and card-ed128917). "
            "Compare each file with its own card's runs only. A before run measured "
            "`git archive` of its commit unpacked at /tmp/before (`--tree`); its \"uncommitted changes\" mark "
            "compares the runner's own checkout, the after code, with that commit."),
    Section("report-equality", "Report equality: the examples gated one by one and pipelined",
            ("**/report-equality-*.json",), "all", render_report_equality,
            "report.json of the examples from two commits' code on one card, one fresh-input seed, every field but "
            "the measured times compared: 79ff75a (one by one) against 4285322 (pipelined); bdae3b3 (one prepare "
            "thread) against 30536c7 and 317d06c (four); 05787dd against 0299754 (this round's steps, instantiations, ulp, padded "
            "buffers and house moves; examples/attention left out, the code before has no such suite). Each file is "
            "named by its after commit."),
    Section("run-level-rounds", "Launches a kernel timed alone needs",
            ("**/run-level-rounds-*.json",), "newest", render_run_level_rounds,
            "From the shipped ledgers' approval runs: how far a run level of N launches lands from the level of all."),
    Section("bisect-power", "Bisect: finding the slow commit",
            ("**/bisect-power*.json",), "newest", render_bisect_power,
            "`cudagate bisect` run again and again over a repository in which one commit makes a kernel slower."),
    Section("history-speed", "History: record and show at scale",
            ("**/history-speed-*.json",), "newest", render_history_speed,
            "`cudagate history record` over one report per commit, and `history show` over all of them (CPU)."),
    Section("hang-cost", "A hanging kernel: what it costs a gate run",
            ("**/hang-cost-*.json",), "newest", render_hang_cost,
            "A suite with a kernel that never returns, against the same suite without it, under one case timeout."),
    Section("hostile-kernels", "Kernels written to pass: an input-keyed and a self-throttling kernel",
            ("**/hostile-kernels-*.json",), "all", render_hostile_kernels,
            "The matmul example approved, then a kernel fast only on the committed inputs, one that burns "
            "tensor-core work after its product, and honest A/A copies (timing on fresh inputs on, and off for its "
            "cost), each judged by fresh gate processes; every variant also timed alone by `cudagate run` on the "
            "signed inputs (the keyed one on other inputs too)."),
    Section("public-kernels", "Kernels nobody here wrote: three public projects, unmodified",
            ("**/public-kernels-*.json",), "newest", render_public_kernels,
            "cuda-samples' reduction, SGEMM_CUDA and llm.c's dev/cuda files as their authors keep them (tests/public/): "
            "each version's verdict and median latency, against the order its authors publish."),
    Section("digest-cost", "Output digests: what checking every timed launch costs",
            ("**/digest-cost-*.json",), "newest", render_digest_cost,
            "The digest of each timed launch's outputs, against the same loop without it."),
)


# -- reading and choosing ------------------------------------------------------------------------------

def read(path: Path, evidence: Path) -> Kept:
    shown = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.relative_to(evidence).as_posix()
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"tables.py: {shown}: cannot read it as JSON ({exc}); rewrite it with its script's --json")
    try:
        header = read_header(document)
    except ValueError as exc:
        raise SystemExit(f"tables.py: {shown}: field 'evidence': {exc}") from None
    return Kept(shown, document, header)


def chosen(section: Section, evidence: Path) -> list[Kept]:
    paths = sorted({p for glob in section.globs for p in evidence.glob(glob)
                    if not (section.exclude and p.name.startswith(section.exclude))})
    files = [read(p, evidence) for p in paths]
    current = [f for f in files if f.header]
    files = current or files  # files of today's code replace older evidence
    if section.pick == "newest" and files:
        files = [max(files, key=lambda f: (f.date, f.path))]
    return files


def sources(files: list[Kept]) -> list[str]:
    out = ["| file | command | commit | card | date |", "|---|---|---|---|---|"]
    for f in files:
        h = f.header
        if h:
            commit = f"`{h.commit[:12]}`" + (" (uncommitted changes)" if h.dirty else "") if h.commit else "not recorded"
            out.append(f"| `{f.path}` | `{h.command}` | {commit} | {h.card} | {h.date} |")
        else:
            meta = f.document.get("meta") if isinstance(f.document.get("meta"), dict) else f.document
            command = f"`{meta['command']}`" if meta.get("command") else "not recorded"
            card = meta.get("gpu") or meta.get("gpus") or meta.get("device") or "not recorded"
            if isinstance(card, list):
                card = "; ".join(map(str, card)) or "not recorded"
            commit = f"`{meta['commit']}` (the script's own field)" if meta.get("commit") else "not recorded"
            out.append(f"| `{f.path}` | {command} | {commit} | {card} | {f.date or 'not recorded'} |")
    return out


def render(evidence: Path = EVIDENCE) -> str:
    out = ["# Evidence: the measured tables",
           "",
           "<!-- Generated by `python benchmarks/tables.py` from benchmarks/evidence/; do not edit by hand. -->",
           "",
           "Every figure here is rendered from a JSON file kept under `benchmarks/evidence/`, by the script that "
           "measured it. Each section names the files, and for each the command that wrote it, the commit, the card "
           "and the date. Files written before the header existed are marked **older evidence**: their commit was "
           "not recorded. Regenerate the page, or check it, with:",
           "",
           "```console",
           "$ python benchmarks/tables.py --check",
           "```",
           "",
           "docs/claims.md maps each figure the README and docs quote to its section here.",
           ""]
    for section in SECTIONS:
        files = chosen(section, evidence)
        out += [f'<a id="{section.anchor}"></a>', "", f"## {section.title}", "", section.about, ""]
        if not files:
            out += [f"No kept file yet (`benchmarks/evidence/{'`, `benchmarks/evidence/'.join(section.globs)}`).", ""]
            continue
        if not any(f.header for f in files):
            out += ["**Older evidence**: written before its script recorded the evidence header; a commit is shown only "
                    "where the script kept one of its own.", ""]
        out += [*sources(files), "", section.render(files).rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when the page differs")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (default docs/evidence.md)")
    parser.add_argument("--evidence", type=Path, default=EVIDENCE, help="the kept files (default benchmarks/evidence)")
    args = parser.parse_args(argv)
    text = render(args.evidence.resolve())
    if not args.check:
        args.page.write_text(text)
        return 0
    have = args.page.read_text() if args.page.is_file() else ""
    if have == text:
        return 0
    diff = difflib.unified_diff(have.splitlines(True), text.splitlines(True), f"{args.page} (as it is)",
                                f"{args.page} (as rendered)")
    sys.stdout.writelines(diff)
    print(f"\n{args.page} differs from what benchmarks/tables.py renders from {args.evidence}: run "
          "`python benchmarks/tables.py` (never edit the page by hand)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
