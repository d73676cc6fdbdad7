"""Indexer family, CPU side: references against literal transcriptions, the top-k set check, op validation
(ValueError naming the argument before any kernel is selected), and the schedules' shared-memory figures.
GPU correctness is in the family's GpuCases (tests/test_families.py -m gpu -k indexer)."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4_jit.arch import get_profile
from dsv4_jit.kernels.indexer import family, ops, reference
from dsv4_jit.model_config import ParallelConfig, load_model_config
from dsv4_jit.spec import get_spec


def _literal_decode(q8, qs, w, k, ks, seq_lens, next_n, ratio, width):
    t_all, heads, _ = q8.shape
    out = [[float("-inf")] * width for _ in range(t_all)]
    for t in range(t_all):
        b, g = divmod(t, next_n)
        n = min(max(int(seq_lens[b]) - next_n + g + 1, 0) // ratio, width)
        for j in range(n):
            acc = 0.0
            for h in range(heads):
                dot = sum(float(q8[t, h, d]) * float(k[b][j, d]) for d in range(q8.shape[2]))
                acc += float(w[t, h]) * max(dot, 0.0)
            out[t][j] = acc * float(qs[t]) * float(ks[b][j])
    return torch.tensor(out, dtype=torch.float64)


def test_ref_decode_logits_matches_literal():
    g = torch.Generator().manual_seed(0)
    heads, dim, page, next_n, ratio = 4, 8, 4, 2, 4
    seq_lens = torch.tensor([37, 3, 20], dtype=torch.int32)
    comp = [int(s) // ratio for s in seq_lens]
    width = 12
    max_pages = 4
    pages_needed = [-(-c // page) for c in comp]
    total = sum(pages_needed) + 1
    perm = torch.randperm(total, generator=g)
    bt = torch.full((3, max_pages), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages_needed):
        bt[i, :n] = perm[at:at + n].int()
        at += n
    k8, kscale = reference.quantize_rows_fp8(torch.randn(total * page, dim, generator=g))
    cache = reference.pack_paged_cache(k8, kscale, page)
    q8, qs = reference.quantize_rows_fp8(torch.randn(6, heads * dim, generator=g))
    q8 = q8.view(6, heads, dim)
    w = torch.randn(6, heads, generator=g)
    got, info = reference.ref_decode_logits(q8, qs, w, cache, seq_lens, bt, next_n, width, ratio)
    # literal: per request, its positions' K rows through the block table
    kd = k8.double()
    per_req_k, per_req_s = [], []
    for b in range(3):
        rows = [int(bt[b, j // page]) * page + j % page if j < comp[b] else 0 for j in range(width)]
        per_req_k.append(kd[rows])
        per_req_s.append(kscale.double()[rows])
    want = _literal_decode(q8.double(), qs, w, per_req_k, per_req_s, seq_lens, next_n, ratio, width)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = ~torch.isinf(want)
    assert torch.allclose(got[fin], want[fin], rtol=1e-9, atol=1e-12)
    assert info[:, 1].tolist() == [min(max(int(seq_lens[t // 2]) - 2 + t % 2 + 1, 0) // 4, width) for t in range(6)]


def test_pack_unpack_roundtrip():
    g = torch.Generator().manual_seed(1)
    k8, ks = reference.quantize_rows_fp8(torch.randn(128, 128, generator=g))
    cache = reference.pack_paged_cache(k8, ks, 64)
    assert cache.shape == (2, 64 * 132) and cache.dtype == torch.uint8
    k, page = reference.unpack_paged_cache(cache, 128)
    assert page == 64
    assert torch.equal(k, k8.double() * ks.double()[:, None])


def test_ref_prefill_matches_decode_on_one_request():
    """The same request seen through the ragged path (contiguous K, ks/ke) and the paged path agree."""
    g = torch.Generator().manual_seed(2)
    heads, dim, page = 4, 16, 8
    ctx = 50
    comp = ctx // 4
    k8, kscale = reference.quantize_rows_fp8(torch.randn(16, dim, generator=g))
    cache = reference.pack_paged_cache(k8, kscale, page)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    q8, qs = reference.quantize_rows_fp8(torch.randn(1, heads * dim, generator=g))
    q8 = q8.view(1, heads, dim)
    w = torch.randn(1, heads, generator=g)
    dec, _ = reference.ref_decode_logits(q8, qs, w, cache, torch.tensor([ctx], dtype=torch.int32), bt, 1, 16)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    pre, info = reference.ref_prefill_logits(q8, qs, w, k8, kscale, i32([0]), i32([comp]), i32([0]), 16)
    assert torch.equal(dec, pre) and info.tolist() == [[0, comp, 0]]


def test_topk_set_check_accepts_any_tie_order_and_rejects_wrong_sets():
    g = torch.Generator().manual_seed(3)
    width, k, page = 40, 8, 4
    lg = (torch.randn(3, width, generator=g) * 2).round() / 2       # ties
    info = torch.tensor([[0, 40, 0], [5, 30, 1], [0, 6, 2]])
    bt = torch.arange(30, dtype=torch.int32).view(3, 10)
    ref, lens = reference.ref_topk(lg, info, bt, k, page)
    assert lens.tolist() == [8, 8, 6]
    assert (ref[2, 6:] == -1).all()
    # another valid answer: reversed order; ties swapped for the equal value at the threshold when possible
    alt = ref.clone()
    alt[:, :6] = alt[:, :6].flip(1)
    assert torch.equal(reference.check_topk_sets(alt, lg, info, bt, k, page), alt)
    # a wrong answer: the largest replaced by the smallest candidate of row 0
    bad = ref.clone()
    smallest = int(lg[0].argmin())
    bad[0, 0] = int(bt[0, smallest // page]) * page + smallest % page
    want = reference.check_topk_sets(bad, lg, info, bt, k, page)
    assert not torch.equal(want[0], bad[0]) and torch.equal(want[1:], bad[1:])
    # duplicates are rejected
    dup = ref.clone()
    dup[1, 1] = dup[1, 0]
    assert not torch.equal(reference.check_topk_sets(dup, lg, info, bt, k, page)[1], dup[1])


def test_ref_swa_indices_literal():
    bt = torch.tensor([[-1, -1, 7, 3, 9], [4, -1, -1, -1, -1]], dtype=torch.int32)
    pos = torch.tensor([19, 2, 0], dtype=torch.int32)
    req = torch.tensor([0, 1, 1], dtype=torch.int32)
    idx, n = reference.ref_swa_indices(pos, req, bt, window=8, page_size=4)
    assert n.tolist() == [8, 3, 1]
    want0 = [int(bt[0, p // 4]) * 4 + p % 4 for p in range(12, 20)]
    assert idx[0].tolist() == want0
    assert idx[1].tolist() == [16, 17, 18] + [-1] * 5
    assert idx[2].tolist() == [16] + [-1] * 7


# --------------------------------------------------------------------------------------------- ops
def _no_kernel(*a, **k):
    raise AssertionError("a kernel was selected before every argument was validated")


ARCH = get_profile("sm_120a")


def _decode_args(dev="cpu"):
    q = torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn, device=dev)
    return dict(q=q, q_scale=torch.ones(2, device=dev), weights=torch.ones(2, 64, device=dev),
                kv_cache=torch.zeros(4, 64 * 132, dtype=torch.uint8, device=dev),
                seq_lens=torch.ones(2, dtype=torch.int32, device=dev),
                block_table=torch.zeros(2, 3, dtype=torch.int32, device=dev))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="check_tensor accepts CUDA tensors only")
@pytest.mark.parametrize("bad,name", [
    (dict(q=torch.zeros(2, 64, 128)), "q"),
    (dict(q_scale=torch.ones(3)), "q_scale"),
    (dict(weights=torch.ones(2, 32)), "weights"),
    (dict(kv_cache=torch.zeros(4, 100, dtype=torch.uint8)), "kv_cache"),
    (dict(seq_lens=torch.ones(2, dtype=torch.int64)), "seq_lens"),
    (dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), "block_table"),
])
def test_decode_logits_validation_names_the_argument(bad, name):
    args = {**_decode_args("cuda"), **{k: v.cuda() for k, v in bad.items()}}
    with pytest.raises(ValueError, match=rf"^{name}\b|: {name}|{name}:"):
        ops.indexer_decode_logits(**args, next_n=1, arch=ARCH, get_kernel=_no_kernel)


def test_decode_logits_validation_next_n_and_cpu():
    with pytest.raises(ValueError, match="next_n"):
        ops.indexer_decode_logits(**_decode_args(), next_n=5, arch=ARCH, get_kernel=_no_kernel)
    with pytest.raises(ValueError, match="CUDA"):
        ops.indexer_decode_logits(**_decode_args(), next_n=2, arch=ARCH, get_kernel=_no_kernel)
    with pytest.raises(ValueError, match="arch"):
        ops.indexer_decode_logits(**_decode_args(), next_n=2, arch="sm_120a", get_kernel=_no_kernel)


def test_topk_and_swa_validation():
    with pytest.raises(ValueError, match="logits"):
        ops.indexer_topk(torch.zeros(3), torch.zeros(3, 3, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                         topk=512, page_size=64, arch=ARCH, get_kernel=_no_kernel)
    with pytest.raises(ValueError, match="topk"):
        ops.indexer_topk(torch.zeros(3, 4), torch.zeros(3, 3, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                         topk=0, page_size=64, arch=ARCH, get_kernel=_no_kernel)
    with pytest.raises(ValueError, match="positions"):
        ops.indexer_swa_indices(torch.zeros(3, 2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                                torch.zeros(1, 1, dtype=torch.int32), window=128, page_size=64, arch=ARCH,
                                get_kernel=_no_kernel)


# ------------------------------------------------------------------------------------- schedules
def _variants(spec_name, static, arch):
    spec = get_spec(spec_name)
    return {spec.select(get_profile(arch), static, t) for t in range(1, 16385)}


def test_sm120_shared_memory_figures():
    """Pre-nvcc figures of every SM12x variant (the lowered figures match: docs/kernels.md)."""
    m = load_model_config("deepseek-v4-flash")
    got = {}
    for use in family._uses(m, ParallelConfig()):
        for v in _variants(use.spec.name, use.static, "sm_120a"):
            got[(v.kernel, v.p.get("group"), v.p.get("threads"))] = use.spec.smem_bytes(v)
    # q (next_n x 64 heads x 128) + 3 stages of a K tile 64 x 128 and its 64 scales (+ the paged page list)
    assert got[("indexer_decode_logits", 1, 128)] == 8_192 + 3 * (8_192 + 256) + 1_024 == 34_560
    assert got[("indexer_decode_logits", 3, 128)] == 24_576 + 3 * (8_192 + 256) + 1_024 == 50_944
    assert got[("indexer_prefill_logits", 2, 128)] == 16_384 + 3 * (8_192 + 256)
    # histogram (2,049 bins) 8,208 + scan totals (one a warp) + counters 16 + threshold 16, the 512 selected
    # columns and CAND_MAX candidate columns, then the resident row: 7,168 keys (two CTAs per SM:
    # 2 x (47,280 + 1 KB reserved) <= 102,400), or the split kernel's cap (split_schedule)
    fixed = 8_208 + 16 + 16 + 4 * 512 + 4 * 2_048
    assert got[("indexer_topk", None, 1024)] == fixed + 4 * 32 + 4 * 7_168 == 47_280
    assert got[("indexer_topk", None, 512)] == fixed + 4 * 16 + 4 * 7_168 == 47_216
    assert got[("indexer_topk_split", None, 512)] == fixed + 4 * 16 + 4 * 8_192 == 51_312        # 16 splits
    assert got[("indexer_topk_split", None, 1024)] == fixed + 4 * 32 + 4 * 20_480 == 100_528     # 2-8 splits
    assert max(got.values()) <= 101_376


def test_hopper_logits_shared_memory():
    """Hopper's f16 form: q as f16, 2 fp8 stages and their scales, the page list (256 int32), then the f16 K tile at
    a 1,024-byte boundary (WGMMA's swizzled operand). Four CTAs (and their 1 KB reserves) fit the 233,472 B an SM
    has."""
    spec = get_spec("indexer_decode_logits")
    v = spec.select(get_profile("sm_90a"), ops.decode_static(64, 128, 1, 64), 8)
    used = 16_384 + 2 * (8_192 + 256) + 1_024
    assert spec.smem_bytes(v) == -(-used // 1024) * 1024 + 16_384 == 51_200
    assert 4 * (spec.smem_bytes(v) + 1024) <= 233_472


def test_only_the_paged_logits_drop_the_per_access_guards():
    """The paged kernel's indices are in range by construction (pages clamped to the cache), so its bounds guards go;
    the ragged kernel's last tile copies past num_k and needs the guard's zero fill."""
    dec, pre = get_spec("indexer_decode_logits"), get_spec("indexer_prefill_logits")
    for arch in ("sm_120a", "sm_90a"):
        prof = get_profile(arch)
        v = dec.select(prof, ops.decode_static(64, 128, 1, 64), 8)
        assert dec.pass_configs(v)["tl.disable_safe_memory_legalize"] is True
        w = pre.select(prof, {"heads": 64, "dim": 128}, 8)
        assert "tl.disable_safe_memory_legalize" not in pre.pass_configs(w)


def test_logits_variant_is_one_per_static():
    """Context length, batch and token count never enter the logits select: the grid's column width follows the
    token count at launch (grid_columns: whole waves of the CTAs the SMs hold), so one variant serves every batch
    and a new context never compiles (the SGLang split_kv bug the reference notes)."""
    from dsv4_jit.kernels.indexer.logits import CTAS_PER_SM
    spec = get_spec("indexer_decode_logits")
    st = ops.decode_static(64, 128, 2, 64)
    # SM12x: fp8 mma.sync, 3 stages; Hopper: f16 WGMMA (its fp8 mma.sync is emulated), 2 stages
    for arch, stages, tc in (("sm_120a", 3, ("float8_e4m3", False)), ("sm_90a", 2, ("float16", True))):
        vs = _variants("indexer_decode_logits", st, arch)
        assert len(vs) == 1
        (v,) = vs
        assert (v.p["block_n"], v.p["stages"], v.p["threads"]) == (64, stages, 128)
        assert (v.p["operand"], v.p["wgmma"]) == tc
        assert v.p["target_ctas"] == CTAS_PER_SM * get_profile(arch).num_sms_hint
    assert spec.select(ARCH, st, 2) == spec.select(ARCH, dict(st), 2)


def test_decode_topk_logits_skip_the_inf_fill(cpu_tensors_ok):
    """indexer_decode_topk's logits variant is the public one with clean=False (its top-k reads only each row's
    [lo, hi)); both are planned, and clean must be a bool."""
    spec = get_spec("indexer_decode_logits")
    on = spec.select(ARCH, ops.decode_static(64, 128, 1, 64), 8)
    off = spec.select(ARCH, ops.decode_static(64, 128, 1, 64, clean=False), 8)
    assert on.p["clean"] is True and off.p["clean"] is False
    assert {k: v for k, v in on.p.items() if k != "clean"} == {k: v for k, v in off.p.items() if k != "clean"}
    assert spec.select(ARCH, {k: v for k, v in ops.decode_static(64, 128, 1, 64).items() if k != "clean"}, 8) == on
    with pytest.raises(ValueError, match="clean must be a bool"):
        spec.select(ARCH, {**ops.decode_static(64, 128, 1, 64), "clean": 0}, 8)
    m = load_model_config("deepseek-v4-flash")
    planned = {u.spec.select(ARCH, u.static, 8) for u in family._uses(m, ParallelConfig()) if u.spec is spec}
    assert on in planned and off in planned

    seen = []

    def get_kernel(sp, static, tokens):
        seen.append((sp.name, dict(static)))
        raise RuntimeError("stop")     # only the first launch's select matters here

    torch = pytest.importorskip("torch")
    t, w = 2, 640
    q = torch.zeros(t, 64, 128, dtype=torch.float8_e4m3fn)
    kv = torch.zeros(4, 64 * 132, dtype=torch.uint8)
    args = (q, torch.ones(t), torch.ones(t, 64), kv, torch.full((t,), 64, dtype=torch.int32),
            torch.zeros(t, 10, dtype=torch.int32))
    for fn, want in ((ops.indexer_decode_topk, False), (ops.indexer_decode_logits, True)):
        kw = {"topk": 512} if fn is ops.indexer_decode_topk else {}
        with pytest.raises(RuntimeError, match="stop"):
            fn(*args, next_n=1, arch=ARCH, get_kernel=get_kernel, width=w, **kw)
        assert seen[-1] == ("indexer_decode_logits", ops.decode_static(64, 128, 1, 64, clean=want))
    with pytest.raises(ValueError, match="clean"):
        ops.indexer_decode_logits(*args, next_n=1, arch=ARCH, get_kernel=get_kernel, clean="no")


def test_logits_grid_is_whole_waves_of_what_the_sms_hold():
    """The logits grid is a whole number of waves of the CTAs the SMs hold: rounding the CTAs a row up (9 at 64
    tokens: 576 on 528 slots) left a second wave of 48 CTAs as long as the first."""
    from dsv4_jit.kernels.indexer.logits import grid_columns, resident_ctas
    spec = get_spec("indexer_decode_logits")
    slots = {}
    for arch, next_n in (("sm_90a", 1), ("sm_90a", 2), ("sm_90a", 3), ("sm_120a", 1), ("sm_120a", 4)):
        prof = get_profile(arch)
        v = spec.select(prof, ops.decode_static(64, 128, next_n, 64), 1)
        per_sm = resident_ctas(v.p, prof)
        # what one SM's shared memory and registers hold: 4 (128 registers) or 3 (168) at 128 threads
        assert per_sm * (spec.smem_bytes(v) + 1024) <= prof.max_smem_per_block + 1024
        assert per_sm <= (4 if next_n == 1 else 3)
        assert v.p["slots"] == per_sm * prof.num_sms_hint
        slots[arch, next_n] = v.p["slots"]
    # Hopper: four 50 KB CTAs an SM at next_n 1, three at 2 (66.5 KB), two at 3; SM12x: two 33.5 KB CTAs
    assert slots == {("sm_90a", 1): 528, ("sm_90a", 2): 396, ("sm_90a", 3): 264, ("sm_120a", 1): 376,
                     ("sm_120a", 4): 188}
    for target, sl in ((528, 528), (528, 396), (752, 376)):
        for tiles in (1, 3, 33, 258, 1026, 4097):
            for groups in (1, 2, 5, 7, 8, 20, 48, 64, 65, 96, 300, 1000, 5000):
                c = grid_columns(groups, tiles, target, sl, 32)
                assert 1 <= c <= tiles
                if c < tiles:
                    assert c >= -(-tiles // 32)                 # no CTA walks more than 32 tiles
                    waves = -(-groups * c // sl)
                    # whole waves: the last one is full but for fewer than one CTA a group (or one wave's worth
                    # of CTAs a group is the max_tiles floor itself)
                    assert groups * c > (waves - 1) * sl
                    assert groups * c + groups > waves * sl or c == -(-tiles // 32)
                    assert groups * c >= min(target, groups * tiles) - groups
    assert grid_columns(64, 258, 528, 528, 32) == 16     # 1,024 CTAs (two waves), not 576 (1.09)
    assert grid_columns(8, 1026, 528, 528, 32) == 66     # unchanged where the batch divides the slots
    assert grid_columns(64, 1026, 528, 528, 32) == 33    # 2,112 = four waves
    assert grid_columns(5, 1026, 528, 528, 32) == 105    # 525, not 530


def test_decode_logits_grid_is_one_wave_at_64_tokens():
    """Hopper's decode sizes the grid for the logits width (graph capture), not the rows' lengths: with its decode cap
    a 64-token batch over a 256K-context width (1,025 tiles) runs one wave of 8 CTAs a row, not four waves of 33 (each
    CTA one valid tile at 8K context); prefill and the other schedules keep the 32-tile cap."""
    from dsv4_jit.kernels.indexer.logits import DECODE_MAX_TILES_PER_CTA, MAX_TILES_PER_CTA, grid_columns
    prof = get_profile("sm_90a")
    spec = get_spec("indexer_decode_logits")
    v = spec.select(prof, ops.decode_static(64, 128, 1, 64), 1)
    assert v.p["max_tiles"] == DECODE_MAX_TILES_PER_CTA["hopper"] == 1024
    for arch in ("sm_120a", "sm_121a", "sm_100a"):
        assert spec.select(get_profile(arch), ops.decode_static(64, 128, 1, 64), 1).p["max_tiles"] == MAX_TILES_PER_CTA
    assert get_spec("indexer_prefill_logits").select(prof, {"heads": 64, "dim": 128}, 1).p["max_tiles"] == \
        MAX_TILES_PER_CTA == 32
    tiles = -(-65600 // 64)
    assert grid_columns(64, tiles, v.p["target_ctas"], v.p["slots"], v.p["max_tiles"]) * 64 == 512   # one wave of 528
    assert grid_columns(8, tiles, v.p["target_ctas"], v.p["slots"], v.p["max_tiles"]) == 66          # as with 32
    assert grid_columns(1, tiles, v.p["target_ctas"], v.p["slots"], v.p["max_tiles"]) == 528
    # a 1M-token max_model_len (4,097 tiles a row) still gives no CTA more than 1,024
    assert grid_columns(600, 4097, 528, 528, 1024) == 5


def test_uses_are_ratio4_only():
    m = load_model_config("deepseek-v4-flash")
    labels = [u.label for u in family._uses(m, ParallelConfig(tp_size=4))]
    # next_n 1-3, each with and without the -inf fill (the public logits op; indexer_decode_topk's)
    assert sum("decode logits" in x for x in labels) == 6 and any("SWA" in x for x in labels)
    no4 = type(m)(**{**m.to_dict(), "compress_ratios": (0, 128, 0)})
    assert [u.spec.name for u in family._uses(no4, ParallelConfig())] == ["indexer_swa_indices"]
    assert math.isclose(family.LOGITS_TOL, 1e-3)


# ------------------------------------------------------------------------------ row-split top-k (model)
def _keys(x: torch.Tensor) -> torch.Tensor:
    """The kernels' order-preserving uint32 keys of fp32 values, as int64."""
    b = x.float().view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(x < 0, (~b) & 0xFFFFFFFF, b | 0x80000000)


def _split_select_model(row: torch.Tensor, k: int, splits: int, unit: int) -> tuple[set[int], int]:
    """indexer_topk_split's algorithm, pass by pass: per-CTA slice histograms summed into the row's histogram,
    the threshold digit folded into prefix / mask after each pass's barrier, the early exit once a whole bin is
    taken, then the masked collection. Returns (selected positions, passes run)."""
    from dsv4_jit.kernels.indexer.topk import PASSES, RADIX
    keys, n = _keys(row), row.numel()
    chunk = -(-(-(-n // splits)) // unit) * unit
    rem, prefix, mask, passes = k, 0, 0, 0
    for rnd in range(PASSES):
        hist = torch.zeros(RADIX, dtype=torch.long)
        for sx in range(splits):
            sl = keys[sx * chunk: min(n, sx * chunk + chunk)]
            sl = sl[(sl & mask) == prefix]
            hist += torch.bincount((sl >> (24 - 8 * rnd)) & 255, minlength=RADIX)
        passes += 1
        suf = torch.cat([hist.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.long)])
        thr = [b for b in range(RADIX) if suf[b] >= rem > suf[b + 1]]
        assert len(thr) == 1
        rem -= int(suf[thr[0] + 1])
        prefix |= thr[0] << (24 - 8 * rnd)
        mask |= 255 << (24 - 8 * rnd)
        if int(suf[thr[0]] - suf[thr[0] + 1]) == rem:
            break
    above = ((keys & mask) > prefix).nonzero().flatten().tolist()
    ties = ((keys & mask) == prefix).nonzero().flatten().tolist()
    assert len(above) == k - rem and len(ties) >= rem
    return set(above) | set(ties[:rem]), passes


@pytest.mark.parametrize("n,splits", [(600, 2), (5000, 4), (65536, 16), (70001, 16), (513, 16)])
def test_row_split_radix_select_model_is_an_exact_top_k(n, splits):
    from dsv4_jit.kernels.indexer.topk import LOADS_IN_FLIGHT, split_schedule
    g = torch.Generator().manual_seed(n)
    k = 512
    passes = []
    for row in (torch.randn(n, generator=g), (torch.randn(n, generator=g) * 4).round() / 4,
                torch.full((n,), 0.5), torch.randn(n, generator=g).abs() + 3.0):
        got, used = _split_select_model(row, k, splits, split_schedule(splits)[0] * LOADS_IN_FLIGHT)
        passes.append(used)
        assert len(got) == k
        kth = row.double().sort(descending=True).values[k - 1]
        vals = row.double()[list(got)]
        assert (vals >= kth).all() and int((row.double() > kth).sum()) <= k
    # Gaussian rows stop early: after 2-3 passes the threshold bin holds exactly the keys still needed, so the
    # last passes (and their row barriers) are skipped. Ties (quantized, all-equal rows) need all four passes.
    assert passes[0] <= 3 and passes[3] <= 3 and passes[2] == 4


def _resident_select_model(row: torch.Tensor, k: int) -> tuple[set[int], str]:
    """The resident select's algorithm (topk._resident_select): a histogram of the keys' top FIRST_BITS bits, one
    walk that takes the keys above the threshold bin and copies the bin's columns as candidates (up to CAND_MAX),
    two passes over the remaining 21 bits (11 + 10) on the candidates (or on the whole row restricted to the bin
    when they overflow), then the collection. Returns (selected positions, path: "bin" (the whole threshold bin
    taken), "candidates" or "row")."""
    from dsv4_jit.kernels.indexer.topk import CAND_MAX, FIRST_BITS, WIDE_BINS

    def threshold(digits: torch.Tensor, rem: int) -> tuple[int, int, int]:
        hist = torch.bincount(digits, minlength=WIDE_BINS)
        suf = torch.cat([hist.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.long)])
        thr = [b for b in range(WIDE_BINS) if suf[b] >= rem > suf[b + 1]]
        assert len(thr) == 1
        return thr[0], int(suf[thr[0] + 1]), int(suf[thr[0]] - suf[thr[0] + 1])

    keys, top = _keys(row), 32 - FIRST_BITS
    thr, above, in_bin = threshold(keys >> top, k)
    rem = k - above
    if in_bin == rem:
        return set(((keys >> top) >= thr).nonzero().flatten().tolist()), "bin"
    taken = ((keys >> top) > thr).nonzero().flatten().tolist()
    bin_cols = ((keys >> top) == thr).nonzero().flatten()
    path = "candidates" if len(bin_cols) <= CAND_MAX else "row"
    prefix, mask = thr << top, ((1 << FIRST_BITS) - 1) << top
    for shift, bits in ((10, 2047), (0, 1023)):
        kb = keys[bin_cols]
        kb = kb[(kb & mask) == prefix]
        d, a, c = threshold((kb >> shift) & bits, rem)
        rem -= a
        prefix |= d << shift
        mask |= bits << shift
        if c == rem:
            break
    kb = keys[bin_cols]
    above_in = bin_cols[(kb & mask) > prefix].tolist()
    ties = bin_cols[(kb & mask) == prefix].tolist()
    assert len(taken) + len(above_in) == k - rem and len(ties) >= rem
    return set(taken) | set(above_in) | set(ties[:rem]), path


@pytest.mark.parametrize("n", [513, 2048, 16384, 27648])
def test_resident_two_level_select_model_is_an_exact_top_k(n):
    g = torch.Generator().manual_seed(n)
    k = 512
    paths = []
    for row in (torch.randn(n, generator=g), (torch.randn(n, generator=g) * 4).round() / 4,
                torch.full((n,), 0.5), torch.randn(n, generator=g).abs() * 3 + 5.0,
                torch.cat([torch.full((max(n - 600, 0),), -float("inf")), torch.randn(min(n, 600), generator=g)]),
                torch.cat([torch.rand(n - k, generator=g), torch.full((k,), 1000.0)])):
        got, path = _resident_select_model(row, k)
        paths.append(path)
        assert len(got) == k
        kth = row.double().sort(descending=True).values[k - 1]
        vals = row.double()[list(got)]
        assert (vals >= kth).all() and int((row.double() > kth).sum()) <= k
    # continuous rows leave few candidates after the first pass (11 bits: sign, exponent, 2 mantissa bits); an
    # all-equal row longer than CAND_MAX walks the row
    assert paths[0] == paths[3] == "candidates"
    assert paths[2] == ("row" if n > 2048 else "candidates")
    assert paths[5] == "bin"  # the k largest fill their bin exactly: no candidate passes


def _split_resident_model(row: torch.Tensor, k: int, splits: int) -> tuple[set[int], str]:
    """indexer_topk_split's resident-slice select (topk.build_topk_split): the slices' histograms of the keys' top
    FIRST_BITS bits summed into the row's; every slice places its keys above the threshold bin and copies the bin's
    keys to the row's candidate list; the last CTA selects bits 10..20 and 0..9 over the candidates. A bin over
    CAND_MAX keys runs those two passes over the slices instead (the row's histograms summed from the slices).
    Returns (selected positions, path: "bin", "candidates" or "slices")."""
    from dsv4_jit.kernels.indexer.topk import CAND_MAX, FIRST_BITS, WIDE_BINS

    def threshold(hist: torch.Tensor, rem: int) -> tuple[int, int, int]:
        suf = torch.cat([hist.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.long)])
        thr = [b for b in range(WIDE_BINS) if suf[b] >= rem > suf[b + 1]]
        assert len(thr) == 1
        return thr[0], int(suf[thr[0] + 1]), int(suf[thr[0]] - suf[thr[0] + 1])

    keys, n, top = _keys(row), row.numel(), 32 - FIRST_BITS
    per = -(-(-(-n // splits)) // 32) * 32
    slices = [torch.arange(sx * per, min(n, sx * per + per)) for sx in range(splits) if sx * per < n]
    hist = sum(torch.bincount(keys[sl] >> top, minlength=WIDE_BINS) for sl in slices)
    thr, above, m = threshold(hist, k)
    rem = k - above
    if m == rem:
        return set(((keys >> top) >= thr).nonzero().flatten().tolist()), "bin"
    taken = [c for sl in slices for c in sl[(keys[sl] >> top) > thr].tolist()]
    prefix, mask = thr << top, ((1 << FIRST_BITS) - 1) << top
    # candidates (the bin's keys, gathered from every slice) or the slices themselves
    pool = [torch.cat([sl[(keys[sl] >> top) == thr] for sl in slices])] if m <= CAND_MAX else slices
    path = "candidates" if m <= CAND_MAX else "slices"
    for shift, bits in ((10, 2047), (0, 1023)):
        h = sum(torch.bincount((keys[c][(keys[c] & mask) == prefix] >> shift) & bits, minlength=WIDE_BINS)
                for c in pool)
        d, a, c = threshold(h, rem)
        rem -= a
        prefix |= d << shift
        mask |= bits << shift
        if c == rem:
            break
    cols = torch.cat(pool)
    in_bin = cols[(keys[cols] >> top) == thr]
    above_in = in_bin[(keys[in_bin] & mask) > prefix].tolist()
    ties = in_bin[(keys[in_bin] & mask) == prefix].tolist()
    assert len(taken) + len(above_in) == k - rem and len(ties) >= rem
    return set(taken) | set(above_in) | set(ties[:rem]), path


@pytest.mark.parametrize("n,splits", [(4097, 16), (16384, 16), (65613, 16), (20000, 2), (30000, 4)])
def test_split_resident_select_model_is_an_exact_top_k(n, splits):
    g = torch.Generator().manual_seed(n)
    k = 512
    paths = []
    for row in (torch.randn(n, generator=g), (torch.randn(n, generator=g) * 4).round() / 4,
                torch.full((n,), 0.25), torch.randn(n, generator=g).abs() * 3 + 5.0,
                torch.cat([torch.rand(n - k, generator=g), torch.full((k,), 1000.0)])):
        got, path = _split_resident_model(row, k, splits)
        paths.append(path)
        assert len(got) == k
        kth = row.double().sort(descending=True).values[k - 1]
        vals = row.double()[list(got)]
        assert (vals >= kth).all() and int((row.double() > kth).sum()) <= k
    # continuous rows: one row barrier, then the last CTA's candidates; all-equal rows: the heavy-tie branch
    assert paths[0] == paths[3] == "candidates" and paths[2] == "slices" and paths[4] == "bin"


def test_topk_workspace_layout_and_zero_once():
    from dsv4_jit.kernels.indexer import ops
    from dsv4_jit.kernels.indexer import topk as tk
    regions = [(tk.WS_G0, tk.WIDE_BINS + 1), (tk.WS_G1, tk.WIDE_BINS + 1), (tk.WS_G2, tk.WIDE_BINS + 1),
               (tk.WS_SH, tk.PASSES * (tk.RADIX + 1)), (tk.WS_CNT, 8), (tk.WS_CC, tk.CAND_MAX), (tk.WS_CK, tk.CAND_MAX)]
    assert all(a + n == b for (a, n), (b, _) in zip(regions, regions[1:])) and sum(n for _, n in regions) == tk.ROW_WS
    assert ops.indexer_topk_workspace_numel(8) == 8 * tk.ROW_WS
    ws = torch.full((16,), 7, dtype=torch.int32)
    ops._zero_once(ws)
    assert int(ws.abs().sum()) == 0
    ws.fill_(3)  # the kernel keeps it zeroed; a flagged tensor is trusted and not zeroed again
    ops._zero_once(ws)
    assert int(ws.sum()) == 48
    view = ws[:8]
    ops._zero_once(view)
    assert int(view.abs().sum()) == 0


def test_resident_row_fits_the_sm_and_is_whole_kilo_keys():
    from dsv4_jit.kernels.indexer.topk import resident_keys
    sm120, h100 = get_profile("sm_120a"), get_profile("sm_90a")
    assert resident_keys(sm120, 1_104, ctas_per_sm=1) == 24_576     # 99,408 B <= 101,376
    assert resident_keys(sm120, 1_104, ctas_per_sm=2) == 11_264     # 2 x (46,160 + 1,024) <= 102,400
    assert resident_keys(h100, 1_104, ctas_per_sm=1) == 57_344      # 230,480 B <= 232,448: 229K-token context
    for arch in (sm120, h100):
        for ctas in (1, 2, 3):
            r = resident_keys(arch, 1_104, ctas)
            assert r % 1024 == 0 and ctas * (1_104 + 4 * r + 1_024) <= arch.max_smem_per_block + 1_024


def test_split_kernel_threads_follow_the_splits():
    """16 splits (the fewest rows) stream long rows with 512 threads and keep rows up to 8K keys in one CTA; 2-8
    splits run 1,024 threads and keep slices up to 32K keys in one CTA where shared memory holds them (Hopper: a
    256K context's 64K-column rows as 2 slices; SM12x: 20K keys) (topk.split_schedule)."""
    spec = get_spec("indexer_topk_split")
    st = {"topk": 512, "page_size": 64}
    for arch, few in ((get_profile("sm_90a"), 32_768), (get_profile("sm_120a"), 20_480)):
        for t in (1, 8, 16, 64, 200):
            p = spec.select(arch, st, t).p
            want = (512, 8_192) if p["splits"] == 16 else (1_024, few)
            assert (p["threads"], p["resident"]) == want, (arch.name, t, p)
            assert spec.smem_bytes(spec.select(arch, st, t)) <= arch.max_smem_per_block
    assert spec.select(get_profile("sm_90a"), st, 1).p["splits"] == 16
    assert spec.select(get_profile("sm_90a"), st, 64).p["splits"] == 2


def test_hopper_two_split_rows_up_to_96k_context_are_one_cta_each():
    """At 2 splits (34-66 rows on 132 SMs) Hopper selects rows up to 24,576 columns (a 96K context at ratio 4) with
    one CTA and no row barriers; 4-16 splits, SM12x and sm_100a keep rows above 8,192 columns split
    (topk.SOLO_MAX_TWO_SPLITS)."""
    spec = get_spec("indexer_topk_split")
    st = {"topk": 512, "page_size": 64}
    solo = {(a, t): spec.select(get_profile(a), st, t).p["solo"]
            for a in ("sm_90a", "sm_120a", "sm_100a") for t in (1, 12, 24, 40, 64)}
    assert [solo["sm_90a", t] for t in (1, 12, 24, 40, 64)] == [8_192, 8_192, 8_192, 24_576, 24_576]
    assert {v for (a, _), v in solo.items() if a != "sm_90a"} == {8_192}
    # the solo row is held whole in the CTA's resident buffer
    assert spec.select(get_profile("sm_90a"), st, 64).p["resident"] >= 24_576


def test_topk_splits_fill_the_gpu_and_stop_at_one_cta_per_row():
    from dsv4_jit.kernels.indexer.topk import topk_splits
    assert [topk_splits(t, 132) for t in (1, 8, 9, 33, 34, 64, 66, 67, 132, 4096)] == [16, 16, 8, 4, 2, 2, 2, 1, 1, 1]
    assert [topk_splits(t, 188) for t in (1, 12, 47, 48, 94, 95)] == [16, 8, 4, 2, 2, 1]


def test_decode_logits_page_size_must_tile_the_row_view():
    """The kernel copies K through a [pages * (P + 4P/D), D] row view: page size 16 at D = 128 (a page of
    2,112 B, not whole 128-byte rows) is refused by name before any compile."""
    spec = get_spec("indexer_decode_logits")
    with pytest.raises(ValueError, match="page_size=16"):
        spec.select(ARCH, ops.decode_static(64, 128, 1, 16), 1)
    for page in (32, 64, 128, 256):
        assert spec.select(ARCH, ops.decode_static(64, 128, 1, page), 1).p["page_size"] == page
    assert spec.select(ARCH, ops.decode_static(64, 64, 1, 16), 1).p["page_size"] == 16


def test_logits_builder_rejects_one_stage():
    """One stage would make the ring wait on a negative group count: an error, not garbage logits."""
    from dsv4_jit.kernels.indexer.logits import build_logits
    kw = dict(paged=True, heads=64, dim=128, group=1, block_n=64, threads=128, target_ctas=528, slots=528,
              max_tiles=32, page_size=64, ratio=4)
    with pytest.raises(ValueError, match="stages=1"):
        build_logits(stages=1, **kw)
    with pytest.raises(ValueError, match="operand"):
        build_logits(stages=2, operand="bfloat16", **kw)


# ------------------------------------------------------------------------------- padded page strides
def test_page_size_of_a_padded_page_is_vllms():
    # vLLM 0.33 rounds an index-K page up to a multiple of 576 B: 64 x 132 = 8,448 -> 8,640
    assert ops._page_size_of(8_640, 132, None) == 64
    assert ops._page_size_of(8_448, 132, None) == 64
    assert ops._page_size_of(-(-32 * 132 // 576) * 576, 132, None) == 32
    assert ops._page_size_of(9_000, 132, 64) == 64            # an explicit page size wins
    with pytest.raises(ValueError, match="kv_cache"):
        ops._page_size_of(8_448 + 576, 132, None)             # more padding than vLLM's rule: ambiguous
    with pytest.raises(ValueError, match="page_size"):
        ops._page_size_of(8_640, 132, 48)


@pytest.mark.parametrize("cache,why", [
    (torch.zeros(4, 8_648, dtype=torch.uint8), "multiple of"),            # 8,648 B: not a multiple of 16
    (torch.zeros(4, 64, 1, 131, dtype=torch.uint8), "kv_cache: expected shape"),
    (torch.zeros(4, 64, 2, 132, dtype=torch.uint8)[:, :, :1], "contiguous"),   # a page's bytes not contiguous
    (torch.zeros(4, 48, 1, 132, dtype=torch.uint8), "not supported"),
])
def test_index_cache_geometry_is_checked_before_anything_runs(cache, why):
    with pytest.raises(ValueError, match=why):
        ops._kv_cache_views(cache, 128, None)


def test_padded_index_caches_pass_the_geometry_checks():
    # vLLM's 2-D buffer and a [pages, 64, 1, 132] view of its pages both reach the device check (CPU tensors here)
    buf = torch.zeros(4, 8_640, dtype=torch.uint8)
    for cache in (buf, buf[:, :8_448].unflatten(1, (64, 1, 132)), buf[:, :8_448].unflatten(1, (64, 132))):
        with pytest.raises(ValueError, match="kv_cache: must be a CUDA tensor"):
            ops._kv_cache_views(cache, 128, None)


@pytest.mark.gpu
def test_padded_index_cache_views_are_the_pages_bytes():
    # the kernel's two views of a vLLM-padded cache land on each page's K rows and scales (garbage padding unread)
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    g = torch.Generator().manual_seed(3)
    k = torch.randint(0, 256, (4 * 64, 128), generator=g, dtype=torch.uint8)
    sc = torch.rand(4 * 64, generator=g) + 0.5
    compact = reference.pack_paged_cache(k.view(torch.float8_e4m3fn), sc, 64)
    buf = torch.randint(0, 256, (4, 8_640), generator=g, dtype=torch.uint8)
    buf[:, :8_448] = compact
    for cache in (buf.cuda(), buf.cuda()[:, :8_448].unflatten(1, (64, 1, 132))):
        p, kv_f32, kv_fp8 = ops._kv_cache_views(cache, 128, cache.device)
        assert p == 64 and kv_fp8.stride() == (8_640, 128, 1) and kv_f32.shape == (4, 540, 4)
        assert torch.equal(kv_fp8.view(torch.uint8).cpu().reshape(-1, 128), k)
        assert torch.equal(kv_f32.reshape(4, -1)[:, 2_048:2_048 + 64].cpu().reshape(-1), sc)


@pytest.mark.compile
def test_fp8_wgmma_logits_form_fences_the_ring_before_its_wgmma(tmp_path, monkeypatch):
    """The form sweep_indexer_logits.py --forms fp8 times (logits.FP8_WGMMA, off by default: its errors exceed
    LOGITS_TOL): e4m3 x e4m3 WGMMA straight from the cp.async stage, each thread's copies fenced for the async proxy
    before the barrier that hands the stage over, no f16 K tile. The default Hopper variant stays the f16 form."""
    from dsv4_jit import jit
    from dsv4_jit.kernels.indexer import logits
    spec = get_spec("indexer_decode_logits")
    hopper = get_profile("sm_90a")
    st = ops.decode_static(64, 128, 1, 64, clean=False)
    assert spec.select(hopper, st, 8).p["operand"] == "float16"
    monkeypatch.setitem(logits.FP8_WGMMA, "hopper", True)
    monkeypatch.setitem(logits.SCHEDULES, "hopper", (64, 3, 128))
    v = spec.select(hopper, st, 8)
    assert (v.p["operand"], v.p["wgmma"], v.p["stages"]) == ("float8_e4m3", True, 3)
    meta = jit.compile_to_dir(spec, v, tmp_path)
    src = (tmp_path / jit.SOURCE_NAME).read_text()
    assert "kFloat8_e4m3, tl::DataType::kFloat8_e4m3" in src and "wgmma_ss" in src
    ring = src[src.index("cp_async_wait"):]
    assert ring.index("fence_proxy_async") < ring.index("__syncthreads")
    assert meta["smem_bytes"] == spec.smem_bytes(v) == 8_192 + 3 * (8_192 + 256) + 1_024   # + the page list
    # SM12x is unchanged: fp8 mma.sync, no WGMMA
    sm120 = spec.select(get_profile("sm_120a"), st, 8)
    assert (sm120.p["operand"], sm120.p["wgmma"]) == ("float8_e4m3", False)


@pytest.mark.compile
@pytest.mark.parametrize("kernel,tokens", [("indexer_topk", 128), ("indexer_topk_split", 1)])
def test_topk_lets_the_kernel_behind_it_launch_once_past_its_grid_sync(tmp_path, kernel, tokens):
    """Both top-k kernels trigger the kernel behind them (sparse MLA in a decode step) right after their own grid
    dependency sync, not before it (the logits kernel ahead triggers at its start: three grids at most), and a
    trigger=False variant has no trigger (cross-compiled, no GPU)."""
    from dsv4_jit import jit
    from dsv4_jit.spec import Variant
    spec = get_spec(kernel)
    v = spec.select(get_profile("sm_90a"), {"topk": 512, "page_size": 64}, tokens)
    assert v.p["trigger"] is True
    sync, trigger = "cudaGridDependencySynchronize();", "cudaTriggerProgrammaticLaunchCompletion();"
    for on in (True, False):
        out = tmp_path / str(on)
        jit.compile_to_dir(spec, Variant.make(kernel, dict(v.p, trigger=on), v.profile, v.schedule), out)
        body = (out / jit.SOURCE_NAME).read_text()
        body = body[body.index("__launch_bounds__"):]
        assert body.count(sync) == 1
        if on:
            after = body[body.index(sync) + len(sync):].lstrip()
            assert body.count(trigger) == 1 and after.startswith(trigger)
        else:
            assert trigger not in body
