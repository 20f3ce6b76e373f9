"""Score terms of bias modules: `attn = self.rel_pos(attn)` where the module's forward is `return attn + <term>`
(`ops._bias_forward`) adds `self.rel_pos.get_bias()`. The term is read where it is written, in the module's class, as
a term of that class's own block would be: its values (a learned table of the class, `learned_bias`) and its rank
(`rank_bounds`: a gather viewed to (H, N, N) and unsqueezed to 4 dims). What the class shows holds for the module the
patch runs on only where it is that class exactly and no hook fires on it: the patch checks both at run time
(`module_guard`) and runs the original otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.patterns.attention.candidate import Candidate, FunctionScope
from advisor.patterns.attention.learned_bias import learned_tables
from advisor.patterns.attention.tensor_facts import rank_bounds
from advisor.patterns.ops import BiasModule, Op, OpReader


@dataclass(frozen=True)
class ModuleTerm:
    """What a bias module's term is proved to be, for the classes the patch runs for."""

    table: str | None  # the learned table every such class's term reads, on the module (`self.rel_pos.table`)
    rank: tuple[int, int | None]
    classes: tuple[str, ...]  # the classes, as this file names them: the run-time check accepts exactly these
    tables: tuple[str, ...]  # the tables' attribute names where every such class reads the same ones (the term has
    #                          the dtype of one of them), else none


def module_term(op: Op) -> ModuleTerm | None:
    """The term of an add read from a bias module's forward (None for any other add). Where the module may be of
    several classes, those whose term reads a learned table of their own: the check leaves the others to the
    original (where none does, all of them, and the term's values stay unproved)."""
    found = op.params.get("module_bias")
    if found is None:
        return None
    module_expression = cst.Module([]).code_for_node(op.node.func)
    read = [(module, learned_tables(inside, term), rank_bounds(inside).bounds(term))
            for module, inside, term in ((module, _candidate_in(module, forward), term)
                                         for module, forward, term in found)]
    learned = [(module, tables, rank) for module, tables, rank in read if tables]
    kept = learned or read
    ranks = [rank for _, _, rank in kept]
    highs = [high for _, high in ranks]
    table = module_expression + learned[0][1][0].removeprefix("self") if learned else None
    names = {tuple(tables) for _, tables, _ in learned}
    return ModuleTerm(table, (min(low for low, _ in ranks), None if None in highs else max(highs)),
                      tuple(module.built_as for module, _, _ in kept),
                      tuple(t.removeprefix("self.") for t in names.pop()) if len(names) == 1 else ())


def _candidate_in(module: BiasModule, forward: cst.FunctionDef) -> Candidate:
    """A candidate in the module's forward: what its class's roles read the term through."""
    return Candidate.start(FunctionScope(module.home, forward, module.owner, forward.name.value,
                                         OpReader(module.home, module.owner)))
