"""One FP8 block GEMM launched a few times, eagerly, for a profiler to attach to (ncu), e.g.

  ncu --set full -k regex:fp8_gemm --launch-skip 1 --launch-count 1 -o gemm \\
      python benchmarks/gemm/profile_gemm.py --schedule sm_120a --m 4096 --n 4096 --k 4096

Same inputs as bench_gemm.py (make_activations / make_weights); --schedule sm_120a runs the SM120 schedule
compiled for this sm_90a GPU. Prints the op's time from CUDA events (L2 not flushed) and its TFLOP/s, so a run
without a profiler says something too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import events_us  # noqa: E402

import dsv4_jit  # noqa: E402
from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.gemm import ops  # noqa: E402
from dsv4_jit.kernels.gemm.family import make_activations, make_weights  # noqa: E402
from dsv4_jit.spec import get_spec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="sm_90a", choices=["sm_90a", "sm_120a"])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--large-tile", type=int, nargs=3, metavar=("BM", "BN", "THREADS"), default=None,
                    help="sweep: the M > 256 tile (patched into fp8_gemm._LARGE_TILE)")
    ap.add_argument("--wgmma-tile", type=int, nargs=4, metavar=("BM", "BN", "THREADS", "STAGES"), default=None,
                    help="sweep: Hopper's WGMMA large-M form (patched into fp8_gemm._WGMMA_TILE)")
    ap.add_argument("--check", action="store_true", help="also print the max per-row error against float64")
    args = ap.parse_args()
    if args.large_tile or args.wgmma_tile:
        from dsv4_jit import jit
        from dsv4_jit.kernels.gemm import fp8_gemm as kmod
        if args.large_tile:
            kmod._LARGE_TILE = tuple(args.large_tile)
        if args.wgmma_tile:
            kmod._WGMMA_TILE = tuple(args.wgmma_tile)
        jit._SELECT_MEMO.clear()
    hopper = get_profile("sm_90a")
    prof = hopper if args.schedule == "sm_90a" else get_profile("sm_120a").emulated(hopper)
    g = torch.Generator(device="cuda").manual_seed(0)
    a, sa = make_activations(args.m, args.k, g, "cuda")
    b, sb = make_weights(1, args.n, args.k, g, "cuda")
    c = torch.empty(args.m, args.n, dtype=torch.bfloat16, device="cuda")
    numel = ops.fp8_gemm_workspace_numel(args.n, args.k, args.m, arch=prof)
    ws = torch.empty(numel, device="cuda") if numel else None
    kw = dict(arch=prof, get_kernel=dsv4_jit.kernel_getter(prof), out=c, workspace=ws)
    us = events_us(lambda: ops.fp8_gemm(a, sa, b, sb, **kw), args.launches)
    err = ""
    if args.check:
        from dsv4_jit.kernels.gemm.reference import ref_fp8_gemm
        ref = ref_fp8_gemm(a, sa, b, sb)
        err = f", max row error {((c.double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item():.1e}"
    v = get_spec("fp8_gemm").select(prof, {"n": args.n, "k": args.k}, args.m)
    print(f"{args.schedule} M={args.m} N={args.n} K={args.k} {v.name}: {us:.1f} us a call, "
          f"{2 * args.m * args.n * args.k / (us * 1e-6) / 1e12:.1f} TFLOP/s{err}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
