"""Proof obligations of a rewrite: each fact it relies on, and whether the source proves it.

A rewrite is safe only when every fact is proved. A fact the static analysis cannot establish is recorded as
assumed (with the reason it cannot be proved), which makes the patch unsafe: it is offered only with
`--unsafe-fixes`, and `advisor optimize` can check it on the user's own inputs. A fact that is false is not
recorded at all: the matcher refuses the block with a reason instead. A fact that is false only where the
original's output is NaN (a fully masked query row, which SDPA returns as 0) is accepted: the patch stays safe
and the finding names the divergence. A fact about metadata only (a dtype, a rank) may instead be guarded: the patch
checks it at run time and runs the original block where it fails, so the patch stays exact and safe.
"""

from __future__ import annotations

from dataclasses import dataclass

PROVED, ASSUMED, ACCEPTED, GUARDED = "proved", "assumed", "accepted", "guarded"


RANK = {PROVED: 0, GUARDED: 1, ACCEPTED: 2, ASSUMED: 3}  # a fact met twice keeps its weaker status


@dataclass(frozen=True)
class Fact:
    name: str  # stable identifier, e.g. "mask-dtype", "scale-is-number"
    statement: str  # what must hold, in one sentence
    status: str  # PROVED, GUARDED, ACCEPTED or ASSUMED
    why: str | None = None  # how it was proved, or why it could not be

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "statement": self.statement, "why": self.why}


class FactSheet:
    """The facts one candidate rewrite relies on, in the order the proof met them (one entry per name and
    statement: proving the same thing twice records it once)."""

    def __init__(self) -> None:
        self.facts: list[Fact] = []

    def proved(self, name: str, statement: str, why: str | None = None) -> None:
        self._add(Fact(name, statement, PROVED, why))

    def assumed(self, name: str, statement: str, why: str) -> None:
        self._add(Fact(name, statement, ASSUMED, why))

    def accepted(self, name: str, statement: str, why: str) -> None:
        """A documented divergence that leaves the patch safe (the original's NaN becomes SDPA's 0)."""
        self._add(Fact(name, statement, ACCEPTED, why))

    def guard(self, name: str, check: str) -> None:
        """The assumed facts called `name` become guarded: the patch runs `check` before the SDPA call and the
        original block where it fails."""
        self.facts = [Fact(f.name, f.statement, GUARDED, f"checked at run time by `{check}`; the original block "
                           f"runs where it fails (was assumed: {f.why})")
                      if f.name == name and f.status == ASSUMED else f for f in self.facts]

    def _add(self, fact: Fact) -> None:
        for index, known in enumerate(self.facts):
            if (known.name, known.statement) == (fact.name, fact.statement):
                if RANK[fact.status] > RANK[known.status]:
                    self.facts[index] = fact  # one path could not prove it: the weaker status wins
                return
        self.facts.append(fact)

    @property
    def assumptions(self) -> list[Fact]:
        return [fact for fact in self.facts if fact.status == ASSUMED]

    def to_json(self) -> dict[str, list[dict]]:
        return {status: [fact.to_json() for fact in self.facts if fact.status == status]
                for status in (PROVED, GUARDED, ACCEPTED, ASSUMED)}
