"""mHC "pre" family: prenorm GEMM + square-sum (split-K), the big fuse, and standalone Sinkhorn.

Math (DeepSeek V4 `Block.hc_pre`), per token t, with K = hc*H and M = (2+hc)*hc:
    mixes = (x_t . fn^T) * rsqrt(mean(x_t^2) + rms_eps)
    pre   = sigmoid(mixes[:hc]*s0 + b[:hc]) + hc_eps
    post  = post_mult * sigmoid(mixes[hc:2hc]*s1 + b[hc:2hc])
    comb  = sinkhorn(mixes[2hc:].view(hc, hc)*s2 + b[2hc:])
    layer_input = sum_i pre_i * X_i            (optionally RMSNorm'ed in fp32 before the bf16 cast)

Kernels (each a KernelSpec; parameter order = inputs then outputs, see `arg_names`):
  * mhc_pre_norm_fn: x[T,K] bf16 (x[T,H] when broadcast) . fn[M,K]^T -> mix_part[S,T,MP], sq_part[S,T]
    Split s owns K-slice [s*K/S, (s+1)*K/S); S and the tiles are compile-time, T is dynamic.
  * mhc_pre_fuse: reduces the S partials (S is a *dynamic* dim, so one fuse variant serves every split
    count), applies the RMS scale, sigmoids, Sinkhorn and the pre-weighted stream sum.
  * mhc_sinkhorn: standalone split for already RMS-scaled mixes[T,M] (big-fuse path off).

TileLang is imported only inside the builders: importing this module must stay cheap.
"""
# No `from __future__ import annotations`: TileLang evaluates prim_func annotations, which name
# builder-local shapes (PEP 563 strings cannot see closure variables).
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

# ---------------------------------------------------------------------------------------------
# shared constants / helpers
# ---------------------------------------------------------------------------------------------

# GEMM N (mix) dimension padded to a multiple of 16 (mma n-tiles); M=24 -> 32, as the public kernels.
_MIX_ALIGN = 16
# Largest split count norm_fn may use (see split_ladder: a small enumerable set per K).
_MAX_SPLITS = 64
# Fuse kernel: one warp for the Sinkhorn, _FUSE_APPLY_THREADS threads for the pre-apply (16 B each); 256 beats
# 128 and 512 at small and large T alike.
_FUSE_APPLY_THREADS = 256
_VEC = 8  # bf16 elements per 16-byte access
_SINKHORN_TOKENS_PER_CTA = 128  # standalone Sinkhorn: one thread per token
_HOPPER_LARGE_FROM = 128  # norm_fn: Hopper switches to the 64-token tile from this many tokens
# Programmatic dependent launch: the fuse kernel always waits in pdl_sync; norm_fn lets it launch early
# (pdl_trigger) below this many tokens; at large T the early fuse CTAs cost more than the overlap gains.
_PDL_TRIGGER_BELOW = 1024


def mix_width(hc: int) -> int:
    return (2 + hc) * hc


def mix_pad(hc: int) -> int:
    m = mix_width(hc)
    return -(-m // _MIX_ALIGN) * _MIX_ALIGN


def _schedule_family(arch: ArchProfile) -> str:
    return arch.family


def _check_static(kernel: str, static: Mapping[str, Any], required: dict[str, type]) -> dict[str, Any]:
    """Exact key set with the right types; a clear ValueError otherwise (never assert)."""
    if not isinstance(static, Mapping):
        raise ValueError(f"{kernel}: static params must be a mapping, got {type(static).__name__}")
    missing = [k for k in required if k not in static]
    extra = [k for k in static if k not in required]
    if missing or extra:
        raise ValueError(f"{kernel}: static params mismatch (missing {missing}, unexpected {extra}); "
                         f"build them with statics_for()")
    out = {}
    for k, typ in required.items():
        v = static[k]
        if typ is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{kernel}: {k} must be a float, got {v!r}")
            v = float(v)
            if not v == v or v < 0:
                raise ValueError(f"{kernel}: {k} must be a finite non-negative float, got {v!r}")
        elif typ is bool:
            if not isinstance(v, bool):
                raise ValueError(f"{kernel}: {k} must be a bool, got {v!r}")
        elif typ is int:
            v = int_param(kernel, static, k)
        out[k] = v
    return out


def _check_hc_hidden(kernel: str, hc: int, hidden: int) -> None:
    if not 1 <= hc <= 4:
        # The fuse kernel reduces the M mixes + the square-sum with one warp-wide column each.
        raise ValueError(f"{kernel}: hc_mult={hc} unsupported (1..4; DeepSeek V4 uses 4)")
    if hidden % 256:
        raise ValueError(f"{kernel}: hidden_size={hidden} must be a multiple of 256")


# ---------------------------------------------------------------------------------------------
# 1. prenorm GEMM + square-sum (split-K)
# ---------------------------------------------------------------------------------------------

# Per schedule family: token_block x hidden_block tiles, pipeline depth, threads.
# smem/stage = BT*BK*2 (x, bf16) + MP*BK*4 (fn, fp32).
#  * SM12x: 32x128, 2 stages = 49,152 B (the public tiling, lowered in dsv4_kernels.md s4), leaving room
#    for two CTAs per SM inside the 100 KB SM carve-out; mma.sync TF32 only.
#  * Hopper / SM100: same shape, 4 stages (98,304 B): deeper prefetch to stay near HBM bandwidth at
#    large T, still two CTAs per SM.
_NORM_FN_TILES = {
    "blackwell_consumer": dict(token_block=32, hidden_block=128, stages=2, threads=128),
    "hopper": dict(token_block=32, hidden_block=128, stages=4, threads=128),
    "blackwell_dc": dict(token_block=32, hidden_block=128, stages=4, threads=128),
}
# Splits are picked so that the grid has >= this many CTAs per SM (see _pick_splits).
_NORM_FN_CTAS_PER_SM = 2

# Large-T tile per family: (from num_tokens, tile, CTAs per SM for the split pick).
#  * Hopper: 64x128, 2 stages (65,536 B; 3 CTAs per SM fit), one 16-row mma tile per warp (FullRow).
#    fn is re-read from L2 once per token block: at T=4096 token_block 64 halves that traffic
#    (96 MiB instead of 192 MiB, against 128 MiB of x), and the squares come from the x_f registers
#    instead of a second x_s read. One CTA per SM is enough here; deeper pipelines, 256 threads and
#    larger tiles were no faster.
#  * SM12x / SM100: one tile for every T (the large-T tile is not proven there).
_NORM_FN_LARGE_T = {
    "hopper": (_HOPPER_LARGE_FROM, dict(token_block=64, hidden_block=128, stages=2, threads=128), 1),
}


def split_ladder(k: int, hidden_block: int) -> tuple[int, ...]:
    """The few split counts norm_fn may use for this K: 1, 4, 16 and the largest divisor of the
    K-step count (<= _MAX_SPLITS) leaving >= 2 steps per split (64 for V4-Flash, 56 for V4-Pro)."""
    steps = k // hidden_block
    top = max(d for d in range(1, min(_MAX_SPLITS, steps // 2) + 1) if steps % d == 0)
    return tuple(sorted({s for s in (1, 4, 16) if s <= top and steps % s == 0} | {top}))


def _pick_splits(num_tokens: int, token_block: int, k: int, hidden_block: int, num_sms: int,
                 ctas_per_sm: int = _NORM_FN_CTAS_PER_SM) -> int:
    """Smallest ladder split count giving >= ctas_per_sm CTAs per SM (tiny T: the largest, to spread fn
    reads)."""
    blocks = -(-num_tokens // token_block)
    ladder = split_ladder(k, hidden_block)
    for s in ladder:
        if blocks * s >= ctas_per_sm * num_sms:
            return s
    return ladder[-1]


def _norm_fn_tile(family: str, num_tokens: int):
    """(tile, CTAs per SM) for this family and token count, or None for an unknown family."""
    large = _NORM_FN_LARGE_T.get(family)
    if large is not None and num_tokens >= large[0]:
        return large[1], large[2]
    tiles = _NORM_FN_TILES.get(family)
    return None if tiles is None else (tiles, _NORM_FN_CTAS_PER_SM)


@register
class MhcPreNormFnSpec(KernelSpec):
    name = "mhc_pre_norm_fn"
    arg_names = ("x", "fn", "mix_part", "sq_part")
    _STATIC = {"hidden": int, "hc": int, "broadcast": bool}

    def statics_for(self, model, *, broadcast: bool = False) -> dict[str, Any]:
        return {"hidden": int(model.hidden_size), "hc": int(model.hc_mult), "broadcast": bool(broadcast)}

    def static_params(self, model, parallel) -> dict[str, Any]:
        return self.statics_for(model)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        arch = check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        st = _check_static(self.name, static, self._STATIC)
        _check_hc_hidden(self.name, st["hc"], st["hidden"])
        picked = _norm_fn_tile(_schedule_family(arch), num_tokens)
        if picked is None:
            raise ValueError(f"{self.name}: no schedule for arch family {arch.family!r}")
        tiles, ctas_per_sm = picked
        k = st["hc"] * st["hidden"]
        if k % (tiles["hidden_block"] * 2):
            raise ValueError(f"{self.name}: hc*hidden={k} not a multiple of 2*{tiles['hidden_block']}")
        splits = _pick_splits(num_tokens, tiles["token_block"], k, tiles["hidden_block"], arch.num_sms_hint,
                              ctas_per_sm)
        params = dict(st, mix=mix_width(st["hc"]), mix_pad=mix_pad(st["hc"]), n_splits=splits, **tiles,
                      pdl=num_tokens < _PDL_TRIGGER_BELOW)
        return Variant.make(self.name, params, arch)

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        per_stage = p["token_block"] * p["hidden_block"] * 2 + p["mix_pad"] * p["hidden_block"] * 4
        # The pipeline keeps `stages` buffers; no other shared buffers are used (reductions stay in
        # registers / warp shuffles, the accumulator is a fragment).
        return per_stage * p["stages"]

    def build(self, variant: Variant):
        return _build_norm_fn(**variant.p)


def _build_norm_fn(*, hidden, hc, broadcast, mix, mix_pad, n_splits, token_block, hidden_block, stages,
                   threads, pdl=False):
    import tilelang.language as T
    from tilelang.layout import make_swizzled_layout

    K = hc * hidden
    XW = hidden if broadcast else K  # width of the x tensor actually read
    M, MP, S, BT, BK = mix, mix_pad, n_splits, token_block, hidden_block
    KS = K // S
    n_k = KS // BK
    num_tokens = T.dynamic("num_tokens")
    # One 16-row mma tile per warp (token_block = 16 * warps): every warp owns whole rows, so the x
    # A-fragment is not replicated across warps (half the x_s reads and registers of a 2x2 split).
    full_row = BT == 16 * (threads // 32)
    policy = T.GemmWarpPolicy.FullRow if full_row else T.GemmWarpPolicy.Square

    @T.prim_func
    def mhc_pre_norm_fn(
        x: T.Tensor((num_tokens, XW), T.bfloat16),
        fn: T.Tensor((M, K), T.float32),
        mix_part: T.Tensor((S, num_tokens, MP), T.float32),
        sq_part: T.Tensor((S, num_tokens), T.float32),
    ):
        with T.Kernel(T.ceildiv(num_tokens, BT), S, threads=threads) as (bt, bs):
            if pdl:
                # let the fuse kernel launch now: its CTAs wait in pdl_sync until this grid is done
                T.pdl_trigger()
            x_s = T.alloc_shared((BT, BK), T.bfloat16)
            fn_s = T.alloc_shared((MP, BK), T.float32)
            x_f = T.alloc_fragment((BT, BK), T.float32)
            # x^2: full_row tiles accumulate it elementwise from the x_f registers over the K loop and
            # row-reduce once at the end, through a fragment copy (sq_red): TileLang's ReduceOp rejects
            # the TF32 A-operand layout of sq_acc itself at token_block 64 ("thread-owned reduce
            # segment"). Re-reading x_s for the squares instead costs shared-memory traffic. The 2x2-warp
            # token_block-32 tiles reduce x_f^2 per step.
            sq_acc = T.alloc_fragment((BT, BK), T.float32)
            sq_f = T.alloc_fragment((BT,), T.float32)
            sq_red = T.alloc_fragment((BT, BK), T.float32)
            acc = T.alloc_fragment((BT, MP), T.float32)
            # x_s is read (not by T.gemm) into the TF32 A-fragment layout: 8 rows x 8 bytes per warp
            # load. Unswizzled rows are 256 B apart (same banks, 8-way conflicts); swizzling the 16-byte
            # chunks by row spreads them over all banks.
            T.annotate_layout({x_s: make_swizzled_layout(x_s)})
            T.clear(acc)
            T.clear(sq_f)
            if full_row:
                T.clear(sq_acc)
            for kk in T.Pipelined(n_k, num_stages=stages):
                k0 = bs * KS + kk * BK
                if broadcast:
                    # all hc streams equal x: column k of the virtual [T, hc*H] row is x[:, k % H]
                    T.copy(x[bt * BT, k0 % hidden], x_s)
                else:
                    T.copy(x[bt * BT, k0], x_s)
                # Only the M real rows: a plain copy lowers to cp.async (a masked fill would be a
                # synchronous load in the pipeline). Rows M..MP-1 hold stale smem, which only reaches
                # the padded output columns; those are zeroed before the store.
                T.copy(fn[0:M, k0:k0 + BK], fn_s[0:M, 0:BK])
                T.copy(x_s, x_f)
                if full_row:
                    for i, j in T.Parallel(BT, BK):
                        sq_acc[i, j] = sq_acc[i, j] + x_f[i, j] * x_f[i, j]
                else:
                    for i, j in T.Parallel(BT, BK):
                        sq_acc[i, j] = x_f[i, j] * x_f[i, j]
                    T.reduce_sum(sq_acc, sq_f, dim=1, clear=False)
                # bf16 x is exact in TF32; fn is rounded to TF32 (same as DeepGEMM's tf32 prenorm GEMM)
                T.gemm(x_f, fn_s, acc, transpose_B=True, policy=policy)
            if full_row:
                T.copy(sq_acc, sq_red)
                T.reduce_sum(sq_red, sq_f, dim=1, clear=False)
            for i, j in T.Parallel(BT, MP):
                acc[i, j] = T.if_then_else(j < M, acc[i, j], T.float32(0))
            T.copy(acc, mix_part[bs, bt * BT, 0])
            T.copy(sq_f, sq_part[bs, bt * BT])

    return mhc_pre_norm_fn


# ---------------------------------------------------------------------------------------------
# Sinkhorn in registers (shared by the fuse and standalone kernels)
# ---------------------------------------------------------------------------------------------

def _make_sinkhorn_macro(T, hc, iters, eps):
    """In-place Sinkhorn on one thread's local [hc*hc] array (row-major c[i*hc + j]).

    softmax over each row + eps; column-normalise; then (iters-1) x {row-, column-normalise}, each
    dividing by (sum + eps). Loops over the tiny hc are unrolled so the matrix stays in registers and
    every normalisation is hc independent add chains (ILP instead of cross-thread shuffles)."""
    n = hc * hc

    @T.macro
    def row_norm(c, rs):
        for i in T.unroll(hc):
            rs[i] = c[i * hc]
            for j in T.unroll(1, hc):
                rs[i] = rs[i] + c[i * hc + j]
        for i in T.unroll(hc):
            # hc reciprocals + hc*hc multiplies; rcp.approx (~1 ulp): the IEEE divide path makes the
            # serial 20-iteration chain several times slower
            rs[i] = T.fast_rcp(rs[i] + eps)
        for e in T.unroll(n):
            c[e] = c[e] * rs[e // hc]

    @T.macro
    def col_norm(c, rs):
        for j in T.unroll(hc):
            rs[j] = c[j]
            for i in T.unroll(1, hc):
                rs[j] = rs[j] + c[i * hc + j]
        for j in T.unroll(hc):
            rs[j] = T.fast_rcp(rs[j] + eps)
        for e in T.unroll(n):
            c[e] = c[e] * rs[e % hc]

    @T.macro
    def sinkhorn(c, rs):
        for i in T.unroll(hc):
            rs[i] = c[i * hc]
            for j in T.unroll(1, hc):
                rs[i] = T.max(rs[i], c[i * hc + j])
        for e in T.unroll(n):
            c[e] = T.exp(c[e] - rs[e // hc])
        for i in T.unroll(hc):
            rs[i] = c[i * hc]
            for j in T.unroll(1, hc):
                rs[i] = rs[i] + c[i * hc + j]
        for i in T.unroll(hc):
            rs[i] = T.fast_rcp(rs[i])
        for e in T.unroll(n):
            c[e] = c[e] * rs[e // hc] + eps
        col_norm(c, rs)
        for _ in T.unroll(iters - 1):
            row_norm(c, rs)
            col_norm(c, rs)

    return sinkhorn


def _sigmoid(T, v):
    return T.float32(1) / (T.float32(1) + T.exp(-v))


# ---------------------------------------------------------------------------------------------
# 2. big fuse: reduce splits, RMS scale, sigmoids, Sinkhorn, pre-apply (+ RMSNorm)
# ---------------------------------------------------------------------------------------------

_FUSE_STATIC = {"hidden": int, "hc": int, "iters": int, "rms_eps": float, "hc_eps": float, "post_mult": float,
                "with_norm": bool, "norm_eps": float, "broadcast": bool}


@register
class MhcPreFuseSpec(KernelSpec):
    name = "mhc_pre_fuse"
    # norm_weight is present only in with_norm variants.
    arg_names = ("mix_part", "sq_part", "residual", "hc_scale", "hc_base", "norm_weight",
                 "layer_input", "post", "comb")

    def args_for(self, variant: Variant) -> tuple[str, ...]:
        return self.arg_names if variant.p["with_norm"] else tuple(a for a in self.arg_names if a != "norm_weight")

    def statics_for(self, model, *, with_norm: bool = False, broadcast: bool = False) -> dict[str, Any]:
        return {"hidden": int(model.hidden_size), "hc": int(model.hc_mult), "iters": int(model.hc_sinkhorn_iters),
                "rms_eps": float(model.rms_norm_eps), "hc_eps": float(model.hc_eps),
                "post_mult": float(model.hc_post_mult), "with_norm": bool(with_norm),
                # the following RMSNorm (attn_norm / ffn_norm) uses the model's rms_norm_eps
                "norm_eps": float(model.rms_norm_eps), "broadcast": bool(broadcast)}

    def static_params(self, model, parallel) -> dict[str, Any]:
        return self.statics_for(model)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        arch = check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        st = _check_static(self.name, static, _FUSE_STATIC)
        _check_hc_hidden(self.name, st["hc"], st["hidden"])
        # One CTA per token; n_splits and num_tokens are dynamic, so a single variant per static set.
        params = dict(st, mix=mix_width(st["hc"]), mix_pad=mix_pad(st["hc"]),
                      apply_threads=_FUSE_APPLY_THREADS, vec=_VEC, pdl=True)
        return Variant.make(self.name, params, arch)

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        lanes = (32 + p["apply_threads"]) // 32
        # split-reduction scratch [lanes, 32] + reduced mixes [32] + per-warp norm partials + weights
        return 4 * (lanes * 32 + 32 + p["apply_threads"] // 32 + p["mix"] + 3)

    def build(self, variant: Variant):
        return _build_fuse(**variant.p)


def _build_fuse(*, hidden, hc, iters, rms_eps, hc_eps, post_mult, with_norm, norm_eps, broadcast, mix, mix_pad,
                apply_threads, vec, pdl=False):
    import tilelang.language as T

    H, M, MP, NA, V = hidden, mix, mix_pad, apply_threads, vec
    K = hc * H
    THREADS = 32 + NA       # warp 0: Sinkhorn / post / comb; warps 1..: pre-apply
    NL = THREADS // 32      # split-reduction lanes
    U = 8                   # independent partial loads in flight per thread (S=64: 2 round trips)
    CHUNK = NA * V
    n_it = -(-H // CHUNK)
    exact = H % CHUNK == 0
    NW = NA // 32
    num_tokens = T.dynamic("num_tokens")
    n_splits = T.dynamic("n_splits")
    res_shape = (num_tokens, H) if broadcast else (num_tokens, hc, H)
    sinkhorn = _make_sinkhorn_macro(T, hc, iters, hc_eps)

    @T.macro
    def body(mix_part, sq_part, residual, hc_scale, hc_base, norm_weight, layer_input, post, comb):
        with T.Kernel(num_tokens, threads=THREADS) as t:
            tx = T.get_thread_binding()
            red = T.alloc_shared((NL, 32), T.float32)
            mixs = T.alloc_shared((32,), T.float32)
            wsum = T.alloc_shared((NW,), T.float32)
            part = T.alloc_local((U,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            y = T.alloc_local((n_it * V,), T.float32)
            xv = T.alloc_local((V,), T.bfloat16)
            ov = T.alloc_local((V,), T.bfloat16)
            pre = T.alloc_local((hc,), T.float32)
            c = T.alloc_local((hc * hc,), T.float32)
            rs = T.alloc_local((hc,), T.float32)
            ss = T.alloc_local((1,), T.float32)
            wts = T.alloc_shared((M + 3,), T.float32)  # hc_base[0:M], then hc_scale[0:3]

            # The weights are not written by the kernels before this one: stage them now, so their
            # (cold) load overlaps the wait below and the split reduction instead of following it.
            if tx < M:
                wts[tx] = hc_base[tx]
            elif tx < M + 3:
                wts[tx] = hc_scale[tx - M]
            if pdl:
                # launched early (programmatic dependent launch): wait for the partials' producer
                # grid to finish before reading anything it or an earlier kernel wrote
                T.pdl_sync()

            # -- 1. sum the split partials: column `col` (< M: mixes, == M: square-sum), lane strides S
            lane = tx // 32
            col = tx % 32
            acc[0] = T.float32(0)
            for i in T.serial(T.ceildiv(n_splits, NL * U)):
                for u in T.unroll(U):
                    part[u] = T.float32(0)
                    if (i * U + u) * NL + lane < n_splits:
                        if col < M:
                            part[u] = mix_part[(i * U + u) * NL + lane, t, col]
                        elif col == M:
                            part[u] = sq_part[(i * U + u) * NL + lane, t]
                for u in T.unroll(U):
                    acc[0] = acc[0] + part[u]
            red[lane, col] = acc[0]
            T.sync_threads()
            if tx < 32:
                acc[0] = red[0, tx]
                for l in T.unroll(1, NL):
                    acc[0] = acc[0] + red[l, tx]
                mixs[tx] = acc[0]
            T.sync_threads()

            rr = T.rsqrt(mixs[M] / T.float32(K) + T.float32(rms_eps))

            # -- 2a. pre-apply (warps 1..): y = sum_i pre_i * X_i over this thread's 16-byte columns
            if tx >= 32:
                for i in T.unroll(hc):
                    pre[i] = _sigmoid(T, mixs[i] * rr * wts[M] + wts[i]) + T.float32(hc_eps)
                if broadcast:
                    for i in T.unroll(1, hc):
                        pre[0] = pre[0] + pre[i]
                # Zero every slot, not only the in-range ones: the square-sum below reads all n_it*V
                # slots, and when H is not a multiple of CHUNK (V4-Pro: 7168 = 3.5 x 2048) a thread's
                # last slots are never written otherwise.
                for e in T.unroll(n_it * V):
                    y[e] = T.float32(0)
                for it in T.unroll(n_it):
                    if exact or it * CHUNK + (tx - 32) * V < H:
                        if broadcast:
                            for v in T.vectorized(V):
                                xv[v] = residual[t, it * CHUNK + (tx - 32) * V + v]
                            for v in T.unroll(V):
                                y[it * V + v] = pre[0] * T.Cast(T.float32, xv[v])
                        else:
                            for i in T.unroll(hc):
                                for v in T.vectorized(V):
                                    xv[v] = residual[t, i, it * CHUNK + (tx - 32) * V + v]
                                for v in T.unroll(V):
                                    y[it * V + v] = y[it * V + v] + pre[i] * T.Cast(T.float32, xv[v])
                        if not with_norm:
                            for v in T.unroll(V):
                                ov[v] = T.Cast(T.bfloat16, y[it * V + v])
                            for v in T.vectorized(V):
                                layer_input[t, it * CHUNK + (tx - 32) * V + v] = ov[v]
                if with_norm:
                    # fp32 square-sum of the fp32 stream sum: warp shuffle, then one value per warp
                    ss[0] = T.float32(0)
                    for e in T.unroll(n_it * V):
                        ss[0] = ss[0] + y[e] * y[e]
                    for o in T.unroll(5):
                        ss[0] = ss[0] + T.shfl_xor(ss[0], 16 >> o)
                    if tx % 32 == 0:
                        wsum[tx // 32 - 1] = ss[0]
            if with_norm:
                # every thread reaches this barrier (no barrier inside a divergent branch)
                T.sync_threads()

            # -- 2b. warp 0: post + comb (Sinkhorn in thread 0's registers)
            if tx < 32:
                if tx == 0:
                    for e in T.unroll(hc * hc):
                        c[e] = mixs[2 * hc + e] * rr * wts[M + 2] + wts[2 * hc + e]
                    sinkhorn(c, rs)
                    for e in T.unroll(hc * hc):
                        comb[t, e // hc, e % hc] = c[e]
                elif tx <= hc:
                    post[t, tx - 1] = T.float32(post_mult) * _sigmoid(
                        T, mixs[hc + tx - 1] * rr * wts[M + 1] + wts[hc + tx - 1])
            elif with_norm:
                ss[0] = wsum[0]
                for w in T.unroll(1, NW):
                    ss[0] = ss[0] + wsum[w]
                ss[0] = T.rsqrt(ss[0] / T.float32(H) + T.float32(norm_eps))
                for it in T.unroll(n_it):
                    if exact or it * CHUNK + (tx - 32) * V < H:
                        for v in T.vectorized(V):
                            xv[v] = norm_weight[it * CHUNK + (tx - 32) * V + v]
                        for v in T.unroll(V):
                            ov[v] = T.Cast(T.bfloat16, y[it * V + v] * ss[0] * T.Cast(T.float32, xv[v]))
                        for v in T.vectorized(V):
                            layer_input[t, it * CHUNK + (tx - 32) * V + v] = ov[v]

    if with_norm:
        @T.prim_func
        def mhc_pre_fuse(
            mix_part: T.Tensor((n_splits, num_tokens, MP), T.float32),
            sq_part: T.Tensor((n_splits, num_tokens), T.float32),
            residual: T.Tensor(res_shape, T.bfloat16),
            hc_scale: T.Tensor((3,), T.float32),
            hc_base: T.Tensor((M,), T.float32),
            norm_weight: T.Tensor((H,), T.bfloat16),
            layer_input: T.Tensor((num_tokens, H), T.bfloat16),
            post: T.Tensor((num_tokens, hc), T.float32),
            comb: T.Tensor((num_tokens, hc, hc), T.float32),
        ):
            body(mix_part, sq_part, residual, hc_scale, hc_base, norm_weight, layer_input, post, comb)
    else:
        @T.prim_func
        def mhc_pre_fuse(
            mix_part: T.Tensor((n_splits, num_tokens, MP), T.float32),
            sq_part: T.Tensor((n_splits, num_tokens), T.float32),
            residual: T.Tensor(res_shape, T.bfloat16),
            hc_scale: T.Tensor((3,), T.float32),
            hc_base: T.Tensor((M,), T.float32),
            layer_input: T.Tensor((num_tokens, H), T.bfloat16),
            post: T.Tensor((num_tokens, hc), T.float32),
            comb: T.Tensor((num_tokens, hc, hc), T.float32),
        ):
            # norm_weight slot is never read when with_norm is off; pass any buffer
            body(mix_part, sq_part, residual, hc_scale, hc_base, hc_base, layer_input, post, comb)

    return mhc_pre_fuse


# ---------------------------------------------------------------------------------------------
# 3. standalone Sinkhorn split: mixes [T, M] (RMS-scaled) -> pre, post, comb
# ---------------------------------------------------------------------------------------------

_SINKHORN_STATIC = {"hc": int, "iters": int, "hc_eps": float, "post_mult": float}


@register
class MhcSinkhornSpec(KernelSpec):
    name = "mhc_sinkhorn"
    arg_names = ("mixes", "hc_scale", "hc_base", "pre", "post", "comb")

    def statics_for(self, model) -> dict[str, Any]:
        return {"hc": int(model.hc_mult), "iters": int(model.hc_sinkhorn_iters), "hc_eps": float(model.hc_eps),
                "post_mult": float(model.hc_post_mult)}

    def static_params(self, model, parallel) -> dict[str, Any]:
        return self.statics_for(model)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        arch = check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        st = _check_static(self.name, static, _SINKHORN_STATIC)
        if not 1 <= st["hc"] <= 8:
            raise ValueError(f"{self.name}: hc_mult={st['hc']} unsupported (1..8)")
        params = dict(st, mix=mix_width(st["hc"]), threads=_SINKHORN_TOKENS_PER_CTA)
        return Variant.make(self.name, params, arch)

    def smem_bytes(self, variant: Variant) -> int:
        return 0  # registers only

    def build(self, variant: Variant):
        return _build_sinkhorn(**variant.p)


def _build_sinkhorn(*, hc, iters, hc_eps, post_mult, mix, threads):
    import tilelang.language as T

    M = mix
    num_tokens = T.dynamic("num_tokens")
    sinkhorn = _make_sinkhorn_macro(T, hc, iters, hc_eps)

    @T.prim_func
    def mhc_sinkhorn(
        mixes: T.Tensor((num_tokens, M), T.float32),
        hc_scale: T.Tensor((3,), T.float32),
        hc_base: T.Tensor((M,), T.float32),
        pre: T.Tensor((num_tokens, hc), T.float32),
        post: T.Tensor((num_tokens, hc), T.float32),
        comb: T.Tensor((num_tokens, hc, hc), T.float32),
    ):
        # one thread per token: the hc x hc matrix lives in that thread's registers
        with T.Kernel(T.ceildiv(num_tokens, threads), threads=threads) as b:
            tx = T.get_thread_binding()
            c = T.alloc_local((hc * hc,), T.float32)
            rs = T.alloc_local((hc,), T.float32)
            t = b * threads + tx
            if t < num_tokens:
                for i in T.unroll(hc):
                    pre[t, i] = _sigmoid(T, mixes[t, i] * hc_scale[0] + hc_base[i]) + T.float32(hc_eps)
                    post[t, i] = T.float32(post_mult) * _sigmoid(T, mixes[t, hc + i] * hc_scale[1] + hc_base[hc + i])
                for e in T.unroll(hc * hc):
                    c[e] = mixes[t, 2 * hc + e] * hc_scale[2] + hc_base[2 * hc + e]
                sinkhorn(c, rs)
                for e in T.unroll(hc * hc):
                    comb[t, e // hc, e % hc] = c[e]

    return mhc_sinkhorn
