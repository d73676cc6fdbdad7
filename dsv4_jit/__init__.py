"""dsv4-jit: DeepSeek V4 TileLang kernels compiled ahead of serving.

Engines call the ops below (torch tensors in, torch tensors out). Each op picks its kernel
variant with the kernel's own `select` (the function the warmup planner enumerates), loads it
from the artifact cache and launches it; after warmup, `seal()` turns any further compile into a
logged warning or an error.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .arch import ArchProfile, PROFILES, get_profile, detect_arch, resolve_archs  # noqa: E402
from .errors import (Dsv4JitError, UnsupportedArchError, SharedMemoryBudgetError,  # noqa: E402
                     SealedCompileError, ConfigError)
from .jit import seal, sealed, counters, reset_counters, get_kernel, kernel_getter, load, compile_variant  # noqa: E402
from .model_config import ModelConfig, ParallelConfig, load_model_config  # noqa: E402


_ARCH_KW: dict[Any, dict[str, Any]] = {}


def _arch_kw(arch: ArchProfile | str | None) -> dict[str, Any]:
    """{"arch": profile, "get_kernel": getter} for the ops, resolved once per `arch` argument."""
    kw = _ARCH_KW.get(arch)
    if kw is None:
        from .jit import current_arch
        profile = current_arch() if arch is None else get_profile(arch)
        kw = _ARCH_KW[arch] = {"arch": profile, "get_kernel": kernel_getter(profile)}
    return kw


def mhc_pre(residual, fn, hc_scale, hc_base, *, arch=None, **kw):
    """hc_pre: prenorm GEMM (split-K) + big fuse. Returns (layer_input, post, comb)."""
    from .kernels.mhc import ops as _m
    return _m.mhc_pre(residual, fn, hc_scale, hc_base, **_arch_kw(arch), **kw)


def mhc_sinkhorn(mixes, hc_scale, hc_base, *, arch=None, **kw):
    """Standalone split + Sinkhorn of already RMS-scaled mixes. Returns (pre, post, comb)."""
    from .kernels.mhc import ops as _m
    return _m.mhc_sinkhorn(mixes, hc_scale, hc_base, **_arch_kw(arch), **kw)


def mhc_post(x, residual, post, comb, *, arch=None, **kw):
    """hc_post: out[t, j] = post[t, j] * x[t] + sum_i comb[t, i, j] * residual[t, i]."""
    from .kernels.mhc import ops as _m
    return _m.mhc_post(x, residual, post, comb, **_arch_kw(arch), **kw)


def mhc_post_pre_fused(x, residual, post, comb, fn_next, *, arch=None, **kw):
    """hc_post fused with the next layer's prenorm GEMM partials (small token counts)."""
    from .kernels.mhc import ops as _m
    return _m.mhc_post_pre_fused(x, residual, post, comb, fn_next, **_arch_kw(arch), **kw)


def hc_head(residual, fn, hc_scale, hc_base, *, arch=None, **kw):
    """Final hyper-connection collapse before the LM head (and in MTP)."""
    from .kernels.mhc import ops as _m
    return _m.hc_head(residual, fn, hc_scale, hc_base, **_arch_kw(arch), **kw)


def sparse_mla_decode(q, kv_cache, indices, lengths, attn_sink, *, arch=None, **kw):
    """Sparse MLA attention with the sink over the fp8_ds_mla paged cache (decode, MTP). Returns [T, H, 512]."""
    from .kernels.attention import ops as _a
    return _a.sparse_mla_decode(q, kv_cache, indices, lengths, attn_sink, **_arch_kw(arch), **kw)


def sparse_mla_workspace_max_numel(heads: int, max_tokens: int, kv_format: str = "fp8_ds_mla", *, arch=None) -> int:
    """fp32 elements of the `workspace=` sparse_mla_decode needs at any token count <= max_tokens: allocate it
    once (before graph capture) and pass it on every call."""
    from .kernels.attention import ops as _a
    return _a.sparse_mla_workspace_max_numel(_arch_kw(arch)["arch"], heads, max_tokens, kv_format)


def sparse_mla_prefill(q, kv, indices, lengths, attn_sink, *, arch=None, **kw):
    """Sparse MLA attention with the sink over gathered bf16 KV rows (ragged prefill). Returns [T, H, 512]."""
    from .kernels.attention import ops as _a
    return _a.sparse_mla_prefill(q, kv, indices, lengths, attn_sink, **_arch_kw(arch), **kw)


def indexer_decode_logits(q, q_scale, weights, kv_cache, seq_lens, block_table, *, arch=None, **kw):
    """Lightning-indexer paged decode logits (fp8, MTP next_n). Returns (logits [T, W], row_info [T, 3])."""
    from .kernels.indexer import ops as _i
    return _i.indexer_decode_logits(q, q_scale, weights, kv_cache, seq_lens, block_table, **_arch_kw(arch), **kw)


def indexer_prefill_logits(q, q_scale, weights, k, k_scale, ks, ke, req_idx, *, arch=None, **kw):
    """Lightning-indexer ragged prefill logits over a contiguous compressed K. Returns (logits, row_info)."""
    from .kernels.indexer import ops as _i
    return _i.indexer_prefill_logits(q, q_scale, weights, k, k_scale, ks, ke, req_idx, **_arch_kw(arch), **kw)


def indexer_topk(logits, row_info, block_table, *, arch=None, **kw):
    """Top-k of the indexer logits as compressed-cache slots (-1 padded). Returns (indices, lengths)."""
    from .kernels.indexer import ops as _i
    return _i.indexer_topk(logits, row_info, block_table, **_arch_kw(arch), **kw)


def indexer_decode_topk(q, q_scale, weights, kv_cache, seq_lens, block_table, *, arch=None, **kw):
    """One decode step of the indexer: paged logits + top-k with page translation. Returns (indices, lengths)."""
    from .kernels.indexer import ops as _i
    return _i.indexer_decode_topk(q, q_scale, weights, kv_cache, seq_lens, block_table, **_arch_kw(arch), **kw)


def indexer_topk_workspace_numel(num_tokens: int) -> int:
    """int32 elements of the top-k workspace at this token count: allocate it zeroed once (torch.zeros) and pass the
    same tensor on every call; each launch leaves it zeroed, so no memset runs per call or in a CUDA graph."""
    from .kernels.indexer import ops as _i
    return _i.indexer_topk_workspace_numel(num_tokens)


def indexer_swa_indices(positions, req_idx, block_table, *, arch=None, **kw):
    """Sliding-window slots per query token over a paged SWA cache. Returns (swa_indices, swa_lengths)."""
    from .kernels.indexer import ops as _i
    return _i.indexer_swa_indices(positions, req_idx, block_table, **_arch_kw(arch), **kw)


def act_quant_fp8(x, *, arch=None, **kw):
    """Per-token 1x128 e4m3 quantization, UE8M0 (power-of-two) fp32 scales. Returns (y fp8 [M, N], scales [M, N/128])."""
    from .kernels.quant import ops as _q
    return _q.act_quant_fp8(x, **_arch_kw(arch), **kw)


def act_quant_fp8_inplace(x, *, arch=None, **kw):
    """KV NoPE QAT simulation: the first n (448) columns of each row quant-dequantized (1x64 e4m3) in place."""
    from .kernels.quant import ops as _q
    return _q.act_quant_fp8_inplace(x, **_arch_kw(arch), **kw)


def act_quant_fp4(x, *, arch=None, **kw):
    """Per-token 1x32 e2m1 quantization (indexer). Returns (packed uint8 [M, N/2], UE8M0 exponents uint8 [M, N/32])."""
    from .kernels.quant import ops as _q
    return _q.act_quant_fp4(x, **_arch_kw(arch), **kw)


def swiglu_quant_fp8(gate_up, *, limit, arch=None, **kw):
    """SwiGLU (clamped at `limit` when > 0) + 1x128 e4m3 quantization. Returns (y fp8 [M, I], scales [M, I/128])."""
    from .kernels.quant import ops as _q
    return _q.swiglu_quant_fp8(gate_up, limit=limit, **_arch_kw(arch), **kw)


def fp8_gemm(a, a_scales, b, b_scales, *, arch=None, **kw):
    """FP8 block-scaled GEMM: C [M, N] bf16 = A (1x128 scales) . B^T (128x128 block scales). Returns C."""
    from .kernels.gemm import ops as _g
    return _g.fp8_gemm(a, a_scales, b, b_scales, **_arch_kw(arch), **kw)


def fp8_gemm_workspace_max_numel(n: int, k: int, max_tokens: int, *, groups: int = 1, arch=None) -> int:
    """fp32 elements of the `workspace=` fp8_gemm needs at any token count <= max_tokens. Allocate it once and pass
    the same tensor on every call: its head holds split-K arrival counters, zeroed on its first use and left zero by
    every launch. GEMMs that run one after another may share one; GEMMs on concurrent streams need their own."""
    from .kernels.gemm import ops as _g
    return _g.fp8_gemm_workspace_max_numel(n, k, max_tokens, groups=groups, arch=_arch_kw(arch)["arch"])


def fp4_moe_gemm(a, a_scales, w, w_scales, block_expert, *, num_tokens: int, arch=None, **kw):
    """MXFP4 grouped expert GEMM over routed rows in moe_align's layout: C [M, N] bf16. Returns C."""
    from .kernels.moe import ops as _moe
    return _moe.fp4_moe_gemm(a, a_scales, w, w_scales, block_expert, num_tokens=num_tokens, **_arch_kw(arch), **kw)


def moe_route(logits, *, topk: int, routed_scaling: float = 1.0, bias=None, hash_ids=None, arch=None, **kw):
    """V4 routing after the gate GEMM: (ids int32 [T, topk], weights fp32 [T, topk]) (kernels/moe/route.py)."""
    from .kernels.moe import ops as _moe
    return _moe.moe_route(logits, topk=topk, routed_scaling=routed_scaling, bias=bias, hash_ids=hash_ids,
                          **_arch_kw(arch), **kw)


def moe_combine(c, entry_rows, weights, *, arch=None, **kw):
    """out [T, N] bf16 = sum_j weights[t, j] * c[entry_rows[t * topk + j]] (kernels/moe/combine.py)."""
    from .kernels.moe import ops as _moe
    return _moe.moe_combine(c, entry_rows, weights, **_arch_kw(arch), **kw)


def moe_entry_rows(sorted_rows, num_entries: int):
    """The layout row of each routed entry (the inverse of moe_align's sorted_rows), for moe_combine."""
    from .kernels.moe import ops as _moe
    return _moe.moe_entry_rows(sorted_rows, num_entries)


def moe_align(topk_ids, num_experts: int, block_m: int):
    """Routed rows sorted by expert in blocks of block_m (fixed capacity, graph-capturable):
    (sorted_rows int32, block_expert int32). block_m: fp4_moe_block_m(n, k, num_tokens)."""
    from .kernels.moe import ops as _moe
    return _moe.moe_align(topk_ids, num_experts, block_m)


def fp4_moe_block_m(n: int, k: int, num_tokens: int, *, arch=None) -> int:
    """Rows per block the fp4_moe_gemm variant for this engine token count expects."""
    from .kernels.moe import ops as _moe
    return _moe.fp4_moe_block_m(n, k, num_tokens, arch=_arch_kw(arch)["arch"])


def compressor_state_write(kv_score, ape, positions, state_slots, state, *, ratio: int, arch=None, **kw):
    """Each token's compressor state row [kv | score + ape[pos % ratio]] into the paged state cache (kernels/compressor)."""
    from .kernels.compressor import ops as _comp
    return _comp.compressor_state_write(kv_score, ape, positions, state_slots, state, ratio=ratio, **_arch_kw(arch), **kw)


def compressor_compress(state, state_block_table, positions, req_idx, out_slots, norm_weight, cos_sin, cache, *,
                        ratio: int, state_page: int, block_size: int, eps: float, arch=None, **kw):
    """Compressed KV / index-K entries of the tokens completing a window, written into `cache` (kernels/compressor)."""
    from .kernels.compressor import ops as _comp
    return _comp.compressor_compress(state, state_block_table, positions, req_idx, out_slots, norm_weight, cos_sin,
                                     cache, ratio=ratio, state_page=state_page, block_size=block_size, eps=eps,
                                     **_arch_kw(arch), **kw)


def warm(plan, *, rank: int = 0, world_size: int = 1, seal_mode: str = "warn", **kw):
    """Inside an engine: compile this rank's share of `plan`, wait for the others, load everything, seal.

    Not named `warmup`: importing the `dsv4_jit.warmup` subpackage (the planner, which every engine hook
    imports) rebinds the package attribute `dsv4_jit.warmup` to that module."""
    from .warmup.runner import warmup_in_engine
    return warmup_in_engine(plan, rank=rank, world_size=world_size, seal_mode=seal_mode, **kw)


__all__ = [
    "ArchProfile", "PROFILES", "get_profile", "detect_arch", "resolve_archs",
    "Dsv4JitError", "UnsupportedArchError", "SharedMemoryBudgetError", "SealedCompileError", "ConfigError",
    "seal", "sealed", "counters", "reset_counters", "get_kernel", "kernel_getter", "load", "compile_variant",
    "ModelConfig", "ParallelConfig", "load_model_config",
    "mhc_pre", "mhc_sinkhorn", "mhc_post", "mhc_post_pre_fused", "hc_head", "sparse_mla_decode", "sparse_mla_prefill", "warm",
    "sparse_mla_workspace_max_numel",
    "indexer_decode_logits", "indexer_prefill_logits", "indexer_topk", "indexer_decode_topk", "indexer_swa_indices",
    "indexer_topk_workspace_numel",
    "act_quant_fp8", "act_quant_fp8_inplace", "act_quant_fp4", "swiglu_quant_fp8", "fp8_gemm",
    "fp8_gemm_workspace_max_numel",
    "fp4_moe_gemm", "moe_route", "moe_align", "moe_entry_rows", "moe_combine", "fp4_moe_block_m",
    "compressor_state_write", "compressor_compress",
]
