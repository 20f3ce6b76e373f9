"""What the matcher hands on: a proved match (everything the SDPA rewrite needs), its mask terms, or a refusal.

These types are the contract with the rewrite, scan and backend layers; the proof's own working state lives in
`candidate` and never leaves the package. The plan is nodes: the user's expressions as parsed (an inlined helper's
parameters replaced by the caller's arguments) inside new code built with `advisor.static.codegen`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns.facts import FactSheet
from advisor.static.codegen import MethodStep


class Refusal(Exception):
    """A role could not be proved; the message is the one-sentence reason shown to the user."""


@dataclass
class MaskTerm:
    kind: str  # "keep" (bool, True = attend), "float" (additive), "causal", "finite" (masked bool + fill)
    expression: cst.BaseExpression  # keep / float / causal-keep mask, or the masked (True = masked) one for "finite"
    fill: cst.BaseExpression | None = None
    guard: cst.If | None = None
    statement: cst.CSTNode | None = None  # where the original applies it
    # (expand shape, reshape shape, broadcast: expand() cannot take the mask) when applied to a view
    reshape: tuple[list[cst.BaseExpression], list[cst.BaseExpression], bool] | None = None
    scaled_after: bool = False
    nodes: list[cst.CSTNode] = field(default_factory=list)
    fill_kind: str = mk.ADDITIVE  # how the original masks: -inf fill, finite fill, or added values
    source: cst.BaseExpression | None = None  # the mask tensor as the original passes it
    same_dtype: bool = False  # the original proves it has the scores' dtype (baddbmm's input)
    in_place: bool = False  # added in place (`s += m`): the scores keep their dtype whatever the mask's
    keeps_first_key: bool = False  # every query row attends to key 0 (a lower triangle sliced from column 0)
    # every query row attends to key 0 where there are at least as many keys as queries (`ones(L, S).triu(S - L + 1)`)
    bottom_right: bool = False
    number_paths: list[float] | None = None  # added, and a Python number on some paths (`bias = 0.0`)
    optional: bool = False  # added only where it is not None (`maybe_add_mask(s, m)`): SDPA's attn_mask=None
    learned: str | None = None  # added, and read from this learned table (`self.table`): a score term, not a mask
    # (table, why): read from that learned table as far as its class shows, but an instance's may be another (why)
    learned_rebound: tuple[str, str] | None = None
    # ... where only the tables themselves are in doubt: their attributes, each an `nn.Parameter` when it is learned
    checked_tables: tuple[str, ...] = ()
    rank: tuple[int, int | None] | None = None  # bounds read where the term is written (a bias module's class)
    # a bias module's term: (`self.<attr>`'s attr, the classes the term is read for, the `self.<attr>` called)
    module: tuple[str, tuple[str, ...], cst.Attribute] | None = None
    tables: tuple[cst.BaseExpression, ...] = ()  # the learned tables the term reads, as plain attributes to check
    keep: cst.BaseExpression | None = None  # a finite fill's mask in SDPA's polarity (True = attend)
    # (tensor, why): the tensor that must be bool for the patch to raise wherever the original does (`m` of
    # `masked_fill(~m, f)`, whose `~` the patch drops; a `where` condition), when its source does not show that it
    # is; None when it does, or when the patch raises wherever the original does
    dtype_subject: tuple[cst.BaseExpression, str] | None = None
    # ... where the source shows only that the tensor is no float (`band & m`: bitwise ops raise on floats): an
    # integer mask makes SDPA raise as `masked_fill` does, unless the patch turns it into a float mask with
    # `torch.where`, which takes uint8 (attn_mask's `additive` then makes this the dtype subject)
    integer_subject: tuple[cst.BaseExpression, str] | None = None


@dataclass
class RowFixup:
    """Fully masked rows made exact under one finite fill (see `attention.uniform_rows`): `keep` (the boolean keep
    mask) and its rows that keep a key are bound to fresh names before the call, which gets `torch.where(rows, q, 0)`
    and `keep | ~rows`: a row masked everywhere attends to every key with a zero query, so its weights are uniform,
    as the original's fill made them."""
    torch: str  # how the module spells torch
    keep: cst.BaseExpression
    keep_name: str
    rows_name: str
    unfit: tuple[str, ...] = ()  # float dtypes the fill overflows: `masked_fill` raises there, the patch must too
    # the fill is applied under an `if`: `keep_name` starts as None and is bound where the original fills, so a
    # run that skips the fill reaches SDPA with q and no mask
    conditional: bool = False
    keeps: tuple[cst.BaseExpression, ...] = ()  # each fill's keep mask, as `match.masks` orders them


@dataclass
class AttentionMatch:
    """Everything the SDPA rewrite needs, or the reason there is none."""

    function: str
    line: int
    end_line: int
    output_node: cst.CSTNode | None = None
    query: cst.BaseExpression | None = None
    key: cst.BaseExpression | None = None
    value: cst.BaseExpression | None = None
    scale: cst.BaseExpression | None = None  # None: SDPA's default 1/sqrt(E) is provably the original's
    masks: list[MaskTerm] = field(default_factory=list)
    dropout_p: cst.BaseExpression | None = None
    # masks evaluated where the original applied them, into a fresh variable: the statement to put
    # `variable = None` before, and {statement applying a mask: the assignment that replaces it}
    hoist_anchor: cst.CSTNode | None = None
    hoist_init: cst.SimpleStatementLine | None = None
    hoisted: dict[cst.CSTNode, cst.Assign] = field(default_factory=dict)
    renamed: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)  # `scores.dtype`, ...
    attn_mask: cst.BaseExpression | None = None
    is_causal: bool = False
    output_methods: list[MethodStep] = field(default_factory=list)  # on the call: the original output's layout
    removed: list[cst.CSTNode] = field(default_factory=list)
    escapes: list[cst.Name] = field(default_factory=list)
    reason: str | None = None
    unsafe_reason: str | None = None  # why even the unsafe fix is unavailable
    note: str | None = None  # what the user should know whatever the proof found (SDPA on the other branch)
    facts: FactSheet = field(default_factory=FactSheet)  # what the rewrite relies on; assumed facts make it unsafe
    # guarded facts: the check each metadata fact could get, the statements whose original runs where the check
    # fails, and the check that selects the SDPA path (set once call sites had their say, see attention.guards)
    guard_checks: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    guard_span: list[cst.BaseStatement] = field(default_factory=list)
    guard_lifted: list[cst.SimpleStatementLine] = field(default_factory=list)  # run above the check (it reads them)
    row_fixup: RowFixup | None = None  # fully masked rows made uniform, as the original's finite fill makes them
    masks_absent: bool = False  # the fully-masked-rows check is `m is None` for every mask: SDPA needs no mask
    # `m is None` for masks each under its own `if m is not None:`, and the statements it lifts: used where only
    # mask facts are still assumed and no run saw the masks present with their facts holding (see settle_guards)
    # (`m is None` checks, statements they read, whether a learned term is passed where they hold)
    absent_under_if: tuple[list[cst.BaseExpression], list[cst.SimpleStatementLine], bool] | None = None
    guard: cst.BaseExpression | None = None
    # the deleted modules' check, computed into a local above the guard's `if` (see attention.module_guard)
    module_check: cst.BaseExpression | None = None
    # weights that leave only on request (attention.flags): the `if <flag>:` statements the SDPA path replaces by
    # their `else:`, and the test that selects that path where the flag is proved a bool (else a guard check)
    unwrap: list[cst.If | cst.IfExp] = field(default_factory=list)  # replaced by their `else` on the SDPA path
    take: list[cst.If | cst.IfExp] = field(default_factory=list)  # replaced by their body on the SDPA path
    flag_test: cst.BaseExpression | None = None
    # weights returned in a tuple: what every caller must do for None to stand in for them (call_site_facts.Claim)
    dropped: tuple = ()
    # soft-capping (`cap * tanh(s / cap)`): the score_mod's expression of `score` for it (None: no tanh), and why
    # SDPA cannot take the block while FlexAttention can (the refusal every backend but `flex` reports)
    softcap: cst.BaseExpression | None = None
    sdpa_refusal: str | None = None
    flex: "FlexPlan | None" = None  # what `--backend flex` emits (score_mods), or None with `flex_refusal`
    flex_refusal: str | None = None
    # TorchScript may compile the block's function: only SDPA is emitted (the flex and flash_attn helpers are Python)
    scripted: bool = False
    flash_attn_refusal: str | None = None  # why `--backend flash-attn` keeps SDPA here, whatever the site


@dataclass
class FlexPlan:
    """The FlexAttention call of a proved block: `score_mod`/`mask_mod` bodies as expressions of `score`, `b`, `h`,
    `q_idx` and `kv_idx`, tensors they read (bound to fresh names before the call), and the facts the flex patch
    relies on (the SDPA sheet with the facts that differ for flex replaced)."""

    score: cst.BaseExpression | None  # None: no score_mod
    mask: cst.BaseExpression | None  # None: no mask_mod
    mask_key: cst.BaseExpression | None  # the BlockMask cache key, when the mask reads indices and numbers only
    captures: list[tuple[str, cst.BaseExpression]]
    followed: list  # the local definitions (dataflow.Definition) computed masks were read through
    removed: list[cst.CSTNode]  # those only the block read: the patch drops them
    key_values: list[cst.BaseExpression]  # Python numbers the computed masks read by name (part of the cache key)
    names: tuple[str, str]  # the fresh names of the score_mod and mask_mod functions
    facts: FactSheet
    no_dropout: cst.BaseExpression | None  # `dropout_p == 0`: the patch runs only there (flex has no dropout)
    extent_check: cst.BaseExpression | None  # computed masks' positions span the scores (`n == q.size(-2)`)
    span: list  # the statements that check guards, as `AttentionMatch.guard_span`
    optional_mask: cst.Name | None  # the captured mask that may be None (no mask_mod then)
