"""Quantization host ops: validate every argument (ValueError naming it) before anything is selected, loaded or
compiled; allocate only what the caller did not pass (`out=`, `scales=` for CUDA-graph capture); launch the
variant `select` picked through `get_kernel(spec, static, num_tokens)`.

Formats (kernels/quant/act_quant.py):
  act_quant_fp8      x bf16 [M, N] -> y torch.float8_e4m3fn [M, N], scales fp32 [M, N/128] (powers of two:
                     what fp8_gemm's `a_scales` takes)
  act_quant_fp8_inplace  x bf16 [M, stride] (or [..., stride]): columns [0, n) quant-dequantized in place, 1x64
  act_quant_fp4      x bf16 [M, N] -> y uint8 [M, N/2] (two e2m1 per byte, element 2i low nibble), scales uint8
                     [M, N/32] (UE8M0 biased exponents; `.view(torch.float8_e8m0fnu)` reads them as scales)
  swiglu_quant_fp8   gate_up bf16 [M, 2I] -> y fp8 [M, I], scales fp32 [M, I/128]; `limit` = swiglu_limit (routed
                     experts) or 0 (shared expert)
"""
from __future__ import annotations

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

FP8_GROUP, KV_GROUP, FP4_GROUP = 128, 64, 32


def _x2d(x, name: str, group: int, width_mult: int = 1):
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D torch.bfloat16 tensor [tokens, width]")
    check_tensor(x, name, [None, None], torch.bfloat16)
    m, w = x.shape
    if w % (group * width_mult) or w == 0:
        raise ValueError(f"{name}: width {w} must be a positive multiple of {group * width_mult}")
    return m, w


def _out(t, name: str, shape: tuple, dtype, dev):
    import torch
    from dsv4_jit.validate import check_tensor
    if t is None:
        return torch.empty(shape, dtype=dtype, device=dev)
    check_tensor(t, name, list(shape), dtype, dev)
    return t


def act_quant_fp8(x, *, arch, get_kernel, out=None, scales=None):
    """Per-token 1x128 e4m3 quantization with UE8M0 (power-of-two) fp32 scales. Returns (y, scales)."""
    import torch
    op = "act_quant_fp8"
    check_arch(op, arch)
    m, n = _x2d(x, "x", FP8_GROUP)
    out = _out(out, "out", (m, n), torch.float8_e4m3fn, x.device)
    scales = _out(scales, "scales", (m, n // FP8_GROUP), torch.float32, x.device)
    if m:
        get_kernel(get_spec(op), {"n": n}, m)(x, out, scales)
    return out, scales


def act_quant_fp8_inplace(x, *, arch, get_kernel, n: int = 448):
    """KV NoPE QAT simulation: columns [0, n) of every row of x (bf16, last dim = row width) quantized to e4m3
    in 1x64 groups with UE8M0 scales and dequantized back, in place. Returns x."""
    import torch
    from dsv4_jit.validate import check_tensor
    op = "act_quant_fp8_inplace"
    check_arch(op, arch)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError("x: expected a torch.bfloat16 tensor [..., row width] with at least 2 dims")
    check_tensor(x, "x", [None] * x.dim(), torch.bfloat16)
    int_arg("n", n, multiple=KV_GROUP)
    stride = x.shape[-1]
    if n > stride:
        raise ValueError(f"n: {n} exceeds the row width {stride} of x")
    rows = x.view(-1, stride)
    if rows.shape[0]:
        get_kernel(get_spec(op), {"n": n, "stride": stride}, rows.shape[0])(rows)
    return x


def act_quant_fp4(x, *, arch, get_kernel, out=None, scales=None):
    """Per-token 1x32 e2m1 quantization (indexer). Returns (packed uint8 [M, N/2], UE8M0 exponents uint8
    [M, N/32])."""
    import torch
    op = "act_quant_fp4"
    check_arch(op, arch)
    m, n = _x2d(x, "x", FP4_GROUP)
    out = _out(out, "out", (m, n // 2), torch.uint8, x.device)
    scales = _out(scales, "scales", (m, n // FP4_GROUP), torch.uint8, x.device)
    if m:
        get_kernel(get_spec(op), {"n": n}, m)(x, out, scales)
    return out, scales


def swiglu_quant_fp8(gate_up, *, limit: float, arch, get_kernel, out=None, scales=None):
    """silu(min(gate, limit)) * clamp(up, +-limit) (no clamp when limit == 0) rounded to bf16, then 1x128 e4m3
    quantization. gate_up bf16 [M, 2I] = [gate | up]. Returns (y fp8 [M, I], scales fp32 [M, I/128])."""
    import torch
    op = "swiglu_quant_fp8"
    check_arch(op, arch)
    m, w = _x2d(gate_up, "gate_up", FP8_GROUP, 2)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < float("inf"):
        raise ValueError(f"limit: must be a finite number >= 0 (0 = no clamp), got {limit!r}")
    i = w // 2
    out = _out(out, "out", (m, i), torch.float8_e4m3fn, gate_up.device)
    scales = _out(scales, "scales", (m, i // FP8_GROUP), torch.float32, gate_up.device)
    if m:
        get_kernel(get_spec(op), {"n": i, "limit": float(limit)}, m)(gate_up, out, scales)
    return out, scales
