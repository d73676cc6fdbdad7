"""SGLang: warm and seal dsv4-jit from a live `ServerArgs`, in each TP worker, before graph capture.

    from dsv4_jit.engines.sglang import warmup_from_server_args   # or .sglang_hook
    warmup_from_server_args(server_args, tp_rank)                  # compile my share, wait, load, seal

SGLang is never imported: `ServerArgs` is read duck-typed by the attribute names in
`dsv4_jit.warmup.sglang._OBJECT_ATTRS` (SGLang 0.5.23's input fields: cuda_graph_max_bs_decode,
cuda_graph_bs_decode, cuda_graph_config, chunked_prefill_size, max_running_requests, tp_size, attn_dp_size,
speculative_* ...), plus `model_path` for
the model's config.json. Routing SGLang's own calls to dsv4-jit is `dsv4_jit.engines.sglang_route`
(enabled with SGLANG_EXTERNAL_MODEL_PACKAGE=dsv4_jit.engines.sglang_models), which warms through this module.
"""
from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("dsv4_jit.sglang")

ENV_SEAL = "DSV4_JIT_SEAL"


def model_from_server_args(server_args: Any, model=None):
    """dsv4-jit's ModelConfig: `model` (name, path or ModelConfig), else ServerArgs.model_path's config.json."""
    from dsv4_jit.errors import ConfigError
    from dsv4_jit.model_config import ModelConfig, load_model_config
    if isinstance(model, ModelConfig):
        return model
    src = model if model is not None else getattr(server_args, "model_path", None)
    if src is None:
        raise ConfigError("ServerArgs has no model_path; pass model= (deepseek-v4-flash, deepseek-v4-pro or a "
                          "config.json path)")
    return load_model_config(src)


def plan_from_server_args(server_args: Any, *, model=None, arch: str | None = None, families=("mhc",),
                          gpu_memory_gib: float | None = None, uses=None):
    """The plan for a live ServerArgs (same formula as `dsv4-jit plan --sglang-args ...`). `uses`: the kernel
    uses to plan (default: the families' uses for a forward pass)."""
    from dsv4_jit.arch import resolve_archs
    from dsv4_jit.warmup import sglang as _sg
    from dsv4_jit.warmup.planner import build_plan
    st = _sg.settings_from_object(server_args)
    if gpu_memory_gib is not None:
        st.set("gpu_memory_gib", gpu_memory_gib, "gpu_memory_gib")
    shapes = _sg.shapes_from_settings(st)
    if arch is None and not os.environ.get("DSV4_JIT_ARCH"):
        from dsv4_jit.jit import current_arch
        arch = current_arch().name
    archs, reason = resolve_archs(arch)
    return build_plan(model_from_server_args(server_args, model), shapes, [a.name for a in archs],
                      arch_reason=reason, uses=uses, families=list(families) if families else None)


def warmup_from_server_args(server_args: Any, tp_rank: int = 0, *, world_size: int | None = None, model=None,
                            arch: str | None = None, seal: str | None = None, families=("mhc",),
                            gpu_memory_gib: float | None = None, uses=None, announce: bool = True) -> dict:
    """Compile this TP rank's share of the plan, wait for the others, load everything, seal.

    world_size defaults to ServerArgs.tp_size; seal to DSV4_JIT_SEAL (warn | error | off, default warn).
    A torch.distributed barrier is used only when the default group has exactly world_size ranks; otherwise
    ranks wait on the shared cache (see dsv4_jit.warmup.runner.warmup_in_engine). `uses` as plan_from_server_args;
    announce=False leaves the INFO line to the caller."""
    import dsv4_jit
    mode = seal or os.environ.get(ENV_SEAL, "warn")
    if mode not in ("warn", "error", "off"):
        raise ValueError(f"seal mode {mode!r}: expected warn, error or off")
    world = int(world_size if world_size is not None else getattr(server_args, "tp_size", 1) or 1)
    plan = plan_from_server_args(server_args, model=model, arch=arch, families=families,
                                 gpu_memory_gib=gpu_memory_gib, uses=uses)
    use_dist = False
    try:
        import torch.distributed as dist
        use_dist = dist.is_available() and dist.is_initialized() and dist.get_world_size() == world
    except Exception:                     # noqa: BLE001
        pass
    rep = dsv4_jit.warm(plan, rank=int(tp_rank), world_size=world, seal_mode=None if mode == "off" else mode,
                        use_dist=use_dist)
    rep["variants"] = plan.compiles
    if announce:
        log.info("dsv4-jit: SGLang tp rank %d/%d warmed %d variants (%d compiled here), sealed %s", tp_rank,
                 world, plan.compiles, rep["compiled"], mode)
    return rep
