"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no fetches).

Rendered from ``summary.json`` and ``history.json`` alone, so a pack re-renders anywhere, older packs
included: a field a pack lacks shows "–". The gate report's renderer (:mod:`pytest_cudagate.reports`)
draws a gate run's items, not a search, so this page borrows only its stylesheet, to look the same.
Every value is written as text or a table, never as a Python repr.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from pytest_cudagate.optimize import charts
from pytest_cudagate.reports.html_style import CSS

DASH = "–"
# Labels for the proposer's own description (its ``describe()``); other keys show as they are.
PROPOSER_LABELS = {"kind": "proposer", "tunables": "tunables (default first)", "space": "points in the space",
                   "launch": "launch", "batch": "candidates a round", "model": "model",
                   "reasoning_effort": "reasoning effort", "endpoint": "endpoint", "research": "NVIDIA notes",
                   "response_format": "response format", "folder": "recorded rounds from", "rounds": "recorded rounds"}
# Budget, its unit, the usage/summary figure it is spent against and the stop reason it raises.
BUDGETS = [("max_iterations", "rounds", "rounds", "max_iterations"),
           ("max_model_calls", "model calls", "model_calls", "max_model_calls"),
           ("max_tokens", "tokens", "total_tokens", "max_tokens"),
           ("max_usd", "USD (estimated)", "estimated_cost_usd", "budget_usd"),
           ("max_gpu_s", "GPU seconds", "gpu_seconds", "max_gpu_minutes"),
           ("max_wall_s", "wall seconds", "wall_seconds", "max_wall_minutes"),
           ("max_repairs", "repairs a round", None, None),
           ("max_tool_calls", "tool calls a round", None, None),
           ("max_completion_tokens", "completion tokens a call", None, None)]
BADGES = {"winner": ("WINNER", "pass"), "no_improvement": ("NO GAIN", "warn"), "rejected": ("REJECTED", "fail"),
          "not_validated": ("NOT GATED", "warn"), "initial_failed": ("BROKEN", "fail"), "running": ("RUNNING", "warn")}


def e(value) -> str:
    return escape(DASH if value is None else str(value))


def us(ms) -> str:
    return DASH if ms is None else f"{ms * 1000:.2f} µs"


def x(value) -> str:
    return DASH if value is None else f"{value:.2f}×"


def number(value) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return e(value)


def launch(value) -> str:
    """``{grid, block, shared_bytes}`` as ``grid (a, b) · block (c) · shared n``."""
    if not isinstance(value, dict):
        return DASH
    text = f"grid ({', '.join(map(str, value.get('grid') or []))}) · block ({', '.join(map(str, value.get('block') or []))})"
    if str(value.get("shared_bytes", "0")) != "0":
        text += f" · shared {value['shared_bytes']} B"
    return f"<code>{escape(text)}</code>"


def value_html(value, labels: dict | None = None) -> str:
    """Any JSON value as HTML: scalars as text, lists joined, a launch as a launch, objects as tables."""
    if isinstance(value, dict):
        if not value:
            return DASH
        if "grid" in value and "block" in value:
            return launch(value)
        return table_kv([(labels.get(k, k) if labels else k, value_html(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        if not value:
            return DASH
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return escape(", ".join("–" if v is None else str(v) for v in value))
        return "".join(f"<div>{value_html(v)}</div>" for v in value)
    if isinstance(value, (bool, int, float)) or value is None:
        return number(value)
    return e(value)


def table_kv(rows) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def pill(text: str, kind: str) -> str:
    return f'<span class="pill {escape(kind)}">{e(text)}</span>'


def ratio(r) -> str:
    if not isinstance(r, dict) or r.get("ratio") is None:
        return DASH
    low, high, level = r.get("low"), r.get("high"), r.get("confidence")
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{r['ratio']:.3f}{interval}" + (f" ({level:.0%})" if level else "")


def library_cell(library: dict | None) -> str:
    """The winner's latency as a multiple of the library's on one case, or why there is none."""
    if not library:
        return DASH
    if not (library.get("ratio") or {}).get("ratio"):
        return f'<span class="muted">{e(library.get("error") or "no ratio")}</span>'
    return e(ratio(library["ratio"]) + f" · {us(library.get('library_ms'))}")


def inline(items) -> str:
    """``(name, value)`` pairs on one line; pairs whose value is None are left out."""
    shown = [f"{e(k)} <b>{value_html(v)}</b>" for k, v in items if v is not None]
    return " · ".join(shown) or DASH


# -- the facts ------------------------------------------------------------------------------------------

def proposer_html(summary: dict) -> str:
    proposer = dict(summary.get("proposer") or {})
    if not proposer:
        return DASH
    kind = proposer.pop("kind", None)
    return f"<b>{e(kind)}</b>" + (value_html(proposer, PROPOSER_LABELS) if proposer else "")


def settings_html(summary: dict) -> str:
    settings = summary.get("settings") or {}
    return inline((k, v) for k, v in settings.items() if v is not None and v is not False and v != "")


def budgets_html(summary: dict) -> str:
    budgets, usage = summary.get("budgets") or {}, summary.get("usage") or {}
    spent = {**usage, "rounds": summary.get("rounds")}
    rows = []
    for key, unit, used, reason in BUDGETS:
        if key not in budgets:
            continue
        hit = reason is not None and reason == summary.get("stop_reason")
        limit = budgets[key]
        rows.append(f"<tr{' class=failed' if hit else ''}><td>{e(unit)}</td><td class=num>"
                    f"{'no limit' if limit is None else number(limit)}</td>"
                    f"<td class=num>{number(spent.get(used)) if used else DASH}</td>"
                    f"<td>{pill('stopped the run', 'failed') if hit else ''}</td></tr>")
    if not rows:
        return DASH
    return "<table><tr><th>budget</th><th>limit</th><th>spent</th><th></th></tr>" + "".join(rows) + "</table>"


def stop_html(summary: dict) -> str:
    reason = summary.get("stop_reason")
    if reason is None:
        return DASH
    return f"<b>{e(reason)}</b>: {e(summary.get('stop_detail') or (summary.get('stop_reasons') or {}).get(reason))}"


def git_html(summary: dict) -> str:
    git = summary.get("git") or {}
    commit = git.get("commit")
    dirty = git.get("dirty")
    tree = {True: "uncommitted changes were present", False: "clean working tree", None: "state unknown"}[dirty]
    head = (f'commit <code title="{e(commit)}">{e(commit[:12])}</code>, {tree}' if commit
            else "not a git repository (or no commit yet)")
    branch = summary.get("review_branch")
    if not branch:
        return head + '<br><span class="muted">no review branch: <code>--propose</code> puts a gated winner on one</span>'
    sign = (" The launch changed: it is signed, so the suite needs <code>cudagate sign</code> after review."
            if branch.get("launch_changed") else "")
    return (f"{head}<br>review branch <code>{e(branch.get('branch'))}</code> at <code>{e((branch.get('commit') or '')[:12])}"
            f"</code> on <code>{e((branch.get('base') or '')[:12])}</code>, changing "
            f"{value_html(branch.get('files'))}.{sign}")


def oracle_html(summary: dict) -> str:
    oracle = summary.get("oracle") or {}
    cases = oracle.get("cases") or {}
    files = sum(len(f or {}) for f in cases.values())
    problems = oracle.get("problems") or []
    head = f"{files} case file(s) of {len(cases)} case(s) hashed" + (
        f"; {len(problems)} problem(s)" if problems else "")
    rows = [(f"{case}: {name}", f"<code>{e(sha)}</code>") for case, entries in cases.items()
            for name, sha in (entries or {}).items()]
    reference = oracle.get("reference")
    body = value_html(reference) if reference is not None else DASH
    return (f"<details><summary>{e(head)}</summary>{table_kv([('reference', body), *rows])}"
            + "".join(f"<pre class=message>{e(p)}</pre>" for p in problems) + "</details>")


def usage_html(usage: dict) -> str:
    cost = usage.get("estimated_cost_usd")
    return (f"{number(usage.get('model_calls'))} calls, {number(usage.get('total_tokens'))} tokens "
            f"({number(usage.get('prompt_tokens'))} in, {number(usage.get('completion_tokens'))} out, "
            f"{number(usage.get('reasoning_tokens'))} reasoning), estimated "
            + (f"${cost:.4f}" if cost is not None else "cost unknown (no price for this model)"))


# -- the gate -------------------------------------------------------------------------------------------

def _overview(best: dict, history: dict) -> dict:
    """The winner's gate as a whole: the summary's, else (older packs) the history's record of it."""
    if best.get("gate"):
        return best["gate"]
    attempt = next((a for a in history.get("attempts", []) if a.get("attempt") == best.get("attempt")), None)
    return (attempt or {}).get("validation") or {}


def _case_verdict(case: dict) -> str:
    gate = case.get("gate")
    if not gate:
        return pill("not gated", "skipped")
    if not gate.get("passed"):
        return pill("failed", "failed")
    verdict = gate.get("latency_verdict")
    if verdict:
        return pill(verdict, verdict)
    return pill("correct", "passed")


def _checks_html(checks: dict) -> str:
    fresh, san = checks.get("fresh_inputs"), checks.get("sanitizer")
    parts = []
    if fresh:
        sets = fresh.get("sets_per_case")
        parts.append(f"fresh inputs: <b>{number(sets)}</b> set(s) a case"
                     + (" plus adversarial inputs" if fresh.get("adversarial") else "")
                     + f", seed {e(fresh.get('seed'))}, {e(fresh.get('cases'))}")
    if san:
        tools = ", ".join(san.get("tools") or []) or "none configured"
        ran = ("ran" if san.get("ran") else "did not run: compute-sanitizer " +
               ("not found" if not san.get("binary") else "has no tool configured"))
        parts.append(f"compute-sanitizer ({e(tools)}) on case <code>{e(san.get('case'))}</code>: <b>{e(ran)}</b>")
    return "<br>".join(parts)


def gate_html(summary: dict, history: dict) -> str:
    note = summary.get("validation_note")
    best = summary.get("best")
    if not best:
        rejected = summary.get("rejected_by_gate") or []
        lines = [f"attempt {e(r.get('attempt'))} ({e(r.get('label'))}): "
                 f"{e(((r.get('reason') or '').splitlines() or [''])[0][:200])}" for r in rejected]
        text = e(note) if note else ("not run" if summary.get("outcome") in ("running", "initial_failed") else DASH)
        return text + ("<ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>" if lines else "")
    overview = _overview(best, history)
    passed = overview.get("passed", best.get("validated"))
    head = (f"{pill('passed' if passed else 'failed', 'passed' if passed else 'failed')} attempt {e(best['attempt'])} "
            f"against the approved kernel on every case, holdout included")
    if overview.get("gpu_seconds") is not None:
        head += f" · {overview['gpu_seconds']:.1f} s of GPU time"
    level = next((c["gate"]["ratio_vs_approved"].get("confidence") for c in best.get("cases", [])
                  if (c.get("gate") or {}).get("ratio_vs_approved")), None)
    labels = sorted({c["gate"]["library"]["label"] for c in best.get("cases", []) if (c.get("gate") or {}).get("library")})
    rows = "".join(
        f"<tr><td>{e(c.get('case'))}</td><td>{e(c.get('kind'))}</td><td>{'holdout' if c.get('holdout') else ''}</td>"
        f"<td>{_case_verdict(c)}</td><td class=num>{ratio((c.get('gate') or {}).get('ratio_vs_approved'))}</td>"
        f"<td class=num>{us((c.get('gate') or {}).get('approved_ms'))}</td>"
        f"<td class=num>{us((c.get('gate') or {}).get('current_ms'))}</td>"
        + (f"<td class=num>{library_cell((c.get('gate') or {}).get('library'))}</td>" if labels else "")
        + f"<td>{e((c.get('gate') or {}).get('warning') or '')}</td></tr>" for c in best.get("cases", []))
    library = f"<th>× {e(labels[0] if len(labels) == 1 else 'library')} (informational)</th>" if labels else ""
    table = ("<table class=gate><tr><th>case</th><th>kind</th><th>holdout</th><th>verdict</th>"
             f"<th>ratio vs approved{f' [{level:.0%} CI]' if level else ' [CI]'}</th><th>approved median</th>"
             f"<th>winner median</th>{library}<th>warning</th></tr>{rows}</table>")
    checks = _checks_html(overview.get("checks") or {})
    if not checks and overview.get("fresh_seed") is not None:
        checks = f"fresh inputs: seed {e(overview['fresh_seed'])}"
    notes = overview.get("notes") or []
    extra = [f"<p>{checks or 'fresh inputs and compute-sanitizer: ' + DASH}</p>"]
    if overview.get("rejection"):
        extra.append(f"<pre class=message>{e(overview['rejection'])}</pre>")
    if notes:
        extra.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    if note:
        extra.append(f"<p class=muted>{e(note)}</p>")
    return f"<p>{head}</p>{table}{''.join(extra)}"


# -- sections -------------------------------------------------------------------------------------------

def best_html(best: dict, title: str) -> str:
    rows = "".join(
        f"<tr><td>{e(c['case'])}{' <b>(holdout)</b>' if c.get('holdout') else ''}</td><td>{e(c.get('kind'))}</td>"
        f"<td class=num>{us(c.get('initial_ms'))}</td><td class=num>{us(c.get('search_latency_ms'))}</td>"
        f"<td class=num>{x(c.get('speedup_vs_initial'))}</td><td class=num>{ratio(c.get('ratio_vs_initial'))}</td>"
        f"{chosen_cells(c.get('chosen'))}</tr>"
        for c in best.get("cases", []))
    head = "".join(f"<th>{h}</th>" for h in ("case", "kind", "initial (search)", "candidate (search)", "speedup",
                                             "ratio vs initial [CI]", "class", "build", "launch", "why"))
    defines = best.get("defines") or {}
    overrides = best.get("launch_overrides") or {}
    facts = [("launch", launch(best.get("launch"))),
             ("defines", escape(" ".join(f"{k}={v}" for k, v in defines.items())) if defines else DASH)]
    if overrides:
        facts.append(("launch per case", table_kv([(case, launch(value)) for case, value in overrides.items()])))
    for name, variant in (best.get("classes") or {}).items():
        facts.append((f"class {name} variant", escape(" ".join(variant.get("options") or [])) + (
            f" · {launch(variant['launch'])}" if variant.get("launch") else " · the shared launch")))
    facts.append(("source sha256", f"<code>{e(best.get('source_sha256'))}</code>"))
    return (f"<h2>{e(title)}: attempt {e(best.get('attempt'))} ({e(best.get('label'))}, {e(best.get('origin'))}, "
            f"round {e(best.get('round'))})</h2>"
            f"<p>{x(best.get('speedup_vs_initial'))} the initial kernel (search), {x(best.get('speedup_vs_approved'))} "
            f"the approved kernel (gate)</p>{table_kv(facts)}<table><tr>{head}</tr>{rows}</table>")


def chosen_cells(chosen: dict | None) -> str:
    """A case's class, build (its class's variant or the shared default), resolved launch and why."""
    if not chosen:
        return "<td></td>" * 4
    resolved = chosen.get("launch") or {}
    shown = (f"grid {resolved.get('grid')} block {resolved.get('block')} shared {resolved.get('shared_bytes')}"
             if resolved else DASH)
    build = "variant " + " ".join(chosen.get("options") or []) if chosen.get("build") == "variant" else "shared"
    return (f"<td>{e(chosen.get('class'))}</td><td>{e(build)}</td><td>{e(shown)}</td>"
            f"<td>{e(chosen.get('why'))}</td>")


def charts_html(summary: dict, history: dict) -> str:
    points = charts.rounds(summary, history)
    if not points:
        return '<p class="note">no chart: the initial kernel was never timed</p>'
    grid = charts.grid(summary, history)
    heatmap = (f'<div class="scroll">{charts.heatmap_svg(grid, title=False)}</div>' if grid
               else '<p class="note">no heatmap: no performance case was timed</p>')
    return (f"<h2>Best so far per round (geometric mean over the visible performance cases)</h2>"
            '<p class="note">the search\'s own timing, before the gate: a point may be an attempt the gate '
            'later rejected; the ringed point is the winner that passed it</p>'
            f"<figure>{charts.progress_svg(points, summary.get('best'))}</figure>"
            f"<h2>Latency per case per round</h2>{heatmap}")


def attempts_html(history: dict) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "round", "repair", "origin", "label", "result", "geomean",
                                             "speedup", "gate", "reason"))
    rows = []
    for a in history.get("attempts", []):
        gate = a.get("validation")
        gate_text = DASH if not gate else ("passed" if gate.get("passed") else "FAILED")
        reason = (a.get("rejection") or (gate or {}).get("rejection") or "").strip()
        cls = "" if a.get("status") == "passed" else ' class="bad"'
        rows.append(f"<tr><td class=num>{e(a['attempt'])}</td><td class=num>{e(a.get('round'))}</td>"
                    f"<td class=num>{e(a.get('repair'))}</td><td>{e(a.get('origin'))}</td><td>{e(a.get('label'))}</td>"
                    f"<td{cls}>{e(a.get('status'))} ({e(a.get('stage'))})</td>"
                    f"<td class=num>{us(a.get('geomean_ms'))}</td><td class=num>{x(a.get('speedup_vs_initial'))}</td>"
                    f"<td>{e(gate_text)}</td><td><details><summary>{e(reason.splitlines()[0][:120] if reason else '')}"
                    f"</summary><pre>{e(reason[:6000])}</pre></details></td></tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render(summary: dict, history: dict, folder: Path) -> str:
    outcome = summary.get("outcome") or "running"
    badge, cls = BADGES.get(outcome, (e(outcome).upper(), "warn"))
    usage = summary.get("usage") or {}
    device = summary.get("device") or {}
    facts = table_kv([
        ("suite / kernel", f"<code>{e(summary.get('suite'))}</code> / {e(summary.get('kernel'))}"),
        ("outcome", f"<b>{e(outcome)}</b>"),
        ("stop reason", stop_html(summary)),
        ("gate", gate_html(summary, history)),
        ("rounds / attempts", f"{number(summary.get('rounds'))} / {number(summary.get('attempts'))} "
                              f"({number(summary.get('passed_attempts'))} passed, "
                              f"{number(summary.get('rejected_attempts'))} rejected, "
                              f"{number(summary.get('repairs'))} repairs)"),
        ("proposer", proposer_html(summary)),
        ("options", settings_html(summary)),
        ("budgets", budgets_html(summary)),
        ("model", usage_html(usage)),
        ("GPU / wall time", f"{number(usage.get('gpu_seconds'))} s / {number(usage.get('wall_seconds'))} s"),
        ("device", e(device.get("description"))),
        ("git", git_html(summary)),
        ("trust", e(summary.get("trust"))),
        ("oracle", oracle_html(summary)),
        ("started / ended", f"{e(summary.get('started_at'))} / {e(summary.get('ended_at'))}"),
    ])
    best = best_html(summary["best"], "Winner") if summary.get("best") else (
        best_html(summary["fastest_unvalidated"], "Fastest candidate (not a winner: see the gate)")
        if summary.get("fastest_unvalidated") else "<p>No candidate passed the gate.</p>")
    rejected = "".join(f"<li>attempt {e(r.get('attempt'))} ({e(r.get('label'))}, {x(r.get('speedup_vs_initial'))}): "
                       f"<pre class=message>{e(r.get('reason'))}</pre></li>" for r in summary.get("rejected_by_gate") or [])
    source = ""
    best_cu = Path(folder) / "best.cu"
    if best_cu.is_file():
        source = f"<h2>best.cu</h2><pre>{e(best_cu.read_text(encoding='utf-8'))}</pre>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>cudagate optimize {e(summary.get('run'))}: {e(outcome)}</title><style>{CSS}</style></head>
<body><header class="verdict {cls}"><div class="badge">{badge}</div><div>
<h1>cudagate optimize · {e(summary.get('suite_name'))} / {e(summary.get('kernel'))} · {e(summary.get('run'))}</h1>
<p class="meta">status {e(summary.get('status'))} · cudagate {e(summary.get('tool_version'))}</p></div></header>
<main>
{facts}
{best}
{'<h2>Rejected by the gate</h2><ul>' + rejected + '</ul>' if rejected else ''}
{charts_html(summary, history)}
<h2>Every attempt</h2>
{attempts_html(history)}
{source}
</main></body></html>
"""
