"""Proof obligations of a rewrite: each fact it relies on, and whether the source proves it.

A rewrite is safe only when every fact is proved. A fact the static analysis cannot establish is recorded as
assumed (with the reason it cannot be proved), which makes the patch unsafe: it is offered only with
`--unsafe-fixes`, and `advisor optimize` can check it on the user's own inputs. A fact that is false is not
recorded at all: the matcher refuses the block with a reason instead. A fact that is false only where the
original's output is NaN (a fully masked query row, which SDPA returns as 0) is accepted: the patch stays safe
and the finding names the divergence. An assumed fact about a parameter used as is carries claims: what every
call of the function must pass for it to hold; when every call site in the scanned tree shows it, the fact is
proved from call sites (`from_call_sites`, with the sites listed), and the patch is safe. A fact about metadata only
(a dtype, a rank, a number) still assumed then may be guarded: the patch checks it at run time and runs the original
block where it fails, so the patch stays exact and safe. An assumed fact that held on every recorded call of a
workload is observed: still unproved, so the patch stays unsafe, but `advisor optimize` tries and verifies it on
that workload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

PROVED, ASSUMED, ACCEPTED, OBSERVED = "proved", "assumed", "accepted", "observed"
FROM_CALL_SITES, GUARDED = "from_call_sites", "guarded"


# a fact met twice keeps its weaker status
RANK = {PROVED: 0, FROM_CALL_SITES: 1, GUARDED: 2, ACCEPTED: 3, OBSERVED: 4, ASSUMED: 5}


@dataclass(frozen=True)
class Fact:
    name: str  # stable identifier, e.g. "mask-dtype", "scale-is-number"
    statement: str  # what must hold, in one sentence
    status: str  # PROVED, FROM_CALL_SITES, GUARDED, ACCEPTED, OBSERVED or ASSUMED
    why: str | None = None  # how it was proved, or why it could not be
    claims: tuple = field(default=(), compare=False)  # call_site_facts.Claim: what every call must pass
    sites: tuple[str, ...] = ()  # FROM_CALL_SITES: the calls (`path:line`) that prove it

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"name": self.name, "statement": self.statement, "why": self.why}
        if self.status == FROM_CALL_SITES:
            data["sites"] = list(self.sites)
        return data


class FactSheet:
    """The facts one candidate rewrite relies on, in the order the proof met them (one entry per name and
    statement: proving the same thing twice records it once)."""

    def __init__(self) -> None:
        self.facts: list[Fact] = []

    def proved(self, name: str, statement: str, why: str | None = None) -> None:
        self._add(Fact(name, statement, PROVED, why))

    def assumed(self, name: str, statement: str, why: str, claims: tuple = ()) -> None:
        """`claims`: what every call of the function would have to pass to prove it from call sites."""
        self._add(Fact(name, statement, ASSUMED, why, claims))

    def accepted(self, name: str, statement: str, why: str) -> None:
        """A documented divergence that leaves the patch safe (the original's NaN becomes SDPA's 0)."""
        self._add(Fact(name, statement, ACCEPTED, why))

    def observe(self, name: str, seen: str) -> None:
        """The assumed facts of this name held on every recorded call of a workload (`seen` says what the run
        showed); the source still does not prove them."""
        self._restate(name, OBSERVED, lambda why: f"{seen}; not proved: {why}")

    def guard(self, name: str, check: str) -> None:
        """The assumed facts of this name become guarded: the patch runs `check` before the SDPA call and the
        original block where it fails."""
        self._restate(name, GUARDED, lambda why: f"checked at run time by `{check}`; the original block runs where "
                                                 f"it fails (was assumed: {why})")

    def _restate(self, name: str, status: str, why: Callable[[str | None], str]) -> None:
        """The assumed facts of this name get `status`, and a reason built from their old one."""
        self.facts = [replace(fact, status=status, why=why(fact.why))
                      if fact.name == name and fact.status == ASSUMED else fact for fact in self.facts]

    def _add(self, fact: Fact) -> None:
        for index, known in enumerate(self.facts):
            if (known.name, known.statement) == (fact.name, fact.statement):
                if RANK[fact.status] > RANK[known.status]:
                    self.facts[index] = fact  # one path could not prove it: the weaker status wins
                elif fact.status == known.status == ASSUMED and not (fact.claims and known.claims):
                    self.facts[index] = replace(known, claims=())  # one path has no claim to prove it by
                elif fact.status == known.status == ASSUMED:
                    self.facts[index] = replace(known, claims=known.claims + fact.claims)
                return
        self.facts.append(fact)

    @property
    def assumptions(self) -> list[Fact]:
        return [fact for fact in self.facts if fact.status == ASSUMED]

    @property
    def observations(self) -> list[Fact]:
        return [fact for fact in self.facts if fact.status == OBSERVED]

    def from_call_sites(self, fact: Fact, sites: list[str], shows: str) -> None:
        """`fact`, assumed here, holds at every call site in the tree (`sites`), each showing `shows`."""
        index = self.facts.index(fact)
        self.facts[index] = Fact(fact.name, fact.statement, FROM_CALL_SITES,
                                 f"every call in the scanned tree passes {shows} ({len(sites)} call "
                                 f"site{'s' if len(sites) > 1 else ''}); not proved for callers outside it",
                                 sites=tuple(sites))

    def to_json(self) -> dict[str, list[dict]]:
        """Facts by status; the `observed`, `from_call_sites` and `guarded` groups only where a fact was discharged
        so (static scans of code without callers or guards keep three)."""
        groups = (PROVED, ACCEPTED, ASSUMED) + ((OBSERVED,) if self.observations else ()) + \
            tuple(status for status in (FROM_CALL_SITES, GUARDED) if any(fact.status == status for fact in self.facts))
        return {status: [fact.to_json() for fact in self.facts if fact.status == status] for status in groups}
