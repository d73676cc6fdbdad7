"""FP8 block-scaled GEMM, rows form: fp8_gemm's decode schedule for up to 8 tokens (see fp8_gemm.select), the same
math as its other forms (module doc of fp8_gemm.py):

    C[M, N] bf16 = sum over 128-wide K blocks kb of  sa[m, kb] * sb[n // 128, kb] * (A[m, kb] . B[n, kb])

A CTA owns `cols` weight rows (output columns) over the whole K, and its warps split K (warp w takes K blocks w,
w + warps, ...), each with a cp.async ring of its own: no CTA barrier in the main loop, and no split-K across CTAs,
so no partials in global memory, arrival counter or reduce kernel behind it; the warps' sums meet once in shared
memory. The weight is the mma's A operand (m16 tiles of weight rows), the up-to-8 tokens its B operand (one n8
half): mma.sync m16n8k32 e4m3 with fp32 accumulation, the four 32-wide slices of a K block summed by the mma itself,
then scaled once a K block (sa of the token x sb of the CTA's 128-row weight block). SM12x runs e4m3 mma.sync
natively; ptxas emulates it on Hopper (as it does the mma.sync forms of fp8_gemm there).

Operand registers straight from shared memory, no ldmatrix: the K order inside a 32-wide slice is permuted so that
a lane's 8 bytes at 8g (g = lane % 4) of a row are its two registers, mma k 4g..4g+3 <-> bytes 8g..8g+3 and k
16+4g..16+4g+3 <-> bytes 8g+4..8g+7, for the weight rows and the tokens alike (a dot product is a sum over k, so
the result is the same). A row's 16-byte chunk c is stored at chunk c ^ (row & 7): a warp's 8-byte loads of one
slice fall in 2 wavefronts.

A CTA takes 8 tokens where select runs the form; `block_m` 16 / 32 / 64 (2-8 n8 halves, each weight fragment used by
every half) is a sweep's candidate, slower than the other forms on Hopper from 16 tokens (docs/kernels.md).

PDL: the kernel triggers its dependents at its start, and requests its weight (and the weight's block scales) before
the grid dependency sync: its first stages - 1 stages, or every stage where the warp's whole K share fits its ring
(`stages` >= the warp's K blocks). Activations, their scales and C come after the sync. Token rows past M are
zero-filled (nothing read) and never stored.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

QBLOCK = 128               # K block (the scales' group along K) and the weight scale's row block
TOKENS = 8                 # token rows of one n8 half: the tokens a CTA takes where select runs the form
BLOCK_MS = (8, 16, 32, 64)  # token rows a CTA (block_m): 1, 2, 4 or 8 n8 halves, each weight fragment used by all
COLS = (16, 32, 64)        # weight rows a CTA: 1, 2 or 4 m16 tiles
MAX_WARPS = 8
ROW_WORDS = QBLOCK // 4    # 32-bit words of one row's K block (128 fp8)


def scale_words(block_m: int = TOKENS) -> int:
    """A slot's block_m activation scales, its weight scale and padding (16-byte aligned slots)."""
    return block_m + 4


def slot_words(cols: int, block_m: int = TOKENS) -> int:
    """One ring slot: a K block of the CTA's weight rows and of its tokens, their scales."""
    return (cols + block_m) * ROW_WORDS + scale_words(block_m)


def warp_k_blocks(k: int, warps: int) -> int:
    return k // QBLOCK // warps


def ring_slots(k: int, warps: int, stages: int) -> int:
    """Slots a warp's ring holds: `stages`, or the warp's K blocks where fewer (its whole share: `fill`)."""
    return min(stages, warp_k_blocks(k, warps))


def rows_fill(p: Mapping[str, Any]) -> bool:
    """Whether the warp's whole K share is requested before the grid dependency sync (its ring holds it)."""
    return p["stages"] >= warp_k_blocks(p["k"], p["threads"] // 32)


def rows_pending(stages: int, n_iters: int) -> list[int]:
    """cp.async groups a lane may leave pending at each iteration and still have its stage landed. Commit order:
    the prologue's weight groups W_0..W_{P-1} (before the grid dependency sync), its activation groups
    A_0..A_{P-1}, then one group an iteration (stage i + P's weight and activations, or empty), P = the stages
    requested ahead (all of them where `stages` covers the warp's K blocks). The kernel waits for rows_wait at every
    iteration: never more than this (tests replay it)."""
    p = rows_wait(stages, n_iters)
    order = [("W", i) for i in range(p)] + [("A", i) for i in range(p)]
    pending = []
    for i in range(n_iters):
        order.append(("G", i + p) if i + p < n_iters else ("empty", i))
        last = max(j for j, (kind, st) in enumerate(order) if st == i and kind != "empty")
        pending.append(len(order) - 1 - last)
    return pending


def rows_wait(stages: int, n_iters: int) -> int:
    """The stages requested ahead (the prologue's: all of them where `stages` covers the warp's K blocks), which is
    also the one wait_group of the kernel's K loop."""
    return n_iters if stages >= n_iters else stages - 1


def rows_smem_bytes(p: Mapping[str, Any]) -> int:
    """Pre-nvcc shared memory: every warp's ring (the warps' sums reuse it at the end)."""
    warps, bm = p["threads"] // 32, p.get("block_m", TOKENS)
    ring = warps * ring_slots(p["k"], warps, p["stages"]) * slot_words(p["block_n"], bm)
    red = warps * bm * (p["block_n"] + 4)
    return 4 * max(ring, red)


# Where select runs the rows form (up to TOKENS tokens): K from ROWS_K[0] to ROWS_K[1] and G x N up to ROWS_MAX_N,
# the V4 shapes where it beat the split-K ring at every one of 1, 4 and 8 tokens or was level (per layer on an H200,
# 8 layers a graph, same call: V4-Flash TP 1 wq_a+wkv 5.66 -> 4.38 us at one token, 5.64 -> 4.62 at 4, 5.66 -> 4.98
# at 8; wo_a 11.78 -> 10.62; shared expert w2 5.51 -> 4.89, w1+w3 8.07 -> 7.56; indexer wq_b 4.86 -> 4.50; V4-Pro TP 8
# wq_b 6.67 -> 5.97, wo_a 5.84 -> 5.26, wo_b 7.38 -> 6.44; at 8 tokens indexer wq_b and w1+w3 level). Outside it the
# ring stays: K = 8,192 (V4-Flash wo_b) level to 4% slower, K = 7,168 12% slower at 8 tokens, K = 384 mixed (V4-Pro
# shared expert w2: 2.75 -> 2.60 at one token, 2.78 -> 2.89 at 8), N = 32,768 (V4-Flash wq_b, where the unsplit ring
# runs at 1.05x its floor) 30% slower.
ROWS_K = (1024, 4096)
ROWS_MAX_N = 8192
# and G x N from ROWS_MIN_N: the fewest CTAs measured (96 of 16 columns, V4-Flash wq_a+wkv); narrower weights (TP 4 /
# 8 shapes of 512-1,024 columns) would run on a quarter to half of the SMs, where the ring splits K over all of them
ROWS_MIN_N = 1536
# Columns a CTA: 16 where G x N is at most ROWS_NARROW_N (96-128 CTAs), else 32 (128-256 CTAs); 64 was slower at every
# shape it ran (fewer CTAs). Warps: 8 for 16-column CTAs (twice the bytes in flight on their fewer SMs), else 4 with
# deeper rings, or 8 where K has at most 8 blocks (one a warp). Stages: as many as the stage budget holds, the warp's
# whole share where it fits (requested before the grid dependency sync).
ROWS_NARROW_N = 2048


def uses_rows(n: int, k: int, groups: int, num_tokens: int) -> bool:
    return num_tokens <= TOKENS and ROWS_K[0] <= k <= ROWS_K[1] and ROWS_MIN_N <= groups * n <= ROWS_MAX_N


def rows_params(n: int, k: int, groups: int, budget: int, cols: int | None = None, warps: int | None = None,
                block_m: int = TOKENS) -> dict:
    """The rows form's schedule for a shape in its domain (uses_rows), within `budget` bytes of shared memory; `cols`,
    `warps` (a divisor of the K blocks) and `block_m` (tokens a CTA) replace the rule's (sweeps)."""
    kb = k // QBLOCK
    cols = cols or (16 if groups * n <= ROWS_NARROW_N else 32)
    if warps is None:
        warps = 8 if cols == 16 or kb <= 8 else 4
        while kb % warps:
            warps -= 1
    p = {"n": n, "k": k, "groups": groups, "block_m": block_m, "block_n": cols, "split": 1, "threads": 32 * warps,
         "stages": warp_k_blocks(k, warps), "rows": True}
    while p["stages"] > 1 and rows_smem_bytes(p) > budget:
        p["stages"] -= 1
    return p


def check_rows_params(n: int, k: int, cols: int, warps: int, stages: int, block_m: int = TOKENS) -> None:
    kb = k // QBLOCK
    if (cols not in COLS or n % cols or k % QBLOCK or not 1 <= warps <= min(MAX_WARPS, kb) or kb % warps
            or stages < 1 or block_m not in BLOCK_MS):
        raise ValueError(f"fp8_gemm rows form: cols {cols} / {warps} warps / {stages} stages / block_m {block_m} is "
                         f"not a schedule of N = {n}, K = {k} (cols in {COLS} dividing N, 1..{MAX_WARPS} warps "
                         f"dividing the {kb} K blocks, stages >= 1, block_m in {BLOCK_MS})")


def build_fp8_gemm_rows(*, n: int, k: int, groups: int, cols: int, warps: int, stages: int, block_m: int = TOKENS):
    import tilelang.language as T

    check_rows_params(n, k, cols, warps, stages, block_m)
    BM, J = block_m, block_m // TOKENS           # token rows a CTA, and the n8 halves each weight fragment serves
    G, KB = groups, k // QBLOCK
    NQ = (n + QBLOCK - 1) // QBLOCK
    NKW = warp_k_blocks(k, warps)                 # K blocks a warp walks
    SL = ring_slots(k, warps, stages)             # its ring's slots
    PRE = rows_wait(stages, NKW)                  # stages requested ahead (weights before the grid sync)
    SLOT = slot_words(cols, BM)
    ACT0 = cols * ROW_WORDS                       # a slot's token rows, then its scales
    SC0 = ACT0 + BM * ROW_WORDS
    WARP_WORDS = SL * SLOT
    RED_PITCH = cols + 4
    TL = cols // 16
    NACC = 4 * TL * J                             # a lane's accumulators: [tile][half][c 4]
    OUT_STEPS = -(-BM * cols // (32 * warps))
    f32, u32 = "float32", "uint32"
    M = T.dynamic("num_tokens")
    MMA = ("tl::mma_sync<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, "
           "16, 8, 32, false, true>")

    def swz(row, chunk):
        """Word offset of a row's 16-byte chunk in a slot's tile (chunk c at c ^ (row & 7))."""
        return row * ROW_WORDS + (chunk ^ (row & 7)) * 4

    @T.macro
    def issue_w(ring, b, sb, g, bx, warp, lane, i):
        # stage i of this warp (K block warp + i * warps): its cols weight rows x 8 chunks, and the block's scale
        kb = warp + i * warps
        base = warp * WARP_WORDS + (i % SL) * SLOT
        for q in T.unroll(cols * 8 // 32):
            row = (q * 32 + lane) // 8
            ch = lane % 8
            T.call_extern("handle", "tl::cp_async_gs<16>", T.address_of(ring[base + swz(row, ch)]),
                          T.address_of(b[g * n + bx * cols + row, kb * QBLOCK + ch * 16]))
        if lane == 0:
            T.call_extern("handle", "tl::cp_async_gs<4>", T.address_of(ring[base + SC0 + BM]),
                          T.address_of(sb[g * NQ + (bx * cols) // QBLOCK, kb]))

    @T.macro
    def issue_a(ring, a, sa, g, by, warp, lane, i):
        # stage i's token rows (8 chunks each) and their scales; rows past M are zero-filled, reading nothing (at one
        # token, reading the last row in their place sent every CTA's 8 copies of it to the same L2 lines)
        kb = warp + i * warps
        base = warp * WARP_WORDS + (i % SL) * SLOT
        for q in T.unroll(BM * 8 // 32):
            t = (q * 32 + lane) // 8
            ch = lane % 8
            T.call_extern("handle", "tl::cp_async_gs_conditional<16>", T.address_of(ring[base + ACT0 + swz(t, ch)]),
                          T.address_of(a[T.min(by * BM + t, M - 1), g * k + kb * QBLOCK + ch * 16]),
                          by * BM + t < M)
        for q in T.unroll(-(-BM // 32)):
            t = q * 32 + lane
            if t < BM:
                T.call_extern("handle", "tl::cp_async_gs_conditional<4>", T.address_of(ring[base + SC0 + t]),
                              T.address_of(sa[T.min(by * BM + t, M - 1), g * KB + kb]), by * BM + t < M)

    @T.prim_func
    def fp8_gemm_rows(
        a: T.Tensor[(M, G * k), "float8_e4m3"],
        sa: T.Tensor[(M, G * KB), f32],
        b: T.Tensor[(G * n, k), "float8_e4m3"],
        sb: T.Tensor[(G * NQ, KB), f32],
        c: T.Tensor[(M, G * n), "bfloat16"],
    ):
        with T.Kernel(n // cols, T.ceildiv(M, BM), G, threads=32 * warps) as (bx, by, g):
            T.import_source("#include <tl_templates/cuda/copy.h>\n#include <tl_templates/cuda/instruction/mma.h>\n")
            ring = T.alloc_shared((max(warps * WARP_WORDS, warps * BM * RED_PITCH),), u32)
            # [tile][half][c 4]: weight rows r / r + 8 of the m16 tile, tokens 8 half + 2g / + 1
            acc = T.alloc_local((NACC,), f32)
            blk = T.alloc_local((NACC,), f32)   # this K block's sums, before its scales
            af = T.alloc_local((4,), u32)
            bf = T.alloc_local((2 * J,), u32)   # each half's token registers, loaded once a slice
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            r = lane // 4
            gq = lane % 4
            base_w = warp * WARP_WORDS
            T.pdl_trigger()   # the kernel behind this one may launch (and request its weight) once all CTAs run
            for i in T.unroll(PRE):
                issue_w(ring, b, sb, g, bx, warp, lane, i)
                T.call_extern("handle", "tl::cp_async_commit")
            T.pdl_sync()      # launched behind its producer (PDL): the activations are complete past here
            for i in T.unroll(PRE):
                issue_a(ring, a, sa, g, by, warp, lane, i)
                T.call_extern("handle", "tl::cp_async_commit")
            for v in T.unroll(NACC):
                acc[v] = 0.0
            for i in T.serial(NKW):
                T.sync_warp()   # every lane is done with slot (i - 1) % SL, which this issue refills
                if i + PRE < NKW:
                    issue_w(ring, b, sb, g, bx, warp, lane, i + PRE)
                    issue_a(ring, a, sa, g, by, warp, lane, i + PRE)
                T.call_extern("handle", "tl::cp_async_commit")   # one group an iteration, empty or not
                T.call_extern("handle", f"tl::cp_async_wait<{PRE}>")
                T.sync_warp()   # the other lanes' copies of slot i % SL are visible
                base = base_w + (i % SL) * SLOT
                for v in T.unroll(NACC):
                    blk[v] = 0.0
                for s in T.unroll(QBLOCK // 32):
                    ch = s * 2 + gq // 2   # the 16-byte chunk holding this lane's 8 bytes of slice s
                    off = (gq % 2) * 2
                    for j in T.unroll(J):
                        bf[2 * j] = ring[base + ACT0 + swz(j * TOKENS + r, ch) + off]
                        bf[2 * j + 1] = ring[base + ACT0 + swz(j * TOKENS + r, ch) + off + 1]
                    for tile in T.unroll(TL):
                        row = tile * 16 + r
                        af[0] = ring[base + swz(row, ch) + off]
                        af[1] = ring[base + swz(row + 8, ch) + off]
                        af[2] = ring[base + swz(row, ch) + off + 1]
                        af[3] = ring[base + swz(row + 8, ch) + off + 1]
                        for j in T.unroll(J):
                            T.call_extern("handle", MMA, T.address_of(blk[(tile * J + j) * 4]), T.address_of(af[0]),
                                          T.address_of(bf[2 * j]))
                wsc = T.reinterpret(ring[base + SC0 + BM], f32)
                for tile in T.unroll(TL):
                    for j in T.unroll(J):
                        for v in T.unroll(4):
                            acc[(tile * J + j) * 4 + v] += blk[(tile * J + j) * 4 + v] * (
                                T.reinterpret(ring[base + SC0 + j * TOKENS + gq * 2 + v % 2], f32) * wsc)
            # the warps' sums, through the (drained) rings: red[warp][token][col]
            T.call_extern("handle", "tl::cp_async_wait<0>")
            T.sync_threads()
            for tile in T.unroll(TL):
                for j in T.unroll(J):
                    for v in T.unroll(4):
                        ring[warp * BM * RED_PITCH + (j * TOKENS + gq * 2 + v % 2) * RED_PITCH + tile * 16
                             + (v // 2) * 8 + r] = T.reinterpret(acc[(tile * J + j) * 4 + v], u32)
            T.sync_threads()
            total = T.alloc_var(f32)
            for q in T.serial(OUT_STEPS):
                idx = q * 32 * warps + tid
                t = T.min(idx // cols, BM - 1)
                col = idx % cols
                total = 0.0
                for wp in T.unroll(warps):   # in warp order: C does not depend on which warp finished first
                    total += T.reinterpret(ring[wp * BM * RED_PITCH + t * RED_PITCH + col], f32)
                if idx < BM * cols and by * BM + t < M:
                    c[by * BM + t, g * n + bx * cols + col] = T.Cast("bfloat16", total)

    return fp8_gemm_rows
