"""Every variant the GPU cases load, derived on the CPU, and compiled before they run (scripts/gpu_pass.sh's first step).

A GPU case (tests/test_families.py: test_gpu_case) launches its op through `select` with the GPU's own profile or
the SM120 schedule compiled for it, and asserts that every variant it launched is in the plan for vLLM's defaults
at the case's TP and largest token count. So the union of those plans, per case and schedule, is a list that holds
every variant the cases can load: compiled first, in parallel, the cases then load everything and compile nothing.
A case no forward pass makes (planned=False: mHC pre's broadcast form without its RMSNorm) is bound by no plan: for
it, the family's uses with their boolean flags in every combination are selected at each of the case's token counts
(the GPU pass reports how many variants the tests still compiled: 0 when the list was complete).

    python scripts/gpu_pass_variants.py --list                  # counts per family and schedule; no compile
    python scripts/gpu_pass_variants.py --list --json FILE      # and every variant as JSON
    python scripts/gpu_pass_variants.py -j 16 [--time-budget 300] [--families attention indexer]

Compiles go to the default store (DSV4_JIT_CACHE_DIR); variants already there count as cached.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_ARCH = "sm_90a"     # the GPUs the pass runs on (H100 / H200)


@dataclass(frozen=True)
class CasePlan:
    """One GPU case's plan inputs: the family, model, TP and largest token count its plan is built for."""
    family: str
    model: str
    case: str
    tp_size: int
    max_tokens: int


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


def case_plans(fams, planned: bool = True) -> list[tuple[CasePlan, object]]:
    """(plan inputs, the GpuCase) of every case that is (or, planned=False, is not) planned."""
    from dsv4_jit.model_config import EMBEDDED, load_model_config
    out = []
    for fam in fams:
        for model in EMBEDDED:
            for case in fam.gpu_cases(load_model_config(model)):
                if case.planned == planned:
                    out.append((CasePlan(fam.name, model, case.name, case.tp_size, max(case.tokens)), case))
    return out


def widened_uses(fam, cp: CasePlan) -> list[tuple]:
    """(spec, static) of the family's uses at the case's model and TP with their boolean flags in every combination:
    the op forms a forward pass does not make (an unplanned case) differ from the planned ones in such flags."""
    import itertools
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    out: dict[tuple, tuple] = {}
    for use in fam.uses(load_model_config(cp.model), ParallelConfig(tp_size=cp.tp_size)):
        flags = [k for k, v in use.static.items() if isinstance(v, bool)]
        for combo in itertools.product((False, True), repeat=len(flags)):
            static = {**use.static, **dict(zip(flags, combo))}
            out.setdefault((use.spec.name, tuple(sorted(static.items()))), (use.spec, static))
    return list(out.values())


def schedules(arch: str = GPU_ARCH) -> list:
    """The two schedules every GPU case runs: the GPU's own, and the SM120 schedule compiled for it."""
    from dsv4_jit.arch import get_profile
    native = get_profile(arch)
    return [native, get_profile("sm_120a").emulated(native)]


def case_plan(fam, cp: CasePlan, profile, key_fn=None):
    """The plan a GPU case is checked against (test_families._planned), for one schedule profile."""
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    from dsv4_jit.warmup.engines import vllm_shapes
    from dsv4_jit.warmup.planner import build_plan
    m = load_model_config(cp.model)
    # vLLM refuses max_num_batched_tokens below max_num_seqs; a larger plan still holds every smaller count
    shapes = vllm_shapes(max_num_batched_tokens=max(cp.max_tokens, 8192), tensor_parallel_size=cp.tp_size)
    return build_plan(m, shapes, [profile], uses=fam.uses(m, ParallelConfig(tp_size=cp.tp_size)), key_fn=key_fn,
                      arch_reason="GPU pass")


def compile_list(names=None, arch: str = GPU_ARCH, key_fn=None) -> dict[str, list]:
    """family -> its PlannedVariants (distinct keys) over every GPU case, model and both schedules."""
    from dsv4_jit.warmup.planner import PlannedVariant
    fams = families(names)
    by_name = {f.name: f for f in fams}
    seen: set[tuple] = set()
    out: dict[str, dict] = {}
    for cp, _ in case_plans(fams):
        for prof in schedules(arch):
            sig = (cp.family, cp.model, cp.tp_size, max(cp.max_tokens, 8192), prof.schedule)
            if sig in seen:
                continue   # cases that share a model, TP and token range share a plan
            seen.add(sig)
            for v in case_plan(by_name[cp.family], cp, prof, key_fn).variants:
                out.setdefault(cp.family, {}).setdefault(v.key, v)
    for cp, case in case_plans(fams, planned=False):
        for prof in schedules(arch):
            for spec, static in widened_uses(by_name[cp.family], cp):
                for t in case.tokens:
                    try:
                        v = spec.select(prof, static, t)
                    except ValueError:
                        continue   # a flag combination the kernel does not take
                    key = (key_fn or _artifact_key)(spec, v)
                    out.setdefault(cp.family, {}).setdefault(key, PlannedVariant(key, spec, v, [case.name], [], []))
    return {f: list(vs.values()) for f, vs in out.items()}


def _artifact_key(spec, variant) -> str:
    from dsv4_jit.jit import artifact_key
    return artifact_key(spec, variant)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the list (counts per family and schedule); no compile")
    ap.add_argument("--json", default=None, help="write every variant (family, kernel, schedule, params, key) here")
    ap.add_argument("--families", nargs="+", default=None, help="only these families (default: all, with the toy)")
    ap.add_argument("--arch", default=GPU_ARCH, help="the GPU's arch (default sm_90a: H100 / H200)")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="compile processes (default: the CPUs available)")
    ap.add_argument("--time-budget", type=float, default=None, help="start no compile after this many seconds")
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        lists = compile_list(args.families, args.arch)
    except ValueError as e:
        print(f"gpu_pass_variants: {e}", file=sys.stderr)
        return 2
    total = sum(len(v) for v in lists.values())
    for fam, vs in sorted(lists.items()):
        per = {}
        for v in vs:
            per[v.variant.schedule] = per.get(v.variant.schedule, 0) + 1
        print(f"{fam:<12} {len(vs):>4} variants (" + ", ".join(f"{s}: {n}" for s, n in sorted(per.items())) + ")")
    print(f"{total} variants for the GPU cases on {args.arch}, listed in {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([{"family": f, "kernel": v.kernel, "schedule": v.variant.schedule,
                                                "arch": v.arch, "name": v.name, "key": v.key}
                                               for f, vs in sorted(lists.items()) for v in vs], indent=1))
    if args.list:
        return 0
    from dsv4_jit.warmup.planner import Plan
    from dsv4_jit.warmup.runner import run_warmup
    variants = [v for vs in lists.values() for v in vs]
    plan = Plan("GPU cases", None, [args.arch], "GPU pass", variants, [])
    report = run_warmup(plan, jobs=args.jobs, time_budget=args.time_budget, compile_fn=compile_in_worker)
    print(f"compiled {report.count('compiled')}, cached {report.count('cached')}, failed {report.count('failed')}, "
          f"not started {report.count('not_done')} in {time.perf_counter() - t0:.0f} s")
    for r in report.results:
        if r.status == "failed":
            print(f"FAILED {r.name}: {r.error}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
