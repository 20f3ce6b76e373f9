"""How much of the available speedup does `advisor optimize` deliver?

For each model: the speedup that `optimize` reports for its verified patches, and the speedup of a hand-written
SDPA version of the same model (same weights, its attention modules' forward replaced by one
scaled_dot_product_attention call written by hand), measured side by side in this process with interleaved
rounds. Prints both and their ratio (the goal is >= 0.9). CPU, float32, eval.

    python benchmarks/optimize_vs_handwritten.py [--rounds 20] [--skip-vit]

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
from advisor.verify.optimize import Options, optimize

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


def demo_case(folder: str):
    shutil.copyfile(os.path.join(os.path.dirname(advisor.demo.__file__), "gpt.py"), os.path.join(folder, "gpt.py"))
    sys.path.insert(0, folder)
    import gpt

    def handwritten(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    workload = gpt.workload()
    return f"{folder}/gpt.py:workload", workload.model, workload.args, gpt.CausalSelfAttention, handwritten


def vit_case(folder: str):
    with open(os.path.join(folder, "vit_workload.py"), "w") as handle:
        handle.write(VIT_WORKLOAD)
    sys.path.insert(0, folder)
    import vit_workload
    from vit_pytorch.vit import Attention

    def handwritten(self, x):
        x = self.norm(x)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))

    workload = vit_workload.workload()
    return f"{folder}/vit_workload.py:workload", workload.model, workload.args, Attention, handwritten


def handwritten_speedup(model, args, attention_class, forward, rounds: int) -> float:
    """Original vs the same weights with every attention module's forward replaced, interleaved rounds."""
    import copy

    patched = copy.deepcopy(model)
    hand_class = type("HandwrittenSDPA", (attention_class,), {"forward": forward})
    for module in patched.modules():
        if type(module) is attention_class:
            module.__class__ = hand_class
    model.eval()
    patched.eval()
    with torch.no_grad():
        difference = (model(*args) - patched(*args)).abs().max().item()
        for m in (model, patched):
            for _ in range(2):
                m(*args)
        ratios = []
        for r in range(rounds):
            times = {}
            for m in ((model, patched) if r % 2 == 0 else (patched, model)):
                start = time.perf_counter()
                m(*args)
                times[id(m)] = time.perf_counter() - start
            ratios.append(times[id(model)] / times[id(patched)])
    print(f"  hand-written SDPA max abs difference from the original: {difference:.2e}")
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--skip-vit", action="store_true")
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
        target, model, inputs, attention_class, forward = make(folder)
        started = time.perf_counter()
        result = optimize(Options(target=target, report_dir=os.path.join(folder, "report"), root=folder))
        elapsed = time.perf_counter() - started
        verdicts = ", ".join(f"{p['id']} {p['verdict']}" for p in result["patches"]) or "no patches"
        reported = result["speedup"]
        print(f"{name}: optimize took {elapsed:.1f} s; patches: {verdicts}")
        hand = handwritten_speedup(model, inputs, attention_class, forward, args.rounds)
        if reported is None:
            print(f"  optimize: no verified patch; hand-written SDPA: {hand:.2f}x")
        else:
            print(f"  optimize reports {reported:.2f}x (95% CI {result['speedup_ci']}); hand-written SDPA {hand:.2f}x; "
                  f"ratio {reported / hand:.2f}")
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
