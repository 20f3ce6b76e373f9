"""What a static detector reads (StaticContext) and returns (Detected). The types it names live in the layers
above and are imported for type checking only: a contract must not load the engines that fill it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from advisor.contracts.finding import Finding

if TYPE_CHECKING:
    from advisor.contracts.evidence import FileEvidence
    from advisor.rewrite.apply import NodeEdits
    from advisor.rewrite.splice import Edit
    from advisor.static.module_index import ParsedModule
    from advisor.static.tree_facts import TreeContext


@dataclass
class Detected:
    """What a rule family's static detector returns per finding: the finding (no patch yet), its fix as node
    edits (None: no fix), and that fix alone as character edits (checked to compile; its patch is their diff)."""

    finding: Finding
    fix: NodeEdits | None = None
    edits: list[Edit] | None = None


@dataclass
class StaticContext:
    """What a static detector may read: the parsed file, the requested attention backend, the profile's evidence
    for this file, the findings earlier families kept (selected, not suppressed), and what the rest of the scanned
    tree says (its hooks, its autograd requests, its call sites; None: the file alone); `unsafe_fixes`: the user
    takes unsafe patches, so masks that may be None are passed to SDPA rather than guarded by their absence;
    `observed_masks` (optimize): so are masks the profile's evidence saw present with their facts holding."""

    parsed: ParsedModule
    backend: str = "sdpa"
    evidence: FileEvidence | None = None
    earlier: list[Finding] = field(default_factory=list)
    tree: TreeContext | None = None
    unsafe_fixes: bool = False
    observed_masks: bool = False
