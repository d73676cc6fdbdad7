"""Sparse MLA decode with the sink over the fp8_ds_mla paged cache: time, and bandwidth over the bytes the
step must read (valid candidates x 584 B + q + out), against measured copy bandwidth.

Columns: ours with the sm_90a schedule, ours with the SM120 schedule compiled for this sm_90a GPU (mma.sync
path; the timing is an H100 timing, never an SM120 one), vLLM 0.33's Triton sparse MLA decode (its ROCm
generic path: vLLM runs FlashInfer's compiled SM120 kernel on SM12x, which no Hopper can run; see
benchmarks/peers/vllm_attention.py), and a torch gather baseline (index, dequantize, bmm, softmax with sink).
Each implementation's output is checked against the float64 reference at every point.

Time per call: one CUDA graph runs the op over --layers (default 8) distinct input sets, as a decode step's
successive layers do (each call reads its own bytes), replayed with L2 flushed before each replay, divided
by the number of calls. "one_call_us" in the JSON is a single call per replay (it carries the replay's own
latency, ~24 us a point on an H100).

  python benchmarks/attention/bench_attention.py --out bench_out/attention.json
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import copy_bandwidth_gbs, graph_us_or_reason, write_rows  # noqa: E402

from dsv4_jit.kernels.attention import ops, reference  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D, NOPE  # noqa: E402

SWA_W, SWA_BS, COMP_BS, TOPK = 128, 64, 64, 512
BYTES_PER_TOKEN = 584



def make_point(batch: int, heads: int, ctx: int, ratio: int, g: torch.Generator) -> dict:
    """One decode step of `batch` requests at context `ctx` on a ratio-4 (128 SWA + 512 indexer picks) or
    ratio-128 (128 SWA + every ctx/128 block) layer; every candidate lives at its own shuffled slot."""
    dev = "cuda"
    n2 = TOPK if ratio == 4 else ctx // 128
    lists = []
    for n, bs in ((SWA_W, SWA_BS), (n2, COMP_BS)):
        rows = batch * n
        pages = math.ceil(rows / bs) + 1
        kv = torch.randn(pages * bs, D, device=dev, generator=g) * torch.exp(torch.rand(pages * bs, 1, device=dev, generator=g) - 0.5)
        cache = reference.pack_fp8_ds_mla(kv, torch.arange(pages * bs, device=dev), pages, bs)
        idx = torch.randperm(pages * bs, device=dev, generator=g)[:rows].view(batch, n).int().contiguous()
        lens = torch.full((batch,), n, dtype=torch.int32, device=dev)
        lists.append((cache, idx, lens, bs))
    q = (torch.randn(batch, heads, D, device=dev, generator=g) * 2).to(torch.bfloat16)
    sink = torch.randn(heads, device=dev, generator=g)
    return {"q": q, "sink": sink, "lists": lists, "candidates": SWA_W + n2}


def torch_gather(p: dict, scale: float) -> torch.Tensor:
    """The obvious torch step: gather each token's rows, dequantize, two bmm and a softmax with the sink."""
    parts = []
    for cache, idx, lens, bs in p["lists"]:
        pages = cache.shape[0]
        flat = cache.view(pages, -1)
        s = idx.long().clamp_min(0)
        pg, off = s // bs, s % bs
        data = flat.view(pages, -1)[:, : bs * 576].view(pages, bs, 576)[pg, off]            # [T, n, 576]
        e = flat[:, bs * 576: bs * 584].view(pages, bs, 8)[pg, off, :7]                      # [T, n, 7]
        nope = data[..., :NOPE].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16)
        nope = (nope.view(*nope.shape[:2], 7, 64) * torch.exp2(e.float() - 127).to(torch.bfloat16)[..., None])
        rope = data[..., NOPE:].contiguous().view(torch.bfloat16)
        parts.append(torch.cat([nope.flatten(2), rope], -1))
    kv = torch.cat(parts, 1)                                                                 # [T, N, 512]
    s = torch.bmm(p["q"], kv.transpose(1, 2)).float() * scale                                # [T, H, N]
    m = torch.maximum(s.amax(-1), p["sink"][None])
    e = torch.exp(s - m[..., None])
    den = e.sum(-1) + torch.exp(p["sink"][None] - m)
    return (torch.bmm((e / den[..., None]).to(torch.bfloat16), kv)).to(torch.bfloat16)


def make_fns(p: dict, heads: int, batch: int, scheds: dict, peer, scale: float) -> dict:
    """name -> (call, its output tensor or None when the call returns it) for one input set."""
    from dsv4_jit import jit
    (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
    fns = {}
    for name, prof in scheds.items():
        out = torch.empty_like(p["q"])
        ws = torch.empty(max(1, ops.sparse_mla_workspace_numel(prof, heads, batch)), device="cuda")
        getter = (lambda prof: lambda spec, st, n: jit.load(spec, spec.select(prof, st, n)))(prof)

        def f(prof=prof, out=out, ws=ws, getter=getter):
            return ops.sparse_mla_decode(p["q"], c1, i1, l1, p["sink"], block_size=bs1, extra_kv_cache=c2,
                                         extra_indices=i2, extra_lengths=l2, extra_block_size=bs2, out=out,
                                         workspace=ws, check_indices=False, arch=prof, get_kernel=getter)
        fns[name] = (f, out)
    if peer is not None:
        prep = peer.prepare(i1, l1, c1.shape[0] * bs1, i2, l2, c2.shape[0] * bs2)
        v1, v2 = peer.cache_view(c1, bs1), peer.cache_view(c2, bs2)
        pout = torch.empty_like(p["q"])
        fns["vllm_triton"] = (lambda: peer.decode(p["q"], v1, prep, p["sink"], extra_cache=v2, softmax_scale=scale,
                                                  out=pout), pout)
    fns["torch"] = (lambda: torch_gather(p, scale), None)
    return fns


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 32, 16], help="64/TP for V4-Flash at TP 1/2/4")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ctx", type=int, nargs="+", default=[8192, 65536, 262144])
    ap.add_argument("--ratios", type=int, nargs="+", default=[4, 128])
    ap.add_argument("--peers-dir", default=None)
    ap.add_argument("--layers", type=int, default=8,
                    help="distinct input sets per timed graph (per-call time = graph time / layers)")
    ap.add_argument("--out", default="bench_out/attention.json")
    args = ap.parse_args()

    from dsv4_jit.arch import get_profile
    hopper = get_profile("sm_90a")
    scheds = {"ours_sm90": hopper, "ours_sm120": get_profile("sm_120a").emulated(hopper)}
    try:
        from benchmarks.peers.vllm_attention import load_peer
        peer, peer_why = load_peer(args.peers_dir), None
    except Exception as e:  # missing .peers or triton: say why in the table
        peer, peer_why = None, f"{type(e).__name__}: {e}"[:160]
    bw = copy_bandwidth_gbs()
    scale = D ** -0.5
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {bw:,.0f} GB/s")
    if peer_why:
        print(f"vLLM peer unavailable: {peer_why}")
    hdr = f"{'H':>3} {'ratio':>5} {'ctx':>6} {'B':>3} {'cand':>5} {'MB':>7} | " + " | ".join(
        f"{k:>18}" for k in ("ours_sm90", "ours_sm120", "vllm_triton", "torch")) + "  (us  %copy)"
    print(hdr)
    for heads in args.heads:
        for ratio in args.ratios:
            for ctx in args.ctx:
                if ratio == 4 and ctx != args.ctx[0] and ctx > 4 * TOPK:
                    continue  # a ratio-4 layer reads 128 + 512 candidates at every context >= 2K: one row
                for batch in args.batch:
                    p = make_point(batch, heads, ctx, ratio, g)
                    (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
                    ref = reference.ref_sparse_mla(p["q"], reference.unpack_fp8_ds_mla(c1, bs1), i1, l1,
                                                   reference.unpack_fp8_ds_mla(c2, bs2), i2, l2, p["sink"], scale)
                    nbytes = batch * (p["candidates"] * BYTES_PER_TOKEN + 2 * heads * D * 2)
                    row = {"heads": heads, "ratio": ratio, "ctx": ctx, "batch": batch, "candidates": p["candidates"],
                           "bytes": nbytes}
                    # `layers` distinct inputs (caches, lists, q) per timed graph: each call reads its own bytes,
                    # as successive layers of a decode step do, so neither L2 reuse nor the replay's launch
                    # latency inflates or floors the per-call time
                    pts = [p] + [make_point(batch, heads, ctx, ratio, g) for _ in range(args.layers - 1)]
                    fns = [make_fns(q, heads, batch, scheds, peer, scale) for q in pts]
                    for name, prof in scheds.items():
                        row[name + "_variant"] = ops._FWD.select(prof, ops._static(heads, scale, "fp8_ds_mla"), batch).name
                    cells = []
                    for name in ("ours_sm90", "ours_sm120", "vllm_triton", "torch"):
                        if name not in fns[0]:
                            row[name] = {"us": None, "why": peer_why}
                            cells.append(f"{'n/a':>18}")
                            continue
                        fn, out = fns[0][name]
                        got = fn()
                        torch.cuda.synchronize()
                        got = out if out is not None else got
                        err = float(((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max())
                        one, why1 = graph_us_or_reason(fn, reps=1)

                        def all_layers(name=name):
                            for fl in fns:
                                fl[name][0]()
                        many, why = graph_us_or_reason(all_layers, reps=1)
                        us = None if many is None else many / len(fns)
                        pct = None if us is None else 100 * nbytes / (us * 1e-6) / 1e9 / bw
                        row[name] = {"us": us, "pct_copy_bw": pct, "one_call_us": one, "max_token_rel_err": err,
                                     "why": why or why1}
                        cells.append(f"{us:9.1f} {pct:5.1f}% {'!' if err > 1e-2 else ' '}" if us is not None
                                     else f"{'fail':>18}")
                    pts = fns = None  # free this point's inputs before the next is made
                    rows.append(row)
                    print(f"{heads:>3} {ratio:>5} {ctx // 1024:>5}K {batch:>3} {p['candidates']:>5} "
                          f"{nbytes / 1e6:7.2f} | " + " | ".join(f"{c:>18}" for c in cells), flush=True)
    write_rows(args.out, rows, copy_bandwidth_gbs=bw,
               note="ours_sm120 = the SM120 schedule compiled for sm_90a and timed on this GPU; vllm_triton = "
                    "vLLM 0.33's Triton sparse MLA decode (ROCm generic path), not what vLLM runs on SM12x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
