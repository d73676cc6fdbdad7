"""Build, on a machine with no GPU, the bundle the GPU pass imports (the container-build case):
every variant that serving and the GPU tests select for token counts 1..MAX, for the native sm_90a
schedule and for the SM120 schedule compiled for sm_90a (WGMMA/TMA/warp specialization off).

    python scripts/build_gpu_bundle.py .artifacts/gpu_bundle.tar.gz [-j 2] [--max-tokens 8192]
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dest")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--models", nargs="+", default=["deepseek-v4-flash", "deepseek-v4-pro"])
    ap.add_argument("--tp", nargs="+", type=int, default=[1, 2, 4],
                    help="tensor-parallel sizes (the GPU cases run heads per rank at TP 1, 2 and 4)")
    ap.add_argument("--families", nargs="+", default=None, help="only these kernel families (default: all)")
    args = ap.parse_args()
    from dsv4_jit.arch import get_profile
    from dsv4_jit.jit import default_store
    from dsv4_jit.toolchain import toolchain_fingerprint
    from dsv4_jit.cache_tools.bundle import export_bundle
    from dsv4_jit.warmup.engines import vllm_shapes
    from dsv4_jit.warmup.planner import build_plan
    from dsv4_jit.warmup.runner import run_warmup

    hopper = get_profile("sm_90a")
    profiles = [hopper, get_profile("sm_120a").emulated(hopper)]
    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    fams = [f for n, f in all_families().items() if args.families is None or n in args.families]
    store = default_store()
    t0 = time.perf_counter()
    total = 0
    for model, tp in itertools.product(args.models, args.tp):
        shapes = vllm_shapes(max_num_batched_tokens=args.max_tokens, max_num_seqs=256, tensor_parallel_size=tp)
        m = load_model_config(model)
        if m.num_attention_heads % tp:
            continue
        uses = [u for f in fams for u in f.uses(m, ParallelConfig(tp_size=tp))]
        plan = build_plan(m, shapes, profiles, uses=uses, arch_reason="GPU pass: sm_90a + SM120 schedule on sm_90a")
        total += plan.compiles
        report = run_warmup(plan, jobs=args.jobs, store=store)
        print(f"{model} tp={tp}: {plan.compiles} variants; compiled {report.count('compiled')}, "
              f"cached {report.count('cached')}, failed {report.count('failed')}")
        if not report.ok:
            for r in report.results:
                if r.status == "failed":
                    print(f"FAILED {r.name}: {r.error}", file=sys.stderr)
            return 1
    rep = export_bundle(store, args.dest, toolchain_fingerprint(), archs=["sm_90a"])
    print(f"{total} variants in {time.perf_counter() - t0:.0f} s; bundle {args.dest}: {rep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
