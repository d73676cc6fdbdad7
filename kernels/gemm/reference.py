"""Torch references of the FP8 block-scaled GEMM (float64 of the dequantized math, any device) and the
weight-side quantization used to make realistic inputs (128x128 blocks, UE8M0 scales, e4m3)."""
from __future__ import annotations

import torch

QBLOCK = 128


def expand_weight_scales(sb: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[ceil(N/128), K/128] block scales -> [N, K] float64."""
    return sb.double().repeat_interleave(QBLOCK, 0)[:n].repeat_interleave(QBLOCK, 1)[:, :k]


def ref_fp8_gemm(a, sa, b, sb, groups: int = 1) -> torch.Tensor:
    """float64 C [M, G*N] = per group g: (A_g * sa_g) . (B_g * sb_g)^T over the dequantized operands."""
    m = a.shape[0]
    gn, k = b.shape
    n = gn // groups
    nq = sb.shape[0] // groups
    a64 = a.double() * sa.double().repeat_interleave(QBLOCK, 1)
    outs = []
    for g in range(groups):
        bg = b[g * n:(g + 1) * n].double() * expand_weight_scales(sb[g * nq:(g + 1) * nq], n, k)
        outs.append(a64[:, g * k:(g + 1) * k] @ bg.T)
    return torch.cat(outs, dim=1) if m else a64.new_zeros(0, gn)


def quantize_weight_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w float [N, K] (K % 128 == 0) -> (float8_e4m3fn [N, K], fp32 UE8M0 scales [ceil(N/128), K/128]) with
    s = 2^ceil(log2(block absmax / 448)), the checkpoint's format (scale_fmt ue8m0)."""
    n, k = w.shape
    npad = -(-n // QBLOCK) * QBLOCK
    wp = torch.zeros(npad, k, dtype=torch.float32, device=w.device)
    wp[:n] = w.float()
    blocks = wp.reshape(npad // QBLOCK, QBLOCK, k // QBLOCK, QBLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = torch.clamp(blocks / s[:, None, :, None], -448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(npad, k)[:n].contiguous(), s.float()
