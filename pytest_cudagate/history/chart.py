"""One case's latency over commits as inline SVG, drawn with the report's plotting helpers.

The current kernel's median at each commit (coloured where the gate said regressed or improved),
the approved version's median dashed, the band the ratio's interval puts the current latency in,
release tags and approvals as vertical lines. Every label is escaped: names come from suites and git.
"""

from __future__ import annotations


from pytest_cudagate.history.model import Commit, Result
from pytest_cudagate.history.series import Point, Series
from pytest_cudagate.reports import escape
from pytest_cudagate.reports.plots import (BAND, BOTTOM, COLORS, FONT, HEIGHT, TOP, WIDTH, _axis_y, _frame, _legend,
                                           _line_swatch, _scale, _text, _ticks)

X0, X1 = 64, 720  # the plot area's x extent, in viewBox units; the legend goes right of it
MAX_X_LABELS = 8
VERDICT_COLORS = {"regressed": "#b91c1c", "unstable": "#b91c1c", "improved": "#15803d"}
RELEASE = "#7c3aed"
APPROVAL = "#a16207"


def _band(result: Result) -> tuple[float, float] | None:
    """Where the interval puts the current latency: the baseline it was judged against × [low, high]."""
    if result.ratio is None or result.low is None or result.high is None:
        return None
    base = result.current_us / result.ratio
    return base * result.low, base * result.high


def _number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _tip(point: Point) -> str:
    commit, result = point.entry.commit, point.entry.result
    lines = [f"{commit.sha[:12]}" + (f" {commit.subject}" if commit.subject else ""),
             f"current {result.current_us:.2f} µs, approved {_number(result.approved_us, 2)} µs",
             f"ratio {_number(result.ratio)} [{_number(result.low)}, {_number(result.high)}]: {result.verdict}"]
    if point.approval:
        lines.append(f"approved here: {result.approved_sha256[:12]} ({result.approved_at or 'time not recorded'})")
    return "\n".join(lines)


def _x_axis(commits: tuple[Commit, ...], px) -> str:
    count = len(commits)
    shown = sorted({round(k * (count - 1) / (MAX_X_LABELS - 1)) for k in range(MAX_X_LABELS)}) if count > 1 else [0]
    return '<g class="x-ticks">' + "".join(
        f'<line x1="{px(n):.1f}" y1="{BOTTOM}" x2="{px(n):.1f}" y2="{BOTTOM + 4}" stroke="#6b7280"/>'
        + _text(px(n), BOTTOM + 15, commits[n].sha[:7], size=9, anchor="middle", extra=' class="mono"')
        for n in shown) + "</g>"


def _bands(points: tuple[Point, ...], px, py) -> list[str]:
    """One polygon per run of consecutive points with a bounded interval (a lone one: a bar)."""
    runs: list[list[tuple[int, tuple[float, float]]]] = [[]]
    for point in points:
        band = _band(point.entry.result)
        if band is None:
            runs.append([])
        else:
            runs[-1].append((point.index, band))
    parts = []
    for run in filter(None, runs):
        if len(run) == 1:
            (n, (low, high)), = run
            parts.append(f'<rect class="band" x="{px(n) - 3:.1f}" y="{py(high):.1f}" width="6" '
                         f'height="{max(py(low) - py(high), 1):.1f}" fill="{BAND}" fill-opacity="0.25"/>')
            continue
        upper = " ".join(f"{px(n):.1f},{py(high):.1f}" for n, (_, high) in run)
        lower = " ".join(f"{px(n):.1f},{py(low):.1f}" for n, (low, _) in reversed(run))
        parts.append(f'<polygon class="band" points="{upper} {lower}" fill="{BAND}" fill-opacity="0.18"/>')
    return parts


def trend_svg(series: Series, commits: tuple[Commit, ...]) -> str:
    """An ``<svg>`` element for inlining; x: the commits shown (oldest left), y: latency in µs."""
    points = series.points
    values = [p.entry.result.current_us for p in points]
    values += [p.entry.result.approved_us for p in points if p.entry.result.approved_us]
    values += [v for p in points for v in (_band(p.entry.result) or ())]
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.02
    low, high = max(low - pad, 0.0), high + pad
    px = _scale(0, len(commits) - 1, X0, X1) if len(commits) > 1 else (lambda _: (X0 + X1) / 2)
    py = _scale(low, high, BOTTOM, TOP)
    label = f"latency over commits: {series.title} on {series.fingerprint or 'no fingerprint'}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot trend" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'{FONT} aria-label="{escape.html(label)}">', f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
             *_frame(X0, X1, "current median per commit (band: the ratio's interval)", "commit", "latency (µs)"),
             _x_axis(commits, px), _axis_y(X0, _ticks(low, high), py), *_bands(points, px, py)]
    for n, commit in enumerate(commits):
        if commit.tags:
            parts.append(f'<line class="release" x1="{px(n):.1f}" y1="{TOP}" x2="{px(n):.1f}" y2="{BOTTOM}" '
                         f'stroke="{RELEASE}" stroke-dasharray="5 3"><title>{escape.html(", ".join(commit.tags))}</title></line>')
            parts.append(_text(px(n) + 3, TOP + 10, ", ".join(commit.tags)[:40], size=9, fill=RELEASE))
    for point in points:
        if point.approval:
            x = px(point.index)
            parts.append(f'<line class="approval" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{BOTTOM}" stroke="{APPROVAL}" '
                         f'stroke-dasharray="2 2"><title>{escape.html(_tip(point))}</title></line>')
    approved = [p for p in points if p.entry.result.approved_us]
    if len(approved) > 1:
        line = " ".join(f"{px(p.index):.1f},{py(p.entry.result.approved_us):.1f}" for p in approved)
        parts.append(f'<polyline class="approved" points="{line}" fill="none" stroke="{COLORS["approved"]}" '
                     'stroke-width="1.2" stroke-dasharray="4 3"/>')
    if len(points) > 1:
        line = " ".join(f"{px(p.index):.1f},{py(p.entry.result.current_us):.1f}" for p in points)
        parts.append(f'<polyline class="current" points="{line}" fill="none" stroke="{COLORS["current"]}" '
                     'stroke-width="1.6" stroke-linejoin="round"/>')
    for point in points:
        result = point.entry.result
        parts.append(f'<circle class="point" data-commit="{escape.html(point.entry.commit.sha)}" '
                     f'data-verdict="{escape.html(result.verdict)}" cx="{px(point.index):.1f}" cy="{py(result.current_us):.1f}" '
                     f'r="3" fill="{VERDICT_COLORS.get(result.verdict, COLORS["current"])}">'
                     f"<title>{escape.html(_tip(point))}</title></circle>")
    legend = [("current median", _line_swatch(COLORS["current"])),
              ("approved median", f'<line x1="0" y1="0" x2="18" y2="0" stroke="{COLORS["approved"]}" '
                                  'stroke-dasharray="4 3"/>'),
              ("interval", f'<rect x="0" y="-4" width="18" height="8" fill="{BAND}" fill-opacity="0.3"/>'),
              ("release tag", f'<line x1="0" y1="0" x2="18" y2="0" stroke="{RELEASE}" stroke-dasharray="5 3"/>'),
              ("approval", f'<line x1="0" y1="0" x2="18" y2="0" stroke="{APPROVAL}" stroke-dasharray="2 2"/>')]
    return "".join(parts + _legend(WIDTH - 4, legend) + ["</svg>"])
