"""Adversarial differential checks of the copy/cast fixes (ADV201-ADV304), written from the README's contract only.

Every case is a small function. advisor's *safe* patches are applied (statically, and with the evidence of one
profiled run), then the original and the patched function run side by side on inputs of several layouts and
dtypes. A caller must not be able to tell them apart: same exception or none, outputs bit-identical (values,
dtype, shape, contiguity), the input the same afterwards, writes into the outputs reaching the input alike
(aliasing), and the same input gradient. A case where a safe patch changes any of these is a tool bug: the 39
this check found (layouts read through derived values, shadowed imports, `**kwargs`, assignments looked past)
are fixed, so each such case now passes.

The profiled cases come in three copies, so one profile shows each body under three callers: `a_` sees a
contiguous float32 input, `b_` a transposed one, `c_` both a contiguous float32 and a transposed float64 input.
The checks then call every copy with every input kind, as another caller of the same code would.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.engine.profiling import evidence_from_report, profile_workload
from advisor.engine.static import analyze_source
from advisor.workload_loader import load_workload

COUNTER = '''

class _Counter:
    """Not a tensor: its `.float()` has an effect."""

    n = 0

    def float(self):
        self.n += 1
        return self
'''

# Inputs a caller may pass: (shape of the random base, dtype, layout applied to it).
INPUTS = {
    "contiguous": ((2, 4, 4), torch.float32, lambda t: t),
    "transposed": ((2, 4, 4), torch.float32, lambda t: t.transpose(1, 2)),
    "expanded": ((1, 4, 4), torch.float32, lambda t: t.expand(2, 4, 4)),
    "sliced": ((2, 4, 8), torch.float32, lambda t: t[..., ::2]),
    "float64": ((2, 4, 4), torch.float64, lambda t: t),
    "float16": ((2, 4, 4), torch.float16, lambda t: t),
    "bfloat16-transposed": ((2, 4, 4), torch.bfloat16, lambda t: t.transpose(1, 2)),
}

PRELUDE = '''\
import types

import torch
import torch.nn.functional as F
from torch import nn

_STORE = []
_NS = types.SimpleNamespace(bump=lambda t: t.add_(1))
_RELU = nn.ReLU(inplace=True)
_HOOKS = [lambda t: t.mul_(3)]
_REF = torch.zeros(1)
_DT = torch.float32
_W = torch.arange(12.0).reshape(3, 4, 1, 1)


class _Ops:
    """Not torch: a namespace a user may bind to `F` or `torch` locally."""

    @staticmethod
    def softmax(t, dim):
        return t * 2


def _twist(t):
    t.transpose_(0, 1)


def _retype(t):
    t.data = t.data.half()


def _rebind_global(x):
    global _G
    _G = x.mT


def _flat(t):
    return t.view(-1)


def _bump(t):
    t.add_(1)


def _kept_flat():
    return _KEPT.view(-1)
'''

# Bodies of `def f(x)`: a copy or cast, then something that may observe it.
LAYOUT_BODIES = {
    # the copy's result is written in place (without the copy the write reaches the caller's tensor)
    "aug_add": "y = x.contiguous()\ny += 1\nreturn y.sum(-1)",
    "mul_": "y = x.contiguous()\ny.mul_(2)\nreturn y.sum(-1)",
    "setitem": "y = x.contiguous()\ny[0] = 0\nreturn y.sum(-1)",
    "copy_": "y = x.contiguous()\ny.copy_(torch.ones_like(y))\nreturn y.sum(-1)",
    "view_inplace": "y = x.contiguous()\ny[0].add_(1)\nreturn y.sum(-1)",
    "select_fill": "y = x.contiguous()\ny.select(0, 0).fill_(0)\nreturn y.sum(-1)",
    "relu_": "y = x.contiguous()\ntorch.relu_(y)\nreturn y.sum(-1)",
    "F_relu_inplace": "y = x.contiguous()\nF.relu(y, inplace=True)\nreturn y.sum(-1)",
    "relu_module_inplace": "y = x.contiguous()\n_RELU(y)\nreturn y.sum(-1)",
    "out_kw": "y = x.contiguous()\ntorch.add(y, 1, out=y)\nreturn y.sum(-1)",
    "clamp_out": "y = x.contiguous()\ntorch.clamp(y, -0.5, 0.5, out=y)\nreturn y.sum(-1)",
    "no_grad": "with torch.no_grad():\n    y = x.contiguous()\n    y.add_(1)\nreturn y.sum(-1)",
    "loop": "y = x.contiguous()\nfor _ in range(2):\n    y.add_(1)\nreturn y.sum(-1)",
    "unsqueeze_": "y = x.contiguous()\ny.unsqueeze_(0)\nreturn y.sum(-1)",
    "ops_add_": "y = x.contiguous()\ntorch.ops.aten.add_(y, 1)\nreturn y.sum(-1)",
    "data_add_": "y = x.contiguous()\ny.data.add_(1)\nreturn y.sum(-1)",
    "detach_add_": "y = x.contiguous()\ny.detach().add_(1)\nreturn y.sum(-1)",
    "reshape_add_": "y = x.contiguous()\ny.reshape(-1).add_(1)\nreturn y.sum(-1)",
    "flatten_mul_": "y = x.contiguous()\ny.flatten().mul_(2)\nreturn y.sum(-1)",
    "unbound_add_": "y = x.contiguous()\ntorch.Tensor.add_(y, 1)\nreturn y.sum(-1)",
    "getattr_add_": "y = x.contiguous()\ngetattr(y, 'add_')(1)\nreturn y.sum(-1)",
    "bound_add_": "y = x.contiguous()\nop = y.add_\nop(1)\nreturn y.sum(-1)",
    "iadd_dunder": "y = x.contiguous()\ny.__iadd__(1)\nreturn y.sum(-1)",
    "init_zeros": "y = x.contiguous()\ntorch.nn.init.zeros_(y)\nreturn y.sum(-1)",
    "alias_aug": "y = x.contiguous()\nz = y\nz += 1\nreturn y.sum(-1)",
    "T_mul_": "y = x.contiguous()\nz = y.transpose(0, 1)\nz.mul_(2)\nreturn y.sum(-1)",
    "numpy_write": "y = x.detach().contiguous()\ny.numpy()[0] = 1\nreturn y.sum(-1)",
    "index_put_": "y = x.contiguous()\ny.index_put_((torch.tensor([0]),), torch.tensor(5.0, dtype=y.dtype))\n"
                  "return y.sum(-1)",
    "masked_fill_": "y = x.contiguous()\ny.masked_fill_(y > 0, 0.0)\nreturn y.sum(-1)",
    "closure_add_": "y = x.contiguous()\ndef g():\n    y.add_(1)\ng()\nreturn y.sum(-1)",
    "helper_inplace": "y = x.contiguous()\n_bump(y)\nreturn y.sum(-1)",
    "attr_fn_inplace": "y = x.contiguous()\n_NS.bump(y)\nreturn y.sum(-1)",
    "hook_inplace": "y = x.contiguous()\nfor fn in _HOOKS:\n    fn(y)\nreturn y.sum(-1)",
    "walrus": "return (y := x.contiguous()).sum(-1) + y.add_(1).sum(-1)",
    # breaker round 17: an elementwise max keeps the strides; `inplace` by position; escapes through a
    # comprehension, a lambda, a global or torch running a callable of the user
    "max_pair_view": "y = x.transpose(1, 2).contiguous()\nm = torch.max(y, y * 0)\nreturn m.view(-1)",
    "relu_positional_inplace": "y = x.transpose(1, 2).contiguous()\nF.relu(y, True)\nreturn y.sum(-1)",
    "rows_comprehension": "y = x.transpose(1, 2).contiguous()\nreturn [y[i] for i in range(y.shape[0])]",
    "copy_in_lambda": "f = lambda t: t.transpose(1, 2).contiguous()\nreturn f(x)",
    "lambda_capture": "y = x.transpose(1, 2).contiguous()\ng = lambda: y\nreturn g()",
    "checkpoint_view": "y = x.transpose(1, 2).contiguous()\n"
                       "return torch.utils.checkpoint.checkpoint(_flat, y, use_reentrant=False)",
    "global_store": "global _KEPT\ny = x.transpose(1, 2).contiguous()\n_KEPT = y\nreturn _kept_flat()",
    # the copy's input is written in place afterwards (the copy was a snapshot)
    "src_mut_after": "y = x.contiguous()\nx.add_(1)\nreturn y.sum(-1)",
    "mutate_base": "base = x * 1\nv = base.transpose(1, 2)\ny = v.contiguous()\nbase.add_(1)\nreturn y.sum(-1)",
    "inplace_before": "x.add_(1)\ny = x.contiguous()\nreturn y.sum(-1)",
    # the copy's layout is read: views, raw strides, memory
    "view": "y = x.contiguous()\nreturn y.view(-1).sum()",
    "view_alias": "y = x.contiguous()\nz = y\nreturn z.view(-1).sum()",
    "view_data": "y = x.contiguous()\nreturn y.data.view(-1).sum()",
    "view_list": "y = x.contiguous()\nl = [y]\nreturn l[0].view(-1).sum()",
    "view_dict": "y = x.contiguous()\nd = {'a': y}\nreturn d['a'].view(-1).sum()",
    "view_helper": "y = x.contiguous()\nreturn _flat(y).sum()",
    "view_attr": "y = x.contiguous()\n_NS.y = y\nreturn _NS.y.view(-1).sum()",
    "view_tuple_unpack": "y = x.contiguous()\na, b = y, 1\nreturn a.view(-1).sum()",
    "view_as": "y = x.contiguous()\nreturn y.view_as(torch.empty(y.numel())).sum()",
    "view_lambda": "y = x.contiguous()\nf = lambda t: t.view(-1)\nreturn f(y).sum()",
    "view_getattr": "y = x.contiguous()\nreturn getattr(y, 'view')(-1).sum()",
    "view_conditional": "y = x.contiguous()\nz = y if True else x\nreturn z.view(-1).sum()",
    "view_index": "y = x.contiguous()\nreturn y[0].view(-1).sum()",
    "view_unsqueeze": "y = x.contiguous()\nreturn y.unsqueeze(0).view(-1).sum()",
    "view_dtype": "y = x.contiguous()\nreturn y.view(torch.uint8).sum()",
    "view_mT_mT": "y = x.contiguous()\nreturn y.mT.mT.view(-1).sum()",
    "view_unbound": "y = x.contiguous()\nreturn torch.Tensor.view(y, -1).sum()",
    "view_torch_ops": "y = x.contiguous()\nreturn torch.ops.aten.view(y, [-1]).sum()",
    "view_chunk": "y = x.contiguous()\nreturn torch.chunk(y, 2)[0].view(-1).sum()",
    "view_of_derived": "y = x.contiguous()\nreturn (y * 2).view(-1).sum()",
    "view_of_derived_name": "y = x.contiguous()\nz = y + 1\nreturn z.view(-1).sum()",
    "view_empty_like": "y = x.contiguous()\nz = torch.empty_like(y).copy_(y)\nreturn z.view(-1).sum()",
    "view_dlpack": "y = x.detach().contiguous()\nreturn torch.from_dlpack(y).view(-1).sum()",
    "as_strided": "y = x.contiguous()\nreturn torch.as_strided(y, (4,), (1,)).sum() + y.sum()",
    "as_strided_method": "y = x.contiguous()\nreturn y.as_strided((4,), (1,)).sum() + y.sum()",
    "data_ptr": "y = x.contiguous()\nreturn y.sum(-1) * (1.0 if y.data_ptr() == x.data_ptr() else 2.0)",
    "stride": "y = x.contiguous()\nreturn y.sum(-1) * y.stride(-1)",
    "is_contiguous": "y = x.contiguous()\nif y.is_contiguous():\n    return y.sum(-1)\nreturn y.sum(-1) * 2",
    "storage_offset": "y = x[:, 1:].contiguous()\nreturn y.sum(-1) * (1 + y.storage_offset())",
    "untyped_storage": "y = x.contiguous()\nreturn y.sum(-1) + y.untyped_storage().nbytes()",
    # the copy (or a tensor whose layout follows it) leaves the function
    "ret": "y = x.contiguous()\nreturn y",
    "ret_tuple": "y = x.contiguous()\nreturn (y.sum(), y)",
    "ret_list": "y = x.contiguous()\nreturn [y]",
    "store": "y = x.contiguous()\n_STORE.append(y)\nreturn y.sum(-1)",
    "ret_derived": "y = x.contiguous()\nreturn y * 2",
    "ret_derived_pair": "y = x.contiguous()\nreturn y.sum() + 0, y.mul(1)",
    "ret_einsum": "y = x.contiguous()\nreturn torch.einsum('bij->bji', y)",
    "ret_transposed": "y = x.contiguous()\nreturn y.transpose(0, 1)",
    "ret_clone": "y = x.contiguous()\nz = torch.relu(y)\nreturn z.clone()",
    "is_contiguous_of_derived": "y = x.contiguous()\nz = y.abs()\n"
                                "return z.sum(-1) * (2.0 if z.is_contiguous() else 1.0)",
    # a copy transposed right back (ADV203)
    "back_one_line_add_": "y = x.transpose(1, 2).contiguous().transpose(1, 2)\ny.add_(1)\nreturn y.sum(-1)",
    "back_one_line_sum": "y = x.transpose(1, 2).contiguous().transpose(1, 2)\nreturn y.sum(-1)",
    "back_add_": "y = x.transpose(1, 2).contiguous()\nz = y.transpose(1, 2)\nz.add_(1)\nreturn z.sum(-1)",
    "back_ret": "y = x.transpose(1, 2).contiguous()\nreturn y.transpose(1, 2)",
    "back_as_strided": "y = x.transpose(1, 2).contiguous()\nz = y.transpose(1, 2)\n"
                       "return torch.as_strided(z, (4,), (1,)).sum() + z.sum()",
    "back_sum": "y = x.transpose(1, 2).contiguous()\nz = y.transpose(1, 2)\nreturn z.sum(-1)",
    # 4-d: `x.unflatten(-1, (2, 2))` is contiguous for a contiguous x and channels_last for a transposed one
    "conv_ret": "y = x.unflatten(-1, (2, 2)).contiguous()\nreturn F.conv2d(y, _W)",
    "conv_sum": "y = x.unflatten(-1, (2, 2)).contiguous()\nreturn F.conv2d(y, _W).sum((-1, -2))",
    "channels_last_sum": "y = x.unflatten(-1, (2, 2)).contiguous(memory_format=torch.channels_last)\nreturn y.sum(1)",
    "channels_last_ret": "y = x.unflatten(-1, (2, 2)).contiguous(memory_format=torch.channels_last)\nreturn y * 1",
    "channels_last_as_strided": "y = x.unflatten(-1, (2, 2)).contiguous(memory_format=torch.channels_last)\n"
                                "return torch.as_strided(y, (4,), (1,)).sum() + y.sum()",
    "channels_last_add_": "y = x.unflatten(-1, (2, 2)).contiguous(memory_format=torch.channels_last)\ny.add_(1)\n"
                          "return y.sum(1)",
    # clones: a copy whatever the input's layout
    "clone_src_mut": "y = x.clone()\nx.add_(1)\nreturn y.sum(-1)",
    "clone_add_": "y = x.clone()\ny.add_(1)\nreturn y.sum(-1), x",
    "clone_contiguous_format_add_": "y = x.clone(memory_format=torch.contiguous_format)\ny.add_(1)\nreturn y.sum(-1)",
    "torch_clone_sum": "y = torch.clone(x)\nreturn y.sum(-1)",
    "contiguous_clone_src_mut": "y = x.contiguous().clone()\nx.add_(1)\nreturn y",
    "clone_contiguous_add_": "y = x.clone().contiguous()\ny.add_(1)\nreturn y, x",
    "to_contiguous_format_add_": "y = x.to(memory_format=torch.contiguous_format)\ny.add_(1)\nreturn y.sum(-1)",
    "contiguous_in_loop": "acc = torch.zeros(())\nfor i in range(2):\n    y = (x if i == 0 else x.mT).contiguous()\n"
                          "    acc = acc + y.view(-1)[0]\nreturn acc",
    # breaker round 25: random draws follow memory order (one seed, other elements), and an array of `.numpy()`
    # writes the tensor in place without a trailing underscore
    # (dropout drawing only for a float64 caller, as one in training mode after a profile in eval mode)
    "dropout_of_derived": "y = x.transpose(1, 2).contiguous()\n"
                          "return F.dropout(y * 2, 0.5, x.dtype == torch.float64).sum(1)",
    "randn_like_of_derived": "y = x.contiguous()\nh = y * 2\nreturn (h + torch.randn_like(h)).sum(1)",
    "bernoulli_method": "y = x.transpose(1, 2).contiguous()\n"
                        "return (y.sigmoid().bernoulli() if x.dtype == torch.float64 else y).sum(1)",
    "numpy_sorts_input": "y = x.transpose(1, 2).contiguous()\nx.detach().numpy().sort(axis=0)\nreturn (y * 2).sum(1)",
    # readers that take any strides: removing the copy is sound
    "sum_only": "y = x.contiguous()\nreturn y.sum(-1)",
    "unfold": "y = x.contiguous()\nreturn y.unfold(-1, 2, 1).sum((-1, -2))",
    "torch_ops_sum": "y = x.contiguous()\nreturn torch.ops.aten.sum(y, [-1])",
}

CAST_BODIES = {
    "float_sum": "y = x.float()\nreturn y.sum(-1)",
    "float_ret": "return x.float()",
    "to_f32_mul": "return x.to(torch.float32) * 2",
    "float_inplace": "y = x.float()\ny.add_(1)\nreturn y.sum(-1)",
    "float_src_mut": "y = x.float()\nx.add_(1)\nreturn y.sum(-1)",
    "half_float": "return x.half().float()",
    "double_float": "return x.double().float()",
    "softmax_float": "return torch.softmax(x.float(), -1)",
    "softmax_float_plus_half": "return torch.softmax(x.float(), -1) + x.half()",
    "type_as_ref": "return x.type_as(_REF) * 2",
    "to_ref": "return x.to(_REF) + 1",
    "float_float": "return x.float().float() * 2",
    "float_then_view": "y = x.float()\nreturn y.view(-1).sum()",
    "autocast_float": "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                      "    y = x.float() @ x.float().transpose(-1, -2)\nreturn y.float().sum(-1)",
    "contiguous_float": "return x.contiguous().float().sum(-1)",
}

PROFILED_BODIES = {**LAYOUT_BODIES, **CAST_BODIES}

# Cases that need module-level code of their own: `{g}` is the caller kind; each defines `{g}_<name>(x)`.
PROFILED_MODULE_CASES = {
    # breaker round 17: a helper writes the module state the copy had snapshotted
    "state_helper": '''
_MEM_{g} = torch.arange(16.0).reshape(4, 4)


def _remember_{g}():
    _MEM_{g}.mul_(0.5)


def {g}_state_helper(x):
    y = _MEM_{g}.transpose(0, 1).contiguous()
    _remember_{g}()
    return y.sum(-1) + x.sum()
''',
    "method_then_view": """
class {g}_Holder:
    def keep(self, x):
        self.y = x.contiguous()
        return self.y.sum(-1)

    def flat(self):
        return self.y.view(-1)


def {g}_method_then_view(x):
    h = {g}_Holder()
    return h.keep(x), h.flat().sum()
""",
    "return_then_view": """
def {g}_copy(x):
    y = x.contiguous()
    return y


def {g}_return_then_view(x):
    return {g}_copy(x).view(-1).sum()
""",
    "return_then_add_": """
def {g}_copy2(x):
    y = x.contiguous()
    return y * 1 if False else y


def {g}_return_then_add_(x):
    z = {g}_copy2(x)
    z.add_(1)
    return z.sum(-1)
""",
    "submodule_hook_inplace": """
class {g}_Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Identity()
        self.inner.register_forward_hook(lambda module, args, out: out.mul_(2))

    def forward(self, x):
        y = x.contiguous()
        return self.inner(y).sum(-1)


{g}_BLOCK = {g}_Block()


def {g}_submodule_hook_inplace(x):
    return {g}_BLOCK(x)
""",
    "module_forward_ret_derived": """
class {g}_Scale(nn.Module):
    def forward(self, x):
        y = x.contiguous()
        return y * 2


{g}_SCALE = {g}_Scale()


def {g}_module_forward_ret_derived(x):
    return {g}_SCALE(x)
""",
    "parameter_cast": """
class {g}_Proj(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))

    def forward(self, x):
        w = self.w.float()
        return x.float() @ w


{g}_PROJ = {g}_Proj()


def {g}_parameter_cast(x):
    return {g}_PROJ(x)
""",
    "parameter_cast_autocast": """
class {g}_AProj(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            w = self.w.float()
            return (x @ w).float()


{g}_APROJ = {g}_AProj()


def {g}_parameter_cast_autocast(x):
    return {g}_APROJ(x)
""",
}
PROFILED_NAMES = [*PROFILED_BODIES, *PROFILED_MODULE_CASES]

# Generated bodies for the in-place and aliasing obligations: a copy, layout-keeping steps (views among them),
# then a write into the result or into the input. Seeded, so one profile run covers them all.
GENERATED_COPIES = ["y = x.contiguous()", "y = x.transpose(1, 2).contiguous()", "y = x.mT.contiguous().mT",
                    "y = x.transpose(1, 2).contiguous().transpose(1, 2)", "y = x.float().contiguous()",
                    "y = x.contiguous().float()"]
GENERATED_STEPS = ["y = y * 2", "y = y.transpose(1, 2)", "y = y[0:1]", "y = y.unsqueeze(0)", "z = y\ny = z",
                   "y = torch.relu(y)", "y = y.detach()", "y = y.float()", "y = y.permute(2, 0, 1)", "y = y.mT",
                   "y = y.reshape(y.shape)", "y = y.squeeze(0)", "y = y.to(torch.float32)", "y = y.clamp(min=0)"]
GENERATED_WRITES = ["return y.sum(-1)", "y.add_(1)\nreturn y.sum(-1)", "x.add_(1)\nreturn y.sum(-1)",
                    "y[0] = 1\nreturn y.sum(-1)", "y.mul_(2)\nreturn x * 1", "y += 1\nreturn x.sum(-1), y.sum(-1)"]


def _generated_bodies(count: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"gen{i}": "\n".join([rng.choice(GENERATED_COPIES),
                                  *(rng.choice(GENERATED_STEPS) for _ in range(rng.randint(0, 2))),
                                  rng.choice(GENERATED_WRITES)]) for i in range(count)}


GENERATED_BODIES = _generated_bodies(90)
GROUPS = "abc"


def _function_source(name: str, body: str) -> str:
    return f"\n\ndef {name}(x):\n{textwrap.indent(body, '    ')}\n"


def _profiled_module(bodies: dict[str, str]) -> str:
    functions = "".join(_function_source(f"{group}_{name}", body) for name, body in bodies.items() for group in GROUPS)
    functions += "".join("\n" + code.replace("{g}", group)
                         for code in PROFILED_MODULE_CASES.values() for group in GROUPS)
    return PRELUDE + functions + textwrap.dedent(f'''

        CASES = {[*bodies, *PROFILED_MODULE_CASES]!r}


        class Model(nn.Module):
            """Calls every case once per caller kind (a case that raises for a caller is skipped)."""

            def forward(self, x):
                outs = []
                callers = (("a", x.clone()), ("b", x.clone().transpose(1, 2)), ("c", x.clone()),
                           ("c", x.clone().transpose(1, 2).double()))
                for name in CASES:
                    for group, arg in callers:
                        try:
                            outs.append(globals()[group + "_" + name](arg))
                        except RuntimeError:
                            pass
                return outs


        def workload():
            import advisor
            return advisor.Workload(Model(), (torch.randn(2, 4, 4),), steps=1)
        ''')


def _load(path: Path):
    name = f"_ccb_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _call(fn, x):
    torch.manual_seed(0)  # one seed for the original and the patch: random draws compare
    try:
        return fn(x), None
    except Exception as exc:  # the exception (or its absence) is part of what a caller sees
        return None, type(exc).__name__


def _observe(fn, input_kind: str) -> list:
    """What a caller can see of fn on one input: see the module docstring."""
    shape, dtype, layout = INPUTS[input_kind]
    base = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = layout(base.clone())
    out, error = _call(fn, x)
    seen: list = [("raises", error)]
    if error is None:
        tensors = _tensors(out)
        for i, t in enumerate(tensors):
            seen += [(f"output {i} dtype and shape", t.dtype, tuple(t.shape)),
                     (f"output {i} contiguity", t.is_contiguous()), (f"output {i} values", t.detach().clone())]
        seen.append(("input after the call", tuple(x.shape), x.clone()))
        for t in tensors:
            if t.is_floating_point():
                try:
                    t.detach().add_(1000)
                except RuntimeError:
                    pass
        seen.append(("input after writing the outputs", x.clone()))
    leaf = base.clone().requires_grad_()
    out, error = _call(fn, layout(leaf * 1))
    seen.append(("raises with grad", error))
    grads = [t for t in _tensors(out) if t.requires_grad] if error is None else []
    if grads:
        try:
            sum(t.float().sum() for t in grads).backward()
            seen.append(("input gradient", leaf.grad))
        except RuntimeError as exc:
            seen.append(("backward raises", type(exc).__name__))
    return seen


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _differences(original, patched, function: str) -> list[str]:
    """The input kinds on which a caller can tell the patched function from the original, and what differs."""
    found = []
    for kind in INPUTS:
        before, after = _observe(getattr(original, function), kind), _observe(getattr(patched, function), kind)
        what = [b[0] for b, a in itertools.zip_longest(before, after, fillvalue=("missing",)) if not _same(b, a)]
        if what:
            found.append(f"{function} on {kind}: {', '.join(what)}")
    return found


class Fixed:
    """One source file, advisor's safe fixes of it, and both imported."""

    def __init__(self, folder: Path, source: str, runtime=None, name: str = "cases"):
        self.path = folder / f"{name}.py"
        self.path.write_text(source)
        self.runtime = runtime
        self.result = analyze_source(source, str(self.path), runtime=runtime)
        patched_path = folder / f"{name}_patched.py"
        patched_path.write_text(self.result.fixed)
        self.original, self.patched = _load(self.path), _load(patched_path)

    def safe_patches(self, function: str) -> list:
        return [f for f in self.result.findings if f.function == function and f.patch and f.fix_safety == "safe"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Fixed:
    folder = tmp_path_factory.mktemp("profiled")
    source = _profiled_module({**PROFILED_BODIES, **GENERATED_BODIES})
    (folder / "cases.py").write_text(source)
    target = f"{folder / 'cases.py'}:workload"
    evidence = evidence_from_report(profile_workload(load_workload(target), target))
    return Fixed(folder, source, runtime=evidence)


@pytest.mark.parametrize("name", PROFILED_NAMES)
def test_profiled_safe_patch_keeps_behaviour(profiled: Fixed, name: str):
    """Each caller kind's copy of the body: its safe patches (if any) must be invisible to every other caller."""
    differences = [d for group in GROUPS for d in _differences(profiled.original, profiled.patched, f"{group}_{name}")]
    assert not differences, differences


# Static proofs (no profile): hand-written forms around the README's examples.
STATIC_BODIES = {
    "contiguous_twice": "return x.contiguous().contiguous()",
    "contiguous_twice_view": "return x.contiguous().contiguous().view(-1)",
    "contiguous_twice_add_": "y = x.contiguous().contiguous()\ny.add_(1)\nreturn y",
    "channels_last_then_contiguous": "return x.unsqueeze(0).contiguous(memory_format=torch.channels_last).contiguous()",
    "contiguous_then_channels_last": "return x.unsqueeze(0).contiguous().contiguous(memory_format=torch.channels_last)",
    "contiguous_clone": "y = x.contiguous().clone()\nx.add_(1)\nreturn y",
    "clone_contiguous": "y = x.clone().contiguous()\ny.add_(1)\nreturn y",
    "contiguous_clone_channels_last": "return x.unsqueeze(0).contiguous().clone(memory_format=torch.channels_last)",
    "channels_last_clone": "return x.unsqueeze(0).contiguous(memory_format=torch.channels_last).clone()",
    "clone_channels_last_contiguous": "return x.unsqueeze(0).clone(memory_format=torch.channels_last).contiguous()",
    "clone_preserve_contiguous": "return x.clone(memory_format=torch.preserve_format).contiguous()",
    "float_float": "return x.float().float()",
    "float_float_add_": "y = x.float().float()\ny.add_(1)\nreturn y",
    "to_float": "return x.float().to(torch.float32)",
    "to_then_float": "return x.to(torch.float).float()",
    "to_dtype_kw": "return x.float().to(dtype=torch.float32)",
    "to_copy_true": "y = x.float().to(torch.float32, copy=True)\ny.add_(1)\nreturn y",
    "to_copy_positional": "y = x.to(torch.float32).to(torch.float32, False, True)\ny.add_(1)\nreturn y",
    "float_memory_format": "return x.unsqueeze(0).float().float(memory_format=torch.channels_last)",
    "to_memory_format": "return x.unsqueeze(0).float().to(torch.float32, memory_format=torch.channels_last)",
    "double_float_float": "return x.double().float().float()",
    "bool_float_float": "return (x > 0).float().float()",
    "half_float": "return x.half().float()",
    "float_half": "return x.float().half()",
    "to_var_twice": "return x.to(_DT).to(_DT)",
    "to_ref_twice": "return x.to(_REF).to(_REF)",
    "float_to_ref": "return x.float().to(_REF)",
    "float_type_as": "return x.float().type_as(_REF)",
    "softmax": "return torch.softmax(x.float(), dim=-1)",
    "softmax_plus_half": "return torch.softmax(x.float(), dim=-1) + x.half()",
    "softmax_F": "return F.softmax(x.float(), -1)",
    "softmax_method": "return x.float().softmax(-1)",
    "softmax_double": "return torch.softmax(x.double(), -1)",
    "softmax_half": "return torch.softmax(x.half(), -1)",
    "softmax_bfloat16": "return torch.softmax(x.bfloat16(), -1)",
    "softmax_to": "return torch.softmax(x.to(torch.float32), -1)",
    "softmax_positional_dtype": "return torch.softmax(x.float(), -1, torch.float64)",
    "softmax_F_stacklevel": "return F.softmax(x.float(), -1, 3)",
    "softmax_method_positional_dtype": "return x.float().softmax(-1, torch.float64)",
    "softmax_to_device": "return torch.softmax(x.to('cpu', torch.float32), -1)",
    "softmax_to_ref": "return torch.softmax(x.to(_REF), -1)",
    "softmax_reused": "y = x.float()\nreturn torch.softmax(y, -1), y",
    "softmax_int": "return torch.softmax((x > 0).long().float(), -1)",
    "softmax_bool": "return torch.softmax((x > 0).float(), -1)",
    "softmax_module": "return nn.Softmax(-1)(x.float())",
    "softmax_autocast": "with torch.autocast('cpu', dtype=torch.bfloat16):\n    return torch.softmax(x.float(), -1)",
    "log_softmax": "return torch.log_softmax(x.float(), -1)",
    "softmax_no_grad": "with torch.no_grad():\n    return torch.softmax(x.float(), -1)",
    "softmax_star_kwargs_dtype": "kw = {'dtype': torch.float64}\nreturn torch.softmax(x.float(), -1, **kw)",
    "softmax_method_star_kwargs_dtype": "return x.float().softmax(-1, **{'dtype': torch.float64})",
    "softmax_star_kwargs_dim": "kw = {'dim': -1}\nreturn torch.softmax(x.float(), **kw)",
    "comment_inside_chain": "return x.contiguous(  # keep me\n).clone()",
    "to_tensor_twice": "return x.to(_REF).to(_REF)",
    "contiguous_half_contiguous": "return x.contiguous().half().contiguous()",
    "contiguous_cast_memory_format": "return x.unsqueeze(0).contiguous().to(torch.float32, "
                                     "memory_format=torch.channels_last).contiguous()",
    "contiguous_assigned_cast": "y = x.contiguous()\nz = y.float()\nreturn z.contiguous().view(-1)",
    "int_then_to_int32": "return (x * 10).int().to(torch.int32)",
    "long_int_long": "return (x * 10).long().int().long()",
    "cast_assigned_written_in_place": "y = x.float()\ny.add_(1)\nz = y.float()\nreturn z, x",
}
# A name bound to something else than the import, in one function, changes what the name means for the rewrite
# in the whole file: these live in a module of their own.
REBINDING_BODIES = {
    "softmax_local_F": "F = _Ops\nreturn F.softmax(x.float(), -1)",
    "softmax_local_torch": "torch = _Ops\nreturn torch.softmax(x.float(), -1)",
    "clone_loop_rebinds_torch": "for torch in [_Ops]:\n    pass\nreturn x.contiguous().clone()",
}
# A proof that sees through an assignment (`y = x.contiguous()` ... `y.contiguous()`) must see every way y may
# change in between: rebinding it, or changing its layout or dtype in place. Their own module, like the above.
SEE_THROUGH_BODIES = {
    # breaker round 17: a lambda or a generator reads the name when it runs, after the rebinding
    "lambda_reads_after_rebinding": "y = x.float()\ng = lambda: y.float()\ny = (x * 100).to(torch.uint8)\n"
                                    "return g() * 3",
    "generator_reads_after_rebinding": "y = x.contiguous()\ng = (y.contiguous() for _ in range(1))\ny = x.mT\n"
                                       "return next(g).view(-1)",
    "helper_transposes_in_place": "y = x.contiguous()\n_twist(y)\nz = y.contiguous()\nreturn z.view(-1)",
    "data_assignment_layout": "y = x.contiguous()\ny.data = y.data.mT\nz = y.contiguous()\nreturn z.view(-1)",
    "helper_changes_dtype": "y = x.float()\n_retype(y)\nz = y.float()\nreturn z",
    "data_assignment_dtype": "y = x.float()\ny.data = y.data.half()\nz = y.float()\nreturn z",
    "walrus_rebinds": "y = x.contiguous()\n(y := x.mT)\nz = y.contiguous()\nreturn z.view(-1)",
    "global_rebound_elsewhere": "global _G\n_G = x.contiguous()\n_rebind_global(x)\nz = _G.contiguous()\n"
                                "return z.view(-1)",
    "nonlocal_rebinds": "y = x.contiguous()\ndef g():\n    nonlocal y\n    y = x.mT\ng()\nz = y.contiguous()\n"
                        "return z.view(-1)",
    "branch_rebinds": "y = x.contiguous()\nif x.shape[0] > 1:\n    y = x.mT\nz = y.contiguous()\nreturn z.view(-1)",
    "loop_rebinds": "y = x.contiguous()\nout = []\nfor _ in range(2):\n    z = y.contiguous()\n"
                    "    out.append(z.view(-1))\n    y = y.mT\nreturn out",
    "tuple_rebinds": "y = x.contiguous()\ny, w = x.mT, 0\nz = y.contiguous()\nreturn z.view(-1)",
    "for_target_rebinds": "y = x.contiguous()\nfor y in [x.mT]:\n    pass\nz = y.contiguous()\nreturn z.view(-1)",
    "match_rebinds": "y = x.contiguous()\nmatch x.mT:\n    case y:\n        pass\nz = y.contiguous()\n"
                     "return z.view(-1)",
    "one_assignment": "y = x.contiguous()\nz = y.contiguous()\nreturn z.view(-1)",
}


@pytest.mark.parametrize("chain", [".float()", ".contiguous()"])
def test_a_chain_split_over_lines_does_not_stop_the_scan(tmp_path, chain: str):
    """Black's style runs a chain over lines inside brackets: the patch keeps one call and still parses."""
    source = PRELUDE + _function_source("f", f"return (x\n        {chain}\n        {chain})")
    result = analyze_source(source, str(tmp_path / "multiline.py"))
    [finding] = [f for f in result.findings if f.function == "f"]
    assert finding.patch and finding.fix_safety == "safe"
    compile(result.fixed, "multiline.py", "exec")
    assert result.fixed.count(chain) == source.count(chain) - 1


@pytest.fixture(scope="module")
def static(tmp_path_factory) -> Fixed:
    folder = tmp_path_factory.mktemp("static")
    source = PRELUDE + "".join(_function_source(name, body) for name, body in STATIC_BODIES.items())
    return Fixed(folder, source, name="static_cases")


@pytest.fixture(scope="module")
def rebinding(tmp_path_factory) -> Fixed:
    folder = tmp_path_factory.mktemp("rebinding")
    source = PRELUDE + "".join(_function_source(name, body) for name, body in REBINDING_BODIES.items())
    return Fixed(folder, source, name="rebinding_cases")


@pytest.mark.parametrize("name", list(STATIC_BODIES))
def test_static_safe_patch_keeps_behaviour(static: Fixed, name: str):
    assert not _differences(static.original, static.patched, name)


def test_static_cases_get_safe_patches(static: Fixed):
    """The static checks above check something: most of their bodies get a safe patch."""
    assert sum(bool(static.safe_patches(name)) for name in STATIC_BODIES) >= 20


@pytest.fixture(scope="module")
def see_through(tmp_path_factory) -> Fixed:
    folder = tmp_path_factory.mktemp("see_through")
    source = PRELUDE + "".join(_function_source(name, body) for name, body in SEE_THROUGH_BODIES.items())
    return Fixed(folder, source, name="see_through_cases")


@pytest.mark.parametrize("name", list(SEE_THROUGH_BODIES))
def test_static_proof_through_an_assignment_keeps_behaviour(see_through: Fixed, name: str):
    assert not _differences(see_through.original, see_through.patched, name)


@pytest.mark.parametrize("name", list(REBINDING_BODIES))
def test_rebound_torch_or_F_keeps_behaviour(rebinding: Fixed, name: str):
    assert not _differences(rebinding.original, rebinding.patched, name)


def test_a_static_fix_takes_the_receiver_for_a_tensor_unless_a_class_of_the_file_defines_the_method(tmp_path):
    """`t.float().float()` on an object whose .float() counts its calls is not a tensor cast. A static proof reads
    calls, not types: where no class of the scan defines `float`, the safe patch states that it takes the receiver
    for a tensor (an accepted fact); where one does, as `_Counter` here, that is assumed and the patch unsafe."""
    body = "t = _Counter()\nt.float().float()\nreturn x * t.n"
    fixed = Fixed(tmp_path, PRELUDE + COUNTER + _function_source("counter", body), name="counter_case")
    [finding] = [f for f in fixed.result.findings if f.function == "counter" and f.rule == "ADV301"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and "`float`" in assumed["tensor-receiver"]
    plain = analyze_source(PRELUDE + _function_source("plain", "return x.float().float()"), "plain.py")
    [finding] = [f for f in plain.findings if f.function == "plain" and f.rule == "ADV301"]
    accepted = finding.extra["facts"]["accepted"]
    assert finding.fix_safety == "safe" and any("tensor" in fact["statement"] for fact in accepted), accepted


# Generated chains: any mix of copies, casts and layout changes, used in ways that observe them.
CHAIN_STEPS = [
    ".contiguous()", ".contiguous(memory_format=torch.contiguous_format)", ".clone()",
    ".clone(memory_format=torch.contiguous_format)", ".float()", ".double()", ".half()", ".bfloat16()",
    ".to(torch.float32)", ".to(dtype=torch.float32)", ".to(torch.float32, copy=True)", ".type(torch.float32)",
    ".to(_DT)", ".type_as(_REF)", ".transpose(1, 2)", ".mT", ".detach()", ".long()", ".bool()", "[:, ::2]",
    ".unsqueeze(0)", ".contiguous(memory_format=torch.channels_last)", ".clone(memory_format=torch.channels_last)",
    ".to(memory_format=torch.channels_last)", ".float(memory_format=torch.preserve_format)", ".cpu()", ".to('cpu')",
    ".data", ".to(torch.int64)", ".to(x)", ".to(x.dtype)", ".reshape(-1)", ".view(-1)", ".sum(-1, keepdim=True)",
]
CHAIN_USES = [
    "return {chain}",
    "return {chain}.view(-1)",
    "y = {chain}\ny.add_(1)\nreturn y",
    "y = {chain}\nx.add_(1)\nreturn y",
    "y = {chain}\nz = y{tail}\nz.mul_(2)\nreturn y, z",
    "y = {chain}\nz = y{tail}\nreturn torch.as_strided(z, (4,), (1,)), z",
    "return torch.softmax({chain}, -1)",
    "return F.softmax({chain}, dim=-1) + x.half()",
    "return {chain}.softmax(-1)",
    "return torch.log_softmax({chain}, -1)",
    "return F.softmax({chain}, -1, dtype=torch.float64)",
    "y = torch.softmax({chain}, dim=-1)\ny.add_(1)\nreturn y, x",
    "y = {chain}\nreturn y{tail}.sum(), y",
]


@st.composite
def _chain_bodies(draw) -> str:
    chain = "x" + "".join(draw(st.lists(st.sampled_from(CHAIN_STEPS), min_size=1, max_size=4)))
    tail = "".join(draw(st.lists(st.sampled_from(CHAIN_STEPS), min_size=1, max_size=2)))
    return draw(st.sampled_from(CHAIN_USES)).format(chain=chain, tail=tail)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_chain_bodies())
def test_generated_chain_safe_patches_keep_behaviour(tmp_path, body: str):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    fixed = Fixed(folder, PRELUDE + _function_source("f", body), name="chain")
    if fixed.result.fixed != fixed.result.source:
        assert not _differences(fixed.original, fixed.patched, "f"), body


# Clearly redundant copies/casts (each once a MISS): each must get a safe patch, and keep behaviour.
MISSED_BODIES = {
    "contiguous_of_contiguous_name": ("y = x.contiguous()\nz = y.contiguous()\nreturn z.sum(-1)",
                                      "ADV201: the input of the second .contiguous() is a .contiguous() result, "
                                      "one statement earlier"),
    "float_of_float_name": ("y = x.float()\nz = y.float()\nreturn z * 2",
                            "ADV301: the cast's input was cast to float32 one statement earlier"),
    "long_long": ("return x.long().long()", "ADV301: integer casts (.long().long()) are not proved"),
    "to_same_variable_dtype": ("return x.to(_DT).to(_DT)", "ADV301: .to(dt).to(dt) with one dtype variable"),
    "contiguous_through_cast": ("return x.contiguous().float().contiguous()",
                                "ADV201: a dtype cast of a contiguous tensor is contiguous"),
}


@pytest.fixture(scope="module")
def missed(tmp_path_factory) -> Fixed:
    folder = tmp_path_factory.mktemp("missed")
    source = PRELUDE + "".join(_function_source(name, body) for name, (body, _) in MISSED_BODIES.items())
    return Fixed(folder, source, name="missed_cases")


@pytest.mark.parametrize("name", list(MISSED_BODIES))
def test_redundant_copy_or_cast_gets_a_safe_patch(missed: Fixed, name: str):
    assert missed.safe_patches(name), f"no safe patch for {MISSED_BODIES[name][0]!r}"
    assert not _differences(missed.original, missed.patched, name)


def test_profiled_copy_transposed_back_next_line_is_removed(profiled: Fixed):
    findings = [f for f in profiled.result.findings if f.function == "a_back_sum" and f.rule == "ADV203"]
    assert findings, "the profile saw the copy transposed right back"
    lines = profiled.result.source.splitlines()
    for finding in findings:
        assert ".contiguous()" in lines[finding.line - 1]
        assert finding.patch, finding.reason



def test_profiled_generated_writes_keep_behaviour(profiled: Fixed):
    """Every safe patch among the generated bodies keeps in-place writes and aliasing as they were."""
    patched = [f"{group}_{name}" for name in GENERATED_BODIES for group in GROUPS
               if profiled.safe_patches(f"{group}_{name}")]
    assert len(patched) >= 20, "the generated bodies should give the check something to check"
    differences = [d for function in patched for d in _differences(profiled.original, profiled.patched, function)]
    assert not differences, differences


@pytest.mark.parametrize("function", ["a_softmax_float"])
def test_profile_evidence_does_not_withhold_a_static_safe_fix(profiled: Fixed, function: str):
    assert profiled.safe_patches(function)


@pytest.mark.parametrize(("body", "wrong_patch", "seen"), [
    ("y = x.contiguous()\ny.add_(1)\nreturn y.sum(-1)", "y = x\ny.add_(1)\nreturn y.sum(-1)", "input after the call"),
    ("y = x.contiguous()\nreturn y", "y = x\nreturn y", "input after writing the outputs"),
    ("y = x.contiguous()\nreturn y * 2", "y = x\nreturn y * 2", "output 0 contiguity"),
    ("return x.float()", "return x", "output 0 dtype and shape"),
    ("return x.half().float()", "return x", "output 0 values"),
])
def test_the_differential_check_sees_a_wrong_patch(tmp_path, body, wrong_patch, seen):
    """The checks above are only as strong as `_differences`: it must see each kind of change a wrong patch makes."""
    (tmp_path / "wrong.py").write_text(PRELUDE + _function_source("f", wrong_patch))
    (tmp_path / "right.py").write_text(PRELUDE + _function_source("f", body))
    found = _differences(_load(tmp_path / "right.py"), _load(tmp_path / "wrong.py"), "f")
    assert any(seen in d for d in found), found
