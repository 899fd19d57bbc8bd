"""One kernel × case of the HTML report: correctness, latency, plot, telemetry and provenance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_cudagate.phases import run_phase
from pytest_cudagate.reports import escape, fmt, plots
from pytest_cudagate.suite.model import Tolerance

if TYPE_CHECKING:
    from pytest_cudagate.judge.elementwise import OutputCheck
    from pytest_cudagate.reports.model import Item, Run, SkippedItem

# Timing plots a page draws (the cases in the page's order: failures first). Each costs about 1 ms and
# 9 KB; a report of 12,000 cases drawn whole took 12 s and made a 110 MB page no browser opens well.
MAX_PLOTS = 500
TELEMETRY_COLUMNS = (("sm_clock_mhz", "SM MHz"), ("mem_clock_mhz", "mem MHz"), ("temperature_c", "°C"),
                     ("power_w", "W"), ("utilization_gpu_pct", "util %"), ("throttle_reasons", "clock events"),
                     ("other_processes", "other processes"))


def rows(pairs: list[tuple[str, str]]) -> str:
    """A key/value table; values are HTML already."""
    body = "".join(f"<tr><th>{escape.html(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{body}</table>'


def pill(word: str) -> str:
    return f'<span class="pill {escape.html(word)}">{escape.html(word.upper())}</span>'


def correctness(item: Item | SkippedItem) -> str:
    c = item.correctness
    if c is None:
        reason = "not checked: the case was not replayed" if item.status == "skipped" else "not checked"
        return f'<p class="note">{escape.html(reason)}</p>'
    summary = "all outputs within tolerance" if c.passed else "outputs wrong"
    if c.error_kind:
        summary += f" (error: {c.error_kind})"
    parts = [f"<p>{pill('passed' if c.passed else 'failed')} {escape.html(summary)}</p>"]
    if c.problems:
        parts.append("<ul>" + "".join(f"<li>{escape.html(p)}</li>" for p in c.problems) + "</ul>")
    if c.comparisons:
        head = "".join(f"<th>{h}</th>" for h in ("output", "mismatches", "worst index", "expected", "actual",
                                                 "allowed |diff|", "rel. norm", "max |error|", "tolerance"))
        parts.append(f"<table><tr>{head}</tr>{''.join(_comparison_row(x) for x in c.comparisons)}</table>")
    return "".join(parts)


def _comparison_row(cmp: OutputCheck) -> str:
    tol = cmp.tolerance or Tolerance()
    tolerance = f"atol {tol.atol:g}, rtol {tol.rtol:g}"
    if tol.max_rel_norm is not None:
        tolerance += f", max rel. norm {tol.max_rel_norm:g}"
    mismatches = f"{cmp.mismatches:,} / {cmp.total:,}"
    if cmp.unwritten:
        mismatches += f" ({cmp.unwritten:,} unwritten)"
    index = cmp.worst_index
    index_text = "–" if index is None else str(index[0] if len(index) == 1 else list(index))
    rel_norm = fmt.sig(cmp.rel_norm)
    if cmp.rel_norm_limit is not None:
        rel_norm += f" (limit {fmt.sig(cmp.rel_norm_limit)})"
    cells = [(cmp.buffer, ""), (mismatches, "num" if cmp.ok else "num bad"), (index_text, "num"),
             (fmt.sig(cmp.worst_expected, 6), "num"), (fmt.sig(cmp.worst_actual, 6), "num"),
             (fmt.sig(cmp.worst_allowed), "num"), (rel_norm, "num"), (fmt.sig(cmp.max_abs_error), "num"),
             (tolerance, "")]
    return "<tr>" + "".join(f'<td class="{cls}">{escape.html(text)}</td>' if cls else f"<td>{escape.html(text)}</td>"
                            for text, cls in cells) + "</tr>"


def latency(item: Item | SkippedItem) -> str:
    lat = item.latency
    if lat is None:
        median = item.correctness.median_ms if item.correctness else None
        text = ("not compared: the case failed before it was timed" if item.kind == "performance" and
                item.status == "failed" else f"not compared ({item.kind} case)")
        if median:
            text += f"; median of the timed launches {fmt.us(median)}"
        return f'<p class="note">{escape.html(text)}</p>'
    est = lat.estimate
    advisory = " advisory (supplementary evidence)" if lat.advisory else ""
    pairs = [("verdict", pill(lat.verdict.value) + advisory)]
    spread = lat.run_spread
    if spread:
        pairs += [
            ("today's run median", escape.html(fmt.us(lat.current and lat.current.median))),
            ("ratio to the approval runs", "<b>" + escape.html(f"{spread.ratio:.3f}") + "</b>"),
            (f"an unchanged kernel stays within ({spread.confidence:.0%})", escape.html(f"{spread.low:.3f} – {spread.high:.3f}")),
            ("spread used", escape.html(spread.spread_text)),
            ("threshold", escape.html(f"±{lat.threshold:.1%}")),
        ]
    elif est:
        pairs += [
            (f"median {lat.reason or 'approved'}", escape.html(fmt.us(lat.approved and lat.approved.median))),
            ("median current", escape.html(fmt.us(lat.current and lat.current.median))),
            ("ratio current / approved", f"<b>{escape.html(fmt.ratio(est))}</b> {escape.html(fmt.change(est))}"),
            ("confidence interval", escape.html(fmt.interval(est))),
            ("threshold", escape.html(f"±{lat.threshold:.1%}")),
            ("rounds", escape.html(f"{lat.pairs:,} ({est.method})")),
            ("measurement", escape.html(f"{lat.measurement_s:.2f} s")),
        ]
    else:
        pairs.append(("reason", escape.html(lat.reason)))
        pairs.append(("threshold", escape.html(f"±{lat.threshold:.1%}")))
    if lat.discarded:
        pairs.append(("discarded chunks", escape.html("; ".join(lat.discarded))))
    if lat.note:
        pairs.append(("not seen", escape.html(lat.note)))
    release = lat.release
    if release:
        text = release.headline() or release.reason
        pairs.append(("against the release", pill(release.verdict.value) + " " + escape.html(text)))
        if release.note:
            pairs.append(("release toolchain", escape.html(release.note)))
    return rows(pairs)


def library(item: Item | SkippedItem) -> str:
    """The library baseline beside the latency: × of the library, or why there is no ratio."""
    lib = item.library
    if not lib:
        return ""
    est = lib.estimate
    if not est:
        return rows([(f"× {lib.label}", '<span class="note">no ratio</span>'), ("why", escape.html(lib.error or None))])
    return rows([
        (f"× {lib.label} (current / library)", f"<b>{escape.html(fmt.ratio(est))}</b>"),
        ("confidence interval", escape.html(fmt.interval(est))),
        (f"median {lib.label}", escape.html(fmt.us(lib.library and lib.library.median))),
        ("median current (same rounds)", escape.html(fmt.us(lib.current and lib.current.median))),
        ("rounds", escape.html(f"{est.n:,} interleaved; informational, never part of the verdict")),
    ])


def plot(item: Item | SkippedItem, uid: str) -> str:
    with run_phase("plots"):
        svg = plots.timing_svg(item.samples_ms, uid, item.latency and item.latency.threshold)
    return f"<figure>{svg}</figure>" if svg else ""


def _span(values: list) -> str:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return "n/a"
    low, high = min(numbers), max(numbers)
    return f"{low:g}" if low == high else f"{low:g}–{high:g}"


def telemetry(item: Item | SkippedItem) -> str:
    # NVML's readings, as free-form as the driver gives them: dicts here
    states = [s for s in (item.latency.telemetry if item.latency else []) if isinstance(s, dict)]
    if not states:
        return '<p class="note">no clock/temperature readings (NVML not available, or not a timed comparison)</p>'
    events = sorted({str(r) for s in states for r in (s.get("throttle_reasons") or [])})
    summary = (f"SM clock {_span([s.get('sm_clock_mhz') for s in states])} MHz · "
               f"memory clock {_span([s.get('mem_clock_mhz') for s in states])} MHz · "
               f"temperature {_span([s.get('temperature_c') for s in states])} °C · "
               f"power {_span([s.get('power_w') for s in states])} W · "
               f"clock events: {', '.join(events) or 'none'} · {len(states)} reading(s)")
    notes = sorted({f"{k}: {v}" for s in states for k, v in s.items() if k not in dict(TELEMETRY_COLUMNS)})
    head = "<tr><th>#</th>" + "".join(f"<th>{escape.html(label)}</th>" for _, label in TELEMETRY_COLUMNS) + "</tr>"
    body = ""
    for number, state in enumerate(states, 1):
        cells = []
        for key, _ in TELEMETRY_COLUMNS:
            value = state.get(key)
            if isinstance(value, list):
                value = ", ".join(str(v.get("pid", v)) if isinstance(v, dict) else str(v) for v in value) or "none"
            cells.append(f"<td class=num>{escape.html('–' if value is None else value)}</td>")
        body += f"<tr><td class=num>{number}</td>{''.join(cells)}</tr>"
    extra = f'<p class="muted">{escape.html("; ".join(notes))}</p>' if notes else ""
    return (f"<p>{escape.html(summary)}</p>{extra}<details><summary>readings after each measured chunk</summary>"
            f"<table>{head}{body}</table></details>")


def provenance(item: Item | SkippedItem, run: Run, signature: str | None) -> str:
    fp = run.fingerprint
    fp_text = f"<code>{escape.html(fp.key)}</code> {escape.html(fp.description)}" if fp else '<span class="note">no GPU: not measured</span>'
    inputs = item.inputs
    hashes = '<span class="note">case files not found</span>'
    if inputs:
        hashes = "<table>" + "".join(f"<tr><td><code>{escape.html(p)}</code></td><td class=mono>{escape.html(h)}</td></tr>"
                                     for p, h in inputs.items()) + "</table>"
    return rows([
        ("fingerprint", fp_text),
        ("kernel source", f"<code>{escape.html(item.source or 'unknown')}</code>"),
        ("suite file", f"<code>{escape.html(item.suite_path or item.suite)}</code>"),
        ("suite signature", escape.html(signature) if signature else '<span class="note">not reported</span>'),
        *([("worker time", escape.html(f"{item.worker_s:.2f} s"))] if item.worker_s else []),
        ("input sha256", hashes),
    ])


def article(item: Item | SkippedItem, anchor: str, run: Run, signature: str | None, drawn: bool = True) -> str:
    """The case's section; ``drawn``: with its timing plot (else a note says where the samples are)."""
    status = item.status
    sub = " · ".join(x for x in (item.suite, item.kind, item.shape_class and f"class {item.shape_class}",
                                  item.category) if x)
    message = item.message or item.warning
    parts = [
        f'<article class="item {escape.html(status)}" id="{escape.html(anchor)}">',
        f"<h3>{pill(status)} {escape.html(fmt.item_title(item))} <span class=muted>{escape.html(sub)}</span></h3>",
        f"<p><code>{escape.html(item.nodeid)}</code></p>",
        f'<pre class="message">{escape.html(message)}</pre>' if message and status != "skipped" else "",
        f'<div class="cols"><div><h4>Correctness</h4>{correctness(item)}</div>'
        f"<div><h4>Latency</h4>{latency(item)}"
        + (f"<h4>Library baseline</h4>{library(item)}" if item.library else "") + "</div></div>",
        plot(item, anchor) if drawn else ('<p class="note">timing plot left out: the page draws the first '
                                          f'{MAX_PLOTS:,} cases; report.json holds every sample</p>'
                                          if item.samples_ms else ""),
        f"<h4>Clocks, temperature, clock events</h4>{telemetry(item)}" if item.latency else "",
        f"<h4>Evidence</h4>{provenance(item, run, signature)}",
        "<h4>Reproduce</h4><pre>" + escape.html("\n".join(item.reproduce)) + "</pre>",
        "</article>",
    ]
    return "".join(p for p in parts if p)
