"""Container-build case, on the GPU machine: import a bundle that was compiled for sm_90a on a machine
with no GPU (another Python, another torch), then run every mHC op across token counts with compiles
forbidden (seal "error" before the first call). Passes only with zero compiles and correct numerics.

    python scripts/container_case.py BUNDLE [--tokens 1 7 64 513 4096] [--gemm-model deepseek-v4-flash]

--gemm-model also runs every FP8 GEMM shape of that model (TP 1) at token counts 1..--gemm-sweep and a few
prefill sizes, checking numerics at some of them: a bundle built by `dsv4-jit warmup --family mhc,gemm`.
--attention-model runs the model's sparse MLA decode (fp8_ds_mla cache, SWA + compressed lists) and prefill
(gathered bf16 KV) at TP 1 for every token count 1..--attention-sweep, checking numerics at some of them: a bundle
with the attention family.
--indexer-model runs the model's lightning indexer: decode logits + top-k at next_n 1 for every token count
1..--indexer-sweep and at next_n 2 / 3 for a few, and prefill logits + top-k at a few token counts, checking the
logits against float64 and the top-k as a set: a bundle with the indexer family.
--moe-model runs the model's routed experts at TP 1 for every token count 1..--moe-sweep and prefill sizes: routing
(scored and hash-routed), moe_align at the variant's block_m, the w1+w3 and w2 MXFP4 grouped GEMMs and the combine,
checking the GEMMs against float64 at some token counts (16 experts: the expert count is runtime): a bundle with
the moe family.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 7, 64, 513, 4096])
    ap.add_argument("--sweep", type=int, default=8192, help="launch every op at every T in 1..N")
    ap.add_argument("--gemm-model", default=None, help="also run this model's FP8 GEMMs (bundle with the gemm family)")
    ap.add_argument("--gemm-sweep", type=int, default=300, help="GEMM token counts 1..N, then prefill sizes")
    ap.add_argument("--attention-model", default=None,
                    help="also run this model's sparse MLA decode and prefill (bundle with the attention family)")
    ap.add_argument("--attention-sweep", type=int, default=300, help="attention token counts 1..N")
    ap.add_argument("--indexer-model", default=None,
                    help="also run this model's indexer decode / prefill logits and top-k (bundle with the indexer family)")
    ap.add_argument("--indexer-sweep", type=int, default=300, help="indexer decode token counts 1..N (next_n 1)")
    ap.add_argument("--moe-model", default=None, help="also run this model's routed experts (bundle with the moe family)")
    ap.add_argument("--moe-sweep", type=int, default=300, help="MoE token counts 1..N, then prefill sizes")
    args = ap.parse_args()
    import dsv4_jit
    from dsv4_jit.cache_tools.bundle import import_bundle
    from dsv4_jit.jit import default_store
    from dsv4_jit.toolchain import toolchain_fingerprint
    from dsv4_jit.kernels.mhc import reference as ref

    t0 = time.perf_counter()
    report = import_bundle(default_store(), args.bundle, toolchain_fingerprint())
    print(f"imported {args.bundle} in {time.perf_counter() - t0:.2f} s: {report}")
    dsv4_jit.seal("error")  # any compile from here on raises
    H, HC, M = 4096, 4, 24
    g = torch.Generator(device="cuda").manual_seed(1)
    fn = torch.randn(M, HC * H, device="cuda", generator=g) * 1e-2
    scale = torch.rand(3, device="cuda", generator=g) + 0.5
    base = torch.randn(M, device="cuda", generator=g) * 0.1
    worst = 0.0
    for t in args.tokens:
        res = torch.randn(t, HC, H, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(t, H, device="cuda", generator=g).to(torch.bfloat16)
        li, post, comb = dsv4_jit.mhc_pre(res, fn, scale, base, rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0)
        rli, rpost, rcomb = ref.ref_mhc_pre(res, fn, scale, base, 1e-6, 1e-6, 20, 2.0)
        out = dsv4_jit.mhc_post(x, res, post, comb)
        rout = ref.ref_mhc_post(x, res, post, comb)
        for a, b in ((li, rli), (post, rpost), (comb, rcomb), (out, rout)):
            err = ((a.float() - b.float()).norm() / b.float().norm()).item()
            worst = max(worst, err)
    # Every token count the engine can produce (1..--sweep), every public op and call-site flavour,
    # real launches: the planner's coverage must equal what serving selects.
    T_MAX = args.sweep
    res_max = torch.randn(T_MAX, HC, H, device="cuda", generator=g).to(torch.bfloat16)
    x_max = torch.randn(T_MAX, H, device="cuda", generator=g).to(torch.bfloat16)
    mixes_max = torch.randn(T_MAX, M, device="cuda", generator=g)
    norm_w = torch.rand(H, device="cuda", generator=g).to(torch.bfloat16) + 0.5
    fn_head = torch.randn(HC, HC * H, device="cuda", generator=g) * 1e-2
    scale_h, base_h = scale[:1].contiguous(), base[:HC].contiguous()
    kw = dict(rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0)
    t1 = time.perf_counter()
    for t in range(1, T_MAX + 1):
        res, x = res_max[:t], x_max[:t]
        li, post, comb = dsv4_jit.mhc_pre(res, fn, scale, base, norm_weight=norm_w, **kw)
        dsv4_jit.mhc_pre(res, fn, scale, base, **kw)
        dsv4_jit.mhc_pre(x, fn, scale, base, norm_weight=norm_w, **kw)          # first layer: broadcast
        dsv4_jit.mhc_sinkhorn(mixes_max[:t], scale, base, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0)
        dsv4_jit.mhc_post(x, res, post, comb)
        dsv4_jit.mhc_post_pre_fused(x, res, post, comb, fn)
        dsv4_jit.hc_head(res, fn_head, scale_h, base_h, rms_eps=1e-6, hc_eps=1e-6)
    torch.cuda.synchronize()
    print(f"sweep: 7 op calls x {T_MAX} token counts in {time.perf_counter() - t1:.1f} s, "
          f"compiles so far {dsv4_jit.counters()['compiles']}")
    if args.gemm_model:
        worst = max(worst, gemm_sweep(args.gemm_model, args.gemm_sweep))
    if args.attention_model:
        worst = max(worst, attention_sweep(args.attention_model, args.attention_sweep))
    if args.indexer_model:
        worst = max(worst, indexer_sweep(args.indexer_model, args.indexer_sweep))
    if args.moe_model:
        worst = max(worst, moe_sweep(args.moe_model, args.moe_sweep))
    c = dsv4_jit.counters()
    print(json.dumps({"tokens": args.tokens, "sweep": args.sweep, "max_rel_err": worst, "counters": {k: c[k] for k in ("hits", "loads", "compiles")}}))
    ok = c["compiles"] == 0 and worst < 2e-2
    print("CONTAINER CASE", "PASSED" if ok else "FAILED", f"(compiles={c['compiles']}, loads={c['loads']}, max rel err {worst:.2e})")
    return 0 if ok else 1


def token_err(got, ref) -> float:
    """Worst per-token relative error: each row of the first dim of `got` against the float64 reference."""
    g, r = got.double().flatten(1), ref.double().flatten(1)
    return ((g - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)).max().item()


def sweep_done(what: str, t0: float, worst: float) -> float:
    import dsv4_jit
    torch.cuda.synchronize()
    print(f"{what} in {time.perf_counter() - t0:.1f} s, worst per-token error {worst:.2e}, "
          f"compiles so far {dsv4_jit.counters()['compiles']}")
    return worst


def gemm_sweep(model_name: str, t_max: int) -> float:
    """Every FP8 GEMM shape of the model at TP 1, every T in 1..t_max and prefill sizes, under the seal; the worst
    per-token error against float64 at a few T of each shape (every GEMM form: ring, split, large M)."""
    import dsv4_jit
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.kernels.gemm.family import gemm_shapes, make_activations, make_weights
    from dsv4_jit.kernels.gemm.reference import ref_fp8_gemm

    g = torch.Generator(device="cuda").manual_seed(2)
    tokens = list(range(1, t_max + 1)) + [512, 1000, 2049, 4096, 8192]
    checked = {1, 16, 64, 65, 128, 129, 256, 257, 2049}
    worst = 0.0
    t0 = time.perf_counter()
    shapes = gemm_shapes(load_model_config(model_name), 1)
    for s in shapes:
        n, k, grp = s["n"], s["k"], s["groups"]
        a, sa = make_activations(max(tokens), grp * k, g, "cuda")
        b, sb = make_weights(grp, n, k, g, "cuda")
        for t in tokens:
            c = dsv4_jit.fp8_gemm(a[:t], sa[:t], b, sb, groups=grp)
            if t in checked:
                worst = max(worst, token_err(c, ref_fp8_gemm(a[:t], sa[:t], b, sb, groups=grp)))
    return sweep_done(f"gemm sweep: {len(shapes)} {model_name} shapes x {len(tokens)} token counts", t0, worst)


def moe_sweep(model_name: str, t_max: int) -> float:
    """The routed experts of the model at TP 1 under the seal, every T in 1..t_max and prefill sizes: route (both
    forms, over the model's expert count), align, both grouped GEMMs over 16 experts, combine; the GEMMs' worst
    per-row error against float64 at a few T (every block_m: 8, 16, 32, 64)."""
    import dsv4_jit
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.kernels.gemm.family import make_activations
    from dsv4_jit.kernels.moe import reference
    from dsv4_jit.kernels.moe.family import moe_shapes

    m = load_model_config(model_name)
    g = torch.Generator(device="cuda").manual_seed(4)
    experts, topk, e_model = 16, int(m.num_experts_per_tok), int(m.n_routed_experts)
    tokens = list(range(1, t_max + 1)) + [512, 513, 1000, 2049, 4096]
    checked = {1, 7, 64, 256, 257, 512, 513, 2049, 4096}
    (w13s, w2s) = moe_shapes(m, 1)
    weights = []
    for s in (w13s, w2s):
        wf = torch.randn(experts, s["n"], s["k"], generator=g, device="cuda") * 0.02
        weights.append(reference.quantize_expert_weights(wf))
        del wf
    logits = torch.randn(max(tokens), e_model, generator=g, device="cuda")
    bias = torch.randn(e_model, generator=g, device="cuda") * 0.1
    hash_ids = torch.rand(max(tokens), e_model, generator=g, device="cuda").argsort(dim=1)[:, :topk].int()
    x, sx = make_activations(max(tokens), w13s["k"], g, "cuda")
    h, sh = make_activations(max(tokens) * topk, w2s["k"], g, "cuda")
    worst = 0.0
    t0 = time.perf_counter()
    for t in tokens:
        dsv4_jit.moe_route(logits[:t], topk=topk, routed_scaling=1.5, bias=bias)
        dsv4_jit.moe_route(logits[:t], topk=topk, routed_scaling=1.5, hash_ids=hash_ids[:t])
        ids = torch.rand(t, experts, generator=g, device="cuda").argsort(dim=1)[:, :topk].int()
        rw = torch.rand(t, topk, generator=g, device="cuda")
        for s, (w, sw), (act, act_s) in ((w13s, weights[0], (x, sx)), (w2s, weights[1], (h, sh))):
            bm = dsv4_jit.fp4_moe_block_m(s["n"], s["k"], t)
            rows, blocks = dsv4_jit.moe_align(ids, experts, bm)
            src = rows.clamp(min=0).long() // topk
            a, sa = act[src].contiguous(), act_s[src].contiguous()
            c = dsv4_jit.fp4_moe_gemm(a, sa, w, sw, blocks, num_tokens=t)
            if t in checked:
                # the first 64 blocks of the layout (a float64 GEMM over them stays seconds at 4,096 tokens)
                nr = min(blocks.numel(), 64) * bm
                ref = reference.ref_fp4_moe_gemm(a[:nr], sa[:nr], w, sw, blocks[:nr // bm], bm)
                valid = rows[:nr] >= 0
                err = ((c[:nr].double() - ref)[valid].norm(dim=1) / ref[valid].norm(dim=1).clamp_min(1e-30)).max().item()
                worst = max(worst, err)
                del ref
        dsv4_jit.moe_combine(c, dsv4_jit.moe_entry_rows(rows, t * topk), rw)
    return sweep_done(f"moe sweep: route x 2, align, w1+w3 and w2 GEMMs, combine ({model_name} TP 1) x {len(tokens)} "
                      f"token counts", t0, worst)


def attention_sweep(model_name: str, t_max: int) -> float:
    """Sparse MLA decode and prefill of the model at TP 1 (its heads, its scale) at every T in 1..t_max, under the
    seal: every split count and gather pipeline select can pick. Per-token error against float64 at a few T."""
    import dsv4_jit
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.kernels.attention import reference as aref

    m = load_model_config(model_name)
    heads, scale, d = m.num_attention_heads, m.head_dim ** -0.5, 512
    g = torch.Generator(device="cuda").manual_seed(3)
    bs, n1, n2, rows = 64, m.sliding_window, m.index_topk, 4096
    pages = rows // bs
    kv = torch.randn(rows, d, device="cuda", generator=g) * torch.exp(torch.rand(rows, 1, device="cuda", generator=g) - 0.5)
    cache = aref.pack_fp8_ds_mla(kv, torch.arange(rows, device="cuda"), pages, bs)
    unpacked = aref.unpack_fp8_ds_mla(cache, bs)
    kv_bf16 = kv.to(torch.bfloat16)
    q_all = (torch.randn(t_max, heads, d, device="cuda", generator=g) * 2).to(torch.bfloat16)
    idx1_all = torch.randint(0, rows, (t_max, n1), device="cuda", generator=g, dtype=torch.int32)
    idx2_all = torch.randint(0, rows, (t_max, n2), device="cuda", generator=g, dtype=torch.int32)
    len1_all = torch.randint(1, n1 + 1, (t_max,), device="cuda", generator=g, dtype=torch.int32)
    len2_all = torch.randint(0, n2 + 1, (t_max,), device="cuda", generator=g, dtype=torch.int32)
    sink = torch.randn(heads, device="cuda", generator=g)
    checked = {1, 2, 8, 24, 64, 192, t_max}
    worst = 0.0
    t0 = time.perf_counter()
    for t in range(1, t_max + 1):
        q, i1, i2, l1, l2 = q_all[:t], idx1_all[:t], idx2_all[:t], len1_all[:t], len2_all[:t]
        dec = dsv4_jit.sparse_mla_decode(q, cache, i1, l1, sink, block_size=bs, extra_kv_cache=cache,
                                         extra_indices=i2, extra_lengths=l2, extra_block_size=bs, softmax_scale=scale)
        pre = dsv4_jit.sparse_mla_prefill(q, kv_bf16, i1, l1, sink, extra_kv=kv_bf16, extra_indices=i2,
                                          extra_lengths=l2, softmax_scale=scale)
        if t in checked:
            for got, src in ((dec, unpacked), (pre, kv_bf16.float())):
                worst = max(worst, token_err(got, aref.ref_sparse_mla(q, src, i1, l1, src, i2, l2, sink, scale)))
    return sweep_done(f"attention sweep: {model_name} ({heads} heads) decode + prefill x {t_max} token counts", t0,
                      worst)


def indexer_sweep(model_name: str, t_max: int) -> float:
    """The indexer of the model under the seal: decode logits + top-k (next_n 1) at every T in 1..t_max over paged
    caches of mixed lengths up to 64K context, next_n 2 / 3 at a few batches, prefill logits + top-k at a few T.
    Per-token logits error against float64 at a few T; top-k must be a valid set there (exact)."""
    import dsv4_jit
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.kernels.indexer import family as ifam
    from dsv4_jit.kernels.indexer import reference as iref

    m = load_model_config(model_name)
    topk, page = m.index_topk, ifam.INDEX_PAGE_SIZE
    g = torch.Generator().manual_seed(4)
    checked = {1, 2, 8, 64, t_max}
    worst = 0.0
    t0 = time.perf_counter()

    def check(logits, info, lg_ref, info_ref, idx, lens, bt):
        lg_ref = lg_ref.to(logits.device)
        info_ref = info_ref.to(logits.device)
        fin = torch.isfinite(lg_ref)   # the -inf columns must match exactly (below); the rest by the error
        zero = torch.zeros_like(lg_ref)
        err = token_err(logits.double().where(fin, zero), lg_ref.where(fin, zero))
        if not torch.equal(torch.isinf(logits), torch.isinf(lg_ref)) or not torch.equal(info.long(), info_ref.long()):
            err = float("inf")
        # top-k against the kernel's own logits (the family cases' rule): a valid set, exactly
        want = iref.check_topk_sets(idx, logits, info.long(), bt, topk, page)
        n = (info[:, 1] - info[:, 0]).clamp(min=0, max=topk)
        if not torch.equal(idx.long(), want.long()) or not torch.equal(lens.long(), n.long()):
            err = float("inf")
        return err

    for next_n, batches in ((1, range(1, t_max + 1)), (2, (1, 8, 64)), (3, (1, 8, 64))):
        inp = ifam._decode_inputs(m, next_n, max(batches) * next_n, "cuda", g, max_ctx=65_536)
        for b in batches:
            t = b * next_n
            q, qs, w = inp["q"][:t], inp["q_scale"][:t], inp["weights"][:t]
            sl, bt = inp["seq_lens"][:b], inp["block_table"][:b]
            logits, info = dsv4_jit.indexer_decode_logits(q, qs, w, inp["kv_cache"], sl, bt, next_n=next_n,
                                                          width=inp["width"])
            idx, lens = dsv4_jit.indexer_topk(logits, info, bt, topk=topk, page_size=page)
            # the fused step (its logits skip the -inf fill: clean=False variants), with its own workspaces
            lg2, info2 = torch.empty_like(logits), torch.empty_like(info)
            idx2, lens2 = dsv4_jit.indexer_decode_topk(q, qs, w, inp["kv_cache"], sl, bt, next_n=next_n, topk=topk,
                                                       width=inp["width"], workspace=(lg2, info2))
            if b in checked:
                lg_ref, info_ref = iref.ref_decode_logits(q, qs, w, inp["kv_cache"], sl, bt, next_n, inp["width"],
                                                          ifam.RATIO)
                worst = max(worst, check(logits, info, lg_ref, info_ref, idx, lens, bt))
                want2 = iref.check_topk_sets(idx2, lg2, info2.long(), bt, topk, page)
                if not (torch.equal(idx2.long(), want2.long()) and torch.equal(lens2.long(), lens.long())
                        and torch.equal(info2, info)):
                    worst = float("inf")
    # prefill: T query tokens of one request over a contiguous compressed K, causal ranges
    nk = 4096
    k8, ks8 = iref.quantize_rows_fp8(torch.randn(nk, m.index_head_dim, device="cuda"))
    bt = torch.arange(nk // page, device="cuda", dtype=torch.int32)[None]
    for t in (1, 7, 64, 513, 2049):
        q8, qs = iref.quantize_rows_fp8(torch.randn(t, m.index_n_heads * m.index_head_dim, device="cuda"))
        q8 = q8.view(t, m.index_n_heads, m.index_head_dim)
        w = torch.randn(t, m.index_n_heads, device="cuda") * m.index_n_heads ** -0.5
        ke = torch.linspace(1, nk, t, device="cuda").to(torch.int32)
        ks = torch.zeros(t, dtype=torch.int32, device="cuda")
        req = torch.zeros(t, dtype=torch.int32, device="cuda")
        logits, info = dsv4_jit.indexer_prefill_logits(q8, qs, w, k8, ks8, ks, ke, req)
        idx, lens = dsv4_jit.indexer_topk(logits, info, bt, topk=topk, page_size=page)
        lg_ref, info_ref = iref.ref_prefill_logits(q8, qs, w, k8, ks8, ks, ke, req, nk)
        worst = max(worst, check(logits, info, lg_ref, info_ref, idx, lens, bt))
    return sweep_done(f"indexer sweep: {model_name} decode logits + top-k, and the fused step, x {t_max} token "
                      "counts (+ next_n 2 / 3, prefill)", t0, worst)


if __name__ == "__main__":
    sys.exit(main())
