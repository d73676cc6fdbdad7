"""MXFP4 grouped expert GEMM (DeepSeek V4's routed experts, dsv4_kernels.md 1 and 3.11): FP8 activations x FP4
e2m1 weights, the tokens of every expert in one launch.

    C[r, :] bf16 = sum over 32-wide K slices s of  sa[r, s // 4] * 2^(sb[e, n, s] - 127) * (A[r, s] . W_e[n, s])

  A   fp8 e4m3 [M, K]: the routed rows (token copies) sorted by expert, each expert's rows padded up to a
      multiple of block_m (ops.moe_align builds that layout); sa fp32 [M, K / 128] their 1x128 UE8M0 scales
      (act_quant_fp8 writes them).
  W   uint8 [E, N, K / 2]: e2m1 pairs as vLLM stores the checkpoint's float4_e2m1fn_x2 (element 2j in bits 0-3,
      element 2j + 1 in bits 4-7; bit 3 of a nibble is the sign), read by the kernel as int32 words [E, N, K / 8];
      sb uint8 [E, N, K / 32]: UE8M0 exponents of the 1x32 weight scales (2^(sb - 127)).
  block_expert int32 [M / block_m]: the expert of each block of block_m rows, -1 for a padding block (its rows
      are written 0 and nothing is read for it: a CUDA-graph-sized M costs only its real blocks).

Every e2m1 value (0, 0.5 .. 6) is exact in e4m3, so each 32-wide slice runs as one fp8 mma.sync m16n8k32 over
exact operands with fp32 accumulation, and the two scales (per routed row, per weight row and slice) are applied
to the slice's partial in fp32: the same math as the reference's fp4_gemm (block_K 32), with no rounding but the
tensor cores' fp32 sums and the bf16 store. The native block-scaled FP4 MMA of sm_120a is not used (not provable
on the GPUs this project can run).

The weights are dequantized in registers, straight into the tensor cores' operands: dequantizing each weight tile
into shared memory for T.gemm to read back is instruction-bound at decode sizes, where an expert block holds 1-3
real rows. How:
  * the weight is the mma's A operand (m16 tiles of weight rows) and the block_m routed rows are B (block_m / 8 n8
    halves), so one dequantized fragment serves every half; a C element's weight scale is its row's;
  * an e2m1 nibble (s, e1 e0, m) with s placed at bit 7 and e1 e0 m at bits 4-2 is an e4m3 byte equal to the
    nibble's value times 2^-6, normal and subnormal codes alike (bit placement: two shifts, a mask and a select make
    four bytes), and one exact multiply by 2^6 an output undoes it;
  * the K order inside a 32-wide slice is permuted so that one packed int32 word (8 weights of a row) is exactly a
    lane's two A registers: mma k 4g..4g+3 <-> elements 8g, 8g+2, 8g+4, 8g+6 and mma k 16+4g..16+4g+3 <-> 8g+1,
    8g+3, 8g+5, 8g+7, for the lane with g = lane % 4. The activations' B registers follow the same map: the 8 bytes
    at 8g of the slice, one 64-bit shared load, even and odd bytes gathered by two byte permutes. The dot product is
    a sum over k, so the result is exact as before;
  * each warp owns every 4th K block (split-K across the CTA's warps) with a cp.async ring of its own: no barrier
    in the main loop but __syncwarp; the warps' partial tiles are summed once through shared memory at the end;
  * the ring is swizzled so the lanes' shared loads are conflict-free (weights: 16-byte chunk c of row r at
    c ^ ((r >> 1) & 3); activations: chunk c of row t at c ^ 2 (t & 3)).
Hand-written mma.sync (tl::mma_sync) and cp.async; TileLang's automatic barriers are off (every barrier is
written here).

Hopper's form for blocks of 16+ rows (`operand` "float16"): sm_90a has fp8 only in WGMMA, and ptxas emulates mma.sync
e4m3 (both operands unpacked to f16 before two HMMA m16n8k16 and fp32 adds, every mma), so with 2+ n8 halves it would
unpack each weight fragment once per half. 8-row blocks (up to 256 tokens: one half, each fragment unpacked once)
run the e4m3 form on Hopper too: per layer on an H200, 8 layers a graph, against the f16 form (both 2 stages a warp)
V4-Flash w1+w3 121.4 -> 118.6 us at 8 tokens, 555.4 -> 538.5 at 64; w2 64.4 -> 62.4, 280.3 -> 269.3; V4-Pro TP 8
w1+w3 232.6 -> 215.5 at 64 (with the 4-stage rings the f16 form had there), level at one token. Every e2m1 and e4m3 value is exact in f16, so
that form converts once, to f16, and runs two f16 m16n8k16 mma.sync a slice. A weight nibble (s, e1 e0, m) becomes
an f16 by bit placement alone: s at bit 15 and e1 e0 m at bits 11-9 is the nibble's value times 2^-14, normal and
subnormal codes alike, so a shift and a mask of the word place two nibbles (i, i + 4) into one f16x2 register and
the 2^14 is applied once to each output. The activations' bytes are paired the same way, (i, i + 4), by one byte
permute, then cvt e4m3x2 -> f16x2, once a K block for every weight tile. For the lane with g = lane % 4, step s
(k 16s..16s+15) holds k 16s+2g, +1 <-> elements 8g+2s, 8g+2s+4 and k 16s+2g+8, +9 <-> 8g+2s+1, 8g+2s+5, for the
weight rows (A) and the routed rows (B) alike. Products and fp32 sums are the e4m3 form's. (Going through the e4m3
form's byte permutes to f16 high bytes costs 6 more instructions a word, most of the issue slots at one token.)

Launched behind its producer by programmatic dependent launch (PDL): the CTAs wait in the grid dependency sync before
they read anything, and let the kernel behind them launch once their main loop is done (its CTAs then wait in their
own sync while these reduce and store). Per layer on an H100, 8 layers a graph, against the same kernel without PDL:
0.5-0.6 us faster at one token (V4-Flash w1+w3 25.9 -> 25.3, w2 16.0 -> 15.4; V4-Pro TP 8 w2 10.0 -> 9.5) and at 8
tokens on V4-Pro (w2 34.5 -> 33.9), level elsewhere; V4-Pro's w1+w3 at one token (72 CTAs of 8 warps) went
13.5 -> 12.9 with one routing and 13.5 -> 13.9 with another. A trigger at the start instead was slower (13.5 ->
16.8: every layer's grid resident at once). `pdl=False` builds the kernel without it (`bench_moe.py --no-pdl`).

Grid (N / block_n, M / block_m); N and K are compile-time, M and E dynamic. `select` depends on the token count
only (never on routing): block_m 8 up to 256 tokens (an expert sees 1-6 rows on average at V4's 6-of-256
routing), 16 up to 512, then 32, then 64, so the planner enumerates every variant an engine asks for. An 8-row
block is one n8 half: at decode most of a 16-row block's second half is padding, and its MMAs, its activation bytes
and its scale FMAs would be spent on zeros; 16 rows win again from 384 tokens, where an expert's rows spill into a
second 8-row block that reads its weights again.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, schedule_name
from dsv4_jit.spec import Variant, register
from dsv4_jit.validate import int_param

from .spec_base import MoeKernelSpec

FP8 = "float8_e4m3"
SLICE = 32                 # weight scale group along K and the K of one mma
ACT_BLOCK = 128            # activation scale group along K; one ring stage is one such K block
ROWS = (8, 16, 32, 64)     # routed rows per block (block_m): 1, 2, 4 or 8 n8 halves per weight fragment
ROW_WORDS = ACT_BLOCK // 8          # int32 words of one weight row per K block (64 B)
TOK_WORDS = ACT_BLOCK // 4          # words of one activation row per K block (128 B)
MMA_FP8 = ("tl::mma_sync<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, "
           "16, 8, 32, false, true>")
MMA_F16 = ("tl::mma_sync<tl::DataType::kFloat16, tl::DataType::kFloat16, tl::DataType::kFloat32, "
           "16, 8, 16, false, true>")
# SM12x's e4m3 form: the even nibbles of a word (0, 2, 4, 6) -> the four bytes of one register, the odd ones
# (1, 3, 5, 7) -> another (bit placement, x 2^-6): the word's shifts for the magnitudes and for the signs (a negative
# shift is a right shift): about 5 instructions fewer than a byte-permute table and a sign fix-up.
E4M3_QUAD_SHIFTS = ((2, 4), (-2, 0))
E4M3_MAG_MASK, E4M3_SIGN_MASK = 0x1C1C1C1C, 0x80808080
E4M3_UNSCALE = 2.0 ** 6
# Hopper's f16 form: nibble i and i + 4 of a word -> one f16x2 (bit placement, x 2^-14): the word's shift and the
# shift that brings its sign bits to 15 / 31, per pair i (a negative shift is a right shift)
F16_PAIR_SHIFTS = ((9, 12), (5, 8), (1, 4), (-3, 0))
F16_MAG_MASK, F16_SIGN_MASK = 0x0E000E00, 0x80008000
F16_UNSCALE = 2.0 ** 14
# e4m3 pair -> f16x2 (PTX cvt, sm_89+): the low byte's value in the low half
_CVT_SRC = """
__device__ __forceinline__ unsigned dsv4_e4m3x2_f16x2(unsigned v) {
  unsigned r;
  unsigned short s = (unsigned short)(v & 0xFFFFu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(s));
  return r;
}
"""
# Token-count thresholds of the row-block sizes (see the module doc).
BLOCK_M_BY_TOKENS = ((256, 8), (512, 16), (2048, 32))
BLOCK_M_LARGE = 64
# cp.async stages a warp: 2 is best or close to it at every decode size. 4 (Hopper, where two 4-warp CTAs still fit
# an SM) was 2-4% slower per layer on an H200 at 8 and 64 tokens (V4-Flash w1+w3 at 64: 538.5 -> 561.9 us, e4m3
# operands; 555.4 -> 582.0 with f16 ones)
STAGES = 2


def moe_block_m(num_tokens: int) -> int:
    for limit, bm in BLOCK_M_BY_TOKENS:
        if num_tokens <= limit:
            return bm
    return BLOCK_M_LARGE


# Warps a CTA splits K over, by routed rows (each warp its own ring). Eight warps a CTA (twice the bytes in flight,
# half the chain) are no faster in general: Hopper holds two 92 KB CTAs an SM against four 51 KB ones. Where a warp's
# K walk is the longest (more than LONG_K_BLOCKS K blocks: V4-Pro's w1+w3, K = 7,168) and the tokens few (up to
# FEW_TOKENS), Hopper runs eight where it does not take the narrow tiles below: on an H100, per layer, 8 layers a
# graph, V4-Pro TP 8 w1+w3 15.5 -> 13.5 us at one token and 63.9 -> 58.9 at 8. V4-Flash lost with eight at one
# token (w1+w3, K = 4,096: 25.8 -> 28.2; w2: 16.0 -> 17.1: 384 CTAs in two waves of 92 KB ones instead of one of
# 51 KB ones) and gained 2-4% at 8, so it keeps four, as does SM12x (unmeasured there). Sixteen (V4-Pro TP 8 w1+w3 at
# one token, 181 KB CTAs) were slower again on an H200: 13.4 -> 13.9 us.
WARPS_BY_ROWS = {8: 4, 16: 4, 32: 4, 64: 4}
FEW_TOKENS = 8
LONG_K_BLOCKS = 32
LONG_K_WARPS = 8
MAX_WARPS = 8


def cta_warps(k: int, rows: int, long_walk: bool = False) -> int:
    """Warps of a CTA: one per K block up to WARPS_BY_ROWS, or LONG_K_WARPS for a long K walk at a few tokens on
    Hopper (w2 at TP 8 has 2-3 K blocks)."""
    return max(1, min(LONG_K_WARPS if long_walk else WARPS_BY_ROWS[rows], k // ACT_BLOCK))


# Wide tiles: WIDE_COLS weight rows a CTA (8-row blocks: 8 x 128 accumulators a CTA) from WIDE_FROM_TOKENS where a
# warp's K walk is one K block (at most SHORT_K_BLOCKS blocks, one warp each: w2 at TP 4 / 8, K = 512 / 256 / 384):
# half the CTAs, each with the same fixed costs (its block's expert, exponents and activation rows). V4-Pro TP 8 w2
# per layer on an H100: 4-8% faster from 32 to 256 tokens (T = 64: 167 -> 158 us), level at 16, slower at 1 and 8.
WIDE_COLS = 128
WIDE_FROM_TOKENS = 32
SHORT_K_BLOCKS = 4


# Narrow tiles: NARROW_COLS weight rows a CTA of 4 warps for a long K walk (more than LONG_K_BLOCKS K blocks) over
# a narrow N (at most NARROW_MAX_N: V4-Pro's w1+w3 at TP 4 / 8) at NARROW_TOKENS (inclusive), on Hopper: twice the
# CTAs of 64-column ones, each with half the weight exponents to stage. Per layer on an H100, 8 layers a graph, against
# 64 columns (8 warps up to 8 tokens): N = 768 at 2 tokens 24.6 -> 19.3 us, 8: 59.0 -> 57.5, 16: 103.7 -> 100.3;
# N = 1,536 at 2: 35.1 -> 33.6, 8: 103.7 -> 102.1, 16: 192.8 -> 189.0. Wider N gained at 2 tokens only (N = 3,072
# 61.3 -> 57.5) and lost at 16 (368.9 -> 376.3; N = 6,144: 712.3 -> 733.4). One token keeps 8 warps x 64 columns
# (12.8 against 13.3 us with 32 columns at N = 768). From NARROW_WARPS_FROM up to FEW_TOKENS tokens they take 8 warps
# (H100, V4-Pro w1+w3, against 4: TP 8 at 5 / 8 tokens 41.1 -> 37.2 / 57.4 -> 54.2 us; TP 4 level at 5 (66.3),
# 100.6 -> 98.8 at 8).
NARROW_COLS = 32
NARROW_TOKENS = (2, 16)
NARROW_MAX_N = 1536
NARROW_WARPS_FROM = 5


# Mid K walks (MID_K_BLOCKS K blocks, inclusive: w2 at TP 1) at MID_TOKENS tokens on Hopper: MID_COLS weight rows a CTA
# with MID_STAGES cp.async stages a warp. H100, per layer, against 64 x 4 warps x 2 stages (sweep_moe_tiles.py, 3
# rounds): V4-Flash w2 TP 1 at 8 / 16 tokens 74.4 -> 72.2 / 128.8 -> 126.0 us, V4-Pro 197.2 -> 190.5 / 369.8 ->
# 356.6; at TP 2 V4-Flash (8 K blocks) was slower (41.7 -> 43.7 / 69.0 -> 74.8) and V4-Pro (12) level.
MID_COLS = 32
MID_STAGES = 3
MID_TOKENS = (5, 16)
MID_K_BLOCKS = (16, 24)


# One token, short K walks (at most SHORT_K_BLOCKS K blocks, one warp each: w2 at TP 4 / 8): ONE_TOKEN_COLS weight rows a
# CTA, twice the CTAs of 64-column ones, each with half the fixed work ahead of its single K block. Per layer on an H100,
# 8 layers a graph, against 64 columns (two runs each): V4-Pro TP 8 w2 9.5 -> 8.8 us, its SM12x schedule 9.4 -> 8.6;
# V4-Flash TP 8 w2 5.7 -> 5.4 (both schedules), TP 4 7.7 -> 7.2. From 2 tokens level, at 4 and 8 slower (V4-Pro TP 8
# w2 at 8 tokens: 33.8 -> 37.6). 16 columns (one m16 tile a CTA) were slower again: V4-Pro TP 8 w2 8.8 -> 9.1-9.2,
# SM12x schedule 8.6 -> 9.0, V4-Flash TP 8 level.
ONE_TOKEN_COLS = 32


# Weight rows (output columns) per CTA by routed rows: four m16 tiles, two for 64 routed rows (a lane's
# accumulators are cols x rows / 32 twice over: 64 x 64 would not fit its registers).
COLS_BY_ROWS = {8: 64, 16: 64, 32: 64, 64: 32}
TILE_COLS = (16, 32, 48, 64, 96, 128)


# A few tokens on Hopper (up to SPREAD_TOKENS), K walks past SHORT_K_BLOCKS: the grid is TOPK_EXPERTS x tokens x N /
# cols CTAs at most (a token's experts are distinct; tokens rarely share one among V4's 256 / 384), few enough that
# how they spread over the SMs sets the time. Where the tile moe_params's other rules chose leaves its busiest SM at most
# SPREAD_MAX_PER_SM CTAs, the tile of SPREAD_TILES whose busiest SM walks the fewest weight rows (CTAs an SM x cols)
# replaces it (the chosen tile on a tie, else the wider: fewer CTAs, each with the same fixed work), and where that
# grid is at most one CTA an SM, the CTA takes SPREAD_WARPS warps (more loads in flight on an SM that has nothing else
# to run). Per layer on an H200, 8 layers a graph, against the tile it replaces, medians of 3 alternated runs in one
# call (benchmarks/moe/sweep_moe_tiles.py --ab): one token, V4-Pro w1+w3 (K = 7,168) TP 8 (N = 768) 12.13 -> 10.68
# us with 48 columns, TP 4 21.21 -> 16.60 with 96, TP 2 31.36 -> 26.12 with 48, TP 1 49.48 -> 47.77 with 96;
# V4-Flash w1+w3 (K = 4,096) TP 8 (N = 512) 9.44 -> 6.58 with 32 columns x 8 warps, TP 4 10.07 -> 8.88 with 8 warps,
# TP 2 13.89 -> 12.21 with 32. Two to four tokens: V4-Pro TP 8 28.38 -> 24.86 at 4 (48 columns), TP 4 26.72 -> 24.55
# at 2 (48), TP 2 49.43 -> 48.32 at 2 (96); V4-Flash TP 8 10.14 -> 8.86 at 2 (8 warps), 13.56 -> 11.94 at 3 and
# 13.96 -> 12.36 at 4 (32 columns), TP 4 13.94 -> 12.30 at 2 and 18.14 -> 17.74 at 3, TP 2 30.46 -> 28.41 at 3.
# Past the cap it lost (an earlier sweep, same method): V4-Pro's w2 (N = 7,168, 6+ CTAs an SM) with 32 columns 1%
# slower at one token at TP 1 and 5-15% from two tokens, V4-Pro TP 1 w1+w3 at 4 tokens about 9% (32 columns x 8
# warps). SM12x keeps its tiles (unmeasured there: its grid spreads over another SM count).
TOPK_EXPERTS = 6               # V4's routed experts a token (V4-Flash and V4-Pro alike)
SPREAD_TOKENS = 4
SPREAD_MAX_PER_SM = 5
SPREAD_TILES = (128, 96, 64, 48, 32)
SPREAD_WARPS = 8


def block_cols(rows: int) -> int:
    return COLS_BY_ROWS[rows]


def busiest_rows(n: int, cols: int, num_tokens: int, num_sms: int) -> int:
    """Weight rows the busiest SM walks when a few tokens' grid of `cols`-column CTAs spreads over num_sms SMs."""
    return -(-(TOPK_EXPERTS * num_tokens * n // cols) // num_sms) * cols


def spread_cols(n: int, cols: int, num_tokens: int, num_sms: int) -> int:
    """A few tokens' column tile for N on num_sms SMs: `cols` (the tile the other rules chose) unless a tile of
    SPREAD_TILES leaves the busiest SM fewer weight rows; the fewest rows, the wider tile on a tie (`cols` on a tie
    with it)."""
    best = (busiest_rows(n, cols, num_tokens, num_sms), 0, -cols)
    for c in SPREAD_TILES:
        if n % c == 0:
            best = min(best, (busiest_rows(n, c, num_tokens, num_sms), 1, -c))
    return -best[2]


def red_pitch(cols: int) -> int:
    """fp32 words per row of a warp's partial tile: cols + 4 puts a lane quad's rows in banks 8g + r."""
    return cols + 4


def stage_words(rows: int, cols: int) -> int:
    """One ring stage of a warp: a K block of the CTA's weight rows and of the block's routed rows."""
    return cols * ROW_WORDS + rows * TOK_WORDS


def warp_words(rows: int, cols: int, stages: int) -> int:
    """A warp's ring, which also holds its partial tile (rows x red_pitch fp32) at the end."""
    return max(stages * stage_words(rows, cols), rows * red_pitch(cols))


def scale_layout(k: int) -> tuple[int, int, int]:
    """Where a CTA keeps its weight exponents and activation scales in shared memory: the cp.async width of an
    exponent row (K / 32 bytes), the row pitch in bytes (padded by one chunk: rows r = 0..7 of a tile land in distinct
    banks) and the scales' row pitch in words (padded by one)."""
    ks = k // SLICE
    chunk = 16 if ks % 16 == 0 else 4
    return chunk, ks + chunk, k // ACT_BLOCK + 1


def scales_smem_bytes(k: int, rows: int, cols: int) -> int:
    """The CTA's weight exponents (one byte per row and slice) and activation scales (fp32), padded as scale_layout."""
    _, sw_pitch, sa_pitch = scale_layout(k)
    return cols * sw_pitch + 4 * rows * sa_pitch


def moe_smem_bytes_for(k: int, stages: int, rows: int, cols: int, warps: int) -> int:
    """Pre-nvcc shared memory: each warp's ring (stages x a K block of the CTA's weight rows and routed rows; the
    warps' partial tiles reuse it at the end), the CTA's weight exponents and activation scales."""
    return 4 * warps * warp_words(rows, cols, stages) + scales_smem_bytes(k, rows, cols)


def moe_smem_bytes(p: Mapping[str, Any]) -> int:
    if p.get("operand") == WGMMA:
        return wgmma_smem_bytes(p["k"], p["stages"])
    return moe_smem_bytes_for(p["k"], p["stages"], p["block_m"], p["block_n"], p["threads"] // 32)


# Hopper's WGMMA form (operand WGMMA; 8-row blocks, 64 weight rows a CTA of one warp group): the warp group walks every
# K block of its rows through one cp.async ring of `stages` K blocks (64 rows x 64 B of weight + 8 routed rows x 128
# B), each warp converting its 16 rows' e2m1 words to e4m3 in registers as the mma.sync form does (the same permuted K
# order), which are the A operand of wgmma m64n8k32 (A from registers, f32 accumulators, one a 32-wide slice); B is
# the routed rows' bytes, permuted to that K order into a shared tile in the canonical no-swizzle K-major layout
# ([16-byte K chunk][row][16 B]). ptxas emulates mma.sync e4m3 on Hopper (each mma's operands unpacked to f16); wgmma
# runs e4m3 natively. Hopper takes it for 8-row blocks where K is at most WGMMA_MAX_K_BLOCKS K blocks (w2 at TP 4 / 8:
# K = 256 / 384 / 512 / 768), 2 stages at one token and 3 above. Per layer on an H200, 8 layers a graph, against the
# mma.sync pick, 2 runs each in one call (benchmarks/moe/sweep_moe_tiles.py --tp 4 8 --gemm w2 --wgmma 2 3 4): V4-Pro
# TP 8 w2 8.4 -> 6.8 us at one token, 18.4 -> 14.6 at 4, 31.0 -> 24.2 at 8, 88 -> 76 at 32, 146 -> 127 at 64, 221 ->
# 197 at 256; V4-Pro TP 4 11.9 -> 9.9, 28.5 -> 26.1, 51 -> 47, 170 -> 153, 274 -> 246, 427 -> 397; V4-Flash TP 4 level
# at one token, 3-10% faster from 4 tokens (23.0 -> 21.3 at 8, 113 -> 105 at 256); V4-Flash TP 8 4.9 -> 4.7, 9.6 -> 8.1,
# 14.1 -> 12.2, 31.2 -> 30.2, level at 64, 2% slower at 256 (59.7 -> 60.9). Outputs within the mma.sync form's 1.8e-3 of
# float64. Where a CTA walks more K blocks it was slower than the mma.sync forms at 16 of 18 points, up to 2.2x
# (V4-Flash TP 8 w1+w3 at one token 6.6 -> 14.2 us, TP 1 19.6 -> 23.5; sweep_moe_tiles.py --tp 1 8 --tokens 1 8 64
# --wgmma 4 6). Not established why; likely its warp group waiting for each K block's wgmmas (waiting one block behind, so that the next block's
# conversion overlaps them, ptxas serializes: C7514) and its 4 warps in lockstep behind two CTA barriers a K block,
# where the mma.sync form runs 4 independent K streams; a form that holds the block's routed rows in
# shared memory, each warp with a ring of its own rows and no CTA barrier in the loop, was slower again (V4-Flash TP 1
# w1+w3 at one token 28.0 us).
WGMMA = "wgmma"
WGMMA_COLS = 64
WGMMA_THREADS = 128
WGMMA_MAX_K_BLOCKS = 6


def wgmma_params(n: int, k: int, stages: int) -> dict:
    """The WGMMA form's variant params: 8-row blocks x 64 weight rows over one warp group, a ring of `stages`."""
    return {"n": n, "k": k, "block_m": ROWS[0], "block_n": WGMMA_COLS, "threads": WGMMA_THREADS, "stages": stages,
            "operand": WGMMA}


def wgmma_smem_bytes(k: int, stages: int) -> int:
    """The WGMMA form's shared memory: the ring (stages x (64 x 64 + 8 x 128) B), the permuted B tile (1 KB), the
    weight exponents and the activation scales."""
    return (stages * (WGMMA_COLS * ROW_WORDS + ROWS[0] * TOK_WORDS) * 4 + ROWS[0] * ACT_BLOCK
            + scales_smem_bytes(k, ROWS[0], WGMMA_COLS))


def moe_params(arch: ArchProfile, n: int, k: int, num_tokens: int) -> dict:
    bm = moe_block_m(num_tokens)
    bn = block_cols(bm)
    kb = k // ACT_BLOCK
    if bm == ROWS[0] and num_tokens >= WIDE_FROM_TOKENS and kb <= SHORT_K_BLOCKS and n % WIDE_COLS == 0:
        bn = WIDE_COLS
    if bm == ROWS[0] and num_tokens == 1 and kb <= SHORT_K_BLOCKS:
        bn = ONE_TOKEN_COLS
    long_k = kb > LONG_K_BLOCKS and arch.family != "blackwell_consumer"
    narrow = long_k and bm == ROWS[0] and NARROW_TOKENS[0] <= num_tokens <= NARROW_TOKENS[1] and n <= NARROW_MAX_N
    if narrow:
        bn = NARROW_COLS
    warps = cta_warps(k, bm, long_k and num_tokens <= FEW_TOKENS and (not narrow or num_tokens >= NARROW_WARPS_FROM))
    stage_cap = STAGES
    if (bm == ROWS[0] and arch.family == "hopper" and MID_TOKENS[0] <= num_tokens <= MID_TOKENS[1]
            and MID_K_BLOCKS[0] <= kb <= MID_K_BLOCKS[1] and n % MID_COLS == 0):
        bn, stage_cap = MID_COLS, MID_STAGES
    if (bm == ROWS[0] and num_tokens <= SPREAD_TOKENS and kb > SHORT_K_BLOCKS and arch.family == "hopper"
            and busiest_rows(n, bn, num_tokens, arch.num_sms_hint) <= SPREAD_MAX_PER_SM * bn):
        bn = spread_cols(n, bn, num_tokens, arch.num_sms_hint)
        if TOPK_EXPERTS * num_tokens * n // bn <= arch.num_sms_hint:   # a CTA an SM at most
            warps = max(warps, min(SPREAD_WARPS, kb))
    # never more stages than K blocks a warp walks, nor than fit the budget (64 rows at K = 7168 on SM12x: one)
    stages = max(1, min(stage_cap, -(-kb // warps)))
    while stages > 1 and moe_smem_bytes_for(k, stages, bm, bn, warps) > arch.max_smem_per_block:
        stages -= 1
    if bm == ROWS[0] and kb <= WGMMA_MAX_K_BLOCKS and arch.family == "hopper" and n % WGMMA_COLS == 0:
        return wgmma_params(n, k, 2 if num_tokens == 1 else 3)
    p = {"n": n, "k": k, "block_m": bm, "block_n": bn, "threads": 32 * warps, "stages": stages}
    if arch.fp8_mma_operand != FP8 and bm > ROWS[0]:   # Hopper from 16-row blocks: f16 (module doc)
        p["operand"] = arch.fp8_mma_operand
    return p


def _shift(x: int, n: int) -> int:
    return (x << n if n >= 0 else x >> -n) & 0xFFFFFFFF


def _placed_py(u: int, shifts, mag_mask: int, sign_mask: int) -> tuple:
    """Bit placement in plain Python, op for op as the kernel's `placed`: one register per (magnitude, sign) shift."""
    u &= 0xFFFFFFFF
    return tuple((_shift(u, a) & mag_mask) | (_shift(u, b) & sign_mask) for a, b in shifts)


def e4m3_quads_py(u: int) -> tuple[int, int]:
    """SM12x's two e4m3 registers of a word: bytes (e0, e2, e4, e6) and (e1, e3, e5, e7), each the element's value
    x 2^-6 (tests compare every byte with torch's float8_e4m3fn)."""
    return _placed_py(u, E4M3_QUAD_SHIFTS, E4M3_MAG_MASK, E4M3_SIGN_MASK)


def f16_pairs_py(u: int) -> tuple[int, int, int, int]:
    """Hopper's four f16x2 registers of a word: (e0, e4), (e1, e5), (e2, e6), (e3, e7), the lower element in the low
    half, each half the element's value x 2^-14 (tests compare every half with torch's float16)."""
    return _placed_py(u, F16_PAIR_SHIFTS, F16_MAG_MASK, F16_SIGN_MASK)


def c32(v):
    import tilelang.language as T
    return T.Cast("uint32", v)


def perm(x, y, sel):
    import tilelang.language as T
    return T.call_extern("uint32", "__byte_perm", x, y, sel)


def placed(u, shifts, mag_mask: int, sign_mask: int):
    """Bit placement: the kernel form of e4m3_quads_py / f16_pairs_py for one register."""
    a_sh, s_sh = shifts
    mag = u << c32(a_sh) if a_sh >= 0 else u >> c32(-a_sh)
    return (mag & c32(mag_mask)) | ((u << c32(s_sh)) & c32(sign_mask))


def ue8m0(byte):
    """A UE8M0 exponent byte as the fp32 2^(byte - 127)."""
    import tilelang.language as T
    return T.reinterpret(T.shift_left(T.Cast("uint32", byte), c32(23)), "float32")


def zero_block_macro(*, rows: int, cols: int, threads: int):
    """A macro that writes a padding block's rows x cols outputs as zeros (its CTA reads nothing; rows past M are
    skipped), `threads` threads striding the tile."""
    import tilelang.language as T
    steps = -(-rows * cols // threads)
    exact = steps * threads == rows * cols   # else the last stride runs past the tile (3 warps at K = 384)

    @T.macro
    def zero_block(c, bx, by, tid):
        for q in T.serial(steps):
            idx = q * threads + tid
            if exact:
                if by * rows + idx // cols < c.shape[0]:
                    c[by * rows + idx // cols, bx * cols + idx % cols] = T.Cast("bfloat16", 0.0)
            elif idx < rows * cols and by * rows + idx // cols < c.shape[0]:
                c[by * rows + idx // cols, bx * cols + idx % cols] = T.Cast("bfloat16", 0.0)

    return zero_block


def stage_scales_macro(*, k: int, rows: int, cols: int, threads: int):
    """A macro that copies the CTA's weight exponents (its cols weight rows of expert e) and its rows routed rows'
    activation scales into shared memory (scale_layout), cp.async by `threads` threads, uncommitted."""
    import tilelang.language as T
    KB, KS = k // ACT_BLOCK, k // SLICE
    SW_CHUNK, SW_PITCH, SA_PITCH = scale_layout(k)

    @T.macro
    def stage_scales(sw_s, sa_s, sw, sa, e, bx, by, tid):
        for q in T.serial(-(-(cols * KS // SW_CHUNK) // threads)):
            idx = q * threads + tid
            if idx < cols * KS // SW_CHUNK:
                row = idx // (KS // SW_CHUNK)
                col = idx % (KS // SW_CHUNK) * SW_CHUNK
                T.call_extern("handle", f"tl::cp_async_gs<{SW_CHUNK}>", T.address_of(sw_s[row * SW_PITCH + col]),
                              T.address_of(sw[e, bx * cols + row, col]))
        for q in T.serial(-(-(rows * KB) // threads)):
            idx = q * threads + tid
            if idx < rows * KB:
                T.call_extern("handle", "tl::cp_async_gs<4>", T.address_of(sa_s[(idx // KB) * SA_PITCH + idx % KB]),
                              T.address_of(sa[T.min(by * rows + idx // KB, sa.shape[0] - 1), idx % KB]))

    return stage_scales


def build_fp4_moe_gemm(*, n: int, k: int, block_m: int, block_n: int, stages: int, threads: int,
                       operand: str = FP8, pdl: bool = True):
    import tilelang.language as T

    if (block_m not in ROWS or block_n not in TILE_COLS or block_m * block_n > 2048 or n % block_n
            or threads % 32 or not 1 <= threads // 32 <= min(MAX_WARPS, k // ACT_BLOCK)):
        raise ValueError(f"fp4_moe_gemm: block_m {block_m} / block_n {block_n} / threads {threads} is not a tile "
                         f"of this kernel (block_m in {ROWS}, block_n in {TILE_COLS} dividing n, block_m x block_n <= "
                         f"2,048 (a lane's accumulators), 1..{MAX_WARPS} warps, at most one per K block)")
    if operand not in (FP8, "float16"):
        raise ValueError(f"fp4_moe_gemm: operand={operand!r} (supported: {FP8!r}, 'float16')")
    F16 = operand == "float16"
    S = stages
    R, J = block_m, block_m // 8        # routed rows, and the n8 halves of each weight fragment
    COLS = block_n
    STAGE_WORDS = stage_words(R, COLS)
    RED_PITCH = red_pitch(COLS)
    TL = COLS // 16                     # m16 weight tiles per CTA
    KB = k // ACT_BLOCK
    KS = k // SLICE
    WARPS = threads // 32
    WARP_WORDS = warp_words(R, COLS, S)
    _, SW_PITCH, SA_PITCH = scale_layout(k)
    stage_scales = stage_scales_macro(k=k, rows=R, cols=COLS, threads=threads)
    zero_block = zero_block_macro(rows=R, cols=COLS, threads=threads)
    OUT_STEPS = -(-R * COLS // (32 * WARPS))      # 3 warps (K = 384) do not divide the tile
    f32, u32 = "float32", "uint32"
    M = T.dynamic("num_rows")
    E = T.dynamic("num_experts")
    NB = T.dynamic("num_blocks")

    def f16_pair(u, i: int):
        """Elements i and i + 4 of word u as one f16x2 (x 2^-14)."""
        return placed(u, F16_PAIR_SHIFTS[i], F16_MAG_MASK, F16_SIGN_MASK)

    @T.macro
    def issue(ring, a, w, e, bx, by, warp, lane, i):
        """One K block of this warp (warp + i * WARPS) into ring slot i % S: its COLS weight rows x 4 chunks and R
        routed rows x 8 chunks, 16-byte cp.async each, swizzled (module doc)."""
        kb = warp + i * WARPS
        base = warp * WARP_WORDS + (i % S) * STAGE_WORDS
        for q in T.unroll(COLS * 4 // 32):
            row = (q * 32 + lane) // 4
            ch = lane % 4
            T.call_extern("handle", "tl::cp_async_gs<16>",
                          T.address_of(ring[base + row * ROW_WORDS + (ch ^ ((row >> 1) & 3)) * 4]),
                          T.address_of(w[e, bx * COLS + row, kb * ROW_WORDS + ch * 4]))
        for q in T.unroll(R * 8 // 32):
            t = (q * 32 + lane) // 8
            ch = lane % 8
            T.call_extern("handle", "tl::cp_async_gs<16>",
                          T.address_of(ring[base + COLS * ROW_WORDS + t * TOK_WORDS + (ch ^ ((t & 3) * 2)) * 4]),
                          T.address_of(a[T.min(by * R + t, a.shape[0] - 1), kb * ACT_BLOCK + ch * 16]))

    @T.prim_func
    def fp4_moe_gemm(
        a: T.Tensor[(M, k), FP8],
        sa: T.Tensor[(M, KB), f32],
        w: T.Tensor[(E, n, k // 8), "int32"],
        sw: T.Tensor[(E, n, KS), "uint8"],
        block_expert: T.Tensor[(NB,), "int32"],
        c: T.Tensor[(M, n), "bfloat16"],
    ):
        with T.Kernel(n // COLS, NB, threads=32 * WARPS) as (bx, by):
            # the templates of the hand-written cp.async and mma (TileLang includes them only for its own ops)
            T.import_source("#include <tl_templates/cuda/copy.h>\n#include <tl_templates/cuda/instruction/mma.h>\n"
                            + (_CVT_SRC if F16 else ""))
            ring = T.alloc_shared((WARPS * WARP_WORDS,), u32)
            sw_s = T.alloc_shared((COLS * SW_PITCH,), "uint8")
            sa_s = T.alloc_shared((R * SA_PITCH,), f32)
            acc = T.alloc_local((4 * TL * J,), f32)  # [tile TL][n8 half J][c 4]
            blk = T.alloc_local((4 * TL * J,), f32)  # this K block's sum, before its activation scales
            part = T.alloc_local((4,), f32)
            af = T.alloc_local((8 if F16 else 4,), u32)          # [f16: step 2][reg 4]
            bf = T.alloc_local((4 * J if F16 else 2 * J,), u32)  # [n8 half J][f16: 4 / e4m3: 2]
            scl = T.alloc_local((2,), f32)
            ex = T.alloc_var("int32")
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            r = lane // 4
            g = lane % 4
            # launched behind its producer (programmatic dependent launch): this grid's CTAs are resident before
            # that one drains. Every input, the expert of the block included, is read after the sync.
            if pdl:
                T.pdl_sync()
            ex = block_expert[by]
            if ex < 0:
                zero_block(c, bx, by, tid)   # padding block (M sized for capture): zeros, nothing read
            else:
                e = T.min(ex, E - 1)
                n_iter = (KB - warp + WARPS - 1) // WARPS       # this warp's K blocks: warp, warp + WARPS, ...
                base_w = warp * WARP_WORDS

                # the CTA's weight exponents and activation scales: one cp.async group ahead of the ring's, so
                # the first weight stages stream while it lands
                stage_scales(sw_s, sa_s, sw, sa, e, bx, by, tid)
                T.call_extern("handle", "tl::cp_async_commit")
                for st in T.unroll(S - 1):
                    if st < n_iter:
                        issue(ring, a, w, e, bx, by, warp, lane, st)
                    T.call_extern("handle", "tl::cp_async_commit")
                for v in T.unroll(4 * TL * J):
                    acc[v] = 0.0
                T.call_extern("handle", f"tl::cp_async_wait<{S - 1}>")   # the scales' group (the ring's S - 1 may fly)
                T.sync_threads()
                for i in T.serial(n_iter):
                    T.sync_warp()   # every lane is done with slot (i - 1) % S, which this issue refills
                    if i + S - 1 < n_iter:
                        issue(ring, a, w, e, bx, by, warp, lane, i + S - 1)
                    T.call_extern("handle", "tl::cp_async_commit")   # one group per iteration, empty or not
                    T.call_extern("handle", f"tl::cp_async_wait<{S - 1}>")
                    T.sync_warp()   # the other lanes' copies of slot i % S are visible
                    kb = warp + i * WARPS
                    base = base_w + (i % S) * STAGE_WORDS
                    for v in T.unroll(4 * TL * J):
                        blk[v] = 0.0
                    for s in T.unroll(ACT_BLOCK // SLICE):
                        for j in T.unroll(J):
                            t = j * 8 + r
                            tw = base + COLS * ROW_WORDS + t * TOK_WORDS + ((s * 2 + g // 2) ^ ((t & 3) * 2)) * 4 + (g % 2) * 2
                            if F16:
                                # (e0, e4), (e1, e5) | (e2, e6), (e3, e7): step 0's two B registers, then step 1's
                                for q in T.unroll(2):
                                    pr = perm(ring[tw], ring[tw + 1], c32(0x5140 + q * 0x2222))
                                    bf[j * 4 + q * 2] = T.call_extern(u32, "dsv4_e4m3x2_f16x2", pr)
                                    bf[j * 4 + q * 2 + 1] = T.call_extern(u32, "dsv4_e4m3x2_f16x2", pr >> c32(16))
                            else:
                                # bytes (e0, e2, e4, e6), then (e1, e3, e5, e7): the weights' even / odd registers
                                bf[j * 2] = perm(ring[tw], ring[tw + 1], c32(0x6420))
                                bf[j * 2 + 1] = perm(ring[tw], ring[tw + 1], c32(0x7531))
                        for tile in T.unroll(TL):
                            for h in T.unroll(2):
                                row = tile * 16 + h * 8 + r
                                u = ring[base + row * ROW_WORDS + (s ^ ((r >> 1) & 3)) * 4 + g]
                                if F16:
                                    # pairs (e0, e4), (e1, e5) | (e2, e6), (e3, e7) by bit placement (x 2^-14): A
                                    # registers h (row r / r + 8) and h + 2 of step 0, then of step 1
                                    af[h] = f16_pair(u, 0)
                                    af[h + 2] = f16_pair(u, 1)
                                    af[4 + h] = f16_pair(u, 2)
                                    af[4 + h + 2] = f16_pair(u, 3)
                                else:
                                    af[h] = placed(u, E4M3_QUAD_SHIFTS[0], E4M3_MAG_MASK, E4M3_SIGN_MASK)
                                    af[h + 2] = placed(u, E4M3_QUAD_SHIFTS[1], E4M3_MAG_MASK, E4M3_SIGN_MASK)
                                scl[h] = ue8m0(sw_s[row * SW_PITCH + kb * 4 + s])
                            for j in T.unroll(J):
                                for v in T.unroll(4):
                                    part[v] = 0.0
                                if F16:
                                    for q in T.unroll(2):
                                        T.call_extern("handle", MMA_F16, T.address_of(part[0]), T.address_of(af[q * 4]),
                                                      T.address_of(bf[j * 4 + q * 2]))
                                else:
                                    T.call_extern("handle", MMA_FP8, T.address_of(part[0]), T.address_of(af[0]),
                                                  T.address_of(bf[j * 2]))
                                for v in T.unroll(4):
                                    blk[(tile * J + j) * 4 + v] += part[v] * scl[v // 2]
                    for tile in T.unroll(TL):
                        for j in T.unroll(J):
                            for v in T.unroll(4):
                                acc[(tile * J + j) * 4 + v] += (blk[(tile * J + j) * 4 + v]
                                                                * sa_s[(j * 8 + g * 2 + v % 2) * SA_PITCH + kb])
                # the kernel behind this one may launch during this epilogue (not at the start: 8 layers' grids
                # resident at once, each waiting on the one before, were slower; module doc)
                if pdl:
                    T.pdl_trigger()
                # the warps' partial tiles, summed through the (drained) ring
                T.call_extern("handle", "tl::cp_async_wait<0>")
                T.sync_threads()
                for tile in T.unroll(TL):
                    for j in T.unroll(J):
                        for v in T.unroll(4):
                            ring[base_w + (j * 8 + g * 2 + v % 2) * RED_PITCH + tile * 16 + (v // 2) * 8 + r] = \
                                T.reinterpret(acc[(tile * J + j) * 4 + v], u32)
                T.sync_threads()
                total = T.alloc_var(f32)
                for q in T.serial(OUT_STEPS):
                    idx = q * 32 * WARPS + tid
                    t = T.min(idx // COLS, R - 1)
                    col = idx % COLS
                    total = 0.0
                    for wp in T.unroll(WARPS):
                        total += T.reinterpret(ring[wp * WARP_WORDS + t * RED_PITCH + col], f32)
                    if idx < R * COLS and by * R + t < M:
                        # the weights carry 2^-14 (f16) or 2^-6 (e4m3) from bit placement: one exact multiply here
                        c[by * R + t, bx * COLS + col] = T.Cast("bfloat16", total * (F16_UNSCALE if F16 else E4M3_UNSCALE))

    return fp4_moe_gemm


_WGMMA_SRC = r"""
#include <tl_templates/cuda/instruction/wgmma.h>
// the routed rows' permuted tile, written by the threads, is read by wgmma through the async proxy
__device__ __forceinline__ void dsv4_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" : : : "memory"); }
// The 4 slices of a K block: wgmma m64n8k32 e4m3 x e4m3 -> f32, A from registers (4 a slice), B from the permuted
// tile (slice s: its two 16-byte K chunks, 256 B on), each slice into accumulators of its own (scale-d 0), one wait.
__device__ __forceinline__ void dsv4_moe_wgmma4(unsigned* a, const void* b_tile, float* c) {
  tl::GmmaDescriptor desc;
  tl::initialize_wgmma_descriptor<0, 8, 64>(desc, b_tile);   // no swizzle; LBO 128 B (K chunks), SBO 1 KB (unused)
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(a[i]) : : "memory");
  asm volatile("wgmma.fence.sync.aligned;\n" : : : "memory");
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    tl::wgmma_rs<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, 64, 8, 32, false,
                 false>(a + 4 * s, desc.desc_ + (unsigned long long)(16 * s), reinterpret_cast<uint32_t*>(c + 4 * s),
                        false);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" : : : "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" : : : "memory");
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(c[i]) : : "memory");
}
"""


def build_fp4_moe_gemm_wgmma(*, n: int, k: int, stages: int, pdl: bool = True):
    """Hopper's WGMMA form (see WGMMA): 8-row blocks x 64 weight rows, one warp group a CTA."""
    import tilelang.language as T

    if n % WGMMA_COLS or k % ACT_BLOCK or not 2 <= stages <= 8:
        raise ValueError(f"fp4_moe_gemm: the WGMMA form takes N a multiple of {WGMMA_COLS}, K of {ACT_BLOCK} and 2..8 "
                         f"stages, got n={n} k={k} stages={stages}")
    R, COLS, S = ROWS[0], WGMMA_COLS, stages
    KB, KS = k // ACT_BLOCK, k // SLICE
    STAGE_WORDS = COLS * ROW_WORDS + R * TOK_WORDS
    _, SW_PITCH, SA_PITCH = scale_layout(k)
    stage_scales = stage_scales_macro(k=k, rows=R, cols=COLS, threads=WGMMA_THREADS)
    zero_block = zero_block_macro(rows=R, cols=COLS, threads=WGMMA_THREADS)
    f32, u32 = "float32", "uint32"
    M = T.dynamic("num_rows")
    E = T.dynamic("num_experts")
    NB = T.dynamic("num_blocks")

    @T.macro
    def issue(ring, a, w, e, bx, by, tid, i):
        """K block i into ring slot i % S: 64 weight rows x 4 chunks (swizzled as the mma.sync form's) and the block's
        8 routed rows x 8 chunks, 16-byte cp.async each."""
        base = (i % S) * STAGE_WORDS
        for q in T.unroll(COLS * 4 // WGMMA_THREADS):
            row = (q * WGMMA_THREADS + tid) // 4
            ch = tid % 4
            T.call_extern("handle", "tl::cp_async_gs<16>",
                          T.address_of(ring[base + row * ROW_WORDS + (ch ^ ((row >> 1) & 3)) * 4]),
                          T.address_of(w[e, bx * COLS + row, i * ROW_WORDS + ch * 4]))
        if tid < R * 8:
            T.call_extern("handle", "tl::cp_async_gs<16>",
                          T.address_of(ring[base + COLS * ROW_WORDS + (tid // 8) * TOK_WORDS + (tid % 8) * 4]),
                          T.address_of(a[T.min(by * R + tid // 8, a.shape[0] - 1), i * ACT_BLOCK + (tid % 8) * 16]))

    @T.prim_func
    def fp4_moe_gemm(
        a: T.Tensor[(M, k), FP8],
        sa: T.Tensor[(M, KB), f32],
        w: T.Tensor[(E, n, k // 8), "int32"],
        sw: T.Tensor[(E, n, KS), "uint8"],
        block_expert: T.Tensor[(NB,), "int32"],
        c: T.Tensor[(M, n), "bfloat16"],
    ):
        with T.Kernel(n // COLS, NB, threads=WGMMA_THREADS) as (bx, by):
            T.import_source("#include <tl_templates/cuda/copy.h>\n" + _WGMMA_SRC)
            ring = T.alloc_shared((S * STAGE_WORDS,), u32)
            b_tile = T.alloc_shared((R * ACT_BLOCK // 4,), u32)   # [K chunk 8][routed row 8][4 words]
            sw_s = T.alloc_shared((COLS * SW_PITCH,), "uint8")
            sa_s = T.alloc_shared((R * SA_PITCH,), f32)
            acc = T.alloc_local((4,), f32)
            blk = T.alloc_local((4,), f32)
            part = T.alloc_local((16,), f32)   # [slice 4][c 4]
            af = T.alloc_local((16,), u32)     # [slice 4][a 4]
            scl = T.alloc_local((2,), f32)
            ex = T.alloc_var("int32")
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            r = lane // 4
            g = lane % 4
            # launched behind its producer (PDL): every input, the expert of the block included, after the sync
            if pdl:
                T.pdl_sync()
            ex = block_expert[by]
            if ex < 0:
                zero_block(c, bx, by, tid)
            else:
                e = T.min(ex, E - 1)
                stage_scales(sw_s, sa_s, sw, sa, e, bx, by, tid)
                T.call_extern("handle", "tl::cp_async_commit")
                for st in T.unroll(S - 1):
                    if st < KB:
                        issue(ring, a, w, e, bx, by, tid, st)
                    T.call_extern("handle", "tl::cp_async_commit")
                for v in T.unroll(4):
                    acc[v] = 0.0
                for i in T.serial(KB):
                    # every warp's wgmma of block i - 1 is done (waited) with slot (i - 1) % S and b_tile
                    T.sync_threads()
                    if i + S - 1 < KB:
                        issue(ring, a, w, e, bx, by, tid, i + S - 1)
                    T.call_extern("handle", "tl::cp_async_commit")   # one group per iteration, empty or not
                    T.call_extern("handle", f"tl::cp_async_wait<{S - 1}>")
                    T.sync_threads()   # block i's bytes (every thread's copies) are in shared memory
                    base = (i % S) * STAGE_WORDS
                    # B: routed row t's slice s, bytes 8 g' .. 8 g' + 7, to the mma.sync form's K order (even bytes at
                    # k 4 g' .., odd at 16 + 4 g' ..) in K chunks 2 s / 2 s + 1
                    bt = tid // 16
                    bs = (tid // 4) % 4
                    bg = tid % 4
                    tw = base + COLS * ROW_WORDS + bt * TOK_WORDS + bs * 8 + bg * 2
                    b_tile[(2 * bs) * 32 + bt * 4 + bg] = perm(ring[tw], ring[tw + 1], c32(0x6420))
                    b_tile[(2 * bs + 1) * 32 + bt * 4 + bg] = perm(ring[tw], ring[tw + 1], c32(0x7531))
                    T.call_extern("handle", "dsv4_fence_proxy_async")
                    T.sync_threads()   # b_tile complete, visible to the async proxy
                    for s in T.unroll(ACT_BLOCK // SLICE):
                        for h in T.unroll(2):
                            row = warp * 16 + h * 8 + r
                            u = ring[base + row * ROW_WORDS + (s ^ ((r >> 1) & 3)) * 4 + g]
                            af[s * 4 + h] = placed(u, E4M3_QUAD_SHIFTS[0], E4M3_MAG_MASK, E4M3_SIGN_MASK)
                            af[s * 4 + 2 + h] = placed(u, E4M3_QUAD_SHIFTS[1], E4M3_MAG_MASK, E4M3_SIGN_MASK)
                    T.call_extern("handle", "dsv4_moe_wgmma4", T.address_of(af[0]), T.address_of(b_tile[0]),
                                  T.address_of(part[0]))
                    for v in T.unroll(4):
                        blk[v] = 0.0
                    for s in T.unroll(ACT_BLOCK // SLICE):
                        for h in T.unroll(2):
                            scl[h] = ue8m0(sw_s[(warp * 16 + h * 8 + r) * SW_PITCH + i * 4 + s])
                        for v in T.unroll(4):
                            blk[v] += part[s * 4 + v] * scl[v // 2]
                    for v in T.unroll(4):
                        acc[v] += blk[v] * sa_s[(g * 2 + v % 2) * SA_PITCH + i]
                # the kernel behind this one may launch during the epilogue
                if pdl:
                    T.pdl_trigger()
                T.call_extern("handle", "tl::cp_async_wait<0>")
                for v in T.unroll(4):
                    if by * R + g * 2 + v % 2 < M:
                        # the weights carry 2^-6 from bit placement: one exact multiply here
                        c[by * R + g * 2 + v % 2, bx * COLS + warp * 16 + (v // 2) * 8 + r] = T.Cast(
                            "bfloat16", acc[v] * E4M3_UNSCALE)

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
        n = int_param(self.name, static, "n", multiple=128)
        k = int_param(self.name, static, "k", multiple=ACT_BLOCK)
        return Variant.make(self.name, moe_params(arch, n, k, num_tokens), arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return moe_smem_bytes(variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = super().pass_configs(variant)
        cfg["tl.disable_thread_storage_sync"] = True   # its barriers are all written by hand
        return cfg

    def build(self, variant: Variant):
        p = variant.p
        if p.get("operand") == WGMMA:
            if p["block_m"] != ROWS[0] or p["block_n"] != WGMMA_COLS or p["threads"] != WGMMA_THREADS:
                raise ValueError(f"fp4_moe_gemm: the WGMMA form is {ROWS[0]} rows x {WGMMA_COLS} columns over "
                                 f"{WGMMA_THREADS} threads, got {dict(p)}")
            return build_fp4_moe_gemm_wgmma(n=p["n"], k=p["k"], stages=p["stages"], pdl=p.get("pdl", True))
        return build_fp4_moe_gemm(**p)
