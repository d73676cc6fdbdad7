"""Schedule sweep on the GPU for sparse MLA decode: candidate tiles of `sparse_mla_fwd` (heads per CTA,
candidates per tile, threads, split count), each checked against the float64 reference and timed.

Candidates are Variants built by hand (not through `select`), compiled for this GPU with the schedule
family named by --schedule (sm_120a: the SM12x budget and pass configs, compiled for sm_90a), so the
sweep can try what `select` does not pick yet. Candidates over the schedule's shared-memory budget are
listed as skipped. Time = one CUDA-graph replay of the op (fwd + combine when split), L2 flushed before it.

    python benchmarks/attention/sweep_attention_schedules.py --schedule sm_120a --heads 64 --batch 1 8 64 \
        --out bench_out/sweep_attention.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.attention.bench_attention import make_point  # noqa: E402
from benchmarks.harness import compile_job, graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit import jit  # noqa: E402
from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.attention import ops, reference  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D, combine_params  # noqa: E402
from dsv4_jit.spec import Variant, get_spec  # noqa: E402

FWD, COMBINE = get_spec("sparse_mla_fwd"), get_spec("sparse_mla_combine")


def run_variant(prof, v: Variant, p: dict, scale: float, out: torch.Tensor):
    """The op's own launch (ops.sparse_mla_decode: partials, combine or cluster merge as the variant asks) with a
    forced forward variant and its matching combine."""
    (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
    t, h = p["q"].shape[:2]
    s = v.p["n_splits"]
    kernels = {FWD.name: jit.load(FWD, v)}
    if s > 1 and not v.p.get("cluster"):
        cv = Variant.make(COMBINE.name, combine_params(h, s, t, v.p["block_i"]), prof, v.schedule)
        kernels[COMBINE.name] = jit.load(COMBINE, cv)
    ws = torch.empty(max(1, ops.partials_numel(s, t, h)), device="cuda")

    def f():
        ops.sparse_mla_decode(p["q"], c1, i1, l1, p["sink"], block_size=bs1, extra_kv_cache=c2, extra_indices=i2,
                              extra_lengths=l2, extra_block_size=bs2, softmax_scale=scale, out=out, workspace=ws,
                              check_indices=False, arch=prof, get_kernel=lambda spec, static, n: kernels[spec.name])
    return f


def fwd_params(heads: int, hb: int, bi: int, thr: int, s: int, scale: float, stages: int,
               extra: dict | None = None) -> dict:
    """A hand-built forward variant's params, spelled as select spells them (no `stages` key for the register
    path), so the selected candidate is recognised; `extra` adds keys (a null value drops one)."""
    p = {"heads": heads, "head_block": hb, "block_i": bi, "threads": thr, "kv_format": "fp8_ds_mla", "n_splits": s,
         "softmax_scale": scale}
    if stages:
        p["stages"] = stages
    for k, v in (extra or {}).items():
        if v is None:
            p.pop(k, None)
        else:
            p[k] = v
    return p


def precompile(prof, scale: float, args) -> None:
    """Every candidate forward (and its combine) into the store, in parallel."""
    from concurrent.futures import ProcessPoolExecutor
    jobs = []
    for heads, hb, bi, thr, s, ns, ex in itertools.product(args.heads, args.head_blocks, args.block_i, args.threads,
                                                          args.splits, args.stages, args.extra):
        params = fwd_params(heads, hb, bi, thr, s, scale, ns, ex)
        v = Variant.make(FWD.name, params, prof, prof.schedule)
        if hb > 2 * heads and hb > 16 or FWD.smem_bytes(v) > prof.max_smem_per_block:
            continue
        jobs.append((FWD.name, params, prof.name, prof.schedule))
        if s > 1:
            jobs += [(COMBINE.name, combine_params(heads, s, b, bi), prof.name, prof.schedule) for b in args.batch]
    jobs = list({str(j): j for j in jobs}.values())
    with ProcessPoolExecutor(args.jobs) as ex:
        for msg in ex.map(compile_job, jobs):
            print(msg, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="sm_120a", help="sm_120a (SM12x budget, compiled for sm_90a) or sm_90a")
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ratio", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--head-blocks", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--block-i", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--threads", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1],
                    help="the fp8 gather: 0 = through registers, 1-4 = cp.async stages")
    ap.add_argument("--ratios", type=int, nargs="+", default=None, help="several layer kinds (overrides --ratio)")
    ap.add_argument("-j", "--jobs", type=int, default=1,
                    help="compile every candidate first in this many processes (the store's per-key locks make "
                         "it safe); the timed loop then only loads")
    ap.add_argument("--compile-only", action="store_true",
                    help="with -j: only compile the candidates into the store (no GPU needed), e.g. on a build machine")
    ap.add_argument("--extra", type=json.loads, nargs="+", default=[{}],
                    help="JSON objects of further forward params, one candidate each (e.g. '{}' "
                         "'{\"score_chains\": 1}'; null drops a key)")
    ap.add_argument("--out", default="bench_out/sweep_attention.json")
    args = ap.parse_args()

    hopper = get_profile("sm_90a")
    prof = hopper if args.schedule == "sm_90a" else get_profile(args.schedule).emulated(hopper)
    scale = D ** -0.5
    rows = []
    if args.jobs > 1:
        precompile(prof, scale, args)
    if args.compile_only:
        return 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for ratio, heads, batch in itertools.product(args.ratios or [args.ratio], args.heads, args.batch):
        p = make_point(batch, heads, args.ctx, ratio, g)
        (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
        ref = reference.ref_sparse_mla(p["q"], reference.unpack_fp8_ds_mla(c1, bs1), i1, l1,
                                       reference.unpack_fp8_ds_mla(c2, bs2), i2, l2, p["sink"], scale)
        picked = FWD.select(prof, ops._static(heads, scale, "fp8_ds_mla"), batch)
        for hb, bi, thr, s, ns, ex in itertools.product(args.head_blocks, args.block_i, args.threads, args.splits,
                                                        args.stages, args.extra):
            params = fwd_params(heads, hb, bi, thr, s, scale, ns, ex)
            v = Variant.make(FWD.name, params, prof, prof.schedule)
            row = {"heads": heads, "batch": batch, "ratio": ratio, "ctx": args.ctx, "variant": v.name, "extra": ex,
                   "selected": v == picked}
            if hb > 2 * heads and hb > 16 or FWD.smem_bytes(v) > prof.max_smem_per_block:
                row["skipped"] = "over the budget or head block >> heads"
                rows.append(row)
                continue
            out = torch.empty_like(p["q"])
            try:
                f = run_variant(prof, v, p, scale, out)
                f()
                torch.cuda.synchronize()
            except Exception as e:  # a candidate that does not build (warp partition, registers): keep going
                row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                rows.append(row)
                print(f"{v.name}: {row['skipped']}", flush=True)
                continue
            err = float(((out.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max())
            us, why = graph_us_or_reason(f, reps=1)
            row.update(us=us, why=why, max_token_rel_err=err)
            rows.append(row)
            print(f"ratio={ratio} H={heads} B={batch} hb={hb} bi={bi} thr={thr} S={s} st={ns} {ex}: {us if us is None else round(us, 1)} us "
                  f"err {err:.1e}{'  <- select' if row['selected'] else ''}", flush=True)
            write_rows(args.out, rows, partial=True, schedule=prof.schedule, ratio=args.ratio, ctx=args.ctx)
    write_rows(args.out, rows, schedule=prof.schedule, ratio=args.ratio, ctx=args.ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
