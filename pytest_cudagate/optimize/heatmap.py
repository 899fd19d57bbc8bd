"""``heatmap.png`` / ``heatmap.svg``: latency per performance case (rows) per attempt (columns).

Colour is the latency relative to the initial kernel (green faster, red slower, log scale);
grey columns were rejected, with the stage that rejected them. A timing history, not evidence of
correctness: that is the gate's job (the winner's column is outlined only once it passed).
Without matplotlib a plain SVG of the same grid is written and the PNG is skipped.
"""

from __future__ import annotations

import io
import math
from html import escape

STAGE_MARK = {"proposal": "P", "duplicate": "=", "static": "S", "compile": "C", "correctness": "✗", "performance": "✗",
              "skipped": "–"}


def _grid(opt) -> tuple[list[str], list, list[list[float | None]]]:
    cases = list(opt.perf)
    columns = [a for a in opt.attempts if a.candidate is not None]
    values = [[a.anchored.get(case) if a.passed else None for a in columns] for case in cases]
    return cases, columns, values


def write_heatmaps(pack, opt) -> list[str]:
    cases, columns, values = _grid(opt)
    if not cases or not columns:
        return []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pack.write_text("heatmap.svg", plain_svg(opt, cases, columns, values))
        return ["heatmap.svg"]
    png, svg = _matplotlib(opt, cases, columns, values, pack.name)
    pack.write_bytes("heatmap.png", png)
    pack.write_text("heatmap.svg", svg)
    return ["heatmap.png", "heatmap.svg"]


def _matplotlib(opt, cases, columns, values, uid: str) -> tuple[bytes, str]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    base = [opt.base.get(c) for c in cases]
    rel = np.array([[v / b if v and b else np.nan for v in row] for row, b in zip(values, base)], dtype=float)
    finite = rel[np.isfinite(rel)]
    largest = float(np.max(np.abs(np.log(finite)))) if finite.size else 0.05
    spread = math.exp(min(max(largest, 0.05), 1.5))  # a symmetric colour range around 1
    width = min(40.0, max(7.5, 2.5 + 0.55 * len(columns)))
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": uid, "font.size": 8}):
        figure = Figure(figsize=(width, 1.4 + 0.45 * len(cases)), layout="constrained")
        ax = figure.subplots()
        cmap = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad="#d1d5db")
        image = ax.imshow(np.ma.masked_invalid(rel), aspect="auto", cmap=cmap, norm=LogNorm(1 / spread, spread))
        for i in range(len(cases)):
            for j, attempt in enumerate(columns):
                v = values[i][j]
                text = f"{v * 1000:.1f}" if v else STAGE_MARK.get(attempt.stage, "✗")
                if len(columns) <= 60:
                    ax.text(j, i, text, ha="center", va="center", fontsize=6.5 if v else 8, color="#111827")
        winner = opt.winner
        for j, attempt in enumerate(columns):
            if winner is not None and attempt is winner:
                ax.add_patch(Rectangle((j - 0.5, -0.5), 1, len(cases), fill=False, lw=2.2,
                                                          edgecolor="#1d4ed8"))
            elif attempt.validation is not None and not attempt.validation.passed:
                ax.add_patch(Rectangle((j - 0.5, -0.5), 1, len(cases), fill=False, lw=1.6,
                                                          edgecolor="#b91c1c", linestyle="--"))
        ax.set_yticks(range(len(cases)), cases)
        ax.set_xticks(range(len(columns)), [f"{a.index}\nr{a.round}" for a in columns], fontsize=6.5)
        ax.set_xlabel("attempt (r: round) · cells: µs on the initial kernel's scale\n"
                      "grey: rejected (C compile, ✗ wrong, S static, P unusable answer) · blue: the gated winner · "
                      "red dashed: failed the gate", fontsize=7)
        ax.set_title(f"{opt.suite.name} / {opt.program.name}: latency relative to the initial kernel")
        figure.colorbar(image, ax=ax, label="latency / initial", fraction=0.03)
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=130, metadata={"Software": None})
        svg = io.StringIO()
        figure.savefig(svg, format="svg", metadata={"Date": None})
    return png.getvalue(), svg.getvalue()


def plain_svg(opt, cases, columns, values) -> str:
    """The grid without matplotlib: one rect per cell, a title per cell."""
    cell_w, cell_h, left, top = 46, 24, 170, 30
    width, height = left + cell_w * len(columns) + 10, top + cell_h * len(cases) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="10">', f'<text x="4" y="16">{escape(opt.suite.name)} / {escape(opt.program.name)}: latency '
             'per case per attempt (µs)</text>']
    for i, case in enumerate(cases):
        y = top + i * cell_h
        parts.append(f'<text x="4" y="{y + 16}">{escape(case)}</text>')
        base = opt.base.get(case)
        for j, attempt in enumerate(columns):
            v = values[i][j]
            x = left + j * cell_w
            if v and base:
                r = max(-1.0, min(1.0, math.log(v / base) / 0.7))
                color = f"rgb({int(128 + 127 * max(r, 0))},{int(128 + 127 * max(-r, 0))},120)"
                label = f"{v * 1000:.1f}"
            else:
                color, label = "#d1d5db", STAGE_MARK.get(attempt.stage, "x")
            parts.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{color}">'
                         f'<title>attempt {attempt.index}, round {attempt.round}, {escape(case)}</title></rect>'
                         f'<text x="{x + 4}" y="{y + 15}">{escape(label)}</text>')
    for j, attempt in enumerate(columns):
        parts.append(f'<text x="{left + j * cell_w + 4}" y="{top + len(cases) * cell_h + 14}">{attempt.index}/r{attempt.round}</text>')
    parts.append("</svg>")
    return "".join(parts) + "\n"
