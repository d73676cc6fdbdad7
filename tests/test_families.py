"""Registry-driven checks: every registered kernel family (plus the toy family that tests the template)
gets these with no test code of its own.

CPU (CI):  registry consistency; `select` pure, bounded and fitting the shared-memory budget by the
           pre-nvcc formula for every variant, model and arch; no TileLang import to select; the artifact
           fingerprint covers kernel source only; the planner covers every use.
compile:   cross-compiles for sm_120a and sm_90a with no GPU. Tier `ci` (default): one representative
           variant per kernel and arch (the largest shared-memory estimate); tier `full`: every variant.
           Lowered shared memory <= the formula <= the budget; no wgmma/setmaxnreg on SM12x.
gpu:       each family's GpuCases on the native schedule and the SM120 schedule compiled for this GPU,
           outputs NaN-poisoned, per-token relative error against the float64 reference, and every variant
           the op asked for is in the plan (warmup cannot miss what serving asks for).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import compile_tier, gpu_profile_params
from dsv4_jit.arch import PROFILES, get_profile
from dsv4_jit.family import KernelFamily, all_families
from dsv4_jit.model_config import EMBEDDED, ParallelConfig, load_model_config
from dsv4_jit.spec import all_specs
from dsv4_jit.testing import case_variants, check_case_outputs, poison, serving_getter
from toy_family.family import FAMILY as TOY

FAMILIES: list[KernelFamily] = [*all_families().values(), TOY]
MODELS = tuple(EMBEDDED)                       # every model the package ships
COMPILE_ARCHS = ("sm_120a", "sm_90a")          # the SM12x schedule and the one we can run (H100/H200)
SM12X_FORBIDDEN = ("wgmma", "setmaxnreg", "warpgroup_reg")


def _fid(f: KernelFamily) -> str:
    return f.name


@functools.lru_cache(maxsize=None)
def variants(family_name: str, model: str, arch: str):
    fam = next(f for f in FAMILIES if f.name == family_name)
    return fam.variants(load_model_config(model), get_profile(arch))


# ------------------------------------------------------------------------------------------ registry
def test_registry_is_consistent():
    specs = all_specs()
    owners: dict[str, str] = {}
    for fam in all_families().values():
        for s in fam.specs:
            assert specs.get(s.name) is s, f"{fam.name}: {s.name} is not the registered spec object"
            assert s.name not in owners, f"{s.name} in families {owners[s.name]} and {fam.name}"
            owners[s.name] = fam.name
    assert set(owners) == set(specs), f"kernels registered without a family: {sorted(set(specs) - set(owners))}"


@pytest.mark.parametrize("model", MODELS)
def test_model_kernel_uses_are_the_families_uses(model):
    from dsv4_jit.kernels import model_kernel_uses
    m, par = load_model_config(model), ParallelConfig()
    got = [(u.spec.name, sorted(u.static.items()), u.label) for u in model_kernel_uses(m, par, mtp=False)]
    want = [(u.spec.name, sorted(u.static.items()), u.label) for f in all_families().values() for u in f.uses(m, par)]
    assert got == want and got
    # with the MTP block: its e_proj / h_proj GEMMs follow (dsv4_jit/model_uses.py)
    from dsv4_jit.model_uses import mtp_uses
    assert model_kernel_uses(m, par)[len(got):] == mtp_uses(m, par) != []


@pytest.mark.parametrize("family", FAMILIES, ids=_fid)
def test_ops_name_family_kernels(family):
    names = set(family.spec_names())
    used = {u.spec.name for m in MODELS for u in family.uses(load_model_config(m), ParallelConfig())}
    assert used <= names, f"uses launch kernels outside the family: {used - names}"
    for op, kernels in family.ops.items():
        assert kernels and set(kernels) <= names, (op, kernels)


# -------------------------------------------------------------------------------------------- select
@pytest.mark.parametrize("arch", sorted(PROFILES))
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("family", FAMILIES, ids=_fid)
def test_select_contract(family, model, arch):
    """Every variant select can return over 1..max_tokens: deterministic, bounded per use, and inside the
    shared-memory budget by the pre-nvcc formula (the check that runs before nvcc in every compile)."""
    prof = get_profile(arch)
    m = load_model_config(model)
    for use in family.uses(m, ParallelConfig()):
        seen = {}
        for t in range(1, family.max_tokens + 1):
            seen.setdefault(use.spec.select(prof, use.static, t), t)
        assert 1 <= len(seen) <= family.max_variants_per_use, (use.label, [v.name for v in seen])
        for v, t in seen.items():
            assert use.spec.select(prof, dict(use.static), t) == v, f"{v.name}: select is not deterministic"
            assert v.kernel == use.spec.name and v.arch == prof.name and v.schedule == prof.schedule
            need = use.spec.check_fits(v)
            assert 0 <= need <= prof.max_smem_per_block, (v.name, need)


@pytest.mark.parametrize("family", FAMILIES, ids=_fid)
def test_sm120_schedule_retargets_unchanged(family):
    """The proof path: the SM120 schedule compiled for sm_90a selects the same parameters, with the SM12x
    pass configs (no WGMMA/TMA/warp specialization), so running it on the H100/H200 runs that schedule."""
    sm120, hopper = get_profile("sm_120a"), get_profile("sm_90a")
    emu = sm120.emulated(hopper)
    m = load_model_config(MODELS[0])
    for use in family.uses(m, ParallelConfig()):
        for t in (1, 7, 64, 300, 2049, 8192):
            a, b = use.spec.select(sm120, use.static, t), use.spec.select(emu, use.static, t)
            assert (b.kernel, b.params, b.arch, b.schedule) == (a.kernel, a.params, "sm_90a", "sm_120a")
            cfg = use.spec.pass_configs(b)
            assert all(cfg.get(k) for k in sm120.pass_configs), (b.name, cfg)


def test_select_does_not_import_tilelang():
    code = ("import sys\n"
            "from dsv4_jit.family import all_families\nfrom dsv4_jit.arch import PROFILES\n"
            "from dsv4_jit.model_config import EMBEDDED, load_model_config, ParallelConfig\n"
            "for f in all_families().values():\n"
            "    for m in EMBEDDED:\n"
            "        for u in f.uses(load_model_config(m), ParallelConfig()):\n"
            "            for p in PROFILES.values():\n"
            "                [u.spec.select(p, u.static, t) for t in (1, 100, 5000)]\n"
            "assert 'tilelang' not in sys.modules, 'selecting a variant imported TileLang'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("family", FAMILIES, ids=_fid)
def test_fingerprint_covers_kernel_source_only(family):
    """The artifact key hashes the kernel-defining modules: host ops, references and the family
    declaration stay out, so editing validation or docs never re-keys a compiled artifact."""
    for spec in family.specs:
        mods = [m.__name__ for m in spec.source_closure()]
        assert type(spec).__module__ in mods
        host = [n for n in mods if n.rsplit(".", 1)[-1] in ("ops", "family", "reference") or n.endswith(".__init__")]
        assert not host, f"{spec.name}: fingerprint covers host modules {host}"
        assert len(spec.code_fingerprint) == 64


# ------------------------------------------------------------------------------------------- planner
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("family", FAMILIES, ids=_fid)
def test_planner_covers_every_use(family, model):
    """The plan for vLLM's default serving config holds the key of every variant each use selects at
    every token count the engine can produce."""
    from dsv4_jit.warmup.engines import vllm_shapes
    from dsv4_jit.warmup.planner import build_plan
    m = load_model_config(model)
    shapes = vllm_shapes()
    uses = family.uses(m, ParallelConfig(tp_size=shapes.tp_size))
    keyed = lambda spec, v: f"{spec.name}|{v.name}"  # noqa: E731  (cheap stand-in for the artifact key)
    plan = build_plan(m, shapes, list(COMPILE_ARCHS), uses=uses, key_fn=keyed)
    keys = set(plan.keys())
    for arch in COMPILE_ARCHS:
        for use in uses:
            for t in shapes.token_counts():
                assert keyed(use.spec, use.spec.select(get_profile(arch), use.static, t)) in keys, (use.label, t)


# ------------------------------------------------------------------------------------------- compile
def _representatives() -> list:
    """(family, spec, variant) with the largest shared-memory estimate of each kernel and arch over all
    shipped models: the variant whose fit is the binding one."""
    out = []
    for fam in FAMILIES:
        for arch in COMPILE_ARCHS:
            best: dict[str, tuple] = {}
            for model in MODELS:
                for v, (spec, _) in variants(fam.name, model, arch).items():
                    cur = best.get(spec.name)
                    if cur is None or spec.smem_bytes(v) > cur[0]:
                        best[spec.name] = (spec.smem_bytes(v), spec, v)
            out += [(fam, spec, v) for _, spec, v in best.values()]
    return out


def _every_variant() -> list:
    out, seen = [], set()
    for fam in FAMILIES:
        for arch in COMPILE_ARCHS:
            for model in MODELS:
                for v, (spec, _) in variants(fam.name, model, arch).items():
                    if v not in seen:
                        seen.add(v)
                        out.append((fam, spec, v))
    return out


def pytest_generate_tests(metafunc):
    if "compile_case" in metafunc.fixturenames:
        tier = compile_tier(metafunc.config)
        cases = [] if tier == "none" else (_every_variant() if tier == "full" else _representatives())
        metafunc.parametrize("compile_case", [pytest.param(c, id=f"{c[0].name}-{c[2].name}") for c in cases])


@pytest.mark.compile
def test_cross_compile(compile_case, tmp_path):
    from dsv4_jit import jit
    family, spec, variant = compile_case
    meta = jit.compile_to_dir(spec, variant, tmp_path)  # raises on a budget overrun or SM12x-forbidden code
    src = (tmp_path / jit.SOURCE_NAME).read_text()
    budget = get_profile(variant.schedule).max_smem_per_block
    assert 0 <= meta["smem_bytes"] <= spec.smem_bytes(variant) <= budget, (meta["smem_bytes"], spec.smem_bytes(variant))
    if get_profile(variant.schedule).family == "blackwell_consumer":
        assert not [w for w in SM12X_FORBIDDEN if w in src]
    if family.check_source is not None:
        family.check_source(variant, src)


# ----------------------------------------------------------------------------------------------- gpu
def _gpu_cases() -> list:
    out = []
    for fam in FAMILIES:
        for model in MODELS:
            for i, case in enumerate(fam.gpu_cases(load_model_config(model))):
                out.append(pytest.param(fam, model, i, id=f"{fam.name}-{model}-{case.name}"))
    return out


@functools.lru_cache(maxsize=None)
def _planned(family_name: str, model: str, schedule: str, max_tokens: int, tp_size: int = 1) -> frozenset:
    """(kernel, params, schedule) of every variant the plan holds for this family at vLLM defaults."""
    from dsv4_jit.warmup.engines import vllm_shapes
    from dsv4_jit.warmup.planner import build_plan
    fam = next(f for f in FAMILIES if f.name == family_name)
    m = load_model_config(model)
    # vLLM refuses max_num_batched_tokens below max_num_seqs; a larger plan still holds every smaller count
    shapes = vllm_shapes(max_num_batched_tokens=max(max_tokens, 8192), tensor_parallel_size=tp_size)
    plan = build_plan(m, shapes, [schedule], uses=fam.uses(m, ParallelConfig(tp_size=tp_size)), key_fn=lambda s, v: v.name)
    return frozenset((v.variant.kernel, v.variant.params, v.variant.schedule) for v in plan.variants)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", gpu_profile_params(placeholder=True))
@pytest.mark.parametrize("family,model,case_index", _gpu_cases())
def test_gpu_case(family, model, case_index, schedule, gpu_store, gpu_turn):
    if schedule is None:
        pytest.skip("needs a CUDA GPU")
    m = load_model_config(model)
    case = family.gpu_cases(m)[case_index]
    asked: set = set()
    # CPU work outside the GPU turn (conftest.gpu_turn): the plan and the variants the case may launch
    planned = _planned(family.name, model, schedule.schedule, max(case.tokens), case.tp_size) if case.planned else None
    declared = set(case_variants(family, case, m, schedule))

    get_kernel = serving_getter(schedule, gpu_store, asked)

    dev = torch.device("cuda")
    worst: dict[str, tuple[float, int]] = {}
    t0 = time.perf_counter()
    # seconds per phase (launch holds loads and any compile or wait for one; turn: the wait for the GPU under xdist)
    phases: dict[str, float] = {}
    mark = [t0]

    def phase(name: str, since: float | None = None) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - (mark[0] if since is None else since)
        mark[0] = now

    # one GPU turn for the whole case (conftest.gpu_turn): a compile or a wait for one lets go of it
    t_wait = time.perf_counter()
    with gpu_turn:
        phase("turn", t_wait)
        for i, t in enumerate(case.tokens):
            # inputs drawn on the GPU (a CUDA generator; factories default to the GPU while they are made): drawing
            # the largest cases' inputs on the host took longer than their launch and reference together
            g = torch.Generator(device=dev).manual_seed(10_000 * case_index + i)
            try:
                with dev:
                    inputs = case.make_inputs(t, dev, g)
                torch.cuda.synchronize()
                phase("inputs")
                outputs = case.make_outputs(inputs, schedule)
                poison(outputs)
                case.launch(inputs, outputs, schedule, get_kernel)
                torch.cuda.synchronize()
                phase("launch")
                want = case.reference(inputs, outputs)
                torch.cuda.synchronize()
                phase("reference")
                for name, (err, _) in check_case_outputs(case, outputs, want, t).items():
                    if err > worst.get(name, (-1.0, 0))[0]:
                        worst[name] = (err, t)
                phase("check")
            finally:
                # a failing case's traceback keeps this frame: drop its tensors before the turn passes on
                inputs = outputs = want = None
    undeclared = asked - declared
    assert not undeclared, (f"variants the op launched beyond the case's op and fixes (GpuCase.op / fixes, which the "
                            f"GPU pass compiles first): {sorted(undeclared)}")
    if case.planned:
        missing = asked - planned
        assert not missing, f"variants the op launched that the plan does not hold: {sorted(missing)}"
    line = {"family": family.name, "model": model, "case": case.name, "tp": case.tp_size, "schedule": f"{schedule.schedule} on {schedule.name}",
            "worst_per_token_rel_err": {k: [float(f"{e:.3e}"), t] for k, (e, t) in worst.items()},
            "variants": len(asked), "seconds": round(time.perf_counter() - t0, 1),
            "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "phases": {k: round(v, 2) for k, v in phases.items()}}
    print("\n" + json.dumps(line))
    report = os.environ.get("DSV4_JIT_GPU_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(line) + "\n")


def test_every_family_package_is_installed():
    """pyproject lists packages explicitly (kernels/ installs as dsv4_jit.kernels): a family subpackage
    missing there works in a checkout and vanishes from the wheel."""
    import pathlib
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = pathlib.Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    subs = {f"dsv4_jit.kernels.{p.parent.name}" for p in (root / "kernels").glob("*/__init__.py")}
    assert subs and subs <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(subs - listed)}"
