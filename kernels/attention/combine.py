"""The split-KV combine of sparse MLA (`sparse_mla_combine`): merges the n_splits partial outputs of decode.py /
prefill.py (each normalised within its split, with its log2-sum-exp) and applies the sink."""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any

from .common import D, LOG2E


def build_combine(heads: int, n_splits: int, head_block: int, threads: int):
    """out[t, h] = sum_s 2^lse_s o_s / (sum_s 2^lse_s + e^sink[h]), in log2 units against the max.
    A split with no candidate (lse = -inf) wrote no partial O and is not read: with 64 splits of a short list
    most are empty."""
    import tilelang.language as T

    H, S, HC = heads, n_splits, head_block
    TPH = threads // HC          # threads per head
    VD = D // TPH                # dims per thread (contiguous: one 16-byte load per split at 128 threads)
    CH = min(S, 16)              # splits loaded at once
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def sparse_mla_combine(
        o_part: T.Tensor[(S, num_tokens, H, D), "float32"],
        lse_part: T.Tensor[(S, num_tokens, H), "float32"],
        sink: T.Tensor[(H,), "float32"],
        out: T.Tensor[(num_tokens, H, D), "bfloat16"],
    ):
        with T.Kernel(num_tokens, T.ceildiv(H, HC), threads=threads) as (t, hc):
            tx = T.get_thread_binding()
            h = hc * HC + tx // TPH
            hh = T.min(h, H - 1)
            d0 = (tx % TPH) * VD
            w = T.alloc_local([S], "float32")
            st = T.alloc_local([2], "float32")   # running max, then the denominator
            acc = T.alloc_local([VD], "float32")
            part = T.alloc_local([CH * VD], "float32")
            ob = T.alloc_local([VD], "bfloat16")
            st[0] = sink[hh] * LOG2E
            for s in T.unroll(S):
                st[0] = T.max(st[0], lse_part[s, t, hh])
            st[1] = T.exp2(sink[hh] * LOG2E - st[0])
            for s in T.unroll(S):
                w[s] = T.exp2(lse_part[s, t, hh] - st[0])
                st[1] = st[1] + w[s]
            for v in T.unroll(VD):
                acc[v] = T.float32(0)
            # CH splits' loads are issued before any is used (predicated off for empty splits): loads inside
            # a branch per split ran one DRAM round trip after another
            for c in T.unroll(S // CH):
                for s in T.unroll(CH):
                    for v in T.vectorized(VD):
                        part[s * VD + v] = T.if_then_else(w[c * CH + s] > 0, o_part[c * CH + s, t, hh, d0 + v],
                                                          T.float32(0))
                for s in T.unroll(CH):
                    for v in T.unroll(VD):
                        acc[v] = acc[v] + w[c * CH + s] * part[s * VD + v]
            for v in T.unroll(VD):
                ob[v] = T.Cast("bfloat16", acc[v] / st[1])
            if h < H:
                for v in T.vectorized(VD):
                    out[t, hh, d0 + v] = ob[v]

    return sparse_mla_combine


def combine_params(heads: int, n_splits: int) -> dict[str, Any]:
    """The combine variant for `n_splits` partials (select's, and the schedule sweep's). One head per CTA
    (tokens x heads CTAs): four heads per CTA left a one-token step's partials to a few SMs."""
    return {"heads": heads, "n_splits": n_splits, "head_block": 1, "threads": 128}

