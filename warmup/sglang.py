"""SGLang's CUDA-graph batch sizes and token limits, re-derived without importing SGLang.

Follows the SGLang source as read for /work/shared/reference/anchors_cache.md section 6 (read 2026-08):
  * `python/sglang/srt/server_args.py`: `cuda_graph_max_bs` / `chunked_prefill_size` defaults by GPU
    memory and tp, `_generate_cuda_graph_batch_sizes`, `_generate_piecewise_cuda_graph_tokens`;
  * `python/sglang/srt/model_executor/cuda_graph_runner.py: get_batch_sizes_to_capture` (mul_base for
    two-batch overlap and DP attention, `num_tokens_per_bs` = draft tokens when verifying).
SGLang captures **request counts**; a kernel sees `bs * tokens_per_bs` tokens, which is what
`EngineShapes.capture_sizes` holds.
"""
from __future__ import annotations

from typing import Any, Sequence

from dsv4_jit.errors import ConfigError

from .flags import BOOL, FLOAT, INT, INTLIST, STR, Flag, FlagTable, Settings, bool_flag_names, to_bool, to_int, \
    to_int_list
from .shapes import EngineShapes

SGLANG_FORMULA_VERSION = "sglang-src-2026-08"
MLA_PIECEWISE_MAX_TOKENS = 2048     # SGLang caps piecewise graphs at 2048 tokens for MLA backends
# SGLang's DeepSeek MTP (NEXTN) auto-choice when the user gives none of steps/topk/draft tokens.
DEFAULT_SPEC_STEPS, DEFAULT_SPEC_TOPK = 3, 1
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "MTP", "STANDALONE", "NGRAM")

FLAGS = FlagTable("sglang", [
    Flag("cuda_graph_bs", INTLIST, ("cuda-graph-bs",)),
    Flag("cuda_graph_max_bs", INT, ("cuda-graph-max-bs",)),
    Flag("disable_cuda_graph", BOOL, bool_flag_names("disable-cuda-graph")),
    Flag("disable_cuda_graph_padding", BOOL, bool_flag_names("disable-cuda-graph-padding")),
    Flag("chunked_prefill_size", INT, ("chunked-prefill-size",)),
    Flag("max_prefill_tokens", INT, ("max-prefill-tokens",)),
    Flag("max_running_requests", INT, ("max-running-requests",)),
    Flag("tp_size", INT, ("tp-size", "tp", "tensor-parallel-size")),
    Flag("dp_size", INT, ("dp-size", "dp", "data-parallel-size")),
    Flag("enable_dp_attention", BOOL, bool_flag_names("enable-dp-attention")),
    Flag("enable_two_batch_overlap", BOOL, bool_flag_names("enable-two-batch-overlap", "tbo")),
    Flag("speculative_algorithm", STR, ("speculative-algorithm", "speculative-algo")),
    Flag("speculative_num_steps", INT, ("speculative-num-steps",)),
    Flag("speculative_eagle_topk", INT, ("speculative-eagle-topk",)),
    Flag("speculative_num_draft_tokens", INT, ("speculative-num-draft-tokens",)),
    Flag("enable_piecewise_cuda_graph", BOOL, bool_flag_names("enable-piecewise-cuda-graph")),
    Flag("piecewise_cuda_graph_max_tokens", INT, ("piecewise-cuda-graph-max-tokens",)),
    Flag("piecewise_cuda_graph_tokens", INTLIST, ("piecewise-cuda-graph-tokens",)),
    Flag("gpu_memory_gib", FLOAT, ("gpu-memory-gib",)),     # ours: the serving GPU's memory
], known_bools=(
    "trust-remote-code", "enable-metrics", "disable-radix-cache", "enable-torch-compile", "enable-ep-moe",
    "enable-deepep-moe", "skip-server-warmup", "enable-cache-report", "log-requests", "enable-mixed-chunk",
    "enable-dp-lm-head", "disable-overlap-schedule", "enable-nan-detection", "enable-p2p-check",
    "disable-custom-all-reduce", "enable-eplb", "skip-tokenizer-init", "enable-symm-mem",
))

FLAG_NAMES = {f.dest: f.display for f in FLAGS.by_dest.values()}


def memory_defaults(gpu_memory_gib: float | None, tp_size: int) -> tuple[int, int, str | None]:
    """(chunked_prefill_size, cuda_graph_max_bs, note) as SGLang's server_args picks them.

    With no GPU information we assume the H100/H200 tier (the large-GPU server default) and say so."""
    note = None
    if gpu_memory_gib is None:
        gpu_memory_gib = 80.0
        note = ("SGLang defaults assume an H100/H200-class GPU (chunked_prefill_size 8192, cuda_graph_max_bs "
                "256 at tp<4 else 512); pass --gpu-memory-gib or --cuda-graph-max-bs to change")
    if gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib}")
    small_tp = tp_size < 4
    if gpu_memory_gib < 20:
        return 2048, 8, note
    if gpu_memory_gib < 35:
        return 2048, (24 if small_tp else 80), note
    if gpu_memory_gib < 60:
        return 4096, (32 if small_tp else 160), note
    if gpu_memory_gib < 160:          # H100 / A100-80G (< 90) and H20 / H200 (< 160) share values
        return 8192, (256 if small_tp else 512), note
    return 16384, 512, note            # B200, MI300


def generate_batch_sizes(max_bs: int, *, spec: bool, disable_padding: bool) -> list[int]:
    """`ServerArgs._generate_cuda_graph_batch_sizes`: request counts up to max_bs."""
    if disable_padding:
        bs = list(range(1, max_bs + 1))
    elif not spec:
        bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + \
            list(range(512, max_bs + 1, 32))
    else:   # spec decode needs more graph memory per bs, so the grid is finer at small bs
        bs = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + \
            list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16))
    return [b for b in bs if b <= max_bs]


def piecewise_tokens(max_tokens: int) -> list[int]:
    """`ServerArgs._generate_piecewise_cuda_graph_tokens`: prefill token counts with piecewise graphs."""
    t = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + \
        list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512))
    return [x for x in t if x <= max_tokens]


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


def shapes_from_settings(st: Settings, *, use_mla: bool = True) -> EngineShapes:
    v = st.values
    nm = {**FLAG_NAMES, **st.origin}
    notes: list[str] = []
    tp = _pos(v.get("tp_size", 1), nm["tp_size"])
    dp = _pos(v.get("dp_size", 1), nm["dp_size"])
    dp_attn = to_bool(v.get("enable_dp_attention") or False, nm["enable_dp_attention"])
    tbo = to_bool(v.get("enable_two_batch_overlap") or False, nm["enable_two_batch_overlap"])
    if dp_attn and tp % dp:
        raise ConfigError(f"{nm['dp_size']}={dp} must divide {nm['tp_size']}={tp} with --enable-dp-attention")
    attn_tp = tp // dp if dp_attn else 1

    gib = v.get("gpu_memory_gib")
    d_chunk, d_max_bs, d_note = memory_defaults(None if gib is None else float(gib), tp)

    # Speculative decoding: a verify step runs num_draft_tokens tokens per request.
    algo = v.get("speculative_algorithm")
    tokens_per_bs = 1
    if algo is not None:
        algo = str(algo).upper()
        if algo not in SPEC_ALGORITHMS:
            raise ConfigError(f"{nm['speculative_algorithm']}: unknown algorithm {algo!r}; "
                              f"expected one of {', '.join(SPEC_ALGORITHMS)}")
        steps = v.get("speculative_num_steps")
        topk = v.get("speculative_eagle_topk")
        draft = v.get("speculative_num_draft_tokens")
        steps = None if steps is None else _pos(steps, nm["speculative_num_steps"])
        topk = None if topk is None else _pos(topk, nm["speculative_eagle_topk"])
        if draft is None:
            if topk not in (None, 1):
                raise ConfigError(f"{nm['speculative_num_draft_tokens']} is needed when "
                                  f"{nm['speculative_eagle_topk']} > 1 (tree drafts)")
            draft = (steps or DEFAULT_SPEC_STEPS) + 1
            if steps is None:
                notes.append(f"speculative decoding: assuming SGLang's DeepSeek MTP defaults "
                             f"(steps={DEFAULT_SPEC_STEPS}, topk={DEFAULT_SPEC_TOPK}, draft tokens={draft})")
        tokens_per_bs = _pos(draft, nm["speculative_num_draft_tokens"])
    elif any(v.get(k) is not None for k in ("speculative_num_steps", "speculative_num_draft_tokens")):
        raise ConfigError(f"{nm['speculative_num_draft_tokens']} / {nm['speculative_num_steps']} given "
                          f"without {nm['speculative_algorithm']}")
    spec = algo is not None

    chunk = to_int(v.get("chunked_prefill_size", d_chunk), nm["chunked_prefill_size"])
    if chunk == 0 or chunk < -1:
        raise ConfigError(f"{nm['chunked_prefill_size']} must be > 0, or -1 to disable chunking; got {chunk}")
    max_prefill = _pos(v.get("max_prefill_tokens", 16384), nm["max_prefill_tokens"])
    if chunk == -1:
        notes.append(f"chunked prefill disabled: prefill batches are planned up to max_prefill_tokens="
                     f"{max_prefill}; a single longer prompt would exceed the plan")
    prefill_max = max_prefill if chunk == -1 else chunk
    mrr = v.get("max_running_requests")
    mrr = None if mrr is None else _pos(mrr, nm["max_running_requests"])

    disabled = to_bool(v.get("disable_cuda_graph") or False, nm["disable_cuda_graph"])
    no_pad = to_bool(v.get("disable_cuda_graph_padding") or False, nm["disable_cuda_graph_padding"])
    bs_in = v.get("cuda_graph_bs")
    if bs_in is not None:
        bs_in = to_int_list(bs_in, nm["cuda_graph_bs"])
        if not bs_in or min(bs_in) < 1:
            raise ConfigError(f"{nm['cuda_graph_bs']}: batch sizes must be >= 1, got {bs_in}")
    if bs_in is not None:
        max_bs = max(bs_in)
        if v.get("cuda_graph_max_bs") is not None and _pos(v["cuda_graph_max_bs"], nm["cuda_graph_max_bs"]) != max_bs:
            notes.append(f"{nm['cuda_graph_max_bs']} replaced by max({nm['cuda_graph_bs']})={max_bs}, as SGLang does")
    else:
        max_bs = _pos(v.get("cuda_graph_max_bs", d_max_bs), nm["cuda_graph_max_bs"])
    if d_note and ("cuda_graph_max_bs" not in v and bs_in is None or "chunked_prefill_size" not in v):
        notes.append(d_note)

    bs: list[int] = []
    if disabled:
        notes.append("--disable-cuda-graph: every batch runs eagerly")
    else:
        bs = sorted(set(bs_in)) if bs_in is not None else generate_batch_sizes(max_bs, spec=spec, disable_padding=no_pad)
        bs = runner_batch_sizes(bs, tokens_per_bs=tokens_per_bs, max_running_requests=mrr,
                                two_batch_overlap=tbo, attn_tp_size=attn_tp)
        if not bs:
            raise ConfigError(f"no CUDA-graph batch size is left after the runner's filters "
                              f"(mul_base from two-batch overlap / DP attention); adjust {nm['cuda_graph_bs']}")
    tokens = sorted({b * tokens_per_bs for b in bs})

    pw_max_in = v.get("piecewise_cuda_graph_max_tokens")
    pw_max = (_pos(pw_max_in, nm["piecewise_cuda_graph_max_tokens"]) if pw_max_in is not None
              else (MLA_PIECEWISE_MAX_TOKENS if use_mla else prefill_max))
    pw_in = v.get("piecewise_cuda_graph_tokens")
    pw = sorted(set(to_int_list(pw_in, nm["piecewise_cuda_graph_tokens"]))) if pw_in is not None else piecewise_tokens(pw_max)

    # Largest forward: a prefill chunk, or the widest decode/verify batch (graph or eager).
    decode_max = max(tokens, default=0)
    if mrr is not None:
        decode_max = max(decode_max, mrr * tokens_per_bs)
    else:
        notes.append(f"decode batches above the largest graph (bs {max(bs, default=0)}) run eagerly up to "
                     f"--max-running-requests, which SGLang sizes from KV memory; pass it to plan for them")
    max_tokens = max(prefill_max, decode_max, max(pw, default=0))

    resolved = {"tp_size": tp, "dp_size": dp, "enable_dp_attention": dp_attn, "attn_tp_size": attn_tp,
                "enable_two_batch_overlap": tbo, "chunked_prefill_size": chunk, "cuda_graph_max_bs": max_bs,
                "disable_cuda_graph": disabled, "disable_cuda_graph_padding": no_pad,
                "speculative_algorithm": algo, "speculative_num_draft_tokens": tokens_per_bs if spec else None,
                "max_running_requests": mrr, "piecewise_cuda_graph_max_tokens": pw_max,
                "enable_piecewise_cuda_graph": to_bool(v.get("enable_piecewise_cuda_graph") or False,
                                                       nm["enable_piecewise_cuda_graph"])}
    return EngineShapes(
        engine="sglang", formula_version=SGLANG_FORMULA_VERSION, tp_size=tp, capture_sizes=tuple(tokens),
        max_num_tokens=max_tokens, spec_tokens=(tokens_per_bs - 1) if spec else 0,
        tokens_per_seq=tokens_per_bs, capture_batch_sizes=tuple(bs), piecewise_sizes=tuple(pw),
        sequence_parallel=False, cuda_graphs=not disabled, settings=resolved, ignored=st.recorded(),
        notes=tuple(notes))


_OBJECT_ATTRS = ("cuda_graph_bs", "cuda_graph_max_bs", "disable_cuda_graph", "disable_cuda_graph_padding",
                 "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "tp_size", "dp_size",
                 "enable_dp_attention", "enable_two_batch_overlap", "speculative_algorithm",
                 "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                 "enable_piecewise_cuda_graph", "piecewise_cuda_graph_max_tokens", "piecewise_cuda_graph_tokens")


def settings_from_object(args: Any) -> Settings:
    """Duck-typed read of an `sglang.srt.server_args.ServerArgs`; SGLang is not imported."""
    st = Settings()
    for attr in _OBJECT_ATTRS:
        val = getattr(args, attr, None)
        if val is not None:
            st.set(attr, val, f"ServerArgs.{attr}")
    return st
