"""What the sparse MLA kernels share: the cache layout's constants, the shared-memory formula, the pass configs
and the per-tile math (scores, the row softmax, the P.V product, the split's epilogue), as TileLang macros that
decode.py (fp8_ds_mla paged cache) and prefill.py (gathered bf16 rows) instantiate.

Math (per query token t, head h; one KV head, K = V = the 512-d latent incl. its 64 RoPE dims):
  s_j   = q[t, h] . kv_j * softmax_scale                      over the candidates j of token t
  out   = sum_j e^{s_j} kv_j / (sum_j e^{s_j} + e^{sink[h]})  (the sink only enlarges the denominator)
Candidates come from two lists per token (the SWA window, and the compressed-cache positions the indexer
picked or every ratio-128 block), each with its own cache, index list [T, N] (-1 = hole) and length [T].
A token with no valid candidate gets out = 0 (softmax over the sink alone).

One CTA = (query token, block of HB heads, split). Q [HB, 512] and one KV tile [BI, 512] live in shared
memory (bf16), O in registers (mma.sync or WGMMA through T.gemm). The scores go through shared memory (fp32) to a
row-per-thread-group softmax: the TPR = threads / HB threads of a head row are adjacent lanes, so the row max is
a few shuffles; the row sum stays per thread and is reduced once at the end. With n_splits > 1 each split takes
an even share of the token's tiles (computed from its real lengths at run time, so short requests do no work
past their length) and writes O normalised within the split (bf16) and its log2-sum-exp (a split with no candidate
writes only lse = -inf); the combine kernel (combine.py) merges splits and applies the sink. With n_splits == 1
the kernel writes `out` itself.

Shared memory, per CTA:  2*512*(HB + BI)  Q and KV tiles (bf16)
                       + 2*HB*BI          P (bf16, the second GEMM's A operand)
                       + 4*HB*(BI + 4)    the scores (fp32, rows padded)
                       + 4*HB*3           per-row rescale, sum and max
  plus the gather's buffers (smem_bytes_for; decode.py and prefill.py say what they hold).

Every barrier is explicit, four per tile, five where the scores run in two halves of the threads (decode.py's ring
kernel; TileLang's automatic ones put a block-wide barrier in each step of the dequantize loop and one per
reduction).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from types import SimpleNamespace
from typing import Any

from dsv4_jit.arch import get_profile
from dsv4_jit.spec import Variant

D = 512            # q / kv head dim (latent)
NOPE = 448         # fp8 dims
ROPE = 64          # bf16 dims
GROUP = 64         # NoPE dims per UE8M0 scale
TOKEN_BYTES = 576  # NoPE fp8 + RoPE bf16, per token, at the start of a page
SCALE_BYTES = 8    # 7 scales + 1 pad, per token, after the page's token data
KV_FORMATS = ("fp8_ds_mla", "bf16")
LOG2E = 1.4426950408889634
SPAD = 4           # fp32 pad per score row in shared memory (spreads the fragment stores over banks)


def pass_configs_for(variant: Variant) -> dict[str, Any]:
    # 128-bit vectors only: TileLang emits 256-bit loads for sm_100+/sm_120 that an SM120 schedule proven
    # on an sm_90a GPU would never exercise. WGMMA where the schedule's GPU has it (Hopper), for the GEMMs whose
    # M is a warp group's 64 heads; T.gemm keeps mma.sync at 16 / 32 heads a CTA. TileLang fences the async proxy
    # (fence.proxy.async) between the threads' stores of kv_s / p_s and the wgmma that reads them.
    profile = get_profile(variant.schedule)
    cfg = dict(profile.pass_configs)
    cfg["tl.disable_vectorize_256"] = True
    cfg["tl.disable_wgmma"] = not profile.has_wgmma
    # every barrier is explicit (see the loops): TileLang's pass sees all shared buffers as one allocation and
    # put a barrier in each iteration of the dequantize loop
    cfg["tl.disable_thread_storage_sync"] = True
    # every global index is in range by construction (slots checked against the cache, rows clamped), so
    # TileLang's per-access bounds guards (predicates on every cp.async) are dead code
    cfg["tl.disable_safe_memory_legalize"] = True
    # T.gemm's k loop (32 steps of ldmatrix + mma for the scores) is emitted rolled: each step then waits on
    # its own ldmatrix. Unrolled, ptxas issues the next step's loads early.
    cfg["tl.UnrollLoop"] = {"auto_max_step": 4096, "auto_max_extent": 64, "explicit_unroll": False}
    return cfg


def smem_bytes_for(hb: int, bi: int, stages: int = 0) -> int:
    """Q and KV tiles, P, the fp32 scores (padded rows), per-row alpha / sum / max; then per KV row: with the
    fp8 cp.async ring (stages > 0) each stage's NoPE, RoPE and scale bytes and page and offset, and the
    validity of the tile in kv_s; through registers page, offset, validity and 8 fp32 scales (bf16 uses two
    of the four words)."""
    common = 2 * D * (hb + bi) + 2 * hb * bi + 4 * hb * (bi + SPAD) + 4 * hb * 3
    if stages:
        return common + stages * bi * (NOPE + 2 * ROPE + SCALE_BYTES + 8) + 4 * bi
    return common + 4 * bi * (3 + 8)


def list_tiles(T, lens1, lens2, t, n1, n2, block_i: int):
    """Token t's tiles of `block_i` candidates in each of its two lists (lengths clamped to [0, the list's width]):
    what tile_range splits over a variant's splits, and what the combine counts its live splits from."""
    return (T.ceildiv(T.max(T.min(lens1[t], n1), 0), block_i),
            T.ceildiv(T.max(T.min(lens2[t], n2), 0), block_i))


def split_share(T, tiles, n_splits: int):
    """Tiles each split takes of a token's `tiles` (an even share; the last live split's may be short): how
    tile_range splits them, and what the combine counts the live splits from."""
    return T.ceildiv(tiles, n_splits)


def tile_macros(T, *, heads: int, head_block: int, block_i: int, threads: int, n_splits: int, softmax_scale: float,
                score_chains: int, n1, n2, stamp=None, score_halves: bool = False) -> SimpleNamespace:
    """The per-tile macros both kernels run, for one variant; n1 / n2 are the index lists' width symbols. stamp: a
    traced build's stamp macro (trace.py), which attend_tile calls at its scores, softmax and end."""
    from .trace import stamp_after, stamp_macro
    if stamp is None:
        stamp = stamp_macro(T, False)
    H, HB, BI, S = heads, head_block, block_i, n_splits
    if threads % HB or not 1 <= threads // HB <= 32 or BI % (threads // HB) or threads & (threads - 1):
        raise ValueError(f"sparse_mla: {threads} threads cannot share {HB} head rows of {BI} scores evenly "
                         f"(threads / head_block must be a power of two <= 32 dividing block_i)")
    pad_heads = H % HB != 0
    scale2 = softmax_scale * LOG2E
    neg_inf = -T.infinity("float32")

    # Score accumulators. mma.sync: 2 or 4 chains (registers: 255 a thread at HB = 64 already). WGMMA
    # (score_chains = 1): one async batch over all 512 dims and one wait (as chains, each 64-dim slice was a batch
    # with a wait of its own).
    if score_chains not in (0, 1, 2, 4):
        raise ValueError(f"sparse_mla: score_chains must be 1, 2 or 4 (0: by head block), got {score_chains}")
    NACC = score_chains or (2 if HB >= 64 else 4)
    QK_SLICE = 64
    TPR = threads // HB          # threads per head row in the softmax
    CPT = BI // TPR              # score columns per thread
    TPR_LOG = TPR.bit_length() - 1

    @T.macro
    def load_q(q, q_s, t, hb):
        if pad_heads:
            for h, d in T.Parallel(HB, D):
                q_s[h, d] = T.if_then_else(hb * HB + h < H, q[t, T.min(hb * HB + h, H - 1), d], T.bfloat16(0))
        else:
            T.copy(q[t, hb * HB:(hb + 1) * HB, :], q_s)

    HT = threads // 2   # the threads of a half (score_halves)

    @T.macro
    def half_chains(q_s, kv_s, acc_a, acc_b, lo):
        # Q K^T over dims lo .. lo + 255 into two chains taking alternate 64-dim slices
        T.clear(acc_a)
        T.clear(acc_b)
        for c in T.unroll(D // (4 * QK_SLICE)):
            k0 = lo + c * 2 * QK_SLICE
            T.gemm(q_s[:, k0:k0 + QK_SLICE], kv_s[:, k0:k0 + QK_SLICE], acc_a, transpose_B=True,
                   policy=T.GemmWarpPolicy.FullRow)
            T.gemm(q_s[:, k0 + QK_SLICE:k0 + 2 * QK_SLICE], kv_s[:, k0 + QK_SLICE:k0 + 2 * QK_SLICE], acc_b,
                   transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def scores_halves(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s):
        # S = Q K^T with the two halves of the threads each over half of the 512 dims (two chains each): a warp reads
        # Q's and the tile's rows only over its half, so shared memory serves 2/3 of the ldmatrix bytes (a 32 x 32
        # tile over 8 warps: 128 KB, not 192; all 8 warps over all 512 dims read Q 4 times and the tile twice). The
        # second half adds its sum to the first's in s_s after a barrier. H200, per layer, against all warps over all
        # dims (trace_attention.py --set, one call): the SM120 schedule at 64 heads x 64 tokens 62.2 -> 57.5 us
        # (64K) and 187.6 -> 167.3 (256K), x 8 tokens 16.8 -> 16.2 and 34.3 -> 32.5; one token 9.65 -> 9.5 on both
        # schedules; 16 heads x 64 tokens 25.8 -> 25.2 (sm_90a), 34.8 -> 34.4 (SM120); 16 heads x 8 level.
        tx = T.get_thread_binding()
        if tx < HT:
            half_chains(q_s, kv_s, acc_s, acc_b, 0)
            for h, j in T.Parallel(HB, BI):
                s_s[h, j] = acc_s[h, j] + acc_b[h, j]
        else:
            half_chains(q_s, kv_s, acc_c, acc_d, D // 2)
        T.sync_threads()
        if tx >= HT:
            for h, j in T.Parallel(HB, BI):
                s_s[h, j] = s_s[h, j] + (acc_c[h, j] + acc_d[h, j])

    @T.macro
    def scores(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s):
        # S = Q K^T over 512 dims. A warp holds only 1-2 mma tiles of S, so one accumulator is a chain of 32
        # dependent mma (the top stall). NACC accumulators take alternate 64-dim slices, so the chains
        # interleave; they are summed into s_s. FullRow: at 64 heads the 8 warps tile S 4 x 2 (16 x 16 each), not
        # 2 x 4 (32 x 8), so Q is read from shared memory by 2 warps, not 4 (less ldmatrix traffic a tile).
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
    def attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx,
                    trace=None, t=0, hb=0, split=0, k0=-1):
        # the tile in kv_s (and its validity) is in place: scores, softmax, O = alpha O + P V. A traced build
        # stamps points k0 (scores), k0 + 1 (softmax) and k0 + 2 (P.V issued) where k0 >= 0.
        if score_halves:
            scores_halves(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s)
        else:
            scores(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s)
        T.sync_threads()  # D: the scores in s_s
        stamp(trace, t, hb, split, k0, 0, 0)
        row_softmax(s_s, valid_s, p_s, alpha_s, st, tx)
        T.sync_threads()  # E: p_s and alpha_s
        stamp(trace, t, hb, split, stamp_after(T, k0, 1), 0, 0)
        for h, d in T.Parallel(HB, D):
            acc_o[h, d] = acc_o[h, d] * alpha_s[h]
        T.gemm(p_s, kv_s, acc_o)
        stamp(trace, t, hb, split, stamp_after(T, k0, 2), 0, 0)   # thread 0's P.V issued

    @T.macro
    def mark_valid(pg_s, valid_s):
        # the tile's row validity, kept for the softmax while pg_s moves on to the next tile
        for j in T.Parallel(BI):
            valid_s[j] = pg_s[j]

    @T.macro
    def tile_range(lens1, lens2, t, split, rng):
        # rng = [tiles of list 1, first tile, end tile] of this split over the concatenated tile list, then the two
        # lengths clamped to [0, the list's width] (list_tiles' clamp)
        rng[3] = T.max(T.min(lens1[t], n1), 0)
        rng[4] = T.max(T.min(lens2[t], n2), 0)
        t1, t2 = T.ceildiv(rng[3], BI), T.ceildiv(rng[4], BI)
        per = split_share(T, t1 + t2, S)
        rng[0] = t1
        rng[1] = T.min(split * per, t1 + t2)
        rng[2] = T.min(split * per + per, t1 + t2)

    @T.macro
    def finish(acc_o, st, l_s, m_s, alpha_s, tx, sink, out, o_part, lse_part, t, hb, split, q_s, trace=None,
               k0=-1):
        # the row's partial sums -> its sum; (sum, running max) to shared for the per-element threads below.
        # acc_o is relative to the max (0 if -inf). A traced build stamps k0 (row statistics in shared memory) and
        # k0 + 1 (O staged in q_s) where k0 >= 0.
        # the kernel behind this one may launch now (PDL; the combine, or with one split the next layer's): its CTAs
        # wait in pdl_sync for this grid's writes, and its launch overlaps this epilogue instead of following it
        T.pdl_trigger()
        for o in T.unroll(TPR_LOG):
            st[1] = st[1] + T.shfl_xor(st[1], 1 << o)
        T.sync_threads()  # every thread's last rescale has read alpha_s
        if tx % TPR == 0:
            l_s[tx // TPR] = st[1]
            m_s[tx // TPR] = st[0]
            alpha_s[tx // TPR] = T.float32(1) / T.max(st[1], T.float32(1e-30))
        T.sync_threads()
        stamp(trace, t, hb, split, k0, 0, 0)
        # O leaves through q_s (no tile reads Q any more), in bf16: the fragment's scattered 4-byte stores to
        # global memory took longer than the tile's math at one tile a CTA; rows of 16-byte stores do not.
        if S == 1:
            for h, d in T.Parallel(HB, D):
                hh = T.min(hb * HB + h, H - 1)
                ref = T.if_then_else(m_s[h] == neg_inf, T.float32(0), m_s[h])
                # a row with no candidate is 0 (softmax over the sink alone), also where e^sink underflows
                q_s[h, d] = T.Cast("bfloat16", T.if_then_else(
                    l_s[h] > 0, acc_o[h, d] / (l_s[h] + T.exp2(sink[hh] * LOG2E - ref)), T.float32(0)))
            T.sync_threads()
            stamp(trace, t, hb, split, stamp_after(T, k0, 1), 0, 0)
            for h, d in T.Parallel(HB, D):
                if hb * HB + h < H:
                    out[t, T.min(hb * HB + h, H - 1), d] = q_s[h, d]
        else:
            # O normalised within the split (bf16); a row with no candidate in this split writes only
            # lse = -inf (the combine skips it)
            for h, d in T.Parallel(HB, D):
                q_s[h, d] = T.Cast("bfloat16", acc_o[h, d] * alpha_s[h])
            T.sync_threads()
            stamp(trace, t, hb, split, stamp_after(T, k0, 1), 0, 0)
            for h, d in T.Parallel(HB, D):
                if hb * HB + h < H and l_s[h] > 0:
                    o_part[split, t, T.min(hb * HB + h, H - 1), d] = q_s[h, d]
            for h in T.Parallel(HB):
                if hb * HB + h < H:
                    lse_part[split, t, T.min(hb * HB + h, H - 1)] = T.if_then_else(
                        l_s[h] > 0, m_s[h] + T.log2(l_s[h]), neg_inf)

    # `out` is written only when S == 1 and the partials only when S > 1; the op passes a 1-token dummy for
    # the side not written, so their token extents are symbols of their own.
    num_out, num_part = T.dynamic("num_out"), T.dynamic("num_part")
    return SimpleNamespace(load_q=load_q, attend_tile=attend_tile, mark_valid=mark_valid, tile_range=tile_range,
                           finish=finish, neg_inf=neg_inf, pad_heads=pad_heads, out_shape=(num_out, H, D),
                           part_shape=(S, num_part, H, D), lse_shape=(S, num_part, H))
