"""Compressor host ops: what the engine calls. Every argument is validated (ValueError naming it) before a kernel is
selected or launched; nothing is allocated (the caches and the state are the engine's), so both ops run under
CUDA-graph capture. Kept apart from the kernel module on purpose: the artifact key hashes kernel source only.

  compressor_state_write(kv_score, ape, positions, state_slots, state, *, ratio)
      the wkv/wgate GEMM output [T, 2C] fp32 ([kv | score]) -> each token's state row [kv | score + ape[p % r]]
  compressor_compress(state, state_block_table, positions, req_idx, out_slots, norm_weight, cos_sin, cache, *,
                      ratio, state_page, block_size, eps)
      every token completing a window writes its compressed entry into `cache` at out_slots[t]
      (head_dim 512: an fp8_ds_mla page cache; 128: the indexer's [page x 128 fp8 | page x fp32 scale] cache)
"""
from __future__ import annotations

from typing import Any

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

from .compress import FORMATS, ROPE, SCALE_BYTES, TOKEN_BYTES


def state_static(ratio: int, head_dim: int) -> dict[str, Any]:
    return {"ratio": int(ratio), "head_dim": int(head_dim)}


def compress_static(ratio: int, head_dim: int, eps: float) -> dict[str, Any]:
    return {"ratio": int(ratio), "head_dim": int(head_dim), "eps": float(eps)}


def _tokens(op: str, positions, dev=None) -> int:
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
        raise ValueError(f"{op}: positions must be an int32 [T] tensor")
    check_tensor(positions, "positions", [None], torch.int32, dev)
    return positions.shape[0]


def compressor_state_write(kv_score, ape, positions, state_slots, state, *, ratio: int, arch, get_kernel):
    """state[state_slots[t]] = [kv_score[t, :C] | kv_score[t, C:] + ape[positions[t] % ratio]] (slot -1: skipped).

    kv_score fp32 [T, 2C] (C = coff * head_dim, coff = 2 for ratio 4); ape fp32 [ratio, C]; positions, state_slots
    int32 [T]; state fp32 [rows, 2C] (the paged state cache's rows: page * page_size + offset)."""
    import torch
    from dsv4_jit.validate import check_tensor
    op = "compressor_state_write"
    arch = check_arch(op, arch)
    ratio = int_arg("ratio", ratio, op=op, allowed=(4, 128))
    if not isinstance(kv_score, torch.Tensor) or kv_score.dim() != 2:
        raise ValueError("kv_score: expected an fp32 [T, 2C] tensor (the fused wkv/wgate GEMM output)")
    t, two_c = kv_score.shape
    coff = 2 if ratio == 4 else 1
    if two_c % (2 * coff) or (two_c // (2 * coff)) not in FORMATS:
        raise ValueError(f"kv_score: width {two_c} is not 2 x {coff} x head_dim with head_dim 512 or 128 at ratio {ratio}")
    d = two_c // (2 * coff)
    dev = kv_score.device
    check_tensor(kv_score, "kv_score", [t, two_c], torch.float32, dev)
    check_tensor(ape, "ape", [ratio, two_c // 2], torch.float32, dev)
    check_tensor(positions, "positions", [t], torch.int32, dev)
    check_tensor(state_slots, "state_slots", [t], torch.int32, dev)
    if not isinstance(state, torch.Tensor) or state.dim() != 2:
        raise ValueError(f"state: expected an fp32 [rows, {two_c}] tensor")
    check_tensor(state, "state", [None, two_c], torch.float32, dev)
    static = state_static(ratio, d)
    kernel = get_kernel(get_spec(op), static, max(t, 1))
    if t:
        kernel(kv_score, ape, positions, state_slots, state)
    return state


def _cache_views(cache, d: int, block_size: int):
    """(views the kernel takes, pages, page_bytes) of an fp8_ds_mla (d 512) or index-K (d 128) page cache."""
    import torch
    name = "cache"
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or cache.dim() < 2:
        raise ValueError(f"{name}: expected a uint8 [pages, page_bytes] tensor (d={d}: "
                         f"{'fp8_ds_mla pages' if d == 512 else 'page x 128 fp8 then page x fp32 scale'})")
    if not cache.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    pages = cache.shape[0]
    pb = cache.numel() // max(pages, 1)
    need = block_size * ((TOKEN_BYTES + SCALE_BYTES) if d == 512 else (d + 4))
    if pages < 1 or pb % 16 or pb < need:
        raise ValueError(f"{name}: a page of {block_size} entries needs >= {need} B in a multiple of 16 B; got "
                         f"{pages} pages of {pb} B")
    if d != 512 and pb != need:
        # the indexer kernels derive the page size from the page bytes: a padded page would misplace the scales
        raise ValueError(f"{name}: an index-K page of {block_size} entries is exactly {need} B "
                         f"({block_size} x {d} fp8 + {block_size} x 4 B scales); got {pb} B")
    flat = cache.view(pages, pb)
    if d == 512:
        return (flat.view(torch.float8_e4m3fn), flat, flat.view(torch.bfloat16)), pages, pb
    return (flat.view(torch.float8_e4m3fn), flat.view(torch.float32)), pages, pb


def compressor_compress(state, state_block_table, positions, req_idx, out_slots, norm_weight, cos_sin, cache, *,
                        ratio: int, state_page: int, block_size: int, eps: float, arch, get_kernel, check_ranges=None):
    """Write the compressed entry of every token t with (positions[t] + 1) % ratio == 0 and out_slots[t] >= 0 into
    `cache` at slot out_slots[t] (page * block_size + offset). Its window's rows are read from `state` (fp32
    [rows, 2C], written by compressor_state_write) through state_block_table [B, max_pages] int32 of request
    req_idx[t], state_page rows per page; norm_weight bf16 [head_dim]; cos_sin fp32 [max_pos, 64] ([cos | sin],
    the engine's compressed-RoPE table). check_ranges: None = check slots and pages (one host sync) unless
    capturing; the kernel masks bad entries either way."""
    import torch
    from dsv4_jit.validate import check_tensor
    op = "compressor_compress"
    arch = check_arch(op, arch)
    ratio = int_arg("ratio", ratio, op=op, allowed=(4, 128))
    state_page = int_arg("state_page", state_page, op=op)
    block_size = int_arg("block_size", block_size, op=op)
    if not isinstance(norm_weight, torch.Tensor) or norm_weight.dim() != 1 or norm_weight.shape[0] not in FORMATS:
        raise ValueError("norm_weight: expected a bf16 [head_dim] tensor with head_dim 512 (attention) or 128 (indexer)")
    d = norm_weight.shape[0]
    dev = norm_weight.device
    check_tensor(norm_weight, "norm_weight", [d], torch.bfloat16, dev)
    t = _tokens(op, positions, dev)
    two_c = 2 * (2 if ratio == 4 else 1) * d
    if not isinstance(state, torch.Tensor) or state.dim() != 2:
        raise ValueError(f"state: expected an fp32 [rows, {two_c}] tensor")
    check_tensor(state, "state", [None, two_c], torch.float32, dev)
    if not isinstance(state_block_table, torch.Tensor) or state_block_table.dim() != 2:
        raise ValueError("state_block_table: expected an int32 [batch, max_pages] tensor")
    check_tensor(state_block_table, "state_block_table", [None, None], torch.int32, dev)
    check_tensor(req_idx, "req_idx", [t], torch.int32, dev)
    check_tensor(out_slots, "out_slots", [t], torch.int32, dev)
    if not isinstance(cos_sin, torch.Tensor) or cos_sin.dim() != 2:
        raise ValueError(f"cos_sin: expected an fp32 [max_pos, {ROPE}] tensor ([cos | sin])")
    check_tensor(cos_sin, "cos_sin", [None, ROPE], torch.float32, dev)
    if not isinstance(eps, float) or not 0 < eps < 1:
        raise ValueError(f"{op}: eps must be a float in (0, 1), got {eps!r}")
    views, pages, _ = _cache_views(cache, d, block_size)
    if cache.device != dev:
        raise ValueError(f"cache: on {cache.device}, expected {dev}")
    if check_ranges is None:
        check_ranges = not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    if check_ranges and t:
        # only the tokens that emit an entry read req_idx, the block table and cos_sin (padding may hold -1)
        emit = (out_slots >= 0) & ((positions + 1) % ratio == 0) & (positions >= 0)
        bad = torch.stack([((out_slots < -1) | (out_slots >= pages * block_size)).any(),
                           (emit & ((req_idx < 0) | (req_idx >= state_block_table.shape[0]))).any(),
                           (emit & (positions < 0)).any(),
                           (emit & ((positions // ratio) * ratio >= cos_sin.shape[0])).any()]).tolist()
        for flag, msg in zip(bad, (f"out_slots: an entry is outside the cache (valid: -1 or 0..{pages * block_size - 1})",
                                   f"req_idx: an entry is outside state_block_table's {state_block_table.shape[0]} rows",
                                   "positions: a position is negative",
                                   f"positions: a RoPE position is past cos_sin's {cos_sin.shape[0]} rows")):
            if flag:
                raise ValueError(msg)
    kernel = get_kernel(get_spec(op), compress_static(ratio, d, eps), max(t, 1))
    if t:
        kernel(state, state_block_table, int(state_page), positions, req_idx, out_slots, norm_weight, cos_sin, *views,
               int(block_size))
    return cache


__all__ = ["compressor_state_write", "compressor_compress", "state_static", "compress_static"]
