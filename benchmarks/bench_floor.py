"""Streaming floors: how fast this GPU moves each open goal's bytes under the benchmarks' own timer, with no math.

The open goals (#9 attention, #10 indexer, #12 GEMM / MoE) are stated as a share of copy bandwidth over the bytes
a step must read: at small sizes the time budget that gives is a few microseconds, where a kernel's launch and
ramp weigh as much as its bytes. This script times kernels that only read those bytes, in the harness every
family benchmark uses (`--layers` distinct buffers back to back in one CUDA graph, L2 flushed before the replay,
time / layers), so each goal point gets a floor to set the goal and our kernel against:

  read/L     one kernel that reads the bytes and does nothing else: 16-byte loads, XOR-folded into one int a CTA
             (Triton: a yardstick, not a product kernel), best of a few grid and block shapes; ordinary launches
  +dep/L     that read and one dependent 1-CTA kernel behind it (a step of two kernels: the indexer's logits then
             top-k, split attention then its combine, split-K then its reduce)
  copy/L     torch's device copy of half the bytes (read + write = the bytes): the copy the goals' "% of copy
             bandwidth" is measured with, at this size
  tl/L       a TileLang read-only kernel (build_stream_read), ordinary launches
  pref/L     the same under programmatic dependent launch (PDL), every load issued before the grid-dependency sync:
             the next layer's kernel launches while this one runs and streams its bytes at once. The floor of bytes
             that do not depend on the previous kernel (weights, index-K, a list known before the step)
  dep/L      the same under PDL with the loads behind the sync: the launch is hidden, the bytes are not (the
             gather of lists the previous kernel writes: the indexer's top-k)
  goal       the goal's time: bytes / (share x the 256 MiB copy bandwidth); #10: 1.5 x bytes / copy bandwidth
  floor/goal the fastest form over the goal's time: above 1, even a kernel that only reads misses the goal
  no PDL     the verdict for ordinarily launched kernels (read/L, tl/L): "fused only" where the read fits but a
             dependent second kernel does not
  any        the verdict over every form: "no" means no kernel of these launch forms reaches the goal there

Why the PDL forms: the first run (Triton forms only, H100, 2026-11-25) had our PDL-launched decode GEMM (wq_b,
33.6 MB, M = 1: 13.0 us a layer) under the ordinary read-only kernel of the same bytes (13.6): a chain of PDL
kernels overlaps each launch and ramp with the kernel before, so the ordinary forms are no floor for it.

The floor is optimistic for the real steps: it reads contiguous memory (attention gathers 584 B rows from paged
memory, the MoE reads only its routed experts' weights), and it does no arithmetic.

    python benchmarks/bench_floor.py --out bench_out/floor.json [--layers 8] [--issues 9 10 12]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.* imports
from benchmarks.harness import copy_bandwidth_gbs, graph_us_or_reason, write_rows  # noqa: E402

from benchmarks.attention.bench_attention import BYTES_PER_TOKEN as KV_BYTES_PER_TOKEN, D as HEAD_DIM  # noqa: E402
from benchmarks.indexer.bench_indexer import DIM as INDEX_DIM, RATIO as INDEX_RATIO  # noqa: E402

from dsv4_jit.model_config import load_model_config  # noqa: E402

INDEX_K_BYTES = INDEX_DIM + 4    # an index-K row: DIM fp8 + a 4 B fp32 scale (bench_indexer's count)


def goal_points() -> list[dict]:
    """Each issue's goal points: bytes, the goal's time factor (seconds = bytes * factor / copy B/s) and the
    kernels the step launches in sequence."""
    flash = load_model_config("deepseek-v4-flash")
    ratio_topk, window = int(flash.index_topk), int(flash.sliding_window)   # V4-Flash: 512, 128
    pts = []
    # 9: >= 70% of copy over (valid candidates x 584 B + q + out) at batch >= 8, context >= 8K
    for heads in (64, 16):
        for ratio, ctx in ((4, 65536), (128, 8192), (128, 65536), (128, 262144)):
            cand = (ratio_topk if ratio == 4 else ctx // 128) + window
            for batch in (8, 64):
                nbytes = batch * (cand * KV_BYTES_PER_TOKEN + 2 * heads * HEAD_DIM * 2)
                pts.append({"issue": 9, "point": f"H{heads} ratio {ratio} {ctx // 1024}K x {batch}",
                            "bytes": nbytes, "factor": 1 / 0.7, "kernels": 2 if batch <= 8 else 1,
                            "key": {"heads": heads, "ratio": ratio, "ctx": ctx, "batch": batch}})
    # 10: the indexer step (logits + top-k) within 1.5x the index-K bytes floor at 64K (8K and 256K shown too)
    for ctx in (8192, 65536, 262144):
        for batch in (1, 8, 64):
            pts.append({"issue": 10, "point": f"{ctx // 1024}K x {batch}", "bytes": batch * ctx // INDEX_RATIO * INDEX_K_BYTES,
                        "factor": 1.5, "kernels": 2, "key": {"ctx": ctx, "batch": batch}})
    # 12: decode GEMMs (M <= 64) at >= 80% of copy over the weight bytes; MXFP4 MoE the same over the touched experts
    from dsv4_jit.kernels.gemm.family import gemm_shapes
    from dsv4_jit.kernels.moe.family import moe_shapes
    for name, tp in (("deepseek-v4-flash", 1), ("deepseek-v4-pro", 8)):
        m = load_model_config(name)
        for s in gemm_shapes(m, tp):
            g, n, k = s["groups"], s["n"], s["k"]   # grouped (wo_a): g weights of n x k
            nbytes = g * (n * k + (n // 128) * (k // 128) * 4)
            pts.append({"issue": 12, "point": f"{name[12:]} TP{tp} {s['label'].split(' (')[0]} {g * k}->{g * n}",
                        "bytes": nbytes, "factor": 1 / 0.8, "kernels": 1,
                        "key": {"model": name, "tp": tp, "n": n, "k": k, "groups": g}})
        e, topk = int(m.n_routed_experts), int(m.num_experts_per_tok)
        for s in moe_shapes(m, tp):
            n, k = s["n"], s["k"]
            for t in (1, 8, 64):
                touched = e * (1 - (1 - topk / e) ** t)   # expected distinct experts of t tokens' top-k
                nbytes = int(touched * (n * k // 2 + n * k // 32))
                pts.append({"issue": 12, "point": f"{name[12:]} TP{tp} MoE {'w13' if 'w1' in s['label'] else 'w2'} "
                            f"{k}->{n} T{t}", "bytes": nbytes, "factor": 1 / 0.8, "kernels": 1,
                            "key": {"model": name, "tp": tp, "n": n, "k": k, "tokens": t}})
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
# TileLang forms: (floats a row, rows a CTA, threads); 16-byte loads, iters x block / threads floats a thread in flight
TL_SHAPES = [(1024, 4, 256), (1024, 8, 256), (1024, 16, 256), (2048, 4, 512), (2048, 8, 512)]
TL_MODES = ("plain", "prefetch", "dependent")
ROW = 2048   # buffers are padded to a multiple of this many int32 (< 8 KB) so every TileLang shape views them whole


def build_stream_read(block: int, iters: int, threads: int, mode: str):
    """Read-only TileLang kernel over x [rows, block] fp32 (any bits), one sum a CTA (iters rows) to out [grid].
    mode "plain": an ordinary launch. With programmatic dependent launch (PDL: the kernel triggers its dependents
    at its start, so the next layer's kernel launches while this one runs):
      "prefetch"  every load is issued before the grid-dependency sync and only the write waits behind it: bytes
                  that do not depend on the previous kernel (weights, index-K, a list known before the step), so
                  a chain of such kernels streams back to back;
      "dependent" the loads wait for the previous kernel: bytes whose addresses it produces (the top-k's lists)."""
    import tilelang.language as T
    if mode not in TL_MODES:
        raise ValueError(f"build_stream_read: mode={mode!r} (one of {TL_MODES})")
    rows = T.dynamic("rows")

    @T.prim_func
    def stream_read(x: T.Tensor[(rows, block), "float32"], out: T.Tensor[(rows,), "float32"]):
        with T.Kernel(T.ceildiv(rows, iters), threads=threads) as bx:
            v = T.alloc_fragment((iters, block), "float32")
            cols = T.alloc_fragment((block,), "float32")
            r = T.alloc_fragment((1,), "float32")
            if mode != "plain":
                T.pdl_trigger()
            if mode == "dependent":
                T.pdl_sync()
            for i, j in T.Parallel(iters, block):
                v[i, j] = x[T.min(bx * iters + i, rows - 1), j]
            if mode == "prefetch":
                T.pdl_sync()
            # rows first (each thread holds its columns of every row: no exchange), then one CTA-wide sum: the
            # first form reduced each row across the CTA, iters barrier rounds a CTA that the Triton form does not pay
            T.reduce_sum(v, cols, dim=0)
            T.reduce_sum(cols, r, dim=0)
            out[bx] = r[0]
    return stream_read


def compile_stream_read(arch: str, block: int, iters: int, threads: int, mode: str):
    import tilelang

    from dsv4_jit.arch import get_profile
    prof = get_profile(arch)
    return tilelang.compile(build_stream_read(block, iters, threads, mode), target=prof.target,
                            execution_backend="tvm_ffi", pass_configs=dict(prof.pass_configs))


def _best(fns: dict, bufs_of) -> tuple[float, object]:
    """(best per-graph us, its key) over fns {key: launch(x, out)}, each timed as one graph over every layer."""
    best, key = math.inf, None
    for k, fn in fns.items():
        us, _ = graph_us_or_reason(lambda: [fn(x, o) for x, o in bufs_of(k)], reps=1)
        if us is not None and us < best:
            best, key = us, k
    return best, key


def floor_us(nbytes: int, layers: int, read, dep, tl_kernels: dict) -> dict:
    n = max(1, nbytes // 4)
    n_pad = -(-n // ROW) * ROW
    bufs = [torch.randint(-2**31, 2**31 - 1, (n_pad,), dtype=torch.int32, device="cuda") for _ in range(layers)]
    outs = [torch.empty(n_pad // 1024, dtype=torch.int32, device="cuda") for _ in range(layers)]
    outs2 = [torch.empty(1, dtype=torch.int32, device="cuda") for _ in range(layers)]
    best, best_shape = _best({s: (lambda x, o, s=s: read(x, o, *s)) for s in READ_SHAPES},
                             lambda s: [(b[:n], o) for b, o in zip(bufs, outs)])
    dep_us, _ = graph_us_or_reason(lambda: [(read(b[:n], o, *best_shape), dep(o, o2))
                                            for b, o, o2 in zip(bufs, outs, outs2)], reps=1)
    row = {"read_us": best / layers, "read_shape": best_shape, "dep_us": None if dep_us is None else dep_us / layers}
    # TileLang forms over the same buffers (fp32 views; x [rows, block], one float a row out)
    f_outs = [o.view(torch.float32) for o in outs]
    for mode in TL_MODES:
        fns = {shape: k for (m, shape), k in tl_kernels.items() if m == mode}
        us, shape = _best(fns, lambda s: [(b.view(torch.float32).view(-1, s[0]), o[: n_pad // s[0]])
                                          for b, o in zip(bufs, f_outs)])
        row[f"tl_{mode}_us"] = None if shape is None else us / layers
        row[f"tl_{mode}_shape"] = shape
    half = [b.view(torch.uint8)[: nbytes // 2] for b in bufs]
    dst = [torch.empty_like(h) for h in half]
    copy_us, _ = graph_us_or_reason(lambda: [d.copy_(h) for d, h in zip(dst, half)], reps=1)
    del bufs, outs, half, dst
    row["copy_us"] = None if copy_us is None else copy_us / layers
    return row


def launch_floor_us(layers: int, tl_kernels: dict) -> dict:
    """Per layer, one-CTA TileLang kernels chained in the harness, one a layer, each reading one 4 KB row: the time a
    kernel costs when it moves nothing, ordinary ("plain") and under PDL ("prefetch"). A goal time under the PDL
    figure is out of reach of any step that launches a kernel, whatever its bytes."""
    shape = TL_SHAPES[0]
    xs = [torch.zeros(1, shape[0], dtype=torch.float32, device="cuda") for _ in range(layers)]
    outs = [torch.empty(1, dtype=torch.float32, device="cuda") for _ in range(layers)]
    out = {}
    for mode in ("plain", "prefetch"):
        k = tl_kernels[(mode, shape)]
        us, _ = graph_us_or_reason(lambda: [k(x, o) for x, o in zip(xs, outs)], reps=1)
        out[mode] = None if us is None else us / layers
    return out


def verdicts(p: dict, f: dict, goal: float) -> tuple[float, str, str]:
    """(floor us, verdict without PDL, verdict with any form): the floor is the fastest form; "no" means even it
    misses the goal; without PDL, "fused only" where the read fits but a dependent second kernel does not."""
    forms = [f[k] for k in ("read_us", "tl_plain_us", "tl_prefetch_us", "tl_dependent_us") if f.get(k) is not None]
    plain = min(f[k] for k in ("read_us", "tl_plain_us") if f.get(k) is not None)
    no_pdl = "no" if plain > goal else ("fused only" if p["kernels"] > 1 and (f["dep_us"] or 0) > goal else "yes")
    floor = min(forms)
    return floor, no_pdl, "no" if floor > goal else "yes"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out/floor.json")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--issues", type=int, nargs="*", default=[9, 10, 12])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_floor.py needs a CUDA GPU")
    from dsv4_jit.arch import detect_arch
    arch = detect_arch().name
    read, dep = _kernels()
    tl_kernels = {(m, s): compile_stream_read(arch, *s, m) for m in TL_MODES for s in TL_SHAPES}
    bw = copy_bandwidth_gbs()
    empty, _ = graph_us_or_reason(lambda: [dep(o, o) for o in [torch.zeros(1, dtype=torch.int32, device="cuda")]
                                           * args.layers], reps=1)
    launch = launch_floor_us(args.layers, tl_kernels)
    print(f"{torch.cuda.get_device_name()} ({arch}); copy bandwidth {bw:,.0f} GB/s; one 1-CTA kernel per layer "
          f"{empty / args.layers:.2f} us (--layers {args.layers}); TileLang 1-CTA kernel per layer: ordinary "
          f"{launch['plain']:.2f} us, PDL {launch['prefetch']:.2f} us")
    print(f"{'issue':>5} {'point':<44} {'MB':>8} {'goal us':>8} {'read/L':>7} {'+dep/L':>7} {'copy/L':>7} "
          f"{'tl/L':>7} {'pref/L':>7} {'dep/L':>7} {'floor/goal':>10} {'no PDL':>10} {'any':>4}")
    rows, cache = [], {}
    for p in goal_points():
        if p["issue"] not in args.issues:
            continue
        nb = p["bytes"]
        if nb not in cache:
            cache[nb] = floor_us(nb, args.layers, read, dep, tl_kernels)
        f = cache[nb]
        goal = nb * p["factor"] / (bw * 1e9) * 1e6
        floor, no_pdl, any_form = verdicts(p, f, goal)
        rows.append({**p, **f, "goal_us": goal, "floor_us": floor, "feasible_without_pdl": no_pdl,
                     "feasible": any_form})
        cells = [f[k] if f.get(k) is not None else float("nan")
                 for k in ("read_us", "dep_us", "copy_us", "tl_plain_us", "tl_prefetch_us", "tl_dependent_us")]
        print(f"{p['issue']:>5} {p['point']:<44} {nb / 1e6:8.2f} {goal:8.2f} " + " ".join(f"{c:7.2f}" for c in cells)
              + f" {floor / goal:10.2f} {no_pdl:>10} {any_form:>4}", flush=True)
    write_rows(args.out, rows, copy_bandwidth_gbs=bw, layers=args.layers, arch=arch,
               one_cta_kernel_us=empty / args.layers, tl_one_cta_kernel_us=launch["plain"],
               pdl_one_cta_kernel_us=launch["prefetch"])


if __name__ == "__main__":
    main()
