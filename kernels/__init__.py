"""DeepSeek V4 kernel families (TileLang), one per module, each with its torch reference.

Importing this package registers every KernelSpec; TileLang itself is imported only when a kernel
is built. `model_kernel_uses` lists what a model + parallel config calls, with the statics baked in;
the planner enumerates exactly these through each spec's `select`, the function serving calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import mhc_pre, mhc_post, mhc_head  # noqa: F401  (registration)
from ..spec import KernelSpec, Variant, get_spec


@dataclass(frozen=True)
class KernelUse:
    spec: KernelSpec
    static: dict = field(hash=False)
    label: str = ""


# Which kernels each public op launches, with the static flags that distinguish its call sites.
def model_kernel_uses(model, parallel=None) -> list[KernelUse]:
    """Every (kernel, static) pair a DeepSeek V4 forward pass launches for this model and TP size.

    mHC runs on the full residual stream, replicated across TP ranks, so TP changes no mHC static;
    it is taken so attention/MoE families (heads per rank = heads / TP) plug in the same way."""
    from ..model_config import ParallelConfig
    parallel = parallel or ParallelConfig()
    uses: list[KernelUse] = []

    def add(name: str, label: str, **flags: Any) -> None:
        spec = get_spec(name)
        static = dict(spec.static_params(model, parallel))
        static.update(flags)
        uses.append(KernelUse(spec, static, label))

    # hc_pre per block: attention and FFN sub-blocks, each followed by its RMSNorm (fused variant),
    # and the first layer whose residual is one stream broadcast into hc streams.
    add("mhc_pre_norm_fn", "hc_pre gemm (layers)")
    add("mhc_pre_norm_fn", "hc_pre gemm (first layer, broadcast)", broadcast=True)
    add("mhc_pre_fuse", "hc_pre fuse + RMSNorm (layers)", with_norm=True)
    add("mhc_pre_fuse", "hc_pre fuse (no norm)", with_norm=False)
    add("mhc_pre_fuse", "hc_pre fuse + RMSNorm (first layer, broadcast)", with_norm=True, broadcast=True)
    add("mhc_sinkhorn", "hc split + Sinkhorn (standalone)")
    add("mhc_post", "hc_post")
    add("mhc_post_pre_fused", "hc_post fused with next hc_pre gemm")
    add("mhc_head", "hc_head (final + MTP)")
    return uses


_OPS = {
    "mhc_pre": ("mhc_pre_norm_fn", "mhc_pre_fuse"),
    "mhc_post": ("mhc_post",),
    "mhc_head": ("mhc_head",),
    "mhc_sinkhorn": ("mhc_sinkhorn",),
}


def op_variants(op: str, num_tokens: int, arch=None, model: str = "deepseek-v4-flash") -> list[tuple[KernelSpec, Variant]]:
    """(spec, variant) pairs the public op `op` launches at `num_tokens` (default flags)."""
    from ..jit import current_arch
    from ..arch import get_profile
    from ..model_config import load_model_config, ParallelConfig
    profile = current_arch() if arch is None else get_profile(arch)
    cfg = load_model_config(model)
    out = []
    for name in _OPS[op]:
        spec = get_spec(name)
        static = spec.static_params(cfg, ParallelConfig())
        out.append((spec, spec.select(profile, static, num_tokens)))
    return out
