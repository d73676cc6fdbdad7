"""FP8 block-scaled GEMM (ref `fp8_gemm`, dsv4_kernels.md 3.10), the kernel of every FP8 linear of DeepSeek V4:

    C[M, N] bf16 = sum over 128-wide K blocks kb of  sa[m, kb] * sb[n // 128, kb] * (A[m, kb] . B[n, kb])

A fp8 e4m3 [M, K] with per-token 1x128 scales sa fp32 [M, K / 128] (kernels/quant act_quant_fp8 writes
them: UE8M0 powers of two), B fp8 e4m3 [N, K] (the weight, row-major as stored) with 128x128 block scales
sb fp32 [ceil(N / 128), K / 128] (the checkpoint's float8_e8m0fnu `scale`, converted to fp32 once at load).
Each K block's A.B partial is accumulated in fp32 by the tensor cores (mma.sync m16n8k32 e4m3; WGMMA only in
Hopper's large-M form) and then added, times its two scales, into a second fp32 accumulator (DeepSeek's
two-accumulator scheme). N and K are compile-time; M (tokens) is `T.dynamic`.

Grouped form (`groups` G > 1, the grouped output projection wo_a): C [M, G*N], A [M, G*K], B [G*N, K] (G weights
stacked), sa [M, G*K/128], sb [G*ceil(N/128), K/128]; C[:, g*N:(g+1)*N] = A[:, g*K:(g+1)*K] . B_g^T, one launch
(grid z = groups x splits).

Schedules (`select` picks one by the token count; the same on every arch family but Hopper from 9 rows):
  * decode, M <= 8, where K is 1,024..4,096 and G x N 1,536..8,192 (most V4 decode shapes): the rows form
    (fp8_gemm_rows.py): a CTA owns 16 or 32 weight rows over the whole K, its warps split K (a cp.async ring each)
    and sum through shared memory; no split-K across CTAs, so no partials, counters or reduce kernel. Its weight
    (its whole share where it fits) is requested before the grid dependency sync. Outside that domain, and from 9
    rows, the forms below.
  * Hopper up to 64 tokens (in the rows form's domain from 9, or where no split-K is needed), where a grid of one
    wave can hold each CTA's whole K share: the decode ring below on wgmma (`swap`): 64 weight rows a CTA as the
    MMA's M side, the 8-, 16- or 32-token tile its N (two 16-token tiles at 17..32 tokens at their own split, see
    two_tile_params; two 32-token tiles from 33 tokens; ptxas emulates the ring's e4m3 mma.sync there), the share
    requested before the grid dependency sync (see swap_params). Up to 32 tokens
    where no such grid exists, the same ring streams the share in place of the mma.sync ring where that has
    64-column tiles (see streaming_swap_params).
  * decode, M <= 16 / 32 / 64: one M tile (16 / 32 / 64 rows), N tiles of 128 columns, or 64 when 128-column tiles
    alone would leave SMs idle, and split-K over a divisor of the K blocks until (N tiles x splits) reaches
    the SM count, so small-M GEMMs stream the weight with the whole GPU (in shares of at least
    MIN_SPLIT_K_BLOCKS K blocks where the N tiles alone occupy 3/4 of the SMs). Split > 1 writes fp32 partials
    [split, M, N] to a workspace. Up to 32-row tiles the last CTA of each output tile to finish (an arrival counter
    per tile, which it leaves zero) sums them in split order into bf16 C, in the same launch; 64-row tiles leave
    that to `fp8_gemm_reduce` (see sums_in_kernel). The main loop is a cp.async ring
    (`ring`, k_stage K blocks per stage: 256 B runs of each weight row) that requests its first weight stages
    before the grid dependency sync, so under programmatic dependent launch (PDL; the ring GEMM
    triggers its dependents at start) a GEMM may begin streaming its weight while the previous one drains (its
    whole share where it fits the ring and the grid is one wave: see ring_fill). All
    the CTA's scale products load once, not per K block. act_quant_fp8 (the GEMM's usual predecessor) has no
    PDL trigger: it gave no measurable overlap.
    On Hopper the 33..64-row WGMMA form below is launched by PDL too: it sends its first weight stages to L2
    before the grid dependency sync (see wgmma_params).
  * batched decode, 64 < M <= 256: the same 64-row tiles (2..4 M tiles), split-K counted for 2 M tiles and
    capped so the partials (split x 256 x N fp32) never outweigh the weight (N x K fp8): a 128 x 128 tile
    would give e.g. the fused wq_a+wkv (N = 1,536) only 12..24 CTAs. On Hopper the WGMMA form below runs it
    instead (see wgmma_params), and from 33 rows on: fp8 mma.sync is emulated there.
  * large M (> 256): 64 x 128 tiles (K block 128) over 4 warps, no split, 4 cp.async stages (99,328 B of SM12x's
    101,376). On a GPU with WGMMA (Hopper) instead: 128 x 128 tiles, TMA loads into 4 stages, one producer and two
    consumer warp groups (warp specialization, setmaxnreg), wgmma m64n128k32, 1 / 2 / 4 N tiles a CTA in one
    pipelined loop, C stored by TMA (163,904 B), several times the mma.sync form's throughput (see
    mainloop_wgmma, tiles_per_cta). SM120 has no WGMMA and keeps the form above.
The mma.sync forms take SM12x's stage budget on every family (see _STAGE_BUDGET).

Rows past M read the last row (clamped index; the ring's copies zero-fill them instead) and are never stored.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import (DISABLE_TMA_LOWER, DISABLE_WARP_SPECIALIZED, DISABLE_WGMMA, ArchProfile, check_arch,
                           ctas_by_smem, get_profile, schedule_name)
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

from .fp8_gemm_rows import build_fp8_gemm_rows, rows_params, rows_smem_bytes, uses_rows

FP8 = "float8_e4m3"
QBLOCK = 128          # quantization block (activations 1x128, weights 128x128)
BLOCK_K = 128
DECODE_MAX_M = 64
# 17..32 rows: 32-row ring tiles. A 64-row tile there paid for 64 rows of mma.sync (emulated for fp8 on Hopper) and
# was 2-24% slower per layer at M = 32 (H100 sweep, every V4-Flash TP 1 / V4-Pro TP 8 shape; e.g. V4-Flash wq_b
# 18.2 -> 15.0 us, wo_b 21.8 -> 18.0)
DECODE_MID_M = 32
# 33..64 rows on the mma.sync forms (no WGMMA): two 32-row tiles that sum their split-K partials in the launch, where
# the 64-row pick splits K at least this many ways. Per layer on an H100 at M = 64 the 32-row tiles beat the 64-row
# tile and its reduce kernel there (the SM120 schedule's shared expert w2 11.0 -> 9.0 us, indexer wq_b 10.1 -> 8.4,
# 2-4 ways) and lost where it splits less (unsplit V4-Flash wq_b 18.2 -> 24.3: the weight is read by twice the CTAs).
# Hopper runs its 64 x 64 WGMMA form at every split instead: launched by PDL (see wgmma_params) it beat the 32-row
# tiles or was level at all 10 shapes where they had been picked (4+ splits; per layer, 6 layers a graph, V4-Flash
# TP 1 wq_a+wkv 9.1 -> 8.7 us, V4-Pro TP 8 wq_a+wkv 13.2 -> 12.0, wo_a 9.9 -> 9.1, shared expert w1+w3 10.2 -> 8.4,
# V4-Pro TP 4 w1+w3 12.6 -> 11.4; V4-Flash TP 4 / TP 8 w1+w3 7.7 -> 7.8; sweep_gemm_decode.py --wgmma-splits).
MID_TILES_MIN_SPLIT = 2
SPLIT_MAX_M = 256
# Hopper's WGMMA form at 33..64 rows (64 x 64 tiles): split until the CTAs reach 2/3 of the SMs (two fit an SM)
WGMMA_DECODE_SM_SHARE = (2, 3)


# Pipeline-stage budget (bytes of shared memory the stages may take) and the most stages, on every family: the
# SM12x figures. Hopper's deeper pipelines (200 KB, 6 stages) leave fewer CTAs resident and were slower on every
# shape measured (benchmarks/RESULTS.md).
_STAGE_BUDGET = (100_000, 4)
# Large-M tile: (block_m, block_n, threads). 64 x 128 over 4 warps beats 128 x 128 over 8, which spills registers
# and holds one CTA an SM.
_LARGE_TILE = (64, 128, 128)
# Hopper's large-M form (GPUs with WGMMA only): (block_m, block_n, threads, stages). TMA loads, one producer warp
# group and threads / 128 consumer warp groups (TileLang's warp specialization, setmaxnreg 24 / 240), each consumer
# a 64 x block_n wgmma tile. The per-K-block scales are read by the consumers from global memory (a SIMT store by
# the producer would cost it the setmaxnreg split). Not an SM12x path: SM120 has no WGMMA.
_WGMMA_TILE = (128, 128, 256, 4)
# the WGMMA form's CTA rasterization panel (T.use_swizzle): the default, left out of the variant params; 4 and 16
# measured level with it (sweep_gemm_large_m.py --panel)
WGMMA_PANEL = 10
# what a CTA's pipeline fill and last epilogue cost, in K blocks of its main loop (tiles_per_cta below 4 waves; any
# value from 2 to 16 picks the same counts on the 26 swept V4 points)
_TILE_FILL_BLOCKS = 8


def sums_in_kernel(p: Mapping[str, Any]) -> bool:
    """Whether split variant params `p` sum their partials in the GEMM's own launch (the last CTA of each output tile
    to arrive), else in fp8_gemm_reduce behind it. In the launch up to 32-row tiles: per layer on an H100, V4-Flash
    TP 1 and V4-Pro TP 8 at M = 1 / 8 / 32, 1-27% faster (V4-Pro wo_a at M = 32 10.7 -> 7.8 us, V4-Flash shared
    expert w2 9.0 -> 7.1; one point 0.3 us slower). A 64-row tile's last CTA reads split x 16 KB of partials on one
    SM, where the reduce kernel spreads them over the GPU: 0.5-2.4 us slower at M = 64 (V4-Pro shared expert w1+w3
    10.0 -> 12.4), so those keep the reduce kernel. (Summing a tile's splits in a thread block cluster instead, and
    reading the weight scales before the grid dependency sync, were measured slower: docs/kernels.md.)"""
    return p["split"] > 1 and p["block_m"] <= DECODE_MID_M


def uses_wgmma(arch: ArchProfile, num_tokens: int) -> bool:
    """Past the 32-row decode ring (M > 32) on a GPU with WGMMA (a real Hopper profile; an SM120 schedule emulated
    on sm_90a has none)."""
    return num_tokens > DECODE_MID_M and arch.has_wgmma


def stage_bytes(block_m: int, block_n: int) -> int:
    """Shared memory of one pipeline stage: the A and B fp8 tiles and the block_m fp32 combined scales (which
    TileLang may multi-buffer with the copies)."""
    return block_m * BLOCK_K + block_n * BLOCK_K + block_m * 4


def gemm_smem_bytes(p: Mapping[str, Any]) -> int:
    """Pre-nvcc shared memory: `stages` copies of a stage (see stage_bytes; a ring stage holds k_stage K blocks,
    and the ring holds its block_m x K-blocks-per-split fp32 scale products once), and (sums_in_kernel) the 4-byte
    last-to-arrive flag; the accumulators live in registers and C is stored from them."""
    if p.get("rows"):
        return rows_smem_bytes(p)
    flag = 4 if sums_in_kernel(p) else 0   # the CTA's "last to arrive" word
    if p.get("wgmma"):
        # the stages' A and B tiles and their two mbarriers (8 B each), and (no split) C's bf16 tile for the TMA
        # store (TileLang may place it over the drained stages: this is an upper bound)
        c_tile = 2 * p["block_m"] * p["block_n"] if p["split"] == 1 else 0
        return p["stages"] * ((p["block_m"] + p["block_n"]) * BLOCK_K + 16) + c_tile + flag
    if p.get("ring"):
        ks = p.get("k_stage", 1)
        return (p["stages"] * ks * (p["block_m"] + p["block_n"]) * BLOCK_K
                + 4 * p["block_m"] * (p["k"] // BLOCK_K // p["split"]) + flag)
    return p["stages"] * stage_bytes(p["block_m"], p["block_n"]) + flag


def _stages(block_m: int, block_n: int, k_iters: int) -> int:
    budget, most = _STAGE_BUDGET
    s = max(1, min(most, budget // stage_bytes(block_m, block_n)))
    return max(1, min(s, k_iters))


# Where the N tiles alone occupy 3/4 of the SMs, a split must leave each CTA this many K blocks: shorter shares
# paid more in partials and a separate reduce kernel than the last SMs' fill gained (H100 sweep: V4-Pro TP 8's shared
# expert w2, K = 384, 5.9 -> 3.5 us at M = 8 and 10.3 -> 5.6 at M = 64 unsplit; K = 1,024 unsplit level or faster;
# K >= 1,536 still gains from 2 splits at M = 64).
MIN_SPLIT_K_BLOCKS = 5


def decode_split(n_tiles: int, k_blocks: int, num_sms: int, most: int | None = None) -> int:
    """Smallest divisor d of k_blocks with n_tiles * d >= num_sms (every SM streams weight), else the largest
    divisor; never above `most` (when given), nor above k_blocks / MIN_SPLIT_K_BLOCKS where the N tiles alone
    occupy 3/4 of the SMs."""
    if 4 * n_tiles >= 3 * num_sms:
        cap = max(1, k_blocks // MIN_SPLIT_K_BLOCKS)
        most = cap if most is None else min(most, cap)
    divs = [d for d in range(1, k_blocks + 1) if k_blocks % d == 0 and (most is None or d <= max(1, most))]
    for d in divs:
        if n_tiles * d >= num_sms:
            return d
    return divs[-1]


def swap_token_tile(num_tokens: int) -> int:
    """Tokens a CTA of the wgmma ring multiplies (its wgmma N): 8, 16 or 32 (two 32-token tiles from 33 tokens)."""
    return 8 if num_tokens <= 8 else 16 if num_tokens <= 16 else DECODE_MID_M


def swap_params(arch: ArchProfile, n: int, k: int, groups: int, num_tokens: int) -> dict | None:
    """Hopper's decode ring on wgmma up to DECODE_MAX_M tokens (gemm_params asks past the rows form), or None where
    it does not apply: 64 weight rows a CTA (one warp group, wgmma m64) against an 8-, 16- or 32-token tile (its N;
    two 32-token tiles from 33 tokens), split-K over the most splits that keep the grid within one wave of the SMs
    while each CTA's whole K share fits its ring, which then requests that share before the grid dependency sync
    (fill); at 17..32 tokens two 16-token tiles in its place where two_tile_params takes them. ptxas emulates the
    ring's e4m3 mma.sync on Hopper; wgmma runs e4m3 natively. Per layer on an H200 (benchmarks/gemm/ab_gemm_swap.py),
    against the mma.sync ring: at 9-32 tokens faster at 59 of 76 points by 2-48%
    (V4-Flash TP 8 shared expert w1+w3 7.24 -> 3.82 us at 9 tokens), level at 13, 4-7% slower at 4 (N 4,096 x K 2,048
    at 24-32 tokens); at 1-8 tokens faster at all 24 points by 10-52%. Against the 64 x 64 TMA WGMMA tile at 33, 48
    and 64 tokens (two token tiles whose CTAs read each weight row in the same wave: V4-Flash TP 2 / 4 / 8): faster
    at all 21 points by 10-37% (TP 8 wq_b 5.92 -> 4.86 us at 64 tokens, shared expert w2 4.29 -> 2.70); where two
    tiles' grid takes more than one wave it was slower (V4-Flash TP 1 wq_b 13.6 -> 23.1, sweep_gemm_decode.py --swap
    --swap-block-m 32); docs/kernels.md."""
    if not (arch.has_wgmma and num_tokens <= DECODE_MAX_M) or n % 64:
        return None
    kb = k // BLOCK_K
    block_m = swap_token_tile(num_tokens)
    # 33..64 tokens: two 32-token tiles, each CTA pair reading the same weight rows in the same wave
    tiles = -(-num_tokens // block_m) * groups * n // 64
    for split in sorted((d for d in range(1, kb + 1) if kb % d == 0 and tiles * d <= arch.num_sms_hint),
                        reverse=True):
        p = swap_ring_params(n, k, groups, block_m, split)
        if ring_holds_share(p):
            if 16 < num_tokens <= DECODE_MID_M:
                return two_tile_params(arch, n, k, groups) or {**p, "fill": True}
            return {**p, "fill": True}
    return None


# 17..32 tokens: two 16-token tiles in place of the one-wave 32-token grid. Their CTAs keep K shares of
# TWO_TILE_SHORT_SHARE..TWO_TILE_MIN_SHARE blocks in one filled wave where a split gives that, else shares of at least
# TWO_TILE_MIN_SHARE blocks over decode_split's grid
TWO_TILE_MIN_SHARE = 8
TWO_TILE_SHORT_SHARE = 4


def two_tile_params(arch: ArchProfile, n: int, k: int, groups: int) -> dict | None:
    """The wgmma ring over two 16-token tiles (17..32 tokens), or None. A 32-token grid of one wave leaves SMs idle
    or its CTAs few; two 16-token tiles give twice the CTAs (each pair reading the same weight rows in the same wave)
    at half the MMA width. The split: the largest whose grid is one wave (one CTA an SM, each requesting its whole
    share before the grid dependency sync) where that share is 4-8 K blocks; else decode_split's split for the two
    tiles' grid, capped at 8-block shares, and no two tiles where the share is shorter.
    Per layer on an H100, against the 32-token pick (sweep_gemm_decode.py --swap --swap-block-m 16, one call each):
    one filled wave, V4-Flash TP 8 shared expert w1+w3 6.55 -> 4.52 us at 32 tokens (4 blocks), wq_b 5.50 -> 4.27 (8),
    TP 4 shared expert w1+w3 6.62 -> 5.78 (8), shared expert w2 4.39 -> 2.78 at 24 (4); decode_split's grid, V4-Pro TP 8
    shared expert w1+w3 8.4 -> 6.7 at 32, wo_a 8.0 -> 7.3, V4-Flash TP 1 / 2 / 4 / 8 wq_a+wkv 7.2 -> 6.9, TP 4 wo_b
    7.80 -> 7.21. Slower with a 3-block share over more than a wave (V4-Pro TP 8 shared expert w2: 3.3 -> 3.8)."""
    kb = k // BLOCK_K
    tiles = 2 * groups * n // 64
    wave = [d for d in range(1, kb + 1) if kb % d == 0 and tiles * d <= arch.num_sms_hint]
    if wave and TWO_TILE_SHORT_SHARE <= kb // wave[-1] <= TWO_TILE_MIN_SHARE:
        p = swap_ring_params(n, k, groups, 16, wave[-1])
        if ring_fill(p, 2, arch.num_sms_hint):
            return {**p, "fill": True}
    split = decode_split(tiles, kb, arch.num_sms_hint, most=max(1, kb // TWO_TILE_MIN_SHARE))
    if kb // split < TWO_TILE_MIN_SHARE:
        return None
    p = swap_ring_params(n, k, groups, 16, split)
    return {**p, "fill": True} if ring_fill(p, 2, arch.num_sms_hint) else p


def swap_ring_params(n: int, k: int, groups: int, block_m: int, split: int) -> dict:
    """The wgmma decode ring's params at one token tile and split (no fill): 64 weight rows over one warp group,
    the ring's depth as ring_stages fits it."""
    p = {"n": n, "k": k, "groups": groups, "block_m": block_m, "block_n": 64, "split": split, "threads": 128,
         "stages": 1, "swap": True}
    return {**p, **ring_stages(p)}


# In the rows form's domain (up to 8 tokens) Hopper takes the wgmma ring only where it needs no split-K: per layer on
# an H200, one call, medians of 3 alternated rounds (benchmarks/gemm/ab_gemm_swap.py --rows), V4-Flash's indexer wq_b
# (N 8,192 x K 1,024, one K share a CTA) 4.48 -> 4.00 us at one token and 5.19 -> 4.01 at 8 (TP 1; TP 2 / 8 alike),
# where with split-K it was 7-16% slower at one token (wq_a+wkv 4.39 -> 4.70, shared expert w2 4.95 -> 5.22, TP 2 w2
# 3.42 -> 3.99) and mixed at 8 (Pro TP 8 wo_a 5.73 -> 5.41, TP 2 w2 3.85 -> 4.07).


def streaming_candidate(pick: Mapping[str, Any], num_tokens: int) -> dict:
    """The wgmma ring in place of mma.sync ring params `pick` (64-column tiles) at the same split: 64 weight rows a
    CTA over the token tile holding num_tokens, its ring as deep as ring_stages fits, the K share streaming through
    it (no fill)."""
    return swap_ring_params(pick["n"], pick["k"], pick["groups"], swap_token_tile(num_tokens), pick["split"])


# Where streaming_swap_params' ring leaves an SM room for 3 CTAs (the 8-token tile, or 32 tokens at 3 ring stages) it
# takes that ring only for 8-token tiles over K shares under this many K blocks
STREAMING_SWAP_MAX_SHARE = 16


def streaming_swap_params(arch: ArchProfile, pick: Mapping[str, Any], num_tokens: int) -> dict | None:
    """Hopper's wgmma ring where swap_params finds no grid holding a K share in its ring and gemm_params would run the
    mma.sync ring with 64-column tiles (up to 32 tokens): streaming_candidate, at the same split. Per layer on an
    H200 against that mma.sync ring (ab_gemm_swap.py --streaming, one call, medians of 3 alternated rounds, 92 points
    of V4-Flash / V4-Pro TP 1-8 at 1 / 8 / 16 / 32 tokens): where its shared memory leaves an SM 2 CTAs, 2-15% faster
    at 33 of 39 points and level at 6 (within 2%, the slowest +1.3%): V4-Pro TP 1 wo_b 42.07 -> 35.97 us at 32
    tokens, shared expert w1+w3 20.01 -> 17.32, V4-Flash TP 1 shared expert w1+w3 8.30 -> 7.66 at 16. Where it
    leaves room for 3, 5-12% faster at all 16 points with 8-token tiles over K shares under 16 blocks (V4-Pro
    wq_a+wkv 7.93 -> 7.32 at one token, V4-Flash TP 2 wq_b 7.14 -> 6.33) but slower at 16 of the other 25, by up to
    15% (V4-Pro TP 1 wo_a 18.03 -> 20.72 at one token; V4-Flash TP 1 wo_b 13.70 -> 14.65 at 32 tokens). Against
    128-column mma.sync tiles (twice the weight rows a CTA) it was slower at 8 of 12 points (V4-Flash TP 1 wq_b 12.07
    -> 13.94 at 32), so those stay."""
    if not (arch.has_wgmma and num_tokens <= DECODE_MID_M and pick.get("ring") and not pick.get("swap")
            and pick["block_n"] == 64):
        return None
    q = streaming_candidate(pick, num_tokens)
    share = q["k"] // BLOCK_K // q["split"]
    if ctas_by_smem(arch, gemm_smem_bytes(q)) <= 2 or (q["block_m"] == 8 and share < STREAMING_SWAP_MAX_SHARE):
        return q
    return None


def gemm_params(arch: ArchProfile, n: int, k: int, num_tokens: int, groups: int = 1) -> dict:
    """The schedule: pure in (arch, n, k, groups, num_tokens)."""
    swapped = swap_params(arch, n, k, groups, num_tokens)
    if uses_rows(n, k, groups, num_tokens):   # up to 8 tokens, in the rows form's domain (fp8_gemm_rows)
        if swapped and swapped["split"] == 1:   # no split-K either (see the note above)
            return swapped
        return rows_params(n, k, groups, min(_STAGE_BUDGET[0], arch.max_smem_per_block))
    if swapped:
        return swapped
    p = _gemm_params(arch, n, k, num_tokens, groups)
    streamed = streaming_swap_params(arch, p, num_tokens)
    if streamed:
        return streamed
    if DECODE_MID_M < num_tokens <= DECODE_MAX_M and not arch.has_wgmma and p["split"] >= MID_TILES_MIN_SPLIT:
        return _gemm_params(arch, n, k, num_tokens, groups, DECODE_MID_M)
    return p


def _gemm_params(arch: ArchProfile, n: int, k: int, num_tokens: int, groups: int, mid_block_m: int = 0) -> dict:
    """gemm_params' pick with one M tile size; mid_block_m: 32-row tiles at 33..64 rows."""
    kb = k // BLOCK_K
    if num_tokens <= SPLIT_MAX_M:
        block_m = 16 if num_tokens <= 16 else DECODE_MID_M if num_tokens <= DECODE_MID_M else DECODE_MAX_M
        block_m = mid_block_m or block_m
        m_tiles = -(-num_tokens // block_m) if num_tokens <= DECODE_MAX_M else 2
        block_n = 128 if n % 128 == 0 and m_tiles * groups * n // 128 >= arch.num_sms_hint else 64
        tiles = m_tiles * groups * n // block_n
        if num_tokens <= DECODE_MAX_M:
            split = decode_split(tiles, kb, arch.num_sms_hint)
        else:   # partial bytes split * SPLIT_MAX_M * N * 4 <= weight bytes N * K
            split = decode_split(tiles, kb, arch.num_sms_hint, k // (4 * SPLIT_MAX_M))
        threads = 128
        if uses_wgmma(arch, num_tokens) and not mid_block_m:
            return wgmma_params(n, k, kb, groups, num_tokens, block_n, split, arch.num_sms_hint)
    elif uses_wgmma(arch, num_tokens):
        return wgmma_params(n, k, kb, groups, num_tokens, 0, 1, arch.num_sms_hint)
    else:
        block_m, block_n, threads = _LARGE_TILE
        if n % block_n:
            block_n = 64
        split = 1
    p = {"n": n, "k": k, "groups": groups, "block_m": block_m, "block_n": block_n, "split": split, "threads": threads,
         "stages": _stages(block_m, block_n, kb // split)}
    if num_tokens <= DECODE_MAX_M:
        p.update(ring_stages(p))
        if ring_fill(p, -(-num_tokens // block_m), arch.num_sms_hint):
            p["fill"] = True
    return p


def ring_holds_share(p: Mapping[str, Any]) -> bool:
    """Whether ring variant params `p` hold their CTA's whole K share at once (one slot a stage): what fill needs."""
    kps = p["k"] // BLOCK_K // p["split"]
    return bool(p.get("ring")) and kps % p["k_stage"] == 0 and kps // p["k_stage"] <= p["stages"]


def ring_fill(p: Mapping[str, Any], m_tiles: int, num_sms: int) -> bool:
    """Whether the decode ring requests its CTA's whole weight share before the grid dependency sync (`fill`), not
    its first stages - 1: where the share fits the ring (one slot a stage) and either the ring has one slot (it would
    prefetch nothing) or the grid is at most one CTA an SM. Per layer on an H100, 8 layers a graph, against the
    stages - 1 prefetch: V4-Flash's indexer wq_b (128 CTAs) 6.20 -> 5.80 us at M = 1, 7.18 -> 6.82 at 32; V4-Pro TP 8's
    shared expert w2 (112 CTAs) 3.46 -> 2.81 at M = 1, 4.32 -> 3.70 at 32, and on the SM12x schedule (3 splits, one
    slot) 5.28 -> 4.77. With more CTAs than SMs it was 1-35% slower at 42 of 59 points (V4-Flash shared expert w1+w3,
    256 CTAs, 9.42 -> 9.88; V4-Pro TP 8 shared expert w1+w3, 168 CTAs, 6.06 -> 7.49) and at most 3% faster at 15; the
    SM12x schedule's V4-Pro w1+w3 (28 splits for SM120's 188 SMs: 336 CTAs on the H100) was 24-30% faster at M = 1 / 8,
    a grid this GPU cannot judge for SM120."""
    if not ring_holds_share(p):
        return False
    ctas = m_tiles * p["groups"] * (p["n"] // p["block_n"]) * p["split"]
    return p["stages"] == 1 or ctas <= num_sms


def wgmma_params(n: int, k: int, kb: int, groups: int, num_tokens: int, decode_block_n: int, decode_split_k: int,
                 num_sms: int) -> dict:
    """Hopper past the 32-row decode ring (M > 32). Up to 64 rows: 64 x 64 tiles over one consumer warp group, two
    CTAs an SM (registers capped), split-K until the CTAs reach 2/3 of the SMs; per layer on an H100 against the
    64-row mma.sync ring at M = 64: 1.0-1.4x faster at every V4-Flash TP 1 / V4-Pro TP 8 shape (e.g. V4-Flash
    wo_a 21.9 -> 17.7 us, V4-Pro wq_b 13.0 -> 9.4; benchmarks/gemm/sweep_gemm_decode.py --wgmma). Those are launched
    by PDL and prefetch their first `stages` K blocks of weight into L2 before the grid dependency sync
    (`pdl_prefetch`); per layer on an H100, 6 layers a graph, against the same tiles without: V4-Flash wq_b 18.6 ->
    16.9 us, wo_b 21.0 -> 19.2, indexer wq_b 8.2 -> 7.1, shared expert w1+w3 13.7 -> 11.7, w2 10.1 -> 8.0, wo_a level
    (18.3); V4-Pro TP 8 wq_b 10.1 -> 9.2, wo_b 11.2 -> 10.4, shared expert w2 5.3 -> 4.2 (sweep_gemm_decode.py
    --wgmma --pdl-ab). Prefetching the CTA's whole K share instead was slower where the grid's shares outgrow L2
    (V4-Flash wo_a 22.6, wo_b 20.9). Up to 128 rows
    where the mma.sync rule picked 64-column tiles: those tiles and split. Otherwise the 128 x 128 tile over two
    consumer warp groups, split-K (M <= 256) as the batched decode counts it: faster than the mma.sync form at
    every V4-Flash shape but wo_a (benchmarks/RESULTS.md)."""
    extra = {}
    if num_tokens <= DECODE_MAX_M:
        share, of = WGMMA_DECODE_SM_SHARE
        block_m, block_n, threads = DECODE_MAX_M, 64, 128
        split = decode_split(groups * n // block_n, kb, -(-share * num_sms // of))
        extra = {"pdl_prefetch": wgmma_stages(kb // split, 1)}
    elif num_tokens <= 2 * DECODE_MAX_M and decode_block_n == 64:
        block_m, block_n, threads, split = DECODE_MAX_M, 64, 128, decode_split_k
    else:
        block_m, block_n, threads, _ = _WGMMA_TILE
        if n % block_n:
            block_n = 64
        tiles = -(-num_tokens // block_m) * groups * n // block_n
        if num_tokens <= SPLIT_MAX_M:   # partial bytes split * SPLIT_MAX_M * N * 4 <= weight bytes N * K
            split = decode_split(tiles, kb, num_sms, k // (4 * SPLIT_MAX_M))
        elif 2 * tiles <= num_sms and n % 64 == 0:
            # 128 x 128 tiles would fill at most half the SMs: the 64 x 64 tile (two CTAs an SM) gives 8x the
            # CTAs; past half the SMs the 128 x 128 tile wins (benchmarks/gemm/sweep_gemm_large_m.py --small-tile)
            block_m, block_n, threads, split = DECODE_MAX_M, 64, 128, 1
        else:
            split = 1
            extra = {"tiles_per_cta": tiles_per_cta(n // block_n, tiles, num_sms, kb)}
    return {"n": n, "k": k, "groups": groups, "block_m": block_m, "block_n": block_n, "split": split,
            "threads": threads, "stages": wgmma_stages(kb // split, extra.get("tiles_per_cta", 1)), "wgmma": True,
            **extra}


def wgmma_stages(k_blocks: int, tiles: int) -> int:
    """Pipeline stages of the WGMMA form: _WGMMA_TILE's, at most the K blocks its one pipelined loop walks (a CTA's
    `tiles` N tiles x its `k_blocks` each: the loop runs on from one tile into the next). V4-Pro TP 8's shared expert
    w2 (K = 384, 3 K blocks, 4 tiles a CTA) with 4 stages instead of 3: 25.9 -> 25.0 us at M = 2,048, 87.3 -> 82.7
    at 8,192 (H100, sweep_gemm_large_m.py --stages)."""
    return max(1, min(_WGMMA_TILE[3], k_blocks * tiles))


def tiles_per_cta(n_tiles: int, tiles: int, num_sms: int, k_blocks: int) -> int:
    """N tiles one CTA of Hopper's large-M form walks (1, 2 or 4, dividing the row's n_tiles).

    From 4 waves of single tiles up: 4 where the row has 16 or more and 4 still leave a CTA for every SM, else 2,
    else 1: one pipeline fill then serves several tiles.

    Below 4 waves the last wave's idle SMs weigh more than a pipeline fill: the count with the fewest waves x
    (its K blocks + _TILE_FILL_BLOCKS) a CTA, fewer tiles a CTA on a tie. That may leave SMs without a CTA when it
    saves a wave (the V4 shapes' sweep: benchmarks/RESULTS.md)."""
    if tiles >= 4 * num_sms:
        for t in (4, 2):
            if n_tiles % t == 0 and (t == 2 or n_tiles >= 16) and tiles // t >= num_sms:
                return t
        return 1
    best, pick = None, 1
    for t in (1, 2, 4):
        if n_tiles % t:
            continue
        cost = -(-(tiles // t) // num_sms) * (t * k_blocks + _TILE_FILL_BLOCKS)
        if best is None or cost < best:
            best, pick = cost, t
    return pick


def fitting_stages(p: Mapping[str, Any], budget: int, most: int) -> int:
    """The most pipeline stages of variant params `p` (its stage count ignored) within `budget` bytes of shared
    memory, never above `most` nor the stage-sized K blocks one CTA walks; at least 1."""
    fixed = gemm_smem_bytes({**p, "stages": 0})
    per = gemm_smem_bytes({**p, "stages": 1}) - fixed
    return max(1, min(most, (budget - fixed) // per, p["k"] // BLOCK_K // p["split"] // p.get("k_stage", 1)))


def ring_stages(p: Mapping[str, Any]) -> dict:
    """The decode ring's depth: two K blocks per stage (256 B runs of each weight row per request) where K
    per split is even and two such stages fit _STAGE_BUDGET, else one; then as many stages as fit: close to the
    best candidate of the SM12x-schedule sweep at every V4-Flash shape."""
    kps = p["k"] // BLOCK_K // p["split"]
    two = {**p, "ring": True, "k_stage": 2}
    ks = 2 if kps % 2 == 0 and fitting_stages(two, *_STAGE_BUDGET) >= 2 else 1
    q = {**p, "ring": True, "k_stage": ks}
    return {"ring": True, "k_stage": ks, "stages": fitting_stages(q, *_STAGE_BUDGET)}


def ring_pending(stages: int, n_iters: int) -> list[int]:
    """cp.async groups the ring may leave pending at each iteration and still have its stage's tiles landed.
    Commit order (one group per async copy): the prologue's weight tiles B_0..B_{P-1} (before the grid dependency
    sync), then the activation tiles A_0..A_{P-1} (P = min(stages - 1, n_iters)); iteration i issues B_{i+S-1},
    A_{i+S-1} (while any remain) before it waits for B_i and A_i. The kernel's constant waits must never exceed
    these (tests replay it)."""
    s, n = stages, n_iters
    p = min(s - 1, n)
    order = [("B", i) for i in range(p)] + [("A", i) for i in range(p)]
    pending = []
    for i in range(n):
        if i + s - 1 < n:
            order += [("B", i + s - 1), ("A", i + s - 1)]
        pending.append(len(order) - 1 - max(order.index(("B", i)), order.index(("A", i))))
    return pending


def ring_head_steady_waits(stages: int) -> tuple[int, int]:
    """The ring's two constant waits while stages remain to issue: the first stages - 1 iterations (which wait
    for one stage more than they need), then the steady state (exact)."""
    return stages, 2 * (stages - 1)


def ring_wait(stages: int, n_iters: int, i: int) -> int:
    """The wait_group the kernel issues at iteration i (its three branches, in Python)."""
    head, steady = ring_head_steady_waits(stages)
    if i + stages - 1 < n_iters:
        return head if i < stages - 1 else steady
    return 0


# one bulk prefetch of `bytes` (a multiple of 16) from global memory into L2 (sm_90+)
_PREFETCH_SRC = r"""
__device__ __forceinline__ void dsv4_prefetch_l2(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
}
"""


def build_fp8_gemm(*, n: int, k: int, block_m: int, block_n: int, split: int, stages: int, threads: int,
                   groups: int = 1, ring: bool = False, k_stage: int = 1, wgmma: bool = False,
                   tiles_per_cta: int = 1, fill: bool = False, panel: int = WGMMA_PANEL, pdl_prefetch: int = -1,
                   swap: bool = False):
    import tilelang.language as T

    BM, BN, BK = block_m, block_n, BLOCK_K
    KB = k // BK
    KPS = KB // split
    NQ = (n + QBLOCK - 1) // QBLOCK
    G = groups
    f32 = "float32"
    M = T.dynamic("num_tokens")
    policy = T.GemmWarpPolicy.FullCol if BM <= 64 else T.GemmWarpPolicy.Square
    KS, S = k_stage, stages
    W = KS * BK                      # K columns per ring stage
    NK = KPS // KS                   # ring iterations per CTA
    HEAD_WAIT, STEADY_WAIT = ring_head_steady_waits(S)   # never above ring_pending's replay (tests)
    if fill and not (ring and NK <= S):
        raise ValueError(f"fp8_gemm: fill needs the decode ring with the CTA's {NK} stages within its {S} slots")
    PRE = NK if fill else min(S - 1, NK)   # weight stages requested before the grid dependency sync
    if pdl_prefetch >= 0 and not wgmma:
        raise ValueError("fp8_gemm: pdl_prefetch belongs to the WGMMA form (the decode ring has its own PDL prefetch)")
    if swap and not (ring and BN == 64 and threads == 128 and BM % 8 == 0):
        raise ValueError("fp8_gemm: swap is the decode ring's WGMMA form: 64 weight rows over one warp group, "
                         f"tokens a multiple of 8 (got block_n {BN}, threads {threads}, block_m {BM}, ring {ring})")
    # swap: the weight tile is the MMA's M side (wgmma m64, 64 weight rows) and the token tile its N side, so the
    # accumulators are [weight rows, tokens]
    ACC = (BN, BM) if swap else (BM, BN)

    @T.macro
    def mainloop_pipelined(a, sa, b, sb, acc, bx, by, g, sp):
        a_s = T.alloc_shared((BM, BK), FP8)
        b_s = T.alloc_shared((BN, BK), FP8)
        sc_s = T.alloc_shared((BM,), f32)
        part = T.alloc_fragment((BM, BN), f32)
        T.clear(acc)
        for kk in T.Pipelined(KPS, num_stages=stages):
            for i, j in T.Parallel(BM, BK):
                a_s[i, j] = a[T.min(by * BM + i, M - 1), g * k + (sp * KPS + kk) * BK + j]
            T.copy(b[g * n + bx * BN, (sp * KPS + kk) * BK], b_s)
            for i in T.Parallel(BM):
                sc_s[i] = (sa[T.min(by * BM + i, M - 1), g * KB + sp * KPS + kk]
                           * sb[g * NQ + (bx * BN) // QBLOCK, sp * KPS + kk])
            T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True, policy=policy)
            for i, j in T.Parallel(BM, BN):
                acc[i, j] += part[i, j] * sc_s[i]

    TPC = tiles_per_cta
    STORE_IN_LOOP = wgmma and split == 1
    # a wgmma is 64 rows: 64-row tiles give each consumer warp group a 64-column slice, taller ones 64 rows each
    wg_policy = T.GemmWarpPolicy.FullCol if BM == 64 else T.GemmWarpPolicy.FullRow

    @T.macro
    def mainloop_wgmma(a, sa, b, sb, acc, c, bx, by, g, sp):
        # T.copy -> TMA into the pipeline's stages (rows past M zero-filled), T.gemm -> wgmma (each consumer warp
        # group a 64 x BN slice: FullRow), the scaled add in registers. The scales go from global memory straight
        # into a fragment (each thread's rows), loaded before the wgmma so their latency hides behind it; a shared
        # store would land in the producer, which then keeps its registers (no setmaxnreg split).
        # Without split the CTA walks TPC N tiles in one pipelined loop and stores each tile's C (by TMA, from a
        # shared tile) at its last K block, so the next tile's first stages load during that epilogue: one pipeline
        # fill per TPC tiles (see tiles_per_cta).
        a_s = T.alloc_shared((BM, BK), FP8)
        b_s = T.alloc_shared((BN, BK), FP8)
        part = T.alloc_fragment((BM, BN), f32)
        sc = T.alloc_fragment((BM,), f32)
        if BM == 64 and BN // (threads // 128) == 64:
            # 32 + 32 accumulators a thread: no setmaxnreg split (it would take 240 registers a thread and one
            # CTA an SM) but two CTAs an SM (90 registers)
            T.no_set_max_nreg()
            T.annotate_min_blocks_per_sm(2)
        T.use_swizzle(panel_size=panel)
        if pdl_prefetch >= 0:
            # launched behind its producer by PDL. Nothing upstream writes the weight: the first pdl_prefetch K
            # blocks of the CTA's weight rows head for L2 before the grid dependency sync (one bulk prefetch a row),
            # so the pipeline's first TMA loads after the sync hit L2
            if pdl_prefetch > 0:
                T.import_source(_PREFETCH_SRC)
                tx = T.get_thread_binding()
                if tx < BN * TPC:
                    T.call_extern("handle", "dsv4_prefetch_l2",
                                  T.address_of(b[g * n + bx * TPC * BN + tx, (sp * KPS) * BK]),
                                  min(pdl_prefetch, KPS) * BK)
            T.pdl_trigger()
            T.pdl_sync()
        T.clear(acc)
        if STORE_IN_LOOP:
            c_s = T.alloc_shared((BM, BN), "bfloat16")
        for it in T.Pipelined(TPC * KPS, num_stages=stages):
            kk = it % KPS
            col = (bx * TPC + it // KPS) * BN    # this iteration's N tile
            T.copy(a[by * BM, g * k + (sp * KPS + kk) * BK], a_s)
            T.copy(b[g * n + col, (sp * KPS + kk) * BK], b_s)
            for i in T.Parallel(BM):
                sc[i] = (sa[T.min(by * BM + i, M - 1), g * KB + sp * KPS + kk]
                         * sb[g * NQ + col // QBLOCK, sp * KPS + kk])
            T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True, policy=wg_policy)
            for i, j in T.Parallel(BM, BN):
                acc[i, j] += part[i, j] * sc[i]
            if STORE_IN_LOOP:
                if kk == KPS - 1:   # through shared memory, one TMA store (rows past M are clipped by the copy)
                    T.copy(acc, c_s)
                    T.copy(c_s, c[by * BM, g * n + col])
                    T.clear(acc)

    @T.macro
    def issue(src, rows, row0, col0, dst, slot):
        T.async_copy(src[row0: row0 + rows, col0: col0 + W], dst[slot, :, :])

    @T.macro
    def stage_mma(a_w, b_w, sc_all, part, acc, slot, ks):
        # ring slot `slot` (the CTA's stage ks): each of its K blocks' A.B into part, added to acc times its scales
        for u in T.unroll(KS):
            if swap:   # wgmma m64 x BM: the weight tile times the token tile, both K-major in shared memory
                T.gemm(b_w[slot, :, u * BK:(u + 1) * BK], a_w[slot, :, u * BK:(u + 1) * BK], part,
                       transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for j, i in T.Parallel(BN, BM):
                    acc[j, i] += part[j, i] * sc_all[i, ks * KS + u]
            else:
                T.gemm(a_w[slot, :, u * BK:(u + 1) * BK], b_w[slot, :, u * BK:(u + 1) * BK], part,
                       transpose_B=True, clear_accum=True, policy=policy)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += part[i, j] * sc_all[i, ks * KS + u]

    @T.macro
    def landed():
        # the slot's cp.async bytes are in: with swap the wgmma reads them through the async proxy, so each
        # thread's generic-proxy writes are fenced for it before the barrier
        if swap:
            T.fence_proxy_async()
        T.sync_threads()

    @T.macro
    def mainloop_ring(a, sa, b, sb, acc, bx, by, g, sp):
        # Decode: the weight is the only big operand and nothing upstream writes it, so its first S - 1 stages
        # are requested before the grid dependency sync (PDL): launched behind the previous kernel, this CTA
        # may stream weights while that kernel drains. Activations, scales and every global write come after
        # the sync. A hand-written cp.async ring (T.async_copy + constant waits, see ring_pending); rows of the
        # activation tile past M are zero-filled by the copy's bounds check and never stored.
        a_w = T.alloc_shared((S, BM, W), FP8)
        b_w = T.alloc_shared((S, BN, W), FP8)
        sc_all = T.alloc_shared((BM, KPS), f32)
        part = T.alloc_fragment(ACC, f32)
        T.pdl_trigger()   # this kernel's dependents may launch (and prefetch) once all its CTAs run
        T.clear(acc)
        b_row = g * n + bx * BN
        k_col = (sp * KPS) * BK
        for st in T.unroll(PRE):
            issue(b, BN, b_row, k_col + st * W, b_w, st)
        T.pdl_sync()
        for st in T.unroll(PRE):
            issue(a, BM, by * BM, g * k + k_col + st * W, a_w, st)
        for i, c in T.Parallel(BM, KPS):
            sc_all[i, c] = (sa[T.min(by * BM + i, M - 1), g * KB + sp * KPS + c]
                            * sb[g * NQ + (bx * BN) // QBLOCK, sp * KPS + c])
        if fill:
            # the CTA's whole share is in flight (see ring_fill): one wait, then the MMAs
            T.ptx_wait_group(0)
            landed()
            for ks in T.serial(NK):
                stage_mma(a_w, b_w, sc_all, part, acc, ks, ks)
        else:
            for ks in T.serial(NK):
                T.sync_threads()   # every warp is done with the slot the next issue overwrites
                if ks + S - 1 < NK:
                    issue(b, BN, b_row, k_col + (ks + S - 1) * W, b_w, T.floormod(ks + S - 1, S))
                    issue(a, BM, by * BM, g * k + k_col + (ks + S - 1) * W, a_w, T.floormod(ks + S - 1, S))
                # one branch (each `if` gets a barrier of its own from TileLang): the steady state waits exactly;
                # the first S - 2 iterations wait for one stage more than they need, the last S - 1 for everything
                if ks + S - 1 < NK:
                    if ks < S - 1:
                        T.ptx_wait_group(HEAD_WAIT)
                    else:
                        T.ptx_wait_group(STEADY_WAIT)
                else:
                    T.ptx_wait_group(0)
                landed()
                stage_mma(a_w, b_w, sc_all, part, acc, T.floormod(ks, S), ks)

    mainloop = mainloop_ring if ring else mainloop_pipelined

    if split == 1:
        @T.prim_func
        def fp8_gemm(
            a: T.Tensor[(M, G * k), FP8],
            sa: T.Tensor[(M, G * KB), f32],
            b: T.Tensor[(G * n, k), FP8],
            sb: T.Tensor[(G * NQ, KB), f32],
            c: T.Tensor[(M, G * n), "bfloat16"],
        ):
            with T.Kernel(n // BN // TPC, T.ceildiv(M, BM), G, threads=threads) as (bx, by, g):
                acc = T.alloc_fragment(ACC, f32)
                if wgmma:   # stores C itself, tile by tile
                    mainloop_wgmma(a, sa, b, sb, acc, c, bx, by, g, 0)
                elif swap:
                    mainloop(a, sa, b, sb, acc, bx, by, g, 0)
                    for j, i in T.Parallel(BN, BM):
                        if by * BM + i < M:
                            c[by * BM + i, g * n + bx * BN + j] = T.Cast("bfloat16", acc[j, i])
                else:
                    mainloop(a, sa, b, sb, acc, bx, by, g, 0)
                    for i, j in T.Parallel(BM, BN):
                        if by * BM + i < M:
                            c[by * BM + i, g * n + bx * BN + j] = T.Cast("bfloat16", acc[i, j])

        return fp8_gemm

    @T.macro
    def split_partial(a, sa, b, sb, acc, partial, bx, by, bz):
        # this CTA's share of K (split bz % split of group bz // split) into acc, stored as its split's partial
        if wgmma:
            mainloop_wgmma(a, sa, b, sb, acc, partial, bx, by, bz // split, bz % split)
        else:
            mainloop(a, sa, b, sb, acc, bx, by, bz // split, bz % split)
        if swap:
            for j, i in T.Parallel(BN, BM):
                if by * BM + i < M:
                    partial[bz % split, by * BM + i, (bz // split) * n + bx * BN + j] = acc[j, i]
        else:
            for i, j in T.Parallel(BM, BN):
                if by * BM + i < M:
                    partial[bz % split, by * BM + i, (bz // split) * n + bx * BN + j] = acc[i, j]

    if not sums_in_kernel({"split": split, "block_m": BM}):
        @T.prim_func
        def fp8_gemm_splitk(
            a: T.Tensor[(M, G * k), FP8],
            sa: T.Tensor[(M, G * KB), f32],
            b: T.Tensor[(G * n, k), FP8],
            sb: T.Tensor[(G * NQ, KB), f32],
            partial: T.Tensor[(split, M, G * n), f32],
        ):
            with T.Kernel(n // BN, T.ceildiv(M, BM), G * split, threads=threads) as (bx, by, bz):
                acc = T.alloc_fragment(ACC, f32)
                split_partial(a, sa, b, sb, acc, partial, bx, by, bz)

        return fp8_gemm_splitk

    NT = n // BN

    @T.prim_func
    def fp8_gemm_splitk(
        a: T.Tensor[(M, G * k), FP8],
        sa: T.Tensor[(M, G * KB), f32],
        b: T.Tensor[(G * n, k), FP8],
        sb: T.Tensor[(G * NQ, KB), f32],
        partial: T.Tensor[(split, M, G * n), f32],
        counters: T.Tensor[(T.ceildiv(M, BM) * G * NT,), "int32"],
        c: T.Tensor[(M, G * n), "bfloat16"],
    ):
        with T.Kernel(NT, T.ceildiv(M, BM), G * split, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment(ACC, f32)
            red = T.alloc_fragment((BM, BN), f32)
            last = T.alloc_shared((1,), "int32")
            tx = T.get_thread_binding()
            g = bz // split
            split_partial(a, sa, b, sb, acc, partial, bx, by, bz)
            # Split-K fixup in this launch (no reduce kernel): the tile's last CTA to count in sums the partials.
            # Thread 0's acq_rel count releases this CTA's partial (the barrier orders the other threads' stores
            # before it) and, in the last CTA, acquires the others'; that CTA leaves the counter zero for the next
            # launch. The partials are summed in split order, so C does not depend on which CTA came last.
            T.sync_threads()
            if tx == 0:
                last[0] = T.atomic_add(counters[(by * G + g) * NT + bx], 1, memory_order="acq_rel", return_prev=True)
            T.sync_threads()
            if last[0] == split - 1:
                if tx == 0:
                    counters[(by * G + g) * NT + bx] = 0
                T.clear(red)
                for s in T.serial(split):
                    for i, j in T.Parallel(BM, BN):
                        red[i, j] += T.if_then_else(by * BM + i < M,
                                                    partial[s, T.min(by * BM + i, M - 1), g * n + bx * BN + j], 0.0)
                for i, j in T.Parallel(BM, BN):
                    if by * BM + i < M:
                        c[by * BM + i, g * n + bx * BN + j] = T.Cast("bfloat16", red[i, j])

    return fp8_gemm_splitk


REDUCE_COLS = 1024
REDUCE_THREADS = 128


def build_gemm_reduce(*, cols: int = REDUCE_COLS, threads: int = REDUCE_THREADS):
    """c[m, n] = bf16(sum_s partial[s, m, n]); split, M and N all dynamic (one variant for every GEMM)."""
    import tilelang.language as T

    M = T.dynamic("num_tokens")
    N = T.dynamic("n")
    S = T.dynamic("split")

    @T.prim_func
    def fp8_gemm_reduce(
        partial: T.Tensor[(S, M, N), "float32"],
        c: T.Tensor[(M, N), "bfloat16"],
    ):
        with T.Kernel(T.ceildiv(N, cols), M, threads=threads) as (bx, m):
            acc = T.alloc_fragment((cols,), "float32")
            T.pdl_trigger()   # the next layer's GEMM may launch and start streaming its weight
            T.pdl_sync()      # launched behind the split GEMM (PDL): its partials are complete past here
            T.clear(acc)
            for s in T.serial(S):
                for j in T.Parallel(cols):
                    acc[j] += T.if_then_else(bx * cols + j < N, partial[s, m, T.min(bx * cols + j, N - 1)], 0.0)
            for j in T.Parallel(cols):
                if bx * cols + j < N:
                    c[m, bx * cols + j] = T.Cast("bfloat16", acc[j])

    return fp8_gemm_reduce


class _GemmSpecBase(KernelSpec):
    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = dict(get_profile(variant.schedule).pass_configs)
        cfg["tl.disable_vectorize_256"] = True  # 16-byte vectors only: the SM12x schedule proven on sm_90a
        if variant.p.get("swap"):
            # the decode ring's WGMMA form: wgmma on the hand-written cp.async ring (no TMA, no warp specialization)
            cfg[DISABLE_WGMMA] = False
            return cfg
        if variant.p.get("wgmma"):
            # Hopper's large-M form: TMA, warp specialization and WGMMA, the pipeline TileLang's examples use
            cfg.update({DISABLE_WGMMA: False, DISABLE_TMA_LOWER: False, DISABLE_WARP_SPECIALIZED: False})
            return cfg
        # mma.sync (fp8 m16n8k32) elsewhere: WGMMA variants of our register-staged kernels gave wrong results on
        # an H100 (threads' shared stores read by the async proxy)
        cfg[DISABLE_WGMMA] = True
        return cfg


@register
class Fp8GemmSpec(_GemmSpecBase):
    """C = A . B^T with per-token 1x128 (A) and 128x128 block (B) scales. Statics: n, k (multiples of 64 /
    128), groups (optional, default 1: the grouped form, see the module doc). Split-K variants (split > 1) write fp32
    partials [split, M, N]; those that sum them in the launch (sums_in_kernel) also take the tiles' arrival counters
    (see ops.py's workspace) and C."""
    name = "fp8_gemm"
    # split > 1: ("a", "sa", "b", "sb", "partial", "counters", "c") summed in the launch, else (..., "partial")
    arg_names = ("a", "sa", "b", "sb", "c")

    def static_params(self, model, parallel) -> dict[str, Any]:
        # one static per weight shape: family.uses lists them (derived from the model config)
        return {"n": int(model.hidden_size), "k": int(model.hidden_size)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        n = int_param(self.name, static, "n", multiple=64)
        k = int_param(self.name, static, "k", multiple=BLOCK_K)
        groups = int_param(self.name, static, "groups") if "groups" in static else 1
        return Variant.make(self.name, gemm_params(arch, n, k, num_tokens, groups), arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return gemm_smem_bytes(variant.p)

    def build(self, variant: Variant):
        p = variant.p
        if p.get("rows"):
            return build_fp8_gemm_rows(n=p["n"], k=p["k"], groups=p["groups"], cols=p["block_n"],
                                       warps=p["threads"] // 32, stages=p["stages"], block_m=p["block_m"])
        return build_fp8_gemm(n=p["n"], k=p["k"], block_m=p["block_m"], block_n=p["block_n"], split=p["split"],
                              stages=p["stages"], threads=p["threads"], groups=p["groups"],
                              ring=p.get("ring", False), k_stage=p.get("k_stage", 1), wgmma=p.get("wgmma", False),
                              tiles_per_cta=p.get("tiles_per_cta", 1), fill=p.get("fill", False),
                              panel=p.get("panel", WGMMA_PANEL), pdl_prefetch=p.get("pdl_prefetch", -1),
                              swap=p.get("swap", False))


@register
class Fp8GemmReduceSpec(_GemmSpecBase):
    """Sums split-K partials [split, M, N] fp32 into C [M, N] bf16. No statics: one variant per arch."""
    name = "fp8_gemm_reduce"
    arg_names = ("partial", "c")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        if not isinstance(static, Mapping):
            raise ValueError(f"{self.name}: static params must be a mapping, got {static!r}")
        return Variant.make(self.name, {"cols": REDUCE_COLS, "threads": REDUCE_THREADS}, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return 0

    def build(self, variant: Variant):
        return build_gemm_reduce(cols=variant.p["cols"], threads=variant.p["threads"])
