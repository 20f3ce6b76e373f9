"""Code for the attention backends `--backend` asks for, on top of the SDPA call of `sdpa_call.py`.

* `flash`: the statement holding the SDPA call runs inside `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`.
* `flash-attn`: a module-level helper calls the `flash_attn` package's `flash_attn_func` (imported with the
  module) with its (batch, seq, heads, dim) layout (q/k/v transposed in, the output transposed back) and falls
  back to the same SDPA call where the package, a CUDA tensor or a shape/dtype flash_attn takes is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.contracts.emitted_names import FLASH_HELPER_NAME
from advisor.patterns.attention import AttentionMatch
from advisor.rewrite.sdpa_call import call
from advisor.static.codegen import dotted, keyword
from advisor.static.module_index import ParsedModule
from advisor.static.opening_imports import first_code_run

KERNEL_IMPORT = "from torch.nn.attention import SDPBackend, sdpa_kernel"
HELPER_NAME = FLASH_HELPER_NAME

# imported once, with the module (an import inside the helper broke torch.compile(fullgraph=True) where the package
# is missing), under the name `flash_attn_helper` gives it
_IMPORT = '''try:
    from flash_attn import flash_attn_func as {kernel}
except ImportError:  # {name} then runs scaled_dot_product_attention
    {kernel} = None
'''
# named, and pointed at the module's spelling of torch.nn.functional, by `flash_attn_helper`
_HELPER = '''def {name}(q, k, v, dropout_p=0.0, scale=None, causal=False):
    """flash_attn_func where it can run (the package installed; 4-D float16/bfloat16 CUDA tensors of one batch
    size, head dims of at most 256, k and v of one shape with the query's heads or one), else the same SDPA call.

    flash_attn takes (batch, seq, heads, dim): q/k/v are transposed in and the output back. Its `causal` is
    aligned bottom-right, which equals SDPA's is_causal for the square attention passed here; one k/v head is
    shared by every query head (multi-query), as the original's broadcasting does. Inserted by
    `advisor fix --backend flash-attn`; advisor has not run the flash_attn path on a GPU.
    """
    if {kernel} is not None and q.is_cuda and q.dim() == k.dim() == v.dim() == 4 and \\
            q.is_floating_point() and q.element_size() == 2 and k.shape == v.shape and \\
            q.size(0) == k.size(0) and k.size(1) in (1, q.size(1)) and q.size(-1) == k.size(-1) <= 256:
        out = {kernel}(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p,
                              softmax_scale=scale, causal=causal)
        return out.transpose(1, 2)
    return {functional}.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
'''

@dataclass
class KernelNames:
    """How this module spells torch.nn.attention's sdpa_kernel and SDPBackend, and the import to add if any."""

    sdpa_kernel: str
    backend: str
    import_line: str | None  # None when the module already imports both names

    def flash_context(self) -> cst.Call:
        """`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`."""
        return cst.Call(dotted(self.sdpa_kernel), [cst.Arg(cst.Attribute(dotted(self.backend),
                                                                        cst.Name("FLASH_ATTENTION")))])


def kernel_names(parsed: ParsedModule, at: cst.CSTNode | None = None) -> KernelNames | str:
    """The spellings, or why they cannot be written (a name taken by something else). Only an import statement of
    the module's own body (not in a `try:`, a function or `if TYPE_CHECKING:`, which may bind nothing: breaker
    rounds 22 and 23, NameError) above every module-level statement that may run the module's code (a module-level
    call of the fixed function: round 24) and above the statement holding `at`, the fixed call, is reused."""
    local = _module_body_imports(parsed, at)
    kernel, backend = local.get("torch.nn.attention.sdpa_kernel"), local.get("torch.nn.attention.SDPBackend")
    if kernel and backend:
        return KernelNames(kernel, backend, None)
    taken = {name for name in ("sdpa_kernel", "SDPBackend") if parsed.names_spelled(name)}  # a `def`, a parameter
    if taken:
        return f"the name `{sorted(taken)[0]}` is already used in this module"
    return KernelNames("sdpa_kernel", "SDPBackend", KERNEL_IMPORT)


def _module_body_imports(parsed: ParsedModule, at: cst.CSTNode | None) -> dict[str, str]:
    """Dotted name -> local name of the `from X import y` statements in the module's own body above the first
    statement that may run the module's code and above `at`'s, for names no other statement binds."""
    end = min(first_code_run(parsed), parsed.top_statement_index(at) if at is not None else len(parsed.module.body))
    found: dict[str, str] = {}
    for statement in parsed.module.body[:end]:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None and \
                    not isinstance(small.names, cst.ImportStar):
                module = parsed.code(small.module)
                for alias in small.names:
                    name = alias.asname.name.value if alias.asname is not None else parsed.code(alias.name)
                    if name not in parsed.bound_names:
                        found[f"{module}.{parsed.code(alias.name)}"] = name
    return found


def helper_name(parsed: ParsedModule) -> str:
    """A module-level name for the flash_attn helper that nothing in the module uses yet (nor its kernel's)."""
    used = set(parsed.imports) | parsed.bound_names | set(parsed.module_functions)
    name, suffix = HELPER_NAME, 0
    while name in used or kernel_name(name) in used:
        suffix += 1
        name = f"{HELPER_NAME}_{suffix}"
    return name


def kernel_name(helper: str) -> str:
    """The module-level name the helper `helper` reads flash_attn_func from."""
    return f"{helper}_kernel"


def flash_attn_helper(name: str, functional: str) -> tuple[cst.Try, cst.FunctionDef]:
    """The kernel's import and the helper, module-level statements with two blank lines above each: the helper
    named `name`, its fallback calling SDPA through `functional` (how this module spells torch.nn.functional)."""
    names = dict(name=name, kernel=kernel_name(name), functional=functional)
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    return tuple(cst.parse_statement(template.format(**names)).with_changes(leading_lines=blank)
                 for template in (_IMPORT, _HELPER))


def flash_attn_call(module: cst.Module, match: AttentionMatch, name: str, indent: int) -> cst.BaseExpression:
    """`helper(q, k, v, dropout_p=..., scale=..., causal=True)`: only for sites without an attn_mask."""
    args = [cst.Arg(match.query), cst.Arg(match.key), cst.Arg(match.value)]
    if match.dropout_p is not None:
        args.append(keyword("dropout_p", match.dropout_p))
    if match.scale is not None:
        args.append(keyword("scale", match.scale))
    if match.is_causal:
        args.append(keyword("causal", cst.Name("True")))
    return call(module, cst.Name(name), args, match.output_methods, indent)
