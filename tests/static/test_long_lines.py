"""A long line (a string literal, a data table) costs a scan time in proportion to its length: the text screens of
the tree-wide pass are regular expressions, and one that backtracked over a long word took 20 s for a 50 KB string
and 107 s for 100 KB (breaker round 52). Times are in benchmarks/long_lines.py; here, what the screens find."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from advisor.contracts.finding import FixSafety
from advisor.engine.static import scan_paths
from advisor.static import call_sites, class_sites, project, state_swaps
from advisor.static.call_sites import BOUND_BY_COMPUTED_NAME, COMPUTED_LOOKUP, _computed_lookup_roots

BLOCK = '''import math
import torch
import torch.nn as nn


class Attn(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return s.softmax(dim=-1) @ v
'''


def test_a_file_with_a_long_string_is_scanned_as_without_it(tmp_path):
    plain, long = tmp_path / "plain.py", tmp_path / "long.py"
    plain.write_text(BLOCK)
    long.write_text(BLOCK + '\nBLOB = "' + "a" * 200_000 + '"\nCHAIN = "' + "a." * 50_000 + '"\n')
    result = scan_paths([str(plain), str(long)], jobs=1, patches=True, fixed=False, cache=False)
    assert not result.errors
    by_file = {finding.path.rsplit("/", 1)[-1]: finding for finding in result.findings}
    assert set(by_file) == {"plain.py", "long.py"}
    assert by_file["long.py"].fix_safety == by_file["plain.py"].fix_safety == FixSafety.SAFE
    assert _changed_lines(by_file["long.py"].patch) == _changed_lines(by_file["plain.py"].patch)


def _changed_lines(patch: str) -> list[str]:
    return [line for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_lookup_roots_are_the_first_word_of_each_lookups_object():
    text = '''
getattr(self.layers, f"attn{i}")
getattr(F, "softmax")
vars(model)[key]
cfg.sub.__dict__[k]
).inner.__dict__
impls.table.__getattr__(name)
impls.table.__getattr__("literal")
'''
    assert _computed_lookup_roots(text) == {"self", "model", "cfg", "inner", "impls"}


def test_a_binding_by_a_computed_name_names_the_whole_word():
    text = "layer_fn = getattr(self, f'layer{i}')\nxlayer=getattr(m, name)\n"
    assert [match.group(1) for match in BOUND_BY_COMPUTED_NAME.finditer(text)] == ["layer_fn", "xlayer"]


# the lookups as written before breaker round 52, tried at every position of a word (cubic over a long one)
BACKTRACKING_LOOKUP = re.compile(r"\bgetattr\s*\(\s*(\w+)[\w.]*\s*,(?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*[,)])|"
                                 r"\bvars\s*\(\s*(\w+)|(\w+)[\w.]*\.__dict__|"
                                 r"(\w+)[\w.]*\.__getattr(?:ibute)?__\s*\((?!\s*(?:'[^'\n]*'|\"[^\"\n]*\")\s*\))")
TOKENS = ["getattr", "getattr(", "(", ")", "vars", "vars(", ".", "..", "__dict__", "__getattr__", "__getattribute__",
          "a", "b", "self", ",", " ", "'s'", "x", "=", "\n", "[", "k", "]", "_", "f(i)"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=24))
def test_the_linear_lookups_find_the_roots_the_backtracking_ones_found(tokens):
    """Written token by token, the text's roots are the old expression's, restarts inside a dotted run included
    (`vars(a.b.__dict__)`: `a` and `b`)."""
    text = "".join(tokens)
    old = {root for match in BACKTRACKING_LOOKUP.finditer(text) for root in match.groups() if root}
    assert {root for match in COMPUTED_LOOKUP.finditer(text) for root in match.groups() if root} == old


# screens as written before breaker round 53 (`start[^\n]*end`: quadratic on a line holding `start` many times)
RESCANNING_SCREENS = {
    (project, "MAY_HOOK_BY_NAME"): r"getattr\([^\n]*hook|_global_\w*hooks|register_\w*hook\b(?!\s*\()",
    (project, "MAY_SCRIPT"): r"\bjit\.script(?:_method)?\b|ScriptModule|jit import[^\n]*\bscript|\bjit\b[^\n]*script",
    (state_swaps, "SHAPE_CHANGE"): r"\b(?:%s)\b|\.data\s*=(?!=)|setattr(?:__)?\([^)\n]*[\"']data[\"']|\b__set__\b|"
                               r"_swap_tensor_impl\b" % "|".join(sorted(state_swaps.SHAPE_CHANGING_NAMES)),
    (project, "FRAME_GLOBALS"): r"\b(?:f_globals|__globals__)\s*(?:\[[^\]\n]*\]\s*=(?!=)|\.\s*(?:update|setdefault|"
                                r"__setitem__|__delitem__|pop|popitem|clear)\b)|\b(?:exec|eval)\([^\n]*\b(?:f_globals|"
                                r"__globals__)\b",
    (call_sites, "CALL_ASSIGNED"): r"(?:\b[A-Z]\w*|\bcls|\bklass|\))\s*\.\s*__call__\s*=[^=]|"
                                   r"\.\s*(?:_call_impl|_wrapped_call_impl)\s*=[^=]|"
                                   r"setattr\([^)\n]*[\"'](?:__call__|_call_impl|_wrapped_call_impl)[\"']",
    (call_sites, "PRE_HOOKS"): r"""register_(module_)?forward_pre_hook|_forward_pre_hooks|methodcaller|"""
                               r"""["']register_\w*["']\s*(?:[+%]|\.format)|\+\s*["']\w*hooks?["']|"""
                               r"""\bf["'][^"'\n]*register_[^"'\n]*\{|\bf["'][^"'\n]*\}[^"'\n]*hooks?["']|"""
                               r"""getattr\([^\n]*(?:\bf["'][^"'\n]*hook|\+[^\n]*hook|hook[^\n]*\+)""",
    (call_sites, "ENUMERATED_USE"): r"\*\s*(?:list\s*\()?[\w.()\[\]]*\.(?:children|modules)\(\)|"
                                    r"\.(?:children|modules)\(\)\s*\)?\s*\[|\bmap\s*\([^\n]*\.(?:children|modules)\(\)|"
                                    r"\bnext\s*\([^\n]*\.(?:named_)?(?:children|modules)\(\)|"
                                    r"=\s*[\w.(]*\.(?:named_)?(?:children|modules)\(\)",
    (class_sites, "MAY_BUILD_CLASS"): r"\btype\s*\([^\n]*,|[\"']\s*,\s*\(",
}
SCREEN_TOKENS = ["getattr(", "setattr(", "setattr__(", "exec(", "eval(", "type(", "map(", "next(", "jit", "jit import",
                 "script", "hook", "hooks", "+", "f'", 'f"', "'", '"', "{", "}", "register_", "register_x", "(", ")",
                 ",", " ", "\n", "x", ".", "data", "'data'", "__call__", "'__call__'", "f_globals", "__globals__",
                 ".children()", ".modules()", "*", "=", "[", "]", "resize_", ".data =", "Attn", "__set__"]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(SCREEN_TOKENS), max_size=20))
def test_the_linear_screens_find_the_lines_the_rescanning_ones_found(tokens):
    """Each screen finds a match exactly where the old form did, and its first on the same line."""
    text = "".join(tokens)
    for (module, name), old in RESCANNING_SCREENS.items():
        before, now = re.search(old, text), getattr(module, name).search(text)
        assert (before is None) == (now is None), name
        if before is not None:
            assert text.count("\n", 0, before.start()) == text.count("\n", 0, now.start()), name
