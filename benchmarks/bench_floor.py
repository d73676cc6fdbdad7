"""Streaming floors: how fast this GPU moves each scoreboard point's bytes under the benchmarks' own timer, with no
math.

Each point (sparse MLA decode, the indexer step, decode GEMMs, the MXFP4 MoE) is judged against its floor (see
goal_table.py): at small sizes that is a few microseconds, where a kernel's launch and ramp weigh as much as its
bytes. This script times kernels that only read those bytes, in the harness every family benchmark uses
(`--layers` distinct buffers back to back in one CUDA graph, L2 flushed before the replay, time / layers), and
one-CTA kernels chained under PDL (the launch floor). Columns:

  read/L     one kernel that reads the bytes and does nothing else: 16-byte loads, XOR-folded into one int a CTA
             (Triton: a yardstick, not a product kernel), best of a few grid and block shapes; ordinary launches
  +dep/L     that read and one dependent 1-CTA kernel behind it (a step of two kernels: the indexer's logits then
             top-k, split attention then its combine, split-K then its reduce)
  copy/L     torch's device copy of half the bytes (read + write = the bytes): the copy a "% of copy
             bandwidth" is measured with, at this size
  tl/L       a TileLang read-only kernel (build_stream_read), ordinary launches
  pref/L     the same under programmatic dependent launch (PDL), every load issued before the grid-dependency sync:
             the next layer's kernel launches while this one runs and streams its bytes at once. The floor of bytes
             that do not depend on the previous kernel (weights, index-K, a list known before the step)
  dep/L      the same under PDL with the loads behind the sync: the launch is hidden, the bytes are not (the
             gather of lists the previous kernel writes: the indexer's top-k)
  read floor the fastest of these forms

Why the PDL forms: a PDL-launched decode GEMM (wq_b, 33.6 MB, M = 1) runs under the ordinary read-only kernel of
the same bytes: a chain of PDL kernels overlaps each launch and ramp with the kernel before, so the ordinary forms
are no floor for it.

The floor reads contiguous memory and does no arithmetic. Attention gathers 584 B rows from paged memory instead:
attention/bench_gather_floor.py reads those rows where they lie, and on an H100 that took what the same rows in
order took (0.97-1.04x) and about this floor (64 heads x 64 tokens at 64K: 12.1 us against 12.6). The MoE reads only
its routed experts' weights.

    python benchmarks/bench_floor.py --out bench_out/bench_floor.json [--layers 8] [--families attention indexer gemm moe]
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
from benchmarks.indexer.bench_indexer import DIM as INDEX_DIM, HEADS as INDEX_HEADS, RATIO as INDEX_RATIO  # noqa: E402

from dsv4_jit.model_config import load_model_config  # noqa: E402

INDEX_K_BYTES = INDEX_DIM + 4    # an index-K row: DIM fp8 + a 4 B fp32 scale (bench_indexer's count)
FAMILIES = ("attention", "indexer", "gemm", "moe")


def goal_points() -> list[dict]:
    """Each family's scoreboard points: the bytes a step must read, its math (flops, or flops a row for the decode
    GEMMs whose M varies, and the MMA operand type whose measured peak prices them) and the kernels the step
    launches in sequence. `key` joins a point to the family benchmark's row."""
    flash = load_model_config("deepseek-v4-flash")
    ratio_topk, window = int(flash.index_topk), int(flash.sliding_window)   # V4-Flash: 512, 128
    pts = []
    # sparse MLA decode: valid candidates x 584 B + q + out; QK and PV over 512 dims in bf16 (4 x 512 flops a
    # candidate and head); a split step (batch <= 8) is two kernels, the split and its combine
    for heads in (64, 16):
        for ratio, ctx in ((4, 65536), (128, 8192), (128, 65536), (128, 262144)):
            cand = (ratio_topk if ratio == 4 else ctx // 128) + window
            for batch in (1, 8, 64):
                nbytes = batch * (cand * KV_BYTES_PER_TOKEN + 2 * heads * HEAD_DIM * 2)
                pts.append({"family": "attention", "point": f"H{heads} ratio {ratio} {ctx // 1024}K x {batch}",
                            "bytes": nbytes, "flops": batch * heads * cand * 4 * HEAD_DIM, "mma": "bf16",
                            "kernels": 2 if batch <= 8 else 1,
                            "key": {"heads": heads, "ratio": ratio, "ctx": ctx, "batch": batch}})
    # the indexer step (logits + top-k): the index-K bytes; fp8 logits, INDEX_HEADS x INDEX_DIM x 2 flops a key
    for ctx in (8192, 65536, 262144):
        for batch in (1, 8, 64):
            keys = batch * ctx // INDEX_RATIO
            pts.append({"family": "indexer", "point": f"{ctx // 1024}K x {batch}", "bytes": keys * INDEX_K_BYTES,
                        "flops": keys * INDEX_HEADS * INDEX_DIM * 2, "mma": "fp8", "kernels": 2,
                        "key": {"ctx": ctx, "batch": batch}})
    # decode GEMMs (M <= 64): the fp8 weights and their block scales; MXFP4 MoE: the touched experts' weights
    from dsv4_jit.kernels.gemm.family import gemm_shapes
    from dsv4_jit.kernels.moe.family import moe_shapes
    for name, tp in (("deepseek-v4-flash", 1), ("deepseek-v4-pro", 8)):
        m = load_model_config(name)
        for s in gemm_shapes(m, tp):
            g, n, k = s["groups"], s["n"], s["k"]   # grouped (wo_a): g weights of n x k
            nbytes = g * (n * k + (n // 128) * (k // 128) * 4)
            pts.append({"family": "gemm", "point": f"{name[12:]} TP{tp} {s['label'].split(' (')[0]} {g * k}->{g * n}",
                        "bytes": nbytes, "flops_per_row": 2 * g * n * k, "mma": "fp8", "kernels": 1,
                        "key": {"model": name, "tp": tp, "n": n, "k": k, "groups": g}})
        e, topk = int(m.n_routed_experts), int(m.num_experts_per_tok)
        for s in moe_shapes(m, tp):
            n, k = s["n"], s["k"]
            for t in (1, 8, 64):
                touched = e * (1 - (1 - topk / e) ** t)   # expected distinct experts of t tokens' top-k
                nbytes = int(touched * (n * k // 2 + n * k // 32))
                pts.append({"family": "moe", "point": f"{name[12:]} TP{tp} MoE {'w13' if 'w1' in s['label'] else 'w2'} "
                            f"{k}->{n} T{t}", "bytes": nbytes, "flops": 2 * t * topk * n * k, "mma": "fp8", "kernels": 1,
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


def read_floor(f: dict) -> float:
    """The fastest read-only form of a point's bytes (ordinary or PDL launches): no kernel that reads them is faster."""
    return min(f[k] for k in ("read_us", "tl_plain_us", "tl_prefetch_us", "tl_dependent_us") if f.get(k) is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out/bench_floor.json")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
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
    print(f"{'family':<9} {'point':<44} {'MB':>8} {'read/L':>7} {'+dep/L':>7} {'copy/L':>7} "
          f"{'tl/L':>7} {'pref/L':>7} {'dep/L':>7} {'floor':>7}")
    rows, cache = [], {}
    for p in goal_points():
        if p["family"] not in args.families:
            continue
        nb = p["bytes"]
        if nb not in cache:
            cache[nb] = floor_us(nb, args.layers, read, dep, tl_kernels)
        f = cache[nb]
        floor = read_floor(f)
        rows.append({**p, **f, "floor_us": floor})
        cells = [f[k] if f.get(k) is not None else float("nan")
                 for k in ("read_us", "dep_us", "copy_us", "tl_plain_us", "tl_prefetch_us", "tl_dependent_us")]
        print(f"{p['family']:<9} {p['point']:<44} {nb / 1e6:8.2f} " + " ".join(f"{c:7.2f}" for c in cells)
              + f" {floor:7.2f}", flush=True)
    write_rows(args.out, rows, copy_bandwidth_gbs=bw, layers=args.layers, arch=arch,
               one_cta_kernel_us=empty / args.layers, tl_one_cta_kernel_us=launch["plain"],
               pdl_one_cta_kernel_us=launch["prefetch"])


if __name__ == "__main__":
    main()
