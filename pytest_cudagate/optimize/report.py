"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no fetches).

Rendered from ``summary.json`` and ``history.json`` alone, so a pack re-renders anywhere. The
gate report's renderer (:mod:`pytest_cudagate.reports`) draws a gate run's items, not a search, so
this page borrows only its stylesheet, to look the same.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from pytest_cudagate.reports.html_style import CSS

def e(value) -> str:
    return escape("" if value is None else str(value))


def us(ms) -> str:
    return "–" if ms is None else f"{ms * 1000:.2f} µs"


def x(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _ratio(r) -> str:
    if not r or r.get("ratio") is None:
        return "–"
    low, high = r.get("low"), r.get("high")
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{r['ratio']:.3f}{interval}"


def _kv(rows) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _best(best: dict, title: str) -> str:
    rows = "".join(
        f"<tr><td>{e(c['case'])}{' <b>(holdout)</b>' if c['holdout'] else ''}</td><td>{e(c['kind'])}</td>"
        f"<td class=num>{us(c.get('initial_ms'))}</td><td class=num>{us(c.get('search_latency_ms'))}</td>"
        f"<td class=num>{x(c.get('speedup_vs_initial'))}</td>"
        f"<td>{e((c.get('gate') or {}).get('latency_verdict') or ('passed' if (c.get('gate') or {}).get('passed') else '–'))}</td>"
        f"<td class=num>{_ratio((c.get('gate') or {}).get('ratio_vs_approved'))}</td>"
        f"<td class=num>{us((c.get('gate') or {}).get('approved_ms'))}</td><td class=num>{us((c.get('gate') or {}).get('current_ms'))}</td></tr>"
        for c in best["cases"])
    head = "".join(f"<th>{h}</th>" for h in ("case", "kind", "initial (search)", "candidate (search)", "speedup",
                                             "gate verdict", "ratio vs approved [99% CI]", "approved median",
                                             "candidate median"))
    return (f"<h2>{e(title)}: attempt {best['attempt']} ({e(best['label'])}, {e(best['origin'])})</h2>"
            f"<p>{x(best.get('speedup_vs_initial'))} the initial kernel (search), {x(best.get('speedup_vs_approved'))} the "
            f"approved kernel (gate); launch <code>{e(best['launch'])}</code></p><table><tr>{head}</tr>{rows}</table>")


def _attempts(history: dict) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "round", "repair", "origin", "label", "result", "geomean",
                                             "speedup", "gate", "reason"))
    rows = []
    for a in history["attempts"]:
        gate = a.get("validation")
        gate_text = "–" if not gate else ("passed" if gate["passed"] else "FAILED")
        reason = (a.get("rejection") or (gate or {}).get("rejection") or "").strip()
        cls = "" if a["status"] == "passed" else ' class="bad"'
        rows.append(f"<tr><td class=num>{a['attempt']}</td><td class=num>{a['round']}</td><td class=num>{a['repair']}</td>"
                    f"<td>{e(a.get('origin'))}</td><td>{e(a.get('label'))}</td><td{cls}>{e(a['status'])} ({e(a['stage'])})</td>"
                    f"<td class=num>{us(a.get('geomean_ms'))}</td><td class=num>{x(a.get('speedup_vs_initial'))}</td>"
                    f"<td>{e(gate_text)}</td><td><details><summary>{e(reason.splitlines()[0][:120] if reason else '')}"
                    f"</summary><pre>{e(reason[:6000])}</pre></details></td></tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render(summary: dict, history: dict, folder: Path) -> str:
    outcome = summary["outcome"]
    badge, cls = {"winner": ("WINNER", "pass"), "no_improvement": ("NO GAIN", "warn"), "rejected": ("REJECTED", "fail"),
                  "not_validated": ("NOT GATED", "warn"), "initial_failed": ("BROKEN", "fail")}.get(outcome, (outcome.upper(), "warn"))
    usage = summary["usage"]
    svg_path = Path(folder) / "heatmap.svg"
    svg = svg_path.read_text(encoding="utf-8") if svg_path.is_file() else ""
    svg = re.sub(r"^.*?(?=<svg)", "", svg, count=1, flags=re.DOTALL)
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="plot" style="max-height:none"', svg, count=1)
    cost = usage.get("estimated_cost_usd")
    device = summary.get("device") or {}
    facts = _kv([
        ("suite / kernel", f"<code>{e(summary['suite'])}</code> / {e(summary['kernel'])}"),
        ("proposer", f"<code>{e(summary['proposer'])}</code>"),
        ("stop reason", f"<b>{e(summary['stop_reason'])}</b>: {e(summary['stop_detail'])}"),
        ("gate", e(summary.get("validation_note") or "")),
        ("rounds / attempts", f"{summary['rounds']} / {summary['attempts']} ({summary['passed_attempts']} passed, "
                              f"{summary['rejected_attempts']} rejected, {summary['repairs']} repairs)"),
        ("model", f"{usage['model_calls']} calls, {usage['total_tokens']:,} tokens ({usage['prompt_tokens']:,} in, "
                  f"{usage['completion_tokens']:,} out, {usage['reasoning_tokens']:,} reasoning), estimated "
                  + (f"${cost:.4f}" if cost is not None else "cost unknown (no price for this model)")),
        ("GPU / wall time", f"{usage['gpu_seconds']:.1f} s / {usage['wall_seconds']:.1f} s"),
        ("device", e(device.get("description", "–"))),
        ("git", e(summary.get("git"))),
        ("trust", e(summary.get("trust"))),
        ("started / ended", f"{e(summary['started_at'])} / {e(summary.get('ended_at'))}"),
    ])
    best = _best(summary["best"], "Winner") if summary.get("best") else (
        _best(summary["fastest_unvalidated"], "Fastest candidate (not a winner: see the gate)")
        if summary.get("fastest_unvalidated") else "<p>No candidate passed the gate.</p>")
    rejected = "".join(f"<li>attempt {r['attempt']} ({e(r['label'])}, {x(r.get('speedup_vs_initial'))}): "
                       f"<pre class=message>{e(r.get('reason'))}</pre></li>" for r in summary.get("rejected_by_gate", []))
    source = ""
    best_cu = Path(folder) / "best.cu"
    if best_cu.is_file():
        source = f"<h2>best.cu</h2><pre>{e(best_cu.read_text(encoding='utf-8'))}</pre>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>cudagate optimize {e(summary['run'])}: {e(outcome)}</title><style>{CSS}</style></head>
<body><header class="verdict {cls}"><div class="badge">{badge}</div><div>
<h1>cudagate optimize · {e(summary['suite_name'])} / {e(summary['kernel'])} · {e(summary['run'])}</h1>
<p class="meta">status {e(summary['status'])} · cudagate {e(summary['tool_version'])}</p></div></header>
<main>
{facts}
{best}
{'<h2>Rejected by the gate</h2><ul>' + rejected + '</ul>' if rejected else ''}
<h2>Latency per case per attempt</h2>
{svg or '<p class="note">no heatmap (no attempt was timed)</p>'}
<h2>Every attempt</h2>
{_attempts(history)}
{source}
</main></body></html>
"""
