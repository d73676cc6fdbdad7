"""scripts/gpu_pass.sh and the variant list it compiles first (scripts/gpu_pass_variants.py), on the CPU.

The GPU cases (test_families.test_gpu_case) assert that every variant they launch is in the plan _planned builds for
the case; so a compile list holding every such plan's variants, for the profiles the cases run (the GPU's own and
the SM120 schedule compiled for it), leaves the cases nothing to compile."""
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
    return gpv.compile_list(key_fn=lambda spec, v: v.name)


def test_the_list_covers_every_variant_the_gpu_cases_may_load(compile_list):
    import test_families as tf
    from dsv4_jit.arch import get_profile
    from dsv4_jit.model_config import load_model_config
    have = {(v.variant.kernel, v.variant.params, v.variant.schedule) for vs in compile_list.values() for v in vs}
    # compiled for the GPU: the SM120 schedule's variants carry arch sm_90a, so the cases' keys are these
    assert {v.variant.arch for vs in compile_list.values() for v in vs} == {"sm_90a"}
    assert {v.variant.schedule for vs in compile_list.values() for v in vs} == {"sm_90a", "sm_120a"}
    checked = unplanned = 0
    for fam in tf.FAMILIES:
        for model in tf.MODELS:
            for case in fam.gpu_cases(load_model_config(model)):
                if not case.planned:
                    unplanned += 1
                    continue
                for sched in ("sm_90a", get_profile("sm_120a").emulated(get_profile("sm_90a")).schedule):
                    planned = tf._planned(fam.name, model, sched, max(case.tokens), case.tp_size)
                    missing = planned - have
                    assert not missing, f"{fam.name} {model} {case.name} ({sched}): not in the list {sorted(missing)[:3]}"
                    checked += 1
    total = sum(len(f.gpu_cases(load_model_config(m))) for f in tf.FAMILIES for m in tf.MODELS)
    assert checked == 2 * (total - unplanned) and unplanned == 2   # mhc_pre[broadcast], both models: see below
    assert set(compile_list) == {f.name for f in tf.FAMILIES}


def test_unknown_family_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "scripts/gpu_pass_variants.py", "--list", "--families", "nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().startswith("gpu_pass_variants: --families: unknown nope")
    assert "Traceback" not in r.stderr


def test_gpu_pass_list_mode_runs_nothing_and_fits_one_device_call(tmp_path):
    """--list prints every step with its budget and commands; the budgets fit a 600 s call; each step's own
    commands fit its budget; nothing is written."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "JOBS": "16"}
    r = subprocess.run(["bash", "scripts/gpu_pass.sh", "--list"], cwd=ROOT, capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    total = int(lines[-1].split()[2])
    assert total <= 600
    steps = [ln for ln in lines if ln and not ln.startswith(" ") and "(budget" in ln]
    assert [s.split()[0] for s in steps] == ["env", "compile", "tests", "bench", "scoreboard"]
    budgets = {s.split()[0]: int(s.split("budget ")[1].split()[0]) for s in steps}
    assert sum(budgets.values()) == total
    # the commands under each step, their own timeouts; the compile step's GPU work runs beside the compile
    step, cmds = None, {}
    for ln in lines:
        if ln in steps:
            step = ln.split()[0]
        elif ln.strip().endswith(":") or not ln.startswith("      "):
            continue
        elif ln.strip()[0].isdigit():
            cmds.setdefault(step, []).append((int(ln.split()[0].rstrip("s")), ln.split("s  ", 1)[1]))
    assert all(sum(t for t, _ in cmds[s]) <= budgets[s] for s in ("tests", "bench", "scoreboard"))
    assert sum(t for t, _ in cmds["compile"][1:]) <= budgets["compile"]
    assert "scripts/gpu_pass_variants.py -j 14" in cmds["compile"][0][1]     # two cores left for the timing
    assert "-m gpu" in cmds["tests"][0][1]
    assert any("--arch sm_120a" in c for _, c in cmds["bench"])              # both schedules benchmarked
    assert not (tmp_path / "out").exists()


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
