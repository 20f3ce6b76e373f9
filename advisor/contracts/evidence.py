"""Runtime evidence for copy/cast fixes, keyed by source line: what the profiler's detectors found there, how
many watched calls ran there in the recorded step, and whether any op there wrote a tensor in place; and for
attention rewrites, what each recorded call of a block saw (facts from the run).

A detection says "this call was redundant"; a fix needs "every call on this line was", so the detections are
counted against the calls that ran. Lines are joined to source as `scan --profile` joins them: same realpath,
same line."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace

from advisor.contracts.finding import Finding


@dataclass(frozen=True)
class RuntimeHit:
    """One runtime finding on a line: its rule, cost and evidence."""

    rule: str
    line: int
    end_line: int
    calls: int
    function: str
    message: str
    extra: dict

    @classmethod
    def of(cls, finding: Finding) -> "RuntimeHit":
        keep = {k: finding.extra[k] for k in ("self_us", "share", "calls", "evidence") if k in finding.extra}
        return cls(finding.rule, finding.line, finding.end_line, finding.extra.get("calls", 0), finding.function,
                   finding.message, keep)


@dataclass(frozen=True)
class MaskSeen:
    """A tensor that masked the scores in one recorded call: how it was applied ("fill" for masked_fill/where,
    "additive" for an added or subtracted tensor), its dtype, its number of dims, and whether broadcasting it made
    the scores bigger."""

    how: str
    dtype: str
    ndim: int
    grew: bool = False


@dataclass(frozen=True)
class BlockCall:
    """What one call of a hand-written attention block saw at run time (advisor.runtime.block_facts): the score
    product's line and the value product's, the dtypes of q, k and v as they entered the block, the masks, whether
    a scale factor was a tensor, and how many query rows were fully masked (None: unknown)."""

    path: str  # realpath
    line: int
    end_line: int
    query: str
    key: str
    value: str
    scores_ndim: int
    masks: tuple[MaskSeen, ...] = ()
    tensor_scale: bool = False
    fully_masked_rows: int | None = None
    kv_lengths_agree: bool | None = None  # v had as many rows as there were keys (None: not read)
    batches_agree: bool | None = None  # q, k and v had one batch size, their first (None: not read)

    def to_json(self) -> dict:
        return {"query": self.query, "key": self.key, "value": self.value, "scores_ndim": self.scores_ndim,
                "masks": [{"how": m.how, "dtype": m.dtype, "ndim": m.ndim, "grew": m.grew} for m in self.masks],
                "scale": "tensor" if self.tensor_scale else "number", "fully_masked_rows": self.fully_masked_rows,
                "kv_lengths_agree": self.kv_lengths_agree, "batches_agree": self.batches_agree}


@dataclass
class FileEvidence:
    """What the profile saw in one file (picklable: it travels to scan worker processes)."""

    hits: dict[int, list[RuntimeHit]] = field(default_factory=dict)  # line -> runtime findings there
    observed: Counter = field(default_factory=Counter)  # (line, call name) -> watched calls that ran there
    mutating_lines: frozenset[int] = frozenset()  # lines where an op wrote a tensor in place
    blocks: list[BlockCall] = field(default_factory=list)  # every recorded call of an attention block here

    def hit(self, line: int, rule: str) -> RuntimeHit | None:
        return next((h for h in self.hits.get(line, ()) if h.rule == rule), None)

    def calls(self, line: int, *rules: str) -> int:
        return sum(h.calls for h in self.hits.get(line, ()) if h.rule in rules)


@dataclass
class RuntimeEvidence:
    target: str
    files: dict[str, FileEvidence] = field(default_factory=dict)  # realpath -> evidence

    def for_path(self, path: str) -> FileEvidence | None:
        return self.files.get(os.path.realpath(path))


def measured_lines(evidence: RuntimeEvidence | None) -> RuntimeEvidence | None:
    """A profile's evidence without the attention blocks' calls it saw: its copy/cast hits by line, which
    `optimize` joins to the source as `fix --profile` does, while facts from the run come only from the calls
    recorded on every parity input (`with_blocks`)."""
    if evidence is None:
        return None
    return RuntimeEvidence(evidence.target, {path: replace(found, blocks=[]) for path, found in evidence.files.items()})


def with_blocks(evidence: RuntimeEvidence | None, observed: RuntimeEvidence) -> RuntimeEvidence:
    """`evidence` (a profile's `measured_lines`) with the attention blocks' calls `observed` recorded in place of
    any it holds, as one value an analysis reads; neither is changed."""
    files = dict(evidence.files) if evidence is not None else {}
    for path, found in observed.files.items():
        mine = files.get(path)
        files[path] = found if mine is None else replace(mine, blocks=list(found.blocks))
    return RuntimeEvidence(observed.target if evidence is None else evidence.target, files)


def add_block_calls(evidence: RuntimeEvidence, calls: list[BlockCall]) -> None:
    """What each recorded call of an attention block saw, by file (facts from the run, see `fixes.observed`)."""
    for call in calls:
        evidence.files.setdefault(call.path, FileEvidence()).blocks.append(call)
