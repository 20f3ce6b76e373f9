"""Code for `--backend flex`: the block's score_mod and mask_mod as functions nested next to the call, the tensors
they read bound just before them, and the call of `advisor_flex_attention`, whose module-level definition (the
prelude, `flex_prelude`) is added once per module.
"""

from __future__ import annotations

import functools

import libcst as cst
from libcst.helpers import parse_template_expression, parse_template_statement

from advisor.patterns.attention import AttentionMatch
from advisor.rewrite.flex_prelude import HELPER_NAME, prelude_source
from advisor.rewrite.sdpa_call import call
from advisor.static.codegen import assignment, keyword
from advisor.static.module_index import ParsedModule

SCORE_PARAMETERS = "score, b, h, q_idx, kv_idx"
MASK_PARAMETERS = "b, h, q_idx, kv_idx"


def flex_statements(match: AttentionMatch) -> tuple[cst.BaseStatement, ...]:
    """The captured tensors, then `def <score_mod>(score, b, h, q_idx, kv_idx): return ...` and the mask_mod,
    to be placed just before the statement holding the call."""
    plan = match.flex
    statements: list[cst.BaseStatement] = [cst.SimpleStatementLine([assignment(name, value)])
                                           for name, value in plan.captures]
    for name, body, parameters in ((plan.names[0], plan.score, SCORE_PARAMETERS),
                                   (plan.names[1], plan.mask, MASK_PARAMETERS)):
        if body is not None:
            statements.append(parse_template_statement(f"def {{name}}({parameters}):\n    return {{body}}\n",
                                                       name=cst.Name(name), body=body))
    return tuple(statements)


def flex_call(module: cst.Module, match: AttentionMatch, indent: int) -> cst.BaseExpression:
    """`advisor_flex_attention(q, k, v, score_mod=..., mask_mod=..., mask_key=..., scale=...)`."""
    plan = match.flex
    args = [cst.Arg(match.query), cst.Arg(match.key), cst.Arg(match.value)]
    if plan.score is not None:
        args.append(keyword("score_mod", cst.Name(plan.names[0])))
    if plan.mask is not None:
        mask_mod = cst.Name(plan.names[1])
        if plan.optional_mask is not None:  # no mask on this path: no mask_mod
            mask_mod = parse_template_expression("{f} if {t} is not None else None", f=mask_mod, t=plan.optional_mask)
        args.append(keyword("mask_mod", mask_mod))
        if plan.mask_key is not None:
            args.append(keyword("mask_key", plan.mask_key))
    if match.scale is not None:
        args.append(keyword("scale", match.scale))
    if all(_is_head_unsqueeze(node) for node in (match.key, match.value)):
        args.append(keyword("enable_gqa", cst.Name("True")))  # one K/V head for all query heads
    return call(module, cst.Name(HELPER_NAME), args, match.output_methods, indent)


def _is_head_unsqueeze(node: cst.BaseExpression) -> bool:
    """`k.unsqueeze(1)`: a size-1 head axis (multi-query), which SDPA broadcasts and flex_attention takes only as
    grouped-query attention (`enable_gqa`, any query head count being a multiple of 1)."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
        node.func.attr.value == "unsqueeze" and len(node.args) == 1 and \
        isinstance(node.args[0].value, cst.Integer) and node.args[0].value.value == "1"


def prelude(parsed: ParsedModule) -> tuple[cst.BaseStatement, ...] | str:
    """The helper's module-level statements, none where the module defines it already (a file patched before), or
    why it cannot be added (the name is taken by something else, or torch is not imported as a module)."""
    torch_name = parsed.module_aliases.get("torch")
    if HELPER_NAME in parsed.module_functions:
        return ()
    if HELPER_NAME in parsed.bound_names or HELPER_NAME in parsed.imports:
        return f"the name `{HELPER_NAME}` is already used in this module"
    if torch_name is None:
        return "the module does not import torch as a module, which the flex helper calls"
    return _prelude_statements(torch_name, parsed.module.default_newline)


@functools.cache
def _prelude_statements(torch_name: str, newline: str) -> tuple[cst.BaseStatement, ...]:
    """Parsed with the module's newline: the line breaks inside the helper's docstrings are source text that the
    module's rendering keeps as they are, so a CRLF file gets CRLF docstrings, not bare LFs."""
    body = cst.parse_module(prelude_source(torch_name).replace("\n", newline)).body
    first = body[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return (first, *body[1:])
