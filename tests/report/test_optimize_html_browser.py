"""A real browser looks at the HTML report of `optimize`: headless Chromium lays it out with its four charts, logs no
console error, runs no script from a hostile name, and takes a screenshot (saved in tmp_path, the test's artifact).

The report has no script of its own; the test opens a copy with a small probe script in <head> that records
`error` events (script errors and failed resource loads), console.error/warn and alert calls, measures every chart
and every chart label, and writes the result into the DOM, which `--dump-dom` prints. Console messages that never
reach JavaScript (CSP, parser) are read from Chromium's own log (`--enable-logging=stderr`)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import optimize_results
from advisor.report.optimize_html import render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1280, 2400)

PROBE = """<script>
window.__problems = [];
window.addEventListener("error",
  e => __problems.push("error: " + (e.message || (e.target && e.target.outerHTML))), true);
for (const level of ["error", "warn"]) {
  const original = console[level];
  console[level] = (...args) => { __problems.push(level + ": " + args.join(" ")); original.apply(console, args); };
}
window.alert = message => __problems.push("alert: " + message);
window.addEventListener("load", () => {
  const charts = [...document.querySelectorAll("svg.chart")].map(svg => {
    const box = svg.getBoundingClientRect(), view = svg.viewBox.baseVal;
    const shapes = [...svg.querySelectorAll("rect,circle,path,line")].filter(s => {
      const b = s.getBBox(); return b.width > 0 || b.height > 0; }).length;
    const clipped = [...svg.querySelectorAll("text")].filter(t => {
      const b = t.getBBox();
      return b.x < -1 || b.x + b.width > view.width + 1 || b.y < -1 || b.y + b.height > view.height + 1;
    }).map(t => t.textContent);
    return {label: svg.getAttribute("aria-label"), width: box.width, height: box.height, shapes, clipped};
  });
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({problems: __problems, charts, title: document.title,
    scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth});
  document.body.appendChild(probe);
});
</script>"""


@pytest.fixture(scope="module")
def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on PATH (Debian: `apt-get install chromium`, which .ci/run tries): the HTML report was "
                "not opened in a browser")


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    # A profile directory per test: concurrent Chromiums on one machine would fight over the default one's lock.
    return subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", *args],
                          capture_output=True, text=True, timeout=180)


def _probe(browser: str, page_text: str, tmp_path: Path) -> dict:
    page = tmp_path / "probed.html"
    page.write_text(page_text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    run = _chromium(browser, tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                    "--dump-dom", page.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert found, f"Chromium printed no probe (exit {run.returncode}): {run.stderr[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    result["console"] = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return result


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _screenshot(browser: str, page: Path, png: Path) -> Path:
    run = _chromium(browser, page.parent / "profile", f"--screenshot={png}", page.as_uri())
    assert png.exists(), f"no screenshot (exit {run.returncode}): {run.stderr[-2000:]}"
    return png


@pytest.mark.parametrize("name", ["typical", "hostile"])
def test_report_renders_its_charts_without_errors(browser, tmp_path, name):
    seen = _probe(browser, render_html(optimize_results.ALL[name]()), tmp_path)
    assert seen["problems"] == [] and seen["console"] == []
    labels = [chart["label"] for chart in seen["charts"]]
    assert labels == ["step time per side", "speedup per patch", "time per op kind", "peak memory"]
    for chart in seen["charts"]:
        assert chart["width"] > 400 and chart["height"] > 60, chart  # laid out, not collapsed
        assert chart["shapes"] >= 4, chart  # bars, boxes, whiskers, grid lines actually drawn
        assert chart["clipped"] == [], chart  # every label inside its chart
    assert seen["scrollWidth"] <= seen["innerWidth"]  # no horizontal scrolling at a laptop width
    assert seen["title"].startswith("advisor optimize: ")


def test_report_screenshot_is_a_real_page(browser, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(optimize_results.typical()), encoding="utf-8")
    shot = _screenshot(browser, page, tmp_path / "report.png")
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    empty = _screenshot(browser, blank, tmp_path / "blank.png")
    assert _png_size(shot) == WINDOW
    # A page of text, tables and charts compresses far worse than a blank one of the same size.
    assert shot.stat().st_size > 10 * empty.stat().st_size, (shot.stat().st_size, empty.stat().st_size)


def test_probe_reports_errors_it_is_meant_to_catch(browser, tmp_path):
    """The checks above pass only because the report is clean, not because the probe is blind."""
    broken = ("<!DOCTYPE html><html><head></head><body><img src=\"missing.png\">"
              "<script>console.error('boom'); alert('hi'); notDefined();</script></body></html>")
    seen = _probe(browser, broken, tmp_path)
    problems = " ".join(seen["problems"])
    assert "boom" in problems and "alert: hi" in problems and "notDefined" in problems and "missing.png" in problems
    assert any("notDefined" in line for line in seen["console"])
