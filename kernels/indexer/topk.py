"""Top-k selection over the indexer logits with page-table translation (`indexer_topk`, `indexer_topk_split`),
in TileLang; the whole selection runs on the GPU (no torch.topk).

indexer_topk, one CTA per query token (row):
  the row's candidate columns are [lo, hi) from row_info [T, 3] = (lo, hi, request) (written by the logits
  kernels, logits.py); column lo + j is compressed position j of that request. With n = hi - lo:
  * n <= topk: every position is taken (no selection), the rest of the row is -1;
  * a row that fits in shared memory (n <= the variant's `resident` keys) is read once into shared memory and
    selected there (_resident_select): a histogram of the keys' top FIRST_BITS = 11 bits (sign, exponent, two
    mantissa bits; order-preserving uint32 keys) gives the threshold bin; one walk puts every key above it in
    the output and copies the bin's columns (usually a few hundred) to a candidate list; two passes of 11 and
    10 bits over the candidates find the exact topk-th largest key; the candidates above it and the first ties
    are collected (ties broken in any order: any is valid). A bin of more than CAND_MAX keys (heavy ties) is
    walked in the row itself, so any distribution is exact with fixed shared memory;
  * a longer row streams from global memory: an exact radix select, 8 bits per pass over 4 passes (a 257-bin
    suffix-summed histogram in shared memory per pass, restricted to the keys that match the prefix chosen so
    far), then one collection pass: every key above the threshold and the first (topk - #above) keys equal to
    it. The passes stop early once the threshold bin holds exactly the keys still needed (the whole bin is
    taken; keys are then compared under the mask of the passes run): continuous logits usually stop after
    pass 3. The first pass's histogram atomics are warp-aggregated (match_any): logits of one row share their
    top key byte (sign + high exponent bits), so plain per-key atomics would all hit one bin and serialize.
    Each pass reads the row from global memory (L2 for the decode rows), LOADS_IN_FLIGHT keys per thread
    before the first use.
  Every walk that places columns counts its items per thread first and takes output slots once per warp and
  class (warp_slots: a shuffle scan and one atomic), and the suffix sums run as warp shuffles.
  Output: indices [T, topk] int32 = slots of the compressed KV cache the sparse-attention kernel reads,
      slot = block_table[request, pos // page_size] * page_size + pos % page_size  (-1 for a -1 page),
  in no particular order (a set), -1 padded; lengths [T] int32 = min(n, topk).

indexer_topk_split, the same select and output for few rows (topk_splits(T, SMs) > 1): each row's columns split
  over up to 16 CTAs in one launch, which meet at row barriers over a workspace [T, ROW_WS] int32 that every
  launch leaves zeroed. Rows up to `solo` columns are selected by one CTA (as above). A row whose slices fit in
  shared memory is read once: the CTAs add their slices' FIRST_BITS-bit histograms into the row's, each places its
  keys above the threshold bin and copies the bin's keys to the row's candidate list, and the last CTA to finish
  selects the candidates (one row barrier). Longer slices stream 8-bit radix passes, a row barrier each. See
  build_topk_split.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import SMEM_RESERVED_PER_CTA, ArchProfile, get_profile
from dsv4_jit.spec import KernelSpec, Variant, register

from dsv4_jit.arch import check_arch, schedule_name
from dsv4_jit.validate import int_param

RADIX = 256
PASSES = 4  # 8 bits each over the 32-bit key
# The resident select's digits: the key's top FIRST_BITS bits, then 11 and 10 (WIDE_BINS bins each pass), over at
# most CAND_MAX candidates after the first pass
FIRST_BITS = 11
WIDE_BINS = 2048
CAND_MAX = 2048
# Both top-k kernels place every barrier they need themselves (T.sync_threads). TileLang's automatic barrier
# insertion sees all shared buffers as one merged allocation, so a data-dependent histogram atomic next to a
# resident-key read put two __syncthreads() inside every per-key loop iteration.
# Every global index of both kernels is in bounds by construction (columns clamped to [lo, lo + n - 1] within the
# width, block-table pages to [0, max_pages - 1] with max_pages >= 1 checked by the op, tokens by the grid), so
# TileLang's per-access guards are off (they were half of the load loop's instructions).
_TOPK_PASS_CONFIGS = {"tl.disable_thread_storage_sync": True, "tl.disable_safe_memory_legalize": True}
# Programmatic dependent launch: both top-k kernels let the kernel behind them (sparse MLA in a decode step) launch
# once they are past their own grid dependency sync, so its launch overlaps the select. Triggering there, not at the
# start, keeps the chain to three grids (the logits kernel triggers at its start), and every kernel ahead of the
# top-k has completed by then.
TOPK_TRIGGER = True
# Keys each thread loads before it uses any of them (registers), so the L2 latency of a pass is paid once
# per 8 keys, and the next 8 load while these are counted (next_keys).
LOADS_IN_FLIGHT = 8



def resident_keys(arch: ArchProfile, fixed: int, ctas_per_sm: int) -> int:
    """Keys (uint32) of one row the CTA keeps in shared memory, a multiple of 1024: the most that fit next to
    `fixed` bytes with `ctas_per_sm` CTAs on one SM (per SM: the per-block maximum + the 1 KB reserve). A row
    that fits is read from global memory once instead of once per radix pass."""
    per_cta = min(arch.max_smem_per_block,
                  (arch.max_smem_per_block + SMEM_RESERVED_PER_CTA) // ctas_per_sm - SMEM_RESERVED_PER_CTA)
    return max(0, (per_cta - fixed) // 4 // 1024 * 1024)


def topk_threads(num_tokens: int, num_sms: int) -> int:
    """Fewer rows than SMs: 1024 threads per row (each row's passes are the critical path). Otherwise 512,
    two CTAs per SM."""
    return 1024 if num_tokens < num_sms else 512


def _a16(n: int) -> int:
    return -(-n // 16) * 16


def scan_warps(threads: int) -> int:
    """Entries of the per-warp scan totals: one per warp of the CTA (the resident select's wide scan), at least
    RADIX / 32 (the streamed select's 256-bin scan)."""
    return max(RADIX // 32, threads // 32)


def topk_smem_bytes(p: Mapping[str, Any]) -> int:
    """Histogram (WIDE_BINS + 1 bins; the streamed passes use its first RADIX + 1), per-warp scan totals, two
    collection counters and the threshold, int32, then the resident row (p["resident"] uint32 keys), its topk
    selected columns and the CAND_MAX candidate columns, each buffer placed at a 16-byte boundary in the merged
    dynamic allocation."""
    return (_a16(4 * (WIDE_BINS + 1)) + _a16(4 * scan_warps(p["threads"])) + _a16(4 * 2) + _a16(4 * 1)
            + _a16(4 * p.get("resident", 0)) + _a16(4 * p["topk"]) + _a16(4 * CAND_MAX))


def _key_and_slot(T, P: int, max_pages):
    """Expression helpers both top-k kernels use: to_key(x) = the order-preserving uint32 key of fp32 x;
    slot(block_table, req, pos) = the compressed-cache slot of position pos of request req (-1 for a -1 page)."""
    def to_key(x):
        bits = T.reinterpret(x, "uint32")
        return T.if_then_else(x < 0, ~bits, bits | T.Cast("uint32", 0x80000000))

    def slot(block_table, req, pos):
        page = block_table[req, T.min(T.floordiv(pos, P), max_pages - 1)]
        return T.if_then_else(page < 0, -1, page * P + T.floormod(pos, P))

    return to_key, slot


def _warp_suffix_total(T):
    """val = warp_suffix_total(x, tx, wsum): the sum of x over this lane and the lanes above it in the warp
    (shuffles); lane 0 also stores its warp's total in wsum[warp]. Both scans' first step; every lane of the warp
    must call it."""
    @T.macro
    def warp_suffix_total(x, tx, wsum):
        val = T.alloc_var("int32")
        other = T.alloc_var("int32")
        val = x
        for st in T.unroll(5):
            other = T.shfl_down(val, 1 << st)
            if tx % 32 + (1 << st) < 32:
                val = val + other
        if tx % 32 == 0:
            wsum[tx // 32] = val
        return val

    return warp_suffix_total


def _scan_threshold(T):
    """scan_threshold(hist, wsum, s_thr, tx, rem, count), every select's scan: given thread tx's bin count `count`
    (bin tx < RADIX: hist[tx] in one CTA, the row's global histogram in the split kernel; the argument is evaluated
    by every thread, so its index must stay in bounds for tx >= RADIX too), hist[b] becomes the
    number of keys whose digit is >= b (suffix sums; hist[RADIX] stays 0), then s_thr[0] the digit of the rem-th
    largest key (exactly one bin has hist[b] >= rem > hist[b + 1]). Within each warp by shuffles, then across the
    RADIX / 32 warp totals: three barriers, the last before s_thr is read."""
    warp_suffix_total = _warp_suffix_total(T)

    @T.macro
    def scan_threshold(hist, wsum, s_thr, tx, rem, count):
        val = T.alloc_var("int32")
        if tx < RADIX:
            val = warp_suffix_total(count, tx, wsum)
        T.sync_threads()
        if tx < RADIX:
            for w in T.unroll(RADIX // 32):
                if w > tx // 32:
                    val = val + wsum[w]
            hist[tx] = val
        T.sync_threads()
        if tx < RADIX:
            if hist[tx] >= rem and hist[tx + 1] < rem:
                s_thr[0] = tx
        T.sync_threads()

    return scan_threshold


def _scan_wide(T, threads: int):
    """scan_wide(hist, wsum, s_thr, tx, rem), the resident select's scan over WIDE_BINS bins (each thread owns
    WIDE_BINS / threads consecutive bins): hist[b] becomes the number of keys whose digit is >= b (hist[WIDE_BINS]
    stays 0), then s_thr[0] the digit of the rem-th largest key. Three barriers. The later warps' totals are
    summed by a butterfly over the warp's lanes (lane l holds warp l's total if l is a later warp): a loop over
    every warp's total cost each thread ~100 instructions a scan at 1,024 threads."""
    assert WIDE_BINS % threads == 0 and threads % 32 == 0
    per, warps = WIDE_BINS // threads, threads // 32
    warp_suffix_total = _warp_suffix_total(T)

    @T.macro
    def scan_wide(hist, wsum, s_thr, tx, rem):
        own = T.alloc_local([per], "int32")
        mine = T.alloc_var("int32")
        val = T.alloc_var("int32")
        later = T.alloc_var("int32")
        mine = 0
        for b in T.unroll(per):
            own[b] = hist[tx * per + b]
            mine = mine + own[b]
        val = warp_suffix_total(mine, tx, wsum)
        T.sync_threads()
        later = T.if_then_else(tx % 32 < warps and tx % 32 > tx // 32, wsum[T.min(tx % 32, warps - 1)], 0)
        for st in T.unroll(5):
            later = later + T.shfl_xor(later, 1 << st)
        val = val + later
        for b in T.unroll(per):  # val: keys in bins >= tx * per + b
            hist[tx * per + b] = val
            val = val - own[b]
        T.sync_threads()
        for b in T.unroll(per):
            if hist[tx * per + b] >= rem and hist[tx * per + b + 1] < rem:
                s_thr[0] = tx * per + b
        T.sync_threads()

    return scan_wide


def _warp_slots(T):
    """warp_slots(cnt, counters, at0, at1, tx, off), counters[at0] / counters[at1] int32 (shared or global): cnt
    packs a thread's item counts of two classes (class 0 in the low 16 bits, class 1 in the high, each < 65,536 a
    warp); off[c] becomes the thread's first output slot of class c: its warp's base from one atomicAdd on its
    counter (lane 31, only for a nonzero count) plus the counts of the lanes below (a shuffle scan). Every lane of
    the warp must call it."""
    @T.macro
    def warp_slots(cnt, counters, at0, at1, tx, off):
        incl = T.alloc_var("int32")
        other = T.alloc_var("int32")
        b0 = T.alloc_var("int32")
        b1 = T.alloc_var("int32")
        incl = cnt
        for st in T.unroll(5):
            other = T.shfl_up(incl, 1 << st)
            if tx % 32 >= (1 << st):
                incl = incl + other
        b0 = 0
        b1 = 0
        if tx % 32 == 31:
            if (incl & 65535) > 0:
                b0 = T.call_extern("int32", "atomicAdd", T.address_of(counters[at0]), incl & 65535)
            if (incl >> 16) > 0:
                b1 = T.call_extern("int32", "atomicAdd", T.address_of(counters[at1]), incl >> 16)
        b0 = T.shfl_sync(b0, 31)
        b1 = T.shfl_sync(b1, 31)
        off[0] = b0 + ((incl - cnt) & 65535)
        off[1] = b1 + ((incl - cnt) >> 16)

    return warp_slots



def _clear_bins(T, threads: int):
    """clear_bins(sh, tx): sh[0:WIDE_BINS + 1] = 0 (no barrier)."""
    @T.macro
    def clear_bins(sh, tx):
        for i in T.serial(T.ceildiv(WIDE_BINS + 1, threads)):
            if i * threads + tx < WIDE_BINS + 1:
                sh[i * threads + tx] = 0

    return clear_bins


def _count_digits(T, threads: int):
    """count_digits(sh, tx, m, key_at, rnd, prefix, mask), the refining pass of every two-level select (after the
    top FIRST_BITS bits): sh[d] becomes how many of the m keys key_at(j), j < m, that match prefix under mask have
    digit d in this pass, bits 10..20 (rnd 0, 11 bits) or 0..9 (rnd 1, 10 bits). Two barriers: sh is cleared, and
    every count has landed when it returns."""
    clear_bins = _clear_bins(T, threads)

    @T.macro
    def count_digits(sh, tx, m, key_at, rnd, prefix, mask):
        kk = T.alloc_var("uint32")
        clear_bins(sh, tx)
        T.sync_threads()
        for j in T.serial(T.ceildiv(m, threads)):
            if j * threads + tx < m:
                kk = key_at(j * threads + tx)
                if (kk & mask) == prefix:
                    T.atomic_add(sh[T.Cast("int32", (kk >> T.Cast("uint32", 10 - 10 * rnd))
                                        & T.Cast("uint32", 2047 - 1024 * rnd))], 1)
        T.sync_threads()

    return count_digits

def _resident_select(T, *, threads: int, topk: int, to_key, slot):
    """The select of a row that fits in shared memory (topk < n <= the resident size), by one CTA; both kernels
    run it. The row is read from global memory once (LOADS_IN_FLIGHT loads per thread in flight), its keys kept
    in `skeys`, and a histogram of their top FIRST_BITS bits counted as they land. One walk over the row then
    places every key above the threshold bin in the output and copies the threshold bin's columns to `cand`
    (up to CAND_MAX); the remaining 21 bits are selected over those candidates in two passes (11 + 10 bits),
    then the candidates are collected. A threshold bin larger than CAND_MAX (heavy ties) runs the same two passes
    and collection over the whole row instead, restricted to the bin: exact for any distribution.
    The walks that place columns count each thread's items first and take output slots once per warp and class
    (warp_slots), then place them (a ballot, an atomic and a shuffle per key and class cost far more)."""
    U = LOADS_IN_FLIGHT
    scan_wide = _scan_wide(T, threads)
    warp_slots = _warp_slots(T)
    count_digits = _count_digits(T, threads)
    clear_bins = _clear_bins(T, threads)
    top_shift = 32 - FIRST_BITS

    @T.macro
    def resident_select(logits, bx, lo, n, req, tx, block_table, indices, skeys, hist, wsum, s_thr, s_cnt, s_pos,
                        cand):
        rem = T.alloc_var("int32")
        thr = T.alloc_var("int32")
        done = T.alloc_var("int32")
        walk = T.alloc_var("int32")    # 1: the candidate passes run
        m = T.alloc_var("int32")       # items the candidate passes walk: candidates, or the whole row
        cnt = T.alloc_var("int32")
        col = T.alloc_var("int32")
        prefix = T.alloc_var("uint32")
        mask = T.alloc_var("uint32")
        kk = T.alloc_var("uint32")
        off = T.alloc_local([2], "int32")
        vals = T.alloc_local([U], "float32")

        rem = topk
        done = 0
        clear_bins(hist, tx)
        if tx == 0:
            s_cnt[0] = 0
            s_cnt[1] = 0
        T.sync_threads()
        # the row lands in skeys; its top FIRST_BITS bits counted with plain shared atomics (the streamed
        # select's warp aggregation, match_any, is slower here)
        for i in T.serial(T.ceildiv(n, threads * U)):
            for u in T.unroll(U):
                vals[u] = logits[bx, lo + T.min((i * U + u) * threads + tx, n - 1)]
            for u in T.unroll(U):
                if (i * U + u) * threads + tx < n:
                    kk = to_key(vals[u])
                    skeys[(i * U + u) * threads + tx] = kk
                    T.atomic_add(hist[T.Cast("int32", kk >> T.Cast("uint32", top_shift))], 1)
        T.sync_threads()
        scan_wide(hist, wsum, s_thr, tx, rem)
        thr = s_thr[0]
        rem = rem - hist[thr + 1]
        if hist[thr] - hist[thr + 1] == rem:  # the whole threshold bin is taken
            done = 1
        walk = 1 - done
        prefix = T.Cast("uint32", thr) << T.Cast("uint32", top_shift)
        mask = T.Cast("uint32", (1 << FIRST_BITS) - 1) << T.Cast("uint32", top_shift)
        # one walk: keys above the threshold bin (all of it when done) -> s_pos; the bin's columns -> cand
        cnt = 0
        for j in T.serial(T.ceildiv(n, threads)):
            if j * threads + tx < n:
                kk = skeys[j * threads + tx]
                cnt = cnt + T.if_then_else((kk & mask) > prefix or (done == 1 and (kk & mask) == prefix), 1,
                                           T.if_then_else((kk & mask) == prefix, 65536, 0))
        warp_slots(cnt, s_cnt, (0,), (1,), tx, off)
        for j in T.serial(T.ceildiv(n, threads)):
            if j * threads + tx < n:
                kk = skeys[j * threads + tx]
                if (kk & mask) > prefix or (done == 1 and (kk & mask) == prefix):
                    s_pos[off[0]] = j * threads + tx
                    off[0] = off[0] + 1
                elif (kk & mask) == prefix:
                    if off[1] < CAND_MAX:
                        cand[off[1]] = j * threads + tx
                    off[1] = off[1] + 1
        T.sync_threads()
        if walk == 1:
            # the threshold bin's keys: its candidates, or (more than CAND_MAX of them) the whole row
            m = T.if_then_else(s_cnt[1] <= CAND_MAX, s_cnt[1], n)
            for rnd in T.serial(2):  # bits 10..20 (11), then 0..9 (10)
                if done == 0:
                    count_digits(hist, tx, m, lambda j: skeys[T.if_then_else(m < n, cand[j], j)], rnd, prefix, mask)
                    scan_wide(hist, wsum, s_thr, tx, rem)
                    thr = s_thr[0]
                    rem = rem - hist[thr + 1]
                    if hist[thr] - hist[thr + 1] == rem:
                        done = 1
                    prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 10 - 10 * rnd))
                    mask = mask | (T.Cast("uint32", 2047 - 1024 * rnd) << T.Cast("uint32", 10 - 10 * rnd))
                    T.sync_threads()  # every thread has read hist before the next pass zeroes it
            # collection within the bin: (key & mask) == prefix is the threshold class (the topk-th largest key,
            # or a whole digit bin after an early exit), the keys above it within the bin continue s_cnt[0] after
            # the keys above the bin; the first rem of the class fill the last rem slots
            if tx == 0:
                s_cnt[1] = 0
            T.sync_threads()
            cnt = 0
            for j in T.serial(T.ceildiv(m, threads)):
                if j * threads + tx < m:
                    col = T.if_then_else(m < n, cand[j * threads + tx], j * threads + tx)
                    kk = skeys[col]
                    cnt = cnt + T.if_then_else(
                        (kk >> T.Cast("uint32", top_shift)) == (prefix >> T.Cast("uint32", top_shift))
                        and (kk & mask) > prefix, 1, T.if_then_else((kk & mask) == prefix, 65536, 0))
            warp_slots(cnt, s_cnt, (0,), (1,), tx, off)
            for j in T.serial(T.ceildiv(m, threads)):
                if j * threads + tx < m:
                    col = T.if_then_else(m < n, cand[j * threads + tx], j * threads + tx)
                    kk = skeys[col]
                    if (kk >> T.Cast("uint32", top_shift)) == (prefix >> T.Cast("uint32", top_shift)) \
                            and (kk & mask) > prefix:
                        s_pos[off[0]] = col
                        off[0] = off[0] + 1
                    elif (kk & mask) == prefix:
                        if off[1] < rem:
                            s_pos[topk - rem + off[1]] = col
                        off[1] = off[1] + 1
            T.sync_threads()
        for t in T.serial(T.ceildiv(topk, threads)):
            if t * threads + tx < topk:
                indices[bx, t * threads + tx] = slot(block_table, req, s_pos[t * threads + tx])

    return resident_select


def build_topk(*, topk: int, page_size: int, threads: int, resident: int, trigger: bool = False):
    import tilelang.language as T

    P, R = page_size, resident
    num_tokens = T.dynamic("num_tokens")
    width = T.dynamic("width")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")

    to_key, slot = _key_and_slot(T, P, max_pages)
    resident_select = _resident_select(T, threads=threads, topk=topk, to_key=to_key, slot=slot)
    scan_threshold = _scan_threshold(T)
    warp_slots = _warp_slots(T)

    U = LOADS_IN_FLIGHT

    @T.macro
    def load_vals(logits, bx, lo, n, i, tx, vals):
        """vals[u] = column (i * U + u) * threads + tx of the row (clamped in bounds: n >= 1 here)."""
        for u in T.unroll(U):
            vals[u] = logits[bx, lo + T.min((i * U + u) * threads + tx, n - 1)]

    @T.macro
    def next_keys(logits, bx, lo, n, i, tx, vals, keys):
        """keys[u] = key of iteration i's columns, from vals (loaded one iteration earlier); then iteration
        i + 1's loads are issued into vals, so they fly while this iteration's keys are counted. The loads
        land in registers before any conversion: converting a load's value in place made TileLang re-load it
        in both arms of to_key's select, branches that kept nvcc from overlapping the loads (one L2 round
        trip per key)."""
        for u in T.unroll(U):
            keys[u] = to_key(vals[u])
        if (i + 1) * U * threads < n:
            load_vals(logits, bx, lo, n, i + 1, tx, vals)

    @T.prim_func
    def indexer_topk(
        logits: T.Tensor[(num_tokens, width), "float32"],
        row_info: T.Tensor[(num_tokens, 3), "int32"],
        block_table: T.Tensor[(batch, max_pages), "int32"],
        indices: T.Tensor[(num_tokens, topk), "int32"],
        lengths: T.Tensor[(num_tokens,), "int32"],
    ):
        with T.Kernel(num_tokens, threads=threads) as bx:
            tx = T.get_thread_binding()
            hist = T.alloc_shared([WIDE_BINS + 1], "int32")
            s_thr = T.alloc_shared([1], "int32")
            s_cnt = T.alloc_shared([2], "int32")

            lo = T.alloc_var("int32")
            n = T.alloc_var("int32")
            req = T.alloc_var("int32")
            rem = T.alloc_var("int32")
            thr = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            off = T.alloc_local([2], "int32")
            prefix = T.alloc_var("uint32")
            mask = T.alloc_var("uint32")
            digit = T.alloc_var("uint32")
            peers = T.alloc_var("uint32")
            lanes_below = T.alloc_var("uint32")  # bits of the lanes below this one in its warp
            keys = T.alloc_local([LOADS_IN_FLIGHT], "uint32")
            vals = T.alloc_local([LOADS_IN_FLIGHT], "float32")
            done = T.alloc_var("int32")
            wsum = T.alloc_shared([scan_warps(threads)], "int32")
            skeys = T.alloc_shared([R], "uint32")
            s_pos = T.alloc_shared([topk], "int32")
            cand = T.alloc_shared([CAND_MAX], "int32")

            T.pdl_sync()  # launched behind the logits kernel (PDL): its logits are complete past here
            if trigger:
                T.pdl_trigger()   # the kernel behind this one may launch now (TOPK_TRIGGER)
            lanes_below = (T.Cast("uint32", 1) << T.Cast("uint32", tx % 32)) - T.Cast("uint32", 1)
            lo = T.min(T.max(row_info[bx, 0], 0), width)
            n = T.max(T.min(row_info[bx, 1], width), lo) - lo
            req = T.min(T.max(row_info[bx, 2], 0), batch - 1)
            if tx == 0:
                lengths[bx] = T.min(n, topk)

            if n <= topk:
                for i in T.serial(T.ceildiv(topk, threads)):
                    if i * threads + tx < topk:
                        indices[bx, i * threads + tx] = T.if_then_else(
                            i * threads + tx < n, slot(block_table, req, i * threads + tx), -1)
            elif n <= R:
                resident_select(logits, bx, lo, n, req, tx, block_table, indices, skeys, hist, wsum, s_thr, s_cnt,
                                s_pos, cand)
            else:
                rem = topk
                prefix = T.Cast("uint32", 0)
                mask = T.Cast("uint32", 0)
                done = 0
                for rnd in T.serial(PASSES):
                    if done == 0:
                        for i in T.serial(T.ceildiv(RADIX + 1, threads)):
                            if i * threads + tx < RADIX + 1:
                                hist[i * threads + tx] = 0
                        T.sync_threads()
                        load_vals(logits, bx, lo, n, 0, tx, vals)
                        for i in T.serial(T.ceildiv(n, threads * U)):
                            next_keys(logits, bx, lo, n, i, tx, vals, keys)
                            for u in T.unroll(U):
                                digit = T.if_then_else(
                                    (i * U + u) * threads + tx < n and (keys[u] & mask) == prefix,
                                    (keys[u] >> T.Cast("uint32", 24 - 8 * rnd)) & T.Cast("uint32", 255),
                                    T.Cast("uint32", RADIX))  # RADIX = no bin
                                if rnd == 0:
                                    # the top byte (sign + high exponent bits) is shared by most of a row: lanes
                                    # with the same bin add once (warp-aggregated) instead of serializing
                                    peers = T.match_any_sync(digit)
                                    if digit < T.Cast("uint32", RADIX) and (peers & lanes_below) == T.Cast("uint32", 0):
                                        T.atomic_add(hist[T.Cast("int32", digit)], T.popcount(peers))
                                elif digit < T.Cast("uint32", RADIX):
                                    T.atomic_add(hist[T.Cast("int32", digit)], 1)
                        T.sync_threads()
                        scan_threshold(hist, wsum, s_thr, tx, rem, hist[T.min(tx, RADIX)])
                        thr = s_thr[0]
                        rem = rem - hist[thr + 1]
                        # every key of the threshold bin is taken: the prefix so far decides, skip the rest
                        if hist[thr] - hist[thr + 1] == rem:
                            done = 1
                        prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 24 - 8 * rnd))
                        mask = mask | (T.Cast("uint32", 255) << T.Cast("uint32", 24 - 8 * rnd))
                        T.sync_threads()
                # (key & mask) == prefix is the threshold class (the topk-th largest key, or a whole bin after an
                # early exit); (topk - rem) keys are above it
                if tx == 0:
                    s_cnt[0] = 0
                    s_cnt[1] = 0
                T.sync_threads()
                load_vals(logits, bx, lo, n, 0, tx, vals)
                for i in T.serial(T.ceildiv(n, threads * U)):
                    next_keys(logits, bx, lo, n, i, tx, vals, keys)
                    # output slots for this iteration's U keys: one shared atomic per warp and class (warp_slots)
                    cnt = 0
                    for u in T.unroll(U):
                        cnt = cnt + T.if_then_else((i * U + u) * threads + tx < n, T.if_then_else(
                            (keys[u] & mask) > prefix, 1, T.if_then_else((keys[u] & mask) == prefix, 65536, 0)), 0)
                    warp_slots(cnt, s_cnt, (0,), (1,), tx, off)
                    for u in T.unroll(U):
                        if (i * U + u) * threads + tx < n:
                            if (keys[u] & mask) > prefix:
                                indices[bx, off[0]] = slot(block_table, req, (i * U + u) * threads + tx)
                                off[0] = off[0] + 1
                            elif (keys[u] & mask) == prefix:
                                if off[1] < rem:
                                    indices[bx, topk - rem + off[1]] = slot(block_table, req,
                                                                            (i * U + u) * threads + tx)
                                off[1] = off[1] + 1

    return indexer_topk


@register
class IndexerTopkSpec(KernelSpec):
    """Top-k of the indexer logits + translation to compressed-cache slots. Statics: topk, page_size."""
    name = "indexer_topk"
    arg_names = ("logits", "row_info", "block_table", "indices", "lengths")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"topk": int(model.index_topk)}  # page_size per call site (family.uses)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        topk = int_param(self.name, static, "topk")
        if topk > 4096:
            raise ValueError(f"{self.name}: topk={topk} is out of range (1..4096)")
        page_size = int_param(self.name, static, "page_size", allowed=(16, 32, 64, 128, 256))
        p = {"topk": topk, "page_size": page_size, "threads": topk_threads(num_tokens, arch.num_sms_hint),
             "trigger": TOPK_TRIGGER}
        # many rows: two CTAs per SM, so the resident row is half an SM's shared memory
        p["resident"] = resident_keys(arch, topk_smem_bytes(p), ctas_per_sm=2)
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return topk_smem_bytes(variant.p)

    def build(self, variant: Variant):
        return build_topk(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return {**get_profile(variant.schedule).pass_configs, **_TOPK_PASS_CONFIGS}


# =============================================================================================
# Top-k with a row split over several CTAs (few rows, long rows)
# =============================================================================================
MAX_SPLITS = 16
# (threads, longest row selected in one CTA from shared memory) of the split kernel, by its splits: longer rows are
# split over CTAs. At 16 splits (the fewest rows) 512 threads stream a long row faster (threads x LOADS_IN_FLIGHT
# columns a step: 1,024 threads left half the CTAs idle) and small rows pay less for their barriers; at 2-8 splits
# 1,024 threads with a resident slice win (sweep_topk), up to 32K keys where shared memory holds them (Hopper: 146 KB;
# SM12x stops at 20K): 64 rows of 65,536 columns (256K context) as 2 x 32K-key slices, read once instead of once
# per radix pass, 51.9 -> 29.2 us (H200).
SPLIT_THREADS = 512
SPLIT_RESIDENT_MAX = 8192
FEW_SPLITS_THREADS = 1024
FEW_SPLITS_RESIDENT_MAX = 32768


def split_schedule(splits: int) -> tuple[int, int]:
    """(threads, resident-row cap) of the split kernel at this many splits (see above)."""
    return (SPLIT_THREADS, SPLIT_RESIDENT_MAX) if splits >= MAX_SPLITS else (FEW_SPLITS_THREADS,
                                                                              FEW_SPLITS_RESIDENT_MAX)


def topk_splits(num_tokens: int, num_sms: int) -> int:
    """CTAs per row: the largest power of two <= 16 that keeps rows x CTAs within the SM count; 1 (the one-CTA
    kernel) once the rows alone fill the GPU (one CTA per row leaves all but one SM idle at batch 1)."""
    s = 1
    while s * 2 <= MAX_SPLITS and num_tokens * s * 2 <= num_sms:
        s *= 2
    return s


def topk_split_smem_bytes(p: Mapping[str, Any]) -> int:
    """The same shared buffers as the one-CTA kernel (topk_smem_bytes): histogram, per-warp totals, the resident
    select's output counters, threshold, the resident row (or slice) and its selected columns."""
    return topk_smem_bytes(p)


# The split kernel's workspace, int32 [T, ROW_WS] (ws): all zeros before the first launch, and every launch leaves
# it all zeros again (the last of a row's CTAs to leave clears what the row used), so no memset runs before each
# launch (a graph memset node is a sizeable part of a small indexer step). Per row:
WS_G0 = 0                                  # resident slices: the row's histogram of the keys' top FIRST_BITS bits
WS_G1 = WS_G0 + WIDE_BINS + 1              # ... of bits 10..20 within the threshold bin (heavy-tie branch)
WS_G2 = WS_G1 + WIDE_BINS + 1              # ... of bits 0..9 (heavy-tie branch)
WS_SH = WS_G2 + WIDE_BINS + 1              # streamed rows: PASSES histograms of RADIX + 1 bins
WS_CNT = WS_SH + PASSES * (RADIX + 1)      # counters: 0 keys placed above the threshold class, 1 ties / candidates,
CNT_ABOVE, CNT_TIES, CNT_ARRIVE, CNT_LEFT = 0, 1, 2, 3  # 2 row-barrier arrivals, 3 CTAs that have left
WS_CC = WS_CNT + 8                         # resident slices: the threshold bin's columns (CAND_MAX)
WS_CK = WS_CC + CAND_MAX                   # ... and their keys
ROW_WS = WS_CK + CAND_MAX
# Rows up to this many columns (and the resident size) are selected by one CTA from shared memory (no row barriers)
# when the split kernel runs (faster than splitting them: sweep_topk); longer rows are split over the row's CTAs.
SOLO_MAX = 8192
# ... and per schedule family at 2 splits (34-66 rows on Hopper's 132 SMs, where each row's CTAs have SMs of their
# own either way): one CTA per row, no row barriers, up to this many columns. H100, 8K-32K-column rows at 12-64 rows
# (the split kernel's graph time, logits in L2): at 2 splits 16,384 columns 11.7 -> 10.3 us (40 rows), 11.9 -> 10.4
# (64); 24,576 columns 13.8 -> 12.7, 14.1 -> 12.8; 8,192 level; 32,768 level (15.0 / 14.9), so those stay split. At
# 4 and 8 splits (fewer rows) one CTA per row was slower from 16,384 / 24,576 columns (8 splits, 16,384: 9.5 ->
# 10.2), so they keep SOLO_MAX. SM12x keeps it too (unmeasured there).
SOLO_MAX_TWO_SPLITS = {"hopper": 24_576}


def build_topk_split(*, topk: int, page_size: int, threads: int, splits: int, resident: int, solo: int = SOLO_MAX,
                     trigger: bool = False):
    """The split select in one launch: a row's `splits` CTAs each take an equal slice of its columns and meet at
    row barriers (an arrival counter in the workspace, ws[t, WS_CNT + CNT_ARRIVE]).
    Slices that fit in shared memory (ceil(n / splits) <= resident) stay there for the whole select:
      1. each CTA lands its slice, counts the keys' top FIRST_BITS bits in shared memory and adds its nonzero
         bins to the row's histogram (ws G0); row barrier;
      2. every CTA scans the row's histogram (the threshold bin and the keys still needed, `rem`), then walks
         its slice: keys above the bin go to the output (slots from the row's counter), the bin's keys to the
         row's candidate list (their cache slots and keys, ws CC / CK); each CTA then counts itself in (one
         atomic, no waiting);
      3. the row's last CTA to count in selects the remaining 21 bits over the candidates (11 + 10, shared
         memory, as the one-CTA resident select), places them and clears the row's workspace. One row barrier,
         and the row is read from global memory once.
      A threshold bin of more than CAND_MAX keys (heavy ties) instead runs the 11- and 10-bit passes over the
      slices with the row's histograms G1 / G2 and a barrier each, then every CTA places its keys.
    Longer slices stream: an exact radix select of 8 bits per pass over 4 passes, each pass's row histogram
    (ws SH) summed by the CTAs' global atomics, a row barrier per pass, then one collection pass.
    After the last use of the workspace each CTA counts itself out (CNT_LEFT); the last to leave zeroes what the
    row used. Forward progress: a CTA spins only for CTAs of its own row, which have lower or adjacent block
    indices and are dispatched no later than it; one row's `splits` (<= 16) CTAs fit any SM12x / Hopper GPU at
    once, so the earliest unfinished row always completes (the in-order dispatch decoupled look-back relies on)."""
    import tilelang.language as T

    P, S, R = page_size, splits, resident
    num_tokens = T.dynamic("num_tokens")
    width = T.dynamic("width")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    U = LOADS_IN_FLIGHT
    top_shift = 32 - FIRST_BITS
    if R < CAND_MAX:
        raise ValueError(f"indexer_topk_split: resident={R} keys is below the candidate list ({CAND_MAX})")

    to_key, slot = _key_and_slot(T, P, max_pages)
    resident_select = _resident_select(T, threads=threads, topk=topk, to_key=to_key, slot=slot)
    scan_threshold = _scan_threshold(T)
    scan_wide = _scan_wide(T, threads)
    warp_slots = _warp_slots(T)
    count_digits = _count_digits(T, threads)
    clear_bins = _clear_bins(T, threads)

    @T.macro
    def row_barrier(ws, bx, tx, target):
        """Every CTA of row bx has arrived `target / S` times. Thread 0 releases this CTA's writes (the block
        barrier before it orders the other threads' writes) and acquires the others'."""
        T.sync_threads()
        if tx == 0:
            # acq_rel with the count returned: TileLang lowers a non-returning int atomic_add to a relaxed red
            # whatever memory_order says (tl_templates atomic.h, sm_90+), which would not order the CTA's
            # histogram adds before the arrival; the returning form is a fenced atom
            T.atomic_add(ws[bx, WS_CNT + CNT_ARRIVE], 1, memory_order="acq_rel", return_prev=True)
            while T.atomic_load(ws[bx, WS_CNT + CNT_ARRIVE], memory_order="acquire") < target:
                T.evaluate(0)
        T.sync_threads()

    @T.macro
    def clear_row(ws, bx, tx, at, size):
        """ws[bx, at:at + size] and row bx's counters = 0, by the row's last CTA."""
        for i in T.serial(T.ceildiv(size, threads)):
            if i * threads + tx < size:
                ws[bx, at + i * threads + tx] = 0
        if tx < 8:
            ws[bx, WS_CNT + tx] = 0

    @T.macro
    def leave(ws, bx, tx, s_last, at, size):
        """This CTA is done with row bx's workspace; the row's last CTA to leave zeroes ws[bx, at:at + size] and
        the counters (the acq_rel count orders every CTA's earlier accesses before the zeroing)."""
        T.sync_threads()
        if tx == 0:
            s_last[0] = T.atomic_add(ws[bx, WS_CNT + CNT_LEFT], 1, memory_order="acq_rel", return_prev=True)
        T.sync_threads()
        if s_last[0] == S - 1:
            clear_row(ws, bx, tx, at, size)

    @T.macro
    def push_bins(sh, ws, bx, tx, at):
        """Add this CTA's nonzero bins sh[0:WIDE_BINS] to the row's histogram ws[bx, at:]."""
        for i in T.serial(WIDE_BINS // threads):
            if sh[i * threads + tx] > 0:
                T.atomic_add(ws[bx, at + i * threads + tx], sh[i * threads + tx])

    @T.macro
    def pull_bins(sh, ws, bx, tx, at):
        """sh[0:WIDE_BINS] = the row's finished histogram (L2: atomic loads, never a stale L1 line); sh[WIDE_BINS]
        stays 0."""
        for i in T.serial(WIDE_BINS // threads):
            sh[i * threads + tx] = T.atomic_load(ws[bx, at + i * threads + tx], memory_order="relaxed")
        T.sync_threads()

    @T.macro
    def select_candidates(sh, wsum, s_thr, s_cnt, skeys, cand, indices, bx, tx, m, rem_in, prefix_in, mask_in):
        """The last 21 bits over the m candidates in shared memory (keys in skeys, cache slots in cand): bits 10..20
        (11), then 0..9 (10); then place them: the keys above the threshold class follow the topk - rem_in keys
        above the bin, the first ties fill the last rem slots."""
        rem = T.alloc_var("int32")
        thr = T.alloc_var("int32")
        done = T.alloc_var("int32")
        cnt = T.alloc_var("int32")
        kk = T.alloc_var("uint32")
        prefix = T.alloc_var("uint32")
        mask = T.alloc_var("uint32")
        off = T.alloc_local([2], "int32")
        rem = rem_in
        prefix = prefix_in
        mask = mask_in
        done = 0
        for rnd in T.serial(2):
            if done == 0:
                count_digits(sh, tx, m, lambda j: skeys[j], rnd, prefix, mask)
                scan_wide(sh, wsum, s_thr, tx, rem)
                thr = s_thr[0]
                rem = rem - sh[thr + 1]
                if sh[thr] - sh[thr + 1] == rem:
                    done = 1
                prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 10 - 10 * rnd))
                mask = mask | (T.Cast("uint32", 2047 - 1024 * rnd) << T.Cast("uint32", 10 - 10 * rnd))
                T.sync_threads()
        if tx == 0:
            s_cnt[0] = 0
            s_cnt[1] = 0
        T.sync_threads()
        cnt = 0
        for j in T.serial(T.ceildiv(m, threads)):
            if j * threads + tx < m:
                kk = skeys[j * threads + tx]
                cnt = cnt + T.if_then_else((kk & mask) > prefix, 1, T.if_then_else((kk & mask) == prefix, 65536, 0))
        warp_slots(cnt, s_cnt, (0,), (1,), tx, off)
        for j in T.serial(T.ceildiv(m, threads)):
            if j * threads + tx < m:
                kk = skeys[j * threads + tx]
                if (kk & mask) > prefix:
                    indices[bx, topk - rem_in + off[0]] = cand[j * threads + tx]
                    off[0] = off[0] + 1
                elif (kk & mask) == prefix:
                    if off[1] < rem:
                        indices[bx, topk - rem + off[1]] = cand[j * threads + tx]
                    off[1] = off[1] + 1

    @T.prim_func
    def indexer_topk_split(
        logits: T.Tensor[(num_tokens, width), "float32"],
        row_info: T.Tensor[(num_tokens, 3), "int32"],
        block_table: T.Tensor[(batch, max_pages), "int32"],
        ws: T.Tensor[(num_tokens, ROW_WS), "int32"],
        indices: T.Tensor[(num_tokens, topk), "int32"],
        lengths: T.Tensor[(num_tokens,), "int32"],
    ):
        # the split index is blockIdx.x: a row's CTAs are dispatched together (forward progress, above)
        with T.Kernel(S, num_tokens, threads=threads) as (sx, bx):
            tx = T.get_thread_binding()
            sh = T.alloc_shared([WIDE_BINS + 1], "int32")
            s_cnt = T.alloc_shared([2], "int32")
            skeys = T.alloc_shared([R], "uint32")
            s_pos = T.alloc_shared([topk], "int32")
            cand = T.alloc_shared([CAND_MAX], "int32")
            wsum = T.alloc_shared([scan_warps(threads)], "int32")
            s_thr = T.alloc_shared([1], "int32")  # also the leave count (leave), once no scan reads it
            lo = T.alloc_var("int32")
            n = T.alloc_var("int32")
            req = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            c1 = T.alloc_var("int32")
            per = T.alloc_var("int32")
            m = T.alloc_var("int32")
            rem = T.alloc_var("int32")
            thr = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            kk = T.alloc_var("uint32")
            off = T.alloc_local([2], "int32")
            prefix = T.alloc_var("uint32")
            mask = T.alloc_var("uint32")
            digit = T.alloc_var("uint32")
            peers = T.alloc_var("uint32")
            lanes_below = T.alloc_var("uint32")
            done = T.alloc_var("int32")
            last = T.alloc_var("int32")
            keys = T.alloc_local([U], "uint32")
            vals = T.alloc_local([U], "float32")

            # launched behind the logits kernel (programmatic dependent launch): its logits are complete past here
            T.pdl_sync()
            if trigger:
                T.pdl_trigger()   # the kernel behind this one may launch now (TOPK_TRIGGER)
            lanes_below = (T.Cast("uint32", 1) << T.Cast("uint32", tx % 32)) - T.Cast("uint32", 1)
            lo = T.min(T.max(row_info[bx, 0], 0), width)
            n = T.max(T.min(row_info[bx, 1], width), lo) - lo
            req = T.min(T.max(row_info[bx, 2], 0), batch - 1)
            per = T.ceildiv(T.ceildiv(n, S), 32) * 32
            if n <= topk:
                if sx == 0:
                    if tx == 0:
                        lengths[bx] = n
                    for i in T.serial(T.ceildiv(topk, threads)):
                        if i * threads + tx < topk:
                            indices[bx, i * threads + tx] = T.if_then_else(
                                i * threads + tx < n, slot(block_table, req, i * threads + tx), -1)
            elif n <= T.min(solo, R):
                # a short row: its first CTA selects it alone from shared memory (no row barriers), the others exit
                if sx == 0:
                    if tx == 0:
                        lengths[bx] = topk
                    resident_select(logits, bx, lo, n, req, tx, block_table, indices, skeys, sh, wsum, s_thr,
                                    s_cnt, s_pos, cand)
            elif per <= R:
                # resident slices: this CTA's columns [c0, c1) stay in skeys[0:c1 - c0]
                c0 = T.min(sx * per, n)
                c1 = T.min(n, c0 + per)
                if sx == 0 and tx == 0:
                    lengths[bx] = topk
                clear_bins(sh, tx)
                T.sync_threads()
                for i in T.serial(T.ceildiv(c1 - c0, threads * U)):
                    for u in T.unroll(U):
                        vals[u] = logits[bx, lo + c0 + T.min((i * U + u) * threads + tx, c1 - c0 - 1)]
                    for u in T.unroll(U):
                        if (i * U + u) * threads + tx < c1 - c0:
                            kk = to_key(vals[u])
                            skeys[(i * U + u) * threads + tx] = kk
                            T.atomic_add(sh[T.Cast("int32", kk >> T.Cast("uint32", top_shift))], 1)
                T.sync_threads()
                push_bins(sh, ws, bx, tx, WS_G0)
                row_barrier(ws, bx, tx, S)
                pull_bins(sh, ws, bx, tx, WS_G0)
                scan_wide(sh, wsum, s_thr, tx, topk)
                thr = s_thr[0]
                rem = topk - sh[thr + 1]
                m = sh[thr] - sh[thr + 1]  # keys of the threshold bin (>= rem)
                done = T.if_then_else(m == rem, 1, 0)
                prefix = T.Cast("uint32", thr) << T.Cast("uint32", top_shift)
                mask = T.Cast("uint32", (1 << FIRST_BITS) - 1) << T.Cast("uint32", top_shift)
                if done == 1 or m <= CAND_MAX:
                    # one walk: keys above the bin (all of it when done) -> output, the bin's keys -> candidates
                    cnt = 0
                    for j in T.serial(T.ceildiv(c1 - c0, threads)):
                        if j * threads + tx < c1 - c0:
                            kk = skeys[j * threads + tx]
                            cnt = cnt + T.if_then_else((kk & mask) > prefix or (done == 1 and (kk & mask) == prefix),
                                                       1, T.if_then_else((kk & mask) == prefix, 65536, 0))
                    warp_slots(cnt, ws, (bx, WS_CNT + CNT_ABOVE), (bx, WS_CNT + CNT_TIES), tx, off)
                    for j in T.serial(T.ceildiv(c1 - c0, threads)):
                        if j * threads + tx < c1 - c0:
                            kk = skeys[j * threads + tx]
                            if (kk & mask) > prefix or (done == 1 and (kk & mask) == prefix):
                                indices[bx, off[0]] = slot(block_table, req, c0 + j * threads + tx)
                                off[0] = off[0] + 1
                            elif (kk & mask) == prefix:
                                ws[bx, WS_CC + off[1]] = slot(block_table, req, c0 + j * threads + tx)
                                ws[bx, WS_CK + off[1]] = T.reinterpret(kk, "int32")
                                off[1] = off[1] + 1
                    # the row's last CTA to finish its walk selects the candidates and clears the row's workspace
                    # (the others are done with it); the rest exit without waiting
                    T.sync_threads()
                    if tx == 0:
                        s_thr[0] = T.atomic_add(ws[bx, WS_CNT + CNT_ARRIVE], 1, memory_order="acq_rel",
                                                return_prev=True)
                    T.sync_threads()
                    last = s_thr[0]
                    if last == 2 * S - 1:
                        if done == 0:
                            # the candidates' slots and keys, in any order, into cand and skeys
                            for j in T.serial(T.ceildiv(m, threads)):
                                if j * threads + tx < m:
                                    cand[j * threads + tx] = T.atomic_load(ws[bx, WS_CC + j * threads + tx],
                                                                           memory_order="relaxed")
                                    skeys[j * threads + tx] = T.reinterpret(
                                        T.atomic_load(ws[bx, WS_CK + j * threads + tx], memory_order="relaxed"),
                                        "uint32")
                        clear_row(ws, bx, tx, WS_G0, WIDE_BINS)
                        if done == 0:
                            select_candidates(sh, wsum, s_thr, s_cnt, skeys, cand, indices, bx, tx, m, rem, prefix,
                                              mask)
                else:
                    # heavy ties: bits 10..20, then 0..9, over the slices (the row's histograms G1, G2)
                    for rnd in T.serial(2):
                        if done == 0:
                            count_digits(sh, tx, c1 - c0, lambda j: skeys[j], rnd, prefix, mask)
                            push_bins(sh, ws, bx, tx, WS_G1 + rnd * (WIDE_BINS + 1))
                            row_barrier(ws, bx, tx, S * (2 + rnd))
                            pull_bins(sh, ws, bx, tx, WS_G1 + rnd * (WIDE_BINS + 1))
                            scan_wide(sh, wsum, s_thr, tx, rem)
                            thr = s_thr[0]
                            rem = rem - sh[thr + 1]
                            if sh[thr] - sh[thr + 1] == rem:
                                done = 1
                            prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 10 - 10 * rnd))
                            mask = mask | (T.Cast("uint32", 2047 - 1024 * rnd) << T.Cast("uint32", 10 - 10 * rnd))
                            T.sync_threads()
                    # every CTA places its keys above the threshold class and its share of the first rem ties
                    cnt = 0
                    for j in T.serial(T.ceildiv(c1 - c0, threads)):
                        if j * threads + tx < c1 - c0:
                            kk = skeys[j * threads + tx]
                            cnt = cnt + T.if_then_else((kk & mask) > prefix, 1,
                                                       T.if_then_else((kk & mask) == prefix, 65536, 0))
                    warp_slots(cnt, ws, (bx, WS_CNT + CNT_ABOVE), (bx, WS_CNT + CNT_TIES), tx, off)
                    for j in T.serial(T.ceildiv(c1 - c0, threads)):
                        if j * threads + tx < c1 - c0:
                            kk = skeys[j * threads + tx]
                            if (kk & mask) > prefix:
                                indices[bx, off[0]] = slot(block_table, req, c0 + j * threads + tx)
                                off[0] = off[0] + 1
                            elif (kk & mask) == prefix:
                                if off[1] < rem:
                                    indices[bx, topk - rem + off[1]] = slot(block_table, req, c0 + j * threads + tx)
                                off[1] = off[1] + 1
                    leave(ws, bx, tx, s_thr, WS_G0, WS_SH - WS_G0)
            else:
                # streamed slices: this CTA's columns [c0, c1), an equal share, a multiple of threads * U
                c0 = sx * T.ceildiv(T.ceildiv(n, S), threads * U) * (threads * U)
                c1 = T.min(n, c0 + T.ceildiv(T.ceildiv(n, S), threads * U) * (threads * U))
                rem = topk
                prefix = T.Cast("uint32", 0)
                mask = T.Cast("uint32", 0)
                done = 0
                for rnd in T.serial(PASSES):
                    if done == 0:
                        if tx < RADIX + 1:
                            sh[tx] = 0
                        T.sync_threads()
                        for i in T.serial(T.ceildiv(T.max(c1 - c0, 0), threads * U)):
                            for u in T.unroll(U):
                                vals[u] = logits[bx, lo + T.min(c0 + (i * U + u) * threads + tx, n - 1)]
                            for u in T.unroll(U):
                                keys[u] = to_key(vals[u])
                            for u in T.unroll(U):
                                digit = T.if_then_else(
                                    c0 + (i * U + u) * threads + tx < c1 and (keys[u] & mask) == prefix,
                                    (keys[u] >> T.Cast("uint32", 24 - 8 * rnd)) & T.Cast("uint32", 255),
                                    T.Cast("uint32", RADIX))
                                if rnd == 0:
                                    peers = T.match_any_sync(digit)
                                    if digit < T.Cast("uint32", RADIX) and (peers & lanes_below) == T.Cast("uint32", 0):
                                        T.atomic_add(sh[T.Cast("int32", digit)], T.popcount(peers))
                                else:
                                    if digit < T.Cast("uint32", RADIX):
                                        T.atomic_add(sh[T.Cast("int32", digit)], 1)
                        T.sync_threads()
                        if tx < RADIX:
                            if sh[tx] > 0:
                                T.atomic_add(ws[bx, WS_SH + rnd * (RADIX + 1) + tx], sh[tx])
                        row_barrier(ws, bx, tx, S * (rnd + 1))
                        # suffix sums of the row's finished histogram into sh, the digit of the rem-th largest key,
                        # folded into prefix / mask / rem (sh[RADIX] was zeroed with the pass's counts)
                        scan_threshold(sh, wsum, s_thr, tx, rem, T.atomic_load(
                            ws[bx, WS_SH + rnd * (RADIX + 1) + T.min(tx, RADIX)], memory_order="relaxed"))
                        thr = s_thr[0]
                        rem = rem - sh[thr + 1]
                        # every key of the threshold bin is taken: the prefix so far decides, skip the rest (all
                        # CTAs of the row read the same histogram, so all skip the same barriers)
                        if sh[thr] - sh[thr + 1] == rem:
                            done = 1
                        prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 24 - 8 * rnd))
                        mask = mask | (T.Cast("uint32", 255) << T.Cast("uint32", 24 - 8 * rnd))
                        T.sync_threads()
                # collection: (key & mask) == prefix is the threshold class (the topk-th largest key, or a whole
                # bin after an early exit); (topk - rem) keys are above it
                if sx == 0 and tx == 0:
                    lengths[bx] = topk
                for i in T.serial(T.ceildiv(T.max(c1 - c0, 0), threads * U)):
                    for u in T.unroll(U):
                        vals[u] = logits[bx, lo + T.min(c0 + (i * U + u) * threads + tx, n - 1)]
                    for u in T.unroll(U):
                        keys[u] = to_key(vals[u])
                    # output slots for this iteration's U keys: one global atomic per warp and class (warp_slots)
                    cnt = 0
                    for u in T.unroll(U):
                        cnt = cnt + T.if_then_else(c0 + (i * U + u) * threads + tx < c1, T.if_then_else(
                            (keys[u] & mask) > prefix, 1, T.if_then_else((keys[u] & mask) == prefix, 65536, 0)), 0)
                    warp_slots(cnt, ws, (bx, WS_CNT + CNT_ABOVE), (bx, WS_CNT + CNT_TIES), tx, off)
                    for u in T.unroll(U):
                        if c0 + (i * U + u) * threads + tx < c1:
                            if (keys[u] & mask) > prefix:
                                if off[0] < topk:
                                    indices[bx, off[0]] = slot(block_table, req, c0 + (i * U + u) * threads + tx)
                                off[0] = off[0] + 1
                            elif (keys[u] & mask) == prefix:
                                if off[1] < rem:
                                    indices[bx, topk - rem + off[1]] = slot(block_table, req,
                                                                             c0 + (i * U + u) * threads + tx)
                                off[1] = off[1] + 1
                leave(ws, bx, tx, s_thr, WS_SH, PASSES * (RADIX + 1))

    return indexer_topk_split


@register
class IndexerTopkSplitSpec(KernelSpec):
    """indexer_topk's select with the row split over CTAs (one launch, row barriers). Statics: topk, page_size."""
    name = "indexer_topk_split"
    arg_names = ("logits", "row_info", "block_table", "hist", "indices", "lengths")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"topk": int(model.index_topk)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        """The split the op runs at this token count; where it runs the one-CTA kernel instead (topk_splits 1),
        the 2-way split is still named (and compiled) so the planner's enumeration stays total."""
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        topk = int_param(self.name, static, "topk")
        if topk > 4096:
            raise ValueError(f"{self.name}: topk={topk} is out of range (1..4096)")
        page_size = int_param(self.name, static, "page_size", allowed=(16, 32, 64, 128, 256))
        splits = max(2, topk_splits(num_tokens, arch.num_sms_hint))
        threads, cap = split_schedule(splits)
        p = {"topk": topk, "page_size": page_size, "threads": threads, "splits": splits, "trigger": TOPK_TRIGGER}
        p["resident"] = min(cap, resident_keys(arch, topk_split_smem_bytes(p), ctas_per_sm=1))
        p["solo"] = SOLO_MAX_TWO_SPLITS.get(arch.family, SOLO_MAX) if splits == 2 else SOLO_MAX
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return topk_split_smem_bytes(variant.p)

    def build(self, variant: Variant):
        return build_topk_split(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return {**get_profile(variant.schedule).pass_configs, **_TOPK_PASS_CONFIGS}
