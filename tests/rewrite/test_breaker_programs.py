"""Programs breaker round 20 wrote against the `kv-length` proof (fixtures/attention/breaker20: each defines `run()`,
which raises in the original because its keys and values differ in length, or feeds a patch another rank): every
safe patch must raise where the original raises and give its values where it does not. They were safe patches
that returned values after the fix (SDPA's CPU kernels read past v) before the proof learned: a helper's own
sizes differ per call, a guessed number may be a tensor, `torch.cat` skips a legacy empty tensor, dim 0 and axis
-4 are one axis of a 4-D tensor, torch's `axis=` spelling, in-place shape changes and hooks anywhere in the file,
`global`/`nonlocal` names, subclasses redefining a helper or a layer, lists changed in place, starred and nested
targets, nested tensors, a 1-D v the check's slice reads, a permute the patch undoes, a baddbmm input of another
dtype.

Round 21 (fixtures/attention/breaker21) aimed at the proof's residuals and beyond: a helper of another file
resizing the context or a script hooking the value layer (tree_01, tree_02: scanned as a tree, as the user would),
`torch.utils.swap_tensors` and `setattr(t, "data", ...)`, a layer's forward replaced through `__dict__.update`, a
dropped baddbmm input of another shape, a rebinding in a loop's body that reaching definitions alone do not show
(the guard's place, the operands between the scores and the value product), an imported `sdp_kernel` shadowed by a
nested function, and ADV601's eager-to-sdpa switch under double backward or restricted SDPA kernels.

Round 22 (fixtures/attention/breaker22): code that runs between the scores and the value product unseen (a
`yield`, a callback), an `sdp_kernel` rewrite reusing an import that binds only in another function or under
`if TYPE_CHECKING:`, a float64 mask with float32 q, k, v (the original raises), and the copy and cast rewrites
under a `__torch_function__` subclass.

Round 23 (fixtures/attention/breaker23): hooks and replaced torch classes behind a kept torch.nn call between the
scores and the value product, a method replaced from another file, a base class of another file overriding an
nn.Module method, `F.dropout` replaced by another file under an `nn.Dropout` the length proof reads, an
`sdp_kernel` rewrite reusing an import in a `try:` or below the call, and divisors computed from sizes that are 0
on inputs that are not empty. Outputs may be NaN in both (equal where they are).

Round 24 (fixtures/attention/breaker24): a rewrite reusing an import (`torch` for ADV304's `dtype=`, `F` for the
SDPA call, `sdpa_kernel` for ADV701) that binds below a module-level call of the fixed function: the patched
module raised NameError on import.

Round 25 (fixtures/attention/breaker25): a guarded patch whose test calls `q.is_floating_point()` (q and k cast,
v not) was not read back as a guard, so each fix round rewrote the kept original again (16 nested copies a run);
every program's patched text must now offer no fix.

Round 26 (fixtures/attention/breaker26): module code run at import through `globals()[...]`, `builtins.exec`, a
lambda called at once and an Enum's members (the reused late import raised NameError), and ADV201's proof from the
statement before looking past a walrus, a property's getter or a `yield` in the reading statement, and a
scale `torch.tensor(v, dtype=torch.bfloat16)` read as v although the tensor holds v rounded.

Round 27 (fixtures/attention/breaker27): a function or method called between the scores and the value product whose
decorator wraps it in code writing its argument in place, a `staticmethod` whose arguments bind without `self`,
and a function another file of the tree assigns over (`attn.note = doubled`): the analysis read the body as
written (found in review); then a helper's round: a call writing q whose result is assigned or that is itself an
argument (`s = stat(q)`, `list(map(lambda t: t.mul_(2), (q, k)))`), a random draw between the dropout and the
value product, a causal buffer written through `m.buffers()` by `+=`, `out=` or unpacking, `fn = torch.func;
fn.jvp(...)`, `torch.zeros_like(y)` keeping SDPA's strides for a later `.view`, and `ns = self.__dict__;
ns["q"] = ...` rebinding what SDPA re-reads.

Round 28 (fixtures/attention/breaker28), aimed at round 27's fixes: a helper's parameter aliased by a loop, a
comprehension, `:=` or a `match` capture, written through `(t if c else None)` or `(t,)[0]`, by
`torch.utils.swap_tensors` or `torch.ops.aten.mul_`; draws on the dropout's or the value product's own line, or by
`gumbel_softmax`, `binomial`, `nn.init`; buffers written by `nn.init.ones_(b)` or `_foreach_add_` over
`m.buffers()`; the output read through `(None or y)` or a `match` capture before a `.view`. Its review
(`b28_review_*`): code a builtin runs for what it is given (`map(draw, ...)`, `max(..., key=noisy)`) and generators
made earlier, a caller's among them, iterated between the dropout or the scores and the value product.

Round 29 (fixtures/attention/breaker29): a Dropout's `p` set after `__init__` (10 by a loop over `model.modules()`,
None from a config): the original's call checks it even in eval and raises, the patch ran.

Round 30 (fixtures/attention/breaker30): code run between the dropout or the scores and the value product
without a call there: a generator emptied by unpacking, a property of the class, a generator expression made
before that writes q in place, a `with` whose `__enter__` draws; a model traced by torch.fx in training mode and
run in eval (the patch's dropout flag was taken once while tracing).

Round 31 (fixtures/attention/breaker31): a guarded patch traced by make_fx, which runs the checks on tensors once
and kept the SDPA path for a 1-D mask the original broadcasts.

Round 32 (fixtures/attention/breaker32): an in-place sampler over the attention output (its memory order), an aten
overload's `.view`, a dropout or an in-place dropout inside the value product's operands (draw order; a write of
k through v), fractional max pooling drawing between the dropout and the value product.

Round 33 (fixtures/attention/breaker33): torch's own callees between the dropout and the value product that draw or
read the generator (a container or a layer holding a dropout, a second SDPA, a layer built there, a sampler, the
generator's state, a checkpointed function, a generator consumed by `torch.Size`), `F.relu(qkv, True)` writing q
and k by position, a hook stored by `_forward_hooks.update`, a transforms module named in a setting, a `match`
capture rebinding a module-level scale, the scores written into `out=`, and a flag read through a counting
property.

Round 34 (fixtures/attention/breaker34), aimed at round 33's fixes and the zeroed rows: a zeroing mask drawn twice
(`torch.rand(...) > 0.5` in both fills), a zeroing after the weights are transposed, a finite fill float16 cannot
hold (the original raises), an aten overload that draws (`torch.ops.aten.rand.default`), the default generator's
state read, a draw in a method of the file's own class under a tensor method's name (`JIT.add`), functional calls
that take a dropout (`F.multi_head_attention_forward`), and `t.apply_(draw_one)`.

Round 35 (fixtures/attention/breaker35): the weights zeroed or dropped out in place (`masked_fill_`,
`nn.Dropout(p, inplace=True)`, `F.dropout(..., inplace=True)`: the original's backward raises), `torch.svd_lowrank`
drawing two calls down in torch's Python code, a dropout called through its class (`nn.Dropout.forward(m, v)`), and
a function of another file reached by `getattr(impls, "attend_" + kind)` with a caller's mask (tree_06).

Round 36 (fixtures/attention/breaker36), aimed at round 35's fixes and the session's proofs: a keep mask read out
of a dict union (`DEFAULTS | extras` is no bitwise mask), an out-of-place `masked_fill` that broadcasts the mask it
fills up a rank, a dropout in place by unpacked arguments (`nn.Dropout(**{"inplace": True})`), a draw in a method
of an object a factory function of the file makes, and `operator.attrgetter("attend_" + kind)(impls)` (tree_05).

Round 37 (fixtures/attention/breaker37): a submodule replaced between the dropout and the value product through an
alias of its module's `_modules` (a name, or `:=` of `getattr(m, "_modules")`) or turned into a dropout by a
`__class__` assignment on what `get_submodule` returns, and a method returning its weights called by a computed name
(`getattr(m, name)` with `name` from `dir(m)`, tree_05; `getattr(m, "att" + "end")`, tree_06), whose weights the
patch dropped.

Round 38 (fixtures/attention/breaker38), aimed at round 37's fixes and the rank proofs that survive listings: a
buffer's rank or values changed by `torch.Tensor.data.__set__` (tree_01, tree_02), a listing's tensor reached through
`:=` out of a comprehension, a generator stored in a name, or `next()` of a name, the module's `_modules` reached by
`__getstate__`, `attrgetter` or `__reduce_ex__` (tree_08, tree_10, tree_12), and a method whose weights every visible
caller drops reached by `inspect.getmembers` or `vars(Attn)` (tree_13, tree_14).

Round 39 (fixtures/attention/breaker39), aimed at the may-share-storage reading of torch functions imported by name:
an einsum of one operand (a view) and a dropout that drops nothing (its input), written between the scores and
the value product; an imported name given back to the builtin by `del`, rebound by a later import or through
`globals()`; and q written through a global a helper of the file writes, or an enclosing function's name.

Round 40 (fixtures/attention/breaker40), aimed at the outer-name and listing checks: q written by `+=` on a global
name or an attribute, through `builtins`, a global view of the tensor the inputs come from, a method of the class or
a helper given the object holding it, or behind a lambda's parameter of the same name; code no call shows run
between the scores and the value product (a property, `__setattr__`, `__repr__` under `print`, `__index__`, a
decorator, a class statement, `del` running `__del__`); a staticmethod named `norm` returning its input; an
einsum's sublist form of one operand; `m._apply`, and a helper or `map(partial(...))` given `m.buffers()`, changing a
causal buffer; weights read through `getattr` as a value or `eval` of a joined string; a scale rebound through a
frame's `f_globals`.

Round 41 (fixtures/attention/breaker41), aimed at round 40's fixes and this stop's reach: a computed mask under
another default dtype, flushed denormals or a replaced `torch.full`; an `eval()` that does not return the module and
`nn.Module.__call__` replaced, under call-site facts through a local instance; a property of a parameter's or an
imported object read between the products, `print` (of an object, or to a replaced `sys.stdout`), an import, and a
rebinding that drops an object with `__del__` there; `sorted(..., key=partial(...))` over buffers and
`m.apply(partial(nn.Module.register_buffer, ...))`.

Round 42 (fixtures/attention/breaker42), against computed module-level masks: a method of the program's own object
named like a tensor method (`P.where(MASK)`) or an operator reaching its dunder (`MASK in P`, tree_02) writing the
mask, a snapshot taken between a mask's build steps (tree_04), `torch.utils.checkpoint` running the program's code
between them (tree_06); and a forward's output written in place by a module-level caller of the file (tree_07: SDPA's
saved output, a view after `transpose(1, 2).reshape(...)`, made the patch's backward raise).

Round 43 (fixtures/attention/breaker43): -inf written into an `nn.Embedding` relative-position table through a helper
of another file handed its weight (tree_01) and through `m.named_parameters()` (tree_02), where the table had been
read as a learned one; the row the causal mask kept only at that entry was zeroed by the patch.

Round 44 (fixtures/attention/breaker44): names bound again after their import: a star import of a tree module
binding its own `softmax` (tree_01) or `float` (tree_02: the scale, and a guard's `isinstance(s, (int, float))`),
the same run by `exec` (tree_03), a second import of `softmax` at module level (tree_04) or in the function (tree_05);
a double backward through `Variable._execution_engine.run_backward` (b44_06); a comparison written into a float
`out=` buffer (tree_06) or viewed as float64 bytes (`.view(torch.float64)`, tree_07), read as the bool mask a
caller passes.

Round 45 (fixtures/attention/breaker45), aimed at round 44's star imports: `__all__` extended after its literal
(`.append`, `+=` in a `try:`, tree_01, tree_02), a module-level name bound by a function's `global` (tree_03),
`globals().update(vars(helpers))` (tree_04), `exec` called through another name (tree_05), and a package's star
import binding a loaded submodule (tree_06).

Round 46 (fixtures/attention/breaker46): reads of the scores' shape or dtype translated to read Q and K where Q
and K are no longer what the product read (rebound after the value product, transposed in place, a size check in a
lambda called later: b46_01 to b46_03), a dtype read after a cast step of the scores (b46_04), the module's names
rebound through a computed `__globals__` (b46_05), and a computed `__all__` that would export the `F` a patch
imports (tree_06).

Round 47 (fixtures/attention/breaker47): bmm and baddbmm blocks whose q, k and v have other batch sizes (a batch of
1 against 6, which bmm rejects and SDPA broadcasts), with a size check, with ranks stated by reshapes, and with a
matmul score product before a bmm value product.

Round 48 (fixtures/attention/breaker48): a batch size passed as an object whose `__index__` answers each reshape
anew (b48_01: a size term of a name is a size only where the name is proved a number), reads of the scores' size
translated to a sum that a slice or `.numel()` after them split (b48_02 to b48_04), and `math.sqrt` replaced by a
helper of the tree under a scale read as SDPA's default (tree_04).

Round 49 (fixtures/attention/breaker49): F.dropout's training flag given as an int (b49_01: F.dropout raises), and
torch's and math's functions replaced by routes the writes reader did not follow: a helper handed the module
(tree_01), a loop over a literal holding it (tree_02), `setattr` under another name (tree_03), `unittest.mock.patch`
by a dotted string (tree_04), a module imported by a computed name (tree_05), and the caller's `F` rebound through
its frame's globals (tree_06).

Round 50 (fixtures/attention/breaker50): a dropout training flag given as a comparison of tensors (b50_01: a
tensor, which F.dropout rejects), and a torch.Tensor subclass overriding `transpose` with no `__torch_function__`
(b50_02: the original runs it, SDPA does not)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import load_module_from_source
from torch_state import torch_restored

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "attention"
PROGRAMS = sorted(FIXTURES.glob("breaker[2-5][0-9]/*.py"))
TREES = sorted(path for path in FIXTURES.glob("breaker[2-5][0-9]/tree_*") if path.is_dir())


@pytest.fixture(autouse=True)
def _torch_as_it_was():
    """Round 23's programs replace torch's classes and functions and register global hooks."""
    with torch_restored():
        yield


def _outcome(module):
    try:
        return module.run()
    except Exception as error:  # noqa: BLE001 - what a caller sees, whatever it is
        return type(error)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_a_safe_patch_raises_where_the_original_raises_and_keeps_its_values(path):
    source = path.read_text(encoding="utf-8")
    fixed = analyze_source(source, path.name).fixed
    assert analyze_source(fixed, path.name).fixed == fixed  # idempotent: the patched text offers no fix
    original = _outcome(load_module_from_source(source, f"{path.stem}_original"))
    patched = _outcome(load_module_from_source(fixed, f"{path.stem}_patched"))
    if isinstance(original, type) or isinstance(patched, type):
        assert isinstance(original, type) and isinstance(patched, type), (original, patched)
    else:
        torch.testing.assert_close(patched, original, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("tree", TREES, ids=lambda p: p.name)
def test_a_tree_patched_as_scanned_raises_where_the_original_raises(tree, tmp_path, monkeypatch):
    """The tree's files scanned together (what `advisor fix DIR` patches), each run from its own folder."""
    outcomes = []
    for side in ("original", "patched"):
        folder = tmp_path / side
        shutil.copytree(tree, folder)
        if side == "patched":
            for result in scan_paths([str(folder)], cache=False).files:
                if result.fixed is not None and result.fixed != result.source:
                    Path(result.path).write_text(result.fixed, encoding="utf-8")
        # the tree's modules and packages (round 45's `b45_pkg`), and their submodules, leave no trace for later tests
        names = [path.stem for path in folder.glob("*.py")] + [path.parent.name for path in folder.glob("*/__init__.py")]
        with monkeypatch.context() as patch:
            patch.syspath_prepend(str(folder))
            for name in [n for n in sys.modules if n.split(".")[0] in names]:
                patch.delitem(sys.modules, name, raising=False)
            program = (folder / "program.py").read_text(encoding="utf-8")
            outcomes.append(_outcome(load_module_from_source(program, f"{tree.name}_{side}")))
            for name in [n for n in sys.modules if n.split(".")[0] in names]:
                sys.modules.pop(name, None)
    original, patched = outcomes
    if isinstance(original, type) or isinstance(patched, type):
        assert isinstance(original, type) and isinstance(patched, type), (original, patched)
    else:
        torch.testing.assert_close(patched, original, rtol=1e-4, atol=1e-5, equal_nan=True)
