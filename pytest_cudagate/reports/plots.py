"""Timing distributions as inline SVG (matplotlib, optional).

Two panels: overlaid histograms of both kernels' latencies with their medians (is the shift
real?), and latency per interleaved round (did the machine drift during the measurement?).
"""

from __future__ import annotations

import io
import re

import numpy as np

MISSING = ("timing plots need matplotlib, which is not installed here: "
           "pip install 'pytest-cudagate[report]' and re-render with `cudagate report merge`")
COLORS = {"approved": "#6b7280", "current": "#2563eb"}
_XML_PROLOG = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def timing_svg(samples_ms: dict[str, list[float]], uid: str, threshold: float | None = None) -> str | None:
    """An ``<svg>`` element for inlining, or None without matplotlib or samples."""
    series = {role: [x * 1000 for x in values] for role, values in samples_ms.items() if values}  # µs
    if not series or not available():
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": uid, "font.size": 8}):
        figure = Figure(figsize=(8.6, 2.5))
        hist, trace = figure.subplots(1, 2, width_ratios=[1, 1.4])
        # Fixed margins: a layout engine would cost more than the drawing itself.
        figure.subplots_adjust(left=0.07, right=0.99, bottom=0.17, top=0.9, wspace=0.2)
        _histograms(hist, series, threshold)
        _traces(trace, series)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = _METADATA.sub("", _XML_PROLOG.sub("", buffer.getvalue(), count=1))
    # Fit the page width; the viewBox keeps the aspect ratio.
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="plot" role="img"', svg, count=1)


def _histograms(ax, series: dict[str, list[float]], threshold: float | None) -> None:
    everything = np.concatenate([np.asarray(v) for v in series.values()])
    low, high = np.percentile(everything, [0.5, 99.5])  # a few preempted launches would squash the rest
    if high <= low:
        low, high = low * 0.99, high * 1.01 + 1e-9
    bins = np.linspace(low, high, 60)
    for role, values in series.items():
        color = COLORS.get(role, "#111827")
        ax.hist(np.clip(values, low, high), bins=bins, histtype="step", linewidth=1.4, color=color,
                label=f"{role} (n={len(values)})")
        ax.axvline(float(np.median(values)), color=color, linestyle="--", linewidth=1)
    if threshold and "approved" in series:
        ax.axvspan(float(np.median(series["approved"])) * (1 - threshold),
                   float(np.median(series["approved"])) * (1 + threshold), color="#10b981", alpha=0.12,
                   label=f"±{threshold:.0%} of approved median")
    ax.set_xlabel("latency (µs)")
    ax.set_ylabel("launches")
    ax.set_title("distribution (dashed: medians)")
    ax.legend(frameon=False, fontsize=7)


def _traces(ax, series: dict[str, list[float]]) -> None:
    everything = np.concatenate([np.asarray(v) for v in series.values()])
    low, high = np.percentile(everything, [0.5, 99.5])
    for role, values in series.items():
        ax.plot(range(1, len(values) + 1), values, linewidth=0.6, color=COLORS.get(role, "#111827"), label=role)
    ax.set_xlabel("round")
    ax.set_ylabel("latency (µs)")
    ax.set_title("per round (interleaved)" if len(series) > 1 else "per launch")
    if high > low:  # outliers beyond the window run off the chart instead of flattening it
        margin = (high - low) * 0.1
        ax.set_ylim(low - margin, high + margin)
    ax.legend(frameon=False, fontsize=7)
