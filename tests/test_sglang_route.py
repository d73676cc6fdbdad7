"""The SGLang route (dsv4_jit.engines.sglang_route / sglang_ops / sglang_models).

CPU (CI):
* import without SGLang; the off switch, the version pin, SM12x only (forced with DSV4_JIT_ARCH);
* the hooks on stand-in modules: rebinding at the module attribute, get_mhc_ops' cache, a changed signature left
  alone, the ModelRunner.init_cuda_graphs warm + seal, a model other than DeepSeek V4 unrouted;
* the conversions (views, the indexer's in-place cache, fallbacks to SGLang's function with the same arguments);
* the plan from ServerArgs holds every variant the routes select at every token count the ServerArgs allow;
* SGLang 0.5.23's own files (the wheel, loaded at test time in a child process; tests/engine_peer_loader.py): the
  replacements' parameters are the originals', the real modules' attributes are rebound, SGLang's registry with
  SGLANG_EXTERNAL_MODEL_PACKAGE set still resolves DeepSeek V4 to the class SGLang registers, and the call sites
  read the rebound attributes at call time.
GPU (marked gpu): each route against a float64 torch reference of the SGLang function's contract, warmed from a
ServerArgs plan and sealed ("error"), so any compile after warmup fails the test.
"""
from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOADER = REPO / "tests" / "engine_peer_loader.py"
PEERS = Path(os.environ.get("DSV4_JIT_PEERS_DIR", Path.home() / ".cache" / "dsv4-jit" / "engine-peers"))
SWITCH = "DSV4_JIT_SGLANG_ROUTE"
MHC = "sglang.kernels.ops.layernorm.mhc"
TL = "sglang.kernels.ops.attention.dsa.tilelang_kernel"


def _py(code: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=REPO, timeout=timeout)


@pytest.fixture
def route():
    from dsv4_jit.engines import sglang_ops, sglang_route as r
    saved, finders, originals = dict(r.STATE), list(sys.meta_path), dict(sglang_ops.ORIGINALS)
    r.STATE.update(registered=False, routed={}, refused=None, skipped=None, warmup=None, sealed=None, unrouted=None)
    yield r
    sys.meta_path[:] = finders
    r.STATE.clear()
    r.STATE.update(saved)
    sglang_ops.ORIGINALS.clear()
    sglang_ops.ORIGINALS.update(originals)


# ---- import, switch, pin, arch ----------------------------------------------------------------------------

def test_imports_without_sglang():
    r = _py("""
        import sys
        import dsv4_jit.engines.sglang_ops, dsv4_jit.engines.sglang_route
        import dsv4_jit.engines.sglang_models as pkg
        assert pkg.ROUTE_INSTALLED is False                       # no SGLang installed here: nothing routed
        bad = [m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')]
        assert not bad, bad
        print('ok')
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "outside the supported range >=0.5.23,<0.5.24" in r.stderr


@pytest.mark.parametrize("value", ["0", "off", "false", "OFF"])
def test_off_switch(route, value, caplog):
    n = len(sys.meta_path)
    with caplog.at_level(logging.INFO, logger="dsv4_jit.sglang"):
        assert route.register(env={SWITCH: value}, sglang_version="0.5.23", sm=120) is False
    assert len(sys.meta_path) == n and not route.STATE["registered"]
    assert f"SGLang route off ({SWITCH}=0)" in caplog.text


@pytest.mark.parametrize("ver", ["0.5.22", "0.5.24", "0.6.0", "0.4.9", None])
def test_version_pin_refuses(route, ver, caplog, monkeypatch):
    monkeypatch.setattr(route, "installed_sglang_version", lambda: None)
    n = len(sys.meta_path)
    with caplog.at_level(logging.ERROR, logger="dsv4_jit.sglang"):
        assert route.register(env={}, sglang_version=ver, sm=120) is False
    assert len(sys.meta_path) == n and not route.STATE["registered"]
    assert "outside the supported range >=0.5.23,<0.5.24" in caplog.text and "SGLang runs unchanged" in caplog.text
    with pytest.raises(route.VersionRefused, match="outside the supported range"):
        route.register(env={SWITCH: "require"}, sglang_version=ver, sm=120)


@pytest.mark.parametrize("ver", ["0.5.23", "0.5.23.post1", "0.5.23+cu130"])
def test_version_pin_accepts(route, ver):
    assert route.register(env={}, sglang_version=ver, sm=120) is True
    assert route.register(env={}, sglang_version=ver, sm=120) is True        # idempotent
    assert sum(getattr(f, "on_import", None) is route._on_import for f in sys.meta_path) == 1


@pytest.mark.parametrize("env, sm, routes", [
    ({}, 120, True), ({}, 121, True), ({}, 90, False), ({}, 100, False), ({}, 103, False),
    ({"DSV4_JIT_ARCH": "sm_90a"}, 120, False),          # a forced arch wins over the GPU
    ({"DSV4_JIT_ARCH": "sm_120a"}, 90, True), ({"DSV4_JIT_ARCH": "sm_121a,sm_90a"}, None, True),
])
def test_routes_on_sm12x_only(route, env, sm, routes, caplog, monkeypatch):
    monkeypatch.setattr(route, "device_sm", lambda: None)
    n = len(sys.meta_path)
    with caplog.at_level(logging.INFO, logger="dsv4_jit.sglang"):
        assert route.register(env=env, sglang_version="0.5.23", sm=sm) is routes
    assert (len(sys.meta_path) == n + 1) is routes
    if not routes:
        assert "routes SM12x only" in caplog.text and route.STATE["skipped"]


def test_no_gpu_routes_nothing(route, monkeypatch):
    monkeypatch.setattr(route, "device_sm", lambda: None)
    assert route.register(env={}, sglang_version="0.5.23") is False
    assert route.STATE["skipped"] == "no CUDA GPU"


def test_bad_seal_env_fails_at_start(route):
    with pytest.raises(ValueError, match="DSV4_JIT_SEAL"):
        route.register(env={"DSV4_JIT_SEAL": "loud"}, sglang_version="0.5.23", sm=120)


# ---- the hooks on stand-in modules --------------------------------------------------------------------------

def _standin(name: str, routes: dict) -> types.ModuleType:
    """A module holding functions with the replaced functions' parameters, each returning ('sglang', name)."""
    mod = types.ModuleType(name)
    for fname, fn in routes.items():
        def orig(*a, _n=fname, **k):
            return ("sglang", _n, a, k)
        orig.__signature__ = inspect.signature(fn)
        setattr(mod, fname, orig)
    return mod


@pytest.fixture
def standins():
    from dsv4_jit.engines import sglang_ops
    import functools
    mods = {m: _standin(m, r) for m, r in sglang_ops.ROUTES.items()}
    model = types.ModuleType("sglang.srt.models.deepseek_v4")

    @functools.cache
    def get_mhc_ops():                   # as deepseek_v4.get_mhc_ops: imports the functions on its first call
        m = sys.modules[MHC]
        return types.SimpleNamespace(hc_split_sinkhorn=m.hc_split_sinkhorn, mhc_fused_post_pre=m.mhc_fused_post_pre)
    model.get_mhc_ops = get_mhc_ops
    mods[model.__name__] = model
    saved = {n: sys.modules.get(n) for n in mods}
    sys.modules.update(mods)
    yield mods
    for n, m in saved.items():
        if m is None:
            sys.modules.pop(n, None)
        else:
            sys.modules[n] = m


def test_already_imported_modules_are_rebound(route, standins):
    from dsv4_jit.engines import sglang_ops
    model = standins["sglang.srt.models.deepseek_v4"]
    stale = model.get_mhc_ops()                                   # cached before the route: SGLang's functions
    assert stale.hc_split_sinkhorn(1)[0] == "sglang"
    originals = {(m, n): getattr(standins[m], n) for m, r in sglang_ops.ROUTES.items() for n in r}
    assert route.register(env={}, sglang_version="0.5.23", sm=120)
    for (m, n), orig in originals.items():
        assert getattr(standins[m], n) is sglang_ops.ROUTES[m][n], n
        assert sglang_ops.ORIGINALS[n] is orig
    ops = model.get_mhc_ops()                                     # the cache was cleared: our functions now
    assert ops.hc_split_sinkhorn is sglang_ops.route_hc_split_sinkhorn
    assert ops.mhc_fused_post_pre is sglang_ops.route_mhc_fused_post_pre
    assert route.STATE["routed"][MHC] == ["hc_split_sinkhorn", "mhc_fused_post_pre", "mhc_post", "mhc_pre"]
    assert route.route_module(standins[MHC]) == []                # twice: nothing more
    line = route.routed_line()
    assert f"routed SGLang SM12x calls tilelang_fp8_paged_mqa_logits ({TL}); hc_split_sinkhorn, " \
           f"mhc_fused_post_pre, mhc_post, mhc_pre ({MHC}) to dsv4-jit ops" in line and "stay on SGLang's" in line
    back = route.unroute()
    assert sorted(back) == sorted(n for _, n in originals)
    assert all(getattr(standins[m], n) is orig for (m, n), orig in originals.items())
    assert model.get_mhc_ops().hc_split_sinkhorn is originals[(MHC, "hc_split_sinkhorn")]


def test_a_changed_signature_is_left_alone(route, standins, caplog):
    mod = standins[MHC]

    def mhc_post(x, residual, post_layer_mix, comb_res_mix, out=None):      # not 0.5.23's parameters
        return "sglang"
    mod.mhc_post = mhc_post
    with caplog.at_level(logging.ERROR, logger="dsv4_jit.sglang"):
        assert route.register(env={}, sglang_version="0.5.23", sm=120)
    assert mod.mhc_post is mhc_post and "mhc_post" not in route.STATE["routed"][MHC]
    assert f"{MHC}.mhc_post does not take SGLang 0.5.23's parameters" in caplog.text


def test_post_import_hook_rebinds_on_import(tmp_path):
    """A fresh interpreter: the modules are imported after register(), as in an SGLang worker."""
    pkg = tmp_path / "sglang" / "kernels" / "ops" / "layernorm"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", pkg.parents[2], pkg.parents[1], pkg.parents[0], pkg):
        (d / "__init__.py").write_text("")
    (pkg / "mhc.py").write_text("def mhc_post(x, residual, post_layer_mix, comb_res_mix):\n    return 'sglang'\n")
    r = _py(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from dsv4_jit.engines import sglang_route as R, sglang_ops as O
        assert R.register(env={{}}, sglang_version='0.5.23', sm=120)
        assert 'sglang' not in sys.modules
        import sglang.kernels.ops.layernorm.mhc as m
        assert m.mhc_post is O.route_mhc_post and O.ORIGINALS['mhc_post'](1, 2, 3, 4) == 'sglang'
        print(R.routed_line())
    """)
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"mhc_post ({MHC})" in r.stdout


def _runner_module() -> types.ModuleType:
    mod = types.ModuleType("sglang.srt.model_executor.model_runner")

    class ModelRunner:
        calls: list = []

        def __init__(self, archs, server_args):
            self.model_config = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=archs))
            self.server_args = server_args

        def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):
            ModelRunner.calls.append(("capture", capture_decode_cuda_graph))
    mod.ModelRunner = ModelRunner
    return mod


def test_runner_hook_warms_and_seals_before_capture(route, standins, monkeypatch, caplog):
    import dsv4_jit
    runner_mod = _runner_module()
    monkeypatch.setitem(sys.modules, runner_mod.__name__, runner_mod)
    seen = {}

    def fake_warm(plan, **kw):
        seen.update(kw, plan=plan, order=len(runner_mod.ModelRunner.calls))
        return {"compiled": 3, "failures": [], "loaded": plan.compiles}
    monkeypatch.setattr(dsv4_jit, "warm", fake_warm)
    monkeypatch.setenv("DSV4_JIT_SEAL", "error")
    monkeypatch.setenv("DSV4_JIT_ARCH", "sm_120a")
    assert route.register(env={"DSV4_JIT_ARCH": "sm_120a"}, sglang_version="0.5.23")
    cls = runner_mod.ModelRunner
    assert cls.init_cuda_graphs.__dsv4_jit_route__ and cls.init_cuda_graphs.__wrapped__
    sa = types.SimpleNamespace(model_path="deepseek-v4-flash", tp_size=2, cuda_graph_max_bs_decode=16)
    with caplog.at_level(logging.INFO, logger="dsv4_jit.sglang"):
        cls(["DeepseekV4ForCausalLM"], sa).init_cuda_graphs(capture_decode_cuda_graph=False)
        cls(["DeepseekV4ForCausalLMNextN"], sa).init_cuda_graphs()          # the draft: warmed once already
    assert cls.calls == [("capture", False), ("capture", True)]
    assert seen["order"] == 0 and seen["seal_mode"] == "error" and seen["world_size"] == 2 and seen["rank"] == 0
    assert {v.kernel for v in seen["plan"].variants} == {"mhc_pre_norm_fn", "mhc_pre_fuse", "mhc_sinkhorn",
                                                         "mhc_post", "mhc_post_pre_fused", "indexer_decode_logits"}
    assert route.STATE["sealed"] == "error" and route.STATE["warmup"]["variants"] == seen["plan"].compiles
    assert caplog.text.count("dsv4-jit: routed SGLang SM12x calls") == 1
    assert f"warmed {seen['plan'].compiles} variants on rank 0/2" in caplog.text and "sealed error" in caplog.text


@pytest.mark.parametrize("seal", ["warn", "error"])
def test_runner_hook_with_server_args_the_planner_refuses(route, standins, monkeypatch, caplog, seal):
    """torch.compile graphs are not followed by the formula: no warmup, the routes still serve, nothing sealed
    (DSV4_JIT_SEAL=error: SGLang does not start)."""
    import dsv4_jit
    from dsv4_jit.errors import ConfigError
    runner_mod = _runner_module()
    monkeypatch.setitem(sys.modules, runner_mod.__name__, runner_mod)
    monkeypatch.setattr(dsv4_jit, "warm", lambda *a, **k: pytest.fail("warmed an unplanned config"))
    monkeypatch.setenv("DSV4_JIT_SEAL", seal)
    assert route.register(env={"DSV4_JIT_ARCH": "sm_120a"}, sglang_version="0.5.23")
    sa = types.SimpleNamespace(model_path="deepseek-v4-flash", enable_torch_compile=True)
    runner = runner_mod.ModelRunner(["DeepseekV4ForCausalLM"], sa)
    if seal == "error":
        with pytest.raises(ConfigError, match="enable_torch_compile"):
            runner.init_cuda_graphs()
        return
    with caplog.at_level(logging.ERROR, logger="dsv4_jit.sglang"):
        runner.init_cuda_graphs()
    assert "no warmup for these ServerArgs" in caplog.text and route.STATE["sealed"] is None
    from dsv4_jit.engines.sglang_ops import route_mhc_post
    assert standins[MHC].mhc_post is route_mhc_post                # the routes still serve
    runner.init_cuda_graphs()                                      # not retried
    assert runner_mod.ModelRunner.calls[-2:] == [("capture", True), ("capture", True)]


def test_runner_hook_gives_other_models_sglangs_functions(route, standins, monkeypatch):
    import dsv4_jit
    runner_mod = _runner_module()
    monkeypatch.setitem(sys.modules, runner_mod.__name__, runner_mod)
    monkeypatch.setattr(dsv4_jit, "warm", lambda *a, **k: pytest.fail("warmed for another model"))
    orig = standins[MHC].mhc_post
    assert route.register(env={}, sglang_version="0.5.23", sm=120)
    assert standins[MHC].mhc_post is not orig
    runner_mod.ModelRunner(["LlamaForCausalLM"], types.SimpleNamespace()).init_cuda_graphs()
    assert standins[MHC].mhc_post is orig and route.STATE["routed"] == {} and route.STATE["warmup"] is None
    assert route.route_module(standins[TL]) == [] and route.STATE["unrouted"] == "['LlamaForCausalLM']"


def test_runner_hook_warms_before_sglang_imports_the_kernel_modules(route, monkeypatch, caplog):
    """The indexer's module is imported at its first call (inside graph capture): the plan holds its variant
    anyway, and the post-import hook rebinds it then."""
    import dsv4_jit
    runner_mod = _runner_module()
    monkeypatch.setitem(sys.modules, runner_mod.__name__, runner_mod)
    for m in (MHC, TL):
        monkeypatch.delitem(sys.modules, m, raising=False)
    seen = {}
    monkeypatch.setattr(dsv4_jit, "warm", lambda plan, **kw: seen.update(plan=plan) or
                        {"compiled": 0, "failures": [], "loaded": plan.compiles})
    monkeypatch.setenv("DSV4_JIT_ARCH", "sm_120a")
    assert route.register(env={"DSV4_JIT_ARCH": "sm_120a"}, sglang_version="0.5.23")
    sa = types.SimpleNamespace(model_path="deepseek-v4-flash", tp_size=1)
    with caplog.at_level(logging.INFO, logger="dsv4_jit.sglang"):
        runner_mod.ModelRunner(["DeepseekV4ForCausalLM"], sa).init_cuda_graphs()
    assert "indexer_decode_logits" in {v.kernel for v in seen["plan"].variants}
    assert f"tilelang_fp8_paged_mqa_logits (when SGLang imports {TL})" in caplog.text


# ---- conversions (CPU tensors) --------------------------------------------------------------------------------

def _t(*shape, dtype=None):
    import torch
    return torch.zeros(*shape, dtype=dtype or torch.float32)


def test_sinkhorn_conversion_is_views():
    import torch
    from dsv4_jit.engines import sglang_ops as o
    mixes = _t(5, 1, 24)
    args, kw, dims = o.sinkhorn_args(mixes, _t(3), _t(24), 4, 20, 1e-6)
    assert args[0].shape == (5, 24) and args[0].data_ptr() == mixes.data_ptr() and dims == (5, 1, 4)
    assert kw == {"hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0}
    for bad in ((_t(5, 24), _t(3), _t(24)), (_t(5, 1, 20), _t(3), _t(24)), (_t(5, 1, 24, dtype=torch.bfloat16),
                _t(3), _t(24)), (_t(5, 2, 24)[:, :1], _t(3), _t(24))):
        with pytest.raises(o.Unsupported):
            o.sinkhorn_args(*bad, 4, 20, 1e-6)


def _logits_inputs(batch=3, heads=64, pages=5, width=4, dtype=None):
    import torch
    q = torch.zeros(batch, 1, heads, 128, dtype=torch.float8_e4m3fn)
    cache = torch.zeros(pages, 64 * 132, dtype=dtype or torch.uint8).view(pages, 64, 1, 132)
    return (q, cache, _t(batch, heads), torch.ones(batch, dtype=torch.int32),
            torch.zeros(batch, width, dtype=torch.int32))


def test_logits_conversion_reads_the_cache_in_place():
    import torch
    from dsv4_jit.engines import sglang_ops as o
    for dtype in (torch.uint8, torch.float8_e4m3fn):
        q, cache, w, sl, pt = _logits_inputs(dtype=dtype)
        args, kw = o.logits_args(q, cache, w, sl, pt, 256, False)
        assert args[0].shape == (3, 64, 128) and args[0].data_ptr() == q.data_ptr()
        assert args[3].dtype == torch.uint8 and args[3].data_ptr() == cache.data_ptr() and args[3].shape == cache.shape
        assert torch.equal(args[1], torch.ones(3)) and args[2] is w and args[4] is sl and args[5] is pt
        assert kw == {"next_n": 1, "ratio": 1, "width": 256, "clean": False}


@pytest.mark.parametrize("bad", ["clean", "page32", "heads48", "seq_i64", "weight_nc", "q3d", "pt_rows"])
def test_logits_unsupported_falls_back_to_sglang(bad):
    import torch
    from dsv4_jit.engines import sglang_ops as o
    q, cache, w, sl, pt = _logits_inputs(heads=48 if bad == "heads48" else 64)
    clean = bad == "clean"
    if bad == "page32":
        cache = torch.zeros(5, 32 * 132, dtype=torch.uint8).view(5, 32, 1, 132)
    if bad == "seq_i64":
        sl = sl.long()
    if bad == "weight_nc":
        w = _t(64, 3).t()
    if bad == "q3d":
        q = q[:, 0]
    if bad == "pt_rows":
        pt = pt[:2]
    got, saved = [], dict(o.ORIGINALS)
    o.ORIGINALS["tilelang_fp8_paged_mqa_logits"] = lambda *a: got.append(a) or "sglang"
    try:
        before = sum(o.FALLBACKS.values())
        assert o.route_fp8_paged_mqa_logits(q, cache, w, sl, pt, None, 256, clean) == "sglang"
        assert got[0] == (q, cache, w, sl, pt, None, 256, clean) and sum(o.FALLBACKS.values()) == before + 1
    finally:
        o.ORIGINALS.clear()
        o.ORIGINALS.update(saved)


@pytest.mark.parametrize("case", ["eps", "norm_eps_none", "residual_nc"])
def test_mhc_unsupported_falls_back_to_sglang(case):
    import torch
    from dsv4_jit.engines import sglang_ops as o
    hc, h = 4, 256
    res = _t(6, hc, h, dtype=torch.bfloat16)
    if case == "residual_nc":
        res = _t(hc, 6, h, dtype=torch.bfloat16).transpose(0, 1)
    nw = _t(h, dtype=torch.bfloat16)
    eps2 = 1e-5 if case == "eps" else 1e-6
    norm_eps = None if case == "norm_eps_none" else 1e-6
    got, saved = [], dict(o.ORIGINALS)
    for name in ("mhc_pre", "mhc_fused_post_pre"):
        o.ORIGINALS[name] = lambda *a, **k: got.append((a, k)) or "sglang"
    try:
        common = (_t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, eps2, 2.0, 20)
        assert o.route_mhc_pre(res, *common, 1, 32, norm_weight=nw, norm_eps=norm_eps) == "sglang"
        assert got[-1] == ((res, *common, 1, 32), {"norm_weight": nw, "norm_eps": norm_eps})
        x, post, comb = _t(6, h, dtype=torch.bfloat16), _t(6, hc), _t(6, hc, hc)
        assert o.route_mhc_fused_post_pre(x, res, post, comb, *common, 1, 1, norm_weight=nw,
                                          norm_eps=norm_eps) == "sglang"
        assert got[-1] == ((x, res, post, comb, *common, 1, 1), {"norm_weight": nw, "norm_eps": norm_eps})
    finally:
        o.ORIGINALS.clear()
        o.ORIGINALS.update(saved)


def test_norm_weight_is_converted_as_sglang_does():
    import torch
    from dsv4_jit.engines import sglang_ops as o
    w = torch.arange(8, dtype=torch.float32)
    got = o._bf16_norm(w[::2], 1e-6)
    assert got.dtype == torch.bfloat16 and got.is_contiguous() and torch.equal(got.float(), w[::2])
    bf = torch.ones(8, dtype=torch.bfloat16)
    assert o._bf16_norm(bf, 1e-6) is bf and o._bf16_norm(None, None) is None


# ---- the plan holds what the routes select --------------------------------------------------------------------

def _route_statics(model) -> list[tuple[str, dict, object]]:
    """(kernel, static, tokens -> bool) for every kernel launch of the routes, the statics built by the routes'
    own conversions with the values SGLang's DeepSeek V4 layer passes (config eps, MHC_POST_MULT_VALUE = 2.0,
    the layer norms' eps), the way kernels/mhc/ops.py and kernels/indexer/ops.py build them."""
    import torch
    from dsv4_jit.engines import sglang_ops as o, vllm_mhc
    from dsv4_jit.kernels.indexer.ops import decode_static
    from dsv4_jit.kernels.mhc.post import use_fused_post_pre
    hc, h, m = model.hc_mult, model.hidden_size, model.mix_width
    out = []
    nf = {"hidden": h, "hc": hc, "broadcast": False}
    post = {"hidden_size": h, "hc_mult": hc}
    fused = {"hidden_size": h, "hc_mult": hc, "mix_width": m}
    res = _t(2, hc, h, dtype=torch.bfloat16)
    for nw in (_t(h, dtype=torch.bfloat16), None):
        ne = model.rms_norm_eps if nw is not None else None
        _, kw, _ = vllm_mhc.pre_args(res, _t(m, hc * h), _t(3), _t(m), model.rms_norm_eps, model.hc_eps, model.hc_eps,
                                     2.0, model.hc_sinkhorn_iters, 1, o._bf16_norm(nw, ne), ne)
        fuse = vllm_mhc.fuse_static(kw, h, hc)
        out += [("mhc_pre_norm_fn", nf, lambda t: True), ("mhc_pre_fuse", fuse, lambda t: True),   # mhc_pre
                ("mhc_post_pre_fused", fused, use_fused_post_pre),                                    # fused
                ("mhc_post", post, lambda t: not use_fused_post_pre(t)),
                ("mhc_pre_norm_fn", nf, lambda t: not use_fused_post_pre(t))]
    out.append(("mhc_post", post, lambda t: True))                                                     # post
    _, kw, _ = o.sinkhorn_args(_t(2, 1, m), _t(3), _t(m), hc, model.hc_sinkhorn_iters, model.hc_eps)
    out.append(("mhc_sinkhorn", {"hc": hc, "iters": kw["sinkhorn_iters"], "hc_eps": kw["hc_eps"],
                                 "post_mult": kw["post_mult"]}, lambda t: True))
    q, cache, w, sl, pt = _logits_inputs(heads=model.index_n_heads)
    (qv, *_), kw = o.logits_args(q, cache, w, sl, pt, 1024, False)
    out.append(("indexer_decode_logits", decode_static(qv.shape[1], qv.shape[2], kw["next_n"], cache.shape[1],
                                                       kw["ratio"], kw["clean"]), lambda t: True))
    return out


SERVER_ARGS = [
    dict(model_path="deepseek-v4-flash"),
    dict(model_path="deepseek-v4-flash", speculative_algorithm="EAGLE", speculative_num_steps=3,
         speculative_eagle_topk=1, speculative_num_draft_tokens=4, max_running_requests=64),
    dict(model_path="deepseek-v4-pro", tp_size=4, chunked_prefill_size=4096, cuda_graph_max_bs_decode=64),
    dict(model_path="deepseek-v4-flash", disable_cuda_graph=True, chunked_prefill_size=2048),
]


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
@pytest.mark.parametrize("sa", SERVER_ARGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_plan_holds_every_variant_the_routes_select(route, sa, arch):
    from dsv4_jit.arch import get_profile
    from dsv4_jit.jit import artifact_key
    from dsv4_jit.spec import get_spec
    plan = route.plan(types.SimpleNamespace(**sa), arch=arch)
    from dsv4_jit.engines.sglang_hook import model_from_server_args
    model = model_from_server_args(types.SimpleNamespace(**sa))
    assert model.hc_post_mult == 2.0          # SGLang's MHC_POST_MULT_VALUE and its Sinkhorn's fixed 2
    keys, prof = set(plan.keys()), get_profile(arch)
    counts = plan.shapes.token_counts()
    assert counts[-1] >= 2048
    for kernel, static, on in _route_statics(model):
        spec, seen = get_spec(kernel), {}
        for t in counts:
            if on(t):
                v = spec.select(prof, static, t)
                if v not in seen:
                    seen[v] = artifact_key(spec, v)
                    assert seen[v] in keys, f"{kernel} {static} at {t} tokens: {v.name} not planned"
        assert seen, kernel
    assert {v.kernel for v in plan.variants} == {"mhc_pre_norm_fn", "mhc_pre_fuse", "mhc_sinkhorn", "mhc_post",
                                                 "mhc_post_pre_fused", "indexer_decode_logits"}


# ---- SGLang 0.5.23's own files ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sglang_files() -> Path:
    """The SGLang 0.5.23 wheel's Python files (fetched once by tests/engine_peer_loader.py)."""
    try:
        subprocess.run([sys.executable, str(LOADER), str(PEERS), "fetch"], check=True, timeout=900,
                       capture_output=True, text=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        msg = f"cannot fetch the SGLang 0.5.23 wheel into {PEERS}: {getattr(e, 'stderr', e)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return PEERS / "sglang"


_PEER_SCRIPT = """
import functools, inspect, json, os, pkgutil, sys, types
sys.path.insert(0, {tests!r})
import engine_peer_loader as L
L._setup({peers!r}, 'sglang')
from sglang._version import __version__
from dsv4_jit.engines import sglang_route as R, sglang_ops as O
R.installed_sglang_version = lambda: __version__          # the wheel's version (no dist-info in its files)
models = os.path.join({peers!r}, 'sglang', 'sglang', 'srt', 'models')
# SGLang's default registry, with every model module but deepseek_v4 disabled and deepseek_v4 stood in (importing
# it needs SGLang's GPU stack): what the registry resolves DeepSeek V4 to once the external package is set
os.environ['SGLANG_DISABLED_MODEL_ARCHS'] = ','.join(m.name for m in pkgutil.iter_modules([models])
                                                     if m.name != 'deepseek_v4')
stand = types.ModuleType('sglang.srt.models.deepseek_v4')
class DeepseekV4ForCausalLM: pass
stand.EntryClass = [DeepseekV4ForCausalLM]
sys.modules[stand.__name__] = stand
import sglang.srt.models.registry as reg                   # imports SGLANG_EXTERNAL_MODEL_PACKAGE
out = {{'version': __version__, 'registered': R.STATE['registered'], 'skipped': R.STATE['skipped'],
        'external_models': sorted(reg.ModelRegistry.models),
        'defaults_loaded': reg.ModelRegistry._default_models_loaded,
        'pkg_imported': 'dsv4_jit.engines.sglang_models' in sys.modules}}
cls, arch = reg.ModelRegistry.resolve_model_cls(['DeepseekV4ForCausalLM'])
out['resolved'] = [cls is DeepseekV4ForCausalLM, arch]
import sglang.kernels.ops.layernorm.mhc, sglang.kernels.ops.attention.dsa.tilelang_kernel
def params(f):
    return [[p.name, str(p.kind), repr(p.default)] for p in inspect.signature(f).parameters.values()]
out['functions'] = {{}}
for mod, routes in O.ROUTES.items():
    m = sys.modules[mod]
    for name, fn in routes.items():
        orig = O.ORIGINALS.get(name, getattr(m, name))
        out['functions'][name] = {{'bound': getattr(m, name) is fn, 'orig_module': orig.__module__,
                                   'orig': params(orig), 'route': params(fn)}}
out['line'] = R.routed_line()
print('JSON' + json.dumps(out))
"""


def _peer_run(env: dict) -> dict:
    code = _PEER_SCRIPT.format(tests=str(REPO / "tests"), peers=str(PEERS))
    r = _py(code, env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "dsv4_jit.engines.sglang_models", **env})
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.split("JSON", 1)[1])


def test_sglang_0_5_23_is_routed_at_its_module_attributes(sglang_files):
    got = _peer_run({"DSV4_JIT_ARCH": "sm_120a", SWITCH: "1"})
    assert got["version"].startswith("0.5.23") and got["registered"] and got["pkg_imported"]
    # the external package adds no model class and leaves SGLang's defaults to the first lookup
    assert got["external_models"] == [] and got["defaults_loaded"] is False
    assert got["resolved"] == [True, "DeepseekV4ForCausalLM"]
    assert set(got["functions"]) == {"mhc_pre", "mhc_post", "mhc_fused_post_pre", "hc_split_sinkhorn",
                                     "tilelang_fp8_paged_mqa_logits"}
    for name, f in got["functions"].items():
        assert f["bound"], name
        assert f["orig_module"] in (MHC, TL), name                   # SGLang's own function is the fallback
        assert f["route"] == f["orig"], name                         # same names, kinds and defaults
    assert "tilelang_fp8_paged_mqa_logits (sglang.kernels.ops.attention.dsa.tilelang_kernel)" in got["line"]


@pytest.mark.parametrize("env", [{"DSV4_JIT_ARCH": "sm_90a"}, {"DSV4_JIT_ARCH": "sm_100a"},
                                 {"DSV4_JIT_ARCH": "sm_120a", SWITCH: "0"}], ids=["sm_90a", "sm_100a", "off"])
def test_sglang_0_5_23_is_left_alone_off_sm12x_or_switched_off(sglang_files, env):
    got = _peer_run(env)
    assert not got["registered"] and got["pkg_imported"] and got["resolved"] == [True, "DeepseekV4ForCausalLM"]
    assert not any(f["bound"] for f in got["functions"].values())
    if SWITCH not in env:
        assert got["skipped"] == f"DSV4_JIT_ARCH={env['DSV4_JIT_ARCH']}"


def test_live_server_args_plan(sglang_files):
    """ServerArgs as SGLang 0.5.23's own parser builds them (every field at its default unless given) plan."""
    r = _py(f"""
        import sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        import engine_peer_loader as L
        L._setup({str(PEERS)!r}, 'sglang')
        from sglang.srt.server_args import ServerArgs
        from dsv4_jit.engines import sglang_route as R
        parser = L.sglang_parser()
        for argv in ([], ['--tp-size', '2', '--speculative-algorithm', 'EAGLE', '--chunked-prefill-size', '4096']):
            sa = ServerArgs.from_cli_args(parser.parse_args(['--model-path', 'deepseek-v4-flash', *argv]))
            p = R.plan(sa, arch='sm_120a')
            print('PLAN', p.shapes.tp_size, p.shapes.max_num_tokens, p.shapes.spec_tokens, p.compiles)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    plans = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("PLAN")]
    assert [p[:3] for p in plans] == [["1", "8192", "0"], ["2", "4096", "3"]] and all(int(p[3]) > 0 for p in plans)


def _tree(files: Path, rel: str) -> ast.Module:
    return ast.parse((files / rel).read_text())


def _imports(tree: ast.Module, module: str) -> list[tuple[str, bool]]:
    """(name, at module level) of every `from module import name` in the file."""
    top = {id(n) for n in tree.body}
    return [(a.name, id(node) in top) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == module for a in node.names]


def test_sglang_call_sites_read_the_attributes_at_call_time(sglang_files):
    """Every SGLang 0.5.23 import of a routed name sits inside a function, so the call reads the module attribute
    the route rebinds; get_mhc_ops (functools.cache) is the one cache, cleared by the route."""
    from dsv4_jit.engines import sglang_ops
    sites = {"srt/models/deepseek_v4.py", "srt/models/deepseek_v4_mhc.py", "srt/layers/attention/dsv4/indexer.py",
             "srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py", "srt/models/deepseek_v4_boundary.py"}
    seen: dict[str, set] = {}
    for rel in sites:
        tree = _tree(sglang_files, "sglang/" + rel)
        for mod, routes in sglang_ops.ROUTES.items():
            for name, top in _imports(tree, mod):
                if name in routes:
                    assert not top, f"{rel} imports {name} at module level"
                    seen.setdefault(name, set()).add(rel)
    assert seen["mhc_pre"] >= {"srt/models/deepseek_v4.py"}                        # DeepseekV4 hc_pre (TileLang pre)
    assert seen["mhc_post"] >= {"srt/models/deepseek_v4_mhc.py"}                   # mhc.post
    assert seen["hc_split_sinkhorn"] >= {"srt/models/deepseek_v4.py"}              # get_mhc_ops
    assert seen["mhc_fused_post_pre"] >= {"srt/models/deepseek_v4.py"}             # get_mhc_ops
    assert seen["tilelang_fp8_paged_mqa_logits"] == {"srt/layers/attention/dsv4/indexer.py"}
    dsv4 = _tree(sglang_files, "sglang/srt/models/deepseek_v4.py")
    fn = next(n for n in dsv4.body if isinstance(n, ast.FunctionDef) and n.name == "get_mhc_ops")
    assert [ast.unparse(d) for d in fn.decorator_list] == ["functools.cache"]
    entry = next(n for n in dsv4.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "EntryClass")
    assert ast.unparse(entry.value) == "[DeepseekV4ForCausalLM]"


def test_sglang_worker_calls_init_cuda_graphs_before_serving(sglang_files):
    """The hook point: Scheduler.init_all_cuda_graphs -> TpModelWorker.init_cuda_graphs ->
    ModelRunner.init_cuda_graphs, after the model and memory pools, before capture (also with graphs off)."""
    def method(rel, cls, name):
        tree = _tree(sglang_files, "sglang/" + rel)
        c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        return next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name)
    runner = method("srt/model_executor/model_runner.py", "ModelRunner", "init_cuda_graphs")
    assert [a.arg for a in runner.args.args] == ["self", "capture_decode_cuda_graph"]
    assert "capture_cuda_graphs(" in ast.unparse(runner)
    assert "self.model_runner.init_cuda_graphs(" in ast.unparse(method("srt/managers/tp_worker.py", "TpModelWorker",
                                                                        "init_cuda_graphs"))
    assert "self.tp_worker.init_cuda_graphs()" in ast.unparse(method("srt/managers/scheduler.py", "Scheduler",
                                                                      "init_all_cuda_graphs"))
    registry = (sglang_files / "sglang/srt/models/registry.py").read_text()
    assert "ModelRegistry.models.update(import_model_classes(external_pkg))" in registry


# ---- GPU: each route against SGLang's contract, warmed and sealed -------------------------------------------------

GPU_TOKENS = (1, 7, 32, 33, 256, 512)
TOL = 1e-2


def _rel(a, b) -> float:
    a, b = a.double().flatten(1), b.double().flatten(1)
    return float(((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-12)).max())


@pytest.fixture(scope="module")
def warmed():
    """The route's plan for a ServerArgs (512-token prefill chunks, 8 decode requests) on this GPU, warmed and
    sealed with "error": a compile after this fails the test."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import dsv4_jit
    from dsv4_jit.engines import sglang_route as r
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.testing import sglang_route_gpu_server_args
    plan = r.plan(sglang_route_gpu_server_args())
    rep = dsv4_jit.warm(plan, seal_mode="error")
    assert not rep["failures"], rep["failures"]
    before = dsv4_jit.counters()["compiles"]
    yield load_model_config("deepseek-v4-flash")
    assert dsv4_jit.counters()["compiles"] == before          # nothing compiled after warmup
    dsv4_jit.seal("off")


def _mhc_inputs(m, t, g, dev):
    import torch
    hc, h = m.hc_mult, m.hidden_size
    scale = torch.exp(torch.rand(t, generator=g) * 5 - 2)
    res = (torch.randn(t, hc, h, generator=g) * scale[:, None, None]).to(torch.bfloat16)
    return {"residual": res.to(dev),
            "fn": (torch.randn(m.mix_width, hc * h, generator=g) * (4.0 / (hc * h) ** 0.5)).to(dev),
            "hc_scale": (torch.rand(3, generator=g) + 0.5).to(dev),
            "hc_base": (torch.randn(m.mix_width, generator=g) * 0.5).to(dev),
            "norm_weight": (torch.rand(h, generator=g) + 0.5).to(torch.bfloat16).to(dev),
            "x": (torch.randn(t, h, generator=g) * scale[:, None]).to(torch.bfloat16).to(dev),
            "post": (torch.rand(t, hc, generator=g) * 2).to(dev),
            "comb": torch.softmax(torch.randn(t, hc, hc, generator=g), -1).to(dev)}


def _sglang_pre_reference(m, d, residual, norm):
    """SGLang's mhc_pre contract: (post_mix [T, hc, 1], comb [T, hc, hc], layer_input [T, H]) with
    post = MHC_POST_MULT_VALUE * sigmoid(...), comb = its Sinkhorn, layer_input = sum_i pre_i X_i (RMSNorm'ed with
    norm_weight and norm_eps when given): mhc_pre_big_fuse(_with_norm)_tilelang."""
    from dsv4_jit.kernels.mhc import reference as ref
    y, post, comb = ref.ref_mhc_pre(residual, d["fn"], d["hc_scale"], d["hc_base"], m.rms_norm_eps, m.hc_eps,
                                    m.hc_sinkhorn_iters, 2.0, norm_weight=d["norm_weight"] if norm else None,
                                    norm_eps=m.rms_norm_eps)
    return post.unsqueeze(-1), comb, y


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no-norm"])
def test_gpu_mhc_pre_route(warmed, norm):
    import torch
    from dsv4_jit.engines import sglang_ops as o
    m, g = warmed, torch.Generator().manual_seed(1)
    for t in GPU_TOKENS:
        d = _mhc_inputs(m, t, g, "cuda")
        got = o.route_mhc_pre(d["residual"], d["fn"], d["hc_scale"], d["hc_base"], m.rms_norm_eps, m.hc_eps, m.hc_eps,
                              2.0, m.hc_sinkhorn_iters, 1, 32, norm_weight=d["norm_weight"] if norm else None,
                              norm_eps=m.rms_norm_eps if norm else None)
        want = _sglang_pre_reference(m, d, d["residual"], norm)
        for name, a, b in zip(("post_mix", "comb", "layer_input"), got, want):
            assert a.shape == b.shape, (t, name)
            assert _rel(a, b) <= TOL, (t, name, _rel(a, b))


@pytest.mark.gpu
def test_gpu_mhc_post_route(warmed):
    import torch
    from dsv4_jit.engines import sglang_ops as o
    from dsv4_jit.kernels.mhc import reference as ref
    m, g = warmed, torch.Generator().manual_seed(2)
    for t in GPU_TOKENS:
        d = _mhc_inputs(m, t, g, "cuda")
        for post in (d["post"], d["post"].unsqueeze(-1)):              # SGLang passes [T, hc] and [T, hc, 1]
            got = o.route_mhc_post(d["x"], d["residual"], post, d["comb"])
            want = ref.ref_mhc_post(d["x"], d["residual"], d["post"], d["comb"], torch.float64)
            assert got.shape == d["residual"].shape and got.dtype == torch.bfloat16
            assert _rel(got, want) <= TOL, (t, _rel(got, want))


@pytest.mark.gpu
def test_gpu_mhc_fused_post_pre_route(warmed):
    """SGLang's mhc_fused_post_pre contract: residual_cur = mhc_post(...), then mhc_pre(residual_cur) with the norm
    (both of dsv4-jit's paths: fused at <= 32 tokens, post + pre above)."""
    import torch
    from dsv4_jit.engines import sglang_ops as o
    from dsv4_jit.kernels.mhc import reference as ref
    m, g = warmed, torch.Generator().manual_seed(3)
    for t in GPU_TOKENS:
        d = _mhc_inputs(m, t, g, "cuda")
        got = o.route_mhc_fused_post_pre(d["x"], d["residual"], d["post"].unsqueeze(-1), d["comb"], d["fn"],
                                         d["hc_scale"], d["hc_base"], m.rms_norm_eps, m.hc_eps, m.hc_eps, 2.0,
                                         m.hc_sinkhorn_iters, norm_weight=d["norm_weight"], norm_eps=m.rms_norm_eps)
        res_cur = ref.ref_mhc_post(d["x"], d["residual"], d["post"], d["comb"], torch.float32).to(torch.bfloat16)
        want = (res_cur, *_sglang_pre_reference(m, d, res_cur, True))
        for name, a, b in zip(("residual_cur", "post_mix", "comb", "layer_input"), got, want):
            assert a.shape == b.shape, (t, name)
            assert _rel(a, b) <= TOL, (t, name, _rel(a, b))
    empty = o.route_mhc_fused_post_pre(d["x"][:0], d["residual"][:0], d["post"][:0], d["comb"][:0], d["fn"],
                                       d["hc_scale"], d["hc_base"], m.rms_norm_eps, m.hc_eps, m.hc_eps, 2.0,
                                       m.hc_sinkhorn_iters, norm_weight=d["norm_weight"], norm_eps=m.rms_norm_eps)
    assert [tuple(e.shape) for e in empty] == [(0, m.hc_mult, m.hidden_size), (0, m.hc_mult, 1),
                                               (0, m.hc_mult, m.hc_mult), (0, m.hidden_size)]


@pytest.mark.gpu
def test_gpu_hc_split_sinkhorn_route(warmed):
    """SGLang's hc_split_sinkhorn_kernel: pre = sigmoid(.) + eps, post = 2 * sigmoid(.), comb = row softmax + eps,
    column-normalised, then (iters - 1) x row/column normalisation, each over (sum + eps)."""
    import torch
    from dsv4_jit.engines import sglang_ops as o
    from dsv4_jit.kernels.mhc import reference as ref
    m, g = warmed, torch.Generator().manual_seed(4)
    for t in GPU_TOKENS:
        mixes = (torch.randn(t, 1, m.mix_width, generator=g) * 3).cuda()
        scale, base = (torch.rand(3, generator=g) + 0.5).cuda(), (torch.randn(m.mix_width, generator=g) * 0.5).cuda()
        got = o.route_hc_split_sinkhorn(mixes, scale, base, m.hc_mult, m.hc_sinkhorn_iters, m.hc_eps)
        want = ref.ref_sinkhorn(mixes.view(t, -1), scale, base, m.hc_eps, m.hc_sinkhorn_iters, 2.0)
        for name, a, b in zip(("pre", "post", "comb"), got, want):
            assert a.shape == (t, 1, *b.shape[1:]), (t, name)
            assert _rel(a.view(b.shape), b) <= TOL, (t, name)


@pytest.mark.gpu
def test_gpu_fp8_paged_mqa_logits_route(warmed):
    """SGLang's contract (fp8_paged_mqa_logits_torch, its own torch version of the TileLang kernel): logits[b, j] =
    k_scale[j] * sum_h weight[b, h] * relu(q[b, h] . k[j]) for j < seq_lens[b] (compressed positions through
    page_table's 64-position pages); nothing past a row's length is read."""
    import torch
    from dsv4_jit.engines import sglang_ops as o
    g = torch.Generator().manual_seed(5)
    heads, dim, page = warmed.index_n_heads, 128, 64
    for batch in (1, 7, 33, 256):
        max_pages = 9
        lens = torch.randint(1, max_pages * page + 1, (batch,), generator=g)
        lens[0] = max_pages * page
        pool = int(sum(-(-int(n) // page) for n in lens)) + 3
        k = torch.randn(pool, page, dim, generator=g)
        k_scale = k.abs().amax(-1) / 448.0
        k8 = (k / k_scale[..., None]).to(torch.float8_e4m3fn)
        cache = torch.empty(pool, page * (dim + 4), dtype=torch.uint8)
        cache[:, :page * dim] = k8.view(torch.uint8).reshape(pool, page * dim)
        cache[:, page * dim:] = k_scale.contiguous().view(torch.uint8).reshape(pool, page * 4)
        perm = torch.randperm(pool, generator=g)
        table = torch.zeros(batch, max_pages, dtype=torch.int32)
        at = 0
        for b, n in enumerate(lens.tolist()):
            need = -(-n // page)
            table[b, :need] = perm[at:at + need].to(torch.int32)
            at += need
        q = (torch.randn(batch, 1, heads, dim, generator=g) * 0.5).to(torch.float8_e4m3fn)
        w = torch.randn(batch, heads, generator=g).abs() * 0.1
        width = max_pages * page
        got = o.route_fp8_paged_mqa_logits(q.cuda(), cache.cuda().view(pool, page, 1, dim + 4), w.cuda(),
                                           lens.to(torch.int32).cuda(), table.cuda(), None, width, False)
        assert got.shape == (batch, width) and got.dtype == torch.float32
        kf = (k8.double() * k_scale.double()[..., None])                            # [pool, page, dim]
        for b, n in enumerate(lens.tolist()):
            rows = kf[table[b, :-(-n // page)].long()].reshape(-1, dim)[:n]      # [n, dim] in position order
            want = (torch.relu(rows @ q[b, 0].double().t()) * w[b].double()).sum(-1)
            err = (got[b, :n].double().cpu() - want).norm() / want.norm().clamp_min(1e-12)
            assert err <= TOL, (batch, b, float(err))
