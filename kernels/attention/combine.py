"""The split-KV combine of sparse MLA (`sparse_mla_combine`): merges the n_splits partial outputs of decode.py /
prefill.py (each normalised within its split, with its log2-sum-exp) and applies the sink."""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any

from .common import D, LOG2E


def build_combine(heads: int, n_splits: int, head_block: int, threads: int, pdl: bool = False):
    """out[t, h] = sum_s 2^lse_s o_s / (sum_s 2^lse_s + e^sink[h]), in log2 units against the max.
    A split with no candidate (lse = -inf) wrote no partial O and is not read: with 64 splits of a short list
    most are empty. Launched behind the forward kernel by PDL (the forward kernel lets it launch once its CTAs
    leave their main loop); every split's partial is loaded at once, on its lse alone, while the weights are
    computed (one round trip for all of them). pdl: every CTA lets the kernel behind it (the next layer's forward
    kernel, which waits in its pdl_sync) launch at once."""
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


def combine_params(heads: int, n_splits: int, num_tokens: int) -> dict[str, Any]:
    """The combine variant for `n_splits` partials at `num_tokens` (select's, and the schedule sweep's). One head per
    CTA (tokens x heads CTAs): four heads per CTA left a one-token step's partials to a few SMs."""
    # every split's loads in flight at once: 2 dims a thread (256 threads a head) from 32 splits, else 4
    return {"heads": heads, "n_splits": n_splits, "head_block": 1, "threads": 256 if n_splits >= 32 else 128,
            "pdl": num_tokens <= PDL_TRIGGER_MAX_TOKENS}

