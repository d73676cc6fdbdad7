"""What a family's GPU cases and the tests that run them share: seeded generators on the device, NaN-poisoned
outputs, the per-token relative error, the profiles a GPU proves, and the serving path's kernel getter.

Host code for tests (the families' `gpu_cases` and tests/); torch is imported where a tensor is made.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .arch import ArchProfile, detect_arch, get_profile

if TYPE_CHECKING:
    import torch

    from .family import GpuCase
    from .spec import KernelSpec


def cuda_generator(g: "torch.Generator", device) -> "torch.Generator":
    """A generator on `device` seeded from the CPU generator `g`: inputs made on the GPU stay reproducible."""
    import torch
    seed = int(torch.randint(0, 2**62, (1,), generator=g))
    return torch.Generator(device=device).manual_seed(seed)


def nan_filled(*shape: int, dtype, device) -> "torch.Tensor":
    """An output buffer poisoned with NaN, so an element the kernel never wrote fails the check."""
    import torch
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def poison(outputs: Mapping[str, "torch.Tensor"]) -> None:
    """Fill every output with NaN before the launch (see check_case_outputs)."""
    for t in outputs.values():
        t.fill_(float("nan"))


def rel_err(got: "torch.Tensor", want: "torch.Tensor") -> float:
    """||got - want|| / ||want|| in float64 over the whole tensor."""
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def per_token_rel_err(got: "torch.Tensor", want: "torch.Tensor", token_dim: int = 0) -> tuple[float, int]:
    """max over tokens of ||got_t - want_t|| / ||want_t|| (a whole-tensor norm would hide a few bad tokens),
    and the worst token's index."""
    g = got.double().movedim(token_dim, 0).reshape(got.shape[token_dim], -1)
    w = want.double().movedim(token_dim, 0).reshape(want.shape[token_dim], -1)
    err = (g - w).norm(dim=1) / w.norm(dim=1).clamp_min(1e-30)
    i = int(err.argmax())
    return float(err[i]), i


def check_case_outputs(case: "GpuCase", outputs: Mapping[str, "torch.Tensor"], want: Mapping[str, "torch.Tensor"],
                       num_tokens: int) -> dict[str, tuple[float, int]]:
    """A GpuCase's launched outputs against its reference: every element written (no NaN left from `poison`) and
    each output's per-token relative error within the case's tolerance. Returns name -> (error, worst token);
    raises AssertionError naming the output and the token count otherwise."""
    if not set(want) == set(outputs) == set(case.tolerance):
        raise AssertionError(f"{case.name}: reference {sorted(want)}, outputs {sorted(outputs)} and tolerances "
                             f"{sorted(case.tolerance)} differ")
    errs = {}
    for name, got in outputs.items():
        if got.isnan().any():
            raise AssertionError(f"{case.name} T={num_tokens}: {name} not fully written (NaN left from the poison)")
        err, tok = per_token_rel_err(got, want[name], case.token_dims.get(name, 0))
        if not err <= case.tolerance[name]:
            raise AssertionError(f"{case.name} T={num_tokens}: {name} token {tok} relative error {err:.3e} "
                                 f"> {case.tolerance[name]:.1e}")
        errs[name] = (err, tok)
    return errs


def case_op(family, case: "GpuCase") -> str | None:
    """The public op a GPU case launches (None for a family that names no ops: every use is the case's)."""
    if not family.ops:
        return None
    op = case.op or case.name.split("[", 1)[0]
    if op not in family.ops:
        raise ValueError(f"{family.name} GPU case {case.name!r}: op {op!r} is not one of the family's ops "
                         f"({', '.join(family.ops)}); set GpuCase.op")
    return op


def _flags_widened(uses: list) -> list:
    """Each use with its boolean statics in every combination: the op forms no forward pass makes (an unplanned
    case, e.g. mHC pre's broadcast form without its RMSNorm) differ from the planned ones in such flags."""
    import itertools
    from .family import KernelUse
    out: dict[tuple, KernelUse] = {}
    for use in uses:
        flags = [k for k, v in use.static.items() if isinstance(v, bool)]
        for combo in itertools.product((False, True), repeat=len(flags)):
            static = {**use.static, **dict(zip(flags, combo))}
            out.setdefault((use.spec.name, tuple(sorted(static.items()))), KernelUse(use.spec, static, use.label))
    return list(out.values())


def case_uses(family, case: "GpuCase", model) -> list:
    """The family's uses a GPU case may launch at `model`'s shapes and the case's TP: those of its op's kernels whose
    statics agree with the case's `fixes` (a static the use lacks agrees)."""
    from .model_config import ParallelConfig
    op = case_op(family, case)
    kernels = None if op is None else set(family.ops[op])
    uses = family.uses(model, ParallelConfig(tp_size=case.tp_size))
    if not case.planned:
        uses = _flags_widened(uses)
    return [u for u in uses if (kernels is None or u.spec.name in kernels) and agrees(u.static, case.fixes)]


def agrees(static, fixes) -> bool:
    """A use's statics agree with what a case or benchmark fixes: equal where both name a value (a static the use
    lacks agrees)."""
    return all(static.get(k, v) == v for k, v in fixes.items())


def case_variants(family, case: "GpuCase", model, profile: ArchProfile) -> dict[tuple, tuple]:
    """(kernel, params, schedule) -> (spec, Variant) of every variant a GPU case may launch under `profile`: each of
    its uses (case_uses) at each of its token counts. The GPU pass compiles these before the cases run."""
    out: dict[tuple, tuple] = {}
    for use in case_uses(family, case, model):
        for t in case.tokens:
            try:
                v = use.spec.select(profile, use.static, t)
            except ValueError:
                if case.planned:
                    raise
                continue   # an unplanned flag combination the kernel does not take
            out.setdefault((v.kernel, v.params, v.schedule), (use.spec, v))
    return out


def profiles_proven_on(native: ArchProfile) -> list[ArchProfile]:
    """The profiles a GPU of `native`'s arch proves: its own schedule and, outside the SM12x family, the SM120
    schedule compiled for it."""
    if native.family == "blackwell_consumer":
        return [native]
    return [native, get_profile("sm_120a").emulated(native)]


def gpu_profiles() -> list[ArchProfile]:
    """The profiles this machine's GPU proves (profiles_proven_on its arch). Empty without a GPU."""
    native = detect_arch()
    return [] if native is None else profiles_proven_on(native)


def profile_id(profile: ArchProfile) -> str:
    """A test id for a profile from gpu_profiles: "sm_90a-schedule" or "sm_120a-schedule-on-sm_90a"."""
    if profile.schedule == profile.name:
        return f"{profile.name}-schedule"
    return f"{profile.schedule}-schedule-on-{profile.name}"


def store_for_gpu_tests(tmp_dir):
    """The store GPU tests load through: $DSV4_JIT_CACHE_DIR when set (e.g. an imported bundle compiled on a
    machine with no GPU), else a fresh one in tmp_dir."""
    from .cache_tools.store import Store
    return Store() if os.environ.get("DSV4_JIT_CACHE_DIR") else Store(tmp_dir)




def serving_getter(profile: ArchProfile, store, asked: set | None = None) -> Callable[["KernelSpec", Mapping[str, Any], int], Any]:
    """get_kernel(spec, static, num_tokens) as the ops take it, on the serving path: select with `profile`, then
    load from `store` (compiling only on a miss). `asked` collects (kernel, params, schedule) of each variant."""
    from . import jit

    def get_kernel(spec, static, num_tokens):
        v = spec.select(profile, static, num_tokens)
        if asked is not None:
            asked.add((v.kernel, v.params, v.schedule))
        return jit.load(spec, v, store)
    return get_kernel


class UnlaunchedKernel:
    """What select_only_getter returns: the selected variant, and an AssertionError if launched."""

    def __init__(self, variant):
        self.variant = variant

    def __call__(self, *args):
        raise AssertionError(f"{self.variant.name} was launched")


def select_only_getter(profile: ArchProfile) -> Callable[["KernelSpec", Mapping[str, Any], int], UnlaunchedKernel]:
    """get_kernel that selects as serving does but loads nothing: an op's checks of what the variant fixes (a
    workspace's size, a layout's block) run on the CPU, and a launch fails the test."""
    def get_kernel(spec, static, num_tokens):
        return UnlaunchedKernel(spec.select(profile, static, num_tokens))
    return get_kernel


def sglang_route_gpu_server_args():
    """The ServerArgs stand-in the SGLang route's GPU tests warm from (512-token prefill chunks, 8 decode requests),
    shared with the GPU pass's compile list so those tests find their variants compiled."""
    import types
    return types.SimpleNamespace(model_path="deepseek-v4-flash", tp_size=1, chunked_prefill_size=512,
                                 cuda_graph_max_bs_decode=8, max_running_requests=8)


def sglang_route_gpu_plan(arch: str):
    """The plan the SGLang route's GPU tests warm on a GPU of `arch`."""
    from dsv4_jit.engines import sglang_route
    return sglang_route.plan(sglang_route_gpu_server_args(), arch=arch)

