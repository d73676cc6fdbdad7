"""The MoE family on the CPU: the e2m1 -> e4m3 / f16 conversions the kernel does in registers, the routed-row layout
(moe_align) against a plain loop, the capacity bound, the float64 reference against a per-element transcription,
op validation (ValueError naming the argument before any kernel is selected), shapes from the model config at
TP 1/2/4/8 and the schedules' shared memory on every arch. GPU correctness: the registry-driven cases
(tests/test_families.py, family "moe")."""
from __future__ import annotations

import pytest
import torch

from dsv4_jit.arch import PROFILES, ctas_by_smem, get_profile
from dsv4_jit.kernels.moe import fp4_moe_gemm as kmod
from dsv4_jit.kernels.moe import ops, reference
from dsv4_jit.kernels.moe.family import moe_shapes
from dsv4_jit.kernels.quant.reference import E2M1_VALUES
from dsv4_jit.model_config import EMBEDDED, load_model_config
from dsv4_jit.spec import Variant, get_spec
from dsv4_jit.testing import select_only_getter

SM120 = get_profile("sm_120a")


def _signed_values() -> list[float]:
    return [E2M1_VALUES[n & 7] * (-1.0 if n & 8 else 1.0) for n in range(16)]


def test_the_kernels_word_conversion_decodes_every_nibble():
    """SM12x's form turns one packed word (8 e2m1 weights) into its two mma registers by bit placement, bytes
    (e0, e2, e4, e6) and (e1, e3, e5, e7): every 16-bit pattern in either half (the other varied) decodes to torch's
    float8_e4m3fn of each nibble's value x 2^-6 (exact: normal and subnormal e4m3), which the kernel undoes with one
    multiply by E4M3_UNSCALE."""
    table = torch.tensor(_signed_values(), dtype=torch.float32) / kmod.E4M3_UNSCALE
    table8 = table.to(torch.float8_e4m3fn)
    assert torch.equal(table8.float() * kmod.E4M3_UNSCALE, torch.tensor(_signed_values()))
    order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])     # register 0's bytes, then register 1's
    for half in (0, 1):
        v = torch.arange(1 << 16, dtype=torch.int64)
        other = (v * 40503) & 0xFFFF
        words = (other << 16 | v) if half == 0 else (v << 16 | other)
        regs = [kmod.e4m3_quads_py(int(w)) for w in words.tolist()]
        got = torch.tensor([[r >> (8 * i) & 0xFF for r in rg for i in range(4)] for rg in regs], dtype=torch.uint8)
        nibs = (words[:, None] >> (4 * torch.arange(8))[None]) & 0xF
        want = table8[nibs[:, order]].view(torch.uint8)
        assert torch.equal(got, want), half


def test_hoppers_word_conversion_gives_exact_f16_halves():
    """Hopper's form turns the same word into four f16x2 registers by bit placement, (e0, e4), (e1, e5), (e2, e6),
    (e3, e7), the lower element in the low half: every 16-bit pattern in either half (the other varied) decodes to
    torch's float16 of each nibble's value x 2^-14 (exact: normal and subnormal f16), which the kernel undoes with
    one multiply by F16_UNSCALE."""
    table = (torch.tensor(_signed_values(), dtype=torch.float64) / kmod.F16_UNSCALE).to(torch.float16)
    assert torch.equal(table.double() * kmod.F16_UNSCALE, torch.tensor(_signed_values()).double())
    for half in (0, 1):
        v = torch.arange(1 << 16, dtype=torch.int64)
        other = (v * 40503) & 0xFFFF
        words = (other << 16 | v) if half == 0 else (v << 16 | other)
        regs = [kmod.f16_pairs_py(int(w)) for w in words.tolist()]
        got = torch.tensor([[r >> (16 * i) & 0xFFFF for r in rg for i in (0, 1)] for rg in regs],
                           dtype=torch.int32).to(torch.int16).view(torch.float16)
        nibs = (words[:, None] >> (4 * torch.arange(8))[None]) & 0xF
        order = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])     # register p holds elements p (low) and p + 4 (high)
        want = table[nibs[:, order]]
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), half


def test_moe_operand_per_family():
    """SM12x keeps fp8 mma.sync (native there) at every block size; Hopper (whose fp8 mma.sync ptxas emulates) runs
    the e4m3 form on 8-row blocks (one n8 half: each weight fragment unpacked once) and converts to f16 itself from
    16-row blocks on."""
    spec = get_spec("fp4_moe_gemm")
    for t in (1, 8, 256, 257, 4096):
        assert "operand" not in spec.select(get_profile("sm_120a"), {"n": 4096, "k": 4096}, t).p
        p = spec.select(get_profile("sm_90a"), {"n": 4096, "k": 4096}, t).p
        assert p.get("operand") == (None if p["block_m"] == 8 else "float16") and (p["block_m"] == 8) == (t <= 256)
    for t in (1, 8, 64, 200, 600):   # two stages a warp at every token count (the budget may cap it lower)
        for arch in ("sm_90a", "sm_120a"):
            assert spec.select(get_profile(arch), {"n": 4096, "k": 4096}, t).p["stages"] == 2
    # the SM120 schedule proven on an H100 keeps the SM12x instruction stream
    emulated = get_profile("sm_120a").emulated(get_profile("sm_90a"))
    assert emulated.fp8_mma_operand == "float8_e4m3"
    assert "operand" not in spec.select(emulated, {"n": 4096, "k": 4096}, 8).p
    with pytest.raises(ValueError, match="operand"):
        kmod.build_fp4_moe_gemm(n=4096, k=4096, block_m=16, block_n=64, stages=2, threads=128, operand="bfloat16")


@pytest.mark.parametrize("t,topk,experts,block_m", [(1, 6, 8, 8), (7, 6, 8, 16), (33, 2, 5, 32), (200, 6, 256, 8),
                                                    (300, 8, 16, 64), (5, 1, 1, 16)])
def test_moe_align_matches_a_plain_loop(t, topk, experts, block_m):
    g = torch.Generator().manual_seed(t * 1000 + experts)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] if topk <= experts
                       else torch.randint(0, experts, (topk,), generator=g) for _ in range(t)]).int()
    rows, blocks = ops.moe_align(ids, experts, block_m)
    cap = ops.moe_capacity(t, topk, experts, block_m)
    want_rows, want_blocks = reference.ref_moe_align(ids, experts, block_m, cap)
    assert rows.dtype == blocks.dtype == torch.int32
    assert rows.shape == (cap,) and blocks.shape == (cap // block_m,)
    assert torch.equal(rows.long(), want_rows) and torch.equal(blocks.long(), want_blocks)


@pytest.mark.parametrize("block_m", [8, 16, 32, 64])
def test_capacity_holds_the_worst_routings(block_m):
    t, topk, experts = 10, 6, 64
    cap = ops.moe_capacity(t, topk, experts, block_m)
    routings = [torch.zeros(t, topk, dtype=torch.int32),                                  # one expert takes all
                torch.arange(t * topk, dtype=torch.int32).reshape(t, topk) % experts]     # one row per expert
    for ids in routings:
        rows, blocks = ops.moe_align(ids, experts, block_m)
        used = int((blocks >= 0).sum()) * block_m
        assert used <= cap and rows.numel() == cap
        assert sorted(rows[rows >= 0].tolist()) == list(range(t * topk))    # every routed entry exactly once


def test_moe_align_rejects_bad_input():
    with pytest.raises(ValueError, match="topk_ids"):
        ops.moe_align(torch.zeros(3, 2), 4, 16)
    with pytest.raises(ValueError, match="topk_ids: expert ids"):
        ops.moe_align(torch.full((3, 2), 4, dtype=torch.int32), 4, 16)
    with pytest.raises(ValueError, match="block_m"):
        ops.moe_align(torch.zeros(3, 2, dtype=torch.int32), 4, 0)


def test_reference_matches_a_per_element_transcription():
    g = torch.Generator().manual_seed(0)
    e, n, k, bm = 3, 4, 256, 16
    w, sw = reference.quantize_expert_weights(torch.randn(e, n, k, generator=g))
    ids = torch.tensor([[0, 2], [2, 1], [0, 1]], dtype=torch.int32)
    rows, blocks = ops.moe_align(ids, e, bm)
    x = torch.randn(3, k, generator=g)
    from dsv4_jit.kernels.quant.reference import ref_act_quant_fp8
    a_tok, sa_tok = ref_act_quant_fp8(x.to(torch.bfloat16))
    src = (rows.clamp(min=0) // 2).long()
    a, sa = a_tok[src], sa_tok[src]
    got = reference.ref_fp4_moe_gemm(a, sa, w, sw, blocks, bm)
    table = E2M1_VALUES
    for r in range(a.shape[0]):
        ex = int(blocks[r // bm])
        for j in range(n):
            if ex < 0:
                assert got[r, j] == 0
                continue
            acc = 0.0
            for kk in range(k):
                byte = int(w[ex, j, kk // 2])
                nib = (byte >> (4 * (kk % 2))) & 15
                wv = table[nib & 7] * (-1 if nib & 8 else 1) * 2.0 ** (int(sw[ex, j, kk // 32]) - 127)
                acc += float(a[r, kk].float()) * float(sa[r, kk // 128]) * wv
            assert abs(float(got[r, j]) - acc) <= 1e-9 * max(1.0, abs(acc)), (r, j)


def test_quantized_weights_round_trip():
    g = torch.Generator().manual_seed(1)
    wf = torch.randn(2, 8, 128, generator=g)
    w, sw = reference.quantize_expert_weights(wf)
    assert w.shape == (2, 8, 64) and sw.shape == (2, 8, 4) and w.dtype == sw.dtype == torch.uint8
    back = torch.stack([reference.dequant_expert(w, sw, i) for i in range(2)])
    # e2m1 keeps ~1 significant bit: per-group error <= half the top step (1 of 6) times the scale
    err = (back - wf.double()).abs().reshape(2, 8, 4, 32).amax(-1)
    assert (err <= (wf.abs().reshape(2, 8, 4, 32).amax(-1).double() / 6.0 * 2.0 ** 1) + 1e-12).all()


# ------------------------------------------------------------------------------------------ op validation
def _op_args(m=32, e=2, n=128, k=256):
    return dict(a=torch.zeros(m, k, dtype=torch.float8_e4m3fn), a_scales=torch.ones(m, k // 128),
                w=torch.zeros(e, n, k // 2, dtype=torch.uint8), w_scales=torch.zeros(e, n, k // 32, dtype=torch.uint8),
                block_expert=torch.zeros(m // 8, dtype=torch.int32))


@pytest.mark.parametrize("bad,match", [
    (dict(w=torch.zeros(2, 100, 128, dtype=torch.uint8)), "w: .*multiple of 128"),
    (dict(w=torch.zeros(2, 128, 128)), "w: expected dtype"),
    (dict(w_scales=torch.zeros(2, 128, 4)), "w_scales: expected dtype"),
    (dict(w_scales=torch.zeros(2, 128, 9, dtype=torch.uint8)), "w_scales: expected shape"),
    (dict(a=torch.zeros(32, 256)), "a: expected dtype"),
    (dict(a=torch.zeros(33, 256, dtype=torch.float8_e4m3fn), a_scales=torch.ones(33, 2)),
     "a: 33 rows is not a multiple of block_m = 8"),
    (dict(a_scales=torch.ones(32, 3)), "a_scales: expected shape"),
    (dict(block_expert=torch.zeros(3, dtype=torch.int32)), "block_expert: expected shape"),
])
def test_op_validates_before_launching(bad, match, cpu_tensors_ok):
    """block_m comes from the selected variant: the getter selects (as serving does) and must not launch."""
    args = {**_op_args(), **bad}
    with pytest.raises(ValueError, match=match):
        ops.fp4_moe_gemm(**args, num_tokens=1, arch=SM120, get_kernel=select_only_getter(SM120))


def test_op_refuses_cpu_tensors_and_bad_token_counts():
    def never(*a, **k):
        raise AssertionError
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.fp4_moe_gemm(**_op_args(), num_tokens=1, arch=SM120, get_kernel=never)
    with pytest.raises(ValueError, match="num_tokens"):
        ops.fp4_moe_gemm(**_op_args(), num_tokens=0, arch=SM120, get_kernel=never)
    with pytest.raises(ValueError, match="arch"):
        ops.fp4_moe_gemm(**_op_args(), num_tokens=1, arch="sm_120a", get_kernel=never)


# ------------------------------------------------------------------------------------------ shapes, select
@pytest.mark.parametrize("model", EMBEDDED)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_shapes_come_from_the_config(model, tp):
    m = load_model_config(model)
    w13, w2 = moe_shapes(m, tp)
    inter = m.moe_intermediate_size // tp
    assert (w13["n"], w13["k"]) == (2 * inter, m.hidden_size) and (w2["n"], w2["k"]) == (m.hidden_size, inter)
    with pytest.raises(ValueError, match="not divisible"):
        moe_shapes(m, 7)


@pytest.mark.parametrize("arch", sorted(PROFILES))
def test_block_m_follows_the_token_count_and_fits(arch):
    spec = get_spec("fp4_moe_gemm")
    prof = get_profile(arch)
    got = {t: spec.select(prof, {"n": 6144, "k": 7168}, t).p["block_m"]
           for t in (1, 256, 257, 512, 513, 2048, 2049, 16384)}
    assert got == {1: 8, 256: 8, 257: 16, 512: 16, 513: 32, 2048: 32, 2049: 64, 16384: 64}
    for t in (1, 300, 600, 5000):
        v = spec.select(prof, {"n": 6144, "k": 7168}, t)
        assert spec.smem_bytes(v) <= prof.max_smem_per_block <= 232_448
    if prof.family == "blackwell_consumer":
        assert spec.smem_bytes(spec.select(prof, {"n": 6144, "k": 7168}, 9999)) <= 101_376
    assert ops.fp4_moe_block_m(4096, 4096, 600, arch=prof) == 32


@pytest.mark.parametrize("static,match", [({"k": 4096}, "static params lack 'n'"), ({"n": 100, "k": 4096}, "n must be a positive multiple of 128"),
                                          ({"n": 4096, "k": 4000}, "k must be a positive multiple of 128"),
                                          ({"n": True, "k": 4096}, "n must be")])
def test_select_rejects_bad_statics(static, match):
    with pytest.raises(ValueError, match=f"fp4_moe_gemm: {match}"):
        get_spec("fp4_moe_gemm").select(SM120, static, 1)


def test_stages_never_exceed_the_k_blocks():
    spec = get_spec("fp4_moe_gemm")
    # one warp per K block up to 4, 2 stages a warp where a warp walks 2 K blocks or more and they fit the budget;
    # 64 weight columns a CTA (32 at one token where each warp has one K block), 32 for 64-row blocks
    dec = [spec.select(SM120, {"n": 4096, "k": k}, 1).p for k in (128, 256, 384, 512, 1024, 7168)]
    assert [(p["threads"], p["stages"]) for p in dec] == [(32, 1), (64, 1), (96, 1), (128, 1), (128, 2), (128, 2)]
    assert [p["block_n"] for p in dec] == [32, 32, 32, 32, 64, 64]
    # from two tokens on, 64 columns again (Hopper: the WGMMA form, 64 columns throughout)
    assert [spec.select(SM120, {"n": 7168, "k": 384}, t).p["block_n"] for t in (1, 2, 8)] == [32, 64, 64]
    assert {spec.select(get_profile("sm_90a"), {"n": 7168, "k": 384}, t).p.get("operand") for t in (1, 2, 8)} == {
        kmod.WGMMA}
    assert all(p["block_m"] == 8 for p in dec)
    # a stage: 64 weight rows x 64 B + 8 routed rows x 128 B, twice, a warp; the exponents; the activation scales
    assert kmod.moe_smem_bytes(dec[-1]) == 4 * 2 * 5120 + 64 * (224 + 16) + 4 * 8 * 57 == 58_144
    assert kmod.moe_smem_bytes(spec.select(SM120, {"n": 4096, "k": 7168}, 300).p) == 68_160   # 16 rows
    big = {t: spec.select(SM120, {"n": 4096, "k": 7168}, t).p for t in (600, 4096)}
    assert [(p["block_m"], p["block_n"], p["stages"]) for p in big.values()] == [(32, 64, 2), (64, 32, 1)]
    # two stages of 64 rows at K = 7168 would overflow SM12x (104,192 B); Hopper keeps them
    assert kmod.moe_smem_bytes({**big[4096], "stages": 2}) == 104_192 > 101_376 >= kmod.moe_smem_bytes(big[4096])
    assert spec.select(get_profile("sm_90a"), {"n": 4096, "k": 7168}, 4096).p["stages"] == 2
    with pytest.raises(ValueError, match="not a tile of this kernel"):
        kmod.build_fp4_moe_gemm(**{**dec[-1], "block_n": 80})
    with pytest.raises(ValueError, match="not a tile of this kernel"):   # 16 x 128 accumulators: too many a lane
        kmod.build_fp4_moe_gemm(**{**dec[-1], "block_m": 32, "block_n": 128})
    # Hopper at a few tokens: eight warps where a warp's K walk is the longest (V4-Pro w1+w3, K = 7,168) and N is
    # wide (TP 1 / 2) or the token one; four elsewhere (V4-Flash's K = 4,096 and below, 9+ tokens, the narrow
    # 32-column tiles of N <= 1,536 at 2..16 tokens, SM12x)
    hopper = get_profile("sm_90a")
    warps = {(k, t): spec.select(hopper, {"n": 3072, "k": k}, t).p["threads"] // 32
             for k in (2048, 4096, 7168) for t in (1, 8, 9)}
    assert warps == {(2048, 1): 4, (2048, 8): 4, (2048, 9): 4, (4096, 1): 4, (4096, 8): 4, (4096, 9): 4,
                     (7168, 1): 8, (7168, 8): 8, (7168, 9): 4}
    assert [spec.select(hopper, {"n": 768, "k": 7168}, t).p["threads"] // 32 for t in (1, 2, 8, 9)] == [8, 4, 8, 4]
    assert spec.select(hopper, {"n": 768, "k": 7168}, 1).p["stages"] == 2
    assert kmod.moe_smem_bytes(spec.select(hopper, {"n": 768, "k": 7168}, 1).p) == 78_880   # 48 columns
    assert spec.select(SM120, {"n": 768, "k": 7168}, 1).p["threads"] == 128
    # warps split K: at most MAX_WARPS, never more than the K blocks (K = 384: 3)
    for bad in ({**dec[-1], "threads": 32 * (kmod.MAX_WARPS + 1)}, {**dec[2], "threads": 128}, {**dec[-1], "threads": 100}):
        with pytest.raises(ValueError, match="not a tile of this kernel"):
            kmod.build_fp4_moe_gemm(**bad)


def test_op_refuses_misaligned_views(cpu_tensors_ok):
    args = _op_args()
    buf = torch.zeros(32 * 256 + 1, dtype=torch.uint8)[1:].view(torch.float8_e4m3fn).view(32, 256)
    with pytest.raises(ValueError, match="a: data pointer must be 16-byte aligned"):
        ops.fp4_moe_gemm(**{**args, "a": buf}, num_tokens=1, arch=SM120, get_kernel=None)


@pytest.mark.gpu
def test_moe_align_is_graph_capturable_and_exact_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    t, topk, experts, bm = 37, 6, 64, 16
    ids = torch.stack([torch.randperm(experts)[:topk] for _ in range(t)]).int().cuda()
    rows, blocks = ops.moe_align(ids, experts, bm)          # warm (allocator, kernels) outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rows, blocks = ops.moe_align(ids, experts, bm)
    ids.copy_(torch.stack([torch.randperm(experts)[:topk] for _ in range(t)]).int().cuda())
    g.replay()
    torch.cuda.synchronize()
    want_rows, want_blocks = reference.ref_moe_align(ids.cpu(), experts, bm, rows.numel())
    assert torch.equal(rows.cpu().long(), want_rows) and torch.equal(blocks.cpu().long(), want_blocks)


# ------------------------------------------------------------------------------------------ routing
def test_route_reference_matches_a_literal_transcription():
    import math
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 64, generator=g) * 3
    logits[:, 10] = logits[:, 20]                          # a tie in s
    bias = torch.randn(64, generator=g) * 0.1
    bias[20] = bias[10]                                    # ... and in s + bias: expert 10 must win
    ids, w = reference.ref_moe_route(logits, bias, None, 6, 2.5)
    for t in range(5):
        s = [math.sqrt(math.log1p(math.exp(float(x)))) for x in logits[t].float()]
        order = sorted(range(64), key=lambda e: (-(s[e] + float(bias[e])), e))[:6]
        assert ids[t].tolist() == order
        tot = sum(s[e] for e in order)
        assert [round(v, 6) for v in w[t].tolist()] == [round(s[e] / tot * 2.5, 6) for e in order]
    hashed = torch.tensor([[3, 1, 2, 0, 5, 4]] * 5, dtype=torch.int32)
    ids_h, w_h = reference.ref_moe_route(logits, None, hashed, 6, 1.0)
    assert torch.equal(ids_h, hashed.long()) and torch.allclose(w_h.sum(1), torch.ones(5, dtype=torch.float64))


@pytest.mark.parametrize("kw,match", [
    (dict(bias=None, hash_ids=None), "pass exactly one"),
    (dict(bias=torch.zeros(256), hash_ids=torch.zeros(3, 6, dtype=torch.int32)), "pass exactly one"),
    (dict(bias=torch.zeros(255)), "bias: expected shape"),
    (dict(bias=torch.zeros(256, dtype=torch.float64)), "bias: expected dtype"),
    (dict(hash_ids=torch.zeros(3, 5, dtype=torch.int32)), "hash_ids: expected shape"),
    (dict(bias=torch.zeros(256), routed_scaling=0.0), "routed_scaling"),
    (dict(bias=torch.zeros(256), topk=0), "topk must be"),
])
def test_route_validates_before_selecting(kw, match, cpu_tensors_ok):
    args = dict(topk=6, routed_scaling=1.5)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ops.moe_route(torch.zeros(3, 256), **args, arch=SM120, get_kernel=select_only_getter(SM120))


def test_route_select_rejects_unsupported_statics():
    spec = get_spec("moe_route")
    with pytest.raises(ValueError, match="experts=200 is not supported"):
        spec.select(SM120, {"experts": 200, "topk": 6, "hashed": False}, 1)
    with pytest.raises(ValueError, match="hashed must be a bool"):
        spec.select(SM120, {"experts": 256, "topk": 6, "hashed": 1}, 1)
    v = spec.select(SM120, {"experts": 384, "topk": 6, "hashed": False}, 5000)
    assert spec.smem_bytes(v) == 4 * 6 * 8 + 128 * 4 * 3 <= 101_376


# ------------------------------------------------------------------------------------------ combine
@pytest.mark.parametrize("t,topk,experts,bm", [(1, 6, 8, 16), (9, 6, 64, 16), (40, 2, 5, 32)])
def test_entry_rows_invert_the_layout(t, topk, experts, bm):
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(t)]).int()
    rows, _ = ops.moe_align(ids, experts, bm)
    inv = ops.moe_entry_rows(rows, t * topk)
    assert inv.dtype == torch.int32 and torch.equal(inv.long(), reference.ref_moe_entry_rows(rows, t * topk))
    assert torch.equal(rows[inv.long()].long(), torch.arange(t * topk))      # each entry's row holds that entry


def test_combine_reference_matches_a_literal_sum():
    g = torch.Generator().manual_seed(5)
    c = torch.randn(12, 8, generator=g).to(torch.bfloat16)
    rows = torch.tensor([3, 0, 11, 5, -1, 7], dtype=torch.int32)
    w = torch.rand(3, 2, generator=g)
    got = reference.ref_moe_combine(c, rows, w)
    for t in range(3):
        for q in range(8):
            want = sum(float(w[t, j]) * float(c[int(rows[t * 2 + j]), q]) for j in range(2) if int(rows[t * 2 + j]) >= 0)
            assert abs(float(got[t, q]) - want) < 1e-12


@pytest.mark.parametrize("kw,match", [
    (dict(weights=torch.zeros(3, 6, dtype=torch.float64)), "weights: expected dtype"),
    (dict(c=torch.zeros(32, 64)), "c: expected dtype"),
    (dict(entry_rows=torch.zeros(17, dtype=torch.int32)), "entry_rows: expected shape"),
    (dict(weights=torch.zeros(3, 20), entry_rows=torch.zeros(60, dtype=torch.int32)), "topk must be <= 16"),
])
def test_combine_validates_before_selecting(kw, match, cpu_tensors_ok):
    args = dict(c=torch.zeros(32, 64, dtype=torch.bfloat16), entry_rows=torch.zeros(18, dtype=torch.int32),
                weights=torch.zeros(3, 6))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ops.moe_combine(**args, arch=SM120, get_kernel=select_only_getter(SM120))


def test_rings_and_wide_tiles_follow_the_token_count():
    spec = get_spec("fp4_moe_gemm")
    hopper = get_profile("sm_90a")

    def pick(arch, n, k, t):
        p = spec.select(arch, {"n": n, "k": k}, t).p
        return p["block_n"], p["threads"] // 32, p["stages"]
    # 2 stages a warp at every token count on both families; V4-Pro's w1+w3 at up to 8 tokens runs 8 warps on Hopper
    flash = {t: pick(hopper, 4096, 4096, t) for t in (1, 3, 4, 8, 64, 128, 129, 256)}
    assert set(flash.values()) == {(64, 4, 2)}
    assert [pick(hopper, 6144, 7168, t) for t in (1, 8, 9, 128)] == [(96, 8, 2), (64, 8, 2), (64, 4, 2), (64, 4, 2)]
    p64 = spec.select(hopper, {"n": 768, "k": 7168}, 64).p
    assert kmod.moe_smem_bytes(p64) == 58_144 and ctas_by_smem(hopper, 58_144) == 3
    for arch in ("sm_120a", "sm_121a"):
        assert {pick(get_profile(arch), 4096, 4096, t)[2] for t in (1, 4, 64, 128, 256)} == {2}
    # Hopper, w2 at TP 1 (V4-Flash K = 2,048, V4-Pro 3,072: 16 / 24 K blocks) from 5 to 16 tokens: 32 columns x 3
    # stages; TP 2 (8 / 12 K blocks) and SM12x keep 64 x 2
    for n, k in ((4096, 2048), (7168, 3072)):
        assert [pick(hopper, n, k, t) for t in (4, 5, 8, 16, 17)] == [
            (64, 4, 2), (32, 4, 3), (32, 4, 3), (32, 4, 3), (64, 4, 2)]
    for n, k in ((4096, 1024), (7168, 1536)):
        assert {pick(hopper, n, k, t) for t in (5, 8, 16)} == {(64, 4, 2)}
    assert {pick(SM120, 4096, 2048, t) for t in (5, 8, 16)} == {(64, 4, 2)}
    # 128 weight rows a CTA where a warp walks one K block (w2 at TP 8, K = 384 / 256) from 32 to 256 tokens, 32 at
    # one token
    for arch in (SM120,):   # Hopper: the WGMMA form (test_hopper_takes_the_wgmma_form_for_short_k_walks)
        assert [pick(arch, 7168, 384, t) for t in (1, 8, 31, 32, 64, 256, 257)] == [
            (32, 3, 1), (64, 3, 1), (64, 3, 1), (128, 3, 1), (128, 3, 1), (128, 3, 1), (64, 3, 1)]
        assert pick(arch, 4096, 256, 64) == (128, 2, 1)
        assert pick(arch, 4096, 2048, 64)[0] == 64          # 16 K blocks: not a short walk
        assert spec.smem_bytes(spec.select(arch, {"n": 7168, "k": 384}, 64)) <= 101_376
    # Hopper, a long K walk over a narrow N (V4-Pro w1+w3 at TP 4 / 8): 32 columns from 2 to 16 tokens, 4 warps but 8
    # from 5 to 8 tokens (and where the few-token spread takes 48: test_few_token_tiles_spread_the_grid_over_the_sms),
    # 8 warps x 48 / 96 columns at one token, 64 columns again from 17; wider N (TP 1 / 2) and SM12x keep 64 columns
    # from two tokens
    for n, one, two, four in ((768, 48, 32, 48), (1536, 96, 48, 32)):
        assert [pick(hopper, n, 7168, t) for t in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [
            (one, 8, 2), (two, 4, 2), (32, 4, 2), (four, 4, 2), (32, 8, 2), (32, 8, 2), (32, 4, 2), (32, 4, 2),
            (64, 4, 2), (64, 4, 2)]
    assert [pick(hopper, 3072, 7168, t)[0] for t in (2, 8, 16)] == [96, 64, 64]   # 2 tokens: the spread
    assert {pick(SM120, 768, 7168, t)[:2] for t in (1, 2, 8, 16)} == {(64, 4)}
    assert pick(hopper, 768, 4096, 8) == (64, 4, 2)                  # K = 4,096: 32 K blocks, not a long walk
    narrow = spec.select(hopper, {"n": 768, "k": 7168}, 8)
    assert ctas_by_smem(hopper, spec.smem_bytes(narrow)) >= 2


def test_few_token_tiles_spread_the_grid_over_the_sms():
    """At 1-4 tokens a token's 6 experts make the grid (6 x tokens x N / cols CTAs at most): where the usual tile leaves
    the busiest SM at most 5 CTAs, Hopper takes the tile whose busiest SM walks the fewest weight rows (the usual one on
    a tie, else the wider), and 8 warps where every CTA has an SM of its own. Short K walks keep ONE_TOKEN_COLS; SM12x,
    5+ tokens and grids past the cap their usual tiles."""
    spec = get_spec("fp4_moe_gemm")
    hopper = get_profile("sm_90a")

    def pick(arch, n, k, t=1):
        p = spec.select(arch, {"n": n, "k": k}, t).p
        return p["block_n"], p["threads"] // 32
    # V4-Pro w1+w3 at TP 1 / 2 / 4 / 8 (K = 7,168), one token: 384 / 384 / 96 / 96 CTAs on 132 SMs
    assert [pick(hopper, n, 7168) for n in (6144, 3072, 1536, 768)] == [(96, 8), (48, 8), (96, 8), (48, 8)]
    # V4-Flash w1+w3 at TP 1 / 2 / 4 / 8 (K = 4,096): 4 warps where CTAs share SMs, 8 where each has its own
    assert [pick(hopper, n, 4096) for n in (4096, 2048, 1024, 512)] == [(64, 4), (32, 4), (64, 8), (32, 8)]
    # 2-4 tokens: V4-Flash TP 8 / 4, V4-Pro TP 8 / 4 (their 32-column narrow tiles the usual ones there)
    assert [pick(hopper, 512, 4096, t) for t in (2, 3, 4, 5)] == [(64, 8), (32, 4), (32, 4), (64, 4)]
    assert [pick(hopper, 1024, 4096, t) for t in (2, 3, 4)] == [(32, 4), (32, 4), (64, 4)]
    assert [pick(hopper, 768, 7168, t) for t in (2, 3, 4, 5)] == [(32, 4), (32, 4), (48, 4), (32, 8)]
    assert [pick(hopper, 1536, 7168, t) for t in (2, 3, 4)] == [(48, 4), (32, 4), (32, 4)]
    # past the cap (6+ CTAs an SM with the usual tile) nothing changes: V4-Pro's w2 (N = 7,168), TP 1 at 3-4 tokens
    assert [pick(hopper, 7168, k) for k in (3072, 1536, 768)] == [(64, 4)] * 3
    assert [pick(hopper, 6144, 7168, t) for t in (2, 3, 4)] == [(64, 8)] * 3
    assert pick(SM120, 7168, 384) == (32, 3) and pick(SM120, 4096, 512) == (32, 4)   # short walks: ONE_TOKEN_COLS
    assert kmod.busiest_rows(768, 64, 1, 132) == 64 and kmod.busiest_rows(768, 32, 1, 132) == 64
    assert kmod.spread_cols(768, 64, 1, 132) == 48 and kmod.spread_cols(768, 64, 1, 200) == 32
    assert kmod.spread_cols(4096, 64, 2, 132) == 64      # 128 columns tie with 64: the usual tile stays
    for arch in (SM120, get_profile("sm_121a")):
        assert {pick(arch, n, 7168, t) for n in (6144, 768) for t in (1, 2)} <= {(64, 4), (32, 4)}
        assert pick(arch, 512, 4096) == (64, 4)
    for n, k in ((6144, 7168), (1536, 7168), (768, 7168), (512, 4096)):
        assert spec.smem_bytes(spec.select(hopper, {"n": n, "k": k}, 1)) <= hopper.max_smem_per_block


def test_hopper_takes_the_wgmma_form_for_short_k_walks():
    """8-row blocks with K at most 6 K blocks (w2 at TP 4 / 8) run Hopper's WGMMA form: 64 columns over one warp
    group, 2 stages at one token and 3 above; 16-row blocks, longer K and SM12x keep the mma.sync forms. Its build is
    refused off its one tile."""
    spec = get_spec("fp4_moe_gemm")
    hopper = get_profile("sm_90a")
    for k in (256, 384, 512, 768):
        for t, st in ((1, 2), (8, 3), (256, 3)):
            p = spec.select(hopper, {"n": 7168, "k": k}, t).p
            assert (p["operand"], p["block_n"], p["threads"], p["stages"]) == (kmod.WGMMA, 64, 128, st)
            assert spec.smem_bytes(spec.select(hopper, {"n": 7168, "k": k}, t)) == kmod.wgmma_smem_bytes(k, st)
        assert spec.select(hopper, {"n": 7168, "k": k}, 257).p["operand"] == "float16"   # 16-row blocks
        assert spec.select(SM120, {"n": 7168, "k": k}, 8).p.get("operand") is None
    assert spec.select(hopper, {"n": 4096, "k": 1024}, 8).p.get("operand") is None    # 8 K blocks
    assert kmod.wgmma_smem_bytes(384, 3) == 3 * (64 * 64 + 8 * 128) + 1024 + 64 * (12 + 4) + 4 * 8 * 4
    with pytest.raises(ValueError, match="WGMMA form"):
        spec.build(Variant.make("fp4_moe_gemm", {**spec.select(hopper, {"n": 7168, "k": 384}, 8).p, "block_n": 32},
                                hopper, "sm_90a"))
    with pytest.raises(ValueError, match="2..8 stages"):
        kmod.build_fp4_moe_gemm_wgmma(n=7168, k=384, stages=9)
