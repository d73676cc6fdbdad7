"""The vLLM plugin and the SGLang hook on CPU: no vLLM or SGLang in this environment.

* import without vllm, the off switch, the version pin, the one log line;
* the post-import hook on a fake vllm package tree (subprocess): the DeepSeek V4 modules' mHC names are
  rebound, the worker's load_model / kernel_warmup wrapped;
* plan-from-config (vLLM VllmConfig stand-in, SGLang ServerArgs stand-in) == the CLI's plan;
* the adapters' argument conversion with CPU tensors (views, fallbacks, the fuse statics);
* vLLM's real signatures and call sites, read with `ast` from the vLLM 0.33.0 wheel (skipped without it);
* vLLM's own `VllmConfig._set_cudagraph_sizes` vs warmup/vllm.py for a table of configs, run in an
  interpreter where vllm.config imports (DSV4_JIT_VLLM_PYTHON; skipped without one).
"""
from __future__ import annotations

import ast
import glob
import inspect
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_WHEEL = os.environ.get("DSV4_JIT_VLLM_WHEEL") or next(
    iter(sorted(glob.glob("/tmp/vllm_wheel/vllm-0.33.*.whl"))), None)


def _py(code: str, env=None, cwd=None) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd) if cwd else None, e.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=e, cwd=cwd or REPO, timeout=240)


@pytest.fixture
def plugin():
    from dsv4_jit.engines import vllm_plugin as p
    saved = dict(p.STATE)
    finders = list(sys.meta_path)
    p.STATE.update(registered=False, routed={}, refused=None, warmup=None, sealed=None)
    yield p
    sys.meta_path[:] = finders
    p.STATE.clear()
    p.STATE.update(saved)


# ---- import, switch, pin ---------------------------------------------------------------------------------

def test_imports_without_vllm():
    r = _py("""
        import sys
        import dsv4_jit.engines.vllm_plugin, dsv4_jit.engines.vllm_mhc, dsv4_jit.engines.sglang_hook
        import dsv4_jit.engines.sglang
        bad = [m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', 'sglang'))]
        assert not bad, bad
        print('ok')
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_entry_point_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]' in text
    assert 'dsv4_jit = "dsv4_jit.engines.vllm_plugin:register"' in text
    assert 'vllm = ["vllm>=0.33.0,<0.34"]' in text
    assert '"dsv4_jit.engines"' in text


@pytest.mark.parametrize("value", ["0", "off", "false", "OFF"])
def test_off_switch(plugin, value, caplog):
    n = len(sys.meta_path)
    with caplog.at_level(logging.INFO, logger="dsv4_jit.vllm"):
        assert plugin.register(env={"DSV4_JIT_VLLM_PLUGIN": value}, vllm_version="0.33.0") is False
    assert len(sys.meta_path) == n and not plugin.STATE["registered"]
    assert "plugin off" in caplog.text


@pytest.mark.parametrize("ver", ["0.32.0", "0.32.9", "0.34.0", "0.34.1rc1", "1.0.0", None])
def test_version_pin_refuses(plugin, ver, caplog, monkeypatch):
    monkeypatch.setattr(plugin, "installed_vllm_version", lambda: None)
    n = len(sys.meta_path)
    with caplog.at_level(logging.ERROR, logger="dsv4_jit.vllm"):
        assert plugin.register(env={}, vllm_version=ver) is False
    assert len(sys.meta_path) == n and not plugin.STATE["registered"]
    assert "outside the supported range >=0.33.0,<0.34" in caplog.text and "vLLM runs unchanged" in caplog.text
    with pytest.raises(plugin.VersionRefused, match="outside the supported range"):
        plugin.register(env={"DSV4_JIT_VLLM_PLUGIN": "require"}, vllm_version=ver)


@pytest.mark.parametrize("ver", ["0.33.0", "0.33.1", "0.33.0+cu130", "0.33.2.dev3"])
def test_version_pin_accepts(plugin, ver):
    assert plugin.register(env={}, vllm_version=ver) is True
    assert any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path)
    assert plugin.register(env={}, vllm_version=ver) is True          # idempotent
    assert sum(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path) == 1


def test_bad_seal_env_fails_at_start(plugin):
    with pytest.raises(ValueError, match="DSV4_JIT_SEAL"):
        plugin.register(env={"DSV4_JIT_SEAL": "loud"}, vllm_version="0.33.0")
    assert plugin.seal_mode({}) == "warn" and plugin.seal_mode({"DSV4_JIT_SEAL": "error"}) == "error"


# ---- the hooks on a fake vllm tree ------------------------------------------------------------------------

_FAKE_TILELANG_NAMES = ("hc_head_fused_kernel_tilelang", "mhc_fused_post_pre_tilelang", "mhc_post_tilelang",
                        "mhc_pre_broadcast_tilelang", "mhc_pre_tilelang")


def _fake_vllm(root: Path) -> None:
    for d in ("vllm/models/deepseek_v4/nvidia", "vllm/v1/worker", "vllm/model_executor/kernels/mhc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for d in ("vllm", "vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/nvidia", "vllm/v1",
              "vllm/v1/worker", "vllm/model_executor", "vllm/model_executor/kernels",
              "vllm/model_executor/kernels/mhc"):
        (root / d / "__init__.py").write_text("")
    (root / "vllm/model_executor/kernels/mhc/tilelang.py").write_text(
        "".join(f"def {n}(*a, **k):\n    return 'vllm:{n}'\n" for n in _FAKE_TILELANG_NAMES))
    imp = "from vllm.model_executor.kernels.mhc.tilelang import ({})\n"
    (root / "vllm/models/deepseek_v4/nvidia/model.py").write_text(imp.format(", ".join(_FAKE_TILELANG_NAMES)))
    for m in ("mtp", "dspark"):
        (root / f"vllm/models/deepseek_v4/nvidia/{m}.py").write_text(
            imp.format("hc_head_fused_kernel_tilelang, mhc_post_tilelang"))
    (root / "vllm/v1/worker/gpu_worker.py").write_text(textwrap.dedent("""
        CALLS = []
        def kernel_warmup(worker):
            CALLS.append('kernel_warmup')
        class Worker:
            vllm_config = None
            def load_model(self, *, load_dummy_weights=False):
                CALLS.append('load_model')
            def compile(self):
                kernel_warmup(self)
                CALLS.append('capture_model')
    """))


def test_post_import_hook_routes_dsv4_modules_only(tmp_path):
    _fake_vllm(tmp_path)
    r = _py("""
        import logging, sys
        from dsv4_jit.engines import vllm_plugin as p, vllm_mhc as m
        calls = []
        p.warm_worker = lambda w: calls.append('warm') or p.STATE.update(warmup={})
        p.seal_worker = lambda w: calls.append('seal')
        assert p.register(env={}, vllm_version='0.33.0')
        import vllm.model_executor.kernels.mhc.tilelang as tl
        import vllm.models.deepseek_v4.nvidia.model as model, vllm.models.deepseek_v4.nvidia.mtp as mtp
        import vllm.models.deepseek_v4.nvidia.dspark as dspark
        for name in p.PATCH_TARGETS['vllm.models.deepseek_v4.nvidia.model']:
            assert getattr(model, name) is m.ROUTES[name], name
            assert getattr(tl, name)() == 'vllm:' + name          # vLLM's own module is untouched
            assert m._ORIGINALS[name] is getattr(tl, name)
        assert mtp.mhc_post_tilelang is m.route_mhc_post and dspark.hc_head_fused_kernel_tilelang is m.route_hc_head
        import vllm.v1.worker.gpu_worker as gw
        w = gw.Worker(); w.load_model(); w.compile()
        assert gw.CALLS == ['load_model', 'kernel_warmup', 'capture_model'], gw.CALLS
        assert calls == ['warm', 'seal'], calls
        line = p.routed_line()
        assert 'mhc_pre_tilelang' in line and 'attention/indexer stay' in line, line
        print(line)
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "routed vLLM mHC calls hc_head_fused_kernel_tilelang, mhc_fused_post_pre_tilelang" in r.stdout


def test_already_imported_modules_are_routed(plugin):
    from dsv4_jit.engines import vllm_mhc
    name = "vllm.models.deepseek_v4.nvidia.mtp"
    mod = types.ModuleType(name)
    mod.hc_head_fused_kernel_tilelang = lambda *a: "orig-head"
    mod.mhc_post_tilelang = lambda *a: "orig-post"
    sys.modules[name] = mod
    saved = dict(vllm_mhc._ORIGINALS)
    try:
        assert plugin.register(env={}, vllm_version="0.33.0")
        assert mod.mhc_post_tilelang is vllm_mhc.route_mhc_post
        assert plugin.STATE["routed"][name] == ["hc_head_fused_kernel_tilelang", "mhc_post_tilelang"]
        assert plugin.route_module(mod) == []                      # twice: nothing more
    finally:
        del sys.modules[name]
        vllm_mhc._ORIGINALS.clear()
        vllm_mhc._ORIGINALS.update(saved)


def test_non_dsv4_worker_is_left_alone(plugin):
    plugin.STATE["routed"] = {"vllm.models.deepseek_v4.nvidia.model": ["mhc_pre_tilelang"]}
    hf = types.SimpleNamespace(architectures=["LlamaForCausalLM"])
    w = types.SimpleNamespace(vllm_config=types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf)))
    assert plugin.warm_worker(w) is None and plugin.seal_worker(w) is None
    hf.architectures = ["DeepseekV4ForCausalLM"]
    assert plugin.is_dsv4(w.vllm_config)


# ---- plan from the live config == the CLI's plan ------------------------------------------------------------

def _flash_hf():
    d = json.loads((REPO / "dsv4_jit/model_configs/deepseek-v4-flash.json").read_text())
    return types.SimpleNamespace(to_dict=lambda: dict(d), architectures=["DeepseekV4ForCausalLM"])


def _vllm_config(seqs, mnbt, tp, k=0, sizes=None, max_cg=None, mode="FULL_AND_PIECEWISE"):
    spec = None if not k else types.SimpleNamespace(method="mtp", num_speculative_tokens=k, model=None,
                                                    parallel_drafting=False)
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=mnbt),
        compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max_cg,
                                                 cudagraph_mode=types.SimpleNamespace(name=mode), pass_config=None),
        speculative_config=spec, parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, data_parallel_size=1),
        model_config=types.SimpleNamespace(enforce_eager=False, hf_config=_flash_hf(), model="deepseek-ai/V4-Flash"),
        use_v2_model_runner=True)


def _cli_plan_keys(argv):
    from dsv4_jit.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(argv) == 0
    return set(json.loads(buf.getvalue())["keys"] if "keys" in json.loads(buf.getvalue())
               else [v["key"] for v in json.loads(buf.getvalue())["variants"]])


@pytest.mark.parametrize("seqs,mnbt,tp,k", [(64, 2048, 1, 0), (256, 8192, 2, 1), (8, 512, 4, 3)])
def test_vllm_plan_from_config_matches_cli(plugin, seqs, mnbt, tp, k):
    cfg = _vllm_config(seqs, mnbt, tp, k)
    plan = plugin.plan_from_vllm_config(cfg, arch="sm_90a")
    vargs = f"--max-num-seqs {seqs} --max-num-batched-tokens {mnbt} -tp {tp}"
    if k:
        vargs += f" --speculative-config {json.dumps(json.dumps({'method': 'mtp', 'num_speculative_tokens': k}))}"
    keys = _cli_plan_keys(["plan", "--model", "deepseek-v4-flash", "--arch", "sm_90a", "--family", "mhc", "--json",
                           "--vllm-args", vargs])
    assert {v.key for v in plan.variants} == keys
    assert plan.shapes.max_num_tokens == mnbt and plan.shapes.tp_size == tp and plan.shapes.spec_tokens == k


def test_vllm_plan_takes_the_live_capture_sizes(plugin):
    """A live config already holds vLLM's resolved sizes: they are used as given."""
    cfg = _vllm_config(64, 2048, 1, sizes=[1, 2, 4, 8, 16, 24, 32], max_cg=32)
    plan = plugin.plan_from_vllm_config(cfg, arch="sm_90a")
    assert plan.shapes.settings["config_capture_sizes"] == [1, 2, 4, 8, 16, 24, 32]


def test_sglang_plan_from_server_args_matches_cli():
    from dsv4_jit.engines.sglang import plan_from_server_args
    sa = types.SimpleNamespace(model_path="deepseek-v4-flash", cuda_graph_max_bs_decode=64, chunked_prefill_size=4096,
                               tp_size=4, speculative_algorithm="EAGLE", speculative_num_steps=2,
                               speculative_eagle_topk=1, speculative_num_draft_tokens=3, max_running_requests=128,
                               cuda_graph_bs_decode=None, disable_cuda_graph=False)
    plan = plan_from_server_args(sa, arch="sm_90a")
    keys = _cli_plan_keys(["plan", "--model", "deepseek-v4-flash", "--arch", "sm_90a", "--family", "mhc", "--json",
                           "--sglang-args", "--cuda-graph-max-bs-decode 64 --chunked-prefill-size 4096 --tp-size 4 "
                           "--speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 1 "
                           "--speculative-num-draft-tokens 3 --max-running-requests 128"])
    assert {v.key for v in plan.variants} == keys
    assert plan.shapes.tokens_per_seq == 3 and plan.shapes.tp_size == 4


def test_sglang_warmup_from_server_args_shards_and_seals(monkeypatch):
    import dsv4_jit
    from dsv4_jit.engines import sglang_hook
    seen = {}

    def fake_warmup(plan, **kw):
        seen.update(kw, n=plan.compiles)
        return {"compiled": 0, "failures": [], "loaded": plan.compiles}
    monkeypatch.setattr(dsv4_jit, "warm", fake_warmup)
    monkeypatch.setenv("DSV4_JIT_SEAL", "error")
    sa = types.SimpleNamespace(model_path="deepseek-v4-flash", tp_size=2, cuda_graph_max_bs_decode=16)
    rep = sglang_hook.warmup_from_server_args(sa, 1, arch="sm_120a")
    assert seen["rank"] == 1 and seen["world_size"] == 2 and seen["seal_mode"] == "error" and not seen["use_dist"]
    assert rep["variants"] == seen["n"] > 0


# ---- the adapters' conversions (CPU tensors) ----------------------------------------------------------------

def _t(*shape, dtype=None):
    import torch
    return torch.zeros(*shape, dtype=dtype or torch.float32)


def test_pre_conversion_is_views():
    import torch
    from dsv4_jit.engines import vllm_mhc as m
    hc, h = 4, 256
    res = _t(2, 3, hc, h, dtype=torch.bfloat16)                    # leading dims (..., hc, H)
    nw = _t(h, dtype=torch.bfloat16)
    args, kw, outer = m.pre_args(res, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, 1e-6, 2.0, 20, 1, nw, 1e-5)
    assert args[0].shape == (6, hc, h) and args[0].data_ptr() == res.data_ptr() and outer == (2, 3)
    assert kw == {"rms_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0, "norm_weight": nw,
                  "norm_eps": 1e-5}
    li, post, comb = _t(6, h, dtype=torch.bfloat16), _t(6, hc), _t(6, hc, hc)
    p, c, y = m.pre_result(outer, li, post, comb)
    assert p.shape == (2, 3, hc, 1) and c.shape == (2, 3, hc, hc) and y.shape == (2, 3, h)
    assert p.data_ptr() == post.data_ptr() and y.data_ptr() == li.data_ptr()
    _, kw2, _ = m.pre_args(res, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, 1e-6, 2.0, 20)
    assert kw2["norm_weight"] is None and kw2["norm_eps"] is None


@pytest.mark.parametrize("bad", ["eps", "norm_dtype", "noncontig"])
def test_pre_unsupported_falls_back_to_vllm(bad):
    import torch
    from dsv4_jit.engines import vllm_mhc as m
    hc, h = 4, 256
    res = _t(5, hc, h, dtype=torch.bfloat16)
    nw = _t(h, dtype=torch.bfloat16)
    eps2 = 1e-6
    if bad == "eps":
        eps2 = 1e-5
    elif bad == "norm_dtype":
        nw = _t(h)
    else:
        res = _t(hc, 5, h, dtype=torch.bfloat16).transpose(0, 1)
    got = []
    saved = dict(m._ORIGINALS)
    m._ORIGINALS["mhc_pre_tilelang"] = lambda *a: got.append(a) or "vllm"
    try:
        before = sum(m.FALLBACKS.values())
        assert m.route_mhc_pre(res, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, eps2, 2.0, 20, 1, nw, 1e-6) == "vllm"
        assert len(got[0]) == 12 and got[0][0] is res and sum(m.FALLBACKS.values()) == before + 1
    finally:
        m._ORIGINALS.clear()
        m._ORIGINALS.update(saved)


def test_broadcast_conversion():
    import torch
    from dsv4_jit.engines import vllm_mhc as m
    hc, h, t = 4, 256, 3
    x = torch.randn(t, h).to(torch.bfloat16)
    nw = _t(h, dtype=torch.bfloat16)
    args, kw, got_hc = m.pre_broadcast_args(x, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, 1e-6, 2.0, 20, 1, nw, 1e-6,
                                            _t(24, h))
    assert got_hc == hc and args[0] is x and kw["norm_weight"] is nw
    r, p, c, y = m.pre_broadcast_result(x, hc, _t(t, h, dtype=torch.bfloat16), _t(t, hc), _t(t, hc, hc))
    assert r.shape == (t, hc, h) and r.is_contiguous() and torch.equal(r[:, 2], x)
    assert p.shape == (t, hc, 1) and c.shape == (t, hc, hc) and y.shape == (t, h)
    with pytest.raises(m.Unsupported):
        m.pre_broadcast_args(x, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, 1e-6, 2.0, 20)   # vLLM asserts norm


@pytest.mark.parametrize("post_shape", ["hc1", "hc"])
def test_post_and_fused_conversion(post_shape):
    import torch
    from dsv4_jit.engines import vllm_mhc as m
    hc, h = 4, 256
    x, res = _t(2, 3, h, dtype=torch.bfloat16), _t(2, 3, hc, h, dtype=torch.bfloat16)
    post = _t(2, 3, hc, 1) if post_shape == "hc1" else _t(2, 3, hc)
    comb = _t(2, 3, hc, hc)
    (xa, ra, pa, ca), shape = m.post_args(x, res, post, comb)
    assert (xa.shape, ra.shape, pa.shape, ca.shape) == ((6, h), (6, hc, h), (6, hc), (6, hc, hc))
    assert all(a.data_ptr() == b.data_ptr() for a, b in ((xa, x), (ra, res), (pa, post), (ca, comb)))
    assert shape == (2, 3, hc, h)
    nw = _t(h, dtype=torch.bfloat16)
    pargs, kw, shape = m.fused_args(x, res, post, comb, _t(24, hc * h), _t(3), _t(24), 1e-6, 1e-6, 1e-6, 2.0, 20,
                                    n_splits=1, tile_n=1, norm_weight=nw, norm_eps=1e-6)
    out = m.fused_result(shape, _t(6, hc, h, dtype=torch.bfloat16), _t(6, h, dtype=torch.bfloat16), _t(6, hc),
                         _t(6, hc, hc))
    assert [tuple(o.shape) for o in out] == [(2, 3, hc, h), (2, 3, hc, 1), (2, 3, hc, hc), (2, 3, h)]


def test_fused_fuse_statics_are_the_planned_ones():
    """The fused path's big fuse must select a variant the planner warmed (no compile after seal)."""
    from dsv4_jit.engines import vllm_mhc as m
    from dsv4_jit.family import all_families, family_uses
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    model = load_model_config("deepseek-v4-flash")
    planned = [u.static for u in family_uses([all_families()["mhc"]], model, ParallelConfig())
               if u.spec.name == "mhc_pre_fuse"]
    import torch
    nw = _t(model.hidden_size, dtype=torch.bfloat16)
    for norm in (nw, None):
        kw = m._common_kw(model.rms_norm_eps, model.hc_eps, model.hc_eps, model.hc_post_mult, model.hc_sinkhorn_iters,
                          norm, model.rms_norm_eps)
        assert m.fuse_static(kw, model.hidden_size, model.hc_mult) in planned


def test_head_conversion():
    import torch
    from dsv4_jit.engines import vllm_mhc as m
    hs = _t(7, 4, 256, dtype=torch.bfloat16)
    args, kw = m.head_args(hs, _t(4, 1024), _t(1), _t(4), 1e-6, 1e-6)
    assert args[0] is hs and kw == {"rms_eps": 1e-6, "hc_eps": 1e-6}
    with pytest.raises(m.Unsupported):
        m.head_args(_t(7, 1024, dtype=torch.bfloat16), _t(4, 1024), _t(1), _t(4), 1e-6, 1e-6)


# ---- vLLM 0.33.0's real signatures and call sites (ast, from the wheel) -----------------------------------

def _wheel_source(path: str) -> str:
    if not VLLM_WHEEL or not os.path.exists(VLLM_WHEEL):
        pytest.skip("vLLM 0.33.0 wheel not found (set DSV4_JIT_VLLM_WHEEL=/path/vllm-0.33.0-*.whl; "
                    "`pip download vllm==0.33.0 --no-deps`)")
    with zipfile.ZipFile(VLLM_WHEEL) as z:
        return z.read(path).decode()


def _ast_params(fn: ast.FunctionDef) -> list[tuple[str, str | None]]:
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = list(zip([p.arg for p in pos], defaults))
    out += [(p.arg, None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out


def _our_params(fn) -> list[tuple[str, str | None]]:
    return [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in inspect.signature(fn).parameters.values()]


def test_routes_match_vllm_signatures():
    from dsv4_jit.engines import vllm_mhc as m
    tree = ast.parse(_wheel_source("vllm/model_executor/kernels/mhc/tilelang.py"))
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name, route in m.ROUTES.items():
        assert name in fns, name
        assert _our_params(route) == _ast_params(fns[name]), name


def test_vllm_call_sites_bind_to_routes():
    """Every call vLLM's DeepSeek V4 NVIDIA modules make to a routed name binds to our signature, and those
    modules import exactly the names the plugin rebinds, from vllm.model_executor.kernels.mhc.tilelang."""
    from dsv4_jit.engines import vllm_mhc as m
    from dsv4_jit.engines.vllm_plugin import PATCH_TARGETS
    n_calls = 0
    for mod, names in PATCH_TARGETS.items():
        tree = ast.parse(_wheel_source(mod.replace(".", "/") + ".py"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == "vllm.model_executor.kernels.mhc.tilelang" for a in n.names}
        if ".deepseek_v41." in mod:                  # V4.1: V4's op routed, the rest named as not routed
            from dsv4_jit.engines.vllm_plugin import DSV41_NOT_ROUTED
            assert set(names) == imported & set(m.ROUTES) == {"mhc_post_tilelang"}, (mod, imported)
            assert imported - set(names) <= set(DSV41_NOT_ROUTED), (mod, imported)
        else:
            assert imported == set(names), (mod, imported)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in m.ROUTES:
                sig = inspect.signature(m.ROUTES[node.func.id])
                sig.bind(*[object()] * len(node.args), **{k.arg: object() for k in node.keywords})
                n_calls += 1
    assert n_calls >= 10


def test_vllm_worker_hook_points_exist():
    src = _wheel_source("vllm/v1/worker/gpu_worker.py")
    tree = ast.parse(src)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "vllm.model_executor.warmup.kernel_warmup"
               and any(a.name == "kernel_warmup" for a in n.names) for n in tree.body)
    worker = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker")
    meths = {n.name: n for n in worker.body if isinstance(n, ast.FunctionDef)}
    assert "load_model" in meths
    body = ast.unparse(meths["_compile_or_warm_up_model"])
    assert body.index("kernel_warmup(self)") < body.index("capture_model()")


# ---- vLLM's own capture sizes vs warmup/vllm.py ----------------------------------------------------------

_VLLM_TABLE = [  # (max_num_seqs, max_num_batched_tokens, k, sizes, max_cg, performance_mode)
    (256, 8192, 0, None, None, "balanced"), (1024, 8192, 0, None, None, "balanced"),
    (8, 2048, 0, None, None, "balanced"), (3, 64, 0, None, None, "balanced"),
    (128, 200, 0, None, None, "balanced"), (64, 2048, 0, None, None, "interactivity"),
    (256, 8192, 1, None, None, "balanced"), (512, 16384, 3, None, None, "balanced"),
    (100, 4096, 2, None, None, "balanced"), (256, 8192, 0, [1, 2, 4, 8, 9000], None, "balanced"),
    (256, 8192, 0, None, 128, "balanced"), (32, 8192, 1, None, 100, "balanced"),
]

_PROBE = """
import json, sys, types
from vllm.config import CompilationConfig, SchedulerConfig, VllmConfig
out = []
for seqs, mnbt, k, sizes, max_cg, perf in json.loads(sys.argv[1]):
    sc = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=mnbt,
                         is_encoder_decoder=False)
    kw = {k: v for k, v in (("cudagraph_capture_sizes", sizes), ("max_cudagraph_capture_size", max_cg)) if v}
    cc = CompilationConfig(cudagraph_mode="FULL_AND_PIECEWISE", **kw)
    spec = None if not k else types.SimpleNamespace(num_speculative_tokens=k,
                                                    uses_dynamic_speculative_decoding=lambda: False)
    # VllmConfig needs a ModelConfig (a HF download) to construct; its _set_cudagraph_sizes reads only these.
    stub = types.SimpleNamespace(model_config=types.SimpleNamespace(enforce_eager=False), compilation_config=cc,
                                 scheduler_config=sc, speculative_config=spec, performance_mode=perf,
                                 uniform_decode_query_len=1 + k, num_speculative_tokens=k)
    VllmConfig._set_cudagraph_sizes(stub)
    out.append([list(cc.cudagraph_capture_sizes), cc.max_cudagraph_capture_size])
print("RESULT" + json.dumps(out))
"""


def _vllm_python() -> str:
    cands = [os.environ.get("DSV4_JIT_VLLM_PYTHON"), "/tmp/vllm_venv/bin/python"]
    why = []
    for c in [c for c in cands if c]:
        if not os.path.exists(c):
            why.append(f"{c}: no such interpreter")
            continue
        r = subprocess.run([c, "-c", "import vllm.config, vllm; print(vllm.__version__)"], capture_output=True,
                           text=True, timeout=300, cwd="/")      # not the repo: its kernels/ shadows vllm's
        if r.returncode == 0 and r.stdout.strip().startswith("0.33."):
            return c
        why.append(f"{c}: " + ((r.stderr.strip().splitlines() or ["?"])[-1] if r.returncode
                               else f"vllm {r.stdout.strip()} is not 0.33.x"))
    pytest.skip("no interpreter where vllm 0.33's config imports (" + "; ".join(why or ["none given"]) +
                "); set DSV4_JIT_VLLM_PYTHON, see docs/engine_developer.md")


def test_capture_sizes_match_vllm():
    from dsv4_jit.warmup.vllm import config_capture_sizes
    py = _vllm_python()
    r = subprocess.run([py, "-c", _PROBE, json.dumps(_VLLM_TABLE)], capture_output=True, text=True, timeout=300,
                       cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(r.stdout.split("RESULT", 1)[1])
    for (seqs, mnbt, k, sizes, max_cg, perf), (v_sizes, v_max) in zip(_VLLM_TABLE, theirs):
        ours, our_max, _ = config_capture_sizes(max_num_seqs=seqs, max_num_batched_tokens=mnbt, q=1 + k,
                                                cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max_cg,
                                                performance_mode=perf)
        assert (ours, our_max) == (v_sizes, v_max), (seqs, mnbt, k, sizes, max_cg, perf)


def test_engine_warm_entry_survives_the_warmup_subpackage_import():
    """The engine hooks import dsv4_jit.warmup.* (the planner) and then call dsv4_jit.warm; Python rebinds
    the package attribute `warmup` to the subpackage on that import, so the entry point must not be named so."""
    import inspect
    import dsv4_jit
    import dsv4_jit.warmup.planner  # noqa: F401
    from dsv4_jit.warmup.runner import warmup_in_engine
    assert inspect.isfunction(dsv4_jit.warm) and "warm" in dsv4_jit.__all__ and "warmup" not in dsv4_jit.__all__
    assert set(inspect.signature(dsv4_jit.warm).parameters) >= {"plan", "rank", "world_size", "seal_mode"}
    import ast, pathlib
    for mod in ("vllm_plugin", "sglang_hook"):
        src = (pathlib.Path(dsv4_jit.__file__).parent / "engines" / f"{mod}.py").read_text()
        calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)}
        assert "dsv4_jit.warm" in calls and "dsv4_jit.warmup" not in calls, mod
    assert warmup_in_engine is not None


def test_dsv41_is_planned_for_its_routed_op_only():
    """DeepSeek V4.1: the plugin routes mhc_post_tilelang (V4's op at V4.1's shapes, from the live HF config) and
    plans only the kernels that op launches; the log line names what stays on vLLM's kernels."""
    from dsv4_jit.engines import vllm_plugin as p
    cfg = _vllm_config(64, 2048, 1)
    cfg.model_config.hf_config = types.SimpleNamespace(architectures=["DeepseekV41ForCausalLM"])
    assert p.is_dsv4(cfg) and p.is_dsv41(cfg)
    plan = p.plan_from_vllm_config(cfg, model="deepseek-v4-flash", arch="sm_90a")
    assert plan.variants and {v.spec.name for v in plan.variants} == {"mhc_post"}
    cfg.model_config.hf_config.architectures = ["DeepseekV4ForCausalLM"]
    assert len({v.spec.name for v in p.plan_from_vllm_config(cfg, model="deepseek-v4-flash", arch="sm_90a").variants}) > 1
    saved = dict(p.STATE["routed"])
    try:
        p.STATE["routed"] = {"vllm.models.deepseek_v41.nvidia.model": ["mhc_post_tilelang"]}
        line = p.routed_line()
        assert "deepseek_v41.nvidia: model" in line and "mhc_pre_delayed_tilelang" in line and "stay on vLLM" in line
    finally:
        p.STATE["routed"] = saved


def _v41_config_dir(tmp_path, hidden: int = 5120):
    """A DeepSeek V4.1-shaped config.json: the text model nested under text_config (V4-Flash's numbers at another
    hidden size), a vision tower beside it."""
    import json
    from pathlib import Path
    import dsv4_jit
    flash = json.loads((Path(dsv4_jit.__file__).parent / "model_configs" / "deepseek-v4-flash.json").read_text())
    cfg = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
           "text_config": {**flash, "model_type": "deepseek_v4", "hidden_size": hidden},
           "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_dsv41_config_json_plans_what_the_plugin_plans(tmp_path):
    """`--model` reads a V4.1 config.json (text_config flattened as vLLM 0.33's DeepseekV41Config does) and plans what
    the plugin plans for it: only mhc_post at V4.1's shapes, with a note naming what stays on the engine's kernels."""
    from dsv4_jit.engines import vllm_plugin as p
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.warmup.engines import vllm_shapes
    from dsv4_jit.warmup.planner import build_plan
    m = load_model_config(_v41_config_dir(tmp_path))
    assert m.generation == "v4.1" and m.hidden_size == 5120
    plan = build_plan(m, vllm_shapes(), ["sm_90a"], key_fn=lambda s, v: v.name)
    assert plan.variants and {v.spec.name for v in plan.variants} == {"mhc_post"}
    assert all(dict(v.variant.params)["hidden"] == 5120 for v in plan.variants)
    assert any(n.startswith("DeepSeek V4.1: only mhc_post") and "attention" in n for n in plan.notes)
    cfg = _vllm_config(512, 8192, 1)
    cfg.model_config.hf_config = types.SimpleNamespace(architectures=["DeepseekV41ForCausalLM"])
    plugin = p.plan_from_vllm_config(cfg, model=m, arch="sm_90a")
    assert {v.name for v in plugin.variants} == {v.name for v in plan.variants}
    v4 = load_model_config("deepseek-v4-flash")
    assert v4.generation == "v4" and len({v.spec.name for v in build_plan(
        v4, vllm_shapes(), ["sm_90a"], key_fn=lambda s, v: v.name).variants}) > 1
