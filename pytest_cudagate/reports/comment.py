"""``cudagate report comment``: a gate report as one pull-request comment, in GitHub-flavoured Markdown.

The report.json comes from a run of the pull request's kernels, so every string in it is the pull
request's: it is read within the boundary's rules and checked as every reader checks it
(:func:`.writer.read_report`), and each cell goes through :func:`.escape.markdown` (nothing in it
opens an element, link, image, code span or table cell, or links a mention, reference, URL or
address). The comment opens with a marker line that the posting step finds again, so that a later
run updates the same comment, and it is cut to fit GitHub's limit, least important rows first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_cudagate import __version__
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.reports import escape, fmt

if TYPE_CHECKING:
    from pytest_cudagate.judge.latency import LatencyResult, RunSpreadJudgement
    from pytest_cudagate.judge.stats import RatioEstimate
    from pytest_cudagate.reports.model import Item, Report, Run, SkippedItem

COMMENT_LIMIT = 65_536  # GitHub refuses a longer comment body (counted here in UTF-16 units: never more)
MARKER = "cudagate-comment"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A link the workflow gives (the artifact's page): nothing that could end the Markdown link early.
_URL = re.compile(r"https?://[A-Za-z0-9\-._~:/?#@!$&*+,;=%]{1,2040}")
NAME_CHARS = 120  # of a kernel, case or suite name shown; the HTML report has them whole
DETAIL_CHARS = 160
MAX_RUNS_SHOWN = 8
_NOTE_ROOM = 400  # kept free in each section for its closing lines and the note on rows left out

FAILED, IMPROVED, WARNED, UNCHANGED, SKIPPED = "failed", "improved", "warned", "unchanged", "skipped"
GROUPS = (FAILED, IMPROVED, WARNED, UNCHANGED, SKIPPED)  # the comment's order
FOLDED = (UNCHANGED, SKIPPED)
_TITLES = {FAILED: "Regressions and failures", IMPROVED: "Improvements", WARNED: "Warnings",
           UNCHANGED: "Unchanged", SKIPPED: "Not replayed"}
_ICONS = {FAILED: "❌", IMPROVED: "🚀", WARNED: "⚠️", UNCHANGED: "", SKIPPED: ""}


@dataclass(frozen=True)
class Entry:
    """One kernel × case as a row of the comment: its section, its place there, its escaped cells."""

    group: str
    order: tuple
    cells: tuple[str, ...]


def marker(comment_id: str | None) -> str:
    """The comment's first line, by which the posting step finds the comment to update."""
    if comment_id is None:
        return f"<!-- {MARKER} -->"
    if not _ID.fullmatch(comment_id):
        raise CudagateError(f"--id {comment_id!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                            "letter or digit (e.g. --id h100)")
    return f"<!-- {MARKER}: {comment_id} -->"


def _link(report_url: str | None) -> str:
    if report_url is None:
        return "The full report (plots, telemetry, reproduction commands) is `report.html` in the run's report artifact."
    if not _URL.fullmatch(report_url):
        raise CudagateError(f"--report-url {fmt.clip(report_url, 80)!r}: give an http(s) URL without spaces, quotes, "
                            "brackets or parentheses (e.g. the artifact-url output of actions/upload-artifact)")
    return f"[The full report]({report_url}): plots, telemetry and reproduction commands."


def _units(value: str) -> int:
    return len(value.encode("utf-16-le")) // 2


def _estimates(latency: LatencyResult | None) -> list[tuple[str, RatioEstimate | RunSpreadJudgement]]:
    """The comparisons to show, each with its ratio and interval: against the approved version (or, for
    a kernel identical to it, its approval runs) and, in release mode, against the release."""
    found = []
    for label, result in (("", latency), ("release ", latency and latency.release)):
        estimate = result and (result.estimate or result.run_spread)
        if estimate:
            found.append((label, estimate))
    return found


def _group(item: Item | SkippedItem) -> str:
    latency = item.latency
    verdicts = {latency and latency.verdict.value, latency and latency.release and latency.release.verdict.value}
    if item.status == "failed" or "regressed" in verdicts:
        return FAILED
    if "improved" in verdicts:
        return IMPROVED
    return {"warning": WARNED, "skipped": SKIPPED}.get(item.status, UNCHANGED)


def _gpu(run: Run) -> str:
    fingerprint = run.fingerprint
    if not fingerprint:
        return "no GPU"
    name = fingerprint.fields.get("gpu_name")
    return escape.markdown(name if isinstance(name, str) else fingerprint.description, 40)


def _entry(index: int, item: Item | SkippedItem, runs: list[Run]) -> Entry:
    group = _group(item)
    latency = item.latency
    estimates = _estimates(latency)
    ratio = estimates[0][1].ratio if estimates else 1.0
    what = item.category or ("latency improved" if group == IMPROVED else item.status)
    result = escape.markdown(f"{_ICONS[group]} {what}".strip(), 40)
    medians = [summary.median if latency and (summary := getattr(latency, side)) else None
               for side in ("approved", "current")]
    cells = [f"**{result}**" if group == FAILED else result,
             escape.markdown(fmt.item_title(item), NAME_CHARS), escape.markdown(item.suite, NAME_CHARS),
             *([_gpu(runs[item.run])] if len(runs) > 1 else []),
             # numbers alone (the schema holds them numbers): nothing to escape
             f"{fmt.us(medians[0])} → {fmt.us(medians[1])}" if any(m is not None for m in medians) else "–",
             "<br>".join(f"{label}{fmt.ratio(e)} {fmt.interval(e)}" for label, e in estimates) or "–",
             "<br>".join(f"{label}{fmt.change(e)}" for label, e in estimates) or "–",
             escape.markdown(item.headline, DETAIL_CHARS)]
    # Regressions, largest first, before the other failures; improvements, largest first.
    order = {FAILED: (not estimates, -ratio), IMPROVED: (ratio,)}.get(group, ())
    return Entry(group, (*order, index), tuple(cells))


def _section(title: str, folded: bool, rows: list[tuple[str, ...]], header: list[str], budget: int,
             noun: str = "case", icon: str = "") -> str:
    """A table's Markdown, at most ``budget`` UTF-16 units: as many rows as fit, then a note."""
    heading = f"{title} ({len(rows)})"
    if folded:
        opening, closing = [f"<details><summary>{heading}</summary>", ""], ["", "</details>"]
    else:
        opening, closing = [f"#### {icon} {heading}", ""], []
    lines = [*opening, "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    used = sum(_units(line) + 1 for line in lines) + _NOTE_ROOM
    shown = 0
    for cells in rows:
        row = "| " + " | ".join(cells) + " |"
        if used + _units(row) + 1 > budget:
            break
        lines.append(row)
        used += _units(row) + 1
        shown += 1
    if shown < len(rows):
        left = len(rows) - shown
        note = (f"…and {left} more {noun if left == 1 else noun + 's'} not shown here (a comment holds at most "
                f"{COMMENT_LIMIT:,} characters): the full report lists every {noun}.")
        if not shown:
            lines = [f"**{title}: {len(rows)}**, not shown (a comment holds at most {COMMENT_LIMIT:,} "
                     f"characters): the full report lists every {noun}."]
            return "\n".join(lines) if _units(lines[0]) <= budget else ""
        lines += ["", note]
    return "\n".join(lines + closing)


def _builds(runs: list[Run]) -> tuple[list[str], list[tuple[str, ...]]]:
    """The compile facts as a table: one row per build and entry (the entry named where a kernel has
    several), a GPU column where there are several runs."""
    several = len(runs) > 1
    header = ["kernel", *(["GPU"] if several else []), "arch", "registers", "spills (store / load)", "static shared",
              "compiler", "compile"]
    facts = [(run, f) for run in runs for f in run.compiles]
    entries: dict[tuple, int] = {}
    for run, f in facts:
        key = (id(run), f.suite, f.kernel, f.variant)
        entries[key] = entries.get(key, 0) + 1
    rows = []
    for run, f in facts:
        name = " · ".join(filter(None, (f.suite, f.kernel, f.variant and f"class {f.variant}",
                                        f.entry if entries[(id(run), f.suite, f.kernel, f.variant)] > 1 else None)))
        spills = ("–" if f.spill_store_bytes is None and f.spill_load_bytes is None
                  else f"{fmt.sig(f.spill_store_bytes, 9)} / {fmt.sig(f.spill_load_bytes, 9)} B")
        rows.append((escape.markdown(name, NAME_CHARS), *([_gpu(run)] if several else []), escape.markdown(f.arch, 20),
                     fmt.sig(f.registers, 9), spills,
                     "–" if f.shared_static_bytes is None else f"{f.shared_static_bytes} B",
                     escape.markdown(f.compiler or "–", 40),
                     fmt.compile_time(f.compile_s) if f.ok else "**failed**"))
    return header, rows


def _runs_lines(runs: list[Run]) -> list[str]:
    lines = []
    for number, run in enumerate(runs[:MAX_RUNS_SHOWN], 1):
        fingerprint = run.fingerprint
        where = (f"{escape.markdown(fingerprint.description, 200)} (`{fingerprint.key}`)" if fingerprint
                 else "no GPU on this runner: nothing was measured")
        lines.append(f"- {'run ' + str(number) + ': ' if len(runs) > 1 else ''}{where}")
    if len(runs) > MAX_RUNS_SHOWN:
        lines.append(f"- …and {len(runs) - MAX_RUNS_SHOWN} more runs")
    return lines


def render(document: Report, *, report_url: str | None = None, comment_id: str | None = None) -> str:
    """The comment for a report document (as :func:`read` returns it): marker, verdict, then regressions
    and failures, improvements, warnings, and the unchanged cases folded; within GitHub's limit."""
    first = marker(comment_id)
    link = _link(report_url)
    verdict = fmt.VERDICT_WORD[document.verdict]
    icon = {"FAIL": "❌", "WARN": "⚠️", "PASS": "✅"}[verdict]
    head = [first, f"### {icon} cudagate {verdict}: {fmt.counts_line(document.counts)}", "",
            *_runs_lines(document.runs), "", link, ""]
    foot = [f"<sub>cudagate {__version__}: later runs of this pull request update this comment. The gate job's "
                "check is what blocks a merge.</sub>", ""]
    runs = document.runs
    header = ["result", "kernel × case", "suite", *(["GPU"] if len(runs) > 1 else []), "latency (approved → current)",
              "ratio [interval]", "change", "detail"]
    entries = [_entry(i, item, runs) for i, item in enumerate(document.items)]
    budget = COMMENT_LIMIT - sum(_units(line) + 1 for line in head + foot)
    sections = []
    for group in GROUPS:
        members = sorted((e for e in entries if e.group == group), key=lambda e: e.order)
        section = (_section(_TITLES[group], group in FOLDED, [e.cells for e in members], header, budget,
                            icon=_ICONS[group]) if members else "")
        if section:
            sections += [section, ""]
            budget -= _units(section) + 2
    if not entries:
        sections = ["The report holds no kernel × case: nothing was judged.", ""]
    build_header, builds = _builds(runs)
    section = _section("Builds", True, builds, build_header, budget, "build") if builds else ""
    if section:
        sections += [section, ""]
    return "\n".join(head + sections + foot)


