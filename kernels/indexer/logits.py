"""Lightning-indexer logits (DeepSeek V4 ratio-4 layers): paged decode (`indexer_decode_logits`) and ragged
prefill (`indexer_prefill_logits`), one TileLang builder for both.

Math (ref `Indexer.forward`, dsv4_kernels.md 3.6), per query token t and compressed position j:

    logits[t, j] = q_scale[t] * k_scale[j] * sum_h weights[t, h] * relu(q[t, h, :] . k[j, :])

q fp8 e4m3 [T, H, D] with one fp32 scale per token (q = q_scale * q_fp8), k fp8 e4m3 [*, D] with one fp32
scale per compressed position. Both scales must be > 0 (relu(s*x) = s*relu(x) is what lets the kernel apply
them after the relu; absmax/448 scales are). fp32 accumulation (mma.sync m16n8k32 e4m3 on SM12x).

Valid columns per token: [lo_t, hi_t). Every other column of the logits row, up to its width W, is written
-inf, so the caller may size W for CUDA-graph capture (max_model_len / ratio) and pass short requests. A decode
variant with clean=False (DeepGEMM's `clean_logits`) writes only the column tiles its tokens' ranges reach: the
top-k behind it reads [lo_t, hi_t) from row_info and nothing else, and the -inf past a short request's length
is most of the row's bytes when W is sized for the longest context.

* decode (paged): tokens come in groups of `next_n` per request (MTP: next_n = 1 + draft tokens), token
  t = b * next_n + g. `seq_lens[b]` is the request's length in (uncompressed) tokens including this step's
  next_n tokens, so token g sits at position p = seq_lens[b] - next_n + g and sees the compressed positions
  j < (p + 1) // ratio (causal, ref `Indexer.forward`). Index-K cache, DeepGEMM/vLLM fp8 paged layout: page
  bytes [page_size * D fp8 values | page_size * 4 B fp32 scales] (132 B per position for D = 128) at the start
  of each page; a page may be padded (any stride >= page_size * (D + 4) B in a multiple of 16: vLLM rounds it up
  to a multiple of 576 B). The kernel takes the same memory twice, as fp32 rows [num_pages, stride/16, 4] and as
  strided fp8 K rows [num_pages, page_size, D].
  block_table[b, i] is the physical page of compressed positions [i*page_size, (i+1)*page_size); entries past
  the request's length may be -1 (never read: the tile loop stops at the length, and tails are clamped).
* prefill (ragged): k [Nk, D] fp8 + k_scale [Nk] fp32 contiguous (the engine's gathered compressed K);
  token t sees columns [ks[t], ke[t]) of k (DeepGEMM `fp8_mqa_logits` convention), logits [T, W].

Grid: (CTAs per token group, token groups), the first from `grid_columns`: a whole number of waves of the CTAs
the SMs hold at once (`slots`), at least target_ctas = CTAS_PER_SM x the arch's SM count in all, and enough
that no CTA walks more than max_tiles tiles. Every token count fills the GPU with one variant (no per-batch
compile). A CTA stages its group's
q once, then walks the row's column tiles with a stride of the grid width: a tile no valid range of its tokens
reaches (past the request's length) is written -inf without reading K, so the grid can stay sized to W (CUDA-
graph capture) while the work follows each request's length (the public SM12x fix: 433 -> 29 us at 28K context).
Small CTAs (4 warps, 64-column tiles), several per SM, each with a 2-3 stage cp.async ring written out by hand
(T.async_copy + constant ptx_wait_group): TileLang 0.1.15's T.Pipelined cannot take the loop's dynamic trip
count. A tile's rows of one page are one copy region of the strided K view.

Also written: row_info [T, 3] int32 = (lo_t, hi_t, request index) by the CTAs of column chunk 0, which the
top-k kernel (topk.py) reads: its columns, and the block-table row to translate them through.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, ctas_by_smem, get_profile, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

FP8 = "float8_e4m3"
SCALE_BYTES = 4


# Per schedule family: (block_n, stages, threads). 4 warps along 64 columns (FullRow: each warp owns 16 columns
# and every head of its tokens, so the head reduction stays inside the warp). Shared memory on SM12x: q (group x
# heads x D fp8) + 3 stages of a K tile (64 x D) and its scales + the page list (PAGE_SLOTS): 34,560 B at next_n 1
# and 64 heads. An SM12x SM (100 KB of shared memory, 1 KB reserved per CTA) holds two such CTAs. Two stages would
# let SM12x hold three; which is faster there is unmeasured (no SM12x GPU here). Hopper: 2 stages (51,200 B with
# its f16 buffers, below), so the four CTAs the registers allow fit an SM; 3 stages fit three and were 16-46% slower
# (H100, 2026-11-24), and 4-22% slower still with the grid in whole waves of those three (3 and 4 stages, 64K and
# 256K context, batch 1-96; 64K x 8 17.1 -> 20.8 us, 256K x 64 245.7 -> 270.6: H100, 2026-11-25,
# sweep_indexer_logits --stages).
SCHEDULES = {
    "blackwell_consumer": (64, 3, 128),
    "hopper": (64, 2, 128),
    "blackwell_dc": (64, 3, 128),
}
# The tensor-core form follows the arch profile's fp8_mma_operand. SM12x: fp8 mma.sync (m16n8k32 e4m3, native).
# Hopper (its fp8 mma.sync is emulated: 47% of this kernel's instructions at 64K x 8; fp8 WGMMA accumulates with
# too few bits, per-token errors up to 1.6e-3, FP8_WGMMA): q in shared memory as f16 (converted once a CTA), each K tile
# converted to f16 once (the products and their fp32 sums are fp8's, 7e-8 apart), and f16 WGMMA (m64n64k16).
# Against the emulated fp8 mma.sync, per layer on the H100: 64K x 8 16.7 -> 13.8 us, 256K x 8 45.7 -> 35.9,
# 256K x 64 310 -> 246, prefill 2,048 tokens x 16K columns 1,214 -> 753 (f16 mma.sync alone: 15.8 / 45.2 / 320 /
# 1,077).
# CTAs aimed for per SM (registers allow ~4 at 128 threads): the grid holds at least this many an SM, in whole
# waves of what the SMs hold (`grid_columns`). MIN_BLOCKS: the CTAs per SM the registers are capped for.
CTAS_PER_SM = 4
MIN_BLOCKS = 4
# Schedule families whose WGMMA takes the fp8 operands as they are (e4m3 x e4m3 with the tensor core's own
# accumulation; 3 stages fit) instead of converting to f16. None does: on an H200 it was 16-22% faster at 64 tokens
# (64K 66.0 -> 55.5 us, 256K 216.9 -> 169.0; one call, sweep_indexer_logits.py --forms f16 fp8) but its per-token
# errors reached 1.6e-3 on the GPU cases (f16: 3e-7), above LOGITS_TOL; summing each 32- or 64-wide K chunk's WGMMA
# chain in fp32 was slower (72.5 / 58.7 us) and no better on those cases (1.1e-3 / 2.7e-3). Kept for the sweep.
FP8_WGMMA: dict[str, bool] = {}
# Paged: the physical pages of a CTA's first PAGE_SLOTS copies are read from the block table into shared memory
# once, before the ring starts, so each tile's copies wait on a shared-memory read instead of an L2 round trip
# between the conversion and the MMA (ncu on an H100, 64K x 64: that load held 17% of the logits' stall samples).
# Copies past them read the block table as before (a CTA walks 129 tiles at 256K context and 64 tokens), and so do
# the copies of a CTA with no more tiles than the ring issues before its loop (one token's), which have nothing to
# wait less for. H100, per layer (bench_indexer.py --no-torch, one call): logits 64K x 64 65.9 -> 63.8 us, 256K x 64
# 225.7 -> 221.9, 64K x 8 13.4 -> 13.2; the indexer step 70.4 -> 67.9, 245.1 -> 235.8, 22.7 -> 22.3; one token
# level (-0.1 to 0 us). Reading the list for every CTA instead cost one token up to 0.5 us (256K x 1 step 19.1 ->
# 19.6); reading it behind the ring's first copies gained less at 64 tokens (64K x 64 step 70.3 -> 68.4).
PAGE_SLOTS = 256
# Tiles one CTA walks at most: at large batch the CTAs per row grow past CTAS_PER_SM's share so no CTA walks more
# than this many (valid or -inf) tiles. Prefill keeps 32. H100, 256K-context width (1,025 tiles), batch 64: 411 us
# with 9 CTAs per row (114 tiles each), 320 us with 33 (32 each), measured before the grid came in whole waves (9 a
# row is 576 CTAs on 528 slots: a second wave); batch 8 was fastest at CTAS_PER_SM 4 (50.6 us against 52.9 at 8 and
# 55.5 at 16), benchmarks/indexer/sweep_indexer_logits.py.
MAX_TILES_PER_CTA = 32
# Decode on Hopper: the grid is sized for the logits width (max_model_len / ratio, for CUDA-graph capture), so the cap
# of 32 made every row of a 64-token batch 33 CTAs (2,112, four waves) whatever its length: at 8K context each CTA had
# one valid tile and the waves cost more than the tiles. With 1,024 a 64-token batch runs one wave (8 CTAs a row).
# Per layer on an H100 (65,600 columns, no -inf fill, 8 layers a graph), cap 32 -> 1,024: 8K context x 32 / 64 / 128
# tokens 10.6 -> 8.8, 16.7 -> 12.8, 28.7 -> 19.7 us; 64K x 32 / 64 / 128 36.1 -> 33.5, 66.9 -> 60.4, 127.7 -> 116.9;
# 256K x 64 level (227.6 / 229.8); 1, 8 and 16 tokens unchanged (their grids are set by CTAS_PER_SM). SM12x and
# sm_100a keep 32: SM12x's grid is sized for 188 SMs, which an H100 cannot judge (there, 64K x 64 85.5 -> 93.4).
DECODE_MAX_TILES_PER_CTA = {"hopper": 1024}


class _IntOps:
    """`grid_columns` on Python ints (the kernel passes TileLang's T for the same formula on its dynamic shapes)."""
    min, max = staticmethod(min), staticmethod(max)

    @staticmethod
    def ceildiv(a: int, b: int) -> int:
        return -(-a // b)

    @staticmethod
    def floordiv(a: int, b: int) -> int:
        return a // b


def grid_columns(groups, tiles, target: int, slots: int, max_tiles: int, ops=_IntOps):
    """CTAs per token group (the grid's x): the grid is a whole number of waves of `slots` (CTAs resident at once)
    with at least `target` CTAs and at least ceil(tiles / max_tiles) per group, never more than the row's tiles.
    Rounding the waves down matters: ceil(528 / 64) = 9 CTAs a row at 64 tokens is 576 CTAs on 528 slots, and
    the 48 left over ran as a second wave as long as the first; a variant that holds 3 CTAs an SM (3 stages, MTP
    rows) under a 4-an-SM target ran 1.33 waves the same way."""
    c_min = ops.ceildiv(tiles, max_tiles)
    waves = ops.max(-(-target // slots), ops.ceildiv(groups * c_min, slots))
    return ops.min(tiles, ops.max(c_min, ops.floordiv(waves * slots, groups)))


def resident_ctas(p: Mapping[str, Any], arch: ArchProfile) -> int:
    """CTAs of a logits variant one SM holds: the register cap it is compiled for (`min_blocks`) and its shared
    memory with the per-CTA reserve."""
    return max(1, min(min_blocks(p["group"] * p["heads"]), ctas_by_smem(arch, logits_smem_bytes(p))))


def min_blocks(rows: int) -> int:
    """Resident CTAs per SM the registers are capped for: 4 (128 registers) while a warp's accumulator is 16 x 64
    heads; 3 (168) for more query rows per CTA (next_n > 1, prefill's two tokens), where 128 spilled 160-480 B."""
    return MIN_BLOCKS if rows <= 64 else 3


def logits_smem_bytes(p: Mapping[str, Any]) -> int:
    """Pre-nvcc shared memory: the q tile (group * heads rows of D, in the operand type), `stages` K tiles of
    block_n x D fp8, their block_n fp32 row scales, the paged kernel's page list (PAGE_SLOTS int32), and with an
    f16 operand the converted K tile (TileLang places it last, at a 1,024-byte boundary under WGMMA: its swizzled
    descriptor's alignment). Weights and the accumulator live in registers; the head reduction stays inside a warp
    (FullRow), so TileLang adds no reduction workspace."""
    ob = 1 if p.get("operand", FP8) == FP8 else 2
    used = p["group"] * p["heads"] * p["dim"] * ob + p["stages"] * p["block_n"] * (p["dim"] + SCALE_BYTES)
    if p.get("page_size"):      # paged decode: the CTA's page list
        used += PAGE_SLOTS * 4
    if ob == 1:
        return used
    if p.get("wgmma"):
        used = -(-used // 1024) * 1024
    return used + p["block_n"] * p["dim"] * ob


def build_logits(*, paged: bool, heads: int, dim: int, group: int, block_n: int, threads: int, target_ctas: int,
                 slots: int, max_tiles: int, stages: int, page_size: int = 0, ratio: int = 0, operand: str = FP8,
                 clean: bool = True, wgmma: bool = False):
    import tilelang.language as T

    H, D, G, BN, NS = heads, dim, group, block_n, stages
    if NS < 2:
        # the ring waits for all but the newest NS - 2 tiles: one stage would wait on a negative group count
        # (garbage logits on an H100, 2026-11-24)
        raise ValueError(f"indexer logits: stages={NS}; the cp.async ring needs at least 2")
    if operand not in (FP8, "float16"):
        raise ValueError(f"indexer logits: operand={operand!r} (supported: {FP8!r}, 'float16')")
    OP = operand
    CONVERT = OP != FP8         # f16 operands: q converted once, each K tile once (Hopper: no fp8 mma.sync)
    # fp8 WGMMA reads the stage the cp.async ring wrote (generic proxy) through the async proxy: each thread fences
    # its own copies before the barrier that hands the stage to the MMA
    FENCE = wgmma and not CONVERT
    P = page_size
    acc = "float32"
    neg_inf = -T.infinity(acc)

    num_tokens = T.dynamic("num_tokens")
    width = T.dynamic("width")
    num_pages = T.dynamic("num_pages")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    num_k = T.dynamic("num_k")
    # paged: a page's stride is the cache's own, page_rows x 16 B (>= P * (D + 4) B: vLLM pads pages), and the
    # kernel reads the same bytes as K rows [pages, P, D] fp8 (strided; 16-byte aligned rows, so cp.async stays
    # 16 B wide) and as 16-byte rows of fp32 [pages, page_rows, 4], the scales from row SCALE_ROW on
    page_rows = T.dynamic("page_rows")
    SCALE_ROW = P * D // 16

    num_tiles = T.ceildiv(width, BN)
    grid_x = grid_columns(T.ceildiv(num_tokens, G), num_tiles, target_ctas, slots, max_tiles, ops=T)

    # ---- per-mode pieces (expressions only; the statements live in `body`) ----
    def bounds(tok, grp, src_a, src_b, src_c):
        """(lo, hi, request) of token `tok` in group `grp`."""
        if paged:   # src_a = seq_lens, src_b = block_table
            limit = T.min(width, max_pages * P)
            visible = T.floordiv(T.max(src_a[grp] - G + (tok - grp * G) + 1, 0), ratio)
            return 0, T.min(visible, limit), grp
        limit = T.min(width, num_k)             # src_a = ks, src_b = ke, src_c = req_idx
        lo = T.min(T.max(src_a[tok], 0), limit)
        return lo, T.max(T.min(src_b[tok], limit), lo), src_c[tok]

    def page_of(block_table, grp, pos):
        return T.max(block_table[grp, T.min(T.floordiv(pos, P), max_pages - 1)], 0)

    R = min(BN, P) if paged else BN            # rows per async copy (one page's share of a tile)
    NPT = BN // R                               # async copies per tile

    def scale_at(ks_shared, st, n):
        return ks_shared[st, n // 4, n % 4] if paged else ks_shared[st, n]

    def tile_page(src_b, bg, tile, j):
        """The physical page of copy j of tile `tile` (clamped to the cache)."""
        return T.min(page_of(src_b, bg, tile * BN + j * R), num_pages - 1)

    @T.macro
    def issue_tile(k_rows, k_b, src_b, bg, tile, k_shared, ks_shared, st, it=None, pages_s=None):
        """cp.async of tile `tile` (the CTA's `it`-th) K rows and scales into one stage (groups are committed per
        copy); paged: its pages from the CTA's page list where given and it holds them, else the block table."""
        for j in T.unroll(NPT):
            if paged:
                pg = tile_page(src_b, bg, tile, j) if pages_s is None else T.if_then_else(
                    it * NPT + j < PAGE_SLOTS, pages_s[T.min(it * NPT + j, PAGE_SLOTS - 1)],
                    tile_page(src_b, bg, tile, j))
                T.async_copy(k_rows[pg, T.floormod(tile * BN + j * R, P): T.floormod(tile * BN + j * R, P) + R, 0:D],
                             k_shared[st, j * R: j * R + R, 0:D])
                T.async_copy(k_b[pg, SCALE_ROW + T.floordiv(T.floormod(tile * BN + j * R, P), 4):
                                 SCALE_ROW + T.floordiv(T.floormod(tile * BN + j * R, P), 4) + R // 4, 0:4],
                             ks_shared[st, j * R // 4: j * R // 4 + R // 4, 0:4])
            else:
                T.async_copy(k_rows[tile * BN: tile * BN + BN, 0:D], k_shared[st, 0:BN, 0:D])
                T.async_copy(k_b[tile * BN: tile * BN + BN], ks_shared[st, 0:BN])

    @T.macro
    def body(q, q_scale, weights, k_a, k_b, src_a, src_b, src_c, logits, row_info):
        with T.Kernel(grid_x, T.ceildiv(num_tokens, G), threads=threads) as (bc, bg):
            q_shared = T.alloc_shared([G * H, D], OP)
            k_shared = T.alloc_shared([NS, BN, D], FP8)
            k_op = T.alloc_shared([BN, D], OP) if CONVERT else None
            k_reg = T.alloc_fragment([BN, D], OP) if CONVERT else None
            k_rows = k_a
            ks_frag = T.alloc_fragment([BN], acc)
            w_frag = T.alloc_fragment([G, H], acc)
            s = T.alloc_fragment([BN, G * H], acc)
            s_r = T.reshape(s, (BN, G, H))
            l_frag = T.alloc_fragment([BN, G], acc)
            lo_min = T.alloc_local([1], "int32")
            hi_max = T.alloc_local([1], "int32")
            ks_shared = T.alloc_shared([NS, BN // 4, 4] if paged else [NS, BN], acc)
            pages_s = T.alloc_shared([PAGE_SLOTS], "int32") if paged else None
            # registers capped for several resident CTAs (unbounded, nvcc took 238 at 128 threads: 2 per SM)
            T.annotate_min_blocks_per_sm(min_blocks(G * H))
            if paged:
                # the top-k kernel behind this one (programmatic dependent launch) may launch once every CTA here
                # runs; it waits for this grid to complete before it reads the logits
                T.pdl_trigger()

            lo_min[0] = 2147483647
            hi_max[0] = 0
            for g in T.serial(G):
                if bg * G + g < num_tokens:
                    lo_min[0] = T.min(lo_min[0], bounds(bg * G + g, bg, src_a, src_b, src_c)[0])
                    hi_max[0] = T.max(hi_max[0], bounds(bg * G + g, bg, src_a, src_b, src_c)[1])

            if bc == 0:
                for g in T.serial(G):
                    if bg * G + g < num_tokens:
                        row_info[bg * G + g, 0] = bounds(bg * G + g, bg, src_a, src_b, src_c)[0]
                        row_info[bg * G + g, 1] = bounds(bg * G + g, bg, src_a, src_b, src_c)[1]
                        row_info[bg * G + g, 2] = bounds(bg * G + g, bg, src_a, src_b, src_c)[2]

            for gh, d in T.Parallel(G * H, D):
                q_shared[gh, d] = T.Cast(OP, q[T.min(bg * G + gh // H, num_tokens - 1), gh % H, d])
            for g, h in T.Parallel(G, H):
                w_frag[g, h] = T.if_then_else(
                    bg * G + g < num_tokens,
                    weights[T.min(bg * G + g, num_tokens - 1), h] * q_scale[T.min(bg * G + g, num_tokens - 1)],
                    0.0)

            # the valid tiles of the group: [t_lo, t_hi); this CTA takes t_lo + bc, + gx, ... (balanced), and
            # writes -inf into its stride's tiles outside them
            gx = T.alloc_var("int32")
            t_lo = T.alloc_var("int32")
            t_hi = T.alloc_var("int32")
            nv = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            gx = grid_x
            t_lo = T.floordiv(lo_min[0], BN)
            t_hi = T.if_then_else(lo_min[0] < hi_max[0], T.ceildiv(hi_max[0], BN), t_lo)
            nv = T.if_then_else(t_lo + bc < t_hi, T.ceildiv(t_hi - t_lo - bc, gx), 0)
            if clean:
                for i in T.serial(T.ceildiv(num_tiles - bc, gx)):
                    c0 = (bc + i * gx) * BN
                    if c0 < t_lo * BN or c0 >= t_hi * BN:
                        for g, n in T.Parallel(G, BN):
                            if bg * G + g < num_tokens and c0 + n < width:
                                logits[bg * G + g, c0 + n] = neg_inf

            # valid tiles through an NS-stage cp.async ring (T.Pipelined cannot take the loop's dynamic trip count;
            # the waits here are constants). fp8 operands (SM12x): the MMA reads the stage, so tile i's stage is
            # refilled only once tile i is computed, and tiles i + 1 .. i + NS - 1 fly during its math. Converted
            # operands (Hopper): the stage is free as soon as tile i is converted, so it is refilled with tile
            # i + NS before the MMA: NS tiles fly during the math with the same shared memory.
            AHEAD = NS if CONVERT else NS - 1     # tiles the ring issues before its loop
            if paged:
                if nv > AHEAD:
                    # the page list, before the first copies (which read it too); a CTA whose tiles all fit the
                    # ring's first issue (one token's: two tiles) reads the block table instead, as it has no wait
                    # to save
                    for t in T.Parallel(PAGE_SLOTS):
                        if t < nv * NPT:
                            pages_s[t] = tile_page(src_b, bg, t_lo + bc + (t // NPT) * gx, t % NPT)
                    T.sync_threads()
                    for st in T.serial(AHEAD):
                        issue_tile(k_rows, k_b, src_b, bg, t_lo + bc + st * gx, k_shared, ks_shared, st, st,
                                   pages_s)
                else:
                    for st in T.serial(AHEAD):
                        if st < nv:
                            issue_tile(k_rows, k_b, src_b, bg, t_lo + bc + st * gx, k_shared, ks_shared, st)
            else:
                for st in T.serial(AHEAD):
                    if st < nv:
                        issue_tile(k_rows, k_b, src_b, bg, t_lo + bc + st * gx, k_shared, ks_shared, st)
            for i in T.serial(nv):
                c0 = (t_lo + bc + i * gx) * BN
                if CONVERT:
                    if i + NS - 1 < nv:
                        T.ptx_wait_group((NS - 1) * 2 * NPT)
                    else:
                        T.ptx_wait_group(0)
                    T.sync_threads()
                    for n in T.Parallel(BN):
                        ks_frag[n] = scale_at(ks_shared, T.floormod(i, NS), n)
                    # converted into registers, then stored: k_shared and k_op are one merged buffer to nvcc, which
                    # cannot move a load past a store that may alias it, so a fused loop waited on each 8-byte
                    # load in turn (ncu, H100, 64K x 64: those 8 conversions held 29% of the stall samples). Here
                    # a thread's eight loads fly together. 8 elements a chunk keeps the f16 stores' layout free of
                    # bank conflicts (16 made them two-way). H100, per layer (bench_indexer.py --no-torch,
                    # alternated twice in one call): logits 64K x 64 63.7 -> 62.5 us, 256K x 64 219.9 -> 212.3;
                    # the indexer step 68.0 -> 66.1, 236.9 -> 230.1, 64K x 8 22.3 -> 22.0, one token 0.15-0.3 faster;
                    # prefill (64K context, 8,192 tokens) 4,773 -> 4,547
                    for n, d in T.Parallel(BN, D, coalesced_width=T.int32(8)):
                        k_reg[n, d] = T.Cast(OP, k_shared[T.floormod(i, NS), n, d])
                    for n, d in T.Parallel(BN, D):
                        k_op[n, d] = k_reg[n, d]
                    T.sync_threads()
                    if i + NS < nv:
                        issue_tile(k_rows, k_b, src_b, bg, t_lo + bc + (i + NS) * gx,
                                   k_shared, ks_shared, T.floormod(i, NS), i + NS, pages_s)
                    T.gemm(k_op, q_shared, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                else:
                    if i + NS - 2 < nv:
                        T.ptx_wait_group((NS - 2) * 2 * NPT)
                    else:
                        T.ptx_wait_group(0)
                    if FENCE:
                        T.fence_proxy_async()
                    T.sync_threads()
                    if i + NS - 1 < nv:
                        issue_tile(k_rows, k_b, src_b, bg, t_lo + bc + (i + NS - 1) * gx,
                                   k_shared, ks_shared, T.floormod(i + NS - 1, NS), i + NS - 1, pages_s)
                    for n in T.Parallel(BN):
                        ks_frag[n] = scale_at(ks_shared, T.floormod(i, NS), n)
                    T.gemm(k_shared[T.floormod(i, NS), :, :], q_shared, s, transpose_B=True, clear_accum=True,
                           policy=T.GemmWarpPolicy.FullRow)
                for n, g, h in T.Parallel(BN, G, H):
                    s_r[n, g, h] = T.max(s_r[n, g, h], 0.0) * w_frag[g, h]
                T.reduce_sum(s_r, l_frag, dim=-1, clear=True)
                # the column's K scale once per (column, token) after the head sum, not once per head
                for g, n in T.Parallel(G, BN):
                    if bg * G + g < num_tokens and c0 + n < width:
                        logits[bg * G + g, c0 + n] = T.if_then_else(
                            c0 + n >= bounds(bg * G + g, bg, src_a, src_b, src_c)[0]
                            and c0 + n < bounds(bg * G + g, bg, src_a, src_b, src_c)[1],
                            l_frag[n, g] * ks_frag[n], neg_inf)

    if paged:
        @T.prim_func
        def indexer_decode_logits(
            q: T.Tensor[(num_tokens, H, D), FP8],
            q_scale: T.Tensor[(num_tokens,), "float32"],
            weights: T.Tensor[(num_tokens, H), "float32"],
            kv_f32: T.Tensor[(num_pages, page_rows, 4), "float32"],
            kv_fp8: T.StridedTensor[(num_pages, P, D), (page_rows * 16, D, 1), FP8],
            seq_lens: T.Tensor[(batch,), "int32"],
            block_table: T.Tensor[(batch, max_pages), "int32"],
            logits: T.Tensor[(num_tokens, width), "float32"],
            row_info: T.Tensor[(num_tokens, 3), "int32"],
        ):
            body(q, q_scale, weights, kv_fp8, kv_f32, seq_lens, block_table, None, logits, row_info)

        return indexer_decode_logits

    @T.prim_func
    def indexer_prefill_logits(
        q: T.Tensor[(num_tokens, H, D), FP8],
        q_scale: T.Tensor[(num_tokens,), "float32"],
        weights: T.Tensor[(num_tokens, H), "float32"],
        k: T.Tensor[(num_k, D), FP8],
        k_scale: T.Tensor[(num_k,), "float32"],
        ks: T.Tensor[(num_tokens,), "int32"],
        ke: T.Tensor[(num_tokens,), "int32"],
        req_idx: T.Tensor[(num_tokens,), "int32"],
        logits: T.Tensor[(num_tokens, width), "float32"],
        row_info: T.Tensor[(num_tokens, 3), "int32"],
    ):
        body(q, q_scale, weights, k, k_scale, ks, ke, req_idx, logits, row_info)

    return indexer_prefill_logits


class _LogitsSpec(KernelSpec):
    paged = False
    arg_names: tuple = ()
    # per schedule family, the tiles one CTA walks at most where it is not MAX_TILES_PER_CTA
    max_tiles_by_family: Mapping[str, int] = {}

    def _common(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> dict:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        heads = int_param(self.name, static, "heads", allowed=(8, 16, 32, 64))
        dim = int_param(self.name, static, "dim", allowed=(64, 128))
        block_n, stages, threads = SCHEDULES[arch.family]
        fp8_wgmma = arch.has_wgmma and FP8_WGMMA.get(arch.family, False)
        operand = FP8 if fp8_wgmma else arch.fp8_mma_operand
        return {"heads": heads, "dim": dim, "block_n": block_n, "stages": stages, "threads": threads,
                "operand": operand, "wgmma": arch.has_wgmma and (fp8_wgmma or operand != FP8),
                "target_ctas": CTAS_PER_SM * arch.num_sms_hint,
                "max_tiles": self.max_tiles_by_family.get(arch.family, MAX_TILES_PER_CTA)}

    @staticmethod
    def _with_slots(p: dict, arch: ArchProfile) -> dict:
        # the CTAs the arch's SMs hold at once, once the group (rows a CTA) is known
        p["slots"] = resident_ctas(p, arch) * arch.num_sms_hint
        return p

    def smem_bytes(self, variant: Variant) -> int:
        return logits_smem_bytes(variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = dict(get_profile(variant.schedule).pass_configs)
        cfg["tl.disable_vectorize_256"] = True  # 16-byte vectors only: the SM12x schedule proven on sm_90a
        # WGMMA only where the variant asks for it (Hopper's f16 form)
        cfg["tl.disable_wgmma"] = not variant.p.get("wgmma", False)
        if self.paged:
            # every paged index is in range by construction (pages clamped to the cache, rows within a page),
            # so TileLang's per-access guards (a predicate on each cp.async) are dead code; the ragged kernel
            # keeps them: its last tile's copy runs past num_k and is zero-filled by them
            cfg["tl.disable_safe_memory_legalize"] = True
            # the kernel places its own barriers (after each tile's wait, after the f16 conversion, after the page
            # list); TileLang's planner sees one merged shared buffer and added two more a tile (H100, indexer step,
            # alternated twice in one call: 64K x 64 68.1 -> 68.0 us, the rest within 0.3 either way; the SM120
            # schedule on the H100, one run: 64K x 64 92.0 -> 91.7, 256K x 8 58.1 -> 57.1, one token up to 0.15
            # slower)
            cfg["tl.disable_thread_storage_sync"] = True
        return cfg


@register
class IndexerDecodeLogitsSpec(_LogitsSpec):
    """Paged decode logits. Statics: heads, dim, page_size, ratio, next_n (1 + MTP draft tokens), clean (write -inf
    outside the tiles the tokens' ranges reach: the public logits op; indexer_decode_topk's top-k reads only the
    ranges)."""
    name = "indexer_decode_logits"
    paged = True
    max_tiles_by_family = DECODE_MAX_TILES_PER_CTA
    arg_names = ("q", "q_scale", "weights", "kv_f32", "kv_fp8", "seq_lens", "block_table", "logits", "row_info")

    def static_params(self, model, parallel) -> dict[str, Any]:
        # next_n, page_size and clean are per call site: family.uses lists them
        return {"heads": int(model.index_n_heads), "dim": int(model.index_head_dim), "ratio": 4}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        p = self._common(arch, static, num_tokens)
        next_n = int_param(self.name, static, "next_n", allowed=(1, 2, 3, 4))
        page_size = int_param(self.name, static, "page_size", allowed=(16, 32, 64, 128, 256))
        ratio = int_param(self.name, static, "ratio")
        if p["block_n"] % page_size and page_size % p["block_n"]:
            raise ValueError(f"{self.name}: page_size={page_size} and block_n={p['block_n']} do not nest")
        if page_size * SCALE_BYTES % p["dim"]:
            raise ValueError(f"{self.name}: page_size={page_size} at dim={p['dim']}: a page of "
                             f"{page_size * (p['dim'] + SCALE_BYTES)} B is not a whole number of {p['dim']}-byte K "
                             f"rows (the kernel's copy view); use a page size that is a multiple of {p['dim'] // SCALE_BYTES}")
        clean = static.get("clean", True)
        if not isinstance(clean, bool):
            raise ValueError(f"{self.name}: clean must be a bool, got {clean!r}")
        p.update(group=next_n, page_size=page_size, ratio=ratio, clean=clean)
        return Variant.make(self.name, self._with_slots(p, arch), arch, schedule_name(arch))

    def build(self, variant: Variant):
        p = variant.p
        return build_logits(paged=True, heads=p["heads"], dim=p["dim"], group=p["group"], block_n=p["block_n"],
                            stages=p["stages"], threads=p["threads"], target_ctas=p["target_ctas"],
                            slots=p["slots"], max_tiles=p["max_tiles"], page_size=p["page_size"], ratio=p["ratio"],
                            operand=p.get("operand", FP8), clean=p["clean"],
                            wgmma=p.get("wgmma", False))


# Prefill query tokens per CTA: two tokens x 64 heads = 128 B-operand rows (the tilelang example's
# block_Q = 128 // heads): each K tile staged serves both.
def prefill_group(heads: int) -> int:
    return max(1, 128 // heads)


@register
class IndexerPrefillLogitsSpec(_LogitsSpec):
    """Ragged prefill logits over a contiguous compressed K. Statics: heads, dim."""
    name = "indexer_prefill_logits"
    arg_names = ("q", "q_scale", "weights", "k", "k_scale", "ks", "ke", "req_idx", "logits", "row_info")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"heads": int(model.index_n_heads), "dim": int(model.index_head_dim)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        p = self._common(arch, static, num_tokens)
        p.update(group=prefill_group(p["heads"]))
        return Variant.make(self.name, self._with_slots(p, arch), arch, schedule_name(arch))

    def build(self, variant: Variant):
        p = variant.p
        return build_logits(paged=False, heads=p["heads"], dim=p["dim"], group=p["group"], block_n=p["block_n"],
                            stages=p["stages"], threads=p["threads"], target_ctas=p["target_ctas"],
                            slots=p["slots"], max_tiles=p["max_tiles"], operand=p.get("operand", FP8),
                            wgmma=p.get("wgmma", False))
