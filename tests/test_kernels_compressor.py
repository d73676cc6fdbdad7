"""The KV compressor family on the CPU: the state-cache reference against the model's contiguous form, the GPU
cases dry-run with a kernel stand-in built from the reference (case plumbing, cache codecs, tolerances), op
validation, and the SM12x figures. The kernels themselves run in tests/test_families.py's GPU cases."""
from __future__ import annotations

import pytest
import torch

from dsv4_jit.arch import get_profile
from dsv4_jit.kernels.compressor import family, ops, reference
from dsv4_jit.model_config import ParallelConfig, load_model_config
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import check_case_outputs, poison

SM120 = get_profile("sm_120a")


@pytest.mark.parametrize("ratio,d", [(4, 512), (4, 128), (128, 512)])
def test_state_cache_pooling_matches_the_models_contiguous_form(ratio, d):
    """Rows written as state rows into a paged state cache (shuffled pages), gathered per emitting token as the
    kernel gathers them, pool to the model's own overlap construction, window by window."""
    g = torch.Generator().manual_seed(ratio + d)
    coff = reference.coff_of(ratio)
    n_win = 3
    t = n_win * ratio
    kv, score = torch.randn(t, coff * d, generator=g), torch.randn(t, coff * d, generator=g) * 2
    ape = torch.randn(ratio, coff * d, generator=g)
    want = reference.transcription_compress(kv, score, ape, ratio)
    page = 4
    pages = -(-t // page) + 2
    perm = torch.randperm(pages, generator=g)
    bt = perm[None, : -(-t // page)]
    state = torch.full((pages * page, 2 * coff * d), float("nan"))
    pos = torch.arange(t)
    slots = bt[0, pos // page] * page + pos % page
    state[slots] = reference.state_rows(kv, score, ape, pos, ratio)
    w = coff * ratio
    for i in range(n_win):
        p = ratio * i + ratio - 1
        q = torch.arange(p - w + 1, p + 1)
        rows = state[bt[0, q.clamp_min(0) // page] * page + q.clamp_min(0) % page]
        got = reference.pool_entry(rows, q >= 0, d, ratio)
        torch.testing.assert_close(got, want[i], rtol=1e-12, atol=1e-12)


def _fake_get_kernel(spec, static, num_tokens):
    """The kernels' semantics from the references, writing the same cache bytes a kernel writes."""
    ratio, d = static["ratio"], static["head_dim"]
    if spec.name == "compressor_state_write":
        def state_write(kv_score, ape, positions, state_slots, state):
            c = kv_score.shape[1] // 2
            rows = reference.state_rows(kv_score[:, :c], kv_score[:, c:], ape, positions, ratio)
            ok = state_slots >= 0
            state[state_slots[ok].long()] = rows[ok]
        return state_write

    def compress(state, sbt, state_page, positions, req_idx, out_slots, w, cos_sin, *views_and_bs):
        *views, bs = views_and_bs
        raw = views[0].view(torch.uint8)
        for slot, (y, r, _) in reference.ref_compress(state, sbt, state_page, positions, req_idx, out_slots, w, cos_sin,
                                                     ratio=ratio, eps=static["eps"]).items():
            pg, off = divmod(slot, bs)
            if d == 512:
                q, e, rope = reference.quant_attention_row(y, r)
                raw[pg, off * 576: off * 576 + 448] = q.view(torch.uint8)
                raw[pg, off * 576 + 448: off * 576 + 576] = rope.view(torch.uint8)
                raw[pg, bs * 576 + off * 8: bs * 576 + off * 8 + 8] = torch.cat([e, torch.zeros(1, dtype=torch.uint8)])
            else:
                q, s = reference.quant_indexer_row(r)
                raw[pg, off * d: off * d + d] = q.view(torch.uint8)
                raw[pg, bs * d + off * 4: bs * d + off * 4 + 4] = s.reshape(1).view(torch.uint8)
    return compress


@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_gpu_cases_dry_run_on_the_cpu(model, cpu_tensors_ok):
    """Every compressor GPU case, launched through its op with the reference stand-in: within its tolerance (the
    e4m3 rounding), untouched slots checked, zero rows for the tokens that emit nothing."""
    m = load_model_config(model)
    cases = family._gpu_cases(m)
    assert len(cases) == 6
    g = torch.Generator().manual_seed(1)
    for case in cases:
        for t in (7, 64):
            inp = case.make_inputs(t, "cpu", g)
            out = case.make_outputs(inp, SM120)
            poison(out)
            case.launch(inp, out, SM120, _fake_get_kernel)
            want = case.reference(inp, out)
            check_case_outputs(case, out, want, t)
            if "entry" in want:
                w = want["entry"].double()
                emitting = ((inp["pos"] + 1) % case_ratio(case) == 0) & (inp["slots"] >= 0)
                assert emitting.any() and (~emitting).any()
                assert (w[~emitting] == 0).all() and (w[emitting].norm(dim=1) > 0).all()


def case_ratio(case) -> int:
    return int(case.name.split("ratio=")[1].split(",")[0])


def test_uses_cover_every_compressor_site_of_both_models():
    for name in ("deepseek-v4-flash", "deepseek-v4-pro"):
        m = load_model_config(name)
        got = {(u.spec.name, u.static["ratio"], u.static["head_dim"]) for u in family._uses(m, ParallelConfig())}
        assert got == {(k, r, d) for k in ("compressor_state_write", "compressor_compress")
                       for r, d in ((4, 512), (4, 128), (128, 512))}


@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a", "sm_100a"])
def test_select_is_one_variant_per_site_and_fits(arch):
    prof = get_profile(arch)
    spec = get_spec("compressor_compress")
    for ratio, d in ((4, 512), (4, 128), (128, 512)):
        vs = {spec.select(prof, ops.compress_static(ratio, d, 1e-6), t) for t in (1, 7, 512, 16384)}
        assert len(vs) == 1
        # d 512: the 16-byte cross-warp sum; ratio 128: + 4 row groups' (max, numerator, denominator) per channel
        want = (16 if d == 512 else 0) + (4 * d * 3 * 4 if ratio == 128 else 0)
        assert spec.smem_bytes(vs.pop()) == want <= prof.max_smem_per_block


@pytest.mark.parametrize("static,match", [({"ratio": 8, "head_dim": 512, "eps": 1e-6}, "ratio must be 4 or 128"),
                                          ({"ratio": 4, "head_dim": 256, "eps": 1e-6}, "head_dim must be 512"),
                                          ({"ratio": 4, "head_dim": 512, "eps": 2.0}, "eps must be"),
                                          ({"ratio": 4, "head_dim": 512}, "eps must be")])
def test_select_rejects_bad_statics(static, match):
    with pytest.raises(ValueError, match=match):
        get_spec("compressor_compress").select(SM120, static, 1)


def _compress_args(d=512, ratio=4, t=5):
    c = reference.coff_of(ratio) * d
    return dict(state=torch.zeros(64, 2 * c), state_block_table=torch.zeros(2, 4, dtype=torch.int32),
                positions=torch.arange(t, dtype=torch.int32), req_idx=torch.zeros(t, dtype=torch.int32),
                out_slots=torch.full((t,), -1, dtype=torch.int32), norm_weight=torch.ones(d, dtype=torch.bfloat16),
                cos_sin=torch.zeros(64, 64), cache=torch.zeros(2, 64 * 584 + 64 if d == 512 else 64 * 132,
                                                               dtype=torch.uint8))


@pytest.mark.parametrize("change,match", [
    ({"norm_weight": torch.ones(256, dtype=torch.bfloat16)}, "norm_weight: expected a bf16 \\[head_dim\\]"),
    ({"state": torch.zeros(64, 100)}, "state: expected shape"),
    ({"positions": torch.arange(5)}, "positions: expected dtype torch.int32"),
    ({"req_idx": torch.zeros(4, dtype=torch.int32)}, "req_idx: expected shape"),
    ({"cos_sin": torch.zeros(64, 32)}, "cos_sin: expected shape"),
    ({"cache": torch.zeros(2, 1000, dtype=torch.uint8)}, "cache: a page of 64 entries needs"),
    ({"cache": torch.zeros(2, 64 * 584, dtype=torch.float32)}, "cache: expected a uint8"),
])
def test_compress_op_names_the_bad_argument(change, match, cpu_tensors_ok):
    args = {**_compress_args(), **change}
    with pytest.raises(ValueError, match=match):
        ops.compressor_compress(**args, ratio=4, state_page=16, block_size=64, eps=1e-6, arch=SM120, get_kernel=None,
                                check_ranges=False)


def test_compress_op_checks_slots_and_positions_before_launching(cpu_tensors_ok):
    args = _compress_args()
    args["out_slots"] = torch.tensor([-1, -1, -1, 500, -1], dtype=torch.int32)
    with pytest.raises(ValueError, match="out_slots: an entry is outside the cache"):
        ops.compressor_compress(**args, ratio=4, state_page=16, block_size=64, eps=1e-6, arch=SM120,
                                get_kernel=_fake_get_kernel, check_ranges=True)
    args = _compress_args()
    args["positions"] = torch.tensor([0, 1, 2, 3, 403], dtype=torch.int32)
    args["out_slots"] = torch.tensor([-1, -1, -1, -1, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="positions: a RoPE position is past cos_sin"):
        ops.compressor_compress(**args, ratio=4, state_page=16, block_size=64, eps=1e-6, arch=SM120,
                                get_kernel=_fake_get_kernel, check_ranges=True)


def test_state_write_op_names_the_bad_argument(cpu_tensors_ok):
    kv = torch.zeros(3, 2048)
    with pytest.raises(ValueError, match="kv_score: width 2000"):
        ops.compressor_state_write(torch.zeros(3, 2000), torch.zeros(4, 1024), torch.zeros(3, dtype=torch.int32),
                                   torch.zeros(3, dtype=torch.int32), torch.zeros(8, 2048), ratio=4, arch=SM120,
                                   get_kernel=None)
    with pytest.raises(ValueError, match="ape: expected shape"):
        ops.compressor_state_write(kv, torch.zeros(128, 1024), torch.zeros(3, dtype=torch.int32),
                                   torch.zeros(3, dtype=torch.int32), torch.zeros(8, 2048), ratio=4, arch=SM120,
                                   get_kernel=None)
    with pytest.raises(ValueError, match="ratio=16 is not supported"):
        ops.compressor_state_write(kv, torch.zeros(4, 1024), torch.zeros(3, dtype=torch.int32),
                                   torch.zeros(3, dtype=torch.int32), torch.zeros(8, 2048), ratio=16, arch=SM120,
                                   get_kernel=None)


def test_e8_exponent_is_the_kernels_bit_ceil():
    """The kernel computes ceil(log2(x)) from x's fp32 bits; the reference's float64 log2 of the same fp32 x
    agrees, powers of two included (x = 2^k exactly -> k, not k + 1)."""
    amax = torch.tensor([1e-6, 1e-4, 448 * 2.0 ** -3, 448 * 2.0 ** -3 * 1.0000001, 1.0, 447.99, 448.0, 9e4])
    x = amax.float().clamp_min(1e-4) / 448.0
    bits = x.view(torch.int32).long()
    kernel_e = ((bits + 0x7FFFFF) >> 23) - 127
    assert torch.equal(reference.e8_exponent(amax).long(), kernel_e)


def test_compress_op_lets_padding_tokens_carry_any_request(cpu_tensors_ok):
    """Tokens that emit nothing (CUDA-graph padding) may hold req_idx -1 and any position: no error."""
    args = _compress_args()
    args["req_idx"] = torch.tensor([-1, 0, -1, 0, -1], dtype=torch.int32)
    args["positions"] = torch.tensor([10**6, 1, 2, 3, 5], dtype=torch.int32)
    args["out_slots"] = torch.tensor([-1, -1, -1, 5, 7], dtype=torch.int32)
    ops.compressor_compress(**args, ratio=4, state_page=16, block_size=64, eps=1e-6, arch=SM120,
                            get_kernel=_fake_get_kernel, check_ranges=True)


def test_index_k_pages_must_be_exactly_the_readers_size(cpu_tensors_ok):
    args = _compress_args(d=128)
    args["cache"] = torch.zeros(2, 64 * 132 + 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cache: an index-K page of 64 entries is exactly 8448 B"):
        ops.compressor_compress(**args, ratio=4, state_page=16, block_size=64, eps=1e-6, arch=SM120,
                                get_kernel=None, check_ranges=False)
