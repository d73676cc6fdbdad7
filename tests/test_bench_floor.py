"""benchmarks/bench_floor.py's goal points (CPU): each issue's bytes are the ones its family benchmark counts, so the
floor it times on the GPU is the floor of the figure that goal is judged by."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def points():
    return {(p["issue"], p["point"]): p for p in _load("bench_floor").goal_points()}


def test_every_open_goal_has_points(points):
    assert {i for i, _ in points} == {9, 10, 12}


def test_attention_bytes_are_bench_attentions(points):
    att = _load("bench_attention")
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
