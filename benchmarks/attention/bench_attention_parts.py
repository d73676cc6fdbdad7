"""Where a few-token sparse MLA decode step spends its time: the op as it runs (forward + combine), the forward
kernel alone (the combine left out: its partials are not merged, so that row is timed only), and the op at other
split counts, each per layer (bench_attention's graph of --layers distinct input sets, L2 flushed), beside each
kernel's own time from the torch profiler (eager, L2 warm; a kernel launched by PDL starts before the one ahead of
it ends, so its span includes that wait). Every merged output is checked against float64.

    python benchmarks/attention/bench_attention_parts.py --heads 64 16 --batch 1 8 --splits 8 16 32 64 -j 8

Variants other than select's are built by hand (select's head block and tile, another n_splits) and compiled first
with -j processes. sm_90a schedule on this GPU, or the SM120 schedule compiled for it (--schedule sm_120a).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.attention.bench_attention import make_point  # noqa: E402
from benchmarks.harness import (compile_variants, graph_us_or_reason, profiler_kernel_us,  # noqa: E402
                                schedule_profile, write_rows)

from dsv4_jit.kernels.attention import ops, reference  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D, combine_for  # noqa: E402
from dsv4_jit.testing import per_token_rel_err  # noqa: E402


def variants(prof, heads: int, batch: int, splits: int | None):
    """(forward, combine) variants: select's at this token count, with n_splits replaced where given (the 8-warp
    kernel's forms only: the warp-specialized one keeps its own)."""
    from dsv4_jit.spec import Variant
    st = ops._static(heads, D ** -0.5, "fp8_ds_mla")
    v = ops._FWD.select(prof, st, batch)
    p = v.p
    if splits is not None and not p.get("warp_specialized"):
        p["n_splits"] = splits
    fwd = Variant.make(ops._FWD.name, p, prof)
    return fwd, combine_for(prof, fwd, batch)


def getter(fwd, comb, merge: bool):
    """get_kernel for the op: these two variants; with merge False the combine is a no-op."""
    from dsv4_jit import jit

    def get(spec, static, n):
        if spec.name == fwd.kernel:
            return jit.load(spec, fwd)
        return jit.load(spec, comb) if merge else (lambda *a: None)
    return get


def op_call(p: dict, prof, get, ws_numel: int):
    """(call, out): sparse_mla_decode over one input set with these kernels and a workspace of ws_numel."""
    (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
    out = torch.empty_like(p["q"])
    ws = torch.empty(ws_numel, device="cuda")

    def call():
        ops.sparse_mla_decode(p["q"], c1, i1, l1, p["sink"], block_size=bs1, extra_kv_cache=c2, extra_indices=i2,
                              extra_lengths=l2, extra_block_size=bs2, out=out, workspace=ws, check_indices=False,
                              arch=prof, get_kernel=get)
    return call, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--ratio", type=int, default=4)
    ap.add_argument("--splits", type=int, nargs="+", default=[], help="split counts timed beside select's")
    ap.add_argument("--schedule", default="sm_90a", choices=["sm_90a", "sm_120a"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("-j", "--jobs", type=int, default=0, help="compile every variant first with this many processes")
    ap.add_argument("--out", default="bench_out/attention_parts.json")
    args = ap.parse_args()

    prof = schedule_profile(args.schedule, "sm_90a")
    scale = D ** -0.5
    configs = [(h, b, s) for h in args.heads for b in args.batch for s in [None, *args.splits]]
    if args.jobs:
        compile_variants([v for cfg in configs for v in variants(prof, *cfg)], "sm_90a", args.jobs)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}; {args.schedule} schedule; H x B at ratio {args.ratio}, "
          f"{args.ctx // 1024}K; us a layer ({args.layers} layers a graph, L2 flushed); kernels' own us (profiler, "
          f"eager; under PDL a kernel's span includes its wait for the one before)")
    for heads in args.heads:
        for batch in args.batch:
            pts = [make_point(batch, heads, args.ctx, args.ratio, g) for _ in range(args.layers)]
            (c1, i1, l1, bs1), (c2, i2, l2, bs2) = pts[0]["lists"]
            ref = reference.ref_sparse_mla(pts[0]["q"], reference.unpack_fp8_ds_mla(c1, bs1), i1, l1,
                                           reference.unpack_fp8_ds_mla(c2, bs2), i2, l2, pts[0]["sink"], scale)
            for splits in [None, *args.splits]:
                fwd, comb = variants(prof, heads, batch, splits)
                if splits is not None and fwd.p["n_splits"] != splits:
                    continue
                ws_n = max(1, ops.variant_workspace_numel(fwd, batch))
                for merge in (True, False):
                    get = getter(fwd, comb, merge)
                    calls = [op_call(p, prof, get, ws_n) for p in pts]
                    f0, out0 = calls[0]
                    f0()
                    torch.cuda.synchronize()
                    err = (per_token_rel_err(out0, ref)[0]
                           if merge or fwd.p["n_splits"] == 1 or fwd.p.get("cluster") else None)

                    def all_layers(calls=calls):
                        for fl, _ in calls:
                            fl()
                    many, why = graph_us_or_reason(all_layers, reps=1)
                    us = None if many is None else many / len(calls)
                    k_fwd = profiler_kernel_us(f0, "sparse_mla_fwd")
                    k_comb = profiler_kernel_us(f0, "sparse_mla_combine") if merge else None
                    row = {"heads": heads, "batch": batch, "ratio": args.ratio, "ctx": args.ctx,
                           "schedule": args.schedule, "n_splits": fwd.p["n_splits"], "selected": splits is None,
                           "what": "op" if merge else "forward alone", "us": us, "why": why,
                           "fwd_kernel_us": k_fwd, "combine_kernel_us": k_comb, "max_token_rel_err": err,
                           "variant": fwd.name}
                    rows.append(row)
                    us_s = f"{us:6.2f}" if us is not None else "  fail"
                    err_s = f"{err:.1e}" if err is not None else "-"
                    ks = " ".join(f"{k} {v:5.2f}" for k, v in (("fwd", k_fwd), ("combine", k_comb)) if v is not None)
                    tag = " (select)" if splits is None else ""
                    print(f"H{heads:<3} x {batch:<3} splits {fwd.p['n_splits']:>3}{tag:<9} {row['what']:>13}: "
                          f"{us_s} us a layer   kernels: {ks}   err {err_s}", flush=True)
            pts = None
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
