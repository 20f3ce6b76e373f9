"""What FlexAttention buys for the attention SDPA cannot express, side by side in one run.

For each form (tanh soft-capping, alone and with Gemma-2's causal mask, ALiBi, a T5-style bucketed relative bias, a sliding window of 256,
a document mask over packed sequences) three versions of the same attention are timed alternately with
torch.utils.benchmark in one process (no grad, fixed threads):

* hand-written: scores materialised, the bias/transform/mask applied, softmax, @ v, as public models write it;
* SDPA with the bias or mask materialised once outside the timed call (its best case), where SDPA can take one
  (soft-capping it cannot);
* compiled FlexAttention through advisor's `advisor_flex_attention` helper (the source `--backend flex` pastes).

Compile time (first call minus a steady call) is reported apart, with the calls it takes to pay for itself against
the hand-written block; it is cold (a fresh inductor cache, as on a new machine) unless `--keep-cache`, and the first
form also pays inductor's start-up. Errors are max abs differences from the hand-written output. Each form starts from a reset
dynamo cache, as a process with one attention form would. `--recompiles` calls the helper over 3 sequence lengths
and 2 batch sizes in turn and counts the graphs dynamo compiles (soft-capping alone and with a causal BlockMask;
the causal form again with dynamic=True). `--overhead` times soft-capping alone through a bare
`torch.compile(flex_attention)` (with block_mask=None and with an all-true BlockMask) next to the helper and the
hand-written block, to tell the helper's own cost from FlexAttention's. `--forms` with no name runs no form.

    python benchmarks/flex_attention.py [--threads 2] [--seq 1024] [--window-seq 4096] [--forms soft_cap ...]
                                        [--recompiles] [--overhead] [--keep-cache]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.rewrite.flex_prelude import HELPER_NAME, prelude_source  # noqa: E402

WINDOW = 256


@dataclass
class Form:
    """One attention form: the hand-written block, SDPA's call (None where SDPA has no argument for it), flex mods."""

    name: str
    hand_written: Callable
    sdpa: Callable | None
    mods: dict


def helper_namespace() -> dict:
    namespace = {"torch": torch}
    exec(compile(prelude_source(), "<advisor prelude>", "exec"), namespace)
    return namespace


def scores_of(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


def soft_cap_form(q, cap: float = 50.0) -> Form:
    def hand_written(q, k, v):
        scores = scores_of(q, k)
        scores = torch.tanh(scores / cap) * cap
        return torch.softmax(scores, dim=-1) @ v

    def soft_cap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return Form("soft_cap", hand_written, None, dict(score_mod=soft_cap))


def soft_cap_causal_form(q, cap: float = 50.0) -> Form:
    """Gemma-2 as written: soft-capped scores, then its causal mask (flex skips the masked blocks)."""
    length = q.size(-2)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()

    def hand_written(q, k, v):
        scores = torch.tanh(scores_of(q, k) / cap) * cap
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return Form("soft_cap_causal", hand_written, None,
                dict(score_mod=soft_cap_form(q, cap).mods["score_mod"], mask_mod=causal_mask, mask_key="causal"))


def alibi_form(q) -> Form:
    heads, length = q.size(1), q.size(-2)
    slopes = torch.tensor([2 ** (-8 * (i + 1) / heads) for i in range(heads)], device=q.device, dtype=q.dtype)
    position = torch.arange(length, device=q.device)
    causal = position[:, None] >= position[None, :]
    bias = (slopes[:, None, None] * (position[None, None, :] - position[None, :, None])).masked_fill(~causal, -math.inf)

    def hand_written(q, k, v):
        distance = position[None, :] - position[:, None]
        scores = scores_of(q, k) + slopes[:, None, None] * distance
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return Form("alibi", hand_written, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                dict(score_mod=alibi, mask_mod=causal_mask, mask_key="causal"))


def t5_bucket(relative, num_buckets: int = 32, max_distance: int = 128):
    """T5's bidirectional relative-position bucket of key position minus query position (elementwise)."""
    num_buckets //= 2
    exact = num_buckets // 2
    distance = relative.abs()
    log_bucket = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                          * (num_buckets - exact)).long()
    return (relative > 0).long() * num_buckets + torch.where(distance < exact, distance,
                                                             log_bucket.clamp(max=num_buckets - 1))


def t5_form(q) -> Form:
    generator = torch.Generator().manual_seed(1)
    table = torch.randn(32, q.size(1), generator=generator).to(q.device, q.dtype)  # (buckets, heads), learned
    position = torch.arange(q.size(-2), device=q.device)
    bias = table[t5_bucket(position[None, :] - position[:, None])].permute(2, 0, 1).unsqueeze(0)

    def hand_written(q, k, v):
        buckets = t5_bucket(position[None, :] - position[:, None])
        return torch.softmax(scores_of(q, k) + table[buckets].permute(2, 0, 1).unsqueeze(0), dim=-1) @ v

    def t5_bias(score, b, h, q_idx, kv_idx):
        return score + table[t5_bucket(kv_idx - q_idx), h]

    return Form("t5_bias", hand_written, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                dict(score_mod=t5_bias))


def sliding_window_form(q) -> Form:
    position = torch.arange(q.size(-2), device=q.device)
    offset = position[:, None] - position[None, :]
    allowed = (offset >= 0) & (offset < WINDOW)

    def hand_written(q, k, v):
        scores = scores_of(q, k).masked_fill(~allowed, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)

    return Form(f"window_{WINDOW}", hand_written,
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
                dict(mask_mod=sliding_window, mask_key="window"))


def document_form(q, documents: int = 4) -> Form:
    generator = torch.Generator().manual_seed(2)
    batch, length = q.size(0), q.size(-2)
    rows = []
    for _ in range(batch):  # packed sequences: `documents` documents of random lengths per row, causal within each
        cuts = torch.randperm(length - 1, generator=generator)[: documents - 1].add(1).sort().values
        lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([length])]))
        rows.append(torch.repeat_interleave(torch.arange(documents), lengths))
    document = torch.stack(rows).to(q.device)
    position = torch.arange(length, device=q.device)
    allowed = (document[:, None, :, None] == document[:, None, None, :]) & (position[:, None] >= position[None, :])

    def hand_written(q, k, v):
        same = (document[:, :, None] == document[:, None, :]).unsqueeze(1)
        scores = scores_of(q, k).masked_fill(~(same & (position[:, None] >= position[None, :])), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def document_causal(b, h, q_idx, kv_idx):
        return (document[b, q_idx] == document[b, kv_idx]) & (q_idx >= kv_idx)

    return Form("document", hand_written, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
                dict(mask_mod=document_causal, mask_key="document"))


FORMS = {"soft_cap": soft_cap_form, "soft_cap_causal": soft_cap_causal_form, "alibi": alibi_form, "t5_bias": t5_form, "window": sliding_window_form,
         "document": document_form}


def run_form(name: str, shape: tuple[int, int, int, int], device: str = "cpu", dtype=torch.float32,
             threads: int | None = None, rounds: int = 3, min_run_time: float = 0.2) -> dict:
    """Times hand-written, SDPA and compiled flex for one form; errors are against the hand-written output."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    form = FORMS[name](q)
    torch._dynamo.reset()
    flex = functools.partial(helper_namespace()[HELPER_NAME], **form.mods)
    record: dict = {"form": form.name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        flex_out = flex(q, k, v)
        synchronize(device)
        first_call = time.perf_counter() - started
        record["helper_warnings"] = sorted({str(w.message) for w in caught if HELPER_NAME in str(w.message)})
        gold = form.hand_written(q, k, v)
        record["flex_max_err"] = (flex_out - gold).abs().max().item()
        candidates = {"hand_written": form.hand_written, "flex": flex}
        if form.sdpa is not None:
            candidates["sdpa"] = form.sdpa
            record["sdpa_max_err"] = (form.sdpa(q, k, v) - gold).abs().max().item()
        medians = alternate(candidates, (q, k, v), threads, rounds, min_run_time)
    record.update({f"{side}_ms": ms for side, ms in medians.items()})
    record["compile_s"] = max(first_call - medians["flex"] / 1e3, 0.0)
    saved_ms = medians["hand_written"] - medians["flex"]
    record["flex_speedup"] = medians["hand_written"] / medians["flex"]
    record["break_even_calls"] = math.ceil(record["compile_s"] * 1e3 / saved_ms) if saved_ms > 0 else None
    if "sdpa" in medians:
        record["flex_vs_sdpa"] = medians["sdpa"] / medians["flex"]
    return record


def alternate(candidates: dict, inputs, threads, rounds: int, min_run_time: float) -> dict:
    """Median ms per candidate, rounds alternating so drift on a noisy machine hits all of them alike."""
    timers = {side: benchmark.Timer("fn(*inputs)", globals={"fn": fn, "inputs": inputs},
                                    num_threads=threads or torch.get_num_threads())
              for side, fn in candidates.items()}
    times: dict = {side: [] for side in candidates}
    for _ in range(rounds):
        for side, timer in timers.items():
            times[side].append(timer.blocked_autorange(min_run_time=min_run_time).median)
    return {side: sorted(t)[len(t) // 2] * 1e3 for side, t in times.items()}


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def recompiles(lengths: list[int], batches: list[int], shape: tuple[int, int], device: str = "cpu") -> list[dict]:
    """Graphs dynamo compiles through the helper as pasted when (batch, length) change, for soft-capping alone and with
    a causal BlockMask; the causal form again under dynamic=True. Each shape is called twice."""
    from torch._dynamo.utils import counters

    causal = {"mask_mod": lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, "mask_key": "causal"}
    rows = []
    for form, dynamic in (("soft_cap", None), ("soft_cap_causal", None), ("soft_cap_causal", True)):
        torch._dynamo.reset()
        counters.clear()
        compile_fn = torch.compile
        torch.compile = functools.partial(compile_fn, dynamic=dynamic) if dynamic else compile_fn
        try:
            namespace = helper_namespace()
            helper = namespace[HELPER_NAME]
            mods = {**soft_cap_form(None).mods, **(causal if form == "soft_cap_causal" else {})}
            for batch in batches:
                for length in lengths:
                    q = torch.randn(batch, shape[0], length, shape[1], device=device)
                    with torch.no_grad(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # a compile failure is reported as `eager` below
                        started = time.perf_counter()
                        helper(q, q, q, **mods)
                        synchronize(device)
                        first = time.perf_counter() - started
                        started = time.perf_counter()
                        helper(q, q, q, **mods)
                        synchronize(device)
                        again = time.perf_counter() - started
                    rows.append({"form": form, "dynamic": dynamic, "batch": batch, "length": length,
                                 "graphs": counters["stats"]["unique_graphs"], "first_call_s": first,
                                 "second_call_ms": again * 1e3,
                                 "block_masks": len(namespace["_advisor_flex_state"]["block_masks"]),
                                 "eager": namespace["_advisor_flex_state"]["eager_reason"]})
        finally:
            torch.compile = compile_fn
    return rows


def overhead(shape: tuple[int, int, int, int], threads: int, rounds: int = 5, min_run_time: float = 0.3) -> dict:
    """Soft-capping alone, side by side: the hand-written block, a bare `torch.compile(flex_attention)` called with
    the score_mod (block_mask=None, as a user writes it first), the same with an all-true BlockMask of 128-token
    blocks, and the helper as the patch calls it. Ratios are hand-written over each, per round, then the median."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention, noop_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(shape) for _ in range(3))
    form = soft_cap_form(q)
    torch._dynamo.reset()
    bare = torch.compile(flex_attention)
    all_true = create_block_mask(noop_mask, None, None, shape[2], shape[2], device="cpu")
    candidates = {"hand_written": form.hand_written,
                  "bare_no_block_mask": functools.partial(bare, **form.mods),
                  "bare_all_true_block_mask": functools.partial(bare, **form.mods, block_mask=all_true),
                  "helper": functools.partial(helper_namespace()[HELPER_NAME], **form.mods)}
    record: dict = {}
    with torch.no_grad():
        gold = form.hand_written(q, k, v)
        for side, fn in candidates.items():
            record[f"{side}_max_err"] = (fn(q, k, v) - gold).abs().max().item()  # compiles the flex sides
        timers = {side: benchmark.Timer("fn(*inputs)", globals={"fn": fn, "inputs": (q, k, v)}, num_threads=threads)
                  for side, fn in candidates.items()}
        times: dict = {side: [] for side in candidates}
        for _ in range(rounds):
            for side, timer in timers.items():
                times[side].append(timer.blocked_autorange(min_run_time=min_run_time).median * 1e3)
    for side in candidates:
        ratios = sorted(hand / mine for hand, mine in zip(times["hand_written"], times[side]))
        record[side] = {"ms": sorted(times[side])[rounds // 2], "speedup": ratios[rounds // 2]}
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1024, help="sequence length of every form but the window")
    parser.add_argument("--window-seq", type=int, default=4096, help="sequence length of the sliding window")
    parser.add_argument("--window-batch", type=int, default=1)
    parser.add_argument("--forms", nargs="*", choices=sorted(FORMS), default=list(FORMS))
    parser.add_argument("--recompiles", action="store_true", help="count recompiles over changing shapes")
    parser.add_argument("--overhead", action="store_true",
                        help="soft-capping: bare compiled flex_attention next to the helper and hand-written")
    parser.add_argument("--keep-cache", action="store_true", help="use the inductor cache of earlier runs")
    args = parser.parse_args()
    if args.keep_cache:
        report(args)
    else:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            report(args)


def report(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, {args.threads} threads, fp32, no grad; "
          f"errors are max |x - hand-written|; compile = first call minus a steady call, "
          f"{'inductor cache kept' if args.keep_cache else 'fresh inductor cache'}")
    if args.forms:
        print(f"{'form':15s} {'B,H,L,D':>15s} {'hand ms':>9s} {'sdpa ms':>9s} {'flex ms':>9s} {'flex/hand':>9s} "
              f"{'flex/sdpa':>9s} {'sdpa err':>9s} {'flex err':>9s} {'compile s':>9s} {'break-even':>10s}")
    for name in args.forms:
        window = name == "window"
        shape = (args.window_batch if window else args.batch, args.heads, args.window_seq if window else args.seq,
                 args.dim)
        r = run_form(name, shape, threads=args.threads)
        sdpa = (f"{r['sdpa_ms']:9.1f}", f"{r['flex_vs_sdpa']:8.2f}x", f"{r['sdpa_max_err']:9.1e}") if "sdpa_ms" in r \
            else (f"{'n/a':>9s}",) * 3
        print(f"{r['form']:15s} {','.join(map(str, shape)):>15s} {r['hand_written_ms']:9.1f} {sdpa[0]} "
              f"{r['flex_ms']:9.1f} {r['flex_speedup']:8.2f}x {sdpa[1]} {sdpa[2]} {r['flex_max_err']:9.1e} "
              f"{r['compile_s']:9.1f} {r['break_even_calls'] or '-':>10}", flush=True)
        for message in r["helper_warnings"]:
            print(f"  warning: {message}")
    if args.overhead:
        shape = (args.batch, args.heads, args.seq, args.dim)
        record = overhead(shape, args.threads)
        print(f"\nsoft-capping alone, {','.join(map(str, shape))}: hand-written / each, median of per-round ratios")
        for side in ("hand_written", "bare_no_block_mask", "bare_all_true_block_mask", "helper"):
            print(f"{side:26s} {record[side]['ms']:9.1f} ms {record[side]['speedup']:7.2f}x  "
                  f"max err {record[side + '_max_err']:.1e}", flush=True)
    if args.recompiles:
        print(f"\nrecompiles through the helper, 3 lengths x 2 batch sizes in turn (H,D = {args.heads},{args.dim}):")
        print(f"{'form':16s} {'dynamic':>8s} {'B':>3s} {'length':>7s} {'graphs':>7s} {'1st call s':>10s} "
              f"{'2nd call ms':>11s} {'masks':>6s}  eager since")
        for row in recompiles([512, 768, 1024], [1, 2], (args.heads, args.dim)):
            print(f"{row['form']:16s} {str(row['dynamic']):>8s} {row['batch']:3d} {row['length']:7d} "
                  f"{row['graphs']:7d} {row['first_call_s']:10.2f} {row['second_call_ms']:11.1f} "
                  f"{row['block_masks']:6d}  {(row['eager'] or '-')[:60]}", flush=True)

if __name__ == "__main__":
    main()
