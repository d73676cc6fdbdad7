"""Sparse MLA prefill over gathered bf16 KV rows (`sparse_mla_fwd`, kv_format bf16): each query token carries its
own candidate rows of kv [N, 512]. The per-tile math is common.py's; rows are gathered through registers (tile k+1's
rows load while tile k is multiplied), with the fp8 decode kernel's loop and barriers.

Shared memory on top of common.py's: the row index and validity per tile row (8*BI; smem_bytes_for's register-path
figure, 4*BI*(3 + 8), bounds it).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from .common import D, SPAD, tile_macros


def build_prefill(heads: int, head_block: int, block_i: int, threads: int, n_splits: int, softmax_scale: float,
                  score_chains: int = 0):
    import tilelang.language as T

    H, HB, BI, S = heads, head_block, block_i, n_splits
    NHB = (H + HB - 1) // HB
    num_tokens = T.dynamic("num_tokens")
    n1 = T.dynamic("n_idx1")
    n2 = T.dynamic("n_idx2")
    N1, N2 = T.dynamic("kv_rows1"), T.dynamic("kv_rows2")
    tm = tile_macros(T, heads=H, head_block=HB, block_i=BI, threads=threads, n_splits=S, softmax_scale=softmax_scale,
                     score_chains=score_chains, n1=n1, n2=n2)
    load_q, attend_tile, mark_valid, tile_range, finish = tm.load_q, tm.attend_tile, tm.mark_valid, tm.tile_range, tm.finish
    neg_inf, out_shape, part_shape, lse_shape = tm.neg_inf, tm.out_shape, tm.part_shape, tm.lse_shape

    @T.macro
    def rows_bf16(idx, lens, nidx, nrows, t, tile, pg_s):
        n = T.min(lens[t], nidx)
        for j in T.Parallel(BI):
            pos = tile * BI + j
            slot = T.if_then_else(pos < n, idx[t, T.min(pos, nidx - 1)], -1)
            pg_s[j] = T.if_then_else((slot >= 0) and (slot < nrows), slot, -1)

    @T.macro
    def load_bf16(kv, pg_s, raw_r):
        for j, c in T.Parallel(BI, D):
            raw_r[j, c] = T.if_then_else(pg_s[j] >= 0, kv[T.max(pg_s[j], 0), c], T.bfloat16(0))

    @T.macro
    def store_bf16(raw_r, kv_s):
        for j, c in T.Parallel(BI, D):
            kv_s[j, c] = raw_r[j, c]

    @T.prim_func
    def sparse_mla_fwd_bf16(
        q: T.Tensor[(num_tokens, H, D), "bfloat16"],
        kv1: T.Tensor[(N1, D), "bfloat16"],
        idx1: T.Tensor[(num_tokens, n1), "int32"],
        lens1: T.Tensor[(num_tokens,), "int32"],
        kv2: T.Tensor[(N2, D), "bfloat16"],
        idx2: T.Tensor[(num_tokens, n2), "int32"],
        lens2: T.Tensor[(num_tokens,), "int32"],
        sink: T.Tensor[(H,), "float32"],
        out: T.Tensor[out_shape, "bfloat16"],
        o_part: T.Tensor[part_shape, "bfloat16"],
        lse_part: T.Tensor[lse_shape, "float32"],
    ):
        with T.Kernel(num_tokens, NHB, S, threads=threads) as (t, hb, split):
            q_s = T.alloc_shared([HB, D], "bfloat16")
            kv_s = T.alloc_shared([BI, D], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            s_s = T.alloc_shared([HB, BI + SPAD], "float32")
            alpha_s = T.alloc_shared([HB], "float32")
            l_s = T.alloc_shared([HB], "float32")
            m_s = T.alloc_shared([HB], "float32")
            pg_s = T.alloc_shared([BI], "int32")
            valid_s = T.alloc_shared([BI], "int32")
            raw_r = T.alloc_fragment([BI, D], "bfloat16")
            acc_s = T.alloc_fragment([HB, BI], "float32")
            acc_b = T.alloc_fragment([HB, BI], "float32")
            acc_c = T.alloc_fragment([HB, BI], "float32")
            acc_d = T.alloc_fragment([HB, BI], "float32")
            acc_o = T.alloc_fragment([HB, D], "float32")
            st = T.alloc_local([2], "float32")
            rng = T.alloc_local([5], "int32")
            tx = T.get_thread_binding()

            T.pdl_sync()  # launched behind its producer (PDL), as decode.py's kernels
            load_q(q, q_s, t, hb)
            T.clear(acc_o)
            st[0] = neg_inf
            st[1] = T.float32(0)
            tile_range(lens1, lens2, t, split, rng)
            # the fp8 kernel's loop and barriers, with bf16 rows copied as they are
            for it in T.serial(rng[2] - rng[1] + 1):
                if it > 0:
                    mark_valid(pg_s, valid_s)
                T.sync_threads()  # B
                if it > 0:
                    store_bf16(raw_r, kv_s)
                if rng[1] + it < rng[2]:
                    if rng[1] + it < rng[0]:
                        rows_bf16(idx1, lens1, n1, N1, t, rng[1] + it, pg_s)
                    else:
                        rows_bf16(idx2, lens2, n2, N2, t, rng[1] + it - rng[0], pg_s)
                T.sync_threads()  # C
                if rng[1] + it < rng[2]:
                    if rng[1] + it < rng[0]:
                        load_bf16(kv1, pg_s, raw_r)
                    else:
                        load_bf16(kv2, pg_s, raw_r)
                if it > 0:
                    attend_tile(q_s, kv_s, acc_s, acc_b, acc_c, acc_d, s_s, valid_s, p_s, alpha_s, acc_o, st, tx)
            finish(acc_o, st, l_s, m_s, alpha_s, tx, sink, out, o_part, lse_part, t, hb, split, q_s)

    return sparse_mla_fwd_bf16
