"""DeepSeek V4 expert routing (`moe_route`): the gate's scoring, top-k and weights, after the gate GEMM.

Per token t, over its fp32 gate logits l[t, :E] (dsv4_kernels.md 1; vLLM 0.33's sqrtsoftplus router states the
same rule):
    s[e]  = sqrt(softplus(l[e]))                         the unbiased score
    ids   = the topk experts by s[e] + bias[e]            (bias steers the choice only: "noaux_tc")
            ties go to the lower expert index
    w[j]  = s[ids[j]] / sum_j s[ids[j]] * routed_scaling  (always renormalized)
Hash-routed layers (the first layers; `hashed` variant): ids are given (tid2eid[input_ids], gathered by the
caller) and only the weights are computed, the same way.

G tokens per CTA; every step is a row reduction over a [G, E] fragment (max for the choice, max over
"E - index" among the maxima for the lowest index, sum for the picked score). Shared memory: the [G, topk]
picks only. Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, schedule_name
from dsv4_jit.spec import Variant, register

from .spec_base import MoeKernelSpec

TOKENS_PER_CTA = 4
THREADS = 128
SUPPORTED_EXPERTS = (64, 128, 256, 384, 512)


def route_smem_bytes(p: Mapping[str, Any]) -> int:
    """The picked ids (int32) and scores (fp32) of the CTA's tokens, plus a bound on the reductions' cross-warp
    workspace (one fp32 per thread for each of the max / index / sum reductions; E = 256 needs none, one warp
    per token; E = 384 lowers to exactly this: 1,728 B, hashed 704 B)."""
    return p["group"] * p["topk"] * 8 + p["threads"] * 4 * (1 if p["hashed"] else 3)


def build_moe_route(*, experts: int, topk: int, hashed: bool, group: int, threads: int):
    import tilelang.language as T

    E, K, G = experts, topk, group
    f32 = "float32"
    NT = T.dynamic("num_tokens")
    neg_inf = -T.infinity(f32)

    def softplus(x):
        # log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)
        return T.max(x, 0.0) + T.log(1.0 + T.exp(-T.abs(x)))

    @T.macro
    def body(logits, bias, ids_in, ids_out, w_out):
        with T.Kernel(T.ceildiv(NT, G), threads=threads) as bx:
            s = T.alloc_fragment((G, E), f32)
            sel = T.alloc_fragment((G, E), f32)
            key = T.alloc_fragment((G, E), f32)
            red = T.alloc_fragment((G,), f32)
            pick = T.alloc_fragment((G,), f32)
            ids_s = T.alloc_shared((G, K), "int32")
            w_s = T.alloc_shared((G, K), f32)
            for g, e in T.Parallel(G, E):
                s[g, e] = T.sqrt(softplus(logits[T.min(bx * G + g, NT - 1), e]))
                if not hashed:
                    sel[g, e] = s[g, e] + bias[e]
            for j in T.serial(K):
                if hashed:
                    for g in T.Parallel(G):
                        ids_s[g, j] = T.min(T.max(ids_in[T.min(bx * G + g, NT - 1), j], 0), E - 1)
                else:
                    T.reduce_max(sel, red, dim=1, clear=True)
                    for g, e in T.Parallel(G, E):
                        key[g, e] = T.if_then_else(sel[g, e] == red[g], T.Cast(f32, E - e), 0.0)
                    T.reduce_max(key, pick, dim=1, clear=True)
                    for g in T.Parallel(G):
                        ids_s[g, j] = T.min(E - T.Cast("int32", pick[g]), E - 1)   # NaN logits: no max, still in range
                T.sync_threads()
                for g, e in T.Parallel(G, E):
                    key[g, e] = T.if_then_else(e == ids_s[g, j], s[g, e], 0.0)
                    if not hashed:
                        sel[g, e] = T.if_then_else(e == ids_s[g, j], neg_inf, sel[g, e])
                T.reduce_sum(key, red, dim=1, clear=True)
                for g in T.Parallel(G):
                    w_s[g, j] = red[g]
                T.sync_threads()
            for g in T.Parallel(G):
                red[g] = 0.0
                for j in T.serial(K):
                    red[g] += w_s[g, j]
            for g, j in T.Parallel(G, K):
                if bx * G + g < NT:
                    ids_out[bx * G + g, j] = ids_s[g, j]
                    w_out[bx * G + g, j] = w_s[g, j] / red[g]

    if hashed:
        @T.prim_func
        def moe_route_hashed(
            logits: T.Tensor[(NT, E), f32],
            ids_in: T.Tensor[(NT, K), "int32"],
            ids_out: T.Tensor[(NT, K), "int32"],
            w_out: T.Tensor[(NT, K), f32],
        ):
            body(logits, None, ids_in, ids_out, w_out)
        return moe_route_hashed

    @T.prim_func
    def moe_route(
        logits: T.Tensor[(NT, E), f32],
        bias: T.Tensor[(E,), f32],
        ids_out: T.Tensor[(NT, K), "int32"],
        w_out: T.Tensor[(NT, K), f32],
    ):
        body(logits, bias, None, ids_out, w_out)
    return moe_route


@register
class MoeRouteSpec(MoeKernelSpec):
    """DeepSeek V4 routing after the gate GEMM. Statics: experts, topk, hashed (bool). The routed scaling is
    applied by the host op (a multiply the caller fuses or not), so one variant serves every scale."""
    name = "moe_route"
    arg_names = ("logits", "bias_or_ids", "ids_out", "w_out")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"experts": int(model.n_routed_experts), "topk": int(model.num_experts_per_tok), "hashed": False}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        if not isinstance(static, Mapping) or not {"experts", "topk", "hashed"} <= set(static):
            raise ValueError(f"{self.name}: static params need experts, topk and hashed, got {static!r}")
        e, k, h = static["experts"], static["topk"], static["hashed"]
        if e not in SUPPORTED_EXPERTS:
            raise ValueError(f"{self.name}: experts={e!r} is not supported (supported: {SUPPORTED_EXPERTS})")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(16, e):
            raise ValueError(f"{self.name}: topk must be an int in 1..{min(16, e)}, got {k!r}")
        if not isinstance(h, bool):
            raise ValueError(f"{self.name}: hashed must be a bool, got {h!r}")
        p = {"experts": e, "topk": k, "hashed": h, "group": TOKENS_PER_CTA, "threads": THREADS}
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return route_smem_bytes(variant.p)

    def build(self, variant: Variant):
        return build_moe_route(**variant.p)
