"""Torch references for the indexer family (float64 math, any device), written from the model's math
(ref `Indexer.forward`, dsv4_kernels.md 3.6-3.8), plus the cache packing helpers the tests and benchmark use."""
from __future__ import annotations

SCALE_BYTES = 4
FP8_MAX = 448.0


def quantize_rows_fp8(x):
    """Per-row absmax fp8 e4m3: (x_fp8 [..., D], scale [...] fp32 > 0) with x ~= x_fp8 * scale."""
    import torch
    amax = x.float().abs().amax(-1).clamp_min(1e-4)
    scale = amax / FP8_MAX
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale.float()


def pack_paged_cache(k_fp8, k_scale, page_size: int):
    """Pages of [page_size * D fp8 | page_size fp32 scales] from k [pages * page_size, D] (logical order of
    physical pages: row r is page r // page_size, slot r % page_size). Returns uint8 [pages, P * (D + 4)]."""
    import torch
    n, d = k_fp8.shape
    if n % page_size:
        raise ValueError(f"k: {n} rows is not a multiple of page_size={page_size}")
    pages = n // page_size
    vals = k_fp8.view(torch.uint8).reshape(pages, page_size * d)
    scales = k_scale.float().contiguous().view(torch.uint8).reshape(pages, page_size * SCALE_BYTES)
    return torch.cat([vals, scales], dim=1).contiguous()


def unpack_paged_cache(kv_cache, dim: int):
    """Inverse of pack_paged_cache: (k float64 [pages * P, D] dequantised, page_size)."""
    import torch
    flat = kv_cache.reshape(kv_cache.shape[0], -1)
    page_size = flat.shape[1] // (dim + SCALE_BYTES)
    vals = flat[:, : page_size * dim].contiguous().view(torch.float8_e4m3fn).reshape(-1, dim).double()
    scales = flat[:, page_size * dim:].contiguous().view(torch.float32).reshape(-1).double()
    return vals * scales[:, None], page_size


def _scores(q, q_scale, weights, k):
    """sum_h w[t,h] * relu(q[t,h] . k[j]) * q_scale[t] for q [t, H, D] (dequantised outside), k [n, D]."""
    import torch
    s = torch.einsum("thd,nd->thn", q.double(), k.double()).clamp_min(0)
    return (s * weights.double()[:, :, None]).sum(1) * q_scale.double()[:, None]


def ref_decode_logits(q, q_scale, weights, kv_cache, seq_lens, block_table, next_n: int, width: int,
                      ratio: int = 4):
    """(logits float64 [T, W] with -inf outside [0, len_t), row_info int64 [T, 3])."""
    import torch
    tokens, heads, dim = q.shape
    k_all, page_size = unpack_paged_cache(kv_cache, dim)
    dev = q.device
    out = torch.full((tokens, width), float("-inf"), dtype=torch.float64, device=dev)
    info = torch.zeros((tokens, 3), dtype=torch.int64, device=dev)
    limit = min(width, block_table.shape[1] * page_size)
    for b in range(tokens // next_n):
        s = int(seq_lens[b])
        lens = [min(max(s - next_n + g + 1, 0) // ratio, limit) for g in range(next_n)]
        n = max(lens)
        rows = slice(b * next_n, (b + 1) * next_n)
        info[rows, 1] = torch.tensor(lens, device=dev)
        info[rows, 2] = b
        if n == 0:
            continue
        pos = torch.arange(n, device=dev)
        slots = block_table[b, pos // page_size].long() * page_size + pos % page_size
        sc = _scores(q[rows].double(), q_scale[rows], weights[rows], k_all[slots])
        for g in range(next_n):
            out[b * next_n + g, : lens[g]] = sc[g, : lens[g]]
    return out, info


def ref_prefill_logits(q, q_scale, weights, k, k_scale, ks, ke, req_idx, width: int, chunk: int = 32):
    """(logits float64 [T, W], row_info int64 [T, 3]) for token ranges [ks, ke) over k [Nk, D]."""
    import torch
    tokens = q.shape[0]
    dev = q.device
    kd = k.double() * k_scale.double()[:, None]
    limit = min(width, k.shape[0])
    lo = ks.long().clamp(0, limit)
    hi = torch.maximum(ke.long().clamp(max=limit), lo)
    out = torch.full((tokens, width), float("-inf"), dtype=torch.float64, device=dev)
    for t0 in range(0, tokens, chunk):
        t1 = min(tokens, t0 + chunk)
        a, b = int(lo[t0:t1].min()), int(hi[t0:t1].max())
        if b <= a:
            continue
        sc = _scores(q[t0:t1].double(), q_scale[t0:t1], weights[t0:t1], kd[a:b])
        cols = torch.arange(a, b, device=dev)
        keep = (cols[None, :] >= lo[t0:t1, None]) & (cols[None, :] < hi[t0:t1, None])
        out[t0:t1, a:b] = torch.where(keep, sc, torch.full_like(sc, float("-inf")))
    info = torch.stack([lo, hi, req_idx.long()], dim=1)
    return out, info


def slots_of(block_table, req, pos, page_size: int):
    """Compressed-cache slots of positions `pos` (int64) of request `req`; -1 where the page is -1."""
    page = block_table[req, pos // page_size].long()
    return torch_where(page < 0, -1, page * page_size + pos % page_size)


def torch_where(cond, a, b):
    import torch
    return torch.where(cond, torch.as_tensor(a, device=cond.device), b)


def _row_range(info, width: int, topk: int) -> tuple[int, int, int, int]:
    """A row_info row (first column, end column, request) clamped to the logits' width, and how many of its
    candidates a top-k keeps."""
    lo, hi, r = (int(v) for v in info)
    lo = min(max(lo, 0), width)
    hi = max(min(hi, width), lo)
    return lo, hi, r, min(hi - lo, topk)


def ref_topk(logits, row_info, block_table, topk: int, page_size: int):
    """torch.topk answer: (indices int64 [T, topk] slots, sorted by value, -1 padded; lengths [T])."""
    import torch
    tokens, width = logits.shape
    dev = logits.device
    idx = torch.full((tokens, topk), -1, dtype=torch.int64, device=dev)
    lens = torch.zeros(tokens, dtype=torch.int64, device=dev)
    for t in range(tokens):
        lo, hi, r, m = _row_range(row_info[t], width, topk)
        lens[t] = m
        if m == 0:
            continue
        pos = torch.topk(logits[t, lo:hi].double(), m).indices
        idx[t, :m] = slots_of(block_table, r, pos, page_size)
    return idx, lens


def check_topk_sets(got, logits, row_info, block_table, topk: int, page_size: int):
    """Top-k as a set, ties broken any way: returns the expected indices [T, topk] in `got`'s row order where
    a row of `got` is a valid answer (so the comparison is exact), and torch.topk's answer elsewhere.

    A row is valid when its first m = min(n, topk) entries are distinct slots of the row's candidates, every
    entry after them is -1 (the attention kernel reads the first `lengths` entries), and they include every
    candidate strictly above the m-th largest value and only candidates >= it. Order within the m is free."""
    import torch
    tokens, width = logits.shape
    dev = logits.device
    ref, _ = ref_topk(logits, row_info, block_table, topk, page_size)
    want = torch.empty_like(ref)
    got = got.long()
    for t in range(tokens):
        lo, hi, r, m = _row_range(row_info[t], width, topk)
        n = hi - lo
        g = got[t]
        sel = g[g >= 0]
        ok = sel.numel() == m and bool((g[:m] >= 0).all()) and bool((g[m:] == -1).all())
        if ok and m:
            pos = torch.arange(n, device=dev)
            slots = slots_of(block_table, r, pos, page_size)
            vals = logits[t, lo:hi].double()
            thr = torch.topk(vals, m).values[-1]
            sel_sorted = sel.sort().values
            ok = bool((sel_sorted[1:] != sel_sorted[:-1]).all())
            member = torch.isin(slots, sel)
            ok = ok and int(member.sum()) == m
            ok = ok and bool((vals[member] >= thr).all()) and bool(member[vals > thr].all())
        want[t] = g if ok else ref[t]
    return want


def ref_swa_indices(positions, req_idx, block_table, window: int, page_size: int):
    """(swa_indices int64 [T, window] oldest first, -1 padded; lengths [T])."""
    import torch
    p = positions.long()
    n = (p + 1).clamp(min=0, max=window)
    w = torch.arange(window, device=p.device)
    q = p[:, None] - n[:, None] + 1 + w[None, :]
    valid = w[None, :] < n[:, None]
    qc = q.clamp(min=0)
    page = block_table.long()[req_idx.long()[:, None], (qc // page_size).clamp(max=block_table.shape[1] - 1)]
    slot = torch.where(page < 0, torch.full_like(page, -1), page * page_size + qc % page_size)
    return torch.where(valid, slot, torch.full_like(slot, -1)), n
