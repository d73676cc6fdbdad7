"""vLLM's CUDA-graph capture sizes and token limits, re-derived without importing vLLM.

Read from the vLLM 0.33.0 wheel (`pip download vllm==0.33.0`, commit g4ba787ec9):
  * `vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults`, `_set_default_max_num_seqs_and_batched_tokens_args`,
    `create_engine_config` (LoRA + spec-decode batched-token check, mutually exclusive size flags)
  * `vllm/config/scheduler.py: SchedulerConfig.verify_max_model_len` (what the scheduler refuses)
  * `vllm/config/speculative.py: SpeculativeConfig.__post_init__ / _verify_args` (spec-decode refusals)
  * `vllm/config/vllm.py: VllmConfig._set_max_num_scheduled_tokens` (lookahead refusal, the < 8192 warning),
    `VllmConfig._set_cudagraph_sizes` (the compilation config's size list), `use_v2_model_runner`,
    `_get_v{1,2}_model_runner_unsupported_features`, `OPTIMIZATION_LEVEL_0{0..3}` (default cudagraph_mode)
  * `vllm/config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes`,
    `adjust_cudagraph_sizes_for_spec_decode` (V1 model runner only)
  * `vllm/v1/worker/gpu/cudagraph_utils.py: CudaGraphManager._init_candidates` (V2 model runner, the default)
  * `vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher.initialize_cudagraph_keys` (V1 model runner)
DeepSeek V4 specifics on NVIDIA, from the same wheel: the architecture is in
`DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES` (piecewise graphs need no torch.compile) and its attention
backends report `AttentionCGSupport.ALWAYS`, so vLLM keeps the requested cudagraph_mode as is.

`capture_sizes` below are the token counts at which vLLM captures a graph of the target model: the
compilation config's list for mixed (piecewise/FULL) graphs, united with the FULL decode graphs, which the
V2 runner builds by rounding each size up to a multiple of 1 + num_speculative_tokens. `token_counts()`
stays 1..max_num_batched_tokens either way. Not modelled (noted when seen): dynamic speculative decoding
and adaptive verification, which change only which sizes are captured.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from dsv4_jit.errors import ConfigError

from .flags import (BOOL, FLOAT, HRINT, INT, INTLIST, JSON, STR, Flag, FlagTable, Settings, bool_flag_names,
                    to_bool, to_human_int, to_int, to_int_list)
from .shapes import EngineShapes

VLLM_FORMULA_VERSION = "vllm-0.33.0"        # the release whose source the module docstring names
DEFAULT_MAX_GRAPH_SIZE = 512                # capture ceiling; 1024 on datacenter Blackwell (sm_100 family)
BLACKWELL_MAX_GRAPH_SIZE = 1024
SCHEDULED_TOKENS_WARN = 8192                # vLLM warns below this many scheduled tokens with spec decode

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_MODE_BY_INT = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}
MODE_BY_OPT_LEVEL = {0: "NONE", 1: "PIECEWISE", 2: "FULL_AND_PIECEWISE", 3: "FULL_AND_PIECEWISE"}
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")

# SpeculativeConfig.method (a Literal in vLLM; any "<model>_mtp" is an alias of "mtp").
SPEC_METHODS = ("ngram", "ngram_gpu", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
                "extract_hidden_states", "mtp", "dflash", "dspark")
_USES_EAGLE = ("eagle", "eagle3", "mtp", "dflash", "dspark")   # SpeculativeConfig.use_eagle()
_NEEDS_DRAFT_MODEL = ("eagle", "eagle3", "dflash", "draft_model", "custom_class")
_BATCHED_DP_BACKENDS = ("deepep_low_latency", "nixl_ep")      # ParallelConfig.use_batched_dp_moe
_ENV_V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"

FLAGS = FlagTable("vllm", [
    Flag("max_num_seqs", INT, ("max-num-seqs",)),
    Flag("max_num_batched_tokens", HRINT, ("max-num-batched-tokens",)),
    Flag("max_model_len", STR, ("max-model-len",)),               # human-readable int or "auto"
    Flag("enable_chunked_prefill", BOOL, bool_flag_names("enable-chunked-prefill")),
    Flag("max_cudagraph_capture_size", INT, ("max-cudagraph-capture-size",)),
    Flag("cudagraph_capture_sizes", INTLIST, ("cudagraph-capture-sizes", "cuda-graph-sizes")),
    # "-O '{json}'" is the pre-0.33 spelling; vLLM 0.33 reads -O<n> as the level (see flags.py).
    Flag("compilation_config", JSON, ("compilation-config", "cc", "O")),
    Flag("optimization_level", INT, ("optimization-level",)),
    Flag("performance_mode", STR, ("performance-mode",)),
    Flag("speculative_config", JSON, ("speculative-config", "sc")),
    Flag("spec_tokens", INT, ("spec-tokens",)),
    Flag("spec_method", STR, ("spec-method",)),
    Flag("spec_model", STR, ("spec-model",)),
    Flag("num_speculative_tokens", INT, ("num-speculative-tokens",)),   # Python API / pre-0.33 flag
    Flag("tensor_parallel_size", INT, ("tensor-parallel-size", "tp", "tp-size")),
    Flag("data_parallel_size", INT, ("data-parallel-size", "dp", "dp-size")),
    Flag("enable_expert_parallel", BOOL, bool_flag_names("enable-expert-parallel")),
    Flag("all2all_backend", STR, ("all2all-backend",)),
    Flag("enforce_eager", BOOL, bool_flag_names("enforce-eager")),
    Flag("cudagraph_mode", STR, ("cudagraph-mode",)),
    Flag("enable_lora", BOOL, bool_flag_names("enable-lora")),
    Flag("enable_dbo", BOOL, bool_flag_names("enable-dbo")),
    # Gone in vLLM 0.33 (refused there, so refused here), kept to say so by name.
    Flag("enable_sp", BOOL, bool_flag_names("enable-sequence-parallelism", "enable-sp")),
    # Ours, not vLLM's: the serving GPU (get_batch_defaults) and the VLLM_USE_V2_MODEL_RUNNER env var.
    Flag("gpu_memory_gib", FLOAT, ("gpu-memory-gib",)),
    Flag("gpu_name", STR, ("gpu-name",)),
    Flag("use_v2_model_runner", BOOL, bool_flag_names("use-v2-model-runner")),
], known_bools=(
    "trust-remote-code", "enable-prefix-caching", "no-enable-prefix-caching", "disable-log-requests",
    "disable-log-stats", "enable-auto-tool-choice", "enable-eplb", "async-scheduling", "no-async-scheduling",
    "disable-custom-all-reduce", "headless", "enable-log-requests", "skip-tokenizer-init",
    "disable-cascade-attn", "enable-prompt-tokens-details", "enable-force-include-usage",
))

FLAG_NAMES = {f.dest: f.display for f in FLAGS.by_dest.values()}


def _is_dc_blackwell(gpu_name: str | None) -> bool:
    """B200/B300/GB200/GB300: compute capability family 100 (vLLM's 1024 ceiling, >= 160 GiB)."""
    return bool(re.search(r"\bg?b[23]00\b", (gpu_name or "").lower()))


def batch_defaults(gpu_memory_gib: float | None, gpu_name: str | None, usage: str = "server"
                   ) -> tuple[int, int, str | None]:
    """(max_num_seqs, max_num_batched_tokens, note) as vLLM's `get_batch_defaults` picks them.

    With no GPU information we assume the H100/H200 tier (>= 70 GiB, < 160 GiB, not A100) and say so."""
    if usage not in ("server", "llm"):
        raise ConfigError(f"usage must be 'server' (vllm serve) or 'llm' (LLM class), got {usage!r}")
    name = (gpu_name or "").lower()
    note = None
    if gpu_memory_gib is None and gpu_name is None:
        mem = 80.0
        note = ("vLLM defaults assume a >= 70 GiB, < 160 GiB non-A100 GPU (H100/H200 class); pass "
                "--gpu-memory-gib for another GPU or set --max-num-seqs/--max-num-batched-tokens")
    else:
        if gpu_memory_gib is not None and gpu_memory_gib <= 0:
            raise ConfigError(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib}")
        # A name without a size: B200-class cards have >= 160 GiB, anything else is taken as large.
        mem = gpu_memory_gib if gpu_memory_gib is not None else (160.0 if _is_dc_blackwell(name) else 80.0)
    if mem >= 160:
        return 1024, 16384, note
    if mem >= 70 and "a100" not in name and "gb10" not in name:   # GB10 (DGX Spark) stays small
        return 1024, (8192 if usage == "server" else 16384), note
    return 256, (2048 if usage == "server" else 8192), note


# ---- the formula (pure; inputs validated) -------------------------------------------------------

def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _grid(max_cg: int, performance_mode: str = "balanced") -> list[int]:
    """`_set_cudagraph_sizes`' default token grid up to `max_cg`."""
    if performance_mode == "interactivity":
        sizes = list(range(1, min(max_cg, 32) + 1))     # every size to 32: the least padding
    else:
        sizes = [s for s in (1, 2, 4) if s <= max_cg]
    if max_cg >= 8:
        sizes += range(8, min(max_cg + 1, 256), 8)
    if max_cg >= 256:
        sizes += range(256, max_cg + 1, 16)
    return sorted(set(sizes))


def _request_counts(max_reqs: int, ceiling: int) -> list[int]:
    """`request_counts` inside `_set_cudagraph_sizes`: the grid over requests, plus max_reqs itself."""
    max_reqs = min(max_reqs, ceiling)
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += range(8, min(max_reqs + 1, 256), 8)
    counts += range(256, max_reqs + 1, 16)
    return sorted(set(counts) | {max_reqs})


def config_capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, q: int = 1,
                         cudagraph_capture_sizes: Sequence[int] | None = None,
                         max_cudagraph_capture_size: int | None = None, performance_mode: str = "balanced",
                         default_max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE,
                         names: dict[str, str] | None = None) -> tuple[list[int], int, list[str]]:
    """`VllmConfig._set_cudagraph_sizes`: (compilation_config sizes, max capture size, notes).

    `q` is the uniform decode query length, 1 + num_speculative_tokens."""
    nm = {**FLAG_NAMES, **(names or {})}
    notes: list[str] = []
    mnbt = max_num_batched_tokens
    max_cg = max_cudagraph_capture_size
    uniform: list[int] = []             # decode sizes; only added when the ceiling is vLLM's own
    if max_cg is None:
        max_cg = min(max_num_seqs * q * 2, default_max_graph_size)
        if q > 1:
            # Spec decode: request counts scaled by q, so every entry is a whole decode batch.
            uniform = sorted({n * q for n in _request_counts(max_num_seqs, default_max_graph_size)
                              if n * q <= max_cg})
        elif max_num_seqs <= max_cg:
            uniform = [max_num_seqs]
    max_cg = min(mnbt, max_cg)
    if max_cg < 1:                      # vLLM asserts this
        raise ConfigError(f"{nm['max_cudagraph_capture_size']} must be >= 1 when CUDA graphs are on, got {max_cg}")

    if cudagraph_capture_sizes is not None:
        if not cudagraph_capture_sizes:  # vLLM asserts this too
            raise ConfigError(f"{nm['cudagraph_capture_sizes']}: empty list; use cudagraph_mode NONE or "
                              "--enforce-eager to turn CUDA graphs off")
        sizes = sorted({s for s in cudagraph_capture_sizes if s <= mnbt})
        dropped = sorted({s for s in cudagraph_capture_sizes if s > mnbt})
        if dropped:
            notes.append(f"capture sizes {dropped} dropped: above max_num_batched_tokens={mnbt}, as vLLM does")
        if not sizes:
            notes.append(f"no CUDA graphs: every {nm['cudagraph_capture_sizes']} entry is above "
                         f"max_num_batched_tokens={mnbt} (vLLM accepts this and captures nothing)")
    else:
        sizes = _grid(max_cg, performance_mode)
        if mnbt <= max_cg:
            sizes.append(mnbt)           # the largest batch is captured even off the grid
        sizes = sorted(set(sizes) | {s for s in uniform if s <= mnbt})

    valid_max = sizes[-1] if sizes else 0
    if max_cudagraph_capture_size is not None and max_cudagraph_capture_size != valid_max:
        if cudagraph_capture_sizes is not None:
            raise ConfigError(
                f"{nm['max_cudagraph_capture_size']}={max_cudagraph_capture_size} contradicts "
                f"{nm['cudagraph_capture_sizes']} (largest usable size {valid_max}); vLLM refuses this, "
                "give one of them")
        notes.append(f"max_cudagraph_capture_size truncated to {valid_max}, as vLLM does")
    return sizes, valid_max, notes


def round_for_spec_decode(sizes: Sequence[int], max_cg: int, q: int,
                          names: dict[str, str] | None = None) -> tuple[list[int], int]:
    """`CompilationConfig.adjust_cudagraph_sizes_for_spec_decode` (V1 model runner, FULL decode, q > 1)."""
    if not sizes or q <= 1:
        return list(sizes), max_cg
    nm = {**FLAG_NAMES, **(names or {})}
    rounded = sorted({_round_up(s, q) for s in sizes if _round_up(s, q) <= max_cg})
    if not rounded and q <= max_cg:
        rounded = [q]
    if not rounded:
        raise ConfigError(
            f"no CUDA-graph size is left after rounding to a multiple of {q} (1 + num_speculative_tokens) "
            f"for the V1 model runner; vLLM refuses this: raise {nm['max_cudagraph_capture_size']} ({max_cg}) "
            f"or {nm['cudagraph_capture_sizes']}, or lower {nm['num_speculative_tokens']} ({q - 1})")
    return rounded, rounded[-1]


def runner_capture_sizes(sizes: Sequence[int], max_cg: int, *, mode: str, q: int, max_num_seqs: int,
                         v2_model_runner: bool = True, names: dict[str, str] | None = None) -> list[int]:
    """Token counts the model runner captures a graph at, from the compilation config's sizes.

    V2 (`CudaGraphManager._init_candidates`): mixed graphs at every size; FULL decode graphs at each size
    rounded up to a multiple of q, up to max_num_seqs * q and the capture ceiling.
    V1 (`CudagraphDispatcher.initialize_cudagraph_keys`): sizes first rounded to multiples of q when the
    decode mode is FULL; mixed graphs at every size, decode graphs at sizes in [q, max_num_seqs * q]."""
    if mode == "NONE" or not sizes:
        return []
    separate = mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")      # CUDAGraphMode.separate_routine()
    mixed = mode != "FULL_DECODE_ONLY"                                   # mixed_mode() != NONE
    widest_decode = max_num_seqs * q
    if not v2_model_runner:
        if mode != "PIECEWISE" and q > 1:                                # decode_mode() == FULL
            sizes, max_cg = round_for_spec_decode(sizes, max_cg, q, names)
        out = set(sizes) if mixed else set()
        if separate:
            out |= {s for s in sizes if q <= s <= widest_decode}
        return sorted(out)
    out = set(sizes) if mixed else set()
    if separate:
        cap = min(widest_decode, max_cg)
        out |= {r for r in (_round_up(s, q) for s in sizes) if r <= cap}
    return sorted(out)


def capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0,
                  cudagraph_mode: str = "FULL_AND_PIECEWISE", cudagraph_capture_sizes: Sequence[int] | None = None,
                  max_cudagraph_capture_size: int | None = None, performance_mode: str = "balanced",
                  v2_model_runner: bool = True, default_max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE,
                  names: dict[str, str] | None = None) -> tuple[list[int], list[int], list[str]]:
    """(captured token counts, compilation-config sizes, notes). Pure; inputs already validated."""
    if cudagraph_mode == "NONE":
        return [], [], []
    q = 1 + num_speculative_tokens
    sizes, max_cg, notes = config_capture_sizes(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, q=q,
        cudagraph_capture_sizes=cudagraph_capture_sizes, max_cudagraph_capture_size=max_cudagraph_capture_size,
        performance_mode=performance_mode, default_max_graph_size=default_max_graph_size, names=names)
    captured = runner_capture_sizes(sizes, max_cg, mode=cudagraph_mode, q=q, max_num_seqs=max_num_seqs,
                                    v2_model_runner=v2_model_runner, names=names)
    if q > 1 and sizes and cudagraph_mode != "PIECEWISE" and not any(s % q == 0 for s in captured):
        notes.append(f"no graph holds a whole decode step ({q} tokens per request): speculative decode "
                     f"batches run without CUDA graphs")
    return captured, sizes, notes


# ---- settings -> EngineShapes --------------------------------------------------------------------

def _positive(v: Any, name: str, minimum: int = 1) -> int:
    i = to_int(v, name)
    if i < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {i}")
    return i


def _mode(value: Any, name: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value in _MODE_BY_INT:
        return _MODE_BY_INT[value]
    s = getattr(value, "name", value)                      # an enum from a real config object
    if isinstance(s, str) and s.strip().upper() in CUDAGRAPH_MODES:
        return s.strip().upper()
    raise ConfigError(f"{name}: unknown cudagraph_mode {value!r}; expected one of {', '.join(CUDAGRAPH_MODES)}")


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding as vLLM's SpeculativeConfig resolves it; k = 0 means off."""
    k: int = 0
    method: str | None = None          # None: given only as a token count (Python API), taken as MTP-like
    k_name: str = "num_speculative_tokens"
    parallel_drafting: bool = False
    unmodelled: tuple[str, ...] = ()   # keys that change which sizes vLLM captures, not modelled here

    @property
    def lookahead(self) -> int:
        """`VllmConfig.num_lookahead_tokens`: KV slots the drafter writes past the scheduled tokens."""
        if not self.k:
            return 0
        if self.method == "dflash":
            return self.k + 1
        if self.method is None or self.method in _USES_EAGLE or self.method == "draft_model":
            return self.k
        return 0


def _is_custom_proposer_path(model: Any) -> bool:
    """`SpeculativeConfig._is_custom_proposer_path`: a dotted import path, not a repo or URL."""
    if not isinstance(model, str) or "/" in model or model.startswith(("http://", "https://", "file://")):
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


def _spec_decode(v: dict[str, Any], nm: dict[str, str]) -> SpecDecode:
    """`EngineArgs.create_speculative_config` + `SpeculativeConfig.__post_init__`, as far as shapes need."""
    spec_name = nm["speculative_config"]
    raw = v.get("speculative_config")
    spec = None if raw is None else {str(key).replace("-", "_"): val for key, val in dict(raw).items()}
    k_name = f"{spec_name} num_speculative_tokens"
    for dest, key in (("spec_tokens", "num_speculative_tokens"), ("spec_method", "method"), ("spec_model", "model")):
        if v.get(dest) is None:
            continue
        spec = {} if spec is None else spec
        if key in spec:
            raise ConfigError(f"{nm[dest]} and {spec_name} {key} are mutually exclusive; vLLM refuses both")
        spec[key] = v[dest]
        if dest == "spec_tokens":
            k_name = nm["spec_tokens"]
    legacy = v.get("num_speculative_tokens")
    if spec is None:                                 # Python API / pre-0.33 flag: a bare token count
        if legacy is None:
            return SpecDecode()
        k = to_int(legacy, nm["num_speculative_tokens"])
        if k < 0:
            raise ConfigError(f"{nm['num_speculative_tokens']} must be >= 0, got {k}")
        return SpecDecode(k=k, k_name=nm["num_speculative_tokens"])

    k_raw = spec.get("num_speculative_tokens", legacy)
    k = None
    if k_raw is not None:
        k = to_int(k_raw, k_name)
        if k <= 0:                                   # SpeculativeConfig: Field(gt=0)
            raise ConfigError(f"{k_name} must be > 0, got {k} (vLLM refuses it; drop {spec_name} to turn "
                              "speculative decoding off)")
    model = spec.get("model")
    method = spec.get("method")
    if method is None:
        method = ("custom_class" if _is_custom_proposer_path(model)
                  else "ngram" if model in ("ngram", "[ngram]") else "draft_model")
    method = str(method)
    if method.endswith("_mtp"):
        method = "mtp"                               # vLLM's deprecated per-model MTP names
    if method not in SPEC_METHODS:
        raise ConfigError(f"{spec_name}: unknown method {method!r}; vLLM accepts {', '.join(SPEC_METHODS)} "
                          "(or a <model>_mtp alias)")
    if model is None and method in _NEEDS_DRAFT_MODEL:
        hint = ' (DeepSeek V4 drafts with its own MTP layer: "method": "mtp")' if method == "draft_model" else ""
        raise ConfigError(f"{spec_name}: method {method!r} needs a draft \"model\"; vLLM refuses it without "
                          f"one{hint}")
    if k is None and method == "suffix":
        k = _positive(spec.get("suffix_decoding_max_tree_depth", 24), f"{spec_name} suffix_decoding_max_tree_depth")
    if k is None:
        why = ("vLLM refuses this" if model is None else
               "vLLM would read the draft model's n_predict, which the planner cannot see; give it")
        raise ConfigError(f"{spec_name}: gives method {method!r} but no num_speculative_tokens; {why}")
    unmodelled = tuple(key for key in ("num_speculative_tokens_per_batch_size", "enable_adaptive_verification")
                       if spec.get(key))
    drafting = to_bool(spec.get("parallel_drafting") or False, f"{spec_name} parallel_drafting")
    return SpecDecode(k=k, method=method, k_name=k_name, parallel_drafting=drafting, unmodelled=unmodelled)


def _env_flag(st: Settings, name: str) -> bool | None:
    """`NAME=value` pasted in front of `vllm serve` (it lands among the positionals)."""
    for p in st.positionals:
        key, eq, val = p.partition("=")
        if eq and key == name:
            return to_bool(val, name)
    return None


def _model_runner(st: Settings, v: dict[str, Any], nm: dict[str, str], spec: SpecDecode, dbo: bool
                  ) -> tuple[bool, str | None]:
    """(V2 model runner?, note): `VllmConfig.use_v2_model_runner` and the two runners' refusals."""
    forced = v.get("use_v2_model_runner")
    forced = _env_flag(st, _ENV_V2_RUNNER) if forced is None else to_bool(forced, nm["use_v2_model_runner"])
    v1_only = []                                     # _get_v2_model_runner_unsupported_features
    if spec.method in ("suffix", "custom_class"):
        v1_only.append(f"speculative method '{spec.method}'")
    if spec.parallel_drafting and spec.method not in ("dflash", "dspark"):
        v1_only.append("parallel drafting for EAGLE speculative decoding")
    if dbo and forced is None:
        v1_only.append("dual batch overlap")         # V2 takes DBO only when the env var asks for V2
    elif dbo and spec.k:
        v1_only.append("dual batch overlap with speculative decoding")
    v2_only = ["dspark speculative decoding"] if spec.method == "dspark" else []
    if forced is True and v1_only:
        raise ConfigError(f"{_ENV_V2_RUNNER}=1: vLLM refuses it here, Model Runner V2 does not yet support "
                          f"{', '.join(v1_only)}")
    if forced is False and v2_only:
        raise ConfigError(f"{_ENV_V2_RUNNER}=0: vLLM refuses it here, Model Runner V1 does not support "
                          f"{', '.join(v2_only)}")
    if forced is not None:
        return forced, None
    if v1_only and v2_only:
        raise ConfigError(f"vLLM refuses {', '.join(v1_only + v2_only)} together (no model runner supports both)")
    if v1_only:
        return False, f"vLLM falls back to the V1 model runner ({', '.join(v1_only)} not in V2)"
    return True, None


def _max_model_len(v: dict[str, Any], nm: dict[str, str]) -> int | None:
    raw = v.get("max_model_len")
    if raw is None or str(raw).strip().lower() in ("auto", "-1"):
        return None                                  # the model's own length, which we do not read
    return _positive(to_human_int(raw, nm["max_model_len"]), nm["max_model_len"])


def _scheduler_limits(v: dict[str, Any], nm: dict[str, str], usage: str, perf: str
                      ) -> tuple[int, int, list[str]]:
    """(max_num_seqs, max_num_batched_tokens, notes): arg_utils' defaults, then SchedulerConfig's checks."""
    notes: list[str] = []
    gib = v.get("gpu_memory_gib")
    d_seqs, d_tokens, d_note = batch_defaults(None if gib is None else float(gib), v.get("gpu_name"), usage)
    seqs_set, tokens_set = "max_num_seqs" in v, "max_num_batched_tokens" in v
    if (not seqs_set or not tokens_set) and d_note:
        left = [f"--{n}" for n, given in (("max-num-seqs", seqs_set), ("max-num-batched-tokens", tokens_set))
                if not given]   # name only the flags the GPU-class assumption decided
        which = f"vLLM's default{'s' if len(left) > 1 else ''} for {' and '.join(left)} assume{'' if len(left) > 1 else 's'}"
        notes.append(d_note.replace("vLLM defaults assume", which)
                     .replace("--max-num-seqs/--max-num-batched-tokens", " and ".join(left)))
    ep = to_bool(v.get("enable_expert_parallel") or False, nm["enable_expert_parallel"])
    dp = _positive(v.get("data_parallel_size", 1), nm["data_parallel_size"])
    if ep and dp > 1 and str(v.get("all2all_backend", "")).lower() in _BATCHED_DP_BACKENDS:
        d_tokens = 256                               # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP
    if perf == "throughput":
        d_seqs, d_tokens = d_seqs * 2, d_tokens * 2  # doubles only what the user left to defaults
    seqs = _positive(v.get("max_num_seqs", d_seqs), nm["max_num_seqs"])
    mnbt = _positive(v["max_num_batched_tokens"] if tokens_set else d_tokens, nm["max_num_batched_tokens"])
    mml = _max_model_len(v, nm)
    raw_chunked = v.get("enable_chunked_prefill")
    chunked = True if raw_chunked is None else to_bool(raw_chunked, nm["enable_chunked_prefill"])
    if not tokens_set:
        if not chunked and mml is not None:
            mnbt = max(mml, mnbt)
        if mml is not None:
            mnbt = min(seqs * mml, mnbt)
    if not seqs_set:
        seqs = min(seqs, mnbt)                       # a defaulted max_num_seqs never exceeds the batched tokens

    # SchedulerConfig.verify_max_model_len: the refusals, in vLLM's order.
    if not chunked:
        if mml is None:
            notes.append("chunked prefill off: vLLM refuses max_num_batched_tokens below the model's max_model_len "
                         f"(and raises a defaulted one to it); the plan uses {mnbt}, pass --max-model-len to check")
        elif mnbt < mml:
            raise ConfigError(f"{nm['max_num_batched_tokens']}={mnbt} is smaller than {nm['max_model_len']}={mml} "
                              f"with chunked prefill off; vLLM refuses this (raise the first, lower the second or "
                              f"drop {nm['enable_chunked_prefill']})")
    if mnbt < seqs:
        raise ConfigError(f"{nm['max_num_batched_tokens']}={mnbt} is smaller than {nm['max_num_seqs']}={seqs}; "
                          "vLLM refuses this (raise the first or lower the second)")
    if mml is not None and mnbt > seqs * mml:
        notes.append(f"vLLM warns: max_num_batched_tokens={mnbt} exceeds max_num_seqs x max_model_len={seqs * mml}")
    return seqs, mnbt, notes


def _spec_checks(spec: SpecDecode, seqs: int, mnbt: int, nm: dict[str, str], lora: bool) -> list[str]:
    """What vLLM refuses or warns about for speculative decoding; the rest is accepted."""
    if not spec.k:
        return []
    q = 1 + spec.k
    if mnbt <= spec.lookahead:                       # VllmConfig._set_max_num_scheduled_tokens
        raise ConfigError(f"{nm['max_num_batched_tokens']}={mnbt} leaves no slot for a scheduled token next to "
                          f"{spec.lookahead} speculative lookahead slots ({spec.k_name}={spec.k}); vLLM refuses "
                          "max_num_batched_tokens <= num_lookahead_tokens")
    if lora and mnbt < seqs * q:                     # EngineArgs.create_engine_config, LoRA only
        raise ConfigError(f"{nm['enable_lora']} with speculative decoding: vLLM refuses "
                          f"{nm['max_num_batched_tokens']}={mnbt} < {nm['max_num_seqs']}={seqs} x "
                          f"(1 + {spec.k}) = {seqs * q}; raise the first or lower the others")
    notes = []
    if mnbt < seqs * q:
        notes.append(f"{nm['max_num_batched_tokens']}={mnbt} < {nm['max_num_seqs']}={seqs} x "
                     f"(1 + num_speculative_tokens={spec.k}) = {seqs * q}: at most {mnbt // q} requests can "
                     f"decode per step, so the engine never batches all {seqs} with speculative decoding "
                     "(vLLM accepts this)")
    if mnbt < SCHEDULED_TOKENS_WARN:
        notes.append(f"vLLM warns: max_num_scheduled_tokens={mnbt} (< {SCHEDULED_TOKENS_WARN}) with speculative "
                     "decoding may perform poorly")
    if spec.unmodelled:
        notes.append(f"speculative_config {', '.join(spec.unmodelled)}: not modelled, vLLM may capture other "
                     "sizes (token counts 1..max_num_batched_tokens still cover every forward)")
    return notes


def _cudagraph_mode(v: dict[str, Any], nm: dict[str, str], eager: bool) -> tuple[str, int, str | None]:
    """(cudagraph_mode, optimization level, note): enforce_eager, then the user's mode, then the -O default."""
    level = to_int(v.get("optimization_level", 2), nm["optimization_level"])
    if level not in MODE_BY_OPT_LEVEL:
        raise ConfigError(f"{nm['optimization_level']}: expected 0, 1, 2 or 3, got {level}")
    if eager:
        return "NONE", level, "--enforce-eager: no CUDA graphs, every token count runs eagerly"
    if v.get("cudagraph_mode") is not None:
        mode = _mode(v["cudagraph_mode"], nm["cudagraph_mode"])
    else:
        mode = MODE_BY_OPT_LEVEL[level]
    return mode, level, ("cudagraph_mode NONE: no CUDA graphs" if mode == "NONE" else None)


def shapes_from_settings(st: Settings, *, usage: str = "server",
                         default_max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE) -> EngineShapes:
    v = dict(st.values)
    names = dict(st.origin)
    cc = dict(v.get("compilation_config") or {})
    cc_name = st.name("compilation_config", "--compilation-config")
    names.setdefault("speculative_config", "--speculative-config")

    # Compilation-config keys and their dedicated flags fill one field; vLLM refuses both at once.
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode"):
        if key in cc and cc[key] is not None:
            if key != "cudagraph_mode" and v.get(key) is not None:
                raise ConfigError(f"{st.name(key, FLAG_NAMES[key])} and {cc_name} {key} are mutually exclusive; "
                                  "vLLM refuses both")
            v[key] = cc[key]
            names[key] = f"{cc_name} {key}"
    pass_cfg = cc.get("pass_config") or {}
    if not isinstance(pass_cfg, dict):
        raise ConfigError(f"{cc_name} pass_config: expected a JSON object, got {pass_cfg!r}")
    for key in ("enable_sp", "enable_sequence_parallelism"):
        if key in pass_cfg:
            v["enable_sp"] = pass_cfg[key]
            names["enable_sp"] = f"{cc_name} pass_config.{key}"
    nm = {**FLAG_NAMES, **names}
    if "enable_sp" in v:
        raise ConfigError(f"{nm['enable_sp']}: vLLM 0.33 has no sequence-parallelism pass (PassConfig has no "
                          "enable_sp and refuses unknown keys; --enable-sequence-parallelism is gone), so it "
                          "refuses this; drop it")

    perf = str(v.get("performance_mode", "balanced")).strip().lower()
    if perf not in PERFORMANCE_MODES:
        raise ConfigError(f"{nm['performance_mode']}: expected one of {', '.join(PERFORMANCE_MODES)}, got {perf!r}")
    tp = _positive(v.get("tensor_parallel_size", 1), nm["tensor_parallel_size"])
    seqs, mnbt, notes = _scheduler_limits(v, nm, usage, perf)
    spec = _spec_decode(v, nm)
    lora = to_bool(v.get("enable_lora") or False, nm["enable_lora"])
    notes += _spec_checks(spec, seqs, mnbt, nm, lora)
    dbo = to_bool(v.get("enable_dbo") or False, nm["enable_dbo"])
    v2, runner_note = _model_runner(st, v, nm, spec, dbo)
    if runner_note:
        notes.append(runner_note)

    eager = to_bool(v.get("enforce_eager") or False, nm["enforce_eager"])
    mode, level, mode_note = _cudagraph_mode(v, nm, eager)
    if mode_note:
        notes.append(mode_note)
    nm["num_speculative_tokens"] = spec.k_name
    sizes: list[int] = []
    config_sizes: list[int] = []
    if mode != "NONE":
        sizes_in = v.get("cudagraph_capture_sizes")
        if sizes_in is not None:
            sizes_in = to_int_list(sizes_in, nm["cudagraph_capture_sizes"])
            bad = [s for s in sizes_in if s < 1]
            if bad:                                  # vLLM does not check; a graph of < 1 token cannot be run
                raise ConfigError(f"{nm['cudagraph_capture_sizes']}: sizes must be >= 1, got {bad}")
        max_cg_in = v.get("max_cudagraph_capture_size")
        if max_cg_in is not None:
            max_cg_in = _positive(max_cg_in, nm["max_cudagraph_capture_size"])
        ceiling = default_max_graph_size
        if ceiling == DEFAULT_MAX_GRAPH_SIZE and _is_dc_blackwell(v.get("gpu_name")):
            ceiling = BLACKWELL_MAX_GRAPH_SIZE
        sizes, config_sizes, more = capture_sizes(
            max_num_seqs=seqs, max_num_batched_tokens=mnbt, num_speculative_tokens=spec.k, cudagraph_mode=mode,
            cudagraph_capture_sizes=sizes_in, max_cudagraph_capture_size=max_cg_in, performance_mode=perf,
            v2_model_runner=v2, default_max_graph_size=ceiling, names=nm)
        notes += more

    resolved: dict[str, Any] = {
        "max_num_seqs": seqs, "max_num_batched_tokens": mnbt, "num_speculative_tokens": spec.k,
        "tensor_parallel_size": tp, "enforce_eager": eager, "cudagraph_mode": mode, "optimization_level": level,
        "performance_mode": perf, "model_runner": "v2" if v2 else "v1", "config_capture_sizes": config_sizes,
        "usage": usage}
    if spec.method:
        resolved["speculative_method"] = spec.method
    if "data_parallel_size" in v:
        resolved["data_parallel_size"] = to_int(v["data_parallel_size"], nm["data_parallel_size"])
    return EngineShapes(
        engine="vllm", formula_version=VLLM_FORMULA_VERSION, tp_size=tp, capture_sizes=tuple(sizes),
        max_num_tokens=mnbt, spec_tokens=spec.k, tokens_per_seq=1 + spec.k, sequence_parallel=False,
        cuda_graphs=bool(sizes), settings=resolved, ignored=st.recorded(), notes=tuple(notes))


def settings_from_object(cfg: Any) -> Settings:
    """Duck-typed read of a `vllm.config.VllmConfig` (or anything shaped like it); vLLM is not imported."""
    st = Settings()

    def take(obj: Any, attr: str, dest: str, label: str) -> None:
        if obj is None:
            return
        val = getattr(obj, attr, None)
        if val is not None:
            st.set(dest, val, label)

    sched = getattr(cfg, "scheduler_config", None)
    take(sched, "max_num_seqs", "max_num_seqs", "scheduler_config.max_num_seqs")
    take(sched, "max_num_batched_tokens", "max_num_batched_tokens", "scheduler_config.max_num_batched_tokens")
    comp = getattr(cfg, "compilation_config", None)
    take(comp, "cudagraph_capture_sizes", "cudagraph_capture_sizes", "compilation_config.cudagraph_capture_sizes")
    take(comp, "max_cudagraph_capture_size", "max_cudagraph_capture_size",
         "compilation_config.max_cudagraph_capture_size")
    take(comp, "cudagraph_mode", "cudagraph_mode", "compilation_config.cudagraph_mode")
    pc = getattr(comp, "pass_config", None) if comp is not None else None
    for attr in ("enable_sp", "enable_sequence_parallelism"):
        if getattr(pc, attr, None):                  # only an older vLLM's object has it set
            st.set("enable_sp", True, f"compilation_config.pass_config.{attr}")
    spec = getattr(cfg, "speculative_config", None)
    if spec is not None and getattr(spec, "num_speculative_tokens", None) is not None:
        method = getattr(spec, "method", None)
        if method is None:                           # not a resolved SpeculativeConfig: just the count
            take(spec, "num_speculative_tokens", "num_speculative_tokens", "speculative_config.num_speculative_tokens")
        else:
            d = {"method": str(method), "num_speculative_tokens": spec.num_speculative_tokens,
                 "model": getattr(spec, "model", None) or "(target)",
                 "parallel_drafting": bool(getattr(spec, "parallel_drafting", False))}
            st.set("speculative_config", d, "speculative_config")
    par = getattr(cfg, "parallel_config", None)
    take(par, "tensor_parallel_size", "tensor_parallel_size", "parallel_config.tensor_parallel_size")
    take(par, "data_parallel_size", "data_parallel_size", "parallel_config.data_parallel_size")
    take(getattr(cfg, "model_config", None), "enforce_eager", "enforce_eager", "model_config.enforce_eager")
    try:                                             # a property on VllmConfig; may log or raise
        v2 = getattr(cfg, "use_v2_model_runner", None)
    except Exception:                                # noqa: BLE001 - a live config we only read
        v2 = None
    if isinstance(v2, bool):
        st.set("use_v2_model_runner", v2, "VllmConfig.use_v2_model_runner")
    return st
