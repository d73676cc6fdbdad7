"""scripts/gpu_pass.sh and the variant list it compiles first (scripts/gpu_pass_variants.py), on the CPU.

Each GPU case may launch exactly the variants dsv4_jit.testing.case_variants gives (test_families.test_gpu_case fails
it otherwise); the list holds them for both schedules and both models, so the cases compile nothing. A planned case's
variants are also in the plan it is checked against (the GPU test asserts both)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import gpu_pass_variants as gpv  # noqa: E402


@pytest.fixture(scope="module")
def compile_list():
    return gpv.compile_list("cases", key_fn=lambda spec, v: v.name)


def _key(v) -> tuple:
    return (v.kernel, v.params, v.schedule)


def test_the_list_holds_every_variant_each_case_may_launch(compile_list):
    import test_families as tf
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.testing import case_variants, sglang_route_gpu_plan
    have = {_key(v.variant) for vs in compile_list.values() for v in vs}
    # compiled for the GPU: the SM120 schedule's variants carry arch sm_90a, so the cases' keys are these
    assert {v.variant.arch for vs in compile_list.values() for v in vs} == {"sm_90a"}
    assert {v.variant.schedule for vs in compile_list.values() for v in vs} == {"sm_90a", "sm_120a"}
    checked = 0
    for fam in tf.FAMILIES:
        for model in tf.MODELS:
            m = load_model_config(model)
            for case in fam.gpu_cases(m):
                for prof in gpv.schedules():
                    missing = set(case_variants(fam, case, m, prof)) - have
                    assert not missing, f"{fam.name} {model} {case.name} ({prof.schedule}): {sorted(missing)[:3]}"
                    checked += 1
    assert checked == 2 * sum(len(f.gpu_cases(load_model_config(m))) for f in tf.FAMILIES for m in tf.MODELS)
    assert set(compile_list) == {f.name for f in tf.FAMILIES} | {"sglang-route"}
    # the SGLang route's GPU tests warm a plan of their own: every variant of it is on the list
    assert {_key(pv.variant) for pv in sglang_route_gpu_plan("sm_90a").variants} <= have
    # each key once over all groups: the pool compiles each variant once
    assert len(have) == sum(len(vs) for vs in compile_list.values())


def test_each_case_declares_uses_of_its_family():
    """A case's op is one of its family's ops and names at least one use. (A planned case's uses are the family's uses
    at its TP, which the plan enumerates at every token count up to 8,192: what it declares is in its plan.)"""
    import test_families as tf
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.testing import case_op, case_uses
    for fam in tf.FAMILIES:
        for model in tf.MODELS:
            m = load_model_config(model)
            for case in fam.gpu_cases(m):
                assert case_uses(fam, case, m), f"{fam.name} {model} {case.name}: no use agrees with {case.fixes}"
                assert max(case.tokens) <= 8192, f"{fam.name} {case.name}: token counts past the plan's 8,192"
                if fam.ops:
                    assert case_op(fam, case) in fam.ops


def test_a_case_naming_an_unknown_op_is_a_clear_error():
    from dataclasses import replace

    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.testing import case_op
    gemm = all_families()["gemm"]
    case = gemm.gpu_cases(load_model_config("deepseek-v4-flash"))[0]
    with pytest.raises(ValueError, match=r"op 'fp8_gem' is not one of the family's ops \(fp8_gemm\); set GpuCase.op"):
        case_op(gemm, replace(case, op="fp8_gem"))


def test_bench_steps_name_real_scripts_and_print_as_the_table_says():
    """Each benchmark step runs a script of the repo over points of registered families, and --bench-steps prints
    exactly the table's commands, in its order."""
    from dsv4_jit.family import all_families
    for step in gpv.BENCH_STEPS:
        assert (ROOT / step.argv[0]).is_file(), step.argv[0]
        assert set(step.families) <= set(all_families())
        assert gpv.bench_list(step), step.log
    listed = gpv.compile_list("bench", key_fn=lambda spec, v: v.name)
    assert sum(len(gpv.bench_list(s)) for s in gpv.BENCH_STEPS) >= sum(len(vs) for vs in listed.values()) > 0
    r = subprocess.run([sys.executable, "scripts/gpu_pass_variants.py", "--bench-steps", "OUTDIR"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [s.log for s in gpv.BENCH_STEPS if not s.prefill]
    assert all(ln.split()[2] == "python3" and "OUTDIR/" in ln for ln in lines)
    # the extra prefill step's commands: the MoE at prefill token counts, both models and schedules
    r = subprocess.run([sys.executable, "scripts/gpu_pass_variants.py", "--bench-steps", "OUTDIR", "--prefill"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pre = r.stdout.splitlines()
    assert [ln.split()[0] for ln in pre] == [s.log for s in gpv.BENCH_STEPS if s.prefill] == [
        "bench_moe_prefill", "bench_moe_pro_prefill", "bench_moe_sm120_prefill"]
    assert all("--tokens 2048 8192 " in ln and "--layers" not in ln for ln in pre)


def test_unknown_family_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "scripts/gpu_pass_variants.py", "--list", "--families", "nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().startswith("gpu_pass_variants: --families: unknown nope")
    assert "Traceback" not in r.stderr


def _listed(tmp_path, *args: str, **extra_env: str) -> tuple[dict, dict, int]:
    """(step -> budget, step -> [(timeout, command)], total) from `gpu_pass.sh --list ARGS`."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "JOBS": "16", **extra_env}
    r = subprocess.run(["bash", "scripts/gpu_pass.sh", "--list", *args], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    steps = [ln for ln in lines if ln and not ln.startswith(" ") and "(budget" in ln]
    budgets = {s.split()[0]: int(s.split("budget ")[1].split()[0]) for s in steps}
    step, cmds = None, {}
    for ln in lines:
        if ln in steps:
            step = ln.split()[0]
        elif ln.startswith("      ") and ln.strip()[0].isdigit():
            cmds.setdefault(step, []).append((int(ln.split()[0].rstrip("s")), ln.split("s  ", 1)[1]))
    assert not (tmp_path / "out").exists()        # --list runs and writes nothing
    return budgets, cmds, int(lines[-1].split()[2])


def test_each_gpu_pass_fits_one_device_call(tmp_path):
    """Each pass's steps fit a 600 s call with room for its setup (the background compile ends inside the steps after
    it: the compile's budget is no more than theirs); each step's own commands fit its budget."""
    for args, steps in ((("cases",), ["env", "compile", "tests"]),
                        (("bench",), ["env", "compile", "floors", "bench", "scoreboard"])):
        budgets, cmds, total = _listed(tmp_path, *args)
        assert list(budgets) == steps
        assert sum(b for s, b in budgets.items() if s != "compile") == total and total <= 570
        assert budgets["compile"] <= total - budgets["env"]
        assert all(sum(t for t, _ in cmds[s]) <= budgets[s] for s in steps if s != "compile")
        assert f"scripts/gpu_pass_variants.py --pass {args[0]} -j 14" in cmds["compile"][0][1]  # two cores stay free
    assert _listed(tmp_path)[0] == _listed(tmp_path, "cases")[0]                      # cases is the default
    budgets, cmds, _ = _listed(tmp_path, "cases")
    assert "-m gpu" in cmds["tests"][0][1]
    budgets, cmds, _ = _listed(tmp_path, "bench")
    bench = [c for _, c in cmds["bench"] if "--beyond" not in c]
    assert [c.split()[1] for c in bench] == [s.argv[0] for s in gpv.BENCH_STEPS if not s.prefill]
    assert any("--arch sm_120a" in c for c in bench)                                 # both schedules benchmarked
    # the extra prefill step: its commands fit its budget, and with the MoE's bench pass it fits one call
    budgets, cmds, total = _listed(tmp_path, "bench", STEPS="env compile floors bench prefill scoreboard",
                                   FAMILIES="moe")
    assert sum(t for t, _ in cmds["prefill"]) <= budgets["prefill"]
    moe_bench = sum(t for t, c in cmds["bench"])
    floors = sum(t for t, _ in cmds["floors"])
    assert budgets["env"] + floors + moe_bench + budgets["prefill"] + budgets["scoreboard"] <= 570


def test_a_bench_pass_of_some_families_runs_their_floors_and_benchmarks_only(tmp_path):
    _, cmds, _ = _listed(tmp_path, "bench", FAMILIES="attention indexer mhc")
    bench = [c.split()[1] for _, c in cmds["bench"] if "--beyond" not in c]
    assert bench == [s.argv[0] for s in gpv.BENCH_STEPS if set(s.families) & {"attention", "indexer", "mhc"}]
    assert "benchmarks/attention/bench_attention_block.py" in bench and "benchmarks/gemm/bench_gemm.py" not in bench
    # the floors of the scoreboard's families among them (mHC has none); the compile is those families' list
    assert cmds["floors"][0][1].endswith("--families attention indexer")
    assert cmds["compile"][0][1].endswith("--families attention indexer mhc")
    _, cmds, _ = _listed(tmp_path, "bench", FAMILIES="mhc")
    assert [c.split()[1] for _, c in cmds["floors"]] == ["benchmarks/bench_mma_peak.py"]


def test_gpu_pass_rejects_an_unknown_argument():
    r = subprocess.run(["bash", "scripts/gpu_pass.sh", "bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown argument 'bogus'" in r.stderr


def test_the_unplanned_mhc_broadcast_case_is_covered(compile_list):
    """mhc_pre[broadcast] (no forward pass runs the broadcast fuse without its RMSNorm) launches mhc_pre_fuse with
    broadcast and without the norm, which no plan holds: the list has it at each of the case's token counts."""
    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    mhc = all_families()["mhc"]
    have = {(v.variant.kernel, v.variant.params, v.variant.schedule) for v in compile_list["mhc"]}
    for model in ("deepseek-v4-flash", "deepseek-v4-pro"):
        m = load_model_config(model)
        case = next(c for c in mhc.gpu_cases(m) if c.name == "mhc_pre[broadcast]")
        assert not case.planned
        fuse = next(u for u in mhc.uses(m, ParallelConfig()) if u.spec.name == "mhc_pre_fuse")
        static = {**fuse.static, "with_norm": False, "broadcast": True}
        for prof in gpv.schedules():
            for t in case.tokens:
                v = fuse.spec.select(prof, static, t)
                assert (v.kernel, v.params, v.schedule) in have, (model, prof.schedule, t)


def test_a_bench_list_of_some_families_holds_every_kernel_their_steps_launch():
    # the GEMM benchmark quantizes each input first: its act_quant_fp8 variants (family quant) are on the gemm list
    lists = gpv.compile_list("bench", ["gemm"])
    kernels = {pv.spec.name for vs in lists.values() for pv in vs}
    assert {"fp8_gemm", "fp8_gemm_reduce", "act_quant_fp8"} <= kernels
    assert "sparse_mla_fwd" not in kernels
