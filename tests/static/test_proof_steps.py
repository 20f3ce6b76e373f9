"""The attention proof's steps (`matcher.PROOF`): their declarations agree with each other, the runner catches a
step that reads or writes what it does not declare, and ARCHITECTURE.md's table is the code's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from advisor.patterns.attention import matcher
from advisor.patterns.attention.matcher import PROOF, find_attention
from advisor.patterns.attention.proof_steps import ProofOrderError, Step, check_declarations
from advisor.patterns.attention.result import AttentionMatch
from advisor.report.proof_doc import with_proof_table
from advisor.static.module_index import ParsedModule

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = """
import torch

def attend(q, k, v):
    scores = q @ k.transpose(-2, -1) / 8.0
    return torch.softmax(scores, dim=-1) @ v
"""


def _named(name: str) -> Step:
    return next(each for each in PROOF if each.name == name)


def _with(replaced: Step) -> tuple[Step, ...]:
    return tuple(replaced if each.name == replaced.name else each for each in PROOF)


def test_the_declared_steps_agree_with_each_other():
    assert check_declarations(PROOF) == []


def test_a_step_moved_before_what_it_reads_is_caught():
    steps = list(PROOF)
    first, second = steps.index(_named("score_chain")), steps.index(_named("core_roles"))
    steps[first], steps[second] = steps[second], steps[first]
    assert "core_roles: reads `core`, which no earlier step produces" in check_declarations(tuple(steps))


def test_a_field_produced_by_two_steps_is_caught_unless_it_is_an_accumulation():
    extra = Step("rescale", lambda c: None, frozenset(), frozenset({"match.scale", "match.facts"}))
    assert check_declarations(PROOF + (extra,)) == [
        "rescale: produces `match.scale`, which scale_and_masks already produced"]


def test_a_checked_proof_leaves_the_match_and_candidate_classes_as_they_were(monkeypatch):
    monkeypatch.setenv("ADVISOR_CHECK_PROOF", "1")
    (match,) = find_attention(ParsedModule(SOURCE, "attend.py"))
    assert match.reason is None and type(match) is AttentionMatch


@pytest.mark.parametrize("step, dropped, error", [
    ("scale_and_masks", "writes", "proof step scale_and_masks: writes `match.scale` without declaring it"),
    ("core_roles", "reads", "proof step core_roles: reads `core` without declaring it"),
])
def test_a_step_that_strays_from_its_declaration_raises(monkeypatch, step, dropped, error):
    declared = _named(step)
    field = "match.scale" if dropped == "writes" else "core"
    monkeypatch.setattr(matcher, "PROOF", _with(dataclasses.replace(declared, **{
        dropped: getattr(declared, dropped) - {field}})))
    monkeypatch.setenv("ADVISOR_CHECK_PROOF", "1")
    with pytest.raises(ProofOrderError, match=error):
        find_attention(ParsedModule(SOURCE, "attend.py"))


def test_unchecked_runs_do_not_watch(monkeypatch):
    """Outside the tests the runner only runs the steps: a stray write goes unnoticed there (and costs nothing)."""
    declared = _named("scale_and_masks")
    monkeypatch.setattr(matcher, "PROOF", _with(dataclasses.replace(declared, writes=frozenset())))
    monkeypatch.setenv("ADVISOR_CHECK_PROOF", "0")
    (match,) = find_attention(ParsedModule(SOURCE, "attend.py"))
    assert match.reason is None


def test_architecture_md_lists_the_steps_as_declared():
    text = (REPO_ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert with_proof_table(text) == text, "stale: run `python -m advisor.report.proof_doc ARCHITECTURE.md`"
