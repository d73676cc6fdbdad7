"""Schedule sweep for the indexer top-k: hand-built variants of `indexer_topk` (one CTA per row) and
`indexer_topk_split` (a row over several CTAs) timed on bench_indexer's decode logits, with the kernel's own
GPU time from the profiler next to the graph time.

Columns per candidate (us):
  graph   the op (split: the kernel over a workspace it leaves zeroed) 20 times in one CUDA graph, per call; the logits stay
          in L2 between calls, as they do after the logits kernel in a decode step
  kernel  the top-k kernel's GPU time (torch.profiler, eager, mean of 20 launches)
Every candidate's output is checked as a set against torch.topk (reference.check_topk_sets); a wrong one is
marked WRONG and is never the best.

    python benchmarks/indexer/sweep_topk.py --contexts 8192 65536 262144 --batch 1 8 64 [--schedule sm_120a]
        --out bench_out/sweep_topk.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.indexer.bench_indexer import PAGE, RATIO, TOPK, make_inputs  # noqa: E402
from benchmarks.harness import graph_us_or_reason, profiler_kernel_us, write_rows  # noqa: E402


def candidates(arch, tokens: int, extra_resident: list[int], extra_solo: list[int]) -> list[tuple[str, dict]]:
    """(kernel, params): what select picks for both kernels, then splits x threads x resident-row sizes."""
    from dsv4_jit.kernels.indexer import topk as tk
    from dsv4_jit.spec import get_spec
    static = {"topk": TOPK, "page_size": PAGE}
    out = []
    one = get_spec("indexer_topk").select(arch, static, tokens).p
    split = get_spec("indexer_topk_split").select(arch, static, tokens).p
    for threads in (512, 1024):
        for r in sorted({one["resident"], 1024, *extra_resident}):
            p = {**one, "threads": threads, "resident": r}
            if tk.topk_smem_bytes(p) <= arch.max_smem_per_block:
                out.append(("indexer_topk", p))
        for s in (2, 4, 8, 16):
            if tokens * s > 2 * arch.num_sms_hint:
                continue
            for r in sorted({split["resident"], 2048 * (threads // 512), *extra_resident}):
                for solo in sorted({split["solo"], *extra_solo}):
                    p = {**split, "threads": threads, "splits": s, "resident": r, "solo": solo}
                    if tk.topk_split_smem_bytes(p) <= arch.max_smem_per_block:
                        out.append(("indexer_topk_split", p))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536, 262144])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--schedule", default=None, help="sm_120a: the SM120 schedule compiled for this GPU")
    ap.add_argument("--resident", type=int, nargs="*", default=[], help="extra resident-row sizes to try")
    ap.add_argument("--solo", type=int, nargs="*", default=[],
                    help="extra split-kernel `solo` sizes (rows up to this long are selected by one CTA)")
    ap.add_argument("--out", default="bench_out/sweep_topk.json")
    args = ap.parse_args()

    import dsv4_jit
    from dsv4_jit import jit
    from dsv4_jit.arch import detect_arch, get_profile, schedule_name
    from dsv4_jit.kernels.indexer import ops, reference
    from dsv4_jit.kernels.indexer import topk as tk
    from dsv4_jit.spec import Variant, get_spec
    native = detect_arch()
    arch = native if args.schedule in (None, native.name) else get_profile(args.schedule).emulated(native)
    width = max(args.contexts) // RATIO + 64
    # every candidate compiled first, in parallel (the store's per-key locks make that safe)
    import os
    from concurrent.futures import ProcessPoolExecutor
    from benchmarks.harness import compile_job
    jobs = sorted({(k, tuple(sorted(p.items()))) for b in args.batch for k, p in candidates(arch, b, args.resident, args.solo)})
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as ex:
        for msg in ex.map(compile_job, [(k, dict(p), arch.name, arch.schedule) for k, p in jobs]):
            if not msg.startswith("compiled"):
                print(msg, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}; schedule {arch.schedule} on {arch.name}")
    for ctx in args.contexts:
        for b in args.batch:
            d = make_inputs(b, ctx, width, g)
            lg = torch.empty(b, width, dtype=torch.float32, device="cuda")
            info = torch.empty(b, 3, dtype=torch.int32, device="cuda")
            dsv4_jit.indexer_decode_logits(d["q"], d["q_scale"], d["weights"], d["kv_cache"], d["seq_lens"],
                                           d["block_table"], next_n=1, arch=arch, out=lg, row_info=info)
            idx = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
            lens = torch.empty(b, dtype=torch.int32, device="cuda")
            bt = d["block_table"]
            best = None
            for kname, p in candidates(arch, b, args.resident, args.solo):
                v = Variant.make(kname, p, arch, schedule_name(arch))
                kern = jit.load(get_spec(kname), v)
                if kname == "indexer_topk":
                    fn = lambda: kern(lg, info, bt, idx, lens)  # noqa: E731
                else:
                    ws = torch.zeros(b, tk.ROW_WS, dtype=torch.int32, device="cuda")  # every launch leaves it zeroed
                    fn = lambda: kern(lg, info, bt, ws, idx, lens)  # noqa: E731
                idx.fill_(-7)
                fn()
                torch.cuda.synchronize()
                want = reference.check_topk_sets(idx, lg, info.long(), bt, TOPK, PAGE)
                ok = bool(torch.equal(want, idx.long())) and bool((lens == min(TOPK, d["comp"])).all())
                gus, why = graph_us_or_reason(fn, reps=20)
                kus = profiler_kernel_us(fn, kname)
                row = {"ctx": ctx, "batch": b, "kernel": kname, **p, "graph_us": gus, "kernel_us": kus, "ok": ok,
                       "why": why, "selected": False}
                rows.append(row)
                if ok and gus is not None and (best is None or gus < best["graph_us"]):
                    best = row
                print(f"ctx={ctx:>6} B={b:>2} {kname:<18} thr={p['threads']:>4} S={p.get('splits', 1):>2} "
                      f"res={p['resident']:>5} solo={p.get('solo', '-')!s:>5}: graph {gus if gus is None else round(gus, 1)!s:>6} "
                      f"kernel {kus if kus is None else round(kus, 1)!s:>6}{'' if ok else '  WRONG'}", flush=True)
            # what the op picks
            sel = ops.topk_splits(b, arch.num_sms_hint)
            print(f"ctx={ctx:>6} B={b:>2} best: {best['kernel'] if best else None} "
                  f"{ {k: best[k] for k in ('threads', 'splits', 'resident') if best and k in best} }; op picks "
                  f"{'indexer_topk' if sel == 1 else f'indexer_topk_split S={sel}'}", flush=True)
            del d
            torch.cuda.empty_cache()
    write_rows(args.out, rows, schedule=arch.schedule, arch=arch.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
