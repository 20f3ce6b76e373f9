"""The replacement call for one proved attention block, and the import it may need."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from advisor.patterns.attention import AttentionMatch
from advisor.static.module_index import ParsedModule

WRAP_AT = 100


@dataclass
class FunctionalName:
    prefix: str  # how this module spells torch.nn.functional: "F", "nn.functional", "torch.nn.functional"
    import_line: str | None  # an import to add when the module has no spelling for it


def functional_name(parsed: ParsedModule) -> FunctionalName:
    aliases = parsed.module_aliases
    if "torch.nn.functional" in aliases:
        return FunctionalName(aliases["torch.nn.functional"], None)
    if "torch.nn" in aliases:
        return FunctionalName(f"{aliases['torch.nn']}.functional", None)
    if "torch" in aliases:
        return FunctionalName(f"{aliases['torch']}.nn.functional", None)
    taken = "F" in parsed.words  # crude but conservative: any token "F" means the name may be used
    if not taken:
        return FunctionalName("F", "import torch.nn.functional as F")
    if "torch" not in parsed.bound_names:
        return FunctionalName("torch.nn.functional", "import torch.nn.functional")
    fresh = next(f"F{n}" for n in itertools.count(2) if f"F{n}" not in parsed.words)  # `torch` is rebound too
    return FunctionalName(fresh, f"import torch.nn.functional as {fresh}")


def sdpa_call(match: AttentionMatch, functional: str, indent: int) -> str:
    """`F.scaled_dot_product_attention(q, k, v, ...)` with only the arguments that differ from defaults."""
    args = [match.query, match.key, match.value]
    if match.attn_mask is not None:
        args.append(f"attn_mask={match.attn_mask}")
    if match.dropout_p is not None:
        args.append(f"dropout_p={match.dropout_p}")
    if match.is_causal:
        args.append("is_causal=True")
    if match.scale is not None:
        args.append(f"scale={match.scale}")
    return call_text(f"{functional}.scaled_dot_product_attention", args, match.output_suffix, indent)


def call_text(function: str, args: list[str], suffix: str, indent: int) -> str:
    """`function(args)suffix` on one line, or one argument per line when it would pass WRAP_AT columns."""
    one_line = f"{function}(" + ", ".join(args) + ")" + suffix
    if indent + len(one_line) <= WRAP_AT:
        return one_line
    # libcst re-indents continuation lines to the enclosing block, so indent relative to the statement
    return f"{function}(\n" + "".join(f"    {arg},\n" for arg in args) + ")" + suffix
