"""mHC host ops: what the engine calls. Validate every argument (ValueError naming it), keep one
launch plan per call signature, allocate only what the caller did not pass (`out=`, `workspace=` for
CUDA-graph capture), then launch the kernels that `select` picked.

Kept apart from the kernel modules (pre.py, post.py, head.py) on purpose: the artifact key hashes the
kernel-defining source only, so editing validation or docs here never re-keys a compiled artifact.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from dsv4_jit.arch import ArchProfile, check_arch, get_profile
from dsv4_jit.spec import get_spec

from .post import fused_num_splits
from .pre import MhcPreFuseSpec, MhcPreNormFnSpec, MhcSinkhornSpec, mix_pad, mix_width


# =============================================================================================
# mhc_pre / mhc_sinkhorn
# =============================================================================================
def _hc_from_mix(m: int) -> int:
    hc = 1
    while (2 + hc) * hc < m:
        hc += 1
    if (2 + hc) * hc != m:
        raise ValueError(f"fn has {m} rows; expected (2+hc)*hc for some hc")
    return hc


def mhc_pre_workspace_numel(num_tokens: int, n_splits: int, hc: int) -> int:
    """fp32 elements of the norm_fn -> fuse workspace (mix_part then sq_part)."""
    return n_splits * num_tokens * (mix_pad(hc) + 1)


def mhc_pre_workspace_max_numel(arch: ArchProfile, hidden: int, hc: int, max_tokens: int) -> int:
    """Largest workspace any T <= max_tokens needs (preallocate once for CUDA-graph capture)."""
    spec = MhcPreNormFnSpec()
    best = 0
    for t in range(1, max_tokens + 1):
        s = spec.select(arch, {"hidden": hidden, "hc": hc, "broadcast": False}, t).p["n_splits"]
        best = max(best, mhc_pre_workspace_numel(t, s, hc))
    return best


class _PrePlan(NamedTuple):
    """Everything mhc_pre derives from a call signature: shapes to check, kernels to launch."""
    res_shape: tuple
    fn_shape: tuple
    hidden: int
    hc: int
    splits: int
    norm_fn: Any
    fuse: Any


# Hot path: one dict lookup per call instead of re-deriving shapes, statics and variants (the eager
# op at T=1 is bound by host time).
_PRE_PLANS: dict[tuple, _PrePlan] = {}


def _pre_shapes(residual, fn) -> _PrePlan:
    """Slow path, once per signature: full validation of residual and fn; a plan without kernels."""
    import torch
    from dsv4_jit.validate import check_tensor

    if not isinstance(residual, torch.Tensor) or residual.dim() not in (2, 3):
        raise ValueError("residual: expected a [T, hc, H] or [T, H] bf16 tensor")
    broadcast = residual.dim() == 2
    dev = residual.device
    if dev.type != "cuda":
        raise ValueError(f"residual: must be a CUDA tensor, got device {dev}")
    check_tensor(fn, "fn", [None, None], torch.float32, dev)
    hc = _hc_from_mix(fn.shape[0])
    hidden = residual.shape[-1]
    tokens = residual.shape[0]
    res_shape = (tokens, hidden) if broadcast else (tokens, hc, hidden)
    check_tensor(residual, "residual", list(res_shape), torch.bfloat16, dev)
    check_tensor(fn, "fn", [mix_width(hc), hc * hidden], torch.float32, dev)
    return _PrePlan(res_shape, (mix_width(hc), hc * hidden), hidden, hc, 0, None, None)


def _load_plan(key, plan: _PrePlan, with_norm, rms_eps, hc_eps, sinkhorn_iters, post_mult, norm_eps,
               get_kernel) -> _PrePlan:
    """select + load both kernels (after every argument was validated) and remember the plan."""
    hidden, hc, tokens = plan.hidden, plan.hc, plan.res_shape[0]
    broadcast = len(plan.res_shape) == 2
    nf_static = {"hidden": hidden, "hc": hc, "broadcast": broadcast}
    fuse_static = {"hidden": hidden, "hc": hc, "iters": int(sinkhorn_iters), "rms_eps": float(rms_eps),
                   "hc_eps": float(hc_eps), "post_mult": float(post_mult), "with_norm": with_norm,
                   "norm_eps": float(rms_eps if norm_eps is None else norm_eps), "broadcast": broadcast}
    # The split count is the one the selected (and loaded) variant was compiled with: one runtime path.
    norm_fn = get_kernel(get_spec(MhcPreNormFnSpec.name), nf_static, tokens)
    fuse = get_kernel(get_spec(MhcPreFuseSpec.name), fuse_static, tokens)
    plan = _PRE_PLANS[key] = plan._replace(splits=norm_fn.variant.p["n_splits"], norm_fn=norm_fn, fuse=fuse)
    return plan


def mhc_pre(residual, fn, hc_scale, hc_base, *, norm_weight=None, rms_eps, hc_eps, sinkhorn_iters, post_mult,
            arch, get_kernel, norm_eps=None, out=None, workspace=None):
    """DeepSeek V4 hc_pre. residual [T, hc, H] bf16 (or [T, H] for the first layer's broadcast).

    Returns (layer_input [T,H] bf16, post [T,hc] fp32, comb [T,hc,hc] fp32). `out` may give those three
    tensors; `workspace` may give a flat fp32 CUDA tensor of >= mhc_pre_workspace_numel() elements,
    so that nothing is allocated (CUDA-graph capture). norm_weight [H] bf16 fuses the RMSNorm."""
    import torch
    from dsv4_jit.validate import require, require_1d

    arch = check_arch("mhc_pre", arch)
    with_norm = norm_weight is not None
    try:
        # get_kernel is part of the key: a plan holds the kernels that getter returned
        key = (get_kernel, arch.name, arch.schedule, residual.shape, fn.shape, with_norm, rms_eps, hc_eps,
               sinkhorn_iters, post_mult, norm_eps)
    except AttributeError:
        raise ValueError("residual and fn: expected torch tensors") from None
    plan = _PRE_PLANS.get(key)
    if plan is None:
        plan = _pre_shapes(residual, fn)
    dev = residual.device
    if dev.type != "cuda":
        raise ValueError(f"residual: must be a CUDA tensor, got device {dev}")
    hc, hidden = plan.hc, plan.hidden
    tokens = plan.res_shape[0]
    f32 = torch.float32
    require(residual, "residual", plan.res_shape, torch.bfloat16, dev)
    require(fn, "fn", plan.fn_shape, f32, dev)
    require(hc_scale, "hc_scale", (3,), f32, dev)
    require(hc_base, "hc_base", (plan.fn_shape[0],), f32, dev)
    if with_norm:
        require(norm_weight, "norm_weight", (hidden,), torch.bfloat16, dev)
    if out is None:
        # freshly allocated: nothing to check
        layer_input = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=dev)
        post = torch.empty((tokens, hc), dtype=f32, device=dev)
        comb = torch.empty((tokens, hc, hc), dtype=f32, device=dev)
    else:
        layer_input, post, comb = out
        require(layer_input, "out[0] (layer_input)", (tokens, hidden), torch.bfloat16, dev)
        require(post, "out[1] (post)", (tokens, hc), f32, dev)
        require(comb, "out[2] (comb)", (tokens, hc, hc), f32, dev)
    if workspace is not None:
        require_1d(workspace, "workspace", f32, dev)
    if tokens == 0:
        return layer_input, post, comb
    if plan.norm_fn is None:
        # everything is validated before anything is selected, loaded or compiled
        plan = _load_plan(key, plan, with_norm, rms_eps, hc_eps, sinkhorn_iters, post_mult, norm_eps, get_kernel)

    splits, mp = plan.splits, mix_pad(hc)
    if workspace is None:
        mix_part = torch.empty((splits, tokens, mp), dtype=f32, device=dev)
        sq_part = torch.empty((splits, tokens), dtype=f32, device=dev)
    else:
        need = mhc_pre_workspace_numel(tokens, splits, hc)
        if workspace.numel() < need:
            raise ValueError(f"workspace: needs {need} fp32 elements for {tokens} tokens, got {workspace.numel()}")
        mix_part = workspace[: splits * tokens * mp].view(splits, tokens, mp)
        sq_part = workspace[splits * tokens * mp: need].view(splits, tokens)

    plan.norm_fn(residual if len(plan.res_shape) == 2 else residual.view(tokens, hc * hidden), fn, mix_part, sq_part)
    if with_norm:
        plan.fuse(mix_part, sq_part, residual, hc_scale, hc_base, norm_weight, layer_input, post, comb)
    else:
        plan.fuse(mix_part, sq_part, residual, hc_scale, hc_base, layer_input, post, comb)
    return layer_input, post, comb


def mhc_sinkhorn(mixes, hc_scale, hc_base, *, hc_eps, sinkhorn_iters, post_mult, arch, get_kernel, out=None):
    """Standalone split of RMS-scaled mixes [T, (2+hc)*hc] fp32 -> (pre, post [T,hc], comb [T,hc,hc])."""
    import torch
    from dsv4_jit.validate import check_tensor

    arch = check_arch("mhc_sinkhorn", arch)
    if not isinstance(mixes, torch.Tensor) or mixes.dim() != 2:
        raise ValueError("mixes: expected a [T, (2+hc)*hc] fp32 tensor")
    dev = mixes.device
    hc = _hc_from_mix(mixes.shape[1])
    tokens = mixes.shape[0]
    check_tensor(mixes, "mixes", [None, mix_width(hc)], torch.float32, dev)
    check_tensor(hc_scale, "hc_scale", [3], torch.float32, dev)
    check_tensor(hc_base, "hc_base", [mix_width(hc)], torch.float32, dev)
    if out is None:
        out = (torch.empty(tokens, hc, dtype=torch.float32, device=dev),
               torch.empty(tokens, hc, dtype=torch.float32, device=dev),
               torch.empty(tokens, hc, hc, dtype=torch.float32, device=dev))
    pre, post, comb = out
    check_tensor(pre, "out[0] (pre)", [tokens, hc], torch.float32, dev)
    check_tensor(post, "out[1] (post)", [tokens, hc], torch.float32, dev)
    check_tensor(comb, "out[2] (comb)", [tokens, hc, hc], torch.float32, dev)
    if tokens == 0:
        return pre, post, comb
    spec = MhcSinkhornSpec()
    static = {"hc": hc, "iters": int(sinkhorn_iters), "hc_eps": float(hc_eps), "post_mult": float(post_mult)}
    get_kernel(spec, static, tokens)(mixes, hc_scale, hc_base, pre, post, comb)
    return pre, post, comb

# =============================================================================================
# mhc_post / mhc_post_pre_fused
# =============================================================================================
def _torch():
    import torch
    return torch


def _check_post_inputs(x, residual, post, comb):
    torch = _torch()
    from dsv4_jit.validate import check_tensor
    check_tensor(x, "x", [None, None], torch.bfloat16)
    dev = x.device
    num_tokens, hidden = x.shape
    if residual is None or not hasattr(residual, "dim") or residual.dim() != 3:
        raise ValueError(f"residual: expected shape [{num_tokens}, hc, {hidden}], got "
                         f"{list(residual.shape) if hasattr(residual, 'shape') else type(residual).__name__}")
    hc = residual.shape[1]
    check_tensor(residual, "residual", [num_tokens, hc, hidden], torch.bfloat16, dev)
    check_tensor(post, "post", [num_tokens, hc], torch.float32, dev)
    check_tensor(comb, "comb", [num_tokens, hc, hc], torch.float32, dev)
    return num_tokens, hidden, hc


# Hot path: (getter, arch, x shape, residual shape) -> the loaded kernel, so a call is one dict lookup
# plus cheap layout checks.
_POST_PLANS: dict[tuple, Any] = {}


def mhc_post(x, residual, post, comb, *, arch, get_kernel, out=None):
    """out[t, j] = post[t, j] * x[t] + sum_i comb[t, i, j] * residual[t, i]  -> [T, hc, H] bf16."""
    torch = _torch()
    from dsv4_jit.validate import require

    try:
        key = (get_kernel, arch.name, arch.schedule, x.shape, residual.shape)
    except AttributeError:
        key = None
    kernel = _POST_PLANS.get(key)
    if kernel is None:
        # slow path, once per signature: full validation of the inputs (the rest below)
        _check_post_inputs(x, residual, post, comb)
    num_tokens, hc, hidden = residual.shape
    dev = x.device
    if dev.type != "cuda":
        raise ValueError(f"x: must be a CUDA tensor, got device {dev}")
    bf16, f32 = torch.bfloat16, torch.float32
    require(x, "x", (num_tokens, hidden), bf16, dev)
    require(residual, "residual", (num_tokens, hc, hidden), bf16, dev)
    require(post, "post", (num_tokens, hc), f32, dev)
    require(comb, "comb", (num_tokens, hc, hc), f32, dev)
    if out is None:
        out = torch.empty((num_tokens, hc, hidden), dtype=bf16, device=dev)
    else:
        require(out, "out", (num_tokens, hc, hidden), bf16, dev)
    if num_tokens == 0:
        return out
    if kernel is None:
        # every tensor is validated before anything is selected, loaded or compiled; select validates the statics
        kernel = _POST_PLANS[key] = get_kernel(get_spec("mhc_post"), {"hidden_size": hidden, "hc_mult": hc}, num_tokens)
    kernel(x, residual, post, comb, out)
    return out


def mhc_post_pre_fused(x, residual, post, comb, fn_next, *, arch, get_kernel, out=None,
                       mix_part=None, sq_part=None):
    """post, plus the next layer's prenorm partials. Returns (out, mix_part [S,T,MP], sq_part [S,T])."""
    torch = _torch()
    from dsv4_jit.validate import check_tensor
    num_tokens, hidden, hc = _check_post_inputs(x, residual, post, comb)
    dev = x.device
    if not isinstance(fn_next, torch.Tensor) or fn_next.dim() != 2:
        raise ValueError("fn_next: expected a 2-D fp32 tensor [mix_width, hc*hidden]")
    mix = fn_next.shape[0]
    check_tensor(fn_next, "fn_next", [mix, hc * hidden], torch.float32, dev)
    if out is None:
        out = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=dev)
    else:
        check_tensor(out, "out", [num_tokens, hc, hidden], torch.bfloat16, dev)
    spec = get_spec("mhc_post_pre_fused")
    static = {"hidden_size": hidden, "hc_mult": hc, "mix_width": mix}
    # select once: the variant (loaded, unless there is no token to launch for) fixes the partials' shapes
    kernel = get_kernel(spec, static, num_tokens) if num_tokens > 0 else None
    variant = kernel.variant if kernel is not None else spec.select(get_profile(arch), static, 1)
    splits, mix_pad = fused_num_splits(variant), variant.p["mix_pad"]
    if mix_part is None:
        mix_part = torch.empty((splits, num_tokens, mix_pad), dtype=torch.float32, device=dev)
    else:
        check_tensor(mix_part, "mix_part", [splits, num_tokens, mix_pad], torch.float32, dev)
    if sq_part is None:
        sq_part = torch.empty((splits, num_tokens), dtype=torch.float32, device=dev)
    else:
        check_tensor(sq_part, "sq_part", [splits, num_tokens], torch.float32, dev)
    if kernel is not None:
        kernel(x, residual, post, comb, fn_next, out, mix_part, sq_part)
    return out, mix_part, sq_part

# =============================================================================================
# hc_head
# =============================================================================================
def hc_head(residual, fn, hc_scale, hc_base, *, rms_eps, hc_eps, arch, get_kernel, out=None):
    """[T, hc, H] bf16 residual streams -> [T, H] bf16 (see module docstring)."""
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(residual, torch.Tensor) or residual.dim() != 3:
        raise ValueError("residual: expected a 3-D bf16 tensor [T, hc, hidden]")
    check_tensor(residual, "residual", [None, None, None], torch.bfloat16)
    num_tokens, hc, hidden = residual.shape
    dev = residual.device
    check_tensor(fn, "fn", [hc, hc * hidden], torch.float32, dev)
    check_tensor(hc_scale, "hc_scale", [1], torch.float32, dev)
    check_tensor(hc_base, "hc_base", [hc], torch.float32, dev)
    if out is None:
        out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=dev)
    else:
        check_tensor(out, "out", [num_tokens, hidden], torch.bfloat16, dev)
    if num_tokens == 0:
        return out
    static = {"hidden_size": hidden, "hc_mult": hc, "rms_eps": float(rms_eps), "hc_eps": float(hc_eps)}
    get_kernel(get_spec("mhc_head"), static, num_tokens)(residual, fn, hc_scale, hc_base, out)
    return out
