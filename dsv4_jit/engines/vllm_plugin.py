"""The vLLM plugin: `pip install dsv4-jit[vllm]` registers `register` under `vllm.general_plugins`.

vLLM calls `register()` in every process it starts (API server, engine core, each worker). It:

1. does nothing when `DSV4_JIT_VLLM_PLUGIN=0` (the off switch);
2. reads vLLM's version from package metadata (no `import vllm`) and, outside `SUPPORTED` (0.33.x), logs
   one ERROR line and leaves vLLM untouched (`DSV4_JIT_VLLM_PLUGIN=require` turns that into an exception
   that stops vLLM);
3. installs a post-import hook. When vLLM imports its DeepSeek V4 NVIDIA modules
   (`vllm.models.deepseek_v4.nvidia.{model,mtp,dspark}`, and `mhc_post_tilelang` in DeepSeek V4.1's
   `vllm.models.deepseek_v41.nvidia.{model,dspark}`), the mHC functions those modules imported by
   name from `vllm.model_executor.kernels.mhc.tilelang` are rebound, in those modules only, to the
   adapters of `dsv4_jit.engines.vllm_mhc` (same parameters, same results). No other model and no other
   vLLM module sees a change. When vLLM imports its GPU worker (`vllm.v1.worker.gpu_worker`), the
   worker's `load_model` is wrapped to warm dsv4-jit's plan right after the weights load (before the
   memory-profiling run and CUDA-graph capture), and the `kernel_warmup` it calls just before
   `capture_model` is wrapped to seal dsv4-jit afterwards;
4. logs one INFO line saying what it routed.

Warmup (a DeepSeek V4 model only): the plan is built from the live `VllmConfig` (capture sizes, max
batched tokens, speculative decoding, TP: `plan_from_vllm_config`) for the mHC family (the only one
routed), and compiled with rank sharding across the worker's process group (`dsv4_jit.warmup`).
Seal mode: `DSV4_JIT_SEAL` = warn (default) | error | off.

Attention and indexer calls are not routed (vLLM keeps its own kernels for those).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import time
from typing import Any

log = logging.getLogger("dsv4_jit.vllm")

SUPPORTED = ((0, 33), (0, 34))            # vLLM >= 0.33.0, < 0.34: the release the adapters were read from
SUPPORTED_TEXT = ">=0.33.0,<0.34"
ENV_SWITCH = "DSV4_JIT_VLLM_PLUGIN"       # 0/off/false: do nothing; require: refuse loudly by raising
ENV_SEAL = "DSV4_JIT_SEAL"                # warn (default) | error | off
ENV_ARCH = "DSV4_JIT_ARCH"

# DeepSeek V4 architectures (vllm/model_executor/models/registry.py, vLLM 0.33.0).
DSV4_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTP",
                      "DSparkDeepseekV4ForCausalLM")
# DeepSeek V4.1 (`vllm.models.deepseek_v41`): of the mHC TileLang names it imports, only mhc_post_tilelang is
# V4's op (same signature, V4.1's shapes); what it runs besides is not routed and says so in the log line.
DSV41_ARCHITECTURES = ("DeepseekV41ForCausalLM", "DSparkV41DraftModel")
DSV41_NOT_ROUTED = ("mhc_pre_delayed_tilelang", "the mega-mHC ops of deepseek_v41/nvidia/ops",
                    "hc_collapse_triton")
# vLLM module -> the mHC names it imported from vllm.model_executor.kernels.mhc.tilelang (vLLM 0.33.0).
PATCH_TARGETS: dict[str, tuple[str, ...]] = {
    "vllm.models.deepseek_v4.nvidia.model": ("hc_head_fused_kernel_tilelang", "mhc_fused_post_pre_tilelang",
                                             "mhc_post_tilelang", "mhc_pre_broadcast_tilelang", "mhc_pre_tilelang"),
    "vllm.models.deepseek_v4.nvidia.mtp": ("hc_head_fused_kernel_tilelang", "mhc_post_tilelang"),
    "vllm.models.deepseek_v4.nvidia.dspark": ("hc_head_fused_kernel_tilelang", "mhc_post_tilelang"),
    "vllm.models.deepseek_v41.nvidia.model": ("mhc_post_tilelang",),
    "vllm.models.deepseek_v41.nvidia.dspark": ("mhc_post_tilelang",),
}
WORKER_MODULE = "vllm.v1.worker.gpu_worker"

STATE: dict[str, Any] = {"registered": False, "routed": {}, "refused": None, "warmup": None, "sealed": None}


class VersionRefused(RuntimeError):
    pass


# ---- switches -------------------------------------------------------------------------------------------

def switch(env=None, name: str = ENV_SWITCH) -> str:
    """'on' | 'off' | 'require' from the switch variable `name` (DSV4_JIT_VLLM_PLUGIN; unset: on)."""
    v = str((env if env is not None else os.environ).get(name, "1")).strip().lower()
    if v in ("0", "off", "false", "no", "disable", "disabled"):
        return "off"
    if v in ("require", "required", "strict"):
        return "require"
    return "on"


def seal_mode(env=None) -> str:
    v = str((env if env is not None else os.environ).get(ENV_SEAL, "warn")).strip().lower()
    if v not in ("warn", "error", "off"):
        raise ValueError(f"{ENV_SEAL}={v!r}: expected warn, error or off")
    return v


def parse_version(text: str) -> tuple[int, int, int]:
    import re
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise ValueError(f"cannot read a version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_supported(text: str) -> bool:
    v = parse_version(text)[:2]
    return SUPPORTED[0] <= v < SUPPORTED[1]


def installed_vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


# ---- the entry point ----------------------------------------------------------------------------------

def register(*, env=None, vllm_version: str | None = None) -> bool:
    """`vllm.general_plugins` entry point. Returns True when the hooks are installed. Idempotent."""
    mode = switch(env)
    if mode == "off":
        log.info("dsv4-jit: vLLM plugin off (%s=0)", ENV_SWITCH)
        return False
    ver = vllm_version if vllm_version is not None else installed_vllm_version()
    if ver is None or not version_supported(ver):
        msg = (f"dsv4-jit: vLLM {ver or '(not installed)'} is outside the supported range {SUPPORTED_TEXT}; "
               f"the plugin routes nothing and vLLM runs unchanged (install vllm~=0.33.0, or a dsv4-jit "
               f"release for your vLLM; {ENV_SWITCH}=0 silences this)")
        STATE["refused"] = msg
        if mode == "require":
            raise VersionRefused(msg)
        log.error("%s", msg)
        return False
    seal_mode(env)                      # a bad DSV4_JIT_SEAL fails here, at start, not at capture time
    if STATE["registered"]:
        return True
    STATE["registered"] = True
    for name in [n for n in (*PATCH_TARGETS, WORKER_MODULE) if n in sys.modules]:
        _on_import(sys.modules[name])
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    return True


# ---- post-import hook ---------------------------------------------------------------------------------

class PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs `on_import(module)` right after one of the `watched` modules executes (the engine's own loader
    runs first; nothing else about the import changes)."""

    _busy: set[str] = set()

    def __init__(self, watched, on_import):
        self.watched, self.on_import = frozenset(watched), on_import

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, on_import = spec.loader, self.on_import

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                on_import(module)

        spec.loader = _Loader()
        return spec


class _PostImportFinder(PostImportFinder):
    """The vLLM plugin's: the DeepSeek V4 model modules and the GPU worker."""

    def __init__(self):
        super().__init__((*PATCH_TARGETS, WORKER_MODULE), _on_import)


def _on_import(module) -> None:
    name = module.__name__
    try:
        if name in PATCH_TARGETS:
            route_module(module)
        elif name == WORKER_MODULE:
            hook_worker(module)
    except Exception:                     # noqa: BLE001 - never break vLLM's import; say why
        log.exception("dsv4-jit: could not hook %s; vLLM keeps its own kernels there", name)


def route_module(module) -> list[str]:
    """Rebind the vLLM mHC names of one DeepSeek V4 module to dsv4-jit's adapters (exact signatures)."""
    from . import vllm_mhc
    done = []
    for fname in PATCH_TARGETS[module.__name__]:
        orig = getattr(module, fname, None)
        if orig is None:
            raise AttributeError(f"{module.__name__} has no {fname}; not the vLLM 0.33 layout")
        if getattr(orig, "__dsv4_jit_route__", False):
            continue
        vllm_mhc._ORIGINALS.setdefault(fname, orig)
        route = vllm_mhc.ROUTES[fname]
        setattr(module, fname, _mark(route))
        done.append(fname)
    STATE["routed"][module.__name__] = sorted(set(STATE["routed"].get(module.__name__, [])) | set(done))
    if done:
        log.debug("dsv4-jit: rebound %s in %s", ", ".join(done), module.__name__)
    return done


def _mark(fn):
    try:
        fn.__dsv4_jit_route__ = True
    except AttributeError:
        pass
    return fn


# ---- warmup and seal inside the worker ------------------------------------------------------------------

def _architectures(vllm_config) -> list[str]:
    mc = getattr(vllm_config, "model_config", None)
    hf = getattr(mc, "hf_config", None)
    return list(getattr(hf, "architectures", None) or []) + list(getattr(mc, "architectures", None) or [])


def is_dsv41(vllm_config) -> bool:
    return any(a in DSV41_ARCHITECTURES for a in _architectures(vllm_config))


def is_dsv4(vllm_config) -> bool:
    """A DeepSeek V4 model, V4.1 included (its routed calls are V4's ops)."""
    return any(a in DSV4_ARCHITECTURES for a in _architectures(vllm_config)) or is_dsv41(vllm_config)


def model_from_vllm_config(vllm_config):
    """dsv4-jit's ModelConfig from the live HF config (the statics must be the ones vLLM passes)."""
    from dsv4_jit.model_config import from_hf_dict
    hf = vllm_config.model_config.hf_config
    d = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    name = str(getattr(vllm_config.model_config, "model", "") or "deepseek-v4")
    return from_hf_dict(d, name)


def plan_from_vllm_config(vllm_config, *, model=None, arch: str | None = None, families=("mhc",)):
    """The warmup plan for a live VllmConfig: its capture sizes, max_num_batched_tokens, speculative
    config and TP (`warmup.engines.shapes_from_config`), for the routed families, on `arch` (default: this
    process's GPU, or DSV4_JIT_ARCH)."""
    from dsv4_jit.arch import resolve_archs
    from dsv4_jit.warmup.engines import shapes_from_config
    from dsv4_jit.warmup.planner import build_plan
    shapes = shapes_from_config(vllm_config)
    if model is None:
        model = model_from_vllm_config(vllm_config)
    if arch is None and not os.environ.get(ENV_ARCH):
        from dsv4_jit.jit import current_arch
        arch = current_arch().name
    archs, reason = resolve_archs(arch)
    uses = None
    if is_dsv41(vllm_config):                        # only mhc_post is routed there: plan what it launches
        from dsv4_jit.model_config import ParallelConfig, load_model_config
        from dsv4_jit.model_uses import v41_uses
        if isinstance(model, str):
            model = load_model_config(model)
        uses = v41_uses(model, ParallelConfig(tp_size=shapes.tp_size), families)
    return build_plan(model, shapes, [a.name for a in archs], arch_reason=reason, uses=uses,
                      families=list(families) if families else None)


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:                     # noqa: BLE001
        pass
    return 0, 1


def warm_worker(worker) -> dict | None:
    """After the worker loaded the model: build the plan from its VllmConfig, warm this rank's share,
    wait for the others, load everything. Sealing waits for `seal_worker` (just before graph capture)."""
    cfg = getattr(worker, "vllm_config", None)
    if cfg is None or not is_dsv4(cfg) or not STATE["routed"]:
        return None
    import dsv4_jit
    t0 = time.monotonic()
    plan = plan_from_vllm_config(cfg)
    rank, world = _rank_world()
    rep = dsv4_jit.warm(plan, rank=rank, world_size=world, seal_mode=None)
    rep["variants"] = plan.compiles
    STATE["warmup"] = rep
    log.info("%s", routed_line(rep, rank, world, time.monotonic() - t0))
    for f in rep["failures"]:
        log.error("dsv4-jit: warmup failure: %s", f)
    return rep


def routed_line(rep: dict | None = None, rank: int = 0, world: int = 1, seconds: float = 0.0) -> str:
    """The one INFO line: what was routed, and the warmup it got."""
    names = sorted({n for ns in STATE["routed"].values() for n in ns})
    by_model: dict[str, list[str]] = {}
    for m in STATE["routed"]:
        pkg, _, leaf = m.removeprefix("vllm.models.").rpartition(".")
        by_model.setdefault(pkg, []).append(leaf)
    where = "; ".join(f"{pkg}: {', '.join(sorted(leaves))}" for pkg, leaves in sorted(by_model.items()))
    line = (f"dsv4-jit: routed vLLM mHC calls {', '.join(names) or '(none)'} ({where or '-'}) to dsv4-jit ops; "
            f"attention/indexer stay on vLLM's kernels")
    if any(m.startswith("vllm.models.deepseek_v41.") for m in STATE["routed"]):
        line += f"; DeepSeek V4.1: only mhc_post_tilelang is routed, {', '.join(DSV41_NOT_ROUTED)} stay on vLLM's"
    if rep is not None:
        line += (f"; warmed {rep.get('variants', rep.get('loaded', 0))} variants on rank {rank}/{world} in "
                 f"{seconds:.1f} s ({rep['compiled']} compiled here"
                 f"{', %d FAILED' % len(rep['failures']) if rep['failures'] else ''})")
    return line


def seal_worker(worker) -> str | None:
    if STATE["warmup"] is None:
        return None
    import dsv4_jit
    mode = seal_mode()
    dsv4_jit.seal(mode)
    STATE["sealed"] = mode
    log.info("dsv4-jit: sealed (%s) before CUDA-graph capture; counters %s", mode,
             {k: v for k, v in dsv4_jit.counters().items() if k in ("compiles", "loads", "sealed_compiles")})
    return mode


def hook_worker(module) -> None:
    """Wrap `Worker.load_model` (warm after it) and the module's `kernel_warmup` (seal after it; vLLM 0.33's
    `Worker._compile_or_warm_up_model` calls it right before `capture_model`)."""
    worker_cls = getattr(module, "Worker")
    load = worker_cls.load_model
    if not getattr(load, "__dsv4_jit_route__", False):
        def load_model(self, *args, **kwargs):
            out = load(self, *args, **kwargs)
            warm_worker(self)
            return out
        load_model.__wrapped__ = load
        worker_cls.load_model = _mark(load_model)
    kw = getattr(module, "kernel_warmup")
    if not getattr(kw, "__dsv4_jit_route__", False):
        def kernel_warmup(worker, *args, **kwargs):
            out = kw(worker, *args, **kwargs)
            seal_worker(worker)
            return out
        kernel_warmup.__wrapped__ = kw
        module.kernel_warmup = _mark(kernel_warmup)
