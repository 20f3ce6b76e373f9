"""Fourth outside check: 49 attention modules written the way public projects write them
(`fixtures/attention/public4/`), run through the CLI as a user would.

Per module: `advisor scan --format json` gives the outcome (safe / unsafe / refused), compared with the
judgement in JUDGEMENTS (what a sound tool should do). `advisor fix --apply` on a copy gives the safe patches:
each patched module must match the original (outputs, input and parameter gradients in fp32 at 1e-5 and fp64 at
1e-10, outputs in bf16 at 1e-2, the fixture's own `workload` -- hooks, gradient penalties, KV-cache steps --
and the same randomness). `fix --apply --unsafe-fixes` on another copy gives the unsafe patches: each must run,
and match, on inputs where the facts it names hold (`build_unpadded()`: no fully masked row). Known shortfalls
are strict xfails named MISS (a sound rewrite not offered), UNSOUND (a wrong patch) or BROKEN (a crash).

Fixture contract: `build()` -> (module, inputs) (masks include a fully padded sample where the module takes
masks); optional `build_unpadded()` (same module, no fully masked row); optional `workload(module, *inputs)`
(how the file itself uses the module; compared instead of a plain call); optional `STOCHASTIC = True` (the
module's forward is random as built: the two sides must agree on being random, values are compared only when
the original is deterministic).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from advisor.static.outside_writes import outside_writes_of_source
from advisor.static.project import MAY_SCRIPT
from advisor.static.state_swaps import MAY_SWAP
from cli_processes import results_of, start_in_one_process

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "attention" / "public4"

SAFE, UNSAFE, REFUSED = "safe", "unsafe", "refused"

# name -> (judgement, why). Judged from the code alone, before running advisor.
JUDGEMENTS = {
    "p01_fairseq_mha": (UNSAFE, "weights returned when need_weights (the default): ADV102 at best"),
    "p02_esm_rotary_mha": (SAFE, "rotary q/k, folded heads, -inf key padding (NaN->0 accepted); "
                                 "`x.type_as(x)` is the identity"),
    "p03_xtransformers_attend": (REFUSED, "pre/post-softmax intermediates are returned"),
    "p04_lucid_einsum_mask": (SAFE, "finite fill under `if`: its fully masked rows made uniform, as the original"),
    "p05_lucid_causal_triu": (SAFE, "triu(j - i + 1) with i == j (q and k from one x): every row keeps key 0"),
    "p06_audiocraft_streaming_mha": (SAFE, "constant layout strings; additive 0/-inf mask from a helper, under "
                                     "`if m is not None:`: guarded by its absence"),
    "p07_hybrid_ssm_shared_attn": (SAFE, "nanoGPT causal block shared across layers in a loop"),
    "p08_diffusers_attnprocessor": (REFUSED, "probabilities come from a method called on another object"),
    "p09_diffusers_crossattention_attention": (SAFE, "q/k upcast to fp32 while v keeps its dtype: qkv-dtype "
                                               "guarded; mask under `if m is not None:`: by its absence"),
    "p10_hf_gpt_neox_attn": (REFUSED, "tensor alpha, head mask, weights returned"),
    "p11_megatron_neox_baddbmm": (SAFE, "baddbmm(beta=0) of an empty buffer, causal mask filled in place with "
                                        "-10000 by a helper (no fully masked row), folded heads"),
    "p12_mpt_alibi_function": (UNSAFE, "ALiBi bias and masks as attn_mask; weights returned when needs_weights"),
    "p13_bloom_alibi_baddbmm": (REFUSED, "head mask multiplies the probabilities"),
    "p14_gemma2_softcap": (REFUSED, "tanh soft-capping of the logits"),
    "p15_sam_decomposed_relpos": (SAFE, "decomposed rel-pos added by a helper (SDPA without it is wrong) only under "
                                        "`if self.use_rel_pos:`: SDPA where the flag is off, the original where on"),
    "p16_timm_eva_attention": (SAFE, "mask parameter of unknown rank `[:, None, None, :]`, checked as passed: "
                                     "`attn_mask.to(torch.bool)` keeps it"),
    "p17_perceiver_cross_attention": (SAFE, "finite fill under `if`: its fully masked rows made uniform, as the original"),
    "p18_qformer_cross_attention": (REFUSED, "probabilities saved and hooked; head mask"),
    "p19_hf_detr_attention": (SAFE, "additive mask from the caller under `if m is not None:`: guarded by its "
                              "absence; weights returned only when output_attentions"),
    "p20_local_band_buffer": (SAFE, "bool band buffer sliced [:T, :T]; the diagonal is always kept"),
    "p21_sliding_window_causal": (SAFE, "tril & ~tril(-w) built in forward; fp32 softmax upcast accepted"),
    "p22_gpt2_past_bottom_right": (SAFE, "`w * b - 1e4 * (1 - b)` with a 0/1 tril buffer sliced bottom-right"),
    "p23_llama_kv_cache_decode": (SAFE, "additive mask from the caller (rank/dtype unknown) under "
                                  "`if m is not None:`: guarded by its absence"),
    "p24_prefix_lm_data_write": (SAFE, "bool mask from the buffer; NOT is_causal: the file opens a prefix via .data"),
    "p25_mc_dropout_eval": (SAFE, "dropout_p must follow the dropout module's own mode (MC dropout)"),
    "p26_dropout_schedule": (SAFE, "dropout_p must be read from the module at call time"),
    "p27_jit_annotated_transformer": (UNSAFE, "mask parameter (rank unknown), finite fill on fully masked rows"),
    "p28_jit_scripted_scale": (SAFE, "float-annotated scale, no mask; the patch must still compile"),
    "p29_sagan_gradient_penalty": (SAFE, "gradient penalty through 3-D (bmm) attention: SDPA takes the math "
                                         "path for 3-D inputs, which is twice differentiable"),
    "p30_rwkv_time_mix": (REFUSED, "a recurrence, not softmax attention"),
    "p31_vit_attention_map_hook": (SAFE, "the file hooks attn_drop to read the maps: no-hooks is checked when "
                                         "the block runs, so the hooked call runs the original and saves them"),
    "p32_global_softmax_hook": (SAFE, "the file registers a global module hook: no-hooks is checked when the "
                                      "block runs, so the recorded call runs the original softmax module"),
    "p33_falcon_multiquery": (SAFE, "one K/V head broadcast; -1e9 causal fill, no fully masked row"),
    "p34_deformable_detr_msda": (REFUSED, "softmax over learned weights and grid_sample: no QK^T"),
    "p35_chunked_prefill_bottom_right": (SAFE, "v = cat(past_value, new): q/k/v dtypes checked at run time, and the "
                                               "bottom-right slice's rank by the query's (`query.dim() >= 4`)"),
    "p36_vit_critic_r1_penalty": (UNSAFE, "R1 penalty (create_graph=True) through 4-D attention: SDPA's fused CPU "
                                          "kernel has no double backward"),
    "p37_dropout_stripped_for_export": (SAFE, "dropout replaced by nn.Identity: dropout_p must not read `.p`"),
    "p38_nanogpt_kv_cache_offset": (SAFE, "causal buffer sliced [pos:pos + T, :pos + T]: a bool mask, not is_causal"),
    "p39_learnable_temperature_setattr": (SAFE, "`setattr(m, 'scale', nn.Parameter(...))` in the file: the scale "
                                                "is guarded (`isinstance(self.scale, (int, float))`), so the "
                                                "Parameter runs the original block"),
    "p40_scripted_module_padding_mask": (SAFE, "-inf key padding (NaN->0 accepted) in a module the file scripts: "
                                               "the mask needs an Optional-free spelling"),
    "p41_global_temperature": (UNSAFE, "scale divided by a module-level global a setter rebinds: its type is "
                                       "not visible"),
    "p42_alibi_plus_causal_buffer": (UNSAFE, "ALiBi buffer plus -inf causal fill: one float attn_mask; the "
                                             "buffer's rank/values are not proved"),
    "p43_dropkey": (SAFE, "scores-shaped random mask built from the scores (`ones_like(attn)`), only under "
                          "`if self.training:`: SDPA in eval, the original in training"),
    "p44_float_zero_bias": (UNSAFE, "additive bias of unknown rank; it is the float 0.0 on the default call"),
    "p45_softmax_swapped_via_modules_dict": (SAFE, "`model._modules[name] = QuietSoftmax(...)` replaces the "
                                                   "softmax: the patch checks the module's exact class (and dim) "
                                                   "when it runs, so the replacement runs the original block"),
    "p46_softmax_swapped_via_add_module": (SAFE, "`model.add_module(name, QuietSoftmax(...))` replaces the "
                                                 "softmax: checked as in p45"),
    "p47_pinn_hessian_through_attention": (UNSAFE, "hessian(create_graph=True) through 4-D attention: double "
                                                   "backward of SDPA's fused CPU kernel is not implemented"),
    "p48_functional_causal_device_of_scores": (SAFE, "float-annotated scale; causal mask on `sim.device` (q's)"),
    "p49_functional_causal_inline_mask": (SAFE, "as p48 with the mask inline in the guarded masked_fill"),
}

# Known shortfalls, by test: strict xfails.
OUTCOME_XFAIL = {
    "p01_fairseq_mha": "MISS: refused (ADV103): the weights pass through FairseqDropout, a module whose forward "
                       "branches (`if self.p > 0 and (self.training or self.apply_during_inference)`), which is not "
                       "read as dropout; the `if need_weights:` return and the `assert list(attn_weights.size())` "
                       "are proved (with `F.dropout` in its place the block is a safe patch behind `if not "
                       "need_weights:`, tests/static/test_attention_on_request.py)",
    "p11_megatron_neox_baddbmm": "MISS: refused with a reason (the scores are masked in place through a parameter "
                                 "of `attention_mask_func`, not followed back to the call; behind it, "
                                 "`view(*output_size)` unfolds the heads folded into the batch for the 4-D mask and "
                                 "softmax, and the weights are folded again for `bmm`: no role reads that yet)",
}
PATCH_XFAIL = {
}

NAMES = sorted(p.stem for p in FIXTURES.glob("p*.py"))
TREE_WIDE_WORDS = ("register_module_", "create_graph", "hessian", "jvp", "jacfwd", "forward_ad", "setattr(",
                   "_modules[", "add_module(", "_hook(")
ATTENTION_RULES = ("ADV101", "ADV102")


def _reaches_other_files(text: str) -> bool:
    """Whether a fixture says something of every file of a scan: a tree-wide word, an attribute it writes on
    another object (`m.bias.data[..., :p] = 1` is read as a write of every scanned class's `bias`), TorchScript's
    compiler (any scanned function may be compiled) or a call that swaps modules' buffers by name."""
    return any(word in text for word in TREE_WIDE_WORDS) or any(outside_writes_of_source(text)) or \
        MAY_SCRIPT.search(text) is not None or MAY_SWAP.search(text) is not None


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """One scan and two fix runs over copies of the whole folder, as a user runs them (the three side by side)."""
    root = tmp_path_factory.mktemp("public4")
    copies = {kind: root / kind for kind in ("original", "safe", "unsafe")}
    for folder in copies.values():
        shutil.copytree(FIXTURES, folder)
    # Each fixture is its own program: one that registers hooks (p31, p32), asks for double backward or
    # forward AD (p36, p47) or writes attributes of other objects (p24's buffer, p45's computed names) would reach
    # every file of a shared scan (as it should in one program: the no-hooks, first-order-autograd and identity facts
    # hold for the whole scanned tree), so it is scanned and fixed on its own: each group is a command line of its
    # own, the groups of one kind run in turn in one process (one torch import, not one a group).
    alone = {name for name in NAMES if _reaches_other_files((FIXTURES / f"{name}.py").read_text())}
    groups = [[name for name in NAMES if name not in alone]] + [[name] for name in sorted(alone)]

    def files(kind: str, group: list[str]) -> list[str]:
        return [str(copies[kind] / f"{name}.py") for name in group]

    env = {**os.environ, "XDG_CACHE_HOME": str(root / "xdg-cache")}  # a cold cache of its own, never ~/.cache
    runs = [start_in_one_process([["scan", *files("original", group), "--format", "json"] for group in groups],
                                 REPO, env),
            start_in_one_process([["fix", *files("safe", group), "--apply"] for group in groups], REPO, env),
            start_in_one_process([["fix", *files("unsafe", group), "--apply", "--unsafe-fixes"] for group in groups],
                                 REPO, env)]
    scans, *fixes = [results_of(run, timeout=600) for run in runs]
    for code, _, err in [*scans, *fixes[0], *fixes[1]]:
        assert code in (0, 1), err
    findings: dict[str, list] = {}
    for _, out, _ in scans:
        report = json.loads(out)
        assert report["errors"] == []
        for finding in report["findings"]:
            findings.setdefault(Path(finding["path"]).stem, []).append(finding)
    return copies, findings


def _outcome(findings: list) -> str:
    attention = [f for f in findings if f["rule"] in ATTENTION_RULES and f["fixable"]]
    if any(f["fix_safety"] == SAFE for f in attention):
        return SAFE
    return UNSAFE if attention else REFUSED


def _accepted(findings: list, fact_name: str) -> bool:
    return any(fact["name"] == fact_name for f in findings for fact in f.get("facts", {}).get("accepted", []))


# ---------------------------------------------------------------- running one side

def _load(path: Path, tag: str):
    spec = importlib.util.spec_from_file_location(f"public4_{tag}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cast(value, dtype, grad: bool):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            value = value.detach().to(dtype).clone()
            return value.requires_grad_(grad)
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype, grad) for v in value)
    return value


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [None] if value is None else []


def _pair(orig_module, patched_module, builder: str, dtype, seed: int = 0):
    """Both sides built alike; the patched module gets the original's state and the original's inputs."""
    torch.manual_seed(seed)
    model, inputs = getattr(orig_module, builder)()
    torch.manual_seed(seed)
    patched, _ = getattr(patched_module, builder)()
    patched.load_state_dict(model.state_dict())
    return model.to(dtype), patched.to(dtype), inputs


def _run(module, model, inputs, seed: int = 0, use_workload: bool = True):
    torch.manual_seed(seed)
    if use_workload and hasattr(module, "workload"):
        return module.workload(model, *inputs)
    return model(*inputs)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float, nan_ok: bool) -> str | None:
    if a is None or b is None:
        return None if a is b else f"one side is None ({a is None}, {b is None})"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    a, b = a.detach().double(), b.detach().double()
    nan = torch.isnan(a)
    if nan_ok:
        keep = ~nan.any(dim=-1, keepdim=True).expand_as(a) if a.dim() else ~nan
        a, b = a[keep], b[keep]
    elif not torch.equal(nan, torch.isnan(b)):
        return "NaN at other places"
    else:
        a, b = a[~nan], b[~nan]
    if a.numel() == 0:
        return None
    scale = max(1.0, a.abs().max().item())
    err = (a - b).abs().max().item()
    return None if err <= tol * scale else f"max abs error {err:.3g} > {tol:g} x {scale:.3g}"


def _compare(ref, got, tol: float, nan_ok: bool, what: str) -> list[str]:
    ref_t, got_t = _tensors(ref), _tensors(got)
    if len(ref_t) != len(got_t):
        return [f"{what}: {len(ref_t)} tensors vs {len(got_t)}"]
    problems = []
    for i, (a, b) in enumerate(zip(ref_t, got_t)):
        msg = _close(a, b, tol, nan_ok)
        if msg:
            problems.append(f"{what}[{i}]: {msg}")
    return problems


def _grads(model, inputs, out) -> dict:
    """Input and parameter gradients of a fixed weighted sum of the outputs (skipped when the workload already
    ran backward itself)."""
    if any(p.grad is not None for p in model.parameters()):
        return {n: p.grad for n, p in model.named_parameters()}
    outs = [t for t in _tensors(out) if t is not None and t.requires_grad]
    loss = sum((t * torch.cos(torch.arange(t.numel(), dtype=t.dtype).view(t.shape))).sum() for t in outs)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    grads.update({f"input{i}": t.grad for i, t in enumerate(_tensors(inputs)) if t is not None and t.requires_grad})
    return grads


def _randomness(module, model, inputs) -> tuple[bool, object]:
    first = _run(module, model, inputs, seed=1)
    second = _run(module, model, inputs, seed=2)
    return bool(_compare(first, second, 0.0, False, "")), first


def _parity_problems(orig_module, patched_module, nan_ok: bool, fp32_rounding_ok: bool) -> list[str]:
    """`nan_ok`: the finding accepted NaN -> 0 on fully masked rows. `fp32_rounding_ok`: it accepted dropping
    the original's fp32 softmax upcast, whose rounding the fp64 original carries (README: precision)."""
    problems = []
    fp64_tol = 1e-5 if fp32_rounding_ok else 1e-10
    builders = ["build"] + (["build_unpadded"] if hasattr(orig_module, "build_unpadded") else [])
    stochastic = getattr(orig_module, "STOCHASTIC", False)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, fp64_tol), (torch.bfloat16, 1e-2)):
        for builder in builders:
            model, patched, inputs = _pair(orig_module, patched_module, builder, dtype)
            grad = dtype != torch.bfloat16
            args_ref, args_new = _cast(inputs, dtype, grad), _cast(inputs, dtype, grad)
            where = f"{dtype} {builder}"
            if stochastic:
                random_ref, _ = _randomness(orig_module, model, args_ref)
                random_new, _ = _randomness(patched_module, patched, args_new)
                if random_ref != random_new:
                    problems.append(f"{where}: original random={random_ref}, patched random={random_new}")
                if random_ref:
                    continue
                model, patched, inputs = _pair(orig_module, patched_module, builder, dtype)
                args_ref, args_new = _cast(inputs, dtype, grad), _cast(inputs, dtype, grad)
            out_ref = _run(orig_module, model, args_ref)
            out_new = _run(patched_module, patched, args_new)
            problems += _compare(out_ref, out_new, tol, nan_ok, f"{where} outputs")
            if not grad:
                continue
            g_ref, g_new = _grads(model, args_ref, out_ref), _grads(patched, args_new, out_new)
            # an -inf fill gives NaN rows (and NaN gradients everywhere) in the original: gradients are
            # compared where the original's are finite, i.e. on build_unpadded for those modules
            for name in g_ref:
                a, b = g_ref[name], g_new.get(name)
                if a is not None and nan_ok and torch.isnan(a).any():
                    continue
                msg = _close(a, b, tol, False)
                if msg:
                    problems.append(f"{where} grad {name}: {msg}")
    return problems


def _run_patch(cli, name: str, kind: str) -> list[str]:
    copies, findings = cli
    original = copies["original"] / f"{name}.py"
    patched = copies[kind] / f"{name}.py"
    orig_module = _load(original, "orig")
    try:
        patched_module = _load(patched, kind)
    except Exception as exc:  # a patch that does not import (TorchScript compile, syntax) is BROKEN
        return [f"BROKEN: {kind} patch does not import: {exc!r}"[:400]]
    try:
        if kind == SAFE:
            found = findings.get(name, [])
            return _parity_problems(orig_module, patched_module, _accepted(found, "fully-masked-rows"),
                                    _accepted(found, "precision"))
        builder = next(b for b in ("build_facts_hold", "build_unpadded", "build") if hasattr(orig_module, b))
        model, patched_model, inputs = _pair(orig_module, patched_module, builder, torch.float32)
        out_ref = _run(orig_module, model, _cast(inputs, torch.float32, False), use_workload=False)
        out_new = _run(patched_module, patched_model, _cast(inputs, torch.float32, False), use_workload=False)
        # ADV102 puts None where the weights went: compare the tensors the patch still returns
        pairs = [(a, b) for a, b in zip(_tensors(out_ref), _tensors(out_new)) if b is not None]
        return _compare([a for a, _ in pairs], [b for _, b in pairs], 1e-5, False, "unsafe fp32 outputs")
    except Exception as exc:
        return [f"BROKEN: {kind} patch raised {exc!r}"[:400]]


def _xfail(table: dict, name: str):
    reason = table.get(name)
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name


def test_every_fixture_is_judged():
    assert sorted(JUDGEMENTS) == NAMES
    assert set(OUTCOME_XFAIL) <= set(NAMES) and set(PATCH_XFAIL) <= set(NAMES)


@pytest.mark.parametrize("name", [_xfail(OUTCOME_XFAIL, n) for n in NAMES])
def test_outcome_matches_judgement(cli, name):
    _, findings = cli
    judged, why = JUDGEMENTS[name]
    got = _outcome(findings.get(name, []))
    reasons = [f["reason"] for f in findings.get(name, []) if f["rule"].startswith("ADV1")]
    assert got == judged, f"judged {judged} ({why}); advisor: {got}: {reasons}"
    if judged == REFUSED and name not in ("p30_rwkv_time_mix", "p34_deformable_detr_msda"):
        assert reasons, "a refusal comes with a reason"


@pytest.mark.parametrize("name", [_xfail(PATCH_XFAIL, n) for n in NAMES])
def test_patches_hold(cli, name):
    """Safe patches: full parity. Unsafe patches: run and match where their facts hold. No patch: the file is
    left byte-identical."""
    copies, _ = cli
    original = (copies["original"] / f"{name}.py").read_bytes()
    problems = []
    safe_changed = (copies["safe"] / f"{name}.py").read_bytes() != original
    unsafe_changed = (copies["unsafe"] / f"{name}.py").read_bytes() != (copies["safe"] / f"{name}.py").read_bytes()
    if safe_changed:
        problems += _run_patch(cli, name, SAFE)
    if unsafe_changed:
        problems += _run_patch(cli, name, UNSAFE)
    assert not problems, "\n".join(problems)
