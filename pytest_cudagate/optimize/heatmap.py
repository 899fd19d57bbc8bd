"""``heatmap.svg`` / ``heatmap.png``: latency per performance case (rows, plus their geometric mean)
per round (columns), the layout of :func:`pytest_cudagate.optimize.charts.heatmap_svg`.

Colour is the latency relative to the initial kernel (green faster, red slower, log scale). A timing
history, not evidence of correctness: that is the gate's job (a column is outlined blue only once its
attempt passed the gate). The SVG needs nothing beyond the standard library; the PNG, the same grid
with cells of at least ``CELL_W`` × ``CELL_H`` pixels, needs matplotlib and is skipped without it.
"""

from __future__ import annotations

import io
import math

from pytest_cudagate.optimize.charts import CELL_H, CELL_W, colour, grid, heatmap_svg, label_margin, short_us, spread

DPI = 100


def write_heatmaps(pack, summary: dict, history: dict) -> list[str]:
    g = grid(summary, history)
    if g is None:
        return []
    pack.write_text("heatmap.svg", heatmap_svg(g) + "\n")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ["heatmap.svg"]
    pack.write_bytes("heatmap.png", _png(g))
    return ["heatmap.png", "heatmap.svg"]


def _png(g) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows = [*g.cases, None]
    half = spread(g)
    left_px = label_margin(g)
    width_px, height_px = max(left_px + CELL_W * len(g.columns) + 24, 640), 70 + CELL_H * len(rows) + 60
    with matplotlib.rc_context({"font.size": 8}):
        figure = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
        ax = figure.add_axes((left_px / width_px, 60 / height_px, CELL_W * len(g.columns) / width_px,
                              CELL_H * len(rows) / height_px))
        ax.set_xlim(-0.5, len(g.columns) - 0.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        for i, row in enumerate(rows):
            ref = g.reference(row)
            for j, col in enumerate(g.columns):
                value = g.value(row, col)
                ratio = value / ref if value and ref else None
                ax.add_patch(Rectangle((j - 0.48, i - 0.46), 0.96, 0.92, color=colour(ratio, half), lw=0))
                text = (f"{short_us(value)} µs\n{ref / value:.2f}×" if ratio else f"none passed\n0 of {col.attempts}")
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="#111827",
                        fontweight="normal" if row else "bold")
        for j, col in enumerate(g.columns):
            if col.mark == "winner":
                ax.add_patch(Rectangle((j - 0.48, -0.46), 0.96, len(rows) - 0.08, fill=False, lw=2.5,
                                       edgecolor="#1d4ed8"))
            elif col.mark == "gate-failed":
                ax.add_patch(Rectangle((j - 0.48, -0.46), 0.96, len(rows) - 0.08, fill=False, lw=1.8,
                                       edgecolor="#b91c1c", linestyle="--"))
        ax.set_yticks(range(len(rows)), [r or "geomean" for r in rows])
        ax.set_xticks(range(len(g.columns)), [("initial" if c.round == 0 else f"round {c.round}")
                                              + (f"\n#{c.attempt['attempt']}" if c.attempt else "\n–")
                                              for c in g.columns])
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        figure.text(0.01, 1 - 14 / height_px, f"{g.title}: latency per case per round (µs; colour: vs the initial "
                    f"kernel, ±{math.exp(half):.2f}×)", fontsize=10, fontweight="bold", va="top")
        figure.text(0.01, 10 / height_px, "a column: the round's fastest passing attempt (#N), or the gated winner in "
                    "its round\nblue: passed the gate · red dashed: failed it · a timing history, not evidence of "
                    "correctness", fontsize=7.5, color="#374151")
        png = io.BytesIO()
        figure.savefig(png, format="png", metadata={"Software": None})
    return png.getvalue()
