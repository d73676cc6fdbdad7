"""Torch reference for toy_rowscale (any device; float64 by default)."""


def ref_rowscale(x, w, dtype=None):
    import torch
    dtype = dtype or torch.float64
    return x.to(dtype) * w.to(dtype)
