"""The planner: keys == {select(t) for every token count}, every capture size maps to a planned key."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsv4_jit.arch import get_profile
from dsv4_jit.warmup import parse_engine_args, vllm_shapes
from dsv4_jit.model_uses import rows_per_token
from dsv4_jit.warmup.planner import (SECONDS_PER_VARIANT_PER_CORE, build_plan, format_table, intervals,
                                     missing_in_keys, missing_in_store)

from dsv4_jit.spec import KernelSpec, Variant


# ---- fakes (also used by test_warmup.py, whose spawned workers import this module by name) ---------

class StepSpec(KernelSpec):
    """Fake kernel: block size steps at 16 and 256, split count depends on parity above 4096."""
    name = "fake_step"

    def select(self, arch, static, num_tokens):
        self.check_tokens(num_tokens)
        block = 16 if num_tokens <= 16 else (64 if num_tokens <= 256 else 128)
        split = 1 if num_tokens <= 4096 else 2 + num_tokens % 2
        return Variant.make(self.name, {"block": block, "split": split, "hidden": static["hidden"]}, arch)


class ConstSpec(KernelSpec):
    name = "fake_const"

    def select(self, arch, static, num_tokens):
        return Variant.make(self.name, {"hidden": static["hidden"]}, arch)


@dataclass
class Use:
    spec: KernelSpec
    static: dict
    label: str


USES = [Use(StepSpec(), {"hidden": 4096}, "step.a"), Use(StepSpec(), {"hidden": 4096}, "step.same_static"),
        Use(StepSpec(), {"hidden": 7168}, "step.b"), Use(ConstSpec(), {"hidden": 4096}, "const")]


def fake_key(spec, variant):
    return f"{spec.name}:{json.dumps(variant.key_fields(), sort_keys=True)}"




class DirStore:
    """Minimal store: an entry is a file named after the key (no `root`, so workers keep it as is)."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def lookup(self, key):
        f = self.path / _fname(key)
        return str(f) if f.exists() else None

    def add(self, key):
        (self.path / _fname(key)).write_text(key)


def _fname(key: str) -> str:
    import hashlib
    return hashlib.sha256(key.encode()).hexdigest()


def fake_compile(spec_name, variant):
    """Worker job: 'compiles' into $WARMUP_FAKE_STORE; block=64 variants fail; sleeps $WARMUP_FAKE_SLEEP."""
    time.sleep(float(os.environ.get("WARMUP_FAKE_SLEEP", "0")))
    if dict(variant.params).get("block") == 64:
        raise RuntimeError("nvcc exploded")
    key = f"{spec_name}:{json.dumps(variant.key_fields(), sort_keys=True)}"
    DirStore(os.environ["WARMUP_FAKE_STORE"]).add(key)
    return {"status": "compiled"}



def plan_for(shapes, archs=("sm_120a",)):
    return build_plan("deepseek-v4-flash", shapes, list(archs), arch_reason="test", uses=USES, key_fn=fake_key)


def test_intervals():
    assert intervals([5, 1, 2, 3, 7, 8, 8]) == [(1, 3), (5, 5), (7, 8)]
    assert intervals([]) == []


@pytest.mark.parametrize("flags", ["", "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'",
                                   # 2 MTP tokens, fewer batched tokens than 48 full decode steps
                                   "--max-num-seqs 48 --max-num-batched-tokens 100 "
                                   "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":2}'",
                                   "--max-num-seqs 64 --max-num-batched-tokens 6000",
                                   "--enforce-eager --max-num-seqs 256 --max-num-batched-tokens 2048"])
def test_keys_equal_select_over_every_token_count(flags):
    shapes = parse_engine_args("vllm", flags)
    archs = ["sm_120a", "sm_90a"]
    plan = plan_for(shapes, archs)
    memo: dict = {}
    key_of = {}                              # (arch, label, t) -> key, straight from select
    for a in archs:
        for u in USES:
            for t in range(1, shapes.max_num_tokens + 1):
                var = u.spec.select(get_profile(a), u.static, t)
                if var not in memo:
                    memo[var] = fake_key(u.spec, var)
                key_of[(a, u.label, t)] = memo[var]
    assert set(plan.keys()) == set(key_of.values())
    assert plan.compiles == len(set(key_of.values()))
    byk = plan.by_key()
    # every capture size maps to a planned key, per arch and use, and the plan records it
    for (a, label, t), k in key_of.items():
        if t in shapes.capture_sizes:
            assert k in byk and t in byk[k].capture_sizes
    # token ranges cover exactly the counts whose select gives that key
    for v in plan.variants:
        covered = {t for lo, hi in v.token_ranges for t in range(lo, hi + 1)}
        want = {t for (a, label, t), k in key_of.items() if k == v.key and a == v.arch}
        assert covered == want
    assert plan.naive_compiles == len(shapes.capture_sizes) * len(USES) * len(archs)


def test_plan_figures_and_json():
    shapes = vllm_shapes(max_num_seqs=64, max_num_batched_tokens=4096)
    plan = plan_for(shapes)
    # step.a and step.same_static share keys; parity split never triggers below 4097
    assert plan.compiles == 3 + 3 + 1
    rows = {r.label: r for r in plan.rows}
    assert len(rows["step.a"].keys) == 3 and len(rows["const"].keys) == 1 and rows["const"].naive == 19
    v16 = next(v for v in plan.variants if v.token_ranges == [(1, 16)] and "step.a" in v.labels)
    assert v16.capture_sizes == [1, 2, 4, 8, 16] and v16.labels == ["step.a", "step.same_static"]
    d = json.loads(plan.to_json(jobs=2))
    assert d["totals"]["compiles"] == 7 and d["totals"]["naive_compiles"] == 19 * 4
    assert d["totals"]["estimated_cold_seconds"] == 4 * SECONDS_PER_VARIANT_PER_CORE
    assert d["model"] == "deepseek-v4-flash" and d["engine"]["capture_sizes"][-1] == 128
    cov = plan.coverage()
    assert cov["keys"] == sorted(plan.keys()) and cov["token_range"] == [1, 4096]
    table = format_table(plan, jobs=2)
    assert "distinct compiles: 7" in table and "one-per-capture-size: 76" in table


def test_parity_dependent_select_is_not_merged():
    plan = plan_for(vllm_shapes(max_num_seqs=64, max_num_batched_tokens=4100))
    odd = next(v for v in plan.variants if v.variant.p.get("split") == 3 and "step.a" in v.labels)
    assert odd.token_ranges == [(4097, 4097), (4099, 4099)]


def test_missing():
    plan = plan_for(vllm_shapes(max_num_seqs=64, max_num_batched_tokens=4096))
    keys = plan.keys()
    assert missing_in_keys(plan, keys) == []
    assert [v.key for v in missing_in_keys(plan, keys[1:])] == [keys[0]]

    class Store:
        def lookup(self, k):
            return object() if k != keys[-1] else None
    assert [v.key for v in missing_in_store(plan, Store())] == [keys[-1]]


# ---- with the real kernels (once the core's model_kernel_uses is in) ------------------------------------

def _real_uses():
    try:
        from dsv4_jit import kernels
    except ImportError as e:
        pytest.skip(f"dsv4_jit.kernels not importable yet: {e}")
    if not hasattr(kernels, "model_kernel_uses"):
        pytest.skip("dsv4_jit.kernels.model_kernel_uses not available yet")
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    model = load_model_config("deepseek-v4-flash")
    return model, kernels.model_kernel_uses(model, ParallelConfig(tp_size=1))


@pytest.mark.parametrize("k", [0, 1])
def test_real_plan_covers_every_select(k):
    model, uses = _real_uses()
    from dsv4_jit.jit import artifact_key
    shapes = vllm_shapes(num_speculative_tokens=k)
    plan = build_plan(model, shapes, ["sm_120a"], uses=uses)
    prof = get_profile("sm_120a")
    variants = {(u.spec, u.spec.select(prof, u.static, t * rows_per_token(u))) for u in uses
                for t in shapes.token_counts()}
    expect = {artifact_key(spec, var) for spec, var in variants}
    assert set(plan.keys()) == expect
    byk = plan.by_key()
    for u in uses:
        for cs in shapes.capture_sizes:
            assert artifact_key(u.spec, u.spec.select(prof, u.static, cs * rows_per_token(u))) in byk
    assert plan.compiles < plan.naive_compiles


def test_table_names_are_never_cut():
    long = "sparse MLA over the fp8_ds_mla cache (decode / MTP, every layer)"
    uses = USES + [Use(ConstSpec(), {"hidden": 7168}, long)]
    plan = build_plan("deepseek-v4-flash", vllm_shapes(max_num_seqs=64, max_num_batched_tokens=300), ["sm_120a"],
                      uses=uses, key_fn=fake_key)
    lines = format_table(plan).splitlines()
    row = next(ln for ln in lines if long in ln)
    # the kernel column is as wide as the longest name: every row's counts line up under the header
    assert row.index(long) == lines[0].index("kernel")
    header_end = lines[0].index("variants") + len("variants")
    for ln in lines[2:-2]:
        if ln.startswith("sm_120a"):
            assert ln[header_end - 1].isdigit(), ln   # the variants count ends under its header


def test_check_names_the_layer_that_holds_the_plan(tmp_path, capsys, isolated_cache):
    """With DSV4_JIT_CACHE_LAYERS, `check` says the entries are in the read-only layer, not the empty writable dir."""
    import argparse
    import hashlib
    from dsv4_jit.cache_tools import Store
    from dsv4_jit.warmup.cli import _check
    plan = build_plan("deepseek-v4-flash", vllm_shapes(max_num_seqs=64, max_num_batched_tokens=300), ["sm_120a"],
                      uses=USES, key_fn=lambda s, v: hashlib.sha256(fake_key(s, v).encode()).hexdigest())
    baked = Store(tmp_path / "baked", layers=[])
    for k in plan.keys():
        baked.get_or_build(k, {"kernel": "fake"}, lambda st: (st / "kernel.so").write_bytes(b"x") and None)
    from dsv4_jit import jit
    jit.set_default_store(Store(tmp_path / "rw", layers=[tmp_path / "baked"]))
    try:
        assert _check(plan, argparse.Namespace(bundle=None, json=True)) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["covered"] and d["layers"] == {str(tmp_path / "baked"): plan.compiles}
        assert d["where"] == f"cache layer {tmp_path / 'baked'}"
        assert _check(plan, argparse.Namespace(bundle=None, json=False)) == 0
        assert f"are in the cache layer {tmp_path / 'baked'}" in capsys.readouterr().out
        # one entry missing: say what was searched, both layers
        Store(tmp_path / "baked", layers=[]).clear()
        assert _check(plan, argparse.Namespace(bundle=None, json=False)) == 1
        out = capsys.readouterr().out
        assert f"missing from the cache (searched: writable {tmp_path / 'rw'}, read-only {tmp_path / 'baked'})" in out
    finally:
        jit.set_default_store(None)


# ---- the MTP block's e_proj / h_proj ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mtp_projections_are_listed(name, tp):
    from dsv4_jit.kernels import model_kernel_uses
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    m = load_model_config(name)
    uses = model_kernel_uses(m, ParallelConfig(tp_size=tp))
    mtp = {u.label.split(" (")[0]: u for u in uses if u.label.startswith("fp8 GEMM MTP")}
    h = m.hidden_size
    assert set(mtp) == {"fp8 GEMM MTP e_proj", "fp8 GEMM MTP h_proj"}
    for u in mtp.values():                            # replicated: the same shape at every TP
        assert u.spec.name == "fp8_gemm" and u.static == {"n": h, "k": h, "groups": 1}
    assert rows_per_token(mtp["fp8 GEMM MTP e_proj"]) == 1 and rows_per_token(mtp["fp8 GEMM MTP h_proj"]) == m.hc_mult
    assert not [u for u in model_kernel_uses(m, ParallelConfig(tp_size=tp), mtp=False)
                if u.label.startswith("fp8 GEMM MTP")]


@pytest.mark.parametrize("tp,mnbt", [(2, 1536), (4, 8192), (8, 2048)])
def test_plan_holds_mtp_gemms_when_mtp_runs(tp, mnbt):
    """With MTP on, every variant e_proj (M = tokens) and h_proj (M = hc_mult x tokens) selects is planned;
    at TP 2 below 1,537 tokens and at TP 4 / 8 some are not in the plan without MTP."""
    from dsv4_jit.jit import artifact_key
    from dsv4_jit.kernels.gemm.ops import gemm_static
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.spec import get_spec
    from dsv4_jit.warmup.engines import parse_engine_args
    m = load_model_config("deepseek-v4-flash")
    mtp = parse_engine_args("vllm", f"-tp {tp} --max-num-seqs 256 --max-num-batched-tokens {mnbt} "
                                    "-sc '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'")
    plain = parse_engine_args("vllm", f"-tp {tp} --max-num-seqs 256 --max-num-batched-tokens {mnbt}")
    with_mtp = build_plan(m, mtp, ["sm_90a"], families=["gemm"])
    without = build_plan(m, plain, ["sm_90a"], families=["gemm"])
    prof, spec, static = get_profile("sm_90a"), get_spec("fp8_gemm"), gemm_static(m.hidden_size, m.hidden_size)
    need = {artifact_key(spec, spec.select(prof, static, t * rows)) for t in range(1, mnbt + 1) for rows in (1, m.hc_mult)}
    assert need <= set(with_mtp.keys())
    assert need - set(without.keys())                 # a library caller would have compiled these at serve time
    assert not [v for v in without.variants if any(lb.startswith("fp8 GEMM MTP") for lb in v.labels)]
