"""Warmup figures for DeepSeek V4 serving configs.

    python benchmarks/cache/bench_warmup.py [--model deepseek-v4-flash] [--arch sm_120a] [--measure] [--out FILE]

Always (planner only, no compile): for each config, capture sizes, distinct compiles versus one compile
per capture size (per kernel use), planning time. With `--measure`, for vLLM defaults with and without
MTP: cold `dsv4-jit warmup` wall time with -j 1 and -j <all CPUs> (each into an empty cache, through
the real CLI), and warm boot: a fresh process getting every planned variant ready (loaded, callable)
from the cache. Prints tables and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsv4_jit.warmup import parse_engine_args
from dsv4_jit.warmup.planner import SECONDS_PER_VARIANT_PER_CORE, build_plan
from dsv4_jit.warmup.runner import available_cpus

MTP = "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'"
CONFIGS = [
    ("vllm defaults", "vllm", ""),
    ("vllm defaults + MTP (K=1)", "vllm", MTP),
    ("vllm tp4 + MTP K=3", "vllm", "-tp 4 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'"),
    ("vllm max_num_seqs=64", "vllm", "--max-num-seqs 64"),
    ("sglang tp8 defaults", "sglang", "--tp 8"),
    ("sglang tp8 + EAGLE 4 draft", "sglang", "--tp 8 --speculative-algorithm EAGLE --speculative-num-draft-tokens 4"),
]
MEASURED = [("vllm defaults", ""), ("vllm defaults + MTP (K=1)", MTP)]

WARM_BOOT = r"""
import json, sys, time
t0 = time.perf_counter()
import dsv4_jit
from dsv4_jit import jit
from dsv4_jit.warmup import parse_engine_args
from dsv4_jit.warmup.planner import build_plan
t_import = time.perf_counter() - t0
t_prepare = jit.prepare()   # once per process: store, toolchain fingerprint, TileLang's module loader
t1 = time.perf_counter()
plan = build_plan(sys.argv[1], parse_engine_args("vllm", sys.argv[3]), [sys.argv[2]])
t_plan = time.perf_counter() - t1
t2 = time.perf_counter()
for v in plan.variants:
    jit.load(v.spec, v.variant, compile_missing=False)
t_load = time.perf_counter() - t2
c = jit.counters()
print(json.dumps({"import_s": t_import, "prepare_s": t_prepare, "plan_s": t_plan, "load_s": t_load, "total_s": time.perf_counter() - t0,
                  "variants": len(plan.variants), "compiles": c["compiles"], "loads": c["loads"]}))
"""


def cold_warmup(model: str, arch: str, flags: str, jobs: int) -> dict:
    cache = tempfile.mkdtemp(prefix="dsv4-bench-")
    env = dict(os.environ, DSV4_JIT_CACHE_DIR=cache)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dsv4_jit", "warmup", "--model", model, "--arch", arch,
                          "-j", str(jobs), "--json", "--vllm-args", flags], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    rep = json.loads(out.stdout[out.stdout.index("{"):])["report"]
    return {"cache": cache, "wall_s": wall, "compiled": rep["totals"]["compiled"], "failed": rep["totals"]["failed"]}


def warm_boot(model: str, arch: str, flags: str, cache: str) -> dict:
    env = dict(os.environ, DSV4_JIT_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", WARM_BOOT, model, arch, flags], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--arch", default="sm_120a")
    ap.add_argument("--measure", action="store_true", help="also run real cold warmups and warm boots")
    ap.add_argument("--out", default="bench_out/warmup.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warm-cache", default=None,
                    help="skip the cold warmups; measure warm boot from this already-warmed cache")
    a = ap.parse_args()
    jobs = available_cpus()
    rows = []
    for name, engine, flags in CONFIGS:
        shapes = parse_engine_args(engine, flags)
        t0 = time.perf_counter()
        plan = build_plan(a.model, shapes, a.arch.split(","))
        rows.append({"config": name, "capture_sizes": len(shapes.capture_sizes), "max_tokens": shapes.max_num_tokens,
                     "compiles": plan.compiles, "naive": plan.naive_compiles,
                     "plan_seconds": round(time.perf_counter() - t0, 3),
                     "est_cold_seconds": plan.estimate_seconds(jobs)})
    measured = []
    if a.measure:
        for name, flags in MEASURED:
            r = {"config": name}
            cache = a.warm_cache
            for j in ([] if cache else sorted({1, jobs})):
                cw = cold_warmup(a.model, a.arch, flags, j)
                r[f"cold_j{j}_s"] = round(cw["wall_s"], 1)
                r["compiled"] = cw["compiled"]
                cache = cw["cache"]
            boots = [warm_boot(a.model, a.arch, flags, cache) for _ in range(3)]
            best = min(boots, key=lambda b: b["total_s"])
            r.update({"warm_boot_s": round(best["total_s"], 3), "warm_load_ms": round(1e3 * best["load_s"], 2),
                      "warm_import_s": round(best["import_s"], 3), "warm_prepare_s": round(best["prepare_s"], 3),
                      "warm_plan_s": round(best["plan_s"], 3),
                      "warm_compiles": max(b["compiles"] for b in boots), "variants": best["variants"]})
            measured.append(r)
    result = {"model": a.model, "arch": a.arch, "jobs": jobs, "cpus": os.cpu_count(),
              "seconds_per_variant_per_core": SECONDS_PER_VARIANT_PER_CORE, "plans": rows, "measured": measured}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"model {a.model}, arch {a.arch}, {jobs} job(s)")
    print(f"{'config':30} {'capture':>7} {'tokens':>7} {'compiles':>8} {'naive':>6} {'plan s':>7} {'cold est':>9}")
    for r in rows:
        print(f"{r['config']:30} {r['capture_sizes']:>7} {r['max_tokens']:>7} {r['compiles']:>8} {r['naive']:>6} "
              f"{r['plan_seconds']:>7} {r['est_cold_seconds']:>8.0f}s")
    if measured:
        print(f"\nmeasured on this machine ({jobs} CPUs): cold warmup through the CLI, warm boot in a fresh process")
        cols = [k for k in measured[0] if k.startswith("cold_j")]
        print(f"{'config':30} {'variants':>8} " + " ".join(f"{c:>10}" for c in cols) +
              f" {'warm boot':>10} {'imports':>8} {'prepare':>8} {'plan':>7} {'load all':>9} {'compiles':>9}")
        for r in measured:
            print(f"{r['config']:30} {r['variants']:>8} " + " ".join(f"{r[c]:>9}s" for c in cols) +
                  f" {r['warm_boot_s']:>9}s {r['warm_import_s']:>7}s {r['warm_prepare_s']:>7}s {r['warm_plan_s']:>6}s"
                  f" {r['warm_load_ms']:>6} ms {r['warm_compiles']:>9}")
        print("warm boot = fresh process: import dsv4_jit + prepare (store, fingerprint, TileLang's loader) + plan "
              "(select over every token count) + load every planned variant")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
