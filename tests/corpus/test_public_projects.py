"""advisor judged on attention code from public projects it was not written against.

Each file in fixtures/attention/public/ is a copy of one project's attention module (header: source, licence)
with a `build()` (and optionally `build_variants()`) returning `(module, example_inputs)`. The tool runs as a
user runs it: `advisor scan --format json` over the folder, then `advisor fix --apply` on a temporary copy.
What is asserted is the sound behaviour, differentially:

* a file that must not be rewritten (talking heads, learned temperature, linear attention, weights returned)
  gets no safe patch, and `fix --apply` leaves it byte-identical;
* every safe patch imports, runs and keeps the module's outputs and gradients on every build, in fp32, fp64,
  bf16 and CPU autocast (NaN where the original has NaN, except the one divergence the finding itself accepts:
  fully masked rows, NaN -> 0);
* an unsafe patch (`--unsafe-fixes`) matches the original on the builds where the facts it names hold;
* a file that is plainly rewritable gets a safe patch.

JUDGEMENTS is the record: what the tool should do with each file and why. (The bugs this check found, two
unsound patches, one miss and three misleading reasons, are fixed; a new one would be a failing test here.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC_DIR = REPO_ROOT / "fixtures" / "attention" / "public"
ATTENTION_RULES = ("ADV101", "ADV102", "ADV103")


@dataclass(frozen=True)
class Precision:
    """How a model is run for a parity check: parameter/input dtype, autocast, tolerance, gradients or not."""

    name: str
    dtype: torch.dtype
    tolerance: float
    autocast: bool = False
    grads: bool = True


# fp32 and bf16 as advisor optimize checks parity (1e-5, 1e-2; atol scaled by the largest magnitude); fp64 at a
# tolerance of its own class, so a patch that rounds a float64 model through float32 is caught; bf16 gradients
# and mixed precision (CPU autocast) differ by rounding order alone, so only their outputs are compared.
FP32 = Precision("float32", torch.float32, 1e-5)
FP64 = Precision("float64", torch.float64, 1e-10)
PRECISIONS = (FP32, FP64, Precision("bfloat16", torch.bfloat16, 1e-2, grads=False),
              Precision("autocast-bf16", torch.float32, 1e-2, autocast=True, grads=False))


@dataclass(frozen=True)
class Judgement:
    """What a sound, complete tool does with one file."""

    rewritable: bool
    why: str
    cause: str | None = None  # a regex the refusal/unsafe reason must match: it names what really blocks the rewrite


JUDGEMENTS: dict[str, Judgement] = {
    "vitpytorch_vit": Judgement(True, "einops heads, nn.Softmax/nn.Dropout modules, number scale"),
    "vitpytorch_cait": Judgement(
        False, "talking heads: heads mixed before and after the softmax", cause=r"head",
    ),
    "vitpytorch_lsa": Judgement(True, "the learned temperature (temperature.exp(), 0-d) folds into q; the diagonal "
                                      "keep-mask's one finite fill: its fully masked rows made uniform as the "
                                      "original's"),
    "vitpytorch_navit": Judgement(False, "finite-fill keep-masks can mask a whole row (mean of V, not SDPA's)"),
    "timm_attention": Judgement(True, "maybe_add_mask is an optional added mask and resolve_self_attn_mask reads "
                                      "only the scores' dtype and device: SDPA where the bias is None, the original "
                                      "otherwise (the note still says enabling `self.fused_attn` is simpler)"),
    "nanogpt_causal": Judgement(False, "the manual branch of `self.flash = hasattr(F, 'scaled_dot_product_attention')` "
                                       "runs only where torch has no SDPA (the other branch is the fix)",
                                cause=r"has no scaled_dot_product_attention"),
    "mingpt_causal": Judgement(True, "separate q/k/v Linears, causal `mask` buffer, -inf fill"),
    "xtransformers_attend": Judgement(False, "pre/post-softmax weights leave through Intermediates"),
    "hf_bert_legacy": Judgement(False, "weights returned with output_attentions, head mask, relative scores"),
    "hf_gpt2_legacy": Judgement(False, "weights returned, head mask, tensor scale (torch.full)",
                                cause=r"head_mask"),
    "hf_llama_eager": Judgement(False, "eager_attention_forward returns the weights", cause=r"used outside"),
    "hf_t5_eager": Judgement(False, "eager_attention_forward returns the weights", cause=r"used outside"),
    "hf_whisper_legacy": Judgement(False, "weights returned with output_attentions, layer head mask",
                                   cause=r"head_mask"),
    "ldm_crossattention": Judgement(False, "finite-fill keep-mask written in place can mask a whole row"),
    "ldm_crossattention_split": Judgement(True, "3-D einsum block in a helper method, k pre-scaled by its caller"),
    "ldm_spatial_selfattention": Judgement(
        True,
        "single-head channel-major attention: SDPA(q, k^T, v^T) with scale c**-0.5 (a size), output transposed; "
        "the weights transposed by einops.rearrange before a V-first einsum (once a MISS)",
    ),
    "ldm_linear_attention": Judgement(False, "linear attention: softmax over positions of k, K V^T first"),
    "swin_window_attention": Judgement(
        False, "pre-scaled q, relative position bias + 0/-100 window mask added: the added values are not visible, "
               "and a row they swallow (finfo.min padding) has other gradients in SDPA's fused kernel",
        cause=r"added mask",
    ),
    "dinov2_attention": Judgement(True, "q pre-scaled while unpacking qkv[0] * self.scale"),
    "dino_attention_returns_weights": Judgement(
        False, "forward returns (x, attn)", cause=r"used outside|returned",
    ),
    "openclip_attention": Judgement(False, "scaled-cosine branch: learned per-head temperature tensor"),
    "perceiver_attention": Judgement(False, "finite-fill keep-mask written in place can mask a whole row"),
    "guided_diffusion_qkv_legacy": Judgement(True, "channel-major einsum, q and k each scaled by ch**-0.25, "
                                                   "fp32 softmax upcast cast back"),
    "guided_diffusion_qkv": Judgement(True, "channel-major einsum on views, fp32 softmax upcast cast back"),
    "ddpm_attention": Judgement(True, "conv-style (b, h, d, n) einsum, q pre-scaled"),
    "ddpm_linear_attention": Judgement(False, "linear attention: softmax of q over features, of k over positions"),
    "sd2_crossattention": Judgement(False, "scores on two paths, q/k (not v) upcast to fp32 under a `with` block"),
    "maxvit_attention": Judgement(
        False, "nn.Sequential(Softmax, Dropout), q pre-scaled, embedding position bias added: its values are not "
               "visible, so a row it could swallow is not ruled out", cause=r"added mask",
    ),
    "annotated_transformer_attention": Judgement(
        False, "weights returned by attention() and stored in self.attn", cause=r"used outside|returned",
    ),
    "taming_attnblock": Judgement(True, "single-head channel-major bmm with permuted q and weights"),
    "beit_attention": Judgement(True, "its learned table is the mask; SDPA where the caller's rel_pos_bias (no visible "
                                      "rank or values) is None, the original where it is passed"),
    "vitpytorch_mobilevit": Judgement(True, "five-dimensional q/k/v (batch, patch, heads, tokens, dim)"),
    "espnet_multiheaded_attention": Judgement(False, "weights re-masked after the softmax and stored in self.attn"),
    "ngvideo_head": Judgement(True, "single-head 3-D causal attention, v projected between dropout and product"),
    "ngvideo_head_embd_scale": Judgement(True, "as ngvideo_head, scaled by the embedding width C**-0.5 (not the "
                                               "head size: SDPA's default scale would be wrong)"),
    "palm_mqa_attention": Judgement(True, "causal mask from a caching helper, one finite fill (a row it masks "
                                          "everywhere is made uniform as the original's); single K/V head; detached "
                                          "row max subtracted"),
}


# Unsafe-only files: the builds (index into build() + build_variants()) on which every fact the finding assumes
# holds (no query row fully masked, masks of 2+ dims in q's dtype). There the --unsafe-fixes patch must match the
# original; where the weights left the block (ADV102) only the attention output is compared.
FACTS_HOLD_ON: dict[str, tuple[int, ...]] = {
    "vitpytorch_navit": (1,),
    "ldm_crossattention": (0,),
    "perceiver_attention": (0, 1),
    "swin_window_attention": (0,),
    "maxvit_attention": (0,),
    "hf_llama_eager": (0,),
    "hf_t5_eager": (0,),
}

# ---------------------------------------------------------------------------------------------- running advisor


def _advisor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def findings_by_file() -> dict[str, list[dict[str, Any]]]:
    """One `scan --format json` over the folder: the attention findings of each file (by stem)."""
    proc = _advisor("scan", str(PUBLIC_DIR), "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["errors"] == []
    grouped: dict[str, list[dict[str, Any]]] = {stem: [] for stem in JUDGEMENTS}
    for finding in report["findings"]:
        if finding["rule"] in ATTENTION_RULES:
            grouped.setdefault(Path(finding["path"]).stem, []).append(finding)
    return grouped


@pytest.fixture(scope="module")
def patched_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the folder after `advisor fix --apply` (safe patches only, as a user gets them)."""
    target = tmp_path_factory.mktemp("public") / "public"
    shutil.copytree(PUBLIC_DIR, target)
    proc = _advisor("fix", str(target), "--apply")
    assert proc.returncode in (0, 1), proc.stderr
    return target



@pytest.fixture(scope="module")
def unsafe_patched_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unsafe-only files after `advisor fix --apply --unsafe-fixes`."""
    target = tmp_path_factory.mktemp("public_unsafe")
    for stem in FACTS_HOLD_ON:
        shutil.copy2(PUBLIC_DIR / f"{stem}.py", target / f"{stem}.py")
    proc = _advisor("fix", str(target), "--apply", "--unsafe-fixes")
    assert proc.returncode in (0, 1), proc.stderr
    return target

def _outcome(findings: list[dict[str, Any]]) -> str:
    if any(f["fix_safety"] == "safe" and f["patch"] for f in findings):
        return "safe patch"
    if any(f["patch"] for f in findings):
        return "unsafe only"
    return "refused" if findings else "no finding"


def _accepts(findings: list[dict[str, Any]], fact_name: str, safe_only: bool = True) -> bool:
    """Whether a finding with a patch states the divergence `fact_name` (fully-masked-rows, precision) as accepted."""
    return any(fact["name"] == fact_name
               for f in findings if f["patch"] and (f["fix_safety"] == "safe" or not safe_only) and f["facts"]
               for fact in f["facts"]["accepted"])


def _declared_precision(findings: list[dict[str, Any]], precision: Precision, safe_only: bool = True) -> Precision:
    """A float64 run of a block whose original rounds through float32 (`softmax(w.float())`) is compared at float32's
    tolerance when the finding states that divergence (the "precision" fact): the patch skips that rounding."""
    if precision is FP64 and _accepts(findings, "precision", safe_only):
        return replace(precision, tolerance=FP32.tolerance)
    return precision


# ---------------------------------------------------------------------------------------------- running models


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses under `from __future__ import annotations` look themselves up here
    spec.loader.exec_module(module)
    return module


def _builds(module: ModuleType) -> list[tuple[torch.nn.Module, tuple[Any, ...]]]:
    torch.manual_seed(0)
    builds = [module.build()]
    if hasattr(module, "build_variants"):
        builds += module.build_variants()
    return builds


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of an output, in order (tuples, lists, dataclasses such as x-transformers' Intermediates)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _tensors(getattr(value, name))


@dataclass
class Comparison:
    max_abs: float = 0.0
    nan_rows_made_finite: int = 0


def _compare(before: torch.Tensor, after: torch.Tensor, accepts_nan_to_finite: bool, tolerance: float, what: str,
             stats: Comparison) -> None:
    assert before.shape == after.shape and before.dtype == after.dtype, f"{what}: shape/dtype changed"
    nan_before, nan_after = torch.isnan(before), torch.isnan(after)
    assert not (nan_after & ~nan_before).any(), f"{what}: the patch produces NaN where the original is finite"
    made_finite = nan_before & ~nan_after
    if made_finite.any():
        assert accepts_nan_to_finite, f"{what}: NaN in the original is finite after, and no finding accepts it"
        stats.nan_rows_made_finite += int(made_finite.sum())
    both = ~nan_before & ~nan_after
    if both.any():
        a, b = before[both], after[both]
        atol = tolerance * max(1.0, float(a.abs().max()))
        diff = float((a - b).abs().max())
        stats.max_abs = max(stats.max_abs, diff)
        assert torch.allclose(a, b, rtol=tolerance, atol=atol), f"{what}: max abs difference {diff:.3g}"


def _run_with_grads(model: torch.nn.Module, inputs: tuple[Any, ...],
                    first_output_only: bool = False) -> tuple[list[torch.Tensor], list[Any]]:
    """Outputs, then gradients of a fixed random projection of every finite output w.r.t. params and inputs."""
    model.eval()
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
              for x in inputs]
    outputs = list(_tensors(model(*leaves)))[:1 if first_output_only else None]
    generator = torch.Generator().manual_seed(1)
    loss = sum((torch.randn(out.shape, generator=generator).to(out.dtype) * out.nan_to_num(0.0)).sum()
               for out in outputs if out.is_floating_point() and out.requires_grad)
    differentiable = [p for p in model.parameters()] + [x for x in leaves if isinstance(x, torch.Tensor)
                                                        and x.requires_grad]
    grads = torch.autograd.grad(loss, differentiable, allow_unused=True) if torch.is_tensor(loss) else []
    return [out.detach() for out in outputs], list(grads)


def _cast(inputs: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    """Floating tensors (activations, additive masks) in the model's dtype; bool/int masks as they are."""
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)


def _check_parity(stem: str, patched_file: Path, precision: Precision, accepts_nan_to_finite: bool,
                  only_builds: tuple[int, ...] | None = None, first_output_only: bool = False) -> Comparison:
    """Original vs patched on the builds in one precision: outputs, and gradients where the precision allows."""
    original = _load(PUBLIC_DIR / f"{stem}.py", f"public_original_{stem}")
    patched = _load(patched_file, f"public_patched_{patched_file.parent.name}_{stem}")
    tolerance, stats = precision.tolerance, Comparison()
    for index, ((model, inputs), (patched_model, _)) in enumerate(zip(_builds(original), _builds(patched))):
        if only_builds is not None and index not in only_builds:
            continue
        patched_model.load_state_dict(model.state_dict(), strict=True)
        model.to(precision.dtype), patched_model.to(precision.dtype)
        inputs = _cast(inputs, precision.dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.autocast):
            outs, grads = _run_with_grads(model, inputs, first_output_only)
            patched_outs, patched_grads = _run_with_grads(patched_model, inputs, first_output_only)
        where = f"{precision.name} build {index}"
        assert len(outs) == len(patched_outs), f"{where}: the patch changed the number of outputs"
        for n, (a, b) in enumerate(zip(outs, patched_outs)):
            _compare(a, b, accepts_nan_to_finite, tolerance, f"{where} output {n}", stats)
        if not precision.grads:
            continue
        for n, (a, b) in enumerate(zip(grads, patched_grads)):
            assert (a is None) == (b is None), f"{where} gradient {n}: reached on one side only"
            if a is not None:
                _compare(a, b, accepts_nan_to_finite, tolerance, f"{where} gradient {n}", stats)
    return stats


# ---------------------------------------------------------------------------------------------- tests


def test_every_public_file_is_judged() -> None:
    assert {p.stem for p in PUBLIC_DIR.glob("*.py")} == set(JUDGEMENTS)


@pytest.mark.parametrize("stem", list(JUDGEMENTS))
def test_outcome_is_sound_and_complete(stem: str, findings_by_file: dict[str, list[dict[str, Any]]]) -> None:
    """No safe patch where none is possible; a safe patch where the rewrite is plainly equivalent."""
    findings = findings_by_file[stem]
    outcome = _outcome(findings)
    judgement = JUDGEMENTS[stem]
    for finding in findings:
        if not finding["patch"]:
            assert finding["reason"], f"{stem}: a refusal without a reason"
    if judgement.rewritable:
        assert outcome == "safe patch", f"{stem}: {outcome} ({[f['reason'] for f in findings]}); {judgement.why}"
    else:
        assert outcome != "safe patch", f"{stem}: a safe patch, but {judgement.why}"



@pytest.mark.parametrize("stem", [stem for stem, judgement in JUDGEMENTS.items() if judgement.cause])
def test_reason_names_what_blocks_the_rewrite(stem: str, findings_by_file: dict[str, list[dict[str, Any]]]) -> None:
    """A refusal or unsafe patch is only useful if its reason names the real obstacle."""
    reasons = [f["reason"] or "" for f in findings_by_file[stem]]
    assert any(re.search(JUDGEMENTS[stem].cause, reason) for reason in reasons), f"{stem}: {reasons}"

def test_files_without_a_safe_patch_are_left_as_they_were(findings_by_file: dict[str, list[dict[str, Any]]],
                                                           patched_dir: Path) -> None:
    untouched = [stem for stem in JUDGEMENTS if _outcome(findings_by_file[stem]) != "safe patch"]
    assert untouched
    for stem in untouched:
        assert (patched_dir / f"{stem}.py").read_bytes() == (PUBLIC_DIR / f"{stem}.py").read_bytes(), stem


@pytest.mark.parametrize("stem,precision", [
    pytest.param(stem, precision, id=f"{stem}-{precision.name}")
    for stem, judgement in JUDGEMENTS.items() if judgement.rewritable for precision in PRECISIONS
])
def test_safe_patch_keeps_outputs_and_gradients(stem: str, precision: Precision,
                                                findings_by_file: dict[str, list[dict[str, Any]]],
                                                patched_dir: Path) -> None:
    """The applied safe patch imports, runs and matches the original on every build (NaN where it had NaN)."""
    findings = findings_by_file[stem]
    assert _outcome(findings) == "safe patch", f"{stem}: no safe patch to check"
    patched_file = patched_dir / f"{stem}.py"
    assert "scaled_dot_product_attention" in patched_file.read_text()
    assert patched_file.read_bytes() != (PUBLIC_DIR / f"{stem}.py").read_bytes(), "safe patch not applied"
    _check_parity(stem, patched_file, _declared_precision(findings, precision),
                  _accepts(findings, "fully-masked-rows"))



@pytest.mark.parametrize("stem,precision", [
    pytest.param(stem, precision, id=f"{stem}-{precision.name}")
    for stem in FACTS_HOLD_ON for precision in (FP32, FP64)
])
def test_unsafe_patch_holds_where_its_facts_hold(stem: str, precision: Precision,
                                                 findings_by_file: dict[str, list[dict[str, Any]]],
                                                 unsafe_patched_dir: Path) -> None:
    """The facts an unsafe patch names are all it needs: on inputs where they hold, it matches the original."""
    findings = findings_by_file[stem]
    assert _outcome(findings) == "unsafe only", f"{stem}: {_outcome(findings)}"
    weights_escape = any(f["rule"] == "ADV102" for f in findings)
    _check_parity(stem, unsafe_patched_dir / f"{stem}.py", _declared_precision(findings, precision, safe_only=False),
                  True, FACTS_HOLD_ON[stem], weights_escape)

def test_fix_is_idempotent_on_the_patched_folder(patched_dir: Path) -> None:
    before = {p.name: p.read_bytes() for p in patched_dir.glob("*.py")}
    proc = _advisor("fix", str(patched_dir), "--apply")
    assert proc.returncode in (0, 1), proc.stderr
    assert {p.name: p.read_bytes() for p in patched_dir.glob("*.py")} == before


# GPT-2's kv-cache causal slice (bias[:, :, S - L:S, :S], the one form whose rows are proved to keep a key) with
# nanoGPT's masked_fill and a Python-number finite fill: the smallest file that gets a safe patch with a float mask.
FINITE_FILL_CAUSAL_SLICE = '''
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, n: int = 16):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))
        self.q = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 64)

    def forward(self, x, past):
        B, T, C = x.shape
        S = past.shape[1]
        q = self.q(x).view(B, T, 4, 8).transpose(1, 2)
        k, v = self.kv(past).view(B, S, 2, 4, 8).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / 8 ** 0.5)
        att = att.masked_fill(self.bias[:, :, S - T:S, :S] == 0, torch.finfo(att.dtype).min)
        att = att.softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)
'''


def test_safe_patch_with_a_finite_python_fill_runs_in_float64(tmp_path: Path) -> None:
    source = tmp_path / "finite_fill.py"
    source.write_text(FINITE_FILL_CAUSAL_SLICE)
    original = _load(source, "public_finite_fill_original")
    proc = _advisor("fix", str(source), "--apply")
    assert proc.returncode == 0, proc.stderr  # the safe patch applied, nothing left
    patched = _load(source, "public_finite_fill_patched")
    torch.manual_seed(0)
    model, patched_model = original.Attn().double(), patched.Attn().double()
    patched_model.load_state_dict(model.state_dict())
    x, past = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 9, 32, dtype=torch.float64)
    torch.testing.assert_close(patched_model(x, past), model(x, past), rtol=1e-10, atol=1e-10)
