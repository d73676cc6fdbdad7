"""Sparse MLA attention: the fp8_ds_mla codec, the float64 reference against a per-token loop, the
schedule choices (SM12x budget at every head count, split counts), and op validation.

GPU correctness lives in the family's GPU cases (tests/test_families.py -m gpu); the validation tests that
need CUDA tensors are gpu-marked here."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4_jit.arch import PROFILES, get_profile
from dsv4_jit.kernels.attention import ops, reference, sparse_mla
from dsv4_jit.spec import get_spec

FWD, COMBINE = get_spec("sparse_mla_fwd"), get_spec("sparse_mla_combine")
SCALE = 512 ** -0.5


def test_page_bytes_match_flashmla_padding():
    # FlashMLA / vLLM pad a page of block_size x 584 B to a multiple of 576 B
    assert reference.page_bytes_for(64) == 37_440
    assert reference.page_bytes_for(256) == 149_760
    assert all(reference.page_bytes_for(b) % 576 == 0 and reference.page_bytes_for(b) >= 584 * b for b in (1, 2, 16, 64))


def test_codec_round_trip_is_the_ue8m0_quantization():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(40, 512, generator=g) * torch.exp(torch.randn(40, 1, generator=g))
    slots = torch.randperm(3 * 16, generator=g)[:40]
    cache = reference.pack_fp8_ds_mla(kv, slots, 3, 16, fill=torch.randint(0, 256, (3 * reference.page_bytes_for(16),),
                                                                          generator=g, dtype=torch.uint8))
    rows = reference.unpack_fp8_ds_mla(cache, 16)[slots]
    nope, e, rope = reference.quantize_rows(kv)
    want_nope = (nope.float().view(40, 7, 64) * torch.exp2(e.float() - 127)[..., None]).view(40, 448)
    assert torch.equal(rows[:, :448], want_nope)
    assert torch.equal(rows[:, 448:], rope.float())
    # power-of-two scales never overflow e4m3 and lose at most e4m3's rounding
    assert ((rows[:, :448] - kv[:, :448]).abs() <= kv[:, :448].abs().view(40, 7, 64).amax(-1).repeat_interleave(64, 1) / 8 + 1e-30).all()


def _loop_reference(q, rows1, idx1, lens1, rows2, idx2, lens2, sink, scale):
    t_all, h_all, _ = q.shape
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(t_all):
        cand = [rows1[int(i)] for j, i in enumerate(idx1[t]) if j < lens1[t] and 0 <= i < rows1.shape[0]]
        cand += [rows2[int(i)] for j, i in enumerate(idx2[t]) if j < lens2[t] and 0 <= i < rows2.shape[0]]
        for h in range(h_all):
            if not cand:
                continue  # softmax over the sink alone: out = 0
            kv = torch.stack(cand).double()
            s = kv @ q[t, h].double() * scale
            w = torch.exp(s - s.max())
            out[t, h] = (w[:, None] * kv).sum(0) / (w.sum() + torch.exp(sink[h].double() - s.max()))
    return out


def test_reference_matches_a_per_token_loop():
    g = torch.Generator().manual_seed(1)
    t, h = 5, 3
    rows1, rows2 = torch.randn(20, 512, generator=g), torch.randn(9, 512, generator=g)
    idx1 = torch.randint(-1, 22, (t, 6), generator=g, dtype=torch.int32)   # holes and out-of-range entries
    idx2 = torch.randint(-1, 9, (t, 4), generator=g, dtype=torch.int32)
    lens1 = torch.tensor([6, 0, 3, 6, 1], dtype=torch.int32)
    lens2 = torch.tensor([4, 0, 0, 2, 4], dtype=torch.int32)
    q, sink = torch.randn(t, h, 512, generator=g), torch.randn(h, generator=g) * 2
    got = reference.ref_sparse_mla(q, rows1, idx1, lens1, rows2, idx2, lens2, sink, SCALE, chunk=2)
    want = _loop_reference(q, rows1, idx1, lens1, rows2, idx2, lens2, sink, SCALE)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(got[1], torch.zeros_like(got[1]))  # no candidate at all


@pytest.mark.parametrize("arch", sorted(PROFILES))
@pytest.mark.parametrize("heads", [8, 16, 32, 64, 128])
def test_schedule_fits_and_splits_only_small_batches(arch, heads):
    prof = get_profile(arch)
    static = {"heads": heads, "softmax_scale": SCALE}
    splits = []
    for t in range(1, 513):
        v = FWD.select(prof, static, t)
        assert FWD.smem_bytes(v) <= prof.max_smem_per_block
        assert v.p["n_splits"] in sparse_mla.SPLITS
        nhb = math.ceil(heads / v.p["head_block"])
        per_sm = sparse_mla.ctas_per_sm(prof, FWD.smem_bytes(v), v.p["threads"])
        assert t * nhb * v.p["n_splits"] <= max(prof.num_sms_hint * per_sm, t * nhb)  # one wave at most
        c = COMBINE.select(prof, static, t)
        assert c.p["n_splits"] == max(2, v.p["n_splits"])
        # the combine lets the next layer's kernel launch early (PDL) at small batches only
        assert c.p["pdl"] == (t <= sparse_mla.combine.PDL_TRIGGER_MAX_TOKENS)
        splits.append(v.p["n_splits"])
    assert splits == sorted(splits, reverse=True) and splits[-1] == 1
    if prof.family == "blackwell_consumer":
        # the public one-CTA-per-64-heads tile (64 rows, 141,312 B) is never what SM12x gets: 32-head CTAs at one
        # token, 64-head ones over 16-row tiles where they fit
        assert FWD.select(prof, static, 1).p["head_block"] <= 32
        assert all(FWD.select(prof, static, t).p["block_i"] <= 32 for t in (1, 64, 4096))


def test_softmax_row_groups_fit_every_selected_variant_and_bad_ones_are_refused():
    # the softmax gives each head row threads / head_block adjacent lanes (shuffles stay in one warp), so
    # every variant select can return must split its rows evenly; the builder refuses one that cannot
    for arch in sorted(PROFILES):
        for heads in (8, 16, 32, 64, 128):
            for t in (1, 2, 8, 64, 4096):
                p = FWD.select(get_profile(arch), {"heads": heads, "softmax_scale": SCALE}, t).p
                if p.get("warp_specialized"):   # its softmax runs on WGMMA fragments, one warp group
                    continue
                tpr = p["threads"] // p["head_block"]
                assert p["threads"] % p["head_block"] == 0 and tpr in (1, 2, 4, 8, 16, 32)
                assert p["block_i"] % tpr == 0
                c = COMBINE.select(get_profile(arch), {"heads": heads, "softmax_scale": SCALE}, t).p
                assert c["head_block"] == 1 and sparse_mla.D % c["threads"] == 0
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="cannot share 64 head rows"):
        sparse_mla.build_sparse_mla(heads=64, head_block=64, block_i=32, threads=96, kv_format="fp8_ds_mla",
                                    n_splits=1, softmax_scale=SCALE)
    with pytest.raises(ValueError, match="cannot share 16 head rows"):   # 64 lanes a row: beyond one warp
        sparse_mla.build_sparse_mla(heads=16, head_block=16, block_i=32, threads=1024, kv_format="fp8_ds_mla",
                                    n_splits=1, softmax_scale=SCALE)


def test_fp8_gather_is_the_cp_async_ring_and_small_steps_take_32_head_ctas():
    # the 1-stage cp.async ring everywhere it fits (SM12x at 32 heads included: 91,648 B of 101,376; at 64 heads over
    # 16-row tiles: 99,392 B); where 64 heads a CTA would split a list 16+ ways (registers at 64 splits included),
    # select takes 32-head ring CTAs
    for arch in sorted(PROFILES):
        prof = get_profile(arch)
        for heads in (8, 16, 32, 64, 128):
            for t in (1, 2, 8, 64, 4096):
                v = FWD.select(prof, {"heads": heads, "softmax_scale": SCALE}, t)
                p = v.p
                assert FWD.smem_bytes(v) <= prof.max_smem_per_block
                if p.get("warp_specialized"):   # decode_ws.py's gather: registers, its own warp group
                    continue
                assert p["stages"] == 1, (arch, heads, t, p)
                assert sparse_mla.kv_stages(p["head_block"], sparse_mla.narrow_tile(p["head_block"], prof), prof,
                                            p["n_splits"]) == 1
                bf16 = FWD.select(prof, {"heads": heads, "softmax_scale": SCALE, "kv_format": "bf16"}, t).p
                assert "stages" not in bf16
    hopper = get_profile("sm_90a")
    assert sparse_mla.kv_stages(64, 32, hopper, 64) == 0      # what 64-head CTAs would run at one token
    one = FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE}, 1).p
    assert (one["head_block"], one["n_splits"], one["threads"]) == (32, 64, 256) and "score_chains" not in one
    # 32-head CTAs wherever 64-head ones would split a list 16+ ways, past what the warp-specialized kernel takes (16
    # splits): on Hopper up to 4 tokens at 64 heads, 2 at 128 (SM12x: up to 8 and 4, test_sm12x_decode_...)
    for heads, tokens, hb in ((64, 4, 32), (64, 5, 64), (64, 8, 64), (64, 16, 64), (128, 2, 32), (128, 3, 64)):
        assert FWD.select(hopper, {"heads": heads, "softmax_scale": SCALE}, tokens).p["head_block"] == hb, (heads, tokens)
    assert FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE, "kv_format": "bf16"}, 1).p["head_block"] == 64
    assert sparse_mla.smem_bytes_for(32, 32, 1) == 91_648
    assert sparse_mla.smem_bytes_for(32, 32, 2) > get_profile("sm_120a").max_smem_per_block  # why one stage on SM12x
    assert sparse_mla.smem_bytes_for(64, 16, 1) == 99_392 <= get_profile("sm_120a").max_smem_per_block
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="stages must be"):
        sparse_mla.build_sparse_mla(heads=16, head_block=16, block_i=32, threads=128, kv_format="bf16", n_splits=1,
                                    softmax_scale=SCALE, stages=1)
    with pytest.raises(ValueError, match="stages must be"):
        sparse_mla.build_sparse_mla(heads=16, head_block=16, block_i=32, threads=128, kv_format="fp8_ds_mla",
                                    n_splits=1, softmax_scale=SCALE, stages=5)


def test_dequant_bit_placement_is_exact_for_every_e4m3_code():
    # the kernel places each byte's sign and magnitude bits in a bf16 (the value x 2^-120, subnormal codes
    # included), then multiplies by 2^120 and by the UE8M0 scale: both powers of two, so nothing rounds
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).float()
    bits = torch.tensor([sparse_mla.e4m3_bf16_bits(c) for c in range(256)], dtype=torch.int32)
    placed = (bits << 16).view(torch.float32).double() * 2.0 ** 120
    finite = ~torch.isnan(want)
    assert torch.equal(placed[finite], want[finite].double())
    assert int((~finite).sum()) == 2   # 0x7f / 0xff: NaN in e4m3, never written by the encoder


@pytest.mark.gpu
def test_dequant8_device_function_is_bit_exact_against_torch():
    # the CUDA source itself (DEQUANT8_SRC), compiled for this GPU: every code x UE8M0 exponents across the range
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    tilelang = pytest.importorskip("tilelang")
    import tilelang.language as T

    @T.prim_func
    def dq(src: T.Tensor[(64, 32, 8), "uint8"], e: T.Tensor[(64,), "uint8"], out: T.Tensor[(64, 32, 8), "bfloat16"]):
        with T.Kernel(64, threads=32) as (bx,):
            T.import_source(sparse_mla.DEQUANT8_SRC)
            tx = T.get_thread_binding()
            T.call_extern("handle", "dsv4_dequant8", T.address_of(out[bx, tx, 0]), T.address_of(src[bx, tx, 0]),
                          T.Cast("uint32", e[bx]))

    kern = tilelang.compile(dq, target="cuda")
    codes = torch.arange(256, dtype=torch.uint8).view(1, 32, 8).repeat(64, 1, 1).cuda()
    es = torch.tensor([0, 1, 2, 60, 100, 110, 117, 120, 126, 127, 128, 134, 135, 140, 200, 254] * 4,
                      dtype=torch.uint8).cuda()
    out = torch.empty(64, 32, 8, dtype=torch.bfloat16, device="cuda")
    kern(codes, es, out)
    vals = codes.view(torch.float8_e4m3fn).float()
    scale = torch.where(es == 0, torch.zeros_like(es, dtype=torch.float32), torch.exp2(es.float() - 127))
    want = (vals * scale[:, None, None]).to(torch.bfloat16)
    same = (out.view(torch.int16) == want.view(torch.int16)) | torch.isnan(vals)
    assert bool(same.all()), f"{int((~same).sum())} codes differ"


def test_wide_tiles_only_on_wgmma_64_head_ctas_with_long_shares():
    # 64-candidate tiles where a WGMMA CTA of 64 heads walks a long share of the list (the fp8 ring split at
    # most 2 ways, or the bf16 prefill kernel unsplit); they never change how many CTAs an SM holds, so the
    # split count select computed with 32 stands
    for arch in sorted(PROFILES):
        prof = get_profile(arch)
        for heads in (8, 16, 32, 64, 128):
            for t in (1, 2, 8, 24, 44, 45, 64, 200, 4096):
                for fmt in ("fp8_ds_mla", "bf16"):
                    v = FWD.select(prof, {"heads": heads, "softmax_scale": SCALE, "kv_format": fmt}, t)
                    p = v.p
                    if p.get("warp_specialized"):   # decode_ws.py: 64-candidate tiles, its own rule (below)
                        assert p["block_i"] == 64 and p["n_splits"] <= sparse_mla.WS_MAX_SPLITS
                        continue
                    ring = p.get("stages", 0) >= 1
                    wide = (prof.has_wgmma and p["head_block"] >= 64
                            and (p["n_splits"] <= 2 if ring else p["n_splits"] == 1))
                    assert p["block_i"] == (64 if wide else sparse_mla.narrow_tile(p["head_block"], prof)), (
                        arch, heads, t, fmt, p)
                    assert FWD.smem_bytes(v) <= prof.max_smem_per_block
                    if wide:
                        thr = p["threads"]
                        narrow = sparse_mla.smem_bytes_for(p["head_block"], 32, p.get("stages", 0))
                        assert (sparse_mla.ctas_per_sm(prof, FWD.smem_bytes(v), thr)
                                == sparse_mla.ctas_per_sm(prof, narrow, thr))
    hopper = get_profile("sm_90a")
    assert FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE}, 4).p["block_i"] == 32
    assert FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE, "kv_format": "bf16"}, 2049).p["block_i"] == 64
    assert FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE}, 1).p["block_i"] == 32   # 32-head CTAs
    sm120 = get_profile("sm_120a")
    assert FWD.select(sm120, {"heads": 64, "softmax_scale": SCALE, "kv_format": "bf16"}, 64).p["block_i"] == 32
    assert sparse_mla.smem_bytes_for(64, 64, 1) == 195_584
    assert sparse_mla.smem_bytes_for(64, 64, 0) == 160_256


def test_hopper_64_head_decode_over_a_long_share_is_warp_specialized():
    # decode_ws.py where a Hopper CTA of 64 heads walks a token's list split at most 16 ways (from 5 tokens at 64
    # heads, 3 at 128); the 8-warp kernels everywhere else, and never on SM12x / sm_100a or in prefill
    hopper = get_profile("sm_90a")
    for heads, tokens, want in ((64, 64, True), (64, 32, True), (64, 24, True), (64, 4096, True), (64, 16, True),
                                (64, 8, True), (64, 5, True), (64, 4, False), (64, 1, False), (128, 16, True),
                                (128, 64, True), (128, 8, True), (128, 3, True), (128, 2, False), (32, 64, False),
                                (16, 4096, False), (8, 64, False)):
        v = FWD.select(hopper, {"heads": heads, "softmax_scale": SCALE}, tokens)
        assert bool(v.p.get("warp_specialized")) == want, (heads, tokens, v.p)
        if want:
            assert (v.p["head_block"], v.p["block_i"], v.p["threads"]) == (64, 64, 384)
            assert "stages" not in v.p and "score_chains" not in v.p
            assert v.p["n_splits"] <= sparse_mla.WS_MAX_SPLITS
            # two splits merge in a thread block cluster (the peer's row statistics: 512 B more), no combine
            pair = v.p["n_splits"] == 2
            assert bool(v.p.get("cluster")) == pair
            assert FWD.smem_bytes(v) == sparse_mla.ws_smem_bytes(64, 64, pair) <= hopper.max_smem_per_block
            assert sparse_mla.ws_smem_bytes() == 214_592 and sparse_mla.ws_smem_bytes(64, 64, True) == 215_104
            c = COMBINE.select(hopper, {"heads": heads, "softmax_scale": SCALE}, tokens)
            assert c.p["block_i"] == 64   # the combine counts live splits over the same 64-candidate tiles
    for arch in ("sm_100a", "sm_120a", "sm_121a"):
        for t in (24, 64, 4096):
            assert "warp_specialized" not in FWD.select(get_profile(arch), {"heads": 64, "softmax_scale": SCALE}, t).p
    bf16 = FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE, "kv_format": "bf16"}, 64)
    assert "warp_specialized" not in bf16.p
    pytest.importorskip("tilelang")
    for bad in (dict(heads=96, head_block=64, block_i=64, threads=384, kv_format="fp8_ds_mla"),  # 96 % 64
                dict(heads=64, head_block=64, block_i=32, threads=384, kv_format="fp8_ds_mla"),
                dict(heads=64, head_block=64, block_i=64, threads=256, kv_format="fp8_ds_mla"),
                dict(heads=64, head_block=64, block_i=64, threads=384, kv_format="bf16")):
        with pytest.raises(ValueError, match="warp-specialized decode"):
            sparse_mla.build_sparse_mla(n_splits=2, softmax_scale=SCALE, warp_specialized=True, **bad)


@pytest.mark.compile
def test_warp_specialized_decode_compiles_with_its_register_split(tmp_path):
    # the setmaxnreg split (224 / 160 / 120 registers a thread: at most the 3 x 168 the launch gave), the
    # mbarrier hand-offs and the lowered shared memory of the formula
    from dsv4_jit import jit
    from dsv4_jit.kernels.attention.decode_ws import WS_REGS
    hopper = get_profile("sm_90a")
    v = FWD.select(hopper, {"heads": 128, "softmax_scale": SCALE}, 64)
    assert v.p.get("warp_specialized") and v.p["n_splits"] == 1
    meta = jit.compile_to_dir(FWD, v, tmp_path)
    src = (tmp_path / jit.SOURCE_NAME).read_text()
    assert sum(WS_REGS) <= 3 * 168
    assert f"warpgroup_reg_alloc<{WS_REGS[0]}>" in src
    assert f"warpgroup_reg_dealloc<{WS_REGS[1]}>" in src and f"warpgroup_reg_dealloc<{WS_REGS[2]}>" in src
    assert src.count(".init(") == 8 and "wgmma" in src
    assert meta["smem_bytes"] == sparse_mla.ws_smem_bytes()


@pytest.mark.compile
def test_two_splits_merge_in_a_cluster_through_shared_memory(tmp_path):
    # a token's two splits are one thread block cluster: each sends the half of O its peer merges (mapa +
    # st.shared::cluster between two cluster barriers), no partials and no combine; the lowered shared memory is
    # the formula's (the peer's row sums and maxima added)
    from dsv4_jit import jit
    from dsv4_jit.kernels.attention import ops
    hopper = get_profile("sm_90a")
    v = FWD.select(hopper, {"heads": 64, "softmax_scale": SCALE}, 64)
    assert v.p.get("cluster") and v.p["n_splits"] == 2
    assert ops.sparse_mla_workspace_numel(hopper, 64, 64) == 0
    meta = jit.compile_to_dir(FWD, v, tmp_path)
    src = (tmp_path / jit.SOURCE_NAME).read_text()
    assert src.count("dsv4_cluster_sync();") == 6
    assert "st.shared::cluster.v4.u32" in src and "mapa.shared::cluster" in src
    assert "o_part[" not in src and "lse_part[" not in src
    assert meta["smem_bytes"] == sparse_mla.ws_smem_bytes(64, 64, True) == FWD.smem_bytes(v)
    for bad in ({"warp_specialized": True, "head_block": 64, "block_i": 64, "threads": 384, "kv_format": "fp8_ds_mla"},
                {"head_block": 32, "block_i": 32, "threads": 256, "kv_format": "bf16"}):
        with pytest.raises(ValueError, match="score_halves is the fp8 ring decode's"):
            sparse_mla.build_sparse_mla(heads=64, n_splits=4, softmax_scale=SCALE, score_halves=True, **bad)
    with pytest.raises(ValueError, match="cluster merge joins a token's 2 splits"):
        sparse_mla.build_sparse_mla(heads=64, head_block=64, block_i=64, threads=384, kv_format="fp8_ds_mla",
                                    n_splits=4, softmax_scale=SCALE, warp_specialized=True, cluster=True)


@pytest.mark.compile
@pytest.mark.parametrize("schedule, tokens, stamps", [("sm_120a", 8, 13), ("sm_90a", 64, 14)])
def test_traced_builds_stamp_their_timeline_and_served_builds_carry_none(tmp_path, schedule, tokens, stamps):
    # trace=True (benchmarks/attention/trace_attention.py) adds a [tokens, head blocks, splits, stamps, 2] int64
    # buffer and the stamps' call sites (the ring kernel's 13, five of them in its tile loop and two in its epilogue;
    # the warp-specialized kernel's per-tile ones sit in its loops, so fewer call sites than WS_NSTAMP); select's
    # variant, which serving loads, has neither. The traced
    # SM120 ring variant still fits and emits no Hopper-only instruction (compile_to_dir checks both).
    from dsv4_jit import jit
    from dsv4_jit.kernels.attention.decode import RING_STAMPS
    from dsv4_jit.kernels.attention.decode_ws import WS_NSTAMP
    from dsv4_jit.spec import Variant
    prof = get_profile(schedule)
    v = FWD.select(prof, {"heads": 64, "softmax_scale": SCALE}, tokens)
    traced = Variant.make(FWD.name, {**v.p, "trace": True}, prof)
    meta = jit.compile_to_dir(FWD, traced, tmp_path / "traced")
    src = (tmp_path / "traced" / jit.SOURCE_NAME).read_text()
    assert src.count("dsv4_stamp((") == stamps and "%globaltimer" in src
    sig = meta["signature"]
    nstamp = WS_NSTAMP if v.p.get("warp_specialized") else len(RING_STAMPS)
    assert sig[-1]["dtype"] == "int64" and str(sig[-1]["shape"][-2:]) in (f"[{nstamp}, 2]", f"({nstamp}, 2)")
    assert meta["smem_bytes"] <= FWD.smem_bytes(v)   # the stamps take no shared memory
    jit.compile_to_dir(FWD, v, tmp_path / "served")
    assert "dsv4_stamp" not in (tmp_path / "served" / jit.SOURCE_NAME).read_text()


def test_trace_summary_measures_each_stamp_from_the_layers_first_release():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.attention.trace_attention import summarize
    names = ("entry", "pdl_sync", "lengths", "done")
    layers = []
    for layer in range(3):
        tr = torch.zeros(1, 2, 2, len(names), 2, dtype=torch.int64)   # 4 CTAs
        for cta in range(4):
            t0 = 1_000_000 + 20_000 * layer + 100 * cta                # each CTA released 100 ns after the last
            for k, off in enumerate((-500, 0, 400, 3000 if cta < 3 else None)):
                if off is not None:                                     # the last CTA never reaches "done"
                    tr.view(4, len(names), 2)[cta, k] = torch.tensor([t0 + off, 2 * (t0 + off)])
        layers.append(tr)
    out = summarize(layers, names)
    assert out["stamps"]["pdl_sync"] == {"ctas": 4, "median_ns": 200.0, "max_ns": 300.0, "min_ns": 0.0,
                                         "clock_median_ns": 0.0}
    assert out["stamps"]["lengths"]["clock_median_ns"] == 400.0   # each CTA's own release to its stamp
    assert out["stamps"]["lengths"]["min_ns"] == 400.0
    assert out["stamps"]["done"]["ctas"] == 3 and out["stamps"]["done"]["max_ns"] == 3200.0
    assert out["layer_span_ns"] == 3200.0            # release of CTA 0 to the last stamp (CTA 2's done)
    assert out["launch_gap_ns"] == 20_000 - 3200.0   # the layer's last stamp to the next layer's first release
    assert out["sm_ghz"] == 2.0


def test_sm12x_decode_runs_64_head_ctas_over_16_row_tiles_where_they_fit():
    # one CTA dequantizes each candidate once for all 64 heads (two 32-head CTAs did it twice); 16-row tiles make
    # it fit SM12x's 101,376 B. A few tokens still take 32-head CTAs (a 64-head CTA would split a list 16+ ways);
    # the bf16 prefill keeps 32 heads over 32-row tiles.
    sm120 = get_profile("sm_120a")
    for heads, tokens, want in ((64, 1, (32, 32)), (64, 8, (32, 32)), (64, 16, (64, 16)), (64, 64, (64, 16)),
                                (64, 4096, (64, 16)), (128, 8, (64, 16)), (32, 64, (32, 32)), (16, 64, (16, 32))):
        v = FWD.select(sm120, {"heads": heads, "softmax_scale": SCALE}, tokens)
        assert (v.p["head_block"], v.p["block_i"]) == want, (heads, tokens, v.p)
        assert v.p["stages"] == 1 and v.p["threads"] == (128 if want[0] == 16 else 256)
        assert FWD.smem_bytes(v) <= sm120.max_smem_per_block
    v = FWD.select(sm120, {"heads": 64, "softmax_scale": SCALE}, 64)
    assert v.p["n_splits"] == sparse_mla.num_splits(64, 1, sm120.num_sms_hint, 1)   # one 99 KB CTA an SM
    bf16 = FWD.select(sm120, {"heads": 64, "softmax_scale": SCALE, "kv_format": "bf16"}, 64).p
    assert (bf16["head_block"], bf16["block_i"]) == (32, 32)
    assert sparse_mla.narrow_tile(64, get_profile("sm_90a")) == 32


def test_ctas_per_sm_counts_registers_and_shared_memory():
    # 128 threads at 255 registers: two CTAs by registers; the 72 KB 16-head tile (the cp.async stage): three fit
    # a Hopper SM's shared memory, one an SM12x SM's (100 KB)
    v16 = FWD.select(get_profile("sm_90a"), {"heads": 16, "softmax_scale": SCALE}, 64)
    assert (v16.p["head_block"], v16.p["threads"]) == (16, 128)
    assert sparse_mla.ctas_per_sm(get_profile("sm_90a"), FWD.smem_bytes(v16), 128) == 2
    assert sparse_mla.ctas_per_sm(get_profile("sm_120a"), FWD.smem_bytes(v16), 128) == 1
    assert v16.p["n_splits"] == 4          # 64 tokens x 4 splits = 256 CTAs = 132 SMs x 2, one wave
    assert FWD.select(get_profile("sm_120a"), {"heads": 16, "softmax_scale": SCALE}, 64).p["n_splits"] == 2
    v64 = FWD.select(get_profile("sm_90a"), {"heads": 64, "softmax_scale": SCALE}, 64)
    assert sparse_mla.ctas_per_sm(get_profile("sm_90a"), FWD.smem_bytes(v64), 256) == 1


def test_one_token_splits_up_to_64_and_never_past_the_sms():
    for arch in sorted(PROFILES):
        prof = get_profile(arch)
        v = FWD.select(prof, {"heads": 16, "softmax_scale": SCALE}, 1)
        assert v.p["n_splits"] == min(64, 1 << (prof.num_sms_hint.bit_length() - 1))


def test_workspace_is_bounded_and_zero_without_splits():
    prof = get_profile("sm_120a")
    assert ops.sparse_mla_workspace_numel(prof, 64, 4096) == 0
    most = ops.sparse_mla_workspace_max_numel(prof, 64, 256)
    assert 0 < most <= prof.num_sms_hint * 64 * 513  # (tokens x head blocks x splits) <= SMs, HB <= 64


@pytest.mark.parametrize("bad, match", [
    ({"heads": 0}, "heads"), ({"softmax_scale": 2.0}, "softmax_scale"), ({"kv_format": "fp16"}, "kv_format"),
    ({"head_dim": 576}, "head_dim"),
])
def test_select_rejects_bad_statics(bad, match):
    static = {"heads": 64, "softmax_scale": SCALE, **bad}
    with pytest.raises(ValueError, match=match):
        FWD.select(get_profile("sm_120a"), static, 1)


def test_q_is_validated_before_anything_runs():
    prof = get_profile("sm_120a")
    with pytest.raises(ValueError, match="q"):
        ops.sparse_mla_decode(torch.zeros(2, 512), None, None, None, None, block_size=64, arch=prof, get_kernel=None)
    with pytest.raises(ValueError, match="q: expected dtype"):
        ops.sparse_mla_decode(torch.zeros(2, 4, 512), None, None, None, None, block_size=64, arch=prof, get_kernel=None)


def _cuda_args(t=3, h=16, n=8, pages=2, bs=64):
    dev = "cuda"
    return dict(q=torch.zeros(t, h, 512, dtype=torch.bfloat16, device=dev),
                kv_cache=torch.zeros(pages, reference.page_bytes_for(bs), dtype=torch.uint8, device=dev),
                indices=torch.zeros(t, n, dtype=torch.int32, device=dev),
                lengths=torch.full((t,), n, dtype=torch.int32, device=dev),
                attn_sink=torch.zeros(h, device=dev))


@pytest.mark.gpu
@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(indices=a["indices"].long()), "indices: expected dtype"),
    (lambda a: a.update(lengths=a["lengths"][:2]), "lengths: expected shape"),
    (lambda a: a.update(kv_cache=a["kv_cache"].float()), "kv_cache: expected dtype torch.uint8"),
    (lambda a: a.update(kv_cache=a["kv_cache"][:, :1000].contiguous()), "kv_cache: a page of 64 tokens"),
    (lambda a: a.update(attn_sink=a["attn_sink"][:3]), "attn_sink: expected shape"),
    (lambda a: a["indices"].fill_(2 * 64), "indices: an entry inside its token's length is outside the cache"),
    (lambda a: a["lengths"].fill_(9), "lengths: every length must lie in"),
])
def test_decode_rejects_bad_tensors_with_the_argument_named(change, match):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a = _cuda_args()
    change(a)
    with pytest.raises(ValueError, match=match):
        ops.sparse_mla_decode(a["q"], a["kv_cache"], a["indices"], a["lengths"], a["attn_sink"], block_size=64,
                              arch=get_profile("sm_90a"), get_kernel=lambda *x: pytest.fail("launched"))


@pytest.mark.gpu
def test_decode_takes_the_cache_as_vllm_binds_it():
    """vLLM 0.33 binds the fp8_ds_mla cache as [num_blocks, states, 584] at a block stride rounded up to 576 B: the
    op reads it in place at that stride; a page that is not contiguous, or a stride past the storage, is refused."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dsv4_jit.kernels.attention.family import _vllm_view
    pages, bs = 3, 64
    stride = reference.page_bytes_for(bs)                        # 64 x 584 = 37,376 B -> 37,440 B
    buf = torch.zeros(pages, stride, dtype=torch.uint8, device="cuda")
    view = _vllm_view(buf, bs)
    assert not view.is_contiguous() and view.shape == (pages, bs, 584)
    n, pb, flat = ops._page_geometry(view, "kv_cache", bs, view.device)
    assert (n, pb) == (pages, stride) and flat.data_ptr() == buf.data_ptr() and flat.shape == (pages, stride)
    strided = torch.zeros(pages, bs, 2 * 584, dtype=torch.uint8, device="cuda")[:, :, :584]
    with pytest.raises(ValueError, match="kv_cache: a page's bytes must be contiguous"):
        ops._page_geometry(strided, "kv_cache", bs, strided.device)
    tight = torch.zeros((pages - 1) * stride + bs * 584, dtype=torch.uint8, device="cuda")
    short = tight.as_strided((pages, bs, 584), (stride, 584, 1))
    with pytest.raises(ValueError, match="overrun the tensor's storage"):
        ops._page_geometry(short, "kv_cache", bs, short.device)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["sm_90a", "sm_120a"])
def test_split_combine_never_uses_a_partial_that_was_not_written(schedule):
    """A split combine never multiplies a split's O that was not written: a NaN-filled workspace, a token whose second
    tile is all holes (its split writes lse = -inf and no O), a padded token of length 0 (out = 0) and a token at a
    very negative sink; every row finite and within tolerance of the float64 reference, on both schedules."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dsv4_jit import jit
    hopper = get_profile("sm_90a")
    prof = hopper if schedule == "sm_90a" else get_profile(schedule).emulated(hopper)
    g = torch.Generator().manual_seed(3)
    t, h, n, bs = 3, 64, 512, 64
    pages = 3 * n // bs + 1
    kv = torch.randn(pages * bs, sparse_mla.D, generator=g)
    cache = reference.pack_fp8_ds_mla(kv, torch.arange(pages * bs), pages, bs).cuda()
    idx = torch.randperm(pages * bs, generator=g)[: t * n].view(t, n).int()
    lens = torch.tensor([96, 0, n], dtype=torch.int32)
    idx[0, 32:64] = -1                                  # token 0: the split of its second tile has no candidate
    idx, lens = idx.cuda(), lens.cuda()
    q = (torch.randn(t, h, sparse_mla.D, generator=g) * 2).to(torch.bfloat16).cuda()
    sink = (torch.randn(h, generator=g) * 2).cuda()
    sink[h // 2:] = -1e4
    static = ops._static(h, SCALE, "fp8_ds_mla")
    assert FWD.select(prof, static, t).p["n_splits"] > 3    # token 0's 3 tiles leave the other splits empty
    ws = torch.full((ops.sparse_mla_workspace_numel(prof, h, t),), float("nan"), device="cuda")
    out = torch.full((t, h, sparse_mla.D), float("nan"), dtype=torch.bfloat16, device="cuda")
    ops.sparse_mla_decode(q, cache, idx, lens, sink, block_size=bs, out=out, workspace=ws, arch=prof,
                          get_kernel=lambda spec, st, nt: jit.load(spec, spec.select(prof, st, nt)))
    torch.cuda.synchronize()
    ref = reference.ref_sparse_mla(q, reference.unpack_fp8_ds_mla(cache, bs), idx, lens, None, None, None, sink, SCALE)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()
    for i in (0, 2):
        err = float(((out[i].double() - ref[i]).norm(dim=-1) / ref[i].norm(dim=-1).clamp_min(1e-30)).max())
        assert err < 1e-2, (i, err)


def test_fp8_operand_emulation_reproduces_the_reference_and_single_e4m3_q_misses_the_tolerance():
    # benchmarks/attention/fp8_operand_error.py: its bf16 form is the kernels' arithmetic (within the GPU cases'
    # tolerance), one e4m3 term for Q is far outside it, and two terms at one scale bring it back
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.attention import fp8_operand_error as fe
    from dsv4_jit.kernels.attention.family import TOLERANCE
    x = torch.randn(4, 7, 64, generator=torch.Generator().manual_seed(0)) * 3
    one, two = fe.as_e4m3(x, -1, 1), fe.as_e4m3(x, -1, 2)
    assert float((one - x).abs().max()) > 8 * float((two - x).abs().max())      # 3 mantissa bits, then ~7
    assert torch.equal(fe.as_e4m3(one, -1, 1), one)              # an e4m3 value at its own scale is kept exactly
    rows = {(r["q"], r["p"]): r["worst_token_error"] for r in fe.measure("deepseek-v4-flash", 2, 16, 0)
            if (r["ratio"], r["ctx"]) == (4, 65536)}
    assert rows[("bf16", "bf16")] < 3e-3
    assert rows[("e4m3 x2", "e4m3 x2")] < 3e-3
    assert rows[("e4m3", "bf16")] > TOLERANCE
