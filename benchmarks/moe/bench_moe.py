"""MXFP4 grouped expert GEMM benchmark: one MoE layer's w1+w3 and w2 grouped GEMMs of a model at one TP, with all
of its routed experts resident (V4-Flash: 256, 6 per token), at decode and prefill token counts.

Columns (us: one call per CUDA-graph replay, median of triton's do_bench, L2 flushed before each replay):
  experts         experts the routing touched (random top-k per token, as a trained router spreads decode tokens)
  ours            dsv4_jit.fp4_moe_gemm over moe_align's layout, with its block_m
  GB/s, %copy     bytes the call must read: the touched experts' packed weights and exponents (N x K / 2 + N x K / 32
                  each) + the routed activation rows and scales, + bf16 C written / time, against a measured
                  device-to-device copy (256 MiB, read + write)
  TFLOP/s         2 x routed rows x N x K / time (real rows only, not the padding)
  torch           the same GEMM by dequantizing each touched expert to bf16 and one matmul per expert (a baseline
                  that reads 4x the weight bytes; not what any engine runs)
  err             max over rows of the per-row relative error of ours vs the float64 reference (routed rows;
                  T <= 512 only: the reference dequantizes every touched expert in float64)

    python benchmarks/moe/bench_moe.py --out bench_out/moe.json [--model deepseek-v4-flash] [--tp 1]
        [--tokens 1 8 64 512 4096] [--arch sm_120a]  (an SM120 schedule emulated on this GPU)
        [--no-pdl]  (the same kernel without programmatic dependent launch, for an A/B in one call)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import copy_bandwidth_gbs, graph_us_or_reason, row_rel_err, write_rows  # noqa: E402


def random_experts(num_experts: int, n: int, k: int, g: torch.Generator):
    """Packed e2m1 weights (every byte is a valid pair) and exponents around 2^-6, as trained MXFP4 experts."""
    w = torch.randint(0, 256, (num_experts, n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sw = torch.randint(118, 124, (num_experts, n, k // 32), dtype=torch.uint8, device="cuda", generator=g)
    return w, sw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    ap.add_argument("--arch", default=None, help="schedule to run: native (default) or sm_120a (emulated)")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="sweep: every listed stage count")
    ap.add_argument("--tiles", nargs="+", default=None, metavar="BMxBN[xW]",
                    help="sweep: routed rows x weight rows a CTA (x warps a CTA) for the smallest block's token counts "
                         "(e.g. 8x64 16x64 8x64x8)")
    ap.add_argument("--no-pdl", action="store_true",
                    help="A/B: the kernel without programmatic dependent launch (a variant of its own: pdl=False)")
    ap.add_argument("--operand", default=None, choices=["float8_e4m3", "float16"],
                    help="A/B: the mma operand type of every variant (Hopper's schedule takes float16, SM12x's "
                    "float8_e4m3; e4m3 mma.sync runs emulated on Hopper)")
    ap.add_argument("--layers", type=int, default=1,
                    help="also time each GEMM per layer: one graph over this many distinct expert sets (own weights, "
                         "routing and activations), as a decode step's successive MoE layers, graph time / layers")
    ap.add_argument("--out", default="bench_out/moe.json")
    args = ap.parse_args()

    from dsv4_jit.arch import detect_arch, get_profile
    from dsv4_jit.model_config import load_model_config

    native = detect_arch()
    arch = native if args.arch is None else get_profile(args.arch).emulated(native)
    m = load_model_config(args.model)
    experts, topk = int(m.n_routed_experts), int(m.num_experts_per_tok)
    g = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}; schedule {arch.schedule} on {arch.name}; {args.model} TP{args.tp}, "
          f"{experts} experts, top-{topk}; copy bandwidth {bw:,.0f} GB/s")
    print(f"{'GEMM':>6} {'T':>5} {'experts':>7} {'bm':>3} {'bn':>3} {'ours':>8} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>7} "
          f"{'/layer':>8} {'%copy/L':>7} {'torch':>9} {'err':>8}")
    rows = []
    meta = {"schedule": arch.schedule, "arch": arch.name, "model": args.model, "tp": args.tp, "copy_gbs": bw}
    from dsv4_jit import jit
    from dsv4_jit.kernels.moe import fp4_moe_gemm as kmod
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    tiles = []
    for t in args.tiles or [None]:
        try:
            tiles.append(None if t is None else tuple(int(v) for v in t.lower().split("x")))
        except ValueError:
            ap.error(f"--tiles {t!r}: expected BMxBN[xW], e.g. 16x64")
    if args.no_pdl:   # a param of the variant (its own cache key), not a patched constant
        params = kmod.moe_params
        kmod.moe_params = lambda *a, **kw: {**params(*a, **kw), "pdl": False}
    if args.operand:   # a param of the variant as well (float8_e4m3 is the kernel's default: no key)
        params_op = kmod.moe_params
        kmod.moe_params = lambda *a, **kw: {kk: v for kk, v in {**params_op(*a, **kw), "operand": args.operand}.items()
                                            if not (kk == "operand" and v == kmod.FP8)}
    if args.operand or args.stages:   # A/Bs of the mma.sync forms: Hopper's WGMMA form (short K walks) stays out
        kmod.WGMMA_MAX_K_BLOCKS = 0
    warps0 = dict(kmod.WARPS_BY_ROWS)   # a tile without W gets the module's warps for its rows
    long0 = kmod.LONG_K_WARPS
    for tile in tiles:
        for st in args.stages or [None]:
            if st is not None:   # the sweep (patched into the kernel module; the budget still caps it)
                kmod.STAGES = st
            if tile is not None:   # the small-T block size, its column tile and its warps
                kmod.BLOCK_M_BY_TOKENS = ((kmod.BLOCK_M_BY_TOKENS[0][0], tile[0]),) + kmod.BLOCK_M_BY_TOKENS[1:]
                kmod.COLS_BY_ROWS[tile[0]] = tile[1]
                kmod.ONE_TOKEN_COLS = tile[1]   # the one-token tile of short K walks too
                kmod.WARPS_BY_ROWS[tile[0]] = tile[2] if len(tile) > 2 else warps0.get(tile[0], 4)
                kmod.LONG_K_WARPS = tile[2] if len(tile) > 2 else long0   # a W given holds for long K walks too
                # the tile holds where Hopper's few-token spread or its WGMMA form (short K walks) would replace it
                kmod.SPREAD_TOKENS = 0
                kmod.WGMMA_MAX_K_BLOCKS = 0
            jit._SELECT_MEMO.clear()   # select reads the constants: drop the memoised variants
            if args.stages or args.tiles:
                print(f"-- stages {st} tile {tile}")
            g.manual_seed(0)   # every swept tile sees the same weights, routing and activations
            rows += run_shapes(args, m, arch, experts, topk, g, bw)
            write_rows(args.out, rows, partial=True, **meta)
    write_rows(args.out, rows, **meta)


def routed_rows(t: int, experts: int, topk: int, k: int, bm: int, g):
    """Random top-k routing of t tokens and moe_align's layout of their activation rows: (ids, sorted_rows,
    block_expert, a, a_scales)."""
    from dsv4_jit.kernels.gemm.family import make_activations
    from dsv4_jit.kernels.moe import ops
    ids = torch.rand(t, experts, generator=g, device="cuda").argsort(dim=1)[:, :topk].int()
    sorted_rows, blocks = ops.moe_align(ids, experts, bm)
    x, sx = make_activations(t, k, g, "cuda")
    src = (sorted_rows.clamp(min=0) // topk).long()
    return ids, sorted_rows, blocks, x[src].contiguous(), sx[src].contiguous()


def per_layer_us(layers: int, experts: int, topk: int, n: int, k: int, t: int, bm: int, arch, g) -> float | None:
    """One graph of `layers` calls, each over its own experts' weights, routing and activations (nothing served
    from L2 across layers), L2 flushed before the replay: graph time / layers. The one-call column carries the
    replay's launch latency once a call; this carries it once a graph. Best of two timings (see below)."""
    import dsv4_jit
    from dsv4_jit.kernels.moe import ops
    sets = []
    for _ in range(layers):
        w, sw = random_experts(experts, n, k, g)
        _, _, blocks, a, sa = routed_rows(t, experts, topk, k, bm, g)
        sets.append((a, sa, w, sw, blocks, torch.empty(a.shape[0], n, dtype=torch.bfloat16, device="cuda")))
    get = dsv4_jit.kernel_getter(arch)

    def all_layers():
        for a, sa, w, sw, blocks, c in sets:
            ops.fp4_moe_gemm(a, sa, w, sw, blocks, num_tokens=t, arch=arch, get_kernel=get, out=c)
    # best of two timings: the first after the layers' weights are generated read up to 1.4 us higher at one token
    # (V4-Pro TP 8 w1+w3 on an H200, in two sweeps of alternated runs), the runs after it agreeing within 0.1 us
    times = [graph_us_or_reason(all_layers, reps=1)[0] for _ in range(2)]
    us = min((t for t in times if t is not None), default=None)
    del sets
    torch.cuda.empty_cache()
    return None if us is None else us / layers


def run_shapes(args, m, arch, experts: int, topk: int, g, bw: float) -> list:
    import dsv4_jit
    from dsv4_jit.kernels.moe import ops, reference
    from dsv4_jit.kernels.moe.fp4_moe_gemm import FP8
    from dsv4_jit.kernels.moe.family import moe_shapes
    from dsv4_jit.spec import get_spec
    rows = []
    for shape in moe_shapes(m, args.tp):
        n, k = shape["n"], shape["k"]
        w, sw = random_experts(experts, n, k, g)
        name = "w13" if "w1" in shape["label"] else "w2"
        for t in args.tokens:
            bm = ops.fp4_moe_block_m(n, k, t, arch=arch)
            ids, sorted_rows, blocks, a, sa = routed_rows(t, experts, topk, k, bm, g)
            c = torch.empty(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
            kw = dict(num_tokens=t, arch=arch, get_kernel=dsv4_jit.kernel_getter(arch), out=c)
            ours, why = graph_us_or_reason(lambda: ops.fp4_moe_gemm(a, sa, w, sw, blocks, **kw), reps=1)
            touched = sorted(set(ids.flatten().tolist()))
            per_layer = per_layer_us(args.layers, experts, topk, n, k, t, bm, arch, g) if args.layers > 1 else None
            real = t * topk
            nbytes = len(touched) * (n * k // 2 + n * k // 32) + real * (k + 4 * k // 128) + a.shape[0] * n * 2
            # torch baseline and the error, on the touched experts' rows
            be = blocks.tolist()
            err = None
            if t <= 512:   # the float64 reference dequantizes every touched expert: keep it to decode sizes
                ref = reference.ref_fp4_moe_gemm(a, sa, w, sw, blocks, bm)
                valid = sorted_rows >= 0
                err = row_rel_err(c[valid], ref[valid])
                del ref
            deq = {e: reference.dequant_expert(w, sw, e).to(torch.bfloat16) for e in touched}
            a_bf = (a.float() * sa.repeat_interleave(128, 1)).to(torch.bfloat16)
            spans = [(b * bm, (b + 1) * bm, e) for b, e in enumerate(be) if e >= 0]
            ct = torch.empty_like(c)

            def torch_step():
                for lo, hi, e in spans:
                    torch.matmul(a_bf[lo:hi], deq[e].T, out=ct[lo:hi])
            t_torch, _ = graph_us_or_reason(torch_step, reps=1)
            gbs = nbytes / (ours * 1e-6) / 1e9 if ours else None
            tflops = 2 * real * n * k / (ours * 1e-6) / 1e12 if ours else None
            p = get_spec("fp4_moe_gemm").select(arch, ops.moe_static(n, k), t).p
            pct_l = 100 * nbytes / (per_layer * 1e-6) / 1e9 / bw if per_layer else None
            row = {"gemm": name, "n": n, "k": k, "tokens": t, "experts_touched": len(touched), "block_m": bm,
                   "layers": args.layers, "ours_per_layer_us": per_layer, "ours_per_layer_pct_copy": pct_l,
                   "block_n": p["block_n"], "stages": p["stages"], "warps": p["threads"] // 32,
                   "pdl": p.get("pdl", True), "operand": p.get("operand", FP8),
                   "rows": a.shape[0], "bytes": nbytes, "ours_us": ours, "ours_gbs": gbs,
                   "ours_pct_copy": 100 * gbs / bw if gbs else None, "ours_tflops": tflops, "torch_us": t_torch,
                   "max_row_rel_err": err, "notes": [why] if why else []}
            rows.append(row)
            f = lambda v, w_=8, p=1: f"{v:>{w_}.{p}f}" if isinstance(v, float) else f"{'-':>{w_}}"  # noqa: E731
            print(f"{name:>6} {t:>5} {len(touched):>7} {bm:>3} {p['block_n']:>3} {f(ours)} {f(gbs, 7, 0)} "
                  f"{f(row['ours_pct_copy'], 6)} {f(tflops, 7)} {f(per_layer)} {f(pct_l, 7)} {f(t_torch, 9)} "
                  f"{(f'{err:.1e}' if err is not None else '-'):>8}")
            del deq
            torch.cuda.empty_cache()
        del w, sw
    return rows


if __name__ == "__main__":
    main()
