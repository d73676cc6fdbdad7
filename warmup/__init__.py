"""Engine configs, the bucket planner and the parallel warmup runner (installed as dsv4_jit.warmup)."""
from __future__ import annotations

from .engines import (ENGINES, SGLANG_FORMULA_VERSION, VLLM_FORMULA_VERSION, EngineShapes, Profile,  # noqa: F401
                      load_profile, parse_engine_args, resolve_shapes, sglang_shapes, shapes_from_config,
                      vllm_shapes)


def __getattr__(name: str):
    # The planner and runner pull in the kernel registry / jit; import them on first use only.
    if name in ("build_plan", "Plan", "PlannedVariant", "SECONDS_PER_VARIANT_PER_CORE"):
        from . import planner
        return getattr(planner, name)
    if name in ("run_warmup", "warmup_in_engine", "available_cpus", "WarmupReport"):
        from . import runner
        return getattr(runner, name)
    if name == "plan_for_engine":
        return plan_for_engine
    raise AttributeError(name)


def plan_for_engine(engine_config, model, *, arch=None):
    """In-engine helper: the plan for a live vLLM VllmConfig / SGLang ServerArgs on this GPU's arch."""
    from dsv4_jit.arch import resolve_archs
    from .planner import build_plan
    shapes = shapes_from_config(engine_config)
    archs, reason = resolve_archs(arch)
    return build_plan(model, shapes, [a.name for a in archs], arch_reason=reason)
