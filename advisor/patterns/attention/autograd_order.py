"""The `first-order-autograd` fact: SDPA's fused kernels (CPU flash; CUDA flash and efficient) have no double
backward and no forward-mode derivative, while the eager block and SDPA's math kernel have both. Measured on torch
2.13 CPU: after the rewrite, `autograd.grad(..., create_graph=True)` through the block raises RuntimeError
("derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"), and forward AD,
`torch.func.jvp`, `jacfwd` and `hessian` raise NotImplementedError. Forcing the math kernel would keep them working
but is slower than the eager block itself (1.8x at B=4 H=8 L=256 D=64 on one CPU thread), so where the tree asks for
them the patch is unsafe instead, unless no fused kernel can take the call (3-D inputs: heads folded into the
batch), which then runs the math kernel everywhere."""

from __future__ import annotations

from advisor.backends.eligibility import Verdict
from advisor.contracts.finding import display_path
from advisor.patterns.facts import FactSheet
from advisor.static.tree_facts import TreeFacts

STATEMENT = ("the block is differentiated in first-order reverse mode only (SDPA's fused kernels have no double "
             "backward and no forward-mode derivative)")
MATH_KERNEL = "sdpa-math"
FLEX = "flex"  # not an SDPA kernel; a flex patch (no double backward either) is judged with no SDPA verdicts


def autograd_order_fact(facts: FactSheet, tree: TreeFacts, verdicts: dict[str, Verdict]) -> None:
    """Record the fact; `verdicts` are the call's backend eligibility (advisor.backends)."""
    if not tree.autograd:
        files = "the scanned file" if tree.files == 1 else f"the {tree.files} scanned files"
        facts.proved("first-order-autograd", STATEMENT,
                     f"nothing in {files} asks for double backward or forward-mode AD{_passed_on(tree)}")
        return
    fused = [verdict for name, verdict in verdicts.items() if name not in (MATH_KERNEL, FLEX)]
    if fused and all(verdict.eligible is False for verdict in fused):
        facts.proved("first-order-autograd", STATEMENT,
                     f"no fused kernel takes this call ({fused[0].reason}), and SDPA's math kernel has double "
                     "backward and forward-mode derivatives")
        return
    first = tree.autograd[0]
    more = f", and {len(tree.autograd) - 1} more" if len(tree.autograd) > 1 else ""
    where = f" at {display_path(first.path)}:{first.line}" if first.path is not None else ""
    facts.assumed("first-order-autograd", STATEMENT, f"{first.what}{where}{more}")


def _passed_on(tree: TreeFacts) -> str:
    """The sites that only pass on their function's `create_graph` parameter, which no call of the tree reaches."""
    if not tree.passed_on:
        return ""
    first = tree.passed_on[0]
    more = f" and {len(tree.passed_on) - 1} more" if len(tree.passed_on) > 1 else ""
    return (f" (`create_graph` at {display_path(first.path)}:{first.line}{more} passes on a parameter, off by "
            f"default, of `{first.caller_decides}`, which nothing in them uses)")
