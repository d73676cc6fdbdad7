"""Engine configs -> capture sizes / token counts. Expected values are computed here, independently of
warmup/, from the formulas and worked examples in anchors_cache.md section 6."""
from __future__ import annotations

import enum
import json
import math
import sys
from types import SimpleNamespace

import pytest

from dsv4_jit.errors import ConfigError
from dsv4_jit.warmup import (EngineShapes, load_profile, parse_engine_args, resolve_shapes, sglang_shapes,
                             shapes_from_config, vllm_shapes)


# ---- independent references ----------------------------------------------------------------------

def ref_vllm(max_num_seqs=1024, mnbt=8192, k=0, tp=1, sp=False, ceiling=512):
    """vLLM capture sizes written from the documented rules, by membership test over all ints."""
    q = 1 + k
    max_cg = min(max_num_seqs * q * 2, ceiling, mnbt)
    grid = [s for s in range(1, max_cg + 1)
            if s in (1, 2, 4) or (8 <= s < 256 and s % 8 == 0) or (s >= 256 and s % 16 == 0)]
    if sp and tp > 1:
        grid = [s for s in grid if s % tp == 0]
    max_cg = grid[-1]
    m = max(q, tp) if (sp and tp > 1) else q
    return sorted({math.ceil(s / m) * m for s in grid if math.ceil(s / m) * m <= max_cg}) if m > 1 else grid


K0 = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
K1 = [2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
K3 = [4] + list(range(8, 256, 8)) + list(range(256, 513, 16))


def test_vllm_worked_examples():
    s0 = vllm_shapes()
    assert len(s0.capture_sizes) == 51 and list(s0.capture_sizes) == K0
    assert s0.capture_sizes[:4] == (1, 2, 4, 8) and s0.capture_sizes[-3:] == (480, 496, 512)
    assert 248 in s0.capture_sizes and 256 in s0.capture_sizes and 272 in s0.capture_sizes
    s1 = vllm_shapes(num_speculative_tokens=1)
    assert len(s1.capture_sizes) == 50 and list(s1.capture_sizes) == K1
    assert s1.tokens_per_seq == 2 and s1.spec_tokens == 1
    s3 = vllm_shapes(num_speculative_tokens=3)
    assert len(s3.capture_sizes) == 49 and list(s3.capture_sizes) == K3
    s64 = vllm_shapes(max_num_seqs=64)
    assert len(s64.capture_sizes) == 19 and s64.capture_sizes[-1] == 128


def test_vllm_defaults_large_gpu_and_said_so():
    s = vllm_shapes()
    assert s.settings["max_num_seqs"] == 1024 and s.max_num_tokens == 8192
    assert list(s.token_counts()) == list(range(1, 8193))
    assert any(">= 70 GiB" in n for n in s.notes)
    assert vllm_shapes(usage="llm").max_num_tokens == 16384


@pytest.mark.parametrize("gib,name,seqs,tokens", [
    (48, None, 256, 2048), (80, None, 1024, 8192), (80, "NVIDIA A100-SXM4-80GB", 256, 2048),
    (141, "H200", 1024, 8192), (24, None, 256, 2048)])
def test_vllm_batch_defaults_by_gpu(gib, name, seqs, tokens):
    s = vllm_shapes(gpu_memory_gib=gib, gpu_name=name)
    assert (s.settings["max_num_seqs"], s.max_num_tokens) == (seqs, tokens)
    assert not any(">= 70 GiB" in n for n in s.notes)
    assert list(s.capture_sizes) == ref_vllm(seqs, tokens)


# Real serving configs: (flags, independent expectation kwargs)
REAL = [
    ("-tp 1", dict()),
    ("-tp 2", dict(tp=2)),
    ("--tensor-parallel-size 4", dict(tp=4)),
    ("-tp 8", dict(tp=8)),
    ("-tp 8 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'", dict(tp=8, k=1)),
    ("-tp 4 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'", dict(tp=4, k=3)),
    ("-tp 2 --max-num-seqs 64 --speculative-config '{\"num_speculative_tokens\":1}'", dict(max_num_seqs=64, k=1, tp=2)),
    ("--max-num-seqs 16 --speculative-config '{\"num_speculative_tokens\":3}'", dict(max_num_seqs=16, k=3)),
    ("--max-num-seqs 128 --max-num-batched-tokens 2048", dict(max_num_seqs=128, mnbt=2048)),
    ("--max-num-seqs 128 --max-num-batched-tokens 256", dict(max_num_seqs=128, mnbt=256)),
    ("--max-num-seqs 256 --max-num-batched-tokens 16384 -tp 2", dict(max_num_seqs=256, mnbt=16384, tp=2)),
    ("-tp 4 -O '{\"pass_config\":{\"enable_sp\":true}}'", dict(tp=4, sp=True)),
    ("-tp 4 -O '{\"pass_config\":{\"enable_sp\":true}}' --speculative-config '{\"num_speculative_tokens\":1}'",
     dict(tp=4, sp=True, k=1)),
    ("-tp 2 -O '{\"pass_config\":{\"enable_sp\":true}}' --speculative-config '{\"num_speculative_tokens\":3}'",
     dict(tp=2, sp=True, k=3)),
    ("-tp 8 --compilation-config '{\"pass_config\":{\"enable_sequence_parallelism\":true}}'", dict(tp=8, sp=True)),
]


@pytest.mark.parametrize("flags,kw", REAL)
def test_vllm_real_configs(flags, kw):
    s = parse_engine_args("vllm", flags)
    assert list(s.capture_sizes) == ref_vllm(**kw)
    assert s.tp_size == kw.get("tp", 1)
    assert s.max_num_tokens == kw.get("mnbt", 8192)
    assert s.sequence_parallel == (kw.get("sp", False) and kw.get("tp", 1) > 1)
    # capture sizes are token counts the engine produces
    assert set(s.capture_sizes) <= set(s.token_counts())


def test_vllm_hand_checked_small_cases():
    # max_num_seqs=64, K=1: ceiling 256 -> grid 1,2,4,8..248,256 -> multiples of 2
    assert list(vllm_shapes(max_num_seqs=64, num_speculative_tokens=1).capture_sizes) == \
        [2, 4] + list(range(8, 257, 8))
    # SP tp=4 K=0: sizes divisible by 4 only
    s = vllm_shapes(tensor_parallel_size=4, compilation_config={"pass_config": {"enable_sp": True}})
    assert s.capture_sizes[:3] == (4, 8, 16) and len(s.capture_sizes) == 49
    assert list(s.sharded_token_counts()) == list(range(1, 2049))
    # max_cudagraph_capture_size caps the grid
    assert list(vllm_shapes(max_cudagraph_capture_size=64).capture_sizes) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_vllm_explicit_sizes():
    s = parse_engine_args("vllm", ["--compilation-config", '{"cudagraph_capture_sizes":[4,1,2,2]}'])
    assert s.capture_sizes == (1, 2, 4)
    s = parse_engine_args("vllm", "--cudagraph-capture-sizes 1 2 4 8 --speculative-config "
                                  "'{\"num_speculative_tokens\":1, \"method\":\"mtp\"}'")
    assert s.capture_sizes == (2, 4, 8)
    s = parse_engine_args("vllm", "--max-num-seqs 8 --max-num-batched-tokens 2048 --cuda-graph-sizes=1,2,3000")
    assert s.capture_sizes == (1, 2) and any("3000" in n for n in s.notes)
    # vLLM's own error: the only size rounds up past the ceiling
    with pytest.raises(ConfigError, match="multiple of 4"):
        parse_engine_args("vllm", "-O.cudagraph_capture_sizes=[1] --speculative-config.num_speculative_tokens 3")


def test_vllm_no_cuda_graphs():
    for flags in ("--enforce-eager", "-O.cudagraph_mode=NONE", "--compilation-config '{\"cudagraph_mode\": \"none\"}'",
                  "--compilation-config.cudagraph_mode NONE"):
        s = parse_engine_args("vllm", flags)
        assert s.capture_sizes == () and not s.cuda_graphs, flags
        assert s.max_num_tokens == 8192 and len(s.token_counts()) == 8192
    s = parse_engine_args("vllm", "--enforce-eager --no-enforce-eager")
    assert len(s.capture_sizes) == 51
    s = parse_engine_args("vllm", "-O '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}'")
    assert len(s.capture_sizes) == 51 and s.settings["cudagraph_mode"] == "FULL_DECODE_ONLY"


# ---- SGLang ---------------------------------------------------------------------------------------

SG_NOSPEC_512 = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + [512]
SG_SPEC_512 = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
               + list(range(272, 513, 16)))


def test_sglang_worked_examples():
    s = sglang_shapes(cuda_graph_max_bs=512)
    assert len(s.capture_sizes) == 52 and list(s.capture_sizes) == SG_NOSPEC_512
    s = sglang_shapes(cuda_graph_max_bs=512, speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    assert len(s.capture_batch_sizes) == 67 and list(s.capture_batch_sizes) == SG_SPEC_512
    assert list(s.capture_sizes) == [4 * b for b in SG_SPEC_512]
    assert s.tokens_per_seq == 4 and s.spec_tokens == 3


def test_sglang_defaults():
    s = parse_engine_args("sglang", "--model-path deepseek-ai/DeepSeek-V4-Flash --tp 1")
    assert list(s.capture_sizes) == [1, 2, 4, 8, 12] + list(range(16, 257, 8))        # 256 at tp<4
    assert s.max_num_tokens == 8192 and any("H100/H200" in n for n in s.notes)
    s = parse_engine_args("sglang", "--tp-size 8")
    assert list(s.capture_sizes) == SG_NOSPEC_512 and s.tp_size == 8
    s = parse_engine_args("sglang", "--tp 2", gpu_memory_gib=24)
    assert list(s.capture_sizes) == [1, 2, 4, 8, 12, 16, 24] and s.max_num_tokens == 2048
    s = parse_engine_args("sglang", "--tp 8", gpu_memory_gib=180)
    assert list(s.capture_sizes) == SG_NOSPEC_512 and s.max_num_tokens == 16384


def test_sglang_variants():
    s = parse_engine_args("sglang", "--cuda-graph-max-bs 8 --disable-cuda-graph-padding")
    assert s.capture_sizes == tuple(range(1, 9))
    s = parse_engine_args("sglang", "--tp 8 --enable-two-batch-overlap")
    assert list(s.capture_sizes) == [b for b in SG_NOSPEC_512 if b % 2 == 0]
    s = parse_engine_args("sglang", "--tp 8 --dp 2 --enable-dp-attention")     # attn tp 4 -> mul_base 4
    assert list(s.capture_sizes) == [b for b in SG_NOSPEC_512 if b % 4 == 0]
    s = parse_engine_args("sglang", "--tp 8 --dp 2 --enable-dp-attention --speculative-algorithm NEXTN "
                                    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert list(s.capture_batch_sizes) == SG_SPEC_512
    s = parse_engine_args("sglang", "--tp 8 --max-running-requests 100")
    assert list(s.capture_batch_sizes) == [1, 2, 4, 8, 12] + list(range(16, 97, 8)) + [100]
    s = parse_engine_args("sglang", "--cuda-graph-bs 1 2 4 8 --chunked-prefill-size 2048 "
                                    "--speculative-algorithm EAGLE --speculative-num-draft-tokens 8")
    assert s.capture_sizes == (8, 16, 32, 64) and s.max_num_tokens == 2048
    s = parse_engine_args("sglang", "--cuda-graph-max-bs 512 --chunked-prefill-size 2048 "
                                    "--speculative-algorithm EAGLE --speculative-num-draft-tokens 8")
    assert s.max_num_tokens == 4096                  # widest verify batch 512 x 8 > prefill chunk
    s = parse_engine_args("sglang", "--speculative-algorithm NEXTN")
    assert s.tokens_per_seq == 4 and any("MTP defaults" in n for n in s.notes)
    s = parse_engine_args("sglang", "--disable-cuda-graph")
    assert s.capture_sizes == () and s.max_num_tokens == 8192


def test_sglang_piecewise():
    s = sglang_shapes()
    expect = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) +
              list(range(576, 1025, 64)) + [1280, 1536, 1792, 2048])
    assert list(s.piecewise_sizes) == expect and len(expect) == 42
    s = sglang_shapes(piecewise_cuda_graph_max_tokens=8192, chunked_prefill_size=8192)
    assert s.piecewise_sizes[-1] == 8192 and 4608 in s.piecewise_sizes


# ---- flag parsing ---------------------------------------------------------------------------------

def test_flag_spellings_equivalent():
    forms = ["--max-num-seqs 64 -tp 4", "--max-num-seqs=64 --tensor-parallel-size=4", "--max_num_seqs 64 --tp-size 4",
             ["--max-num-seqs", "64", "--tp", "4"], "--MAX-NUM-SEQS 64 --tensor_parallel_size 4"]
    got = {parse_engine_args("vllm", f).capture_sizes for f in forms}
    assert got == {tuple(ref_vllm(64, 8192, tp=4))}
    assert {parse_engine_args("vllm", f).tp_size for f in forms} == {4}


def test_unrelated_flags_recorded():
    s = parse_engine_args("vllm", "vllm serve deepseek-ai/DeepSeek-V4-Flash --host 0.0.0.0 --port=8000 "
                                  "--trust-remote-code --model foo --max-model-len 65536 --enable-expert-parallel "
                                  "-O3 --max-num-seqs 32")
    assert s.ignored["--host"] == "0.0.0.0" and s.ignored["--port"] == "8000"
    assert s.ignored["--trust-remote-code"] is True and s.ignored["--model"] == "foo"
    assert s.ignored["--max-model-len"] == "65536" and "-O3" in s.ignored
    assert s.ignored["_positional"] == ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash"]
    assert s.settings["max_num_seqs"] == 32
    json.dumps(s.to_dict())


def test_json_and_dotted_flags():
    s = parse_engine_args("vllm", "--speculative-config.method mtp --speculative-config.num_speculative_tokens=2")
    assert s.spec_tokens == 2 and s.settings["speculative_method"] == "mtp"
    s = parse_engine_args("vllm", "-O '{\"max_cudagraph_capture_size\": 32}' -cc.cudagraph_mode=FULL")
    assert s.capture_sizes[-1] == 32


def test_shapes_roundtrip():
    s = parse_engine_args("sglang", "--speculative-algorithm EAGLE --speculative-num-draft-tokens 2 --port 1")
    d = json.loads(json.dumps(s.to_dict()))
    assert EngineShapes.from_dict(d) == s


@pytest.mark.parametrize("engine,flags,match", [
    ("vllm", "--max-num-seqs -5", "--max-num-seqs must be >= 1"),
    ("vllm", "--max-num-seqs abc", "--max-num-seqs: expected an integer"),
    ("vllm", "--max-num-seqs 1.5", "--max-num-seqs: expected an integer"),
    ("vllm", "--max-num-seqs", "--max-num-seqs: missing value"),
    ("vllm", "-tp 0", "-tp must be >= 1"),
    ("vllm", "--max-num-seqs 300 --max-num-batched-tokens 256", "--max-num-batched-tokens=256 is smaller"),
    ("vllm", "--max-num-seqs 1024 --max-num-batched-tokens 1024 --speculative-config '{\"num_speculative_tokens\":1}'",
     r"--max-num-batched-tokens=1024 < --max-num-seqs=1024"),
    ("vllm", "--compilation-config '{\"cudagraph_mode\":\"SOMETIMES\"}'", "unknown cudagraph_mode"),
    ("vllm", "--compilation-config '{bad json'", "--compilation-config: not valid JSON"),
    ("vllm", "--speculative-config '{\"num_speculative_tokens\": -1}'", "num_speculative_tokens must be >= 0"),
    ("vllm", "--speculative-config '{\"num_speculative_tokens\": true}'", "expected an integer"),
    ("vllm", "--speculative-config '{\"method\": \"mtp\"}'", "no num_speculative_tokens"),
    ("vllm", "--cudagraph-capture-sizes 1 2 0", "sizes must be >= 1"),
    ("vllm", "--cudagraph-capture-sizes 1 2 4 --max-cudagraph-capture-size 8", "contradicts"),
    ("vllm", "--enforce-eager=maybe", "--enforce-eager: expected true/false"),
    ("vllm", "-tp 4 -O '{\"pass_config\":{\"enable_sp\":true}}' --speculative-config '{\"num_speculative_tokens\":2}'",
     "sequence parallelism"),
    ("vllm", "--max-num-seqs.x 3", "not a JSON config flag"),
    ("sglang", "--speculative-algorithm FOO", "unknown algorithm"),
    ("sglang", "--cuda-graph-bs 0 1", "--cuda-graph-bs: batch sizes must be >= 1"),
    ("sglang", "--chunked-prefill-size 0", "--chunked-prefill-size must be > 0"),
    ("sglang", "--tp 8 --dp 3 --enable-dp-attention", "--dp=3 must divide"),
    ("sglang", "--speculative-num-draft-tokens 4", "without --speculative-algorithm"),
    ("sglang", "--speculative-algorithm EAGLE --speculative-eagle-topk 4", "needed when"),
])
def test_errors_name_the_flag(engine, flags, match):
    with pytest.raises(ConfigError, match=match):
        parse_engine_args(engine, flags)


def test_spec_batched_tokens_from_defaults_is_a_note():
    s = vllm_shapes(num_speculative_tokens=15)       # 1024 x 16 > 8192, but neither value was given
    assert any("at most 512 requests" in n for n in s.notes)


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
    assert prof.shapes.ignored["--port"] == "8000"


def test_profile_json_inferred_engine(tmp_path):
    p = tmp_path / "serve.json"
    p.write_text(json.dumps({"sglang": {"cuda_graph_max_bs": 512, "tp_size": 8}}))
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


def test_sglang_server_args_object():
    args = SimpleNamespace(tp_size=8, dp_size=1, cuda_graph_bs=None, cuda_graph_max_bs=512, chunked_prefill_size=8192,
                           disable_cuda_graph=False, disable_cuda_graph_padding=False, speculative_algorithm="EAGLE",
                           speculative_num_draft_tokens=4, speculative_num_steps=3, speculative_eagle_topk=1,
                           enable_dp_attention=False, max_running_requests=None)
    s = shapes_from_config(args)
    assert s.engine == "sglang" and list(s.capture_batch_sizes) == SG_SPEC_512
    with pytest.raises(ConfigError, match="cannot read engine shapes"):
        shapes_from_config(object())
