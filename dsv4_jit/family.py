"""A kernel family: everything one DeepSeek V4 kernel family adds, declared in one object.

A family is
  * its KernelSpecs (statics, a pure `select`, the shared-memory formula, the TileLang builder), kept in
    kernel-defining modules that import no host code, so the artifact key (`KernelSpec.code_fingerprint`)
    covers kernel source and never the op wrappers;
  * host ops (validation, per-signature launch plans, `out=`/workspaces for CUDA-graph capture) in a
    module of their own;
  * a torch reference;
  * `uses(model, parallel)`: the (spec, static, label) triples a forward pass launches. The planner
    enumerates exactly these through each spec's `select`, the function serving calls;
  * `gpu_cases(model)`: how to make inputs, run the public op and compute the reference, so the
    registry-driven tests (tests/test_families.py) check it on the GPU with NaN-poisoned outputs and
    per-token errors, and check that every variant the op asked for was in the plan.

Registering a family (`register_family`) gives it, with no test code of its own: the select/smem checks
for every variant, cross-compiles for sm_120a and sm_90a (a representative variant per kernel in CI, every
variant in the `full` tier), planner coverage, and GPU correctness. docs/adding_a_kernel.md walks through it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from .arch import ArchProfile
from .spec import KernelSpec, Variant

# Token counts the GPU cases run by default: both sides of every tile / split / PDL boundary in use,
# odd counts that leave partial tiles, and the largest prefill chunk an engine batches by default.
DEFAULT_GPU_TOKENS = (1, 2, 3, 7, 8, 31, 33, 64, 100, 255, 512, 1000, 2047, 2049, 4096, 8192)


@dataclass(frozen=True)
class KernelUse:
    """One call site of a kernel in the forward pass: the spec, its static params, and a label."""
    spec: KernelSpec
    static: dict = field(hash=False)
    label: str = ""


# get_kernel(spec, static, num_tokens) -> LoadedKernel, as the op wrappers take it (jit.kernel_getter).
KernelGetter = Callable[[KernelSpec, Mapping[str, Any], int], Any]


@dataclass(frozen=True)
class GpuCase:
    """One public op at one model's shapes, checked on the GPU against the float64 reference.

    make_inputs(num_tokens, device, generator) -> dict of named inputs
    make_outputs(inputs, arch) -> dict of named output tensors (the harness fills them with NaN first, and
        the op must write every element: a NaN left over fails the case)
    launch(inputs, outputs, arch, get_kernel) -> None: call the public op with out= those tensors
    reference(inputs, outputs) -> dict name -> expected tensor (any float dtype; compared in float64);
        `outputs` is passed for its shapes only (e.g. a split count the variant chose)
    tolerance: name -> the largest per-token relative error allowed (||got_t - ref_t|| / ||ref_t||, the
        token being dim 0, unless token_dims names another dim for that output)
    planned: whether a forward pass makes this call, so every variant it launches must be in the plan
    tp_size: the tensor-parallel size whose shapes the case runs (heads per rank); the plan it is checked
        against is built for that TP
    op: the public op it launches, a key of the family's `ops` (default: the name up to its first "[")
    fixes: static values the case fixes. The variants the case may launch are those `select` gives for the uses
        of its op's kernels whose statics agree with `fixes`, at each of its token counts
        (dsv4_jit.testing.case_variants): the GPU pass compiles exactly those first, and the GPU test fails a
        case that launches any other
    """
    name: str
    make_inputs: Callable[[int, Any, Any], dict]
    make_outputs: Callable[[dict, ArchProfile], dict]
    launch: Callable[[dict, dict, ArchProfile, KernelGetter], None]
    reference: Callable[[dict, dict], dict]
    tolerance: Mapping[str, float]
    tokens: Sequence[int] = DEFAULT_GPU_TOKENS
    token_dims: Mapping[str, int] = field(default_factory=dict)
    planned: bool = True
    tp_size: int = 1
    op: str = ""
    fixes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelFamily:
    name: str
    specs: tuple[KernelSpec, ...]
    uses: Callable[[Any, Any], list[KernelUse]]        # (ModelConfig, ParallelConfig) -> uses
    gpu_cases: Callable[[Any], list[GpuCase]]          # ModelConfig -> cases
    # public op -> kernels it launches, in order (benchmarks and `op_variants` read it)
    ops: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # CPU checks enumerate select over 1..max_tokens for every use (covers every engine default).
    max_tokens: int = 16384
    # Upper bound on distinct variants one use may need over 1..max_tokens: a select that grows
    # without bound (one variant per token count) is a planner bug, caught on the CPU.
    max_variants_per_use: int = 8
    # Extra assertions on a compiled variant's CUDA source (e.g. PDL calls where params say so).
    check_source: Callable[[Variant, str], None] | None = None
    doc: str = ""

    def spec_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    def variants(self, model, arch: ArchProfile, parallel=None) -> dict[Variant, tuple[KernelSpec, int]]:
        """Every variant `select` returns for this model on `arch` over 1..max_tokens, with its spec and
        the first token count that selects it."""
        from .model_config import ParallelConfig
        out: dict[Variant, tuple[KernelSpec, int]] = {}
        for use in self.uses(model, parallel or ParallelConfig()):
            for t in range(1, self.max_tokens + 1):
                v = use.spec.select(arch, use.static, t)
                out.setdefault(v, (use.spec, t))
        return out


_FAMILIES: dict[str, KernelFamily] = {}


def register_family(family: KernelFamily) -> KernelFamily:
    """Add a family to the package registry (the planner, warmup and the registry-driven tests read it)."""
    if not family.name or not family.specs:
        raise ValueError("a kernel family needs a name and at least one KernelSpec")
    clash = _FAMILIES.get(family.name)
    if clash is not None and clash is not family:
        raise ValueError(f"kernel family {family.name!r} is registered twice")
    owners = {s: f.name for f in _FAMILIES.values() if f is not family for s in f.spec_names()}
    taken = [s for s in family.spec_names() if s in owners]
    if taken:
        raise ValueError(f"kernel family {family.name!r}: kernels {taken} already belong to {owners[taken[0]]!r}")
    _FAMILIES[family.name] = family
    return family


def all_families() -> dict[str, KernelFamily]:
    import dsv4_jit.kernels  # noqa: F401  (importing the package registers every family)
    return dict(_FAMILIES)


def family_uses(families: Iterable[KernelFamily], model, parallel) -> list[KernelUse]:
    """Every use of these families for this model and parallel config. A family that cannot serve the config (its
    statics raise ValueError: 64 attention heads over TP 3) is a ConfigError naming the family and the TP size,
    which the CLI prints as one line."""
    from .errors import ConfigError
    uses = []
    for f in families:
        try:
            uses += f.uses(model, parallel)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"{f.name} kernels cannot serve {getattr(model, 'name', 'this model')} at tensor-parallel "
                              f"size {parallel.tp_size}: {e}") from e
    return uses
