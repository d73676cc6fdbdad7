"""Top-k selection over the indexer logits with page-table translation (`indexer_topk`), and the sliding-window
index preparation (`indexer_swa_indices`). Both in TileLang; the whole selection runs on the GPU (no torch.topk).

indexer_topk, one CTA per query token (row):
  the row's candidate columns are [lo, hi) from row_info [T, 3] = (lo, hi, request) (written by the logits
  kernels, logits.py); column lo + j is compressed position j of that request. With n = hi - lo:
  * n <= topk: every position is taken (no selection), the rest of the row is -1;
  * otherwise an exact radix select of the topk-th largest fp32 key, 8 bits per pass over 4 passes (order-
    preserving uint32 keys; a 257-bin suffix-summed histogram in shared memory per pass, restricted to the
    keys that match the prefix chosen so far), then one collection pass: every key above the threshold and
    the first (topk - #above) keys equal to it (ties broken by atomic order: any tie order is valid). The
    passes stop early once the threshold bin holds exactly the keys still needed (the whole bin is taken; keys
    are then compared under the mask of the passes run): continuous logits usually stop after pass 3.
  The first pass's histogram atomics are warp-aggregated (match_any): logits of one row share their top key
  byte (sign + high exponent bits), so plain per-key atomics would all hit one bin and serialize. The
  collection's output slots are warp-aggregated too (ballot + popc, one shared atomic per warp). Suffix
  sums run as warp shuffles (two barriers per pass).
  Each pass reads the row from global memory (L2 for the decode rows), LOADS_IN_FLIGHT keys per thread
  before the first use; no candidate buffer, so any distribution (all ties, all -inf) is exact with fixed
  shared memory.
  Output: indices [T, topk] int32 = slots of the compressed KV cache the sparse-attention kernel reads,
      slot = block_table[request, pos // page_size] * page_size + pos % page_size  (-1 for a -1 page),
  in no particular order (a set), -1 padded; lengths [T] int32 = min(n, topk).

indexer_topk_split, the same select and output for few rows (topk_splits(T, SMs) > 1): each row's columns split
  over up to 16 CTAs in one launch (the op zeroes a histogram workspace [T, 5, 257]); per pass each CTA counts its
  slice in shared memory, adds the bins to the row's global histogram of that pass, waits at a row barrier (an
  arrival counter in the workspace) and scans the row's finished histogram; the collection pass takes output
  positions from the row's two global counters (keys above the threshold, ties).

indexer_swa_indices, for the sliding-window part of every layer's attention:
  query token t at absolute position p = positions[t] of request r = req_idx[t] attends to the last
  n = min(window, p + 1) tokens p - n + 1 .. p. The SWA KV cache is PAGED (vLLM layout: a block table per
  request over the uncompressed token positions), so
      swa_indices[t, w] = block_table[r, q // page_size] * page_size + q % page_size, q = p - n + 1 + w, w < n
  and -1 for w >= n (oldest first); swa_lengths[t] = n. A ring-buffer cache (SGLang: seq_slot * W + q % W) is
  the special case of a one-page-per-request table with page_size = window, when every new token's KV is
  written before the prep runs.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, get_profile
from dsv4_jit.spec import KernelSpec, Variant, register

from .logits import check_arch, int_param, schedule_name

RADIX = 256
PASSES = 4  # 8 bits each over the 32-bit key
# Both top-k kernels place every barrier they need themselves (T.sync_threads). TileLang's automatic barrier
# insertion sees all shared buffers as one merged allocation, so a data-dependent histogram atomic next to a
# resident-key read put two __syncthreads() inside every per-key loop iteration (~30 instructions and two
# block-wide barriers per key: 25 us for a 16K-column row on the H100, 2026-11-24).
_OWN_BARRIERS = {"tl.disable_thread_storage_sync": True}
# Keys each thread loads before it uses any of them (registers), so the L2 latency of a pass is paid once
# per 8 keys, and the next 8 load while these are counted (next_keys).
LOADS_IN_FLIGHT = 8


# Bytes of shared memory an SM has beyond one block's opt-in maximum (the 1 KB the driver reserves per block).
_SM_RESERVED = 1024


def resident_keys(arch: ArchProfile, fixed: int, ctas_per_sm: int) -> int:
    """Keys (uint32) of one row the CTA keeps in shared memory, a multiple of 1024: the most that fit next to
    `fixed` bytes with `ctas_per_sm` CTAs on one SM (per SM: the per-block maximum + the 1 KB reserve). A row
    that fits is read from global memory once instead of once per radix pass."""
    per_cta = min(arch.max_smem_per_block, (arch.max_smem_per_block + _SM_RESERVED) // ctas_per_sm - _SM_RESERVED)
    return max(0, (per_cta - fixed) // 4 // 1024 * 1024)


def topk_threads(num_tokens: int, num_sms: int) -> int:
    """Fewer rows than SMs: 1024 threads per row (each row's passes are the critical path). Otherwise 512,
    two CTAs per SM."""
    return 1024 if num_tokens < num_sms else 512


def _a16(n: int) -> int:
    return -(-n // 16) * 16


def topk_smem_bytes(p: Mapping[str, Any]) -> int:
    """Histogram (RADIX + 1 bins), per-warp scan totals (RADIX / 32), two collection counters and the
    threshold, int32, then the resident row (p["resident"] uint32 keys) and its topk selected columns, each
    buffer placed at a 16-byte boundary in the merged dynamic allocation."""
    return (_a16(4 * (RADIX + 1)) + _a16(4 * (RADIX // 32)) + _a16(4 * 2) + _a16(4 * 1)
            + _a16(4 * p.get("resident", 0)) + _a16(4 * p["topk"]))


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


def _scan_threshold(T):
    """scan_threshold(hist, wsum, s_thr, tx, rem, count), every select's scan: given thread tx's bin count `count`
    (bin tx < RADIX: hist[tx] in one CTA, the row's global histogram in the split kernel; the argument is evaluated
    by every thread, so its index must stay in bounds for tx >= RADIX too), hist[b] becomes the
    number of keys whose digit is >= b (suffix sums; hist[RADIX] stays 0), then s_thr[0] the digit of the rem-th
    largest key (exactly one bin has hist[b] >= rem > hist[b + 1]). Within each warp by shuffles, then across the
    RADIX / 32 warp totals: three barriers, the last before s_thr is read."""
    @T.macro
    def scan_threshold(hist, wsum, s_thr, tx, rem, count):
        val = T.alloc_var("int32")
        other = T.alloc_var("int32")
        if tx < RADIX:
            val = count
            for st in T.unroll(5):
                other = T.shfl_down(val, 1 << st)
                if tx % 32 + (1 << st) < 32:
                    val = val + other
            if tx % 32 == 0:
                wsum[tx // 32] = val
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


def _resident_select(T, *, threads: int, topk: int, to_key, slot):
    """The select of a row that fits in shared memory (topk < n <= the resident size), by one CTA; both kernels
    run it. The row is read from global memory once (LOADS_IN_FLIGHT loads per thread in flight), its keys kept
    in `skeys`, and pass 0's histogram counted as it lands; passes 1-3 and the collection walk `skeys` one key
    per thread per step. The streaming path's unrolled loads and per-slot guards cost ~30 instructions per key
    and pass, and one CTA's passes were latency-bound on them (64K context: ~25 us for a 16K-column row,
    whether it re-read global memory or not, H100 ncu, 2026-11-24)."""
    U = LOADS_IN_FLIGHT
    scan_threshold = _scan_threshold(T)

    @T.macro
    def resident_select(logits, bx, lo, n, req, tx, block_table, indices, skeys, hist, wsum, s_thr, s_cnt, s_pos):
        rem = T.alloc_var("int32")
        thr = T.alloc_var("int32")
        done = T.alloc_var("int32")
        pos_out = T.alloc_var("int32")
        base = T.alloc_var("int32")
        prefix = T.alloc_var("uint32")
        mask = T.alloc_var("uint32")
        votes = T.alloc_var("uint32")
        kk = T.alloc_var("uint32")
        lanes_below = T.alloc_var("uint32")
        vals = T.alloc_local([U], "float32")

        lanes_below = (T.Cast("uint32", 1) << T.Cast("uint32", tx % 32)) - T.Cast("uint32", 1)
        rem = topk
        prefix = T.Cast("uint32", 0)
        mask = T.Cast("uint32", 0)
        done = 0
        if tx < RADIX + 1:
            hist[tx] = 0
        T.sync_threads()
        # pass 0 while the row lands: keep every key, count its top byte. Plain shared atomics: the streamed
        # select's warp aggregation (match_any) made this pass slower here, 16K keys 22.2 -> 18.3 us without it
        # (sweep_topk, H100, 2026-11-24)
        for i in T.serial(T.ceildiv(n, threads * U)):
            for u in T.unroll(U):
                vals[u] = logits[bx, lo + T.min((i * U + u) * threads + tx, n - 1)]
            for u in T.unroll(U):
                if (i * U + u) * threads + tx < n:
                    kk = to_key(vals[u])
                    skeys[(i * U + u) * threads + tx] = kk
                    T.atomic_add(hist[T.Cast("int32", kk >> T.Cast("uint32", 24))], 1)
        T.sync_threads()
        for rnd in T.serial(PASSES):
            if done == 0:
                if rnd > 0:
                    if tx < RADIX + 1:
                        hist[tx] = 0
                    T.sync_threads()
                    for j in T.serial(T.ceildiv(n, threads)):
                        if j * threads + tx < n:
                            kk = skeys[j * threads + tx]
                            if (kk & mask) == prefix:
                                T.atomic_add(hist[T.Cast("int32", (kk >> T.Cast("uint32", 24 - 8 * rnd))
                                                       & T.Cast("uint32", 255))], 1)
                    T.sync_threads()
                scan_threshold(hist, wsum, s_thr, tx, rem, hist[T.min(tx, RADIX)])
                thr = s_thr[0]
                rem = rem - hist[thr + 1]
                if hist[thr] - hist[thr + 1] == rem:  # the whole threshold bin is taken
                    done = 1
                prefix = prefix | (T.Cast("uint32", thr) << T.Cast("uint32", 24 - 8 * rnd))
                mask = mask | (T.Cast("uint32", 255) << T.Cast("uint32", 24 - 8 * rnd))
                T.sync_threads()
        # collection: the columns of the keys above the threshold class, then of the first rem keys of it, into
        # s_pos (warp-aggregated slots; a shared atomicAdd, not TileLang's device-scope atomic_ref, which is a
        # generic-address ATOM); then all topk page-table lookups at once. Looking each one up as it was found
        # chained a global load, an atomic and a store per key into every step of the loop.
        if tx == 0:
            s_cnt[0] = 0
            s_cnt[1] = 0
        T.sync_threads()
        for j in T.serial(T.ceildiv(n, threads)):
            if j * threads + tx - tx % 32 < n:  # warp-uniform: the ballots need the whole warp
                kk = skeys[T.min(j * threads + tx, n - 1)]
                for c in T.unroll(2):
                    take = j * threads + tx < n and T.if_then_else(
                        c == 0, (kk & mask) > prefix, (kk & mask) == prefix)
                    votes = T.Cast("uint32", T.ballot_sync(take))
                    if votes != T.Cast("uint32", 0):
                        if (votes & lanes_below) == T.Cast("uint32", 0) and take:
                            base = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[c]),
                                                 T.popcount(votes))
                        base = T.shfl_sync(base, T.__ffs(T.Cast("int32", votes)) - 1)
                        pos_out = base + T.popcount(votes & lanes_below)
                        if take:
                            if c == 0:
                                s_pos[pos_out] = j * threads + tx
                            elif pos_out < rem:
                                s_pos[topk - rem + pos_out] = j * threads + tx
        T.sync_threads()
        for t in T.serial(T.ceildiv(topk, threads)):
            if t * threads + tx < topk:
                indices[bx, t * threads + tx] = slot(block_table, req, s_pos[t * threads + tx])

    return resident_select


def build_topk(*, topk: int, page_size: int, threads: int, resident: int):
    import tilelang.language as T

    P, R = page_size, resident
    num_tokens = T.dynamic("num_tokens")
    width = T.dynamic("width")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")

    to_key, slot = _key_and_slot(T, P, max_pages)
    resident_select = _resident_select(T, threads=threads, topk=topk, to_key=to_key, slot=slot)
    scan_threshold = _scan_threshold(T)

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
        trip per key, ~0.3 ns per key and pass on the H100, 2026-11-23)."""
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
            hist = T.alloc_shared([RADIX + 1], "int32")
            s_thr = T.alloc_shared([1], "int32")
            s_cnt = T.alloc_shared([2], "int32")

            lo = T.alloc_var("int32")
            n = T.alloc_var("int32")
            req = T.alloc_var("int32")
            rem = T.alloc_var("int32")
            thr = T.alloc_var("int32")
            pos_out = T.alloc_var("int32")
            prefix = T.alloc_var("uint32")
            mask = T.alloc_var("uint32")
            digit = T.alloc_var("uint32")
            peers = T.alloc_var("uint32")
            votes = T.alloc_var("uint32")
            base = T.alloc_var("int32")
            lanes_below = T.alloc_var("uint32")  # bits of the lanes below this one in its warp
            keys = T.alloc_local([LOADS_IN_FLIGHT], "uint32")
            vals = T.alloc_local([LOADS_IN_FLIGHT], "float32")
            done = T.alloc_var("int32")
            wsum = T.alloc_shared([RADIX // 32], "int32")
            skeys = T.alloc_shared([R], "uint32")
            s_pos = T.alloc_shared([topk], "int32")

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
                                s_pos)
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
                    for u in T.unroll(U):
                        # warp-aggregated output slots: one shared atomic per warp and class (above / tie)
                        for c in T.unroll(2):
                            take = (i * U + u) * threads + tx < n and T.if_then_else(
                                c == 0, (keys[u] & mask) > prefix, (keys[u] & mask) == prefix)
                            votes = T.Cast("uint32", T.ballot_sync(take))
                            if votes != T.Cast("uint32", 0):
                                if (votes & lanes_below) == T.Cast("uint32", 0) and take:
                                    base = T.atomic_add(s_cnt[c], T.popcount(votes), return_prev=True)
                                base = T.shfl_sync(base, T.__ffs(T.Cast("int32", votes)) - 1)
                                pos_out = base + T.popcount(votes & lanes_below)
                                if take:
                                    if c == 0:
                                        indices[bx, pos_out] = slot(block_table, req, (i * U + u) * threads + tx)
                                    elif pos_out < rem:
                                        indices[bx, topk - rem + pos_out] = slot(block_table, req,
                                                                                 (i * U + u) * threads + tx)

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
        page_size = int_param(self.name, static, "page_size", (16, 32, 64, 128, 256))
        p = {"topk": topk, "page_size": page_size, "threads": topk_threads(num_tokens, arch.num_sms_hint)}
        # many rows: two CTAs per SM, so the resident row is half an SM's shared memory
        p["resident"] = resident_keys(arch, topk_smem_bytes(p), ctas_per_sm=2)
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return topk_smem_bytes(variant.p)

    def build(self, variant: Variant):
        return build_topk(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return {**get_profile(variant.schedule).pass_configs, **_OWN_BARRIERS}


# =============================================================================================
# Top-k with a row split over several CTAs (few rows, long rows)
# =============================================================================================
MAX_SPLITS = 16
SPLIT_THREADS = 512
# Longest row the split kernel selects in one CTA from shared memory; longer rows are split over CTAs. From
# benchmarks/sweep_topk.py (H100, sm_90a, graph time per call incl. the workspace memset, 2026-11-24), 512 threads:
# a 2K-column row took 7.2 us resident against 12.8 split 16 ways, 8K columns 12.3 against 14.5, but 16K columns
# 18.3 against 14.9-15.3 (four to sixteen CTAs each read a slice). 1,024 threads would take 16K columns resident
# in 14.7 us but streamed 64K-column rows 3.5 us slower (256K context), so the split kernel keeps 512.
SPLIT_RESIDENT_MAX = 8192


def topk_splits(num_tokens: int, num_sms: int) -> int:
    """CTAs per row: the largest power of two <= 16 that keeps rows x CTAs within the SM count; 1 (the one-CTA
    kernel) once the rows alone fill the GPU. One CTA per row left 131 of 132 SMs idle at batch 1 and read a
    64K-column row five times from one SM (~86 us at 256K context on the H100, 2026-11-23)."""
    s = 1
    while s * 2 <= MAX_SPLITS and num_tokens * s * 2 <= num_sms:
        s *= 2
    return s


def topk_split_smem_bytes(p: Mapping[str, Any]) -> int:
    """The same shared buffers as the one-CTA kernel (topk_smem_bytes): histogram, per-warp totals, the resident
    select's output counters, threshold, the resident row and its selected columns."""
    return topk_smem_bytes(p)


def build_topk_split(*, topk: int, page_size: int, threads: int, splits: int, resident: int):
    """The split radix select in one launch: the row's `splits` CTAs meet at a row barrier after each pass, over a
    zeroed workspace hist [T, PASSES + 1, RADIX + 1]:
      hist[t, r, b]         keys of row t (matching the prefix of passes < r) whose pass-r digit is b, summed by
                            the row's CTAs with global atomics (each CTA first counts its slice in shared memory)
      hist[t, PASSES, 0:2]  the collection's output counters (keys above the threshold / ties taken)
      hist[t, PASSES, 2]    the row barrier's arrival count (splits per pass)
    After each barrier every CTA scans the finished histogram (L2, atomic loads: never a stale L1 line) and folds
    the pass's digit into its prefix. One launch instead of five: the launches, not the bytes, were the split
    path's cost (~24 us at every context, H100, 2026-11-24).
    Forward progress: a CTA spins only for CTAs of its own row, which have lower or adjacent block indices and
    are dispatched no later than it; one row's `splits` (<= 16) CTAs of 512 threads fit any SM12x / Hopper GPU
    at once, so the earliest unfinished row always completes (the in-order dispatch decoupled look-back relies
    on)."""
    import tilelang.language as T

    P, S, R = page_size, splits, resident
    num_tokens = T.dynamic("num_tokens")
    width = T.dynamic("width")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    U = LOADS_IN_FLIGHT

    to_key, slot = _key_and_slot(T, P, max_pages)
    resident_select = _resident_select(T, threads=threads, topk=topk, to_key=to_key, slot=slot)
    scan_threshold = _scan_threshold(T)

    @T.prim_func
    def indexer_topk_split(
        logits: T.Tensor[(num_tokens, width), "float32"],
        row_info: T.Tensor[(num_tokens, 3), "int32"],
        block_table: T.Tensor[(batch, max_pages), "int32"],
        hist: T.Tensor[(num_tokens, PASSES + 1, RADIX + 1), "int32"],
        indices: T.Tensor[(num_tokens, topk), "int32"],
        lengths: T.Tensor[(num_tokens,), "int32"],
    ):
        # the split index is blockIdx.x: a row's CTAs are dispatched together (forward progress, above)
        with T.Kernel(S, num_tokens, threads=threads) as (sx, bx):
            tx = T.get_thread_binding()
            sh = T.alloc_shared([RADIX + 1], "int32")
            s_cnt = T.alloc_shared([2], "int32")
            skeys = T.alloc_shared([R], "uint32")
            s_pos = T.alloc_shared([topk], "int32")
            wsum = T.alloc_shared([RADIX // 32], "int32")
            s_thr = T.alloc_shared([1], "int32")
            lo = T.alloc_var("int32")
            n = T.alloc_var("int32")
            req = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            c1 = T.alloc_var("int32")
            rem = T.alloc_var("int32")
            thr = T.alloc_var("int32")
            base = T.alloc_var("int32")
            pos_out = T.alloc_var("int32")
            prefix = T.alloc_var("uint32")
            mask = T.alloc_var("uint32")
            digit = T.alloc_var("uint32")
            peers = T.alloc_var("uint32")
            votes = T.alloc_var("uint32")
            lanes_below = T.alloc_var("uint32")
            done = T.alloc_var("int32")
            keys = T.alloc_local([U], "uint32")
            vals = T.alloc_local([U], "float32")

            lanes_below = (T.Cast("uint32", 1) << T.Cast("uint32", tx % 32)) - T.Cast("uint32", 1)
            lo = T.min(T.max(row_info[bx, 0], 0), width)
            n = T.max(T.min(row_info[bx, 1], width), lo) - lo
            req = T.min(T.max(row_info[bx, 2], 0), batch - 1)
            if n <= topk:
                if sx == 0:
                    if tx == 0:
                        lengths[bx] = n
                    for i in T.serial(T.ceildiv(topk, threads)):
                        if i * threads + tx < topk:
                            indices[bx, i * threads + tx] = T.if_then_else(
                                i * threads + tx < n, slot(block_table, req, i * threads + tx), -1)
            elif n <= R:
                # the row fits in shared memory: its first CTA selects it alone (no row barriers), the others exit
                if sx == 0:
                    if tx == 0:
                        lengths[bx] = topk
                    resident_select(logits, bx, lo, n, req, tx, block_table, indices, skeys, sh, wsum, s_thr,
                                    s_cnt, s_pos)
            else:
                # this CTA's columns [c0, c1): an equal share, a multiple of threads * U
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
                                T.atomic_add(hist[bx, rnd, tx], sh[tx])
                        # row barrier: every CTA of the row has added its pass-rnd bins
                        T.sync_threads()
                        if tx == 0:
                            T.atomic_add(hist[bx, PASSES, 2], 1, memory_order="release")
                            while T.atomic_load(hist[bx, PASSES, 2], memory_order="acquire") < S * (rnd + 1):
                                T.evaluate(0)
                        T.sync_threads()
                        # suffix sums of the row's finished histogram into sh, the digit of the rem-th largest key,
                        # folded into prefix / mask / rem (sh[RADIX] was zeroed with the pass's counts)
                        scan_threshold(sh, wsum, s_thr, tx, rem,
                                       T.atomic_load(hist[bx, rnd, tx], memory_order="relaxed"))
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
                    for u in T.unroll(U):
                        # warp-aggregated output slots: one global atomic per warp and class (above / tie)
                        for c in T.unroll(2):
                            take = c0 + (i * U + u) * threads + tx < c1 and T.if_then_else(
                                c == 0, (keys[u] & mask) > prefix, (keys[u] & mask) == prefix)
                            votes = T.Cast("uint32", T.ballot_sync(take))
                            if votes != T.Cast("uint32", 0):
                                if (votes & lanes_below) == T.Cast("uint32", 0) and take:
                                    base = T.atomic_add(hist[bx, PASSES, c], T.popcount(votes), return_prev=True)
                                base = T.shfl_sync(base, T.__ffs(T.Cast("int32", votes)) - 1)
                                pos_out = base + T.popcount(votes & lanes_below)
                                if take:
                                    if c == 0:
                                        if pos_out < topk:
                                            indices[bx, pos_out] = slot(block_table, req,
                                                                        c0 + (i * U + u) * threads + tx)
                                    elif pos_out < rem:
                                        indices[bx, topk - rem + pos_out] = slot(block_table, req,
                                                                                 c0 + (i * U + u) * threads + tx)

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
        page_size = int_param(self.name, static, "page_size", (16, 32, 64, 128, 256))
        p = {"topk": topk, "page_size": page_size, "threads": SPLIT_THREADS,
             "splits": max(2, topk_splits(num_tokens, arch.num_sms_hint))}
        p["resident"] = min(SPLIT_RESIDENT_MAX, resident_keys(arch, topk_split_smem_bytes(p), ctas_per_sm=1))
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return topk_split_smem_bytes(variant.p)

    def build(self, variant: Variant):
        return build_topk_split(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return {**get_profile(variant.schedule).pass_configs, **_OWN_BARRIERS}


# =============================================================================================
# SWA index preparation
# =============================================================================================
SWA_THREADS = 128


def build_swa_indices(*, window: int, page_size: int, threads: int):
    import tilelang.language as T

    P, W = page_size, window
    TB = max(1, threads * 4 // W)      # tokens per CTA: 4 entries per thread
    num_tokens = T.dynamic("num_tokens")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")

    @T.prim_func
    def indexer_swa_indices(
        positions: T.Tensor[(num_tokens,), "int32"],
        req_idx: T.Tensor[(num_tokens,), "int32"],
        block_table: T.Tensor[(batch, max_pages), "int32"],
        swa_indices: T.Tensor[(num_tokens, W), "int32"],
        swa_lengths: T.Tensor[(num_tokens,), "int32"],
    ):
        with T.Kernel(T.ceildiv(num_tokens, TB), threads=threads) as bx:
            for tb, w in T.Parallel(TB, W):
                if bx * TB + tb < num_tokens:
                    swa_indices[bx * TB + tb, w] = T.if_then_else(
                        w < T.min(W, T.max(positions[bx * TB + tb] + 1, 0)),
                        T.if_then_else(
                            block_table[T.min(T.max(req_idx[bx * TB + tb], 0), batch - 1),
                                        T.min(T.max(T.floordiv(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P), 0), max_pages - 1)] < 0,
                            -1,
                            block_table[T.min(T.max(req_idx[bx * TB + tb], 0), batch - 1),
                                        T.min(T.max(T.floordiv(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P), 0), max_pages - 1)] * P
                            + T.floormod(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P)),
                        -1)
            for tb in T.Parallel(TB):
                if bx * TB + tb < num_tokens:
                    swa_lengths[bx * TB + tb] = T.min(W, T.max(positions[bx * TB + tb] + 1, 0))

    return indexer_swa_indices


@register
class IndexerSwaIndicesSpec(KernelSpec):
    """Sliding-window index lists over a paged SWA cache. Statics: window, page_size."""
    name = "indexer_swa_indices"
    arg_names = ("positions", "req_idx", "block_table", "swa_indices", "swa_lengths")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"window": int(model.sliding_window)}  # page_size per call site (family.uses)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        window = int_param(self.name, static, "window")
        if window % 32 or window > 4096:
            raise ValueError(f"{self.name}: window={window} must be a multiple of 32 up to 4096")
        page_size = int_param(self.name, static, "page_size", (16, 32, 64, 128, 256))
        p = {"window": window, "page_size": page_size, "threads": SWA_THREADS}
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return 0  # registers only

    def build(self, variant: Variant):
        return build_swa_indices(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return dict(get_profile(variant.schedule).pass_configs)
