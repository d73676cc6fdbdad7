"""The container recipe (examples/container/) on CPU: its build stage and runtime stage as two fresh
cache directories, running exactly the `dsv4-jit` command lines the Dockerfile runs (parsed from it, with
the build args a small test plan needs), so the recipe cannot drift from what is tested here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_cli(*argv: str, env: dict, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dsv4_jit", *argv], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"dsv4-jit {' '.join(argv)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def clean_env(tmp_path, cache) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(cache), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    return env


# ---- --family: the smallest real plan the CLI offers -------------------------------------------------

def test_family_filter_narrows_the_plan(tmp_path):
    env = clean_env(tmp_path, tmp_path / "cache")
    eng = ["--vllm-args", "--max-num-seqs 1 --max-num-batched-tokens 1 --enforce-eager"]
    full = json.loads(run_cli("plan", "--arch", "sm_120a", "--json", *eng, env=env).stdout)
    per = {}
    for fam in ("mhc", "attention", "indexer"):
        p = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", fam, "--json", *eng, env=env).stdout)
        per[fam] = {v["key"] for v in p["variants"]}
        assert per[fam] and any("--family" in n for n in p["notes"])
    assert set().union(*per.values()) == {v["key"] for v in full["variants"]}
    both = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", "mhc,attention", "--json", *eng, env=env).stdout)
    assert {v["key"] for v in both["variants"]} == per["mhc"] | per["attention"]
    # "all" is the default; an unknown family is a one-line error naming the known ones
    alls = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", "all", "--json", *eng, env=env).stdout)
    assert alls["totals"] == full["totals"]
    bad = run_cli("plan", "--family", "nope", env=env, check=False)
    assert bad.returncode == 1 and "known: attention, indexer, mhc" in bad.stderr and "Traceback" not in bad.stderr
