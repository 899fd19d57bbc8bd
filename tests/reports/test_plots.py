"""The report's timing plots, read back from the SVG: what is drawn where, on the drawing's own axes."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from report_fixtures import as_report, build_scenario, built_report
from pytest_cudagate.reports.html_item import MAX_PLOTS
from pytest_cudagate.reports.html_page import render
from pytest_cudagate.reports.plots import COLORS, timing_svg

SVG = "{http://www.w3.org/2000/svg}"
RNG = np.random.default_rng(14)


def drawn(samples_ms: dict, threshold: float | None = None, uid: str = "item-1") -> ET.Element:
    svg = timing_svg(samples_ms, uid, threshold)
    assert svg is not None
    assert not re.search(r"nan|inf", svg, re.IGNORECASE)  # a NaN coordinate draws nothing, silently
    root = ET.fromstring(svg)
    assert root.get("class") == "plot" and root.get("role") == "img"
    assert root.get("viewBox") and root.get("width") is None  # the page width decides the size
    return root


def panel(root: ET.Element, name: str) -> ET.Element:
    return root.find(f"{SVG}g[@class='panel {name}']")


def axis(group: ET.Element, which: str):
    """Value -> viewBox coordinate, fitted through the panel's labelled ticks."""
    ticks = group.find(f"{SVG}g[@class='{which}-ticks']")
    lines, labels = ticks.findall(f"{SVG}line"), [float(t.text) for t in ticks.findall(f"{SVG}text")]
    places = [float(line.get("x1" if which == "x" else "y1")) for line in lines]
    assert len(labels) >= 2 and len(places) == len(labels)
    slope, offset = np.polyfit(labels, places, 1)
    assert np.allclose(np.polyval([slope, offset], labels), places, atol=0.06)  # evenly spaced, linear
    return lambda value: slope * value + offset, lambda place: (place - offset) / slope


def by_role(group: ET.Element, tag: str, cls: str) -> dict[str, ET.Element]:
    return {e.get("data-role"): e for e in group.iter(f"{SVG}{tag}") if e.get("class") == cls}


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def step_heights(path: str) -> list[float]:
    """The y of each bin's top in a step outline ``M x,base V y H x ... V base``."""
    return [float(y) for y in re.findall(r"V([-\d.]+)H", path)]


def trace_points(rounds: ET.Element, role: str) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in by_role(rounds, "polyline", "trace")[role].get("points").split()]


def gate_samples() -> dict[str, list[float]]:
    return {"approved": list(RNG.normal(0.020, 0.0005, 1000)), "current": list(RNG.normal(0.0212, 0.0005, 1000))}


def test_both_series_are_drawn_in_their_colours_with_counts_in_the_legend():
    samples = gate_samples()
    root = drawn(samples, 0.02)
    hist, rounds = panel(root, "distribution"), panel(root, "rounds")
    for group, tag, cls in ((hist, "path", "hist"), (hist, "line", "median"), (rounds, "polyline", "trace")):
        shapes = by_role(group, tag, cls)
        assert set(shapes) == {"approved", "current"}
        assert {r: e.get("stroke") for r, e in shapes.items()} == COLORS
    assert "approved (n=1000)" in texts(hist) and "current (n=1000)" in texts(hist)
    assert "per round (interleaved)" in texts(rounds) and "latency (µs)" in texts(root)


def test_histogram_counts_match_the_samples_on_the_drawn_axis():
    samples = gate_samples()
    root = drawn(samples)
    hist = panel(root, "distribution")
    _, count_at = axis(hist, "y")
    everything = np.concatenate([np.asarray(v) * 1000 for v in samples.values()])
    low, high = np.percentile(everything, [0.5, 99.5])
    for role, path in by_role(hist, "path", "hist").items():
        values = np.clip(np.asarray(samples[role]) * 1000, low, high)
        expected = np.histogram(values, bins=np.linspace(low, high, 61))[0]
        heights = [count_at(y) for y in step_heights(path.get("d"))]
        assert len(heights) == 60
        assert np.allclose(heights, expected, atol=0.15), role


def test_medians_sit_at_each_roles_median():
    samples = gate_samples()
    hist = panel(drawn(samples), "distribution")
    x_of, _ = axis(hist, "x")
    for role, line in by_role(hist, "line", "median").items():
        assert float(line.get("x1")) == float(line.get("x2"))
        assert float(line.get("x1")) == pytest.approx(x_of(np.median(samples[role]) * 1000), abs=0.1), role
    medians = {r: float(e.get("x1")) for r, e in by_role(hist, "line", "median").items()}
    assert medians["current"] - medians["approved"] > 30  # a 6 % shift is plainly visible


def test_the_threshold_band_surrounds_the_approved_median_only_when_given():
    samples = gate_samples()
    hist = panel(drawn(samples, 0.03), "distribution")
    x_of, _ = axis(hist, "x")
    band, = [r for r in hist.iter(f"{SVG}rect") if r.get("class") == "band"]
    centre = np.median(samples["approved"]) * 1000
    assert float(band.get("x")) == pytest.approx(x_of(centre * 0.97), abs=0.1)
    assert float(band.get("x")) + float(band.get("width")) == pytest.approx(x_of(centre * 1.03), abs=0.15)
    assert "±3% of approved median" in texts(hist)
    for root in (drawn(samples), drawn({"current": samples["current"]}, 0.03)):
        assert not [r for r in root.iter(f"{SVG}rect") if r.get("class") == "band"]
        assert not any("approved median" in t for t in texts(root))


def test_a_few_preempted_launches_do_not_stretch_the_window():
    samples = gate_samples()
    for index, ms in ((100, 5.0), (500, 7.5), (900, 9.0)):  # three launches of several ms among ~20 µs ones
        samples["current"][index] = ms
    root = drawn(samples)
    hist, rounds = panel(root, "distribution"), panel(root, "rounds")
    ticks = [float(t.text) for t in hist.find(f"{SVG}g[@class='x-ticks']").iter(f"{SVG}text")]
    assert 17 < min(ticks) and max(ticks) < 24  # µs, not ms
    rows = [float(t.text) for t in rounds.find(f"{SVG}g[@class='y-ticks']").iter(f"{SVG}text")]
    assert 17 < min(rows) and max(rows) < 24
    frame = next(rounds.iter(f"{SVG}rect"))
    top = float(frame.get("y"))
    x_of, _ = axis(rounds, "x")
    at_top = [x for x, y in trace_points(rounds, "current") if y == top]
    for index in (100, 500, 900):  # each outlier runs off the top edge at its own round
        assert any(abs(x - x_of(index + 1)) < 0.1 for x in at_top), index
    # In the histogram they land in the last bin rather than widening the axis.
    _, count_at = axis(hist, "y")
    assert count_at(step_heights(by_role(hist, "path", "hist")["current"].get("d"))[-1]) >= 3 - 0.15


def test_a_single_series_is_drawn_per_launch():
    values = list(RNG.normal(0.5, 0.01, 300))
    root = drawn({"current": values}, 0.05)
    rounds = panel(root, "rounds")
    assert "per launch" in texts(rounds) and "launch" in texts(rounds)
    assert set(by_role(root, "path", "hist")) == set(by_role(rounds, "polyline", "trace")) == {"current"}
    assert "current (n=300)" in texts(root)
    x_of, _ = axis(rounds, "x")
    points = by_role(rounds, "polyline", "trace")["current"].get("points").split()
    assert len(points) == 300
    assert float(points[0].split(",")[0]) == pytest.approx(x_of(1), abs=0.1)
    assert float(points[-1].split(",")[0]) == pytest.approx(x_of(300), abs=0.1)


def test_identical_values_get_a_window_around_them():
    root = drawn({"approved": [0.004] * 40, "current": [0.004] * 40}, 0.05)
    hist = panel(root, "distribution")
    x_of, _ = axis(hist, "x")
    frame = next(hist.iter(f"{SVG}rect"))
    middle = float(frame.get("x")) + float(frame.get("width")) / 2
    for line in by_role(hist, "line", "median").values():
        assert float(line.get("x1")) == pytest.approx(x_of(4.0), abs=0.1)
        assert float(line.get("x1")) == pytest.approx(middle, abs=0.1)
    axis(panel(root, "rounds"), "y")  # the trace panel still has a labelled, non-degenerate axis


def test_one_launch_each_is_a_dot_not_an_invisible_line():
    rounds = panel(drawn({"approved": [0.010], "current": [0.012]}), "rounds")
    assert set(by_role(rounds, "circle", "trace")) == {"approved", "current"}


def test_nan_and_infinite_samples_are_left_out():
    samples = gate_samples()
    samples["current"][5] = float("nan")
    samples["approved"][7] = float("inf")
    root = drawn(samples, 0.02)
    assert "current (n=999)" in texts(root) and "approved (n=999)" in texts(root)
    assert timing_svg({"current": [float("nan")]}, "x") is None
    assert timing_svg({}, "x") is None and timing_svg({"approved": [], "current": []}, "x") is None


def test_every_text_is_escaped_and_nothing_loads_or_runs():
    role = '<script>alert("x")</script>&'
    svg = timing_svg({role: [0.01, 0.011], "current": [0.012, 0.013]}, 'a"><script>', 0.02)
    assert "<script" not in svg and 'a"><' not in svg
    root = ET.fromstring(svg)
    assert f"{role} (n=2)" in texts(root)
    assert not re.search(r"\b(href|src|on\w+)=|url\(|<foreignObject|@import", svg)


def test_the_output_is_deterministic_and_has_no_ids():
    samples = gate_samples()
    assert timing_svg(samples, "a", 0.02) == timing_svg(samples, "a", 0.02)
    assert " id=" not in timing_svg(samples, "a", 0.02)


def test_long_traces_are_thinned_per_pixel_column_keeping_the_extremes():
    values = RNG.uniform(0.019, 0.021, 100_000)  # bounded, so the window's margin holds every launch
    values[61_234] = 0.0211  # the slowest launch
    values[7_001] = 0.0189  # the fastest
    svg = timing_svg({"current": list(values)}, "long")
    assert len(svg) < 40_000
    rounds = panel(ET.fromstring(svg), "rounds")
    x_of, _ = axis(rounds, "x")
    _, value_at = axis(rounds, "y")
    points = trace_points(rounds, "current")
    xs, ys = zip(*points)
    assert list(xs) == sorted(xs)  # launch order
    slow, fast = max(points, key=lambda p: value_at(p[1])), min(points, key=lambda p: value_at(p[1]))
    assert value_at(slow[1]) == pytest.approx(21.1, abs=0.01) and slow[0] == pytest.approx(x_of(61_235), abs=0.1)
    assert value_at(fast[1]) == pytest.approx(18.9, abs=0.01) and fast[0] == pytest.approx(x_of(7_002), abs=0.1)
    assert len(points) <= 2 * 406


@pytest.mark.parametrize("samples", [[1e-3] * 300 + [1.79e305], [1e-3, 1.79e305], [1.0, float(np.nextafter(1.0, 2.0))],
                                     [0.0100001] * 10])
def test_absurd_or_nearly_identical_values_still_draw_valid_finite_svg(samples):
    """report.json only asks for positive numbers; a merged or hand-edited one may hold anything else."""
    svg = timing_svg({"approved": [0.01] * 10, "current": samples}, "u", 0.02)
    ET.fromstring(svg)
    assert "inf" not in svg and "nan" not in svg.lower()
    labels = re.findall(r">(-?[\d.]+)</text>", svg)
    assert labels and max(len(label) for label in labels) <= 20


def test_a_page_of_many_cases_draws_the_first_ones_plots_and_says_where_the_rest_are(tmp_path):
    """Issue 41, finding 11: a report of 12,000 cases drew 12,000 plots (12 s, a 110 MB page)."""
    document = copy.deepcopy(built_report(build_scenario(tmp_path / "scale")).document)
    timed = next(i for i in document["items"] if i["samples_ms"])
    document["items"] = [{**copy.deepcopy(timed), "case": f"c{n}", "nodeid": f"{timed['nodeid']}{n}"}
                         for n in range(MAX_PLOTS + 3)]
    page = render(as_report(document))
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="plot"') == MAX_PLOTS
    assert page.count("timing plot left out: the page draws the first 500 cases; report.json holds every sample") == 3
    assert page.rindex("<svg") < page.index('id="item-501"')  # the first cases in the page's order have them
