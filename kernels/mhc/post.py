"""mHC post (`mhc_post`) and post fused with the next layer's prenorm partials (`mhc_post_pre_fused`).

post:   out[t, j, :] = post[t, j] * x[t, :] + sum_i comb[t, i, j] * residual[t, i, :]   (fp32 math, bf16 out)

Both kernels are memory bound and use no tensor cores, TMA or warp specialisation, so the
SM12x and sm_90a schedules differ only in the split heuristics (driven by `num_sms_hint`).

Fused output layout (what the pre big-fuse consumes):
  mix_part [S, T, MP] fp32: split s's partial of sum_k out_flat[t, k] * fn_next[m, k], where
      out_flat = out.view(T, hc*H) rounded to bf16 (what the next layer reads) and split s owns
      h in [s*H/S, (s+1)*H/S) of EVERY stream i (k = i*H + h) - not a contiguous K range, which
      does not matter because the consumer only sums over s. Columns m >= M are written as 0.
  sq_part  [S, T] fp32: the same split's partial of sum_k out_flat[t, k]^2.
  S = hidden / split_h (variant param, see `fused_num_splits`), MP = mix_pad = mhc_pre.mix_pad(hc)
  (32 for hc=4), i.e. exactly the [S, T, MP] layout mhc_pre_norm_fn writes, so mhc_pre_fuse (S dynamic)
  consumes either. (mhc_pre_norm_fn leaves columns >= M stale; the fuse never reads them.)
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations, and
# under PEP 563 names used only in annotations (not captured by the closure) are not found.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, get_profile, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

from .pre import mix_pad as pre_mix_pad

VEC = 8                    # bf16 per 16-byte access
MAX_MIX_PAD = 32           # one lane per mix_part column
FUSED_WARPS = 4


def fused_tokens_per_cta(num_tokens: int) -> int:
    """4 warps per CTA. Up to 16 tokens: one token per warp (TB=4), the shortest dot phase. Beyond:
    16 tokens share one staged fn slice, 4 per warp, each fn_s read feeding 4 tokens (with TB=4 the fn
    re-reads and the per-token smem traffic dominate)."""
    return 4 if num_tokens <= 16 else 16


# Above this many tokens re-reading the fn slice per 16 tokens costs more than post + prenorm GEMM
# (SGLang switches at 32 too); the runtime should route larger T to mhc_post + the pre kernels.
FUSED_POST_PRE_MAX_TOKENS = 32


def pass_configs_for(variant: Variant) -> dict[str, Any]:
    """Profile pass configs plus 128-bit vectors only: TileLang 0.1.15 emits 256-bit global loads
    for sm_100+/sm_120 (tl::load_global_256), which an SM120 schedule proven on Hopper (compiled for
    sm_90a) would never exercise; 2 x 16 B costs nothing here."""
    cfg = dict(get_profile(variant.schedule).pass_configs)
    cfg["tl.disable_vectorize_256"] = True
    return cfg


def check_hidden_hc(name: str, static: Mapping[str, Any]) -> tuple[int, int]:
    hidden = int_param(name, static, "hidden_size")
    hc = int_param(name, static, "hc_mult")
    if hidden % 256:
        raise ValueError(f"{name}: hidden_size must be a multiple of 256 (16-byte vectors per thread), got {hidden}")
    if hc > 16:
        raise ValueError(f"{name}: hc_mult={hc} is out of range (1..16)")
    return hidden, hc


# =============================================================================================
# mhc_post
# =============================================================================================
def _post_block(hidden: int, big: bool) -> int:
    if not big:
        return 256  # 32 threads x 8: many small CTAs so a few tokens still spread over SMs
    for h_blk in (1024, 512, 256):
        if hidden % h_blk == 0:
            return h_blk
    raise AssertionError("unreachable: hidden % 256 == 0 was checked")


def _wide_threads(hidden: int) -> int | None:
    """Threads for the wide tile (2 vectors per thread, up to 256 threads): the largest warp multiple
    whose 16*threads-column block divides hidden (V4-Flash 256 -> 4096 columns, V4-Pro 224 -> 3584)."""
    for threads in range(256, 31, -32):
        if hidden % (threads * VEC * 2) == 0:
            return threads
    return None


def post_tile(hidden: int, num_tokens: int, num_sms: int) -> tuple[int, int]:
    """(threads, vectors per thread) for this token count.
    * few tokens: 32 threads x 256 columns, so the grid still covers the SMs;
    * once T x hidden/1024 fills the SMs: 128 threads x 1024 columns;
    * once the wide tile gives >= 2 CTAs per SM: 2 x 16 B per thread, up to 256 threads (twice the
      bytes in flight per thread); at small T the 1024-column tile stays best."""
    wide = _wide_threads(hidden)
    if wide is not None and num_tokens * (hidden // (wide * VEC * 2)) >= 2 * num_sms:
        return wide, 2
    big = num_tokens * max(1, hidden // 1024) >= num_sms
    return _post_block(hidden, big) // VEC, 1


def build_post(hidden: int, hc: int, threads: int, vecs: int = 1):
    import tilelang.language as T

    h_blk = threads * VEC * vecs
    n_hblk = hidden // h_blk
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_post_kernel(
        x: T.Tensor[(num_tokens, hidden), "bfloat16"],
        residual: T.Tensor[(num_tokens, hc, hidden), "bfloat16"],
        post: T.Tensor[(num_tokens, hc), "float32"],
        comb: T.Tensor[(num_tokens, hc, hc), "float32"],
        out: T.Tensor[(num_tokens, hc, hidden), "bfloat16"],
    ):
        # token on grid.x (no 65,535 limit), h-block on grid.y
        with T.Kernel(num_tokens, n_hblk, threads=threads) as (bt, bh):
            tx = T.get_thread_binding()
            xb = T.alloc_local([vecs, VEC], "bfloat16")
            rb = T.alloc_local([vecs, hc, VEC], "bfloat16")
            ob = T.alloc_local([hc, VEC], "bfloat16")
            pl = T.alloc_local([hc], "float32")
            cl = T.alloc_local([hc, hc], "float32")
            acc = T.alloc_local([1], "float32")
            # every load is issued before any math: vecs*(hc+1) independent 16-byte loads in flight
            for u in T.unroll(vecs):
                for v in T.vectorized(VEC):
                    xb[u, v] = x[bt, bh * h_blk + u * threads * VEC + tx * VEC + v]
                for i in T.unroll(hc):
                    for v in T.vectorized(VEC):
                        rb[u, i, v] = residual[bt, i, bh * h_blk + u * threads * VEC + tx * VEC + v]
            for j in T.unroll(hc):
                pl[j] = post[bt, j]
            for i in T.unroll(hc):
                for j in T.unroll(hc):
                    cl[i, j] = comb[bt, i, j]
            for u in T.unroll(vecs):
                for j in T.unroll(hc):
                    for v in T.unroll(VEC):
                        acc[0] = pl[j] * T.Cast("float32", xb[u, v])
                        for i in T.unroll(hc):
                            acc[0] = acc[0] + cl[i, j] * T.Cast("float32", rb[u, i, v])
                        ob[j, v] = T.Cast("bfloat16", acc[0])
                for j in T.unroll(hc):
                    for v in T.vectorized(VEC):
                        out[bt, j, bh * h_blk + u * threads * VEC + tx * VEC + v] = ob[j, v]

    return mhc_post_kernel


@register
class MhcPostSpec(KernelSpec):
    name = "mhc_post"
    arg_names = ("x", "residual", "post", "comb", "out")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"hidden_size": int(model.hidden_size), "hc_mult": int(model.hc_mult)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        hidden, hc = check_hidden_hc(self.name, static)
        threads, vecs = post_tile(hidden, num_tokens, arch.num_sms_hint)
        params = {"hidden": hidden, "hc": hc, "threads": threads, "vecs": vecs}
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        p = variant.p
        return build_post(p["hidden"], p["hc"], p["threads"], p["vecs"])

    def smem_bytes(self, variant: Variant) -> int:
        return 0  # registers only

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)


# =============================================================================================
# mhc_post_pre_fused
# =============================================================================================
def fused_split_h(hidden: int, num_sms: int) -> int:
    """h-columns per split (per stream). Widest slice (fewest partials for the consumer to sum)
    that still gives >= num_sms/2 splits, so the fn read at T=1 spreads over the GPU; at most 64
    (2 per lane) so the per-lane dot stays <= 256 long and smem <= 29 KB."""
    best = 32
    for lanes_v in (1, 2):
        hs = 32 * lanes_v
        if hidden % hs == 0 and hidden // hs >= max(1, num_sms // 2):
            best = hs
    return best


def fused_num_splits(variant: Variant) -> int:
    p = variant.p
    return p["hidden"] // p["split_h"]


def build_post_pre_fused(hidden: int, hc: int, mix: int, mix_pad: int, split_h: int, tokens_per_cta: int,
                         warps: int):
    import tilelang.language as T

    TB = tokens_per_cta
    TW = TB // warps               # tokens per warp (both phases)
    threads = warps * 32
    hs = split_h
    v_per_lane = hs // 32          # consecutive h per lane
    KS = hc * hs                   # K elements one split owns
    S = hidden // hs
    K = hc * hidden
    FN_ELEMS = mix * KS
    fn_iters = (FN_ELEMS + threads - 1) // threads
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_post_pre_fused_kernel(
        x: T.Tensor[(num_tokens, hidden), "bfloat16"],
        residual: T.Tensor[(num_tokens, hc, hidden), "bfloat16"],
        post: T.Tensor[(num_tokens, hc), "float32"],
        comb: T.Tensor[(num_tokens, hc, hc), "float32"],
        fn_next: T.Tensor[(mix, K), "float32"],
        out: T.Tensor[(num_tokens, hc, hidden), "bfloat16"],
        mix_part: T.Tensor[(S, num_tokens, mix_pad), "float32"],
        sq_part: T.Tensor[(S, num_tokens), "float32"],
    ):
        with T.Kernel(T.ceildiv(num_tokens, TB), S, threads=threads) as (bt, bs):
            tx = T.get_thread_binding()
            w = tx // 32
            lane = tx % 32
            # +1 column: lane m reads row m at the same k -> 32 different banks
            fn_s = T.alloc_shared([mix, KS + 1], "float32")
            o_s = T.alloc_shared([TB, KS], "float32")
            xb = T.alloc_local([v_per_lane], "bfloat16")
            rb = T.alloc_local([hc, v_per_lane], "bfloat16")
            ob = T.alloc_local([hc, v_per_lane], "bfloat16")
            pl = T.alloc_local([hc], "float32")
            cl = T.alloc_local([hc, hc], "float32")
            tmp = T.alloc_local([1], "float32")
            fv = T.alloc_local([4], "float32")
            ov = T.alloc_local([4], "float32")
            acc = T.alloc_local([TW], "float32")
            sq = T.alloc_local([TW], "float32")
            h_base = bs * hs
            hl = lane * v_per_lane

            # this split's fn columns (k = i*H + h_base + h) for every mix row; coalesced along h
            for it in T.unroll(fn_iters):
                e = it * threads + tx
                if e < FN_ELEMS:
                    m = e // KS
                    k = e % KS
                    fn_s[m, k] = fn_next[m, (k // hs) * hidden + h_base + k % hs]

            # post for the warp's TW tokens; lane owns v_per_lane consecutive h of every stream
            for q in T.unroll(TW):
                t = bt * TB + w * TW + q
                if t < num_tokens:
                    for v in T.vectorized(v_per_lane):
                        xb[v] = x[t, h_base + hl + v]
                    for i in T.unroll(hc):
                        for v in T.vectorized(v_per_lane):
                            rb[i, v] = residual[t, i, h_base + hl + v]
                    for j in T.unroll(hc):
                        pl[j] = post[t, j]
                    for i in T.unroll(hc):
                        for j in T.unroll(hc):
                            cl[i, j] = comb[t, i, j]
                    for j in T.unroll(hc):
                        for v in T.unroll(v_per_lane):
                            tmp[0] = pl[j] * T.Cast("float32", xb[v])
                            for i in T.unroll(hc):
                                tmp[0] = tmp[0] + cl[i, j] * T.Cast("float32", rb[i, v])
                            ob[j, v] = T.Cast("bfloat16", tmp[0])
                            # the next layer reads the bf16 value, so its partials use it too
                            o_s[w * TW + q, j * hs + hl + v] = T.Cast("float32", ob[j, v])
                    for j in T.unroll(hc):
                        for v in T.vectorized(v_per_lane):
                            out[t, j, h_base + hl + v] = ob[j, v]
            T.sync_threads()

            # lane m: dots of the warp's TW tokens with fn row m. Each fn_s value read is used for
            # TW tokens and o_s is read as broadcast float4, so smem traffic is ~4x below a
            # token-per-warp loop (which made this phase smem-bound). All lanes also form sum(out^2).
            mrow = T.min(lane, mix - 1)
            for q in T.unroll(TW):
                acc[q] = T.float32(0)
                sq[q] = T.float32(0)
            for k0 in T.serial(KS // 4):
                for u in T.unroll(4):
                    fv[u] = fn_s[mrow, k0 * 4 + u]
                for q in T.unroll(TW):
                    for u in T.vectorized(4):
                        ov[u] = o_s[w * TW + q, k0 * 4 + u]
                    for u in T.unroll(4):
                        acc[q] = acc[q] + ov[u] * fv[u]
                        sq[q] = sq[q] + ov[u] * ov[u]
            for q in T.unroll(TW):
                t = bt * TB + w * TW + q
                if t < num_tokens:
                    if lane < mix_pad:
                        mix_part[bs, t, lane] = T.if_then_else(lane < mix, acc[q], T.float32(0))
                    if lane == 0:
                        sq_part[bs, t] = sq[q]

    return mhc_post_pre_fused_kernel


@register
class MhcPostPreFusedSpec(KernelSpec):
    name = "mhc_post_pre_fused"
    arg_names = ("x", "residual", "post", "comb", "fn_next", "out", "mix_part", "sq_part")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"hidden_size": int(model.hidden_size), "hc_mult": int(model.hc_mult),
                "mix_width": int(model.mix_width)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        hidden, hc = check_hidden_hc(self.name, static)
        mix = int_param(self.name, static, "mix_width")
        mp = pre_mix_pad(hc)  # the consumer's (mhc_pre_fuse) compile-time column count
        if not mix <= mp <= MAX_MIX_PAD:
            raise ValueError(f"{self.name}: mix_width={mix} with hc_mult={hc} needs mix_pad={mp}; this kernel "
                             f"supports mix_width <= mix_pad <= {MAX_MIX_PAD} (one lane per column)")
        # Two variants (T <= 16, T > 16); the token dim is dynamic. Correct for any T, but it only
        # pays for T <= FUSED_POST_PRE_MAX_TOKENS (see use_fused_post_pre).
        params = {"hidden": hidden, "hc": hc, "mix": mix, "mix_pad": mp,
                  "split_h": fused_split_h(hidden, arch.num_sms_hint),
                  "tokens_per_cta": fused_tokens_per_cta(num_tokens), "warps": FUSED_WARPS}
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        p = variant.p
        return build_post_pre_fused(p["hidden"], p["hc"], p["mix"], p["mix_pad"], p["split_h"],
                                    p["tokens_per_cta"], p["warps"])

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        ks = p["hc"] * p["split_h"]
        return 4 * (p["mix"] * (ks + 1) + p["tokens_per_cta"] * ks)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)


def use_fused_post_pre(num_tokens: int) -> bool:
    """Whether the fused kernel beats post + prenorm GEMM (routing hint for the runtime)."""
    return 1 <= num_tokens <= FUSED_POST_PRE_MAX_TOKENS
