"""Schedule sweep on the GPU: candidate builds of the pre big-fuse and post kernels, timed side by side.

How the schedules in kernels/ were chosen. Each candidate is built straight from the kernel builder
(`_build_fuse` / `build_post` with explicit parameters), compiled for the GPU's arch, loaded the way
dsv4-jit loads artifacts (tvm_ffi module of the exported library) and timed two ways:
  graph: 20 launches captured in one CUDA graph, replayed under do_bench (kernel time);
  bench: do_bench of one launch (L2 flushed before each, as bench_mhc.py times the public ops).
Every candidate's outputs are compared with the first candidate's (max abs difference).

    python benchmarks/mhc/sweep_mhc_schedules.py --out bench_out/sweep.json [--tokens 64 512 4096]
        [--only fuse|post|norm_fn|pair]   (pair: the selected norm_fn + fuse, with and without PDL)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import bench_us, graph_us, write_rows  # noqa: E402
from benchmarks.mhc.inputs import EPS, HC, ITERS, MP, POST_MULT, H, M, activations, pre_weights  # noqa: E402

# (label, builder kwargs beyond the model statics)
# Results on H200 (V4-Flash, T=4096, graph us), 2026-11-22, that set the schedules in kernels/:
#  fuse (apply threads): 128: 47.7, 256: 44.3, 512: 57.7. Prefetching the residual into registers before
#    the split reduction was slower (63.8-67.9: 145 registers, 2 CTAs/SM; 46.5 when capped at 4 CTAs/SM),
#    and capping registers without it changed nothing (43.8). At T=64: 5.7 / 4.8 / 5.0.
#  post (threads x 16-byte vectors per thread): 128x1 76.4, 256x2 73.5, 128x4 73.4, 512x1 78.4,
#    64x4 75.6, 32x1 77.2; at T=64 128x1 stays best (2.4 vs 2.7).
#  norm_fn (64-token tile, 4 warps, 2 stages, 4 splits): squares re-read from x_s 48.1, from the x_f
#    registers 43.9; 3 stages 43.5, 4 stages 49.0; 128-token tiles with 8 warps 43.1, with 4 warps 77.9;
#    64-token tiles with 2 warps 82.2; 8 / 16 splits +0.2 / +2.1.
#  pair (norm_fn + fuse as mhc_pre launches them, do_bench us) without / with programmatic dependent
#    launch: T=1 12.35 / 10.66, T=8 12.77 / 11.14, T=64 14.24 / 12.61, T=512 23.04 / 21.50,
#    T=4096 91.74 / 93.09 (graph 83.0 / 85.5): norm_fn triggers only below 1024 tokens. Staging
#    hc_base / hc_scale in shared memory before the PDL wait: T=1 10.66 -> 10.14, T=64 12.61 -> 12.22.
#    64-column K steps with 128 splits at T <= 64 (norm_fn alone -0.8 us at T=1) lose in the pair
#    (T=1 11.04 vs 10.27): the fuse then sums twice the partials.
#  floors: one tiny torch launch 4.3-4.5 us under do_bench (1.05 in a graph), two dependent ones 6.1-6.2.
FUSE_CANDIDATES = [
    ("a128", dict(apply_threads=128)),
    ("a256", dict(apply_threads=256)),
    ("a512", dict(apply_threads=512)),
]
POST_CANDIDATES = [
    ("t128v1", dict(threads=128, vecs=1)),
    ("t256v2", dict(threads=256, vecs=2)),
    ("t128v4", dict(threads=128, vecs=4)),
    ("t64v4", dict(threads=64, vecs=4)),
]
# norm_fn at large T: (label, builder tiles), each at every split count of NORM_FN_SPLITS.
NORM_FN_CANDIDATES = [
    ("b64t128s2", dict(token_block=64, threads=128, stages=2)),
    ("b64t128s3", dict(token_block=64, threads=128, stages=3)),
    ("b128t256s2", dict(token_block=128, threads=256, stages=2)),
]
NORM_FN_SPLITS = (4, 8, 16)
# norm_fn at small T (< 512): (label, builder tiles, split counts).
NORM_FN_SMALL_CANDIDATES = [
    ("b32k128s4", dict(token_block=32, hidden_block=128, threads=128, stages=4), (32, 64)),
    ("b32k64s4", dict(token_block=32, hidden_block=64, threads=128, stages=4), (64, 128, 256)),
    ("b32k128s2", dict(token_block=32, hidden_block=128, threads=128, stages=2), (64,)),
]


def load_prim(prim, arch, pass_configs):
    """Compile, export and load exactly as dsv4-jit's store path does (tvm_ffi module 'main')."""
    import tilelang
    import tvm_ffi
    k = tilelang.compile(prim, target=arch.target, execution_backend="tvm_ffi", pass_configs=pass_configs)
    d = tempfile.mkdtemp(prefix="sweep-")
    k.export_library(f"{d}/kernel.so")
    return tvm_ffi.load_module(f"{d}/kernel.so")["main"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 512, 4096])
    ap.add_argument("--out", default="bench_out/sweep.json")
    ap.add_argument("--only", choices=["fuse", "post", "norm_fn", "pair"], default=None,
                    help="sweep one kernel only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to sweep")
        return 0
    import dsv4_jit
    from dsv4_jit.spec import get_spec
    from dsv4_jit.kernels.mhc import pre as pre_mod
    from dsv4_jit.kernels.mhc import post as post_mod

    arch = dsv4_jit.jit.current_arch()
    cfg_post = dict(arch.pass_configs, **{"tl.disable_vectorize_256": True})

    bench = bench_us

    statics = dict(hidden=H, hc=HC, iters=ITERS, rms_eps=EPS, hc_eps=EPS, post_mult=POST_MULT, with_norm=False,
                   norm_eps=EPS, broadcast=False, mix=M, mix_pad=MP, vec=8)
    want = lambda kernel: args.only in (None, kernel)  # noqa: E731
    fuse_fns = {} if not want("fuse") else {
        lab: load_prim(pre_mod._build_fuse(**statics, **kw), arch, dict(arch.pass_configs))
        for lab, kw in FUSE_CANDIDATES}
    post_fns = {} if not want("post") else {
        lab: load_prim(post_mod.build_post(H, HC, **kw), arch, cfg_post) for lab, kw in POST_CANDIDATES}
    large, small = max(args.tokens) >= 512, min(args.tokens) < 512
    nf_fns = {} if not (want("norm_fn") and large) else {
        (lab, sp): load_prim(pre_mod._build_norm_fn(hidden=H, hc=HC, broadcast=False, mix=M, mix_pad=MP, n_splits=sp,
                                                    hidden_block=128, **kw), arch, dict(arch.pass_configs))
        for lab, kw in NORM_FN_CANDIDATES for sp in NORM_FN_SPLITS}
    nf_small = {} if not (want("norm_fn") and small) else {
        (lab, sp): load_prim(pre_mod._build_norm_fn(hidden=H, hc=HC, broadcast=False, mix=M, mix_pad=MP, n_splits=sp,
                                                    **kw), arch, dict(arch.pass_configs))
        for lab, kw, splits in NORM_FN_SMALL_CANDIDATES for sp in splits}
    pair_fns = {}
    if args.only == "pair":
        # norm_fn variants that select() returns for the swept T, each with and without the PDL trigger
        spec = get_spec("mhc_pre_norm_fn")
        tiles = {}
        for t in args.tokens:
            p = spec.select(arch, {"hidden": H, "hc": HC, "broadcast": False}, t).p
            tiles[(p["token_block"], p["hidden_block"], p["stages"], p["n_splits"])] = p
        for pdl in (False, True):
            nfs = {k: load_prim(pre_mod._build_norm_fn(**dict(p, pdl=pdl)), arch, dict(arch.pass_configs))
                   for k, p in tiles.items()}
            fu = load_prim(pre_mod._build_fuse(**statics, apply_threads=256, pdl=pdl), arch, dict(arch.pass_configs))
            pair_fns[f"sel{'-pdl' if pdl else ''}"] = (nfs, fu)
    print(f"compiled {len(fuse_fns)} fuse, {len(post_fns)} post, {len(nf_fns) + len(nf_small)} norm_fn candidates", flush=True)

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    fn, scale, base = pre_weights(g, dev)
    rows = []
    for t in args.tokens:
        residual, x, post, comb = activations(t, g, dev)
        # norm_fn partials from the production path, then every fuse candidate on the same partials
        nf = dsv4_jit.get_kernel(get_spec("mhc_pre_norm_fn"), {"hidden": H, "hc": HC, "broadcast": False}, t)
        s = nf.variant.p["n_splits"]
        mix_part = torch.empty(s, t, MP, device=dev)
        sq_part = torch.empty(s, t, device=dev)
        nf(residual.view(t, HC * H), fn, mix_part, sq_part)
        if t == args.tokens[0]:
            # floors: what do_bench and a graph report for one and for two dependent tiny launches
            tiny = torch.zeros(16, device=dev)
            for lab, call in (("1 launch", lambda: tiny.add_(1)), ("2 launches", lambda: tiny.add_(1).add_(1))):
                r = {"kernel": "floor", "cand": lab, "T": 0, "graph_us": graph_us(call), "bench_us": bench(call),
                     "max_diff_vs_first": 0.0}
                rows.append(r)
                print(json.dumps(r), flush=True)
        ref = None
        for (lab, sp), f in (nf_fns.items() if t >= 512 else nf_small.items()):
            mp_c = torch.empty(sp, t, MP, device=dev)
            sq_c = torch.empty(sp, t, device=dev)
            call = lambda: f(residual.view(t, HC * H), fn, mp_c, sq_c)  # noqa: E731
            call()
            torch.cuda.synchronize()
            got = torch.cat([mp_c.sum(0)[:, :M], sq_c.sum(0)[:, None]], 1)
            if ref is None:
                ref = got.clone()
            diff = ((got - ref).abs() / (ref.abs() + 1e-3)).max().item()
            r = {"kernel": "norm_fn", "cand": f"{lab}-S{sp}", "T": t, "graph_us": graph_us(call), "bench_us": bench(call),
                 "max_diff_vs_first": diff}
            rows.append(r)
            print(json.dumps(r), flush=True)
        if pair_fns:
            # norm_fn (the selected tile) + fuse back to back, with and without programmatic dependent launch
            kn = nf.variant.p
            for lab, (f_nf, f_fu) in pair_fns.items():
                mpp = torch.empty(s, t, MP, device=dev)
                sqp = torch.empty(s, t, device=dev)
                outs = (torch.empty(t, H, dtype=torch.bfloat16, device=dev), torch.empty(t, HC, device=dev),
                        torch.empty(t, HC, HC, device=dev))
                f_nf_t = f_nf[(kn["token_block"], kn["hidden_block"], kn["stages"], kn["n_splits"])]
                def call(f_nf_t=f_nf_t, f_fu=f_fu, mpp=mpp, sqp=sqp, outs=outs):
                    f_nf_t(residual.view(t, HC * H), fn, mpp, sqp)
                    f_fu(mpp, sqp, residual, scale, base, *outs)
                call()
                r = {"kernel": "pair", "cand": lab, "T": t, "graph_us": graph_us(call), "bench_us": bench(call),
                     "max_diff_vs_first": 0.0}
                rows.append(r)
                print(json.dumps(r), flush=True)
        ref = None
        for lab, f in fuse_fns.items():
            outs = (torch.empty(t, H, dtype=torch.bfloat16, device=dev), torch.empty(t, HC, device=dev),
                    torch.empty(t, HC, HC, device=dev))
            call = lambda: f(mix_part, sq_part, residual, scale, base, *outs)  # noqa: E731
            call()
            torch.cuda.synchronize()
            if ref is None:
                ref = [o.clone() for o in outs]
            diff = max((o.float() - r.float()).abs().max().item() for o, r in zip(outs, ref))
            r = {"kernel": "fuse", "cand": lab, "T": t, "splits": s, "graph_us": graph_us(call), "bench_us": bench(call),
                 "max_diff_vs_first": diff}
            rows.append(r)
            print(json.dumps(r), flush=True)
        ref = None
        for lab, f in post_fns.items():
            kw = dict(POST_CANDIDATES)[lab]
            if H % (kw["threads"] * 8 * kw["vecs"]):
                continue
            out = torch.empty(t, HC, H, dtype=torch.bfloat16, device=dev)
            call = lambda: f(x, residual, post, comb, out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            diff = (out.float() - ref.float()).abs().max().item()
            r = {"kernel": "post", "cand": lab, "T": t, "graph_us": graph_us(call), "bench_us": bench(call),
                 "max_diff_vs_first": diff}
            rows.append(r)
            print(json.dumps(r), flush=True)

    print(f"\n{torch.cuda.get_device_name()}; V4-Flash shapes; us (median)")
    print(f"{'kernel':6} {'cand':14} {'T':>5} {'graph':>8} {'bench':>8} {'maxdiff':>8}")
    for r in rows:
        print(f"{r['kernel']:6} {r['cand']:14} {r['T']:>5} {r['graph_us']:8.2f} {r['bench_us']:8.2f} "
              f"{r['max_diff_vs_first']:8.2g}")
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
