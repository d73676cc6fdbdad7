"""Engine configs -> capture sizes / token counts. Expected values are computed here, independently of
warmup/: vLLM's from the vLLM 0.33.0 source (file:function named at each rule) and by hand; SGLang's from
the formulas and worked examples in anchors_cache.md section 6."""
from __future__ import annotations

import enum
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dsv4_jit.errors import ConfigError
from dsv4_jit.warmup import (EngineShapes, load_profile, parse_engine_args, resolve_shapes, sglang_shapes,
                             shapes_from_config, vllm_shapes)


# ---- independent reference: vLLM 0.33.0, by membership test over all ints ------------------------

def _on_grid(s: int) -> bool:
    return s in (1, 2, 4) or (8 <= s < 256 and s % 8 == 0) or (s >= 256 and s % 16 == 0)


def ref_vllm(max_num_seqs=1024, mnbt=8192, k=0, ceiling=512, mode="FULL_AND_PIECEWISE", v2=True):
    """Captured token counts for default capture settings (no explicit sizes / max size)."""
    q = 1 + k
    pre = min(max_num_seqs * q * 2, ceiling)                  # vllm.py: VllmConfig._set_cudagraph_sizes
    max_cg = min(pre, mnbt)
    reqs = {n for n in range(1, min(max_num_seqs, ceiling) + 1) if _on_grid(n)} | {min(max_num_seqs, ceiling)}
    uniform = {n * q for n in reqs if n * q <= pre} if q > 1 else ({max_num_seqs} if max_num_seqs <= pre else set())
    config = ({s for s in range(1, max_cg + 1) if _on_grid(s)} | ({mnbt} if mnbt <= max_cg else set())
              | {u for u in uniform if u <= mnbt})
    top = max(config)
    if not v2 and mode != "PIECEWISE" and q > 1:              # compilation.py: adjust_..._for_spec_decode
        config = {math.ceil(s / q) * q for s in config if math.ceil(s / q) * q <= top} or {q}
        top = max(config)
    out = set(config) if mode != "FULL_DECODE_ONLY" else set()
    if mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):    # cudagraph_utils.py: _init_candidates (V2)
        if v2:
            out |= {math.ceil(s / q) * q for s in config if math.ceil(s / q) * q <= min(max_num_seqs * q, top)}
        else:                                                 # cudagraph_dispatcher.py (V1)
            out |= {s for s in config if q <= s <= max_num_seqs * q}
    return sorted(out)


K0 = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))           # 51 sizes
K3_V1 = [4] + list(range(8, 256, 8)) + list(range(256, 513, 16))               # 49: rounded to 4s

MTP2 = "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":2}'"
FEW_TOKENS_MTP2 = f"--max-num-seqs 48 --max-num-batched-tokens 100 {MTP2}"
# Hand-derived from vLLM 0.33.0 for FEW_TOKENS_MTP2 (q = 3, V2 runner, FULL_AND_PIECEWISE):
#  _set_cudagraph_sizes: ceiling min(48*3*2, 512) = 288, clamped to 100 -> grid 1,2,4,8..96, plus 100
#  (max_num_batched_tokens) and the decode sizes 3 x {1,2,4,8,16,24,32} <= 100 -> 19 config sizes;
#  _init_candidates: mixed graphs at all 19, FULL decode graphs at round_up(s, 3) <= min(144, 100).
FEW_TOKENS_MTP2_CONFIG = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]
FEW_TOKENS_MTP2_DECODE = [3, 6, 9, 12, 18, 24, 33, 42, 48, 57, 66, 72, 81, 90, 96]
FEW_TOKENS_MTP2_SIZES = [1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 32, 33, 40, 42, 48, 56, 57, 64, 66, 72, 80, 81, 88,
                         90, 96, 100]


def test_reference_agrees_with_hand_derivation():
    assert ref_vllm(48, 100, k=2) == FEW_TOKENS_MTP2_SIZES == sorted(set(FEW_TOKENS_MTP2_CONFIG)
                                                                     | set(FEW_TOKENS_MTP2_DECODE))
    assert ref_vllm(48, 100, k=2, v2=False) == FEW_TOKENS_MTP2_DECODE
    assert ref_vllm() == K0 and ref_vllm(k=3, v2=False) == K3_V1


# ---- every config vLLM accepts is planned, odd ones with a note ----------------------------------

def test_mtp_batched_tokens_below_seqs_times_q_is_accepted():
    s = parse_engine_args("vllm", FEW_TOKENS_MTP2)
    assert list(s.capture_sizes) == FEW_TOKENS_MTP2_SIZES and len(FEW_TOKENS_MTP2_SIZES) == 27
    assert s.settings["config_capture_sizes"] == FEW_TOKENS_MTP2_CONFIG
    assert s.settings["model_runner"] == "v2" and s.settings["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert s.max_num_tokens == 100 and list(s.token_counts()) == list(range(1, 101))
    assert s.spec_tokens == 2 and s.tokens_per_seq == 3
    assert any("48 x (1 + num_speculative_tokens=2) = 144" in n and "at most 33 requests" in n for n in s.notes)
    assert any("vLLM warns: max_num_scheduled_tokens=100" in n for n in s.notes)
    same = parse_engine_args("vllm", "--max-num-seqs 48 --max-num-batched-tokens 100 --spec-method mtp --spec-tokens 2")
    assert same.capture_sizes == s.capture_sizes


def test_cli_prints_the_note_for_batched_tokens_below_seqs_times_q():
    r = subprocess.run([sys.executable, "-m", "dsv4_jit", "plan", "--model", "deepseek-v4-flash", "--arch", "sm_90a",
                        "--vllm-args", FEW_TOKENS_MTP2], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "27 capture sizes 1..100" in out and "note: --max-num-batched-tokens=100 < --max-num-seqs=48" in out


@pytest.mark.parametrize("flags,sizes,tokens", [
    # defaults (H100/H200 tier: 1024 seqs, 8192 tokens); tp and dp do not change vLLM 0.33's sizes
    ("", K0, 8192),
    ("-tp 8 -dp 2", K0, 8192),
    # MTP K=1/K=3 at defaults: the decode sizes 2n / 4n all lie on the grid, and V2 keeps size 1 (mixed)
    ("-tp 8 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'", K0, 8192),
    ("--speculative-config '{\"method\":\"deepseek_mtp\",\"num_speculative_tokens\":3}'", K0, 8192),
    # the config, and the same under the V1 model runner (sizes rounded to multiples of 3)
    (FEW_TOKENS_MTP2, FEW_TOKENS_MTP2_SIZES, 100),
    (f"VLLM_USE_V2_MODEL_RUNNER=0 vllm serve m {FEW_TOKENS_MTP2}", FEW_TOKENS_MTP2_DECODE, 100),
    (f"{FEW_TOKENS_MTP2} -cc.cudagraph_mode=FULL_DECODE_ONLY", FEW_TOKENS_MTP2_DECODE, 100),
    (f"{FEW_TOKENS_MTP2} -cc.cudagraph_mode=PIECEWISE", FEW_TOKENS_MTP2_CONFIG, 100),
    (f"{FEW_TOKENS_MTP2} -cc.cudagraph_mode=FULL", FEW_TOKENS_MTP2_CONFIG, 100),
    # 100 seqs, K=0: ceiling 200, and max_num_seqs=100 itself is captured off the 8-grid
    ("--max-num-seqs 100", [1, 2, 4] + list(range(8, 97, 8)) + [100] + list(range(104, 201, 8)), 8192),
    # -O1 (PIECEWISE), MTP K=1, 48 seqs, 100 tokens: decode sizes 2n are on the grid, 100 appended
    ("-O1 --max-num-seqs 48 --max-num-batched-tokens 100 --speculative-config "
     "'{\"method\":\"mtp\",\"num_speculative_tokens\":1}'", [1, 2, 4] + list(range(8, 97, 8)) + [100], 100),
    # smallest batch vLLM accepts with 2 MTP tokens (3 > lookahead 2): [1, 2] grid, 3 appended
    (f"--max-num-seqs 2 --max-num-batched-tokens 3 {MTP2}", [1, 2, 3], 3),
    # explicit sizes: kept as given (<= batched tokens); V2 adds no decode graph outside them here
    ("--cudagraph-capture-sizes 1 2 4 8 --speculative-config '{\"num_speculative_tokens\":1, \"method\":\"mtp\"}'",
     [1, 2, 4, 8], 8192),
    ("--max-num-seqs 8 --max-num-batched-tokens 2048 --cudagraph-capture-sizes 1 2 3000", [1, 2], 2048),
    ("--max-num-seqs 8 --max-num-batched-tokens 64 --cudagraph-capture-sizes 128 256", [], 64),
    ("-cc '{\"cudagraph_capture_sizes\":[1]}' --speculative-config.method mtp "
     "--speculative-config.num_speculative_tokens 3", [1], 8192),
    # explicit ceiling: no decode sizes appended; 100 is truncated to the grid's 96
    ("--max-cudagraph-capture-size 64", [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], 8192),
    ("--max-cudagraph-capture-size 100", [1, 2, 4] + list(range(8, 97, 8)), 8192),
    # performance modes: interactivity captures every size to 32; throughput doubles the defaults
    ("--performance-mode interactivity --max-num-seqs 16", list(range(1, 33)), 8192),
    ("--performance-mode throughput", K0, 16384),
    # suffix decoding (24 tokens by default) runs on the V1 runner: multiples of 25 up to 500
    ("--speculative-config '{\"method\":\"suffix\"}'", list(range(25, 501, 25)), 8192),
    # batched-DP MoE backends default max_num_batched_tokens to 256
    ("--enable-expert-parallel -dp 2 --all2all-backend deepep_low_latency --max-num-seqs 128",
     [1, 2, 4] + list(range(8, 257, 8)), 256),
    # human-readable token counts, as vLLM's human_readable_int
    ("--max-num-seqs 256 --max-num-batched-tokens 2K", ref_vllm(256, 2048), 2048),
    ("--max-num-seqs 256 --max-num-batched-tokens 16k", ref_vllm(256, 16000), 16000),
    # chunked prefill off: a defaulted max_num_batched_tokens rises to max_model_len
    ("--disable-chunked-prefill --max-model-len 32k", K0, 32000),
    # no CUDA graphs
    ("--enforce-eager", [], 8192),
    ("-O0", [], 8192),
    ("-O 0 -cc.cudagraph_mode=PIECEWISE", K0, 8192),
])
def test_vllm_hand_derived_table(flags, sizes, tokens):
    s = parse_engine_args("vllm", flags)
    assert list(s.capture_sizes) == sizes
    assert s.max_num_tokens == tokens and len(s.token_counts()) == tokens
    assert set(s.capture_sizes) <= set(s.token_counts())
    assert s.sequence_parallel is False


def test_vllm_table_notes():
    s = parse_engine_args("vllm", "--max-num-seqs 8 --max-num-batched-tokens 64 --cudagraph-capture-sizes 128 256")
    assert not s.cuda_graphs and any("captures nothing" in n for n in s.notes)
    s = parse_engine_args("vllm", "-cc '{\"cudagraph_capture_sizes\":[1]}' --speculative-config.method mtp "
                                  "--speculative-config.num_speculative_tokens 3")
    assert any("no graph holds a whole decode step" in n for n in s.notes)
    s = parse_engine_args("vllm", "--max-cudagraph-capture-size 100")
    assert any("truncated to 96" in n for n in s.notes)
    s = parse_engine_args("vllm", "--speculative-config '{\"method\":\"suffix\"}'")
    assert s.spec_tokens == 24 and s.settings["model_runner"] == "v1" and any("V1 model runner" in n for n in s.notes)
    s = parse_engine_args("vllm", "--disable-chunked-prefill")
    assert any("chunked prefill off" in n for n in s.notes)
    s = parse_engine_args("vllm", f"{MTP2[:-2]},\"num_speculative_tokens_per_batch_size\":[[1,8,2]]}}'")
    assert any("not modelled" in n for n in s.notes)


def test_vllm_defaults_large_gpu_and_said_so():
    s = vllm_shapes()
    assert s.settings["max_num_seqs"] == 1024 and s.max_num_tokens == 8192
    assert list(s.token_counts()) == list(range(1, 8193))
    assert any(">= 70 GiB" in n for n in s.notes)
    assert vllm_shapes(usage="llm").max_num_tokens == 16384


@pytest.mark.parametrize("gib,name,seqs,tokens,ceiling", [
    (48, None, 256, 2048, 512), (80, None, 1024, 8192, 512), (80, "NVIDIA A100-SXM4-80GB", 256, 2048, 512),
    (141, "H200", 1024, 8192, 512), (24, None, 256, 2048, 512), (180, None, 1024, 16384, 512),
    (None, "NVIDIA B200", 1024, 16384, 1024)])
def test_vllm_batch_defaults_by_gpu(gib, name, seqs, tokens, ceiling):
    gpu = {k: v for k, v in (("gpu_memory_gib", gib), ("gpu_name", name)) if v is not None}
    s = vllm_shapes(**gpu)
    assert (s.settings["max_num_seqs"], s.max_num_tokens) == (seqs, tokens)
    assert not any(">= 70 GiB" in n for n in s.notes)
    assert list(s.capture_sizes) == ref_vllm(seqs, tokens, ceiling=ceiling)


def test_vllm_blackwell_ceiling_matches_vllms_own_count():
    # vLLM's gpt-oss hook comment: a 1024 ceiling gives 83 graphs (K=0, 1024 seqs)
    assert len(vllm_shapes(gpu_name="NVIDIA B200").capture_sizes) == 83


# Real serving configs against the independent reference: (flags, reference kwargs)
REAL = [
    ("-tp 1", dict()),
    ("-tp 2", dict()),
    ("--tensor-parallel-size 4", dict()),
    ("-tp 8 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'", dict(k=1)),
    ("-tp 4 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'", dict(k=3)),
    ("-tp 2 --max-num-seqs 64 --spec-method mtp --spec-tokens 1", dict(max_num_seqs=64, k=1)),
    ("--max-num-seqs 16 -sc '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'", dict(max_num_seqs=16, k=3)),
    ("--max-num-seqs 128 --max-num-batched-tokens 2048", dict(max_num_seqs=128, mnbt=2048)),
    ("--max-num-seqs 128 --max-num-batched-tokens 256", dict(max_num_seqs=128, mnbt=256)),
    ("--max-num-seqs 256 --max-num-batched-tokens 16384 -tp 2", dict(max_num_seqs=256, mnbt=16384)),
    ("--max-num-seqs 512 --max-num-batched-tokens 1024 " + MTP2, dict(max_num_seqs=512, mnbt=1024, k=2)),
    ("--max-num-seqs 300 --max-num-batched-tokens 300 " + MTP2, dict(max_num_seqs=300, mnbt=300, k=2)),
    ("VLLM_USE_V2_MODEL_RUNNER=0 --max-num-seqs 16 " + MTP2, dict(max_num_seqs=16, k=2, v2=False)),
    ("-cc '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}' --max-num-seqs 40 " + MTP2,
     dict(max_num_seqs=40, k=2, mode="FULL_DECODE_ONLY")),
]


@pytest.mark.parametrize("flags,kw", REAL)
def test_vllm_real_configs(flags, kw):
    s = parse_engine_args("vllm", flags)
    assert list(s.capture_sizes) == ref_vllm(**kw)
    assert s.max_num_tokens == kw.get("mnbt", 8192)
    assert set(s.capture_sizes) <= set(s.token_counts())


def test_vllm_v1_runner_rounding_refusal_is_vllms():
    # V2 (the default) accepts a lone size 1 with 3 MTP tokens; the V1 runner's rounding refuses it.
    flags = ("-cc.cudagraph_capture_sizes=[1] --speculative-config.method mtp "
             "--speculative-config.num_speculative_tokens 3")
    assert parse_engine_args("vllm", flags).capture_sizes == (1,)
    with pytest.raises(ConfigError, match="multiple of 4"):
        parse_engine_args("vllm", "VLLM_USE_V2_MODEL_RUNNER=0 " + flags)
    assert vllm_shapes(flags, use_v2_model_runner=True).capture_sizes == (1,)


def test_vllm_explicit_sizes():
    s = parse_engine_args("vllm", ["--compilation-config", '{"cudagraph_capture_sizes":[4,1,2,2]}'])
    assert s.capture_sizes == (1, 2, 4)
    s = parse_engine_args("vllm", "--max-num-seqs 8 --max-num-batched-tokens 2048 --cudagraph-capture-sizes 1 2 3000")
    assert s.capture_sizes == (1, 2) and any("3000" in n for n in s.notes)
    s = parse_engine_args("vllm", "VLLM_USE_V2_MODEL_RUNNER=0 --cudagraph-capture-sizes 1 2 4 8 "
                                  "--speculative-config '{\"num_speculative_tokens\":1, \"method\":\"mtp\"}'")
    assert s.capture_sizes == (2, 4, 8)


def test_vllm_no_cuda_graphs():
    for flags in ("--enforce-eager", "-cc.cudagraph_mode=NONE", "--compilation-config '{\"cudagraph_mode\": \"none\"}'",
                  "--compilation-config.cudagraph_mode NONE", "-O0", "--optimization-level 0"):
        s = parse_engine_args("vllm", flags)
        assert s.capture_sizes == () and not s.cuda_graphs, flags
        assert s.max_num_tokens == 8192 and len(s.token_counts()) == 8192
    s = parse_engine_args("vllm", "--enforce-eager --no-enforce-eager")
    assert len(s.capture_sizes) == 51
    s = parse_engine_args("vllm", "-cc '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}'")
    # decode-only graphs: q = 1, so every size up to max_num_seqs = all 51
    assert len(s.capture_sizes) == 51 and s.settings["cudagraph_mode"] == "FULL_DECODE_ONLY"
    s = parse_engine_args("vllm", "-cc '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}' --max-num-seqs 64")
    assert list(s.capture_sizes) == [1, 2, 4] + list(range(8, 65, 8))       # decode graphs stop at 64 seqs


# What vLLM 0.33 refuses stays refused, naming the flag.
@pytest.mark.parametrize("flags,match", [
    ("--max-num-seqs 300 --max-num-batched-tokens 256", "--max-num-batched-tokens=256 is smaller than --max-num-seqs"),
    (f"--max-num-seqs 2 --max-num-batched-tokens 2 {MTP2}", "no slot for a scheduled token"),
    (f"--enable-lora {FEW_TOKENS_MTP2}",
     "--enable-lora with speculative decoding: vLLM refuses --max-num-batched-tokens=100"),
    ("--disable-chunked-prefill --max-model-len 4096 --max-num-batched-tokens 2048 --max-num-seqs 64",
     "--max-num-batched-tokens=2048 is smaller than --max-model-len=4096"),
    ("--speculative-config '{\"num_speculative_tokens\": 1}'", "needs a draft \"model\""),
    ("--spec-tokens 2", "needs a draft \"model\""),
    ("--speculative-config '{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'", "needs a draft \"model\""),
    ("--speculative-config '{\"method\": \"medusa2\", \"num_speculative_tokens\": 3}'", "unknown method 'medusa2'"),
    ("--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 0}'",
     "num_speculative_tokens must be > 0"),
    ("--speculative-config '{\"num_speculative_tokens\": -1}'", "num_speculative_tokens must be > 0"),
    (f"{MTP2} --spec-tokens 2", "--spec-tokens and --speculative-config num_speculative_tokens are mutually exclusive"),
    ("--cudagraph-capture-sizes 1 2 -cc '{\"cudagraph_capture_sizes\":[4]}'", "mutually exclusive"),
    ("--cudagraph-capture-sizes 1 2 4 --max-cudagraph-capture-size 8", "contradicts"),
    ("-tp 4 -cc '{\"pass_config\":{\"enable_sp\":true}}'", "pass_config.enable_sp: vLLM 0.33 has no sequence-par"),
    ("-tp 8 --enable-sequence-parallelism", "unrecognized arguments: --enable-sequence-parallelism"),
    ("-O5", "--optimization-level: expected 0, 1, 2 or 3"),
    ("--performance-mode fast", "argument --performance-mode: invalid choice: 'fast'"),
    ("VLLM_USE_V2_MODEL_RUNNER=1 --speculative-config '{\"method\":\"suffix\"}'", "Model Runner V2 does not yet"),
    ("VLLM_USE_V2_MODEL_RUNNER=0 --speculative-config '{\"method\":\"dspark\",\"num_speculative_tokens\":4}'",
     "Model Runner V1 does not support dspark"),
    ("--max-num-batched-tokens 1.5K", "Decimals are not allowed with binary suffixes"),
])
def test_vllm_refusals(flags, match):
    with pytest.raises(ConfigError, match=match):
        parse_engine_args("vllm", flags)


def test_defaulted_max_num_seqs_follows_batched_tokens():
    # vLLM 0.33 lowers a defaulted max_num_seqs to max_num_batched_tokens (it refuses only a given one)
    s = parse_engine_args("vllm", "--max-num-batched-tokens 512")
    assert s.settings["max_num_seqs"] == 512 and s.max_num_tokens == 512
    s = parse_engine_args("vllm", "--enable-expert-parallel -dp 2 --all2all-backend nixl_ep")
    assert s.settings["max_num_seqs"] == 256 and s.max_num_tokens == 256


def test_spec_batched_tokens_from_defaults_is_a_note():
    s = vllm_shapes(num_speculative_tokens=15)       # 1024 x 16 > 8192, but neither value was given
    assert any("at most 512 requests" in n for n in s.notes)


# ---- SGLang ---------------------------------------------------------------------------------------

SG_NOSPEC_512 = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + [512]
SG_SPEC_512 = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
               + list(range(272, 513, 16)))


def test_sglang_worked_examples():
    s = sglang_shapes(cuda_graph_max_bs_decode=512, max_running_requests=512)
    assert len(s.capture_sizes) == 52 and list(s.capture_sizes) == SG_NOSPEC_512
    s = sglang_shapes(cuda_graph_max_bs_decode=512, max_running_requests=512, speculative_algorithm="EAGLE",
                      speculative_num_draft_tokens=4)
    assert len(s.capture_batch_sizes) == 67 and list(s.capture_batch_sizes) == SG_SPEC_512
    assert list(s.capture_sizes) == [4 * b for b in SG_SPEC_512]
    assert s.tokens_per_seq == 4 and s.spec_tokens == 3


def test_sglang_0_5_23_per_phase_flags():
    # SGLang 0.5.23 resolves decode bs [1,2,4,8,12,16,24,32,40,48] with prefill graphs off for DeepSeek V4
    s = parse_engine_args("sglang", "--cuda-graph-max-bs-decode 48 --tp 2")
    assert list(s.capture_batch_sizes) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48] and s.piecewise_sizes == ()
    assert s.formula_version == "sglang-0.5.23" and "--cuda-graph-max-bs-decode" not in s.ignored
    s = parse_engine_args("sglang", "--cuda-graph-max-bs-decode 50")            # max_bs itself is captured
    assert list(s.capture_batch_sizes)[-2:] == [48, 50]
    s = parse_engine_args("sglang", "--cuda-graph-bs-decode 1 2 4 8")
    assert s.capture_sizes == (1, 2, 4, 8) and s.settings["cuda_graph_max_bs_decode"] == 8
    s = parse_engine_args("sglang", "--cuda-graph-backend-prefill breakable --chunked-prefill-size 4096 "
                                    "--cuda-graph-max-bs-prefill 512")
    assert s.piecewise_sizes[-1] == 512 and 512 in s.capture_sizes
    s = parse_engine_args("sglang", "--cuda-graph-config '{\"decode\": {\"max_bs\": 16}}' --cuda-graph-max-bs-decode 48")
    assert s.capture_batch_sizes[-1] == 16                                    # the JSON wins
    s = parse_engine_args("sglang", "--disable-decode-cuda-graph")
    assert s.capture_sizes == () and not s.cuda_graphs
    for flags, match in (("--cuda-graph-max-bs 48", "ambiguous option: --cuda-graph-max-bs could match"),
                         ("--cuda-graph-bs 1 2", "ambiguous option: --cuda-graph-bs could match"),
                         ("--speculative-algorithm EAGLE --speculative-eagle-topk 2 --speculative-num-draft-tokens 4",
                          "topk == 1 is supported"),
                         ("--pp-size 2", "not followed by dsv4-jit's sglang-0.5.23 formula"),
                         ("--cuda-graph-backend-decode tc_piecewise", "tc_piecewise was removed"),
                         ("--cuda-graph-config '{\"verify\": {}}'", "unknown phase 'verify'")):
        with pytest.raises(ConfigError, match=match):
            parse_engine_args("sglang", flags)


def test_sglang_defaults():
    s = parse_engine_args("sglang", "--model-path deepseek-ai/DeepSeek-V4-Flash --tp 1")
    assert list(s.capture_sizes) == [1, 2, 4, 8, 12] + list(range(16, 257, 8))        # 256 at tp<4
    assert s.max_num_tokens == 8192 and any("H100/H200" in n for n in s.notes)
    s = parse_engine_args("sglang", "--tp-size 8 --max-running-requests 512")
    assert list(s.capture_sizes) == SG_NOSPEC_512 and s.tp_size == 8
    s = parse_engine_args("sglang", "--tp-size 8")         # max bs 512, runner capped at V4's 256 requests
    assert list(s.capture_sizes) == [1, 2, 4, 8, 12] + list(range(16, 257, 8))
    s = parse_engine_args("sglang", "--tp 2", gpu_memory_gib=24)
    assert list(s.capture_batch_sizes) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48] and s.max_num_tokens == 4096


def test_sglang_variants():
    s = parse_engine_args("sglang", "--cuda-graph-max-bs-decode 8 --disable-cuda-graph-padding")
    assert s.capture_sizes == tuple(range(1, 9))
    s = parse_engine_args("sglang", "--tp 8 --enable-two-batch-overlap --max-running-requests 512")
    assert list(s.capture_sizes) == [b for b in SG_NOSPEC_512 if b % 2 == 0]
    s = parse_engine_args("sglang", "--tp 8 --attn-dp-size 2 --max-running-requests 512")   # attn tp 4 -> mul_base 4
    assert list(s.capture_sizes) == [b for b in SG_NOSPEC_512 if b % 4 == 0]
    s = parse_engine_args("sglang", "--tp 8 --dp 2 --enable-dp-attention --max-running-requests 512")
    assert list(s.capture_sizes) == [b for b in SG_NOSPEC_512 if b % 4 == 0]
    s = parse_engine_args("sglang", "--tp 8 --max-running-requests 100")
    assert list(s.capture_batch_sizes) == [1, 2, 4, 8, 12] + list(range(16, 97, 8)) + [100]
    s = parse_engine_args("sglang", "--cuda-graph-bs-decode 1 2 4 8 --chunked-prefill-size 2048 "
                                    "--speculative-algorithm EAGLE --speculative-num-draft-tokens 8")
    assert s.capture_sizes == (8, 16, 32, 64) and s.max_num_tokens == 2048
    s = parse_engine_args("sglang", "--speculative-algorithm NEXTN")
    assert s.tokens_per_seq == 4 and any("MTP defaults" in n for n in s.notes)
    s = parse_engine_args("sglang", "--disable-cuda-graph")
    assert s.capture_sizes == () and s.max_num_tokens == 8192


# ---- flag parsing ---------------------------------------------------------------------------------

def test_flag_spellings_equivalent():
    # vLLM's parser: `_` for `-` in names, `=` or a space, and unambiguous abbreviations (`--max-num-seq`)
    forms = ["--max-num-seqs 64 -tp 4", "--max-num-seqs=64 --tensor-parallel-size=4", "--max_num_seqs 64 -tp 4",
             ["--max-num-seqs", "64", "--tensor-parallel", "4"], "--max-num-seq 64 --tensor_parallel_size 4"]
    got = {parse_engine_args("vllm", f).capture_sizes for f in forms}
    assert got == {tuple(ref_vllm(64, 8192))}
    assert {parse_engine_args("vllm", f).tp_size for f in forms} == {4}


def test_unrelated_flags_recorded():
    s = parse_engine_args("vllm", "vllm serve deepseek-ai/DeepSeek-V4-Flash --host 0.0.0.0 --port=8000 "
                                  "--trust-remote-code --model foo --max-model-len 65536 --enable-expert-parallel "
                                  "-O3 --max-num-seqs 32")
    assert s.ignored["--host"] == "0.0.0.0" and s.ignored["--port"] == 8000
    assert s.ignored["--trust-remote-code"] is True and s.ignored["--model"] == "foo"
    assert s.settings["optimization_level"] == 3 and "-O3" not in s.ignored      # vLLM 0.33: -O<n> is the level
    assert s.ignored["_positional"] == ["deepseek-ai/DeepSeek-V4-Flash"]
    assert s.settings["max_num_seqs"] == 32
    json.dumps(s.to_dict())


def test_json_and_dotted_flags():
    s = parse_engine_args("vllm", "--speculative-config.method mtp --speculative-config.num_speculative_tokens=2")
    assert s.spec_tokens == 2 and s.settings["speculative_method"] == "mtp"
    s = parse_engine_args("vllm", "-cc '{\"max_cudagraph_capture_size\": 32}' -cc.cudagraph_mode=FULL")
    assert s.capture_sizes[-1] == 512      # vLLM: the dotted -cc.* JSON comes last and replaces the first -cc


def test_shapes_roundtrip():
    s = parse_engine_args("sglang", "--speculative-algorithm EAGLE --speculative-num-draft-tokens 2 --port 1")
    d = json.loads(json.dumps(s.to_dict()))
    assert EngineShapes.from_dict(d) == s


@pytest.mark.parametrize("engine,flags,match", [
    ("vllm", "--max-num-seqs -5", "--max-num-seqs must be >= 1"),
    ("vllm", "--max-num-seqs abc", "argument --max-num-seqs: invalid int value: 'abc'"),
    ("vllm", "--max-num-seqs 1.5", "argument --max-num-seqs: invalid int value: '1.5'"),
    ("vllm", "--max-num-seqs", "argument --max-num-seqs: expected one argument"),
    ("vllm", "-tp 0", "--tensor-parallel-size must be >= 1"),
    ("vllm", "--max-num-seqs 300 --max-num-batched-tokens 256", "--max-num-batched-tokens=256 is smaller"),
    ("vllm", "--enable-lora --max-num-seqs 1024 --max-num-batched-tokens 1024 --speculative-config "
     "'{\"method\":\"mtp\",\"num_speculative_tokens\":1}'", r"--max-num-batched-tokens=1024 < --max-num-seqs=1024"),
    ("vllm", "--compilation-config '{\"cudagraph_mode\":\"SOMETIMES\"}'", "unknown cudagraph_mode"),
    ("vllm", "--compilation-config '{bad json'", "argument --compilation-config/-cc: 1 validation error for CompilationConfig: not valid JSON"),
    ("vllm", "--speculative-config '{\"num_speculative_tokens\": -1}'", "num_speculative_tokens must be > 0"),
    ("vllm", "--speculative-config '{\"num_speculative_tokens\": true}'", "expected an integer"),
    ("vllm", "--speculative-config '{\"method\": \"mtp\"}'", "no num_speculative_tokens"),
    ("vllm", "--cudagraph-capture-sizes 1 2 0", "sizes must be >= 1"),
    # a word in a size list: one error naming it (it recursed without end before)
    ("vllm", "--cuda-graph-sizes 1 2 abc", "unrecognized arguments: --cuda-graph-sizes"),
    ("vllm", "--cudagraph-capture-sizes '[1, \"x\"]'", "argument --cudagraph-capture-sizes: invalid int value"),
    ("sglang", "--cuda-graph-bs 1 two", "ambiguous option: --cuda-graph-bs could match"),
    ("vllm", "--cudagraph-capture-sizes 1 2 4 --max-cudagraph-capture-size 8", "contradicts"),
    ("vllm", "--enforce-eager=maybe", "ignored explicit argument 'maybe'"),
    ("vllm", "-tp 4 -cc '{\"pass_config\":{\"enable_sp\":true}}' " + MTP2, "no sequence-parallelism pass"),
    ("vllm", "--max-num-seqs.x 3", "argument --max-num-seqs: invalid int value"),
    ("vllm", "-cc '{\"bogus\": 1}'", "bogus: Extra inputs are not permitted"),
    ("sglang", "--speculative-algorithm FOO", "only EAGLE and DSPARK"),
    ("sglang", "--cuda-graph-bs-decode 0 1", "batch sizes must be >= 1"),
    ("sglang", "--chunked-prefill-size 0", "--chunked-prefill-size must be > 0"),
    ("sglang", "--tp 8 --dp 3 --enable-dp-attention", "--attn-dp-size=3 must divide"),
    ("sglang", "--speculative-num-draft-tokens 4", "without --speculative-algorithm"),
    ("sglang", "--speculative-algorithm EAGLE --speculative-eagle-topk 4", "topk == 1 is supported"),
])
def test_errors_name_the_flag(engine, flags, match):
    with pytest.raises(ConfigError, match=match):
        parse_engine_args(engine, flags)


def test_unknown_engine_and_multiple_sources(tmp_path):
    with pytest.raises(ConfigError, match="unknown engine"):
        parse_engine_args("trtllm", "")
    with pytest.raises(ConfigError, match="not several"):
        resolve_shapes(vllm_args="", sglang_args="")
    s, prof = resolve_shapes()
    assert prof is None and len(s.capture_sizes) == 51 and "defaults" in s.notes[0]


# ---- profile files ---------------------------------------------------------------------------------

def test_profile_toml(tmp_path):
    p = tmp_path / "serve.toml"
    p.write_text('engine = "vllm"\nmodel = "deepseek-v4-flash"\narch = "sm_90a"\n'
                 'args = "--port 8000"\n[vllm]\nmax-num-seqs = 64\ntensor_parallel_size = 2\n'
                 'speculative_config = { num_speculative_tokens = 1, method = "mtp" }\n')
    prof = load_profile(p)
    assert prof.model == "deepseek-v4-flash" and prof.arch == ["sm_90a"]
    assert list(prof.shapes.capture_sizes) == ref_vllm(64, k=1) and prof.shapes.tp_size == 2
    assert prof.shapes.ignored["--port"] == 8000


def test_profile_json_inferred_engine(tmp_path):
    p = tmp_path / "serve.json"
    p.write_text(json.dumps({"sglang": {"cuda_graph_max_bs_decode": 512, "tp_size": 8, "max_running_requests": 512}}))
    prof = load_profile(p)
    assert prof.shapes.engine == "sglang" and list(prof.shapes.capture_sizes) == SG_NOSPEC_512
    p.write_text(json.dumps({"engine": "vllm", "max_num_seqs": 64}))          # flat keys
    assert load_profile(p).shapes.capture_sizes[-1] == 128


@pytest.mark.parametrize("name,text,match", [
    ("a.toml", "engine = \n", "not valid TOML"),
    ("a.json", "{", "not valid JSON"),
    ("a.json", "[]", "top level"),
    ("a.json", "{\"max_num_seqs\": 3}", "say engine"),
    ("a.json", "{\"engine\": \"vllm\", \"max_num_seqs\": \"x\"}", r"max_num_seqs \(in a.json\): expected an integer"),
    ("a.json", "{\"engine\": \"vllm\", \"arch\": 5}", "arch"),
])
def test_profile_errors(tmp_path, name, text, match):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_profile(p)


def test_profile_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="--profile: no such file"):
        load_profile(tmp_path / "nope.toml")


def test_profile_toml_on_310_without_tomli(tmp_path, monkeypatch):
    p = tmp_path / "a.toml"
    p.write_text('engine = "vllm"\n')
    monkeypatch.setattr(sys, "version_info", (3, 10, 0))
    monkeypatch.setitem(sys.modules, "tomli", None)       # import tomli -> ImportError
    with pytest.raises(ConfigError, match="Python 3.11\\+ or the 'tomli' package"):
        load_profile(p)


# ---- duck-typed engine config objects ------------------------------------------------------------------

class CUDAGraphMode(enum.Enum):           # shaped like vllm.config.compilation.CUDAGraphMode
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_AND_PIECEWISE = (2, 1)


def fake_vllm_config(**over):
    ns = SimpleNamespace
    cfg = ns(scheduler_config=ns(max_num_seqs=256, max_num_batched_tokens=8192),
             compilation_config=ns(cudagraph_capture_sizes=None, max_cudagraph_capture_size=None,
                                   cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, pass_config=ns(enable_sp=False)),
             speculative_config=ns(num_speculative_tokens=1, method="mtp"),
             parallel_config=ns(tensor_parallel_size=4, data_parallel_size=1),
             model_config=ns(enforce_eager=False))
    for k, v in over.items():
        obj, attr = k.split("__")
        setattr(getattr(cfg, obj), attr, v)
    return cfg


def test_vllm_config_object():
    s = shapes_from_config(fake_vllm_config())
    assert list(s.capture_sizes) == ref_vllm(256, k=1) and s.tp_size == 4 and s.spec_tokens == 1
    assert not any(">= 70 GiB" in n for n in s.notes)          # nothing defaulted
    s = shapes_from_config(fake_vllm_config(compilation_config__cudagraph_mode=CUDAGraphMode.NONE))
    assert s.capture_sizes == ()
    s = shapes_from_config(fake_vllm_config(model_config__enforce_eager=True))
    assert s.capture_sizes == ()
    # already-resolved sizes (as in a VllmConfig after __post_init__) are stable
    resolved = ref_vllm(256, k=1)
    s = shapes_from_config(fake_vllm_config(compilation_config__cudagraph_capture_sizes=resolved,
                                            compilation_config__max_cudagraph_capture_size=resolved[-1]))
    assert list(s.capture_sizes) == resolved
    cfg = fake_vllm_config()
    cfg.speculative_config = None
    assert list(shapes_from_config(cfg).capture_sizes) == ref_vllm(256)
    with pytest.raises(ConfigError, match="scheduler_config.max_num_seqs must be >= 1"):
        shapes_from_config(fake_vllm_config(scheduler_config__max_num_seqs=0))


def test_vllm_config_object_with_few_batched_tokens_as_vllm_resolves_it():
    # A VllmConfig after __post_init__: sizes and ceiling written back, eager -> NONE with [] / 0.
    live = dict(scheduler_config__max_num_seqs=48, scheduler_config__max_num_batched_tokens=100,
                speculative_config__num_speculative_tokens=2,
                compilation_config__cudagraph_capture_sizes=FEW_TOKENS_MTP2_CONFIG,
                compilation_config__max_cudagraph_capture_size=100)
    assert list(shapes_from_config(fake_vllm_config(**live)).capture_sizes) == FEW_TOKENS_MTP2_SIZES
    cfg = fake_vllm_config(**live)
    cfg.use_v2_model_runner = False                  # the VllmConfig property, read as is
    assert list(shapes_from_config(cfg).capture_sizes) == FEW_TOKENS_MTP2_DECODE
    s = shapes_from_config(fake_vllm_config(**{**live, "compilation_config__cudagraph_capture_sizes": [],
                                               "compilation_config__max_cudagraph_capture_size": 0,
                                               "compilation_config__cudagraph_mode": CUDAGraphMode.NONE}))
    assert s.capture_sizes == () and s.max_num_tokens == 100
    with pytest.raises(ConfigError, match="no sequence-parallelism pass"):
        shapes_from_config(fake_vllm_config(compilation_config__pass_config=SimpleNamespace(enable_sp=True)))


def test_sglang_server_args_object():
    args = SimpleNamespace(tp_size=8, dp_size=1, cuda_graph_bs_decode=None, cuda_graph_max_bs_decode=512,
                           chunked_prefill_size=8192,
                           disable_cuda_graph=False, disable_cuda_graph_padding=False, speculative_algorithm="EAGLE",
                           speculative_num_draft_tokens=4, speculative_num_steps=3, speculative_eagle_topk=1,
                           enable_dp_attention=False, max_running_requests=512)
    s = shapes_from_config(args)
    assert s.engine == "sglang" and list(s.capture_batch_sizes) == SG_SPEC_512
    with pytest.raises(ConfigError, match="cannot read engine shapes"):
        shapes_from_config(object())


def test_names_the_engine_lacks_are_refused_in_profiles_and_the_api(tmp_path):
    # a typo or a removed flag would otherwise plan the defaults
    with pytest.raises(ConfigError, match="cuda_graph_max_bs \\(in sglang_shapes\\(\\)\\): sglang serve has no such"):
        sglang_shapes(cuda_graph_max_bs=48)
    with pytest.raises(ConfigError, match="max_num_sqs \\(in vllm_shapes\\(\\)\\): vllm serve has no such option"):
        vllm_shapes(max_num_sqs=8)
    with pytest.raises(ConfigError, match="not followed by dsv4-jit's sglang-0.5.23 formula"):
        sglang_shapes(pp_size=2)
    p = tmp_path / "serve.toml"
    p.write_text('[sglang]\ncuda-graph-max-bs = 48\n')
    with pytest.raises(ConfigError, match="cuda-graph-max-bs \\(in serve.toml\\): sglang serve has no such option"):
        load_profile(p)
    p.write_text('[sglang]\ncuda-graph-max-bs-decode = 48\nport = 30000\ntp-size = 2\n')
    prof = load_profile(p)
    assert prof.shapes.capture_batch_sizes[-1] == 48 and prof.shapes.ignored == {"port": 30000}


def test_refusals_read_as_the_engine_prints_them_with_a_model():
    # dsv4-jit takes the model from --model, so a pasted line may leave it out; vLLM's positional model then
    # does not swallow a value, and the message is the one `vllm serve MODEL ...` prints
    with pytest.raises(ConfigError, match="unrecognized arguments: --cuda-graph-sizes 1 3 5 7 64$"):
        parse_engine_args("vllm", "--cuda-graph-sizes 1 3 5 7 64")
    with pytest.raises(ConfigError, match="unrecognized arguments: --max-num-sqs 8$"):
        parse_engine_args("vllm", "--max-num-sqs 8")
    s = parse_engine_args("vllm", "--max-num-seqs 8 deepseek-ai/DeepSeek-V4-Flash")   # the model after the flags
    assert s.settings["max_num_seqs"] == 8 and s.ignored["_positional"] == ["deepseek-ai/DeepSeek-V4-Flash"]
    s = parse_engine_args("sglang", "--tp 2")                       # SGLang's required --model-path stood in
    assert s.tp_size == 2 and "--model-path" not in s.ignored
