"""An added bias read from a learned table (a relative-position bias: an `nn.Parameter` gathered by an index buffer,
reshaped, permuted) is a score term, not a mask: the patch passes it as SDPA's float `attn_mask`, its rank is proved
from the table's and the index's, and "no row is swallowed" is accepted (named), so the patch is safe. Outputs and
gradients, the table's included, match in fp32 and fp64. A bias the caller passes, or a table that holds a mask
value, gets what it got before."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

TEMPLATE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, n=5):
        super().__init__()
        self.heads, self.n = heads, n
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.table = nn.Parameter(torch.zeros(2 * n - 1, heads))
        self.register_buffer("index", torch.empty(n, n, dtype=torch.long), persistent=False)
        self.cache = {{}}
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.trunc_normal_(self.table, std=0.5)
        positions = torch.arange(self.n)
        self.index.copy_(positions[:, None] - positions[None, :] + self.n - 1)

    def train(self, mode=True):
        super().train(mode)
        self.cache = {{}}
        return self

    def resize(self, n):
        self.n = n
        self.table = nn.Parameter(self.table.new_zeros(2 * n - 1, self.heads))
        self.register_buffer("index", self.index.new_empty((n, n)), persistent=False)
        self.reset_parameters()
{helper}
    def forward(self, x{extra}):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q * self.scale) @ k.transpose(-2, -1)
        {use}
        weights = scores.softmax(dim=-1)
        return (weights @ v).transpose(1, 2).reshape(b, n, c)
'''
FORMS = {
    "a helper method": (
        "\n    def _bias(self):\n"
        "        bias = self.table[self.index.view(-1)].view(self.n, self.n, -1)\n"
        "        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)\n",
        "scores = scores + self._bias()"),
    "gathered in place, heads first": (
        "",
        "bias = self.table.T[:, self.index]\n        scores = scores + bias"),
    "memoised per device outside training": (
        "\n    def biases(self, device):\n"
        "        if self.training:\n"
        "            return self.table.T[:, self.index]\n"
        "        key = str(device)\n"
        "        if key not in self.cache:\n"
        "            self.cache[key] = self.table.T[:, self.index]\n"
        "        return self.cache[key]\n",
        "scores = scores + self.biases(x.device)"),
}


def _source(form: str = "a helper method", extra: str = "") -> str:
    helper, use = FORMS[form]
    return TEMPLATE.format(helper=helper, use=use, extra=extra)


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> dict[str, str]:
    return {fact["name"]: fact["statement"] for fact in finding.extra["facts"].get(status, [])}


def _original_and_patched(source: str, dtype: torch.dtype = torch.float32, unsafe_fixes: bool = False):
    """The module as written and as `fix` patches it, built from one seed, the patch given the original's weights."""
    fixed = analyze_source(source, "case.py", unsafe_fixes=unsafe_fixes).fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().to(dtype)
    patched = load_module_from_source(fixed, "case_fixed").Attention().to(dtype)
    patched.load_state_dict(original.state_dict())
    return original, patched


def _output_and_gradients(model, x: torch.Tensor, table) -> tuple:
    """The output, the input's gradient and the table's under an upstream gradient that weighs each element apart."""
    leaf = x.clone().requires_grad_()
    out = model(leaf)
    (out * torch.linspace(-1, 1, out.numel(), dtype=x.dtype).view_as(out)).sum().backward()
    return out, leaf.grad, table(model).grad


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}


@pytest.mark.parametrize("form", list(FORMS), ids=list(FORMS))
def test_a_learned_table_bias_is_a_safe_float_mask(form):
    finding = _finding(_source(form))
    assert finding.fix_safety == "safe" and finding.fixable, finding.reason
    assert not _facts(finding, "assumed")
    assert "learned bias" in _facts(finding, "accepted")["fully-masked-rows"]
    assert "mask-rank" in _facts(finding, "proved") and "mask-dtype" in _facts(finding, "proved")
    assert "attn_mask=" in finding.patch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("form", list(FORMS), ids=list(FORMS))
def test_outputs_and_gradients_match_the_table_included(form, dtype):
    original, patched = _original_and_patched(_source(form), dtype)
    x = torch.randn(2, 5, 16, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (original, patched):
        model.train(form != "memoised per device outside training")  # the memo serves eval calls
        results.append(_output_and_gradients(model, x, lambda m: m.table))
    assert results[0][2] is not None and results[0][2].abs().sum() > 0
    torch.testing.assert_close(results[1], results[0], **_tolerance(dtype))
    assert uses_sdpa(dispatched_ops(patched, (x,)))


PER_HEAD = '''
import torch
from torch import nn


class Attention(nn.Module):
    """One head at a time (3-D scores), each adding its own slice of the table's gather."""

    def __init__(self, dim=16, heads=2, n=5):
        super().__init__()
        self.heads, self.n, self.scale = heads, n, (dim // heads) ** -0.5
        self.qkv = nn.ModuleList([nn.Linear(dim, 3 * dim // heads) for _ in range(heads)])
        self.table = nn.Parameter(torch.randn(heads, 2 * n - 1))
        self.register_buffer("index", torch.empty(n, n, dtype=torch.long))
        positions = torch.arange(n)
        self.index.copy_(positions[:, None] - positions[None, :] + n - 1)

    def forward(self, x):
        biases = self.table[:, self.index]
        outputs = []
        for head, project in enumerate(self.qkv):
            q, k, v = project(x).chunk(3, dim=-1)
            scores = (q * self.scale) @ k.transpose(-2, -1)
            scores = scores + biases[head]
            outputs.append(scores.softmax(dim=-1) @ v)
        return torch.cat(outputs, dim=-1)
'''


def test_a_slice_per_head_taken_by_a_loop_counter_has_a_proved_rank():
    finding = _finding(PER_HEAD)
    assert finding.fix_safety == "safe" and finding.fixable, finding.reason
    assert "mask-rank" in _facts(finding, "proved")
    original, patched = _original_and_patched(PER_HEAD)
    x = torch.randn(2, 5, 16)
    results = []
    for model in (original, patched):
        out = model(x)
        out.square().sum().backward()
        results.append((out, model.table.grad))
    torch.testing.assert_close(results[1], results[0])


def test_a_bias_the_caller_passes_gets_what_it_got_before():
    source = _source(extra=", bias").replace("scores = scores + self._bias()", "scores = scores + bias")
    finding = _finding(source)
    assert finding.fix_safety == "unsafe"
    assert "fully-masked-rows" in _facts(finding, "assumed")
    assert "learned bias" not in str(finding.extra["facts"])


@pytest.mark.parametrize("old,new", [
    ("nn.Parameter(torch.zeros(2 * n - 1, heads))", "nn.Parameter(torch.full((2 * n - 1, heads), float('-inf')))"),
    ("nn.init.trunc_normal_(self.table, std=0.5)", "nn.init.constant_(self.table, torch.finfo(torch.float32).min)"),
    ("self.table = nn.Parameter(torch.zeros(2 * n - 1, heads))",
     "self.register_buffer('table', torch.zeros(2 * n - 1, heads).masked_fill(torch.rand(2 * n - 1, heads) > .5, "
     "float('-inf')))"),
    ("nn.init.trunc_normal_(self.table, std=0.5)", "self.table.data.fill_(-1e9)"),
    ("nn.init.trunc_normal_(self.table, std=0.5)", "nn.init.constant_(self.table.data, float('-inf'))"),
    ("self.cache = {}\n        self.reset_parameters()", "self.cache = {}\n        self.reset_parameters()\n"
     "        self.table = torch.full((2 * n - 1, heads), -1e4)"),
], ids=["a -inf Parameter", "initialised to finfo.min", "a buffer holding -inf", "filled in place",
        "initialised through .data",
        "rebound to a tensor"])
def test_a_table_that_may_hold_a_mask_value_is_no_learned_bias(old, new):
    source = _source()
    assert old in source
    finding = _finding(source.replace(old, new))
    assert "fully-masked-rows" in _facts(finding, "assumed"), finding.extra["facts"]
    assert finding.fix_safety == "unsafe" or not finding.fixable


def test_a_subclass_that_redefines_the_helper_is_no_learned_bias():
    source = _source() + '''

class Masked(Attention):
    def _bias(self):
        return torch.full((1, self.heads, self.n, self.n), float("-inf"))
'''
    findings = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert findings and all(f.fix_safety == "unsafe" or not f.fixable for f in findings)


@pytest.mark.parametrize("store", ["self.cache.update({key: bias})", "self.cache[key] = bias"],
                         ids=["a dictionary method", "a value the caller passes"])
def test_a_memo_that_may_hold_other_values_is_no_learned_bias(store):
    source = _source("memoised per device outside training", extra=", bias=None").replace(
        "self.cache[key] = self.table.T[:, self.index]", "self.cache[key] = self.table.T[:, self.index]\n"
        "        if bias is not None:\n            " + store).replace(
        "def biases(self, device):", "def biases(self, device, bias=None):").replace(
        "self.biases(x.device)", "self.biases(x.device, bias)")
    finding = _finding(source)
    assert "fully-masked-rows" in _facts(finding, "assumed")


LEVIT_STYLE = '''
import torch
from torch import nn


class Attention(nn.Module):
    """LeViT's style: a per-head table gathered by a 2-D index buffer, cached per device outside training."""

    def __init__(self, dim=16, heads=2, side=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        n = side * side
        self.attention_biases = nn.Parameter(torch.empty(heads, n))
        self.register_buffer("attention_bias_idxs", torch.empty((n, n), dtype=torch.long), persistent=False)
        self.attention_bias_cache = {}
        nn.init.normal_(self.attention_biases)
        points = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")).flatten(1)
        offsets = (points[..., :, None] - points[..., None, :]).abs()
        self.attention_bias_idxs.copy_(offsets[0] * side + offsets[1])

    @torch.no_grad()
    def train(self, mode=True):
        super().train(mode)
        if self.attention_bias_cache:
            self.attention_bias_cache = {}
        return self

    def get_attention_biases(self, device: torch.device) -> torch.Tensor:
        if torch.jit.is_tracing() or self.training:
            return self.attention_biases[:, self.attention_bias_idxs]
        else:
            device_key = str(device)
            if device_key not in self.attention_bias_cache:
                self.attention_bias_cache[device_key] = self.attention_biases[:, self.attention_bias_idxs]
            return self.attention_bias_cache[device_key]

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, self.heads, -1).split([C // self.heads] * 3, dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = q @ k * self.scale + self.get_attention_biases(x.device)
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)
'''
# a utility elsewhere in the tree that binds attributes by names it computes (timm's `_prune.set_layer`)
SET_BY_PATH = ("def set_layer(model, path, value):\n    *parents, last = path.split('.')\n"
               "    for name in parents:\n        model = getattr(model, name)\n    setattr(model, last, value)\n")


# timm 1.0's own spellings: the cache cleared under `if mode and ...`, and in an `_apply` override that hands torch's
# function on to `super()._apply` (what `.to()` and `.half()` call): neither rebinds the table or its index
TIMM_SPELLINGS = {
    "as written": LEVIT_STYLE,
    "cleared under `and`": LEVIT_STYLE.replace("        if self.attention_bias_cache:",
                                               "        if mode and self.attention_bias_cache:"),
    "an _apply override": LEVIT_STYLE.replace(
        "    def get_attention_biases(", "    def _apply(self, fn, *args, **kwargs):\n"
        "        self.attention_bias_cache = {}\n        return super()._apply(fn, *args, **kwargs)\n\n"
        "    def get_attention_biases("),
}


@pytest.mark.parametrize("source", list(TIMM_SPELLINGS.values()), ids=list(TIMM_SPELLINGS))
def test_a_levit_style_cached_bias_is_safe_and_its_stale_cache_matches(source):
    """The eval cache holds the bias gathered at the first eval call: an in-place update of the table afterwards is
    not seen in eval until `train()` clears the cache, in the original as in the patch (the SDPA call reads the same
    helper at the same point), and training reads the table afresh, its gradient included."""
    finding = _finding(source)
    assert finding.fix_safety == "safe" and finding.fixable, finding.reason
    assert "learned bias" in _facts(finding, "accepted")["fully-masked-rows"]
    original, patched = _original_and_patched(source)
    x = torch.randn(2, 4, 16)
    results = []
    for model in (original, patched):
        model.eval()
        first = model(x)
        with torch.no_grad():
            table = model.attention_biases  # the cache goes stale: eval still reads the old gather
            table.add_(torch.linspace(0, 3, table.numel()).view_as(table))
        stale = model(x)
        model.train()
        fresh = model(x)
        fresh.square().sum().backward()
        results.append((first, stale, fresh, model.attention_biases.grad))
    torch.testing.assert_close(results[1], results[0])
    torch.testing.assert_close(results[0][0], results[0][1])  # stale in both
    assert not torch.allclose(results[0][1], results[0][2])
    assert uses_sdpa(dispatched_ops(patched.eval(), (x,)))


@pytest.mark.parametrize("old, new", [
    ("if self.attention_bias_cache:", "if mode and self.attention_bias_cache.setdefault('x', torch.full((1,), -1e9)):"),
    ("if self.attention_bias_cache:", "if (mode and self.attention_bias_cache) is not None:"),
], ids=["a store under `and`", "the cache compared, not tested"])
def test_a_levit_style_cache_that_may_hold_another_value_is_no_learned_bias(old, new):
    """A memo used otherwise than tested for truth may hold anything: the bias is not read as the table's."""
    source = LEVIT_STYLE.replace(old, new)
    assert source != LEVIT_STYLE
    finding = _finding(source)
    assert "fully-masked-rows" not in _facts(finding, "accepted"), finding.extra["facts"]


@pytest.mark.parametrize("apply", ["super()._apply(lambda t: t.flatten(), *args, **kwargs)",
                                   "super()._apply(torch.flatten, *args, **kwargs)",
                                   "super()._apply(fn, *args, **kwargs) if (fn := torch.flatten) else None"],
                         ids=["a lambda", "another function", "its function rebound"])
def test_an_apply_override_with_another_function_leaves_the_bias_rank_unproved(apply):
    """`_apply` given another function than its caller's may reshape every parameter and buffer: the bias's rank is
    then not read from the class's construction."""
    source = LEVIT_STYLE.replace("    def get_attention_biases(", "    def _apply(self, fn, *args, **kwargs):\n"
                                 f"        return {apply}\n\n    def get_attention_biases(")
    finding = _finding(source)
    assert "mask-rank" not in _facts(finding, "proved"), finding.extra["facts"]


def test_a_learned_table_another_file_may_rebind_by_computed_names_is_assumed_naming_both(tmp_path):
    """A utility elsewhere in the tree that binds attributes by computed names (`setattr(model, last, value)`) may
    rebind the table, its index or the cache on an instance, so the class's table is not proved to be what the
    block reads (as for every attribute: README's Identity at run time): the facts stay assumed, and the reason
    names the learned table and the file, not "values not visible"."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(LEVIT_STYLE, encoding="utf-8")
    (tmp_path / "prune.py").write_text(SET_BY_PATH, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe"
    why = assumed["fully-masked-rows"]
    assert "self.attention_biases" in why and "prune.py" in why and "computed names" in why, why
    assert "not visible" not in why
    assert "self.attention_biases" in assumed["mask-rank"] and "prune.py" in assumed["mask-rank"]


RAW_BY_NAME = "def set_raw(model, name, value):\n    model.__dict__[name] = value\n"


@pytest.mark.parametrize("writer, checked", [
    (SET_BY_PATH, False),  # through nn.Module.__setattr__: only a Parameter (or None) replaces a parameter
    (RAW_BY_NAME, True),  # the instance's namespace: anything shadows it, so the patch checks it when it runs
    ("def set_any(model, name, value):\n    object.__setattr__(model, name, value)\n", True),
])
def test_a_table_bound_only_as_a_parameter_keeps_its_proof_beside_bindings_by_computed_names(tmp_path, writer,
                                                                                             checked):
    """Swin's tables (a class that binds the table only as an `nn.Parameter`, deriving from nn.Module alone)
    beside timm's `setattr(model, last, value)` utilities: torch's `Module.__setattr__` raises for anything but a
    Parameter or None there, so the table is a learned one whatever the utility binds. A write that bypasses it
    (`__dict__`, `object.__setattr__`) makes the patch check `isinstance(self.table, torch.nn.Parameter)`."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(_source(), encoding="utf-8")
    (tmp_path / "prune.py").write_text(writer, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.extra["facts"]
    guarded = _facts_why(finding, "guarded")
    assert ("isinstance(self.table, torch.nn.Parameter)" in guarded.get("fully-masked-rows", "")) == checked
    original, patched = _folder_original_and_patched(tmp_path)
    prune = load_module_from_source(writer, "prune")
    setter = getattr(prune, "set_layer", None) or getattr(prune, "set_raw", None) or prune.set_any
    for model in (original, patched):  # another Parameter: a learned table like the class's
        torch.manual_seed(1)
        setter(model, "table", torch.nn.Parameter(torch.randn_like(model.table)))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(patched(x), original(x))
    if not checked:
        with pytest.raises(TypeError):
            prune.set_layer(original, "table", torch.full_like(original.table, float("-inf")))
        return
    for model in (original, patched):  # a plain tensor of -inf shadowing it: the original block runs
        setter(model, "table", torch.full_like(model.table, float("-inf")).detach())
    torch.testing.assert_close(patched(x), original(x), equal_nan=True)
    assert not uses_sdpa(dispatched_ops(patched, (x,)))


TABLE_OR_NONE = _source().replace("self.table = nn.Parameter(torch.zeros(2 * n - 1, heads))",
                                  "self.table = None\n        if n:\n"
                                  "            self.table = nn.Parameter(torch.zeros(2 * n - 1, heads))")


def test_a_table_some_binding_leaves_none_is_checked_to_be_a_parameter_when_the_block_runs(tmp_path):
    """`self.table = None` on one branch (BEiT without a window) binds a plain attribute, which `setattr` may
    rebind to any tensor: beside a utility binding attributes by computed names, the patch takes SDPA only where
    the table is an `nn.Parameter` when the block runs (then it is learned, as the class's), else the original."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(TABLE_OR_NONE, encoding="utf-8")
    (tmp_path / "prune.py").write_text(SET_BY_PATH, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.extra["facts"]
    assert "isinstance(self.table, torch.nn.Parameter)" in _facts_why(finding, "guarded")["fully-masked-rows"]
    original, patched = _folder_original_and_patched(tmp_path)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(patched(x), original(x))
    assert uses_sdpa(dispatched_ops(patched, (x,)))
    for model in (original, patched):  # a plain tensor where the table was: the original block runs
        table = model.table.detach().clone()
        del model.table
        model.table = table.fill_(float("-inf"))
    torch.testing.assert_close(patched(x), original(x), equal_nan=True)
    assert not uses_sdpa(dispatched_ops(patched, (x,)))


def _facts_why(finding, status: str) -> dict[str, str]:
    return {fact["name"]: fact["why"] for fact in finding.extra["facts"].get(status, [])}


def _folder_original_and_patched(folder):
    """The folder's `Attention` as written and as `fix --apply` patches the folder, with the original's weights."""
    import shutil

    import advisor

    copy = folder.with_name(folder.name + "_patched")
    shutil.copytree(folder, copy)
    advisor.fix(str(copy), apply=True, cache=False)
    torch.manual_seed(0)
    original = load_module_from_source((folder / "model.py").read_text(), "folder_case").Attention()
    patched_source = (copy / "model.py").read_text()
    assert "scaled_dot_product_attention" in patched_source
    patched = load_module_from_source(patched_source, "folder_case_fixed").Attention()
    patched.load_state_dict(original.state_dict())
    return original, patched


@pytest.mark.parametrize("apply", ["super()._apply(torch.flatten, *args, **kwargs)",
                                   "super()._apply(fn, *args, **kwargs)"], ids=["another function", "its caller's"])
def test_an_apply_override_in_a_tree_that_changes_no_shape_in_place(tmp_path, apply):
    """In a tree of several files none of which names an in-place shape change, only what runs or rebuilds modules
    with other tensors counts against a buffer's rank: `_apply` given another function than its caller's is one
    (it was read past), the override that passes its caller's on is torch's own."""
    (tmp_path / "model.py").write_text(LEVIT_STYLE.replace(
        "    def get_attention_biases(", "    def _apply(self, fn, *args, **kwargs):\n"
        f"        return {apply}\n\n    def get_attention_biases("))
    (tmp_path / "train.py").write_text("from model import Attention\n\nmodel = Attention()\n")
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert ("mask-rank" in _facts(finding, "proved")) is (apply == "super()._apply(fn, *args, **kwargs)")


ADD_BLOCKS = ("def add_blocks(model, blocks):\n    for i, block in enumerate(blocks):\n"
              "        model.add_module(f'block{i}', block)\n")


@pytest.mark.parametrize("writer", [
    ADD_BLOCKS,  # torch's add_module refuses a name that holds anything: but an unbound name, or an instance
    ADD_BLOCKS.replace("add_module", "register_module"),  # whose __init__ never ran, holds nothing
    "def swap(model, name, value):\n    delattr(model, name)\n    model.add_module(name, value)\n",
    "import functools\n\n\ndef swap(model, name, value):\n    functools.partial(delattr, model)(name)\n",
    "def swap(model, name, value):\n    model.__delattr__(name)\n",
    "def fresh(cls):\n    return cls.__new__(cls)\n",
    "class Registry:\n    def add_module(self, name, value):\n        setattr(self, name, value)\n",
    "def set_any(model, name, value):\n    bind = model.register_parameter\n    bind(name, value)\n",
    "import functools\n\n\ndef set_any(model, name, value):\n"
    "    functools.partial(model.register_parameter, name)(value)\n",
    "def set_any(model, spec):\n    model.register_buffer(**spec)\n",
    "def set_any(model, name, value):\n    getattr(model, 'register_buffer')(name, value)\n",
], ids=["add_module", "register_module", "delattr", "delattr handed on", "__delattr__", "__new__", "own add_module",
        "bound method", "partial", "keywords unpacked", "getattr"])
def test_bindings_whose_name_the_call_does_not_show_leave_a_table_some_branch_leaves_none_checked(tmp_path, writer):
    """Breaker rounds 61 and 62: a binding method whose name or arguments the call does not show (a bound method
    kept, `partial`, `**spec`, `getattr`), a computed `add_module` (which a computed `delattr` first, or an instance
    `__new__` made, lets bind any name), an `add_module` of the tree's own, may put a plain tensor where the class
    binds a Parameter or None: the patch checks the table is a Parameter when the block runs (the original block
    runs where it is not)."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(TABLE_OR_NONE, encoding="utf-8")
    (tmp_path / "util.py").write_text(writer, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.extra["facts"]
    guarded = _facts_why(finding, "guarded").get("fully-masked-rows", "")
    assert "isinstance(self.table, torch.nn.Parameter)" in guarded, finding.extra["facts"]
    if writer is not ADD_BLOCKS:
        return
    original, patched = _folder_original_and_patched(tmp_path)
    util = load_module_from_source(writer, "add_blocks_util")
    x = torch.randn(2, 5, 16)
    for model in (original, patched):
        util.add_blocks(model, [torch.nn.Identity(), torch.nn.Linear(2, 2)])
    torch.testing.assert_close(patched(x), original(x))
    assert uses_sdpa(dispatched_ops(patched, (x,)))
    for model in (original, patched):  # unbound first, the table's name takes a module: the original block runs
        del model.table
        model.add_module("table", torch.nn.Identity())
    with pytest.raises(TypeError):
        original(x)
    with pytest.raises(TypeError):
        patched(x)


DROPPED = _source().replace("        weights = scores.softmax(dim=-1)\n",
                            "        weights = self.drop(scores.softmax(dim=-1))\n").replace(
    "        self.cache = {}\n        self.reset_parameters()",
    "        self.cache = {}\n        self.drop = nn.Dropout(0.1)\n        self.reset_parameters()")


@pytest.mark.parametrize("binder", ["setattr(model, f'block{i}', block)", "model.add_module(f'block{i}', block)"])
def test_a_submodule_the_block_calls_is_as_open_to_add_module_as_to_setattr(tmp_path, binder):
    """`add_module` by a computed name may replace any submodule (the block's dropout among them): what the block
    reads of its dropout is decided as beside `setattr`."""
    from advisor.engine.static import scan_paths

    assert "self.drop = nn.Dropout(0.1)" in DROPPED
    (tmp_path / "model.py").write_text(DROPPED, encoding="utf-8")
    (tmp_path / "util.py").write_text(f"def add_blocks(model, blocks):\n    for i, block in enumerate(blocks):\n"
                                      f"        {binder}\n", encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    reasons = " ".join(fact["why"] or "" for status in ("assumed", "guarded") for fact in
                       finding.extra["facts"].get(status, []))
    assert finding.reason and "computed names" in finding.reason or "computed names" in reasons, \
        (finding.reason, finding.extra["facts"])
