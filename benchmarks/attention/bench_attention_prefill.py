"""Sparse MLA prefill with the sink over gathered bf16 KV rows: time and TFLOP/s per token count, each output
checked against the float64 reference (token counts up to --check-max; the reference is slow past that).

Inputs: --heads query heads, --candidates rows a token (DeepSeek V4's ratio-4 layer: 128 SWA + 512 indexer picks),
3% -1 holes, half the tokens with shorter lists. FLOPs count only the valid candidates' two GEMMs (scores and P V,
512 dims each). Time: one CUDA-graph replay of the op, L2 flushed before it. --arch sm_120a runs the SM120
schedule compiled for this sm_90a GPU (an H100 timing, never an SM120 one).

  python benchmarks/attention/bench_attention_prefill.py --tokens 512 2048 8192 --out bench_out/attention_prefill.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.jit import kernel_getter  # noqa: E402
from dsv4_jit.kernels.attention import ops, reference  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D  # noqa: E402
from dsv4_jit.spec import get_spec  # noqa: E402

KV_ROWS = 65536


def make_inputs(t: int, heads: int, cand: int, kv: torch.Tensor, g: torch.Generator) -> dict:
    q = (torch.randn(t, heads, D, device="cuda", generator=g) * 0.3).to(torch.bfloat16)
    idx = torch.randint(0, kv.shape[0], (t, cand), device="cuda", generator=g, dtype=torch.int32)
    idx[torch.rand(t, cand, device="cuda", generator=g) < 0.03] = -1
    lens = torch.randint(1, cand + 1, (t,), device="cuda", generator=g, dtype=torch.int32)
    lens[: t // 2] = cand
    return {"q": q, "idx": idx, "lens": lens, "sink": torch.randn(heads, device="cuda", generator=g)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--heads", type=int, default=64, help="query heads a rank (64 = V4-Flash TP 1)")
    ap.add_argument("--candidates", type=int, default=640)
    ap.add_argument("--arch", default="sm_90a", help="sm_90a, or sm_120a (its schedule emulated on sm_90a)")
    ap.add_argument("--check-max", type=int, default=2048, help="check against float64 up to this token count")
    ap.add_argument("--out", default="bench_out/attention_prefill.json")
    args = ap.parse_args()

    hopper = get_profile("sm_90a")
    prof = hopper if args.arch == "sm_90a" else get_profile(args.arch).emulated(hopper)
    get_kernel = kernel_getter(prof)
    scale = D ** -0.5
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = (torch.randn(KV_ROWS, D, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    spec = get_spec("sparse_mla_fwd")
    rows = []
    print(f"{torch.cuda.get_device_name()}; schedule {args.arch}; {args.heads} heads, {args.candidates} candidates")
    print(f"{'T':>6} {'variant tile':>12} {'us':>9} {'TFLOP/s':>8} {'max err':>9}")
    for t in args.tokens:
        p = make_inputs(t, args.heads, args.candidates, kv, g)
        out = torch.empty_like(p["q"])

        def f(p=p, out=out):
            ops.sparse_mla_prefill(p["q"], kv, p["idx"], p["lens"], p["sink"], out=out, check_indices=False,
                                   arch=prof, get_kernel=get_kernel)
        f()
        torch.cuda.synchronize()
        err = None
        if t <= args.check_max:
            ref = reference.ref_sparse_mla(p["q"], kv.float(), p["idx"], p["lens"], None, None, None, p["sink"], scale)
            err = float(((out.double() - ref).flatten(1).norm(dim=1)
                         / ref.flatten(1).norm(dim=1).clamp_min(1e-30)).max())
        us, why = graph_us_or_reason(f, reps=1)
        valid = int(((torch.arange(args.candidates, device="cuda")[None, :] < p["lens"][:, None])
                     & (p["idx"] >= 0)).sum())
        tflops = 2 * valid * args.heads * 2 * D / us / 1e6 if us else None
        v = spec.select(prof, ops._static(args.heads, scale, "bf16"), t)
        rows.append({"tokens": t, "heads": args.heads, "candidates": args.candidates, "variant": v.name, "us": us,
                     "why": why, "tflops": tflops, "max_token_rel_err": err})
        print(f"{t:>6} {v.p['block_i']:>12} {us if us is None else round(us, 1):>9} "
              f"{'-' if tflops is None else round(tflops)!s:>8} {'-' if err is None else f'{err:.1e}':>9}", flush=True)
    write_rows(args.out, rows, schedule=args.arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
