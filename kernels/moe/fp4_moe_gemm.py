"""MXFP4 grouped expert GEMM (DeepSeek V4's routed experts, dsv4_kernels.md 1 and 3.11): FP8 activations x FP4
e2m1 weights, the tokens of every expert in one launch.

    C[r, :] bf16 = sum over 32-wide K slices s of  sa[r, s // 4] * 2^(sb[e, n, s] - 127) * (A[r, s] . W_e[n, s])

  A   fp8 e4m3 [M, K]: the routed rows (token copies) sorted by expert, each expert's rows padded up to a
      multiple of block_m (ops.moe_align builds that layout); sa fp32 [M, K / 128] their 1x128 UE8M0 scales
      (act_quant_fp8 writes them).
  W   uint8 [E, N, K / 2]: e2m1 pairs as vLLM stores the checkpoint's float4_e2m1fn_x2 (element 2j in bits 0-3,
      element 2j + 1 in bits 4-7; bit 3 of a nibble is the sign), read by the kernel as int32 words [E, N, K / 8]; sb uint8 [E, N, K / 32]: UE8M0 exponents of
      the 1x32 weight scales (2^(sb - 127)).
  block_expert int32 [M / block_m]: the expert of each block of block_m rows, -1 for a padding block (its rows
      are written 0 and nothing is read for it: a CUDA-graph-sized M costs only its real blocks).

Every e2m1 value (0, 0.5 .. 6) is exact in e4m3, so each 32-wide slice runs as one fp8 mma.sync m16n8k32 over
exact operands with fp32 accumulation, and the two scales (per row, per weight row and slice) are applied to the
slice's partial in fp32: the same math as the reference's fp4_gemm (block_K 32), with no rounding but the
tensor cores' fp32 sums and the bf16 store. Dequantization happens in shared memory (packed tile -> fp8 tile);
the native block-scaled FP4 MMA of sm_120a is not used (not provable on the GPUs this project can run).

Grid (N / block_n, M / block_m); N and K are compile-time, M and E dynamic. `select` depends on the token count
only (never on routing): block_m 16 while the average expert sees <= 12 rows at V4's 6-of-256 routing, then 32,
then 64, so the planner enumerates every variant an engine asks for.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, schedule_name
from dsv4_jit.spec import Variant, multiple_param, register

from .fp4_moe_decode import ROWS as REGISTERS_ROWS
from .fp4_moe_decode import block_cols, build_fp4_moe_decode, decode_smem_bytes, decode_warps
from .spec_base import MoeKernelSpec

FP8 = "float8_e4m3"
SLICE = 32            # weight scale group along K (MXFP4), and the K of one fp8 mma.sync
ACT_BLOCK = 128       # activation scale group along K
BLOCK_N = 128
# 16-row blocks in this (tile) form, as selected until the registers form (bench_moe.py --decode-form tile)
DECODE_BLOCK_N, DECODE_STAGES = 64, 2
# 16-row blocks run fp4_moe_decode.py's form (weights dequantized in registers, split-K across warps, 2 stages a
# warp); "tile" is the form below, kept for the benchmark's side-by-side (bench_moe.py --decode-form)
DECODE_FORM, DECODE_FORM_STAGES = "registers", 2
THREADS = 128
# Token-count thresholds of the three row-block sizes (see the module doc).
BLOCK_M_BY_TOKENS = ((512, 16), (2048, 32))
BLOCK_M_LARGE = 64
# e4m3 bytes of the e2m1 magnitudes 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6), little-endian: the byte-permute table
LUT_LO, LUT_HI = 0x3C383000, 0x4C484440
# cp.async stages per family (a stage streams block_n x 64 B of packed weight).
STAGES = {"blackwell_consumer": 4, "hopper": 4, "blackwell_dc": 4}


def e2m1_e4m3_byte(nib: int) -> int:
    """The e4m3 byte of an e2m1 nibble, in plain Python: the table the kernel permutes from plus the sign
    (tests check it against torch's float8_e4m3fn for all 16 nibbles)."""
    return ((LUT_LO | LUT_HI << 32) >> (8 * (nib & 7)) & 0xFF) | ((nib & 8) << 4)


def byte_perm(x: int, y: int, sel: int) -> int:
    """CUDA's __byte_perm in plain Python (selector bit 3 of each nibble: replicate the byte's sign)."""
    src = (x & 0xFFFFFFFF) | (y & 0xFFFFFFFF) << 32
    out = 0
    for i in range(4):
        nib = sel >> (4 * i) & 0xF
        b = src >> (8 * (nib & 7)) & 0xFF
        out |= (0xFF if b & 0x80 else 0) << (8 * i) if nib & 8 else b << (8 * i)
    return out


def e4m3_quad_py(u: int, half: int) -> int:
    """The kernel's e4m3_quad in plain Python, op for op (tests compare it with e2m1_e4m3_byte per nibble)."""
    v = (u & 0xFFFFFFFF) >> (16 * half)
    mag = byte_perm(LUT_LO, LUT_HI, v & 0x7777)
    sign = ((v & 0x8) << 4) | ((v & 0x80) << 8) | ((v & 0x800) << 12) | ((v & 0x8000) << 16)
    return (mag | sign) & 0xFFFFFFFF


def moe_block_m(num_tokens: int) -> int:
    for limit, bm in BLOCK_M_BY_TOKENS:
        if num_tokens <= limit:
            return bm
    return BLOCK_M_LARGE


def stage_bytes(block_m: int, block_n: int) -> int:
    """One pipeline stage (a 128-wide K block): the A fp8 tile, the packed weight tile, its 4 exponents per
    weight row and the rows' activation scales."""
    return block_m * ACT_BLOCK + block_n * ACT_BLOCK // 2 + block_n * (ACT_BLOCK // SLICE) + block_m * 4


def moe_smem_bytes(p: Mapping[str, Any]) -> int:
    """Pre-nvcc shared memory: `stages` stages, plus the single dequantized fp8 weight tile (block_n x 128); the
    registers form's own formula (fp4_moe_decode.decode_smem_bytes)."""
    if p.get("form") == "registers":
        return decode_smem_bytes(p["k"], p["stages"], p["block_m"])
    return p["stages"] * stage_bytes(p["block_m"], p["block_n"]) + p["block_n"] * ACT_BLOCK


def moe_params(arch: ArchProfile, n: int, k: int, num_tokens: int) -> dict:
    bm = moe_block_m(num_tokens)
    if bm in REGISTERS_ROWS and DECODE_FORM == "registers":
        warps = decode_warps(k)
        # never more stages than K blocks a warp walks, nor than fit the family's budget (64 rows at K = 7168 on
        # SM12x: one stage)
        stages = max(1, min(DECODE_FORM_STAGES, -(-(k // ACT_BLOCK) // warps)))
        while stages > 1 and decode_smem_bytes(k, stages, bm) > arch.max_smem_per_block:
            stages -= 1
        return {"n": n, "k": k, "block_m": bm, "block_n": block_cols(bm), "threads": 32 * warps, "stages": stages,
                "form": "registers"}
    # decode (16-row blocks): 64-column tiles and 2 stages. Twice the CTAs per touched expert and more of them
    # resident: at 1 token the 6 experts x 32 tiles of 128 left the H100's 132 SMs unevenly loaded (SM12x
    # schedule on sm_90a, V4-Flash w13: 78 -> 62 us at 1 token, 1,560 -> 1,525 us at 64; deeper rings were slower)
    bn, stages = (DECODE_BLOCK_N, DECODE_STAGES) if bm == 16 else (BLOCK_N, STAGES[arch.family])
    kb = k // ACT_BLOCK
    # never more stages than K blocks (w2 at TP 8: K = 256 / 384 is 2 / 3 blocks)
    return {"n": n, "k": k, "block_m": bm, "block_n": bn, "threads": THREADS, "stages": max(1, min(stages, kb))}


def build_fp4_moe_gemm(*, n: int, k: int, block_m: int, block_n: int, stages: int, threads: int):
    import tilelang.language as T

    BM, BN = block_m, block_n
    KS = k // SLICE                    # weight-scale slices along K
    BK = ACT_BLOCK                     # one pipeline stage: a 128-wide K block (one activation scale) ...
    SPB = BK // SLICE                  # ... of 4 slices, every slice its own fp8 mma over exact operands
    KB = k // BK
    f32 = "float32"
    M = T.dynamic("num_rows")
    E = T.dynamic("num_experts")
    NB = T.dynamic("num_blocks")

    def e4m3_quad(u, half):
        """4 e4m3 bytes (as a uint32, element 8g + 4 * half + i in byte i) of the e2m1 nibbles in the 16-bit half
        `half` of u = 4 packed bytes (element 8g + i in nibble i): one byte permute looks each nibble's
        magnitude up in the 8-entry table E2M1_E4M3 (0, 0.5 .. 6 as e4m3 bytes), then each sign bit (nibble bit
        3) moves to its byte's bit 7. 7 integer ops for 4 weights, where a per-nibble select took ~15 each and
        left the kernel instruction-bound (9-11% of copy bandwidth on the H100, 2026-11-23)."""
        v = u >> T.Cast("uint32", 16 * half)
        mag = T.call_extern("uint32", "__byte_perm", T.Cast("uint32", LUT_LO), T.Cast("uint32", LUT_HI),
                            v & T.Cast("uint32", 0x7777))
        sign = (((v & T.Cast("uint32", 0x8)) << T.Cast("uint32", 4)) | ((v & T.Cast("uint32", 0x80)) << T.Cast("uint32", 8))
                | ((v & T.Cast("uint32", 0x800)) << T.Cast("uint32", 12)) | ((v & T.Cast("uint32", 0x8000)) << T.Cast("uint32", 16)))
        return mag | sign

    def ue8m0(byte):
        """2^(byte - 127) built from its bits (exact, no exp2 per element; byte 0 reads as 0)."""
        return T.reinterpret(T.shift_left(T.Cast("uint32", byte), T.Cast("uint32", 23)), f32)

    @T.prim_func
    def fp4_moe_gemm(
        a: T.Tensor[(M, k), FP8],
        sa: T.Tensor[(M, k // ACT_BLOCK), f32],
        w: T.Tensor[(E, n, k // 8), "int32"],
        sw: T.Tensor[(E, n, KS), "uint8"],
        block_expert: T.Tensor[(NB,), "int32"],
        c: T.Tensor[(M, n), "bfloat16"],
    ):
        with T.Kernel(n // BN, NB, threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), FP8)
            wp_s = T.alloc_shared((BN, BK // 8), "int32")
            ws_s = T.alloc_shared((BN, SPB), "uint8")
            sa_s = T.alloc_shared((BM,), f32)
            w_s = T.alloc_shared((BN, BK), FP8)
            part = T.alloc_fragment((BM, BN), f32)
            acc = T.alloc_fragment((BM, BN), f32)
            ex = T.alloc_var("int32")
            ex = block_expert[by]
            if ex < 0:
                # padding block (M sized for capture): zeros, nothing read
                for i, j in T.Parallel(BM, BN):
                    if by * BM + i < M:
                        c[by * BM + i, bx * BN + j] = T.Cast("bfloat16", 0.0)
            else:
                T.clear(acc)
                for kb in T.Pipelined(KB, num_stages=stages):
                    for i, j in T.Parallel(BM, BK):
                        a_s[i, j] = a[T.min(by * BM + i, M - 1), kb * BK + j]
                    T.copy(w[T.min(ex, E - 1), bx * BN, kb * (BK // 8)], wp_s)
                    T.copy(sw[T.min(ex, E - 1), bx * BN, kb * SPB], ws_s)
                    for i in T.Parallel(BM):
                        sa_s[i] = sa[T.min(by * BM + i, M - 1), kb]
                    for j, q in T.Parallel(BN, BK):
                        w_s[j, q] = T.reinterpret(T.Cast("uint8", (e4m3_quad(T.Cast("uint32", wp_s[j, q // 8]), (q % 8) // 4)
                                                                    >> T.Cast("uint32", 8 * (q % 4))) & T.Cast("uint32", 255)), FP8)
                    # explicit: TileLang 0.1.15 may place its only barrier inside a branch (docs/adding_a_kernel.md)
                    T.sync_threads()
                    for sl in T.unroll(SPB):
                        T.gemm(a_s[:, sl * SLICE:(sl + 1) * SLICE], w_s[:, sl * SLICE:(sl + 1) * SLICE], part,
                               transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                        for i, j in T.Parallel(BM, BN):
                            acc[i, j] += part[i, j] * sa_s[i] * ue8m0(ws_s[j, sl])
                for i, j in T.Parallel(BM, BN):
                    if by * BM + i < M:
                        c[by * BM + i, bx * BN + j] = T.Cast("bfloat16", acc[i, j])

    return fp4_moe_gemm


@register
class Fp4MoeGemmSpec(MoeKernelSpec):
    """Grouped MXFP4 expert GEMM. Statics: n (multiple of 128), k (multiple of 128): one per expert weight shape
    (w1+w3 fused, w2) at the rank's TP; the expert count and the routed rows are runtime."""
    name = "fp4_moe_gemm"
    mma_sync_only = True
    arg_names = ("a", "sa", "w", "sw", "block_expert", "c")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"n": 2 * int(model.moe_intermediate_size), "k": int(model.hidden_size)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        n = multiple_param(self.name, static, "n", BLOCK_N)
        k = multiple_param(self.name, static, "k", ACT_BLOCK)
        return Variant.make(self.name, moe_params(arch, n, k, num_tokens), arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return moe_smem_bytes(variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = super().pass_configs(variant)
        if variant.p.get("form") == "registers":
            cfg["tl.disable_thread_storage_sync"] = True   # its barriers are all written by hand
        return cfg

    def build(self, variant: Variant):
        p = variant.p
        if p.get("form") == "registers":
            return build_fp4_moe_decode(n=p["n"], k=p["k"], stages=p["stages"], rows=p["block_m"])
        return build_fp4_moe_gemm(**p)
