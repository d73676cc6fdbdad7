"""The gather floor of sparse MLA decode: how fast this GPU reads a decode step's candidate rows where they lie, with
no math, against the same kernel reading the same number of rows in order.

bench_floor.py's read floor streams a point's bytes contiguously. Sparse MLA decode reads each candidate's 576 B
row and its 8 scale bytes at the slot its index list names, in the paged fp8_ds_mla cache (bench_attention.py's
inputs: every candidate at its own shuffled slot). This benchmark times read-only TileLang kernels over exactly
those rows: a CTA takes 32 to 128 of a token's candidates, 4 threads a row on 16-byte loads (decode_ws.py's
gather), XOR-folds them and writes one word a thread; launched as the decode kernels are (programmatic dependent
launch, loads behind the grid-dependency sync: the lists are the previous kernel's output). Columns, us a layer
(8 layers' inputs a graph, L2 flushed), the best of the CTA shapes:

  shuffled   the lists as bench_attention makes them (random slots)
  sorted     the same slots, each token's list in ascending order
  in order   slots 0, 1, 2, ... (the rows of a page one after another): the same bytes, read contiguously

    python benchmarks/attention/bench_gather_floor.py --out bench_out/bench_gather_floor.json
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.attention.bench_attention import BYTES_PER_TOKEN, make_point  # noqa: E402
from benchmarks.harness import graph_us_or_reason, write_rows  # noqa: E402

ROW16 = 36          # 16-byte chunks of a row's 576 B
TPR = 4             # threads a row
# (rows a CTA, threads): 1 or 2 passes of threads / 4 rows
SHAPES = ((32, 128), (64, 128), (128, 256))
POINTS = ((4, 65536), (128, 8192), (128, 262144))   # (compress ratio, context): 640, 192 and 2,176 candidates


def build_gather_read(rows_per_cta: int, threads: int):
    """grid (tokens, tiles of list 1 then of list 2); thread q of a row loads its chunks j * 4 + q and (q = 0) the
    row's two scale words; every word is folded into one a thread, written to out[t, tile, thread]."""
    import tilelang.language as T
    nt, n1, n2, tiles = T.dynamic("nt"), T.dynamic("n1"), T.dynamic("n2"), T.dynamic("tiles")
    P1, R1, P2, R2 = T.dynamic("P1"), T.dynamic("R1"), T.dynamic("P2"), T.dynamic("R2")
    rpp = threads // TPR
    passes = rows_per_cta // rpp
    ch = ROW16 // TPR
    words = ch * 4 + 4   # a row's words a thread: its chunks, two scale words, two of padding (16-byte aligned)
    if passes < 1 or rows_per_cta % rpp:
        raise ValueError(f"gather floor: {rows_per_cta} rows a CTA is not a whole number of {rpp}-row passes")

    @T.macro
    def load_rows(kv, slot, bs, buf, q):
        for k in T.unroll(passes):
            pg = T.max(slot[k], 0) // bs
            off = T.max(slot[k], 0) % bs
            for j in T.unroll(ch):
                for v in T.vectorized(4):
                    buf[k * words + j * 4 + v] = T.if_then_else(slot[k] >= 0, kv[pg, off * ROW16 + j * TPR + q, v], 0)
            for w in T.unroll(4):
                buf[k * words + ch * 4 + w] = T.if_then_else(
                    slot[k] >= 0 and q == 0 and w < 2,
                    kv[pg, (bs * 576 + off * 8) // 16, ((off * 8) % 16) // 4 + w % 2], 0)

    @T.prim_func
    def gather_read(kv1: T.Tensor[(P1, R1, 4), "int32"], idx1: T.Tensor[(nt, n1), "int32"],
                    kv2: T.Tensor[(P2, R2, 4), "int32"], idx2: T.Tensor[(nt, n2), "int32"],
                    bs1: T.int32, bs2: T.int32, out: T.Tensor[(nt, tiles, threads), "int32"]):
        with T.Kernel(nt, tiles, threads=threads) as (t, g):
            tx = T.get_thread_binding()
            r0 = tx // TPR
            q = tx % TPR
            acc = T.alloc_local([1], "int32")
            slot = T.alloc_local([passes], "int32")
            buf = T.alloc_local([passes * words], "int32")
            t1 = T.ceildiv(n1, rows_per_cta)
            T.pdl_trigger()
            T.pdl_sync()
            for k in T.unroll(passes):
                r = r0 + k * rpp
                slot[k] = T.if_then_else(
                    g < t1, T.if_then_else(g * rows_per_cta + r < n1, idx1[t, T.min(g * rows_per_cta + r, n1 - 1)], -1),
                    T.if_then_else((g - t1) * rows_per_cta + r < n2,
                                   idx2[t, T.min((g - t1) * rows_per_cta + r, n2 - 1)], -1))
            if g < t1:
                load_rows(kv1, slot, bs1, buf, q)
            else:
                load_rows(kv2, slot, bs2, buf, q)
            acc[0] = 0
            for i in T.unroll(passes * words):
                acc[0] = acc[0] ^ buf[i]
            out[t, g, tx] = acc[0]
    return gather_read


def compile_shapes(arch: str) -> dict:
    import tilelang

    from dsv4_jit.arch import get_profile
    prof = get_profile(arch)
    return {s: tilelang.compile(build_gather_read(*s), target=prof.target, execution_backend="tvm_ffi",
                                pass_configs=dict(prof.pass_configs)) for s in SHAPES}


def _views(p: dict, order: str) -> tuple:
    (c1, i1, _, bs1), (c2, i2, _, bs2) = p["lists"]
    if order == "sorted":
        i1, i2 = i1.sort(dim=1).values.contiguous(), i2.sort(dim=1).values.contiguous()
    elif order == "in order":
        i1 = torch.arange(i1.numel(), dtype=torch.int32, device=i1.device).view_as(i1)
        i2 = torch.arange(i2.numel(), dtype=torch.int32, device=i2.device).view_as(i2)
    v1 = c1.view(c1.shape[0], -1).view(torch.int32).view(c1.shape[0], -1, 4)
    v2 = c2.view(c2.shape[0], -1).view(torch.int32).view(c2.shape[0], -1, 4)
    return v1, i1, v2, i2, bs1, bs2


def gather_us(kernels: dict, pts: list[dict], order: str) -> tuple[float | None, tuple | None]:
    """(best us a layer over the CTA shapes, that shape) reading every layer's rows in `order`."""
    best, shape = None, None
    args = [_views(p, order) for p in pts]
    for s, k in kernels.items():
        tiles = -(-args[0][1].shape[1] // s[0]) + -(-args[0][3].shape[1] // s[0])
        outs = [torch.empty(a[1].shape[0], tiles, s[1], dtype=torch.int32, device="cuda") for a in args]
        us, _ = graph_us_or_reason(lambda: [k(*a, o) for a, o in zip(args, outs)], reps=1)
        if us is not None and (best is None or us < best):
            best, shape = us, s
    return (None if best is None else best / len(pts)), shape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default="bench_out/bench_gather_floor.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gather_floor.py needs a CUDA GPU")
    from dsv4_jit.arch import detect_arch
    kernels = compile_shapes(detect_arch().name)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}: us a layer ({args.layers} layers a graph, L2 flushed)")
    print(f"{'ratio':>5} {'ctx':>6} {'B':>3} {'cand':>5} {'MB':>7} {'shuffled':>9} {'sorted':>8} {'in order':>9} "
          f"{'shuffled/in order':>18}")
    for ratio, ctx in POINTS:
        for batch in args.batch:
            pts = [make_point(batch, 64, ctx, ratio, g) for _ in range(args.layers)]
            cand = pts[0]["candidates"]
            row = {"ratio": ratio, "ctx": ctx, "batch": batch, "candidates": cand,
                   "row_bytes": batch * cand * BYTES_PER_TOKEN}
            for order in ("shuffled", "sorted", "in order"):
                us, shape = gather_us(kernels, pts, order)
                row[f"{order.replace(' ', '_')}_us"] = us
                row[f"{order.replace(' ', '_')}_shape"] = list(shape) if shape else None
            ratio_io = (row["shuffled_us"] / row["in_order_us"]
                        if row["shuffled_us"] and row["in_order_us"] else None)
            row["shuffled_over_in_order"] = ratio_io
            rows.append(row)
            print(f"{ratio:>5} {ctx // 1024:>5}K {batch:>3} {cand:>5} {row['row_bytes'] / 1e6:7.2f} "
                  f"{row['shuffled_us']:9.2f} {row['sorted_us']:8.2f} {row['in_order_us']:9.2f} "
                  f"{ratio_io:18.2f}", flush=True)
            pts = None
    write_rows(args.out, rows, layers=args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
