"""Facts an attention block cannot prove about its parameters, proved at every call in the scanned tree.

Each case writes a small tree (the attention in one file, its callers in the same or another file), scans it as a
user does, and checks which facts are proved from call sites (with the sites listed) and which stay assumed. Where
the patch becomes safe, the original and patched trees are imported and run on the same weights and inputs,
including a sample whose every key is padding (a fully masked query row)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.engine.static import scan_paths
from fixture_models import load_module_from_source

ATTEND = '''
import torch


def attend(q, k, v, mask, scale):
    scores = q @ k.transpose(-2, -1) * scale + mask
    return scores.softmax(dim=-1) @ v
'''

MODEL = '''
import torch
from torch import nn

from {module} import attend


class Model(nn.Module):
    def __init__(self, dim=16, heads=2, pad=0):
        super().__init__()
        self.heads, self.pad = heads, pad
        self.embed = nn.Embedding(20, dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, ids):
        b, n = ids.shape
        x = self.embed(ids)
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.k(x).view(b, n, self.heads, -1).transpose(1, 2)
        v = self.v(x).view(b, n, self.heads, -1).transpose(1, 2)
        keep = ids != self.pad
        out = attend(q, k, v, {mask}, {scale})
        return out.transpose(1, 2).reshape(b, n, -1)
'''

# a module's forward reached from its parent: Block builds `self.attn`, Model builds the mask
MODULES = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        if mask is not None:
            scores = scores + mask
        weights = scores.softmax(dim=-1)
        return (weights @ v).permute(0, 2, 1, 3).reshape(b, n, d)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = Attention(dim, heads)

    def forward(self, x, mask=None):
        return x + self.attn(x, mask)


class Plain(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = Attention(dim, heads)

    def forward(self, x):
        return self.attn(x)


class Model(nn.Module):
    def __init__(self, dim=16, heads=2, pad=0):
        super().__init__()
        self.pad = pad
        self.embed = nn.Embedding(20, dim)
        self.block = Block(dim, heads)
        self.plain = Plain(dim, heads)

    def forward(self, ids):
        b, n = ids.shape
        padding = {mask}
        return self.plain(self.block(self.embed(ids), padding))
'''


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tree"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _attention(root: Path, call_site_facts: bool = True):
    result = scan_paths([str(root)], jobs=1, call_site_facts=call_site_facts)
    found = [f for f in result.findings if f.kind == "attention"]
    assert len(found) == 1, [(f.rule, f.reason) for f in found]
    return found[0], result


def _unproved_mask(finding) -> bool:
    """Call sites proved nothing of Block's mask (applied under `if mask is not None:`): the patch takes SDPA only
    where the mask is None (guarded by its absence) and runs the original block otherwise."""
    return "from_call_sites" not in finding.extra["facts"] and "fully-masked-rows" in _names(finding, "guarded") \
        and "if mask is None:" in finding.patch


def _names(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


def _unproved(finding) -> set[str]:
    """Facts neither the block nor its call sites prove: assumed, or guarded by a run-time check."""
    return _names(finding, "assumed") | _names(finding, "guarded")


def _sites(finding, name: str) -> list[str]:
    return next(f["sites"] for f in finding.extra["facts"]["from_call_sites"] if f["name"] == name)


def _padded_ids() -> torch.Tensor:
    """Sample 0 pads its last keys; sample 1 is all padding, so each of its query rows is fully masked."""
    ids = torch.randint(1, 20, (2, 6), generator=torch.Generator().manual_seed(3))
    ids[0, 4:] = 0
    ids[1] = 0
    return ids


def _run(root: Path, module: str, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    sys.path.insert(0, str(root))
    try:
        for name in [n for n in sys.modules if n in ("attn", "model", "modules", "llama")]:
            del sys.modules[name]
        torch.manual_seed(0)
        model = importlib.import_module(module).Model().to(dtype).eval()
        with torch.no_grad():
            return model(ids)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n in ("attn", "model", "modules", "llama")]:
            del sys.modules[name]


def _assert_parity(tmp_path: Path, root: Path, result, module: str, fp64: float = 1e-10) -> None:
    """The safe patch, applied as `fix --apply` would, computes what the original computes (`fp64`: the float64
    tolerance, float32 rounding where the original upcasts to it, the accepted precision divergence)."""
    patched = tmp_path / "patched"
    patched.mkdir()
    for file in result.files:
        (patched / Path(file.path).name).write_text(file.fixed)
    assert any("scaled_dot_product_attention" in p.read_text() for p in patched.iterdir())
    ids = _padded_ids()
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, fp64)):
        original, rewritten = _run(root, module, ids, dtype), _run(patched, module, ids, dtype)
        torch.testing.assert_close(rewritten, original, atol=tolerance, rtol=tolerance)


# -- a caller in another file proves every fact of a function -------------------------------------------------
def test_a_caller_in_another_file_proves_rank_dtype_rows_and_scale(tmp_path):
    root = _tree(tmp_path, {"attn.py": ATTEND,
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert _names(finding, "from_call_sites") == {"mask-rank", "mask-dtype", "fully-masked-rows",
                                                  "scale-is-number"}
    assert _sites(finding, "mask-rank") == [f"{root / 'model.py'}:22"]
    _assert_parity(tmp_path, root, result, "model")


def test_the_opt_out_flag_proves_nothing_from_call_sites(tmp_path):
    root = _tree(tmp_path, {"attn.py": ATTEND,
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    finding, _ = _attention(root, call_site_facts=False)
    assert finding.fix_safety == "unsafe"
    assert "from_call_sites" not in finding.extra["facts"]
    assert "fully-masked-rows" in _names(finding, "assumed")
    assert {"mask-rank", "mask-dtype", "scale-is-number"} <= _unproved(finding)  # metadata: checked at run time
    cli = subprocess.run([sys.executable, "-m", "advisor", "scan", str(root), "--format", "json",
                          "--no-call-site-facts"], capture_output=True, text=True)
    assert '"from_call_sites"' not in cli.stdout and '"fix_safety": "unsafe"' in cli.stdout
    with_sites = subprocess.run([sys.executable, "-m", "advisor", "scan", str(root), "--format", "json"],
                                capture_output=True, text=True)
    assert '"from_call_sites"' in with_sites.stdout and '"fix_safety": "safe"' in with_sites.stdout


@pytest.mark.parametrize("mask, scale, still_assumed", [
    ("keep.view(b, 1, 1, n).float()", "0.25", {"mask-dtype"}),  # a float mask: its width is not shown
    ("keep", "0.25", {"mask-rank"}),  # a 2-D mask on 4-D scores: SDPA needs it broadcastable from the right
    ("(~keep).view(b, 1, 1, n) * -1e9", "0.25", {"fully-masked-rows", "mask-dtype"}),  # swallows padded rows
    ("keep.view(b, 1, 1, n)", "self.heads ** -0.5 * torch.ones(())", {"scale-is-number"}),
])
def test_a_caller_that_does_not_prove_a_fact_leaves_it_assumed(tmp_path, mask, scale, still_assumed):
    """Left to the patch: a fact about metadata is checked at run time (guarded, and safe when nothing else is
    assumed), any other stays assumed."""
    root = _tree(tmp_path, {"attn.py": ATTEND, "model.py": MODEL.format(module="attn", mask=mask, scale=scale)})
    finding, _ = _attention(root)
    assert _unproved(finding) == still_assumed | {"kv-length"}  # q, k and v are parameters: lengths guarded
    assert finding.fix_safety == ("unsafe" if _names(finding, "assumed") else "safe")
    assert _names(finding, "assumed") == still_assumed - {"mask-rank", "mask-dtype", "scale-is-number"}


def test_one_call_that_does_not_prove_it_is_enough_to_keep_it_assumed(tmp_path):
    other = "\n\ndef elsewhere(q, k, v, m):\n    return attend(q, k, v, m, 0.5)\n"
    root = _tree(tmp_path, {"attn.py": ATTEND, "model.py": MODEL.format(
        module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25") + other})
    finding, _ = _attention(root)
    assert {"mask-rank", "mask-dtype", "fully-masked-rows"} <= _unproved(finding)
    assert _names(finding, "from_call_sites") == {"scale-is-number"}  # both calls pass a number


@pytest.mark.parametrize("extra", [
    "\n\nHANDLERS = [attend]\n",  # the function is passed elsewhere: its calls are not all visible
    "\n\ndef spread(args):\n    return attend(*args)\n",  # what *args binds is not visible
])
def test_a_use_that_is_not_a_visible_call_proves_nothing(tmp_path, extra):
    root = _tree(tmp_path, {"attn.py": ATTEND + extra,
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    finding, _ = _attention(root)
    assert "from_call_sites" not in finding.extra["facts"]
    assert finding.fix_safety == "unsafe"


@pytest.mark.parametrize("unseen", [
    "importlib.import_module('attn').attend(q, k, v, m, 0.5)",  # the module looked up by its name at run time
    "sys.modules['attn'].attend(q, k, v, m, 0.5)",
    "eval('attn.attend')(q, k, v, m, 0.5)",  # code from a string
    "(loaded := __import__('attn')).attend(q, k, v, m, 0.5)",  # a module bound to a name no import shows
])
def test_a_call_through_a_module_found_at_run_time_proves_nothing(tmp_path, unseen):
    """Another file reaches the function by the module's name (the call is `.attend` on a value no import gives):
    its mask may swallow a row the visible caller never does (bug_14: gradients differed by 2.8 in float32)."""
    other = f"import importlib\nimport sys\n\n\ndef elsewhere(q, k, v, m):\n    return {unseen}\n"
    root = _tree(tmp_path, {"attn.py": ATTEND, "other.py": other,
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    finding, _ = _attention(root)
    assert "from_call_sites" not in finding.extra["facts"]
    assert "fully-masked-rows" in _names(finding, "assumed") and finding.fix_safety == "unsafe"


def test_a_mask_handed_to_another_module_before_the_call_proves_nothing(tmp_path):
    """`m = zeros(...); corrupt(m); attend(q, k, v, m, s)`, `corrupt` in another file writing a -1e9 row: a fifth
    breaker's (gradients differed by 15.4 in float32). A function of another module was trusted not to write what it
    is given; now only the call site's own callee is."""
    model = MODEL.format(module="attn", mask="m", scale="0.25").replace(
        "        keep = ids != self.pad\n",
        "        keep = ids != self.pad\n        m = torch.zeros(b, 1, 1, n)\n        corrupt(m)\n").replace(
        "from attn import attend\n", "from attn import attend\nfrom util import corrupt\n")
    corrupt = "def corrupt(t):\n    t[0, 0, 0, 1] = -1e9\n"
    root = _tree(tmp_path, {"attn.py": ATTEND, "model.py": model, "util.py": corrupt})
    finding, _ = _attention(root)
    assert "fully-masked-rows" not in _names(finding, "from_call_sites") and finding.fix_safety == "unsafe"
    unhanded = _tree(tmp_path / "plain", {"attn.py": ATTEND, "model.py": model.replace("        corrupt(m)\n", "")})
    assert "fully-masked-rows" in _names(_attention(unhanded)[0], "from_call_sites")


@pytest.mark.parametrize("cell", [["%%time\n", "y = attend(q, k, v, bad, 0.5)\n"],
                                  ["%time y = attend(q, k, v, bad, 0.5)\n"]])
def test_a_call_in_a_notebook_line_the_scan_masks_proves_nothing(tmp_path, cell):
    """IPython runs the body of a `%%time` cell and the statement of a `%time` line; the scan masked both out of the
    notebook's code, so a call there was not counted (a fifth breaker's: gradients differed by 15.4). The line is
    still masked, as a read of every name it spells; the cell's body is read as code (breaker round 15), so its
    call is a call site, whose unknown mask proves nothing."""
    import json

    code = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    notebook = {"cells": [{**code, "source": ["from attn import attend\n"]}, {**code, "source": cell}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    root = _tree(tmp_path, {"attn.py": ATTEND, "nb.ipynb": json.dumps(notebook, indent=1),
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    finding, _ = _attention(root)
    assert "fully-masked-rows" not in _names(finding, "from_call_sites") and finding.fix_safety == "unsafe"


def test_a_function_with_no_caller_in_the_tree_gets_nothing(tmp_path):
    root = _tree(tmp_path, {"attn.py": ATTEND})
    finding, _ = _attention(root)
    assert "from_call_sites" not in finding.extra["facts"] and finding.fix_safety == "unsafe"


def test_an_edit_of_the_call_site_is_seen_by_the_next_scan(tmp_path):
    root = _tree(tmp_path, {"attn.py": ATTEND,
                            "model.py": MODEL.format(module="attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    assert _attention(root)[0].fix_safety == "safe"
    model = root / "model.py"
    model.write_text(model.read_text().replace("keep.view(b, 1, 1, n)", "keep.view(b, 1, 1, n) * 1e9"))
    finding, _ = _attention(root)
    assert finding.fix_safety == "unsafe" and "fully-masked-rows" in _names(finding, "assumed")


# -- a module's forward reached from its parent, through a parameter passed on --------------------------------
@pytest.mark.parametrize("mask", [
    "(ids == self.pad).view(b, 1, 1, n) * -8.0",  # a comparison times a small constant
    "torch.zeros(b, 1, 1, n)",  # zeros
    "torch.rand(b, 1, n, n) - 0.5",  # a bounded random draw
])
def test_a_parent_module_proves_the_mask_of_its_childs_forward(tmp_path, mask):
    root = _tree(tmp_path, {"modules.py": MODULES.format(mask=mask)})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert _names(finding, "from_call_sites") == {"mask-rank", "fully-masked-rows"}
    sites = _sites(finding, "mask-rank")
    assert len(sites) == 2  # Model's call through Block, and Plain's call that passes no mask (None is not used)
    _assert_parity(tmp_path, root, result, "modules")


def test_a_module_level_tensor_is_read_where_it_is_built(tmp_path):
    source = MODULES.format(mask="MASK") + "\n\nMASK = torch.randn(1, 1, 6, 6)\n"
    root = _tree(tmp_path, {"modules.py": source})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    _assert_parity(tmp_path, root, result, "modules")
    root2 = _tree(tmp_path / "rewritten", {"modules.py": source + "MASK[0] = float('-inf')\n"})
    assert _unproved_mask(_attention(root2)[0])  # written after it is built: its values are not shown


def test_an_instance_used_otherwise_proves_nothing(tmp_path):
    source = MODULES.format(mask="torch.zeros(b, 1, 1, n)").replace(
        "        return x + self.attn(x, mask)",
        "        self.attn.cached = mask\n        return x + self.attn(x, mask)")
    root = _tree(tmp_path, {"modules.py": source})
    assert _unproved_mask(_attention(root)[0])


INIT_READS = '''

def init_weights(blocks):
    for block in blocks:
        nn.init.normal_(block.attn.qkv.weight, std=0.02)
        print(block.attn.heads)
'''


def test_reads_of_the_childs_own_attributes_elsewhere_still_prove_its_mask(tmp_path):
    """open_clip initialises `block.attn.in_proj_weight` from outside the block: reading an attribute the child
    binds to a value that cannot lead back to it (a Linear, a number) calls no forward, here or in another file."""
    other = "import torch\nfrom modules import Block\n\n\ndef report(block):\n    return block.attn.heads\n"
    root = _tree(tmp_path, {"modules.py": MODULES.format(mask="torch.zeros(b, 1, 1, n)") + INIT_READS,
                            "report.py": other})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert "fully-masked-rows" in _names(finding, "from_call_sites")
    _assert_parity(tmp_path, root, result, "modules")


@pytest.mark.parametrize("bind, read", [
    ("", "block.attn.forward(x, m)"),  # forward itself
    ("self.fn = self.forward", "block.attn.fn(x, m)"),  # an attribute holding a bound method
    ("self.me = self", "block.attn.me(x, m)"),  # the instance itself
    ("self.other = self\n        self.alias = self.other", "block.attn.alias(x, m)"),  # through another attribute
    ("self.helper = Helper(self)", "block.attn.helper.run(x, m)"),  # an object holding the instance
    ("", "block.attn.eval()(x, m)"),  # a module method returning the instance
    ("self.qkv.owner = self", "block.attn.qkv.owner(x, m)"),  # a plain-looking attribute the class writes through
])
def test_reads_that_may_reach_the_child_itself_prove_nothing(tmp_path, bind, read):
    source = MODULES.format(mask="torch.zeros(b, 1, 1, n)").replace(
        "        self.qkv = nn.Linear(dim, dim * 3)\n", f"        self.qkv = nn.Linear(dim, dim * 3)\n        {bind}\n")
    source += "\n\nclass Helper:\n    def __init__(self, m):\n        self.m = m\n\n    def run(self, x, m):\n" \
        "        return self.m(x, m)\n"
    other = f"import torch\nfrom modules import Block\n\n\ndef probe(block, x, m):\n    return {read}\n"
    root = _tree(tmp_path, {"modules.py": source, "probe.py": other})
    assert _unproved_mask(_attention(root)[0])


@pytest.mark.parametrize("reach", ['block.get_submodule("attn")', 'getattr(block, "attn")', 'block._modules["attn"]',
                                   'dict(block.named_children())["attn"]'])
def test_a_child_reached_by_its_name_in_a_string_proves_nothing(tmp_path, reach):
    """Another file calls Block's `attn` found by name (a fifth breaker's: gradients differed by 20 in float32, a 5-D
    mask raised in the patch): a call the parent's `self.attn(...)` does not show."""
    other = f"import torch\nfrom modules import Block\n\n\ndef probe(block, x, m):\n    return {reach}(x, m)\n"
    root = _tree(tmp_path, {"modules.py": MODULES.format(mask="torch.zeros(b, 1, 1, n)"), "probe.py": other})
    assert _unproved_mask(_attention(root)[0])


# -- a scale passed to the constructor ---------------------------------------------------------------------------
SCALED = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, scale):
        super().__init__()
        self.scale = scale
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        w = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return w @ v
'''

BUILDER = '''
import torch
from torch import nn

from scaled import Attention


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Attention(16, 0.125)
        self.second = Attention(16, scale={scale})

    def forward(self, x):
        return self.second(self.first(x))
'''


def test_a_scale_every_construction_passes_as_a_number_is_proved(tmp_path):
    root = _tree(tmp_path, {"scaled.py": SCALED, "model.py": BUILDER.format(scale="16 ** -0.5")})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert _sites(finding, "scale-is-number") == [f"{root / 'model.py'}:11", f"{root / 'model.py'}:12"]
    patched = tmp_path / "patched"
    patched.mkdir()
    for file in result.files:
        (patched / Path(file.path).name).write_text(file.fixed)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    sys.path.insert(0, str(root))
    try:
        torch.manual_seed(0)
        original = importlib.import_module("model").Model().double().eval()
    finally:
        sys.path.remove(str(root))
        for name in ("model", "scaled"):
            sys.modules.pop(name, None)
    sys.path.insert(0, str(patched))
    try:
        rewritten = importlib.import_module("model").Model().double().eval()
        rewritten.load_state_dict(original.state_dict())
        torch.testing.assert_close(rewritten(x), original(x), atol=1e-10, rtol=1e-10)
    finally:
        sys.path.remove(str(patched))
        for name in ("model", "scaled"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("build", ["type(model.first)(16, sc)", "model.first.__class__(16, sc)",
                                   # a sixth breaker's: initialised again
                                   "model.first.__init__(16, sc)", "type(model.first).__init__(model.first, 16, sc)",
                                   "getattr(model.first, '__init__')(16, sc)"])
def test_an_instance_built_through_another_ones_class_proves_no_scale(tmp_path, build):
    """`type(model.first)(16, torch.ones(2, 1, 1))` names no class: the patch raised TypeError on its tensor scale
    (a fifth breaker's)."""
    other = f"import torch\n\n\ndef clone(model, sc):\n    return {build}\n"
    root = _tree(tmp_path, {"scaled.py": SCALED, "model.py": BUILDER.format(scale="16 ** -0.5"), "other.py": other})
    finding, _ = _attention(root)
    assert "scale-is-number" not in _names(finding, "from_call_sites")


@pytest.mark.parametrize("write", [
    "model.first.__setstate__({**model.first.__dict__, 'scale': sc})",
    "model.first.__dict__ |= {'scale': sc}",
    "dict.update(model.first.__dict__, scale=sc)",
    "operator.setitem(vars(model.first), 'scale', sc)",
    "list(map(setattr, [model.first], ['scale'], [sc]))",
    "functools.reduce(lambda o, kv: (setattr(o, *kv), o)[1], [('scale', sc)], model.first)",
])
def test_a_scale_written_through_the_instance_state_is_not_proved_from_its_construction(tmp_path, write):
    """A sixth breaker's: each spelling stored a tensor where the construction passed a number, and the unguarded
    patch raised TypeError."""
    other = f"import functools\nimport operator\n\n\ndef swap(model, sc):\n    {write}\n"
    root = _tree(tmp_path, {"scaled.py": SCALED, "model.py": BUILDER.format(scale="16 ** -0.5"), "other.py": other})
    finding, _ = _attention(root)
    assert "scale-is-number" not in _names(finding, "from_call_sites") | _names(finding, "proved")


@pytest.mark.parametrize("scale", ["torch.tensor(0.25)", "torch.nn.Parameter(torch.ones(()))"])
def test_a_construction_passing_a_tensor_scale_proves_nothing(tmp_path, scale):
    """Nothing from call sites; the patch checks the scale at run time instead (a tensor runs the original)."""
    root = _tree(tmp_path, {"scaled.py": SCALED, "model.py": BUILDER.format(scale=scale)})
    finding, _ = _attention(root)
    assert "from_call_sites" not in finding.extra["facts"] and "scale-is-number" in _names(finding, "guarded")


# -- an instance bound to a name, with a module-level mask ------------------------------------------------------
SCRIPT = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 2, 8).transpose(1, 2)
        k = self.k(x).view(b, n, 2, 8).transpose(1, 2)
        v = self.v(x).view(b, n, 2, 8).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / 4.0
        scores = scores + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, n, 16)


MASK = {mask}
model = Attention()
model.eval()


def run(x):
    return model(x, MASK)
'''


@pytest.mark.parametrize("mask, safe", [
    ("torch.rand(1, 1, 8, 8) > 0.5", True),  # a bool mask, added: +1 where True
    ("torch.randint(0, 2, (2, 1, 8, 8))", True),
    ("torch.randint(0, 2, (2, 1, 8, 8)) * 1000000000", False),  # int, but its values swallow rows
    ("torch.rand(8) > 0.5", True),  # 1-D: SDPA rejects it on 4-D inputs, so the guarded rank runs the original
])
def test_a_module_level_instance_and_mask(tmp_path, mask, safe):
    root = _tree(tmp_path, {"script.py": SCRIPT.format(mask=mask)})
    finding, result = _attention(root)
    assert (finding.fix_safety == "safe") is safe, finding.reason
    if not safe:
        return
    patched = tmp_path / "patched"
    patched.mkdir()
    (patched / "script.py").write_text(result.files[0].fixed)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    outputs = []
    for folder in (root, patched):
        sys.path.insert(0, str(folder))
        try:
            torch.manual_seed(0)
            script = importlib.import_module("script")
            script.model.double()
            outputs.append(script.run(x))
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("script", None)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-10, rtol=1e-10)


def test_a_module_level_instance_another_file_may_import_proves_nothing(tmp_path):
    root = _tree(tmp_path, {"script.py": SCRIPT.format(mask="torch.randn(1, 1, 8, 8)"),
                            "other.py": "from script import model\n"})
    assert _attention(root)[0].fix_safety == "unsafe"


def test_blocks_in_a_module_list_called_in_a_loop(tmp_path):
    source = MODULES.format(mask="(ids == self.pad).view(b, 1, 1, n) * -8.0").replace(
        "        self.block = Block(dim, heads)",
        "        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(2)])").replace(
        "        return self.plain(self.block(self.embed(ids), padding))",
        "        x = self.embed(ids)\n        for i, block in enumerate(self.blocks):\n"
        "            x = block(x, padding)\n        return self.plain(x)")
    root = _tree(tmp_path, {"modules.py": source})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    _assert_parity(tmp_path, root, result, "modules")
    stored = source.replace("            x = block(x, padding)", "            x = block(x, padding)\n"
                            "            self.last = block")
    assert _unproved_mask(_attention(_tree(tmp_path / "stored", {"modules.py": stored}))[0])


def test_a_package_that_re_exports_the_function_proves_nothing(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "from .attn import attend\n", "pkg/attn.py": ATTEND,
                            "model.py": MODEL.format(module="pkg.attn", mask="keep.view(b, 1, 1, n)", scale="0.25")})
    assert _attention(root)[0].fix_safety == "unsafe"  # `from pkg import attend` elsewhere would not be seen
    (root / "pkg" / "__init__.py").write_text("")
    assert _attention(root)[0].fix_safety == "safe"  # the caller imports it from its module, relative or not
    (root / "pkg" / "__init__.py").write_text("from .attn import *\n")  # never names it (a fifth breaker's)
    assert _attention(root)[0].fix_safety == "unsafe"


@pytest.mark.parametrize("statement", [
    "model.register_forward_pre_hook(lambda m, args: args)",
    "torch.nn.modules.module.register_module_forward_pre_hook(print)",
])
def test_a_forward_pre_hook_may_change_the_arguments(tmp_path, statement):
    source = SCRIPT.format(mask="torch.rand(1, 1, 8, 8) > 0.5").replace("model.eval()", statement)
    assert _attention(_tree(tmp_path, {"script.py": source}))[0].fix_safety == "unsafe"


# a helper registering hooks on every module by a name it computes, where the text never spells a pre-hook (breaker
# round 15: its kwargs pre-hook made the caller's -5 padding -1e9, and the gradients of padded samples 2.25 apart)
COMPUTED_REGISTRATIONS = {
    "methodcaller": 'operator.methodcaller("register_forward_" + kind + "hook", print, with_kwargs=True)(module)',
    "formatted": 'operator.methodcaller("register_forward_%shook" % kind, print)(module)',
    "getattr_f_string": 'getattr(module, f"register_forward_{kind}hook")(print)',
}


@pytest.mark.parametrize("spelling", sorted(COMPUTED_REGISTRATIONS))
def test_a_forward_pre_hook_registered_by_a_computed_name_elsewhere_may_change_the_arguments(tmp_path, spelling):
    hooks = ("import operator\n\n\ndef install(net, kind='pre_'):\n    for module in net.modules():\n"
             f"        {COMPUTED_REGISTRATIONS[spelling]}\n")
    source = SCRIPT.format(mask="torch.rand(1, 1, 8, 8) > 0.5")
    assert _attention(_tree(tmp_path / "alone", {"script.py": source, "hooks.py": "import operator\n"}))[0] \
        .fix_safety == "safe"
    assert _attention(_tree(tmp_path / "hooked", {"script.py": source, "hooks.py": hooks}))[0].fix_safety == "unsafe"


CALL_OVERRIDES = {  # what runs between a module call and forward, which may hand forward another mask (round 14)
    "own_call": ("modules.py", "class Attention(nn.Module):\n",
                 "class Attention(nn.Module):\n    def __call__(self, x, mask=None):\n"
                 "        return super().__call__(x, None if mask is None else (1.0 - mask) * -1e9)\n\n"),
    "base_elsewhere": ("base.py", "class Attention(nn.Module):\n", "from base import Base\n\n\n"
                       "class Attention(Base):\n"),
    "pre_hook_table": ("modules.py", "        self.heads = heads\n",
                       "        self.heads = heads\n        self._forward_pre_hooks[0] = lambda m, a: a\n"),
}
BASE_WITH_CALL = "from torch import nn\n\n\nclass Base(nn.Module):\n    _call_impl = nn.Module._call_impl\n"


@pytest.mark.parametrize("kind", sorted(CALL_OVERRIDES))
def test_a_module_call_that_may_not_hand_forward_what_it_shows_proves_nothing(tmp_path, kind):
    """A `__call__` of the class (or of a class it derives from, in any file), or a write into its pre-hook table,
    runs before forward: breaker round 14's `__call__` turned the parent's 0/1 keep mask into an additive one, and
    the mask proved small from the call was not (grad 41)."""
    _, old, new = CALL_OVERRIDES[kind]
    files = {"modules.py": MODULES.format(mask="torch.zeros(b, 1, 1, n)").replace(old, new, 1),
             "base.py": BASE_WITH_CALL}
    finding, _ = _attention(_tree(tmp_path, files))
    assert "fully-masked-rows" not in _names(finding, "from_call_sites")
    files["base.py"] = BASE_WITH_CALL.replace("_call_impl = nn.Module._call_impl", "pass")
    if kind == "base_elsewhere":  # the same tree with a base that runs nothing of its own proves it
        finding, _ = _attention(_tree(tmp_path / "plain", files))
        assert "fully-masked-rows" in _names(finding, "from_call_sites")


@pytest.mark.parametrize("mask, proved", [
    ("(ids * -1e4).masked_fill(keep, -5.0).masked_fill(~keep, 0.0).view(b, 1, 1, n)", True),
    ("(ids * -1e4).masked_fill(ids != 0, -5.0).masked_fill(ids == 0, 0.0).view(b, 1, 1, n)", True),
    ("(ids * -1e4).masked_fill(keep, -5.0).view(b, 1, 1, n)", False),  # one fill: the rest is the tensor's
    ("(ids * -1e4).masked_fill(keep, -5.0).masked_fill(keep, 0.0).view(b, 1, 1, n)", False),  # not complements
])
def test_two_fills_of_complementary_masks_bound_every_value(tmp_path, mask, proved):
    """Swin's shifted-window mask, `m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)`: every element is one
    fill or the other, whatever the tensor held, so its values are the fills' (a small pair swallows no row)."""
    root = _tree(tmp_path, {"attn.py": ATTEND, "model.py": MODEL.format(module="attn", mask=mask, scale="0.25")})
    finding, result = _attention(root)
    assert ("fully-masked-rows" in _names(finding, "from_call_sites")) is proved, finding.reason
    if proved:
        _assert_parity(tmp_path, root, result, "model")


# -- a causal additive mask passed in: key 0 of every row is 0, so no fill swallows a row --------------------------
CAUSAL_BUFFER = '        self.register_buffer("causal", torch.full((8, 8), float("-inf")).triu(1), persistent=False)\n'


@pytest.mark.parametrize("mask", [
    'torch.full((n, n), float("-inf")).triu(1)',
    "torch.zeros(n, n).masked_fill(torch.tril(torch.ones(n, n)) == 0, -1e9)",
    'torch.where(torch.tril(torch.ones(n, n)).bool(), 0.0, float("-inf"))[None, None]',
])
def test_a_causal_additive_mask_from_every_call_site_proves_no_row_is_swallowed(tmp_path, mask):
    model = MODEL.format(module="attn", mask=mask, scale="0.25").replace(
        "        self.embed = nn.Embedding(20, dim)\n", "        self.embed = nn.Embedding(20, dim)\n" + CAUSAL_BUFFER)
    root = _tree(tmp_path, {"attn.py": ATTEND, "model.py": model})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert "fully-masked-rows" in _names(finding, "from_call_sites")
    assert "causal additive mask" in next(f["why"] for f in finding.extra["facts"]["from_call_sites"]
                                          if f["name"] == "fully-masked-rows")
    _assert_parity(tmp_path, root, result, "model")
    _assert_gradient_parity(tmp_path / "patched", root, "model")


@pytest.mark.parametrize("mask, attend", [
    ('torch.full((n, n), float("-inf")).triu(0)', ATTEND),  # the diagonal masked too: row 0 masks every key
    ('torch.full((n, n), float("-inf")).tril(-1)', ATTEND),  # key 0 masked below the first row
    ('torch.full((n, n), float("-inf")).triu(1)', ATTEND.replace("+ mask", "+ mask.roll(1, -1)")),  # columns moved
    ('torch.full((n, n + 1), float("-inf")).triu(1)', ATTEND),  # not a square: its own extent
    ("(~keep).to(torch.uint8).view(b, 1, 1, n) * -10", ATTEND),  # uint8 wraps: * -10 is 246 (breaker 11, bug 11)
    ("(~keep).byte().view(b, 1, 1, n) * -10", ATTEND),
    # a buffer built causal, handed to a function of another module, which may keep it and write it later: what it
    # does with it is not followed (static/attribute_escapes.py)
    ("self.causal[:n, :n]", ATTEND),
])
def test_a_mask_that_may_mask_a_whole_row_or_is_read_through_columns_proves_nothing(tmp_path, mask, attend):
    model = MODEL.format(module="attn", mask=mask, scale="0.25").replace(
        "        self.embed = nn.Embedding(20, dim)\n", "        self.embed = nn.Embedding(20, dim)\n" + CAUSAL_BUFFER)
    root = _tree(tmp_path, {"attn.py": attend, "model.py": model})
    finding, _ = _attention(root)
    assert "fully-masked-rows" in _names(finding, "assumed") and finding.fix_safety == "unsafe"


# the reference Llama: `mask = None`, then, for more than one token, -inf above the diagonal beside a block of zeros
# for the cached keys, passed through each block to the attention, which adds it under `if mask is not None:`
LLAMA = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(q)
        return torch.matmul(scores, v).transpose(1, 2).reshape(b, n, -1)


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.attention = Attention(dim)

    def forward(self, x, mask):
        return x + self.attention(x, mask)


class Model(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.embed = nn.Embedding(20, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(2)])

    def forward(self, ids, start_pos=0):
        n = ids.shape[1]
        h = self.embed(ids)
        mask = None
        if n > 1:
            mask = torch.full((n, n), float("-inf"), device=ids.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((n, start_pos), device=ids.device), mask]).type_as(h)
        for layer in self.layers:
            h = layer(h, mask)
        return h
'''


@pytest.mark.parametrize("built, proved", [
    ("torch.hstack([torch.zeros((n, start_pos), device=ids.device), mask])", True),
    ("torch.cat([torch.zeros(n, start_pos), mask], dim=-1)", True),
    ("torch.cat([torch.zeros(n, start_pos), mask], dim=0)", False),  # joined along the queries
    ('torch.hstack([torch.full((n, start_pos), float("-inf")), mask])', False),  # the cached keys masked too
    ("torch.hstack([torch.zeros((n, start_pos)), mask.flip(-1)])", False),  # the causal part reordered
])
def test_the_reference_llama_mask_beside_cached_keys_proves_no_row_is_swallowed(tmp_path, built, proved):
    source = LLAMA.replace("torch.hstack([torch.zeros((n, start_pos), device=ids.device), mask])", built)
    root = _tree(tmp_path, {"llama.py": source})
    finding, result = _attention(root)
    assert ("fully-masked-rows" in _names(finding, "from_call_sites")) is proved, finding.reason
    if not proved:
        assert "fully-masked-rows" in _unproved(finding)
        return
    assert finding.fix_safety == "safe", finding.reason
    line = source.splitlines().index("            h = layer(h, mask)") + 1  # through Block's call of its attention
    assert _sites(finding, "fully-masked-rows") == [f"{root / 'llama.py'}:{line}"]
    assert "precision" in _names(finding, "accepted")  # `scores.float()`: float64 rounds through float32
    _assert_parity(tmp_path, root, result, "llama", fp64=1e-6)
    _assert_gradient_parity(tmp_path / "patched", root, "llama", tolerance=1e-6)


def _assert_gradient_parity(patched: Path, root: Path, module: str, tolerance: float = 1e-10) -> None:
    """Float64 gradients of every parameter, the original's against the patch's, on the same weights."""
    grads = []
    for folder in (root, patched):
        sys.path.insert(0, str(folder))
        try:
            torch.manual_seed(0)
            model = importlib.import_module(module).Model().double()
            model(_padded_ids()).square().sum().backward()
            grads.append({name: p.grad for name, p in model.named_parameters()})
        finally:
            sys.path.remove(str(folder))
            for name in [n for n in sys.modules if n in ("attn", "model", "modules", "llama")]:
                del sys.modules[name]
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=tolerance, rtol=tolerance, msg=name)


# -- generated call sites: every safe patch must compute what the original computes --------------------------
BASES = ["(ids == self.pad)", "(ids != self.pad)", "torch.zeros(b, n)", "torch.rand(b, n)", "torch.randn(b, n)"]
SHAPES = [".view(b, 1, 1, n)", "[:, None, None, :]", ".view(b, n)", ".view(b, 1, n)", ".view(1, b, 1, 1, n)",
          ".reshape(b, 1, 1, n).expand(b, 1, n, n)"]
SCALES = ["", " * -8.0", " * -10.0", " * 3.0", " * -100.0", " * -1e4", " * torch.finfo(torch.float32).min"]
CASTS = ["", ".float()", ".long()", ".bool()"]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(base=st.sampled_from(BASES), shape=st.sampled_from(SHAPES), cast=st.sampled_from(CASTS),
       scale=st.sampled_from(SCALES))
def test_generated_call_sites_keep_every_safe_patch_exact(tmp_path_factory, base, shape, cast, scale):
    tmp_path = tmp_path_factory.mktemp("generated")
    mask = f"({base}{cast}{shape}){scale}"
    root = _tree(tmp_path, {"modules.py": MODULES.format(mask=mask)})
    finding, result = _attention(root)
    if finding.fix_safety != "safe":
        return
    try:
        _run(root, "modules", _padded_ids(), torch.float64)
    except RuntimeError:  # the original raises on these shapes: so must the patch
        with pytest.raises(RuntimeError):
            _assert_parity(tmp_path, root, result, "modules")
        return
    _assert_parity(tmp_path, root, result, "modules")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(alphabet="attend_x2é\u0301 .(#\n", max_size=30), min_size=1, max_size=4),
       word=st.sampled_from(["attend", "attend_x", "x2", "é", "e\u0301"]))
def test_the_files_mentioning_a_name_are_those_its_word_boundary_pattern_finds(tmp_path, texts, word):
    """The tree's index of each file's words answers `mentioning` as the regex `\\bname\\b` over every file did
    (names with combining marks, which are not `\\w`, included), and notes every file as read."""
    import re

    from advisor.static.call_sites import Tree

    paths = []
    for index, text in enumerate(texts):
        path = tmp_path / f"m{index}.py"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    tree = Tree(paths)
    read = tree.recording()
    expected = [p for p, text in zip(paths, texts) if re.search(rf"\b{re.escape(word)}\b", text)]
    assert tree.mentioning(word) == expected
    assert tree.mentioning(word) == expected  # asked again, from the index
    assert len(read) == len(paths)


# -- OpenAI Whisper: the decoder's -inf buffer reaches qkv_attention through two calls and is sliced there -----------
WHISPER = Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "positive" / \
    "20_whisper_split_scale_prepermuted.py"


@pytest.mark.parametrize("sliced, proved", [
    ("mask[:n_ctx, :n_ctx]", True),  # any rows, columns from 0: each row keeps key 0
    ("mask[1:n_ctx + 1, :n_ctx]", True),
    ("mask[:n_ctx, 1:n_ctx + 1]", False),  # key 0 dropped: row 0 of the slice masks every key
    ("mask[:n_ctx, :n_ctx].flip(0)", False),  # rows reordered: read as values, which are not small
])
def test_whisper_buffer_through_two_calls_and_a_slice(tmp_path, sliced, proved):
    source = WHISPER.read_text(encoding="utf-8").replace("mask[:n_ctx, :n_ctx]", sliced)
    root = _tree(tmp_path, {"whisper.py": source})
    finding, result = _attention(root)
    assert ("fully-masked-rows" in _names(finding, "from_call_sites")) is proved, finding.reason
    if not proved:  # SDPA only where the mask is None (guarded by its absence)
        assert "fully-masked-rows" in _unproved(finding)
        return
    assert finding.fix_safety == "safe", finding.reason
    fixed = result.files[0].fixed
    outputs = []
    for index, code in enumerate((source, fixed)):
        module = load_module_from_source(code, f"whisper_{index}")
        torch.manual_seed(0)
        model, (x,) = module.make()
        model = model.double()
        x = x.double().requires_grad_()
        out = model(x)
        outputs.append((out, *torch.autograd.grad(out.square().sum(), [x, *model.parameters()])))
    for got, want in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # float64 through the block's float32 softmax


# -- torch's own causal builder -------------------------------------------------------------------------------
TRANSFORMER_MASK = '''
import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d_model=16, nhead=2):
        super().__init__()
        self.nhead = nhead
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, src_mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.nhead, -1).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        s = s + src_mask
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.layer = Attention()

    def forward(self, ids):
        src_mask = {builder}(ids.size(1))
        return self.layer(self.embed(ids), src_mask)
'''


@pytest.mark.parametrize("builder, proved", [
    ("nn.Transformer.generate_square_subsequent_mask", True),
    ("torch.nn.Transformer.generate_square_subsequent_mask", True),
    ("nn.Transformer.generate_subsequent_mask", False),  # no such builder of torch's: nothing known of it
])
def test_torchs_causal_mask_builder_keeps_a_key_in_every_row(tmp_path, builder, proved):
    """The PyTorch tutorial's `nn.Transformer.generate_square_subsequent_mask(n)` (-inf above the diagonal, 0 on
    and below it) passed by every caller: no row is fully masked, proved from the call sites (a reach round's
    p119: assumed before)."""
    root = _tree(tmp_path, {"model.py": TRANSFORMER_MASK.replace("{builder}", builder)})
    finding, result = _attention(root)
    assert ("fully-masked-rows" in _names(finding, "from_call_sites")) == proved, finding.extra["facts"]
    if proved:
        assert finding.fix_safety == "safe", finding.extra["facts"]
        _assert_parity(tmp_path, root, result, "model")


def test_a_keyword_named_as_a_positional_only_parameter_binds_nothing_to_it():
    """Breaker round 31: `attend(q, k, v, pad, mask=small)` with `def attend(q, k, v, mask, /, **options)` binds
    `pad` to the mask (`mask=small` goes to `options`); the call-site fact read `small`."""
    import libcst as cst

    from advisor.static.call_sites import bound_argument
    from advisor.static.module_index import ParsedModule

    caller = ParsedModule("", "caller.py")  # the calls spread nothing: the caller's file is never read
    function = cst.parse_module("def attend(q, k, v, mask, /, **options):\n    pass\n").body[0]
    call = cst.parse_expression("attend(q, k, v, pad, mask=small)")
    bound, default = bound_argument(function, call, "mask", skip_self=False, caller=caller)
    assert (cst.Module([]).code_for_node(bound), default) == ("pad", False)
    keyword = cst.parse_expression("attend(q, k, v, mask=small)")
    assert bound_argument(function, keyword, "mask", skip_self=False, caller=caller) is False  # TypeError/**kwargs


# -- open_clip: a bool mask converted in the block, a float causal buffer built by a helper method ------------------
OPEN_CLIP = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.in_proj_weight = nn.Parameter(torch.randn(dim * 3, dim) * self.scale)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None):
        L, N, C = x.shape
        q, k, v = F.linear(x, self.in_proj_weight).chunk(3, dim=-1)
        q = q.contiguous().view(L, N * self.heads, -1).transpose(0, 1)
        k = k.contiguous().view(L, N * self.heads, -1).transpose(0, 1)
        v = v.contiguous().view(L, N * self.heads, -1).transpose(0, 1)
        attn = torch.bmm(q * self.scale, k.transpose(-1, -2))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                new_attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype)
                new_attn_mask.masked_fill_(attn_mask, float("-inf"))
                attn_mask = new_attn_mask
            attn += attn_mask
        attn = attn.softmax(dim=-1)
        x = torch.bmm(attn, v).transpose(0, 1).reshape(L, N, C)
        return self.out_proj(x)


class Model(nn.Module):
    def __init__(self, dim=16, heads=2, n=6):
        super().__init__()
        self.attn = Attention(dim, heads)
        self.register_buffer("attn_mask", self.build_attention_mask(n), persistent=False)

    def build_attention_mask(self, n):
        mask = torch.empty(n, n)
        mask.fill_(float("-inf"))
        mask.triu_(1)
        return mask

    def forward(self, ids):
        x = torch.nn.functional.one_hot(ids % 16, 16).to(self.attn.in_proj_weight.dtype).permute(1, 0, 2)
        return self.attn(x, attn_mask=self.attn_mask).permute(1, 0, 2)


def init(model):
    nn.init.normal_(model.attn.in_proj_weight, std=0.02)
'''


def test_a_bool_conversion_the_calls_never_take_leaves_a_float_causal_buffer_proved(tmp_path):
    """open_clip's Attention converts a bool mask to an additive one under `if attn_mask.dtype == torch.bool:`; its
    only caller passes a float causal buffer a helper method builds in place (`empty`, `fill_(-inf)`, `triu_(1)`):
    the conversion is never taken, and every row keeps key 0."""
    root = _tree(tmp_path, {"modules.py": OPEN_CLIP})
    finding, result = _attention(root)
    assert finding.fix_safety == "safe", finding.reason
    assert "fully-masked-rows" in _names(finding, "from_call_sites")
    _assert_parity(tmp_path, root, result, "modules")


@pytest.mark.parametrize("old, new", [
    ("mask = torch.empty(n, n)", "mask = torch.empty(n, n, dtype=torch.bool)"),  # a bool buffer: converted
    ("mask = torch.empty(n, n)", "mask = torch.empty(n, n).bool()"),
    ("        mask.triu_(1)\n", "        mask.triu_(1)\n        mask = mask > 0\n"),  # rebound to a comparison
    ("                attn_mask = new_attn_mask\n", "                attn_mask = new_attn_mask\n"
     "            else:\n                attn_mask = attn_mask * 1e4\n"),  # another conversion on the other path
])
def test_a_conversion_a_call_may_take_proves_nothing(tmp_path, old, new):
    source = OPEN_CLIP.replace(old, new)
    assert source != OPEN_CLIP
    root = _tree(tmp_path, {"modules.py": source})
    finding, _ = _attention(root)
    assert "fully-masked-rows" not in _names(finding, "from_call_sites"), finding.extra["facts"]
