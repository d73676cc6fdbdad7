"""The split-KV combine of sparse MLA (`sparse_mla_combine`): merges the partial outputs of decode.py / prefill.py's
splits (each normalised within its split, with its log2-sum-exp) and applies the sink. Two forms (combine_params):
the walk (each thread merges every split over a few dims) for up to 16 splits, and split groups (each group of 64
threads merges a share of the splits that had tiles, the groups meet in shared memory) for 32 and 64."""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any

from .common import D, LOG2E, list_tiles, split_share


def build_combine(heads: int, n_splits: int, head_block: int, threads: int, block_i: int, groups: int,
                  pdl: bool = False):
    """out[t, h] = sum_s 2^lse_s o_s / (sum_s 2^lse_s + e^sink[h]), in log2 units against the max. Two forms:
    groups = 0 (build_combine_walk) or split groups, below.

    One CTA a (token, head). Its threads form groups of 64 (8 dims each: one 16-byte load a split); group g merges
    splits g*SG .. g*SG + SG-1 against its own max, then the groups' sums meet in shared memory. A thread then
    walks SG = n_splits / groups splits, not all of them: with 64 splits of a one-token step, 64 CTAs walking every
    split (address math, exp2 and FMAs per split) was most of the combine's time.
    Only the splits the forward kernel gave tiles count: their number comes from the token's list lengths, as
    tile_range splits them (block_i candidates a tile, an even share of the tiles a split), computed before the
    grid dependency sync (the lengths are the forward kernel's inputs, not its output). Every load is unconditional
    (a load under a branch is waited for where the branch joins): a split past the live ones reloads the last live
    split's row (hot in L2, never stale workspace bytes) and weighs 0, as does a split whose rows had no valid
    candidate (lse = -inf, its O never written: selected away, never multiplied). Launched behind the forward kernel
    by PDL. pdl: every CTA lets the kernel behind it (the next layer's forward kernel, which waits in its pdl_sync)
    launch at once."""
    if not groups:
        return build_combine_walk(heads, n_splits, head_block, threads, pdl)
    import tilelang.language as T

    H, S, BI = heads, n_splits, block_i
    TPG = D // 8                 # threads of a split group (8 dims each)
    G = groups
    if head_block != 1 or threads != G * TPG or not 1 <= G <= D // TPG or S % G:
        raise ValueError(f"sparse_mla_combine: {threads} threads must be 1 to {D // TPG} split groups of {TPG} "
                         f"dividing {S} splits, one head a CTA (head_block 1, got {head_block})")
    SG = S // G                  # splits a group merges
    DPT = D // threads           # dims a thread writes
    num_tokens = T.dynamic("num_tokens")
    neg_inf = -T.infinity("float32")

    @T.prim_func
    def sparse_mla_combine(
        o_part: T.Tensor[(S, num_tokens, H, D), "bfloat16"],
        lse_part: T.Tensor[(S, num_tokens, H), "float32"],
        sink: T.Tensor[(H,), "float32"],
        lens1: T.Tensor[(num_tokens,), "int32"],
        lens2: T.Tensor[(num_tokens,), "int32"],
        n_idx1: T.int32,
        n_idx2: T.int32,
        out: T.Tensor[(num_tokens, H, D), "bfloat16"],
    ):
        with T.Kernel(num_tokens, H, threads=threads) as (t, h):
            tx = T.get_thread_binding()
            g = tx // TPG
            d0 = (tx % TPG) * 8
            lse = T.alloc_local([SG], "float32")
            part = T.alloc_local([SG * 8], "bfloat16")
            acc = T.alloc_local([8], "float32")
            st = T.alloc_local([4], "float32")   # the sink in log2 units, the group's max, its reference, its sum
            nt = T.alloc_local([2], "int32")     # the token's tiles, then its last live split
            sc = T.alloc_local([G], "float32")
            fin = T.alloc_local([2], "float32")  # the max over the groups and the sink, the denominator
            m_s = T.alloc_shared([G], "float32")
            l_s = T.alloc_shared([G], "float32")
            acc_s = T.alloc_shared([G, D], "float32")
            if pdl:
                T.pdl_trigger()
            st[0] = sink[h] * LOG2E   # a weight: read before the forward kernel's partials are complete
            # the forward kernel's tile_range: tiles of both lists, an even share a split; the last split given one
            tiles = list_tiles(T, lens1, lens2, t, n_idx1, n_idx2, BI)   # expressions: no variable bound
            nt[0] = tiles[0] + tiles[1]
            nt[1] = T.max(T.ceildiv(nt[0], split_share(T, T.max(nt[0], 1), S)) - 1, 0)
            T.pdl_sync()
            for s in T.unroll(SG):
                lse[s] = lse_part[T.min(g * SG + s, nt[1]), t, h]
                for v in T.vectorized(8):
                    part[s * 8 + v] = o_part[T.min(g * SG + s, nt[1]), t, h, d0 + v]
            st[1] = neg_inf
            for s in T.unroll(SG):
                lse[s] = T.if_then_else(g * SG + s <= nt[1] and nt[0] > 0, lse[s], neg_inf)
                st[1] = T.max(st[1], lse[s])
            st[2] = T.if_then_else(st[1] == neg_inf, T.float32(0), st[1])
            st[3] = T.float32(0)
            for v in T.unroll(8):
                acc[v] = T.float32(0)
            for s in T.unroll(SG):
                lse[s] = T.exp2(lse[s] - st[2])   # the split's weight (0 past the live splits or without a candidate)
                st[3] = st[3] + lse[s]
                for v in T.unroll(8):
                    acc[v] = acc[v] + T.if_then_else(lse[s] > T.float32(0),
                                                     lse[s] * T.Cast("float32", part[s * 8 + v]), T.float32(0))
            if tx % TPG == 0:
                m_s[g] = st[2]
                l_s[g] = st[3]
            for v in T.vectorized(8):
                acc_s[g, d0 + v] = acc[v]
            T.sync_threads()
            fin[0] = st[0]
            for k in T.unroll(G):
                fin[0] = T.max(fin[0], T.if_then_else(l_s[k] > T.float32(0), m_s[k], neg_inf))
            fin[1] = T.exp2(st[0] - fin[0])
            for k in T.unroll(G):
                sc[k] = T.if_then_else(l_s[k] > T.float32(0), T.exp2(m_s[k] - fin[0]), T.float32(0))
                fin[1] = fin[1] + l_s[k] * sc[k]
            for v in T.unroll(DPT):
                st[3] = T.float32(0)
                for k in T.unroll(G):
                    st[3] = st[3] + acc_s[k, tx * DPT + v] * sc[k]
                out[t, h, tx * DPT + v] = T.Cast("bfloat16", st[3] / fin[1])

    return sparse_mla_combine


def build_combine_walk(heads: int, n_splits: int, head_block: int, threads: int, pdl: bool = False):
    """The walk form: each thread merges every split over its dims (a few splits: one pass, no shared memory). Every
    split's lse loads at once, then the O of those with a candidate (lse > -inf), in one round trip for all of them.
    Takes the lengths as the split-group form does, and does not read them."""
    import tilelang.language as T

    H, S, HC = heads, n_splits, head_block
    TPH = threads // HC          # threads per head
    VD = D // TPH                # dims per thread (contiguous: one 4- or 8-byte bf16 load per split)
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def sparse_mla_combine(
        o_part: T.Tensor[(S, num_tokens, H, D), "bfloat16"],
        lse_part: T.Tensor[(S, num_tokens, H), "float32"],
        sink: T.Tensor[(H,), "float32"],
        lens1: T.Tensor[(num_tokens,), "int32"],
        lens2: T.Tensor[(num_tokens,), "int32"],
        n_idx1: T.int32,
        n_idx2: T.int32,
        out: T.Tensor[(num_tokens, H, D), "bfloat16"],
    ):
        with T.Kernel(num_tokens, T.ceildiv(H, HC), threads=threads) as (t, hc):
            tx = T.get_thread_binding()
            h = hc * HC + tx // TPH
            hh = T.min(h, H - 1)
            d0 = (tx % TPH) * VD
            lse = T.alloc_local([S], "float32")
            st = T.alloc_local([3], "float32")   # the sink in log2 units, the max, the denominator
            acc = T.alloc_local([VD], "float32")
            part = T.alloc_local([S * VD], "bfloat16")
            ob = T.alloc_local([VD], "bfloat16")
            if pdl:
                T.pdl_trigger()
            st[0] = sink[hh] * LOG2E   # a weight: read before the forward kernel's partials are complete
            T.pdl_sync()
            for s in T.unroll(S):
                lse[s] = lse_part[s, t, hh]
            for s in T.unroll(S):
                for v in T.vectorized(VD):
                    part[s * VD + v] = T.if_then_else(lse[s] > T.float32(-3.0e38), o_part[s, t, hh, d0 + v],
                                                      T.bfloat16(0))
            st[1] = st[0]
            for s in T.unroll(S):
                st[1] = T.max(st[1], lse[s])
            st[2] = T.exp2(st[0] - st[1])
            for v in T.unroll(VD):
                acc[v] = T.float32(0)
            for s in T.unroll(S):
                lse[s] = T.exp2(lse[s] - st[1])   # the split's weight (0 for an empty split)
                st[2] = st[2] + lse[s]
                for v in T.unroll(VD):
                    acc[v] = acc[v] + lse[s] * T.Cast("float32", part[s * VD + v])
            for v in T.unroll(VD):
                ob[v] = T.Cast("bfloat16", acc[v] / st[2])
            if h < H:
                for v in T.vectorized(VD):
                    out[t, hh, d0 + v] = ob[v]

    return sparse_mla_combine


# The combine lets the next kernel launch early (PDL trigger) up to this many tokens. Per layer on an H100, 8 layers
# a graph: at 1 token every point gains (H64 ratio 4 12.0 -> 11.1 us, H16 11.5 -> 10.8, both schedules); at 8 tokens
# 64 heads gain (17.4 -> 16.7) but 16 heads on the SM120 schedule lose (12.5 -> 13.8, 256K 20.8 -> 23.4): the early
# forward CTAs cost more than the overlap gains there, as at 64 tokens (36.5 -> 38.4 on an H200).
PDL_TRIGGER_MAX_TOKENS = 1


# Splits up to which the walk form merges them (above: 4 split groups)
WALK_MAX_SPLITS = 16


def combine_smem_bytes(groups: int) -> int:
    """Shared memory of a combine CTA: each split group's max, sum and 512 fp32 sums (none in the walk form)."""
    return 4 * groups * (2 + D)


def combine_params(heads: int, n_splits: int, num_tokens: int, block_i: int) -> dict[str, Any]:
    """The combine variant for `n_splits` partials of a forward kernel with `block_i`-candidate tiles at
    `num_tokens` (select's, and the schedule sweep's), one head a CTA. Up to WALK_MAX_SPLITS splits the walk form
    (128 threads, 4 dims each); from 32 splits 4 split groups of 64 threads (a thread merges 8 of 32 or 16 of 64
    splits). Per layer on an H100 (8 layers a graph), the split groups against the walk: V4-Flash 64 heads, one token,
    64 splits, 11.1 -> 10.2 us (ratio 4, 64K), 14.2 -> 13.4 (ratio 128, 256K); 16 heads x 8 tokens, 32 splits,
    13.0 -> 12.3; but at 16 splits 0.1-0.2 us slower (9.1 -> 9.3 at one token over 16 splits, 12.5 -> 12.6 for 16
    heads x 8 tokens on the SM120 schedule), 64 heads x 8 tokens, 8 splits, 17.3 -> 17.6 with 1 to 8 groups, and at
    2 splits (64 tokens) up to 4.5 us slower: their 512 / 4,096 CTAs already fill the GPU."""
    if n_splits <= WALK_MAX_SPLITS:
        groups, threads = 0, 128
    else:
        groups, threads = 4, 4 * (D // 8)
    return {"heads": heads, "n_splits": n_splits, "head_block": 1, "threads": threads, "block_i": block_i,
            "groups": groups, "pdl": num_tokens <= PDL_TRIGGER_MAX_TOKENS}
