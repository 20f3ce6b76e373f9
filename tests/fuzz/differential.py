"""Differential check of advisor's rewrites: run the original module and its safe rewrite on the same weights and
inputs and compare outputs, tensors the forward pass stores on modules, and gradients.

A *counterexample* is a source on which advisor crashes, or whose safe patch fails to import, raises where the
original did not, changes an output, a stored tensor or a gradient, or turns a value the original computed into
NaN/inf (or back) without the finding declaring that divergence as accepted in its facts. A source that defines
`higher_order(model, inputs)` (code around the module that differentiates it twice or in forward mode) is also
held to what that function returns.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from advisor.engine.static import analyze_source
from advisor.static.tree_facts import tree_context
from fixture_models import build, iter_tensors, load_module_from_source

TOLERANCES = {torch.float64: 1e-7, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
GRAD_SLACK = 10.0  # gradients accumulate over more terms than outputs: allow ten times the output tolerance
SEEDS = (0, 1)

# Outcome statuses
INVALID, NO_FINDING, REFUSED, UNSAFE, SAFE_OK, COUNTEREXAMPLE = (
    "invalid", "no-finding", "refused", "unsafe-only", "safe-ok", "counterexample")


@dataclass
class Outcome:
    status: str
    kind: str | None = None  # for counterexamples: internal-error, import-fails, raises, wrong-values, ...
    detail: str = ""
    safe_patches: int = 0
    unsafe_patches: int = 0
    refused: int = 0
    fixed: str | None = None  # the rewritten source, when advisor offered a safe patch
    notes: list[str] = field(default_factory=list)  # checks skipped, unsafe-path observations


class _Mismatch(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def check(source: str, as_file: bool = False) -> Outcome:
    """Analyse `source`, then hold every safe patch to the original's numbers (see the module docstring). With
    `as_file`, the source is analysed as `advisor fix` reads a file of a scanned tree (its own calls of its
    functions may prove facts from call sites) rather than as a text alone."""
    with warnings.catch_warnings(), global_module_hooks():
        warnings.simplefilter("ignore")
        return _check(source, as_file)


def analyze(source: str, as_file: bool = False, unsafe_fixes: bool = False):
    """advisor's analysis of `source`: as a text alone, or `as_file`, the one file of a scanned tree."""
    if not as_file:
        return analyze_source(source, "variant.py", unsafe_fixes=unsafe_fixes)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "variant.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(source)
        return analyze_source(source, path, unsafe_fixes=unsafe_fixes, tree_context=tree_context([path]))


@contextmanager
def global_module_hooks():
    """Hooks a variant registers for every module (`register_module_forward_hook`) stay in this block: the
    process-wide tables are restored afterwards, so they never fire on the next variant."""
    from torch.nn.modules import module
    tables = [getattr(module, name) for name in dir(module) if name.startswith("_global_")
              and isinstance(getattr(module, name), dict)]
    saved = [dict(table) for table in tables]
    try:
        yield
    finally:
        for table, entries in zip(tables, saved):
            table.clear()
            table.update(entries)


def _check(source: str, as_file: bool) -> Outcome:
    try:
        original = _load(source, "original")
        _run_eval(original, SEEDS[0])
    except Exception as exc:  # noqa: BLE001 - the generator wrote code that does not run: not advisor's fault
        return Outcome(INVALID, detail=f"original fails: {type(exc).__name__}: {exc}")
    try:
        return _check_loaded(source, original, as_file)
    finally:
        _unload(original)


def _check_loaded(source: str, original, as_file: bool) -> Outcome:
    try:
        result = analyze(source, as_file)
    except Exception as exc:  # noqa: BLE001
        return Outcome(COUNTEREXAMPLE, "internal-error", f"{type(exc).__name__}: {exc}")
    safe = [f for f in result.findings if f.fix_safety == "safe" and f.patch]
    unsafe = [f for f in result.findings if f.fix_safety == "unsafe" and f.patch]
    refused = [f for f in result.findings if not f.patch]
    outcome = Outcome(NO_FINDING, safe_patches=len(safe), unsafe_patches=len(unsafe), refused=len(refused))
    if unsafe:
        outcome.notes.append(_unsafe_path_note(source, original, as_file))
    if not safe:
        outcome.status = UNSAFE if unsafe else REFUSED if refused else NO_FINDING
        return outcome
    outcome.fixed = result.fixed
    accepts_nan = any(_declares_nan_divergence(f.extra.get("facts")) for f in safe)
    try:
        _compare_sources(original, source, result.fixed, accepts_nan, outcome.notes)
    except _Mismatch as mismatch:
        outcome.status, outcome.kind, outcome.detail = COUNTEREXAMPLE, mismatch.kind, str(mismatch)
        return outcome
    outcome.status = SAFE_OK
    return outcome


def compare(source: str, fixed: str, accepts_nan: bool = False) -> tuple[str, str] | None:
    """(kind, detail) of the first difference between running `source` and `fixed`, or None when they agree."""
    original = _load(source, "original")
    notes: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _compare_sources(original, source, fixed, accepts_nan, notes)
    except _Mismatch as mismatch:
        return mismatch.kind, str(mismatch)
    finally:
        _unload(original)
    return None


def _declares_nan_divergence(facts: Any) -> bool:
    """True when a finding accepts that fully masked rows become finite (NaN -> 0) and says so in its facts:
    a fact under any status other than proved/assumed whose text mentions NaN or fully masked rows."""
    if not isinstance(facts, dict):
        return False
    for status, entries in facts.items():
        if status in ("proved", "assumed"):
            continue
        for fact in entries or ():
            text = " ".join(str(value) for value in fact.values()).lower()
            if "nan" in text or "fully-masked" in text or "fully masked" in text:
                return True
    return False


def _unsafe_path_note(source: str, original, as_file: bool) -> str:
    """The unsafe path is not held to parity (its assumed facts may be false) but must import and run, in eval
    and in a training step wherever the original runs. The variant's own inputs may break an assumed fact, so a
    failure counted here is an upper bound on patches that fail where their facts hold."""
    try:
        fixed = analyze(source, as_file, unsafe_fixes=True).fixed
        module = _load(fixed, "unsafe")
        try:
            _run_eval(module, SEEDS[0])
            if _trains(original):
                model, inputs = build(module, SEEDS[0])
                _gradients(model, inputs, SEEDS[0])
        finally:
            _unload(module)
    except Exception as exc:  # noqa: BLE001
        return f"unsafe patch fails: {type(exc).__name__}: {str(exc)[:200]}"
    return "unsafe patch runs"


def _trains(module) -> bool:
    """Whether the original module's training step (forward and backward) runs."""
    try:
        model, inputs = build(module, SEEDS[0])
        _gradients(model, inputs, SEEDS[0])
    except Exception:  # noqa: BLE001 - the original itself cannot train: nothing to hold the patch to
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# Running


def _load(source: str, name: str):
    return load_module_from_source(source, f"fuzz_{name}")


def _unload(module) -> None:
    sys.modules.pop(module.__name__, None)
    try:
        os.remove(module.__file__)
    except OSError:
        pass


def _clone_inputs(inputs: tuple, grad: bool = False) -> tuple:
    cloned = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if grad and value.is_floating_point():
                value.requires_grad_(True)
        cloned.append(value)
    return tuple(cloned)


def _run_eval(module, seed: int):
    model, inputs = build(module, seed)
    model.eval()
    with torch.no_grad():
        return model(*_clone_inputs(inputs))


def _stored_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Tensors the forward pass left on modules as plain attributes (weights stored for visualisation, ...)."""
    found = {}
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not name.startswith("_"):
                found[f"{prefix}.{name}" if prefix else name] = value
    return found


def _compare_sources(original, source: str, fixed: str, accepts_nan: bool, notes: list[str]) -> None:
    try:
        rewritten = _load(fixed, "rewritten")
    except Exception as exc:  # noqa: BLE001
        raise _Mismatch("import-fails", f"{type(exc).__name__}: {exc}") from None
    try:
        for seed in SEEDS:
            _compare_eval(original, rewritten, seed, accepts_nan)
        _compare_gradients(original, rewritten, SEEDS[0], notes)
        if hasattr(original, "higher_order"):
            _compare_higher_order(original, rewritten, SEEDS[0], notes)
    finally:
        _unload(rewritten)


def _pair(original, rewritten, seed: int):
    model_o, inputs = build(original, seed)
    try:
        model_r, _ = build(rewritten, seed)
        model_r.load_state_dict(model_o.state_dict(), strict=True)
    except Exception as exc:  # noqa: BLE001
        raise _Mismatch("raises", f"building the rewritten model: {type(exc).__name__}: {exc}") from None
    return model_o, model_r, inputs


def _compare_eval(original, rewritten, seed: int, accepts_nan: bool) -> None:
    model_o, model_r, inputs = _pair(original, rewritten, seed)
    model_o.eval()
    model_r.eval()
    with torch.no_grad():
        out_o = model_o(*_clone_inputs(inputs))
        try:
            out_r = model_r(*_clone_inputs(inputs))
        except Exception as exc:  # noqa: BLE001
            raise _Mismatch("raises", f"{type(exc).__name__}: {exc}") from None
    floor = _model_tolerance(model_o)
    _compare_values(out_o, out_r, f"seed {seed} output", accepts_nan, floor=floor)
    stored_o, stored_r = _stored_tensors(model_o), _stored_tensors(model_r)
    if set(stored_o) != set(stored_r):
        raise _Mismatch("lost-stored-tensor", f"tensors stored on modules {sorted(stored_o)} became {sorted(stored_r)}")
    for name in stored_o:
        _compare_values(stored_o[name], stored_r[name], f"seed {seed} stored {name}", accepts_nan, floor=floor)


def _compare_values(orig: Any, new: Any, where: str, accepts_nan: bool, slack: float = 1.0,
                    floor: float = 0.0) -> None:
    """Tensors agree within the tolerance of their dtype (at least `floor`: the model's compute precision)."""
    tensors_o, tensors_r = list(iter_tensors(orig)), list(iter_tensors(new))
    if len(tensors_o) != len(tensors_r):
        raise _Mismatch("wrong-structure", f"{where}: {len(tensors_o)} tensors became {len(tensors_r)}")
    for index, (a, b) in enumerate(zip(tensors_o, tensors_r)):
        label = f"{where}[{index}]"
        if a.shape != b.shape or a.dtype != b.dtype:
            raise _Mismatch("wrong-structure", f"{label}: {a.dtype}{tuple(a.shape)} became {b.dtype}{tuple(b.shape)}")
        a64, b64 = a.detach().double(), b.detach().double()
        finite_a, finite_b = torch.isfinite(a64), torch.isfinite(b64)
        if not torch.equal(finite_a, finite_b):
            nan_to_finite = torch.isnan(a64) & finite_b
            if not (accepts_nan and torch.equal(finite_a | nan_to_finite, finite_b)):
                kind = "nan-divergence" if bool((~finite_a & finite_b).any()) else "wrong-values"
                raise _Mismatch(kind, f"{label}: non-finite positions differ "
                                      f"({int((~finite_a).sum())} in the original, {int((~finite_b).sum())} after)")
        both = finite_a & finite_b
        tol = max(TOLERANCES.get(a.dtype, 1e-5), floor) * slack
        diff = (a64[both] - b64[both]).abs()
        bound = tol + tol * a64[both].abs()
        if diff.numel() and bool((diff > bound).any()):
            raise _Mismatch("wrong-values" if slack == 1.0 else "wrong-gradients",
                            f"{label}: max abs error {float(diff.max()):.3e} (tolerance {tol:g} abs and rel)")


def _model_tolerance(model: torch.nn.Module) -> float:
    """The tolerance of the model's least precise parameter dtype: values that pass through it carry its error."""
    return max((TOLERANCES.get(p.dtype, 1e-5) for p in model.parameters()), default=0.0)


def _zero_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "drop_p", None), float):
            module.drop_p = 0.0


def _gradients(model: torch.nn.Module, inputs: tuple, seed: int) -> tuple[Any, dict]:
    model.train()
    _zero_dropout(model)
    args = _clone_inputs(inputs, grad=True)
    out = model(*args)
    generator = torch.Generator().manual_seed(seed)
    loss = 0.0
    for tensor in iter_tensors(out):
        if tensor.requires_grad and tensor.is_floating_point():
            weight = torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
            loss = loss + (tensor * weight).sum()
    if isinstance(loss, float):
        return out, {}
    loss.backward()
    grads = {f"input {i}": a.grad for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad}
    grads.update({name: p.grad for name, p in model.named_parameters()})
    return out, grads


def _compare_gradients(original, rewritten, seed: int, notes: list[str]) -> None:
    model_o, model_r, inputs = _pair(original, rewritten, seed)
    try:
        out_o, grads_o = _gradients(model_o, inputs, seed)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"gradients not compared: the original raises in training ({type(exc).__name__})")
        return
    if any(not bool(torch.isfinite(t).all()) for t in iter_tensors(out_o)):
        notes.append("gradients not compared: the original's output has non-finite values")
        return
    try:
        _, grads_r = _gradients(model_r, inputs, seed)
    except Exception as exc:  # noqa: BLE001
        raise _Mismatch("raises", f"training step: {type(exc).__name__}: {exc}") from None
    for name, grad_o in grads_o.items():
        grad_r = grads_r.get(name)
        if (grad_o is None) != (grad_r is None):
            raise _Mismatch("wrong-gradients", f"gradient of {name}: {'none' if grad_o is None else 'a tensor'} "
                                               f"became {'none' if grad_r is None else 'a tensor'}")
        if grad_o is not None:
            _compare_values(grad_o, grad_r, f"gradient of {name}", False, slack=GRAD_SLACK,
                            floor=_model_tolerance(model_o))


def _compare_higher_order(original, rewritten, seed: int, notes: list[str]) -> None:
    """The source's own double-backward or forward-mode code, run in eval mode on both models."""
    model_o, model_r, inputs = _pair(original, rewritten, seed)
    model_o.eval()
    model_r.eval()
    try:
        value_o = original.higher_order(model_o, _clone_inputs(inputs))
    except Exception as exc:  # noqa: BLE001
        notes.append(f"higher-order autograd not compared: the original raises ({type(exc).__name__})")
        return
    try:
        value_r = rewritten.higher_order(model_r, _clone_inputs(inputs))
    except Exception as exc:  # noqa: BLE001
        raise _Mismatch("raises", f"higher-order autograd: {type(exc).__name__}: {str(exc)[:200]}") from None
    _compare_values(value_o, value_r, "higher-order autograd", False, slack=GRAD_SLACK,
                    floor=_model_tolerance(model_o))
