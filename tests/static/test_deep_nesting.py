"""Code CPython accepts, nested deeper than the interpreter's default recursion limit lets advisor's walks and
libcst's code generation recurse (a module-level sum of hundreds of terms, a long chain of casts): the file is
analysed again where the nesting fits (static.deep_stack), not lost to the scan (breaker round 53)."""

from __future__ import annotations

import sys

from advisor.engine.static import scan_paths

BLOCK = '''import math
import torch
import torch.nn as nn


class Attn(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return s.softmax(dim=-1) @ v


'''


def _scanned(tmp_path, tail: str):
    path = tmp_path / "model.py"
    path.write_text(BLOCK + tail)
    compile(path.read_text(), str(path), "exec")  # CPython accepts it
    return scan_paths([str(path)], jobs=1, cache=False)


def test_a_module_level_sum_of_many_terms_keeps_the_files_findings(tmp_path):
    limit = sys.getrecursionlimit()
    result = _scanned(tmp_path, "a = 1\nP = " + " + ".join(["a"] * 800) + "\n")
    assert not result.errors
    assert [finding.rule for finding in result.findings] == ["ADV101"]
    assert result.findings[0].patch and "scaled_dot_product_attention" in result.findings[0].patch
    assert sys.getrecursionlimit() == limit


def test_a_long_chain_of_casts_is_analysed(tmp_path):
    result = _scanned(tmp_path, "def f(x):\n    return x" + ".float()" * 250 + "\n")
    assert not result.errors
    assert {finding.rule for finding in result.findings} == {"ADV101", "ADV301"}
    fixed = result.files[0].fixed
    compile(fixed, "model.py", "exec")
    assert fixed.count(".float()") < 250
