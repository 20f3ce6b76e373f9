"""Guarded `module-identity` and `no-hooks`: a patch that deletes a module call (`attn = self.attn_drop(attn)`)
takes the SDPA path only where that module is, when the code runs, exactly the class `__init__` builds with no
hook of its own or of the process, and runs the original block otherwise. Both facts are metadata, so the check is
exact for every input: hooks registered after construction fire as in the original, a module swapped at run time
(`model.apply`, `setattr` by a computed name, a subclass, an Identity) computes what the original computes, and
the finding is safe without `--unsafe-fixes`.

Each tree below is a model file and a utility file of the same scan that registers hooks and swaps submodules by
computed names (timm's `FeatureHooks` and `setattr` helpers), which made both facts assumed before.
"""

from __future__ import annotations

import functools
import shutil
import textwrap

import pytest
import torch

import advisor
from advisor.engine.static import scan_paths
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa
from fuzz.differential import global_module_hooks

MODEL = '''\
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.attn_drop = nn.Dropout(0.1)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * 0.25
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))
'''

UTILS = '''\
import torch.nn as nn


class Half(nn.Module):
    def forward(self, x):
        return x * 0.5


def swap(module):
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Dropout):
            setattr(module, name, Half())


def watch(model, seen):
    return model.attn_drop.register_forward_hook(lambda m, a, o: seen.append(o))
'''


def _tree(tmp_path, model: str = MODEL, utils: str = UTILS):
    original = tmp_path / "original"
    original.mkdir()
    (original / "model.py").write_text(model, encoding="utf-8")
    (original / "utils.py").write_text(utils, encoding="utf-8")
    return original


def _finding(folder):
    [finding] = [f for f in scan_paths([str(folder)], jobs=1).findings if f.kind == "attention"]
    return finding


def _patched(tmp_path, original):
    patched = tmp_path / "patched"
    shutil.copytree(original, patched)
    advisor.fix(str(patched), apply=True, cache=False)
    return (patched / "model.py").read_text(encoding="utf-8")


@pytest.fixture
def pair(tmp_path):
    """(original module, patched module) of the tree, the patch written by `fix --apply` without unsafe fixes."""
    original = _tree(tmp_path)
    fixed = _patched(tmp_path, original)
    assert fixed != MODEL
    return load_module_from_source(MODEL, "model"), load_module_from_source(fixed, "model_fixed")


def _models(pair, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    original = pair[0].Attn().to(dtype).eval()
    patched = pair[1].Attn().to(dtype).eval()
    patched.load_state_dict(original.state_dict())
    return original, patched


def _run(model, x):
    """Output and input gradient of one forward and backward on a copy of `x`."""
    x = x.clone().requires_grad_(True)
    out = model(x)
    out.square().sum().backward()
    return out.detach(), x.grad


def test_the_finding_is_safe_with_both_facts_guarded(tmp_path) -> None:
    finding = _finding(_tree(tmp_path))
    assert finding.fix_safety == "safe", finding.reason
    guarded = {fact["name"]: fact["why"] for fact in finding.extra["facts"].get("guarded", [])}
    assert set(guarded) >= {"module-identity", "no-hooks"}
    for why in (guarded["module-identity"], guarded["no-hooks"]):
        assert "_advisor_module_runs_plain(self.attn_drop, (torch.nn.Dropout,))" in why
    assert not finding.extra["facts"]["assumed"]
    assert "if not torch.jit.is_scripting():" in finding.patch


def test_without_hooks_the_patch_runs_sdpa_with_the_original_values_and_gradients(pair) -> None:
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        original, patched = _models(pair, dtype)
        x = torch.randn(2, 6, 16, dtype=dtype)
        (out, grad), (out_p, grad_p) = _run(original, x), _run(patched, x)
        torch.testing.assert_close(out_p, out, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(grad_p, grad, atol=tolerance, rtol=tolerance)
        for name, parameter in original.named_parameters():
            torch.testing.assert_close(patched.get_parameter(name).grad, parameter.grad, atol=tolerance,
                                       rtol=tolerance)
        assert uses_sdpa(dispatched_ops(patched, (x,)))


HOOKS = {
    "forward": lambda m, seen: m.register_forward_hook(lambda mod, a, o: seen.append(o.sum()) or o * 0.5),
    "forward_pre": lambda m, seen: m.register_forward_pre_hook(lambda mod, a: seen.append(a[0].sum()) or
                                                               (a[0] * 0.5,)),
    "full_backward": lambda m, seen: m.register_full_backward_hook(lambda mod, gi, go: seen.append(go[0].sum()) or
                                                                   (gi[0] * 0.5,)),
    "full_backward_pre": lambda m, seen: m.register_full_backward_pre_hook(lambda mod, go: seen.append(go[0].sum())
                                                                           or (go[0] * 0.5,)),
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_hook_registered_after_construction_fires_as_in_the_original(pair, hook: str) -> None:
    original, patched = _models(pair)
    x = torch.randn(2, 6, 16)
    before = _run(patched, x)
    seen_original, seen_patched = [], []
    HOOKS[hook](original.attn_drop, seen_original)
    HOOKS[hook](patched.attn_drop, seen_patched)
    expected, got = _run(original, x), _run(patched, x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(seen_patched) == len(seen_original) == 1
    torch.testing.assert_close(seen_patched[0], seen_original[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got[1], before[1])  # the hook changed something, so the comparison tells


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward"])
def test_a_global_module_hook_fires_as_in_the_original(pair, kind: str) -> None:
    from torch.nn.modules import module
    register = {"forward": module.register_module_forward_hook,
                "forward_pre": module.register_module_forward_pre_hook,
                "full_backward": module.register_module_full_backward_hook}[kind]
    original, patched = _models(pair)
    x = torch.randn(2, 6, 16)
    expected, got = {}, {}
    for model, seen in ((original, expected), (patched, got)):
        with global_module_hooks():
            def on_dropout(mod, *args, seen=seen):
                if isinstance(mod, torch.nn.Dropout):
                    seen[kind] = seen.get(kind, 0) + 1
            register(on_dropout)
            seen["run"] = _run(model, x)
    assert got.get(kind) == expected.get(kind) == 1
    torch.testing.assert_close(got["run"], expected["run"])


class Doubling(torch.nn.Dropout):
    def forward(self, x):
        return x * 2.0


SWAPS = {
    "apply_by_computed_name": lambda model, utils: model.apply(utils.swap),
    "setattr_by_computed_name": lambda model, utils: setattr(model, "_".join(["attn", "drop"]), utils.Half()),
    "dropout_subclass": lambda model, utils: setattr(model, "attn_drop", Doubling(0.1)),
    "identity_in_training_mode": lambda model, utils: setattr(model, "attn_drop", torch.nn.Identity()),
    "forward_replaced_on_the_instance": lambda model, utils: setattr(model.attn_drop, "forward", lambda x: x * 0.5),
    # a thirteenth breaker's: `nn.Module.__call__` runs the call implementation it finds on the instance
    "call_impl_set_on_the_instance": lambda model, utils: setattr(model.attn_drop, "_call_impl", lambda x: x * 0.5),
    "compiled_call_impl_set_on_the_instance": lambda model, utils: setattr(model.attn_drop, "_compiled_call_impl",
                                                                           lambda x: x * 0.5),
}


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_a_module_swapped_at_run_time_gives_the_original_values(pair, swap: str) -> None:
    """The patch read `self.attn_drop.p` of whatever the attribute held (an Identity has none: AttributeError) or
    skipped a swapped module's computation; where the module is not exactly the Dropout the class builds, the
    original block runs."""
    utils = load_module_from_source(UTILS, "utils")
    original, patched = _models(pair)
    x = torch.randn(2, 6, 16)
    for model in (original, patched):
        SWAPS[swap](model, utils)
    torch.testing.assert_close(_run(patched, x), _run(original, x), atol=1e-5, rtol=1e-5)


def _halving_forward(self, x):
    return x * 0.5


@functools.wraps(torch.nn.Dropout.forward)
def _wrapped_halving_forward(self, x):
    return x * 0.5


@pytest.mark.parametrize("replacement", [_halving_forward, _wrapped_halving_forward])
def test_a_forward_replaced_on_torchs_class_runs_the_original_block(pair, replacement) -> None:
    """Round 15's ninth: `for cls in (nn.Dropout,): setattr(cls, "forward", f)` in another file is no write the
    scan names; the check reads where the class's forward was compiled from (a `functools.wraps` copy keeps torch's
    name and module, not its code), so the patch runs the original block, which calls the replacement."""
    original, patched = _models(pair)
    x = torch.randn(2, 6, 16)
    torch_forward = torch.nn.Dropout.forward
    for cls in (torch.nn.Dropout,):
        setattr(cls, "forward", replacement)
    try:
        expected, got = _run(original, x), _run(patched, x)
    finally:
        torch.nn.Dropout.forward = torch_forward
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected[0], _run(original, x)[0])  # the replacement changed the original's values


def test_torchs_forward_of_another_class_set_on_dropout_runs_the_original_block(pair) -> None:
    """Breaker round 18: `type(m.drop).forward = nn.Identity.forward` (deterministic training, every dropout off):
    compiled in torch's files, it passed the check, and SDPA still dropped with p in training (outputs 0.39
    apart). The check also reads that the forward is the class's own."""
    original, patched = _models(pair)
    original.train(), patched.train()
    x = torch.randn(2, 6, 16)
    torch_forward = torch.nn.Dropout.forward
    torch.nn.Dropout.forward = torch.nn.Identity.forward
    try:
        expected, got = _run(original, x), _run(patched, x)
    finally:
        torch.nn.Dropout.forward = torch_forward
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_patched_class_compiles_under_torchscript_and_matches(pair) -> None:
    original, patched = _models(pair)
    scripted_original, scripted_patched = torch.jit.script(original), torch.jit.script(patched)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(scripted_patched(x), scripted_original(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hook_guards", [True, False])
def test_under_torch_compile_the_check_breaks_no_graph_and_a_later_hook_acts_as_in_the_original(pair, hook_guards):
    """With `skip_nnmodule_hook_guards=False` dynamo guards on the hooks the check reads, so a hook registered after
    a compiled call fires (the check fails and the original block runs); by default dynamo guards on no module
    hook, and the compiled original ignores such a hook too: the compiled patch does what the compiled original does."""
    import torch._dynamo

    original, patched = _models(pair)
    x = torch.randn(2, 6, 16)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(skip_nnmodule_hook_guards=not hook_guards), torch.no_grad():
            assert torch._dynamo.explain(patched)(x).graph_break_count == 0
            compiled_original, compiled_patched = (torch.compile(m, backend="eager") for m in (original, patched))
            torch.testing.assert_close(compiled_patched(x), compiled_original(x), atol=1e-5, rtol=1e-5)
            for model in (original, patched):
                model.attn_drop.register_forward_hook(lambda mod, a, o: o * 0.5)
            expected = compiled_original(x)
            torch.testing.assert_close(compiled_patched(x), expected, atol=1e-5, rtol=1e-5)
            assert torch.allclose(expected, original(x), atol=1e-5) == hook_guards  # the hook fired where guarded
    finally:
        torch._dynamo.reset()


def test_a_dropout_the_file_itself_rebinds_is_guarded_rather_than_refused(tmp_path) -> None:
    """`model.attn_drop = Half()` in the model's own file made the deleted call a refusal: the emitted code reads
    `.p` and `.training` of the module when it runs, so where it is exactly a Dropout the patch is exact."""
    model = MODEL + textwrap.dedent('''

        class Half(nn.Module):
            def forward(self, x):
                return x * 0.5


        def halve(model):
            model.attn_drop = Half()
        ''')
    original = _tree(tmp_path, model=model, utils="")
    finding = _finding(original)
    assert finding.fix_safety == "safe", finding.reason
    assert {f["name"] for f in finding.extra["facts"]["guarded"]} == {"module-identity"}
    fixed = load_module_from_source(_patched(tmp_path, original), "model_fixed")
    source = load_module_from_source(model, "model")
    reference, patched = _models((source, fixed))
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(_run(patched, x), _run(reference, x), atol=1e-5, rtol=1e-5)
    source.halve(reference)
    fixed.halve(patched)
    torch.testing.assert_close(_run(patched, x), _run(reference, x), atol=1e-5, rtol=1e-5)


def test_a_second_pass_changes_nothing(tmp_path) -> None:
    original = _tree(tmp_path)
    _patched(tmp_path, original)
    again = [f for f in scan_paths([str(tmp_path / "patched")], jobs=1).findings
             if f.kind == "attention" and f.patch]
    assert not again


SOFTMAX_MODULE = MODEL.replace("self.attn_drop = nn.Dropout(0.1)\n", "self.attn_drop = nn.Dropout(0.1)\n"
                               "        self.softmax = nn.Softmax(dim=-1)\n").replace(
    "attn = attn.softmax(dim=-1)", "attn = self.softmax(attn)")


def test_a_softmax_module_that_may_be_rebound_is_checked_with_its_dim(tmp_path) -> None:
    """The SDPA call stands for the softmax over the dim the constructor gave, so another `nn.Softmax(dim=1)` in its
    place (computed names may put one there) computes something else: the check also compares its dim."""
    original = _tree(tmp_path, model=SOFTMAX_MODULE)
    finding = _finding(original)
    assert finding.fix_safety == "safe", finding.reason
    assert "_advisor_module_runs_plain(self.softmax, (torch.nn.Softmax,)) and self.softmax.dim == -1" in finding.patch
    source = load_module_from_source(SOFTMAX_MODULE, "model")
    fixed = load_module_from_source(_patched(tmp_path, original), "model_fixed")
    reference, patched = _models((source, fixed))
    x = torch.randn(2, 6, 16)
    for swapped in (torch.nn.Softmax(dim=-1), torch.nn.Softmax(dim=1), torch.nn.Identity()):
        for model in (reference, patched):
            model.softmax = swapped
        torch.testing.assert_close(_run(patched, x), _run(reference, x), atol=1e-5, rtol=1e-5)


CONDITIONAL = MODEL.replace("def __init__(self, dim: int = 16, heads: int = 2):",
                            "def __init__(self, dim: int = 16, heads: int = 2, attn_drop: float = 0.1):").replace(
    "self.attn_drop = nn.Dropout(0.1)", "self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else nn.Identity()")


@pytest.mark.parametrize("hooks", [False, True])
def test_a_dropout_built_as_dropout_or_identity_is_read_as_either(tmp_path, hooks: bool) -> None:
    """`nn.Dropout(p) if p else nn.Identity()` was not read as a dropout (refused): the patch reads `p` with a
    default, exact for both classes, and where the tree registers hooks checks for either class."""
    original = _tree(tmp_path, model=CONDITIONAL, utils=UTILS.replace("Half()", "nn.Identity()") if hooks else "")
    finding = _finding(original)
    assert finding.fix_safety == "safe", finding.reason
    assert 'getattr(self.attn_drop, "p", 0.0)' in finding.patch
    assert ("(torch.nn.Dropout, torch.nn.Identity)" in finding.patch) == hooks
    source, fixed = load_module_from_source(CONDITIONAL, "model"), load_module_from_source(
        _patched(tmp_path, original), "model_fixed")
    x = torch.randn(2, 6, 16)
    for p in (0.1, 0.0):
        torch.manual_seed(0)
        reference = source.Attn(attn_drop=p).eval()
        patched = fixed.Attn(attn_drop=p).eval()
        patched.load_state_dict(reference.state_dict())
        seen_reference, seen_patched = [], []
        if hooks:
            HOOKS["forward"](reference.attn_drop, seen_reference)
            HOOKS["forward"](patched.attn_drop, seen_patched)
        torch.testing.assert_close(_run(patched, x), _run(reference, x), atol=1e-5, rtol=1e-5)
        assert len(seen_patched) == len(seen_reference)


OPTIONAL_BIAS = MODEL.replace("        self.proj = nn.Linear(dim, dim)\n", """        self.proj = nn.Linear(dim, dim)
        self.rel_pos = RelPosBias(heads)
""").replace("        attn = (q @ k.transpose(-2, -1)) * 0.25\n", """        attn = (q @ k.transpose(-2, -1)) * 0.25
        if self.rel_pos is not None:
            attn = self.rel_pos(attn)
""").replace("class Attn(nn.Module):", """class RelPosBias(nn.Module):
    def __init__(self, heads: int, n: int = 6):
        super().__init__()
        self.relative_position_bias_table = nn.Parameter(torch.randn(2 * n - 1, heads))
        index = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1
        self.register_buffer("relative_position_index", index, persistent=False)
        self.bias_shape = (n, n, -1)

    def get_bias(self):
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(self.bias_shape).permute(2, 0, 1).unsqueeze(0).contiguous()

    def forward(self, attn):
        return attn + self.get_bias()


class Attn(nn.Module):""")


def test_a_check_of_a_module_called_only_if_present_is_grouped_inside_the_others(tmp_path) -> None:
    """timm's relative-position ViT: `self.rel_pos` is called only when not None, so its check reads
    `self.rel_pos is None or <its class check>`; joined to the dropout's check it must stay one operand
    (`A and (B or C)`), or a plain bias would let a swapped dropout through to the SDPA path (it did: timm's
    `vit_relpos` with `attn_drop` replaced took SDPA and raised on the replacement's missing `p`)."""
    original = _tree(tmp_path, model=OPTIONAL_BIAS, utils="")
    finding = _finding(original)
    assert finding.fix_safety == "safe", finding.reason
    assert "and (self.rel_pos is None or _advisor_module_runs_plain(self.rel_pos, (RelPosBias,)))" in finding.patch
    source = load_module_from_source(OPTIONAL_BIAS, "model")
    fixed = load_module_from_source(_patched(tmp_path, original), "model_fixed")
    x = torch.randn(2, 6, 16)
    for without_bias in (False, True):
        for swapped in (None, "attn_drop", "rel_pos"):
            reference, patched = _models((source, fixed))
            for model in (reference, patched):
                if without_bias:
                    model.rel_pos = None
                if swapped == "attn_drop":
                    model.attn_drop = _Doubled()
                elif swapped == "rel_pos" and not without_bias:
                    model.rel_pos.forward = lambda attn: attn * 2
            torch.testing.assert_close(_run(patched, x), _run(reference, x), atol=1e-5, rtol=1e-5)
            sdpa = uses_sdpa(dispatched_ops(patched, (x,)))
            assert sdpa == (swapped is None or swapped == "rel_pos" and without_bias), (without_bias, swapped)


class _Doubled(torch.nn.Module):
    """A module in a dropout's place that is no dropout (no `p`): the original block must run."""

    def forward(self, x):
        return x * 2
