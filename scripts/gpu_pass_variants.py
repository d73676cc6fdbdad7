"""Every variant a GPU pass loads, derived on the CPU, and compiled before it is needed (scripts/gpu_pass.sh).

The cases pass: GPU cases (tests/test_families.py: test_gpu_case) launch their op through `select` with the GPU's own
profile and the SM120 schedule compiled for it. Each case may launch exactly the variants
dsv4_jit.testing.case_variants gives (its op's uses that agree with what the case fixes, at each of its token
counts), and the test fails a case that launches any other: so this list leaves the cases nothing to compile. It
comes family by family in the order the tests run, so tests started beside the compile mostly find theirs built.

The bench pass: BENCH_STEPS holds the benchmark commands together with the points each one times; gpu_pass.sh runs
the commands `--bench-steps` prints, so the table and the step cannot drift apart.

    python scripts/gpu_pass_variants.py --list [--pass cases|bench]   # counts per family and schedule; no compile
    python scripts/gpu_pass_variants.py --list --json FILE             # and every variant as JSON
    python scripts/gpu_pass_variants.py --pass cases -j 16 [--time-budget 300] [--families attention indexer]
    python scripts/gpu_pass_variants.py --bench-steps DIR [--families F ...]   # the bench commands: "log budget command"
    python scripts/gpu_pass_variants.py --bench-steps DIR --prefill   # the extra prefill step's commands
    python scripts/gpu_pass_variants.py --beyond --pass cases          # after a pass: what was compiled off the list

Compiles go to the default store (DSV4_JIT_CACHE_DIR); variants already there count as cached.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_ARCH = "sm_90a"     # the GPUs the pass runs on (H100 / H200)
FLASH, PRO = "deepseek-v4-flash", "deepseek-v4-pro"
PASSES = ("cases", "bench")


@dataclass(frozen=True)
class BenchStep:
    """One benchmark command of the bench pass and the points it times: the uses of `families` (only `kernels`, and
    those agreeing with `fixes`, where given) at each (model, TP) of `at`, each token count, on each schedule
    ("native": the GPU's own; "sm_120a": the SM120 schedule compiled for it)."""
    log: str
    budget: int                     # seconds; the command's hard timeout
    argv: tuple[str, ...]           # "{out}" stands for the pass's output dir
    families: tuple[str, ...]
    at: tuple[tuple[str, int], ...]
    tokens: tuple[int, ...]
    schedules: tuple[str, ...] = ("native",)
    kernels: tuple[str, ...] = ()
    fixes: dict = field(default_factory=dict, hash=False)
    quantized_inputs: bool = False  # each fp8 GEMM's bf16 input quantized first (act_quant_fp8 over its K)
    prefill: bool = False           # gpu_pass.sh's extra `prefill` step runs it, not the bench step

    def command(self, out_dir: str) -> list[str]:
        return ["python3", *(a.replace("{out}", out_dir) for a in self.argv)]


BOTH = ("native", "sm_120a")
GEMM_M = (1, 8, 32, 64, 2048, 8192)      # bench_gemm.py's default --decode and --prefill
MOE_PREFILL_T = (2048, 8192)             # the MoE's prefill token counts
MOE_PREFILL = tuple(str(t) for t in MOE_PREFILL_T)
BENCH_STEPS: tuple[BenchStep, ...] = (
    BenchStep("bench_attention", 40, ("benchmarks/attention/bench_attention.py", "--heads", "64", "16", "--batch", "1",
                                      "8", "64", "--layers", "8", "--out", "{out}/bench_attention.json"),
              ("attention",), ((FLASH, 1), (FLASH, 4)), (1, 8, 64), BOTH, fixes={"kv_format": "fp8_ds_mla"}),
    # the attention block as the engine chains it (indexer step -> sparse MLA), V4-Flash's 64 heads, both schedules
    BenchStep("bench_attention_block", 30, ("benchmarks/attention/bench_attention_block.py", "--heads", "64",
                                            "--out", "{out}/bench_attention_block.json"),
              ("attention", "indexer"), ((FLASH, 1),), (1, 8, 64), BOTH, fixes={"kv_format": "fp8_ds_mla", "next_n": 1}),
    BenchStep("bench_indexer", 20, ("benchmarks/indexer/bench_indexer.py", "--no-torch",
                                    "--out", "{out}/bench_indexer.json"),
              ("indexer",), ((FLASH, 1),), (1, 8, 64), ("native",), fixes={"next_n": 1}),
    BenchStep("bench_indexer_sm120", 20, ("benchmarks/indexer/bench_indexer.py", "--no-torch", "--arch", "sm_120a",
                                          "--out", "{out}/bench_indexer_sm120.json"),
              ("indexer",), ((FLASH, 1),), (1, 8, 64), ("sm_120a",), fixes={"next_n": 1}),
    BenchStep("bench_gemm", 25, ("benchmarks/gemm/bench_gemm.py", "--out", "{out}/bench_gemm.json"),
              ("gemm",), ((FLASH, 1),), GEMM_M, quantized_inputs=True),
    BenchStep("bench_gemm_pro", 25, ("benchmarks/gemm/bench_gemm.py", "--model", PRO, "--tp", "8",
                                     "--out", "{out}/bench_gemm_pro.json"),
              ("gemm",), ((PRO, 8),), GEMM_M, quantized_inputs=True),
    BenchStep("bench_gemm_sm120", 25, ("benchmarks/gemm/bench_gemm.py", "--arch", "sm_120a", "--prefill",
                                       "--out", "{out}/bench_gemm_sm120.json"),
              ("gemm",), ((FLASH, 1),), GEMM_M[:4], ("sm_120a",), quantized_inputs=True),
    BenchStep("bench_moe", 15, ("benchmarks/moe/bench_moe.py", "--tokens", "1", "8", "64", "--layers", "8",
                                "--out", "{out}/bench_moe.json"),
              ("moe",), ((FLASH, 1),), (1, 8, 64), kernels=("fp4_moe_gemm",)),
    BenchStep("bench_moe_pro", 15, ("benchmarks/moe/bench_moe.py", "--model", PRO, "--tp", "8", "--tokens", "1", "8",
                                    "64", "--layers", "8", "--out", "{out}/bench_moe_pro.json"),
              ("moe",), ((PRO, 8),), (1, 8, 64), kernels=("fp4_moe_gemm",)),
    BenchStep("bench_moe_sm120", 15, ("benchmarks/moe/bench_moe.py", "--tokens", "1", "8", "64", "--layers", "8",
                                      "--arch", "sm_120a", "--out", "{out}/bench_moe_sm120.json"),
              ("moe",), ((FLASH, 1),), (1, 8, 64), ("sm_120a",), kernels=("fp4_moe_gemm",)),
    # MoE at prefill token counts, one call a replay (compute-bound: TFLOP/s against the MMA peaks): the extra
    # `prefill` step (STEPS="... prefill ..."), outside the bench step's budget
    BenchStep("bench_moe_prefill", 45, ("benchmarks/moe/bench_moe.py", "--tokens", *MOE_PREFILL,
                                        "--out", "{out}/bench_moe_prefill.json"),
              ("moe",), ((FLASH, 1),), MOE_PREFILL_T, kernels=("fp4_moe_gemm",), prefill=True),
    BenchStep("bench_moe_pro_prefill", 45, ("benchmarks/moe/bench_moe.py", "--model", PRO, "--tp", "8", "--tokens",
                                            *MOE_PREFILL, "--out", "{out}/bench_moe_pro_prefill.json"),
              ("moe",), ((PRO, 8),), MOE_PREFILL_T, kernels=("fp4_moe_gemm",), prefill=True),
    BenchStep("bench_moe_sm120_prefill", 45, ("benchmarks/moe/bench_moe.py", "--tokens", *MOE_PREFILL, "--arch",
                                              "sm_120a", "--out", "{out}/bench_moe_sm120_prefill.json"),
              ("moe",), ((FLASH, 1),), MOE_PREFILL_T, ("sm_120a",), kernels=("fp4_moe_gemm",), prefill=True),
    # the peers (vLLM's TileLang mHC, tile-kernels) compile their own kernels inside this budget
    BenchStep("bench_mhc", 135, ("benchmarks/mhc/bench_mhc.py", "--tokens", "1", "64", "4096",
                                "--out", "{out}/bench_mhc.json"),
              ("mhc",), ((FLASH, 1), (PRO, 1)), (1, 64, 4096)),
    BenchStep("bench_compressor", 15, ("benchmarks/compressor/bench_compressor.py",
                                       "--out", "{out}/bench_compressor.json"),
              ("compressor",), ((FLASH, 1),), (1, 8, 64, 512)),
)


def families(names=None, include_toy: bool = True) -> list:
    """The registered families (and the toy family the GPU cases also run), optionally only `names`."""
    from dsv4_jit.family import all_families
    fams = list(all_families().values())
    if include_toy:
        sys.path.insert(0, str(ROOT / "tests"))
        from toy_family.family import FAMILY as TOY
        fams.append(TOY)
    if names:
        unknown = sorted(set(names) - {f.name for f in fams})
        if unknown:
            raise ValueError(f"--families: unknown {', '.join(unknown)} (known: {', '.join(f.name for f in fams)})")
        fams = [f for f in fams if f.name in names]
    return fams


def compile_in_worker(spec_name: str, variant) -> dict:
    """The warmup worker's job. The toy family's spec is deliberately not in the package's registry (a real install's
    warmup must never see it), so it is found through the family and compiled the same way."""
    from dsv4_jit.jit import compile_variant, lookup
    from dsv4_jit.spec import all_specs
    from dsv4_jit.warmup.runner import compile_task
    if spec_name in all_specs():
        return compile_task(spec_name, variant)
    spec = next(s for f in families() for s in f.specs if s.name == spec_name)
    if lookup(spec, variant) is not None:
        return {"status": "cached"}
    compile_variant(spec, variant, caller="GPU pass")
    return {"status": "compiled"}


def schedules(arch: str = GPU_ARCH) -> list:
    """The schedules every GPU case runs on a GPU of `arch`: its own, and (off SM12x) the SM120 one compiled for it."""
    from dsv4_jit.arch import get_profile
    from dsv4_jit.testing import profiles_proven_on
    return profiles_proven_on(get_profile(arch))


def case_list(fams, arch: str = GPU_ARCH, case_filter: str | None = None) -> dict[str, dict]:
    """family -> {(kernel, params, schedule): (spec, variant, case name)} of every GPU case (only those whose name
    holds `case_filter`, where given), both models, both schedules, in the order the tests run them."""
    from dsv4_jit.model_config import EMBEDDED, load_model_config
    from dsv4_jit.testing import case_variants
    out: dict[str, dict] = {}
    for fam in fams:
        for model in EMBEDDED:
            m = load_model_config(model)
            for case in fam.gpu_cases(m):
                if case_filter and case_filter not in case.name:
                    continue
                for prof in schedules(arch):
                    for k, (spec, v) in case_variants(fam, case, m, prof).items():
                        out.setdefault(fam.name, {}).setdefault(k, (spec, v, case.name))
    return out


def sglang_route_list(arch: str = GPU_ARCH) -> dict[tuple, tuple]:
    """{(kernel, params, schedule): (spec, variant, label)} of the plan the SGLang route's GPU tests warm."""
    from dsv4_jit.testing import sglang_route_gpu_plan
    return {(pv.variant.kernel, pv.variant.params, pv.variant.schedule): (pv.spec, pv.variant, "sglang route GPU tests")
            for pv in sglang_route_gpu_plan(arch).variants}


def bench_list(step: BenchStep, arch: str = GPU_ARCH) -> dict[tuple, tuple]:
    """{(kernel, params, schedule): (spec, variant, step log)} of every point a benchmark step times."""
    from dsv4_jit.family import KernelUse, all_families
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    from dsv4_jit.spec import get_spec
    from dsv4_jit.testing import agrees
    by_name = {"native" if p.schedule == p.name else p.schedule: p for p in schedules(arch)}
    profs = [by_name[s] for s in step.schedules]
    uses = []
    for name in step.families:
        for model, tp in step.at:
            for use in all_families()[name].uses(load_model_config(model), ParallelConfig(tp_size=tp)):
                if step.kernels and use.spec.name not in step.kernels:
                    continue
                if not agrees(use.static, step.fixes):
                    continue
                uses.append(use)
                if step.quantized_inputs and use.spec.name == "fp8_gemm":
                    k = use.static["k"] * use.static.get("groups", 1)
                    uses.append(KernelUse(get_spec("act_quant_fp8"), {"n": k}, f"{use.label} input"))
    out: dict[tuple, tuple] = {}
    for use in uses:
        for prof in profs:
            for t in step.tokens:
                v = use.spec.select(prof, use.static, t)
                out.setdefault((v.kernel, v.params, v.schedule), (use.spec, v, step.log))
    return out


def compile_list(pass_: str = "cases", names=None, arch: str = GPU_ARCH, key_fn=None,
                 case_filter: str | None = None) -> dict[str, list]:
    """What a pass compiles first, as family -> its PlannedVariants (each key once over the whole list): the cases
    pass, every GPU case's variants (`names`: only these families); the bench pass, every benchmark step's points."""
    from dsv4_jit.warmup.planner import PlannedVariant
    if pass_ not in PASSES:
        raise ValueError(f"--pass: {pass_!r} is not one of {', '.join(PASSES)}")
    key_fn = key_fn or _artifact_key
    if pass_ == "cases":
        groups = case_list(families(names), arch, case_filter)
        if not names and not case_filter:
            listed = {k for g in groups.values() for k in g}
            groups["sglang-route"] = {k: v for k, v in sglang_route_list(arch).items() if k not in listed}
    else:
        groups, seen = {}, set()
        for step in BENCH_STEPS:
            if names and not set(step.families) & set(names):
                continue
            # every kernel a step launches, its inputs' kernels too (the GEMM benchmark's act_quant_fp8)
            for k, (spec, v, label) in bench_list(step, arch).items():
                if k not in seen:
                    seen.add(k)
                    groups.setdefault(spec_family(spec.name), {})[k] = (spec, v, label)
    return {g: [PlannedVariant(key_fn(spec, v), spec, v, [label], [], []) for spec, v, label in vs.values()]
            for g, vs in groups.items()}


def spec_family(spec_name: str) -> str:
    from dsv4_jit.family import all_families
    return next(f.name for f in all_families().values() if spec_name in f.spec_names())


def _artifact_key(spec, variant) -> str:
    from dsv4_jit.jit import artifact_key
    return artifact_key(spec, variant)


def report_beyond(pass_: str, arch: str, since: float | None = None) -> int:
    """Print how many store entries the pass's list lacks (only those created from `since`, a Unix time, when given:
    the store may hold an earlier pass's entries), and which, from each entry's key fields."""
    from dsv4_jit.jit import default_store
    listed = {v.key for vs in compile_list(pass_, None, arch).values() for v in vs}
    extra = [e for e in default_store().entries("writable")
             if e.key not in listed and (since is None or e.manifest.get("created", 0) >= since)]
    print(f"variants compiled beyond the list: {len(extra)}")
    for e in extra[:20]:
        f = e.fields
        params = ",".join(f"{k}={v}" for k, v in f.get("params", []))
        print(f"  {f.get('kernel', '?')}[{params}] {f.get('schedule', '?')} schedule on {f.get('arch', '?')}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pass", dest="pass_", default="cases", choices=PASSES,
                    help="cases: every GPU case's variants (default); bench: every benchmark step's points")
    ap.add_argument("--list", action="store_true", help="print the list (counts per family and schedule); no compile")
    ap.add_argument("--json", default=None, help="write every variant (family, kernel, schedule, params, key) here")
    ap.add_argument("--families", nargs="+", default=None, help="only these families (default: all, with the toy)")
    ap.add_argument("--case", default=None, help="cases pass: only the cases whose name holds this text")
    ap.add_argument("--arch", default=GPU_ARCH, help="the GPU's arch (default sm_90a: H100 / H200)")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="compile processes (default: the CPUs available)")
    ap.add_argument("--time-budget", type=float, default=None, help="start no compile after this many seconds")
    ap.add_argument("--bench-steps", metavar="DIR", default=None,
                    help="print the bench step's commands (log, budget in s, command), writing into DIR; nothing else")
    ap.add_argument("--prefill", action="store_true",
                    help="with --bench-steps: the extra prefill step's commands instead (MoE at prefill token counts)")
    ap.add_argument("--beyond", action="store_true",
                    help="after a pass: name the store's entries that are not in the list (what the tests and "
                         "benchmarks compiled for themselves; none when the list is complete); nothing else")
    ap.add_argument("--since", type=float, default=None, help="with --beyond: only entries created from this Unix time")
    args = ap.parse_args()
    if args.beyond:
        return report_beyond(args.pass_, args.arch, args.since)
    if args.bench_steps is not None:
        for step in BENCH_STEPS:
            if step.prefill == args.prefill and (not args.families or set(step.families) & set(args.families)):
                print(step.log, step.budget, *step.command(args.bench_steps))
        return 0
    t0 = time.perf_counter()
    try:
        lists = compile_list(args.pass_, args.families, args.arch, case_filter=args.case)
    except ValueError as e:
        print(f"gpu_pass_variants: {e}", file=sys.stderr)
        return 2
    total = sum(len(v) for v in lists.values())
    for fam, vs in sorted(lists.items()):
        per = {}
        for v in vs:
            per[v.variant.schedule] = per.get(v.variant.schedule, 0) + 1
        print(f"{fam:<12} {len(vs):>4} variants (" + ", ".join(f"{s}: {n}" for s, n in sorted(per.items())) + ")")
    what = "the GPU cases" if args.pass_ == "cases" else "the benchmarks"
    print(f"{total} variants for {what} on {args.arch}, listed in {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([{"family": f, "kernel": v.kernel, "schedule": v.variant.schedule,
                                                "arch": v.arch, "name": v.name, "key": v.key}
                                               for f, vs in sorted(lists.items()) for v in vs], indent=1))
    if args.list:
        return 0
    from dsv4_jit.warmup.planner import Plan
    from dsv4_jit.warmup.runner import run_warmup
    variants = [v for vs in lists.values() for v in vs]
    plan = Plan(f"GPU {args.pass_} pass", None, [args.arch], "GPU pass", variants, [])
    report = run_warmup(plan, jobs=args.jobs, time_budget=args.time_budget, compile_fn=compile_in_worker)
    print(f"compiled {report.count('compiled')}, cached {report.count('cached')}, failed {report.count('failed')}, "
          f"not started {report.count('not_done')} in {time.perf_counter() - t0:.0f} s")
    for r in report.results:
        if r.status == "failed":
            print(f"FAILED {r.name}: {r.error}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
