"""DeepSeek V4 kernel families (TileLang), one subpackage per family, each with its torch reference.

Importing this package registers every family (dsv4_jit.family.register_family); TileLang itself is
imported only when a kernel is built. `model_kernel_uses` lists what a model + parallel config calls,
with the statics baked in; the planner enumerates exactly these through each spec's `select`, the
function serving calls.
"""
from __future__ import annotations

from ..family import KernelUse, all_families
from ..spec import KernelSpec, Variant, get_spec
from . import mhc  # noqa: F401  (registration; add new families here)
from . import attention  # noqa: F401
from . import indexer  # noqa: F401
from . import quant, gemm  # noqa: F401
from . import moe  # noqa: F401
from . import compressor  # noqa: F401

__all__ = ["KernelUse", "model_kernel_uses", "op_variants"]


def model_kernel_uses(model, parallel=None, *, mtp: bool = True) -> list[KernelUse]:
    """Every (kernel, static) pair a DeepSeek V4 forward pass launches for this model and parallel config,
    over every registered family, plus the MTP block's e_proj / h_proj GEMMs (`mtp`; see model_uses.py)."""
    from ..model_uses import forward_uses
    return forward_uses(model, parallel, mtp=mtp)


def _op_kernels(op: str) -> tuple[str, ...]:
    for fam in all_families().values():
        if op in fam.ops:
            return fam.ops[op]
    known = sorted(o for f in all_families().values() for o in f.ops)
    raise ValueError(f"unknown op {op!r}; known: {', '.join(known)}")


def op_variants(op: str, num_tokens: int, arch=None, model: str = "deepseek-v4-flash") -> list[tuple[KernelSpec, Variant]]:
    """(spec, variant) pairs the public op `op` launches at `num_tokens` (default flags)."""
    from ..arch import get_profile
    from ..jit import current_arch
    from ..model_config import ParallelConfig, load_model_config
    profile = current_arch() if arch is None else get_profile(arch)
    cfg = load_model_config(model)
    out = []
    for name in _op_kernels(op):
        spec = get_spec(name)
        out.append((spec, spec.select(profile, spec.static_params(cfg, ParallelConfig()), num_tokens)))
    return out
