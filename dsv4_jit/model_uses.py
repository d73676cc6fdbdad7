"""Every kernel a DeepSeek V4 forward pass launches: the kernel families' uses, plus the MTP block's own
projections when speculative decoding runs it.

The MTP block (vLLM 0.33 `models/deepseek_v4/nvidia/mtp.py`, `DeepSeekV4MultiTokenPredictorLayer.forward`) runs
the same decoder layer as the target model (the families' uses already cover it) and, before it, two FP8
linears the families do not list:
  * `e_proj` (ReplicatedLinear hidden -> hidden) over the embedded tokens: M = tokens;
  * `h_proj` (ReplicatedLinear hidden -> hidden) over the previous hidden states viewed as
    (tokens, hc_mult, hidden): M = hc_mult x tokens.
Both are replicated, so their shape is the same at every TP size; at TP 2 it happens to equal wo_b's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .family import KernelUse, all_families, family_uses


@dataclass(frozen=True)
class ScaledKernelUse(KernelUse):
    """A use whose GEMM M is a multiple of the forward's token count (h_proj: hc_mult rows per token)."""
    rows_per_token: int = 1


def rows_per_token(use) -> int:
    return int(getattr(use, "rows_per_token", 1))


def mtp_uses(model, parallel=None) -> list[KernelUse]:
    """The MTP block's e_proj and h_proj FP8 GEMMs (none for a model without MTP layers)."""
    if not int(getattr(model, "num_nextn_predict_layers", 0) or 0):
        return []
    from .kernels.gemm.ops import gemm_static
    from .spec import get_spec
    h, hc = int(model.hidden_size), int(model.hc_mult)
    spec = get_spec("fp8_gemm")
    return [ScaledKernelUse(spec, gemm_static(h, h), f"fp8 GEMM MTP e_proj (replicated): K {h} -> N {h}", 1),
            ScaledKernelUse(spec, gemm_static(h, h),
                            f"fp8 GEMM MTP h_proj (replicated, {hc} hc streams: M = {hc} x tokens): K {h} -> N {h}",
                            hc)]


# DeepSeek V4.1 (vLLM 0.33's `models/deepseek_v41`): of the kernels it runs, only V4's mhc_post op (at V4.1's shapes,
# the same signature) is dsv4-jit's; the rest stays on the engine's kernels.
V41_OPS = {"mhc": ("mhc_post",)}
V41_NOT_COVERED = ("mhc_pre_delayed", "the mega-mHC ops", "hc_collapse", "attention", "the indexer", "the compressor",
                   "the FP8 GEMMs", "the MoE")


def is_v41(model) -> bool:
    return getattr(model, "generation", "v4") == "v4.1"


def v41_note() -> str:
    ops = ", ".join(op for ops in V41_OPS.values() for op in ops)
    return f"DeepSeek V4.1: only {ops} (V4's op at V4.1's shapes) is planned; {', '.join(V41_NOT_COVERED)} stay on " \
           f"the engine's kernels"


def v41_uses(model, parallel, families: Iterable[str] | None = None) -> list[KernelUse]:
    """The uses of a V4.1 model that are V4's ops: V41_OPS's kernels (of the chosen families)."""
    fams = all_families()
    out = []
    for name, ops in V41_OPS.items():
        if families and name not in families:
            continue
        kernels = {k for op in ops for k in fams[name].ops[op]}
        out += [u for u in fams[name].uses(model, parallel) if u.spec.name in kernels]
    return out


def forward_uses(model, parallel=None, *, families: Iterable[str] | None = None, mtp: bool = True
                 ) -> list[KernelUse]:
    """The chosen families' uses (None: all), plus the MTP projections when `mtp` and the GEMM family is chosen.
    A DeepSeek V4.1 model: only its uses that are V4's ops (v41_uses)."""
    from .model_config import ParallelConfig
    parallel = parallel or ParallelConfig()
    if is_v41(model):
        return v41_uses(model, parallel, families)
    fams = all_families()
    chosen = [fams[n] for n in families] if families else list(fams.values())
    uses = family_uses(chosen, model, parallel)
    if mtp and any(f.name == "gemm" for f in chosen):
        uses += mtp_uses(model, parallel)
    return uses
