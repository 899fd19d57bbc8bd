"""The HTML report: one self-contained page (inline CSS and SVG, no scripts, no fetches).

Order follows what a reader needs: the verdict, then what failed and why, then every result, what
each kernel compiled to, then the per-case evidence, hardware and suites.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_cudagate.reports import escape, fmt
from pytest_cudagate.reports.html_item import MAX_PLOTS, article, pill
from pytest_cudagate.reports.html_style import CSS

if TYPE_CHECKING:
    from pytest_cudagate.reports.model import Item, Report, SkippedItem


def anchors(items: list[Item | SkippedItem]) -> list[str]:
    return [f"item-{n}" for n in range(1, len(items) + 1)]


def _run_label(doc: Report, run: int) -> str:
    fp = doc.runs[run].fingerprint if run < len(doc.runs) else None
    return fp.description.split(" (")[0].removeprefix("NVIDIA ") + f" {fp.key[:8]}" if fp else "no GPU"


def _library_cell(item: Item | SkippedItem) -> str:
    """× of the library with its interval, or why there is none (informational only)."""
    library = item.library
    if not library:
        return "–"
    est = library.estimate
    if est:
        return escape.html(f"{fmt.ratio(est)}× {fmt.interval(est, confidence=False)}")
    return f'<span class="note" title="{escape.html(library.error or None)}">{escape.html(fmt.clip(library.error, 80))}</span>'


def _result_row(doc: Report, item: Item | SkippedItem, anchor: str, several_runs: bool, library: bool = False) -> str:
    lat = item.latency
    est = lat and lat.estimate
    approved = lat.approved.median if lat and lat.approved else None
    current = lat.current.median if lat and lat.current else None
    if current is None:
        current = item.correctness.median_ms if item.correctness else None
    detail = item.headline or ""
    cells = [(pill(item.status), ""), (f'<a href="#{anchor}">{escape.html(fmt.item_title(item))}</a>', ""),
             (escape.html(item.suite), ""), (escape.html(item.category or " · ".join(filter(None, (item.kind, item.shape_class)))), "")]
    if several_runs:
        cells.append((escape.html(_run_label(doc, item.run)), ""))
    cells += [(escape.html(fmt.us(approved)), "num"), (escape.html(fmt.us(current)), "num"), (escape.html(fmt.ratio(est)), "num"),
              (escape.html(fmt.interval(est, confidence=False)), "num")]
    if library:
        cells.append((_library_cell(item), "num"))
    cells += [(pill(lat.verdict.value) if lat else "–", ""), (escape.html(fmt.clip(detail, 200)), "detail")]
    return "<tr>" + "".join(f'<td class="{cls}">{html}</td>' if cls else f"<td>{html}</td>" for html, cls in cells) + "</tr>"


def results_table(doc: Report, items: list[tuple[Item | SkippedItem, str]]) -> str:
    several = len(doc.runs) > 1
    levels = {i.latency.estimate.confidence for i, _ in items if i.latency and i.latency.estimate}
    interval = f"interval ({levels.pop():.0%})" if len(levels) == 1 else "interval"
    labels = sorted({i.library.label for i, _ in items if i.library})
    library = [f"× {labels[0] if len(labels) == 1 else 'library'} (informational)"] if labels else []
    head = ["result", "kernel × case", "suite", "problem / kind · class"] + (["GPU"] if several else []) + [
        "approved median", "current median", "ratio", interval, *library, "latency", "detail"]
    body = "".join(_result_row(doc, item, anchor, several, bool(library)) for item, anchor in items)
    return f"<div class=scroll><table><tr>{''.join(f'<th>{escape.html(h)}</th>' for h in head)}</tr>{body}</table></div>"


def runs_section(doc: Report) -> str:
    parts = []
    for number, run in enumerate(doc.runs):
        fp = run.fingerprint
        title = f"{fp.key}: {fp.description}" if fp else "no GPU on this runner: nothing was measured"
        rows = [("host", run.host), ("created", run.created), ("cudagate", run.tool_version),
                ("options", ", ".join(f"{k}={v}" for k, v in run.options.items()) or "defaults"),
                ("pytest exit status", run.exitstatus)]
        github = run.github or {}
        if github.get("run_id"):
            rows.append(("GitHub run", f"{github.get('server_url')}/{github.get('repository')}/actions/runs/{github['run_id']}"
                                       f" (job {github.get('job')}, {github.get('sha')})"))
        rows += [(k, v) for k, v in (fp.fields if fp else {}).items()]
        body = "".join(f"<tr><th>{escape.html(k)}</th><td>{escape.html(v)}</td></tr>" for k, v in rows)
        parts.append(f"<h3>run {number + 1}: <span class=mono>{escape.html(title)}</span></h3><table class=kv>{body}</table>")
    return "".join(parts)


def builds_section(doc: Report) -> str:
    """What every compile item built, per kernel build and entry: registers, spills, static shared
    memory, the compiler and the compile time (or "cached")."""
    several = len(doc.runs) > 1
    head = ["suite", "kernel", "entry", *(["GPU"] if several else []), "arch", "registers", "spill stores", "spill loads",
            "static shared", "compiler", "compile"]
    rows = []
    for number, run in enumerate(doc.runs):
        for f in run.compiles:
            kernel = f.kernel + (f" (class {f.variant})" if f.variant else "")
            cells = [(f.suite, ""), (kernel, ""), (f.entry, "mono"), *([(_run_label(doc, number), "")] if several else []),
                     (f.arch, ""), (fmt.sig(f.registers, 9), "num"),
                     *((("–" if size is None else f"{size} B"), "num")
                       for size in (f.spill_store_bytes, f.spill_load_bytes, f.shared_static_bytes)),
                     (f.compiler or "–", ""), (fmt.compile_time(f.compile_s) if f.ok else "failed", "num")]
            rows.append("<tr>" + "".join(f'<td class="{cls}">{escape.html(text)}</td>' if cls else f"<td>{escape.html(text)}</td>"
                                         for text, cls in cells) + "</tr>")
    if not rows:
        return '<p class="note">No compile item ran.</p>'
    return (f"<div class=scroll><table><tr>{''.join(f'<th>{escape.html(h)}</th>' for h in head)}</tr>{''.join(rows)}"
            "</table></div>")


def suites_section(doc: Report) -> str:
    body = "".join(f"<tr><td>{escape.html(s.name)}</td><td><code>{escape.html(s.path)}</code></td>"
                   f"<td>{escape.html(s.signature) if s.signature else '<span class=note>not reported</span>'}</td></tr>"
                   for s in doc.suites)
    return f"<table><tr><th>suite</th><th>file</th><th>signature</th></tr>{body}</table>"


def render(doc: Report) -> str:
    items = doc.items
    pairs = list(zip(items, anchors(items), strict=True))
    problems = [(i, a) for i, a in pairs if i.status in ("failed", "warning")]
    signatures = {s.path: s.signature for s in doc.suites}
    verdict = fmt.VERDICT_WORD[doc.verdict]
    fingerprints = [r.fingerprint for r in doc.runs if r.fingerprint]
    on = "; ".join(f"{f.description} ({f.key})" for f in fingerprints) or "no GPU"
    articles = "".join(article(i, a, doc.runs[i.run], signatures.get(i.suite_path or i.suite),
                               drawn=n < MAX_PLOTS) for n, (i, a) in enumerate(pairs))
    counts = escape.html(fmt.counts_line(doc.counts))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>cudagate {verdict}: {counts}</title><style>{CSS}</style></head>
<body>
<header class="verdict {escape.html(doc.verdict)}"><div class="badge">{verdict}</div><div>
<h1>cudagate gate report</h1><p class="counts">{counts}</p>
<p class="meta">on {escape.html(on)} · created {escape.html(doc.created)} · cudagate {escape.html(doc.tool_version)}</p></div></header>
<main>
<h2 id="problems">Regressions and failures</h2>
{results_table(doc, problems) if problems else _no_problems(items)}
<h2 id="results">All results</h2>
{results_table(doc, pairs) if pairs else '<p class="note">No case was collected.</p>'}
<h2 id="builds">Builds</h2>
{builds_section(doc)}
<h2 id="cases">Per kernel × case</h2>
{articles}
<h2 id="hardware">Hardware and run</h2>
{runs_section(doc)}
<h2 id="suites">Suites and signatures</h2>
{suites_section(doc)}
</main></body></html>
"""


def _no_problems(items: list[Item | SkippedItem]) -> str:
    """What the empty failures section says: a pass only where something was replayed."""
    if any(i.status == "passed" for i in items):
        return "<p>None: every replayed case passed.</p>"
    return "<p>None, but no case was replayed (no CUDA device), so no case passed either.</p>"
