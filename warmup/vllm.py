"""vLLM's CUDA-graph capture sizes and token limits, re-derived without importing vLLM.

The formula follows the vLLM source as read for /work/shared/reference/anchors_cache.md section 6
(sources read 2026-08; the reference does not name a release, so neither do we):
  * `vllm/config/vllm.py: VllmConfig._set_cudagraph_sizes`
  * `vllm/config/compilation.py: CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`
    (called by the model runner when speculative decoding is on)
  * `vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults`
Later vLLM main also appends `max_num_batched_tokens` when it is below the capture ceiling, appends
request-count-scaled decode sizes, and raises the ceiling to 1024 on datacenter Blackwell. None of that
changes `token_counts()` (always 1..max_num_batched_tokens), only which capture sizes are listed;
pass `default_max_graph_size=1024` to `vllm_shapes` to model the Blackwell ceiling.
"""
from __future__ import annotations

from typing import Any, Sequence

from dsv4_jit.errors import ConfigError

from .flags import (BOOL, FLOAT, INT, INTLIST, JSON, STR, Flag, FlagTable, Settings, bool_flag_names,
                    to_bool, to_int, to_int_list)
from .shapes import EngineShapes

VLLM_FORMULA_VERSION = "vllm-src-2026-08"   # see module docstring: source read for the reference
DEFAULT_MAX_GRAPH_SIZE = 512                # vLLM's capture ceiling (1024 on sm_100 in later main)

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_MODE_BY_INT = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}

FLAGS = FlagTable("vllm", [
    Flag("max_num_seqs", INT, ("max-num-seqs",)),
    Flag("max_num_batched_tokens", INT, ("max-num-batched-tokens",)),
    Flag("max_cudagraph_capture_size", INT, ("max-cudagraph-capture-size",)),
    Flag("cudagraph_capture_sizes", INTLIST, ("cudagraph-capture-sizes", "cuda-graph-sizes")),
    Flag("compilation_config", JSON, ("compilation-config", "O", "cc")),
    Flag("speculative_config", JSON, ("speculative-config",)),
    Flag("num_speculative_tokens", INT, ("num-speculative-tokens",)),
    Flag("tensor_parallel_size", INT, ("tensor-parallel-size", "tp", "tp-size")),
    Flag("data_parallel_size", INT, ("data-parallel-size", "dp", "dp-size")),
    Flag("enforce_eager", BOOL, bool_flag_names("enforce-eager")),
    Flag("cudagraph_mode", STR, ("cudagraph-mode",)),
    Flag("enable_sp", BOOL, bool_flag_names("enable-sequence-parallelism", "enable-sp")),
    # Ours, not vLLM's: the serving GPU, for get_batch_defaults.
    Flag("gpu_memory_gib", FLOAT, ("gpu-memory-gib",)),
    Flag("gpu_name", STR, ("gpu-name",)),
], known_bools=(
    "trust-remote-code", "enable-prefix-caching", "no-enable-prefix-caching", "enable-chunked-prefill",
    "no-enable-chunked-prefill", "enable-expert-parallel", "disable-log-requests", "disable-log-stats",
    "enable-auto-tool-choice", "enable-eplb", "async-scheduling", "no-async-scheduling", "enable-dbo",
    "disable-custom-all-reduce", "enable-lora", "headless", "enable-log-requests", "skip-tokenizer-init",
    "disable-cascade-attn", "enable-prompt-tokens-details", "enable-force-include-usage",
))

FLAG_NAMES = {f.dest: f.display for f in FLAGS.by_dest.values()}


def batch_defaults(gpu_memory_gib: float | None, gpu_name: str | None, usage: str = "server"
                   ) -> tuple[int, int, str | None]:
    """(max_num_seqs, max_num_batched_tokens, note) as vLLM's `get_batch_defaults` picks them.

    With no GPU information we assume the large-GPU (>= 70 GiB, not A100) server defaults and say so."""
    if usage not in ("server", "llm"):
        raise ConfigError(f"usage must be 'server' (vllm serve) or 'llm' (LLM class), got {usage!r}")
    note = None
    if gpu_memory_gib is None and gpu_name is None:
        large = True
        note = ("vLLM defaults assume a >= 70 GiB non-A100 GPU (H100/H200/B200 class); "
                "pass --gpu-memory-gib for a smaller GPU or set --max-num-seqs/--max-num-batched-tokens")
    else:
        if gpu_memory_gib is not None and gpu_memory_gib <= 0:
            raise ConfigError(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib}")
        mem_ok = gpu_memory_gib is None or gpu_memory_gib >= 70
        large = mem_ok and "a100" not in (gpu_name or "").lower()
    if large:
        return 1024, (8192 if usage == "server" else 16384), note
    return 256, (2048 if usage == "server" else 8192), note


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0,
                  tp_size: int = 1, enable_sp: bool = False, cudagraph_capture_sizes: Sequence[int] | None = None,
                  max_cudagraph_capture_size: int | None = None, cuda_graphs: bool = True,
                  default_max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE,
                  names: dict[str, str] | None = None) -> tuple[list[int], list[str]]:
    """vLLM's final capture sizes (tokens) and notes. Pure; inputs already validated as ints."""
    nm = {**FLAG_NAMES, **(names or {})}
    notes: list[str] = []
    if not cuda_graphs:
        return [], notes
    q = 1 + num_speculative_tokens                      # uniform decode query length
    sp = tp_size > 1 and enable_sp
    max_cg = max_cudagraph_capture_size
    if max_cg is None:
        max_cg = min(max_num_seqs * q * 2, default_max_graph_size)
    max_cg = min(max_cg, max_num_batched_tokens)
    if max_cg < 1:
        raise ConfigError(f"{nm['max_cudagraph_capture_size']} must be >= 1 when CUDA graphs are on, got {max_cg}")

    if cudagraph_capture_sizes is not None:
        if len(cudagraph_capture_sizes) == 0:
            raise ConfigError(f"{nm['cudagraph_capture_sizes']}: empty list; use cudagraph_mode NONE or "
                              "--enforce-eager to turn CUDA graphs off")
        sizes = sorted({s for s in cudagraph_capture_sizes if s <= max_num_batched_tokens})
        dropped = sorted({s for s in cudagraph_capture_sizes if s > max_num_batched_tokens})
        if dropped:
            notes.append(f"capture sizes {dropped} dropped: above max_num_batched_tokens={max_num_batched_tokens}")
    else:
        sizes = [s for s in (1, 2, 4) if s <= max_cg]
        if max_cg >= 8:
            sizes += range(8, min(max_cg + 1, 256), 8)
        if max_cg >= 256:
            sizes += range(256, max_cg + 1, 16)

    if sp:
        kept = [s for s in sizes if s % tp_size == 0]
        if len(kept) < len(sizes):
            notes.append(f"sequence parallelism: sizes not divisible by tp={tp_size} dropped")
        sizes = kept

    valid_max = sizes[-1] if sizes else 0
    if max_cudagraph_capture_size is not None and max_cudagraph_capture_size != valid_max:
        if cudagraph_capture_sizes is not None:
            raise ConfigError(
                f"{nm['max_cudagraph_capture_size']}={max_cudagraph_capture_size} contradicts "
                f"{nm['cudagraph_capture_sizes']} (largest usable size {valid_max}); give one of them")
        notes.append(f"max_cudagraph_capture_size truncated to {valid_max}, as vLLM does")
    max_cg = valid_max
    if not sizes:
        raise ConfigError(f"no CUDA-graph capture size is left (all above {nm['max_num_batched_tokens']}"
                          f"{' or not divisible by tp' if sp else ''}); adjust "
                          f"{nm['cudagraph_capture_sizes']} or {nm['max_num_batched_tokens']}")

    # Model runner: decode batches are q tokens per request, so sizes round up to multiples of q
    # (or of max(q, tp) with sequence parallelism).
    multiple = q
    if sp:
        multiple = max(q, tp_size)
        if multiple % q or multiple % tp_size:
            raise ConfigError(
                f"{nm['num_speculative_tokens']}={q - 1}: no size is a multiple of both {q} "
                f"(num_speculative_tokens + 1) and tp={tp_size} under sequence parallelism; change "
                f"num_speculative_tokens or disable sequence parallelism")
    if multiple > 1:
        rounded = sorted({_round_up(s, multiple) for s in sizes if _round_up(s, multiple) <= max_cg})
        if not rounded and multiple <= max_cg:
            rounded = [multiple]
        if not rounded:
            raise ConfigError(
                f"no capture size left after rounding to a multiple of {multiple}: raise "
                f"{nm['max_cudagraph_capture_size']} ({max_cg}) or lower {nm['num_speculative_tokens']} ({q - 1})")
        sizes = rounded
    return list(sizes), notes


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


def shapes_from_settings(st: Settings, *, usage: str = "server",
                         default_max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE) -> EngineShapes:
    v = dict(st.values)
    notes: list[str] = []
    names = dict(st.origin)
    cc = dict(v.get("compilation_config") or {})
    cc_name = st.name("compilation_config", "--compilation-config")
    spec = dict(v.get("speculative_config") or {})
    spec_name = st.name("speculative_config", "--speculative-config")

    # Compilation-config keys override/complement the dedicated flags (vLLM writes both into one object).
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode"):
        if key in cc and cc[key] is not None:
            v[key] = cc[key]
            names[key] = f"{cc_name} {key}"
    pass_cfg = cc.get("pass_config") or {}
    if not isinstance(pass_cfg, dict):
        raise ConfigError(f"{cc_name} pass_config: expected a JSON object, got {pass_cfg!r}")
    for key in ("enable_sp", "enable_sequence_parallelism"):
        if key in pass_cfg:
            v["enable_sp"] = pass_cfg[key]
            names["enable_sp"] = f"{cc_name} pass_config.{key}"
    if "num_speculative_tokens" in spec:
        v["num_speculative_tokens"] = spec["num_speculative_tokens"]
        names["num_speculative_tokens"] = f"{spec_name} num_speculative_tokens"
    elif spec and spec.get("method") and "num_speculative_tokens" not in v:
        raise ConfigError(f"{spec_name}: gives method {spec.get('method')!r} but no num_speculative_tokens")
    nm = {**FLAG_NAMES, **names}

    gib = v.get("gpu_memory_gib")
    gib = None if gib is None else float(gib)
    d_seqs, d_tokens, d_note = batch_defaults(gib, v.get("gpu_name"), usage)
    seqs_set, tokens_set = "max_num_seqs" in v, "max_num_batched_tokens" in v
    if (not seqs_set or not tokens_set) and d_note:
        notes.append(d_note)
    max_num_seqs = _positive(v.get("max_num_seqs", d_seqs), nm["max_num_seqs"])
    mnbt = _positive(v.get("max_num_batched_tokens", d_tokens), nm["max_num_batched_tokens"])
    k = to_int(v.get("num_speculative_tokens") or 0, nm["num_speculative_tokens"])
    if k < 0:
        raise ConfigError(f"{nm['num_speculative_tokens']} must be >= 0, got {k}")
    tp = _positive(v.get("tensor_parallel_size", 1), nm["tensor_parallel_size"])
    if "data_parallel_size" in v:
        _positive(v["data_parallel_size"], nm["data_parallel_size"])
    enable_sp = to_bool(v.get("enable_sp") or False, nm["enable_sp"])
    eager = to_bool(v.get("enforce_eager") or False, nm["enforce_eager"])
    mode = _mode(v["cudagraph_mode"], nm["cudagraph_mode"]) if v.get("cudagraph_mode") is not None else None
    sizes_in = v.get("cudagraph_capture_sizes")
    if sizes_in is not None:
        sizes_in = to_int_list(sizes_in, nm["cudagraph_capture_sizes"])
        bad = [s for s in sizes_in if s < 1]
        if bad:
            raise ConfigError(f"{nm['cudagraph_capture_sizes']}: sizes must be >= 1, got {bad}")
    max_cg_in = v.get("max_cudagraph_capture_size")
    if max_cg_in is not None:
        max_cg_in = _positive(max_cg_in, nm["max_cudagraph_capture_size"])

    # Contradictions vLLM itself rejects, plus spec decode that can never fill max_num_seqs.
    if mnbt < max_num_seqs:
        raise ConfigError(f"{nm['max_num_batched_tokens']}={mnbt} is smaller than {nm['max_num_seqs']}="
                          f"{max_num_seqs}; vLLM rejects this (raise the first or lower the second)")
    if k and mnbt <= k:
        raise ConfigError(f"{nm['max_num_batched_tokens']}={mnbt} cannot hold one decode step of "
                          f"1+{nm['num_speculative_tokens']}={1 + k} tokens")
    if k and mnbt < max_num_seqs * (1 + k):
        msg = (f"{nm['max_num_batched_tokens']}={mnbt} < {nm['max_num_seqs']}={max_num_seqs} x "
               f"(1+num_speculative_tokens={1 + k}) = {max_num_seqs * (1 + k)}: at most "
               f"{mnbt // (1 + k)} requests can decode per step")
        if seqs_set and tokens_set:
            raise ConfigError(msg + "; raise --max-num-batched-tokens or lower --max-num-seqs")
        notes.append(msg + " (from defaults)")

    cuda_graphs = not eager and mode != "NONE"
    if eager:
        notes.append("--enforce-eager: no CUDA graphs, every token count runs eagerly")
    elif mode == "NONE":
        notes.append("cudagraph_mode NONE: no CUDA graphs")
    sizes, more = capture_sizes(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt, num_speculative_tokens=k, tp_size=tp,
        enable_sp=enable_sp, cudagraph_capture_sizes=sizes_in, max_cudagraph_capture_size=max_cg_in,
        cuda_graphs=cuda_graphs, default_max_graph_size=default_max_graph_size, names=nm)
    notes += more
    if enable_sp and tp == 1:
        notes.append("sequence parallelism has no effect at tp=1")

    resolved = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": mnbt, "num_speculative_tokens": k,
                "tensor_parallel_size": tp, "enable_sp": enable_sp, "enforce_eager": eager,
                "cudagraph_mode": mode or "default", "usage": usage}
    if spec.get("method"):
        resolved["speculative_method"] = str(spec["method"])
    if "data_parallel_size" in v:
        resolved["data_parallel_size"] = to_int(v["data_parallel_size"], nm["data_parallel_size"])
    return EngineShapes(
        engine="vllm", formula_version=VLLM_FORMULA_VERSION, tp_size=tp, capture_sizes=tuple(sizes),
        max_num_tokens=mnbt, spec_tokens=k, tokens_per_seq=1 + k, sequence_parallel=enable_sp and tp > 1,
        cuda_graphs=cuda_graphs, settings=resolved, ignored=st.recorded(), notes=tuple(notes))


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
        take(pc, attr, "enable_sp", f"compilation_config.pass_config.{attr}")
    spec = getattr(cfg, "speculative_config", None)
    take(spec, "num_speculative_tokens", "num_speculative_tokens", "speculative_config.num_speculative_tokens")
    par = getattr(cfg, "parallel_config", None)
    take(par, "tensor_parallel_size", "tensor_parallel_size", "parallel_config.tensor_parallel_size")
    take(par, "data_parallel_size", "data_parallel_size", "parallel_config.data_parallel_size")
    take(getattr(cfg, "model_config", None), "enforce_eager", "enforce_eager", "model_config.enforce_eager")
    return st
