"""Host op for toy_rowscale: validate (ValueError naming the argument), allocate only what was not passed
(`out=` for CUDA-graph capture), select + load through `get_kernel` (the planner enumerates the same
select), launch."""
from __future__ import annotations

from dsv4_jit.validate import check_tensor

from .kernel import ToyRowScaleSpec

SPEC = ToyRowScaleSpec()


def toy_rowscale(x, w, *, arch, get_kernel, out=None):
    import torch
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x: expected a [T, hidden] bf16 tensor")
    check_tensor(x, "x", [None, None], torch.bfloat16)
    tokens, hidden = x.shape
    check_tensor(w, "w", [hidden], torch.bfloat16, x.device)
    if out is None:
        out = torch.empty_like(x)
    else:
        check_tensor(out, "out", [tokens, hidden], torch.bfloat16, x.device)
    if tokens == 0:
        return out
    get_kernel(SPEC, {"hidden": hidden}, tokens)(x, w, out)
    return out
