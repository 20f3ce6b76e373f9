"""The replacement call for one proved attention block, and the import it may need."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns.attention import AttentionMatch
from advisor.static.codegen import MethodStep, assignment, dotted, keyword, with_methods
from advisor.static.module_index import ParsedModule

WRAP_AT = 100


@dataclass
class FunctionalName:
    prefix: str  # how this module spells torch.nn.functional: "F", "nn.functional", "torch.nn.functional"
    import_line: str | None  # an import to add when the module has no spelling for it


def functional_name(parsed: ParsedModule) -> FunctionalName:
    if parsed.torch_functional_spelling is not None:
        return FunctionalName(parsed.torch_functional_spelling, None)
    taken = "F" in parsed.words  # crude but conservative: any word "F" means the name may be used
    if not taken:
        return FunctionalName("F", "import torch.nn.functional as F")
    if "torch" not in parsed.bound_names:
        return FunctionalName("torch.nn.functional", "import torch.nn.functional")
    fresh = next(f"F{n}" for n in itertools.count(2) if f"F{n}" not in parsed.words)  # `torch` is rebound too
    return FunctionalName(fresh, f"import torch.nn.functional as {fresh}")


def sdpa_call(module: cst.Module, match: AttentionMatch, functional: str, indent: int) -> cst.BaseExpression:
    """`F.scaled_dot_product_attention(q, k, v, ...)` with only the arguments that differ from defaults."""
    query, attn_mask = match.query, match.attn_mask
    fixup = match.row_fixup
    if fixup is not None and attn_mask is not None:  # fully masked rows: every key, a zero query (uniform weights)
        rows, keep = cst.Name(fixup.rows_name), cst.Name(fixup.keep_name)
        query = parse_template_expression("{torch}.where({rows}, {q}, 0)", torch=cst.Name(fixup.torch), rows=rows,
                                          q=query)
        attn_mask = parse_template_expression("{keep} | ~{rows}", keep=keep, rows=rows)
        if fixup.conditional:  # a run that skipped the fill: q and no mask, the plain scores' softmax
            # rows is None exactly where keep is; each test names the variables its branch reads, which TorchScript
            # needs to refine their Optional types
            query = parse_template_expression("{q} if {rows} is None else {fixed}", q=match.query, rows=rows,
                                              fixed=query)
            attn_mask = parse_template_expression("None if {keep} is None or {rows} is None else {fixed}", keep=keep,
                                                  rows=rows, fixed=attn_mask)
    args = [cst.Arg(query), cst.Arg(match.key), cst.Arg(match.value)]
    if attn_mask is not None:
        args.append(keyword("attn_mask", attn_mask))
    if match.dropout_p is not None:
        args.append(keyword("dropout_p", match.dropout_p))
    if match.is_causal:
        args.append(keyword("is_causal", cst.Name("True")))
    if match.scale is not None:
        args.append(keyword("scale", match.scale))
    return call(module, dotted(f"{functional}.scaled_dot_product_attention"), args, match.output_methods, indent)


def call(module: cst.Module, function: cst.BaseExpression, args: list[cst.Arg], steps: list[MethodStep],
         indent: int) -> cst.BaseExpression:
    """`function(args)` with `steps` called on the result, on one line, or one argument per line when it would
    pass WRAP_AT columns (as `module` writes it, at `indent`)."""
    one_line = with_methods(cst.Call(function, args), steps)
    if indent + len(module.code_for_node(one_line)) <= WRAP_AT:
        return one_line
    wrapped = [arg.with_changes(comma=cst.Comma(whitespace_after=_line_break(position < len(args) - 1)))
               for position, arg in enumerate(args)]
    return with_methods(cst.Call(function, wrapped, whitespace_before_args=_line_break(True)), steps)


def _line_break(indented: bool) -> cst.ParenthesizedWhitespace:
    """A new line inside the call's parentheses; libcst indents it to the statement, and the arguments 4 more."""
    return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace("    " if indented else ""))


def row_fixup_statements(match: AttentionMatch) -> tuple[cst.SimpleStatementLine, ...]:
    """The keep mask and its rows that keep a key, bound before the call that reads them (see `sdpa_call`)."""
    fixup = match.row_fixup
    if fixup is None or match.attn_mask is None:
        return ()
    keep = cst.Name(fixup.keep_name)
    rows = parse_template_expression("{keep}.any(-1, keepdim=True)", keep=keep)
    if fixup.conditional:  # the keep mask was bound where the original fills (see `attn_mask.assemble_mask`)
        rows = parse_template_expression("None if {keep} is None else {rows}", keep=keep, rows=rows)
        return (cst.SimpleStatementLine([assignment(fixup.rows_name, rows)]),)
    return (cst.SimpleStatementLine([assignment(fixup.keep_name, fixup.keep)]),
            cst.SimpleStatementLine([assignment(fixup.rows_name, rows)]))
