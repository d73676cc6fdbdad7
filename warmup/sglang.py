"""SGLang 0.5.23's CUDA-graph batch sizes and token limits, re-derived without importing SGLang.

Read from the SGLang 0.5.23 wheel:
  * `srt/arg_groups/cuda_graph_hook.py`: `parse_cuda_graph_config` (JSON > per-phase flags > legacy
    `--disable-cuda-graph` > defaults), `disable_breakable_cudagraph_if_incompatible` (DeepSeek V4 turns the
    default breakable prefill graphs off unless the prefill backend is given), `generate_decode_cuda_graph_batch_sizes`
    (max_bs itself appended), `generate_prefill_cuda_graph_batch_sizes` (prefill "bs" are token counts);
  * `srt/arg_groups/memory_hook.py: handle_gpu_memory_settings` (chunked_prefill_size and the decode max_bs by
    GPU memory and tp; a defaulted max_bs is capped at max_running_requests; an explicit bs list sets max_bs;
    prefill max_bs min(8192, chunked_prefill_size) with MLA);
  * `srt/arg_groups/deepseek_v4_hook.py: apply_deepseek_v4_defaults` (max_running_requests 256; speculative
    decoding only EAGLE with topk 1, or DSPARK);
  * `srt/model_executor/cuda_graph_runner.py: get_batch_sizes_to_capture` (mul_base for two-batch overlap and
    attention DP, `num_tokens_per_bs` = draft tokens when verifying).
SGLang captures **request counts** in decode; a kernel sees `bs * tokens_per_bs` tokens, which is what
`EngineShapes.capture_sizes` holds (prefill graphs, when on, capture token counts directly).
The old `--cuda-graph-max-bs` / `--cuda-graph-bs` are refused by SGLang 0.5.23's parser as ambiguous
abbreviations (warmup/engine_argv.py reproduces it).
"""
from __future__ import annotations

from typing import Any, Sequence

from dsv4_jit.errors import ConfigError

from .flags import BOOL, FLOAT, INT, INTLIST, JSON, STR, Flag, FlagTable, Settings, bool_flag_names, to_bool, \
    to_int, to_int_list, to_json_dict
from .shapes import EngineShapes

SGLANG_FORMULA_VERSION = "sglang-0.5.23"
MLA_PREFILL_GRAPH_MAX_TOKENS = 8192   # prefill graph max_bs cap for MLA backends (memory_hook)
DSV4_MAX_RUNNING_REQUESTS = 256       # apply_deepseek_v4_defaults
# SGLang's DeepSeek MTP (EAGLE) auto-choice when the user gives none of steps/topk/draft tokens.
DEFAULT_SPEC_STEPS, DEFAULT_SPEC_TOPK = 3, 1
SPEC_ALGORITHMS = ("EAGLE", "NEXTN", "DSPARK")          # NEXTN aliases EAGLE; DeepSeek V4 takes EAGLE or DSPARK
BACKENDS = ("full", "breakable", "disabled")

FLAGS = FlagTable("sglang", [
    Flag("cuda_graph_bs_decode", INTLIST, ("cuda-graph-bs-decode",)),
    Flag("cuda_graph_max_bs_decode", INT, ("cuda-graph-max-bs-decode",)),
    Flag("cuda_graph_bs_prefill", INTLIST, ("cuda-graph-bs-prefill",)),
    Flag("cuda_graph_max_bs_prefill", INT, ("cuda-graph-max-bs-prefill",)),
    Flag("cuda_graph_backend_decode", STR, ("cuda-graph-backend-decode",)),
    Flag("cuda_graph_backend_prefill", STR, ("cuda-graph-backend-prefill",)),
    Flag("cuda_graph_config", JSON, ("cuda-graph-config",)),
    Flag("disable_cuda_graph", BOOL, ("disable-cuda-graph",)),
    Flag("disable_decode_cuda_graph", BOOL, ("disable-decode-cuda-graph",)),
    Flag("disable_prefill_cuda_graph", BOOL, ("disable-prefill-cuda-graph",)),
    Flag("disable_cuda_graph_padding", BOOL, ("disable-cuda-graph-padding",)),
    Flag("chunked_prefill_size", INT, ("chunked-prefill-size",)),
    Flag("max_prefill_tokens", INT, ("max-prefill-tokens",)),
    Flag("max_running_requests", INT, ("max-running-requests",)),
    Flag("tp_size", INT, ("tp-size", "tensor-parallel-size")),
    Flag("dp_size", INT, ("dp-size", "data-parallel-size")),
    Flag("attn_dp_size", INT, ("attn-dp-size", "attention-data-parallel-size")),
    Flag("enable_dp_attention", BOOL, ("enable-dp-attention",)),
    Flag("enable_two_batch_overlap", BOOL, ("enable-two-batch-overlap",)),
    Flag("speculative_algorithm", STR, ("speculative-algorithm",)),
    Flag("speculative_num_steps", INT, ("speculative-num-steps",)),
    Flag("speculative_eagle_topk", INT, ("speculative-eagle-topk",)),
    Flag("speculative_num_draft_tokens", INT, ("speculative-num-draft-tokens",)),
    Flag("gpu_memory_gib", FLOAT, ("gpu-memory-gib",)),     # ours: the serving GPU's memory
])

# SGLang 0.5.23 flags that change graph, batch or token counts in ways this formula does not follow: refused
# when set, never ignored (dest -> why).
UNMODELLED = {
    "pp_size": "pipeline parallelism changes the prefill graph defaults and the per-stage batches",
    "disaggregation_mode": "prefill/decode disaggregation turns one phase's graphs off",
    "max_total_tokens": "it caps the prefill graph sizes by the KV pool",
    "enable_torch_compile": "torch.compile graphs capture their own batch sizes (torch_compile_max_bs)",
    "torch_compile_max_bs": "torch.compile graphs capture their own batch sizes",
    "cuda_graph_max_seq_len_prefill": "it changes which prefill batches replay a graph",
    "cuda_graph_prefill_max_context": "it changes the prefill graphs' context buckets",
    "enable_mixed_chunk": "mixed chunks add decode tokens to a prefill chunk",
    "moe_a2a_backend": "DeepEP aligns the prefill graph sizes to multiples of 8",
    "speculative_dspark_align_verify_tokens_to_graph_tier": "it changes the verify token counts",
    "attn_cp_size": "context parallelism splits the tokens of a forward",
    "dcp_size": "decode context parallelism splits the tokens of a forward",
    "enable_prefill_cp": "prefill context parallelism splits the tokens of a forward",
}
# SGLang 0.5.23's own defaults of those flags (a live ServerArgs holds them): they change nothing.
UNMODELLED_DEFAULTS = {"pp_size": 1, "disaggregation_mode": "null", "moe_a2a_backend": "none", "attn_cp_size": 1,
                       "dcp_size": 1, "torch_compile_max_bs": 32}

FLAG_NAMES = {f.dest: f.display for f in FLAGS.by_dest.values()}


def memory_defaults(gpu_memory_gib: float | None, tp_size: int) -> tuple[int, int, str | None]:
    """(chunked_prefill_size, decode cuda-graph max_bs, note) as `handle_gpu_memory_settings` picks them.

    With no GPU information we assume the H100/H200 tier and say so."""
    note = None
    if gpu_memory_gib is None:
        gpu_memory_gib = 80.0
        note = ("SGLang defaults assume an H100/H200-class GPU (chunked_prefill_size 8192, decode cuda-graph max_bs "
                "256 at tp<4 else 512); pass --gpu-memory-gib or --cuda-graph-max-bs-decode to change")
    if gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib}")
    small_tp = tp_size < 4
    if gpu_memory_gib < 20:
        return 2048, 8, note
    if gpu_memory_gib < 35:
        return 4096, (48 if small_tp else 160), note
    if gpu_memory_gib < 60:
        return 4096, (32 if small_tp else 160), note
    if gpu_memory_gib < 160:          # H100 / A100-80G (< 90) and H20 / H200 (< 160) share values
        return 8192, (256 if small_tp else 512), note
    return 16384, 512, note            # B200, MI300


def generate_batch_sizes(max_bs: int, *, spec: bool, disable_padding: bool) -> list[int]:
    """`generate_decode_cuda_graph_batch_sizes`: request counts up to max_bs, max_bs itself included."""
    if disable_padding:
        bs = list(range(1, max_bs + 1))
    elif not spec:
        bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + \
            list(range(512, max_bs + 1, 32))
    else:   # spec decode needs more graph memory per bs, so the grid is finer at small bs
        bs = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + \
            list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16))
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    return bs


def prefill_token_sizes(max_bs: int) -> list[int]:
    """`generate_prefill_cuda_graph_batch_sizes`: prefill graph token counts up to max_bs."""
    t = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + \
        list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512))
    return [x for x in t if x <= max_bs]


def runner_batch_sizes(bs: Sequence[int], *, tokens_per_bs: int, max_running_requests: int | None,
                       two_batch_overlap: bool, attn_tp_size: int) -> list[int]:
    """`get_batch_sizes_to_capture`: keep sizes the runner can actually capture."""
    mul_base = 1
    tpb = tokens_per_bs
    if two_batch_overlap:
        mul_base *= 2
        tpb = 1                       # SGLang: TBO filters on requests, not tokens
    if attn_tp_size > 1:              # DP attention gathers buffers across the attention-TP group
        mul_base *= attn_tp_size
    out = list(bs)
    if max_running_requests is not None:
        cap = -(-max_running_requests // mul_base) * mul_base
        if max(out) > cap:
            out.append(cap)
        out = [b for b in out if b <= cap]
    return sorted({b for b in out if (b * tpb) % mul_base == 0})


# ---- settings -> EngineShapes --------------------------------------------------------------------

def _pos(v: Any, name: str, minimum: int = 1) -> int:
    i = to_int(v, name)
    if i < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {i}")
    return i


def _phase_settings(v: dict, nm: dict) -> tuple[dict, dict, set]:
    """`parse_cuda_graph_config`: per-phase {backend, max_bs, bs} and which keys the user set."""
    decode: dict[str, Any] = {"backend": "full", "max_bs": None, "bs": None}
    prefill: dict[str, Any] = {"backend": "breakable", "max_bs": None, "bs": None}
    phases = {"decode": decode, "prefill": prefill}
    locked: set[tuple[str, str]] = set()

    def put(phase: str, key: str, value: Any) -> None:
        phases[phase][key] = value
        locked.add((phase, key))

    if to_bool(v.get("disable_cuda_graph") or False, nm["disable_cuda_graph"]):
        put("decode", "backend", "disabled")
        put("prefill", "backend", "disabled")
    for phase in phases:
        if to_bool(v.get(f"disable_{phase}_cuda_graph") or False, nm[f"disable_{phase}_cuda_graph"]):
            put(phase, "backend", "disabled")
        if v.get(f"cuda_graph_backend_{phase}") is not None:
            put(phase, "backend", str(v[f"cuda_graph_backend_{phase}"]))
        if v.get(f"cuda_graph_max_bs_{phase}") is not None:
            put(phase, "max_bs", _pos(v[f"cuda_graph_max_bs_{phase}"], nm[f"cuda_graph_max_bs_{phase}"]))
        if v.get(f"cuda_graph_bs_{phase}") is not None:
            put(phase, "bs", to_int_list(v[f"cuda_graph_bs_{phase}"], nm[f"cuda_graph_bs_{phase}"]))
    if v.get("cuda_graph_config") is not None:
        cfg_name = nm["cuda_graph_config"]
        for phase, settings in to_json_dict(v["cuda_graph_config"], cfg_name).items():
            if phase not in phases:
                raise ConfigError(f"{cfg_name}: unknown phase {phase!r}, expected decode or prefill")
            if not isinstance(settings, dict):
                continue
            for key, value in settings.items():
                if key in ("backend", "max_bs", "bs"):
                    put(phase, key, value)
                elif value is not None:
                    raise ConfigError(f"{cfg_name} {phase}.{key}: not followed by dsv4-jit's {SGLANG_FORMULA_VERSION} "
                                      "formula (it can change which token counts a graph holds); drop it")
    for phase, cfg in phases.items():
        if cfg["backend"] not in BACKENDS:
            raise ConfigError(f"--cuda-graph-config[{phase}].backend={cfg['backend']!r} not allowed; "
                              f"allowed: {BACKENDS} (SGLang refuses it)")
        if cfg["bs"] is not None:
            cfg["bs"] = to_int_list(cfg["bs"], f"cuda_graph_config[{phase}].bs")
            if not cfg["bs"] or min(cfg["bs"]) < 1:
                raise ConfigError(f"cuda_graph_config[{phase}].bs: batch sizes must be >= 1, got {cfg['bs']}")
    return decode, prefill, locked


def _check_unmodelled(v: dict, nm: dict) -> None:
    for dest, why in UNMODELLED.items():
        if dest in v and v[dest] not in (None, False, UNMODELLED_DEFAULTS.get(dest)):
            raise ConfigError(f"{nm.get(dest, '--' + dest.replace('_', '-'))}={v[dest]!r}: not followed by "
                              f"dsv4-jit's {SGLANG_FORMULA_VERSION} formula ({why}); drop it to plan")


def _speculative(v: dict, nm: dict, notes: list[str]) -> tuple[str | None, int]:
    """(algorithm, tokens per request in a verify step). DeepSeek V4 takes EAGLE with topk 1, or DSPARK."""
    algo = v.get("speculative_algorithm")
    if algo is None:
        if any(v.get(k) is not None for k in ("speculative_num_steps", "speculative_num_draft_tokens")):
            raise ConfigError(f"{nm['speculative_num_draft_tokens']} / {nm['speculative_num_steps']} given "
                              f"without {nm['speculative_algorithm']}")
        return None, 1
    algo = str(algo).upper()
    if algo == "NEXTN":
        algo = "EAGLE"                                 # speculative_hook: NEXTN aliases EAGLE
    if algo not in ("EAGLE", "DSPARK"):
        raise ConfigError(f"{nm['speculative_algorithm']}={algo}: SGLang refuses it for DeepSeek V4 "
                          "(only EAGLE and DSPARK speculative algorithms are supported)")
    steps = v.get("speculative_num_steps")
    topk = v.get("speculative_eagle_topk")
    draft = v.get("speculative_num_draft_tokens")
    steps = None if steps is None else _pos(steps, nm["speculative_num_steps"])
    topk = None if topk is None else _pos(topk, nm["speculative_eagle_topk"])
    if algo == "EAGLE" and topk not in (None, 1):
        raise ConfigError(f"{nm['speculative_eagle_topk']}={topk}: SGLang refuses it for DeepSeek V4 (only EAGLE "
                          "speculative algorithm with topk == 1 is supported)")
    if draft is None:
        draft = (steps or DEFAULT_SPEC_STEPS) + 1
        if steps is None:
            notes.append(f"speculative decoding: assuming SGLang's DeepSeek MTP defaults "
                         f"(steps={DEFAULT_SPEC_STEPS}, topk={DEFAULT_SPEC_TOPK}, draft tokens={draft})")
    return algo, _pos(draft, nm["speculative_num_draft_tokens"])


def shapes_from_settings(st: Settings, *, use_mla: bool = True) -> EngineShapes:
    v = st.values
    nm = {**FLAG_NAMES, **st.origin}
    notes: list[str] = []
    _check_unmodelled(v, nm)
    tp = _pos(v.get("tp_size", 1), nm["tp_size"])
    dp = _pos(v.get("dp_size", 1), nm["dp_size"])
    attn_dp = _pos(v.get("attn_dp_size", 1), nm["attn_dp_size"])
    if to_bool(v.get("enable_dp_attention") or False, nm["enable_dp_attention"]) and attn_dp == 1:
        attn_dp = dp                                  # the deprecated spelling of --attn-dp-size <dp-size>
    if tp % attn_dp:
        raise ConfigError(f"{nm['attn_dp_size']}={attn_dp} must divide {nm['tp_size']}={tp}")
    attn_tp = tp // attn_dp if attn_dp > 1 else 1
    tbo = to_bool(v.get("enable_two_batch_overlap") or False, nm["enable_two_batch_overlap"])

    gib = v.get("gpu_memory_gib")
    d_chunk, d_max_bs, d_note = memory_defaults(None if gib is None else float(gib), tp)
    algo, tokens_per_bs = _speculative(v, nm, notes)
    spec = algo is not None

    chunk = to_int(v.get("chunked_prefill_size", d_chunk), nm["chunked_prefill_size"])
    if chunk == 0 or chunk < -1:
        raise ConfigError(f"{nm['chunked_prefill_size']} must be > 0, or -1 to disable chunking; got {chunk}")
    max_prefill = _pos(v.get("max_prefill_tokens", 16384), nm["max_prefill_tokens"])
    if chunk == -1:
        notes.append(f"chunked prefill disabled: prefill batches are planned up to max_prefill_tokens="
                     f"{max_prefill}; a single longer prompt would exceed the plan")
    prefill_max = max_prefill if chunk == -1 else chunk
    mrr_given = v.get("max_running_requests")
    mrr = DSV4_MAX_RUNNING_REQUESTS if mrr_given is None else _pos(mrr_given, nm["max_running_requests"])
    no_pad = to_bool(v.get("disable_cuda_graph_padding") or False, nm["disable_cuda_graph_padding"])

    decode, prefill, locked = _phase_settings(v, nm)
    if d_note and (decode["max_bs"] is None and decode["bs"] is None or "chunked_prefill_size" not in v):
        notes.append(d_note)
    if decode["max_bs"] is None:                      # a defaulted max_bs is capped at a given max_running_requests
        decode["max_bs"] = d_max_bs if mrr_given is None else min(d_max_bs, mrr)
    if decode["bs"] is None:
        decode["bs"] = generate_batch_sizes(decode["max_bs"], spec=spec, disable_padding=no_pad)
    else:
        decode["max_bs"] = max(decode["bs"])
    if ("prefill", "backend") not in locked and prefill["backend"] == "breakable":
        prefill["backend"] = "disabled"               # DeepSeek V4: breakable prefill graphs off by default
        notes.append("prefill CUDA graphs off: SGLang turns breakable prefill graphs off for DeepSeek V4 "
                     "unless --cuda-graph-backend-prefill is given")
    if prefill["max_bs"] is None:
        prefill["max_bs"] = min(MLA_PREFILL_GRAPH_MAX_TOKENS, chunk) if use_mla and chunk > 0 else prefill_max
    if prefill["bs"] is None:
        prefill["bs"] = prefill_token_sizes(prefill["max_bs"])

    bs: list[int] = []
    if decode["backend"] == "disabled":
        notes.append("decode CUDA graphs off: every decode batch runs eagerly")
    else:
        bs = runner_batch_sizes(sorted(set(decode["bs"])), tokens_per_bs=tokens_per_bs, max_running_requests=mrr,
                                two_batch_overlap=tbo, attn_tp_size=attn_tp)
        if not bs:
            raise ConfigError(f"no decode CUDA-graph batch size is left after the runner's filters (mul_base from "
                              f"two-batch overlap / attention DP); adjust {nm['cuda_graph_bs_decode']}")
    tokens = sorted({b * tokens_per_bs for b in bs})
    pw = sorted(set(prefill["bs"])) if prefill["backend"] != "disabled" else []

    # Largest forward: a prefill chunk, or the widest decode/verify batch (graph or eager).
    decode_max = max(max(tokens, default=0), mrr * tokens_per_bs)
    if mrr_given is None:
        notes.append(f"max_running_requests {DSV4_MAX_RUNNING_REQUESTS}: SGLang's DeepSeek V4 default")
    max_tokens = max(prefill_max, decode_max, max(pw, default=0))

    resolved = {"tp_size": tp, "dp_size": dp, "attn_dp_size": attn_dp, "attn_tp_size": attn_tp,
                "enable_two_batch_overlap": tbo, "chunked_prefill_size": chunk,
                "cuda_graph_backend_decode": decode["backend"], "cuda_graph_max_bs_decode": decode["max_bs"],
                "cuda_graph_bs_decode": sorted(set(decode["bs"])), "captured_bs_decode": list(bs),
                "cuda_graph_backend_prefill": prefill["backend"],
                "cuda_graph_max_bs_prefill": prefill["max_bs"], "disable_cuda_graph_padding": no_pad,
                "speculative_algorithm": algo, "speculative_num_draft_tokens": tokens_per_bs if spec else None,
                "max_running_requests": mrr}
    return EngineShapes(
        engine="sglang", formula_version=SGLANG_FORMULA_VERSION, tp_size=tp, capture_sizes=tuple(sorted(set(tokens) | set(pw))),
        max_num_tokens=max_tokens, spec_tokens=(tokens_per_bs - 1) if spec else 0,
        tokens_per_seq=tokens_per_bs, capture_batch_sizes=tuple(bs), piecewise_sizes=tuple(pw),
        sequence_parallel=False, cuda_graphs=bool(bs or pw), settings=resolved, ignored=st.recorded(),
        notes=tuple(notes))


_OBJECT_ATTRS = tuple(f.dest for f in FLAGS.by_dest.values() if f.dest != "gpu_memory_gib") + tuple(UNMODELLED)


def settings_from_object(args: Any) -> Settings:
    """Duck-typed read of an `sglang.srt.server_args.ServerArgs` (its input fields); SGLang is not imported."""
    st = Settings()
    for attr in _OBJECT_ATTRS:
        val = getattr(args, attr, None)
        if val is not None:
            st.set(attr, val, f"ServerArgs.{attr}")
    return st
