"""One kernel × case of the HTML report: correctness, latency, plot, telemetry and provenance."""

from __future__ import annotations

from pytest_cudagate.phases import run_phase
from pytest_cudagate.reports import escape, fmt, plots

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


def correctness(item: dict) -> str:
    c = item.get("correctness")
    if c is None:
        reason = "not checked: the case was not replayed" if item["status"] == "skipped" else "not checked"
        return f'<p class="note">{escape.html(reason)}</p>'
    summary = "all outputs within tolerance" if c["passed"] else "outputs wrong"
    if c.get("error_kind"):
        summary += f" (error: {c['error_kind']})"
    parts = [f"<p>{pill('passed' if c['passed'] else 'failed')} {escape.html(summary)}</p>"]
    if c.get("problems"):
        parts.append("<ul>" + "".join(f"<li>{escape.html(p)}</li>" for p in c["problems"]) + "</ul>")
    if c.get("comparisons"):
        head = "".join(f"<th>{h}</th>" for h in ("output", "mismatches", "worst index", "expected", "actual",
                                                 "allowed |diff|", "rel. norm", "max |error|", "tolerance"))
        parts.append(f"<table><tr>{head}</tr>{''.join(_comparison_row(x) for x in c['comparisons'])}</table>")
    return "".join(parts)


def _comparison_row(cmp: dict) -> str:
    tol = cmp.get("tolerance") or {}
    tolerance = f"atol {tol.get('atol', 0):g}, rtol {tol.get('rtol', 0):g}"
    if tol.get("max_rel_norm") is not None:
        tolerance += f", max rel. norm {tol['max_rel_norm']:g}"
    mismatches = f"{cmp['mismatches']:,} / {cmp['total']:,}"
    if cmp.get("unwritten"):
        mismatches += f" ({cmp['unwritten']:,} unwritten)"
    index = cmp.get("worst_index")
    index_text = "–" if index is None else str(index[0] if len(index) == 1 else index)
    rel_norm = fmt.sig(cmp.get("rel_norm"))
    if cmp.get("rel_norm_limit") is not None:
        rel_norm += f" (limit {fmt.sig(cmp['rel_norm_limit'])})"
    cells = [(cmp["buffer"], ""), (mismatches, "num" if cmp["ok"] else "num bad"), (index_text, "num"),
             (fmt.sig(cmp.get("worst_expected"), 6), "num"), (fmt.sig(cmp.get("worst_actual"), 6), "num"),
             (fmt.sig(cmp.get("worst_allowed")), "num"), (rel_norm, "num"), (fmt.sig(cmp.get("max_abs_error")), "num"),
             (tolerance, "")]
    return "<tr>" + "".join(f'<td class="{cls}">{escape.html(text)}</td>' if cls else f"<td>{escape.html(text)}</td>"
                            for text, cls in cells) + "</tr>"


def latency(item: dict) -> str:
    lat = item.get("latency")
    if lat is None:
        median = (item.get("correctness") or {}).get("median_ms")
        text = ("not compared: the case failed before it was timed" if item["kind"] == "performance" and
                item["status"] == "failed" else f"not compared ({item['kind']} case)")
        if median:
            text += f"; median of the timed launches {fmt.us(median)}"
        return f'<p class="note">{escape.html(text)}</p>'
    est = lat.get("estimate")
    advisory = " advisory (supplementary evidence)" if lat.get("advisory") else ""
    pairs = [("verdict", pill(lat["verdict"]) + advisory)]
    spread = lat.get("run_spread")
    if spread:
        pairs += [
            ("today's run median", escape.html(fmt.us((lat.get("current") or {}).get("median")))),
            ("ratio to the approval runs", "<b>" + escape.html(f"{spread['ratio']:.3f}") + "</b>"),
            (f"an unchanged kernel stays within ({spread['confidence']:.0%})", escape.html(f"{spread['low']:.3f} – {spread['high']:.3f}")),
            ("spread used", escape.html(spread["spread_text"])),
            ("threshold", escape.html(f"±{lat['threshold']:.1%}")),
        ]
    elif est:
        approved, current = lat.get("approved") or {}, lat.get("current") or {}
        pairs += [
            (f"median {lat.get('reason') or 'approved'}", escape.html(fmt.us(approved.get("median")))),
            ("median current", escape.html(fmt.us(current.get("median")))),
            ("ratio current / approved", f"<b>{escape.html(fmt.ratio(est))}</b> {escape.html(fmt.change(est))}"),
            ("confidence interval", escape.html(fmt.interval(est))),
            ("threshold", escape.html(f"±{lat['threshold']:.1%}")),
            ("rounds", escape.html(f"{lat.get('pairs', 0):,} ({est.get('method', '')})")),
            ("measurement", escape.html(f"{lat.get('measurement_s', 0):.2f} s")),
        ]
    else:
        pairs.append(("reason", escape.html(lat.get("reason"))))
        pairs.append(("threshold", escape.html(f"±{lat['threshold']:.1%}")))
    if lat.get("discarded"):
        pairs.append(("discarded chunks", escape.html("; ".join(lat["discarded"]))))
    if lat.get("note"):
        pairs.append(("not seen", escape.html(lat["note"])))
    release = lat.get("release")
    if release:
        text = release.get("headline") or release.get("reason")
        pairs.append(("against the release", pill(release["verdict"]) + " " + escape.html(text)))
        if release.get("note"):
            pairs.append(("release toolchain", escape.html(release["note"])))
    return rows(pairs)


def library(item: dict) -> str:
    """The library baseline beside the latency: × of the library, or why there is no ratio."""
    lib = item.get("library")
    if not lib:
        return ""
    est = lib.get("estimate")
    if not est:
        return rows([(f"× {lib['label']}", '<span class="note">no ratio</span>'), ("why", escape.html(lib.get("error")))])
    return rows([
        (f"× {lib['label']} (current / library)", f"<b>{escape.html(fmt.ratio(est))}</b>"),
        ("confidence interval", escape.html(fmt.interval(est))),
        (f"median {lib['label']}", escape.html(fmt.us((lib.get("library") or {}).get("median")))),
        ("median current (same rounds)", escape.html(fmt.us((lib.get("current") or {}).get("median")))),
        ("rounds", escape.html(f"{est.get('n', 0):,} interleaved; informational, never part of the verdict")),
    ])


def plot(item: dict, uid: str) -> str:
    with run_phase("plots"):
        svg = plots.timing_svg(item.get("samples_ms") or {}, uid, (item.get("latency") or {}).get("threshold"))
    return f"<figure>{svg}</figure>" if svg else ""


def _span(values: list) -> str:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return "n/a"
    low, high = min(numbers), max(numbers)
    return f"{low:g}" if low == high else f"{low:g}–{high:g}"


def telemetry(item: dict) -> str:
    states = [s for s in (item.get("latency") or {}).get("telemetry") or [] if isinstance(s, dict)]
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


def provenance(item: dict, run: dict, signature: str | None) -> str:
    fp = run.get("fingerprint")
    fp_text = f"<code>{escape.html(fp['key'])}</code> {escape.html(fp['description'])}" if fp else '<span class="note">no GPU: not measured</span>'
    inputs = item.get("inputs") or {}
    hashes = '<span class="note">case files not found</span>'
    if inputs:
        hashes = "<table>" + "".join(f"<tr><td><code>{escape.html(p)}</code></td><td class=mono>{escape.html(h)}</td></tr>"
                                     for p, h in inputs.items()) + "</table>"
    return rows([
        ("fingerprint", fp_text),
        ("kernel source", f"<code>{escape.html(item.get('source') or 'unknown')}</code>"),
        ("suite file", f"<code>{escape.html(item.get('suite_path') or item['suite'])}</code>"),
        ("suite signature", escape.html(signature) if signature else '<span class="note">not reported</span>'),
        *([("worker time", escape.html(f"{item['worker_s']:.2f} s"))] if item.get("worker_s") else []),
        ("input sha256", hashes),
    ])


def article(item: dict, anchor: str, run: dict, signature: str | None, drawn: bool = True) -> str:
    """The case's section; ``drawn``: with its timing plot (else a note says where the samples are)."""
    status = item["status"]
    sub = " · ".join(x for x in (item["suite"], item["kind"], item.get("class") and f"class {item['class']}",
                                  item.get("category")) if x)
    message = item.get("message") or item.get("warning")
    parts = [
        f'<article class="item {escape.html(status)}" id="{escape.html(anchor)}">',
        f"<h3>{pill(status)} {escape.html(fmt.item_title(item))} <span class=muted>{escape.html(sub)}</span></h3>",
        f"<p><code>{escape.html(item['nodeid'])}</code></p>",
        f'<pre class="message">{escape.html(message)}</pre>' if message and status != "skipped" else "",
        f'<div class="cols"><div><h4>Correctness</h4>{correctness(item)}</div>'
        f"<div><h4>Latency</h4>{latency(item)}"
        + (f"<h4>Library baseline</h4>{library(item)}" if item.get("library") else "") + "</div></div>",
        plot(item, anchor) if drawn else ('<p class="note">timing plot left out: the page draws the first '
                                          f'{MAX_PLOTS:,} cases; report.json holds every sample</p>'
                                          if item.get("samples_ms") else ""),
        f"<h4>Clocks, temperature, clock events</h4>{telemetry(item)}" if item.get("latency") else "",
        f"<h4>Evidence</h4>{provenance(item, run, signature)}",
        "<h4>Reproduce</h4><pre>" + escape.html("\n".join(item.get("reproduce") or [])) + "</pre>",
        "</article>",
    ]
    return "".join(p for p in parts if p)
