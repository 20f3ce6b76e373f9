"""Small inline-SVG charts for the HTML report: horizontal bars with optional whiskers, box plots from samples, and
estimates with intervals against a reference line. Plain SVG strings, no JavaScript, fonts or network, so the
report stays one self-contained file; every label goes through html.escape."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from html import escape
from typing import Callable

WIDTH = 600
GUTTER = 170  # left column for row labels
RIGHT = 90  # room for the value printed after a bar
LEGEND_H = 26
AXIS_H = 26
BAR_H = 16
ROW_GAP = 10
LABEL_CHARS = 24  # longer row labels are cut; the full text is in a <title> tooltip

Format = Callable[[float], str]


@dataclass(frozen=True)
class Bar:
    series: str
    value: float
    low: float | None = None  # whisker ends, when the value has a spread or an interval
    high: float | None = None


@dataclass(frozen=True)
class Box:
    label: str
    series: str
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Estimate:
    label: str
    value: float
    low: float | None
    high: float | None
    color: str


@dataclass(frozen=True)
class _Axis:
    lo: float
    hi: float

    def x(self, value: float) -> float:
        return GUTTER + (value - self.lo) / (self.hi - self.lo) * (WIDTH - GUTTER - RIGHT)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) whose range covers [lo, hi]."""
    span = (hi - lo) or abs(hi) or 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, max(last, first + 1) + 1)]


def bar_chart(title: str, groups: list[tuple[str, list[Bar]]], colors: dict[str, str], fmt: Format) -> str:
    """One row per bar, bars grouped under their group's label; the axis starts at zero."""
    top = max((b.high if b.high is not None else b.value) for _, bars in groups for b in bars) if groups else 1.0
    ticks = nice_ticks(0.0, top or 1.0)
    axis = _Axis(0.0, ticks[-1])
    parts, y = [], LEGEND_H
    for label, bars in groups:
        height = len(bars) * (BAR_H + 2)
        parts.append(_row_label(label, y + height / 2))
        for bar in bars:
            color = colors[bar.series]
            width = max(axis.x(bar.value) - GUTTER, 0.5)
            parts.append(f'<rect x="{GUTTER}" y="{y:.1f}" width="{width:.1f}" height="{BAR_H}" fill="{color}" rx="2">'
                         f'<title>{escape(f"{label} {bar.series}: {fmt(bar.value)}")}</title></rect>')
            end = axis.x(bar.value)
            if bar.low is not None and bar.high is not None:
                parts.append(_whisker(axis.x(bar.low), axis.x(bar.high), y + BAR_H / 2))
                end = max(end, axis.x(bar.high))
            parts.append(_text(end + 5, y + BAR_H - 4, fmt(bar.value), css="value"))
            y += BAR_H + 2
        y += ROW_GAP
    return _svg(title, y, _legend(colors) + _grid(axis, ticks, LEGEND_H - 4, y, fmt) + "".join(parts))


def box_chart(title: str, boxes: list[Box], colors: dict[str, str], fmt: Format) -> str:
    """Tukey boxes: quartiles, median line, whiskers to the furthest sample within 1.5 IQR, outliers as dots.
    The axis starts at zero so the two sides compare by length."""
    top = max(max(box.samples) for box in boxes)
    ticks = nice_ticks(0.0, top)
    axis = _Axis(0.0, ticks[-1])
    parts, y = [], LEGEND_H
    height = BAR_H + 12
    for box in boxes:
        q1, median, q3 = statistics.quantiles(box.samples, n=4, method="inclusive")
        fence_lo, fence_hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
        inside = [s for s in box.samples if fence_lo <= s <= fence_hi]
        mid, color = y + height / 2, colors[box.series]
        parts.append(_row_label(box.label, mid))
        parts.append(_whisker(axis.x(min(inside)), axis.x(max(inside)), mid))
        tip = f"{box.label}: median {fmt(median)}, IQR {fmt(q1)} to {fmt(q3)}, {len(box.samples)} samples"
        parts.append(f'<rect x="{axis.x(q1):.1f}" y="{y:.1f}" width="{max(axis.x(q3) - axis.x(q1), 1):.1f}" '
                     f'height="{height}" fill="{color}" fill-opacity="0.35" stroke="{color}" stroke-width="1.5">'
                     f'<title>{escape(tip)}</title></rect>')
        parts.append(f'<line x1="{axis.x(median):.1f}" x2="{axis.x(median):.1f}" y1="{y:.1f}" y2="{y + height:.1f}" '
                     f'stroke="#1d2330" stroke-width="2.5"/>')  # dark: visible on the light box of either side
        parts.extend(f'<circle cx="{axis.x(s):.1f}" cy="{mid:.1f}" r="2.5" fill="none" stroke="{color}"/>'
                     for s in box.samples if s < fence_lo or s > fence_hi)
        parts.append(_text(axis.x(max(max(inside), q3)) + 8, mid + 4, fmt(median), css="value"))
        y += height + ROW_GAP
    return _svg(title, y, _legend(colors) + _grid(axis, ticks, LEGEND_H - 4, y, fmt) + "".join(parts))


def interval_chart(title: str, estimates: list[Estimate], reference: float, fmt: Format) -> str:
    """A dot per estimate with its interval as error bars, and a dashed line at `reference` (no change)."""
    values = [reference] + [v for e in estimates for v in (e.value, e.low, e.high) if v is not None]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or 0.1
    ticks = nice_ticks(lo - pad, hi + pad)
    axis = _Axis(ticks[0], ticks[-1])
    parts, y = [], LEGEND_H
    for estimate in estimates:
        mid = y + BAR_H / 2
        parts.append(_row_label(estimate.label, mid))
        if estimate.low is not None and estimate.high is not None:
            parts.append(_whisker(axis.x(estimate.low), axis.x(estimate.high), mid, estimate.color))
        tip = f"{estimate.label}: {fmt(estimate.value)}"
        if estimate.low is not None and estimate.high is not None:
            tip += f" ({fmt(estimate.low)} to {fmt(estimate.high)})"
        parts.append(f'<circle cx="{axis.x(estimate.value):.1f}" cy="{mid:.1f}" r="5" fill="{estimate.color}">'
                     f'<title>{escape(tip)}</title></circle>')
        right = axis.x(estimate.high if estimate.high is not None else estimate.value)
        parts.append(_text(right + 8, mid + 4, fmt(estimate.value), css="value"))
        y += BAR_H + ROW_GAP
    ref = axis.x(reference)
    parts.append(f'<line x1="{ref:.1f}" x2="{ref:.1f}" y1="{LEGEND_H - 8}" y2="{y:.1f}" stroke="#444" '
                 'stroke-dasharray="4 3"/>')
    parts.append(_text(ref, LEGEND_H - 12, f"{fmt(reference)} = no change", anchor="middle", css="note"))
    return _svg(title, y, _grid(axis, ticks, LEGEND_H - 4, y, fmt) + "".join(parts))


def _svg(title: str, body_bottom: float, body: str) -> str:
    height = body_bottom + AXIS_H
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height:.0f}" '
            f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>{body}</svg>')


def _text(x: float, y: float, text: str, anchor: str = "start", css: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{css}">{escape(text)}</text>'


def _row_label(label: str, mid: float) -> str:
    shown = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "\u2026"
    return (f'<g><title>{escape(label)}</title>'
            + _text(GUTTER - 8, mid + 4, shown, anchor="end", css="label") + "</g>")


def _whisker(x1: float, x2: float, mid: float, color: str = "#333") -> str:
    cap = 5
    return (f'<path d="M{x1:.1f} {mid:.1f}H{x2:.1f}M{x1:.1f} {mid - cap:.1f}V{mid + cap:.1f}'
            f'M{x2:.1f} {mid - cap:.1f}V{mid + cap:.1f}" stroke="{color}" stroke-width="1.5" fill="none"/>')


def _grid(axis: _Axis, ticks: list[float], y_top: float, y_bottom: float, fmt: Format) -> str:
    lines = []
    for tick in ticks:
        x = axis.x(tick)
        lines.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y_top:.1f}" y2="{y_bottom:.1f}" class="grid"/>')
        lines.append(_text(x, y_bottom + 16, fmt(tick), anchor="middle", css="tick"))
    return "".join(lines)


def _legend(colors: dict[str, str]) -> str:
    parts, x = [], GUTTER
    for name, color in colors.items():
        parts.append(f'<rect x="{x}" y="4" width="12" height="12" fill="{color}" rx="2"/>')
        parts.append(_text(x + 17, 14, name, css="legend"))
        x += 30 + 8 * len(name)
    return "".join(parts)
