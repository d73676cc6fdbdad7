"""The attention block of a decode step as the engine runs it, per layer, on both schedules.

  ratio 4    indexer logits -> top-k 512 (compressed slots) -> sparse MLA over the SWA window + those slots
             (indexer_decode_topk, logits and top-k PDL-paired, then sparse_mla_decode on its output)
  ratio 128  sparse MLA over the SWA window + every ctx/128 compressed block
Both layer kinds read the SWA lists of one indexer_swa_indices call at the head of the graph (once a step, as the
engine runs it; its time is spread over the layers). The index-K cache and the compressed fp8_ds_mla cache share one
page table (vLLM: one block table for the layer's compressed caches), so the top-k's slots address the attention
cache directly.

Time: one CUDA graph holds --layers layers, each with its own inputs and caches, replayed with L2 flushed before it;
per layer = graph time / layers. Columns: ours with the GPU's own schedule and with the SM120 schedule compiled for
it (mma.sync path; an H100 timing, never an SM120 one). At batch <= 8 the first layer's attention output is checked
against the float64 reference over the lists the kernels produced. The scoreboard (goal_table.py) sets each row
against the sum of its steps' floors (the sparse MLA point, and at ratio 4 the indexer step's).

    python benchmarks/attention/bench_attention_block.py --out bench_out/bench_attention_block.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import graph_us_or_reason, row_rel_err, write_rows  # noqa: E402

from dsv4_jit.kernels.attention import ops as attn_ops, reference as attn_ref  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D, NOPE, SCALE_BYTES, TOKEN_BYTES  # noqa: E402
from dsv4_jit.kernels.indexer.reference import pack_paged_cache, quantize_rows_fp8  # noqa: E402

PAGE, WINDOW, TOPK, INDEX_HEADS, INDEX_DIM = 64, 128, 512, 64, 128


def random_mla_cache(pages: int, g: torch.Generator) -> torch.Tensor:
    """An fp8_ds_mla cache of random finite rows (no NaN codes), scales 2^-3 .. 2^3."""
    pb = attn_ref.page_bytes_for(PAGE)
    c = torch.randint(0, 256, (pages, pb), dtype=torch.uint8, device="cuda", generator=g)
    data = c[:, : PAGE * TOKEN_BYTES].view(pages, PAGE, TOKEN_BYTES)
    nope = data[..., :NOPE]
    nope.masked_fill_((nope & 0x7F) == 0x7F, 0)
    data[..., NOPE:] = torch.randn(pages, PAGE, (TOKEN_BYTES - NOPE) // 2, device="cuda", generator=g,
                                   dtype=torch.bfloat16).view(torch.uint8)
    sc = c[:, PAGE * TOKEN_BYTES: PAGE * (TOKEN_BYTES + SCALE_BYTES)].view(pages, PAGE, SCALE_BYTES)
    sc[..., :7] = torch.randint(124, 131, (pages, PAGE, 7), dtype=torch.uint8, device="cuda", generator=g)
    return c


def make_layer(batch: int, heads: int, ctx: int, ratio: int, swa: tuple, g: torch.Generator) -> dict:
    """One layer's inputs: q, sink, the compressed cache (and for ratio 4 the index-K cache, its q and weights)
    over one shuffled page table of ctx // ratio positions per request."""
    comp = ctx // ratio
    per = -(-comp // PAGE)
    pool = batch * per + 1
    bt = torch.full((batch, per + 1), -1, dtype=torch.int32, device="cuda")
    bt[:, :per] = torch.randperm(pool, device="cuda", generator=g)[: batch * per].view(batch, per).int()
    d = {"q": (torch.randn(batch, heads, D, device="cuda", generator=g) * 2).to(torch.bfloat16),
         "sink": torch.randn(heads, device="cuda", generator=g), "comp_cache": random_mla_cache(pool, g),
         "block_table": bt, "seq_lens": torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
         "swa_cache": swa[0], "swa_idx": swa[1], "swa_len": swa[2]}
    if ratio == 4:
        k8, ks = quantize_rows_fp8(torch.randn(pool * PAGE, INDEX_DIM, device="cuda", generator=g))
        q8, qs = quantize_rows_fp8(torch.randn(batch, INDEX_HEADS * INDEX_DIM, device="cuda", generator=g))
        d.update(index_cache=pack_paged_cache(k8, ks, PAGE), iq=q8.view(batch, INDEX_HEADS, INDEX_DIM), iq_scale=qs,
                 iw=torch.randn(batch, INDEX_HEADS, device="cuda", generator=g) * 0.01,
                 logits=torch.empty(batch, comp + PAGE, device="cuda"),
                 info=torch.empty(batch, 3, dtype=torch.int32, device="cuda"),
                 topk_ws=torch.zeros(attn_topk_ws(batch), dtype=torch.int32, device="cuda"),
                 idx2=torch.empty(batch, TOPK, dtype=torch.int32, device="cuda"),
                 len2=torch.empty(batch, dtype=torch.int32, device="cuda"))
    else:
        pos = torch.arange(comp, device="cuda")
        d["idx2"] = (bt[:, pos // PAGE] * PAGE + pos % PAGE).int().contiguous()
        d["len2"] = torch.full((batch,), comp, dtype=torch.int32, device="cuda")
    d["out"] = torch.empty_like(d["q"])
    return d


def attn_topk_ws(batch: int) -> int:
    from dsv4_jit.kernels.indexer.ops import indexer_topk_workspace_numel
    return indexer_topk_workspace_numel(batch)


def swa_step(batch: int, ctx: int, g: torch.Generator) -> dict:
    """The SWA cache (the window's pages of every request) and the prep call that lists each token's window."""
    need = -(-WINDOW // PAGE) + 1
    pool = batch * need + 1
    max_pages = -(-ctx // PAGE)
    bt = torch.full((batch, max_pages), -1, dtype=torch.int32, device="cuda")
    last = (ctx - 1) // PAGE
    bt[:, last - need + 1: last + 1] = torch.randperm(pool, device="cuda", generator=g)[: batch * need].view(batch, need).int()
    return {"cache": random_mla_cache(pool, g), "positions": torch.full((batch,), ctx - 1, dtype=torch.int32, device="cuda"),
            "req": torch.arange(batch, dtype=torch.int32, device="cuda"), "block_table": bt,
            "idx": torch.empty(batch, WINDOW, dtype=torch.int32, device="cuda"),
            "len": torch.empty(batch, dtype=torch.int32, device="cuda")}


def run_layer(d: dict, arch, ws: torch.Tensor) -> None:
    import dsv4_jit
    if "index_cache" in d:
        dsv4_jit.indexer_decode_topk(d["iq"], d["iq_scale"], d["iw"], d["index_cache"], d["seq_lens"], d["block_table"],
                                     next_n=1, topk=TOPK, arch=arch, workspace=(d["logits"], d["info"], d["topk_ws"]),
                                     out=(d["idx2"], d["len2"]))
    dsv4_jit.sparse_mla_decode(d["q"], d["swa_cache"], d["swa_idx"], d["swa_len"], d["sink"], block_size=PAGE,
                               extra_kv_cache=d["comp_cache"], extra_indices=d["idx2"], extra_lengths=d["len2"],
                               extra_block_size=PAGE, out=d["out"], workspace=ws, check_indices=False, arch=arch)


SCHEDULES = {"ours_sm90": None, "ours_sm120": "sm_120a"}   # column -> schedule (None: the GPU's own)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 16], help="64/TP for V4-Flash at TP 1/4")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ctx", type=int, nargs="+", default=[65536])
    ap.add_argument("--ratios", type=int, nargs="+", default=[4, 128])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default="bench_out/bench_attention_block.json")
    ap.add_argument("--no-topk-trigger", action="store_true",
                    help="A/B: the top-k kernels without their early PDL trigger (variants of their own: trigger=False)")
    args = ap.parse_args()
    if args.no_topk_trigger:   # a param of the variants (their own cache keys), read by the specs' select
        from dsv4_jit.kernels.indexer import topk as topk_mod
        topk_mod.TOPK_TRIGGER = False
    from dsv4_jit.arch import detect_arch, get_profile
    native = detect_arch()
    archs = {col: native if s is None else get_profile(s).emulated(native) for col, s in SCHEDULES.items()}
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}; per layer, {args.layers} layers a graph; "
          + ", ".join(f"{col} = {a.schedule} on {a.name}" for col, a in archs.items()))
    print(f"{'H':>3} {'ratio':>5} {'ctx':>6} {'B':>3} " + " ".join(f"{col:>12} {'err':>8}" for col in archs))
    for heads in args.heads:
        for ratio in args.ratios:
            for ctx in args.ctx:
                for batch in args.batch:
                    s = swa_step(batch, ctx, g)
                    swa = (s["cache"], s["idx"], s["len"])
                    layers = [make_layer(batch, heads, ctx, ratio, swa, g) for _ in range(args.layers)]
                    row = {"heads": heads, "ratio": ratio, "ctx": ctx, "batch": batch, "layers": args.layers}
                    cells = []
                    for col, arch in archs.items():
                        ws = torch.empty(max(1, attn_ops.sparse_mla_workspace_numel(arch, heads, batch)), device="cuda")

                        def step(arch=arch, ws=ws):
                            import dsv4_jit
                            dsv4_jit.indexer_swa_indices(s["positions"], s["req"], s["block_table"], window=WINDOW,
                                                         page_size=PAGE, arch=arch, out=(s["idx"], s["len"]))
                            for d in layers:
                                run_layer(d, arch, ws)
                        for d in layers:
                            d["out"].fill_(float("nan"))   # a row the kernels leave unwritten fails the check
                        step()
                        torch.cuda.synchronize()
                        err = None
                        if batch <= 8:
                            d = layers[0]
                            want = attn_ref.ref_sparse_mla(d["q"], attn_ref.unpack_fp8_ds_mla(s["cache"], PAGE), s["idx"],
                                                           s["len"], attn_ref.unpack_fp8_ds_mla(d["comp_cache"], PAGE),
                                                           d["idx2"], d["len2"], d["sink"], D ** -0.5)
                            err = row_rel_err(d["out"], want)
                        many, why = graph_us_or_reason(step, reps=1)
                        us = None if many is None else many / args.layers
                        row[col] = {"us": us, "max_token_rel_err": err, "why": why, "schedule": arch.schedule}
                        cells.append((f"{us:12.2f}" if us is not None else f"{'fail':>12}")
                                     + (f" {err:8.1e}" if err is not None else f" {'-':>8}"))
                        ws = None
                    rows.append(row)
                    print(f"{heads:>3} {ratio:>5} {ctx // 1024:>5}K {batch:>3} " + " ".join(cells), flush=True)
                    layers = s = swa = None
                    torch.cuda.empty_cache()
    write_rows(args.out, rows, arch=native.name, layers=args.layers,
               note="us a layer; ours_sm120 = the SM120 schedule compiled for this GPU and timed on it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
