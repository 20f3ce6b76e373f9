"""The verbs' results as dataclasses: the fields are the top-level keys of each verb's JSON, in order, and
`to_json()` is the document the CLI prints (the CLI builds its JSON through these classes). Nested values stay
JSON (dicts and lists), except findings and errors of scan and fix, which are advisor.contracts.finding objects.
Importing this module is cheap: no torch, no libcst."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from advisor.contracts.finding import Finding, ScanError, as_text, display_path, joined


@dataclass
class ScanReport:
    """`advisor scan --format json`."""

    version: int
    files_scanned: int
    findings: list[Finding]
    errors: list[ScanError]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "files_scanned": self.files_scanned,
                "findings": [f.to_json() for f in self.findings], "errors": [e.to_json() for e in self.errors]}


@dataclass
class FileFix:
    """One file's fixes: the diff of what was (or, without apply, would be) written; `written` is the file written
    (a link's real target), None when nothing was written; `error` why a write failed; `problems` the chosen fixes
    left out (conflicts)."""

    path: str
    diff: str
    written: str | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"path": display_path(self.path), "diff": self.diff,
                "written": display_path(self.written) if self.written else None, "error": self.error,
                "problems": self.problems}


@dataclass
class FixReport:
    """What `advisor fix` did: the files it fixed (or would fix), the findings that remain (no fix chosen or
    applicable: unsafe without unsafe_fixes, declined, conflicting, or not written), and the scan's errors."""

    version: int
    files_scanned: int
    applied: bool  # `apply` was asked; what was written is each file's `written`
    files: list[FileFix]
    remaining: int
    errors: list[ScanError]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "files_scanned": self.files_scanned, "applied": self.applied,
                "files": [f.to_json() for f in self.files], "remaining": self.remaining,
                "errors": [e.to_json() for e in self.errors]}


class _FromDocument:
    """A result kept as the JSON document a worker built (profile, optimize): each top-level key is a field. A key
    the class does not list is a TypeError, never dropped (tests/cli/test_api.py runs both verbs to keep them in
    step)."""

    @classmethod
    def from_json(cls, document: dict[str, Any]):
        return cls(**document)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ProfileReport(_FromDocument):
    """`advisor profile --format json`: measured findings ranked by time, with the run's step time and shares."""

    version: int
    target: str
    device: str
    dtype: str
    mode: str
    steps: int
    step_us: float
    step_iqr_us: float
    op_us: float
    attributed_share: float
    statement_share: float
    graph_truncated: bool
    findings: list[dict]
    top_lines: list[dict]


@dataclass
class PatchVerdict:
    """One patch of `optimize`: where it is, its facts and diff, and what the run made of it (the verdict, parity,
    speedup and interval, whether it was applied). `diff_file` is set only when the report folder holds its diff,
    and only then is it a key of the JSON. Reading it as a mapping (`patch["verdict"]`) is kept for the Python API,
    whose patches were dicts. `reasons` (why it is not verified, or not written) is JSON's `reason`, one line."""

    id: str
    rule: str
    path: str
    line: int
    end_line: int | None
    function: str | None
    fix_safety: str
    facts: dict | None
    discharged: Any
    diff: str | None
    verdict: str
    verified: bool
    offered: bool
    exercised: bool | None
    parity: dict | None
    speedup: float | None
    speedup_ci: list[float] | None
    reasons: tuple[str, ...]
    applied: bool
    written_to: str | None
    state_dict: dict | None
    unsafe_facts_checked_on: str | None
    diff_file: str | None = None
    emission: dict | None = None  # --backend flash|flash-attn|flex: what was emitted, and whether its kernel ran

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> PatchVerdict:
        """From the JSON (the API's patches): its `reason` line is kept as one reason."""
        document = dict(document)
        reason = document.pop("reason")
        return cls(**document, reasons=() if reason is None else (reason,))

    @property
    def reason(self) -> str | None:
        return joined(self.reasons)

    def to_json(self) -> dict[str, Any]:
        document = {("reason" if f.name == "reasons" else f.name): getattr(self, f.name) for f in fields(self)}
        document["reason"] = self.reason
        if self.diff_file is None:
            del document["diff_file"]
        if self.emission is None:
            del document["emission"]
        return document

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]


@dataclass
class OptimizeReport(_FromDocument):
    """`advisor optimize --format json`: each patch's verdict (parity, speedup and interval), the combination's
    speedup, the profiles before and after, and where the report folder's files are."""

    version: int
    target: str
    environment: dict
    mode: str
    before: dict
    after: dict | None
    speedup: float | None
    speedup_ci: list[float] | None
    speedup_method: str
    patches: list[PatchVerdict]
    unpatched: list[dict]
    ops: dict
    findings_before: list[dict]
    findings_after: list[dict]
    traces: dict
    report: str | None
    state_dict: dict
    notes: list[str]
    apply_command: str | None = None

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> OptimizeReport:
        return cls(**{**document, "patches": [PatchVerdict.from_json(p) for p in document["patches"]]})

    def to_json(self) -> dict[str, Any]:  # a target's file name bytes that are not UTF-8 written `\\xNN`
        return {**super().to_json(), "target": as_text(self.target), "patches": [p.to_json() for p in self.patches]}
