"""Column tiles of the MXFP4 grouped expert GEMM (`fp4_moe_gemm`) at a few tokens, on the GPU: select's pick against
the pick without the few-token spread rule (--ab: every shape where the two differ), against the mma.sync pick where
Hopper takes the WGMMA form (--ab-wgmma), or against explicit tiles (--tiles BNxW: block_n weight rows and W warps a
CTA, at whatever row block the token count takes; BNxWxS also sets S cp.async stages a warp, as many as fit and as
the warp walks K blocks) and the WGMMA form at given ring depths (--wgmma).

Time: per layer, 8 layers' calls in one CUDA graph, each layer with its own experts' weights and routing (nothing
served from L2 across layers), L2 flushed before each replay, as bench_moe.py's per-layer column; the same weights
and routing for every tile of a shape, the tiles alternated --rounds times in one process (a shape's first timings
may read higher than the rest: compare rounds). Each tile's output is checked against the float64 reference (the
worst routed row's relative error).

    python benchmarks/moe/sweep_moe_tiles.py --ab --out bench_out/moe_tiles.json      (V4-Flash and V4-Pro, TP 1-8,
                                                                                        1-4 tokens, w1+w3 and w2)
    python benchmarks/moe/sweep_moe_tiles.py --model deepseek-v4-pro --tp 8 --tokens 1 --gemm w13 --tiles 48x8 32x8
    python benchmarks/moe/sweep_moe_tiles.py --tp 4 8 --gemm w2 --wgmma 2 3 4     (Hopper: the WGMMA form's depths)
    python benchmarks/moe/sweep_moe_tiles.py --ab-wgmma --tokens 1 8 64          (the WGMMA form against the mma.sync pick)
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))                  # the repo root: benchmarks.* imports
sys.path.insert(0, str(ROOT / "scripts"))      # gpu_pass_variants: the warmup's compile worker

from benchmarks.harness import graph_us_or_reason, row_rel_err, run_info  # noqa: E402

MODELS = ("deepseek-v4-flash", "deepseek-v4-pro")
LAYERS = 8
WITHOUT_SPREAD = "without spread"   # the tile select picks with the few-token spread rule off
WITHOUT_WGMMA = "without wgmma"     # the mma.sync tile select picks where Hopper takes the WGMMA form


def parse_tile(text: str) -> tuple[int, ...]:
    """BNxW (block_n, warps) or BNxWxS (and cp.async stages a warp)."""
    try:
        tile = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        tile = ()
    if len(tile) not in (2, 3) or min(tile) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BNxW or BNxWxS, e.g. 48x8 or 64x4x3")
    return tile


@contextmanager
def picking(tile):
    """select (8-row blocks) picks `tile`: None (as shipped), WITHOUT_SPREAD, (block_n, warps[, stages]) forced, or
    ("wgmma", stages): Hopper's WGMMA form."""
    from dsv4_jit import jit
    from dsv4_jit.kernels.moe import fp4_moe_gemm as km
    names = ("ONE_TOKEN_COLS", "NARROW_COLS", "WIDE_COLS", "LONG_K_WARPS", "SPREAD_TOKENS", "WGMMA_MAX_K_BLOCKS",
             "STAGES", "MID_TOKENS", "moe_params")
    saved = {nm: getattr(km, nm) for nm in names}
    cols, warps = dict(km.COLS_BY_ROWS), dict(km.WARPS_BY_ROWS)
    try:
        if tile == WITHOUT_WGMMA:
            km.WGMMA_MAX_K_BLOCKS = 0
        elif tile is not None:
            km.SPREAD_TOKENS = 0
        if isinstance(tile, tuple):   # a forced tile is the tile: no rule of moe_params's widens or deepens it
            km.MID_TOKENS = (0, -1)
        if isinstance(tile, tuple) and tile[0] == km.WGMMA:
            params = saved["moe_params"]

            def forced_wgmma(arch, n, k, num_tokens):
                p = params(arch, n, k, num_tokens)
                return km.wgmma_params(n, k, tile[1]) if p["block_m"] == km.ROWS[0] else p
            km.moe_params = forced_wgmma
        elif isinstance(tile, tuple):
            bn, w = tile[:2]
            if len(tile) == 3:
                km.STAGES = tile[2]
            km.WGMMA_MAX_K_BLOCKS = 0
            km.ONE_TOKEN_COLS = km.NARROW_COLS = km.WIDE_COLS = bn
            km.LONG_K_WARPS = w
            for rows in km.COLS_BY_ROWS:   # every row block's tile: the prefill token counts' 16-128 rows too
                km.COLS_BY_ROWS[rows] = bn
                km.WARPS_BY_ROWS[rows] = w
        jit._SELECT_MEMO.clear()   # select reads the constants: drop the memoised variants
        yield
    finally:
        for nm, v in saved.items():
            setattr(km, nm, v)
        km.COLS_BY_ROWS.clear()
        km.COLS_BY_ROWS.update(cols)
        km.WARPS_BY_ROWS.clear()
        km.WARPS_BY_ROWS.update(warps)
        jit._SELECT_MEMO.clear()


def shape(model: str, tp: int, gemm: str):
    from dsv4_jit.kernels.moe.family import moe_shapes
    from dsv4_jit.model_config import load_model_config
    m = load_model_config(model)
    s = next(s for s in moe_shapes(m, tp) if ("w1" in s["label"]) == (gemm == "w13"))
    return m, s["n"], s["k"]


def plan(args, arch) -> list[tuple]:
    """[(model, tp, gemm, tokens, [(tile, variant), ...])]: the shapes and the tiles timed on each."""
    from dsv4_jit.kernels.moe import ops
    from dsv4_jit.spec import get_spec
    spec = get_spec("fp4_moe_gemm")
    out = []
    for model in args.model:
        for tp in args.tp:
            for gemm in args.gemm:
                _, n, k = shape(model, tp, gemm)
                for t in args.tokens:
                    tiles = ([None, WITHOUT_SPREAD] if args.ab else [None, WITHOUT_WGMMA] if args.ab_wgmma
                             else [None] + list(args.tiles or []) + [("wgmma", st) for st in args.wgmma or []])
                    picks = []
                    for tile in tiles:
                        with picking(tile):
                            v = spec.select(arch, ops.moe_static(n, k), t)
                        if n % v.p["block_n"] == 0 and all(v != pv for _, pv in picks):
                            picks.append((tile, v))
                    if len(picks) > 1:
                        out.append((model, tp, gemm, t, picks))
    return out


def compile_all(points: list[tuple], jobs: int) -> None:
    from gpu_pass_variants import compile_in_worker
    variants = list({v: None for *_, picks in points for _, v in picks})
    with ProcessPoolExecutor(jobs) as ex:
        list(ex.map(compile_in_worker, ["fp4_moe_gemm"] * len(variants), variants))
    print(f"{len(variants)} variants compiled or cached", flush=True)


def time_point(model, tp, gemm, t, picks, arch, rounds: int) -> list[dict]:
    import dsv4_jit
    from benchmarks.moe.bench_moe import random_experts, routed_rows
    from dsv4_jit.kernels.moe import ops, reference
    m, n, k = shape(model, tp, gemm)
    experts, topk = int(m.n_routed_experts), int(m.num_experts_per_tok)
    g = torch.Generator(device="cuda").manual_seed(0)
    bm = ops.fp4_moe_block_m(n, k, t, arch=arch)
    if any(v.p["block_m"] != bm for _, v in picks):
        raise ValueError(f"sweep_moe_tiles: {t} tokens run {bm}-row blocks; the tiles here are 8-row ones")
    get = dsv4_jit.kernel_getter(arch)
    layers = []
    for _ in range(LAYERS):
        w, sw = random_experts(experts, n, k, g)
        _, rows, blocks, a, sa = routed_rows(t, experts, topk, k, bm, g)
        layers.append((a, sa, w, sw, blocks, torch.empty(a.shape[0], n, dtype=torch.bfloat16, device="cuda"), rows))
    a, sa, w, sw, blocks, _, rows = layers[0]
    valid = rows >= 0
    ref = reference.ref_fp4_moe_gemm(a, sa, w, sw, blocks, bm)[valid]
    times = {i: [] for i in range(len(picks))}
    errs = {}
    for _ in range(rounds):
        for i, (tile, _) in enumerate(picks):
            with picking(tile):
                def all_layers():
                    for a_, sa_, w_, sw_, b_, c_, _ in layers:
                        ops.fp4_moe_gemm(a_, sa_, w_, sw_, b_, num_tokens=t, arch=arch, get_kernel=get, out=c_)
                us, why = graph_us_or_reason(all_layers, reps=1)
                times[i].append(us / LAYERS if us is not None else why)
                if i not in errs:
                    c = torch.full_like(layers[0][5], float("nan"))
                    ops.fp4_moe_gemm(a, sa, w, sw, blocks, num_tokens=t, arch=arch, get_kernel=get, out=c)
                    errs[i] = row_rel_err(c[valid], ref)
    del layers, ref
    torch.cuda.empty_cache()
    rows_out = []
    for i, (tile, v) in enumerate(picks):
        label = ("pick" if tile is None else tile if isinstance(tile, str)
                 else f"wgmma {tile[1]} stages" if tile[0] == "wgmma" else "x".join(map(str, tile)))
        rows_out.append({"model": model, "tp": tp, "gemm": gemm, "n": n, "k": k, "tokens": t, "tile": label,
                         "block_n": v.p["block_n"], "warps": v.p["threads"] // 32, "stages": v.p["stages"],
                         "per_layer_us": times[i], "max_row_rel_err": errs[i]})
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--gemm", nargs="+", default=["w13", "w2"], choices=["w13", "w2"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--ab", action="store_true", help="the pick against the pick without the spread rule")
    what.add_argument("--ab-wgmma", action="store_true",
                      help="the pick against the mma.sync pick where Hopper takes the WGMMA form")
    what.add_argument("--tiles", type=parse_tile, nargs="+", help="BNxW or BNxWxS tiles timed beside the pick")
    what.add_argument("--wgmma", type=int, nargs="+", metavar="STAGES",
                      help="Hopper's WGMMA form (8-row blocks) at these ring depths, beside the pick")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default=None, help="schedule: native (default) or sm_120a (emulated)")
    ap.add_argument("-j", "--jobs", type=int, default=14)
    ap.add_argument("--out", default="bench_out/moe_tiles.json")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    from dsv4_jit.arch import detect_arch, get_profile
    native = detect_arch()
    arch = native if args.arch is None else get_profile(args.arch).emulated(native)
    points = plan(args, arch)
    print(f"{torch.cuda.get_device_name()}; schedule {arch.schedule} on {arch.name}; {len(points)} shapes where the "
          f"tiles differ; us a layer ({LAYERS} layers a graph), {args.rounds} rounds", flush=True)
    compile_all(points, args.jobs)
    rows = []
    for point in points:
        for r in time_point(*point, arch, args.rounds):
            rows.append(r)
            ts = "  ".join(f"{x:8.2f}" if isinstance(x, float) else str(x) for x in r["per_layer_us"])
            print(f"{r['model'][12:]:>5} TP{r['tp']} {r['gemm']:>3} T{r['tokens']:<2} {r['tile']:>14}: "
                  f"{r['block_n']:>3} cols x {r['warps']} warps, {r['stages']} stages  {ts}  "
                  f"err {r['max_row_rel_err']:.2e}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **run_info(), "schedule": arch.schedule,
                               "arch": arch.name, "layers": LAYERS, "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
