"""SGLang 0.5.23's SM12x TileLang call conventions -> dsv4-jit ops.

Each `route_*` function takes exactly the parameters of the SGLang 0.5.23 function it replaces and returns
what it returns, in its shapes:

* `sglang/kernels/ops/layernorm/mhc.py`: `mhc_pre` -> (post_mix [..., hc, 1], comb [..., hc, hc],
  layer_input [..., H]); `mhc_post` -> a tensor shaped like `residual`; `mhc_fused_post_pre` -> (residual_cur,
  post_mix [..., hc, 1], comb, layer_input); `hc_split_sinkhorn` (mixes [b, s, (2+hc)*hc]) -> (pre [b, s, hc],
  post [b, s, hc] = 2 * sigmoid(...), comb [b, s, hc, hc]);
* `sglang/kernels/ops/attention/dsa/tilelang_kernel.py`: `tilelang_fp8_paged_mqa_logits` -> logits
  [batch, max_seq_len] fp32, valid for the columns below each row's `seq_lens` (SGLang passes the compressed
  length of each query row and `clean_logits=False`, so nothing past a row's length is defined or read).

The mHC conversions are the vLLM adapters' (`vllm_mhc`: views only; the same ops, the same statics). The
indexer route calls `dsv4_jit.indexer_decode_logits` with ratio 1 and next_n 1 (each query row sees the
compressed positions [0, seq_lens[row])), page size 64, clean=False and a q_scale of ones (SGLang's weights
already carry the query scale); the cache is read in place (its bytes as uint8).

Where a call cannot be served exactly (hc_pre_eps != hc_sinkhorn_eps; a norm weight without norm_eps, which
SGLang refuses; a non-contiguous tensor; an indexer layout other than 64-position pages of 128-dim fp8 rows with
fp32 scales; clean_logits=True, which SGLang refuses), the call goes to SGLang's own function, `FALLBACKS`
counts it and one warning per reason names it.
"""
from __future__ import annotations

import logging
from collections import Counter

from .vllm_mhc import Fallbacks, Unsupported, fused_args, fused_post_pre, post_args, pre_args, pre_result

log = logging.getLogger("dsv4_jit.sglang")

_fallback = Fallbacks("SGLang", log)
FALLBACKS: Counter = _fallback.counts   # "name: reason" -> calls served by SGLang's own function
ORIGINALS = _fallback.originals         # SGLang function name -> its original (set by sglang_route)
ROUTED: Counter = Counter()             # SGLang function name -> calls served by dsv4-jit

# SGLang's hc_split_sinkhorn kernel writes post = 2 * sigmoid(...) (no post-mult argument).
SINKHORN_POST_MULT = 2.0
# tilelang_fp8_paged_mqa_logits' layout (SGLang asserts it): 64-position pages of [128 fp8 | fp32 scale] rows.
INDEX_PAGE_SIZE = 64
INDEX_HEAD_DIM = 128
INDEX_HEADS = (8, 16, 32, 64)           # what dsv4-jit's logits kernel takes


def _bf16_norm(norm_weight, norm_eps):
    """SGLang's own conversion of the norm weight (bf16, contiguous); a weight without norm_eps it refuses."""
    if norm_weight is None:
        return None
    if norm_eps is None:
        raise Unsupported("norm_weight without norm_eps (SGLang refuses it)")
    import torch
    if norm_weight.dtype != torch.bfloat16:
        norm_weight = norm_weight.bfloat16()
    return norm_weight.contiguous()


def _empty_like_fused(residual):
    """SGLang's zero-token result of mhc_fused_post_pre."""
    import torch
    outer, hc, hidden = residual.shape[:-2], residual.shape[-2], residual.shape[-1]
    f32 = torch.float32
    return (torch.empty_like(residual), torch.empty((*outer, hc, 1), dtype=f32, device=residual.device),
            torch.empty((*outer, hc, hc), dtype=f32, device=residual.device),
            torch.empty((*outer, hidden), dtype=torch.bfloat16, device=residual.device))


# ---- mhc_pre ------------------------------------------------------------------------------------------

def route_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                  sinkhorn_repeat, n_splits=1, n_splits_pre=32, *, norm_weight=None, norm_eps=None):
    """Replaces SGLang's `mhc_pre` (same parameters, same results). n_splits / n_splits_pre only pick SGLang's
    GEMM split; dsv4-jit's `select` picks its own."""
    import dsv4_jit
    try:
        nw = _bf16_norm(norm_weight, norm_eps)
        args, kw, outer = pre_args(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                   hc_post_mult_value, sinkhorn_repeat, 1, nw, norm_eps)
    except Unsupported as e:
        return _fallback("mhc_pre", str(e), residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                         hc_post_mult_value, sinkhorn_repeat, n_splits, n_splits_pre, norm_weight=norm_weight,
                         norm_eps=norm_eps)
    ROUTED["mhc_pre"] += 1
    return pre_result(outer, *dsv4_jit.mhc_pre(*args, **kw))


# ---- mhc_post -----------------------------------------------------------------------------------------

def route_mhc_post(x, residual, post_layer_mix, comb_res_mix):
    """Replaces SGLang's `mhc_post`: returns a tensor shaped like `residual`."""
    import dsv4_jit
    try:
        args, shape = post_args(x, residual, post_layer_mix, comb_res_mix)
    except Unsupported as e:
        return _fallback("mhc_post", str(e), x, residual, post_layer_mix, comb_res_mix)
    ROUTED["mhc_post"] += 1
    return dsv4_jit.mhc_post(*args).view(shape)


# ---- fused post + next pre ----------------------------------------------------------------------------

def route_mhc_fused_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                             hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1,
                             tile_n=1, *, norm_weight=None, norm_eps=None):
    """Replaces SGLang's `mhc_fused_post_pre` (same parameters, same results; `vllm_mhc.fused_post_pre`).
    n_splits / tile_n only tune SGLang's own kernels."""
    try:
        nw = _bf16_norm(norm_weight, norm_eps)
        pargs, kw, shape = fused_args(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                                      hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, 1, 1, nw,
                                      norm_eps)
    except Unsupported as e:
        return _fallback("mhc_fused_post_pre", str(e), x, residual, post_layer_mix, comb_res_mix, fn, hc_scale,
                         hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
                         n_splits, tile_n, norm_weight=norm_weight, norm_eps=norm_eps)
    ROUTED["mhc_fused_post_pre"] += 1
    if pargs[1].shape[0] == 0:
        return _empty_like_fused(residual)
    return fused_post_pre(pargs, kw, shape, fn, hc_scale, hc_base)


# ---- hc_split_sinkhorn --------------------------------------------------------------------------------

def sinkhorn_args(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """SGLang's hc_split_sinkhorn arguments -> (dsv4_jit.mhc_sinkhorn args, kwargs, (b, s, hc)); views only."""
    import torch
    if mixes.dim() != 3:
        raise Unsupported(f"mixes has {mixes.dim()} dims, expected [b, s, (2+hc)*hc]")
    hc = int(hc_mult)
    b, s, m = mixes.shape
    if m != (2 + hc) * hc:
        raise Unsupported(f"mixes' last dim {m} is not (2+hc)*hc for hc_mult={hc}")
    for t, name in ((mixes, "mixes"), (hc_scale, "hc_scale"), (hc_base, "hc_base")):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise Unsupported(f"{name} is not a contiguous fp32 tensor")
    kw = {"hc_eps": float(eps), "sinkhorn_iters": int(sinkhorn_iters), "post_mult": SINKHORN_POST_MULT}
    return (mixes.view(b * s, m), hc_scale, hc_base), kw, (b, s, hc)


def route_hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """Replaces SGLang's `hc_split_sinkhorn`: (pre [b, s, hc], post [b, s, hc], comb [b, s, hc, hc])."""
    import dsv4_jit
    try:
        args, kw, (b, s, hc) = sinkhorn_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    except Unsupported as e:
        return _fallback("hc_split_sinkhorn", str(e), mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    ROUTED["hc_split_sinkhorn"] += 1
    pre, post, comb = dsv4_jit.mhc_sinkhorn(*args, **kw)
    return pre.view(b, s, hc), post.view(b, s, hc), comb.view(b, s, hc, hc)


# ---- indexer: fp8 paged MQA logits --------------------------------------------------------------------

def indexer_static(heads: int) -> dict:
    """The indexer_decode_logits statics this route selects with (the planner enumerates the same)."""
    from dsv4_jit.kernels.indexer.ops import decode_static
    return decode_static(heads, INDEX_HEAD_DIM, 1, INDEX_PAGE_SIZE, ratio=1, clean=False)


def logits_args(q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len, clean_logits):
    """SGLang's tilelang_fp8_paged_mqa_logits arguments -> (dsv4_jit.indexer_decode_logits args, kwargs)."""
    import torch
    if clean_logits:
        raise Unsupported("clean_logits=True (SGLang refuses it)")
    if q_fp8.dim() != 4 or q_fp8.shape[1] != 1 or q_fp8.shape[3] != INDEX_HEAD_DIM:
        raise Unsupported(f"q_fp8 shape {tuple(q_fp8.shape)} is not [batch, 1, heads, {INDEX_HEAD_DIM}]")
    batch, _, heads, dim = q_fp8.shape
    if heads not in INDEX_HEADS or q_fp8.dtype != torch.float8_e4m3fn:
        raise Unsupported(f"q_fp8: {heads} heads of {q_fp8.dtype} (dsv4-jit takes {INDEX_HEADS} e4m3 heads)")
    if kvcache_fp8.dim() != 4 or tuple(kvcache_fp8.shape[1:]) != (INDEX_PAGE_SIZE, 1, dim + 4) \
            or kvcache_fp8.element_size() != 1:
        raise Unsupported(f"kvcache_fp8 shape {tuple(kvcache_fp8.shape)} of {kvcache_fp8.dtype} is not "
                          f"[pages, {INDEX_PAGE_SIZE}, 1, {dim + 4}] bytes")
    if weight.dtype != torch.float32 or tuple(weight.shape) != (batch, heads):
        raise Unsupported("weight is not an fp32 [batch, heads] tensor")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,):
        raise Unsupported("seq_lens is not an int32 [batch] tensor")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != batch \
            or page_table.shape[1] < 1:
        raise Unsupported("page_table is not an int32 [batch, pages] tensor")
    for t, name in ((q_fp8, "q_fp8"), (kvcache_fp8, "kvcache_fp8"), (weight, "weight"), (seq_lens, "seq_lens"),
                    (page_table, "page_table")):
        if not t.is_contiguous():
            raise Unsupported(f"{name} is not contiguous")
    q_scale = torch.ones(batch, dtype=torch.float32, device=q_fp8.device)   # weights carry the query scale
    kv = kvcache_fp8 if kvcache_fp8.dtype == torch.uint8 else kvcache_fp8.view(torch.uint8)
    args = (q_fp8.view(batch, heads, dim), q_scale, weight, kv, seq_lens, page_table)
    return args, {"next_n": 1, "ratio": 1, "width": int(max_seq_len), "clean": False}


def route_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                               clean_logits=True):
    """Replaces SGLang's `tilelang_fp8_paged_mqa_logits`: logits [batch, max_seq_len] fp32. One dsv4-jit variant
    serves every batch and length (SGLang's compiles one kernel per split_kv value)."""
    import dsv4_jit
    try:
        args, kw = logits_args(q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len, clean_logits)
    except Unsupported as e:
        return _fallback("tilelang_fp8_paged_mqa_logits", str(e), q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                         deep_gemm_metadata, max_seq_len, clean_logits)
    ROUTED["tilelang_fp8_paged_mqa_logits"] += 1
    logits, _ = dsv4_jit.indexer_decode_logits(*args, **kw)
    return logits


# SGLang module -> {its function name -> our replacement (same parameters)} (SGLang 0.5.23).
MHC_MODULE = "sglang.kernels.ops.layernorm.mhc"
INDEXER_MODULE = "sglang.kernels.ops.attention.dsa.tilelang_kernel"
ROUTES = {
    MHC_MODULE: {"hc_split_sinkhorn": route_hc_split_sinkhorn, "mhc_fused_post_pre": route_mhc_fused_post_pre,
                 "mhc_post": route_mhc_post, "mhc_pre": route_mhc_pre},
    INDEXER_MODULE: {"tilelang_fp8_paged_mqa_logits": route_fp8_paged_mqa_logits},
}

__all__ = ["ROUTES", "FALLBACKS", "ROUTED", "ORIGINALS", "route_mhc_pre", "route_mhc_post", "route_mhc_fused_post_pre",
           "route_hc_split_sinkhorn", "route_fp8_paged_mqa_logits", "indexer_static"]
