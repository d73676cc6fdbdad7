"""Schedule sweep on the GPU for Hopper's large-M `fp8_gemm` (M > 256, WGMMA): N tile width x N tiles a CTA
(x pipeline stages x rasterization panel, where given), for every FP8 weight shape of V4-Flash TP 1 and V4-Pro TP 8
(kernels/gemm/family.py: gemm_shapes), each candidate checked against the float64 reference (M <= 2,048) and timed
as one CUDA-graph replay with L2 flushed, beside torch's blockwise `_scaled_mm` (cuBLAS) on the same operands.
`<- select` marks what `gemm_params` picks. Its run on an H100 (2026-11-26) set `tiles_per_cta`'s wave rule.

    python benchmarks/gemm/sweep_gemm_large_m.py --m 2048 8192 -j 16 --out bench_out/sweep_gemm_large_m.json
    python benchmarks/gemm/sweep_gemm_large_m.py --block-n 128 --tiles-per-cta 0 --stages 4 5 --panel 4 10 16

`--tiles-per-cta 0` keeps select's count; `--stages` and `--panel` (the CTA rasterization's panel width,
T.use_swizzle) vary the select's pick only.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.gemm.bench_gemm import probe_torch, torch_scaled_mm  # noqa: E402
from benchmarks.harness import compile_job, graph_us_or_reason  # noqa: E402

from dsv4_jit import jit  # noqa: E402
from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.gemm import fp8_gemm as gk  # noqa: E402
from dsv4_jit.kernels.gemm.family import gemm_shapes, make_activations, make_weights  # noqa: E402
from dsv4_jit.kernels.gemm.reference import ref_fp8_gemm  # noqa: E402
from dsv4_jit.model_config import load_model_config  # noqa: E402
from dsv4_jit.spec import Variant, get_spec  # noqa: E402

GEMM = get_spec("fp8_gemm")


def candidates(prof, n: int, k: int, groups: int, m: int, widths: list[int], counts: list[int],
               small_tile: bool = False, stages: list[int] | None = None,
               panels: list[int] | None = None, tall: list[int] | None = None) -> tuple[dict, list]:
    """(what select picks, the candidates: select's params with block_n and tiles_per_cta (0: select's) swapped in;
    with small_tile also the 64 x 64 WGMMA tile over one consumer warp group, two CTAs an SM, that select takes up
    to 128 rows; with stages / panels select's pick at each stage count and rasterization panel; with tall the
    192 x 128 tile over three consumer warp groups at each of those tiles-a-CTA counts)."""
    base = gk.gemm_params(prof, n, k, m, groups)
    out = []
    for st in stages or []:
        for pn in panels or [None]:
            p = {**base, "stages": st}
            if pn is not None and pn != gk.WGMMA_PANEL:   # the builder's default is left out of the params
                p["panel"] = pn
            if p not in out:
                out.append(p)
    if small_tile and n % 64 == 0:
        for t in counts:
            t = t or base.get("tiles_per_cta", 1)
            if (n // 64) % t == 0:
                out.append({**base, "block_m": 64, "block_n": 64, "threads": 128, "tiles_per_cta": t})
    for t in tall or []:
        if (n // 128) % t == 0:
            out.append({**base, "block_m": 192, "block_n": 128, "threads": 384, "tiles_per_cta": t,
                        "stages": gk.wgmma_stages(k // gk.BLOCK_K, t)})
    for bn in widths:
        for t in counts:
            t = t or base.get("tiles_per_cta", 1)
            if n % bn or (n // bn) % t:
                continue
            p = {**base, "block_n": bn, "tiles_per_cta": t}
            if p not in out:
                out.append(p)
    return base, out + ([base] if base not in out else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--block-n", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--tiles-per-cta", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--small-tile", action="store_true", help="also the 64 x 64 tile (one consumer warp group)")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="select's pick at these pipeline depths")
    ap.add_argument("--tall", type=int, nargs="*", default=None,
                    help="also the 192 x 128 tile (three consumer warp groups) at these tiles-a-CTA counts")
    ap.add_argument("--panel", type=int, nargs="+", default=None,
                    help="with --stages: these rasterization panel widths (T.use_swizzle; 10 is the default)")
    ap.add_argument("--models", nargs="+", default=["deepseek-v4-flash:1", "deepseek-v4-pro:8"],
                    help="MODEL:TP pairs whose FP8 weight shapes are swept")
    ap.add_argument("--shape", default="", help="only the shapes whose label contains this text")
    ap.add_argument("-j", "--jobs", type=int, default=16)
    ap.add_argument("--out", default="bench_out/sweep_gemm_large_m.json")
    args = ap.parse_args()
    if args.panel and not args.stages:
        raise SystemExit("--panel varies select's pick at each --stages count: give --stages too")
    pairs = [x.rsplit(":", 1) for x in args.models]
    if any(len(x) != 2 or not x[1].isdigit() for x in pairs):
        raise SystemExit(f"--models: MODEL:TP pairs, e.g. deepseek-v4-pro:8 (got {args.models})")
    if not torch.cuda.is_available():
        raise SystemExit("sweep_gemm_large_m.py needs a CUDA GPU (Hopper)")
    if min(args.m) <= gk.SPLIT_MAX_M:
        raise SystemExit(f"--m: the large-M form starts past M = {gk.SPLIT_MAX_M}")
    prof = get_profile("sm_90a")
    plan = []
    for model, tp in ((x[0], int(x[1])) for x in pairs):
        for s in gemm_shapes(load_model_config(model), tp):
            if args.shape not in s["label"]:
                continue
            for m in args.m:
                base, cands = candidates(prof, s["n"], s["k"], s["groups"], m, args.block_n, args.tiles_per_cta,
                                         args.small_tile, args.stages, args.panel, args.tall)
                plan.append((model[12:], tp, s, m, base, cands))
    jobs = sorted({json.dumps(p, sort_keys=True) for *_, cands in plan for p in cands})
    with ProcessPoolExecutor(args.jobs) as ex:
        for msg in ex.map(compile_job, [(GEMM.name, json.loads(p), prof.name, prof.schedule) for p in jobs]):
            if not msg.startswith("compiled"):
                print(msg, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    torch_ok = probe_torch("cuda").get("blockwise") is None
    rows = []
    for mdl, tp, s, m, base, cands in plan:
        n, k, groups = s["n"], s["k"], s["groups"]
        b, sb = make_weights(groups, n, k, g, "cuda")
        a, sa = make_activations(m, groups * k, g, "cuda")
        ref = ref_fp8_gemm(a, sa, b, sb, groups=groups) if m <= 2048 else None
        c = torch.empty(m, groups * n, dtype=torch.bfloat16, device="cuda")
        cublas_us = graph_us_or_reason(torch_scaled_mm(a, sa, b, sb, groups, "blockwise"), reps=3)[0] \
            if torch_ok else None
        print(f"{mdl} TP{tp} {s['label'][:22]:<22} M={m:<5} cuBLAS blockwise: "
              f"{'-' if cublas_us is None else round(cublas_us, 1)} us", flush=True)
        for p in cands:
            row = {"model": mdl, "tp": tp, "shape": s["label"], "m": m, "params": p, "selected": p == base,
                   "cublas_us": cublas_us}
            try:
                kern = jit.load(GEMM, Variant.make(GEMM.name, p, prof, prof.schedule))
            except Exception as e:  # a candidate that does not build: keep going
                row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                rows.append(row)
                continue
            kern(a, sa, b, sb, c)
            torch.cuda.synchronize()
            err = None if ref is None else float(((c.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
            us, why = graph_us_or_reason(lambda: kern(a, sa, b, sb, c), reps=3)
            tf = 2.0 * m * groups * n * k / (us * 1e-6) / 1e12 if us else None
            row.update(us=us, why=why, tflops=tf, max_token_rel_err=err)
            rows.append(row)
            print(f"{mdl} TP{tp} {s['label'][:22]:<22} M={m:<5} bm={p['block_m']:<3} bn={p['block_n']:<3} "
                  f"tpc={p.get('tiles_per_cta', 1)} st={p['stages']} panel={p.get('panel', gk.WGMMA_PANEL)}: "
                  f"{us if us is None else round(us, 1)} us {tf if tf is None else round(tf)} TFLOP/s err "
                  f"{'-' if err is None else f'{err:.1e}'}{'  <- select' if row['selected'] else ''}", flush=True)
        del a, sa, b, sb, c, ref
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
