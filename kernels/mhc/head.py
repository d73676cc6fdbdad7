"""hc_head: collapse the hc residual streams before the LM head (also used by MTP).

  xf    = residual.view(T, hc*H).float()
  mixes = (xf @ fn^T) * rsqrt(mean(xf^2) + rms_eps)          [T, hc]
  pre   = sigmoid(mixes * hc_scale + hc_base) + hc_eps
  y     = sum_i pre[:, i] * residual[:, i, :]                 [T, H] bf16

One CTA owns `tokens_per_cta` tokens. Pass 1 streams K once: each thread loads its 8 fn columns
(for all hc rows) once and applies them to every token of the CTA, so fn's 256 KB (Flash) of
L2 traffic is paid once per CTA rather than once per token. Pass 2 re-reads the CTA's own rows,
which it touched microseconds earlier (L2 hit), instead of staging them in shared memory: with
several tokens per CTA that would need 32-56 KB per token, too much for SM120's 101,376 B.
"""
# No `from __future__ import annotations` (TileLang evaluates the T.Tensor annotations).
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register

from .post import check_hidden_hc, pass_configs_for

VEC = 8


def head_schedule(num_tokens: int, num_sms: int) -> tuple[int, int]:
    """(tokens_per_cta, threads): one token per CTA while the grid would otherwise leave SMs idle;
    beyond that 4 tokens share each fn load (1024 threads at small T and 8 tokens per CTA are slower)."""
    if num_tokens <= num_sms:
        return 1, 256
    return 4, 256


def _float_param(name: str, static: Mapping[str, Any], key: str) -> float:
    if key not in static:
        raise ValueError(f"{name}: static params lack {key!r} (got {sorted(static)})")
    v = static[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0.0 <= float(v) < 1.0):
        raise ValueError(f"{name}: {key} must be a float in [0, 1), got {v!r}")
    return float(v)


def build_head(hidden: int, hc: int, rms_eps: float, hc_eps: float, tokens_per_cta: int, threads: int):
    import tilelang.language as T

    TB = tokens_per_cta
    K = hc * hidden
    CH = threads * VEC
    n_k = (K + CH - 1) // CH
    n_h = (hidden + CH - 1) // CH
    k_tail = K % CH != 0
    h_tail = hidden % CH != 0
    NW = threads // 32
    R = TB * (hc + 1)          # per token: hc dots + the sum of squares (last)
    inv_k = 1.0 / K
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_head_kernel(
        residual: T.Tensor[(num_tokens, hc, hidden), "bfloat16"],
        fn: T.Tensor[(hc, K), "float32"],
        hc_scale: T.Tensor[(1,), "float32"],
        hc_base: T.Tensor[(hc,), "float32"],
        y: T.Tensor[(num_tokens, hidden), "bfloat16"],
    ):
        with T.Kernel(T.ceildiv(num_tokens, TB), threads=threads) as bt:
            tx = T.get_thread_binding()
            w = tx // 32
            lane = tx % 32
            red_s = T.alloc_shared([NW, R], "float32")
            acc = T.alloc_local([R], "float32")
            fl = T.alloc_local([hc, VEC], "float32")
            xb = T.alloc_local([VEC], "bfloat16")
            pre = T.alloc_local([TB, hc], "float32")
            tot = T.alloc_local([2], "float32")
            ya = T.alloc_local([VEC], "float32")
            yb = T.alloc_local([VEC], "bfloat16")

            for r in T.unroll(R):
                acc[r] = T.float32(0)
            # pass 1: dots + sum of squares; 8 consecutive k never straddle a stream (H % 8 == 0)
            for kc in T.serial(n_k):
                k0 = kc * CH + tx * VEC
                if (not k_tail) or k0 < K:
                    for i in T.unroll(hc):
                        for v in T.vectorized(VEC):
                            fl[i, v] = fn[i, k0 + v]
                    for tb in T.unroll(TB):
                        t = bt * TB + tb
                        if t < num_tokens:
                            for v in T.vectorized(VEC):
                                xb[v] = residual[t, k0 // hidden, k0 % hidden + v]
                            for v in T.unroll(VEC):
                                xv = T.Cast("float32", xb[v])
                                acc[tb * (hc + 1) + hc] = acc[tb * (hc + 1) + hc] + xv * xv
                                for i in T.unroll(hc):
                                    acc[tb * (hc + 1) + i] = acc[tb * (hc + 1) + i] + xv * fl[i, v]
            for r in T.unroll(R):
                tot[0] = T.warp_reduce_sum(acc[r])
                if lane == 0:
                    red_s[w, r] = tot[0]
            T.sync_threads()
            # every thread derives all TB*hc mixing weights itself (a few broadcast smem reads),
            # which saves a second barrier
            for tb in T.unroll(TB):
                tot[1] = T.float32(0)
                for ww in T.unroll(NW):
                    tot[1] = tot[1] + red_s[ww, tb * (hc + 1) + hc]
                tot[1] = T.rsqrt(tot[1] * inv_k + rms_eps)
                for i in T.unroll(hc):
                    tot[0] = T.float32(0)
                    for ww in T.unroll(NW):
                        tot[0] = tot[0] + red_s[ww, tb * (hc + 1) + i]
                    tot[0] = tot[0] * tot[1] * hc_scale[0] + hc_base[i]
                    pre[tb, i] = T.float32(1) / (T.float32(1) + T.exp(-tot[0])) + hc_eps
            # pass 2: weighted sum of the streams
            for hcnk in T.serial(n_h):
                h0 = hcnk * CH + tx * VEC
                if (not h_tail) or h0 < hidden:
                    for tb in T.unroll(TB):
                        t = bt * TB + tb
                        if t < num_tokens:
                            for v in T.unroll(VEC):
                                ya[v] = T.float32(0)
                            for i in T.unroll(hc):
                                for v in T.vectorized(VEC):
                                    xb[v] = residual[t, i, h0 + v]
                                for v in T.unroll(VEC):
                                    ya[v] = ya[v] + pre[tb, i] * T.Cast("float32", xb[v])
                            for v in T.unroll(VEC):
                                yb[v] = T.Cast("bfloat16", ya[v])
                            for v in T.vectorized(VEC):
                                y[t, h0 + v] = yb[v]

    return mhc_head_kernel


@register
class MhcHeadSpec(KernelSpec):
    name = "mhc_head"
    arg_names = ("residual", "fn", "hc_scale", "hc_base", "y")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"hidden_size": int(model.hidden_size), "hc_mult": int(model.hc_mult),
                "rms_eps": float(model.rms_norm_eps), "hc_eps": float(model.hc_eps)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        hidden, hc = check_hidden_hc(self.name, static)
        rms_eps = _float_param(self.name, static, "rms_eps")
        hc_eps = _float_param(self.name, static, "hc_eps")
        tb, threads = head_schedule(num_tokens, arch.num_sms_hint)
        params = {"hidden": hidden, "hc": hc, "rms_eps": rms_eps, "hc_eps": hc_eps,
                  "tokens_per_cta": tb, "threads": threads}
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        p = variant.p
        return build_head(p["hidden"], p["hc"], p["rms_eps"], p["hc_eps"], p["tokens_per_cta"], p["threads"])

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        return 4 * (p["threads"] // 32) * p["tokens_per_cta"] * (p["hc"] + 1)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)
