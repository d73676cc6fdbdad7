"""`dsv4-jit plan | check | warmup`: registered into the main CLI by `add_plan_parsers`.

Engine flags are pasted after `--vllm-args` / `--sglang-args`, quoted or not; everything after the
flag is the engine's. Our own options (--arch, --json, -j, ...) found in there are still honoured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from dsv4_jit.errors import ConfigError

DEFAULT_MODEL = "deepseek-v4-flash"
COMMANDS = ("plan", "check", "warmup")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help=f"deepseek-v4-flash, deepseek-v4-pro, their Hugging Face ids (deepseek-ai/DeepSeek-V4-Flash), "
                        f"a model dir or a config.json path; default: the engine flags' model if recognised, "
                        f"else {DEFAULT_MODEL}")
    p.add_argument("--arch", default=None,
                   help="target archs, comma separated (sm_90a, sm_100a, sm_120a, sm_121a); default: "
                        "DSV4_JIT_ARCH, else the GPU, else sm_120a")
    p.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="only these kernel families (repeatable or comma list, e.g. mhc,attention; "
                        "default: all), for an engine that takes only some families from dsv4-jit")
    p.add_argument("--profile", default=None, help="TOML/JSON serving profile instead of engine flags")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="serving GPU memory, for the engines' memory-based defaults (default: H100/H200 class)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--vllm-args", nargs=argparse.REMAINDER, default=None,
                   help="the flags you pass to `vllm serve` (put this last; quoting optional)")
    p.add_argument("--sglang-args", nargs=argparse.REMAINDER, default=None,
                   help="the flags you pass to `python -m sglang.launch_server` (put this last)")


def add_plan_parsers(subparsers) -> None:
    p = subparsers.add_parser("plan", help="list the kernel variants an engine config needs")
    _common(p)
    p.add_argument("-j", "--jobs", type=int, default=None, help="workers assumed for the time estimate")
    p.set_defaults(_own_parser=p)

    c = subparsers.add_parser("check", help="exit 1 and list what is missing if the cache (or a bundle) "
                                            "does not cover the plan")
    _common(c)
    c.add_argument("--bundle", default=None, help="check a bundle's manifest instead of the cache")
    c.set_defaults(_own_parser=c)

    w = subparsers.add_parser("warmup", help="compile every missing variant of the plan, in parallel")
    _common(w)
    w.add_argument("-j", "--jobs", type=int, default=None,
                   help="worker processes (default: CPUs this process may use, cgroup-aware)")
    w.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no new compile after this; the rest is reported as not done (exit 1)")
    w.add_argument("--export", default=None, metavar="BUNDLE", help="export the plan's entries to a bundle")
    w.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="show the compiler's own warnings here instead of only in <cache dir>/logs/compile.log")
    w.set_defaults(_own_parser=w)


# ---- argument plumbing -------------------------------------------------------------------------------

_OWN_VALUE = {"--arch", "--family", "--profile", "--gpu-memory-gib", "-j", "--jobs", "--time-budget", "--export",
              "--bundle"}
_OWN_BOOL = {"--json"}


def _engine_tokens(raw: list[str] | None) -> list[str] | None:
    if raw is None:
        return None
    import shlex
    toks: list[str] = []
    for item in raw:
        # One quoted string ("--max-num-seqs 256 -tp 2") or argv pieces: split quoted strings only.
        if " " in item and not item.startswith("{"):
            try:
                toks.extend(shlex.split(item))
            except ValueError as e:
                raise ConfigError(f"engine flags {item!r}: {str(e).lower()} (quote them as the shell would)") from None
        else:
            toks.append(item)
    return toks


def _pull_own(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Separate our options that ended up after --vllm-args from the engine's flags."""
    engine, own = [], []
    i = 0
    while i < len(tokens):
        name = tokens[i].split("=", 1)[0]
        if name in _OWN_BOOL:
            own.append(tokens[i])
        elif name in _OWN_VALUE:
            own.append(tokens[i])
            if "=" not in tokens[i] and i + 1 < len(tokens):
                own.append(tokens[i + 1])
                i += 1
        else:
            engine.append(tokens[i])
        i += 1
    return engine, own


def _normalise(args) -> None:
    for attr in ("vllm_args", "sglang_args"):
        toks = _engine_tokens(getattr(args, attr, None))
        if toks is None:
            continue
        engine, own = _pull_own(toks)
        setattr(args, attr, engine)
        if own:
            args._own_parser.parse_args(own, namespace=args)
    if args.vllm_args is not None and args.sglang_args is not None:
        raise ConfigError("give --vllm-args or --sglang-args, not both")


def _model_from_engine(shapes) -> str | None:
    """`vllm serve deepseek-ai/DeepSeek-V4-Flash` / `--model-path ...` -> an embedded name or a dir."""
    from dsv4_jit.model_config import embedded_name
    cands = [shapes.ignored.get(k) for k in ("--model", "--model-path")]
    cands += [p for p in shapes.ignored.get("_positional", [])]
    for c in cands:
        if not isinstance(c, str) or c in ("vllm", "serve", "python", "-m", "sglang.launch_server"):
            continue
        if (Path(c) / "config.json").is_file():
            return c
        if embedded_name(c):
            return embedded_name(c)
    return None


def resolve_inputs(args) -> tuple[Any, Any, list, str, list[str]]:
    """(model config, shapes, arch profiles, arch reason, notes) from parsed CLI args."""
    from dsv4_jit.arch import resolve_archs
    from dsv4_jit.model_config import load_model_config
    from .engines import resolve_shapes
    _normalise(args)
    shapes, profile = resolve_shapes(vllm_args=args.vllm_args, sglang_args=args.sglang_args,
                                     profile=args.profile, gpu_memory_gib=args.gpu_memory_gib)
    notes: list[str] = []
    model = args.model or (profile.model if profile else None) or _model_from_engine(shapes)
    if model is None:
        model = DEFAULT_MODEL
        notes.append(f"no --model: planning for {DEFAULT_MODEL}")
    arch = args.arch or (",".join(profile.arch) if profile and profile.arch else None)
    archs, reason = resolve_archs(arch)
    return load_model_config(model), shapes, archs, reason, notes


def default_jobs() -> int:
    from .runner import available_cpus
    return available_cpus()


# ---- commands ---------------------------------------------------------------------------------------

def run_plan_command(args) -> int:
    if args.command not in COMMANDS:
        raise ConfigError(f"unknown command {args.command!r}")
    from .runner import check_run_limits
    jobs = getattr(args, "jobs", None)
    check_run_limits(jobs, getattr(args, "time_budget", None))
    model, shapes, archs, reason, notes = resolve_inputs(args)
    if args.command == "warmup":
        from .runner import run_warmup_cli
        return run_warmup_cli(args, model, shapes, archs, reason, notes)
    from .planner import build_plan, format_table, select_families
    plan = build_plan(model, shapes, archs, arch_reason=reason, families=select_families(args.family))
    plan.notes[:0] = notes
    jobs = jobs or default_jobs()
    if args.command == "plan":
        return _print_plan(plan, args, jobs)
    return _check(plan, args)


def _say_context(plan, out=None) -> None:
    out = out or sys.stderr   # looked up per call: the stream may be replaced after import
    print(f"archs: {', '.join(plan.archs)} ({plan.arch_reason})", file=out)
    print(f"engine: {plan.shapes.summary()}", file=out)
    for n in plan.notes:
        print(f"note: {n}", file=out)


def _print_plan(plan, args, jobs: int) -> int:
    from .planner import format_table
    if args.json:
        print(plan.to_json(jobs))
        return 0
    print(f"model: {plan.model}")
    _say_context(plan, sys.stdout)
    print()
    print(format_table(plan, jobs))
    return 0


def _bundle_keys(path: str) -> set[str]:
    """Entry keys listed in a bundle's manifest: a path, file:// or an fsspec URL (s3://, gs://, https://);
    only the head of the archive is read."""
    from dsv4_jit.cache_tools import bundle as _b
    if _b._is_url(path):
        return _keys_of_manifest(_b.read_manifest(path))
    p = _b._local(path)
    if not p.is_file():
        raise ConfigError(f"--bundle: no such file {path!r}")
    return _keys_of_manifest(_b.read_manifest(p))


def _keys_of_manifest(m: Any) -> set[str]:
    if isinstance(m, dict):
        entries = m.get("entries", m.get("keys", []))
        if isinstance(entries, dict):
            return set(entries)
        out = set()
        for e in entries:
            out.add(e if isinstance(e, str) else e.get("key"))
        return {k for k in out if k}
    raise ConfigError("bundle manifest has no entries")


def _check(plan, args) -> int:
    from .planner import missing_in_keys
    if args.bundle:
        missing = missing_in_keys(plan, _bundle_keys(args.bundle))
        where = f"bundle {args.bundle}"
    else:
        from dsv4_jit.jit import default_store
        store = default_store()
        missing, holders = _scan_store(plan, store)
        where = _describe_cache(store, holders, complete=not missing)
    if args.json:
        out = {"covered": not missing, "where": where, "planned": plan.compiles,
               "missing": [v.to_dict() for v in missing], "coverage": plan.coverage()}
        if not args.bundle:
            out["layers"] = holders
        print(json.dumps(out, indent=1))
        return 1 if missing else 0
    _say_context(plan)
    if not missing:
        print(f"covered: all {plan.compiles} planned variants are in the {where}")
        return 0
    print(f"NOT covered: {len(missing)} of {plan.compiles} planned variants missing from the {where}:")
    from .planner import format_ranges
    for v in missing:
        print(f"  {v.arch:8} {v.key[:16]}  tokens [{format_ranges(v.token_ranges, 3)}]  {', '.join(v.labels)}")
    print("run `dsv4-jit warmup` with the same flags to build them")
    return 1


def _scan_store(plan, store) -> tuple[list, dict[str, int]]:
    """(planned variants the store lacks, layer root -> how many planned variants it serves), one probe a
    variant (a probe, not a use: no hit or miss counted)."""
    missing, holders = [], {}
    for v in plan.variants:
        e = store.peek(v.key)
        if e is None:
            missing.append(v)
        else:
            holders[str(e.layer)] = holders.get(str(e.layer), 0) + 1
    return missing, holders


def _describe_cache(store, holders: dict[str, int], complete: bool) -> str:
    """Where the plan's variants are: the layers holding them when all are there, else what was searched."""
    searched = ", ".join(f"{'writable' if L.writable else 'read-only'} {L.root}"
                        for L in store.layers if not L.memory_only) or f"{store.root} (unusable)"
    if not complete or not holders:
        return f"cache (searched: {searched})"
    if len(holders) == 1:
        return f"cache layer {next(iter(holders))}"
    return "cache (" + ", ".join(f"{n} in {root}" for root, n in holders.items()) + ")"
