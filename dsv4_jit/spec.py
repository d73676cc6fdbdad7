"""How a kernel is described once and named by its parameters (like FlashInfer's JitSpec).

A `KernelSpec` owns:
  * `static_params(model, parallel)`  - what the model / parallel config bakes in;
  * `select(arch, static, num_tokens)` - a PURE function picking the variant. Serving calls it
    on every launch and the planner enumerates it, so warmup can never miss what serving asks;
  * `build(variant)`                   - the TileLang prim_func for a variant;
  * `smem_bytes(variant)`              - shared-memory need, checked before nvcc is run.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from .arch import ArchProfile, get_profile
from .errors import SharedMemoryBudgetError


def _freeze(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k in sorted(params):
        v = params[k]
        if isinstance(v, float):
            v = float(repr(v)) if v == v else v
        elif isinstance(v, (list, tuple)):
            v = tuple(v)
        elif not isinstance(v, (int, str, bool)) and v is not None:
            raise TypeError(f"variant parameter {k}={v!r} must be int/float/str/bool/tuple")
        out.append((k, v))
    return tuple(out)


def _schedule_profile(profile: ArchProfile | None, arch: str, schedule: str) -> ArchProfile:
    """The profile a variant compiles with: `schedule`'s family, budget and pass configs, targeting `arch`."""
    if profile is not None and profile.name == arch and (schedule == profile.schedule
                                                         or get_profile(schedule).family == profile.family):
        return profile
    sched = get_profile(schedule)
    return sched if sched.name == arch else sched.emulated(get_profile(arch))


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: family + compile-time parameters + schedule arch + target arch.

    `profile` is the ArchProfile the variant was selected with (its schedule's shared-memory budget and pass
    configs, targeting `arch`), carried so compiling and loading never look the arch up again by name. It is
    not part of the variant's identity: equality, hash and the artifact key see the four named fields only."""
    kernel: str
    params: tuple[tuple[str, Any], ...]
    arch: str            # target ISA the binary is for (e.g. sm_90a)
    schedule: str        # profile whose schedule it uses (e.g. sm_120a; equals arch unless emulating)
    profile: ArchProfile | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.profile is None:   # built from names (a test, a benchmark): resolve the profile once, here
            object.__setattr__(self, "profile", _schedule_profile(None, self.arch, self.schedule))

    @classmethod
    def make(cls, kernel: str, params: Mapping[str, Any], profile: ArchProfile, schedule: str | None = None) -> "Variant":
        schedule = schedule or profile.schedule
        return cls(kernel, _freeze(params), profile.name, schedule, _schedule_profile(profile, profile.name, schedule))

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def name(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        sched = "" if self.schedule == self.arch else f"/{self.schedule}-schedule"
        return f"{self.kernel}[{inner}]@{self.arch}{sched}"

    def key_fields(self) -> dict:
        return {"kernel": self.kernel, "params": [[k, list(v) if isinstance(v, tuple) else v] for k, v in self.params],
                "arch": self.arch, "schedule": self.schedule}


class KernelSpec:
    """Subclass per kernel family (see kernels/). Subclasses set `name` and `module`."""

    name: str = ""
    # Modules whose source defines this kernel; their code (not comments or docstrings) forms the fingerprint.
    source_modules: tuple = ()

    def static_params(self, model, parallel) -> dict[str, Any]:
        raise NotImplementedError

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        raise NotImplementedError

    def build(self, variant: Variant):
        """Return the TileLang prim_func for this variant."""
        raise NotImplementedError

    def smem_bytes(self, variant: Variant) -> int:
        raise NotImplementedError

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return dict(variant.profile.pass_configs)

    # ---- shared helpers -------------------------------------------------------------------
    @cached_property
    def code_fingerprint(self) -> str:
        """sha256 over the code of this kernel's module and every kernel module it draws on
        (transitively): no TileLang elaboration is needed on the warm path, and an edit to a shared
        helper in another kernel module still changes the key. Comments and docstrings are not
        code: editing them keeps every cached artifact valid."""
        h = hashlib.sha256()
        for m in self.source_closure():
            h.update(m.__name__.encode())
            h.update(code_digest(inspect.getsource(m)).encode())
        return h.hexdigest()

    def source_closure(self) -> list:
        import sys
        start = list(self.source_modules) or [inspect.getmodule(type(self))]
        # Every kernel module of the package (a family may draw on another's helpers); for a kernel
        # defined elsewhere (tests, a user's family), its own package.
        first = start[0].__name__
        prefix = "dsv4_jit.kernels." if first.startswith("dsv4_jit.kernels.") else first.rsplit(".", 1)[0] + "."
        seen: dict[str, Any] = {}
        todo = list(start)
        while todo:
            m = todo.pop()
            if m.__name__ in seen:
                continue
            seen[m.__name__] = m
            for v in vars(m).values():
                name = v.__name__ if inspect.ismodule(v) else getattr(v, "__module__", None)
                if isinstance(name, str) and name.startswith(prefix) and name not in seen and name in sys.modules:
                    todo.append(sys.modules[name])
        return [seen[k] for k in sorted(seen)]

    def check_fits(self, variant: Variant) -> int:
        need = self.smem_bytes(variant)
        budget = variant.profile.max_smem_per_block
        if need > budget:
            raise SharedMemoryBudgetError(
                f"{variant.name}: needs {need:,} B of shared memory per block but {variant.schedule} "
                f"allows {budget:,} B; pick a smaller tile for this family")
        return need

    def check_tokens(self, num_tokens: int) -> None:
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"{self.name}: num_tokens must be a positive int, got {num_tokens!r}")


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_digest(source: str) -> str:
    """sha256 of a module's syntax tree without docstrings, comments, line numbers or formatting:
    what changes it is what can change the compiled kernel."""
    tree = _drop_docstrings(ast.parse(source))
    return hashlib.sha256(ast.dump(tree, annotate_fields=True, include_attributes=False).encode()).hexdigest()


def stable_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


_REGISTRY: dict[str, KernelSpec] = {}


def register(spec_cls: type[KernelSpec]) -> type[KernelSpec]:
    inst = spec_cls()
    if not inst.name:
        raise TypeError(f"{spec_cls.__name__} has no name")
    _REGISTRY[inst.name] = inst
    return spec_cls


def get_spec(name: str) -> KernelSpec:
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def all_specs() -> dict[str, KernelSpec]:
    _load_all()
    return dict(_REGISTRY)


def _load_all() -> None:
    # Importing the kernel families registers them; TileLang itself is imported lazily in build().
    import dsv4_jit.kernels  # noqa: F401
