"""Lightning-indexer benchmark: paged decode logits, and logits + top-k 512 (one ratio-4 layer's indexer per
decode step), at contexts 8K / 64K / 256K tokens (2K / 16K / 64K compressed positions), batch 1 / 8 / 64,
next_n = 1, V4-Flash shapes (64 heads x 128, page 64).

Columns (us, median of triton's do_bench over one CUDA-graph replay of one call, L2 flushed before each, so
small contexts are not served from L2 across repeated calls; a step that cannot be captured is timed eagerly):
  ours logits / ours +topk   dsv4_jit.indexer_decode_logits / indexer_decode_topk (TileLang, both steps)
  ours nofill                indexer_decode_logits with clean=False (no -inf past each row's tiles; what
                             indexer_decode_topk runs, and what vLLM's kernel writes: valid columns only)
  ours topk                  dsv4_jit.indexer_topk alone on those logits (read from HBM here: L2 is flushed, where
                             in the step they are still in L2)
  GB/s, %copy                index-K bytes read by the logits kernel (batch * ctx/4 * 132 B) / its time, and that
                             against a measured device-to-device copy (256 MiB, read + write)
  torch logits / torch +topk gather + dequantise + einsum + relu/weights in fp32, then torch.topk (the baseline)
  err ours / err vllm        max over rows of the relative error of the valid columns (|| got - ref || / || ref ||)
                             against the fp32 torch step (dequantised K, fp32 einsum): batch <= 8, else '-'
  vllm logits / vllm +topk   vLLM 0.33's Triton paged MQA logits (its ROCm path) + its torch top-k
                             (benchmarks/peers/vllm_indexer.py; NOT what vLLM runs on SM12x: DeepGEMM SM120 +
                             persistent_topk). Missing peer: the reason is printed and the column is empty.
  Each top-k call is given its own persistent workspace (zeroed once, left zeroed by every launch), as an engine's
  CUDA graph holds it: no memset runs in the timed graphs.
  ours logits/L, +topk/L      per layer: one CUDA graph runs ours over --layers (default 8) distinct input sets
                             (caches, tables, q, outputs), as a decode step's successive ratio-4 layers do, L2
                             flushed before each replay, graph time / layers. The one-call columns carry the
                             replay's launch latency (~5 us for a 1-element kernel on the H100) once per call;
                             these carry it once per graph. GB/s and %copy use logits/L.
The logits width is sized for the largest context (65,536 + 64 columns) in every row, as a CUDA graph
captured for max_model_len would be: rows at 8K context show the early exit past each request's length.
--width sets it (262,208 columns: a 1M-token max_model_len).

    python benchmarks/indexer/bench_indexer.py --out bench_out/indexer.json [--contexts 8192 65536 262144] [--batch 1 8 64]
    [--arch sm_120a]   (an SM120 schedule on this GPU: sm_120a emulated on the native arch)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import cold_us, copy_bandwidth_gbs, graph_us_or_reason, row_rel_err, run_info  # noqa: E402


HEADS, DIM, PAGE, TOPK, RATIO = 64, 128, 64, 512, 4



def make_inputs(batch: int, ctx: int, width: int, g: torch.Generator) -> dict:
    from dsv4_jit.kernels.indexer.reference import pack_paged_cache, quantize_rows_fp8
    comp = ctx // RATIO
    pages_per = -(-comp // PAGE)
    max_pages = -(-width // PAGE)
    total = batch * pages_per + 1
    perm = torch.randperm(total, generator=g, device="cuda").to(torch.int32)
    bt = torch.full((batch, max_pages), -1, dtype=torch.int32, device="cuda")
    bt[:, :pages_per] = perm[: batch * pages_per].view(batch, pages_per)
    k8, ks = quantize_rows_fp8(torch.randn(total * PAGE, DIM, generator=g, device="cuda"))
    q8, qs = quantize_rows_fp8(torch.randn(batch, HEADS * DIM, generator=g, device="cuda"))
    return {"q": q8.view(batch, HEADS, DIM), "q_scale": qs, "weights": torch.randn(batch, HEADS, generator=g, device="cuda") * 0.01,
            "kv_cache": pack_paged_cache(k8, ks, PAGE), "seq_lens": torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
            "block_table": bt, "comp": comp, "width": width}


def torch_logits(d: dict, out: torch.Tensor) -> torch.Tensor:
    """Baseline: gather each request's pages, dequantise, fp32 einsum, relu * weights, sum over heads."""
    b, comp = d["q"].shape[0], d["comp"]
    flat = d["kv_cache"]
    pages = flat.shape[0]
    vals = flat[:, : PAGE * DIM].view(torch.float8_e4m3fn).view(pages, PAGE, DIM)   # a strided view, no copy
    scales = flat[:, PAGE * DIM:].contiguous().view(torch.float32).view(pages, PAGE)
    pos = torch.arange(comp, device=flat.device)
    page = d["block_table"][:, pos // PAGE].long()                              # [b, comp]
    k = vals[page, pos % PAGE].float() * scales[page, pos % PAGE][..., None]    # [b, comp, D]
    q = d["q"].float() * d["q_scale"][:, None, None]
    s = torch.einsum("bhd,bld->bhl", q, k).relu_()
    out.fill_(float("-inf"))
    out[:, :comp] = (s * d["weights"][:, :, None]).sum(1)
    return out


def prefill_row(tokens: int, ctx: int, arch, g: torch.Generator) -> dict:
    """indexer_prefill_logits for the last `tokens` tokens of a ctx-token prompt: token t sees compressed columns
    [0, (ctx - tokens + t + 1) // 4) of a contiguous K of ctx // 4 rows; one call, L2 flushed. TFLOP/s counts the
    valid columns' q.k products (2 x heads x D a column)."""
    import dsv4_jit
    from dsv4_jit.kernels.indexer.reference import quantize_rows_fp8
    if not 0 < tokens <= ctx:
        raise ValueError(f"--prefill {tokens}: needs 0 < tokens <= --prefill-ctx {ctx}")
    comp = ctx // RATIO
    k8, ks = quantize_rows_fp8(torch.randn(comp, DIM, generator=g, device="cuda"))
    q8, qs = quantize_rows_fp8(torch.randn(tokens, HEADS * DIM, generator=g, device="cuda"))
    w = torch.randn(tokens, HEADS, generator=g, device="cuda") * 0.01
    pos = torch.arange(ctx - tokens, ctx, device="cuda", dtype=torch.int32)
    lo = torch.zeros(tokens, dtype=torch.int32, device="cuda")
    hi = torch.div(pos + 1, RATIO, rounding_mode="floor").to(torch.int32)
    req = torch.zeros(tokens, dtype=torch.int32, device="cuda")
    out = torch.empty(tokens, comp, dtype=torch.float32, device="cuda")
    info = torch.empty(tokens, 3, dtype=torch.int32, device="cuda")
    us, why = cold_us(lambda: dsv4_jit.indexer_prefill_logits(q8.view(tokens, HEADS, DIM), qs, w, k8, ks, lo, hi, req,
                                                              arch=arch, out=out, row_info=info))
    flops = 2 * HEADS * DIM * int(hi.sum())
    row = {"tokens": tokens, "ctx": ctx, "us": us, "tflops": flops / (us * 1e-6) / 1e12, "notes": [why] if why else []}
    print(f"prefill logits: {tokens} tokens at {ctx} context: {us:.1f} us, {row['tflops']:.0f} TFLOP/s"
          + (f" ({why})" if why else ""))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536, 262144])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--arch", default=None, help="schedule to run: native (default) or sm_120a (emulated)")
    ap.add_argument("--layers", type=int, default=8,
                    help="distinct input sets per timed graph for the per-layer columns (1: one-call columns only)")
    ap.add_argument("--width", type=int, default=None,
                    help="logits columns in every row (default: the largest context / 4 + 64)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch baseline columns (the slowest to time)")
    ap.add_argument("--prefill", type=int, nargs="*", default=[],
                    help="also time indexer_prefill_logits for these chunk sizes (tokens at the end of a prompt of "
                         "--prefill-ctx tokens, causal over its compressed K)")
    ap.add_argument("--prefill-ctx", type=int, default=65536)
    ap.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-decode: the prefill table alone")
    ap.add_argument("--out", default="bench_out/indexer.json")
    ap.add_argument("--no-topk-trigger", action="store_true",
                    help="A/B: the top-k kernels without their early PDL trigger (variants of their own: trigger=False)")
    args = ap.parse_args()
    if args.no_topk_trigger:   # a param of the variants (their own cache keys), read by the specs' select
        from dsv4_jit.kernels.indexer import topk as topk_mod
        topk_mod.TOPK_TRIGGER = False
    if args.layers < 1:
        ap.error("--layers must be >= 1")

    import dsv4_jit
    from dsv4_jit.arch import detect_arch, get_profile
    from dsv4_jit.kernels.indexer.ops import indexer_topk_workspace_numel as ws_numel
    native = detect_arch()
    arch = native if args.arch is None else (get_profile(args.arch) if get_profile(args.arch).family == native.family
                                             else get_profile(args.arch).emulated(native))
    try:
        from benchmarks.peers.vllm_indexer import load_peer
        peer, peer_reason = load_peer(), None
    except Exception as e:  # missing .peers/ or an import problem: report it, keep the other columns
        peer, peer_reason = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]

    width = args.width or max(args.contexts) // RATIO + 64
    if width < max(args.contexts) // RATIO:
        ap.error(f"--width {width} is below the largest context's {max(args.contexts) // RATIO} columns")
    g = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth_gbs()
    rows = []
    hdr = (f"{'ctx':>7} {'B':>3} {'ours logits':>11} {'nofill':>6} {'ours topk':>9} {'ours +topk':>10} {'logits/L':>8} "
           f"{'+topk/L':>7} {'GB/s':>7} {'%copy':>6} "
           f"{'torch logits':>12} {'torch +topk':>11} {'vllm logits':>11} {'vllm +topk':>10} {'err ours':>8} {'err vllm':>8}")
    print(f"{torch.cuda.get_device_name()}; schedule {arch.schedule} on {arch.name}; copy bandwidth {bw:,.0f} GB/s")
    print(hdr)
    for ctx in (args.contexts if args.decode else []):
        for b in args.batch:
            d = make_inputs(b, ctx, width, g)
            kw = dict(next_n=1, arch=arch)
            lg = torch.empty(b, width, dtype=torch.float32, device="cuda")
            info = torch.empty(b, 3, dtype=torch.int32, device="cuda")
            idx = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
            lens = torch.empty(b, dtype=torch.int32, device="cuda")
            tws = torch.zeros(ws_numel(b), dtype=torch.int32, device="cuda")  # kept zeroed by the kernel
            args_ = (d["q"], d["q_scale"], d["weights"], d["kv_cache"], d["seq_lens"], d["block_table"])
            ours_l, r1 = cold_us(lambda: dsv4_jit.indexer_decode_logits(*args_, out=lg, row_info=info, **kw))
            ours_nf, r6 = cold_us(lambda: dsv4_jit.indexer_decode_logits(*args_, out=lg, row_info=info, clean=False,
                                                                         **kw))
            dsv4_jit.indexer_decode_logits(*args_, out=lg, row_info=info, **kw)
            ref_l = torch_logits(d, torch.empty_like(lg))[:, :d["comp"]] if b <= 8 else None
            err_o = None if ref_l is None else row_rel_err(lg[:, :d["comp"]], ref_l)
            ours_k, r3 = cold_us(lambda: dsv4_jit.indexer_topk(lg, info, d["block_table"], topk=TOPK, page_size=PAGE,
                                                               arch=arch, out=(idx, lens), workspace=tws))
            ours_t, r2 = cold_us(lambda: dsv4_jit.indexer_decode_topk(*args_, topk=TOPK, workspace=(lg, info, tws),
                                                                                out=(idx, lens), **kw))
            per_l = per_t = None
            if args.layers > 1:
                # every layer its own inputs and outputs: each call reads its own index-K, none is served from L2
                sets = [(args_, lg, info, idx, lens, tws)]
                for _ in range(args.layers - 1):
                    dl = make_inputs(b, ctx, width, g)
                    sets.append(((dl["q"], dl["q_scale"], dl["weights"], dl["kv_cache"], dl["seq_lens"], dl["block_table"]),
                                 torch.empty_like(lg), torch.empty_like(info), torch.empty_like(idx), torch.empty_like(lens),
                                 torch.zeros_like(tws)))

                def all_logits():
                    for a, lg_, info_, _, _, _ in sets:
                        dsv4_jit.indexer_decode_logits(*a, out=lg_, row_info=info_, **kw)

                def all_steps():
                    for a, lg_, info_, idx_, lens_, tws_ in sets:
                        dsv4_jit.indexer_decode_topk(*a, topk=TOPK, workspace=(lg_, info_, tws_), out=(idx_, lens_),
                                                     **kw)
                many_l, r4 = graph_us_or_reason(all_logits, reps=1)
                many_t, r5 = graph_us_or_reason(all_steps, reps=1)
                per_l = None if many_l is None else many_l / len(sets)
                per_t = None if many_t is None else many_t / len(sets)
                # the layers' answers are the same op's: check the last set's top-k like the first's
                a, lg_, info_, idx_, lens_, _ = sets[-1]
                if many_t is not None and not torch.equal(lens_, torch.clamp(info_[:, 1] - info_[:, 0], max=TOPK)):
                    raise RuntimeError("per-layer run: top-k lengths disagree with row_info")
                sets = None
            tl = torch.empty_like(lg)
            t_l = t_t = None
            if not args.no_torch:
                t_l, _ = cold_us(lambda: torch_logits(d, tl))
                t_t, _ = cold_us(lambda: torch.topk(torch_logits(d, tl), TOPK, dim=1))
            v_l = v_t = err_v = None
            v_reason = peer_reason
            if peer is not None:
                try:
                    cache = peer.cache_view(d["kv_cache"].view(-1, PAGE * (DIM + 4)), PAGE)
                    clen = torch.full((b,), d["comp"], dtype=torch.int32, device="cuda")
                    w = d["weights"] * d["q_scale"][:, None]
                    v_l, v_reason = cold_us(lambda: peer.logits(d["q"], w, cache, clen, d["block_table"], width))
                    if ref_l is not None:
                        err_v = row_rel_err(peer.logits(d["q"], w, cache, clen, d["block_table"], width)[:, :d["comp"]],
                                            ref_l)
                    v_t, _ = cold_us(lambda: peer.topk(peer.logits(d["q"], w, cache, clen, d["block_table"], width), clen))
                except Exception as e:
                    v_reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            kbytes = b * d["comp"] * (DIM + 4)
            t_bw = per_l if per_l else ours_l
            gbs = kbytes / (t_bw * 1e-6) / 1e9 if t_bw else None
            row = {"ctx": ctx, "compressed": d["comp"], "batch": b, "width": width, "index_k_bytes": kbytes,
                   "ours_logits_us": ours_l, "ours_logits_nofill_us": ours_nf, "ours_topk_us": ours_k,
                   "ours_max_row_rel_err": err_o, "vllm_max_row_rel_err": err_v, "ours_logits_topk_us": ours_t, "layers": args.layers,
                   "ours_logits_per_layer_us": per_l, "ours_logits_topk_per_layer_us": per_t, "ours_gbs": gbs,
                   "ours_pct_copy": (100 * gbs / bw) if gbs else None, "torch_logits_us": t_l, "torch_logits_topk_us": t_t,
                   "vllm_logits_us": v_l, "vllm_logits_topk_us": v_t,
                   "notes": [r for r in (r1, r6, r3, r2, v_reason) if r]}
            if args.layers > 1:
                row["notes"] += [r for r in (r4, r5) if r]
            rows.append(row)
            f = lambda x, w_=10: f"{x:>{w_}.1f}" if isinstance(x, float) else f"{'-':>{w_}}"  # noqa: E731
            e = lambda x: f"{x:>8.1e}" if isinstance(x, float) else f"{'-':>8}"  # noqa: E731
            print(f"{ctx:>7} {b:>3} {f(ours_l, 11)} {f(ours_nf, 6)} {f(ours_k, 9)} {f(ours_t)} {f(per_l, 8)} {f(per_t, 7)} "
                  f"{f(gbs, 7)} {f(row['ours_pct_copy'], 6)} "
                  f"{f(t_l, 12)} {f(t_t, 11)} {f(v_l, 11)} {f(v_t)} {e(err_o)} {e(err_v)}")
            del d
            torch.cuda.empty_cache()
    prefill_rows = [prefill_row(t, args.prefill_ctx, arch, g) for t in args.prefill]
    if peer_reason:
        print(f"\nvLLM peer unavailable: {peer_reason}")
    print("\nGB/s, %copy: index-K bytes (batch x ctx/4 x 132 B) / ours logits time per layer (one call where "
          "--layers 1), vs the copy bandwidth above. "
          "vLLM columns: its ROCm-path Triton logits + torch top-k, not its SM12x path (see benchmarks/peers/vllm_indexer.py).")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **run_info(), "schedule": arch.schedule, "arch": arch.name,
                               "copy_gbs": bw, "rows": rows, "prefill_rows": prefill_rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
