"""mHC kernels on the GPU: dsv4-jit vs DeepSeek tile-kernels vs torch, V4-Flash shapes.

Prints a table and writes JSON. Time = median of triton.testing.do_bench (warmup 25 ms, rep 200 ms),
inputs rotated over several buffers for small T is unnecessary (T<=64 inputs are tiny and L2-resident
for every contender alike). Bytes (as peers.md counts them): pre = residual read + fn read + layer_input
write; post = x read + residual read + out write. Bandwidth is reported against a measured
device-to-device copy (256 MiB, read + write).

    python benchmarks/bench_mhc.py --out bench_out/mhc.json [--tokens 1 8 64 512 4096]
"""
from __future__ import annotations

import argparse
import sys

import torch

from mhc_bench_common import EPS, HC, ITERS, POST_MULT, H, activations, bench_us, graph_us, pre_weights, write_rows


def copy_bandwidth_gbs() -> float:
    n = 256 * 1024 * 1024
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * n / (bench_us(lambda: b.copy_(a)) * 1e-6) / 1e9


def import_tile_kernels():
    """tile-kernels 1.0.0 imports tilelang.utils.target, which moved to tilelang.backend.target (peers.md)."""
    try:
        import tilelang
        import tilelang.backend.target as tgt
        sys.modules.setdefault("tilelang.utils.target", tgt)
        tilelang.utils.target = tgt
        from tile_kernels.modeling.mhc.ops.pre_big_fuse import mhc_pre_big_fuse
        from tile_kernels.modeling.mhc.ops.post import mhc_post
        return mhc_pre_big_fuse, mhc_post
    except Exception as e:  # benchmark dependency only
        print(f"tile-kernels unavailable: {type(e).__name__}: {e}")
        return None, None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    ap.add_argument("--out", default="bench_out/mhc.json")
    ap.add_argument("--arch", default=None, help="schedule to time (default: the GPU's)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    import dsv4_jit
    from dsv4_jit.kernels import mhc_reference as ref

    bench = bench_us
    # tile-kernels first: its 12-15 s import leaves the GPU idle (clocks down), which skewed the first
    # timed row when the copy bandwidth was measured before it
    tk_pre, tk_post = import_tile_kernels()
    bw = copy_bandwidth_gbs()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    fn, scale, base = pre_weights(g, dev)
    fn_head = torch.randn(HC, HC * H, device=dev, generator=g) * 1e-2
    scale_h = torch.rand(1, device=dev, generator=g) + 0.5
    base_h = torch.randn(HC, device=dev, generator=g) * 0.1
    rows = []
    for t in args.tokens:
        residual, x, post, comb = activations(t, g, dev)
        pre_bytes = residual.numel() * 2 + fn.numel() * 4 + t * H * 2
        post_bytes = x.numel() * 2 + residual.numel() * 2 + residual.numel() * 2
        kw = dict(rms_eps=EPS, hc_eps=EPS, sinkhorn_iters=ITERS, post_mult=POST_MULT)
        r = {"T": t}
        # ours: warm the selected variants first (compiles stay out of the timing)
        dsv4_jit.mhc_pre(residual, fn, scale, base, arch=args.arch, **kw)
        dsv4_jit.mhc_post(x, residual, post, comb, arch=args.arch)
        r["pre_us"] = bench(lambda: dsv4_jit.mhc_pre(residual, fn, scale, base, arch=args.arch, **kw))
        r["post_us"] = bench(lambda: dsv4_jit.mhc_post(x, residual, post, comb, arch=args.arch))
        r["pre_graph_us"] = graph_us(lambda: dsv4_jit.mhc_pre(residual, fn, scale, base, arch=args.arch, **kw))
        r["post_graph_us"] = graph_us(lambda: dsv4_jit.mhc_post(x, residual, post, comb, arch=args.arch))
        f32 = torch.float32
        dsv4_jit.hc_head(residual, fn_head, scale_h, base_h, rms_eps=EPS, hc_eps=EPS, arch=args.arch)
        r["head_us"] = bench(lambda: dsv4_jit.hc_head(residual, fn_head, scale_h, base_h, rms_eps=EPS, hc_eps=EPS,
                                                      arch=args.arch))
        r["head_graph_us"] = graph_us(lambda: dsv4_jit.hc_head(residual, fn_head, scale_h, base_h, rms_eps=EPS,
                                                               hc_eps=EPS, arch=args.arch))
        r["torch_head_us"] = bench(lambda: ref.ref_hc_head(residual, fn_head, scale_h, base_h, EPS, EPS, dtype=f32))
        r["torch_pre_us"] = bench(lambda: ref.ref_mhc_pre(residual, fn, scale, base, EPS, EPS, ITERS, POST_MULT, dtype=f32))
        r["torch_post_us"] = bench(lambda: ref.ref_mhc_post(x, residual, post, comb, dtype=f32))
        if tk_pre is not None:
            try:
                tk_pre(residual, fn, scale, base, EPS, EPS, EPS, POST_MULT, ITERS)
                r["tk_pre_us"] = bench(lambda: tk_pre(residual, fn, scale, base, EPS, EPS, EPS, POST_MULT, ITERS))
                x4, res4 = x.view(1, t, H), residual.view(1, t, HC, H)
                p4, c4 = post.view(1, t, HC, 1), comb.view(1, t, HC, HC)
                tk_post(x4, res4, p4, c4)
                r["tk_post_us"] = bench(lambda: tk_post(x4, res4, p4, c4))
            except Exception as e:
                print(f"tile-kernels failed at T={t}: {type(e).__name__}: {e}")
        for k in ("pre", "tk_pre", "torch_pre"):
            if f"{k}_us" in r:
                r[f"{k}_gbs"] = pre_bytes / (r[f"{k}_us"] * 1e-6) / 1e9
        for k in ("post", "tk_post", "torch_post"):
            if f"{k}_us" in r:
                r[f"{k}_gbs"] = post_bytes / (r[f"{k}_us"] * 1e-6) / 1e9
        rows.append(r)

    name = torch.cuda.get_device_name()
    print(f"\n{name}; copy bandwidth {bw:,.0f} GB/s; V4-Flash shapes (H={H}, hc={HC}); times in us (median)")
    hdr = (f"{'T':>5} | {'pre':>7} {'graph':>7} {'tk pre':>7} {'torch':>7} {'%copy':>6} | "
           f"{'post':>7} {'graph':>7} {'tk post':>7} {'torch':>7} {'%copy':>6}")
    print(hdr)
    print("-" * len(hdr))
    f = lambda r, k: f"{r[k]:7.1f}" if k in r else f"{'-':>7}"
    for r in rows:
        print(f"{r['T']:>5} | {f(r, 'pre_us')} {f(r, 'pre_graph_us')} {f(r, 'tk_pre_us')} {f(r, 'torch_pre_us')} "
              f"{100 * r['pre_gbs'] / bw:5.1f}% | {f(r, 'post_us')} {f(r, 'post_graph_us')} {f(r, 'tk_post_us')} "
              f"{f(r, 'torch_post_us')} {100 * r['post_gbs'] / bw:5.1f}%")
    print("pre/post: do_bench of the public op (host overhead included, as for tile-kernels and torch); "
          "graph: the same op captured in a CUDA graph (kernel time); %copy: do_bench figure vs copy bandwidth")
    print(f"\n{'T':>5} | {'hc_head':>8} {'graph':>7} {'torch':>7}")
    for r in rows:
        print(f"{r['T']:>5} | {r['head_us']:8.1f} {r['head_graph_us']:7.1f} {r['torch_head_us']:7.1f}")
    write_rows(args.out, rows, copy_gbs=bw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
