"""Timing distributions as inline SVG, drawn as plain text (no matplotlib: a figure cost ~0.17 s per case).

Two panels: overlaid step histograms of both kernels' latencies with their medians (is the shift
real?), and latency per interleaved round (did the machine drift during the measurement?). Both use
the window of the 0.5–99.5 percentiles of all samples, so a few preempted launches do not squash the
rest; the output depends on the samples alone (no ids, no clock), so a report re-renders identically.
"""

from __future__ import annotations

import math

import numpy as np

from pytest_cudagate.reports import escape

COLORS = {"approved": "#6b7280", "current": "#2563eb"}
OTHER = "#111827"  # a role without a colour of its own
BAND = "#10b981"
BINS = 60
FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'
WIDTH, HEIGHT = 860, 250
TOP, BOTTOM = 26, 208  # the panels' plot area, in viewBox units
HIST = (58, 372)  # x extent of the histogram panel
TRACE = (432, 838)  # x extent of the per-round panel


def timing_svg(samples_ms: dict[str, list[float]], uid: str, threshold: float | None = None) -> str | None:
    """An ``<svg>`` element for inlining, or None when no role has a finite sample.

    ``uid`` names the figure for assistive technology only; nothing in the drawing needs an id.
    """
    series = {}
    for role, values in samples_ms.items():
        finite = np.asarray(values, dtype=float) * 1000.0  # µs
        # A hand-edited report may hold NaN or absurd values; a launch lasts between a picosecond and an hour.
        finite = finite[np.isfinite(finite) & (finite >= 1e-6) & (finite <= 3.6e9)]
        if finite.size:
            series[str(role)] = finite
    if not series:
        return None
    low, high = _window(np.concatenate(list(series.values())))
    medians = {role: float(np.median(values)) for role, values in series.items()}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'{FONT} aria-label="{escape.html(f"latency distribution and per-round trace ({uid})")}">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>']
    parts += _histograms(series, medians, low, high, threshold)
    parts += _traces(series, low, high)
    parts.append("</svg>")
    return "".join(parts)


def _window(everything: np.ndarray) -> tuple[float, float]:
    low, high = (float(v) for v in np.percentile(everything, [0.5, 99.5]))
    if high - low <= 1e-9 * abs(high):  # (nearly) identical samples: a window of ±1 %
        pad = abs(low) * 0.01
        low, high = low - pad, high + pad
    return low, high


# -- drawing helpers ---------------------------------------------------------------------------------------

def _text(x: float, y: float, text: str, *, size: int = 10, anchor: str = "start", fill: str = "#374151",
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"{extra}>'
            f"{escape.html(text)}</text>")


def _ticks(low: float, high: float, *, whole: bool = False, count: int = 5) -> tuple[list[float], int]:
    """Round tick values inside [low, high] and the decimals their labels need (``whole``: steps of ≥ 1)."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if whole:
        step = max(1, round(step))
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    decimals = min(9, max(0, -math.floor(math.log10(step) + 1e-9)))
    if abs(round(step, decimals) - step) > step * 1e-6:  # 0.25, 2.5e-3
        decimals += 1
    return [k * step for k in range(first, last + 1)], decimals


def _scale(low: float, high: float, start: float, end: float):
    span = high - low
    return lambda v: start + (end - start) * (v - low) / span


def _frame(x0: float, x1: float, title: str, x_label: str, y_label: str) -> list[str]:
    middle = (TOP + BOTTOM) / 2
    return [f'<rect x="{x0}" y="{TOP}" width="{x1 - x0}" height="{BOTTOM - TOP}" fill="none" stroke="#9ca3af"/>',
            _text((x0 + x1) / 2, TOP - 9, title, size=11, anchor="middle", fill=OTHER),
            _text((x0 + x1) / 2, BOTTOM + 34, x_label, anchor="middle"),
            _text(x0 - 42, middle, y_label, anchor="middle",
                  extra=f' transform="rotate(-90 {x0 - 42:.1f} {middle:.1f})"')]


def _axis_x(ticks: tuple[list[float], int], px) -> str:
    values, decimals = ticks
    return '<g class="x-ticks">' + "".join(
        f'<line x1="{px(v):.1f}" y1="{BOTTOM}" x2="{px(v):.1f}" y2="{BOTTOM + 4}" stroke="#6b7280"/>'
        + _text(px(v), BOTTOM + 15, f"{v:.{decimals}f}", size=9, anchor="middle") for v in values) + "</g>"


def _axis_y(x0: float, ticks: tuple[list[float], int], py) -> str:
    values, decimals = ticks
    return '<g class="y-ticks">' + "".join(
        f'<line x1="{x0 - 4}" y1="{py(v):.1f}" x2="{x0}" y2="{py(v):.1f}" stroke="#6b7280"/>'
        + _text(x0 - 6, py(v) + 3, f"{v:.{decimals}f}", size=9, anchor="end") for v in values) + "</g>"


def _legend(x1: float, entries: list[tuple[str, str]]) -> list[str]:
    """Entries (label, swatch markup at the origin) stacked in the panel's top right corner, on a
    translucent backing so the lines under them stay visible but do not cross the text."""
    width = 40 + 5.2 * max(len(label) for label, _ in entries)
    parts = ['<g class="legend">', f'<rect x="{x1 - width:.1f}" y="{TOP + 2}" width="{width - 2:.1f}" '
             f'height="{13 * len(entries) + 4}" fill="#ffffff" fill-opacity="0.85"/>']
    for k, (label, swatch) in enumerate(entries):
        y = TOP + 12 + 13 * k
        parts.append(f'<g transform="translate({x1 - 26:.1f} {y - 3:.1f})">{swatch}</g>')
        parts.append(_text(x1 - 30, y + 1, label, size=9, anchor="end"))
    return parts + ["</g>"]


def _line_swatch(color: str) -> str:
    return f'<line x1="0" y1="0" x2="18" y2="0" stroke="{color}" stroke-width="1.6"/>'


def _points(xs: np.ndarray, ys: np.ndarray) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs.tolist(), ys.tolist()))


# -- the panels ------------------------------------------------------------------------------------------------

def _histograms(series: dict[str, np.ndarray], medians: dict[str, float], low: float, high: float,
                threshold: float | None) -> list[str]:
    x0, x1 = HIST
    edges = np.linspace(low, high, BINS + 1)
    counts = {role: np.histogram(np.clip(values, low, high), bins=edges)[0] for role, values in series.items()}
    top = max(int(c.max()) for c in counts.values()) * 1.08
    px, py = _scale(low, high, x0, x1), _scale(0, top, BOTTOM, TOP)
    parts = ['<g class="panel distribution">',
             *_frame(x0, x1, "distribution (dashed: medians)", "latency (µs)", "launches")]
    band = []
    if threshold and "approved" in series:
        centre = medians["approved"]
        left, right = (min(max(px(centre * f), x0), x1) for f in (1 - threshold, 1 + threshold))
        parts.append(f'<rect class="band" x="{left:.1f}" y="{TOP}" width="{right - left:.1f}" '
                     f'height="{BOTTOM - TOP}" fill="{BAND}" fill-opacity="0.14"/>')
        band.append((f"±{threshold * 100:g}% of approved median",
                     f'<rect x="0" y="-4" width="18" height="8" fill="{BAND}" fill-opacity="0.3"/>'))
    parts += [_axis_x(_ticks(low, high), px), _axis_y(x0, _ticks(0, top, whole=True), py)]
    xs = px(edges)
    for role, values in series.items():
        color = COLORS.get(role, OTHER)
        ys = py(counts[role])
        # A step outline: up each bin's left edge, across its top, down to the baseline at the end.
        path = (f"M{xs[0]:.1f},{BOTTOM} "
                + " ".join(f"V{y:.1f}H{x:.1f}" for x, y in zip(xs[1:].tolist(), ys.tolist())) + f"V{BOTTOM}")
        parts.append(f'<path class="hist" data-role="{escape.html(role)}" d="{path}" fill="none" stroke="{color}" '
                     f'stroke-width="1.4"/>')
        # Outside the window only when one role has a handful of samples: pin it to the edge.
        x = min(max(px(medians[role]), x0), x1)
        parts.append(f'<line class="median" data-role="{escape.html(role)}" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" '
                     f'y2="{BOTTOM}" stroke="{color}" stroke-dasharray="4 3"/>')
    entries = [(f"{role} (n={values.size})", _line_swatch(COLORS.get(role, OTHER)))
               for role, values in series.items()]
    return parts + _legend(x1, entries + band) + ["</g>"]


def _downsample(values: np.ndarray, columns: int) -> np.ndarray:
    """Indices to draw: all of them when they fit, else each pixel column's lowest and highest sample in
    launch order, so spikes and drift survive and the line looks as it would drawn in full."""
    if values.size <= 2 * columns:
        return np.arange(values.size)
    column = np.arange(values.size) * columns // values.size
    order = np.lexsort((values, column))  # by column, then by value within it
    starts = np.flatnonzero(np.r_[True, column[order][1:] != column[order][:-1]])
    ends = np.r_[starts[1:], values.size] - 1
    return np.unique(np.concatenate([order[starts], order[ends]]))


def _traces(series: dict[str, np.ndarray], low: float, high: float) -> list[str]:
    x0, x1 = TRACE
    margin = (high - low) * 0.1  # outliers beyond the window run off the chart instead of flattening it
    y_low, y_high = low - margin, high + margin
    length = max(values.size for values in series.values())
    px = _scale(1, length, x0, x1) if length > 1 else _scale(0, 2, x0, x1)  # one launch: in the middle
    py = _scale(y_low, y_high, BOTTOM, TOP)
    interleaved = len(series) > 1
    parts = ['<g class="panel rounds">', *_frame(x0, x1, "per round (interleaved)" if interleaved else "per launch",
                                                 "round" if interleaved else "launch", "latency (µs)"),
             _axis_x(_ticks(1, length, whole=True) if length > 1 else ([1], 0), px),
             _axis_y(x0, _ticks(y_low, y_high), py)]
    for role, values in series.items():
        keep = _downsample(values, int(x1 - x0))
        xs, ys = px(keep + 1.0), py(np.clip(values[keep], y_low, y_high))
        if keep.size == 1:  # a line through one point draws nothing
            parts.append(f'<circle class="trace" data-role="{escape.html(role)}" cx="{xs[0]:.1f}" cy="{ys[0]:.1f}" '
                         f'r="2.5" fill="{COLORS.get(role, OTHER)}"/>')
            continue
        parts.append(f'<polyline class="trace" data-role="{escape.html(role)}" points="{_points(xs, ys)}" fill="none" '
                     f'stroke="{COLORS.get(role, OTHER)}" stroke-width="0.8" stroke-linejoin="round"/>')
    return parts + _legend(x1, [(role, _line_swatch(COLORS.get(role, OTHER))) for role in series]) + ["</g>"]
