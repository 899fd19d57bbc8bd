"""GitHub Actions: a job summary (markdown) and workflow-command annotations.

Escaping follows the runner's rules (actions/toolkit ``command.ts``): in a message ``%``, CR and
LF become ``%25``, ``%0D``, ``%0A``; in a property value ``:`` and ``,`` are escaped as well.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_cudagate.reports import fmt

SUMMARY_ROW_LIMIT = 200  # GitHub caps a step summary at 1 MiB; a huge table helps nobody anyway


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, message: str, **properties: str | int | None) -> str:
    props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items() if v is not None)
    return f"::{kind}{' ' + props if props else ''}::{escape_data(message)}"


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


def workflow_annotations(doc: dict, root: Path | None = None, workspace: str | None = None) -> list[str]:
    """``::error`` for each failed item, ``::warning`` for inconclusive/incomparable/unstable ones."""
    lines = []
    for item in doc["items"]:
        if item["status"] not in ("failed", "warning"):
            continue
        kind = "error" if item["status"] == "failed" else "warning"
        what = item.get("category") or item["status"]
        title = f"cudagate: {fmt.item_title(item)} {'failed' if kind == 'error' else 'warning'} ({what})"
        message = (item.get("message") or item.get("warning") or what).strip()
        message += f"\nnode {item['nodeid']}\nreproduce: {(item.get('reproduce') or [''])[0]}"
        path = annotation_path(item.get("source") or item.get("suite_path"), root, workspace)
        lines.append(command(kind, message, file=path, line=1 if path else None, title=title))
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def summary_markdown(doc: dict) -> str:
    verdict = fmt.VERDICT_WORD[doc["verdict"]]
    icon = {"FAIL": "❌", "WARN": "⚠️", "PASS": "✅"}[verdict]
    lines = [f"## {icon} cudagate {verdict}: {fmt.counts_line(doc['counts'])}", ""]
    for run in doc["runs"]:
        fp = run.get("fingerprint")
        lines.append(f"- GPU: `{fp['key']}` {fp['description']}" if fp else "- no GPU on this runner: nothing was measured")
    lines += ["", "| result | kernel × case | suite | problem | approved | current | ratio [interval] | latency | detail |",
              "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- |"]
    shown = doc["items"][:SUMMARY_ROW_LIMIT]
    for item in shown:
        lat = item.get("latency") or {}
        est = lat.get("estimate")
        current = (lat.get("current") or {}).get("median") or (item.get("correctness") or {}).get("median_ms")
        ratio = f"{fmt.ratio(est)} {fmt.interval(est)}" if est else "–"
        detail = item.get("headline") or ""
        cells = [f"**{item['status'].upper()}**" if item["status"] == "failed" else item["status"],
                 fmt.item_title(item), item["suite"], item.get("category") or item["kind"],
                 fmt.us((lat.get("approved") or {}).get("median")), fmt.us(current), ratio,
                 lat.get("verdict", "–"), fmt.clip(detail, 140)]
        lines.append("| " + " | ".join(_cell(str(c)) for c in cells) + " |")
    if len(doc["items"]) > len(shown):
        lines.append(f"\n…and {len(doc['items']) - len(shown)} more: see the HTML report artifact.")
    lines += ["", "Full evidence (plots, error figures, telemetry, reproduction commands): the `report.html` artifact.", ""]
    return "\n".join(lines)


def in_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"
