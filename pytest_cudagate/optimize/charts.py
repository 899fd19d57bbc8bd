"""The search at a glance, as SVG drawn from ``summary.json`` and ``history.json`` alone.

- :func:`progress_svg`: the best-so-far geometric mean per round, one point per round (round 0 is the
  initial kernel), each round's own best as a hollow dot.
- :func:`heatmap_svg`: performance cases (rows, plus their geometric mean) × rounds (columns). A
  column is one attempt: the round's gated winner if it is in that round, else the round's fastest
  passing attempt, so every column is a kernel that exists. Cells never shrink below
  ``CELL_W`` × ``CELL_H`` pixels: a long search scrolls sideways instead of turning into a strip.

Plain SVG text (no matplotlib, no scripts), so the report inlines it and ``heatmap.svg`` is the same
drawing; :mod:`.heatmap` draws the PNG from the same :class:`Grid`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from pytest_cudagate.optimize.loop import geomean

CELL_W, CELL_H = 78, 40  # the smallest heatmap cell, in px: two lines of 11 px text
LEGEND_W = 480  # the legend's lines, in px at 10 px text
FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'
FAST, EVEN, SLOW, NONE = (34, 197, 94), (254, 252, 232), (248, 113, 113), "#e5e7eb"


def short_us(ms: float | None) -> str:
    """A latency in µs with three significant figures and no exponent."""
    if ms is None:
        return "–"
    us = ms * 1000.0
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


# -- the data ------------------------------------------------------------------------------------------

@dataclass
class RoundPoint:
    round: int
    best_ms: float | None  # the best geomean so far (this round included)
    best_attempt: int | None
    round_ms: float | None  # this round's own best geomean (None: nothing passed)
    attempts: int
    passed: int


@dataclass
class Column:
    round: int
    attempt: dict | None  # history.json's attempt shown (None: nothing passed this round)
    attempts: int
    passed: int
    mark: str = ""  # "winner" (passed the gate) / "gate-failed" / ""


@dataclass
class Grid:
    title: str
    cases: list[str]  # visible performance cases, in the suite's order
    base: dict[str, float]  # the initial kernel's latency per case (the colour scale's 1.0)
    columns: list[Column] = field(default_factory=list)

    def value(self, row: str | None, column: Column) -> float | None:
        """Latency in ms of ``row`` (None: the geometric mean over the cases) in ``column``."""
        if column.attempt is None:
            return None
        if row is None:
            return column.attempt.get("geomean_ms")
        return (column.attempt.get("latency_ms") or {}).get(row)

    def reference(self, row: str | None) -> float | None:
        return geomean(self.base.values()) if row is None else self.base.get(row)


def _round_count(summary: dict, history: dict) -> int:
    return max([summary.get("rounds") or 0] + [a["round"] for a in history.get("attempts", [])])


def _timed(attempts: list[dict]) -> list[dict]:
    """Attempts with a usable latency (a hand-edited pack may hold NaN or infinity)."""
    return [a for a in attempts if a["status"] == "passed" and isinstance(a.get("geomean_ms"), (int, float))
            and math.isfinite(a["geomean_ms"]) and a["geomean_ms"] > 0]


def rounds(summary: dict, history: dict) -> list[RoundPoint]:
    """One point per round, 0 to the last round run; empty when the initial kernel was never timed."""
    attempts = history.get("attempts", [])
    if not _timed([a for a in attempts if a["round"] == 0]):
        return []
    points, best = [], None
    for number in range(_round_count(summary, history) + 1):
        these = [a for a in attempts if a["round"] == number]
        timed = _timed(these)
        fastest = min(timed, key=lambda a: a["geomean_ms"]) if timed else None
        if fastest is not None and (best is None or fastest["geomean_ms"] < best["geomean_ms"]):
            best = fastest
        points.append(RoundPoint(number, best["geomean_ms"] if best else None, best["attempt"] if best else None,
                                 fastest["geomean_ms"] if fastest else None, len(these),
                                 sum(1 for a in these if a["status"] == "passed")))
    return points


def grid(summary: dict, history: dict) -> Grid | None:
    """The heatmap's cells; None when nothing was timed (the initial kernel failed, or no perf case)."""
    base = {k: v for k, v in ((summary.get("initial") or {}).get("latency_ms") or {}).items() if v}
    attempts = history.get("attempts", [])
    if not base or not _timed(attempts):
        return None
    winner = (summary.get("best") or {}).get("attempt")
    failed = {r["attempt"] for r in summary.get("rejected_by_gate") or []}
    result = Grid(f"{summary.get('suite_name', '')} / {summary.get('kernel', '')}", list(base), base)
    for number in range(_round_count(summary, history) + 1):
        these = [a for a in attempts if a["round"] == number]
        timed = _timed(these)
        shown = next((a for a in timed if a["attempt"] == winner), None) or (
            min(timed, key=lambda a: a["geomean_ms"]) if timed else None)
        mark = "" if shown is None else "winner" if shown["attempt"] == winner else (
            "gate-failed" if shown["attempt"] in failed else "")
        result.columns.append(Column(number, shown, len(these), sum(1 for a in these if a["status"] == "passed"),
                                     mark))
    return result


# -- colour ----------------------------------------------------------------------------------------------

def spread(g: Grid) -> float:
    """Half the colour range in log(latency / initial): the largest change seen, within 5 % and 4×."""
    logs = [abs(math.log(v / ref)) for row in [*g.cases, None] for c in g.columns
            if (v := g.value(row, c)) and (ref := g.reference(row))]
    return min(max(max(logs, default=0.0), math.log(1.05)), math.log(4.0))


def colour(ratio: float | None, half_range: float) -> str:
    """Green faster, pale yellow even, red slower than the initial kernel (log scale)."""
    if not ratio:
        return NONE
    t = max(-1.0, min(1.0, math.log(ratio) / half_range))
    end = SLOW if t > 0 else FAST
    mixed = [round(a + (b - a) * abs(t)) for a, b in zip(EVEN, end)]
    return "#{:02x}{:02x}{:02x}".format(*mixed)


# -- drawing ---------------------------------------------------------------------------------------------

def _text(x: float, y: float, text: str, *, size: int = 11, anchor: str = "start", weight: str = "normal",
          fill: str = "#111827", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}"{extra}>{escape(text)}</text>')


def label_margin(g: Grid) -> int:
    """Pixels left of the cells: room for the longest row label."""
    return max(96, 8 + 7 * max(len(c) for c in [*g.cases, "geomean"]))


def heatmap_svg(g: Grid, *, title: bool = True) -> str:
    """The grid as one ``<svg>`` with its pixel size fixed (cells ≥ ``CELL_W`` × ``CELL_H``)."""
    rows: list[str | None] = [*g.cases, None]
    left = label_margin(g)
    top = 30 + (24 if title else 0)
    width = max(left + CELL_W * len(g.columns) + 16, LEGEND_W)
    height = top + CELL_H * len(rows) + 110
    half = spread(g)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" {FONT} aria-label="latency per case per round">',
             f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    if title:
        parts.append(_text(8, 18, f"{g.title}: latency per case per round (µs; colour: vs the initial kernel)",
                           size=13, weight="bold"))
    for j, col in enumerate(g.columns):
        x = left + j * CELL_W + CELL_W / 2
        parts.append(_text(x, top - 16, "initial" if col.round == 0 else f"round {col.round}", anchor="middle",
                           weight="bold"))
        parts.append(_text(x, top - 4, f"#{col.attempt['attempt']}" if col.attempt else "–", size=10,
                           anchor="middle", fill="#6b7280"))
    for i, row in enumerate(rows):
        y = top + i * CELL_H
        parts.append(_text(left - 8, y + CELL_H / 2 + 4, row or "geomean", anchor="end",
                           weight="normal" if row else "bold"))
        ref = g.reference(row)
        for j, col in enumerate(g.columns):
            x = left + j * CELL_W
            value = g.value(row, col)
            ratio = value / ref if value and ref else None
            tip = (f"round {col.round}, {col.passed} of {col.attempts} attempt(s) passed" + (
                f"; attempt {col.attempt['attempt']} ({col.attempt.get('label')}): {row or 'geomean'} "
                f"{short_us(value)} µs, {ref / value:.2f}× the initial kernel" if value and ref else "; none timed"))
            parts.append(f'<rect class="cell" x="{x + 1}" y="{y + 1}" width="{CELL_W - 2}" height="{CELL_H - 2}" '
                         f'fill="{colour(ratio, half)}"><title>{escape(tip)}</title></rect>')
            if value and ref:
                parts.append(_text(x + CELL_W / 2, y + 17, f"{short_us(value)} µs", anchor="middle",
                                   weight="normal" if row else "bold"))
                parts.append(_text(x + CELL_W / 2, y + 31, f"{ref / value:.2f}×", size=10, anchor="middle",
                                   fill="#374151"))
            else:
                parts.append(_text(x + CELL_W / 2, y + 17, "none passed", size=10, anchor="middle", fill="#4b5563"))
                parts.append(_text(x + CELL_W / 2, y + 31, f"0 of {col.attempts}", size=10, anchor="middle",
                                   fill="#4b5563"))
    bottom = top + CELL_H * len(rows)
    for j, col in enumerate(g.columns):
        if col.mark:
            stroke = ('stroke="#1d4ed8" stroke-width="3"' if col.mark == "winner"
                      else 'stroke="#b91c1c" stroke-width="2" stroke-dasharray="5 3"')
            parts.append(f'<rect class="{col.mark}" x="{left + j * CELL_W + 1}" y="{top + 1}" width="{CELL_W - 2}" '
                         f'height="{bottom - top - 2}" fill="none" {stroke}/>')
    parts += _legend(8, bottom + 16, half)
    parts.append("</svg>")
    return "".join(parts)


def _legend(x: float, y: float, half: float) -> list[str]:
    steps, width = 40, 240
    parts = [f'<rect x="{x + width * k / steps:.1f}" y="{y}" width="{width / steps + 0.5:.1f}" height="10" '
             f'fill="{colour(math.exp(half * (2 * k / (steps - 1) - 1)), half)}"/>' for k in range(steps)]
    factor = math.exp(half)
    parts += [_text(x, y + 24, f"{factor:.2f}× faster", size=10),
              _text(x + width / 2, y + 24, "initial", size=10, anchor="middle"),
              _text(x + width, y + 24, f"{factor:.2f}× slower", size=10, anchor="end"),
              f'<rect x="{x}" y="{y + 33}" width="14" height="10" fill="none" stroke="#1d4ed8" stroke-width="3"/>',
              _text(x + 20, y + 42, "passed the gate", size=10),
              f'<rect x="{x + 120}" y="{y + 33}" width="14" height="10" fill="none" stroke="#b91c1c" '
              'stroke-width="2" stroke-dasharray="5 3"/>', _text(x + 140, y + 42, "failed the gate", size=10),
              _text(x, y + 60, "a column: the round's fastest passing attempt (#N), or the gated winner in its round",
                    size=10, fill="#374151"),
              _text(x, y + 76, "a timing history, not evidence of correctness: the gate decides that", size=10,
                    fill="#6b7280")]
    return parts


def _ticks(top: float) -> list[float]:
    """Round tick values from 0 to about ``top``."""
    raw = top / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [k * step for k in range(int(top / step) + 1)]


def progress_svg(points: list[RoundPoint], winner: dict | None = None) -> str:
    """Best-so-far geomean (µs) per round: a line with one filled point per round, each round's own best
    as a hollow dot, the initial kernel as a dashed line and the gated winner ringed."""
    width, height, left, right, top, bottom = 760, 260, 64, 24, 28, 46
    values = [p.best_ms for p in points if p.best_ms] + [p.round_ms for p in points if p.round_ms]
    y_top = max(values) * 1000 * 1.08
    span_x = max(1, len(points) - 1)

    def px(r: int) -> float:
        return left + (width - left - right) * (r / span_x if len(points) > 1 else 0.5)

    def py(ms: float) -> float:
        return top + (height - top - bottom) * (1 - ms * 1000 / y_top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot progress" viewBox="0 0 {width} {height}" '
             f'role="img" {FONT} aria-label="best-so-far latency per round">',
             f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    for tick in _ticks(y_top):
        y = py(tick / 1000)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(_text(left - 6, y + 4, f"{tick:g}", size=10, anchor="end", fill="#6b7280"))
    middle = top + (height - top - bottom) / 2
    parts.append(_text(14, middle, "geomean (µs)", size=10, anchor="middle", fill="#6b7280",
                       extra=f' transform="rotate(-90 14 {middle:.1f})"'))
    for p in points:
        parts.append(_text(px(p.round), height - bottom + 16, "initial" if p.round == 0 else str(p.round), size=10,
                           anchor="middle", fill="#6b7280"))
    parts.append(_text((left + width - right) / 2, height - 8, "round", size=10, anchor="middle", fill="#6b7280"))
    initial = points[0].best_ms
    y0 = py(initial)
    parts.append(f'<line x1="{left}" y1="{y0:.1f}" x2="{width - right}" y2="{y0:.1f}" stroke="#9ca3af" '
                 'stroke-dasharray="4 3"/>')
    parts.append(_text(width - right, y0 - 5, f"initial {short_us(initial)} µs", size=10, anchor="end",
                       fill="#6b7280"))
    line = " ".join(f"{px(p.round):.1f},{py(p.best_ms):.1f}" for p in points if p.best_ms)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#1d4ed8" stroke-width="2"/>')
    for p in points:
        if p.round_ms:
            parts.append(f'<circle class="round-best" cx="{px(p.round):.1f}" cy="{py(p.round_ms):.1f}" r="3.5" '
                         f'fill="none" stroke="#9ca3af"><title>round {p.round}: its fastest {short_us(p.round_ms)} '
                         f'µs ({p.passed} of {p.attempts} passed)</title></circle>')
    for p in points:
        tip = (f"round {p.round}: best so far {short_us(p.best_ms)} µs (attempt {p.best_attempt}), "
               f"{initial / p.best_ms:.2f}× the initial kernel")
        parts.append(f'<circle class="point" data-round="{p.round}" cx="{px(p.round):.1f}" cy="{py(p.best_ms):.1f}" '
                     f'r="4.5" fill="#1d4ed8"><title>{escape(tip)}</title></circle>')
    if winner and winner.get("geomean_ms") and winner.get("round") is not None and winner["round"] < len(points):
        x, y = px(winner["round"]), py(winner["geomean_ms"])
        parts.append(f'<circle class="winner" cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="#15803d" '
                     'stroke-width="2.5"/>')
        parts.append(_text(x, y - 14, f"gated winner #{winner['attempt']}: {short_us(winner['geomean_ms'])} µs",
                           size=10, anchor="end" if x > width / 2 else "start", weight="bold", fill="#15803d"))
    parts.append("</svg>")
    return "".join(parts)
