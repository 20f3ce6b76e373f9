"""The `first-order-autograd` fact: SDPA's fused kernels have no double backward and no
forward-mode derivative, so a rewrite is safe only where nothing in the scanned tree asks for them.

Before the fact existed, a gradient penalty or a `torch.func.jvp` through a "safely" patched block raised. The
first tests keep that evidence (torch's behaviour, measured); the rest check where the fact is proved, where it
is assumed (in this file, in another file of the scan), and how names are resolved through imports.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from advisor.engine.static import analyze_source, scan_paths
from advisor.runtime.autograd_probe import higher_order_requests
from advisor.static.autograd_use import autograd_sites, worth_resolving
from advisor.static.module_index import ParsedModule
from fixture_models import fixture_paths, load_module_from_source

MODEL = '''import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / 8 ** 0.5
        weights = scores.softmax(dim=-1)
        return (weights @ v).transpose(1, 2).reshape(B, T, C)
'''

PENALTY = '''

def penalty(model, x):
    x = x.requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    return grad.pow(2).sum()
'''

STATEMENT_NAME = "first-order-autograd"


def _fact(finding, status: str) -> dict | None:
    return next((f for f in finding.extra["facts"][status] if f["name"] == STATEMENT_NAME), None)


def _attention(source: str, path: str = "m.py"):
    (finding,) = [f for f in analyze_source(source, path).findings if f.kind == "attention"]
    return finding


# --------------------------------------------------------------------------------------------------------------
# torch's behaviour the fact rests on (measured on torch 2.13, CPU)

def _qkv(requires_grad: bool = True):
    torch.manual_seed(0)
    return [torch.randn(2, 2, 5, 8, requires_grad=requires_grad) for _ in range(3)]


def test_the_fused_cpu_kernel_has_no_double_backward_and_no_forward_ad():
    q, k, v = _qkv()
    out = F.scaled_dot_product_attention(q, k, v)
    (grad,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        grad.pow(2).sum().backward()
    q, k, v = _qkv(requires_grad=False)
    with pytest.raises(NotImplementedError):
        torch.func.jvp(lambda q: F.scaled_dot_product_attention(q, k, v), (q,), (torch.ones_like(q),))


def test_a_gradient_penalty_through_the_patch_raises_so_the_patch_is_not_safe():
    """The failing-before case: the patch used to be safe, and the penalty then raised."""
    source = MODEL + PENALTY
    finding = _attention(source)
    assert finding.fix_safety == "unsafe"
    assert "create_graph=True" in finding.reason and "m.py:20" in finding.reason
    assert _fact(finding, "assumed") is not None
    patched = analyze_source(source, "m.py", unsafe_fixes=True).fixed
    original, rewritten = load_module_from_source(source, "ho_orig"), load_module_from_source(patched, "ho_patched")
    torch.manual_seed(0)
    model, x = original.Attn(), torch.randn(2, 6, 16)
    again = rewritten.Attn()
    again.load_state_dict(model.state_dict())
    assert torch.isfinite(original.penalty(model, x.clone()))
    with pytest.raises(RuntimeError, match="not implemented"):
        rewritten.penalty(again, x.clone()).backward()


def test_proved_when_nothing_asks_for_it():
    finding = _attention(MODEL)
    assert finding.fix_safety == "safe"
    fact = _fact(finding, "proved")
    assert fact is not None and "nothing in the scanned file" in fact["why"]


def test_every_sdpa_finding_of_the_positive_fixtures_states_the_fact():
    for path in fixture_paths("positive"):
        for finding in analyze_source(path.read_text(encoding="utf-8"), str(path)).findings:
            if finding.kind == "attention" and finding.patch:
                assert _fact(finding, "proved") is not None, path.name


# --------------------------------------------------------------------------------------------------------------
# The scanned tree: the files of the run


def _tree(tmp_path, train: str):
    (tmp_path / "model.py").write_text(MODEL, encoding="utf-8")
    (tmp_path / "train.py").write_text(textwrap.dedent(train), encoding="utf-8")
    return tmp_path


def _model_finding(paths):
    result = scan_paths([str(p) for p in paths], jobs=1)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return finding


def test_assumed_when_another_file_of_the_scan_asks_for_it(tmp_path):
    root = _tree(tmp_path, '''
        from torch.autograd import grad as g
        from model import Attn


        def r1(model, x):
            (gx,) = g(model(x).sum(), x, None, True, True)
            return gx.pow(2).sum()
    ''')
    finding = _model_finding([root])
    assert finding.fix_safety == "unsafe"
    assert "train.py:7" in _fact(finding, "assumed")["why"]
    alone = _model_finding([root / "model.py"])  # the training file is not part of this run
    assert alone.fix_safety == "safe"
    assert "scanned file" in _fact(alone, "proved")["why"]


@pytest.mark.parametrize("body, asks", [
    ("try:\n    penalty = torch.autograd.grad(y, x, create_graph=True)\nexcept ValueError, TypeError:\n    pass\n", True),
    ("try:\n    y.backward()\nexcept ValueError, TypeError:\n    pass\n", False),  # first order: nothing beyond
])
def test_a_tree_file_that_cannot_be_parsed_asks_what_its_words_name(tmp_path, body, asks):
    """Breaker round 18: a gradient penalty in a file of a newer Python's syntax (`except A, B:`, 3.14) was an error
    entry, and `first-order-autograd` was proved from the other files: the patch raised in its backward."""
    root = _tree(tmp_path, "import torch\n")
    (root / "train.py").write_text("import torch\n" + body)
    finding = _model_finding([root])
    assert (finding.fix_safety == "unsafe") == asks
    if asks:
        assert "a file that cannot be parsed here names `create_graph`" in _fact(finding, "assumed")["why"]
        assert "train.py:3" in _fact(finding, "assumed")["why"]


def test_proved_over_a_tree_that_only_takes_first_order_gradients(tmp_path):
    root = _tree(tmp_path, '''
        import torch
        from torch.func import vmap


        def step(model, x, opt):
            loss = model(x).sum()
            loss.backward(create_graph=False)
            torch.autograd.grad(loss, x, retain_graph=True)
            return vmap(model)(x)
    ''')
    finding = _model_finding([root])
    assert finding.fix_safety == "safe"
    assert "the 2 scanned files" in _fact(finding, "proved")["why"]


# A helper that passes on its own `create_graph` parameter (a loss scaler's `backward(create_graph=create_graph)`)
# asks only where a call turns it on; where nothing in the tree uses the helper, no call of the tree does.

SCALER = '''
    class Scaler:
        def __call__(self, loss, optimizer, clip=None, create_graph=False):
            loss.backward(create_graph=create_graph)
            optimizer.step()
'''


def test_a_create_graph_parameter_passed_on_by_a_helper_nothing_uses_asks_nothing(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("from .scaler import Scaler\n__all__ = ['Scaler']\n")
    (tmp_path / "utils" / "scaler.py").write_text(textwrap.dedent(SCALER), encoding="utf-8")
    finding = _model_finding([_tree(tmp_path, "import torch\n")])
    assert finding.fix_safety == "safe"
    assert "scaler.py:4 passes on a parameter, off by default, of `Scaler`" in _fact(finding, "proved")["why"]
    unseen = scan_paths([str(tmp_path)], jobs=1, call_site_facts=False)  # its callers may live outside the tree
    assert [f.fix_safety for f in unseen.findings if f.kind == "attention"] == ["unsafe"]


PASSED_ON_AND_ASKED = {  # the helper, and a use of it, in one train.py: each makes the site ask
    "called_positionally": SCALER + "\ndef step(loss, opt):\n    Scaler()(loss, opt, None, True)\n",
    "built_and_stored": SCALER + "\nSCALER = Scaler()\n",
    "imported_under_another_name": "from utils_scaler import Scaler as S\n",
    "named_in_a_string": SCALER + "\nmaker = globals()['Scaler']\n",
    "subclassed": SCALER + "\nclass Mine(Scaler):\n    pass\n",
    "default_on": SCALER.replace("create_graph=False)", "create_graph=True)"),
    "rebound": SCALER.replace("            loss.backward", "            create_graph = not clip\n"
                                                        "            loss.backward"),
    "function_called": "\ndef scale(loss, create_graph=None):\n    loss.backward(create_graph=create_graph)\n"
                       "\nscale(1.0, 'yes')\n",
    "nested_function": "\ndef outer(loss):\n    def inner(create_graph=False):\n"
                       "        loss.backward(create_graph=create_graph)\n    return inner(True)\n",
}


@pytest.mark.parametrize("name", sorted(PASSED_ON_AND_ASKED))
def test_a_passed_on_create_graph_asks_where_the_tree_may_turn_it_on(tmp_path, name):
    (tmp_path / "utils_scaler.py").write_text(textwrap.dedent(SCALER), encoding="utf-8")
    finding = _model_finding([_tree(tmp_path, PASSED_ON_AND_ASKED[name])])
    assert finding.fix_safety == "unsafe", name


# --------------------------------------------------------------------------------------------------------------
# Which code asks for it, names resolved through imports

ASKS = {
    "grad_keyword": "import torch\ntorch.autograd.grad(y, x, create_graph=True)",
    "grad_alias_positional": "from torch.autograd import grad as g\ng(y, x, None, True, True)",
    "grad_module_alias": "from torch import autograd as ag\nag.grad(y, x, None, None, flag)",
    "backward_keyword": "loss.backward(create_graph=True)",
    "backward_positional": "loss.backward(None, True, True)",
    "wrapper_keyword": "penalty(model, x, create_graph=self.training)",
    "forward_ad": "import torch.autograd.forward_ad as fwAD\nwith fwAD.dual_level():\n    d = fwAD.make_dual(x, t)",
    "forward_ad_from": "from torch.autograd.forward_ad import make_dual\nd = make_dual(x, t)",
    "func_jvp": "import torch\ntorch.func.jvp(f, (x,), (t,))",
    "func_hessian": "from torch.func import hessian\nh = hessian(f)(x)",
    "func_module_alias": "from torch import func as tf\nj = tf.jacfwd(f)(x)",
    "functorch": "import functorch\nfunctorch.jvp(f, (x,), (t,))",
    # spellings a breaker found proved: options unpacked, an alias called by position, a computed lookup, the
    # forward-mode jacobian strategy by position
    "grad_unpacked_options": "import torch\nopts = {}\nopts['create_graph'] = True\ntorch.autograd.grad(y, x, **opts)",
    "grad_unpacked_positional": "import torch\ntorch.autograd.grad(y, x, *[None, None, True])",
    "grad_local_alias": "import torch\ndef f():\n    g_ = torch.autograd.grad\n    g_(y, q, None, None, True)",
    "func_computed_name": "import torch\nj = getattr(torch.func, 'j' + 'vp')",
    "autograd_computed_name": "import torch\nf = getattr(torch.autograd, 'gr' + 'ad')\ng, = f(y, q, None, None, True)",
    "forward_ad_computed_name": "import torch\nfwAD = torch.autograd.forward_ad\ndual = getattr(fwAD, name)(x, t)",
    "jacobian_strategy_positional": "import torch\ntorch.autograd.functional.jacobian(f, x, False, False, True, "
                                    "'forward-mode')",
    "nested_grad": "from torch.func import grad\ngg = grad(grad(f))(x)",
    "grad_of_named_grad": "from torch.func import grad, jacrev\ng = grad(f)\nh = jacrev(g)(x)",
    "grad_of_lambda": "from torch.func import grad\nh = grad(lambda x: grad(f)(x).sum())(x)",
    "grad_of_function": "from torch.func import grad, vjp\ndef inner(x):\n    return vjp(f, x)[1](x)\n"
                        "h = grad(inner)(x)",
    "functional_hvp": "from torch.autograd.functional import hvp\nhvp(f, x, v)",
    "functional_jvp": "import torch\ntorch.autograd.functional.jvp(f, x, v)",
    "functional_jacobian_cg": "import torch\ntorch.autograd.functional.jacobian(f, x, create_graph=True)",
    "jacobian_forward_mode": "import torch\ntorch.autograd.functional.jacobian(f, x, vectorize=True, "
                             "strategy='forward-mode')",
    # a ninth breaker's: star imports, the transforms' other homes, the unbound backward
    "star_func_jvp": "from torch.func import *\nj = jvp(f, (x,), (t,))",
    "star_functional_hvp": "from torch.autograd.functional import *\nh = hvp(f, x, v)",
    "star_forward_ad": "from torch.autograd.forward_ad import *\nd = make_dual(x, t)",
    "gradcheck_module": "from torch.autograd.gradcheck import gradgradcheck\ngradgradcheck(f, (x,))",
    "private_jvp": "from torch._functorch.eager_transforms import jvp\njvp(f, (x,), (t,))",
    "private_nested_grad": "from torch._functorch.apis import grad\ngg = grad(grad(f))(x)",
    "unbound_backward": "import torch\ntorch.Tensor.backward(y, None, True, True)",
    # a tenth breaker's: the unbound method reached through the tensor's type
    "type_backward": "type(loss).backward(loss, None, None, True)",
}

FIRST_ORDER = {
    "plain_backward": "loss.backward()",
    "create_graph_false": "import torch\ntorch.autograd.grad(y, x, create_graph=False)",
    "retain_graph_positional": "import torch\ntorch.autograd.grad(y, x, None, True)",
    "func_grad": "from torch.func import grad\ngrad(f)(x)",
    "func_jacrev": "import torch\ntorch.func.jacrev(f)(x)",
    "local_jvp": "def jvp(f, x):\n    return f(x)\njvp(f, x)",
    "jacobian": "import torch\ntorch.autograd.functional.jacobian(f, x, strategy='reverse-mode')",
    "import_only": "import torch.autograd.forward_ad as fwAD\nfrom torch.func import jvp",
    "functools": "import functools\nfunctools.partial(f, 1)",
    "unbound_backward_plain": "import torch\ntorch.Tensor.backward(y, None, True)",
    "type_backward_plain": "type(loss).backward(loss, None, True)",
}


@pytest.mark.parametrize("name", sorted(ASKS))
def test_asks_for_higher_order_autograd(name):
    sites = autograd_sites(ParsedModule(ASKS[name] + "\n", "t.py"))
    assert sites, ASKS[name]


@pytest.mark.parametrize("name", sorted(FIRST_ORDER))
def test_first_order_code_asks_for_nothing(name):
    assert autograd_sites(ParsedModule(FIRST_ORDER[name] + "\n", "t.py")) == []


def test_the_cheap_filters_keep_every_file_that_asks_and_drop_common_first_order_code():
    assert all(worth_resolving(source) for source in ASKS.values())
    common = ("import torch\n\nclass F(torch.autograd.Function):\n    @staticmethod\n    def backward(ctx, g):\n"
              "        return g\n\nloss.backward()\nfor p in model.parameters():\n    p.grad = None\n")
    assert not worth_resolving(common)


@pytest.mark.parametrize("name", ["forward_ad", "func_jvp", "func_hessian", "nested_grad"])
def test_forward_mode_and_nested_transforms_in_the_file_make_the_patch_unsafe(name):
    imports, _, body = ASKS[name].partition("\n")
    source = f"{imports}\n{MODEL}\n\ndef use(f, x, t):\n{textwrap.indent(body, '    ')}\n"
    finding = _attention(source)
    assert finding.fix_safety == "unsafe", source
    assert _fact(finding, "assumed") is not None


# --------------------------------------------------------------------------------------------------------------
# What a run asks of autograd, seen while it runs (optimize: a request the static scan cannot read)

def _eager(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


def _first_order():
    q, k, v = _qkv()
    _eager(q, k, v).sum().backward()


def _penalty_through_kwargs():
    q, k, v = _qkv()
    options = {"create_graph": True}
    (grad,) = getattr(torch.autograd, "grad")(_eager(q, k, v).sum(), q, **options)
    grad.pow(2).sum().backward()


def _jvp():
    q, k, v = _qkv(requires_grad=False)
    torch.func.jvp(lambda q: _eager(q, k, v), (q,), (torch.ones_like(q),))


def _nested_grad():
    q, k, v = [t[:1, :1, :2, :2] for t in _qkv(requires_grad=False)]
    torch.func.grad(lambda q: torch.func.grad(lambda q: _eager(q, k, v).pow(2).sum())(q).sum())(q)


def test_the_run_probe_sees_double_backward_and_forward_mode_but_not_first_order():
    assert higher_order_requests(_first_order) == []
    assert "create_graph=True" in " ".join(higher_order_requests(_penalty_through_kwargs))
    assert "forward-mode" in " ".join(higher_order_requests(_jvp))
    assert "double backward" in " ".join(higher_order_requests(_nested_grad))


FOLDED = '''import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
        return torch.bmm(weights, v)
'''


def test_heads_folded_into_the_batch_run_the_math_kernel_so_a_penalty_keeps_working():
    """3-D inputs: no fused kernel takes them, so SDPA runs its math kernel, which has double backward (p29)."""
    source = FOLDED + PENALTY
    finding = _attention(source)
    assert finding.fix_safety == "safe"
    assert "math kernel" in _fact(finding, "proved")["why"]
    patched = analyze_source(source, "m.py").fixed
    original, rewritten = load_module_from_source(source, "folded_o"), load_module_from_source(patched, "folded_p")
    torch.manual_seed(0)
    model, x = original.Attn(), torch.randn(2, 6, 16)
    again = rewritten.Attn()
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(rewritten.penalty(again, x.clone()), original.penalty(model, x.clone()))


# --------------------------------------------------------------------------------------------------------------
# Requests spelled as real projects spell them: options passed through `**`, a transform looked up by name, and a
# reverse transform wrapped in a helper of another file that the training file applies to its own result. Each left
# the patch safe, and the second derivative through it then raised RuntimeError ("derivative for
# aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented") where the original ran.

HIDDEN_REQUESTS = {
    "options_dict": ({}, '''
        import torch
        GRAD_OPTIONS = {"create_graph": True, "retain_graph": True}


        def penalty(model, x):
            (gx,) = torch.autograd.grad(model(x).sum(), x, **GRAD_OPTIONS)
            return gx.pow(2).sum()
    '''),
    "getattr_of_the_module": ({}, '''
        import torch.autograd.functional as AF


        def curvature(model, x, v):
            return getattr(AF, "hvp")(lambda t: model(t).sum(), x, v)[1]
    '''),
    "helper_of_another_file_applied_twice": ({"gradutil.py": '''
        import torch.func


        def derivative(fn):
            return torch.func.grad(fn)
    '''}, '''
        from gradutil import derivative


        def second(model, x, s):
            return derivative(derivative(lambda s: model(x * s).sum()))(s)
    '''),
    # Found by attacking safe patches (s17): each left the patch safe, and the patched model then raised where the
    # original ran (NotImplementedError for forward AD, the RuntimeError above for a second derivative).
    "gradcheck_of_forward_mode": ({}, '''
        import torch


        def check(model, x):
            return torch.autograd.gradcheck(model, (x,), check_forward_ad=True, check_backward_ad=False)
    '''),
    "transform_bound_to_a_name_and_applied_twice": ({}, '''
        import torch.func


        def second(model, x, s):
            d = torch.func.grad
            return d(d(lambda s: model(x * s).sum()))(s)
    '''),
    "transform_applied_to_its_own_result_in_a_loop": ({}, '''
        from torch.func import grad


        def nth(model, x, s, order=2):
            f = lambda s: model(x * s).sum()
            for _ in range(order):
                f = grad(f)
            return f(s)
    '''),
    # breaker round 18: one textual transform applied to a parameter of a lambda, a method, or an enclosing lambda
    "transform_in_a_lambda_helper_applied_twice": ({}, '''
        import torch


        D = lambda fn: torch.func.grad(fn)


        def second(model, x):
            f = lambda x: model(x).pow(2).sum()
            return D(lambda x: D(f)(x).sum())(x)
    '''),
    "transform_in_a_method_helper": ({}, '''
        import torch


        class Derivatives:
            def d(self, fn):
                return torch.func.grad(fn)
    '''),
    "transform_nested_by_a_loop_of_lambdas": ({}, '''
        from torch.func import grad


        def nth_derivative(f, n):
            for _ in range(n):
                f = (lambda g: (lambda x: grad(g)(x).sum()))(f)
            return f
    '''),
    "reverse_transform_then_backward": ({}, '''
        from torch.func import functional_call, grad


        def maml_step(model, x):
            params = dict(model.named_parameters())
            inner = grad(lambda p: functional_call(model, p, (x,)).pow(2).mean())(params)
            fast = {name: p - 0.1 * inner[name] for name, p in params.items()}
            functional_call(model, fast, (x,)).pow(2).mean().backward()
    '''),
    # A seventh breaker's: options read from a config and spread into the call (bug_07), and a meta-learning
    # library outside the tree that differentiates through the inner gradient step (bug_04, learn2learn's MAML)
    "options_spread_from_a_config": ({}, '''
        import json
        import torch


        def penalty(model, x, path):
            options = json.load(open(path))
            (gx,) = torch.autograd.grad(model(x).sum(), x, **options)
            return gx.pow(2).sum()
    '''),
    "backward_given_options": ({}, '''
        def step(model, x, options):
            model(x).sum().backward(**options)
    '''),
    "maml_of_a_library": ({}, '''
        from learn2learn.algorithms import MAML


        def meta_step(model, x):
            learner = MAML(model, lr=0.1).clone()
            learner.adapt(model(x).pow(2).mean())
            learner(x).pow(2).mean().backward()
    '''),
    "differentiable_optimizer": ({}, '''
        import higher


        def inner(model, opt, x):
            with higher.innerloop_ctx(model, opt) as (fmodel, diffopt):
                diffopt.step(fmodel(x).sum())
    '''),
    "vjp_then_backward_in_another_file": ({"penalty.py": '''
        def penalize(g):
            g.pow(2).sum().backward()
    '''}, '''
        import torch


        def input_gradient(model, x):
            out, pullback = torch.func.vjp(model, x)
            return pullback(torch.ones_like(out))[0]
    '''),
    # Breaker round 15: a transform with the outer pass through an alias of torch.autograd (bug 01), forward-mode
    # options spread from a dict (02), a penalty in a string run by `exec` (03), the transforms' module obtained at
    # run time (04), a create_graph passer called by a name held in a config file (14). Each raised in the patch.
    "transform_then_an_aliased_autograd_pass": ({}, '''
        import torch.autograd as ag
        from torch.func import grad


        def penalty(model, x, s):
            g = grad(lambda s: model(x * s).sum())(s)
            return ag.grad(g.pow(2).sum(), list(model.parameters()))
    '''),
    "transform_then_a_backward_looked_up_by_name": ({}, '''
        from torch.func import grad


        def penalty(model, x, s):
            g = grad(lambda s: model(x * s).sum())(s)
            getattr(g.pow(2).sum(), "backward")()
    '''),
    "gradcheck_options_spread_from_a_dict": ({}, '''
        import torch

        CHECKS = {"check_forward_ad": True, "check_backward_ad": False}


        def check(model, x):
            return torch.autograd.gradcheck(model, (x,), **CHECKS)
    '''),
    "gradcheck_options_spread_from_elsewhere": ({}, '''
        import torch


        def check(model, x, options):
            return torch.autograd.gradcheck(model, (x,), **options)
    '''),
    "penalty_in_an_exec_string": ({}, '''
        import torch

        PENALTY = "(gx,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)\\nloss = gx.pow(2).sum()"


        def penalty(model, x):
            exec("(gx,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)")
    '''),
    "code_from_a_file_run_by_exec": ({}, '''
        import torch


        def run(path, model, x):
            exec(open(path).read())
            torch.autograd.grad(model(x).sum(), x)
    '''),
    "transforms_module_imported_at_run_time": ({}, '''
        import importlib


        def tangent(model, x, t):
            return importlib.import_module("torch.func").jvp(model, (x,), (t,))
    '''),
    "transform_read_from_the_module_namespace": ({}, '''
        import torch.func


        def tangent(model, x, t, name):
            return vars(torch.func)[name](model, (x,), (t,))
    '''),
    "transform_read_from_the_module_dict": ({}, '''
        import torch


        def tangent(model, x, t):
            return torch.func.__dict__["jvp"](model, (x,), (t,))
    '''),
    "passer_called_by_a_name_from_a_config": ({"steps.py": '''
        import torch


        def graph_backward(loss, create_graph=False):
            return torch.autograd.grad(loss, [loss], create_graph=create_graph)
    '''}, '''
        import json

        import steps


        def step(loss, path):
            cfg = json.load(open(path))
            return getattr(steps, cfg["backward"])(loss, True)
    '''),
}


@pytest.mark.parametrize("name", sorted(HIDDEN_REQUESTS))
def test_a_request_spelled_indirectly_makes_the_fact_assumed(tmp_path, name):
    helpers, train = HIDDEN_REQUESTS[name]
    for file, text in helpers.items():
        (tmp_path / file).write_text(textwrap.dedent(text), encoding="utf-8")
    finding = _model_finding([_tree(tmp_path, train)])
    assert finding.fix_safety == "unsafe" and _fact(finding, "assumed") is not None


PENALTY_LINES = "(gx,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)\nloss = gx.pow(2).sum()\n"


@pytest.mark.parametrize("magic, asks", [("%%time", True), ("%%capture out", True), ("%%writefile penalty.txt", False)])
def test_a_notebook_cell_magic_that_runs_python_is_read_as_code(tmp_path, magic, asks):
    """Breaker round 15, bug 08: a gradient penalty in a `%%time` cell was masked as a comment, so the tree asked
    nothing and the patch broke the notebook's second derivative."""
    import json
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}
             for source in ("import torch\nfrom model import Attn\nmodel = Attn()\nx = torch.randn(2, 4, 16)\n",
                            f"{magic}\n{PENALTY_LINES}")]
    (tmp_path / "model.py").write_text(MODEL, encoding="utf-8")
    (tmp_path / "train.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                      "nbformat_minor": 5}), encoding="utf-8")
    assert (_model_finding([tmp_path]).fix_safety == "unsafe") == asks


def test_an_excluded_file_still_counts_for_the_tree_s_facts(tmp_path):
    """Breaker round 15, bug 12: `exclude = ["tests"]` (do not lint the tests) dropped the tests' gradient penalty
    from the tree's facts; the excluded test then broke on the patched model. Exclusion drops findings only."""
    from advisor.config import PathRules
    root = _tree(tmp_path, "")
    (root / "tests").mkdir()
    (root / "tests" / "test_smooth.py").write_text("import torch\n\n\ndef test_penalty(model, x):\n"
                                                    "    " + PENALTY_LINES.replace("\n", "\n    "), encoding="utf-8")
    rules = PathRules(str(root), ("tests",))
    result = scan_paths([str(root)], jobs=1, path_rules=rules)
    assert all("test_smooth" not in f.path for f in [*result.findings, *result.files])
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "unsafe" and "test_smooth.py" in _fact(finding, "assumed")["why"]


def test_one_reverse_transform_applied_in_a_loop_to_a_fixed_function_asks_nothing(tmp_path):
    """Per-sample gradients over batches: the loop applies `grad` to the same loss each time, never to its result."""
    finding = _model_finding([_tree(tmp_path, '''
        from torch.func import grad, vmap


        def per_sample(params, loss, batches):
            for x in batches:
                yield vmap(grad(loss), in_dims=(None, 0))(params, x)
    ''')])
    assert finding.fix_safety == "safe"


def test_one_reverse_transform_wrapped_by_a_helper_used_once_asks_nothing(tmp_path):
    (tmp_path / "gradutil.py").write_text("import torch.func\n\n\ndef derivative(fn):\n"
                                          "    return torch.func.grad(fn)\n", encoding="utf-8")
    finding = _model_finding([_tree(tmp_path, '''
        from gradutil import derivative


        def first(model, x, s):
            return derivative(lambda s: model(x * s).sum())(s)
    ''')])
    assert finding.fix_safety == "safe"


def test_with_call_site_facts_off_callers_outside_the_tree_may_ask(tmp_path):
    """A library author turns call-site facts off because the callers live outside the scanned tree; a user there
    may take a gradient penalty through the block, which the fused kernel's patch would break. The fact is then
    assumed, naming the setting, except where no fused kernel takes the call (the math kernel has both)."""
    (tmp_path / "attn.py").write_text(MODEL)
    (tmp_path / "folded.py").write_text(FOLDED)
    library = {Path(f.path).name: f for f in scan_paths([str(tmp_path)], jobs=1, call_site_facts=False).findings
               if f.kind == "attention"}
    assert library["attn.py"].fix_safety == "unsafe"
    assert "callers outside the scanned tree may ask" in _fact(library["attn.py"], "assumed")["why"]
    assert library["folded.py"].fix_safety == "safe" and "math kernel" in _fact(library["folded.py"], "proved")["why"]
    tree = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert [f.fix_safety for f in tree] == ["safe", "safe"]
