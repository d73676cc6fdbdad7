"""The bucket planner: every kernel variant an engine config can request, as a set of compile keys.

For each arch x kernel use x every token count the engine can produce, call the kernel's own
`select` (the function serving calls on every launch) and deduplicate by compile key. Nothing is
guessed from bucket tables, so warmup cannot miss a variant serving will ask for.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from dsv4_jit.errors import ConfigError, Dsv4JitError

from .shapes import EngineShapes

PLAN_SCHEMA = 1
# Measured cost of one variant on one core of the 2-core dev/CI machine, through `dsv4-jit warmup`
# (worker start, TileLang elaboration + lowering, nvcc, publish): V4-Flash on vLLM defaults, 16
# variants in 173 s at -j 1 (benchmarks/cache/bench_warmup.py --measure). Used only for estimates.
SECONDS_PER_VARIANT_PER_CORE = 11.0


def intervals(values: Iterable[int]) -> list[tuple[int, int]]:
    """[1,2,3,7,8] -> [(1,3), (7,8)]."""
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return [(a, b) for a, b in out]


def format_ranges(ranges: Sequence[tuple[int, int]], limit: int = 4) -> str:
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges]
    if len(parts) > limit:
        parts = parts[:limit - 1] + [f"... (+{len(parts) - limit + 1} more)", parts[-1]]
    return ", ".join(parts)


@dataclass
class PlannedVariant:
    """One compile: a distinct key, and which token counts / capture sizes it serves."""
    key: str
    spec: Any                       # dsv4_jit.spec.KernelSpec
    variant: Any                    # dsv4_jit.spec.Variant
    labels: list[str]               # kernel uses (label) that need it
    token_ranges: list[tuple[int, int]]
    capture_sizes: list[int]

    @property
    def kernel(self) -> str:
        return self.variant.kernel

    @property
    def arch(self) -> str:
        return self.variant.arch

    @property
    def name(self) -> str:
        return self.variant.name

    def to_dict(self) -> dict:
        return {"key": self.key, "kernel": self.kernel, "spec": self.spec.name, "name": self.name,
                "arch": self.arch, "labels": list(self.labels), "variant": self.variant.key_fields(),
                "token_ranges": [list(r) for r in self.token_ranges], "capture_sizes": list(self.capture_sizes)}


@dataclass
class KernelRow:
    """Per arch x kernel use: how many distinct variants it needs, and the naive count."""
    arch: str
    label: str
    kernel: str
    keys: list[str]
    naive: int                      # one compile per capture size

    def to_dict(self) -> dict:
        return {"arch": self.arch, "label": self.label, "kernel": self.kernel, "variants": len(self.keys),
                "keys": list(self.keys), "naive": self.naive}


@dataclass
class Plan:
    model: str
    shapes: EngineShapes
    archs: list[str]
    arch_reason: str
    variants: list[PlannedVariant]
    rows: list[KernelRow]
    notes: list[str] = field(default_factory=list)
    families: list[str] | None = None   # None: every registered family

    # ---- figures -------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return sorted(v.key for v in self.variants)

    @property
    def compiles(self) -> int:
        return len(self.variants)

    @property
    def naive_compiles(self) -> int:
        return sum(r.naive for r in self.rows)

    def estimate_seconds(self, jobs: int = 1, count: int | None = None) -> float:
        n = self.compiles if count is None else count
        return math.ceil(n / max(1, jobs)) * SECONDS_PER_VARIANT_PER_CORE

    def by_key(self) -> dict[str, PlannedVariant]:
        return {v.key: v for v in self.variants}

    # ---- serialisation ----------------------------------------------------------------------------
    def coverage(self) -> dict:
        """What a bundle built from this plan covers (stored in its manifest)."""
        s = self.shapes
        return {"schema": PLAN_SCHEMA, "model": self.model, "engine": s.engine,
                "formula_version": s.formula_version, "tp_size": s.tp_size, "archs": list(self.archs),
                "token_range": [1, s.max_num_tokens], "capture_sizes": list(s.capture_sizes),
                "spec_tokens": s.spec_tokens, "families": self.families or "all", "keys": self.keys()}

    def to_dict(self, jobs: int = 1) -> dict:
        return {
            "schema": PLAN_SCHEMA, "model": self.model, "engine": self.shapes.to_dict(),
            "archs": list(self.archs), "arch_reason": self.arch_reason,
            "totals": {"compiles": self.compiles, "naive_compiles": self.naive_compiles,
                       "jobs": jobs, "seconds_per_variant_per_core": SECONDS_PER_VARIANT_PER_CORE,
                       "estimated_cold_seconds": self.estimate_seconds(jobs)},
            "kernels": [r.to_dict() for r in self.rows],
            "variants": [v.to_dict() for v in self.variants],
            "notes": list(self.notes),
        }

    def to_json(self, jobs: int = 1, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(jobs), indent=indent)


def select_families(names: Iterable[str] | None) -> list[str] | None:
    """`--family` values (repeatable, comma lists; 'all' = every family) -> sorted family names, or
    None for every registered family. An unknown name is a ConfigError listing the known ones."""
    from dsv4_jit.family import all_families
    wanted = [n for item in (names or ()) for n in str(item).replace(",", " ").split()]
    if not wanted or "all" in wanted:
        return None
    known = all_families()
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ConfigError(f"--family {', '.join(unknown)}: unknown kernel family; known: "
                          f"{', '.join(sorted(known))} (or all)")
    return sorted(set(wanted))


def runs_mtp(shapes: EngineShapes) -> bool:
    """Whether the engine runs the model's MTP block: vLLM's `mtp` speculative method (or `<model>_mtp`),
    SGLang's EAGLE / NEXTN (DeepSeek V4's draft is its MTP layer)."""
    method = str(shapes.settings.get("speculative_method") or shapes.settings.get("speculative_algorithm") or "")
    return bool(shapes.spec_tokens) and (method.lower().endswith("mtp") or method.upper() in ("EAGLE", "NEXTN"))


def _default_uses(model, shapes: EngineShapes, families: Sequence[str] | None = None):
    from dsv4_jit.model_config import ParallelConfig
    from dsv4_jit.model_uses import forward_uses
    return forward_uses(model, ParallelConfig(tp_size=shapes.tp_size), families=families, mtp=runs_mtp(shapes))


def build_plan(model, shapes: EngineShapes, archs: Sequence[Any], *, arch_reason: str = "",
               uses: Sequence[Any] | None = None, key_fn=None,
               families: Sequence[str] | None = None) -> Plan:
    """The plan for `model` (a ModelConfig, or a name/path) served with `shapes` on `archs`.

    `uses` (kernel uses with .spec/.static/.label) and `key_fn(spec, variant) -> str` default to the
    package's own (`model_kernel_uses`, `jit.artifact_key`); tests inject fakes. `families` (names from
    `select_families`) keeps only those kernel families' uses; None = all."""
    from dsv4_jit.arch import get_profile
    if isinstance(model, str):
        from dsv4_jit.model_config import load_model_config
        model = load_model_config(model)
    profiles = [get_profile(a) for a in archs]
    if not profiles:
        raise ConfigError("--arch: no target arch")
    if uses is None:
        uses = _default_uses(model, shapes, families)
    if key_fn is None:
        from dsv4_jit.jit import artifact_key as key_fn
    counts = shapes.token_counts()
    capture = set(shapes.capture_sizes)
    variants: dict[str, PlannedVariant] = {}
    tokens_by_key: dict[str, set[int]] = {}
    rows: list[KernelRow] = []
    for prof in profiles:
        for use in uses:
            spec, static = use.spec, use.static
            per_token = int(getattr(use, "rows_per_token", 1))   # GEMM rows per forward token (MTP h_proj: hc_mult)
            key_of_variant: dict[Any, str] = {}
            row_keys: dict[str, None] = {}
            for t in counts:
                try:
                    var = spec.select(prof, static, t * per_token)
                except (ValueError, Dsv4JitError) as e:
                    raise ConfigError(f"{use.label} ({spec.name}) cannot run on {prof.name} at "
                                      f"{t * per_token} rows ({t} tokens): {e}") from e
                key = key_of_variant.get(var)
                if key is None:
                    key = key_of_variant[var] = key_fn(spec, var)
                row_keys.setdefault(key)
                pv = variants.get(key)
                if pv is None:
                    pv = variants[key] = PlannedVariant(key, spec, var, [], [], [])
                    tokens_by_key[key] = set()
                if use.label not in pv.labels:
                    pv.labels.append(use.label)
                tokens_by_key[key].add(t)
                if t in capture and t not in pv.capture_sizes:
                    pv.capture_sizes.append(t)
            rows.append(KernelRow(prof.name, use.label, spec.name, list(row_keys), len(capture)))
    for key, pv in variants.items():
        pv.token_ranges = intervals(tokens_by_key[key])
        pv.capture_sizes.sort()
    ordered = sorted(variants.values(), key=lambda v: (v.arch, v.labels[0], v.token_ranges[0][0], v.key))
    name = getattr(model, "name", str(model))
    notes = list(shapes.notes)
    if not capture:
        notes.append("no CUDA-graph capture sizes: the naive count (one compile per capture size) is 0")
    if families:
        notes.append(f"only kernel families: {', '.join(families)} (--family)")
    from dsv4_jit.model_uses import is_v41, v41_note
    if is_v41(model):
        notes.append(v41_note())
    return Plan(name, shapes, [p.name for p in profiles], arch_reason, ordered, rows, notes,
                families=list(families) if families else None)


# ---- coverage checks -------------------------------------------------------------------------------

def missing_in_store(plan: Plan, store=None) -> list[PlannedVariant]:
    """Planned variants the artifact store (all its layers) does not hold."""
    if store is None:
        from dsv4_jit.jit import default_store
        store = default_store()
    return [v for v in plan.variants if not store_has(store, v.key)]


def store_has(store, key: str) -> bool:
    """Is `key` in the store, as a probe, not a use (no hit/miss counted where the store counts them)."""
    has = getattr(store, "contains", None)
    return has(key) if has is not None else store.lookup(key) is not None


def missing_in_keys(plan: Plan, keys: Iterable[str]) -> list[PlannedVariant]:
    have = set(keys)
    return [v for v in plan.variants if v.key not in have]


def format_table(plan: Plan, jobs: int = 1) -> str:
    """Human table: one row per arch x kernel use, then the totals."""
    byk = plan.by_key()
    w = max([len("kernel")] + [len(r.label) for r in plan.rows])   # whole names, never cut
    head = f"{'arch':8} {'kernel':{w}} {'variants':>8} {'naive':>6}  token ranges -> capture sizes mapped"
    lines = [head, "-" * len(head)]
    for r in plan.rows:
        parts = []
        for k in r.keys:
            pv = byk[k]
            cs = pv.capture_sizes
            cs_txt = (f"{len(cs)} ({cs[0]}..{cs[-1]})" if len(cs) > 1 else (str(cs[0]) if cs else "none"))
            parts.append(f"[{format_ranges(pv.token_ranges, 3)}] -> {cs_txt}")
        first, rest = (parts[0] if parts else ""), parts[1:]
        lines.append(f"{r.arch:8} {r.label:{w}} {len(r.keys):>8} {r.naive:>6}  {first}")
        lines += [f"{'':8} {'':{w}} {'':>8} {'':>6}  {p}" for p in rest]
    lines.append("-" * len(head))
    lines.append(f"distinct compiles: {plan.compiles}   one-per-capture-size: {plan.naive_compiles}   "
                 f"estimated cold compile: {_fmt_s(plan.estimate_seconds(jobs))} with {jobs} job(s) "
                 f"(~{SECONDS_PER_VARIANT_PER_CORE:g} s per variant per core)")
    return "\n".join(lines)


def _fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
