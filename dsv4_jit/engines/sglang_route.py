"""The SGLang route: SGLang 0.5.23's SM12x TileLang calls served by dsv4-jit, warmed from ServerArgs and sealed.

Enabled by `SGLANG_EXTERNAL_MODEL_PACKAGE=dsv4_jit.engines.sglang_models`: SGLang imports that package in every
process that resolves a model class (each TP worker, before it builds the model), and the package calls
`register()`. It:

1. does nothing when `DSV4_JIT_SGLANG_ROUTE=0` (the off switch);
2. reads SGLang's version from package metadata (no `import sglang`) and, outside `SUPPORTED` (0.5.23), logs one
   ERROR line and leaves SGLang untouched (`DSV4_JIT_SGLANG_ROUTE=require` turns that into an exception);
3. routes on SM12x only (`DSV4_JIT_ARCH`'s first arch, else the GPU as SGLang's own NVML probe reads it, with no
   CUDA context): anywhere else it logs one INFO line and changes nothing;
4. installs a post-import hook (the vLLM plugin's `PostImportFinder`). When SGLang imports
   `sglang.kernels.ops.layernorm.mhc`, its module attributes `mhc_pre`, `mhc_post`, `mhc_fused_post_pre` and
   `hc_split_sinkhorn` are rebound to the adapters of `dsv4_jit.engines.sglang_ops` (same parameters, same
   results); `sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits` likewise. SGLang's
   call sites read these attributes at call time (`from ... import name` inside the calling function, or
   `deepseek_v4.get_mhc_ops()`, whose cache is cleared so it reads them again). A name whose signature is not
   the one the adapter was written for is left alone (one ERROR line). When SGLang imports its model runner,
   `ModelRunner.init_cuda_graphs` (called once per worker before CUDA-graph capture, also with graphs off) is
   wrapped to warm dsv4-jit's plan for a DeepSeek V4 model first, then seal;
5. logs one INFO line saying what it routed, and the warmup it got.

Warmup: the plan is built from the live ServerArgs (`plan_from_server_args`: capture sizes, chunked prefill,
max running requests, speculative decoding, TP) for exactly the kernel uses the routes request (`route_uses`),
compiled with rank sharding over the worker's process group, then sealed (`DSV4_JIT_SEAL` = warn (default) |
error | off). A model other than DeepSeek V4 gets SGLang's own functions back.

Not routed (SGLang keeps its kernels): attention, hc_head, the DeepGEMM / Triton mHC paths, the indexer's FP4 and
non-paged paths and its top-k, the compressor, GEMMs and the MoE.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from .vllm_plugin import PostImportFinder, _mark, parse_version, seal_mode
from .vllm_plugin import switch as _switch

log = logging.getLogger("dsv4_jit.sglang")

SUPPORTED = ((0, 5, 23), (0, 5, 24))      # SGLang >= 0.5.23, < 0.5.24: the release the adapters were read from
SUPPORTED_TEXT = ">=0.5.23,<0.5.24"
ENV_SWITCH = "DSV4_JIT_SGLANG_ROUTE"      # 0/off/false: do nothing; require: refuse loudly by raising
ENV_ARCH = "DSV4_JIT_ARCH"
ROUTE_FAMILY = "blackwell_consumer"       # SM12x (sm_120a, sm_121a)

RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
MODEL_MODULE = "sglang.srt.models.deepseek_v4"          # get_mhc_ops() caches the mHC functions it imported
DSV4_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
NOT_ROUTED = ("attention", "hc_head", "the DeepGEMM/Triton mHC paths", "the indexer's FP4, non-paged and top-k paths",
              "the compressor", "GEMMs", "the MoE")
# dsv4-jit kernels the mHC routes launch (broadcast pre and hc_head are not SGLang calls on SM12x).
ROUTED_MHC_KERNELS = ("mhc_pre_norm_fn", "mhc_pre_fuse", "mhc_sinkhorn", "mhc_post", "mhc_post_pre_fused")

STATE: dict[str, Any] = {"registered": False, "routed": {}, "refused": None, "skipped": None, "warmup": None,
                         "sealed": None, "unrouted": None}


class VersionRefused(RuntimeError):
    pass


def switch(env=None) -> str:
    """'on' | 'off' | 'require' from DSV4_JIT_SGLANG_ROUTE (unset: on)."""
    return _switch(env, ENV_SWITCH)


def version_supported(text: str) -> bool:
    return SUPPORTED[0] <= parse_version(text) < SUPPORTED[1]


def installed_sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def device_sm() -> int | None:
    """The GPU's SM version (120 for sm_120) as SGLang reads it: NVML while CUDA is not initialised, so the API
    server process gets no CUDA context. None without a GPU."""
    try:
        from sglang.srt.utils.common import get_device_sm
        return int(get_device_sm())
    except Exception:                     # noqa: BLE001 - SGLang absent or no NVML: ask torch
        pass
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major * 10 + minor
    except Exception:                     # noqa: BLE001
        pass
    return None


def route_target(env=None, sm: int | None = None) -> tuple[bool, str]:
    """(route here?, why): DSV4_JIT_ARCH's first arch when set (tests force one), else the GPU's SM version."""
    env = env if env is not None else os.environ
    forced = env.get(ENV_ARCH)
    if forced:
        from dsv4_jit.arch import get_profile
        prof = get_profile(forced.replace(",", " ").split()[0])
        return prof.family == ROUTE_FAMILY, f"{ENV_ARCH}={forced}"
    sm = device_sm() if sm is None else sm
    if not sm:
        return False, "no CUDA GPU"
    return sm // 10 == 12, f"GPU sm_{sm}"


# ---- the entry point ----------------------------------------------------------------------------------

def register(*, env=None, sglang_version: str | None = None, sm: int | None = None) -> bool:
    """Called by `dsv4_jit.engines.sglang_models` on import. True when the hooks are installed. Idempotent."""
    mode = switch(env)
    if mode == "off":
        log.info("dsv4-jit: SGLang route off (%s=0)", ENV_SWITCH)
        return False
    ver = sglang_version if sglang_version is not None else installed_sglang_version()
    if ver is None or not version_supported(ver):
        msg = (f"dsv4-jit: SGLang {ver or '(not installed)'} is outside the supported range {SUPPORTED_TEXT}; "
               f"the route changes nothing and SGLang runs unchanged (install sglang==0.5.23, or a dsv4-jit "
               f"release for your SGLang; {ENV_SWITCH}=0 silences this)")
        STATE["refused"] = msg
        if mode == "require":
            raise VersionRefused(msg)
        log.error("%s", msg)
        return False
    here, why = route_target(env, sm)
    if not here:
        STATE["skipped"] = why
        log.info("dsv4-jit: SGLang route off on %s (it routes SM12x only); SGLang runs unchanged", why)
        return False
    seal_mode(env)                      # a bad DSV4_JIT_SEAL fails here, at start, not at capture time
    if STATE["registered"]:
        return True
    STATE["registered"] = True
    from .sglang_ops import ROUTES
    watched = (*ROUTES, RUNNER_MODULE, MODEL_MODULE)
    for name in [n for n in watched if n in sys.modules]:
        _on_import(sys.modules[name])
    if not any(isinstance(f, PostImportFinder) and f.on_import is _on_import for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder(watched, _on_import))
    return True


def _on_import(module) -> None:
    from .sglang_ops import ROUTES
    name = module.__name__
    try:
        if name in ROUTES:
            route_module(module)
        elif name == RUNNER_MODULE:
            hook_runner(module)
        elif name == MODEL_MODULE:
            _refresh_mhc_ops(module)
    except Exception:                     # noqa: BLE001 - never break SGLang's import; say why
        log.exception("dsv4-jit: could not hook %s; SGLang keeps its own kernels there", name)


def _refresh_mhc_ops(module) -> None:
    """deepseek_v4.get_mhc_ops() caches the mHC functions on its first call: make it read them again."""
    get_ops = getattr(module, "get_mhc_ops", None)
    if get_ops is not None and hasattr(get_ops, "cache_clear"):
        get_ops.cache_clear()


def _same_parameters(a, b) -> bool:
    import inspect
    try:
        pa, pb = inspect.signature(a).parameters, inspect.signature(b).parameters
    except (TypeError, ValueError):
        return False
    return [(p.name, p.kind, p.default) for p in pa.values()] == [(p.name, p.kind, p.default) for p in pb.values()]


def route_module(module) -> list[str]:
    """Rebind one SGLang module's TileLang functions to dsv4-jit's adapters (only where the parameters match)."""
    from . import sglang_ops
    done: list[str] = []
    if STATE["unrouted"]:                 # the worker serves another model: SGLang keeps its functions
        return done
    for fname, route in sglang_ops.ROUTES[module.__name__].items():
        orig = getattr(module, fname, None)
        if orig is None or getattr(orig, "__dsv4_jit_route__", False):
            continue
        if not _same_parameters(orig, route):
            log.error("dsv4-jit: %s.%s does not take SGLang 0.5.23's parameters; SGLang keeps its own function",
                      module.__name__, fname)
            continue
        sglang_ops.ORIGINALS.setdefault(fname, orig)
        setattr(module, fname, _mark(route))
        done.append(fname)
    STATE["routed"][module.__name__] = sorted(set(STATE["routed"].get(module.__name__, [])) | set(done))
    if done and module.__name__ == sglang_ops.MHC_MODULE and MODEL_MODULE in sys.modules:
        _refresh_mhc_ops(sys.modules[MODEL_MODULE])
    return done


def unroute(why: str = "another model") -> list[str]:
    """Give SGLang its own functions back (a model other than DeepSeek V4), now and for modules imported later."""
    from . import sglang_ops
    STATE["unrouted"] = why
    back = []
    for mname, names in STATE["routed"].items():
        module = sys.modules.get(mname)
        for fname in names:
            if module is not None and fname in sglang_ops.ORIGINALS:
                setattr(module, fname, sglang_ops.ORIGINALS[fname])
                back.append(fname)
    STATE["routed"] = {}
    if MODEL_MODULE in sys.modules:
        _refresh_mhc_ops(sys.modules[MODEL_MODULE])
    return back


# ---- the plan: what the routes request ------------------------------------------------------------------

def route_uses(model, parallel=None) -> list:
    """Every (kernel, static) the routes launch for this model: the mHC family's uses of ROUTED_MHC_KERNELS (no
    first-layer broadcast: SGLang expands the embedding itself), and the indexer logits at the statics
    `sglang_ops.indexer_static` selects with. DeepSeek V4.1: V4's ops only (`model_uses.v41_uses`)."""
    from dsv4_jit.family import KernelUse
    from dsv4_jit.kernels.indexer.family import RATIO
    from dsv4_jit.model_config import ParallelConfig
    from dsv4_jit.model_uses import forward_uses, is_v41
    from dsv4_jit.spec import get_spec
    from .sglang_ops import indexer_static
    parallel = parallel or ParallelConfig()
    uses = [u for u in forward_uses(model, parallel, families=["mhc"], mtp=False)
            if u.spec.name in ROUTED_MHC_KERNELS and not u.static.get("broadcast", False)]
    if not is_v41(model) and RATIO in model.layer_ratios:
        uses.append(KernelUse(get_spec("indexer_decode_logits"), indexer_static(int(model.index_n_heads)),
                              "indexer logits (SGLang fp8_paged_mqa_logits: compressed lengths, 64-position pages)"))
    return uses


def plan(server_args, *, model=None, arch: str | None = None, gpu_memory_gib: float | None = None):
    """The route's plan for a live ServerArgs: `sglang_hook.plan_from_server_args` over `route_uses`."""
    from dsv4_jit.model_config import ParallelConfig
    from .sglang_hook import model_from_server_args, plan_from_server_args
    m = model_from_server_args(server_args, model)
    tp = int(getattr(server_args, "tp_size", 1) or 1)
    return plan_from_server_args(server_args, model=m, arch=arch, families=("mhc", "indexer"),
                                 gpu_memory_gib=gpu_memory_gib, uses=route_uses(m, ParallelConfig(tp_size=tp)))


# ---- warmup and seal inside the worker ------------------------------------------------------------------

def _architectures(runner) -> list[str]:
    hf = getattr(getattr(runner, "model_config", None), "hf_config", None)
    return list(getattr(hf, "architectures", None) or [])


def is_dsv4(runner) -> bool:
    return any(a in DSV4_ARCHITECTURES for a in _architectures(runner))


def _live_model(runner):
    """dsv4-jit's ModelConfig from the runner's live HF config, else None (ServerArgs.model_path is read)."""
    hf = getattr(getattr(runner, "model_config", None), "hf_config", None)
    if hf is None or not hasattr(hf, "to_dict"):
        return None
    from dsv4_jit.model_config import from_hf_dict
    name = str(getattr(getattr(runner, "server_args", None), "model_path", "") or "deepseek-v4")
    return from_hf_dict(hf.to_dict(), name)


def warm_runner(runner) -> dict | None:
    """Before the first CUDA-graph capture of the process: warm this rank's share of the route's plan, wait for
    the other ranks, load everything, seal. Once per process; a model other than DeepSeek V4 is unrouted."""
    if STATE["warmup"] is not None or not STATE["registered"] or STATE["unrouted"]:
        return STATE["warmup"]
    if not is_dsv4(runner):
        back = unroute(str(_architectures(runner) or "the model"))
        log.info("dsv4-jit: %s is not DeepSeek V4; SGLang keeps its own %s", _architectures(runner) or "the model",
                 ", ".join(back) or "functions")
        return None
    from dsv4_jit.errors import Dsv4JitError
    from dsv4_jit.model_config import ParallelConfig
    from .sglang_hook import model_from_server_args, warmup_from_server_args
    t0 = time.monotonic()
    sa = runner.server_args
    tp = int(getattr(sa, "tp_size", 1) or 1)
    rank = _tp_rank()
    try:
        model = model_from_server_args(sa, _live_model(runner))
        rep = warmup_from_server_args(sa, rank, model=model, families=("mhc", "indexer"), announce=False,
                                      uses=route_uses(model, ParallelConfig(tp_size=tp)), gpu_memory_gib=_gpu_gib())
    except Dsv4JitError as e:
        # a ServerArgs the planner does not follow: the routes still serve (compiling on first use), unsealed
        if seal_mode() == "error":
            raise
        STATE["warmup"] = {"error": str(e)}
        log.error("dsv4-jit: no warmup for these ServerArgs (%s); the routed calls compile on first use and "
                  "nothing is sealed", e)
        return STATE["warmup"]
    STATE["warmup"], STATE["sealed"] = rep, seal_mode()
    log.info("%s", routed_line(rep, rank, tp, time.monotonic() - t0, STATE["sealed"]))
    for f in rep["failures"]:
        log.error("dsv4-jit: warmup failure: %s", f)
    return rep


def _gpu_gib() -> float | None:
    """This GPU's memory in GiB, which SGLang's defaults (chunked prefill, decode batch sizes) follow."""
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    except Exception:                     # noqa: BLE001
        pass
    return None


def _tp_rank() -> int:
    """This worker's TP rank (SGLang's parallel context, else torch.distributed's rank)."""
    try:
        from sglang.srt.runtime_context import get_parallel
        return int(get_parallel().tp_rank)
    except Exception:                     # noqa: BLE001
        from .vllm_plugin import _rank_world
        return _rank_world()[0]


def routed_line(rep: dict | None = None, rank: int = 0, world: int = 1, seconds: float = 0.0,
                sealed: str | None = None) -> str:
    """The one INFO line: what was routed, and the warmup it got."""
    from .sglang_ops import ROUTES
    parts = [f"{', '.join(names)} ({m})" for m, names in sorted(STATE["routed"].items()) if names]
    # a module SGLang imports later (the indexer's, at its first call) is rebound then by the post-import hook
    parts += [f"{', '.join(sorted(ROUTES[m]))} (when SGLang imports {m})" for m in sorted(ROUTES)
              if m not in STATE["routed"]]
    line = (f"dsv4-jit: routed SGLang SM12x calls {'; '.join(parts) or '(none)'} to dsv4-jit ops; "
            f"{', '.join(NOT_ROUTED)} stay on SGLang's kernels")
    if rep is not None:
        line += (f"; warmed {rep.get('variants', rep.get('loaded', 0))} variants on rank {rank}/{world} in "
                 f"{seconds:.1f} s ({rep['compiled']} compiled here"
                 f"{', %d FAILED' % len(rep['failures']) if rep['failures'] else ''}), sealed {sealed}")
    return line


def hook_runner(module) -> None:
    """Wrap `ModelRunner.init_cuda_graphs` (SGLang 0.5.23's scheduler calls it for each worker right before CUDA-
    graph capture, and with graphs off too) to warm and seal first."""
    cls = getattr(module, "ModelRunner")
    orig = cls.init_cuda_graphs
    if getattr(orig, "__dsv4_jit_route__", False):
        return

    def init_cuda_graphs(self, *args, **kwargs):
        warm_runner(self)
        return orig(self, *args, **kwargs)
    init_cuda_graphs.__wrapped__ = orig
    cls.init_cuda_graphs = _mark(init_cuda_graphs)
