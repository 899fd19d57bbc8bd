"""GitHub Actions: a job summary (markdown) and workflow-command annotations.

Every string of the report goes through :mod:`.escape`: the runner's escaping in annotations,
Markdown's in the summary.

The runner obeys any line of a step's output that starts with ``::`` after its leading blanks, or
holds ``##[`` anywhere (the legacy form), and a pull request's file names and compiler logs reach
that output. So a gate run stops command processing first (:func:`stop_commands`, with a random
token nothing printed later can know) and resumes it only around its own annotations
(:func:`publish`) and at exit.
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pytest_cudagate.reports import escape, fmt

if TYPE_CHECKING:
    from pytest_cudagate.reports.model import Report

SUMMARY_ROW_LIMIT = 200  # GitHub caps a step summary at 1 MiB; a huge table helps nobody anyway


def command(kind: str, message: str, **properties: str | int | None) -> str:
    props = ",".join(f"{k}={escape.annotation_property(v)}" for k, v in properties.items() if v is not None)
    return f"::{kind}{' ' + props if props else ''}::{escape.annotation(message)}"


@dataclass
class _Commands:
    """Whether the runner obeys commands in this process's output: one state per process, since the
    runner keeps one per step, and the gate runs as one process."""

    token: str | None = None  # while stopped: the token that resumes
    stream: TextIO | None = None  # where the stop went: the resume at exit goes there too


_COMMANDS = _Commands()


def _write(line: str) -> None:
    _COMMANDS.stream.write(line + "\n")
    _COMMANDS.stream.flush()  # before anything reaches stderr, which the runner reads too, unbuffered


def stop_commands() -> None:
    """In GitHub Actions, have the runner obey no workflow command in this process's output, until it
    exits; once per process."""
    if not in_actions() or _COMMANDS.token is not None:
        return
    _COMMANDS.stream = sys.stdout
    _stop(_write)
    atexit.register(_resume_at_exit)


def _stop(write: Callable[[str], None]) -> None:
    _COMMANDS.token = secrets.token_hex(16)
    write(f"::stop-commands::{_COMMANDS.token}")


def _resume_at_exit() -> None:
    """Commands back on for whatever the step runs after the gate (the runner resets at the step's end)."""
    if _COMMANDS.token is None:
        return
    try:
        _write(f"::{_COMMANDS.token}::")
    except (OSError, ValueError):  # that stream closed (a capture's), or its reader gone: nobody reads it
        pass
    _COMMANDS.token = None


def publish(lines: list[str], write: Callable[[str], None]) -> None:
    """Write the gate's own workflow commands (annotations) through ``write`` where the runner obeys
    them: with commands stopped, resume for these lines alone, then stop again under a fresh token
    (the old one is in the log by now)."""
    if _COMMANDS.token is None or not lines:
        for line in lines:
            write(line)
        return
    write(f"::{_COMMANDS.token}::")
    for line in lines:
        write(line)
    _stop(write)
    sys.stdout.flush()  # the stop out before anything reaches stderr


def annotation_path(source: str | None, root: Path | None, workspace: str | None) -> str | None:
    """The kernel source relative to the checkout, which is what GitHub attaches annotations to."""
    if not source:
        return None
    if root is None or not workspace:
        return source
    path = Path(source) if Path(source).is_absolute() else root / source
    try:
        return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
    except ValueError:
        return source


def workflow_annotations(doc: Report, root: Path | None = None, workspace: str | None = None) -> list[str]:
    """``::error`` for each failed item, ``::warning`` for inconclusive/incomparable/unstable ones."""
    lines = []
    for item in doc.items:
        if item.status not in ("failed", "warning"):
            continue
        kind = "error" if item.status == "failed" else "warning"
        what = item.category or item.status
        title = f"cudagate: {fmt.item_title(item)} {'failed' if kind == 'error' else 'warning'} ({what})"
        message = (item.message or item.warning or what).strip()
        message += f"\nnode {item.nodeid}\nreproduce: {(item.reproduce or [''])[0]}"
        path = annotation_path(item.source or item.suite_path, root, workspace)
        lines.append(command(kind, message, file=path, line=1 if path else None, title=title))
    return lines


def summary_markdown(doc: Report) -> str:
    verdict = fmt.VERDICT_WORD[doc.verdict]
    icon = {"FAIL": "❌", "WARN": "⚠️", "PASS": "✅"}[verdict]
    lines = [f"## {icon} cudagate {verdict}: {fmt.counts_line(doc.counts)}", ""]
    for run in doc.runs:
        fp = run.fingerprint
        # the key: 16 hex digits by the schema
        lines.append(f"- GPU: `{fp.key}` {escape.markdown(fp.description)}" if fp
                     else "- no GPU on this runner: nothing was measured")
    lines += ["", "| result | kernel × case | suite | problem | approved | current | ratio [interval] | latency | detail |",
              "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- |"]
    shown = doc.items[:SUMMARY_ROW_LIMIT]
    for item in shown:
        lat = item.latency
        est = lat and lat.estimate
        current = ((lat.current.median if lat and lat.current else None)
                   or (item.correctness.median_ms if item.correctness else None))
        ratio = f"{fmt.ratio(est)} {fmt.interval(est)}" if est else "–"
        detail = item.headline or ""
        status = f"**{item.status.upper()}**" if item.status == "failed" else item.status
        cells = [status, fmt.item_title(item), item.suite, item.category or item.kind,
                 fmt.us(lat.approved.median if lat and lat.approved else None), fmt.us(current), ratio,
                 lat.verdict.value if lat else "–"]
        lines.append("| " + " | ".join([*map(escape.markdown, cells), escape.markdown(detail, 140)]) + " |")
    if len(doc.items) > len(shown):
        lines.append(f"\n…and {len(doc.items) - len(shown)} more: see the HTML report artifact.")
    lines += ["", "Full evidence (plots, error figures, telemetry, reproduction commands): the `report.html` artifact.", ""]
    return "\n".join(lines)


def in_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"
