"""The scoreboard on the CPU: bench_floor.py's points (each family's bytes are the ones its benchmark counts, so the floor
timed on the GPU is the floor of the figure the goal is judged by), goal_table.py's verdicts and results.py's
RESULTS.md, both from synthetic JSON files shaped like the benchmarks' own."""
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """A benchmark module by its dotted name under benchmarks/ (e.g. "gemm.sweep_gemm_large_m")."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture(scope="module")
def points():
    return {(p["family"], p["point"]): p for p in _load("bench_floor").goal_points()}


def test_every_family_has_points(points):
    assert {f for f, _ in points} == {"attention", "indexer", "gemm", "moe"}


def test_attention_bytes_are_bench_attentions(points):
    att = _load("attention.bench_attention")
    p = points[("attention", "H64 ratio 4 64K x 8")]
    # bench_attention: batch x (valid candidates x 584 B + q + out), 512 + 128 candidates at ratio 4
    assert p["bytes"] == 8 * (640 * att.BYTES_PER_TOKEN + 2 * 64 * att.D * 2)
    assert points[("attention", "H16 ratio 128 256K x 64")]["bytes"] == 64 * ((262144 // 128 + 128) * 584 + 2 * 16 * 512 * 2)
    # QK and PV over 512 dims: 4 x 512 flops a candidate and head, in bf16; batch 1 is a point too
    assert p["flops"] == 8 * 64 * 640 * 4 * 512 and p["mma"] == "bf16"
    assert points[("attention", "H64 ratio 4 64K x 1")]["kernels"] == 2


def test_indexer_bytes_and_kernels(points):
    p = points[("indexer", "64K x 8")]
    assert p["bytes"] == 8 * (65536 // 4) * 132      # bench_indexer's index-K bytes
    assert p["kernels"] == 2 and p["flops"] == 8 * (65536 // 4) * 64 * 128 * 2  # logits, then top-k


def test_gemm_bytes_follow_the_model_shapes(points):
    # V4-Flash TP 1 wo_a is 8 grouped weights of 1024 x 4096 fp8 with 128 x 128 fp32 block scales
    assert points[("gemm", "flash TP1 wo_a 32768->8192")]["bytes"] == 8 * (1024 * 4096 + 8 * 32 * 4)
    assert points[("gemm", "flash TP1 wo_a 32768->8192")]["flops_per_row"] == 2 * 8 * 1024 * 4096
    assert points[("gemm", "flash TP1 wq_a+wkv 4096->1536")]["bytes"] == 1536 * 4096 + 12 * 32 * 4
    # one token touches exactly top-k = 6 experts: packed e2m1 (n x k / 2) plus 1x32 UE8M0 exponents
    assert points[("moe", "flash TP1 MoE w2 2048->4096 T1")]["bytes"] == 6 * (4096 * 2048 // 2 + 4096 * 2048 // 32)
    assert points[("moe", "pro TP8 MoE w13 7168->768 T1")]["bytes"] == 6 * (768 * 7168 // 2 + 768 * 7168 // 32)


@pytest.mark.compile
def test_stream_read_forms_place_the_dependency_sync_where_they_say():
    """The PDL forms differ only in where the grid-dependency sync sits against the 16-byte loads: after every load
    (prefetch), before them (dependent), nowhere (plain); cross-compiled for sm_90a with no GPU."""
    floor = _load("bench_floor")
    sync, trigger, load = "cudaGridDependencySynchronize()", "cudaTriggerProgrammaticLaunchCompletion()", "*(float4*)(x"
    for mode in floor.TL_MODES:
        src = floor.compile_stream_read("sm_90a", 1024, 4, 256, mode).get_kernel_source()
        body = src[src.index("__launch_bounds__"):]   # the definition (its parameters are __restrict__ without PDL)
        assert body.count(load) == 1 and "out[" in body       # one unrolled loop of 16-byte loads, then the write
        if mode == "plain":
            assert sync not in body and trigger not in body
            continue
        assert body.index(trigger) < body.index(load)
        if mode == "prefetch":
            assert body.index(load) < body.index(sync) < body.index("out[")
        else:
            assert body.index(sync) < body.index(load)
    with pytest.raises(ValueError, match="mode='eager'"):
        floor.build_stream_read(1024, 4, 256, "eager")


def test_read_floor_is_the_fastest_form_that_ran():
    rf = _load("bench_floor").read_floor
    f = {"read_us": 8.3, "dep_us": 9.6, "tl_plain_us": 8.5, "tl_prefetch_us": 6.1, "tl_dependent_us": 7.9}
    assert rf(f) == 6.1
    assert rf({**f, "tl_prefetch_us": None}) == 7.9   # a form that failed to time (None) is left out


def _pass_files(points) -> dict:
    """A synthetic GPU pass: floors, MMA peaks and one file of each scoreboard family, shaped like the benchmarks'."""
    def fl(family, point, floor, **kw):
        p = points[(family, point)]
        return {**p, "floor_us": floor, **kw}
    floor = {"device": "H100", "date": "2026-11-26 10:00 UTC", "copy_bandwidth_gbs": 3000.0,
             "pdl_one_cta_kernel_us": 1.5,
             "rows": [fl("attention", "H64 ratio 4 64K x 64", 10.0), fl("attention", "H64 ratio 4 64K x 1", 2.0),
                      fl("indexer", "64K x 1", 2.3), fl("indexer", "64K x 8", 6.0),
                      fl("gemm", "flash TP1 wq_b 1024->32768", 10.0),
                      fl("moe", "flash TP1 MoE w13 4096->4096 T8", 91.0)]}
    peak = {"device": "H100", "benchmark": "benchmarks/bench_mma_peak.py",
            "rows": [{"mma": "bf16 m16n8k16, fp32 acc", "tflops": 600.0},
                     {"mma": "fp16 m16n8k16, fp32 acc", "tflops": 620.0},
                     {"mma": "fp8 e4m3 m16n8k32, fp32 acc", "tflops": 450.0},
                     {"mma": "torch._scaled_mm fp8 8192^3 (cuBLAS)", "tflops": 1200.0}]}
    # bench_attention times a ratio-4 layer at its first context only (the list is 512 + 128 at any context)
    att = {"arch": "sm_90a", "rows": [{"heads": 64, "ratio": 4, "ctx": 8192, "batch": b,
                                       "ours_sm90": {"us": us}, "ours_sm120": {"us": 2 * us},
                                       "vllm_triton": {"us": 50.0}} for b, us in ((64, 14.0), (1, 3.5))]}
    idx = {"arch": "sm_90a", "schedule": "sm_90a", "benchmark": "benchmarks/indexer/bench_indexer.py",
           "rows": [{"ctx": 65536, "batch": 1, "ours_logits_topk_per_layer_us": 14.0},
                    {"ctx": 65536, "batch": 8, "ours_logits_topk_per_layer_us": 8.9}]}
    gemm = {"arch": "sm_90a", "schedule": "sm_90a", "model": "deepseek-v4-flash", "tp": 1,
            "rows": [{"shape": "wq_b (column-parallel)", "n": 32768, "k": 1024, "groups": 1, "m": m,
                      "ours_per_layer_us": us, "tflops": 1.0} for m, us in ((1, 9.5), (64, 14.0))]
            + [{"shape": "wq_b (column-parallel)", "n": 32768, "k": 1024, "groups": 1, "m": 8192,
                "ours_us": 500.0, "torch_us": 520.0, "ours_per_layer_us": None, "tflops": 900.0}]}
    sm120 = {**gemm, "schedule": "sm_120a", "rows": [{**gemm["rows"][0], "ours_per_layer_us": 20.0}]}
    moe = {"arch": "sm_90a", "schedule": "sm_90a", "model": "deepseek-v4-flash", "tp": 1,
           "rows": [{"gemm": "w13", "n": 4096, "k": 4096, "tokens": 8, "ours_per_layer_us": 155.0}]}
    # the MoE at a prefill token count (one call a replay, no per-layer time): reported in TFLOP/s, not judged
    moe_prefill = {**moe, "rows": [{"gemm": "w13", "n": 4096, "k": 4096, "tokens": 8192, "ours_us": 1000.0,
                                    "ours_tflops": 310.0, "operand": "float16", "ours_per_layer_us": None,
                                    "torch_us": 1500.0}]}
    moe_prefill_sm120 = {**moe_prefill, "schedule": "sm_120a",
                         "rows": [{**moe_prefill["rows"][0], "ours_tflops": 225.0, "operand": "float8_e4m3"}]}
    mhc = {"device": "H100", "benchmark": "benchmarks/mhc/bench_mhc.py", "date": "2026-11-26 10:05 UTC",
           "command": "python3 benchmarks/mhc/bench_mhc.py --out bench_out/bench_mhc.json",
           "rows": [{"model": "flash", "T": 1, "pre_graph_us": 6.3}]}
    # the attention block: ratio 4 at 64K (sparse MLA + the indexer step), and a point with no floor of its own
    block = {"device": "H100", "benchmark": "benchmarks/attention/bench_attention_block.py", "arch": "sm_90a",
             "rows": [{"heads": 64, "ratio": 4, "ctx": 65536, "batch": 1, "layers": 8,
                       "ours_sm90": {"us": 7.0, "schedule": "sm_90a"}, "ours_sm120": {"us": 9.0, "schedule": "sm_120a"}},
                      {"heads": 64, "ratio": 128, "ctx": 65536, "batch": 1, "layers": 8,
                       "ours_sm90": {"us": 5.0, "schedule": "sm_90a"}}]}
    return {"bench_floor.json": floor, "mma_peak.json": peak, "bench_attention.json": att, "bench_indexer.json": idx,
            "bench_gemm.json": gemm, "bench_gemm_sm120.json": sm120, "bench_moe.json": moe, "bench_mhc.json": mhc,
            "bench_attention_block.json": block, "bench_moe_prefill.json": moe_prefill,
            "bench_moe_sm120_prefill.json": moe_prefill_sm120}


def test_goal_table_judges_each_point_against_the_largest_floor(points, tmp_path):
    """floor = max(read, math at the measured MMA peak, PDL launch x kernels); met / short against a goal that is a
    factor of the floor, unreachable only where an absolute goal is under the floor; both schedules judged."""
    gt = _load("goal_table")
    for name, doc in _pass_files(points).items():
        (tmp_path / name).write_text(json.dumps(doc))
    sb = gt.scoreboard(tmp_path)
    got = {(r["schedule"], r["point"]): r for r in sb["rows"] if r["family"] != "attention block"}
    att = got[("sm_90a", "H64 ratio 4 64K x 64")]
    # 64 x 64 heads x 640 candidates x 2048 flops at 600 TFLOP/s = 8.95 us: under the read floor of 10
    assert att["math_floor_us"] == pytest.approx(64 * 64 * 640 * 2048 / 600e6) and att["bound"] == "read"
    assert att["ours_over_floor"] == pytest.approx(1.4) and att["verdict"] == "met"       # <= 1.5x
    assert got[("sm_120a on sm_90a", "H64 ratio 4 64K x 64")]["verdict"] == "short"       # 28 us > 15
    assert att["peer"] == "vLLM Triton" and att["peer_us"] == 50.0
    # batch 1: an absolute 4 us goal; two PDL launches (split + combine) are 3.0 us, over the read floor of 2.0
    one = got[("sm_90a", "H64 ratio 4 64K x 1")]
    assert one["bound"] == "launch" and one["floor_us"] == 3.0 and one["verdict"] == "met"
    # the indexer at batch 1: 14 us against 4 us; the floor (2 launches = 3.0) is under 4, so short, not unreachable
    assert got[("sm_90a", "64K x 1")]["verdict"] == "short"
    assert got[("sm_90a", "64K x 8")]["verdict"] == "met"                                 # 8.9 <= 1.5 x 6.0
    # decode GEMM, one row per M: 9.5 <= 13.0 met, 14.0 > 13.0 short; the SM120 schedule's file judged as its own
    assert got[("sm_90a", "flash TP1 wq_b 1024->32768 M=1")]["verdict"] == "met"
    assert got[("sm_90a", "flash TP1 wq_b 1024->32768 M=64")]["verdict"] == "short"
    assert got[("sm_120a on sm_90a", "flash TP1 wq_b 1024->32768 M=1")]["verdict"] == "short"
    # the math floor at the schedule's MMA: fp8 at cuBLAS's 1,200 TFLOP/s for sm_90a, at mma.sync's 450 for the SM120
    # schedule (mma.sync only); bf16 has no cuBLAS row, so both schedules' attention rows take mma.sync's 600
    g90, g120 = (got[(s, "flash TP1 wq_b 1024->32768 M=1")]["math_floor_us"] for s in ("sm_90a", "sm_120a on sm_90a"))
    assert g90 == pytest.approx(2 * 32768 * 1024 / 1200e6) and g120 == pytest.approx(g90 * 1200 / 450)
    assert got[("sm_120a on sm_90a", "H64 ratio 4 64K x 64")]["math_floor_us"] == pytest.approx(att["math_floor_us"])
    # MoE from 8 tokens: 155 > 1.25 x 91
    assert got[("sm_90a", "flash TP1 MoE w13 4096->4096 T8")]["verdict"] == "short"
    assert got[("sm_90a", "flash TP1 MoE w13 4096->4096 T8")]["goal"] == "<= 1.25x floor"
    # the MoE at prefill: its TFLOP/s against the fastest fp8 rate and mma.sync's rate for the variant's operand
    pre = {r["schedule"]: r for r in sb["moe_prefill"]}
    assert pre["sm_90a"]["point"] == "flash TP1 MoE w13 4096->4096 T8192" and "T8192" not in str(got)
    assert pre["sm_90a"]["share_of_fp8_peak"] == pytest.approx(310 / 1200)
    assert pre["sm_90a"]["share_of_mma_sync_peak"] == pytest.approx(310 / 620)               # f16 operands
    assert pre["sm_120a on sm_90a"]["share_of_mma_sync_peak"] == pytest.approx(225 / 450)    # e4m3 operands
    # large M against cuBLAS, and its share of the fastest measured fp8 rate
    big = sb["large_m"]
    assert [(r["point"], r["verdict"]) for r in big] == [("flash TP1 wq_b M=8192", "met")]
    assert big[0]["share_of_fp8_peak"] == pytest.approx(0.75)
    # the attention block: the sum of its steps' floors (each two PDL launches here: 3.0 + 3.0) and of their goal
    # times (4 + 4 us at batch 1); the ratio-128 block has no floor point in this pass, so it is not judged
    blk = {(r["schedule"], r["point"]): r for r in sb["rows"] if r["family"] == "attention block"}
    assert set(blk) == {("sm_90a", "H64 ratio 4 64K x 1"), ("sm_120a on sm_90a", "H64 ratio 4 64K x 1")}
    b90 = blk[("sm_90a", "H64 ratio 4 64K x 1")]
    assert b90["floor_us"] == pytest.approx(6.0) and b90["launch_floor_us"] == pytest.approx(6.0)
    assert b90["read_floor_us"] == pytest.approx(2.0 + 2.3) and b90["goal_us"] == pytest.approx(8.0)
    assert b90["verdict"] == "met" and blk[("sm_120a on sm_90a", "H64 ratio 4 64K x 1")]["verdict"] == "short"
    # an absolute goal under the floor: no kernel meets it
    assert gt.verdict(6.0, 4.0, 5.0) == "unreachable" and gt.verdict(None, 4.0, 1.0) == "no data"
    with pytest.raises(ValueError, match="no family and key"):
        gt.judge({"rows": [{"point": "x", "floor_us": 1.0}]}, [])


def test_results_md_names_every_source_and_summarises_each_family_and_schedule(points, tmp_path):
    res = _load("results")
    for name, doc in _pass_files(points).items():
        (tmp_path / name).write_text(json.dumps(doc))
    (tmp_path / "gpu_cases.jsonl").write_text("\n".join(json.dumps(line) for line in (
        {"family": "gemm", "model": "deepseek-v4-flash", "case": "fp8_gemm", "tp": 1, "schedule": "sm_90a on sm_90a",
         "worst_per_token_rel_err": {"c": [1.9e-3, 64]}, "variants": 3},
        {"family": "gemm", "model": "deepseek-v4-pro", "case": "fp8_gemm", "tp": 8,
         "schedule": "sm_120a on sm_90a", "worst_per_token_rel_err": {"c": [2.5e-3, 7]}, "variants": 3})) + "\n")
    (tmp_path / "variants.json").write_text("[]")   # the pass's variant list sits beside the benchmarks' files
    md = res.render(tmp_path)
    assert "python3 benchmarks/mhc/bench_mhc.py --out bench_out/bench_mhc.json" in md and "2026-11-26 10:05 UTC" in md
    status = md[md.index("## Status"):md.index("## Scoreboard")]
    assert "| gemm | sm_90a | 1 passed, worst 1.9e-03 | 0.95-1.40x | 1 met, 1 short |" in status
    assert "| gemm | sm_120a on sm_90a | 1 passed, worst 2.5e-03 | 2.00-2.00x | 1 short |" in status
    assert "| attention | sm_90a | - | 1.17-1.40x | 2 met |" in status
    assert "| flash TP1 wq_b M=8192 | 500.00 | 520.00 |" in md
    # the MoE at prefill token counts: its own table (TFLOP/s and the two shares), no verdict
    assert "MXFP4 MoE at prefill token counts" in md
    assert "| sm_90a | flash TP1 MoE w13 4096->4096 T8192 | 1,000.00 | 310.00 | 0.26 | 0.50 | 1,500.00 |" in md
    assert "## mhc (`bench_mhc.json`)" in md and "| flash | 1 | 6.30 |" in md
    # the block's rows are scoreboard rows (with their own status line), not an unjudged family's table
    assert "| attention block | sm_90a | - | 1.17-1.17x | 1 met |" in status
    assert "| attention block | sm_90a | H64 ratio 4 64K x 1 | 7.00 |" in md and "## attention block" not in md
    for word in ("session", "issue", "#9", "device time"):
        assert word not in md
    # the same code's whole pass on another GPU kind: a scoreboard of its own, after the first GPU's
    other = tmp_path / "h200"
    other.mkdir()
    for name, doc in _pass_files(points).items():
        doc = json.loads(json.dumps(doc).replace("\"H100\"", "\"H200\""))
        (other / name).write_text(json.dumps(doc))
    md2 = res.render(tmp_path, other_gpus=[other])
    assert md2.startswith(md[:md.index("## mhc")].rstrip("\n"))
    tail = md2[md2.index("## Scoreboard on "):md2.index("## mhc")]
    assert tail.startswith("## Scoreboard on H200") and "; attention sm_90a: 2 met; attention block" in tail
    assert "\nVerdicts: attention sm_120a on sm_90a: 2 short;" in tail
    assert "| gemm | sm_90a | flash TP1 wq_b 1024->32768 M=1 |" in tail
    # only some families of it: the others' rows and files are left out
    md3 = res.render(tmp_path, other_gpus=[other], other_families=("attention", "indexer"))
    tail = md3[md3.index("## Scoreboard on "):md3.index("## mhc")]
    assert tail.startswith("## Scoreboard on H200 (attention, indexer)")
    assert "| gemm |" not in tail and "bench_gemm" not in tail and "| moe |" not in tail
    assert "| attention block | sm_90a |" in tail and "`bench_floor.json`" in tail


def test_large_m_sweep_candidates_swap_only_the_tile_width_and_count():
    """sweep_gemm_large_m.py (CPU): every candidate is select's variant with block_n / tiles_per_cta swapped in,
    the count dividing the row's tiles, and select's own pick always among them."""
    sweep = _load("gemm.sweep_gemm_large_m")
    from dsv4_jit.arch import get_profile
    base, cands = sweep.candidates(get_profile("sm_90a"), 1536, 4096, 1, 2048, [128, 64], [1, 2, 4])
    assert base in cands and base["tiles_per_cta"] == 2
    assert {(p["block_n"], p["tiles_per_cta"]) for p in cands} == {(128, 1), (128, 2), (128, 4), (64, 1), (64, 2),
                                                                    (64, 4)}
    assert all({k: v for k, v in p.items() if k not in ("block_n", "tiles_per_cta")}
               == {k: v for k, v in base.items() if k not in ("block_n", "tiles_per_cta")} for p in cands)
    # V4-Pro TP 8 shared w1+w3: 6 tiles a row of 128, so no 4
    _, cands = sweep.candidates(get_profile("sm_90a"), 768, 7168, 1, 8192, [128], [1, 2, 4])
    assert sorted(p["tiles_per_cta"] for p in cands) == [1, 2]
    # --tall: the 192-row tile over three consumer warp groups at each count dividing the row's tiles
    base, cands = sweep.candidates(get_profile("sm_90a"), 768, 7168, 1, 8192, [], [], tall=[1, 2, 4])
    tall = [p for p in cands if p["block_m"] == 192]
    assert [(p["tiles_per_cta"], p["threads"], p["block_n"]) for p in tall] == [(1, 384, 128), (2, 384, 128)]
    assert base in cands and all(p["stages"] == 4 for p in tall)


def test_moe_tile_sweep_times_the_pick_against_the_pick_without_spread():
    """sweep_moe_tiles.py (CPU): --ab lists exactly the few-token shapes where the spread rule changes select's pick,
    the pick first, and leaves the module's constants as they were; --tiles keeps a tile only once."""
    import argparse

    from dsv4_jit.arch import get_profile
    from dsv4_jit.kernels.moe import fp4_moe_gemm as km
    from dsv4_jit.spec import get_spec
    sweep = _load("moe.sweep_moe_tiles")
    hopper = get_profile("sm_90a")
    ns = argparse.Namespace(model=list(sweep.MODELS), tp=[1, 2, 4, 8], gemm=["w13", "w2"], tokens=[1, 2, 3, 4, 5],
                            ab=True, ab_wgmma=False, tiles=None, wgmma=None)
    def constants():
        return km.SPREAD_TOKENS, dict(km.COLS_BY_ROWS), km.NARROW_COLS, km.STAGES
    before = constants()
    points = sweep.plan(ns, hopper)
    assert constants() == before
    got = {(m[12:], tp, g, t): [(tile, v.p["block_n"], v.p["threads"] // 32) for tile, v in picks]
           for m, tp, g, t, picks in points}
    assert got[("pro", 8, "w13", 1)] == [(None, 48, 8), (sweep.WITHOUT_SPREAD, 64, 8)]
    assert got[("flash", 8, "w13", 1)] == [(None, 32, 8), (sweep.WITHOUT_SPREAD, 64, 4)]
    assert len(got) == 16 and all(t <= km.SPREAD_TOKENS and g == "w13" for _, _, g, t in got)
    spec = get_spec("fp4_moe_gemm")
    for (m, tp, g, t), picks in got.items():
        assert picks[0][1:] == (lambda p: (p["block_n"], p["threads"] // 32))(
            spec.select(hopper, {"n": sweep.shape(f"deepseek-v4-{m}", tp, g)[1],
                                 "k": sweep.shape(f"deepseek-v4-{m}", tp, g)[2]}, t).p)
    ns = argparse.Namespace(model=["deepseek-v4-pro"], tp=[8], gemm=["w13"], tokens=[1], ab=False, ab_wgmma=False,
                            tiles=[(48, 8), (32, 8)], wgmma=None)
    assert [(tile, v.p["block_n"]) for *_, picks in sweep.plan(ns, hopper) for tile, v in picks] == [
        (None, 48), ((32, 8), 32)]
    # a third figure sets the stages a warp (as many as fit and as it walks K blocks): V4-Flash w2 at 8 tokens
    ns = argparse.Namespace(model=["deepseek-v4-flash"], tp=[1], gemm=["w2"], tokens=[8], ab=False, ab_wgmma=False,
                            tiles=[sweep.parse_tile("64x4x3"), sweep.parse_tile("64x4x2"), (64, 8, 3)], wgmma=None)
    assert [(tile, v.p["block_n"], v.p["threads"] // 32, v.p["stages"]) for *_, picks in sweep.plan(ns, hopper)
            for tile, v in picks] == [(None, 32, 4, 3), ((64, 4, 3), 64, 4, 3), ((64, 4, 2), 64, 4, 2),
                                      ((64, 8, 3), 64, 8, 2)]
    assert constants() == before
    # a forced tile holds at every row block: prefill token counts run 64-row blocks
    ns = argparse.Namespace(model=["deepseek-v4-flash"], tp=[1], gemm=["w13"], tokens=[8192], ab=False,
                            ab_wgmma=False, tiles=[(32, 8), (32, 4, 3)], wgmma=None)
    assert [(tile, v.p["block_m"], v.p["block_n"], v.p["threads"] // 32, v.p["stages"])
            for *_, picks in sweep.plan(ns, hopper) for tile, v in picks] == [
        (None, 64, 32, 4, 2), ((32, 8), 64, 32, 8, 2), ((32, 4, 3), 64, 32, 4, 3)]
    assert km.COLS_BY_ROWS == {8: 64, 16: 64, 32: 64, 64: 32} and km.WARPS_BY_ROWS[64] == 4
    for bad in ("48", "48x8x2x1", "0x4", "ax4"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected BNxW"):
            sweep.parse_tile(bad)


def test_gemm_swap_ab_times_every_wgmma_ring_pick_against_the_mma_sync_ring():
    """ab_gemm_swap.py (CPU): its plan holds every (shape, token count) where select takes Hopper's wgmma ring, each
    beside the pick with that rule off (the mma.sync ring, never swapped), and leaves the rule in place."""
    from dsv4_jit.arch import get_profile
    from dsv4_jit.kernels.gemm import fp8_gemm as gk
    from dsv4_jit.kernels.gemm.family import gemm_shapes
    from dsv4_jit.model_config import load_model_config
    ab = _load("gemm.ab_gemm_swap")
    hopper = get_profile("sm_90a")
    rules = gk.swap_params, gk.streaming_swap_params
    models, tps, ms = ["deepseek-v4-flash", "deepseek-v4-pro"], [1, 8], [1, 8, 9, 32, 33]
    work = ab.plan(hopper, models, tps, ms)
    assert (gk.swap_params, gk.streaming_swap_params) == rules
    want = {(mo, tp, s["n"], s["k"], s["groups"], m) for mo in models for tp in tps
            for s in gemm_shapes(load_model_config(mo), tp) for m in ms
            if gk.gemm_params(hopper, s["n"], s["k"], m, s["groups"]).get("swap")}
    assert {(mo, tp, s["n"], s["k"], s["groups"], m) for mo, tp, s, m, *_ in work} == want
    assert want and all(m <= 64 for *_, m in want) and any(m > 32 for *_, m in want)
    for *_, s, m, pick, base in work:
        assert pick["swap"] and not base.get("swap")
        if base.get("rows"):   # in the rows form's domain (the indexer's wq_b, one K share a CTA)
            assert m <= 8 and pick["split"] == 1 and pick["fill"]
        elif m > 32:   # two 32-row token tiles against the 64 x 64 TMA WGMMA tile
            assert pick["fill"] and pick["block_m"] == 32 and base["wgmma"] and base["block_m"] == 64
        else:
            assert base["ring"] and base["block_m"] == (16 if m <= 16 else 32)
        if 16 < m <= 32 and pick["block_m"] == 16:   # two 16-row token tiles at their own split
            assert pick == gk.two_tile_params(hopper, s["n"], s["k"], s["groups"])
        elif not pick.get("fill"):   # streaming: the mma.sync ring's split and 64-column tiles
            assert (pick["split"], base["block_n"]) == (base["split"], 64)
    assert any(not p.get("fill") for *_, p, _ in work) and any(p.get("fill") for *_, p, _ in work)
    # --streaming: every mma.sync ring point with both rules off, the wgmma side streaming at the ring's split
    work = ab.plan(hopper, models, tps, [1, 8, 16, 32], streaming=True)
    assert (gk.swap_params, gk.streaming_swap_params) == rules
    taken = 0
    for *_, m, cand, base in work:
        assert base["ring"] and "swap" not in base and m <= 32
        assert cand == gk.streaming_candidate(base, m) and cand["split"] == base["split"] and "fill" not in cand
        taken += gk.gemm_params(hopper, base["n"], base["k"], m, base["groups"]) == cand
    assert 0 < taken < len(work)


def test_a_later_partial_pass_replaces_the_families_it_measured(points, tmp_path):
    """A pass, then a re-run of one family's floors and benchmark in another call: that family is judged on the later
    call's floors, launch floor and peaks alone, the others on the first pass's; RESULTS.md names both calls' files."""
    gt, res = _load("goal_table"), _load("results")
    first, later = tmp_path / "pass", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    files = _pass_files(points)
    for name, doc in files.items():
        (first / name).write_text(json.dumps(doc))
    floor = files["bench_floor.json"]
    # the later call: attention floors only (read floor 10 us at batch 64, launch 1.0), its own peaks and timings
    att_rows = [{**r, "floor_us": 10.0 if r["point"].endswith("x 64") else r["floor_us"]} for r in floor["rows"]
                if r["family"] == "attention"]
    (later / "bench_floor.json").write_text(json.dumps({**floor, "date": "2026-11-26 11:00 UTC",
                                                        "pdl_one_cta_kernel_us": 1.0, "rows": att_rows}))
    (later / "mma_peak.json").write_text(json.dumps(files["mma_peak.json"]))
    att = files["bench_attention.json"]
    (later / "bench_attention.json").write_text(json.dumps(
        {**att, "date": "2026-11-26 11:01 UTC", "rows": [{**r, "ours_sm90": {"us": 11.0}} for r in att["rows"]]}))
    sb = gt.scoreboard([first, later])
    got = {(r["family"], r["schedule"], r["point"]): r for r in sb["rows"]}
    a64 = got[("attention", "sm_90a", "H64 ratio 4 64K x 64")]
    assert a64["ours_us"] == 11.0 and a64["floor_us"] == 10.0 and a64["verdict"] == "met"   # 11 <= 1.5 x 10
    a1 = got[("attention", "sm_90a", "H64 ratio 4 64K x 1")]
    assert a1["launch_floor_us"] == pytest.approx(2.0) and a1["bound"] == "read"            # 2 x 1.0, under 2.0 read
    # the first pass still judges the families the later one did not re-run, with its own launch floor (1.5)
    assert got[("indexer", "sm_90a", "64K x 1")]["launch_floor_us"] == pytest.approx(3.0)
    assert got[("gemm", "sm_90a", "flash TP1 wq_b 1024->32768 M=1")]["verdict"] == "met"
    assert [p["families"] for p in sb["passes"]] == [["gemm", "indexer", "moe"], ["attention"]]
    md = res.render([first, later])
    assert "2026-11-26 11:01 UTC" in md and md.count("`bench_floor.json`") == 2
    assert "- H100 (attention): copy" in md and "- H100 (gemm, indexer, moe): copy" in md


def test_results_md_shows_a_later_folders_gather_floor_as_a_table_of_its_own(points, tmp_path):
    """bench_gather_floor.py's file (in a later folder: a run of its own) is a table of its own, judging nothing."""
    res, gt = _load("results"), _load("goal_table")
    for name, doc in _pass_files(points).items():
        (tmp_path / name).write_text(json.dumps(doc))
    later = tmp_path / "gather"
    later.mkdir()
    doc = {"device": "H100", "benchmark": "benchmarks/attention/bench_gather_floor.py", "date": "2026-11-27 18:30 UTC",
           "command": "python3 benchmarks/attention/bench_gather_floor.py --out x.json", "layers": 8,
           "rows": [{"ratio": 4, "ctx": 65536, "batch": 64, "candidates": 640, "row_bytes": 23920640,
                     "shuffled_us": 12.5, "shuffled_shape": [64, 128], "sorted_us": 12.4, "in_order_us": 10.8,
                     "shuffled_over_in_order": 1.157}]}
    (later / "bench_gather_floor.json").write_text(json.dumps(doc))
    assert gt.family_of(doc) == gt.GATHER_FLOOR
    md = res.render([tmp_path, later])
    assert "## attention gather floor (`bench_gather_floor.json`)" in md
    assert "| 4 | 65,536 | 64 | 640 | 23,920,640 | 12.50 | 12.40 | 10.80 | 1.16 |" in md
    assert "python3 benchmarks/attention/bench_gather_floor.py --out x.json" in md
    sb = gt.scoreboard([tmp_path, later])
    assert not [r for r in sb["rows"] if r["family"] == gt.GATHER_FLOOR]


def test_pass_lines_name_each_measuring_pass_and_skip_a_folder_without_floors():
    # the gather floor's folder has no floors, launch floor or peaks of its own: no "? (): copy 0 GB/s" line for it
    gt = _load("goal_table")
    full = {"device": "GPU A", "copy_bandwidth_gbs": 3000.0, "pdl_one_cta_kernel_us": 1.5,
            "mma_peak_tflops": {"fp8": 1400.0}, "families": []}
    part = {**full, "families": ["moe"], "copy_bandwidth_gbs": 2900.0}
    empty = {"device": None, "copy_bandwidth_gbs": None, "pdl_one_cta_kernel_us": None, "mma_peak_tflops": {},
             "families": []}
    lines = gt.pass_lines({"passes": [full, empty, part]})
    synced = {**full, "mma_sync_peak_tflops": {"fp8": 450.0}}
    assert gt.pass_lines({"passes": [synced]}) == [
        "GPU A: copy 3,000 GB/s; a PDL-chained one-CTA kernel 1.50 us a layer; MMA peaks fp8 1,400 (mma.sync 450) "
        "TFLOP/s"]
    assert lines == ["GPU A: copy 3,000 GB/s; a PDL-chained one-CTA kernel 1.50 us a layer; MMA peaks fp8 1,400 TFLOP/s",
                     "GPU A (moe): copy 2,900 GB/s; a PDL-chained one-CTA kernel 1.50 us a layer; MMA peaks fp8 1,400 "
                     "TFLOP/s"]


def test_decode_sweep_swap_candidates_take_the_token_tile_asked_for():
    """sweep_gemm_decode.py --swap (CPU): select's pick first, then the wgmma ring at decode_split's split and its
    neighbours; --swap-block-m 32 at 64 tokens gives two token tiles, with fill as ring_fill counts both tiles' CTAs."""
    import argparse

    from dsv4_jit.arch import get_profile
    from dsv4_jit.kernels.gemm import fp8_gemm as gk
    sweep = _load("gemm.sweep_gemm_decode")
    hopper = get_profile("sm_90a")
    ns = argparse.Namespace(block_m=None, picked_only=True, wgmma=False, pdl_ab=False, swap=True, swap_block_m=32,
                            wgmma_splits=False, rows=False, fill=False, block_n=[64, 128], ring=[0, 1],
                            k_stage=[1, 2, 4], threads=[128, 256], max_waves=4)
    for n, k, groups, one_wave in ((4096, 256, 1, True), (7168, 384, 1, False)):   # V4-Flash / V4-Pro TP 8 w2
        cands = sweep.candidates(hopper, n, k, groups, 64, ns)
        assert cands[0] == gk.gemm_params(hopper, n, k, 64, groups)
        swaps = [p for p in cands if p.get("swap")]   # (select's own pick at V4-Flash's w2)
        assert swaps and all(p["block_m"] == 32 and p["block_n"] == 64 for p in swaps)
        filled = [p for p in swaps if p.get("fill")]
        # (ring_fill: the two tiles' CTAs in one wave, or a one-slot ring, which would prefetch nothing)
        assert all(2 * groups * n // 64 * p["split"] <= hopper.num_sms_hint or p["stages"] == 1 for p in filled)
        assert any(2 * groups * n // 64 * p["split"] <= hopper.num_sms_hint for p in filled) == one_wave
    ns.swap_block_m = None   # the fewest of 16 / 32 / 64 rows holding M
    assert {p["block_m"] for p in sweep.candidates(hopper, 4096, 256, 1, 20, ns) if p.get("swap")} == {32}


def test_write_rows_keeps_a_cut_run_and_goal_table_names_it(tmp_path, monkeypatch, capsys):
    """A long run rewrites its JSON after each point ("complete": false), whole each time; the final write marks it
    complete. goal_table keeps a cut run's rows and says on stderr that its missing points are not judged."""
    harness, gt = _load("harness"), _load("goal_table")
    monkeypatch.setattr(harness.torch.cuda, "get_device_name", lambda *a: "test GPU")
    out = tmp_path / "sub" / "run.json"
    harness.write_rows(str(out), [{"us": 1.0}], partial=True, model="m")
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["rows"] == [{"us": 1.0}] and doc["model"] == "m"
    assert capsys.readouterr().out == "" and not list(out.parent.glob("*.tmp"))
    assert gt.load(out)["rows"] == [{"us": 1.0}]
    assert "cut short (1 rows)" in capsys.readouterr().err
    harness.write_rows(str(out), [{"us": 1.0}, {"us": 2.0}], model="m")
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and len(doc["rows"]) == 2 and "wrote" in capsys.readouterr().out
    assert gt.load(out) == doc and capsys.readouterr().err == ""
