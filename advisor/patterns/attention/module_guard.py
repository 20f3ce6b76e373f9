"""Guarded `module-identity` and `no-hooks`: a patch deletes module calls (`attn = self.attn_drop(attn)`), which is
exact only where each module is, when the code runs, a class whose call the emitted code stands for (the Dropout
`__init__` builds, whose `p` and `training` the SDPA call reads at run time) and no hook would fire on it. Both are
metadata, so the patch checks them (`_advisor_module_runs_plain(self.attn_drop, (torch.nn.Dropout,))`: the exact
class, no subclass, and none of the module's or the process's forward and backward hooks) and runs the original
block where the check fails.

The check runs before the guarded `if` as `ok = False` / `if not torch.jit.is_scripting(): ok = <check>`:
TorchScript compiles neither a module passed to a function nor `type(...)`, but skips the body of that `if`, so a
scripted patch always runs the original (exact). Under `torch.compile` the check breaks no graph; dynamo guards on
the hooks it reads where it guards on module hooks at all (`skip_nnmodule_hook_guards=False`), and otherwise
ignores a hook added after compiling in the original too.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.contracts.emitted_names import GUARD_BUILTINS, MODULE_CHECK_HELPER, MODULE_CHECK_LOCAL
from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.result import MaskTerm
from advisor.patterns.ops import int_value
from advisor.static.codegen import dotted

MODULE_IDENTITY, NO_HOOKS = "module-identity", "no-hooks"
MODULE_FACTS = (MODULE_IDENTITY, NO_HOOKS)
# torch's module classes whose deleted call the emitted code stands for, whatever their state when they run
DROPOUT = frozenset({"torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"})
IDENTITY = frozenset({"torch.nn.Identity", "torch.nn.modules.linear.Identity"})
SOFTMAX = frozenset({"torch.nn.Softmax", "torch.nn.modules.activation.Softmax"})


def module_kinds(c: Candidate, attribute: str) -> tuple[str, ...] | None:
    """The classes (as `nn.X`) for which the patch computes what a call of `self.<attribute>` computes: a Dropout
    the class builds (its `p` and `training` read when the SDPA call runs; also an Identity where the patch reads
    `p` with a default), an Identity (a hook point: nothing to compute), either for a conditional build
    (`nn.Dropout(p) if p else nn.Identity()`), a Softmax (its `dim` is read from the constructor: another Softmax
    in its place may differ, so where something may rebind it, only a literal dim the check compares); for a bias
    module whose term the patch reads on it (`module_terms`), the classes the term is read for, as this file names
    them. None for anything else."""
    bias = bias_module_classes(c, attribute)
    if bias is not None:
        return bias
    built = _built_classes(c, c.owner.class_value(attribute) if c.owner is not None else None)
    if built is None or "nn.Softmax" in built and (len(built) > 1 or c.owner.rebound(attribute) is not None and
                                                   softmax_dim(c, attribute) is None):
        return None
    if "nn.Dropout" in built and attribute in c.identity_ok:
        built.add("nn.Identity")
    return tuple(kind for kind in ("nn.Dropout", "nn.Identity", "nn.Softmax") if kind in built)


def is_bias_module(c: Candidate, attribute: str) -> bool:
    """`self.<attribute>` is a bias module whose term the patch adds in place of its call (`module_terms`)."""
    return _bias_term(c, attribute) is not None


def bias_module_classes(c: Candidate, attribute: str) -> tuple[str, ...] | None:
    """The classes of such a module the term is read for; None where it is none, or where the name of one could
    mean something else in the function the check runs in."""
    term = _bias_term(c, attribute)
    names = term.module[1] if term is not None else ()
    return names if names and not any(c.parsed.mentions(c.home, name.lower()) for name in names) else None


def _bias_term(c: Candidate, attribute: str) -> MaskTerm | None:
    masks = c.match.masks if c.match is not None else ()
    return next((term for term in masks if term.module is not None and term.module[0] == attribute), None)


def _built_classes(c: Candidate, built: cst.BaseExpression | None) -> set[str] | None:
    if isinstance(built, cst.IfExp):
        sides = [_built_classes(c, side) for side in (built.body, built.orelse)]
        return None if None in sides else sides[0] | sides[1]
    dotted = c.parsed.imported_name(built.func) if isinstance(built, cst.Call) else None
    for kind, names in (("nn.Dropout", DROPOUT), ("nn.Identity", IDENTITY), ("nn.Softmax", SOFTMAX)):
        if dotted in names:
            return {kind}
    return None


def softmax_dim(c: Candidate, attribute: str) -> cst.BaseExpression | None:
    """The integer literal an `nn.Softmax(dim)` the class builds is given (`-1` of `nn.Softmax(dim=-1)`)."""
    built = c.owner.class_value(attribute)
    if not isinstance(built, cst.Call):
        return None
    given = [arg.value for arg in built.args if arg.keyword is not None and arg.keyword.value == "dim"] or \
        [arg.value for arg in built.args[:1] if arg.keyword is None and not arg.star]
    return given[0] if given and int_value(given[0]) is not None else None


def module_checks(c: Candidate, torch_name: str) -> tuple[list[cst.BaseExpression], list[cst.BaseExpression]]:
    """(what the checks read, one `_advisor_module_runs_plain(self.x, (torch.nn.X,))` per deleted module call), or
    two empty lists where a module's classes are unknown or the emitted names could mean something of the user's."""
    modules = list(c.deleted_modules.values())
    if not modules or any(classes is None for _, classes in modules) or not emitted_names_free(c):
        return [], []
    parts = []
    for attribute, (read, classes) in c.deleted_modules.items():
        part = cst.Call(cst.Name(MODULE_CHECK_HELPER), [
            cst.Arg(read), cst.Arg(cst.Tuple([cst.Element(dotted(f"{torch_name}.{kind}" if kind.startswith("nn.")
                                                                 else kind)) for kind in classes]))])
        dim = softmax_dim(c, attribute) if classes == ("nn.Softmax",) else None
        if dim is not None:  # `... and self.softmax.dim == -1`: read only once the module is exactly a Softmax
            part = cst.BooleanOperation(part, cst.And(), cst.Comparison(cst.Attribute(read, cst.Name("dim")), [
                cst.ComparisonTarget(cst.Equal(), dim)]))
        if "nn.Dropout" in classes and c.owner is not None and c.owner.written_outside("p", any_class=True):
            part = cst.BooleanOperation(part, cst.And(), _dropout_range_check(read, "nn.Identity" in classes))
        if called_only_if_not_none(c, attribute, read):  # `self.rel_pos is None or ...`: no call to stand for
            part = cst.BooleanOperation(cst.Comparison(read, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
                                        cst.Or(), part)
        parts.append(part)
    return [read for read, _ in modules], parts


def _dropout_range_check(module: cst.BaseExpression, maybe_identity: bool) -> cst.BaseExpression:
    """`isinstance(m.p, (int, float)) and 0.0 <= m.p <= 1.0`: a Dropout's call checks its `p` (even where it does not
    train), which code may set after `__init__` checked it (breaker round 29: `m.p = 10` raised in the original
    only). An Identity in its place has no `p`: read with a default there."""
    p = cst.Call(cst.Name("getattr"), [cst.Arg(module), cst.Arg(cst.SimpleString('"p"')), cst.Arg(cst.Float("0.0"))]) \
        if maybe_identity else cst.Attribute(module, cst.Name("p"))
    return parse_template_expression("isinstance({p}, (int, float)) and 0.0 <= {p} <= 1.0", p=p)


def called_only_if_not_none(c: Candidate, attribute: str, read: cst.BaseExpression) -> bool:
    """A bias module called only under `if self.<attribute> is not None:`: where it is None the block runs no call
    of it, and the patch reads its term on the same path only."""
    term = _bias_term(c, attribute)
    test = term.guard.test if term is not None and term.guard is not None else None
    return isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
        isinstance(test.comparisons[0].operator, cst.IsNot) and \
        c.parsed.code(test.comparisons[0].comparator) == "None" and \
        c.parsed.code(test.left).replace(" ", "") == cst.Module([]).code_for_node(read).replace(" ", "")


# what a module's call runs on besides its class: written on any module reached otherwise than through the class
# (`for m in model.modules(): m.forward = f`, `sm = m.softmax; sm.dim = -2`), it may change the deleted call
MODULE_CALL_STATE = ("forward", "__call__", "__class__")


def module_state_written(owner, kinds: tuple[str, ...]) -> str | None:
    """Why a module call may run other code than its class's: the file (or the tree) writes `forward`, `__call__`,
    `__class__` (or, for a Softmax, `dim`; for a Dropout, `p`, which its call checks: breaker round 29) on some
    object, which may be that module."""
    for name in MODULE_CALL_STATE + (("dim",) if "nn.Softmax" in kinds else ()) + \
            (("p",) if "nn.Dropout" in kinds else ()):
        # narrowed writes count: `if isinstance(m, nn.Softmax): m.dim = -2` is about such modules exactly
        written = owner.written_outside(name, any_class=True)
        if written is not None:
            return f"`.{name}` is assigned on some object in {owner.writer(written)}, which may be this module"
    return None


def is_module_check(part: cst.BaseExpression) -> bool:
    if isinstance(part, cst.BooleanOperation):
        return is_module_check(part.left) or is_module_check(part.right)
    return isinstance(part, cst.Call) and isinstance(part.func, cst.Name) and part.func.value == MODULE_CHECK_HELPER


def emitted_names_free(c: Candidate) -> bool:
    """The helper's name is unbound in the module, or bound to the helper a previous pass emitted; the local's
    name is unused in the function."""
    helper = c.parsed.module_functions.get(MODULE_CHECK_HELPER)
    bound = MODULE_CHECK_HELPER in c.parsed.bound_names or MODULE_CHECK_HELPER in c.parsed.imports
    return (helper is not None or not bound) and not c.parsed.mentions(c.home, MODULE_CHECK_LOCAL) and \
        c.parsed.builtins_intact(GUARD_BUILTINS)

