"""Every CUDA path of the attention rewrites, in one run: parity, which kernel ran, speed; results to a JSON file.

For the benchmark fixtures of attention_speedup.py, in float16 and bfloat16 on CUDA, each `--backend` variant
(sdpa, flash, flash-attn) of advisor's rewrite is loaded next to the original with the same weights and inputs:

* parity: max abs error of the original and of the variant against the original run in float32 (the variant
  passes when its error is within 1e-2 abs + rel, or no worse than 2x the original's own half-precision error);
* kernel: the attention ops the profiler saw (flash / efficient / cudnn / math SDPA kernels, flash_attn);
* speed: median forward time of original and variant, alternating rounds with torch.utils.benchmark;
* eligibility: torch's own can_use_* verdicts on a few synthetic calls next to advisor's static rules;
* flex: the forms of flex_attention.py (soft-capping, ALiBi, T5 bias, sliding window, document mask), each as
  hand-written, SDPA with a materialised mask/bias and compiled FlexAttention through `advisor_flex_attention`,
  in bfloat16 and float16: times, compile time, errors; a form that cannot run records why and fails nothing.

On a machine without CUDA it says so, writes a results file that records it, and exits 0. `--device cpu` runs
the same code on the CPU as a smoke test of the script itself (its numbers say nothing about CUDA kernels).

    python benchmarks/gpu_check.py [--seq 2048] [--out gpu_check_results.json] [--device cpu --seq 64] [--flex-only]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention_speedup import CASES, load  # noqa: E402
from flex_attention import FORMS, run_form  # noqa: E402

from advisor.backends.eligibility import backend_eligibility  # noqa: E402
from advisor.backends.tensor_eligibility import facts_from_tensors, torch_eligibility  # noqa: E402
from advisor.engine.static import analyze_source  # noqa: E402

VARIANTS = ("sdpa", "flash", "flash-attn")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
ATOL = RTOL = 1e-2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", default="gpu_check_results.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke-test this script")
    parser.add_argument("--flex-only", action="store_true", help="run only the FlexAttention comparison")
    args = parser.parse_args()
    results: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "seq": args.seq,
                     "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None}
    if args.device == "cuda" and not torch.cuda.is_available():
        results["message"] = "no CUDA device: nothing was run"
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"gpu_check: no CUDA device on this machine (torch {torch.__version__}); nothing was run. "
              f"Wrote {args.out}.")
        return 0
    results["device"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke test)"
    results["flex"] = flex_checks(args.device, args.seq, args.out, results)
    flex_failed = [f for f in results["flex"] if f.get("parity_ok") is False]
    if args.flex_only:
        print(f"gpu_check: {len(results['flex'])} flex runs, {len(flex_failed)} parity failures; wrote {args.out}")
        return 1 if flex_failed else 0
    results["eligibility"] = eligibility_checks(args.device)
    results["cases"] = []
    with tempfile.TemporaryDirectory() as folder:
        for index, (fixture, case) in enumerate(CASES.items()):
            for dtype_name, dtype in DTYPES.items():
                for variant in VARIANTS:
                    results["cases"].append(run_case(fixture, case, dtype_name, dtype, variant, args.seq,
                                                     Path(folder), index, args.device))
                    print(_summary(results["cases"][-1]), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    failed = [c for c in results["cases"] if not c.get("parity_ok", False)]
    disagreements = [e for e in results["eligibility"] if not e["static_agrees"]]
    print(f"gpu_check: {len(results['cases'])} runs, {len(failed)} parity/run failures, "
          f"{len(disagreements)} eligibility disagreements with torch, {len(flex_failed)} flex parity failures; "
          f"wrote {args.out}")
    return 1 if failed or disagreements or flex_failed else 0


def flex_checks(device: str, seq: int, out: str, results: dict) -> list[dict]:
    """Each FlexAttention form in each half dtype (float32 on the CPU smoke test); the file is rewritten after each,
    so a run cut short still leaves what it measured. A form that raises records the error, not a failure."""
    records = []
    dtypes = DTYPES if device == "cuda" else {"float32": torch.float32}
    for name in FORMS:
        shape = (1, 8, max(4096, 2 * seq), 64) if name == "window" else (2, 8, seq, 64)
        for dtype_name, dtype in dtypes.items():
            try:
                record = run_form(name, shape, device=device, dtype=dtype)
                # half precision: within 1e-2 of the hand-written block, or no further than SDPA is from it
                record["parity_ok"] = record["flex_max_err"] <= max(ATOL, 2 * record.get("sdpa_max_err", 0.0))
            except Exception as exc:  # noqa: BLE001 - flex or a form unavailable here is a result
                record = {"form": name, "shape": list(shape), "dtype": dtype_name,
                          "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            records.append(record)
            print(_flex_summary(record), flush=True)
            results["flex"] = records
            Path(out).write_text(json.dumps(results, indent=2))
    return records


def run_case(fixture: str, case, dtype_name: str, dtype: torch.dtype, variant: str, seq: int, folder: Path,
             index: int, device: str) -> dict:
    class_name, kwargs, make_inputs = case
    path = ROOT / "fixtures" / "attention" / "positive" / fixture
    source = path.read_text()
    scan = analyze_source(source, str(path), unsafe_fixes=True, backend=variant)
    emission = next((f.extra["emission"] for f in scan.findings if "emission" in f.extra), None)
    record: dict = {"fixture": fixture, "dtype": dtype_name, "variant": variant, "emission": emission}
    tag = f"{index}_{dtype_name}_{variant.replace('-', '_')}"
    original_module = load(source, f"gpu_original_{tag}", folder)
    variant_module = load(scan.fixed, f"gpu_variant_{tag}", folder)
    torch.manual_seed(0)
    original = getattr(original_module, class_name)(**kwargs).eval().to(device)
    candidate = getattr(variant_module, class_name)(**kwargs).eval().to(device)
    candidate.load_state_dict(original.state_dict())
    inputs = [x.to(device) for x in make_inputs(seq)]
    half_inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gold = original(*inputs).float()
            original.to(dtype)
            candidate.to(dtype)
            base = original(*half_inputs).float()
            out = candidate(*half_inputs).float()
        record["warnings"] = sorted({str(w.message) for w in caught})
        record["original_max_abs_err"] = (base - gold).abs().max().item()
        record["variant_max_abs_err"] = (out - gold).abs().max().item()
        record["variant_vs_original_max_abs_err"] = (out - base).abs().max().item()
        within = torch.allclose(out, gold, atol=ATOL, rtol=RTOL)
        record["parity_ok"] = within or record["variant_max_abs_err"] <= 2 * record["original_max_abs_err"]
        record["kernels"] = {"original": kernels(original, half_inputs), "variant": kernels(candidate, half_inputs)}
        record.update(timing(original, candidate, half_inputs))
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not the end of the check
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["parity_ok"] = False
    return record


def kernels(model, inputs) -> list[str]:
    """Attention-related op names the profiler recorded for one forward pass."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if inputs[0].is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        model(*inputs)
        if inputs[0].is_cuda:
            torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    return sorted(n for n in names if "attention" in n.lower() or "flash" in n.lower() or "softmax" in n.lower())


def timing(original, candidate, inputs, rounds: int = 5) -> dict:
    timers = [benchmark.Timer("model(*inputs)", globals={"model": m, "inputs": inputs})
              for m in (original, candidate)]
    medians: list[list[float]] = [[], []]
    with torch.no_grad():
        for _ in range(rounds):  # alternate, so clock and thermal drift hit both sides alike
            for side, timer in enumerate(timers):
                medians[side].append(timer.blocked_autorange(min_run_time=0.2).median)
    before, after = (sorted(m)[len(m) // 2] * 1e3 for m in medians)
    return {"original_ms": before, "variant_ms": after, "speedup": before / after}


def eligibility_checks(device: str) -> list[dict]:
    """torch's own verdicts (can_use_flash_attention/efficient with debug reasons) next to advisor's rules."""
    checks = []
    shapes = {"4-D": (2, 8, 1024, 64), "3-D": (16, 1024, 64), "head dim 320": (2, 8, 256, 320)}
    for dtype_name, dtype in {**DTYPES, "float32": torch.float32}.items():
        for shape_name, shape in shapes.items():
            for mask_name in ("none", "bool", "float", "causal"):
                q = torch.randn(shape, device=device, dtype=dtype)
                mask = None
                if mask_name == "bool":
                    mask = torch.ones(shape[-2], shape[-2], device=device, dtype=torch.bool).tril()
                elif mask_name == "float":
                    mask = torch.zeros(shape[-2], shape[-2], device=device, dtype=dtype)
                causal = mask_name == "causal"
                torch_verdicts = torch_eligibility(q, q, q, mask, 0.0, causal)
                static = backend_eligibility(facts_from_tensors(q, q, q, mask, 0.0, causal))
                agrees = all(static[k].eligible == torch_verdicts[k].eligible
                             for k in ("sdpa-flash", "sdpa-efficient"))
                checks.append({"dtype": dtype_name, "shape": shape_name, "mask": mask_name, "static_agrees": agrees,
                               "torch": {k: v.to_json() for k, v in torch_verdicts.items()},
                               "static": {k: v.to_json() for k, v in static.items()}})
    return checks


def _flex_summary(record: dict) -> str:
    head = f"flex {record['form']:10s} {record['dtype']:9s} {','.join(map(str, record['shape'])):>14s}"
    if "error" in record:
        return f"{head} ERROR {record['error'][:80]}"
    sdpa = f"sdpa {record['sdpa_ms']:.2f} ms " if "sdpa_ms" in record else ""
    return (f"{head} hand {record['hand_written_ms']:.2f} ms {sdpa}flex {record['flex_ms']:.2f} ms "
            f"({record['flex_speedup']:.2f}x hand) err {record['flex_max_err']:.1e} compile {record['compile_s']:.1f}s")


def _summary(record: dict) -> str:
    if "error" in record:
        return f"{record['fixture']:36s} {record['dtype']:9s} {record['variant']:10s} ERROR {record['error'][:80]}"
    return (f"{record['fixture']:36s} {record['dtype']:9s} {record['variant']:10s} "
            f"err {record['variant_max_abs_err']:.2e} (orig {record['original_max_abs_err']:.2e}) "
            f"{record['speedup']:5.2f}x  {','.join(record['kernels']['variant'])[:60]}")


if __name__ == "__main__":
    sys.exit(main())
