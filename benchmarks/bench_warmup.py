"""Plan figures for common serving configs: distinct compiles vs one compile per capture size.

    python benchmarks/bench_warmup.py [--model deepseek-v4-flash] [--arch sm_120a] [--json]

No GPU and no compile needed: it runs the planner only (every kernel's `select` over every token
count) and reports the estimated cold compile time from SECONDS_PER_VARIANT_PER_CORE.
"""
from __future__ import annotations

import argparse
import json
import time

from dsv4_jit.warmup import parse_engine_args
from dsv4_jit.warmup.planner import SECONDS_PER_VARIANT_PER_CORE, build_plan
from dsv4_jit.warmup.runner import available_cpus

CONFIGS = [
    ("vllm defaults", "vllm", ""),
    ("vllm defaults + MTP (K=1)", "vllm", "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'"),
    ("vllm tp4 + MTP K=3", "vllm", "-tp 4 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'"),
    ("vllm max_num_seqs=64", "vllm", "--max-num-seqs 64"),
    ("sglang tp8 defaults", "sglang", "--tp 8"),
    ("sglang tp8 + EAGLE 4 draft", "sglang", "--tp 8 --speculative-algorithm EAGLE --speculative-num-draft-tokens 4"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--arch", default="sm_120a")
    ap.add_argument("--json", action="store_true")
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
    if a.json:
        print(json.dumps({"model": a.model, "arch": a.arch, "jobs": jobs,
                          "seconds_per_variant_per_core": SECONDS_PER_VARIANT_PER_CORE, "rows": rows}, indent=1))
        return
    print(f"model {a.model}, arch {a.arch}, {jobs} job(s), ~{SECONDS_PER_VARIANT_PER_CORE:g} s/variant/core")
    print(f"{'config':36} {'capture':>7} {'tokens':>7} {'compiles':>8} {'naive':>6} {'plan s':>7} {'cold est':>9}")
    for r in rows:
        print(f"{r['config']:36} {r['capture_sizes']:>7} {r['max_tokens']:>7} {r['compiles']:>8} {r['naive']:>6} "
              f"{r['plan_seconds']:>7} {r['est_cold_seconds']:>8.0f}s")


if __name__ == "__main__":
    main()
