"""The small model the optimize tests write into a folder and run: one attention block, `workload()` its
TARGET, with snippets spliced in where a test needs the block to do something else."""

from pathlib import Path

MODEL = '''
import math, sys, time, torch
import torch.nn.functional as F
from torch import nn
{module_prelude}

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = 2
        self.qkv = nn.Linear(32, 96)
        self.calls = 0

    def forward(self, x):
        {forward_prelude}
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)
        out = (att @ v).transpose(1, 2).reshape(B, T, C)
        {forward_epilogue}
        return out


def workload(seed=0):
    {workload_prelude}
    generator = torch.Generator().manual_seed(seed)
    return Attention(), torch.randn(2, 64, 32, generator=generator)
'''


def write_model(folder: Path, **snippets) -> Path:
    values = {key: "pass" for key in ("module_prelude", "forward_prelude", "forward_epilogue", "workload_prelude")}
    values.update(snippets)
    path = folder / "model.py"
    path.write_text(MODEL.format(**values))
    return path


def write_blocks(folder: Path, count: int) -> Path:
    """A model of `count` attention blocks in one file (`blocks` builds it): one patch each."""
    text = MODEL.format(module_prelude="pass", forward_prelude="pass", forward_epilogue="pass", workload_prelude="pass")
    block = text[text.index("class Attention"):text.index("def workload")]
    copies = [block.replace("class Attention", f"class Copy{index}") for index in range(1, count)]
    path = folder / "blocks.py"
    path.write_text(text + "\n" + "\n".join(copies) + "\ndef blocks(seed=0):\n    model, x = workload(seed)\n"
                    f"    return torch.nn.Sequential(model, {', '.join(f'Copy{i}()' for i in range(1, count))}), x\n")
    return path
