"""Proof obligations of a rewrite: each fact it relies on, and whether the source proves it.

A rewrite is safe only when every fact is proved. A fact the static analysis cannot establish is recorded as
assumed (with the reason it cannot be proved), which makes the patch unsafe: it is offered only with
`--unsafe-fixes`, and `advisor optimize` can check it on the user's own inputs. A fact that is false is not
recorded at all: the matcher refuses the block with a reason instead. A fact that is false only where the
original's output is NaN (a fully masked query row, which SDPA returns as 0) is accepted: the patch stays safe
and the finding names the divergence. An assumed fact that held on every recorded call of a workload is observed:
still unproved, so the patch stays unsafe, but `advisor optimize` tries and verifies it on that workload.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PROVED, ASSUMED, ACCEPTED, OBSERVED = "proved", "assumed", "accepted", "observed"


RANK = {PROVED: 0, ACCEPTED: 1, OBSERVED: 2, ASSUMED: 3}  # a fact met twice keeps its weaker status


@dataclass(frozen=True)
class Fact:
    name: str  # stable identifier, e.g. "mask-dtype", "scale-is-number"
    statement: str  # what must hold, in one sentence
    status: str  # PROVED, ASSUMED, ACCEPTED or OBSERVED
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

    def observe(self, name: str, seen: str) -> None:
        """The assumed facts of this name held on every recorded call of a workload (`seen` says what the run
        showed); the source still does not prove them."""
        self.facts = [replace(fact, status=OBSERVED, why=f"{seen}; not proved: {fact.why}")
                      if fact.name == name and fact.status == ASSUMED else fact for fact in self.facts]

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

    @property
    def observations(self) -> list[Fact]:
        return [fact for fact in self.facts if fact.status == OBSERVED]

    def to_json(self) -> dict[str, list[dict]]:
        """Facts by status; the `observed` group only where a run discharged one (static scans keep three)."""
        groups = (PROVED, ACCEPTED, ASSUMED) + ((OBSERVED,) if self.observations else ())
        return {status: [fact.to_json() for fact in self.facts if fact.status == status] for status in groups}
