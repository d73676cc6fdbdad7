"""Schedule sweep on the GPU for decode-size `fp8_gemm` (M <= 64): candidate N tiles, split-K counts, pipeline
stages and the main loop (T.Pipelined or the cp.async ring), each checked against the float64 reference and timed, for every FP8 weight shape
of a model at one TP (kernels/gemm/family.py: gemm_shapes).

Candidates are Variants built by hand (not through `select`), compiled for this GPU with the schedule family
named by --schedule (sm_120a: the SM12x budget and pass configs, compiled for sm_90a). Time = one CUDA-graph
replay of the op (GEMM, + reduce where a split variant does not sum in its launch), L2 flushed before it, as bench_gemm. The `floor` row is the same
timer around a graph of one 1-element kernel: what any single-launch op costs here before it moves a byte.

    python benchmarks/gemm/sweep_gemm_decode.py --schedule sm_120a --m 1 64 -j 16 --out bench_out/sweep_gemm.json
    python benchmarks/gemm/sweep_gemm_decode.py --schedule sm_90a --model deepseek-v4-pro --tp 8 --m 1 8 32 \
        --picked-only --fill -j 14      (the pick with and without fill)
    python benchmarks/gemm/sweep_gemm_decode.py --schedule sm_90a --m 64 --picked-only --wgmma --pdl-ab -j 15
                                        (Hopper's WGMMA tiles without PDL and with each L2 prefetch depth)
    python benchmarks/gemm/sweep_gemm_decode.py --schedule sm_90a --model deepseek-v4-pro --tp 8 --n 2048 768 \
        --m 64 --wgmma-splits -j 15     (the pick against the PDL WGMMA tile at every split)
    python benchmarks/gemm/sweep_gemm_decode.py --schedule sm_90a --picked-only --rows --m 1 4 8 -j 15
                                        (the pick against the rows form at each column tile and warp count;
                                        --m 16 32 64: the form with all M tokens in one CTA row)
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import compile_job, copy_bandwidth_gbs, graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit import jit  # noqa: E402
from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.gemm import fp8_gemm as gk  # noqa: E402
from dsv4_jit.kernels.gemm import fp8_gemm_rows as rows  # noqa: E402
from dsv4_jit.kernels.gemm.ops import split_tiles  # noqa: E402
from dsv4_jit.spec import Variant, get_spec  # noqa: E402

GEMM, REDUCE = get_spec("fp8_gemm"), get_spec("fp8_gemm_reduce")


def candidates(prof, n: int, k: int, groups: int, m: int, args) -> list[dict]:
    """Hand-built decode params around what gemm_params picks (which is always included)."""
    kb = k // gk.BLOCK_K
    picked = gk.gemm_params(prof, n, k, m, groups)
    block_ms = [bm for bm in args.block_m if bm >= m or bm == gk.DECODE_MAX_M] if args.block_m else \
        [picked["block_m"]]
    out = [picked]
    if not picked.get("wgmma"):
        for bm in block_ms:   # the pick with another M tile (its ring depth refitted)
            q = {**picked, "block_m": bm}
            out.append({**q, **gk.ring_stages(q)} if q.get("ring") else q)
    budget, most = gk._STAGE_BUDGET
    splits = [d for d in range(1, kb + 1) if kb % d == 0]
    if args.wgmma and prof.has_wgmma:
        # Hopper's WGMMA form (TMA, warp specialization) at decode sizes: the 64 x 64 tile at each split, and
        # wgmma_params' own pick from both N-tile rules
        for split in ([] if args.pdl_ab else splits):
            ctas = groups * (n // 64) * split
            if split == 1 or prof.num_sms_hint // 2 <= ctas <= args.max_waves * prof.num_sms_hint:
                out.append({"n": n, "k": k, "groups": groups, "block_m": 64, "block_n": 64, "split": split,
                            "threads": 128, "stages": max(1, min(4, kb // split)), "wgmma": True})
        for dbn in (64, 128):
            d_split = gk.decode_split(groups * n // dbn, kb, prof.num_sms_hint)
            out.append(gk.wgmma_params(n, k, kb, groups, max(m, 65), dbn, d_split, prof.num_sms_hint))
        if m <= gk.DECODE_MAX_M and n % 128 == 0:
            # 64 x 128 tiles over two consumer warp groups (each a 64 x 64 slice): the activation tile is read
            # by half the CTAs; split as wgmma_params counts it, and one step more
            share, of = gk.WGMMA_DECODE_SM_SHARE
            s0 = gk.decode_split(groups * n // 128, kb, -(-share * prof.num_sms_hint // of))
            for split in sorted({s0, *[d for d in splits if d > s0][:1]}):
                for st in (3, 4):
                    out.append({"n": n, "k": k, "groups": groups, "block_m": 64, "block_n": 128, "split": split,
                                "threads": 256, "stages": max(1, min(st, kb // split)), "wgmma": True})
        # --pdl-ab: the pick, and the 64-row WGMMA candidates of the fewest splits each without PDL and with it,
        # prefetching into L2 before the grid sync the first `stages` K blocks of the CTA's weight rows or its whole
        # share (fp8_gemm's pdl_prefetch)
        if args.pdl_ab:
            def least_split(q):   # the fewest splits among the 64-row candidates of q's N tile
                return q["split"] == min(r["split"] for r in out if r.get("wgmma") and r["block_m"] == 64
                                         and r["block_n"] == q["block_n"])
            keep = [{q_: v for q_, v in q.items() if q_ != "pdl_prefetch"} for q in out
                    if q.get("wgmma") and q["block_m"] == 64 and least_split(q) and q["stages"] == min(4, kb // q["split"])]
            out = [picked] + keep + [{**q, "pdl_prefetch": pf} for q in keep
                                     for pf in sorted({q["stages"], kb // q["split"]})]
    if args.swap and prof.has_wgmma and m <= gk.DECODE_MAX_M:
        # the decode ring's WGMMA form (fp8_gemm's swap: 64 weight rows as wgmma's M, the tokens its N) at the split
        # decode_split counts for 64-column tiles and its neighbouring divisors, with and without fill where it holds
        # the share; --swap-block-m: token tiles of that many rows (M / block_m of them a weight tile)
        bm = args.swap_block_m or next(b for b in (16, 32, 64) if b >= m)
        m_tiles = -(-m // bm)
        s0 = gk.decode_split(m_tiles * groups * n // 64, kb, prof.num_sms_hint)
        i0 = splits.index(s0)
        for split in splits[max(0, i0 - 1): i0 + 2]:
            q = gk.swap_ring_params(n, k, groups, bm, split)
            out.append(q)
            if gk.ring_fill(q, m_tiles, prof.num_sms_hint):
                out.append({**q, "fill": True})
    if args.wgmma_splits and prof.has_wgmma and m <= gk.DECODE_MAX_M:
        # the pick and the 64 x 64 WGMMA tile as select builds it (PDL, first stages prefetched) at each split
        # giving from half to twice the SMs' CTAs
        out = [picked]
        for split in splits:
            ctas = groups * (n // 64) * split
            if prof.num_sms_hint // 2 <= ctas <= 2 * prof.num_sms_hint:
                st = gk.wgmma_stages(kb // split, 1)
                out.append({"n": n, "k": k, "groups": groups, "block_m": 64, "block_n": 64, "split": split,
                            "threads": 128, "stages": st, "wgmma": True, "pdl_prefetch": st})
        return list({str(sorted(p.items())): p for p in out}.values())
    for block_m, bn, split, ring, ks, thr in itertools.product(block_ms, args.block_n, splits, args.ring,
                                                               args.k_stage, args.threads):
        if args.picked_only:
            break
        ctas = groups * (n // bn) * split
        if n % bn or (kb // split) % ks or (ks > 1 and not ring) or (thr > 128 and bn < 128) or (thr > 128 and not ring):
            continue
        if not prof.num_sms_hint // 2 <= ctas <= args.max_waves * prof.num_sms_hint and split != 1:
            continue
        p = {"n": n, "k": k, "groups": groups, "block_m": block_m, "block_n": bn, "split": split, "threads": thr,
             "stages": 1}
        if ring:
            p.update(ring=True, k_stage=ks)
        p["stages"] = gk.fitting_stages(p, budget, most)
        if gk.gemm_smem_bytes(p) <= min(budget, prof.max_smem_per_block):
            out.append(p)
    if args.rows and m <= rows.BLOCK_MS[-1]:
        # the rows form (fp8_gemm_rows): cols weight rows a CTA over the whole K, warps splitting K, the M tokens in
        # one CTA row (block_m: the fewest n8 halves holding them); each warp's whole share in its ring where it
        # fits the stage budget, else the deepest ring that fits
        bm = next(b for b in rows.BLOCK_MS if b >= m)
        warp_counts = [d for d in range(rows.MAX_WARPS, 0, -1) if kb % d == 0][:3]
        cap = min(budget, prof.max_smem_per_block)
        for cols in rows.COLS:
            for warps in warp_counts:
                if n % cols or groups * n // cols < prof.num_sms_hint // 2:
                    continue
                q = rows.rows_params(n, k, groups, cap, cols, warps, bm)
                if (q["stages"] >= 2 or rows.rows_fill(q)) and rows.rows_smem_bytes(q) <= cap:
                    out.append(q)
    if args.fill:   # each ring candidate whose share fits its ring, with and without `fill` (see fp8_gemm.ring_fill)
        for p in list(out):
            if gk.ring_holds_share(p):
                out += [{**p, "fill": True}, {q: v for q, v in p.items() if q != "fill"}]
    return list({str(sorted(p.items())): p for p in out}.values())


def floor_us() -> float:
    x = torch.zeros(1, device="cuda")
    us, _ = graph_us_or_reason(lambda: x.add_(1), reps=1)
    return us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="sm_120a", help="sm_120a (SM12x budget, compiled for sm_90a) or sm_90a")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--block-m", type=int, nargs="+", default=None,
                    help="M tiles to try (those >= M, and 64); default: gemm_params' rule (16 up to M = 16, else 64)")
    ap.add_argument("--block-n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--picked-only", action="store_true",
                    help="only the pick, the pick with each --block-m, and (--wgmma) the WGMMA forms")
    ap.add_argument("--wgmma", action="store_true", help="also Hopper's WGMMA form at decode sizes (sm_90a only)")
    ap.add_argument("--n", type=int, nargs="+", default=None, help="only the shapes with these N")
    ap.add_argument("--pdl-ab", action="store_true", help="with --wgmma: only the pick and the 64-row WGMMA tiles "
                    "(64 and 128 columns) of the fewest splits, each without PDL and with pdl_prefetch = its stages "
                    "and = its whole K share")
    ap.add_argument("--wgmma-splits", action="store_true", help="only the pick and Hopper's 64 x 64 WGMMA tile with "
                    "PDL at every split from half to twice the SMs' CTAs (M <= 64)")
    ap.add_argument("--swap", action="store_true", help="also the decode ring's WGMMA form (sm_90a: 64 weight rows "
                    "as wgmma's M, the tokens its N) at decode_split's split and its neighbours")
    ap.add_argument("--swap-block-m", type=int, default=None, choices=(8, 16, 32, 64),
                    help="with --swap: token tiles of this many rows (default: the fewest of 16 / 32 / 64 holding M)")
    ap.add_argument("--fill", action="store_true", help="each ring candidate whose K share fits its ring both with "
                    "its whole share requested before the grid sync (fill) and with the first stages - 1")
    ap.add_argument("--rows", action="store_true", help="also the rows form at up to 64 tokens (fp8_gemm_rows: a "
                    "CTA's weight rows over the whole K, its warps splitting K, all M tokens a CTA) at each column "
                    "tile and warp count")
    ap.add_argument("--ring", type=int, nargs="+", default=[0, 1],
                    help="0: the T.Pipelined main loop; 1: the PDL cp.async ring with the scale prefetch")
    ap.add_argument("--k-stage", type=int, nargs="+", default=[1, 2, 4], help="K blocks per stage (ring only)")
    ap.add_argument("--threads", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--layers", type=int, default=8, help="also time this many distinct weights back to back in one "
                    "graph (a forward pass's successive layers; no L2 reuse), per GEMM")
    ap.add_argument("--max-waves", type=int, default=4, help="skip splits giving more CTAs than this many x SMs")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--out", default="bench_out/sweep_gemm_decode.json")
    args = ap.parse_args()

    from dsv4_jit.kernels.gemm.family import gemm_shapes, make_activations, make_weights
    from dsv4_jit.kernels.gemm.reference import ref_fp8_gemm
    from dsv4_jit.model_config import load_model_config
    hopper = get_profile("sm_90a")
    prof = hopper if args.schedule == "sm_90a" else get_profile(args.schedule).emulated(hopper)
    shapes = [s for s in gemm_shapes(load_model_config(args.model), args.tp) if not args.n or s["n"] in args.n]
    plan = [(s, m, candidates(prof, s["n"], s["k"], s["groups"], m, args)) for s in shapes for m in args.m]
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        jobs = [(GEMM.name, p, prof.name, prof.schedule) for _, _, cs in plan for p in cs]
        jobs.append((REDUCE.name, {"cols": gk.REDUCE_COLS, "threads": gk.REDUCE_THREADS}, prof.name, prof.schedule))
        with ProcessPoolExecutor(args.jobs) as ex:
            for msg in ex.map(compile_job, jobs):
                print(msg, flush=True)
    bw = copy_bandwidth_gbs()
    fl = floor_us()
    print(f"{torch.cuda.get_device_name()}; schedule {prof.schedule}; copy {bw:,.0f} GB/s; one-kernel graph floor "
          f"{fl:.1f} us", flush=True)
    red = jit.load(REDUCE, Variant.make(REDUCE.name, {"cols": gk.REDUCE_COLS, "threads": gk.REDUCE_THREADS}, prof,
                                        prof.schedule))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = [{"floor_us": fl, "copy_gbs": bw}]
    for s, m, cands in plan:
        n, k, groups = s["n"], s["k"], s["groups"]
        b, sb = make_weights(groups, n, k, g, "cuda")
        a, sa = make_activations(m, groups * k, g, "cuda")
        ref = ref_fp8_gemm(a, sa, b, sb, groups=groups)
        wbytes = b.numel() + sb.numel() * 4
        picked = gk.gemm_params(prof, n, k, m, groups)
        copies = [(b, sb)] + [(b.clone(), sb.clone()) for _ in range(args.layers - 1)]
        L = len(copies)
        # streaming references over the same bytes, same timer: a copy (read + write) and a read-only reduction
        dst = torch.empty_like(b)
        cp_us, _ = graph_us_or_reason(lambda: [dst.copy_(w) for w, _ in copies], reps=1)
        rd_us, _ = graph_us_or_reason(lambda: [w.view(torch.int64).sum(dtype=torch.int64) for w, _ in copies], reps=1)
        rows.append({"shape": s["label"], "n": n, "k": k, "groups": groups, "m": m, "layers": L,
                     "copy_per_layer_us": cp_us / L, "read_sum_per_layer_us": rd_us / L, "weight_bytes": wbytes})
        print(f"{s['label'][:28]:<28} {groups * k:>6}->{groups * n:<6} {wbytes / 1e6:.1f} MB: per layer of {L}: "
              f"copy {cp_us / L:.1f} us ({2 * wbytes / (cp_us / L) / 1e3:,.0f} GB/s r+w), int64 sum "
              f"{rd_us / L:.1f} us ({wbytes / (rd_us / L) / 1e3:,.0f} GB/s read)", flush=True)
        for p in cands:
            v = Variant.make(GEMM.name, p, prof, prof.schedule)
            row = {"shape": s["label"], "n": n, "k": k, "groups": groups, "m": m, "variant": v.name,
                   "selected": p == picked}
            c = torch.empty(m, groups * n, dtype=torch.bfloat16, device="cuda")
            part = torch.empty(p["split"], m, groups * n, device="cuda")
            # zeroed once; each launch that sums in place leaves them zero
            counters = torch.zeros(split_tiles(p, m), dtype=torch.int32, device="cuda")
            try:
                kern = jit.load(GEMM, v)
            except Exception as e:  # a candidate that does not build: keep going
                row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                rows.append(row)
                continue

            def f(kern=kern, split=p["split"], fold=gk.sums_in_kernel(p), c=c, part=part, counters=counters,
                  ws=copies[:1]):
                for w, ws_ in ws:
                    if split == 1:
                        kern(a, sa, w, ws_, c)
                    elif fold:
                        kern(a, sa, w, ws_, part, counters, c)
                    else:
                        kern(a, sa, w, ws_, part)
                        red(part, c)
            f()
            torch.cuda.synchronize()
            err = float(((c.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
            us, why = graph_us_or_reason(f, reps=1)
            # the better of two: the first timing after a shape's weights are made can read high
            lts = [graph_us_or_reason(lambda: f(ws=copies), reps=1)[0] for _ in range(2)]
            lus = min(lts) / L if all(lts) else None
            pct = 100 * wbytes / (us * 1e-6) / 1e9 / bw if us else None
            lpct = 100 * wbytes / (lus * 1e-6) / 1e9 / bw if lus else None
            row.update(us=us, why=why, pct_copy=pct, per_layer_us=lus, per_layer_pct_copy=lpct,
                       max_token_rel_err=err, weight_bytes=wbytes)
            rows.append(row)
            print(f"{s['label'][:28]:<28} {groups * k:>6}->{groups * n:<6} M={m:<3} bm={p['block_m']:<3} bn={p['block_n']:<3} "
                  f"split={p['split']:<3} st={p['stages']} ring={int(p.get('ring', False))} "
                  f"ks={p.get('k_stage', 1)} thr={p['threads']}{' wgmma' if p.get('wgmma') else ''}{' swap' if p.get('swap') else ''}"
                  f"{' rows' if p.get('rows') else ''}"
                  f"{' fill' if p.get('fill') else ''}{' pdl ' + str(p['pdl_prefetch']) if 'pdl_prefetch' in p else ''}: "
                  f"{us if us is None else round(us, 1)} us {pct if pct is None else round(pct, 1)}% | per layer "
                  f"{lus if lus is None else round(lus, 1)} us {lpct if lpct is None else round(lpct, 1)}% "
                  f"err {err:.1e}{'  <- select' if row['selected'] else ''}", flush=True)
        del a, sa, b, sb, copies, dst
        torch.cuda.empty_cache()
        write_rows(args.out, rows, partial=True, schedule=prof.schedule, model=args.model, tp=args.tp)
    write_rows(args.out, rows, schedule=prof.schedule, model=args.model, tp=args.tp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
