"""Activation quantization for DeepSeek V4 (ref `act_quant` / `fp4_act_quant`, dsv4_kernels.md 3.9), one
TileLang builder for four kernels:

* `act_quant_fp8`: x bf16 [M, N] -> y fp8 e4m3 [M, N] + scales fp32 [M, N / 128]. Per token, 1x128 groups,
  UE8M0 scales: s = 2^ceil(log2(max(amax, 1e-4) * (1/448))), y = fp8(clamp(x / s, +-448)), x ~ s * y. The
  scales are written as fp32 powers of two: that is what the FP8 block-scaled GEMM (kernels/gemm) consumes
  (`scales_a [M, K/128] fp32`), and every value is exactly a UE8M0 number (float8_e8m0fnu casts losslessly).
* `act_quant_fp8_inplace`: the QAT simulation the reference applies to the KV NoPE dims
  (`act_quant(kv[..., :448], 64, inplace=True)`): per token, 1x64 groups over the first N = 448 columns of a
  row of width `stride` (512), quantized to e4m3 with UE8M0 scales and dequantized back to bf16 in place. The
  RoPE columns [N, stride) are not touched. No scales are written.
* `act_quant_fp4`: the indexer's e2m1 quantization (ref `fp4_act_quant`, block 32): per token, 1x32 groups,
  s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)), q = e2m1(clamp(x / s, +-6)) rounded to nearest, ties to even
  (codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign, set when x / s < 0). Packed two per byte, element
  2i in the low nibble (torch.float4_e2m1fn_x2 order): y uint8 [M, N / 2]; scales uint8 [M, N / 32] holding
  the UE8M0 biased exponent (s = 2^(byte - 127), the float8_e8m0fnu bit pattern; the DeepGEMM FP4 index-K
  layout).
* `swiglu_quant_fp8`: the expert SwiGLU fused with the quantization of w2's input (ref `Expert.forward` then
  `act_quant`): gate_up bf16 [M, 2I] (gate = columns [0, I), up = [I, 2I), vLLM's w13 layout), in fp32:
      if limit > 0:  up = clamp(up, -limit, limit);  gate = min(gate, limit)     (gate: upper bound only)
      h = bf16(silu(gate) * up)
  then act_quant_fp8 of h (1x128, UE8M0). limit = swiglu_limit (10) for routed experts, 0 for the shared
  expert (the reference builds it without the clamp). The routing weight is not applied here.

Grid (ceil(M / BLK_M), N / group): a CTA stages BLK_M = 32 rows x one group in shared memory (bf16), takes
the row absmax in registers, writes the scales and the quantized group. M is `T.dynamic`; rows past M read
the last row (clamped index) and are never written.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, get_profile, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

FP8 = "float8_e4m3"
FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4                 # ref act_quant: amax = max(amax, 1e-4)
FP4_MAX = 6.0
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126    # ref fp4_quant: amax = max(amax, 6 * 2^-126)
BLK_M = 32
THREADS = 128


# mode -> (group, input width given n and stride)
MODES = ("fp8", "fp8_inplace", "fp4", "swiglu")


def quant_smem_bytes(p: Mapping[str, Any]) -> int:
    """Pre-nvcc shared memory: the staged BLK_M x group bf16 tile, the BLK_M fp32 scales, and an upper bound
    for TileLang's cross-warp reduction workspace (one fp32 per thread)."""
    return p["blk_m"] * p["group"] * 2 + p["blk_m"] * 4 + p["threads"] * 4


def _pow2_ceil(v):
    """2^ceil(log2(v)) for a positive normal fp32 `v`, by its bits (the ref's fast_round_scale): exact, and
    the same on every GPU. Returns (scale fp32, biased exponent int32)."""
    import tilelang.language as T
    bits = T.reinterpret(v, "uint32")
    e = (T.Cast("int32", T.shift_right(bits, T.uint32(23)) & T.uint32(0xFF))
         + T.if_then_else((bits & T.uint32(0x7FFFFF)) != T.uint32(0), 1, 0))
    return T.reinterpret(T.shift_left(T.Cast("uint32", e), T.uint32(23)), "float32"), e


def _e2m1_code(v):
    """e2m1 code (0..15) of v in [-6, 6], round to nearest, ties to even."""
    import tilelang.language as T
    a = T.abs(v)
    mag = (T.if_then_else(a > 0.25, 1, 0) + T.if_then_else(a >= 0.75, 1, 0) + T.if_then_else(a > 1.25, 1, 0)
           + T.if_then_else(a >= 1.75, 1, 0) + T.if_then_else(a > 2.5, 1, 0) + T.if_then_else(a >= 3.5, 1, 0)
           + T.if_then_else(a > 5.0, 1, 0))
    return mag + T.if_then_else(v < 0.0, 8, 0)


def build_quant(*, mode: str, n: int, group: int, stride: int = 0, limit: float = 0.0, blk_m: int = BLK_M,
                threads: int = THREADS):
    import tilelang.language as T

    G, BM = group, blk_m
    NG = n // G
    f32 = "float32"
    fp4 = mode == "fp4"
    qmax = FP4_MAX if fp4 else FP8_MAX
    floor = FP4_AMAX_FLOOR if fp4 else FP8_AMAX_FLOOR
    inv = 1.0 / qmax
    M = T.dynamic("num_tokens")

    @T.macro
    def stage(x_in, x_shared, x_frag, s_shared, bm, bg):
        for i, j in T.Parallel(BM, G):
            r = T.min(bm * BM + i, M - 1)
            if mode == "swiglu":
                gt = T.Cast(f32, x_in[r, bg * G + j])
                up = T.Cast(f32, x_in[r, n + bg * G + j])
                if limit > 0:
                    gt = T.min(gt, limit)
                    up = T.clamp(up, -limit, limit)
                x_shared[i, j] = T.Cast("bfloat16", gt / (1.0 + T.exp(-gt)) * up)
            else:
                x_shared[i, j] = x_in[r, bg * G + j]
        for i, j in T.Parallel(BM, G):
            x_frag[i, j] = T.Cast(f32, x_shared[i, j])

    @T.macro
    def scales(x_frag, amax, s_shared):
        T.reduce_absmax(x_frag, amax, dim=1)
        for i in T.Parallel(BM):
            s_shared[i] = _pow2_ceil(T.max(amax[i], floor) * inv)[0]

    if mode == "fp4":
        @T.prim_func
        def act_quant_fp4(
            x: T.Tensor[(M, n), "bfloat16"],
            y: T.Tensor[(M, n // 2), "uint8"],
            s: T.Tensor[(M, NG), "uint8"],
        ):
            with T.Kernel(T.ceildiv(M, BM), NG, threads=threads) as (bm, bg):
                x_shared = T.alloc_shared((BM, G), "bfloat16")
                s_shared = T.alloc_shared((BM,), f32)
                x_frag = T.alloc_fragment((BM, G), f32)
                amax = T.alloc_fragment((BM,), f32)
                stage(x, x_shared, x_frag, s_shared, bm, bg)
                scales(x_frag, amax, s_shared)
                for i, j in T.Parallel(BM, G // 2):
                    if bm * BM + i < M:
                        lo = _e2m1_code(T.clamp(T.Cast(f32, x_shared[i, 2 * j]) / s_shared[i], -qmax, qmax))
                        hi = _e2m1_code(T.clamp(T.Cast(f32, x_shared[i, 2 * j + 1]) / s_shared[i], -qmax, qmax))
                        y[bm * BM + i, bg * (G // 2) + j] = T.Cast("uint8", lo + hi * 16)
                for i in T.Parallel(BM):
                    if bm * BM + i < M:
                        s[bm * BM + i, bg] = T.Cast("uint8", T.shift_right(T.reinterpret(s_shared[i], "uint32"),
                                                                           T.uint32(23)))

        return act_quant_fp4

    if mode == "fp8_inplace":
        @T.prim_func
        def act_quant_fp8_inplace(
            x: T.Tensor[(M, stride), "bfloat16"],
        ):
            with T.Kernel(T.ceildiv(M, BM), NG, threads=threads) as (bm, bg):
                x_shared = T.alloc_shared((BM, G), "bfloat16")
                s_shared = T.alloc_shared((BM,), f32)
                x_frag = T.alloc_fragment((BM, G), f32)
                amax = T.alloc_fragment((BM,), f32)
                stage(x, x_shared, x_frag, s_shared, bm, bg)
                scales(x_frag, amax, s_shared)
                for i, j in T.Parallel(BM, G):
                    if bm * BM + i < M:
                        x[bm * BM + i, bg * G + j] = T.Cast(
                            "bfloat16",
                            T.Cast(f32, T.Cast(FP8, T.clamp(x_frag[i, j] / s_shared[i], -qmax, qmax))) * s_shared[i])

        return act_quant_fp8_inplace

    in_width = 2 * n if mode == "swiglu" else n

    @T.prim_func
    def act_quant_fp8(
        x: T.Tensor[(M, in_width), "bfloat16"],
        y: T.Tensor[(M, n), FP8],
        s: T.Tensor[(M, NG), f32],
    ):
        with T.Kernel(T.ceildiv(M, BM), NG, threads=threads) as (bm, bg):
            x_shared = T.alloc_shared((BM, G), "bfloat16")
            s_shared = T.alloc_shared((BM,), f32)
            x_frag = T.alloc_fragment((BM, G), f32)
            amax = T.alloc_fragment((BM,), f32)
            stage(x, x_shared, x_frag, s_shared, bm, bg)
            scales(x_frag, amax, s_shared)
            for i, j in T.Parallel(BM, G):
                if bm * BM + i < M:
                    y[bm * BM + i, bg * G + j] = T.Cast(FP8, T.clamp(x_frag[i, j] / s_shared[i], -qmax, qmax))
            for i in T.Parallel(BM):
                if bm * BM + i < M:
                    s[bm * BM + i, bg] = s_shared[i]

    return act_quant_fp8


class _QuantSpec(KernelSpec):
    mode = "fp8"
    group = 128

    def _params(self, arch, static, num_tokens) -> dict:
        """What every quant variant holds: the mode, its group, the tile, and n (a multiple of the group)."""
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        return {"mode": self.mode, "group": self.group, "blk_m": BLK_M, "threads": THREADS,
                "n": int_param(self.name, static, "n", multiple=self.group)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        return self._variant(arch, self._params(arch, static, num_tokens))

    def _variant(self, arch: ArchProfile, p: dict) -> Variant:
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return quant_smem_bytes(variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = dict(get_profile(variant.schedule).pass_configs)
        cfg["tl.disable_wgmma"] = True
        return cfg

    def build(self, variant: Variant):
        p = variant.p
        return build_quant(mode=p["mode"], n=p["n"], group=p["group"], stride=p.get("stride", 0),
                           limit=p.get("limit", 0.0), blk_m=p["blk_m"], threads=p["threads"])


@register
class ActQuantFp8Spec(_QuantSpec):
    """Per-token 1x128 e4m3 quantization with UE8M0 scales (the input of every FP8 GEMM). Static: n (row width)."""
    name = "act_quant_fp8"
    arg_names = ("x", "y", "s")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"n": int(model.hidden_size)}


@register
class ActQuantFp8InplaceSpec(_QuantSpec):
    """KV NoPE QAT simulation: 1x64 e4m3 quant-dequant of the first n (448) columns of rows of width stride
    (512), in place. Statics: n, stride."""
    name = "act_quant_fp8_inplace"
    mode = "fp8_inplace"
    group = 64
    arg_names = ("x",)

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"n": int(model.nope_head_dim), "stride": int(model.head_dim)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        p = self._params(arch, static, num_tokens)
        p["stride"] = int_param(self.name, static, "stride")
        if p["stride"] < p["n"]:
            raise ValueError(f"{self.name}: stride={p['stride']} is smaller than n={p['n']}")
        return self._variant(arch, p)


@register
class ActQuantFp4Spec(_QuantSpec):
    """Indexer e2m1 quantization, 1x32 groups, UE8M0 scales as uint8 exponents. Static: n (128)."""
    name = "act_quant_fp4"
    mode = "fp4"
    group = 32
    arg_names = ("x", "y", "s")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"n": int(model.index_head_dim)}


@register
class SwigluQuantFp8Spec(_QuantSpec):
    """SwiGLU (+ clamp at `limit` when > 0) fused with 1x128 e4m3 quantization. Statics: n (intermediate
    size per rank), limit (float, 0 = no clamp)."""
    name = "swiglu_quant_fp8"
    mode = "swiglu"
    arg_names = ("x", "y", "s")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"n": int(model.moe_intermediate_size) // parallel.tp_size, "limit": float(model.swiglu_limit)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        p = self._params(arch, static, num_tokens)
        limit = static.get("limit") if isinstance(static, Mapping) else None
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0 or limit == float("inf"):
            raise ValueError(f"{self.name}: limit must be a finite float >= 0 (0 = no clamp), got {limit!r}")
        p["limit"] = float(limit)
        return self._variant(arch, p)
