"""The trend page: one self-contained HTML file in the report's style (inline CSS and SVG).

Its one script, inline and allowed by hash in the page's Content-Security-Policy (which forbids
every fetch), is the GPU fingerprint filter: a ``<select>`` that hides the other fingerprints' charts
and rows, also set from the address (``history.html#fingerprint=KEY``). Without scripts the select
stays hidden and every fingerprint shows.
"""

from __future__ import annotations

import base64
import hashlib

from pytest_cudagate import __version__
from pytest_cudagate.history.chart import trend_svg
from pytest_cudagate.history.model import History
from pytest_cudagate.history.series import Move, Series, build_series, last_release, moves
from pytest_cudagate.reports.document import now
from pytest_cudagate.reports import escape
from pytest_cudagate.reports.html_item import pill
from pytest_cudagate.reports.html_style import CSS

CSV_NAME, JSON_NAME, HTML_NAME = "history.csv", "history.json", "history.html"
MAX_MOVES = 50  # rows of the moves table; the exports hold every result
_PROBLEM = {"regressed", "unstable"}
_UNSURE = {"inconclusive", "incomparable"}

SCRIPT = """
const pick = document.getElementById('fingerprint');
function show(key) {
  for (const node of document.querySelectorAll('[data-fingerprint]'))
    node.hidden = key !== '' && node.dataset.fingerprint !== key;
}
pick.hidden = false;
pick.addEventListener('change', () => show(pick.value));
const asked = new URLSearchParams(location.hash.slice(1)).get('fingerprint');
if (asked !== null && [...pick.options].some(o => o.value === asked)) { pick.value = asked; show(asked); }
"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii")
POLICY = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{_SCRIPT_HASH}'"
EXTRA_CSS = """
.filters { display: flex; gap: 16px; align-items: center; margin: 14px 0; } select { font: inherit; max-width: 560px; }
article.trend h3 .muted { font-weight: normal; }
"""


def _state(series: list[Series]) -> str:
    latest = {s.points[-1].entry.result.verdict for s in series}
    return "fail" if latest & _PROBLEM else "warn" if latest & _UNSURE else "pass"


def _us(value: float | None) -> str:
    return "–" if value is None else f"{value:,.2f} µs"


def _interval(result) -> str:
    if result.ratio is None:
        return "–"
    bounds = f" [{result.low:.3f}, {result.high:.3f}]" if result.low is not None and result.high is not None else ""
    return f"{result.ratio:.3f}{bounds}"


def _gpu(series: Series) -> str:
    return f'<span class="mono" title="{escape.html(series.fingerprint_description)}">{escape.html(series.fingerprint or "–")}</span>'


def _moves_table(found: list[Move], anchors: dict[int, str], then: str) -> str:
    if not found:
        return '<p class="note">No case has more than one commit shown.</p>'
    head = ["kernel × case", "class", "GPU", then, "latest", "change", "latest verdict", "ratio [interval]"]
    body = []
    for move in found[:MAX_MOVES]:
        s, since, latest = move.series, move.since.entry, move.latest.entry
        body.append(
            f'<tr data-fingerprint="{escape.html(s.fingerprint or "")}"><td><a href="#{anchors[id(s)]}">{escape.html(s.title)}</a></td>'
            f"<td>{escape.html(s.shape_class)}</td><td>{_gpu(s)}</td>"
            f'<td class="num">{escape.html(_us(since.result.current_us))} <span class="mono">{escape.html(since.commit.sha[:7])}</span></td>'
            f'<td class="num">{escape.html(_us(latest.result.current_us))} <span class="mono">{escape.html(latest.commit.sha[:7])}</span></td>'
            f'<td class="num">{(move.change - 1) * 100:+.1f}%</td><td>{pill(latest.result.verdict)}</td>'
            f'<td class="num">{escape.html(_interval(latest.result))}</td></tr>')
    more = len(found) - MAX_MOVES
    tail = f'<p class="note">and {more} more, in the exports.</p>' if more > 0 else ""
    return (f"<div class=scroll><table><tr>{''.join(f'<th>{escape.html(h)}</th>' for h in head)}</tr>{''.join(body)}</table>"
            f"</div>{tail}")


def _trend(series: Series, anchor: str, history: History) -> str:
    latest = series.points[-1].entry.result
    return (f'<article class="item trend" id="{anchor}" data-fingerprint="{escape.html(series.fingerprint or "")}">'
            f'<h3>{escape.html(series.title)} <span class="muted">· {escape.html(series.shape_class)} · {_gpu(series)} · '
            f"{len(series.points)} commit(s)</span> {pill(latest.verdict)}</h3>"
            f'<p class="muted">{escape.html(series.fingerprint_description or "no fingerprint")}</p>'
            f"{trend_svg(series, history.commits)}</article>")


def render(history: History, source: str) -> str:
    """The page for ``history`` (not empty); ``source`` names the database it was read from."""
    series = build_series(history)
    anchors = {id(s): f"trend-{n}" for n, s in enumerate(series, 1)}
    release = last_release(history)
    found = moves(series, release)
    since = (f"since {', '.join(history.commits[release].tags)} ({history.commits[release].sha[:7]})"
             if release is not None else "since the first commit shown (no release tag among them)")
    fingerprints = sorted({(s.fingerprint or "", s.fingerprint_description or "") for s in series})
    options = "".join(f'<option value="{escape.html(key)}">{escape.html(key or "no fingerprint")}: {escape.html(text[:80])}</option>'
                      for key, text in fingerprints)
    first, last = history.commits[0], history.commits[-1]
    cases = len({(s.suite, s.kernel, s.case) for s in series})
    line = (f"{cases} case(s) on {len(fingerprints)} GPU fingerprint(s) over {len(history.commits)} commit(s), "
            f"{first.sha[:7]} … {last.sha[:7]}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{POLICY}">
<title>cudagate history: {escape.html(line)}</title><style>{CSS}{EXTRA_CSS}</style></head>
<body>
<header class="verdict {_state(series)}"><div class="badge">HISTORY</div><div>
<h1>cudagate latency history</h1><p class="counts">{escape.html(line)}</p>
<p class="meta">from {escape.html(source)} · created {escape.html(now())} · cudagate {escape.html(__version__)}</p></div></header>
<main>
<div class="filters"><select id="fingerprint" hidden aria-label="GPU fingerprint">
<option value="">every GPU fingerprint</option>{options}</select>
<span>exports: <a href="{CSV_NAME}">{CSV_NAME}</a> · <a href="{JSON_NAME}">{JSON_NAME}</a></span></div>
<h2 id="moves">Largest moves {escape.html(since)}</h2>
{_moves_table(found, anchors, f"at {history.commits[release].tags[0]}" if release is not None else "first")}
<h2 id="trends">Latency over commits</h2>
{''.join(_trend(s, anchors[id(s)], history) for s in series)}
</main><script>{SCRIPT}</script></body></html>
"""
