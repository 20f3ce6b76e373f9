"""Forms an outside breaker wrote, without reading our fixtures, on which a safe patch was wrong: each is held to
the original's float64 outputs and input gradients (or must no longer be offered as safe)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from advisor.static.tree_facts import tree_context
from fixture_models import load_module_from_source


def _safe_fixed(source: str) -> str:
    result = analyze_source(source, "hostile.py")
    safe = [f for f in result.findings if f.kind == "attention" and f.fixable and f.fix_safety == "safe"]
    assert safe, [(f.rule, f.fix_safety, f.reason) for f in result.findings]
    return result.fixed_with(safe).text


def _assert_same(source: str, fixed: str, inputs: tuple) -> None:
    outputs = []
    for index, code in enumerate((source, fixed)):
        module = load_module_from_source(code, f"hostile_{index}")
        torch.manual_seed(0)
        model = module.Attn().double()
        args = [x.double().requires_grad_() if x.is_floating_point() else x for x in inputs]
        out = model(*args)
        grads = torch.autograd.grad(out.square().sum(), [a for a in args if a.requires_grad], allow_unused=True)
        outputs.append((out, *grads))
    for got, want in zip(outputs[1], outputs[0]):
        if want is None or got is None:
            assert want is None and got is None
            continue
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10, equal_nan=True)


def _qkv() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    return tuple(torch.randn(2, 2, 5, 8, generator=generator) for _ in range(3))


def test_a_module_imported_only_inside_another_function_is_not_used_by_the_patch():
    """`import torch.nn.functional as F` in another method binds F there only: the patch once called
    `F.scaled_dot_product_attention` in `forward`, a NameError."""
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def forward(self, q, k, v):
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                return att.softmax(dim=-1) @ v

            def extra(self, x):
                import torch.nn.functional as F
                return F.relu(x)
        ''')
    fixed = _safe_fixed(source)
    assert "F.scaled_dot_product_attention" not in fixed
    _assert_same(source, fixed, _qkv())


@pytest.mark.parametrize("test", ["mask < 0.5", "mask <= 0.5", "mask > 0.5", "mask >= 0.5"])
def test_an_ordering_of_a_float_mask_is_negated_as_a_whole(test):
    """`masked_fill(mask < 0.5, -inf)` keeps where `mask < 0.5` is False, NaN entries included; `mask >= 0.5` is also
    False there, so the keep mask is `~(mask < 0.5)`, not the flipped comparison."""
    source = textwrap.dedent(f'''\
        import math
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Attn(nn.Module):
            def forward(self, q, k, v, mask):
                att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
                att = att.masked_fill({test}, float("-inf"))
                return F.softmax(att, dim=-1) @ v
        ''')
    mask = torch.ones(5, 5)
    mask[:, 3] = float("nan")
    mask[:, 1] = 0.0
    _assert_same(source, _safe_fixed(source), (*_qkv(), mask))


RETURNS_WEIGHTS = '''\
import math
import torch
import torch.nn as nn


def attention(q, k, v):
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.softmax(-1)
    return att @ v, att


class Attn(nn.Module):
    def forward(self, q, k, v):
        out, w = attention(q, k, v)
{reads}
'''


@pytest.mark.parametrize("reads", [
    "\n        def peek():\n            return w\n        return out, peek()",  # a closure reads it
    "        return out, locals()[\"w\"]",  # the frame's locals read it
])
def test_weights_read_other_than_by_name_are_not_dropped(tmp_path, reads):
    """`out, w = attention(q, k, v)` where `w` is read only in a nested function, or through `locals()`: the
    caller's own flow has no read of `w`, so None may not stand in for the weights."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(RETURNS_WEIGHTS.format(reads=reads))
    findings = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert findings and not any(f.fixable and f.fix_safety == "safe" for f in findings), \
        [(f.rule, f.fix_safety, f.reason) for f in findings]


SCORES_HELPER = '''\
import math
import torch
import torch.nn as nn


{before}


class Attn(nn.Module):
{method}
    def forward(self, q, k, v):
{body}
        att = att.softmax(-1)
        return att @ v


def build():
    m = Attn()
{after}
    return m
'''


@pytest.mark.parametrize("before, method, body, after", [
    # grad switched off by a statement around the scores: the original gives q and k no gradient
    ("", "", "        torch.set_grad_enabled(False)\n        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))\n"
             "        torch.set_grad_enabled(True)", ""),
    # a helper the file rebinds (wrapped in no_grad): the name is no longer the function read
    ("def scores(q, k):\n    return (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))\n\n\nscores = "
     "torch.no_grad()(scores)", "", "        att = scores(q, k)", ""),
    # a method the file replaces on an instance
    ("", "    def scores(self, q, k):\n        return (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))\n",
     "        att = self.scores(q, k)", "    m.scores = lambda q, k: (q @ k.transpose(-2, -1)) * 2"),
])
def test_what_runs_in_place_of_the_scores_code_at_run_time_stops_the_safe_patch(before, method, body, after):
    source = SCORES_HELPER.format(before=before, method=method, body=body, after=after or "    pass")
    findings = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert not any(f.fixable and f.fix_safety == "safe" for f in findings), \
        [(f.rule, f.fix_safety, f.reason) for f in findings]  # the helper is not read: no finding, or no safe one
    module = load_module_from_source(source, "hostile_helper")  # the original itself runs
    q, k, v = _qkv()
    module.build()(q, k, v)


@pytest.mark.parametrize("scale, safe", [(0.3, True), (-0.3, True), (0.0, True), ("-0.3", False), ("0.0", False)])
def test_a_factor_after_a_neginf_mask_must_be_positive(scale, safe):
    """`masked_fill(~mask, -inf)` then `* self.scale`: -inf times a positive number stays -inf, times 0 is NaN and
    times a negative number +inf, where SDPA (which scales, then masks) still masks. A literal that is not positive
    is refused; a scale read from an attribute is checked at run time (`self.scale > 0`), the original running
    otherwise."""
    value = scale if isinstance(scale, str) else "scale"
    source = textwrap.dedent(f'''\
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def __init__(self, scale=0.3):
                super().__init__()
                self.scale = scale

            def forward(self, q, k, v, mask):
                att = q @ k.transpose(-2, -1)
                att = att.masked_fill(~mask, float("-inf"))
                att = att * {"self.scale" if value == "scale" else value}
                return att.softmax(dim=-1) @ v
        ''')
    findings = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    if not safe:
        assert findings and not any(f.fixable for f in findings), [(f.fix_safety, f.reason) for f in findings]
        return
    fixed = _safe_fixed(source)
    assert "self.scale > 0" in fixed
    outputs = []
    for index, code in enumerate((source, fixed)):
        module = load_module_from_source(code, f"hostile_scale_{index}")
        model = module.Attn(scale).double()
        q, k, v = (x.double().requires_grad_() for x in _qkv())
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        out = model(q, k, v, mask)
        outputs.append((out, *torch.autograd.grad(out.nan_to_num().square().sum(), (q, k, v))))
    for got, want in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10, equal_nan=True)


@pytest.mark.parametrize("imports", [
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch.nn.functional as F",  # never runs
    "import torch.nn.functional as F\ndel F",  # deleted at module level
])
def test_an_alias_the_module_does_not_hold_at_run_time_is_not_used_by_the_patch(imports):
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn
        {imports}


        class Attn(nn.Module):
            def forward(self, q, k, v):
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                return att.softmax(dim=-1) @ v
        ''').format(imports=imports)
    fixed = _safe_fixed(source)
    assert "F.scaled_dot_product_attention" not in fixed
    _assert_same(source, fixed, _qkv())


@pytest.mark.parametrize("imports", [
    "MYPY = False\nif MYPY:\n    import torch",  # a flag that is false when the module runs
    "import sys\nif sys.version_info >= (4, 0):\n    import torch",  # a version gate
])
def test_an_import_that_may_not_run_is_not_read_by_the_patch(imports):
    """Breaker round 19: the patch called `torch.nn.functional...` through an `import torch` under an `if` that is
    false at run time (NameError after the fix); it imports what it calls itself."""
    source = textwrap.dedent('''\
        from __future__ import annotations
        {imports}


        def attend(q, k, v):
            s = q.matmul(k.transpose(-1, -2)) * q.size(-1) ** -0.5
            return s.softmax(dim=-1).matmul(v)
        ''').format(imports=imports)
    fixed = _safe_fixed(source)
    assert "import torch.nn.functional as F" in fixed
    q, k, v = _qkv()
    attend = load_module_from_source(fixed, "conditional_import").attend
    torch.testing.assert_close(attend(q, k, v), load_module_from_source(source, "conditional_import_o").attend(q, k, v))


@pytest.mark.parametrize("opening", ['"Doc " "string."\nfrom __future__ import annotations\n',
                                     '"""Doc."""\nfrom __future__ import annotations; x = 1\n'])
def test_the_added_import_goes_after_every_future_import(opening):
    """Breaker round 19: after a concatenated docstring, or a future import sharing its line, the added import
    went above `from __future__` (SyntaxError)."""
    source = opening + textwrap.dedent('''\


        def attend(q, k, v):
            s = q.matmul(k.transpose(-1, -2)) / 8.0
            return s.softmax(dim=-1).matmul(v)
        ''')
    fixed = _safe_fixed(source)
    compile(fixed, "fixed.py", "exec")
    assert fixed.index("from __future__") < fixed.index("import torch.nn.functional as F")


def test_a_name_the_rewrite_adds_that_a_star_importer_spells_is_refused(tmp_path):
    """Breaker round 19: `from layers import *` in main.py after `from constants import *` (F = 32): the `F` the fix
    added to layers.py replaced main.py's."""
    (tmp_path / "layers.py").write_text(textwrap.dedent('''\
        def attend(q, k, v):
            s = q.matmul(k.transpose(-1, -2)) / 8.0
            return s.softmax(dim=-1).matmul(v)
        '''))
    (tmp_path / "constants.py").write_text("F = 32\n")
    (tmp_path / "main.py").write_text("from constants import *\nfrom layers import *\n\nprint(F)\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert not finding.fixable and "imports this module's `*`" in finding.reason, finding.reason
    (tmp_path / "main.py").write_text("from constants import *\nfrom layers import *\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert finding.fixable and finding.fix_safety == "safe"


@pytest.mark.parametrize("write, why", [
    ("reset(keep)", "may write it in place"),  # a function of this file that fills it
    ("torch.nn.init.zeros_(q)", "`q` is written in place"),  # torch's `_` naming: an in-place write of q
    ("torch.nn.init.constant_(k, 0.0)", "`k` is written in place"),
])
def test_a_tensor_handed_to_code_that_may_write_it_between_the_scores_and_the_value_product(write, why):
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def reset(m):
            m.fill_(True)


        class Attn(nn.Module):
            def forward(self, q, k, v, keep):
                att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
                att = att.masked_fill(~keep, float("-inf"))
                {write}
                att = F.softmax(att, dim=-1)
                return att @ v
        ''').format(write=write)
    findings = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert findings and not any(f.fixable for f in findings), [(f.fix_safety, f.reason) for f in findings]
    assert why in findings[0].reason


def test_a_method_the_class_body_rebinds_is_not_read_from_its_def():
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn


        def twice(f):
            def g(*a):
                return f(*a) * 2
            return g


        class Attn(nn.Module):
            def scores(self, q, k):
                return (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            scores = twice(scores)

            def forward(self, q, k, v):
                att = self.scores(q, k)
                att = att.softmax(-1)
                return att @ v
        ''')
    findings = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert not any(f.fixable and f.fix_safety == "safe" for f in findings)


@pytest.mark.parametrize("switch", ["self.train()", "self.drop.train(True)", "self.drop.eval()"])
def test_a_mode_switch_between_the_dropout_and_the_value_product_stops_the_safe_patch(switch):
    """The patch reads the dropout's `training` flag at the SDPA call; `self.train()` between the original's dropout
    and its value product flips it after the original read it (eval model: no dropout there, p=0.5 in the patch)."""
    source = textwrap.dedent(f'''\
        import math
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.5)

            def forward(self, q, k, v):
                att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
                att = self.drop(att.softmax(-1))
                {switch}
                return att @ v
        ''')
    findings = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert findings and not any(f.fixable and f.fix_safety == "safe" for f in findings), \
        [(f.rule, f.fix_safety, f.reason) for f in findings]
    assert "is written at line 14, between the scores and the value product" in findings[0].reason


@pytest.mark.parametrize("register, loaded", [
    ('self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))', True),
    ('self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16), persistent=False)', False),
    ('self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16), False)', False),
])
def test_a_proof_from_a_persistent_buffer_names_the_state_dict_it_trusts(register, loaded):
    """The causal proof reads what `register_buffer` stored; `load_state_dict` may put other values in a persistent
    buffer (an outside breaker loaded all-ones: the patch kept the triangle). The finding says so (accepted)."""
    source = textwrap.dedent(f'''\
        import math
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                {register}

            def forward(self, q, k, v):
                T = q.size(-2)
                mask = self.bias[:, :, :T, :T]
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(mask == 0, float("-inf"))
                return att.softmax(dim=-1) @ v
        ''')
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    accepted = {fact["name"]: fact for fact in finding.extra["facts"]["accepted"]}
    assert finding.fix_safety == "safe" and ("loaded-buffers" in accepted) == loaded, finding.extra["facts"]
    if loaded:
        assert "`self.bias`" in accepted["loaded-buffers"]["statement"]


LOADED_HERE = {  # breaker round 18: the model's own file edits a state dict and loads it (bidirectional)
    "direct": "sd = m.state_dict()\n    sd['bias'] = torch.ones(1, 1, 16, 16)\n    m.load_state_dict(sd)",
    "parent": "w = nn.Sequential(m)\n    sd = {k: v.clone() for k, v in w.state_dict().items()}\n"
              "    sd['0.bias'] = torch.ones(1, 1, 16, 16)\n    w.load_state_dict(sd)",
    "saved": "sd = m.state_dict()\n    sd['bias'] = torch.ones(1, 1, 16, 16)\n    torch.save(sd, path)\n"
             "    m.load_state_dict(torch.load(path))",
}


@pytest.mark.parametrize("load", sorted(LOADED_HERE))
def test_a_state_dict_edited_and_loaded_in_the_model_s_own_file_is_no_checkpoint_it_saved(tmp_path, load):
    """`loaded-buffers` trusts a checkpoint the model saved; a file that lists the model's tensors whole and hands
    them on (here, edits the dict and loads it) may put anything in the causal buffer, in its own file as in
    another (it was caught only in another: the patch was causal where the loaded model was bidirectional, output
    1.3x its size apart)."""
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

            def forward(self, q, k, v):
                T = q.size(-2)
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                return att.softmax(dim=-1) @ v


        def run(q, k, v, path):
            m = Attn()
        ''') + "    " + LOADED_HERE[load] + "\n    return m(q, k, v)\n"
    result = analyze_source(source, "model.py")
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert "loaded-buffers" not in {fact["name"] for fact in finding.extra["facts"]["accepted"]}
    q, k, v = (torch.randn(2, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    want = load_module_from_source(source, "loaded_original").run(q, k, v, str(tmp_path / "a.pt"))
    if finding.fixable and finding.fix_safety == "safe":
        got = load_module_from_source(result.fixed, "loaded_patched").run(q, k, v, str(tmp_path / "b.pt"))
        torch.testing.assert_close(got, want)


STAR_BLOCK = """{head}import torch
import torch.nn as nn
{middle}

def attn(q, k, v):
    s = q @ k.transpose(-2, -1) / 8.0
    return s.softmax(dim=-1) @ v
{tail}"""


@pytest.mark.parametrize("head, middle, tail, safe", [
    ("", "", "\n\nfrom helpers import *\n", False),  # after: may bind `F`, `nn`, `torch`
    # among the opening imports, after `import torch.nn as nn`: the SDPA call would be read through `nn`, which
    # helpers.py binds to None (a wrong safe patch until round 45's review: `nn.functional` raised)
    ("", "from helpers import *\n", "", False),
    ("from helpers import *\n", "", "", True),
    ("", "", "\n\nfrom torch.nn.functional import *\n", True),  # torch's own names
])
def test_a_star_import_after_the_opening_imports_may_rebind_the_name_the_sdpa_call_is_read_through(
        tmp_path, head, middle, tail, safe):
    """Breaker round 18: the fix imported `torch.nn.functional as F` (no word of the file spells F) and a later
    `from helpers import *` bound `F` to a string: attn() raised after the fix, ran before."""
    (tmp_path / "helpers.py").write_text("F = 'a helper constant'\nnn = None\n")
    (tmp_path / "m.py").write_text(STAR_BLOCK.format(head=head, middle=middle, tail=tail))
    [finding] = scan_paths([str(tmp_path / "m.py")], cache=False).findings
    assert (finding.fixable and finding.fix_safety == "safe") == safe, finding.reason
    if not safe and tail:
        assert "`from helpers import *` (line 10) runs after the imports that open the module" in finding.reason
    elif not safe:
        assert "`nn` may be bound anew after its import" in finding.reason, finding.reason


def test_the_name_the_rewrite_adds_assigned_on_the_module_in_another_file_is_refused(tmp_path):
    (tmp_path / "m.py").write_text(STAR_BLOCK.format(head="", middle="", tail="").replace("import torch.nn as nn\n", ""))
    (tmp_path / "main.py").write_text("import m\n\nm.F = None\n")
    [finding] = scan_paths([str(tmp_path)], cache=False).findings
    assert not finding.fixable and "`F`, the name the rewrite would import" in finding.reason, finding.reason


def _safe_findings(source: str) -> list:
    return [f for f in analyze_source(source, "hostile.py").findings
            if f.kind == "attention" and f.fixable and f.fix_safety == "safe"]


DROPOUT_BLOCK = '''\
import math
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_drop = nn.Dropout(0.5)
        self.switch = self.train

    def forward(self, q, k, v):
        a = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
        a = self.attn_drop(a.softmax(-1))
        {switch}
        return a @ v
'''


@pytest.mark.parametrize("switch", [
    "self.apply(lambda m: m.train(not m.training))",
    "nn.Module.train(self, not self.training)",
    "type(self).train(self, not self.training)",
    "for m in self.modules(): m.training = not m.training",
    'setattr(self.attn_drop, "training", not self.attn_drop.training)',
    'self.__dict__["_modules"]["attn_drop"] = nn.Identity()',
    # a fourth breaker's: through a helper given `self`, a method looked up by name, the namespace, `__call__`, a
    # loop over modules setting `p`
    "switch_off(self)",
    'getattr(self.attn_drop, "train")(False)',
    "self.attn_drop.__dict__.update(training=False)",
    'vars(self.attn_drop)["training"] = False',
    '__import__("operator").methodcaller("train", False)(self.attn_drop)',
    "self.attn_drop.train.__call__(False)",
    "for m in self.modules(): m.p = 0.0",
    # through a method stored on the instance, and on a module looked up by name
    "self.switch(False)",
    'getattr(self, "attn_drop").p = 0.0',
])
def test_every_spelling_of_a_mode_switch_between_dropout_and_value_product_stops_the_safe_patch(switch):
    """A second breaker's spellings of the training-flag flip the first fix (`self.train()`) did not see."""
    helper = "\n\ndef switch_off(module):\n    module.eval()\n"
    assert not _safe_findings(DROPOUT_BLOCK.format(switch=switch) + helper)


def test_an_attribute_holding_a_number_read_from_elsewhere_is_no_stored_method():
    """transformers' `self.dropout = config.attention_probs_dropout_prob` in one class, `self.dropout(probs)` (a
    module) in another: a value read from `config` is no method of `self`, and the call switches no flag."""
    source = DROPOUT_BLOCK.format(switch="pass").replace("self.attn_drop(", "self.dropout(").replace(
        "self.attn_drop = nn.Dropout(0.5)", "self.dropout = nn.Dropout(0.5)") + textwrap.dedent('''\


        class Settings:
            def __init__(self, config):
                self.dropout = config.attention_probs_dropout_prob
        ''')
    assert _safe_findings(source)


@pytest.mark.parametrize("after", [
    'model.set_submodule("softmax", Other())',
    'setattr(model.softmax, "dim", -2)',
    'model.get_submodule("softmax").dim = -2',
    # a fourth breaker's: through an alias, a loop over modules, the namespace, an attribute table in it
    "sm = model.softmax; sm.dim = -2",
    '[setattr(m, "dim", -2) for m in model.modules() if isinstance(m, nn.Softmax)]',
    "for m in model.modules(): m.dim = -2",
    'vars(model.softmax)["dim"] = -2',
    'model.__dict__["_modules"]["softmax"] = Other()',
    "model._modules.update(softmax=Other())",
    "for m in list(model.modules())[1:]: m.forward = lambda x: x.softmax(-2)",
    # narrowed to Softmax modules, which the deleted `self.softmax` is: the write counts for it
    "for m in model.modules():\n    if isinstance(m, nn.Softmax):\n        m.dim = -2",
])
def test_a_softmax_module_changed_by_name_from_outside_is_checked_at_run_time(after):
    source = textwrap.dedent('''\
        import torch
        import torch.nn as nn


        class Other(nn.Module):
            def forward(self, x):
                return x.relu() / x.relu().sum(-1, keepdim=True).clamp_min(1e-6)


        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.softmax = nn.Softmax(dim=-1)

            def forward(self, q, k, v):
                return self.softmax((q @ k.transpose(-2, -1)) * 0.125) @ v


        model = Attn()
        ''') + after + "\n"
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert finding.fix_safety != "safe" or "module-identity" in {
        fact["name"] for fact in finding.extra["facts"]["guarded"]}, finding.extra["facts"]
    module = load_module_from_source(source, "hostile_softmax_original")
    patched = load_module_from_source(analyze_source(source, "hostile.py").fixed, "hostile_softmax_patched")
    q, k, v = _qkv()
    torch.testing.assert_close(patched.model(q, k, v), module.model(q, k, v))


@pytest.mark.parametrize("register", [
    "hook = model.attn_drop.register_forward_hook\nhook(lambda m, i, o: o * 2)",
    "functools.partial(nn.Module.register_forward_hook, model.attn_drop)(lambda m, i, o: o * 2)",
])
def test_a_hook_registration_passed_on_as_a_value_is_checked_at_run_time(register):
    """A bound registration method called through a name (a fourth breaker's): the deleted dropout's hook never
    ran (fp64 output error 1.86)."""
    source = f"import functools\n{DROPOUT_BLOCK.format(switch='pass')}\n\nmodel = Attn().eval()\n{register}\n"
    [finding] = _safe_findings(source)
    assert "no-hooks" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    original = load_module_from_source(source, "hook_value_original")
    patched = load_module_from_source(analyze_source(source, "hostile.py").fixed, "hook_value_patched")
    q, k, v = _qkv()
    torch.testing.assert_close(patched.model(q, k, v), original.model(q, k, v))


def test_a_hook_registered_by_a_computed_method_name_is_checked_at_run_time():
    source = DROPOUT_BLOCK.format(switch="pass") + textwrap.dedent('''\


        def instrument(model, fn, kind="forward"):
            for m in model.modules():
                if isinstance(m, nn.Dropout):
                    getattr(m, f"register_{kind}_hook")(fn)
            return model
        ''')
    [finding] = _safe_findings(source)
    assert "no-hooks" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}


CAUSAL_BUFFER_BLOCK = textwrap.dedent('''\
    import math
    import torch
    import torch.nn as nn
    from torch.nn.utils import vector_to_parameters


    class Attn({base}):
        def __init__(self):
            super().__init__({init})
            self.register_buffer("{name}", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8), persistent=False)

        def forward(self, q, k, v):
            T = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.{name}[:, :, :T, :T] == 0, float("-inf"))
            return att.softmax(dim=-1) @ v


    model = Attn()
    ''')


@pytest.mark.parametrize("write", [
    'model.get_buffer("bias").fill_(1)',
    "[b.fill_(1) for b in model.buffers()]",
    "_ = any(b.fill_(1) is None for n, b in model.named_buffers() if n)",
    "list(map(lambda b: b.fill_(1), model.buffers()))",
    "torch.fill_(model.bias, 1)",
    "torch.Tensor.fill_(model.bias, 1)",
    "nn.init.ones_(model.bias)",
    "vector_to_parameters(torch.ones(64), [model.bias])",
    # a fourth breaker's: through an alias, a view, a getattr, an operator method, the namespace's tables
    "b = model.bias\nb[...] = 1",
    "(x := model.bias).fill_(1)",
    "for row in model.bias:\n    row.fill_(1)",
    "model.bias.diagonal(1).fill_(1)",
    "model.bias.view(-1)[:] = 1",
    'getattr(model, "bias").fill_(1)',
    "model.bias.__setitem__(Ellipsis, 1)",
    'model.__dict__["_buffers"]["bias"] = torch.ones(1, 1, 8, 8)',
    "def fill(t):\n    t.fill_(1)\n\n\nfill(model.bias)",  # a function of the file that writes what it is given
    "torch.add(model.bias, 1, out=model.bias)",
    "import operator\noperator.iadd(model.bias, 1)",
    "import operator\noperator.setitem(model.bias, Ellipsis, 1)",
    "torch.utils.swap_tensors(model.bias, torch.ones(1, 1, 8, 8))",
    "model.bias.__class__.fill_(model.bias, 1)",
    'model.__dict__.get("_buffers")["bias"] = torch.ones(1, 1, 8, 8)',
    # a lambda writing what it is given: called at once, bound to a name, or passed on with the tensors
    "(lambda t: t.fill_(1))(model.bias)",
    "fill = lambda t: t.fill_(1)\nfill(model.bias)",
    "list(map(lambda t: t.fill_(1), [model.bias]))",
    "def fill(t):\n    t.fill_(1)\n\n\nlist(map(fill, (model.bias,)))",
    # a fifth breaker's: a parametrization turns the buffer into a property computed at each read
    'torch.nn.utils.parametrize.register_parametrization(model, "bias", nn.Identity())',
])
def test_a_causal_buffer_the_caller_overwrites_is_not_read_as_registered(write):
    """A `persistent=False` causal buffer filled with ones by the caller: each spelling made the safe patch pass
    `is_causal=True` where the original attends to every key (fp64 output error 3.18)."""
    _assert_the_buffer_is_read_as_it_is(CAUSAL_BUFFER_BLOCK.format(base="nn.Module", init="", name="bias") + write +
                                        "\n")


def _assert_the_buffer_is_read_as_it_is(source: str) -> None:
    """No `is_causal` from the class's triangle, and the patched model's output is the original's."""
    fixed = analyze_source(source, "hostile.py").fixed
    assert "is_causal" not in fixed
    original = load_module_from_source(source, "hostile_buffer_original")
    patched = load_module_from_source(fixed, "hostile_buffer_patched")
    q, k, v = _qkv()
    torch.testing.assert_close(patched.model(q, k, v), original.model(q, k, v))


INIT_WEIGHTS = textwrap.dedent('''\


    def init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)


    model.apply(init_weights)
    ''')


def test_an_init_narrowed_to_torch_layers_keeps_the_causal_proof():
    """nanoGPT's `_init_weights` zeroes `module.bias` only where `isinstance(module, nn.Linear)`: an attention
    class deriving from nn.Module alone is never such a module, so its causal `bias` keeps its proof."""
    source = CAUSAL_BUFFER_BLOCK.format(base="nn.Module", init="", name="bias") + INIT_WEIGHTS
    [finding] = _safe_findings(source)
    assert "is_causal=True" in analyze_source(source, "hostile.py").fixed


def test_an_init_narrowed_to_a_layer_the_attention_derives_from_counts():
    """The same init on an attention class that is itself an nn.Linear writes its buffer (ones everywhere)."""
    init = INIT_WEIGHTS.replace("torch.nn.init.zeros_(module.bias)", "torch.nn.init.ones_(module.mask)").replace(
        "if module.bias is not None", "if hasattr(module, 'mask')")
    _assert_the_buffer_is_read_as_it_is(CAUSAL_BUFFER_BLOCK.format(base="nn.Linear", init="8, 8", name="mask") + init)


def test_a_function_reached_by_a_string_of_its_name_has_a_caller_no_use_shows(tmp_path):
    """`getattr(sys.modules[__name__], "attention")(q, k, v)` reads the weights the function returns, although the
    one call spelled by name drops them: the weights are not dropped (the patch returned None for them)."""
    source = textwrap.dedent('''\
        import math
        import sys
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        __all__ = ["attention"]


        def attention(q, k, v):
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            w = F.softmax(s, dim=-1)
            return w @ v, w


        class A(nn.Module):
            def forward(self, q, k, v):
                out, _ = attention(q, k, v)
                return out


        class B(nn.Module):
            def forward(self, q, k, v):
                out, w = getattr(sys.modules[__name__], "attention")(q, k, v)
                return out, w
        ''')
    def safe_in_tree(text: str) -> list:
        path = tmp_path / "program.py"
        path.write_text(text)
        result = analyze_source(text, str(path), tree_context=tree_context([str(path)]))
        return [f for f in result.findings if f.kind == "attention" and f.fixable and f.fix_safety == "safe"]

    assert not safe_in_tree(source)
    dropped = source.replace('getattr(sys.modules[__name__], "attention")', "attention").replace(
        "out, w = attention(q, k, v)\n        return out, w", "out, _ = attention(q, k, v)\n        return out")
    assert safe_in_tree(dropped)  # every caller drops them, `__all__` naming the function notwithstanding


def test_a_block_libcst_cannot_render_back_says_why_it_has_no_patch():
    """A form feed before the block's first line (valid Python): the rewrite fails (RewriteFailed) and the finding
    was `safe`, not fixable, with no reason at all; it now carries the rewrite's reason."""
    nanogpt = Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
    source = nanogpt.read_text().replace("        att = (q @ k", "\x0c        att = (q @ k")
    compile(source, "hostile.py", "exec")
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert finding.fixable or finding.reason, finding


WEIGHTS_READ_LATER = {
    "deleted": ("    if output_attentions:\n        return y, att\n    del att, s\n    return y\n", True),
    "deleted_with_a_kept_name": ("    t = y * 2\n    del att, t\n    return y\n", True),
    "nested_function": ("    def weights():\n        return att\n    if output_attentions:\n"
                        "        return y, weights()\n    return y\n", False),
    "locals": ("    if output_attentions:\n        return y, locals()['att']\n    return y\n", False),
}


@pytest.mark.parametrize("name", sorted(WEIGHTS_READ_LATER))
def test_weights_read_or_deleted_after_the_block_keep_working(name):
    """`del att` after the block raised UnboundLocalError on every call of the patch (the memory idiom), and a
    nested `def` or `locals()` reading the weights raised NameError/KeyError: a `del` of names only the deleted
    statements bound goes with them; the other two reads refuse the patch."""
    tail, patched_expected = WEIGHTS_READ_LATER[name]
    source = ("import torch\nimport torch.nn.functional as F\n\n\ndef f(q, k, v, output_attentions=False):\n"
              "    s = q @ k.transpose(-2, -1) * 0.125\n    att = F.softmax(s, dim=-1)\n    y = att @ v\n" + tail)
    result = analyze_source(source, "hostile.py")
    assert ("scaled_dot_product_attention" in result.fixed) == patched_expected, result.findings[0].reason
    original = load_module_from_source(source, f"later_{name}").f
    patched = load_module_from_source(result.fixed, f"later_{name}_fixed").f
    q, k, v = _qkv()
    for flag in (False, True):
        torch.testing.assert_close(patched(q, k, v, flag), original(q, k, v, flag))


MASKED_THEN_DELETED = """import torch


def attend(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / 4.0
    if mask is not None:
        {apply}
    probs = scores.softmax(-1)
    out = probs @ v
    del scores, probs
    return out
"""


@pytest.mark.parametrize("apply", ["scores = scores.masked_fill(mask == 0, -1e9)",
                                   "scores = scores.masked_fill(mask == 0, float('-inf'))",
                                   "scores = scores + mask"])
def test_a_deleted_name_a_hoisted_mask_statement_no_longer_binds_goes_from_the_del(apply):
    """A fourteenth breaker's: the mask statement under `if mask is not None:` becomes the mask bound for SDPA,
    which binds `scores` no more, and the `del scores` kept after the (guarded) patch raised UnboundLocalError."""
    source = MASKED_THEN_DELETED.format(apply=apply)
    result = analyze_source(source, "hostile.py", unsafe_fixes=True)
    assert "scaled_dot_product_attention" in result.fixed
    original = load_module_from_source(source, "masked_deleted").attend
    patched = load_module_from_source(result.fixed, "masked_deleted_fixed").attend
    q, k, v = _qkv()
    keep = torch.ones(q.shape[-2], k.shape[-2])
    keep[:, -1] = 0
    for mask in (None, keep if "+" not in apply else keep - 1):
        torch.testing.assert_close(patched(q, k, v, mask), original(q, k, v, mask))


def test_a_mixin_before_the_class_in_a_subclass_overriding_a_helper_refuses():
    """`class Sub(Mix, Attn)`: Mix's `scores` comes first in Sub's method resolution order, so the inlined helper
    is not what Sub's instances run (fp64 output error 1.29 before); a direct override was already refused."""
    source = textwrap.dedent('''\
        import torch
        import torch.nn as nn


        class Attn(nn.Module):
            def scores(self, q, k):
                return (q @ k.transpose(-2, -1)) * 0.125

            def forward(self, q, k, v):
                return self.scores(q, k).softmax(-1) @ v


        class Mix:
            def scores(self, q, k):
                return (q @ k.transpose(-2, -1)) * 0.5


        class Sub(Mix, Attn):
            pass
        ''')
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert finding.fix_safety != "safe" and "Mix" in (finding.reason or ""), finding.reason


HELPER_BLOCK = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class Attn(nn.Module):
        def scores(self, q, k):
            return (q @ k.transpose(-2, -1)) * 0.125

        def norm(self, s):
            return s.softmax(-1)

        def forward(self, q, k, v):
            return self.norm(self.scores(q, k)) @ v
    ''')


@pytest.mark.parametrize("subclass", [
    "Sub = type('Sub', (Attn,), {'scores': lambda self, q, k: q @ k.transpose(-2, -1)})",
    "model = Attn()\nmodel.__class__ = type('S2', (Attn,), dict(scores=lambda self, q, k: q @ k.mT))",
    "def make(ns):\n    return type('Sub', (Attn,), ns)",  # a namespace no display shows
    "def twice(cls):\n    cls.norm = lambda self, s: (s * 2).softmax(-1)\n    return cls\n\n\n"
    "Sub = twice(type('Sub', (Attn,), {}))",
    "model = Attn()\nvars(model).update(norm=lambda s: (s * 2).softmax(-1))",
    "class Sub(Attn):\n    def __getattribute__(self, name):\n        return super().__getattribute__(name)",
])
def test_a_subclass_built_at_run_time_or_a_method_replaced_refuses_inlining(subclass):
    """A fourth breaker's: subclasses made by `type()`, a class decorator, a method swapped into an instance's
    namespace, a `__getattribute__` (fp64 output errors 0.88 to 1.29): the inlined helper is not what runs."""
    source = HELPER_BLOCK + "\n\n" + subclass + "\n"
    assert not _safe_findings(source)


@pytest.mark.parametrize("subclass, safe", [
    ("class Sub(Attn):\n    def scores(self, q, k):\n        return q @ k.transpose(-2, -1)", False),
    ("class Sub(attn.Attn):\n    def __init__(self):\n        super().__init__()\n        self.scores = None", False),
    ("class Deeper(Sub):\n    def scores(self, q, k):\n        return q @ k.mT\n\n\nclass Sub(Attn):\n    pass", False),
    ("class Sub(Attn):\n    def extra(self):\n        return 1", True),  # redefines nothing the block uses
    # a sixth breaker's: a name bound to the class, a header continued on the next line, a mixin of a third file
    ("Base = attn.Attn\n\n\nclass Sub(Base):\n    def norm(self, s):\n        return s.sigmoid()", False),
    ("class Sub\\\n(Attn):\n    def norm(self, s):\n        return s.sigmoid()", False),
    ("from mixin import Mixin\n\n\nclass Sub(Mixin, Attn):\n    pass", False),
])
def test_a_subclass_in_another_file_that_redefines_an_inlined_helper_refuses(tmp_path, subclass, safe):
    """Only subclasses in the block's own file were read: `class Sub(Attn)` in another file overriding the inlined
    `scores` left a safe patch whose Sub instances ran the base's helper."""
    (tmp_path / "attn.py").write_text(HELPER_BLOCK)
    (tmp_path / "mixin.py").write_text("class Mixin:\n    def norm(self, s):\n        return s.sigmoid()\n")
    (tmp_path / "sub.py").write_text("import attn\nfrom attn import Attn\n\n\n" + subclass + "\n")
    result = scan_paths([str(tmp_path)], jobs=1)
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert (finding.fix_safety == "safe") == safe, finding.reason
    if not safe:
        assert "sub.py" in finding.reason


@pytest.mark.parametrize("rebinding, refused", [
    ("for name in ['norm']:\n    setattr(Attn, name, lambda self, s: s.sigmoid())", False),
    ("type.__setattr__(Attn, 'norm', lambda self, s: s.sigmoid())", True),
    ("type.__setattr__(Attn, NAME, lambda self, s: s.sigmoid())", False),
])
def test_a_method_bound_on_the_class_by_a_computed_name_elsewhere_is_not_proved(tmp_path, rebinding, refused):
    """A sixth breaker's bug_05: a method the block inlines, rebound on the class by a name computed in another file
    (`setattr(Attn, name, f)` in a loop) or by `type.__setattr__` (fp32 output error 2.876), kept a safe patch. A
    computed name there is an assumption, as it is for the attributes the block reads; the method's own name
    refuses."""
    (tmp_path / "attn.py").write_text(HELPER_BLOCK)
    (tmp_path / "sub.py").write_text("from attn import Attn\nNAME = 'norm'\n\n" + rebinding + "\n")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety != "safe", finding.reason
    if refused:
        assert not finding.fixable and "norm" in finding.reason, finding.reason
    else:
        assert "dispatch" in {fact["name"] for fact in finding.extra["facts"]["assumed"]}, finding.extra["facts"]


@pytest.mark.parametrize("binding", ["setattr(m, name, types.MethodType(lambda self, s: s.sigmoid(), m))",
                                     "setattr(m, name, lambda s: s.sigmoid())"])
def test_a_function_bound_on_an_instance_by_a_computed_name_is_not_proved(binding):
    """An eighth breaker's bug_10: `setattr(m, name, types.MethodType(f, m))` replaced the inlined method on the
    instance (output 0.400 off); a function bound by a computed name may replace any method."""
    source = "import types\n" + HELPER_BLOCK + f"\n\ndef swap(m, name):\n    {binding}\n"
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert not finding.fixable and "computed names" in finding.reason, finding.reason


def test_a_method_of_a_class_that_binds_its_attributes_by_computed_names_is_not_proved():
    """`setattr(self, name, f)` in the class itself may shadow the method the block inlines."""
    source = HELPER_BLOCK.replace("    def scores", "    def __init__(self, name, f):\n        super().__init__()\n"
                                  "        setattr(self, name, f)\n\n    def scores", 1)
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert not finding.fixable and "computed names" in finding.reason, finding.reason


@pytest.mark.parametrize("replacement", [
    "nn.Dropout = nn.Identity",  # breaker round 18: the class replaced before the model is built (MC dropout too)
    "nn.Dropout.forward = lambda self, x: x * 2",
    "nn.Dropout.__call__ = lambda self, x: x * 2",
    "torch.nn.functional.dropout = lambda x, p=0.5, training=True, inplace=False: x * 2",
])
def test_a_torch_module_class_replaced_in_the_file_refuses_deleting_its_calls(replacement):
    """The run-time module check reads the instance, not its class: a class-level replacement (a fourth
    breaker's, fp64 output error 1.86) is seen in the source or not at all."""
    source = DROPOUT_BLOCK.format(switch="pass") + "\n\n" + replacement + "\n"
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert finding.fix_safety != "safe" and "may not run torch's code" in (finding.reason or ""), finding.reason


@pytest.mark.parametrize("replacement", [
    "torch.Tensor.__matmul__ = lambda a, b: torch.matmul(a, b) * 2",
    "for name in ('__mul__',):\n    setattr(torch.Tensor, name, lambda a, b: a)",
])
def test_a_tensor_operator_replaced_in_the_file_refuses_the_rewrite(replacement):
    """Breaker round 18: `torch.Tensor.__matmul__ = f` (and `setattr(torch.Tensor, name, f)`) changed what the
    block's `@` computes; the SDPA call never calls it (outputs 0.54 apart)."""
    source = DROPOUT_BLOCK.format(switch="pass") + "\n\n" + replacement + "\n"
    [finding] = [f for f in analyze_source(source, "hostile.py").findings if f.kind == "attention"]
    assert not finding.fixable and "tensor operators may not be torch's" in finding.reason, finding.reason


def test_a_one_dim_query_is_refused():
    """Attention pooling with one learned query vector: matmul takes the 1-D query, SDPA raises (breaker round 12,
    bug 03)."""
    source = textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn


        class AttnPool(nn.Module):
            def __init__(self, d=8):
                super().__init__()
                self.query = nn.Parameter(torch.randn(d))
                self.key = nn.Linear(d, d)
                self.value = nn.Linear(d, d)

            def forward(self, x):
                k, v = self.key(x), self.value(x)
                scores = torch.matmul(self.query, k.transpose(-1, -2)) / math.sqrt(k.size(-1))
                return torch.matmul(scores.softmax(dim=-1), v)
        ''')
    (finding,) = [f for f in analyze_source(source, "pool.py").findings if f.kind == "attention"]
    assert not finding.fixable and "has one dim" in finding.reason


def test_a_block_inside_an_f_string_s_self_documenting_specifier_is_not_rewritten():
    """A fourteenth breaker's: `f"{(p @ v).sum()=}"` prints the expression's own text, which a rewrite changes."""
    source = ("import torch\n\n\ndef attend(q, k, v):\n    s = q @ k.transpose(-2, -1) * 0.125\n    p = s.softmax(-1)\n"
              "    return f\"{(p @ v).sum()=:.3f}\"\n")
    result = analyze_source(source, "hostile.py")
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert result.fixed == source and not finding.fixable and "`=` specifier" in finding.reason
    plain = source.replace("=:.3f", ":.3f")
    assert "scaled_dot_product_attention" in analyze_source(plain, "hostile.py").fixed


@pytest.mark.parametrize("helpers, safe", [
    ("SIZE = 8\n", True),
    ("__all__ = ['SIZE']\nSIZE = 8\n\ndef float(x):\n    return x\n", True),  # `__all__` leaves `float` out
    ("def float(x):\n    return x\n", False),
    ("import torch\n\nfloat = torch.float64\n", False),
    ("from consts import *\n", False),  # binds what another module does: anything
])
def test_a_star_import_of_a_module_of_the_tree_binds_only_the_names_that_module_shows(tmp_path, helpers, safe):
    """Breaker round 44: `from helpers import *` after `import torch` may bind the builtin `float` the scale is
    read through (and the checks a guard would call). Scanned as a folder, helpers.py says which names it binds."""
    _assert_safe_beside(tmp_path, helpers, "import torch\nfrom helpers import *\n\n\ndef attn(q, k, v):\n"
                        "    scale = float(q.size(-1)) ** -0.5\n"
                        "    s = q @ k.transpose(-2, -1) * scale\n    return s.softmax(dim=-1) @ v\n", safe)


def _assert_safe_beside(tmp_path, helpers: str, module: str, safe: bool) -> None:
    """Scans `module` (m.py) as a folder beside helpers.py: its attention patch is safe exactly where `safe` says."""
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "m.py").write_text(module)
    findings = [f for f in scan_paths([str(tmp_path)], cache=False).findings if f.kind == "attention"]
    assert any(f.fixable and f.fix_safety == "safe" for f in findings) == safe, [f.reason for f in findings]


@pytest.mark.parametrize("rebinding", [
    "g = sys.modules[__name__].__dict__\ng.update(F=1)",
    "dict.update(sys.modules[__name__].__dict__, F=1)",
    "m = sys.modules[__name__]\ntype(m).__setattr__(m, 'F', 1)",
])
def test_the_module_s_namespace_reached_through_sys_modules_may_bind_the_sdpa_call_s_name(rebinding):
    """Breaker round 46: the module object from `sys.modules` rebinds `F`, which the SDPA call would be read
    through (the patched call raised AttributeError on an int)."""
    source = ("import math\nimport sys\n\nimport torch\nimport torch.nn.functional as F\n\n\ndef attention(q, k, v):\n"
              "    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))\n"
              "    return torch.matmul(torch.softmax(scores, dim=-1), v)\n\n\n" + rebinding + "\n")
    assert not _safe_findings(source)


@pytest.mark.parametrize("rebinding, cause", [
    ("from helpers import *", "`from helpers import *` (line 3)"),
    ("exec('x = 1')", "the file binds names through its namespace"),
])
def test_a_block_whose_torch_may_be_bound_anew_is_reported_with_the_reason(rebinding, cause):
    """A file scanned alone where a star import of a module the scan cannot read (or `exec`) may bind `torch` and
    `F` anew: no call of the block is read as torch's, and it was reported as nothing at all."""
    source = ("import torch\nimport torch.nn.functional as F\n" + rebinding + "\n\n\ndef attend(q, k, v):\n"
              "    s = torch.matmul(q, k.transpose(-2, -1)) * 0.125\n"
              "    return torch.matmul(F.softmax(s, dim=-1), v)\n")
    result = analyze_source(source, "hostile.py")
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert result.fixed == source and not finding.fixable and finding.line == 7
    assert finding.reason.startswith(cause) and "`F`, `torch` anew" in finding.reason


@pytest.mark.parametrize("helpers, safe", [
    ("import importlib\n\ndef f(name, cls):\n    setattr(importlib.import_module(name), cls.__name__ + 'Fast', cls)\n",
     True),  # transformers' tokenization_auto: a computed name that spells none of math's
    ("import importlib\n\ndef f(name, value):\n    setattr(importlib.import_module(name), 'sqrt', value)\n", False),
    ("import math\n\ndef patch(mod, name, value):\n    setattr(mod, name, value)\n\npatch(math, 'sqrt', abs)\n",
     False),
    ("import math\n\nfor mod in [math]:\n    mod.sqrt = abs\n", False),
    ("import math\n\nfor mod in [math]:\n    print(mod.sqrt)\n", True),  # iterated, nothing set on it
    ("import math\n\ndef show(mod):\n    return mod.pi\n\nshow(math)\n", True),  # handed, only read
    # breaker round 50: setattr handed on or fetched, the namespace handed on, sys.modules, an unbound __setattr__
    ("import functools, math\n\nfunctools.partial(setattr, math)('sqrt', abs)\n", False),
    ("import math\n\nlist(map(setattr, [math], ['sqrt'], [abs]))\n", False),
    ("import builtins, math\n\ngetattr(builtins, 'setattr')(math, 'sqrt', abs)\n", False),
    ("import math, operator\n\noperator.setitem(vars(math), 'sqrt', abs)\n", False),
    ("import math, sys, types\n\nshim = types.ModuleType('math')\nsys.modules['math'] = shim\n", False),
    ("import math\n\ntype(math).__setattr__(math, 'sqrt', abs)\n", False),
])
def test_math_replaced_by_any_route_refuses_a_scale_read_through_it(tmp_path, helpers, safe):
    """Breaker round 49: `math.sqrt` replaced in another file of the tree through a helper handed the module, a
    loop over a literal holding it, or a module imported by a computed name; `/ math.sqrt(d)` was read as SDPA's
    default scale."""
    _assert_safe_beside(tmp_path, helpers, "import math\n\nimport torch\n\n\ndef attn(q, k, v):\n"
                        "    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
                        "    return s.softmax(dim=-1) @ v\n", safe)
