"""Streaming floors: the fastest this GPU moves each goal's bytes under the benchmarks' own timer, with no math.

The open goals (#9 attention, #10 indexer, #12 GEMM / MoE) are stated as a share of copy bandwidth over the bytes
a step must read: at small sizes the time budget that gives is a few microseconds, where a kernel's launch and
ramp weigh as much as its bytes. This script times the cheapest kernel that reads those bytes, in the harness
every family benchmark uses (`--layers` distinct buffers back to back in one CUDA graph, L2 flushed before the
replay, time / layers), so each goal point gets a floor that no kernel of any design can beat there:

  read/L     per layer, one kernel that reads the bytes and does nothing else: 16-byte loads, XOR-folded into one
             int a CTA (Triton: a yardstick, not a product kernel), best of a few grid and block shapes
  +dep/L     per layer, that read and one dependent 1-CTA kernel behind it (a step of two kernels: the indexer's
             logits then top-k, split attention then its combine, split-K then its reduce)
  copy/L     per layer, torch's device copy of half the bytes (read + write = the bytes): the copy the goals'
             "% of copy bandwidth" is measured with, at this size
  goal       the goal's time: bytes / (share x the 256 MiB copy bandwidth); #10: 1.5 x bytes / copy bandwidth
  read/goal  read/L over the goal's time: above 1, by how much even a read-only kernel misses the goal
  feasible   read/L <= goal: "no" means no kernel reaching the goal exists at that point, of any design, fused
             or not: a kernel that only reads the bytes is already slower than the goal's time there.
             "fused only": read/L meets the goal but +dep/L does not, so only a one-kernel step could (the
             steps that run two kernels today: #9 at small batch, split; #10, logits then top-k)

The floor is optimistic for the real steps: it reads contiguous memory (attention gathers 584 B rows from paged
memory, the MoE reads only its routed experts' weights), and it does no arithmetic.

    python benchmarks/bench_floor.py --out bench_out/floor.json [--layers 8]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mhc_bench_common import copy_bandwidth_gbs, graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit.model_config import load_model_config  # noqa: E402

KV_BYTES_PER_TOKEN = 584     # fp8_ds_mla: 448 fp8 NoPE + 64 bf16 RoPE + 8 B of scales
INDEX_K_BYTES = 132          # index-K: 128 fp8 + a 4 B fp32 scale
HEAD_DIM = 512


def goal_points(ratio_topk: int = 512, window: int = 128) -> list[dict]:
    """Each issue's goal points: bytes, the goal's time factor (seconds = bytes * factor / copy B/s) and the
    kernels the step launches in sequence."""
    pts = []
    # 9: >= 70% of copy over (valid candidates x 584 B + q + out) at batch >= 8, context >= 8K
    for heads in (64, 16):
        for ratio, ctx in ((4, 65536), (128, 8192), (128, 65536), (128, 262144)):
            cand = (ratio_topk if ratio == 4 else ctx // 128) + window
            for batch in (8, 64):
                nbytes = batch * (cand * KV_BYTES_PER_TOKEN + 2 * heads * HEAD_DIM * 2)
                pts.append({"issue": 9, "point": f"H{heads} ratio {ratio} {ctx // 1024}K x {batch}",
                            "bytes": nbytes, "factor": 1 / 0.7, "kernels": 2 if batch <= 8 else 1})
    # 10: the indexer step (logits + top-k) within 1.5x the index-K bytes floor at 64K (8K and 256K shown too)
    for ctx in (8192, 65536, 262144):
        for batch in (1, 8, 64):
            pts.append({"issue": 10, "point": f"{ctx // 1024}K x {batch}", "bytes": batch * ctx // 4 * INDEX_K_BYTES,
                        "factor": 1.5, "kernels": 2})
    # 12: decode GEMMs (M <= 64) at >= 80% of copy over the weight bytes; MXFP4 MoE the same over the touched experts
    from dsv4_jit.kernels.gemm.family import gemm_shapes
    from dsv4_jit.kernels.moe.family import moe_shapes
    for name, tp in (("deepseek-v4-flash", 1), ("deepseek-v4-pro", 8)):
        m = load_model_config(name)
        for s in gemm_shapes(m, tp):
            g, n, k = s["groups"], s["n"], s["k"]   # grouped (wo_a): g weights of n x k
            nbytes = g * (n * k + (n // 128) * (k // 128) * 4)
            pts.append({"issue": 12, "point": f"{name[12:]} TP{tp} {s['label'].split(' (')[0]} {g * k}->{g * n}",
                        "bytes": nbytes, "factor": 1 / 0.8, "kernels": 1})
        e, topk = int(m.n_routed_experts), int(m.num_experts_per_tok)
        for s in moe_shapes(m, tp):
            n, k = s["n"], s["k"]
            for t in (1, 8, 64):
                touched = e * (1 - (1 - topk / e) ** t)   # expected distinct experts of t tokens' top-k
                nbytes = int(touched * (n * k // 2 + n * k // 32))
                pts.append({"issue": 12, "point": f"{name[12:]} TP{tp} MoE {'w13' if 'w1' in s['label'] else 'w2'} "
                            f"{k}->{n} T{t}", "bytes": nbytes, "factor": 1 / 0.8, "kernels": 1})
    return pts


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        # ITERS blocks a program, all loads issued before any is folded (bytes in flight), 16-byte vectors
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in tl.static_range(ITERS):
            offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
            acc ^= tl.load(x + offs, mask=offs < n, other=0, eviction_policy="evict_first")
        tl.store(out + pid, tl.xor_sum(acc, axis=0))

    @triton.jit
    def dependent(src, dst):
        tl.store(dst, tl.load(src) + 1)

    def read(x, out, block, iters, warps):
        n = x.numel()
        stream_read[(triton.cdiv(n, block * iters),)](x, out, n, BLOCK=block, ITERS=iters, num_warps=warps)

    def dep(src, dst):
        dependent[(1,)](src, dst)
    return read, dep


READ_SHAPES = [(1024, 1, 4), (2048, 1, 8), (2048, 2, 8), (4096, 1, 8), (1024, 4, 4), (4096, 2, 8)]


def floor_us(nbytes: int, layers: int, read, dep) -> dict:
    n = max(1, nbytes // 4)
    bufs = [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda") for _ in range(layers)]
    outs = [torch.empty(max(1, -(-n // 1024)), dtype=torch.int32, device="cuda") for _ in range(layers)]
    outs2 = [torch.empty(1, dtype=torch.int32, device="cuda") for _ in range(layers)]
    best, best_shape = math.inf, None
    for shape in READ_SHAPES:
        us, _ = graph_us_or_reason(lambda: [read(b, o, *shape) for b, o in zip(bufs, outs)], reps=1)
        if us is not None and us < best:
            best, best_shape = us, shape
    dep_us, _ = graph_us_or_reason(lambda: [(read(b, o, *best_shape), dep(o, o2))
                                            for b, o, o2 in zip(bufs, outs, outs2)], reps=1)
    half = [b.view(torch.uint8)[: nbytes // 2] for b in bufs]
    dst = [torch.empty_like(h) for h in half]
    copy_us, _ = graph_us_or_reason(lambda: [d.copy_(h) for d, h in zip(dst, half)], reps=1)
    del bufs, outs, half, dst
    return {"read_us": best / layers, "read_shape": best_shape,
            "dep_us": None if dep_us is None else dep_us / layers,
            "copy_us": None if copy_us is None else copy_us / layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out/floor.json")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--issues", type=int, nargs="*", default=[9, 10, 12])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_floor.py needs a CUDA GPU")
    read, dep = _kernels()
    bw = copy_bandwidth_gbs()
    empty, _ = graph_us_or_reason(lambda: [dep(o, o) for o in [torch.zeros(1, dtype=torch.int32, device="cuda")]
                                           * args.layers], reps=1)
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {bw:,.0f} GB/s; one 1-CTA kernel per layer "
          f"{empty / args.layers:.2f} us (--layers {args.layers})")
    hdr = (f"{'issue':>5} {'point':<44} {'MB':>8} {'goal us':>8} {'read/L':>7} {'+dep/L':>7} {'copy/L':>7} "
           f"{'read %copy':>10} {'read/goal':>9} {'feasible':>10}")
    print(hdr)
    rows, cache = [], {}
    for p in goal_points():
        if p["issue"] not in args.issues:
            continue
        nb = p["bytes"]
        if nb not in cache:
            cache[nb] = floor_us(nb, args.layers, read, dep)
        f = cache[nb]
        goal = nb * p["factor"] / (bw * 1e9) * 1e6
        fits = f["read_us"] <= goal
        verdict = "no" if not fits else ("fused only" if p["kernels"] > 1 and (f["dep_us"] or 0) > goal else "yes")
        row = {**p, **f, "goal_us": goal, "read_pct_copy": 100 * nb / (f["read_us"] * 1e-6) / 1e9 / bw,
               "feasible": verdict}
        rows.append(row)
        print(f"{p['issue']:>5} {p['point']:<44} {nb / 1e6:8.2f} {goal:8.2f} {f['read_us']:7.2f} "
              f"{(f['dep_us'] or float('nan')):7.2f} {(f['copy_us'] or float('nan')):7.2f} "
              f"{row['read_pct_copy']:9.1f}% {f['read_us'] / goal:9.2f} {verdict:>10}", flush=True)
    write_rows(args.out, rows, copy_bandwidth_gbs=bw, layers=args.layers,
               one_cta_kernel_us=empty / args.layers)


if __name__ == "__main__":
    main()
