"""How much of the available speedup does `advisor optimize` deliver?

For each model: the speedup that `optimize` reports for its verified patches, and, in the same run and through
optimize's own timing harness (live original and variant workers, interleaved rounds, same weights and inputs), the
speedup of a hand-written SDPA version (the attention modules' forward replaced) and of advisor's patched attention.
The RATIO line is optimize's reported speedup over the hand-written one (the goal is >= 0.9). As a cross-check, the
original, advisor's patch and the hand-written version are also timed in this process in rotated rounds: their
ratio is comparable, their speedups are not (this process uses glibc's default allocator thresholds, under which
the original pays page faults for its score tensors every step; optimize's workers do not, see README "Timing").
CPU, float32, eval.

    python benchmarks/optimize_vs_handwritten.py [--rounds 20] [--budget 4] [--skip-vit]

The ViT case needs `pip install --no-deps vit-pytorch` (its package imports torchvision only for training helpers;
when torchvision is missing a stub stands in, since installing it pulls another torch build).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from einops import rearrange

import advisor.demo
from advisor.engine.static import analyze_source
from advisor.verify.optimize_pipeline import Options, optimize

TORCHVISION_STUB = '''
try:
    import torchvision  # noqa: F401
except ImportError:  # vit_pytorch/__init__ imports torchvision.transforms for its DINO helper only
    import sys, types
    sys.modules["torchvision"] = types.SimpleNamespace(transforms=None)
'''

VIT_WORKLOAD = TORCHVISION_STUB + '''
import torch
from vit_pytorch import ViT
import advisor

def workload(seed=0):
    torch.manual_seed(0)
    model = ViT(image_size=256, patch_size=8, num_classes=10, dim=128, depth=2, heads=4, dim_head=32, mlp_dim=256)
    images = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(seed))
    return advisor.Workload(model, args=(images,), seed=seed, steps=3)
'''


def demo_handwritten(self, x):
    """The demo's CausalSelfAttention.forward written with SDPA by hand."""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def vit_handwritten(self, x):
    """vit-pytorch's Attention.forward written with SDPA by hand."""
    x = self.norm(x)
    q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
    out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
    return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


def _demo():
    import gpt  # the copy demo_case put on sys.path (workers import like this process)

    return gpt.workload, gpt.CausalSelfAttention


def _vit():
    import vit_workload  # installs the torchvision stub before vit_pytorch is imported
    from vit_pytorch.vit import Attention

    return vit_workload.workload, Attention


def _variant(case, forward_of, seed: int):
    """The case's workload with every attention module's forward replaced (same weights: the worker loads the
    original side's state)."""
    make, attention_class = case()
    workload = make(seed)
    swap(workload.model, attention_class, forward_of(attention_class))
    return workload


# Workload targets of the variants, for optimize's own timing harness (`FILE:function` run in a worker)
def demo_hand(seed=0):
    return _variant(_demo, lambda _: demo_handwritten, seed)


def demo_advisor(seed=0):
    return _variant(_demo, advisor_forward, seed)


def vit_hand(seed=0):
    return _variant(_vit, lambda _: vit_handwritten, seed)


def vit_advisor(seed=0):
    return _variant(_vit, advisor_forward, seed)


def demo_case(folder: str):
    shutil.copyfile(os.path.join(os.path.dirname(advisor.demo.__file__), "gpt.py"), os.path.join(folder, "gpt.py"))
    sys.path.insert(0, folder)
    make, attention_class = _demo()
    workload = make()
    return (f"{folder}/gpt.py:workload", workload.model, workload.args, attention_class, demo_handwritten,
            ("demo_hand", "demo_advisor"))


def vit_case(folder: str):
    with open(os.path.join(folder, "vit_workload.py"), "w") as handle:
        handle.write(VIT_WORKLOAD)
    sys.path.insert(0, folder)
    make, attention_class = _vit()
    workload = make()
    return (f"{folder}/vit_workload.py:workload", workload.model, workload.args, attention_class, vit_handwritten,
            ("vit_hand", "vit_advisor"))


def swap(model, attention_class, forward) -> None:
    """Every module of exactly `attention_class` gets `forward` (a subclass, so the weights stay where they are)."""
    swapped = type(f"Swapped{attention_class.__name__}", (attention_class,), {"forward": forward})
    for module in model.modules():
        if type(module) is attention_class:
            module.__class__ = swapped


def harness_speedups(target: str, variants: dict[str, str], budget_s: float) -> dict[str, tuple[float, list]]:
    """optimize's own timing harness on each variant: a live original worker and a variant worker given the
    original's weights and inputs, timed in interleaved rounds. Label -> (speedup, 95% interval)."""
    from advisor.verify.ab_timing import interleave
    from advisor.verify.messages import Export, Load
    from advisor.verify.process import start_worker

    measured = {}
    with start_worker("original") as original:
        original.call(Load(target))
        state = original.call(Export())
        for label, variant in variants.items():
            with start_worker(label) as worker:
                worker.call(Load(variant, state=state))
                paired = interleave(original, worker, budget_s)
                measured[label] = (paired.speedup(), [round(v, 2) for v in paired.speedup_ci()])
    return measured


def advisor_forward(attention_class):
    """The forward that advisor's verified patch gives `attention_class`: its file rewritten by the same static
    rules `optimize` used, executed as a sibling module so the rewritten forward sees the rewritten globals."""
    import importlib.util
    import inspect

    path = inspect.getsourcefile(attention_class)
    with open(path, encoding="utf-8") as handle:
        fixed = analyze_source(handle.read(), path).fixed
    name = f"{attention_class.__module__}_advisor_patched"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=path))
    module.__package__ = attention_class.__module__.rpartition(".")[0]
    exec(compile(fixed, path, "exec"), module.__dict__)  # noqa: S102 - the user's own file, rewritten
    return getattr(module, attention_class.__name__).forward


def side_by_side(model, args, attention_class, forwards: dict, rounds: int) -> dict[str, float]:
    """Median speedup over the original of each variant (same weights, attention forward replaced), with the
    variants' order rotated every round so machine drift hits all of them alike."""
    import copy

    variants = {"original": model}
    for label, forward in forwards.items():
        variants[label] = copy.deepcopy(model)
        swap(variants[label], attention_class, forward)
    ratios: dict[str, list[float]] = {label: [] for label in forwards}
    with torch.no_grad():
        reference = model.eval()(*args)
        for label in forwards:
            error = (variants[label].eval()(*args) - reference).abs().max().item()
            print(f"  {label} max abs difference from the original: {error:.2e}")
        for m in variants.values():
            for _ in range(2):
                m(*args)
        order = list(variants)
        for r in range(rounds):
            times = {}
            for label in order[r % len(order):] + order[:r % len(order)]:
                start = time.perf_counter()
                variants[label](*args)
                times[label] = time.perf_counter() - start
            for label in forwards:
                ratios[label].append(times["original"] / times[label])
    return {label: statistics.median(values) for label, values in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--skip-vit", action="store_true")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of interleaved timing per comparison")
    args = parser.parse_args()
    cases = [("demo GPT, 512 tokens", demo_case)]
    if not args.skip_vit:
        try:
            exec(TORCHVISION_STUB, {})  # noqa: S102 - the stub above, in this process too
            import vit_pytorch  # noqa: F401
            cases.append(("vit-pytorch ViT, 1025 tokens", vit_case))
        except ImportError:
            print("vit-pytorch is not installed: skipping the ViT case (pip install --no-deps vit-pytorch)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU float32")
    for name, make in cases:
        folder = tempfile.mkdtemp(prefix="advisor-bench-")
        target, model, inputs, attention_class, forward, (hand_target, advisor_target) = make(folder)
        started = time.perf_counter()
        result = optimize(Options(target=target, report_dir=os.path.join(folder, "report"), root=folder,
                                  timing_budget_s=args.budget))
        elapsed = time.perf_counter() - started
        verdicts = ", ".join(f"{p['id']} {p['verdict']}" for p in result["patches"]) or "no patches"
        reported = result["speedup"]
        print(f"{name}: optimize took {elapsed:.1f} s; patches: {verdicts}")
        harness = harness_speedups(target, {"hand-written": f"{__file__}:{hand_target}",
                                            "advisor": f"{__file__}:{advisor_target}"}, args.budget)
        (hand_harness, hand_ci), (advisor_harness, advisor_ci) = harness["hand-written"], harness["advisor"]
        print(f"  optimize's harness, same run: hand-written SDPA {hand_harness:.2f}x (95% CI {hand_ci}), advisor's "
              f"patch {advisor_harness:.2f}x (95% CI {advisor_ci})")
        if reported is not None:
            print(f"  RATIO optimize's reported speedup / hand-written (same harness): {reported / hand_harness:.2f}")
        measured = side_by_side(model, inputs, attention_class,
                                {"advisor": advisor_forward(attention_class), "hand-written": forward}, args.rounds)
        hand = measured["hand-written"]
        print(f"  side by side, {args.rounds} rotated rounds: advisor's patch {measured['advisor']:.2f}x, hand-written "
              f"SDPA {hand:.2f}x; ratio {measured['advisor'] / hand:.2f}")
        if reported is None:
            print("  optimize reported no verified patch (its interval did not clear 1.0)")
        else:
            print(f"  optimize reported {reported:.2f}x (95% CI {result['speedup_ci']}); ratio to hand-written "
                  f"{reported / hand:.2f}")
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
