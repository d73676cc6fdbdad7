"""Hopper's decode ring on wgmma (`fp8_gemm` swap_params: the weight's 64 rows as the MMA's M, the tokens its N, the
CTA's whole K share requested before the grid dependency sync; streaming_swap_params: the share streaming through
the ring) against the pick without it, on the GPU, at every FP8 weight shape and token count where select takes it.

Time: per layer, --layers distinct weights back to back in one CUDA graph (the GEMMs of successive layers; L2
flushed before the replay), the two variants alternated --rounds times in one process (the first timings of a
shape can read higher: the table prints every round and the median). Each variant's output is checked against the
float64 reference (the worst token's relative error).

    python benchmarks/gemm/ab_gemm_swap.py --model deepseek-v4-flash deepseek-v4-pro --tp 1 8 --m 9 16 24 32 \
        --out bench_out/ab_gemm_swap.json
    python benchmarks/gemm/ab_gemm_swap.py --streaming --tp 1 2 4 8 --m 1 8 16 32   (every mma.sync ring point)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import compile_job, graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit import jit  # noqa: E402
from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.gemm import fp8_gemm as gk  # noqa: E402
from dsv4_jit.kernels.gemm import ops as gops  # noqa: E402
from dsv4_jit.spec import Variant, get_spec  # noqa: E402

GEMM, REDUCE = get_spec("fp8_gemm"), get_spec("fp8_gemm_reduce")
REDUCE_P = {"cols": gk.REDUCE_COLS, "threads": gk.REDUCE_THREADS}


def without_swap(prof, n: int, k: int, groups: int, m: int) -> dict:
    """gemm_params' pick with the wgmma ring rules (swap_params, streaming_swap_params) off."""
    saved = gk.swap_params, gk.streaming_swap_params
    gk.swap_params = gk.streaming_swap_params = lambda *a, **kw: None
    try:
        return gk.gemm_params(prof, n, k, m, groups)
    finally:
        gk.swap_params, gk.streaming_swap_params = saved


def plan(prof, models: list[str], tps: list[int], ms: list[int], rows: bool = False,
         streaming: bool = False) -> list[tuple]:
    """(model, tp, shape, M, wgmma ring params, the other side's params) at every point where select takes the wgmma
    ring (the other side: the pick with the rule off); rows: instead, every point where select takes the rows form
    and the wgmma ring would apply (the other side: the rows form); streaming: every point where select with both
    wgmma ring rules off takes the mma.sync ring (the wgmma side: fp8_gemm.streaming_candidate, whether or not
    streaming_swap_params takes it)."""
    from dsv4_jit.kernels.gemm.family import gemm_shapes
    from dsv4_jit.model_config import load_model_config
    out = []
    for model in models:
        for tp in tps:
            for s in gemm_shapes(load_model_config(model), tp):
                for m in ms:
                    pick = gk.gemm_params(prof, s["n"], s["k"], m, s["groups"])
                    if streaming:
                        base = without_swap(prof, s["n"], s["k"], s["groups"], m)
                        if base.get("ring") and m <= gk.DECODE_MID_M:
                            out.append((model, tp, s, m, gk.streaming_candidate(base, m), base))
                    elif rows:
                        ring = gk.swap_params(prof, s["n"], s["k"], s["groups"], m) if pick.get("rows") else None
                        if ring:
                            out.append((model, tp, s, m, ring, pick))
                    elif pick.get("swap"):
                        out.append((model, tp, s, m, pick, without_swap(prof, s["n"], s["k"], s["groups"], m)))
    return out


def launcher(kern, red, a, sa, c, arch, groups: int):
    """op(w, sw): the product op (fp8_gemm, its split-K sum in the launch or by fp8_gemm_reduce) with `kern` in place
    of select's pick, on a workspace of its own."""
    m, n = a.shape[0], c.shape[1] // groups
    kernels = {GEMM.name: kern, REDUCE.name: red}
    # what the op asks of a workspace at this variant's split (select's pick may split otherwise)
    ws = torch.zeros(gops.FIXUP_COUNTERS + kern.variant.p["split"] * m * groups * n, device="cuda")

    def op(w, sw):
        gops.fp8_gemm(a, sa, w, sw, arch=arch, groups=groups, out=c, workspace=ws,
                      get_kernel=lambda spec, static, num_tokens: kernels[spec.name])
    return op


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["deepseek-v4-flash", "deepseek-v4-pro"])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--m", type=int, nargs="+", default=[9, 16, 24, 32])
    ap.add_argument("--rows", action="store_true", help="the wgmma ring against the rows form where select takes the "
                    "rows form (up to 8 tokens in its domain) and the ring would apply")
    ap.add_argument("--streaming", action="store_true", help="the wgmma ring streaming a K share that does not fit "
                    "it (fp8_gemm.streaming_candidate) against the mma.sync ring, wherever select without the wgmma "
                    "ring rules takes that ring")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=int, default=14)
    ap.add_argument("--out", default="bench_out/ab_gemm_swap.json")
    args = ap.parse_args()

    from dsv4_jit.kernels.gemm.family import make_activations, make_weights
    from dsv4_jit.kernels.gemm.reference import ref_fp8_gemm
    prof = get_profile("sm_90a")
    work = plan(prof, args.model, args.tp, args.m, args.rows, args.streaming)
    jobs = {str(sorted(p.items())): (GEMM.name, p, prof.name, prof.schedule) for *_, a, b in work for p in (a, b)}
    jobs["reduce"] = (REDUCE.name, REDUCE_P, prof.name, prof.schedule)
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(args.jobs) as ex:
            for msg in ex.map(compile_job, jobs.values()):
                print(msg, flush=True)
    red = jit.load(REDUCE, Variant.make(REDUCE.name, REDUCE_P, prof, prof.schedule))
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; us a layer ({args.layers} layers a graph), {args.rounds} rounds alternated")
    rows = []
    for model, tp, s, m, pick, base in work:
        n, k, groups = s["n"], s["k"], s["groups"]
        weights = [make_weights(groups, n, k, g, "cuda") for _ in range(args.layers)]
        a, sa = make_activations(m, groups * k, g, "cuda")
        ref = ref_fp8_gemm(a, sa, *weights[0], groups=groups)
        sides = []
        other = "rows form" if args.rows else "mma.sync" if args.streaming else "without"
        for name, p in (("wgmma ring", pick), (other, base)):
            c = torch.empty(m, groups * n, dtype=torch.bfloat16, device="cuda")
            op = launcher(jit.load(GEMM, Variant.make(GEMM.name, p, prof, prof.schedule)), red, a, sa, c, prof, groups)
            op(*weights[0])
            torch.cuda.synchronize()
            err = float(((c.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
            sides.append({"name": name, "params": p, "op": op, "err": err, "us": []})
        for _ in range(args.rounds):
            for side in sides:
                us, _ = graph_us_or_reason(lambda op=side["op"]: [op(w, sw) for w, sw in weights], reps=1)
                side["us"].append(None if us is None else us / args.layers)
        label = f"{model.split('-')[-1]} TP{tp} {s['label'].split(' ')[0]} {groups * k}->{groups * n} M={m}"
        med = {}
        for side in sides:
            ok = [u for u in side["us"] if u is not None]
            med[side["name"]] = statistics.median(ok) if ok else None
            p = side["params"]
            print(f"{label:<44} {side['name']:<10} split {p['split']:<2} bm {p['block_m']:<2} st {p['stages']}: "
                  + " ".join(f"{u:7.2f}" if u else "   -   " for u in side["us"]) + f"  err {side['err']:.1e}",
                  flush=True)
            rows.append({"model": model, "tp": tp, "shape": s["label"], "n": n, "k": k, "groups": groups, "m": m,
                         "side": side["name"], "params": p, "per_layer_us": side["us"], "median_us": med[side["name"]],
                         "max_token_rel_err": side["err"]})
        del weights
        torch.cuda.empty_cache()
        write_rows(args.out, rows, partial=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
