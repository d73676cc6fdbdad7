"""benchmarks/bench_floor.py's goal points (CPU): each issue's bytes are the ones its family benchmark counts, so the
floor it times on the GPU is the floor of the figure that goal is judged by."""
import importlib
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
    return {(p["issue"], p["point"]): p for p in _load("bench_floor").goal_points()}


def test_every_open_goal_has_points(points):
    assert {i for i, _ in points} == {9, 10, 12}


def test_attention_bytes_are_bench_attentions(points):
    att = _load("attention.bench_attention")
    p = points[(9, "H64 ratio 4 64K x 8")]
    # bench_attention: batch x (valid candidates x 584 B + q + out), 512 + 128 candidates at ratio 4
    assert p["bytes"] == 8 * (640 * att.BYTES_PER_TOKEN + 2 * 64 * att.D * 2)
    assert points[(9, "H16 ratio 128 256K x 64")]["bytes"] == 64 * ((262144 // 128 + 128) * 584 + 2 * 16 * 512 * 2)
    assert p["factor"] == pytest.approx(1 / 0.7)


def test_indexer_bytes_and_budget(points):
    p = points[(10, "64K x 8")]
    assert p["bytes"] == 8 * (65536 // 4) * 132      # bench_indexer's index-K bytes
    assert p["factor"] == 1.5 and p["kernels"] == 2  # logits, then top-k


def test_gemm_bytes_follow_the_model_shapes(points):
    # V4-Flash TP 1 wo_a is 8 grouped weights of 1024 x 4096 fp8 with 128 x 128 fp32 block scales
    assert points[(12, "flash TP1 wo_a 32768->8192")]["bytes"] == 8 * (1024 * 4096 + 8 * 32 * 4)
    assert points[(12, "flash TP1 wq_a+wkv 4096->1536")]["bytes"] == 1536 * 4096 + 12 * 32 * 4
    # one token touches exactly top-k = 6 experts: packed e2m1 (n x k / 2) plus 1x32 UE8M0 exponents
    assert points[(12, "flash TP1 MoE w2 2048->4096 T1")]["bytes"] == 6 * (4096 * 2048 // 2 + 4096 * 2048 // 32)
    assert points[(12, "pro TP8 MoE w13 7168->768 T1")]["bytes"] == 6 * (768 * 7168 // 2 + 768 * 7168 // 32)


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


def test_verdicts_take_the_fastest_form_and_say_when_only_pdl_or_fusion_reaches():
    v = _load("bench_floor").verdicts
    f = {"read_us": 8.3, "dep_us": 9.6, "tl_plain_us": 8.5, "tl_prefetch_us": 6.1, "tl_dependent_us": 7.9}
    # a two-kernel step whose read fits the goal but whose dependent second kernel does not, without PDL
    assert v({"kernels": 2}, f, 8.8) == (6.1, "fused only", "yes")
    assert v({"kernels": 1}, f, 8.8) == (6.1, "yes", "yes")
    # only the PDL prefetch form reaches it
    assert v({"kernels": 1}, f, 7.0) == (6.1, "no", "yes")
    # nothing reaches it; a form that failed to time (None) is left out
    assert v({"kernels": 1}, {**f, "tl_prefetch_us": None}, 5.0) == (7.9, "no", "no")


def test_goal_table_joins_each_family_file_to_its_points_and_judges_them(points):
    """goal_table.py (CPU, synthetic files): a point is met, short (a read-only form reaches the goal, ours does not)
    or unreachable (no form does); GEMM points take every decode M; the SM120 schedule's files are left out."""
    gt = _load("goal_table")
    key = lambda issue, point: points[(issue, point)]["key"]  # noqa: E731
    fl = [{"issue": 9, "point": "H64 ratio 4 64K x 64", "key": key(9, "H64 ratio 4 64K x 64"), "bytes": 1,
           "goal_us": 11.0, "floor_us": 10.0, "copy_us": 10.0},
          {"issue": 10, "point": "64K x 1", "key": key(10, "64K x 1"), "bytes": 1, "goal_us": 0.8, "floor_us": 2.3,
           "copy_us": 2.7},
          {"issue": 12, "point": "flash TP1 wq_b 1024->32768", "key": key(12, "flash TP1 wq_b 1024->32768"),
           "bytes": 1, "goal_us": 10.0, "floor_us": 10.4, "copy_us": 10.4},
          {"issue": 12, "point": "flash TP1 MoE w13 4096->4096 T8", "key": key(12, "flash TP1 MoE w13 4096->4096 T8"),
           "bytes": 1, "goal_us": 119.0, "floor_us": 91.0, "copy_us": 145.0}]
    # bench_attention times a ratio-4 layer at its first context only (the list is 512 + 128 at any context)
    att = {"arch": "sm_90a", "rows": [{"heads": 64, "ratio": 4, "ctx": 8192, "batch": 64, "ours_sm90": {"us": 46.0}}]}
    idx = {"arch": "sm_90a", "schedule": "sm_90a",
           "rows": [{"ctx": 65536, "batch": 1, "ours_logits_topk_per_layer_us": 14.0}]}
    gemm = {"arch": "sm_90a", "schedule": "sm_90a", "model": "deepseek-v4-flash", "tp": 1,
            "rows": [{"shape": "wq_b (column-parallel)", "n": 32768, "k": 1024, "groups": 1, "m": m,
                      "ours_per_layer_us": us, "tflops": 1.0} for m, us in ((1, 9.5), (64, 12.0))]
            + [{"shape": "wq_b (column-parallel)", "n": 32768, "k": 1024, "groups": 1, "m": 8192,
                "ours_per_layer_us": None, "tflops": 900.0}]}
    sm120 = {**gemm, "schedule": "sm_120a", "rows": [{**gemm["rows"][0], "ours_per_layer_us": 1.0}]}
    moe = {"arch": "sm_90a", "schedule": "sm_90a", "model": "deepseek-v4-flash", "tp": 1,
           "rows": [{"gemm": "w13", "n": 4096, "k": 4096, "tokens": 8, "ours_per_layer_us": 155.0}]}
    rows = gt.judge({"rows": fl}, [att, idx, gemm, sm120, moe])
    got = {r["point"]: r["verdict"] for r in rows}
    assert got == {"H64 ratio 4 64K x 64": "short", "64K x 1": "unreachable",
                   "flash TP1 wq_b 1024->32768 M=1": "met", "flash TP1 wq_b 1024->32768 M=64": "unreachable",
                   "flash TP1 MoE w13 4096->4096 T8": "short"}
    wq = next(r for r in rows if r["point"].endswith("M=1"))
    assert wq["ours_over_copy"] == pytest.approx(9.5 / 10.4)
    assert gt.summary(rows)[12] == {"met": 1, "unreachable": 1, "short": 1}
    # a goal under what one PDL-chained kernel that moves nothing costs: out of reach of any kernel
    assert gt.judge({"rows": fl[1:2], "pdl_one_cta_kernel_us": 1.5}, [idx])[0]["verdict"] == "unreachable (launch)"
    assert gt.judge({"rows": fl[1:2], "pdl_one_cta_kernel_us": 0.7}, [idx])[0]["verdict"] == "unreachable"
    # nothing measured: said, not guessed
    assert gt.judge({"rows": fl[:1]}, [])[0]["verdict"] == "no data"
    big = gt.large_m_rows([gemm, sm120], gt.fp8_peak({"rows": [{"mma": gt.FP8_PEAK_ROW, "tflops": 1200.0}]}))
    assert [(r["point"], r["verdict"]) for r in big] == [("flash TP1 wq_b M=8192", "met")]
    assert big[0]["share_of_fp8_peak"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no point keys"):
        gt.judge({"rows": [{k: v for k, v in fl[0].items() if k != "key"}]}, [])


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
