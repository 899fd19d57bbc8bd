"""report.html opened from disk in headless Chromium: it renders, fetches nothing, logs no error.

Screenshots go to $CUDAGATE_ARTIFACTS when set (CI keeps them), else to the test's tmp folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from report_fixtures import build_scenario, built_report
from pytest_cudagate.reports.writer import write_report
from test_optimize_report import MIN_CELL_H, MIN_CELL_W, autotune_pack

CHROMIUM = next((p for p in (os.environ.get("CUDAGATE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                             shutil.which("chromium-browser"), shutil.which("google-chrome")) if p and Path(p).is_file()), None)
# Without these, Chromium phones home at start; on a closed network that is noise and delay.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# A browser starts in seconds and renders the optimize report in tens: CI runs these, the fast run does not.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install -y chromium)")]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("browser")
    write_report(base / "out", built_report(build_scenario(base / "scale")))
    return base / "out" / "report.html"


@pytest.fixture(scope="module")
def optimize_pack(tmp_path_factory) -> tuple[Path, dict]:
    """The report.html of a 113-attempt autotune search and its summary."""
    pack, summary, _ = autotune_pack(tmp_path_factory.mktemp("optimize"))
    return pack / "report.html", summary


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CUDAGATE_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def assert_screenshot(html: Path, shot: Path, height: int, profile: Path) -> None:
    """Headless Chromium's own screenshot of ``html``: it renders, and not as a blank page."""
    shot.unlink(missing_ok=True)
    result = subprocess.run([CHROMIUM, "--headless", *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                             f"--window-size=1280,{height}", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 20_000  # a blank page compresses to a few KB


def test_chromium_renders_a_screenshot(report_html, tmp_path):
    assert_screenshot(report_html, artifacts(tmp_path) / "report-chromium.png", 2000, tmp_path / "profile")


@contextlib.contextmanager
def offline_page(html: Path, shot: Path, height: int):
    """``html`` opened in Chromium without JavaScript; on leaving, a full-page screenshot is taken and the
    page must have fetched nothing but itself and logged no error."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (optional)")
    requests, errors = [], []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": height}, java_script_enabled=False)
            page.on("request", lambda request: requests.append(request.url))
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(html.as_uri())
            yield page
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert requests == [html.as_uri()], requests  # nothing but the file itself
    assert errors == []
    assert shot.read_bytes().startswith(PNG_SIGNATURE) and shot.stat().st_size > 50_000


def test_playwright_sees_the_page_offline_and_without_errors(report_html, tmp_path):
    with offline_page(report_html, artifacts(tmp_path) / "report-playwright.png", 2000) as page:
        assert page.locator("header .badge").inner_text() == "FAIL"
        assert page.title().startswith("cudagate FAIL: 2 failed")
        widths = page.locator("svg.plot").evaluate_all("nodes => nodes.map(n => n.getBoundingClientRect().width)")
        assert len(widths) == 3 and min(widths) > 500


def test_chromium_renders_the_optimize_report(optimize_pack, tmp_path):
    report, _ = optimize_pack
    assert_screenshot(report, artifacts(tmp_path) / "optimize-report-chromium.png", 2600, tmp_path / "profile")


def test_playwright_sees_a_legible_optimize_report(optimize_pack, tmp_path):
    report, summary = optimize_pack
    with offline_page(report, artifacts(tmp_path) / "optimize-report-playwright.png", 2600) as page:
        assert page.locator("header .badge").inner_text() == "WINNER"
        assert page.locator("svg.progress circle.point").count() == summary["rounds"] + 1
        chart = page.locator("svg.progress").bounding_box()
        assert chart["width"] > 500 and chart["height"] > 150
        boxes = page.locator("svg.heatmap rect.cell").evaluate_all(
            "nodes => nodes.map(n => [n.getBoundingClientRect().width, n.getBoundingClientRect().height])")
        assert len(boxes) == (summary["rounds"] + 1) * (len(summary["initial"]["latency_ms"]) + 1)
        assert min(w for w, _ in boxes) >= MIN_CELL_W and min(h for _, h in boxes) >= MIN_CELL_H
        page_width = page.evaluate("document.documentElement.scrollWidth")
        assert page_width <= 1280  # a wide heatmap scrolls inside its box, not the page
