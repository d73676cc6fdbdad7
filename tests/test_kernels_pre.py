"""mHC pre family: select/statics contract, torch references, cross-compiles, and GPU parity.

CPU: reference vs a literal transcription of the math; select purity/bounds/errors.
gpu (-m gpu): the norm_fn partials against float64, and the op's validation on the hot path.
Cross-compiles and the op-level GPU correctness of every model and flag come from the family registry
(tests/test_families.py, cases in kernels/mhc/family.py).
"""
import math

import pytest
import torch

from dsv4_jit.arch import get_profile
from dsv4_jit.family import DEFAULT_GPU_TOKENS
from dsv4_jit.model_config import load_model_config
from conftest import gpu_profile_params
from dsv4_jit.testing import profile_id, rel_err, serving_getter
from dsv4_jit.kernels.mhc import ops
from dsv4_jit.kernels.mhc import pre as mp
from dsv4_jit.kernels.mhc import reference as ref

MODELS = ("deepseek-v4-flash", "deepseek-v4-pro")
ARCHS = ("sm_120a", "sm_90a")
NF, FUSE, SK = mp.MhcPreNormFnSpec(), mp.MhcPreFuseSpec(), mp.MhcSinkhornSpec()


def _variants(spec, arch, static, max_tokens=16384):
    seen = {}
    for t in range(1, max_tokens + 1):
        v = spec.select(get_profile(arch), static, t)
        seen.setdefault(v, t)
    return seen


def _all_uses(model):
    """The (spec, static) pairs of this family that a forward pass launches (what the planner warms)."""
    from dsv4_jit.kernels import model_kernel_uses
    m = load_model_config(model)
    return [(u.spec, u.static) for u in model_kernel_uses(m) if u.spec.name in (NF.name, FUSE.name, SK.name)]


# ------------------------------------------------------------------------------------------- refs
def _literal_sinkhorn(c, iters, eps):
    hc = len(c)
    c = [row[:] for row in c]
    for i in range(hc):
        mx = max(c[i])
        e = [math.exp(v - mx) for v in c[i]]
        s = sum(e)
        c[i] = [v / s + eps for v in e]
    def col():
        for j in range(hc):
            s = sum(c[i][j] for i in range(hc)) + eps
            for i in range(hc):
                c[i][j] /= s
    def row():
        for i in range(hc):
            s = sum(c[i]) + eps
            c[i] = [v / s for v in c[i]]
    col()
    for _ in range(iters - 1):
        row()
        col()
    return c


def _literal_pre(X, fn, scale, base, rms_eps, hc_eps, iters, post_mult, w=None, norm_eps=None):
    """Per-token, per-element Python transcription of model.py Block.hc_pre (float64)."""
    T_, hc, H = X.shape
    outs = []
    for t in range(T_):
        xf = [float(v) for v in X[t].reshape(-1)]
        r = 1.0 / math.sqrt(sum(v * v for v in xf) / len(xf) + rms_eps)
        mix = [sum(xf[k] * float(fn[j, k]) for k in range(len(xf))) * r for j in range(fn.shape[0])]
        sig = lambda v: 1.0 / (1.0 + math.exp(-v))
        pre = [sig(mix[i] * float(scale[0]) + float(base[i])) + hc_eps for i in range(hc)]
        post = [post_mult * sig(mix[hc + i] * float(scale[1]) + float(base[hc + i])) for i in range(hc)]
        c = [[mix[2 * hc + i * hc + j] * float(scale[2]) + float(base[2 * hc + i * hc + j]) for j in range(hc)]
             for i in range(hc)]
        comb = _literal_sinkhorn(c, iters, hc_eps)
        y = [sum(pre[i] * float(X[t, i, h]) for i in range(hc)) for h in range(H)]
        if w is not None:
            rn = 1.0 / math.sqrt(sum(v * v for v in y) / H + norm_eps)
            y = [y[h] * rn * float(w[h]) for h in range(H)]
        outs.append((y, post, comb))
    return outs


def _rand_pre(T_, hc, H, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(T_, hc, H, generator=g).to(torch.bfloat16)
    M = (2 + hc) * hc
    fn = torch.randn(M, hc * H, generator=g) * 0.05
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(M, generator=g) * 0.5
    w = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16)
    return X, fn, scale, base, w


@pytest.mark.parametrize("with_norm", [False, True])
def test_ref_mhc_pre_matches_literal(with_norm):
    X, fn, scale, base, w = _rand_pre(3, 4, 16)
    got = ref.ref_mhc_pre(X, fn, scale, base, 1e-6, 1e-6, 20, 2.0,
                          norm_weight=w if with_norm else None, norm_eps=1e-5)
    lit = _literal_pre(X.double(), fn.double(), scale, base, 1e-6, 1e-6, 20, 2.0,
                       w=w.double() if with_norm else None, norm_eps=1e-5)
    for t, (y, post, comb) in enumerate(lit):
        torch.testing.assert_close(got[0][t], torch.tensor(y, dtype=torch.float64), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[1][t], torch.tensor(post, dtype=torch.float64), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[2][t], torch.tensor(comb, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_ref_broadcast_equals_expanded():
    X, fn, scale, base, w = _rand_pre(5, 4, 32, seed=1)
    x = X[:, 0]
    a = ref.ref_mhc_pre(x, fn, scale, base, 1e-6, 1e-6, 20, 2.0, norm_weight=w, broadcast=True)
    b = ref.ref_mhc_pre(x.unsqueeze(1).expand(-1, 4, -1).contiguous(), fn, scale, base, 1e-6, 1e-6, 20, 2.0,
                        norm_weight=w)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


def test_ref_sinkhorn_doubly_stochastic():
    g = torch.Generator().manual_seed(2)
    mixes = torch.randn(64, 24, generator=g)
    pre, post, comb = ref.ref_sinkhorn(mixes, torch.ones(3), torch.zeros(24), 1e-6, 20, 2.0)
    # ends on a column normalisation: columns sum to 1 (up to eps); rows approach 1 as iterations grow
    torch.testing.assert_close(comb.sum(-2), torch.ones(64, 4, dtype=torch.float64), atol=1e-5, rtol=0)
    row_err = (comb.sum(-1) - 1).abs().max()
    _, _, comb2 = ref.ref_sinkhorn(mixes, torch.ones(3), torch.zeros(24), 1e-6, 2, 2.0)
    assert row_err < 0.05 and row_err < (comb2.sum(-1) - 1).abs().max()
    assert (comb > 0).all()
    assert ((post > 0) & (post < 2)).all() and (pre > 1e-6).all()


def test_ref_sinkhorn_matches_literal():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 4, generator=g, dtype=torch.float64)
    got = ref.ref_sinkhorn_normalize(logits, 20, 1e-6)
    want = torch.tensor(_literal_sinkhorn(logits.tolist(), 20, 1e-6), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------------- select
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_select_bounded_pure(model, arch):
    for spec, static in _all_uses(model):
        vs = _variants(spec, arch, static)
        # norm_fn: the split ladder (4) plus, on Hopper, the small-T 32-token tile (see _NORM_FN_LARGE_T),
        # plus one split count seen on both sides of the PDL trigger boundary (_PDL_TRIGGER_BELOW)
        limit = 6 if spec.name == NF.name else 1
        assert 1 <= len(vs) <= limit, (spec.name, [v.name for v in vs])
        for v, t in vs.items():
            assert spec.select(get_profile(arch), dict(static), t) == v  # deterministic
            assert spec.smem_bytes(v) <= get_profile(arch).max_smem_per_block
            spec.check_fits(v)
            if spec.name == NF.name:
                p = v.p
                k = p["hc"] * p["hidden"]
                assert k % (p["n_splits"] * p["hidden_block"]) == 0
                assert k // (p["n_splits"] * p["hidden_block"]) >= 2


def test_select_split_buckets_monotone():
    m = load_model_config("deepseek-v4-flash")
    st = NF.statics_for(m)
    prev = None
    for t in (1, 32, 64, 256, 1024, 2048, 4096, 8192, 16384, 100000):
        s = NF.select(get_profile("sm_90a"), st, t).p["n_splits"]
        assert prev is None or s <= prev
        prev = s
    assert prev == 1


def test_select_errors():
    m = load_model_config("deepseek-v4-flash")
    st = NF.statics_for(m)
    p = get_profile("sm_120a")
    for bad_t in (0, -1, 1.5, "8", None):
        with pytest.raises(ValueError):
            NF.select(p, st, bad_t)
    with pytest.raises(ValueError):
        NF.select(p, dict(st, typo=1), 8)
    with pytest.raises(ValueError):
        NF.select(p, {k: v for k, v in st.items() if k != "hc"}, 8)
    with pytest.raises(ValueError):
        NF.select(p, dict(st, hc=8), 8)
    with pytest.raises(ValueError):
        NF.select(p, dict(st, hidden=1000), 8)
    with pytest.raises(ValueError):
        NF.select("sm_120a", st, 8)
    fst = FUSE.statics_for(m)
    with pytest.raises(ValueError):
        FUSE.select(p, dict(fst, with_norm=1), 8)
    with pytest.raises(ValueError):
        FUSE.select(p, dict(fst, rms_eps=float("nan")), 8)
    with pytest.raises(ValueError):
        SK.select(p, dict(SK.statics_for(m), iters=0), 8)


def test_statics_match_lead_uses():
    # model_kernel_uses() takes static_params() then sets the flags: same key sets as statics_for
    m = load_model_config("deepseek-v4-pro")
    assert set(NF.static_params(m, None)) == set(NF.statics_for(m, broadcast=True))
    assert set(FUSE.static_params(m, None)) == set(FUSE.statics_for(m, with_norm=True))
    assert FUSE.args_for(FUSE.select(get_profile("sm_90a"), FUSE.statics_for(m), 1)) == \
        ("mix_part", "sq_part", "residual", "hc_scale", "hc_base", "layer_input", "post", "comb")


def test_import_does_not_import_tilelang():
    import subprocess
    import sys
    code = "import sys, dsv4_jit.kernels.mhc.pre, dsv4_jit.kernels.mhc.ops, dsv4_jit.kernels.mhc.family; assert 'tilelang' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pdl_trigger_only_below_threshold():
    st = {"hidden": 4096, "hc": 4, "broadcast": False}
    for arch in ARCHS:
        prof = get_profile(arch)
        assert NF.select(prof, st, 1).p["pdl"] and NF.select(prof, st, mp._PDL_TRIGGER_BELOW - 1).p["pdl"]
        assert not NF.select(prof, st, mp._PDL_TRIGGER_BELOW).p["pdl"]
        assert FUSE.select(prof, FUSE.statics_for(load_model_config(MODELS[0])), 4096).p["pdl"]


def test_require_raises_precise_errors():
    from dsv4_jit.validate import require, require_1d, same_layout
    t = torch.zeros(2, 3)
    assert same_layout(t, (2, 3), torch.float32, t.device)
    assert not same_layout("x", (2, 3), torch.float32, t.device)
    require(t, "t", (2, 3), torch.float32, t.device)
    with pytest.raises(ValueError, match="t: expected dtype"):
        require(t.double(), "t", (2, 3), torch.float32, t.device)
    with pytest.raises(ValueError, match=r"t: expected shape \[2, 3\]"):
        require(torch.zeros(3, 2), "t", (2, 3), torch.float32, t.device)
    with pytest.raises(ValueError, match="contiguous"):
        require(torch.zeros(3, 2).t(), "t", (2, 3), torch.float32, t.device)
    with pytest.raises(ValueError, match="torch.Tensor"):
        require([1, 2], "t", (2,), torch.float32, t.device)
    require_1d(torch.zeros(7), "w", torch.float32, t.device)
    with pytest.raises(ValueError, match="w: expected shape"):
        require_1d(t, "w", torch.float32, t.device)


# -------------------------------------------------------------------------------------------- gpu
GPU_TOKENS = DEFAULT_GPU_TOKENS  # the family cases' token counts (tile, split and PDL edges)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _pre_inputs(T_, hc, H, broadcast, dev, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    M = (2 + hc) * hc
    shape = (T_, H) if broadcast else (T_, hc, H)
    X = torch.randn(*shape, generator=g).to(torch.bfloat16).to(dev)
    fn = (torch.randn(M, hc * H, generator=g) * (1.0 / math.sqrt(hc * H)) * 4).to(dev)
    scale = (torch.rand(3, generator=g) + 0.5).to(dev)
    base = (torch.randn(M, generator=g) * 0.5).to(dev)
    w = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16).to(dev)
    return X, fn, scale, base, w


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("schedule", gpu_profile_params())
@pytest.mark.parametrize("model", MODELS)
def test_gpu_norm_fn(schedule, model, gpu_store):
    """The GEMM partials alone (all split counts select returns), against float64."""
    m = load_model_config(model)
    H, hc = m.hidden_size, m.hc_mult
    used: set = set()
    get = serving_getter(schedule, gpu_store, used)
    dev = torch.device("cuda")
    worst = 0.0
    for i, T_ in enumerate(GPU_TOKENS):
        X, fn, *_ = _pre_inputs(T_, hc, H, False, dev, seed=2000 + i)
        st = NF.statics_for(m)
        s = NF.select(schedule, st, T_).p["n_splits"]
        mix_part = torch.full((s, T_, mp.mix_pad(hc)), float("nan"), device=dev)
        sq_part = torch.full((s, T_), float("nan"), device=dev)
        get(NF, st, T_)(X.view(T_, -1), fn, mix_part, sq_part)
        torch.cuda.synchronize()
        _, raw, sq = ref.ref_mhc_pre_mixes(X, fn, m.rms_norm_eps)
        assert torch.isfinite(mix_part).all() and torch.isfinite(sq_part).all()
        assert (mix_part[..., mp.mix_width(hc):] == 0).all()
        e = rel_err(mix_part.sum(0)[:, :mp.mix_width(hc)], raw)
        worst = max(worst, e)
        assert e < 2e-3, (T_, e)
        assert rel_err(sq_part.sum(0), sq) < 1e-5
    print(f"\n[{profile_id(schedule)} {model}] norm_fn worst rel err {worst:.2e}; {len(used)} variants")


@gpu
@pytest.mark.gpu
def test_gpu_op_validation(gpu_store):
    hopper = get_profile("sm_90a")
    get = serving_getter(hopper, gpu_store)
    dev = torch.device("cuda")
    X, fn, scale, base, w = _pre_inputs(4, 4, 4096, False, dev, seed=7)
    kw = dict(rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0, arch=hopper, get_kernel=get)
    with pytest.raises(ValueError):
        ops.mhc_pre(X.float(), fn, scale, base, **kw)
    with pytest.raises(ValueError):
        ops.mhc_pre(X, fn[:, :100].contiguous(), scale, base, **kw)
    with pytest.raises(ValueError):
        ops.mhc_pre(X, fn, scale, base, workspace=torch.empty(3, device=dev), **kw)
    with pytest.raises(ValueError):
        ops.mhc_pre(X.cpu(), fn, scale, base, **kw)


@gpu
@pytest.mark.gpu
def test_gpu_hot_path_still_validates(gpu_store):
    """After a good call has cached the launch plan for this signature, every argument is still
    checked on each call (the plan is keyed on shapes; dtype, device, contiguity are re-checked)."""
    hopper = get_profile("sm_90a")
    get = serving_getter(hopper, gpu_store)
    dev = torch.device("cuda")
    X, fn, scale, base, w = _pre_inputs(4, 4, 4096, False, dev, seed=8)
    kw = dict(rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0, arch=hopper, get_kernel=get)
    y, post, comb = ops.mhc_pre(X, fn, scale, base, norm_weight=w, **kw)
    y2, _, _ = ops.mhc_pre(X, fn, scale, base, norm_weight=w, **kw)  # plan hit
    torch.cuda.synchronize()
    assert torch.equal(y, y2)
    bad = [
        (dict(fn=fn.double()), "fn: expected dtype"),
        (dict(scale=scale[:2].contiguous()), "hc_scale: expected shape"),
        (dict(base=base.cpu()), "hc_base: expected device"),
        (dict(w=w.float()), "norm_weight: expected dtype"),
        (dict(X=X.transpose(0, 1).contiguous().transpose(0, 1)), "residual: must be contiguous"),
        (dict(out=(y, post, comb.transpose(1, 2))), r"out\[2\]"),
        (dict(out=(y.float(), post, comb)), r"out\[0\]"),
        (dict(workspace=torch.empty(10, device=dev)), "workspace: needs"),
    ]
    for change, msg in bad:
        a = dict(X=X, fn=fn, scale=scale, base=base, w=w)
        a.update({k: v for k, v in change.items() if k in a})
        extra = {k: v for k, v in change.items() if k not in a}
        with pytest.raises(ValueError, match=msg):
            ops.mhc_pre(a["X"], a["fn"], a["scale"], a["base"], norm_weight=a["w"], **extra, **kw)


@gpu
@pytest.mark.gpu
def test_gpu_pre_validates_before_loading():
    """A bad argument on the first call of a signature is a ValueError before any select/load/compile."""
    def never(*a, **k):
        raise AssertionError("get_kernel must not be reached")

    dev = torch.device("cuda")
    X, fn, scale, base, w = _pre_inputs(5, 4, 4096, False, dev, seed=9)
    kw = dict(rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0, arch=get_profile("sm_90a"),
              get_kernel=never)
    with pytest.raises(ValueError, match="hc_scale"):
        ops.mhc_pre(X, fn, scale.double(), base, **kw)
    with pytest.raises(ValueError, match=r"out\[1\]"):
        ops.mhc_pre(X, fn, scale, base, out=(torch.empty(5, 4096, dtype=torch.bfloat16, device=dev),
                                            torch.empty(5, 3, device=dev), torch.empty(5, 4, 4, device=dev)), **kw)
    with pytest.raises(ValueError, match="workspace"):
        ops.mhc_pre(X, fn, scale, base, workspace=torch.empty(4, 4, device=dev), **kw)
