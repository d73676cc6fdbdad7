"""End to end on CPU: `dsv4-jit warmup` cross-compiles the real plan, `check` sees it covered, an
exported bundle imports elsewhere, and a fresh process that runs every kernel selection over every
token count the engine can produce performs zero compiles (with TileLang's front end booby-trapped)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ENGINE = "--max-num-seqs 64 --max-num-batched-tokens 2048"
ARGS = ["--model", "deepseek-v4-flash", "--arch", "sm_120a"]


def cli(*argv, env, check=True):
    out = subprocess.run([sys.executable, "-m", "dsv4_jit", *argv], env=env, capture_output=True, text=True,
                         timeout=1800)
    if check and out.returncode != 0:
        raise AssertionError(f"dsv4-jit {' '.join(argv)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.mark.compile
def test_warmup_then_fresh_process_never_compiles(tmp_path):
    env = dict(os.environ, DSV4_JIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DSV4_JIT_CACHE_LAYERS", None)
    missing = cli("check", *ARGS, "--vllm-args", ENGINE, env=env, check=False)
    assert missing.returncode == 1 and "NOT covered" in missing.stdout

    bundle = tmp_path / "dsv4.tar.gz"
    out = cli("warmup", *ARGS, "-j", "2", "--json", "--export", str(bundle), "--vllm-args", ENGINE, env=env)
    report = json.loads(out.stdout[out.stdout.index("{"):])["report"]
    planned = json.loads(cli("plan", *ARGS, "--json", "--vllm-args", ENGINE, env=env).stdout)
    assert report["totals"]["failed"] == 0 and report["totals"]["compiled"] == planned["totals"]["compiles"] > 0
    assert cli("check", *ARGS, "--vllm-args", ENGINE, env=env).returncode == 0
    # A second warmup compiles nothing.
    again_out = cli("warmup", *ARGS, "--json", "--vllm-args", ENGINE, env=env).stdout
    again = json.loads(again_out[again_out.index("{"):])["report"]
    assert again["totals"]["compiled"] == 0 and again["totals"]["cached"] == planned["totals"]["compiles"]

    # The bundle alone covers the plan on another path.
    env2 = dict(env, DSV4_JIT_CACHE_DIR=str(tmp_path / "elsewhere" / "cache"))
    assert cli("check", *ARGS, "--bundle", str(bundle), "--vllm-args", ENGINE, env=env2).returncode == 0
    cli("cache", "import", str(bundle), env=env2)
    assert cli("check", *ARGS, "--vllm-args", ENGINE, env=env2).returncode == 0

    child = textwrap.dedent("""
        import json
        import tilelang
        from tilelang.jit.kernel import JITKernel
        def trap(*a, **k): raise SystemExit("TileLang front end was used")
        tilelang.compile = trap; tilelang.lower = trap; JITKernel.__init__ = trap
        from dsv4_jit import jit
        from dsv4_jit.kernels import model_kernel_uses
        from dsv4_jit.model_config import load_model_config, ParallelConfig
        uses = model_kernel_uses(load_model_config("deepseek-v4-flash"), ParallelConfig(), mtp=False)  # no MTP here
        n = 0
        for use in uses:
            for t in range(1, 2049):          # every token count the engine can produce
                jit.get_kernel(use.spec, use.static, t, "sm_120a"); n += 1
        print(json.dumps({"selections": n, **{k: v for k, v in jit.counters().items() if k != "events"}}))
    """)
    from dsv4_jit.kernels import model_kernel_uses
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    n_uses = len(model_kernel_uses(load_model_config("deepseek-v4-flash"), ParallelConfig(), mtp=False))
    for e in (env, env2):
        run = subprocess.run([sys.executable, "-c", child], env=e, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        c = json.loads(run.stdout.strip().splitlines()[-1])
        assert c["compiles"] == 0 and c["sealed_compiles"] == 0
        assert c["loads"] == planned["totals"]["compiles"] and c["selections"] == n_uses * 2048
