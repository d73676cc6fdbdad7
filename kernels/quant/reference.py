"""Torch references of the quantization kernels (any device), written from the model's math (ref
`act_quant` / `fp4_act_quant` / `Expert.forward`, dsv4_kernels.md 3.9). The scale rule is the reference's
bit-exact fp32 one: s = 2^ceil(log2(max(amax, floor) * fp32(1 / qmax))); dequantized values are returned
in float64.
"""
from __future__ import annotations

import torch

FP8_MAX, FP8_FLOOR = 448.0, 1e-4
FP4_MAX, FP4_FLOOR = 6.0, 6.0 * 2.0 ** -126
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ue8m0_scale(amax: torch.Tensor, qmax: float, floor: float) -> torch.Tensor:
    """fp32 power-of-two scales from fp32 group absmaxes (exactly the kernel's bit arithmetic)."""
    v = torch.clamp(amax.float(), min=floor) * torch.tensor(1.0 / qmax, dtype=torch.float32)
    bits = v.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e << 23).view(torch.float32)


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    m, n = x.shape
    return x.float().reshape(m, n // group, group)


def ref_act_quant_fp8(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, N] -> (y float8_e4m3fn [M, N], scales fp32 [M, N / group])."""
    xg = _groups(x, group)
    s = ue8m0_scale(xg.abs().amax(-1), FP8_MAX, FP8_FLOOR)
    y = torch.clamp(xg / s[..., None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return y.reshape(x.shape), s


def dequant_fp8(y: torch.Tensor, s: torch.Tensor, group: int = 128) -> torch.Tensor:
    m, n = y.shape
    return (y.double().reshape(m, n // group, group) * s.double()[..., None]).reshape(m, n)


def ref_act_quant_fp8_inplace(x: torch.Tensor, n: int = 448, group: int = 64) -> torch.Tensor:
    """The QAT simulation of the KV NoPE dims: a new bf16 tensor equal to x with columns [0, n) replaced by
    their 1 x group e4m3 quant-dequant (the kernel does it in place)."""
    y, s = ref_act_quant_fp8(x[:, :n].contiguous(), group)
    out = x.clone()
    out[:, :n] = ((y.float().reshape(x.shape[0], n // group, group) * s[..., None]).reshape(x.shape[0], n)
                  .to(torch.bfloat16))
    return out


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (int32, bit 3 = sign) of v in [-6, 6]: round to nearest, ties to even."""
    a = v.abs()
    mag = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
           + (a >= 3.5).int() + (a > 5.0).int())
    return mag + 8 * (v < 0).int()


def ref_act_quant_fp4(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, N] -> (packed uint8 [M, N / 2] (element 2i in the low nibble), UE8M0 exponents uint8
    [M, N / group], s = 2^(byte - 127))."""
    m, n = x.shape
    xg = _groups(x, group)
    s = ue8m0_scale(xg.abs().amax(-1), FP4_MAX, FP4_FLOOR)
    codes = e2m1_codes(torch.clamp(xg / s[..., None], -FP4_MAX, FP4_MAX)).reshape(m, n)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def dequant_fp4(packed: torch.Tensor, scales: torch.Tensor, group: int = 32) -> torch.Tensor:
    """float64 [M, N] from packed e2m1 + UE8M0 exponent bytes."""
    m = packed.shape[0]
    p = packed.to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(m, -1)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=packed.device)
    vals = table[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).to(torch.float64)
    s = torch.exp2(scales.to(torch.float64) - 127.0)
    n = vals.shape[1]
    return (vals.reshape(m, n // group, group) * s[..., None]).reshape(m, n)


def ref_swiglu(gate_up: torch.Tensor, limit: float, dtype=torch.float32) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, +-limit) (no clamp when limit == 0), computed in `dtype`."""
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].to(dtype), gate_up[:, i:].to(dtype)
    if limit > 0:
        up = torch.clamp(up, min=-limit, max=limit)
        gate = torch.clamp(gate, max=limit)
    return torch.nn.functional.silu(gate) * up


def ref_swiglu_quant_fp8(gate_up: torch.Tensor, limit: float, group: int = 128):
    """The fused kernel's math: fp32 SwiGLU, rounded to bf16 (the model's `x.to(dtype)`), then act_quant_fp8."""
    return ref_act_quant_fp8(ref_swiglu(gate_up, limit).to(torch.bfloat16), group)
