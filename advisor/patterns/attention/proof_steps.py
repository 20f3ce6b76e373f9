"""The attention proof as declared steps: each names the candidate fields it reads and the fields it produces,
and one runner runs them in order.

The candidate stays one mutable value (its role functions fill it in place, and several walk into helpers that
extend it), so the runner enforces a write-once discipline rather than replacing it step by step: a step sets
only the fields it declares; a field is produced by one step, except the accumulations (`ACCUMULATED`: facts,
leaves, dtype changes, ...) that several steps extend in pipeline order; a step reads only the candidate's start
fields, fields an earlier step produced, and what it produces itself. `check_declarations` checks the
declarations against each other; with `ADVISOR_CHECK_PROOF=1` (the test suite sets it) the runner also watches
every step run (the fields it reads through the candidate, its match and its score chain, and the fields whose
value changed) and raises `ProofOrderError` when a step strays from its declaration.

Field names: a candidate field as is (`factors`), a match field as `match.<field>`, a score chain field as
`chain.<field>`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

from advisor.patterns.attention.candidate import Candidate, ScoreChain, WeightPath
from advisor.patterns.attention.result import AttentionMatch, FlexPlan, MaskTerm
from advisor.patterns.facts import FactSheet

# what `Candidate.start` and `matcher._attempt` set before the first step; those no step writes are read freely
START = frozenset({"scope", "softmax", "off", "flow", "values", "home", "match.function", "match.line",
                   "match.end_line"})
# the fields several steps write, in pipeline order, and why
ACCUMULATED = {
    "flow": "the walks merge the flow of each helper they enter",
    "values": "rebuilt over each merged flow",
    "inlined": "the helpers each walk enters",
    "absorbed": "reads each role takes over (cast targets, mask names)",
    "dtype_changes": "casts met by each walk (the score chain's, the product operands', the weights')",
    "factors": "scale factors of the product, then of the score chain",
    "leaf_nodes": "what SDPA reads, role by role",
    "dtype_roots": "built by the first step that asks a dtype",
    "match.facts": "each fact recorded by the role that proves it",
    "match.masks": "the product's bias, then the score chain's terms",
    "match.query": "the operands' casts kept where v is cast alike, then the tensor factors folded in last",
    "match.key": "the product's operand, then its cast kept where v is cast alike",
    "product_casts": "the operands' casts, emptied where v is cast alike (they stay then)",
    "match.output_methods": "the values' transpose, then the output's layout",
    "match.guard_checks": "the flag's check, then the metadata checks",
    "match.guard_span": "the flag's span, then the guards'",
}


class ProofOrderError(AssertionError):
    """A step read a field no earlier step produced, or wrote one it does not declare: a bug of ours."""


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Candidate], None]
    reads: frozenset[str]
    writes: frozenset[str]

    @property
    def doc(self) -> str:
        return " ".join((self.run.__doc__ or "").split())


def step(reads: str = "", writes: str = "") -> Callable[[Callable[[Candidate], None]], Step]:
    """Declare a step named after its function; `reads` and `writes` are space-separated field names."""
    return lambda run: Step(run.__name__, run, frozenset(reads.split()), frozenset(writes.split()))


def run_steps(steps: tuple[Step, ...], c: Candidate) -> None:
    if os.environ.get("ADVISOR_CHECK_PROOF") != "1":
        for each in steps:
            each.run(c)
        return
    with _Watching(c, free_reads(steps)) as watch:
        for each in steps:
            watch.run(each, c)


def check_declarations(steps: tuple[Step, ...]) -> list[str]:
    """What is wrong with the declarations themselves: unknown fields, a field produced by two steps that is not
    an accumulation, a read of a field neither the start nor an earlier step produced."""
    problems, produced, producer, free = [], set(START), {}, free_reads(steps)
    for each in steps:
        problems += [f"{each.name}: unknown field `{name}`" for name in sorted((each.reads | each.writes) - FIELDS)]
        problems += [f"{each.name}: reads `{name}`, which no earlier step produces"
                     for name in sorted(each.reads - produced - each.writes)]
        problems += [f"{each.name}: declares reading `{name}`, which is read freely"
                     for name in sorted(each.reads & free)]
        for name in sorted(each.writes.difference(ACCUMULATED)):
            if name in producer:
                problems.append(f"{each.name}: produces `{name}`, which {producer[name]} already produced")
            producer[name] = each.name
        produced |= each.writes
    writers = {name: sum(name in each.writes for each in steps) for name in ACCUMULATED}
    problems += [f"`{name}` is listed as accumulated but {count} step writes it" for name, count in writers.items()
                 if count < 2]
    return problems


def free_reads(steps: tuple[Step, ...]) -> frozenset[str]:
    """The start fields no step writes: any step may read them without declaring it."""
    return START.difference(*(each.writes for each in steps))


def _fields(cls: type, prefix: str = "") -> frozenset[str]:
    return frozenset(prefix + f.name for f in dataclasses.fields(cls))


# the containers `match` and `chain` are watched field by field
FIELDS = (_fields(Candidate) - {"match", "chain"}) | _fields(AttentionMatch, "match.") | _fields(ScoreChain, "chain.")


def _watched(cls: type, prefix: str) -> type:
    """A subclass that notes each read of a field in the running step's log (swapped in only while checking)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"match", "chain"}

    def __getattribute__(self, name):  # noqa: N807
        if name in names and _Watching.reads is not None:
            _Watching.reads.add(prefix + name)
        return object.__getattribute__(self, name)

    return type(f"Watched{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})


class _Watching:
    """Swaps the watched classes in for one proof and checks each step against its declaration."""

    reads: set[str] | None = None  # the running step's reads
    _classes = {Candidate: _watched(Candidate, ""), AttentionMatch: _watched(AttentionMatch, "match."),
                ScoreChain: _watched(ScoreChain, "chain.")}

    def __init__(self, c: Candidate, free: frozenset[str]) -> None:
        self.objects, self.free = [c, c.match, c.chain], free

    def __enter__(self) -> _Watching:
        for obj in self.objects:
            obj.__class__ = self._classes[type(obj)]
        return self

    def __exit__(self, *exc) -> None:
        for obj in self.objects:
            obj.__class__ = type(obj).__mro__[1]

    def run(self, each: Step, c: Candidate) -> None:
        before, outer = _state(c), _Watching.reads
        _Watching.reads = set()
        try:
            each.run(c)
        finally:
            reads, _Watching.reads = _Watching.reads, outer
            after = _state(c)
            written = {name for name in FIELDS if before[name] != after[name]}
            undeclared = reads - each.reads - each.writes - self.free
            problems = [f"reads `{name}` without declaring it" for name in sorted(undeclared)]
            problems += [f"writes `{name}` without declaring it" for name in sorted(written - each.writes)]
            if problems:
                raise ProofOrderError(f"proof step {each.name}: " + "; ".join(problems))


def _state(c: Candidate) -> dict[str, object]:
    owners = {"": c, "match.": c.match, "chain.": c.chain}
    state = {}
    for name in FIELDS:
        prefix, _, attr = name.rpartition(".")
        state[name] = _fingerprint(object.__getattribute__(owners[prefix and prefix + "."], attr))
    return state


# the mutable records a step fills in place; an Op (the reader's, which memoises on it) and the function scope
# (which every candidate of the function shares) are not the candidate's state
_RECORDS = (WeightPath, MaskTerm, FlexPlan)


def _fingerprint(value: object, depth: int = 0) -> object:
    """Identity of a value and, for the containers and records the steps fill in place, of what they hold (so an
    append or a changed field shows)."""
    if depth > 3:
        return id(value)
    if isinstance(value, (list, tuple)):
        return id(value), tuple(_fingerprint(item, depth + 1) for item in value)
    if isinstance(value, (set, frozenset)):
        return id(value), frozenset(id(item) for item in value)
    if isinstance(value, dict):
        return id(value), tuple((id(k), _fingerprint(v, depth + 1)) for k, v in value.items())
    if isinstance(value, FactSheet):
        return id(value), _fingerprint(value.facts, depth + 1)
    if isinstance(value, _RECORDS):
        return id(value), tuple(_fingerprint(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return id(value)

