"""DeepSeek V4 sparse MLA attention with the learned sink: decode over the fp8_ds_mla paged cache, and
prefill over a gathered bf16 KV.

Math (per query token t, head h; one KV head, K = V = the 512-d latent incl. its 64 RoPE dims):
  s_j   = q[t, h] . kv_j * softmax_scale                      over the candidates j of token t
  out   = sum_j e^{s_j} kv_j / (sum_j e^{s_j} + e^{sink[h]})  (the sink only enlarges the denominator)
Candidates come from two lists per token (the SWA window, and the compressed-cache positions the indexer
picked or every ratio-128 block), each with its own cache, index list [T, N] (-1 = hole) and length [T].
A token with no valid candidate gets out = 0 (softmax over the sink alone).

fp8_ds_mla cache (FlashMLA MODEL1 FP8 sparse): a page of `block_size` tokens is [block_size x 576 B:
448 fp8 e4m3 NoPE | 64 bf16 RoPE] then [block_size x 8 B: 7 UE8M0 scales, one per 64 NoPE dims, 1 pad];
pages may be padded (any page size that is a multiple of 16 B). The kernel reads the page bytes through
three views of the same storage, [pages, page_bytes/16, 16] fp8 and uint8 and [pages, page_bytes/16, 8]
bf16, so every read is a static 16-byte-aligned row and vectorizes; it dequantizes into shared memory.
A slot is page * block_size + offset. Out-of-range slots, holes and positions past a token's length are
masked in the kernel (never read), so a bad index can never become an illegal access.

One CTA = (query token, block of HB heads, split). Q [HB, 512] and one KV tile [BI, 512] live in shared
memory (bf16), O in registers (mma.sync through T.gemm). The scores go through shared memory (fp32) to a
row-per-thread-group softmax: the TPR = threads / HB threads of a head row are adjacent lanes, so the row max is
a few shuffles; the row sum stays per thread and is reduced once at the end. With n_splits > 1 each split takes
an even share of the token's tiles (computed from its real lengths at run time, so short requests do no work
past their length) and writes O normalised within the split and its log2-sum-exp (a split with no candidate
writes only lse = -inf); the combine kernel merges splits and applies the sink. With n_splits == 1 the kernel
writes `out` itself.

Shared memory, per CTA:  2*512*(HB + BI)  Q and KV tiles (bf16)
                       + 2*HB*BI          P (bf16, the second GEMM's A operand)
                       + 4*HB*(BI + 4)    the scores (fp32, rows padded)
                       + 4*HB*3           per-row rescale, sum and max
  then, for the fp8 gather, one of two pipelines (`stages`, chosen by select):
  - stages >= 1, the cp.async ring: + stages*BI*(448 + 128 + 8 + 8) + 4*BI  a tile's raw bytes (NoPE, RoPE,
    scales) and its rows' page and offset per stage, and the validity of the tile in kv_s. The bytes go
    global -> shared by cp.async with no register held and are dequantized from shared memory. One stage
    (select's): the next tile is issued once this one is dequantized out of the stage, and flies during its
    math. 16 heads 71,744 B, 32 heads 91,648 B (both fit SM12x), 64 heads 131,456 B (Hopper; 195,584 B with
    64-candidate tiles).
  - stages = 0, through registers: + 4*BI*(3 + 8) page / offset / validity and 8 fp32 scales per row; tile
    k+1's bytes are loaded into registers (every load issued before any is used) while tile k is dequantized
    and multiplied. Kept for one-token steps at 64 heads on Hopper (64 splits, 0-2 tiles a CTA).
  The bf16 (prefill) kernel gathers through registers as stages = 0 does.
SM12x: HB <= 32, BI = 32, 256 threads (16 heads: 128); H = 64 runs as 2 head blocks (the public
one-CTA-per-64-heads tiling needs 141,312 B, which SM120 cannot launch).
sm_90a / sm_100a: HB = 64 (one CTA reads a candidate tile for all 64 heads), BI = 32; on Hopper (WGMMA) BI = 64
where a token's list is split at most 2 ways (the fp8 ring) or not at all (prefill) (kv_tile).
The fp8 NoPE bytes become bf16 8 at a time by bit placement and two bf16x2 multiplies (DEQUANT8_SRC).

Every barrier is explicit, four per tile (TileLang's automatic ones were ~36: a block-wide reduction per row held
by a thread, and one in each step of the dequantize loop).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import math
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, ctas_by_smem, get_profile, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register

D = 512            # q / kv head dim (latent)
NOPE = 448         # fp8 dims
ROPE = 64          # bf16 dims
GROUP = 64         # NoPE dims per UE8M0 scale
TOKEN_BYTES = 576  # NoPE fp8 + RoPE bf16, per token, at the start of a page
SCALE_BYTES = 8    # 7 scales + 1 pad, per token, after the page's token data
KV_FORMATS = ("fp8_ds_mla", "bf16")
SPLITS = (1, 2, 4, 8, 16, 32, 64)
LOG2E = 1.4426950408889634
SPAD = 4           # fp32 pad per score row in shared memory (spreads the fragment stores over banks)


# 8 e4m3 bytes -> 8 bf16 times 2^(e - 127) (UE8M0 e; e = 0 gives 0), exactly: each byte's sign and 7 magnitude bits
# placed in a bf16 give the byte's value x 2^-120 (its subnormal codes included: a bf16 subnormal), which two
# power-of-two bf16x2 multiplies (2^120, then 2^(e - 127) with e in the exponent field) scale without rounding.
DEQUANT8_SRC = r"""
__device__ __forceinline__ unsigned dsv4_bf16x2_mul(unsigned a, unsigned b) {
  unsigned d;   // fma with -0 as the addend: a * b, with the sign of a zero product kept
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
__device__ __forceinline__ unsigned dsv4_e4m3x2_bf16x2(unsigned w, unsigned sel, unsigned scale) {
  unsigned t = __byte_perm(w, 0u, sel);   // the two bytes into bits 8-15 and 24-31
  unsigned b = (t & 0x80008000u) | ((t >> 4) & 0x07F007F0u);
  return dsv4_bf16x2_mul(dsv4_bf16x2_mul(b, 0x7B807B80u), scale);
}
__device__ __forceinline__ void dsv4_dequant8(void* dst, const void* src, unsigned e) {
  uint2 w = *reinterpret_cast<const uint2*>(src);
  unsigned scale = (e << 7) | (e << 23);
  uint4 o;
  o.x = dsv4_e4m3x2_bf16x2(w.x, 0x1404u, scale);
  o.y = dsv4_e4m3x2_bf16x2(w.x, 0x3424u, scale);
  o.z = dsv4_e4m3x2_bf16x2(w.y, 0x1404u, scale);
  o.w = dsv4_e4m3x2_bf16x2(w.y, 0x3424u, scale);
  *reinterpret_cast<uint4*>(dst) = o;
}
"""


def e4m3_bf16_bits(byte: int) -> int:
    """DEQUANT8_SRC's bit placement in plain Python: the bf16 bits holding e4m3 `byte`'s value x 2^-120 (the
    tests check it against torch for every code; NaN codes, which no encoder writes, become finite)."""
    return (byte & 0x80) << 8 | (byte & 0x7F) << 4


def pass_configs_for(variant: Variant) -> dict[str, Any]:
    # 128-bit vectors only: TileLang emits 256-bit loads for sm_100+/sm_120 that an SM120 schedule proven
    # on an sm_90a GPU would never exercise. WGMMA where the schedule's GPU has it (Hopper), for the GEMMs whose
    # M is a warp group's 64 heads; T.gemm keeps mma.sync at 16 / 32 heads a CTA. TileLang fences the async proxy
    # (fence.proxy.async) between the threads' stores of kv_s / p_s and the wgmma that reads them. H100,
    # 64 heads, 256K context (bench_attention, 2026-11-24): batch 64 143.3 -> 125.0 us (ratio 128) and
    # 55.0 -> 49.1 (ratio 4), batch 8 33.6 -> 31.0, one token 24.1 -> 22.8; same errors against float64.
    # (An earlier form of this kernel, its register-prefetch pipeline, gave per-token errors of 1.5 with WGMMA
    # allowed; the kernel has been restructured since, and its GPU cases pass with WGMMA.)
    profile = get_profile(variant.schedule)
    cfg = dict(profile.pass_configs)
    cfg["tl.disable_vectorize_256"] = True
    cfg["tl.disable_wgmma"] = not profile.has_wgmma
    # every barrier is explicit (see the loop): TileLang's pass sees all shared buffers as one allocation and
    # put a barrier in each iteration of the dequantize loop
    cfg["tl.disable_thread_storage_sync"] = True
    # every global index is in range by construction (slots checked against the cache, rows clamped), so
    # TileLang's per-access bounds guards (predicates on every cp.async) are dead code
    cfg["tl.disable_safe_memory_legalize"] = True
    # T.gemm's k loop (32 steps of ldmatrix + mma for the scores) is emitted rolled: each step then waits on
    # its own ldmatrix (ncu, H100: the top stall). Unrolled, ptxas issues the next step's loads early.
    cfg["tl.UnrollLoop"] = {"auto_max_step": 4096, "auto_max_extent": 64, "explicit_unroll": False}
    return cfg


def _int_static(name: str, static: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    if not isinstance(static, Mapping) or key not in static:
        raise ValueError(f"{name}: static params lack {key!r}")
    v = static[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name}: {key} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def head_block(heads: int, arch: ArchProfile) -> int:
    """Heads per CTA: 16 (the mma.sync row tile) up to 32 on SM12x, where Q + one KV tile must fit
    101,376 B; 64 elsewhere. H = 8 (V4-Flash at TP 8) runs padded to 16, the pad rows masked."""
    cap = 32 if arch.family == "blackwell_consumer" else 64
    hb = 16
    while hb < cap and hb < heads:
        hb *= 2
    return hb


WIDE_TILE_MAX_SPLITS = 2  # 64-candidate tiles where a token's list is split at most this many ways


def kv_tile(wgmma_cta: bool, n_splits: int, ring: bool) -> int:
    """Candidates per tile: 32, or 64 for a WGMMA CTA (64 heads on Hopper) that walks a long share of its token's
    list: the fp8 ring split at most 2 ways (45+ tokens on an H100), or the bf16 prefill kernel unsplit. Each
    WGMMA warp group then computes 32 score columns a tile instead of 16, so the per-tile work (barriers,
    softmax, the 32 score WGMMAs' descriptors) covers twice the candidates. H100, 2026-11-24, 64 heads:
    - decode, 256K context, batch 64, 2 splits (sweep_attention_schedules): ratio 128 122.3 -> 102.9 us, ratio 4
      51.0 -> 51.9 (level); at batch 8 (16 splits) 64 was slower on both lists (24.2 -> 29.4, 33.5 -> 37.8);
    - prefill, 640 candidates a token (bf16 through registers, 245 registers, no spill): T = 512 / 2,048 / 8,192
      236.8 -> 192.7, 792.3 -> 646.0, 2,988.3 -> 2,372.3 us, the same errors.
    SM12x's 101,376 B cannot hold a 64-row tile at 32 heads (149,632 B). The fp8 register path (one-token steps,
    64 splits) keeps 32: 64 gave wrong results in an earlier form of that pipeline."""
    if wgmma_cta and (n_splits <= WIDE_TILE_MAX_SPLITS if ring else n_splits == 1):
        return 64
    return 32


def kv_stages(hb: int, bi: int, arch: ArchProfile, n_splits: int) -> int:
    """The fp8 gather's pipeline: a 1-stage cp.async ring (the next tile's bytes go global -> shared while this
    tile is multiplied, no register held), or 0: through registers. H100, 2026-11-24 (ab/sweep, 4 input sets a
    graph, 256K context, every point below within 1 us or better): the ring beat registers by 9-20% at 64 tokens
    (SM120 schedule at 32 heads a CTA: 255.7 -> 223.5 us on the ratio-128 list, 82.5 -> 73.1 on ratio 4) and by up
    to 10% at 8; one stage matched or beat two (issued before the current tile is waited for) at every point, and
    three were 8-25% slower than two. Registers stay where a CTA has almost nothing to pipeline and 64 heads fill
    its registers: one-token steps on Hopper (64 splits, 0-2 tiles a CTA; 1.8 us faster)."""
    if hb >= 64 and n_splits >= SPLITS[-1]:
        return 0
    return 1 if smem_bytes_for(hb, bi, 1) <= arch.max_smem_per_block else 0


def ctas_per_sm(arch: ArchProfile, smem: int, threads: int) -> int:
    """CTAs of this variant one SM holds: __launch_bounds__(threads, 1) lets nvcc take up to 255 registers a
    thread, so they are counted at 255 (ptxas: 255 at 64 and 16 heads a CTA, 243 at 32); each CTA also reserves
    1 KB of shared memory."""
    by_regs = 65536 // (threads * 256)
    return max(1, min(by_regs, ctas_by_smem(arch, smem)))


def num_splits(num_tokens: int, head_blocks: int, num_sms: int, per_sm: int = 1) -> int:
    """Splits of each token's candidate list: the largest of SPLITS (1 .. 64) that keeps
    tokens x head blocks x splits within what the SMs hold at once (per_sm CTAs each), so a small decode batch
    still fills the GPU and a large one pays no combine. Depends on the token count only (never on context
    length), so the planner enumerates every value. H100, 16 heads (two CTAs an SM), batch 64: 4 splits took
    39.4 / 94.2 us at ratio 4 / 128 where 2 took 51.8 / 142.8 (2026-11-24, sweep_attention_schedules)."""
    per = num_sms * per_sm // max(1, num_tokens * head_blocks)
    s = 1
    while s * 2 <= min(per, SPLITS[-1]):
        s *= 2
    return s


def smem_bytes_for(hb: int, bi: int, stages: int = 0) -> int:
    """Q and KV tiles, P, the fp32 scores (padded rows), per-row alpha / sum / max; then per KV row: with the
    fp8 cp.async ring (stages > 0) each stage's NoPE, RoPE and scale bytes and page and offset, and the
    validity of the tile in kv_s; through registers page, offset, validity and 8 fp32 scales (bf16 uses two
    of the four words)."""
    common = 2 * D * (hb + bi) + 2 * hb * bi + 4 * hb * (bi + SPAD) + 4 * hb * 3
    if stages:
        return common + stages * bi * (NOPE + 2 * ROPE + SCALE_BYTES + 8) + 4 * bi
    return common + 4 * bi * (3 + 8)


def build_sparse_mla(heads: int, head_block: int, block_i: int, threads: int, kv_format: str, n_splits: int,
                     softmax_scale: float, stages: int = 0, score_chains: int = 0):
    import tilelang.language as T

    H, HB, BI, S, NST = heads, head_block, block_i, n_splits, stages
    if stages not in (0, 1, 2, 3, 4) or stages and kv_format != "fp8_ds_mla":
        raise ValueError(f"sparse_mla: stages must be 0 (registers) or 1..4 (the fp8_ds_mla cp.async ring), got "
                         f"{stages} for {kv_format}")
    if threads % HB or not 1 <= threads // HB <= 32 or BI % (threads // HB) or threads & (threads - 1):
        raise ValueError(f"sparse_mla: {threads} threads cannot share {HB} head rows of {BI} scores evenly "
                         f"(threads / head_block must be a power of two <= 32 dividing block_i)")
    NHB = (H + HB - 1) // HB
    pad_heads = H % HB != 0
    scale2 = softmax_scale * LOG2E
    fp8 = kv_format == "fp8_ds_mla"
    NG = NOPE // GROUP
    num_tokens = T.dynamic("num_tokens")
    n1 = T.dynamic("n_idx1")
    n2 = T.dynamic("n_idx2")
    neg_inf = -T.infinity("float32")

    if fp8:
        P1, R1, P2, R2 = T.dynamic("pages1"), T.dynamic("rows1"), T.dynamic("pages2"), T.dynamic("rows2")
    else:
        N1, N2 = T.dynamic("kv_rows1"), T.dynamic("kv_rows2")

    @T.macro
    def load_q(q, q_s, t, hb):
        if pad_heads:
            for h, d in T.Parallel(HB, D):
                q_s[h, d] = T.if_then_else(hb * HB + h < H, q[t, T.min(hb * HB + h, H - 1), d], T.bfloat16(0))
        else:
            T.copy(q[t, hb * HB:(hb + 1) * HB, :], q_s)

    @T.macro
    def load_q_async(q, q_s, t, hb):
        # the ring kernel: q by cp.async in its own commit group, so its DRAM round trip overlaps the length,
        # index and first tile loads; the first wait for a tile waits for it too (groups complete in order)
        if pad_heads:
            load_q(q, q_s, t, hb)
        else:
            T.async_copy(q[t, hb * HB:(hb + 1) * HB, :], q_s)

    # Score accumulators. mma.sync: 2 or 4 chains (registers: 255 a thread at HB = 64 already). WGMMA
    # (score_chains = 1): one async batch over all 512 dims and one wait; as chains, each 64-dim slice was a batch
    # with a wait of its own (8 a tile). H100, 64 heads, 256K context: 3-5% faster at batch 8 and 64, both lists.
    if score_chains not in (0, 1, 2, 4):
        raise ValueError(f"sparse_mla: score_chains must be 1, 2 or 4 (0: by head block), got {score_chains}")
    NACC = score_chains or (2 if HB >= 64 else 4)
    QK_SLICE = 64
    TPR = threads // HB          # threads per head row in the softmax
    CPT = BI // TPR              # score columns per thread
    TPR_LOG = TPR.bit_length() - 1

    @T.macro
    def scores(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s):
        # S = Q K^T over 512 dims. A warp holds only 1-2 mma tiles of S, so one accumulator is a chain of 32
        # dependent mma (ncu, H100: the top stall). NACC accumulators take alternate 64-dim slices, so the
        # chains interleave; they are summed into s_s. FullRow: at 64 heads the 8 warps tile S 4 x 2 (16 x 16
        # each), not 2 x 4 (32 x 8), so Q is read from shared memory by 2 warps, not 4 (K by 4, not 2): 256 KB of
        # ldmatrix a tile where 320 KB were (H100, 64 tokens, 256K list: 156 -> 145 us). At 16 and 32 heads
        # (M = 16 / 32) it is the same partition as before.
        if NACC == 1:
            T.gemm(q_s, kv_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc_s, s_s[:, 0:BI])
        else:
            T.clear(acc_s)
            T.clear(acc_b)
            if NACC == 4:
                T.clear(acc_c)
                T.clear(acc_d)
            for c in T.unroll(D // (QK_SLICE * NACC)):
                k0 = c * QK_SLICE * NACC
                T.gemm(q_s[:, k0:k0 + QK_SLICE], kv_s[:, k0:k0 + QK_SLICE], acc_s, transpose_B=True,
                       policy=T.GemmWarpPolicy.FullRow)
                T.gemm(q_s[:, k0 + QK_SLICE:k0 + 2 * QK_SLICE], kv_s[:, k0 + QK_SLICE:k0 + 2 * QK_SLICE], acc_b,
                       transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                if NACC == 4:
                    T.gemm(q_s[:, k0 + 2 * QK_SLICE:k0 + 3 * QK_SLICE], kv_s[:, k0 + 2 * QK_SLICE:k0 + 3 * QK_SLICE],
                           acc_c, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.gemm(q_s[:, k0 + 3 * QK_SLICE:k0 + 4 * QK_SLICE], kv_s[:, k0 + 3 * QK_SLICE:k0 + 4 * QK_SLICE],
                           acc_d, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            for h, j in T.Parallel(HB, BI):
                if NACC == 2:
                    s_s[h, j] = acc_s[h, j] + acc_b[h, j]
                else:
                    s_s[h, j] = (acc_s[h, j] + acc_b[h, j]) + (acc_c[h, j] + acc_d[h, j])

    @T.macro
    def row_softmax(s_s, valid_s, p_s, alpha_s, st, tx):
        # Thread tx owns row tx // TPR, columns (tx % TPR) * CPT ..; the TPR threads of a row are adjacent
        # lanes of one warp, so the row max is TPR-1 shuffles, not a block-wide reduction with barriers.
        # st = [running max, this thread's partial row sum]: the sum is reduced over the row's threads once,
        # at the end (every term of it was rescaled by the same alphas).
        r = tx // TPR
        c0 = (tx % TPR) * CPT
        vals = T.alloc_local([CPT], "float32")
        mx = T.alloc_local([2], "float32")   # tile max, then the row's reference (0 for an all-masked row)
        mx[0] = neg_inf
        for c in T.unroll(CPT):
            vals[c] = T.if_then_else(valid_s[c0 + c] >= 0, s_s[r, c0 + c] * scale2, neg_inf)
            mx[0] = T.max(mx[0], vals[c])
        for o in T.unroll(TPR_LOG):
            mx[0] = T.max(mx[0], T.shfl_xor(mx[0], 1 << o))
        mx[0] = T.max(mx[0], st[0])
        # an all-masked row keeps m = -inf; use 0 as its reference so exp2 gives 0, not NaN
        mx[1] = T.if_then_else(mx[0] == neg_inf, T.float32(0), mx[0])
        if tx % TPR == 0:
            alpha_s[r] = T.exp2(st[0] - mx[1])
        st[1] = st[1] * T.exp2(st[0] - mx[1])
        st[0] = mx[0]
        for c in T.unroll(CPT):
            vals[c] = T.exp2(vals[c] - mx[1])
            st[1] = st[1] + vals[c]
            p_s[r, c0 + c] = T.Cast("bfloat16", vals[c])

    @T.macro
    def attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx):
        # the tile in kv_s (and its validity) is in place: scores, softmax, O = alpha O + P V
        scores(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s)
        T.sync_threads()  # D: the scores in s_s
        row_softmax(s_s, valid_s, p_s, alpha_s, st, tx)
        T.sync_threads()  # E: p_s and alpha_s
        for h, d in T.Parallel(HB, D):
            acc_o[h, d] = acc_o[h, d] * alpha_s[h]
        T.gemm(p_s, kv_s, acc_o)

    @T.macro
    def fetch_slot(idx1, lens1, idx2, lens2, t, g, rng, tx, slot_r, k):
        # thread j < BI: the slot of row j of tile g of [list 1 tiles | list 2 tiles], -1 past a length.
        # Read one tile ahead of its use, so the index load's latency hides behind a whole tile's math
        # instead of standing between the barrier and the tile's gather.
        if tx < BI and g < rng[2]:
            if g < rng[0]:
                slot_r[k] = T.if_then_else(g * BI + tx < T.min(lens1[t], n1),
                                           idx1[t, T.max(T.min(g * BI + tx, n1 - 1), 0)], -1)
            else:
                slot_r[k] = T.if_then_else((g - rng[0]) * BI + tx < T.min(lens2[t], n2),
                                           idx2[t, T.max(T.min((g - rng[0]) * BI + tx, n2 - 1), 0)], -1)

    @T.macro
    def rows_fp8(slot_r, k, tx, pages, rows, st, pg_s, off_s, bs):
        # one thread per tile row: slot_r[k] -> (page, offset), -1 for a hole / past the length / outside the
        # cache; into stage st of the ring's page / offset buffers, or (st None) the register path's one row each
        if tx < BI:
            slot = slot_r[k]
            ok = (slot >= 0) and (slot < pages * bs) and (bs > 0) and (rows * 16 >= bs * (TOKEN_BYTES + SCALE_BYTES))
            if st is None:
                pg_s[tx] = T.if_then_else(ok, slot // T.max(bs, 1), -1)
                off_s[tx] = T.if_then_else(ok, slot % T.max(bs, 1), 0)
            else:
                pg_s[st, tx] = T.if_then_else(ok, slot // T.max(bs, 1), -1)
                off_s[st, tx] = T.if_then_else(ok, slot % T.max(bs, 1), 0)

    @T.macro
    def load_fp8(kvq, kvs, kvr, pg_s, off_s, nope_r, rope_r, e_r, bs):
        # issue every load of the tile into registers (consumed one tile later, so the gather's latency
        # overlaps the current tile's GEMMs); masked rows load zeros
        for j, c in T.Parallel(BI, NOPE):
            nope_r[j, c] = T.if_then_else(
                pg_s[j] >= 0, kvq[T.max(pg_s[j], 0), off_s[j] * (TOKEN_BYTES // 16) + c // 16, c % 16],
                T.Cast("float8_e4m3fn", 0))
        for j, c in T.Parallel(BI, ROPE):
            rope_r[j, c] = T.if_then_else(
                pg_s[j] >= 0, kvr[T.max(pg_s[j], 0), off_s[j] * (TOKEN_BYTES // 16) + NOPE // 16 + c // 8, c % 8],
                T.bfloat16(0))
        for j, g in T.Parallel(BI, 8):
            e_r[j, g] = T.if_then_else(
                pg_s[j] >= 0 and g < NG,
                kvs[T.max(pg_s[j], 0), (bs * TOKEN_BYTES + off_s[j] * SCALE_BYTES + g) // 16,
                    (bs * TOKEN_BYTES + off_s[j] * SCALE_BYTES + g) % 16], T.uint8(0))

    @T.macro
    def mark_valid(pg_s, valid_s):
        # the tile's row validity, kept for the softmax while pg_s moves on to the next tile
        for j in T.Parallel(BI):
            valid_s[j] = pg_s[j]

    @T.macro
    def scales_valid(e_r, pg_s, valid_s, sc_s):
        for j, g in T.Parallel(BI, 8):
            sc_s[j, g] = T.exp2(T.Cast("float32", e_r[j, g]) - T.float32(127))
        mark_valid(pg_s, valid_s)

    @T.macro
    def dequant_fp8(nope_r, rope_r, sc_s, kv_s):
        for j, c in T.Parallel(BI, NOPE):
            kv_s[j, c] = T.Cast("bfloat16", T.Cast("float32", nope_r[j, c]) * sc_s[j, c // GROUP])
        for j, c in T.Parallel(BI, ROPE):
            kv_s[j, NOPE + c] = rope_r[j, c]

    NCH = NOPE // 16          # 16-byte chunks of a row's NoPE bytes
    RCH = ROPE // 8           # 16-byte chunks of its RoPE (8 bf16 each)
    ROW16 = TOKEN_BYTES // 16

    @T.macro
    def fetch_slot_or_end(idx1, lens1, idx2, lens2, t, g, rng, tx, slot_r, k):
        # fetch_slot into slot_r[k], and -1 for a tile past the split's end (rows are computed that far ahead)
        if tx < BI:
            slot_r[k] = -1
        fetch_slot(idx1, lens1, idx2, lens2, t, g, rng, tx, slot_r, k)

    @T.macro
    def rows_at(slot_r, k, tx, g, rng, st, pg_s, off_s, bs1, bs2):
        # rows_fp8 from the cache of the list tile g belongs to
        if g < rng[0]:
            rows_fp8(slot_r, k, tx, P1, R1, st, pg_s, off_s, bs1)
        else:
            rows_fp8(slot_r, k, tx, P2, R2, st, pg_s, off_s, bs2)

    @T.macro
    def issue_fp8(kvq, kvs, kvr, bs, st, tx, pg_s, off_s, nope_s, rope_s, scr_s):
        # tile rows -> stage st by cp.async (no registers held: the next stages' bytes fly during this tile's
        # math); a masked row's copy is predicated off, which zero-fills its bytes
        for i in T.unroll((BI * NCH + threads - 1) // threads):
            k = i * threads + tx
            if k < BI * NCH:
                p = pg_s[st, k // NCH]
                T.ptx_cp_async(T.access_ptr(nope_s[st, k // NCH, (k % NCH) * 16], "w", 16),
                               T.access_ptr(kvq[T.max(p, 0), off_s[st, k // NCH] * ROW16 + k % NCH, 0], "r", 16),
                               16, predicate=p >= 0)
        for i in T.unroll((BI * RCH + threads - 1) // threads):
            k = i * threads + tx
            if k < BI * RCH:
                p = pg_s[st, k // RCH]
                T.ptx_cp_async(T.access_ptr(rope_s[st, k // RCH, (k % RCH) * 8], "w", 8),
                               T.access_ptr(kvr[T.max(p, 0), off_s[st, k // RCH] * ROW16 + NCH + k % RCH, 0], "r", 8),
                               8, predicate=p >= 0)
        if tx < BI:
            p = pg_s[st, tx]
            b = bs * TOKEN_BYTES + off_s[st, tx] * SCALE_BYTES
            T.ptx_cp_async(T.access_ptr(scr_s[st, tx, 0], "w", 8),
                           T.access_ptr(kvs[T.max(p, 0), b // 16, b % 16], "r", 8), 8, predicate=p >= 0)

    @T.macro
    def issue_at(g, rng, st, tx, kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, bs1, bs2, pg_s, off_s, nope_s, rope_s, scr_s):
        if g < rng[2]:
            if g < rng[0]:
                issue_fp8(kvq1, kvs1, kvr1, bs1, st, tx, pg_s, off_s, nope_s, rope_s, scr_s)
            else:
                issue_fp8(kvq2, kvs2, kvr2, bs2, st, tx, pg_s, off_s, nope_s, rope_s, scr_s)
        T.ptx_commit_group()  # always: wait_group counts groups, empty ones included

    NQ8 = NOPE // 8   # 8-byte groups of a row's NoPE bytes

    @T.macro
    def dequant_stage(nope_s, rope_s, scr_s, st, kv_s):
        # 8 e4m3 bytes -> 8 bf16 a thread by bit placement and two bf16x2 multiplies (DEQUANT8_SRC); kv_s's
        # swizzle moves 16-byte chunks, so the 8 values of kv_s[j, c0 .. c0 + 7] are one aligned 16-byte store
        for i in T.unroll((BI * NQ8 + threads - 1) // threads):
            k = i * threads + T.get_thread_binding()
            if k < BI * NQ8:
                T.call_extern("handle", "dsv4_dequant8", T.address_of(kv_s[k // NQ8, (k % NQ8) * 8]),
                              T.address_of(nope_s[st, k // NQ8, (k % NQ8) * 8]),
                              T.Cast("uint32", scr_s[st, k // NQ8, (k % NQ8) * 8 // GROUP]))
        for j, c in T.Parallel(BI, ROPE):
            kv_s[j, NOPE + c] = rope_s[st, j, c]

    @T.macro
    def rows_bf16(idx, lens, nidx, nrows, t, tile, pg_s):
        n = T.min(lens[t], nidx)
        for j in T.Parallel(BI):
            pos = tile * BI + j
            slot = T.if_then_else(pos < n, idx[t, T.min(pos, nidx - 1)], -1)
            pg_s[j] = T.if_then_else((slot >= 0) and (slot < nrows), slot, -1)

    @T.macro
    def load_bf16(kv, pg_s, raw_r):
        for j, c in T.Parallel(BI, D):
            raw_r[j, c] = T.if_then_else(pg_s[j] >= 0, kv[T.max(pg_s[j], 0), c], T.bfloat16(0))

    @T.macro
    def store_bf16(raw_r, kv_s):
        for j, c in T.Parallel(BI, D):
            kv_s[j, c] = raw_r[j, c]

    @T.macro
    def tile_range(lens1, lens2, t, split, rng):
        # rng = [tiles of list 1, first tile, end tile] of this split over the concatenated tile list
        t1 = T.ceildiv(T.max(T.min(lens1[t], n1), 0), BI)
        t2 = T.ceildiv(T.max(T.min(lens2[t], n2), 0), BI)
        per = T.ceildiv(t1 + t2, S)
        rng[0] = t1
        rng[1] = T.min(split * per, t1 + t2)
        rng[2] = T.min(split * per + per, t1 + t2)

    @T.macro
    def finish(acc_o, st, l_s, m_s, tx, sink, out, o_part, lse_part, t, hb, split):
        # the row's partial sums -> its sum; (sum, running max) to shared for the per-element threads below.
        # acc_o is relative to the max (0 if -inf).
        for o in T.unroll(TPR_LOG):
            st[1] = st[1] + T.shfl_xor(st[1], 1 << o)
        if tx % TPR == 0:
            l_s[tx // TPR] = st[1]
            m_s[tx // TPR] = st[0]
        T.sync_threads()
        if S == 1:
            for h, d in T.Parallel(HB, D):
                if hb * HB + h < H:
                    hh = T.min(hb * HB + h, H - 1)
                    ref = T.if_then_else(m_s[h] == neg_inf, T.float32(0), m_s[h])
                    out[t, hh, d] = T.Cast("bfloat16", acc_o[h, d] / (l_s[h] + T.exp2(sink[hh] * LOG2E - ref)))
        else:
            # a row with no candidate in this split writes only lse = -inf (the combine skips it)
            for h, d in T.Parallel(HB, D):
                if hb * HB + h < H and l_s[h] > 0:
                    o_part[split, t, T.min(hb * HB + h, H - 1), d] = acc_o[h, d] / l_s[h]
            for h in T.Parallel(HB):
                if hb * HB + h < H:
                    lse_part[split, t, T.min(hb * HB + h, H - 1)] = T.if_then_else(
                        l_s[h] > 0, m_s[h] + T.log2(l_s[h]), neg_inf)

    # `out` is written only when S == 1 and the partials only when S > 1; the op passes a 1-token dummy for
    # the side not written, so their token extents are symbols of their own.
    num_out, num_part = T.dynamic("num_out"), T.dynamic("num_part")
    out_shape = (num_out, H, D)
    part_shape = (S, num_part, H, D)
    lse_shape = (S, num_part, H)

    if fp8:
        @T.prim_func
        def sparse_mla_fwd(
            q: T.Tensor[(num_tokens, H, D), "bfloat16"],
            kvq1: T.Tensor[(P1, R1, 16), "float8_e4m3fn"],
            kvs1: T.Tensor[(P1, R1, 16), "uint8"],
            kvr1: T.Tensor[(P1, R1, 8), "bfloat16"],
            idx1: T.Tensor[(num_tokens, n1), "int32"],
            lens1: T.Tensor[(num_tokens,), "int32"],
            kvq2: T.Tensor[(P2, R2, 16), "float8_e4m3fn"],
            kvs2: T.Tensor[(P2, R2, 16), "uint8"],
            kvr2: T.Tensor[(P2, R2, 8), "bfloat16"],
            idx2: T.Tensor[(num_tokens, n2), "int32"],
            lens2: T.Tensor[(num_tokens,), "int32"],
            block_size1: T.int32,
            block_size2: T.int32,
            sink: T.Tensor[(H,), "float32"],
            out: T.Tensor[out_shape, "bfloat16"],
            o_part: T.Tensor[part_shape, "float32"],
            lse_part: T.Tensor[lse_shape, "float32"],
        ):
            if NST:
                with T.Kernel(num_tokens, NHB, S, threads=threads) as (t, hb, split):
                    T.import_source(DEQUANT8_SRC)
                    q_s = T.alloc_shared([HB, D], "bfloat16")
                    kv_s = T.alloc_shared([BI, D], "bfloat16")
                    p_s = T.alloc_shared([HB, BI], "bfloat16")
                    s_s = T.alloc_shared([HB, BI + SPAD], "float32")
                    alpha_s = T.alloc_shared([HB], "float32")
                    l_s = T.alloc_shared([HB], "float32")
                    m_s = T.alloc_shared([HB], "float32")
                    pg_s = T.alloc_shared([NST, BI], "int32")
                    off_s = T.alloc_shared([NST, BI], "int32")
                    valid_s = T.alloc_shared([BI], "int32")
                    nope_s = T.alloc_shared([NST, BI, NOPE], "float8_e4m3fn")
                    rope_s = T.alloc_shared([NST, BI, ROPE], "bfloat16")
                    scr_s = T.alloc_shared([NST, BI, 8], "uint8")
                    acc_s = T.alloc_fragment([HB, BI], "float32")
                    acc_b = T.alloc_fragment([HB, BI], "float32")
                    acc_c = T.alloc_fragment([HB, BI], "float32")
                    acc_d = T.alloc_fragment([HB, BI], "float32")
                    acc_o = T.alloc_fragment([HB, D], "float32")
                    st = T.alloc_local([2], "float32")
                    rng = T.alloc_local([3], "int32")
                    slot_r = T.alloc_local([NST + 1], "int32")  # [0]: the next tile's; all NST + 1 in the prologue
                    tx = T.get_thread_binding()

                    load_q_async(q, q_s, t, hb)
                    T.clear(acc_o)
                    st[0] = neg_inf
                    st[1] = T.float32(0)
                    tile_range(lens1, lens2, t, split, rng)
                    # Tiles rng[1] .. rng[2]-1 of [list 1 tiles | list 2 tiles] pass through NST cp.async stages. With
                    # NST >= 2, tile it + NST - 1 is issued before tile it is waited for (NST - 1 tiles' bytes in flight
                    # during its wait, dequantize and math); with one stage, tile it + 1 is issued once tile it is
                    # dequantized out of the stage (in flight during its math only, as the register path's loads).
                    # Rows (page, offset) are computed NST tiles ahead, slots one further.
                    # the first NST + 1 tiles' slots load together (one index latency, not NST + 1 in a row)
                    for s0 in T.unroll(NST + 1):
                        fetch_slot_or_end(idx1, lens1, idx2, lens2, t, rng[1] + s0, rng, tx, slot_r, s0)
                    for s0 in T.unroll(NST):
                        rows_at(slot_r, s0, tx, rng[1] + s0, rng, s0, pg_s, off_s, block_size1, block_size2)
                    slot_r[0] = slot_r[NST]
                    T.sync_threads()
                    for s0 in T.unroll(max(1, NST - 1)):
                        issue_at(rng[1] + s0, rng, s0, tx, kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, block_size1, block_size2,
                                 pg_s, off_s, nope_s, rope_s, scr_s)
                    # Barriers: B: tile it's bytes are in shared memory (every thread's copies), the previous PV is done
                    # with kv_s and p_s; C: kv_s dequantized, valid_s set; D, E inside attend_tile.
                    for it in T.serial(rng[2] - rng[1]):
                        if NST > 1:
                            issue_at(rng[1] + it + NST - 1, rng, (it + NST - 1) % NST, tx, kvq1, kvs1, kvr1, kvq2, kvs2,
                                     kvr2, block_size1, block_size2, pg_s, off_s, nope_s, rope_s, scr_s)
                        T.ptx_wait_group(NST - 1)
                        T.sync_threads()  # B
                        dequant_stage(nope_s, rope_s, scr_s, it % NST, kv_s)
                        # the same thread reads row tx's validity and then writes the row NST tiles ahead in its place
                        if tx < BI:
                            valid_s[tx] = pg_s[it % NST, tx]
                        rows_at(slot_r, 0, tx, rng[1] + it + NST, rng, it % NST, pg_s, off_s, block_size1, block_size2)
                        fetch_slot_or_end(idx1, lens1, idx2, lens2, t, rng[1] + it + NST + 1, rng, tx, slot_r, 0)
                        T.sync_threads()  # C
                        if NST == 1:
                            issue_at(rng[1] + it + 1, rng, 0, tx, kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, block_size1,
                                     block_size2, pg_s, off_s, nope_s, rope_s, scr_s)
                        attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx)
                    T.ptx_wait_group(0)  # no copy outlives the CTA (an empty split issued its prologue too)
                    finish(acc_o, st, l_s, m_s, tx, sink, out, o_part, lse_part, t, hb, split)
            else:
                with T.Kernel(num_tokens, NHB, S, threads=threads) as (t, hb, split):
                    q_s = T.alloc_shared([HB, D], "bfloat16")
                    kv_s = T.alloc_shared([BI, D], "bfloat16")
                    p_s = T.alloc_shared([HB, BI], "bfloat16")
                    s_s = T.alloc_shared([HB, BI + SPAD], "float32")
                    alpha_s = T.alloc_shared([HB], "float32")
                    l_s = T.alloc_shared([HB], "float32")
                    m_s = T.alloc_shared([HB], "float32")
                    pg_s = T.alloc_shared([BI], "int32")
                    off_s = T.alloc_shared([BI], "int32")
                    valid_s = T.alloc_shared([BI], "int32")
                    sc_s = T.alloc_shared([BI, 8], "float32")
                    nope_r = T.alloc_fragment([BI, NOPE], "float8_e4m3fn")
                    rope_r = T.alloc_fragment([BI, ROPE], "bfloat16")
                    e_r = T.alloc_fragment([BI, 8], "uint8")
                    acc_s = T.alloc_fragment([HB, BI], "float32")
                    acc_b = T.alloc_fragment([HB, BI], "float32")
                    acc_c = T.alloc_fragment([HB, BI], "float32")
                    acc_d = T.alloc_fragment([HB, BI], "float32")
                    acc_o = T.alloc_fragment([HB, D], "float32")
                    st = T.alloc_local([2], "float32")
                    rng = T.alloc_local([3], "int32")
                    slot_r = T.alloc_local([1], "int32")
                    tx = T.get_thread_binding()

                    load_q(q, q_s, t, hb)
                    T.clear(acc_o)
                    st[0] = neg_inf
                    st[1] = T.float32(0)
                    tile_range(lens1, lens2, t, split, rng)
                    fetch_slot(idx1, lens1, idx2, lens2, t, rng[1], rng, tx, slot_r, 0)
                    # Tiles rng[1] .. rng[2]-1 of [list 1 tiles | list 2 tiles]; tile k+1's bytes load into registers
                    # during tile k's math, and tile k+2's slots with them. Every barrier is placed here (the pass
                    # that adds them sees all shared buffers as one and put seven inside the dequantize loop):
                    # B: sc_s / valid_s written; the previous PV is done with kv_s and p_s
                    # C: kv_s dequantized; pg_s / off_s of the next tile written
                    # D: the scores in s_s        E: p_s and alpha_s
                    for it in T.serial(rng[2] - rng[1] + 1):
                        if it > 0:
                            scales_valid(e_r, pg_s, valid_s, sc_s)
                        T.sync_threads()  # B
                        if it > 0:
                            dequant_fp8(nope_r, rope_r, sc_s, kv_s)
                        if rng[1] + it < rng[2]:
                            rows_at(slot_r, 0, tx, rng[1] + it, rng, None, pg_s, off_s, block_size1, block_size2)
                            fetch_slot(idx1, lens1, idx2, lens2, t, rng[1] + it + 1, rng, tx, slot_r, 0)
                        T.sync_threads()  # C
                        if rng[1] + it < rng[2]:
                            if rng[1] + it < rng[0]:
                                load_fp8(kvq1, kvs1, kvr1, pg_s, off_s, nope_r, rope_r, e_r, block_size1)
                            else:
                                load_fp8(kvq2, kvs2, kvr2, pg_s, off_s, nope_r, rope_r, e_r, block_size2)
                        if it > 0:
                            attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx)
                    finish(acc_o, st, l_s, m_s, tx, sink, out, o_part, lse_part, t, hb, split)

        return sparse_mla_fwd

    @T.prim_func
    def sparse_mla_fwd_bf16(
        q: T.Tensor[(num_tokens, H, D), "bfloat16"],
        kv1: T.Tensor[(N1, D), "bfloat16"],
        idx1: T.Tensor[(num_tokens, n1), "int32"],
        lens1: T.Tensor[(num_tokens,), "int32"],
        kv2: T.Tensor[(N2, D), "bfloat16"],
        idx2: T.Tensor[(num_tokens, n2), "int32"],
        lens2: T.Tensor[(num_tokens,), "int32"],
        sink: T.Tensor[(H,), "float32"],
        out: T.Tensor[out_shape, "bfloat16"],
        o_part: T.Tensor[part_shape, "float32"],
        lse_part: T.Tensor[lse_shape, "float32"],
    ):
        with T.Kernel(num_tokens, NHB, S, threads=threads) as (t, hb, split):
            q_s = T.alloc_shared([HB, D], "bfloat16")
            kv_s = T.alloc_shared([BI, D], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            s_s = T.alloc_shared([HB, BI + SPAD], "float32")
            alpha_s = T.alloc_shared([HB], "float32")
            l_s = T.alloc_shared([HB], "float32")
            m_s = T.alloc_shared([HB], "float32")
            pg_s = T.alloc_shared([BI], "int32")
            valid_s = T.alloc_shared([BI], "int32")
            raw_r = T.alloc_fragment([BI, D], "bfloat16")
            acc_s = T.alloc_fragment([HB, BI], "float32")
            acc_b = T.alloc_fragment([HB, BI], "float32")
            acc_c = T.alloc_fragment([HB, BI], "float32")
            acc_d = T.alloc_fragment([HB, BI], "float32")
            acc_o = T.alloc_fragment([HB, D], "float32")
            st = T.alloc_local([2], "float32")
            rng = T.alloc_local([3], "int32")
            tx = T.get_thread_binding()

            load_q(q, q_s, t, hb)
            T.clear(acc_o)
            st[0] = neg_inf
            st[1] = T.float32(0)
            tile_range(lens1, lens2, t, split, rng)
            # the fp8 kernel's loop and barriers, with bf16 rows copied as they are
            for it in T.serial(rng[2] - rng[1] + 1):
                if it > 0:
                    mark_valid(pg_s, valid_s)
                T.sync_threads()  # B
                if it > 0:
                    store_bf16(raw_r, kv_s)
                if rng[1] + it < rng[2]:
                    if rng[1] + it < rng[0]:
                        rows_bf16(idx1, lens1, n1, N1, t, rng[1] + it, pg_s)
                    else:
                        rows_bf16(idx2, lens2, n2, N2, t, rng[1] + it - rng[0], pg_s)
                T.sync_threads()  # C
                if rng[1] + it < rng[2]:
                    if rng[1] + it < rng[0]:
                        load_bf16(kv1, pg_s, raw_r)
                    else:
                        load_bf16(kv2, pg_s, raw_r)
                if it > 0:
                    attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx)
            finish(acc_o, st, l_s, m_s, tx, sink, out, o_part, lse_part, t, hb, split)

    return sparse_mla_fwd_bf16


def build_combine(heads: int, n_splits: int, head_block: int, threads: int):
    """out[t, h] = sum_s 2^lse_s o_s / (sum_s 2^lse_s + e^sink[h]), in log2 units against the max.
    A split with no candidate (lse = -inf) wrote no partial O and is not read: with 64 splits of a short list
    most are empty. Programmatic dependent launch (this kernel launched behind the forward one, which triggers
    past its tile loop) was tried and not kept: 0.5-1.2 us faster at one token, but the SM120 schedule's 16-head
    CTAs at 64 tokens went 106.7 -> 126.9 us on the 256K list (H100, 2026-11-24)."""
    import tilelang.language as T

    H, S, HC = heads, n_splits, head_block
    TPH = threads // HC          # threads per head
    VD = D // TPH                # dims per thread (contiguous: one 16-byte load per split at 128 threads)
    CH = min(S, 16)              # splits loaded at once
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def sparse_mla_combine(
        o_part: T.Tensor[(S, num_tokens, H, D), "float32"],
        lse_part: T.Tensor[(S, num_tokens, H), "float32"],
        sink: T.Tensor[(H,), "float32"],
        out: T.Tensor[(num_tokens, H, D), "bfloat16"],
    ):
        with T.Kernel(num_tokens, T.ceildiv(H, HC), threads=threads) as (t, hc):
            tx = T.get_thread_binding()
            h = hc * HC + tx // TPH
            hh = T.min(h, H - 1)
            d0 = (tx % TPH) * VD
            w = T.alloc_local([S], "float32")
            st = T.alloc_local([2], "float32")   # running max, then the denominator
            acc = T.alloc_local([VD], "float32")
            part = T.alloc_local([CH * VD], "float32")
            ob = T.alloc_local([VD], "bfloat16")
            st[0] = sink[hh] * LOG2E
            for s in T.unroll(S):
                st[0] = T.max(st[0], lse_part[s, t, hh])
            st[1] = T.exp2(sink[hh] * LOG2E - st[0])
            for s in T.unroll(S):
                w[s] = T.exp2(lse_part[s, t, hh] - st[0])
                st[1] = st[1] + w[s]
            for v in T.unroll(VD):
                acc[v] = T.float32(0)
            # CH splits' loads are issued before any is used (predicated off for empty splits): loads inside
            # a branch per split ran one DRAM round trip after another (14 us for 64 splits, ncu, H100)
            for c in T.unroll(S // CH):
                for s in T.unroll(CH):
                    for v in T.vectorized(VD):
                        part[s * VD + v] = T.if_then_else(w[c * CH + s] > 0, o_part[c * CH + s, t, hh, d0 + v],
                                                          T.float32(0))
                for s in T.unroll(CH):
                    for v in T.unroll(VD):
                        acc[v] = acc[v] + w[c * CH + s] * part[s * VD + v]
            for v in T.unroll(VD):
                ob[v] = T.Cast("bfloat16", acc[v] / st[1])
            if h < H:
                for v in T.vectorized(VD):
                    out[t, hh, d0 + v] = ob[v]

    return sparse_mla_combine


def combine_params(heads: int, n_splits: int) -> dict[str, Any]:
    """The combine variant for `n_splits` partials (select's, and the schedule sweep's). One head per CTA
    (tokens x heads CTAs): four heads per CTA left a one-token step's partials to 4 SMs (14 us for 16 splits x 16
    heads, ncu, H100)."""
    return {"heads": heads, "n_splits": n_splits, "head_block": 1, "threads": 128}


def _static_heads_scale(name: str, static: Mapping[str, Any]) -> tuple[int, float, str]:
    heads = _int_static(name, static, "heads", 1, 256)
    scale = static.get("softmax_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < float(scale) < 1:
        raise ValueError(f"{name}: softmax_scale must be a float in (0, 1), got {scale!r}")
    fmt = static.get("kv_format", "fp8_ds_mla")
    if fmt not in KV_FORMATS:
        raise ValueError(f"{name}: kv_format must be one of {KV_FORMATS}, got {fmt!r}")
    if static.get("head_dim", D) != D or static.get("rope_dim", ROPE) != ROPE:
        raise ValueError(f"{name}: head_dim/rope_dim must be {D}/{ROPE} (DeepSeek V4), got "
                         f"{static.get('head_dim')}/{static.get('rope_dim')}")
    return heads, float(scale), fmt


def attention_statics(model, parallel, kv_format: str) -> dict[str, Any]:
    heads = model.num_attention_heads // parallel.tp_size
    if heads < 1 or model.num_attention_heads % parallel.tp_size:
        raise ValueError(f"attention: {model.num_attention_heads} heads do not split over TP {parallel.tp_size}")
    return {"heads": heads, "head_dim": int(model.head_dim), "rope_dim": int(model.qk_rope_head_dim),
            "softmax_scale": float(model.head_dim ** -0.5), "kv_format": kv_format}


@register
class SparseMlaSpec(KernelSpec):
    name = "sparse_mla_fwd"

    def static_params(self, model, parallel) -> dict[str, Any]:
        return attention_statics(model, parallel, "fp8_ds_mla")

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        heads, scale, fmt = _static_heads_scale(self.name, static)
        hb = head_block(heads, arch)
        nhb = math.ceil(heads / hb)
        # 8 warps hide the gather's latency; a 16-row head block splits over 4 (mma.sync needs 16 rows x 8
        # columns per warp, and the 32-wide score tile has only 4 such column blocks)
        threads = 128 if hb == 16 else 256
        # T.gemm lowers to WGMMA where the GPU has it and a CTA's head block fills a warp group's 64 rows
        wgmma_cta = arch.has_wgmma and hb >= 64
        # the split count as the ring would run with 32-candidate tiles; where registers take over, their
        # footprint holds at least as many CTAs an SM (the count stands), and a 64-candidate tile is chosen
        # only where one CTA an SM runs either way (64 heads on Hopper)
        ring = 1 if fmt == "fp8_ds_mla" else 0
        per_sm = ctas_per_sm(arch, smem_bytes_for(hb, 32, ring), threads)
        n_splits = num_splits(num_tokens, nhb, arch.num_sms_hint, per_sm)
        stages = kv_stages(hb, 32, arch, n_splits) if fmt == "fp8_ds_mla" else 0
        bi = kv_tile(wgmma_cta, n_splits, stages > 0)
        params = {"heads": heads, "head_block": hb, "block_i": bi, "threads": threads, "kv_format": fmt,
                  "n_splits": n_splits, "softmax_scale": scale}
        if stages:
            params["stages"] = stages
        if wgmma_cta:
            params["score_chains"] = 1
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        return build_sparse_mla(**variant.p)

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        return smem_bytes_for(p["head_block"], p["block_i"], p.get("stages", 0))

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)


@register
class SparseMlaCombineSpec(KernelSpec):
    name = "sparse_mla_combine"

    def static_params(self, model, parallel) -> dict[str, Any]:
        return attention_statics(model, parallel, "fp8_ds_mla")

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        """The combine matching SparseMlaSpec.select at the same token count (n_splits > 1 only)."""
        fwd = SparseMlaSpec().select(arch, static, num_tokens)
        # Where the forward kernel does not split, no combine runs; select still names the 2-split combine
        # (compiled anyway for the token counts that split) so the planner's enumeration stays total.
        s = max(2, fwd.p["n_splits"])
        params = combine_params(fwd.p["heads"], s)
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        return build_combine(**variant.p)

    def smem_bytes(self, variant: Variant) -> int:
        return 0

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)
