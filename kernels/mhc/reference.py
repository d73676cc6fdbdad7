"""Torch references for the mHC kernels (fp32/fp64, CPU or CUDA)."""


# --- post/head ---
# Torch references for mhc_post.py / mhc_head.py (any device; compute in `dtype`, fp32 or fp64).


def ref_mhc_post(x, residual, post, comb, dtype=None):
    """out[t, j, :] = post[t, j] * x[t, :] + sum_i comb[t, i, j] * residual[t, i, :]  (not rounded)."""
    import torch
    dtype = dtype or torch.float32
    xf, rf = x.to(dtype), residual.to(dtype)
    return post.to(dtype).unsqueeze(-1) * xf.unsqueeze(1) + torch.einsum("tij,tih->tjh", comb.to(dtype), rf)


def ref_mhc_post_pre_fused(x, residual, post, comb, fn_next, num_splits, mix_pad=32, dtype=None):
    """(out [T,hc,H] bf16-rounded in `dtype`, mix_part [S,T,mix_pad], sq_part [S,T]).

    Split s owns h in [s*H/S, (s+1)*H/S) of every stream; mix columns >= M are zero. The partials
    use the bf16-rounded out, as the kernel does (it is what the next layer reads)."""
    import torch
    dtype = dtype or torch.float32
    out = ref_mhc_post(x, residual, post, comb, torch.float32).to(torch.bfloat16).to(dtype)
    t, hc, hidden = out.shape
    mix = fn_next.shape[0]
    if hidden % num_splits:
        raise ValueError(f"hidden={hidden} is not divisible by num_splits={num_splits}")
    hs = hidden // num_splits
    o = out.view(t, hc, num_splits, hs)                                   # [T, hc, S, hs]
    f = fn_next.to(dtype).view(mix, hc, num_splits, hs)                   # [M, hc, S, hs]
    mix_part = torch.zeros(num_splits, t, mix_pad, dtype=dtype, device=out.device)
    mix_part[:, :, :mix] = torch.einsum("tish,mish->stm", o, f)
    sq_part = (o * o).sum(dim=(1, 3)).transpose(0, 1).contiguous()      # [S, T]
    return out, mix_part, sq_part


def ref_hc_head(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, dtype=None):
    """y [T, H] (not rounded): sum_i pre_i * X_i with pre = sigmoid(mix * scale + base) + hc_eps."""
    import torch
    dtype = dtype or torch.float32
    t, hc, hidden = residual.shape
    xf = residual.to(dtype).reshape(t, hc * hidden)
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + rms_eps)
    mixes = (xf @ fn.to(dtype).t()) * rs                                   # [T, hc]
    pre = torch.sigmoid(mixes * hc_scale.to(dtype) + hc_base.to(dtype)) + hc_eps
    return (pre.unsqueeze(-1) * residual.to(dtype)).sum(dim=1)


# --- pre ---
# Torch references for mhc_pre.py (any device; math in `dtype`, float64 by default).


def ref_sinkhorn_normalize(logits, iters, eps):
    """Sinkhorn on [..., hc, hc]: softmax(rows) + eps, col-normalise, then (iters-1) x {row, col},
    every normalisation dividing by (sum + eps)."""
    import torch
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def ref_sinkhorn(mixes, hc_scale, hc_base, hc_eps, iters, post_mult, dtype=None):
    """Standalone split of RMS-scaled mixes [T, (2+hc)*hc] -> (pre [T,hc], post [T,hc], comb [T,hc,hc])."""
    import torch
    dtype = dtype or torch.float64
    m = mixes.to(dtype)
    s, b = hc_scale.to(dtype), hc_base.to(dtype)
    width = m.shape[-1]
    hc = int(round((-2 + (4 + 4 * width) ** 0.5) / 2))   # width = (2 + hc) * hc
    if (2 + hc) * hc != width:
        raise ValueError(f"mix width {width} is not (2+hc)*hc")
    pre = torch.sigmoid(m[:, :hc] * s[0] + b[:hc]) + hc_eps
    post = post_mult * torch.sigmoid(m[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
    logits = (m[:, 2 * hc:] * s[2] + b[2 * hc:]).view(-1, hc, hc)
    return pre, post, ref_sinkhorn_normalize(logits, iters, hc_eps)


def ref_mhc_pre_mixes(residual, fn, rms_eps, broadcast=False, dtype=None):
    """RMS-scaled mixes [T, M] and the raw (unscaled) x . fn^T, square-sum; residual [T,hc,H] or [T,H]."""
    import torch
    dtype = dtype or torch.float64
    hc = fn.shape[1] // residual.shape[-1]
    x = residual.to(dtype)
    if broadcast:
        x = x.unsqueeze(1).expand(-1, hc, -1)
    xf = x.reshape(x.shape[0], -1)
    raw = xf @ fn.to(dtype).t()
    sq = xf.square().sum(-1)
    return raw * torch.rsqrt(sq / xf.shape[1] + rms_eps).unsqueeze(-1), raw, sq


def ref_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, iters, post_mult, norm_weight=None,
                norm_eps=None, broadcast=False, dtype=None):
    """(layer_input [T,H] not rounded, post [T,hc], comb [T,hc,hc]) in `dtype` (float64 default).

    with norm_weight: layer_input = RMSNorm(sum_i pre_i X_i) computed from the unrounded sum."""
    import torch
    dtype = dtype or torch.float64
    mixes, _, _ = ref_mhc_pre_mixes(residual, fn, rms_eps, broadcast, dtype)
    pre, post, comb = ref_sinkhorn(mixes, hc_scale, hc_base, hc_eps, iters, post_mult, dtype)
    x = residual.to(dtype)
    if broadcast:
        y = pre.sum(-1, keepdim=True) * x
    else:
        y = (pre.unsqueeze(-1) * x).sum(1)
    if norm_weight is not None:
        eps = rms_eps if norm_eps is None else norm_eps
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    return y, post, comb
