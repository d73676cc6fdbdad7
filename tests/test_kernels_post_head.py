"""mHC post / fused post+next-pre / hc_head: select contract, references, cross-compiles, GPU checks."""
import math
import subprocess
import sys

import pytest
import torch

from dsv4_jit.arch import PROFILES, get_profile
from dsv4_jit.kernels.mhc import ops as OPS
from dsv4_jit.kernels.mhc import post as MP
from dsv4_jit.kernels.mhc import reference as REF
from dsv4_jit.model_config import ParallelConfig, load_model_config
from dsv4_jit.spec import get_spec
from conftest import gpu_profile_params
from dsv4_jit.testing import nan_filled, select_only_getter, serving_getter

NAMES = ("mhc_post", "mhc_post_pre_fused", "mhc_head")
MODELS = ("deepseek-v4-flash", "deepseek-v4-pro")
SM12X_BUDGET = 101_376


def _static(name, model):
    return get_spec(name).static_params(load_model_config(model), ParallelConfig())


def _token_sweep():
    # every bucket edge up to 16384 shows up: dense at small T, then all powers of two +/- 1
    ts = set(range(1, 1025))
    for e in range(10, 15):
        ts.update({2 ** e - 1, 2 ** e, 2 ** e + 1})
    ts.update(range(1025, 16385, 97))
    ts.add(16384)
    return sorted(ts)


def _variants(name, model, arch):
    spec, static, prof = get_spec(name), _static(name, model), get_profile(arch)
    return sorted({spec.select(prof, static, t) for t in _token_sweep()}, key=lambda v: v.name)


# ---------------------------------------------------------------------------------------------
# select: pure, deterministic, bounded, validating
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_select_pure_deterministic_bounded(name, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("select queried the GPU")
    for attr in ("is_available", "get_device_capability", "device_count", "current_device", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, attr, boom)
    spec = get_spec(name)
    for model in MODELS:
        for arch in PROFILES:
            vs = _variants(name, model, arch)
            assert 1 <= len(vs) <= 3, [v.name for v in vs]
            for t in (1, 7, 33, 4096, 16384):
                a = spec.select(get_profile(arch), _static(name, model), t)
                assert a == spec.select(get_profile(arch), dict(_static(name, model)), t)
                assert a.kernel == name and a.arch == arch and a.schedule == arch
            for v in vs:
                assert spec.check_fits(v) == spec.smem_bytes(v)
                if arch.startswith("sm_12"):
                    assert spec.smem_bytes(v) <= SM12X_BUDGET


def test_select_emulated_profile_keeps_schedule():
    emu = get_profile("sm_120a").emulated(get_profile("sm_90a"))
    for name in NAMES:
        v = get_spec(name).select(emu, _static(name, "deepseek-v4-flash"), 5)
        assert (v.arch, v.schedule) == ("sm_90a", "sm_120a")
        assert get_spec(name).pass_configs(v)["tl.disable_wgmma"] is True


@pytest.mark.parametrize("name", NAMES)
def test_select_rejects_bad_input(name):
    spec, prof = get_spec(name), get_profile("sm_120a")
    good = _static(name, "deepseek-v4-flash")
    for t in (0, -1, 2.0, "3", None):
        with pytest.raises(ValueError):
            spec.select(prof, good, t)
    for key in good:
        bad = dict(good)
        del bad[key]
        with pytest.raises(ValueError, match=key):
            spec.select(prof, bad, 4)
    for key, val in (("hidden_size", 1000), ("hidden_size", 0), ("hc_mult", 0), ("hc_mult", True), ("hidden_size", 4096.0)):
        with pytest.raises(ValueError):
            spec.select(prof, {**good, key: val}, 4)
    with pytest.raises(ValueError):
        spec.select("sm_120a", good, 4)
    if name == "mhc_post_pre_fused":
        with pytest.raises(ValueError, match="mix_width"):
            spec.select(prof, {**good, "mix_width": 40}, 4)
    if name == "mhc_head":
        for key in ("rms_eps", "hc_eps"):
            with pytest.raises(ValueError, match=key):
                spec.select(prof, {**good, key: -1e-6}, 4)


def test_spec_contract_attributes():
    for name in NAMES:
        spec = get_spec(name)
        assert spec.name == name and isinstance(spec.arg_names, tuple)
    assert get_spec("mhc_post").arg_names[-1] == "out"
    assert get_spec("mhc_post_pre_fused").arg_names[-3:] == ("out", "mix_part", "sq_part")
    assert get_spec("mhc_head").arg_names[-1] == "y"


def test_import_does_not_import_tilelang():
    code = ("import sys, dsv4_jit.kernels.mhc.post, dsv4_jit.kernels.mhc.head, dsv4_jit.kernels.mhc.reference, dsv4_jit.kernels.mhc.ops;"
            "sys.exit(1 if 'tilelang' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---------------------------------------------------------------------------------------------
# op wrappers: validation happens before any kernel is requested
# ---------------------------------------------------------------------------------------------
def _never(*a, **k):
    raise AssertionError("get_kernel must not be reached")


def _wrapper_args(device):
    bf, f32 = torch.bfloat16, torch.float32
    return (torch.zeros(2, 256, dtype=bf, device=device), torch.zeros(2, 4, 256, dtype=bf, device=device),
            torch.zeros(2, 4, dtype=f32, device=device), torch.zeros(2, 4, 4, dtype=f32, device=device))


def test_wrappers_validate_cpu():
    x, r, p, c = _wrapper_args("cpu")
    kw = dict(arch="sm_120a", get_kernel=_never)
    with pytest.raises(ValueError, match="CUDA"):
        OPS.mhc_post(x, r, p, c, **kw)  # CPU tensors
    with pytest.raises(ValueError, match="dtype"):
        OPS.mhc_post(x.float(), r, p, c, **kw)
    with pytest.raises(ValueError, match="x: expected shape"):
        OPS.mhc_post_pre_fused(x[0], r, p, c, torch.zeros(24, 1024), **kw)
    with pytest.raises(ValueError, match="residual"):
        OPS.hc_head(x, torch.zeros(4, 1024), torch.ones(1), torch.zeros(4), rms_eps=1e-6, hc_eps=1e-6, **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wrappers_validate_gpu():
    x, r, p, c = _wrapper_args("cuda")
    kw = dict(arch="sm_90a", get_kernel=_never)
    with pytest.raises(ValueError, match="residual"):
        OPS.mhc_post(x, r[:, :, :128], p, c, **kw)
    with pytest.raises(ValueError, match="residual"):
        OPS.mhc_post(x, r.cpu(), p, c, **kw)
    with pytest.raises(ValueError, match="comb"):
        OPS.mhc_post(x, r, p, c.transpose(1, 2), **kw)  # not contiguous
    with pytest.raises(ValueError, match="out"):
        OPS.mhc_post(x, r, p, c, out=torch.empty(2, 4, 255, dtype=torch.bfloat16, device="cuda"), **kw)
    with pytest.raises(ValueError, match="fn_next"):
        OPS.mhc_post_pre_fused(x, r, p, c, torch.zeros(24, 10, device="cuda"), **kw)
    with pytest.raises(ValueError, match="mix_part"):   # its shape follows the selected variant
        OPS.mhc_post_pre_fused(x, r, p, c, torch.zeros(24, 1024, device="cuda"), mix_part=torch.empty(1, 2, 32, device="cuda"),
                              arch=get_profile("sm_90a"), get_kernel=select_only_getter(get_profile("sm_90a")))
    with pytest.raises(ValueError, match="fn"):
        OPS.hc_head(r, torch.zeros(4, 1000, device="cuda"), torch.ones(1, device="cuda"),
                   torch.zeros(4, device="cuda"), rms_eps=1e-6, hc_eps=1e-6, **kw)
    with pytest.raises(ValueError, match="hidden_size"):  # 200 is not a multiple of 256: select refuses it
        OPS.mhc_post(x[:, :200].contiguous(), r[:, :, :200].contiguous(), p, c, arch=get_profile("sm_90a"),
                     get_kernel=select_only_getter(get_profile("sm_90a")))


def test_post_tile_by_token_count():
    # wide tile (2 x 16 B per thread) once it gives >= 2 CTAs per SM; 1024 columns once T fills the SMs
    assert MP.post_tile(4096, 4096, 132) == (256, 2)
    assert MP.post_tile(7168, 4096, 132) == (224, 2)  # V4-Pro: 3584-column blocks divide 7168
    assert MP.post_tile(4096, 512, 132) == (256, 2)
    assert MP.post_tile(4096, 64, 132) == (128, 1)
    assert MP.post_tile(4096, 1, 132) == (32, 1)
    for hidden in (256, 4096, 7168):
        for t in (1, 33, 64, 65, 1000, 8192):
            threads, vecs = MP.post_tile(hidden, t, 132)
            assert hidden % (threads * 8 * vecs) == 0 and threads % 32 == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_post_hot_path_still_validates(gpu_store):
    prof = get_profile("sm_90a")
    get = serving_getter(prof, gpu_store)
    x, r, p, c = _inputs(3, 4, 4096, device="cuda")
    o1 = OPS.mhc_post(x, r, p, c, arch=prof, get_kernel=get)
    o2 = OPS.mhc_post(x, r, p, c, arch=prof, get_kernel=get)  # plan hit
    torch.cuda.synchronize()
    assert torch.equal(o1, o2)
    for args, msg in [((x.float(), r, p, c), "x: expected dtype"), ((x, r, p.double(), c), "post: expected dtype"),
                      ((x, r, p, c.transpose(1, 2)), "comb: must be contiguous"),
                      ((x, r, p, c.cpu()), "comb: expected device")]:
        with pytest.raises(ValueError, match=msg):
            OPS.mhc_post(*args, arch=prof, get_kernel=get)
    with pytest.raises(ValueError, match="out: expected shape"):
        OPS.mhc_post(x, r, p, c, arch=prof, get_kernel=get, out=torch.empty(3, 4, 4095, dtype=torch.bfloat16,
                                                                          device="cuda"))


# ---------------------------------------------------------------------------------------------
# references vs literal transcriptions
# ---------------------------------------------------------------------------------------------
def _inputs(t, hc, hidden, mix=None, seed=0, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    res = torch.randn(t, hc, hidden, generator=g).to(torch.bfloat16)
    post = 2 * torch.rand(t, hc, generator=g)
    comb = torch.rand(t, hc, hc, generator=g)
    comb = comb / comb.sum(1, keepdim=True)
    out = [x, res, post, comb]
    if mix is not None:
        out.append(torch.randn(mix, hc * hidden, generator=g) * (hc * hidden) ** -0.5)
    return [a.to(device) for a in out]


def test_ref_post_naive():
    t, hc, hidden = 3, 4, 16
    x, res, post, comb = _inputs(t, hc, hidden)
    got = REF.ref_mhc_post(x, res, post, comb, torch.float64)
    for a in range(t):
        for j in range(hc):
            for h in range(hidden):
                want = float(post[a, j]) * float(x[a, h])
                for i in range(hc):
                    want += float(comb[a, i, j]) * float(res[a, i, h])
                assert math.isclose(float(got[a, j, h]), want, rel_tol=1e-12, abs_tol=1e-12)


def test_ref_fused_naive():
    t, hc, hidden, mix, splits, pad = 2, 4, 16, 24, 4, 32
    x, res, post, comb, fn = _inputs(t, hc, hidden, mix)
    out, mp, sq = REF.ref_mhc_post_pre_fused(x, res, post, comb, fn, splits, pad, torch.float64)
    assert mp.shape == (splits, t, pad) and sq.shape == (splits, t)
    ob = REF.ref_mhc_post(x, res, post, comb).to(torch.bfloat16).double()
    assert torch.equal(out, ob)
    flat = ob.reshape(t, hc * hidden)
    hs = hidden // splits
    for s in range(splits):
        ks = [i * hidden + h for i in range(hc) for h in range(s * hs, (s + 1) * hs)]
        for a in range(t):
            assert math.isclose(float(sq[s, a]), sum(float(flat[a, k]) ** 2 for k in ks), rel_tol=1e-12)
            for m in range(pad):
                want = sum(float(flat[a, k]) * float(fn[m, k]) for k in ks) if m < mix else 0.0
                assert math.isclose(float(mp[s, a, m]), want, rel_tol=1e-9, abs_tol=1e-12)
    # summing the splits gives the unsplit prenorm GEMM
    torch.testing.assert_close(mp.sum(0)[:, :mix], flat @ fn.double().t())


def test_ref_head_naive():
    t, hc, hidden, rms_eps, hc_eps = 2, 4, 8, 1e-6, 1e-6
    _, res, _, _ = _inputs(t, hc, hidden)
    g = torch.Generator().manual_seed(1)
    fn = torch.randn(hc, hc * hidden, generator=g)
    scale, base = torch.rand(1, generator=g), torch.randn(hc, generator=g)
    got = REF.ref_hc_head(res, fn, scale, base, rms_eps, hc_eps, torch.float64)
    for a in range(t):
        xf = [float(v) for v in res[a].reshape(-1)]
        r = 1.0 / math.sqrt(sum(v * v for v in xf) / len(xf) + rms_eps)
        pre = []
        for i in range(hc):
            mixv = sum(xf[k] * float(fn[i, k]) for k in range(len(xf))) * r
            pre.append(1.0 / (1.0 + math.exp(-(mixv * float(scale[0]) + float(base[i])))) + hc_eps)
        for h in range(hidden):
            want = sum(pre[i] * float(res[a, i, h]) for i in range(hc))
            assert math.isclose(float(got[a, h]), want, rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# GPU: kernels vs references, native schedule and the SM120 schedule compiled for this GPU
# ---------------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("profile", gpu_profile_params())
def test_gpu_post_pre_fused(profile, model, gpu_store):
    """Accuracy is a family GPU case (tests/test_families.py); here: the padded mix columns are zero and
    a default-allocating call agrees bit for bit with the preallocated (graph-capture) one."""
    cfg = load_model_config(model)
    hidden, hc, mix = cfg.hidden_size, cfg.hc_mult, cfg.mix_width
    get = serving_getter(profile, gpu_store)
    spec = get_spec("mhc_post_pre_fused")
    for t in (1, 33):
        v = spec.select(profile, {"hidden_size": hidden, "hc_mult": hc, "mix_width": mix}, t)
        splits, pad = MP.fused_num_splits(v), v.p["mix_pad"]
        x, res, post, comb, fn = _inputs(t, hc, hidden, mix, seed=t, device="cuda")
        out = nan_filled(t, hc, hidden, dtype=torch.bfloat16, device="cuda")
        mp, sq = nan_filled(splits, t, pad, dtype=torch.float32, device="cuda"), nan_filled(splits, t, dtype=torch.float32, device="cuda")
        OPS.mhc_post_pre_fused(x, res, post, comb, fn, arch=profile, get_kernel=get, out=out, mix_part=mp, sq_part=sq)
        o2, m2, s2 = OPS.mhc_post_pre_fused(x, res, post, comb, fn, arch=profile, get_kernel=get)
        torch.cuda.synchronize()
        assert (mp[:, :, mix:] == 0).all()
        assert torch.equal(o2, out) and torch.equal(m2, mp) and torch.equal(s2, sq)
