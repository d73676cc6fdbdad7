"""Sparse MLA decode over the fp8_ds_mla paged cache, warp-specialized (Hopper only: WGMMA and setmaxnreg).

decode.py's kernel runs every phase of a tile (gather, dequantize, scores, softmax, P.V) on all 8 warps between
block-wide barriers, one CTA an SM, so each phase waits on the one before. Here three warp groups of one CTA
(64 heads, 64-candidate tiles) work on different tiles at once and hand them over through mbarriers:

  WG0 (scores):   S = Q K^T (WGMMA, 64 heads x 64 candidates x 512), mask, online softmax, P and the rescale
                  factors to shared memory, O[:, 0:256] = alpha O + P V[:, 0:256]          (224 registers)
  WG1 (right PV): O[:, 256:512] = alpha O + P V[:, 256:512] once WG0 published P             (160 registers)
  WG2 (gather):   a tile's fp8 bytes into registers, then (once its buffer is free) dequantized into the bf16
                  KV buffer, a pass of 32 rows at a time, each pass's registers taking the next tile's pass as
                  soon as they are stored; two buffers, so tile k+1 is gathered while tile k is multiplied
                  (120 registers)

Barriers a buffer b (tile it uses b = it % 2, phase (it // 2) % 2): kv_ready (gather -> WG0), p_ready (WG0 -> WG1:
P and the rescale factors written), kv_free (WG0 and WG1 done with the KV buffer -> gather), p_free (WG1 done with
P -> WG0). The gather and WG0 stores are fenced (fence.proxy.async) before the arrive, as WGMMA reads them.

Shared memory: Q (64 KB; the output's staging at the end), two KV buffers (2 x 64 KB), two P buffers and rescale
vectors, two validity vectors, the row sum and max (in a cluster the peer's too), 8 mbarriers: 214,592 B, 215,104 in
a cluster (SM12x has neither WGMMA nor setmaxnreg, nor the room). Q and each KV buffer are split in column halves
(0:256, 256:512), the halves the two P.V products read.
Only the GEMMs and the stores into their operands branch on b (each buffer its own allocation, named statically);
the rest of each role's code exists once, which keeps the kernel in the instruction cache (a copy of the whole tile
a buffer made 8,744 SASS instructions, and a quarter of the samples waited on instruction fetch).

The gather: 4 threads a row, thread q taking 16-byte chunks 4j + q (j < 7: NoPE, scale group j; j = 7, 8: RoPE),
32 rows a pass, two passes a tile; a warp's load covers 64 contiguous bytes of each of 8 rows (2 threads a row,
each with a half row, was 54 us against the ring kernel's 40.5 at 64 heads x 64 tokens x 64K: 4 times the memory
requests). Software-pipelined by pass: tile k's bytes were issued during tile k - 1, and once a pass of tile k is
dequantized its registers take the same pass of tile k + 1, whose loads then fly while the other pass is
dequantized and the next buffer is waited for; the index loads run a tile further ahead. Against the whole tile
issued at once after the last one was stored (the same registers, one tile's bytes in flight only between
dequantizes), per layer on an H100, outputs bit-identical: 64 heads x 64 tokens 64K 34.9 -> 32.7 us, 256K
84.9 -> 79.3, 8K 21.8 -> 21.3; 32 tokens 24.9 -> 23.9; 24 tokens at 256K 48.1 -> 44.7; 128 heads x 64 tokens
47.7 -> 45.2. A masked row (hole, past the length, outside the cache) loads nothing and stores zeros, validity -1.

Two splits (`cluster`): a token's two splits are one thread block cluster and merge in the launch, with no partials
and no sparse_mla_combine behind it. Past their tiles, split 1's WG0 stages its left half of O (normalised, bf16) in
its Q buffer and split 0's WG1 its right half; after a cluster barrier (both CTAs past their tiles, so both Q
buffers free) each copies its staged half into the same place of the peer's shared memory and sends its row sums
and maxima (mapa + st.shared::cluster), and after a second barrier split 0's WG0 merges the left half and split 1's
WG1 the right half, each with its own fp32 O and the sink, straight into `out`. The gather warp group takes part
in both barriers. Per layer on an H100 against the same kernel writing partials for the combine, alternated in one
call: 64 heads x 64 tokens 64K 32.5 -> 30.5 us, 256K 78.5 -> 75.4, 8K 21.2 -> 19.3; 48 tokens 30.8 -> 29.1;
128 heads x 24 tokens 29.6 -> 28.0 (and the per-token error 2.5e-3 -> 2.1e-3: each half's own O stays fp32).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from .common import D, LOG2E, NOPE, ROPE, SCALE_BYTES, TOKEN_BYTES, split_share
from .decode import DEQUANT8_SRC, slot_macros
from .trace import TRACE_SRC, stamp_macro

WS_HEAD_BLOCK = 64
WS_BLOCK_I = 64
WS_THREADS = 384
# setmaxnreg per warp group: scores + softmax + left O (128 accumulators + 32 scores), right O (128), gather
# (up to 76 loaded registers). setmaxnreg.inc takes only what the decs gave back: at most 3 x 168 (the
# launch's 65,536 / 384, rounded down to 8) = 504 in all; ptxas spills nothing (scripts/ptxas_report.py).
WS_REGS = (224, 160, 120)
HALF = D // 2
# A thread block cluster's barrier (release / acquire: the shared-memory stores before it, the peer's included, are
# seen after it) and 16- / 4-byte stores into the peer CTA's shared memory at the address the local pointer has here
# (both CTAs lay their shared memory out alike).
CLUSTER_SRC = r"""
__device__ __forceinline__ void dsv4_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned dsv4_peer_addr(const void* p, unsigned rank) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p)), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void dsv4_put16(const void* base, int chunk, unsigned rank) {
  const char* p = reinterpret_cast<const char*>(base) + 16 * chunk;
  uint4 v = *reinterpret_cast<const uint4*>(p);
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "r"(dsv4_peer_addr(p, rank)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void dsv4_put4(const void* src, void* dst, unsigned rank) {
  asm volatile("st.shared::cluster.u32 [%0], %1;"
               :: "r"(dsv4_peer_addr(dst, rank)), "r"(*reinterpret_cast<const unsigned*>(src)) : "memory");
}
"""
LD_U32_SRC = r"""
__device__ __forceinline__ unsigned dsv4_ld_u32(const void* p, int k) { return reinterpret_cast<const unsigned*>(p)[k]; }
"""


# trace=True (benchmarks only): stamps of the scores warp group's thread 0 (tiles 0 .. WS_TRACE_TILES - 1), the
# gather's thread 256 and WG1's thread 128, in this order
WS_TRACE_TILES = 6
WS_STAMP_NAMES = (("entry", "pdl_sync", "lengths", "q in shared memory")
                  + tuple(f"tile {i} {w}" for i in range(WS_TRACE_TILES) for w in ("kv ready", "p published", "pv done"))
                  + ("scores loop done", "scores epilogue done", "gather first slots")
                  + tuple(f"gather tile {i} buffer free" for i in range(WS_TRACE_TILES))
                  + tuple(f"gather tile {i} stored" for i in range(WS_TRACE_TILES))
                  + ("gather done", "right pv done"))
WS_STAMPS = {name: i for i, name in enumerate(WS_STAMP_NAMES)}
WS_NSTAMP = len(WS_STAMP_NAMES)


def ws_smem_bytes(hb: int = WS_HEAD_BLOCK, bi: int = WS_BLOCK_I, cluster: bool = False) -> int:
    """Q, two KV buffers, two P buffers (bf16); two rescale vectors, two validity vectors, row sum and max (and in a
    cluster the peer's); the eight mbarriers (8 B each)."""
    return (2 * D * hb + 2 * (2 * D * bi) + 2 * (2 * hb * bi) + 2 * 4 * hb + 2 * 4 * bi
            + (4 if cluster else 2) * 4 * hb + 8 * 8)


def build_decode_ws(heads: int, n_splits: int, softmax_scale: float, cluster: bool = False, trace: bool = False):
    import tilelang.language as T

    H, HB, BI, S = heads, WS_HEAD_BLOCK, WS_BLOCK_I, n_splits
    if cluster and S != 2:
        raise ValueError(f"sparse_mla: the cluster merge joins a token's 2 splits; got {S} splits")
    SP = 1 if cluster else S   # partials' splits (a cluster variant takes placeholders: it writes none)
    if H % HB:
        raise ValueError(f"sparse_mla: the warp-specialized decode runs {HB} heads a CTA; {H} heads do not split "
                         f"into blocks of {HB}")
    NHB = H // HB
    scale2 = softmax_scale * LOG2E
    neg_inf = -T.infinity("float32")
    NCH = NOPE // 16           # 16-byte NoPE chunks a row (16 fp8 each)
    LCH = HALF // 16           # of them in the left column half
    RCH = ROPE // 8            # 16-byte RoPE chunks a row (8 bf16 each)
    ROW16 = TOKEN_BYTES // 16
    TPR_G = 4                  # gather threads a row: chunk 4j + q of the row to thread q
    ROWS_PER_PASS = 128 // TPR_G
    PASSES = BI // ROWS_PER_PASS   # rows a gather thread holds
    NG = NCH // TPR_G          # NoPE chunks a thread a row (j = scale group)
    RJ = RCH // TPR_G          # RoPE chunks a thread a row
    R0, R1_, R2_ = WS_REGS
    num_tokens = T.dynamic("num_tokens")
    n1, n2 = T.dynamic("n_idx1"), T.dynamic("n_idx2")
    P1, RW1, P2, RW2 = T.dynamic("pages1"), T.dynamic("rows1"), T.dynamic("pages2"), T.dynamic("rows2")
    num_out, num_part = T.dynamic("num_out"), T.dynamic("num_part")
    list_slot, cache_row_ok = slot_macros(T, BI, n1, n2)
    NSTAMP, TT = WS_NSTAMP, WS_TRACE_TILES
    stamp = stamp_macro(T, trace)

    @T.macro
    def slot_of(idx1, idx2, t, g, rng, r, slot_r, k):
        # row r of tile g of [list 1 tiles | list 2 tiles]: its slot into slot_r[k], -1 past a length or the
        # split's end
        slot_r[k] = -1
        if g < rng[2]:
            list_slot(idx1, idx2, t, g, rng, r, slot_r, k)

    @T.macro
    def place(slot_r, pages, rows, bs, loc, k):
        # loc[k] = [page (-1: masked), offset, the scale bytes' 16-byte row, their byte in that row] of slot_r[k]
        slot = slot_r[k]
        ok = cache_row_ok(slot, pages, rows, bs)
        loc[k, 0] = T.if_then_else(ok, slot // T.max(bs, 1), -1)
        loc[k, 1] = T.if_then_else(ok, slot % T.max(bs, 1), 0)
        loc[k, 2] = (bs * TOKEN_BYTES + loc[k, 1] * SCALE_BYTES) // 16
        loc[k, 3] = (bs * TOKEN_BYTES + loc[k, 1] * SCALE_BYTES) % 16

    @T.macro
    def load_pass(kvq, kvs, kvr, loc, q4, nope_r, rope_r, e_r, k):
        # pass k: this thread's chunks 4j + q4 of its row into registers (zeros where masked): NoPE chunks j < 7
        # (scale group j), RoPE chunks j = 7, 8. A warp's load covers 64 contiguous bytes of each of 8 rows.
        pg = T.max(loc[k, 0], 0)
        for w in T.unroll(2):   # the row's 8 scale bytes as two words (8-byte aligned: page start + 8 x offset)
            e_r[k * 2 + w] = T.if_then_else(
                loc[k, 0] >= 0, T.call_extern("uint32", "dsv4_ld_u32", T.address_of(kvs[pg, loc[k, 2], loc[k, 3]]),
                                              w), T.uint32(0))
        for j in T.unroll(NG):
            for v in T.vectorized(16):
                nope_r[(k * NG + j) * 16 + v] = T.if_then_else(
                    loc[k, 0] >= 0, kvq[pg, loc[k, 1] * ROW16 + j * TPR_G + q4, v], T.Cast("float8_e4m3fn", 0))
        for j in T.unroll(RJ):
            for v in T.vectorized(8):
                rope_r[(k * RJ + j) * 8 + v] = T.if_then_else(
                    loc[k, 0] >= 0, kvr[pg, loc[k, 1] * ROW16 + NCH + j * TPR_G + q4, v], T.bfloat16(0))

    @T.macro
    def issue_pass(kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, bs1, bs2, g, rng, slot_r, loc, q4, nope_r, rope_r, e_r, k):
        # pass k of tile g (slots in slot_r; -1 past the split's end: nothing loaded) from its list's cache
        if g < rng[0]:
            place(slot_r, P1, RW1, bs1, loc, k)
            load_pass(kvq1, kvs1, kvr1, loc, q4, nope_r, rope_r, e_r, k)
        else:
            place(slot_r, P2, RW2, bs2, loc, k)
            load_pass(kvq2, kvs2, kvr2, loc, q4, nope_r, rope_r, e_r, k)

    def scale_byte(e_r, k: int, g: int):
        return (e_r[k * 2 + g // 4] >> (8 * (g % 4))) & T.uint32(0xFF)

    @T.macro
    def store_pass(r0, q4, nope_r, rope_r, e_r, kv_l, kv_r, valid, loc, b, k):
        # dequantize pass k's registers into the KV buffer (8 values a 16-byte store); chunk 4j + q4 of a row is
        # columns 64j + 16 q4 .. + 15: the left half for j < 4
        r = r0 + k * ROWS_PER_PASS
        for j in T.unroll(NG):
            for h in T.unroll(2):
                if j < LCH // TPR_G:
                    T.call_extern("handle", "dsv4_dequant8", T.address_of(kv_l[r, (j * TPR_G + q4) * 16 + h * 8]),
                                  T.address_of(nope_r[(k * NG + j) * 16 + h * 8]), scale_byte(e_r, k, j))
                else:
                    T.call_extern("handle", "dsv4_dequant8",
                                  T.address_of(kv_r[r, (j * TPR_G + q4) * 16 - HALF + h * 8]),
                                  T.address_of(nope_r[(k * NG + j) * 16 + h * 8]), scale_byte(e_r, k, j))
        for j in T.unroll(RJ):
            for v in T.vectorized(8):
                kv_r[r, NOPE - HALF + (j * TPR_G + q4) * 8 + v] = rope_r[(k * RJ + j) * 8 + v]
        if q4 == 0:
            valid[b, r] = T.if_then_else(loc[k, 0] >= 0, 1, -1)

    @T.macro
    def gather_tile(kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, bs1, bs2, g, rng, r0, q4, slot_r, loc, nope_r, rope_r,
                    e_r, kv_l, kv_r, valid, kv_free, kv_ready, b, parity, idx1, idx2, t, trace_buf, hb,
                    split, it):
        # tile g's bytes are in flight (issued a tile earlier) and slot_r holds tile g + 1's slots. Each pass is
        # dequantized as its bytes land, and its registers then take tile g + 1's pass at once: that pass's loads
        # fly while the other pass is dequantized and the next tile waits for its buffer.
        T.barrier_wait(kv_free[b], parity)
        if it < TT:
            stamp(trace_buf, t, hb, split, WS_STAMPS["gather tile 0 buffer free"] + it, 256, 0)
        for k in range(PASSES):
            if b == 0:
                store_pass(r0, q4, nope_r, rope_r, e_r, kv_l[0], kv_r[0], valid, loc, b, k)
            else:
                store_pass(r0, q4, nope_r, rope_r, e_r, kv_l[1], kv_r[1], valid, loc, b, k)
            issue_pass(kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, bs1, bs2, g + 1, rng, slot_r, loc, q4, nope_r, rope_r,
                       e_r, k)
        T.fence_proxy_async()   # the generic-proxy stores, before the WGMMAs that read them
        T.barrier_arrive(kv_ready[b])
        if it < TT:
            stamp(trace_buf, t, hb, split, WS_STAMPS["gather tile 0 stored"] + it, 256, 0)
        # tile g + 2's slots, so their index loads fly during the next tile's wait and stores
        for k in range(PASSES):
            slot_of(idx1, idx2, t, g + 2, rng, r0 + k * ROWS_PER_PASS, slot_r, k)

    @T.macro
    def scores_tile(q_l, q_r, kv_l, kv_r, valid, p_s, alpha_s, acc_s, acc_o, m_f, m_prev, ref_f, alpha_f, rsum,
                    sum_f, kv_ready, kv_free, p_ready, p_free, b, parity, trace_buf, t, hb, split, it):
        T.barrier_wait(kv_ready[b], parity)
        if it < TT:
            stamp(trace_buf, t, hb, split, WS_STAMPS["tile 0 kv ready"] + 3 * it, 0, 0)
        if b == 0:
            T.wgmma_gemm(q_l, kv_l[0], acc_s, transpose_B=True, clear_accum=True)
            T.wgmma_gemm(q_r, kv_r[0], acc_s, transpose_B=True)
        else:
            T.wgmma_gemm(q_l, kv_l[1], acc_s, transpose_B=True, clear_accum=True)
            T.wgmma_gemm(q_r, kv_r[1], acc_s, transpose_B=True)
        T.wait_wgmma(0)
        for h, j in T.Parallel(HB, BI):
            acc_s[h, j] = T.if_then_else(valid[b, j] >= 0, acc_s[h, j] * scale2, neg_inf)
        T.copy(m_f, m_prev)
        T.reduce_max(acc_s, m_f, dim=1, clear=False)
        for h in T.Parallel(HB):
            # an all-masked row keeps m = -inf; 0 as its reference makes exp2 give 0, not NaN
            ref_f[h] = T.if_then_else(m_f[h] == neg_inf, T.float32(0), m_f[h])
            alpha_f[h] = T.exp2(m_prev[h] - ref_f[h])
        for h, j in T.Parallel(HB, BI):
            acc_s[h, j] = T.exp2(acc_s[h, j] - ref_f[h])
        T.reduce_sum(acc_s, rsum, dim=1)
        for h in T.Parallel(HB):
            sum_f[h] = sum_f[h] * alpha_f[h] + rsum[h]
        for h, d in T.Parallel(HB, HALF):
            acc_o[h, d] = acc_o[h, d] * alpha_f[h]
        T.barrier_wait(p_free[b], parity ^ 1)   # WG1 is done with this P buffer's previous tile
        if b == 0:
            T.copy(acc_s, p_s[0])
        else:
            T.copy(acc_s, p_s[1])
        T.copy(alpha_f, alpha_s[b, :])
        T.fence_proxy_async()
        T.sync_threads(2, 128)                  # all of P written, before this warp group's WGMMA reads it
        T.barrier_arrive(p_ready[b])
        if it < TT:
            stamp(trace_buf, t, hb, split, WS_STAMPS["tile 0 p published"] + 3 * it, 0, 0)
        if b == 0:
            T.gemm(p_s[0], kv_l[0], acc_o)
        else:
            T.gemm(p_s[1], kv_l[1], acc_o)
        T.barrier_arrive(kv_free[b])
        if it < TT:
            stamp(trace_buf, t, hb, split, WS_STAMPS["tile 0 pv done"] + 3 * it, 0, 0)

    @T.macro
    def right_tile(kv_r, p_s, alpha_s, a_f, acc_o, p_ready, kv_free, p_free, b, parity):
        T.barrier_wait(p_ready[b], parity)
        for h in T.Parallel(HB):
            a_f[h] = alpha_s[b, h]
        for h, d in T.Parallel(HB, HALF):
            acc_o[h, d] = acc_o[h, d] * a_f[h]
        if b == 0:
            T.gemm(p_s[0], kv_r[0], acc_o)
        else:
            T.gemm(p_s[1], kv_r[1], acc_o)
        T.barrier_arrive(kv_free[b])
        T.barrier_arrive(p_free[b])

    @T.macro
    def stage_half(acc_o, fac, stage, l_s, m_s, sink, hb, bar_id):
        # this warp group's half of O -> bf16 rows in `stage` (Q's half: no tile reads Q any more). One factor a row
        # (a thread holds 2 rows), then multiplies: a division an element, with its slow path, made this epilogue's
        # code long enough to miss the instruction cache all through (ncu: no_inst).
        for h in T.Parallel(HB):
            if S == 1:
                # a row with no candidate is 0 (softmax over the sink alone), also where e^sink underflows
                fac[h] = T.if_then_else(l_s[h] > 0, T.float32(1) / (l_s[h] + T.exp2(
                    sink[hb * HB + h] * LOG2E - T.if_then_else(m_s[h] == neg_inf, T.float32(0), m_s[h]))),
                    T.float32(0))
            else:
                # normalised within the split; a row with no candidate writes zeros (its lse is -inf: the combine
                # and the cluster merge weigh it 0)
                fac[h] = T.if_then_else(l_s[h] > 0, T.float32(1) / l_s[h], T.float32(0))
        for h, d in T.Parallel(HB, HALF):
            stage[h, d] = T.Cast("bfloat16", acc_o[h, d] * fac[h])
        T.sync_threads(bar_id, 128)

    @T.macro
    def write_half(acc_o, fac, stage, l_s, m_s, sink, out, o_part, t, hb, split, col0, bar_id):
        # the staged half -> global: the output unsplit, else the split's partial
        stage_half(acc_o, fac, stage, l_s, m_s, sink, hb, bar_id)
        if S == 1:
            T.copy(stage, out[t, hb * HB:(hb + 1) * HB, col0:col0 + HALF])
        else:
            T.copy(stage, o_part[split, t, hb * HB:(hb + 1) * HB, col0:col0 + HALF])

    @T.macro
    def put_half(stage, peer, tx0):
        # the staged half (HB x HALF bf16, 16-byte chunks) into the same place of the peer's shared memory
        for i in T.unroll(HB * HALF * 2 // 16 // 128):
            T.call_extern("handle", "dsv4_put16", T.address_of(stage[0, 0]), i * 128 + tx0, peer)

    @T.macro
    def merge_pair(acc_o, stage, l_s, m_s, pl_s, pm_s, sink, out, t, hb, col0, bar_id, mx, fs, wp):
        # out half = (2^(m - M) acc_o + l' 2^(m' - M) o') / (2^(m - M) l + l' 2^(m' - M) + 2^(sink - M)), o' the
        # peer's normalised half in `stage`, M the largest of the two maxima (of rows with a candidate) and the sink
        for h in T.Parallel(HB):
            mx[h] = T.max(T.max(sink[hb * HB + h] * LOG2E, T.if_then_else(l_s[h] > 0, m_s[h], neg_inf)),
                          T.if_then_else(pl_s[h] > 0, pm_s[h], neg_inf))
            fs[h] = T.if_then_else(l_s[h] > 0, T.exp2(m_s[h] - mx[h]), T.float32(0))
            wp[h] = T.if_then_else(pl_s[h] > 0, pl_s[h] * T.exp2(pm_s[h] - mx[h]), T.float32(0))
            mx[h] = T.float32(1) / (l_s[h] * fs[h] + wp[h] + T.exp2(sink[hb * HB + h] * LOG2E - mx[h]))   # >= 2^0
        for h, d in T.Parallel(HB, HALF):
            acc_o[h, d] = (acc_o[h, d] * fs[h] + wp[h] * T.Cast("float32", stage[h, d])) * mx[h]
        T.sync_threads(bar_id, 128)
        for h, d in T.Parallel(HB, HALF):
            stage[h, d] = T.Cast("bfloat16", acc_o[h, d])
        T.sync_threads(bar_id, 128)
        T.copy(stage, out[t, hb * HB:(hb + 1) * HB, col0:col0 + HALF])

    def launch(*grid):
        if cluster:   # a token's two splits are one cluster (z = split = the CTA's rank in it)
            return T.ClusterKernel(*grid, cluster_dims=(1, 1, 2), threads=WS_THREADS)
        return T.Kernel(*grid, threads=WS_THREADS)

    @T.macro
    def forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink,
                out, o_part, lse_part, trace_buf):
        with launch(num_tokens, NHB, S) as (t, hb, split):
            T.import_source(DEQUANT8_SRC + LD_U32_SRC + (CLUSTER_SRC if cluster else "") + (TRACE_SRC if trace else ""))
            q_l = T.alloc_shared([HB, HALF], "bfloat16")
            q_r = T.alloc_shared([HB, HALF], "bfloat16")
            # two of each, tile it in buffer it % 2; the GEMM operands are separate allocations named statically
            # (TileLang 0.1.12 drops a leading index from a WGMMA operand's descriptor, 0.1.15 a dynamic one)
            kv_l0 = T.alloc_shared([BI, HALF], "bfloat16")
            kv_l1 = T.alloc_shared([BI, HALF], "bfloat16")
            kv_r0 = T.alloc_shared([BI, HALF], "bfloat16")
            kv_r1 = T.alloc_shared([BI, HALF], "bfloat16")
            p0 = T.alloc_shared([HB, BI], "bfloat16")
            p1 = T.alloc_shared([HB, BI], "bfloat16")
            kv_l, kv_r, p_s = (kv_l0, kv_l1), (kv_r0, kv_r1), (p0, p1)
            alpha_s = T.alloc_shared([2, HB], "float32")
            valid = T.alloc_shared([2, BI], "int32")
            l_s = T.alloc_shared([HB], "float32")
            m_s = T.alloc_shared([HB], "float32")
            if cluster:
                pl_s = T.alloc_shared([HB], "float32")   # the peer split's row sums and maxima
                pm_s = T.alloc_shared([HB], "float32")
            kv_ready = T.alloc_barrier([128, 128])
            kv_free = T.alloc_barrier([256, 256])
            p_ready = T.alloc_barrier([128, 128])
            p_free = T.alloc_barrier([128, 128])
            rng = T.alloc_local([5], "int32")
            tx = T.get_thread_binding()

            stamp(trace_buf, t, hb, split, WS_STAMPS["entry"], 0, 0)
            # launched behind its producer (PDL: the top-k, q's kernel): everything read here is its output
            T.pdl_sync()
            stamp(trace_buf, t, hb, split, WS_STAMPS["pdl_sync"], 0, 0)
            rng[3] = T.max(T.min(lens1[t], n1), 0)
            rng[4] = T.max(T.min(lens2[t], n2), 0)
            t1, t2 = T.ceildiv(rng[3], BI), T.ceildiv(rng[4], BI)
            per = split_share(T, t1 + t2, S)
            rng[0] = t1
            rng[1] = T.min(split * per, t1 + t2)
            rng[2] = T.min(split * per + per, t1 + t2)
            stamp(trace_buf, t, hb, split, WS_STAMPS["lengths"], 0, rng[2])

            if tx < 128:
                T.set_max_nreg(R0, 1)
                acc_s = T.alloc_fragment([HB, BI], "float32")
                acc_o = T.alloc_fragment([HB, HALF], "float32")
                m_f = T.alloc_fragment([HB], "float32")
                m_prev = T.alloc_fragment([HB], "float32")
                ref_f = T.alloc_fragment([HB], "float32")
                alpha_f = T.alloc_fragment([HB], "float32")
                rsum = T.alloc_fragment([HB], "float32")
                sum_f = T.alloc_fragment([HB], "float32")
                fac = T.alloc_fragment([HB], "float32")
                T.copy(q[t, hb * HB:(hb + 1) * HB, 0:HALF], q_l)
                T.fill(acc_o, 0)
                T.fill(sum_f, 0)
                T.fill(m_f, neg_inf)
                T.fence_proxy_async()
                T.sync_threads(1, 256)   # Q in shared memory (both halves)
                stamp(trace_buf, t, hb, split, WS_STAMPS["q in shared memory"], 0, 0)
                for it in T.serial(rng[2] - rng[1]):
                    scores_tile(q_l, q_r, kv_l, kv_r, valid, p_s, alpha_s, acc_s, acc_o, m_f, m_prev, ref_f, alpha_f,
                                rsum, sum_f, kv_ready, kv_free, p_ready, p_free, it % 2, (it // 2) % 2, trace_buf, t,
                                hb, split, it)
                stamp(trace_buf, t, hb, split, WS_STAMPS["scores loop done"], 0, 0)
                # the kernel behind this one may launch now (its CTAs wait in pdl_sync for this grid's writes)
                T.pdl_trigger()
                T.copy(sum_f, l_s)
                T.copy(m_f, m_s)
                T.sync_threads(3, 256)   # row sums and maxima to WG1; both warp groups are past their last tile
                if cluster:
                    # split 0 merges the left half, split 1 sends it (Q's left half is its staging in both)
                    if split == 1:
                        stage_half(acc_o, fac, q_l, l_s, m_s, sink, hb, 2)
                    T.call_extern("handle", "dsv4_cluster_sync")   # both CTAs past their tiles: Q free in both
                    if tx < HB:
                        T.call_extern("handle", "dsv4_put4", T.address_of(l_s[tx]), T.address_of(pl_s[tx]), 1 - split)
                        T.call_extern("handle", "dsv4_put4", T.address_of(m_s[tx]), T.address_of(pm_s[tx]), 1 - split)
                    if split == 1:
                        put_half(q_l, 0, tx)
                    T.call_extern("handle", "dsv4_cluster_sync")   # the peer's half and row statistics landed
                    if split == 0:
                        merge_pair(acc_o, q_l, l_s, m_s, pl_s, pm_s, sink, out, t, hb, 0, 2, m_prev, ref_f, alpha_f)
                else:
                    write_half(acc_o, fac, q_l, l_s, m_s, sink, out, o_part, t, hb, split, 0, 2)
                    if S > 1:
                        for h in T.Parallel(HB):
                            lse_part[split, t, hb * HB + h] = T.if_then_else(
                                l_s[h] > 0, m_s[h] + T.log2(l_s[h]), neg_inf)
                stamp(trace_buf, t, hb, split, WS_STAMPS["scores epilogue done"], 0, 0)
            elif tx < 256:
                T.set_max_nreg(R1_, 0)
                acc_o = T.alloc_fragment([HB, HALF], "float32")
                a_f = T.alloc_fragment([HB], "float32")
                fac = T.alloc_fragment([HB], "float32")
                if cluster:
                    mx = T.alloc_fragment([HB], "float32")
                    fs = T.alloc_fragment([HB], "float32")
                    wp = T.alloc_fragment([HB], "float32")
                T.copy(q[t, hb * HB:(hb + 1) * HB, HALF:D], q_r)
                T.fill(acc_o, 0)
                T.fence_proxy_async()
                T.sync_threads(1, 256)
                for it in T.serial(rng[2] - rng[1]):
                    right_tile(kv_r, p_s, alpha_s, a_f, acc_o, p_ready, kv_free, p_free, it % 2, (it // 2) % 2)
                T.pdl_trigger()
                T.sync_threads(3, 256)
                if cluster:
                    # split 1 merges the right half, split 0 sends it
                    if split == 0:
                        stage_half(acc_o, fac, q_r, l_s, m_s, sink, hb, 4)
                    T.call_extern("handle", "dsv4_cluster_sync")
                    if split == 0:
                        put_half(q_r, 1, tx - 128)
                    T.call_extern("handle", "dsv4_cluster_sync")
                    if split == 1:
                        merge_pair(acc_o, q_r, l_s, m_s, pl_s, pm_s, sink, out, t, hb, HALF, 4, mx, fs, wp)
                else:
                    write_half(acc_o, fac, q_r, l_s, m_s, sink, out, o_part, t, hb, split, HALF, 4)
                stamp(trace_buf, t, hb, split, WS_STAMPS["right pv done"], 128, 0)
            else:
                T.set_max_nreg(R2_, 0)
                slot_r = T.alloc_local([PASSES], "int32")
                loc = T.alloc_local([PASSES, 4], "int32")
                nope_r = T.alloc_local([PASSES * NG * 16], "float8_e4m3fn")
                rope_r = T.alloc_local([PASSES * RJ * 8], "bfloat16")
                e_r = T.alloc_local([PASSES * 2], "uint32")
                r0 = (tx - 256) // TPR_G
                q4 = (tx - 256) % TPR_G
                # the first tile's bytes in flight, then the second tile's slots
                for k in range(PASSES):
                    slot_of(idx1, idx2, t, rng[1], rng, r0 + k * ROWS_PER_PASS, slot_r, k)
                stamp(trace_buf, t, hb, split, WS_STAMPS["gather first slots"], 256, slot_r[0])
                for k in range(PASSES):
                    issue_pass(kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, block_size1, block_size2, rng[1], rng, slot_r, loc,
                               q4, nope_r, rope_r, e_r, k)
                for k in range(PASSES):
                    slot_of(idx1, idx2, t, rng[1] + 1, rng, r0 + k * ROWS_PER_PASS, slot_r, k)
                for it in T.serial(rng[2] - rng[1]):
                    gather_tile(kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, block_size1, block_size2, rng[1] + it, rng, r0, q4,
                                slot_r, loc, nope_r, rope_r, e_r, kv_l, kv_r, valid, kv_free, kv_ready, it % 2,
                                (it // 2) % 2 ^ 1, idx1, idx2, t, trace_buf, hb, split, it)
                T.pdl_trigger()
                stamp(trace_buf, t, hb, split, WS_STAMPS["gather done"], 256, 0)
                if cluster:   # every thread of the cluster takes part in its barriers
                    T.call_extern("handle", "dsv4_cluster_sync")
                    T.call_extern("handle", "dsv4_cluster_sync")

    # the kernel's parameters; a traced build (trace=True, benchmarks only) adds the stamps' buffer
    if trace:
        @T.prim_func
        def sparse_mla_fwd(
            q: T.Tensor[(num_tokens, H, D), "bfloat16"],
            kvq1: T.Tensor[(P1, RW1, 16), "float8_e4m3fn"],
            kvs1: T.Tensor[(P1, RW1, 16), "uint8"],
            kvr1: T.Tensor[(P1, RW1, 8), "bfloat16"],
            idx1: T.Tensor[(num_tokens, n1), "int32"],
            lens1: T.Tensor[(num_tokens,), "int32"],
            kvq2: T.Tensor[(P2, RW2, 16), "float8_e4m3fn"],
            kvs2: T.Tensor[(P2, RW2, 16), "uint8"],
            kvr2: T.Tensor[(P2, RW2, 8), "bfloat16"],
            idx2: T.Tensor[(num_tokens, n2), "int32"],
            lens2: T.Tensor[(num_tokens,), "int32"],
            block_size1: T.int32,
            block_size2: T.int32,
            sink: T.Tensor[(H,), "float32"],
            out: T.Tensor[(num_out, H, D), "bfloat16"],
            o_part: T.Tensor[(SP, num_part, H, D), "bfloat16"],
            lse_part: T.Tensor[(SP, num_part, H), "float32"],
            trace_buf: T.Tensor[(num_tokens, NHB, S, NSTAMP, 2), "int64"],
        ):
            forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink,
                    out, o_part, lse_part, trace_buf)
    else:
        @T.prim_func
        def sparse_mla_fwd(
            q: T.Tensor[(num_tokens, H, D), "bfloat16"],
            kvq1: T.Tensor[(P1, RW1, 16), "float8_e4m3fn"],
            kvs1: T.Tensor[(P1, RW1, 16), "uint8"],
            kvr1: T.Tensor[(P1, RW1, 8), "bfloat16"],
            idx1: T.Tensor[(num_tokens, n1), "int32"],
            lens1: T.Tensor[(num_tokens,), "int32"],
            kvq2: T.Tensor[(P2, RW2, 16), "float8_e4m3fn"],
            kvs2: T.Tensor[(P2, RW2, 16), "uint8"],
            kvr2: T.Tensor[(P2, RW2, 8), "bfloat16"],
            idx2: T.Tensor[(num_tokens, n2), "int32"],
            lens2: T.Tensor[(num_tokens,), "int32"],
            block_size1: T.int32,
            block_size2: T.int32,
            sink: T.Tensor[(H,), "float32"],
            out: T.Tensor[(num_out, H, D), "bfloat16"],
            o_part: T.Tensor[(SP, num_part, H, D), "bfloat16"],
            lse_part: T.Tensor[(SP, num_part, H), "float32"],
        ):
            forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink,
                    out, o_part, lse_part, None)

    return sparse_mla_fwd
