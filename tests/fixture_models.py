"""Helpers that load attention fixture sources as modules and judge a rewrite of them numerically.

A fixture is a Python source file with a module-level ``make(seed: int = 0)`` (``make()`` is also accepted)
that returns ``(model, inputs)``; ``model(*inputs)`` is the forward pass under test.
"""

from __future__ import annotations

import atexit
import ast
import importlib.util
import inspect
import itertools
import os
import re
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_ROOT = REPO_ROOT / "fixtures" / "attention"
POSITIVE_DIR = FIXTURE_ROOT / "positive"
NEGATIVE_DIR = FIXTURE_ROOT / "negative"

_EXPECT = re.compile(r"^EXPECT:\s*(ADV\d{3})\s*$")
_ASSUMES = re.compile(r"^ASSUMES:\s*(.+?)\s*$", re.M)
_counter = itertools.count()
_module_dir: str | None = None


def fixture_inputs(directory: Path) -> list[Path]:
    """The fixtures of a folder, sorted by name: its `.py` files but the goldens beside them (`x.fixed.py`, the
    expected rewrite of `x.py`) and private modules (`_x.py`)."""
    return sorted(p for p in directory.glob("*.py") if not p.name.endswith(".fixed.py") and not p.name.startswith("_"))


def fixture_paths(kind: str) -> list[Path]:
    """The fixture files of one kind ('positive' or 'negative'), sorted by name."""
    return fixture_inputs(FIXTURE_ROOT / kind)


def golden_path(fixture: Path) -> Path:
    """The reviewed rewrite of a fixture: `x.fixed.py` beside `x.py` (as TorchFix keeps its goldens)."""
    return fixture.with_name(fixture.stem + ".fixed.py")


def docstring_first_line(source: str) -> str:
    doc = ast.get_docstring(ast.parse(source), clean=True) or ""
    return doc.splitlines()[0].strip() if doc else ""


def expected_code(source: str) -> str | None:
    """The rule code a negative fixture's docstring announces with 'EXPECT: ADVxxx' on its first line."""
    match = _EXPECT.match(docstring_first_line(source))
    return match.group(1) if match else None


def assumed_facts(source: str) -> set[str]:
    """The facts a positive fixture's rewrite cannot prove (docstring line 'ASSUMES: name, name'): its patch is
    unsafe, and its inputs satisfy them."""
    doc = ast.get_docstring(ast.parse(source), clean=True) or ""
    found = _ASSUMES.search(doc)
    return {name.strip() for name in found.group(1).split(",")} if found else set()


# --------------------------------------------------------------------------------------------------------------
# Loading sources as modules


def _modules_dir() -> str:
    global _module_dir
    if _module_dir is None:
        _module_dir = tempfile.mkdtemp(prefix="advisor-fixture-modules-")
        atexit.register(shutil.rmtree, _module_dir, True)
    return _module_dir


def load_module_from_source(source: str, name: str) -> types.ModuleType:
    """Execute `source` as a fresh module registered in sys.modules under a unique name.

    The source is written to a real file (its path becomes ``__file__``) so that inspect, linecache,
    tracebacks and torch's source lookups work, and so that an original and a rewritten copy of the same
    fixture never share a module object or a name.
    """
    safe = re.sub(r"\W", "_", name) or "fixture"
    unique = f"_advisor_fixture_{safe}_{next(_counter)}"
    filename = os.path.join(_modules_dir(), unique + ".py")
    with open(filename, "w", encoding="utf-8") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(unique, filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return module


def make_parameters(module: types.ModuleType) -> list[str]:
    try:
        return list(inspect.signature(module.make).parameters)
    except (TypeError, ValueError):
        return []


def build(module: types.ModuleType, seed: int = 0, **options: Any) -> tuple[torch.nn.Module, tuple]:
    """Call the fixture's make(): make(seed, **options) when it takes a seed, else make() (then perturb the
    weights deterministically for seeds other than 0 so that each seed still checks different numbers).
    Options the fixture's make() does not take are not passed (`fully_masked=False` for a maskless one)."""
    if make_parameters(module):
        accepted = {key: value for key, value in options.items() if key in make_parameters(module)}
        model, inputs = module.make(seed, **accepted)
    else:
        model, inputs = module.make()
        if seed != 0:
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for param in model.parameters():
                    noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                    param.add_(0.05 * noise.to(param.dtype))
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return model, inputs


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def run_forward(model: torch.nn.Module, inputs: tuple) -> Any:
    """model(*inputs) in eval mode without autograd, on cloned inputs (a fixture may write in place)."""
    model.eval()
    with torch.no_grad():
        return model(*_clone(inputs))


def run_source(source: str, name: str, seed: int = 0) -> Any:
    module = load_module_from_source(source, name)
    model, inputs = build(module, seed)
    return run_forward(model, inputs)


def iter_tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)


def first_output(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) and value else value


# --------------------------------------------------------------------------------------------------------------
# Parity


class ParityError(AssertionError):
    pass


@dataclass
class ParityResult:
    max_abs: float = 0.0
    max_rel: float = 0.0  # max |a - b| / (|a| + atol), elementwise, over every compared tensor
    tensors_compared: int = 0
    dropped: int = 0  # original tensors that the rewrite returned as None (allow_dropped_weights only)
    nan_to_finite: int = 0  # original NaNs (fully masked rows) that the rewrite computes as finite values


def _compare(orig: Any, new: Any, where: str, atol: float, rtol: float, allow_dropped: bool,
             result: ParityResult, accept_nan: bool = False) -> None:
    if isinstance(orig, torch.Tensor):
        if new is None and allow_dropped:
            result.dropped += 1
            return
        if not isinstance(new, torch.Tensor):
            raise ParityError(f"{where}: original returned a tensor, rewrite returned {type(new).__name__}")
        if orig.shape != new.shape:
            raise ParityError(f"{where}: shape {tuple(orig.shape)} became {tuple(new.shape)}")
        if orig.dtype != new.dtype:
            raise ParityError(f"{where}: dtype {orig.dtype} became {new.dtype}")
        a = orig.detach().to(torch.float64)
        b = new.detach().to(torch.float64)
        if accept_nan:  # the accepted divergence: a NaN of the original (a fully masked row) may become finite
            diverged = torch.isnan(a) & torch.isfinite(b)
            result.nan_to_finite += int(diverged.sum())
            a, b = a[~diverged], b[~diverged]
        finite = torch.isfinite(a)
        if not torch.equal(finite, torch.isfinite(b)) or not torch.equal(a[~finite].nan_to_num(0.0),
                                                                          b[~finite].nan_to_num(0.0)):
            raise ParityError(f"{where}: non-finite values (inf/nan) differ between original and rewrite")
        diff = (a[finite] - b[finite]).abs()
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float((diff / (a[finite].abs() + atol)).max()) if diff.numel() else 0.0
        result.max_abs = max(result.max_abs, max_abs)
        result.max_rel = max(result.max_rel, max_rel)
        result.tensors_compared += 1
        if not torch.allclose(b, a, atol=atol, rtol=rtol, equal_nan=True):
            raise ParityError(f"{where}: max abs error {max_abs:.3e}, max rel error {max_rel:.3e} "
                              f"(atol={atol}, rtol={rtol})")
        return
    if isinstance(orig, (tuple, list)):
        if not isinstance(new, (tuple, list)) or len(orig) != len(new):
            raise ParityError(f"{where}: structure {type(orig).__name__}[{len(orig)}] became {new!r:.80}")
        for index, (o, n) in enumerate(zip(orig, new)):
            _compare(o, n, f"{where}[{index}]", atol, rtol, allow_dropped, result, accept_nan)
        return
    if isinstance(orig, dict):
        if not isinstance(new, dict) or set(orig) != set(new):
            raise ParityError(f"{where}: dict keys changed")
        for key in orig:
            _compare(orig[key], new[key], f"{where}[{key!r}]", atol, rtol, allow_dropped, result, accept_nan)
        return
    if orig != new:
        raise ParityError(f"{where}: {orig!r} became {new!r}")


def parity(original_source: str, rewritten_source: str, atol: float = 1e-5, rtol: float = 1e-5,
           seeds: Iterable[int] = (0, 1, 2), allow_dropped_weights: bool = False,
           name: str = "fixture", accept_nan: bool = False, **make_options: Any) -> ParityResult:
    """Run the original and the rewritten module on the same weights and inputs and compare every output.

    For each seed: the original's make(seed) builds the model and inputs; the rewritten module's make(seed)
    builds its model, which then loads the original's state_dict (strict). Both run in eval mode without
    grad. Every tensor in the (possibly nested) outputs must agree within atol/rtol; with
    allow_dropped_weights the rewrite may return None where the original returned a tensor (the unsafe
    ADV102 fix drops the attention weights; `make_options` go to both make()s); with accept_nan an original
    NaN may be finite in the rewrite (SDPA's 0 for a fully masked row), counted in `nan_to_finite`. Raises
    ParityError on any mismatch, else returns the errors.
    """
    original = load_module_from_source(original_source, f"{name}_original")
    rewritten = load_module_from_source(rewritten_source, f"{name}_rewritten")
    result = ParityResult()
    for seed in seeds:
        model_o, inputs = build(original, seed, **make_options)
        model_r, _ = build(rewritten, seed, **make_options)
        model_r.load_state_dict(model_o.state_dict(), strict=True)
        out_o = run_forward(model_o, inputs)
        out_r = run_forward(model_r, inputs)
        _compare(out_o, out_r, f"seed {seed}: output", atol, rtol, allow_dropped_weights, result, accept_nan)
    return result


# --------------------------------------------------------------------------------------------------------------
# Which kernels ran


def dispatched_ops(model: torch.nn.Module, inputs: tuple) -> set[str]:
    """Names of every aten op the forward pass dispatched (profiler names such as 'aten::bmm').

    The profiler records composite ops (aten::scaled_dot_product_attention) as well as what they lower to,
    unlike a TorchDispatchMode, which only sees ops after CompositeImplicitAutograd decomposition.
    """
    from torch.profiler import ProfilerActivity, profile

    model.eval()
    args = _clone(inputs)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(*args)
    return {event.name for event in prof.events()}


_SDPA_OP = re.compile(r"^aten(::|\.)(scaled_dot_product_attention|_scaled_dot_product_\w+)")


def uses_sdpa(ops: Iterable[str]) -> bool:
    """True when any aten::scaled_dot_product_attention / aten::_scaled_dot_product_* op ran."""
    return any(_SDPA_OP.match(op) for op in ops)
