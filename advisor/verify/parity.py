"""Compare two sides' outputs structurally: tensors, tuples/lists, dicts (and HF ModelOutputs, which are dicts).

Tolerances follow the tensor's dtype, or the dtype the model computed in where that is less precise (a float32
output of a model run under bfloat16 autocast). An element passes when |patched - original| <= atol * s + rtol * |original|,
where s = max(1, max |original| of that tensor): rounding error scales with the magnitudes summed into a value
(gradients of a summed loss reach hundreds), so the absolute tolerance is relative to the tensor's scale, never
below atol. The relative error reported is |diff| / max(|original|, atol * s), so elements near zero do not
inflate it. Rows where the original is all NaN (a fully masked attention row with a
-inf fill) while the patched row is finite (SDPA returns zeros there) are counted and labelled, not failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (1e-2, 1e-2), torch.float32: (1e-5, 1e-5),
              torch.float64: (1e-7, 1e-7)}


class Skipped(str):
    """A value that is not compared (a KV cache object, ...): the type name, equal on both sides when types match."""


def to_tree(value):
    """Plain containers of CPU tensors: what a worker sends back for comparison."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):  # also transformers' ModelOutput (an OrderedDict of its non-None fields)
        return {str(k): to_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_tree(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return Skipped(type(value).__name__)


@dataclass
class Comparison:
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    atol: float = 0.0
    rtol: float = 0.0
    atol_applied: float = 0.0  # the largest scaled absolute tolerance any tensor got (atol * s)
    elements: int = 0  # floating-point elements compared
    mismatched: int = 0  # of them, outside tolerance
    outputs_compared: int = 0
    failures: list[str] = field(default_factory=list)
    fully_masked_rows: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def merge(self, other: Comparison) -> None:
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        self.max_rel_err = max(self.max_rel_err, other.max_rel_err)
        self.atol, self.rtol = max(self.atol, other.atol), max(self.rtol, other.rtol)
        self.atol_applied = max(self.atol_applied, other.atol_applied)
        self.elements += other.elements
        self.mismatched += other.mismatched
        self.outputs_compared += other.outputs_compared
        self.failures += other.failures
        self.fully_masked_rows += other.fully_masked_rows
        self.skipped += [s for s in other.skipped if s not in self.skipped]


def compare(original, patched, where: str = "output", computed_in: torch.dtype | None = None) -> Comparison:
    """`computed_in`: the least precise dtype the model computed in (an autocast region's), if any."""
    result = Comparison()
    _compare(original, patched, where, result, computed_in)
    return result


def _compare(a, b, where: str, result: Comparison, computed_in: torch.dtype | None) -> None:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        _compare_tensors(a, b, where, result, computed_in)
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            result.failures.append(f"{where}: keys differ ({sorted(a.keys() ^ b.keys())})")
        for key in a.keys() & b.keys():
            _compare(a[key], b[key], f"{where}.{key}", result, computed_in)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            result.failures.append(f"{where}: {len(a)} items vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{where}[{i}]", result, computed_in)
    elif isinstance(a, Skipped) and isinstance(b, Skipped) and a == b:
        if f"{where} ({a})" not in result.skipped:
            result.skipped.append(f"{where} ({a})")
    elif a != b or type(a) is not type(b):
        result.failures.append(f"{where}: {_describe(a)} vs {_describe(b)}")


def _compare_tensors(a: torch.Tensor, b: torch.Tensor, where: str, result: Comparison,
                     computed_in: torch.dtype | None) -> None:
    if a.shape != b.shape or a.dtype != b.dtype:
        result.failures.append(f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        return
    result.outputs_compared += 1
    if not a.is_floating_point() and not a.is_complex():
        if not torch.equal(a, b):
            result.failures.append(f"{where}: {int((a != b).sum())} integer elements differ")
        return
    atol, rtol = TOLERANCES.get(a.dtype, TOLERANCES[torch.float32])
    if computed_in is not None and a.dtype != computed_in:
        wider = TOLERANCES.get(computed_in, TOLERANCES[torch.bfloat16])
        atol, rtol = max(atol, wider[0]), max(rtol, wider[1])
    result.atol, result.rtol = max(result.atol, atol), max(result.rtol, rtol)
    a, b = a.double(), b.double()
    same_nonfinite = (a.isnan() & b.isnan()) | (a.isinf() & (a == b))
    masked = _fully_masked_rows(a, b)
    result.fully_masked_rows += int(masked.sum()) if masked is not None else 0
    ignored = same_nonfinite | (masked.unsqueeze(-1).expand_as(a) if masked is not None else False)
    diff = (a - b).abs().masked_fill(ignored, 0.0)
    magnitude = a.abs().masked_fill(~a.isfinite(), 0.0)
    floor = atol * max(1.0, float(magnitude.max()) if a.numel() else 1.0)
    bad = ~(diff <= floor + rtol * a.abs()) & ~ignored  # NaN diffs count as bad
    result.atol_applied = max(result.atol_applied, floor)
    result.elements += a.numel()
    result.mismatched += int(bad.sum())
    finite = diff[diff.isfinite()]
    if finite.numel():
        result.max_abs_err = max(result.max_abs_err, float(finite.max()))
        rel = diff / a.abs().clamp_min(floor)
        rel = rel[rel.isfinite()]
        result.max_rel_err = max(result.max_rel_err, float(rel.max()) if rel.numel() else 0.0)
    if bool(bad.any()):
        nonfinite = int((bad & ~(a.isfinite() & b.isfinite())).sum())
        detail = f", {nonfinite} non-finite on one side only" if nonfinite else ""
        result.failures.append(f"{where}: {int(bad.sum())} of {a.numel()} elements outside tolerance{detail}")
        if nonfinite:
            result.max_abs_err = float("inf")


def _fully_masked_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """Rows (last dim) that are all NaN in the original and all finite in the patched output."""
    if a.dim() == 0:
        return None
    rows = a.isnan().all(dim=-1) & b.isfinite().all(dim=-1)
    return rows if bool(rows.any()) else None


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:60]
