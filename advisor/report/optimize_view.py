"""Format-neutral views of an `optimize` result (the JSON dict): numbers as text, the op diff, time per op kind and
the findings that went away. The console, Markdown and HTML renderers all read these, so the three always agree.

Every string that comes from the user's code or the profile (paths, op names, diffs, reasons) passes through
`printable` here; each renderer then escapes it for its own markup (rich, Markdown, HTML)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from advisor.report.terminal import printable, short_path
from advisor.runtime.trace_analysis import OP_KINDS, op_category

VERDICTS = {"verified": "verified", "parity-failed": "parity failed", "no-gain": "no measurable gain",
            "not-run": "not run"}
NONE = "—"
OP_COLUMNS = ("op", "kind", "count before", "count after", "time before", "time after", "change")
PATCH_COLUMNS = ("patch", "rule", "location", "verdict", "parity (max error, tolerance)", "speedup", "applied")

def duration(us: float | None) -> str:
    if us is None:
        return NONE
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    if abs(us) >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} us"


def size(num_bytes: float | None) -> str:
    if num_bytes is None:
        return NONE
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:g} B"


def ratio(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}x"


def interval(bounds: list[float] | None, fmt=ratio) -> str:
    return NONE if not bounds else f"{fmt(bounds[0])} to {fmt(bounds[1])}"


def speedup_text(value: float | None, bounds: list[float] | None, sep: str = " ") -> str:
    """`1.84x (CI 1.79x to 1.90x)`; the interval is the one `optimize` computed (see its `speedup_ci`)."""
    if value is None:
        return NONE
    return ratio(value) if not bounds else f"{ratio(value)}{sep}(CI {interval(bounds)})"


def sci(value: float | None) -> str:
    return NONE if value is None else f"{value:.1e}"


def number(value: float | None) -> str:
    return NONE if value is None else f"{value:g}"


def plural(count: object, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def location(patch: dict) -> str:
    start, end = patch.get("line"), patch.get("end_line")
    span = f"{start}" if end in (None, start) else f"{start}-{end}"
    return printable(f"{short_path(str(patch.get('path', '?')))}:{span}")


def verdict(patch: dict) -> str:
    return VERDICTS.get(patch.get("verdict"), printable(patch.get("verdict", "?")))


def parity_lines(parity: dict | None) -> list[str]:
    """Max errors against their tolerances, then what was compared; empty when parity was not run."""
    if not parity:
        return []
    if parity.get("elements") is not None:  # the test as torch.testing.assert_close words it, then the maxima
        mark = "FAIL" if parity.get("mismatched") else "pass"
        lines = [f"{mark}: {parity['mismatched']} of {parity['elements']} elements outside |diff| <= "
                 f"{sci(parity.get('atol_applied'))} + {number(parity.get('rtol'))} * |original|",
                 f"max abs {sci(parity.get('max_abs_err'))}, max rel {sci(parity.get('max_rel_err'))} "
                 f"(atol {number(parity.get('atol'))} scaled by the largest |original|)"]
    else:  # a result written before the applied tolerance was recorded
        lines = [f"abs {sci(parity.get('max_abs_err'))} (atol {number(parity.get('atol'))})",
                 f"rel {sci(parity.get('max_rel_err'))} (rtol {number(parity.get('rtol'))})"]
    compared = f"{plural(parity.get('seeds', '?'), 'seed')}, {plural(parity.get('outputs_compared', '?'), 'output')}"
    lines.append(compared + (" + grads" if parity.get("grads") else ""))
    if parity.get("not_compared"):
        lines.append("not compared: " + printable(", ".join(map(str, parity["not_compared"]))))
    masked = parity.get("fully_masked_rows")
    if masked:
        lines.append("fully masked rows: " + printable(", ".join(f"{k} {v}" for k, v in masked.items())))
    return lines


def outcome(patch: dict) -> str:
    """What happened to the user's file: applied, the diff written elsewhere (installed code), or left alone."""
    if patch.get("applied"):
        return "applied"
    if patch.get("written_to"):
        return "diff written to " + printable(short_path(str(patch["written_to"])))
    if patch.get("offered"):
        return "offered, not applied"
    return "not offered"


@dataclass(frozen=True)
class PatchRow:
    """One patch's cells as plain text (control characters made visible); each renderer adds its own markup."""

    id: str
    rule: str
    safety: str  # the label beside the rule: "unsafe fix", "verified on this workload; assumes: ...", or ""
    location: str
    function: str
    verdict: str
    reason: str
    parity: list[str]
    speedup: str
    outcome: str


def patch_row(patch: dict, sep: str = " ") -> PatchRow:
    """`sep` goes between a speedup and its interval (a newline where the column is narrow)."""
    return PatchRow(id=printable(patch.get("id", "?")), rule=printable(patch.get("rule", "?")),
                    safety=safety_label(patch), location=location(patch),
                    function=printable(patch.get("function") or ""), verdict=verdict(patch),
                    reason=printable(patch.get("reason") or ""), parity=parity_lines(patch.get("parity")),
                    speedup=speedup_text(patch.get("speedup"), patch.get("speedup_ci"), sep), outcome=outcome(patch))


# what a backend's patch runs where its kernel does not: the flex patch's eager path materialises the scores
FALLBACKS = {"flex": "eager fallback (the scores materialised)"}


def safety_label(patch: dict) -> str:
    """A patch the run's observations let `optimize` try without --unsafe-fixes is labelled apart from an unsafe
    fix: what it was verified on and what it still assumes."""
    if patch.get("discharged") == "observed":
        held = "; ".join(str(fact.get("statement", "?")) for fact in (patch.get("facts") or {}).get("observed") or [])
        state = "verified on this workload" if patch.get("verified") else "held on every call of this workload"
        return printable(f"{state}; assumes: {held}")
    label = "unsafe fix" if patch.get("fix_safety") != "safe" else ""
    emission = patch.get("emission") or {}
    if emission.get("kernel_ran") is False:  # parity and speed are the fallback's, not the backend's
        fallback = (f"the {emission.get('emitted')} kernel did not run on this {emission.get('device', '?')} run: "
                    f"parity and speed are its {FALLBACKS.get(emission.get('emitted'), 'SDPA fallback')}'s")
        label = f"{label}; {fallback}" if label else fallback
    return printable(label)


def assumed_facts(patch: dict) -> list[str]:
    """The facts the static proof left open that this run checked on the user's inputs (--unsafe-fixes), and
    those it saw hold on every call (observed)."""
    facts = patch.get("facts") or {}
    return [printable(f"{fact.get('name', '?')}: {fact.get('statement', '')}" + (" (held on every call)" if
                                                                                 group == "observed" else ""))
            for group in ("assumed", "observed") for fact in facts.get(group) or []]


def facts_heading(patch: dict) -> str:
    inputs = patch.get("unsafe_facts_checked_on") or "this run's inputs"
    return printable(f"Facts the proof left open, checked on {inputs}:")


def patch_title(patch: dict) -> str:
    return printable(f"{patch.get('id', '?')}: {patch.get('rule', '?')} at {location(patch)}")


def count_verdicts(result: dict) -> str:
    counts: dict[str, int] = defaultdict(int)
    for patch in result.get("patches") or []:
        counts[verdict(patch)] += 1
    return ", ".join(f"{n} {label}" for label, n in counts.items()) or "no patches"


def headline(result: dict) -> str:
    """One line for a title: the overall speedup, or why there is none; then the measured findings not patched."""
    if result.get("after") and result.get("speedup") is not None:
        line = f"{speedup_text(result['speedup'], result.get('speedup_ci'))} faster with the verified patches"
    elif not result.get("patches"):
        line = "nothing to patch"
    else:
        line = "no verified patch"
    found = result.get("unpatched") or []
    if found:
        line += f"; {plural(len(found), 'measured finding')} not patched (largest {percent(found[0].get('share'))} " \
                "of op time)"
    return line


def percent(value: float | None) -> str:
    return NONE if value is None else f"{value:.1%}"


UNPATCHED_TITLE = "Found, not patched"
UNPATCHED_COLUMNS = ("rule", "location", "function", "share of op time", "why no patch ran")


def unpatched_rows(result: dict) -> list[tuple[str, str, str, str, str]]:
    """The measured findings no patch ran for (optimize's `unpatched`), largest share first, as plain text."""
    rows = []
    for entry in result.get("unpatched") or []:
        rule = entry.get("rule", "?") + (f" ({entry['static_rule']})" if entry.get("static_rule") else "")
        why = entry.get("reason") or ""
        if entry.get("patch"):
            why = f"patch {entry['patch']}: {why}"
        rows.append((printable(rule), location(entry), printable(entry.get("function") or ""),
                     percent(entry.get("share")), printable(why)))
    return rows


def summary_rows(result: dict) -> list[tuple[str, str, str]]:
    """(measure, before, after) rows for the summary tables."""
    before, after = result.get("before") or {}, result.get("after") or {}
    return [("step time (median)", duration(before.get("median_us")), duration(after.get("median_us"))),
            ("spread (IQR)", duration(before.get("iqr_us")), duration(after.get("iqr_us"))),
            ("median CI", interval(before.get("ci_us"), duration), interval(after.get("ci_us"), duration)),
            ("peak memory", size(before.get("peak_bytes")), size(after.get("peak_bytes"))),
            ("samples", str(len(before.get("samples_us") or [])) if before else NONE,
             str(len(after.get("samples_us") or [])) if after else NONE)]


def environment_rows(result: dict) -> list[tuple[str, str]]:
    env = result.get("environment") or {}
    kernels = env.get("sdpa_kernels") or {}
    rows = [(key, printable(env.get(key, NONE))) for key in ("torch", "python", "device", "dtype", "threads")]
    if env.get("autocast"):
        rows.append(("autocast", printable(env["autocast"])))
    if result.get("mode"):
        rows.append(("mode", printable(result["mode"])))
    if env.get("peak_memory_method"):
        rows.append(("peak memory from", printable(env["peak_memory_method"])))
    for side in ("before", "after"):
        names = kernels.get(side)
        rows.append((f"SDPA kernels {side}", printable(", ".join(names)) if names else "none"))
    return rows


def notes(result: dict) -> list[str]:
    """Things a reviewer must see that fit no table: how the speedup interval is computed, the run's own notes,
    state_dict key mismatches (all patches together, then per patch), where traces and the report are."""
    lines = [printable(f"speedup interval: {result['speedup_method']}")] if result.get("speedup_method") else []
    lines.extend(printable(note) for note in result.get("notes") or [])
    owners = [("the patched side", result.get("state_dict"))]
    owners += [(f"patch {p.get('id', '?')}", p.get("state_dict")) for p in result.get("patches") or []]
    for owner, state in owners:
        for key in ("missing", "unexpected"):
            if (state or {}).get(key):
                lines.append(printable(f"state_dict keys {key} on {owner}: {', '.join(map(str, state[key]))}"))
    if result.get("apply_command"):
        lines.append(printable(f"apply the verified patches: {result['apply_command']}"))
    for patch in result.get("patches") or []:
        if patch.get("diff_file"):
            lines.append(printable(f"{patch.get('id', '?')} diff: {patch['diff_file']}"))
    traces = result.get("traces") or {}
    for side in ("before", "after"):
        if traces.get(side):
            lines.append(printable(f"trace {side}: {traces[side]}"))
    if result.get("report"):
        lines.append(printable(f"report: {result['report']}"))
    return lines


@dataclass(frozen=True)
class OpDelta:
    """One op in the before/after diff; the `after` fields are None when the patched side never ran."""

    op: str
    kind: str
    count_before: float
    us_before: float
    count_after: float | None
    us_after: float | None

    @property
    def status(self) -> str:
        if self.us_after is None:
            return ""
        if not self.count_before and not self.us_before:
            return "added"
        if not self.count_after and not self.us_after:
            return "removed"
        return ""

    @property
    def delta_us(self) -> float | None:
        return None if self.us_after is None else self.us_after - self.us_before

    @property
    def delta_text(self) -> str:
        if self.us_after is None:
            return NONE
        return ("+" if self.us_after > self.us_before else "") + duration(self.us_after - self.us_before)

    def numbers(self) -> tuple[str, str, str, str, str]:
        """The cells after `op` and `kind` in OP_COLUMNS."""
        return (f"{self.count_before:g}", NONE if self.count_after is None else f"{self.count_after:g}",
                duration(self.us_before), duration(self.us_after), self.delta_text)


def op_diff(result: dict) -> list[OpDelta]:
    """Every op on either side, the biggest change in time first (added and removed ops included)."""
    ops = result.get("ops") or {}
    before = {row["op"]: row for row in ops.get("before") or []}
    after_rows = ops.get("after") if result.get("after") is not None else None
    after = {row["op"]: row for row in after_rows or []}
    names = list(before) + [name for name in after if name not in before]
    deltas = []
    for name in names:
        b = before.get(name, {})
        a = after.get(name, {}) if after_rows is not None else None
        deltas.append(OpDelta(
            op=printable(name), kind=op_category(str(name)), count_before=b.get("count", 0), us_before=b.get("us", 0.0),
            count_after=None if a is None else a.get("count", 0), us_after=None if a is None else a.get("us", 0.0)))
    return sorted(deltas, key=lambda d: (-abs(d.delta_us or 0.0), -max(d.us_before, d.us_after or 0.0), d.op))


def time_by_kind(result: dict) -> list[tuple[str, float, float | None]]:
    """(kind, us before, us after) for each op kind that took time on either side, in OP_KINDS order."""
    totals: dict[str, list[float]] = {kind: [0.0, 0.0] for kind in OP_KINDS}
    deltas = op_diff(result)
    for delta in deltas:
        totals[delta.kind][0] += delta.us_before
        totals[delta.kind][1] += delta.us_after or 0.0
    has_after = any(delta.us_after is not None for delta in deltas)
    return [(kind, b, a if has_after else None) for kind, (b, a) in totals.items() if b or a]


FINDING_COLUMNS = ("rule", "location", "function", "now", "what it is")


def findings_diff(result: dict) -> list[tuple[str, str, str, str, str]]:
    """(rule, location, function, gone|remains|new, explanation) per finding, matched on rule, file and function
    (the patch moves line numbers); a new finding is explained by its message. Empty when the patched side was
    never profiled."""
    if result.get("after") is None:
        return []

    def key(finding: dict) -> tuple[str, str, str]:
        return (printable(finding.get("rule", "?")), printable(short_path(str(finding.get("path", "?")))),
                printable(finding.get("function", "?")))

    before = {key(f): f for f in result.get("findings_before") or []}
    after = {key(f): f for f in result.get("findings_after") or []}
    rows = []
    for k, finding in before.items():
        rows.append((k[0], f"{k[1]}:{finding.get('line', '?')}", k[2], "remains" if k in after else "gone", ""))
    for k, finding in after.items():
        if k not in before:
            why = printable(f"found in the patched code: {finding.get('message') or 'see the rule'}")
            rows.append((k[0], f"{k[1]}:{finding.get('line', '?')}", k[2], "new", why))
    return rows
