"""The `optimize` report as one self-contained HTML file: inline CSS and inline SVG charts, no script, font or
network access, so it opens from a CI artifact or an e-mail as it is. Every piece of text goes through
html.escape."""

from __future__ import annotations

import math
import os
from html import escape

from advisor.report import optimize_view as view
from advisor.report.svg_charts import Bar, Box, Estimate, bar_chart, box_chart, interval_chart

BEFORE, AFTER = "#97a3b6", "#2563c9"
SIDES = {"before": BEFORE, "after": AFTER}
VERDICT_COLORS = {"verified": "#1b8a4a", "parity-failed": "#c0392b", "no-gain": "#b7791f", "not-run": "#7b7b7b"}
MIN_BOX_SAMPLES = 5  # below this a box plot says nothing; the chart falls back to the median with its interval
OP_ROWS = 40


def render_html(result: dict) -> str:
    title = f"advisor optimize: {view.printable(result.get('target', '?'))}"
    body = "".join([
        f"<header><h1>{escape(title)}</h1><p class=\"headline {'gain' if result.get('after') else ''}\">"
        f"{escape(view.headline(result))}</p></header>",
        _summary(result), _charts(result), _patches(result), _unpatched(result), _findings(result), _ops(result),
        _environment(result)])
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n")


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]], css: str = "") -> str:
    """Cells are HTML already (escaped by the caller); column names are escaped here."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _lines(lines: list[str]) -> str:
    return "<br>".join(escape(line) for line in lines)


def _summary(result: dict) -> str:
    rows = [(escape(measure), escape(before), escape(after)) for measure, before, after in view.summary_rows(result)]
    speedup = escape(view.speedup_text(result.get("speedup"), result.get("speedup_ci")))
    rows.append(("<b>speedup</b>", "", f"<b>{speedup}</b>"))
    rows.append(("patches", escape(view.count_verdicts(result)), ""))
    notes = "".join(f"<li>{escape(note)}</li>" for note in view.notes(result))
    return (f"<section><h2>Summary</h2>{_table(('', 'before', 'after'), rows, 'summary')}"
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</section>")


def _charts(result: dict) -> str:
    figures = [_step_time(result), _speedups(result), _kinds(result), _memory(result)]  # short charts first: rows align
    return '<section><h2>Charts</h2><div class="charts">' + "".join(f for f in figures if f) + "</div></section>"


def _figure(caption: str, svg: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _sides(result: dict) -> list[tuple[str, dict]]:
    return [(name, result[name]) for name in SIDES if result.get(name)]


def _finite(value: object) -> bool:
    """Charts draw only finite numbers: a NaN or inf (a failed run) is in the tables, never on an axis."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def _bounds(pair: list[float] | None) -> tuple[float | None, float | None]:
    return (pair[0], pair[1]) if pair and len(pair) == 2 and all(map(_finite, pair)) else (None, None)


def _step_time(result: dict) -> str:
    samples = {name: [t for t in side.get("samples_us") or [] if _finite(t)] for name, side in _sides(result)}
    if samples and all(len(s) >= MIN_BOX_SAMPLES for s in samples.values()):
        counts = " and ".join(f"{len(s)} {name}" for name, s in samples.items())
        return _figure(f"Step time: box = interquartile range, thick line = median, whiskers = 1.5 IQR, "
                       f"dots = outliers ({counts} samples).",
                       box_chart("step time per side", [Box(name, name, tuple(s)) for name, s in samples.items()],
                                 {name: SIDES[name] for name in samples}, view.duration))
    bars = [Bar(name, side["median_us"], *_bounds(side.get("ci_us"))) for name, side in _sides(result)
            if _finite(side.get("median_us"))]
    if not bars:
        return ""
    return _figure("Step time: median, whiskers = the median's confidence interval (too few samples for a box).",
                   bar_chart("median step time per side", [("step time", bars)],
                             {bar.series: SIDES[bar.series] for bar in bars}, view.duration))


def _kinds(result: dict) -> str:
    rows = [row for row in view.time_by_kind(result) if _finite(row[1]) and (row[2] is None or _finite(row[2]))]
    if not rows:
        return ""
    groups = [(kind, [Bar("before", before)] + ([] if after is None else [Bar("after", after)]))
              for kind, before, after in rows]
    colors = SIDES if rows[0][2] is not None else {"before": BEFORE}
    return _figure("Time per op kind (self time, from the profiles of each side).",
                   bar_chart("time per op kind", groups, colors, view.duration))


def _speedups(result: dict) -> str:
    estimates = [Estimate(view.printable(f"{p.get('id', '?')} {os.path.basename(str(p.get('path')))}:{p.get('line')}"),
                          p["speedup"], *_bounds(p.get("speedup_ci")), VERDICT_COLORS.get(p.get("verdict"), "#555"))
                 for p in result.get("patches") or [] if _finite(p.get("speedup"))]
    if _finite(result.get("speedup")):
        estimates.append(Estimate("all verified", result["speedup"], *_bounds(result.get("speedup_ci")), AFTER))
    if not estimates:
        return ""
    return _figure("Speedup per patch with its confidence interval; a patch is faster only when its interval "
                   "clears the dashed line. Colour = verdict.",
                   interval_chart("speedup per patch", estimates, 1.0, view.ratio))


def _memory(result: dict) -> str:
    peaks = {name: side["peak_bytes"] for name, side in _sides(result) if _finite(side.get("peak_bytes"))}
    if not peaks:
        return ""
    # Chart in the unit of the larger side so the axis ticks are round numbers of that unit.
    unit, scale = next(((u, s) for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
                        if max(peaks.values()) >= s), ("B", 1))
    bars = [Bar(name, peak / scale) for name, peak in peaks.items()]
    colors = {name: SIDES[name] for name in peaks}
    return _figure("Peak memory per side.",
                   bar_chart("peak memory", [("peak memory", bars)], colors, lambda v: f"{v:.3g} {unit}"))


def _badge(patch: dict) -> str:
    color = VERDICT_COLORS.get(patch.get("verdict"), "#555")
    return f'<span class="badge" style="background:{color}">{escape(view.verdict(patch))}</span>'


def _patches(result: dict) -> str:
    patches = result.get("patches") or []
    if not patches:
        return "<section><h2>Patches</h2><p>No finding had a patch to verify.</p></section>"
    rows = []
    for patch in patches:
        row = view.patch_row(patch)
        reason = f'<div class="dim">{escape(row.reason)}</div>' if row.reason else ""
        safety = f'<div class="dim">{escape(row.safety)}</div>' if row.safety else ""
        rows.append((escape(row.id), escape(row.rule) + safety,
                     f'<code>{escape(row.location)}</code><div class="dim">{escape(row.function)}</div>',
                     _badge(patch) + reason, _lines(row.parity) or view.NONE, escape(row.speedup), escape(row.outcome)))
    table = _table(view.PATCH_COLUMNS, rows, "patches")
    diffs = "".join(_diff_block(patch) for patch in patches if patch.get("diff"))
    return f"<section><h2>Patches</h2>{table}{diffs}</section>"


def _diff_block(patch: dict) -> str:
    facts = "".join(f"<li>{escape(fact)}</li>" for fact in view.assumed_facts(patch))
    checked = f"<p>{escape(view.facts_heading(patch))}</p><ul>{facts}</ul>" if facts else ""
    open_ = " open" if patch.get("verified") else ""
    return (f"<details{open_}><summary>{escape(view.patch_title(patch))} {_badge(patch)}</summary>{checked}"
            f'<pre class="diff">{_diff_lines(patch["diff"])}</pre></details>')


def _diff_lines(diff: str) -> str:
    lines = []
    for line in view.printable(diff).splitlines():
        css = ("meta" if line.startswith(("+++", "---")) else "hunk" if line.startswith("@@")
               else "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
        lines.append(f'<span class="{css}">{escape(line) or " "}</span>')
    return "".join(lines)  # each line is a block; a newline between them would render as an empty line


def _unpatched(result: dict) -> str:
    rows = [(escape(rule), f"<code>{escape(where)}</code>", escape(function), escape(share), escape(why))
            for rule, where, function, share, why in view.unpatched_rows(result)]
    if not rows:
        return ""
    return f"<section><h2>{escape(view.UNPATCHED_TITLE)}</h2>{_table(view.UNPATCHED_COLUMNS, rows)}</section>"


def _findings(result: dict) -> str:
    rows = [(escape(rule), f"<code>{escape(where)}</code>", escape(function), f'<span class="change {to}">{to}</span>',
             escape(why)) for rule, where, function, to, why in view.findings_diff(result)]
    if not rows:
        return ""
    table = _table(view.FINDING_COLUMNS, rows)
    return f"<section><h2>Findings before and after</h2>{table}</section>"


def _ops(result: dict) -> str:
    deltas = view.op_diff(result)
    if not deltas:
        return ""
    rows = []
    for delta in deltas[:OP_ROWS]:
        tag = f' <span class="change {delta.status}">{delta.status}</span>' if delta.status else ""
        rows.append((f"<code>{escape(delta.op)}</code>{tag}", escape(delta.kind), *map(escape, delta.numbers())))
    more = f"<p class=\"dim\">{len(deltas) - OP_ROWS} smaller changes not shown.</p>" if len(deltas) > OP_ROWS else ""
    table = _table(view.OP_COLUMNS, rows, "ops")
    return f"<section><h2>Ops before and after</h2>{table}{more}</section>"


def _environment(result: dict) -> str:
    rows = [(escape(key), f"<code>{escape(value)}</code>") for key, value in view.environment_rows(result)]
    return f"<section><h2>Environment</h2>{_table(('', ''), rows, 'env')}</section>"


_CSS = """
:root{--fg:#1d2330;--dim:#667085;--line:#e3e7ee;--bg:#fff;--panel:#f7f8fb}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:22px;margin:0 0 4px;overflow-wrap:anywhere}
h2{font-size:17px;margin:28px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
.headline{font-size:16px;margin:0;color:var(--dim);font-weight:600}
.headline.gain{color:#1b8a4a}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{text-align:left;vertical-align:top;padding:6px 10px;border-bottom:1px solid var(--line);overflow-wrap:break-word}
th{background:var(--panel);font-weight:600;font-size:13px}
table.summary,table.env{width:auto;min-width:420px}
table.summary td:nth-child(n+2){text-align:right;font-variant-numeric:tabular-nums}
table.patches td:nth-child(2),table.patches th{white-space:nowrap}
table.ops td:nth-child(n+3){text-align:right;font-variant-numeric:tabular-nums}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
.dim,.notes{color:var(--dim);font-size:12.5px}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600;
white-space:nowrap}
.change{font-size:11.5px;font-weight:600;border-radius:8px;padding:0 6px}
.change.added,.change.gone{background:#dff3e6;color:#17693a}
.change.removed,.change.new{background:#fbe3e1;color:#9b2c22}
.change.remains{background:#fdf1d8;color:#8a5a0b}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:18px;align-items:start}
figure{margin:0;padding:12px;border:1px solid var(--line);border-radius:8px;background:var(--bg)}
figcaption{color:var(--dim);font-size:12.5px;margin-top:6px}
svg.chart{width:100%;height:auto;display:block}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;font-size:13px;fill:var(--fg)}
svg text.tick,svg text.note{font-size:12px;fill:var(--dim)}
svg text.value{font-size:12.5px;font-weight:600}
svg line.grid{stroke:var(--line);stroke-width:1}
details{margin:10px 0;border:1px solid var(--line);border-radius:8px;background:var(--panel)}
summary{cursor:pointer;padding:8px 12px;font-weight:600;overflow-wrap:anywhere}
pre.diff{margin:0;padding:10px 0;background:#fbfcfe;border-top:1px solid var(--line);overflow-x:auto}
pre.diff span{display:block;padding:0 12px;white-space:pre}
pre.diff .add{background:#e6f6ea;color:#135d2f}
pre.diff .del{background:#fdecea;color:#8f2219}
pre.diff .hunk{color:#5b4bb7;background:#f1effc}
pre.diff .meta{color:var(--dim);font-weight:600}
"""
