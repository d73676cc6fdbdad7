"""Torch references for sparse MLA attention with the sink, and the fp8_ds_mla cache codec.

The codec packs bf16/float KV rows into FlashMLA's MODEL1 FP8 sparse page layout (what the decode
kernel reads) and unpacks it; the reference dequantizes the cache, gathers each token's candidates and
runs a float64 softmax whose denominator carries e^sink.
"""
from __future__ import annotations

import math

import torch

D, NOPE, ROPE, GROUP = 512, 448, 64, 64
TOKEN_BYTES, SCALE_BYTES = 576, 8
FP8_MAX = 448.0


def page_bytes_for(block_size: int) -> int:
    """FlashMLA pads a page (block_size x 584 B) to a multiple of 576 B."""
    return math.ceil(block_size * (TOKEN_BYTES + SCALE_BYTES) / TOKEN_BYTES) * TOKEN_BYTES


def quantize_rows(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv [N, 512] float -> (nope fp8 [N, 448], UE8M0 exponent bytes [N, 7] uint8, rope bf16 [N, 64]).

    Each 64-dim NoPE group is scaled by a power of two 2^(e-127) >= amax/448, as DeepSeek's act_quant
    does with scale_fmt ue8m0."""
    x = kv.float()
    nope = x[:, :NOPE].reshape(-1, NOPE // GROUP, GROUP)
    amax = nope.abs().amax(-1).clamp_min(1e-30)
    e = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
    q = (nope / torch.exp2(e)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(-1, NOPE), (e + 127).to(torch.uint8), x[:, NOPE:].to(torch.bfloat16)


def pack_fp8_ds_mla(kv: torch.Tensor, slots: torch.Tensor, num_pages: int, block_size: int,
                    page_bytes: int | None = None, fill: torch.Tensor | None = None) -> torch.Tensor:
    """A [num_pages, page_bytes] uint8 cache holding row i of kv at slot slots[i] (page*block_size + off).

    `fill` (uint8 of the cache's size) gives the bytes of every slot and pad byte not written; pass random
    bytes to prove a kernel never reads them."""
    pb = page_bytes or page_bytes_for(block_size)
    if pb % 16 or pb < block_size * (TOKEN_BYTES + SCALE_BYTES):
        raise ValueError(f"page_bytes {pb} must be a multiple of 16 and hold {block_size} tokens")
    cache = fill.clone().reshape(num_pages, pb) if fill is not None else torch.zeros(
        num_pages, pb, dtype=torch.uint8, device=kv.device)
    nope, e, rope = quantize_rows(kv)
    slots = slots.long()
    page, off = slots // block_size, slots % block_size
    data = torch.cat([nope.view(torch.uint8), rope.view(torch.uint8)], 1)            # [N, 576]
    cols = off[:, None] * TOKEN_BYTES + torch.arange(TOKEN_BYTES, device=kv.device)
    cache[page[:, None], cols] = data
    scols = block_size * TOKEN_BYTES + off[:, None] * SCALE_BYTES + torch.arange(NOPE // GROUP, device=kv.device)
    cache[page[:, None], scols] = e
    return cache


def split_fp8_ds_mla(cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[num_pages, page_bytes] uint8 -> every slot's parts as stored, in float32: NoPE e4m3 values [slots, 7, 64],
    their group scales 2^(e - 127) [slots, 7], RoPE [slots, 64]."""
    p = cache.shape[0]
    flat = cache.reshape(p, -1)
    data = flat[:, :block_size * TOKEN_BYTES].reshape(p * block_size, TOKEN_BYTES)
    nope = data[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float()
    rope = data[:, NOPE:].contiguous().view(torch.bfloat16).float()
    sc = flat[:, block_size * TOKEN_BYTES: block_size * (TOKEN_BYTES + SCALE_BYTES)]
    e = sc.reshape(p * block_size, SCALE_BYTES)[:, :NOPE // GROUP].float()
    return nope.reshape(-1, NOPE // GROUP, GROUP), torch.exp2(e - 127), rope


def unpack_fp8_ds_mla(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """[num_pages, page_bytes] uint8 -> [num_pages * block_size, 512] float32, every slot dequantized."""
    nope, scale, rope = split_fp8_ds_mla(cache, block_size)
    return torch.cat([(nope * scale[..., None]).reshape(-1, NOPE), rope], 1)


def _gather(rows: torch.Tensor, idx: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates [T, N, 512] and their validity [T, N] (inside the length, not -1, inside the cache)."""
    n = idx.shape[1]
    pos = torch.arange(n, device=idx.device)[None, :]
    ok = (pos < lens[:, None].long()) & (idx >= 0) & (idx < rows.shape[0])
    safe = torch.where(ok, idx, torch.zeros_like(idx)).long()
    return rows[safe], ok


def ref_sparse_mla(q: torch.Tensor, rows1: torch.Tensor, idx1: torch.Tensor, lens1: torch.Tensor,
                   rows2: torch.Tensor | None, idx2: torch.Tensor | None, lens2: torch.Tensor | None,
                   sink: torch.Tensor, softmax_scale: float, chunk: int = 64) -> torch.Tensor:
    """out [T, H, 512] float64: softmax over each token's valid candidates of both lists, e^sink added to
    the denominator; tokens with no valid candidate get 0. rows* are dequantized KV rows indexed by slot."""
    t_all = q.shape[0]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    sink = sink.double()
    for a in range(0, t_all, chunk):
        b = min(t_all, a + chunk)
        kv, ok = _gather(rows1, idx1[a:b], lens1[a:b])
        if rows2 is not None:
            kv2, ok2 = _gather(rows2, idx2[a:b], lens2[a:b])
            kv, ok = torch.cat([kv, kv2], 1), torch.cat([ok, ok2], 1)
        kv = kv.double()
        s = torch.einsum("thd,tnd->thn", q[a:b].double(), kv) * softmax_scale
        s = s.masked_fill(~ok[:, None, :], float("-inf"))
        m = torch.maximum(s.amax(-1), sink[None, :])                  # [t, H], finite thanks to the sink
        p = torch.exp(s - m[..., None])
        den = p.sum(-1) + torch.exp(sink[None, :] - m)
        out[a:b] = torch.einsum("thn,tnd->thd", p, kv) / den[..., None]
    return out
