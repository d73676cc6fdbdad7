"""vLLM 0.33's mHC call conventions -> dsv4-jit ops.

Each `route_*` function takes exactly the parameters of the vLLM 0.33.0 function it replaces
(`vllm/model_executor/kernels/mhc/tilelang.py`: `mhc_pre_tilelang`, `mhc_pre_broadcast_tilelang`,
`mhc_post_tilelang`, `mhc_fused_post_pre_tilelang`, `hc_head_fused_kernel_tilelang`) and returns what it
returns, in its shapes: post mixes as [..., hc, 1], comb as [..., hc, hc], leading dims kept.

Conversions are views only (flatten the leading dims, drop/add the trailing 1 of the post mix). Where a
call cannot be served by views alone, or differs from what dsv4-jit's kernels compute (hc_pre_eps !=
hc_sinkhorn_eps: our kernels take one hc_eps; a non-bf16 or non-contiguous norm weight, which vLLM
converts by copying), the call goes to vLLM's own function and `FALLBACKS` counts it (one warning per
reason). One copy is not a view and is kept on purpose: the first layer's broadcast returns the
residual replicated into hc streams, which vLLM's own kernel writes too (`residual_out`).

The `*_args` / `*_result` helpers hold the whole conversion; they run on CPU tensors (tests).
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

log = logging.getLogger("dsv4_jit.vllm")

class Fallbacks:
    """Calls an adapter cannot serve exactly: counted per reason, warned once per reason, and served by the
    engine's own function (`originals`, filled by the engine hook when it rebinds a name)."""

    def __init__(self, engine: str, logger: logging.Logger):
        self.engine, self.log = engine, logger
        self.counts: Counter = Counter()         # "name: reason" -> calls served by the engine's own function
        self.originals: dict[str, Callable] = {}  # engine function name -> its original
        self.warned: set[str] = set()

    def __call__(self, name: str, reason: str, *args, **kwargs):
        self.counts[f"{name}: {reason}"] += 1
        if reason not in self.warned:
            self.warned.add(reason)
            self.log.warning("dsv4-jit: %s served by %s's own kernel (%s)", name, self.engine, reason)
        orig = self.originals.get(name)
        if orig is None:
            raise RuntimeError(f"dsv4-jit: {name}: {reason}, and {self.engine}'s original function is not known")
        return orig(*args, **kwargs)


_fallback = Fallbacks("vLLM", log)
FALLBACKS: Counter = _fallback.counts   # reason -> calls served by vLLM's own function
ROUTED: Counter = Counter()             # vLLM function name -> calls served by dsv4-jit
_ORIGINALS: dict[str, Callable] = _fallback.originals   # vLLM function name -> its original (set by the plugin)


class Unsupported(Exception):
    """This call cannot be routed with views alone; the engine's own function serves it."""


def _hc_eps(hc_pre_eps: float, hc_sinkhorn_eps: float) -> float:
    if float(hc_pre_eps) != float(hc_sinkhorn_eps):
        raise Unsupported(f"hc_pre_eps={hc_pre_eps} != hc_sinkhorn_eps={hc_sinkhorn_eps}")
    return float(hc_pre_eps)


def _norm_weight(norm_weight):
    if norm_weight is None:
        return None
    import torch
    if norm_weight.dtype != torch.bfloat16 or not norm_weight.is_contiguous():
        raise Unsupported("norm_weight is not a contiguous bf16 tensor")
    return norm_weight


def _contig(t, name: str):
    if not t.is_contiguous():
        raise Unsupported(f"{name} is not contiguous")
    return t


def _common_kw(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps):
    nw = _norm_weight(norm_weight)
    return {"rms_eps": float(rms_eps), "hc_eps": _hc_eps(hc_pre_eps, hc_sinkhorn_eps),
            "sinkhorn_iters": int(sinkhorn_repeat), "post_mult": float(hc_post_mult_value),
            "norm_weight": nw, "norm_eps": None if nw is None else float(norm_eps)}


# ---- mhc_pre ------------------------------------------------------------------------------------------

def pre_args(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
             sinkhorn_repeat, n_splits=1, norm_weight=None, norm_eps=1e-6):
    """vLLM's mhc_pre_tilelang arguments -> (dsv4_jit.mhc_pre positional args, kwargs, outer shape).
    `n_splits` is ignored, as vLLM ignores it ("the active GEMM backend selects its split factor")."""
    hc, hidden = residual.shape[-2], residual.shape[-1]
    outer = tuple(residual.shape[:-2])
    flat = _contig(residual, "residual").view(-1, hc, hidden)
    kw = _common_kw(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps)
    return (flat, fn, hc_scale, hc_base), kw, outer


def pre_result(outer, layer_input, post, comb):
    """dsv4_jit.mhc_pre's (layer_input [T,H], post [T,hc], comb [T,hc,hc]) -> vLLM's
    (post_mix [..., hc, 1], comb_mix [..., hc, hc], layer_input [..., H]); views only."""
    hc, hidden = post.shape[-1], layer_input.shape[-1]
    return post.view(*outer, hc, 1), comb.view(*outer, hc, hc), layer_input.view(*outer, hidden)


def route_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                  sinkhorn_repeat, n_splits=1, norm_weight=None, norm_eps=1e-6):
    """Replaces vLLM's `mhc_pre_tilelang` (same parameters, same results)."""
    import dsv4_jit
    try:
        args, kw, outer = pre_args(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                   hc_post_mult_value, sinkhorn_repeat, n_splits, norm_weight, norm_eps)
    except Unsupported as e:
        return _fallback("mhc_pre_tilelang", str(e), residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                         hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits, norm_weight, norm_eps)
    ROUTED["mhc_pre_tilelang"] += 1
    return pre_result(outer, *dsv4_jit.mhc_pre(*args, **kw))


# ---- first layer: broadcast ---------------------------------------------------------------------------

def pre_broadcast_args(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                       sinkhorn_repeat, n_splits=1, norm_weight=None, norm_eps=1e-6, fn_broadcast=None):
    """vLLM's mhc_pre_broadcast_tilelang arguments -> (dsv4_jit.mhc_pre args, kwargs, hc).

    dsv4-jit's broadcast mode reads the [T, H] residual as hc equal streams against the full fn
    [M, hc*H]; vLLM's fn_broadcast (fn summed over the streams) is not needed."""
    if residual.dim() != 2:
        raise Unsupported(f"broadcast residual has {residual.dim()} dims, expected [T, H]")
    if norm_weight is None:
        raise Unsupported("broadcast without norm_weight (vLLM asserts it)")
    hidden = residual.shape[-1]
    hc = fn.shape[1] // hidden
    kw = _common_kw(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps)
    return (_contig(residual, "residual"), fn, hc_scale, hc_base), kw, hc


def pre_broadcast_result(residual, hc, layer_input, post, comb):
    """-> vLLM's (residual_out [T, hc, H], post_mix [T, hc, 1], comb_mix [T, hc, hc], layer_input [T, H]).
    residual_out is the one materialised tensor (vLLM's kernel writes it as well)."""
    t, hidden = residual.shape
    residual_out = residual.unsqueeze(1).expand(t, hc, hidden).contiguous()
    return residual_out, post.view(t, hc, 1), comb.view(t, hc, hc), layer_input


def route_mhc_pre_broadcast(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                            hc_post_mult_value, sinkhorn_repeat, n_splits=1, norm_weight=None, norm_eps=1e-6,
                            fn_broadcast=None):
    """Replaces vLLM's `mhc_pre_broadcast_tilelang` (same parameters, same results)."""
    import dsv4_jit
    try:
        args, kw, hc = pre_broadcast_args(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                          hc_post_mult_value, sinkhorn_repeat, n_splits, norm_weight, norm_eps,
                                          fn_broadcast)
    except Unsupported as e:
        return _fallback("mhc_pre_broadcast_tilelang", str(e), residual, fn, hc_scale, hc_base, rms_eps,
                         hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits,
                         norm_weight, norm_eps, fn_broadcast)
    ROUTED["mhc_pre_broadcast_tilelang"] += 1
    return pre_broadcast_result(residual, hc, *dsv4_jit.mhc_pre(*args, **kw))


# ---- mhc_post -----------------------------------------------------------------------------------------

def post_args(x, residual, post_layer_mix, comb_res_mix):
    """vLLM's mhc_post_tilelang arguments -> (dsv4_jit.mhc_post args, residual shape).
    x [..., H], residual [..., hc, H], post_layer_mix [..., hc, 1] or [..., hc], comb [..., hc, hc]."""
    hc, hidden = residual.shape[-2], residual.shape[-1]
    r = _contig(residual, "residual").view(-1, hc, hidden)
    t = r.shape[0]
    return (_contig(x, "x").view(t, hidden), r, _contig(post_layer_mix, "post_layer_mix").view(t, hc),
            _contig(comb_res_mix, "comb_res_mix").view(t, hc, hc)), tuple(residual.shape)


def route_mhc_post(x, residual, post_layer_mix, comb_res_mix):
    """Replaces vLLM's `mhc_post_tilelang`: returns a tensor shaped like `residual`."""
    import dsv4_jit
    try:
        args, shape = post_args(x, residual, post_layer_mix, comb_res_mix)
    except Unsupported as e:
        return _fallback("mhc_post_tilelang", str(e), x, residual, post_layer_mix, comb_res_mix)
    ROUTED["mhc_post_tilelang"] += 1
    return dsv4_jit.mhc_post(*args).view(shape)


# ---- fused post + next pre ----------------------------------------------------------------------------

def fused_args(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
               hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1, tile_n=1, norm_weight=None,
               norm_eps=1e-6):
    """vLLM's mhc_fused_post_pre_tilelang arguments -> (post args, pre kwargs, residual shape).
    `n_splits` / `tile_n` are ignored, as vLLM ignores them (selected from the runtime shape)."""
    pargs, shape = post_args(x, residual, post_layer_mix, comb_res_mix)
    kw = _common_kw(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps)
    return pargs, kw, shape


def fuse_static(kw: dict, hidden: int, hc: int) -> dict:
    """The mhc_pre_fuse static set dsv4_jit's mhc_pre builds for these kwargs (kernels/mhc/ops.py
    `_load_plan`): the fused path must select exactly the variant the planner warmed."""
    nw = kw["norm_weight"]
    return {"hidden": hidden, "hc": hc, "iters": int(kw["sinkhorn_iters"]), "rms_eps": float(kw["rms_eps"]),
            "hc_eps": float(kw["hc_eps"]), "post_mult": float(kw["post_mult"]), "with_norm": nw is not None,
            "norm_eps": float(kw["rms_eps"] if kw["norm_eps"] is None else kw["norm_eps"]), "broadcast": False}


def _fuse_from_partials(mix_part, sq_part, residual_cur, fn, hc_scale, hc_base, kw):
    """The big fuse of mhc_pre on partials written by mhc_post_pre_fused (same [S, T, MP] layout)."""
    import torch
    import dsv4_jit
    from dsv4_jit.spec import get_spec
    from dsv4_jit.validate import require
    t, hc, hidden = residual_cur.shape
    dev = residual_cur.device
    f32 = torch.float32
    require(hc_scale, "hc_scale", (3,), f32, dev)
    require(hc_base, "hc_base", (fn.shape[0],), f32, dev)
    get_kernel = dsv4_jit._arch_kw(None)["get_kernel"]
    fuse = get_kernel(get_spec("mhc_pre_fuse"), fuse_static(kw, hidden, hc), t)
    layer_input = torch.empty((t, hidden), dtype=torch.bfloat16, device=dev)
    post = torch.empty((t, hc), dtype=f32, device=dev)
    comb = torch.empty((t, hc, hc), dtype=f32, device=dev)
    if kw["norm_weight"] is not None:
        require(kw["norm_weight"], "norm_weight", (hidden,), torch.bfloat16, dev)
        fuse(mix_part, sq_part, residual_cur, hc_scale, hc_base, kw["norm_weight"], layer_input, post, comb)
    else:
        fuse(mix_part, sq_part, residual_cur, hc_scale, hc_base, layer_input, post, comb)
    return layer_input, post, comb


def fused_result(shape, residual_cur, layer_input, post, comb):
    """-> vLLM's (residual_cur [..., hc, H], post_mix [..., hc, 1], comb [..., hc, hc], layer_input [..., H])."""
    outer, hc, hidden = shape[:-2], shape[-2], shape[-1]
    return (residual_cur.view(shape), post.view(*outer, hc, 1), comb.view(*outer, hc, hc),
            layer_input.view(*outer, hidden))


def route_mhc_fused_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                             hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1,
                             tile_n=1, norm_weight=None, norm_eps=1e-6):
    """Replaces vLLM's `mhc_fused_post_pre_tilelang` (`fused_post_pre`)."""
    try:
        pargs, kw, shape = fused_args(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                                      hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits,
                                      tile_n, norm_weight, norm_eps)
    except Unsupported as e:
        return _fallback("mhc_fused_post_pre_tilelang", str(e), x, residual, post_layer_mix, comb_res_mix, fn,
                         hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                         sinkhorn_repeat, n_splits, tile_n, norm_weight, norm_eps)
    ROUTED["mhc_fused_post_pre_tilelang"] += 1
    return fused_post_pre(pargs, kw, shape, fn, hc_scale, hc_base)


def fused_post_pre(pargs, kw, shape, fn, hc_scale, hc_base):
    """`fused_args`' conversion -> (residual_cur, post_mix, comb, layer_input) in the engine's shapes. Up to
    FUSED_POST_PRE_MAX_TOKENS tokens: post fused with the next prenorm GEMM, then the big fuse on its partials;
    above: mhc_post, then mhc_pre."""
    import dsv4_jit
    from dsv4_jit.kernels.mhc.post import use_fused_post_pre
    t = pargs[1].shape[0]
    if use_fused_post_pre(t):
        residual_cur, mix_part, sq_part = dsv4_jit.mhc_post_pre_fused(*pargs, fn)
        outs = _fuse_from_partials(mix_part, sq_part, residual_cur, fn, hc_scale, hc_base, kw)
    else:
        residual_cur = dsv4_jit.mhc_post(*pargs)
        outs = dsv4_jit.mhc_pre(residual_cur, fn, hc_scale, hc_base, **kw)
    return fused_result(shape, residual_cur, *outs)


# ---- hc_head ------------------------------------------------------------------------------------------

def head_args(hs_flat, fn, hc_scale, hc_base, rms_eps, hc_eps):
    """vLLM's hc_head_fused_kernel_tilelang arguments (hs_flat [T, hc, H]) -> dsv4_jit.hc_head args."""
    if hs_flat.dim() != 3:
        raise Unsupported(f"hs_flat has {hs_flat.dim()} dims, expected [T, hc, H]")
    return (_contig(hs_flat, "hs_flat"), fn, hc_scale, hc_base), {"rms_eps": float(rms_eps), "hc_eps": float(hc_eps)}


def route_hc_head(hs_flat, fn, hc_scale, hc_base, rms_eps, hc_eps):
    """Replaces vLLM's `hc_head_fused_kernel_tilelang`: [T, hc, H] bf16 -> [T, H] bf16."""
    import dsv4_jit
    try:
        args, kw = head_args(hs_flat, fn, hc_scale, hc_base, rms_eps, hc_eps)
    except Unsupported as e:
        return _fallback("hc_head_fused_kernel_tilelang", str(e), hs_flat, fn, hc_scale, hc_base, rms_eps, hc_eps)
    ROUTED["hc_head_fused_kernel_tilelang"] += 1
    return dsv4_jit.hc_head(*args, **kw)


# vLLM 0.33.0 function name -> our replacement (same parameters).
ROUTES: dict[str, Callable[..., Any]] = {
    "mhc_pre_tilelang": route_mhc_pre,
    "mhc_pre_broadcast_tilelang": route_mhc_pre_broadcast,
    "mhc_post_tilelang": route_mhc_post,
    "mhc_fused_post_pre_tilelang": route_mhc_fused_post_pre,
    "hc_head_fused_kernel_tilelang": route_hc_head,
}
