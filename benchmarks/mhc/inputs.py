"""The mHC benchmarks' V4 shapes and random inputs (hc 4, mix width 24, eps 1e-6, 20 Sinkhorn iterations)."""
from __future__ import annotations

import torch

H, HC, M, MP = 4096, 4, 24, 32  # V4-Flash hidden, hc_mult, mix width, mix width padded to 16
EPS, ITERS, POST_MULT = 1e-6, 20, 2.0
MODELS = {"flash": 4096, "pro": 7168}  # hidden size per V4 model; hc, mix width and eps are shared


def pre_weights(g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(fn [M, HC*hidden], hc_scale [3], hc_base [M]) fp32, random."""
    fn = torch.randn(M, HC * hidden, device=dev, generator=g) * 1e-2
    scale = torch.rand(3, device=dev, generator=g) + 0.5
    base = torch.randn(M, device=dev, generator=g) * 0.1
    return fn, scale, base


def head_weights(g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(hc_head_fn [HC, HC*hidden], hc_head_scale [1], hc_head_base [HC]) fp32, random."""
    fn = torch.randn(HC, HC * hidden, device=dev, generator=g) * 1e-2
    scale = torch.rand(1, device=dev, generator=g) + 0.5
    base = torch.randn(HC, device=dev, generator=g) * 0.1
    return fn, scale, base


def activations(t: int, g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(residual [t, HC, hidden] bf16, x [t, hidden] bf16, post [t, HC], comb [t, HC, HC]) for t tokens, random."""
    residual = torch.randn(t, HC, hidden, device=dev, generator=g).to(torch.bfloat16)
    x = torch.randn(t, hidden, device=dev, generator=g).to(torch.bfloat16)
    post = torch.rand(t, HC, device=dev, generator=g) * 2
    comb = torch.rand(t, HC, HC, device=dev, generator=g)
    return residual, x, post, comb
