"""Identity at run time: what a rewrite reads must still be what the class built
when the code runs. A module swapped by a helper, a buffer rewritten outside the constructor, a hook registered
for every module, or weights bound to a global name all break a patch proved from the class body alone.

Each source reproduces a "safe" patch that raised, changed outputs or crashed the analysis before the fix. The
differential harness of the fuzzer (tests/fuzz/differential.py) runs original and patch on the same weights and
inputs (eval, two seeds, and a training step's gradients).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from advisor.static.op_overrides import op_overrides
from fixture_models import load_module_from_source
from fuzz.differential import COUNTEREXAMPLE, INVALID, check

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def attention(forward: str, init: str = "", methods: str = "", after: str = "", make: str = "",
              head: str = "") -> str:
    """A module `Attn` (2 heads of width 8 over (2, 6, 16) inputs, a causal `bias` buffer and a dropout module);
    `forward` continues after q, k, v; `make` runs on the model before it is returned."""
    pad = " " * 8
    return HEAD + textwrap.dedent(head) + f'''

class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.attn_drop = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))
{textwrap.indent(textwrap.dedent(init), pad)}
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
{textwrap.indent(textwrap.dedent(forward), pad)}
{textwrap.indent(textwrap.dedent(methods), " " * 4)}
{textwrap.dedent(after)}

def make(seed=0):
    torch.manual_seed(seed)
    model = Attn()
{textwrap.indent(textwrap.dedent(make), " " * 4)}
    return model, (torch.randn(2, 6, 16),)
'''


CAUSAL_BLOCK = """\
att = (q @ k.transpose(-2, -1)) * 8 ** -0.5
att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
att = F.softmax(att, dim=-1)
att = self.attn_drop(att)
y = att @ v
return y.transpose(1, 2).reshape(B, T, C)
"""


def _attention_findings(source: str):
    return [f for f in analyze_source(source, "m.py").findings if f.kind == "attention"]


def _assert_sound(source: str) -> None:
    outcome = check(source)
    assert outcome.status != INVALID, outcome.detail
    assert outcome.status != COUNTEREXAMPLE, f"{outcome.kind}: {outcome.detail}\n--- rewrite\n{outcome.fixed}"


def _patch(source: str) -> str:
    [finding] = _attention_findings(source)
    return finding.patch or ""


# 2. modules replaced at run time --------------------------------------------------------------------------------

SWAP_HELPERS = {
    "setattr_named_children": """\
        def strip_dropout(module):
            for name, child in module.named_children():
                if isinstance(child, nn.Dropout):
                    setattr(module, name, nn.Identity())
        """,
    "modules_dict": """\
        def strip_dropout(module):
            for name, child in list(module._modules.items()):
                if isinstance(child, nn.Dropout):
                    module._modules[name] = nn.Identity()
        """,
    "add_module": """\
        def strip_dropout(module):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Dropout):
                    module.add_module(name, nn.Identity())
        """,
}


@pytest.mark.parametrize("helper", sorted(SWAP_HELPERS))
def test_a_dropout_stripped_to_identity_by_a_helper_reads_its_p_with_a_default(helper: str) -> None:
    """`model.apply(strip_dropout)` after `model.eval()`: the new Identity is in training mode, so a patch reading
    `self.attn_drop.p if self.attn_drop.training else 0.0` raised AttributeError even in eval. Where the file
    binds nothing but `nn.Identity()` under computed names, the module is a dropout or an identity when it runs."""
    block = CAUSAL_BLOCK.replace('att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))\n', "")
    source = attention(block, after=SWAP_HELPERS[helper], make="model.eval()\nmodel.apply(strip_dropout)")
    [finding] = _attention_findings(source)
    assert finding.fix_safety == "safe"
    assert 'dropout_p=getattr(self.attn_drop, "p", 0.0) if self.attn_drop.training else 0.0' in finding.patch
    _assert_sound(source)


REPLACING_HELPERS = {
    "dropout_by_another_module": SWAP_HELPERS["setattr_named_children"].replace("nn.Identity()", "Halve()") + """
        class Halve(nn.Module):
            def forward(self, x):
                return x * 0.5
        """,
    "softmax_by_identity": SWAP_HELPERS["modules_dict"].replace("nn.Dropout", "nn.Softmax"),
}


@pytest.mark.parametrize("helper", sorted(REPLACING_HELPERS))
def test_a_module_a_helper_may_replace_by_something_else_is_checked_when_the_block_runs(helper: str) -> None:
    """Refused before; now the patch takes SDPA only where each deleted module is exactly the class's (the
    softmax's dim compared too), so the replacement runs the original block."""
    block = CAUSAL_BLOCK.replace("F.softmax(att, dim=-1)", "self.softmax(att)")
    source = attention(block, init="self.softmax = nn.Softmax(dim=-1)", after=REPLACING_HELPERS[helper],
                       make="model.apply(strip_dropout)")
    [finding] = _attention_findings(source)
    guarded = {fact["name"] for fact in finding.extra["facts"].get("guarded", [])}
    assert finding.fixable and "module-identity" in guarded, finding.reason
    assert "self.softmax.dim == -1" in finding.patch
    _assert_sound(source)


def test_a_literal_setattr_of_another_attribute_keeps_the_dropout_role() -> None:
    """Only a write whose name is computed, or that names the attribute, can replace it."""
    source = attention(CAUSAL_BLOCK, make='setattr(model, "scale_hint", 2.0)')
    assert "dropout_p=self.attn_drop.p if self.attn_drop.training else 0.0" in _patch(source)
    _assert_sound(source)


# 3. buffers changed outside the constructor ---------------------------------------------------------------------

BAND = "torch.tril(torch.ones(8, 8)) - torch.tril(torch.ones(8, 8), diagonal=-3)"
BUFFER_WRITES = {
    "data_assign_in_method": dict(methods=f"def set_window(self):\n    self.bias.data = ({BAND}).view(1, 1, 8, 8)\n",
                                  make="model.set_window()"),
    "data_copy_in_method": dict(methods=f"def set_window(self):\n    self.bias.data.copy_(({BAND}).view(1, 1, 8, 8))\n",
                                make="model.set_window()"),
    "set_in_method": dict(methods=f"def set_window(self):\n    self.bias.set_(({BAND}).view(1, 1, 8, 8))\n",
                          make="model.set_window()"),
    "computed_setattr": dict(methods=f"def set_window(self, name='bias'):\n"
                                     f"    setattr(self, name, ({BAND}).view(1, 1, 8, 8))\n",
                             make="model.set_window()"),
    "computed_register_buffer": dict(methods=f"def set_window(self, name='bias'):\n"
                                             f"    self.register_buffer(name, ({BAND}).view(1, 1, 8, 8))\n",
                                     make="model.set_window()"),
    "data_assign_outside": dict(make=f"model.bias.data = ({BAND}).view(1, 1, 8, 8)"),
    "state_dict_loader": dict(methods=f"def _load_from_state_dict(self, state_dict, prefix, *args):\n"
                                      f"    state_dict[prefix + 'bias'] = ({BAND}).view(1, 1, 8, 8)\n"
                                      f"    super()._load_from_state_dict(state_dict, prefix, *args)\n",
                              make="model.load_state_dict(model.state_dict())"),
}


@pytest.mark.parametrize("write", sorted(BUFFER_WRITES))
def test_a_causal_buffer_written_after_the_constructor_is_not_is_causal(write: str) -> None:
    """A banded buffer assigned through `.data` in a method got `is_causal=True` (max error 0.63)."""
    source = attention(CAUSAL_BLOCK, **BUFFER_WRITES[write])
    assert "is_causal=True" not in _patch(source)
    _assert_sound(source)


def test_a_buffer_registration_hook_in_the_scanned_tree_defeats_the_causal_proof(tmp_path, restore_global_hooks) -> None:
    """`register_module_buffer_registration_hook` may replace any buffer as a constructor registers it."""
    (tmp_path / "model.py").write_text(attention(CAUSAL_BLOCK.replace("att = self.attn_drop(att)\n", "")),
                                       encoding="utf-8")
    (tmp_path / "setup.py").write_text(
        "import torch\n\n"
        "def banded():\n"
        "    torch.nn.modules.module.register_module_buffer_registration_hook(lambda m, name, t: t.triu())\n",
        encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert "is_causal=True" not in finding.patch
    alone = [f for f in scan_paths([str(tmp_path / "model.py")], jobs=1).findings if f.kind == "attention"]
    assert "is_causal=True" in alone[0].patch


def test_the_untouched_causal_buffer_is_still_is_causal() -> None:
    assert "is_causal=True" in _patch(attention(CAUSAL_BLOCK))


# a scale bound through the instance's namespace, which no `self.scale = ...` or `m.scale = ...` shows
SCALED_BLOCK = """\
att = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
return (att @ v).transpose(1, 2).reshape(B, T, C)
"""
PER_HEAD = "torch.full((2, 1, 1), 0.3)"
NAMESPACE_WRITES = {
    "dict_update_in_method": dict(methods="def retune(self, **kw):\n    self.__dict__.update(kw)\n",
                                  make=f"model.retune(scale={PER_HEAD})"),
    "vars_update_in_method": dict(methods=f"def retune(self):\n    vars(self).update(scale={PER_HEAD})\n",
                                  make="model.retune()"),
    "vars_store_in_method": dict(methods=f"def retune(self, name='scale'):\n    vars(self)[name] = {PER_HEAD}\n",
                                 make="model.retune()"),
    "dict_update_outside": dict(make=f"model.__dict__.update(scale={PER_HEAD})"),
    "vars_update_outside": dict(make=f"vars(model).update({{'scale': {PER_HEAD}}})"),
    "vars_store_outside": dict(make=f"vars(model)['scale'] = {PER_HEAD}"),
}


@pytest.mark.parametrize("write", sorted(NAMESPACE_WRITES))
def test_a_scale_bound_through_the_instance_namespace_is_not_the_class_s_number(write: str) -> None:
    """`vars(model).update(scale=t)` and its twins bound a per-head tensor where the class assigns
    `self.scale = 0.25`: the safe patch passed it to SDPA's `scale=`, which raises on a tensor."""
    source = attention(SCALED_BLOCK, init="self.scale = 0.25", **NAMESPACE_WRITES[write])
    assert "isinstance(self.scale, (int, float))" in _patch(source)
    _assert_sound(source)


@pytest.mark.parametrize("make", ["print(vars(model).get('scale'))", "vars(model).pop('unrelated', None)",
                                  "model.__dict__.setdefault('other', 1)"])
def test_reading_or_naming_another_key_of_the_instance_namespace_keeps_the_scale_proved(make: str) -> None:
    """A literal key names the one attribute a namespace method binds or unbinds (nanoGPT's test setup pops
    `F.__dict__['scaled_dot_product_attention']`): it is not a write of every attribute."""
    source = attention(SCALED_BLOCK, init="self.scale = 0.25", make=make)
    assert "scale=self.scale" in _patch(source) and "isinstance" not in _patch(source)


# 4. hooks registered for every module ---------------------------------------------------------------------------

GLOBAL_HOOKS = {
    "imported_forward": ("from torch.nn.modules.module import register_module_forward_hook as on_every_module\n",
                         "on_every_module(lambda m, a, o: o * 0.5 if isinstance(m, nn.Dropout) else o)"),
    "dotted_pre": ("", "torch.nn.modules.module.register_module_forward_pre_hook("
                       "lambda m, a: (a[0] * 0.5,) if isinstance(m, nn.Dropout) else None)"),
    "full_backward": ("import torch.nn.modules.module as mm\n",
                      "mm.register_module_full_backward_hook("
                      "lambda m, gi, go: (gi[0] * 0.5,) if isinstance(m, nn.Dropout) else None)"),
}


@pytest.fixture
def restore_global_hooks():
    from fuzz.differential import global_module_hooks
    with global_module_hooks():
        yield


@pytest.mark.parametrize("hook", sorted(GLOBAL_HOOKS))
def test_a_global_module_hook_in_the_file_makes_no_hooks_guarded(hook: str, restore_global_hooks) -> None:
    """The patch runs the original block wherever a hook of the process (or of the module) is registered when it
    runs (tests/rewrite/test_module_guards.py)."""
    head, register = GLOBAL_HOOKS[hook]
    source = attention(CAUSAL_BLOCK, head=head, make=register)
    [finding] = _attention_findings(source)
    guarded = {fact["name"] for fact in finding.extra["facts"].get("guarded", [])}
    assert "no-hooks" in guarded and finding.fix_safety == "safe"
    _assert_sound(source)


def test_a_global_module_hook_elsewhere_in_the_scanned_tree_makes_no_hooks_guarded(tmp_path) -> None:
    """The hook fires on every module of the process, wherever it is registered: checked when the block runs."""
    (tmp_path / "model.py").write_text(attention(CAUSAL_BLOCK), encoding="utf-8")
    (tmp_path / "train.py").write_text(
        "from torch.nn.modules import module\n\n"
        "def watch():\n"
        "    module.register_module_forward_hook(lambda m, a, o: o)\n", encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    [fact] = [f for f in finding.extra["facts"]["guarded"] if f["name"] == "no-hooks"]
    assert "train.py" in fact["why"] and "_advisor_module_runs_plain(self.attn_drop" in fact["why"]
    assert finding.fix_safety == "safe"
    alone = [f for f in scan_paths([str(tmp_path / "model.py")], jobs=1).findings if f.kind == "attention"]
    assert alone[0].fix_safety == "safe"


# 5. weights bound to a global or nonlocal name ------------------------------------------------------------------

GLOBAL_WEIGHTS = """\
global LAST
att = (q @ k.transpose(-2, -1)) * 8 ** -0.5
LAST = F.softmax(att, dim=-1)
y = LAST @ v
return y.transpose(1, 2).reshape(B, T, C), attention_map()
"""
GLOBAL_COPY = """\
global LAST
att = (q @ k.transpose(-2, -1)) * 8 ** -0.5
att = F.softmax(att, dim=-1)
LAST = att
y = att @ v
return y.transpose(1, 2).reshape(B, T, C), attention_map()
"""
READER = "LAST = None\n\n\ndef attention_map():\n    return LAST\n"


def test_weights_bound_to_a_global_name_get_no_safe_patch() -> None:
    """The safe patch deleted `LAST = softmax(...)`: `attention_map()` then returned None (or raised NameError)."""
    source = attention(GLOBAL_WEIGHTS, after=READER)
    [finding] = _attention_findings(source)
    assert finding.rule == "ADV102" and not finding.fixable and "global or nonlocal" in finding.reason
    _assert_sound(source)


def test_weights_copied_to_a_global_name_are_an_escape_not_a_crash() -> None:
    """`LAST = att` with LAST global crashed the weight walk (IndexError)."""
    source = attention(GLOBAL_COPY, after=READER)
    [finding] = _attention_findings(source)
    assert finding.rule == "ADV102" and "internal error" not in (finding.reason or "")
    _assert_sound(source)


def test_weights_bound_to_a_nonlocal_name_get_no_patch() -> None:
    source = HEAD + textwrap.dedent('''
        def attention_with_map():
            weights = None

            def attend(q, k, v):
                nonlocal weights
                weights = F.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
                return weights @ v

            return attend, lambda: weights
        ''')
    [finding] = _attention_findings(source)
    assert finding.rule == "ADV102" and not finding.fixable


def test_scores_bound_to_a_global_name_are_refused() -> None:
    source = attention(GLOBAL_WEIGHTS.replace("global LAST", "global SCORES").replace("att = (q", "SCORES = (q")
                       .replace("F.softmax(att", "F.softmax(SCORES"), after=READER + "\nSCORES = None\n")
    [finding] = _attention_findings(source)
    assert not finding.fixable and "SCORES" in finding.reason


# 6. what another file of the tree does to the model at run time -------------------------------------------------
# A training script changes the model another file defines: attention maps saved by a hook on its dropout, a
# sliding-window band written into its causal buffer, its dropout swapped by `model.apply`. Each change, in
# `train.py`, made the `model.py` patch proved from `model.py` alone compute something else, or raise.

ELSEWHERE = {
    "hook_on_the_dropout": ("maps = []\n\ndef change(model):\n"
                            "    model.attn_drop.register_forward_hook(lambda m, a, o: maps.append(o))\n"
                            "    return lambda out: (out, len(maps))", "no-hooks"),
    "band_into_the_buffer_data": (f"def change(model):\n    model.bias.data = ({BAND}).view(1, 1, 8, 8)\n"
                                  "    return lambda out: out", "is_causal"),
    "band_registered_again": (f"def change(model):\n    model.register_buffer('bias', ({BAND}).view(1, 1, 8, 8))\n"
                              "    return lambda out: out", "is_causal"),
    "dropout_swapped_by_apply": ("import torch.nn as nn\n\nclass Half(nn.Module):\n"
                                 "    def forward(self, x):\n        return x * 0.5\n\n"
                                 "def swap(module):\n    for name, child in list(module.named_children()):\n"
                                 "        if isinstance(child, nn.Dropout):\n            setattr(module, name, Half())\n\n"
                                 "def change(model):\n    model.apply(swap)\n    return lambda out: out", "dropout"),
    "softmax_replaced_for_the_process": ("import torch.nn.functional as F\n_softmax = F.softmax\n\n"
                                         "def tempered(x, dim=None, **kw):\n    return _softmax(x / 2.0, dim=dim, **kw)\n\n"
                                         "def change(model):\n    F.softmax = tempered\n\n"
                                         "    def restore(out):\n        F.softmax = _softmax\n        return out\n"
                                         "    return restore", "softmax"),
}


def _outputs(folder, seed=0):
    """`train.change(model)` then the model's output (and what the change collects), in eval mode."""
    import torch
    from fixture_models import load_module_from_source
    model_module = load_module_from_source((folder / "model.py").read_text(), "model")
    train = load_module_from_source((folder / "train.py").read_text(), "train")
    model, inputs = model_module.make(seed)
    model.eval()
    collect = train.change(model)
    with torch.no_grad():
        return collect(model(*inputs))


@pytest.mark.parametrize("change", sorted(ELSEWHERE))
def test_a_change_made_by_another_file_of_the_tree_keeps_safe_patches_exact(tmp_path, change) -> None:
    """Each change made a safe patch differ (band: max error 0.18 through `is_causal=True`; swapped dropout:
    AttributeError on `.p`; hook: no attention maps saved; `F.softmax` replaced: max error 0.04). Now the tree's writes and hooks count as the model file's
    own: the patch is unsafe or keeps what the change needs (a check of the dropout module's class, of hooks), and whatever stays safe computes what the original does."""
    import shutil

    import advisor
    import torch
    train, concern = ELSEWHERE[change]
    original = tmp_path / "original"
    original.mkdir()
    (original / "model.py").write_text(attention(CAUSAL_BLOCK), encoding="utf-8")
    (original / "train.py").write_text("import torch\n\n" + train + "\n", encoding="utf-8")
    alone = [f for f in scan_paths([str(original / "model.py")], jobs=1).findings if f.kind == "attention"]
    assert alone[0].fix_safety == "safe"  # the model file alone proves the patch
    [finding] = [f for f in scan_paths([str(original)], jobs=1).findings if f.kind == "attention"]
    guarded = {fact["name"] for fact in finding.extra.get("facts", {}).get("guarded", [])}
    assert finding.fix_safety != "safe" or concern == "is_causal" and "is_causal=True" not in finding.patch or \
        concern == "no-hooks" and "no-hooks" in guarded or concern == "dropout" and "module-identity" in guarded, \
        finding.patch
    patched = tmp_path / "patched"
    shutil.copytree(original, patched)
    advisor.fix(str(patched), apply=True, cache=False)
    expected, got = _outputs(original), _outputs(patched)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("source, own, expected", [
    ("from .. import initialization as init\n\n\ndef _init_weights(module):\n    init.normal_(module.weight)\n",
     False, ({"weight", "initialization"}, set())),  # a relative import: transformers' weight init writes what it
    # is passed (and, as far as the file shows, `init` may be a tensor whose method `normal_` is)
    ("import torch\n\nfunctional = torch.nn.functional\nfunctional.softmax = f\n", False,
     ({"softmax", "torch.nn.functional.softmax"},) * 2),  # a module-level alias of torch's module
    ("import torch\n\n\ndef sharpen(f):\n    nnf = torch.nn.functional\n    nnf.softmax = f\n", False,
     ({"softmax", "torch.nn.functional.softmax"},) * 2),  # ... also in a function (breaker round 18)
    ("import torch\n\nfunctional = torch.nn.functional; x = 1\nfunctional.softmax = f\n", False,
     ({"softmax"},) * 2),  # ... not read as one when it shares its line (as ParsedModule.name_aliases)
    ("import torch\n\ntorch = load()\ntorch.matmul = f\n", False, ({"torch", "matmul"},) * 2),  # not torch's
    # breaker round 18: a receiver that may be the attribute, and an attribute bound as a loop or `with` target
    ("def f(m, c, t):\n    (m.bias if c else t).fill_(1)\n", False, ({"bias"}, set())),
    ("def f(m):\n    (None or m.bias).fill_(1)\n    (+m.bias).zero_()\n", False, ({"bias"}, set())),
    ("import torch.nn as nn\n\n\ndef f(m):\n    for m.sm in [nn.Softmax(dim=2)]:\n        pass\n", False,
     ({"sm"},) * 2),
    ("def f(m, x):\n    with x as m.sm:\n        pass\n", False, ({"sm"},) * 2),
    # torch's module reached by the import machinery or through its namespace (a thirteenth breaker's)
    ("import sys\n\nsys.modules['torch.nn.functional'].softmax = f\n", False,
     ({"modules", "softmax", "torch.nn.functional.softmax"},) * 2),
    ("import importlib\n\nimportlib.import_module('torch.nn.functional').softmax = f\n", False,
     ({"softmax", "torch.nn.functional.softmax"},) * 2),
    ("import torch.nn.functional as F\n\nvars(F)['softmax'] = f\n", False,
     ({"softmax", "torch.nn.functional.softmax"},) * 2),
    ("import torch.nn.functional as F\n\nF.__dict__.update(softmax=f)\n", False,
     ({"softmax", "torch.nn.functional.softmax"},) * 2),
    # computed names: each torch name the pattern spells; a module looked up by a computed name may be any of
    # torch's; on a module so looked up, a computed name binds its globals, not an instance's attributes
    ("import torch.nn.functional as F\n\n\ndef f(n, g):\n    setattr(F, f'{n}max', g)\n", False,
     ({"torch.nn.functional.softmax", "torch.nn.functional.log_softmax", "torch.nn.functional.gumbel_softmax",
       "*", "*class"},) * 2),
    ("def f(n, g):\n    __import__(n).softmax = g\n", False,
     ({"softmax", "torch.softmax", "torch.nn.functional.softmax"},) * 2),
    ("import sys\n\n\ndef alias(cls):\n    base = sys.modules[cls.__module__]\n"
     "    setattr(base, cls.__name__ + 'Fast', cls)\n", False, ({"module:*Fast"},) * 2),
    ("class A:\n    def __init__(self):\n        setattr(self, 'bias', 1)\n", True, ({"bias"},) * 2),
    ("class A:\n    def __init__(self):\n        setattr(self, 'bias', 1)\n", False, (set(), set())),
    # in-place torch functions write their first argument, not the `init` module
    ("import torch.nn as nn\n\n\ndef f(m):\n    nn.init.ones_(m.bias)\n", False, ({"bias~drawn"}, set())),
    ("import torch.nn as nn\n\n\ndef f(m):\n    nn.init.constant_(m.bias, -1e9)\n", False, ({"bias"}, set())),
    ("from timm.layers import trunc_normal_\n\n\ndef f(m):\n    trunc_normal_(m.table, std=.02)\n", False,
     ({"table"}, set())),
    ("import torch\n\n\ndef f(m):\n    torch.Tensor.resize_(m.bias, 1)\n", False, ({"bias"},) * 2),
    # bindings by computed names: through nn.Module.__setattr__, or bypassing it (ANY_RAW too)
    ("def f(m, n, v):\n    setattr(m, n, v)\n    m.add_module(n, v)\n    m.get_submodule(n).add_module(n, v)\n",
     False, ({"*"},) * 2),
    # a binding method whose name the call does not show, a binder of the file's own, an attribute unbound by a
    # computed name, an instance `__new__` makes: anything, past what torch's __setattr__ lets a parameter hold
    ("def f(m, n, v):\n    bind = m.add_module\n    bind(n, v)\n", False, ({"*", "*raw"},) * 2),
    ("def f(m, kw):\n    m.register_buffer(**kw)\n", False, ({"*", "*raw"},) * 2),
    ("class R:\n    def add_module(self, n, v):\n        pass\n", False, ({"*", "*raw"},) * 2),
    ("def f(m, n):\n    delattr(m, n)\n", False, ({"*", "*raw"},) * 2),
    ("def f(m):\n    delattr(m, 'bias')\n", False, ({"bias"},) * 2),
    ("def f(m, n):\n    type(m).__delattr__(m, n)\n", False, ({"*", "*raw"},) * 2),
    ("def f(cls):\n    return cls.__new__(cls)\n", False, ({"*", "*raw"},) * 2),
    ("class A:\n    def __new__(cls):\n        return super().__new__(cls)\n", False, (set(), set())),
    ("def f(m, n, v):\n    m.__dict__[n] = v\n", False, ({"*", "*raw", "__dict__"}, {"*", "*raw", "__dict__"})),
    ("def f(m, n, v):\n    object.__setattr__(m, n, v)\n", False, ({"*", "*raw"},) * 2),
    ("def f(m, n):\n    m.get_parameter(n).fill_(1)\n", False, ({"*", "*raw"},) * 2),
    # an isinstance test narrowing to torch.nn layers ...
    ("import torch.nn as nn\n\n\ndef f(m):\n    if isinstance(m, (nn.Linear, nn.Embedding)):\n"
     "        m.bias.data.zero_()\n", False,
     ({"bias@torch.nn.Embedding|torch.nn.Linear", "data@torch.nn.Embedding|torch.nn.Linear"}, set())),
    ("import torch.nn as nn\n\n\ndef f(m):\n    if isinstance(m, nn.Linear):\n        nn.init.zeros_(m.bias)\n",
     False, ({"bias~drawn@torch.nn.Linear"}, set())),
    # ... but not to nn.Module, nor where the body rebinds the name
    ("import torch.nn as nn\n\n\ndef f(m):\n    if isinstance(m, nn.Module):\n        m.bias.zero_()\n", False,
     ({"bias"}, set())),
    ("import torch.nn as nn\n\n\ndef f(m, n):\n    if isinstance(m, nn.Linear):\n        m = n\n"
     "        m.bias.zero_()\n", False, ({"bias"}, set())),
    # a function writing its parameter, handed on: the tensors given beside it (a list, a module's buffers), but
    # not a number given to `partial` with it (timm's `named_apply(partial(_init_weights, scale=s), self)`)
    ("def w(t):\n    t.zero_()\n\n\ndef f(m, s):\n    map(w, [m.bias])\n    partial(w, scale=s)\n", False,
     ({"bias"}, set())),
    ("def f(m):\n    list(map(lambda t: t.zero_(), m.buffers()))\n", False, ({"*", "*raw"}, set())),
    # state set wholesale on another object, but not a class's own `super().__setstate__`
    ("def f(m, d):\n    m.__setstate__(d)\n", False, ({"*", "*raw"},) * 2),
    ("class A(B):\n    def __setstate__(self, state):\n        super(A, self).__setstate__(state)\n", False,
     (set(), set())),
    # computed names on what may be a class (any method may become another function), not on an instance
    ("from attn import Attn\n\n\ndef f(n, g):\n    setattr(Attn, n, g)\n", False, ({"*", "*class"},) * 2),
    ("def f(m, n, g):\n    for cls in type(m).__mro__:\n        setattr(cls, n, g)\n", False,
     ({"*", "*class"},) * 2),
    ("def f(m, n, g):\n    setattr(type(m), n, g)\n", False, ({"*", "*class"},) * 2),
    ("def f(t, n, g):\n    type.__setattr__(t, n, g)\n", False, ({"*", "*raw", "*class"},) * 2),
    ("def f(m, n, g):\n    setattr(m, n, g)\n", False, ({"*"},) * 2),
])
def test_writes_on_other_objects_resolve_names_as_the_analysis_does(source, own, expected) -> None:
    """One reader for the analysed file (own) and the rest of the tree, resolving names as
    `ParsedModule.imported_name` does; the first four were read otherwise by the tree's reader, the fifth was the
    analysed file's libcst reader's alone."""
    from advisor.static.outside_writes import outside_writes_of_source
    assert outside_writes_of_source(source, own=own) == expected


SWAP_BY_COMPUTED_NAME = ("import torch.nn as nn\n\n\nclass Half(nn.Module):\n    def forward(self, x):\n"
                         "        return x * 0.5\n\n\ndef swap(module):\n"
                         "    for name, child in list(module.named_children()):\n"
                         "        if isinstance(child, nn.Dropout):\n            setattr(module, name, Half())\n")


def test_a_dropout_swapped_by_computed_names_is_checked_when_the_block_runs(tmp_path) -> None:
    """A utility that swaps submodules by computed names, elsewhere in the tree (assumed before) or in the model's
    own file (refused before): the patch takes SDPA only where the module is exactly the Dropout the class builds,
    with no hook, so the deleted dropout's identity is guarded and the patch safe."""
    # without the causal buffer, which computed names may rebind (its rank is then assumed)
    block = CAUSAL_BLOCK.replace('att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))\n', "")
    (tmp_path / "model.py").write_text(attention(block), encoding="utf-8")
    (tmp_path / "utils.py").write_text(SWAP_BY_COMPUTED_NAME, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    guarded = {fact["name"]: fact for fact in finding.extra["facts"]["guarded"]}
    assert finding.fix_safety == "safe" and finding.patch, finding.reason
    assert "utils.py" in guarded["module-identity"]["why"]
    source = attention(block, make="model.apply(swap)") + "\n\n" + SWAP_BY_COMPUTED_NAME
    [alone] = _attention_findings(source)
    assert alone.fix_safety == "safe" and "computed names" in \
        {fact["name"]: fact for fact in alone.extra["facts"]["guarded"]}["module-identity"]["why"]
    _assert_sound(source)



# 3b. buffers passed in at call time ----------------------------------------------------------------------------
# Found by attacking safe patches (s17): `torch.func.functional_call(model, {"bias": ones}, (x,))` runs the model with
# another buffer under the class's name, and the patch's `is_causal=True` kept the triangle (max error 0.64).

FUNCTIONAL_CALL = """\
def bidirectional(model, x):
    return torch.func.functional_call(model, {"bias": torch.ones(1, 1, 8, 8)}, (x,))
"""


def test_a_buffer_functional_call_passes_in_is_not_read_as_the_class_built_it() -> None:
    source = attention(CAUSAL_BLOCK.replace("att = self.attn_drop(att)\n", ""), after=FUNCTIONAL_CALL)
    result = analyze_source(source, "m.py")
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "is_causal=True" not in finding.patch
    original = load_module_from_source(source, "functional_call_original")
    patched = load_module_from_source(result.fixed, "functional_call_patched")
    model, (x,) = original.make()
    again, _ = patched.make()
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(patched.bidirectional(again.eval(), x), original.bidirectional(model.eval(), x))


def test_a_functional_call_elsewhere_in_the_scanned_tree_defeats_the_causal_proof(tmp_path) -> None:
    (tmp_path / "model.py").write_text(attention(CAUSAL_BLOCK.replace("att = self.attn_drop(att)\n", "")),
                                       encoding="utf-8")
    (tmp_path / "ensemble.py").write_text("from torch.func import functional_call\n\n\n"
                                          "def run(model, state, x):\n    return functional_call(model, state, (x,))\n",
                                          encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "is_causal=True" not in finding.patch


# ... and buffers written through what `named_buffers()`, `buffers()` and `state_dict()` return (the tensors
# themselves): each got `is_causal=True` from the triangle the class built (max errors 0.43 to 0.64).
STATE_VIEW_WRITES = {
    "named_buffers_loop": """\
        for name, buf in model.named_buffers():
            if name.endswith("bias"):
                buf.copy_(torch.ones_like(buf).triu(-2).tril())
        """,
    "buffers_fill": "for b in model.buffers():\n    b.fill_(1.0)\n",
    "state_dict_entry": "sd = model.state_dict()\nsd['bias'].fill_(1.0)\n",
    "state_dict_elements": "model.state_dict()['bias'][..., 0, :] = 1.0\n",
    # breaker round 27: an augmented assignment, `out=`, unpacking and expressions computed from a listing
    "loop_augmented": "for b in model.buffers():\n    b += 1.0\n",
    "loop_out": "for b in model.buffers():\n    torch.ones(b.shape, out=b)\n",
    "unpacked": "(b,) = model.buffers()\nb.fill_(1.0)\n",
    "next_elements": "next(model.buffers())[...] = 1.0\n",
    "comprehension_elements": "[b for b in model.buffers()][0][:] = 1.0\n",
    "bound_from_next": "b = next(iter(model.buffers()))\nb.add_(1.0)\n",
}


@pytest.mark.parametrize("write", sorted(STATE_VIEW_WRITES))
def test_a_buffer_written_through_the_module_s_state_views_is_not_is_causal(write: str) -> None:
    source = attention(CAUSAL_BLOCK.replace("att = self.attn_drop(att)\n", ""), make=STATE_VIEW_WRITES[write])
    assert "is_causal=True" not in _patch(source)
    if write in ("named_buffers_loop", "state_dict_entry", "loop_augmented"):  # the differential run (time)
        _assert_sound(source)


def test_reading_the_state_views_keeps_is_causal() -> None:
    """Saving a checkpoint or counting parameters writes nothing."""
    make = "torch.save(model.state_dict(), '/dev/null')\nsize = sum(b.numel() for b in model.buffers())\n"
    assert "is_causal=True" in _patch(attention(CAUSAL_BLOCK, make=make))


def test_rebinding_an_entry_of_a_state_dict_copy_keeps_is_causal() -> None:
    """`sd[k] = t` rebinds the dict's entry, not the buffer (checkpoint filters write so)."""
    make = "sd = model.state_dict()\nsd['bias'] = torch.ones(1, 1, 8, 8)\n"
    assert "is_causal=True" in _patch(attention(CAUSAL_BLOCK, make=make))


# Breaker round 15, bug 10: a zeros prior buffer read as "swallows no row" while `functional_call` passed a -1e9
# prior in its place; the outputs agreed but SDPA's fused backward on the swallowed rows gave other gradients (d/dx
# 0.86 apart). A tensor attribute's construction is no proof where the tree runs modules with state given by name.
PRIOR_BLOCK = """\
att = (q @ k.transpose(-2, -1)) * 8 ** -0.5 + self.prior[:, :, :T, :T]
y = F.softmax(att, dim=-1) @ v
return y.transpose(1, 2).reshape(B, T, C)
"""
SWALLOWING_PRIOR = """\
def with_prior(model, x):
    prior = torch.zeros(1, 1, 8, 8)
    prior[..., :2, :] = -1e9
    return torch.func.functional_call(model, {**dict(model.named_parameters()), "prior": prior}, (x,))
"""


def test_a_zeros_buffer_functional_call_replaces_proves_nothing_about_its_values() -> None:
    source = attention(PRIOR_BLOCK, init='self.register_buffer("prior", torch.zeros(1, 1, 8, 8))\n',
                       after=SWALLOWING_PRIOR)
    [finding] = _attention_findings(source)
    assumed = {fact["name"] for fact in finding.extra["facts"]["assumed"]}
    assert "fully-masked-rows" in assumed
    [alone] = _attention_findings(source.replace(SWALLOWING_PRIOR, ""))
    assert "fully-masked-rows" not in {fact["name"] for fact in alone.extra["facts"]["assumed"]}


# Breaker round 15, bugs 07 and 11: another file replaces the op the patch introduces (`F.scaled_dot_product_attention
# = sharpened`, forward 0.17 apart) or rebinds the name the model file reads torch's functions through (`import model;
# model.F = shim.F`, whose softmax is tempered: 0.076 apart). The block is refused, with the file that does it.
ELSEWHERE_REBINDS = {
    "sdpa_replaced": ("import torch.nn.functional as F\n\n\ndef sharpened(q, k, v, **kw):\n    return q\n\n\n"
                      "F.scaled_dot_product_attention = sharpened\n", "introduces"),
    "module_global_rebound": ("import types\nimport model\n\nmodel.F = types.SimpleNamespace(softmax=None)\n", "`F`"),
    "module_global_set_by_name": ("import model as m\n\n\ndef setup(shim):\n    setattr(m, 'F', shim)\n", "`F`"),
}


@pytest.mark.parametrize("rebind", sorted(ELSEWHERE_REBINDS))
def test_what_the_patch_calls_rebound_by_another_file_refuses_the_block(tmp_path, rebind) -> None:
    text, why = ELSEWHERE_REBINDS[rebind]
    (tmp_path / "model.py").write_text(attention(PRIOR_BLOCK, init='self.register_buffer("prior", '
                                                 'torch.zeros(1, 1, 8, 8))\n'), encoding="utf-8")
    [alone] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert alone.fix_safety == "safe"
    (tmp_path / "other.py").write_text(text, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.rule == "ADV103" and finding.patch is None and why in finding.reason and "other.py" in finding.reason


# torch's softmax replaced by a name the code computes, or on a module the import machinery gives (a hole found after
# breaker round 23: each was read as a write of some object's attribute, and the patch stayed safe)
COMPUTED_TORCH_WRITES = {
    "computed_name": "import torch.nn.functional as F\n\nname = 'soft' + 'max'\nsetattr(F, name, tempered)\n",
    "spelled_in_parts": "import torch.nn.functional as F\n\nsetattr(F, 'soft' + 'max', tempered)\n",
    "f_string": "import torch.nn.functional as F\n\n\ndef setup(kind):\n    setattr(F, f'{kind}max', tempered)\n",
    "module_bound_to_a_name": "import sys\n\nmod = sys.modules['torch.nn.functional']\nmod.softmax = tempered\n",
    "module_by_computed_name": ("import sys\n\n\ndef setup(name, kind):\n    base = sys.modules[name]\n"
                                "    setattr(base, kind + 'max', tempered)\n"),
    "dunder_import": "def setup(name):\n    __import__(name).softmax = tempered\n",
    "import_module_computed": ("import importlib\n\n\ndef setup(name, kind):\n"
                               "    setattr(importlib.import_module(name), f'{kind}max', tempered)\n"),
    "mock_patch": "from unittest import mock\n\nmock.patch('torch.nn.functional.softmax', tempered).start()\n",
    "monkeypatch": ("import torch.nn.functional as F\n\n\ndef test_it(monkeypatch):\n"
                    "    monkeypatch.setattr(F, 'softmax', tempered)\n"),
    # breaker round 25: the function changed in place, torch's module made another class, or replaced whole
    "function_code": "import torch.nn.functional as F\n\nF.softmax.__code__ = tempered.__code__\n",
    "function_defaults": "import torch.nn.functional as F\n\nF.softmax.__defaults__ = (None, 3, None)\n",
    "module_class": ("import types\n\nimport torch.nn.functional as F\n\n\nclass _M(types.ModuleType):\n"
                     "    pass\n\n\nF.__class__ = _M\n"),
    "module_replaced": "import types\n\ntorch.nn.functional = types.SimpleNamespace(softmax=tempered)\n",
    "module_replaced_in_sys_modules": ("import sys\nimport types\n\nsys.modules['torch.nn.functional'] = "
                                       "types.SimpleNamespace(softmax=tempered)\n"),
}
# ... and names that cannot be torch's softmax: a suffix no name of torch's modules has, the file's own module
NOT_TORCH_WRITES = {
    "suffix_torch_lacks": ("import sys\n\n\ndef alias(cls):\n    base = sys.modules[cls.__module__]\n"
                           "    setattr(base, cls.__name__ + 'Fast', cls)\n"),  # transformers' tokenization_auto.py
    "own_module": "import sys\n\nsys.modules[__name__].softmax = tempered\n",
    # a name computed whole on a module looked up by a computed name: timm's model registry (not read as torch's:
    # outside_writes.UNSPELLED_MODULE_WRITES)
    "model_registry": ("import sys\n\n\ndef register(module_name, mapping):\n    mod = sys.modules[module_name]\n"
                       "    for name, fn in mapping.items():\n        setattr(mod, name, fn)\n"),
}
TEMPERED = "import torch\n\n\ndef tempered(x, dim=None, **kw):\n    return torch.softmax(x / 2.0, dim)\n\n\n"


def _prior_model_beside(tmp_path, other: str):
    """The attention finding of a model file with a zero prior buffer, scanned beside `other.py`."""
    (tmp_path / "model.py").write_text(attention(PRIOR_BLOCK, init='self.register_buffer("prior", '
                                                 'torch.zeros(1, 1, 8, 8))\n'), encoding="utf-8")
    (tmp_path / "other.py").write_text(TEMPERED + other, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    return finding


@pytest.mark.parametrize("write", sorted(COMPUTED_TORCH_WRITES))
def test_torch_s_softmax_replaced_by_a_computed_name_or_module_refuses_the_block(tmp_path, write) -> None:
    finding = _prior_model_beside(tmp_path, COMPUTED_TORCH_WRITES[write])
    assert finding.rule == "ADV103" and finding.patch is None, finding.reason
    assert "`torch." in finding.reason and "other.py" in finding.reason


@pytest.mark.parametrize("write", sorted(NOT_TORCH_WRITES))
def test_a_computed_write_that_cannot_spell_torch_s_softmax_keeps_the_patch(tmp_path, write) -> None:
    finding = _prior_model_beside(tmp_path, NOT_TORCH_WRITES[write])
    assert finding.fix_safety == "safe", finding.reason


MODULE_SCALE = '''import torch

SCALE = 0.25


def attend(q, k, v):
    s = (q @ k.transpose(-2, -1)) * SCALE
    return s.softmax(-1) @ v
'''


@pytest.mark.parametrize("rebind", [
    "import attn\n\nattn.SCALE = torch.full((2, 1, 1), 0.3)\n",
    "import attn as a\n\n\ndef setup():\n    setattr(a, 'SCALE', torch.ones(2, 1, 1))\n",
    # a module looked up by name, its global named in part by the caller (no import of attn to follow)
    "import sys\n\n\ndef setup(module, prefix):\n"
    "    setattr(sys.modules[module], f'{prefix}SCALE', torch.ones(2, 1, 1))\n",
    # ... or named by the caller alone: it may be torch's own module and function as well (refused)
    "import importlib\n\n\ndef setup(module, name):\n    mod = importlib.import_module(module)\n"
    "    setattr(mod, name.upper(), torch.ones(2, 1, 1))\n"])
def test_a_module_level_number_another_file_rebinds_is_not_proved(tmp_path, rebind) -> None:
    """`SCALE = 0.25` was proved a number although a training script of the scan rebinds `attn.SCALE` to a
    per-head tensor: the safe patch passed it to SDPA's `scale=`, which raises on a tensor."""
    (tmp_path / "attn.py").write_text(MODULE_SCALE, encoding="utf-8")
    (tmp_path / "train.py").write_text("import torch\n" + rebind, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    if finding.rule == "ADV103":
        assert "import_module" in rebind and "train.py" in finding.reason
    else:
        assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
        assert finding.fix_safety == "unsafe" and "train.py" in assumed["scale-is-number"]
    [alone] = [f for f in scan_paths([str(tmp_path / "attn.py")], jobs=1).findings if f.kind == "attention"]
    assert alone.fix_safety == "safe"


# 3c. torch's ops changed where the block runs -------------------------------------------------------------------
# Breaker round 13, bug 37: a TorchFunctionMode defined and entered by a training script scaled softmax's output; it
# sees the eager block's softmax and not SDPA (max error 0.39 in the forward, 4.4 in the gradients, fp32).

TEMPERED_MODE = '''import torch
from torch.overrides import TorchFunctionMode


class Tempered(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 0.5 if func in (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax) else out
'''


def test_a_mode_defined_elsewhere_in_the_tree_leaves_the_patch_unproved_and_the_mode_shows_why(tmp_path) -> None:
    (tmp_path / "model.py").write_text(attention(CAUSAL_BLOCK.replace("att = self.attn_drop(att)\n", ""),
                                                 make="model.eval()\n"), encoding="utf-8")
    (tmp_path / "setup.py").write_text(TEMPERED_MODE, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1, unsafe_fixes=True).findings
                 if f.kind == "attention"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and "setup.py" in assumed["torch-ops"]
    [alone] = [f for f in scan_paths([str(tmp_path / "model.py")], jobs=1).findings if f.kind == "attention"]
    assert alone.fix_safety == "safe"
    # the fact is needed: under the mode the patch computes another value (outside it, the same)
    source = (tmp_path / "model.py").read_text(encoding="utf-8")
    original = load_module_from_source(source, "mode_original")
    patched = load_module_from_source(analyze_source(source, "model.py").fixed, "mode_patched")
    mode = load_module_from_source(TEMPERED_MODE, "mode_setup")
    model, (x,) = original.make()
    again, _ = patched.make()
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))
        with mode.Tempered():
            assert (again(x) - model(x)).abs().max() > 0.05


OP_OVERRIDES = {
    "tensor_subclass": "class Logged(torch.Tensor):\n    @classmethod\n"
                       "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                       "        return super().__torch_function__(func, types, args, kwargs)\n",
    "dispatch_mode": "from torch.utils._python_dispatch import TorchDispatchMode\n\n\nclass M(TorchDispatchMode):\n"
                     "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
                     "        return func(*args, **(kwargs or {}))\n",
    "assigned": "def handler(func, types, args=(), kwargs=None):\n    return func(*args, **(kwargs or {}))\n\n\n"
                "class Wrapped(torch.Tensor):\n    __torch_function__ = classmethod(handler)\n",
    "aten_library": "lib = torch.library.Library('aten', 'IMPL')\nlib.impl('softmax', lambda *a: a[0], 'CPU')\n",
    "aten_impl": "@torch.library.impl('aten::_softmax', 'CPU')\ndef fast(x, dim, half):\n    return x\n",
    # breaker round 15, bug 13: a mode torch ships, entered in the tree, sees other ops after the rewrite (the CPU
    # flash kernel has no FLOP formula: 11.0 M FLOPs counted a step before, 4.7 M after)
    "flop_counter": "from torch.utils.flop_counter import FlopCounterMode\n\n\ndef step(m, x):\n"
                    "    with FlopCounterMode(display=False) as counter:\n        m(x).sum().backward()\n"
                    "    return counter.get_total_flops()\n",
    "debug_mode": "import torch.utils._debug_mode\n\nmode = torch.utils._debug_mode.DebugMode()\n",
    # breaker round 16: an import's alias; a pack hook compressing what autograd saves to bf16
    "flop_counter_aliased": "from torch.utils.flop_counter import FlopCounterMode as FLOPCounter\n\n"
                            "counter = FLOPCounter(display=False)\n",
    "saved_tensors_hooks": "def step(m, x):\n    with torch.autograd.graph.saved_tensors_hooks(\n"
                           "            lambda t: t.to(torch.bfloat16), lambda t: t.float()):\n"
                           "        m(x).sum().backward()\n",
}


def test_a_tensor_subclass_in_the_same_file_leaves_the_patch_unproved() -> None:
    source = attention(CAUSAL_BLOCK, head=OP_OVERRIDES["tensor_subclass"])
    [finding] = _attention_findings(source)
    assert finding.fix_safety == "unsafe" and any(
        fact["name"] == "torch-ops" and "this file" in fact["why"] for fact in finding.extra["facts"]["assumed"])


@pytest.mark.parametrize("restore", [
    "sdpa = F.__dict__.pop('scaled_dot_product_attention')\ntry:\n    pass\nfinally:\n"
    "    setattr(F, 'scaled_dot_product_attention', sdpa)\n",
    "kept = F.scaled_dot_product_attention\nF.scaled_dot_product_attention = kept\n",
])
def test_torch_s_op_hidden_and_put_back_is_no_replacement(tmp_path, restore) -> None:
    """A fixture hiding SDPA while it builds a model (to force its manual path) puts torch's own function back."""
    (tmp_path / "model.py").write_text(attention(PRIOR_BLOCK, init='self.register_buffer("prior", '
                                                 'torch.zeros(1, 1, 8, 8))\n'), encoding="utf-8")
    (tmp_path / "other.py").write_text("import torch.nn.functional as F\n\n" + restore, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe"
    (tmp_path / "other.py").write_text("import torch.nn.functional as F\n\n" + restore.replace("sdpa)", "print)")
                                       .replace("= kept", "= print"), encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.rule == "ADV103" and "introduces" in finding.reason


@pytest.mark.parametrize("register, legacy", [("register_backward_hook", True),
                                              ("register_full_backward_hook", False)])
def test_a_legacy_backward_hook_in_the_tree_leaves_the_patch_assumed(tmp_path, register, legacy) -> None:
    """Breaker round 16: `m.register_backward_hook(clip)` (torch's deprecated non-full hook) takes the gradients of
    the last node of the module's forward: the eager product's one, SDPA's three (dq, dk, dv), so a clipping hook
    changed the weights' gradients (0.29). A full backward hook sees the module's inputs and outputs, as before."""
    (tmp_path / "model.py").write_text(attention(PRIOR_BLOCK, init='self.register_buffer("prior", '
                                                 'torch.zeros(1, 1, 8, 8))\n'), encoding="utf-8")
    (tmp_path / "train.py").write_text(f"def clip(model):\n    model.{register}(lambda m, gi, go: gi)\n",
                                       encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"].get("assumed", [])}
    assert ("legacy-backward-hooks" in assumed and "train.py" in assumed["legacy-backward-hooks"]) == legacy
    assert (finding.fix_safety == "safe") != legacy


def test_a_legacy_backward_hook_sees_other_gradients_where_sdpa_ends_the_forward() -> None:
    """What the fact guards against, measured on torch: the hook's grad_input is the last node's."""
    import warnings

    class Eager(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    class Fused(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)

    seen = {}
    for module in (Eager(), Fused()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module.register_backward_hook(lambda m, gi, go: seen.setdefault(type(m).__name__, len(gi)) and None)
            q = torch.randn(1, 2, 4, 8, requires_grad=True)
            module(q, q, q).sum().backward()
    assert seen["Eager"] != seen["Fused"]


# Breaker round 15, bug 05: the patch introduces an SDPA call, so a restriction of SDPA's kernels in the tree is in
# force for it: under `sdpa_kernel(SDPBackend.FLASH_ATTENTION)` a call with dropout in training (or 3-D inputs)
# raised `No available kernel` where the eager block ran.
RESTRICTIONS = {
    "flash_only": ("from torch.nn.attention import SDPBackend, sdpa_kernel\n\n\ndef run(m, x):\n"
                   "    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n        return m(x)\n", True),
    "computed_backends": ("import torch\n\n\ndef run(m, x, backends):\n"
                          "    with torch.nn.attention.sdpa_kernel(backends):\n        return m(x)\n", True),
    "math_switched_off": ("import torch\n\ntorch.backends.cuda.enable_math_sdp(False)\n", True),
    "old_context": ("import torch\n\nwith torch.backends.cuda.sdp_kernel(enable_math=False):\n    pass\n", True),
    "math_kept": ("from torch.nn.attention import SDPBackend, sdpa_kernel\n\n\ndef run(m, x):\n"
                  "    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):\n        return m(x)\n", False),
    "flash_switched_off": ("import torch\n\ntorch.backends.cuda.enable_flash_sdp(False)\n", False),
    # breaker round 16: the context reached by another name, or MATH named only to be filtered out
    "partial": ("import functools\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n"
                "flash = functools.partial(sdpa_kernel, [SDPBackend.FLASH_ATTENTION])\n", True),
    "aliased": ("from torch.nn.attention import SDPBackend, sdpa_kernel as kernels\n\n\ndef run(m, x):\n"
                "    with kernels(SDPBackend.FLASH_ATTENTION):\n        return m(x)\n", True),
    "math_filtered_out": ("from torch.nn.attention import SDPBackend, sdpa_kernel\n\n\ndef run(m, x):\n"
                          "    with sdpa_kernel([b for b in SDPBackend if b != SDPBackend.MATH]):\n"
                          "        return m(x)\n", True),
}


@pytest.mark.parametrize("kind", sorted(RESTRICTIONS))
def test_sdpa_kernels_restricted_without_math_in_the_tree_leave_the_patch_assumed(tmp_path, kind) -> None:
    text, restricts = RESTRICTIONS[kind]
    (tmp_path / "model.py").write_text(attention(PRIOR_BLOCK, init='self.register_buffer("prior", '
                                                 'torch.zeros(1, 1, 8, 8))\n'), encoding="utf-8")
    (tmp_path / "run.py").write_text(text, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"].get("assumed", [])}
    assert ("sdpa-kernels" in assumed and "run.py" in assumed["sdpa-kernels"]) == restricts
    assert (finding.fix_safety == "safe") != restricts


def test_a_flash_only_restriction_refuses_what_the_math_kernel_takes() -> None:
    """What the fact guards against, measured: dropout in training under a flash-only restriction on CPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(2, 2, 6, 8)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="No available kernel"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


@pytest.mark.parametrize("kind", sorted(OP_OVERRIDES))
def test_what_may_change_torch_s_ops_is_found(kind: str) -> None:
    assert op_overrides("import torch\n\n" + OP_OVERRIDES[kind])


@pytest.mark.parametrize("text", [
    "class Plain(torch.Tensor):\n    __torch_function__ = torch._C._disabled_torch_function_impl\n",
    "@torch.library.custom_op('mylib::attend', mutates_args=())\ndef attend(x: torch.Tensor) -> torch.Tensor:\n"
    "    return x.clone()\n",
    "# a comment naming __torch_function__ and torch.library\nx = '__torch_dispatch__'\n",
    "from torch.utils.flop_counter import FlopCounterMode  # imported, never built\n",
    "def step(m, x):\n    with torch.autograd.graph.save_on_cpu():\n        m(x).sum().backward()\n",
])
def test_what_leaves_torch_s_ops_alone_is_not_found(text: str) -> None:
    assert op_overrides("import torch\n\n" + text) == []
