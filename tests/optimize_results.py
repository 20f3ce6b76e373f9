"""Hand-built `advisor optimize` result dicts (the JSON contract) for the report renderer tests: a typical run,
edge cases, and one full of hostile strings."""

from __future__ import annotations

import copy
import random
import statistics

HOSTILE = "[/][bold red]x[/] <script>alert(1)</script> \x1b[31mred\x1b]0;title\x07 | `tick` **b** &amp; \r \u202eevil"


def _side(median_us: float, spread: float, peak_bytes: int, seed: int) -> dict:
    rng = random.Random(seed)
    samples = sorted(rng.gauss(median_us, spread) for _ in range(40))
    return {"median_us": statistics.median(samples), "iqr_us": samples[30] - samples[10],
            "ci_us": [samples[16], samples[24]],
            "peak_bytes": peak_bytes, "samples_us": samples}


def _patch(index: int, path: str, verdict: str, speedup: float | None, **extra) -> dict:
    diff = (f"--- a/{path}\n+++ b/{path}\n@@ -40,7 +40,4 @@ class CausalSelfAttention(nn.Module):\n"
            "         q, k, v = self.c_attn(x).split(self.n_embd, dim=2)\n"
            "-        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
            "-        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))\n"
            "-        att = F.softmax(att, dim=-1)\n"
            "-        y = att @ v\n"
            "+        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
            "         y = y.transpose(1, 2).contiguous().view(B, T, C)\n")
    patch = {"id": f"p{index}", "rule": "ADV101", "path": path, "line": 40 + index, "end_line": 46 + index,
             "function": "CausalSelfAttention.forward", "fix_safety": "safe", "diff": diff, "verdict": verdict,
             "verified": verdict == "verified", "offered": verdict == "verified",
             "parity": {"max_abs_err": 2.4e-7, "max_rel_err": 3.1e-6, "atol": 1e-5, "rtol": 1e-5, "seeds": 3,
                        "outputs_compared": 1, "fully_masked_rows": None, "grads": False},
             "speedup": speedup, "speedup_ci": None if speedup is None else [speedup * 0.96, speedup * 1.04],
             "reason": None, "applied": False, "written_to": None}
    patch.update(extra)
    return patch


def typical() -> dict:
    """Two verified patches (one in an installed package), one without measurable gain, one parity failure."""
    ops_before = [{"op": "aten::bmm", "count": 24, "us": 14200.0}, {"op": "aten::_softmax", "count": 12, "us": 9100.0},
                  {"op": "aten::masked_fill", "count": 12, "us": 4100.0}, {"op": "aten::addmm", "count": 48,
                                                                           "us": 11800.0},
                  {"op": "aten::copy_", "count": 30, "us": 2100.0}, {"op": "aten::mul", "count": 40, "us": 1900.0},
                  {"op": "aten::native_layer_norm", "count": 25, "us": 800.0},
                  {"op": "aten::gelu", "count": 12, "us": 1300.0}]
    ops_after = [{"op": "aten::_scaled_dot_product_flash_attention_for_cpu", "count": 12, "us": 7600.0},
                 {"op": "aten::addmm", "count": 48, "us": 11700.0}, {"op": "aten::copy_", "count": 18, "us": 1200.0},
                 {"op": "aten::mul", "count": 16, "us": 700.0}, {"op": "aten::native_layer_norm", "count": 25,
                                                                  "us": 810.0},
                 {"op": "aten::gelu", "count": 12, "us": 1290.0}]
    finding = {"rule": "ADV110", "kind": "attention", "path": "demo/model.py", "line": 41, "end_line": 47,
               "function": "CausalSelfAttention.forward", "message": "hand-written attention", "fixable": True,
               "fix_safety": "safe", "reason": None, "patch": None, "self_us": 27400.0, "share": 0.6, "calls": 12,
               "evidence": {}}
    return {
        "version": 1, "target": "demo/model.py:workload",
        "environment": {"torch": "2.13.0+cpu", "device": "cpu", "dtype": "float32", "threads": 2,
                        "python": "3.11.9", "peak_memory_method": "tracemalloc + torch allocator", "sdpa_kernels": {
                            "before": [], "after": ["aten::_scaled_dot_product_flash_attention_for_cpu"]}},
        "before": _side(48_300.0, 900.0, 612 << 20, 1), "after": _side(26_100.0, 700.0, 301 << 20, 2),
        "mode": "eval", "speedup": 1.85, "speedup_ci": [1.79, 1.91],
        "speedup_method": "median step time ratio; 95% percentile bootstrap over interleaved A/B rounds",
        "notes": ["threads fixed at 2 for both sides"],
        "patches": [
            _patch(1, "demo/model.py", "verified", 1.62, applied=True, written_to="demo/model.py"),
            _patch(2, "/usr/lib/python3/site-packages/vit_pytorch/vit.py", "verified", 1.14,
                   written_to="report/vit_pytorch-vit.py.diff"),
            _patch(3, "demo/model.py", "no-gain", 1.01, speedup_ci=[0.97, 1.05],
                   reason="the interval 0.97x to 1.05x contains 1.0"),
            _patch(4, "demo/model.py", "parity-failed", None, fix_safety="unsafe",
                   parity={"max_abs_err": 0.31, "max_rel_err": 2.2, "atol": 1e-5, "rtol": 1e-5, "seeds": 3,
                           "outputs_compared": 2, "grads": True, "not_compared": ["past_key_values"],
                           "fully_masked_rows": {"rows": 4, "original": "NaN", "patched": "finite"}},
                   reason="outputs differ beyond tolerance",
                   unsafe_facts_checked_on="3 input(s) of demo/model.py:workload",
                   state_dict={"missing": ["blocks.0.attn.mask"], "unexpected": []},
                   facts={"proved": [], "assumed": [{"name": "mask-rank", "statement": "the mask broadcasts to "
                                                     "(..., L, S)", "why": "shape unknown statically"}]}),
        ],
        "unpatched": [{"rule": "ADV110", "path": "dit/models.py", "line": 88, "end_line": 93,
                       "function": "Attention.forward", "message": "hand-written attention", "share": 0.197,
                       "self_us": 8300.0, "static_rule": "ADV103", "patch": None,
                       "reason": "ADV103: the attention weights are multiplied by `self.gate`; the other branch of "
                                 "`if self.fused_attn` already calls scaled_dot_product_attention: enable it"}],
        "ops": {"before": ops_before, "after": ops_after},
        "findings_before": [finding], "findings_after": [],
        "traces": {"before": "report/before.trace.json", "after": "report/after.trace.json"},
        "report": "report/report.html", "state_dict": {"missing": [], "unexpected": ["blocks.0.attn.bias"]},
    }


def no_patches() -> dict:
    result = typical()
    result.update(patches=[], after=None, speedup=None, speedup_ci=None, findings_after=[])
    result["ops"]["after"] = None
    result["traces"] = {"before": "report/before.trace.json"}
    return result


def all_rejected() -> dict:
    """Every patch rejected: no `after` side, no overall speedup."""
    result = typical()
    for patch in result["patches"]:
        patch.update(verdict="parity-failed", verified=False, offered=False, applied=False, written_to=None,
                     speedup=None, speedup_ci=None, reason="outputs differ beyond tolerance")
    result["patches"][0].update(verdict="not-run", parity=None, reason="the patched module failed to import")
    result.update(after=None, speedup=None, speedup_ci=None)
    result["ops"]["after"] = []
    return result


def no_interval() -> dict:
    """A verified run whose speedups came without an interval, and a side without samples."""
    result = typical()
    result.update(speedup_ci=None)
    result["after"]["samples_us"] = []
    for patch in result["patches"]:
        patch["speedup_ci"] = None
    return result


def hostile() -> dict:
    """User-controlled strings everywhere a renderer prints one."""
    result = typical()
    result["target"] = f"evil{HOSTILE}.py:workload"
    result["environment"]["device"] = HOSTILE
    result["environment"]["sdpa_kernels"]["after"] = [HOSTILE]
    for patch in result["patches"]:
        patch.update(path=f"pkg/{HOSTILE}.py", function=HOSTILE, reason=HOSTILE, id=HOSTILE)
        patch["diff"] += f"+        x = '{HOSTILE}'\n+        y = '```'  # </pre></details>\n"
    result["ops"]["before"].append({"op": f"aten::{HOSTILE}", "count": 1, "us": 99_000.0})
    result["findings_before"][0]["function"] = HOSTILE
    result["unpatched"][0].update(path=f"pkg/{HOSTILE}.py", function=HOSTILE, reason=HOSTILE, static_rule=HOSTILE,
                                  patch=HOSTILE)
    result["state_dict"]["missing"] = [HOSTILE]
    result["traces"]["after"] = HOSTILE
    return copy.deepcopy(result)


ALL = {"typical": typical, "no_patches": no_patches, "all_rejected": all_rejected, "no_interval": no_interval,
       "hostile": hostile}
