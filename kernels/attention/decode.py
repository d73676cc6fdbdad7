"""Sparse MLA decode over the fp8_ds_mla paged cache (`sparse_mla_fwd`, kv_format fp8_ds_mla): decode, MTP, and
prefill over the paged cache. The per-tile math is common.py's; this module gathers and dequantizes the tiles.

fp8_ds_mla cache (FlashMLA MODEL1 FP8 sparse): a page of `block_size` tokens is [block_size x 576 B:
448 fp8 e4m3 NoPE | 64 bf16 RoPE] then [block_size x 8 B: 7 UE8M0 scales, one per 64 NoPE dims, 1 pad];
pages may be padded (any page size that is a multiple of 16 B). The kernel reads the page bytes through
three views of the same storage, [pages, page_bytes/16, 16] fp8 and uint8 and [pages, page_bytes/16, 8]
bf16, so every read is a static 16-byte-aligned row and vectorizes; it dequantizes into shared memory.
A slot is page * block_size + offset. Out-of-range slots, holes and positions past a token's length are
masked in the kernel (never read), so a bad index can never become an illegal access.

Two gather pipelines (`stages`, chosen by select), on top of common.py's shared memory:
  - stages >= 1, the cp.async ring: + stages*BI*(448 + 128 + 8 + 8) + 4*BI  a tile's raw bytes (NoPE, RoPE,
    scales) and its rows' page and offset per stage, and the validity of the tile in kv_s. The bytes go
    global -> shared by cp.async with no register held and are dequantized from shared memory. With one stage
    (select's) the next tile is issued once this one is dequantized out of the stage, and flies during its math.
    16 heads 71,744 B, 32 heads 91,648 B (both fit SM12x), 64 heads 131,456 B (Hopper; 195,584 B with
    64-candidate tiles).
  - stages = 0, through registers: + 4*BI*(3 + 8) page / offset / validity and 8 fp32 scales per row; tile
    k+1's bytes are loaded into registers (every load issued before any is used) while tile k is dequantized
    and multiplied. select no longer picks it (a one-token step at 64 heads runs 32-head ring CTAs instead);
    the schedule sweep still can.
The fp8 NoPE bytes become bf16 8 at a time by bit placement and two bf16x2 multiplies (DEQUANT8_SRC).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from .common import D, GROUP, NOPE, ROPE, SCALE_BYTES, SPAD, TOKEN_BYTES, tile_macros
from .trace import TRACE_SRC, stamp_after, stamp_macro

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
__device__ __forceinline__ unsigned dsv4_ue8m0_bf16x2(unsigned e) {   // 2^(e - 127) in both bf16 halves
  return (e << 7) | (e << 23);
}
// the 8 e4m3 bytes of (lo, hi) times scale (dsv4_ue8m0_bf16x2) into one 16-byte store at dst
__device__ __forceinline__ void dsv4_dequant8_words(void* dst, unsigned lo, unsigned hi, unsigned scale) {
  uint4 o;
  o.x = dsv4_e4m3x2_bf16x2(lo, 0x1404u, scale);
  o.y = dsv4_e4m3x2_bf16x2(lo, 0x3424u, scale);
  o.z = dsv4_e4m3x2_bf16x2(hi, 0x1404u, scale);
  o.w = dsv4_e4m3x2_bf16x2(hi, 0x3424u, scale);
  *reinterpret_cast<uint4*>(dst) = o;
}
__device__ __forceinline__ void dsv4_dequant8(void* dst, const void* src, unsigned e) {
  uint2 w = *reinterpret_cast<const uint2*>(src);
  unsigned scale = dsv4_ue8m0_bf16x2(e);
  dsv4_dequant8_words(dst, w.x, w.y, scale);
}
// dsv4_dequant8 in two steps, the load and the dequantize of the loaded word: a thread issues all its loads first
__device__ __forceinline__ unsigned long long dsv4_ld8(const void* src) {
  return *reinterpret_cast<const unsigned long long*>(src);
}
__device__ __forceinline__ void dsv4_dequant8_w(void* dst, unsigned long long w64, unsigned e) {
  unsigned scale = dsv4_ue8m0_bf16x2(e);
  dsv4_dequant8_words(dst, (unsigned)w64, (unsigned)(w64 >> 32), scale);
}
"""


def e4m3_bf16_bits(byte: int) -> int:
    """DEQUANT8_SRC's bit placement in plain Python: the bf16 bits holding e4m3 `byte`'s value x 2^-120 (the
    tests check it against torch for every code; NaN codes, which no encoder writes, become finite)."""
    return (byte & 0x80) << 8 | (byte & 0x7F) << 4


def slot_macros(T, block_i: int, n1, n2):
    """What both fp8 decode kernels (this one and decode_ws.py) ask of a candidate: its slot in the index lists, and
    whether that slot is a row of its cache. n1 / n2 are the index lists' width symbols."""
    BI = block_i

    @T.macro
    def list_slot(idx1, idx2, t, g, rng, r, slot_r, k):
        # slot_r[k] = the slot of row r of tile g of [list 1 tiles | list 2 tiles] (g < rng[2]), -1 past a length.
        # The lengths come from rng[3], rng[4] (registers, loaded once): a length read again here made the index
        # load wait for it, a round trip a tile (the gather's loads keep little of it in L1).
        if g < rng[0]:
            slot_r[k] = T.if_then_else(g * BI + r < rng[3], idx1[t, T.max(T.min(g * BI + r, n1 - 1), 0)], -1)
        else:
            slot_r[k] = T.if_then_else((g - rng[0]) * BI + r < rng[4],
                                       idx2[t, T.max(T.min((g - rng[0]) * BI + r, n2 - 1), 0)], -1)

    @T.macro
    def cache_row_ok(slot, pages, rows, bs):
        # a hole (-1), a slot past the cache, or a cache whose pages cannot hold bs tokens is never read
        return (slot >= 0) and (slot < pages * bs) and (bs > 0) and (rows * 16 >= bs * (TOKEN_BYTES + SCALE_BYTES))

    return list_slot, cache_row_ok


# the ring kernel's stamps (trace=True), in order; the first TRACED_TILES tiles of a CTA get five each
TRACED_TILES = 2
TILE_STAMPS = ("landed", "dequantized", "scores", "softmax", "P.V issued")
RING_STAMPS = (("entry", "pdl_sync", "lengths", "first slots")
               + tuple(f"tile {i} {n}" for i in range(TRACED_TILES) for n in TILE_STAMPS)
               + ("last tile done", "epilogue row sums", "epilogue O staged", "epilogue done"))


def build_decode(heads: int, head_block: int, block_i: int, threads: int, n_splits: int, softmax_scale: float,
                 stages: int = 0, score_chains: int = 0, trace: bool = False, score_halves: bool | None = None):
    import tilelang.language as T

    # the ring kernel's mma.sync scores run in two halves of the threads, each over half of the dims (common.py's
    # scores_halves); None: so wherever the scores are mma.sync chains (score_chains != 1) through the ring
    if score_halves is None:
        score_halves = stages > 0 and score_chains != 1 and threads % 64 == 0

    H, HB, BI, S, NST = heads, head_block, block_i, n_splits, stages
    if stages not in (0, 1, 2, 3, 4):
        raise ValueError(f"sparse_mla: stages must be 0 (registers) or 1..4 (the fp8_ds_mla cp.async ring), got "
                         f"{stages} for fp8_ds_mla")
    NHB = (H + HB - 1) // HB
    # trace=True (benchmarks only): thread 0's timeline of the ring kernel, RING_STAMPS points a CTA
    NSTAMP = len(RING_STAMPS)
    stamp = stamp_macro(T, trace and NST > 0)
    NTS = len(TILE_STAMPS)
    NG = NOPE // GROUP
    num_tokens = T.dynamic("num_tokens")
    n1 = T.dynamic("n_idx1")
    n2 = T.dynamic("n_idx2")
    P1, R1, P2, R2 = T.dynamic("pages1"), T.dynamic("rows1"), T.dynamic("pages2"), T.dynamic("rows2")
    tm = tile_macros(T, heads=H, head_block=HB, block_i=BI, threads=threads, n_splits=S, softmax_scale=softmax_scale,
                    score_chains=score_chains, n1=n1, n2=n2, stamp=stamp, score_halves=score_halves)
    load_q, attend_tile, mark_valid, tile_range, finish = tm.load_q, tm.attend_tile, tm.mark_valid, tm.tile_range, tm.finish
    list_slot, cache_row_ok = slot_macros(T, BI, n1, n2)
    neg_inf, pad_heads, out_shape, part_shape, lse_shape = tm.neg_inf, tm.pad_heads, tm.out_shape, tm.part_shape, tm.lse_shape

    @T.macro
    def load_q_async(q, q_s, t, hb):
        # the ring kernel: q by cp.async in its own commit group, so its DRAM round trip overlaps the length,
        # index and first tile loads; the first wait for a tile waits for it too (groups complete in order)
        if pad_heads:
            load_q(q, q_s, t, hb)
        else:
            T.async_copy(q[t, hb * HB:(hb + 1) * HB, :], q_s)


    @T.macro
    def fetch_slot(idx1, idx2, t, g, rng, tx, slot_r, k):
        # thread j < BI: the slot of row j of tile g of [list 1 tiles | list 2 tiles], -1 past a length.
        # Read one tile ahead of its use, so the index load's latency hides behind a whole tile's math
        # instead of standing between the barrier and the tile's gather.
        if tx < BI and g < rng[2]:
            list_slot(idx1, idx2, t, g, rng, tx, slot_r, k)

    @T.macro
    def rows_fp8(slot_r, k, tx, pages, rows, st, pg_s, off_s, bs):
        # one thread per tile row: slot_r[k] -> (page, offset), -1 for a hole / past the length / outside the
        # cache; into stage st of the ring's page / offset buffers, or (st None) the register path's one row each
        if tx < BI:
            slot = slot_r[k]
            ok = cache_row_ok(slot, pages, rows, bs)
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
    def fetch_slot_or_end(idx1, idx2, t, g, rng, tx, slot_r, k):
        # fetch_slot into slot_r[k], and -1 for a tile past the split's end (rows are computed that far ahead)
        if tx < BI:
            slot_r[k] = -1
        fetch_slot(idx1, idx2, t, g, rng, tx, slot_r, k)

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
    TPRW = threads // BI if threads % BI == 0 else 0   # dequantizing threads a row (0: the flat walk)
    NIT = (NQ8 + TPRW - 1) // TPRW if TPRW else 0     # groups a thread dequantizes
    LD_BATCH = min(NIT, 7) if NIT else 1               # of them loaded before the first store

    @T.macro
    def dequant_stage(nope_s, rope_s, scr_s, st, kv_s, w_loc, e_loc):
        # 8 e4m3 bytes -> 8 bf16 a thread by bit placement and two bf16x2 multiplies (DEQUANT8_SRC); kv_s's
        # swizzle moves 16-byte chunks, so the 8 values of kv_s[j, c0 .. c0 + 7] are one aligned 16-byte store.
        # TPRW threads a row, thread c of it taking the row's groups c, c + TPRW, ...: the row is fixed a thread and
        # each step moves its column by a constant, so the swizzled addresses are a per-thread base plus constants
        # (a flat walk over the tile's groups divided by 56 a group; that address math was most of this step).
        if TPRW:
            # a thread's groups loaded into registers LD_BATCH at a time before any is stored: kv_s and the stage
            # are one merged buffer to nvcc, which cannot move a load past a store that may alias it
            r = T.get_thread_binding() // TPRW
            c = T.get_thread_binding() % TPRW
            for i0 in T.unroll((NIT + LD_BATCH - 1) // LD_BATCH):
                for i1 in T.unroll(LD_BATCH):
                    g = c + (i0 * LD_BATCH + i1) * TPRW   # the group, of the row's NQ8
                    if i0 * LD_BATCH + i1 < NIT and (NQ8 % TPRW == 0 or g < NQ8):
                        w_loc[i1] = T.call_extern("uint64", "dsv4_ld8", T.address_of(nope_s[st, r, g * 8]))
                        e_loc[i1] = T.Cast("uint32", scr_s[st, r, g * 8 // GROUP])
                for i1 in T.unroll(LD_BATCH):
                    g = c + (i0 * LD_BATCH + i1) * TPRW
                    if i0 * LD_BATCH + i1 < NIT and (NQ8 % TPRW == 0 or g < NQ8):
                        T.call_extern("handle", "dsv4_dequant8_w", T.address_of(kv_s[r, g * 8]), w_loc[i1], e_loc[i1])
        else:
            for i in T.unroll((BI * NQ8 + threads - 1) // threads):
                k = i * threads + T.get_thread_binding()
                if k < BI * NQ8:
                    T.call_extern("handle", "dsv4_dequant8", T.address_of(kv_s[k // NQ8, (k % NQ8) * 8]),
                                  T.address_of(nope_s[st, k // NQ8, (k % NQ8) * 8]),
                                  T.Cast("uint32", scr_s[st, k // NQ8, (k % NQ8) * 8 // GROUP]))
        for j, c in T.Parallel(BI, ROPE):
            kv_s[j, NOPE + c] = rope_s[st, j, c]

    @T.macro
    def forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink, out,
                o_part, lse_part, trace_buf):
        if NST:
            with T.Kernel(num_tokens, NHB, S, threads=threads) as (t, hb, split):
                T.import_source(DEQUANT8_SRC + (TRACE_SRC if trace else ""))
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
                w_loc = T.alloc_local([LD_BATCH], "uint64")
                e_loc = T.alloc_local([LD_BATCH], "uint32")
                acc_s = T.alloc_fragment([HB, BI], "float32")
                acc_b = T.alloc_fragment([HB, BI], "float32")
                acc_c = T.alloc_fragment([HB, BI], "float32")
                acc_d = T.alloc_fragment([HB, BI], "float32")
                acc_o = T.alloc_fragment([HB, D], "float32")
                st = T.alloc_local([2], "float32")
                rng = T.alloc_local([5], "int32")
                slot_r = T.alloc_local([NST + 1], "int32")  # [0]: the next tile's; all NST + 1 in the prologue
                tx = T.get_thread_binding()

                stamp(trace_buf, t, hb, split, 0, 0, 0)
                # launched behind its producer (PDL: the top-k, q's kernel): everything read here is its output
                T.pdl_sync()
                stamp(trace_buf, t, hb, split, 1, 0, 0)
                load_q_async(q, q_s, t, hb)
                T.clear(acc_o)
                st[0] = neg_inf
                st[1] = T.float32(0)
                tile_range(lens1, lens2, t, split, rng)
                stamp(trace_buf, t, hb, split, 2, 0, rng[2])
                # Tiles rng[1] .. rng[2]-1 of [list 1 tiles | list 2 tiles] pass through NST cp.async stages. With
                # NST >= 2, tile it + NST - 1 is issued before tile it is waited for (NST - 1 tiles' bytes in flight
                # during its wait, dequantize and math); with one stage, tile it + 1 is issued once tile it is
                # dequantized out of the stage (in flight during its math only, as the register path's loads).
                # Rows (page, offset) are computed NST tiles ahead, slots one further.
                # the first NST + 1 tiles' slots load together (one index latency, not NST + 1 in a row)
                for s0 in T.unroll(NST + 1):
                    fetch_slot_or_end(idx1, idx2, t, rng[1] + s0, rng, tx, slot_r, s0)
                for s0 in T.unroll(NST):
                    rows_at(slot_r, s0, tx, rng[1] + s0, rng, s0, pg_s, off_s, block_size1, block_size2)
                stamp(trace_buf, t, hb, split, 3, 0, slot_r[0])
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
                    # tile it's stamps, the first TRACED_TILES tiles only (-1: none)
                    k0 = T.if_then_else(it < TRACED_TILES, 4 + NTS * it, -1)
                    stamp(trace_buf, t, hb, split, k0, 0, 0)
                    dequant_stage(nope_s, rope_s, scr_s, it % NST, kv_s, w_loc, e_loc)
                    # the same thread reads row tx's validity and then writes the row NST tiles ahead in its place
                    if tx < BI:
                        valid_s[tx] = pg_s[it % NST, tx]
                    rows_at(slot_r, 0, tx, rng[1] + it + NST, rng, it % NST, pg_s, off_s, block_size1, block_size2)
                    fetch_slot_or_end(idx1, idx2, t, rng[1] + it + NST + 1, rng, tx, slot_r, 0)
                    T.sync_threads()  # C
                    stamp(trace_buf, t, hb, split, stamp_after(T, k0, 1), 0, 0)
                    if NST == 1:
                        issue_at(rng[1] + it + 1, rng, 0, tx, kvq1, kvs1, kvr1, kvq2, kvs2, kvr2, block_size1,
                                 block_size2, pg_s, off_s, nope_s, rope_s, scr_s)
                    attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx,
                                trace_buf, t, hb, split, stamp_after(T, k0, 2))
                T.ptx_wait_group(0)  # no copy outlives the CTA (an empty split issued its prologue too)
                stamp(trace_buf, t, hb, split, NSTAMP - 4, 0, 0)
                finish(acc_o, st, l_s, m_s, alpha_s, tx, sink, out, o_part, lse_part, t, hb, split, q_s, trace_buf,
                       NSTAMP - 3)
                stamp(trace_buf, t, hb, split, NSTAMP - 1, 0, 0)
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
                rng = T.alloc_local([5], "int32")
                slot_r = T.alloc_local([1], "int32")
                tx = T.get_thread_binding()

                T.pdl_sync()  # as the ring kernel's
                load_q(q, q_s, t, hb)
                T.clear(acc_o)
                st[0] = neg_inf
                st[1] = T.float32(0)
                tile_range(lens1, lens2, t, split, rng)
                fetch_slot(idx1, idx2, t, rng[1], rng, tx, slot_r, 0)
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
                        fetch_slot(idx1, idx2, t, rng[1] + it + 1, rng, tx, slot_r, 0)
                    T.sync_threads()  # C
                    if rng[1] + it < rng[2]:
                        if rng[1] + it < rng[0]:
                            load_fp8(kvq1, kvs1, kvr1, pg_s, off_s, nope_r, rope_r, e_r, block_size1)
                        else:
                            load_fp8(kvq2, kvs2, kvr2, pg_s, off_s, nope_r, rope_r, e_r, block_size2)
                    if it > 0:
                        attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx)
                finish(acc_o, st, l_s, m_s, alpha_s, tx, sink, out, o_part, lse_part, t, hb, split, q_s)

    # the kernel's parameters; a traced build (trace=True, benchmarks only) adds the stamps' buffer
    if trace:
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
            o_part: T.Tensor[part_shape, "bfloat16"],
            lse_part: T.Tensor[lse_shape, "float32"],
            trace_buf: T.Tensor[(num_tokens, NHB, S, NSTAMP, 2), "int64"],
        ):
            forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink, out,
                    o_part, lse_part, trace_buf)
    else:
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
            o_part: T.Tensor[part_shape, "bfloat16"],
            lse_part: T.Tensor[lse_shape, "float32"],
        ):
            forward(q, kvq1, kvs1, kvr1, idx1, lens1, kvq2, kvs2, kvr2, idx2, lens2, block_size1, block_size2, sink, out,
                    o_part, lse_part, None)

    return sparse_mla_fwd
