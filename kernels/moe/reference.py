"""Torch references of the MXFP4 expert GEMM and of the routed-row layout it reads (any device, float64 math).

Written from the model's math (ref `fp4_gemm` per expert, dsv4_kernels.md 3.11): C = A_fp8 . W_fp4^T with the
activations' 1x128 and the weights' 1x32 UE8M0 scales; rows sorted by expert in blocks (ops.moe_align).
"""
from __future__ import annotations

import torch

from dsv4_jit.kernels.quant.reference import dequant_fp4, dequant_fp8, ref_act_quant_fp4

WEIGHT_GROUP = 32


def quantize_expert_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [E, N, K] -> (uint8 [E, N, K / 2] e2m1 pairs, element 2j in the low nibble; uint8 [E, N, K / 32]
    UE8M0 exponents): the checkpoint's MXFP4 layout as vLLM stores it."""
    e, n, k = w.shape
    packed, exps = ref_act_quant_fp4(w.reshape(e * n, k).to(torch.bfloat16), WEIGHT_GROUP)
    return packed.reshape(e, n, k // 2), exps.reshape(e, n, k // WEIGHT_GROUP)


def dequant_expert(w: torch.Tensor, sw: torch.Tensor, expert: int) -> torch.Tensor:
    """float64 [N, K] of one expert."""
    return dequant_fp4(w[expert], sw[expert], WEIGHT_GROUP)


def ref_fp4_moe_gemm(a, sa, w, sw, block_expert, block_m: int) -> torch.Tensor:
    """float64 C [M, N]: block b of block_m rows = A_b . W_{block_expert[b]}^T (scales applied), 0 for a padding
    block (block_expert < 0)."""
    m = a.shape[0]
    n = w.shape[1]
    a64 = dequant_fp8(a, sa, 128) if m else a.new_zeros(0, w.shape[2] * 2, dtype=torch.float64)
    out = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    be = block_expert.tolist()
    for e in sorted({x for x in be if x >= 0}):
        rows = torch.cat([torch.arange(b * block_m, (b + 1) * block_m, device=a.device)
                          for b, x in enumerate(be) if x == e])
        out[rows] = a64[rows] @ dequant_expert(w, sw, e).T
    return out


def ref_moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, capacity: int):
    """The layout ops.moe_align builds, by a plain loop: each expert's (token, k) entries in token order, the
    expert's rows padded up to a multiple of block_m, experts in order, then -1 rows to `capacity`.
    Returns (sorted_rows [capacity] int64: flat index t * topk + j of the routed entry, or -1; block_expert
    [capacity / block_m] int64: the expert of each block, or -1)."""
    flat = topk_ids.reshape(-1).tolist()
    rows, blocks = [], []
    for e in range(num_experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        if not mine:
            continue
        nb = -(-len(mine) // block_m)
        rows += mine + [-1] * (nb * block_m - len(mine))
        blocks += [e] * nb
    rows += [-1] * (capacity - len(rows))
    blocks += [-1] * (capacity // block_m - len(blocks))
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(blocks, dtype=torch.int64)


def route_scores(logits: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """sqrt(softplus(logits)) in `dtype`, by the kernel's formula (no overflow): max(x, 0) + log(1 + e^-|x|)."""
    x = logits.to(dtype)
    return torch.sqrt(torch.clamp(x, min=0) + torch.log(1.0 + torch.exp(-x.abs())))


def ref_moe_route(logits, bias=None, hash_ids=None, topk: int = 6, routed_scaling: float = 1.0):
    """(ids int64 [T, topk], weights float64 [T, topk]) by V4's rule (route.py's doc): fp32 scores as the kernel
    computes them, ids by descending s + bias with ties to the lower index (hash layers: the given ids), weights
    s[ids] renormalized and scaled, in float64."""
    s = route_scores(logits)
    if hash_ids is not None:
        ids = hash_ids.long().clamp(0, logits.shape[1] - 1)
    else:
        ids = torch.sort(-(s + bias.float()), dim=1, stable=True).indices[:, :topk]
    w = s.double().gather(1, ids)
    return ids, w / w.sum(dim=1, keepdim=True) * routed_scaling


def ref_moe_combine(c, entry_rows, weights) -> torch.Tensor:
    """float64 [T, N]: sum_j weights[t, j] * c[entry_rows[t * topk + j]] (rows out of range contribute 0)."""
    t, k = weights.shape
    rows = entry_rows.long().view(t, k)
    ok = (rows >= 0) & (rows < c.shape[0])
    picked = c.double()[rows.clamp(0, max(c.shape[0] - 1, 0))] * ok[..., None]
    return (picked * weights.double()[..., None]).sum(1)


def ref_moe_entry_rows(sorted_rows: torch.Tensor, num_entries: int) -> torch.Tensor:
    """The layout row of each routed entry, by a plain loop over sorted_rows (int64 [num_entries], -1 if absent)."""
    inv = [-1] * num_entries
    for p, r in enumerate(sorted_rows.tolist()):
        if r >= 0:
            inv[r] = p
    return torch.tensor(inv, dtype=torch.int64)
