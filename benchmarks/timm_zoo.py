"""Model-zoo reach: how many timm models with attention advisor rewrites safely, with parity.

timm's attention modules have a fused path (`F.scaled_dot_product_attention`) and a manual one (`q = q * self.scale;
attn = q @ k.transpose(-2, -1); ...`), chosen by `TIMM_FUSED_ATTN`; this runs the manual one (`TIMM_FUSED_ATTN=0`).
The installed timm package is copied twice into a temporary folder; advisor's safe attention fixes (ADV1, no
unsafe fixes) are applied to one copy through the Python API; each model below is built in a worker process from
the original copy (random weights, eval mode, fp32, one small input) and again from the patched copy with the
original's weights and input, and the two outputs are compared (max |patched - original| <= RTOL * max |original|).

Per model: the safe patches in the classes it runs, whether its output matches, how many SDPA calls the patched
model made (a guarded patch whose SDPA path is not taken is exact but buys nothing), and the reason every unsafe or
refused attention finding in those classes gives. A model counts once, by its best finding: `safe` (and then
`parity` or `WRONG`), `unsafe`, `refused` or `no finding`. timm is not a dependency of advisor: without it the
script prints one line and exits 0.

    pip install timm && python benchmarks/timm_zoo.py [--models vit_tiny_patch16_224,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RTOL = 1e-5
# (model name, input side); a spread of timm's families whose blocks hold attention.
MODELS = [
    ("vit_tiny_patch16_224", 224), ("vit_small_patch32_224", 224), ("vit_base_patch32_224", 224),
    ("vit_little_patch16_reg4_gap_256", 256), ("vit_medium_patch16_reg4_gap_256", 256),
    ("vit_medium_patch16_gap_256", 256),
    ("vit_base_patch32_clip_224", 224), ("vit_tiny_r_s16_p8_224", 224), ("vit_relpos_small_patch16_224", 224),
    ("vit_srelpos_small_patch16_224", 224), ("vit_medium_patch16_rope_reg1_gap_256", 256),
    ("flexivit_small", 240), ("deit_tiny_patch16_224", 224), ("deit_tiny_distilled_patch16_224", 224),
    ("deit3_small_patch16_224", 224), ("beit_base_patch16_224", 224), ("beitv2_base_patch16_224", 224),
    ("swin_tiny_patch4_window7_224", 224), ("swin_s3_tiny_224", 224), ("swinv2_tiny_window8_256", 256),
    ("swinv2_cr_tiny_224", 224), ("eva02_tiny_patch14_224", 224), ("eva02_small_patch14_224", 224),
    ("cait_xxs24_224", 224), ("cait_xxs36_224", 224), ("xcit_nano_12_p16_224", 224), ("xcit_nano_12_p8_224", 224),
    ("pvt_v2_b0", 224), ("pvt_v2_b2_li", 224), ("twins_pcpvt_small", 224), ("twins_svt_small", 224),
    ("mvitv2_tiny", 224), ("levit_128s", 224), ("levit_conv_128s", 224), ("coat_lite_tiny", 224), ("coat_tiny", 224),
    ("crossvit_tiny_240", 240), ("crossvit_9_dagger_240", 240), ("convit_tiny", 224), ("tnt_s_patch16_224", 224),
    ("volo_d1_224", 224), ("maxvit_nano_rw_256", 256), ("maxvit_rmlp_pico_rw_256", 256),
    ("maxxvit_rmlp_nano_rw_256", 256), ("coatnet_nano_rw_224", 224), ("efficientformer_l1", 224),
    ("efficientformerv2_s0", 224), ("efficientvit_m0", 224), ("davit_tiny", 224), ("fastvit_sa12", 256),
    ("gcvit_xxtiny", 224), ("nest_tiny", 224), ("tiny_vit_5m_224", 224), ("visformer_tiny", 224),
    ("hiera_tiny_224", 224), ("edgenext_xx_small", 256), ("mobilevit_xxs", 256), ("nextvit_small", 224),
    ("caformer_s18", 224), ("shvit_s1", 224), ("lowformer_b0", 224), ("halonet26t", 256), ("botnet26t_256", 256),
    ("vitamin_small_224", 224), ("samvit_base_patch16_224", 224), ("vit_base_patch32_siglip_256", 256),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated model names (default: the built-in list of 66)")
    parser.add_argument("--json", help="also write the per-model results here")
    parser.add_argument("--run-side", nargs=3, metavar=("ROOT", "OUT", "MODELS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_side:
        return run_side(*args.run_side)
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        print("timm_zoo: skipped (timm is not installed; pip install timm)")
        return 0
    wanted = set(args.models.split(",")) if args.models else None
    models = [(name, size) for name, size in MODELS if wanted is None or name in wanted]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="timm_zoo_") as tmp:
        original, patched = (copy_package(spec.submodule_search_locations[0], Path(tmp) / side)
                             for side in ("original", "patched"))
        findings, scan_s, fix_s = safe_fixes(patched / "timm")
        out = Path(tmp) / "outputs"
        out.mkdir()
        run_s = {}
        for side, root in (("original", original), ("patched", patched)):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-W", "ignore", __file__, "--run-side", str(root), str(out),
                            json.dumps(models)], env={**os.environ, "TIMM_FUSED_ATTN": "0"}, check=True)
            run_s[side] = time.perf_counter() - began
        ran = {side: json.loads((out / f"{side}.json").read_text()) for side in ("original", "patched")}
        rows = [judge(name, ran["original"].get(name), ran["patched"].get(name), findings, patched / "timm")
                for name, _ in models]
    report(rows)
    print(f"time: {time.perf_counter() - started:.0f} s (scan {scan_s:.0f} s, fix {fix_s:.0f} s, models "
          f"{run_s['original']:.0f} s original + {run_s['patched']:.0f} s patched)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any(row["verdict"] == "WRONG" for row in rows) else 0


def copy_package(package: str, root: Path) -> Path:
    shutil.copytree(package, root / "timm", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def safe_fixes(package: Path) -> tuple[list[dict], float, float]:
    """advisor's attention findings over the whole package (their reasons), then its safe fixes written."""
    import advisor

    began = time.perf_counter()
    scanned = advisor.scan(str(package), select=["ADV1"], unsafe_fixes=False)
    scan_s = time.perf_counter() - began
    if scanned.errors:
        print(f"timm_zoo: {len(scanned.errors)} files not scanned, first: {scanned.errors[0].to_json()}")
    began = time.perf_counter()
    advisor.fix(str(package), apply=True, select=["ADV1"], unsafe_fixes=False)
    return [f.to_json() | {"abspath": os.path.realpath(f.path)} for f in scanned.findings], scan_s, \
        time.perf_counter() - began


def run_side(root: str, out: str, models_json: str) -> int:
    """Worker: build each model from the timm copy under ROOT; the original side saves weights, input and output,
    the patched side loads them and compares."""
    sys.path.insert(0, root)
    import inspect

    import timm
    import torch

    assert os.path.realpath(timm.__file__).startswith(os.path.realpath(root)), timm.__file__
    torch.set_num_threads(1)
    side = "original" if root.rstrip("/").endswith("original") else "patched"
    sdpa_calls = count_sdpa_calls(torch)
    results = {}
    for name, size in json.loads(models_json):
        saved = Path(out) / f"{name}.pt"
        try:
            torch.manual_seed(0)
            model = timm.create_model(name, pretrained=False, num_classes=10).eval()
            classes = sorted({(os.path.relpath(inspect.getsourcefile(type(m)), Path(root) / "timm"),
                               type(m).__qualname__) for m in model.modules()
                              if type(m).__module__.startswith("timm.")})
            if side == "original":
                torch.manual_seed(1)
                x = torch.randn(2, 3, size, size)
                sdpa_calls.clear()
                with torch.no_grad():
                    y = model(x)
                torch.save({"state": model.state_dict(), "x": x, "y": y}, saved)
                results[name] = {"classes": classes, "sdpa_calls": len(sdpa_calls)}
            else:
                ref = torch.load(saved)
                model.load_state_dict(ref["state"])
                sdpa_calls.clear()
                with torch.no_grad():
                    y = model(ref["x"])
                err = (y - ref["y"]).abs().max().item()
                scale = ref["y"].abs().max().item()
                results[name] = {"classes": classes, "max_abs_err": err, "max_abs": scale,
                                 "parity": err <= RTOL * max(scale, 1.0), "sdpa_calls": len(sdpa_calls)}
        except Exception as exc:  # noqa: BLE001 - one model that fails to build or run is one row
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}"}
        print(f"  {side} {name}: {'error' if 'error' in results[name] else 'ok'}", file=sys.stderr, flush=True)
    (Path(out) / f"{side}.json").write_text(json.dumps(results))
    return 0


def count_sdpa_calls(torch) -> list:
    """A list that grows by one at each `F.scaled_dot_product_attention` call (timm and the patches call it through
    the module attribute): a safe patch whose SDPA path never runs on the model is exact but buys nothing."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    return calls


def judge(name: str, original: dict | None, patched: dict | None, findings: list[dict], package: Path) -> dict:
    """The model's findings (attention in the classes it runs, or in module-level functions of their files) and its
    verdict."""
    row = {"model": name, "verdict": "error", "safe": 0, "reasons": []}
    problem = (original or {}).get("error") or (patched or {}).get("error")
    if original is None or patched is None or problem:
        row["error"] = problem or "not run"
        return row
    classes = {(path, qualname) for path, qualname in original["classes"]}
    files = {path for path, _ in classes}
    mine = []
    for finding in findings:
        path = os.path.relpath(finding["abspath"], os.path.realpath(package))
        owner = finding["function"].split(".")[0] if finding["function"] else ""
        if (path, owner) in classes or (path in files and "." not in (finding["function"] or "")):
            mine.append(finding)
    row["safe"] = sum(f["fix_safety"] == "safe" and f["fixable"] for f in mine)
    row["reasons"] = [f"{f['function']} ({'unsafe' if f['fixable'] else 'refused'}): {short_reason(f)}"
                      for f in mine if not (f["fix_safety"] == "safe" and f["fixable"])]
    row["max_abs_err"], row["max_abs"] = patched["max_abs_err"], patched["max_abs"]
    row["sdpa_calls"] = patched["sdpa_calls"] - original["sdpa_calls"]  # the patches' own calls
    if row["safe"]:
        row["verdict"] = "parity" if patched["parity"] else "WRONG"
    elif not patched["parity"]:
        row["verdict"] = "WRONG"  # no safe patch in its classes, yet its output changed
    elif any(f["fixable"] for f in mine):
        row["verdict"] = "unsafe"
    else:
        row["verdict"] = "refused" if mine else "no finding"
    return row


def short_reason(finding: dict) -> str:
    assumed = [fact["name"] for fact in (finding.get("facts") or {}).get("assumed", [])]
    if finding["fixable"] and assumed:
        return "assumes " + ", ".join(assumed)
    return (finding.get("reason") or "").split("; the other branch")[0][:140]


def report(rows: list[dict]) -> None:
    for row in rows:
        line = f"{row['model']:34} {row['verdict']:10} safe={row['safe']}"
        if "max_abs_err" in row:
            line += f" err={row['max_abs_err']:.1e} (of max {row['max_abs']:.1e}) sdpa_calls={row['sdpa_calls']}"
        print(line + (f"  {row['error']}" if "error" in row else ""))
        for reason in row["reasons"]:
            print(f"    {reason}")
    verdicts = collections.Counter(row["verdict"] for row in rows)
    print(f"\n{len(rows)} models: safe with parity {verdicts['parity']}, wrong {verdicts['WRONG']}, unsafe "
          f"{verdicts['unsafe']}, refused {verdicts['refused']}, no finding {verdicts['no finding']}, "
          f"not built {verdicts['error']}")
    ran = sum(row["verdict"] == "parity" and row["sdpa_calls"] > 0 for row in rows)
    print(f"safe with parity and SDPA run on the model's input: {ran} (the others' SDPA path was not taken)")
    reasons = collections.Counter(reason.split(": ", 1)[1] for row in rows if row["verdict"] in ("unsafe", "refused")
                                  for reason in row["reasons"])
    print("reasons keeping models from a safe patch (findings, counted per model):")
    for reason, count in reasons.most_common(12):
        print(f"  {count:3}  {reason}")


if __name__ == "__main__":
    sys.exit(main())
